/* latency.c — `ferry bench latency`: the host cost of running an operator, the CUTLASS Operator API notebook's
 * experiment in C, with the limit measured beside every figure, and the GEMM kernels' device time
 * against cuBLAS.
 *
 * The notebook's case: M=N=K=128, L=1, fp16 operands and output, fp32 accumulation, a different operand set for
 * every iteration, warm-up then 100 profiled iterations. Host costs are the time of the calling loop divided by
 * its iterations (the launches queue up on the GPU; the stream is synchronised outside the timed loop); the
 * notebook's own figures also include a final synchronisation, so the "e2e" rows do too. The limit is
 * cuLaunchKernel of the same cubin with the same parameters, built in advance.
 *
 * The targets are differences of a few hundred nanoseconds between methods, smaller than what separates two runs
 * of one method minutes apart, so the host rows are measured in pairs: each repeat walks the operand sets in
 * blocks of 10 calls, every method runs each block's sets back to back (in an order rotated from block to block),
 * and a target is checked on the median of the paired per-block differences ("paired delta" column), which the
 * machine's drifts cancel out of. Row values are medians over --repeats repeats. Per-call loops (supports check,
 * argument construction) are timed in integer nanoseconds over the count they ran, and the program stops if a
 * figure changes with the loop's length or contradicts another row: a unit slip would otherwise print a wrong
 * table (docs/results.md, Methodology). Rows and targets:
 *   run, artifact, check bypassed         ≤ limit + 0.3 µs
 *   run, artifact, supports check         ≤ the above + 0.2 µs
 *   run without artifact (memo hit)       ≤ the above + 0.5 µs
 *   20 runs as a graph, replay + sync     ≤ 1.2 × (graph of 20 empty kernels + 20 × the kernel's device time)
 *   first compile (cold cache)            ≤ 200 ms; artifact load from the disk cache ≤ 100 µs
 *   device time 4096³ bf16                ≥ 0.5 × cuBLAS; 128³ fp16 ≤ 1.5 × cuBLAS's time
 */
#include "bench.h"
#include "common.h"
#include "cublas.h"
#include "ops/ops.h"

#include <math.h>
#include <stdarg.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { SETS = 110, N = 128, GRAPH_RUNS = 20, BLOCK = 10, MAX_REPS = 64, MAX_BLOCKS = SETS / BLOCK + 1 };

typedef struct lat_opts {
  int iters, warmup, repeats;
  const char *csv;
} lat_opts;

typedef struct operand_set { CUdeviceptr a, b, out; ferry_gemm_args args; ferry_tensor ta, tb, tout; } operand_set;

static int64_t shape128[2] = {N, N};
static operand_set sets[SETS];
static CUstream stream;
static int dev;

static void usage(void) {
  printf("usage: ferry bench latency [--iters N] [--warmup N] [--repeats N] [--output CSV]\n\n"
         "Host latency of ferry's operator runtime on the CUTLASS notebook's case (128x128x128 fp16, fp32\n"
         "accumulation, distinct operands per iteration), beside raw cuLaunchKernel of the same cubin; 20 runs as a\n"
         "CUDA graph; argument construction; first compile and cache load; GEMM device time at 128^3 fp16 and\n"
         "4096^3 bf16 against cuBLAS. Host targets are checked on paired differences (methods back to back on the\n"
         "same operands). Defaults: --iters 100 --warmup 10 --repeats 7 --output ferry-latency.csv.\n"
         "Without a GPU it says so and exits 0; a measurement that contradicts itself stops it with status 1.\n");
}

static double median_of(double *v, int n) { return bench_median(v, n); }

/* ---- the measured methods ---------------------------------------------------------------------------------- */

typedef enum method {
  M_RAW, M_ASSUME, M_CHECKED, M_MEMO_CHECKED, M_MEMO_ASSUME, M_COUNT
} method;

static const ferry_op *op;
static ferry_artifact *art;
static ferry__launch raw[SETS]; /* prebuilt launches for the limit */

static int64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* One call of method m on operand set s; nothing waits for the GPU. */
static void call_method(method m, int s) {
  switch (m) {
  case M_RAW:
    BENCH_CU(ferry__drv.cuLaunchKernel(raw[s].fn, raw[s].grid_x, 1, raw[s].grid_z, raw[s].threads, 1, 1, raw[s].smem,
                                       stream, raw[s].param_ptrs, NULL));
    break;
  case M_ASSUME: BENCH_F(ferry_op_run(op, &sets[s].args, stream, art, FERRY_RUN_ASSUME_SUPPORTED)); break;
  case M_CHECKED: BENCH_F(ferry_op_run(op, &sets[s].args, stream, art, 0)); break;
  case M_MEMO_CHECKED: BENCH_F(ferry_op_run(op, &sets[s].args, stream, NULL, 0)); break;
  default: BENCH_F(ferry_op_run(op, &sets[s].args, stream, NULL, FERRY_RUN_ASSUME_SUPPORTED)); break;
  }
}

/* Host µs per call of every method in every block: block_us[r][b][m]. Repeat r first warms every method up on the
 * warm-up sets, then for each block position b (sets warmup + b*BLOCK ...) runs every method on that block's sets
 * and waits for the GPU, so the queue stays shallow. The order starts at method (r + b) % M_COUNT and runs forward
 * or backward by the parity of r + b: each pair of methods runs in both orders, so what one leaves warm for the
 * next (the same operands, the same code) favours neither. */
static double block_us[MAX_REPS][MAX_BLOCKS][M_COUNT];
static int time_host(int iters, int warmup, int reps) {
  int blocks = (iters + BLOCK - 1) / BLOCK;
  for (int r = 0; r < reps; r++) {
    for (int m = 0; m < M_COUNT; m++)
      for (int i = 0; i < warmup; i++) call_method((method)m, i);
    BENCH_CU(ferry__drv.cuStreamSynchronize(stream));
    for (int b = 0; b < blocks; b++) {
      int first = warmup + b * BLOCK, calls = iters - b * BLOCK < BLOCK ? iters - b * BLOCK : BLOCK;
      for (int k = 0; k < M_COUNT; k++) {
        int step = (r + b) % 2 ? M_COUNT - 1 : 1;
        method m = (method)((r + b + k * step) % M_COUNT);
        int64_t t0 = now_ns();
        for (int i = 0; i < calls; i++) call_method(m, first + i);
        block_us[r][b][m] = (double)(now_ns() - t0) / 1e3 / calls;
      }
      BENCH_CU(ferry__drv.cuStreamSynchronize(stream));
    }
  }
  return blocks;
}

/* Method m's host µs per call in repeat r (its blocks' calls over all of them). */
static double host_per_call(int r, int blocks, int iters, method m) {
  double total = 0;
  for (int b = 0; b < blocks; b++)
    total += block_us[r][b][m] * (iters - b * BLOCK < BLOCK ? iters - b * BLOCK : BLOCK);
  return total / iters;
}

/* The median over every (repeat, block) of method a's time per call minus method b's, measured back to back. */
static double paired_delta(int reps, int blocks, method a, method b) {
  static double d[MAX_REPS * MAX_BLOCKS];
  int n = 0;
  for (int r = 0; r < reps; r++)
    for (int k = 0; k < blocks; k++) d[n++] = block_us[r][k][a] - block_us[r][k][b];
  return bench_median(d, n);
}

/* The notebook's way, for the e2e rows: a loop of `iters` calls, then one synchronisation; µs per iteration. */
static double time_e2e(method m, int iters, int warmup) {
  for (int i = 0; i < warmup; i++) call_method(m, i);
  BENCH_CU(ferry__drv.cuStreamSynchronize(stream));
  int64_t t0 = now_ns();
  for (int i = 0; i < iters; i++) call_method(m, (warmup + i) % SETS);
  BENCH_CU(ferry__drv.cuStreamSynchronize(stream));
  return (double)(now_ns() - t0) / 1e3 / iters;
}

/* Nanoseconds per call of `expr` (which may use the call's index i) over `calls` calls, counting in `good` the
 * calls that returned FERRY_OK: the divisor is the number of calls the loop ran, and the clock reads integer
 * nanoseconds, so there is no unit to convert. */
#define NS_PER_CALL(calls, good, expr)                                                                       \
  __extension__({                                                                                            \
    long n_ = (calls);                                                                                       \
    int64_t t0_ = now_ns();                                                                                  \
    for (long i = 0; i < n_; i++) (good) += (expr) == FERRY_OK;                                              \
    (double)(now_ns() - t0_) / (double)n_;                                                                   \
  })

/* The cache homes the program made: /tmp/ferry-bench-latency-<pid> and its three -cold<r> siblings. */
static char cold_home[256];
static void remove_cache_homes(void) {
  char cmd[1200];
  if (!cold_home[0]) return;
  snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'-cold0 '%s'-cold1 '%s'-cold2", cold_home, cold_home, cold_home, cold_home);
  if (system(cmd) != 0) fprintf(stderr, "ferry: could not remove %s\n", cold_home);
}

/* Stops the program when a measurement contradicts itself, rather than print a wrong table. */
static void self_check(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void self_check(int ok, const char *fmt, ...) {
  if (ok) return;
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "ferry: bench latency: self-check failed: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  remove_cache_homes();
  exit(BENCH_EXIT_FAILURE);
}

/* A per-call figure must not depend on how many calls were timed (a total taken for a per-call figure grows with
 * the count), and must be below `ceiling_ns`, a bound no correct figure comes near. */
static void check_per_call(const char *what, double ns_long, long calls_long, double ns_short, long calls_short,
                           double ceiling_ns) {
  self_check(ns_long < 3 * ns_short && ns_short < 3 * ns_long,
             "%s measured %.2f ns per call over %ld calls but %.2f ns over %ld", what, ns_long, calls_long, ns_short,
             calls_short);
  self_check(ns_long < ceiling_ns, "%s measured %.1f ns per call, past the plausible %.0f ns", what, ns_long,
             ceiling_ns);
}

/* Device time of `launches` back-to-back launches of fn (ms each), from events. */
typedef void (*launch_fn)(int i, void *ctx);
static double device_ms(launch_fn launch, void *ctx, int launches) {
  CUevent e0, e1;
  BENCH_CU(ferry__drv.cuEventCreate(&e0, CU_EVENT_DEFAULT));
  BENCH_CU(ferry__drv.cuEventCreate(&e1, CU_EVENT_DEFAULT));
  for (int i = 0; i < 3; i++) launch(i, ctx);
  BENCH_CU(ferry__drv.cuEventRecord(e0, stream));
  for (int i = 0; i < launches; i++) launch(i, ctx);
  BENCH_CU(ferry__drv.cuEventRecord(e1, stream));
  BENCH_CU(ferry__drv.cuEventSynchronize(e1));
  float ms = 0;
  BENCH_CU(ferry__drv.cuEventElapsedTime(&ms, e0, e1));
  BENCH_CU(ferry__drv.cuEventDestroy(e0));
  BENCH_CU(ferry__drv.cuEventDestroy(e1));
  return ms / launches;
}

/* ---- GEMM device time vs cuBLAS ---------------------------------------------------------------------------- */

typedef struct gemm_ctx {
  const ferry_op *op;
  ferry_artifact *art;
  ferry_gemm_args *args;
  int nargs;
  bench_cublas *cb;
  int m, n, k, type; /* cuBLAS view */
  CUdeviceptr *a, *b, *c;
} gemm_ctx;

static void launch_ferry(int i, void *p) {
  gemm_ctx *g = p;
  BENCH_F(ferry_op_run(g->op, &g->args[i % g->nargs], stream, g->art, FERRY_RUN_ASSUME_SUPPORTED));
}
static void launch_cublas(int i, void *p) {
  gemm_ctx *g = p;
  float one = 1.0f, zero = 0.0f;
  int j = i % g->nargs;
  int dt = g->type == FERRY_SCALAR_F16 ? BENCH_CUDA_R_16F : BENCH_CUDA_R_16BF;
  /* row-major C = A·B is column-major Cᵀ = Bᵀ·Aᵀ */
  int rc = g->cb->gemm_ex(g->cb->handle, 0, 0, g->n, g->m, g->k, &one, (const void *)(uintptr_t)g->b[j], dt, g->n,
                          (const void *)(uintptr_t)g->a[j], dt, g->k, &zero, (void *)(uintptr_t)g->c[j], dt, g->n,
                          BENCH_CUBLAS_COMPUTE_32F, BENCH_CUBLAS_GEMM_DEFAULT);
  if (rc != 0) {
    fprintf(stderr, "ferry: cublasGemmEx failed with status %d\n", rc);
    exit(1);
  }
}

typedef struct device_row { char name[96]; double ferry_us, cublas_us; } device_row;

/* Times every tensor-core operator that supports an m×m×m GEMM of `type` (row-major, `type` out), and cuBLAS. */
static int gemm_device_rows(int m, int type, int sets_n, int launches, bench_cublas *cb, device_row *rows,
                            int max_rows) {
  size_t bytes = (size_t)m * m * 2;
  CUdeviceptr a[4], b[4], c[4];
  ferry_gemm_args args[4];
  int64_t shape[2] = {m, m};
  ferry_dtype dt = type == FERRY_SCALAR_F16 ? (ferry_dtype){FERRY_DTYPE_FLOAT, 16, 1}
                                            : (ferry_dtype){FERRY_DTYPE_BFLOAT, 16, 1};
  uint16_t *host = malloc(bytes);
  bench_rng rng = {(uint64_t)m * 7919u};
  for (int s = 0; s < sets_n; s++) {
    BENCH_CU(ferry__drv.cuMemAlloc(&a[s], bytes));
    BENCH_CU(ferry__drv.cuMemAlloc(&b[s], bytes));
    BENCH_CU(ferry__drv.cuMemAlloc(&c[s], bytes));
    /* random values in [-1, 1): 0x3c00-ish halves / bf16 from the top bits of floats (never zeros, which would hide a wrong load) */
    for (size_t i = 0; i < (size_t)m * m; i++) {
      float f = (float)(bench_rng_uniform(&rng) * 2.0 - 1.0);
      uint32_t x;
      memcpy(&x, &f, 4);
      host[i] = type == FERRY_SCALAR_BF16 ? (uint16_t)(x >> 16)
                                   : (uint16_t)(((x >> 16) & 0x8000u) | (((x >> 23) & 0xffu) > 112 ? ((((x >> 23) & 0xffu) - 112) << 10) | ((x >> 13) & 0x3ffu) : 0));
    }
    BENCH_CU(ferry__drv.cuMemcpyHtoD(a[s], host, bytes));
    BENCH_CU(ferry__drv.cuMemcpyHtoD(b[s], host, bytes));
    BENCH_CU(ferry__drv.cuStreamSynchronize(NULL)); /* pageable uploads may land after return: done before use */
    ferry_tensor ta = {(void *)(uintptr_t)a[s], {FERRY_DEVICE_CUDA, dev}, 2, dt, shape, NULL, 0};
    ferry_tensor tb = {(void *)(uintptr_t)b[s], {FERRY_DEVICE_CUDA, dev}, 2, dt, shape, NULL, 0};
    ferry_tensor tc = {(void *)(uintptr_t)c[s], {FERRY_DEVICE_CUDA, dev}, 2, dt, shape, NULL, 0};
    BENCH_F(ferry_gemm_args_init(&args[s], &ta, &tb, &tc, FERRY_SCALAR_F32));
  }
  free(host);
  gemm_ctx g = {NULL, NULL, args, sets_n, cb, m, m, m, type, a, b, c};
  double cublas_ms = cb ? device_ms(launch_cublas, &g, launches) : NAN;
  const ferry_op *ops[32];
  size_t n = 0;
  BENCH_F(ferry_ops_find(&args[0], 0, NULL, NULL, ops, 32, &n));
  int count = 0;
  for (size_t i = 0; i < n && i < 32 && count < max_rows; i++) {
    if (strcmp(ferry_op_info_get(ops[i])->instruction, "mma.sync.m16n8k16") != 0) continue;
    g.op = ops[i];
    BENCH_F(ferry_op_compile(ops[i], &args[0], &g.art));
    double ms = device_ms(launch_ferry, &g, launches);
    ferry_artifact_release(g.art);
    snprintf(rows[count].name, sizeof rows[count].name, "%s", ferry_op_info_get(ops[i])->name);
    rows[count].ferry_us = ms * 1e3;
    rows[count].cublas_us = cublas_ms * 1e3;
    count++;
  }
  for (int s = 0; s < sets_n; s++) {
    BENCH_CU(ferry__drv.cuMemFree(a[s]));
    BENCH_CU(ferry__drv.cuMemFree(b[s]));
    BENCH_CU(ferry__drv.cuMemFree(c[s]));
  }
  return count;
}

/* ---- graphs ------------------------------------------------------------------------------------------------ */

static ferry__launch empty_launch;
static void launch_gemm_set(int i, void *p) {
  (void)p;
  BENCH_F(ferry_op_run(op, &sets[i % SETS].args, stream, art, FERRY_RUN_ASSUME_SUPPORTED));
}

/* ---- the program ------------------------------------------------------------------------------------------- */

/* A row of the table; `delta` is the paired difference from the reference method (NAN where there is none). */
typedef struct row {
  const char *name;
  double ferry, reference, delta, notebook;
  const char *unit, *target;
  int ok;
} row;
static row table[40];
static int n_rows;
static void add_paired_row(const char *name, double ferry, double reference, double delta, double notebook,
                           const char *unit, const char *target, int ok) {
  table[n_rows++] = (row){name, ferry, reference, delta, notebook, unit, target, ok};
}
static void add_row(const char *name, double ferry, double reference, double notebook, const char *unit,
                    const char *target, int ok) {
  add_paired_row(name, ferry, reference, NAN, notebook, unit, target, ok);
}

/* The option's value, or a usage error when it has none. */
static const char *val(int argc, char **argv, int *i) { return bench_value("bench latency", argc, argv, i); }

/* Everything the program measures, for the table. Host figures in µs unless named _ns. */
typedef struct figures {
  int reps;
  /* compile and load (medians) */
  double cold_ms, disk_us, import_us, digest_us;
  /* launches: medians per method of the host time per call and of the notebook's e2e time, and paired deltas */
  double host[M_COUNT], e2e[M_COUNT];
  double d_assume, d_checked, d_memo, d_memo_assume;
  /* per-call loops */
  double supports_ns, args_init_ns;
  /* 20 runs */
  double eager, graph, empty_graph, kernel;
  /* device time against cuBLAS */
  device_row small[8], large[8];
  int n_small, n_large;
} figures;

/* Parses the options into `o` (a usage error exits with its message): -1 to go on, 0 after --help. */
static int parse_options(int argc, char **argv, lat_opts *o) {
  *o = (lat_opts){100, 10, 7, "ferry-latency.csv"};
  for (int i = 0; i < argc; i++) {
    const char *f = argv[i];
    if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
      usage();
      return 0;
    } else if (!strcmp(f, "--iters")) o->iters = (int)bench_parse_long(f, val(argc, argv, &i), 1, SETS);
    else if (!strcmp(f, "--warmup")) o->warmup = (int)bench_parse_long(f, val(argc, argv, &i), 0, SETS - 1);
    else if (!strcmp(f, "--repeats")) o->repeats = (int)bench_parse_long(f, val(argc, argv, &i), 1, INT_MAX);
    else if (!strcmp(f, "--output")) o->csv = val(argc, argv, &i);
    else bench_usage_error("bench latency", "unknown argument '%s'", f);
  }
  if (o->iters + o->warmup > SETS)
    bench_usage_error("bench latency", "--iters + --warmup must be at most %d (distinct operand sets)", SETS);
  bench_check_output("--output", o->csv);
  return -1;
}

/* The operands: SETS distinct sets of fp16 128×128 A, B and out, with their arguments. */
static void make_operand_sets(void) {
  ferry_dtype f16 = {FERRY_DTYPE_FLOAT, 16, 1};
  uint16_t *host = malloc(N * N * 2);
  bench_rng rng = {42};
  for (int s = 0; s < SETS; s++) {
    operand_set *x = &sets[s];
    BENCH_CU(ferry__drv.cuMemAlloc(&x->a, N * N * 2));
    BENCH_CU(ferry__drv.cuMemAlloc(&x->b, N * N * 2));
    BENCH_CU(ferry__drv.cuMemAlloc(&x->out, N * N * 2));
    for (int i = 0; i < N * N; i++) host[i] = (uint16_t)(0x3000u + bench_rng_below(&rng, 0x0c00u)) | (i & 1 ? 0x8000u : 0);
    BENCH_CU(ferry__drv.cuMemcpyHtoD(x->a, host, N * N * 2));
    BENCH_CU(ferry__drv.cuMemcpyHtoD(x->b, host, N * N * 2));
    BENCH_CU(ferry__drv.cuStreamSynchronize(NULL)); /* pageable uploads may land after return: done before use */
    x->ta = (ferry_tensor){(void *)(uintptr_t)x->a, {FERRY_DEVICE_CUDA, dev}, 2, f16, shape128, NULL, 0};
    x->tb = (ferry_tensor){(void *)(uintptr_t)x->b, {FERRY_DEVICE_CUDA, dev}, 2, f16, shape128, NULL, 0};
    x->tout = (ferry_tensor){(void *)(uintptr_t)x->out, {FERRY_DEVICE_CUDA, dev}, 2, f16, shape128, NULL, 0};
    BENCH_F(ferry_gemm_args_init(&x->args, &x->ta, &x->tb, &x->tout, FERRY_SCALAR_F32));
  }
  free(host);
}

/* The first compile, cold (a fresh cache home each time, so it is NVRTC's time), then loads from the disk cache and
 * imports of an exported file, medians; leaves `art` compiled and memoised for the launch rows. */
static void measure_compile_and_load(figures *f) {
  double cold[5], disk[15], import_[15], digest_us[15];
  char path[320];
  for (int r = 0; r < 3; r++) {
    char home[300];
    snprintf(home, sizeof home, "%s-cold%d", cold_home, r);
    setenv("XDG_CACHE_HOME", home, 1);
    ferry_ops_clear_memo();
    double t0 = bench_now_ms();
    BENCH_F(ferry_op_compile(op, &sets[0].args, &art));
    cold[r] = bench_now_ms() - t0;
    ferry_artifact_release(art);
  }
  setenv("XDG_CACHE_HOME", cold_home, 1);
  ferry_ops_clear_memo();
  BENCH_F(ferry_op_compile(op, &sets[0].args, &art)); /* fills this home's disk cache */
  snprintf(path, sizeof path, "%s/exported.ferry", cold_home);
  BENCH_F(ferry_artifact_export(art, path));
  ferry_artifact_release(art);
  for (int r = 0; r < 15; r++) {
    ferry_ops_clear_memo();
    double t0 = bench_now_ms();
    BENCH_F(ferry_op_compile(op, &sets[0].args, &art)); /* memo empty: read, verify, cuLibraryLoadData */
    disk[r] = (bench_now_ms() - t0) * 1e3;
    ferry_artifact_release(art);
    ferry_ops_clear_memo();
    t0 = bench_now_ms();
    BENCH_F(ferry_artifact_import(path, &art));
    import_[r] = (bench_now_ms() - t0) * 1e3;
    ferry_artifact_release(art);
    /* The load above finds the operator's source digest made; a process's first lookup of it makes it. */
    uint8_t digest[32];
    int64_t d0 = now_ns();
    ferry__op_body_digest(op, digest);
    digest_us[r] = (double)(now_ns() - d0) / 1e3;
  }
  ferry_ops_clear_memo();
  BENCH_F(ferry_op_compile(op, &sets[0].args, &art)); /* the artifact the launch rows use (memoised too) */
  f->cold_ms = median_of(cold, 3);
  f->disk_us = median_of(disk, 15);
  f->import_us = median_of(import_, 15);
  f->digest_us = median_of(digest_us, 15);
}

/* The host rows: blocks of every method back to back on the same operand sets (time_host), then the notebook's
 * loop-plus-synchronisation for the e2e rows, the methods' order rotated from repeat to repeat. */
static void measure_launches(const lat_opts *o, figures *f) {
  for (int s = 0; s < SETS; s++) BENCH_F(ferry__launch_prepare(art, &sets[s].args, &raw[s]));
  for (int s = 0; s < SETS; s++) raw[s].param_ptrs[0] = raw[s].params;
  int reps = f->reps;
  int blocks = time_host(o->iters, o->warmup, reps);
  double host_us[M_COUNT][MAX_REPS], e2e_us[M_COUNT][MAX_REPS];
  const method e2e_methods[3] = {M_RAW, M_ASSUME, M_CHECKED};
  for (int r = 0; r < reps; r++) {
    for (int m = 0; m < M_COUNT; m++) host_us[m][r] = host_per_call(r, blocks, o->iters, (method)m);
    for (int k = 0; k < 3; k++) {
      method m = e2e_methods[(r + k) % 3];
      e2e_us[m][r] = time_e2e(m, o->iters, o->warmup);
    }
  }
  for (int m = 0; m < M_COUNT; m++) {
    f->host[m] = median_of(host_us[m], reps);
    f->e2e[m] = (m == M_RAW || m == M_ASSUME || m == M_CHECKED) ? median_of(e2e_us[m], reps) : NAN;
  }
  f->d_assume = paired_delta(reps, blocks, M_ASSUME, M_RAW);
  f->d_checked = paired_delta(reps, blocks, M_CHECKED, M_ASSUME);
  f->d_memo = paired_delta(reps, blocks, M_MEMO_CHECKED, M_CHECKED);
  f->d_memo_assume = paired_delta(reps, blocks, M_MEMO_ASSUME, M_RAW);
}

/* The supports check and argument construction, ns per call; each also timed over a tenth of the calls, which
 * must give the same figure. */
static void measure_per_call_loops(figures *f) {
  enum { CALLS = 100000 };
  int reps = f->reps;
  double sup_ns[MAX_REPS], mk_ns[MAX_REPS];
  long good = 0;
  ferry_gemm_args tmp;
#define SUPPORTS_CALL ferry_op_supports(op, &sets[i % SETS].args, NULL, 0)
#define INIT_CALL                                                                                            \
  ferry_gemm_args_init(&tmp, &sets[i % SETS].ta, &sets[i % SETS].tb, &sets[i % SETS].tout, FERRY_SCALAR_F32)
  for (int r = 0; r < reps; r++) {
    sup_ns[r] = NS_PER_CALL(CALLS, good, SUPPORTS_CALL);
    mk_ns[r] = NS_PER_CALL(CALLS, good, INIT_CALL);
  }
  double sup_short = NS_PER_CALL(CALLS / 10, good, SUPPORTS_CALL);
  double mk_short = NS_PER_CALL(CALLS / 10, good, INIT_CALL);
#undef SUPPORTS_CALL
#undef INIT_CALL
  self_check(good == (long)reps * 2 * CALLS + 2 * (CALLS / 10), "%ld of the per-call loops' calls succeeded, "
             "expected %ld", good, (long)reps * 2 * CALLS + 2 * (CALLS / 10));
  f->supports_ns = median_of(sup_ns, reps);
  f->args_init_ns = median_of(mk_ns, reps);
  check_per_call("the supports check", f->supports_ns, CALLS, sup_short, CALLS / 10, 10000.0);
  check_per_call("argument construction", f->args_init_ns, CALLS, mk_short, CALLS / 10, 10000.0);
  /* The checked run makes that very check, so the check alone cannot cost more than the whole run. */
  self_check(f->supports_ns <= f->host[M_CHECKED] * 1e3, "the supports check alone (%.1f ns) costs more than a "
             "checked run (%.1f ns)", f->supports_ns, f->host[M_CHECKED] * 1e3);
}

/* 20 runs: eager + sync, as a ferry graph replay + sync, and the reference graph of 20 empty kernels. */
static void measure_graphs(const lat_opts *o, figures *f) {
  int reps = f->reps;
  ferry_op_desc d;
  ferry_op_desc_init(&d);
  d.info.name = "bench_empty_kernel";
  d.info.threads = 32;
  d.info.tile_m = d.info.tile_n = 1 << 20;
  d.source = "extern \"C\" __global__ void bench_empty_kernel(ferry_gemm_params p) {}\n";
  d.entry = "bench_empty_kernel";
  const ferry_op *empty_op = NULL;
  BENCH_F(ferry_op_register(&d, &empty_op));
  ferry_artifact *empty_art = NULL;
  BENCH_F(ferry_op_compile(empty_op, &sets[0].args, &empty_art));
  BENCH_F(ferry__launch_prepare(empty_art, &sets[0].args, &empty_launch));
  empty_launch.param_ptrs[0] = empty_launch.params;
  ferry_graph *g = NULL;
  BENCH_F(ferry_graph_begin(stream, &g));
  for (int i = 0; i < GRAPH_RUNS; i++)
    BENCH_F(ferry_graph_run(g, op, &sets[i].args, art, FERRY_RUN_ASSUME_SUPPORTED, NULL));
  BENCH_F(ferry_graph_end(g));
  CUgraph eg;
  CUgraphExec ee;
  BENCH_CU(ferry__drv.cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  for (int i = 0; i < GRAPH_RUNS; i++)
    BENCH_CU(ferry__drv.cuLaunchKernel(empty_launch.fn, 1, 1, 1, 32, 1, 1, 0, stream, empty_launch.param_ptrs, NULL));
  BENCH_CU(ferry__drv.cuStreamEndCapture(stream, &eg));
  BENCH_CU(ferry__drv.cuGraphInstantiateWithFlags(&ee, eg, 0));
  double eager[64], graph[64], empty[64];
  for (int r = 0; r < reps; r++) {
    for (int w = 0; w < 2; w++) { /* warm: first replays upload the graphs */
      BENCH_F(ferry_graph_replay(g, NULL));
      BENCH_CU(ferry__drv.cuGraphLaunch(ee, stream));
    }
    BENCH_CU(ferry__drv.cuStreamSynchronize(stream));
    double acc_e = 0, acc_g = 0, acc_0 = 0;
    for (int it = 0; it < o->iters; it++) {
      double t0 = bench_now_ms();
      for (int i = 0; i < GRAPH_RUNS; i++)
        BENCH_F(ferry_op_run(op, &sets[(it + i) % SETS].args, stream, art, FERRY_RUN_ASSUME_SUPPORTED));
      BENCH_CU(ferry__drv.cuStreamSynchronize(stream));
      double t1 = bench_now_ms();
      BENCH_F(ferry_graph_replay(g, NULL));
      BENCH_CU(ferry__drv.cuStreamSynchronize(stream));
      double t2 = bench_now_ms();
      BENCH_CU(ferry__drv.cuGraphLaunch(ee, stream));
      BENCH_CU(ferry__drv.cuStreamSynchronize(stream));
      double t3 = bench_now_ms();
      acc_e += t1 - t0, acc_g += t2 - t1, acc_0 += t3 - t2;
    }
    eager[r] = acc_e * 1e3 / o->iters, graph[r] = acc_g * 1e3 / o->iters, empty[r] = acc_0 * 1e3 / o->iters;
  }
  f->kernel = device_ms(launch_gemm_set, NULL, 200) * 1e3;
  f->eager = median_of(eager, reps);
  f->graph = median_of(graph, reps);
  f->empty_graph = median_of(empty, reps);
  ferry_graph_destroy(g);
  BENCH_CU(ferry__drv.cuGraphExecDestroy(ee));
  BENCH_CU(ferry__drv.cuGraphDestroy(eg));
  ferry_artifact_release(empty_art);
}

/* GEMM device time of every mma.sync design beside cuBLAS's, at 128³ fp16 and 4096³ bf16. */
static void measure_device_time(figures *f) {
  bench_cublas cb;
  char why[256];
  int have_cublas = bench_cublas_open(&cb, why, sizeof why) == 0;
  if (have_cublas) cb.set_stream(cb.handle, stream);
  else fprintf(stderr, "ferry: bench latency: %s; device rows without cuBLAS\n", why);
  f->n_small = gemm_device_rows(128, FERRY_SCALAR_F16, 4, 500, have_cublas ? &cb : NULL, f->small, 8);
  f->n_large = gemm_device_rows(4096, FERRY_SCALAR_BF16, 2, 20, have_cublas ? &cb : NULL, f->large, 8);
  if (have_cublas) bench_cublas_close(&cb);
}

/* The table's rows, each with its target where it has one, from the figures. */
static void build_table(const figures *f) {
  double limit = f->host[M_RAW];
  add_paired_row("run: artifact, check bypassed (host/call)", f->host[M_ASSUME], limit, f->d_assume, 5.984, "us",
                 "<= limit + 0.3", f->d_assume <= 0.3);
  add_paired_row("run: artifact, supports check (host/call)", f->host[M_CHECKED], f->host[M_ASSUME], f->d_checked,
                 24.18, "us", "<= bypassed + 0.2", f->d_checked <= 0.2);
  add_paired_row("run: no artifact, memo hit (host/call)", f->host[M_MEMO_CHECKED], f->host[M_CHECKED], f->d_memo,
                 1.474e6, "us", "<= checked + 0.5", f->d_memo <= 0.5);
  add_paired_row("run: no artifact, check bypassed (host/call)", f->host[M_MEMO_ASSUME], limit, f->d_memo_assume, NAN,
                 "us", "", 1);
  add_row("run: artifact, bypassed, e2e/iter (notebook's way)", f->e2e[M_ASSUME], f->e2e[M_RAW], 6.518, "us", "", 1);
  add_row("run: artifact, checked, e2e/iter (notebook's way)", f->e2e[M_CHECKED], f->e2e[M_RAW], 24.18, "us", "", 1);
  add_row("supports check alone", f->supports_ns, NAN, 17.7e3, "ns", "<= 200", f->supports_ns <= 200);
  add_row("argument construction (ferry_gemm_args_init)", f->args_init_ns, NAN, 159.5e3, "ns", "", 1);
  add_row("20 runs eager + sync", f->eager, NAN, 749.6, "us", "", 1);
  double graph_ref = f->empty_graph + GRAPH_RUNS * f->kernel;
  add_row("20 runs as a graph, replay + sync", f->graph, graph_ref, 197.2, "us", "<= 1.2 x (empty graph + 20 kernels)",
          f->graph <= 1.2 * graph_ref);
  add_row("  graph of 20 empty kernels, replay + sync", f->empty_graph, NAN, NAN, "us", "", 1);
  add_row("  GEMM 128^3 kernel device time", f->kernel, NAN, NAN, "us", "", 1);
  add_row("first compile, cold cache (NVRTC)", f->cold_ms, NAN, 1469.0, "ms", "<= 200", f->cold_ms <= 200);
  add_row("artifact load from the disk cache", f->disk_us, NAN, NAN, "us", "<= 100", f->disk_us <= 100);
  add_row("  + once per operator and process: its source digest", f->digest_us, NAN, NAN, "us", "", 1);
  add_row("artifact import from an exported file", f->import_us, NAN, NAN, "us", "", 1);
  double best_small = 1e30, best_large = 1e30;
  for (int i = 0; i < f->n_small; i++) best_small = fmin(best_small, f->small[i].ferry_us);
  for (int i = 0; i < f->n_large; i++) best_large = fmin(best_large, f->large[i].ferry_us);
  for (int i = 0; i < f->n_small; i++) {
    static char lines[8][160];
    snprintf(lines[i], sizeof lines[i], "  128^3 fp16 %.100s", f->small[i].name);
    add_row(lines[i], f->small[i].ferry_us, f->small[i].cublas_us, NAN, "us", "", 1);
  }
  add_row("GEMM 128^3 fp16 device time, best ferry vs cuBLAS", best_small, f->n_small ? f->small[0].cublas_us : NAN,
          NAN, "us", "<= 1.5 x cuBLAS", f->n_small && best_small <= 1.5 * f->small[0].cublas_us);
  for (int i = 0; i < f->n_large; i++) {
    static char lines[8][160];
    snprintf(lines[i], sizeof lines[i], "  4096^3 bf16 %.100s", f->large[i].name);
    add_row(lines[i], f->large[i].ferry_us, f->large[i].cublas_us, NAN, "us", "", 1);
  }
  add_row("GEMM 4096^3 bf16 device time, best ferry vs cuBLAS", best_large, f->n_large ? f->large[0].cublas_us : NAN,
          NAN, "us", "ferry <= 2 x cuBLAS (>= 0.5x speed)",
          f->n_large && best_large <= 2.0 * f->large[0].cublas_us);
}

/* The CSV, then the table on stdout. */
static void report(const lat_opts *o, const figures *f, const ferry_device_info *info) {
  FILE *csv = bench_csv_open(o->csv);
  fprintf(csv, "metric,ferry,reference,paired_delta,unit,cutlass_notebook,target,met\n");
  for (int i = 0; i < n_rows; i++)
    fprintf(csv, "\"%s\",%.4f,%.4f,%.4f,%s,%.4g,\"%s\",%d\n", table[i].name, table[i].ferry, table[i].reference,
            table[i].delta, table[i].unit, table[i].notebook, table[i].target, table[i].ok);
  fclose(csv);

  printf("ferry bench latency: %s sm_%d%d, operator %s, %d iterations x %d repeats (medians), CSV in %s\n",
         info->name, info->cc_major, info->cc_minor, ferry_op_info_get(op)->name, o->iters, f->reps, o->csv);
  if (f->n_large) {
    double best_large = 1e30;
    for (int i = 0; i < f->n_large; i++) best_large = fmin(best_large, f->large[i].ferry_us);
    double tflops = 2.0 * 4096.0 * 4096.0 * 4096.0 / (best_large * 1e-6) / 1e12;
    printf("4096^3 bf16: best mma.sync design %.1f TFLOP/s, cuBLAS %.1f TFLOP/s (every design, wgmma's too: "
           "ferry_time_gemm)\n", tflops,
           2.0 * 4096.0 * 4096.0 * 4096.0 / (f->large[0].cublas_us * 1e-6) / 1e12);
  }
  printf("\n%-52s %11s %11s %8s %5s %12s  %s\n", "metric", "ferry", "reference", "delta", "unit", "CUTLASS nb",
         "target");
  for (int i = 0; i < n_rows; i++) {
    char ref[32] = "", delta[32] = "", nb[32] = "";
    if (!isnan(table[i].reference)) snprintf(ref, sizeof ref, "%.3f", table[i].reference);
    if (!isnan(table[i].delta)) snprintf(delta, sizeof delta, "%+.3f", table[i].delta);
    if (!isnan(table[i].notebook)) snprintf(nb, sizeof nb, "%.4g", table[i].notebook);
    printf("%-52s %11.3f %11s %8s %5s %12s  %s%s\n", table[i].name, table[i].ferry, ref, delta, table[i].unit, nb,
           table[i].target, *table[i].target ? (table[i].ok ? "  ok" : "  MISSED") : "");
  }
  printf("(reference: the limit or the row it is compared with; delta: the median of that row's and the reference's\n"
         " per-call times measured back to back on the same operands, which the host targets are checked on;\n"
         " CUTLASS nb: the notebook's published figure in the same unit, Python + CUTLASS DSL on its own machine)\n");
}

static void release_everything(void) {
  ferry_artifact_release(art);
  ferry_ops_clear_memo();
  for (int s = 0; s < SETS; s++) {
    BENCH_CU(ferry__drv.cuMemFree(sets[s].a));
    BENCH_CU(ferry__drv.cuMemFree(sets[s].b));
    BENCH_CU(ferry__drv.cuMemFree(sets[s].out));
  }
  BENCH_CU(ferry__drv.cuStreamDestroy(stream));
  ferry__ctx_leave();
  remove_cache_homes();
}

int bench_latency_main(int argc, char **argv) {
  lat_opts o;
  int rc = parse_options(argc, argv, &o);
  if (rc >= 0) return rc;
  if (bench_no_gpu("ferry bench latency")) return 0;
  BENCH_F(ferry_device_resolve(-1, &dev));
  BENCH_F(ferry__ctx_enter(dev)); /* the primary context stays current, as in a PyTorch thread */
  BENCH_CU(ferry__drv.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  ferry_device_info info;
  BENCH_F(ferry_device_info_get(dev, &info));
  snprintf(cold_home, sizeof cold_home, "/tmp/ferry-bench-latency-%ld", (long)getpid());
  setenv("XDG_CACHE_HOME", cold_home, 1);
  make_operand_sets();
  const ferry_op *found[32];
  size_t n_found = 0;
  BENCH_F(ferry_ops_find(&sets[0].args, 0, NULL, NULL, found, 32, &n_found));
  if (!n_found) {
    fprintf(stderr, "ferry: bench latency: no operator supports the notebook's GEMM here\n");
    return 1;
  }
  op = found[0];

  static figures f; /* large (the device rows): not on the stack */
  f.reps = o.repeats > MAX_REPS ? MAX_REPS : o.repeats;
  measure_compile_and_load(&f);
  measure_launches(&o, &f);
  measure_per_call_loops(&f);
  measure_graphs(&o, &f);
  measure_device_time(&f);
  build_table(&f);
  report(&o, &f, &info);
  release_everything();
  return 0;
}
