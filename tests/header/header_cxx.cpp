// The public headers compile as C++ (declarations only: nothing is linked): ferry.h alone here, ferry/ops.h alone
// in header_ops_cxx.cpp.
#include "ferry.h"
static_assert(sizeof(ferry_tensor) == 48, "ferry_tensor must keep DLTensor's layout");
int header_ops_cxx();
int main() { return FERRY_OK + header_ops_cxx(); }
