/* ferry.c — the ferry command-line program: `ferry info` and `ferry bench bandwidth`.
 *
 * `info` prints the device, the driver, one 64 MiB copy's bandwidth and the pool's counters, and says plainly
 * when there is no GPU. `bench bandwidth` times ferry's D2H and H2D of 64 MiB split into N tensors against one
 * raw cuMemcpyAsync of 64 MiB (the physical limit) and the raw per-tensor cuMemcpyAsync loop, in the same run,
 * and the cold first transfer with and without ferry_pool_reserve. Medians of several repeats; CSV optional.
 */
#include "internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}
static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_d);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#define CHECK_CU(x)                                                                                   \
  do {                                                                                                \
    CUresult r_ = (x);                                                                                \
    if (r_ != CUDA_SUCCESS) {                                                                         \
      fprintf(stderr, "ferry: %s failed: %s (%s:%d)\n", #x, ferry__cu_name(r_), __FILE__, __LINE__);  \
      exit(1);                                                                                        \
    }                                                                                                 \
  } while (0)
#define CHECK_F(x)                                                                                    \
  do {                                                                                                \
    ferry_status s_ = (x);                                                                            \
    if (s_ != FERRY_OK) {                                                                             \
      fprintf(stderr, "ferry: %s failed: %s: %s\n", #x, ferry_status_name(s_), ferry_last_error_message()); \
      exit(1);                                                                                        \
    }                                                                                                 \
  } while (0)

static int no_gpu(void) {
  ferry_status st = ferry_init();
  if (st == FERRY_OK) return 0;
  printf("ferry %s: no GPU here (%s: %s).\nNothing to measure; transfers on this machine pass tensors through "
         "unchanged.\n", ferry_version(), ferry_status_name(st), ferry_last_error_message());
  return 1;
}

/* ---- a batch of N device tensors cut from one buffer ----------------------------------------------------- */

typedef struct batch {
  size_t n, piece;
  ferry_tensor *t;
  int64_t *shapes;
} batch;

static batch make_batch(char *base, size_t total, size_t n, int device_type, int device_id) {
  batch b = {n, total / n, calloc(n, sizeof(ferry_tensor)), calloc(n, sizeof(int64_t))};
  for (size_t i = 0; i < n; i++) {
    b.shapes[i] = (int64_t)b.piece;
    b.t[i] = (ferry_tensor){base + i * b.piece, {device_type, device_id}, 1, {FERRY_DTYPE_UINT, 8, 1},
                            &b.shapes[i], NULL, 0};
  }
  return b;
}

static void free_batch(batch *b) {
  free(b->t);
  free(b->shapes);
}

/* ---- info ------------------------------------------------------------------------------------------------- */

static int cmd_info(void) {
  if (no_gpu()) return 0;
  ferry_device_info info;
  CHECK_F(ferry_device_info_get(-1, &info));
  printf("ferry %s\ndevice cuda:%d  %s  sm_%d%d  SMs=%d  copy engines=%d  memory=%.1f GiB\ndriver %d.%d  "
         "cuMemcpyBatchAsync: %s  gather kernel: %s\n", ferry_version(), info.ordinal, info.name, info.cc_major,
         info.cc_minor, info.multiprocessors, info.async_engines, (double)info.total_memory / (1 << 30),
         info.driver_version / 1000, info.driver_version % 1000 / 10,
         ferry__drv.cuMemcpyBatchAsync_v13 ? "yes (13.0 ABI)" : ferry__drv.cuMemcpyBatchAsync_v12 ? "yes (12.8 ABI)" : "no",
         ferry__gather_available() ? "embedded" : "not built");
  size_t bytes = 64u << 20;
  CHECK_F(ferry__ctx_enter(info.ordinal));
  CUdeviceptr src;
  CHECK_F(ferry__devmem_alloc(info.ordinal, bytes, NULL, &src));
  CHECK_CU(ferry__drv.cuStreamSynchronize(NULL));
  batch b = make_batch((char *)(uintptr_t)src, bytes, 1, FERRY_DEVICE_CUDA, info.ordinal);
  ferry_transfer_options o;
  ferry_transfer_options_init(&o);
  o.flags = FERRY_TRANSFER_BLOCKING;
  double best = 1e30;
  for (int i = 0; i < 5; i++) {
    ferry_transfer *t;
    double t0 = now_ms();
    CHECK_F(ferry_transfer_d2h(b.t, 1, &o, &t));
    double ms = now_ms() - t0;
    ferry_transfer_release(t);
    if (ms < best) best = ms;
  }
  printf("D2H 64 MiB through ferry: %.3f ms, %.1f GB/s (best of 5, first includes pinning)\n", best,
         (double)bytes / (best * 1e6));
  ferry_pool_stats s;
  ferry_pool_stats_get(&s);
  printf("pool: pinned %.1f MiB in %llu region(s), in use %.1f MiB, peak %.1f MiB, pin time %.2f ms, hits %llu, "
         "misses %llu\n", (double)s.bytes_pinned / (1 << 20), (unsigned long long)s.regions,
         (double)s.bytes_in_use / (1 << 20), (double)s.bytes_peak_in_use / (1 << 20), s.pin_seconds * 1e3,
         (unsigned long long)s.hits, (unsigned long long)s.misses);
  free_batch(&b);
  ferry__ctx_leave();
  return 0;
}

/* ---- bench bandwidth ---------------------------------------------------------------------------------------- */

typedef struct bw_config { size_t total_mib; int repeats; const char *csv; int counts[16]; int ncounts; } bw_config;

/* Times one synchronous raw-loop transfer: per-tensor cuMemcpyAsync on a dedicated stream, then sync. */
static double time_raw_loop(CUstream s, batch *b, char *host, int h2d) {
  double t0 = now_ms();
  for (size_t i = 0; i < b->n; i++) {
    CUdeviceptr dev = (CUdeviceptr)(uintptr_t)b->t[i].data, hst = (CUdeviceptr)(uintptr_t)(host + i * b->piece);
    CHECK_CU(ferry__drv.cuMemcpyAsync(h2d ? dev : hst, h2d ? hst : dev, b->piece, s));
  }
  CHECK_CU(ferry__drv.cuStreamSynchronize(s));
  return now_ms() - t0;
}

static double time_ferry(batch *b, int h2d, uint32_t flags) {
  ferry_transfer_options o;
  ferry_transfer_options_init(&o);
  o.flags = FERRY_TRANSFER_BLOCKING | flags;
  ferry_transfer *t;
  double t0 = now_ms();
  CHECK_F(h2d ? ferry_transfer_h2d(b->t, b->n, &o, &t) : ferry_transfer_d2h(b->t, b->n, &o, &t));
  double ms = now_ms() - t0;
  ferry_transfer_release(t);
  return ms;
}

enum { M_LIMIT, M_RAW_LOOP, M_FERRY, M_FERRY_NO_BATCH, M_COUNT };

/* One timed transfer of method m: the raw copies use the device batch; ferry gets the source-side batch. */
static double time_method(int m, CUstream s, batch *one, batch *dev_b, batch *host_b, char *host, int h2d) {
  switch (m) {
  case M_LIMIT: return time_raw_loop(s, one, host, h2d);
  case M_RAW_LOOP: return time_raw_loop(s, dev_b, host, h2d);
  default: return time_ferry(h2d ? host_b : dev_b, h2d, m == M_FERRY_NO_BATCH ? FERRY_TRANSFER_NO_BATCH_API : 0);
  }
}

static int cmd_bandwidth(int argc, char **argv) {
  bw_config c = {64, 15, NULL, {1, 32, 256, 4096}, 4};
  for (int i = 0; i < argc; i++) {
    if (!strcmp(argv[i], "--help")) {
      printf("usage: ferry bench bandwidth [--total-mib N] [--repeats N] [--num-tensors N...] [--output CSV]\n"
             "Times D2H and H2D of TOTAL MiB (default 64) of uint8 split into N tensors (default 1 32 256 4096):\n"
             "ferry vs one raw cuMemcpyAsync of the whole size (the limit) vs the raw per-tensor loop, medians of\n"
             "--repeats (default 15) in the same run; then the cold first transfer of 96 MiB with and without\n"
             "ferry_pool_reserve.\n");
      return 0;
    } else if (!strcmp(argv[i], "--total-mib") && i + 1 < argc) {
      c.total_mib = (size_t)atol(argv[++i]);
    } else if (!strcmp(argv[i], "--repeats") && i + 1 < argc) {
      c.repeats = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--output") && i + 1 < argc) {
      c.csv = argv[++i];
    } else if (!strcmp(argv[i], "--num-tensors")) {
      c.ncounts = 0;
      while (i + 1 < argc && argv[i + 1][0] != '-' && c.ncounts < 16) c.counts[c.ncounts++] = atoi(argv[++i]);
    } else {
      fprintf(stderr, "ferry bench bandwidth: unknown or incomplete argument '%s' (see --help)\n", argv[i]);
      return 2;
    }
  }
  if (c.total_mib == 0 || c.repeats < 1 || c.ncounts == 0) {
    fprintf(stderr, "ferry bench bandwidth: --total-mib, --repeats and --num-tensors must be positive\n");
    return 2;
  }
  if (no_gpu()) return 0;
  int dev;
  CHECK_F(ferry_device_resolve(-1, &dev));
  CHECK_F(ferry__ctx_enter(dev));
  size_t bytes = c.total_mib << 20;
  CUstream s;
  CHECK_CU(ferry__drv.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr d_src;
  CHECK_F(ferry__devmem_alloc(dev, bytes, s, &d_src));
  void *h_pinned;
  size_t h_bytes;
  CHECK_F(ferry__pin(bytes, &h_pinned, &h_bytes));
  memset(h_pinned, 0x5a, bytes);
  CHECK_CU(ferry__drv.cuMemcpyHtoDAsync(d_src, h_pinned, bytes, s));
  CHECK_CU(ferry__drv.cuStreamSynchronize(s));
  FILE *csv = c.csv ? fopen(c.csv, "w") : NULL;
  if (c.csv && !csv) {
    fprintf(stderr, "ferry: cannot write %s\n", c.csv);
    return 1;
  }
  if (csv) fprintf(csv, "direction,total_bytes,num_tensors,method,median_ms,gb_per_s,ratio_to_limit\n");
  printf("%-4s %8s %-22s %10s %9s %9s\n", "dir", "tensors", "method", "median_ms", "GB/s", "x limit");
  double *v = calloc((size_t)c.repeats, sizeof *v);
  for (int h2d = 0; h2d <= 1; h2d++) {
    for (int k = 0; k < c.ncounts; k++) {
      size_t n = (size_t)c.counts[k];
      /* D2H reads device tensors; H2D reads pinned host tensors. Both views cut the same buffers. */
      batch dev_b = make_batch((char *)(uintptr_t)d_src, bytes, n, FERRY_DEVICE_CUDA, dev);
      batch host_b = make_batch(h_pinned, bytes, n, FERRY_DEVICE_CPU, 0);
      batch one = make_batch((char *)(uintptr_t)d_src, bytes, 1, FERRY_DEVICE_CUDA, dev);
      const char *names[M_COUNT] = {"raw 1 copy (limit)", "raw per-tensor loop", "ferry", "ferry no-batch-api"};
      double med[M_COUNT];
      for (int m = 0; m < M_COUNT; m++) {
        for (int w = 0; w < 2; w++) /* warm-up: pool, module, streams */
          (void)time_method(m, s, &one, &dev_b, &host_b, h_pinned, h2d);
        for (int r = 0; r < c.repeats; r++) v[r] = time_method(m, s, &one, &dev_b, &host_b, h_pinned, h2d);
        med[m] = median(v, c.repeats);
      }
      for (int m = 0; m < M_COUNT; m++) {
        double gbs = (double)bytes / (med[m] * 1e6), ratio = med[m] / med[0];
        printf("%-4s %8zu %-22s %10.3f %9.2f %9.3f\n", h2d ? "H2D" : "D2H", n, names[m], med[m], gbs, ratio);
        if (csv) fprintf(csv, "%s,%zu,%zu,%s,%.4f,%.3f,%.4f\n", h2d ? "h2d" : "d2h", bytes, n, names[m], med[m], gbs,
                         ratio);
      }
      free_batch(&dev_b);
      free_batch(&host_b);
      free_batch(&one);
    }
  }
  /* Cold start: a fresh 96 MiB D2H with an empty pool, then after reserve. */
  CHECK_F(ferry_pool_trim());
  size_t cold = 96u << 20;
  CUdeviceptr d_cold;
  CHECK_F(ferry__devmem_alloc(dev, cold, s, &d_cold));
  CHECK_CU(ferry__drv.cuStreamSynchronize(s));
  batch cb = make_batch((char *)(uintptr_t)d_cold, cold, 1, FERRY_DEVICE_CUDA, dev);
  double cold_ms = time_ferry(&cb, 0, 0);
  CHECK_F(ferry_pool_trim());
  double r0 = now_ms();
  CHECK_F(ferry_pool_reserve(cold));
  double reserve_ms = now_ms() - r0;
  double reserved_ms = time_ferry(&cb, 0, 0);
  for (int r = 0; r < c.repeats; r++) v[r] = time_ferry(&cb, 0, 0);
  double steady = median(v, c.repeats);
  printf("cold D2H 96 MiB: first call %.3f ms (pool empty); reserve %.3f ms then first call %.3f ms; steady %.3f ms "
         "(first-after-reserve / steady = %.3f)\n", cold_ms, reserve_ms, reserved_ms, steady, reserved_ms / steady);
  if (csv) {
    fprintf(csv, "d2h,%zu,1,cold first call,%.4f,%.3f,\n", cold, cold_ms, (double)cold / (cold_ms * 1e6));
    fprintf(csv, "d2h,%zu,1,first call after reserve,%.4f,%.3f,\n", cold, reserved_ms,
            (double)cold / (reserved_ms * 1e6));
    fprintf(csv, "d2h,%zu,1,steady,%.4f,%.3f,\n", cold, steady, (double)cold / (steady * 1e6));
    fclose(csv);
  }
  free_batch(&cb);
  free(v);
  ferry__unpin(h_pinned, h_bytes);
  ferry__ctx_leave();
  return 0;
}

static void usage(FILE *f) {
  fprintf(f, "usage: ferry <command> [options]\n\n"
             "commands:\n"
             "  info               device, driver, one 64 MiB copy through ferry, pool counters\n"
             "  bench bandwidth    D2H/H2D of 64 MiB in 1..4096 tensors: ferry vs the raw copy (see --help)\n"
             "  --help             this text\n\n"
             "Without a GPU every command says so and exits with status 0.\n");
}

int main(int argc, char **argv) {
  if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
    usage(stdout);
    return 0;
  }
  if (!strcmp(argv[1], "info")) return cmd_info();
  if (!strcmp(argv[1], "bench") && argc >= 3 && !strcmp(argv[2], "bandwidth")) return cmd_bandwidth(argc - 3, argv + 3);
  fprintf(stderr, "ferry: unknown command '%s'\n", argv[1]);
  usage(stderr);
  return 2;
}
