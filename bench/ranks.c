/* ranks.c — `ferry bench ranks`: one process per GPU under torchrun, each on its own device through LOCAL_RANK,
 * and the host bandwidth they reach together.
 *
 *   torchrun --nproc-per-node N --no-python build/ferry bench ranks --output ranks.csv
 *
 * Each rank first checks where its work goes: the device LOCAL_RANK resolves to, the context of its cached copy
 * stream, and the device of a transfer's source (no cross-device traffic). Then three timed phases, each after a
 * barrier so that no rank's timing overlaps another phase:
 *   alone       ranks take turns: one raw 64 MiB copy (the single-GPU limit) and one ferry D2H, each the median of
 *               --repeats, while the others wait;
 *   raw         all ranks at once, the raw copy --repeats times (what the host's links give N GPUs together);
 *   ferry       all ranks at once, ferry D2H --repeats times.
 * Each rank writes its own CSV row (out.rankR.csv); rank 0 waits for all, merges them into --output, and prints
 * the aggregate GB/s of the concurrent phases (total bytes over the span from the first start to the last end)
 * against N x the mean alone limit. A lone process (no torchrun) runs the same phases with N = 1.
 */
#include "bench.h"
#include "common.h"

#include <string.h>

#define CSV_HEADER                                                                                        \
  "rank,local_rank,device,alone_limit_ms,alone_ferry_ms,raw_median_ms,ferry_median_ms,raw_start_ms,raw_end_ms," \
  "ferry_start_ms,ferry_end_ms"

typedef struct rank_result {
  int rank, local_rank, device;
  double alone_limit_ms, alone_ferry_ms, raw_start_ms, raw_end_ms, ferry_start_ms, ferry_end_ms;
  double raw_median_ms, ferry_median_ms;
} rank_result;

static void usage(void) {
  printf("usage: [torchrun --nproc-per-node N --no-python] ferry bench ranks [--total-mib M] [--repeats R]\n"
         "                                                          [--output CSV]\n\n"
         "One process per GPU (device from LOCAL_RANK): checks that each rank's copy stream and transfers stay on\n"
         "its own device, then times a raw M MiB D2H copy (default 64) and ferry's D2H, each rank alone in turn and\n"
         "then all ranks at once, R times each (default 20). Rank r writes CSV's name with .rank<r> before the\n"
         "extension; rank 0 merges them into CSV\n"
         "(default ferry-ranks.csv) and prints aggregate GB/s against N x the single-GPU limit. Without a GPU it\n"
         "says so and exits 0; a LOCAL_RANK past the device count is an error naming both numbers.\n");
}

static double raw_copy_ms(CUstream s, char *host, CUdeviceptr dev, size_t bytes) {
  double t0 = bench_now_ms();
  BENCH_CU(ferry__drv.cuMemcpyAsync((CUdeviceptr)(uintptr_t)host, dev, bytes, s));
  BENCH_CU(ferry__drv.cuStreamSynchronize(s));
  return bench_now_ms() - t0;
}

static double ferry_copy_ms(const ferry_tensor *t, int device) {
  ferry_transfer_options o;
  ferry_transfer_options_init(&o);
  o.device = device;
  o.flags = FERRY_TRANSFER_BLOCKING;
  ferry_transfer *tr;
  double t0 = bench_now_ms();
  BENCH_F(ferry_transfer_d2h(t, 1, &o, &tr));
  double ms = bench_now_ms() - t0;
  ferry_transfer_release(tr);
  return ms;
}

/* The checks: device from LOCAL_RANK, copy stream in that device's context, transfer source on that device. */
static void check_placement(const bench_ranks *r, int device, const ferry_tensor *t) {
  void *copy_stream = NULL;
  BENCH_F(ferry_copy_stream(device, &copy_stream));
  CUcontext ctx = NULL;
  BENCH_CU(ferry__drv.cuStreamGetCtx((CUstream)copy_stream, &ctx));
  int stream_ok = ctx == ferry__device_ctx(device);
  ferry_transfer_options o;
  ferry_transfer_options_init(&o);
  o.flags = FERRY_TRANSFER_BLOCKING; /* device -1: resolved from LOCAL_RANK, as a user's call would be */
  ferry_transfer *tr;
  BENCH_F(ferry_transfer_d2h(t, 1, &o, &tr));
  int resolved = ferry_transfer_device(tr);
  ferry_transfer_release(tr);
  int expected = r->local_rank >= 0 ? r->local_rank : 0;
  printf("rank %d: LOCAL_RANK=%d -> cuda:%d; copy stream %s; a transfer without a device ran on cuda:%d%s\n",
         r->rank, r->local_rank, device, stream_ok ? "in that device's primary context" : "ON ANOTHER DEVICE",
         resolved, resolved == expected && device == expected && stream_ok ? " (ok)" : " (WRONG)");
  if (!(resolved == expected && device == expected && stream_ok)) exit(1);
}

static void merge(const char *output, const bench_ranks *r, double bytes, int repeats) {
  FILE *out = bench_csv_open(output);
  fprintf(out, "%s\n", CSV_HEADER);
  double limit_sum = 0, raw_lo = 1e300, raw_hi = 0, ferry_lo = 1e300, ferry_hi = 0;
  printf("\n%-5s %-7s %12s %12s %14s %14s\n", "rank", "device", "alone limit", "alone ferry", "together raw",
         "together ferry");
  for (int k = 0; k < r->world_size; k++) {
    char path[1024];
    FILE *f = fopen(bench_rank_path(output, k, path, sizeof path), "r");
    rank_result x;
    char line[1024];
    if (!f || !fgets(line, sizeof line, f) || !fgets(line, sizeof line, f) ||
        sscanf(line, "%d,%d,%d,%lf,%lf,%lf,%lf,%lf,%lf,%lf,%lf", &x.rank, &x.local_rank, &x.device,
               &x.alone_limit_ms, &x.alone_ferry_ms, &x.raw_median_ms, &x.ferry_median_ms, &x.raw_start_ms,
               &x.raw_end_ms, &x.ferry_start_ms, &x.ferry_end_ms) != 11) {
      fprintf(stderr, "ferry: bench ranks: cannot read rank %d's results from %s\n", k, path);
      exit(1);
    }
    fclose(f);
    fputs(line, out);
    limit_sum += x.alone_limit_ms;
    raw_lo = x.raw_start_ms < raw_lo ? x.raw_start_ms : raw_lo;
    raw_hi = x.raw_end_ms > raw_hi ? x.raw_end_ms : raw_hi;
    ferry_lo = x.ferry_start_ms < ferry_lo ? x.ferry_start_ms : ferry_lo;
    ferry_hi = x.ferry_end_ms > ferry_hi ? x.ferry_end_ms : ferry_hi;
    printf("%-5d cuda:%-2d %9.3f ms %9.3f ms %11.3f ms %11.3f ms   (medians of %d)\n", x.rank, x.device,
           x.alone_limit_ms, x.alone_ferry_ms, x.raw_median_ms, x.ferry_median_ms, repeats);
  }
  fclose(out);
  double n = r->world_size, limit_gbs = n * bytes / (limit_sum / n * 1e6);
  double raw_gbs = n * bytes * repeats / ((raw_hi - raw_lo) * 1e6);
  double ferry_gbs = n * bytes * repeats / ((ferry_hi - ferry_lo) * 1e6);
  printf("\naggregate D2H over %d rank(s): N x single-GPU limit %.1f GB/s; all ranks raw %.1f GB/s (%.3f of it); "
         "all ranks ferry %.1f GB/s (%.3f of it)\nmerged: %s\n", r->world_size, limit_gbs, raw_gbs,
         raw_gbs / limit_gbs, ferry_gbs, ferry_gbs / limit_gbs, output);
}

/* The option's value, or a usage error when it has none. */
static const char *val(int argc, char **argv, int *i) { return bench_value("bench ranks", argc, argv, i); }

int bench_ranks_main(int argc, char **argv) {
  long mib = 64, repeats = 20;
  const char *output = "ferry-ranks.csv";
  for (int i = 0; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { usage(); return 0; }
    else if (!strcmp(argv[i], "--total-mib")) mib = bench_parse_long("--total-mib", val(argc, argv, &i), 1, BENCH_MAX_MIB);
    else if (!strcmp(argv[i], "--repeats")) repeats = bench_parse_long("--repeats", val(argc, argv, &i), 1, INT_MAX);
    else if (!strcmp(argv[i], "--output")) output = val(argc, argv, &i);
    else bench_usage_error("bench ranks", "unknown argument '%s'", argv[i]);
  }
  bench_check_output("--output", output);
  if (bench_no_gpu("ferry bench ranks")) return 0;
  bench_ranks r = bench_ranks_from_env();
  int device;
  ferry_status st = ferry_device_resolve(-1, &device);
  if (st != FERRY_OK) {
    fprintf(stderr, "ferry: bench ranks: rank %d: %s\n", r.rank, ferry_last_error_message());
    return BENCH_EXIT_FAILURE;
  }
  BENCH_F(ferry__ctx_enter(device));
  size_t bytes = (size_t)mib << 20;
  CUstream s;
  BENCH_CU(ferry__drv.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr src;
  BENCH_F(ferry__devmem_alloc(device, bytes, s, &src));
  BENCH_CU(ferry__drv.cuStreamSynchronize(s));
  void *host;
  size_t host_bytes;
  BENCH_F(ferry__pin(bytes, &host, &host_bytes));
  BENCH_F(ferry_pool_reserve(bytes));
  bench_batch b = bench_batch_cut((char *)(uintptr_t)src, bytes, 1, FERRY_DEVICE_CUDA, device);
  check_placement(&r, device, b.t);
  double *v = calloc((size_t)repeats, sizeof *v);
  rank_result x = {r.rank, r.local_rank, device, 0, 0, 0, 0, 0, 0, 0, 0};

  for (int k = 0; k < r.world_size; k++) { /* alone, in turns */
    char name[32];
    snprintf(name, sizeof name, "alone-%d", k);
    bench_rank_barrier(&r, name, 120);
    if (k != r.rank) continue;
    for (int w = 0; w < 3; w++) (void)raw_copy_ms(s, host, src, bytes), (void)ferry_copy_ms(b.t, device);
    for (long i = 0; i < repeats; i++) v[i] = raw_copy_ms(s, host, src, bytes);
    x.alone_limit_ms = bench_median(v, (int)repeats);
    for (long i = 0; i < repeats; i++) v[i] = ferry_copy_ms(b.t, device);
    x.alone_ferry_ms = bench_median(v, (int)repeats);
  }
  bench_rank_barrier(&r, "raw", 120);
  x.raw_start_ms = bench_now_ms();
  for (long i = 0; i < repeats; i++) v[i] = raw_copy_ms(s, host, src, bytes);
  x.raw_end_ms = bench_now_ms();
  x.raw_median_ms = bench_median(v, (int)repeats);
  bench_rank_barrier(&r, "ferry", 120);
  x.ferry_start_ms = bench_now_ms();
  for (long i = 0; i < repeats; i++) v[i] = ferry_copy_ms(b.t, device);
  x.ferry_end_ms = bench_now_ms();
  x.ferry_median_ms = bench_median(v, (int)repeats);

  char path[1024];
  FILE *f = bench_csv_open(bench_rank_path(output, r.rank, path, sizeof path));
  fprintf(f, "%s\n%d,%d,%d,%.5f,%.5f,%.5f,%.5f,%.4f,%.4f,%.4f,%.4f\n", CSV_HEADER, x.rank, x.local_rank, x.device,
          x.alone_limit_ms, x.alone_ferry_ms, x.raw_median_ms, x.ferry_median_ms, x.raw_start_ms, x.raw_end_ms,
          x.ferry_start_ms, x.ferry_end_ms);
  fclose(f);
  bench_rank_barrier(&r, "written", 120);
  if (r.rank == 0) merge(output, &r, (double)bytes, (int)repeats);
  free(v);
  bench_batch_free(&b);
  ferry__unpin(host, host_bytes);
  BENCH_CU(ferry__drv.cuMemFreeAsync(src, s));
  BENCH_CU(ferry__drv.cuStreamSynchronize(s));
  ferry__ctx_leave();
  return 0;
}
