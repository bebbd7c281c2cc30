/* test_hostile_files.c — the disk cache and artifact import against files and directories someone else shaped:
 * what the operator runtime's own tests (test_ops_cache.c) do not already cover. A cache directory or a cache
 * file owned by another user, a cache file that is a symbolic link, a FIFO where a file should be (which must not
 * block the caller), a sparse file far larger than any artifact, a cache "directory" that is a file. Every one is
 * refused — never loaded — and the compile still succeeds; so is a cache file with a second name (a hard link).
 * The ownership tests need root (to give a file away); elsewhere they report a skip. The libFuzzer target
 * tests/fuzz/fuzz_artifact.c covers the file's contents. */
#include "test_ops.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#define OTHER_UID 65534 /* nobody */

static ferry_cache_stats cache_stats(void) {
  ferry_cache_stats s;
  ferry_cache_stats_get(&s);
  return s;
}

static ferry_artifact *compile_tiny(const ferry_op *op) {
  ferry_gemm_args args;
  test_args(&args, FERRY_SCALAR_F32, FERRY_SCALAR_F32, 8, 8, 8);
  ferry_artifact *art = NULL;
  ASSERT_OK(ferry_op_compile_for(op, &args, 90, &art));
  return art;
}

/* Compiles `name` once into a fresh cache home `home`, clears the memo, and returns the one cache file's path. */
static const ferry_op *cached_once(const char *name, char *home, size_t home_size, char *file, size_t file_size) {
  test_cache_home(home, home_size, name);
  const ferry_op *op = tiny_op(name);
  ferry_artifact_release(compile_tiny(op));
  ferry_ops_clear_memo();
  char dir[400];
  snprintf(dir, sizeof dir, "%s/ferry", home);
  DIR *d = opendir(dir);
  ASSERT(d != NULL);
  struct dirent *e;
  int found = 0;
  while ((e = readdir(d)) != NULL)
    if (e->d_name[0] != '.') snprintf(file, file_size, "%.300s/%.200s", dir, e->d_name), found++;
  closedir(d);
  ASSERT_EQ(found, 1);
  return op;
}

/* The next compile of `op` must not have loaded the cache file: no disk hit, one more NVRTC compile. */
static void expect_not_loaded(const ferry_op *op, const char *why) {
  ferry_cache_stats before = cache_stats();
  ferry_artifact *art = compile_tiny(op);
  ferry_cache_stats after = cache_stats();
  ASSERT_EQ(after.disk_hits, before.disk_hits);
  ASSERT_EQ(after.compiles, before.compiles + 1);
  ASSERT_STR_CONTAINS(after.disk_note, why);
  size_t n = 0;
  ASSERT(!memcmp(ferry_artifact_cubin(art, &n), "\x7f" "ELF", 4));
  ferry_artifact_release(art);
  ferry_ops_clear_memo();
}

static void need_root(void) {
  if (geteuid() != 0) SKIP("not root, so no file can be given to another user here");
}

TEST(cache_dir_owned_by_another_user_is_refused) {
  need_root();
  if (!test_have_nvrtc()) return;
  char home[300], file[600], dir[400];
  const ferry_op *op = cached_once("hostile_owner_dir", home, sizeof home, file, sizeof file);
  snprintf(dir, sizeof dir, "%s/ferry", home);
  ASSERT(chown(dir, OTHER_UID, OTHER_UID) == 0);
  ferry_cache_stats before = cache_stats();
  ferry_artifact_release(compile_tiny(op));
  ferry_cache_stats after = cache_stats();
  ASSERT_EQ(after.disk_enabled, 0);
  ASSERT_EQ(after.disk_hits, before.disk_hits);
  ASSERT_EQ(after.disk_writes, before.disk_writes);
  ASSERT_STR_CONTAINS(after.disk_note, "owned by uid 65534");
  test_rm_rf(home);
}

TEST(cache_file_owned_by_another_user_is_not_loaded) {
  need_root();
  if (!test_have_nvrtc()) return;
  char home[300], file[600];
  const ferry_op *op = cached_once("hostile_owner_file", home, sizeof home, file, sizeof file);
  ASSERT(chown(file, OTHER_UID, OTHER_UID) == 0);
  expect_not_loaded(op, "owned by another user");
  struct stat sb;
  ASSERT(stat(file, &sb) == 0);
  ASSERT_EQ(sb.st_uid, geteuid()); /* replaced by the user's own rebuilt file */
  test_rm_rf(home);
}

TEST(cache_file_that_is_a_symlink_is_not_loaded) {
  if (!test_have_nvrtc()) return;
  char home[300], file[600], elsewhere[700];
  const ferry_op *op = cached_once("hostile_link_file", home, sizeof home, file, sizeof file);
  /* The link points at a perfectly valid copy of the entry: it is the link that is refused. */
  snprintf(elsewhere, sizeof elsewhere, "%s/valid-copy", home);
  ASSERT(rename(file, elsewhere) == 0);
  ASSERT(symlink(elsewhere, file) == 0);
  expect_not_loaded(op, "symbolic link");
  struct stat sb;
  ASSERT(lstat(file, &sb) == 0);
  ASSERT(S_ISREG(sb.st_mode)); /* the rebuilt entry replaced the link; the link's target was not written */
  test_rm_rf(home);
}

TEST(cache_file_with_a_hard_link_is_not_loaded) {
  if (!test_have_nvrtc()) return;
  char home[300], file[600], other[700];
  const ferry_op *op = cached_once("hostile_hardlink", home, sizeof home, file, sizeof file);
  /* A second name for the entry, outside the cache directory: whoever can write there could change the file. */
  snprintf(other, sizeof other, "%s/other-name", home);
  ASSERT(link(file, other) == 0);
  expect_not_loaded(op, "hard link");
  struct stat sb, ob;
  ASSERT(stat(file, &sb) == 0 && stat(other, &ob) == 0);
  ASSERT(sb.st_ino != ob.st_ino); /* the rebuilt entry is a file of its own; the other name was not written */
  ASSERT_EQ(sb.st_nlink, 1);
  test_rm_rf(home);
}

/* Runs `fn` in a child with a 5-second alarm: a blocked open shows as a timeout, not a hung suite. */
static void within_5s(void (*fn)(void), const char *what) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    alarm(5);
    fn();
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFSIGNALED(status))
    FAIL_AT("%s: killed by signal %d%s", what, WTERMSIG(status), WTERMSIG(status) == SIGALRM ? " (it blocked)" : "");
  ASSERT_EQ(WEXITSTATUS(status), 0);
}

static char fifo_path[600];

static void import_fifo(void) {
  ferry_artifact *art = NULL;
  ASSERT_STATUS(ferry_artifact_import(fifo_path, &art), FERRY_IO_ERROR);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "not a regular file");
  ASSERT(art == NULL);
}

TEST(import_of_a_fifo_does_not_block) {
  char home[300];
  test_cache_home(home, sizeof home, "fifo_import");
  ASSERT(mkdir(home, 0700) == 0);
  snprintf(fifo_path, sizeof fifo_path, "%s/a.ferry", home);
  ASSERT(mkfifo(fifo_path, 0600) == 0);
  within_5s(import_fifo, "importing a FIFO");
  test_rm_rf(home);
}

static const ferry_op *fifo_op;
static void compile_over_fifo(void) { expect_not_loaded(fifo_op, "not a regular file"); }

TEST(cache_entry_that_is_a_fifo_does_not_block) {
  if (!test_have_nvrtc()) return;
  char home[300], file[600];
  fifo_op = cached_once("hostile_fifo", home, sizeof home, file, sizeof file);
  ASSERT(unlink(file) == 0 && mkfifo(file, 0600) == 0);
  /* In this process, not a forked child: the compile that follows the refused entry needs NVRTC, which cannot be
   * used in a child forked after the parent used it (seen on the H200 machine: NVRTC_ERROR_INTERNAL_ERROR). A
   * blocked open still shows as a failure: the alarm ends the test process, and the runner reports the signal. */
  alarm(5);
  compile_over_fifo();
  alarm(0);
  test_rm_rf(home);
}

TEST(import_of_a_huge_sparse_file_is_refused_unread) {
  char home[300], file[400];
  test_cache_home(home, sizeof home, "huge");
  ASSERT(mkdir(home, 0700) == 0);
  snprintf(file, sizeof file, "%s/huge.ferry", home);
  int fd = open(file, O_CREAT | O_WRONLY, 0600);
  ASSERT(fd >= 0);
  ASSERT(write(fd, FERRY__ART_MAGIC, 8) == 8);
  ASSERT(ftruncate(fd, (off_t)1 << 40) == 0); /* 1 TiB of holes: reading it would take hours */
  close(fd);
  ferry_artifact *art = NULL;
  ASSERT_STATUS(ferry_artifact_import(file, &art), FERRY_IO_ERROR);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "larger than any artifact");
  test_rm_rf(home);
}

TEST(cache_dir_that_is_a_file_is_refused) {
  if (!test_have_nvrtc()) return;
  char home[300], dir[400];
  test_cache_home(home, sizeof home, "hostile_notdir");
  ASSERT(mkdir(home, 0700) == 0);
  snprintf(dir, sizeof dir, "%s/ferry", home);
  int fd = open(dir, O_CREAT | O_WRONLY, 0600);
  ASSERT(fd >= 0);
  close(fd);
  ferry_artifact_release(compile_tiny(tiny_op("hostile_notdir")));
  ferry_cache_stats s = cache_stats();
  ASSERT_EQ(s.disk_enabled, 0);
  ASSERT_EQ(s.disk_writes, 0);
  test_rm_rf(home);
}
