/* fuzz_artifact.c — libFuzzer target over ferry's artifact files: the format's verifier, artifact import and the
 * disk cache's entry reader, under AddressSanitizer and UndefinedBehaviorSanitizer (built only with clang:
 * cmake -DFERRY_FUZZ=ON, see docs/reliability.md). What a pass means: no crash, no sanitizer report, no leak, and
 * the invariant that a file accepted as an artifact really is one — its cubin starts with the ELF magic and lies
 * inside the file. See fuzz_common.h for the input's mode byte. Seeds: tests/fuzz/corpus (make_corpus.c). */
#include "fuzz_common.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char import_path[600], cache_dir[600];
static const ferry_op *op;
static uint8_t cache_key[32];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  char tmpl[] = "/tmp/ferry-fuzz-XXXXXX";
  if (!mkdtemp(tmpl)) abort();
  setenv("XDG_CACHE_HOME", tmpl, 1);
  unsetenv("FERRY_DISK_CACHE");
  snprintf(import_path, sizeof import_path, "%s/import.ferry", tmpl);
  op = fuzz_op();
  int dirfd = op ? ferry__cache_dir_open(cache_dir, sizeof cache_dir) : -1;
  if (dirfd < 0) abort();
  close(dirfd);
  for (int i = 0; i < 32; i++) cache_key[i] = (uint8_t)(i * 7 + 1);
  return 0;
}

static void put32(unsigned char *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i)); }
static void put64(unsigned char *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i)); }

/* Makes the header's payload length and checksum agree with the bytes (and stamps the record, see
 * fuzz_common.h). The checksum covers the header before it, so it is computed last. */
static void fix_up(unsigned char *f, size_t size, int stamp, const uint8_t *key) {
  if (size < FERRY__ART_HEADER) return;
  unsigned char *m = f + FERRY__ART_HEADER;
  size_t payload = size - FERRY__ART_HEADER;
  if (stamp && payload >= FERRY__ART_META) {
    memset(m, 0, 64);
    memcpy(m, FUZZ_OP_NAME, sizeof FUZZ_OP_NAME);
    memcpy(m + 64, op->digest, 32);
    put32(m + 96, FUZZ_KIND);
    put32(m + 100, FUZZ_SM);
    if (key) memcpy(f + 16, key, 32);
  }
  put64(f + 48, payload);
  put64(f + 56, ferry__art_checksum(f, payload));
}

static void write_file(const char *path, const unsigned char *data, size_t size) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) abort();
  if (size && write(fd, data, size) != (ssize_t)size) abort();
  close(fd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  int mode = data[0] & 3, stamp = (data[0] & FUZZ_STAMP) != 0;
  size--;
  unsigned char *f = malloc(size ? size : 1);
  memcpy(f, data + 1, size);
  if (mode != FUZZ_MODE_RAW) fix_up(f, size, stamp, mode == FUZZ_MODE_CACHE ? cache_key : NULL);
  if (mode == FUZZ_MODE_RAW || mode == FUZZ_MODE_FIXED) {
    ferry__art_meta meta;
    uint8_t key[32];
    size_t offset = 0;
    char why[200];
    if (ferry__art_verify(f, size, NULL, &meta, key, &offset, why, sizeof why)) {
      /* Accepted: the cubin must lie inside the file and look like one. */
      if (offset + meta.cubin_size != size || memcmp(f + offset, "\x7f" "ELF", 4) != 0) abort();
    } else if (!why[0]) {
      abort(); /* a refusal always says why */
    }
  } else if (mode == FUZZ_MODE_IMPORT) {
    write_file(import_path, f, size);
    ferry_artifact *art = NULL;
    if (ferry_artifact_import(import_path, &art) == FERRY_OK) {
      size_t n = 0;
      const unsigned char *cubin = ferry_artifact_cubin(art, &n);
      if (ferry_artifact_op(art) != op || n + FERRY__ART_HEADER + FERRY__ART_META != size ||
          memcmp(cubin, "\x7f" "ELF", 4) != 0)
        abort();
      ferry_artifact_release(art);
    } else if (!ferry_last_error_message()[0]) {
      abort();
    }
  } else {
    char path[700], hex[65];
    ferry__hex(cache_key, 32, hex);
    snprintf(path, sizeof path, "%s/%s.ferry", cache_dir, hex);
    write_file(path, f, size);
    unsigned char *cubin = NULL;
    void *block = NULL;
    size_t n = 0;
    if (ferry__cache_load(op, FUZZ_KIND, FUZZ_SM, cache_key, &block, &cubin, &n)) {
      /* The cubin is used where it lies in the file's image: right after the header and the record. */
      if (n + FERRY__ART_HEADER + FERRY__ART_META != size || cubin != (unsigned char *)block + size - n ||
          memcmp(cubin, "\x7f" "ELF", 4) != 0)
        abort();
      free(block);
    }
  }
  free(f);
  return 0;
}
