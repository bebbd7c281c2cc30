/* test_gpu.c — GPU tests, run on the H200 (`build/ferry_test_gpu`): byte-exact D2H and H2D round trips. */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;
#define EXPECT(cond, ...)                                  \
  do {                                                     \
    if (!(cond)) {                                         \
      failures++;                                          \
      printf("FAIL %s:%d: ", __FILE__, __LINE__);          \
      printf(__VA_ARGS__);                                 \
      printf(" (last error: %s)\n", ferry_last_error_message()); \
    }                                                      \
  } while (0)

/* Round trip of n tensors of random sizes (some strided transposes) with bytes from a seeded generator. */
static void round_trip(int dev, size_t n, size_t max_bytes, int strided, unsigned seed) {
  srand(seed);
  size_t *sizes = calloc(n, sizeof *sizes), total = 0;
  for (size_t i = 0; i < n; i++) {
    sizes[i] = (size_t)(rand() % (int)max_bytes) / 4 * 4 + 4;
    if (i % 7 == 3) sizes[i] = 0; /* zero-size tensors mixed in */
    total += sizes[i];
  }
  unsigned char *host = malloc(total + 1);
  for (size_t i = 0; i < total; i++) host[i] = (unsigned char)rand();
  ferry_tensor *t = calloc(n, sizeof *t);
  int64_t *shapes = calloc(2 * n, sizeof(int64_t)), *strides = calloc(2 * n, sizeof(int64_t));
  size_t off = 0;
  for (size_t i = 0; i < n; i++) {
    /* As 2-D int32 [rows, cols]; every 5th tensor as a transposed view (strided). */
    int64_t elems = (int64_t)sizes[i] / 4, rows = 1;
    for (int64_t r = 2; r * r <= elems; r++) if (elems % r == 0) rows = r;
    shapes[2 * i] = rows;
    shapes[2 * i + 1] = elems / (rows ? rows : 1);
    t[i] = (ferry_tensor){host + off, {FERRY_DEVICE_CPU, 0}, 2, {FERRY_DTYPE_INT, 32, 1}, &shapes[2 * i], NULL, 0};
    off += sizes[i];
  }
  ferry_transfer_options o;
  ferry_transfer_options_init(&o);
  o.device = dev;
  o.flags = FERRY_TRANSFER_BLOCKING;
  ferry_transfer *up = NULL, *down = NULL;
  ferry_status st = ferry_transfer_h2d(t, n, &o, &up);
  EXPECT(st == FERRY_OK, "h2d of %zu tensors: %s", n, ferry_status_name(st));
  if (st != FERRY_OK) goto out;
  const ferry_tensor *dev_t = ferry_transfer_outputs(up);
  ferry_tensor *views = calloc(n, sizeof *views);
  int64_t *vshape = calloc(2 * n, sizeof(int64_t));
  for (size_t i = 0; i < n; i++) {
    views[i] = dev_t[i];
    EXPECT(dev_t[i].device.device_type == FERRY_DEVICE_CUDA, "output %zu not on the device", i);
    if (strided && i % 5 == 0) { /* transpose view of the device tensor */
      vshape[2 * i] = dev_t[i].shape[1];
      vshape[2 * i + 1] = dev_t[i].shape[0];
      strides[2 * i] = 1;
      strides[2 * i + 1] = dev_t[i].shape[1];
      views[i].shape = &vshape[2 * i];
      views[i].strides = &strides[2 * i];
    }
  }
  st = ferry_transfer_d2h(views, n, &o, &down);
  EXPECT(st == FERRY_OK, "d2h of %zu tensors: %s", n, ferry_status_name(st));
  if (st == FERRY_OK) {
    const ferry_tensor *h = ferry_transfer_outputs(down);
    size_t bad = 0;
    off = 0;
    for (size_t i = 0; i < n; i++) {
      const int32_t *src = (const int32_t *)(host + off), *got = h[i].data;
      int64_t R = shapes[2 * i], C = shapes[2 * i + 1];
      if (sizes[i] && strided && i % 5 == 0) {
        for (int64_t c = 0; c < C; c++)
          for (int64_t r = 0; r < R; r++) bad += got[c * R + r] != src[r * C + c];
      } else if (sizes[i]) {
        bad += memcmp(got, src, sizes[i]) != 0;
      }
      off += sizes[i];
    }
    EXPECT(bad == 0, "%zu tensors (strided=%d): %zu mismatches", n, strided, bad);
    printf("round trip %5zu tensors, %8.2f MiB, strided=%d: %s\n", n, (double)total / (1 << 20), strided,
           bad ? "MISMATCH" : "exact");
  }
  ferry_transfer_release(down);
  free(views);
  free(vshape);
out:
  ferry_transfer_release(up);
  free(sizes);
  free(host);
  free(t);
  free(shapes);
  free(strides);
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "--help")) {
    puts("usage: ferry_test_gpu\nRuns ferry's GPU tests on cuda:0 (LOCAL_RANK honoured); needs a GPU.");
    return 0;
  }
  if (ferry_init() != FERRY_OK) {
    printf("no GPU: %s\n", ferry_last_error_message());
    return 1;
  }
  int dev;
  if (ferry_device_resolve(-1, &dev) != FERRY_OK) return 1;
  size_t counts[] = {1, 32, 256, 4096};
  for (int k = 0; k < 4; k++) {
    round_trip(dev, counts[k], counts[k] == 1 ? (8u << 20) : (256u << 10), 0, 1234 + k);
    round_trip(dev, counts[k], counts[k] == 1 ? (8u << 20) : (256u << 10), 1, 99 + k);
  }
  round_trip(dev, 64, 16u << 20, 1, 7); /* large strided tensors: many items each */
  ferry_pool_stats s;
  ferry_pool_stats_get(&s);
  printf("pool after tests: pinned %.1f MiB, in use %.1f MiB, regions %llu, hits %llu, misses %llu\n",
         (double)s.bytes_pinned / (1 << 20), (double)s.bytes_in_use / (1 << 20), (unsigned long long)s.regions,
         (unsigned long long)s.hits, (unsigned long long)s.misses);
  if (s.bytes_in_use != 0) { failures++; printf("FAIL: pool still has %llu bytes in use\n", (unsigned long long)s.bytes_in_use); }
  printf("%d passed, %d failed\n", failures ? 0 : 1, failures ? 1 : 0);
  return failures ? 1 : 0;
}
