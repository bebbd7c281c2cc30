// gemm_kind.cuh — the problem's kind as ferry's GEMM kernels see it: the FERRY_* macros' defaults and the storage
// type of each element type code.
//
// ferry defines the macros of the problem's kind, and the element type codes from ferry_scalar's values, ahead of
// this text (src/ops/source.c); the defaults only serve checking the kernel files with nvcc (cmake/ops.cmake,
// ferry_check_kernels, tools/check_kernel_identity.sh) and the CPU emulation, and a CPU test holds the codes' defaults
// to ferry_scalar. Plain C++, so that the emulation (tests/kernels/emulate_cuda.h) includes this same text rather
// than a copy of it.
#ifndef FERRY_GEMM_KIND_INCLUDED
#define FERRY_GEMM_KIND_INCLUDED

#ifndef FERRY_GEMM_PARAMS_H
#include "../../include/ferry/gemm_params.h"
#endif

#ifndef FERRY_SCALAR_F16
#define FERRY_SCALAR_F16 1
#define FERRY_SCALAR_BF16 2
#define FERRY_SCALAR_F32 3
#define FERRY_SCALAR_E4M3 4
#define FERRY_SCALAR_E5M2 5
#define FERRY_SCALAR_I8 6
#define FERRY_SCALAR_I32 7
#endif

#ifndef FERRY_A_TYPE
#define FERRY_A_TYPE FERRY_SCALAR_F16
#endif
#ifndef FERRY_B_TYPE
#define FERRY_B_TYPE FERRY_A_TYPE
#endif
#ifndef FERRY_OUT_TYPE
#define FERRY_OUT_TYPE FERRY_SCALAR_F32
#endif
#ifndef FERRY_ACC_TYPE
#define FERRY_ACC_TYPE FERRY_SCALAR_F32
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
#ifndef FERRY_BIAS
#define FERRY_BIAS 0 // ferry_bias: 1 a row of n values, 2 a column of m values
#endif
#ifndef FERRY_ACTIVATION
#define FERRY_ACTIVATION 0 // ferry_activation: 1 ReLU, 2 GELU (tanh), 3 SiLU
#endif
#ifndef FERRY_SCALED
#define FERRY_SCALED 0 // 1: alpha is multiplied by *scale_a and *scale_b
#endif
// 8-bit inputs (FP8 or int8): k contiguous in both operands, carried as 16-bit pairs along k (gemm_mma.cu says why)
#define FERRY_NARROW_INPUTS (FERRY_A_TYPE >= FERRY_SCALAR_E4M3 && FERRY_A_TYPE <= FERRY_SCALAR_I8)

namespace ferry {

typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;

// Storage type of a ferry_scalar code.
template <int T> struct storage { typedef u16 type; };
template <> struct storage<FERRY_SCALAR_F32> { typedef float type; };
template <> struct storage<FERRY_SCALAR_E4M3> { typedef unsigned char type; };
template <> struct storage<FERRY_SCALAR_E5M2> { typedef unsigned char type; };
template <> struct storage<FERRY_SCALAR_I8> { typedef signed char type; };
template <> struct storage<FERRY_SCALAR_I32> { typedef int type; };

}  // namespace ferry

#endif
