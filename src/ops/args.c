/* args.c — GEMM arguments: every check once, at construction, into a compact problem descriptor.
 *
 * A launch must not re-derive what the arguments mean, so ferry_gemm_args_init turns three DLPack-style views
 * into integers: extents, leading dimensions, batch strides, the types and majors packed in one `kind` word,
 * and the alignment each operand offers to vector loads. Support checks and launches then read those fields only.
 */
#include "ops.h"

#include <stdio.h>
#include <string.h>

const char *ferry_scalar_name(ferry_scalar scalar) {
  switch (scalar) {
  case FERRY_SCALAR_F16: return "fp16";
  case FERRY_SCALAR_BF16: return "bf16";
  case FERRY_SCALAR_F32: return "fp32";
  case FERRY_SCALAR_E4M3: return "e4m3";
  case FERRY_SCALAR_E5M2: return "e5m2";
  case FERRY_SCALAR_I8: return "int8";
  case FERRY_SCALAR_I32: return "int32";
  default: return "?";
  }
}

int ferry__scalar_bytes(int s) {
  return s == FERRY_SCALAR_F32 || s == FERRY_SCALAR_I32 ? 4 : s == FERRY_SCALAR_F16 || s == FERRY_SCALAR_BF16 ? 2 : 1;
}

static int is_8bit(int s) { return s == FERRY_SCALAR_E4M3 || s == FERRY_SCALAR_E5M2 || s == FERRY_SCALAR_I8; }

#define DLPACK_FLOAT8_E4M3FN 10 /* DLPack's codes for the two FP8 formats the tensor cores read */
#define DLPACK_FLOAT8_E5M2 12

/* The GEMM type of a dtype (one lane), or FERRY_SCALAR_NONE. */
static int scalar_of(ferry_dtype d) {
  if (d.lanes != 1) return FERRY_SCALAR_NONE;
  if (d.code == DLPACK_FLOAT8_E4M3FN && d.bits == 8) return FERRY_SCALAR_E4M3;
  if (d.code == DLPACK_FLOAT8_E5M2 && d.bits == 8) return FERRY_SCALAR_E5M2;
  if (d.code == FERRY_DTYPE_INT && d.bits == 8) return FERRY_SCALAR_I8;
  if (d.code == FERRY_DTYPE_INT && d.bits == 32) return FERRY_SCALAR_I32;
  if (d.code == FERRY_DTYPE_FLOAT && d.bits == 16) return FERRY_SCALAR_F16;
  if (d.code == FERRY_DTYPE_FLOAT && d.bits == 32) return FERRY_SCALAR_F32;
  if (d.code == FERRY_DTYPE_BFLOAT && d.bits == 16) return FERRY_SCALAR_BF16;
  return FERRY_SCALAR_NONE;
}

/* The largest power of two, up to 16, dividing an operand's address, leading dimension and batch stride (in bytes;
 * 0 divides by anything), or 0 when its address is not aligned to its elements: no operator supports that. */
static uint8_t align_of(uintptr_t addr, int64_t ld, int64_t batch_stride, int type) {
  uint64_t bytes = (uint64_t)ferry__scalar_bytes(type);
  uint64_t v = (uint64_t)addr | (uint64_t)ld * bytes | (uint64_t)batch_stride * bytes | 16u;
  uint64_t align = v & (~v + 1);
  return (uint8_t)(align < bytes ? 0 : align);
}

/* What init learns about one operand: a rows×cols matrix, possibly batched. */
typedef struct operand {
  int64_t batch, rows, cols;
  int64_t ld, batch_stride;
  int major;
  int type;
  int batched; /* rank 3 */
  uintptr_t addr;
  uint64_t span; /* bytes from addr to the end of its last element; 0 when empty */
} operand;

/* Whether bytes [x, x + x_span) meet [y, y + y_span): empty ranges meet nothing, and ends past 2^64 are fine. */
static int ranges_meet(uint64_t x, uint64_t x_span, uint64_t y, uint64_t y_span) {
  return x_span && y_span && (x >= y ? x - y < y_span : y - x < x_span);
}

/* Whether out's bytes meet an input's: a kernel reads the input while other blocks write out. */
static int overlaps(const operand *x, const operand *out) {
  return ranges_meet(x->addr, x->span, out->addr, out->span);
}

/* Every kernel loads whole elements: a tensor whose first element is not aligned to its size would fault (a sticky
 * error) whatever the operator's own alignment requirement. The tensor is named `what` + `name` ("operand " "A",
 * "bias" ""), put together only in the message: this runs on every ferry_gemm_args_init. */
static ferry_status check_element_aligned(const char *what, const char *name, uintptr_t at, int bytes) {
  if (at % (uintptr_t)bytes == 0) return FERRY_OK;
  return FERRY_ERR(FERRY_INVALID_ARGUMENT, "%s%s: its first element, at 0x%llx, is not aligned to its %d-byte "
                   "elements (every kernel would fault reading it)", what, name, (unsigned long long)at, bytes);
}

/* "cpu", "cuda:0", ... for error messages. */
static const char *device_text(ferry_device d, char *buf, size_t size) {
  switch (d.device_type) {
  case FERRY_DEVICE_CPU: snprintf(buf, size, "cpu"); break;
  case FERRY_DEVICE_CUDA: snprintf(buf, size, "cuda:%d", (int)d.device_id); break;
  case FERRY_DEVICE_CUDA_HOST: snprintf(buf, size, "pinned host memory (cuda_host)"); break;
  case FERRY_DEVICE_CUDA_MANAGED: snprintf(buf, size, "cuda_managed:%d", (int)d.device_id); break;
  default: snprintf(buf, size, "DLPack device type %d, index %d", (int)d.device_type, (int)d.device_id);
  }
  return buf;
}

static const char *dtype_text(ferry_dtype d, char *buf, size_t size) {
  static const char *codes[] = {"int", "uint", "float", "opaque", "bfloat", "complex", "bool", "float8_e3m4_",
                                "float8_e4m3_", "float8_e4m3b11fnuz_", "float8_e4m3fn_", "float8_e4m3fnuz_",
                                "float8_e5m2_", "float8_e5m2fnuz_"};
  const char *code = d.code < sizeof codes / sizeof codes[0] ? codes[d.code] : "code";
  if (d.lanes == 1) snprintf(buf, size, "%s%u", code, d.bits);
  else snprintf(buf, size, "%s%ux%u", code, d.bits, d.lanes);
  return buf;
}

/* Reads tensor `t` as operand `name` (rows named `rn`, columns `cn`); `is_out` requires a layout whose elements
 * do not overlap, since the kernel writes it. */
static ferry_status read_operand(const char *name, const ferry_tensor *t, const char *rn, const char *cn,
                                 int is_out, operand *o) {
  char dt[64];
  if (!t) return FERRY_ERR(FERRY_INVALID_ARGUMENT, "operand %s is NULL", name);
  if (t->ndim != 2 && t->ndim != 3)
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "operand %s has rank %d; expected 2 (%s×%s) or 3 (l×%s×%s)", name,
                     (int)t->ndim, rn, cn, rn, cn);
  if (!t->shape) return FERRY_ERR(FERRY_INVALID_ARGUMENT, "operand %s: shape is NULL", name);
  if ((o->type = scalar_of(t->dtype)) == FERRY_SCALAR_NONE) goto bad_type;
  if (t->device.device_type != FERRY_DEVICE_CUDA && t->device.device_type != FERRY_DEVICE_CUDA_MANAGED)
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "operand %s is on %s, not on a CUDA device (FERRY_DEVICE_CUDA or "
                     "CUDA_MANAGED)", name, device_text(t->device, dt, sizeof dt));
  if (t->device.device_id < 0 || t->device.device_id >= FERRY_MAX_DEVICES)
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "operand %s: device index %d is out of range", name,
                     (int)t->device.device_id);
  int b = t->ndim == 3;
  o->batched = b;
  o->batch = b ? t->shape[0] : 1;
  o->rows = t->shape[b];
  o->cols = t->shape[b + 1];
  if (o->batch < 0 || o->rows < 0 || o->cols < 0)
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "operand %s has a negative dimension (batch %lld, %lld×%lld)",
                     name, (long long)o->batch, (long long)o->rows, (long long)o->cols);
  if (o->batch > INT32_MAX || o->rows > INT32_MAX || o->cols > INT32_MAX)
    return b ? FERRY_ERR(FERRY_OVERFLOW, "operand %s: shape (%lld, %lld, %lld) has an extent past 2^31-1", name,
                         (long long)o->batch, (long long)o->rows, (long long)o->cols)
             : FERRY_ERR(FERRY_OVERFLOW, "operand %s: shape (%lld, %lld) has an extent past 2^31-1", name,
                         (long long)o->rows, (long long)o->cols);
  const bool empty = !(o->batch && o->rows && o->cols);
  int64_t sb, sr, sc;
  if (t->strides) {
    sb = b ? t->strides[0] : 0;
    sr = t->strides[b];
    sc = t->strides[b + 1];
    if (sb < 0 || sr < 0 || sc < 0)
      return FERRY_ERR(FERRY_INVALID_ARGUMENT, "operand %s has a negative stride (%lld, %lld, %lld); ferry's GEMMs "
                       "take non-negative strides", name, (long long)sb, (long long)sr, (long long)sc);
  } else {
    sc = 1;
    sr = o->cols;
    sb = o->rows * o->cols; /* both ≤ 2^31-1: no overflow */
  }
  /* The major mode: which dimension is contiguous. A dimension of extent 1 may have any stride, so a vector can
   * be either; prefer the mode whose contiguous dimension is the longer one (wider loads). */
  int row_ok = o->cols <= 1 || sc == 1;
  int col_ok = o->rows <= 1 || sr == 1;
  if (!row_ok && !col_ok && empty) { /* strides that name no mode mean nothing here (NumPy's for zero-size arrays) */
    sc = 1;
    sr = o->cols;
    sb = o->rows * o->cols;
    row_ok = 1;
  }
  if (row_ok && (o->cols > 1 || o->rows <= 1 || !col_ok)) {
    o->major = FERRY_MAJOR_ROW;
    o->ld = o->rows <= 1 ? (o->cols > 1 ? o->cols : 1) : sr;
  } else if (col_ok) {
    o->major = FERRY_MAJOR_COL;
    o->ld = o->cols <= 1 ? (o->rows > 1 ? o->rows : 1) : sc;
  } else {
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "operand %s (%lld×%lld) has strides (%lld, %lld): neither row-major "
                     "(column stride 1) nor column-major (row stride 1); make it contiguous in one dimension",
                     name, (long long)o->rows, (long long)o->cols, (long long)sr, (long long)sc);
  }
  if (is_out) {
    int64_t inner = o->major == FERRY_MAJOR_ROW ? o->cols : o->rows;
    int64_t outer = o->major == FERRY_MAJOR_ROW ? o->rows : o->cols;
    if (outer > 1 && o->ld < inner)
      return FERRY_ERR(FERRY_INVALID_ARGUMENT, "operand %s (%lld×%lld, %s-major) has leading dimension %lld < %lld: "
                       "its elements overlap, and it is written", name, (long long)o->rows, (long long)o->cols,
                       o->major == FERRY_MAJOR_ROW ? "row" : "column", (long long)o->ld, (long long)inner);
    __int128 footprint = (__int128)o->ld * (outer > 1 ? outer - 1 : 0) + inner;
    if (o->batch > 1 && (__int128)sb < footprint)
      return FERRY_ERR(FERRY_INVALID_ARGUMENT, "operand %s: batch stride %lld is smaller than one matrix (%lld "
                       "elements): its batches overlap, and it is written", name, (long long)sb,
                       (long long)footprint);
  }
  o->batch_stride = o->batch > 1 ? sb : 0;
  /* The largest element offset, and in bytes, must fit in 63 bits (a kernel adds them to a pointer). */
  __int128 last = 0;
  if (!empty)
    last = (__int128)(o->batch - 1) * o->batch_stride + (__int128)(o->rows - 1) * sr +
           (__int128)(o->cols - 1) * sc;
  if (last * ferry__scalar_bytes(o->type) + (__int128)t->byte_offset > INT64_MAX ||
      (__int128)o->ld * ferry__scalar_bytes(o->type) > INT64_MAX)
    return FERRY_ERR(FERRY_OVERFLOW, "operand %s: the offset of its last element passes 2^63 bytes (strides %lld, "
                     "%lld, %lld)", name, (long long)sb, (long long)sr, (long long)sc);
  if (!t->data && !empty)
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "operand %s: data is NULL but the tensor has elements", name);
  o->addr = (uintptr_t)t->data + (uintptr_t)t->byte_offset;
  o->span = empty ? 0 : (uint64_t)((last + 1) * ferry__scalar_bytes(o->type));
  return check_element_aligned("operand ", name, o->addr, ferry__scalar_bytes(o->type));
bad_type:
  return FERRY_ERR(FERRY_INVALID_ARGUMENT, "operand %s: dtype %s is not a GEMM type (float16, bfloat16, float32, "
                   "float8_e4m3fn, float8_e5m2, int8 or int32)", name,
                   dtype_text(t->dtype, dt, sizeof dt));
}

/* The pairings of types the GEMMs compute: 16/32-bit floats with an fp32 or fp16 accumulator; FP8 (either format
 * for either operand) with fp32 into a float output; int8 with int32 into int32 or a float output. 8-bit operands
 * must have k contiguous (A row-major, B column-major): the tensor cores read them only that way. */
static ferry_status check_types(const operand *a, const operand *b, const operand *c, ferry_scalar accumulator) {
  const int at = a->type, bt = b->type, ct = c->type;
  const int fp8 = FERRY_SCALARS_FP8;
  const char *an = ferry_scalar_name((ferry_scalar)at), *bn = ferry_scalar_name((ferry_scalar)bt);
  const char *cn = ferry_scalar_name((ferry_scalar)ct), *accn = ferry_scalar_name(accumulator);
  if (at == FERRY_SCALAR_I32 || bt == FERRY_SCALAR_I32)
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "operand %s is int32; GEMM inputs are float16, bfloat16, float32, "
                     "float8_e4m3fn, float8_e5m2 or int8", at == FERRY_SCALAR_I32 ? "A" : "B");
  if (is_8bit(ct))
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "operand out is %s; 8-bit types are GEMM inputs only (out float16, "
                     "bfloat16, float32, or int32 for int8 inputs)", cn);
  if (!is_8bit(at) && !is_8bit(bt)) {
    if (ct == FERRY_SCALAR_I32)
      return FERRY_ERR(FERRY_INVALID_ARGUMENT, "operand out is int32; an int32 output needs int8 inputs (A is %s)",
                       an);
    if (accumulator != FERRY_SCALAR_F32 && accumulator != FERRY_SCALAR_F16)
      return FERRY_ERR(FERRY_INVALID_ARGUMENT, "accumulator type %d (%s) is not fp32 (%d) or fp16 (%d) for %s "
                       "operands", (int)accumulator, accn, FERRY_SCALAR_F32, FERRY_SCALAR_F16, an);
    return FERRY_OK;
  }
  const int fp8_pair = ((fp8 >> at) & 1) && ((fp8 >> bt) & 1);
  if (!fp8_pair && !(at == FERRY_SCALAR_I8 && bt == FERRY_SCALAR_I8))
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "operands A (%s) and B (%s) do not pair: 8-bit GEMMs take two FP8 "
                     "operands (e4m3 or e5m2 each) or two int8 ones", an, bn);
  if (fp8_pair && (ct == FERRY_SCALAR_I32 || accumulator != FERRY_SCALAR_F32))
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, ct == FERRY_SCALAR_I32 ? "operand out is int32; FP8 operands give a "
                     "float output (float16, bfloat16 or float32)" : "accumulator %s for FP8 operands; they "
                     "accumulate in fp32", accn);
  if (!fp8_pair && accumulator != FERRY_SCALAR_I32)
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "accumulator %s for int8 operands; they accumulate in int32 "
                     "(FERRY_SCALAR_I32)", accn);
  if (a->major != FERRY_MAJOR_ROW || b->major != FERRY_MAJOR_COL)
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "8-bit operands need k contiguous: A row-major and B column-major "
                     "(as torch._scaled_mm; B = W.t() of a row-major W); got A %s-major, B %s-major",
                     a->major == FERRY_MAJOR_ROW ? "row" : "column", b->major == FERRY_MAJOR_ROW ? "row" : "column");
  return FERRY_OK;
}

ferry_status ferry_gemm_args_init(ferry_gemm_args *args, const ferry_tensor *A, const ferry_tensor *B,
                                  const ferry_tensor *out, ferry_scalar accumulator) {
  ferry_status st = FERRY_OK;
  operand a, b, c;
  if (!args) return FERRY_ERR(FERRY_INVALID_ARGUMENT, "ferry_gemm_args_init: args is NULL");
  FERRY_TRY(read_operand("A", A, "m", "k", 0, &a));
  FERRY_TRY(read_operand("B", B, "k", "n", 0, &b));
  FERRY_TRY(read_operand("out", out, "m", "n", 1, &c));
  FERRY_TRY(check_types(&a, &b, &c, accumulator));
  if (a.rows != c.rows || b.cols != c.cols || a.cols != b.rows)
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "shapes do not chain: A is %lld×%lld, B %lld×%lld, out %lld×%lld "
                     "(need A m×k, B k×n, out m×n)", (long long)a.rows, (long long)a.cols, (long long)b.rows,
                     (long long)b.cols, (long long)c.rows, (long long)c.cols);
  if ((a.batched || b.batched) && !c.batched)
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "operand %s has a batch of %lld but out has rank 2; give out a batch "
                     "dimension", a.batched ? "A" : "B", (long long)(a.batched ? a.batch : b.batch));
  if ((a.batched && a.batch != c.batch && a.batch != 1) || (b.batched && b.batch != c.batch && b.batch != 1))
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "batch sizes differ: A %lld, B %lld, out %lld (each must equal out's, "
                     "or be 1 to broadcast)", (long long)(a.batched ? a.batch : 1),
                     (long long)(b.batched ? b.batch : 1), (long long)c.batch);
  const char *overlapped = overlaps(&a, &c) ? "A" : overlaps(&b, &c) ? "B" : NULL;
  if (overlapped)
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "out overlaps %s: a kernel reads %s while other blocks write out; "
                     "give out memory of its own", overlapped, overlapped);
  if (A->device.device_id != out->device.device_id || B->device.device_id != out->device.device_id)
    return FERRY_ERR(FERRY_DEVICE_MISMATCH, "operands are on different devices: A on cuda:%d, B on cuda:%d, out "
                     "on cuda:%d", (int)A->device.device_id, (int)B->device.device_id, (int)out->device.device_id);
  ferry_gemm_args r;
  memset(&r, 0, sizeof r);
  r.struct_size = sizeof r;
  r.alpha = 1.0f;
  r.beta = 0.0f;
  r.a = (const void *)a.addr;
  r.b = (const void *)b.addr;
  r.out = (void *)c.addr;
  ferry_gemm_problem *p = &r.problem;
  p->m = (int32_t)c.rows;
  p->n = (int32_t)c.cols;
  p->k = (int32_t)a.cols;
  p->l = (int32_t)c.batch;
  p->lda = a.ld;
  p->ldb = b.ld;
  p->ldc = c.ld;
  p->batch_a = a.batch == c.batch ? a.batch_stride : 0;
  p->batch_b = b.batch == c.batch ? b.batch_stride : 0;
  p->batch_c = c.batch_stride;
  p->a_type = (uint8_t)a.type;
  p->b_type = (uint8_t)b.type;
  p->out_type = (uint8_t)c.type;
  p->acc_type = (uint8_t)accumulator;
  p->a_major = (uint8_t)a.major;
  p->b_major = (uint8_t)b.major;
  p->out_major = (uint8_t)c.major;
  p->kind = FERRY_GEMM_KIND(a.type, b.type, c.type, accumulator, a.major, b.major, c.major);
  p->device = out->device.device_id;
  p->a_align = align_of(a.addr, a.ld, p->batch_a, a.type);
  p->b_align = align_of(b.addr, b.ld, p->batch_b, b.type);
  p->out_align = align_of(c.addr, c.ld, p->batch_c, c.type);
  *args = r;
cleanup:
  return st;
}

/* The bytes from an operand's first element to the end of its last, from the validated problem's description of it
 * (0 when it is empty): the span ferry_gemm_args_init measured from the strides, which init checked fits 63 bits. */
static inline uint64_t span_of(int64_t rows, int64_t cols, int64_t ld, int64_t batch, int major, int type, int l) {
  if (rows <= 0 || cols <= 0 || l <= 0) return 0;
  const int64_t last = (int64_t)(l - 1) * batch +
                       (major == FERRY_MAJOR_ROW ? (rows - 1) * ld + (cols - 1) : (rows - 1) + (cols - 1) * ld);
  return (uint64_t)(last + 1) * (uint64_t)ferry__scalar_bytes(type);
}
static uint64_t span_a(const ferry_gemm_problem *p) {
  return span_of(p->m, p->k, p->lda, p->batch_a, p->a_major, p->a_type, p->l);
}
static uint64_t span_b(const ferry_gemm_problem *p) {
  return span_of(p->k, p->n, p->ldb, p->batch_b, p->b_major, p->b_type, p->l);
}
static uint64_t span_out(const ferry_gemm_problem *p) {
  return span_of(p->m, p->n, p->ldc, p->batch_c, p->out_major, p->out_type, p->l);
}

/* The bytes of the bias vector bound to `p` (one out value per column or row), 0 without one. */
static uint64_t bias_span(const ferry_gemm_problem *p) {
  if (!p->bias) return 0;
  return (uint64_t)(p->bias == FERRY_BIAS_ROW ? p->n : p->m) * (uint64_t)ferry__scalar_bytes(p->out_type);
}

/* set_data's refusal: which of the tensors out meets, named. Off the fast path. */
static __attribute__((noinline, cold)) ferry_status out_overlap_error(const ferry_gemm_args *args, uintptr_t na,
                                                                     uintptr_t nb, uintptr_t nc) {
  const ferry_gemm_problem *p = &args->problem;
  const uint64_t out_span = span_out(p);
  const struct { const char *name; uintptr_t at; uint64_t span; } read[5] = {
      {"A", na, span_a(p)},
      {"B", nb, span_b(p)},
      {"the bias", (uintptr_t)args->bias, bias_span(p)},
      {"scale_a", (uintptr_t)args->scale_a, args->scale_a ? sizeof(float) : 0},
      {"scale_b", (uintptr_t)args->scale_b, args->scale_b ? sizeof(float) : 0}};
  int i = 0;
  while (i < 4 && !ranges_meet(read[i].at, read[i].span, nc, out_span)) i++;
  return FERRY_ERR(FERRY_INVALID_ARGUMENT, "ferry_gemm_args_set_data: out (at 0x%llx) overlaps %s (at 0x%llx): a "
                   "kernel reads %s while other blocks write out; give out memory of its own", (unsigned long long)nc,
                   read[i].name, (unsigned long long)read[i].at, read[i].name);
}

ferry_status ferry_gemm_args_set_data(ferry_gemm_args *args, const void *a, const void *b, void *out) {
  if (!args || args->struct_size != sizeof *args)
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "ferry_gemm_args_set_data: args is NULL or was not initialised by "
                     "ferry_gemm_args_init");
  ferry_gemm_problem *p = &args->problem;
  /* The one check init makes that new addresses can break: out must not overlap A or B, nor the epilogue's bias
   * or scales (a kernel reads them while other blocks write out). The arguments are left as they were when it
   * fails. */
  const uintptr_t na = (uintptr_t)(a ? a : args->a), nb = (uintptr_t)(b ? b : args->b);
  const uintptr_t nc = (uintptr_t)(out ? out : args->out);
  const uint64_t out_span = span_out(p);
  if (__builtin_expect(ranges_meet(na, span_a(p), nc, out_span) || ranges_meet(nb, span_b(p), nc, out_span), 0) ||
      ((args->bias || args->scale_a || args->scale_b) &&
       (ranges_meet((uintptr_t)args->bias, bias_span(p), nc, out_span) ||
        ranges_meet((uintptr_t)args->scale_a, args->scale_a ? sizeof(float) : 0, nc, out_span) ||
        ranges_meet((uintptr_t)args->scale_b, args->scale_b ? sizeof(float) : 0, nc, out_span))))
    return out_overlap_error(args, na, nb, nc);
  if (a) {
    args->a = a;
    p->a_align = align_of((uintptr_t)a, p->lda, p->batch_a, p->a_type);
  }
  if (b) {
    args->b = b;
    p->b_align = align_of((uintptr_t)b, p->ldb, p->batch_b, p->b_type);
  }
  if (out) {
    args->out = out;
    p->out_align = align_of((uintptr_t)out, p->ldc, p->batch_c, p->out_type);
  }
  return FERRY_OK;
}

ferry_status ferry_gemm_args_set_epilogue(ferry_gemm_args *args, const ferry_tensor *bias, ferry_bias bias_mode,
                                          ferry_activation activation) {
  char dt[64];
  if (!args || args->struct_size != sizeof *args)
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "ferry_gemm_args_set_epilogue: args is NULL or was not initialised by "
                     "ferry_gemm_args_init");
  ferry_gemm_problem *p = &args->problem;
  if ((unsigned)bias_mode > FERRY_BIAS_COL)
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "bias mode %d is not FERRY_BIAS_NONE (0), ROW (1) or COL (2)",
                     (int)bias_mode);
  if ((unsigned)activation > FERRY_ACTIVATION_SILU)
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "activation %d is not NONE (0), RELU (1), GELU_TANH (2) or SILU (3)",
                     (int)activation);
  if ((bias != NULL) != (bias_mode != FERRY_BIAS_NONE))
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, bias ? "a bias tensor was given with FERRY_BIAS_NONE; say whether it "
                     "is a row (FERRY_BIAS_ROW, n values) or a column (FERRY_BIAS_COL, m values)"
                     : "bias mode %d needs a bias tensor", (int)bias_mode);
  const void *data = NULL;
  if (bias) {
    const char *what = bias_mode == FERRY_BIAS_ROW ? "a row bias (one value per column of out)"
                                                   : "a column bias (one value per row of out)";
    int64_t want = bias_mode == FERRY_BIAS_ROW ? p->n : p->m;
    if (bias->ndim != 1 || !bias->shape)
      return FERRY_ERR(FERRY_INVALID_ARGUMENT, "bias has rank %d; %s is a vector (rank 1) of %lld", (int)bias->ndim,
                       what, (long long)want);
    if (scalar_of(bias->dtype) != p->out_type)
      return FERRY_ERR(FERRY_INVALID_ARGUMENT, "bias has dtype %s; it must be out's, %s",
                       dtype_text(bias->dtype, dt, sizeof dt), ferry_scalar_name((ferry_scalar)p->out_type));
    if (bias->shape[0] != want)
      return FERRY_ERR(FERRY_INVALID_ARGUMENT, "bias has %lld elements; %s of this %d×%d output has %lld",
                       (long long)bias->shape[0], what, (int)p->m, (int)p->n, (long long)want);
    if (bias->strides && bias->shape[0] > 1 && bias->strides[0] != 1)
      return FERRY_ERR(FERRY_INVALID_ARGUMENT, "bias has stride %lld; it must be contiguous (stride 1)",
                       (long long)bias->strides[0]);
    if ((bias->device.device_type != FERRY_DEVICE_CUDA && bias->device.device_type != FERRY_DEVICE_CUDA_MANAGED) ||
        bias->device.device_id != p->device)
      return FERRY_ERR(FERRY_DEVICE_MISMATCH, "bias is on %s; it must be on out's device, cuda:%d",
                       device_text(bias->device, dt, sizeof dt), (int)p->device);
    if (!bias->data && want > 0)
      return FERRY_ERR(FERRY_INVALID_ARGUMENT, "bias: data is NULL but the tensor has elements");
    data = (const char *)bias->data + bias->byte_offset;
    ferry_status aligned = check_element_aligned("bias", "", (uintptr_t)data, ferry__scalar_bytes(p->out_type));
    if (aligned != FERRY_OK) return aligned;
    if (ranges_meet((uintptr_t)data, (uint64_t)want * (uint64_t)ferry__scalar_bytes(p->out_type),
                    (uintptr_t)args->out, span_out(p)))
      return FERRY_ERR(FERRY_INVALID_ARGUMENT, "bias overlaps out: every block reads the bias while other blocks "
                       "write out; give the bias memory of its own (a copy)");
  }
  if (p->out_type == FERRY_SCALAR_I32 && (bias || activation != FERRY_ACTIVATION_NONE))
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "an int32 output takes no epilogue: its sums go out exact; give a "
                     "float output for a bias or an activation");
  p->kind = (p->kind & (FERRY_GEMM_KIND_OPERANDS | FERRY_GEMM_KIND_SCALED)) |
            FERRY_GEMM_KIND_EPILOGUE(bias_mode, activation);
  p->bias = (uint8_t)bias_mode;
  p->activation = (uint8_t)activation;
  args->bias = data;
  return FERRY_OK;
}

/* One fp32 scale: any rank, one element, on the device `p` runs on. */
static ferry_status read_scale(const char *name, const ferry_tensor *t, const ferry_gemm_problem *p,
                               const void *out_addr, const float **out) {
  char dt[64];
  int64_t elems = 1;
  if (t->ndim < 0 || (t->ndim > 0 && !t->shape))
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "%s: rank %d without a shape", name, (int)t->ndim);
  for (int d = 0; d < t->ndim; d++) elems *= t->shape[d];
  if (scalar_of(t->dtype) != FERRY_SCALAR_F32)
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "%s has dtype %s; a scale is float32", name,
                     dtype_text(t->dtype, dt, sizeof dt));
  if (elems != 1)
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "%s has %lld elements; a per-tensor scale has one", name,
                     (long long)elems);
  if ((t->device.device_type != FERRY_DEVICE_CUDA && t->device.device_type != FERRY_DEVICE_CUDA_MANAGED) ||
      t->device.device_id != p->device)
    return FERRY_ERR(FERRY_DEVICE_MISMATCH, "%s is on %s; it must be on out's device, cuda:%d (the kernel reads it)",
                     name, device_text(t->device, dt, sizeof dt), (int)p->device);
  if (!t->data) return FERRY_ERR(FERRY_INVALID_ARGUMENT, "%s: data is NULL", name);
  const char *at = (const char *)t->data + t->byte_offset;
  if ((uintptr_t)at % sizeof(float))
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "%s: its element, at %p, is not aligned to 4 bytes", name,
                     (const void *)at);
  if (ranges_meet((uintptr_t)at, sizeof(float), (uintptr_t)out_addr, span_out(p)))
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "%s overlaps out: every block reads it while other blocks write out; "
                     "give it memory of its own", name);
  *out = (const float *)(const void *)at;
  return FERRY_OK;
}

ferry_status ferry_gemm_args_set_scales(ferry_gemm_args *args, const ferry_tensor *scale_a,
                                        const ferry_tensor *scale_b) {
  if (!args || args->struct_size != sizeof *args)
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "ferry_gemm_args_set_scales: args is NULL or was not initialised by "
                     "ferry_gemm_args_init");
  ferry_gemm_problem *p = &args->problem;
  if ((scale_a != NULL) != (scale_b != NULL))
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "scale %s was given without scale %s: give both (a scale of 1 for an "
                     "unscaled operand) or neither", scale_a ? "A" : "B", scale_a ? "B" : "A");
  const float *sa = NULL, *sb = NULL;
  if (scale_a) {
    if (p->out_type == FERRY_SCALAR_I32)
      return FERRY_ERR(FERRY_INVALID_ARGUMENT, "an int32 output takes no scales: its sums go out exact; give a "
                       "float output to scale them");
    ferry_status st = read_scale("scale_a", scale_a, p, args->out, &sa);
    if (st == FERRY_OK) st = read_scale("scale_b", scale_b, p, args->out, &sb);
    if (st != FERRY_OK) return st;
  }
  p->kind = sa ? p->kind | FERRY_GEMM_KIND_SCALED : p->kind & ~FERRY_GEMM_KIND_SCALED;
  p->scaled = sa != NULL;
  args->scale_a = sa;
  args->scale_b = sb;
  return FERRY_OK;
}
