/* ops_testing.c — private test hooks for ferry.ops, compiled only with FERRY_PYTHON_TEST_HOOKS (the project's own
 * build, never a wheel): the operator runtime's driver entry points added to the simulated driver of testing.c,
 * so the CPU suite drives GemmArguments -> run / launcher / Graph from Python end to end, and checks the results.
 *
 * The simulation: the device is an sm_90; compiled cubins (real NVRTC output) "load" as libraries; a launch of an
 * operator's kernel *computes the GEMM on the CPU* from the kernel parameter ferry built (ferry_gemm_params:
 * pointers, leading dimensions, batch strides, alpha/beta, the kind's types and majors) in the host memory that
 * plays device memory — so a wrong pointer, stride or offset handed down from Python shows up as a wrong result.
 * Stream capture records launches as nodes (one capture at a time, as the real driver per stream); replaying an
 * instantiated graph computes its nodes; node updates rewrite them. Every launch records its stream and grid.
 * Launches of other functions (the transfer half's gather kernel) go to testing.c's simulation unchanged.
 *
 * Hooks (all underscored, in ferry._ferry):
 *   _ops_sim_install()      after _sim_install(): add the operator entry points (RuntimeError before it)
 *   _ops_sim_compute(flag)  compute launches (the default) or only record them (timing the Python side); returns
 *                           the old flag
 *   _ops_sim_state()        dict: launches, replays, last_stream, last_grid, last_block, last_smem, last_kind,
 *                           live_libraries, live_graphs, live_execs, capturing
 *   _ops_sim_capture(handle) -> graph   begin capturing stream `handle` (another framework's capture, as
 *                           torch.cuda.graph's); _ops_sim_capture_end(handle) -> exec; _ops_sim_replay(exec, handle);
 *                           _ops_sim_exec_destroy(exec). Handles are ints.
 */
#include "ops_py.h"

#include "internal.h" /* the driver table: private to the library, test seam only */

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_NODES 256

typedef struct node {
  CUfunction fn;
  unsigned grid[3], block, smem;
  ferry_gemm_params params;
} node;

typedef struct sim_graph {
  int n;
  node nodes[MAX_NODES];
} sim_graph;

static char gemm_function;  /* the one CUfunction of every loaded operator */
static int compute = 1, launches, replays, live_libraries, live_graphs, live_execs;
static node last;
static CUstream last_stream;
static CUstream capture_stream;
static sim_graph *capture_graph;
static CUgraphNode node_handle;
static CUresult (*base_launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                               CUstream, void **, void **);
static CUresult (*base_attribute)(int *, CUdevice_attribute, CUdevice);

/* ---- the GEMM on the CPU ------------------------------------------------------------------------------------ */

static double half_to_double(uint16_t h) {
  int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m | 0x400, e - 25);
  return h & 0x8000 ? -v : v;
}

static uint16_t double_to_half(double d) { /* round to nearest even through float */
  float f = (float)d;
  uint32_t x;
  memcpy(&x, &f, 4);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
  if (isnan(f)) return sign | 0x7e00;
  float a = fabsf(f);
  if (a >= 65520.0f) return sign | 0x7c00;
  if (a < 6.103515625e-05f) return sign | (uint16_t)lrintf(a * 16777216.0f); /* subnormal: units of 2^-24 */
  int e;
  float frac = frexpf(a, &e); /* a = frac * 2^e, frac in [0.5, 1) */
  uint32_t mant = (uint32_t)lrintf(ldexpf(frac, 11)); /* 11 significant bits */
  if (mant == 2048) mant = 1024, e++;
  return sign | (uint16_t)(((e + 14) << 10) | (mant & 0x3ff));
}

/* An FP8 value: e4m3fn (4 exponent bits, bias 7, no infinities, S.1111.111 NaN) or e5m2 (5, bias 15, IEEE-like). */
static double fp8_to_double(uint8_t v, int exp_bits) {
  const int mant_bits = 7 - exp_bits, bias = (1 << (exp_bits - 1)) - 1;
  const int e = (v >> mant_bits) & ((1 << exp_bits) - 1), m = v & ((1 << mant_bits) - 1);
  double x;
  if (exp_bits == 4 && e == 15 && m == 7) x = NAN;
  else if (exp_bits == 5 && e == 31) x = m ? NAN : INFINITY;
  else if (e == 0) x = ldexp(m, 1 - bias - mant_bits);
  else x = ldexp(m + (1 << mant_bits), e - bias - mant_bits);
  return v & 0x80 ? -x : x;
}

static double load(const void *base, int type, int64_t i) {
  if (type == FERRY_SCALAR_F32) return ((const float *)base)[i];
  if (type == FERRY_SCALAR_I32) return ((const int32_t *)base)[i];
  if (type == FERRY_SCALAR_I8) return ((const int8_t *)base)[i];
  if (type == FERRY_SCALAR_E4M3 || type == FERRY_SCALAR_E5M2)
    return fp8_to_double(((const uint8_t *)base)[i], type == FERRY_SCALAR_E4M3 ? 4 : 5);
  uint16_t h = ((const uint16_t *)base)[i];
  if (type == FERRY_SCALAR_F16) return half_to_double(h);
  uint32_t x = (uint32_t)h << 16;
  float f;
  memcpy(&f, &x, 4);
  return f;
}

static void store(void *base, int type, int64_t i, double v) {
  if (type == FERRY_SCALAR_I32) {
    ((int32_t *)base)[i] = (int32_t)v; /* exact: int8 sums below 2^53 */
  } else if (type == FERRY_SCALAR_F32) {
    ((float *)base)[i] = (float)v;
  } else if (type == FERRY_SCALAR_F16) {
    ((uint16_t *)base)[i] = double_to_half(v);
  } else {
    float f = (float)v;
    uint32_t x;
    memcpy(&x, &f, 4);
    x = isnan(f) ? 0x7fc00000u : x + 0x7fffu + ((x >> 16) & 1u); /* round to nearest even */
    ((uint16_t *)base)[i] = (uint16_t)(x >> 16);
  }
}

static int64_t at(int row_major, int64_t ld, int64_t i, int64_t j) { return row_major ? i * ld + j : i + j * ld; }

/* The kind's fused epilogue (FERRY_GEMM_KIND_BIAS, FERRY_GEMM_KIND_ACTIVATION) of value v at (i, j). */
static double epilogue(const ferry_gemm_params *p, double v, int64_t i, int64_t j) {
  int mode = (int)FERRY_GEMM_KIND_BIAS(p->kind), act = (int)FERRY_GEMM_KIND_ACTIVATION(p->kind);
  int tc = (int)FERRY_GEMM_KIND_OUT_TYPE(p->kind);
  if (mode) v += load(p->bias, tc, mode == FERRY_BIAS_ROW ? j : i);
  switch (act) {
  case FERRY_ACTIVATION_RELU: return v < 0 ? 0 : v;
  case FERRY_ACTIVATION_GELU_TANH: return 0.5 * v * (1 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
  case FERRY_ACTIVATION_SILU: return v / (1 + exp(-v));
  default: return v;
  }
}

static void gemm_on_cpu(const ferry_gemm_params *p) {
  int ta = (int)FERRY_GEMM_KIND_A_TYPE(p->kind), tb = (int)FERRY_GEMM_KIND_B_TYPE(p->kind);
  int tc = (int)FERRY_GEMM_KIND_OUT_TYPE(p->kind);
  int ra = FERRY_GEMM_KIND_A_MAJOR(p->kind) == FERRY_MAJOR_ROW;
  int rb = FERRY_GEMM_KIND_B_MAJOR(p->kind) == FERRY_MAJOR_ROW;
  int rc = FERRY_GEMM_KIND_OUT_MAJOR(p->kind) == FERRY_MAJOR_ROW;
  double alpha = p->alpha;
  if (p->kind & FERRY_GEMM_KIND_SCALED) alpha *= (double)*p->scale_a * (double)*p->scale_b;
  /* Each batch's A (row-major) and B (column-major) as doubles first, so the inner loop is a dot product. */
  double *a = malloc(sizeof(double) * (size_t)(p->m * p->k + 1)), *b = malloc(sizeof(double) * (size_t)(p->k * p->n + 1));
  for (int64_t z = 0; a && b && z < p->l; z++) {
    for (int64_t i = 0; i < p->m; i++)
      for (int64_t q = 0; q < p->k; q++) a[i * p->k + q] = load(p->a, ta, z * p->batch_a + at(ra, p->lda, i, q));
    for (int64_t j = 0; j < p->n; j++)
      for (int64_t q = 0; q < p->k; q++) b[j * p->k + q] = load(p->b, tb, z * p->batch_b + at(rb, p->ldb, q, j));
    for (int64_t i = 0; i < p->m; i++)
      for (int64_t j = 0; j < p->n; j++) {
        double acc = 0;
        for (int64_t q = 0; q < p->k; q++) acc += a[i * p->k + q] * b[j * p->k + q];
        int64_t o = z * p->batch_c + at(rc, p->ldc, i, j);
        double v = alpha * acc + (p->beta != 0.0f ? (double)p->beta * load(p->out, tc, o) : 0.0);
        store(p->out, tc, o, epilogue(p, v, i, j));
      }
  }
  free(a);
  free(b);
}

/* ---- the entry points --------------------------------------------------------------------------------------- */

/* An sm_90 with an H200's 132 multiprocessors, whose kernels report their whole share of registers for 384 threads
 * (what a persistent kernel's launch reads); every other attribute as the transfer simulation answers it. */
static CUresult s_attribute(int *v, CUdevice_attribute a, CUdevice d) {
  if (a == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR) return *v = 9, CUDA_SUCCESS;
  if (a == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR) return *v = 0, CUDA_SUCCESS;
  if (a == CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT) return *v = 132, CUDA_SUCCESS;
  return base_attribute(v, a, d);
}
static CUresult s_ctx_current(CUcontext *c) { *c = NULL; return CUDA_SUCCESS; }
static CUresult s_lib_load(CUlibrary *l, const void *code, CUjit_option *o, void **ov, unsigned no, CUlibraryOption *lo,
                           void **lov, unsigned nlo) {
  if (memcmp(code, "\x7f" "ELF", 4) != 0) return CUDA_ERROR_INVALID_IMAGE;
  *l = malloc(1);
  live_libraries++;
  return CUDA_SUCCESS;
}
static CUresult s_lib_unload(CUlibrary l) { free(l); live_libraries--; return CUDA_SUCCESS; }
static CUresult s_lib_kernel(CUkernel *k, CUlibrary l, const char *name) { *k = (CUkernel)l; return CUDA_SUCCESS; }
static CUresult s_kernel_fn(CUfunction *f, CUkernel k) { *f = (CUfunction)&gemm_function; return CUDA_SUCCESS; }
static CUresult s_fn_set(CUfunction f, CUfunction_attribute a, int v) { return CUDA_SUCCESS; }
static CUresult s_fn_get(int *v, CUfunction_attribute a, CUfunction f) {
  *v = a == CU_FUNC_ATTRIBUTE_NUM_REGS ? 168 : 0;
  return CUDA_SUCCESS;
}

static CUresult s_launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                         unsigned smem, CUstream s, void **params, void **extra) {
  if (f != (CUfunction)&gemm_function) return base_launch(f, gx, gy, gz, bx, by, bz, smem, s, params, extra);
  node n = {f, {gx, gy, gz}, bx, smem, {0}};
  memcpy(&n.params, params[0], sizeof n.params);
  last = n;
  last_stream = s;
  launches++;
  if (capture_graph && s == capture_stream) {
    if (capture_graph->n == MAX_NODES) return CUDA_ERROR_OUT_OF_MEMORY;
    capture_graph->nodes[capture_graph->n++] = n;
    return CUDA_SUCCESS;
  }
  if (compute) gemm_on_cpu(&n.params);
  return CUDA_SUCCESS;
}

static CUresult s_begin(CUstream s, CUstreamCaptureMode m) {
  if (capture_graph) return CUDA_ERROR_ILLEGAL_STATE;
  if (!(capture_graph = calloc(1, sizeof *capture_graph))) return CUDA_ERROR_OUT_OF_MEMORY;
  capture_stream = s;
  live_graphs++;
  return CUDA_SUCCESS;
}
static CUresult s_end(CUstream s, CUgraph *g) {
  if (!capture_graph || s != capture_stream) return CUDA_ERROR_ILLEGAL_STATE;
  *g = (CUgraph)capture_graph;
  capture_graph = NULL;
  return CUDA_SUCCESS;
}
/* Nodes are named by their 1-based index. */
static CUresult s_capinfo(CUstream s, CUstreamCaptureStatus *st, cuuint64_t *id, CUgraph *g, const CUgraphNode **deps,
                          size_t *n) {
  if (!capture_graph || s != capture_stream) {
    *st = CU_STREAM_CAPTURE_STATUS_NONE;
    return CUDA_SUCCESS;
  }
  *st = CU_STREAM_CAPTURE_STATUS_ACTIVE;
  *id = 1;
  *g = (CUgraph)capture_graph;
  node_handle = (CUgraphNode)(uintptr_t)capture_graph->n;
  *deps = &node_handle;
  *n = capture_graph->n ? 1 : 0;
  return CUDA_SUCCESS;
}
static CUresult s_node_type(CUgraphNode n, CUgraphNodeType *t) { *t = CU_GRAPH_NODE_TYPE_KERNEL; return CUDA_SUCCESS; }
static CUresult s_instantiate(CUgraphExec *e, CUgraph g, unsigned long long f) {
  sim_graph *copy = malloc(sizeof *copy);
  if (!copy) return CUDA_ERROR_OUT_OF_MEMORY;
  *copy = *(sim_graph *)g;
  *e = (CUgraphExec)copy;
  live_execs++;
  return CUDA_SUCCESS;
}
static CUresult s_graph_launch(CUgraphExec e, CUstream s) {
  sim_graph *g = (sim_graph *)e;
  replays++;
  last_stream = s;
  for (int i = 0; compute && i < g->n; i++) gemm_on_cpu(&g->nodes[i].params);
  return CUDA_SUCCESS;
}
static CUresult s_exec_set(CUgraphExec e, CUgraphNode h, const CUDA_KERNEL_NODE_PARAMS *p) {
  sim_graph *g = (sim_graph *)e;
  int i = (int)(uintptr_t)h - 1;
  if (i < 0 || i >= g->n || p->func != (CUfunction)&gemm_function) return CUDA_ERROR_INVALID_VALUE;
  node n = {p->func, {p->gridDimX, p->gridDimY, p->gridDimZ}, p->blockDimX, p->sharedMemBytes, {0}};
  memcpy(&n.params, p->kernelParams[0], sizeof n.params);
  g->nodes[i] = n;
  return CUDA_SUCCESS;
}
static CUresult s_graph_destroy(CUgraph g) { free(g); live_graphs--; return CUDA_SUCCESS; }
static CUresult s_exec_destroy(CUgraphExec e) { free(e); live_execs--; return CUDA_SUCCESS; }

/* A TMA design's tensor maps: the simulation computes from the parameters alone (gemm_on_cpu), so a map is only
 * checked as the driver would (16-byte address and strides) and left empty. */
static CUresult s_tmap(CUtensorMap *map, CUtensorMapDataType type, cuuint32_t rank, void *address,
                       const cuuint64_t *dims, const cuuint64_t *strides, const cuuint32_t *box,
                       const cuuint32_t *element_strides, CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
                       CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill fill) {
  (void)type, (void)dims, (void)box, (void)element_strides, (void)interleave, (void)swizzle, (void)l2, (void)fill;
  if (!map || (uintptr_t)address % 16) return CUDA_ERROR_INVALID_VALUE;
  for (cuuint32_t i = 0; i + 1 < rank; i++)
    if (strides[i] % 16) return CUDA_ERROR_INVALID_VALUE;
  memset(map, 0, sizeof *map);
  return CUDA_SUCCESS;
}

/* A cluster design's clusters at once: an H100's or H200's figure for one block per multiprocessor. */
static CUresult s_max_clusters(int *n, CUfunction f, const CUlaunchConfig *config) {
  if (!n || f != (CUfunction)&gemm_function || !config || !config->blockDimX) return CUDA_ERROR_INVALID_VALUE;
  *n = 66;
  return CUDA_SUCCESS;
}

/* ---- the hooks ----------------------------------------------------------------------------------------------- */

static PyObject *ops_sim_install(PyObject *self, PyObject *unused) {
  /* testing.c's simulation must be in place (ferry__drv is its table); its cuInit answers without a device. */
  if (!ferry__drv.cuLaunchKernel || !ferry__drv.cuDeviceGetAttribute || ferry__drv.version != 13000) {
    PyErr_SetString(PyExc_RuntimeError, "_ops_sim_install(): call _sim_install() first");
    return NULL;
  }
  if (ferry__drv.cuLaunchKernel == s_launch) Py_RETURN_NONE;
  base_launch = ferry__drv.cuLaunchKernel;
  base_attribute = ferry__drv.cuDeviceGetAttribute;
  ferry__drv.cuDeviceGetAttribute = s_attribute;
  ferry__drv.cuCtxGetCurrent = s_ctx_current;
  ferry__drv.cuLibraryLoadData = s_lib_load;
  ferry__drv.cuLibraryUnload = s_lib_unload;
  ferry__drv.cuLibraryGetKernel = s_lib_kernel;
  ferry__drv.cuKernelGetFunction = s_kernel_fn;
  ferry__drv.cuFuncSetAttribute = s_fn_set;
  ferry__drv.cuFuncGetAttribute = s_fn_get;
  ferry__drv.cuStreamBeginCapture = s_begin;
  ferry__drv.cuStreamEndCapture = s_end;
  ferry__drv.cuStreamGetCaptureInfo = s_capinfo;
  ferry__drv.cuGraphNodeGetType = s_node_type;
  ferry__drv.cuGraphInstantiateWithFlags = s_instantiate;
  ferry__drv.cuGraphLaunch = s_graph_launch;
  ferry__drv.cuGraphExecKernelNodeSetParams = s_exec_set;
  ferry__drv.cuGraphDestroy = s_graph_destroy;
  ferry__drv.cuGraphExecDestroy = s_exec_destroy;
  ferry__drv.cuTensorMapEncodeTiled = s_tmap;
  ferry__drv.cuOccupancyMaxActiveClusters = s_max_clusters;
  ferry__drv.cuLaunchKernel = s_launch;
  Py_RETURN_NONE;
}

static PyObject *ops_sim_compute(PyObject *self, PyObject *flag) {
  int on = PyObject_IsTrue(flag);
  if (on < 0) return NULL;
  int old = compute;
  compute = on;
  return PyBool_FromLong(old);
}

static PyObject *ops_sim_state(PyObject *self, PyObject *unused) {
  return Py_BuildValue("{sisisKs(III)sIsIsIsisisisO}", "launches", launches, "replays", replays, "last_stream",
                       (unsigned long long)(uintptr_t)last_stream, "last_grid", last.grid[0], last.grid[1],
                       last.grid[2], "last_block", last.block, "last_smem", last.smem, "last_kind", last.params.kind,
                       "live_libraries", live_libraries, "live_graphs", live_graphs, "live_execs", live_execs,
                       "capturing", capture_graph ? Py_True : Py_False);
}

/* Someone else's capture, through the same table ferry uses. */
static PyObject *ops_sim_capture(PyObject *self, PyObject *handle) {
  CUstream s = PyLong_AsVoidPtr(handle);
  if (PyErr_Occurred()) return NULL;
  if (ferry__drv.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL) != CUDA_SUCCESS) {
    PyErr_SetString(PyExc_RuntimeError, "_ops_sim_capture: a capture is already running");
    return NULL;
  }
  Py_RETURN_NONE;
}

static PyObject *ops_sim_capture_end(PyObject *self, PyObject *handle) {
  CUstream s = PyLong_AsVoidPtr(handle);
  CUgraph g;
  CUgraphExec e;
  if (PyErr_Occurred()) return NULL;
  if (ferry__drv.cuStreamEndCapture(s, &g) != CUDA_SUCCESS) {
    PyErr_SetString(PyExc_RuntimeError, "_ops_sim_capture_end: that stream is not capturing");
    return NULL;
  }
  CUresult r = ferry__drv.cuGraphInstantiateWithFlags(&e, g, 0);
  ferry__drv.cuGraphDestroy(g);
  if (r != CUDA_SUCCESS) return PyErr_NoMemory();
  return PyLong_FromVoidPtr(e);
}

static PyObject *ops_sim_replay(PyObject *self, PyObject *args) {
  PyObject *exec, *handle;
  if (!PyArg_ParseTuple(args, "OO:_ops_sim_replay", &exec, &handle)) return NULL;
  CUgraphExec e = PyLong_AsVoidPtr(exec);
  CUstream s = PyLong_AsVoidPtr(handle);
  if (PyErr_Occurred()) return NULL;
  ferry__drv.cuGraphLaunch(e, s);
  Py_RETURN_NONE;
}

static PyObject *ops_sim_exec_destroy(PyObject *self, PyObject *exec) {
  CUgraphExec e = PyLong_AsVoidPtr(exec);
  if (PyErr_Occurred()) return NULL;
  ferry__drv.cuGraphExecDestroy(e);
  Py_RETURN_NONE;
}

static PyMethodDef hooks[] = {
    {"_ops_sim_install", ops_sim_install, METH_NOARGS, NULL},
    {"_ops_sim_compute", ops_sim_compute, METH_O, NULL},
    {"_ops_sim_state", ops_sim_state, METH_NOARGS, NULL},
    {"_ops_sim_capture", ops_sim_capture, METH_O, NULL},
    {"_ops_sim_capture_end", ops_sim_capture_end, METH_O, NULL},
    {"_ops_sim_replay", ops_sim_replay, METH_VARARGS, NULL},
    {"_ops_sim_exec_destroy", ops_sim_exec_destroy, METH_O, NULL},
    {NULL, NULL, 0, NULL}};

int ferry_py_ops_testing_init(PyObject *module) { return PyModule_AddFunctions(module, hooks); }
