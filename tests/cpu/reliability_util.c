/* reliability_util.c — the element-wise reference comparison the reliability tests check outputs with. */
#include "reliability_util.h"

#include <string.h>

size_t rel_diff_elements(const ferry_tensor *in, const ferry_tensor *out) {
  if (out->dtype.code != in->dtype.code || out->dtype.bits != in->dtype.bits ||
      out->dtype.lanes != in->dtype.lanes || out->ndim != in->ndim)
    return 1;
  uint64_t eb = (uint64_t)in->dtype.bits * in->dtype.lanes / 8, n = 1;
  int64_t idx[FERRY_MAX_NDIM] = {0}, compact[FERRY_MAX_NDIM];
  const int64_t *strides = in->strides;
  if (!strides) {
    ferry__compact_strides(in->ndim, in->shape, compact);
    strides = compact;
  }
  for (int32_t d = 0; d < in->ndim; d++) n *= (uint64_t)in->shape[d];
  const char *src = (const char *)in->data + in->byte_offset, *dst = out->data;
  size_t bad = 0;
  for (uint64_t e = 0; e < n; e++) {
    int64_t off = 0;
    for (int32_t d = 0; d < in->ndim; d++) off += idx[d] * strides[d];
    bad += memcmp(dst + e * eb, src + off * (int64_t)eb, eb) != 0;
    for (int32_t d = in->ndim - 1; d >= 0 && ++idx[d] == in->shape[d]; d--) idx[d] = 0;
  }
  return bad;
}
