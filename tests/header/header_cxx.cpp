// The public header compiles alone as C++ (declarations only: nothing is linked).
#include "ferry.h"
static_assert(sizeof(ferry_tensor) == 48, "ferry_tensor must keep DLTensor's layout");
int main() { return FERRY_OK; }
