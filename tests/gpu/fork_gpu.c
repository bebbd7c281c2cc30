/* fork_gpu.c — ferry_stress fork_after_init_is_a_clear_error: fork after CUDA initialisation on the real driver
 * gives a clear error in the child, never a hang or a crash, and leaves the parent working.
 *
 * Case 1, ferry initialised the driver: the parent transfers (keeping a D2H and an H2D ticket), compiles and runs a
 * GEMM operator, reserves 1 GiB of pinned pool, forks (the fork's time is printed: the pool is not copied into the
 * child), and the child must get FERRY_UNSUPPORTED with the fork sentence from a transfer, a reserve, a trim and an
 * operator run, must find the inherited D2H output inaccessible (not a copy of the pool), must get through releasing
 * the inherited tickets, discovery, a memo hit and reading the pool's counters, all within 30 s; then the parent's
 * next transfer must be exact. Case 2, CUDA initialised by someone else (a framework) before ferry was ever called:
 * the child's first ferry call loads the driver itself; what the driver answers there is reported, and the check is
 * only that the child ends (no hang, no crash) and that nothing is presented as copied. Case 2 runs in a spawned
 * process of its own (ferry_stress --fork-foreign), where ferry has not loaded the driver yet.
 */
#include "stress.h"

#include <ferry/ops.h>

#include <dlfcn.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

enum { BYTES = 8 << 20, TIMEOUT_S = 30 };

/* Waits up to TIMEOUT_S for `pid`; kills it after that. Returns its exit code, 128+signal, or -1 on a hang. */
static int wait_bounded(pid_t pid) {
  int status = 0;
  for (int k = 0; k < TIMEOUT_S * 100; k++) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    usleep(10000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return -1;
}

static int check_row(const char *what, int ok, const char *detail) {
  printf("  %-58s %-4s %s\n", what, ok ? "ok" : "FAIL", detail);
  return !ok;
}

/* The permissions ("rw-p", "---p") of the mapping holding `addr` in /proc/self/maps; "" when none does. */
static void mapping_of(const void *addr, char perms[5]) {
  perms[0] = '\0';
  FILE *f = fopen("/proc/self/maps", "r");
  if (!f) return;
  unsigned long lo, hi;
  char p[5];
  while (fscanf(f, "%lx-%lx %4s%*[^\n]", &lo, &hi, p) == 3)
    if ((uintptr_t)addr >= lo && (uintptr_t)addr < hi) memcpy(perms, p, 5);
  fclose(f);
}

/* A GEMM compiled and run once by the parent, for the child to try. */
typedef struct fork_gemm {
  const ferry_op *op;
  ferry_artifact *art;
  ferry_gemm_args args;
  int sm;
} fork_gemm;

/* 64×64 fp32 operands in 48 KiB of their own (not the transfers' source, which the GEMM would overwrite). Returns
 * 0 when no operator could be compiled here (said why). */
static int gemm_setup(int dev, fork_gemm *g) {
  static int64_t shape[2] = {64, 64};
  CUdeviceptr d = 0;
  if (ferry__devmem_alloc(dev, 48 << 10, NULL, &d) != FERRY_OK) {
    check_row("parent: memory for a GEMM to try in the child", 0, ferry_last_error_message());
    return 0;
  }
  ferry_tensor a = {(void *)(uintptr_t)d, {FERRY_DEVICE_CUDA, dev}, 2, {FERRY_DTYPE_FLOAT, 32, 1}, shape, NULL, 0};
  ferry_tensor b = a, out = a;
  b.data = (void *)(uintptr_t)(d + (16 << 10));
  out.data = (void *)(uintptr_t)(d + (32 << 10));
  size_t n = 0;
  memset(g, 0, sizeof *g);
  if (ferry_gemm_args_init(&g->args, &a, &b, &out, FERRY_SCALAR_F32) != FERRY_OK || ferry_target_sm(dev, &g->sm) != FERRY_OK ||
      ferry_ops_find(&g->args, g->sm, NULL, NULL, &g->op, 1, &n) != FERRY_OK || n == 0 ||
      ferry_op_compile_for(g->op, &g->args, g->sm, &g->art) != FERRY_OK ||
      ferry_op_run(g->op, &g->args, NULL, g->art, 0) != FERRY_OK) {
    check_row("parent: a GEMM to try in the child (needs NVRTC)", 0, ferry_last_error_message());
    return 0;
  }
  return 1;
}

/* The child's checks of the operator runtime: discovery and the memo answer, a run is refused. */
static int child_ops(const fork_gemm *g) {
  int bad = 0;
  const ferry_op *found = NULL;
  size_t n = 0;
  ferry_status st = ferry_ops_find(&g->args, g->sm, NULL, NULL, &found, 1, &n);
  bad += check_row("child: ferry_ops_find on the target -> OK", st == FERRY_OK && found == g->op,
                   ferry_status_name(st));
  ferry_artifact *again = NULL;
  st = ferry_op_compile_for(g->op, &g->args, g->sm, &again);
  bad += check_row("child: a compile the memo answers -> the same artifact", st == FERRY_OK && again == g->art,
                   ferry_status_name(st));
  ferry_artifact_release(again);
  st = ferry_op_run(g->op, &g->args, NULL, g->art, 0);
  const char *msg = ferry_last_error_message();
  bad += check_row("child: ferry_op_run -> UNSUPPORTED, names the fork", st == FERRY_UNSUPPORTED &&
                   strstr(msg, "child forked after the parent initialised it") != NULL, msg);
  return bad;
}

/* The child of case 1: everything must be refused or harmless. Exit 0 when so, 1 with a line per failure. */
static int child_case1(int dev, ferry_transfer *down, ferry_transfer *up, const ferry_tensor *dt,
                       const ferry_pool_stats *parent_stats, const fork_gemm *g) {
  int bad = 0;
  char perms[5];
  mapping_of(ferry_transfer_outputs(down)[0].data, perms);
  bad += check_row("child: the inherited D2H output is not mapped readable", strcmp(perms, "---p") == 0, perms);
  if (g) bad += child_ops(g);
  ferry_transfer_options o;
  ferry_transfer_options_init(&o);
  o.device = dev;
  o.flags = FERRY_TRANSFER_BLOCKING;
  ferry_transfer *t = NULL;
  ferry_status st = ferry_transfer_d2h(dt, 1, &o, &t);
  const char *msg = ferry_last_error_message();
  bad += check_row("child: ferry_transfer_d2h -> UNSUPPORTED, names the fork", st == FERRY_UNSUPPORTED &&
                   strstr(msg, "child forked after the parent initialised it") != NULL && !t, msg);
  st = ferry_pool_reserve(1 << 20);
  bad += check_row("child: ferry_pool_reserve -> UNSUPPORTED", st == FERRY_UNSUPPORTED, ferry_status_name(st));
  st = ferry_transfer_wait(down);
  bad += check_row("child: waiting on an inherited ticket -> UNSUPPORTED", st == FERRY_UNSUPPORTED,
                   ferry_status_name(st));
  ferry_transfer_release(down);
  ferry_transfer_release(up);
  bad += check_row("child: releasing the inherited tickets returns", 1, "");
  st = ferry_pool_trim();
  bad += check_row("child: ferry_pool_trim -> UNSUPPORTED (nothing unpinned)", st == FERRY_UNSUPPORTED,
                   ferry_status_name(st));
  ferry_pool_stats s;
  ferry_pool_stats_get(&s);
  bad += check_row("child: the pool's pinned bytes are the parent's, untouched", s.bytes_pinned ==
                   parent_stats->bytes_pinned, "");
  fflush(stdout);
  return bad ? 1 : 0;
}

static int case1(void) {
  int failures = 0;
  if (ferry_init() != FERRY_OK) {
    printf("  no GPU: %s\n", ferry_last_error_message());
    return -1;
  }
  int dev;
  REQUIRE_OK(ferry_device_resolve(-1, &dev));
  REQUIRE_OK(ferry__ctx_enter(dev));
  unsigned char *host = malloc(BYTES);
  for (size_t i = 0; i < BYTES; i++) host[i] = (unsigned char)(i * 37 + 11);
  CUdeviceptr d;
  REQUIRE_OK(ferry__devmem_alloc(dev, BYTES, NULL, &d));
  REQUIRE_CU(ferry__drv.cuMemcpyHtoDAsync(d, host, BYTES, NULL));
  REQUIRE_CU(ferry__drv.cuStreamSynchronize(NULL));
  int64_t shape[1] = {BYTES};
  ferry_tensor dt = {(void *)(uintptr_t)d, {FERRY_DEVICE_CUDA, dev}, 1, {FERRY_DTYPE_UINT, 8, 1}, shape, NULL, 0};
  ferry_tensor ht = dt;
  ht.data = host, ht.device = (ferry_device){FERRY_DEVICE_CPU, 0};
  ferry_transfer_options o;
  ferry_transfer_options_init(&o);
  o.device = dev;
  ferry_transfer *down = NULL, *up = NULL;
  REQUIRE_OK(ferry_transfer_d2h(&dt, 1, &o, &down)); /* not waited: in flight as far as the child knows */
  REQUIRE_OK(ferry_transfer_h2d(&ht, 1, &o, &up));
  fork_gemm g;
  int have_gemm = gemm_setup(dev, &g);
  if (!have_gemm) failures++;
  REQUIRE_OK(ferry_pool_reserve((size_t)1 << 30)); /* a pool worth copying, were it inherited */
  ferry_pool_stats before;
  ferry_pool_stats_get(&before);
  fflush(NULL);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  pid_t pid = fork();
  if (pid == 0) {
    alarm(TIMEOUT_S);
    _exit(child_case1(dev, down, up, &dt, &before, have_gemm ? &g : NULL));
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  char took[96];
  snprintf(took, sizeof took, "%.2f ms with %llu MiB pinned", (double)(t1.tv_sec - t0.tv_sec) * 1e3 +
           (double)(t1.tv_nsec - t0.tv_nsec) / 1e6, (unsigned long long)(before.bytes_pinned >> 20));
  printf("  %-58s %-4s %s\n", "parent: fork() returned", "info", took);
  int rc = wait_bounded(pid);
  char detail[64];
  snprintf(detail, sizeof detail, rc == -1 ? "hung: killed after %d s" : "exit %d", rc == -1 ? TIMEOUT_S : rc);
  failures += check_row("child ended on its own, every check passed", rc == 0, detail);
  /* The parent carries on: its tickets complete and its next transfers are exact. */
  ferry_status st = ferry_transfer_wait(down);
  int exact = st == FERRY_OK && memcmp(ferry_transfer_outputs(down)[0].data, host, BYTES) == 0;
  ferry_transfer_release(down);
  ferry_transfer_release(up);
  o.flags = FERRY_TRANSFER_BLOCKING;
  st = ferry_transfer_d2h(&dt, 1, &o, &down);
  exact = exact && st == FERRY_OK && memcmp(ferry_transfer_outputs(down)[0].data, host, BYTES) == 0;
  ferry_transfer_release(down);
  failures += check_row("parent: its transfers after the fork are exact", exact, ferry_status_name(st));
  if (have_gemm) {
    st = ferry_op_run(g.op, &g.args, NULL, g.art, 0);
    failures += check_row("parent: its operator still runs after the fork", st == FERRY_OK, ferry_status_name(st));
    ferry_artifact_release(g.art);
  }
  (void)ferry__drv.cuMemFreeAsync(d, NULL);
  (void)ferry__drv.cuStreamSynchronize(NULL);
  ferry__ctx_leave();
  free(host);
  return failures;
}

/* Case 2, in its own process: CUDA initialised without ferry, then a fork, then ferry's first call in the
 * child. Prints what the child got; exit 0 when the child ended by itself and presented nothing as copied. */
int stress_fork_foreign(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    printf("  %-58s %-4s %s\n", "case 2 (CUDA initialised outside ferry)", "-", "no libcuda");
    return 0;
  }
  CUresult (*init)(unsigned) = (CUresult(*)(unsigned))dlsym(lib, "cuInit");
  CUresult (*get)(CUdevice *, int) = (CUresult(*)(CUdevice *, int))dlsym(lib, "cuDeviceGet");
  CUresult (*retain)(CUcontext *, CUdevice) =
      (CUresult(*)(CUcontext *, CUdevice))dlsym(lib, "cuDevicePrimaryCtxRetain");
  CUresult (*push)(CUcontext) = (CUresult(*)(CUcontext))dlsym(lib, "cuCtxPushCurrent_v2");
  CUresult (*alloc)(CUdeviceptr *, size_t) = (CUresult(*)(CUdeviceptr *, size_t))dlsym(lib, "cuMemAlloc_v2");
  CUdevice dev;
  CUcontext ctx;
  CUdeviceptr d = 0;
  if (!init || !get || !retain || !push || !alloc || init(0) != CUDA_SUCCESS || get(&dev, 0) != CUDA_SUCCESS ||
      retain(&ctx, dev) != CUDA_SUCCESS || push(ctx) != CUDA_SUCCESS || alloc(&d, 1 << 20) != CUDA_SUCCESS) {
    printf("  %-58s %-4s %s\n", "case 2: initialising CUDA without ferry", "FAIL", "");
    return 1;
  }
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    alarm(TIMEOUT_S);
    ferry_status init_st = ferry_init();
    char init_msg[600];
    snprintf(init_msg, sizeof init_msg, "%s: %s", ferry_status_name(init_st), ferry_last_error_message());
    int64_t shape[1] = {1 << 20};
    ferry_tensor t = {(void *)(uintptr_t)d, {FERRY_DEVICE_CUDA, 0}, 1, {FERRY_DTYPE_UINT, 8, 1}, shape, NULL, 0};
    ferry_transfer_options o;
    ferry_transfer_options_init(&o);
    o.device = 0;
    o.flags = FERRY_TRANSFER_BLOCKING;
    ferry_transfer *tr = NULL;
    ferry_status st = ferry_transfer_d2h(&t, 1, &o, &tr);
    int copied = st == FERRY_OK && ferry_transfer_output_copied(tr, 0);
    printf("  %-58s %-4s %s\n", "case 2 child: ferry_init", "info", init_msg);
    printf("  %-58s %-4s %s%s%s\n", "case 2 child: ferry_transfer_d2h", "info", ferry_status_name(st),
           st == FERRY_OK ? (copied ? " (claims a copy!)" : " (passed through: the output is the device tensor)")
                          : ": ",
           st == FERRY_OK ? "" : ferry_last_error_message());
    fflush(stdout);
    _exit(copied ? 1 : 0);
  }
  int rc = wait_bounded(pid);
  char detail[64];
  snprintf(detail, sizeof detail, rc == -1 ? "hung: killed after %d s" : "exit %d", rc == -1 ? TIMEOUT_S : rc);
  return check_row("case 2: the child ended on its own, nothing claimed copied", rc == 0, detail);
}

int stress_fork(int unused) {
  (void)unused;
  printf("fork%s: fork after CUDA initialisation\n", stress_simulated ? " [simulated driver]" : "");
  int failures = 0;
  /* Case 2 first, in a fresh process (posix_spawn: exec, so this process's state does not matter). */
  if (!stress_simulated) {
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
      self[n] = '\0';
      char *argv[] = {self, "--fork-foreign", NULL};
      pid_t pid;
      fflush(stdout);
      if (posix_spawn(&pid, self, NULL, NULL, argv, environ) == 0) {
        int rc = wait_bounded(pid);
        if (rc != 0) failures++;
      } else {
        failures += check_row("case 2: spawning ferry_stress --fork-foreign", 0, "");
      }
    }
  } else {
    check_row("case 2 (CUDA initialised outside ferry)", 1, "not simulated");
  }
  int c1 = case1();
  if (c1 < 0) return -1;
  failures += c1;
  printf("fork: %d failure(s)\nRESULT: %s\n", failures, failures ? "FAIL" : "PASS");
  return failures;
}
