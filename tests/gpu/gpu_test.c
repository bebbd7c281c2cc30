/* gpu_test.c — the harness of ferry's GPU transfer tests (build/ferry_test_gpu, tests/gpu/test_list_gpu.h): the
 * setup each test's process runs (the driver, the device, the primary context, the test kernel), the checks after
 * each test (no EXPECT failed, the pool holds nothing in use), and the helpers of gpu_test.h. */
#include "gpu_test.h"

atomic_int gpu_failures;
int gpu_dev;

extern const unsigned char ferry_test_kernels_fatbin[];
extern const size_t ferry_test_kernels_fatbin_size;
static CUfunction slow_fill_fn;

void gpu_setup(void) {
  ferry_status st = ferry_init();
  if (st == FERRY_NO_DRIVER || st == FERRY_NO_DEVICE) SKIP_NO_GPU("no GPU: %s", ferry_last_error_message());
  REQUIRE_OK(st);
  REQUIRE_OK(ferry_device_resolve(-1, &gpu_dev));
  REQUIRE_OK(ferry__ctx_enter(gpu_dev));
  if (!slow_fill_fn) { /* once per process (--no-fork runs every test in one) */
    CUmodule m;
    REQUIRE_CU(ferry__drv.cuModuleLoadData(&m, ferry_test_kernels_fatbin));
    REQUIRE_CU(ferry__drv.cuModuleGetFunction(&slow_fill_fn, m, "ferry_test_slow_fill"));
  }
}

void gpu_teardown(void) {
  ferry_pool_stats s;
  ferry_pool_stats_get(&s);
  printf("  pool: pinned %.1f MiB in %llu region(s), in use %.1f MiB, hits %llu, misses %llu\n",
         (double)s.bytes_pinned / (1 << 20), (unsigned long long)s.regions, (double)s.bytes_in_use / (1 << 20),
         (unsigned long long)s.hits, (unsigned long long)s.misses);
  EXPECT(s.bytes_in_use == 0, "the pool still has %llu bytes in use after every ticket and slab was released",
         (unsigned long long)s.bytes_in_use);
  ferry__ctx_leave();
  if (atomic_load(&gpu_failures)) exit(1);
}

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
