/* runner.c — the one runner of ferry's C test programs (CPU and GPU): each test of the program's list runs in its
 * own process with a timeout, and the run ends with "N passed, N failed, N skipped".
 *
 * A test program is this file built with -DTEST_LIST_HEADER="its_list.h". The list header defines
 * TEST_LIST(X) (one X(name) per test, in the order they run) and may define:
 *   TEST_SUITE_HELP            what the program tests, and its own options, for --help
 *   TEST_TIMEOUT_S             the default per-test timeout in seconds (else 60)
 *   TEST_OPTION(argc, argv, i) parses the program's own option at argv[i], before any test runs: returns how many
 *                              arguments it took, 0 when argv[i] is not its option, -1 when a value is bad
 *   TEST_MAIN_HOOK(argc, argv) answers whole modes of its own (a subprocess the tests spawn, a table): returns the
 *                              exit status, or -1 for "not mine"
 *   TEST_SETUP() / TEST_TEARDOWN()  run in the test's process before and after each test (TEST_TEARDOWN only when
 *                              the test returned)
 * Exit status: 0 when no test failed, 1 when one did, 2 on a usage error, 77 (ctest's SKIP_RETURN_CODE) when every
 * selected test was skipped. */
#include "test.h"

#ifndef TEST_LIST_HEADER
#error "build the runner with -DTEST_LIST_HEADER=\"the suite's list header\""
#endif
#include TEST_LIST_HEADER

#include <setjmp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#define DECLARE(name) void test_##name(void);
TEST_LIST(DECLARE)
#define ENTRY(name) {#name, test_##name},
static const test_entry tests[] = {TEST_LIST(ENTRY)};
#define N_TESTS (sizeof tests / sizeof tests[0])

#ifndef TEST_TIMEOUT_S
#define TEST_TIMEOUT_S 60
#endif
#ifndef TEST_SUITE_HELP
#define TEST_SUITE_HELP ""
#endif

int test_timeout_s = TEST_TIMEOUT_S;
static int in_process;      /* --no-fork: every test in this process, one after another */
static jmp_buf skip_return; /* where a skipped test returns to under --no-fork */

void test_skipped(void) {
  fflush(NULL);
  if (in_process) longjmp(skip_return, 1);
  _exit(TEST_SKIP_STATUS);
}

enum { PASSED, FAILED, SKIPPED };

static int run_here(const test_entry *t) {
  if (setjmp(skip_return)) return SKIPPED;
#ifdef TEST_SETUP
  TEST_SETUP();
#endif
  t->fn();
#ifdef TEST_TEARDOWN
  TEST_TEARDOWN();
#endif
  return PASSED; /* a failure has exited the process */
}

static int run_one(const test_entry *t) {
  if (in_process) return run_here(t);
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) {
    perror("fork");
    return FAILED;
  }
  if (pid == 0) {
    alarm((unsigned)test_timeout_s);
    run_here(t);
    fflush(NULL);
    _exit(0);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return PASSED;
  if (WIFEXITED(status) && WEXITSTATUS(status) == TEST_SKIP_STATUS) return SKIPPED;
  if (WIFSIGNALED(status))
    fprintf(stderr, "  killed by signal %d%s\n", WTERMSIG(status),
            WTERMSIG(status) == SIGALRM ? " (timeout: --timeout S raises it)" : "");
  return FAILED;
}

static void usage(const char *program) {
  printf("usage: %s [--list] [--timeout S] [--no-fork] [OPTION...] [TEST...]\n"
         "Runs the tests named (default: all, in list order), each in its own process with a timeout of %d s.\n"
         "  --list       the tests' names, one a line\n"
         "  --timeout S  seconds each test may take (0: no limit)\n"
         "  --no-fork    every test in this process, one after another (for a debugger or a tool that does not\n"
         "               follow children); the first failure ends the run\n"
         "%s"
         "Exit status: 0 none failed, 1 one failed, 2 usage error, %d every selected test skipped.\n",
         program, TEST_TIMEOUT_S, TEST_SUITE_HELP, TEST_SKIP_STATUS);
}

int main(int argc, char **argv) {
#ifdef TEST_MAIN_HOOK
  int hook_rc = TEST_MAIN_HOOK(argc, argv);
  if (hook_rc >= 0) return hook_rc;
#endif
  unsigned char selected[N_TESTS];
  int any_named = 0;
  memset(selected, 0, sizeof selected);
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(argv[0]);
      return 0;
    }
    if (!strcmp(a, "--list")) {
      for (size_t k = 0; k < N_TESTS; k++) puts(tests[k].name);
      return 0;
    }
    if (!strcmp(a, "--no-fork")) {
      in_process = 1;
      continue;
    }
    if (!strcmp(a, "--timeout")) {
      char *end = NULL;
      long s = i + 1 < argc ? strtol(argv[i + 1], &end, 10) : -1;
      if (s < 0 || !end || *end) {
        fprintf(stderr, "%s: --timeout needs a number of seconds (0: no limit)\n", argv[0]);
        return 2;
      }
      test_timeout_s = (int)s;
      i++;
      continue;
    }
#ifdef TEST_OPTION
    int took = TEST_OPTION(argc, argv, i);
    if (took < 0) return 2;
    if (took > 0) {
      i += took - 1;
      continue;
    }
#endif
    if (a[0] == '-') {
      fprintf(stderr, "%s: unknown option %s (see --help)\n", argv[0], a);
      return 2;
    }
    size_t k = 0;
    while (k < N_TESTS && strcmp(a, tests[k].name)) k++;
    if (k == N_TESTS) {
      fprintf(stderr, "%s: no test named %s (see --list)\n", argv[0], a);
      return 2;
    }
    selected[k] = 1;
    any_named = 1;
  }
  int counts[3] = {0, 0, 0};
  static const char *const verdicts[3] = {"ok  ", "FAIL", "skip"};
  for (size_t k = 0; k < N_TESTS; k++) {
    if (any_named && !selected[k]) continue;
    int verdict = run_one(&tests[k]);
    printf("%s %s\n", verdicts[verdict], tests[k].name);
    fflush(stdout);
    counts[verdict]++;
  }
  printf("%d passed, %d failed, %d skipped\n", counts[PASSED], counts[FAILED], counts[SKIPPED]);
  if (counts[FAILED]) return 1;
  return counts[SKIPPED] && !counts[PASSED] ? TEST_SKIP_STATUS : 0;
}
