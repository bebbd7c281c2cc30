// emulate_cuda.h — runs ferry's CUDA C GEMM kernels on the CPU, so that their indexing, pipelining and
// synchronisation can be checked on a machine without a GPU (tests/kernels/emulate_gemm.cpp drives it).
//
// Every CUDA thread of a block is a fiber (ucontext) on one OS thread; a scheduler runs each ready fiber until it
// blocks at a barrier, in an order shuffled per round from a seed, holding random warps back for a round, so a
// thread that is missing a barrier reads memory before (or after) the others wrote it. Warp-wide instructions (ldmatrix, mma) are collectives: each lane
// deposits its operands, the last lane to arrive computes every lane's result from the PTX ISA's fragment layouts,
// then the warp goes on. Each case runs twice: cp.async copies performed at issue and wgmma only when its group is
// waited for (catches a copy into a stage that another warp or an unfinished wgmma is still reading), then copies
// performed only when the issuing thread waits for its group and wgmma at issue (catches a read of a stage that
// has not landed for every thread). Shared memory starts as 0xff bytes (NaN in 16-bit and fp32), every
// shared access and every cp.async source is bounds-checked, and a kernel must leave no copy in flight.
//
// This header replaces the device part of gemm_common.cuh (its helpers are inline PTX): it provides the same
// names, with the same semantics, in plain C++. What the kernels share that is plain C++ already (gemm_kind.cuh,
// gemm_common.cuh's stage copy, gemm_output.cuh) it includes as it is, and the kernel file is included unchanged.
#ifndef FERRY_EMULATE_CUDA_H
#define FERRY_EMULATE_CUDA_H

#include <setjmp.h>
#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <random>
#include <vector>

// ---- CUDA's keywords and built-ins ---------------------------------------------------------------------------

#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__
#define __grid_constant__
#define __align__(n) __attribute__((aligned(n)))

struct emu_dim3 {
  unsigned x, y, z;
};

inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline float __uint_as_float(unsigned u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
inline unsigned __float_as_uint(float f) {
  unsigned u;
  memcpy(&u, &f, 4);
  return u;
}

// The kernels' `extern __shared__ unsigned char smem_raw[]`: the shared memory of the block running (of the first
// block of a cluster; emulate.sh has gemm_wgmma.cu ask emu::smem_here() instead, which knows the second).
namespace ferry {
alignas(1024) inline unsigned char smem_raw[232448];
}

namespace emu {

[[noreturn]] inline void fail(const char *what) {
  fprintf(stderr, "EMULATION FAILURE: %s\n", what);
  exit(2);
}

struct copy {
  uint32_t dst;
  const unsigned char *src;
  int bytes, src_bytes;
};

enum { READY, AT_BLOCK_BARRIER, AT_CLUSTER_BARRIER, AT_WARP_BARRIER, AT_WARPGROUP_BARRIER, AT_MBARRIER, DONE };

struct fiber {
  ucontext_t ctx;                         // how it starts
  jmp_buf jb;                             // where it continues (switches by _setjmp/_longjmp: no signal-mask
  bool started;                           // system call per switch, as swapcontext would make)
  std::vector<char> stack;
  emu_dim3 tid;
  int cta;                                // its block's rank in the cluster (0 outside clusters)
  int index;                              // cta · threads + tid.x: its warp is index / 32 among all the cluster's
  int state;
  std::vector<copy> open;                 // cp.async issued since the last commit
  std::deque<std::vector<copy>> groups;   // committed, not yet waited for
  uint32_t waits_on;                      // AT_MBARRIER: the barrier's address
};

// An mbarrier (gemm_wgmma.cu's persistent schedule): arrivals still expected in the current phase, the bytes of
// transactions (TMA) expected and not yet landed, and the number of phases completed. A phase completes when both
// are down to zero.
struct mbarrier {
  int expected, pending;
  long long tx;
  unsigned completed;
};

// cp.async.mbarrier.arrive: the copies a thread issued before it, and the arrival that follows their landing, in
// flight together until the scheduler lands them at a random later point. A TMA box lands the same way, and its
// bytes complete transactions on the barrier instead of an arrival (tx_bytes > 0).
struct async_arrival {
  std::vector<copy> copies;
  uint32_t bar;
  long long tx_bytes;
  int cta;  // the block whose shared memory and mbarrier they land in
  int from; // the block that issued them
};

struct range {
  const unsigned char *begin, *end;
};

// One block's world, or one cluster's: its blocks run together, their threads' fibers side by side.
constexpr int MAX_CTAS = 2, MAX_WARPS = 64;
struct cta_state {
  emu_dim3 block;
  int block_arrived;
  int running;    // its threads not yet exited: once none is, nothing may land in its shared memory
  bool published; // a cluster barrier came after its last mbarrier.init: the other blocks may use its mbarriers
  std::vector<std::pair<uint32_t, mbarrier>> mbarriers; // by shared address
};
alignas(1024) inline unsigned char smem_second[sizeof ferry::smem_raw]; // the second block of a cluster's
inline fiber *cur;
inline ucontext_t scheduler;
inline jmp_buf scheduler_jb;
inline std::vector<fiber> fibers;
inline int nthreads; // a block's
inline int nctas;    // blocks running together: the cluster's size
inline cta_state ctas[MAX_CTAS];
inline emu_dim3 grid;
inline int cluster_arrived;
inline int warp_arrived[MAX_WARPS];
inline int warpgroup_arrived[MAX_WARPS / 4];
inline unsigned char *smem_of(int cta) { return cta ? smem_second : ferry::smem_raw; }
inline unsigned char *smem_here() { return smem_of(cur->cta); }
inline uint32_t dyn_smem;       // the launch's dynamic shared memory
inline bool early_copies;       // perform cp.async at issue instead of at the issuer's wait
inline bool early_wgmma;        // perform wgmma at issue instead of when its group is waited for
inline std::vector<range> globals; // where cp.async may read
inline void (*entry)();
inline std::vector<async_arrival> arrivals_in_flight;

inline void (*after_block)() = [] {}; // set by the wgmma emulation: nothing may be left in flight

inline void yield() {
  if (!_setjmp(cur->jb)) _longjmp(scheduler_jb, 1);
}

// __syncthreads: the threads of the caller's block. cluster_barrier: every thread of the cluster.
inline void block_barrier() {
  cur->state = AT_BLOCK_BARRIER;
  const int c = cur->cta;
  if (++ctas[c].block_arrived == nthreads) {
    for (fiber &f : fibers)
      if (f.state == AT_BLOCK_BARRIER && f.cta == c) f.state = READY;
    ctas[c].block_arrived = 0;
  }
  while (cur->state == AT_BLOCK_BARRIER) yield();
}
inline void cluster_barrier() {
  cur->state = AT_CLUSTER_BARRIER;
  if (++cluster_arrived == nthreads * nctas) {
    for (fiber &f : fibers)
      if (f.state == AT_CLUSTER_BARRIER) f.state = READY;
    cluster_arrived = 0;
    for (int c = 0; c < nctas; c++) ctas[c].published = true;
  }
  while (cur->state == AT_CLUSTER_BARRIER) yield();
}

// All 32 lanes of the caller's warp arrive; the last to arrive runs `last` (the collective's work) first.
template <typename F> inline void warp_arrive(F last) {
  const int w = cur->index / 32;
  cur->state = AT_WARP_BARRIER;
  if (++warp_arrived[w] == 32) {
    last();
    for (int l = 0; l < 32; l++) {
      fiber &f = fibers[(size_t)(w * 32 + l)];
      if (f.state == AT_WARP_BARRIER) f.state = READY;
    }
    warp_arrived[w] = 0;
  }
  while (cur->state == AT_WARP_BARRIER) yield();
}

// All 128 threads of the caller's warpgroup (4 consecutive warps) arrive; the last runs `last` first.
template <typename F> inline void warpgroup_arrive(F last) {
  const int g = cur->index / 128;
  cur->state = AT_WARPGROUP_BARRIER;
  if (++warpgroup_arrived[g] == 128) {
    last();
    for (int l = 0; l < 128; l++) {
      fiber &f = fibers[(size_t)(g * 128 + l)];
      if (f.state == AT_WARPGROUP_BARRIER) f.state = READY;
    }
    warpgroup_arrived[g] = 0;
  }
  while (cur->state == AT_WARPGROUP_BARRIER) yield();
}

inline void check_smem(uint32_t addr, uint32_t bytes, const char *what) {
  if ((uint64_t)addr + bytes > dyn_smem) {
    fprintf(stderr, "%s: shared bytes [%u, %u) past the launch's %u\n", what, addr, addr + bytes, dyn_smem);
    fail("shared memory out of bounds");
  }
}

inline void check_global(const unsigned char *p, int bytes) {
  for (const range &r : globals)
    if (p >= r.begin && p + bytes <= r.end) return;
  fail("a copy (cp.async or TMA) reads outside every operand");
}

// A copy into the shared memory of block `cta` of the cluster.
inline void perform(const copy &c, int cta) {
  if (!ctas[cta].running) fail("a copy landed in the shared memory of a block that had exited");
  check_smem(c.dst, (uint32_t)c.bytes, "cp.async");
  memset(smem_of(cta) + c.dst, 0, (size_t)c.bytes);
  if (c.src_bytes) memcpy(smem_of(cta) + c.dst, c.src, (size_t)c.src_bytes);
}

inline mbarrier &mbarrier_at(int cta, uint32_t addr) {
  for (auto &b : ctas[cta].mbarriers)
    if (b.first == addr) return b.second;
  fail("mbarrier used before mbarrier.init");
}

// Completes the phase once every arrival and every expected byte is in (a multicast's bytes may land before the
// arrival that expects them, as on the GPU: the count of bytes goes below zero meanwhile), and wakes the threads
// waiting for it.
inline void mbarrier_settle(int cta, uint32_t addr, mbarrier &b) {
  if (b.pending > 0 || b.tx != 0) return;
  b.completed++;
  b.pending = b.expected;
  for (fiber &f : fibers)
    if (f.state == AT_MBARRIER && f.cta == cta && f.waits_on == addr) f.state = READY; // it checks its parity again
}

// One arrival, expecting `tx` more bytes of transactions in this phase (mbarrier.arrive.expect_tx; 0: a plain one).
inline void mbarrier_arrive_at(int cta, uint32_t addr, long long tx = 0) {
  if (!ctas[cta].running) fail("an mbarrier arrival on a block that had exited");
  mbarrier &b = mbarrier_at(cta, addr);
  if (b.pending <= 0) fail("an mbarrier arrival beyond the count its phase expects");
  b.pending--;
  b.tx += tx;
  if (b.pending == 0 && b.tx < 0) fail("an mbarrier phase's arrivals are in with more bytes landed than expected");
  mbarrier_settle(cta, addr, b);
}

// Another block's use of block `cta`'s mbarriers: only after a cluster barrier made their initialisation visible.
inline void check_published(int cta, int from) {
  if (cta != from && !ctas[cta].published)
    fail("a block used another's mbarrier before a cluster barrier followed its mbarrier.init");
}

inline void land(const async_arrival &a) {
  check_published(a.cta, a.from);
  for (const copy &c : a.copies) perform(c, a.cta);
  if (!a.tx_bytes) {
    mbarrier_arrive_at(a.cta, a.bar);
    return;
  }
  if (!ctas[a.cta].running) fail("a TMA box's bytes landed on a block that had exited");
  mbarrier &b = mbarrier_at(a.cta, a.bar);
  b.tx -= a.tx_bytes;
  if (b.pending == 0 && b.tx < 0) fail("a TMA box's bytes landed on an mbarrier phase that did not expect them");
  mbarrier_settle(a.cta, a.bar, b);
}

// Per-warp mailboxes of the collectives.
struct warp_slot {
  uint32_t addr[32];
  uint32_t a[32][4], b[32][2], out[32][4];
  float c[32][4];
  double c8[32][4]; // the 8-bit mma's accumulators (fp32 or int32 values, exact in a double)
};
inline warp_slot slots[MAX_WARPS];

// Runs `f` until it blocks or finishes. Kept out of the scheduler's loop so that no local of the loop lives
// across _setjmp.
__attribute__((noinline)) inline void switch_to(fiber &f) {
  cur = &f;
  if (!_setjmp(scheduler_jb)) {
    if (!f.started) {
      f.started = true;
      swapcontext(&scheduler, &f.ctx);
    } else {
      _longjmp(f.jb, 1);
    }
  }
}

static void trampoline() {
  entry();
  cur->state = DONE;
  ctas[cur->cta].running--;
  _longjmp(scheduler_jb, 1);
}

// Runs the cluster of blocks b[0..ctas) (one block outside clusters), `threads` threads each, to completion.
// Returns normally only if every thread finished with no copy left in flight.
inline void run_cluster(const emu_dim3 *b, int n, int threads, uint32_t smem_bytes, unsigned seed, void (*kernel)()) {
  if (n < 1 || n > MAX_CTAS || n * threads > 32 * MAX_WARPS) fail("a cluster larger than the emulation holds");
  nctas = n;
  nthreads = threads;
  dyn_smem = smem_bytes;
  entry = kernel;
  cluster_arrived = 0;
  memset(warp_arrived, 0, sizeof warp_arrived);
  memset(warpgroup_arrived, 0, sizeof warpgroup_arrived);
  for (int c = 0; c < n; c++) {
    ctas[c].block = b[c];
    ctas[c].block_arrived = 0;
    ctas[c].running = threads;
    ctas[c].published = false;
    ctas[c].mbarriers.clear();
    memset(smem_of(c), 0xff, sizeof ferry::smem_raw);
  }
  arrivals_in_flight.clear();
  threads *= n;
  fibers.resize((size_t)threads); // stacks are kept from block to block
  for (int t = 0; t < threads; t++) {
    fiber &f = fibers[(size_t)t];
    f.stack.resize(128 * 1024);
    f.open.clear();
    f.groups.clear();
    f.tid = {(unsigned)(t % nthreads), 0, 0};
    f.cta = t / nthreads;
    f.index = t;
    f.state = READY;
    f.started = false;
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack.data();
    f.ctx.uc_stack.ss_size = f.stack.size();
    f.ctx.uc_link = nullptr;
    makecontext(&f.ctx, trampoline, 0);
  }
  std::mt19937 rng(seed);
  std::vector<int> order((size_t)threads);
  for (int t = 0; t < threads; t++) order[(size_t)t] = t;
  // Each round also holds back about a third of the warps, so that warps drift apart between barriers instead of
  // moving in lockstep from one warp collective to the next (a write into shared memory that another warp may still
  // be reading, with no barrier between, then shows).
  std::vector<char> held((size_t)(threads + 31) / 32);
  for (;;) {
    std::shuffle(order.begin(), order.end(), rng);
    for (char &h : held) h = rng() % 3 == 0;
    int ran = 0, done = 0, waiting = 0;
    for (int t : order) {
      fiber &f = fibers[(size_t)t];
      if (f.state == DONE) {
        done++;
        continue;
      }
      if (f.state != READY) continue;
      if (held[(size_t)t / 32]) {
        waiting++;
        continue;
      }
      switch_to(f);
      ran++;
    }
    // Copies with an mbarrier arrival land at random, each round or so, and always when nothing else can move.
    bool landed = false;
    for (size_t i = 0; i < arrivals_in_flight.size();) {
      if (!ran || rng() % 2) {
        const async_arrival a = arrivals_in_flight[i];
        arrivals_in_flight.erase(arrivals_in_flight.begin() + (long)i);
        land(a);
        landed = true;
        if (ran) continue;
        break; // with nothing else running, one at a time: the earliest first
      }
      i++;
    }
    if (done == threads && arrivals_in_flight.empty()) break;
    if (!ran && !waiting && !landed)
      fail("deadlock: every unfinished thread waits at a barrier the others never reach");
  }
  for (fiber &f : fibers)
    if (!f.open.empty() || !f.groups.empty()) fail("a thread exited with cp.async copies in flight");
  for (int c = 0; c < n; c++)
    for (const auto &m : ctas[c].mbarriers)
      if (m.second.pending != m.second.expected || m.second.tx) fail("a block ended with an mbarrier phase half done");
  after_block();
}

inline void run_block(emu_dim3 b, int threads, uint32_t smem_bytes, unsigned seed, void (*kernel)()) {
  run_cluster(&b, 1, threads, smem_bytes, seed, kernel);
}

} // namespace emu

#define threadIdx (emu::cur->tid)
#define blockIdx (emu::ctas[emu::cur->cta].block)
#define gridDim (emu::grid)
#define __cluster_dims__(...)
inline void __syncthreads() { emu::block_barrier(); }
inline void __syncwarp() { emu::warp_arrive([] {}); }
[[noreturn]] inline void __trap() { emu::fail("__trap()"); }

// The fast-math intrinsics the epilogue uses, exact here (the reference's tolerance covers the hardware's few ulp).
inline float exp2_approx(float x) { return std::exp2(x); } // gemm_common.cuh: ex2.approx.ftz
inline float __fdividef(float x, float y) { return x / y; }

// ---- gemm_common.cuh's device part in plain C++ -------------------------------------------------------------

#define FERRY_GEMM_EMULATED // gemm_common.cuh, included below, then gives only its plain C++ part (the stage copy)
#include "gemm_kind.cuh"

namespace ferry {

inline float f16_to_f32(u16 h) {
  const int sign = h >> 15, exp = (h >> 10) & 31, man = h & 1023;
  float v;
  if (exp == 0) v = std::ldexp((float)man, -24);
  else if (exp == 31) v = man ? NAN : INFINITY;
  else v = std::ldexp((float)(man | 1024), exp - 25);
  return sign ? -v : v;
}
inline float bf16_to_f32(u16 h) { return __uint_as_float((u32)h << 16); }
inline u16 f32_to_f16(float f) { // round to nearest even, as cvt.rn.f16.f32
  u32 x = __float_as_uint(f);
  const u32 sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) return (u16)(sign | 0x7e00u);
  if (x >= 0x477ff000u) return (u16)(sign | 0x7c00u); // rounds to or past 65520: infinity
  if (x < 0x38800000u) {                              // below 2^-14: subnormal half
    const float a = __uint_as_float(x);
    return (u16)(sign | (u16)std::nearbyint(a * 16777216.0f)); // units of 2^-24, ties to even
  }
  const u32 mant = x & 0x7fffffu, exp = (x >> 23) - 112;
  u32 h = (exp << 10) | (mant >> 13);
  const u32 rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;
  return (u16)(sign | h);
}
inline u16 f32_to_bf16(float f) {
  u32 x = __float_as_uint(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (u16)((x >> 16) | 0x40u);
  return (u16)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

template <int T> inline float to_f32(typename storage<T>::type v);
template <> inline float to_f32<FERRY_SCALAR_F16>(u16 v) { return f16_to_f32(v); }
template <> inline float to_f32<FERRY_SCALAR_BF16>(u16 v) { return bf16_to_f32(v); }
template <> inline float to_f32<FERRY_SCALAR_F32>(float v) { return v; }

template <int T> inline typename storage<T>::type from_f32(float v);
template <> inline u16 from_f32<FERRY_SCALAR_F16>(float v) { return f32_to_f16(v); }
template <> inline u16 from_f32<FERRY_SCALAR_BF16>(float v) { return f32_to_bf16(v); }
template <> inline float from_f32<FERRY_SCALAR_F32>(float v) { return v; }

typedef storage<FERRY_A_TYPE>::type a_t;
typedef storage<FERRY_B_TYPE>::type b_t;
typedef storage<FERRY_OUT_TYPE>::type out_t;

// An 8-bit element's value: e4m3 (bias 7, 3 mantissa bits, S.1111.111 NaN, no infinities), e5m2 (bias 15, 2
// mantissa bits, IEEE infinities and NaNs) or int8.
inline double narrow_value(unsigned char byte, int type) {
  if (type == FERRY_SCALAR_I8) return (double)(signed char)byte;
  const int sign = byte >> 7;
  double v;
  if (type == FERRY_SCALAR_E4M3) {
    const int e = (byte >> 3) & 15, m = byte & 7;
    if (e == 15 && m == 7) return NAN;
    v = e ? std::ldexp((double)(8 | m), e - 10) : std::ldexp((double)m, -9);
  } else {
    const int e = (byte >> 2) & 31, m = byte & 3;
    if (e == 31) return m ? NAN : sign ? -INFINITY : INFINITY;
    v = e ? std::ldexp((double)(4 | m), e - 17) : std::ldexp((double)m, -16);
  }
  return sign ? -v : v;
}

inline u32 smem_addr(const void *p) {
  const unsigned char *c = static_cast<const unsigned char *>(p);
  const unsigned char *base = emu::smem_here();
  if (c < base || c > base + sizeof smem_raw) emu::fail("smem_addr of a non-shared pointer (or another block's)");
  return (u32)(c - base);
}

template <int BYTES> inline void cp_async(u32 dst, const void *src, int src_bytes) {
  if (BYTES != 4 && BYTES != 8 && BYTES != 16) emu::fail("cp.async of a size PTX does not have");
  const unsigned char *s = static_cast<const unsigned char *>(src);
  if (dst % BYTES || (uintptr_t)s % BYTES) emu::fail("cp.async misaligned");
  if (src_bytes < 0 || src_bytes > BYTES) emu::fail("cp.async source size");
  if (src_bytes) emu::check_global(s, src_bytes);
  emu::check_smem(dst, BYTES, "cp.async");
  const emu::copy c = {dst, s, BYTES, src_bytes};
  if (emu::early_copies) emu::perform(c, emu::cur->cta);
  else emu::cur->open.push_back(c);
}
inline void cp_async16(u32 dst, const void *src) { cp_async<16>(dst, src, 16); }
inline void cp_async_commit() {
  emu::cur->groups.push_back(emu::cur->open);
  emu::cur->open.clear();
}
template <int N> inline void cp_async_wait() {
  while (emu::cur->groups.size() > (size_t)N) {
    for (const emu::copy &c : emu::cur->groups.front()) emu::perform(c, emu::cur->cta);
    emu::cur->groups.pop_front();
  }
}
inline unsigned dynamic_smem_size() { return emu::dyn_smem; }

// ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16: lanes 8q..8q+7 address the rows of matrix q; lane l receives
// row l/4, columns 2(l%4) and 2(l%4)+1 of matrix q (of its transpose with .trans), low half first.
template <bool TRANS> inline void ldmatrix(u32 r[4], u32 addr) {
  const int w = emu::cur->index / 32, lane = (int)emu::cur->tid.x % 32;
  emu::slots[w].addr[lane] = addr;
  emu::warp_arrive([w] {
    emu::warp_slot &s = emu::slots[w];
    for (int q = 0; q < 4; q++) {
      u16 e[8][8];
      for (int i = 0; i < 8; i++) {
        const u32 a = s.addr[8 * q + i];
        if (a % 16) emu::fail("ldmatrix row address not 16-byte aligned");
        emu::check_smem(a, 16, "ldmatrix");
        memcpy(e[i], emu::smem_here() + a, 16);
      }
      for (int l = 0; l < 32; l++) {
        const int g = l / 4, t = l % 4;
        const u16 lo = TRANS ? e[2 * t][g] : e[g][2 * t], hi = TRANS ? e[2 * t + 1][g] : e[g][2 * t + 1];
        s.out[l][q] = (u32)lo | (u32)hi << 16;
      }
    }
  });
  for (int q = 0; q < 4; q++) r[q] = emu::slots[w].out[lane][q];
}
inline void ldmatrix_x4(u32 r[4], u32 addr) { ldmatrix<false>(r, addr); }
inline void ldmatrix_x4_trans(u32 r[4], u32 addr) { ldmatrix<true>(r, addr); }

// mma.sync.aligned.m16n8k16.row.col: lane l = 4g + t holds A[g][2t..], A[g+8][2t..], A[g][2t+8..],
// A[g+8][2t+8..]; B[2t..][g], B[2t+8..][g]; C/D[g][2t], [g][2t+1], [g+8][2t], [g+8][2t+1].
template <int IN, bool F16_ACC> inline void mma_emulated(float d[4], const u32 a[4], const u32 b[2]) {
  const int w = emu::cur->index / 32, lane = (int)emu::cur->tid.x % 32;
  emu::warp_slot &s = emu::slots[w];
  for (int i = 0; i < 4; i++) s.a[lane][i] = a[i], s.c[lane][i] = d[i];
  s.b[lane][0] = b[0], s.b[lane][1] = b[1];
  emu::warp_arrive([w] {
    emu::warp_slot &s = emu::slots[w];
    auto val = [](u32 reg, int half) { return (double)to_f32<IN>((u16)(half ? reg >> 16 : reg & 0xffffu)); };
    double A[16][16], B[16][8], C[16][8];
    for (int l = 0; l < 32; l++) {
      const int g = l / 4, t = l % 4;
      for (int h = 0; h < 2; h++) {
        A[g][2 * t + h] = val(s.a[l][0], h);
        A[g + 8][2 * t + h] = val(s.a[l][1], h);
        A[g][2 * t + 8 + h] = val(s.a[l][2], h);
        A[g + 8][2 * t + 8 + h] = val(s.a[l][3], h);
        B[2 * t + h][g] = val(s.b[l][0], h);
        B[2 * t + 8 + h][g] = val(s.b[l][1], h);
      }
      C[g][2 * t] = s.c[l][0], C[g][2 * t + 1] = s.c[l][1];
      C[g + 8][2 * t] = s.c[l][2], C[g + 8][2 * t + 1] = s.c[l][3];
    }
    for (int l = 0; l < 32; l++) {
      const int g = l / 4, t = l % 4;
      const int rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
      for (int e = 0; e < 4; e++) {
        double acc = C[rows[e]][cols[e]];
        for (int k = 0; k < 16; k++) acc += A[rows[e]][k] * B[k][cols[e]];
        float v = (float)acc;
        if (F16_ACC) v = f16_to_f32(f32_to_f16(v));
        s.c[l][e] = v; // the results go back through the same mailbox
      }
    }
  });
  for (int i = 0; i < 4; i++) d[i] = s.c[lane][i];
}
template <int IN> inline void mma_f32(float d[4], const u32 a[4], const u32 b[2]) { mma_emulated<IN, false>(d, a, b); }
inline void mma_f16(u32 d[2], const u32 a[4], const u32 b[2]) {
  float f[4] = {f16_to_f32((u16)(d[0] & 0xffffu)), f16_to_f32((u16)(d[0] >> 16)), f16_to_f32((u16)(d[1] & 0xffffu)),
                f16_to_f32((u16)(d[1] >> 16))};
  mma_emulated<FERRY_SCALAR_F16, true>(f, a, b);
  d[0] = (u32)f32_to_f16(f[0]) | (u32)f32_to_f16(f[1]) << 16;
  d[1] = (u32)f32_to_f16(f[2]) | (u32)f32_to_f16(f[3]) << 16;
}

#if FERRY_NARROW_INPUTS
#if FERRY_A_TYPE == FERRY_SCALAR_I8
typedef int narrow_acc;
#else
typedef float narrow_acc;
#endif
// mma.sync.aligned.m16n8k32.row.col with 8-bit operands: lane l = 4g + t holds bytes A[g][4t..4t+3] (a0, lowest
// byte first), A[g+8][4t..] (a1), A[g][16+4t..] (a2), A[g+8][16+4t..] (a3); B[4t..4t+3][g] (b0), B[16+4t..][g] (b1);
// C/D as m16n8k16. int8 sums are exact; FP8 ones are rounded to fp32 once per instruction.
inline void mma_k32(narrow_acc d[4], const u32 a[4], const u32 b[2]) {
  const int w = emu::cur->index / 32, lane = (int)emu::cur->tid.x % 32;
  emu::warp_slot &s = emu::slots[w];
  for (int i = 0; i < 4; i++) s.a[lane][i] = a[i], s.c8[lane][i] = (double)d[i];
  s.b[lane][0] = b[0], s.b[lane][1] = b[1];
  emu::warp_arrive([w] {
    emu::warp_slot &s = emu::slots[w];
    auto byte = [](u32 reg, int j) { return (unsigned char)(reg >> (8 * j)); };
    double A[16][32], B[32][8], C[16][8];
    for (int l = 0; l < 32; l++) {
      const int g = l / 4, t = l % 4;
      for (int j = 0; j < 4; j++) {
        A[g][4 * t + j] = narrow_value(byte(s.a[l][0], j), FERRY_A_TYPE);
        A[g + 8][4 * t + j] = narrow_value(byte(s.a[l][1], j), FERRY_A_TYPE);
        A[g][16 + 4 * t + j] = narrow_value(byte(s.a[l][2], j), FERRY_A_TYPE);
        A[g + 8][16 + 4 * t + j] = narrow_value(byte(s.a[l][3], j), FERRY_A_TYPE);
        B[4 * t + j][g] = narrow_value(byte(s.b[l][0], j), FERRY_B_TYPE);
        B[16 + 4 * t + j][g] = narrow_value(byte(s.b[l][1], j), FERRY_B_TYPE);
      }
      C[g][2 * t] = s.c8[l][0], C[g][2 * t + 1] = s.c8[l][1];
      C[g + 8][2 * t] = s.c8[l][2], C[g + 8][2 * t + 1] = s.c8[l][3];
    }
    for (int l = 0; l < 32; l++) {
      const int g = l / 4, t = l % 4;
      const int rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
      for (int e = 0; e < 4; e++) {
        double acc = C[rows[e]][cols[e]];
        for (int k = 0; k < 32; k++) acc += A[rows[e]][k] * B[k][cols[e]];
        s.c8[l][e] = (double)(narrow_acc)acc;
      }
    }
  });
  for (int i = 0; i < 4; i++) d[i] = (narrow_acc)s.c8[lane][i];
}
#endif

// ---- wgmma (gemm_wgmma.cu) ----------------------------------------------------------------------------------
// Descriptors are decoded from the PTX ISA's definitions, independently of how the kernel builds them: start, LBO
// and SBO (each stored >> 4), the swizzle mode (only 128-byte is used), the canonical layouts
//   K-major:  ((8,m),(T,2k)):((8T,SBO),(1,T))      MN-major: ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO))
// in elements (T = 8 for 16-bit types), and the 128-byte swizzle on the resulting byte address: bits 4..6 ^= bits
// 7..9. The accumulator fragment: thread 32w + l of the warpgroup holds, for each 8-column block j, rows 16w + l/4
// and 16w + l/4 + 8, columns 8j + 2(l%4) and 8j + 2(l%4) + 1, as d[4j..4j+3].
// A wgmma reads shared memory when it is issued or when its group is waited for (emu::early_wgmma), so a stage
// refilled while its wgmma may still run, or accumulators read before the wait, give wrong results.
namespace wg {
struct op {
  unsigned long long da, db;
  int n;                  // columns of D: 256, 128 or 64
  int in_a, in_b, ta, tb; // element types (8-bit ones: k 32 bytes, K-major only)
  bool int_acc;           // int32 accumulators (int8 inputs); else fp32
  void *d[128];           // each thread's accumulators
};
struct state {
  std::vector<op> open;               // issued since the last commit
  std::deque<std::vector<op>> groups; // committed, not yet waited for
  unsigned long long da[128], db[128];
  void *d[128];
  bool fenced;                        // wgmma.fence since the last accumulator access by other code
};
inline state groups[emu::MAX_WARPS / 4];

// Elements of `bytes` bytes: T = 16 / bytes of them per 16-byte core-matrix row.
inline uint32_t element_address(unsigned long long desc, int trans, int mn, int k, uint32_t bytes) {
  const uint32_t start = (uint32_t)(desc & 0x3fff) << 4, lbo = (uint32_t)((desc >> 16) & 0x3fff) << 4,
                 sbo = (uint32_t)((desc >> 32) & 0x3fff) << 4;
  if ((desc >> 62) != 1 || ((desc >> 49) & 7)) emu::fail("wgmma descriptor: only 128-byte swizzle, base offset 0");
  const uint32_t T = 16 / bytes;
  uint32_t off; // bytes, before the swizzle
  if (!trans) off = bytes * ((mn % 8) * 8 * T + (k % T) + (k / T) * T) + (mn / 8) * sbo;
  else off = bytes * ((mn % T) + (mn / T % 8) * T + (k % 8) * 8 * T) + (mn / (8 * T)) * lbo + (k / 8) * sbo;
  const uint32_t byte = start + off;
  return byte ^ (((byte >> 7) & 7) << 4);
}

inline double element(const op &o, int type, unsigned long long desc, int trans, int mn, int k) {
  const bool narrow = type >= FERRY_SCALAR_E4M3 && type <= FERRY_SCALAR_I8;
  const uint32_t a = element_address(desc, trans, mn, k, narrow ? 1 : 2);
  emu::check_smem(a, narrow ? 1 : 2, "wgmma operand");
  if (narrow) return narrow_value(emu::smem_here()[a], type);
  u16 h;
  memcpy(&h, emu::smem_here() + a, 2);
  (void)o;
  return (double)(type == FERRY_SCALAR_BF16 ? bf16_to_f32(h) : f16_to_f32(h));
}

inline void perform(const op &o) {
  const bool narrow = o.in_a >= FERRY_SCALAR_E4M3 && o.in_a <= FERRY_SCALAR_I8;
  const int K = narrow ? 32 : 16;
  static double A[64][32], B[256][32];
  for (int m = 0; m < 64; m++)
    for (int k = 0; k < K; k++) A[m][k] = element(o, o.in_a, o.da, o.ta, m, k);
  for (int n = 0; n < o.n; n++)
    for (int k = 0; k < K; k++) B[n][k] = element(o, o.in_b, o.db, o.tb, n, k);
  for (int t = 0; t < 128; t++) {
    const int w = t / 32, l = t % 32;
    for (int j = 0; j < o.n / 8; j++)
      for (int e = 0; e < 4; e++) {
        const int row = 16 * w + l / 4 + (e >= 2 ? 8 : 0), col = 8 * j + 2 * (l % 4) + (e & 1), i = 4 * j + e;
        double acc = o.int_acc ? (double)static_cast<int *>(o.d[t])[i] : (double)static_cast<float *>(o.d[t])[i];
        for (int k = 0; k < K; k++) acc += A[row][k] * B[col][k];
        if (o.int_acc) static_cast<int *>(o.d[t])[i] = (int)acc;
        else static_cast<float *>(o.d[t])[i] = (float)acc;
      }
  }
}

// Issues one wgmma for the calling thread's warpgroup: a collective whose last arrival records the op.
inline void issue(void *d, int n, unsigned long long desc_a, unsigned long long desc_b, int in_a, int in_b, int ta,
                  int tb, bool int_acc) {
  const int g = emu::cur->index / 128, t = (int)emu::cur->tid.x % 128;
  state &s = groups[g];
  s.da[t] = desc_a, s.db[t] = desc_b, s.d[t] = d;
  emu::warpgroup_arrive([=] {
    state &s = groups[g];
    if (!s.fenced) emu::fail("wgmma without a wgmma.fence before it");
    for (int i = 1; i < 128; i++)
      if (s.da[i] != s.da[0] || s.db[i] != s.db[0]) emu::fail("wgmma descriptors differ across the warpgroup");
    op o;
    o.da = s.da[0], o.db = s.db[0], o.n = n, o.in_a = in_a, o.in_b = in_b, o.ta = ta, o.tb = tb, o.int_acc = int_acc;
    for (int i = 0; i < 128; i++) o.d[i] = s.d[i];
    if (emu::early_wgmma) perform(o);
    else s.open.push_back(o);
  });
}
} // namespace wg

// m64nNk16, N from the accumulators' count (4 registers a thread per 8 columns).
template <int IN, int TRANS_A, int TRANS_B, int R>
inline void wgmma_k16(float (&d)[R], unsigned long long desc_a, unsigned long long desc_b) {
  static_assert(R == 128 || R == 64 || R == 32, "m64n256, m64n128 or m64n64");
  wg::issue(d, 2 * R, desc_a, desc_b, IN, IN, TRANS_A, TRANS_B, false);
}
#if FERRY_NARROW_INPUTS
// m64nNk32 with 8-bit operands, both K-major (the only layout the instruction reads).
template <int R> inline void wgmma_k32(narrow_acc (&d)[R], unsigned long long desc_a, unsigned long long desc_b) {
  static_assert(R == 128 || R == 64 || R == 32, "m64n256, m64n128 or m64n64");
  wg::issue(d, 2 * R, desc_a, desc_b, FERRY_A_TYPE, FERRY_B_TYPE, 0, 0, FERRY_A_TYPE == FERRY_SCALAR_I8);
}
#endif
inline void wgmma_fence() {
  const int g = emu::cur->index / 128;
  emu::warpgroup_arrive([g] { wg::groups[g].fenced = true; });
}
inline void wgmma_commit() {
  const int g = emu::cur->index / 128;
  emu::warpgroup_arrive([g] {
    wg::state &s = wg::groups[g];
    s.groups.push_back(s.open);
    s.open.clear();
    s.fenced = false; // the next batch needs its own fence
  });
}
template <int N> inline void wgmma_wait() {
  const int g = emu::cur->index / 128;
  emu::warpgroup_arrive([g] {
    wg::state &s = wg::groups[g];
    while (s.groups.size() > (size_t)N) {
      for (const wg::op &o : s.groups.front()) wg::perform(o);
      s.groups.pop_front();
    }
  });
}
inline void wgmma_fence_operand(float &) {}
inline void wgmma_fence_operand(int &) {}
// Every block must leave no wgmma in flight; the next block starts with a clean state.
inline const bool wgmma_checked_after_each_block = (emu::after_block = [] {
  for (wg::state &s : wg::groups) {
    if (!s.open.empty() || !s.groups.empty()) emu::fail("a warpgroup exited with wgmma in flight");
    s.fenced = false;
  }
}, true);
inline void fence_proxy_async_shared() {}

// mbarriers: 8-byte aligned shared objects, here a table by address (the bytes are only bounds-checked).
inline void mbar_init(u32 bar, int count) {
  if (bar % 8) emu::fail("mbarrier not 8-byte aligned");
  emu::check_smem(bar, 8, "mbarrier.init");
  if (count < 1) emu::fail("mbarrier.init with no arrivals expected");
  auto &table = emu::ctas[emu::cur->cta].mbarriers;
  for (auto &b : table)
    if (b.first == bar) emu::fail("mbarrier initialised twice");
  table.push_back({bar, emu::mbarrier{count, count, 0, 0}});
  emu::ctas[emu::cur->cta].published = false;
}
inline void mbar_arrive(u32 bar) { emu::mbarrier_arrive_at(emu::cur->cta, bar); }
inline void cp_async_mbar_arrive(u32 bar) {
  emu::mbarrier_at(emu::cur->cta, bar); // initialised
  emu::arrivals_in_flight.push_back({emu::cur->open, bar, 0, emu::cur->cta, emu::cur->cta});
  emu::cur->open.clear();
}

// Clusters. A shared::cluster address here is the shared address with the block's rank + 1 above bit 24.
constexpr u32 CLUSTER_RANK_SHIFT = 24;
inline int cluster_rank() { return emu::cur->cta; }
inline void cluster_sync() { emu::cluster_barrier(); }
inline void fence_mbarrier_init_cluster() {}
inline u32 cluster_map(u32 addr, int rank) {
  if (addr >> CLUSTER_RANK_SHIFT) emu::fail("mapa of an address that is not this block's shared address");
  if (rank < 0 || rank >= emu::nctas) emu::fail("mapa to a rank outside the cluster");
  return addr | (u32)(rank + 1) << CLUSTER_RANK_SHIFT;
}
inline void mbar_arrive_cluster(u32 cluster_addr) {
  const int rank = (int)(cluster_addr >> CLUSTER_RANK_SHIFT) - 1;
  if (rank < 0) emu::fail("a shared::cluster arrival on an address mapa did not make");
  emu::check_published(rank, emu::cur->cta);
  emu::mbarrier_arrive_at(rank, cluster_addr & ((1u << CLUSTER_RANK_SHIFT) - 1));
}

// TMA. A tensor map here is the emulation's own record of what src/ops/tma.c encodes into a CUtensorMap (the
// kernel only passes its address on): 2-byte elements, up to three dimensions (innermost first), byte strides of
// the outer two, a box of 64 elements (128 bytes) by box_rows, 128-byte swizzle. emulate_gemm.cpp fills it.
struct alignas(64) tma_map {
  const unsigned char *base;
  uint64_t dims[3];
  uint64_t strides[2]; // bytes between consecutive indices of dimensions 1 and 2
  uint32_t box_rows;
};
struct tma_maps {
  tma_map a, b;
};
inline void mbar_arrive_expect_tx(u32 bar, u32 bytes) { emu::mbarrier_arrive_at(emu::cur->cta, bar, bytes); }
inline void tma_prefetch(const tma_map *) {}
// The box at (c0, c1, c2), as the tensor unit writes it: row r of the box is 128 bytes at dst + 128 r, its 16-byte
// chunk j at chunk j ^ (r % 8) (the swizzle follows the shared address, hence the 1024-byte alignment); elements
// outside the tensor land as zeros. It lands at a random later point, all at once, with its bytes; a multicast's
// copy in each block of its mask lands on its own.
inline void tma_load_multicast(u32 dst, const tma_map *map, int c0, int c1, int c2, u32 bar, u16 cta_mask) {
  if (dst % 1024) emu::fail("a TMA box with 128-byte swizzle into shared memory not 1024-byte aligned");
  if (c0 < 0 || c1 < 0 || c2 < 0) emu::fail("a TMA box at negative coordinates (not used by the kernels)");
  if (!cta_mask || cta_mask >> emu::nctas) emu::fail("a TMA multicast to blocks outside the cluster");
  emu::mbarrier_at(emu::cur->cta, bar); // initialised
  emu::async_arrival a{{}, bar, 128ll * map->box_rows, 0, emu::cur->cta};
  for (uint32_t r = 0; r < map->box_rows; r++)
    for (int j = 0; j < 8; j++) {
      const uint64_t row = (uint64_t)c1 + r, first = (uint64_t)c0 + 8u * (uint64_t)j;
      const bool inside = row < map->dims[1] && (uint64_t)c2 < map->dims[2] && first < map->dims[0];
      const int elems = inside ? (int)std::min<uint64_t>(8, map->dims[0] - first) : 0;
      const unsigned char *src = map->base + (uint64_t)c2 * map->strides[1] + row * map->strides[0] + first * 2;
      if (elems) emu::check_global(src, 2 * elems);
      a.copies.push_back({dst + 128u * r + (uint32_t)(((j ^ (int)(r % 8)) & 7) << 4), elems ? src : nullptr, 16,
                          2 * elems});
    }
  for (a.cta = 0; a.cta < emu::nctas; a.cta++)
    if (cta_mask >> a.cta & 1) emu::arrivals_in_flight.push_back(a);
}
inline void tma_load(u32 dst, const tma_map *map, int c0, int c1, int c2, u32 bar) {
  tma_load_multicast(dst, map, c0, c1, c2, bar, (u16)(1u << emu::cur->cta));
}
inline void mbar_wait(u32 bar, u32 parity) {
  // The phase of parity P has completed when the number of completed phases has the other parity.
  while ((emu::mbarrier_at(emu::cur->cta, bar).completed & 1u) == (parity & 1u)) {
    emu::cur->state = emu::AT_MBARRIER;
    emu::cur->waits_on = bar;
    while (emu::cur->state == emu::AT_MBARRIER) emu::yield();
  }
}
template <int N> inline void setmaxnreg_dec() {
  emu::warpgroup_arrive([] {});
}
template <int N> inline void setmaxnreg_inc() {
  emu::warpgroup_arrive([] {});
}

} // namespace ferry

// The rest of the shared headers as the kernels have them: they need only what is above.
#include "gemm_common.cuh"
#include "gemm_output.cuh"

#endif
