/* tma.c — the tensor maps of a TMA kernel's launch (gemm_wgmma.cu with FERRY_TMA), one per operand.
 *
 * The kernel loads each k-tile of A and B as boxes of 64 contiguous 2-byte elements (128 bytes, swizzled 128 bytes
 * wide: the layout its wgmma descriptors read) by rows: a K-major operand's box is the tile's BM or BN rows by 64 of
 * k, an MN-major one's is 64 of m or n by the k-tile's 64 rows of k, one box per 64-wide panel. 8-bit operands travel
 * as 2-byte pairs along k, as in every kernel (so k counts pairs here). Dimension 2 is the batch: l of them, or one
 * for a broadcast operand (batch stride 0), whose kernel always asks for batch 0. The tensor unit zero-fills what
 * lies outside the operand, which is how the kernel's edge tiles and a k that is not a multiple of 64 are served.
 *
 * The host's alignment checks (supports.c: 16-byte address, leading dimension and batch stride for these designs)
 * are what the encoding needs of strides and addresses; what it refuses anyway (a stride of 2^40 bytes or more) is
 * an error of the launch with the driver's reason.
 */
#include "ops.h"

#include <string.h>

_Static_assert(FERRY__TMA_MAPS_BYTES == 2 * sizeof(CUtensorMap), "two tensor maps per launch");

/* One operand's map. rows × cols is the operand's logical shape (A: m × k; B: k × n); `k_rows`: whether k runs
 * down its rows (B) or along them (A). */
static ferry_status encode_operand(CUtensorMap *map, const char *name, const void *base, int64_t rows, int64_t cols,
                                   int k_rows, int row_major, int64_t ld, int64_t batch, int32_t l, uint32_t es,
                                   uint32_t tile) {
  const int64_t contiguous = row_major ? cols : rows, other = row_major ? rows : cols;
  /* K-major when k is the contiguous dimension: the box is the tile's rows; else 64 rows of k */
  const int k_major = k_rows ? !row_major : row_major;
  const uint64_t pair = es == 1 ? 2 : 1; /* 8-bit: k contiguous (the only layout those kernels take) */
  const cuuint64_t dims[3] = {(cuuint64_t)(contiguous / (int64_t)pair), (cuuint64_t)other,
                              batch ? (cuuint64_t)l : 1u};
  const cuuint64_t strides[2] = {(cuuint64_t)ld * es, batch ? (cuuint64_t)batch * es : (cuuint64_t)ld * es};
  const cuuint32_t box[3] = {64u, k_major ? tile : 64u, 1u}, element_strides[3] = {1u, 1u, 1u};
  ferry_status st = FERRY_OK;
  FERRY_TRY_CU(("encoding the tensor map of operand %s (%lld × %lld, leading dimension %lld, batch stride %lld)",
                name, (long long)rows, (long long)cols, (long long)ld, (long long)batch),
               cuTensorMapEncodeTiled, map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 3u, (void *)(uintptr_t)base, dims,
               strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
cleanup:
  return st;
}

ferry_status ferry__tma_encode(const ferry_artifact *art, const ferry_gemm_args *args, void *maps) {
  const ferry_gemm_problem *p = &args->problem;
  CUtensorMap *m = maps;
  memset(maps, 0, FERRY__TMA_MAPS_BYTES);
  if (p->m <= 0 || p->n <= 0 || p->k <= 0) return FERRY_OK; /* nothing is loaded: no map is read */
  const uint32_t es_a = (uint32_t)ferry__scalar_bytes(p->a_type), es_b = (uint32_t)ferry__scalar_bytes(p->b_type);
  ferry_status st = encode_operand(&m[0], "A", args->a, p->m, p->k, 0, p->a_major == FERRY_MAJOR_ROW, p->lda,
                                   p->l > 1 ? p->batch_a : 0, p->l, es_a, art->tile_m);
  if (st != FERRY_OK) return st;
  /* a cluster's blocks each load 1/cluster of B's tile for all of them: a K-major box is that many rows */
  return encode_operand(&m[1], "B", args->b, p->k, p->n, 1, p->b_major == FERRY_MAJOR_ROW, p->ldb,
                        p->l > 1 ? p->batch_b : 0, p->l, es_b, art->tile_n / (uint32_t)art->cluster);
}
