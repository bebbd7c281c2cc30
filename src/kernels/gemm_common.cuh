// gemm_common.cuh — what ferry's GEMM kernels share: element conversions, the problem's kind as constants,
// cp.async / ldmatrix / mma wrappers, the block-to-tile mapping and the epilogue's store.
//
// Compiled by NVRTC at run time, so it includes no header at all: fp16 and bf16 travel as raw 16-bit patterns and
// are converted with PTX cvt instructions. ferry prepends gemm_params.cuh and the FERRY_* macros of the problem's
// kind; the defaults below only serve checking this file with nvcc (see cmake/ops.cmake, ferry_check_kernels).
#ifndef FERRY_GEMM_COMMON_INCLUDED
#define FERRY_GEMM_COMMON_INCLUDED

#ifndef FERRY_GEMM_PARAMS_INCLUDED
#include "gemm_params.cuh"
#endif

#ifndef FERRY_A_TYPE
#define FERRY_A_TYPE FERRY_F16
#endif
#ifndef FERRY_B_TYPE
#define FERRY_B_TYPE FERRY_A_TYPE
#endif
#ifndef FERRY_OUT_TYPE
#define FERRY_OUT_TYPE FERRY_F32
#endif
#ifndef FERRY_ACC_TYPE
#define FERRY_ACC_TYPE FERRY_F32
#endif
#ifndef FERRY_A_ROW
#define FERRY_A_ROW 1
#endif
#ifndef FERRY_B_ROW
#define FERRY_B_ROW 1
#endif
#ifndef FERRY_OUT_ROW
#define FERRY_OUT_ROW 1
#endif

namespace ferry {

typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;

// Storage type of a ferry_scalar code.
template <int T> struct storage { typedef u16 type; };
template <> struct storage<FERRY_F32> { typedef float type; };

__device__ __forceinline__ float f16_to_f32(u16 h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
__device__ __forceinline__ float bf16_to_f32(u16 h) { return __uint_as_float((u32)h << 16); }
__device__ __forceinline__ u16 f32_to_f16(float f) {
  u16 h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
__device__ __forceinline__ u16 f32_to_bf16(float f) {
#if __CUDA_ARCH__ >= 800
  u16 h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
#else
  // Round to nearest even by hand on chips without the instruction; NaN stays a (quiet) NaN.
  u32 x = __float_as_uint(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (u16)((x >> 16) | 0x40u);
  return (u16)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
#endif
}

template <int T> __device__ __forceinline__ float to_f32(typename storage<T>::type v);
template <> __device__ __forceinline__ float to_f32<FERRY_F16>(u16 v) { return f16_to_f32(v); }
template <> __device__ __forceinline__ float to_f32<FERRY_BF16>(u16 v) { return bf16_to_f32(v); }
template <> __device__ __forceinline__ float to_f32<FERRY_F32>(float v) { return v; }

template <int T> __device__ __forceinline__ typename storage<T>::type from_f32(float v);
template <> __device__ __forceinline__ u16 from_f32<FERRY_F16>(float v) { return f32_to_f16(v); }
template <> __device__ __forceinline__ u16 from_f32<FERRY_BF16>(float v) { return f32_to_bf16(v); }
template <> __device__ __forceinline__ float from_f32<FERRY_F32>(float v) { return v; }

typedef storage<FERRY_A_TYPE>::type a_t;
typedef storage<FERRY_B_TYPE>::type b_t;
typedef storage<FERRY_OUT_TYPE>::type out_t;

// ---- shared-memory addresses, asynchronous copies, ldmatrix, mma ------------------------------------------

__device__ __forceinline__ u32 smem_addr(const void *p) {
  u32 a;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}

// Copies `bytes` (4, 8 or 16) from global to shared memory asynchronously, reading only `src_bytes` of them and
// zero-filling the rest: the edges of a tile are loaded by the same instruction as its inside.
template <int BYTES> __device__ __forceinline__ void cp_async(u32 dst, const void *src, int src_bytes) {
  if (BYTES == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes));
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" ::"r"(dst), "l"(src), "n"(BYTES), "r"(src_bytes));
}
// A 16-byte copy with nothing to predicate (the whole chunk is in range).
__device__ __forceinline__ void cp_async16(u32 dst, const void *src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }

__device__ __forceinline__ void ldmatrix_x4(u32 r[4], u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(u32 r[4], u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// The dynamic shared memory this launch was given, in bytes.
__device__ __forceinline__ unsigned dynamic_smem_size() {
  unsigned have;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(have));
  return have;
}

// d += a·b for one 16×8×16 tile: a row-major 16×16, b column-major 16×8, fp32 accumulators.
template <int IN> __device__ __forceinline__ void mma_f32(float d[4], const u32 a[4], const u32 b[2]) {
  if (IN == FERRY_BF16)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// The same with fp16 accumulators, two per register (fp16 inputs only).
__device__ __forceinline__ void mma_f16(u32 d[2], const u32 a[4], const u32 b[2]) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%0,%1}, {%2,%3,%4,%5}, {%6,%7}, {%0,%1};"
               : "+r"(d[0]), "+r"(d[1])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// ---- tiles ------------------------------------------------------------------------------------------------

// Maps blockIdx.x to a (row tile, column tile) pair, walking groups of 8 row tiles column by column so that
// blocks running together share rows of A and columns of B in L2.
__device__ __forceinline__ void tile_of_block(int m, int n, int bm, int bn, int &tm, int &tn) {
  const int tiles_m = (m + bm - 1) / bm, tiles_n = (n + bn - 1) / bn;
  const int group = 8;
  const int per_group = group * tiles_n;
  const int bid = blockIdx.x;
  const int first = bid / per_group * group;
  const int rows = min(tiles_m - first, group);
  const int in_group = bid % per_group;
  tm = first + in_group % rows;
  tn = in_group / rows;
}

// Writes one output element: alpha*acc + beta*old, converted to the output type; out of range is skipped.
__device__ __forceinline__ void store_out(out_t *out, long long ldc, int m, int n, int row, int col, float acc,
                                          float alpha, float beta) {
  if (row >= m || col >= n) return;
  const long long at = FERRY_OUT_ROW ? (long long)row * ldc + col : (long long)col * ldc + row;
  float v = alpha * acc;
  // beta == 0 must not read: the output may hold anything, NaN included.
  if (beta != 0.0f) v += beta * to_f32<FERRY_OUT_TYPE>(out[at]);
  out[at] = from_f32<FERRY_OUT_TYPE>(v);
}

}  // namespace ferry

#endif
