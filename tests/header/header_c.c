/* The public headers compile as C11, with no CUDA header on the include path: ferry.h alone here, ferry/ops.h
 * alone (it brings ferry.h itself) in header_ops_c.c. */
#include "ferry.h"
_Static_assert(sizeof(ferry_tensor) == 48, "ferry_tensor must keep DLTensor's layout");
int header_ops_c(void);
int main(void) { return FERRY_OK + header_ops_c(); }
