/* bandwidth.c — `ferry bench bandwidth`: D2H and H2D of a total payload split into N uint8 tensors, ferry
 * against the raw primitives, all in one run, then the cold first transfer with and without a reserve.
 *
 * Methods, each timed end to end on the host (submit + wait), as a caller sees it:
 *   limit      one cuMemcpyAsync of the whole payload between one device buffer and pinned memory (the physical
 *              limit of the link, measured in the same run);
 *   raw loop   one cuMemcpyAsync per tensor on a dedicated stream (what a naive library does);
 *   raw batch  one cuMemcpyBatchAsync of all tensors (the driver's own batching, when it has it);
 *   ferry      ferry_transfer_d2h / _h2d with FERRY_TRANSFER_BLOCKING (pinned pool, gather kernel, batch API);
 *   ferry in parts  the same tensors through ferry_transfer_begin / add (a part of --part-tensors at a time) / end,
 *              as the Python package submits a batch while it walks it: what splitting costs the C engine.
 * Every ratio is against `limit` of the same size in the same run. PyTorch's figures come from the Python
 * benchmark (python -m ferry.bench.bandwidth), which measures its own limit the same way.
 */
#include "bench.h"
#include "common.h"

#include <string.h>

enum { M_LIMIT, M_RAW_LOOP, M_RAW_BATCH, M_FERRY, M_FERRY_PARTS, M_COUNT };
static const char *method_names[M_COUNT] = {"limit (1 raw copy)", "raw per-tensor loop", "raw batch api",
                                            "ferry", "ferry in parts"};

typedef struct bw_args {
  uint64_t sizes[16];
  int nsizes;
  long counts[16];
  int ncounts;
  int repeats;
  const char *csv;
  int device;
  long part_tensors;
} bw_args;

typedef struct bw_ctx {
  int device;
  CUstream stream;
  char *dev_buf, *host_buf; /* device source/target and pinned host counterpart, both max size */
  CUdeviceptr *dsts, *srcs;
  size_t *lens;
} bw_ctx;

static double time_raw(bw_ctx *c, const bench_batch *b, int h2d, int batched) {
  for (size_t i = 0; i < b->n; i++) {
    CUdeviceptr dev = (CUdeviceptr)(uintptr_t)(c->dev_buf + b->offsets[i]);
    CUdeviceptr host = (CUdeviceptr)(uintptr_t)(c->host_buf + b->offsets[i]);
    c->dsts[i] = h2d ? dev : host;
    c->srcs[i] = h2d ? host : dev;
    c->lens[i] = (size_t)b->shapes[i];
  }
  double t0 = bench_now_ms();
  if (batched && b->n > 1 && ferry__drv.cuMemcpyBatchAsync_v13) {
    CUmemcpyAttributes attr;
    memset(&attr, 0, sizeof attr);
    attr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
    size_t attr_index = 0;
    BENCH_CU(ferry__drv.cuMemcpyBatchAsync_v13(c->dsts, c->srcs, c->lens, b->n, &attr, &attr_index, 1, c->stream));
  } else {
    for (size_t i = 0; i < b->n; i++) BENCH_CU(ferry__drv.cuMemcpyAsync(c->dsts[i], c->srcs[i], c->lens[i], c->stream));
  }
  BENCH_CU(ferry__drv.cuStreamSynchronize(c->stream));
  return bench_now_ms() - t0;
}

static double time_ferry(const bench_batch *b, int h2d) {
  ferry_transfer_options o;
  ferry_transfer_options_init(&o);
  o.flags = FERRY_TRANSFER_BLOCKING;
  ferry_transfer *t;
  double t0 = bench_now_ms();
  BENCH_F(h2d ? ferry_transfer_h2d(b->t, b->n, &o, &t) : ferry_transfer_d2h(b->t, b->n, &o, &t));
  double ms = bench_now_ms() - t0;
  ferry_transfer_release(t);
  return ms;
}

/* The batch through begin / add (`part` tensors at a time) / end, blocking: the C engine's cost of a split batch. */
static double time_ferry_parts(const bench_batch *b, int h2d, size_t part) {
  ferry_transfer_options o;
  ferry_transfer_options_init(&o);
  o.flags = FERRY_TRANSFER_BLOCKING;
  ferry_transfer *t;
  double t0 = bench_now_ms();
  BENCH_F(h2d ? ferry_transfer_begin_h2d(&o, &t) : ferry_transfer_begin_d2h(&o, &t));
  for (size_t first = 0; first < b->n; first += part)
    BENCH_F(ferry_transfer_add(t, b->t + first, b->n - first < part ? b->n - first : part));
  BENCH_F(ferry_transfer_end(t));
  double ms = bench_now_ms() - t0;
  ferry_transfer_release(t);
  return ms;
}

static double time_method(bw_ctx *c, int m, const bench_batch *one, const bench_batch *dev_b,
                          const bench_batch *host_b, int h2d, size_t part) {
  switch (m) {
  case M_LIMIT: return time_raw(c, one, h2d, 0);
  case M_RAW_LOOP: return time_raw(c, dev_b, h2d, 0);
  case M_RAW_BATCH: return time_raw(c, dev_b, h2d, 1);
  case M_FERRY: return time_ferry(h2d ? host_b : dev_b, h2d);
  default: return time_ferry_parts(h2d ? host_b : dev_b, h2d, part);
  }
}

static uint64_t parse_size(const char *text) {
  char *end = NULL;
  double v = strtod(text, &end);
  uint64_t unit = 1;
  if (end && (*end == 'K' || *end == 'k')) unit = 1ull << 10;
  else if (end && (*end == 'M' || *end == 'm')) unit = 1ull << 20;
  else if (end && (*end == 'G' || *end == 'g')) unit = 1ull << 30;
  else if (end && *end) unit = 0;
  if (end && *end) end++;
  if (end && (*end == 'i' || *end == 'I')) end++;
  if (end && (*end == 'B' || *end == 'b')) end++;
  double bytes = v * (double)unit;
  if (!end || *end || unit == 0 || !(bytes >= 1) || bytes > (double)((uint64_t)1 << 62))
    bench_usage_error("bench bandwidth", "--sizes expects sizes like 4K, 64M, 1G (1 byte to 4 EiB); got '%s'", text);
  return (uint64_t)bytes;
}

static void usage(void) {
  printf("usage: ferry bench bandwidth [--sizes S...] [--num-tensors N...] [--repeats R] [--device cuda:N]\n"
         "                             [--part-tensors P] [--output CSV]\n\n"
         "D2H and H2D of a payload of each size S (default 4K 64K 1M 16M 64M 256M 1G) split into N uint8 tensors\n"
         "(default 1 32 256 4096 16384; counts that would make tensors under 4 bytes are skipped). Methods, timed\n"
         "end to end on the host in the same run: one raw copy of the whole payload (the limit), the raw\n"
         "per-tensor cuMemcpyAsync loop, one raw cuMemcpyBatchAsync, ferry in one call, and ferry in parts of P\n"
         "tensors (begin / add / end, default P 256). Medians of R repeats (default 11)\n"
         "after 2 warm-ups; ratios are to the limit. Then the cold first D2H of a fresh 96 MiB with an empty pool,\n"
         "and after ferry_pool_reserve. Progress on stderr, CSV with --output, a table on stdout.\n");
}

static void parse(int argc, char **argv, bw_args *a) {
  static const char *default_sizes[] = {"4K", "64K", "1M", "16M", "64M", "256M", "1G"};
  static const long default_counts[] = {1, 32, 256, 4096, 16384};
  memset(a, 0, sizeof *a);
  a->repeats = 11;
  a->device = -1;
  a->part_tensors = 256;
  for (int i = 0; i < argc; i++) {
    const char *f = argv[i];
    if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
      usage();
      exit(0);
    } else if (!strcmp(f, "--sizes")) {
      while (i + 1 < argc && argv[i + 1][0] != '-') {
        if (a->nsizes == 16) bench_usage_error("bench bandwidth", "--sizes takes at most 16 values");
        a->sizes[a->nsizes++] = parse_size(argv[++i]);
      }
      if (!a->nsizes) bench_usage_error("bench bandwidth", "--sizes expects at least one size");
    } else if (!strcmp(f, "--num-tensors")) {
      while (i + 1 < argc && argv[i + 1][0] != '-') {
        if (a->ncounts == 16) bench_usage_error("bench bandwidth", "--num-tensors takes at most 16 values");
        a->counts[a->ncounts++] = bench_parse_long(f, argv[++i], 1, INT_MAX);
      }
      if (!a->ncounts) bench_usage_error("bench bandwidth", "--num-tensors expects at least one count");
    } else if (!strcmp(f, "--repeats")) {
      a->repeats = (int)bench_parse_long(f, bench_value("bench bandwidth", argc, argv, &i), 1, INT_MAX);
    } else if (!strcmp(f, "--part-tensors")) {
      a->part_tensors = bench_parse_long(f, bench_value("bench bandwidth", argc, argv, &i), 1, INT_MAX);
    } else if (!strcmp(f, "--device")) {
      a->device = bench_parse_device(f, bench_value("bench bandwidth", argc, argv, &i));
    } else if (!strcmp(f, "--output")) {
      a->csv = bench_value("bench bandwidth", argc, argv, &i);
      bench_check_output(f, a->csv);
    } else {
      bench_usage_error("bench bandwidth", "unknown argument '%s'", f);
    }
  }
  if (!a->nsizes)
    for (size_t k = 0; k < sizeof default_sizes / sizeof *default_sizes; k++)
      a->sizes[a->nsizes++] = parse_size(default_sizes[k]);
  if (!a->ncounts)
    for (size_t k = 0; k < sizeof default_counts / sizeof *default_counts; k++)
      a->counts[a->ncounts++] = default_counts[k];
}

/* Cold start: a fresh 96 MiB D2H with the pool emptied, then again after a reserve of that size. */
static void cold_start(bw_ctx *c, int repeats, FILE *csv) {
  size_t cold = 96u << 20;
  BENCH_F(ferry_pool_trim());
  bench_batch cb = bench_batch_cut(c->dev_buf, cold, 1, FERRY_DEVICE_CUDA, c->device);
  double cold_ms = time_ferry(&cb, 0);
  BENCH_F(ferry_pool_trim());
  double r0 = bench_now_ms();
  BENCH_F(ferry_pool_reserve(cold));
  double reserve_ms = bench_now_ms() - r0;
  double reserved_ms = time_ferry(&cb, 0);
  double *v = calloc((size_t)repeats, sizeof *v);
  for (int r = 0; r < repeats; r++) v[r] = time_ferry(&cb, 0);
  double steady = bench_median(v, repeats);
  printf("cold D2H 96 MiB: first call %.3f ms with the pool empty; reserve %.3f ms, then first call %.3f ms; "
         "steady %.3f ms (first-after-reserve / steady = %.3f)\n", cold_ms, reserve_ms, reserved_ms, steady,
         reserved_ms / steady);
  if (csv) {
    fprintf(csv, "d2h,%zu,1,cold first call,%.4f,%.3f,\n", cold, cold_ms, (double)cold / (cold_ms * 1e6));
    fprintf(csv, "d2h,%zu,1,reserve,%.4f,,\n", cold, reserve_ms);
    fprintf(csv, "d2h,%zu,1,first call after reserve,%.4f,%.3f,%.4f\n", cold, reserved_ms,
            (double)cold / (reserved_ms * 1e6), reserved_ms / steady);
    fprintf(csv, "d2h,%zu,1,steady,%.4f,%.3f,1\n", cold, steady, (double)cold / (steady * 1e6));
  }
  free(v);
  bench_batch_free(&cb);
}

int bench_bandwidth_main(int argc, char **argv) {
  bw_args a;
  parse(argc, argv, &a);
  if (bench_no_gpu("ferry bench bandwidth")) return 0;
  bw_ctx c = {0};
  BENCH_F(ferry_device_resolve(a.device, &c.device));
  BENCH_F(ferry__ctx_enter(c.device));
  uint64_t max_size = 96u << 20;
  long max_count = 1;
  for (int i = 0; i < a.nsizes; i++) max_size = a.sizes[i] > max_size ? a.sizes[i] : max_size;
  for (int i = 0; i < a.ncounts; i++) max_count = a.counts[i] > max_count ? a.counts[i] : max_count;
  BENCH_CU(ferry__drv.cuStreamCreate(&c.stream, CU_STREAM_NON_BLOCKING));
  CUdeviceptr dev;
  BENCH_F(ferry__devmem_alloc(c.device, max_size, c.stream, &dev));
  c.dev_buf = (char *)(uintptr_t)dev;
  void *host;
  size_t host_bytes;
  BENCH_F(ferry__pin(max_size, &host, &host_bytes));
  c.host_buf = host;
  for (uint64_t i = 0; i < max_size; i++) c.host_buf[i] = (char)(i * 131 + 7);
  BENCH_CU(ferry__drv.cuMemcpyHtoDAsync(dev, host, max_size, c.stream));
  BENCH_CU(ferry__drv.cuStreamSynchronize(c.stream));
  c.dsts = calloc((size_t)max_count, sizeof *c.dsts);
  c.srcs = calloc((size_t)max_count, sizeof *c.srcs);
  c.lens = calloc((size_t)max_count, sizeof *c.lens);
  FILE *csv = a.csv ? bench_csv_open(a.csv) : NULL;
  if (csv) fprintf(csv, "direction,total_bytes,num_tensors,method,median_ms,gb_per_s,ratio_to_limit\n");
  double *v = calloc((size_t)a.repeats, sizeof *v);
  printf("%-4s %10s %8s %-20s %10s %9s %9s\n", "dir", "bytes", "tensors", "method", "median_ms", "GB/s", "x limit");
  for (int h2d = 0; h2d <= 1; h2d++) {
    for (int si = 0; si < a.nsizes; si++) {
      uint64_t bytes = a.sizes[si];
      bench_batch one = bench_batch_cut(c.dev_buf, bytes, 1, FERRY_DEVICE_CUDA, c.device);
      for (int ci = 0; ci < a.ncounts; ci++) {
        size_t n = (size_t)a.counts[ci];
        if (bytes / n < 4) continue;
        fprintf(stderr, "ferry: bench bandwidth: %s %llu bytes in %zu tensors\n", h2d ? "H2D" : "D2H",
                (unsigned long long)bytes, n);
        bench_batch dev_b = bench_batch_cut(c.dev_buf, bytes, n, FERRY_DEVICE_CUDA, c.device);
        bench_batch host_b = bench_batch_cut(c.host_buf, bytes, n, FERRY_DEVICE_CPU, 0);
        double med[M_COUNT];
        for (int m = 0; m < M_COUNT; m++) {
          size_t part = (size_t)a.part_tensors;
          for (int w = 0; w < 2; w++) (void)time_method(&c, m, &one, &dev_b, &host_b, h2d, part); /* pool, module */
          for (int r = 0; r < a.repeats; r++) v[r] = time_method(&c, m, &one, &dev_b, &host_b, h2d, part);
          med[m] = bench_median(v, a.repeats);
        }
        for (int m = 0; m < M_COUNT; m++) {
          double gbs = (double)bytes / (med[m] * 1e6), ratio = med[m] / med[M_LIMIT];
          printf("%-4s %10llu %8zu %-20s %10.4f %9.2f %9.3f\n", h2d ? "H2D" : "D2H", (unsigned long long)bytes, n,
                 method_names[m], med[m], gbs, ratio);
          if (csv)
            fprintf(csv, "%s,%llu,%zu,%s,%.5f,%.3f,%.4f\n", h2d ? "h2d" : "d2h", (unsigned long long)bytes, n,
                    method_names[m], med[m], gbs, ratio);
        }
        bench_batch_free(&dev_b);
        bench_batch_free(&host_b);
      }
      bench_batch_free(&one);
    }
  }
  cold_start(&c, a.repeats, csv);
  if (csv) fclose(csv);
  free(v);
  free(c.dsts);
  free(c.srcs);
  free(c.lens);
  ferry__unpin(host, host_bytes);
  BENCH_CU(ferry__drv.cuMemFreeAsync(dev, c.stream));
  BENCH_CU(ferry__drv.cuStreamSynchronize(c.stream));
  ferry__ctx_leave();
  return 0;
}
