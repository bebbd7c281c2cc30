/* fault_ops_gpu.c — `ferry_test_ops_gpu every_failing_runtime_call_is_clean`: the operator runtime's fault injection
 * (tests/cpu/test_ops_faults.c) against the real driver, as ferry_stress's every_failing_driver_call_is_clean
 * (fault_gpu.c) does for transfers.
 *
 * Each path is one operation of the runtime: a compile through NVRTC, a compile from the disk cache, a run that
 * compiles through the memo, an imported artifact's first run (which loads it), a plain run, and a graph (two runs
 * captured, instantiated, replayed, one run updated, replayed again). For every driver and NVRTC call the path makes
 * and for each of its uses in it (1st, 2nd, ... until the operation makes no more, at most MAX_USES), the call is
 * made to fail through the fault seam (ferry__fault_arm) and the operation is done on the GPU with real operands,
 * fp32 and fp16 (fault_ops_rig.c: 64×48×40, exact results). Each case checks:
 *   - the failure is reported: the status is an error, ferry_last_error()->call and the message name the call, and
 *     the status and raw result are the injected ones (FERRY_DRIVER_ERROR with CUDA_ERROR_LAUNCH_FAILED; NVRTC
 *     calls: FERRY_COMPILE_FAILED);
 *   - no output is presented as complete: every output starts as a sentinel; one that no successful step wrote must
 *     still hold it entirely, one that a successful step wrote must equal the reference bit for bit; a step that
 *     failed hands out no artifact or graph;
 *   - nothing leaks: the libraries, graphs, graph instances, streams, events, pinned ranges and device allocations
 *     alive (the census, fault_ops_rig.c) are what they were, once the operation's objects are released and the memo
 *     cleared; no context is left current (operations run with none current, so ferry makes its own current every
 *     time); the stream is not left capturing;
 *   - the next operation on the same thread and stream — the same one, unfaulted, disk cache on — succeeds and is
 *     exact, with nothing leaked.
 * The list of calls of each path is read from src/ops/ and src/rtc.c; a call listed but not made fails its first
 * case ("never called"), so a list gone stale is noticed (a call added to a path is not: keep the lists in step).
 *
 * What is promised when a failure comes after work was queued: an output counts as complete only once the step that
 * writes it returned OK (a run, or a replay), and the harness waits for the stream before looking. An injected
 * failure stops the call before the driver sees it, so a failed launch or replay never ran here and its outputs
 * must be untouched; a real cuLaunchKernel or cuGraphLaunch failure can be reported after part of the work ran, and
 * then ferry promises only the report, not what the output holds. When the second replay of the graph fails, the
 * outputs the first replay wrote stay complete (the second would have written the same values into output 0).
 *
 * Failures ferry ignores by design must instead leave the operation successful and exact: a context pop at the end
 * of a call (its work is done or queued, there is nothing to undo; the seam never called the driver, so ferry's
 * context stays current and the harness pops it), and nvrtcDestroyProgram after the cubin was copied out (NVRTC
 * keeps the program's host memory).
 *
 * Calls made once per process — ferry's first read of the device's capability (cuDeviceGet, cuDeviceGetAttribute)
 * and its primary-context retain (cuDeviceGet, cuDevicePrimaryCtxRetain) — run in a fresh process each: this program
 * with --fault-case, spawned with posix_spawn (fork+exec, safe after CUDA initialisation), whose harness keeps its
 * own device work off ferry's path. That costs a process start per case, so the path runs for fp32 only.
 *
 * Not faulted: cuLibraryUnload, cuGraphDestroy, cuGraphExecDestroy and ferry_graph_destroy's cuStreamEndCapture
 * are teardown in functions that return nothing; ferry ignores their failures, and a fault there would only make the
 * seam keep alive what ferry asked the driver to free (cuStreamEndCapture is faulted where ferry_graph_end calls
 * it). nvrtcGetProgramLogSize and nvrtcGetProgramLog follow only NVRTC_ERROR_COMPILATION, which the seam cannot
 * produce. cuInit, cuDeviceGetCount at load, nvrtcVersion and the NVRTC architecture queries are called once, at
 * load, through the tables directly rather than through the seam.
 */
#include "fault_ops.h"

#include <dirent.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define INJECTED CUDA_ERROR_LAUNCH_FAILED
enum { MAX_USES = 16, ELEMENTS = PROBLEM_M * PROBLEM_N };
enum { CASE_PASS = 0, CASE_FAIL = 1, CASE_HARNESS = 2, CASE_NOT_REACHED = 3 };

/* ---- the operations ---------------------------------------------------------------------------------------------- */

/* One operand type's state: three problems (outputs 0 and 1 for runs, 2 for the graph's update), the operator, and
 * a warm artifact (compiled, loaded, run once; exported to artifact_path for the import path). */
typedef struct kind_state {
  const char *name;
  int in_type;
  problem p[3];
  const ferry_op *op;
  ferry_artifact *warm;
  char artifact_path[600];
} kind_state;

static kind_state kinds[2] = {{.name = "f32", .in_type = FERRY_SCALAR_F32},
                              {.name = "f16", .in_type = FERRY_SCALAR_F16}};

/* What an operation did: its status, how many of its steps succeeded (in order, up to the first failure), and the
 * objects it made, which the case releases after looking at them. */
typedef struct outcome {
  ferry_status st;
  int steps;
  ferry_artifact *art;
  ferry_graph *graph;
} outcome;

#define STEP(o, call)                                                                                            \
  do {                                                                                                           \
    if ((o)->st == FERRY_OK && ((o)->st = (call)) == FERRY_OK) (o)->steps++;                                      \
  } while (0)

/* The memo is empty: a compile (from the disk cache, or NVRTC when the path turns the cache off), then a run. */
static void compile_then_run(kind_state *k, outcome *o) {
  STEP(o, ferry_op_compile(k->op, &k->p[0].args, &o->art));
  STEP(o, ferry_op_run(k->op, &k->p[0].args, the_rig.stream, o->art, FERRY_RUN_ASSUME_SUPPORTED));
}

/* A run without an artifact: the memo is empty, so the run compiles and loads through it. */
static void run_through_memo(kind_state *k, outcome *o) {
  STEP(o, ferry_op_run(k->op, &k->p[0].args, the_rig.stream, NULL, 0));
}

/* An imported artifact is loaded at its first run (ferry__artifact_function, under the artifact's lock), not by
 * the import. */
static void import_then_run(kind_state *k, outcome *o) {
  STEP(o, ferry_artifact_import(k->artifact_path, &o->art));
  STEP(o, ferry_op_run(k->op, &k->p[0].args, the_rig.stream, o->art, 0));
}

/* The launch path alone: the artifact is loaded and its function made. */
static void run_warm(kind_state *k, outcome *o) {
  STEP(o, ferry_op_run(k->op, &k->p[0].args, the_rig.stream, k->warm, FERRY_RUN_ASSUME_SUPPORTED));
}

/* Runs 0 and 1 write outputs 0 and 1 at the first replay (step 5); run 1 then gets problem 2's operands, and the
 * second replay (step 7) writes output 2. */
static void graph_sequence(kind_state *k, outcome *o) {
  STEP(o, ferry_graph_begin(the_rig.stream, &o->graph));
  STEP(o, ferry_graph_run(o->graph, k->op, &k->p[0].args, k->warm, FERRY_RUN_ASSUME_SUPPORTED, NULL));
  STEP(o, ferry_graph_run(o->graph, k->op, &k->p[1].args, k->warm, FERRY_RUN_ASSUME_SUPPORTED, NULL));
  STEP(o, ferry_graph_end(o->graph));
  STEP(o, ferry_graph_replay(o->graph, NULL));
  STEP(o, ferry_graph_update(o->graph, 1, &k->p[2].args));
  STEP(o, ferry_graph_replay(o->graph, NULL));
}

/* ---- the paths --------------------------------------------------------------------------------------------------- */

typedef struct path {
  const char *name;
  int fp16_too;          /* for fp16 operands as well as fp32 */
  int fresh;             /* each case in a process of its own */
  int disk_cache_off;    /* the faulted operation compiles through NVRTC */
  void (*operation)(kind_state *, outcome *);
  int steps;             /* of the operation, unfaulted */
  int complete_after[3]; /* output i is complete once this many steps succeeded; 0: the path never writes it */
  const char *calls[16]; /* in the order the operation first makes them */
} path;

/* The NVRTC calls do not depend on the operand types, and the fp32 (SIMT) design compiles fastest: three of the
 * path's cases compile in full, so it runs for fp32 only. The driver calls after NVRTC are those of "compile". */
static const path paths[] = {
    {.name = "nvrtc", .disk_cache_off = 1, .operation = compile_then_run, .steps = 2, .complete_after = {2},
     .calls = {"nvrtcCreateProgram", "nvrtcCompileProgram", "nvrtcGetCUBINSize", "nvrtcGetCUBIN",
               "nvrtcDestroyProgram"}},
    {.name = "compile", .fp16_too = 1, .operation = compile_then_run, .steps = 2, .complete_after = {2},
     .calls = {"cuDeviceGetCount", "cuLibraryLoadData", "cuLibraryGetKernel", "cuCtxPushCurrent",
               "cuKernelGetFunction", "cuFuncSetAttribute", "cuCtxPopCurrent", "cuCtxGetCurrent", "cuLaunchKernel"}},
    {.name = "run-memo", .fp16_too = 1, .operation = run_through_memo, .steps = 1, .complete_after = {1},
     .calls = {"cuLibraryLoadData", "cuLibraryGetKernel", "cuCtxPushCurrent", "cuKernelGetFunction",
               "cuFuncSetAttribute", "cuCtxPopCurrent", "cuCtxGetCurrent", "cuLaunchKernel"}},
    {.name = "import", .fp16_too = 1, .operation = import_then_run, .steps = 2, .complete_after = {2},
     .calls = {"cuLibraryLoadData", "cuLibraryGetKernel", "cuCtxPushCurrent", "cuKernelGetFunction",
               "cuFuncSetAttribute", "cuCtxPopCurrent", "cuCtxGetCurrent", "cuLaunchKernel"}},
    {.name = "run", .fp16_too = 1, .operation = run_warm, .steps = 1, .complete_after = {1},
     .calls = {"cuCtxGetCurrent", "cuCtxPushCurrent", "cuLaunchKernel", "cuCtxPopCurrent"}},
    {.name = "graph", .fp16_too = 1, .operation = graph_sequence, .steps = 7, .complete_after = {5, 5, 7},
     .calls = {"cuStreamGetCtx", "cuCtxPushCurrent", "cuStreamBeginCapture", "cuCtxPopCurrent", "cuCtxGetCurrent",
               "cuLaunchKernel", "cuStreamGetCaptureInfo", "cuGraphNodeGetType", "cuStreamEndCapture",
               "cuGraphInstantiateWithFlags", "cuGraphLaunch", "cuGraphExecKernelNodeSetParams"}},
    {.name = "fresh", .fresh = 1, .operation = compile_then_run, .steps = 2, .complete_after = {2},
     .calls = {"cuDeviceGet", "cuDeviceGetAttribute", "cuDevicePrimaryCtxRetain"}},
};

/* See the top of the file: failures ferry ignores by design. */
static int ignored_by_design(const char *call) {
  return !strcmp(call, "cuCtxPopCurrent") || !strcmp(call, "nvrtcDestroyProgram");
}

/* 1 when the operation must make `call` for this kind: raising the shared-memory limit happens only for a design
 * that needs more than the 48 KiB a kernel gets by default (ferry__artifact_function). */
static int on_path(const kind_state *k, const char *call) {
  if (strcmp(call, "cuFuncSetAttribute") != 0) return 1;
  return ferry__design_smem(k->op, k->p[0].args.problem.kind) > 48u * 1024u;
}

/* ---- one case ---------------------------------------------------------------------------------------------------- */

static int say(char *why, size_t size, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int say(char *why, size_t size, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, size, fmt, ap);
  va_end(ap);
  return 0;
}

static void release_outcome(outcome *o) {
  ferry_graph_destroy(o->graph);
  ferry_artifact_release(o->art);
  ferry_ops_clear_memo();
  o->graph = NULL;
  o->art = NULL;
}

/* The stream, the outputs and the census after an operation whose first `steps` steps succeeded. */
static int judge_aftermath(const path *pa, kind_state *k, int steps, const census *before, char *why, size_t size) {
  if (!rig_stream_not_capturing()) return say(why, size, "the stream was left capturing");
  rig_sync();
  for (int i = 0; i < 3; i++) {
    int sentinel = 0, exact = 0, complete = pa->complete_after[i] && steps >= pa->complete_after[i];
    problem_output(&k->p[i], &sentinel, &exact);
    if (complete && exact != ELEMENTS)
      return say(why, size, "output %d is presented as complete but %d of its %d elements differ from the reference "
                 "(%d hold the sentinel)", i, ELEMENTS - exact, ELEMENTS, sentinel);
    if (!complete && sentinel != ELEMENTS)
      return say(why, size, "output %d was written (%d of %d elements) though no step that writes it succeeded", i,
                 ELEMENTS - sentinel, ELEMENTS);
  }
  census after;
  char diff[160];
  census_now(&after);
  if (!census_same(before, &after, diff, sizeof diff)) return say(why, size, "leak: %s", diff);
  return 1;
}

/* The failure as reported, and what the failed operation handed out. */
static int judge_report(const path *pa, const char *call, const outcome *o, const ferry_error *err, int handed_out,
                        char *why, size_t size) {
  if (ignored_by_design(call)) {
    if (o->st != FERRY_OK || o->steps != pa->steps)
      return say(why, size, "a failure ferry ignores was reported: %s", err->message);
    return 1;
  }
  if (o->st == FERRY_OK) return say(why, size, "the failure was not reported");
  if (!strstr(err->call, call) || !strstr(err->message, call))
    return say(why, size, "the error does not name %s (call \"%s\", message \"%s\")", call, err->call, err->message);
  int nvrtc = !strncmp(call, "nvrtc", 5);
  if (nvrtc ? o->st != FERRY_COMPILE_FAILED : (o->st != FERRY_DRIVER_ERROR || err->cu_result != INJECTED))
    return say(why, size, "status %s with cu_result %d; expected %s", ferry_status_name(o->st), err->cu_result,
               nvrtc ? "COMPILE_FAILED" : "DRIVER_ERROR with the injected result");
  if (handed_out) return say(why, size, "the failed step still handed out its artifact or graph");
  return 1;
}

/* The same operation again, unfaulted, with the disk cache on: it must succeed, be exact and leak nothing. */
static int judge_next_operation(const path *pa, kind_state *k, const census *before, char *why, size_t size) {
  char inner[500];
  outcome o = {FERRY_OK, 0, NULL, NULL};
  for (int i = 0; i < 3; i++) problem_poison(&k->p[i]);
  ferry_clear_error();
  pa->operation(k, &o);
  const char *message = ferry_last_error_message();
  if (o.st != FERRY_OK) snprintf(inner, sizeof inner, "%s", message);
  int leftover = rig_pop_leftovers();
  release_outcome(&o);
  if (o.st != FERRY_OK)
    return say(why, size, "the next operation failed: %s: %s", ferry_status_name(o.st), inner);
  if (leftover) return say(why, size, "the next operation left %d context(s) current", leftover);
  if (!judge_aftermath(pa, k, o.steps, before, inner, sizeof inner))
    return say(why, size, "after the next operation, %s", inner);
  return 1;
}

/* One line per case; nth 0 for a call that is not on the path. */
static void print_case(const path *pa, const kind_state *k, const char *call, int nth, const char *status,
                       const char *verdict, const char *why) {
  char use[12] = "-";
  if (nth) snprintf(use, sizeof use, "%d", nth);
  printf("  %-8s %-4s %-30s %3s  %-15s %s%s%s\n", pa->name, k->name, call, use, status, verdict, *why ? ": " : "",
         why);
  fflush(stdout);
}

/* Faults `call` at its `nth` use in the path's operation and judges everything. Prints the case's line unless the
 * operation made fewer than `nth` such calls (CASE_NOT_REACHED). */
static int run_case(const path *pa, kind_state *k, const char *call, int nth) {
  char why[700] = "";
  census before;
  outcome o = {FERRY_OK, 0, NULL, NULL};
  rig_sync(); /* the previous case's work is done (a case that was not reached returns without looking) */
  for (int i = 0; i < 3; i++) problem_poison(&k->p[i]);
  ferry_ops_clear_memo();
  census_now(&before);
  if (pa->disk_cache_off) setenv("FERRY_DISK_CACHE", "0", 1);
  ferry_clear_error();
  ferry__fault_arm(call, nth, INJECTED);
  pa->operation(k, &o);
  int hits = ferry__fault_hits();
  ferry__fault_disarm();
  unsetenv("FERRY_DISK_CACHE");
  ferry_error err = *ferry_last_error();
  int leftover = rig_pop_leftovers(), handed_out = o.steps == 0 && (o.art || o.graph);
  ferry_status st = o.st;
  release_outcome(&o);
  if (hits < nth) return CASE_NOT_REACHED;
  /* A pop the seam stopped leaves ferry's context current: one context to pop. */
  int leftover_expected = !strcmp(call, "cuCtxPopCurrent");
  int ok = judge_report(pa, call, &o, &err, handed_out, why, sizeof why);
  if (ok && leftover != leftover_expected)
    ok = say(why, sizeof why, "%d context(s) left current (expected %d)", leftover, leftover_expected);
  if (ok) ok = judge_aftermath(pa, k, o.steps, &before, why, sizeof why);
  if (ok) ok = judge_next_operation(pa, k, &before, why, sizeof why);
  print_case(pa, k, call, nth, ferry_status_name(st),
             !ok ? "FAIL" : ignored_by_design(call) ? "pass (ignored by design, exact)" : "pass",
             ok ? "" : why);
  return ok ? CASE_PASS : CASE_FAIL;
}

/* ---- cases in a fresh process ------------------------------------------------------------------------------------ */

/* Runs `path:kind:call:nth` in a new process of this program, which prints its own line; returns its exit status. */
static int run_fresh(const path *pa, const kind_state *k, const char *call, int nth) {
  char spec[160], self[4096];
  snprintf(spec, sizeof spec, "%s:%s:%s:%d", pa->name, k->name, call, nth);
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return CASE_HARNESS;
  self[n] = '\0';
  char *argv[] = {self, "--fault-case", spec, the_rig.simulated ? "--simulate" : NULL, NULL};
  pid_t pid;
  int status = 0;
  fflush(stdout);
  if (posix_spawn(&pid, self, NULL, NULL, argv, environ) != 0) return CASE_HARNESS;
  if (waitpid(pid, &status, 0) != pid) return CASE_HARNESS;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* ---- setting up -------------------------------------------------------------------------------------------------- */

/* The operator for a kind: the first ferry_ops_find offers whose design needs more than 48 KiB of shared memory, so
 * that raising the limit (cuFuncSetAttribute) is on the path; else the first offered (fp32: the SIMT design). */
static const ferry_op *pick_operator(const kind_state *k) {
  const ferry_op *found[32];
  size_t n = 0;
  if (ferry_ops_find(&k->p[0].args, the_rig.sm, NULL, NULL, found, 32, &n) != FERRY_OK || n == 0) return NULL;
  if (n > 32) n = 32;
  for (size_t i = 0; i < n; i++)
    if (ferry__design_smem(found[i], k->p[0].args.problem.kind) > 48u * 1024u) return found[i];
  return found[0];
}

/* The problems and the operator; with `warm_up`, also the warm artifact (through NVRTC: the cache is empty), its
 * exported file, and one unfaulted run, which must be exact or no case can be judged. */
static int kind_open(kind_state *k, int warm_up) {
  for (int i = 0; i < 3; i++)
    problem_make(&k->p[i], k->in_type, 0x9e3779b9u * (uint32_t)(i + 1) + (uint32_t)k->in_type);
  k->op = pick_operator(k);
  if (!k->op) {
    printf("ops faults: no operator for the %s problem on sm_%d\n", k->name, the_rig.sm);
    return 0;
  }
  if (!warm_up) return 1;
  snprintf(k->artifact_path, sizeof k->artifact_path, "%s/%s.ferry", getenv("XDG_CACHE_HOME"), k->name);
  problem_poison(&k->p[0]);
  ferry_status st = ferry_op_compile(k->op, &k->p[0].args, &k->warm);
  if (st == FERRY_OK) st = ferry_op_run(k->op, &k->p[0].args, the_rig.stream, k->warm, FERRY_RUN_ASSUME_SUPPORTED);
  if (st == FERRY_OK) st = ferry_artifact_export(k->warm, k->artifact_path);
  if (st != FERRY_OK) {
    printf("ops faults: the unfaulted %s operation failed: %s: %s\n", k->name, ferry_status_name(st),
           ferry_last_error_message());
    return 0;
  }
  int sentinel = 0, exact = 0, leftover = rig_pop_leftovers();
  rig_sync();
  problem_output(&k->p[0], &sentinel, &exact);
  if (exact != ELEMENTS || leftover) {
    printf("ops faults: the unfaulted %s run is not clean (%d of %d elements exact, %d context(s) "
           "left current)\n", k->name, exact, ELEMENTS, leftover);
    return 0;
  }
  return 1;
}

static void kind_close(kind_state *k) {
  ferry_artifact_release(k->warm);
  k->warm = NULL;
  for (int i = 0; i < 3; i++) problem_free(&k->p[i]);
}

/* A private cache home, so that every compile-path case finds exactly the files the warm-up wrote (and the user's
 * cache is neither read nor written). The fresh-process cases inherit it through the environment. */
static int make_cache_home(char *dir, size_t size) {
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, size, "%s/ferry-ops-faults-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(dir)) return 0;
  setenv("XDG_CACHE_HOME", dir, 1);
  unsetenv("FERRY_DISK_CACHE");
  return 1;
}

/* Removes `dir` and what it holds (the cache home holds files and ferry's directory of files). */
static void remove_tree(const char *dir) {
  DIR *d = opendir(dir);
  struct dirent *e;
  char path[1200];
  while (d && (e = readdir(d)) != NULL) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    if (unlink(path) != 0) remove_tree(path);
  }
  if (d) closedir(d);
  rmdir(dir);
}

static const path *path_named(const char *name) {
  for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++)
    if (!strcmp(paths[i].name, name)) return &paths[i];
  return NULL;
}

/* ---- entry ------------------------------------------------------------------------------------------------------- */

/* One case, in the process the matrix spawned for it. */
static int one_fresh_case(const char *spec) {
  char path_name[16], kind_name[8], call[64];
  int nth = 0;
  const path *pa = NULL;
  kind_state *k = NULL;
  if (sscanf(spec, "%15[^:]:%7[^:]:%63[^:]:%d", path_name, kind_name, call, &nth) == 4) {
    pa = path_named(path_name);
    k = !strcmp(kind_name, "f16") ? &kinds[1] : !strcmp(kind_name, "f32") ? &kinds[0] : NULL;
  }
  if (!pa || !pa->fresh || !k || nth < 1) {
    printf("ferry_test_ops_gpu: bad --fault-case %s (fresh:KIND:CALL:NTH)\n", spec);
    return CASE_HARNESS;
  }
  if (!kind_open(k, 0)) return CASE_HARNESS;
  return run_case(pa, k, call, nth);
}

int ops_faults_main(const char *fault_case, int simulate) {
  char cache_home[600] = "";
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  /* The target is the device: FERRY_ARCH would take ferry_target_sm's device reads off the compile path. */
  unsetenv("FERRY_ARCH");
  if (!rig_open(simulate)) return CASE_HARNESS;
  if (fault_case) return one_fresh_case(fault_case);
  if (!make_cache_home(cache_home, sizeof cache_home)) {
    printf("ops faults: cannot create a cache directory under $TMPDIR or /tmp\n");
    return CASE_HARNESS;
  }
  int ready = 1;
  for (int i = 0; i < 2 && ready; i++) ready = kind_open(&kinds[i], 1);
  if (!ready) {
    remove_tree(cache_home);
    return CASE_HARNESS;
  }
  printf("ops faults on cuda:%d (%s, sm_%d)%s: each call fails at each of its uses (%s injected; "
         "NVRTC calls fail with NVRTC_ERROR_INTERNAL_ERROR)\n", the_rig.dev, the_rig.device_name, the_rig.sm,
         the_rig.simulated ? " [simulated driver]" : "", ferry__cu_name(INJECTED));
  printf("  operators: f32 %s, f16 %s; %d×%d×%d, fp32 output, compared bit for bit\n",
         ferry_op_info_get(kinds[0].op)->name, ferry_op_info_get(kinds[1].op)->name, PROBLEM_M, PROBLEM_N, PROBLEM_K);
  printf("  %-8s %-4s %-30s %3s  %-15s %s\n", "path", "kind", "call", "nth", "status", "verdict");
  int cases = 0, failures = 0;
  for (size_t p = 0; p < sizeof paths / sizeof paths[0]; p++)
    for (int ki = 0; ki < (paths[p].fp16_too ? 2 : 1); ki++) {
      const path *pa = &paths[p];
      kind_state *k = &kinds[ki];
      for (int c = 0; c < 16 && pa->calls[c]; c++) {
        const char *call = pa->calls[c];
        if (!on_path(k, call)) {
          print_case(pa, k, call, 0, "-", "skipped",
                     "not on this path (the design needs at most 48 KiB of shared memory)");
          continue;
        }
        for (int nth = 1; nth <= MAX_USES; nth++) {
          int rc = pa->fresh ? run_fresh(pa, k, call, nth) : run_case(pa, k, call, nth);
          if (rc == CASE_NOT_REACHED && nth > 1) break;
          cases++;
          if (rc == CASE_PASS) continue;
          failures++;
          if (rc == CASE_NOT_REACHED)
            print_case(pa, k, call, nth, "-", "FAIL", "never called: this path's list of calls no longer matches src/");
          else if (rc != CASE_FAIL)
            print_case(pa, k, call, nth, "-", "FAIL", rc == CASE_HARNESS ? "the case's process could not run"
                                                                          : "the case's process died");
          if (rc == CASE_NOT_REACHED) break;
        }
      }
    }
  for (int i = 0; i < 2; i++) kind_close(&kinds[i]);
  ferry_ops_clear_memo();
  rig_close();
  remove_tree(cache_home);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  printf("ops faults: %d cases, %d failures\nRESULT: %s in %.1f s\n", cases, failures, failures ? "FAIL" : "PASS",
         (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9);
  return failures ? CASE_FAIL : CASE_PASS;
}
