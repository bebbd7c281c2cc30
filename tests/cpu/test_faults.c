/* Transfers through the fake driver: exact results over every route, then a fault at every use of every driver
 * call the D2H and H2D paths make. Each fault must fail cleanly: the status, error.call and the message name the
 * call; no ticket comes back; the pool holds no more than before; no device memory leaks; and the next transfer on
 * the same thread (same stream, same pool) is exact. Each (call, nth use) runs in its own process, so one-time
 * work (stream, module, memory pool creation) is faulted too, not only what runs on every transfer. */
#include "fake_driver.h"
#include "test.h"

#include <pthread.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <unistd.h>

enum { N = 40 };
static unsigned char src[N][3000];
static int64_t shapes[N][2];
static int64_t strides[N][2];

/* 40 uint8 tensors: two of 3000 bytes (DMA), many small (gather or pack), one transposed view (strided), one
 * zero-size, and for D2H one host tensor that must pass through. `host_pinned` (H2D) moves the first half of
 * the sources into registered memory so both the kernel-over-PCIe and the CPU-pack routes run. */
static void make_batch(ferry_tensor *t, int h2d, unsigned char *pinned, int npinned) {
  for (int i = 0; i < N; i++) {
    int64_t len = i < 2 ? 3000 : 100 + i * 50;
    unsigned char *p = (pinned && i < npinned) ? pinned + (size_t)i * 3000 : src[i];
    for (int k = 0; k < 3000; k++) p[k] = (unsigned char)(i * 31 + k);
    shapes[i][0] = len;
    t[i] = (ferry_tensor){p, {h2d ? FERRY_DEVICE_CPU : FERRY_DEVICE_CUDA, 0}, 1, {FERRY_DTYPE_UINT, 8, 1},
                          shapes[i], NULL, 0};
  }
  /* Tensor 5: a 10x20 transposed view of 200 bytes (strides in elements). Tensor 6: zero-size. */
  shapes[5][0] = 10, shapes[5][1] = 20, strides[5][0] = 1, strides[5][1] = 10;
  t[5].ndim = 2, t[5].strides = strides[5];
  shapes[6][0] = 0;
  if (!h2d) t[7].device.device_type = FERRY_DEVICE_CPU; /* D2H: a host tensor mixed in passes through */
}

static unsigned char expected_at(const ferry_tensor *in, int i, int64_t k) {
  const unsigned char *p = in[i].data;
  if (i == 5) return p[(k % 20) * 10 + k / 20]; /* element (r, c) of the view is source[c * 10 + r] */
  return p[k];
}

static void check_exact(const ferry_tensor *in, ferry_transfer *tr, int h2d, int count) {
  const ferry_tensor *o = ferry_transfer_outputs(tr);
  for (int i = 0; i < count; i++) {
    if (!h2d && i == 7) {
      ASSERT(o[i].data == in[i].data); /* passed through untouched */
      ASSERT_EQ(ferry_transfer_output_copied(tr, (size_t)i), 0);
      continue;
    }
    ASSERT_EQ(o[i].device.device_type, h2d ? FERRY_DEVICE_CUDA : FERRY_DEVICE_CPU);
    int64_t n = shapes[i][0] * (in[i].ndim == 2 ? shapes[i][1] : 1);
    for (int64_t k = 0; k < n; k++)
      if (((const unsigned char *)o[i].data)[k] != expected_at(in, i, k))
        FAIL_AT("tensor %d byte %lld: got %u, expected %u", i, (long long)k, ((const unsigned char *)o[i].data)[k],
                expected_at(in, i, k));
  }
}

static ferry_transfer_options options(uint32_t flags) {
  ferry_transfer_options o;
  ferry_transfer_options_init(&o);
  o.device = 0;
  o.flags = flags;
  o.gather_max_bytes = 2000; /* the two 3000-byte tensors are DMA'd, the rest gathered or packed */
  return o;
}

static ferry_status submit(int h2d, const ferry_tensor *t, size_t count, const ferry_transfer_options *o,
                           ferry_transfer **tr) {
  return h2d ? ferry_transfer_h2d(t, count, o, tr) : ferry_transfer_d2h(t, count, o, tr);
}

TEST(fake_d2h_is_exact_and_returns_slab) {
  fake_driver_use();
  ASSERT_OK(ferry_init());
  ferry_tensor t[N];
  make_batch(t, 0, NULL, 0);
  ferry_transfer_options o = options(0);
  ferry_transfer *tr = NULL;
  ASSERT_OK(ferry_transfer_d2h(t, N, &o, &tr));
  ASSERT_OK(ferry_transfer_wait(tr));
  check_exact(t, tr, 0, N);
  ferry_pool_stats s;
  ferry_pool_stats_get(&s);
  ASSERT(s.bytes_in_use > 0);
  ferry_transfer_release(tr);
  ferry_pool_stats_get(&s);
  ASSERT_EQ(s.bytes_in_use, 0);
  ASSERT_EQ(fake_live_devmem, 0); /* gather staging freed */
}

/* A batch whose tensors are all empty copies nothing: no slab, no pinned or device memory, outputs with data. */
TEST(fake_empty_tensors_take_no_slab) {
  fake_driver_use();
  ASSERT_OK(ferry_init());
  ASSERT_OK(ferry_pool_trim());
  int64_t shapes[2][2] = {{0, 3}, {5, 0}};
  static float data[1];
  ferry_tensor t[2];
  for (int i = 0; i < 2; i++)
    t[i] = (ferry_tensor){data, {FERRY_DEVICE_CUDA, 0}, 2, {FERRY_DTYPE_FLOAT, 32, 1}, shapes[i], NULL, 0};
  ferry_transfer_options o = options(0);
  for (int h2d = 0; h2d < 2; h2d++) {
    if (h2d) t[0].device = t[1].device = (ferry_device){FERRY_DEVICE_CPU, 0};
    ferry_transfer *tr = NULL;
    ASSERT_OK(h2d ? ferry_transfer_h2d(t, 2, &o, &tr) : ferry_transfer_d2h(t, 2, &o, &tr));
    ASSERT_OK(ferry_transfer_wait(tr));
    ASSERT_EQ(ferry_transfer_slab_count(tr), 0);
    ferry_pool_stats s;
    ferry_pool_stats_get(&s);
    ASSERT_EQ(s.bytes_pinned, 0);
    ASSERT_EQ(fake_live_devmem, 0);
    const ferry_tensor *out = ferry_transfer_outputs(tr);
    for (int i = 0; i < 2; i++) {
      ASSERT_EQ(ferry_transfer_output_copied(tr, (size_t)i), 1);
      ASSERT(out[i].shape != shapes[i] && out[i].shape[0] == shapes[i][0] && out[i].shape[1] == shapes[i][1]);
      ASSERT(h2d || out[i].data != NULL); /* a host output's data is valid, never read */
    }
    ferry_transfer_release(tr);
  }
}

/* The D2H gather in several chunks (forced small): a strided tensor cut across chunk boundaries must come out
 * exact, its layout repeated in each chunk's work list. */
TEST(fake_d2h_pipeline_chunks_are_exact) {
  fake_driver_use();
  ASSERT_OK(ferry_init());
  enum { SMALL = 50, ROWS = 300, COLS = 700 };
  static uint16_t big[ROWS * COLS];
  static unsigned char small[SMALL][777];
  static int64_t big_shape[2] = {COLS, ROWS}, big_strides[2] = {1, COLS}, small_shape[SMALL];
  ferry_tensor t[SMALL + 1];
  for (int k = 0; k < ROWS * COLS; k++) big[k] = (uint16_t)(k * 2654435761u >> 7);
  /* A transposed view: 700 x 300 uint16 (420 KB), gathered element by element in several 64 KiB items. */
  t[0] = (ferry_tensor){big, {FERRY_DEVICE_CUDA, 0}, 2, {FERRY_DTYPE_UINT, 16, 1}, big_shape, big_strides, 0};
  for (int i = 0; i < SMALL; i++) {
    small_shape[i] = 300 + i * 9;
    for (int k = 0; k < 777; k++) small[i][k] = (unsigned char)(i + k * 3);
    t[i + 1] = (ferry_tensor){small[i], {FERRY_DEVICE_CUDA, 0}, 1, {FERRY_DTYPE_UINT, 8, 1}, &small_shape[i], NULL, 0};
  }
  ferry__pipeline_chunk_min = 100 << 10; /* about five chunks */
  ferry_transfer_options o = options(FERRY_TRANSFER_BLOCKING);
  o.gather_max_bytes = 0; /* default: everything here is gathered */
  ferry_transfer *tr = NULL;
  ASSERT_OK(ferry_transfer_d2h(t, SMALL + 1, &o, &tr));
  const ferry_tensor *out = ferry_transfer_outputs(tr);
  const uint16_t *g = out[0].data;
  for (int c = 0; c < COLS; c++)
    for (int r = 0; r < ROWS; r++)
      if (g[c * ROWS + r] != big[r * COLS + c]) FAIL_AT("transposed element (%d, %d) differs", c, r);
  for (int i = 0; i < SMALL; i++) ASSERT(memcmp(out[i + 1].data, small[i], (size_t)small_shape[i]) == 0);
  ferry_transfer_release(tr);
  ASSERT_EQ(fake_live_devmem, 0);
}

TEST(fake_h2d_is_exact_over_every_route) {
  fake_driver_use();
  ASSERT_OK(ferry_init());
  void *pinned;
  size_t pinned_bytes;
  ASSERT_OK(ferry__pin(N * 3000, &pinned, &pinned_bytes));
  ferry_tensor t[N];
  make_batch(t, 1, pinned, N / 2);
  ferry_transfer_options o = options(FERRY_TRANSFER_BLOCKING);
  ferry_transfer *tr = NULL;
  ASSERT_OK(ferry_transfer_h2d(t, N, &o, &tr));
  check_exact(t, tr, 1, N);
  ferry_transfer_release(tr);
  ASSERT_EQ(fake_live_devmem, 0);
  ferry_pool_stats s;
  ferry_pool_stats_get(&s);
  ASSERT_EQ(s.bytes_in_use, 0);
  ferry__unpin(pinned, pinned_bytes);
}

/* An H2D source that starts in a registered range and runs past its end is pageable in part: the device reads a
 * pinned source through its mapping, which ends where the registration does (on a GPU a read past it is an
 * illegal address, which ends the context). The fake driver runs the gather kernel on the CPU, so a hook on the
 * launch checks what the hardware would: no contiguous item reads the buffer outside its registered part. */
static uintptr_t reg_lo, reg_hi, buf_lo, buf_hi;
static int reads_past_registration;
static CUresult (*launch_before_hook)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                      unsigned, CUstream, void **, void **);
static CUresult launch_checking_reads(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                      unsigned bz, unsigned sh, CUstream s, void **params, void **extra) {
  const ferry__gather_item *items = (const ferry__gather_item *)(uintptr_t)*(CUdeviceptr *)params[0];
  for (unsigned i = 0; i < gx; i++) {
    uintptr_t a = (uintptr_t)items[i].src, b = a + items[i].nbytes;
    if (items[i].layout == FERRY_GATHER_CONTIGUOUS && a < buf_hi && b > buf_lo && (a < reg_lo || b > reg_hi))
      reads_past_registration++;
  }
  return launch_before_hook(f, gx, gy, gz, bx, by, bz, sh, s, params, extra);
}

TEST(h2d_source_running_past_its_registered_range_is_read_as_pageable) {
  fake_driver_use();
  ASSERT_OK(ferry_init());
  launch_before_hook = ferry__drv.cuLaunchKernel;
  ferry__drv.cuLaunchKernel = launch_checking_reads;
  enum { MIB = 1 << 20 };
  unsigned char *buf = malloc(2 * MIB);
  ASSERT(buf != NULL);
  for (size_t i = 0; i < 2 * MIB; i++) buf[i] = (unsigned char)(i * 7 + i / 251);
  ASSERT_EQ(ferry__drv.cuMemHostRegister(buf, MIB, 0), CUDA_SUCCESS); /* the application pins the first MiB only */
  buf_lo = (uintptr_t)buf, buf_hi = buf_lo + 2 * MIB, reg_lo = buf_lo, reg_hi = buf_lo + MIB;
  /* small tensors (the gather's route when pinned): one inside the registered MiB, one across its end, and one
   * whose negative stride reaches back across the end from its first element in the pageable half */
  int64_t n0 = 256, n1 = 512, n2 = 512, s2 = -1;
  ferry_tensor t[3] = {
      {buf, {FERRY_DEVICE_CPU, 0}, 1, {FERRY_DTYPE_UINT, 8, 1}, &n0, NULL, 0},
      {buf + MIB - 256, {FERRY_DEVICE_CPU, 0}, 1, {FERRY_DTYPE_UINT, 8, 1}, &n1, NULL, 0},
      {buf + MIB + 255, {FERRY_DEVICE_CPU, 0}, 1, {FERRY_DTYPE_UINT, 8, 1}, &n2, &s2, 0},
  };
  ferry_transfer_options o = options(FERRY_TRANSFER_BLOCKING);
  ferry_transfer *tr = NULL;
  ASSERT_OK(ferry_transfer_h2d(t, 3, &o, &tr));
  const ferry_tensor *out = ferry_transfer_outputs(tr);
  ASSERT(!memcmp(out[0].data, buf, 256));
  ASSERT(!memcmp(out[1].data, buf + MIB - 256, 512));
  for (int k = 0; k < 512; k++) ASSERT_EQ(((unsigned char *)out[2].data)[k], buf[MIB + 255 - k]);
  ASSERT_EQ(reads_past_registration, 0);
  ferry_transfer_release(tr);
  ferry__drv.cuLaunchKernel = launch_before_hook;
  ASSERT_EQ(ferry__drv.cuMemHostUnregister(buf), CUDA_SUCCESS);
  free(buf);
}

/* An empty tensor whose compact strides do not fit 64 bits: its output could not be described, so the call
 * refuses it before any copy (the outputs of an empty tensor carry compact strides like any other). */
TEST(d2h_of_an_empty_tensor_with_overflowing_strides_is_refused) {
  fake_driver_use();
  ASSERT_OK(ferry_init());
  int64_t shape[3] = {0, (int64_t)1 << 40, (int64_t)1 << 40};
  ferry_tensor t = {NULL, {FERRY_DEVICE_CUDA, 0}, 3, {FERRY_DTYPE_UINT, 8, 1}, shape, NULL, 0};
  ferry_transfer *tr = NULL;
  ASSERT_STATUS(ferry_transfer_d2h(&t, 1, NULL, &tr), FERRY_OVERFLOW);
  ASSERT(tr == NULL);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "strides");
}

/* A transposed 256 x 256 view of 3-byte elements (192 KiB): each gather item holds whole elements, 65535 bytes,
 * so the tensor takes one item more than its size in 64 KiB units. D2H (gathered), H2D from pinned memory
 * (gathered) and from pageable memory (packed) must all be exact. */
TEST(strided_tensors_of_3_byte_elements_are_exact_across_items) {
  fake_driver_use();
  ASSERT_OK(ferry_init());
  enum { R = 256, C = 256, EB = 3 };
  void *pinned;
  size_t pinned_bytes;
  ASSERT_OK(ferry__pin(R * C * EB, &pinned, &pinned_bytes));
  static unsigned char pageable[R * C * EB];
  unsigned char *sources[2] = {pageable, pinned};
  for (int k = 0; k < R * C * EB; k++) pageable[k] = ((unsigned char *)pinned)[k] = (unsigned char)(k * 7 + k / 251);
  int64_t shape[2] = {R, C}, strides[2] = {1, R};
  for (int run = 0; run < 3; run++) { /* D2H, H2D pageable, H2D pinned */
    int h2d = run > 0;
    unsigned char *src = sources[run == 2];
    ferry_tensor t = {src, {h2d ? FERRY_DEVICE_CPU : FERRY_DEVICE_CUDA, 0}, 2, {FERRY_DTYPE_UINT, 24, 1}, shape,
                      strides, 0};
    ferry_transfer_options o = options(FERRY_TRANSFER_BLOCKING);
    o.gather_max_bytes = 0;
    ferry_transfer *tr = NULL;
    ASSERT_OK(h2d ? ferry_transfer_h2d(&t, 1, &o, &tr) : ferry_transfer_d2h(&t, 1, &o, &tr));
    const unsigned char *out = ferry_transfer_outputs(tr)[0].data;
    for (int r = 0; r < R; r++)
      for (int c = 0; c < C; c++)
        if (memcmp(out + ((size_t)r * C + c) * EB, src + ((size_t)c * R + r) * EB, EB) != 0)
          FAIL_AT("run %d: element (%d, %d) differs", run, r, c);
    ferry_transfer_release(tr);
  }
  ferry__unpin(pinned, pinned_bytes);
  ferry_pool_stats s;
  ferry_pool_stats_get(&s);
  ASSERT_EQ(s.bytes_in_use, 0);
}

/* ---- the fault matrix -------------------------------------------------------------------------------------
 *
 * A transfer's life is a list of steps through the public API: the submission (one call, or begin, add, order
 * after the legacy stream, add more, end), query, wait, query and wait again, release, trim the pool, and the end
 * of the submitting thread (its streams are destroyed then). For one configuration (direction, one call or
 * parts, blocking or not, a batch with or without the gather route), a clean run in a fresh process counts every
 * driver call each step makes (ferry__fault_count); then, for every call and every use n of it, a fresh process
 * fails exactly that use and checks:
 *   - the step it fell in returns an error whose call and message name the failed call (a failed submission or
 *     begin returns no ticket), unless the call is one whose failure that step absorbs (see `absorbed`);
 *   - the error sticks: every later add, end, query and wait of the ticket returns the same status and names the
 *     call;
 *   - no step returns an error before the fault, and a ticket whose steps all returned FERRY_OK is byte-exact;
 *   - release leaves the thread's last error alone;
 *   - nothing leaks: after release and trim the pool has no bytes in use or pinned, and the simulated driver has
 *     no live event, stream, device allocation or registered range left (a failed destroy of an event or stream,
 *     or a failed unregistration, may leave its one object; a failed device free is retried);
 *   - the library stays usable: a clean transfer afterwards is byte-exact and returns everything.
 * A new entry point is a new step here, and runs through the same checks. */

enum { MODE_BLOCKING, MODE_ASYNC, MODE_ASYNC_RUNNING };
static const char *const mode_names[] = {"blocking", "async", "async, still running at the first query"};
enum { BATCH_GATHER, BATCH_DMA };

typedef struct matrix_config {
  int h2d, parts, mode, batch;
} matrix_config;

typedef enum step_id {
  STEP_BEGIN, STEP_ADD, STEP_ORDER_AFTER, STEP_ADD_MORE, STEP_END, STEP_QUERY, STEP_WAIT, STEP_QUERY_AGAIN,
  STEP_WAIT_AGAIN, STEP_RELEASE, STEP_TRIM, STEP_THREAD_EXIT, STEPS
} step_id;
static const char *const step_names[STEPS] = {"submit", "add", "order after", "add more", "end", "query", "wait",
                                               "query again", "wait again", "release", "trim", "thread exit"};
static int step_reports(int s) { return s != STEP_RELEASE && s != STEP_THREAD_EXIT; } /* returns a status */
static int step_on_ticket(int s) { return s >= STEP_ADD && s <= STEP_WAIT_AGAIN; }    /* errors stick here */
static int step_failed(int s, ferry_status st) { return st != FERRY_OK && !(s == STEP_QUERY && st == FERRY_NOT_READY); }

/* The inputs of one configuration, and what a run of its life recorded. */
typedef struct life {
  matrix_config c;
  ferry_tensor t[N];
  size_t count;
  void *pinned;
  size_t pinned_bytes;
  ferry_transfer_options o;
  ferry_status st[STEPS];
  ferry_error err[STEPS];
  int ticket;                  /* the submission or begin returned a ticket */
  int exact;                   /* -1: not checked (some step failed), else 1 */
  void (*after)(struct life *, int step);
  /* fault runs */
  const char *call;
  int nth, fired;              /* the step in which the armed use happened, -1 before */
  /* counting runs */
  int counts[STEPS][64];
  const char *names[64];
  int nnames;
} life;

static const char *config_text(matrix_config c, char *buf, size_t size) {
  snprintf(buf, size, "%s %s, %s, %s batch", c.h2d ? "H2D" : "D2H", c.parts ? "in parts" : "in one call",
           mode_names[c.mode], c.batch == BATCH_GATHER ? "gather" : "DMA-only");
  return buf;
}

static void life_make(life *l, matrix_config c) {
  memset(l, 0, sizeof *l);
  l->c = c;
  l->fired = -1;
  l->exact = -1;
  if (c.h2d && ferry__pin(N * 3000, &l->pinned, &l->pinned_bytes) != FERRY_OK)
    FAIL_AT("pinning the sources: %s", ferry_last_error_message());
  /* The gather batch: 40 tensors, half of the H2D sources pinned. The DMA batch: its two 3000-byte tensors, one
   * pinned and one pageable for H2D; nothing for the gather kernel. Parts: the first half, then the rest. */
  make_batch(l->t, c.h2d, l->pinned, c.batch == BATCH_GATHER ? N / 2 : 1);
  l->count = c.batch == BATCH_GATHER ? N : 2;
  l->o = options(c.mode == MODE_BLOCKING ? FERRY_TRANSFER_BLOCKING : 0);
  ferry__pipeline_chunk_min = 4096; /* several gather chunks, so every per-chunk call is faulted too */
}

static void life_free(life *l) {
  if (l->pinned) ferry__unpin(l->pinned, l->pinned_bytes);
}

static void step_done(life *l, int s, ferry_status st) {
  l->st[s] = st;
  l->err[s] = *ferry_last_error();
  if (l->after) l->after(l, s);
}

/* Step s of the submission or of the ticket's completion; FERRY_OK without a call for a step this form lacks. */
static ferry_status run_step(life *l, int s, ferry_transfer **tr) {
  size_t half = l->count / 2;
  int h2d = l->c.h2d;
  if (s == STEP_BEGIN && !l->c.parts) return submit(h2d, l->t, l->count, &l->o, tr);
  if (s == STEP_BEGIN) return h2d ? ferry_transfer_begin_h2d(&l->o, tr) : ferry_transfer_begin_d2h(&l->o, tr);
  if (!*tr || (s <= STEP_END && !l->c.parts)) return FERRY_OK;
  switch (s) {
  case STEP_ADD: return ferry_transfer_add(*tr, l->t, half);
  case STEP_ORDER_AFTER: return ferry_transfer_order_after(*tr, NULL, NULL); /* the legacy default stream */
  case STEP_ADD_MORE: return ferry_transfer_add(*tr, l->t + half, l->count - half);
  case STEP_END: return ferry_transfer_end(*tr);
  case STEP_QUERY:
  case STEP_QUERY_AGAIN: return ferry_transfer_query(*tr);
  default: return ferry_transfer_wait(*tr);
  }
}

/* The steps up to the thread's end (run on a thread of its own, so that end is a step too). Each starts with the
 * thread's error cleared, so an error must be recorded by the step itself. */
static void *live(void *arg) {
  life *l = arg;
  ferry_transfer *tr = NULL;
  int failed = 0;
  for (int s = STEP_BEGIN; s <= STEP_WAIT_AGAIN; s++) {
    ferry_clear_error();
    if (s == STEP_QUERY && l->c.mode == MODE_ASYNC_RUNNING) atomic_store(&fake_queries_not_ready, 1);
    ferry_status st = run_step(l, s, &tr);
    atomic_store(&fake_queries_not_ready, 0);
    failed |= step_failed(s, st);
    if (s == STEP_BEGIN) l->ticket = tr != NULL;
    step_done(l, s, st);
  }
  if (tr && !failed) {
    check_exact(l->t, tr, l->c.h2d, (int)l->count);
    l->exact = 1;
  }
  /* Release returns nothing, and leaves the thread's last error as it was (here: a known one). */
  (void)ferry_transfer_wait(NULL);
  ferry_error before = *ferry_last_error();
  ferry_transfer_release(tr);
  if (strcmp(ferry_last_error()->message, before.message) != 0)
    FAIL_AT("release changed the thread's last error to: %s", ferry_last_error_message());
  step_done(l, STEP_RELEASE, FERRY_OK);
  ferry_clear_error();
  step_done(l, STEP_TRIM, ferry_pool_trim());
  return NULL;
}

static void live_on_a_thread(life *l) {
  pthread_t th;
  if (pthread_create(&th, NULL, live, l) != 0) FAIL_AT("pthread_create failed");
  pthread_join(th, NULL);
  step_done(l, STEP_THREAD_EXIT, FERRY_OK);
}

/* ---- counting: which calls each step makes in a clean run ---- */

static void count_after(life *l, int s) {
  const char *name;
  int c;
  for (int i = 0; (c = ferry__fault_calls(i, &name)) >= 0 && i < 64; i++) {
    l->names[i] = name;
    l->counts[s][i] = c;
    if (i >= l->nnames) l->nnames = i + 1;
  }
}

/* In a child: the clean run, written to `fd` as one line per call: "name count-in-step-0 count-in-step-1 ...". */
static int count_calls(matrix_config c, int fd) {
  fake_driver_use();
  ASSERT_OK(ferry_init());
  life *l = calloc(1, sizeof *l);
  life_make(l, c);
  l->after = count_after;
  ferry__fault_count(1);
  live_on_a_thread(l);
  ferry__fault_count(0);
  if (l->exact != 1) FAIL_AT("the clean run of this configuration was not exact");
  FILE *out = fdopen(fd, "w");
  for (int i = 0; i < l->nnames; i++) {
    fprintf(out, "%s", l->names[i]);
    for (int s = 0; s < STEPS; s++) fprintf(out, " %d", l->counts[s][i] - (s ? l->counts[s - 1][i] : 0));
    fprintf(out, "\n");
  }
  fclose(out);
  life_free(l);
  return 0;
}

/* ---- failing one use of one call ---- */

/* Calls whose failure a step absorbs by design, so the step may still return FERRY_OK (and then its result must
 * be exact). A trim gives back what the driver lets it (a range it cannot unregister stays pinned, an event it
 * cannot destroy is dropped) and the pool stays usable; a failed pinned-memory query only makes ferry treat the
 * H2D source as pageable. */
static int absorbed(const char *call, int step) {
  if (step == STEP_TRIM && (!strcmp(call, "cuEventDestroy") || !strcmp(call, "cuMemHostUnregister"))) return 1;
  if (!strcmp(call, "cuPointerGetAttribute") && step <= STEP_END) return 1; /* where H2D sources are read */
  /* Leaving the context after the work is done: the result stands; the context merely stays current. */
  if (!strcmp(call, "cuCtxPopCurrent")) return 1;
  return 0;
}

static void fault_after(life *l, int s) {
  if (l->fired < 0 && ferry__fault_hits() >= l->nth) l->fired = s;
  if (s == STEP_THREAD_EXIT) ferry__fault_disarm();
}

static void expect_names_call(const life *l, int s) {
  const ferry_error *e = &l->err[s];
  if (e->status != l->st[s])
    FAIL_AT("%s returned %s but recorded %s as the thread's error", step_names[s], ferry_status_name(l->st[s]),
            ferry_status_name(e->status));
  if (strcmp(e->call, l->call) != 0 || !strstr(e->message, l->call) || e->cu_result != CUDA_ERROR_LAUNCH_FAILED)
    FAIL_AT("%s after %s failed at use %d (in %s): error names '%s' (CUresult %d): %s", step_names[s], l->call,
            l->nth, step_names[l->fired], e->call, e->cu_result, e->message);
}

/* `live` objects of a kind remain; at most `allowed`, one more when the failed call was `destroy` (NULL: none). */
static void expect_at_most(const life *l, const char *what, int live, int allowed, const char *destroy) {
  if (destroy && !strcmp(l->call, destroy)) allowed++;
  if (live > allowed)
    FAIL_AT("%s failing at use %d (in %s): %d %s live at the end (at most %d expected)", l->call, l->nth,
            step_names[l->fired], live, what, allowed);
}

static int fault_case(matrix_config c, const char *call, int nth) {
  fake_driver_use();
  ASSERT_OK(ferry_init());
  life *l = calloc(1, sizeof *l);
  life_make(l, c);
  l->after = fault_after;
  l->call = call;
  l->nth = nth;
  ferry__fault_arm(call, nth, CUDA_ERROR_LAUNCH_FAILED);
  live_on_a_thread(l);
  if (l->fired < 0) FAIL_AT("%s use %d was never made, though the clean run made it", call, nth);
  const char *where = step_names[l->fired];

  /* No error before the fault; the step it fell in reports it, unless it absorbs it (or, with no ticket, the
   * step was not run at all). */
  for (int s = 0; s < l->fired; s++)
    if (step_reports(s) && step_failed(s, l->st[s]))
      FAIL_AT("%s returned %s before %s failed (use %d, in %s)", step_names[s], ferry_status_name(l->st[s]), call, nth,
              where);
  int reported = step_reports(l->fired) && step_failed(l->fired, l->st[l->fired]);
  int ran = l->fired == STEP_BEGIN || !step_on_ticket(l->fired) || l->ticket;
  if (step_reports(l->fired) && ran && !reported && !absorbed(call, l->fired))
    FAIL_AT("%s failing at use %d (in %s) was not reported: %s returned %s", call, nth, where, where,
            ferry_status_name(l->st[l->fired]));
  if (reported) expect_names_call(l, l->fired);
  if (l->fired == STEP_BEGIN && reported && l->ticket) FAIL_AT("a failed submission returned a ticket");

  /* Sticky: once a call on the ticket failed, every later one returns that status and names the call. */
  int first_failed = -1;
  for (int s = STEP_ADD; s <= STEP_WAIT_AGAIN && l->ticket; s++) {
    if (!l->c.parts && s <= STEP_END) continue; /* not made in this form */
    if (first_failed >= 0) {
      if (l->st[s] != l->st[first_failed])
        FAIL_AT("%s returned %s after %s had returned %s (%s failed at use %d, in %s): the error did not stick",
                step_names[s], ferry_status_name(l->st[s]), step_names[first_failed],
                ferry_status_name(l->st[first_failed]), call, nth, where);
      expect_names_call(l, s);
    } else if (step_failed(s, l->st[s])) {
      first_failed = s;
    }
  }
  if (l->exact != 1 && l->ticket && first_failed < 0)
    FAIL_AT("every step succeeded but the outputs were not checked");

  /* Nothing leaks. The pool has no bytes in use once the ticket is released, and the submitting thread's
   * streams are gone with it. */
  ferry_pool_stats ps;
  ferry_pool_stats_get(&ps);
  if (ps.bytes_in_use != 0)
    FAIL_AT("%s failing at use %d (in %s): %llu pool bytes in use after release", call, nth, where,
            (unsigned long long)ps.bytes_in_use);
  expect_at_most(l, "streams", atomic_load(&fake_live_streams), 0, "cuStreamDestroy");

  /* Still usable: a clean transfer on this (main) thread is exact and returns its memory. It also queues the
   * frees a failed release had to defer. */
  ferry_transfer *tr = NULL;
  ferry_transfer_options o = options(FERRY_TRANSFER_BLOCKING);
  ASSERT_OK(submit(c.h2d, l->t, l->count, &o, &tr));
  check_exact(l->t, tr, c.h2d, (int)l->count);
  ferry_transfer_release(tr);
  ferry_pool_stats_get(&ps);
  ASSERT_EQ(ps.bytes_in_use, 0);

  /* Then a trim (of a region reserved for the purpose, so it also empties the event list) leaves nothing pinned,
   * and the simulated driver holds no event, device allocation or registered range but the test's own. */
  ASSERT_OK(ferry_pool_reserve(1));
  ASSERT_OK(ferry_pool_trim());
  ferry_pool_stats_get(&ps);
  if (ps.bytes_pinned != 0 && strcmp(call, "cuMemHostUnregister") != 0)
    FAIL_AT("%s failing at use %d (in %s): %llu bytes still pinned after trim", call, nth, where,
            (unsigned long long)ps.bytes_pinned);
  expect_at_most(l, "events", atomic_load(&fake_live_events), 0, "cuEventDestroy");
  expect_at_most(l, "device allocations", atomic_load(&fake_live_devmem), 0, NULL); /* a failed free is retried */
  expect_at_most(l, "registered ranges", atomic_load(&fake_registered), c.h2d ? 1 : 0, "cuMemHostUnregister");
  life_free(l);
  return 0;
}

/* Runs `fn` in a child process; its exit status (0: passed). */
static int in_child(int (*fn)(matrix_config, const char *, int), matrix_config c, const char *call, int nth) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) _exit(fn(c, call, nth));
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static int count_child(matrix_config c, const char *unused, int fd) {
  (void)unused;
  return count_calls(c, fd);
}

/* The whole matrix of one configuration: prints one line, returns the number of failed cases. */
static int fault_matrix(matrix_config c) {
  int fds[2];
  ASSERT(pipe(fds) == 0);
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    _exit(count_child(c, NULL, fds[1]));
  }
  close(fds[1]);
  FILE *in = fdopen(fds[0], "r");
  char name[64], text[120];
  int per_step[STEPS], cases = 0, calls = 0, failures = 0, in_step[STEPS] = {0};
  while (fscanf(in, "%63s", name) == 1) {
    int total = 0;
    for (int s = 0; s < STEPS; s++) {
      if (fscanf(in, "%d", &per_step[s]) != 1) FAIL_AT("unreadable call counts");
      total += per_step[s];
      in_step[s] += per_step[s];
    }
    if (total == 0) continue;
    calls++;
    for (int nth = 1; nth <= total; nth++, cases++)
      if (in_child(fault_case, c, name, nth) != 0) {
        fprintf(stderr, "  ^ %s: %s failing at use %d\n", config_text(c, text, sizeof text), name, nth);
        failures++;
      }
  }
  fclose(in);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) FAIL_AT("the counting run failed");
  printf("  %s: %d calls, %d call x use cases (uses per step:", config_text(c, text, sizeof text), calls, cases);
  for (int s = 0; s < STEPS; s++)
    if (in_step[s]) printf(" %s %d", step_names[s], in_step[s]);
  printf("), %d failed\n", failures);
  return failures;
}

/* Every mode and batch of one direction and form. */
static void fault_matrix_of(int h2d, int parts) {
  int failures = 0;
  for (int batch = BATCH_GATHER; batch <= BATCH_DMA; batch++)
    for (int mode = MODE_BLOCKING; mode <= MODE_ASYNC_RUNNING; mode++)
      failures += fault_matrix((matrix_config){h2d, parts, mode, batch});
  if (failures) FAIL_AT("%d cases failed (listed above)", failures);
}

TEST(every_call_failing_in_a_d2h_is_reported_and_leaks_nothing) { fault_matrix_of(0, 0); }
TEST(every_call_failing_in_an_h2d_is_reported_and_leaks_nothing) { fault_matrix_of(1, 0); }
TEST(every_call_failing_in_a_d2h_in_parts_is_reported_and_leaks_nothing) { fault_matrix_of(0, 1); }
TEST(every_call_failing_in_an_h2d_in_parts_is_reported_and_leaks_nothing) { fault_matrix_of(1, 1); }

/* ---- sticky completion errors ----------------------------------------------------------------------------- */

/* The last error names `call` and carries the injected result. */
static void expect_error_of(ferry_status st, const char *call) {
  ASSERT_STATUS(st, FERRY_DRIVER_ERROR);
  ASSERT_EQ(ferry_last_error()->status, FERRY_DRIVER_ERROR);
  ASSERT_STR_CONTAINS(ferry_last_error()->call, call);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), call);
  ASSERT_EQ(ferry_last_error()->cu_result, CUDA_ERROR_LAUNCH_FAILED);
}

/* Queries then waits `n` times with the fault disarmed and the thread's error cleared before each: every one
 * must return the error again, naming the call, by itself. */
static void expect_error_sticks(ferry_transfer *tr, const char *call, int n) {
  for (int k = 0; k < n; k++) {
    ferry_clear_error();
    expect_error_of(ferry_transfer_query(tr), call);
    ferry_clear_error();
    expect_error_of(ferry_transfer_wait(tr), call);
  }
}

static ferry_transfer *async_d2h(ferry_tensor *t) {
  fake_driver_use();
  ASSERT_OK(ferry_init());
  make_batch(t, 0, NULL, 0);
  ferry_transfer_options o = options(0);
  ferry_transfer *tr = NULL;
  ASSERT_OK(ferry_transfer_d2h(t, N, &o, &tr));
  return tr;
}

static void expect_nothing_held(void) {
  ferry_pool_stats s;
  ferry_pool_stats_get(&s);
  ASSERT_EQ(s.bytes_in_use, 0);
  ASSERT_EQ(fake_live_devmem, 0);
}

TEST(a_failed_query_fails_the_wait_and_every_later_query_and_wait) {
  ferry_tensor t[N];
  ferry_transfer *tr = async_d2h(t);
  ferry__fault_arm("cuEventQuery", 1, CUDA_ERROR_LAUNCH_FAILED);
  expect_error_of(ferry_transfer_query(tr), "cuEventQuery");
  ferry__fault_disarm();
  expect_error_sticks(tr, "cuEventQuery", 3);
  ferry_transfer_release(tr);
  expect_nothing_held();
}

TEST(a_failed_wait_fails_every_later_query_and_wait) {
  ferry_tensor t[N];
  ferry_transfer *tr = async_d2h(t);
  atomic_store(&fake_queries_not_ready, 1);
  ASSERT_STATUS(ferry_transfer_query(tr), FERRY_NOT_READY); /* still running: not an error */
  ferry__fault_arm("cuEventSynchronize", 1, CUDA_ERROR_LAUNCH_FAILED);
  expect_error_of(ferry_transfer_wait(tr), "cuEventSynchronize");
  ferry__fault_disarm();
  expect_error_sticks(tr, "cuEventSynchronize", 3);
  ferry_transfer_release(tr);
  expect_nothing_held();
}

/* A blocking transfer waits before returning: if its copies fail, it returns their error and no ticket, as any
 * other failure (never outputs that look complete). */
TEST(a_blocking_transfer_whose_copies_fail_returns_no_ticket) {
  fake_driver_use();
  ASSERT_OK(ferry_init());
  ferry_tensor t[N];
  make_batch(t, 0, NULL, 0);
  ferry_transfer_options o = options(FERRY_TRANSFER_BLOCKING);
  ferry_transfer *tr = NULL;
  ferry__fault_arm("cuEventSynchronize", 1, CUDA_ERROR_LAUNCH_FAILED);
  expect_error_of(ferry_transfer_d2h(t, N, &o, &tr), "cuEventSynchronize");
  ferry__fault_disarm();
  ASSERT(tr == NULL);
  expect_nothing_held();
}

/* ---- the fault seam under threads ------------------------------------------------------------------------ */

/* One thread arms and disarms faults on several calls while four others transfer batches of small tensors (the
 * gather route) and a strided one. The seam is shared state every driver call reads: arming must be race free
 * (ThreadSanitizer runs this in CI), and a transfer either succeeds exactly or fails naming one of the armed calls.
 * The workers take batches from a budget the arming thread hands out each round, so the test does the same work
 * whatever the scheduler does (free-running workers did 30 000 batches natively and up to 600 000 under valgrind,
 * whose scheduler can leave a sleeping thread waiting for minutes). */
enum { SEAM_THREADS = 4, SEAM_TENSORS = 12, SEAM_ROUNDS = 60, SEAM_BATCHES_PER_ROUND = 2 * SEAM_THREADS };
static const char *const seam_calls[] = {"cuEventRecord", "cuLaunchKernel", "cuMemcpyAsync",
                                         "cuMemAllocFromPoolAsync", "cuEventSynchronize", "cuMemcpyHtoDAsync"};
static pthread_mutex_t seam_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t seam_changed = PTHREAD_COND_INITIALIZER;
static int seam_budget, seam_started, seam_done, seam_stop; /* batches allowed, begun and ended; under seam_lock */
static atomic_int seam_bad, seam_failed;

/* A worker's next batch: waits until the budget allows one; false once the test stops. */
static bool seam_take_batch(void) {
  pthread_mutex_lock(&seam_lock);
  while (!seam_stop && seam_started >= seam_budget) pthread_cond_wait(&seam_changed, &seam_lock);
  bool go = !seam_stop;
  seam_started += go;
  pthread_mutex_unlock(&seam_lock);
  return go;
}

static void seam_end_batch(void) {
  pthread_mutex_lock(&seam_lock);
  seam_done++;
  pthread_cond_broadcast(&seam_changed);
  pthread_mutex_unlock(&seam_lock);
}

/* The arming thread: lets `more` batches begin, then waits until all but `in_flight` of the budget have ended. */
static void seam_run_batches(int more, int in_flight) {
  pthread_mutex_lock(&seam_lock);
  seam_budget += more;
  pthread_cond_broadcast(&seam_changed);
  while (seam_done < seam_budget - in_flight) pthread_cond_wait(&seam_changed, &seam_lock);
  pthread_mutex_unlock(&seam_lock);
}

static void *seam_worker(void *arg) {
  int id = (int)(intptr_t)arg;
  static unsigned char src[SEAM_THREADS][SEAM_TENSORS][512];
  int64_t shapes[SEAM_TENSORS][2], strides[2] = {1, 16};
  ferry_tensor t[SEAM_TENSORS];
  for (int i = 0; i < SEAM_TENSORS; i++) {
    for (int k = 0; k < 512; k++) src[id][i][k] = (unsigned char)(id * 7 + i * 31 + k);
    shapes[i][0] = 64 + i * 37;
    t[i] = (ferry_tensor){src[id][i], {FERRY_DEVICE_CUDA, 0}, 1, {FERRY_DTYPE_UINT, 8, 1}, shapes[i], NULL, 0};
  }
  shapes[0][0] = 16, shapes[0][1] = 16; /* tensor 0: the transpose of a 16 x 16 block */
  t[0].ndim = 2, t[0].strides = strides;
  ferry_transfer_options o = options(FERRY_TRANSFER_BLOCKING);
  while (seam_take_batch()) {
    ferry_transfer *tr = NULL;
    ferry_status st = ferry_transfer_d2h(t, SEAM_TENSORS, &o, &tr);
    if (st == FERRY_OK) {
      const ferry_tensor *out = ferry_transfer_outputs(tr);
      const unsigned char *g = out[0].data;
      for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) atomic_fetch_add(&seam_bad, g[r * 16 + c] != src[id][0][c * 16 + r]);
      for (int i = 1; i < SEAM_TENSORS; i++)
        atomic_fetch_add(&seam_bad, memcmp(out[i].data, src[id][i], (size_t)shapes[i][0]) != 0);
      ferry_transfer_release(tr);
    } else {
      atomic_fetch_add(&seam_failed, 1);
      int named = 0;
      for (size_t c = 0; c < sizeof seam_calls / sizeof *seam_calls; c++)
        named |= !strcmp(ferry_last_error()->call, seam_calls[c]);
      if (!named || tr != NULL) {
        fprintf(stderr, "  a failed transfer named '%s': %s\n", ferry_last_error()->call, ferry_last_error_message());
        atomic_fetch_add(&seam_bad, 1);
      }
    }
    seam_end_batch();
  }
  return NULL;
}

TEST(faults_armed_while_other_threads_transfer_hit_only_the_named_call) {
  fake_driver_use();
  ASSERT_OK(ferry_init());
  pthread_t th[SEAM_THREADS];
  for (int i = 0; i < SEAM_THREADS; i++) ASSERT_EQ(pthread_create(&th[i], NULL, seam_worker, (void *)(intptr_t)i), 0);
  size_t ncalls = sizeof seam_calls / sizeof *seam_calls;
  for (int round = 0; round < SEAM_ROUNDS; round++) {
    ferry__fault_arm(seam_calls[round % ncalls], round % 3, CUDA_ERROR_LAUNCH_FAILED);
    /* Disarm while up to one batch a worker may still run, so arming and disarming meet driver calls in flight. */
    seam_run_batches(SEAM_BATCHES_PER_ROUND, SEAM_THREADS);
    (void)ferry__fault_hits();
    ferry__fault_disarm();
  }
  seam_run_batches(0, 0);
  pthread_mutex_lock(&seam_lock);
  seam_stop = 1;
  pthread_cond_broadcast(&seam_changed);
  pthread_mutex_unlock(&seam_lock);
  for (int i = 0; i < SEAM_THREADS; i++) pthread_join(th[i], NULL);
  ASSERT_EQ(atomic_load(&seam_bad), 0);
  ASSERT(atomic_load(&seam_failed) > 0); /* the armed faults reached transfers */
  ASSERT(atomic_load(&seam_failed) < SEAM_ROUNDS * SEAM_BATCHES_PER_ROUND);
  ferry_pool_stats s;
  ferry_pool_stats_get(&s);
  ASSERT_EQ(s.bytes_in_use, 0);
  ASSERT_EQ(fake_live_devmem, 0);
}

TEST(pool_reuses_and_trims) {
  fake_driver_use();
  ASSERT_OK(ferry_init());
  ferry_tensor t[N];
  make_batch(t, 0, NULL, 0);
  ferry_transfer_options o = options(0);
  ferry_transfer *a = NULL, *b = NULL;
  ASSERT_OK(ferry_transfer_d2h(t, N, &o, &a));
  ferry_slab *kept = ferry_transfer_slab(a);
  ferry_slab_retain(kept);
  ferry_transfer_release(a); /* outputs still viewed: the slab must stay taken */
  ASSERT_OK(ferry_transfer_d2h(t, N, &o, &b));
  ASSERT(ferry_slab_data(ferry_transfer_slab(b)) != ferry_slab_data(kept));
  ferry_transfer_release(b);
  ferry_slab_release(kept);
  ferry_pool_stats s;
  ferry_pool_stats_get(&s);
  ASSERT_EQ(s.bytes_in_use, 0);
  ASSERT(s.hits >= 1);
  ASSERT_OK(ferry_pool_trim());
  ferry_pool_stats_get(&s);
  ASSERT_EQ(s.bytes_pinned, 0);
  ASSERT_EQ(fake_registered, 0);
}

TEST(device_index_past_count_names_both) {
  fake_driver_use();
  ASSERT_OK(ferry_init());
  int d;
  ASSERT_STATUS(ferry_device_resolve(3, &d), FERRY_DEVICE_UNAVAILABLE);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "cuda:3");
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "sees 1 CUDA device");
  setenv("LOCAL_RANK", "0", 1);
  ASSERT_OK(ferry_device_resolve(-1, &d));
  ASSERT_EQ(d, 0);
  setenv("LOCAL_RANK", "2", 1);
  ASSERT_STATUS(ferry_device_resolve(-1, &d), FERRY_DEVICE_UNAVAILABLE);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "LOCAL_RANK");
  setenv("LOCAL_RANK", "x1", 1);
  ASSERT_STATUS(ferry_device_resolve(-1, &d), FERRY_INVALID_ARGUMENT);
}
