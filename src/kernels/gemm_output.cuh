// gemm_output.cuh — the output side of ferry's GEMM kernels: which output tile a block computes, the values a
// thread holds of one mma tile, and the stores (one element at a time, or 4 consecutive elements at once).
//
// Plain C++ with no PTX, so that the CPU emulation (tests/kernels/emulate_cuda.h) includes this same text rather
// than a copy of it. It builds on what gemm_common.cuh (or, on the CPU, the emulation) defines first: the kind's
// macros and types, to_f32 / from_f32, f16_to_f32 and exp2_approx. The shared headers form one chain, each including the one
// before it (gemm_params, gemm_kind, gemm_common, this file), and a kernel file includes this last one. ferry gives
// NVRTC the same chain as text, in that order (src/ops/source.c), so the include guards skip every #include there:
// the includes serve nvcc, which checks the files one by one.
#ifndef FERRY_GEMM_OUTPUT_INCLUDED
#define FERRY_GEMM_OUTPUT_INCLUDED

#ifndef FERRY_GEMM_COMMON_INCLUDED
#include "gemm_common.cuh"
#endif

namespace ferry {

// Vector types of our own: the source includes no header, so it depends on nothing NVRTC may or may not predefine.
struct __align__(8) f32x2 { float x, y; };
struct __align__(16) f32x4 { float x, y, z, w; };
struct __align__(8) u32x2 { u32 x, y; };

// A tile's values between the accumulators and the store: fp32, or int32 for int8 inputs, whose sums stay integers
// until the store (exact into an int32 output, which takes no epilogue: the host allows none).
#if FERRY_ACC_TYPE == FERRY_SCALAR_I32
typedef int sum_t;
#else
typedef float sum_t;
#endif
struct __align__(8) sum2 { sum_t x, y; };
struct __align__(16) sum4 { sum_t x, y, z, w; };

// The parameters as the kernels' loads see them: 8-bit operands as 16-bit pairs of consecutive k values, so k, lda,
// ldb and A's and B's batch strides count pairs (the host guarantees k contiguous in both operands, and k and every
// stride whole 16-byte chunks); out is as it was.
__device__ __forceinline__ ferry_gemm_params in_pairs(ferry_gemm_params p) {
#if FERRY_NARROW_INPUTS
  p.k /= 2, p.lda /= 2, p.ldb /= 2, p.batch_a /= 2, p.batch_b /= 2;
#endif
  return p;
}

// Maps a tile index (blockIdx.x, or a persistent block's current tile) to a (row tile, column tile) pair, walking
// groups of 8 row tiles column by column so that blocks running together share rows of A and columns of B in L2.
__device__ __forceinline__ void tile_of_index(int m, int n, int bm, int bn, int index, int &tm, int &tn) {
  const int tiles_m = (m + bm - 1) / bm, tiles_n = (n + bn - 1) / bn;
  const int group = 8;
  const int per_group = group * tiles_n;
  const int first = index / per_group * group;
  const int rows = min(tiles_m - first, group);
  const int in_group = index % per_group;
  tm = first + in_group % rows;
  tn = in_group / rows;
}
__device__ __forceinline__ void tile_of_block(int m, int n, int bm, int bn, int &tm, int &tn) {
  tile_of_index(m, n, bm, bn, (int)blockIdx.x, tm, tn);
}

// The four values thread (g, t) of a warp holds of one 16×8 mma tile, as fp32: rows g and g+8, columns 2t and
// 2t+1, from fp32 accumulators or from fp16 ones packed two to a register.
template <class A> __device__ __forceinline__ void tile_values(const A (&acc)[4], sum_t v[4]) {
  v[0] = acc[0];
  v[1] = acc[1];
  v[2] = acc[2];
  v[3] = acc[3];
}
__device__ __forceinline__ void tile_values(const u32 (&acc)[2], sum_t v[4]) {
  v[0] = f16_to_f32((u16)(acc[0] & 0xffffu));
  v[1] = f16_to_f32((u16)(acc[0] >> 16));
  v[2] = f16_to_f32((u16)(acc[1] & 0xffffu));
  v[3] = f16_to_f32((u16)(acc[1] >> 16));
}

// The epilogue of a store, out = activation(alpha·acc + beta·old + bias): alpha and beta from the parameter, the bias
// mode and activation from the kind (FERRY_BIAS, FERRY_ACTIVATION), so that a plain GEMM compiles to what it was.
struct epilogue {
  float alpha, beta;
  const out_t *bias; // n values (FERRY_BIAS 1) or m values (2), of out's type
};
__device__ __forceinline__ epilogue epilogue_of(const ferry_gemm_params &p) {
#if FERRY_SCALED
  const float alpha = p.alpha * *p.scale_a * *p.scale_b; // read at every run: scales made on the GPU need no sync
#else
  const float alpha = p.alpha;
#endif
  return epilogue{alpha, p.beta, static_cast<const out_t *>(p.bias)};
}

// The bias of output element (row, col): 0 without one.
__device__ __forceinline__ float bias_of(const epilogue &e, int row, int col) {
#if FERRY_BIAS == 1
  return to_f32<FERRY_OUT_TYPE>(e.bias[col]);
#elif FERRY_BIAS == 2
  return to_f32<FERRY_OUT_TYPE>(e.bias[row]);
#else
  (void)e, (void)row, (void)col;
  return 0.0f;
#endif
}
// v plus a bias; without a bias v itself, not v + 0.0f: that addition turns -0 into +0, so the compiler must keep it,
// one instruction an element of every plain GEMM.
__device__ __forceinline__ float plus_bias(float v, float bias) { return FERRY_BIAS ? v + bias : v; }

// The biases of output elements (row, col..col+3), which store4 takes read: a thread that stores several chunks of
// the same columns reads a row bias once for all of them (the compiler cannot hoist the loads across the stores to
// the output, which might alias the bias).
struct bias4 {
  float v[4];
};
__device__ __forceinline__ bias4 bias4_at(const epilogue &e, int row, int col) {
  bias4 b;
#pragma unroll
  for (int i = 0; i < 4; ++i) b.v[i] = bias_of(e, row, col + i);
  return b;
}

// x·sigmoid(t), given s = -t·log2(e): x / (1 + 2^s) with the hardware's exponential and division (a few ulp). tanhf,
// or expf with a full division, cost a 4096³ bf16 GEMM 6.5% and 13% (docs/gemm-kernels.md). Callers fold log2(e)
// into their constants. A large s gives 2^s = inf and x / inf = 0; a very negative one 2^s = 0 and x.
__device__ __forceinline__ float times_sigmoid(float x, float s) { return __fdividef(x, 1.0f + exp2_approx(s)); }

// -log2(e), and GELU's t = 2·sqrt(2/π)·(x + 0.044715·x³) as s = x·(GELU_S1 + GELU_S3·x²): three instructions.
constexpr float MINUS_LOG2E = -1.4426950408889634f;
constexpr float GELU_S1 = 1.5957691216057308f * MINUS_LOG2E;
constexpr float GELU_S3 = GELU_S1 * 0.044715f;

// ReLU lets NaN through (x < 0 is false), as torch's does. GELU is torch's approximate="tanh" form, 0.5·x·(1 +
// tanh(u)), written as x·sigmoid(2u); SiLU is x·sigmoid(x).
__device__ __forceinline__ float activate(float x) {
#if FERRY_ACTIVATION == 1
  return x < 0.0f ? 0.0f : x;
#elif FERRY_ACTIVATION == 2
  return times_sigmoid(x, x * (GELU_S1 + GELU_S3 * (x * x)));
#elif FERRY_ACTIVATION == 3
  return times_sigmoid(x, MINUS_LOG2E * x);
#else
  return x;
#endif
}

// Writes one output element: the epilogue of acc, converted to the output type; out of range is skipped.
__device__ __forceinline__ void store_out(out_t *out, long long ldc, int m, int n, int row, int col, sum_t acc,
                                          const epilogue &e) {
  if (row >= m || col >= n) return;
  const long long at = FERRY_OUT_ROW ? (long long)row * ldc + col : (long long)col * ldc + row;
#if FERRY_OUT_TYPE == FERRY_SCALAR_I32
  (void)e;
  out[at] = acc;
#else
  float v = e.alpha * (float)acc;
  // beta == 0 must not read: the output may hold anything, NaN included.
  if (e.beta != 0.0f) v += e.beta * to_f32<FERRY_OUT_TYPE>(out[at]);
  out[at] = from_f32<FERRY_OUT_TYPE>(activate(plus_bias(v, bias_of(e, row, col))));
#endif
}
// Writes the four values thread (g, t) holds of one 16×8 mma tile (tile_values' order), element by element: rows
// row and row+8, columns col and col+1, where row is the tile's first row + g and col its first column + 2t.
__device__ __forceinline__ void store_tile(out_t *out, long long ldc, int m, int n, int row, int col, const sum_t v[4],
                                           const epilogue &e) {
  store_out(out, ldc, m, n, row, col, v[0], e);
  store_out(out, ldc, m, n, row, col + 1, v[1], e);
  store_out(out, ldc, m, n, row + 8, col, v[2], e);
  store_out(out, ldc, m, n, row + 8, col + 1, v[3], e);
}

// Writes elements (row, col..col+3) of a row-major output, the epilogue of a[0..3] with their biases bias4_at(e, row,
// col), with one 16-byte (32-bit types) or 8-byte (16-bit types) load and store; the caller has checked that they
// are in range and aligned for it.
__device__ __forceinline__ void store4(out_t *at, const sum_t a[4], const bias4 &bias, const epilogue &e) {
#if FERRY_OUT_TYPE == FERRY_SCALAR_I32
  (void)bias, (void)e;
  *reinterpret_cast<sum4 *>(at) = sum4{a[0], a[1], a[2], a[3]};
#else
  float v[4] = {e.alpha * (float)a[0], e.alpha * (float)a[1], e.alpha * (float)a[2], e.alpha * (float)a[3]};
  const float beta = e.beta;
#if FERRY_OUT_TYPE == FERRY_SCALAR_F32
  if (beta != 0.0f) {
    const f32x4 old = *reinterpret_cast<const f32x4 *>(at);
    v[0] += beta * old.x, v[1] += beta * old.y, v[2] += beta * old.z, v[3] += beta * old.w;
  }
#else
  if (beta != 0.0f) {
    const u32x2 old = *reinterpret_cast<const u32x2 *>(at);
    v[0] += beta * to_f32<FERRY_OUT_TYPE>((u16)(old.x & 0xffffu));
    v[1] += beta * to_f32<FERRY_OUT_TYPE>((u16)(old.x >> 16));
    v[2] += beta * to_f32<FERRY_OUT_TYPE>((u16)(old.y & 0xffffu));
    v[3] += beta * to_f32<FERRY_OUT_TYPE>((u16)(old.y >> 16));
  }
#endif
#pragma unroll
  for (int i = 0; i < 4; ++i) v[i] = activate(plus_bias(v[i], bias.v[i]));
#if FERRY_OUT_TYPE == FERRY_SCALAR_F32
  *reinterpret_cast<f32x4 *>(at) = f32x4{v[0], v[1], v[2], v[3]};
#else
  u32x2 w;
  w.x = (u32)from_f32<FERRY_OUT_TYPE>(v[0]) | (u32)from_f32<FERRY_OUT_TYPE>(v[1]) << 16;
  w.y = (u32)from_f32<FERRY_OUT_TYPE>(v[2]) | (u32)from_f32<FERRY_OUT_TYPE>(v[3]) << 16;
  *reinterpret_cast<u32x2 *>(at) = w;
#endif
#endif
}

}  // namespace ferry

#endif
