/* exporter.c — ferry.SlabTensor: one transfer output, exported through the DLPack protocol.
 *
 * Frameworks without the exchange API import outputs with their from_dlpack (numpy.from_dlpack,
 * cupy.from_dlpack, jax.dlpack.from_dlpack), which calls __dlpack_device__ and __dlpack__ on this object. It is
 * also what an output is when no framework fits (see the rule in outputs.c). A SlabTensor holds one reference to
 * its transfer's output block, and each capsule it hands out holds another, so the slab stays alive while either
 * lives. SlabTensors are made only after the copies are done: their data is ready, and __dlpack__ ignores the
 * consumer's stream.
 */
#include "ferry_py.h"

typedef struct {
  PyObject_HEAD
  ferry_py_outputs *outputs; /* one reference */
  size_t index;
} SlabTensor;

PyObject *ferry_py_slab_tensor_new(ferry_py_outputs *o, size_t index) {
  SlabTensor *self = PyObject_New(SlabTensor, &ferry_py_SlabTensor_Type);
  if (!self) return NULL;
  ferry_py_outputs_ref(o);
  self->outputs = o;
  self->index = index;
  return (PyObject *)self;
}

static void slab_tensor_dealloc(SlabTensor *self) {
  ferry_py_outputs_unref(self->outputs);
  PyObject_Free(self);
}

static const DLTensor *tensor_of(SlabTensor *self) { return ferry_py_outputs_tensor(self->outputs, self->index); }

/* ---- the DLPack protocol ------------------------------------------------------------------------------------- */

/* A capsule nobody consumed still owns its managed tensor: release it. A consumed one was renamed "used_...". */
static void versioned_capsule_destructor(PyObject *capsule) {
  if (!PyCapsule_IsValid(capsule, "dltensor_versioned")) return;
  DLManagedTensorVersioned *m = PyCapsule_GetPointer(capsule, "dltensor_versioned");
  if (m && m->deleter) m->deleter(m);
}

static void legacy_capsule_destructor(PyObject *capsule) {
  if (!PyCapsule_IsValid(capsule, "dltensor")) return;
  DLManagedTensor *m = PyCapsule_GetPointer(capsule, "dltensor");
  if (m && m->deleter) m->deleter(m);
}

static PyObject *slab_tensor_dlpack(SlabTensor *self, PyObject *args, PyObject *kwargs) {
  static char *keywords[] = {"stream", "max_version", "dl_device", "copy", NULL};
  PyObject *stream = Py_None, *max_version = Py_None, *dl_device = Py_None, *copy = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|$OOOO:__dlpack__", keywords, &stream, &max_version, &dl_device,
                                   &copy))
    return NULL;
  (void)stream; /* the data is ready before any SlabTensor exists: nothing to order */
  const DLTensor *t = tensor_of(self);
  if (dl_device != Py_None) {
    int type, id;
    if (!PyArg_ParseTuple(dl_device, "ii:__dlpack__ dl_device", &type, &id)) return NULL;
    if (type != (int)t->device.device_type || id != (int)t->device.device_id) {
      PyErr_Format(PyExc_BufferError, "ferry.SlabTensor lives on device (%d, %d) and cannot export to (%d, %d)",
                   (int)t->device.device_type, (int)t->device.device_id, type, id);
      return NULL;
    }
  }
  if (copy == Py_True) {
    PyErr_SetString(PyExc_BufferError, "ferry.SlabTensor exports its own memory; copy=True is not supported");
    return NULL;
  }
  int major = 0;
  if (max_version != Py_None) {
    int minor;
    if (!PyArg_ParseTuple(max_version, "ii:__dlpack__ max_version", &major, &minor)) return NULL;
  }
  if (major >= DLPACK_MAJOR_VERSION) {
    DLManagedTensorVersioned *m = ferry_py_outputs_export(self->outputs, self->index);
    if (!m) return NULL;
    PyObject *capsule = PyCapsule_New(m, "dltensor_versioned", versioned_capsule_destructor);
    if (!capsule) m->deleter(m);
    return capsule;
  }
  /* A consumer that predates DLPack 1.0 (no max_version): the legacy struct. */
  DLManagedTensor *m = ferry_py_outputs_export_legacy(self->outputs, self->index);
  if (!m) return NULL;
  PyObject *capsule = PyCapsule_New(m, "dltensor", legacy_capsule_destructor);
  if (!capsule) m->deleter(m);
  return capsule;
}

static PyObject *slab_tensor_dlpack_device(SlabTensor *self, PyObject *unused) {
  const DLTensor *t = tensor_of(self);
  return Py_BuildValue("(ii)", (int)t->device.device_type, (int)t->device.device_id);
}

/* ---- description ------------------------------------------------------------------------------------------- */

static PyObject *dims_tuple(const DLTensor *t, const int64_t *dims) {
  PyObject *tuple = PyTuple_New(t->ndim);
  for (int32_t i = 0; tuple && i < t->ndim; i++) {
    PyObject *v = PyLong_FromLongLong(dims[i]);
    if (!v) Py_CLEAR(tuple);
    else PyTuple_SET_ITEM(tuple, i, v);
  }
  return tuple;
}

static PyObject *slab_tensor_shape(SlabTensor *self, void *unused) {
  const DLTensor *t = tensor_of(self);
  return dims_tuple(t, t->shape);
}

static PyObject *slab_tensor_strides(SlabTensor *self, void *unused) {
  const DLTensor *t = tensor_of(self);
  return dims_tuple(t, t->strides);
}

static PyObject *slab_tensor_dtype(SlabTensor *self, void *unused) {
  DLDataType d = tensor_of(self)->dtype;
  const char *base = NULL;
  switch (d.code) {
  case kDLInt: base = "int"; break;
  case kDLUInt: base = "uint"; break;
  case kDLFloat: base = "float"; break;
  case kDLBfloat: base = "bfloat"; break;
  case kDLComplex: base = "complex"; break;
  case kDLBool: return PyUnicode_FromString(d.lanes == 1 ? "bool" : "bool_vector");
  }
  if (base && d.lanes == 1) return PyUnicode_FromFormat("%s%d", base, (int)d.bits);
  return PyUnicode_FromFormat("dlpack(code=%d, bits=%d, lanes=%d)", (int)d.code, (int)d.bits, (int)d.lanes);
}

static PyObject *slab_tensor_device(SlabTensor *self, void *unused) {
  const DLTensor *t = tensor_of(self);
  if (t->device.device_type == kDLCPU) return PyUnicode_FromString("cpu");
  if (t->device.device_type == kDLCUDA) return PyUnicode_FromFormat("cuda:%d", (int)t->device.device_id);
  return PyUnicode_FromFormat("dlpack_device(%d, %d)", (int)t->device.device_type, (int)t->device.device_id);
}

static PyObject *slab_tensor_data_ptr(SlabTensor *self, void *unused) {
  const DLTensor *t = tensor_of(self);
  return PyLong_FromVoidPtr((char *)t->data + t->byte_offset);
}

static PyObject *slab_tensor_nbytes(SlabTensor *self, void *unused) {
  uint64_t n = 0;
  ferry_status st = ferry_tensor_nbytes((const ferry_tensor *)tensor_of(self), &n);
  if (st != FERRY_OK) return ferry_py_raise(st);
  return PyLong_FromUnsignedLongLong(n);
}

static PyObject *slab_tensor_repr(SlabTensor *self) {
  PyObject *shape = slab_tensor_shape(self, NULL), *dtype = slab_tensor_dtype(self, NULL);
  PyObject *device = slab_tensor_device(self, NULL), *r = NULL;
  if (shape && dtype && device)
    r = PyUnicode_FromFormat("ferry.SlabTensor(shape=%R, dtype=%U, device=%U)", shape, dtype, device);
  Py_XDECREF(shape);
  Py_XDECREF(dtype);
  Py_XDECREF(device);
  return r;
}

static PyMethodDef slab_tensor_methods[] = {
    {"__dlpack__", (PyCFunction)(void (*)(void))slab_tensor_dlpack, METH_VARARGS | METH_KEYWORDS,
     "__dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None)\n--\n\n"
     "Exports this output as a DLPack capsule (\"dltensor_versioned\" when max_version >= (1, 0), else the\n"
     "legacy \"dltensor\"). The capsule keeps the transfer's slab alive until the consumer releases it."},
    {"__dlpack_device__", (PyCFunction)slab_tensor_dlpack_device, METH_NOARGS,
     "__dlpack_device__()\n--\n\n(device_type, device_id) in DLPack's numbering: (1, 0) host, (2, N) cuda:N."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef slab_tensor_getset[] = {
    {"shape", (getter)slab_tensor_shape, NULL, "Shape, a tuple of ints.", NULL},
    {"strides", (getter)slab_tensor_strides, NULL, "Strides in elements (compact row-major).", NULL},
    {"dtype", (getter)slab_tensor_dtype, NULL, "Element type name (\"float32\", \"uint8\", \"bfloat16\", ...).", NULL},
    {"device", (getter)slab_tensor_device, NULL, "\"cpu\" or \"cuda:N\".", NULL},
    {"data_ptr", (getter)slab_tensor_data_ptr, NULL, "Address of the first element.", NULL},
    {"nbytes", (getter)slab_tensor_nbytes, NULL, "Bytes of the elements.", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

PyTypeObject ferry_py_SlabTensor_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ferry.SlabTensor",
    .tp_basicsize = sizeof(SlabTensor),
    .tp_dealloc = (destructor)slab_tensor_dealloc,
    .tp_repr = (reprfunc)slab_tensor_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One output of a ferry transfer, viewing the transfer's slab, exported through DLPack.\n\n"
              "ferry returns these where no framework fits the output (see the output rule in ferry's docs);\n"
              "pass one to any from_dlpack (numpy, CuPy, JAX, torch) to get a zero-copy array. The slab's memory\n"
              "returns to ferry's pool only when this object and every array imported from it are gone.",
    .tp_methods = slab_tensor_methods,
    .tp_getset = slab_tensor_getset,
};
