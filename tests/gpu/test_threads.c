/* test_threads.c — 16 threads transfer at once, each on its own cached copy stream, sharing the pinned pool and
 * the device memory pool: random batches (count, sizes, dtypes, transposed views) go H2D from pageable memory and
 * come back D2H, byte for byte, with blocking and asynchronous tickets mixed. */
#include "gpu_test.h"

#include <pthread.h>

enum { THREADS = 16, ROUNDS = 40 };

typedef struct job { int dev; unsigned seed; size_t mismatches, tensors, bytes; int errors; } job;

static uint32_t next(uint32_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 17;
  *s ^= *s << 5;
  return *s;
}

static void one_round(job *j, uint32_t *rng) {
  size_t n = 1 + next(rng) % 300;
  static const uint8_t widths[4] = {8, 16, 32, 64};
  ferry_tensor *in = calloc(n, sizeof *in), *view = calloc(n, sizeof *view);
  int64_t *dims = calloc(6 * n, sizeof *dims);
  unsigned char **bufs = calloc(n, sizeof *bufs);
  char *transposed = calloc(n, 1);
  for (size_t i = 0; i < n; i++) {
    uint8_t bits = widths[next(rng) % 4];
    int64_t rows = 1 + next(rng) % 64, cols = next(rng) % 5 == 0 ? 0 : 1 + next(rng) % 512;
    int64_t *shape = &dims[6 * i];
    shape[0] = rows, shape[1] = cols;
    size_t bytes = (size_t)(rows * cols) * bits / 8;
    bufs[i] = malloc(bytes + 1);
    for (size_t k = 0; k < bytes; k++) bufs[i][k] = (unsigned char)next(rng);
    in[i] = (ferry_tensor){bufs[i], {FERRY_DEVICE_CPU, 0}, 2, {FERRY_DTYPE_UINT, bits, 1}, shape, NULL, 0};
    j->bytes += bytes;
  }
  ferry_transfer_options blocking = gpu_options(j->dev, FERRY_TRANSFER_BLOCKING);
  ferry_transfer_options async = gpu_options(j->dev, 0);
  ferry_transfer *up = NULL, *down = NULL;
  int use_async = next(rng) & 1;
  if (ferry_transfer_h2d(in, n, use_async ? &async : &blocking, &up) != FERRY_OK ||
      (use_async && ferry_transfer_wait(up) != FERRY_OK)) {
    j->errors++;
    printf("   thread error (h2d): %s\n", ferry_last_error_message());
    goto out;
  }
  const ferry_tensor *d = ferry_transfer_outputs(up);
  for (size_t i = 0; i < n; i++) {
    view[i] = d[i];
    if (next(rng) % 4 == 0) { /* read back through a transposed view */
      transposed[i] = 1;
      int64_t *vs = &dims[6 * i + 2];
      vs[0] = d[i].shape[1], vs[1] = d[i].shape[0], vs[2] = 1, vs[3] = d[i].shape[1];
      view[i].shape = vs;
      view[i].strides = vs + 2;
    }
  }
  if (ferry_transfer_d2h(view, n, use_async ? &async : &blocking, &down) != FERRY_OK ||
      (use_async && ferry_transfer_wait(down) != FERRY_OK)) {
    j->errors++;
    printf("   thread error (d2h): %s\n", ferry_last_error_message());
    goto out;
  }
  const ferry_tensor *h = ferry_transfer_outputs(down);
  for (size_t i = 0; i < n; i++) {
    size_t eb = in[i].dtype.bits / 8;
    int64_t R = in[i].shape[0], C = in[i].shape[1];
    if (transposed[i]) { /* output is the transpose: element (c, r) = source (r, c) */
      for (int64_t c = 0; c < C; c++)
        for (int64_t r = 0; r < R; r++)
          j->mismatches += memcmp((char *)h[i].data + (size_t)(c * R + r) * eb, bufs[i] + (size_t)(r * C + c) * eb,
                                  eb) != 0;
    } else {
      j->mismatches += memcmp(h[i].data, bufs[i], (size_t)(R * C) * eb) != 0;
    }
  }
  j->tensors += n;
out:
  ferry_transfer_release(down);
  ferry_transfer_release(up);
  for (size_t i = 0; i < n; i++) free(bufs[i]);
  free(bufs);
  free(transposed);
  free(dims);
  free(in);
  free(view);
}

static void *run(void *arg) {
  job *j = arg;
  uint32_t rng = j->seed | 1;
  for (int r = 0; r < ROUNDS; r++) one_round(j, &rng);
  return NULL;
}

TEST(sixteen_threads_round_trip) {
  int dev = gpu_dev;
  pthread_t tid[THREADS];
  job jobs[THREADS];
  for (int i = 0; i < THREADS; i++) {
    jobs[i] = (job){dev, 0x9e3779b9u * (unsigned)(i + 1), 0, 0, 0, 0};
    pthread_create(&tid[i], NULL, run, &jobs[i]);
  }
  size_t mismatches = 0, tensors = 0, bytes = 0;
  int errors = 0;
  for (int i = 0; i < THREADS; i++) {
    pthread_join(tid[i], NULL);
    mismatches += jobs[i].mismatches;
    tensors += jobs[i].tensors;
    bytes += jobs[i].bytes;
    errors += jobs[i].errors;
  }
  EXPECT(errors == 0, "%d transfers failed", errors);
  EXPECT(mismatches == 0, "%zu mismatched tensors over %d threads", mismatches, THREADS);
  printf("   %d threads x %d rounds: %zu tensors, %.1f MiB each way, %zu mismatches, %d errors\n", THREADS, ROUNDS,
         tensors, (double)bytes / (1 << 20), mismatches, errors);
}
