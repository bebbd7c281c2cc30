/* common.h — what ferry's benchmark programs share: clocks, robust statistics, a seeded generator, CSV files,
 * and failure macros for programs (a benchmark may exit on error; the library never does).
 *
 * Statistics follow numpy's conventions (percentiles with linear interpolation), so figures from the C and the
 * Python benchmarks are computed the same way and can be compared column by column.
 */
#ifndef FERRY_BENCH_COMMON_H
#define FERRY_BENCH_COMMON_H

#include "internal.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- failure --------------------------------------------------------------------------------------------- */

/* Exit statuses of the `ferry` program and its benchmarks: 0 done (also "no GPU here, nothing to measure"), 1 a
 * failure while working, 2 a bad command line (nothing was started). Every message on stderr starts "ferry: ". */
enum { BENCH_EXIT_OK = 0, BENCH_EXIT_FAILURE = 1, BENCH_EXIT_USAGE = 2 };

/* Prints "ferry: <program>: <message> (see `ferry <program> --help`)" and exits with BENCH_EXIT_USAGE. */
void bench_usage_error(const char *program, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));

#define BENCH_CU(x)                                                                                          \
  do {                                                                                                       \
    CUresult r_ = (x);                                                                                       \
    if (r_ != CUDA_SUCCESS) {                                                                                \
      fprintf(stderr, "ferry: %s failed: %s (%s:%d)\n", #x, ferry__cu_name(r_), __FILE__, __LINE__);         \
      exit(1);                                                                                               \
    }                                                                                                        \
  } while (0)
#define BENCH_F(x)                                                                                           \
  do {                                                                                                       \
    ferry_status s_ = (x);                                                                                   \
    if (s_ != FERRY_OK) {                                                                                    \
      fprintf(stderr, "ferry: %s failed: %s: %s\n", #x, ferry_status_name(s_), ferry_last_error_message()); \
      exit(1);                                                                                               \
    }                                                                                                        \
  } while (0)

/* Prints that there is no GPU (and why) and returns 1 when ferry cannot use one; 0 when a GPU is there. */
int bench_no_gpu(const char *program);

/* ---- clocks and statistics ------------------------------------------------------------------------------- */

double bench_now_ms(void);                               /* CLOCK_MONOTONIC, milliseconds */
double bench_percentile(const double *v, int n, double q); /* q in [0, 100]; numpy's 'linear'; v is not changed */
double bench_median(const double *v, int n);

/* A small seeded generator (splitmix64): the same seed gives the same schedule on every machine. */
typedef struct bench_rng { uint64_t state; } bench_rng;
uint64_t bench_rng_next(bench_rng *r);
double bench_rng_uniform(bench_rng *r);         /* [0, 1) */
uint64_t bench_rng_below(bench_rng *r, uint64_t n); /* [0, n) */

/* Percentile-bootstrap 95% confidence interval of the median of v[0..n). */
void bench_bootstrap_median_ci(const double *v, int n, int resamples, uint64_t seed, double *lo, double *hi);

/* ---- CSV and arguments ----------------------------------------------------------------------------------- */

/* Opens `path` for writing, creating missing parent directories; exits with a message on failure. */
FILE *bench_csv_open(const char *path);

/* The value of the option at argv[*i] (advancing *i past it), or a usage error when it is the last argument. */
const char *bench_value(const char *program, int argc, char **argv, int *i);

/* Parses an integer from `min` to `max` or exits with a usage error naming the flag. */
long bench_parse_long(const char *flag, const char *text, long min, long max);

/* The largest value an option counting MiB accepts: its bytes fit an int64_t. */
#define BENCH_MAX_MIB (INT64_MAX >> 20)
double bench_parse_positive_double(const char *flag, const char *text);

/* Parses a CUDA device as "cuda", "cuda:N" or "N" (cuda is cuda:0), or exits with a usage error naming the flag.
 * Whether the device exists is checked once the driver is loaded (ferry_device_resolve), before any work. */
int bench_parse_device(const char *flag, const char *text);

/* Exits with a usage error naming the flag when `path` cannot be written as a file: it is a directory, an
 * existing file not writable, or its nearest existing parent is not a directory we may write into. Creates
 * nothing, so a run that finds no GPU leaves no file behind; the file is opened (parents made) when results exist. */
void bench_check_output(const char *flag, const char *path);

/* A batch of n device (or host) tensors of uint8 cut from one buffer: sizes differ by at most one byte. */
typedef struct bench_batch {
  size_t n;
  ferry_tensor *t;
  int64_t *shapes;
  uint64_t *offsets; /* byte offset of tensor i in the buffer */
} bench_batch;
bench_batch bench_batch_cut(char *base, size_t total, size_t n, int device_type, int device_id);
void bench_batch_free(bench_batch *b);

/* ---- several processes (torchrun) ------------------------------------------------------------------------ */

/* This process's place in a torchrun-style launch: RANK, LOCAL_RANK and WORLD_SIZE from the environment
 * (0, -1 and 1 when unset: a lone process). */
typedef struct bench_ranks { int rank, local_rank, world_size; } bench_ranks;
bench_ranks bench_ranks_from_env(void);

/* "out.csv" -> "out.rank3.csv" for rank 3; `buf` holds the result. */
const char *bench_rank_path(const char *path, int rank, char *buf, size_t size);

/* Waits until all world_size processes of this launch have reached barrier `name` (use each name once). Files in
 * a directory shared by the launch carry the arrivals, so no communication library is needed: $FERRY_BARRIER_DIR,
 * else /tmp/ferry-ranks-<parent pid> (torchrun's agent is the parent of all its ranks, so each launch gets its own
 * directory). A process that does not arrive within `timeout_s` makes the others exit with a message naming the
 * barrier. A lone process returns at once. */
void bench_rank_barrier(const bench_ranks *r, const char *name, double timeout_s);

#endif
