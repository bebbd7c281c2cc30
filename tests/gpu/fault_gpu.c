/* fault_gpu.c — ferry_stress every_failing_driver_call_is_clean: tests/cpu/test_faults.c's fault matrix against the
 * real driver.
 *
 * For each driver call on the D2H, H2D and pool paths, and for each of its uses in one transfer (1st, 2nd, ...
 * until the transfer no longer makes that many), the call is made to fail (the fault seam returns an error
 * instead of calling the driver) and the transfer must fail cleanly: the status and the message name the call, no
 * ticket comes back, the pinned pool holds no more than before, ferry's device memory pool holds no more bytes
 * than before (CU_MEMPOOL_ATTR_USED_MEM_CURRENT, after ferry's streams drain), and the next transfer on the same
 * thread is byte-exact. The faulted transfer and the check use different data, so a copy left running into
 * memory the pool handed out again would show as a mismatch.
 *
 * Calls made once per process (context, streams, memory pool, module) are faulted in a fresh process each
 * (ferry_stress --fault-case PATH:CALL:NTH, spawned with posix_spawn, which is fork+exec and so safe after CUDA
 * initialisation); the rest run in this process, with the pool trimmed before each case so that pinning and event
 * creation are on the path every time. The harness's own driver calls go straight to the table, past the seam.
 */
#include "stress.h"

#include "fake_driver.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

enum { N = 48, BIG = 2 << 20, SMALL = 4000, HOST_BYTES = 3 * BIG + N * SMALL };
#define INJECTED CUDA_ERROR_LAUNCH_FAILED

/* The harness: device sources with two patterns (A for the faulted transfer, B for the check), host sources
 * pageable and pinned, a pinned download buffer and a stream of its own. */
typedef struct rig {
  int dev;
  CUdeviceptr src[2];
  unsigned char *host[2];  /* the same bytes as src[k], for D2H checks */
  unsigned char *pinned;   /* H2D sources the gather kernel reads over PCIe */
  size_t pinned_bytes;
  unsigned char *download; /* pinned */
  size_t download_bytes;
  CUstream stream;
  int64_t shapes[N][2], strides[N][2];
} rig;

static CUresult raw_alloc(CUdeviceptr *p, size_t n) {
  if (ferry__drv.cuMemAlloc) return ferry__drv.cuMemAlloc(p, n);
  return ferry__drv.cuMemAllocFromPoolAsync(p, n, NULL, NULL); /* the simulated driver */
}
static void raw_free(CUdeviceptr p) {
  if (ferry__drv.cuMemFree) (void)ferry__drv.cuMemFree(p);
  else (void)ferry__drv.cuMemFreeAsync(p, NULL);
}

static int rig_setup(rig *r, int dev) {
  memset(r, 0, sizeof *r);
  r->dev = dev;
  CUdevice d;
  CUcontext ctx;
  /* Directly, not through ferry: ferry's own first retain must stay on its path for the fresh-process cases. */
  if (ferry__drv.cuDeviceGet(&d, dev) != CUDA_SUCCESS || ferry__drv.cuDevicePrimaryCtxRetain(&ctx, d) != CUDA_SUCCESS ||
      ferry__drv.cuCtxPushCurrent(ctx) != CUDA_SUCCESS ||
      ferry__drv.cuStreamCreate(&r->stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
    return 0;
  for (int k = 0; k < 2; k++) {
    r->host[k] = malloc(HOST_BYTES);
    for (size_t i = 0; i < HOST_BYTES; i++) r->host[k][i] = (unsigned char)(i * (k ? 131 : 29) + k * 7 + (i >> 12));
    if (raw_alloc(&r->src[k], HOST_BYTES) != CUDA_SUCCESS ||
        ferry__drv.cuMemcpyHtoDAsync(r->src[k], r->host[k], HOST_BYTES, r->stream) != CUDA_SUCCESS ||
        ferry__drv.cuStreamSynchronize(r->stream) != CUDA_SUCCESS)
      return 0;
  }
  /* Pinned host memory of the harness's own, registered directly. */
  /* Whole pages: cuMemHostRegister pins pages, and aligned_alloc wants a multiple of the alignment. */
  r->pinned_bytes = (HOST_BYTES + 4095) / 4096 * 4096;
  r->download_bytes = (2 * HOST_BYTES + N * 512 + 4095) / 4096 * 4096;
  r->pinned = aligned_alloc(4096, r->pinned_bytes);
  r->download = aligned_alloc(4096, r->download_bytes);
  unsigned flags = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP;
  if (ferry__drv.cuMemHostRegister(r->pinned, r->pinned_bytes, flags) != CUDA_SUCCESS ||
      ferry__drv.cuMemHostRegister(r->download, r->download_bytes, flags) != CUDA_SUCCESS)
    return 0;
  memcpy(r->pinned, r->host[1], HOST_BYTES);
  return 1;
}

/* N tensors over pattern k: three of 2 MiB (DMA: in H2D two from pinned memory, batched, and one from pageable),
 * small ones (gathered; H2D: packed from pageable or gathered from pinned), a transposed view, an empty one, and
 * in D2H a host tensor that passes through. */
static void batch(rig *r, int h2d, int k, ferry_tensor *t) {
  size_t off = 0;
  for (int i = 0; i < N; i++) {
    int64_t len = i < 3 ? BIG : SMALL - 40 * (i % 50);
    int pinned = i < 2 || (i > 2 && i % 2);
    void *base = h2d ? (void *)(pinned ? r->pinned : r->host[k]) : (void *)(uintptr_t)r->src[k];
    r->shapes[i][0] = len;
    t[i] = (ferry_tensor){(char *)base + off, {h2d ? FERRY_DEVICE_CPU : FERRY_DEVICE_CUDA, r->dev}, 1,
                          {FERRY_DTYPE_UINT, 8, 1}, r->shapes[i], NULL, 0};
    off += (size_t)len;
  }
  r->shapes[5][0] = 40, r->shapes[5][1] = 50, r->strides[5][0] = 1, r->strides[5][1] = 40; /* transposed */
  t[5].ndim = 2, t[5].strides = r->strides[5];
  r->shapes[6][0] = 0;
  if (!h2d) {
    t[7].device.device_type = FERRY_DEVICE_CPU;
    t[7].data = r->host[k] + ((char *)t[7].data - (char *)(uintptr_t)r->src[k]);
  }
}

/* The expected byte k of input i, read on the host. */
static unsigned char expected(rig *r, int h2d, int k, const ferry_tensor *in, int i, int64_t e) {
  const unsigned char *base = h2d ? (const unsigned char *)in[i].data
                                  : r->host[k] + ((const char *)in[i].data - (const char *)(uintptr_t)r->src[k]);
  if (i == 5) return base[(e % 50) * 40 + e / 50];
  return base[e];
}

/* Number of wrong bytes in the transfer's outputs (D2H: read directly; H2D: downloaded first). -1: cannot check. */
static long long check(rig *r, int h2d, int k, const ferry_tensor *in, ferry_transfer *t) {
  const ferry_tensor *o = ferry_transfer_outputs(t);
  long long bad = 0;
  size_t at = 0;
  for (int i = 0; i < N; i++) {
    if (!h2d && i == 7) {
      bad += o[i].data != in[i].data;
      continue;
    }
    int64_t n = r->shapes[i][0] * (in[i].ndim == 2 ? r->shapes[i][1] : 1);
    const unsigned char *got = o[i].data;
    if (h2d) {
      if (n && ferry__drv.cuMemcpyAsync((CUdeviceptr)(uintptr_t)(r->download + at), (CUdeviceptr)(uintptr_t)o[i].data,
                                        (size_t)n, r->stream) != CUDA_SUCCESS)
        return -1;
      got = r->download + at;
      at += (size_t)n + 512;
    }
    if (h2d && ferry__drv.cuStreamSynchronize(r->stream) != CUDA_SUCCESS) return -1;
    for (int64_t e = 0; e < n; e++) bad += got[e] != expected(r, h2d, k, in, i, e);
  }
  return bad;
}

/* Lets everything ferry queued on this thread's streams finish, so stream-ordered frees have happened. */
static void drain(int dev) {
  CUstream s;
  if (ferry__thread_stream(dev, &s) == FERRY_OK) (void)ferry__drv.cuStreamSynchronize(s);
  if (ferry__thread_dma_stream(dev, &s) == FERRY_OK) (void)ferry__drv.cuStreamSynchronize(s);
  (void)ferry__drv.cuStreamSynchronize(NULL);
}

static long long devmem_now(int dev) {
  return stress_simulated ? (long long)fake_live_devmem : stress_devmem_pool_used(dev);
}

static ferry_status submit(int dev, int h2d, const ferry_tensor *t, ferry_transfer **out) {
  ferry_transfer_options o;
  ferry_transfer_options_init(&o);
  o.device = dev;
  o.flags = FERRY_TRANSFER_BLOCKING;
  o.gather_max_bytes = SMALL;
  return h2d ? ferry_transfer_h2d(t, N, &o, out) : ferry_transfer_d2h(t, N, &o, out);
}

enum { CASE_CLEAN = 0, CASE_FAIL = 1, CASE_NOT_REACHED = 3 };

/* One case: faults `call` at its `nth` use in a transfer (path "d2h", "h2d", or "reserve"/"trim" for the pool's
 * own calls) and checks everything. Writes a one-line verdict into `why`. `fresh`: nothing of ferry's exists yet
 * in this process (its streams must not be created before the fault is armed). */
static int run_case(rig *r, const char *path, const char *call, int nth, int fresh, char *why, size_t why_size) {
  int h2d = !strcmp(path, "h2d");
  ferry_tensor ta[N], tb[N];
  batch(r, h2d, 0, ta);
  (void)ferry_pool_trim(); /* pinning and event creation are then on this transfer's path */
  if (!fresh) drain(r->dev);
  ferry_pool_stats before, after;
  ferry_pool_stats_get(&before);
  long long mem_before = devmem_now(r->dev);
  ferry_transfer *t = NULL;
  ferry_status st;
  ferry__fault_arm(call, nth, INJECTED);
  if (!strcmp(path, "reserve")) st = ferry_pool_reserve(64 << 20);
  else if (!strcmp(path, "trim")) {
    ferry__fault_disarm();
    if (submit(r->dev, 0, ta, &t) == FERRY_OK) ferry_transfer_release(t); /* events in the pool, to destroy */
    t = NULL;
    (void)ferry_pool_reserve(64 << 20);
    ferry__fault_arm(call, nth, INJECTED);
    st = ferry_pool_trim();
  } else st = submit(r->dev, h2d, ta, &t);
  int hits = ferry__fault_hits();
  ferry__fault_disarm();
  ferry_error err = *ferry_last_error();
#define CASE_FAILS(...)                                                                                        \
  do {                                                                                                         \
    snprintf(why, why_size, __VA_ARGS__);                                                                      \
    ferry_transfer_release(t);                                                                                 \
    return CASE_FAIL;                                                                                          \
  } while (0)
  if (hits < nth) {
    ferry_transfer_release(t);
    snprintf(why, why_size, "not reached (%d uses)", hits);
    return CASE_NOT_REACHED;
  }
  /* A failed pinned-memory query only makes ferry read the source as pageable; trim ignores unpin errors (it
   * reports only a failure to enter the device). */
  int tolerated = !strcmp(call, "cuPointerGetAttribute") || (!strcmp(path, "trim") && st == FERRY_OK);
  if (tolerated) {
    if (st != FERRY_OK) CASE_FAILS("returned %s: %s", ferry_status_name(st), err.message);
    if (t) {
      long long bad = check(r, h2d, 0, ta, t);
      if (bad) CASE_FAILS("the transfer succeeded but %lld bytes are wrong", bad);
      ferry_transfer_release(t);
      t = NULL;
    }
  } else {
    if (st == FERRY_OK) CASE_FAILS("the failure was not reported");
    if (t) CASE_FAILS("a ticket came back with the error");
    if (!strstr(err.call, call) || !strstr(err.message, call))
      CASE_FAILS("the error does not name %s (call \"%s\", message \"%s\")", call, err.call, err.message);
    if (err.cu_result != INJECTED) CASE_FAILS("cu_result %d, expected %d", err.cu_result, (int)INJECTED);
  }
  drain(r->dev);
  ferry_pool_stats_get(&after);
  long long mem_after = devmem_now(r->dev);
  if (after.bytes_in_use != before.bytes_in_use)
    CASE_FAILS("the pool holds %llu bytes in use (before: %llu)", (unsigned long long)after.bytes_in_use,
               (unsigned long long)before.bytes_in_use);
  if (mem_after != mem_before) CASE_FAILS("device memory in use: %lld bytes (before: %lld)", mem_after, mem_before);
  /* The thread's streams and the pool stay usable: the next transfers (both directions, other data) are exact. */
  for (int dir = 0; dir < 2; dir++) {
    batch(r, dir, 1, tb);
    st = submit(r->dev, dir, tb, &t);
    if (st != FERRY_OK) CASE_FAILS("the next %s failed: %s", dir ? "H2D" : "D2H", ferry_last_error_message());
    long long bad = check(r, dir, 1, tb, t);
    if (bad) CASE_FAILS("the next %s is wrong in %lld bytes", dir ? "H2D" : "D2H", bad);
    ferry_transfer_release(t);
    t = NULL;
  }
  drain(r->dev);
  ferry_pool_stats_get(&after);
  if (after.bytes_in_use != before.bytes_in_use) CASE_FAILS("the pool holds memory after the next transfers");
  if (devmem_now(r->dev) != mem_before) CASE_FAILS("device memory grew after the next transfers");
  snprintf(why, why_size, "%s", tolerated ? "tolerated, exact" : err.message);
  return CASE_CLEAN;
#undef CASE_FAILS
}

/* ---- a case in a fresh process ------------------------------------------------------------------------------- */

int stress_fault_case(int dev, const char *spec) {
  char path[16], call[64];
  int nth = 0;
  if (sscanf(spec, "%15[^:]:%63[^:]:%d", path, call, &nth) != 3 || nth < 1) {
    printf("bad --fault-case %s (PATH:CALL:NTH)\n", spec);
    return 1;
  }
  rig r;
  if (!rig_setup(&r, dev)) {
    printf("CASE %s %s %d harness-failed\n", path, call, nth);
    return 1;
  }
  char why[600];
  int rc = run_case(&r, path, call, nth, 1, why, sizeof why);
  printf("CASE %s %s %d %s %s\n", path, call, nth,
         rc == CASE_CLEAN ? "clean" : rc == CASE_NOT_REACHED ? "not-reached" : "FAIL", why);
  fflush(stdout);
  _exit(rc); /* no teardown: the process ends here */
}

/* Runs `spec` in a fresh process; returns its exit code and copies its verdict line into `line`. */
static int spawn_case(const char *spec, char *line, size_t line_size) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return -1;
  self[n] = '\0';
  char *argv[] = {self, "--fault-case", (char *)spec, stress_simulated ? "--simulate" : NULL, NULL};
  pid_t pid;
  fflush(stdout);
  int err = posix_spawn(&pid, self, &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  if (err) {
    close(fds[0]);
    return -1;
  }
  char buf[2048];
  size_t got = 0;
  ssize_t k;
  while ((k = read(fds[0], buf + got, sizeof buf - 1 - got)) > 0) got += (size_t)k;
  buf[got] = '\0';
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  char *c = strstr(buf, "CASE ");
  snprintf(line, line_size, "%.600s", c ? c + 5 : buf);
  line[strcspn(line, "\n")] = '\0';
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* ---- the matrix ---------------------------------------------------------------------------------------------- */

typedef struct row_result { int cases, clean, failed; char first_failure[300]; } row_result;

static void note(row_result *res, int rc, int nth, const char *why) {
  if (rc == CASE_NOT_REACHED) return;
  res->cases++;
  if (rc == CASE_CLEAN) {
    res->clean++;
    return;
  }
  if (!res->failed++) snprintf(res->first_failure, sizeof res->first_failure, "use %d: %.280s", nth, why);
}

static void print_row(const char *path, const char *call, const char *where, const row_result *res, int *failures,
                      int expect_reached) {
  const char *verdict = res->failed ? "FAIL" : res->cases ? "ok" : expect_reached ? "FAIL (never called)" : "-";
  if (!res->cases && expect_reached) (*failures)++;
  *failures += res->failed;
  printf("  %-7s %-26s %-9s %5d %6d  %s%s%s\n", path, call, where, res->cases, res->clean, verdict,
         res->failed ? ": " : "", res->failed ? res->first_failure : "");
}

int stress_faults(int dev, int verbose) {
  const char *batch_call = ferry__drv.cuMemcpyBatchAsync_v13   ? "cuMemcpyBatchAsync_v13"
                           : ferry__drv.cuMemcpyBatchAsync_v12 ? "cuMemcpyBatchAsync_v12"
                                                               : NULL;
  static const char *const per_transfer[] = {"cuCtxPushCurrent", "cuPointerGetAttribute", "cuEventCreate",
                                             "cuEventRecord", "cuStreamWaitEvent", "cuMemHostRegister",
                                             "cuMemAllocFromPoolAsync", "cuMemcpyHtoDAsync", "cuLaunchKernel",
                                             "cuMemcpyAsync", "cuMemFreeAsync", "BATCH", "cuEventSynchronize"};
  static const char *const once[] = {"cuDevicePrimaryCtxRetain", "cuStreamCreate", "cuMemPoolCreate",
                                     "cuMemPoolSetAttribute", "cuModuleLoadData", "cuModuleGetFunction"};
  rig r;
  if (!rig_setup(&r, dev)) {
    printf("transfer faults: the harness could not set up on cuda:%d\n", dev);
    return 1;
  }
  /* Warm up: the one-time work happens here, so the in-process cases see only per-transfer calls. */
  for (int dir = 0; dir < 2; dir++) {
    ferry_tensor t[N];
    ferry_transfer *tr = NULL;
    batch(&r, dir, 1, t);
    if (submit(dev, dir, t, &tr) != FERRY_OK || check(&r, dir, 1, t, tr) != 0) {
      printf("transfer faults: the unfaulted %s is not exact: %s\n", dir ? "H2D" : "D2H",
             ferry_last_error_message());
      return 1;
    }
    ferry_transfer_release(tr);
  }
  printf("transfer faults on cuda:%d%s: each call fails at each of its uses (%s injected)\n", dev,
         stress_simulated ? " [simulated driver]" : "", ferry__cu_name(INJECTED));
  printf("  %-7s %-26s %-9s %5s %6s  %s\n", "path", "call", "process", "cases", "clean", "verdict");
  int failures = 0;
  char why[600];
  static const char *const paths[2] = {"d2h", "h2d"};
  for (int p = 0; p < 2; p++) {
    for (size_t c = 0; c < sizeof per_transfer / sizeof *per_transfer; c++) {
      const char *call = strcmp(per_transfer[c], "BATCH") ? per_transfer[c] : batch_call;
      if (!call) continue;
      row_result res = {0, 0, 0, ""};
      for (int nth = 1; nth <= 16; nth++) {
        int rc = run_case(&r, paths[p], call, nth, 0, why, sizeof why);
        if (verbose) printf("    %s %s %d: %s\n", paths[p], call, nth, why);
        if (rc == CASE_NOT_REACHED) break;
        note(&res, rc, nth, why);
      }
      /* Every call is on both paths, but: D2H never asks whether memory is pinned, and H2D copies with
       * cuMemcpyAsync only without the batch API (its device-to-device gather needs none). */
      int expected = !(p == 0 && !strcmp(call, "cuPointerGetAttribute")) &&
                     !(p == 1 && !strcmp(call, "cuMemcpyAsync") && batch_call);
      print_row(paths[p], call, "this", &res, &failures, expected);
    }
    for (size_t c = 0; c < sizeof once / sizeof *once; c++) {
      row_result res = {0, 0, 0, ""};
      for (int nth = 1; nth <= 2; nth++) {
        char spec[128], line[700];
        snprintf(spec, sizeof spec, "%s:%s:%d", paths[p], once[c], nth);
        int rc = spawn_case(spec, line, sizeof line);
        if (verbose) printf("    %s -> %d: %s\n", spec, rc, line);
        if (rc == CASE_NOT_REACHED) break;
        note(&res, rc == CASE_CLEAN ? CASE_CLEAN : CASE_FAIL, nth, line);
      }
      print_row(paths[p], once[c], "fresh", &res, &failures, 1);
    }
  }
  /* The pool's own calls: reserve (pin) and trim (unpin, whose errors ferry ignores: the next transfer must still
   * pin and be exact). */
  static const char *const pool_calls[][2] = {{"reserve", "cuCtxPushCurrent"}, {"reserve", "cuMemHostRegister"},
                                              {"trim", "cuCtxPushCurrent"},    {"trim", "cuMemHostUnregister"},
                                              {"trim", "cuEventDestroy"}};
  for (size_t c = 0; c < sizeof pool_calls / sizeof *pool_calls; c++) {
    row_result res = {0, 0, 0, ""};
    for (int nth = 1; nth <= 4; nth++) {
      int rc = run_case(&r, pool_calls[c][0], pool_calls[c][1], nth, 0, why, sizeof why);
      if (verbose) printf("    %s %s %d: %s\n", pool_calls[c][0], pool_calls[c][1], nth, why);
      if (rc == CASE_NOT_REACHED) break;
      note(&res, rc, nth, why);
    }
    print_row(pool_calls[c][0], pool_calls[c][1], "this", &res, &failures, 1);
  }
  printf("faults: %d failure(s)\nRESULT: %s\n", failures, failures ? "FAIL" : "PASS");
  raw_free(r.src[0]);
  raw_free(r.src[1]);
  return failures;
}
