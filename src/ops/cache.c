/* cache.c — the disk cache of compiled operators: one verified file per compile key in a private directory.
 *
 * The directory is $XDG_CACHE_HOME/ferry (else $HOME/.cache/ferry), created 0700. Because a cubin from the cache
 * is loaded into the GPU, the directory must be the user's own: a symbolic link, a directory owned by someone
 * else, or one that group or others can write is refused (the cache is then skipped, and the stats say why).
 * The directory is opened once per lookup or store (O_DIRECTORY, O_NOFOLLOW), checked on that descriptor, and every
 * file is reached relative to it (openat, renameat, unlinkat), so the directory checked is the directory used. A
 * cache file must be a regular file of the user's with no other name (a hard link to it elsewhere could change
 * it) and is opened without following links. Files are written atomically (temporary file, fsync, rename), so
 * concurrent writers — threads or processes — and crashes leave either the old file, the new one or none, never a
 * torn one; and every read verifies the whole file (format, lengths, checksum, key, operator) before use. A file
 * that fails is removed and rebuilt.
 *
 * A hit costs a short key (source.c), an open/fstat of the directory and an openat/fstat/pread of the file, and a
 * checksum at memory speed (artifact.c); the cubin is then used in place in the file's image.
 */
#include "ops.h"

#include <errno.h>
#include <fcntl.h>
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

int ferry__cache_dir_open(char *out, size_t size) {
  const char *off = getenv("FERRY_DISK_CACHE");
  if (off && strcmp(off, "0") == 0) {
    note(0, "", "the disk cache is off (FERRY_DISK_CACHE=0)");
    return -1;
  }
  const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
  int n;
  /* XDG: a relative XDG_CACHE_HOME is invalid and must be ignored. */
  if (xdg && xdg[0] == '/') n = snprintf(out, size, "%s/ferry", xdg);
  else if (home && home[0] == '/') n = snprintf(out, size, "%s/.cache/ferry", home);
  else {
    note(0, "", "no cache directory: neither XDG_CACHE_HOME nor HOME is an absolute path");
    return -1;
  }
  if (n < 0 || (size_t)n >= size - 80) {
    note(0, "", "the cache directory's path is too long");
    return -1;
  }
  /* The directory is opened once, without following a link in its last component, and what is checked (owner,
   * mode) and then used (every file in it, relative to this descriptor) is that directory: it cannot be swapped for
   * another between the check and the use. Usually it exists: one open, and mkdir only when it is missing. */
  int flags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
  int fd = open(out, flags);
  if (fd < 0 && errno == ENOENT) {
    if (make_dirs(out) != 0) {
      note(0, out, "cannot create %s: %s", out, strerror(errno));
      return -1;
    }
    fd = open(out, flags);
  }
  if (fd < 0) {
    struct stat lsb; /* for the message only: what is there is refused either way */
    if (errno == ELOOP || (errno == ENOTDIR && lstat(out, &lsb) == 0 && S_ISLNK(lsb.st_mode)))
      note(0, out, "%s is a symbolic link; refusing it as the cache directory", out);
    else if (errno == ENOTDIR) note(0, out, "%s is not a directory", out);
    else note(0, out, "cannot open %s: %s", out, strerror(errno));
    return -1;
  }
  struct stat sb;
  if (fstat(fd, &sb) != 0) {
    note(0, out, "cannot stat %s: %s", out, strerror(errno));
    close(fd);
    return -1;
  }
  if (sb.st_uid != geteuid()) {
    note(0, out, "%s is owned by uid %ld, not by this user (%ld); refusing it", out, (long)sb.st_uid,
         (long)geteuid());
    close(fd);
    return -1;
  }
  if (sb.st_mode & 022) {
    note(0, out, "%s is writable by group or others (mode %03o); refusing it (chmod 700 to use it)", out,
         (unsigned)(sb.st_mode & 0777));
    close(fd);
    return -1;
  }
  note(1, out, NULL);
  return fd;
}

/* The entry of `key` in the directory: "<64 hex digits>.ferry". */
static void file_name(const uint8_t key[32], char out[80]) {
  char hex[65];
  ferry__hex(key, 32, hex);
  snprintf(out, 80, "%s.ferry", hex);
}

int ferry__cache_load(const ferry_op *op, uint32_t kind, int sm, const uint8_t key[32], void **block,
                      unsigned char **cubin, size_t *cubin_size) {
  char dir[600], name[80], why[200];
  unsigned char *file = NULL;
  size_t size = 0, offset = 0;
  int missing = 0;
  ferry__art_meta meta;
  uint8_t got_key[32];
  int dirfd = ferry__cache_dir_open(dir, sizeof dir);
  if (dirfd < 0) return 0;
  file_name(key, name);
  ferry_error saved = *ferry_last_error();
  ferry_status st = ferry__read_file_at(dirfd, dir, name, 1, &file, &size, &missing);
  if (st != FERRY_OK) {
    /* A miss, or a file that cannot be read (then it is also replaced by the store that follows). */
    if (!missing) note(1, NULL, "skipped: %s", ferry_last_error_message()); /* the message names the path */
    ferry__error_restore(&saved);
    pthread_mutex_lock(&stats_lock);
    stats.disk_misses++;
    pthread_mutex_unlock(&stats_lock);
    close(dirfd);
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
    snprintf(stats.disk_note, sizeof stats.disk_note, "rejected %.90s/%.70s: %.80s", dir, name, why);
  }
  pthread_mutex_unlock(&stats_lock);
  /* Never load a file that failed; remove it so the rebuilt one takes its place. */
  if (!ok) unlinkat(dirfd, name, 0);
  close(dirfd);
  return ok;
}

void ferry__cache_store(const ferry_artifact *art) {
  char dir[600], name[80];
  unsigned char *file = NULL;
  size_t size = 0;
  int dirfd = ferry__cache_dir_open(dir, sizeof dir);
  if (dirfd < 0) return;
  file_name(art->key, name);
  ferry_error saved = *ferry_last_error();
  ferry_status st = ferry__art_encode(art, &file, &size);
  if (st == FERRY_OK) st = ferry__write_atomic_at(dirfd, dir, name, file, size, 0600);
  pthread_mutex_lock(&stats_lock);
  if (st == FERRY_OK) stats.disk_writes++;
  else {
    stats.disk_write_failures++;
    snprintf(stats.disk_note, sizeof stats.disk_note, "could not write %.80s/%.70s: %.80s", dir, name,
             ferry_last_error_message());
  }
  pthread_mutex_unlock(&stats_lock);
  ferry__error_restore(&saved); /* a cache that cannot be written is not the caller's error */
  free(file);
  close(dirfd);
}

/* fork.c: held across fork() so a child never inherits the lock held by a thread it does not have. */
void ferry__cache_fork_lock(int lock) { lock ? pthread_mutex_lock(&stats_lock) : pthread_mutex_unlock(&stats_lock); }
