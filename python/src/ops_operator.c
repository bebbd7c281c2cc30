/* ops_operator.c — ferry.ops.Operator (one registered ferry_op: its metadata, supports, compile, run and the fast
 * launcher) and ferry.ops.Status (the answer of a support check: true, or false with the reason).
 *
 * Operator objects are made once per ferry_op and cached for the process (operators are never unregistered), so
 * get_operators returns the same objects and `is` works. op.run is the notebook's call: a vectorcall that parses
 * its keywords by pointer, resolves the stream (ops_stream.c) and calls ferry_op_run. A run without an artifact
 * uses the library's memo; the first such run of a problem kind compiles (or reads the disk cache) with the GIL
 * released, so a run never holds the GIL through NVRTC.
 */
#include "ops_py.h"

#include <string.h>
#include <structmember.h>

/* ---- Status -------------------------------------------------------------------------------------------------- */

typedef struct {
  PyObject_HEAD
  PyObject *error; /* None when ok, else the reason (str) */
} status_object;

PyObject *ferry_py_ops_status(const char *error) {
  status_object *s = PyObject_New(status_object, &ferry_py_Status_Type);
  if (!s) return NULL;
  s->error = error ? PyUnicode_FromString(error) : Py_NewRef(Py_None);
  if (!s->error) {
    Py_DECREF(s);
    return NULL;
  }
  return (PyObject *)s;
}

static void status_dealloc(status_object *self) {
  Py_XDECREF(self->error);
  PyObject_Free(self);
}

static int status_bool(status_object *self) { return self->error == Py_None; }

static PyObject *status_repr(status_object *self) {
  if (self->error == Py_None) return PyUnicode_FromString("ferry.ops.Status(ok)");
  return PyUnicode_FromFormat("ferry.ops.Status(error=%R)", self->error);
}

static PyNumberMethods status_number = {.nb_bool = (inquiry)status_bool};

static PyMemberDef status_members[] = {
    {"error", T_OBJECT, offsetof(status_object, error), READONLY,
     "None when supported; else the reason, naming the values (\"operand A: expected bf16, got fp16\")."},
    {NULL, 0, 0, 0, NULL}};

PyTypeObject ferry_py_Status_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ferry.ops.Status",
    .tp_basicsize = sizeof(status_object),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The answer of a support check: true when supported; false with .error, the reason (as CUTLASS's).",
    .tp_dealloc = (destructor)status_dealloc,
    .tp_repr = (reprfunc)status_repr,
    .tp_as_number = &status_number,
    .tp_members = status_members,
};

/* ---- metadata ------------------------------------------------------------------------------------------------ */

static PyTypeObject design_type, constraints_type, metadata_type;

static PyStructSequence_Field design_fields[] = {
    {"instruction", "\"mma.sync.m16n8k16\", \"simt.fma\", or what a registered operator declares"},
    {"tile_m", "output tile rows per thread block"},
    {"tile_n", "output tile columns per thread block"},
    {"tile_k", "k per pipeline stage"},
    {"stages", "shared-memory pipeline depth"},
    {"threads", "threads per block"},
    {"smem_bytes", "dynamic shared memory per block (the largest over the kinds it compiles)"},
    {NULL, NULL}};
static PyStructSequence_Desc design_desc = {"ferry.ops.Design", "An operator's kernel design.", design_fields, 7};

static PyStructSequence_Field constraints_fields[] = {
    {"a_types", "accepted dtypes of A (\"fp16\", \"bf16\", \"fp32\", \"e4m3\", \"e5m2\", \"int8\")"},
    {"b_types", "accepted dtypes of B"},
    {"out_types", "accepted dtypes of out"},
    {"accumulator_types", "accepted accumulator types"},
    {"a_majors", "accepted majors of A (\"row\", \"column\")"},
    {"b_majors", "accepted majors of B"},
    {"out_majors", "accepted majors of out"},
    {"a_align", "required alignment of A in bytes (address, leading dimension, batch stride)"},
    {"b_align", "required alignment of B in bytes"},
    {"out_align", "required alignment of out in bytes"},
    {"div_m", "m must be a multiple of this"},
    {"div_n", "n must be a multiple of this"},
    {"div_k", "k must be a multiple of this"},
    {"min_sm", "the oldest target it compiles for (80 = sm_80)"},
    {"fuses_epilogue", "True when it is given problems with a bias or an activation"},
    {NULL, NULL}};
static PyStructSequence_Desc constraints_desc = {"ferry.ops.Constraints", "What an operator accepts.",
                                                 constraints_fields, 15};

static PyStructSequence_Field metadata_fields[] = {
    {"name", "the operator's unique name"},
    {"design", "a Design: instruction, tile, stages, threads, shared memory"},
    {"constraints", "a Constraints: types, majors, alignment, divisibility, min_sm"},
    {"builtin", "True for ferry's own operators, False for registered ones"},
    {NULL, NULL}};
static PyStructSequence_Desc metadata_desc = {
    "ferry.ops.OperatorMetadata", "What get_operators' metadata_filter is given, and Operator.metadata.",
    metadata_fields, 4};

int ferry_py_ops_metadata_init(PyObject *ops_module) {
  if (PyStructSequence_InitType2(&design_type, &design_desc) < 0 ||
      PyStructSequence_InitType2(&constraints_type, &constraints_desc) < 0 ||
      PyStructSequence_InitType2(&metadata_type, &metadata_desc) < 0)
    return -1;
  PyTypeObject *types[] = {&design_type, &constraints_type, &metadata_type};
  const char *names[] = {"Design", "Constraints", "OperatorMetadata"};
  for (int i = 0; i < 3; i++) {
    Py_INCREF(types[i]);
    if (PyModule_AddObject(ops_module, names[i], (PyObject *)types[i]) < 0) {
      Py_DECREF(types[i]);
      return -1;
    }
  }
  return 0;
}

static PyObject *scalar_names(uint32_t mask) {
  Py_ssize_t n = 0;
  for (int s = FERRY_SCALAR_F16; s <= FERRY_SCALAR_I32; s++) n += !!(mask & FERRY_SCALAR_BIT(s));
  PyObject *t = PyTuple_New(n);
  n = 0;
  for (int s = FERRY_SCALAR_F16; t && s <= FERRY_SCALAR_I32; s++) {
    if (!(mask & FERRY_SCALAR_BIT(s))) continue;
    PyObject *name = PyUnicode_FromString(ferry_scalar_name((ferry_scalar)s));
    if (!name) Py_CLEAR(t);
    else PyTuple_SET_ITEM(t, n++, name);
  }
  return t;
}

static PyObject *major_names(uint32_t mask) {
  int row = !!(mask & FERRY_MAJOR_BIT(FERRY_MAJOR_ROW)), col = !!(mask & FERRY_MAJOR_BIT(FERRY_MAJOR_COL));
  if (row && col) return Py_BuildValue("(ss)", "row", "column");
  if (row) return Py_BuildValue("(s)", "row");
  if (col) return Py_BuildValue("(s)", "column");
  return PyTuple_New(0);
}

/* Fills struct sequence `seq` from `items` (new references, NULL meaning failure). Returns seq or NULL. */
static PyObject *fill(PyObject *seq, PyObject **items, int n) {
  int ok = seq != NULL;
  for (int i = 0; i < n; i++) ok = ok && items[i];
  if (!ok) {
    for (int i = 0; i < n; i++) Py_XDECREF(items[i]);
    Py_XDECREF(seq);
    return NULL;
  }
  for (int i = 0; i < n; i++) PyStructSequence_SET_ITEM(seq, i, items[i]);
  return seq;
}

static PyObject *make_metadata(const ferry_op_info *in) {
  PyObject *d[7] = {PyUnicode_FromString(in->instruction ? in->instruction : ""), PyLong_FromLong(in->tile_m),
                    PyLong_FromLong(in->tile_n), PyLong_FromLong(in->tile_k), PyLong_FromLong(in->stages),
                    PyLong_FromLong(in->threads), PyLong_FromUnsignedLong(in->smem_bytes)};
  PyObject *design = fill(PyStructSequence_New(&design_type), d, 7);
  PyObject *c[15] = {scalar_names(in->a_types), scalar_names(in->b_types), scalar_names(in->out_types),
                     scalar_names(in->acc_types), major_names(in->a_majors), major_names(in->b_majors),
                     major_names(in->out_majors), PyLong_FromUnsignedLong(in->a_align),
                     PyLong_FromUnsignedLong(in->b_align), PyLong_FromUnsignedLong(in->out_align),
                     PyLong_FromUnsignedLong(in->div_m), PyLong_FromUnsignedLong(in->div_n),
                     PyLong_FromUnsignedLong(in->div_k), PyLong_FromLong(in->min_sm),
                     PyBool_FromLong(in->fuses_epilogue)};
  PyObject *constraints = fill(PyStructSequence_New(&constraints_type), c, 15);
  PyObject *m[4] = {PyUnicode_FromString(in->name), design, constraints, PyBool_FromLong(in->builtin)};
  return fill(PyStructSequence_New(&metadata_type), m, 4);
}

/* ---- the Operator objects ------------------------------------------------------------------------------------ */

static PyObject *operator_cache; /* dict: address of the ferry_op -> Operator */

PyObject *ferry_py_ops_operator(const ferry_op *op) {
  if (!operator_cache && !(operator_cache = PyDict_New())) return NULL;
  PyObject *key = PyLong_FromVoidPtr((void *)op);
  if (!key) return NULL;
  PyObject *obj = PyDict_GetItemWithError(operator_cache, key);
  if (obj || PyErr_Occurred()) {
    Py_DECREF(key);
    return obj ? Py_NewRef(obj) : NULL;
  }
  ferry_py_operator *self = PyObject_New(ferry_py_operator, &ferry_py_Operator_Type);
  if (self) {
    self->op = op;
    self->metadata = NULL;
    memset(self->warmed, 0, sizeof self->warmed);
    self->warmed_next = 0;
    if (PyDict_SetItem(operator_cache, key, (PyObject *)self) < 0) Py_CLEAR(self);
  }
  Py_DECREF(key);
  return (PyObject *)self;
}

void ferry_py_ops_operators_forget_memo(void) {
  Py_ssize_t pos = 0;
  PyObject *key, *value;
  while (operator_cache && PyDict_Next(operator_cache, &pos, &key, &value))
    memset(((ferry_py_operator *)value)->warmed, 0, sizeof ((ferry_py_operator *)value)->warmed);
}

static void operator_dealloc(ferry_py_operator *self) {
  Py_XDECREF(self->metadata);
  PyObject_Free(self);
}

static const ferry_op_info *info_of(ferry_py_operator *self) { return ferry_op_info_get(self->op); }

static PyObject *operator_repr(ferry_py_operator *self) {
  const ferry_op_info *in = info_of(self);
  return PyUnicode_FromFormat("<ferry.ops.Operator %s: %s, tile %dx%dx%d, %d stage%s, %d threads>", in->name,
                              in->instruction ? in->instruction : "?", (int)in->tile_m, (int)in->tile_n,
                              (int)in->tile_k, (int)in->stages, in->stages == 1 ? "" : "s", (int)in->threads);
}

static PyObject *get_name(ferry_py_operator *self, void *unused) { return PyUnicode_FromString(info_of(self)->name); }

static PyObject *get_metadata(ferry_py_operator *self, void *unused) {
  if (!self->metadata && !(self->metadata = make_metadata(info_of(self)))) return NULL;
  return Py_NewRef(self->metadata);
}

static PyObject *get_field(ferry_py_operator *self, void *index) {
  PyObject *md = get_metadata(self, NULL);
  if (!md) return NULL;
  PyObject *v = Py_NewRef(PyStructSequence_GET_ITEM(md, (Py_ssize_t)(intptr_t)index));
  Py_DECREF(md);
  return v;
}

/* ---- supports, compile --------------------------------------------------------------------------------------- */

PyDoc_STRVAR(supports_doc,
             "supports($self, args, /)\n--\n\n"
             "Whether this operator supports `args` (types, majors, alignment, divisibility, limits, and a\n"
             "registered operator's own check): a Status, true when it does, else false with .error the first\n"
             "reason (\"operand A: expected bf16, got fp16\"). A handful of integer compares in C. Targets are\n"
             "checked by get_operators and compile.");

static PyObject *op_supports(ferry_py_operator *self, PyObject *arg) {
  ferry_py_gemm_args *ga = ferry_py_ops_args_check(arg, "Operator.supports");
  if (!ga) return NULL;
  char reason[320];
  ferry_status st = ferry_op_supports(self->op, &ga->args, reason, sizeof reason);
  if (st == FERRY_OK) return ferry_py_ops_status(NULL);
  if (st == FERRY_UNSUPPORTED) return ferry_py_ops_status(reason);
  return ferry_py_raise(st);
}

PyDoc_STRVAR(compile_doc,
             "compile($self, /, args, target_sm=None)\n--\n\n"
             "This operator compiled for `args`'s problem kind (operand types and majors, and the fused epilogue:\n"
             "the artifact serves every problem of that kind, whatever the sizes) and `target_sm` (None:\n"
             "target_sm(), i.e. FERRY_ARCH or the operands' device; or 90, \"sm_90\", ...). Answered from the\n"
             "in-memory memo, else from the verified disk cache ($XDG_CACHE_HOME/ferry), else by NVRTC (then\n"
             "stored in both); the GIL is released meanwhile. Needs NVRTC, not a GPU. Returns a CompiledArtifact\n"
             "(it holds the cubin and, when the device is there and of the target's capability, the loaded\n"
             "kernel). Compile outside graph captures.\n\n"
             "Raises ferry.FerryError with status UNSUPPORTED (the op does not support args, or the target is older\n"
             "than its min_sm or unknown to NVRTC), NO_COMPILER (NVRTC missing) or COMPILE_FAILED (the log in the\n"
             "message). CUTLASS: Operator.compile (1.47 s there).");

static ferry_py_sig compile_sig = {"Operator.compile", 2, 1, 2, {"args", "target_sm"}, {0}};

static PyObject *op_compile(ferry_py_operator *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  PyObject *a[2];
  if (ferry_py_ops_parse(&compile_sig, args, nargs, kwnames, a) < 0) return NULL;
  ferry_py_gemm_args *ga = ferry_py_ops_args_check(a[0], "Operator.compile");
  if (!ga) return NULL;
  int sm = 0;
  if (a[1] && a[1] != Py_None && ferry_py_ops_parse_sm(a[1], "target_sm", &sm) < 0) return NULL;
  ferry_gemm_args copy = ga->args; /* another thread may set alpha while the GIL is released */
  ferry_artifact *art = NULL;
  ferry_status st;
  Py_BEGIN_ALLOW_THREADS st = sm ? ferry_op_compile_for(self->op, &copy, sm, &art) : ferry_op_compile(self->op, &copy, &art);
  Py_END_ALLOW_THREADS if (st != FERRY_OK) return ferry_py_raise(st);
  return ferry_py_ops_artifact_new(art);
}

/* ---- run ----------------------------------------------------------------------------------------------------- */

#define MAX_DEVICES 64
static int device_sm[MAX_DEVICES]; /* capability of each device, read once */

int ferry_py_ops_warm(ferry_py_operator *self, const ferry_gemm_args *args) {
  const ferry_gemm_problem *p = &args->problem;
  const uint32_t slots = sizeof self->warmed / sizeof self->warmed[0];
  for (uint32_t i = 0; i < slots; i++) /* every kind bit: a fused epilogue is another kernel */
    if (self->warmed[i] == p->kind + 1) return 0;
  int dev = p->device;
  if (dev >= 0 && dev < MAX_DEVICES && !device_sm[dev]) {
    ferry_device_info info;
    ferry_status st = ferry_device_info_get(dev, &info);
    if (st != FERRY_OK) {
      ferry_py_raise(st);
      return -1;
    }
    device_sm[dev] = info.cc_major * 10 + info.cc_minor;
  }
  if (dev >= 0 && dev < MAX_DEVICES) {
    /* What ferry_op_run would compile on first need (its memo is keyed by the device's own capability). */
    ferry_gemm_args copy = *args;
    ferry_artifact *art = NULL;
    ferry_status st;
    Py_BEGIN_ALLOW_THREADS st = ferry_op_compile_for(self->op, &copy, device_sm[dev], &art);
    Py_END_ALLOW_THREADS if (st != FERRY_OK) {
      ferry_py_raise(st);
      return -1;
    }
    ferry_artifact_release(art); /* the memo keeps its own reference */
  }
  self->warmed[self->warmed_next] = p->kind + 1;
  self->warmed_next = (self->warmed_next + 1) % slots;
  return 0;
}

PyDoc_STRVAR(run_doc,
             "run($self, /, args, stream=None, compiled_artifact=None, assume_supported_args=False)\n--\n\n"
             "Launches out = activation(alpha * A @ B + beta * out + bias) for `args` (a GemmArguments) and returns\n"
             "None at once (the kernel runs asynchronously on `stream`).\n\n"
             "stream: None — the current stream of the operands' framework, asked at every call through its DLPack\n"
             "  exchange API (torch.cuda.current_stream(): inside torch.cuda.graph(...) that is the capturing\n"
             "  stream), or the legacy default stream when no operand came from such a framework (CuPy, JAX:\n"
             "  pass their stream explicitly); or a torch.cuda.Stream, a CuPy stream, an object with\n"
             "  __cuda_stream__, or an int CUstream. It must be of the operands' device (ValueError).\n"
             "compiled_artifact: from compile(); None uses the library's memo (compiled once per problem kind on\n"
             "  first need, with the GIL released; never per call).\n"
             "assume_supported_args: True skips the support check (you vouch that this operator supports args and\n"
             "  that the artifact is of args' kind): the call is then a parameter copy and one cuLaunchKernel.\n\n"
             "Works under stream capture (torch.cuda.graph, or ferry.ops.Graph); compile before capturing. The\n"
             "caller keeps args (and so the tensors) alive until the kernel has run, as with any CUDA launch.\n"
             "Raises ferry.FerryError (status UNSUPPORTED, with the reason) when the check fails; ValueError for an\n"
             "artifact of another operator, kind or capability; RuntimeError without a driver or device;\n"
             "ferry.FerryError for driver errors. For the lowest overhead per call see launcher().");

static ferry_py_sig run_sig = {"Operator.run", 4, 1, 4,
                               {"args", "stream", "compiled_artifact", "assume_supported_args"}, {0}};

static PyObject *op_run(ferry_py_operator *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  PyObject *a[4];
  if (ferry_py_ops_parse(&run_sig, args, nargs, kwnames, a) < 0) return NULL;
  ferry_py_gemm_args *ga = ferry_py_ops_args_check(a[0], "Operator.run");
  if (!ga) return NULL;
  ferry_artifact *art;
  if (ferry_py_ops_artifact_arg(a[2], "Operator.run", &art) < 0) return NULL;
  int assume = ferry_py_ops_truth(a[3]);
  if (assume < 0) return NULL;
  void *stream;
  if (ferry_py_ops_stream(a[1], ga->api, ga->args.problem.device, &stream) < 0) return NULL;
  if (!art && ferry_py_ops_warm(self, &ga->args) < 0) return NULL;
  ferry_status st = ferry_op_run(self->op, &ga->args, stream, art, assume ? FERRY_RUN_ASSUME_SUPPORTED : 0);
  if (__builtin_expect(st != FERRY_OK, 0)) return ferry_py_raise(st);
  Py_RETURN_NONE;
}

PyDoc_STRVAR(launcher_doc,
             "launcher($self, /, args, compiled_artifact=None, *, assume_supported_args=False)\n--\n\n"
             "The fast call form: a Launcher bound to this operator, an artifact (compiled now from args when None)\n"
             "and args' layout (shapes, strides, dtypes, device, alpha, beta). Call it as\n"
             "launcher(A, B, out, stream=None) with tensors of that layout: it reads their data pointers through\n"
             "the exchange API, checks them against the bound layout and alignment, and launches. See\n"
             "help(ferry.ops.Launcher).");

static PyObject *op_launcher(ferry_py_operator *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  return ferry_py_ops_launcher_new(self, args, nargs, kwnames);
}

static PyMethodDef operator_methods[] = {
    {"supports", (PyCFunction)op_supports, METH_O, supports_doc},
    {"compile", (PyCFunction)(void (*)(void))op_compile, METH_FASTCALL | METH_KEYWORDS, compile_doc},
    {"run", (PyCFunction)(void (*)(void))op_run, METH_FASTCALL | METH_KEYWORDS, run_doc},
    {"launcher", (PyCFunction)(void (*)(void))op_launcher, METH_FASTCALL | METH_KEYWORDS, launcher_doc},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef operator_getset[] = {
    {"name", (getter)get_name, NULL, "The operator's unique name, e.g. \"gemm_mma_f16_128x128x32_s4\".", NULL},
    {"metadata", (getter)get_metadata, NULL, "OperatorMetadata(name, design, constraints, builtin).", NULL},
    {"design", (getter)get_field, NULL, "Design(instruction, tile_m, tile_n, tile_k, stages, threads, smem_bytes).",
     (void *)1},
    {"constraints", (getter)get_field, NULL,
     "Constraints(a_types, b_types, out_types, accumulator_types, a_majors, b_majors, out_majors, a_align, "
     "b_align, out_align, div_m, div_n, div_k, min_sm, fuses_epilogue).", (void *)2},
    {NULL, NULL, NULL, NULL, NULL}};

PyDoc_STRVAR(operator_doc,
             "A registered GEMM operator: one kernel design (tile, pipeline, instruction) with its operand\n"
             "constraints. Get them from get_operators(args) / operators() / get_operator(name); they live for the\n"
             "process and are never copied. Methods: supports, compile, run, launcher.");

PyTypeObject ferry_py_Operator_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ferry.ops.Operator",
    .tp_basicsize = sizeof(ferry_py_operator),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = operator_doc,
    .tp_dealloc = (destructor)operator_dealloc,
    .tp_repr = (reprfunc)operator_repr,
    .tp_methods = operator_methods,
    .tp_getset = operator_getset,
};
