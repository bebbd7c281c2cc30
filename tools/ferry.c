/* ferry.c — the ferry command-line program: `ferry info` and the `ferry bench ...` benchmarks.
 *
 * `info` prints the device, the driver, one 64 MiB copy's bandwidth and the pool's counters, and says plainly
 * when there is no GPU. Each benchmark lives in bench/ as a program of its own; this file only dispatches.
 */
#include "../bench/bench.h"
#include "../bench/common.h"

#include <string.h>

static int cmd_info(void) {
  if (bench_no_gpu("ferry info")) return 0;
  ferry_device_info info;
  BENCH_F(ferry_device_info_get(-1, &info));
  printf("ferry %s\ndevice cuda:%d  %s  sm_%d%d  SMs=%d  copy engines=%d  memory=%.1f GiB\ndriver %d.%d  "
         "cuMemcpyBatchAsync: %s  gather kernel: %s\n", ferry_version(), info.ordinal, info.name, info.cc_major,
         info.cc_minor, info.multiprocessors, info.async_engines, (double)info.total_memory / (1 << 30),
         info.driver_version / 1000, info.driver_version % 1000 / 10,
         ferry__drv.cuMemcpyBatchAsync_v13 ? "yes (13.0 ABI)" : ferry__drv.cuMemcpyBatchAsync_v12 ? "yes (12.8 ABI)" : "no",
         ferry__gather_available() ? "embedded" : "not built");
  size_t bytes = 64u << 20;
  BENCH_F(ferry__ctx_enter(info.ordinal));
  CUdeviceptr src;
  BENCH_F(ferry__devmem_alloc(info.ordinal, bytes, NULL, &src));
  BENCH_CU(ferry__drv.cuStreamSynchronize(NULL));
  bench_batch b = bench_batch_cut((char *)(uintptr_t)src, bytes, 1, FERRY_DEVICE_CUDA, info.ordinal);
  ferry_transfer_options o;
  ferry_transfer_options_init(&o);
  o.flags = FERRY_TRANSFER_BLOCKING;
  double best = 1e30, first = 0;
  for (int i = 0; i < 5; i++) {
    ferry_transfer *t;
    double t0 = bench_now_ms();
    BENCH_F(ferry_transfer_d2h(b.t, 1, &o, &t));
    double ms = bench_now_ms() - t0;
    ferry_transfer_release(t);
    if (i == 0) first = ms;
    if (ms < best) best = ms;
  }
  printf("D2H 64 MiB through ferry: first call %.3f ms (pins the pool), then best %.3f ms = %.1f GB/s\n", first,
         best, (double)bytes / (best * 1e6));
  ferry_pool_stats s;
  ferry_pool_stats_get(&s);
  printf("pool: pinned %.1f MiB in %llu region(s), in use %.1f MiB, peak %.1f MiB, pin time %.2f ms, hits %llu, "
         "misses %llu\n", (double)s.bytes_pinned / (1 << 20), (unsigned long long)s.regions,
         (double)s.bytes_in_use / (1 << 20), (double)s.bytes_peak_in_use / (1 << 20), s.pin_seconds * 1e3,
         (unsigned long long)s.hits, (unsigned long long)s.misses);
  bench_batch_free(&b);
  BENCH_CU(ferry__drv.cuMemFreeAsync(src, NULL));
  ferry__ctx_leave();
  return 0;
}

typedef struct command {
  const char *name;
  int (*run)(int argc, char **argv);
  const char *help;
} command;

static const command benches[] = {
    {"overlap", bench_overlap_main, "the seed's D2H / foreground-GEMM overlap experiment (the main job)"},
    {"bandwidth", bench_bandwidth_main, "D2H/H2D over sizes and tensor counts: ferry vs the raw copies"},
    {"ranks", bench_ranks_main, "one process per GPU (torchrun): placement checks, aggregate host bandwidth"},
    {"latency", bench_latency_main, "operator host latency (the CUTLASS notebook's table) and GEMM device time"},
};

static void usage(FILE *f) {
  fprintf(f, "usage: ferry <command> [options]\n\ncommands:\n"
             "  info                 device, driver, one 64 MiB copy through ferry, pool counters\n");
  for (size_t i = 0; i < sizeof benches / sizeof *benches; i++)
    fprintf(f, "  bench %-14s %s\n", benches[i].name, benches[i].help);
  fprintf(f, "  --help               this text; `ferry bench NAME --help` describes a benchmark\n\n"
             "Without a GPU every command says so and exits with status 0.\n");
}

int main(int argc, char **argv) {
  if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
    usage(stdout);
    return 0;
  }
  if (!strcmp(argv[1], "info")) return cmd_info();
  if (!strcmp(argv[1], "bench") && argc >= 3)
    for (size_t i = 0; i < sizeof benches / sizeof *benches; i++)
      if (!strcmp(argv[2], benches[i].name)) return benches[i].run(argc - 3, argv + 3);
  fprintf(stderr, "ferry: unknown command '%s%s%s'\n", argv[1], argc >= 3 ? " " : "", argc >= 3 ? argv[2] : "");
  usage(stderr);
  return 2;
}
