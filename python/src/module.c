/* module.c — the extension module ferry._ferry: its functions, types and constants.
 *
 * The transfer functions are METH_FASTCALL | METH_KEYWORDS (vectorcall): no argument tuple or dict is built per
 * call. The docstrings below are the contract; ferry/__init__.py re-exports everything and the .pyi stubs repeat
 * the signatures for type checkers.
 */
#include "ferry_py.h"

static PyObject *device_count(PyObject *self, PyObject *unused) {
  PyThreadState *ts = ferry_py_pace_unlock(NULL);
  int n = ferry_device_count(); /* the first call loads the driver */
  ferry_py_pace_relock(NULL, ts);
  return PyLong_FromLong(n);
}

#define BATCH_DOC                                                                                                   \
  "batch: a tensor (torch, CuPy, JAX, numpy or any DLPack producer), or a nesting of list, tuple, namedtuple,\n"    \
  "dict or other Mapping (a defaultdict keeps its default_factory) and dataclass instances. Containers are\n"       \
  "rebuilt with their own type (dataclasses without running __init__ or __post_init__ again); a container in\n"    \
  "which nothing was copied, and every object that is not a tensor of the source side (tensors elsewhere,\n"       \
  "scalars, strings, None), comes back as the same object. If nothing is copied, `batch` itself is returned.\n\n"

#define STREAM_DOC                                                                                                  \
  "stream: the CUDA stream to copy on: a torch.cuda.Stream, a CuPy stream, an object with __cuda_stream__, or an\n" \
  "  int handle. It must belong to `device` (ValueError) and needs `device` to be given (ValueError). None: this\n" \
  "  thread's copy stream for the device, created once and cached.\n"                                              \
  "producer_event: a CUDA event (torch.cuda.Event, CuPy Event, int handle) marking when the inputs are ready; the\n" \
  "  copies wait for it. None: the copies are ordered after the work already queued on the calling thread's\n"     \
  "  current stream (an event recorded on torch's current stream; other frameworks order their own pending work\n" \
  "  through __dlpack__(stream=...)). From a thread other than the producer's, record an event there and pass it.\n\n"

#define ERRORS_DOC                                                                                                  \
  "Without CUDA (no driver or no device) the batch is returned as it is, after the arguments are checked.\n\n"     \
  "Raises ValueError for a non-CUDA device, a stream without device or on another device, a bad LOCAL_RANK;\n"      \
  "RuntimeError when the device index is not available; MemoryError when pinned or device memory runs out;\n"     \
  "ferry.FerryError when a driver call fails; BufferError/TypeError for a tensor DLPack cannot describe.\n"        \
  "Messages name the values involved."

PyDoc_STRVAR(d2h_doc,
             "transfer_tensor_d2h(batch, /, *, device=None, stream=None, producer_event=None)\n--\n\n"
             "Copies the CUDA tensors of `batch` that live on `device` to pinned host memory, on a dedicated copy\n"
             "stream, and returns the batch rebuilt with the copies in their place (SPDL's transfer_tensor_d2h).\n"
             "Returns when the copies are done; the GIL is released while submitting and while waiting.\n\n" BATCH_DOC
             "device: the source device: None (the LOCAL_RANK environment variable, else cuda:0), an int, 'cuda:N',\n"
             "  'cuda' (torch's current device when torch is imported, else as None) or a torch.device.\n" STREAM_DOC
             "Outputs: torch -> torch CPU tensors (pinned: is_pinned() is True); JAX -> JAX CPU arrays (numpy when JAX\n"
             "has no CPU backend); CuPy, numpy and other producers -> numpy arrays (a ferry.SlabTensor without\n"
             "numpy). Outputs are compact row-major copies, detached from autograd. The outputs view pinned slabs\n"
             "from ferry's pool (one per part: a large batch is submitted in parts while it is walked), each of which\n"
             "goes back only when the last output viewing it is released: keeping outputs keeps pinned memory. The\n"
             "memory is reused only after the work queued on the releasing thread's current stream (torch) when the\n"
             "output was dropped; for work on other streams see ferry.record_stream.\n\n" ERRORS_DOC);

PyDoc_STRVAR(h2d_doc,
             "transfer_tensor_h2d(batch, /, *, device=None, stream=None, producer_event=None)\n--\n\n"
             "Copies the host tensors of `batch` (pinned or pageable) to `device`, on a dedicated copy stream, and\n"
             "returns the batch rebuilt with the device copies in their place: the mirror of transfer_tensor_d2h.\n"
             "Returns when the copies are done; the GIL is released while submitting and while waiting.\n\n" BATCH_DOC
             "device: the target device, as for transfer_tensor_d2h.\n" STREAM_DOC
             "Outputs: torch -> torch CUDA tensors; JAX -> JAX GPU arrays; numpy and other producers -> CuPy arrays\n"
             "when CuPy can be imported, else ferry.SlabTensor objects (pass them to any from_dlpack). The outputs\n"
             "view device allocations (one per part), each freed stream-ordered when the last output viewing it is\n"
             "released, after the work on the legacy default stream and the releasing thread's current stream.\n\n"
             ERRORS_DOC);

PyDoc_STRVAR(d2h_async_doc,
             "transfer_tensor_d2h_async(batch, /, *, device=None, stream=None, producer_event=None)\n--\n\n"
             "transfer_tensor_d2h without the wait: submits the copies and returns a ferry.Transfer at once.\n"
             "handle.wait() returns the rebuilt batch (GIL released while waiting); handle.done() tells without\n"
             "blocking. The handle keeps the inputs alive until the copies are done. Same arguments, outputs and\n"
             "errors as transfer_tensor_d2h (errors of the copies themselves are raised by wait()).");

PyDoc_STRVAR(h2d_async_doc,
             "transfer_tensor_h2d_async(batch, /, *, device=None, stream=None, producer_event=None)\n--\n\n"
             "transfer_tensor_h2d without the wait: returns a ferry.Transfer (see transfer_tensor_d2h_async).");

static PyMethodDef methods[] = {
    {"transfer_tensor_d2h", (PyCFunction)(void (*)(void))ferry_py_transfer_d2h, METH_FASTCALL | METH_KEYWORDS,
     d2h_doc},
    {"transfer_tensor_h2d", (PyCFunction)(void (*)(void))ferry_py_transfer_h2d, METH_FASTCALL | METH_KEYWORDS,
     h2d_doc},
    {"transfer_tensor_d2h_async", (PyCFunction)(void (*)(void))ferry_py_transfer_d2h_async,
     METH_FASTCALL | METH_KEYWORDS, d2h_async_doc},
    {"transfer_tensor_h2d_async", (PyCFunction)(void (*)(void))ferry_py_transfer_h2d_async,
     METH_FASTCALL | METH_KEYWORDS, h2d_async_doc},
    {"device_count", device_count, METH_NOARGS,
     "device_count()\n--\n\nNumber of CUDA devices this process sees; 0 without a driver or a device."},
    {"record_stream", (PyCFunction)(void (*)(void))ferry_py_record_stream, METH_FASTCALL,
     "record_stream(output, stream)\n--\n\n"
     "Makes the memory of `output` (a tensor returned by a ferry transfer, or any view of it) wait for the work\n"
     "queued on `stream` (a torch.cuda.Stream, CuPy stream, __cuda_stream__ object or int handle; None: the legacy\n"
     "default stream) before ferry reuses it, as torch's Tensor.record_stream does for torch's own allocator. Use\n"
     "it when work you queue on a stream reads or writes an output that may be dropped before that work runs,\n"
     "from a thread other than the one that drops it. (When a torch output is dropped, ferry already waits for\n"
     "the dropping thread's current stream.) The whole slab the output views waits, with the other outputs of\n"
     "its part. ValueError when `output` is not a ferry output; ferry.FerryError when the stream is invalid.\n"
     "A stream being captured into a CUDA graph when the memory is released is not waited for."},
    {"_pool_reserve", ferry_py_pool_reserve, METH_O, "See ferry.pool.reserve."},
    {"_pool_trim", ferry_py_pool_trim, METH_NOARGS, "See ferry.pool.trim."},
    {"_pool_stats", ferry_py_pool_stats, METH_NOARGS, "See ferry.pool.stats."},
#ifdef FERRY_PYTHON_TEST_HOOKS
    {"_gil_pacing", (PyCFunction)(void (*)(void))ferry_py_gil_pacing, METH_FASTCALL,
     "_gil_pacing(slice_us=None, switch_us=None)\n--\n\nTest hook: the longest GIL hold of a transfer between\n"
     "release points (0: no release points) and the switch interval used while other threads exist (0: leave\n"
     "CPython's); None keeps a setting. Returns the previous (slice_us, switch_us). See python/src/pace.c."},
    {"_gil_start_yield_us", ferry_py_gil_start_yield_us, METH_O,
     "_gil_start_yield_us(us)\n--\n\nTest hook: how long a transfer steps aside before its first GIL hold when\n"
     "other threads exist (0: not; None keeps it); returns the previous value."},
    {"_gc_deferral", ferry_py_gc_deferral_hook, METH_O,
     "_gc_deferral(flag)\n--\n\nTest hook: whether transfers turn the cyclic garbage collector off while they\n"
     "run (the default); returns the previous setting. See python/src/gc_defer.c."},
    {"_phase_timing", ferry_py_phase_timing, METH_O,
     "_phase_timing(flag)\n--\n\nTest hook: stamp the phases and GIL holds of every transfer from now on;\n"
     "returns the previous setting."},
    {"_last_phases", ferry_py_last_phases, METH_NOARGS,
     "_last_phases()\n--\n\nTest hook: the phase stamps (time.perf_counter_ns clock, None when not reached or\n"
     "not timed), the GIL hold statistics, the number of parts and how often the tape grew with the GIL held\n"
     "(tape_grown_holding) of the last transfer this thread finished."},
#endif
    {NULL, NULL, 0, NULL}};

static void module_free(void *unused) {
  ferry_py_typeinfo_clear();
  ferry_py_outputs_clear_cache();
}

/* The extension keeps per-process state (type caches, the imported consumers, the GIL-sharing count) that
 * belongs to one interpreter, so it refuses to load in a subinterpreter: with its caches shared, one
 * interpreter's objects would be used by another after it ended. */
static int module_exec(PyObject *m);

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, module_exec},
#ifdef Py_mod_multiple_interpreters
    {Py_mod_multiple_interpreters, Py_MOD_MULTIPLE_INTERPRETERS_NOT_SUPPORTED},
#endif
#ifdef Py_mod_gil
    /* The caches above are guarded by the GIL: a free-threaded interpreter keeps it enabled for this module. */
    {Py_mod_gil, Py_MOD_GIL_USED},
#endif
    {0, NULL}};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, .m_name = "ferry._ferry",
    .m_doc = "The C extension behind the ferry package: batched GPU<->host tensor transfers over libferry, and "
             "GEMM operators (ferry.ops, in the submodule _ops).",
    .m_size = 0, .m_methods = methods, .m_slots = module_slots, .m_free = module_free,
};

int ferry_py_add_type(PyObject *m, PyTypeObject *type, const char *name) {
  if (PyType_Ready(type) < 0) return -1;
  Py_INCREF(type);
  if (PyModule_AddObject(m, name, (PyObject *)type) < 0) {
    Py_DECREF(type);
    return -1;
  }
  return 0;
}

static int module_exec(PyObject *m) {
  /* Python before 3.12 has no slot for refusing subinterpreters: refuse here. */
  if (PyInterpreterState_Get() != PyInterpreterState_Main()) {
    PyErr_SetString(PyExc_ImportError, "ferry._ferry cannot be loaded in a subinterpreter: it keeps per-process "
                    "state of the main interpreter; use ferry from the main interpreter");
    return -1;
  }
  if (ferry_py_errors_init(m) < 0 || ferry_py_add_type(m, &ferry_py_SlabTensor_Type, "SlabTensor") < 0 ||
      ferry_py_add_type(m, &ferry_py_Transfer_Type, "Transfer") < 0 ||
      PyModule_AddStringConstant(m, "__version__", ferry_version()) < 0 ||
      PyModule_AddIntConstant(m, "_EARLY_PART_MAX_MEAN_BYTES", (long)FERRY_PY_EARLY_PART_MAX_MEAN_BYTES) < 0 ||
      ferry_py_ops_init(m) < 0 || ferry_py_pace_module_init() < 0 || ferry_py_dlpack_in_init() < 0)
    return -1;
  PyObject *dlpack = Py_BuildValue("(ii)", DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION);
  if (!dlpack || PyModule_AddObject(m, "DLPACK_VERSION", dlpack) < 0) {
    Py_XDECREF(dlpack);
    return -1;
  }
#ifdef FERRY_PYTHON_TEST_HOOKS
  if (ferry_py_testing_init(m) < 0) return -1;
#endif
  return 0;
}

PyMODINIT_FUNC PyInit__ferry(void) { return PyModuleDef_Init(&module_def); }
