/* overlap.h — private to the overlap benchmark: its configuration, one paired sample, the comparison of a block
 * with the no-op worker's in the same block, and the summary that becomes one CSV row. The CSV columns are SPDL's
 * (benchmark_transfer_overlap.py, schema version 1), in the same order, then ferry's, named as the Python
 * benchmark names them, so the C and Python benchmarks' files can be read by one tool. */
#ifndef FERRY_BENCH_OVERLAP_H
#define FERRY_BENCH_OVERLAP_H

#include <stdint.h>
#include <stdio.h>

#define OVERLAP_SCHEMA_VERSION 1
#define OVERLAP_MAX_LIST 16

typedef struct overlap_config {
  long total_mib[OVERLAP_MAX_LIST];
  int n_total_mib;
  long num_tensors[OVERLAP_MAX_LIST];
  int n_num_tensors;
  long matrix_size;
  double compute_target_ms;
  long compute_iterations; /* 0: calibrate */
  long num_warmup, num_runs, bootstrap_resamples;
  long seed;
  const char *output, *samples_output;
  int device; /* -1: LOCAL_RANK, else 0 */
} overlap_config;

/* One randomized block: the four schedules of one method, paired with the block's compute-only time. */
typedef struct overlap_sample {
  int trial;
  char schedule_order[512];
  double compute_only_ms, transfer_only_ms, serialized_ms, concurrent_ms, cpu_launch_skew_ms;
} overlap_sample;

double overlap_speedup(const overlap_sample *s);
double overlap_hidden_ms(const overlap_sample *s);
double overlap_efficiency(const overlap_sample *s);

/* One block of a method against the no-op worker's schedules in the same block (ms), as the Python benchmark's
 * FloorComparison: slowdown = concurrent - compute-only; floor slowdown W = the same for the no-op worker; excess
 * = slowdown - W; floor transfer R = the no-op worker's transfer-only (the hand-off's round trip); net transfer =
 * transfer-only - R; bound = min(transfer-only - W, compute) / min(compute, transfer-only), the highest estimated
 * overlap a transfer that hides completely can score in this harness. */
typedef struct overlap_vs_floor {
  double slowdown_ms, floor_slowdown_ms, excess_over_floor_ms, floor_transfer_ms, net_transfer_ms, overlap_bound;
} overlap_vs_floor;

overlap_vs_floor overlap_against_floor(const overlap_sample *s, const overlap_sample *floor);

/* What the summary row records besides the samples. */
typedef struct overlap_case {
  const char *created_utc, *device_name, *device_capability, *cuda_version, *method;
  uint64_t total_bytes;
  long num_tensors, compute_iterations, schedule_seed, bootstrap_seed;
} overlap_case;

typedef struct overlap_summary {
  double compute_median_ms, compute_p95_ms, transfer_median_ms, transfer_p95_ms, transfer_gb_per_s;
  double serialized_median_ms, serialized_p95_ms, concurrent_median_ms, concurrent_p95_ms;
  double speedup_median, speedup_ci_lower, speedup_ci_upper, hidden_median_ms;
  double efficiency_median, efficiency_ci_lower, efficiency_ci_upper, cpu_launch_skew_p95_ms;
  /* Medians over blocks of overlap_vs_floor's fields; the excess with its bootstrap 95% interval. */
  double slowdown_median_ms, floor_slowdown_median_ms, excess_median_ms, excess_ci_lower_ms, excess_ci_upper_ms;
  double floor_transfer_median_ms, net_transfer_median_ms, overlap_bound_median;
} overlap_summary;

/* s[i] and floor[i] are the same block (trial i) of the method and of the no-op worker. */
overlap_summary overlap_summarize(const overlap_sample *s, const overlap_sample *floor, int n,
                                  const overlap_config *cfg, const overlap_case *c);

void overlap_write_summary_header(FILE *f);
void overlap_write_summary_row(FILE *f, const overlap_config *cfg, const overlap_case *c, const overlap_summary *s);
void overlap_write_samples_header(FILE *f);
void overlap_write_sample_rows(FILE *f, const overlap_config *cfg, const overlap_case *c, const overlap_sample *s,
                               const overlap_sample *floor, int n);

#endif
