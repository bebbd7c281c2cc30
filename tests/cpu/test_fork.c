/* test_fork.c — ferry across fork(), through the simulated driver: a child forked after the parent initialised
 * the driver gets FERRY_UNSUPPORTED with a sentence saying why, makes no driver call at all (the child's driver
 * table is wiped to prove it: a call through it would crash), leaves the pinned pool alone, and never hangs on a
 * lock another parent thread held at the fork. A child forked before initialisation is free to use ferry. */
#include "fake_driver.h"
#include "test.h"

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

static void *volatile parents_device_memory;

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
  const unsigned char *slab = ferry_slab_data(ferry_transfer_slab(down));
  int registered = fake_registered, devmem = fake_live_devmem;
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    alarm(10);
    memset(&ferry__drv, 0, sizeof ferry__drv); /* any call that reached the table would now crash */
    ASSERT_STATUS(ferry_transfer_wait(down), FERRY_UNSUPPORTED); /* its copies cannot be waited for here */
    ASSERT_STR_CONTAINS(ferry_last_error_message(), "child forked after the parent initialised it");
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
    ASSERT_EQ(slab[0], src[2][0]);       /* and the pinned pages are still mapped, as the parent left them */
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
