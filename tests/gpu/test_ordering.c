/* test_ordering.c — a transfer must not read its inputs before their producer has written them, and the pool
 * must never hand out memory a copy may still write.
 *
 * The producer is ferry_test_slow_fill: it waits 50-100 ms on the GPU and then writes a new byte pattern, so a
 * transfer that did not wait for it reads the old pattern. Each ordering test has a control run with the
 * ordering deliberately missing, which must see the old bytes: that proves the test can fail. */
#include "gpu_test.h"

#define SIZE ((size_t)32 << 20)

/* Counts bytes of `p` that differ from `value`. */
static size_t count_not(const unsigned char *p, size_t n, unsigned char value) {
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) bad += p[i] != value;
  return bad;
}

/* Transfers `src` with `o` and returns how many output bytes differ from `value`. */
static size_t d2h_mismatches(CUdeviceptr src, const ferry_transfer_options *o, unsigned char value) {
  int64_t shape = (int64_t)SIZE;
  ferry_tensor t = {(void *)(uintptr_t)src, {FERRY_DEVICE_CUDA, o->device}, 1, {FERRY_DTYPE_UINT, 8, 1}, &shape,
                    NULL, 0};
  ferry_transfer *tr = NULL;
  ferry_status st = ferry_transfer_d2h(&t, 1, o, &tr);
  EXPECT(st == FERRY_OK, "d2h: %s", ferry_status_name(st));
  size_t bad = st == FERRY_OK ? count_not(ferry_transfer_outputs(tr)[0].data, SIZE, value) : SIZE;
  ferry_transfer_release(tr);
  return bad;
}

TEST(producer_event_is_waited_for) {
  int dev = gpu_dev;
  CUdeviceptr src = gpu_alloc(dev, SIZE);
  CUstream producer;
  CUevent ready;
  REQUIRE_CU(ferry__drv.cuStreamCreate(&producer, CU_STREAM_NON_BLOCKING));
  REQUIRE_CU(ferry__drv.cuEventCreate(&ready, CU_EVENT_DISABLE_TIMING));
  gpu_slow_fill(producer, src, SIZE, 0x11, 0);
  REQUIRE_CU(ferry__drv.cuStreamSynchronize(producer));

  /* The producer writes 0xAB after 50 ms; the transfer is ordered after its event. */
  gpu_slow_fill(producer, src, SIZE, 0xAB, 50);
  REQUIRE_CU(ferry__drv.cuEventRecord(ready, producer));
  ferry_transfer_options o = gpu_options(dev, FERRY_TRANSFER_BLOCKING);
  o.producer_event = ready;
  size_t bad = d2h_mismatches(src, &o, 0xAB);
  EXPECT(bad == 0, "ordered after producer_event: %zu of %zu bytes were read before the producer wrote them", bad,
         SIZE);

  /* Control: ordered after an idle stream instead, the copy runs at once and must see the old 0xAB. */
  CUstream idle;
  REQUIRE_CU(ferry__drv.cuStreamCreate(&idle, CU_STREAM_NON_BLOCKING));
  gpu_slow_fill(producer, src, SIZE, 0xCD, 50);
  ferry_transfer_options unordered = gpu_options(dev, FERRY_TRANSFER_BLOCKING);
  unordered.producer_stream = idle;
  size_t old = SIZE - d2h_mismatches(src, &unordered, 0xAB); /* bytes still holding the previous pattern */
  REQUIRE_CU(ferry__drv.cuStreamSynchronize(producer));
  EXPECT(old > 0, "control: without ordering the copy still saw the new bytes, so this test cannot detect a "
         "missing wait (GPU too fast?)");
  printf("   producer_event: %zu bytes early (want 0); control without ordering read %zu old bytes (want > 0)\n",
         bad, old);
  REQUIRE_CU(ferry__drv.cuStreamDestroy(idle));
  REQUIRE_CU(ferry__drv.cuEventDestroy(ready));
  REQUIRE_CU(ferry__drv.cuStreamDestroy(producer));
  gpu_free(src);
}

TEST(producer_stream_is_waited_for) {
  int dev = gpu_dev;
  CUdeviceptr src = gpu_alloc(dev, SIZE);
  CUstream producer;
  REQUIRE_CU(ferry__drv.cuStreamCreate(&producer, CU_STREAM_NON_BLOCKING));
  /* The caller's current stream given as producer_stream: ferry records an event on it and waits. */
  gpu_slow_fill(producer, src, SIZE, 0x5A, 50);
  ferry_transfer_options o = gpu_options(dev, FERRY_TRANSFER_BLOCKING);
  o.producer_stream = producer;
  size_t bad = d2h_mismatches(src, &o, 0x5A);
  EXPECT(bad == 0, "ordered after producer_stream: %zu bytes read early", bad);
  /* No producer given: the legacy default stream is the producer (SPDL's "current stream" of a plain thread). */
  gpu_slow_fill(CU_STREAM_LEGACY, src, SIZE, 0x3C, 50);
  ferry_transfer_options d = gpu_options(dev, FERRY_TRANSFER_BLOCKING);
  size_t bad_legacy = d2h_mismatches(src, &d, 0x3C);
  EXPECT(bad_legacy == 0, "ordered after the legacy default stream: %zu bytes read early", bad_legacy);
  printf("   producer_stream: %zu bytes early; default (legacy stream) producer: %zu bytes early (want 0, 0)\n", bad,
         bad_legacy);
  REQUIRE_CU(ferry__drv.cuStreamDestroy(producer));
  gpu_free(src);
}

/* A released ticket whose copy has not run yet: its slab must not be handed to the next transfer. */
TEST(pool_never_reuses_under_a_running_copy) {
  int dev = gpu_dev;
  CUdeviceptr src = gpu_alloc(dev, SIZE), gate_buf = gpu_alloc(dev, 4096);
  CUstream producer;
  CUevent gate;
  REQUIRE_CU(ferry__drv.cuStreamCreate(&producer, CU_STREAM_NON_BLOCKING));
  REQUIRE_CU(ferry__drv.cuEventCreate(&gate, CU_EVENT_DISABLE_TIMING));
  gpu_slow_fill(producer, src, SIZE, 0x77, 0);
  REQUIRE_CU(ferry__drv.cuStreamSynchronize(producer));
  int64_t shape = (int64_t)SIZE;
  ferry_tensor t = {(void *)(uintptr_t)src, {FERRY_DEVICE_CUDA, dev}, 1, {FERRY_DTYPE_UINT, 8, 1}, &shape, NULL, 0};

  /* Copy A is held back 100 ms behind the gate, and its ticket is released at once. */
  gpu_slow_fill(producer, gate_buf, 4096, 1, 100);
  REQUIRE_CU(ferry__drv.cuEventRecord(gate, producer));
  ferry_transfer_options gated = gpu_options(dev, 0);
  gated.producer_event = gate;
  ferry_transfer *a = NULL, *b = NULL, *c = NULL;
  REQUIRE_OK(ferry_transfer_d2h(&t, 1, &gated, &a));
  char *a_lo = ferry_slab_data(ferry_transfer_slab(a)), *a_hi = a_lo + ferry_slab_size(ferry_transfer_slab(a));
  EXPECT(ferry_transfer_query(a) == FERRY_NOT_READY, "copy A finished although its gate has not opened");
  ferry_transfer_release(a);

  /* Copy B now: its slab must not overlap A's, which A's copy will still write. B is queued on the same copy
   * stream behind A, so the counters are read before waiting for B: once B is done, so is A, and the stats
   * (which collect finished slabs) rightly count A's slab free again. */
  ferry_transfer_options queued = gpu_options(dev, 0);
  REQUIRE_OK(ferry_transfer_d2h(&t, 1, &queued, &b));
  char *b_lo = ferry_slab_data(ferry_transfer_slab(b)), *b_hi = b_lo + ferry_slab_size(ferry_transfer_slab(b));
  int overlap = b_lo < a_hi && a_lo < b_hi;
  EXPECT(!overlap, "copy B was given memory [%p, %p) inside copy A's pending slab [%p, %p)", (void *)b_lo,
         (void *)b_hi, (void *)a_lo, (void *)a_hi);
  ferry_pool_stats s;
  ferry_pool_stats_get(&s);
  EXPECT(s.bytes_in_use >= 2 * SIZE, "the pool counts %llu bytes in use while A is pending and B is held",
         (unsigned long long)s.bytes_in_use);
  REQUIRE_OK(ferry_transfer_wait(b));
  EXPECT(count_not(ferry_transfer_outputs(b)[0].data, SIZE, 0x77) == 0, "copy B's output is wrong");
  ferry_transfer_release(b);

  /* Once the gate has opened and A's copy is done, its memory is reused. */
  REQUIRE_CU(ferry__drv.cuStreamSynchronize(producer));
  ferry_transfer_options now = gpu_options(dev, FERRY_TRANSFER_BLOCKING);
  REQUIRE_OK(ferry_transfer_d2h(&t, 1, &now, &c));
  ferry_transfer_release(c);
  ferry_pool_stats_get(&s);
  EXPECT(s.bytes_in_use == 0, "%llu bytes still in use after every ticket was released",
         (unsigned long long)s.bytes_in_use);
  printf("   pending slab [%p, +%zu MiB) not reused while its copy waited (B at %p); in use after: %llu bytes\n",
         (void *)a_lo, (size_t)(a_hi - a_lo) >> 20, (void *)b_lo, (unsigned long long)s.bytes_in_use);
  REQUIRE_CU(ferry__drv.cuEventDestroy(gate));
  REQUIRE_CU(ferry__drv.cuStreamDestroy(producer));
  gpu_free(gate_buf);
  gpu_free(src);
}
