/* ferry.c — the ferry command-line program: `ferry info`, the `ferry bench NAME` benchmarks, `ferry --version`.
 *
 * `info` prints the device, the driver, one 64 MiB copy's bandwidth and the pool's counters, and says plainly
 * when there is no GPU. Each benchmark lives in bench/ as a program of its own; this file only dispatches. Every
 * command follows bench/common.h's conventions: exit status 0 done (also "no GPU here"), 1 a failure, 2 a bad
 * command line; messages on stderr start "ferry: ".
 */
#include "../bench/bench.h"
#include "../bench/common.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

static void info_usage(FILE *f) {
  fprintf(f, "usage: ferry info\n\n"
             "The device (LOCAL_RANK, else cuda:0), the driver, whether cuMemcpyBatchAsync and the gather kernel are\n"
             "there, one 64 MiB D2H through ferry (the first call pins the pool) and the pool's counters.\n"
             "Without a GPU it says so and exits 0.\n");
}

static int cmd_info(int argc, char **argv) {
  for (int i = 0; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      info_usage(stdout);
      return BENCH_EXIT_OK;
    }
    fprintf(stderr, "ferry: info: unknown argument '%s' (see `ferry info --help`)\n", argv[i]);
    return BENCH_EXIT_USAGE;
  }
  if (bench_no_gpu("ferry info")) return BENCH_EXIT_OK;
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
    {"overlap", bench_overlap_main, "D2H in a background thread under a foreground SGEMM (SPDL's overlap experiment)"},
    {"bandwidth", bench_bandwidth_main, "D2H/H2D over sizes and tensor counts: ferry vs the raw copies"},
    {"ranks", bench_ranks_main, "one process per GPU (torchrun): placement checks, aggregate host bandwidth"},
    {"latency", bench_latency_main, "operator host latency (the CUTLASS notebook's table) and GEMM device time"},
};
enum { N_BENCHES = sizeof benches / sizeof *benches };

static void bench_list(FILE *f) {
  fprintf(f, "usage: ferry bench NAME [options]     (`ferry bench NAME --help` describes one)\n\nbenchmarks:\n");
  for (size_t i = 0; i < N_BENCHES; i++) fprintf(f, "  %-10s %s\n", benches[i].name, benches[i].help);
  fprintf(f, "\nEach writes CSV (--output) and prints a table last. Without a GPU it says so and exits 0.\n");
}

static void usage(FILE *f) {
  fprintf(f, "usage: ferry <command> [options]\n\ncommands:\n"
             "  info                 device, driver, one 64 MiB copy through ferry, pool counters\n");
  for (size_t i = 0; i < N_BENCHES; i++) fprintf(f, "  bench %-14s %s\n", benches[i].name, benches[i].help);
  fprintf(f, "  --version            ferry's version\n"
             "  --help               this text; `ferry bench NAME --help` describes a benchmark\n\n"
             "Exit status: 0 done (also when there is no GPU: every command then says so), 1 a failure, 2 a bad\n"
             "command line.\n");
}

static int cmd_bench(int argc, char **argv) {
  if (argc == 0) {
    fprintf(stderr, "ferry: bench: name a benchmark\n");
    bench_list(stderr);
    return BENCH_EXIT_USAGE;
  }
  if (!strcmp(argv[0], "--help") || !strcmp(argv[0], "-h")) {
    bench_list(stdout);
    return BENCH_EXIT_OK;
  }
  for (size_t i = 0; i < N_BENCHES; i++)
    if (!strcmp(argv[0], benches[i].name)) return benches[i].run(argc - 1, argv + 1);
  fprintf(stderr, "ferry: bench: unknown benchmark '%s'\n", argv[0]);
  bench_list(stderr);
  return BENCH_EXIT_USAGE;
}

/* At exit: output that could not be written (a full disk, a closed pipe) is a failure, not a silent success. */
static void check_stdout(void) {
  if (fflush(stdout) == 0 && !ferror(stdout)) return;
  fprintf(stderr, "ferry: writing to standard output failed: %s\n", strerror(errno ? errno : EIO));
  _exit(BENCH_EXIT_FAILURE);
}

int main(int argc, char **argv) {
  atexit(check_stdout);
  if (argc < 2) {
    usage(stderr);
    return BENCH_EXIT_USAGE;
  }
  if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
    usage(stdout);
    return BENCH_EXIT_OK;
  }
  if (!strcmp(argv[1], "--version")) {
    printf("ferry %s\n", ferry_version());
    return BENCH_EXIT_OK;
  }
  if (!strcmp(argv[1], "info")) return cmd_info(argc - 2, argv + 2);
  if (!strcmp(argv[1], "bench")) return cmd_bench(argc - 2, argv + 2);
  fprintf(stderr, "ferry: unknown command '%s'\n", argv[1]);
  usage(stderr);
  return BENCH_EXIT_USAGE;
}
