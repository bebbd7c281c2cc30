/* stress.c — ferry_stress (tests in test_list_stress.h): load and soak on the GPU, plus the fault and fork checks.
 *
 * Load: T threads (16) each run N random batches (1000): a D2H batch of random device views — 1 to 256 tensors of
 * 1-, 2-, 4- or 8-byte elements (and float32x2), 1 B to 1 MiB each (log-uniform), compact, transposed, sliced
 * with a row pitch, reversed (negative stride), broadcast (zero stride), some misaligned, some empty, some host
 * tensors that must pass through — then an H2D batch of host views (the D2H outputs, which live in ferry's pinned
 * slab, and fresh views of pageable and of pinned memory, some marked CUDA_HOST). Options are random too:
 * blocking or asynchronous (waited or polled), the gather threshold, the batch API or the loop, the thread's copy
 * stream or the caller's, producer_stream or producer_event. Every D2H output is compared with the same view of a
 * host copy of the device data; every H2D output is downloaded with a raw cuMemcpyAsync and compared with its
 * source. A mismatch or an error fails the run.
 *
 * Soak (--seconds S): the same until S seconds have passed. In both modes a sampler records the pool (bytes pinned,
 * in use, peak) and the device memory in use every second; the run reports whether pinned and device bytes plateau
 * (growth over the second half below --plateau-tolerance) and fails a soak that does not.
 *
 * every_failing_driver_call_is_clean: real-driver fault injection (fault_gpu.c). fork_after_init_is_a_clear_error:
 * fork after initialisation (fork_gpu.c). --simulate: everything through the simulated driver of the CPU tests, to
 * check this program without a GPU.
 */
#include "stress.h"

#include "fake_driver.h"
#include "test.h"

#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

atomic_int gpu_failures; /* gpu_test.h's EXPECT counts here */
int stress_simulated;

/* ---- options ------------------------------------------------------------------------------------------------ */

typedef struct stress_opts {
  int threads, batches, max_count, verbose;
  double seconds, plateau_tolerance;
  size_t max_bytes;
  uint32_t seed;
  const char *csv;
} stress_opts;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static uint32_t rnd(uint32_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 17;
  *s ^= *s << 5;
  return *s;
}
/* Log-uniform in [lo, hi]: as many small sizes as large ones per decade. */
static uint64_t log_uniform(uint32_t *s, uint64_t lo, uint64_t hi) {
  double u = (double)rnd(s) / 4294967296.0;
  uint64_t v = (uint64_t)exp(log((double)lo) + u * (log((double)hi + 1) - log((double)lo)));
  return v < lo ? lo : v > hi ? hi : v;
}

/* ---- driver entries the test resolves itself ----------------------------------------------------------------- */

static void *cuda_sym(const char *name) {
  if (stress_simulated) return NULL;
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  return lib ? dlsym(lib, name) : NULL;
}

long long stress_device_used(void) {
  static CUresult (*mem_info)(size_t *, size_t *);
  if (!mem_info) mem_info = (CUresult(*)(size_t *, size_t *))cuda_sym("cuMemGetInfo_v2");
  size_t free_b = 0, total = 0;
  if (!mem_info || mem_info(&free_b, &total) != CUDA_SUCCESS) return -1;
  return (long long)(total - free_b);
}

long long stress_devmem_pool_used(int dev) {
  static CUresult (*get_attr)(CUmemoryPool, CUmemPool_attribute, void *);
  if (!get_attr) get_attr = (CUresult(*)(CUmemoryPool, CUmemPool_attribute, void *))cuda_sym("cuMemPoolGetAttribute");
  CUmemoryPool pool = ferry__devmem_pool(dev);
  if (!pool) return 0; /* ferry has not made its pool yet: it holds no device memory */
  cuuint64_t used = 0;
  if (!get_attr || get_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used) != CUDA_SUCCESS) return -1;
  return (long long)used;
}

/* ---- views --------------------------------------------------------------------------------------------------- */

enum { ARENA = 64 << 20, PINNED_ARENA = 16 << 20 };

/* A view: where it starts (element [0,...,0], bytes from the arena's base), its shape and strides (elements). */
typedef struct view {
  int ndim;
  uint8_t bits;
  uint16_t lanes;
  int64_t shape[3], strides[3];
  int64_t first; /* byte offset of element [0,..] from the arena base */
  size_t eb;
} view;

/* Elements a view covers, and the lowest and highest byte offsets (relative to `first`) it reads. */
static int64_t view_elems(const view *v) {
  int64_t n = 1;
  for (int d = 0; d < v->ndim; d++) n *= v->shape[d];
  return n;
}
static void view_reach(const view *v, int64_t *lo, int64_t *hi) {
  *lo = 0, *hi = 0;
  for (int d = 0; d < v->ndim; d++) {
    int64_t r = (v->shape[d] - 1) * v->strides[d] * (int64_t)v->eb;
    if (r < 0) *lo += r; else *hi += r;
  }
  *hi += (int64_t)v->eb;
}

/* A random view over an arena of `arena_bytes`: see the file comment for the mix. */
static view random_view(uint32_t *s, size_t max_bytes, size_t arena_bytes) {
  static const uint8_t widths[4] = {8, 16, 32, 64};
  view v;
  memset(&v, 0, sizeof v);
  uint32_t r = rnd(s);
  v.bits = widths[r % 4];
  v.lanes = 1;
  if (r % 16 == 5) v.bits = 32, v.lanes = 2;
  v.eb = (size_t)v.bits * v.lanes / 8;
  int64_t elems = (r >> 4) % 20 == 0 ? 0 : (int64_t)(log_uniform(s, v.eb, max_bytes) / v.eb);
  if (elems == 0 && (r >> 4) % 20 != 0) elems = 1;
  int kind = (int)(rnd(s) % 20);
  if (elems >= 4 && kind < 4) { /* transposed: [R, C] over a compact [C, R] block */
    int64_t R = 2 + (int64_t)(rnd(s) % 63), C = elems / R > 0 ? elems / R : 1;
    v.ndim = 2, v.shape[0] = R, v.shape[1] = C, v.strides[0] = 1, v.strides[1] = R;
  } else if (elems >= 4 && kind < 7) { /* sliced: rows of C elements at a pitch of C + p */
    int64_t A = 1 + (int64_t)(rnd(s) % 4), B = 1 + (int64_t)(rnd(s) % 16), p = 1 + (int64_t)(rnd(s) % 7);
    int64_t C = elems / (A * B) > 0 ? elems / (A * B) : 1;
    v.ndim = 3, v.shape[0] = A, v.shape[1] = B, v.shape[2] = C;
    v.strides[2] = 1, v.strides[1] = C + p, v.strides[0] = B * (C + p);
  } else if (elems >= 2 && kind == 7) { /* reversed */
    v.ndim = 1, v.shape[0] = elems, v.strides[0] = -1;
  } else if (elems >= 2 && kind == 8) { /* broadcast: k copies of one row */
    int64_t k = 1 + (int64_t)(rnd(s) % 8), m = elems / k > 0 ? elems / k : 1;
    v.ndim = 2, v.shape[0] = k, v.shape[1] = m, v.strides[0] = 0, v.strides[1] = 1;
  } else { /* compact, rank 1 to 3 */
    int64_t a = 1 + (int64_t)(rnd(s) % 8);
    if (elems % a == 0 && kind % 2) v.ndim = 2, v.shape[0] = a, v.shape[1] = elems / a;
    else v.ndim = 1, v.shape[0] = elems;
    for (int d = v.ndim - 1, st = 1; d >= 0; st *= (int)v.shape[d], d--) v.strides[d] = st;
  }
  int64_t lo, hi;
  view_reach(&v, &lo, &hi);
  if (elems == 0) lo = 0, hi = 0;
  size_t span = (size_t)(hi - lo), room = arena_bytes - span - 16;
  size_t off = (size_t)rnd(s) % (room ? room : 1) / v.eb * v.eb;
  if (v.eb > 1 && rnd(s) % 16 == 0) off += 1; /* misaligned for its element width */
  v.first = (int64_t)off - lo;
  return v;
}

static ferry_tensor tensor_of(const view *v, void *arena, int32_t device_type, int device_id) {
  ferry_tensor t = {arena, {device_type, device_id}, v->ndim, {FERRY_DTYPE_UINT, v->bits, v->lanes},
                    (int64_t *)v->shape, (int64_t *)v->strides, (uint64_t)v->first};
  return t;
}

/* Whether the compact bytes `got` equal view `v` of host memory `base`; rows with unit stride are compared with
 * one memcmp. */
static int view_equal(const view *v, const char *base, const char *got) {
  int64_t n = view_elems(v);
  if (n == 0) return 1;
  int last = v->ndim - 1;
  int64_t row = v->shape[last], rows = n / row, idx[3] = {0, 0, 0};
  for (int64_t k = 0; k < rows; k++) {
    int64_t off = 0;
    for (int d = 0; d < last; d++) off += idx[d] * v->strides[d];
    const char *src = base + v->first + off * (int64_t)v->eb;
    const char *dst = got + k * row * (int64_t)v->eb;
    if (v->strides[last] == 1) {
      if (memcmp(src, dst, (size_t)row * v->eb) != 0) return 0;
    } else {
      for (int64_t e = 0; e < row; e++)
        if (memcmp(src + e * v->strides[last] * (int64_t)v->eb, dst + e * (int64_t)v->eb, v->eb) != 0) return 0;
    }
    for (int d = last - 1; d >= 0 && ++idx[d] == v->shape[d]; d--) idx[d] = 0;
  }
  return 1;
}

/* ---- one thread's work --------------------------------------------------------------------------------------- */

typedef struct worker {
  const stress_opts *opt;
  int dev, id;
  uint32_t rng;
  char *host;         /* random bytes; the device arena holds the same */
  CUdeviceptr device; /* ARENA bytes on the device */
  char *pinned;       /* random bytes, pinned (H2D sources the gather kernel reads over PCIe) */
  size_t pinned_bytes;
  char *verify;       /* pinned download buffer for H2D outputs */
  size_t verify_bytes;
  CUstream stream;    /* the thread's own stream: producer, explicit copy stream, downloads */
  CUevent event;
  /* results */
  uint64_t batches, tensors, d2h_bytes, h2d_bytes, mismatches, errors;
  char first_error[400];
} worker;

static atomic_int stop_flag;
static atomic_ullong batches_done;
static double deadline;

/* Counts a mismatch; with --verbose, describes the first few. */
static void mismatch(worker *w, const char *dir, size_t batch, size_t i, const view *v, const ferry_tensor *in) {
  if (w->mismatches++ < 5 && w->opt->verbose)
    printf("  mismatch: thread %d batch %zu %s tensor %zu: ndim %d shape [%lld %lld %lld] strides [%lld %lld %lld] "
           "eb %zu first %lld, device %d, data %p\n", w->id, batch, dir, i, v->ndim, (long long)v->shape[0],
           (long long)v->shape[1], (long long)v->shape[2], (long long)v->strides[0], (long long)v->strides[1],
           (long long)v->strides[2], v->eb, (long long)v->first, in->device.device_type, in->data);
}

static void fail(worker *w, const char *what, size_t batch) {
  if (!w->errors++)
    snprintf(w->first_error, sizeof w->first_error, "thread %d batch %zu, %s: %s (%s)", w->id, batch, what,
             ferry_last_error_message(), ferry_status_name(ferry_last_error()->status));
}

static ferry_transfer_options random_options(worker *w) {
  static const uint64_t gmax[4] = {0, 4096, 65536, 1 << 20};
  ferry_transfer_options o;
  ferry_transfer_options_init(&o);
  uint32_t r = rnd(&w->rng);
  o.device = w->dev;
  o.flags = (r & 1 ? FERRY_TRANSFER_BLOCKING : 0) | ((r >> 1) % 8 == 0 ? FERRY_TRANSFER_NO_BATCH_API : 0);
  o.gather_max_bytes = gmax[(r >> 4) % 4];
  switch ((r >> 6) % 8) {
  case 0: o.stream = w->stream; break;          /* the caller's stream (producer is then the legacy stream) */
  case 1: o.producer_stream = w->stream; break; /* order after the caller's stream */
  case 2:
    if (FERRY_CU(cuEventRecord, w->event, w->stream) == CUDA_SUCCESS) o.producer_event = w->event;
    break;
  default: break;
  }
  return o;
}

/* Waits for a non-blocking ticket: by ferry_transfer_wait, or by polling ferry_transfer_query. */
static ferry_status finish(worker *w, ferry_transfer *t, const ferry_transfer_options *o) {
  if (o->flags & FERRY_TRANSFER_BLOCKING) return FERRY_OK;
  if (rnd(&w->rng) % 2) return ferry_transfer_wait(t);
  ferry_status st;
  while ((st = ferry_transfer_query(t)) == FERRY_NOT_READY) {
  }
  return st;
}

static void one_batch(worker *w, size_t b) {
  const stress_opts *opt = w->opt;
  size_t n = (size_t)log_uniform(&w->rng, 1, (uint64_t)opt->max_count);
  view *dv = calloc(n, sizeof *dv), *hv = calloc(n, sizeof *hv), *ev = calloc(n, sizeof *ev);
  ferry_tensor *din = calloc(n, sizeof *din), *hin = calloc(n, sizeof *hin);
  char **hbase = calloc(n, sizeof *hbase), **ebase = calloc(n, sizeof *ebase);
  int *host_pass = calloc(n, sizeof *host_pass);
  ferry_transfer *down = NULL, *up = NULL;
  /* D2H: device views (a few host views mixed in, which must pass through). */
  for (size_t i = 0; i < n; i++) {
    dv[i] = random_view(&w->rng, opt->max_bytes, ARENA);
    host_pass[i] = rnd(&w->rng) % 12 == 0;
    din[i] = host_pass[i] ? tensor_of(&dv[i], w->host, FERRY_DEVICE_CPU, 0)
                          : tensor_of(&dv[i], (void *)(uintptr_t)w->device, FERRY_DEVICE_CUDA, w->dev);
  }
  ferry_transfer_options o = random_options(w);
  if (ferry_transfer_d2h(din, n, &o, &down) != FERRY_OK) {
    fail(w, "ferry_transfer_d2h", b);
    goto out;
  }
  if (finish(w, down, &o) != FERRY_OK) {
    fail(w, "waiting for the D2H batch", b);
    goto out;
  }
  const ferry_tensor *dout = ferry_transfer_outputs(down);
  for (size_t i = 0; i < n; i++) {
    if (host_pass[i]) {
      if (dout[i].data != din[i].data || ferry_transfer_output_copied(down, i))
        mismatch(w, "D2H pass-through", b, i, &dv[i], &din[i]);
      continue;
    }
    if (!view_equal(&dv[i], w->host, dout[i].data)) mismatch(w, "D2H", b, i, &dv[i], &din[i]);
    w->d2h_bytes += (uint64_t)view_elems(&dv[i]) * dv[i].eb;
  }
  /* H2D: each input is the D2H output (pinned, compact), or a fresh view of pageable or of pinned memory. */
  size_t need = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t pick = rnd(&w->rng) % 4;
    if (pick < 2 && !host_pass[i]) {
      hv[i] = dv[i];
      hv[i].first = 0;
      for (int d = hv[i].ndim - 1, st = 1; d >= 0; st *= (int)hv[i].shape[d], d--) hv[i].strides[d] = st;
      hbase[i] = dout[i].data;
      hin[i] = tensor_of(&hv[i], hbase[i], FERRY_DEVICE_CPU, 0);
      /* Expected: the device view's reference bytes, not the slab, which may go back to the pool below. */
      ev[i] = dv[i], ebase[i] = w->host;
    } else {
      int pinned = pick == 3;
      hv[i] = random_view(&w->rng, opt->max_bytes, pinned ? PINNED_ARENA : ARENA);
      hbase[i] = pinned ? w->pinned : w->host;
      hin[i] = tensor_of(&hv[i], hbase[i], pinned && rnd(&w->rng) % 2 ? FERRY_DEVICE_CUDA_HOST : FERRY_DEVICE_CPU, 0);
      ev[i] = hv[i], ebase[i] = hbase[i];
    }
    need += (size_t)view_elems(&hv[i]) * hv[i].eb + 256;
  }
  o = random_options(w);
  if (ferry_transfer_h2d(hin, n, &o, &up) != FERRY_OK) {
    fail(w, "ferry_transfer_h2d", b);
    goto out;
  }
  if (finish(w, up, &o) != FERRY_OK) {
    fail(w, "waiting for the H2D batch", b);
    goto out;
  }
  /* The D2H outputs were the sources of some H2D copies, done now: the D2H slab may go back early, sometimes
   * before the H2D ticket, sometimes after. */
  if (rnd(&w->rng) % 2) {
    ferry_transfer_release(down);
    down = NULL;
  }
  if (need > w->verify_bytes) {
    if (w->verify) ferry__unpin(w->verify, w->verify_bytes);
    w->verify = NULL;
    if (ferry__pin(need * 2, (void **)&w->verify, &w->verify_bytes) != FERRY_OK) {
      fail(w, "pinning the download buffer", b);
      w->verify_bytes = 0;
      goto out;
    }
  }
  const ferry_tensor *uout = ferry_transfer_outputs(up);
  size_t at = 0;
  for (size_t i = 0; i < n; i++) {
    size_t bytes = (size_t)view_elems(&hv[i]) * hv[i].eb;
    if (bytes && FERRY_CU(cuMemcpyAsync, (CUdeviceptr)(uintptr_t)(w->verify + at),
                          (CUdeviceptr)(uintptr_t)uout[i].data, bytes, w->stream) != CUDA_SUCCESS) {
      fail(w, "downloading an H2D output", b);
      goto out;
    }
    at += bytes + 256;
  }
  if (FERRY_CU(cuStreamSynchronize, w->stream) != CUDA_SUCCESS) {
    fail(w, "synchronising the downloads", b);
    goto out;
  }
  at = 0;
  for (size_t i = 0; i < n; i++) {
    size_t bytes = (size_t)view_elems(&hv[i]) * hv[i].eb;
    if (!view_equal(&ev[i], ebase[i], w->verify + at)) mismatch(w, "H2D", b, i, &hv[i], &hin[i]);
    w->h2d_bytes += bytes;
    at += bytes + 256;
  }
  w->tensors += n;
out:
  ferry_transfer_release(up);
  ferry_transfer_release(down);
  free(dv), free(hv), free(ev), free(din), free(hin), free(hbase), free(ebase), free(host_pass);
  w->batches++;
  atomic_fetch_add(&batches_done, 1);
}

static void *run_worker(void *arg) {
  worker *w = arg;
  if (ferry__ctx_enter(w->dev) != FERRY_OK) {
    fail(w, "entering the device", 0);
    return NULL;
  }
  /* The arenas: random host bytes, the same bytes on the device, random pinned bytes. */
  w->host = malloc(ARENA);
  for (size_t k = 0; k < ARENA; k += 4) {
    uint32_t r = rnd(&w->rng);
    memcpy(w->host + k, &r, 4);
  }
  if (ferry__devmem_alloc(w->dev, ARENA, NULL, &w->device) != FERRY_OK ||
      FERRY_CU(cuStreamCreate, &w->stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS ||
      FERRY_CU(cuEventCreate, &w->event, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS ||
      FERRY_CU(cuStreamSynchronize, NULL) != CUDA_SUCCESS ||
      FERRY_CU(cuMemcpyHtoDAsync, w->device, w->host, ARENA, w->stream) != CUDA_SUCCESS ||
      FERRY_CU(cuStreamSynchronize, w->stream) != CUDA_SUCCESS ||
      ferry__pin(PINNED_ARENA, (void **)&w->pinned, &w->pinned_bytes) != FERRY_OK) {
    fail(w, "setting up the thread's arenas", 0);
    ferry__ctx_leave();
    return NULL;
  }
  for (size_t k = 0; k < PINNED_ARENA; k++) w->pinned[k] = (char)rnd(&w->rng);
  for (size_t b = 0; !atomic_load(&stop_flag); b++) {
    if (w->opt->seconds > 0 ? now_s() >= deadline : b >= (size_t)w->opt->batches) break;
    one_batch(w, b);
  }
  (void)FERRY_CU(cuStreamSynchronize, w->stream);
  (void)FERRY_CU(cuMemFreeAsync, w->device, w->stream);
  (void)FERRY_CU(cuStreamSynchronize, w->stream);
  (void)FERRY_CU(cuEventDestroy, w->event);
  (void)FERRY_CU(cuStreamDestroy, w->stream);
  ferry__unpin(w->pinned, w->pinned_bytes);
  if (w->verify) ferry__unpin(w->verify, w->verify_bytes);
  free(w->host);
  ferry__ctx_leave();
  return NULL;
}

/* ---- the sampler --------------------------------------------------------------------------------------------- */

typedef struct sample {
  double t;
  uint64_t batches, pinned, in_use, peak_in_use, pins;
  long long device_used, pool_used;
} sample;

typedef struct sampler {
  int dev;
  double t0;
  sample *s;
  size_t n, cap;
} sampler;

static void take_sample(sampler *sm) {
  if (sm->n == sm->cap) {
    sm->cap = sm->cap ? 2 * sm->cap : 256;
    sm->s = realloc(sm->s, sm->cap * sizeof *sm->s);
  }
  ferry_pool_stats ps;
  ferry_pool_stats_get(&ps);
  sample *x = &sm->s[sm->n++];
  x->t = now_s() - sm->t0;
  x->batches = atomic_load(&batches_done);
  x->pinned = ps.bytes_pinned, x->in_use = ps.bytes_in_use, x->peak_in_use = ps.bytes_peak_in_use;
  x->pins = ps.pin_calls;
  x->device_used = stress_device_used();
  x->pool_used = stress_devmem_pool_used(sm->dev);
}

static atomic_int sampler_stop;
static void *run_sampler(void *arg) {
  sampler *sm = arg;
  if (ferry__ctx_enter(sm->dev) != FERRY_OK) return NULL;
  double next = sm->t0 + 1.0, report = sm->t0 + 10.0;
  while (!atomic_load(&sampler_stop)) {
    usleep(20000);
    double t = now_s();
    if (t < next) continue;
    next += 1.0;
    take_sample(sm);
    if (t >= report) {
      report += 10.0;
      const sample *x = &sm->s[sm->n - 1];
      fprintf(stderr, "  %5.0f s: %llu batches, pinned %.0f MiB, in use %.0f MiB, device used %.0f MiB\n", x->t,
              (unsigned long long)x->batches, (double)x->pinned / (1 << 20), (double)x->in_use / (1 << 20),
              x->device_used < 0 ? -1.0 : (double)x->device_used / (1 << 20));
    }
  }
  ferry__ctx_leave();
  return NULL;
}

/* Growth of a series over the second half of the run, relative to its final value. */
static double growth(const sampler *sm, int which) {
  if (sm->n < 4) return 0;
  const sample *mid = &sm->s[sm->n / 2], *end = &sm->s[sm->n - 1];
  double a = which == 0 ? (double)mid->pinned : (double)mid->device_used;
  double z = which == 0 ? (double)end->pinned : (double)end->device_used;
  return z > 0 ? (z - a) / z : 0;
}

/* ---- the suite (test_list_stress.h) -------------------------------------------------------------------------- */

static stress_opts opt = {16, 1000, 256, 0, 0, 0.05, (size_t)1 << 20, 0x5eed1234u, NULL};

int stress_option(int argc, char **argv, int i) {
  const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
  if (!strcmp(a, "--simulate")) return stress_simulated = 1;
  if (!strcmp(a, "--verbose")) return opt.verbose = 1;
  static const char *const valued[] = {"--threads", "--batches", "--seconds", "--max-count", "--max-bytes", "--seed",
                                       "--plateau-tolerance", "--csv"};
  size_t k = 0;
  while (k < sizeof valued / sizeof *valued && strcmp(a, valued[k])) k++;
  if (k == sizeof valued / sizeof *valued) return 0;
  if (!v) {
    fprintf(stderr, "%s needs a value\n", a);
    return -1;
  }
  if (!strcmp(a, "--threads")) opt.threads = atoi(v);
  else if (!strcmp(a, "--batches")) opt.batches = atoi(v);
  else if (!strcmp(a, "--seconds")) opt.seconds = atof(v);
  else if (!strcmp(a, "--max-count")) opt.max_count = atoi(v);
  else if (!strcmp(a, "--max-bytes")) opt.max_bytes = (size_t)atoll(v);
  else if (!strcmp(a, "--seed")) opt.seed = (uint32_t)strtoul(v, NULL, 0);
  else if (!strcmp(a, "--plateau-tolerance")) opt.plateau_tolerance = atof(v);
  else opt.csv = v;
  if (opt.threads < 1 || opt.threads > 256 || opt.max_count < 1 || opt.max_bytes < 8 ||
      opt.max_bytes > (size_t)ARENA / 4 || opt.seed == 0) {
    fprintf(stderr, "bad options: threads 1..256, max-count >= 1, max-bytes 8..%d, seed != 0\n", ARENA / 4);
    return -1;
  }
  /* A soak runs as long as it is asked to, and then reports: the per-test limit must not cut it short. */
  if (opt.seconds > 0 && test_timeout_s > 0 && test_timeout_s < opt.seconds + 300)
    test_timeout_s = (int)opt.seconds + 300;
  return 2;
}

/* The processes the tests spawn: one fault case (--fault-case SPEC [--simulate]), or case 2 of the fork check
 * (--fork-foreign). */
int stress_main_hook(int argc, char **argv) {
  const char *fault_case = NULL;
  int fork_foreign = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--fault-case") && i + 1 < argc) fault_case = argv[++i];
    else if (!strcmp(argv[i], "--fork-foreign")) fork_foreign = 1;
    else if (!strcmp(argv[i], "--simulate")) stress_simulated = 1;
  }
  if (fork_foreign) return stress_fork_foreign() ? 1 : 0;
  if (!fault_case) return -1;
  if (stress_simulated) fake_driver_use();
  int dev;
  REQUIRE_OK(ferry_init());
  REQUIRE_OK(ferry_device_resolve(-1, &dev));
  return stress_fault_case(dev, fault_case) ? 1 : 0;
}

void stress_setup(void) {
  if (stress_simulated) fake_driver_use();
}

/* Skips the test when there is no GPU (and no --simulate). */
static void need_device(void) {
  ferry_status st = ferry_init();
  if (st == FERRY_NO_DRIVER || st == FERRY_NO_DEVICE)
    SKIP_NO_GPU("no GPU: %s (--simulate runs this through the simulated driver)", ferry_last_error_message());
  REQUIRE_OK(st);
}

/* The device the load and the fault matrix run on. */
static int open_device(void) {
  need_device();
  int dev;
  REQUIRE_OK(ferry_device_resolve(-1, &dev));
  return dev;
}

TEST(every_failing_driver_call_is_clean) {
  if (stress_faults(open_device(), opt.verbose)) exit(1);
}

/* The fork check's CUDA-outside-ferry case runs in a process it spawns (exec), so this process's driver state does
 * not matter to it. */
TEST(fork_after_init_is_a_clear_error) {
  need_device();
  if (stress_fork(-1)) exit(1);
}

/* Load, or with --seconds a soak: see the file comment. */
TEST(random_batches_are_exact) {
  int dev = open_device();
  ferry_device_info info;
  REQUIRE_OK(ferry_device_info_get(dev, &info));
  char what[64];
  if (opt.seconds > 0) snprintf(what, sizeof what, "for %.0f s (soak)", opt.seconds);
  else snprintf(what, sizeof what, "x %d batches", opt.batches);
  printf("ferry_stress: %d threads %s on cuda:%d (%s), up to %d tensors of up to %zu bytes per batch%s\n",
         opt.threads, what, dev, info.name, opt.max_count, opt.max_bytes, stress_simulated ? " [simulated driver]" : "");
  worker *w = calloc((size_t)opt.threads, sizeof *w);
  pthread_t *tid = calloc((size_t)opt.threads, sizeof *tid), sampler_tid;
  sampler sm = {dev, now_s(), NULL, 0, 0};
  REQUIRE_OK(ferry__ctx_enter(dev));
  take_sample(&sm); /* t = 0 */
  deadline = sm.t0 + opt.seconds;
  pthread_create(&sampler_tid, NULL, run_sampler, &sm);
  for (int i = 0; i < opt.threads; i++) {
    w[i].opt = &opt, w[i].dev = dev, w[i].id = i, w[i].rng = opt.seed * (uint32_t)(2 * i + 1) | 1;
    pthread_create(&tid[i], NULL, run_worker, &w[i]);
  }
  worker sum;
  memset(&sum, 0, sizeof sum);
  for (int i = 0; i < opt.threads; i++) {
    pthread_join(tid[i], NULL);
    sum.batches += w[i].batches, sum.tensors += w[i].tensors, sum.d2h_bytes += w[i].d2h_bytes;
    sum.h2d_bytes += w[i].h2d_bytes, sum.mismatches += w[i].mismatches, sum.errors += w[i].errors;
    if (w[i].errors) printf("  first error of thread %d (of %llu): %s\n", i, (unsigned long long)w[i].errors,
                            w[i].first_error);
  }
  double elapsed = now_s() - sm.t0;
  atomic_store(&sampler_stop, 1);
  pthread_join(sampler_tid, NULL);
  take_sample(&sm); /* after every ticket was released */
  ferry_pool_stats ps;
  ferry_pool_stats_get(&ps);

  if (opt.csv) {
    FILE *f = fopen(opt.csv, "w");
    if (f) {
      fprintf(f, "seconds,batches,bytes_pinned,bytes_in_use,bytes_peak_in_use,device_used,devmem_pool_used\n");
      for (size_t k = 0; k < sm.n; k++)
        fprintf(f, "%.2f,%llu,%llu,%llu,%llu,%lld,%lld\n", sm.s[k].t, (unsigned long long)sm.s[k].batches,
                (unsigned long long)sm.s[k].pinned, (unsigned long long)sm.s[k].in_use,
                (unsigned long long)sm.s[k].peak_in_use, sm.s[k].device_used, sm.s[k].pool_used);
      fclose(f);
    }
  }
  /* The table: every sampled second in a soak would be long, so every 10th and the last two. */
  printf("\n  %7s %9s %12s %12s %12s %12s\n", "t (s)", "batches", "pinned MiB", "in use MiB", "peak MiB",
         "device MiB");
  for (size_t k = 0; k < sm.n; k++) {
    if (k % 10 != 0 && k + 2 < sm.n) continue;
    const sample *x = &sm.s[k];
    printf("  %7.1f %9llu %12.1f %12.1f %12.1f %12.1f\n", x->t, (unsigned long long)x->batches,
           (double)x->pinned / (1 << 20), (double)x->in_use / (1 << 20), (double)x->peak_in_use / (1 << 20),
           x->device_used < 0 ? NAN : (double)x->device_used / (1 << 20));
  }
  double g_pin = growth(&sm, 0), g_dev = growth(&sm, 1);
  int have_dev = sm.s[sm.n - 1].device_used >= 0;
  int plateau = g_pin < opt.plateau_tolerance && (!have_dev || g_dev < opt.plateau_tolerance);
  char gp[32], gd[32];
  snprintf(gp, sizeof gp, "%.1f%%", 100 * g_pin);
  snprintf(gd, sizeof gd, have_dev ? "%.1f%%" : "n/a", 100 * g_dev);
  printf("\n  %-9s %-9s %-9s %-9s %-9s %-10s %-7s %-14s %-14s\n", "seconds", "batches", "tensors", "D2H GiB",
         "H2D GiB", "mismatched", "errors", "pinned growth", "device growth");
  printf("  %-9.1f %-9llu %-9llu %-9.2f %-9.2f %-10llu %-7llu %-14s %-14s\n", elapsed,
         (unsigned long long)sum.batches, (unsigned long long)sum.tensors, (double)sum.d2h_bytes / (1 << 30),
         (double)sum.h2d_bytes / (1 << 30), (unsigned long long)sum.mismatches, (unsigned long long)sum.errors, gp,
         gd);
  printf("  pool: %.1f MiB pinned (peak %.1f MiB) in %llu region(s), %llu pins, %llu hits / %llu misses, "
         "%.1f MiB in use after the run\n", (double)ps.bytes_pinned / (1 << 20),
         (double)ps.bytes_peak_pinned / (1 << 20), (unsigned long long)ps.regions, (unsigned long long)ps.pin_calls,
         (unsigned long long)ps.hits, (unsigned long long)ps.misses, (double)ps.bytes_in_use / (1 << 20));
  int failed = 0;
  if (sum.mismatches) printf("FAIL: %llu mismatched tensors\n", (unsigned long long)sum.mismatches), failed++;
  if (sum.errors) printf("FAIL: %llu failed transfers\n", (unsigned long long)sum.errors), failed++;
  if (ps.bytes_in_use) printf("FAIL: %llu bytes still in use\n", (unsigned long long)ps.bytes_in_use), failed++;
  if (sm.n >= 4) { /* what the second half added, to tell demand (a higher in-use peak) from fragmentation */
    const sample *mid = &sm.s[sm.n / 2], *end = &sm.s[sm.n - 1];
    printf("  second half (from %.0f s): %+.1f MiB pinned in %llu pin(s); the in-use peak moved %+.1f MiB\n",
           mid->t, ((double)end->pinned - (double)mid->pinned) / (1 << 20),
           (unsigned long long)(end->pins - mid->pins),
           ((double)end->peak_in_use - (double)mid->peak_in_use) / (1 << 20));
  }
  printf("  plateau (growth over the second half < %.0f%%): pinned %s, device %s%s\n", 100 * opt.plateau_tolerance,
         g_pin < opt.plateau_tolerance ? "yes" : "NO",
         !have_dev ? "n/a" : g_dev < opt.plateau_tolerance ? "yes" : "NO",
         opt.seconds > 0 ? "" : " (reported only; a soak fails without it)");
  if (opt.seconds > 0 && !plateau) printf("FAIL: the pool did not plateau\n"), failed++;
  /* Nothing is in use, so a trim must give every pinned byte back: then whatever a leak checker (compute-sanitizer
   * --leak-check full) still finds at exit is a real leak, not the pool's idle regions. */
  ferry_status trimmed = ferry_pool_trim();
  ferry_pool_stats_get(&ps);
  if (trimmed != FERRY_OK) printf("FAIL: ferry_pool_trim: %s\n", ferry_last_error_message()), failed++;
  else if (ps.bytes_pinned) printf("FAIL: %llu bytes still pinned after a trim\n", (unsigned long long)ps.bytes_pinned), failed++;
  else printf("  trim: every pinned byte given back\n");
  printf("RESULT: %s\n", failed ? "FAIL" : "PASS");
  ferry__ctx_leave();
  free(sm.s), free(w), free(tid);
  if (failed) exit(1);
}
