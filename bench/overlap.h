/* overlap.h — private to the overlap benchmark: its configuration, one paired sample, and the summary that
 * becomes one CSV row. The CSV columns are SPDL's (benchmark_transfer_overlap.py, schema version 1),
 * in the same order, so the C and Python benchmarks' files can be read by one tool. */
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
  char schedule_order[160];
  double compute_only_ms, transfer_only_ms, serialized_ms, concurrent_ms, cpu_launch_skew_ms;
} overlap_sample;

double overlap_speedup(const overlap_sample *s);
double overlap_hidden_ms(const overlap_sample *s);
double overlap_efficiency(const overlap_sample *s);

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
} overlap_summary;

overlap_summary overlap_summarize(const overlap_sample *s, int n, const overlap_config *cfg, const overlap_case *c);

void overlap_write_summary_header(FILE *f);
void overlap_write_summary_row(FILE *f, const overlap_config *cfg, const overlap_case *c, const overlap_summary *s);
void overlap_write_samples_header(FILE *f);
void overlap_write_sample_rows(FILE *f, const overlap_config *cfg, const overlap_case *c, const overlap_sample *s,
                               int n);

#endif
