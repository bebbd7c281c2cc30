/* fault_ops_rig.c — the harness of the operator runtime's fault matrix (fault_ops_gpu.c): problems whose results are
 * exact, device memory and contexts handled past the fault seam, a census of the driver objects alive, and, through
 * the simulated driver, the GEMMs that driver only records and the context stack it does not keep.
 *
 * Exact results: every operand element is a multiple of 1/4 in [-1, 1], exact in fp16 and in fp32; each product is
 * a multiple of 1/16 and a sum of PROBLEM_K of them is at most 40 in magnitude, so fp32 accumulation is exact in any
 * order. A kernel that ran on the right operands therefore matches the host reference bit for bit, whatever its
 * design, and anything else — a stale or partial output, the sentinel — does not.
 *
 * The census: the driver table's create and destroy entries are replaced by wrappers that call the entries the
 * table held and count the objects alive (libraries, graphs, graph instances, streams, events, pinned ranges,
 * device allocations). The real driver cannot be asked how many libraries or graphs a process holds; the wrappers
 * make that exact, as the simulated driver's counters are for the CPU tests. They sit behind the fault seam
 * (FERRY_CU consults the seam, then calls the table), so a call the seam fails is never counted. The harness's own
 * driver calls go straight to the table: past the seam, through the census.
 */
#include "fault_ops.h"
#include "require.h"

#include "fake_driver.h"

#include <string.h>

rig the_rig;

/* ---- the census -------------------------------------------------------------------------------------------------- */

static ferry__driver passed; /* the entries the table held before the wrappers went in */
static census alive;

static CUresult count_library_load(CUlibrary *lib, const void *code, CUjit_option *jit, void **jit_values,
                                   unsigned n_jit, CUlibraryOption *opts, void **opt_values, unsigned n_opts) {
  CUresult r = passed.cuLibraryLoadData(lib, code, jit, jit_values, n_jit, opts, opt_values, n_opts);
  if (r == CUDA_SUCCESS) alive.libraries++;
  return r;
}
static CUresult count_library_unload(CUlibrary lib) {
  CUresult r = passed.cuLibraryUnload(lib);
  if (r == CUDA_SUCCESS) alive.libraries--;
  return r;
}
/* A capture that ends gives a graph; one that was invalidated gives an error and none. */
static CUresult count_end_capture(CUstream stream, CUgraph *graph) {
  CUresult r = passed.cuStreamEndCapture(stream, graph);
  if (r == CUDA_SUCCESS && *graph) alive.graphs++;
  return r;
}
static CUresult count_graph_destroy(CUgraph graph) {
  CUresult r = passed.cuGraphDestroy(graph);
  if (r == CUDA_SUCCESS) alive.graphs--;
  return r;
}
static CUresult count_instantiate(CUgraphExec *exec, CUgraph graph, unsigned long long flags) {
  CUresult r = passed.cuGraphInstantiateWithFlags(exec, graph, flags);
  if (r == CUDA_SUCCESS) alive.graph_execs++;
  return r;
}
static CUresult count_exec_destroy(CUgraphExec exec) {
  CUresult r = passed.cuGraphExecDestroy(exec);
  if (r == CUDA_SUCCESS) alive.graph_execs--;
  return r;
}
static CUresult count_stream_create(CUstream *stream, unsigned flags) {
  CUresult r = passed.cuStreamCreate(stream, flags);
  if (r == CUDA_SUCCESS) alive.streams++;
  return r;
}
static CUresult count_stream_destroy(CUstream stream) {
  CUresult r = passed.cuStreamDestroy(stream);
  if (r == CUDA_SUCCESS) alive.streams--;
  return r;
}
static CUresult count_event_create(CUevent *event, unsigned flags) {
  CUresult r = passed.cuEventCreate(event, flags);
  if (r == CUDA_SUCCESS) alive.events++;
  return r;
}
static CUresult count_event_destroy(CUevent event) {
  CUresult r = passed.cuEventDestroy(event);
  if (r == CUDA_SUCCESS) alive.events--;
  return r;
}
static CUresult count_host_register(void *p, size_t bytes, unsigned flags) {
  CUresult r = passed.cuMemHostRegister(p, bytes, flags);
  if (r == CUDA_SUCCESS) alive.pinned_ranges++;
  return r;
}
static CUresult count_host_unregister(void *p) {
  CUresult r = passed.cuMemHostUnregister(p);
  if (r == CUDA_SUCCESS) alive.pinned_ranges--;
  return r;
}
static CUresult count_alloc(CUdeviceptr *p, size_t bytes) {
  CUresult r = passed.cuMemAlloc(p, bytes);
  if (r == CUDA_SUCCESS) alive.device_allocations++;
  return r;
}
static CUresult count_free(CUdeviceptr p) {
  CUresult r = passed.cuMemFree(p);
  if (r == CUDA_SUCCESS) alive.device_allocations--;
  return r;
}
static CUresult count_pool_alloc(CUdeviceptr *p, size_t bytes, CUmemoryPool pool, CUstream stream) {
  CUresult r = passed.cuMemAllocFromPoolAsync(p, bytes, pool, stream);
  if (r == CUDA_SUCCESS) alive.device_allocations++;
  return r;
}
static CUresult count_free_async(CUdeviceptr p, CUstream stream) {
  CUresult r = passed.cuMemFreeAsync(p, stream);
  if (r == CUDA_SUCCESS) alive.device_allocations--;
  return r;
}

void census_now(census *out) { *out = alive; }

int census_same(const census *before, const census *after, char *why, size_t why_size) {
#define CENSUS_COMPARE_GEN(name)                                                                                \
  if (before->name != after->name) {                                                                            \
    snprintf(why, why_size, "%d %s alive, %d before", after->name, #name, before->name);                        \
    return 0;                                                                                                   \
  }
  CENSUS_MAP(CENSUS_COMPARE_GEN)
#undef CENSUS_COMPARE_GEN
  return 1;
}

/* ---- the simulated driver's GEMMs -------------------------------------------------------------------------------- */

/* The operands made so far, so that a launch's pointers can be traced back to the harness's values. */
static operand *known[32];
static int n_known;

static operand *operand_at(const void *ptr) {
  for (int i = 0; i < n_known; i++)
    if ((const void *)(uintptr_t)known[i]->dev == ptr) return known[i];
  return NULL;
}

/* Runs on the host what a GEMM launch describes: the simulated driver records launches instead of running them,
 * and its "device" memory is host memory. The operands are the harness's values of the buffers the parameters
 * point at, read with the parameters' sizes, leading dimensions and majors, so a launch on the wrong buffers or with
 * the wrong layout leaves a wrong output — or, off the harness's buffers, none at all. */
static void simulated_gemm(const ferry_gemm_params *p) {
  const operand *a = operand_at(p->a), *b = operand_at(p->b), *o = operand_at(p->out);
  if (!a || !b || !o || o->type != FERRY_SCALAR_F32 || p->l != 1) return;
  int a_col = FERRY_GEMM_KIND_A_MAJOR(p->kind) == FERRY_MAJOR_COL;
  int b_col = FERRY_GEMM_KIND_B_MAJOR(p->kind) == FERRY_MAJOR_COL;
  int o_col = FERRY_GEMM_KIND_OUT_MAJOR(p->kind) == FERRY_MAJOR_COL;
  size_t a_size = (size_t)a->rows * (size_t)a->cols, b_size = (size_t)b->rows * (size_t)b->cols;
  float *out = (float *)p->out;
  for (int64_t i = 0; i < p->m; i++)
    for (int64_t j = 0; j < p->n; j++) {
      double acc = 0;
      for (int64_t q = 0; q < p->k; q++) {
        size_t ai = (size_t)(a_col ? i + q * p->lda : i * p->lda + q);
        size_t bi = (size_t)(b_col ? q + j * p->ldb : q * p->ldb + j);
        if (ai >= a_size || bi >= b_size) return;
        acc += (double)a->val[ai] * (double)b->val[bi];
      }
      size_t oi = (size_t)(o_col ? i + j * p->ldc : i * p->ldc + j);
      if (oi >= (size_t)o->rows * (size_t)o->cols) return;
      out[oi] = (float)(p->alpha * acc + (p->beta != 0.0f ? p->beta * out[oi] : 0.0));
    }
}

/* A launch runs at once unless its stream is capturing (then it only becomes a node of the capture). */
static CUresult simulated_launch(CUfunction fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                 unsigned bz, unsigned smem, CUstream stream, void **params, void **extra) {
  CUresult r = passed.cuLaunchKernel(fn, gx, gy, gz, bx, by, bz, smem, stream, params, extra);
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  cuuint64_t id;
  CUgraph graph;
  const CUgraphNode *deps;
  size_t n_deps;
  if (r == CUDA_SUCCESS &&
      passed.cuStreamGetCaptureInfo(stream, &status, &id, &graph, &deps, &n_deps) == CUDA_SUCCESS &&
      status == CU_STREAM_CAPTURE_STATUS_NONE) {
    ferry_gemm_params p;
    memcpy(&p, params[0], sizeof p);
    simulated_gemm(&p);
  }
  return r;
}

/* A replay runs every node of the instance, as its parameters stand (after any update). */
static CUresult simulated_graph_launch(CUgraphExec exec, CUstream stream) {
  CUresult r = passed.cuGraphLaunch(exec, stream);
  const fake_launch_record *node;
  for (int i = 0; r == CUDA_SUCCESS && (node = fake_exec_node(exec, i)) != NULL; i++) {
    ferry_gemm_params p;
    memcpy(&p, node->params, sizeof p);
    simulated_gemm(&p);
  }
  return r;
}

/* The simulated driver keeps no context stack (nothing ever reads as current), where the real one keeps one per
 * thread and ferry's launch pushes its context only when it is not current already. This stack gives the simulation
 * the real behaviour, so that a context left current shows here too. */
static _Thread_local CUcontext simulated_stack[64];
static _Thread_local int simulated_depth;

static CUresult simulated_push(CUcontext ctx) {
  if (simulated_depth == 64) return CUDA_ERROR_OUT_OF_MEMORY;
  simulated_stack[simulated_depth++] = ctx;
  return CUDA_SUCCESS;
}
static CUresult simulated_pop(CUcontext *ctx) {
  if (simulated_depth == 0) return CUDA_ERROR_INVALID_CONTEXT;
  *ctx = simulated_stack[--simulated_depth];
  return CUDA_SUCCESS;
}
static CUresult simulated_current(CUcontext *ctx) {
  *ctx = simulated_depth ? simulated_stack[simulated_depth - 1] : NULL;
  return CUDA_SUCCESS;
}

static void install_wrappers(void) {
  passed = ferry__drv;
  ferry__drv.cuLibraryLoadData = count_library_load;
  ferry__drv.cuLibraryUnload = count_library_unload;
  ferry__drv.cuStreamEndCapture = count_end_capture;
  ferry__drv.cuGraphDestroy = count_graph_destroy;
  ferry__drv.cuGraphInstantiateWithFlags = count_instantiate;
  ferry__drv.cuGraphExecDestroy = count_exec_destroy;
  ferry__drv.cuStreamCreate = count_stream_create;
  ferry__drv.cuStreamDestroy = count_stream_destroy;
  ferry__drv.cuEventCreate = count_event_create;
  ferry__drv.cuEventDestroy = count_event_destroy;
  ferry__drv.cuMemHostRegister = count_host_register;
  ferry__drv.cuMemHostUnregister = count_host_unregister;
  ferry__drv.cuMemAllocFromPoolAsync = count_pool_alloc;
  ferry__drv.cuMemFreeAsync = count_free_async;
  if (passed.cuMemAlloc) ferry__drv.cuMemAlloc = count_alloc; /* absent from the simulated driver */
  if (passed.cuMemFree) ferry__drv.cuMemFree = count_free;
  if (the_rig.simulated) {
    ferry__drv.cuLaunchKernel = simulated_launch;
    ferry__drv.cuGraphLaunch = simulated_graph_launch;
    ferry__drv.cuCtxPushCurrent = simulated_push;
    ferry__drv.cuCtxPopCurrent = simulated_pop;
    ferry__drv.cuCtxGetCurrent = simulated_current;
  }
}

/* ---- device, context, stream ------------------------------------------------------------------------------------- */

int rig_open(int simulated) {
  memset(&the_rig, 0, sizeof the_rig);
  the_rig.simulated = simulated;
  if (simulated) fake_driver_use();
  ferry_status st = ferry_init();
  if (st != FERRY_OK) {
    printf("ops faults: no GPU here (%s: %s); --simulate runs the matrix without one\n",
           ferry_status_name(st), ferry_last_error_message());
    return 0;
  }
  install_wrappers();
  REQUIRE_OK(ferry_device_resolve(-1, &the_rig.dev));
  /* Directly, not through ferry: ferry's own first context retain and capability read must stay on its path. */
  CUdevice d;
  int major = 0, minor = 0;
  REQUIRE_CU(ferry__drv.cuDeviceGet(&d, the_rig.dev));
  REQUIRE_CU(ferry__drv.cuDeviceGetName(the_rig.device_name, (int)sizeof the_rig.device_name, d));
  REQUIRE_CU(ferry__drv.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d));
  REQUIRE_CU(ferry__drv.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d));
  the_rig.sm = major * 10 + minor;
  REQUIRE_CU(ferry__drv.cuDevicePrimaryCtxRetain(&the_rig.ctx, d));
  rig_enter();
  REQUIRE_CU(ferry__drv.cuStreamCreate(&the_rig.stream, CU_STREAM_NON_BLOCKING));
  rig_leave();
  return 1;
}

void rig_close(void) {
  rig_enter();
  REQUIRE_CU(ferry__drv.cuStreamDestroy(the_rig.stream));
  rig_leave();
}

void rig_enter(void) { REQUIRE_CU(ferry__drv.cuCtxPushCurrent(the_rig.ctx)); }

void rig_leave(void) {
  CUcontext popped;
  REQUIRE_CU(ferry__drv.cuCtxPopCurrent(&popped));
}

int rig_pop_leftovers(void) {
  int n = 0;
  CUcontext current = NULL, popped;
  while (n < 64 && ferry__drv.cuCtxGetCurrent(&current) == CUDA_SUCCESS && current) {
    REQUIRE_CU(ferry__drv.cuCtxPopCurrent(&popped));
    n++;
  }
  return n;
}

int rig_stream_not_capturing(void) {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  cuuint64_t id;
  CUgraph graph = NULL;
  const CUgraphNode *deps;
  size_t n_deps;
  rig_enter();
  REQUIRE_CU(ferry__drv.cuStreamGetCaptureInfo(the_rig.stream, &status, &id, &graph, &deps, &n_deps));
  int capturing = status != CU_STREAM_CAPTURE_STATUS_NONE;
  graph = NULL;
  if (capturing && ferry__drv.cuStreamEndCapture(the_rig.stream, &graph) == CUDA_SUCCESS && graph)
    (void)ferry__drv.cuGraphDestroy(graph);
  rig_leave();
  return !capturing;
}

void rig_sync(void) {
  rig_enter();
  REQUIRE_CU(ferry__drv.cuStreamSynchronize(the_rig.stream));
  rig_leave();
}

/* ---- device memory: the real driver's, or the simulated driver's host memory ------------------------------------- */

static CUdeviceptr device_alloc(size_t bytes) {
  CUdeviceptr p = 0;
  rig_enter();
  if (the_rig.simulated) REQUIRE_CU(ferry__drv.cuMemAllocFromPoolAsync(&p, bytes, NULL, NULL));
  else REQUIRE_CU(ferry__drv.cuMemAlloc(&p, bytes));
  rig_leave();
  return p;
}

static void device_free(CUdeviceptr p) {
  rig_enter();
  if (the_rig.simulated) REQUIRE_CU(ferry__drv.cuMemFreeAsync(p, NULL));
  else REQUIRE_CU(ferry__drv.cuMemFree(p));
  rig_leave();
}

static void device_upload(CUdeviceptr dst, const void *src, size_t bytes) {
  if (the_rig.simulated) {
    memcpy((void *)(uintptr_t)dst, src, bytes);
    return;
  }
  rig_enter();
  REQUIRE_CU(ferry__drv.cuMemcpyHtoD(dst, src, bytes));
  /* From pageable memory the copy may return before its DMA lands, and the operations' stream does not wait for
   * the legacy stream the copy went on: a sentinel landing after a kernel's output would read as "not written". */
  REQUIRE_CU(ferry__drv.cuStreamSynchronize(NULL));
  rig_leave();
}

static void device_download(void *dst, CUdeviceptr src, size_t bytes) {
  if (the_rig.simulated) {
    memcpy(dst, (const void *)(uintptr_t)src, bytes);
    return;
  }
  rig_enter();
  REQUIRE_CU(ferry__drv.cuMemcpyDtoH(dst, src, bytes));
  rig_leave();
}

/* ---- problems ---------------------------------------------------------------------------------------------------- */

static uint32_t next_random(uint32_t *state) { /* xorshift32 */
  *state ^= *state << 13;
  *state ^= *state >> 17;
  *state ^= *state << 5;
  return *state;
}

/* q/4 for q in -4..4 as fp16 bits: 1/4, 1/2, 3/4 and 1 are 2^-2, 2^-1, 1.5·2^-1 and 2^0 (binary16: exponent bias
 * 15, 10 mantissa bits). */
static uint16_t quarter_as_f16(int q) {
  static const uint16_t magnitude[5] = {0x0000, 0x3400, 0x3800, 0x3a00, 0x3c00};
  return (uint16_t)((q < 0 ? 0x8000u : 0u) | magnitude[q < 0 ? -q : q]);
}

/* An operand with random quarters (`seed` non-NULL) or none (an output), uploaded. */
static void operand_make(operand *m, int type, int rows, int cols, uint32_t *seed) {
  memset(m, 0, sizeof *m);
  m->type = type, m->rows = rows, m->cols = cols;
  size_t n = (size_t)rows * (size_t)cols, elem = type == FERRY_SCALAR_F32 ? 4 : 2;
  m->val = calloc(n, sizeof *m->val);
  m->dev = device_alloc(n * elem);
  m->shape[0] = rows, m->shape[1] = cols;
  m->strides[0] = cols, m->strides[1] = 1;
  ferry_dtype dt = {FERRY_DTYPE_FLOAT, (uint8_t)(type == FERRY_SCALAR_F32 ? 32 : 16), 1};
  m->t = (ferry_tensor){(void *)(uintptr_t)m->dev, {FERRY_DEVICE_CUDA, the_rig.dev}, 2, dt, m->shape, m->strides, 0};
  if (n_known == (int)(sizeof known / sizeof known[0])) {
    printf("FATAL %s:%d: more operands than the harness traces (%d)\n", __FILE__, __LINE__, n_known);
    exit(2);
  }
  known[n_known++] = m;
  if (!seed) return;
  unsigned char *image = malloc(n * elem);
  for (size_t i = 0; i < n; i++) {
    int q = (int)(next_random(seed) % 9) - 4;
    m->val[i] = (float)q / 4.0f;
    if (type == FERRY_SCALAR_F32) memcpy(image + 4 * i, &m->val[i], 4);
    else {
      uint16_t h = quarter_as_f16(q);
      memcpy(image + 2 * i, &h, 2);
    }
  }
  device_upload(m->dev, image, n * elem);
  free(image);
}

void problem_make(problem *p, int in_type, uint32_t seed) {
  uint32_t state = seed ? seed : 1;
  operand_make(&p->a, in_type, PROBLEM_M, PROBLEM_K, &state);
  operand_make(&p->b, in_type, PROBLEM_K, PROBLEM_N, &state);
  operand_make(&p->out, FERRY_SCALAR_F32, PROBLEM_M, PROBLEM_N, NULL);
  for (int i = 0; i < PROBLEM_M; i++)
    for (int j = 0; j < PROBLEM_N; j++) {
      double acc = 0;
      for (int q = 0; q < PROBLEM_K; q++) acc += (double)p->a.val[i * PROBLEM_K + q] * p->b.val[q * PROBLEM_N + j];
      p->ref[i * PROBLEM_N + j] = (float)acc;
    }
  REQUIRE_OK(ferry_gemm_args_init(&p->args, &p->a.t, &p->b.t, &p->out.t, FERRY_SCALAR_F32));
}

void problem_free(problem *p) {
  operand *ops[3] = {&p->a, &p->b, &p->out};
  for (int i = 0; i < 3; i++) {
    device_free(ops[i]->dev);
    free(ops[i]->val);
    for (int k = 0; k < n_known; k++)
      if (known[k] == ops[i]) {
        known[k] = known[--n_known];
        break;
      }
  }
}

void problem_poison(problem *p) {
  static uint32_t sentinel[PROBLEM_M * PROBLEM_N];
  memset(sentinel, 0xff, sizeof sentinel);
  device_upload(p->out.dev, sentinel, sizeof sentinel);
}

void problem_output(const problem *p, int *sentinel, int *exact) {
  static uint32_t got[PROBLEM_M * PROBLEM_N];
  device_download(got, p->out.dev, sizeof got);
  *sentinel = *exact = 0;
  for (int i = 0; i < PROBLEM_M * PROBLEM_N; i++) {
    uint32_t want;
    memcpy(&want, &p->ref[i], 4);
    *sentinel += got[i] == 0xffffffffu;
    *exact += got[i] == want;
  }
}
