/* The overlap benchmark's arithmetic (bench/overlap_stats.c) on hand-made blocks: each method against the no-op
 * worker's schedules in the same block, the summary's medians of the per-block figures, and the CSV headers with
 * SPDL's columns first. No driver. */
#include "overlap.h"
#include "test.h"

#include <math.h>

#define ASSERT_NEAR(a, b)                                                                                    \
  do {                                                                                                       \
    double a_ = (a), b_ = (b);                                                                               \
    if (!(fabs(a_ - b_) <= 1e-9)) FAIL_AT("%s == %s failed: %.9f != %.9f", #a, #b, a_, b_);                  \
  } while (0)

static overlap_sample block(int trial, double compute, double transfer, double serialized, double concurrent) {
  overlap_sample s;
  memset(&s, 0, sizeof s);
  s.trial = trial;
  s.compute_only_ms = compute;
  s.transfer_only_ms = transfer;
  s.serialized_ms = serialized;
  s.concurrent_ms = concurrent;
  return s;
}

/* Three blocks, as in the Python benchmark's tests. The no-op worker: W = 0.3, 0.1, 0.5; R = 0.4, 0.2, 0.6. The
 * method: slowdown 0.4, 0.9, 0.6 -> excess 0.1, 0.8, 0.1; net transfer 1.3, 1.5, 1.7. The medians of the
 * per-block differences (0.1, 1.5) differ from the differences of the medians (0.3, 1.3). */
static void three_blocks(overlap_sample floor[3], overlap_sample method[3]) {
  floor[0] = block(0, 8.0, 0.4, 8.4, 8.3);
  floor[1] = block(1, 8.0, 0.2, 8.2, 8.1);
  floor[2] = block(2, 9.0, 0.6, 9.6, 9.5);
  method[0] = block(0, 8.0, 1.7, 9.7, 8.4);
  method[1] = block(1, 8.0, 1.7, 9.7, 8.9);
  method[2] = block(2, 9.0, 2.3, 11.3, 9.6);
}

TEST(bench_overlap_each_block_is_measured_against_the_no_op_workers_same_block) {
  overlap_sample floor[3], method[3];
  three_blocks(floor, method);
  const double excess[3] = {0.1, 0.8, 0.1}, net[3] = {1.3, 1.5, 1.7}, w[3] = {0.3, 0.1, 0.5};
  const double bound[3] = {1.4 / 1.7, 1.6 / 1.7, 1.8 / 2.3};
  for (int i = 0; i < 3; i++) {
    overlap_vs_floor v = overlap_against_floor(&method[i], &floor[i]);
    ASSERT_NEAR(v.slowdown_ms, method[i].concurrent_ms - method[i].compute_only_ms);
    ASSERT_NEAR(v.floor_slowdown_ms, w[i]);
    ASSERT_NEAR(v.excess_over_floor_ms, excess[i]);
    ASSERT_NEAR(v.floor_transfer_ms, floor[i].transfer_only_ms);
    ASSERT_NEAR(v.net_transfer_ms, net[i]);
    ASSERT_NEAR(v.overlap_bound, bound[i]);
  }
}

TEST(bench_overlap_bound_of_a_transfer_longer_than_the_compute_is_the_compute_hidden_whole) {
  overlap_sample floor = block(0, 8.0, 0.4, 8.4, 8.3), longer = block(0, 8.0, 12.0, 20.0, 12.0);
  ASSERT_NEAR(overlap_against_floor(&longer, &floor).overlap_bound, 1.0);
  overlap_sample close = block(0, 8.0, 8.2, 16.2, 8.3);
  ASSERT_NEAR(overlap_against_floor(&close, &floor).overlap_bound, 7.9 / 8.0);
}

TEST(bench_overlap_summary_reports_medians_of_the_per_block_differences) {
  overlap_sample floor[3], method[3];
  three_blocks(floor, method);
  overlap_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.bootstrap_resamples = 200;
  overlap_case c = {"now", "Test GPU", "9.0", "13.0", "ferry", 64u << 20, 1, 10, 0, 0};
  overlap_summary s = overlap_summarize(method, floor, 3, &cfg, &c);
  ASSERT_NEAR(s.slowdown_median_ms, 0.6);
  ASSERT_NEAR(s.floor_slowdown_median_ms, 0.3);
  ASSERT_NEAR(s.excess_median_ms, 0.1);
  ASSERT(s.excess_ci_lower_ms <= 0.1 + 1e-9 && 0.1 - 1e-9 <= s.excess_ci_upper_ms);
  ASSERT_NEAR(s.floor_transfer_median_ms, 0.4);
  ASSERT_NEAR(s.net_transfer_median_ms, 1.5);
  ASSERT_NEAR(s.overlap_bound_median, 1.4 / 1.7);
  /* SPDL's figures as SPDL computes them: medians of the schedules and of the per-block ratios. */
  ASSERT_NEAR(s.concurrent_median_ms, 8.9);
  ASSERT_NEAR(s.efficiency_median, 1.7 / 2.3);
  overlap_summary own = overlap_summarize(floor, floor, 3, &cfg, &c);
  ASSERT_NEAR(own.excess_median_ms, 0.0);
  ASSERT_NEAR(own.net_transfer_median_ms, 0.0);
}

static char *header_of(void (*write)(FILE *), char *buf, size_t size) {
  FILE *f = tmpfile();
  ASSERT(f != NULL);
  write(f);
  rewind(f);
  ASSERT(fgets(buf, (int)size, f) != NULL);
  fclose(f);
  return buf;
}

TEST(bench_overlap_csv_headers_keep_spdls_columns_first_and_add_the_floors_after) {
  static const char spdl_summary[] =
      "schema_version,created_utc,device_name,device_capability,torch_version,cuda_version,seed,schedule_seed,"
      "bootstrap_seed,bootstrap_resamples,num_warmup,num_runs,total_bytes,num_tensors,dtype,matrix_size,"
      "compute_target_ms,compute_iterations,method,compute_median_ms,compute_p95_ms,transfer_median_ms,"
      "transfer_p95_ms,transfer_gb_per_s,serialized_median_ms,serialized_p95_ms,concurrent_median_ms,"
      "concurrent_p95_ms,speedup_median,speedup_ci_lower,speedup_ci_upper,hidden_median_ms,"
      "estimated_overlap_efficiency_median,estimated_overlap_efficiency_ci_lower,"
      "estimated_overlap_efficiency_ci_upper,cpu_launch_skew_p95_ms,";
  static const char spdl_samples[] =
      "schema_version,created_utc,seed,schedule_seed,total_bytes,num_tensors,method,trial,schedule_order,"
      "compute_only_ms,transfer_only_ms,serialized_ms,concurrent_ms,speedup,hidden_ms,estimated_overlap_efficiency,"
      "cpu_launch_skew_ms,";
  char line[2048];
  header_of(overlap_write_summary_header, line, sizeof line);
  ASSERT(strncmp(line, spdl_summary, sizeof spdl_summary - 1) == 0);
  ASSERT_STR_CONTAINS(line + sizeof spdl_summary - 1,
                      "layout,slowdown_median_ms,floor_slowdown_median_ms,excess_over_floor_median_ms,"
                      "excess_over_floor_ci_lower_ms,excess_over_floor_ci_upper_ms,floor_transfer_median_ms,"
                      "net_transfer_median_ms,overlap_bound_median\n");
  header_of(overlap_write_samples_header, line, sizeof line);
  ASSERT(strncmp(line, spdl_samples, sizeof spdl_samples - 1) == 0);
  ASSERT_STR_CONTAINS(line + sizeof spdl_samples - 1,
                      "layout,slowdown_ms,floor_slowdown_ms,excess_over_floor_ms,net_transfer_ms,overlap_bound\n");
}

TEST(bench_overlap_rows_have_as_many_fields_as_their_headers) {
  overlap_sample floor[3], method[3];
  three_blocks(floor, method);
  overlap_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.bootstrap_resamples = 50;
  overlap_case c = {"now", "Test GPU", "9.0", "13.0", "ferry", 64u << 20, 1, 10, 0, 0};
  overlap_summary s = overlap_summarize(method, floor, 3, &cfg, &c);
  FILE *f = tmpfile();
  ASSERT(f != NULL);
  overlap_write_summary_header(f);
  overlap_write_summary_row(f, &cfg, &c, &s);
  overlap_write_samples_header(f);
  overlap_write_sample_rows(f, &cfg, &c, method, floor, 3);
  rewind(f);
  char line[4096];
  int commas[6], k = 0;
  while (k < 6 && fgets(line, sizeof line, f)) {
    commas[k] = 0;
    for (const char *p = line; *p; p++) commas[k] += *p == ',';
    k++;
  }
  fclose(f);
  ASSERT_EQ(k, 6);
  ASSERT_EQ(commas[1], commas[0]);
  for (int i = 3; i < 6; i++) ASSERT_EQ(commas[i], commas[2]);
}
