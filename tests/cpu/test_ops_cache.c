/* The disk cache and artifact files: hits, misses, every kind of bad file (rejected, removed, rebuilt — never
 * loaded), concurrent writers, directory permissions, export and import. */
#include "test_ops.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

/* The one cache file of the test's cache home (fails if there is not exactly one). */
static void the_file(const char *home, char *path, size_t size) {
  char dir[400];
  snprintf(dir, sizeof dir, "%s/ferry", home);
  DIR *d = opendir(dir);
  ASSERT(d != NULL);
  int found = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    snprintf(path, size, "%.300s/%.255s", dir, e->d_name);
    found++;
  }
  closedir(d);
  if (found != 1) FAIL_AT("expected one file in %s, found %d", dir, found);
}

static ferry_artifact *compile_tiny(const ferry_op *op, int type) {
  ferry_gemm_args args;
  test_args(&args, type, FERRY_SCALAR_F32, 8, 8, 8);
  ferry_artifact *art = NULL;
  ASSERT_OK(ferry_op_compile_for(op, &args, 90, &art));
  return art;
}

static ferry_cache_stats stats(void) {
  ferry_cache_stats s;
  ferry_cache_stats_get(&s);
  return s;
}

/* Compiles once (a miss, written), clears the memo: the next compile reads the file. */
static const ferry_op *prepared(const char *name, const char *home, char *path, size_t size) {
  const ferry_op *op = tiny_op(name);
  ferry_artifact_release(compile_tiny(op, FERRY_SCALAR_F32));
  ferry_ops_clear_memo();
  the_file(home, path, size);
  return op;
}

static void patch_file(const char *path, long offset, const void *bytes, size_t n) {
  int fd = open(path, O_WRONLY);
  ASSERT(fd >= 0);
  ASSERT(pwrite(fd, bytes, n, offset) == (ssize_t)n);
  close(fd);
}

/* After a bad file: it was rejected (not loaded), compiled again, and replaced by a good one. */
static void expect_rejected_and_rebuilt(const ferry_op *op, const char *home, const char *why) {
  ferry_cache_stats before = stats();
  ferry_artifact *art = compile_tiny(op, FERRY_SCALAR_F32);
  ferry_cache_stats after = stats();
  ASSERT_EQ(after.disk_rejected, before.disk_rejected + 1);
  ASSERT_EQ(after.compiles, before.compiles + 1);
  ASSERT_EQ(after.disk_writes, before.disk_writes + 1);
  ASSERT_STR_CONTAINS(after.disk_note, why);
  size_t size = 0;
  const unsigned char *cubin = ferry_artifact_cubin(art, &size);
  ASSERT(!memcmp(cubin, "\x7f" "ELF", 4));
  ferry_artifact_release(art);
  ferry_ops_clear_memo();
  char path[600];
  the_file(home, path, sizeof path);
  ferry_artifact_release(compile_tiny(op, FERRY_SCALAR_F32)); /* the rebuilt file verifies */
  ASSERT_EQ(stats().disk_hits, after.disk_hits + 1);
}

TEST(cache_hit_after_miss) {
  if (!test_have_nvrtc()) return;
  char home[300], path[600];
  test_cache_home(home, sizeof home, "hit");
  const ferry_op *op = tiny_op("tiny_hit");
  ferry_artifact_release(compile_tiny(op, FERRY_SCALAR_F32));
  ferry_cache_stats s = stats();
  ASSERT_EQ(s.disk_misses, 1);
  ASSERT_EQ(s.disk_writes, 1);
  ASSERT_EQ(s.compiles, 1);
  ASSERT_EQ(s.disk_enabled, 1);
  the_file(home, path, sizeof path);
  struct stat sb;
  ASSERT(stat(path, &sb) == 0);
  ASSERT_EQ(sb.st_mode & 0777, 0600);
  char dir[400];
  snprintf(dir, sizeof dir, "%s/ferry", home);
  ASSERT(stat(dir, &sb) == 0);
  ASSERT_EQ(sb.st_mode & 0777, 0700);
  ASSERT_STR_CONTAINS(s.disk_dir, dir);
  ferry_ops_clear_memo();
  ferry_artifact_release(compile_tiny(op, FERRY_SCALAR_F32));
  s = stats();
  ASSERT_EQ(s.disk_hits, 1);
  ASSERT_EQ(s.compiles, 1);
  test_rm_rf(home);
}

TEST(cache_rejects_flipped_byte) {
  if (!test_have_nvrtc()) return;
  char home[300], path[600];
  test_cache_home(home, sizeof home, "flip");
  const ferry_op *op = prepared("tiny_flip", home, path, sizeof path);
  struct stat sb;
  ASSERT(stat(path, &sb) == 0);
  unsigned char b;
  int fd = open(path, O_RDONLY);
  ASSERT(pread(fd, &b, 1, sb.st_size - 100) == 1);
  close(fd);
  b ^= 0x10;
  patch_file(path, sb.st_size - 100, &b, 1);
  expect_rejected_and_rebuilt(op, home, "damaged");
  test_rm_rf(home);
}

TEST(cache_rejects_truncation) {
  if (!test_have_nvrtc()) return;
  char home[300], path[600];
  test_cache_home(home, sizeof home, "trunc");
  const ferry_op *op = prepared("tiny_trunc", home, path, sizeof path);
  struct stat sb;
  ASSERT(stat(path, &sb) == 0);
  ASSERT(truncate(path, sb.st_size / 2) == 0);
  expect_rejected_and_rebuilt(op, home, "truncated");
  ASSERT(truncate(path, 10) == 0); /* shorter than the header */
  ferry_ops_clear_memo();
  expect_rejected_and_rebuilt(op, home, "truncated");
  test_rm_rf(home);
}

TEST(cache_rejects_wrong_version) {
  if (!test_have_nvrtc()) return;
  char home[300], path[600];
  test_cache_home(home, sizeof home, "version");
  const ferry_op *op = prepared("tiny_version", home, path, sizeof path);
  const unsigned char next[4] = {FERRY__ART_VERSION + 1, 0, 0, 0};
  patch_file(path, 8, next, 4);
  char why[64];
  snprintf(why, sizeof why, "format version %u; this ferry reads version %u", FERRY__ART_VERSION + 1,
           FERRY__ART_VERSION);
  expect_rejected_and_rebuilt(op, home, why);
  /* A file of format 1, as the ferry before this one wrote it (SHA-256 of the payload where the checksum is now),
   * under the name a lookup asks for: refused for its version and replaced, never read as the current format. */
  unsigned char *file = NULL;
  size_t size = 0;
  ASSERT_OK(ferry__read_file(path, 0, &file, &size, NULL));
  const unsigned char v1[4] = {1, 0, 0, 0};
  memcpy(file + 8, v1, 4);
  ferry__sha256_of(file + FERRY__ART_HEADER, size - FERRY__ART_HEADER, file + 56);
  FILE *f = fopen(path, "wb");
  ASSERT(f && fwrite(file, 1, size, f) == size);
  fclose(f);
  free(file);
  ferry_ops_clear_memo();
  char version_why[64];
  snprintf(version_why, sizeof version_why, "format version 1; this ferry reads version %u", FERRY__ART_VERSION);
  expect_rejected_and_rebuilt(op, home, version_why);
  patch_file(path, 0, "FERRYARX", 8);
  ferry_ops_clear_memo();
  expect_rejected_and_rebuilt(op, home, "bad magic");
  test_rm_rf(home);
}

TEST(cache_rejects_wrong_key) {
  if (!test_have_nvrtc()) return;
  char home[300], path_a[600], path_b[600];
  test_cache_home(home, sizeof home, "key");
  const ferry_op *op = prepared("tiny_key", home, path_a, sizeof path_a);
  /* Compile the f16 kind too, then move the f32 kind's file to the name (key) the f16 kind looks for. */
  ferry_artifact_release(compile_tiny(op, FERRY_SCALAR_F16));
  ferry_ops_clear_memo();
  /* two files now; find the f16 one by elimination */
  char dir[400];
  snprintf(dir, sizeof dir, "%s/ferry", home);
  DIR *d = opendir(dir);
  struct dirent *e;
  path_b[0] = '\0';
  while ((e = readdir(d)) != NULL) {
    char p[1024];
    snprintf(p, sizeof p, "%.400s/%.255s", dir, e->d_name);
    if (e->d_name[0] != '.' && strcmp(p, path_a)) snprintf(path_b, sizeof path_b, "%.590s", p);
  }
  closedir(d);
  ASSERT(path_b[0]);
  ASSERT(rename(path_a, path_b) == 0); /* a valid file under another key's name */
  ferry_cache_stats before = stats();
  ferry_gemm_args args;
  test_args(&args, FERRY_SCALAR_F16, FERRY_SCALAR_F32, 8, 8, 8);
  ferry_artifact *art = NULL;
  ASSERT_OK(ferry_op_compile_for(op, &args, 90, &art));
  ferry_cache_stats after = stats();
  ASSERT_EQ(after.disk_rejected, before.disk_rejected + 1);
  ASSERT_STR_CONTAINS(after.disk_note, "another compile's key");
  ASSERT_EQ(ferry_artifact_kind(art), args.problem.kind);
  ferry_artifact_release(art);
  test_rm_rf(home);
}

TEST(cache_concurrent_writers) {
  if (!test_have_nvrtc()) return;
  char home[300], path[600];
  test_cache_home(home, sizeof home, "race");
  const ferry_op *op = tiny_op("tiny_race");
  ferry_artifact *art = compile_tiny(op, FERRY_SCALAR_F32);
  the_file(home, path, sizeof path);
  enum { WRITERS = 8, ROUNDS = 40 };
  pid_t pids[WRITERS];
  for (int w = 0; w < WRITERS; w++) {
    pids[w] = fork();
    ASSERT(pids[w] >= 0);
    if (pids[w] == 0) {
      /* Each writer stores the same key over and over while reading it back: a reader must only ever see a
       * whole, valid file. */
      int bad = 0;
      for (int r = 0; r < ROUNDS; r++) {
        ferry__cache_store(art);
        unsigned char *cubin = NULL;
        void *block = NULL;
        size_t size = 0;
        if (ferry__cache_load(op, art->kind, 90, art->key, &block, &cubin, &size)) free(block);
        else bad++;
      }
      ferry_cache_stats s;
      ferry_cache_stats_get(&s);
      _exit(bad || s.disk_rejected || s.disk_write_failures ? 1 : 0);
    }
  }
  int failed = 0;
  for (int w = 0; w < WRITERS; w++) {
    int status = 0;
    waitpid(pids[w], &status, 0);
    failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  ASSERT_EQ(failed, 0);
  the_file(home, path, sizeof path); /* one file, no temporary left behind */
  unsigned char *cubin = NULL;
  void *block = NULL;
  size_t size = 0;
  ASSERT(ferry__cache_load(op, art->kind, 90, art->key, &block, &cubin, &size));
  ASSERT_EQ(size, art->cubin_size);
  ASSERT(!memcmp(cubin, art->cubin, size));
  free(block);
  ferry_artifact_release(art);
  test_rm_rf(home);
}

TEST(cache_refuses_world_writable_dir) {
  if (!test_have_nvrtc()) return;
  char home[300], dir[400];
  test_cache_home(home, sizeof home, "perm");
  snprintf(dir, sizeof dir, "%s/ferry", home);
  ASSERT(mkdir(home, 0700) == 0 && mkdir(dir, 0700) == 0 && chmod(dir, 0777) == 0);
  ferry_artifact_release(compile_tiny(tiny_op("tiny_perm"), FERRY_SCALAR_F32)); /* still compiles */
  ferry_cache_stats s = stats();
  ASSERT_EQ(s.disk_enabled, 0);
  ASSERT_EQ(s.disk_writes, 0);
  ASSERT_STR_CONTAINS(s.disk_note, "writable by group or others (mode 777)");
  ASSERT(chmod(dir, 0720) == 0);
  ferry_ops_clear_memo();
  ferry_artifact_release(compile_tiny(ferry_op_by_name("tiny_perm"), FERRY_SCALAR_F32));
  ASSERT_EQ(stats().disk_writes, 0); /* group-writable is refused too */
  ASSERT(chmod(dir, 0700) == 0);
  ferry_ops_clear_memo();
  ferry_artifact_release(compile_tiny(ferry_op_by_name("tiny_perm"), FERRY_SCALAR_F32));
  ASSERT_EQ(stats().disk_writes, 1);
  test_rm_rf(home);
}

TEST(cache_refuses_symlinked_dir) {
  if (!test_have_nvrtc()) return;
  char home[300], dir[400], real[400];
  test_cache_home(home, sizeof home, "link");
  snprintf(dir, sizeof dir, "%s/ferry", home);
  snprintf(real, sizeof real, "%s/elsewhere", home);
  ASSERT(mkdir(home, 0700) == 0 && mkdir(real, 0700) == 0 && symlink(real, dir) == 0);
  ferry_artifact_release(compile_tiny(tiny_op("tiny_link"), FERRY_SCALAR_F32));
  ferry_cache_stats s = stats();
  ASSERT_EQ(s.disk_enabled, 0);
  ASSERT_STR_CONTAINS(s.disk_note, "symbolic link");
  DIR *d = opendir(real);
  int files = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) files += e->d_name[0] != '.';
  closedir(d);
  ASSERT_EQ(files, 0); /* nothing was written through the link */
  test_rm_rf(home);
}

TEST(cache_can_be_turned_off) {
  if (!test_have_nvrtc()) return;
  char home[300];
  test_cache_home(home, sizeof home, "off");
  setenv("FERRY_DISK_CACHE", "0", 1);
  ferry_artifact_release(compile_tiny(tiny_op("tiny_off"), FERRY_SCALAR_F32));
  ferry_cache_stats s = stats();
  ASSERT_EQ(s.disk_writes, 0);
  ASSERT_STR_CONTAINS(s.disk_note, "FERRY_DISK_CACHE=0");
  struct stat sb;
  ASSERT(stat(home, &sb) != 0); /* not even created */
  test_rm_rf(home);
}

TEST(export_import_round_trip) {
  if (!test_have_nvrtc()) return;
  char home[300], file[400];
  test_cache_home(home, sizeof home, "export");
  unsetenv("FERRY_ARCH");
  fake_driver_use();
  const ferry_op *op = tiny_op("tiny_export");
  ferry_artifact *art = compile_tiny(op, FERRY_SCALAR_F32);
  snprintf(file, sizeof file, "%s/exported.ferry", home);
  ASSERT_OK(ferry_artifact_export(art, file));
  ferry_ops_clear_memo();
  ferry_artifact *back = NULL;
  ASSERT_OK(ferry_artifact_import(file, &back));
  ASSERT(back != art);
  ASSERT(ferry_artifact_op(back) == op);
  ASSERT_EQ(ferry_artifact_kind(back), ferry_artifact_kind(art));
  ASSERT_EQ(ferry_artifact_target_sm(back), 90);
  size_t a_size = 0, b_size = 0;
  const void *a_cubin = ferry_artifact_cubin(art, &a_size), *b_cubin = ferry_artifact_cubin(back, &b_size);
  ASSERT_EQ(a_size, b_size);
  ASSERT(!memcmp(a_cubin, b_cubin, a_size));
  /* a run with the import uses it; a run without an artifact uses compile's (from the disk cache: no NVRTC) */
  ferry_cache_stats before = stats();
  ferry_gemm_args args;
  test_args(&args, FERRY_SCALAR_F32, FERRY_SCALAR_F32, 8, 8, 8);
  ASSERT_OK(ferry_op_run(op, &args, NULL, back, 0));
  ASSERT_OK(ferry_op_run(op, &args, NULL, NULL, 0));
  ASSERT(ferry__memo_lookup(op, args.problem.kind, 90) != back);
  ASSERT_EQ(stats().compiles, before.compiles);
  ASSERT_EQ(stats().disk_hits, before.disk_hits + 1);
  ASSERT_EQ(fake_launches, 2);
  ferry_artifact_release(back);
  ferry_artifact_release(art);
  ferry_ops_clear_memo();
  ASSERT_EQ(fake_live_libraries, 0);
  ASSERT_STATUS(ferry_artifact_export(NULL, file), FERRY_INVALID_ARGUMENT);
  char nodir[500];
  snprintf(nodir, sizeof nodir, "%s/missing/dir/x.ferry", home);
  art = compile_tiny(op, FERRY_SCALAR_F32);
  ASSERT_STATUS(ferry_artifact_export(art, nodir), FERRY_IO_ERROR);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "missing/dir");
  ferry_artifact_release(art);
  test_rm_rf(home);
}

/* Rewrites the file's checksum after patching it, so that only what was patched is wrong. */
static void patch_payload(const char *path, long offset, const void *bytes, size_t n) {
  unsigned char *file = NULL;
  size_t size = 0;
  ASSERT_OK(ferry__read_file(path, 0, &file, &size, NULL));
  memcpy(file + offset, bytes, n);
  uint64_t check = ferry__art_checksum(file, size - FERRY__ART_HEADER);
  for (int i = 0; i < 8; i++) file[56 + i] = (unsigned char)(check >> (8 * i));
  FILE *f = fopen(path, "wb");
  ASSERT(f && fwrite(file, 1, size, f) == size);
  fclose(f);
  free(file);
}

TEST(import_rejects_bad_files) {
  if (!test_have_nvrtc()) return;
  char home[300], file[400], link[400];
  test_cache_home(home, sizeof home, "import");
  const ferry_op *op = tiny_op("tiny_import");
  ferry_artifact *art = compile_tiny(op, FERRY_SCALAR_F32), *back = NULL;
  snprintf(file, sizeof file, "%s/a.ferry", home);
  ASSERT_STATUS(ferry_artifact_import(file, &back), FERRY_IO_ERROR); /* missing */
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "a.ferry");
  ASSERT_OK(ferry_artifact_export(art, file));
  unsigned char b = 0xee;
  patch_file(file, 400, &b, 1);
  ASSERT_STATUS(ferry_artifact_import(file, &back), FERRY_BAD_ARTIFACT);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "damaged");
  ASSERT_OK(ferry_artifact_export(art, file));
  ASSERT(truncate(file, 300) == 0);
  ASSERT_STATUS(ferry_artifact_import(file, &back), FERRY_BAD_ARTIFACT);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "truncated");
  ASSERT_OK(ferry_artifact_export(art, file));
  patch_payload(file, FERRY__ART_HEADER, "tiny_unknown", 12);
  ASSERT_STATUS(ferry_artifact_import(file, &back), FERRY_BAD_ARTIFACT);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "tiny_unknown, which is not registered");
  ASSERT_OK(ferry_artifact_export(art, file));
  patch_payload(file, FERRY__ART_HEADER + 64, "\x01\x02", 2); /* the operator's source digest */
  ASSERT_STATUS(ferry_artifact_import(file, &back), FERRY_BAD_ARTIFACT);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "another version of operator tiny_import");
  ASSERT_OK(ferry_artifact_export(art, file));
  patch_payload(file, FERRY__ART_HEADER + FERRY__ART_META, "MZ", 2); /* not a cubin */
  ASSERT_STATUS(ferry_artifact_import(file, &back), FERRY_BAD_ARTIFACT);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "ELF");
  ASSERT_OK(ferry_artifact_export(art, file));
  snprintf(link, sizeof link, "%s/link.ferry", home);
  ASSERT(symlink(file, link) == 0);
  ASSERT_STATUS(ferry_artifact_import(link, &back), FERRY_IO_ERROR);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "symbolic link");
  ASSERT(back == NULL);
  ASSERT_STATUS(ferry_artifact_import(NULL, &back), FERRY_INVALID_ARGUMENT);
  ferry_artifact_release(art);
  test_rm_rf(home);
}

/* An imported artifact is the caller's to pass to runs: it never enters the memo, so compile keeps returning what
 * NVRTC made even when a file that verifies holds another cubin under the same operator, kind, target and key. */
TEST(import_never_replaces_what_compile_returns) {
  if (!test_have_nvrtc()) return;
  char home[300], file[400];
  test_cache_home(home, sizeof home, "import_memo");
  unsetenv("FERRY_ARCH");
  fake_driver_use();
  const ferry_op *op = tiny_op("tiny_import_memo");
  ferry_artifact *art = compile_tiny(op, FERRY_SCALAR_F32), *imported = NULL;
  size_t n = 0, m = 0;
  const unsigned char *made = ferry_artifact_cubin(art, &n);
  snprintf(file, sizeof file, "%s/other.ferry", home);
  ASSERT_OK(ferry_artifact_export(art, file));
  patch_payload(file, FERRY__ART_HEADER + FERRY__ART_META + 64, "\xde\xad\xbe\xef", 4); /* another cubin */
  ferry_ops_clear_memo();
  ASSERT_OK(ferry_artifact_import(file, &imported));
  ASSERT_EQ(ferry_artifact_kind(imported), ferry_artifact_kind(art));
  ASSERT_EQ(ferry_artifact_target_sm(imported), 90);
  ASSERT(memcmp(ferry_artifact_cubin(imported, &m), made, n) != 0);
  ferry_artifact *compiled = compile_tiny(op, FERRY_SCALAR_F32);
  ASSERT(compiled != imported);
  ASSERT(!memcmp(ferry_artifact_cubin(compiled, &m), made, n));
  ASSERT_EQ(m, n);
  /* The memo, which runs without an artifact use, holds compile's artifact, before and after a run. */
  ferry_gemm_args args;
  test_args(&args, FERRY_SCALAR_F32, FERRY_SCALAR_F32, 8, 8, 8);
  ASSERT(ferry__memo_lookup(op, args.problem.kind, 90) == compiled);
  ASSERT_OK(ferry_op_run(op, &args, NULL, NULL, 0));
  ASSERT(ferry__memo_lookup(op, args.problem.kind, 90) == compiled);
  ferry_artifact_release(compiled);
  ferry_artifact_release(imported);
  ferry_artifact_release(art);
  ferry_ops_clear_memo();
  test_rm_rf(home);
}

TEST(checksum_covers_the_header) {
  if (!test_have_nvrtc()) return;
  char home[300], path[600], file[400];
  test_cache_home(home, sizeof home, "header");
  const ferry_op *op = prepared("tiny_header", home, path, sizeof path);
  /* A flipped bit in the recorded key is damage, found by the checksum, not a file of another compile. */
  unsigned char b;
  int fd = open(path, O_RDONLY);
  ASSERT(pread(fd, &b, 1, 20) == 1);
  close(fd);
  b ^= 0x01;
  patch_file(path, 20, &b, 1);
  expect_rejected_and_rebuilt(op, home, "damaged");
  /* The same in an exported file, which has no expected key to compare with. */
  ferry_artifact *art = compile_tiny(op, FERRY_SCALAR_F32), *back = NULL;
  snprintf(file, sizeof file, "%s/a.ferry", home);
  ASSERT_OK(ferry_artifact_export(art, file));
  patch_file(file, 20, &b, 1);
  ASSERT_STATUS(ferry_artifact_import(file, &back), FERRY_BAD_ARTIFACT);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "damaged");
  ASSERT(back == NULL);
  ferry_artifact_release(art);
  test_rm_rf(home);
}

/* A file whose checksum and lengths agree but whose cubin is shorter than an ELF header: refused before any of
 * its cubin is read (the verifier once compared the ELF magic past the end of a one-byte cubin). The buffer is
 * exactly the file's size, so a sanitizer or valgrind build sees any read beyond it. */
TEST(verify_refuses_a_cubin_shorter_than_an_elf_header) {
  const ferry_op *op = tiny_op("tiny_short_cubin");
  static const unsigned char elf[64] = {0x7f, 'E', 'L', 'F', 2, 1, 1};
  ferry_artifact art = {.op = op, .kind = 0, .sm = 90, .cubin = (unsigned char *)elf};
  for (size_t cubin_size = 0; cubin_size <= sizeof elf; cubin_size += 1) {
    art.cubin_size = cubin_size;
    unsigned char *file = NULL;
    size_t size = 0;
    ASSERT_OK(ferry__art_encode(&art, &file, &size));
    ferry__art_meta meta;
    uint8_t key[32];
    size_t offset = 0;
    char why[200] = "";
    ASSERT(!ferry__art_verify(file, size, NULL, &meta, key, &offset, why, sizeof why));
    /* a full-sized header gets past the length check, to the record's kind (0 is not a valid kind) */
    ASSERT_STR_CONTAINS(why, cubin_size < sizeof elf ? "no room for an ELF header" : "malformed operator record");
    free(file);
  }
}

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e6 + (double)t.tv_nsec * 1e-3;
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* The host's part of a disk-cache hit and of an import, for the operator `ferry bench latency` uses (128³ fp16,
 * the first found for sm_90): printed, not asserted, since sanitizer builds and CI machines vary. The driver is
 * simulated, so its cuLibraryLoadData costs nothing here; on the H200 it adds ~13 µs for a small cubin. */
TEST(cache_hit_costs_microseconds) {
  if (!test_have_nvrtc()) return;
  char home[300], file[400];
  test_cache_home(home, sizeof home, "cost");
  unsetenv("FERRY_ARCH");
  fake_driver_use();
  ferry_gemm_args args;
  test_args(&args, FERRY_SCALAR_F16, FERRY_SCALAR_F16, 128, 128, 128);
  const ferry_op *found[8];
  size_t n = 0;
  ASSERT_OK(ferry_ops_find(&args, 90, NULL, NULL, found, 8, &n));
  ASSERT(n > 0);
  const ferry_op *op = found[0];
  ferry_artifact *art = NULL;
  ASSERT_OK(ferry_op_compile_for(op, &args, 90, &art)); /* NVRTC, then stored */
  snprintf(file, sizeof file, "%s/exported.ferry", home);
  ASSERT_OK(ferry_artifact_export(art, file));
  size_t cubin_size = 0;
  ferry_artifact_cubin(art, &cubin_size);
  ferry_artifact_release(art);
  enum { REPS = 41 };
  double hit[REPS], import_[REPS], digest[REPS];
  for (int r = 0; r < REPS; r++) {
    ferry_ops_clear_memo();
    double t0 = now_us();
    ASSERT_OK(ferry_op_compile_for(op, &args, 90, &art));
    hit[r] = now_us() - t0;
    ferry_artifact_release(art);
    ferry_ops_clear_memo();
    t0 = now_us();
    ASSERT_OK(ferry_artifact_import(file, &art));
    import_[r] = now_us() - t0;
    ferry_artifact_release(art);
    uint8_t d[32];
    t0 = now_us();
    ferry__op_body_digest(op, d);
    digest[r] = now_us() - t0;
  }
  ferry_cache_stats s;
  ferry_cache_stats_get(&s);
  ASSERT_EQ(s.compiles, 1);
  ASSERT_EQ(s.disk_hits, REPS);
  qsort(hit, REPS, sizeof hit[0], by_value);
  qsort(import_, REPS, sizeof import_[0], by_value);
  qsort(digest, REPS, sizeof digest[0], by_value);
  fprintf(stderr, "  %s (%zu-byte cubin), medians: disk-cache hit %.1f us, import %.1f us (host, simulated "
          "driver); the operator's source digest, once per process: %.1f us\n", ferry_op_info_get(op)->name,
          cubin_size, hit[REPS / 2], import_[REPS / 2], digest[REPS / 2]);
  test_rm_rf(home);
}
