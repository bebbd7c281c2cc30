/* dlpack_in.c — reads one input tensor as a ferry_tensor, without copying it.
 *
 * Two routes:
 *   - the DLPack exchange API (torch): dltensor_from_py_object_no_sync fills a DLTensor that views the tensor's
 *     own shape and strides; nothing is allocated, nothing synchronised. The tensor object is kept alive by the
 *     batch tape, which keeps those pointers valid. Ordering after the producer is done once per transfer with the
 *     framework's current work stream (the SPDL contract: an event recorded on the caller's current stream).
 *   - the __dlpack__ protocol (CuPy, JAX, numpy, ...): __dlpack_device__() first, so that tensors that are not on
 *     the source side cost no export; then __dlpack__(stream=<copy stream>, max_version=(1, 3)), which makes the
 *     producer order its own work before our copy stream (stream=-1 when the caller gave producer_event, which is
 *     then the readiness boundary). The capsule is renamed "used_..." as the protocol requires, and the producer's
 *     deleter is called once the copies out of it are done (ferry_py_leaf_release_input).
 * ferry.ops reads GEMM operands through the same two routes (ferry_py_read_operand), wherever they live: the C
 * library's argument check then names a wrong device, as it names a wrong dtype or shape.
 */
#include "ferry_py.h"

#include <limits.h>
#include <string.h>

/* The protocol's method and keyword names, interned, and max_version's value, made once at import: a call per
 * tensor then builds no string, dict or tuple (PyObject_CallMethod and a kwargs dict made each one of them). */
static PyObject *name_dlpack_device, *name_dlpack, *kw_stream_version, *kw_version, *kw_stream, *max_version;

int ferry_py_dlpack_in_init(void) {
  name_dlpack_device = PyUnicode_InternFromString("__dlpack_device__");
  name_dlpack = PyUnicode_InternFromString("__dlpack__");
  kw_stream_version = Py_BuildValue("(ss)", "stream", "max_version");
  kw_version = Py_BuildValue("(s)", "max_version");
  kw_stream = Py_BuildValue("(s)", "stream");
  max_version = Py_BuildValue("(ii)", DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION);
  return name_dlpack_device && name_dlpack && kw_stream_version && kw_version && kw_stream && max_version ? 0 : -1;
}

static bool on_source_side(const ferry_py_read_ctx *ctx, int32_t type, int32_t id) {
  if (ctx->h2d) return type == kDLCPU || type == kDLCUDAHost;
  return (type == kDLCUDA || type == kDLCUDAManaged) && id == ctx->device;
}

/* obj.__dlpack_device__() as (type, id). Returns 0 or -1 with an exception set. */
static int dlpack_device(PyObject *obj, int32_t *type, int32_t *id) {
  PyObject *d = PyObject_CallMethodNoArgs(obj, name_dlpack_device);
  if (!d) return -1;
  int ok = PyTuple_Check(d) && PyTuple_GET_SIZE(d) == 2;
  long long t = ok ? PyLong_AsLongLong(PyTuple_GET_ITEM(d, 0)) : -1;
  long long i = ok ? PyLong_AsLongLong(PyTuple_GET_ITEM(d, 1)) : -1;
  if (!ok || PyErr_Occurred()) {
    PyErr_Clear();
    PyErr_Format(PyExc_TypeError, "%s.__dlpack_device__() returned %R, expected a (device_type, device_id) tuple",
                 Py_TYPE(obj)->tp_name, d);
    Py_DECREF(d);
    return -1;
  }
  Py_DECREF(d);
  /* DLPack's fields are 32-bit. A value that does not fit names no device ferry copies from: the tensor passes
   * through, rather than wrapping into another device (cuda:2**32 into cuda:0). */
  if (t < 0 || t > INT32_MAX || i < 0 || i > INT32_MAX) t = i = -1;
  *type = (int32_t)t;
  *id = (int32_t)i;
  return 0;
}

/* The stream value to pass to a CUDA producer's __dlpack__: our copy stream, so that the producer makes it wait
 * for its pending work; -1 (no synchronisation) when producer_event marks readiness instead. */
static PyObject *producer_stream_arg(ferry_py_read_ctx *ctx) {
  if (ctx->producer_event_given) return PyLong_FromLong(-1);
  if (!ctx->have_copy_stream) {
    ferry_status st = ferry_copy_stream(ctx->device, &ctx->copy_stream);
    if (st != FERRY_OK) return ferry_py_raise(st);
    ctx->have_copy_stream = true;
  }
  return PyLong_FromVoidPtr(ctx->copy_stream);
}

/* Whether a TypeError says that __dlpack__ does not take max_version (a producer older than DLPack 1.0), and not
 * something else: asking a producer again after any TypeError would run its export twice. */
static bool rejects_max_version(void) {
  if (!PyErr_ExceptionMatches(PyExc_TypeError)) return false;
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyObject *text = value ? PyObject_Str(value) : NULL;
  const char *msg = text ? PyUnicode_AsUTF8(text) : NULL;
  bool about_it = msg && strstr(msg, "max_version") != NULL;
  Py_XDECREF(text);
  PyErr_Clear();
  PyErr_Restore(type, value, tb);
  return about_it;
}

/* Calls obj.__dlpack__(stream=..., max_version=(1, minor)), without `stream` when it is NULL (host producers
 * take none); a producer that predates max_version (a TypeError about it) is asked again without it and answers
 * with a legacy capsule. */
static PyObject *export_capsule_with(PyObject *obj, PyObject *stream) {
  /* self, then the keyword values in kwnames' order */
  PyObject *args[3] = {obj, stream ? stream : max_version, max_version};
  PyObject *capsule = PyObject_VectorcallMethod(name_dlpack, args, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                                stream ? kw_stream_version : kw_version);
  if (!capsule && rejects_max_version()) {
    PyErr_Clear();
    capsule = stream ? PyObject_VectorcallMethod(name_dlpack, args, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, kw_stream)
                     : PyObject_CallMethodNoArgs(obj, name_dlpack);
  }
  return capsule;
}

/* export_capsule_with for an input of a transfer: the stream is the copy stream (see producer_stream_arg). */
static PyObject *export_capsule(ferry_py_read_ctx *ctx, PyObject *obj) {
  PyObject *stream = NULL;
  if (!ctx->h2d && !(stream = producer_stream_arg(ctx))) return NULL; /* host producers take no stream */
  PyObject *capsule = export_capsule_with(obj, stream);
  Py_XDECREF(stream);
  return capsule;
}

/* Takes the managed tensor out of a DLPack capsule (renaming it "used_...", so the producer's capsule destructor
 * leaves it to us) and copies its descriptor. Returns 0 or -1 with an exception set. */
static int take_capsule(PyObject *obj, PyObject *capsule, ferry_tensor *tensor, ferry_py_leaf *leaf) {
  if (PyCapsule_IsValid(capsule, "dltensor_versioned")) {
    DLManagedTensorVersioned *m = PyCapsule_GetPointer(capsule, "dltensor_versioned");
    if (PyCapsule_SetName(capsule, "used_dltensor_versioned") < 0) return -1;
    if (m->version.major != DLPACK_MAJOR_VERSION) {
      /* Another ABI: nothing but the deleter may be touched, and it must be called. */
      unsigned major = m->version.major;
      if (m->deleter) m->deleter(m);
      PyErr_Format(PyExc_BufferError, "%s exported DLPack %u.x; ferry reads DLPack %d.x", Py_TYPE(obj)->tp_name,
                   major, DLPACK_MAJOR_VERSION);
      return -1;
    }
    memcpy(tensor, &m->dl_tensor, sizeof *tensor);
    leaf->managed = m;
    return 0;
  }
  if (PyCapsule_IsValid(capsule, "dltensor")) {
    DLManagedTensor *m = PyCapsule_GetPointer(capsule, "dltensor");
    if (PyCapsule_SetName(capsule, "used_dltensor") < 0) return -1;
    memcpy(tensor, &m->dl_tensor, sizeof *tensor);
    leaf->managed_legacy = m;
    return 0;
  }
  PyErr_Format(PyExc_TypeError, "%s.__dlpack__() returned %R, not a DLPack capsule", Py_TYPE(obj)->tp_name, capsule);
  return -1;
}

static int read_protocol(ferry_py_read_ctx *ctx, PyObject *obj, ferry_tensor *tensor, ferry_py_leaf *leaf) {
  int32_t type, id;
  if (dlpack_device(obj, &type, &id) < 0) return -1;
  if (!on_source_side(ctx, type, id)) return 0;
  /* torch's __dlpack__ refuses a conjugate view and describes a negative one as its memory: the view without the
   * bits is exported, and the output gets them back. */
  PyObject *source = Py_NewRef(obj);
  if (leaf->family == FERRY_PY_FAMILY_TORCH) {
    int bits = ferry_py_math_bits(obj, true);
    if (bits < 0 || !(source = ferry_py_math_bits_flip(source, bits))) {
      Py_XDECREF(bits < 0 ? source : NULL);
      return -1;
    }
    leaf->math_bits = (uint8_t)bits;
  }
  PyObject *capsule = export_capsule(ctx, source);
  Py_DECREF(source); /* the capsule's managed tensor holds the memory */
  if (!capsule) return -1;
  int rc = take_capsule(obj, capsule, tensor, leaf);
  Py_DECREF(capsule); /* renamed: its destructor no longer owns the managed tensor */
  if (rc < 0) return -1;
  if (!on_source_side(ctx, tensor->device.device_type, tensor->device.device_id)) {
    ferry_py_leaf_release_input(leaf);
    PyErr_Format(PyExc_BufferError, "%s.__dlpack__() exported a tensor on device (%d, %d), but __dlpack_device__() "
                 "said (%d, %d)", Py_TYPE(obj)->tp_name, (int)tensor->device.device_type,
                 (int)tensor->device.device_id, (int)type, (int)id);
    return -1;
  }
  return 1;
}

/* torch's bits that its export drops (math_bits.c), asked before the export, which Python code would invalidate:
 * the negative bit always, the conjugate bit once the export has shown a complex dtype (then exported again). */
static int torch_math_bits(PyObject *obj, const ferry_py_typeinfo *ti, ferry_tensor *tensor, bool exported) {
  if (!exported) return ferry_py_math_bits(obj, false);
  if (tensor->dtype.code != kDLComplex) return 0;
  int bits = ferry_py_math_bits(obj, true);
  if (bits >= 0 && ti->api->dltensor_from_py_object_no_sync(obj, (DLTensor *)tensor) != 0) return -1;
  return bits;
}

static int read_exchange(ferry_py_read_ctx *ctx, PyObject *obj, const ferry_py_typeinfo *ti, ferry_tensor *tensor,
                         ferry_py_leaf *leaf) {
  bool torch = ti->family == FERRY_PY_FAMILY_TORCH;
  int neg = torch ? torch_math_bits(obj, ti, tensor, false) : 0;
  if (neg < 0) return -1;
  if (ti->api->dltensor_from_py_object_no_sync(obj, (DLTensor *)tensor) != 0) {
    /* Some tensors cannot be described by DLPack (sparse, quantized, conjugate views). That only matters for
     * tensors on the source side: others pass through untouched, as SPDL's would. */
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    int32_t dt, id;
    if (dlpack_device(obj, &dt, &id) == 0 && !on_source_side(ctx, dt, id)) {
      Py_XDECREF(type);
      Py_XDECREF(value);
      Py_XDECREF(tb);
      return 0;
    }
    PyErr_Clear();
    PyErr_Restore(type, value, tb);
    return -1;
  }
  if (!on_source_side(ctx, tensor->device.device_type, tensor->device.device_id)) return 0;
  int conj = torch ? torch_math_bits(obj, ti, tensor, true) : 0;
  if (conj < 0) return -1;
  leaf->math_bits = (uint8_t)(neg | conj);
  leaf->api = ti->api;
  if (!ctx->producer_api) ctx->producer_api = ti->api;
  return 1;
}

int ferry_py_read_tensor(ferry_py_read_ctx *ctx, PyObject *obj, const ferry_py_typeinfo *ti, ferry_tensor *tensor,
                         ferry_py_leaf *leaf) {
  memset(leaf, 0, sizeof *leaf);
  leaf->obj = obj;
  leaf->family = ti->family;
  if (ti->kind == FERRY_PY_TENSOR_EXCHANGE) return read_exchange(ctx, obj, ti, tensor, leaf);
  return read_protocol(ctx, obj, tensor, leaf);
}

void ferry_py_leaf_release_input(ferry_py_leaf *leaf) {
  if (!leaf->managed && !leaf->managed_legacy) return;
  /* Inputs are also released on the way out of a failed call, with its exception pending. A deleter may run
   * Python code (a ctypes producer, a __del__), which must not see that exception: it would be replaced by a
   * SystemError and the deleter's work lost. */
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  if (leaf->managed) {
    DLManagedTensorVersioned *m = leaf->managed;
    leaf->managed = NULL;
    if (m->deleter) m->deleter(m);
  }
  if (leaf->managed_legacy) {
    DLManagedTensor *m = leaf->managed_legacy;
    leaf->managed_legacy = NULL;
    if (m->deleter) m->deleter(m);
  }
  PyErr_Restore(type, value, tb);
}

/* ---- operands of ferry.ops: a tensor wherever it lives --------------------------------------------------- */

int ferry_py_read_operand(PyObject *obj, const ferry_py_typeinfo *ti, PyObject *cuda_stream, ferry_tensor *tensor,
                          ferry_py_leaf *leaf) {
  memset(leaf, 0, sizeof *leaf);
  leaf->obj = obj;
  leaf->family = ti->family;
  if (ti->kind == FERRY_PY_TENSOR_EXCHANGE) {
    if (ti->api->dltensor_from_py_object_no_sync(obj, (DLTensor *)tensor) != 0) return -1;
    leaf->api = ti->api;
    return 0;
  }
  int32_t type, id;
  if (dlpack_device(obj, &type, &id) < 0) return -1;
  /* Only CUDA producers take a stream; a host producer would reject one. */
  PyObject *capsule = export_capsule_with(obj, type == kDLCUDA || type == kDLCUDAManaged ? cuda_stream : NULL);
  if (!capsule) return -1;
  int rc = take_capsule(obj, capsule, tensor, leaf);
  Py_DECREF(capsule); /* renamed: its destructor no longer owns the managed tensor */
  return rc;
}
