/* ferry/ops.h compiles alone as C11 (see header_c.c). */
#include "ferry/ops.h"
_Static_assert(sizeof(ferry_gemm_params) == 128, "ferry_gemm_params must match the kernels' view of it");
int header_ops_c(void) { return FERRY_OK; }
