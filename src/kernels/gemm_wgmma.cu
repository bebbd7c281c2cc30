// gemm_wgmma.cu — ferry's Hopper GEMM: fp16/bf16 operands, fp32 accumulators, wgmma.mma_async (sm_90a only) with
// both operands read by the tensor cores straight from shared memory, fed by a cp.async pipeline.
//
// A block of WGS warpgroups computes a BM×BN tile (BM = 64·WGS, BN 256, 128 for FP8, or 64 for m ≤ 64: a decode
// step's skinny GEMM, one warpgroup streaming 64 columns of B); warpgroup g owns rows 64g..64g+63 and issues one
// m64nBNk16 wgmma per k16 step, so its 64×BN fp32 accumulators (BN/2 registers a thread) never leave registers
// until the epilogue. K advances BK = 64 at a time through STAGES shared buffers.
//
// Shared layout (the canonical 128-byte-swizzle layouts of the PTX ISA's "Shared Memory Matrix Layout"): each
// operand tile is stored as it lies in memory, rows of its contiguous dimension, cut into 64-element panels; a
// panel is rows of 128 bytes (64 elements), and within each 1024-byte group of 8 rows the 16-byte chunk c of row r
// sits at c ^ (r % 8). For an operand whose contiguous dimension is K (A row-major, B column-major) a panel is the
// whole tile: MN rows of one 64-element K row each — "K-major", descriptor SBO = 1024 (8 rows), the k16 step
// advances the start address by 32 bytes. Otherwise (A column-major, B row-major) rows are K and panels are 64
// elements of M or N — "MN-major" (imm-trans 1), LBO = the panel size (BK·128 bytes), SBO = 1024, the k16 step
// advances by 16 rows = 2048 bytes. The same function (panel_offset) places the cp.async chunks, so the copies and
// the descriptors agree by construction; tests/kernels/emulate_cuda.h decodes the descriptors independently, from
// the ISA's canonical-layout formulas, to check that they do.
//
// Pipeline, per k-tile kt (one barrier): wait for this thread's copies of k-tile kt, fence.proxy.async (cp.async
// writes are generic-proxy, wgmma reads are async-proxy), barrier; then copy k-tile kt+STAGES-2 into the stage that
// k-tile kt-2 used — every warpgroup waited for its wgmma of kt-2 before the barrier — and issue kt's 4 wgmma as one
// group, then wait until only that group is in flight. So the tensor cores always have the next k-tile's group queued
// while the block crosses its barrier, and copies run STAGES-2 k-tiles ahead.
//
// 8-bit operands (FP8, int8; K-major, which is all wgmma reads of them) travel as 16-bit pairs along k, as in
// gemm_mma.cu: a row of a stage is the same 128 bytes, 128 values of K, and one m64n256k32 wgmma consumes the 32
// bytes a k16 step of 16-bit operands does, so copies and descriptors are unchanged.
// FP8 sums are promoted: the tensor cores keep fewer bits of an FP8 running sum than fp32 (off by several per cent
// from fp32 over k = 4096), so each k-tile's group sums 128 values of k from zero into registers of its own, which
// are added to the fp32 accumulators when the group is done (as cuBLASLt does unless asked for fast accumulation).
// That is BN more registers a thread: FP8 tiles are at most 128 wide.
//
// Two schedules, chosen by FERRY_PERSISTENT (the design's): the plain one above, one block per output tile, every
// thread both copying and multiplying; and a persistent, warp-specialised one, one block per SM looping over tiles:
// warpgroup 0 only copies (cp.async, few registers), the others only multiply, and the two sides meet at mbarriers
// instead of block barriers. Per stage a "full" barrier completes when each copying thread's chunks have landed
// (cp.async.mbarrier.arrive) and an "empty" one when every multiplying warp's wgmma reading it is done; the copier
// runs up to STAGES k-tiles ahead, across tile boundaries, so the next tile's first stages load during this tile's
// epilogue, which stages 32 columns at a time in its own shared area. With FERRY_TMA one thread does all the
// copying: each stage is a few TMA boxes (tensor maps the host encoded, 128-byte swizzle: the layout above), whose
// bytes complete the "full" barrier; the tensor unit zero-fills what lies outside the operands, so edges need no
// code of their own. With FERRY_CLUSTER 2 (TMA only), two blocks of a cluster take two tiles one above the other,
// which read the same tile of B: each block loads half of it into both blocks' shared memory (a multicast), so B
// crosses L2 once per pair; a stage is then refilled only once the warps of both blocks have freed it.
//
// Edges and epilogue as in gemm_mma_sw.cu: predicated copies at the edges (an unpredicated loop while every k-tile
// to load lies inside the operands), accumulators staged through shared memory per warp and stored 4 elements at a
// time where aligned and in range, element stores otherwise and for column-major outputs. Operands 16-byte aligned.
#ifndef FERRY_GEMM_OUTPUT_INCLUDED
#include "gemm_output.cuh" // and through it the other shared headers
#endif

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "gemm_wgmma.cu needs the sm_90a target (wgmma): --gpu-architecture=sm_90a"
#endif

#ifndef FERRY_BM
#define FERRY_BM 128
#define FERRY_BN 256
#define FERRY_BK 64
#define FERRY_STAGES 4
#endif

namespace ferry {

#ifndef FERRY_PERSISTENT
#define FERRY_PERSISTENT 0
#endif
#ifndef FERRY_TMA
#define FERRY_TMA 0
#endif
#ifndef FERRY_CLUSTER
#define FERRY_CLUSTER 1
#endif
static_assert(!FERRY_TMA || FERRY_PERSISTENT, "TMA copies belong to the persistent schedule");
static_assert(FERRY_CLUSTER == 1 || (FERRY_CLUSTER == 2 && FERRY_TMA), "clusters of two share TMA multicasts");

constexpr int BM = FERRY_BM, BN = FERRY_BN, BK = FERRY_BK, STAGES = FERRY_STAGES;
// WGS warpgroups multiply (WARPS warps); the persistent schedule adds one that copies.
constexpr int WGS = BM / 64, WARPS = WGS * 4, THREADS = (WGS + FERRY_PERSISTENT) * 128;
constexpr int COPY_THREADS = FERRY_PERSISTENT ? 128 : THREADS;
constexpr int KS = BK / 16;
constexpr bool A_ROW = FERRY_A_ROW, B_ROW = FERRY_B_ROW;
constexpr unsigned A_BYTES = BM * BK * 2, B_BYTES = BN * BK * 2, STAGE_BYTES = A_BYTES + B_BYTES;
constexpr unsigned PIPE_BYTES = STAGES * STAGE_BYTES;
// Epilogue staging: per warp, its 16 rows of EPI_COLS fp32 values, pitch EPI_COLS + 8 (conflict-free float2
// writes). The plain schedule stages whole rows in the pipeline's space once the main loop is over; the persistent
// one has a space of its own, since the next tile's stages are loading meanwhile, and stages 32 columns at a time.
constexpr int EPI_COLS = FERRY_PERSISTENT ? 32 : BN, EPI_PITCH = EPI_COLS + 8;
constexpr unsigned EPI_BYTES = WARPS * 16 * EPI_PITCH * 4;
constexpr bool TMA = FERRY_TMA;
constexpr int CLUSTER = FERRY_CLUSTER;
constexpr unsigned BARRIER_BYTES = FERRY_PERSISTENT ? 2 * STAGES * 8 : 0; // a full and an empty mbarrier a stage
// +1024: the swizzle atoms must start on 1024-byte boundaries; the kernel aligns the dynamic area up itself.
constexpr unsigned SMEM_BYTES = (FERRY_PERSISTENT ? PIPE_BYTES + EPI_BYTES + BARRIER_BYTES
                                                  : (PIPE_BYTES > EPI_BYTES ? PIPE_BYTES : EPI_BYTES)) +
                                1024; // registry.c mirrors this

#if FERRY_NARROW_INPUTS
static_assert(A_ROW && !B_ROW, "wgmma reads 8-bit operands K-major only");
static_assert(FERRY_ACC_TYPE == (FERRY_A_TYPE == FERRY_SCALAR_I8 ? FERRY_SCALAR_I32 : FERRY_SCALAR_F32),
              "FP8 accumulates in fp32, int8 in int32");
typedef narrow_acc acc_t;
// Hopper's FP8 wgmma keeps fewer bits of its running sum than fp32 (int8's int32 sums are exact): each k-tile's
// group accumulates from zero into a set of its own, added to the fp32 accumulators once the group is done.
[[maybe_unused]] constexpr bool PROMOTE = FERRY_A_TYPE != FERRY_SCALAR_I8;
static_assert(!PROMOTE || BN <= 128, "promoted FP8 sums: BN accumulator registers a thread");
#else
[[maybe_unused]] constexpr bool PROMOTE = false;
static_assert(FERRY_A_TYPE == FERRY_B_TYPE && (FERRY_A_TYPE == FERRY_SCALAR_F16 || FERRY_A_TYPE == FERRY_SCALAR_BF16),
              "the tensor-core GEMM takes two fp16 or two bf16 operands, or two 8-bit ones");
static_assert(FERRY_ACC_TYPE == FERRY_SCALAR_F32, "wgmma accumulates in fp32 here");
typedef float acc_t;
#endif
static_assert(BK == 64, "one 128-byte swizzle row of K per row of a K-major tile");
static_assert(BM % 64 == 0 && (BN == 256 || BN == 128 || BN == 64),
              "warpgroups of 64 rows, one m64nBNk16 each (BN 256, 128 or 64)");
static_assert(STAGES >= 3, "copies run STAGES-2 k-tiles ahead of the wgmma");
static_assert(A_BYTES % 1024 == 0 && B_BYTES % 1024 == 0, "every tile starts on a 1024-byte swizzle boundary");

typedef u16 elem;

// Byte offset of element (r, c) of a ROWS×COLS tile (COLS contiguous) in its panel layout: 64-column panels of
// ROWS rows of 128 bytes, 16-byte chunks swizzled with the row within each group of 8 rows.
template <int ROWS> __device__ __forceinline__ u32 panel_offset(int r, int c) {
  return (u32)((c >> 6) * (ROWS * 128) + r * 128 + ((((c >> 3) ^ r) & 7) << 4) + (c & 7) * 2);
}

// A ROWS×COLS tile's copies by the COPY_THREADS copying threads, each the same 16-byte chunk of rows r0, r0+STEP,
// ... When STEP is a multiple of 8 every chunk has the first one's swizzle key and lies a constant further on; a
// 256-wide tile copied by 128 threads has STEP 4, and every other chunk's key differs in bit 2.
template <int ROWS, int COLS> struct tile_copy {
  static constexpr int CHUNKS_PER_ROW = COLS / 8, STEP = COPY_THREADS / CHUNKS_PER_ROW, N = ROWS / STEP;
  static_assert(COPY_THREADS % CHUNKS_PER_ROW == 0 && ROWS % STEP == 0 && STEP % 4 == 0, "tile split");
  static __device__ __forceinline__ int row0() { return threadIdx.x / CHUNKS_PER_ROW; }
  static __device__ __forceinline__ int col0() { return threadIdx.x % CHUNKS_PER_ROW * 8; }
  static __device__ __forceinline__ u32 dst0() { return panel_offset<ROWS>(row0(), col0()); }
  // Chunk i's destination from chunk 0's.
  static __device__ __forceinline__ u32 offset(int i) {
    if (STEP % 8 == 0) return i * STEP * 128;
    return panel_offset<ROWS>(row0() + i * STEP, col0()) - dst0();
  }

  static __device__ __forceinline__ void full(u32 dst, const elem *src, i64 ld) {
#pragma unroll
    for (int i = 0; i < N; ++i) cp_async16(dst + offset(i), src + i * STEP * ld);
  }
  static __device__ __forceinline__ void edge(u32 dst, const elem *src, const elem *in_range, i64 ld,
                                              int rows_left, int cols_left) {
    const int c_valid = max(0, min(cols_left, 8));
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const int n = i * STEP < rows_left ? c_valid : 0;
      cp_async<16>(dst + offset(i), n ? src + i * STEP * ld : in_range, n * 2);
    }
  }
};

// Shared-memory matrix descriptor, 128-byte swizzle: start, leading and stride byte offsets, each >> 4.
__device__ __forceinline__ unsigned long long smem_desc(u32 addr, u32 lbo, u32 sbo) {
  return (unsigned long long)((addr & 0x3ffffu) >> 4) | (unsigned long long)((lbo & 0x3ffffu) >> 4) << 16 |
         (unsigned long long)((sbo & 0x3ffffu) >> 4) << 32 | 1ull << 62;
}

// Warpgroup wg's A (rows 64wg..64wg+63) and the block's B, at k16 step ks of the stage whose tiles start at sa, sb.
__device__ __forceinline__ unsigned long long desc_a(u32 sa, int wg, int ks) {
  if (A_ROW) return smem_desc(sa + wg * 64 * 128 + ks * 32, 16, 1024);  // K-major: LBO unused (1)
  return smem_desc(sa + wg * BK * 128 + ks * 16 * 128, BK * 128, 1024); // M-major: panel wg
}
__device__ __forceinline__ unsigned long long desc_b(u32 sb, int ks) {
  if (!B_ROW) return smem_desc(sb + ks * 32, 16, 1024);
  return smem_desc(sb + ks * 16 * 128, BK * 128, 1024);
}

// Warpgroup wg's four k16 steps over the stage whose tiles start at sa, sb, issued as one wgmma group.
__device__ __forceinline__ void mma_stage(acc_t (&acc)[BN / 2], u32 sa, u32 sb, int wg) {
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) wgmma_fence_operand(acc[i]);
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < KS; ++ks) {
#if FERRY_NARROW_INPUTS
    wgmma_k32(acc, desc_a(sa, wg, ks), desc_b(sb, ks));
#else
    wgmma_k16<FERRY_A_TYPE, A_ROW ? 0 : 1, B_ROW ? 1 : 0>(acc, desc_a(sa, wg, ks), desc_b(sb, ks));
#endif
  }
  wgmma_commit();
}

#if !FERRY_PERSISTENT

struct mainloop {
  typedef tile_copy<A_ROW ? BM : BK, A_ROW ? BK : BM> copy_a;
  typedef tile_copy<B_ROW ? BK : BN, B_ROW ? BN : BK> copy_b;
  static constexpr bool a_row = A_ROW, b_row = B_ROW; // what load_stage (gemm_common.cuh) reads of the design
  static constexpr int bk = BK;
  static constexpr unsigned stage_bytes = STAGE_BYTES;

  const ferry_gemm_params &p;
  const elem *A, *B;
  const elem *a_next, *b_next; // the thread's first chunk of the next k-tile to load
  i64 a_kstep, b_kstep;
  u32 smem, a_dst, b_dst;
  int m0, n0, ktiles, wg;
  bool inside_mn;
  int read_stage, write_stage;
  acc_t acc[BN / 2]; // this thread's part of the warpgroup's 64×BN accumulators
  acc_t part[BN / 2]; // PROMOTE: the sums of the k-tile in flight (otherwise unused, and compiled away)

  __device__ __forceinline__ mainloop(const ferry_gemm_params &p_, const elem *A_, const elem *B_, u32 smem_, int m0_,
                                      int n0_)
      : p(p_), A(A_), B(B_), smem(smem_), m0(m0_), n0(n0_) {
    a_kstep = A_ROW ? (i64)BK : (i64)BK * p.lda;
    b_kstep = B_ROW ? (i64)BK * p.ldb : (i64)BK;
    a_next = A + (A_ROW ? (i64)m0 * p.lda : (i64)m0) + (i64)copy_a::row0() * p.lda + copy_a::col0();
    b_next = B + (B_ROW ? (i64)n0 : (i64)n0 * p.ldb) + (i64)copy_b::row0() * p.ldb + copy_b::col0();
    a_dst = copy_a::dst0();
    b_dst = A_BYTES + copy_b::dst0();
    ktiles = (p.k + BK - 1) / BK;
    inside_mn = m0 + BM <= p.m && n0 + BN <= p.n;
    wg = threadIdx.x / 128;
    read_stage = 0;
    write_stage = STAGES - 2;
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = 0;
    if constexpr (PROMOTE) {
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) part[i] = 0;
    }
  }

  // k-tile kt. FULL: the k-tile it copies (kt+STAGES-2) exists and lies inside the operands.
  template <bool FULL> __device__ __forceinline__ void k_tile(int kt) {
    cp_async_wait<STAGES - 3>(); // this thread's copies of k-tile kt have landed
    fence_proxy_async_shared();  // ... and are visible to the tensor cores' (async) proxy
    __syncthreads();             // everyone's are; every warpgroup is done with k-tile kt-2's stage
    if (FULL || kt + STAGES - 2 < ktiles) load_stage<FULL>(*this, write_stage, kt + STAGES - 2);
    cp_async_commit();
    write_stage = write_stage + 1 == STAGES ? 0 : write_stage + 1;

    const u32 sa = smem + read_stage * STAGE_BYTES, sb = sa + A_BYTES;
    if constexpr (PROMOTE) {
      // The group's sums are added once it is done, so it runs alone: the next k-tile's group queues behind the
      // other warpgroup's instead (a second set of sums to overlap them is more registers than a thread has).
      mma_stage(part, sa, sb, wg);
      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) {
        wgmma_fence_operand(part[i]);
        acc[i] += part[i];
        part[i] = 0;
      }
    } else {
      mma_stage(acc, sa, sb, wg);
      wgmma_wait<1>(); // k-tile kt-1's group is done: its stage may be refilled after the next barrier
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) wgmma_fence_operand(acc[i]);
    }
    read_stage = read_stage + 1 == STAGES ? 0 : read_stage + 1;
  }

  __device__ __forceinline__ void run() {
#pragma unroll
    for (int s = 0; s < STAGES - 2; ++s) {
      if (s < ktiles) load_stage<false>(*this, s, s);
      cp_async_commit(); // empty groups keep the count of groups in flight the same for every iteration
    }
    const int full_until = inside_mn ? p.k / BK - (STAGES - 2) : 0;
    int kt = 0;
    for (; kt < full_until; ++kt) k_tile<true>(kt);
    for (; kt < ktiles; ++kt) k_tile<false>(kt);
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) wgmma_fence_operand(acc[i]);
  }
};

extern "C" __global__ void __launch_bounds__(THREADS, 1) ferry_gemm_wgmma(const ferry_gemm_params params) {
  const ferry_gemm_params p = in_pairs(params);
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  if (dynamic_smem_size() < SMEM_BYTES) __trap();
  // The swizzle atoms need 1024-byte alignment of the shared address; SMEM_BYTES has the slack for it.
  const u32 raw = smem_addr(smem_raw), smem = (raw + 1023u) & ~1023u;
  unsigned char *smem_aligned = smem_raw + (smem - raw);

  int tm, tn;
  tile_of_block(p.m, p.n, BM, BN, tm, tn);
  const int m0 = tm * BM, n0 = tn * BN;
  const int z = blockIdx.z;
  const elem *A = static_cast<const elem *>(p.a) + z * p.batch_a;
  const elem *B = static_cast<const elem *>(p.b) + z * p.batch_b;

  mainloop ml(p, A, B, smem, m0, n0);
  ml.run();
  cp_async_wait<0>(); // nothing in flight into the stages the epilogue reuses
  __syncthreads();

  // ---- epilogue: warp w of warpgroup g holds rows 64g + 16(w%4) + {lane/4, lane/4 + 8}, columns 8j + 2(lane%4)
  // + {0, 1} for j < 32: acc[4j..4j+3] (the mma.sync C layout, repeated along N).
  out_t *C = static_cast<out_t *>(p.out) + z * p.batch_c;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  const int row0 = m0 + (warp / 4) * 64 + (warp % 4) * 16;
  const epilogue ep = epilogue_of(p);
  const sum_t *acc = ml.acc;
  if (FERRY_OUT_ROW) {
    sum_t *stage = reinterpret_cast<sum_t *>(smem_aligned) + warp * 16 * EPI_PITCH;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      *reinterpret_cast<sum2 *>(stage + g * EPI_PITCH + j * 8 + 2 * t) = sum2{acc[4 * j], acc[4 * j + 1]};
      *reinterpret_cast<sum2 *>(stage + (g + 8) * EPI_PITCH + j * 8 + 2 * t) = sum2{acc[4 * j + 2], acc[4 * j + 3]};
    }
    __syncwarp();
    const bool wide = ((unsigned long long)C % (4 * sizeof(out_t))) == 0 && (p.ldc & 3) == 0;
    constexpr int CHUNKS = 16 * BN / 4; // float4 chunks of the warp's 16 rows
#pragma unroll 4
    for (int idx = lane; idx < CHUNKS; idx += 32) {
      const int r = idx / (BN / 4), c = idx % (BN / 4) * 4;
      const sum4 q = *reinterpret_cast<const sum4 *>(stage + r * EPI_PITCH + c);
      const sum_t v[4] = {q.x, q.y, q.z, q.w};
      const int row = row0 + r, col = n0 + c;
      if (wide && row < p.m && col + 3 < p.n) {
        store4(C + (i64)row * p.ldc + col, v, bias4_at(ep, row, col), ep);
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) store_out(C, p.ldc, p.m, p.n, row, col + e, v[e], ep);
      }
    }
  } else {
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      const int row = row0 + g, col = n0 + j * 8 + t * 2;
      store_tile(C, p.ldc, p.m, p.n, row, col, acc + 4 * j, ep);
    }
  }
}

#else // FERRY_PERSISTENT

// The copying warpgroup's state: where the next k-tile of A and B comes from and goes to (what load_stage,
// gemm_common.cuh, reads), for the output tile begun last. The plain schedule's mainloop sets up the same in its
// constructor; sharing this with it reorders the plain kernel's machine code, measured as it is.
struct tile_loader {
  typedef tile_copy<A_ROW ? BM : BK, A_ROW ? BK : BM> copy_a;
  typedef tile_copy<B_ROW ? BK : BN, B_ROW ? BN : BK> copy_b;
  static constexpr bool a_row = A_ROW, b_row = B_ROW;
  static constexpr int bk = BK;
  static constexpr unsigned stage_bytes = STAGE_BYTES;

  const ferry_gemm_params &p;
  const elem *A, *B;
  const elem *a_next, *b_next; // the thread's first chunk of the next k-tile to load
  i64 a_kstep, b_kstep;
  u32 smem, a_dst, b_dst;
  int m0, n0;
  bool inside_mn;

  __device__ __forceinline__ tile_loader(const ferry_gemm_params &p_, u32 smem_) : p(p_), smem(smem_) {
    a_kstep = A_ROW ? (i64)BK : (i64)BK * p.lda;
    b_kstep = B_ROW ? (i64)BK * p.ldb : (i64)BK;
    a_dst = copy_a::dst0();
    b_dst = A_BYTES + copy_b::dst0();
  }
  // Output tile (m0_, n0_) of batch z, from its first k-tile.
  __device__ __forceinline__ void begin(int z, int m0_, int n0_) {
    m0 = m0_, n0 = n0_;
    A = static_cast<const elem *>(p.a) + z * p.batch_a;
    B = static_cast<const elem *>(p.b) + z * p.batch_b;
    a_next = A + (A_ROW ? (i64)m0 * p.lda : (i64)m0) + (i64)copy_a::row0() * p.lda + copy_a::col0();
    b_next = B + (B_ROW ? (i64)n0 : (i64)n0 * p.ldb) + (i64)copy_b::row0() * p.ldb + copy_b::col0();
    inside_mn = m0 + BM <= p.m && n0 + BN <= p.n;
  }
};

// The output tile (m0, n0) of batch z from warp `warp`'s accumulators, laid out as in the plain schedule's epilogue.
// Row-major outputs go through `staging` (the warp's 16 × EPI_PITCH fp32), EPI_COLS columns at a time, and leave it
// 4 elements a store where aligned and in range.
__device__ __forceinline__ void store_accumulators(const ferry_gemm_params &p, const acc_t (&accs)[BN / 2], int z,
                                                   int m0, int n0, int warp, sum_t *staging) {
  out_t *C = static_cast<out_t *>(p.out) + z * p.batch_c;
  const int lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  const int row0 = m0 + (warp / 4) * 64 + (warp % 4) * 16;
  const epilogue ep = epilogue_of(p);
  const sum_t *acc = accs;
  if (FERRY_OUT_ROW) {
    const bool wide = ((unsigned long long)C % (4 * sizeof(out_t))) == 0 && (p.ldc & 3) == 0;
#pragma unroll
    for (int c0 = 0; c0 < BN; c0 += EPI_COLS) {
#pragma unroll
      for (int jj = 0; jj < EPI_COLS / 8; ++jj) {
        const int j = c0 / 8 + jj;
        *reinterpret_cast<sum2 *>(staging + g * EPI_PITCH + jj * 8 + 2 * t) = sum2{acc[4 * j], acc[4 * j + 1]};
        *reinterpret_cast<sum2 *>(staging + (g + 8) * EPI_PITCH + jj * 8 + 2 * t) =
            sum2{acc[4 * j + 2], acc[4 * j + 3]};
      }
      __syncwarp();
      constexpr int CHUNKS = 16 * EPI_COLS / 4; // 4-element chunks of the warp's 16 rows
      static_assert(32 % (EPI_COLS / 4) == 0, "a lane stores the same 4 columns of every row it takes");
      const int lane_col = n0 + c0 + lane % (EPI_COLS / 4) * 4;
      // A row bias (n values) of the lane's columns, read once for its 4 rows; none past n (no wide store there).
      const bias4 lane_bias = FERRY_BIAS == 1 && lane_col + 3 < p.n ? bias4_at(ep, 0, lane_col) : bias4{};
#pragma unroll 4
      for (int idx = lane; idx < CHUNKS; idx += 32) {
        const int r = idx / (EPI_COLS / 4), c = idx % (EPI_COLS / 4) * 4;
        const sum4 q = *reinterpret_cast<const sum4 *>(staging + r * EPI_PITCH + c);
        const sum_t v[4] = {q.x, q.y, q.z, q.w};
        const int row = row0 + r, col = n0 + c0 + c;
        if (wide && row < p.m && col + 3 < p.n) {
          store4(C + (i64)row * p.ldc + col, v, FERRY_BIAS == 1 ? lane_bias : bias4_at(ep, row, col), ep);
        } else {
#pragma unroll
          for (int e = 0; e < 4; ++e) store_out(C, p.ldc, p.m, p.n, row, col + e, v[e], ep);
        }
      }
      __syncwarp(); // read before the next columns overwrite it
    }
  } else {
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      const int row = row0 + g, col = n0 + j * 8 + t * 2;
      store_tile(C, p.ldc, p.m, p.n, row, col, acc + 4 * j, ep);
    }
  }
}

// Registers per thread after the hand-over: 128 copying threads at COPY_REGS and the multiplying ones at
// MMA_REGS, within what the block was launched with: its whole share of the 64K register file (168 a thread for
// 384 threads; the host refuses a kernel given fewer, since setmaxnreg.inc would then wait forever).
constexpr int COPY_REGS = 56, MMA_REGS = 224;
static_assert(128 * COPY_REGS + WARPS * 32 * MMA_REGS <= THREADS * (65536 / THREADS / 8 * 8), "the register file");
static_assert(WGS == 2 && (BN == 256 || BN == 128),
              "the register split assumes one copying and two multiplying warpgroups");

// The grid is at most one block per SM; block b takes tiles b, b + gridDim.x, ... of all batches (tile index
// t: batch t / tiles, then tile_of_index's order within it). Both sides walk the same sequence. In a cluster the
// unit is a CLUSTER·BM × BN tile, cluster c taking c, c + gridDim.x / CLUSTER, ..., and block `rank` its rows
// rank·BM.. (past m for the second block of a last, half-empty one: it loads and multiplies zeros, and stores
// nothing), so the cluster's blocks walk in step, as their shared copies need.
struct tile_walk {
  int tiles, rank;
  i64 total, t;
  __device__ __forceinline__ tile_walk(const ferry_gemm_params &p, int rank_)
      : tiles(((p.m + CLUSTER * BM - 1) / (CLUSTER * BM)) * ((p.n + BN - 1) / BN)), rank(rank_),
        total((i64)tiles * p.l), t(blockIdx.x / CLUSTER) {}
  __device__ __forceinline__ bool next(const ferry_gemm_params &p, int &z, int &m0, int &n0) {
    if (t >= total) return false;
    int tm, tn;
    z = (int)(t / tiles);
    tile_of_index(p.m, p.n, CLUSTER * BM, BN, (int)(t % tiles), tm, tn);
    m0 = tm * CLUSTER * BM + rank * BM, n0 = tn * BN;
    t += gridDim.x / CLUSTER;
    return true;
  }
};

// TMA: k-tile k0 (in the tile's own elements: pairs for 8-bit operands) of output tile (m0, n0) into the stage at
// sa, as boxes of 64 contiguous elements (128 bytes) by the tile's rows: one box for a K-major tile, one per
// 64-wide panel for an MN-major one (panel_offset's layout). za, zb: the operands' batches (0 when broadcast). In a
// cluster the blocks share B's tile: block `rank` loads its share of it (half of a K-major tile's rows, whose box
// the host made that tall, or half of the panels) into every block of the cluster.
__device__ __forceinline__ void tma_stage(const tma_maps &maps, u32 sa, int za, int zb, int m0, int n0, int k0,
                                          u32 bar, int rank) {
  if (A_ROW) {
    tma_load(sa, &maps.a, k0, m0, za, bar);
  } else {
#pragma unroll
    for (int i = 0; i < BM / 64; ++i) tma_load(sa + i * BK * 128, &maps.a, m0 + 64 * i, k0, za, bar);
  }
  const u32 sb = sa + A_BYTES;
  if constexpr (CLUSTER > 1) {
    constexpr u16 every_block = (1u << CLUSTER) - 1;
    if (!B_ROW) {
      constexpr int ROWS = BN / CLUSTER;
      tma_load_multicast(sb + rank * ROWS * 128, &maps.b, k0, n0 + rank * ROWS, zb, bar, every_block);
    } else {
      constexpr int PANELS = BN / 64 / CLUSTER;
      static_assert(PANELS * 64 * CLUSTER == BN, "whole panels of B per block of the cluster");
#pragma unroll
      for (int j = 0; j < PANELS; ++j) {
        const int i = rank * PANELS + j;
        tma_load_multicast(sb + i * BK * 128, &maps.b, n0 + 64 * i, k0, zb, bar, every_block);
      }
    }
  } else if (!B_ROW) {
    tma_load(sb, &maps.b, k0, n0, zb, bar);
  } else {
#pragma unroll
    for (int i = 0; i < BN / 64; ++i) tma_load(sb + i * BK * 128, &maps.b, n0 + 64 * i, k0, zb, bar);
  }
}

#if FERRY_CLUSTER > 1 // the cluster's shape is the kernel's own: the host launches it as any other, an even grid
#define FERRY_CLUSTER_DIMS __cluster_dims__(FERRY_CLUSTER, 1, 1)
#else
#define FERRY_CLUSTER_DIMS
#endif

#if FERRY_TMA
extern "C" __global__ void __launch_bounds__(THREADS, 1) FERRY_CLUSTER_DIMS
    ferry_gemm_wgmma(const ferry_gemm_params params, const __grid_constant__ tma_maps maps) {
#else
extern "C" __global__ void __launch_bounds__(THREADS, 1) ferry_gemm_wgmma(const ferry_gemm_params params) {
#endif
  const ferry_gemm_params p = in_pairs(params);
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  if (dynamic_smem_size() < SMEM_BYTES) __trap();
  const u32 raw = smem_addr(smem_raw), smem = (raw + 1023u) & ~1023u;
  unsigned char *smem_aligned = smem_raw + (smem - raw);
  // Stage s is loaded when full(s) completes a phase (one arrival per copying thread, when its chunks have landed)
  // and may be refilled when empty(s) does (one arrival per multiplying warp, when its wgmma reading it is done; in
  // a cluster, per multiplying warp of every block, since each block's copies also land in the others).
  const u32 bars = smem + PIPE_BYTES + EPI_BYTES;
  auto full = [bars](int s) { return bars + 8u * (u32)s; };
  auto empty = [bars](int s) { return bars + 8u * (u32)(STAGES + s); };
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full(s), TMA ? 1 : COPY_THREADS); // TMA: the copying thread's arrival, then the boxes' bytes
      mbar_init(empty(s), WARPS * CLUSTER);
    }
    if (TMA) fence_proxy_async_shared(); // the initialised barriers, before the tensor unit completes bytes on them
    if (CLUSTER > 1) fence_mbarrier_init_cluster(); // and before the other blocks arrive or multicast on them
  }
  int rank = 0;
  if constexpr (CLUSTER > 1) {
    rank = cluster_rank();
    cluster_sync();
  } else {
    __syncthreads();
  }
  const int ktiles = (p.k + BK - 1) / BK;
  tile_walk walk(p, rank);
  int z, m0, n0;
  int stage = 0;
  u32 phase = 0; // parity of the stage's current phase, flipped at each pass over the stages

  if (threadIdx.x < COPY_THREADS) {
    setmaxnreg_dec<COPY_REGS>();
#if FERRY_TMA
    if (threadIdx.x != 0) return; // one thread issues every box
    tma_prefetch(&maps.a);
    tma_prefetch(&maps.b);
    while (walk.next(p, z, m0, n0)) {
      const int za = p.batch_a ? z : 0, zb = p.batch_b ? z : 0;
      for (int kt = 0; kt < ktiles; ++kt) {
        mbar_wait(empty(stage), phase ^ 1);
        mbar_arrive_expect_tx(full(stage), STAGE_BYTES);
        tma_stage(maps, smem + stage * STAGE_BYTES, za, zb, m0, n0, kt * BK, full(stage), rank);
        if (++stage == STAGES) stage = 0, phase ^= 1;
      }
    }
#else
    tile_loader loader(p, smem);
    while (walk.next(p, z, m0, n0)) {
      loader.begin(z, m0, n0);
      for (int kt = 0; kt < ktiles; ++kt) {
        mbar_wait(empty(stage), phase ^ 1); // the first pass finds every stage free
        load_stage<false>(loader, stage, kt);
        cp_async_mbar_arrive(full(stage));
        if (++stage == STAGES) stage = 0, phase ^= 1;
      }
    }
#endif
    // Not gone before the last copies have landed and been read: every stage's last fill released (in a cluster,
    // by every block's warps: so no other block's arrival or copy can still target this block once it is gone).
    for (int s = 0; s < STAGES; ++s) {
      mbar_wait(empty(stage), phase ^ 1);
      if (++stage == STAGES) stage = 0, phase ^= 1;
    }
    return;
  }

  setmaxnreg_inc<MMA_REGS>();
  const int warp = threadIdx.x / 32 - COPY_THREADS / 32, wg = warp / 4, lane = threadIdx.x % 32;
  sum_t *staging = reinterpret_cast<sum_t *>(smem_aligned + PIPE_BYTES) + warp * 16 * EPI_PITCH;
  acc_t acc[BN / 2];
  // PROMOTE: two sets of a k-tile's sums, one being summed by the tensor cores while the other, done, is added to
  // acc (otherwise unused, and compiled away). In flight: the groups reading stages `older` (the earlier) and `newer`.
  acc_t sums0[BN / 2], sums1[BN / 2];
  int older = -1, newer = -1;
  // Frees stage s for the copier (lane 0 for its warp): in a cluster, in every block, whose copies fill it here too.
  auto release = [&](int s) {
    if (lane != 0) return;
    if constexpr (CLUSTER > 1) {
#pragma unroll
      for (int r = 0; r < CLUSTER; ++r) mbar_arrive_cluster(cluster_map(empty(s), r));
    } else {
      mbar_arrive(empty(s));
    }
  };
  // Issues the next k-tile's group into `set`, once its stage has landed.
  auto issue = [&](acc_t (&set)[BN / 2]) {
    mbar_wait(full(stage), phase);
    if (!TMA) fence_proxy_async_shared(); // cp.async's copies (generic proxy) before the tensor cores' reads (async)
    const u32 sa = smem + stage * STAGE_BYTES;
    mma_stage(set, sa, sa + A_BYTES, wg);
    older = newer, newer = stage;
    if (++stage == STAGES) stage = 0, phase ^= 1;
  };
  // Adds the group before the newest one, whose sums are `set`, once it is done, and frees its stage.
  auto retire = [&](acc_t (&set)[BN / 2]) {
    wgmma_wait<1>();
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) wgmma_fence_operand(set[i]);
    release(older);
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) {
      acc[i] += set[i];
      set[i] = 0;
    }
  };
  // Adds the last group, whose sums are `set`, once it is done, and frees its stage.
  auto finish = [&](acc_t (&set)[BN / 2]) {
    wgmma_wait<0>();
    release(newer);
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) {
      wgmma_fence_operand(set[i]);
      acc[i] += set[i];
    }
  };
  while (walk.next(p, z, m0, n0)) {
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = 0;
    if constexpr (PROMOTE) {
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) sums0[i] = sums1[i] = 0;
      // Even k-tiles sum into sums0, odd ones into sums1: each set is added while the next group runs. Every trip
      // of the loop and each tail names its sets statically: where it cannot tell which set is in flight, ptxas
      // serialises the groups (warning C7514) or moves the sets to the stack.
      if (ktiles > 0) {
        issue(sums0);
        int kt = 1;
        for (; kt + 1 < ktiles; kt += 2) {
          issue(sums1);
          retire(sums0);
          issue(sums0);
          retire(sums1);
        }
        if (kt < ktiles) {
          issue(sums1);
          retire(sums0);
          finish(sums1);
        } else {
          finish(sums0);
        }
      }
    } else {
      int in_flight = -1; // the stage the last wgmma group reads
      for (int kt = 0; kt < ktiles; ++kt) {
        mbar_wait(full(stage), phase);
        if (!TMA) fence_proxy_async_shared();
        const u32 sa = smem + stage * STAGE_BYTES;
        mma_stage(acc, sa, sa + A_BYTES, wg);
        wgmma_wait<1>(); // the group before this one is done with its stage
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) wgmma_fence_operand(acc[i]);
        if (in_flight >= 0) release(in_flight);
        in_flight = stage;
        if (++stage == STAGES) stage = 0, phase ^= 1;
      }
      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) wgmma_fence_operand(acc[i]);
      if (in_flight >= 0) release(in_flight);
    }
    if (CLUSTER == 1 || m0 < p.m) store_accumulators(p, acc, z, m0, n0, warp, staging);
  }
}

#endif // FERRY_PERSISTENT

}  // namespace ferry
