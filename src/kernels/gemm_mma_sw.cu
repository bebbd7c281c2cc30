// gemm_mma_sw.cu — ferry's second tensor-core GEMM: fp16/bf16 operands, mma.sync.m16n8k16 with fp32 (or fp16)
// accumulators, built for large problems on sm_80 and sm_90. It differs from gemm_mma.cu, which stays as it is,
// in four ways, each aimed at what kept that kernel at 0.38× cuBLAS on the H200 (4096³ bf16):
//
// - K advances 64 at a time (BK = 64), so a block waits at one barrier per 4 k16 steps instead of per 2;
// - shared tiles are XOR-swizzled instead of padded: element (r, c) of a tile whose rows are COLS elements long
//   sits at row r, 16-byte chunk (c/8) ^ (r%8). Every ldmatrix phase (8 row addresses of one 8×8 matrix, always 8
//   consecutive rows at one column chunk) and every 8 consecutive cp.async chunks then land in 8 different bank
//   groups, and a stage is exactly its tiles, with no padding bytes;
// - mma fragments are double-buffered in registers: the ldmatrix of k16 step s+1 is issued before the mma of step
//   s, so shared-memory latency hides behind 32 mma instead of stalling them;
// - copies cost little: each thread keeps a pointer per operand, advanced once per k-tile, and the k loop runs in
//   two parts, the first (every k-tile it loads inside the operands) with unpredicated cp.async, the second with
//   the edge predicates. On sm_90 the first's body is ~220 instructions per 128 mma (gemm_mma.cu: 326 per 64);
// - the epilogue stages each warp's 16-row strips in shared memory and writes a row-major output with one 8-byte
//   (16-bit types) or 16-byte (fp32) store per 4 elements, full 128-byte lines per warp, instead of one 2-byte
//   store per element.
//
// One block computes a BM×BN tile with WARPS_M×WARPS_N warps, each a (BM/WARPS_M)×(BN/WARPS_N) piece made of 16×8
// mma tiles. Tiles are kept in the operands' own orientation (A row-major [BM][BK], column-major [BK][BM]; B
// row-major [BK][BN], column-major [BN][BK]) and ldmatrix (plain or .trans) turns either into fragments; the lane
// to (row, column) mapping of every ldmatrix is the one gemm_mma.cu uses, only the physical address is swizzled.
//
// Pipeline (STAGES shared buffers, one __syncthreads per k-tile): stage kt%STAGES holds k-tile kt. In iteration
// kt the block issues the copy of k-tile kt+STAGES-1 into the stage k-tile kt-1 used, which every thread finished
// reading before the previous iteration's barrier; at the last k16 step it waits for k-tile kt+1, meets the
// barrier, and loads that tile's first fragments while the last mma of kt run.
//
// Edges: every 16-byte load is predicated (cp.async reads only the in-range bytes and zero-fills the rest), every
// store too, so any m, n, k work. Operands must be 16-byte aligned (address, leading dimension, batch stride):
// the host checks it. The output takes any alignment; the wide stores are used only where they are aligned.
#ifndef FERRY_GEMM_OUTPUT_INCLUDED
#include "gemm_output.cuh" // and through it the other shared headers
#endif

#ifndef FERRY_BM
#define FERRY_BM 128
#define FERRY_BN 256
#define FERRY_BK 64
#define FERRY_WARPS_M 2
#define FERRY_WARPS_N 4
#define FERRY_STAGES 3
#endif

namespace ferry {

constexpr int BM = FERRY_BM, BN = FERRY_BN, BK = FERRY_BK;
constexpr int WARPS_M = FERRY_WARPS_M, WARPS_N = FERRY_WARPS_N, STAGES = FERRY_STAGES;
constexpr int WARPS = WARPS_M * WARPS_N, THREADS = WARPS * 32;
constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N; // one warp's piece
constexpr int MI = WM / 16, NI = WN / 8;            // its mma tiles
constexpr int KS = BK / 16;                         // k16 steps per k-tile
constexpr bool A_ROW = FERRY_A_ROW, B_ROW = FERRY_B_ROW;

// Shared tiles: rows of *_COLS contiguous elements, swizzled.
constexpr int A_COLS = A_ROW ? BK : BM, B_COLS = B_ROW ? BN : BK;
constexpr unsigned A_BYTES = BM * BK * 2, B_BYTES = BN * BK * 2, STAGE_BYTES = A_BYTES + B_BYTES;
// The epilogue's staging: per warp, 16 rows of WN fp32 values with a pitch of WN + 8 (conflict-free float2 writes
// from the accumulators, float4 reads along rows).
constexpr int EPI_PITCH = WN + 8;
constexpr unsigned EPI_BYTES = WARPS * 16 * EPI_PITCH * 4;
constexpr unsigned PIPE_BYTES = STAGES * STAGE_BYTES;
constexpr unsigned SMEM_BYTES = PIPE_BYTES > EPI_BYTES ? PIPE_BYTES : EPI_BYTES; // src/ops/registry.c mirrors this

static_assert(FERRY_A_TYPE == FERRY_B_TYPE && (FERRY_A_TYPE == FERRY_SCALAR_F16 || FERRY_A_TYPE == FERRY_SCALAR_BF16),
              "the tensor-core GEMM takes two fp16 or two bf16 operands");
static_assert(FERRY_ACC_TYPE == FERRY_SCALAR_F32 || FERRY_A_TYPE == FERRY_SCALAR_F16,
              "fp16 accumulation needs fp16 operands");
static_assert(BM % 64 == 0 && BN % 64 == 0 && BK % 64 == 0,
              "swizzled tiles need rows of a multiple of 64 elements (8 chunks of 16 bytes) in either orientation");
static_assert(WM % 64 == 0 && WN % 64 == 0, "warp pieces of whole 64-element swizzle rows (frag_base relies on it)");
static_assert(KS % 2 == 0, "fragment double buffering alternates buffers over an even number of k16 steps");
static_assert(STAGES >= 2, "at least double buffering");
static_assert((WN / 4) <= 32 && 32 % (WN / 4) == 0, "epilogue: a warp writes whole rows of its piece");

typedef u16 elem;

// Byte offset of element (r, c) in a swizzled tile with rows of COLS elements (c a multiple of 8 at chunk starts).
template <int COLS> __device__ __forceinline__ u32 swz(int r, int c) {
  return (u32)(r * (COLS * 2) + ((((c >> 3) ^ r) & 7) | ((c >> 3) & ~7)) * 16 + (c & 7) * 2);
}

// One operand's share of a stage: a ROWS×COLS tile (COLS contiguous in memory and in the shared tile), of which
// each thread copies the same 16-byte column chunk of rows r0, r0+STEP, ... Because STEP is a multiple of 8, all
// of a thread's chunks share one swizzle key (r0 % 8), so its destinations are one offset plus constants.
template <int ROWS, int COLS> struct tile_copy {
  static constexpr int CHUNKS_PER_ROW = COLS / 8, STEP = THREADS / CHUNKS_PER_ROW, N = ROWS / STEP;
  static_assert(THREADS % CHUNKS_PER_ROW == 0 && ROWS % STEP == 0 && STEP % 8 == 0, "tile split");
  static __device__ __forceinline__ int row0() { return threadIdx.x / CHUNKS_PER_ROW; }
  static __device__ __forceinline__ int col0() { return threadIdx.x % CHUNKS_PER_ROW * 8; }

  // Inside the operand: every chunk in range, no predicates.
  static __device__ __forceinline__ void full(u32 dst, const elem *src, i64 ld) {
#pragma unroll
    for (int i = 0; i < N; ++i) cp_async16(dst + i * STEP * COLS * 2, src + i * STEP * ld);
  }

  // At an edge: rows at or past `rows_left` and columns at or past `cols_left` (both counted from the thread's
  // first chunk) read as zero; `in_range` is an address inside the operand that stands in for the source of empty
  // copies.
  static __device__ __forceinline__ void edge(u32 dst, const elem *src, const elem *in_range, i64 ld,
                                              int rows_left, int cols_left) {
    const int c_valid = max(0, min(cols_left, 8));
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const int n = i * STEP < rows_left ? c_valid : 0;
      cp_async<16>(dst + i * STEP * COLS * 2, n ? src + i * STEP * ld : in_range, n * 2);
    }
  }
};

// Where a lane's ldmatrix rows are. Lane mappings are those of gemm_mma.cu: in every case the row a lane addresses
// is ≡ lane (mod 8), so its swizzle key is lane & 7, and the chunk it reads is its base chunk with some of the low
// three bits flipped by the k16 step or the tile index. frag_base() folds the lane's row and key into one offset
// per operand; frag_a()/frag_b() add the step's or tile's part: an XOR with a constant on bits 4..6 (the base has
// the key there and zeros below) and constant additions. swz() is the definition; these are its closed form.
struct frag_base {
  u32 a, b; // byte offsets within the stage's A and B tiles
};

__device__ __forceinline__ frag_base frag_bases(int wm0, int wn0, int lane) {
  const int key = lane & 7, h = lane >> 4, h1 = (lane >> 3) & 1;
  frag_base f;
  if (A_ROW) f.a = (u32)((wm0 + (lane & 15)) * A_COLS * 2 + ((h ^ key) << 4));
  else f.a = (u32)((h * 8 + key) * A_COLS * 2 + ((wm0 / 8 + (h1 ^ key)) << 4));
  if (B_ROW) f.b = (u32)((h1 * 8 + key) * B_COLS * 2 + ((wn0 / 8 + (h ^ key)) << 4));
  else f.b = (u32)((wn0 + h * 8 + key) * B_COLS * 2 + ((h1 ^ key) << 4));
  return f;
}

// Byte offset of the ldmatrix row of A row tile i (16 rows) at k16 step ks.
__device__ __forceinline__ u32 frag_a(u32 base, int i, int ks) {
  if (A_ROW) return (base ^ (((2 * ks) & 7) << 4)) + (((2 * ks) & ~7) << 4) + i * 16 * A_COLS * 2;
  return (base ^ (((2 * i) & 7) << 4)) + (((2 * i) & ~7) << 4) + ks * 16 * A_COLS * 2;
}
// Byte offset of the ldmatrix row of B column tiles j, j+1 (8 columns each; j even) at k16 step ks.
__device__ __forceinline__ u32 frag_b(u32 base, int j, int ks) {
  if (B_ROW) return (base ^ ((j & 7) << 4)) + ((j & ~7) << 4) + ks * 16 * B_COLS * 2;
  return (base ^ (((2 * ks) & 7) << 4)) + (((2 * ks) & ~7) << 4) + j * 8 * B_COLS * 2;
}

// The fragments of k16 step `ks` of the stage whose A tile is at `sa` and B tile at `sb`: A for the warp's MI
// row tiles, B for its NI column tiles.
__device__ __forceinline__ void load_frags(u32 af[MI][4], u32 bf[NI][2], u32 sa, u32 sb, int ks, frag_base f) {
#pragma unroll
  for (int i = 0; i < MI; ++i) {
    if (A_ROW) ldmatrix_x4(af[i], sa + frag_a(f.a, i, ks));
    else ldmatrix_x4_trans(af[i], sa + frag_a(f.a, i, ks));
  }
#pragma unroll
  for (int j = 0; j < NI; j += 2) {
    u32 r4[4];
    if (B_ROW) ldmatrix_x4_trans(r4, sb + frag_b(f.b, j, ks));
    else ldmatrix_x4(r4, sb + frag_b(f.b, j, ks));
    bf[j][0] = r4[0];
    bf[j][1] = r4[1];
    bf[j + 1][0] = r4[2];
    bf[j + 1][1] = r4[3];
  }
}

#if FERRY_ACC_TYPE == FERRY_SCALAR_F16
typedef u32 acc_t[MI][NI][2];
#else
typedef float acc_t[MI][NI][4];
#endif

__device__ __forceinline__ void mma_all(acc_t &acc, const u32 af[MI][4], const u32 bf[NI][2]) {
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j) {
      // Serpentine over j: consecutive mma share an A or B fragment.
      const int jj = (i & 1) ? NI - 1 - j : j;
#if FERRY_ACC_TYPE == FERRY_SCALAR_F16
      mma_f16(acc[i][jj], af[i], bf[jj]);
#else
      mma_f32<FERRY_A_TYPE>(acc[i][jj], af[i], bf[jj]);
#endif
    }
}

// The main loop's state and its two steps. A struct rather than lambdas because NVRTC treats generic lambdas as
// host code, and the steps are templates on FULL: whether the k-tile a step loads is known to exist and to lie
// inside the operands, so that its copies need no predicates.
struct mainloop {
  typedef tile_copy<A_ROW ? BM : BK, A_COLS> copy_a;
  typedef tile_copy<B_ROW ? BK : BN, B_COLS> copy_b;
  static constexpr bool a_row = A_ROW, b_row = B_ROW; // what load_stage (gemm_common.cuh) reads of the design
  static constexpr int bk = BK;
  static constexpr unsigned stage_bytes = STAGE_BYTES;

  const ferry_gemm_params &p;
  const elem *A, *B;               // the batch's operands
  const elem *a_next, *b_next;     // the thread's first chunk of the next k-tile to load
  i64 a_kstep, b_kstep;            // elements from one k-tile to the next
  u32 smem, a_dst, b_dst;          // shared window; the thread's first chunk in a stage
  int m0, n0, ktiles;
  bool inside_mn;                  // the block's tile lies inside m and n: only k can cut a copy
  int read_stage, write_stage;     // stages of k-tile kt and of k-tile kt+STAGES-1
  frag_base fb;
  u32 af[2][MI][4], bf[2][NI][2];  // fragments, double-buffered over k16 steps
  acc_t acc;

  __device__ __forceinline__ mainloop(const ferry_gemm_params &p_, const elem *A_, const elem *B_, u32 smem_, int m0_,
                                      int n0_, int wm0, int wn0, int lane)
      : p(p_), A(A_), B(B_), smem(smem_), m0(m0_), n0(n0_) {
    a_kstep = A_ROW ? (i64)BK : (i64)BK * p.lda;
    b_kstep = B_ROW ? (i64)BK * p.ldb : (i64)BK;
    a_next = A + (A_ROW ? (i64)m0 * p.lda : (i64)m0) + (i64)copy_a::row0() * p.lda + copy_a::col0();
    b_next = B + (B_ROW ? (i64)n0 : (i64)n0 * p.ldb) + (i64)copy_b::row0() * p.ldb + copy_b::col0();
    a_dst = swz<A_COLS>(copy_a::row0(), copy_a::col0());
    b_dst = A_BYTES + swz<B_COLS>(copy_b::row0(), copy_b::col0());
    ktiles = (p.k + BK - 1) / BK;
    inside_mn = m0 + BM <= p.m && n0 + BN <= p.n;
    read_stage = 0;
    write_stage = STAGES - 1;
    fb = frag_bases(wm0, wn0, lane);
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int j = 0; j < NI; ++j) {
#if FERRY_ACC_TYPE == FERRY_SCALAR_F16
        acc[i][j][0] = acc[i][j][1] = 0u;
#else
        acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;
#endif
      }
  }

  // Fills stages 0..STAGES-2 and the fragments of k-tile 0's first k16 step.
  __device__ __forceinline__ void prologue() {
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < ktiles) load_stage<false>(*this, s, s);
      cp_async_commit(); // empty groups keep the count of groups in flight the same for every iteration
    }
    cp_async_wait<STAGES - 2>();
    __syncthreads(); // k-tile 0 is in shared memory for everyone
    load_frags(af[0], bf[0], smem, smem + A_BYTES, 0, fb);
  }

  // k-tile kt: its KS k16 steps, the copy of k-tile kt+STAGES-1, and the first fragments of k-tile kt+1.
  template <bool FULL> __device__ __forceinline__ void k_tile(int kt) {
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      if (ks == KS - 1) {
        // k-tile kt+1 must have landed, for everyone, before its first fragments are read; past this barrier
        // nobody reads k-tile kt's stage again (its last fragments are in registers).
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        read_stage = read_stage + 1 == STAGES ? 0 : read_stage + 1;
      }
      const u32 sa = smem + read_stage * STAGE_BYTES;
      load_frags(af[(ks + 1) & 1], bf[(ks + 1) & 1], sa, sa + A_BYTES, (ks + 1) % KS, fb);
      if (ks == 0) {
        // Into the stage of k-tile kt-1, released by the barrier of the previous iteration.
        if (FULL || kt + STAGES - 1 < ktiles) load_stage<FULL>(*this, write_stage, kt + STAGES - 1);
        cp_async_commit();
        write_stage = write_stage + 1 == STAGES ? 0 : write_stage + 1;
      }
      mma_all(acc, af[ks & 1], bf[ks & 1]);
    }
  }

  __device__ __forceinline__ void run() {
    prologue();
    // Two loops, so that the hot one carries no predicated copies: while the k-tile to load lies inside the
    // operands, then the rest (edges, and the last STAGES-1 iterations, which load nothing).
    const int full_until = inside_mn ? p.k / BK - (STAGES - 1) : 0;
    int kt = 0;
    for (; kt < full_until; ++kt) k_tile<true>(kt);
    for (; kt < ktiles; ++kt) k_tile<false>(kt);
  }
};

extern "C" __global__ void __launch_bounds__(THREADS, 1) ferry_gemm_mma_sw(const ferry_gemm_params p) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  // The launch's dynamic shared memory is the host's computation of SMEM_BYTES: a mismatch must not corrupt.
  if (dynamic_smem_size() < SMEM_BYTES) __trap();
  int tm, tn;
  tile_of_block(p.m, p.n, BM, BN, tm, tn);
  const int m0 = tm * BM, n0 = tn * BN;
  const int z = blockIdx.z;
  const elem *A = static_cast<const elem *>(p.a) + z * p.batch_a;
  const elem *B = static_cast<const elem *>(p.b) + z * p.batch_b;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm0 = warp / WARPS_N * WM, wn0 = warp % WARPS_N * WN;

  mainloop ml(p, A, B, smem_addr(smem_raw), m0, n0, wm0, wn0, lane);
  ml.run();
  const acc_t &acc = ml.acc;
  cp_async_wait<0>(); // nothing may still be in flight into shared memory, which the epilogue reuses
  __syncthreads();    // and every warp is done reading the pipeline's stages

  // ---- epilogue -----------------------------------------------------------------------------------------------
  out_t *C = static_cast<out_t *>(p.out) + z * p.batch_c; // formed here: nothing extra lives through the loop
  const int g = lane >> 2, t = lane & 3;
  const epilogue ep = epilogue_of(p);
  if (FERRY_OUT_ROW) {
    // Per 16-row strip i: the warp's accumulators go to its staging area as fp32, then come back along rows,
    // 4 consecutive columns per lane, and leave in one store of 4 elements where aligned and in range.
    float *stage = reinterpret_cast<float *>(smem_raw) + warp * 16 * EPI_PITCH;
    const bool wide = ((unsigned long long)C % (4 * sizeof(out_t))) == 0 && (p.ldc & 3) == 0;
    constexpr int LANES_PER_ROW = WN / 4, ROWS_PER_PASS = 32 / LANES_PER_ROW;
#pragma unroll
    for (int i = 0; i < MI; ++i) {
#pragma unroll
      for (int j = 0; j < NI; ++j) {
        float v[4];
        tile_values(acc[i][j], v);
        *reinterpret_cast<f32x2 *>(stage + g * EPI_PITCH + j * 8 + 2 * t) = f32x2{v[0], v[1]};
        *reinterpret_cast<f32x2 *>(stage + (g + 8) * EPI_PITCH + j * 8 + 2 * t) = f32x2{v[2], v[3]};
      }
      __syncwarp();
#pragma unroll
      for (int pass = 0; pass < 16 / ROWS_PER_PASS; ++pass) {
        const int r = pass * ROWS_PER_PASS + lane / LANES_PER_ROW, c = lane % LANES_PER_ROW * 4;
        const f32x4 q = *reinterpret_cast<const f32x4 *>(stage + r * EPI_PITCH + c);
        const float v[4] = {q.x, q.y, q.z, q.w};
        const int row = m0 + wm0 + i * 16 + r, col = n0 + wn0 + c;
        if (wide && row < p.m && col + 3 < p.n) {
          store4(C + (i64)row * p.ldc + col, v, bias4_at(ep, row, col), ep);
        } else {
#pragma unroll
          for (int e = 0; e < 4; ++e) store_out(C, p.ldc, p.m, p.n, row, col + e, v[e], ep);
        }
      }
      __syncwarp(); // the strip is read before the next one overwrites it
    }
  } else {
    // Column-major output: element stores, as gemm_mma.cu.
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int j = 0; j < NI; ++j) {
        const int row = m0 + wm0 + i * 16 + g, col = n0 + wn0 + j * 8 + t * 2;
        float v[4];
        tile_values(acc[i][j], v);
        store_tile(C, p.ldc, p.m, p.n, row, col, v, ep);
      }
  }
}

}  // namespace ferry
