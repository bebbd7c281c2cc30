/* test_ops_gpu.c — the operator runtime on a GPU (`build/ferry_test_ops_gpu [--quick] [TEST...]`, the tests in
 * test_list_ops_gpu.h): every built-in GEMM design that supports a case, for fp16/bf16/fp32 operands, every major
 * combination, odd sizes (1, 127, 128, 129, padded leading dimensions, a batch of 3) and 4096³ (sampled), against
 * a float64 reference on the host; alpha/beta; CUDA graphs (ferry's capture with an in-place operand update, and a
 * capture begun by someone else, as torch.cuda.graph does); a registered kernel end to end. Outputs are poisoned
 * with NaN before every run and every element is checked. --quick skips 4096³ (for compute-sanitizer, which slows
 * kernels a hundredfold); --sanitize keeps one odd size per design (for racecheck). every_failing_runtime_call_is_clean
 * injects faults into the runtime's driver and NVRTC calls (fault_ops_gpu.c); with --simulate, through the CPU
 * tests' simulated driver, without a GPU.
 *
 * Error bound: ‖out − ref‖ / ‖ref‖ over the output, with ref from the rounded inputs in float64:
 * fp32 out from fp32 operands 1e-5; fp32 out from fp16/bf16 operands 1e-4; fp16 out 5e-3; bf16 out 1e-2; fp16
 * accumulation 1e-2 (k ≤ 129). NaN never passes.
 */
#include "fault_ops.h"
#include "ops.h"
#include "require.h"
#include "test.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int failures, checks;
static CUstream stream;
static int dev;

#define EXPECT(cond, ...)                                                                                    \
  do {                                                                                                       \
    checks++;                                                                                                \
    if (!(cond)) {                                                                                           \
      failures++;                                                                                            \
      printf("FAIL %s:%d: ", __FILE__, __LINE__);                                                            \
      printf(__VA_ARGS__);                                                                                   \
      printf("\n");                                                                                          \
    }                                                                                                        \
  } while (0)

/* ---- host numbers ------------------------------------------------------------------------------------------ */

static uint64_t rng_state = 0x243f6a8885a308d3ull;
static double uniform(void) { /* [-1, 1) */
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return (double)(z >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

static uint16_t f32_to_f16(float f) { /* round to nearest even */
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u, e = (x >> 23) & 0xffu, man = x & 0x7fffffu;
  if (e == 0xff) return (uint16_t)(sign | 0x7c00u | (man ? 0x200u : 0));
  int exp = (int)e - 127 + 15;
  if (exp >= 31) return (uint16_t)(sign | 0x7c00u);
  if (exp <= 0) {
    if (exp < -10) return (uint16_t)sign;
    man |= 0x800000u;
    int shift = 14 - exp;
    uint32_t h = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1))) h++;
    return (uint16_t)(sign | h);
  }
  uint32_t h = ((uint32_t)exp << 10) | (man >> 13), rem = man & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++;
  return (uint16_t)(sign | h);
}
static float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, man = h & 0x3ffu, x;
  if (e == 0) {
    if (!man) x = sign;
    else {
      int s = 0;
      while (!(man & 0x400u)) man <<= 1, s++;
      x = sign | ((uint32_t)(113 - s) << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (e == 31) x = sign | 0x7f800000u | (man << 13);
  else x = sign | ((e + 112) << 23) | (man << 13);
  float f;
  memcpy(&f, &x, 4);
  return f;
}
static uint16_t f32_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
  return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
static float bf16_to_f32(uint16_t h) {
  uint32_t x = (uint32_t)h << 16;
  float f;
  memcpy(&f, &x, 4);
  return f;
}
/* FP8 values: e4m3fn (eb 4: bias 7, no infinities, S.1111.111 NaN) or e5m2 (eb 5: bias 15, IEEE-like); the encoder
 * rounds to nearest even and is only given values well inside the range. */
static double fp8_to_double(uint8_t v, int eb) {
  const int mb = 7 - eb, bias = (1 << (eb - 1)) - 1, e = (v >> mb) & ((1 << eb) - 1), m = v & ((1 << mb) - 1);
  double x;
  if (eb == 4 && e == 15 && m == 7) x = NAN;
  else if (eb == 5 && e == 31) x = m ? NAN : INFINITY;
  else x = e ? ldexp(m + (1 << mb), e - bias - mb) : ldexp(m, 1 - bias - mb);
  return v & 0x80 ? -x : x;
}
static uint8_t double_to_fp8(double v, int eb) {
  const int mb = 7 - eb, bias = (1 << (eb - 1)) - 1;
  const uint8_t sign = v < 0 ? 0x80 : 0;
  const double a = fabs(v);
  if (a == 0) return sign;
  int e;
  const double f = frexp(a, &e); /* a = f·2^e, f in [0.5, 1) */
  int biased = e - 1 + bias;
  if (biased <= 0) return sign | (uint8_t)lrint(ldexp(a, bias - 1 + mb)); /* subnormal (or the smallest normal) */
  long q = lrint(ldexp(f, mb + 1));                                        /* in [2^mb, 2^(mb+1)] */
  if (q == 1L << (mb + 1)) q >>= 1, biased++;
  return sign | (uint8_t)(biased << mb) | (uint8_t)(q & ((1 << mb) - 1));
}

static size_t esize(int t) {
  return t == FERRY_SCALAR_F32 || t == FERRY_SCALAR_I32 ? 4 : t == FERRY_SCALAR_F16 || t == FERRY_SCALAR_BF16 ? 2 : 1;
}
static void put(void *base, size_t i, int t, double v) { /* stores v rounded to t; */
  if (t == FERRY_SCALAR_F32) ((float *)base)[i] = (float)v;
  else if (t == FERRY_SCALAR_F16) ((uint16_t *)base)[i] = f32_to_f16((float)v);
  else if (t == FERRY_SCALAR_BF16) ((uint16_t *)base)[i] = f32_to_bf16((float)v);
  else if (t == FERRY_SCALAR_I32) ((int32_t *)base)[i] = (int32_t)lrint(v);
  else if (t == FERRY_SCALAR_I8) ((int8_t *)base)[i] = (int8_t)lrint(v);
  else ((uint8_t *)base)[i] = double_to_fp8(v, t == FERRY_SCALAR_E4M3 ? 4 : 5);
}
static double get(const void *base, size_t i, int t) {
  if (t == FERRY_SCALAR_F32) return ((const float *)base)[i];
  if (t == FERRY_SCALAR_F16) return f16_to_f32(((const uint16_t *)base)[i]);
  if (t == FERRY_SCALAR_BF16) return bf16_to_f32(((const uint16_t *)base)[i]);
  if (t == FERRY_SCALAR_I32) return ((const int32_t *)base)[i];
  if (t == FERRY_SCALAR_I8) return ((const int8_t *)base)[i];
  return fp8_to_double(((const uint8_t *)base)[i], t == FERRY_SCALAR_E4M3 ? 4 : 5);
}
/* The poison a kernel must overwrite: all-ones bits (NaN) in the float types; 0x80808080 in int32, which no sum of
 * int8 products below 2^31 / 127² terms reaches. */
static int unwritten(const void *base, size_t i, int t) {
  return t == FERRY_SCALAR_I32 ? ((const int32_t *)base)[i] == (int32_t)0x80808080u : isnan(get(base, i, t));
}
static ferry_dtype dtype_of(int t) {
  switch (t) {
  case FERRY_SCALAR_F32: return (ferry_dtype){FERRY_DTYPE_FLOAT, 32, 1};
  case FERRY_SCALAR_F16: return (ferry_dtype){FERRY_DTYPE_FLOAT, 16, 1};
  case FERRY_SCALAR_BF16: return (ferry_dtype){FERRY_DTYPE_BFLOAT, 16, 1};
  case FERRY_SCALAR_E4M3: return (ferry_dtype){10, 8, 1}; /* DLPack's float8_e4m3fn */
  case FERRY_SCALAR_E5M2: return (ferry_dtype){12, 8, 1}; /* float8_e5m2 */
  case FERRY_SCALAR_I8: return (ferry_dtype){FERRY_DTYPE_INT, 8, 1};
  default: return (ferry_dtype){FERRY_DTYPE_INT, 32, 1};
  }
}

/* ---- matrices ---------------------------------------------------------------------------------------------- */

/* One operand: l batches of rows×cols, row- or column-major with leading dimension ld, host copy and device copy. */
typedef struct mat {
  int type, col, rows, cols, l;
  int64_t ld, batch, shape[3], strides[3];
  size_t elems;
  void *host;
  double *val;          /* the host values as doubles (inputs), for the reference */
  CUdeviceptr dev;
  ferry_tensor t;
} mat;

static size_t at(const mat *m, int z, int i, int j) {
  return (size_t)z * (size_t)m->batch + (m->col ? (size_t)i + (size_t)j * (size_t)m->ld : (size_t)i * (size_t)m->ld + (size_t)j);
}

static void mat_make(mat *m, int type, int col, int l, int rows, int cols, int pad) {
  memset(m, 0, sizeof *m);
  m->type = type, m->col = col, m->rows = rows, m->cols = cols, m->l = l;
  int64_t inner = col ? rows : cols, outer = col ? cols : rows;
  m->ld = pad ? (inner + pad - 1) / pad * pad : inner;
  if (m->ld < 1) m->ld = 1;
  m->batch = m->ld * outer;
  m->elems = (size_t)(m->batch * l);
  if (m->elems == 0) m->elems = 1;
  m->host = calloc(m->elems, esize(type));
  REQUIRE_CU(ferry__drv.cuMemAlloc(&m->dev, m->elems * esize(type)));
  int b = l > 1;
  if (b) m->shape[0] = l, m->strides[0] = m->batch;
  m->shape[b] = rows;
  m->shape[b + 1] = cols;
  m->strides[b] = col ? 1 : m->ld;
  m->strides[b + 1] = col ? m->ld : 1;
  m->t = (ferry_tensor){(void *)(uintptr_t)m->dev, {FERRY_DEVICE_CUDA, dev}, 2 + b, dtype_of(type), m->shape,
                        m->strides, 0};
}
/* Host -> device, complete on return. From pageable memory cuMemcpyHtoD may return before its DMA lands, and the
 * operators run on a non-blocking stream that does not wait for the legacy stream the copy went on: without the
 * sync, a NaN sentinel could land after the kernel's output and read as "not written" (seen on the H200 while
 * another process kept the copy engines busy). */
static void mat_upload(mat *m) {
  REQUIRE_CU(ferry__drv.cuMemcpyHtoD(m->dev, m->host, m->elems * esize(m->type)));
  REQUIRE_CU(ferry__drv.cuStreamSynchronize(NULL));
}
/* FP8 operands spread over e4m3's exponents (magnitudes 2^-6 to 4, either sign) instead of uniform in [-1, 1):
 * sums whose terms differ by orders of magnitude, which show a running sum kept in fewer bits than fp32. */
static int wide_fp8;

static double random_value(int type) {
  if (type == FERRY_SCALAR_I8) return uniform() * 127.0; /* every value */
  if (wide_fp8 && (type == FERRY_SCALAR_E4M3 || type == FERRY_SCALAR_E5M2)) {
    double u = uniform();
    return (u < 0 ? -1.0 : 1.0) * exp2(-6.0 + 8.0 * fabs(u));
  }
  return uniform();
}

static void mat_random(mat *m) {
  if (!m->val) m->val = malloc(m->elems * sizeof *m->val);
  for (size_t i = 0; i < m->elems; i++) {
    put(m->host, i, m->type, random_value(m->type));
    m->val[i] = get(m->host, i, m->type);
  }
  mat_upload(m);
}
static void mat_poison(mat *m) { /* see unwritten() */
  memset(m->host, m->type == FERRY_SCALAR_I32 ? 0x80 : 0xff, m->elems * esize(m->type));
  mat_upload(m);
}
static void mat_download(mat *m) { REQUIRE_CU(ferry__drv.cuMemcpyDtoH(m->host, m->dev, m->elems * esize(m->type))); }
static void mat_free(mat *m) {
  if (m->dev) REQUIRE_CU(ferry__drv.cuMemFree(m->dev));
  free(m->host);
  free(m->val);
  memset(m, 0, sizeof *m);
}

/* The fused epilogue of the cases that run now (set around them; FERRY_BIAS_NONE and NONE: a plain GEMM), and the
 * bias values of the running case as doubles (n or m of them). */
static ferry_bias epi_mode;
static ferry_activation epi_act;
static double *epi_bias;
static float epi_scale_a, epi_scale_b; /* per-tensor scales of the cases that run now; 0: none */

static double activate(double x) {
  switch (epi_act) {
  case FERRY_ACTIVATION_RELU: return x < 0 ? 0 : x;
  case FERRY_ACTIVATION_GELU_TANH: return 0.5 * x * (1 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
  case FERRY_ACTIVATION_SILU: return x / (1 + exp(-x));
  default: return x;
  }
}

/* ref = the epilogue of alpha*A·B + beta*c0 for the sampled elements (all when `every` is 1), relative error of
 * `out`, and whether every element was written (no NaN anywhere in the output). */
typedef struct verdict { double rel; long nan_at; } verdict;

static verdict check(const mat *a, const mat *b, const mat *out, const double *c0, float alpha, float beta,
                     int every) {
  verdict v = {0, -1};
  double num = 0, den = 0;
  int m = out->rows, n = out->cols, k = a->cols;
  for (int z = 0; z < out->l && v.nan_at < 0; z++)
    for (int i = 0; i < m; i++)
      for (int j = 0; j < n; j++)
        if (unwritten(out->host, at(out, z, i, j), out->type)) {
          v.nan_at = (long)at(out, z, i, j);
          break;
        }
  size_t total = (size_t)out->l * m * n, samples = every ? total : 2048;
  for (size_t s = 0; s < samples && total; s++) {
    size_t e = every ? s : (size_t)((uniform() + 1.0) * 0.5 * (double)total) % total;
    int z = (int)(e / ((size_t)m * n)), i = (int)(e / n % m), j = (int)(e % n);
    int za = a->l > 1 ? z : 0, zb = b->l > 1 ? z : 0;
    double acc = 0;
    for (int p = 0; p < k; p++) acc += a->val[at(a, za, i, p)] * b->val[at(b, zb, p, j)];
    double bias = epi_mode == FERRY_BIAS_ROW ? epi_bias[j] : epi_mode == FERRY_BIAS_COL ? epi_bias[i] : 0.0;
    const double scale = epi_scale_a != 0.0f ? (double)epi_scale_a * epi_scale_b : 1.0;
    double ref = activate(alpha * scale * acc + (c0 ? beta * c0[at(out, z, i, j)] : 0.0) + bias);
    double got = get(out->host, at(out, z, i, j), out->type);
    num += (got - ref) * (got - ref);
    den += ref * ref;
  }
  v.rel = den > 0 ? sqrt(num / den) : sqrt(num);
  return v;
}

static double bound_of(int in, int out, int acc, int k) {
  if (out == FERRY_SCALAR_I32) return 0.0; /* int8 sums are exact */
  if (acc == FERRY_SCALAR_F16) return k <= 129 ? 1e-2 : 5e-2;
  /* FP8 products are exact in fp32, but Hopper's FP8 tensor cores keep fewer bits of the running sum */
  if ((in == FERRY_SCALAR_E4M3 || in == FERRY_SCALAR_E5M2) && out == FERRY_SCALAR_F32) return 3e-3;
  if (out == FERRY_SCALAR_BF16) return 1e-2;
  if (out == FERRY_SCALAR_F16) return 5e-3;
  return in == FERRY_SCALAR_F32 ? 1e-5 : 1e-4;
}

/* ---- the correctness matrix -------------------------------------------------------------------------------- */

typedef struct op_tally { const ferry_op *op; int runs, fails; double worst; } op_tally;
static op_tally *tallies; /* one per operator run, grown as met (FERRY_EXPERIMENTAL_DESIGNS=1 registers 67) */
static int n_tallies, cap_tallies;
static op_tally *tally_of(const ferry_op *op) {
  for (int i = 0; i < n_tallies; i++)
    if (tallies[i].op == op) return &tallies[i];
  if (n_tallies == cap_tallies) {
    cap_tallies = cap_tallies ? 2 * cap_tallies : 64;
    tallies = realloc(tallies, (size_t)cap_tallies * sizeof *tallies);
    if (!tallies) FAIL_AT("out of memory for %d operator tallies", cap_tallies);
  }
  tallies[n_tallies] = (op_tally){op, 0, 0, 0};
  return &tallies[n_tallies++];
}

static const char *major_name(int a, int b, int c) {
  static char s[4];
  s[0] = a ? 'C' : 'R', s[1] = b ? 'C' : 'R', s[2] = c ? 'C' : 'R', s[3] = 0;
  return s;
}

/* Runs every operator that supports the case, each on freshly poisoned output. */
static void run_case(int ta, int tb, int tout, int tacc, int ca, int cb, int cc, int m, int n, int k, int l,
                     int pad, float alpha, float beta) {
  mat a, b, out;
  mat_make(&a, ta, ca, l, m, k, pad);
  mat_make(&b, tb, cb, l, k, n, pad);
  mat_make(&out, tout, cc, l, m, n, pad);
  mat_random(&a);
  mat_random(&b);
  double *c0 = NULL;
  if (beta != 0.0f) {
    mat_random(&out);
    c0 = malloc(out.elems * sizeof *c0);
    for (size_t i = 0; i < out.elems; i++) c0[i] = get(out.host, i, tout);
  }
  ferry_gemm_args args;
  REQUIRE_OK(ferry_gemm_args_init(&args, &a.t, &b.t, &out.t, (ferry_scalar)tacc));
  args.alpha = alpha;
  args.beta = beta;
  /* the epilogue's bias: random values of out's type, one per column (row mode) or per row (column mode) */
  int64_t bias_len = epi_mode == FERRY_BIAS_ROW ? n : epi_mode == FERRY_BIAS_COL ? m : 0;
  mat bias;
  memset(&bias, 0, sizeof bias);
  ferry_tensor bias_t;
  if (bias_len) {
    mat_make(&bias, tout, 0, 1, 1, (int)bias_len, 0);
    mat_random(&bias);
    epi_bias = bias.val;
    bias_t = bias.t;
    bias_t.ndim = 1;
    bias_t.shape = &bias.shape[1];
    bias_t.strides = &bias.strides[1];
  }
  REQUIRE_OK(ferry_gemm_args_set_epilogue(&args, bias_len ? &bias_t : NULL, epi_mode, epi_act));
  mat scales;
  memset(&scales, 0, sizeof scales);
  if (epi_scale_a != 0.0f) { /* two one-element fp32 tensors on the device */
    mat_make(&scales, FERRY_SCALAR_F32, 0, 1, 1, 2, 0);
    ((float *)scales.host)[0] = epi_scale_a, ((float *)scales.host)[1] = epi_scale_b;
    mat_upload(&scales);
    ferry_tensor sa = scales.t, sb = scales.t;
    sa.ndim = sb.ndim = 0;
    sb.byte_offset = 4;
    REQUIRE_OK(ferry_gemm_args_set_scales(&args, &sa, &sb));
  }
  const ferry_op *ops[32];
  size_t n_ops = 0;
  REQUIRE_OK(ferry_ops_find(&args, 0, NULL, NULL, ops, 32, &n_ops));
  EXPECT(n_ops > 0, "no operator for %s·%s→%s acc %s %s %d×%d×%d l=%d", ferry_scalar_name(ta), ferry_scalar_name(tb),
         ferry_scalar_name(tout), ferry_scalar_name(tacc), major_name(ca, cb, cc), m, n, k, l);
  int every = (size_t)m * n * l <= 300000;
  for (size_t o = 0; o < n_ops && o < 32; o++) {
    if (beta != 0.0f) { /* the old output again (the previous operator's result overwrote the host copy) */
      for (size_t i = 0; i < out.elems; i++) put(out.host, i, tout, c0[i]);
      mat_upload(&out);
    } else {
      mat_poison(&out);
    }
    ferry_artifact *art = NULL;
    ferry_status st = ferry_op_compile(ops[o], &args, &art);
    if (st == FERRY_OK) st = ferry_op_run(ops[o], &args, stream, art, 0);
    if (st == FERRY_OK) st = ferry__drv.cuStreamSynchronize(stream) == CUDA_SUCCESS ? FERRY_OK : FERRY_DRIVER_ERROR;
    ferry_artifact_release(art);
    op_tally *t = tally_of(ops[o]);
    t->runs++;
    const char *name = ferry_op_info_get(ops[o])->name;
    if (st != FERRY_OK) {
      t->fails++;
      EXPECT(0, "%s on %s %d×%d×%d: %s: %s", name, major_name(ca, cb, cc), m, n, k, ferry_status_name(st),
             ferry_last_error_message());
      if (st == FERRY_DRIVER_ERROR) exit(3); /* a kernel fault poisons the context: stop here */
      continue;
    }
    mat_download(&out);
    verdict v = check(&a, &b, &out, c0, alpha, beta, every);
    double bound = bound_of(ta, tout, tacc, k);
    if (v.rel > t->worst) t->worst = v.rel;
    int ok = v.nan_at < 0 && v.rel <= bound && !isnan(v.rel);
    if (!ok) t->fails++;
    EXPECT(ok, "%s: %s·%s→%s acc %s %s %d×%d×%d l=%d pad %d alpha %g beta %g bias %d activation %d: rel err %.3g "
           "(bound %.0e)%s", name, ferry_scalar_name(ta), ferry_scalar_name(tb), ferry_scalar_name(tout),
           ferry_scalar_name(tacc), major_name(ca, cb, cc), m, n, k, l, pad, alpha, beta, (int)epi_mode, (int)epi_act,
           v.rel, bound, v.nan_at >= 0 ? ", and NaN (unwritten?) in the output" : "");
  }
  if (bias_len) mat_free(&bias);
  if (scales.dev) mat_free(&scales);
  epi_bias = NULL;
  free(c0);
  mat_free(&a);
  mat_free(&b);
  mat_free(&out);
}

/* Compiles every (operator, kind) the matrix will use on all cores first: NVRTC dominates this program's time,
 * and ferry's compile is thread-safe. Problems described on aligned fake addresses (nothing is dereferenced). */
typedef struct compile_job { const ferry_op *op; ferry_gemm_args args; } compile_job;
static compile_job jobs[1024];
static int n_jobs;
static _Atomic int next_job;

static void add_jobs(int ta, int tb, int tout, int tacc, int ca, int cb, int cc) {
  int64_t sa[2] = {128, 128}, st_row[2] = {128, 1}, st_col[2] = {1, 128};
  ferry_tensor A = {(void *)0x100000, {FERRY_DEVICE_CUDA, dev}, 2, dtype_of(ta), sa, ca ? st_col : st_row, 0};
  ferry_tensor B = {(void *)0x200000, {FERRY_DEVICE_CUDA, dev}, 2, dtype_of(tb), sa, cb ? st_col : st_row, 0};
  ferry_tensor C = {(void *)0x300000, {FERRY_DEVICE_CUDA, dev}, 2, dtype_of(tout), sa, cc ? st_col : st_row, 0};
  ferry_gemm_args args;
  REQUIRE_OK(ferry_gemm_args_init(&args, &A, &B, &C, (ferry_scalar)tacc));
  int64_t bias_shape[1] = {128};
  ferry_tensor bias = {(void *)0x400000, {FERRY_DEVICE_CUDA, dev}, 1, dtype_of(tout), bias_shape, NULL, 0};
  REQUIRE_OK(ferry_gemm_args_set_epilogue(&args, epi_mode ? &bias : NULL, epi_mode, epi_act));
  ferry_tensor scale = {(void *)0x500000, {FERRY_DEVICE_CUDA, dev}, 0, dtype_of(FERRY_SCALAR_F32), NULL, NULL, 0};
  if (epi_scale_a != 0.0f) REQUIRE_OK(ferry_gemm_args_set_scales(&args, &scale, &scale));
  const ferry_op *ops[32];
  size_t n = 0;
  REQUIRE_OK(ferry_ops_find(&args, 0, NULL, NULL, ops, 32, &n));
  for (size_t i = 0; i < n && i < 32 && n_jobs < 1024; i++) jobs[n_jobs++] = (compile_job){ops[i], args};
}

static void *compile_worker(void *unused) {
  (void)unused;
  for (int j; (j = atomic_fetch_add(&next_job, 1)) < n_jobs;) {
    ferry_artifact *art = NULL;
    ferry_status st = ferry_op_compile(jobs[j].op, &jobs[j].args, &art);
    if (st != FERRY_OK)
      printf("FAIL compiling %s: %s\n", ferry_op_info_get(jobs[j].op)->name, ferry_last_error_message());
    ferry_artifact_release(art); /* the memo keeps it */
  }
  return NULL;
}

static void precompile(void) {
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  pthread_t threads[16];
  int n = 0;
  for (; n < 16; n++)
    if (pthread_create(&threads[n], NULL, compile_worker, NULL) != 0) break;
  if (n == 0) compile_worker(NULL);
  for (int i = 0; i < n; i++) pthread_join(threads[i], NULL);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  printf("precompiled %d (operator, kind) pairs on %d threads in %.1f s\n", n_jobs, n,
         (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9);
}

typedef struct size_case { int m, n, k, l, pad; } size_case;
/* The last: 16-byte aligned with whole k-tiles inside the operands and edges in m, n and k after them (the
 * swizzled designs' unpredicated main loop, then their edge loop). */
static const size_case sizes[] = {{1, 1, 1, 1, 0},     {127, 127, 127, 1, 0}, {128, 128, 128, 1, 0},
                                  {129, 129, 129, 1, 0}, {129, 127, 65, 1, 8}, {127, 129, 129, 3, 8},
                                  {264, 392, 328, 1, 8}};

/* The element types, short, for the tables below. */
enum {
  F16 = FERRY_SCALAR_F16, BF16 = FERRY_SCALAR_BF16, F32 = FERRY_SCALAR_F32, E4M3 = FERRY_SCALAR_E4M3,
  E5M2 = FERRY_SCALAR_E5M2, I8 = FERRY_SCALAR_I8, I32 = FERRY_SCALAR_I32
};

/* 8-bit inputs: k a multiple of 16 and leading dimensions of whole 16-byte chunks, A row-major and B column-major;
 * edges in m and n, one and several k-tiles, a batch, the m = 16 designs. */
static const size_case sizes_8bit[] = {{1, 1, 16, 1, 0},     {127, 127, 128, 1, 0}, {129, 129, 144, 1, 16},
                                       {129, 127, 64, 1, 16}, {127, 129, 160, 3, 16}, {264, 392, 336, 1, 16},
                                       {16, 392, 512, 1, 0}};
typedef struct kind_8bit { int a, b, out, acc; } kind_8bit;
static const kind_8bit kinds_8bit[] = {{E4M3, E4M3, BF16, F32}, {E4M3, E5M2, F32, F32}, {E5M2, E4M3, F16, F32},
                                       {E5M2, E5M2, BF16, F32}, {I8, I8, I32, I32},     {I8, I8, BF16, I32},
                                       {I8, I8, F32, I32}};
enum { KINDS_8BIT = sizeof kinds_8bit / sizeof kinds_8bit[0] };

/* Fused epilogues: each bias mode and activation, in kinds that reach the element, tile and 4-wide stores, the SIMT
 * kernel and the m = 16 designs (a decode step). */
typedef struct epilogue_case {
  int in, out, ca, cb, cc;
  ferry_bias mode;
  ferry_activation act;
  int m, n, k, l;
  float alpha, beta;
} epilogue_case;
static const epilogue_case epilogue_cases[] = {
    {BF16, BF16, 0, 0, 0, FERRY_BIAS_ROW, FERRY_ACTIVATION_GELU_TANH, 129, 127, 65, 1, 1.0f, 0.0f},
    {F16, F32, 0, 1, 1, FERRY_BIAS_COL, FERRY_ACTIVATION_SILU, 127, 129, 129, 3, -1.5f, 0.25f},
    {F16, F16, 1, 1, 1, FERRY_BIAS_NONE, FERRY_ACTIVATION_RELU, 264, 392, 328, 1, 1.0f, 0.0f},
    {F32, F32, 0, 0, 0, FERRY_BIAS_ROW, FERRY_ACTIVATION_RELU, 129, 127, 65, 1, 1.0f, 0.5f},
    {BF16, BF16, 0, 1, 0, FERRY_BIAS_ROW, FERRY_ACTIVATION_GELU_TANH, 16, 392, 328, 1, 1.0f, 0.0f},
    {BF16, BF16, 0, 0, 0, FERRY_BIAS_COL, FERRY_ACTIVATION_NONE, 264, 392, 328, 1, 1.0f, 0.0f}};
enum { EPILOGUE_CASES = sizeof epilogue_cases / sizeof epilogue_cases[0] };

/* sanitize: one size with partial tiles and padded leading dimensions, and only the all-row/all-column majors, so
 * that racecheck (hundreds of times slower per launch) still sees every design within minutes. */
static void correctness_matrix(int quick, int sanitize) {
  typedef struct kind { int a, b, out, acc, all_majors; } kind;
  static const kind kinds[] = {
      {F16, F16, F16, F32, 1},  {F16, F16, F32, F32, 0},
      {F16, F16, F16, F16, 0},  {BF16, BF16, BF16, F32, 1},
      {BF16, BF16, F32, F32, 0}, {F32, F32, F32, F32, 1},
      {F16, BF16, F32, F32, 0}};
  for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
    for (int majors = 0; majors < 8; majors++)
      if (kinds[k].all_majors || majors == 0 || majors == 7 || majors == 3)
        add_jobs(kinds[k].a, kinds[k].b, kinds[k].out, kinds[k].acc, majors & 1, (majors >> 1) & 1, (majors >> 2) & 1);
  add_jobs(BF16, BF16, BF16, F32, 1, 0, 1);
  add_jobs(F32, F32, F32, F32, 1, 1, 0);
  add_jobs(BF16, BF16, F32, F32, 0, 1, 0);
  for (int e = 0; e < EPILOGUE_CASES; e++) {
    const epilogue_case *c = &epilogue_cases[e];
    epi_mode = c->mode, epi_act = c->act;
    add_jobs(c->in, c->in, c->out, F32, c->ca, c->cb, c->cc);
  }
  epi_mode = FERRY_BIAS_NONE, epi_act = FERRY_ACTIVATION_NONE;
  for (int k8 = 0; k8 < KINDS_8BIT; k8++)
    for (int cc = 0; cc < 2; cc++) add_jobs(kinds_8bit[k8].a, kinds_8bit[k8].b, kinds_8bit[k8].out, kinds_8bit[k8].acc,
                                            0, 1, cc);
  epi_scale_a = epi_scale_b = 1.0f; /* scaled kinds, with an epilogue beside them */
  epi_mode = FERRY_BIAS_ROW, epi_act = FERRY_ACTIVATION_GELU_TANH;
  add_jobs(E4M3, E4M3, BF16, F32, 0, 1, 0);
  epi_mode = FERRY_BIAS_COL, epi_act = FERRY_ACTIVATION_SILU;
  add_jobs(I8, I8, F16, I32, 0, 1, 0);
  epi_mode = FERRY_BIAS_NONE, epi_act = FERRY_ACTIVATION_NONE;
  add_jobs(E5M2, E4M3, F32, F32, 0, 1, 1);
  epi_scale_a = epi_scale_b = 0.0f;
  precompile();
  for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
    for (int majors = 0; majors < 8; majors++) {
      if (!kinds[k].all_majors && majors != 0 && majors != 7 && majors != 3) continue;
      if (sanitize && majors != 0 && majors != 7) continue;
      int ca = majors & 1, cb = (majors >> 1) & 1, cc = (majors >> 2) & 1;
      for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        if (sanitize && !(sizes[s].m == 129 && sizes[s].n == 127)) continue;
        run_case(kinds[k].a, kinds[k].b, kinds[k].out, kinds[k].acc, ca, cb, cc, sizes[s].m, sizes[s].n, sizes[s].k,
                 sizes[s].l, sizes[s].pad, 1.0f, 0.0f);
      }
    }
  /* alpha and beta read and scale the old output */
  run_case(F16, F16, F32, F32, 0, 0, 0, 129, 127, 65, 1, 8, 0.5f, 2.0f);
  run_case(BF16, BF16, BF16, F32, 1, 0, 1, 127, 129, 129, 3, 8, -1.5f, 0.25f);
  run_case(F32, F32, F32, F32, 1, 1, 0, 129, 129, 129, 1, 0, 2.0f, -1.0f);
  /* empty k: out = beta*out */
  run_case(F16, F16, F32, F32, 0, 0, 0, 64, 64, 0, 1, 8, 1.0f, 0.5f);
  for (int e = 0; e < (sanitize ? 2 : EPILOGUE_CASES); e++) {
    const epilogue_case *c = &epilogue_cases[e];
    epi_mode = c->mode, epi_act = c->act;
    run_case(c->in, c->in, c->out, F32, c->ca, c->cb, c->cc, c->m, c->n, c->k, c->l, 8, c->alpha, c->beta);
  }
  epi_mode = FERRY_BIAS_NONE, epi_act = FERRY_ACTIVATION_NONE;
  /* 8-bit inputs: every kind, out row- and column-major, every size */
  for (int k8 = 0; k8 < KINDS_8BIT; k8++)
    for (int cc = 0; cc < 2; cc++)
      for (size_t s = 0; s < sizeof sizes_8bit / sizeof sizes_8bit[0]; s++) {
        const size_case *z = &sizes_8bit[s];
        if (sanitize && !(z->m == 129 && z->n == 127)) continue;
        run_case(kinds_8bit[k8].a, kinds_8bit[k8].b, kinds_8bit[k8].out, kinds_8bit[k8].acc, 0, 1, cc, z->m, z->n,
                 z->k, z->l, z->pad, 1.0f, 0.0f);
      }
  /* per-tensor scales on the device, with alpha, beta and an epilogue beside them */
  epi_scale_a = 0.5f, epi_scale_b = 3.0f;
  epi_mode = FERRY_BIAS_ROW, epi_act = FERRY_ACTIVATION_GELU_TANH;
  run_case(E4M3, E4M3, BF16, F32, 0, 1, 0, 129, 127, 64, 1, 16, 1.0f, 0.0f);
  epi_mode = FERRY_BIAS_COL, epi_act = FERRY_ACTIVATION_SILU;
  run_case(I8, I8, F16, I32, 0, 1, 0, 16, 392, 512, 1, 0, 1.0f / 4096.0f, 0.0f);
  epi_mode = FERRY_BIAS_NONE, epi_act = FERRY_ACTIVATION_NONE;
  run_case(E5M2, E4M3, F32, F32, 0, 1, 1, 127, 129, 160, 3, 16, -1.5f, 0.25f);
  epi_scale_a = epi_scale_b = 0.0f;
  if (!quick && !sanitize) {
    run_case(E4M3, E4M3, BF16, F32, 0, 1, 0, 4096, 4096, 4096, 1, 0, 1.0f, 0.0f);
    /* long sums of terms of many magnitudes: a design that keeps Hopper's FP8 running sums (fewer bits than
     * fp32) across k-tiles was 4.2e-2 from cuBLASLt on such data at 4096³ and 7.7e-2 at the decode shape
     * (ferry_time_gemm), against 2.2e-3 for the mma.sync designs */
    wide_fp8 = 1;
    run_case(E4M3, E4M3, BF16, F32, 0, 1, 0, 4096, 4096, 4096, 1, 0, 1.0f, 0.0f);
    run_case(E4M3, E4M3, BF16, F32, 0, 1, 0, 16, 8192, 8192, 1, 0, 1.0f, 0.0f);
    wide_fp8 = 0;
    run_case(I8, I8, I32, I32, 0, 1, 0, 4096, 4096, 4096, 1, 0, 1.0f, 0.0f);
    run_case(F16, F16, F16, F32, 0, 0, 0, 4096, 4096, 4096, 1, 0, 1.0f, 0.0f);
    run_case(BF16, BF16, BF16, F32, 1, 1, 1, 4096, 4096, 4096, 1, 0, 1.0f, 0.0f);
    run_case(BF16, BF16, F32, F32, 0, 1, 0, 4096, 4096, 4096, 1, 0, 1.0f, 0.0f);
  }
}

/* ---- graphs ------------------------------------------------------------------------------------------------ */

static void graphs(void) {
  enum { RUNS = 20, M = 128 };
  mat a[RUNS + 1], b[RUNS + 1], out[RUNS + 1];
  ferry_gemm_args args[RUNS + 1];
  for (int i = 0; i <= RUNS; i++) {
    mat_make(&a[i], FERRY_SCALAR_F16, 0, 1, M, M, 0);
    mat_make(&b[i], FERRY_SCALAR_F16, 0, 1, M, M, 0);
    mat_make(&out[i], FERRY_SCALAR_F16, 0, 1, M, M, 0);
    mat_random(&a[i]);
    mat_random(&b[i]);
    mat_poison(&out[i]);
    REQUIRE_OK(ferry_gemm_args_init(&args[i], &a[i].t, &b[i].t, &out[i].t, FERRY_SCALAR_F32));
  }
  const ferry_op *op = NULL;
  size_t n = 0;
  REQUIRE_OK(ferry_ops_find(&args[0], 0, NULL, NULL, &op, 1, &n));
  ferry_artifact *art = NULL;
  REQUIRE_OK(ferry_op_compile(op, &args[0], &art));
  /* ferry's own capture, with the runs recorded */
  ferry_graph *g = NULL;
  REQUIRE_OK(ferry_graph_begin(stream, &g));
  for (int i = 0; i < RUNS; i++) REQUIRE_OK(ferry_graph_run(g, op, &args[i], art, FERRY_RUN_ASSUME_SUPPORTED, NULL));
  REQUIRE_OK(ferry_graph_end(g));
  REQUIRE_OK(ferry_graph_replay(g, NULL));
  REQUIRE_CU(ferry__drv.cuStreamSynchronize(stream));
  double worst = 0;
  for (int i = 0; i < RUNS; i++) {
    mat_download(&out[i]);
    verdict v = check(&a[i], &b[i], &out[i], NULL, 1, 0, 1);
    if (v.rel > worst) worst = v.rel;
    EXPECT(v.nan_at < 0 && v.rel <= 5e-3, "graph replay, run %d: rel err %.3g%s", i, v.rel, v.nan_at >= 0 ? ", NaN" : "");
  }
  /* update run 5 to new operands; poison both outputs: only the new one may be written by the replay */
  mat_poison(&out[5]);
  mat_poison(&out[RUNS]);
  REQUIRE_OK(ferry_graph_update(g, 5, &args[RUNS]));
  REQUIRE_OK(ferry_graph_replay(g, NULL));
  REQUIRE_CU(ferry__drv.cuStreamSynchronize(stream));
  mat_download(&out[RUNS]);
  mat_download(&out[5]);
  verdict v = check(&a[RUNS], &b[RUNS], &out[RUNS], NULL, 1, 0, 1);
  EXPECT(v.nan_at < 0 && v.rel <= 5e-3, "graph update: the new operands' result has rel err %.3g%s", v.rel,
         v.nan_at >= 0 ? ", NaN" : "");
  int untouched = 1;
  for (size_t i = 0; i < out[5].elems; i++) untouched &= ((uint16_t *)out[5].host)[i] == 0xffff;
  EXPECT(untouched, "graph update: the replaced run still wrote its old output");
  ferry_graph_destroy(g);
  printf("graph: 20 runs captured and replayed (worst rel err %.2e); run 5 updated in place to new operands: %s\n",
         worst, v.rel <= 5e-3 && untouched ? "exact" : "WRONG");

  /* someone else's capture (torch.cuda.graph's pattern): plain ferry_op_run calls on the capturing stream */
  for (int i = 0; i < 3; i++) mat_poison(&out[i]);
  CUgraph cg = NULL;
  CUgraphExec ce = NULL;
  REQUIRE_CU(ferry__drv.cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
  for (int i = 0; i < 3; i++) REQUIRE_OK(ferry_op_run(op, &args[i], stream, art, FERRY_RUN_ASSUME_SUPPORTED));
  REQUIRE_CU(ferry__drv.cuStreamEndCapture(stream, &cg));
  REQUIRE_CU(ferry__drv.cuGraphInstantiateWithFlags(&ce, cg, 0));
  REQUIRE_CU(ferry__drv.cuGraphLaunch(ce, stream));
  REQUIRE_CU(ferry__drv.cuStreamSynchronize(stream));
  for (int i = 0; i < 3; i++) {
    mat_download(&out[i]);
    verdict w = check(&a[i], &b[i], &out[i], NULL, 1, 0, 1);
    EXPECT(w.nan_at < 0 && w.rel <= 5e-3, "external capture, run %d: rel err %.3g", i, w.rel);
  }
  /* a run that must compile during someone else's capture still works (compiles off the stream) */
  REQUIRE_CU(ferry__drv.cuGraphExecDestroy(ce));
  REQUIRE_CU(ferry__drv.cuGraphDestroy(cg));
  printf("graph: 3 runs under an external stream capture replayed correctly\n");
  ferry_artifact_release(art);
  for (int i = 0; i <= RUNS; i++) mat_free(&a[i]), mat_free(&b[i]), mat_free(&out[i]);
}

/* ---- a registered kernel ----------------------------------------------------------------------------------- */

static const char *byo_source =
    "// one thread per output element, fp32, either major for each operand (ferry's macros say which)\n"
    "extern \"C\" __global__ void byo_naive(ferry_gemm_params p) {\n"
    "  int i = blockIdx.x / ((p.n + 15) / 16) * 16 + threadIdx.x / 16;\n"
    "  int j = blockIdx.x % ((p.n + 15) / 16) * 16 + threadIdx.x % 16;\n"
    "  if (i >= p.m || j >= p.n) return;\n"
    "  const float *A = (const float *)p.a + blockIdx.z * p.batch_a;\n"
    "  const float *B = (const float *)p.b + blockIdx.z * p.batch_b;\n"
    "  float *C = (float *)p.out + blockIdx.z * p.batch_c;\n"
    "  float acc = 0.f;\n"
    "  for (int q = 0; q < p.k; ++q)\n"
    "    acc += A[FERRY_A_ROW ? (long long)i * p.lda + q : i + (long long)q * p.lda] *\n"
    "           B[FERRY_B_ROW ? (long long)q * p.ldb + j : q + (long long)j * p.ldb];\n"
    "  long long o = FERRY_OUT_ROW ? (long long)i * p.ldc + j : i + (long long)j * p.ldc;\n"
    "  C[o] = p.alpha * acc + (p.beta != 0.f ? p.beta * C[o] : 0.f);\n"
    "}\n";

static void registered_kernel(void) {
  ferry_op_desc d;
  ferry_op_desc_init(&d);
  d.info.name = "byo_naive_f32";
  d.info.instruction = "simt.naive";
  d.info.tile_m = d.info.tile_n = 16;
  d.info.threads = 256;
  d.info.a_types = d.info.b_types = d.info.out_types = FERRY_SCALAR_BIT(FERRY_SCALAR_F32);
  d.source = byo_source;
  d.entry = "byo_naive";
  const ferry_op *op = NULL;
  REQUIRE_OK(ferry_op_register(&d, &op));
  for (int majors = 0; majors < 8; majors += 7) {
    mat a, b, out;
    mat_make(&a, FERRY_SCALAR_F32, majors & 1, 2, 129, 65, 0);
    mat_make(&b, FERRY_SCALAR_F32, majors & 1, 2, 65, 127, 0);
    mat_make(&out, FERRY_SCALAR_F32, majors & 1, 2, 129, 127, 0);
    mat_random(&a);
    mat_random(&b);
    mat_poison(&out);
    ferry_gemm_args args;
    REQUIRE_OK(ferry_gemm_args_init(&args, &a.t, &b.t, &out.t, FERRY_SCALAR_F32));
    const ferry_op *ops[32];
    size_t n = 0;
    REQUIRE_OK(ferry_ops_find(&args, 0, NULL, NULL, ops, 32, &n));
    int listed = 0;
    for (size_t i = 0; i < n && i < 32; i++) listed |= ops[i] == op;
    EXPECT(listed, "the registered operator is not found for its own arguments");
    ferry_artifact *art = NULL;
    REQUIRE_OK(ferry_op_compile(op, &args, &art));
    REQUIRE_OK(ferry_op_run(op, &args, stream, art, 0));
    REQUIRE_CU(ferry__drv.cuStreamSynchronize(stream));
    mat_download(&out);
    verdict v = check(&a, &b, &out, NULL, 1, 0, 1);
    EXPECT(v.nan_at < 0 && v.rel <= 1e-5, "registered kernel (%s): rel err %.3g", majors ? "CCC" : "RRR", v.rel);
    printf("registered kernel byo_naive_f32 %s 129×127×65 l=2: rel err %.2e\n", majors ? "CCC" : "RRR", v.rel);
    ferry_artifact_release(art);
    mat_free(&a), mat_free(&b), mat_free(&out);
  }
}

/* ---- the suite (test_list_ops_gpu.h) ------------------------------------------------------------------------ */

int ops_gpu_quick, ops_gpu_sanitize, ops_gpu_simulate;

int ops_gpu_option(int argc, char **argv, int i) {
  if (!strcmp(argv[i], "--quick")) return ops_gpu_quick = 1;
  if (!strcmp(argv[i], "--sanitize")) return ops_gpu_sanitize = 1;
  if (!strcmp(argv[i], "--simulate")) return ops_gpu_simulate = 1;
  return 0;
}

/* --fault-case SPEC [--simulate]: one fault case in a process of its own, which the fault matrix spawns. */
int ops_gpu_main_hook(int argc, char **argv) {
  const char *fault_case = NULL;
  int simulate = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--fault-case") && i + 1 < argc) fault_case = argv[++i];
    else if (!strcmp(argv[i], "--simulate")) simulate = 1;
  }
  return fault_case ? ops_faults_main(fault_case, simulate) : -1;
}

/* The device, its primary context (current for the whole test) and a stream; skips without a GPU. */
static void open_device(void) {
  if (ops_gpu_simulate) SKIP("needs a GPU (--simulate runs only every_failing_runtime_call_is_clean)");
  ferry_status st = ferry_init();
  if (st == FERRY_NO_DRIVER || st == FERRY_NO_DEVICE) SKIP_NO_GPU("no GPU: %s", ferry_last_error_message());
  REQUIRE_OK(st);
  REQUIRE_OK(ferry_device_resolve(-1, &dev));
  REQUIRE_OK(ferry__ctx_enter(dev));
  REQUIRE_CU(ferry__drv.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  ferry_device_info info;
  REQUIRE_OK(ferry_device_info_get(dev, &info));
  int sm = 0;
  REQUIRE_OK(ferry_target_sm(dev, &sm));
  printf("device cuda:%d %s sm_%d, driver %d; NVRTC from the toolkit\n", dev, info.name, sm, info.driver_version);
}

/* Releases what open_device took and fails the test when a check failed. */
static void close_device(void) {
  printf("%d checks, %d failed\n", checks, failures);
  REQUIRE_CU(ferry__drv.cuStreamDestroy(stream));
  ferry_ops_clear_memo();
  ferry__ctx_leave();
  if (failures) exit(1);
}

TEST(every_design_matches_the_float64_reference) {
  open_device();
  printf("%s\n", ops_gpu_sanitize ? "sanitize (one size per design)" : ops_gpu_quick ? "quick (no 4096³)" : "full");
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  correctness_matrix(ops_gpu_quick, ops_gpu_sanitize);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  ferry_cache_stats cs;
  ferry_cache_stats_get(&cs);
  printf("\n%-34s %6s %6s %12s\n", "operator", "runs", "fails", "worst err");
  for (int i = 0; i < n_tallies; i++)
    printf("%-34s %6d %6d %12.2e\n", ferry_op_info_get(tallies[i].op)->name, tallies[i].runs, tallies[i].fails,
           tallies[i].worst);
  printf("NVRTC compiles %llu in %.1f s, disk cache hits %llu; %.1f s in all\n", (unsigned long long)cs.compiles,
         cs.compile_seconds, (unsigned long long)cs.disk_hits,
         (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9);
  close_device();
}

TEST(graphs_capture_replay_and_update_in_place) {
  open_device();
  graphs();
  close_device();
}

TEST(registered_kernel_runs_end_to_end) {
  open_device();
  registered_kernel();
  close_device();
}

TEST(every_failing_runtime_call_is_clean) {
  if (!ops_gpu_simulate) {
    ferry_status st = ferry_init();
    if (st == FERRY_NO_DRIVER || st == FERRY_NO_DEVICE)
      SKIP_NO_GPU("no GPU: %s (--simulate runs this test through the simulated driver)", ferry_last_error_message());
  }
  if (ops_faults_main(NULL, ops_gpu_simulate) != 0) exit(1);
}
