/* reliability_util.h — helpers shared by the reliability suite's CPU tests (see reliability_util.c). */
#ifndef FERRY_RELIABILITY_UTIL_H
#define FERRY_RELIABILITY_UTIL_H
#include "internal.h"

/* Compares the compact tensor `out` with the (possibly strided, even negatively or zero-strided) tensor `in`
 * element by element in row-major order; both must be readable from the host (under the simulated driver, device
 * memory is host memory). Returns the number of elements that differ, 0 when exact; also checks dtype and rank
 * (a mismatch there counts as one). */
size_t rel_diff_elements(const ferry_tensor *in, const ferry_tensor *out);

/* xorshift32: a small, seedable generator for random batches (never seed with 0). */
static inline uint32_t rel_rand(uint32_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 17;
  *s ^= *s << 5;
  return *s;
}
#endif
