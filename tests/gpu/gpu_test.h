/* gpu_test.h — the GPU tests' harness (run on the H200 as `build/ferry_test_gpu`): EXPECT records a failure
 * with file, line, the message and ferry's last error, and the test goes on, so one run reports everything.
 * Each test is a function registered in main.c; helpers here allocate device memory and launch the test kernel. */
#ifndef FERRY_GPU_TEST_H
#define FERRY_GPU_TEST_H

#include "internal.h"
#include "require.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern atomic_int gpu_failures;

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

/* The tests. */
void test_round_trips(int dev);
void test_mixed_dtypes_and_pass_through(int dev);
void test_producer_event_is_waited_for(int dev);
void test_producer_stream_is_waited_for(int dev);
void test_pool_never_reuses_under_a_running_copy(int dev);
void test_sixteen_threads_round_trip(int dev);

#endif
