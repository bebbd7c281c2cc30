/* The public header compiles alone as C11, with no CUDA header on the include path. */
#include "ferry.h"
_Static_assert(sizeof(ferry_tensor) == 48, "ferry_tensor must keep DLTensor's layout");
int main(void) { return FERRY_OK; }
