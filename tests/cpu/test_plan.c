/* Planning: routes, offsets, alignment, gather work items. Pure arithmetic, no driver. */
#include "internal.h"
#include "test.h"

static ferry_tensor make(void *data, int32_t ndim, int64_t *shape, int64_t *strides, uint8_t bits) {
  ferry_tensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = FERRY_DEVICE_CUDA;
  t.ndim = ndim;
  t.dtype.code = FERRY_DTYPE_UINT;
  t.dtype.bits = bits;
  t.dtype.lanes = 1;
  t.shape = shape;
  t.strides = strides;
  return t;
}

TEST(nbytes_multiplies_shape_and_dtype) {
  int64_t shape[3] = {2, 3, 5};
  ferry_tensor t = make((void *)16, 3, shape, NULL, 32);
  uint64_t n = 0;
  ASSERT_OK(ferry_tensor_nbytes(&t, &n));
  ASSERT_EQ(n, 2 * 3 * 5 * 4);
}

TEST(nbytes_rejects_negative_dimension) {
  int64_t shape[2] = {4, -1};
  ferry_tensor t = make((void *)16, 2, shape, NULL, 8);
  uint64_t n;
  ASSERT_STATUS(ferry_tensor_nbytes(&t, &n), FERRY_INVALID_ARGUMENT);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "dimension 1 is negative");
}

TEST(nbytes_detects_overflow) {
  int64_t shape[3] = {INT64_MAX, INT64_MAX, 2};
  ferry_tensor t = make((void *)16, 3, shape, NULL, 64);
  uint64_t n;
  ASSERT_STATUS(ferry_tensor_nbytes(&t, &n), FERRY_OVERFLOW);
}

TEST(nbytes_of_an_empty_tensor_is_zero_whatever_its_other_dimensions) {
  /* Holding nothing, whatever the order of its dimensions: no product overflows on the way to a zero. */
  int64_t shape[3] = {(int64_t)1 << 40, (int64_t)1 << 40, 0};
  ferry_tensor t = make(NULL, 3, shape, NULL, 64);
  uint64_t n = 1;
  ASSERT_OK(ferry_tensor_nbytes(&t, &n));
  ASSERT_EQ(n, 0);
  shape[0] = -1; /* a negative dimension is refused even beside a zero */
  ASSERT_STATUS(ferry_tensor_nbytes(&t, &n), FERRY_INVALID_ARGUMENT);
}

TEST(nbytes_rejects_sub_byte_dtype) {
  int64_t shape[1] = {8};
  ferry_tensor t = make((void *)16, 1, shape, NULL, 4);
  uint64_t n;
  ASSERT_STATUS(ferry_tensor_nbytes(&t, &n), FERRY_UNSUPPORTED);
}

TEST(compact_detection) {
  int64_t shape[2] = {3, 4}, row[2] = {4, 1}, col[2] = {1, 3}, unit_shape[2] = {1, 4}, odd[2] = {99, 1};
  ferry_tensor t = make((void *)16, 2, shape, NULL, 8);
  ASSERT(ferry__tensor_is_compact(&t));
  t.strides = row;
  ASSERT(ferry__tensor_is_compact(&t));
  t.strides = col;
  ASSERT(!ferry__tensor_is_compact(&t));
  t.shape = unit_shape; /* a unit dimension may have any stride */
  t.strides = odd;
  ASSERT(ferry__tensor_is_compact(&t));
}

TEST(layout_merges_contiguous_dimensions) {
  /* A [4, 3, 8] slice of a [4, 3, 16] buffer: dims 0 and 1 merge (stride 48 = 3 * 16), dim 2 stays. */
  int64_t shape[3] = {4, 3, 8}, strides[3] = {48, 16, 1};
  ferry_tensor t = make((void *)64, 3, shape, strides, 16);
  ferry__gather_layout L;
  ASSERT_OK(ferry__gather_layout_of(&t, &L));
  ASSERT_EQ(L.ndim, 2);
  ASSERT_EQ(L.shape[0], 12);
  ASSERT_EQ(L.shape[1], 8);
  ASSERT_EQ(L.stride_bytes[0], 32);
  ASSERT_EQ(L.stride_bytes[1], 2);
  ASSERT_EQ(L.elem_bytes, 2);
}

static ferry__plan plan_of(ferry_tensor *ts, size_t n, uint8_t *ours, ferry__plan_entry *e, bool gather_ok,
                           ferry_status want) {
  ferry__plan_input in = {ts, n, ours, NULL, false, gather_ok, 0, 0};
  ferry__plan p;
  memset(&p, 0, sizeof p);
  ASSERT_STATUS(ferry__plan_make(&in, e, &p), want);
  return p;
}

TEST(plan_routes_large_to_dma) {
  int64_t shape[1] = {4 << 20};
  ferry_tensor ts[2] = {make((void *)4096, 1, shape, NULL, 8), make((void *)8192, 1, shape, NULL, 8)};
  uint8_t ours[2] = {1, 1};
  ferry__plan_entry e[2];
  ferry__plan p = plan_of(ts, 2, ours, e, true, FERRY_OK);
  ASSERT_EQ(e[0].route, FERRY__DMA);
  ASSERT_EQ(e[1].route, FERRY__DMA);
  ASSERT_EQ(p.n_dma, 2);
  ASSERT_EQ(p.gather_bytes, 0);
  ASSERT_EQ(p.total, 8 << 20);
}

TEST(plan_routes_many_small_to_gather) {
  enum { N = 100 };
  int64_t shape[1] = {1000};
  ferry_tensor ts[N];
  uint8_t ours[N];
  ferry__plan_entry e[N];
  for (int i = 0; i < N; i++) {
    ts[i] = make((void *)(uintptr_t)(4096 + i * 1000), 1, shape, NULL, 8);
    ours[i] = 1;
  }
  ferry__plan p = plan_of(ts, N, ours, e, true, FERRY_OK);
  ASSERT_EQ(p.n_gather, N);
  ASSERT_EQ(p.n_items, N);
  ASSERT_EQ(p.gather_bytes, p.total);
}

TEST(plan_single_small_stays_dma) {
  int64_t shape[1] = {1000};
  ferry_tensor t = make((void *)4096, 1, shape, NULL, 8);
  uint8_t ours[1] = {1};
  ferry__plan_entry e[1];
  plan_of(&t, 1, ours, e, true, FERRY_OK);
  ASSERT_EQ(e[0].route, FERRY__DMA); /* one kernel launch would cost more than it saves */
}

TEST(plan_strided_without_gather_fails) {
  int64_t shape[2] = {3, 4}, strides[2] = {1, 3};
  ferry_tensor t = make((void *)4096, 2, shape, strides, 8);
  uint8_t ours[1] = {1};
  ferry__plan_entry e[1];
  plan_of(&t, 1, ours, e, false, FERRY_UNSUPPORTED);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "tensor 0 is strided");
}

TEST(plan_offsets_are_aligned_and_disjoint) {
  enum { N = 7 };
  int64_t shapes[N] = {1, 3, 255, 256, 257, 4 << 20, 77};
  ferry_tensor ts[N];
  uint8_t ours[N];
  ferry__plan_entry e[N];
  for (int i = 0; i < N; i++) {
    ts[i] = make((void *)(uintptr_t)(1 << 20), 1, &shapes[i], NULL, 8);
    ours[i] = 1;
  }
  ferry__plan p = plan_of(ts, N, ours, e, true, FERRY_OK);
  for (int i = 0; i < N; i++) {
    ASSERT_EQ(e[i].offset % FERRY_SLAB_ALIGN, 0);
    ASSERT(e[i].offset + e[i].nbytes <= p.total);
    for (int j = 0; j < N; j++)
      if (i != j) ASSERT(e[i].offset + e[i].nbytes <= e[j].offset || e[j].offset + e[j].nbytes <= e[i].offset);
  }
  ASSERT_EQ(e[5].route, FERRY__DMA);
  ASSERT(e[5].offset >= p.gather_bytes); /* the gathered region is a prefix */
}

TEST(plan_pass_through_and_empty) {
  int64_t shape[1] = {16}, zero[1] = {0};
  ferry_tensor ts[3] = {make((void *)4096, 1, shape, NULL, 8), make(NULL, 1, zero, NULL, 8),
                        make((void *)4096, 1, shape, NULL, 8)};
  uint8_t ours[3] = {0, 1, 1};
  ferry__plan_entry e[3];
  ferry__plan p = plan_of(ts, 3, ours, e, true, FERRY_OK);
  ASSERT_EQ(e[0].route, FERRY__PASS);
  ASSERT_EQ(e[1].route, FERRY__EMPTY);
  ASSERT_EQ(e[2].route, FERRY__DMA);
  ASSERT_EQ(p.n_copied, 2);
}

TEST(plan_h2d_pageable_small_is_packed) {
  int64_t shape[1] = {100};
  ferry_tensor ts[3];
  uint8_t ours[3] = {1, 1, 1}, pinned[3] = {0, 1, 0};
  for (int i = 0; i < 3; i++) {
    ts[i] = make((void *)(uintptr_t)(4096 * (i + 1)), 1, shape, NULL, 8);
    ts[i].device.device_type = FERRY_DEVICE_CPU;
  }
  ferry__plan_input in = {ts, 3, ours, pinned, true, true, 0, 0};
  ferry__plan_entry e[3];
  ferry__plan p;
  ASSERT_OK(ferry__plan_make(&in, e, &p));
  ASSERT_EQ(e[0].route, FERRY__PACK);
  ASSERT_EQ(e[1].route, FERRY__GATHER); /* pinned: the device reads it directly */
  ASSERT_EQ(e[2].route, FERRY__PACK);
  ASSERT_EQ(p.n_pack, 2);
  ASSERT(p.pack_end > p.gather_bytes);
}

TEST(gather_items_reproduce_strided_tensor) {
  /* A transposed 37 x 53 int32 matrix, gathered on the CPU by the same items the kernel would run. */
  enum { R = 37, C = 53 };
  static int32_t src[R * C], out[R * C];
  for (int i = 0; i < R * C; i++) src[i] = i * 7 + 1;
  int64_t shape[2] = {C, R}, strides[2] = {1, C};
  ferry_tensor t = make(src, 2, shape, strides, 32);
  t.dtype.code = FERRY_DTYPE_INT;
  uint8_t ours[1] = {1};
  ferry__plan_entry e[1];
  ferry__plan_input in = {&t, 1, ours, NULL, false, true, 0, 0};
  ferry__plan p;
  ASSERT_OK(ferry__plan_make(&in, e, &p));
  ASSERT_EQ(e[0].route, FERRY__GATHER);
  ferry__gather_item items[8];
  ferry__gather_layout layouts[1];
  size_t ni, nl;
  ASSERT_OK(ferry__plan_gather_items(&in, e, FERRY__GATHER, (uint64_t)(uintptr_t)out, items, layouts, &ni, &nl));
  ASSERT_EQ(ni, p.n_items);
  ASSERT_EQ(nl, 1);
  for (size_t k = 0; k < ni; k++) ferry__gather_item_run_host(&items[k], layouts);
  for (int c = 0; c < C; c++)
    for (int r = 0; r < R; r++) ASSERT_EQ(out[c * R + r], src[r * C + c]);
}

TEST(gather_items_split_large_contiguous) {
  int64_t shape[1] = {200000};
  ferry_tensor ts[2] = {make((void *)4096, 1, shape, NULL, 8), make((void *)(4096 + 200000), 1, shape, NULL, 8)};
  uint8_t ours[2] = {1, 1};
  ferry__plan_input in = {ts, 2, ours, NULL, false, true, 1 << 20, 0};
  ferry__plan_entry e[2];
  ferry__plan p;
  ASSERT_OK(ferry__plan_make(&in, e, &p));
  ASSERT_EQ(p.n_items, 2 * 4); /* 200000 bytes = 3 full 64 KiB chunks + a tail */
  ferry__gather_item items[8];
  size_t ni, nl;
  ASSERT_OK(ferry__plan_gather_items(&in, e, FERRY__GATHER, 1 << 30, items, NULL, &ni, &nl));
  uint64_t sum = 0;
  for (size_t k = 0; k < ni; k++) {
    ASSERT(items[k].nbytes <= FERRY_GATHER_CHUNK);
    sum += items[k].nbytes;
  }
  ASSERT_EQ(sum, 400000);
}

/* ---- hostile descriptors: the planner's arithmetic never overflows, it refuses or computes the right answer -- */

TEST(layout_does_not_merge_dimensions_whose_step_overflows) {
  /* [3, 2] with strides [1, 2^62]: merging would compare stride 1 with 2 * 2^62, which is past INT64_MAX. The
   * extent (2^62 + 3 bytes from address 0x1000) is addressable, so the plan accepts it and keeps both dims. */
  int64_t shape[2] = {3, 2}, strides[2] = {1, (int64_t)1 << 62};
  ferry_tensor t = make((void *)0x1000, 2, shape, strides, 8);
  uint8_t ours[1] = {1};
  ferry__plan_entry e[1];
  plan_of(&t, 1, ours, e, true, FERRY_OK);
  ASSERT_EQ(e[0].route, FERRY__GATHER);
  ferry__gather_layout L;
  ASSERT_OK(ferry__gather_layout_of(&t, &L));
  ASSERT_EQ(L.ndim, 2);
  ASSERT_EQ(L.shape[0], 3);
  ASSERT_EQ(L.stride_bytes[1], (int64_t)1 << 62);
}

TEST(compact_strides_report_overflow_of_an_empty_tensor) {
  /* [0, 2^40, 2^40] holds nothing, but its compact row-major strides (2^80, 2^40, 1) do not fit 64 bits. */
  int64_t shape[3] = {0, (int64_t)1 << 40, (int64_t)1 << 40}, strides[3];
  ASSERT(!ferry__compact_strides(3, shape, strides));
  ASSERT_EQ(strides[2], 1);
  ASSERT_EQ(strides[1], (int64_t)1 << 40);
  int64_t fits[3] = {0, 3, 5};
  ASSERT(ferry__compact_strides(3, fits, strides));
  ASSERT_EQ(strides[0], 15);
  /* Only the strides must fit: [2^62, INT64_MAX, 0] has strides (INT64_MAX, 1, 1), its total is no stride. */
  int64_t outer[3] = {(int64_t)1 << 62, INT64_MAX, 0};
  ASSERT(ferry__compact_strides(3, outer, strides));
  ASSERT_EQ(strides[0], INT64_MAX);
}

TEST(plan_refuses_an_empty_tensor_whose_strides_overflow) {
  /* The output of an empty tensor still carries compact strides; ones that do not fit int64 cannot be written. */
  int64_t shape[3] = {0, (int64_t)1 << 40, (int64_t)1 << 40};
  ferry_tensor t = make(NULL, 3, shape, NULL, 8);
  uint8_t ours[1] = {1};
  ferry__plan_entry e[1];
  plan_of(&t, 1, ours, e, true, FERRY_OVERFLOW);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "tensor 0");
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "strides");
}

TEST(wide_strided_elements_gather_exactly) {
  /* 300-byte elements (uint8 x 300 lanes), every other one of 7: wider than the layout's 8-bit element field. */
  enum { W = 300, N = 7 };
  static unsigned char src[2 * N * W], out[N * W];
  for (int i = 0; i < 2 * N * W; i++) src[i] = (unsigned char)(i * 13 + 5);
  int64_t shape[1] = {N}, strides[1] = {2};
  ferry_tensor t = make(src, 1, shape, strides, 8);
  t.dtype.lanes = W;
  uint8_t ours[1] = {1};
  ferry__plan_input in = {&t, 1, ours, NULL, false, true, 0, 0};
  ferry__plan_entry e[1];
  ferry__plan p;
  ASSERT_OK(ferry__plan_make(&in, e, &p));
  ASSERT_EQ(e[0].route, FERRY__GATHER);
  ferry__gather_item items[4];
  ferry__gather_layout layouts[1];
  size_t ni, nl;
  ASSERT_OK(ferry__plan_gather_items(&in, e, FERRY__GATHER, (uint64_t)(uintptr_t)out, items, layouts, &ni, &nl));
  ASSERT_EQ(ni, p.n_items);
  for (size_t k = 0; k < ni; k++) ferry__gather_item_run_host(&items[k], layouts);
  for (int i = 0; i < N; i++) ASSERT(memcmp(out + i * W, src + 2 * i * W, W) == 0);
}

TEST(plan_counts_every_item_of_a_strided_tensor_of_odd_width) {
  /* 3-byte elements, strided, 192 KiB: items hold whole elements (65535 bytes), so 4 of them, not 3. The work
   * lists are sized from the plan's count. */
  enum { R = 256, C = 256 };
  int64_t shape[2] = {R, C}, strides[2] = {1, R};
  ferry_tensor t = make((void *)0x10000, 2, shape, strides, 24);
  uint8_t ours[1] = {1}, pageable[1] = {0};
  for (int h2d = 0; h2d < 2; h2d++) {
    ferry__plan_input in = {&t, 1, ours, h2d ? pageable : NULL, h2d, true, 0, 0};
    ferry__plan_entry e[1];
    ferry__plan p;
    ASSERT_OK(ferry__plan_make(&in, e, &p));
    uint8_t route = h2d ? FERRY__PACK : FERRY__GATHER;
    ASSERT_EQ(e[0].route, route);
    size_t planned = h2d ? p.n_pack_items : p.n_items;
    ferry__gather_item items[8];
    ferry__gather_layout layouts[1];
    size_t ni, nl;
    ASSERT_OK(ferry__plan_gather_items(&in, e, route, 0, items, layouts, &ni, &nl));
    ASSERT_EQ(ni, 4);
    ASSERT_EQ(planned, ni);
  }
}

TEST(plan_refuses_early_a_strided_layout_too_deep_for_the_items) {
  /* Nine dimensions that do not merge: neither the gather kernel nor the CPU pack (same items) can walk them. The
   * plan says so for both routes, naming the tensor, before anything is allocated or queued. */
  int64_t shape[9] = {2, 2, 2, 2, 2, 2, 2, 2, 2}, strides[9] = {3, 3, 3, 3, 3, 3, 3, 3, 3};
  ferry_tensor t = make((void *)0x10000, 9, shape, strides, 8);
  uint8_t ours[1] = {1}, pageable[1] = {0};
  for (int h2d = 0; h2d < 2; h2d++) {
    ferry__plan_input in = {&t, 1, ours, h2d ? pageable : NULL, h2d, true, 0, 0};
    ferry__plan_entry e[1];
    ferry__plan p;
    ASSERT_STATUS(ferry__plan_make(&in, e, &p), FERRY_UNSUPPORTED);
    ASSERT_STR_CONTAINS(ferry_last_error_message(), "tensor 0: a strided tensor with 9 non-mergeable dimensions");
  }
}
