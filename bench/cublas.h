/* cublas.h — cuBLAS for the benchmarks, loaded at run time with dlopen (never linked), like libcuda.
 *
 * The benchmarks use cuBLAS as the foreground compute of the overlap experiment (a calibrated SGEMM) and as the
 * reference for ferry's GEMM kernels. Only the handful of entry points they need are declared, with cuBLAS's own
 * ABI types spelled out as plain C types, so no cuBLAS header is needed to build.
 */
#ifndef FERRY_BENCH_CUBLAS_H
#define FERRY_BENCH_CUBLAS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct bench_cublas {
  void *lib;
  void *handle;   /* cublasHandle_t */
  int version;    /* cublasGetVersion_v2, e.g. 130000 */
  /* cublasStatus_t is an int enum; 0 is success. */
  int (*create)(void **handle);
  int (*destroy)(void *handle);
  int (*get_version)(void *handle, int *version);
  int (*set_stream)(void *handle, void *stream);
  /* cublasSgemm_v2: transa, transb (0 = N, 1 = T), m, n, k, alpha*, A, lda, B, ldb, beta*, C, ldc */
  int (*sgemm)(void *handle, int transa, int transb, int m, int n, int k, const float *alpha, const float *a,
               int lda, const float *b, int ldb, const float *beta, float *c, int ldc);
  /* cublasGemmEx: ..., A, Atype, lda, B, Btype, ldb, beta*, C, Ctype, ldc, computeType, algo */
  int (*gemm_ex)(void *handle, int transa, int transb, int m, int n, int k, const void *alpha, const void *a,
                 int a_type, int lda, const void *b, int b_type, int ldb, const void *beta, void *c, int c_type,
                 int ldc, int compute_type, int algo);
} bench_cublas;

/* cudaDataType_t and cublasComputeType_t values used with gemm_ex and cuBLASLt. */
enum {
  BENCH_CUDA_R_32F = 0, BENCH_CUDA_R_16F = 2, BENCH_CUDA_R_8I = 3, BENCH_CUDA_R_32I = 10, BENCH_CUDA_R_16BF = 14,
  BENCH_CUDA_R_8F_E4M3 = 28, BENCH_CUDA_R_8F_E5M2 = 29
};
enum { BENCH_CUBLAS_COMPUTE_32F = 68, BENCH_CUBLAS_COMPUTE_16F = 64, BENCH_CUBLAS_COMPUTE_32I = 72 };
enum { BENCH_CUBLAS_STATUS_NOT_SUPPORTED = 15 };
enum { BENCH_CUBLAS_GEMM_DEFAULT = -1 };

/* Opens cuBLAS ($FERRY_CUBLAS, else libcublas.so.13, .12, then the toolkit's lib64) and creates a handle in the
 * calling thread's current context. Returns 0 on success; on failure writes a sentence into `why` and returns -1. */
int bench_cublas_open(bench_cublas *cb, char *why, int why_size);

/* Destroys the handle. The library stays loaded (cuBLAS keeps process-wide state). */
void bench_cublas_close(bench_cublas *cb);

/* cuBLASLt, for the one GEMM cublasGemmEx does not offer: FP8 inputs with per-tensor scales (what torch._scaled_mm
 * runs). One prepared matmul: D (n×m column-major, a row-major m×n output) = scale_a·scale_b · Aᵀ·B of column-major
 * A (k×n) and B (k×m), the "TN" layout cuBLASLt's FP8 kernels take. */
typedef struct bench_cublaslt {
  void *lib, *handle, *desc, *a_layout, *b_layout, *d_layout, *pref;
  uint64_t algos[8][8];      /* cublasLtMatmulAlgo_t each: the heuristic's candidates, best first */
  size_t workspace_bytes;    /* the workspace given to every run (what the candidates were chosen under) */
  int n_algos, chosen;       /* the candidates found; the one runs use */
  bool ran;                  /* `chosen` has run: from then on its failures are reported, not worked around */
  int (*matmul)(void *handle, void *desc, const void *alpha, const void *a, void *a_layout, const void *b,
                void *b_layout, const void *beta, const void *c, void *c_layout, void *d, void *d_layout,
                const void *algo, void *workspace, size_t workspace_bytes, void *stream);
  int (*desc_destroy)(void *desc);
  int (*layout_destroy)(void *layout);
  int (*pref_destroy)(void *pref);
  int (*destroy)(void *handle);
} bench_cublaslt;

/* Prepares the FP8 matmul above (a_type and b_type BENCH_CUDA_R_8F_*, d_type the output's; scales: device pointers
 * to one float each, applied to A and B) for at most `workspace_bytes` of workspace. Returns 0, or -1 with a sentence
 * in `why` (no cuBLASLt, no kernel for these types on this GPU). */
int bench_cublaslt_fp8_open(bench_cublaslt *lt, int m, int n, int k, int a_type, int b_type, int d_type,
                            const void *scale_a, const void *scale_b, size_t workspace_bytes, char *why,
                            int why_size);

/* Runs it: d = the output (device), a and b the operands as above. 0 on success (a cublasStatus_t otherwise). Until
 * one has run, a candidate that cuBLASLt refuses at run time (the heuristic cannot see the pointers) gives way to
 * the next. */
int bench_cublaslt_run(bench_cublaslt *lt, const void *a, const void *b, void *d, void *workspace,
                       void *stream);

void bench_cublaslt_close(bench_cublaslt *lt);

#endif
