/* common.c — clocks, statistics, generator, CSV and batch helpers for the benchmarks (see common.h). */
#include "common.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

void bench_usage_error(const char *program, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "ferry: %s: ", program);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, " (see `ferry %s --help`)\n", program);
  va_end(ap);
  exit(BENCH_EXIT_USAGE);
}

int bench_no_gpu(const char *program) {
  ferry_status st = ferry_init();
  if (st == FERRY_OK) return 0;
  printf("%s: no GPU here (%s: %s).\nNothing to measure; on this machine ferry's transfers pass tensors through "
         "unchanged.\n", program, ferry_status_name(st), ferry_last_error_message());
  return 1;
}

double bench_now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

double bench_percentile(const double *v, int n, double q) {
  if (n <= 0) return NAN;
  double *s = malloc((size_t)n * sizeof *s);
  if (!s) return NAN;
  memcpy(s, v, (size_t)n * sizeof *s);
  qsort(s, (size_t)n, sizeof *s, cmp_double);
  double pos = q / 100.0 * (double)(n - 1);
  int lo = (int)floor(pos);
  int hi = lo + 1 < n ? lo + 1 : lo;
  double r = s[lo] + (s[hi] - s[lo]) * (pos - (double)lo);
  free(s);
  return r;
}

double bench_median(const double *v, int n) { return bench_percentile(v, n, 50.0); }

uint64_t bench_rng_next(bench_rng *r) {
  uint64_t z = (r->state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double bench_rng_uniform(bench_rng *r) { return (double)(bench_rng_next(r) >> 11) * (1.0 / 9007199254740992.0); }

uint64_t bench_rng_below(bench_rng *r, uint64_t n) { return n ? bench_rng_next(r) % n : 0; }

void bench_bootstrap_median_ci(const double *v, int n, int resamples, uint64_t seed, double *lo, double *hi) {
  double *medians = malloc((size_t)resamples * sizeof *medians), *draw = malloc((size_t)n * sizeof *draw);
  if (!medians || !draw || n <= 0 || resamples <= 0) {
    *lo = *hi = NAN;
    free(medians);
    free(draw);
    return;
  }
  bench_rng rng = {seed};
  for (int r = 0; r < resamples; r++) {
    for (int i = 0; i < n; i++) draw[i] = v[bench_rng_below(&rng, (uint64_t)n)];
    medians[r] = bench_median(draw, n);
  }
  *lo = bench_percentile(medians, resamples, 2.5);
  *hi = bench_percentile(medians, resamples, 97.5);
  free(medians);
  free(draw);
}

static void make_parents(const char *path) {
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", path);
  for (char *p = dir + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    (void)mkdir(dir, 0755); /* an existing directory is fine; a real failure shows up at fopen */
    *p = '/';
  }
}

FILE *bench_csv_open(const char *path) {
  make_parents(path);
  FILE *f = fopen(path, "w");
  if (!f) {
    fprintf(stderr, "ferry: cannot write %s: %s\n", path, strerror(errno));
    exit(1);
  }
  return f;
}

long bench_parse_long(const char *flag, const char *text, long min, long max) {
  char *end = NULL;
  errno = 0;
  long v = strtol(text, &end, 10);
  if (errno || !end || *end || end == text || v < min || v > max) {
    if (max == LONG_MAX) fprintf(stderr, "ferry: %s expects an integer >= %ld, got '%s'\n", flag, min, text);
    else fprintf(stderr, "ferry: %s expects an integer from %ld to %ld, got '%s'\n", flag, min, max, text);
    exit(BENCH_EXIT_USAGE);
  }
  return v;
}

double bench_parse_positive_double(const char *flag, const char *text) {
  char *end = NULL;
  errno = 0;
  double v = strtod(text, &end);
  if (errno || !end || *end || end == text || !(v > 0) || !isfinite(v)) {
    fprintf(stderr, "ferry: %s expects a positive number, got '%s'\n", flag, text);
    exit(BENCH_EXIT_USAGE);
  }
  return v;
}

const char *bench_value(const char *program, int argc, char **argv, int *i) {
  if (*i + 1 >= argc) bench_usage_error(program, "%s needs a value", argv[*i]);
  return argv[++*i];
}

int bench_parse_device(const char *flag, const char *text) {
  const char *p = text;
  if (!strcmp(p, "cuda")) return 0;
  if (!strncmp(p, "cuda:", 5)) p += 5;
  char *end = NULL;
  errno = 0;
  long v = strtol(p, &end, 10);
  if (!*p || *end || errno || v < 0 || v > 1 << 20 || *p == '-' || *p == '+' || *p == ' ') {
    fprintf(stderr, "ferry: %s expects a CUDA device (cuda, cuda:N or N), got '%s'\n", flag, text);
    exit(BENCH_EXIT_USAGE);
  }
  return (int)v;
}

void bench_check_output(const char *flag, const char *path) {
  struct stat sb;
  const char *why = NULL;
  char dir[4096];
  if (!*path) why = "it is empty";
  else if (strlen(path) >= sizeof dir) why = "it is too long";
  else if (stat(path, &sb) == 0) {
    if (S_ISDIR(sb.st_mode)) why = "it is a directory";
    else if (access(path, W_OK) != 0) why = strerror(errno);
  } else if (errno != ENOENT) {
    why = strerror(errno); /* e.g. a parent that is a file: ENOTDIR */
  } else {
    /* The nearest existing ancestor must be a directory we can create entries in (the rest is made on open). */
    snprintf(dir, sizeof dir, "%s", path);
    for (;;) {
      char *slash = strrchr(dir, '/');
      if (!slash) {
        snprintf(dir, sizeof dir, ".");
      } else if (slash == dir) {
        dir[1] = '\0';
      } else {
        *slash = '\0';
      }
      if (stat(dir, &sb) == 0) {
        if (!S_ISDIR(sb.st_mode)) why = "a parent of it is not a directory";
        else if (access(dir, W_OK | X_OK) != 0) why = strerror(errno);
        break;
      }
      if (errno != ENOENT) {
        why = strerror(errno);
        break;
      }
      if (!strcmp(dir, ".") || !strcmp(dir, "/")) break;
    }
  }
  if (why) {
    fprintf(stderr, "ferry: %s %s cannot be written: %s\n", flag, path, why);
    exit(BENCH_EXIT_USAGE);
  }
}

bench_batch bench_batch_cut(char *base, size_t total, size_t n, int device_type, int device_id) {
  bench_batch b = {n, calloc(n, sizeof(ferry_tensor)), calloc(n, sizeof(int64_t)), calloc(n, sizeof(uint64_t))};
  if (!b.t || !b.shapes || !b.offsets) {
    fprintf(stderr, "ferry: out of memory describing %zu tensors\n", n);
    exit(1);
  }
  /* SPDL's split: the first (total mod n) tensors are one byte longer. */
  size_t size = total / n, rem = total % n, off = 0;
  for (size_t i = 0; i < n; i++) {
    b.shapes[i] = (int64_t)(size + (i < rem));
    b.offsets[i] = off;
    b.t[i] = (ferry_tensor){base + off, {device_type, device_id}, 1, {FERRY_DTYPE_UINT, 8, 1}, &b.shapes[i], NULL, 0};
    off += (size_t)b.shapes[i];
  }
  return b;
}

void bench_batch_free(bench_batch *b) {
  free(b->t);
  free(b->shapes);
  free(b->offsets);
  memset(b, 0, sizeof *b);
}

/* ---- several processes ------------------------------------------------------------------------------------- */

static int env_int(const char *name, int fallback) {
  const char *v = getenv(name);
  if (!v || !*v) return fallback;
  char *end = NULL;
  long x = strtol(v, &end, 10);
  return (*end || x < 0 || x > 1 << 20) ? fallback : (int)x;
}

bench_ranks bench_ranks_from_env(void) {
  bench_ranks r = {env_int("RANK", 0), env_int("LOCAL_RANK", -1), env_int("WORLD_SIZE", 1)};
  if (r.world_size < 1) r.world_size = 1;
  return r;
}

const char *bench_rank_path(const char *path, int rank, char *buf, size_t size) {
  const char *dot = strrchr(path, '.'), *slash = strrchr(path, '/');
  if (!dot || (slash && dot < slash)) snprintf(buf, size, "%s.rank%d", path, rank);
  else snprintf(buf, size, "%.*s.rank%d%s", (int)(dot - path), path, rank, dot);
  return buf;
}

void bench_rank_barrier(const bench_ranks *r, const char *name, double timeout_s) {
  if (r->world_size <= 1) return;
  char dir[512], path[700];
  const char *base = getenv("FERRY_BARRIER_DIR");
  if (base && *base) snprintf(dir, sizeof dir, "%s", base);
  else snprintf(dir, sizeof dir, "/tmp/ferry-ranks-%ld", (long)getppid());
  (void)mkdir(dir, 0700);
  snprintf(path, sizeof path, "%s/%s.%d", dir, name, r->rank);
  FILE *f = fopen(path, "w");
  if (!f) {
    fprintf(stderr, "ferry: rank %d cannot write barrier file %s: %s\n", r->rank, path, strerror(errno));
    exit(1);
  }
  fclose(f);
  double deadline = bench_now_ms() + timeout_s * 1e3;
  for (;;) {
    int arrived = 0;
    for (int k = 0; k < r->world_size; k++) {
      snprintf(path, sizeof path, "%s/%s.%d", dir, name, k);
      struct stat sb;
      arrived += stat(path, &sb) == 0;
    }
    if (arrived == r->world_size) return;
    if (bench_now_ms() > deadline) {
      fprintf(stderr, "ferry: rank %d waited %.0f s at barrier '%s' in %s: %d of %d ranks arrived\n", r->rank,
              timeout_s, name, dir, arrived, r->world_size);
      exit(1);
    }
    struct timespec pause = {0, 200000}; /* 0.2 ms: arrivals are seen promptly without a busy core */
    nanosleep(&pause, NULL);
  }
}
