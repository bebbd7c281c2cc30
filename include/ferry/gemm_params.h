/* ferry/gemm_params.h — the kernel parameter of ferry's GEMMs, one definition for the host and the device.
 *
 * ferry/ops.h includes it for programs; ferry prepends this very text to the CUDA source of every operator it
 * compiles, its own and registered ones (src/ops/source.c), so a kernel declared
 *   extern "C" __global__ void my_gemm(ferry_gemm_params p)
 * reads the struct the host filled. Hence plain C that C, C++ and NVRTC all read: no includes, built-in types only
 * (long long is 64 bits, int and float 32, on every platform CUDA runs on), 128 bytes with no padding.
 */
#ifndef FERRY_GEMM_PARAMS_H
#define FERRY_GEMM_PARAMS_H

/* Element (i, j) of batch z of A is at a + z*batch_a + (row-major ? i*lda + j : i + j*lda), in elements; likewise
 * B (k×n) and out (m×n). */
typedef struct ferry_gemm_params {
  const void *a, *b;
  void *out;
  long long lda, ldb, ldc;             /* leading dimensions, in elements */
  long long batch_a, batch_b, batch_c; /* elements between batches (0: broadcast) */
  int m, n, k, l;
  float alpha, beta;
  unsigned int kind;                   /* FERRY_GEMM_KIND of the problem, with its epilogue bits */
  unsigned int reserved;               /* 0 */
  const void *bias;                    /* the epilogue's bias vector (out's type), or NULL */
  const float *scale_a, *scale_b;      /* per-tensor scales multiplying alpha (FERRY_SCALED kinds), or NULL */
} ferry_gemm_params;

#endif
