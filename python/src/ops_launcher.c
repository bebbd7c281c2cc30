/* ops_launcher.c — ferry.ops.Launcher, the fast call form: launcher(A, B, out, stream=None).
 *
 * Everything a run needs except the data pointers is bound once: the operator, the artifact, the validated
 * problem (a ferry_gemm_args template with alpha and beta) and each operand's layout as it was read. A call then
 * does, for each tensor, one exchange-API call into the framework (dltensor_from_py_object_no_sync: the tensor's
 * DLTensor, filled by C, no Python) and a compare of dtype, device, shape and strides with the bound layout;
 * then the stream (None: the framework's current work stream, again through the exchange API), the new pointers
 * and their alignment, and ferry_op_run — a parameter copy and cuLaunchKernel. No Python attribute is read, no
 * object is made but None, nothing is formatted unless something is wrong.
 *
 * Checks: the layout compare is what keeps the bound kernel correct (it was compiled for these majors and types,
 * and the leading dimensions are baked into the template), so it always runs — it costs a few integer compares.
 * A tensor whose layout differs but is equivalent (a size-1 dimension with another stride) is accepted after a
 * full validation of that operand; anything else raises ValueError naming both layouts. Alignment of the new
 * pointers is checked against the operator's requirement (a misaligned pointer would fault in a vector load).
 * assume_supported_args=False (the default, as op.run) runs the full support check on the new pointers as well.
 *
 * Tensors of other types than those bound (CuPy, JAX, a torch subclass) take the general path: type look-up,
 * exchange API or __dlpack__(stream=<the launch stream>), the export released right after the launch.
 */
#include "ops_py.h"

#include <string.h>

typedef struct {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  ferry_py_operator *op;          /* strong */
  ferry_py_artifact *artifact;    /* strong: holds the artifact */
  PyObject *bias_owner;           /* strong, or NULL: the GemmArguments whose bias or scales (and their exports)
                                     calls read */
  ferry_gemm_args args;           /* the bound problem; a call copies it and sets the pointers */
  ferry_py_operand bound[3];      /* layouts; `type` references are strong here */
  uint8_t need_align[3];          /* the operator's required alignment of A, B, out in bytes */
  uint8_t has_elements[3];        /* whether the bound operand has any: then a NULL data pointer is refused */
  uint32_t flags;                 /* FERRY_RUN_ASSUME_SUPPORTED or 0 */
  const DLPackExchangeAPI *api;   /* for stream=None, as GemmArguments.api */
} launcher_object;

static const char *operand_names[3] = {"A", "B", "out"};

static inline int same_layout(const ferry_py_operand *b, const DLTensor *t) {
  if (t->ndim != b->ndim || t->dtype.code != b->dtype.code || t->dtype.bits != b->dtype.bits ||
      t->dtype.lanes != b->dtype.lanes || (int32_t)t->device.device_type != b->device.device_type ||
      t->device.device_id != b->device.device_id)
    return 0;
  int64_t compact = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    if (t->shape[d] != b->shape[d]) return 0;
    if ((t->strides ? t->strides[d] : compact) != b->strides[d]) return 0;
    compact *= t->shape[d];
  }
  return 1;
}

/* A layout that differs from the bound one: accepted when validating it in the bound problem's place gives the
 * same problem (extents, leading dimensions, batch strides, kind, device), else ValueError naming both. */
static int __attribute__((noinline, cold)) check_equivalent(launcher_object *L, int i, const DLTensor *t) {
  const ferry_py_operand *b = &L->bound[i];
  char want_d[24], got_d[24], ws[80], wst[80], gs[80], gst[80];
  int64_t strides[3];
  if (t->ndim >= 1 && t->ndim <= 3) {
    int64_t compact = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
      strides[d] = t->strides ? t->strides[d] : compact;
      compact *= t->shape[d] > 0 ? t->shape[d] : 1;
    }
    /* The bound layouts at dummy addresses, 2^62 bytes apart so that out overlaps neither input: nothing is read. */
    ferry_tensor views[3];
    for (int j = 0; j < 3; j++)
      views[j] = (ferry_tensor){(void *)(uintptr_t)(256 + ((uint64_t)j << 62)), L->bound[j].device, L->bound[j].ndim,
                                L->bound[j].dtype, (int64_t *)L->bound[j].shape, (int64_t *)L->bound[j].strides, 0};
    views[i] = (ferry_tensor){views[i].data, {t->device.device_type, t->device.device_id}, t->ndim,
                              {t->dtype.code, t->dtype.bits, t->dtype.lanes}, t->shape, strides, 0};
    ferry_gemm_args probe;
    ferry_error saved = *ferry_last_error();
    ferry_status st = ferry_gemm_args_init(&probe, &views[0], &views[1], &views[2],
                                           (ferry_scalar)L->args.problem.acc_type);
    *(ferry_error *)ferry_last_error() = saved; /* a probe, not an error of the caller's */
    const ferry_gemm_problem *p = &probe.problem, *q = &L->args.problem;
    /* the probe carries no epilogue: the kinds are compared on their type and major bits */
    if (st == FERRY_OK && p->m == q->m && p->n == q->n && p->k == q->k && p->l == q->l && p->lda == q->lda &&
        p->ldb == q->ldb && p->ldc == q->ldc && p->batch_a == q->batch_a && p->batch_b == q->batch_b &&
        p->batch_c == q->batch_c && p->kind == (q->kind & FERRY_GEMM_KIND_OPERANDS) && p->device == q->device)
      return 0;
    ferry_py_ops_dims(t->shape, t->ndim, gs, sizeof gs);
    ferry_py_ops_dims(strides, t->ndim, gst, sizeof gst);
  } else {
    snprintf(gs, sizeof gs, "of rank %d", (int)t->ndim);
    gst[0] = '\0';
  }
  char got_dev[48], want_dev[48];
  PyErr_Format(PyExc_ValueError,
               "Launcher: operand %s is %s on %s with shape %s strides %s; the launcher was bound to %s on %s with "
               "shape %s strides %s. Bind a launcher to these operands: op.launcher(GemmArguments(...))",
               operand_names[i],
               ferry_py_ops_dtype_name((ferry_dtype){t->dtype.code, t->dtype.bits, t->dtype.lanes}, got_d,
                                       sizeof got_d),
               ferry_py_ops_device_name((ferry_device){t->device.device_type, t->device.device_id}, got_dev,
                                        sizeof got_dev),
               gs, gst, ferry_py_ops_dtype_name(b->dtype, want_d, sizeof want_d),
               ferry_py_ops_device_name(b->device, want_dev, sizeof want_dev),
               ferry_py_ops_dims(b->shape, b->ndim, ws, sizeof ws), ferry_py_ops_dims(b->strides, b->ndim, wst, sizeof wst));
  return -1;
}

/* The general path for one operand: any tensor type. Fills *data; `leaf` may receive an export to release. */
static int __attribute__((noinline)) read_general(launcher_object *L, int i, PyObject *obj, void *stream,
                                                  void **data, ferry_py_leaf *leaf) {
  const ferry_py_typeinfo *ti = ferry_py_typeinfo_of(Py_TYPE(obj));
  if (!ti) return -1;
  if (ti->kind != FERRY_PY_TENSOR_EXCHANGE && ti->kind != FERRY_PY_TENSOR_PROTOCOL) {
    PyErr_Format(PyExc_TypeError, "Launcher: operand %s is a %.200s, not a tensor", operand_names[i],
                 Py_TYPE(obj)->tp_name);
    return -1;
  }
  if (ti->family == FERRY_PY_FAMILY_TORCH && ferry_py_math_bits_refuse(obj, "Launcher", operand_names[i]) < 0)
    return -1;
  PyObject *stream_arg = PyLong_FromVoidPtr(stream ? stream : (void *)(uintptr_t)1);
  if (!stream_arg) return -1;
  ferry_tensor t;
  int rc = ferry_py_read_operand(obj, ti, stream_arg, &t, leaf);
  Py_DECREF(stream_arg);
  if (rc < 0 || (i == 2 && ferry_py_ops_refuse_read_only(leaf, obj, "Launcher", "out") < 0)) return -1;
  if (!same_layout(&L->bound[i], (const DLTensor *)&t) && check_equivalent(L, i, (const DLTensor *)&t) < 0)
    return -1;
  *data = (char *)t.data + t.byte_offset;
  return 0;
}

/* A tensor of the bound layout whose data pointer is NULL: ferry_gemm_args_set_data would keep the bound pointer,
 * and the kernel would read the operands the launcher was bound to. */
static int __attribute__((noinline, cold)) no_data(int i) {
  PyErr_Format(PyExc_ValueError, "Launcher: operand %s has a NULL data pointer but elements", operand_names[i]);
  return -1;
}

static int __attribute__((noinline, cold)) misaligned(launcher_object *L, const ferry_gemm_args *a) {
  char reason[320];
  ferry_status st = ferry_op_supports(L->op->op, a, reason, sizeof reason);
  if (st == FERRY_OK) /* the pointer is aligned as the operator needs after all */
    return 0;
  ferry_py_raise(st);
  return -1;
}

static ferry_py_sig call_sig = {"Launcher", 4, 3, 4, {"A", "B", "out", "stream"}, {0}};

static PyObject *launcher_call(launcher_object *L, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
  Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  PyObject *a[4];
  if (__builtin_expect(nargs == 3 && !kwnames, 1)) {
    a[0] = args[0], a[1] = args[1], a[2] = args[2], a[3] = NULL;
  } else if (ferry_py_ops_parse(&call_sig, args, nargs, kwnames, a) < 0) {
    return NULL;
  }
  void *stream;
  if (ferry_py_ops_stream(a[3], L->api, L->args.problem.device, &stream) < 0) return NULL;
  void *data[3];
  ferry_py_leaf leaves[3];
  int general = 0;
  for (int i = 0; i < 3; i++) {
    const ferry_py_operand *b = &L->bound[i];
    if (__builtin_expect(Py_TYPE(a[i]) == b->type && b->api != NULL, 1)) {
      DLTensor t;
      if (b->torch && ferry_py_math_bits_refuse(a[i], "Launcher", operand_names[i]) < 0) goto fail;
      if (b->api->dltensor_from_py_object_no_sync(a[i], &t) != 0) goto fail;
      if (__builtin_expect(!same_layout(b, &t), 0) && check_equivalent(L, i, &t) < 0) goto fail;
      data[i] = (char *)t.data + t.byte_offset;
    } else {
      if (!general) memset(leaves, 0, sizeof leaves);
      general = 1;
      if (read_general(L, i, a[i], stream, &data[i], &leaves[i]) < 0) goto fail;
    }
    if (__builtin_expect(!data[i] && L->has_elements[i], 0) && no_data(i) < 0) goto fail;
  }
  ferry_gemm_args run = L->args;
  /* recomputes the three alignments, and refuses an out that overlaps A or B (as GemmArguments does) */
  ferry_status st = ferry_gemm_args_set_data(&run, data[0], data[1], data[2]);
  if (__builtin_expect(st != FERRY_OK, 0)) {
    ferry_py_raise(st);
    goto fail;
  }
  if (L->flags & FERRY_RUN_ASSUME_SUPPORTED) {
    const ferry_gemm_problem *p = &run.problem;
    if (__builtin_expect(p->a_align < L->need_align[0] || p->b_align < L->need_align[1] ||
                             p->out_align < L->need_align[2], 0) &&
        misaligned(L, &run) < 0)
      goto fail;
  }
  st = ferry_op_run(L->op->op, &run, stream, L->artifact->art, L->flags);
  if (general)
    for (int i = 0; i < 3; i++) ferry_py_leaf_release_input(&leaves[i]);
  if (__builtin_expect(st != FERRY_OK, 0)) return ferry_py_raise(st);
  Py_RETURN_NONE;
fail:
  if (general)
    for (int i = 0; i < 3; i++) ferry_py_leaf_release_input(&leaves[i]);
  return NULL;
}

/* ---- construction ---------------------------------------------------------------------------------------------- */

static ferry_py_sig new_sig = {"Operator.launcher", 3, 1, 2, {"args", "compiled_artifact", "assume_supported_args"},
                               {0}};

PyObject *ferry_py_ops_launcher_new(ferry_py_operator *op, PyObject *const *args, Py_ssize_t nargs,
                                    PyObject *kwnames) {
  PyObject *a[3];
  if (ferry_py_ops_parse(&new_sig, args, nargs, kwnames, a) < 0) return NULL;
  ferry_py_gemm_args *ga = ferry_py_ops_args_check(a[0], "Operator.launcher");
  if (!ga) return NULL;
  ferry_artifact *given;
  if (ferry_py_ops_artifact_arg(a[1], "Operator.launcher", &given) < 0) return NULL;
  int assume = ferry_py_ops_truth(a[2]);
  if (assume < 0) return NULL;
  /* Bind only what this operator supports: a launcher is a promise that its calls can launch. */
  char reason[320];
  ferry_status st = ferry_op_supports(op->op, &ga->args, reason, sizeof reason);
  if (st != FERRY_OK) return ferry_py_raise(st);
  PyObject *artifact;
  if (given) {
    if (ferry_artifact_op(given) != op->op || ferry_artifact_kind(given) != ga->args.problem.kind) {
      PyErr_Format(PyExc_ValueError, "Operator.launcher: the artifact is of operator %s and kind 0x%05x; the "
                   "launcher is for %s and these arguments' kind 0x%05x (compile them with this operator)",
                   ferry_op_info_get(ferry_artifact_op(given))->name, (unsigned)ferry_artifact_kind(given),
                   ferry_op_info_get(op->op)->name, (unsigned)ga->args.problem.kind);
      return NULL;
    }
    artifact = Py_NewRef(a[1]);
  } else {
    ferry_gemm_args copy = ga->args;
    ferry_artifact *art = NULL;
    Py_BEGIN_ALLOW_THREADS st = ferry_op_compile(op->op, &copy, &art);
    Py_END_ALLOW_THREADS if (st != FERRY_OK) return ferry_py_raise(st);
    if (!(artifact = ferry_py_ops_artifact_new(art))) return NULL;
  }
  launcher_object *L = PyObject_New(launcher_object, &ferry_py_Launcher_Type);
  if (!L) {
    Py_DECREF(artifact);
    return NULL;
  }
  L->vectorcall = (vectorcallfunc)launcher_call;
  L->op = (ferry_py_operator *)Py_NewRef((PyObject *)op);
  L->artifact = (ferry_py_artifact *)artifact;
  L->args = ga->args;
  L->bias_owner = ga->operands[3] || ga->operands[4] ? Py_NewRef((PyObject *)ga) : NULL;
  L->api = ga->api;
  L->flags = assume ? FERRY_RUN_ASSUME_SUPPORTED : 0;
  const ferry_op_info *in = ferry_op_info_get(op->op);
  L->need_align[0] = (uint8_t)in->a_align;
  L->need_align[1] = (uint8_t)in->b_align;
  L->need_align[2] = (uint8_t)in->out_align;
  for (int i = 0; i < 3; i++) {
    L->bound[i] = ga->layout[i];
    Py_INCREF(L->bound[i].type);
    L->has_elements[i] = 1;
    for (int d = 0; d < L->bound[i].ndim; d++)
      if (L->bound[i].shape[d] == 0) L->has_elements[i] = 0;
  }
  return (PyObject *)L;
}

static void launcher_dealloc(launcher_object *L) {
  for (int i = 0; i < 3; i++) Py_XDECREF(L->bound[i].type);
  Py_XDECREF(L->bias_owner);
  Py_XDECREF(L->op);
  Py_XDECREF(L->artifact);
  PyObject_Free(L);
}

static PyObject *launcher_repr(launcher_object *L) {
  const ferry_gemm_problem *p = &L->args.problem;
  return PyUnicode_FromFormat("<ferry.ops.Launcher of %s: m=%d n=%d k=%d l=%d on cuda:%d, %s>",
                              ferry_op_info_get(L->op->op)->name, (int)p->m, (int)p->n, (int)p->k, (int)p->l,
                              (int)p->device, L->flags ? "support check bypassed" : "support check on");
}

static PyObject *get_operator(launcher_object *L, void *unused) { return Py_NewRef((PyObject *)L->op); }
static PyObject *get_artifact(launcher_object *L, void *unused) { return Py_NewRef((PyObject *)L->artifact); }
static PyObject *get_assume(launcher_object *L, void *unused) { return PyBool_FromLong(L->flags != 0); }

static PyGetSetDef launcher_getset[] = {
    {"operator", (getter)get_operator, NULL, "The bound Operator.", NULL},
    {"compiled_artifact", (getter)get_artifact, NULL, "The bound CompiledArtifact.", NULL},
    {"assume_supported_args", (getter)get_assume, NULL, "True when calls skip the full support check.", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

PyDoc_STRVAR(launcher_doc,
             "launcher(A, B, out, stream=None): the fast call form of Operator.run.\n\n"
             "Made by op.launcher(args, compiled_artifact=None, *, assume_supported_args=False), it holds the\n"
             "operator, the artifact and args' layout, alpha and beta; each call takes only the tensors (and\n"
             "optionally the stream).\n\n"
             "Per call: each tensor is read through its framework's exchange API (torch: a C call, no Python\n"
             "attribute access) and compared with the bound layout — dtype, device, shape and strides (a layout\n"
             "that differs only where it cannot matter, e.g. the stride of a size-1 dimension, is accepted after a\n"
             "full check; anything else raises ValueError naming both layouts); the new pointers' alignment is\n"
             "checked against the operator's requirement (ferry.FerryError, status UNSUPPORTED, when misaligned);\n"
             "with assume_supported_args=False the full support check runs too. Then one launch on `stream` (as\n"
             "in Operator.run: None is the framework's current stream, so it captures correctly under\n"
             "torch.cuda.graph). Tensors of other frameworks work too, through __dlpack__ (slower).\n\n"
             "Ownership: the launcher keeps the operator and the artifact alive, not the tensors: as with any CUDA\n"
             "launch, keep them alive until the kernel has run (torch's caching allocator does this for tensors\n"
             "freed on the stream they were used on). Arguments with a bias are kept alive too, since every call\n"
             "reads that bias. Returns None.");

PyTypeObject ferry_py_Launcher_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ferry.ops.Launcher",
    .tp_basicsize = sizeof(launcher_object),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = launcher_doc,
    .tp_vectorcall_offset = offsetof(launcher_object, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_dealloc = (destructor)launcher_dealloc,
    .tp_repr = (reprfunc)launcher_repr,
    .tp_getset = launcher_getset,
};
