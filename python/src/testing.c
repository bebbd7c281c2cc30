/* testing.c — private test hooks, compiled only with FERRY_PYTHON_TEST_HOOKS (the project's own build, never a
 * wheel): a simulated one-device CUDA driver, so the CPU test suite can drive the whole D2H/H2D path from Python.
 *
 * The simulation: "device memory" is host memory, copies are memcpy done at submission, the gather kernel's work
 * items run on the CPU through the library's own reference (ferry__gather_item_run_host), and pinned memory is
 * any range registered with cuMemHostRegister (cuPointerGetAttribute answers for it). Events complete at once,
 * unless held: while _sim_hold(True) is in force they report CUDA_ERROR_NOT_READY until something synchronises,
 * which is how tests see done() == False and slabs parked until their copies "finish". It is installed through the
 * library's test seam (src/driver.h), which works only before the first call that loads the driver.
 *
 * Hooks (all underscored, in ferry._ferry):
 *   _sim_install()            use the simulation; RuntimeError if the real driver is already loaded. Also keeps
 *                             H2D outputs as ferry.SlabTensor (no CuPy/JAX conversion of simulated device memory)
 *   _sim_frameworks(flag)     let H2D outputs go to CuPy/JAX again (a test's control); returns the old flag
 *   _sim_hold(flag)           hold events incomplete until the next synchronisation
 *   _sim_counters()           live streams, events, device allocations and registered ranges (leak checks)
 *   _sim_fault(call, nth, cu) make the nth call of a driver entry fail with CUresult `cu` (0 disarms)
 *   _sim_submit_delay_us(us)  every event record sleeps `us` microseconds (0: none): a slow submission, as a
 *                             batch of thousands of tensors is; returns the old value
 *   _sim_foreign_stream()     a stream handle that belongs to a second (non-primary) context of cuda:0
 *   _sim_read_delay_us(us)    reading a _SimExchangeTensor takes `us` microseconds of CPU, GIL held (0: none): a
 *                             slow producer, to make GIL holds long enough to see; returns the old value
 *   _sim_set_shape(t, shape)  changes a _SimExchangeTensor's shape in place (same rank), as torch's resize_ does
 *   _sim_null_data(t)         makes a _SimExchangeTensor export a NULL data pointer, as a producer with no storage
 *   _exchange_costs(tensors)  for a list of tensors of one exchange-API type (torch's on a GPU machine): the
 *                             nanoseconds per tensor of reading each one (dltensor_from_py_object_no_sync), of
 *                             making an output object per tensor (managed_tensor_to_py_object_no_sync, viewing a
 *                             static buffer) and of freeing those objects: the framework's own floor
 *   _SimDeviceArray(array, device=0)   exports a numpy array as if it lived on cuda:<device>
 *   _SimExchangeTensor(array, device=0) the same through the DLPack exchange API (torch's path); device=-1: host
 *   _sim_read(obj)            the bytes of a compact DLPack tensor in simulated device memory
 */
#include "ferry_py.h"

#include "internal.h" /* the driver table and the gather reference: private to the library, test seam only */

#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- the simulated driver ----------------------------------------------------------------------------------- */

static char ctx_token, module_token, function_token, pool_token;
static char foreign_ctx_token, foreign_stream_token; /* a stream created in another context of cuda:0 */
static atomic_int live_streams, live_events, live_allocs, hold_events;
static atomic_llong alloc_bytes;

#define MAX_REGISTERED 64
static struct { char *base; size_t size; } registered[MAX_REGISTERED];
static int n_registered;
static pthread_mutex_t registered_lock = PTHREAD_MUTEX_INITIALIZER;

static CUresult sim_init(unsigned flags) { return CUDA_SUCCESS; }
static CUresult sim_version(int *v) { *v = 13000; return CUDA_SUCCESS; }
static CUresult sim_no_string(CUresult r, const char **s) { *s = NULL; return CUDA_ERROR_INVALID_VALUE; }
static CUresult sim_count(int *n) { *n = 1; return CUDA_SUCCESS; }
static CUresult sim_device_get(CUdevice *d, int i) { return i == 0 ? (*d = 0, CUDA_SUCCESS) : CUDA_ERROR_INVALID_DEVICE; }
static CUresult sim_name(char *s, int n, CUdevice d) { snprintf(s, (size_t)n, "ferry simulated device"); return CUDA_SUCCESS; }
static CUresult sim_attribute(int *v, CUdevice_attribute a, CUdevice d) { *v = 2; return CUDA_SUCCESS; }
static CUresult sim_total_mem(size_t *b, CUdevice d) { *b = (size_t)1 << 30; return CUDA_SUCCESS; }
static CUresult sim_ctx_retain(CUcontext *c, CUdevice d) { *c = (CUcontext)&ctx_token; return CUDA_SUCCESS; }
static CUresult sim_ctx_push(CUcontext c) { return CUDA_SUCCESS; }
static CUresult sim_ctx_pop(CUcontext *c) { *c = (CUcontext)&ctx_token; return CUDA_SUCCESS; }
static CUresult sim_ctx_device(CUdevice *d) { *d = 0; return CUDA_SUCCESS; }
static CUresult sim_stream_create(CUstream *s, unsigned f) {
  *s = malloc(1);
  atomic_fetch_add(&live_streams, 1);
  return CUDA_SUCCESS;
}
static CUresult sim_stream_destroy(CUstream s) {
  free(s);
  atomic_fetch_sub(&live_streams, 1);
  return CUDA_SUCCESS;
}
static CUresult sim_stream_ctx(CUstream s, CUcontext *c) {
  *c = s == (CUstream)&foreign_stream_token ? (CUcontext)&foreign_ctx_token : (CUcontext)&ctx_token;
  return CUDA_SUCCESS;
}
static CUresult sim_stream_wait(CUstream s, CUevent e, unsigned f) { return CUDA_SUCCESS; }
static CUresult sim_is_capturing(CUstream s, CUstreamCaptureStatus *st) {
  *st = CU_STREAM_CAPTURE_STATUS_NONE;
  return CUDA_SUCCESS;
}
static CUresult sim_capture_mode(CUstreamCaptureMode *m) { return CUDA_SUCCESS; }
/* Synchronising lets the simulated device catch up: held events complete. */
static CUresult sim_synchronize(void) {
  atomic_store(&hold_events, 0);
  return CUDA_SUCCESS;
}
static CUresult sim_stream_sync(CUstream s) { return sim_synchronize(); }
static CUresult sim_event_create(CUevent *e, unsigned f) {
  *e = malloc(1);
  atomic_fetch_add(&live_events, 1);
  return CUDA_SUCCESS;
}
static CUresult sim_event_destroy(CUevent e) {
  free(e);
  atomic_fetch_sub(&live_events, 1);
  return CUDA_SUCCESS;
}
static atomic_int record_delay_us; /* _sim_submit_delay_us: every event record takes this long */
static CUresult sim_event_record(CUevent e, CUstream s) {
  int us = atomic_load(&record_delay_us);
  if (us > 0) {
    struct timespec ts = {us / 1000000, (long)(us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0) {} /* resumed with the remainder after a signal */
  }
  return CUDA_SUCCESS;
}
static CUresult sim_event_query(CUevent e) { return atomic_load(&hold_events) ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS; }
static CUresult sim_event_sync(CUevent e) { return sim_synchronize(); }
static CUresult sim_register(void *p, size_t n, unsigned f) {
  pthread_mutex_lock(&registered_lock);
  CUresult r = CUDA_ERROR_OUT_OF_MEMORY;
  if (n_registered < MAX_REGISTERED) {
    registered[n_registered].base = p;
    registered[n_registered].size = n;
    n_registered++;
    r = CUDA_SUCCESS;
  }
  pthread_mutex_unlock(&registered_lock);
  return r;
}
static CUresult sim_unregister(void *p) {
  CUresult r = CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
  pthread_mutex_lock(&registered_lock);
  for (int i = 0; i < n_registered; i++)
    if (registered[i].base == p) {
      registered[i] = registered[--n_registered];
      r = CUDA_SUCCESS;
      break;
    }
  pthread_mutex_unlock(&registered_lock);
  return r;
}
static CUresult sim_pool_create(CUmemoryPool *p, const CUmemPoolProps *props) {
  *p = (CUmemoryPool)&pool_token;
  return CUDA_SUCCESS;
}
static CUresult sim_pool_destroy(CUmemoryPool p) { return CUDA_SUCCESS; }
static CUresult sim_pool_set(CUmemoryPool p, CUmemPool_attribute a, void *v) { return CUDA_SUCCESS; }
static CUresult sim_alloc(CUdeviceptr *d, size_t n, CUmemoryPool p, CUstream s) {
  size_t size = (n + 255) / 256 * 256;
  void *m = aligned_alloc(256, size ? size : 256);
  if (!m) return CUDA_ERROR_OUT_OF_MEMORY;
  atomic_fetch_add(&live_allocs, 1);
  atomic_fetch_add(&alloc_bytes, (long long)n);
  *d = (CUdeviceptr)(uintptr_t)m;
  return CUDA_SUCCESS;
}
static CUresult sim_free(CUdeviceptr d, CUstream s) {
  free((void *)(uintptr_t)d);
  atomic_fetch_sub(&live_allocs, 1);
  return CUDA_SUCCESS;
}
static CUresult sim_copy(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  memcpy((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
  return CUDA_SUCCESS;
}
static CUresult sim_htod(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
  memcpy((void *)(uintptr_t)dst, src, n);
  return CUDA_SUCCESS;
}
/* Registered (pinned) host memory is addressable by the device at the same address; nothing else is. */
static CUresult sim_pointer_attribute(void *value, CUpointer_attribute a, CUdeviceptr p) {
  CUresult r = CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&registered_lock);
  for (int i = 0; i < n_registered; i++) {
    char *base = registered[i].base;
    if ((char *)(uintptr_t)p < base || (char *)(uintptr_t)p >= base + registered[i].size) continue;
    if (a == CU_POINTER_ATTRIBUTE_DEVICE_POINTER) *(CUdeviceptr *)value = p, r = CUDA_SUCCESS;
    else if (a == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR) *(CUdeviceptr *)value = (CUdeviceptr)(uintptr_t)base, r = CUDA_SUCCESS;
    else if (a == CU_POINTER_ATTRIBUTE_RANGE_SIZE) *(size_t *)value = registered[i].size, r = CUDA_SUCCESS;
    break;
  }
  pthread_mutex_unlock(&registered_lock);
  return r;
}
static CUresult sim_module_load(CUmodule *m, const void *image) { *m = (CUmodule)&module_token; return CUDA_SUCCESS; }
static CUresult sim_module_unload(CUmodule m) { return CUDA_SUCCESS; }
static CUresult sim_function(CUfunction *f, CUmodule m, const char *name) {
  *f = (CUfunction)&function_token;
  return CUDA_SUCCESS;
}
/* The gather kernel: one work item per block, run on the CPU by the library's reference implementation. */
static CUresult sim_launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                           unsigned shared, CUstream s, void **params, void **extra) {
  const ferry__gather_item *items = (const ferry__gather_item *)(uintptr_t)*(CUdeviceptr *)params[0];
  const ferry__gather_layout *layouts = (const ferry__gather_layout *)(uintptr_t)*(CUdeviceptr *)params[1];
  for (unsigned i = 0; i < gx; i++) ferry__gather_item_run_host(&items[i], layouts);
  return CUDA_SUCCESS;
}
static CUresult sim_batch(CUdeviceptr *dst, CUdeviceptr *src, size_t *sizes, size_t count, CUmemcpyAttributes *attrs,
                          size_t *attr_index, size_t n_attrs, CUstream s) {
  for (size_t i = 0; i < count; i++) memcpy((void *)(uintptr_t)dst[i], (const void *)(uintptr_t)src[i], sizes[i]);
  return CUDA_SUCCESS;
}

static ferry__driver sim_driver = {
    .cuInit = sim_init, .cuDriverGetVersion = sim_version, .cuGetErrorName = sim_no_string,
    .cuGetErrorString = sim_no_string, .cuDeviceGetCount = sim_count, .cuDeviceGet = sim_device_get,
    .cuDeviceGetName = sim_name, .cuDeviceGetAttribute = sim_attribute, .cuDeviceTotalMem = sim_total_mem,
    .cuDevicePrimaryCtxRetain = sim_ctx_retain, .cuCtxPushCurrent = sim_ctx_push, .cuCtxPopCurrent = sim_ctx_pop,
    .cuCtxGetDevice = sim_ctx_device, .cuStreamCreate = sim_stream_create, .cuStreamDestroy = sim_stream_destroy,
    .cuStreamGetCtx = sim_stream_ctx, .cuStreamWaitEvent = sim_stream_wait, .cuStreamSynchronize = sim_stream_sync,
    .cuStreamIsCapturing = sim_is_capturing, .cuThreadExchangeStreamCaptureMode = sim_capture_mode,
    .cuEventCreate = sim_event_create, .cuEventDestroy = sim_event_destroy, .cuEventRecord = sim_event_record,
    .cuEventQuery = sim_event_query, .cuEventSynchronize = sim_event_sync, .cuMemHostRegister = sim_register,
    .cuMemHostUnregister = sim_unregister, .cuMemPoolCreate = sim_pool_create, .cuMemPoolDestroy = sim_pool_destroy,
    .cuMemPoolSetAttribute = sim_pool_set, .cuMemAllocFromPoolAsync = sim_alloc, .cuMemFreeAsync = sim_free,
    .cuMemcpyAsync = sim_copy, .cuMemcpyHtoDAsync = sim_htod, .cuPointerGetAttribute = sim_pointer_attribute,
    .cuModuleLoadData = sim_module_load, .cuModuleUnload = sim_module_unload, .cuModuleGetFunction = sim_function,
    .cuLaunchKernel = sim_launch, .cuMemcpyBatchAsync_v13 = sim_batch, .version = 13000,
};

/* ---- hooks -------------------------------------------------------------------------------------------------- */

static PyObject *sim_install(PyObject *self, PyObject *unused) {
  ferry__driver_install(&sim_driver);
  ferry_status st = ferry_init();
  if (st != FERRY_OK || ferry__drv.cuInit != sim_init) {
    PyErr_SetString(PyExc_RuntimeError, "_sim_install(): the driver was already loaded in this process; install the "
                                        "simulation before any other ferry call");
    return NULL;
  }
  /* Simulated device pointers are host memory: never hand them to CuPy or JAX (on a GPU machine they are
   * importable, and would pass them to the real driver). H2D outputs stay ferry.SlabTensor. */
  ferry_py_device_outputs_to_frameworks = false;
  Py_RETURN_NONE;
}

static PyObject *sim_submit_delay_us(PyObject *self, PyObject *arg) {
  long us = PyLong_AsLong(arg);
  if (us == -1 && PyErr_Occurred()) return NULL;
  if (us < 0 || us > 10000000) {
    PyErr_Format(PyExc_ValueError, "_sim_submit_delay_us(%ld): expected 0 to 10000000 microseconds", us);
    return NULL;
  }
  return PyLong_FromLong(atomic_exchange(&record_delay_us, (int)us));
}

static PyObject *sim_hold(PyObject *self, PyObject *flag) {
  int on = PyObject_IsTrue(flag);
  if (on < 0) return NULL;
  atomic_store(&hold_events, on);
  Py_RETURN_NONE;
}

static PyObject *sim_counters(PyObject *self, PyObject *unused) {
  pthread_mutex_lock(&registered_lock);
  int regs = n_registered;
  pthread_mutex_unlock(&registered_lock);
  return Py_BuildValue("{s:i,s:i,s:i,s:L,s:i}", "streams", atomic_load(&live_streams), "events",
                       atomic_load(&live_events), "device_allocations", atomic_load(&live_allocs),
                       "device_bytes_allocated_total", (long long)atomic_load(&alloc_bytes), "registered_ranges",
                       regs);
}

static PyObject *sim_fault(PyObject *self, PyObject *args) {
  const char *call;
  int nth, result;
  if (!PyArg_ParseTuple(args, "sii:_sim_fault", &call, &nth, &result)) return NULL;
  if (result == 0) ferry__fault_disarm();
  else ferry__fault_arm(call, nth, (CUresult)result);
  Py_RETURN_NONE;
}

static PyObject *sim_foreign_stream(PyObject *self, PyObject *unused) {
  return PyLong_FromVoidPtr(&foreign_stream_token);
}

/* The bytes of a compact tensor exported through DLPack (simulated device memory is host memory). */
static PyObject *sim_read(PyObject *self, PyObject *obj) {
  PyObject *capsule = PyObject_CallMethod(obj, "__dlpack__", NULL);
  if (!capsule) return NULL;
  PyObject *bytes = NULL;
  DLManagedTensor *m = PyCapsule_IsValid(capsule, "dltensor") ? PyCapsule_GetPointer(capsule, "dltensor") : NULL;
  if (!m) {
    PyErr_SetString(PyExc_TypeError, "_sim_read: expected a legacy DLPack capsule from __dlpack__()");
    goto done;
  }
  uint64_t n = 0;
  ferry_status st = ferry_tensor_nbytes((const ferry_tensor *)&m->dl_tensor, &n);
  if (st != FERRY_OK) {
    ferry_py_raise(st);
    goto done;
  }
  for (int32_t d = m->dl_tensor.ndim - 1, expect = 1; m->dl_tensor.strides && d >= 0; d--) {
    if (m->dl_tensor.shape[d] != 1 && m->dl_tensor.strides[d] != expect) {
      PyErr_SetString(PyExc_ValueError, "_sim_read: the tensor is not compact");
      goto done;
    }
    expect *= (int32_t)m->dl_tensor.shape[d];
  }
  bytes = PyBytes_FromStringAndSize(n ? (const char *)m->dl_tensor.data + m->dl_tensor.byte_offset : "",
                                    (Py_ssize_t)n);
done:
  Py_DECREF(capsule); /* not renamed: its destructor calls the deleter */
  return bytes;
}

/* ---- _SimDeviceArray: a numpy array that says it lives on cuda:<device> -------------------------------------- */

typedef struct {
  PyObject_HEAD
  PyObject *array;       /* the host array whose memory plays device memory */
  int device;
  PyObject *last_stream; /* the stream argument of the last __dlpack__ call (what ferry asked for) */
  int exports;           /* __dlpack__ calls */
  int released;          /* deleters run */
} SimDeviceArray;

typedef struct {
  DLManagedTensorVersioned outer;
  DLManagedTensorVersioned *inner; /* numpy's, released with ours */
  SimDeviceArray *owner;           /* strong: counts releases (its deleter runs with the GIL, as ferry's does) */
} sim_export;

static void sim_export_deleter(DLManagedTensorVersioned *m) {
  sim_export *e = (sim_export *)m;
  PyGILState_STATE g = PyGILState_Ensure();
  if (e->inner->deleter) e->inner->deleter(e->inner);
  e->owner->released++;
  Py_DECREF(e->owner);
  PyGILState_Release(g);
  free(e);
}

static void sim_export_capsule_destructor(PyObject *capsule) {
  if (!PyCapsule_IsValid(capsule, "dltensor_versioned")) return;
  DLManagedTensorVersioned *m = PyCapsule_GetPointer(capsule, "dltensor_versioned");
  m->deleter(m);
}

static PyObject *sim_array_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
  static char *keywords[] = {"array", "device", NULL};
  PyObject *array;
  int device = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|i:_SimDeviceArray", keywords, &array, &device)) return NULL;
  SimDeviceArray *self = (SimDeviceArray *)type->tp_alloc(type, 0);
  if (!self) return NULL;
  self->array = Py_NewRef(array);
  self->device = device;
  self->last_stream = Py_NewRef(Py_None);
  return (PyObject *)self;
}

static void sim_array_dealloc(SimDeviceArray *self) {
  Py_CLEAR(self->array);
  Py_CLEAR(self->last_stream);
  Py_TYPE(self)->tp_free(self);
}

static PyObject *sim_array_dlpack(SimDeviceArray *self, PyObject *args, PyObject *kwargs) {
  static char *keywords[] = {"stream", "max_version", "dl_device", "copy", NULL};
  PyObject *stream = Py_None, *max_version = Py_None, *dl_device = Py_None, *copy = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|$OOOO:__dlpack__", keywords, &stream, &max_version, &dl_device,
                                   &copy))
    return NULL;
  Py_SETREF(self->last_stream, Py_NewRef(stream));
  self->exports++;
  PyObject *kw = Py_BuildValue("{s:(ii)}", "max_version", 1, 0);
  if (!kw) return NULL;
  PyObject *method = PyObject_GetAttrString(self->array, "__dlpack__"), *empty = PyTuple_New(0);
  PyObject *capsule = method && empty ? PyObject_Call(method, empty, kw) : NULL;
  Py_XDECREF(method);
  Py_XDECREF(empty);
  Py_DECREF(kw);
  if (!capsule) return NULL;
  DLManagedTensorVersioned *inner =
      PyCapsule_IsValid(capsule, "dltensor_versioned") ? PyCapsule_GetPointer(capsule, "dltensor_versioned") : NULL;
  if (!inner || PyCapsule_SetName(capsule, "used_dltensor_versioned") < 0) {
    Py_DECREF(capsule);
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "_SimDeviceArray needs an array with DLPack >= 1.0");
    return NULL;
  }
  Py_DECREF(capsule);
  sim_export *e = calloc(1, sizeof *e);
  if (!e) {
    if (inner->deleter) inner->deleter(inner);
    return PyErr_NoMemory();
  }
  e->outer = *inner;
  e->outer.dl_tensor.device.device_type = kDLCUDA;
  e->outer.dl_tensor.device.device_id = self->device;
  e->outer.deleter = sim_export_deleter;
  e->inner = inner;
  e->owner = (SimDeviceArray *)Py_NewRef(self);
  PyObject *out = PyCapsule_New(&e->outer, "dltensor_versioned", sim_export_capsule_destructor);
  if (!out) sim_export_deleter(&e->outer);
  return out;
}

static PyObject *sim_array_dlpack_device(SimDeviceArray *self, PyObject *unused) {
  return Py_BuildValue("(ii)", (int)kDLCUDA, self->device);
}

static PyObject *sim_array_get_last_stream(SimDeviceArray *self, void *unused) { return Py_NewRef(self->last_stream); }
static PyObject *sim_array_get_exports(SimDeviceArray *self, void *unused) { return PyLong_FromLong(self->exports); }
static PyObject *sim_array_get_released(SimDeviceArray *self, void *unused) { return PyLong_FromLong(self->released); }

static PyMethodDef sim_array_methods[] = {
    {"__dlpack__", (PyCFunction)(void (*)(void))sim_array_dlpack, METH_VARARGS | METH_KEYWORDS, NULL},
    {"__dlpack_device__", (PyCFunction)sim_array_dlpack_device, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef sim_array_getset[] = {
    {"last_stream", (getter)sim_array_get_last_stream, NULL, "stream= of the last __dlpack__ call", NULL},
    {"exports", (getter)sim_array_get_exports, NULL, "number of __dlpack__ calls", NULL},
    {"released", (getter)sim_array_get_released, NULL, "number of exported tensors released", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject SimDeviceArray_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ferry._ferry._SimDeviceArray",
    .tp_basicsize = sizeof(SimDeviceArray),
    .tp_dealloc = (destructor)sim_array_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Test hook: a numpy array exported through DLPack as if it lived on cuda:<device>.",
    .tp_methods = sim_array_methods,
    .tp_getset = sim_array_getset,
    .tp_new = sim_array_new,
};

/* ---- _SimExchangeTensor: a producer and consumer through the DLPack exchange API, as torch is ----------------- *
 *
 * _SimExchangeTensor(array, device=0) views a numpy array as a tensor on cuda:<device> (device=-1: on the host);
 * its type carries __dlpack_c_exchange_api__, so ferry reads it with dltensor_from_py_object_no_sync and builds its
 * outputs with managed_tensor_to_py_object_no_sync (as _SimExchangeTensor objects owning ferry's managed tensor),
 * the path torch takes on the GPU. Outputs have .device ((type, id)), .shape and .tobytes(). */

typedef struct {
  PyObject_HEAD
  PyObject *array;                   /* input: the numpy array viewed; NULL for an output */
  DLManagedTensorVersioned *managed; /* input: numpy's export of it; output: ferry's (deleter called at dealloc) */
  int32_t device_type, device_id;
} SimExchangeTensor;

static PyTypeObject SimExchangeTensor_Type;

static atomic_int read_delay_us; /* _sim_read_delay_us */

static int64_t sim_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int sim_exchange_from_object(void *obj, DLTensor *out) {
  if (Py_TYPE((PyObject *)obj) != &SimExchangeTensor_Type) {
    PyErr_SetString(PyExc_TypeError, "not a _SimExchangeTensor");
    return -1;
  }
  int delay = atomic_load(&read_delay_us);
  if (delay)
    for (int64_t until = sim_now_ns() + (int64_t)delay * 1000; sim_now_ns() < until;) {
    }
  SimExchangeTensor *t = obj;
  *out = t->managed->dl_tensor;
  out->device.device_type = (DLDeviceType)t->device_type;
  out->device.device_id = t->device_id;
  return 0;
}

static int sim_exchange_to_object(DLManagedTensorVersioned *m, void **out) {
  SimExchangeTensor *t = PyObject_New(SimExchangeTensor, &SimExchangeTensor_Type);
  if (!t) {
    m->deleter(m); /* the exchange contract: the consumer owns the tensor, also on failure */
    return -1;
  }
  t->array = NULL;
  t->managed = m;
  t->device_type = m->dl_tensor.device.device_type;
  t->device_id = m->dl_tensor.device.device_id;
  *out = t;
  return 0;
}

static int sim_exchange_current_stream(DLDeviceType type, int32_t id, void **out) {
  *out = NULL; /* the legacy default stream */
  return 0;
}

static int sim_exchange_unsupported_from(void *obj, DLManagedTensorVersioned **out) {
  PyErr_SetString(PyExc_NotImplementedError, "_SimExchangeTensor: managed_tensor_from_py_object_no_sync");
  return -1;
}

static int sim_exchange_unsupported_alloc(DLTensor *p, DLManagedTensorVersioned **out, void *ctx,
                                          void (*set_error)(void *, const char *, const char *)) {
  set_error(ctx, "NotImplementedError", "_SimExchangeTensor: managed_tensor_allocator");
  return -1;
}

static DLPackExchangeAPI sim_exchange_api = {
    .header = {.version = {DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION}, .prev_api = NULL},
    .managed_tensor_allocator = sim_exchange_unsupported_alloc,
    .managed_tensor_from_py_object_no_sync = sim_exchange_unsupported_from,
    .managed_tensor_to_py_object_no_sync = sim_exchange_to_object,
    .dltensor_from_py_object_no_sync = sim_exchange_from_object,
    .current_work_stream = sim_exchange_current_stream,
};

static PyObject *sim_exchange_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
  static char *keywords[] = {"array", "device", NULL};
  PyObject *array;
  int device = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|i:_SimExchangeTensor", keywords, &array, &device)) return NULL;
  PyObject *kw = Py_BuildValue("{s:(ii)}", "max_version", 1, 0), *method = PyObject_GetAttrString(array, "__dlpack__");
  PyObject *empty = PyTuple_New(0);
  PyObject *capsule = kw && method && empty ? PyObject_Call(method, empty, kw) : NULL;
  DLManagedTensorVersioned *m;
  Py_XDECREF(kw);
  Py_XDECREF(method);
  Py_XDECREF(empty);
  if (!capsule) return NULL;
  m = PyCapsule_IsValid(capsule, "dltensor_versioned") ? PyCapsule_GetPointer(capsule, "dltensor_versioned") : NULL;
  if (!m || PyCapsule_SetName(capsule, "used_dltensor_versioned") < 0) {
    Py_DECREF(capsule);
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "_SimExchangeTensor: no DLPack 1.x capsule");
    return NULL;
  }
  Py_DECREF(capsule);
  SimExchangeTensor *self = (SimExchangeTensor *)type->tp_alloc(type, 0);
  if (!self) {
    if (m->deleter) m->deleter(m);
    return NULL;
  }
  self->array = Py_NewRef(array);
  self->managed = m;
  self->device_type = device >= 0 ? kDLCUDA : kDLCPU;
  self->device_id = device >= 0 ? device : 0;
  return (PyObject *)self;
}

static void sim_exchange_dealloc(SimExchangeTensor *self) {
  if (self->managed && self->managed->deleter) self->managed->deleter(self->managed);
  Py_CLEAR(self->array);
  Py_TYPE(self)->tp_free(self);
}

static PyObject *sim_exchange_tobytes(SimExchangeTensor *self, PyObject *unused) {
  const DLTensor *t = &self->managed->dl_tensor;
  uint64_t n = 0;
  ferry_status st = ferry_tensor_nbytes((const ferry_tensor *)t, &n);
  if (st != FERRY_OK) return ferry_py_raise(st);
  for (int32_t d = t->ndim - 1, expect = 1; t->strides && d >= 0; d--) {
    if (t->shape[d] != 1 && t->strides[d] != expect) {
      PyErr_SetString(PyExc_ValueError, "tobytes: the tensor is not compact");
      return NULL;
    }
    expect *= (int32_t)t->shape[d];
  }
  return PyBytes_FromStringAndSize(n ? (const char *)t->data + t->byte_offset : "", (Py_ssize_t)n);
}

static PyObject *sim_exchange_get_device(SimExchangeTensor *self, void *unused) {
  return Py_BuildValue("(ii)", (int)self->device_type, (int)self->device_id);
}

static PyObject *sim_exchange_get_shape(SimExchangeTensor *self, void *unused) {
  const DLTensor *t = &self->managed->dl_tensor;
  PyObject *shape = PyTuple_New(t->ndim);
  for (int32_t d = 0; shape && d < t->ndim; d++) {
    PyObject *v = PyLong_FromLongLong(t->shape[d]);
    if (!v) Py_CLEAR(shape);
    else PyTuple_SET_ITEM(shape, d, v);
  }
  return shape;
}

static PyMethodDef sim_exchange_methods[] = {
    {"tobytes", (PyCFunction)sim_exchange_tobytes, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef sim_exchange_getset[] = {
    {"device", (getter)sim_exchange_get_device, NULL, "(DLPack device type, id)", NULL},
    {"shape", (getter)sim_exchange_get_shape, NULL, "shape", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject SimExchangeTensor_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ferry._ferry._SimExchangeTensor",
    .tp_basicsize = sizeof(SimExchangeTensor),
    .tp_dealloc = (destructor)sim_exchange_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Test hook: a tensor read and built through the DLPack exchange API, as torch tensors are.",
    .tp_methods = sim_exchange_methods,
    .tp_getset = sim_exchange_getset,
    .tp_new = sim_exchange_new,
};

/* _sim_frameworks(flag): whether H2D outputs may go to CuPy/JAX (off after _sim_install); also forgets the
 * frameworks' from_dlpack functions looked up so far, so a test's stand-in module is seen. Returns the old flag. */
static PyObject *sim_frameworks(PyObject *self, PyObject *flag) {
  int on = PyObject_IsTrue(flag);
  if (on < 0) return NULL;
  bool old = ferry_py_device_outputs_to_frameworks;
  ferry_py_device_outputs_to_frameworks = on;
  ferry_py_outputs_clear_cache();
  return PyBool_FromLong(old);
}

static PyObject *sim_read_delay_us(PyObject *self, PyObject *arg) {
  long us = PyLong_AsLong(arg);
  if (us == -1 && PyErr_Occurred()) return NULL;
  if (us < 0 || us > 1000000) {
    PyErr_Format(PyExc_ValueError, "_sim_read_delay_us(%ld): expected 0 to 1000000 microseconds", us);
    return NULL;
  }
  return PyLong_FromLong(atomic_exchange(&read_delay_us, (int)us));
}

/* The shape array the exchange API hands out is the tensor's own (numpy's export of it), as torch's is its
 * TensorImpl's: changing it here is what resize_ does to a torch tensor between two reads. */
static PyObject *sim_set_shape(PyObject *self, PyObject *args) {
  PyObject *obj, *shape;
  if (!PyArg_ParseTuple(args, "O!O!:_sim_set_shape", &SimExchangeTensor_Type, &obj, &PyTuple_Type, &shape))
    return NULL;
  DLTensor *t = &((SimExchangeTensor *)obj)->managed->dl_tensor;
  if (PyTuple_GET_SIZE(shape) != t->ndim) {
    PyErr_Format(PyExc_ValueError, "_sim_set_shape: the tensor has rank %d", (int)t->ndim);
    return NULL;
  }
  for (int32_t d = 0; d < t->ndim; d++) {
    long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, d));
    if (v == -1 && PyErr_Occurred()) return NULL;
    t->shape[d] = v;
  }
  Py_RETURN_NONE;
}

static PyObject *sim_null_data(PyObject *self, PyObject *obj) {
  if (Py_TYPE(obj) != &SimExchangeTensor_Type) {
    PyErr_SetString(PyExc_TypeError, "_sim_null_data: expected a _SimExchangeTensor");
    return NULL;
  }
  ((SimExchangeTensor *)obj)->managed->dl_tensor.data = NULL;
  Py_RETURN_NONE;
}

static char exchange_cost_buffer[1 << 16];
static int64_t exchange_cost_shape[1] = {64};
static int64_t exchange_cost_strides[1] = {1};

static void exchange_cost_deleter(DLManagedTensorVersioned *m) { free(m); }

static PyObject *exchange_costs(PyObject *self, PyObject *list) {
  if (!PyList_Check(list) || PyList_GET_SIZE(list) == 0) {
    PyErr_SetString(PyExc_TypeError, "_exchange_costs: expected a non-empty list of tensors");
    return NULL;
  }
  Py_ssize_t n = PyList_GET_SIZE(list);
  const ferry_py_typeinfo *ti = ferry_py_typeinfo_of(Py_TYPE(PyList_GET_ITEM(list, 0)));
  if (!ti) return NULL;
  if (ti->kind != FERRY_PY_TENSOR_EXCHANGE) {
    PyErr_SetString(PyExc_TypeError, "_exchange_costs: the tensors' type has no DLPack exchange API");
    return NULL;
  }
  const DLPackExchangeAPI *api = ti->api;
  PyObject **outs = PyMem_Calloc((size_t)n, sizeof *outs);
  if (!outs) return PyErr_NoMemory();
  int64_t t0 = sim_now_ns();
  for (Py_ssize_t i = 0; i < n; i++) {
    DLTensor t;
    if (api->dltensor_from_py_object_no_sync(PyList_GET_ITEM(list, i), &t) != 0) goto fail;
  }
  int64_t t1 = sim_now_ns();
  for (Py_ssize_t i = 0; i < n; i++) {
    DLManagedTensorVersioned *m = calloc(1, sizeof *m);
    if (!m) goto fail;
    m->version.major = DLPACK_MAJOR_VERSION;
    m->version.minor = DLPACK_MINOR_VERSION;
    m->deleter = exchange_cost_deleter;
    m->dl_tensor.data = exchange_cost_buffer;
    m->dl_tensor.device = (DLDevice){kDLCPU, 0};
    m->dl_tensor.ndim = 1;
    m->dl_tensor.dtype = (DLDataType){kDLUInt, 8, 1};
    m->dl_tensor.shape = exchange_cost_shape;
    m->dl_tensor.strides = exchange_cost_strides;
    void *out = NULL;
    if (api->managed_tensor_to_py_object_no_sync(m, &out) != 0 || !out) goto fail;
    outs[i] = out;
  }
  int64_t t2 = sim_now_ns();
  for (Py_ssize_t i = 0; i < n; i++) Py_CLEAR(outs[i]);
  int64_t t3 = sim_now_ns();
  PyMem_Free(outs);
  return Py_BuildValue("(ddd)", (double)(t1 - t0) / n, (double)(t2 - t1) / n, (double)(t3 - t2) / n);
fail:
  for (Py_ssize_t i = 0; i < n; i++) Py_XDECREF(outs[i]);
  PyMem_Free(outs);
  if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "_exchange_costs: the exchange API failed");
  return NULL;
}

static PyMethodDef hooks[] = {
    {"_exchange_costs", exchange_costs, METH_O, NULL},
    {"_sim_read_delay_us", sim_read_delay_us, METH_O, NULL},
    {"_sim_set_shape", sim_set_shape, METH_VARARGS, NULL},
    {"_sim_null_data", sim_null_data, METH_O, NULL},
    {"_sim_install", sim_install, METH_NOARGS, NULL},
    {"_sim_frameworks", sim_frameworks, METH_O, NULL},
    {"_sim_hold", sim_hold, METH_O, NULL},
    {"_sim_submit_delay_us", sim_submit_delay_us, METH_O, NULL},
    {"_sim_counters", sim_counters, METH_NOARGS, NULL},
    {"_sim_fault", sim_fault, METH_VARARGS, NULL},
    {"_sim_read", sim_read, METH_O, NULL},
    {"_sim_foreign_stream", sim_foreign_stream, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL}};

int ferry_py_testing_init(PyObject *module) {
  if (PyModule_AddFunctions(module, hooks) < 0) return -1;
  if (PyType_Ready(&SimExchangeTensor_Type) < 0) return -1;
  PyObject *api = PyCapsule_New(&sim_exchange_api, "dlpack_exchange_api", NULL);
  if (!api || PyDict_SetItemString(SimExchangeTensor_Type.tp_dict, "__dlpack_c_exchange_api__", api) < 0) {
    Py_XDECREF(api);
    return -1;
  }
  Py_DECREF(api);
  PyType_Modified(&SimExchangeTensor_Type);
  Py_INCREF(&SimExchangeTensor_Type);
  if (PyModule_AddObject(module, "_SimExchangeTensor", (PyObject *)&SimExchangeTensor_Type) < 0) {
    Py_DECREF(&SimExchangeTensor_Type);
    return -1;
  }
  if (PyType_Ready(&SimDeviceArray_Type) < 0) return -1;
  Py_INCREF(&SimDeviceArray_Type);
  if (PyModule_AddObject(module, "_SimDeviceArray", (PyObject *)&SimDeviceArray_Type) < 0) {
    Py_DECREF(&SimDeviceArray_Type);
    return -1;
  }
  return 0;
}
