/* fake_driver.c — a CUDA driver table that simulates one device in host memory, for CPU tests of the transfer
 * path and of fault injection. "Device" pointers are host pointers; copies are memcpy; the gather kernel's
 * launch runs its work items on the CPU; events complete at once (a test may make queries answer "not ready"). */
#include "fake_driver.h"

#include <stdlib.h>
#include <string.h>

static char ctx_token, module_token, function_token;
/* Thread-safe, so the transfer path can be driven from many threads at once (test_threads_cpu.c): the counters
 * are atomic and the registered ranges are under a lock. */
_Atomic int fake_live_events, fake_live_streams, fake_live_devmem, fake_registered;
_Atomic int fake_copy_calls, fake_register_calls;
int fake_copies_before_register[FAKE_REGISTER_LOG];
static pthread_mutex_t ranges_lock = PTHREAD_MUTEX_INITIALIZER;

static CUresult f_init(unsigned f) { (void)f; return CUDA_SUCCESS; }
static CUresult f_version(int *v) { *v = 13000; return CUDA_SUCCESS; }
static CUresult f_err_name(CUresult r, const char **s) { (void)r; *s = NULL; return CUDA_ERROR_INVALID_VALUE; }
static CUresult f_count(int *n) { *n = 1; return CUDA_SUCCESS; }
static CUresult f_get(CUdevice *d, int i) { if (i != 0) return CUDA_ERROR_INVALID_DEVICE; *d = 0; return CUDA_SUCCESS; }
static CUresult f_name(char *s, int n, CUdevice d) { (void)d; strncpy(s, "fake", (size_t)n); return CUDA_SUCCESS; }
static CUresult f_attr(int *v, CUdevice_attribute a, CUdevice d) { (void)a; (void)d; *v = 1; return CUDA_SUCCESS; }
static CUresult f_mem(size_t *b, CUdevice d) { (void)d; *b = 1u << 30; return CUDA_SUCCESS; }
static CUresult f_retain(CUcontext *c, CUdevice d) { (void)d; *c = (CUcontext)&ctx_token; return CUDA_SUCCESS; }
static CUresult f_push(CUcontext c) { (void)c; return CUDA_SUCCESS; }
static CUresult f_pop(CUcontext *c) { *c = (CUcontext)&ctx_token; return CUDA_SUCCESS; }
static CUresult f_ctxdev(CUdevice *d) { *d = 0; return CUDA_SUCCESS; }
static CUresult f_screate(CUstream *s, unsigned f) { (void)f; *s = malloc(1); fake_live_streams++; return CUDA_SUCCESS; }
static CUresult f_sdestroy(CUstream s) { free(s); fake_live_streams--; return CUDA_SUCCESS; }
static CUresult f_sctx(CUstream s, CUcontext *c) { (void)s; *c = (CUcontext)&ctx_token; return CUDA_SUCCESS; }
static CUresult f_swait(CUstream s, CUevent e, unsigned f) { (void)s; (void)e; (void)f; return CUDA_SUCCESS; }
static CUresult f_ssync(CUstream s) { (void)s; return CUDA_SUCCESS; }
static CUresult f_ecreate(CUevent *e, unsigned f) { (void)f; *e = malloc(1); fake_live_events++; return CUDA_SUCCESS; }
static CUresult f_edestroy(CUevent e) { free(e); fake_live_events--; return CUDA_SUCCESS; }
static CUresult f_erecord(CUevent e, CUstream s) { (void)e; (void)s; return CUDA_SUCCESS; }
/* Events complete at once, except that the next fake_queries_not_ready queries answer "still running". */
_Atomic int fake_queries_not_ready;
static CUresult f_equery(CUevent e) {
  (void)e;
  int n = atomic_load(&fake_queries_not_ready);
  while (n > 0 && !atomic_compare_exchange_weak(&fake_queries_not_ready, &n, n - 1)) {}
  return n > 0 ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}
static CUresult f_esync(CUevent e) { (void)e; return CUDA_SUCCESS; }
/* Registered ranges, so cuPointerGetAttribute can tell pinned (registered) host memory from pageable. */
#define FAKE_MAX_RANGES 64
static struct { uintptr_t lo, hi; } ranges[FAKE_MAX_RANGES];
static CUresult f_reg(void *p, size_t n, unsigned f) {
  (void)f;
  CUresult r = CUDA_ERROR_OUT_OF_MEMORY;
  pthread_mutex_lock(&ranges_lock);
  /* As the real driver: a range overlapping one still registered is refused. */
  for (int i = 0; i < FAKE_MAX_RANGES; i++)
    if (ranges[i].lo && (uintptr_t)p < ranges[i].hi && (uintptr_t)p + n > ranges[i].lo) {
      pthread_mutex_unlock(&ranges_lock);
      return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    }
  for (int i = 0; i < FAKE_MAX_RANGES; i++)
    if (ranges[i].lo == 0) {
      ranges[i].lo = (uintptr_t)p;
      ranges[i].hi = (uintptr_t)p + n;
      fake_registered++;
      int k = fake_register_calls++;
      if (k < FAKE_REGISTER_LOG) fake_copies_before_register[k] = fake_copy_calls;
      r = CUDA_SUCCESS;
      break;
    }
  pthread_mutex_unlock(&ranges_lock);
  return r;
}
static CUresult f_unreg(void *p) {
  CUresult r = CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
  pthread_mutex_lock(&ranges_lock);
  for (int i = 0; i < FAKE_MAX_RANGES; i++)
    if (ranges[i].lo == (uintptr_t)p) {
      ranges[i].lo = ranges[i].hi = 0;
      fake_registered--;
      r = CUDA_SUCCESS;
      break;
    }
  pthread_mutex_unlock(&ranges_lock);
  return r;
}
static CUresult f_pcreate(CUmemoryPool *p, const CUmemPoolProps *pr) { (void)pr; *p = (CUmemoryPool)&ctx_token; return CUDA_SUCCESS; }
static CUresult f_pdestroy(CUmemoryPool p) { (void)p; return CUDA_SUCCESS; }
static CUresult f_pset(CUmemoryPool p, CUmemPool_attribute a, void *v) { (void)p; (void)a; (void)v; return CUDA_SUCCESS; }
static CUresult f_alloc(CUdeviceptr *d, size_t n, CUmemoryPool p, CUstream s) {
  (void)p; (void)s;
  void *m = aligned_alloc(256, (n + 255) / 256 * 256);
  if (!m) return CUDA_ERROR_OUT_OF_MEMORY;
  fake_live_devmem++;
  *d = (CUdeviceptr)(uintptr_t)m;
  return CUDA_SUCCESS;
}
static CUresult f_free(CUdeviceptr d, CUstream s) { (void)s; free((void *)(uintptr_t)d); fake_live_devmem--; return CUDA_SUCCESS; }
static CUresult f_copy(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) {
  (void)st; fake_copy_calls++; memcpy((void *)(uintptr_t)d, (void *)(uintptr_t)s, n); return CUDA_SUCCESS;
}
static CUresult f_htod(CUdeviceptr d, const void *s, size_t n, CUstream st) {
  (void)st; fake_copy_calls++; memcpy((void *)(uintptr_t)d, s, n); return CUDA_SUCCESS;
}
/* Host memory registered with f_reg is mapped at the same address ("device pointer" = host pointer), as under
 * unified addressing; anything else is pageable and the query fails, as the real driver's does. */
static CUresult f_ptr_unlocked(void *v, CUpointer_attribute a, CUdeviceptr p) {
  for (int i = 0; i < FAKE_MAX_RANGES; i++) {
    if (!ranges[i].lo || (uintptr_t)p < ranges[i].lo || (uintptr_t)p >= ranges[i].hi) continue;
    if (a == CU_POINTER_ATTRIBUTE_DEVICE_POINTER || a == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR)
      *(CUdeviceptr *)v = a == CU_POINTER_ATTRIBUTE_DEVICE_POINTER ? p : (CUdeviceptr)ranges[i].lo;
    else if (a == CU_POINTER_ATTRIBUTE_RANGE_SIZE)
      *(size_t *)v = ranges[i].hi - ranges[i].lo;
    else
      return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
  }
  return CUDA_ERROR_INVALID_VALUE;
}
static CUresult f_ptr(void *v, CUpointer_attribute a, CUdeviceptr p) {
  pthread_mutex_lock(&ranges_lock);
  CUresult r = f_ptr_unlocked(v, a, p);
  pthread_mutex_unlock(&ranges_lock);
  return r;
}
static CUresult f_mload(CUmodule *m, const void *img) { (void)img; *m = (CUmodule)&module_token; return CUDA_SUCCESS; }
static CUresult f_munload(CUmodule m) { (void)m; return CUDA_SUCCESS; }
static CUresult f_mget(CUfunction *f, CUmodule m, const char *n) { (void)m; (void)n; *f = (CUfunction)&function_token; return CUDA_SUCCESS; }
static CUresult f_launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                         unsigned sh, CUstream s, void **params, void **extra) {
  (void)f; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)sh; (void)s; (void)extra;
  const ferry__gather_item *items = (const ferry__gather_item *)(uintptr_t)*(CUdeviceptr *)params[0];
  const ferry__gather_layout *layouts = (const ferry__gather_layout *)(uintptr_t)*(CUdeviceptr *)params[1];
  for (unsigned i = 0; i < gx; i++) ferry__gather_item_run_host(&items[i], layouts);
  return CUDA_SUCCESS;
}
static CUresult f_batch(CUdeviceptr *d, CUdeviceptr *s, size_t *n, size_t c, CUmemcpyAttributes *a, size_t *ai,
                        size_t na, CUstream st) {
  (void)a; (void)ai; (void)na; (void)st;
  fake_copy_calls++;
  for (size_t i = 0; i < c; i++) memcpy((void *)(uintptr_t)d[i], (void *)(uintptr_t)s[i], n[i]);
  return CUDA_SUCCESS;
}

/* Operator runtime entries (libraries, launches of GEMM kernels, graphs), defined at the end of this file. */
static void fake_ops_fill(ferry__driver *d);

void fake_driver_use(void) {
  static ferry__driver d;
  d.cuInit = f_init; d.cuDriverGetVersion = f_version; d.cuGetErrorName = f_err_name; d.cuGetErrorString = f_err_name;
  d.cuDeviceGetCount = f_count; d.cuDeviceGet = f_get; d.cuDeviceGetName = f_name; d.cuDeviceGetAttribute = f_attr;
  d.cuDeviceTotalMem = f_mem; d.cuDevicePrimaryCtxRetain = f_retain; d.cuCtxPushCurrent = f_push;
  d.cuCtxPopCurrent = f_pop; d.cuCtxGetDevice = f_ctxdev; d.cuStreamCreate = f_screate; d.cuStreamDestroy = f_sdestroy;
  d.cuStreamGetCtx = f_sctx; d.cuStreamWaitEvent = f_swait; d.cuStreamSynchronize = f_ssync;
  d.cuEventCreate = f_ecreate; d.cuEventDestroy = f_edestroy; d.cuEventRecord = f_erecord; d.cuEventQuery = f_equery;
  d.cuEventSynchronize = f_esync; d.cuMemHostRegister = f_reg; d.cuMemHostUnregister = f_unreg;
  d.cuMemPoolCreate = f_pcreate; d.cuMemPoolDestroy = f_pdestroy; d.cuMemPoolSetAttribute = f_pset;
  d.cuMemAllocFromPoolAsync = f_alloc; d.cuMemFreeAsync = f_free; d.cuMemcpyAsync = f_copy;
  d.cuMemcpyHtoDAsync = f_htod; d.cuPointerGetAttribute = f_ptr; d.cuModuleLoadData = f_mload;
  d.cuModuleUnload = f_munload; d.cuModuleGetFunction = f_mget; d.cuLaunchKernel = f_launch;
  d.cuMemcpyBatchAsync_v13 = f_batch; d.version = 13000;
  fake_ops_fill(&d);
  ferry__driver_install(&d);
}

/* ---- operator runtime: libraries, GEMM launches, stream capture and graphs ------------------------------------ */
/* A library is a malloc'd token; its kernel's function is fake_gemm_function, whose launches are recorded (grid,
 * block, shared memory, the parameter bytes) instead of run. Capture on one stream at a time: each recorded
 * launch becomes a node; instantiation copies the nodes, node updates rewrite the copy, replays count. */
static char fake_gemm_function;
_Atomic int fake_live_libraries, fake_live_graphs, fake_live_execs, fake_launches, fake_replays;
fake_launch_record fake_last_launch;

typedef struct fake_graph { int n; fake_launch_record nodes[FAKE_MAX_NODES]; } fake_graph;
static CUstream capture_stream;
static fake_graph *capture_graph;

static CUresult f_ctx_current(CUcontext *c) { *c = NULL; return CUDA_SUCCESS; }
/* The fake device is an sm_90 with an H200's 132 multiprocessors for the operator runtime; every other attribute
 * reads as before. */
static CUresult f_attr_ops(int *v, CUdevice_attribute a, CUdevice dev) {
  if (a == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR) { *v = 9; return CUDA_SUCCESS; }
  if (a == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR) { *v = 0; return CUDA_SUCCESS; }
  if (a == CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT) { *v = 132; return CUDA_SUCCESS; }
  return f_attr(v, a, dev);
}
static CUresult f_lib_load(CUlibrary *l, const void *code, CUjit_option *o, void **ov, unsigned no, CUlibraryOption *lo,
                           void **lov, unsigned nlo) {
  (void)o; (void)ov; (void)no; (void)lo; (void)lov; (void)nlo;
  if (memcmp(code, "\x7f" "ELF", 4) != 0) return CUDA_ERROR_INVALID_IMAGE;
  *l = malloc(1);
  fake_live_libraries++;
  return CUDA_SUCCESS;
}
static CUresult f_lib_unload(CUlibrary l) { free(l); fake_live_libraries--; return CUDA_SUCCESS; }
static CUresult f_lib_kernel(CUkernel *k, CUlibrary l, const char *name) { (void)name; *k = (CUkernel)l; return CUDA_SUCCESS; }
static CUresult f_kernel_fn(CUfunction *f, CUkernel k) { (void)k; *f = (CUfunction)&fake_gemm_function; return CUDA_SUCCESS; }
static CUresult f_fn_set(CUfunction f, CUfunction_attribute a, int v) { (void)f; (void)a; (void)v; return CUDA_SUCCESS; }
int fake_kernel_registers = 168; /* what every fake kernel reports as CU_FUNC_ATTRIBUTE_NUM_REGS */
static CUresult f_fn_get(int *v, CUfunction_attribute a, CUfunction f) {
  (void)f;
  *v = a == CU_FUNC_ATTRIBUTE_NUM_REGS ? fake_kernel_registers : 0;
  return CUDA_SUCCESS;
}
static CUresult f_launch_any(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                             unsigned sh, CUstream s, void **params, void **extra) {
  if (f != (CUfunction)&fake_gemm_function) return f_launch(f, gx, gy, gz, bx, by, bz, sh, s, params, extra);
  fake_launch_record r = {gx, gz, bx, sh, {0}, {{0}}};
  memcpy(r.params, params[0], sizeof r.params);
  memcpy(r.maps, params[1], sizeof r.maps); /* ferry passes both to every GEMM launch */
  fake_last_launch = r;
  fake_launches++;
  if (capture_graph && s == capture_stream) {
    if (capture_graph->n == FAKE_MAX_NODES) return CUDA_ERROR_OUT_OF_MEMORY;
    capture_graph->nodes[capture_graph->n++] = r;
  }
  return CUDA_SUCCESS;
}
static CUresult f_begin(CUstream s, CUstreamCaptureMode m) {
  (void)m;
  if (capture_graph) return CUDA_ERROR_ILLEGAL_STATE;
  capture_graph = calloc(1, sizeof *capture_graph);
  capture_stream = s;
  fake_live_graphs++;
  return CUDA_SUCCESS;
}
static CUresult f_end(CUstream s, CUgraph *g) {
  if (!capture_graph || s != capture_stream) return CUDA_ERROR_ILLEGAL_STATE;
  *g = (CUgraph)capture_graph;
  capture_graph = NULL;
  return CUDA_SUCCESS;
}
/* Nodes are named by their 1-based index, so a recorded node handle says which launch it was. */
static CUgraphNode fake_node_handle;
static CUresult f_capinfo(CUstream s, CUstreamCaptureStatus *st, cuuint64_t *id, CUgraph *g, const CUgraphNode **deps,
                          size_t *n) {
  if (!capture_graph || s != capture_stream) { *st = CU_STREAM_CAPTURE_STATUS_NONE; return CUDA_SUCCESS; }
  *st = CU_STREAM_CAPTURE_STATUS_ACTIVE;
  *id = 1;
  *g = (CUgraph)capture_graph;
  fake_node_handle = (CUgraphNode)(uintptr_t)capture_graph->n;
  *deps = &fake_node_handle;
  *n = capture_graph->n ? 1 : 0;
  return CUDA_SUCCESS;
}
static CUresult f_node_type(CUgraphNode n, CUgraphNodeType *t) { (void)n; *t = CU_GRAPH_NODE_TYPE_KERNEL; return CUDA_SUCCESS; }
static CUresult f_instantiate(CUgraphExec *e, CUgraph g, unsigned long long f) {
  (void)f;
  fake_graph *copy = malloc(sizeof *copy);
  *copy = *(fake_graph *)g;
  *e = (CUgraphExec)copy;
  fake_live_execs++;
  return CUDA_SUCCESS;
}
static CUresult f_graph_launch(CUgraphExec e, CUstream s) { (void)e; (void)s; fake_replays++; return CUDA_SUCCESS; }
static CUresult f_exec_set(CUgraphExec e, CUgraphNode n, const CUDA_KERNEL_NODE_PARAMS *p) {
  fake_graph *g = (fake_graph *)e;
  int i = (int)(uintptr_t)n - 1;
  if (i < 0 || i >= g->n || p->func != (CUfunction)&fake_gemm_function) return CUDA_ERROR_INVALID_VALUE;
  fake_launch_record r = {p->gridDimX, p->gridDimZ, p->blockDimX, p->sharedMemBytes, {0}, {{0}}};
  memcpy(r.params, p->kernelParams[0], sizeof r.params);
  memcpy(r.maps, p->kernelParams[1], sizeof r.maps);
  g->nodes[i] = r;
  return CUDA_SUCCESS;
}
static CUresult f_graph_destroy(CUgraph g) { free(g); fake_live_graphs--; return CUDA_SUCCESS; }
static CUresult f_exec_destroy(CUgraphExec e) { free(e); fake_live_execs--; return CUDA_SUCCESS; }

const fake_launch_record *fake_exec_node(void *exec, int index) {
  fake_graph *g = exec;
  return index >= 0 && index < g->n ? &g->nodes[index] : NULL;
}

static CUresult f_is_capturing(CUstream s, CUstreamCaptureStatus *st) {
  (void)s;
  *st = CU_STREAM_CAPTURE_STATUS_NONE;
  return CUDA_SUCCESS;
}
static CUresult f_capture_mode(CUstreamCaptureMode *m) { (void)m; return CUDA_SUCCESS; }

int fake_tensor_maps_encoded;
_Static_assert(sizeof(fake_tensor_map) == sizeof(CUtensorMap), "a fake map fills a CUtensorMap");
static CUresult f_tmap(CUtensorMap *map, CUtensorMapDataType type, cuuint32_t rank, void *address,
                       const cuuint64_t *dims, const cuuint64_t *strides, const cuuint32_t *box,
                       const cuuint32_t *element_strides, CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
                       CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill fill) {
  (void)l2, (void)fill;
  if (!map || (uintptr_t)map % 64 || rank < 1 || rank > 3 || (uintptr_t)address % 16 ||
      interleave != CU_TENSOR_MAP_INTERLEAVE_NONE)
    return CUDA_ERROR_INVALID_VALUE;
  const unsigned es = type == CU_TENSOR_MAP_DATA_TYPE_UINT16 ? 2 : type == CU_TENSOR_MAP_DATA_TYPE_UINT8 ? 1 : 4;
  fake_tensor_map f;
  memset(&f, 0, sizeof f);
  for (cuuint32_t i = 0; i < rank; i++) {
    if (!dims[i] || dims[i] > (1ull << 32) || !box[i] || box[i] > 256 || element_strides[i] != 1)
      return CUDA_ERROR_INVALID_VALUE;
    if (i && (strides[i - 1] % 16 || strides[i - 1] >= (1ull << 40))) return CUDA_ERROR_INVALID_VALUE;
    f.dims[i] = dims[i];
    f.box[i] = box[i];
    if (i) f.strides[i - 1] = strides[i - 1];
  }
  if (swizzle == CU_TENSOR_MAP_SWIZZLE_128B && box[0] * es > 128) return CUDA_ERROR_INVALID_VALUE;
  f.address = (uintptr_t)address;
  f.data_type = (unsigned)type;
  f.rank = rank;
  f.swizzle = (unsigned)swizzle;
  memcpy(map, &f, sizeof f);
  fake_tensor_maps_encoded++;
  return CUDA_SUCCESS;
}

int fake_max_clusters = 60;
static CUresult f_max_clusters(int *n, CUfunction f, const CUlaunchConfig *config) {
  if (!n || f != (CUfunction)&fake_gemm_function || !config || config->gridDimX % 2 || !config->blockDimX ||
      config->numAttrs)
    return CUDA_ERROR_INVALID_VALUE;
  *n = fake_max_clusters;
  return CUDA_SUCCESS;
}

static void fake_ops_fill(ferry__driver *d) {
  d->cuTensorMapEncodeTiled = f_tmap;
  d->cuOccupancyMaxActiveClusters = f_max_clusters;
  d->cuStreamIsCapturing = f_is_capturing; d->cuThreadExchangeStreamCaptureMode = f_capture_mode;
  d->cuDeviceGetAttribute = f_attr_ops;
  d->cuCtxGetCurrent = f_ctx_current; d->cuLibraryLoadData = f_lib_load; d->cuLibraryUnload = f_lib_unload;
  d->cuLibraryGetKernel = f_lib_kernel; d->cuKernelGetFunction = f_kernel_fn; d->cuFuncSetAttribute = f_fn_set;
  d->cuFuncGetAttribute = f_fn_get; d->cuLaunchKernel = f_launch_any; d->cuStreamBeginCapture = f_begin;
  d->cuStreamEndCapture = f_end; d->cuStreamGetCaptureInfo = f_capinfo; d->cuGraphNodeGetType = f_node_type;
  d->cuGraphInstantiateWithFlags = f_instantiate; d->cuGraphLaunch = f_graph_launch;
  d->cuGraphExecKernelNodeSetParams = f_exec_set; d->cuGraphDestroy = f_graph_destroy;
  d->cuGraphExecDestroy = f_exec_destroy;
}
