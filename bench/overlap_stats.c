/* overlap_stats.c — the overlap benchmark's statistics and CSV rows, computed as SPDL's benchmark computes them:
 * medians and 95th percentiles with numpy's interpolation, paired speedup serialized/concurrent per block, and
 * percentile-bootstrap 95% intervals of the median speedup and of the median estimated overlap efficiency; then
 * each block against the no-op worker's in the same block (overlap_against_floor), summarized by medians of the
 * per-block figures, as the Python benchmark does. */
#include "overlap.h"

#include "common.h"

#include <math.h>

double overlap_speedup(const overlap_sample *s) { return s->serialized_ms / s->concurrent_ms; }
double overlap_hidden_ms(const overlap_sample *s) { return s->serialized_ms - s->concurrent_ms; }

/* Saved time over the most that could be saved, min(compute, transfer). Each schedule is timed separately, so
 * noise can put this outside [0, 1]; it is reported as measured. */
double overlap_efficiency(const overlap_sample *s) {
  double potential = s->compute_only_ms < s->transfer_only_ms ? s->compute_only_ms : s->transfer_only_ms;
  return potential > 0 ? overlap_hidden_ms(s) / potential : 0.0;
}

overlap_vs_floor overlap_against_floor(const overlap_sample *s, const overlap_sample *floor) {
  overlap_vs_floor r;
  r.slowdown_ms = s->concurrent_ms - s->compute_only_ms;
  r.floor_slowdown_ms = floor->concurrent_ms - floor->compute_only_ms;
  r.excess_over_floor_ms = r.slowdown_ms - r.floor_slowdown_ms;
  r.floor_transfer_ms = floor->transfer_only_ms;
  r.net_transfer_ms = s->transfer_only_ms - floor->transfer_only_ms;
  /* A transfer that hides completely leaves a concurrent block of max(compute + W, transfer). */
  double potential = s->compute_only_ms < s->transfer_only_ms ? s->compute_only_ms : s->transfer_only_ms;
  double hideable = s->transfer_only_ms - r.floor_slowdown_ms;
  if (hideable > s->compute_only_ms) hideable = s->compute_only_ms;
  r.overlap_bound = potential > 0 ? hideable / potential : 0.0;
  return r;
}

enum { N_COLS = 14 };

overlap_summary overlap_summarize(const overlap_sample *s, const overlap_sample *floor, int n,
                                  const overlap_config *cfg, const overlap_case *c) {
  double *col[N_COLS];
  for (int k = 0; k < N_COLS; k++) {
    col[k] = calloc(n > 0 ? (size_t)n : 1, sizeof(double));
    if (!col[k]) {
      fprintf(stderr, "ferry: out of memory summarizing %d blocks\n", n);
      exit(1);
    }
  }
  for (int i = 0; i < n; i++) {
    col[0][i] = s[i].compute_only_ms;
    col[1][i] = s[i].transfer_only_ms;
    col[2][i] = s[i].serialized_ms;
    col[3][i] = s[i].concurrent_ms;
    col[4][i] = overlap_speedup(&s[i]);
    col[5][i] = overlap_hidden_ms(&s[i]);
    col[6][i] = overlap_efficiency(&s[i]);
    col[7][i] = s[i].cpu_launch_skew_ms;
    overlap_vs_floor v = overlap_against_floor(&s[i], &floor[i]);
    col[8][i] = v.slowdown_ms;
    col[9][i] = v.floor_slowdown_ms;
    col[10][i] = v.excess_over_floor_ms;
    col[11][i] = v.floor_transfer_ms;
    col[12][i] = v.net_transfer_ms;
    col[13][i] = v.overlap_bound;
  }
  overlap_summary r;
  r.compute_median_ms = bench_median(col[0], n);
  r.compute_p95_ms = bench_percentile(col[0], n, 95);
  r.transfer_median_ms = bench_median(col[1], n);
  r.transfer_p95_ms = bench_percentile(col[1], n, 95);
  r.transfer_gb_per_s = (double)c->total_bytes / (r.transfer_median_ms * 1e6);
  r.serialized_median_ms = bench_median(col[2], n);
  r.serialized_p95_ms = bench_percentile(col[2], n, 95);
  r.concurrent_median_ms = bench_median(col[3], n);
  r.concurrent_p95_ms = bench_percentile(col[3], n, 95);
  r.speedup_median = bench_median(col[4], n);
  bench_bootstrap_median_ci(col[4], n, (int)cfg->bootstrap_resamples, (uint64_t)c->bootstrap_seed,
                            &r.speedup_ci_lower, &r.speedup_ci_upper);
  r.hidden_median_ms = bench_median(col[5], n);
  r.efficiency_median = bench_median(col[6], n);
  bench_bootstrap_median_ci(col[6], n, (int)cfg->bootstrap_resamples, (uint64_t)c->bootstrap_seed + 1,
                            &r.efficiency_ci_lower, &r.efficiency_ci_upper);
  r.cpu_launch_skew_p95_ms = bench_percentile(col[7], n, 95);
  r.slowdown_median_ms = bench_median(col[8], n);
  r.floor_slowdown_median_ms = bench_median(col[9], n);
  r.excess_median_ms = bench_median(col[10], n);
  bench_bootstrap_median_ci(col[10], n, (int)cfg->bootstrap_resamples, (uint64_t)c->bootstrap_seed + 2,
                            &r.excess_ci_lower_ms, &r.excess_ci_upper_ms);
  r.floor_transfer_median_ms = bench_median(col[11], n);
  r.net_transfer_median_ms = bench_median(col[12], n);
  r.overlap_bound_median = bench_median(col[13], n);
  for (int k = 0; k < N_COLS; k++) free(col[k]);
  return r;
}

void overlap_write_summary_header(FILE *f) {
  fprintf(f, "schema_version,created_utc,device_name,device_capability,torch_version,cuda_version,seed,"
             "schedule_seed,bootstrap_seed,bootstrap_resamples,num_warmup,num_runs,total_bytes,num_tensors,dtype,"
             "matrix_size,compute_target_ms,compute_iterations,method,compute_median_ms,compute_p95_ms,"
             "transfer_median_ms,transfer_p95_ms,transfer_gb_per_s,serialized_median_ms,serialized_p95_ms,"
             "concurrent_median_ms,concurrent_p95_ms,speedup_median,speedup_ci_lower,speedup_ci_upper,"
             "hidden_median_ms,estimated_overlap_efficiency_median,estimated_overlap_efficiency_ci_lower,"
             "estimated_overlap_efficiency_ci_upper,cpu_launch_skew_p95_ms,"
             "layout,slowdown_median_ms,floor_slowdown_median_ms,excess_over_floor_median_ms,"
             "excess_over_floor_ci_lower_ms,excess_over_floor_ci_upper_ms,floor_transfer_median_ms,"
             "net_transfer_median_ms,overlap_bound_median\n");
}

/* torch_version records that no PyTorch took part: this is the C benchmark. */
void overlap_write_summary_row(FILE *f, const overlap_config *cfg, const overlap_case *c, const overlap_summary *s) {
  fprintf(f, "%d,%s,%s,%s,none (C),%s,%ld,%ld,%ld,%ld,%ld,%ld,%llu,%ld,uint8,%ld,%g,%ld,%s,"
             "%.6f,%.6f,%.6f,%.6f,%.6f,%.6f,%.6f,%.6f,%.6f,%.6f,%.6f,%.6f,%.6f,%.6f,%.6f,%.6f,%.6f,"
             "even,%.6f,%.6f,%.6f,%.6f,%.6f,%.6f,%.6f,%.6f\n",
          OVERLAP_SCHEMA_VERSION, c->created_utc, c->device_name, c->device_capability, c->cuda_version, cfg->seed,
          c->schedule_seed, c->bootstrap_seed, cfg->bootstrap_resamples, cfg->num_warmup, cfg->num_runs,
          (unsigned long long)c->total_bytes, c->num_tensors, cfg->matrix_size, cfg->compute_target_ms,
          c->compute_iterations, c->method, s->compute_median_ms, s->compute_p95_ms, s->transfer_median_ms,
          s->transfer_p95_ms, s->transfer_gb_per_s, s->serialized_median_ms, s->serialized_p95_ms,
          s->concurrent_median_ms, s->concurrent_p95_ms, s->speedup_median, s->speedup_ci_lower,
          s->speedup_ci_upper, s->hidden_median_ms, s->efficiency_median, s->efficiency_ci_lower,
          s->efficiency_ci_upper, s->cpu_launch_skew_p95_ms, s->slowdown_median_ms, s->floor_slowdown_median_ms,
          s->excess_median_ms, s->excess_ci_lower_ms, s->excess_ci_upper_ms, s->floor_transfer_median_ms,
          s->net_transfer_median_ms, s->overlap_bound_median);
}

void overlap_write_samples_header(FILE *f) {
  fprintf(f, "schema_version,created_utc,seed,schedule_seed,total_bytes,num_tensors,method,trial,schedule_order,"
             "compute_only_ms,transfer_only_ms,serialized_ms,concurrent_ms,speedup,hidden_ms,"
             "estimated_overlap_efficiency,cpu_launch_skew_ms,layout,slowdown_ms,floor_slowdown_ms,"
             "excess_over_floor_ms,net_transfer_ms,overlap_bound\n");
}

void overlap_write_sample_rows(FILE *f, const overlap_config *cfg, const overlap_case *c, const overlap_sample *s,
                               const overlap_sample *floor, int n) {
  for (int i = 0; i < n; i++) {
    overlap_vs_floor v = overlap_against_floor(&s[i], &floor[i]);
    fprintf(f, "%d,%s,%ld,%ld,%llu,%ld,%s,%d,%s,%.6f,%.6f,%.6f,%.6f,%.6f,%.6f,%.6f,%.6f,"
               "even,%.6f,%.6f,%.6f,%.6f,%.6f\n",
            OVERLAP_SCHEMA_VERSION, c->created_utc, cfg->seed, c->schedule_seed, (unsigned long long)c->total_bytes,
            c->num_tensors, c->method, s[i].trial, s[i].schedule_order, s[i].compute_only_ms, s[i].transfer_only_ms,
            s[i].serialized_ms, s[i].concurrent_ms, overlap_speedup(&s[i]), overlap_hidden_ms(&s[i]),
            overlap_efficiency(&s[i]), s[i].cpu_launch_skew_ms, v.slowdown_ms, v.floor_slowdown_ms,
            v.excess_over_floor_ms, v.net_transfer_ms, v.overlap_bound);
  }
}
