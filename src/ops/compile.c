/* compile.c — compile once: the in-memory memo, then the disk cache, then NVRTC.
 *
 * The memo is a small open-addressed table per operator, keyed by (kind, target). A run without an artifact
 * reads it lock-free on every call, borrowing the memo's reference (ferry_ops_clear_memo must not run beside such
 * runs, as the header says); a compile takes its own reference under the memo lock (ferry__ops_memo_lock), as
 * inserts and ferry_ops_clear_memo do, so a clear can never free the artifact between a compile's lookup and its
 * retain. Compiles run outside the lock, so kinds and operators compile in parallel; two threads asking for the same
 * kernel at the same moment may both compile it, and the first to insert wins.
 */
#include "ops.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- memo -------------------------------------------------------------------------------------------------- */

static unsigned slot_of(uint32_t kind, int sm) {
  return (kind * 2654435761u ^ (uint32_t)sm * 40503u) & (FERRY__MEMO_SLOTS - 1);
}

ferry_artifact *ferry__memo_lookup(const ferry_op *op, uint32_t kind, int sm) {
  unsigned s = slot_of(kind, sm);
  for (unsigned probe = 0; probe < FERRY__MEMO_SLOTS; probe++, s = (s + 1) & (FERRY__MEMO_SLOTS - 1)) {
    ferry_artifact *a = atomic_load_explicit(&((ferry_op *)op)->memo[s], memory_order_acquire);
    if (!a) return NULL;
    if (a->kind == kind && a->sm == sm) return a;
  }
  return NULL;
}

/* Under ferry__ops_memo_lock. */
static void memo_insert_locked(ferry_op *op, ferry_artifact *art) {
  unsigned s = slot_of(art->kind, art->sm);
  for (unsigned probe = 0; probe < FERRY__MEMO_SLOTS; probe++, s = (s + 1) & (FERRY__MEMO_SLOTS - 1)) {
    ferry_artifact *a = atomic_load_explicit(&op->memo[s], memory_order_relaxed);
    if (a && a->kind == art->kind && a->sm == art->sm) return; /* already memoised */
    if (!a) {
      atomic_store_explicit(&op->memo[s], ferry_artifact_retain(art), memory_order_release);
      op->memo_used++;
      return;
    }
  }
  /* Full: the artifact works, it is just not remembered. */
}

/* Under ferry__ops_memo_lock. */
static void memo_clear_locked(ferry_op *op) {
  for (unsigned s = 0; s < FERRY__MEMO_SLOTS && op->memo_used; s++) {
    ferry_artifact *a = atomic_exchange_explicit(&op->memo[s], NULL, memory_order_acq_rel);
    if (a) ferry_artifact_release(a), op->memo_used--;
  }
}

void ferry_ops_clear_memo(void) { ferry__ops_each_under_memo_lock(memo_clear_locked); }

/* ---- NVRTC ------------------------------------------------------------------------------------------------- */

/* The first lines of a compiler log, on one line, for an error message of fixed size. */
static void log_excerpt(const char *log, char *out, size_t size) {
  size_t o = 0;
  while (*log == ' ' || *log == '\n' || *log == '\r') log++;
  for (; *log && o + 1 < size; log++) {
    if (*log == '\n') {
      if (o + 4 >= size) break;
      if (log[1]) memcpy(out + o, " | ", 3), o += 3;
    } else if (*log != '\r') {
      out[o++] = *log;
    }
  }
  out[o] = '\0';
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static ferry_status nvrtc_compile(const ferry_op *op, int sm, const char *source, const char *const *opts,
                                  int n_opts, unsigned char **out, size_t *out_size) {
  ferry_status st = FERRY_OK;
  nvrtcProgram prog = NULL;
  char *log = NULL, *cubin = NULL, name[96];
  size_t size = 0, log_size = 0;
  double t0 = now_s();
  snprintf(name, sizeof name, "%s.cu", op->info.name);
  FERRY_TRY_RTC(("compiling operator %s for sm_%d", op->info.name, sm), nvrtcCreateProgram, &prog, source, name, 0,
                NULL, NULL);
  nvrtcResult r = FERRY_RTC(nvrtcCompileProgram, prog, n_opts, opts);
  if (r != NVRTC_SUCCESS) {
    char excerpt[360] = "";
    if (r == NVRTC_ERROR_COMPILATION && FERRY_RTC(nvrtcGetProgramLogSize, prog, &log_size) == NVRTC_SUCCESS &&
        log_size > 0 && (log = malloc(log_size + 1)) != NULL &&
        FERRY_RTC(nvrtcGetProgramLog, prog, log) == NVRTC_SUCCESS) {
      log[log_size] = '\0';
      log_excerpt(log, excerpt, sizeof excerpt);
    }
    st = ferry__rtc_error(r, "nvrtcCompileProgram", __FILE__, __LINE__, "compiling operator %s for sm_%d%s%s",
                          op->info.name, sm, *excerpt ? "; NVRTC says: " : "", excerpt);
    goto cleanup;
  }
  FERRY_TRY_RTC(("compiling operator %s for sm_%d", op->info.name, sm), nvrtcGetCUBINSize, prog, &size);
  cubin = malloc(size ? size : 1);
  if (!cubin) {
    st = FERRY_ERR(FERRY_OUT_OF_HOST_MEMORY, "a %zu-byte cubin of operator %s", size, op->info.name);
    goto cleanup;
  }
  FERRY_TRY_RTC(("compiling operator %s for sm_%d", op->info.name, sm), nvrtcGetCUBIN, prog, cubin);
  if (size < 4 || memcmp(cubin, "\x7f" "ELF", 4) != 0) {
    st = FERRY_ERR(FERRY_COMPILE_FAILED, "NVRTC returned no cubin for operator %s (sm_%d)", op->info.name, sm);
    goto cleanup;
  }
  *out = (unsigned char *)cubin;
  *out_size = size;
  cubin = NULL;
  ferry__stats_add_compile(now_s() - t0);
cleanup:
  if (prog) (void)FERRY_RTC(nvrtcDestroyProgram, &prog);
  free(cubin);
  free(log);
  return st;
}

/* ---- compile ----------------------------------------------------------------------------------------------- */

/* Makes the artifact of (op, kind, sm): from the disk cache, else NVRTC (then stored). */
static ferry_status build(const ferry_op *op, uint32_t kind, int sm, ferry_artifact **out) {
  ferry_status st = FERRY_OK;
  char *source = NULL, arch[32];
  size_t source_size = 0, cubin_size = 0;
  unsigned char *cubin = NULL;
  void *block = NULL;
  const char *opts[4 + 64];
  uint8_t key[32];
  FERRY_TRY(ferry__rtc_load());
  if (!ferry__rtc_supports_arch(sm)) {
    st = FERRY_ERR(FERRY_UNSUPPORTED, "NVRTC %d.%d cannot compile for sm_%d (it knows sm_%d to sm_%d)",
                   ferry__rtc.major, ferry__rtc.minor, sm, ferry__rtc.archs[0], ferry__rtc.archs[ferry__rtc.n_archs - 1]);
    goto cleanup;
  }
  int n_opts = ferry__op_options(op, sm, arch, opts);
  int driver = ferry__driver_quiet() ? ferry__drv.version : 0;
  ferry__compile_key(op, kind, sm, opts, n_opts, ferry__rtc.major * 1000 + ferry__rtc.minor * 10, driver, key);
  int cached = ferry__cache_load(op, kind, sm, key, &block, &cubin, &cubin_size);
  if (!cached) {
    /* Only a miss needs the source itself. */
    FERRY_TRY(ferry__op_source(op, kind, sm, &source, &source_size));
    FERRY_TRY(nvrtc_compile(op, sm, source, opts, n_opts, &cubin, &cubin_size));
    block = cubin;
  }
  st = ferry__artifact_new(op, kind, sm, key, block, cubin, cubin_size, out);
  block = NULL; /* owned by the artifact, or already freed by ferry__artifact_new when it failed */
  if (st != FERRY_OK) goto cleanup;
  if (!cached) ferry__cache_store(*out);
cleanup:
  free(block);
  free(source);
  return st;
}

ferry_status ferry_op_compile_for(const ferry_op *op, const ferry_gemm_args *args, int target_sm,
                                  ferry_artifact **out) {
  ferry_status st = FERRY_OK;
  ferry_artifact *art = NULL;
  int dev_sm = 0;
  FERRY_TRY(ferry__check_op_args("ferry_op_compile", op, args));
  if (!out) return FERRY_ERR(FERRY_INVALID_ARGUMENT, "ferry_op_compile: out is NULL");
  if (target_sm <= 0)
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "ferry_op_compile_for: target_sm %d is not a compute capability (90 for "
                     "sm_90)", target_sm);
  if (!ferry__supports_fast(op, args)) {
    char why[256];
    ferry__supports_reason(op, args, why, sizeof why);
    return FERRY_ERR(FERRY_UNSUPPORTED, "operator %s does not support these arguments: %s", op->info.name, why);
  }
  if (target_sm < op->info.min_sm)
    return FERRY_ERR(FERRY_UNSUPPORTED, "operator %s needs sm_%d or newer; the target is sm_%d", op->info.name,
                     (int)op->info.min_sm, target_sm);
  uint32_t kind = args->problem.kind;
  pthread_mutex_lock(&ferry__ops_memo_lock);
  art = ferry_artifact_retain(ferry__memo_lookup(op, kind, target_sm));
  pthread_mutex_unlock(&ferry__ops_memo_lock);
  if (art) {
    ferry__stats_memo(1);
    *out = art;
    return FERRY_OK;
  }
  /* Build without holding the memo lock, so that other kinds and operators compile in parallel; should two threads
   * build the same artifact, the first to insert wins and the other's copy is dropped. */
  ferry__stats_memo(0);
  FERRY_TRY(build(op, kind, target_sm, &art));
  pthread_mutex_lock(&ferry__ops_memo_lock);
  ferry_artifact *winner = ferry__memo_lookup(op, kind, target_sm);
  if (winner) {
    ferry_artifact_release(art);
    art = ferry_artifact_retain(winner);
  } else {
    memo_insert_locked((ferry_op *)op, art);
  }
  pthread_mutex_unlock(&ferry__ops_memo_lock);
  /* Load now when it will run here, so the first run pays no load; elsewhere it loads on first use. */
  ferry_error saved = *ferry_last_error();
  if (ferry__driver_quiet() && ferry__device_sm(args->problem.device, &dev_sm) == FERRY_OK) {
    if (dev_sm == target_sm) FERRY_TRY(ferry__artifact_load(art));
  } else {
    ferry__error_restore(&saved); /* no such device here: nothing to load, nothing to report */
  }
  *out = art;
  art = NULL;
cleanup:
  ferry_artifact_release(art);
  return st;
}

ferry_status ferry_op_compile(const ferry_op *op, const ferry_gemm_args *args, ferry_artifact **out) {
  ferry_status st = FERRY_OK;
  int sm = 0;
  FERRY_TRY(ferry__check_op_args("ferry_op_compile", op, args));
  FERRY_TRY(ferry_target_sm(args->problem.device, &sm));
  FERRY_TRY(ferry_op_compile_for(op, args, sm, out));
cleanup:
  return st;
}
