/* test_threads_cpu.c — 16 threads transfer random batches at once through the simulated driver, while a 17th
 * trims, reserves and reads the pool's statistics: every H2D output must equal its source and every D2H output its
 * (strided) device view, byte for byte, and when all threads are done nothing is held, pinned, registered or live.
 *
 * This is the CPU half of the load test (tests/gpu/stress.c is the H200 half): the simulated driver copies at
 * submission, so what it exercises is ferry's own shared state — the pinned pool, the event list, the per-thread
 * streams and their teardown at thread exit, the gather work lists — under contention, which is what
 * ThreadSanitizer watches in CI (tests/ci_sanitizers.sh). FERRY_THREADS_ROUNDS sets the batches per thread. */
#include "fake_driver.h"
#include "reliability_util.h"
#include "test.h"

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

enum { THREADS = 16, ARENA = 4 << 20, MAX_TENSORS = 600 };

typedef struct worker {
  uint32_t rng;
  int rounds;
  unsigned char *pageable, *pinned; /* source arenas: random bytes, the second registered (pinned) */
  size_t pinned_bytes;
  size_t tensors, bytes, mismatches;
  int errors;
  char first_error[300];
} worker;

static atomic_int workers_running;

static void record_error(worker *w, const char *what) {
  if (!w->errors++) snprintf(w->first_error, sizeof w->first_error, "%s: %s", what, ferry_last_error_message());
}

/* One random tensor viewing a source arena: 1 to 3 dimensions of 1-, 2-, 4- or 8-byte elements, mostly small,
 * sometimes up to 1 MiB (the DMA route), sometimes empty; a quarter are strided (a transposed matrix or a
 * sliced one with a row pitch). `dims` holds shape and strides (6 values). */
static ferry_tensor random_tensor(worker *w, int32_t device_type, unsigned char *arena, int64_t *dims) {
  static const uint8_t widths[4] = {8, 16, 32, 64};
  uint32_t r = rel_rand(&w->rng);
  uint8_t bits = widths[r % 4];
  int64_t eb = bits / 8;
  int64_t max_elems = (r >> 8) % 20 == 0 ? (1 << 20) / eb : (r >> 8) % 8 == 0 ? 0 : 4096 / eb;
  int64_t elems = max_elems ? 1 + (int64_t)(rel_rand(&w->rng) % (uint32_t)max_elems) : 0;
  int64_t *shape = dims, *strides = dims + 3;
  ferry_tensor t = {NULL, {device_type, 0}, 1, {FERRY_DTYPE_UINT, bits, 1}, shape, NULL, 0};
  int64_t span = elems; /* elements the view reaches */
  int kind = (int)(rel_rand(&w->rng) % 8);
  if (elems >= 4 && kind == 0) { /* transposed: an [R, C] view of a compact [C, R] block */
    int64_t R = 2 + (int64_t)(rel_rand(&w->rng) % 31), C = elems / R > 0 ? elems / R : 1;
    shape[0] = R, shape[1] = C, strides[0] = 1, strides[1] = R;
    t.ndim = 2, t.strides = strides, span = R * C;
  } else if (elems >= 4 && kind == 1) { /* sliced: [A, B, C] rows of C elements at a pitch of C + 3 */
    int64_t A = 1 + (int64_t)(rel_rand(&w->rng) % 4), B = 1 + (int64_t)(rel_rand(&w->rng) % 8);
    int64_t C = elems / (A * B) > 0 ? elems / (A * B) : 1;
    shape[0] = A, shape[1] = B, shape[2] = C, strides[2] = 1, strides[1] = C + 3, strides[0] = B * (C + 3);
    t.ndim = 3, t.strides = strides, span = A * B * (C + 3);
  } else {
    shape[0] = elems;
  }
  size_t bytes = (size_t)(span * eb);
  size_t room = ARENA - bytes;
  size_t off = room ? (size_t)rel_rand(&w->rng) % room : 0;
  t.data = arena + off / (size_t)eb * (size_t)eb;
  return t;
}

static ferry_transfer_options random_options(worker *w) {
  static const uint64_t gmax[3] = {0, 512, 64 << 10};
  ferry_transfer_options o;
  ferry_transfer_options_init(&o);
  uint32_t r = rel_rand(&w->rng);
  o.device = r & 1 ? 0 : -1;
  o.flags = (r & 2 ? FERRY_TRANSFER_BLOCKING : 0) | ((r >> 2) % 8 == 0 ? FERRY_TRANSFER_NO_BATCH_API : 0);
  o.gather_max_bytes = gmax[(r >> 5) % 3];
  return o;
}

static ferry_status submit_and_wait(int h2d, const ferry_tensor *in, size_t n, const ferry_transfer_options *o,
                                    ferry_transfer **t) {
  ferry_status st = h2d ? ferry_transfer_h2d(in, n, o, t) : ferry_transfer_d2h(in, n, o, t);
  if (st == FERRY_OK && !(o->flags & FERRY_TRANSFER_BLOCKING)) {
    while ((st = ferry_transfer_query(*t)) == FERRY_NOT_READY) {
    }
    if (st != FERRY_OK) ferry_transfer_release(*t);
  }
  return st;
}

/* H2D of random host views (pageable, pinned, or marked CUDA_HOST), checked against the sources; then D2H of the
 * device outputs through random views of them (transposed where they are matrices), checked against those. */
static void one_round(worker *w) {
  uint32_t r = rel_rand(&w->rng);
  size_t n = r % 16 == 0 ? 200 + r % 400 : 1 + r % 48;
  ferry_tensor *in = calloc(n, sizeof *in), *views = calloc(n, sizeof *views);
  int64_t *dims = calloc(n * 12, sizeof *dims);
  for (size_t i = 0; i < n; i++) {
    uint32_t where = rel_rand(&w->rng) % 3;
    in[i] = random_tensor(w, where == 2 ? FERRY_DEVICE_CUDA_HOST : FERRY_DEVICE_CPU,
                          where == 0 ? w->pageable : w->pinned, &dims[12 * i]);
  }
  ferry_transfer *up = NULL, *down = NULL;
  ferry_transfer_options o = random_options(w);
  if (submit_and_wait(1, in, n, &o, &up) != FERRY_OK) {
    record_error(w, "h2d");
    goto out;
  }
  const ferry_tensor *dev = ferry_transfer_outputs(up);
  for (size_t i = 0; i < n; i++) {
    w->mismatches += rel_diff_elements(&in[i], &dev[i]) != 0;
    views[i] = dev[i];
    if (dev[i].ndim == 2 && rel_rand(&w->rng) % 2) { /* read it back transposed */
      int64_t *v = &dims[12 * i + 6];
      v[0] = dev[i].shape[1], v[1] = dev[i].shape[0], v[2] = 1, v[3] = dev[i].shape[1];
      views[i].shape = v;
      views[i].strides = v + 2;
    }
  }
  w->bytes += ferry_slab_size(ferry_transfer_slab(up));
  o = random_options(w);
  if (submit_and_wait(0, views, n, &o, &down) != FERRY_OK) {
    record_error(w, "d2h");
    goto out;
  }
  const ferry_tensor *host = ferry_transfer_outputs(down);
  for (size_t i = 0; i < n; i++) w->mismatches += rel_diff_elements(&views[i], &host[i]) != 0;
  w->tensors += n;
  /* Sometimes keep the D2H slab past its ticket and drop the H2D ticket first: lifetimes cross. */
  if (rel_rand(&w->rng) % 4 == 0) {
    ferry_slab *kept = ferry_transfer_slab(down);
    ferry_slab_retain(kept);
    ferry_transfer_release(down);
    down = NULL;
    ferry_transfer_release(up);
    up = NULL;
    ferry_slab_release(kept);
  }
out:
  ferry_transfer_release(down);
  ferry_transfer_release(up);
  free(dims);
  free(views);
  free(in);
}

static void *work(void *arg) {
  worker *w = arg;
  w->pageable = malloc(ARENA);
  if (ferry__pin(ARENA, (void **)&w->pinned, &w->pinned_bytes) != FERRY_OK) {
    record_error(w, "pinning the source arena");
    atomic_fetch_sub(&workers_running, 1);
    return NULL;
  }
  for (size_t k = 0; k < ARENA; k++) w->pageable[k] = (unsigned char)rel_rand(&w->rng);
  for (size_t k = 0; k < ARENA; k++) w->pinned[k] = (unsigned char)rel_rand(&w->rng);
  for (int k = 0; k < w->rounds; k++) one_round(w);
  ferry__unpin(w->pinned, w->pinned_bytes);
  free(w->pageable);
  atomic_fetch_sub(&workers_running, 1);
  return NULL; /* the thread's copy streams are destroyed as it exits */
}

/* Meanwhile: trim (unpins free regions), reserve (pins one), read the counters. */
static void *janitor(void *arg) {
  uint32_t rng = 0x2545f491u;
  int *errors = arg;
  while (atomic_load(&workers_running) > 0) {
    uint32_t r = rel_rand(&rng) % 4;
    if (r == 0 && ferry_pool_trim() != FERRY_OK) ++*errors;
    if (r == 1 && ferry_pool_reserve((size_t)(rel_rand(&rng) % (8u << 20))) != FERRY_OK) ++*errors;
    ferry_pool_stats s;
    ferry_pool_stats_get(&s);
    if (s.bytes_in_use > s.bytes_pinned) ++*errors;
    usleep(200);
  }
  return NULL;
}

TEST(sixteen_threads_random_batches_exact) {
  fake_driver_use();
  ASSERT_OK(ferry_init());
  const char *env = getenv("FERRY_THREADS_ROUNDS");
  int rounds = env ? atoi(env) : 20;
  worker w[THREADS];
  pthread_t tid[THREADS], jan;
  int janitor_errors = 0;
  atomic_store(&workers_running, THREADS);
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  for (int i = 0; i < THREADS; i++) {
    memset(&w[i], 0, sizeof w[i]);
    w[i].rng = 0x9e3779b9u * (uint32_t)(i + 1);
    w[i].rounds = rounds;
    ASSERT_EQ(pthread_create(&tid[i], NULL, work, &w[i]), 0);
  }
  ASSERT_EQ(pthread_create(&jan, NULL, janitor, &janitor_errors), 0);
  size_t tensors = 0, bytes = 0, mismatches = 0;
  int errors = 0;
  for (int i = 0; i < THREADS; i++) {
    pthread_join(tid[i], NULL);
    tensors += w[i].tensors, bytes += w[i].bytes, mismatches += w[i].mismatches, errors += w[i].errors;
    if (w[i].errors) fprintf(stderr, "  thread %d: %d errors, first: %s\n", i, w[i].errors, w[i].first_error);
  }
  pthread_join(jan, NULL);
  clock_gettime(CLOCK_MONOTONIC, &b);
  ferry_pool_stats s;
  ferry_pool_stats_get(&s);
  fprintf(stderr, "  %d threads x %d batches: %zu tensors, %.1f MiB each way, %zu mismatched, %d errors, %.2f s; "
          "pool peak %.1f MiB pinned, %llu pins\n", THREADS, rounds, tensors, (double)bytes / (1 << 20), mismatches,
          errors, (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) * 1e-9,
          (double)s.bytes_peak_pinned / (1 << 20), (unsigned long long)s.pin_calls);
  ASSERT_EQ(errors, 0);
  ASSERT_EQ(janitor_errors, 0);
  ASSERT_EQ(mismatches, 0);
  /* Nothing held: every slab back, every device allocation freed, every thread's streams destroyed. */
  ASSERT_EQ(s.bytes_in_use, 0);
  ASSERT_EQ(fake_live_devmem, 0);
  ASSERT_EQ(fake_live_streams, 0);
  ASSERT_OK(ferry_pool_trim());
  ferry__events_trim();
  ferry_pool_stats_get(&s);
  ASSERT_EQ(s.bytes_pinned, 0);
  ASSERT_EQ(fake_registered, 0);
  ASSERT_EQ(fake_live_events, 0);
}
