/* ops_py.h — private: what the files of ferry.ops (the operator half of the extension ferry._ferry) share.
 *
 * ferry.ops puts the operator runtime of ferry/ops.h (GEMM arguments, discovery, supports, compile once, run, graphs)
 * in Python with the CUTLASS Operator API's names. The hot calls — GemmArguments(...), op.run(...), a launcher's
 * call — are vectorcalls that read tensors through the framework's DLPack exchange API (torch) and go straight to
 * the C library: no Python-level attribute access, no allocation besides the result object, no string work unless
 * they fail.
 *
 * Files, one job each:
 *   ops_module.c    the submodule _ferry._ops (get_operators, target_sm, device_supports, caches), keyword parsing
 *                   shared by the hot calls, type registration
 *   ops_args.c      ferry.ops.GemmArguments: operands read once, validated by ferry_gemm_args_init
 *   ops_stream.c    the stream of a run: None -> the framework's current work stream; objects -> handles
 *   ops_operator.c  ferry.ops.Operator (metadata, supports, compile, run, launcher) and ferry.ops.Status
 *   ops_artifact.c  ferry.ops.CompiledArtifact (save / load)
 *   ops_launcher.c  ferry.ops.Launcher: the fast call form, launcher(A, B, out, stream=None)
 *   ops_graph.c     ferry.ops.Graph: ferry's own capture / replay / in-place update
 *   ops_raw.c       private, for the latency benchmark: raw cuLaunchKernel of an artifact's kernel, timed in C
 *                   (FERRY_PYTHON_TEST_HOOKS only: it resolves libcuda's entries itself, which a wheel must not)
 *   ops_testing.c   private test hooks (FERRY_PYTHON_TEST_HOOKS only): the operator entry points of the simulated
 *                   driver, GEMM launches computed on the CPU
 *
 * Naming: ferry_py_ops_ for functions shared between these files, static for the rest. The GIL is held in every
 * function unless its comment says otherwise.
 */
#ifndef FERRY_PY_OPS_H
#define FERRY_PY_OPS_H

#include "ferry_py.h"

#include <ferry/ops.h>

/* src/ops/target.c (in ferry_static): "sm_90", "sm_90a", "compute_90", "90", "9.0", "10.0" -> 90 or 100; 0 when
 * unreadable. */
int ferry__parse_arch(const char *text);

/* ---- ops_module.c: keyword parsing for the hot calls -------------------------------------------------------- */

/* A call signature: `names` in positional order; the first `required` are required, the first `positional` may be
 * given by position, all by keyword. The names are interned on first use so that keywords from compiled call
 * sites match by pointer. */
typedef struct ferry_py_sig {
  const char *fn;          /* for messages: "Operator.run" */
  int n, required, positional;
  const char *names[10];
  PyObject *interned[10];
} ferry_py_sig;

/* Fills out[0..n) (borrowed; NULL for those not given) from a vectorcall. Returns 0 or -1 with TypeError set. */
int ferry_py_ops_parse(ferry_py_sig *sig, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                       PyObject **out);

/* 1 for a true value (Py_True fast), 0 false, -1 error. NULL counts as false. */
static inline int ferry_py_ops_truth(PyObject *v) {
  if (!v || v == Py_False || v == Py_None) return 0;
  if (v == Py_True) return 1;
  return PyObject_IsTrue(v);
}

/* A target such as 90, "90", "sm_90", "sm_90a" or "9.0" as major*10+minor. Returns 0 or -1 with an exception. */
int ferry_py_ops_parse_sm(PyObject *obj, const char *what, int *out);

/* ---- ops_args.c: GemmArguments ------------------------------------------------------------------------------ */

/* The layout of one operand as it was read: what a launcher compares each call's tensor with. */
typedef struct ferry_py_operand {
  PyTypeObject *type;            /* the Python type it was read from (the operand object keeps it alive) */
  const DLPackExchangeAPI *api;  /* the framework's exchange table, NULL on the __dlpack__ path */
  bool torch;                    /* a torch tensor: its negative bit is refused (math_bits.c) */
  ferry_dtype dtype;
  ferry_device device;
  int32_t ndim;                  /* 2 or 3 once validated */
  int64_t shape[3], strides[3];  /* strides in elements (filled in when the producer gave none) */
} ferry_py_operand;

typedef struct ferry_py_gemm_args {
  PyObject_HEAD
  ferry_gemm_args args;          /* validated once; the runs read it */
  PyObject *operands[6];         /* A, B, out, then bias, scale_a, scale_b or NULL (strong): their memory must
                                    outlive the runs reading it */
  PyObject *accumulator;         /* accumulator_type as given (strong) */
  PyObject *activation;          /* activation as given, or NULL (strong) */
  ferry_py_leaf leaves[6];       /* __dlpack__ exports, held until the arguments die (their deleters run then) */
  ferry_py_operand layout[6];
  const DLPackExchangeAPI *api;  /* the first operand's framework with an exchange API: its current work stream is
                                    a run's default; NULL when none came through one */
} ferry_py_gemm_args;

extern PyTypeObject ferry_py_GemmArguments_Type;

static inline int ferry_py_is_gemm_args(PyObject *o) {
  return Py_TYPE(o) == &ferry_py_GemmArguments_Type || PyObject_TypeCheck(o, &ferry_py_GemmArguments_Type);
}

/* `obj` as GemmArguments, or NULL with TypeError naming `fn` and what it got. Borrowed. */
ferry_py_gemm_args *ferry_py_ops_args_check(PyObject *obj, const char *fn);

/* Reads one operand: its layout (copied) and a ferry_tensor whose shape/strides point into `layout`. `leaf`
 * receives a __dlpack__ export to release with ferry_py_leaf_release_input. `name` ("A", "B", "out") and `fn`
 * are for messages. Returns 0 or -1 with an exception set. */
int ferry_py_ops_read(PyObject *obj, const char *fn, const char *name, PyObject *cuda_stream, ferry_tensor *tensor,
                      ferry_py_operand *layout, ferry_py_leaf *leaf);

/* Refuses, with ValueError naming `fn` and `name`, an operand ferry writes (out) whose DLPack 1.x export is flagged
 * read-only (DLPACK_FLAG_BITMASK_READ_ONLY: the producer forbids writes). Returns 0 or -1. */
int ferry_py_ops_refuse_read_only(const ferry_py_leaf *leaf, PyObject *obj, const char *fn, const char *name);

/* "float16", "bfloat16", "float32" or the DLPack code and bits, for messages. */
const char *ferry_py_ops_dtype_name(ferry_dtype d, char *buf, size_t size);

/* "cuda:0", "cpu", ... for messages. */
const char *ferry_py_ops_device_name(ferry_device d, char *buf, size_t size);

/* "(128, 64)" into buf. */
const char *ferry_py_ops_dims(const int64_t *v, int n, char *buf, size_t size);

/* ---- ops_stream.c ------------------------------------------------------------------------------------------- */

/* The CUstream of a run on `device`. `obj` None (or NULL): the current work stream of `api`'s framework (torch:
 * torch.cuda.current_stream(device), so a run inside torch.cuda.graph lands on the capturing stream), or the
 * legacy default stream (NULL) when api is NULL. Otherwise a stream object or handle as
 * ferry_py_stream_from_object reads it, remembered for the last object given (a stream object's handle does not
 * change). A stream that says it is on another device raises ValueError. Returns 0 or -1 with an exception set. */
int ferry_py_ops_stream(PyObject *obj, const DLPackExchangeAPI *api, int device, void **out);

void ferry_py_ops_stream_clear(void);

/* ---- ops_operator.c ----------------------------------------------------------------------------------------- */

typedef struct ferry_py_operator {
  PyObject_HEAD
  const ferry_op *op;            /* registered for the life of the process */
  PyObject *metadata;            /* OperatorMetadata, built on first use */
  uint32_t warmed[16];           /* kinds (epilogue included) + 1 whose memo entry a run without artifact found
                                    or made; 0 free. Past 16 kinds the oldest is forgotten (warmed again) */
  uint32_t warmed_next;          /* the slot the next kind takes */
} ferry_py_operator;

extern PyTypeObject ferry_py_Operator_Type;
extern PyTypeObject ferry_py_Status_Type;

/* The one Operator object of `op` (a new reference; objects are cached, so identity holds), NULL on error. */
PyObject *ferry_py_ops_operator(const ferry_op *op);

/* A new Status: ok when `error` is NULL. */
PyObject *ferry_py_ops_status(const char *error);

/* After clear_memo(): every Operator forgets which kinds it found in the memo. */
void ferry_py_ops_operators_forget_memo(void);

/* The types of Operator.metadata, registered by ops_module.c. */
int ferry_py_ops_metadata_init(PyObject *ops_module);

/* Compiles op for args on the device's own capability with the GIL released, so that a run without an artifact
 * finds the memo filled and never compiles while holding the GIL. Returns 0 or -1 with an exception set. */
int ferry_py_ops_warm(ferry_py_operator *op, const ferry_gemm_args *args);

/* ---- ops_artifact.c ----------------------------------------------------------------------------------------- */

typedef struct ferry_py_artifact {
  PyObject_HEAD
  ferry_artifact *art;           /* one reference */
} ferry_py_artifact;

extern PyTypeObject ferry_py_CompiledArtifact_Type;

/* Wraps `art`, taking over the caller's reference (released here on failure). New reference or NULL. */
PyObject *ferry_py_ops_artifact_new(ferry_artifact *art);

/* obj None/NULL -> *out NULL; a CompiledArtifact -> its artifact (borrowed); else TypeError naming fn. */
int ferry_py_ops_artifact_arg(PyObject *obj, const char *fn, ferry_artifact **out);

/* ---- ops_launcher.c, ops_graph.c, ops_raw.c ---------------------------------------------------------------- */

extern PyTypeObject ferry_py_Launcher_Type;
extern PyTypeObject ferry_py_Graph_Type;

/* Operator.launcher(args, compiled_artifact=None, *, assume_supported_args=False). */
PyObject *ferry_py_ops_launcher_new(ferry_py_operator *op, PyObject *const *args, Py_ssize_t nargs,
                                    PyObject *kwnames);

#ifdef FERRY_PYTHON_TEST_HOOKS
/* _ops._raw_launch_time(artifact, args_list, stream, iters, warmup) -> (host_us, e2e_us, node) */
PyObject *ferry_py_ops_raw_launch_time(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
#endif

#ifdef FERRY_PYTHON_TEST_HOOKS
int ferry_py_ops_testing_init(PyObject *module);
#endif

#endif /* FERRY_PY_OPS_H */
