/* A plausibility check for the harness's slow 4096-tensor calls (docs/results.md, section 3): does freeing a
 * thread's allocations on another thread slow that thread's next allocations in glibc? One thread makes 4096 x 3
 * blocks (sizes like torch's per-tensor objects) 200 times; they are freed on the maker, or (any argument) on
 * the main thread between rounds. Prints the median time of the maker's allocations. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#define N 4096
#define PER 3
static void *blocks[N * PER];
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static void alloc_all(void) {
  static const size_t sizes[PER] = {72, 216, 168};
  for (int i = 0; i < N; i++)
    for (int j = 0; j < PER; j++) { blocks[i * PER + j] = malloc(sizes[j]); *(volatile char *)blocks[i * PER + j] = 1; }
}
static void free_all(void) { for (int i = 0; i < N * PER; i++) free(blocks[i]); }
static int cross;
static pthread_barrier_t b1, b2;
static double maker_s[200];
static void *maker(void *arg) {
  for (int r = 0; r < 200; r++) {
    double t0 = now(); alloc_all(); maker_s[r] = now() - t0;
    if (cross) { pthread_barrier_wait(&b1); pthread_barrier_wait(&b2); } else free_all();
  }
  return NULL;
}
static int cmp(const void *a, const void *b) { double x = *(double *)a, y = *(double *)b; return (x > y) - (x < y); }
int main(int argc, char **argv) {
  cross = argc > 1;
  pthread_barrier_init(&b1, NULL, 2); pthread_barrier_init(&b2, NULL, 2);
  pthread_t t; pthread_create(&t, NULL, maker, NULL);
  if (cross) for (int r = 0; r < 200; r++) { pthread_barrier_wait(&b1); free_all(); pthread_barrier_wait(&b2); }
  pthread_join(t, NULL);
  qsort(maker_s, 200, sizeof(double), cmp);
  printf("%s: %d allocations on the maker thread, median %.1f us (%.1f ns each)\n",
         cross ? "freed on another thread" : "freed on the maker", N * PER, maker_s[100] * 1e6, maker_s[100] * 1e9 / (N * PER));
}
