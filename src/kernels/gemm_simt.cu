// gemm_simt.cu — ferry's fallback GEMM on the CUDA cores: any mix of fp16, bf16 and fp32 operands, any majors,
// any alignment, fp32 accumulation; correct everywhere, fast nowhere in particular.
//
// A 64×64 output tile per block of 256 threads, each thread a 4×4 patch. Every 16-deep slice of A and B is loaded
// element by element (converted to fp32 on the way) into shared memory laid out k-major, [16][64], so the inner
// loop reads four consecutive floats of A and of B per k with one 16-byte shared load each. Loads walk the
// operand's contiguous dimension across the threads of a warp, so they coalesce in either major mode.
#ifndef FERRY_GEMM_OUTPUT_INCLUDED
#include "gemm_output.cuh" // and through it the other shared headers
#endif

namespace ferry {

constexpr int S_BM = 64, S_BN = 64, S_BK = 16, S_THREADS = 256;

extern "C" __global__ void __launch_bounds__(S_THREADS) ferry_gemm_simt(const ferry_gemm_params p) {
  __shared__ __align__(16) float As[S_BK][S_BM];
  __shared__ __align__(16) float Bs[S_BK][S_BN];
  int tm, tn;
  tile_of_block(p.m, p.n, S_BM, S_BN, tm, tn);
  const int m0 = tm * S_BM, n0 = tn * S_BN;
  const int z = blockIdx.z;
  const a_t *A = static_cast<const a_t *>(p.a) + z * p.batch_a;
  const b_t *B = static_cast<const b_t *>(p.b) + z * p.batch_b;
  out_t *C = static_cast<out_t *>(p.out) + z * p.batch_c;
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;

  float acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

  for (int k0 = 0; k0 < p.k; k0 += S_BK) {
    // 64×16 of A and 16×64 of B: four elements of each per thread.
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int idx = tid + e * S_THREADS;
      int mm, kk;
      if (FERRY_A_ROW) { kk = idx % S_BK; mm = idx / S_BK; } else { mm = idx % S_BM; kk = idx / S_BM; }
      const int gm = m0 + mm, gk = k0 + kk;
      float v = 0.0f;
      if (gm < p.m && gk < p.k)
        v = to_f32<FERRY_A_TYPE>(A[FERRY_A_ROW ? (i64)gm * p.lda + gk : (i64)gk * p.lda + gm]);
      As[kk][mm] = v;
      int nn;
      if (FERRY_B_ROW) { nn = idx % S_BN; kk = idx / S_BN; } else { kk = idx % S_BK; nn = idx / S_BK; }
      const int gn = n0 + nn;
      const int gk2 = k0 + kk;
      float w = 0.0f;
      if (gn < p.n && gk2 < p.k)
        w = to_f32<FERRY_B_TYPE>(B[FERRY_B_ROW ? (i64)gk2 * p.ldb + gn : (i64)gn * p.ldb + gk2]);
      Bs[kk][nn] = w;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < S_BK; ++kk) {
      const float4 a4 = *reinterpret_cast<const float4 *>(&As[kk][ty * 4]);
      const float4 b4 = *reinterpret_cast<const float4 *>(&Bs[kk][tx * 4]);
      const float a[4] = {a4.x, a4.y, a4.z, a4.w}, b[4] = {b4.x, b4.y, b4.z, b4.w};
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
  const epilogue e = epilogue_of(p);
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) store_out(C, p.ldc, p.m, p.n, m0 + ty * 4 + i, n0 + tx * 4 + j, acc[i][j], e);
}

}  // namespace ferry
