/* require.h — the GPU test programs' fatal checks: a failure of the harness itself (allocation, kernel load, a
 * setup call), not of what is tested, prints file, line, the call and the error, and exits with status 2; and
 * SKIP_NO_GPU, which skips a test where there is no GPU unless the run demands one. */
#ifndef FERRY_GPU_REQUIRE_H
#define FERRY_GPU_REQUIRE_H

#include "internal.h"
#include "test.h"

#include <stdio.h>
#include <stdlib.h>

#define REQUIRE_CU(x)                                                                                        \
  do {                                                                                                       \
    CUresult r_ = (x);                                                                                       \
    if (r_ != CUDA_SUCCESS) {                                                                                \
      printf("FATAL %s:%d: %s failed: %s\n", __FILE__, __LINE__, #x, ferry__cu_name(r_));                   \
      exit(2);                                                                                               \
    }                                                                                                        \
  } while (0)
#define REQUIRE_OK(x)                                                                                        \
  do {                                                                                                       \
    ferry_status s_ = (x);                                                                                   \
    if (s_ != FERRY_OK) {                                                                                    \
      printf("FATAL %s:%d: %s failed: %s: %s\n", __FILE__, __LINE__, #x, ferry_status_name(s_),              \
             ferry_last_error_message());                                                                   \
      exit(2);                                                                                               \
    }                                                                                                        \
  } while (0)

/* No GPU here: the test skips, saying why; where FERRY_REQUIRE_GPU=1 (tools/h200_suite.sh sets it on the GPU
 * machine) it fails instead, so that a broken driver cannot pass for a skipped suite. */
#define SKIP_NO_GPU(...)                                                                                     \
  do {                                                                                                       \
    const char *req_ = getenv("FERRY_REQUIRE_GPU");                                                          \
    if (req_ && !strcmp(req_, "1")) {                                                                        \
      printf("FATAL %s:%d: FERRY_REQUIRE_GPU=1 and ", __FILE__, __LINE__);                                   \
      printf(__VA_ARGS__);                                                                                   \
      printf("\n");                                                                                          \
      exit(2);                                                                                               \
    }                                                                                                        \
    SKIP(__VA_ARGS__);                                                                                       \
  } while (0)

#endif
