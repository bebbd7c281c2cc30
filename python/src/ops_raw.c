/* ops_raw.c — private, for ferry.bench.latency: the limit of a launch from Python, measured in the same process
 * and run as the Python figures. It times N raw cuLaunchKernel calls of exactly the launch ferry makes — the
 * same CUfunction (from the same loaded artifact, with its attributes), grid, block, shared memory and kernel
 * parameter — with the parameters built in advance, in a C loop: what no caller of any library can beat.
 *
 * Finding "exactly the launch ferry makes" through the public API only: one run of the artifact is captured on
 * the caller's stream into a throwaway graph, and the graph's one kernel node is read back
 * (cuGraphKernelNodeGetParams): function, grid, block, shared memory. The node's parameter bytes are compared
 * with a ferry_gemm_params built from the same arguments, so the raw loop launches what ferry launches or the
 * call fails. The driver entry points are resolved here with dlsym from the already-loaded libcuda (the library's
 * own table is private to it); the extension never links libcuda.
 */
#include "ops_py.h"

#include <cuda.h>
#include <dlfcn.h>
#include <string.h>
#include <time.h>

typedef CUresult (*begin_fn)(CUstream, CUstreamCaptureMode);
typedef CUresult (*end_fn)(CUstream, CUgraph *);
typedef CUresult (*nodes_fn)(CUgraph, CUgraphNode *, size_t *);
typedef CUresult (*type_fn)(CUgraphNode, CUgraphNodeType *);
typedef CUresult (*kparams_fn)(CUgraphNode, CUDA_KERNEL_NODE_PARAMS_v2 *);
typedef CUresult (*destroy_fn)(CUgraph);
typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              CUstream, void **, void **);
typedef CUresult (*sync_fn)(CUstream);

static struct {
  begin_fn begin;
  end_fn end;
  nodes_fn nodes;
  type_fn type;
  kparams_fn kparams;
  destroy_fn destroy;
  launch_fn launch;
  sync_fn sync;
} cu;

static int resolve(void) {
  if (cu.launch) return 0;
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!lib) lib = dlopen("libcuda.so.1", RTLD_NOW);
  if (!lib) {
    PyErr_Format(PyExc_RuntimeError, "raw launch timing: libcuda.so.1 cannot be opened: %s", dlerror());
    return -1;
  }
  static const char *names[] = {"cuStreamBeginCapture_v2", "cuStreamEndCapture", "cuGraphGetNodes",
                                "cuGraphNodeGetType", "cuGraphKernelNodeGetParams_v2", "cuGraphDestroy",
                                "cuLaunchKernel", "cuStreamSynchronize"};
  void *f[8];
  for (int i = 0; i < 8; i++)
    if (!(f[i] = dlsym(lib, names[i]))) {
      PyErr_Format(PyExc_RuntimeError, "raw launch timing: libcuda has no %s", names[i]);
      return -1;
    }
  cu.begin = (begin_fn)f[0], cu.end = (end_fn)f[1], cu.nodes = (nodes_fn)f[2], cu.type = (type_fn)f[3];
  cu.kparams = (kparams_fn)f[4], cu.destroy = (destroy_fn)f[5], cu.sync = (sync_fn)f[7];
  cu.launch = (launch_fn)f[6]; /* last: the "resolved" mark */
  return 0;
}

static int cu_check(CUresult r, const char *what) {
  if (r == CUDA_SUCCESS) return 0;
  PyErr_Format(ferry_py_FerryError, "raw launch timing: %s failed with CUresult %d", what, (int)r);
  return -1;
}

static void params_of(const ferry_gemm_args *a, ferry_gemm_params *k) {
  const ferry_gemm_problem *p = &a->problem;
  memset(k, 0, sizeof *k);
  k->a = a->a, k->b = a->b, k->out = a->out;
  k->lda = p->lda, k->ldb = p->ldb, k->ldc = p->ldc;
  k->batch_a = p->batch_a, k->batch_b = p->batch_b, k->batch_c = p->batch_c;
  k->m = p->m, k->n = p->n, k->k = p->k, k->l = p->l;
  k->alpha = a->alpha, k->beta = a->beta;
  k->kind = p->kind;
  k->bias = a->bias;
  k->scale_a = a->scale_a, k->scale_b = a->scale_b;
}

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

static ferry_py_sig raw_sig = {"_raw_launch_time", 5, 5, 5, {"artifact", "args", "stream", "iters", "warmup"}, {0}};

PyObject *ferry_py_ops_raw_launch_time(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  PyObject *a[5];
  if (ferry_py_ops_parse(&raw_sig, args, nargs, kwnames, a) < 0) return NULL;
  ferry_artifact *art;
  if (ferry_py_ops_artifact_arg(a[0], "_raw_launch_time", &art) < 0) return NULL;
  if (!art) {
    PyErr_SetString(PyExc_TypeError, "_raw_launch_time(): an artifact is needed");
    return NULL;
  }
  const ferry_op *op = ferry_artifact_op(art);
  if (!ferry_op_info_get(op)->builtin) {
    PyErr_SetString(PyExc_ValueError, "_raw_launch_time(): only ferry's own operators (kernel parameter "
                    "ferry_gemm_params) can be timed raw");
    return NULL;
  }
  PyObject *seq = PySequence_Fast(a[1], "_raw_launch_time(): args must be a sequence of GemmArguments");
  if (!seq) return NULL;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  long iters = PyLong_AsLong(a[3]), warmup = PyLong_AsLong(a[4]);
  void *stream = NULL;
  ferry_gemm_params *params = NULL;
  void **ptrs = NULL;
  CUgraph graph = NULL;
  PyObject *result = NULL;
  if (PyErr_Occurred()) goto done;
  if (n < 1 || iters < 1 || warmup < 0) {
    PyErr_Format(PyExc_ValueError, "_raw_launch_time(): needs at least one GemmArguments and iters >= 1, warmup >= 0 "
                 "(got %zd, %ld, %ld)", n, iters, warmup);
    goto done;
  }
  ferry_py_gemm_args *first = ferry_py_ops_args_check(PySequence_Fast_GET_ITEM(seq, 0), "_raw_launch_time");
  if (!first || ferry_py_ops_stream(a[2], first->api, first->args.problem.device, &stream) < 0) goto done;
  if (!stream || stream == (void *)(uintptr_t)1) {
    PyErr_SetString(PyExc_ValueError, "_raw_launch_time(): give a stream of your own (the launch is found by "
                    "capturing one run on it)");
    goto done;
  }
  if (resolve() < 0) goto done;
  params = PyMem_Calloc((size_t)n, sizeof *params);
  ptrs = PyMem_Calloc((size_t)n, sizeof *ptrs);
  if (!params || !ptrs) {
    PyErr_NoMemory();
    goto done;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    ferry_py_gemm_args *ga = ferry_py_ops_args_check(PySequence_Fast_GET_ITEM(seq, i), "_raw_launch_time");
    if (!ga) goto done;
    const ferry_gemm_problem *p = &ga->args.problem, *q = &first->args.problem;
    if (p->m != q->m || p->n != q->n || p->l != q->l || p->kind != q->kind) {
      PyErr_Format(PyExc_ValueError, "_raw_launch_time(): args[%zd] is another problem than args[0]", i);
      goto done;
    }
    params_of(&ga->args, &params[i]);
    ptrs[i] = &params[i];
  }

  /* The launch ferry makes, read back from a capture of one run. */
  if (cu_check(cu.begin((CUstream)stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "cuStreamBeginCapture")) goto done;
  ferry_status st = ferry_op_run(op, &first->args, stream, art, FERRY_RUN_ASSUME_SUPPORTED);
  CUresult ended = cu.end((CUstream)stream, &graph);
  if (st != FERRY_OK) {
    ferry_py_raise(st);
    goto done;
  }
  if (cu_check(ended, "cuStreamEndCapture")) goto done;
  CUgraphNode node;
  size_t count = 1;
  CUgraphNodeType type;
  CUDA_KERNEL_NODE_PARAMS_v2 kp;
  memset(&kp, 0, sizeof kp);
  if (cu_check(cu.nodes(graph, NULL, &count), "cuGraphGetNodes")) goto done;
  if (count != 1) {
    PyErr_Format(PyExc_RuntimeError, "_raw_launch_time(): one run captured %zu graph nodes, expected one", count);
    goto done;
  }
  if (cu_check(cu.nodes(graph, &node, &count), "cuGraphGetNodes") || cu_check(cu.type(node, &type), "cuGraphNodeGetType"))
    goto done;
  if (type != CU_GRAPH_NODE_TYPE_KERNEL || cu_check(cu.kparams(node, &kp), "cuGraphKernelNodeGetParams")) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "_raw_launch_time(): the captured node is no kernel");
    goto done;
  }
  if (!kp.kernelParams || memcmp(kp.kernelParams[0], &params[0], sizeof params[0]) != 0) {
    PyErr_SetString(PyExc_RuntimeError, "_raw_launch_time(): the captured kernel parameter is not the "
                    "ferry_gemm_params of args[0]; the raw loop would not launch what ferry launches");
    goto done;
  }
  CUfunction fn = kp.func ? kp.func : (CUfunction)kp.kern; /* a context-less CUkernel launches as a CUfunction */

  double host = 0, e2e = 0;
  for (int pass = 0; pass < 2; pass++) {
    long count_pass = pass == 0 ? warmup : iters;
    if (cu_check(cu.sync((CUstream)stream), "cuStreamSynchronize")) goto done;
    double t0 = now_us();
    for (long i = 0; i < count_pass; i++) {
      CUresult r = cu.launch(fn, kp.gridDimX, kp.gridDimY, kp.gridDimZ, kp.blockDimX, kp.blockDimY, kp.blockDimZ,
                             kp.sharedMemBytes, (CUstream)stream, &ptrs[i % n], NULL);
      if (__builtin_expect(r != CUDA_SUCCESS, 0) && cu_check(r, "cuLaunchKernel")) goto done;
    }
    double t1 = now_us();
    if (cu_check(cu.sync((CUstream)stream), "cuStreamSynchronize")) goto done;
    double t2 = now_us();
    if (pass == 1) host = (t1 - t0) / iters, e2e = (t2 - t0) / iters;
  }
  result = Py_BuildValue("(dd{s(III)s(III)sIsK})", host, e2e, "grid", kp.gridDimX, kp.gridDimY, kp.gridDimZ,
                         "block", kp.blockDimX, kp.blockDimY, kp.blockDimZ, "smem", kp.sharedMemBytes, "function",
                         (unsigned long long)(uintptr_t)fn);
done:
  if (graph) (void)cu.destroy(graph);
  PyMem_Free(params);
  PyMem_Free(ptrs);
  Py_DECREF(seq);
  return result;
}
