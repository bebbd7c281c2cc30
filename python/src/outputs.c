/* outputs.c — the output tensors of one transfer, and their conversion to each framework's tensor type.
 *
 * Ownership: one block per part of a transfer holds a DLManagedTensorVersioned for every copied input of the part,
 * their shapes and strides, and one reference to each slab they view (one per part). Every DLPack tensor handed to a framework holds a reference
 * to the block; its deleter drops it. The last reference releases the slab, and only then does its memory go
 * back to the pool: never while any output still views it. Deleters may run on any thread without the GIL
 * (a framework frees its tensors where it likes), so the count is atomic and no Python object is touched.
 *
 * Output rule (which framework an output belongs to, by the input's framework and the direction):
 *   D2H  torch -> torch CPU tensor (pinned: the slab is registered with the driver)
 *        JAX   -> JAX CPU array (numpy array when JAX has no CPU backend)
 *        CuPy, numpy, other producers -> numpy array (the ferry.SlabTensor itself when numpy is missing)
 *   H2D  torch -> torch CUDA tensor;  JAX -> JAX GPU array
 *        numpy, other producers -> CuPy array when CuPy can be imported, else the ferry.SlabTensor
 * torch goes through its DLPack exchange API (no Python call); the others through their from_dlpack with a
 * ferry.SlabTensor, after the copies are done (a consumer may read or copy the data as it imports it).
 */
#include "ferry_py.h"

#include <stdlib.h>
#include <string.h>

struct ferry_py_outputs {
  atomic_long refs;
  ferry_slab **slabs;                   /* one reference each, released with the block */
  size_t n_slabs;
  int device;                           /* the transfer's device */
  const DLPackExchangeAPI *api;         /* the framework of its exchange-path outputs, NULL when none */
  atomic_uintptr_t recorded;            /* 1 + the stream last recorded on the slabs, 0 before any */
  size_t first, count;                  /* its outputs are the transfer's [first, first + count) */
  DLManagedTensorVersioned *entries;    /* one per transfer output; used for copied ones only */
  atomic_uchar *handed;                 /* 1 while entry i is owned by a framework (makes its deleter idempotent) */
  uint8_t *copied;
};

void ferry_py_outputs_ref(ferry_py_outputs *o) { atomic_fetch_add_explicit(&o->refs, 1, memory_order_relaxed); }

void ferry_py_outputs_unref(ferry_py_outputs *o) {
  if (!o || atomic_fetch_sub_explicit(&o->refs, 1, memory_order_acq_rel) != 1) return;
  for (size_t k = 0; k < o->n_slabs; k++) ferry_slab_release(o->slabs[k]);
  free(o);
}

/* A framework dropped one of the block's outputs: work its caller queued on the current stream may still read or
 * write the memory (a non-blocking .to("cuda") of a D2H output, a kernel on an H2D output), so the slabs wait for
 * that stream before the memory is reused. The framework's current_work_stream may raise a Python error, so it is
 * asked only with the GIL held (a framework that frees outputs on a thread of its own is not asked: see
 * ferry.record_stream); consecutive drops on one stream record it once. */
static void record_current_stream(ferry_py_outputs *o) {
  if (!o->api || o->device < 0 || !PyGILState_Check()) return;
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb); /* a deleter may run while an exception propagates */
  void *stream = NULL;
  if (o->api->current_work_stream(kDLCUDA, o->device, &stream) == 0) {
    uintptr_t mark = (uintptr_t)stream + 1;
    if (atomic_exchange(&o->recorded, mark) != mark)
      for (size_t k = 0; k < o->n_slabs; k++) (void)ferry_slab_record_stream(o->slabs[k], stream);
  }
  PyErr_Clear();
  PyErr_Restore(type, value, tb);
}

/* The deleter of the block's own entries. A framework calls it once; ferry also calls it when handing the entry
 * over failed, in case the framework did not (the flag makes the second call a no-op). */
static void entry_deleter(DLManagedTensorVersioned *m) {
  ferry_py_outputs *o = m->manager_ctx;
  size_t i = (size_t)(m - o->entries);
  if (atomic_exchange_explicit(&o->handed[i], 0, memory_order_acq_rel) != 1) return;
  record_current_stream(o);
  ferry_py_outputs_unref(o);
}

ferry_py_outputs *ferry_py_outputs_new(ferry_transfer *ticket, size_t first, size_t count) {
  const ferry_tensor *outs = ferry_transfer_outputs(ticket) + first;
  size_t dims = 0;
  for (size_t i = 0; i < count; i++)
    if (ferry_transfer_output_copied(ticket, first + i) && outs[i].ndim > 0) dims += 2 * (size_t)outs[i].ndim;
  /* One allocation: header, entries, slabs, dims, then the byte flags (alignment falls out of that order). */
  size_t bytes = sizeof(ferry_py_outputs) + count * (sizeof(DLManagedTensorVersioned) + sizeof(ferry_slab *)) +
                 dims * sizeof(int64_t) + 2 * count;
  char *p = calloc(1, bytes);
  if (!p) return NULL;
  ferry_py_outputs *o = (ferry_py_outputs *)p;
  p += sizeof *o;
  o->entries = (DLManagedTensorVersioned *)p;
  p += count * sizeof(DLManagedTensorVersioned);
  o->slabs = (ferry_slab **)p;
  p += count * sizeof(ferry_slab *);
  int64_t *dim = (int64_t *)p;
  p += dims * sizeof(int64_t);
  o->handed = (atomic_uchar *)p;
  p += count;
  o->copied = (uint8_t *)p;
  atomic_init(&o->refs, 1);
  atomic_init(&o->recorded, 0);
  o->first = first;
  o->count = count;
  o->device = ferry_transfer_device(ticket);
  for (size_t i = 0; i < count; i++) {
    if (!ferry_transfer_output_copied(ticket, first + i)) continue;
    o->copied[i] = 1;
    DLManagedTensorVersioned *m = &o->entries[i];
    m->version.major = DLPACK_MAJOR_VERSION;
    m->version.minor = DLPACK_MINOR_VERSION;
    m->manager_ctx = o;
    m->deleter = entry_deleter;
    m->flags = DLPACK_FLAG_BITMASK_IS_COPIED; /* a fresh copy: the consumer may write to it */
    memcpy(&m->dl_tensor, &outs[i], sizeof(DLTensor));
    int32_t nd = outs[i].ndim > 0 ? outs[i].ndim : 0;
    m->dl_tensor.shape = nd ? dim : NULL;
    m->dl_tensor.strides = nd ? dim + nd : NULL;
    if (nd) {
      memcpy(dim, outs[i].shape, (size_t)nd * sizeof(int64_t));
      memcpy(dim + nd, outs[i].strides, (size_t)nd * sizeof(int64_t));
      dim += 2 * nd;
    }
    /* The slabs this block's outputs view (one per part; outputs of a part are consecutive). */
    ferry_slab *slab = ferry_transfer_output_slab(ticket, first + i);
    if (slab && (o->n_slabs == 0 || o->slabs[o->n_slabs - 1] != slab)) {
      ferry_slab_retain(slab);
      o->slabs[o->n_slabs++] = slab;
    }
  }
  return o;
}

int ferry_py_outputs_copied(const ferry_py_outputs *o, size_t index) { return index < o->count && o->copied[index]; }

const DLTensor *ferry_py_outputs_tensor(const ferry_py_outputs *o, size_t index) {
  return &o->entries[index].dl_tensor;
}

/* ---- copies of an entry, for exporters (each __dlpack__ call hands out a new managed tensor) --------------- */

static void copy_deleter(DLManagedTensorVersioned *m) {
  ferry_py_outputs *o = m->manager_ctx;
  free(m);
  ferry_py_outputs_unref(o);
}

static void legacy_copy_deleter(DLManagedTensor *m) {
  ferry_py_outputs *o = m->manager_ctx;
  free(m);
  ferry_py_outputs_unref(o);
}

DLManagedTensorVersioned *ferry_py_outputs_export(ferry_py_outputs *o, size_t index) {
  DLManagedTensorVersioned *m = malloc(sizeof *m);
  if (!m) {
    PyErr_NoMemory();
    return NULL;
  }
  *m = o->entries[index]; /* shape and strides point into the block, which this copy keeps alive */
  m->deleter = copy_deleter;
  ferry_py_outputs_ref(o);
  return m;
}

DLManagedTensor *ferry_py_outputs_export_legacy(ferry_py_outputs *o, size_t index) {
  DLManagedTensor *m = malloc(sizeof *m);
  if (!m) {
    PyErr_NoMemory();
    return NULL;
  }
  m->dl_tensor = o->entries[index].dl_tensor;
  m->manager_ctx = o;
  m->deleter = legacy_copy_deleter;
  ferry_py_outputs_ref(o);
  return m;
}

/* ---- torch: the exchange API --------------------------------------------------------------------------------- */

PyObject *ferry_py_output_exchange(ferry_py_outputs *o, size_t index, const DLPackExchangeAPI *api) {
  DLManagedTensorVersioned *m = &o->entries[index];
  if (!o->api) o->api = api;
  ferry_py_outputs_ref(o);
  atomic_store_explicit(&o->handed[index], 1, memory_order_release);
  void *out = NULL;
  if (api->managed_tensor_to_py_object_no_sync(m, &out) != 0 || !out) {
    entry_deleter(m); /* no-op if the framework already called it */
    if (!PyErr_Occurred())
      PyErr_SetString(PyExc_RuntimeError, "the framework's DLPack exchange API failed to wrap an output");
    return NULL;
  }
  return (PyObject *)out;
}

/* ---- other frameworks: from_dlpack on a ferry.SlabTensor ------------------------------------------------------- */

/* Consumers, imported on first need. NULL: not tried yet; Py_None: not available here. */
static PyObject *numpy_from, *cupy_from, *jax_from, *torch_from;
static int jax_has_cpu = -1;

void ferry_py_outputs_clear_cache(void) {
  Py_CLEAR(numpy_from);
  Py_CLEAR(cupy_from);
  Py_CLEAR(jax_from);
  Py_CLEAR(torch_from);
  jax_has_cpu = -1;
}

/* Imports module.attr once. Returns a borrowed reference, Py_None when the module cannot be imported. */
static PyObject *consumer(PyObject **slot, const char *module, const char *attr) {
  if (*slot) return *slot;
  PyObject *m = PyImport_ImportModule(module);
  PyObject *f = m ? PyObject_GetAttrString(m, attr) : NULL;
  Py_XDECREF(m);
  if (!f) {
    PyErr_Clear();
    f = Py_NewRef(Py_None);
  }
  *slot = f;
  return f;
}

/* Whether JAX has a CPU backend (jax.devices("cpu") succeeds), asked once. */
static bool jax_cpu_available(void) {
  if (jax_has_cpu < 0) {
    PyObject *jax = PyImport_ImportModule("jax");
    PyObject *devices = jax ? PyObject_CallMethod(jax, "devices", "s", "cpu") : NULL;
    jax_has_cpu = devices != NULL;
    Py_XDECREF(devices);
    Py_XDECREF(jax);
    PyErr_Clear();
  }
  return jax_has_cpu == 1;
}

bool ferry_py_device_outputs_to_frameworks = true;

/* The from_dlpack to call for an output (borrowed), or Py_None to return the SlabTensor itself. */
static PyObject *consumer_for(uint8_t family, bool h2d) {
  if (h2d && !ferry_py_device_outputs_to_frameworks) return Py_None;
  PyObject *f = Py_None;
  if (family == FERRY_PY_FAMILY_TORCH) f = consumer(&torch_from, "torch", "from_dlpack");
  else if (family == FERRY_PY_FAMILY_JAX && (h2d || jax_cpu_available()))
    f = consumer(&jax_from, "jax.dlpack", "from_dlpack");
  if (f != Py_None) return f;
  return h2d ? consumer(&cupy_from, "cupy", "from_dlpack") : consumer(&numpy_from, "numpy", "from_dlpack");
}

/* "numpy.from_dlpack" for a function, else its repr. New reference or NULL. */
static PyObject *consumer_name(PyObject *consumer) {
  PyObject *module = PyObject_GetAttrString(consumer, "__module__");
  PyObject *name = module ? PyObject_GetAttrString(consumer, "__qualname__") : NULL;
  PyObject *who;
  if (module && name && PyUnicode_Check(module) && PyUnicode_Check(name)) {
    who = PyUnicode_FromFormat("%U.%U", module, name);
  } else {
    PyErr_Clear();
    who = PyObject_Repr(consumer);
  }
  Py_XDECREF(module);
  Py_XDECREF(name);
  return who;
}

/* A consumer refuses dtypes it cannot hold (numpy: an unknown DLPack code, vector lanes) without saying which
 * tensor or dtype: raise BufferError naming both, with the consumer's error as its cause. Errors that are not
 * about the tensor (MemoryError, KeyboardInterrupt, ...) are left as they are. */
static void name_refused_output(const ferry_py_outputs *o, size_t index, PyObject *consumer) {
  if (!PyErr_ExceptionMatches(PyExc_BufferError) && !PyErr_ExceptionMatches(PyExc_RuntimeError) &&
      !PyErr_ExceptionMatches(PyExc_TypeError) && !PyErr_ExceptionMatches(PyExc_ValueError))
    return;
  PyObject *type, *cause, *tb;
  PyErr_Fetch(&type, &cause, &tb);
  PyErr_NormalizeException(&type, &cause, &tb);
  if (tb) PyException_SetTraceback(cause, tb);
  Py_XDECREF(type);
  Py_XDECREF(tb);
  const DLDataType dt = o->entries[index].dl_tensor.dtype;
  PyObject *who = consumer_name(consumer);
  PyObject *exc = who ? PyObject_CallFunction(PyExc_BufferError, "N",
                                              PyUnicode_FromFormat("%U cannot take output %zu (DLPack dtype code %u, "
                                                                   "%u bits, %u lanes): %S", who, o->first + index,
                                                                   (unsigned)dt.code, (unsigned)dt.bits,
                                                                   (unsigned)dt.lanes, cause))
                      : NULL;
  Py_XDECREF(who);
  if (!exc) {
    Py_DECREF(cause);
    return; /* the error of building the message is raised instead */
  }
  PyException_SetCause(exc, cause); /* steals */
  PyErr_SetObject(PyExc_BufferError, exc);
  Py_DECREF(exc);
}

PyObject *ferry_py_output_wrap(ferry_py_outputs *o, size_t index, uint8_t family, bool h2d) {
  PyObject *exporter = ferry_py_slab_tensor_new(o, index);
  if (!exporter) return NULL;
  PyObject *f = consumer_for(family, h2d);
  if (f == Py_None) return exporter;
  PyObject *out = FERRY_PY_GC_LENT(PyObject_CallOneArg(f, exporter));
  Py_DECREF(exporter);
  if (!out) name_refused_output(o, index, f);
  return out;
}
