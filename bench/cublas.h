/* cublas.h — cuBLAS for the benchmarks, loaded at run time with dlopen (never linked), like libcuda.
 *
 * The benchmarks use cuBLAS as the foreground compute of the overlap experiment (a calibrated SGEMM) and as the
 * reference for ferry's GEMM kernels. Only the handful of entry points they need are declared, with cuBLAS's own
 * ABI types spelled out as plain C types, so no cuBLAS header is needed to build.
 */
#ifndef FERRY_BENCH_CUBLAS_H
#define FERRY_BENCH_CUBLAS_H

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

/* cudaDataType_t and cublasComputeType_t values used with gemm_ex. */
enum { BENCH_CUDA_R_32F = 0, BENCH_CUDA_R_16F = 2, BENCH_CUDA_R_16BF = 14 };
enum { BENCH_CUBLAS_COMPUTE_32F = 68, BENCH_CUBLAS_COMPUTE_16F = 64 };
enum { BENCH_CUBLAS_GEMM_DEFAULT = -1 };

/* Opens cuBLAS ($FERRY_CUBLAS, else libcublas.so.13, .12, then the toolkit's lib64) and creates a handle in the
 * calling thread's current context. Returns 0 on success; on failure writes a sentence into `why` and returns -1. */
int bench_cublas_open(bench_cublas *cb, char *why, int why_size);

/* Destroys the handle. The library stays loaded (cuBLAS keeps process-wide state). */
void bench_cublas_close(bench_cublas *cb);

#endif
