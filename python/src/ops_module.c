/* ops_module.c — the submodule _ferry._ops behind ferry.ops: discovery (get_operators), the compile target
 * (target_sm, device_supports), the compile caches, the keyword parsing every hot call shares, and the
 * registration of ferry.ops's types.
 *
 * The functions here are not hot; they mirror the C API one to one and raise through the one status -> exception
 * table (errors.c).
 */
#include "ops_py.h"

#include <string.h>

/* ---- keyword parsing ---------------------------------------------------------------------------------------- */

static int intern_names(ferry_py_sig *sig) {
  for (int i = 0; i < sig->n; i++) {
    if (sig->interned[i]) continue;
    if (!(sig->interned[i] = PyUnicode_InternFromString(sig->names[i]))) return -1;
  }
  return 0;
}

int ferry_py_ops_parse(ferry_py_sig *sig, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                       PyObject **out) {
  if (__builtin_expect(!sig->interned[sig->n - 1], 0) && intern_names(sig) < 0) return -1;
  if (nargs > sig->positional) {
    PyErr_Format(PyExc_TypeError, "%s() takes at most %d positional argument%s (%zd given)", sig->fn,
                 sig->positional, sig->positional == 1 ? "" : "s", nargs);
    return -1;
  }
  for (int i = 0; i < sig->n; i++) out[i] = i < nargs ? args[i] : NULL;
  Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  for (Py_ssize_t k = 0; k < nkw; k++) {
    PyObject *key = PyTuple_GET_ITEM(kwnames, k);
    int j = 0;
    while (j < sig->n && sig->interned[j] != key) j++;
    if (j == sig->n) /* a keyword that is not interned (built at run time): compare the text */
      for (j = 0; j < sig->n && PyUnicode_Compare(sig->interned[j], key) != 0; j++) {
      }
    if (PyErr_Occurred()) return -1;
    if (j == sig->n) {
      PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument %R", sig->fn, key);
      return -1;
    }
    if (out[j]) {
      PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'", sig->fn, sig->names[j]);
      return -1;
    }
    out[j] = args[nargs + k];
  }
  for (int i = 0; i < sig->required; i++)
    if (!out[i]) {
      PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s'", sig->fn, sig->names[i]);
      return -1;
    }
  return 0;
}

/* ---- targets ------------------------------------------------------------------------------------------------- */

int ferry_py_ops_parse_sm(PyObject *obj, const char *what, int *out) {
  int sm = 0;
  if (PyLong_Check(obj) && !PyBool_Check(obj)) {
    long v = PyLong_AsLong(obj);
    if (v == -1 && PyErr_Occurred()) PyErr_Clear();
    else if (v >= 10 && v <= 999) sm = (int)v;
  } else if (PyUnicode_Check(obj)) {
    const char *s = PyUnicode_AsUTF8(obj);
    if (!s) return -1;
    sm = ferry__parse_arch(s); /* the forms FERRY_ARCH takes */
  } else {
    PyErr_Format(PyExc_TypeError, "%s must be an int such as 90 or a str such as \"90\" or \"sm_90\"; got %R (%s)",
                 what, obj, Py_TYPE(obj)->tp_name);
    return -1;
  }
  if (!sm) {
    PyErr_Format(PyExc_ValueError, "%s=%R is not a target: write it as 90, \"90\", \"sm_90\" or \"9.0\"", what, obj);
    return -1;
  }
  *out = sm;
  return 0;
}

PyDoc_STRVAR(target_sm_doc,
             "target_sm()\n--\n\n"
             "The compute capability ferry compiles for, as major*10+minor (90 for an H200): the FERRY_ARCH\n"
             "environment variable when set (\"sm_90\", \"90\", \"9.0\"; read at every call), else the capability of\n"
             "the default device (LOCAL_RANK, else cuda:0). CUTLASS: ops.utils.device.device_or_env_target_sm().\n\n"
             "Raises ValueError for an unreadable FERRY_ARCH, RuntimeError without a driver or device (set\n"
             "FERRY_ARCH to compile on a machine without a GPU).");

static PyObject *target_sm(PyObject *self, PyObject *unused) {
  int sm = 0;
  ferry_status st = ferry_target_sm(-1, &sm);
  if (st != FERRY_OK) return ferry_py_raise(st);
  return PyLong_FromLong(sm);
}

PyDoc_STRVAR(device_supports_doc,
             "device_supports(min_sm)\n--\n\n"
             "Whether the target (target_sm(): FERRY_ARCH, else the default device) is at least `min_sm` (90,\n"
             "\"90\", \"sm_90\", \"9.0\"). Returns a Status: true when it is; else false, with .error saying why\n"
             "(\"this needs sm_90 or newer; cuda:0 (NVIDIA T4) is sm_75\", or why there is no target). Never\n"
             "raises for a missing GPU. CUTLASS: ops.utils.device.device_or_env_supports(\"80\").");

static PyObject *device_supports(PyObject *self, PyObject *arg) {
  int sm;
  if (ferry_py_ops_parse_sm(arg, "min_sm", &sm) < 0) return NULL;
  char reason[320];
  ferry_status st = ferry_target_supports(sm, reason, sizeof reason);
  if (st == FERRY_OK) return ferry_py_ops_status(NULL);
  if (st == FERRY_UNSUPPORTED) return ferry_py_ops_status(reason);
  return ferry_py_raise(st);
}

/* ---- discovery ---------------------------------------------------------------------------------------------- */

PyDoc_STRVAR(get_operators_doc,
             "get_operators(args, target_sm=None, metadata_filter=None)\n--\n\n"
             "Every registered operator that supports `args` (a GemmArguments) on `target_sm` (None: target_sm(),\n"
             "which honours FERRY_ARCH; or 90, \"sm_90\", ...), best first for this problem: tensor-core designs\n"
             "before SIMT, then the tile that fills the chip with the fewest idle blocks. `metadata_filter`, when\n"
             "given, is called with each operator's metadata (an OperatorMetadata) and keeps those it returns a\n"
             "true value for. Returns a list of Operator (empty when none fits: not an error). Operators live for\n"
             "the process; the same Operator object comes back every time.");

static PyObject *get_operators(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  static ferry_py_sig sig = {"get_operators", 3, 1, 3, {"args", "target_sm", "metadata_filter"}, {0}};
  PyObject *a[3];
  if (ferry_py_ops_parse(&sig, args, nargs, kwnames, a) < 0) return NULL;
  ferry_py_gemm_args *ga = ferry_py_ops_args_check(a[0], "get_operators");
  if (!ga) return NULL;
  int sm = 0;
  if (a[1] && a[1] != Py_None && ferry_py_ops_parse_sm(a[1], "target_sm", &sm) < 0) return NULL;
  PyObject *filter = a[2] && a[2] != Py_None ? a[2] : NULL;
  if (filter && !PyCallable_Check(filter)) {
    PyErr_Format(PyExc_TypeError, "metadata_filter must be callable or None, got %R", filter);
    return NULL;
  }
  size_t cap = ferry_ops_count() + 1, n = 0;
  const ferry_op **ops = PyMem_Malloc(cap * sizeof *ops);
  if (!ops) return PyErr_NoMemory();
  ferry_status st = ferry_ops_find(&ga->args, sm, NULL, NULL, ops, cap, &n);
  PyObject *list = st == FERRY_OK ? PyList_New(0) : ferry_py_raise(st);
  for (size_t i = 0; list && i < n && i < cap; i++) {
    PyObject *op = ferry_py_ops_operator(ops[i]);
    int keep = op ? 1 : -1;
    if (op && filter) {
      PyObject *md = PyObject_GetAttrString(op, "metadata");
      PyObject *r = md ? PyObject_CallOneArg(filter, md) : NULL;
      keep = r ? PyObject_IsTrue(r) : -1;
      Py_XDECREF(r);
      Py_XDECREF(md);
    }
    if (keep < 0 || (keep && PyList_Append(list, op) < 0)) Py_CLEAR(list);
    Py_XDECREF(op);
  }
  PyMem_Free(ops);
  return list;
}

PyDoc_STRVAR(operators_doc,
             "operators()\n--\n\n"
             "Every registered operator (ferry's own first, then those registered), whatever the arguments.");

static PyObject *operators(PyObject *self, PyObject *unused) {
  size_t n = ferry_ops_count();
  PyObject *list = PyList_New(0);
  for (size_t i = 0; list && i < n; i++) {
    const ferry_op *op = ferry_ops_get(i);
    if (!op) break;
    PyObject *obj = ferry_py_ops_operator(op);
    if (!obj || PyList_Append(list, obj) < 0) Py_CLEAR(list);
    Py_XDECREF(obj);
  }
  return list;
}

PyDoc_STRVAR(get_operator_doc,
             "get_operator(name)\n--\n\n"
             "The operator registered under `name` (e.g. \"gemm_simt_64x64x16\"); KeyError naming it when none is.");

static PyObject *get_operator(PyObject *self, PyObject *name) {
  if (!PyUnicode_Check(name)) {
    PyErr_Format(PyExc_TypeError, "get_operator() takes an operator name (str), got %R", name);
    return NULL;
  }
  const char *s = PyUnicode_AsUTF8(name);
  if (!s) return NULL;
  const ferry_op *op = ferry_op_by_name(s);
  if (!op) {
    PyErr_Format(PyExc_KeyError, "no operator is registered under the name %R (ferry.ops.operators() lists them)",
                 name);
    return NULL;
  }
  return ferry_py_ops_operator(op);
}

/* ---- the compile caches ------------------------------------------------------------------------------------- */

PyDoc_STRVAR(clear_memo_doc,
             "clear_memo()\n--\n\n"
             "Drops the in-memory memo of compiled artifacts (CompiledArtifact objects you hold stay valid), so the\n"
             "next compile reads the disk cache, or compiles when the disk cache has nothing (point XDG_CACHE_HOME\n"
             "at a fresh directory, or set FERRY_DISK_CACHE=0, for a cold compile). Not while another thread runs\n"
             "operators without an artifact.");

static PyObject *clear_memo(PyObject *self, PyObject *unused) {
  ferry_ops_clear_memo();
  ferry_py_ops_operators_forget_memo();
  Py_RETURN_NONE;
}

PyDoc_STRVAR(cache_stats_doc,
             "cache_stats()\n--\n\n"
             "The compile caches' counters for this process, as a dict: memo_hits, memo_misses, disk_hits,\n"
             "disk_misses, disk_writes, disk_write_failures, disk_rejected (cache files that failed verification,\n"
             "removed and rebuilt), compiles (NVRTC runs), compile_seconds, disk_enabled, disk_dir and disk_note\n"
             "(why the disk cache was skipped, or the last file rejected and why).");

static PyObject *cache_stats(PyObject *self, PyObject *unused) {
  ferry_cache_stats s;
  ferry_cache_stats_get(&s);
  return Py_BuildValue("{sKsKsKsKsKsKsKsKsdsOssss}", "memo_hits", (unsigned long long)s.memo_hits, "memo_misses",
                       (unsigned long long)s.memo_misses, "disk_hits", (unsigned long long)s.disk_hits,
                       "disk_misses", (unsigned long long)s.disk_misses, "disk_writes",
                       (unsigned long long)s.disk_writes, "disk_write_failures",
                       (unsigned long long)s.disk_write_failures, "disk_rejected",
                       (unsigned long long)s.disk_rejected, "compiles", (unsigned long long)s.compiles,
                       "compile_seconds", s.compile_seconds, "disk_enabled", s.disk_enabled ? Py_True : Py_False,
                       "disk_dir", s.disk_dir, "disk_note", s.disk_note);
}

/* ---- the submodule ------------------------------------------------------------------------------------------ */

static PyMethodDef ops_methods[] = {
    {"get_operators", (PyCFunction)(void (*)(void))get_operators, METH_FASTCALL | METH_KEYWORDS,
     get_operators_doc},
    {"operators", operators, METH_NOARGS, operators_doc},
    {"get_operator", get_operator, METH_O, get_operator_doc},
    {"target_sm", target_sm, METH_NOARGS, target_sm_doc},
    {"device_supports", device_supports, METH_O, device_supports_doc},
    {"clear_memo", clear_memo, METH_NOARGS, clear_memo_doc},
    {"cache_stats", cache_stats, METH_NOARGS, cache_stats_doc},
#ifdef FERRY_PYTHON_TEST_HOOKS /* ops_raw.c loads libcuda itself: built for the project's tests and benches only */
    {"_raw_launch_time", (PyCFunction)(void (*)(void))ferry_py_ops_raw_launch_time, METH_FASTCALL | METH_KEYWORDS,
     "Private (ferry.bench.latency): host time of raw cuLaunchKernel of an artifact's kernel, timed in C."},
#endif
    {NULL, NULL, 0, NULL}};

static void ops_free(void *unused) { ferry_py_ops_stream_clear(); }

static struct PyModuleDef ops_def = {
    PyModuleDef_HEAD_INIT, .m_name = "ferry.ops",
    .m_doc = "The C half of ferry.ops (import ferry.ops, not this): GEMM operators over libferry's operator runtime.",
    .m_size = -1, .m_methods = ops_methods, .m_free = ops_free,
};

int ferry_py_ops_init(PyObject *module) {
  PyObject *ops = PyModule_Create(&ops_def);
  if (!ops) return -1;
  if (ferry_py_add_type(ops, &ferry_py_GemmArguments_Type, "GemmArguments") < 0 ||
      ferry_py_add_type(ops, &ferry_py_Operator_Type, "Operator") < 0 ||
      ferry_py_add_type(ops, &ferry_py_Status_Type, "Status") < 0 ||
      ferry_py_add_type(ops, &ferry_py_CompiledArtifact_Type, "CompiledArtifact") < 0 ||
      ferry_py_add_type(ops, &ferry_py_Launcher_Type, "Launcher") < 0 ||
      ferry_py_add_type(ops, &ferry_py_Graph_Type, "Graph") < 0 ||
      ferry_py_ops_metadata_init(ops) < 0)
    goto fail;
#ifdef FERRY_PYTHON_TEST_HOOKS
  if (ferry_py_ops_testing_init(module) < 0) goto fail;
#endif
  if (PyModule_AddObject(module, "_ops", ops) < 0) goto fail;
  return 0;
fail:
  Py_DECREF(ops);
  return -1;
}
