/* runner.c — runs every CPU test in its own process with a timeout and prints "N passed, N failed" (and how many
 * skipped, when a test ended with SKIP).
 * Usage: ferry_test_cpu [--help] [--list] [NAME...]  (names select tests; default all) */
#include "test.h"
/* One runner, several suites: a suite's executable defines TEST_LIST_HEADER to its own list. */
#ifdef TEST_LIST_HEADER
#include TEST_LIST_HEADER
#else
#include "test_list.h"
#endif

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#define DECLARE(name) void test_##name(void);
TEST_LIST(DECLARE)
#define ENTRY(name) {#name, test_##name},
static const test_entry tests[] = {TEST_LIST(ENTRY)};
#define TIMEOUT_S 60

/* 1 passed, 0 failed, 2 skipped. */
static int run_one(const test_entry *t) {
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    alarm(TIMEOUT_S);
    t->fn();
    fflush(NULL);
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return 1;
  if (WIFEXITED(status) && WEXITSTATUS(status) == TEST_SKIP_EXIT) return 2;
  if (WIFSIGNALED(status))
    fprintf(stderr, "  killed by signal %d%s\n", WTERMSIG(status), WTERMSIG(status) == SIGALRM ? " (timeout)" : "");
  return 0;
}

int main(int argc, char **argv) {
  size_t n = sizeof tests / sizeof tests[0];
  int passed = 0, failed = 0, skipped = 0;
#ifdef TEST_MAIN_HOOK
  /* A suite may answer extra command-line modes (e.g. --table); it returns -1 for "not mine". */
  int hook_rc = TEST_MAIN_HOOK(argc, argv);
  if (hook_rc >= 0) return hook_rc;
#endif
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help")) {
      printf("usage: %s [--list] [TEST...]\nRuns ferry's CPU tests, each in its own process (timeout %d s).\n",
             argv[0], TIMEOUT_S);
      return 0;
    }
    if (!strcmp(argv[i], "--list")) {
      for (size_t k = 0; k < n; k++) puts(tests[k].name);
      return 0;
    }
  }
  for (size_t k = 0; k < n; k++) {
    int selected = argc == 1;
    for (int i = 1; i < argc; i++) selected |= !strcmp(argv[i], tests[k].name);
    if (!selected) continue;
    int r = run_one(&tests[k]);
    printf("%s %s\n", r == 1 ? "ok  " : r == 2 ? "skip" : "FAIL", tests[k].name);
    r == 1 ? passed++ : r == 2 ? skipped++ : failed++;
  }
  if (skipped) printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
  else printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
