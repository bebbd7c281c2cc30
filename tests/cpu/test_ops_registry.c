/* test_ops_registry.c — the operator registry's hazards: user code (a discovery filter, a registered operator's
 * supports callback) that calls back into the registry must not deadlock, and running out of memory is reported as
 * such and leaks nothing, in registration and at start-up (allocations failed through failing_alloc.h). */
#include "failing_alloc.h"
#include "test_ops.h"

#include <sys/wait.h>

/* ---- user code that calls back into the registry ----------------------------------------------------------- */

static int filter_that_looks_up(const ferry_op_info *info, void *user) {
  (void)user;
  return ferry_op_by_name(info->name) != NULL && ferry_ops_count() > 0;
}

TEST(find_filter_may_call_the_registry) {
  ferry_gemm_args args;
  test_args(&args, FERRY_SCALAR_F16, FERRY_SCALAR_F32, 256, 256, 256);
  const ferry_op *ops[64];
  size_t n = 0, all = 0;
  ASSERT_OK(ferry_ops_find(&args, 90, NULL, NULL, ops, 64, &all));
  ASSERT_OK(ferry_ops_find(&args, 90, filter_that_looks_up, NULL, ops, 64, &n));
  ASSERT_EQ(n, all);
}

static int supports_that_counts(const ferry_gemm_args *args, char *reason, size_t reason_size, void *user) {
  (void)args, (void)reason, (void)reason_size, (void)user;
  return ferry_ops_count() > 0 && ferry_ops_get(0) != NULL;
}

TEST(supports_callback_may_call_the_registry) {
  ferry_op_desc d;
  ferry_op_desc_init(&d);
  d.info.name = "counting_gemm";
  d.source = "extern \"C\" __global__ void counting_gemm(ferry_gemm_params p) {}";
  d.entry = "counting_gemm";
  d.supports = supports_that_counts;
  const ferry_op *op = NULL;
  ASSERT_OK(ferry_op_register(&d, &op));
  ferry_gemm_args args;
  test_args(&args, FERRY_SCALAR_F32, FERRY_SCALAR_F32, 16, 16, 16);
  const ferry_op *ops[64];
  size_t n = 0;
  ASSERT_OK(ferry_ops_find(&args, 90, NULL, NULL, ops, 64, &n));
  int listed = 0;
  for (size_t i = 0; i < n && i < 64; i++) listed |= ops[i] == op;
  ASSERT(listed);
  ASSERT_OK(ferry_op_supports(op, &args, NULL, 0));
}

/* ---- out of memory ----------------------------------------------------------------------------------------- */

TEST(register_out_of_memory_is_reported_as_such_and_leaks_nothing) {
  size_t builtins = ferry_ops_count();
  const char *options[2] = {"-DTILE=64", "-DSTEPS=2"};
  ferry_op_desc d;
  ferry_op_desc_init(&d);
  d.info.name = "oom_gemm";
  d.source = "extern \"C\" __global__ void oom_gemm(ferry_gemm_params p) {}";
  d.entry = "oom_gemm";
  d.options = options;
  d.n_options = 2;
  const ferry_op *op = NULL;
  for (long nth = 0;; nth++) { /* each allocation of the registration fails in turn, until none is left to fail */
    long before = failing_alloc_live();
    failing_alloc_fail_nth(nth);
    ferry_status st = ferry_op_register(&d, &op);
    int failed = failing_alloc_failed();
    failing_alloc_fail_nth(-1);
    if (!failed) {
      ASSERT_OK(st);
      break;
    }
    ASSERT_STATUS(st, FERRY_OUT_OF_HOST_MEMORY);
    ASSERT_STR_CONTAINS(ferry_last_error_message(), "oom_gemm");
    ASSERT_EQ(failing_alloc_live(), before);
    ASSERT_EQ(ferry_ops_count(), builtins);
    ASSERT(ferry_op_by_name("oom_gemm") == NULL);
  }
  ASSERT(op == ferry_op_by_name("oom_gemm"));
}

TEST(find_out_of_memory_is_reported_as_such) {
  ferry_gemm_args args;
  test_args(&args, FERRY_SCALAR_F16, FERRY_SCALAR_F32, 256, 256, 256);
  ferry_ops_count(); /* the built-ins first */
  const ferry_op *ops[64];
  size_t n = 0;
  failing_alloc_fail_nth(0);
  ASSERT_STATUS(ferry_ops_find(&args, 90, NULL, NULL, ops, 64, &n), FERRY_OUT_OF_HOST_MEMORY);
  failing_alloc_fail_nth(-1);
  ASSERT_OK(ferry_ops_find(&args, 90, NULL, NULL, ops, 64, &n));
}

/* A built-in that cannot be registered at start-up for lack of memory is absent, and what was allocated for it is
 * freed: every block the registry still holds belongs to a registered operator (the operator, its name and its
 * macros) or is the registry's array. Each failure point runs in a process of its own (start-up happens once). */
TEST(builtins_lost_to_out_of_memory_leak_nothing) {
  long all = -1;
  for (long nth = 0;; nth++) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
      long before = failing_alloc_live();
      failing_alloc_fail_nth(nth);
      long n = (long)ferry_ops_count();
      int failed = failing_alloc_failed();
      failing_alloc_fail_nth(-1);
      long held = failing_alloc_live() - before;
      if (!failed) _exit(100); /* past the last allocation of start-up */
      if (held != 3 * n + 1) {
        printf("  failing allocation %ld of start-up: %ld operators registered, %ld blocks held (expected %ld)\n",
               nth, n, held, 3 * n + 1);
        _exit(1);
      }
      _exit(0);
    }
    int status = 0;
    ASSERT(waitpid(pid, &status, 0) == pid);
    ASSERT(WIFEXITED(status));
    if (WEXITSTATUS(status) == 100) {
      all = nth;
      break;
    }
    ASSERT_EQ(WEXITSTATUS(status), 0);
  }
  ASSERT(all >= 3 * 19); /* every built-in's allocations were failed in turn */
}
