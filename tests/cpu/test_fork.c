/* test_fork.c — ferry across fork(), through the simulated driver: a child forked after the parent initialised
 * the driver gets FERRY_UNSUPPORTED with a sentence saying why, makes no driver call at all (the child's driver
 * table is wiped to prove it: a call through it would crash), leaves the pinned pool alone and cannot read it, and
 * never hangs on a lock another parent thread held at the fork — the transfer half's locks and the operator
 * runtime's alike; what needs no driver still works there. A child forked after NVRTC was loaded refuses to
 * compile. A child forked before initialisation is free to use ferry. */
#include "test_ops.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <unistd.h>

enum { N = 24 };
static unsigned char src[N][4096];
static int64_t shapes[N];

/* N uint8 device tensors: small ones (gathered) and two large ones (DMA). */
static void make_batch(ferry_tensor *t, int32_t device_type) {
  for (int i = 0; i < N; i++) {
    shapes[i] = i < 2 ? 4096 : 64 + 16 * i;
    for (int k = 0; k < 4096; k++) src[i][k] = (unsigned char)(i * 7 + k);
    t[i] = (ferry_tensor){src[i], {device_type, 0}, 1, {FERRY_DTYPE_UINT, 8, 1}, &shapes[i], NULL, 0};
  }
}

static ferry_transfer_options options(uint32_t flags) {
  ferry_transfer_options o;
  ferry_transfer_options_init(&o);
  o.device = 0;
  o.flags = flags;
  o.gather_max_bytes = 2048;
  return o;
}

static void expect_exact_d2h(void) {
  ferry_tensor t[N];
  make_batch(t, FERRY_DEVICE_CUDA);
  ferry_transfer_options o = options(FERRY_TRANSFER_BLOCKING);
  ferry_transfer *tr = NULL;
  ASSERT_OK(ferry_transfer_d2h(t, N, &o, &tr));
  for (int i = 0; i < N; i++)
    if (memcmp(ferry_transfer_outputs(tr)[i].data, src[i], (size_t)shapes[i]) != 0) FAIL_AT("tensor %d differs", i);
  ferry_transfer_release(tr);
}

/* Waits for `pid`; fails the test unless it exited 0 (a timeout shows as SIGALRM). */
static void expect_child_ok(pid_t pid, const char *what) {
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFSIGNALED(status))
    FAIL_AT("%s: the child was killed by signal %d%s", what, WTERMSIG(status),
            WTERMSIG(status) == SIGALRM ? " (it hung)" : "");
  if (WEXITSTATUS(status) != 0) FAIL_AT("%s: the child exited %d", what, WEXITSTATUS(status));
}

/* Every entry point that would reach the driver refuses, naming the fork and the way out. */
static void expect_refused_everywhere(void) {
  ferry_tensor t[N];
  make_batch(t, FERRY_DEVICE_CUDA);
  ferry_transfer_options o = options(FERRY_TRANSFER_BLOCKING);
  ferry_transfer *tr = NULL;
  ASSERT_STATUS(ferry_transfer_d2h(t, N, &o, &tr), FERRY_UNSUPPORTED);
  ASSERT(tr == NULL);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "child forked after the parent initialised it");
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "spawn");
  char pid[32];
  snprintf(pid, sizeof pid, "this is process %d", (int)getpid());
  ASSERT_STR_CONTAINS(ferry_last_error_message(), pid);
  make_batch(t, FERRY_DEVICE_CPU);
  ASSERT_STATUS(ferry_transfer_h2d(t, N, &o, &tr), FERRY_UNSUPPORTED);
  ASSERT_STATUS(ferry_init(), FERRY_UNSUPPORTED);
  int d;
  ASSERT_STATUS(ferry_device_resolve(0, &d), FERRY_UNSUPPORTED);
  void *s;
  ASSERT_STATUS(ferry_copy_stream(0, &s), FERRY_UNSUPPORTED);
  ASSERT_STATUS(ferry_pool_reserve(1 << 20), FERRY_UNSUPPORTED);
  ferry_device_info info;
  ASSERT_STATUS(ferry_device_info_get(0, &info), FERRY_UNSUPPORTED);
  ASSERT_EQ(ferry_device_count(), 0);
}

TEST(fork_after_init_refuses_in_the_child) {
  fake_driver_use();
  ASSERT_OK(ferry_init());
  expect_exact_d2h();
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    alarm(10);
    expect_refused_everywhere();
    /* A grandchild inherits the refusal. */
    pid_t g = fork();
    if (g == 0) {
      alarm(10);
      expect_refused_everywhere();
      _exit(0);
    }
    expect_child_ok(g, "grandchild");
    _exit(0);
  }
  expect_child_ok(pid, "child");
  /* The parent is untouched by its child's refusals. */
  expect_exact_d2h();
}

static void *volatile parents_device_memory, *volatile parents_event;

TEST(forked_child_makes_no_driver_call_and_leaves_the_pool_alone) {
  fake_driver_use();
  ASSERT_OK(ferry_init());
  ferry_tensor t[N], h[N];
  make_batch(t, FERRY_DEVICE_CUDA);
  make_batch(h, FERRY_DEVICE_CPU);
  ferry_transfer_options o = options(0);
  ferry_transfer *down = NULL, *up = NULL;
  ASSERT_OK(ferry_transfer_d2h(t, N, &o, &down)); /* in flight as far as ferry knows: never waited */
  ASSERT_OK(ferry_transfer_h2d(h, N, &o, &up));   /* holds a device slab */
  ferry_pool_stats before;
  ferry_pool_stats_get(&before);
  ASSERT(before.bytes_pinned > 0);
  int registered = fake_registered, devmem = fake_live_devmem;
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    alarm(10);
    memset(&ferry__drv, 0, sizeof ferry__drv); /* any call that reached the table would now crash */
    ASSERT_STATUS(ferry_transfer_wait(down), FERRY_UNSUPPORTED); /* its copies cannot be waited for here */
    ASSERT_STR_CONTAINS(ferry_last_error_message(), "child forked after the parent initialised it");
    /* Its completion event is the parent's: the child's release cannot destroy it (the driver call is stopped).
     * Under the simulation it is a host block, kept reachable here so a leak checker does not count it. */
    ferry_slab *slab = ferry_transfer_slab(down);
    parents_event = slab && slab->fence ? (void *)slab->fence->ev : NULL;
    ferry_transfer_release(down);
    /* The H2D slab is the parent's device memory: the child drops its record of it without freeing it. (Under
     * the simulation that memory is a host block, kept reachable here so a leak checker does not count it.) */
    parents_device_memory = ferry_slab_data(ferry_transfer_slab(up));
    ferry_transfer_release(up);
    ASSERT_STATUS(ferry_pool_trim(), FERRY_UNSUPPORTED);
    expect_refused_everywhere();
    ferry_pool_stats after;
    ferry_pool_stats_get(&after);
    ASSERT_EQ(after.bytes_pinned, before.bytes_pinned); /* nothing unpinned or unmapped by the child */
    ASSERT_EQ(after.regions, before.regions);
    ASSERT_EQ(fake_registered, registered);
    ASSERT_EQ(fake_live_devmem, devmem); /* the parent's device memory is not the child's to free */
    _exit(0);
  }
  expect_child_ok(pid, "child");
  ASSERT_OK(ferry_transfer_wait(down));
  ferry_transfer_release(down);
  ferry_transfer_release(up);
  expect_exact_d2h();
  ferry_pool_stats s;
  ferry_pool_stats_get(&s);
  ASSERT_EQ(s.bytes_in_use, 0);
  ASSERT_EQ(fake_live_devmem, 0);
}

/* A parent thread keeps the pool and the event list busy (their locks are taken thousands of times a second)
 * while the main thread forks; each child must get through the calls that take those locks. Without the atfork
 * handlers a child that inherits a held lock waits forever (checked: with the handlers emptied, this test hangs).
 * Leak checkers cannot judge these children: what the busy thread held is unreachable there, as that thread
 * does not exist in them, so tests/ci_sanitizers.sh leaves this test out of its valgrind run. */
static atomic_int stop;
static void *busy(void *arg) {
  (void)arg;
  ferry_tensor t[N];
  make_batch(t, FERRY_DEVICE_CUDA);
  ferry_transfer_options o = options(0);
  while (!atomic_load(&stop)) {
    ferry_transfer *tr = NULL;
    if (ferry_transfer_d2h(t, N, &o, &tr) != FERRY_OK) abort();
    ferry_pool_stats s;
    ferry_pool_stats_get(&s);
    ferry_transfer_release(tr);
  }
  return NULL;
}

TEST(fork_while_another_thread_uses_the_pool_never_hangs) {
  fake_driver_use();
  ASSERT_OK(ferry_init());
  expect_exact_d2h();
  pthread_t tid;
  ASSERT_EQ(pthread_create(&tid, NULL, busy, NULL), 0);
  for (int k = 0; k < 200; k++) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
      alarm(5);
      ferry_pool_stats s;
      ferry_pool_stats_get(&s);   /* the pool's lock */
      ferry__events_trim();       /* the event list's lock */
      expect_refused_everywhere();
      _exit(0);
    }
    expect_child_ok(pid, "child forked beside a busy thread");
  }
  atomic_store(&stop, 1);
  pthread_join(tid, NULL);
  expect_exact_d2h();
}

TEST(fork_before_init_leaves_the_child_free) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    alarm(10);
    fake_driver_use();
    ASSERT_OK(ferry_init());
    expect_exact_d2h();
    _exit(0);
  }
  expect_child_ok(pid, "child forked before ferry_init");
  fake_driver_use();
  ASSERT_OK(ferry_init());
  expect_exact_d2h();
}

/* The permissions ("rw-p", "---p") and kernel flags ("rd wr mr mw me dc ...") of the mapping that holds `addr`,
 * from /proc/self/smaps; empty strings when no mapping does. */
static void mapping_of(const void *addr, char perms[5], char flags[200]) {
  perms[0] = flags[0] = '\0';
  FILE *f = fopen("/proc/self/smaps", "r");
  ASSERT(f != NULL);
  char line[512], p[5];
  unsigned long lo, hi;
  int inside = 0;
  while (fgets(line, sizeof line, f)) {
    if (sscanf(line, "%lx-%lx %4s", &lo, &hi, p) == 3 && strchr(line, '-') < strchr(line, ' ')) {
      inside = (uintptr_t)addr >= lo && (uintptr_t)addr < hi;
      if (inside) memcpy(perms, p, 5);
    } else if (inside && !strncmp(line, "VmFlags:", 8)) {
      snprintf(flags, 200, "%.190s", line + 8);
    }
  }
  fclose(f);
}

/* The pool's pages are not inherited (MADV_DONTFORK), so a fork copies none of them: in the child, an output that
 * viewed a slab lies in a reserved mapping without access (reading it faults), never in free address space where
 * the child could map something else that the old output would then show. */
TEST(forked_child_cannot_read_the_pinned_pool) {
  fake_driver_use();
  ASSERT_OK(ferry_init());
  ferry_tensor t[N];
  make_batch(t, FERRY_DEVICE_CUDA);
  ferry_transfer_options o = options(FERRY_TRANSFER_BLOCKING);
  ferry_transfer *tr = NULL;
  ASSERT_OK(ferry_transfer_d2h(t, N, &o, &tr));
  const unsigned char *out = ferry_transfer_outputs(tr)[2].data;
  char perms[5], flags[200];
  mapping_of(out, perms, flags);
  ASSERT(!strncmp(perms, "rw", 2));
  ASSERT_STR_CONTAINS(flags, " dc"); /* VM_DONTCOPY: MADV_DONTFORK */
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    alarm(10);
    mapping_of(out, perms, flags);
    if (strcmp(perms, "---p") != 0) FAIL_AT("the child maps the pool's pages as \"%s\", expected \"---p\"", perms);
    _exit(0);
  }
  expect_child_ok(pid, "child looking at an inherited output");
  ASSERT_EQ(out[0], src[2][0]); /* the parent's pages are untouched */
  ferry_transfer_release(tr);
}

/* ---- the operator runtime beside a fork ------------------------------------------------------------------- */

/* Three parent threads keep every lock of the operator runtime busy while the main thread forks: one compiles
 * (NVRTC for each new kind and target, then the disk cache and the memo, clearing the memo each round), one runs
 * through the simulated driver (explicit and loaded artifacts, and transfers for the pool, events, device memory
 * and contexts), one reads (the registry, discovery, imports, the caches' and the pool's counters). Every child must end within its alarm with every check passed: what needs no driver works, what
 * needs the driver or the compiler is refused with the fork sentence. */
enum { OPS_FORKS = 48 };
static atomic_int ops_stop;
static const ferry_op *stress_op;
static ferry_artifact *stress_held; /* loaded, held by the parent for the children to try */
static char stress_export[600];

static void stress_args(ferry_gemm_args *args, int round) {
  static const int types[3] = {FERRY_SCALAR_F16, FERRY_SCALAR_BF16, FERRY_SCALAR_F32};
  test_args(args, types[round % 3], types[(round / 3) % 3], 8, 8, 8);
}

static void *compiler_thread(void *arg) {
  (void)arg;
  static const int targets[4] = {75, 80, 86, 89};
  for (int round = 0; !atomic_load(&ops_stop); round++) {
    ferry_gemm_args args;
    stress_args(&args, round);
    ferry_artifact *art = NULL;
    if (ferry_op_compile_for(stress_op, &args, targets[(round / 9) % 4], &art) != FERRY_OK) abort();
    ferry_artifact_release(art);
    if (round % 5 == 4) ferry_ops_clear_memo();
  }
  return NULL;
}

static void *launcher_thread(void *arg) {
  (void)arg;
  ferry_tensor t[N];
  make_batch(t, FERRY_DEVICE_CUDA);
  ferry_tensor h[N];
  make_batch(h, FERRY_DEVICE_CPU);
  ferry_transfer_options o = options(FERRY_TRANSFER_BLOCKING);
  while (!atomic_load(&ops_stop)) {
    ferry_gemm_args args;
    test_args(&args, FERRY_SCALAR_F32, FERRY_SCALAR_F32, 8, 8, 8);
    ferry_artifact *art = NULL;
    /* A fresh artifact is loaded under its own lock at its first run. */
    if (ferry_op_compile_for(stress_op, &args, 90, &art) != FERRY_OK) abort();
    if (ferry_op_run(stress_op, &args, NULL, art, 0) != FERRY_OK) abort();
    ferry_artifact_release(art);
    if (ferry_op_run(stress_op, &args, NULL, stress_held, 0) != FERRY_OK) abort();
    ferry_transfer *tr = NULL;
    if (ferry_transfer_d2h(t, N, &o, &tr) != FERRY_OK) abort();
    ferry_transfer_release(tr);
    if (ferry_transfer_h2d(h, N, &o, &tr) != FERRY_OK) abort();
    ferry_transfer_release(tr);
  }
  return NULL;
}

static void *reader_thread(void *arg) {
  (void)arg;
  while (!atomic_load(&ops_stop)) {
    ferry_gemm_args args;
    test_args(&args, FERRY_SCALAR_F16, FERRY_SCALAR_F16, 128, 128, 128);
    const ferry_op *found[4];
    size_t n = 0;
    if (ferry_ops_find(&args, 90, NULL, NULL, found, 4, &n) != FERRY_OK || n == 0) abort();
    if (ferry_op_by_name("fork_stress") != stress_op || ferry_ops_get(ferry_ops_count() - 1) == NULL) abort();
    ferry_artifact *art = NULL;
    if (ferry_artifact_import(stress_export, &art) != FERRY_OK) abort();
    ferry_artifact_release(art);
    ferry_cache_stats cs;
    ferry_cache_stats_get(&cs);
    ferry_pool_stats ps;
    ferry_pool_stats_get(&ps);
  }
  return NULL;
}

/* Passes or calls FAIL_AT (exit 1): the checks of one child of the busy parent. */
static void child_of_busy_parent(void) {
  ASSERT(!strcmp(ferry_status_name(FERRY_UNSUPPORTED), "UNSUPPORTED"));
  ferry_gemm_args args;
  test_args(&args, FERRY_SCALAR_F16, FERRY_SCALAR_F16, 128, 128, 128);
  const ferry_op *found[4];
  size_t n = 0;
  ASSERT_OK(ferry_ops_find(&args, 90, NULL, NULL, found, 4, &n));
  ASSERT(n > 0);
  ASSERT(setenv("FERRY_ARCH", "sm_90", 1) == 0); /* the target from the environment: no device asked */
  ASSERT_OK(ferry_ops_find(&args, 0, NULL, NULL, found, 4, &n));
  ASSERT(n > 0);
  ASSERT_OK(ferry_op_supports(found[0], &args, NULL, 0));
  ASSERT(ferry_op_by_name("fork_stress") == stress_op);
  ASSERT(ferry_ops_count() > 0);
  ferry_cache_stats cs;
  ferry_cache_stats_get(&cs);
  ferry_pool_stats ps;
  ferry_pool_stats_get(&ps);
  ferry_artifact *art = NULL;
  ASSERT_OK(ferry_artifact_import(stress_export, &art)); /* a file and the registry: no driver */
  ferry_artifact_release(art);
  /* A compile is answered by the memo, or refused: NVRTC is not the child's to use. */
  test_args(&args, FERRY_SCALAR_F32, FERRY_SCALAR_F32, 8, 8, 8);
  art = NULL;
  ferry_status st = ferry_op_compile_for(stress_op, &args, 80, &art);
  if (st != FERRY_OK) {
    ASSERT_STATUS(st, FERRY_UNSUPPORTED);
    ASSERT_STR_CONTAINS(ferry_last_error_message(), "child forked after the parent initialised it");
  }
  ferry_artifact_release(art);
  /* Runs and transfers need the driver. */
  ASSERT_STATUS(ferry_op_run(stress_op, &args, NULL, stress_held, 0), FERRY_UNSUPPORTED);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "child forked after the parent initialised it");
  ASSERT_STATUS(ferry_op_run(stress_op, &args, NULL, NULL, 0), FERRY_UNSUPPORTED);
  ferry_tensor t[N];
  make_batch(t, FERRY_DEVICE_CUDA);
  ferry_transfer_options o = options(FERRY_TRANSFER_BLOCKING);
  ferry_transfer *tr = NULL;
  ASSERT_STATUS(ferry_transfer_d2h(t, N, &o, &tr), FERRY_UNSUPPORTED);
  ferry_ops_clear_memo();
}

TEST(fork_while_threads_use_the_operator_runtime_never_hangs) {
  /* NVRTC's allocations keep ASan's stack-depot lock busy: children hung there (in ASan, not in ferry) in about 1
   * run of 10. The plain build and the TSan run cover this test. */
  if (TEST_UNDER_ASAN) SKIP("AddressSanitizer's allocator is not fork-safe beside threads that allocate");
  if (!test_have_nvrtc()) return;
  char home[300];
  test_cache_home(home, sizeof home, "fork_ops");
  unsetenv("FERRY_ARCH");
  fake_driver_use();
  ASSERT_OK(ferry_init());
  stress_op = tiny_op("fork_stress");
  ferry_gemm_args args;
  test_args(&args, FERRY_SCALAR_F32, FERRY_SCALAR_F32, 8, 8, 8);
  ASSERT_OK(ferry_op_compile_for(stress_op, &args, 90, &stress_held));
  ASSERT_OK(ferry_op_run(stress_op, &args, NULL, stress_held, 0));
  snprintf(stress_export, sizeof stress_export, "%s/held.ferry", home);
  ASSERT_OK(ferry_artifact_export(stress_held, stress_export));
  pthread_t tid[3];
  ASSERT_EQ(pthread_create(&tid[0], NULL, compiler_thread, NULL), 0);
  ASSERT_EQ(pthread_create(&tid[1], NULL, launcher_thread, NULL), 0);
  ASSERT_EQ(pthread_create(&tid[2], NULL, reader_thread, NULL), 0);
  for (int k = 0; k < OPS_FORKS; k++) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
      alarm(5);
      child_of_busy_parent();
      _exit(0);
    }
    expect_child_ok(pid, "child forked beside the operator runtime's threads");
    usleep(20000); /* spread the forks over the compiles */
  }
  atomic_store(&ops_stop, 1);
  for (int i = 0; i < 3; i++) pthread_join(tid[i], NULL);
  ferry_artifact_release(stress_held);
  test_rm_rf(home);
}

/* No driver in the parent, only NVRTC: the child refuses to compile (with the fork sentence naming NVRTC), while
 * the memo, discovery and the counters still answer. */
TEST(fork_after_nvrtc_refuses_compiles_in_the_child) {
  if (!test_have_nvrtc()) return;
  char home[300];
  test_cache_home(home, sizeof home, "fork_rtc");
  const ferry_op *op = tiny_op("fork_rtc");
  ferry_gemm_args args;
  test_args(&args, FERRY_SCALAR_F32, FERRY_SCALAR_F32, 8, 8, 8);
  ferry_artifact *art = NULL;
  ASSERT_OK(ferry_op_compile_for(op, &args, 80, &art));
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    alarm(10);
    ferry_artifact *again = NULL;
    ASSERT_OK(ferry_op_compile_for(op, &args, 80, &again)); /* the memo's */
    ASSERT(again == art);
    ferry_artifact_release(again);
    again = NULL;
    ASSERT_STATUS(ferry_op_compile_for(op, &args, 86, &again), FERRY_UNSUPPORTED); /* would need NVRTC */
    ASSERT_STR_CONTAINS(ferry_last_error_message(), "child forked after the parent initialised it");
    ASSERT_STR_CONTAINS(ferry_last_error_message(), "spawn");
    ASSERT(again == NULL);
    const ferry_op *found[4];
    size_t n = 0;
    ASSERT_OK(ferry_ops_find(&args, 80, NULL, NULL, found, 4, &n));
    ASSERT(n > 0);
    _exit(0);
  }
  expect_child_ok(pid, "child forked after a compile");
  ferry_artifact *fresh = NULL;
  ASSERT_OK(ferry_op_compile_for(op, &args, 86, &fresh)); /* the parent still compiles */
  ferry_artifact_release(fresh);
  ferry_artifact_release(art);
  test_rm_rf(home);
}
