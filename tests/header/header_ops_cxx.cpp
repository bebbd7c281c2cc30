// ferry/ops.h compiles alone as C++ (see header_cxx.cpp).
#include "ferry/ops.h"
static_assert(sizeof(ferry_gemm_params) == 128, "ferry_gemm_params must match the kernels' view of it");
int header_ops_cxx() { return FERRY_OK; }
