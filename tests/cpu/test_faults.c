/* Transfers through the fake driver: exact results over every route, then a fault at every use of every driver
 * call the D2H and H2D paths make. Each fault must fail cleanly: the status, error.call and the message name the
 * call; no ticket comes back; the pool holds no more than before; no device memory leaks; and the next transfer on
 * the same thread (same stream, same pool) is exact. Each (call, nth use) runs in its own process, so one-time
 * work (stream, module, memory pool creation) is faulted too, not only what runs on every transfer. */
#include "fake_driver.h"
#include "test.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <unistd.h>

enum { N = 40 };
static unsigned char src[N][3000];
static int64_t shapes[N][2];
static int64_t strides[N][2];

/* 40 uint8 tensors: two of 3000 bytes (DMA), many small (gather or pack), one transposed view (strided), one
 * zero-size, and for D2H one host tensor that must pass through. `host_pinned` (H2D) moves the first half of
 * the sources into registered memory so both the kernel-over-PCIe and the CPU-pack routes run. */
static void make_batch(ferry_tensor *t, int h2d, unsigned char *pinned) {
  for (int i = 0; i < N; i++) {
    int64_t len = i < 2 ? 3000 : 100 + i * 50;
    unsigned char *p = (pinned && i < N / 2) ? pinned + (size_t)i * 3000 : src[i];
    for (int k = 0; k < 3000; k++) p[k] = (unsigned char)(i * 31 + k);
    shapes[i][0] = len;
    t[i] = (ferry_tensor){p, {h2d ? FERRY_DEVICE_CPU : FERRY_DEVICE_CUDA, 0}, 1, {FERRY_DTYPE_UINT, 8, 1},
                          shapes[i], NULL, 0};
  }
  /* Tensor 5: a 10x20 transposed view of 200 bytes (strides in elements). Tensor 6: zero-size. */
  shapes[5][0] = 10, shapes[5][1] = 20, strides[5][0] = 1, strides[5][1] = 10;
  t[5].ndim = 2, t[5].strides = strides[5];
  shapes[6][0] = 0;
  if (!h2d) t[7].device.device_type = FERRY_DEVICE_CPU; /* D2H: a host tensor mixed in passes through */
}

static unsigned char expected_at(const ferry_tensor *in, int i, int64_t k) {
  const unsigned char *p = in[i].data;
  if (i == 5) return p[(k % 20) * 10 + k / 20]; /* element (r, c) of the view is source[c * 10 + r] */
  return p[k];
}

static void check_exact(const ferry_tensor *in, ferry_transfer *tr, int h2d) {
  const ferry_tensor *o = ferry_transfer_outputs(tr);
  for (int i = 0; i < N; i++) {
    if (!h2d && i == 7) {
      ASSERT(o[i].data == in[i].data); /* passed through untouched */
      ASSERT_EQ(ferry_transfer_output_copied(tr, (size_t)i), 0);
      continue;
    }
    ASSERT_EQ(o[i].device.device_type, h2d ? FERRY_DEVICE_CUDA : FERRY_DEVICE_CPU);
    int64_t n = shapes[i][0] * (in[i].ndim == 2 ? shapes[i][1] : 1);
    for (int64_t k = 0; k < n; k++)
      if (((const unsigned char *)o[i].data)[k] != expected_at(in, i, k))
        FAIL_AT("tensor %d byte %lld: got %u, expected %u", i, (long long)k, ((const unsigned char *)o[i].data)[k],
                expected_at(in, i, k));
  }
}

static ferry_transfer_options options(uint32_t flags) {
  ferry_transfer_options o;
  ferry_transfer_options_init(&o);
  o.device = 0;
  o.flags = flags;
  o.gather_max_bytes = 2000; /* the two 3000-byte tensors are DMA'd, the rest gathered or packed */
  return o;
}

static ferry_status submit(int h2d, const ferry_tensor *t, const ferry_transfer_options *o, ferry_transfer **tr) {
  return h2d ? ferry_transfer_h2d(t, N, o, tr) : ferry_transfer_d2h(t, N, o, tr);
}

TEST(fake_d2h_is_exact_and_returns_slab) {
  fake_driver_use();
  ASSERT_OK(ferry_init());
  ferry_tensor t[N];
  make_batch(t, 0, NULL);
  ferry_transfer_options o = options(0);
  ferry_transfer *tr = NULL;
  ASSERT_OK(ferry_transfer_d2h(t, N, &o, &tr));
  ASSERT_OK(ferry_transfer_wait(tr));
  check_exact(t, tr, 0);
  ferry_pool_stats s;
  ferry_pool_stats_get(&s);
  ASSERT(s.bytes_in_use > 0);
  ferry_transfer_release(tr);
  ferry_pool_stats_get(&s);
  ASSERT_EQ(s.bytes_in_use, 0);
  ASSERT_EQ(fake_live_devmem, 0); /* gather staging freed */
}

/* The D2H gather in several chunks (forced small): a strided tensor cut across chunk boundaries must come out
 * exact, its layout repeated in each chunk's work list. */
TEST(fake_d2h_pipeline_chunks_are_exact) {
  fake_driver_use();
  ASSERT_OK(ferry_init());
  enum { SMALL = 50, ROWS = 300, COLS = 700 };
  static uint16_t big[ROWS * COLS];
  static unsigned char small[SMALL][777];
  static int64_t big_shape[2] = {COLS, ROWS}, big_strides[2] = {1, COLS}, small_shape[SMALL];
  ferry_tensor t[SMALL + 1];
  for (int k = 0; k < ROWS * COLS; k++) big[k] = (uint16_t)(k * 2654435761u >> 7);
  /* A transposed view: 700 x 300 uint16 (420 KB), gathered element by element in several 64 KiB items. */
  t[0] = (ferry_tensor){big, {FERRY_DEVICE_CUDA, 0}, 2, {FERRY_DTYPE_UINT, 16, 1}, big_shape, big_strides, 0};
  for (int i = 0; i < SMALL; i++) {
    small_shape[i] = 300 + i * 9;
    for (int k = 0; k < 777; k++) small[i][k] = (unsigned char)(i + k * 3);
    t[i + 1] = (ferry_tensor){small[i], {FERRY_DEVICE_CUDA, 0}, 1, {FERRY_DTYPE_UINT, 8, 1}, &small_shape[i], NULL, 0};
  }
  ferry__pipeline_chunk_min = 100 << 10; /* about five chunks */
  ferry_transfer_options o = options(FERRY_TRANSFER_BLOCKING);
  o.gather_max_bytes = 0; /* default: everything here is gathered */
  ferry_transfer *tr = NULL;
  ASSERT_OK(ferry_transfer_d2h(t, SMALL + 1, &o, &tr));
  const ferry_tensor *out = ferry_transfer_outputs(tr);
  const uint16_t *g = out[0].data;
  for (int c = 0; c < COLS; c++)
    for (int r = 0; r < ROWS; r++)
      if (g[c * ROWS + r] != big[r * COLS + c]) FAIL_AT("transposed element (%d, %d) differs", c, r);
  for (int i = 0; i < SMALL; i++) ASSERT(memcmp(out[i + 1].data, small[i], (size_t)small_shape[i]) == 0);
  ferry_transfer_release(tr);
  ASSERT_EQ(fake_live_devmem, 0);
}

TEST(fake_h2d_is_exact_over_every_route) {
  fake_driver_use();
  ASSERT_OK(ferry_init());
  void *pinned;
  size_t pinned_bytes;
  ASSERT_OK(ferry__pin(N * 3000, &pinned, &pinned_bytes));
  ferry_tensor t[N];
  make_batch(t, 1, pinned);
  ferry_transfer_options o = options(FERRY_TRANSFER_BLOCKING);
  ferry_transfer *tr = NULL;
  ASSERT_OK(ferry_transfer_h2d(t, N, &o, &tr));
  check_exact(t, tr, 1);
  ferry_transfer_release(tr);
  ASSERT_EQ(fake_live_devmem, 0);
  ferry_pool_stats s;
  ferry_pool_stats_get(&s);
  ASSERT_EQ(s.bytes_in_use, 0);
  ferry__unpin(pinned, pinned_bytes);
}

/* An empty tensor whose compact strides do not fit 64 bits: its output could not be described, so the call
 * refuses it before any copy (the outputs of an empty tensor carry compact strides like any other). */
TEST(d2h_of_an_empty_tensor_with_overflowing_strides_is_refused) {
  fake_driver_use();
  ASSERT_OK(ferry_init());
  int64_t shape[3] = {0, (int64_t)1 << 40, (int64_t)1 << 40};
  ferry_tensor t = {NULL, {FERRY_DEVICE_CUDA, 0}, 3, {FERRY_DTYPE_UINT, 8, 1}, shape, NULL, 0};
  ferry_transfer *tr = NULL;
  ASSERT_STATUS(ferry_transfer_d2h(&t, 1, NULL, &tr), FERRY_OVERFLOW);
  ASSERT(tr == NULL);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "strides");
}

/* ---- faults ---------------------------------------------------------------------------------------------- */

enum { CASE_CLEAN = 0, CASE_BAD = 1, CASE_NOT_REACHED = 3 };

/* Runs in a child process: arms `call` to fail at its `nth` use, submits, and checks everything listed above. */
static int fault_case(int h2d, const char *call, int nth) {
  fake_driver_use();
  ASSERT_OK(ferry_init());
  void *pinned = NULL;
  size_t pinned_bytes = 0;
  if (h2d && ferry__pin(N * 3000, &pinned, &pinned_bytes) != FERRY_OK) return CASE_BAD;
  ferry_tensor t[N];
  make_batch(t, h2d, pinned);
  ferry_transfer_options o = options(FERRY_TRANSFER_BLOCKING);
  ferry__pipeline_chunk_min = 4096; /* several gather chunks, so every per-chunk call is faulted too */
  ferry_pool_stats before;
  ferry_pool_stats_get(&before);
  ferry__fault_arm(call, nth, CUDA_ERROR_LAUNCH_FAILED);
  ferry_transfer *tr = NULL;
  ferry_status st = submit(h2d, t, &o, &tr);
  int hits = ferry__fault_hits();
  ferry__fault_disarm();
  if (hits < nth) {
    ASSERT_OK(st);
    ferry_transfer_release(tr);
    return CASE_NOT_REACHED;
  }
  if (!strcmp(call, "cuPointerGetAttribute")) {
    /* A failed pinned-memory query only makes ferry treat the source as pageable: still exact. */
    ASSERT_OK(st);
    check_exact(t, tr, h2d);
    ferry_transfer_release(tr);
    return CASE_CLEAN;
  }
  if (st == FERRY_OK) FAIL_AT("a failing %s (use %d) was not reported", call, nth);
  ASSERT(tr == NULL);
  ASSERT_STR_CONTAINS(ferry_last_error()->call, call);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), call);
  ASSERT_EQ(ferry_last_error()->cu_result, CUDA_ERROR_LAUNCH_FAILED);
  ferry_pool_stats after;
  ferry_pool_stats_get(&after);
  if (after.bytes_in_use != before.bytes_in_use)
    FAIL_AT("after a failing %s (use %d) the pool holds %llu bytes in use (before: %llu)", call, nth,
            (unsigned long long)after.bytes_in_use, (unsigned long long)before.bytes_in_use);
  if (fake_live_devmem != 0) FAIL_AT("after a failing %s (use %d), %d device allocations leaked", call, nth,
                                     fake_live_devmem);
  /* The thread's stream and the pool stay usable: the next transfer is exact. */
  ASSERT_OK(submit(h2d, t, &o, &tr));
  check_exact(t, tr, h2d);
  ferry_transfer_release(tr);
  ferry_pool_stats_get(&after);
  ASSERT_EQ(after.bytes_in_use, before.bytes_in_use);
  ASSERT_EQ(fake_live_devmem, 0);
  if (pinned) ferry__unpin(pinned, pinned_bytes);
  return CASE_CLEAN;
}

static void fault_every_use_of(int h2d, const char *const *calls, size_t ncalls) {
  for (size_t c = 0; c < ncalls; c++) {
    for (int nth = 1; nth <= 48; nth++) {
      fflush(NULL);
      pid_t pid = fork();
      if (pid == 0) _exit(fault_case(h2d, calls[c], nth));
      int status = 0;
      waitpid(pid, &status, 0);
      int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
      if (rc == CASE_NOT_REACHED) {
        /* A listed call the path never makes means the list no longer describes the code. */
        if (nth == 1) FAIL_AT("%s is never called on the %s path: update the list", calls[c], h2d ? "H2D" : "D2H");
        break;
      }
      if (rc != CASE_CLEAN) FAIL_AT("%s failing at use %d was not handled cleanly (child status %d)", calls[c], nth, rc);
    }
  }
}

TEST(fault_at_every_d2h_call_is_clean) {
  static const char *const calls[] = {
      "cuCtxPushCurrent", "cuDevicePrimaryCtxRetain", "cuStreamCreate", "cuEventCreate", "cuEventRecord",
      "cuStreamWaitEvent", "cuMemHostRegister", "cuMemPoolCreate", "cuMemPoolSetAttribute",
      "cuMemAllocFromPoolAsync", "cuModuleLoadData", "cuModuleGetFunction", "cuMemcpyHtoDAsync", "cuLaunchKernel",
      "cuMemcpyAsync", "cuMemFreeAsync", "cuMemcpyBatchAsync_v13", "cuEventSynchronize"};
  fault_every_use_of(0, calls, sizeof calls / sizeof *calls);
}

TEST(fault_at_every_h2d_call_is_clean) {
  static const char *const calls[] = {
      "cuCtxPushCurrent", "cuDevicePrimaryCtxRetain", "cuPointerGetAttribute", "cuStreamCreate", "cuEventCreate",
      "cuEventRecord", "cuStreamWaitEvent", "cuMemHostRegister", "cuMemPoolCreate", "cuMemPoolSetAttribute",
      "cuMemAllocFromPoolAsync", "cuModuleLoadData", "cuModuleGetFunction", "cuMemcpyHtoDAsync", "cuLaunchKernel",
      "cuMemcpyBatchAsync_v13", "cuEventSynchronize"};
  fault_every_use_of(1, calls, sizeof calls / sizeof *calls);
}

/* ---- the fault seam under threads ------------------------------------------------------------------------ */

/* One thread arms and disarms faults on several calls while four others transfer batches of small tensors (the
 * gather route) and a strided one. The seam is shared state every driver call reads: arming must be race free
 * (ThreadSanitizer runs this in CI), and a transfer either succeeds exactly or fails naming one of the armed calls. */
enum { SEAM_THREADS = 4, SEAM_TENSORS = 12, SEAM_ROUNDS = 60 };
static const char *const seam_calls[] = {"cuEventRecord", "cuLaunchKernel", "cuMemcpyAsync",
                                         "cuMemAllocFromPoolAsync", "cuEventSynchronize", "cuMemcpyHtoDAsync"};
static atomic_int seam_stop, seam_done, seam_bad;

static void *seam_worker(void *arg) {
  int id = (int)(intptr_t)arg;
  static unsigned char src[SEAM_THREADS][SEAM_TENSORS][512];
  int64_t shapes[SEAM_TENSORS][2], strides[2] = {1, 16};
  ferry_tensor t[SEAM_TENSORS];
  for (int i = 0; i < SEAM_TENSORS; i++) {
    for (int k = 0; k < 512; k++) src[id][i][k] = (unsigned char)(id * 7 + i * 31 + k);
    shapes[i][0] = 64 + i * 37;
    t[i] = (ferry_tensor){src[id][i], {FERRY_DEVICE_CUDA, 0}, 1, {FERRY_DTYPE_UINT, 8, 1}, shapes[i], NULL, 0};
  }
  shapes[0][0] = 16, shapes[0][1] = 16; /* tensor 0: the transpose of a 16 x 16 block */
  t[0].ndim = 2, t[0].strides = strides;
  ferry_transfer_options o = options(FERRY_TRANSFER_BLOCKING);
  while (!atomic_load(&seam_stop)) {
    ferry_transfer *tr = NULL;
    ferry_status st = ferry_transfer_d2h(t, SEAM_TENSORS, &o, &tr);
    if (st == FERRY_OK) {
      const ferry_tensor *out = ferry_transfer_outputs(tr);
      const unsigned char *g = out[0].data;
      for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) atomic_fetch_add(&seam_bad, g[r * 16 + c] != src[id][0][c * 16 + r]);
      for (int i = 1; i < SEAM_TENSORS; i++)
        atomic_fetch_add(&seam_bad, memcmp(out[i].data, src[id][i], (size_t)shapes[i][0]) != 0);
      ferry_transfer_release(tr);
    } else {
      int named = 0;
      for (size_t c = 0; c < sizeof seam_calls / sizeof *seam_calls; c++)
        named |= !strcmp(ferry_last_error()->call, seam_calls[c]);
      if (!named || tr != NULL) {
        fprintf(stderr, "  a failed transfer named '%s': %s\n", ferry_last_error()->call, ferry_last_error_message());
        atomic_fetch_add(&seam_bad, 1);
      }
    }
    atomic_fetch_add(&seam_done, 1);
  }
  return NULL;
}

TEST(faults_armed_while_other_threads_transfer_hit_only_the_named_call) {
  fake_driver_use();
  ASSERT_OK(ferry_init());
  pthread_t th[SEAM_THREADS];
  for (int i = 0; i < SEAM_THREADS; i++) ASSERT_EQ(pthread_create(&th[i], NULL, seam_worker, (void *)(intptr_t)i), 0);
  size_t ncalls = sizeof seam_calls / sizeof *seam_calls;
  for (int round = 0; round < SEAM_ROUNDS; round++) {
    ferry__fault_arm(seam_calls[round % ncalls], round % 3, CUDA_ERROR_LAUNCH_FAILED);
    /* Until the workers have finished two more batches each, whatever the scheduler does. */
    int until = atomic_load(&seam_done) + 2 * SEAM_THREADS;
    while (atomic_load(&seam_done) < until) sched_yield();
    (void)ferry__fault_hits();
    ferry__fault_disarm();
  }
  atomic_store(&seam_stop, 1);
  for (int i = 0; i < SEAM_THREADS; i++) pthread_join(th[i], NULL);
  ASSERT_EQ(atomic_load(&seam_bad), 0);
  ferry_pool_stats s;
  ferry_pool_stats_get(&s);
  ASSERT_EQ(s.bytes_in_use, 0);
  ASSERT_EQ(fake_live_devmem, 0);
}

TEST(pool_reuses_and_trims) {
  fake_driver_use();
  ASSERT_OK(ferry_init());
  ferry_tensor t[N];
  make_batch(t, 0, NULL);
  ferry_transfer_options o = options(0);
  ferry_transfer *a = NULL, *b = NULL;
  ASSERT_OK(ferry_transfer_d2h(t, N, &o, &a));
  ferry_slab *kept = ferry_transfer_slab(a);
  ferry_slab_retain(kept);
  ferry_transfer_release(a); /* outputs still viewed: the slab must stay taken */
  ASSERT_OK(ferry_transfer_d2h(t, N, &o, &b));
  ASSERT(ferry_slab_data(ferry_transfer_slab(b)) != ferry_slab_data(kept));
  ferry_transfer_release(b);
  ferry_slab_release(kept);
  ferry_pool_stats s;
  ferry_pool_stats_get(&s);
  ASSERT_EQ(s.bytes_in_use, 0);
  ASSERT(s.hits >= 1);
  ASSERT_OK(ferry_pool_trim());
  ferry_pool_stats_get(&s);
  ASSERT_EQ(s.bytes_pinned, 0);
  ASSERT_EQ(fake_registered, 0);
}

TEST(device_index_past_count_names_both) {
  fake_driver_use();
  ASSERT_OK(ferry_init());
  int d;
  ASSERT_STATUS(ferry_device_resolve(3, &d), FERRY_DEVICE_UNAVAILABLE);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "cuda:3");
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "sees 1 CUDA device");
  setenv("LOCAL_RANK", "0", 1);
  ASSERT_OK(ferry_device_resolve(-1, &d));
  ASSERT_EQ(d, 0);
  setenv("LOCAL_RANK", "2", 1);
  ASSERT_STATUS(ferry_device_resolve(-1, &d), FERRY_DEVICE_UNAVAILABLE);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "LOCAL_RANK");
  setenv("LOCAL_RANK", "x1", 1);
  ASSERT_STATUS(ferry_device_resolve(-1, &d), FERRY_INVALID_ARGUMENT);
}
