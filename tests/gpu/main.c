/* main.c — runs ferry's GPU tests (build/ferry_test_gpu, on the H200) and prints "N passed, N failed".
 * Usage: ferry_test_gpu [--help] [--list] [TEST...]; the device is cuda:0 or LOCAL_RANK. */
#include "gpu_test.h"

atomic_int gpu_failures;

extern const unsigned char ferry_test_kernels_fatbin[];
extern const size_t ferry_test_kernels_fatbin_size;
static CUfunction slow_fill_fn;

CUdeviceptr gpu_alloc(int dev, size_t bytes) {
  CUdeviceptr p;
  REQUIRE_OK(ferry__devmem_alloc(dev, bytes, NULL, &p));
  REQUIRE_CU(ferry__drv.cuStreamSynchronize(NULL));
  return p;
}

void gpu_free(CUdeviceptr p) {
  REQUIRE_CU(ferry__drv.cuMemFreeAsync(p, NULL));
  REQUIRE_CU(ferry__drv.cuStreamSynchronize(NULL));
}

void gpu_slow_fill(CUstream stream, CUdeviceptr dst, size_t n, unsigned value, double spin_ms) {
  unsigned long long count = n, spin_ns = (unsigned long long)(spin_ms * 1e6);
  void *params[] = {&dst, &count, &value, &spin_ns};
  REQUIRE_CU(ferry__drv.cuLaunchKernel(slow_fill_fn, 264, 1, 1, 256, 1, 1, 0, stream, params, NULL));
}

ferry_transfer_options gpu_options(int dev, uint32_t flags) {
  ferry_transfer_options o;
  ferry_transfer_options_init(&o);
  o.device = dev;
  o.flags = flags;
  return o;
}

typedef struct gpu_test { const char *name; void (*fn)(int dev); } gpu_test;
static const gpu_test tests[] = {
    {"round_trips", test_round_trips},
    {"mixed_dtypes_and_pass_through", test_mixed_dtypes_and_pass_through},
    {"producer_event_is_waited_for", test_producer_event_is_waited_for},
    {"producer_stream_is_waited_for", test_producer_stream_is_waited_for},
    {"pool_never_reuses_under_a_running_copy", test_pool_never_reuses_under_a_running_copy},
    {"sixteen_threads_round_trip", test_sixteen_threads_round_trip},
};

int main(int argc, char **argv) {
  size_t n = sizeof tests / sizeof *tests;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help")) {
      puts("usage: ferry_test_gpu [--list] [TEST...]\nRuns ferry's GPU tests on cuda:0 (LOCAL_RANK honoured); needs "
           "a GPU. Exits 1 when any check fails, 2 when the harness itself cannot run.");
      return 0;
    }
    if (!strcmp(argv[i], "--list")) {
      for (size_t k = 0; k < n; k++) puts(tests[k].name);
      return 0;
    }
  }
  if (ferry_init() != FERRY_OK) {
    printf("no GPU: %s\n", ferry_last_error_message());
    return 2;
  }
  int dev;
  REQUIRE_OK(ferry_device_resolve(-1, &dev));
  REQUIRE_OK(ferry__ctx_enter(dev));
  CUmodule m;
  REQUIRE_CU(ferry__drv.cuModuleLoadData(&m, ferry_test_kernels_fatbin));
  REQUIRE_CU(ferry__drv.cuModuleGetFunction(&slow_fill_fn, m, "ferry_test_slow_fill"));
  int passed = 0, failed = 0;
  for (size_t k = 0; k < n; k++) {
    int selected = argc == 1;
    for (int i = 1; i < argc; i++) selected |= !strcmp(argv[i], tests[k].name);
    if (!selected) continue;
    int before = atomic_load(&gpu_failures);
    printf("-- %s\n", tests[k].name);
    fflush(stdout);
    tests[k].fn(dev);
    int ok = atomic_load(&gpu_failures) == before;
    printf("%s %s\n", ok ? "ok  " : "FAIL", tests[k].name);
    ok ? passed++ : failed++;
  }
  ferry_pool_stats s;
  ferry_pool_stats_get(&s);
  printf("pool after the tests: pinned %.1f MiB in %llu region(s), in use %.1f MiB, hits %llu, misses %llu\n",
         (double)s.bytes_pinned / (1 << 20), (unsigned long long)s.regions, (double)s.bytes_in_use / (1 << 20),
         (unsigned long long)s.hits, (unsigned long long)s.misses);
  if (s.bytes_in_use != 0) {
    printf("FAIL: the pool still has %llu bytes in use after every ticket and slab was released\n",
           (unsigned long long)s.bytes_in_use);
    failed++;
  }
  ferry__ctx_leave();
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
