// The private headers' functions return the types they mean: C converts an int to an enum silently, C++ does not
// (declarations only: nothing is linked). Built with the CUDA headers, which driver.h includes for their types.
#include "driver.h"

#include <type_traits>

static_assert(std::is_same<decltype(ferry__driver_load()), ferry_status>::value,
              "ferry__driver_load returns a ferry_status, not an int");
int main() { return 0; }
