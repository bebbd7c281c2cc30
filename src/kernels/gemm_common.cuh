// gemm_common.cuh — what ferry's GEMM kernels share: element conversions, cp.async / ldmatrix / mma / wgmma
// wrappers, and the copy of one k-tile into a pipeline stage.
//
// Compiled by NVRTC at run time, so it includes no system header at all: fp16 and bf16 travel as raw 16-bit patterns
// and are converted with PTX cvt instructions. ferry puts the FERRY_* macros of the problem's kind, gemm_params.h
// and gemm_kind.cuh ahead of this text and gemm_output.cuh after it (src/ops/source.c); the includes below only
// serve checking the kernel files with nvcc (see cmake/ops.cmake, ferry_check_kernels). The CPU emulation
// (tests/kernels/emulate_cuda.h) defines FERRY_GEMM_EMULATED and its own plain C++ for everything up to the stage
// copy, whose inline PTX has no C++ meaning there, and then includes this file for the stage copy.
#ifndef FERRY_GEMM_COMMON_INCLUDED
#define FERRY_GEMM_COMMON_INCLUDED

#ifndef FERRY_GEMM_KIND_INCLUDED
#include "gemm_kind.cuh"
#endif

namespace ferry {

#ifndef FERRY_GEMM_EMULATED

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

// 2^x, the hardware's approximation with subnormal results flushed to 0: ex2.approx without .ftz compiles to a range
// test and two predicated multiplies around the same MUFU operation, three instructions an element of an epilogue.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

template <int T> __device__ __forceinline__ float to_f32(typename storage<T>::type v);
template <> __device__ __forceinline__ float to_f32<FERRY_SCALAR_F16>(u16 v) { return f16_to_f32(v); }
template <> __device__ __forceinline__ float to_f32<FERRY_SCALAR_BF16>(u16 v) { return bf16_to_f32(v); }
template <> __device__ __forceinline__ float to_f32<FERRY_SCALAR_F32>(float v) { return v; }

template <int T> __device__ __forceinline__ typename storage<T>::type from_f32(float v);
template <> __device__ __forceinline__ u16 from_f32<FERRY_SCALAR_F16>(float v) { return f32_to_f16(v); }
template <> __device__ __forceinline__ u16 from_f32<FERRY_SCALAR_BF16>(float v) { return f32_to_bf16(v); }
template <> __device__ __forceinline__ float from_f32<FERRY_SCALAR_F32>(float v) { return v; }

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
  if (IN == FERRY_SCALAR_BF16)
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

#if FERRY_NARROW_INPUTS
// d += a·b for one 16×8×32 tile of 8-bit operands (a row-major, b column-major). Their fragments hold the same bytes,
// register for register, as those of a 16×8×16 tile of 16-bit elements each made of two consecutive k values, so the
// 16-bit kernels' ldmatrix loads serve them unchanged (gemm_mma.cu). FP8: fp32 accumulators; int8: int32 ones.
#if FERRY_A_TYPE == FERRY_SCALAR_I8
#define FERRY_MMA_K32_TYPES "s32.s8.s8.s32"
#define FERRY_MMA_K32_ACC "+r"
typedef int narrow_acc;
#else
#if FERRY_A_TYPE == FERRY_SCALAR_E4M3 && FERRY_B_TYPE == FERRY_SCALAR_E4M3
#define FERRY_MMA_K32_TYPES "f32.e4m3.e4m3.f32"
#elif FERRY_A_TYPE == FERRY_SCALAR_E4M3
#define FERRY_MMA_K32_TYPES "f32.e4m3.e5m2.f32"
#elif FERRY_B_TYPE == FERRY_SCALAR_E4M3
#define FERRY_MMA_K32_TYPES "f32.e5m2.e4m3.f32"
#else
#define FERRY_MMA_K32_TYPES "f32.e5m2.e5m2.f32"
#endif
#define FERRY_MMA_K32_ACC "+f"
typedef float narrow_acc;
#endif
__device__ __forceinline__ void mma_k32(narrow_acc d[4], const u32 a[4], const u32 b[2]) {
  asm volatile("mma.sync.aligned.m16n8k32.row.col." FERRY_MMA_K32_TYPES " {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};"
               : FERRY_MMA_K32_ACC(d[0]), FERRY_MMA_K32_ACC(d[1]), FERRY_MMA_K32_ACC(d[2]), FERRY_MMA_K32_ACC(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif

// ---- wgmma (sm_90a only: gemm_wgmma.cu) -------------------------------------------------------------------
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
// D(64×256, the warpgroup's registers) += A(64×K) · B(K×256), both from shared memory through matrix descriptors:
// K 16 for fp16/bf16 (fp32 D; TRANS_A / TRANS_B: the operand is M-/N-major in shared memory instead of K-major), K 32
// for 8-bit operands (K-major only; fp32 D for FP8, int32 for int8 — the same 32 bytes of each row of K as a k16
// step of 16-bit ones, so the descriptors are the same). INSTR names the instruction, TAIL the operands after the
// descriptors (scale-d, and the scale and transpose immediates where the instruction has them), C the accumulators'
// constraint; the inputs after the descriptors, if any, follow.
#define FERRY_WGMMA_M64N256(INSTR, TAIL, C, ...)                                                                     \
  asm volatile(INSTR " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, " TAIL ";" \
               : C(d[0]), C(d[1]), C(d[2]), C(d[3]), C(d[4]), C(d[5]), C(d[6]), C(d[7]), C(d[8]), C(d[9]), \
                 C(d[10]), C(d[11]), C(d[12]), C(d[13]), C(d[14]), C(d[15]), C(d[16]), C(d[17]), C(d[18]), \
                 C(d[19]), C(d[20]), C(d[21]), C(d[22]), C(d[23]), C(d[24]), C(d[25]), C(d[26]), C(d[27]), \
                 C(d[28]), C(d[29]), C(d[30]), C(d[31]), C(d[32]), C(d[33]), C(d[34]), C(d[35]), C(d[36]), \
                 C(d[37]), C(d[38]), C(d[39]), C(d[40]), C(d[41]), C(d[42]), C(d[43]), C(d[44]), C(d[45]), \
                 C(d[46]), C(d[47]), C(d[48]), C(d[49]), C(d[50]), C(d[51]), C(d[52]), C(d[53]), C(d[54]), \
                 C(d[55]), C(d[56]), C(d[57]), C(d[58]), C(d[59]), C(d[60]), C(d[61]), C(d[62]), C(d[63]), \
                 C(d[64]), C(d[65]), C(d[66]), C(d[67]), C(d[68]), C(d[69]), C(d[70]), C(d[71]), C(d[72]), \
                 C(d[73]), C(d[74]), C(d[75]), C(d[76]), C(d[77]), C(d[78]), C(d[79]), C(d[80]), C(d[81]), \
                 C(d[82]), C(d[83]), C(d[84]), C(d[85]), C(d[86]), C(d[87]), C(d[88]), C(d[89]), C(d[90]), \
                 C(d[91]), C(d[92]), C(d[93]), C(d[94]), C(d[95]), C(d[96]), C(d[97]), C(d[98]), C(d[99]), \
                 C(d[100]), C(d[101]), C(d[102]), C(d[103]), C(d[104]), C(d[105]), C(d[106]), C(d[107]), C(d[108]), \
                 C(d[109]), C(d[110]), C(d[111]), C(d[112]), C(d[113]), C(d[114]), C(d[115]), C(d[116]), C(d[117]), \
                 C(d[118]), C(d[119]), C(d[120]), C(d[121]), C(d[122]), C(d[123]), C(d[124]), C(d[125]), C(d[126]), \
                 C(d[127])\
               : "l"(desc_a), "l"(desc_b) __VA_ARGS__)
// The same for a 64×64 D (32 registers a thread): the m ≤ 64 design, whose tile is one warpgroup's.
#define FERRY_WGMMA_M64N64(INSTR, TAIL, C, ...)                                                                      \
  asm volatile(INSTR " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, " TAIL ";" \
               : C(d[0]), C(d[1]), C(d[2]), C(d[3]), C(d[4]), C(d[5]), C(d[6]), C(d[7]), C(d[8]), C(d[9]), C(d[10]), \
                 C(d[11]), C(d[12]), C(d[13]), C(d[14]), C(d[15]), C(d[16]), C(d[17]), C(d[18]), C(d[19]), C(d[20]), \
                 C(d[21]), C(d[22]), C(d[23]), C(d[24]), C(d[25]), C(d[26]), C(d[27]), C(d[28]), C(d[29]), C(d[30]), \
                 C(d[31]) \
               : "l"(desc_a), "l"(desc_b) __VA_ARGS__)
// The same for a 64×128 D (64 registers a thread): a tile whose running FP8 sums are promoted to fp32 each k-tile
// (gemm_wgmma.cu), which needs a second set of accumulators beside them.
#define FERRY_WGMMA_M64N128(INSTR, TAIL, C, ...)                                                                     \
  asm volatile(INSTR " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, " TAIL ";" \
               : C(d[0]), C(d[1]), C(d[2]), C(d[3]), C(d[4]), C(d[5]), C(d[6]), C(d[7]), C(d[8]), C(d[9]), C(d[10]), C(d[11]), C(d[12]), C(d[13]), C(d[14]), C(d[15]), C(d[16]), C(d[17]), C(d[18]), C(d[19]), C(d[20]), C(d[21]), C(d[22]), C(d[23]), C(d[24]), C(d[25]), C(d[26]), C(d[27]), C(d[28]), C(d[29]), C(d[30]), C(d[31]), C(d[32]), C(d[33]), C(d[34]), C(d[35]), C(d[36]), C(d[37]), C(d[38]), C(d[39]), C(d[40]), C(d[41]), C(d[42]), C(d[43]), C(d[44]), C(d[45]), C(d[46]), C(d[47]), C(d[48]), C(d[49]), C(d[50]), C(d[51]), C(d[52]), C(d[53]), C(d[54]), C(d[55]), C(d[56]), C(d[57]), C(d[58]), C(d[59]), C(d[60]), C(d[61]), C(d[62]), C(d[63]) \
               : "l"(desc_a), "l"(desc_b) __VA_ARGS__)
// One k-step of a warpgroup's 64×N tile, N given by the accumulators' count (128: N 256, 64: N 128, 32: N 64).
template <int IN, int TRANS_A, int TRANS_B>
__device__ __forceinline__ void wgmma_k16(float (&d)[128], unsigned long long desc_a, unsigned long long desc_b) {
  if (IN == FERRY_SCALAR_BF16)
    FERRY_WGMMA_M64N256("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16", "1, 1, 1, %130, %131", "+f",
                        , "n"(TRANS_A), "n"(TRANS_B));
  else
    FERRY_WGMMA_M64N256("wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16", "1, 1, 1, %130, %131", "+f",
                        , "n"(TRANS_A), "n"(TRANS_B));
}
template <int IN, int TRANS_A, int TRANS_B>
__device__ __forceinline__ void wgmma_k16(float (&d)[64], unsigned long long desc_a, unsigned long long desc_b) {
  if (IN == FERRY_SCALAR_BF16)
    FERRY_WGMMA_M64N128("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16", "1, 1, 1, %66, %67", "+f",
                        , "n"(TRANS_A), "n"(TRANS_B));
  else
    FERRY_WGMMA_M64N128("wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16", "1, 1, 1, %66, %67", "+f",
                        , "n"(TRANS_A), "n"(TRANS_B));
}
template <int IN, int TRANS_A, int TRANS_B>
__device__ __forceinline__ void wgmma_k16(float (&d)[32], unsigned long long desc_a, unsigned long long desc_b) {
  if (IN == FERRY_SCALAR_BF16)
    FERRY_WGMMA_M64N64("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16", "1, 1, 1, %34, %35", "+f",
                       , "n"(TRANS_A), "n"(TRANS_B));
  else
    FERRY_WGMMA_M64N64("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16", "1, 1, 1, %34, %35", "+f",
                       , "n"(TRANS_A), "n"(TRANS_B));
}
#if FERRY_NARROW_INPUTS
// The k32 instruction's types, its operands after the descriptors, and its accumulators' constraint.
#if FERRY_A_TYPE == FERRY_SCALAR_I8
#define FERRY_WGMMA_K32(N) "wgmma.mma_async.sync.aligned.m64n" #N "k32.s32.s8.s8", "1", "+r"
#elif FERRY_A_TYPE == FERRY_SCALAR_E4M3 && FERRY_B_TYPE == FERRY_SCALAR_E4M3
#define FERRY_WGMMA_K32(N) "wgmma.mma_async.sync.aligned.m64n" #N "k32.f32.e4m3.e4m3", "1, 1, 1", "+f"
#elif FERRY_A_TYPE == FERRY_SCALAR_E4M3
#define FERRY_WGMMA_K32(N) "wgmma.mma_async.sync.aligned.m64n" #N "k32.f32.e4m3.e5m2", "1, 1, 1", "+f"
#elif FERRY_B_TYPE == FERRY_SCALAR_E4M3
#define FERRY_WGMMA_K32(N) "wgmma.mma_async.sync.aligned.m64n" #N "k32.f32.e5m2.e4m3", "1, 1, 1", "+f"
#else
#define FERRY_WGMMA_K32(N) "wgmma.mma_async.sync.aligned.m64n" #N "k32.f32.e5m2.e5m2", "1, 1, 1", "+f"
#endif
#define FERRY_WGMMA_EXPAND_256(...) FERRY_WGMMA_M64N256(__VA_ARGS__)
#define FERRY_WGMMA_EXPAND_64(...) FERRY_WGMMA_M64N64(__VA_ARGS__)
#define FERRY_WGMMA_EXPAND_128(...) FERRY_WGMMA_M64N128(__VA_ARGS__)
__device__ __forceinline__ void wgmma_k32(narrow_acc (&d)[128], unsigned long long desc_a,
                                          unsigned long long desc_b) {
  FERRY_WGMMA_EXPAND_256(FERRY_WGMMA_K32(256), );
}
__device__ __forceinline__ void wgmma_k32(narrow_acc (&d)[32], unsigned long long desc_a, unsigned long long desc_b) {
  FERRY_WGMMA_EXPAND_64(FERRY_WGMMA_K32(64), );
}
__device__ __forceinline__ void wgmma_k32(narrow_acc (&d)[64], unsigned long long desc_a, unsigned long long desc_b) {
  FERRY_WGMMA_EXPAND_128(FERRY_WGMMA_K32(128), );
}
#undef FERRY_WGMMA_EXPAND_256
#undef FERRY_WGMMA_EXPAND_64
#undef FERRY_WGMMA_EXPAND_128
#endif
#undef FERRY_WGMMA_M64N256
#undef FERRY_WGMMA_M64N64
#undef FERRY_WGMMA_M64N128
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Keeps the compiler from moving an accumulator across the asynchronous wgmma that owns it.
__device__ __forceinline__ void wgmma_fence_operand(float &r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ __forceinline__ void wgmma_fence_operand(int &r) { asm volatile("" : "+r"(r)::"memory"); }
// Orders this thread's generic-proxy shared-memory writes (cp.async included) before async-proxy reads (wgmma).
__device__ __forceinline__ void fence_proxy_async_shared() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// mbarriers (the persistent schedule of gemm_wgmma.cu): a 64-bit shared object counting arrivals per phase.
__device__ __forceinline__ void mbar_init(u32 bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u32 bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
// An arrival that happens when every cp.async this thread issued before it has landed; one of the expected ones.
__device__ __forceinline__ void cp_async_mbar_arrive(u32 bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}
// Waits until the phase of parity `parity` has completed (acquire: what the arrivals released is visible).
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
  asm volatile("{\n\t.reg .pred done;\n"
               "MBAR_WAIT:\n\t"
               "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n\t"
               "@!done bra MBAR_WAIT;\n}" ::"r"(bar),
               "r"(parity)
               : "memory");
}
// TMA (gemm_wgmma.cu's FERRY_TMA schedule): a tensor map (CUtensorMap) that the host encoded (src/ops/tma.c) and
// passed as a __grid_constant__ parameter, opaque here; one for each operand.
struct __align__(64) tma_map {
  unsigned long long opaque[16];
};
struct tma_maps {
  tma_map a, b;
};
// One arrival that also expects `bytes` more to land (by complete_tx) before the phase completes.
__device__ __forceinline__ void mbar_arrive_expect_tx(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
// The box of `map` at coordinates (c0 innermost, c1, c2) into shared memory at dst, in the map's swizzle; the
// elements outside the tensor land as zeros, and the box's whole size counts towards `bar`'s transactions.
__device__ __forceinline__ void tma_load(u32 dst, const tma_map *map, int c0, int c1, int c2, u32 bar) {
  asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, "
               "%4}], [%5];" ::"r"(dst),
               "l"((unsigned long long)map), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
               : "memory");
}
// Clusters (gemm_wgmma.cu's FERRY_CLUSTER): blocks of a cluster run at once on one GPC and reach each other's
// shared memory. This block's rank in its cluster.
__device__ __forceinline__ int cluster_rank() {
  u32 r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return (int)r;
}
// Every thread of every block of the cluster, with release/acquire: what each wrote before is visible to all after.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// This thread's mbarrier.init, visible to the cluster's other blocks (before their arrivals and multicasts).
__device__ __forceinline__ void fence_mbarrier_init_cluster() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// The shared::cluster address of this block's shared address `addr` in the cluster's block `rank`.
__device__ __forceinline__ u32 cluster_map(u32 addr, int rank) {
  u32 r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}
// An arrival on the mbarrier at a shared::cluster address (cluster_map's), possibly another block's. At the default
// .release.cta: what it orders (a stage's reads by wgmma) is complete once wgmma.wait_group returns, and a
// .release.cluster arrival waits for every earlier memory operation of the thread (ERRBAR): 69% of the cluster
// design's stalls under ncu, and half its time.
__device__ __forceinline__ void mbar_arrive_cluster(u32 cluster_addr) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(cluster_addr) : "memory");
}
// tma_load into every block of `cta_mask` (bit r: rank r) at the same shared offset dst, each completing the bytes on
// its own mbarrier at offset bar.
__device__ __forceinline__ void tma_load_multicast(u32 dst, const tma_map *map, int c0, int c1, int c2, u32 bar,
                                                   u16 cta_mask) {
  asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], "
               "[%1, {%2, %3, %4}], [%5], %6;" ::"r"(dst),
               "l"((unsigned long long)map), "r"(c0), "r"(c1), "r"(c2), "r"(bar), "h"(cta_mask)
               : "memory");
}
__device__ __forceinline__ void tma_prefetch(const tma_map *map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"((unsigned long long)map) : "memory");
}
// Hands registers between the warpgroups of a block (each warpgroup as a whole): the copying one needs few.
template <int N> __device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N));
}
template <int N> __device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N));
}
#endif

#endif // FERRY_GEMM_EMULATED

// ---- the stage copy (plain C++: the emulation runs this text) ------------------------------------------------

// Copies k-tile `kt` of A and B into pipeline stage `s` and moves the copy pointers on by one k-tile; called for
// kt = 0, 1, 2, ... in order. FULL: the k-tile is known to exist and to lie inside the operands, so its copies need
// no predicates; otherwise they are full copies still when the block's tile and the k-tile lie inside, edge copies
// (predicated, zero-filled) when not. ML is the main loop of gemm_mma_sw.cu or gemm_wgmma.cu: its tile copies
// (copy_a, copy_b), the operands' majors, BK and the stage's bytes, and the copy state it keeps.
template <bool FULL, class ML> __device__ __forceinline__ void load_stage(ML &ml, int s, int kt) {
  typedef typename ML::copy_a copy_a;
  typedef typename ML::copy_b copy_b;
  const int k0 = kt * ML::bk;
  const u32 stage = ml.smem + s * ML::stage_bytes;
  if (FULL || (ml.inside_mn && k0 + ML::bk <= ml.p.k)) {
    copy_a::full(stage + ml.a_dst, ml.a_next, ml.p.lda);
    copy_b::full(stage + ml.b_dst, ml.b_next, ml.p.ldb);
  } else {
    // Empty copies point at the batch's first element, which exists whenever there is a k-tile to load.
    const int m_left = ml.p.m - ml.m0, n_left = ml.p.n - ml.n0, k_left = ml.p.k - k0;
    copy_a::edge(stage + ml.a_dst, ml.a_next, ml.A, ml.p.lda, (ML::a_row ? m_left : k_left) - copy_a::row0(),
                 (ML::a_row ? k_left : m_left) - copy_a::col0());
    copy_b::edge(stage + ml.b_dst, ml.b_next, ml.B, ml.p.ldb, (ML::b_row ? k_left : n_left) - copy_b::row0(),
                 (ML::b_row ? n_left : k_left) - copy_b::col0());
  }
  ml.a_next += ml.a_kstep;
  ml.b_next += ml.b_kstep;
}

}  // namespace ferry

#endif
