/* probe_pinning: measure ways to obtain pinned host memory on this machine.
 *
 * One-off design probe for ferry's pinned pool (not part of the library): for each strategy it pins a fresh
 * buffer, D2H-copies into it once, and prints the pin time and the copy bandwidth. Build:
 *   cc -O2 -pthread tools/probe_pinning.c -I/usr/local/cuda/include -lcuda -o probe_pinning
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { const char *s_; cuGetErrorName(r_, &s_); \
    printf("  %s -> %s\n", #x, s_); return -1; } } while (0)

static double now_ms(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e3 + t.tv_nsec / 1e6; }

struct touch { char *p; size_t n, step; };
static void *touch_range(void *a) { struct touch *t = a; for (size_t i = 0; i < t->n; i += t->step) t->p[i] = 0; return NULL; }
static void touch_par(char *p, size_t n, int threads, size_t step) {
  pthread_t th[64]; struct touch tt[64]; size_t chunk = (n / threads + 4095) & ~(size_t)4095;
  for (int i = 0; i < threads; i++) { size_t off = chunk * i; tt[i].p = p + off; tt[i].n = off < n ? (n - off < chunk ? n - off : chunk) : 0; tt[i].step = step;
    pthread_create(&th[i], NULL, touch_range, &tt[i]); }
  for (int i = 0; i < threads; i++) pthread_join(th[i], NULL);
}

static CUdeviceptr src; static CUstream st;
static int copy_check(void *h, size_t n, double *gbs) {
  CUevent a, b; CK(cuEventCreate(&a, 0)); CK(cuEventCreate(&b, 0));
  CK(cuEventRecord(a, st)); CK(cuMemcpyDtoHAsync(h, src, n, st)); CK(cuEventRecord(b, st)); CK(cuStreamSynchronize(st));
  float ms; CK(cuEventElapsedTime(&ms, a, b)); *gbs = n / (ms * 1e6);
  cuEventDestroy(a); cuEventDestroy(b); return 0;
}

/* Bytes of [p, p+n) backed by transparent huge pages: the AnonHugePages of the mappings inside it (smaps). */
static size_t huge_backed(void *p, size_t n) {
  FILE *f = fopen("/proc/self/smaps", "r");
  if (!f) return 0;
  char line[512]; unsigned long lo = 0, hi = 0; size_t total = 0;
  while (fgets(line, sizeof line, f)) {
    unsigned long a, b; size_t kb;
    if (sscanf(line, "%lx-%lx ", &a, &b) == 2) { lo = a; hi = b; continue; }
    if (sscanf(line, "AnonHugePages: %zu kB", &kb) == 1 && lo >= (unsigned long)p && hi <= (unsigned long)p + n)
      total += kb << 10;
  }
  fclose(f);
  return total;
}

static void report(const char *name, size_t n, double pin_ms, void *h, double free_ms_unused) {
  double g = 0; copy_check(h, n, &g);
  (void)free_ms_unused;
  printf("%-40s %6zu MiB  pin %8.2f ms  (%.2f GB/s pinned)  first D2H %5.1f GB/s\n", name, n >> 20, pin_ms, n / (pin_ms * 1e6), g);
}

static int strategy(int which, size_t n) {
  double t0 = now_ms(); void *h = NULL; char name[64];
  switch (which) {
  case 0: snprintf(name, sizeof name, "cuMemHostAlloc"); CK(cuMemHostAlloc(&h, n, 0)); break;
  default: {
    int threads = 1, huge = 0, touch = 1, populate = 0;
    if (which == 1) touch = 0;
    if (which == 2) { touch = 0; huge = 1; }
    if (which >= 3 && which <= 6) threads = (int[]){1, 4, 8, 16}[which - 3];
    if (which >= 7 && which <= 9) { huge = 1; threads = (int[]){1, 4, 16}[which - 7]; }
    if (which == 10) { touch = 0; populate = 1; }
    snprintf(name, sizeof name, "%s%s%s+register t=%d", populate ? "mmap-populate" : "mmap", huge ? "+THP" : "",
             touch ? "+touch" : "", threads);
    h = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | (populate ? MAP_POPULATE : 0), -1, 0);
    if (h == MAP_FAILED) { printf("mmap failed\n"); return -1; }
    if (huge) madvise(h, n, MADV_HUGEPAGE);
    if (touch) touch_par(h, n, threads, 4096);
    double t1 = now_ms();
    CK(cuMemHostRegister(h, n, 0));
    printf("%-40s           mmap+touch %8.2f ms, register %8.2f ms\n", "", t1 - t0, now_ms() - t1);
  } }
  double pin = now_ms() - t0;
  report(name, n, pin, h, 0);
  printf("%-40s           huge pages back %5.1f%% of it\n", "", 100.0 * huge_backed(h, n) / (double)n);
  double f0 = now_ms();
  if (which == 0) cuMemFreeHost(h); else { cuMemHostUnregister(h); munmap(h, n); }
  printf("%-40s           free %8.2f ms\n", "", now_ms() - f0);
  return 0;
}

/* Whether cuMemHostRegister scales with threads: `regions` fresh THP regions of `n` bytes, faulted in by 16 threads
 * (timed apart), then registered by `threads` threads at once, each taking every threads-th region. */
struct reg_job { char **base; size_t n; int first, step, regions; int failed; };
static CUcontext probe_ctx;
static void *register_some(void *a) {
  struct reg_job *j = a;
  cuCtxSetCurrent(probe_ctx); /* a context is current per thread */
  for (int i = j->first; i < j->regions; i += j->step)
    if (cuMemHostRegister(j->base[i], j->n, 0) != CUDA_SUCCESS) j->failed = 1;
  return NULL;
}
static int parallel_register(size_t n, int regions, int threads) {
  char *base[64]; pthread_t th[64]; struct reg_job jobs[64];
  double t0 = now_ms();
  for (int i = 0; i < regions; i++) {
    base[i] = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base[i] == MAP_FAILED) { printf("mmap failed\n"); return -1; }
    madvise(base[i], n, MADV_HUGEPAGE);
    touch_par(base[i], n, 16, 4096);
  }
  double t1 = now_ms();
  for (int t = 0; t < threads; t++) {
    jobs[t] = (struct reg_job){base, n, t, threads, regions, 0};
    pthread_create(&th[t], NULL, register_some, &jobs[t]);
  }
  int failed = 0;
  for (int t = 0; t < threads; t++) { pthread_join(th[t], NULL); failed |= jobs[t].failed; }
  double t2 = now_ms(), gb = (double)n * regions / 1e9;
  printf("%2d x %4zu MiB: fault-in (16 threads) %8.2f ms (%5.1f GB/s); register on %d thread(s) %8.2f ms (%5.1f GB/s)%s\n",
         regions, n >> 20, t1 - t0, gb / ((t1 - t0) / 1e3), threads, t2 - t1, gb / ((t2 - t1) / 1e3),
         failed ? "  FAILED" : "");
  for (int i = 0; i < regions; i++) { cuMemHostUnregister(base[i]); munmap(base[i], n); }
  return failed ? -1 : 0;
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "--help")) {
    puts("usage: probe_pinning [MiB...]           strategies for each size (default 96 1024)\n"
         "       probe_pinning --register MiB N    N regions of MiB each, registered by 1, 2, 4 and 8 threads");
    return 0;
  }
  if (argc == 4 && !strcmp(argv[1], "--register")) {
    CK(cuInit(0)); CUdevice d; CK(cuDeviceGet(&d, 0)); CUcontext c; CK(cuDevicePrimaryCtxRetain(&c, d));
    CK(cuCtxSetCurrent(c));
    probe_ctx = c;
    int regions = atoi(argv[3]);
    if (regions < 1 || regions > 64) { puts("N: 1 to 64"); return 2; }
    parallel_register((size_t)atol(argv[2]) << 20, regions, 1); /* warm-up: the first registration pays extra */
    for (int threads = 1; threads <= 8; threads *= 2) parallel_register((size_t)atol(argv[2]) << 20, regions, threads);
    return 0;
  }
  CK(cuInit(0)); CUdevice d; CK(cuDeviceGet(&d, 0)); CUcontext c; CK(cuDevicePrimaryCtxRetain(&c, d)); CK(cuCtxSetCurrent(c));
  CK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
  size_t sizes[8]; int ns = 0;
  for (int i = 1; i < argc && ns < 8; i++) sizes[ns++] = (size_t)atol(argv[i]) << 20;
  if (!ns) { sizes[ns++] = 96u << 20; sizes[ns++] = (size_t)1 << 30; }
  size_t maxn = 2u << 20; /* the copy source: as large as the largest buffer probed */
  for (int s = 0; s < ns; s++) if (sizes[s] > maxn) maxn = sizes[s];
  CK(cuMemAlloc(&src, maxn)); CK(cuMemsetD8(src, 7, maxn));
  FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r"); char buf[256] = "?";
  if (f) { if (!fgets(buf, sizeof buf, f)) buf[0] = 0; fclose(f); }
  printf("THP: %s", buf); printf("cpus: %ld\n", sysconf(_SC_NPROCESSORS_ONLN));
  int drv; cuDriverGetVersion(&drv); printf("driver %d\n", drv);
  void *p13 = NULL, *p12 = NULL; CUdriverProcAddressQueryResult q;
  cuGetProcAddress("cuMemcpyBatchAsync", &p13, 13000, 0, &q); printf("batch@13000 %p q=%d\n", p13, q);
  cuGetProcAddress("cuMemcpyBatchAsync", &p12, 12080, 0, &q); printf("batch@12080 %p q=%d\n", p12, q);
  for (int s = 0; s < ns; s++)
    for (int w = 0; w <= 10; w++) strategy(w, sizes[s]);
  /* a small allocation: the fixed cost per pin call */
  for (int w = 0; w <= 1; w++) strategy(w, 2u << 20);
  return 0;
}
