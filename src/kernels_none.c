/* kernels_none.c — stands in for the embedded gather kernel in builds without nvcc. */
#include <stddef.h>
const unsigned char ferry__gather_fatbin[1] = {0};
const size_t ferry__gather_fatbin_size = 0;
