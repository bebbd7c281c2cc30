/* ops_args.c — ferry.ops.GemmArguments: A, B and out read once through DLPack and validated once by
 * ferry_gemm_args_init, so that every run of them is a launch and nothing else.
 *
 * Reading: torch tensors through the framework's exchange API (dltensor_from_py_object_no_sync: a C call that
 * fills a DLTensor from the tensor, no capsule, no synchronisation); other producers (CuPy, JAX, numpy) through
 * __dlpack__, whose export is then held until the arguments die — the producer's contract for the memory.
 * Wherever an operand lives, it is handed to the C library, so a host array, a wrong dtype, a rank or shape that
 * does not chain all fail there, with messages that name the operand and the values.
 *
 * Ownership: the arguments keep a reference to each operand object (and the producers' exports), so the memory
 * the runs read lives as long as the arguments. They capture the operands' data pointers and layouts at
 * construction: a tensor resized or re-pointed in place afterwards (torch's resize_, set_) is not seen; make new
 * arguments for it.
 */
#include "ops_py.h"

#include <ctype.h>
#include <math.h>
#include <string.h>

/* ---- messages ------------------------------------------------------------------------------------------------ */

const char *ferry_py_ops_dtype_name(ferry_dtype d, char *buf, size_t size) {
  if (d.lanes == 1 && d.code == kDLFloat && d.bits == 16) return "float16";
  if (d.lanes == 1 && d.code == kDLFloat && d.bits == 32) return "float32";
  if (d.lanes == 1 && d.code == kDLBfloat && d.bits == 16) return "bfloat16";
  if (d.lanes == 1 && d.code == 10 && d.bits == 8) return "float8_e4m3fn"; /* DLPack's kDLFloat8_e4m3fn */
  if (d.lanes == 1 && d.code == 12 && d.bits == 8) return "float8_e5m2";   /* kDLFloat8_e5m2 */
  static const char *codes[] = {"int", "uint", "float", "opaque", "bfloat", "complex", "bool"};
  const char *code = d.code < sizeof codes / sizeof codes[0] ? codes[d.code] : "code?";
  if (d.lanes == 1) snprintf(buf, size, "%s%u", code, (unsigned)d.bits);
  else snprintf(buf, size, "%s%ux%u", code, (unsigned)d.bits, (unsigned)d.lanes);
  return buf;
}

const char *ferry_py_ops_device_name(ferry_device d, char *buf, size_t size) {
  switch (d.device_type) {
  case kDLCPU: snprintf(buf, size, "cpu"); break;
  case kDLCUDA: snprintf(buf, size, "cuda:%d", (int)d.device_id); break;
  case kDLCUDAHost: snprintf(buf, size, "cuda_host (pinned)"); break;
  case kDLCUDAManaged: snprintf(buf, size, "cuda_managed:%d", (int)d.device_id); break;
  default: snprintf(buf, size, "DLPack device (%d, %d)", (int)d.device_type, (int)d.device_id); break;
  }
  return buf;
}

const char *ferry_py_ops_dims(const int64_t *v, int n, char *buf, size_t size) {
  size_t at = 0;
  at += (size_t)snprintf(buf, size, "(");
  for (int i = 0; i < n && at < size; i++)
    at += (size_t)snprintf(buf + at, size - at, "%s%lld", i ? ", " : "", (long long)v[i]);
  if (at < size) snprintf(buf + at, size - at, n == 1 ? ",)" : ")");
  return buf;
}

/* ---- accumulator_type ---------------------------------------------------------------------------------------- */

/* The last objects seen, by identity (strong references): torch.float32 and friends are singletons, so the
 * second construction does not format a dtype again. */
#define ACC_CACHE 8
static struct { PyObject *obj; ferry_scalar scalar; } acc_cache[ACC_CACHE];
static unsigned acc_next;

static ferry_scalar scalar_of_text(const char *text) {
  const char *dot = strrchr(text, '.'); /* "torch.float32", "jax.numpy.float16" */
  if (dot) text = dot + 1;
  char t[24];
  size_t n = 0;
  for (; text[n] && n + 1 < sizeof t; n++) t[n] = (char)tolower((unsigned char)text[n]);
  t[n] = '\0';
  static const struct { const char *name; ferry_scalar s; } names[] = {
      {"float32", FERRY_SCALAR_F32}, {"fp32", FERRY_SCALAR_F32}, {"f32", FERRY_SCALAR_F32},
      {"single", FERRY_SCALAR_F32},
      {"float16", FERRY_SCALAR_F16}, {"fp16", FERRY_SCALAR_F16}, {"f16", FERRY_SCALAR_F16}, {"half", FERRY_SCALAR_F16},
      {"int32", FERRY_SCALAR_I32}, {"i32", FERRY_SCALAR_I32}};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (!strcmp(t, names[i].name)) return names[i].s;
  return FERRY_SCALAR_NONE;
}

static int parse_accumulator(PyObject *obj, ferry_scalar *out) {
  if (!obj || obj == Py_None) {
    *out = FERRY_SCALAR_NONE; /* the inputs' own: args_make picks it once it has read them */
    return 0;
  }
  for (int i = 0; i < ACC_CACHE; i++)
    if (acc_cache[i].obj == obj) {
      *out = acc_cache[i].scalar;
      return 0;
    }
  /* "fp32" as text; numpy/JAX scalar types by __name__; torch dtypes and numpy dtypes by str(). */
  PyObject *text = PyUnicode_Check(obj) ? Py_NewRef(obj)
                   : PyType_Check(obj)  ? PyObject_GetAttrString(obj, "__name__")
                                        : PyObject_Str(obj);
  if (!text) return -1;
  const char *t = PyUnicode_Check(text) ? PyUnicode_AsUTF8(text) : NULL;
  ferry_scalar s = t ? scalar_of_text(t) : FERRY_SCALAR_NONE;
  Py_DECREF(text);
  PyErr_Clear();
  if (s == FERRY_SCALAR_NONE) {
    PyErr_Format(PyExc_ValueError, "accumulator_type=%R is not float32, float16 or int32 (give torch.float32, "
                 "numpy.float32, \"float32\" or \"fp32\"; or the float16 or int32 forms)", obj);
    return -1;
  }
  unsigned slot = acc_next++ % ACC_CACHE;
  Py_XSETREF(acc_cache[slot].obj, Py_NewRef(obj));
  acc_cache[slot].scalar = s;
  *out = s;
  return 0;
}

/* ---- reading an operand ---------------------------------------------------------------------------------------- */

int ferry_py_ops_read(PyObject *obj, const char *fn, const char *name, PyObject *cuda_stream, ferry_tensor *tensor,
                      ferry_py_operand *layout, ferry_py_leaf *leaf) {
  const ferry_py_typeinfo *ti = ferry_py_typeinfo_of(Py_TYPE(obj));
  if (!ti) return -1;
  if (ti->kind != FERRY_PY_TENSOR_EXCHANGE && ti->kind != FERRY_PY_TENSOR_PROTOCOL) {
    PyErr_Format(PyExc_TypeError, "%s: operand %s is a %.200s, not a tensor (pass a torch, CuPy, JAX or numpy "
                 "array, or another object with __dlpack__ and __dlpack_device__)", fn, name, Py_TYPE(obj)->tp_name);
    return -1;
  }
  const DLPackExchangeAPI *api = ti->kind == FERRY_PY_TENSOR_EXCHANGE ? ti->api : NULL;
  bool torch = ti->family == FERRY_PY_FAMILY_TORCH;
  if (torch && ferry_py_math_bits_refuse(obj, fn, name) < 0) return -1;
  if (ferry_py_read_operand(obj, ti, cuda_stream, tensor, leaf) < 0) return -1;
  layout->type = Py_TYPE(obj);
  layout->api = api;
  layout->torch = torch;
  layout->dtype = tensor->dtype;
  layout->device = tensor->device;
  layout->ndim = tensor->ndim;
  /* Ranks other than 2 and 3 are left for ferry_gemm_args_init to refuse; it reads no shape to do so. */
  if (tensor->ndim >= 1 && tensor->ndim <= 3 && tensor->shape) {
    int64_t compact = 1;
    for (int d = tensor->ndim - 1; d >= 0; d--) {
      layout->shape[d] = tensor->shape[d];
      layout->strides[d] = tensor->strides ? tensor->strides[d] : compact;
      compact *= tensor->shape[d] > 0 ? tensor->shape[d] : 1;
    }
    tensor->shape = layout->shape; /* the producer's arrays are only lent until Python code runs again */
    tensor->strides = layout->strides;
  }
  return 0;
}

#ifndef DLPACK_FLAG_BITMASK_READ_ONLY
#define DLPACK_FLAG_BITMASK_READ_ONLY (1UL << 0UL)
#endif

int ferry_py_ops_refuse_read_only(const ferry_py_leaf *leaf, PyObject *obj, const char *fn, const char *name) {
  if (!leaf->managed || !(leaf->managed->flags & DLPACK_FLAG_BITMASK_READ_ONLY)) return 0;
  PyErr_Format(PyExc_ValueError, "%s: operand %s (a %.200s) was exported read-only (DLPack's READ_ONLY flag), and "
               "the GEMM writes it; give a writable output", fn, name, Py_TYPE(obj)->tp_name);
  return -1;
}

/* ---- the type ------------------------------------------------------------------------------------------------ */

static const char *operand_names[4] = {"A", "B", "out", "bias"};

/* activation=: None or one of these names (torch's and CUTLASS's spellings); "gelu" alone is refused, since torch's
 * default GELU is the erf form, which ferry does not compute. */
static int parse_activation(PyObject *obj, ferry_activation *out) {
  *out = FERRY_ACTIVATION_NONE;
  if (!obj || obj == Py_None) return 0;
  static const struct { const char *name; ferry_activation a; } names[] = {
      {"identity", FERRY_ACTIVATION_NONE}, {"relu", FERRY_ACTIVATION_RELU}, {"gelu_tanh", FERRY_ACTIVATION_GELU_TANH},
      {"silu", FERRY_ACTIVATION_SILU},     {"swish", FERRY_ACTIVATION_SILU}};
  const char *t = PyUnicode_Check(obj) ? PyUnicode_AsUTF8(obj) : NULL;
  if (!t) PyErr_Clear();
  for (size_t i = 0; t && i < sizeof names / sizeof names[0]; i++)
    if (!strcmp(t, names[i].name)) {
      *out = names[i].a;
      return 0;
    }
  PyErr_Format(PyExc_ValueError, "activation=%R is not None, \"identity\", \"relu\", \"gelu_tanh\" (GELU with the "
               "tanh approximation, torch's approximate=\"tanh\") or \"silu\"", obj);
  return -1;
}

/* bias=: a vector of n values (one per column of out, as a linear layer's) or, shaped (m, 1), one per row. Returns
 * the mode, or -1 with ValueError; the C check then tests dtype, length, contiguity and device. */
static int bias_mode_of(const ferry_tensor *t, const ferry_gemm_problem *p) {
  if (t->ndim == 1) return FERRY_BIAS_ROW;
  if (t->ndim == 2 && t->shape && t->shape[1] == 1 && (t->shape[0] != 1 || p->m == 1)) return FERRY_BIAS_COL;
  if (t->ndim == 2 && t->shape && t->shape[0] == 1) return FERRY_BIAS_ROW;
  char shape[80] = "";
  if (t->shape && t->ndim >= 1 && t->ndim <= 3) ferry_py_ops_dims(t->shape, t->ndim, shape, sizeof shape);
  PyErr_Format(PyExc_ValueError, "GemmArguments: bias has rank %d%s%s; give a vector of n = %d values (one per "
               "column of out), shaped (n,) or (1, n), or m = %d values shaped (m, 1) (one per row)", (int)t->ndim,
               shape[0] ? " and shape " : "", shape, (int)p->n, (int)p->m);
  return -1;
}

/* What CUDA producers are asked to order their pending work before: the legacy default stream (1 in the
 * __dlpack__ protocol), the stream a run of operands without an exchange API defaults to. */
static PyObject *legacy_stream_arg;

/* alpha or beta as the float32 the kernels compute with: a finite value past float32's range is an OverflowError,
 * not an infinity that would fill the output. 0 or -1. */
static int float32_of(PyObject *obj, const char *name, float *out) {
  double v = PyFloat_AsDouble(obj);
  if (v == -1.0 && PyErr_Occurred()) return -1;
  if (isfinite(v) && isinf((float)v)) {
    PyErr_Format(PyExc_OverflowError, "GemmArguments: %s=%R is past float32's range (the kernels compute in "
                 "float32)", name, obj);
    return -1;
  }
  *out = (float)v;
  return 0;
}

static PyObject *args_make(PyTypeObject *type, PyObject **a) {
  float alpha = 1.0f, beta = 0.0f; /* None: the default */
  ferry_scalar acc;
  ferry_activation activation;
  if (a[4] && a[4] != Py_None && float32_of(a[4], "alpha", &alpha) < 0) return NULL;
  if (a[5] && a[5] != Py_None && float32_of(a[5], "beta", &beta) < 0) return NULL;
  if (parse_accumulator(a[3], &acc) < 0) return NULL;
  if (parse_activation(a[7], &activation) < 0) return NULL;
  PyObject *bias = a[6] && a[6] != Py_None ? a[6] : NULL;
  PyObject *scale_a = a[8] && a[8] != Py_None ? a[8] : NULL, *scale_b = a[9] && a[9] != Py_None ? a[9] : NULL;
  if (!scale_a != !scale_b) {
    PyErr_Format(PyExc_ValueError, "GemmArguments: scale_%s was given without scale_%s; give both (a scale of 1.0 "
                 "for an unscaled operand) or neither", scale_a ? "a" : "b", scale_a ? "b" : "a");
    return NULL;
  }
  if (!legacy_stream_arg && !(legacy_stream_arg = PyLong_FromLong(1))) return NULL;
  ferry_py_gemm_args *self = (ferry_py_gemm_args *)type->tp_alloc(type, 0);
  if (!self) return NULL;
  for (int i = 0; i < 3; i++) self->operands[i] = Py_NewRef(a[i]);
  self->operands[3] = Py_XNewRef(bias);
  self->operands[4] = Py_XNewRef(scale_a);
  self->operands[5] = Py_XNewRef(scale_b);
  self->activation = a[7] && a[7] != Py_None ? Py_NewRef(a[7]) : NULL;
  static PyObject *default_float, *default_int;
  if (!default_float && !(default_float = PyUnicode_InternFromString("float32"))) goto fail;
  if (!default_int && !(default_int = PyUnicode_InternFromString("int32"))) goto fail;
  ferry_tensor t[3];
  for (int i = 0; i < 3; i++) {
    if (ferry_py_ops_read(a[i], "GemmArguments", operand_names[i], legacy_stream_arg, &t[i], &self->layout[i],
                          &self->leaves[i]) < 0 ||
        (i == 2 && ferry_py_ops_refuse_read_only(&self->leaves[2], a[2], "GemmArguments", "out") < 0))
      goto fail;
    if (!self->api) self->api = self->layout[i].api;
  }
  if (acc == FERRY_SCALAR_NONE) { /* int8 inputs accumulate in int32, everything else in float32 */
    const int int8 = t[0].dtype.code == kDLInt && t[0].dtype.bits == 8;
    acc = int8 ? FERRY_SCALAR_I32 : FERRY_SCALAR_F32;
    self->accumulator = Py_NewRef(int8 ? default_int : default_float);
  } else {
    self->accumulator = Py_NewRef(a[3]);
  }
  ferry_status st = ferry_gemm_args_init(&self->args, &t[0], &t[1], &t[2], acc);
  if (st != FERRY_OK) {
    ferry_py_raise(st);
    goto fail;
  }
  self->args.alpha = alpha;
  self->args.beta = beta;
  ferry_tensor bias_t;
  int mode = FERRY_BIAS_NONE;
  if (bias) {
    if (ferry_py_ops_read(bias, "GemmArguments", "bias", legacy_stream_arg, &bias_t, &self->layout[3],
                          &self->leaves[3]) < 0 ||
        (mode = bias_mode_of(&bias_t, &self->args.problem)) < 0)
      goto fail;
    if (bias_t.ndim == 2) { /* (1, n) or (m, 1): the vector along its long dimension */
      int d = mode == FERRY_BIAS_ROW ? 1 : 0;
      bias_t.ndim = 1;
      bias_t.shape += d;
      if (bias_t.strides) bias_t.strides += d;
    }
  }
  if (bias || activation != FERRY_ACTIVATION_NONE) {
    st = ferry_gemm_args_set_epilogue(&self->args, bias ? &bias_t : NULL, (ferry_bias)mode, activation);
    if (st != FERRY_OK) {
      ferry_py_raise(st);
      goto fail;
    }
  }
  if (scale_a) {
    ferry_tensor sa, sb;
    if (ferry_py_ops_read(scale_a, "GemmArguments", "scale_a", legacy_stream_arg, &sa, &self->layout[4],
                          &self->leaves[4]) < 0 ||
        ferry_py_ops_read(scale_b, "GemmArguments", "scale_b", legacy_stream_arg, &sb, &self->layout[5],
                          &self->leaves[5]) < 0)
      goto fail;
    if ((st = ferry_gemm_args_set_scales(&self->args, &sa, &sb)) != FERRY_OK) {
      ferry_py_raise(st);
      goto fail;
    }
  }
  return (PyObject *)self;
fail:
  Py_DECREF(self);
  return NULL;
}

static ferry_py_sig args_sig = {"GemmArguments", 10, 3, 4,
                                {"A", "B", "out", "accumulator_type", "alpha", "beta", "bias", "activation", "scale_a",
                                 "scale_b"}, {0}};

static PyObject *args_vectorcall(PyObject *type, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
  PyObject *a[10];
  if (ferry_py_ops_parse(&args_sig, args, PyVectorcall_NARGS(nargsf), kwnames, a) < 0) return NULL;
  return args_make((PyTypeObject *)type, a);
}

/* The tuple/dict path (subclasses, copy, a call through functools.partial): the same parser. */
static PyObject *args_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
  Py_ssize_t nargs = PyTuple_GET_SIZE(args), nkw = kwargs ? PyDict_GET_SIZE(kwargs) : 0;
  PyObject *stack[16] = {NULL}, *kwnames = nkw ? PyTuple_New(nkw) : NULL;
  if (nargs + nkw > 16) {
    Py_XDECREF(kwnames);
    PyErr_Format(PyExc_TypeError, "GemmArguments() takes at most 10 arguments (%zd given)", nargs + nkw);
    return NULL;
  }
  if (nkw && !kwnames) return NULL;
  for (Py_ssize_t i = 0; i < nargs; i++) stack[i] = PyTuple_GET_ITEM(args, i);
  Py_ssize_t pos = 0, i = 0;
  PyObject *key, *value;
  while (kwargs && PyDict_Next(kwargs, &pos, &key, &value)) {
    PyTuple_SET_ITEM(kwnames, i, Py_NewRef(key));
    stack[nargs + i++] = value;
  }
  PyObject *a[10], *r = NULL;
  if (ferry_py_ops_parse(&args_sig, stack, nargs, kwnames, a) == 0) r = args_make(type, a);
  Py_XDECREF(kwnames);
  return r;
}

static int args_traverse(ferry_py_gemm_args *self, visitproc visit, void *arg) {
  for (int i = 0; i < 6; i++) Py_VISIT(self->operands[i]);
  Py_VISIT(self->accumulator);
  Py_VISIT(self->activation);
  return 0;
}

static int args_clear(ferry_py_gemm_args *self) {
  for (int i = 0; i < 6; i++) ferry_py_leaf_release_input(&self->leaves[i]);
  for (int i = 0; i < 6; i++) Py_CLEAR(self->operands[i]);
  Py_CLEAR(self->accumulator);
  Py_CLEAR(self->activation);
  return 0;
}

static void args_dealloc(ferry_py_gemm_args *self) {
  PyObject_GC_UnTrack(self);
  args_clear(self);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

ferry_py_gemm_args *ferry_py_ops_args_check(PyObject *obj, const char *fn) {
  if (ferry_py_is_gemm_args(obj)) return (ferry_py_gemm_args *)obj;
  PyErr_Format(PyExc_TypeError, "%s() takes a ferry.ops.GemmArguments, got a %.200s", fn, Py_TYPE(obj)->tp_name);
  return NULL;
}

static const char *major_name(int m) { return m == FERRY_MAJOR_ROW ? "row" : "column"; }

static const char *bias_name(int b) { return b == FERRY_BIAS_ROW ? "row" : b == FERRY_BIAS_COL ? "column" : "none"; }
static const char *activation_name(int a) {
  return a == FERRY_ACTIVATION_RELU ? "relu" : a == FERRY_ACTIVATION_GELU_TANH ? "gelu_tanh"
         : a == FERRY_ACTIVATION_SILU ? "silu" : "identity";
}

static PyObject *args_repr(ferry_py_gemm_args *self) {
  const ferry_gemm_problem *p = &self->args.problem;
  char *alpha = PyOS_double_to_string(self->args.alpha, 'r', 0, 0, NULL);
  char *beta = PyOS_double_to_string(self->args.beta, 'r', 0, 0, NULL);
  char epilogue[80] = "";
  if (p->bias || p->activation)
    snprintf(epilogue, sizeof epilogue, ", bias %s, activation %s", bias_name(p->bias), activation_name(p->activation));
  if (p->scaled) snprintf(epilogue + strlen(epilogue), sizeof epilogue - strlen(epilogue), ", scaled");
  PyObject *r = NULL;
  if (alpha && beta)
    r = PyUnicode_FromFormat("ferry.ops.GemmArguments(m=%d, n=%d, k=%d, l=%d, A %s %s-major, B %s %s-major, out %s "
                             "%s-major, accumulate %s, alpha=%s, beta=%s%s, cuda:%d)",
                             (int)p->m, (int)p->n, (int)p->k, (int)p->l, ferry_scalar_name(p->a_type),
                             major_name(p->a_major), ferry_scalar_name(p->b_type), major_name(p->b_major),
                             ferry_scalar_name(p->out_type), major_name(p->out_major), ferry_scalar_name(p->acc_type),
                             alpha, beta, epilogue, (int)p->device);
  else
    PyErr_NoMemory();
  PyMem_Free(alpha);
  PyMem_Free(beta);
  return r;
}

static PyObject *get_operand(ferry_py_gemm_args *self, void *which) {
  return Py_NewRef(self->operands[(intptr_t)which]);
}

static PyObject *get_accumulator(ferry_py_gemm_args *self, void *unused) { return Py_NewRef(self->accumulator); }

static PyObject *get_bias(ferry_py_gemm_args *self, void *unused) {
  return Py_NewRef(self->operands[3] ? self->operands[3] : Py_None);
}

static PyObject *get_scale(ferry_py_gemm_args *self, void *which) {
  PyObject *s = self->operands[4 + (intptr_t)which];
  return Py_NewRef(s ? s : Py_None);
}

static PyObject *get_activation(ferry_py_gemm_args *self, void *unused) {
  return Py_NewRef(self->activation ? self->activation : Py_None);
}

static PyObject *get_scalar(ferry_py_gemm_args *self, void *which) {
  return PyFloat_FromDouble(which ? self->args.beta : self->args.alpha);
}

static int set_scalar(ferry_py_gemm_args *self, PyObject *value, void *which) {
  if (!value) {
    PyErr_Format(PyExc_AttributeError, "%s cannot be deleted", which ? "beta" : "alpha");
    return -1;
  }
  return float32_of(value, which ? "beta" : "alpha", which ? &self->args.beta : &self->args.alpha);
}

static PyObject *get_device(ferry_py_gemm_args *self, void *unused) {
  return PyLong_FromLong(self->args.problem.device);
}

static PyObject *get_problem(ferry_py_gemm_args *self, void *unused) {
  const ferry_gemm_problem *p = &self->args.problem;
  return Py_BuildValue("{sisisisisLsLsLsLsLsLsIsssssssssssssssisisisisssssO}", "m", (int)p->m, "n", (int)p->n, "k",
                       (int)p->k, "l", (int)p->l, "lda", (long long)p->lda, "ldb", (long long)p->ldb, "ldc",
                       (long long)p->ldc, "batch_a", (long long)p->batch_a, "batch_b", (long long)p->batch_b,
                       "batch_c", (long long)p->batch_c, "kind", (unsigned)p->kind, "a_type",
                       ferry_scalar_name(p->a_type), "b_type", ferry_scalar_name(p->b_type), "out_type",
                       ferry_scalar_name(p->out_type), "accumulator_type", ferry_scalar_name(p->acc_type), "a_major",
                       major_name(p->a_major), "b_major", major_name(p->b_major), "out_major",
                       major_name(p->out_major), "a_align", (int)p->a_align, "b_align", (int)p->b_align, "out_align",
                       (int)p->out_align, "device", (int)p->device, "bias", bias_name(p->bias), "activation",
                       activation_name(p->activation), "scaled", p->scaled ? Py_True : Py_False);
}

static PyGetSetDef args_getset[] = {
    {"A", (getter)get_operand, NULL, "Operand A (m×k, or l×m×k), the object given.", (void *)0},
    {"B", (getter)get_operand, NULL, "Operand B (k×n, or l×k×n), the object given.", (void *)1},
    {"out", (getter)get_operand, NULL, "The output (m×n, or l×m×n), the object given.", (void *)2},
    {"accumulator_type", (getter)get_accumulator, NULL, "accumulator_type as given (\"float32\" by default).", NULL},
    {"bias", (getter)get_bias, NULL, "The epilogue's bias as given, or None.", NULL},
    {"activation", (getter)get_activation, NULL, "The epilogue's activation as given, or None.", NULL},
    {"scale_a", (getter)get_scale, NULL, "A's per-tensor scale as given, or None.", (void *)0},
    {"scale_b", (getter)get_scale, NULL, "B's per-tensor scale as given, or None.", (void *)1},
    {"alpha", (getter)get_scalar, (setter)set_scalar,
     "out = alpha·A·B + beta·out. Settable; runs read it at launch (a captured graph run keeps the value it was "
     "captured or last updated with).", NULL},
    {"beta", (getter)get_scalar, (setter)set_scalar,
     "See alpha. With beta == 0 the output is never read (it may hold NaN).", (void *)1},
    {"device", (getter)get_device, NULL, "The CUDA device index of the operands.", NULL},
    {"problem", (getter)get_problem, NULL,
     "The validated problem as a dict: m, n, k, l, leading dimensions and batch strides (elements), kind, types, "
     "majors, alignments (bytes), device, and the epilogue's bias mode (\"none\", \"row\", \"column\") and "
     "activation.", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

PyDoc_STRVAR(args_doc,
             "GemmArguments(A, B, out, accumulator_type=None, *, alpha=1.0, beta=0.0, bias=None,\n"
             "              activation=None, scale_a=None, scale_b=None)\n--\n\n"
             "The arguments of out = activation(alpha * scale_a * scale_b * A @ B + beta * out + bias), validated\n"
             "once.\n\n"
             "A (m×k), B (k×n) and out (m×n): rank 2, or rank 3 with a leading batch l (a rank-2 or batch-1 A or B\n"
             "is broadcast over out's batch); float16, bfloat16 or float32; each row- or column-major (a stride of\n"
             "1 in one of the two matrix dimensions; the other is the leading dimension); all on one CUDA device.\n"
             "8-bit inputs: A and B float8_e4m3fn or float8_e5m2 (each either; out float16, bfloat16 or float32), or\n"
             "both int8 (out int32, exact, or a float type); A row-major and B column-major (k contiguous in both:\n"
             "B = W.t() of a row-major weight W, as torch._scaled_mm takes it); k a multiple of 16 for the\n"
             "tensor-core operators. An int32 output takes no epilogue (alpha 1, beta 0).\n"
             "out must not overlap itself, A, B, bias or the scales; A and B may be expanded (stride-0) views.\n"
             "Tensors from torch (read\n"
             "through its DLPack exchange API, without synchronising) or from CuPy, JAX, numpy or any producer with\n"
             "__dlpack__ (called with stream=1, the legacy default stream, once at construction).\n"
             "accumulator_type: None (int32 for int8 inputs, else float32), float32, float16 or int32 — a torch or\n"
             "numpy dtype, a numpy/JAX scalar type, or a string (\"float32\", \"fp32\", \"float16\", \"fp16\",\n"
             "\"int32\"); which operators accept float16 is theirs to say.\n"
             "bias and activation: a fused epilogue, computed in float32 before the conversion to out's dtype, in the\n"
             "same kernel. bias: a contiguous vector of out's dtype on out's device, shaped (n,) or (1, n) — one\n"
             "value per column, as a linear layer's — or (m, 1), one per row; shared by all batches. activation:\n"
             "None, \"relu\", \"gelu_tanh\" (torch's approximate=\"tanh\") or \"silu\". Part of the compiled kernel's\n"
             "kind; every built-in operator fuses them.\n"
             "scale_a and scale_b: per-tensor scales (both or neither), one-element float32 tensors on out's device,\n"
             "read by the kernel at every run (scales computed on the GPU need no synchronisation; a graph replay\n"
             "reads their current values), as torch._scaled_mm's.\n\n"
             "Raises ValueError (from the C library's check) naming the operand and the values: a host array, a\n"
             "dtype that is not a GEMM type, a rank or shapes that do not chain, strides that are neither row- nor\n"
             "column-major, an out that overlaps itself, operands on different devices; OverflowError past 2^31-1\n"
             "elements in a dimension; TypeError for an object that is not a tensor.\n\n"
             "Ownership: keeps references to A, B and out (and to the DLPack exports of non-torch operands) until it\n"
             "dies, so the memory runs read stays alive. Data pointers and layouts are captured now: a tensor\n"
             "resized or re-pointed in place later (resize_, set_) is not seen — make new arguments.\n"
             "CUTLASS: cutlass.operators.GemmArguments (about 160 µs there; here about a microsecond).");

PyTypeObject ferry_py_GemmArguments_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ferry.ops.GemmArguments",
    .tp_basicsize = sizeof(ferry_py_gemm_args),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE,
    .tp_doc = args_doc,
    .tp_new = args_new,
    .tp_vectorcall = args_vectorcall,
    .tp_dealloc = (destructor)args_dealloc,
    .tp_traverse = (traverseproc)args_traverse,
    .tp_clear = (inquiry)args_clear,
    .tp_repr = (reprfunc)args_repr,
    .tp_getset = args_getset,
};
