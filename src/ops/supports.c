/* supports.c — does an operator support these arguments? Integer compares on the problem descriptor.
 *
 * The check runs on every launch that does not bypass it, so its fast path is a few masks and comparisons of
 * fields ferry_gemm_args_init computed; the reason ("operand A: expected bf16, got fp16") is formatted by a second
 * walk over the same checks, only when the answer is no.
 */
#include "ops.h"

#include <stdio.h>
#include <string.h>

#define GRID_Z_MAX 65535 /* blocks of a launch in z: the batch */

/* Blocks along x: ceil(m/tile_m)*ceil(n/tile_n) must fit the grid's 2^31-1. Divides only for huge problems. */
static int grid_fits(const ferry_op_info *i, const ferry_gemm_problem *p) {
  if ((uint64_t)p->m * (uint64_t)p->n < (1ull << 31)) return 1;
  uint64_t tiles = (uint64_t)((p->m + i->tile_m - 1) / i->tile_m) * (uint64_t)((p->n + i->tile_n - 1) / i->tile_n);
  return tiles <= 0x7fffffffull;
}

int ferry__supports_fast(const ferry_op *op, const ferry_gemm_args *args) {
  const ferry_op_info *i = &op->info;
  const ferry_gemm_problem *p = &args->problem;
  if (!((i->a_types >> p->a_type) & (i->b_types >> p->b_type) & (i->out_types >> p->out_type) &
        (i->acc_types >> p->acc_type) & (i->a_majors >> p->a_major) & (i->b_majors >> p->b_major) &
        (i->out_majors >> p->out_major) & 1u))
    return 0;
  if (p->a_align < i->a_align || p->b_align < i->b_align || p->out_align < i->out_align) return 0;
  if ((i->div_m > 1 && p->m % i->div_m) || (i->div_n > 1 && p->n % i->div_n) || (i->div_k > 1 && p->k % i->div_k))
    return 0;
  if (p->l > GRID_Z_MAX || !grid_fits(i, p)) return 0;
  if ((p->kind & ~FERRY_GEMM_KIND_OPERANDS) && !i->fuses_epilogue) return 0;
  if (p->out_type == FERRY_SCALAR_I32 && (args->alpha != 1.0f || args->beta != 0.0f)) return 0;
  if (op->supports) return op->supports(args, NULL, 0, op->user) != 0;
  return 1;
}

/* "fp16", "fp16 or bf16", "fp16, bf16 or fp32", "e4m3 or e5m2" */
static void types_text(uint32_t mask, char *buf, size_t size) {
  const int order[7] = {FERRY_SCALAR_F16, FERRY_SCALAR_BF16, FERRY_SCALAR_F32, FERRY_SCALAR_E4M3,
                        FERRY_SCALAR_E5M2, FERRY_SCALAR_I8, FERRY_SCALAR_I32};
  int n = 0, total = 0;
  for (int k = 0; k < 7; k++) total += (mask >> order[k]) & 1u;
  buf[0] = '\0';
  for (int k = 0; k < 7; k++) {
    if (!((mask >> order[k]) & 1u)) continue;
    size_t used = strlen(buf);
    snprintf(buf + used, size - used, "%s%s", n == 0 ? "" : n == total - 1 ? " or " : ", ",
             ferry_scalar_name((ferry_scalar)order[k]));
    n++;
  }
}

static const char *major_text(int major) { return major == FERRY_MAJOR_ROW ? "row-major" : "column-major"; }

static int type_reason(const char *what, uint32_t mask, int got, char *reason, size_t size) {
  char want[64];
  if ((mask >> got) & 1u) return 0;
  types_text(mask, want, sizeof want);
  snprintf(reason, size, "%s: expected %s, got %s", what, want, ferry_scalar_name((ferry_scalar)got));
  return 1;
}

static int major_reason(const char *what, uint32_t mask, int got, char *reason, size_t size) {
  if ((mask >> got) & 1u) return 0;
  snprintf(reason, size, "%s: expected %s, got %s", what, major_text(!got), major_text(got));
  return 1;
}

static int align_reason(const char *what, uint32_t need, int have, int64_t ld, char *reason, size_t size) {
  if ((uint32_t)have >= need) return 0;
  if (have == 0) { /* ferry_gemm_args_set_data took an address that is not aligned to the elements */
    snprintf(reason, size, "%s: its address is not aligned to its elements", what);
    return 1;
  }
  snprintf(reason, size, "%s: needs %u-byte alignment of its address, leading dimension and batch stride; it has "
           "%d (leading dimension %lld)", what, need, have, (long long)ld);
  return 1;
}

int ferry__supports_reason(const ferry_op *op, const ferry_gemm_args *args, char *reason, size_t size) {
  const ferry_op_info *i = &op->info;
  const ferry_gemm_problem *p = &args->problem;
  char local[256];
  if (!reason || size == 0) {
    reason = local;
    size = sizeof local;
  }
  reason[0] = '\0';
  if (type_reason("operand A", i->a_types, p->a_type, reason, size) ||
      type_reason("operand B", i->b_types, p->b_type, reason, size) ||
      type_reason("operand out", i->out_types, p->out_type, reason, size) ||
      type_reason("accumulator", i->acc_types, p->acc_type, reason, size) ||
      major_reason("operand A", i->a_majors, p->a_major, reason, size) ||
      major_reason("operand B", i->b_majors, p->b_major, reason, size) ||
      major_reason("operand out", i->out_majors, p->out_major, reason, size) ||
      align_reason("operand A", i->a_align, p->a_align, p->lda, reason, size) ||
      align_reason("operand B", i->b_align, p->b_align, p->ldb, reason, size) ||
      align_reason("operand out", i->out_align, p->out_align, p->ldc, reason, size))
    return 0;
  const struct { const char *name; int32_t v; uint32_t div; } dims[3] = {
      {"m", p->m, i->div_m}, {"n", p->n, i->div_n}, {"k", p->k, i->div_k}};
  for (int d = 0; d < 3; d++)
    if (dims[d].div > 1 && dims[d].v % (int32_t)dims[d].div) {
      snprintf(reason, size, "%s = %d is not a multiple of %u", dims[d].name, (int)dims[d].v, dims[d].div);
      return 0;
    }
  if (p->l > GRID_Z_MAX) {
    snprintf(reason, size, "batch l = %d exceeds %d, the launch grid's limit", (int)p->l, GRID_Z_MAX);
    return 0;
  }
  if (!grid_fits(i, p)) {
    snprintf(reason, size, "%d×%d in %d×%d tiles needs more than 2^31-1 blocks", (int)p->m, (int)p->n,
             (int)i->tile_m, (int)i->tile_n);
    return 0;
  }
  if ((p->kind & ~FERRY_GEMM_KIND_OPERANDS) && !i->fuses_epilogue) {
    snprintf(reason, size, "operator %s fuses no epilogue (bias, activation, scales): it was registered without "
             "fuses_epilogue", i->name);
    return 0;
  }
  if (p->out_type == FERRY_SCALAR_I32 && (args->alpha != 1.0f || args->beta != 0.0f)) {
    snprintf(reason, size, "an int32 output takes alpha 1 and beta 0 (got %g and %g): its sums go out exact",
             (double)args->alpha, (double)args->beta);
    return 0;
  }
  if (op->supports && !op->supports(args, reason, size, op->user)) {
    if (!reason[0]) snprintf(reason, size, "operator %s's own check declined the arguments", i->name);
    return 0;
  }
  return 1;
}

ferry_status ferry__check_op_args(const char *fn, const ferry_op *op, const ferry_gemm_args *args) {
  if (!op) return FERRY_ERR(FERRY_INVALID_ARGUMENT, "%s: op is NULL", fn);
  if (!args) return FERRY_ERR(FERRY_INVALID_ARGUMENT, "%s: args is NULL", fn);
  if (args->struct_size != sizeof *args)
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "%s: args was not initialised by ferry_gemm_args_init (struct_size %u, "
                     "expected %zu)", fn, args->struct_size, sizeof *args);
  return FERRY_OK;
}

ferry_status ferry_op_supports(const ferry_op *op, const ferry_gemm_args *args, char *reason, size_t reason_size) {
  ferry_status st = ferry__check_op_args("ferry_op_supports", op, args);
  if (st != FERRY_OK) {
    if (reason && reason_size) snprintf(reason, reason_size, "%s", ferry_last_error_message());
    return st;
  }
  if (ferry__supports_fast(op, args)) {
    if (reason && reason_size) reason[0] = '\0';
    return FERRY_OK;
  }
  char why[256];
  ferry__supports_reason(op, args, why, sizeof why);
  if (reason && reason_size) snprintf(reason, reason_size, "%s", why);
  return FERRY_ERR(FERRY_UNSUPPORTED, "operator %s does not support these arguments: %s", op->info.name, why);
}
