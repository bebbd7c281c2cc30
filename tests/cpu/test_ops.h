/* test_ops.h — helpers shared by the operator runtime's CPU tests (test_ops_*.c): matrices described on fake
 * device addresses (nothing is dereferenced before a launch, and the fake driver records launches instead of
 * running them), a private cache directory per test, and the NVRTC requirement. */
#ifndef FERRY_TEST_OPS_H
#define FERRY_TEST_OPS_H

#include "fake_driver.h"
#include "ops.h"
#include "test.h"

#include <unistd.h>

/* A rows×cols matrix (batch > 0 makes it rank 3) of `type` at fake address `addr`, row- or column-major with
 * leading dimension `ld` (0: compact). The shape and strides live in `m`. */
typedef struct test_matrix {
  ferry_tensor t;
  int64_t shape[3], strides[3];
} test_matrix;

static inline ferry_dtype test_dtype(int type) {
  switch (type) {
  case FERRY_SCALAR_F16: return (ferry_dtype){FERRY_DTYPE_FLOAT, 16, 1};
  case FERRY_SCALAR_BF16: return (ferry_dtype){FERRY_DTYPE_BFLOAT, 16, 1};
  case FERRY_SCALAR_E4M3: return (ferry_dtype){10, 8, 1}; /* DLPack's float8_e4m3fn */
  case FERRY_SCALAR_E5M2: return (ferry_dtype){12, 8, 1}; /* float8_e5m2 */
  case FERRY_SCALAR_I8: return (ferry_dtype){FERRY_DTYPE_INT, 8, 1};
  case FERRY_SCALAR_I32: return (ferry_dtype){FERRY_DTYPE_INT, 32, 1};
  default: return (ferry_dtype){FERRY_DTYPE_FLOAT, 32, 1};
  }
}

static inline void test_matrix_make(test_matrix *m, uintptr_t addr, int type, int64_t batch, int64_t rows,
                                    int64_t cols, int col_major, int64_t ld) {
  int b = batch > 0;
  if (!ld) ld = col_major ? rows : cols;
  memset(m, 0, sizeof *m);
  if (b) {
    m->shape[0] = batch;
    m->strides[0] = ld * (col_major ? cols : rows);
  }
  m->shape[b] = rows;
  m->shape[b + 1] = cols;
  m->strides[b] = col_major ? 1 : ld;
  m->strides[b + 1] = col_major ? ld : 1;
  m->t = (ferry_tensor){(void *)addr, {FERRY_DEVICE_CUDA, 0}, 2 + b, test_dtype(type), m->shape, m->strides, 0};
}

/* Fills `args` for an m×n×k GEMM of one type, all row-major and compact, at aligned fake addresses 4 GiB apart
 * (out may not overlap an input). */
static inline void test_args(ferry_gemm_args *args, int in_type, int out_type, int64_t m, int64_t n, int64_t k) {
  test_matrix a, b, c;
  test_matrix_make(&a, (uintptr_t)1 << 32, in_type, 0, m, k, 0, 0);
  test_matrix_make(&b, (uintptr_t)2 << 32, in_type, 0, k, n, 0, 0);
  test_matrix_make(&c, (uintptr_t)3 << 32, out_type, 0, m, n, 0, 0);
  ASSERT_OK(ferry_gemm_args_init(args, &a.t, &b.t, &c.t, FERRY_SCALAR_F32));
}

/* 1 when NVRTC is here. Without it, the compile tests end as skipped — unless FERRY_REQUIRE_NVRTC=1 (set by
 * ctest when the build found the toolkit's NVRTC), where its absence is a failure. */
static inline int test_have_nvrtc(void) {
  if (ferry__rtc_load() == FERRY_OK) return 1;
  const char *req = getenv("FERRY_REQUIRE_NVRTC");
  if (req && !strcmp(req, "1")) FAIL_AT("NVRTC is required here but could not be loaded: %s", ferry_last_error_message());
  SKIP("NVRTC is absent (%s)", ferry_last_error_message());
  return 0;
}

/* A fresh cache home for this test process: $TMPDIR/ferry-test-<pid>-<tag>, returned in `dir` (the ferry cache
 * itself is dir/ferry). */
static inline void test_cache_home(char *dir, size_t size, const char *tag) {
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, size, "%s/ferry-test-%ld-%s", tmp && *tmp ? tmp : "/tmp", (long)getpid(), tag);
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  ASSERT(system(cmd) == 0);
  ASSERT(setenv("XDG_CACHE_HOME", dir, 1) == 0);
  unsetenv("FERRY_DISK_CACHE");
}

static inline void test_rm_rf(const char *dir) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "chmod -R u+rwx '%s' 2>/dev/null; rm -rf '%s'", dir, dir);
  (void)!system(cmd);
}

/* A kernel small enough to compile in tens of milliseconds, for tests about the machinery, not the GEMM. */
static inline const ferry_op *tiny_op(const char *name) {
  ferry_op_desc d;
  ferry_op_desc_init(&d);
  d.info.name = name;
  d.info.tile_m = 32;
  d.info.tile_n = 16;
  d.info.threads = 64;
  d.source = "extern \"C\" __global__ void tiny(ferry_gemm_params p) {\n"
             "  if (threadIdx.x == 0 && p.m > 0) static_cast<float *>(p.out)[0] = p.alpha;\n"
             "}\n";
  d.entry = "tiny";
  const ferry_op *op = NULL;
  ASSERT_OK(ferry_op_register(&d, &op));
  return op;
}

#endif
