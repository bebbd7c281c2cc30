// gemm_mma.cu — ferry's tensor-core GEMM: fp16/bf16 operands, mma.sync.m16n8k16 with fp32 (or fp16)
// accumulators, a multi-stage cp.async pipeline through shared memory, ldmatrix fragment loads.
//
// One thread block computes a BM×BN tile of out; its WARPS_M×WARPS_N warps each own a (BM/WARPS_M)×(BN/WARPS_N)
// piece, built from 16×8 mma tiles. With WARPS_K > 1 there are that many such sets of warps, each taking every
// WARPS_K-th k16 step of a stage, and their sums meet in shared memory at the end: a tile too small to give each
// scheduler more than one warp (m ≤ 16, a decode step) still gets several to hide the mma and ldmatrix latencies.
// K advances BK at a time through STAGES shared-memory buffers: while the tensor cores work on stage s, cp.async
// fills the stages after it. Operands may be row- or column-major (chosen at
// compile time by the FERRY_*_ROW macros): a tile is stored in shared memory in the operand's own orientation and
// ldmatrix (plain or .trans) turns either into mma fragments. Rows of the shared tiles are padded by 16 bytes, so
// the 8 row addresses of each ldmatrix fall in 8 different 16-byte bank groups.
//
// 8-bit operands (FP8, int8) take the same path with mma.sync.m16n8k32: with k contiguous in both (A row-major, B
// column-major), two consecutive k values are one 16-bit element, and the fragments of a 16×8×32 tile of bytes are
// exactly those of a 16×8×16 tile of such pairs; so the kernel loads pairs (in_pairs) and issues one k32 mma per
// k16 step of pairs.
//
// Edges: every load is predicated per 16-byte chunk (cp.async reads only the in-range bytes and zero-fills the
// rest), every store per element, so any m, n, k work. FERRY_VEC is the load width in elements: 8 (16-byte
// cp.async) needs 16-byte-aligned operands (address, leading dimension, batch stride), which the host checks;
// 1 loads element by element and accepts any alignment.
#ifndef FERRY_GEMM_OUTPUT_INCLUDED
#include "gemm_output.cuh" // and through it the other shared headers
#endif

#ifndef FERRY_BM
#define FERRY_BM 128
#define FERRY_BN 128
#define FERRY_BK 32
#define FERRY_WARPS_M 2
#define FERRY_WARPS_N 2
#define FERRY_STAGES 4
#define FERRY_VEC 8
#endif
#ifndef FERRY_WARPS_K
#define FERRY_WARPS_K 1
#endif

namespace ferry {

constexpr int BM = FERRY_BM, BN = FERRY_BN, BK = FERRY_BK;
constexpr int WARPS_M = FERRY_WARPS_M, WARPS_N = FERRY_WARPS_N, WARPS_K = FERRY_WARPS_K;
constexpr int STAGES = FERRY_STAGES, VEC = FERRY_VEC;
constexpr int THREADS = WARPS_M * WARPS_N * WARPS_K * 32;
constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N; // one warp's piece
constexpr int MI = WM / 16, NI = WN / 8;            // its mma tiles
constexpr bool A_ROW = FERRY_A_ROW, B_ROW = FERRY_B_ROW;
constexpr int PAD = 8; // elements (16 bytes) added to every shared row

// Shared tiles in the operands' orientation: A row-major is [BM][BK] (k contiguous), column-major [BK][BM];
// B row-major is [BK][BN] (n contiguous), column-major [BN][BK].
constexpr int A_PITCH = A_ROW ? BK + PAD : BM + PAD;
constexpr int A_ELEMS = (A_ROW ? BM : BK) * A_PITCH;
constexpr int B_PITCH = B_ROW ? BN + PAD : BK + PAD;
constexpr int B_ELEMS = (B_ROW ? BK : BN) * B_PITCH;
constexpr int STAGE_ELEMS = A_ELEMS + B_ELEMS;
constexpr unsigned SMEM_BYTES = STAGES * STAGE_ELEMS * 2;

#if FERRY_NARROW_INPUTS
static_assert(A_ROW && !B_ROW && VEC == 8, "8-bit operands: k contiguous in both, whole 16-byte chunks");
static_assert(FERRY_ACC_TYPE == (FERRY_A_TYPE == FERRY_SCALAR_I8 ? FERRY_SCALAR_I32 : FERRY_SCALAR_F32),
              "FP8 accumulates in fp32, int8 in int32");
#else
static_assert(FERRY_A_TYPE == FERRY_B_TYPE && (FERRY_A_TYPE == FERRY_SCALAR_F16 || FERRY_A_TYPE == FERRY_SCALAR_BF16),
              "the tensor-core GEMM takes two fp16 or two bf16 operands, or two 8-bit ones");
static_assert(FERRY_ACC_TYPE == FERRY_SCALAR_F32 || FERRY_A_TYPE == FERRY_SCALAR_F16,
              "fp16 accumulation needs fp16 operands");
#endif
static_assert(BM % (16 * WARPS_M) == 0 && BN % (16 * WARPS_N) == 0 && NI % 2 == 0, "warp tiles of 16×16 pieces");
static_assert(BK % 16 == 0 && STAGES >= 2, "k in steps of 16, at least double buffering");
static_assert(BK / 16 % WARPS_K == 0, "every set of warps takes as many k16 steps of a stage");
// The sums of the sets of warps past the first, each warp's fp32 values of its mma tiles, in the drained pipeline.
constexpr unsigned PARTIAL_FLOATS = (WARPS_K - 1) * WARPS_M * WARPS_N * MI * NI * 32 * 4;
static_assert(PARTIAL_FLOATS * 4 <= SMEM_BYTES, "the partial sums fit where the stages were");
static_assert(VEC == 8 || VEC == 4 || VEC == 2 || VEC == 1, "load width");

typedef u16 elem;

// Loads a ROWS×COLS tile (COLS contiguous in memory and in shared memory) whose first element is at `g` with
// leading dimension `ld`; rows at or past `rows_left` and columns at or past `cols_left` read as zero. Each
// thread copies the same column chunk of rows r0, r0+STEP, ... (a tile of fewer chunks than threads: one row or none)
template <int ROWS, int COLS>
__device__ __forceinline__ void load_tile(elem *s, int pitch, const elem *g, i64 ld, int rows_left, int cols_left) {
  constexpr int CHUNKS_PER_ROW = COLS / VEC;
  constexpr int STEP = THREADS / CHUNKS_PER_ROW;
  static_assert(COLS % VEC == 0 && THREADS % CHUNKS_PER_ROW == 0 && (ROWS % STEP == 0 || STEP % ROWS == 0),
                "tile split");
  const int r0 = threadIdx.x / CHUNKS_PER_ROW;
  const int c = threadIdx.x % CHUNKS_PER_ROW * VEC;
  const int c_valid = max(0, min(cols_left - c, VEC));
  if (STEP > ROWS && r0 >= ROWS) return;
#pragma unroll
  for (int i = 0; i < (ROWS > STEP ? ROWS / STEP : 1); ++i) {
    const int r = r0 + i * STEP;
    const int n = r < rows_left ? c_valid : 0;
    elem *dst = s + r * pitch + c;
    const elem *src = n ? g + r * ld + c : g; // never form an address past the operand
    if (VEC == 1) {
      *dst = n ? *src : (elem)0;
    } else {
      cp_async<VEC * 2>(smem_addr(dst), src, n * 2);
    }
  }
}

extern "C" __global__ void __launch_bounds__(THREADS) ferry_gemm_mma(const ferry_gemm_params params) {
  const ferry_gemm_params p = in_pairs(params);
  extern __shared__ __align__(128) unsigned char smem_raw[];
  elem *smem = reinterpret_cast<elem *>(smem_raw);
  {
    // The launch's dynamic shared memory is the host's computation of SMEM_BYTES: a mismatch must not corrupt.
    unsigned have;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(have));
    if (have < SMEM_BYTES) __trap();
  }
  int tm, tn;
  tile_of_block(p.m, p.n, BM, BN, tm, tn);
  const int m0 = tm * BM, n0 = tn * BN;
  const int z = blockIdx.z;
  const elem *A = static_cast<const elem *>(p.a) + z * p.batch_a;
  const elem *B = static_cast<const elem *>(p.b) + z * p.batch_b;
  out_t *C = static_cast<out_t *>(p.out) + z * p.batch_c;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // set of warps (a constant 0 without sets, so that the k16 loop below unrolls to constant offsets), place in it
  const int kw = WARPS_K > 1 ? warp / (WARPS_M * WARPS_N) : 0, wmn = warp % (WARPS_M * WARPS_N);
  const int wm0 = wmn / WARPS_N * WM, wn0 = wmn % WARPS_N * WN;

#if FERRY_ACC_TYPE == FERRY_SCALAR_F16
  u32 acc[MI][NI][2];
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j) acc[i][j][0] = acc[i][j][1] = 0u;
#elif FERRY_NARROW_INPUTS
  narrow_acc acc[MI][NI][4];
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0;
#else
  float acc[MI][NI][4];
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;
#endif

  const int ktiles = (p.k + BK - 1) / BK;

  // Stage `s` gets k-tile `kt`.
  auto load_stage = [&](int s, int kt) {
    elem *sa = smem + s * STAGE_ELEMS, *sb = sa + A_ELEMS;
    const int k0 = kt * BK;
    if (A_ROW) load_tile<BM, BK>(sa, A_PITCH, A + (i64)m0 * p.lda + k0, p.lda, p.m - m0, p.k - k0);
    else load_tile<BK, BM>(sa, A_PITCH, A + (i64)k0 * p.lda + m0, p.lda, p.k - k0, p.m - m0);
    if (B_ROW) load_tile<BK, BN>(sb, B_PITCH, B + (i64)k0 * p.ldb + n0, p.ldb, p.k - k0, p.n - n0);
    else load_tile<BN, BK>(sb, B_PITCH, B + (i64)n0 * p.ldb + k0, p.ldb, p.n - n0, p.k - k0);
  };

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < ktiles) load_stage(s, s);
    cp_async_commit(); // empty groups keep the count of groups in flight the same for every iteration
  }

  for (int kt = 0; kt < ktiles; ++kt) {
    cp_async_wait<STAGES - 2>();
    __syncthreads(); // stage kt is in shared memory for everyone, and stage kt-1 is no longer read
    const int next = kt + STAGES - 1;
    if (next < ktiles) load_stage(next % STAGES, next);
    cp_async_commit();

    const elem *sa = smem + (kt % STAGES) * STAGE_ELEMS, *sb = sa + A_ELEMS;
    const u32 sa_addr = smem_addr(sa), sb_addr = smem_addr(sb);
#pragma unroll
    for (int kk = 0; kk < BK / 16 / WARPS_K; ++kk) {
      const int ks = kk * WARPS_K + kw;
      u32 af[MI][4], bf[NI][2];
#pragma unroll
      for (int i = 0; i < MI; ++i) {
        const int mrow = wm0 + i * 16;
        if (A_ROW) {
          const int r = mrow + (lane & 15), c = ks * 16 + (lane >> 4) * 8;
          ldmatrix_x4(af[i], sa_addr + (r * A_PITCH + c) * 2);
        } else {
          const int r = ks * 16 + (lane >> 4) * 8 + (lane & 7), c = mrow + ((lane >> 3) & 1) * 8;
          ldmatrix_x4_trans(af[i], sa_addr + (r * A_PITCH + c) * 2);
        }
      }
#pragma unroll
      for (int j = 0; j < NI; j += 2) {
        const int ncol = wn0 + j * 8;
        u32 r4[4];
        if (B_ROW) {
          const int r = ks * 16 + ((lane >> 3) & 1) * 8 + (lane & 7), c = ncol + (lane >> 4) * 8;
          ldmatrix_x4_trans(r4, sb_addr + (r * B_PITCH + c) * 2);
        } else {
          const int r = ncol + (lane >> 4) * 8 + (lane & 7), c = ks * 16 + ((lane >> 3) & 1) * 8;
          ldmatrix_x4(r4, sb_addr + (r * B_PITCH + c) * 2);
        }
        bf[j][0] = r4[0];
        bf[j][1] = r4[1];
        bf[j + 1][0] = r4[2];
        bf[j + 1][1] = r4[3];
      }
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j) {
#if FERRY_ACC_TYPE == FERRY_SCALAR_F16
          mma_f16(acc[i][j], af[i], bf[j]);
#elif FERRY_NARROW_INPUTS
          mma_k32(acc[i][j], af[i], bf[j]);
#else
          mma_f32<FERRY_A_TYPE>(acc[i][j], af[i], bf[j]);
#endif
        }
    }
  }
  cp_async_wait<0>(); // nothing may be left in flight into shared memory when the block exits

  // Epilogue: thread (g, t) of a warp holds, for each 16×8 tile, rows g and g+8, columns 2t and 2t+1.
  const int g = lane >> 2, t = lane & 3;
  const epilogue e = epilogue_of(p);
  sum_t *partial = reinterpret_cast<sum_t *>(smem_raw);
  auto partial_at = [&](int set, int i, int j) {
    return partial + ((((set - 1) * WARPS_M * WARPS_N + wmn) * MI + i) * NI + j) * 128 + lane * 4;
  };
  if (WARPS_K > 1) {
    __syncthreads(); // every warp is done reading the stages
    if (kw > 0)
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j) tile_values(acc[i][j], partial_at(kw, i, j));
    __syncthreads();
    if (kw > 0) return;
  }
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j) {
      const int row = m0 + wm0 + i * 16 + g, col = n0 + wn0 + j * 8 + t * 2;
      sum_t v[4];
      tile_values(acc[i][j], v);
      for (int set = 1; set < WARPS_K; ++set) {
        const sum_t *q = partial_at(set, i, j);
        v[0] += q[0], v[1] += q[1], v[2] += q[2], v[3] += q[3];
      }
      store_tile(C, p.ldc, p.m, p.n, row, col, v, e);
    }
}

}  // namespace ferry
