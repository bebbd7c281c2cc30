/* Transfers built in parts (ferry_transfer_begin / add / end) through the fake driver: outputs in order and exact
 * in both directions, one slab per part, planning from copies of the descriptors, the rules of the ticket's life
 * (no add after end, no wait before it), and failures in a later part that kill the transfer without leaking a
 * byte or poisoning the pool. */
#include "fake_driver.h"
#include "test.h"

enum { N = 24, LEN = 4000 };
static unsigned char src[N][LEN];
static int64_t shapes[N][2], strides[N][2];

/* N uint8 tensors of mixed routes: large (DMA), small (gather or pack), a transposed 2-D view, a zero-size one. */
static void make_batch(ferry_tensor *t, int h2d, unsigned seed) {
  for (int i = 0; i < N; i++) {
    for (int k = 0; k < LEN; k++) src[i][k] = (unsigned char)(i * 37 + k * 7 + seed);
    shapes[i][0] = i % 5 == 0 ? LEN : 100 + i * 40;
    t[i] = (ferry_tensor){src[i], {h2d ? FERRY_DEVICE_CPU : FERRY_DEVICE_CUDA, 0}, 1, {FERRY_DTYPE_UINT, 8, 1},
                          shapes[i], NULL, 0};
  }
  shapes[3][0] = 20, shapes[3][1] = 30, strides[3][0] = 1, strides[3][1] = 20; /* element (r, c) at c*20 + r */
  t[3].ndim = 2, t[3].strides = strides[3];
  shapes[4][0] = 0;
}

static unsigned char expected_at(int i, int64_t k) {
  if (i == 3) return src[3][(k % 30) * 20 + k / 30];
  return src[i][k];
}

static int64_t numel(int i) { return i == 3 ? 600 : shapes[i][0]; }

static void check_outputs(ferry_transfer *tr, int h2d) {
  ASSERT_EQ(ferry_transfer_count(tr), N);
  const ferry_tensor *o = ferry_transfer_outputs(tr);
  for (int i = 0; i < N; i++) {
    ASSERT_EQ(ferry_transfer_output_copied(tr, (size_t)i), 1);
    ASSERT_EQ(o[i].device.device_type, h2d ? FERRY_DEVICE_CUDA : FERRY_DEVICE_CPU);
    for (int64_t k = 0; k < numel(i); k++)
      if (((const unsigned char *)o[i].data)[k] != expected_at(i, k))
        FAIL_AT("tensor %d byte %lld: got %u, expected %u", i, (long long)k, ((const unsigned char *)o[i].data)[k],
                expected_at(i, k));
  }
}

static ferry_transfer_options options(uint32_t flags) {
  ferry_transfer_options o;
  ferry_transfer_options_init(&o);
  o.device = 0;
  o.flags = flags;
  o.gather_max_bytes = 2000; /* the 4000-byte tensors are DMA'd, the rest gathered or packed */
  return o;
}

static uint64_t pool_in_use(void) {
  ferry_pool_stats s;
  ferry_pool_stats_get(&s);
  return s.bytes_in_use;
}

/* Adds the batch in the parts [0, 1), [1, 9), [9, N). */
static ferry_status add_in_three_parts(ferry_transfer *tr, const ferry_tensor *t) {
  ferry_status st = ferry_transfer_add(tr, t, 1);
  if (st == FERRY_OK) st = ferry_transfer_add(tr, t + 1, 8);
  if (st == FERRY_OK) st = ferry_transfer_add(tr, t + 9, N - 9);
  return st;
}

static void parts_are_exact(int h2d) {
  fake_driver_use();
  ASSERT_OK(ferry_init());
  ferry_tensor t[N];
  make_batch(t, h2d, 1);
  ferry_transfer_options o = options(0);
  ferry_transfer *tr = NULL;
  ASSERT_OK(h2d ? ferry_transfer_begin_h2d(&o, &tr) : ferry_transfer_begin_d2h(&o, &tr));
  ASSERT_OK(add_in_three_parts(tr, t));
  ASSERT_OK(ferry_transfer_end(tr));
  ASSERT_OK(ferry_transfer_wait(tr));
  check_outputs(tr, h2d);
  /* One slab per part, and every output views its own part's slab. */
  ASSERT_EQ(ferry_transfer_slab_count(tr), 3);
  ferry_slab *first = ferry_transfer_output_slab(tr, 0), *second = ferry_transfer_output_slab(tr, 1),
             *third = ferry_transfer_output_slab(tr, 9);
  ASSERT(first == ferry_transfer_slab_at(tr, 0) && second == ferry_transfer_slab_at(tr, 1) &&
         third == ferry_transfer_slab_at(tr, 2));
  ASSERT(first != second && second != third && ferry_transfer_slab(tr) == first);
  ASSERT(ferry_transfer_output_slab(tr, 8) == second && ferry_transfer_output_slab(tr, N - 1) == third);
  ASSERT(ferry_transfer_output_slab(tr, 4) == NULL); /* zero-size: views no slab */
  ASSERT(ferry_transfer_output_slab(tr, N) == NULL && ferry_transfer_slab_at(tr, 3) == NULL);
  ferry_transfer_release(tr);
  ASSERT_EQ(pool_in_use(), 0);
  ASSERT_EQ(fake_live_devmem, 0);
}

TEST(parts_d2h_outputs_follow_in_order_each_part_in_its_own_slab) { parts_are_exact(0); }
TEST(parts_h2d_outputs_follow_in_order_each_part_in_its_own_slab) { parts_are_exact(1); }

/* The caller may scribble over its shape and stride arrays once add returns: ferry planned from its own copy. */
TEST(parts_are_planned_from_copies_of_the_descriptors) {
  fake_driver_use();
  ASSERT_OK(ferry_init());
  ferry_tensor t[N];
  make_batch(t, 0, 2);
  ferry_transfer_options o = options(FERRY_TRANSFER_BLOCKING);
  ferry_transfer *tr = NULL;
  ASSERT_OK(ferry_transfer_begin_d2h(&o, &tr));
  ASSERT_OK(ferry_transfer_add(tr, t, N));
  int64_t saved_shapes[N][2], saved_strides[N][2];
  memcpy(saved_shapes, shapes, sizeof shapes);
  memcpy(saved_strides, strides, sizeof strides);
  for (int i = 0; i < N; i++) shapes[i][0] = shapes[i][1] = (int64_t)1 << 40, strides[i][0] = strides[i][1] = -7;
  ASSERT_OK(ferry_transfer_end(tr));
  memcpy(shapes, saved_shapes, sizeof shapes);
  memcpy(strides, saved_strides, sizeof strides);
  check_outputs(tr, 0);
  const ferry_tensor *out = ferry_transfer_outputs(tr);
  ASSERT(out[3].shape != shapes[3] && out[3].shape[0] == 20 && out[3].shape[1] == 30);
  ferry_transfer_release(tr);
}

/* A transfer built one small tensor at a time takes a slab per part: each slab costs about what it holds (whole
 * 256-byte units), not a 64 KiB granule, or 5000 adds of 4 bytes would take 320 MiB of pinned memory. */
TEST(parts_of_one_small_tensor_each_take_what_they_hold) {
  fake_driver_use();
  ASSERT_OK(ferry_init());
  enum { ADDS = 5000 };
  static uint32_t values[ADDS];
  static int64_t one = 1;
  ferry_transfer_options o = options(FERRY_TRANSFER_BLOCKING);
  ferry_transfer *tr = NULL;
  ASSERT_OK(ferry_transfer_begin_d2h(&o, &tr));
  for (int i = 0; i < ADDS; i++) {
    values[i] = (uint32_t)i * 2654435761u;
    ferry_tensor t = {&values[i], {FERRY_DEVICE_CUDA, 0}, 1, {FERRY_DTYPE_UINT, 32, 1}, &one, NULL, 0};
    ASSERT_OK(ferry_transfer_add(tr, &t, 1));
  }
  ASSERT_OK(ferry_transfer_end(tr));
  const ferry_tensor *out = ferry_transfer_outputs(tr);
  for (int i = 0; i < ADDS; i++) ASSERT_EQ(*(const uint32_t *)out[i].data, values[i]);
  ferry_pool_stats s;
  ferry_pool_stats_get(&s);
  ASSERT(s.bytes_in_use <= (uint64_t)ADDS * 1024); /* an output and its part's work list in a few 256-byte units */
  ferry_transfer_release(tr);
  ferry_pool_stats_get(&s);
  ASSERT_EQ(s.bytes_in_use, 0);
}

/* H2D: an event given to ferry_transfer_order_after orders the parts added after it as one given at begin does,
 * the CPU's packing of small pageable sources included (it reads them when the part is added). The fake producer's
 * bytes become visible when its event is waited for on the host. */
static char producer_token;
#define PRODUCER ((CUevent)&producer_token)
static unsigned char produced_src[2][1000];
static CUresult (*event_sync_before)(CUevent);
static CUresult (*stream_wait_before)(CUstream, CUevent, unsigned);
static CUresult producer_sync(CUevent e) {
  if (e != PRODUCER) return event_sync_before(e);
  memset(produced_src, 0xAB, sizeof produced_src);
  return CUDA_SUCCESS;
}
static CUresult producer_stream_wait(CUstream s, CUevent e, unsigned f) {
  return e == PRODUCER ? CUDA_SUCCESS : stream_wait_before(s, e, f);
}

TEST(parts_h2d_pack_waits_for_an_event_given_to_order_after) {
  fake_driver_use();
  ASSERT_OK(ferry_init());
  event_sync_before = ferry__drv.cuEventSynchronize, stream_wait_before = ferry__drv.cuStreamWaitEvent;
  ferry__drv.cuEventSynchronize = producer_sync, ferry__drv.cuStreamWaitEvent = producer_stream_wait;
  for (int via_order_after = 0; via_order_after <= 1; via_order_after++) {
    memset(produced_src, 0x11, sizeof produced_src); /* what the sources hold before the producer is done */
    static int64_t shape = 1000;
    ferry_tensor t[2];
    for (int i = 0; i < 2; i++)
      t[i] = (ferry_tensor){produced_src[i], {FERRY_DEVICE_CPU, 0}, 1, {FERRY_DTYPE_UINT, 8, 1}, &shape, NULL, 0};
    ferry_transfer_options o = options(FERRY_TRANSFER_BLOCKING);
    if (!via_order_after) o.producer_event = PRODUCER;
    ferry_transfer *tr = NULL;
    ASSERT_OK(ferry_transfer_begin_h2d(&o, &tr));
    if (via_order_after) ASSERT_OK(ferry_transfer_order_after(tr, PRODUCER, NULL));
    ASSERT_OK(ferry_transfer_add(tr, t, 2));
    ASSERT_OK(ferry_transfer_end(tr));
    for (int i = 0; i < 2; i++) ASSERT_EQ(((const unsigned char *)ferry_transfer_outputs(tr)[i].data)[0], 0xAB);
    ferry_transfer_release(tr);
  }
  ferry__drv.cuEventSynchronize = event_sync_before, ferry__drv.cuStreamWaitEvent = stream_wait_before;
}

TEST(parts_the_ticket_rejects_calls_out_of_order) {
  fake_driver_use();
  ASSERT_OK(ferry_init());
  ferry_tensor t[N];
  make_batch(t, 0, 3);
  ferry_transfer_options o = options(0);
  ferry_transfer *tr = NULL;
  ASSERT_OK(ferry_transfer_begin_d2h(&o, &tr));
  ASSERT_OK(ferry_transfer_add(tr, t, 2));
  ASSERT_STATUS(ferry_transfer_wait(tr), FERRY_INVALID_ARGUMENT);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "ferry_transfer_end");
  ASSERT_STATUS(ferry_transfer_query(tr), FERRY_INVALID_ARGUMENT);
  ASSERT_OK(ferry_transfer_end(tr));
  ASSERT_STATUS(ferry_transfer_add(tr, t, 1), FERRY_INVALID_ARGUMENT);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "ended");
  ASSERT_STATUS(ferry_transfer_end(tr), FERRY_INVALID_ARGUMENT);
  ASSERT_OK(ferry_transfer_wait(tr)); /* rejected calls do not kill a transfer that is fine */
  ASSERT_EQ(ferry_transfer_count(tr), 2);
  ferry_transfer_release(tr);
  ASSERT_EQ(pool_in_use(), 0);
}

/* A transfer released before it was ended still fences what it queued, and frees everything. */
TEST(parts_released_before_the_end_leak_nothing) {
  fake_driver_use();
  ASSERT_OK(ferry_init());
  ferry_tensor t[N];
  make_batch(t, 0, 4);
  ferry_transfer_options o = options(0);
  ferry_transfer *tr = NULL;
  ASSERT_OK(ferry_transfer_begin_d2h(&o, &tr));
  ASSERT_OK(add_in_three_parts(tr, t));
  ferry_transfer_release(tr);
  ASSERT_EQ(pool_in_use(), 0);
  ASSERT_EQ(fake_live_devmem, 0);
}

/* A bad tensor in the second part: the add fails, naming it; every later call repeats that failure; releasing
 * frees the first part's slab; the next transfer on the same thread is exact. */
static void bad_later_part(int h2d) {
  fake_driver_use();
  ASSERT_OK(ferry_init());
  ferry_tensor t[N];
  make_batch(t, h2d, 5);
  ferry_transfer_options o = options(0);
  ferry_transfer *tr = NULL;
  ASSERT_OK(h2d ? ferry_transfer_begin_h2d(&o, &tr) : ferry_transfer_begin_d2h(&o, &tr));
  ASSERT_OK(ferry_transfer_add(tr, t, 9));
  int64_t negative = -3;
  ferry_tensor bad[2] = {t[9], t[10]};
  bad[1].shape = &negative;
  ASSERT_STATUS(ferry_transfer_add(tr, bad, 2), FERRY_INVALID_ARGUMENT);
  char first_message[sizeof ferry_last_error()->message];
  memcpy(first_message, ferry_last_error_message(), sizeof first_message);
  ASSERT_STR_CONTAINS(first_message, "tensor 1");
  ferry_clear_error();
  ASSERT_STATUS(ferry_transfer_add(tr, t + 11, 2), FERRY_INVALID_ARGUMENT);
  ASSERT(strcmp(ferry_last_error_message(), first_message) == 0);
  ASSERT_STATUS(ferry_transfer_end(tr), FERRY_INVALID_ARGUMENT);
  ASSERT_STATUS(ferry_transfer_wait(tr), FERRY_INVALID_ARGUMENT);
  ASSERT(strcmp(ferry_last_error_message(), first_message) == 0);
  ferry_transfer_release(tr);
  ASSERT_EQ(pool_in_use(), 0);
  ASSERT_EQ(fake_live_devmem, 0);
  ASSERT_OK(h2d ? ferry_transfer_begin_h2d(&o, &tr) : ferry_transfer_begin_d2h(&o, &tr));
  ASSERT_OK(add_in_three_parts(tr, t));
  ASSERT_OK(ferry_transfer_end(tr));
  ASSERT_OK(ferry_transfer_wait(tr));
  check_outputs(tr, h2d);
  ferry_transfer_release(tr);
  ASSERT_EQ(pool_in_use(), 0);
}

TEST(parts_d2h_a_bad_later_part_kills_the_transfer_cleanly) { bad_later_part(0); }
TEST(parts_h2d_a_bad_later_part_kills_the_transfer_cleanly) { bad_later_part(1); }

/* A driver fault in the copies of the third part: the same rules, and the error names the call. */
TEST(parts_a_driver_fault_in_a_later_part_kills_the_transfer_cleanly) {
  fake_driver_use();
  ASSERT_OK(ferry_init());
  ferry_tensor t[N];
  make_batch(t, 0, 6);
  ferry_transfer_options o = options(0);
  ferry_transfer *tr = NULL;
  ASSERT_OK(ferry_transfer_begin_d2h(&o, &tr));
  ASSERT_OK(ferry_transfer_add(tr, t, 1));
  ASSERT_OK(ferry_transfer_add(tr, t + 1, 8));
  ferry__fault_arm("cuLaunchKernel", 1, CUDA_ERROR_LAUNCH_FAILED);
  ferry_status st = ferry_transfer_add(tr, t + 9, N - 9);
  ferry__fault_disarm();
  ASSERT_STATUS(st, FERRY_DRIVER_ERROR);
  ASSERT_STR_CONTAINS(ferry_last_error()->call, "cuLaunchKernel");
  ASSERT_STATUS(ferry_transfer_end(tr), FERRY_DRIVER_ERROR);
  ASSERT_STR_CONTAINS(ferry_last_error()->call, "cuLaunchKernel");
  ferry_transfer_release(tr);
  ASSERT_EQ(pool_in_use(), 0);
  ASSERT_EQ(fake_live_devmem, 0);
}

/* The one-call form adds a batch of many tensors in parts of 1024 (so that copies start while the rest is
 * planned): 2500 tiny tensors come back exact, in three slabs; a driver fault in the third part's gather fails the
 * call with no ticket handed back, nothing leaked, and the next call is exact. */
enum { MANY = 2500 };
static unsigned char many_src[MANY][8];
static int64_t many_shape[1] = {8};

static void make_many(ferry_tensor *t, unsigned seed) {
  for (int i = 0; i < MANY; i++) {
    for (int k = 0; k < 8; k++) many_src[i][k] = (unsigned char)(i * 13 + k + seed);
    t[i] = (ferry_tensor){many_src[i], {FERRY_DEVICE_CUDA, 0}, 1, {FERRY_DTYPE_UINT, 8, 1}, many_shape, NULL, 0};
  }
}

static void check_many(ferry_transfer *tr) {
  ASSERT_EQ(ferry_transfer_count(tr), MANY);
  const ferry_tensor *o = ferry_transfer_outputs(tr);
  for (int i = 0; i < MANY; i++)
    if (memcmp(o[i].data, many_src[i], 8) != 0) FAIL_AT("tensor %d differs", i);
}

TEST(parts_one_call_of_many_tensors_goes_in_parts) {
  fake_driver_use();
  ASSERT_OK(ferry_init());
  static ferry_tensor t[MANY];
  make_many(t, 1);
  ferry_transfer_options o = options(FERRY_TRANSFER_BLOCKING);
  ferry_transfer *tr = NULL;
  ASSERT_OK(ferry_transfer_d2h(t, MANY, &o, &tr));
  check_many(tr);
  ASSERT_EQ(ferry_transfer_slab_count(tr), 3);
  ASSERT(ferry_transfer_output_slab(tr, 1023) == ferry_transfer_slab_at(tr, 0));
  ASSERT(ferry_transfer_output_slab(tr, 1024) == ferry_transfer_slab_at(tr, 1));
  ASSERT(ferry_transfer_output_slab(tr, MANY - 1) == ferry_transfer_slab_at(tr, 2));
  ferry_transfer_release(tr);

  ferry__fault_arm("cuLaunchKernel", 3, CUDA_ERROR_LAUNCH_FAILED);
  tr = NULL;
  ferry_status st = ferry_transfer_d2h(t, MANY, &o, &tr);
  int hits = ferry__fault_hits();
  ferry__fault_disarm();
  ASSERT_EQ(hits, 3); /* one gather a part: the third part's failed, and no later part was added */
  ASSERT_STATUS(st, FERRY_DRIVER_ERROR);
  ASSERT_STR_CONTAINS(ferry_last_error()->call, "cuLaunchKernel");
  ASSERT(tr == NULL);
  ASSERT_EQ(pool_in_use(), 0);
  ASSERT_EQ(fake_live_devmem, 0);

  make_many(t, 2);
  ASSERT_OK(ferry_transfer_d2h(t, MANY, &o, &tr));
  check_many(tr);
  ferry_transfer_release(tr);
  ASSERT_EQ(pool_in_use(), 0);
}

/* Without a driver, a transfer in parts passes every tensor through, as the one-call form does. */
TEST(parts_without_a_driver_pass_through) {
  if (ferry_init() == FERRY_OK) return; /* a driver is present here: nothing to observe */
  ferry_tensor t[N];
  make_batch(t, 0, 7);
  ferry_transfer *tr = NULL;
  ASSERT_OK(ferry_transfer_begin_d2h(NULL, &tr));
  ASSERT_OK(add_in_three_parts(tr, t));
  ASSERT_OK(ferry_transfer_end(tr));
  ASSERT_OK(ferry_transfer_wait(tr));
  ASSERT_EQ(ferry_transfer_count(tr), N);
  ASSERT_EQ(ferry_transfer_slab_count(tr), 0);
  for (int i = 0; i < N; i++) ASSERT(ferry_transfer_outputs(tr)[i].data == t[i].data);
  ferry_transfer_release(tr);
}
