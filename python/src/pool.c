/* pool.c — ferry's memory from Python: the pinned pool's reserve, trim, stats (wrapped with docstrings by
 * ferry/pool.py), and record_stream, which makes an output's memory wait for a stream before it is reused.
 *
 * Without CUDA there is nothing to pin: reserve and trim do nothing, and stats are all zero, so code written for
 * a GPU machine runs unchanged on one without.
 */
#include "ferry_py.h"

static bool no_cuda(ferry_status st) { return st == FERRY_NO_DRIVER || st == FERRY_NO_DEVICE; }

PyObject *ferry_py_pool_reserve(PyObject *self, PyObject *arg) {
  if (PyBool_Check(arg) || !PyLong_Check(arg)) {
    PyErr_Format(PyExc_TypeError, "pool.reserve(nbytes): nbytes must be an int, got %R", arg);
    return NULL;
  }
  unsigned long long nbytes = PyLong_AsUnsignedLongLong(arg);
  if (nbytes == (unsigned long long)-1 && PyErr_Occurred()) {
    PyErr_Clear();
    PyErr_Format(PyExc_ValueError, "pool.reserve(nbytes): nbytes must be a non-negative int that fits in 64 bits, "
                 "got %R", arg);
    return NULL;
  }
  if (nbytes > SIZE_MAX) {
    PyErr_Format(PyExc_ValueError, "pool.reserve(nbytes): %R bytes do not fit in this address space", arg);
    return NULL;
  }
  PyThreadState *ts = ferry_py_pace_unlock(NULL);
  ferry_status st = ferry_pool_reserve((size_t)nbytes); /* pinning takes milliseconds */
  ferry_py_pace_relock(NULL, ts);
  if (st != FERRY_OK && !no_cuda(st)) return ferry_py_raise(st);
  Py_RETURN_NONE;
}

PyObject *ferry_py_pool_trim(PyObject *self, PyObject *unused) {
  PyThreadState *ts = ferry_py_pace_unlock(NULL);
  ferry_status st = ferry_pool_trim();
  ferry_py_pace_relock(NULL, ts);
  if (st != FERRY_OK && !no_cuda(st)) return ferry_py_raise(st);
  Py_RETURN_NONE;
}

PyObject *ferry_py_pool_stats(PyObject *self, PyObject *unused) {
  ferry_pool_stats s;
  ferry_pool_stats_get(&s);
  return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:K,s:d,s:K,s:K}", "bytes_pinned", (unsigned long long)s.bytes_pinned,
                       "bytes_in_use", (unsigned long long)s.bytes_in_use, "bytes_peak_in_use",
                       (unsigned long long)s.bytes_peak_in_use, "bytes_peak_pinned",
                       (unsigned long long)s.bytes_peak_pinned, "regions", (unsigned long long)s.regions, "pin_calls",
                       (unsigned long long)s.pin_calls, "pin_seconds", s.pin_seconds, "hits",
                       (unsigned long long)s.hits, "misses", (unsigned long long)s.misses);
}

PyObject *ferry_py_record_stream(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 2) {
    PyErr_Format(PyExc_TypeError, "record_stream(output, stream) takes 2 arguments (%zd given)", nargs);
    return NULL;
  }
  void *stream = NULL;
  int stream_device = -1;
  if (ferry_py_stream_from_object(args[1], &stream, &stream_device) < 0) return NULL;
  const ferry_py_typeinfo *ti = ferry_py_typeinfo_of(Py_TYPE(args[0]));
  if (!ti) return NULL;
  if (ti->kind != FERRY_PY_TENSOR_EXCHANGE && ti->kind != FERRY_PY_TENSOR_PROTOCOL) {
    PyErr_Format(PyExc_TypeError, "record_stream: expected an output tensor of a ferry transfer, got %R", args[0]);
    return NULL;
  }
  ferry_py_typeinfo copy = *ti;
  ferry_tensor t;
  ferry_py_leaf leaf;
  PyObject *no_sync = PyLong_FromLong(-1); /* only the address is read: nothing to order */
  if (!no_sync) return NULL;
  int rc = ferry_py_read_operand(args[0], &copy, no_sync, &t, &leaf);
  Py_DECREF(no_sync);
  if (rc < 0) return NULL;
  const void *address = (const char *)t.data + t.byte_offset;
  uint64_t nbytes = 1;
  bool empty = ferry_tensor_nbytes(&t, &nbytes) == FERRY_OK && nbytes == 0;
  ferry_py_leaf_release_input(&leaf);
  if (empty) Py_RETURN_NONE; /* an empty output holds no bytes, in a slab or anywhere: no stream can touch them */
  ferry_slab *slab = ferry_slab_find(address);
  if (!slab) {
    PyErr_Format(PyExc_ValueError, "record_stream: %R is not an output of a ferry transfer (no live slab holds "
                 "address %p)", args[0], address);
    return NULL;
  }
  ferry_status st = ferry_slab_record_stream(slab, stream);
  if (st != FERRY_OK) return ferry_py_raise(st);
  Py_RETURN_NONE;
}
