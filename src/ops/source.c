/* source.c — what NVRTC is given for an operator and a problem kind, and the key that names the result.
 *
 * The full source is self-contained text: a head (a comment naming the operator, the kind as FERRY_* macros), then
 * a body that is the same for all of the operator's kinds (the design's macros, the parameter struct, ferry's
 * shared helpers for its own operators, the kernel). The key hashes exactly what determines the cubin — that
 * text, the options, the target, NVRTC's and the driver's versions — so a change to any of them misses the cache
 * instead of loading a stale kernel. The body enters the key through its SHA-256, made once per operator: a key
 * then costs ~2 µs instead of hashing the whole source (~18 KB for an mma operator, ~100 µs at this SHA-256's
 * speed) on every cache lookup; the process's first lookup of an operator pays that hash once.
 */
#include "ops.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The head: what differs between the kinds and targets of one operator (a comment naming them, the kind as
 * macros), and the element type codes the kind's macros hold, from ferry_scalar itself. Returns its length; `head`
 * holds 768 bytes, more than the longest head. */
static size_t source_head(const ferry_op *op, uint32_t kind, int sm, char head[768]) {
  int n = snprintf(head, 768,
                   "// ferry operator %.300s, kind 0x%05x, sm_%d\n"
                   "#define FERRY_SCALAR_F16 %d\n#define FERRY_SCALAR_BF16 %d\n#define FERRY_SCALAR_F32 %d\n"
                   "#define FERRY_SCALAR_E4M3 %d\n#define FERRY_SCALAR_E5M2 %d\n#define FERRY_SCALAR_I8 %d\n"
                   "#define FERRY_SCALAR_I32 %d\n"
                   "#define FERRY_A_TYPE %u\n#define FERRY_B_TYPE %u\n#define FERRY_OUT_TYPE %u\n"
                   "#define FERRY_ACC_TYPE %u\n#define FERRY_A_ROW %d\n#define FERRY_B_ROW %d\n"
                   "#define FERRY_OUT_ROW %d\n#define FERRY_BIAS %u\n#define FERRY_ACTIVATION %u\n"
                   "#define FERRY_SCALED %d\n#define FERRY_TARGET_SM %d\n",
                   op->info.name, kind, sm, FERRY_SCALAR_F16, FERRY_SCALAR_BF16, FERRY_SCALAR_F32, FERRY_SCALAR_E4M3,
                   FERRY_SCALAR_E5M2, FERRY_SCALAR_I8, FERRY_SCALAR_I32, FERRY_GEMM_KIND_A_TYPE(kind),
                   FERRY_GEMM_KIND_B_TYPE(kind), FERRY_GEMM_KIND_OUT_TYPE(kind), FERRY_GEMM_KIND_ACC_TYPE(kind),
                   FERRY_GEMM_KIND_A_MAJOR(kind) == FERRY_MAJOR_ROW, FERRY_GEMM_KIND_B_MAJOR(kind) == FERRY_MAJOR_ROW,
                   FERRY_GEMM_KIND_OUT_MAJOR(kind) == FERRY_MAJOR_ROW, FERRY_GEMM_KIND_BIAS(kind),
                   FERRY_GEMM_KIND_ACTIVATION(kind), (kind & FERRY_GEMM_KIND_SCALED) != 0, sm);
  return n < 0 ? 0 : (size_t)n;
}

/* The body: everything after the head, the same for all of the operator's kinds and targets (the design's macros,
 * the parameter struct, the shared headers of ferry's own kernels, the kernel). It is handed piece by piece to
 * `emit`, the one description of the body both for writing the source and for its digest, so the two cannot
 * drift apart. NVRTC is given no headers: each shared header is placed here, in the order the kernels include it
 * (its include guard then skips the kernel file's #include, which serves nvcc), so every header's text enters
 * the digest and with it the cache key. */
typedef void (*emit_fn)(void *ctx, const void *bytes, size_t n);

/* The headers only ferry's own kernels are given, after ferry/gemm_params.h: the one list of them. */
static void builtin_headers(emit_fn emit, void *ctx) {
  emit(ctx, ferry__kernel_gemm_kind, ferry__kernel_gemm_kind_size);
  emit(ctx, "\n", 1);
  emit(ctx, ferry__kernel_gemm_common, ferry__kernel_gemm_common_size);
  emit(ctx, "\n", 1);
  emit(ctx, ferry__kernel_gemm_output, ferry__kernel_gemm_output_size);
  emit(ctx, "\n", 1);
}

static void source_body(const ferry_op *op, emit_fn emit, void *ctx) {
  emit(ctx, op->defines, strlen(op->defines));
  emit(ctx, ferry__kernel_gemm_params, ferry__kernel_gemm_params_size);
  emit(ctx, "\n", 1);
  if (op->family != FERRY__CUSTOM) builtin_headers(emit, ctx);
  emit(ctx, op->kernel_text, op->kernel_size);
}

typedef struct buffer { char *at; size_t used; } buffer;
static void emit_size(void *ctx, const void *bytes, size_t n) {
  (void)bytes;
  ((buffer *)ctx)->used += n;
}
static void emit_copy(void *ctx, const void *bytes, size_t n) {
  buffer *b = ctx;
  memcpy(b->at + b->used, bytes, n);
  b->used += n;
}
static void emit_hash(void *ctx, const void *bytes, size_t n) { ferry__sha256_update(ctx, bytes, n); }

ferry_status ferry__op_source(const ferry_op *op, uint32_t kind, int sm, char **out, size_t *out_size) {
  char head[768];
  size_t n = source_head(op, kind, sm, head);
  buffer b = {NULL, n};
  source_body(op, emit_size, &b);
  char *s = malloc(b.used + 1);
  if (!s) return FERRY_ERR(FERRY_OUT_OF_HOST_MEMORY, "building the source of operator %s", op->info.name);
  memcpy(s, head, n);
  b = (buffer){s, n};
  source_body(op, emit_copy, &b);
  s[b.used] = '\0';
  *out = s;
  *out_size = b.used;
  return FERRY_OK;
}

void ferry__op_body_digest(const ferry_op *op, uint8_t out[32]) {
  ferry__sha256 s;
  ferry__sha256_init(&s);
  source_body(op, emit_hash, &s);
  ferry__sha256_final(&s, out);
}

void ferry__builtin_headers_digest(uint8_t out[32]) {
  ferry__sha256 s;
  ferry__sha256_init(&s);
  emit_hash(&s, ferry__kernel_gemm_params, ferry__kernel_gemm_params_size);
  builtin_headers(emit_hash, &s);
  ferry__sha256_final(&s, out);
}

/* The body's digest, made once per operator and process (the body never changes while the process runs). */
static const uint8_t *body_digest(const ferry_op *op) {
  ferry_op *o = (ferry_op *)op;
  if (atomic_load_explicit(&o->body_digest_ready, memory_order_acquire)) return o->body_digest;
  pthread_mutex_lock(&ferry__ops_memo_lock);
  if (!atomic_load_explicit(&o->body_digest_ready, memory_order_relaxed)) {
    ferry__op_body_digest(op, o->body_digest);
    atomic_store_explicit(&o->body_digest_ready, 1, memory_order_release);
  }
  pthread_mutex_unlock(&ferry__ops_memo_lock);
  return o->body_digest;
}

int ferry__op_options(const ferry_op *op, int sm, char arch[32], const char **opts) {
  int n = 0;
  /* wgmma designs need the arch-specific target: sm_90a (their source refuses any other with #error) */
  snprintf(arch, 32, "--gpu-architecture=sm_%d%s", sm, ferry__family_is_wgmma(op->family) && sm == 90 ? "a" : "");
  opts[n++] = arch;
  opts[n++] = "--std=c++17";
  for (int i = 0; i < op->n_options; i++) opts[n++] = op->options[i];
  return n;
}

void ferry__compile_key(const ferry_op *op, uint32_t kind, int sm, const char *const *opts, int n_opts,
                        int nvrtc_version, int driver_version, uint8_t key[32]) {
  char head[768], versions[96];
  size_t n = source_head(op, kind, sm, head);
  ferry__sha256 s;
  ferry__sha256_init(&s);
  /* Version 2 of the key hashes the body through its digest; the tag keeps it apart from version 1's keys. */
  ferry__sha256_update(&s, "ferry compile key 2", 20);
  ferry__sha256_update(&s, head, n);
  ferry__sha256_update(&s, "", 1);
  ferry__sha256_update(&s, body_digest(op), 32);
  for (int i = 0; i < n_opts; i++) ferry__sha256_update(&s, opts[i], strlen(opts[i]) + 1);
  int v = snprintf(versions, sizeof versions, "sm_%d nvrtc %d driver %d", sm, nvrtc_version, driver_version);
  ferry__sha256_update(&s, versions, (size_t)v);
  ferry__sha256_final(&s, key);
}
