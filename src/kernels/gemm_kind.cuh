// gemm_kind.cuh — the problem's kind as ferry's GEMM kernels see it: the FERRY_* macros' defaults and the storage
// type of each element type code.
//
// ferry defines the macros of the problem's kind ahead of this text (src/ops/source.c); the defaults only serve
// checking the kernel files with nvcc (cmake/ops.cmake, ferry_check_kernels). Plain C++, so that the CPU emulation
// (tests/kernels/emulate_cuda.h) includes this same text rather than a copy of it.
#ifndef FERRY_GEMM_KIND_INCLUDED
#define FERRY_GEMM_KIND_INCLUDED

#ifndef FERRY_GEMM_PARAMS_INCLUDED
#include "gemm_params.cuh"
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

namespace ferry {

typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;

// Storage type of a ferry_scalar code.
template <int T> struct storage { typedef u16 type; };
template <> struct storage<FERRY_SCALAR_F32> { typedef float type; };

}  // namespace ferry

#endif
