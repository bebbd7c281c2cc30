/* gather_types.h — the gather kernel's work, as the host writes it (src/plan.c) and the kernel reads it
 * (src/kernels/gather.cu): one definition in plain C, which the C compiler and nvcc both read, so the two sides
 * cannot disagree on a field or its place. */
#ifndef FERRY_GATHER_TYPES_H
#define FERRY_GATHER_TYPES_H

#include <stdint.h>

#define FERRY_GATHER_MAX_DIMS 8
#define FERRY_GATHER_CONTIGUOUS 0xffffffffu
#define FERRY_GATHER_CHUNK (64u * 1024u) /* bytes of output per thread block */

/* One block's work: copy `nbytes` of output starting at element `first_elem` of layout `layout`
 * (FERRY_GATHER_CONTIGUOUS: a byte range at src). */
typedef struct ferry__gather_item {
  uint64_t src;
  uint64_t dst;
  uint32_t nbytes;
  uint32_t layout;
  uint64_t first_elem;
} ferry__gather_item;

/* A tensor's (collapsed) dimensions: element (i0, i1, ...) is at sum(i_d * stride_bytes[d]) from the base. */
typedef struct ferry__gather_layout {
  int32_t ndim;
  int32_t elem_bytes; /* bit 8 set: a base or stride is not a multiple of the element size (copy bytes) */
  int64_t shape[FERRY_GATHER_MAX_DIMS];
  int64_t stride_bytes[FERRY_GATHER_MAX_DIMS];
} ferry__gather_layout;

#endif
