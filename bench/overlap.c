/* overlap.c — `ferry bench overlap`: SPDL's transfer/compute overlap experiment (benchmark_transfer_overlap.py),
 * in C, with ferry and the raw primitive side by side, beside a worker that transfers nothing.
 *
 * A persistent background worker thread owns the transfers; the foreground thread owns a compute stream that runs
 * a calibrated 2048² float32 SGEMM (cuBLAS, loaded at run time) for a target duration. Each timed block runs
 * compute-only, and for every method transfer-only, serialized (transfer then compute) and concurrent (both
 * released from one CPU barrier, launch skew recorded), in an order shuffled per block. Source tensors are made
 * ready before timing and every method's output is checked byte for byte before any timing. The summary CSV has
 * SPDL's columns, then the harness floor's (overlap.h); per-block samples go to --samples-output.
 *
 * Methods: "ferry" (ferry_transfer_d2h, blocking, on the worker's cached copy stream, ordered after an event on
 * the worker's default stream as SPDL orders after the caller's current stream), "raw cuMemcpyAsync loop" (the
 * same ordering, then one cuMemcpyAsync per tensor into pre-pinned memory on a dedicated stream, then a stream
 * synchronize: the primitive every library builds on), and "no transfer" (the worker returns at once: the
 * harness floor, whose slowdown in a block is what the hand-offs alone cost that block's foreground).
 */
#include "bench.h"
#include "common.h"
#include "cublas.h"
#include "overlap.h"

#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

/* ---- arguments ------------------------------------------------------------------------------------------- */

static void usage(void) {
  printf(
      "usage: ferry bench overlap [--output CSV] [--samples-output CSV] [--device cuda:N]\n"
      "                           [--total-mib N...] [--num-tensors N...] [--matrix-size N] [--compute-ms MS]\n"
      "                           [--compute-iterations N] [--num-warmup N] [--num-runs N]\n"
      "                           [--bootstrap-resamples N] [--seed N]\n\n"
      "Benchmark overlap between D2H transfer (a background thread) and foreground CUDA compute (SGEMM),\n"
      "for ferry and for the raw per-tensor cuMemcpyAsync loop, in the same run (SPDL's experiment), beside a\n"
      "worker that transfers nothing (the harness floor).\n\n"
      "  --output PATH            summary CSV: SPDL's columns, then the floor's (default: ferry-overlap.csv)\n"
      "  --samples-output PATH    optional per-block CSV\n"
      "  --device cuda:N          CUDA device (default: LOCAL_RANK, else cuda:0)\n"
      "  --total-mib N...         payload sizes in MiB (default: 64)\n"
      "  --num-tensors N...       tensor counts per payload (default: 1 32)\n"
      "  --matrix-size N          square float32 matrix size of the foreground SGEMM (default: 2048)\n"
      "  --compute-ms MS          target duration used to calibrate the foreground compute (default: 8.0)\n"
      "  --compute-iterations N   skip calibration: SGEMMs per sample\n"
      "  --num-warmup N           warm-up blocks per scenario, >= 0 (default: 5)\n"
      "  --num-runs N             paired randomized blocks per scenario, >= 2 (default: 30)\n"
      "  --bootstrap-resamples N  resamples for the 95%% confidence intervals (default: 2000)\n"
      "  --seed N                 randomization seed (default: 0)\n\n"
      "Per method and block: slowdown = concurrent - compute-only (what the foreground loses), floor = the\n"
      "no-transfer worker's slowdown in the same block, excess = slowdown - floor, net transfer = transfer-only -\n"
      "the no-transfer worker's; medians over blocks after SPDL's columns in the CSV and the table.\n"
      "Progress goes to stderr; a compact table is printed last. Without a GPU it says so and exits 0.\n"
      "Under torchrun (WORLD_SIZE > 1; torchrun --no-python) each rank uses the GPU its LOCAL_RANK names, writes\n"
      "its CSVs with .rank<R> before the extension, and rank 0 merges the summaries into --output.\n");
}

static int take_list(int argc, char **argv, int *i, const char *flag, long *out, int cap, long max) {
  int n = 0;
  while (*i + 1 < argc && argv[*i + 1][0] != '-') {
    if (n == cap) bench_usage_error("bench overlap", "%s takes at most %d values", flag, cap);
    out[n++] = bench_parse_long(flag, argv[++*i], 1, max);
  }
  if (n == 0) bench_usage_error("bench overlap", "%s expects at least one positive integer", flag);
  return n;
}

/* The option's value, or a usage error when it has none. */
static const char *val(int argc, char **argv, int *i) { return bench_value("bench overlap", argc, argv, i); }

static void parse(int argc, char **argv, overlap_config *c) {
  memset(c, 0, sizeof *c);
  c->total_mib[0] = 64;
  c->n_total_mib = 1;
  c->num_tensors[0] = 1;
  c->num_tensors[1] = 32;
  c->n_num_tensors = 2;
  c->matrix_size = 2048;
  c->compute_target_ms = 8.0;
  c->num_warmup = 5;
  c->num_runs = 30;
  c->bootstrap_resamples = 2000;
  c->output = "ferry-overlap.csv";
  c->device = -1;
  for (int i = 0; i < argc; i++) {
    const char *f = argv[i];
    if (!strcmp(f, "--help") || !strcmp(f, "-h")) { usage(); exit(0); }
    else if (!strcmp(f, "--total-mib"))
      c->n_total_mib = take_list(argc, argv, &i, f, c->total_mib, OVERLAP_MAX_LIST, BENCH_MAX_MIB);
    else if (!strcmp(f, "--num-tensors"))
      c->n_num_tensors = take_list(argc, argv, &i, f, c->num_tensors, OVERLAP_MAX_LIST, INT_MAX);
    else if (!strcmp(f, "--output")) c->output = val(argc, argv, &i);
    else if (!strcmp(f, "--samples-output")) c->samples_output = val(argc, argv, &i);
    else if (!strcmp(f, "--device")) c->device = bench_parse_device(f, val(argc, argv, &i));
    else if (!strcmp(f, "--matrix-size")) c->matrix_size = bench_parse_long(f, val(argc, argv, &i), 1, 1 << 16);
    else if (!strcmp(f, "--compute-ms")) c->compute_target_ms = bench_parse_positive_double(f, val(argc, argv, &i));
    else if (!strcmp(f, "--compute-iterations")) c->compute_iterations = bench_parse_long(f, val(argc, argv, &i), 1, INT_MAX);
    else if (!strcmp(f, "--num-warmup")) c->num_warmup = bench_parse_long(f, val(argc, argv, &i), 0, INT_MAX);
    else if (!strcmp(f, "--num-runs")) c->num_runs = bench_parse_long(f, val(argc, argv, &i), 2, INT_MAX);
    else if (!strcmp(f, "--bootstrap-resamples")) c->bootstrap_resamples = bench_parse_long(f, val(argc, argv, &i), 1, INT_MAX);
    else if (!strcmp(f, "--seed")) c->seed = bench_parse_long(f, val(argc, argv, &i), LONG_MIN, LONG_MAX);
    else bench_usage_error("bench overlap", "unknown argument '%s'", f);
  }
  for (int i = 0; i < c->n_total_mib; i++)
    for (int j = 0; j < c->n_num_tensors; j++)
      if ((uint64_t)c->num_tensors[j] > (uint64_t)c->total_mib[i] << 20)
        bench_usage_error("bench overlap", "cannot split %ld MiB into %ld nonempty tensors", c->total_mib[i],
                          c->num_tensors[j]);
  bench_check_output("--output", c->output);
  if (c->samples_output) bench_check_output("--samples-output", c->samples_output);
}

/* ---- the foreground compute ------------------------------------------------------------------------------ */

typedef struct compute {
  bench_cublas cb;
  CUstream stream;
  CUdeviceptr left, right, out;
  int n;
  long iterations;
} compute;

static void run_compute(compute *c, long iterations) {
  const float one = 1.0f, zero = 0.0f;
  for (long i = 0; i < iterations; i++) {
    int rc = c->cb.sgemm(c->cb.handle, 0, 0, c->n, c->n, c->n, &one, (const float *)(uintptr_t)c->left, c->n,
                         (const float *)(uintptr_t)c->right, c->n, &zero, (float *)(uintptr_t)c->out, c->n);
    if (rc != 0) {
      fprintf(stderr, "ferry: bench overlap: cublasSgemm_v2 failed with status %d\n", rc);
      exit(1);
    }
  }
  BENCH_CU(ferry__drv.cuStreamSynchronize(c->stream));
}

static double time_compute(compute *c) {
  double t0 = bench_now_ms();
  run_compute(c, c->iterations);
  return bench_now_ms() - t0;
}

/* SPDL's calibration: up to four rounds of three samples, scaling the count to the target by the median. */
static long calibrate(compute *c, double target_ms) {
  long iterations = 1;
  for (int round = 0; round < 4; round++) {
    double s[3];
    for (int k = 0; k < 3; k++) {
      double t0 = bench_now_ms();
      run_compute(c, iterations);
      s[k] = bench_now_ms() - t0;
    }
    double measured = bench_median(s, 3);
    long estimate = lround((double)iterations * target_ms / (measured > 0.001 ? measured : 0.001));
    estimate = estimate < 1 ? 1 : estimate > 100000 ? 100000 : estimate;
    if (estimate == iterations) break;
    iterations = estimate;
  }
  return iterations;
}

static void compute_setup(compute *c, int device, long n, uint64_t seed) {
  char why[256];
  if (bench_cublas_open(&c->cb, why, sizeof why) != 0) {
    fprintf(stderr, "ferry: bench overlap: the foreground compute needs cuBLAS: %s\n", why);
    exit(1);
  }
  BENCH_CU(ferry__drv.cuStreamCreate(&c->stream, CU_STREAM_NON_BLOCKING));
  c->cb.set_stream(c->cb.handle, c->stream);
  c->n = (int)n;
  size_t bytes = (size_t)n * (size_t)n * sizeof(float);
  float *h = malloc(bytes);
  if (!h) { fprintf(stderr, "ferry: bench overlap: out of host memory\n"); exit(1); }
  bench_rng rng = {seed};
  CUdeviceptr *bufs[3] = {&c->left, &c->right, &c->out};
  for (int k = 0; k < 3; k++) BENCH_F(ferry__devmem_alloc(device, bytes, c->stream, bufs[k]));
  for (int k = 0; k < 2; k++) { /* standard normal by Box-Muller, like torch.randn */
    for (size_t i = 0; i < (size_t)n * (size_t)n; i++) {
      double u = bench_rng_uniform(&rng), v = bench_rng_uniform(&rng);
      h[i] = (float)(sqrt(-2.0 * log(u > 1e-300 ? u : 1e-300)) * cos(6.283185307179586 * v));
    }
    BENCH_CU(ferry__drv.cuMemcpyHtoDAsync(*bufs[k], h, bytes, c->stream));
    BENCH_CU(ferry__drv.cuStreamSynchronize(c->stream));
  }
  free(h);
}

static void compute_check_finite(compute *c) {
  size_t count = (size_t)c->n * (size_t)c->n;
  float *h = malloc(count * sizeof *h);
  BENCH_CU(ferry__drv.cuMemcpyAsync((CUdeviceptr)(uintptr_t)h, c->out, count * sizeof *h, c->stream));
  BENCH_CU(ferry__drv.cuStreamSynchronize(c->stream));
  for (size_t i = 0; i < count; i++)
    if (!isfinite(h[i])) {
      fprintf(stderr, "ferry: bench overlap: the foreground matrix multiplication produced non-finite output\n");
      exit(1);
    }
  free(h);
}

/* ---- the background worker ------------------------------------------------------------------------------- */

/* One transfer method: runs a whole synchronous transfer on the calling (worker) thread. `ticket` receives
 * ferry's ticket so the outputs stay alive until the foreground has stopped its clock, as in SPDL's benchmark. */
typedef struct method {
  const char *name;
  void (*transfer)(struct method *m, ferry_transfer **ticket);
  int device;
  bench_batch *batch;
  char *pinned;     /* raw method: destination, pre-pinned */
  CUstream stream;  /* raw method: dedicated copy stream */
} method;

static void transfer_ferry(method *m, ferry_transfer **ticket) {
  ferry_transfer_options o;
  ferry_transfer_options_init(&o);
  o.device = m->device;
  o.flags = FERRY_TRANSFER_BLOCKING;
  BENCH_F(ferry_transfer_d2h(m->batch->t, m->batch->n, &o, ticket));
}

/* The harness floor: the worker's hand-offs and nothing else. */
static void transfer_none(method *m, ferry_transfer **ticket) {
  (void)m;
  *ticket = NULL;
}

static void transfer_raw_loop(method *m, ferry_transfer **ticket) {
  *ticket = NULL;
  BENCH_F(ferry__ctx_enter(m->device));
  CUevent ready;
  BENCH_F(ferry__event_get(m->device, &ready));
  BENCH_CU(ferry__drv.cuEventRecord(ready, CU_STREAM_LEGACY)); /* the worker's current stream, as SPDL orders */
  BENCH_CU(ferry__drv.cuStreamWaitEvent(m->stream, ready, 0));
  ferry__event_put(m->device, ready);
  for (size_t i = 0; i < m->batch->n; i++)
    BENCH_CU(ferry__drv.cuMemcpyAsync((CUdeviceptr)(uintptr_t)(m->pinned + m->batch->offsets[i]),
                                      (CUdeviceptr)(uintptr_t)m->batch->t[i].data, (size_t)m->batch->shapes[i],
                                      m->stream));
  BENCH_CU(ferry__drv.cuStreamSynchronize(m->stream));
  ferry__ctx_leave();
}

/* The worker and the foreground hand work over by spinning on atomics, not by sleeping on a condition variable:
 * a wake-up would be charged to the transfer's overlap (~0.1 ms per block on the H200's host; docs/results.md,
 * Methodology). Both methods share this worker, so the comparison between them is unchanged. */
typedef struct worker {
  pthread_t thread;
  atomic_int state; /* IDLE -> SUBMITTED (foreground) -> DONE (worker) -> IDLE (foreground takes the result) */
  atomic_int quit;
  method *job;
  atomic_int *barrier; /* a two-party spin barrier, or NULL */
  double started_ms;
  ferry_transfer *ticket;
} worker;

enum { W_IDLE, W_SUBMITTED, W_DONE };

static inline void cpu_relax(void) { __builtin_ia32_pause(); }

/* Two parties arrive; each returns once both have. */
static void spin_barrier(atomic_int *arrived) {
  atomic_fetch_add_explicit(arrived, 1, memory_order_acq_rel);
  while (atomic_load_explicit(arrived, memory_order_acquire) < 2) cpu_relax();
}

static void *worker_main(void *arg) {
  worker *w = arg;
  for (;;) {
    while (atomic_load_explicit(&w->state, memory_order_acquire) != W_SUBMITTED) {
      if (atomic_load_explicit(&w->quit, memory_order_relaxed)) return NULL;
      cpu_relax();
    }
    method *m = w->job;
    if (w->barrier) spin_barrier(w->barrier);
    double started = bench_now_ms();
    ferry_transfer *ticket = NULL;
    m->transfer(m, &ticket);
    w->started_ms = started;
    w->ticket = ticket;
    atomic_store_explicit(&w->state, W_DONE, memory_order_release);
  }
}

static void worker_submit(worker *w, method *m, atomic_int *barrier) {
  w->job = m;
  w->barrier = barrier;
  atomic_store_explicit(&w->state, W_SUBMITTED, memory_order_release);
}

/* Waits for the submitted transfer; returns when it started and hands over its ticket. */
static double worker_result(worker *w, ferry_transfer **ticket) {
  while (atomic_load_explicit(&w->state, memory_order_acquire) != W_DONE) cpu_relax();
  *ticket = w->ticket;
  double started = w->started_ms;
  atomic_store_explicit(&w->state, W_IDLE, memory_order_relaxed);
  return started;
}

/* ---- the four schedules ---------------------------------------------------------------------------------- */

static double time_transfer(worker *w, method *m) {
  ferry_transfer *t;
  double t0 = bench_now_ms();
  worker_submit(w, m, NULL);
  (void)worker_result(w, &t);
  double ms = bench_now_ms() - t0;
  ferry_transfer_release(t);
  return ms;
}

static double time_serialized(worker *w, method *m, compute *c) {
  ferry_transfer *t;
  double t0 = bench_now_ms();
  worker_submit(w, m, NULL);
  (void)worker_result(w, &t);
  run_compute(c, c->iterations);
  double ms = bench_now_ms() - t0;
  ferry_transfer_release(t);
  return ms;
}

static double time_concurrent(worker *w, method *m, compute *c, double *skew_ms) {
  atomic_int barrier = 0;
  ferry_transfer *t;
  double t0 = bench_now_ms();
  worker_submit(w, m, &barrier);
  spin_barrier(&barrier);
  double compute_started = bench_now_ms();
  run_compute(c, c->iterations);
  double transfer_started = worker_result(w, &t);
  double ms = bench_now_ms() - t0;
  *skew_ms = fabs(compute_started - transfer_started);
  ferry_transfer_release(t);
  return ms;
}

/* ---- one scenario ---------------------------------------------------------------------------------------- */

enum { N_METHODS = 3, FLOOR = N_METHODS - 1 }; /* the last method is the no-op worker */

/* Runs each transfer method once on the worker and compares its output with the bytes the source was filled with. */
static void validate(worker *w, method *methods, const unsigned char *expected) {
  for (int k = 0; k < FLOOR; k++) {
    method *m = &methods[k];
    ferry_transfer *t;
    worker_submit(w, m, NULL);
    (void)worker_result(w, &t);
    for (size_t i = 0; i < m->batch->n; i++) {
      const void *got = t ? ferry_transfer_outputs(t)[i].data : m->pinned + m->batch->offsets[i];
      if (memcmp(got, expected + m->batch->offsets[i], (size_t)m->batch->shapes[i]) != 0) {
        fprintf(stderr, "ferry: bench overlap: %s produced wrong bytes in tensor %zu; nothing was timed\n", m->name,
                i);
        exit(1);
      }
    }
    ferry_transfer_release(t);
  }
}

static void collect(worker *w, method *methods, compute *c, const overlap_config *cfg, long scenario_seed,
                    overlap_sample *samples[N_METHODS]) {
  for (long k = 0; k < cfg->num_warmup; k++) {
    run_compute(c, c->iterations);
    for (int m = 0; m < N_METHODS; m++) {
      double skew;
      (void)time_transfer(w, &methods[m]);
      (void)time_concurrent(w, &methods[m], c, &skew);
    }
  }
  /* Cases: compute, then (method, transfer|serialized|concurrent) for every method; shuffled per block. */
  enum { N_CASES = 1 + 3 * N_METHODS };
  int order[N_CASES];
  bench_rng rng = {(uint64_t)scenario_seed};
  static const char *schedules[3] = {"transfer", "serialized", "concurrent"};
  for (long trial = 0; trial < cfg->num_runs; trial++) {
    for (int k = 0; k < N_CASES; k++) order[k] = k;
    for (int k = N_CASES - 1; k > 0; k--) { /* Fisher-Yates */
      int j = (int)bench_rng_below(&rng, (uint64_t)k + 1), tmp = order[k];
      order[k] = order[j];
      order[j] = tmp;
    }
    char label[sizeof samples[0][0].schedule_order] = "";
    for (int k = 0; k < N_CASES; k++) {
      size_t used = strlen(label);
      if (order[k] == 0) snprintf(label + used, sizeof label - used, "%scompute", k ? "|" : "");
      else snprintf(label + used, sizeof label - used, "%s%s:%s", k ? "|" : "", methods[(order[k] - 1) / 3].name,
                    schedules[(order[k] - 1) % 3]);
    }
    double compute_only = 0;
    overlap_sample *row[N_METHODS];
    for (int m = 0; m < N_METHODS; m++) {
      row[m] = &samples[m][trial];
      memset(row[m], 0, sizeof *row[m]);
      row[m]->trial = (int)trial;
      snprintf(row[m]->schedule_order, sizeof row[m]->schedule_order, "%s", label);
    }
    for (int k = 0; k < N_CASES; k++) {
      if (order[k] == 0) {
        compute_only = time_compute(c);
        continue;
      }
      int m = (order[k] - 1) / 3, s = (order[k] - 1) % 3;
      if (s == 0) row[m]->transfer_only_ms = time_transfer(w, &methods[m]);
      else if (s == 1) row[m]->serialized_ms = time_serialized(w, &methods[m], c);
      else row[m]->concurrent_ms = time_concurrent(w, &methods[m], c, &row[m]->cpu_launch_skew_ms);
    }
    for (int m = 0; m < N_METHODS; m++) row[m]->compute_only_ms = compute_only;
    fprintf(stderr, "\r  block %ld/%ld", trial + 1, cfg->num_runs);
  }
  fprintf(stderr, "\n");
}

/* ---- the whole run --------------------------------------------------------------------------------------- */

typedef struct table_row {
  uint64_t total_bytes;
  long num_tensors;
  char method[32];
  overlap_summary s;
} table_row;

static void print_row(const table_row *r) {
  printf("  %4llu MiB %5ld  %-22s compute=%7.3f ms  transfer=%7.3f ms  serialized=%7.3f ms  concurrent=%7.3f ms  "
         "speedup=%5.2fx [%5.3f, %5.3f]  overlap=%6.1f%% (bound %5.1f%%)  skew p95=%.3f ms | slowdown=%6.3f ms  "
         "floor=%6.3f ms  excess=%6.3f ms [%6.3f, %6.3f]  net transfer=%7.3f ms\n",
         (unsigned long long)(r->total_bytes >> 20), r->num_tensors, r->method, r->s.compute_median_ms,
         r->s.transfer_median_ms, r->s.serialized_median_ms, r->s.concurrent_median_ms, r->s.speedup_median,
         r->s.speedup_ci_lower, r->s.speedup_ci_upper, r->s.efficiency_median * 100, r->s.overlap_bound_median * 100,
         r->s.cpu_launch_skew_p95_ms, r->s.slowdown_median_ms, r->s.floor_slowdown_median_ms, r->s.excess_median_ms,
         r->s.excess_ci_lower_ms, r->s.excess_ci_upper_ms, r->s.net_transfer_median_ms);
}

/* Rank 0 under torchrun: the ranks' summaries in one file, each row led by its rank. */
static void merge_rank_summaries(const char *output, int world_size) {
  FILE *out = bench_csv_open(output);
  fprintf(out, "rank,");
  overlap_write_summary_header(out);
  for (int k = 0; k < world_size; k++) {
    char path[1024], line[4096];
    FILE *f = fopen(bench_rank_path(output, k, path, sizeof path), "r");
    if (!f || !fgets(line, sizeof line, f)) {
      fprintf(stderr, "ferry: bench overlap: cannot read rank %d's summary %s\n", k, path);
      exit(1);
    }
    while (fgets(line, sizeof line, f)) fprintf(out, "%d,%s", k, line);
    fclose(f);
  }
  fclose(out);
  printf("Merged summary of %d ranks saved to: %s\n", world_size, output);
}

int bench_overlap_main(int argc, char **argv) {
  overlap_config cfg;
  parse(argc, argv, &cfg);
  if (bench_no_gpu("ferry bench overlap")) return 0;
  int device;
  BENCH_F(ferry_device_resolve(cfg.device, &device));
  ferry_device_info info;
  BENCH_F(ferry_device_info_get(device, &info));
  BENCH_F(ferry__ctx_enter(device)); /* the foreground thread works in the primary context throughout */
  printf("D2H transfer / foreground CUDA compute overlap benchmark (C)\nDevice: %s (cuda:%d)\n", info.name, device);
  printf("The raw cuMemcpyAsync loop is the primitive reference; compare overlap within each method.\n");

  compute c;
  compute_setup(&c, device, cfg.matrix_size, (uint64_t)cfg.seed);
  run_compute(&c, 1);
  c.iterations = cfg.compute_iterations ? cfg.compute_iterations : calibrate(&c, cfg.compute_target_ms);
  run_compute(&c, c.iterations);
  compute_check_finite(&c);

  char created[64], capability[16], driver[16];
  time_t now = time(NULL);
  strftime(created, sizeof created, "%Y-%m-%dT%H:%M:%S+00:00", gmtime(&now));
  snprintf(capability, sizeof capability, "%d.%d", info.cc_major, info.cc_minor);
  snprintf(driver, sizeof driver, "%d.%d", info.driver_version / 1000, info.driver_version % 1000 / 10);

  /* Under torchrun each rank writes its own files (out.rankR.csv); rank 0 merges the summaries at the end. */
  bench_ranks ranks = bench_ranks_from_env();
  char out_path[1024], samples_path[1024];
  const char *out_file = ranks.world_size > 1 ? bench_rank_path(cfg.output, ranks.rank, out_path, sizeof out_path)
                                              : cfg.output;
  const char *samples_file = !cfg.samples_output ? NULL
                             : ranks.world_size > 1
                                 ? bench_rank_path(cfg.samples_output, ranks.rank, samples_path, sizeof samples_path)
                                 : cfg.samples_output;
  FILE *out = bench_csv_open(out_file);
  overlap_write_summary_header(out);
  FILE *raw_out = samples_file ? bench_csv_open(samples_file) : NULL;
  if (raw_out) overlap_write_samples_header(raw_out);

  /* Scenarios in an order shuffled by --seed, as SPDL's benchmark does. */
  int n_scen = cfg.n_total_mib * cfg.n_num_tensors;
  long (*scen)[2] = calloc((size_t)n_scen, sizeof *scen);
  for (int i = 0; i < cfg.n_total_mib; i++)
    for (int j = 0; j < cfg.n_num_tensors; j++) {
      scen[i * cfg.n_num_tensors + j][0] = cfg.total_mib[i];
      scen[i * cfg.n_num_tensors + j][1] = cfg.num_tensors[j];
    }
  bench_rng order_rng = {(uint64_t)cfg.seed};
  for (int k = n_scen - 1; k > 0; k--) {
    int j = (int)bench_rng_below(&order_rng, (uint64_t)k + 1);
    long a = scen[k][0], b = scen[k][1];
    scen[k][0] = scen[j][0], scen[k][1] = scen[j][1];
    scen[j][0] = a, scen[j][1] = b;
  }

  worker w;
  memset(&w, 0, sizeof w);
  atomic_init(&w.state, W_IDLE);
  atomic_init(&w.quit, 0);
  if (pthread_create(&w.thread, NULL, worker_main, &w) != 0) {
    fprintf(stderr, "ferry: bench overlap: cannot start the worker thread\n");
    return 1;
  }
  table_row *table = calloc((size_t)n_scen * N_METHODS, sizeof *table);
  int rows = 0;
  for (int si = 0; si < n_scen; si++) {
    uint64_t total = (uint64_t)scen[si][0] << 20;
    long n = scen[si][1];
    fprintf(stderr, "\n%llu MiB in %ld tensor(s), %ld compute iteration(s)\n", (unsigned long long)(total >> 20), n,
            c.iterations);
    /* Sources: random bytes, ready before timing; the host copy is the expected output. */
    unsigned char *expected = malloc(total);
    bench_rng fill = {(uint64_t)cfg.seed * 7919u + (uint64_t)si};
    for (uint64_t i = 0; i < total; i += 8) {
      uint64_t r = bench_rng_next(&fill);
      memcpy(expected + i, &r, total - i < 8 ? total - i : 8);
    }
    CUdeviceptr src;
    BENCH_F(ferry__devmem_alloc(device, total, c.stream, &src));
    BENCH_CU(ferry__drv.cuMemcpyHtoDAsync(src, expected, total, c.stream));
    BENCH_CU(ferry__drv.cuStreamSynchronize(c.stream));
    bench_batch batch = bench_batch_cut((char *)(uintptr_t)src, total, (size_t)n, FERRY_DEVICE_CUDA, device);
    void *pinned;
    size_t pinned_bytes;
    BENCH_F(ferry__pin(total, &pinned, &pinned_bytes));
    CUstream raw_stream;
    BENCH_CU(ferry__drv.cuStreamCreate(&raw_stream, CU_STREAM_NON_BLOCKING));
    method methods[N_METHODS] = {
        {"ferry", transfer_ferry, device, &batch, NULL, NULL},
        {"raw cuMemcpyAsync loop", transfer_raw_loop, device, &batch, pinned, raw_stream},
        {"no transfer", transfer_none, device, &batch, NULL, NULL},
    };
    validate(&w, methods, expected);
    long scenario_seed = cfg.seed + si * 1009L;
    overlap_sample *samples[N_METHODS];
    for (int m = 0; m < N_METHODS; m++) samples[m] = calloc((size_t)cfg.num_runs, sizeof(overlap_sample));
    collect(&w, methods, &c, &cfg, scenario_seed, samples);
    for (int m = 0; m < N_METHODS; m++) {
      overlap_case oc = {created, info.name, capability, driver, methods[m].name, total, n, c.iterations,
                         scenario_seed, scenario_seed + m * 17L};
      table_row *r = &table[rows++];
      r->total_bytes = total;
      r->num_tensors = n;
      snprintf(r->method, sizeof r->method, "%s", methods[m].name);
      r->s = overlap_summarize(samples[m], samples[FLOOR], (int)cfg.num_runs, &cfg, &oc);
      overlap_write_summary_row(out, &cfg, &oc, &r->s);
      if (raw_out) overlap_write_sample_rows(raw_out, &cfg, &oc, samples[m], samples[FLOOR], (int)cfg.num_runs);
      print_row(r);
    }
    for (int m = 0; m < N_METHODS; m++) free(samples[m]);
    fflush(stdout);
    BENCH_CU(ferry__drv.cuStreamDestroy(raw_stream));
    ferry__unpin(pinned, pinned_bytes);
    bench_batch_free(&batch);
    BENCH_CU(ferry__drv.cuMemFreeAsync(src, c.stream));
    BENCH_CU(ferry__drv.cuStreamSynchronize(c.stream));
    free(expected);
  }
  atomic_store(&w.quit, 1);
  pthread_join(w.thread, NULL);
  fclose(out);
  if (raw_out) fclose(raw_out);

  printf("\nSummary (medians of %ld blocks; speedup = serialized / concurrent with its 95%% CI; overlap = saved "
         "time / min(compute, transfer)):\n", cfg.num_runs);
  for (int i = 0; i < rows; i++) print_row(&table[i]);
  printf("How to read it: slowdown = concurrent - compute-only, what the foreground loses beside the transfer; floor\n"
         "= the same for the no-transfer worker in the same blocks (the harness's own hand-offs, W); excess =\n"
         "slowdown - floor per block, with its 95%% interval: what the transfer itself costs the foreground; net\n"
         "transfer = transfer-only - the no-transfer worker's. The estimated overlap cannot rank methods in a harness\n"
         "with fixed costs: a concurrent block takes at least compute + W even when the transfer hides completely,\n"
         "so a transfer of T ms (shorter than the compute) scores at most (T - W) / T (the bound). W is the same for\n"
         "every method, so a faster transfer scores a lower overlap for the same foreground cost. Judge by the\n"
         "slowdown and excess.\n");
  printf("Summary saved to: %s\n", out_file);
  if (samples_file) printf("Raw samples saved to: %s\n", samples_file);
  if (ranks.world_size > 1) {
    bench_rank_barrier(&ranks, "overlap-done", 3600);
    if (ranks.rank == 0) merge_rank_summaries(cfg.output, ranks.world_size);
  }
  free(table);
  free(scen);
  bench_cublas_close(&c.cb);
  ferry__ctx_leave();
  return 0;
}
