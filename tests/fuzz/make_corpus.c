/* make_corpus.c — writes the artifact fuzz target's seed corpus (tests/fuzz/corpus): real artifacts of the fuzz
 * operator compiled by NVRTC for sm_90, in every mode, whole and cut, with a few hand-made bad ones.
 * usage: ferry_fuzz_corpus DIR   (needs NVRTC, no GPU) */
#include "fuzz_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void seed(const char *dir, const char *name, int mode, const unsigned char *bytes, size_t n) {
  char path[800];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (!f) {
    perror(path);
    exit(1);
  }
  unsigned char m = (unsigned char)mode;
  fwrite(&m, 1, 1, f);
  fwrite(bytes, 1, n, f);
  fclose(f);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const ferry_op *op = fuzz_op();
  int64_t shape[3][2] = {{8, 8}, {8, 8}, {8, 8}};
  ferry_tensor t[3];
  for (int i = 0; i < 3; i++)
    t[i] = (ferry_tensor){(void *)(uintptr_t)(0x10000000u * (i + 1)), {FERRY_DEVICE_CUDA, 0}, 2,
                          {FERRY_DTYPE_FLOAT, 32, 1}, shape[i], NULL, 0};
  ferry_gemm_args args;
  ferry_artifact *art = NULL;
  unsigned char *file = NULL;
  size_t size = 0;
  if (!op || ferry_gemm_args_init(&args, &t[0], &t[1], &t[2], FERRY_SCALAR_F32) != FERRY_OK ||
      ferry_op_compile_for(op, &args, FUZZ_SM, &art) != FERRY_OK || ferry__art_encode(art, &file, &size) != FERRY_OK) {
    fprintf(stderr, "cannot make an artifact: %s\n", ferry_last_error_message());
    return 1;
  }
  const char *dir = argv[1];
  seed(dir, "valid-raw", FUZZ_MODE_RAW, file, size);
  seed(dir, "valid-fixed", FUZZ_MODE_FIXED, file, size);
  seed(dir, "valid-import", FUZZ_MODE_IMPORT | FUZZ_STAMP, file, size);
  seed(dir, "valid-cache", FUZZ_MODE_CACHE | FUZZ_STAMP, file, size);
  seed(dir, "header-only", FUZZ_MODE_RAW, file, FERRY__ART_HEADER);
  seed(dir, "meta-only", FUZZ_MODE_FIXED, file, FERRY__ART_HEADER + FERRY__ART_META);
  seed(dir, "cut-cubin", FUZZ_MODE_IMPORT | FUZZ_STAMP, file, FERRY__ART_HEADER + FERRY__ART_META + 64);
  seed(dir, "cut-header", FUZZ_MODE_CACHE, file, 40);
  unsigned char *bad = malloc(size);
  memcpy(bad, file, size);
  bad[8] = FERRY__ART_VERSION + 1; /* a newer format */
  seed(dir, "version-next", FUZZ_MODE_FIXED, bad, size);
  bad[8] = 1; /* format 1, whose files carried a SHA-256 where the checksum is now */
  seed(dir, "version-1", FUZZ_MODE_FIXED, bad, size);
  memcpy(bad, file, size);
  memcpy(bad + FERRY__ART_HEADER, "other_op", 9);
  seed(dir, "other-op", FUZZ_MODE_IMPORT, bad, size);
  memcpy(bad, file, size);
  bad[FERRY__ART_HEADER + FERRY__ART_META] = 'M';
  seed(dir, "not-elf", FUZZ_MODE_CACHE | FUZZ_STAMP, bad, size);
  printf("wrote 12 seeds of up to %zu bytes to %s\n", size + 1, dir);
  free(bad);
  free(file);
  ferry_artifact_release(art);
  return 0;
}
