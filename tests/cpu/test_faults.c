/* Transfers through the fake driver: exact results, then a fault at every driver call the D2H path makes,
 * each of which must fail cleanly (status and message name the call), leak nothing, and leave the pool usable. */
#include "fake_driver.h"
#include "test.h"

enum { N = 40 };
static unsigned char src[N][3000];
static int64_t shapes[N];

static void make_batch(ferry_tensor *t) {
  for (int i = 0; i < N; i++) {
    shapes[i] = (int64_t)(i == 0 ? 3000 : 100 + i * 50); /* one larger, many small: DMA and gather routes */
    for (int k = 0; k < 3000; k++) src[i][k] = (unsigned char)(i * 31 + k);
    t[i] = (ferry_tensor){src[i], {FERRY_DEVICE_CUDA, 0}, 1, {FERRY_DTYPE_UINT, 8, 1}, &shapes[i], NULL, 0};
  }
}

/* Options for device 0; gather_max_bytes 0 keeps the default threshold. */
static ferry_transfer_options d2h_options(uint64_t gather_max_bytes) {
  ferry_transfer_options o;
  ferry_transfer_options_init(&o);
  o.device = 0;
  o.gather_max_bytes = gather_max_bytes;
  return o;
}

static void check_exact(ferry_transfer *tr) {
  const ferry_tensor *o = ferry_transfer_outputs(tr);
  for (int i = 0; i < N; i++) {
    ASSERT_EQ(o[i].device.device_type, FERRY_DEVICE_CPU);
    ASSERT(memcmp(o[i].data, src[i], (size_t)shapes[i]) == 0);
  }
}

TEST(fake_d2h_is_exact_and_returns_slab) {
  fake_driver_use();
  ferry_tensor t[N];
  make_batch(t);
  ferry_transfer_options o = d2h_options(2000); /* tensor 0 (3000 bytes) is DMA'd, the rest gathered */
  ferry_transfer *tr = NULL;
  ASSERT_OK(ferry_transfer_d2h(t, N, &o, &tr));
  ASSERT_OK(ferry_transfer_wait(tr));
  check_exact(tr);
  ferry_pool_stats s;
  ferry_pool_stats_get(&s);
  ASSERT(s.bytes_in_use > 0);
  ferry_transfer_release(tr);
  ferry_pool_stats_get(&s);
  ASSERT_EQ(s.bytes_in_use, 0);
  ASSERT_EQ(fake_live_devmem, 0); /* gather staging freed */
}

TEST(fault_at_every_d2h_call_is_clean) {
  static const char *calls[] = {"cuCtxPushCurrent", "cuStreamCreate", "cuEventCreate", "cuEventRecord",
                                "cuStreamWaitEvent", "cuMemHostRegister", "cuMemAllocFromPoolAsync",
                                "cuMemPoolCreate", "cuModuleLoadData", "cuModuleGetFunction", "cuMemcpyHtoDAsync",
                                "cuLaunchKernel", "cuMemcpyAsync", "cuMemFreeAsync", "cuMemcpyBatchAsync_v13"};
  fake_driver_use();
  ferry_tensor t[N];
  make_batch(t);
  /* Two large tensors so the batch API is used as well as the gather kernel. */
  shapes[0] = 3000;
  shapes[1] = 3000;
  ferry_transfer_options o = d2h_options(2000);
  for (size_t c = 0; c < sizeof calls / sizeof calls[0]; c++) {
    ferry_pool_stats before;
    ferry_pool_stats_get(&before);
    ferry__fault_arm(calls[c], 1, CUDA_ERROR_LAUNCH_FAILED);
    ferry_transfer *tr = NULL;
    ferry_status st = ferry_transfer_d2h(t, N, &o, &tr);
    int hits = ferry__fault_hits();
    ferry__fault_disarm();
    if (hits == 0) { /* this call was cached from an earlier round (stream, module, pool) */
      ASSERT_OK(st);
      ferry_transfer_release(tr);
      continue;
    }
    if (st == FERRY_OK) FAIL_AT("a failing %s was not reported", calls[c]);
    ASSERT(tr == NULL);
    ASSERT_STR_CONTAINS(ferry_last_error()->call, calls[c]);
    ASSERT_STR_CONTAINS(ferry_last_error_message(), calls[c]);
    ASSERT_EQ(ferry_last_error()->cu_result, CUDA_ERROR_LAUNCH_FAILED);
    ferry_pool_stats after;
    ferry_pool_stats_get(&after);
    if (after.bytes_in_use != before.bytes_in_use)
      FAIL_AT("after a failing %s the pool holds %llu bytes in use (before: %llu)", calls[c],
              (unsigned long long)after.bytes_in_use, (unsigned long long)before.bytes_in_use);
    if (fake_live_devmem != 0) FAIL_AT("after a failing %s, %d device allocations leaked", calls[c], fake_live_devmem);
    /* The pool and the stream stay usable: the next transfer is exact. */
    ASSERT_OK(ferry_transfer_d2h(t, N, &o, &tr));
    ASSERT_OK(ferry_transfer_wait(tr));
    check_exact(tr);
    ferry_transfer_release(tr);
  }
  ferry_pool_stats s;
  ferry_pool_stats_get(&s);
  ASSERT_EQ(s.bytes_in_use, 0);
}

TEST(pool_reuses_and_trims) {
  fake_driver_use();
  ferry_tensor t[N];
  make_batch(t);
  ferry_transfer_options o = d2h_options(0);
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
