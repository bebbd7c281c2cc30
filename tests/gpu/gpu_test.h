/* gpu_test.h — the GPU tests' harness (run on the H200 as `build/ferry_test_gpu`): EXPECT records a failure
 * with file, line, the message and ferry's last error, and the test goes on, so one run reports everything (the
 * test's process fails at its end). Each test is a TEST(name) listed in test_list_gpu.h and run by the common
 * runner; helpers here allocate device memory and launch the test kernel (gpu_test.c). */
#ifndef FERRY_GPU_TEST_H
#define FERRY_GPU_TEST_H

#include "internal.h"
#include "require.h"
#include "test.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern atomic_int gpu_failures;
extern int gpu_dev; /* the device every test runs on (gpu_setup: cuda:0 or LOCAL_RANK) */

#define EXPECT(cond, ...)                                                                   \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      atomic_fetch_add(&gpu_failures, 1);                                                   \
      printf("FAIL %s:%d: ", __FILE__, __LINE__);                                           \
      printf(__VA_ARGS__);                                                                  \
      printf(" (last error: %s)\n", ferry_last_error_message());                           \
    }                                                                                       \
  } while (0)

/* Device memory from ferry's pool, ready when this returns (context of `dev` current). */
CUdeviceptr gpu_alloc(int dev, size_t bytes);
void gpu_free(CUdeviceptr p);

/* Launches ferry_test_slow_fill on `stream` (context current): waits `spin_ms`, then fills n bytes with value. */
void gpu_slow_fill(CUstream stream, CUdeviceptr dst, size_t n, unsigned value, double spin_ms);

/* Options for `dev` with the given flags. */
ferry_transfer_options gpu_options(int dev, uint32_t flags);

#endif
