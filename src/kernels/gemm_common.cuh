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

// ---- wgmma (sm_90a only: gemm_wgmma.cu) -------------------------------------------------------------------
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
// D(64×256, fp32, the warpgroup's registers) += A(64×16) · B(16×256), both from shared memory through matrix
// descriptors. TRANS_A / TRANS_B: the operand is M-/N-major in shared memory instead of K-major. The instruction
// for fp16 operands and the one for bf16 differ only in the type they name, so one text serves both: TYPE is the
// PTX type as a string literal.
#define FERRY_WGMMA_M64N256K16(TYPE)                                                                                 \
  asm volatile("wgmma.mma_async.sync.aligned.m64n256k16.f32." TYPE "." TYPE " "                                      \
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, 1, 1, 1, %130, %131;" \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),     \
                 "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
                 "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
                 "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
                 "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
                 "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
                 "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
                 "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), \
                 "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
                 "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
                 "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
                 "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
                 "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
                 "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
                 "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
                 "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127]) \
               : "l"(desc_a), "l"(desc_b), "n"(TRANS_A), "n"(TRANS_B))
template <int IN, int TRANS_A, int TRANS_B>
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], unsigned long long desc_a,
                                                 unsigned long long desc_b) {
  if (IN == FERRY_SCALAR_BF16)
    FERRY_WGMMA_M64N256K16("bf16");
  else
    FERRY_WGMMA_M64N256K16("f16");
}
#undef FERRY_WGMMA_M64N256K16
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Keeps the compiler from moving an accumulator across the asynchronous wgmma that owns it.
__device__ __forceinline__ void wgmma_fence_operand(float &r) { asm volatile("" : "+f"(r)::"memory"); }
// Orders this thread's generic-proxy shared-memory writes (cp.async included) before async-proxy reads (wgmma).
__device__ __forceinline__ void fence_proxy_async_shared() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
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
