/* fuzz_common.h — what the artifact fuzz target and its corpus maker share: the small operator whose artifacts
 * seed the corpus (registered under the same name and source in both, so a seed's operator record matches), the
 * kind and target they are compiled for, and the meaning of an input's first byte. */
#ifndef FERRY_FUZZ_COMMON_H
#define FERRY_FUZZ_COMMON_H

#include "ops.h"

/* An input is one mode byte, then the bytes of a file. The low two bits pick what reads the file:
 *   0  ferry__art_verify over the bytes as they are;
 *   1  the same after fixing the header's payload length and checksum (so mutations reach the checks behind the
 *      checksum instead of dying at it);
 *   2  ferry_artifact_import of the (fixed) bytes written to a file: read_file, verify, the registry lookup,
 *      artifact creation and the memo;
 *   3  the disk cache's reader (ferry__cache_load) of the (fixed) bytes written as the entry of a known key.
 * Bit 4 set: also stamp the operator record with the fuzz operator's name, digest, kind and target (and in
 * mode 3 the expected key), so the checks after those are reached too. */
#define FUZZ_MODE_RAW 0
#define FUZZ_MODE_FIXED 1
#define FUZZ_MODE_IMPORT 2
#define FUZZ_MODE_CACHE 3
#define FUZZ_STAMP 0x10

#define FUZZ_OP_NAME "fuzz_tiny"
#define FUZZ_SM 90
#define FUZZ_KIND FERRY_GEMM_KIND(FERRY_SCALAR_F32, FERRY_SCALAR_F32, FERRY_SCALAR_F32, FERRY_SCALAR_F32, 0, 0, 0)

static inline const ferry_op *fuzz_op(void) {
  const ferry_op *op = ferry_op_by_name(FUZZ_OP_NAME);
  if (op) return op;
  ferry_op_desc d;
  ferry_op_desc_init(&d);
  d.info.name = FUZZ_OP_NAME;
  d.info.tile_m = 32;
  d.info.tile_n = 16;
  d.info.threads = 64;
  d.source = "extern \"C\" __global__ void fuzz_tiny(ferry_gemm_params p) {\n"
             "  if (threadIdx.x == 0 && p.m > 0) static_cast<float *>(p.out)[0] = p.alpha;\n"
             "}\n";
  d.entry = "fuzz_tiny";
  if (ferry_op_register(&d, &op) != FERRY_OK) return NULL;
  return op;
}
#endif
