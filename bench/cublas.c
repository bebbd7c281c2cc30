/* cublas.c — dlopen of cuBLAS for the benchmarks (see cublas.h). */
#include "cublas.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *open_library(char *why, int why_size) {
  const char *env = getenv("FERRY_CUBLAS");
  const char *candidates[] = {env, "libcublas.so.13", "libcublas.so.12", "/usr/local/cuda/lib64/libcublas.so.13",
                              "/usr/local/cuda/lib64/libcublas.so.12", "/usr/local/cuda/lib64/libcublas.so"};
  for (size_t i = 0; i < sizeof candidates / sizeof candidates[0]; i++) {
    if (!candidates[i] || !*candidates[i]) continue;
    void *lib = dlopen(candidates[i], RTLD_NOW | RTLD_LOCAL);
    if (lib) return lib;
  }
  snprintf(why, (size_t)why_size, "cuBLAS could not be opened (%s); set FERRY_CUBLAS to libcublas.so's path",
           dlerror());
  return NULL;
}

int bench_cublas_open(bench_cublas *cb, char *why, int why_size) {
  memset(cb, 0, sizeof *cb);
  cb->lib = open_library(why, why_size);
  if (!cb->lib) return -1;
  struct { void **slot; const char *name; } syms[] = {
      {(void **)&cb->create, "cublasCreate_v2"},        {(void **)&cb->destroy, "cublasDestroy_v2"},
      {(void **)&cb->get_version, "cublasGetVersion_v2"}, {(void **)&cb->set_stream, "cublasSetStream_v2"},
      {(void **)&cb->sgemm, "cublasSgemm_v2"},           {(void **)&cb->gemm_ex, "cublasGemmEx"}};
  for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
    *syms[i].slot = dlsym(cb->lib, syms[i].name);
    if (!*syms[i].slot) {
      snprintf(why, (size_t)why_size, "cuBLAS lacks %s", syms[i].name);
      return -1;
    }
  }
  int rc = cb->create(&cb->handle);
  if (rc != 0) {
    snprintf(why, (size_t)why_size, "cublasCreate_v2 failed with status %d (no current CUDA context?)", rc);
    cb->handle = NULL;
    return -1;
  }
  cb->get_version(cb->handle, &cb->version);
  return 0;
}

void bench_cublas_close(bench_cublas *cb) {
  if (cb->handle) cb->destroy(cb->handle);
  cb->handle = NULL;
}

/* ---- cuBLASLt -------------------------------------------------------------------------------------------- */

static void *open_lt(char *why, int why_size) {
  const char *candidates[] = {"libcublasLt.so.13", "libcublasLt.so.12", "/usr/local/cuda/lib64/libcublasLt.so.13",
                              "/usr/local/cuda/lib64/libcublasLt.so.12", "/usr/local/cuda/lib64/libcublasLt.so"};
  for (size_t i = 0; i < sizeof candidates / sizeof candidates[0]; i++) {
    void *lib = dlopen(candidates[i], RTLD_NOW | RTLD_LOCAL);
    if (lib) return lib;
  }
  snprintf(why, (size_t)why_size, "cuBLASLt could not be opened (%s)", dlerror());
  return NULL;
}

/* cublasLtMatmulHeuristicResult_t, as cublasLt.h lays it out. */
typedef struct lt_heuristic {
  uint64_t algo[8];
  size_t workspace_bytes;
  int state;
  float waves;
  int reserved[4];
} lt_heuristic;

enum { LT_DESC_SCALE_TYPE = 1, LT_DESC_TRANSA = 3, LT_DESC_TRANSB = 4, LT_DESC_A_SCALE = 17, LT_DESC_B_SCALE = 18 };
enum { LT_PREF_MAX_WORKSPACE = 1 };

#define LT_TRY(call, what)                                                                                          \
  do {                                                                                                             \
    int rc_ = (call);                                                                                              \
    if (rc_ != 0) {                                                                                                \
      snprintf(why, (size_t)why_size, "%s failed with status %d", what, rc_);                                    \
      bench_cublaslt_close(lt);                                                                                    \
      return -1;                                                                                                   \
    }                                                                                                              \
  } while (0)

int bench_cublaslt_fp8_open(bench_cublaslt *lt, int m, int n, int k, int a_type, int b_type, int d_type,
                            const void *scale_a, const void *scale_b, size_t workspace_bytes, char *why,
                            int why_size) {
  memset(lt, 0, sizeof *lt);
  lt->lib = open_lt(why, why_size);
  if (!lt->lib) return -1;
  int (*create)(void **);
  int (*desc_create)(void **, int, int);
  int (*desc_set)(void *, int, const void *, size_t);
  int (*layout_create)(void **, int, uint64_t, uint64_t, int64_t);
  int (*pref_create)(void **);
  int (*pref_set)(void *, int, const void *, size_t);
  int (*heuristic)(void *, void *, void *, void *, void *, void *, void *, int, lt_heuristic *, int *);
  struct { void **slot; const char *name; } syms[] = {
      {(void **)&create, "cublasLtCreate"},
      {(void **)&lt->destroy, "cublasLtDestroy"},
      {(void **)&desc_create, "cublasLtMatmulDescCreate"},
      {(void **)&lt->desc_destroy, "cublasLtMatmulDescDestroy"},
      {(void **)&desc_set, "cublasLtMatmulDescSetAttribute"},
      {(void **)&layout_create, "cublasLtMatrixLayoutCreate"},
      {(void **)&lt->layout_destroy, "cublasLtMatrixLayoutDestroy"},
      {(void **)&pref_create, "cublasLtMatmulPreferenceCreate"},
      {(void **)&lt->pref_destroy, "cublasLtMatmulPreferenceDestroy"},
      {(void **)&pref_set, "cublasLtMatmulPreferenceSetAttribute"},
      {(void **)&heuristic, "cublasLtMatmulAlgoGetHeuristic"},
      {(void **)&lt->matmul, "cublasLtMatmul"}};
  for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
    *syms[i].slot = dlsym(lt->lib, syms[i].name);
    if (!*syms[i].slot) {
      snprintf(why, (size_t)why_size, "cuBLASLt lacks %s", syms[i].name);
      lt->destroy = NULL;
      return -1;
    }
  }
  LT_TRY(create(&lt->handle), "cublasLtCreate");
  const int op_t = 1, op_n = 0, scale_type = BENCH_CUDA_R_32F;
  LT_TRY(desc_create(&lt->desc, BENCH_CUBLAS_COMPUTE_32F, scale_type), "cublasLtMatmulDescCreate");
  LT_TRY(desc_set(lt->desc, LT_DESC_TRANSA, &op_t, sizeof op_t), "setting TRANSA");
  LT_TRY(desc_set(lt->desc, LT_DESC_TRANSB, &op_n, sizeof op_n), "setting TRANSB");
  LT_TRY(desc_set(lt->desc, LT_DESC_A_SCALE, &scale_a, sizeof scale_a), "setting A_SCALE_POINTER");
  LT_TRY(desc_set(lt->desc, LT_DESC_B_SCALE, &scale_b, sizeof scale_b), "setting B_SCALE_POINTER");
  LT_TRY(layout_create(&lt->a_layout, a_type, (uint64_t)k, (uint64_t)n, k), "cublasLtMatrixLayoutCreate (A)");
  LT_TRY(layout_create(&lt->b_layout, b_type, (uint64_t)k, (uint64_t)m, k), "cublasLtMatrixLayoutCreate (B)");
  LT_TRY(layout_create(&lt->d_layout, d_type, (uint64_t)n, (uint64_t)m, n), "cublasLtMatrixLayoutCreate (D)");
  LT_TRY(pref_create(&lt->pref), "cublasLtMatmulPreferenceCreate");
  LT_TRY(pref_set(lt->pref, LT_PREF_MAX_WORKSPACE, &workspace_bytes, sizeof workspace_bytes),
         "setting the workspace limit");
  lt_heuristic h[8];
  int found = 0;
  memset(h, 0, sizeof h);
  LT_TRY(heuristic(lt->handle, lt->desc, lt->a_layout, lt->b_layout, lt->d_layout, lt->d_layout, lt->pref, 8, h,
                   &found),
         "cublasLtMatmulAlgoGetHeuristic");
  for (int i = 0; i < found && i < 8; i++) {
    if (h[i].state != 0) continue;
    memcpy(lt->algos[lt->n_algos], h[i].algo, sizeof lt->algos[0]);
    lt->n_algos++;
  }
  lt->workspace_bytes = workspace_bytes;
  if (lt->n_algos == 0) {
    snprintf(why, (size_t)why_size, "cuBLASLt has no FP8 kernel for %d×%d×%d here", m, n, k);
    bench_cublaslt_close(lt);
    return -1;
  }
  return 0;
}

int bench_cublaslt_run(bench_cublaslt *lt, const void *a, const void *b, void *d, void *workspace, void *stream) {
  const float one = 1.0f, zero = 0.0f;
  for (;;) {
    int i = lt->chosen;
    int rc = lt->matmul(lt->handle, lt->desc, &one, a, lt->a_layout, b, lt->b_layout, &zero, d, lt->d_layout, d,
                        lt->d_layout, lt->algos[i], workspace, lt->workspace_bytes, stream);
    if (rc != BENCH_CUBLAS_STATUS_NOT_SUPPORTED || lt->ran || i + 1 >= lt->n_algos) {
      lt->ran |= rc == 0;
      return rc;
    }
    lt->chosen = i + 1;
  }
}

void bench_cublaslt_close(bench_cublaslt *lt) {
  if (lt->pref && lt->pref_destroy) lt->pref_destroy(lt->pref);
  if (lt->d_layout && lt->layout_destroy) lt->layout_destroy(lt->d_layout);
  if (lt->b_layout && lt->layout_destroy) lt->layout_destroy(lt->b_layout);
  if (lt->a_layout && lt->layout_destroy) lt->layout_destroy(lt->a_layout);
  if (lt->desc && lt->desc_destroy) lt->desc_destroy(lt->desc);
  if (lt->handle && lt->destroy) lt->destroy(lt->handle);
  lt->pref = lt->d_layout = lt->b_layout = lt->a_layout = lt->desc = lt->handle = NULL;
}
