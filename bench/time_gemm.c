/* time_gemm.c — device time of every tensor-core GEMM design at one shape (`build/ferry_time_gemm`, default 4096³
 * bf16, row-major A, B and out, fp32 accumulation: `ferry bench latency`'s case; --shape M N K for others, such as an
 * LLM decode step, 16 × 8192 × 8192), beside cuBLAS on the same operands, and each design's output checked against
 * cuBLAS's (‖ours − cuBLAS‖ / ‖cuBLAS‖, NaN-poisoned output). --int8 (int8 into exact int32, against cublasGemmEx)
 * and --fp8 (e4m3 with per-tensor scales into bf16, against cuBLASLt, which is what torch._scaled_mm runs) time the
 * 8-bit designs, with B column-major as they require.
 * Unlike the benchmark's table it lists every instruction kind, wgmma included (registered by default;
 * FERRY_WGMMA=0 leaves it out), and takes the median of several timed repeats. Each repeat: 3 warm-up launches,
 * then `launches` launches between two events, rotating over distinct operand sets so that the inputs are not all in
 * L2. Exit status 1 when a design's output disagrees with cuBLAS beyond 1e-2 (bf16) / 5e-3 (fp16).
 */
#include "common.h"
#include "cublas.h" /* the benchmarks' dlopen wrapper, not the toolkit's header */
#include "ops.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { SETS = 3, MAX_REPEATS = 32 };
static CUstream stream;
static int m_, n_, k_, type_, launches_ = 20, repeats_ = 5; /* out is m×n, A m×k, B k×n; type_: the operands' */
static int out_type_;             /* the output's: type_ for fp16/bf16, int32 for int8, bf16 for FP8 */
static size_t in_bytes_, out_bytes_; /* bytes per element of the operands and of the output */
static int b_col_; /* B column-major: a weight matrix stored n×k, as torch.nn.functional.linear reads it */
static int epilogues_; /* --epilogues: time ferry's first design with each fused epilogue beside its plain GEMM */
static CUdeviceptr a_[SETS], b_[SETS], c_[SETS];
static ferry_gemm_args args_[SETS];
static bench_cublas cb_;
static bench_cublaslt lt_;        /* FP8: cuBLASLt's matmul, prepared once */
static CUdeviceptr lt_workspace_, scales_; /* FP8: cuBLASLt's workspace; scale_a and scale_b, one float each */
enum { SCALE_B_OFFSET = 256 };
static int have_cublas_;

static float half_to_float(uint16_t h, int type) {
  uint32_t x;
  if (type == FERRY_SCALAR_BF16) {
    x = (uint32_t)h << 16;
  } else {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (e == 0) {
      float f = ldexpf((float)man, -24);
      return sign ? -f : f;
    }
    x = e == 31 ? sign | 0x7f800000u | (man << 13) : sign | ((e + 112) << 23) | (man << 13);
  }
  float f;
  memcpy(&f, &x, 4);
  return f;
}

static uint16_t float_to_half(float f, int type) { /* operands only: values in [-1, 1), round to nearest even */
  uint32_t x;
  memcpy(&x, &f, 4);
  if (type == FERRY_SCALAR_BF16) return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
  uint32_t sign = (x >> 16) & 0x8000u, e = (x >> 23) & 0xffu, man = x & 0x7fffffu;
  if (e < 103) return (uint16_t)sign; /* below fp16's subnormals */
  if (e < 113) {                      /* fp16 subnormal */
    uint32_t shift = 126 - e, m = man | 0x800000u, h = m >> shift, rem = m & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1))) h++;
    return (uint16_t)(sign | h);
  }
  uint32_t h = ((e - 112) << 10) | (man >> 13), rem = man & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++;
  return (uint16_t)(sign | h);
}

static int launch_cublas_16bit(int set);

static ferry_dtype dtype_of(int scalar) {
  switch (scalar) {
  case FERRY_SCALAR_F16: return (ferry_dtype){FERRY_DTYPE_FLOAT, 16, 1};
  case FERRY_SCALAR_I8: return (ferry_dtype){FERRY_DTYPE_INT, 8, 1};
  case FERRY_SCALAR_I32: return (ferry_dtype){FERRY_DTYPE_INT, 32, 1};
  case FERRY_SCALAR_E4M3: return (ferry_dtype){10, 8, 1}; /* DLPack's float8_e4m3fn */
  default: return (ferry_dtype){FERRY_DTYPE_BFLOAT, 16, 1};
  }
}

/* `count` random operand elements of type_: uniform in [-1, 1) for fp16/bf16, any int8, or e4m3 values of magnitude
 * below 4 (exponent field 0 to 8: finite, and sums that bf16 holds well). */
static void fill_operand(void *host, size_t count, uint64_t *rng) {
  for (size_t i = 0; i < count; i++) {
    *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
    const uint64_t r = *rng >> 11;
    if (type_ == FERRY_SCALAR_I8) ((uint8_t *)host)[i] = (uint8_t)(r >> 20);
    else if (type_ == FERRY_SCALAR_E4M3)
      ((uint8_t *)host)[i] = (uint8_t)((r & 0x80u) | ((r >> 8) % 9) << 3 | ((r >> 16) & 7u));
    else ((uint16_t *)host)[i] = float_to_half((float)((double)r / 9007199254740992.0 * 2.0 - 1.0), type_);
  }
}

/* One reference GEMM on operand set `set`: 0, or cuBLAS's status. */
static int try_cublas(int set) {
  int rc;
  if (type_ == FERRY_SCALAR_E4M3) { /* cuBLASLt's A is B (k×n column-major), its B is A (row-major m×k) */
    rc = bench_cublaslt_run(&lt_, (const void *)(uintptr_t)b_[set], (const void *)(uintptr_t)a_[set],
                            (void *)(uintptr_t)c_[set], (void *)(uintptr_t)lt_workspace_, stream);
  } else if (type_ == FERRY_SCALAR_I8) { /* B column-major, as the 8-bit designs take it: the "TN" int8 GEMM */
    const int32_t one = 1, zero = 0;
    rc = cb_.gemm_ex(cb_.handle, 1, 0, n_, m_, k_, &one, (const void *)(uintptr_t)b_[set], BENCH_CUDA_R_8I, k_,
                     (const void *)(uintptr_t)a_[set], BENCH_CUDA_R_8I, k_, &zero, (void *)(uintptr_t)c_[set],
                     BENCH_CUDA_R_32I, n_, BENCH_CUBLAS_COMPUTE_32I, BENCH_CUBLAS_GEMM_DEFAULT);
  } else {
    rc = launch_cublas_16bit(set);
  }
  return rc;
}

/* A timed reference launch: it ran once already (the reference output), so a failure now is fatal. */
static void launch_cublas(int set) {
  int rc = try_cublas(set);
  if (rc != 0) {
    printf("FATAL the cuBLAS%s GEMM failed with status %d\n", type_ == FERRY_SCALAR_E4M3 ? "Lt" : "", rc);
    exit(2);
  }
}

static int launch_cublas_16bit(int set) {
  float one = 1.0f, zero = 0.0f;
  int dt = type_ == FERRY_SCALAR_F16 ? BENCH_CUDA_R_16F : BENCH_CUDA_R_16BF;
  /* row-major C = A·B is column-major Cᵀ (n×m) = Bᵀ (n×k) · Aᵀ (k×m) */
  /* column-major B (n rows of k in memory) is Bᵀ's column-major n×k transposed: op T, leading dimension k */
  return cb_.gemm_ex(cb_.handle, b_col_, 0, n_, m_, k_, &one, (const void *)(uintptr_t)b_[set], dt, b_col_ ? k_ : n_,
                     (const void *)(uintptr_t)a_[set], dt, k_, &zero, (void *)(uintptr_t)c_[set], dt, n_,
                     BENCH_CUBLAS_COMPUTE_32F, BENCH_CUBLAS_GEMM_DEFAULT);
}

static void launch(const ferry_op *op, ferry_artifact *art, int set) {
  if (!op) launch_cublas(set);
  else BENCH_F(ferry_op_run(op, &args_[set], stream, art, FERRY_RUN_ASSUME_SUPPORTED));
}

static int cmp_double(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return a < b ? -1 : a > b;
}

/* Median over the repeats of the device µs per launch (op NULL: cuBLAS); spread = max/min - 1. */
static double time_us(const ferry_op *op, ferry_artifact *art, double *spread) {
  double us[MAX_REPEATS];
  CUevent e0, e1;
  BENCH_CU(ferry__drv.cuEventCreate(&e0, CU_EVENT_DEFAULT));
  BENCH_CU(ferry__drv.cuEventCreate(&e1, CU_EVENT_DEFAULT));
  for (int r = 0; r < repeats_; r++) {
    for (int i = 0; i < 3; i++) launch(op, art, i % SETS);
    BENCH_CU(ferry__drv.cuEventRecord(e0, stream));
    for (int i = 0; i < launches_; i++) launch(op, art, i % SETS);
    BENCH_CU(ferry__drv.cuEventRecord(e1, stream));
    BENCH_CU(ferry__drv.cuEventSynchronize(e1));
    float ms = 0;
    BENCH_CU(ferry__drv.cuEventElapsedTime(&ms, e0, e1));
    us[r] = ms * 1e3 / launches_;
  }
  BENCH_CU(ferry__drv.cuEventDestroy(e0));
  BENCH_CU(ferry__drv.cuEventDestroy(e1));
  qsort(us, (size_t)repeats_, sizeof us[0], cmp_double);
  *spread = us[repeats_ - 1] / us[0] - 1.0;
  return us[repeats_ / 2];
}

/* ‖out − ref‖ / ‖ref‖ over set 0's output (NaN when an element is NaN: unwritten, or wrong); for int32 outputs
 * the share of elements that differ (the sums are exact: any difference is an error). */
static double compare(const void *ref_bytes, void *out_bytes) {
  size_t count = (size_t)m_ * n_;
  BENCH_CU(ferry__drv.cuMemcpyDtoH(out_bytes, c_[0], count * out_bytes_));
  if (out_type_ == FERRY_SCALAR_I32) {
    const int32_t *ref = ref_bytes, *out = out_bytes;
    size_t differ = 0;
    for (size_t i = 0; i < count; i++) differ += ref[i] != out[i];
    return (double)differ / (double)count;
  }
  const uint16_t *ref = ref_bytes, *out = out_bytes;
  double num = 0, den = 0;
  for (size_t i = 0; i < count; i++) {
    double r = half_to_float(ref[i], out_type_), o = half_to_float(out[i], out_type_);
    if (isnan(o)) return NAN;
    num += (o - r) * (o - r);
    den += r * r;
  }
  return sqrt(num / den);
}

/* Ferry's first design with each fused epilogue, its device time against the same design without one (set 0's output
 * is checked for unwritten NaN only: the GPU tests check the values). Returns the number of failures. */
static int time_epilogues(const ferry_op *op, uint16_t *host) {
  static const struct { const char *name; ferry_bias bias; ferry_activation act; } epis[] = {
      {"none", FERRY_BIAS_NONE, FERRY_ACTIVATION_NONE},       {"bias (row)", FERRY_BIAS_ROW, FERRY_ACTIVATION_NONE},
      {"bias (column)", FERRY_BIAS_COL, FERRY_ACTIVATION_NONE}, {"ReLU", FERRY_BIAS_NONE, FERRY_ACTIVATION_RELU},
      {"GELU (tanh)", FERRY_BIAS_NONE, FERRY_ACTIVATION_GELU_TANH}, {"SiLU", FERRY_BIAS_NONE, FERRY_ACTIVATION_SILU},
      {"bias (row) + GELU (tanh)", FERRY_BIAS_ROW, FERRY_ACTIVATION_GELU_TANH}};
  int len = m_ > n_ ? m_ : n_, bad = 0;
  CUdeviceptr bias;
  BENCH_CU(ferry__drv.cuMemAlloc(&bias, (size_t)len * 2));
  for (int i = 0; i < len; i++) host[i] = out_type_ == FERRY_SCALAR_F16 ? 0x3800 : 0x3f00; /* 0.5 */
  BENCH_CU(ferry__drv.cuMemcpyHtoD(bias, host, (size_t)len * 2));
  ferry_dtype dt = out_type_ == FERRY_SCALAR_F16 ? (ferry_dtype){FERRY_DTYPE_FLOAT, 16, 1}
                                                 : (ferry_dtype){FERRY_DTYPE_BFLOAT, 16, 1};
  int dev = args_[0].problem.device;
  printf("\n%s with a fused epilogue: out = activation(A·B + bias), median of %d repeats of %d launches\n",
         ferry_op_info_get(op)->name, repeats_, launches_);
  printf("%-28s %10s %8s %10s\n", "epilogue", "µs", "spread", "× none");
  double none_us = NAN;
  for (size_t e = 0; e < sizeof epis / sizeof epis[0]; e++) {
    int64_t shape[1] = {epis[e].bias == FERRY_BIAS_COL ? m_ : n_};
    ferry_tensor tb = {(void *)(uintptr_t)bias, {FERRY_DEVICE_CUDA, dev}, 1, dt, shape, NULL, 0};
    for (int s = 0; s < SETS; s++)
      BENCH_F(ferry_gemm_args_set_epilogue(&args_[s], epis[e].bias ? &tb : NULL, epis[e].bias, epis[e].act));
    ferry_artifact *art = NULL;
    BENCH_F(ferry_op_compile(op, &args_[0], &art));
    memset(host, 0xff, (size_t)m_ * n_ * 2); /* NaN: every element must be written */
    BENCH_CU(ferry__drv.cuMemcpyHtoD(c_[0], host, (size_t)m_ * n_ * 2));
    BENCH_CU(ferry__drv.cuStreamSynchronize(NULL));
    launch(op, art, 0);
    BENCH_CU(ferry__drv.cuStreamSynchronize(stream));
    uint16_t probe[2];
    BENCH_CU(ferry__drv.cuMemcpyDtoH(probe, c_[0] + ((size_t)m_ * n_ - 1) * 2, 2));
    BENCH_CU(ferry__drv.cuMemcpyDtoH(probe + 1, c_[0], 2));
    int unwritten = probe[0] == 0xffff || probe[1] == 0xffff;
    double spread = 0, us = time_us(op, art, &spread);
    if (e == 0) none_us = us;
    printf("%-28s %10.1f %7.1f%% %10.3f%s\n", epis[e].name, us, spread * 100, us / none_us,
           unwritten ? "  FAIL: output not written" : "");
    bad += unwritten;
    ferry_artifact_release(art);
  }
  for (int s = 0; s < SETS; s++)
    BENCH_F(ferry_gemm_args_set_epilogue(&args_[s], NULL, FERRY_BIAS_NONE, FERRY_ACTIVATION_NONE));
  BENCH_CU(ferry__drv.cuMemFree(bias));
  return bad;
}

static const char usage[] =
    "usage: ferry_time_gemm [--size N | --shape M N K] [--fp16 | --int8 | --fp8] [--b-col] [--epilogues]\n"
    "                       [--launches L] [--repeats R]\n"
    "Device time of every tensor-core GEMM design at N³ (default 4096), or at out M×N = A M×K · B K×N\n"
    "(an LLM decode step: --shape 16 8192 8192), bf16 (or fp16), row-major (--b-col: B column-major, a\n"
    "weight stored N×K as torch's linear reads it), fp32 accumulation, beside cuBLAS, and each design's\n"
    "output against cuBLAS's. --int8: int8 operands into an exact int32 output, against cublasGemmEx;\n"
    "--fp8: e4m3 operands with per-tensor scales into bf16, against cuBLASLt (both with B column-major,\n"
    "K a multiple of 16). --epilogues: then ferry's first design with each fused epilogue (bias row or\n"
    "column, ReLU, GELU-tanh, SiLU) against itself without one (not with --int8: an int32 output takes\n"
    "none). FERRY_WGMMA=0 leaves the wgmma designs out, FERRY_EXPERIMENTAL_DESIGNS=1 adds those off by default.\n"
    "Defaults: --launches 20 --repeats 5. Exit status: 0 done (or no GPU here), 1 a design disagrees with\n"
    "cuBLAS or an output was not written, 2 a bad command line.\n";

int main(int argc, char **argv) {
  m_ = n_ = k_ = 4096;
  type_ = FERRY_SCALAR_BF16;
  for (int i = 1; i < argc; i++) {
    /* Whole integers that fit an int (bench_parse_long exits 2 naming the flag; atoi took "4096x" and "1e3" and
     * wrapped 5000000000); the ranges are checked below. */
    if (!strcmp(argv[i], "--size") && i + 1 < argc)
      m_ = n_ = k_ = (int)bench_parse_long("--size", argv[++i], 0, INT_MAX);
    else if (!strcmp(argv[i], "--shape") && i + 3 < argc) {
      m_ = (int)bench_parse_long("--shape M", argv[++i], 0, INT_MAX);
      n_ = (int)bench_parse_long("--shape N", argv[++i], 0, INT_MAX);
      k_ = (int)bench_parse_long("--shape K", argv[++i], 0, INT_MAX);
    } else if (!strcmp(argv[i], "--launches") && i + 1 < argc)
      launches_ = (int)bench_parse_long("--launches", argv[++i], 0, INT_MAX);
    else if (!strcmp(argv[i], "--repeats") && i + 1 < argc)
      repeats_ = (int)bench_parse_long("--repeats", argv[++i], 0, INT_MAX);
    else if (!strcmp(argv[i], "--fp16") || !strcmp(argv[i], "--int8") || !strcmp(argv[i], "--fp8")) {
      if (type_ != FERRY_SCALAR_BF16) {
        fprintf(stderr, "ferry_time_gemm: one of --fp16, --int8, --fp8 at most\n%s", usage);
        return 2;
      }
      type_ = !strcmp(argv[i], "--fp16") ? FERRY_SCALAR_F16 : !strcmp(argv[i], "--int8") ? FERRY_SCALAR_I8
                                                                                          : FERRY_SCALAR_E4M3;
    }
    else if (!strcmp(argv[i], "--b-col")) b_col_ = 1;
    else if (!strcmp(argv[i], "--epilogues")) epilogues_ = 1;
    else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      fputs(usage, stdout);
      return 0;
    } else {
      fprintf(stderr, "ferry_time_gemm: unknown or incomplete argument '%s'\n%s", argv[i], usage);
      return 2;
    }
  }
  if (m_ < 1 || n_ < 16 || k_ < 16 || launches_ < 1 || repeats_ < 1 || repeats_ > MAX_REPEATS) {
    fprintf(stderr, "ferry_time_gemm: bad --size or --shape (M >= 1, N and K >= 16), --launches or --repeats (1 to "
            "%d)\n", MAX_REPEATS);
    return 2;
  }
  const int narrow = type_ == FERRY_SCALAR_I8 || type_ == FERRY_SCALAR_E4M3;
  if (narrow && (k_ % 16 || (epilogues_ && type_ == FERRY_SCALAR_I8))) {
    fprintf(stderr, "ferry_time_gemm: %s\n", k_ % 16 ? "8-bit operands need K a multiple of 16"
                                                     : "--epilogues does not go with --int8 (int32 output)");
    return 2;
  }
  if (narrow) b_col_ = 1; /* what the 8-bit instructions read: k contiguous in both operands */
  out_type_ = type_ == FERRY_SCALAR_I8 ? FERRY_SCALAR_I32 : type_ == FERRY_SCALAR_E4M3 ? FERRY_SCALAR_BF16 : type_;
  in_bytes_ = narrow ? 1 : 2;
  out_bytes_ = out_type_ == FERRY_SCALAR_I32 ? 4 : 2;
  ferry_status st = ferry_init();
  if (st != FERRY_OK) { /* as every ferry program: without a GPU it says so and is done */
    printf("ferry_time_gemm: no GPU here (%s: %s)\n", ferry_status_name(st), ferry_last_error_message());
    return 0;
  }
  int dev = 0, sm = 0;
  BENCH_F(ferry_device_resolve(-1, &dev));
  BENCH_F(ferry__ctx_enter(dev));
  BENCH_CU(ferry__drv.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  BENCH_F(ferry_target_sm(dev, &sm));
  char why[256];
  have_cublas_ = bench_cublas_open(&cb_, why, sizeof why) == 0;
  if (have_cublas_) cb_.set_stream(cb_.handle, stream);
  else printf("no cuBLAS (%s): times only, no reference\n", why);

  size_t a_bytes = (size_t)m_ * k_ * in_bytes_, b_bytes = (size_t)k_ * n_ * in_bytes_;
  size_t bytes = (size_t)m_ * n_ * out_bytes_, host_bytes = a_bytes > b_bytes ? a_bytes : b_bytes;
  /* host: operands, and the epilogues' NaN sentinel and bias (16-bit outputs) */
  uint16_t *host = malloc(host_bytes > bytes ? host_bytes : bytes);
  void *ref = malloc(bytes), *out = malloc(bytes);
  if (!host || !ref || !out) {
    printf("ferry_time_gemm: out of host memory for %d×%d×%d\n", m_, n_, k_);
    return 2;
  }
  uint64_t rng = 0x9e3779b97f4a7c15ull;
  int64_t a_shape[2] = {m_, k_}, b_shape[2] = {k_, n_}, c_shape[2] = {m_, n_}, b_strides[2] = {1, k_};
  const ferry_dtype in_dt = dtype_of(type_), out_dt = dtype_of(out_type_);
  ferry_tensor scale_a = {0}, scale_b = {0};
  int64_t one_shape[1] = {1};
  if (type_ == FERRY_SCALAR_E4M3) { /* per-tensor scales on the device, as torch._scaled_mm takes them */
    /* A product of 2: a design ignoring the scales disagrees. Each scale aligned as an allocation of its own
     * would be, as torch._scaled_mm's are: a scale 4 bytes into an allocation is not what cuBLASLt is used with. */
    const float host_scales[2] = {0.5f, 4.0f};
    BENCH_CU(ferry__drv.cuMemAlloc(&scales_, SCALE_B_OFFSET + sizeof(float)));
    BENCH_CU(ferry__drv.cuMemcpyHtoD(scales_, &host_scales[0], sizeof(float)));
    BENCH_CU(ferry__drv.cuMemcpyHtoD(scales_ + SCALE_B_OFFSET, &host_scales[1], sizeof(float)));
    const ferry_dtype f32 = {FERRY_DTYPE_FLOAT, 32, 1};
    scale_a = (ferry_tensor){(void *)(uintptr_t)scales_, {FERRY_DEVICE_CUDA, dev}, 1, f32, one_shape, NULL, 0};
    scale_b = (ferry_tensor){(void *)(uintptr_t)(scales_ + SCALE_B_OFFSET), {FERRY_DEVICE_CUDA, dev}, 1, f32,
                             one_shape, NULL, 0};
  }
  for (int s = 0; s < SETS; s++) {
    BENCH_CU(ferry__drv.cuMemAlloc(&a_[s], a_bytes));
    BENCH_CU(ferry__drv.cuMemAlloc(&b_[s], b_bytes));
    BENCH_CU(ferry__drv.cuMemAlloc(&c_[s], bytes));
    for (int which = 0; which < 2; which++) { /* random, A and B different: never zeros */
      size_t n_bytes = which ? b_bytes : a_bytes;
      fill_operand(host, n_bytes / in_bytes_, &rng);
      BENCH_CU(ferry__drv.cuMemcpyHtoD(which ? b_[s] : a_[s], host, n_bytes));
    }
    BENCH_CU(ferry__drv.cuStreamSynchronize(NULL)); /* pageable uploads may land after return: done before use */
    ferry_tensor ta = {(void *)(uintptr_t)a_[s], {FERRY_DEVICE_CUDA, dev}, 2, in_dt, a_shape, NULL, 0};
    ferry_tensor tb = {(void *)(uintptr_t)b_[s], {FERRY_DEVICE_CUDA, dev}, 2, in_dt, b_shape,
                       b_col_ ? b_strides : NULL, 0};
    ferry_tensor tc = {(void *)(uintptr_t)c_[s], {FERRY_DEVICE_CUDA, dev}, 2, out_dt, c_shape, NULL, 0};
    BENCH_F(ferry_gemm_args_init(&args_[s], &ta, &tb, &tc,
                                 type_ == FERRY_SCALAR_I8 ? FERRY_SCALAR_I32 : FERRY_SCALAR_F32));
    if (type_ == FERRY_SCALAR_E4M3) BENCH_F(ferry_gemm_args_set_scales(&args_[s], &scale_a, &scale_b));
  }
  if (have_cublas_ && type_ == FERRY_SCALAR_E4M3) { /* cuBLASLt's A is our B: its scale is scale_b */
    const size_t workspace = 32u << 20;
    BENCH_CU(ferry__drv.cuMemAlloc(&lt_workspace_, workspace));
    const void *lt_scale_a = (const void *)(uintptr_t)(scales_ + SCALE_B_OFFSET); /* its A is our B */
    if (bench_cublaslt_fp8_open(&lt_, m_, n_, k_, BENCH_CUDA_R_8F_E4M3, BENCH_CUDA_R_8F_E4M3, BENCH_CUDA_R_16BF,
                                lt_scale_a, (const void *)(uintptr_t)scales_, workspace, why, sizeof why) != 0) {
      printf("no cuBLASLt FP8 GEMM (%s): times only, no reference\n", why);
      have_cublas_ = 0;
    }
  }

  const double flops = 2.0 * m_ * (double)n_ * k_;
  double cublas_us = NAN, spread = 0;
  int refused = have_cublas_ ? try_cublas(0) : 0;
  if (refused) { /* e.g. cuBLAS's int8 GEMM for an n it has no kernel for */
    printf("cuBLAS%s refused this GEMM (status %d): times only, no reference\n",
           type_ == FERRY_SCALAR_E4M3 ? "Lt" : "", refused);
    have_cublas_ = 0;
  }
  if (have_cublas_) {
    BENCH_CU(ferry__drv.cuStreamSynchronize(stream));
    BENCH_CU(ferry__drv.cuMemcpyDtoH(ref, c_[0], bytes));
    cublas_us = time_us(NULL, NULL, &spread);
  }
  const char *what = type_ == FERRY_SCALAR_I8     ? "int8 into int32 (int32 accumulation)"
                     : type_ == FERRY_SCALAR_E4M3 ? "e4m3 with scales 0.5 and 4 into bf16 (fp32 accumulation)"
                     : type_ == FERRY_SCALAR_F16  ? "fp16 (fp32 accumulation)"
                                                  : "bf16 (fp32 accumulation)";
  printf("device sm_%d, %d×%d×%d (M×N×K) %s, row-major A and out, %s-major B; median of %d repeats of %d "
         "launches\n", sm, m_, n_, k_, what, b_col_ ? "column" : "row", repeats_, launches_);
  printf("%-40s %10s %9s %8s %9s %12s\n", "design", "µs", "TFLOP/s", "spread", "× cuBLAS", "vs cuBLAS");
  if (have_cublas_)
    printf("%-40s %10.1f %9.1f %7.1f%% %9s %12s\n",
           type_ == FERRY_SCALAR_E4M3 ? "cuBLASLt (cublasLtMatmul)" : "cuBLAS (cublasGemmEx)", cublas_us,
           flops / cublas_us * 1e-6, spread * 100, "1.00", "-");

  const ferry_op *ops[32];
  size_t n_ops = 0;
  BENCH_F(ferry_ops_find(&args_[0], 0, NULL, NULL, ops, 32, &n_ops));
  int bad = 0;
  /* int32: no element may differ; FP8: both sides round the same products to bf16 with their own fp32 sums */
  const double bound = type_ == FERRY_SCALAR_I8 ? 0.0 : type_ == FERRY_SCALAR_F16 ? 5e-3 : 1e-2;
  for (size_t i = 0; i < n_ops && i < 32; i++) {
    const ferry_op_info *info = ferry_op_info_get(ops[i]);
    if (strncmp(info->instruction, "mma", 3) && strncmp(info->instruction, "wgmma", 5)) continue;
    ferry_artifact *art = NULL;
    BENCH_F(ferry_op_compile(ops[i], &args_[0], &art));
    memset(out, out_type_ == FERRY_SCALAR_I32 ? 0x80 : 0xff, bytes); /* NaN (int32: 0x80808080): every element
                                                                          must be written */
    BENCH_CU(ferry__drv.cuMemcpyHtoD(c_[0], out, bytes));
    BENCH_CU(ferry__drv.cuStreamSynchronize(NULL)); /* the NaN sentinel lands before the kernel writes */
    launch(ops[i], art, 0);
    BENCH_CU(ferry__drv.cuStreamSynchronize(stream));
    double err = have_cublas_ ? compare(ref, out) : NAN;
    double us = time_us(ops[i], art, &spread);
    int ok = !have_cublas_ || (!isnan(err) && err <= bound);
    bad += !ok;
    char errs[32];
    if (have_cublas_) snprintf(errs, sizeof errs, "%s%.1e", ok ? "" : "FAIL ", err);
    else snprintf(errs, sizeof errs, "-");
    printf("%-40s %10.1f %9.1f %7.1f%% %9.2f %12s\n", info->name, us, flops / us * 1e-6, spread * 100,
           have_cublas_ ? cublas_us / us : NAN, errs);
    ferry_artifact_release(art);
  }
  if (epilogues_ && n_ops > 0) bad += time_epilogues(ops[0], out);
  if (cb_.handle) bench_cublas_close(&cb_);
  bench_cublaslt_close(&lt_);
  if (lt_workspace_) BENCH_CU(ferry__drv.cuMemFree(lt_workspace_));
  if (scales_) BENCH_CU(ferry__drv.cuMemFree(scales_));
  for (int s = 0; s < SETS; s++) {
    BENCH_CU(ferry__drv.cuMemFree(a_[s]));
    BENCH_CU(ferry__drv.cuMemFree(b_[s]));
    BENCH_CU(ferry__drv.cuMemFree(c_[s]));
  }
  free(host), free(ref), free(out);
  printf("%s\n", bad ? "some designs disagree with cuBLAS" : "every design agrees with cuBLAS");
  return bad ? 1 : 0;
}
