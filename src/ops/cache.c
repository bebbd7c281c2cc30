/* cache.c — the disk cache of compiled operators: one verified file per compile key in a private directory.
 *
 * The directory is $XDG_CACHE_HOME/ferry (else $HOME/.cache/ferry), created 0700. Because a cubin from the cache
 * is loaded into the GPU, the directory must be the user's own: a symbolic link, a directory owned by someone
 * else, or one that group or others can write is refused (the cache is then skipped, and the stats say why).
 * Files are written atomically (temporary file, fsync, rename), so concurrent writers — threads or processes —
 * and crashes leave either the old file, the new one or none, never a torn one; and every read verifies the whole
 * file (format, lengths, checksum, key, operator) before use. A file that fails is removed and rebuilt.
 *
 * A hit costs a short key (source.c), one open/fstat/pread of the file, and a checksum at memory speed
 * (artifact.c); the cubin is then used in place in the file's image.
 */
#include "ops.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static pthread_mutex_t stats_lock = PTHREAD_MUTEX_INITIALIZER;
static ferry_cache_stats stats;

void ferry_cache_stats_get(ferry_cache_stats *out) {
  if (!out) return;
  pthread_mutex_lock(&stats_lock);
  *out = stats;
  pthread_mutex_unlock(&stats_lock);
}

void ferry__stats_add_compile(double seconds) {
  pthread_mutex_lock(&stats_lock);
  stats.compiles++;
  stats.compile_seconds += seconds;
  pthread_mutex_unlock(&stats_lock);
}

void ferry__stats_memo(int hit) {
  pthread_mutex_lock(&stats_lock);
  if (hit) stats.memo_hits++;
  else stats.memo_misses++;
  pthread_mutex_unlock(&stats_lock);
}

static void note(int enabled, const char *dir, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void note(int enabled, const char *dir, const char *fmt, ...) {
  pthread_mutex_lock(&stats_lock);
  stats.disk_enabled = enabled;
  if (dir) snprintf(stats.disk_dir, sizeof stats.disk_dir, "%s", dir);
  if (fmt) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(stats.disk_note, sizeof stats.disk_note, fmt, ap);
    va_end(ap);
  }
  pthread_mutex_unlock(&stats_lock);
}

/* mkdir -p with mode 0700 for each missing component (XDG asks 0700 for a cache home it has to create). */
static int make_dirs(char *path) {
  for (char *p = path + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    int r = mkdir(path, 0700);
    *p = '/';
    if (r != 0 && errno != EEXIST) return -1;
  }
  return mkdir(path, 0700) == 0 || errno == EEXIST ? 0 : -1;
}

int ferry__cache_dir(char *out, size_t size) {
  const char *off = getenv("FERRY_DISK_CACHE");
  if (off && strcmp(off, "0") == 0) {
    note(0, "", "the disk cache is off (FERRY_DISK_CACHE=0)");
    return 0;
  }
  const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
  int n;
  /* XDG: a relative XDG_CACHE_HOME is invalid and must be ignored. */
  if (xdg && xdg[0] == '/') n = snprintf(out, size, "%s/ferry", xdg);
  else if (home && home[0] == '/') n = snprintf(out, size, "%s/.cache/ferry", home);
  else {
    note(0, "", "no cache directory: neither XDG_CACHE_HOME nor HOME is an absolute path");
    return 0;
  }
  if (n < 0 || (size_t)n >= size - 80) {
    note(0, "", "the cache directory's path is too long");
    return 0;
  }
  /* Usually the directory exists: one lstat, and the mkdir of every component only when it is missing. */
  struct stat sb;
  if (lstat(out, &sb) != 0) {
    if (errno != ENOENT || make_dirs(out) != 0) {
      note(0, out, "cannot create %s: %s", out, strerror(errno));
      return 0;
    }
    if (lstat(out, &sb) != 0) {
      note(0, out, "cannot stat %s: %s", out, strerror(errno));
      return 0;
    }
  }
  if (S_ISLNK(sb.st_mode)) {
    note(0, out, "%s is a symbolic link; refusing it as the cache directory", out);
    return 0;
  }
  if (!S_ISDIR(sb.st_mode)) {
    note(0, out, "%s is not a directory", out);
    return 0;
  }
  if (sb.st_uid != geteuid()) {
    note(0, out, "%s is owned by uid %ld, not by this user (%ld); refusing it", out, (long)sb.st_uid,
         (long)geteuid());
    return 0;
  }
  if (sb.st_mode & 022) {
    note(0, out, "%s is writable by group or others (mode %03o); refusing it (chmod 700 to use it)", out,
         (unsigned)(sb.st_mode & 0777));
    return 0;
  }
  note(1, out, NULL);
  return 1;
}

static void file_path(const char *dir, const uint8_t key[32], char *out, size_t size) {
  char hex[65];
  ferry__hex(key, 32, hex);
  snprintf(out, size, "%s/%s.ferry", dir, hex);
}

int ferry__cache_load(const ferry_op *op, uint32_t kind, int sm, const uint8_t key[32], void **block,
                      unsigned char **cubin, size_t *cubin_size) {
  char dir[600], path[700], why[200];
  unsigned char *file = NULL;
  size_t size = 0, offset = 0;
  int missing = 0;
  ferry__art_meta meta;
  uint8_t got_key[32];
  if (!ferry__cache_dir(dir, sizeof dir)) return 0;
  file_path(dir, key, path, sizeof path);
  ferry_error saved = *ferry_last_error();
  ferry_status st = ferry__read_file(path, 1, &file, &size, &missing);
  if (st != FERRY_OK) {
    /* A miss, or a file that cannot be read (then it is also replaced by the store that follows). */
    if (!missing) note(1, NULL, "skipped: %s", ferry_last_error_message()); /* the message names the path */
    ferry__error_restore(&saved);
    pthread_mutex_lock(&stats_lock);
    stats.disk_misses++;
    pthread_mutex_unlock(&stats_lock);
    return 0;
  }
  int ok = ferry__art_verify(file, size, key, &meta, got_key, &offset, why, sizeof why);
  if (ok && (strcmp(meta.op_name, op->info.name) != 0 || memcmp(meta.op_digest, op->digest, 32) != 0 ||
             meta.kind != kind || meta.sm != sm)) {
    snprintf(why, sizeof why, "its record names another operator, kind or target");
    ok = 0;
  }
  if (ok) {
    *block = file;
    *cubin = file + offset;
    *cubin_size = (size_t)meta.cubin_size;
  } else {
    free(file);
  }
  pthread_mutex_lock(&stats_lock);
  if (ok) stats.disk_hits++;
  else stats.disk_misses++;
  if (!ok) {
    stats.disk_rejected++;
    snprintf(stats.disk_note, sizeof stats.disk_note, "rejected %.120s: %.120s", path, why);
  }
  pthread_mutex_unlock(&stats_lock);
  /* Never load a file that failed; remove it so the rebuilt one takes its place. */
  if (!ok) unlink(path);
  return ok;
}

void ferry__cache_store(const ferry_artifact *art) {
  char dir[600], path[700];
  unsigned char *file = NULL;
  size_t size = 0;
  if (!ferry__cache_dir(dir, sizeof dir)) return;
  file_path(dir, art->key, path, sizeof path);
  ferry_error saved = *ferry_last_error();
  ferry_status st = ferry__art_encode(art, &file, &size);
  if (st == FERRY_OK) st = ferry__write_atomic(path, file, size, 0600);
  pthread_mutex_lock(&stats_lock);
  if (st == FERRY_OK) stats.disk_writes++;
  else {
    stats.disk_write_failures++;
    snprintf(stats.disk_note, sizeof stats.disk_note, "could not write %.90s: %.130s", path, ferry_last_error_message());
  }
  pthread_mutex_unlock(&stats_lock);
  ferry__error_restore(&saved); /* a cache that cannot be written is not the caller's error */
  free(file);
}

/* fork.c: held across fork() so a child never inherits the lock held by a thread it does not have. */
void ferry__cache_fork_lock(int lock) { lock ? pthread_mutex_lock(&stats_lock) : pthread_mutex_unlock(&stats_lock); }
