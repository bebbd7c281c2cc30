/* source.c — what NVRTC is given for an operator and a problem kind, and the key that names the result.
 *
 * The full source is self-contained text: a comment naming the operator, the kind as FERRY_* macros, the
 * parameter struct, then (for ferry's own operators) the design's macros, the shared helpers and the kernel. The
 * key hashes exactly what determines the cubin — that text, the options, the target, NVRTC's and the driver's
 * versions — so a change to any of them misses the cache instead of loading a stale kernel.
 */
#include "ops.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

ferry_status ferry__op_source(const ferry_op *op, uint32_t kind, int sm, char **out, size_t *out_size) {
  char head[640];
  int builtin = op->family != FERRY__CUSTOM;
  int n = snprintf(head, sizeof head,
                   "// ferry operator %s, kind 0x%03x, sm_%d\n"
                   "#define FERRY_A_TYPE %u\n#define FERRY_B_TYPE %u\n#define FERRY_OUT_TYPE %u\n"
                   "#define FERRY_ACC_TYPE %u\n#define FERRY_A_ROW %d\n#define FERRY_B_ROW %d\n"
                   "#define FERRY_OUT_ROW %d\n#define FERRY_TARGET_SM %d\n",
                   op->info.name, kind, sm, kind & 3u, (kind >> 2) & 3u, (kind >> 4) & 3u, (kind >> 6) & 3u,
                   ((kind >> 8) & 1u) == FERRY_ROW_MAJOR, ((kind >> 9) & 1u) == FERRY_ROW_MAJOR,
                   ((kind >> 10) & 1u) == FERRY_ROW_MAJOR, sm);
  size_t defines = strlen(op->defines);
  size_t common = builtin ? ferry__kernel_gemm_common_size : 0;
  size_t total = (size_t)n + defines + ferry__kernel_gemm_params_size + 1 + common + 1 + op->kernel_size + 1;
  char *s = malloc(total);
  if (!s) return FERRY_ERR(FERRY_OUT_OF_HOST_MEMORY, "building the source of operator %s", op->info.name);
  size_t at = 0;
  memcpy(s + at, head, (size_t)n), at += (size_t)n;
  memcpy(s + at, op->defines, defines), at += defines;
  memcpy(s + at, ferry__kernel_gemm_params, ferry__kernel_gemm_params_size), at += ferry__kernel_gemm_params_size;
  s[at++] = '\n';
  if (builtin) {
    memcpy(s + at, ferry__kernel_gemm_common, common), at += common;
    s[at++] = '\n';
  }
  memcpy(s + at, op->kernel_text, op->kernel_size), at += op->kernel_size;
  s[at] = '\0';
  *out = s;
  *out_size = at;
  return FERRY_OK;
}

int ferry__op_options(const ferry_op *op, int sm, char arch[32], const char **opts) {
  int n = 0;
  snprintf(arch, 32, "--gpu-architecture=sm_%d", sm);
  opts[n++] = arch;
  opts[n++] = "--std=c++17";
  for (int i = 0; i < op->n_options; i++) opts[n++] = op->options[i];
  return n;
}

void ferry__compile_key(const char *source, size_t size, const char *const *opts, int n_opts, int sm,
                        int nvrtc_version, int driver_version, uint8_t key[32]) {
  char versions[96];
  ferry__sha256 s;
  ferry__sha256_init(&s);
  ferry__sha256_update(&s, "ferry compile key 1", 20);
  ferry__sha256_update(&s, source, size);
  ferry__sha256_update(&s, "", 1);
  for (int i = 0; i < n_opts; i++) ferry__sha256_update(&s, opts[i], strlen(opts[i]) + 1);
  int n = snprintf(versions, sizeof versions, "sm_%d nvrtc %d driver %d", sm, nvrtc_version, driver_version);
  ferry__sha256_update(&s, versions, (size_t)n);
  ferry__sha256_final(&s, key);
}
