// gemm_params.cuh — the one kernel parameter of ferry's GEMMs, as the device sees it.
//
// ferry prepends this text to every operator's source it compiles (its own and registered ones), so it must stay
// byte-for-byte in step with ferry_gemm_params in include/ferry/ops.h: same fields, same order, 104 bytes.
#ifndef FERRY_GEMM_PARAMS_INCLUDED
#define FERRY_GEMM_PARAMS_INCLUDED

struct ferry_gemm_params {
  const void *a, *b;
  void *out;
  long long lda, ldb, ldc;             // leading dimensions, in elements
  long long batch_a, batch_b, batch_c; // elements between batches (0: broadcast)
  int m, n, k, l;
  float alpha, beta;
  unsigned kind;                       // FERRY_GEMM_KIND of the problem
  unsigned reserved;
};
static_assert(sizeof(ferry_gemm_params) == 104, "ferry_gemm_params must match include/ferry/ops.h");

// Element type codes (ferry_scalar) and majors, as the FERRY_*_TYPE / FERRY_*_ROW macros use them.
#define FERRY_SCALAR_F16 1
#define FERRY_SCALAR_BF16 2
#define FERRY_SCALAR_F32 3

#endif
