/* test_roundtrip.c — byte-exact H2D then D2H round trips (1, 32, 256, 4096 tensors; random sizes; transposed
 * views; zero-size tensors mixed in), and one batch of mixed dtypes and ranks with host and other-device tensors
 * that must pass through untouched. */
#include "gpu_test.h"

/* Round trip of n tensors of random sizes (some strided transposes) with bytes from a seeded generator. */
static void round_trip(int dev, size_t n, size_t max_bytes, int strided, unsigned seed) {
  srand(seed);
  size_t *sizes = calloc(n, sizeof *sizes), total = 0;
  for (size_t i = 0; i < n; i++) {
    sizes[i] = (size_t)(rand() % (int)max_bytes) / 4 * 4 + 4;
    if (i % 7 == 3) sizes[i] = 0; /* zero-size tensors mixed in */
    total += sizes[i];
  }
  unsigned char *host = malloc(total + 1);
  for (size_t i = 0; i < total; i++) host[i] = (unsigned char)rand();
  ferry_tensor *t = calloc(n, sizeof *t);
  int64_t *shapes = calloc(2 * n, sizeof(int64_t)), *strides = calloc(2 * n, sizeof(int64_t));
  size_t off = 0;
  for (size_t i = 0; i < n; i++) {
    /* As 2-D int32 [rows, cols]; every 5th tensor is read back through a transposed view (strided). */
    int64_t elems = (int64_t)sizes[i] / 4, rows = 1;
    for (int64_t r = 2; r * r <= elems; r++)
      if (elems % r == 0) rows = r;
    shapes[2 * i] = rows;
    shapes[2 * i + 1] = elems / (rows ? rows : 1);
    t[i] = (ferry_tensor){host + off, {FERRY_DEVICE_CPU, 0}, 2, {FERRY_DTYPE_INT, 32, 1}, &shapes[2 * i], NULL, 0};
    off += sizes[i];
  }
  ferry_transfer_options o = gpu_options(dev, FERRY_TRANSFER_BLOCKING);
  ferry_transfer *up = NULL, *down = NULL;
  ferry_tensor *views = calloc(n, sizeof *views);
  int64_t *vshape = calloc(2 * n, sizeof(int64_t));
  ferry_status st = ferry_transfer_h2d(t, n, &o, &up);
  EXPECT(st == FERRY_OK, "h2d of %zu tensors: %s", n, ferry_status_name(st));
  if (st != FERRY_OK) goto out;
  const ferry_tensor *dev_t = ferry_transfer_outputs(up);
  for (size_t i = 0; i < n; i++) {
    views[i] = dev_t[i];
    EXPECT(dev_t[i].device.device_type == FERRY_DEVICE_CUDA, "output %zu not on the device", i);
    if (strided && i % 5 == 0) {
      vshape[2 * i] = dev_t[i].shape[1];
      vshape[2 * i + 1] = dev_t[i].shape[0];
      strides[2 * i] = 1;
      strides[2 * i + 1] = dev_t[i].shape[1];
      views[i].shape = &vshape[2 * i];
      views[i].strides = &strides[2 * i];
    }
  }
  st = ferry_transfer_d2h(views, n, &o, &down);
  EXPECT(st == FERRY_OK, "d2h of %zu tensors: %s", n, ferry_status_name(st));
  if (st == FERRY_OK) {
    const ferry_tensor *h = ferry_transfer_outputs(down);
    size_t bad = 0;
    off = 0;
    for (size_t i = 0; i < n; i++) {
      const int32_t *src = (const int32_t *)(host + off), *got = h[i].data;
      int64_t R = shapes[2 * i], C = shapes[2 * i + 1];
      if (sizes[i] && strided && i % 5 == 0) {
        for (int64_t c = 0; c < C; c++)
          for (int64_t r = 0; r < R; r++) bad += got[c * R + r] != src[r * C + c];
      } else if (sizes[i]) {
        bad += memcmp(got, src, sizes[i]) != 0;
      }
      off += sizes[i];
    }
    EXPECT(bad == 0, "%zu tensors (strided=%d): %zu mismatches", n, strided, bad);
    printf("   round trip %5zu tensors, %8.2f MiB, strided=%d: %s\n", n, (double)total / (1 << 20), strided,
           bad ? "MISMATCH" : "exact");
  }
out:
  ferry_transfer_release(down);
  ferry_transfer_release(up);
  free(views);
  free(vshape);
  free(sizes);
  free(host);
  free(t);
  free(shapes);
  free(strides);
}

TEST(round_trips) {
  int dev = gpu_dev;
  size_t counts[] = {1, 32, 256, 4096};
  for (int k = 0; k < 4; k++) {
    round_trip(dev, counts[k], counts[k] == 1 ? (8u << 20) : (256u << 10), 0, 1234 + k);
    round_trip(dev, counts[k], counts[k] == 1 ? (8u << 20) : (256u << 10), 1, 99 + k);
  }
  round_trip(dev, 64, 16u << 20, 1, 7); /* large strided tensors: many work items each */
}

/* ---- mixed dtypes, ranks, and tensors that are not ours ------------------------------------------------ */

enum { MIX = 9 };

TEST(mixed_dtypes_and_pass_through) {
  int dev = gpu_dev;
  int failures_before = atomic_load(&gpu_failures);
  /* Host sources of several dtypes and ranks (bytes are what matters; the dtype sets element size and layout). */
  static int64_t sh_f32[2] = {37, 53}, sh_f16[3] = {3, 5, 7}, sh_i64[1] = {1001}, sh_bool[1] = {4097},
                 sh_c64[2] = {17, 2}, sh_u8[2] = {64, 48}, sh_scalar[1] = {1}, sh_host[1] = {16}, sh_other[1] = {8};
  static const ferry_dtype dt[MIX] = {{FERRY_DTYPE_FLOAT, 32, 1}, {FERRY_DTYPE_FLOAT, 16, 1}, {FERRY_DTYPE_INT, 64, 1},
                                      {FERRY_DTYPE_BOOL, 8, 1},   {FERRY_DTYPE_COMPLEX, 64, 1}, {FERRY_DTYPE_UINT, 8, 1},
                                      {FERRY_DTYPE_FLOAT, 64, 1}, {FERRY_DTYPE_INT, 8, 1},   {FERRY_DTYPE_INT, 8, 1}};
  int64_t *sh[MIX] = {sh_f32, sh_f16, sh_i64, sh_bool, sh_c64, sh_u8, sh_scalar, sh_host, sh_other};
  int32_t nd[MIX] = {2, 3, 1, 1, 2, 2, 0, 1, 1};
  ferry_tensor in[MIX];
  unsigned char *bufs[MIX];
  uint64_t bytes[MIX];
  for (int i = 0; i < MIX; i++) {
    in[i] = (ferry_tensor){NULL, {FERRY_DEVICE_CPU, 0}, nd[i], dt[i], sh[i], NULL, 0};
    REQUIRE_OK(ferry_tensor_nbytes(&in[i], &bytes[i]));
    bufs[i] = malloc(bytes[i]);
    for (uint64_t k = 0; k < bytes[i]; k++) bufs[i][k] = (unsigned char)(k * 7 + (uint64_t)i * 13 + 1);
    in[i].data = bufs[i];
  }
  ferry_transfer_options o = gpu_options(dev, FERRY_TRANSFER_BLOCKING);
  ferry_transfer *up = NULL, *down = NULL;
  REQUIRE_OK(ferry_transfer_h2d(in, MIX - 2, &o, &up)); /* the last two stay on the host */
  ferry_tensor batch[MIX];
  memcpy(batch, ferry_transfer_outputs(up), (MIX - 2) * sizeof *batch);
  /* Tensor 5 read back as its 64x24 left half: a strided view (row stride 48) of the device copy. */
  static int64_t half_shape[2] = {64, 24}, half_strides[2] = {48, 1};
  batch[5].shape = half_shape;
  batch[5].strides = half_strides;
  batch[7] = in[7];                                   /* a host tensor in a D2H batch: passes through */
  batch[8] = in[8];
  batch[8].device = (ferry_device){FERRY_DEVICE_CUDA, dev + 1}; /* another device's tensor: passes through */
  ferry_status st = ferry_transfer_d2h(batch, MIX, &o, &down);
  EXPECT(st == FERRY_OK, "mixed batch d2h: %s", ferry_status_name(st));
  if (st == FERRY_OK) {
    const ferry_tensor *out = ferry_transfer_outputs(down);
    for (int i = 0; i < MIX - 2; i++) {
      EXPECT(ferry_transfer_output_copied(down, (size_t)i) == 1, "tensor %d not copied", i);
      EXPECT(out[i].device.device_type == FERRY_DEVICE_CPU, "tensor %d not on the host", i);
      EXPECT(out[i].ndim == batch[i].ndim && out[i].dtype.bits == dt[i].bits && out[i].dtype.code == dt[i].code,
             "tensor %d lost its rank or dtype", i);
      if (i == 5) {
        size_t bad = 0;
        for (int r = 0; r < 64; r++)
          bad += memcmp((unsigned char *)out[i].data + r * 24, bufs[i] + r * 48, 24) != 0;
        EXPECT(bad == 0, "strided half of tensor 5: %zu bad rows", bad);
        EXPECT(out[i].strides[0] == 24 && out[i].strides[1] == 1, "tensor 5 output not compact");
      } else {
        EXPECT(memcmp(out[i].data, bufs[i], bytes[i]) == 0, "tensor %d (dtype code %d, %d bits, rank %d) differs", i,
               dt[i].code, dt[i].bits, nd[i]);
      }
    }
    for (int i = MIX - 2; i < MIX; i++) {
      EXPECT(ferry_transfer_output_copied(down, (size_t)i) == 0, "tensor %d should pass through", i);
      /* its data the input's, its shape a copy the ticket owns (the caller may free its own) */
      EXPECT(out[i].data == batch[i].data && out[i].shape != batch[i].shape && out[i].ndim == batch[i].ndim &&
             memcmp(out[i].shape, batch[i].shape, (size_t)batch[i].ndim * sizeof(int64_t)) == 0 &&
             out[i].device.device_id == batch[i].device.device_id, "tensor %d was not passed through untouched", i);
    }
    printf("   9 tensors: f32 2-D, f16 3-D, i64, bool, c64, u8 strided view, f64 0-d, host, other device: %s\n",
           atomic_load(&gpu_failures) != failures_before ? "see failures" : "exact, pass-through untouched");
  }
  ferry_transfer_release(down);
  ferry_transfer_release(up);
  for (int i = 0; i < MIX; i++) free(bufs[i]);
}

/* ---- strided tensors of odd element widths -------------------------------------------------------------- */

/* Transposed views of R x C elements of `eb` bytes: uploaded compact, read back transposed (the gather kernel
 * walks them on the device), and uploaded transposed from pageable host memory (the CPU packs them). 3-byte
 * elements cut gather items at 65535 bytes (a 192 KiB tensor takes 4); 300-byte elements are wider than the
 * layout's element field and travel as an inner dimension of bytes. */
static void odd_width_round_trip(int dev, int64_t R, int64_t C, uint8_t bits, uint16_t lanes) {
  size_t eb = (size_t)bits * lanes / 8, bytes = (size_t)(R * C) * eb;
  unsigned char *host = malloc(bytes), *want = malloc(bytes);
  for (size_t k = 0; k < bytes; k++) host[k] = (unsigned char)(k * 131 + k / 251);
  for (int64_t r = 0; r < R; r++) /* want = the transpose, [C, R] */
    for (int64_t c = 0; c < C; c++) memcpy(want + (size_t)(c * R + r) * eb, host + (size_t)(r * C + c) * eb, eb);
  int64_t shape[2] = {R, C}, tshape[2] = {C, R}, tstrides[2] = {1, C};
  ferry_tensor t = {host, {FERRY_DEVICE_CPU, 0}, 2, {FERRY_DTYPE_UINT, bits, lanes}, shape, NULL, 0};
  ferry_transfer_options o = gpu_options(dev, FERRY_TRANSFER_BLOCKING);
  o.gather_max_bytes = 0;
  ferry_transfer *up = NULL, *down = NULL, *packed = NULL, *back = NULL;
  REQUIRE_OK(ferry_transfer_h2d(&t, 1, &o, &up));
  ferry_tensor view = ferry_transfer_outputs(up)[0];
  view.shape = tshape;
  view.strides = tstrides;
  ferry_status st = ferry_transfer_d2h(&view, 1, &o, &down);
  EXPECT(st == FERRY_OK, "d2h of a transposed %lldx%lld view of %zu-byte elements: %s", (long long)R,
         (long long)C, eb, ferry_status_name(st));
  if (st == FERRY_OK)
    EXPECT(memcmp(ferry_transfer_outputs(down)[0].data, want, bytes) == 0,
           "gathered transpose of %zu-byte elements differs", eb);
  ferry_tensor tview = {host, {FERRY_DEVICE_CPU, 0}, 2, {FERRY_DTYPE_UINT, bits, lanes}, tshape, tstrides, 0};
  st = ferry_transfer_h2d(&tview, 1, &o, &packed);
  EXPECT(st == FERRY_OK, "h2d of a transposed pageable view of %zu-byte elements: %s", eb, ferry_status_name(st));
  if (st == FERRY_OK) {
    REQUIRE_OK(ferry_transfer_d2h(ferry_transfer_outputs(packed), 1, &o, &back));
    EXPECT(memcmp(ferry_transfer_outputs(back)[0].data, want, bytes) == 0,
           "packed transpose of %zu-byte elements differs", eb);
  }
  printf("   transposed %lld x %lld of %zu-byte elements, gathered and packed: %s\n", (long long)R, (long long)C, eb,
         st == FERRY_OK ? "checked" : "failed");
  ferry_transfer_release(back);
  ferry_transfer_release(packed);
  ferry_transfer_release(down);
  ferry_transfer_release(up);
  free(host);
  free(want);
}

TEST(odd_width_strided_elements) {
  odd_width_round_trip(gpu_dev, 256, 256, 24, 1); /* 192 KiB of 3-byte elements */
  odd_width_round_trip(gpu_dev, 7, 9, 8, 300);    /* 300-byte elements */
}
