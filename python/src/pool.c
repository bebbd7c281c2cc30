/* pool.c — the pinned host pool from Python: reserve, trim, stats (wrapped with docstrings by ferry/pool.py).
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
  ferry_status st;
  Py_BEGIN_ALLOW_THREADS st = ferry_pool_reserve((size_t)nbytes); /* pinning takes milliseconds */
  Py_END_ALLOW_THREADS if (no_cuda(st)) ferry_clear_error();
  else if (st != FERRY_OK) return ferry_py_raise(st);
  Py_RETURN_NONE;
}

PyObject *ferry_py_pool_trim(PyObject *self, PyObject *unused) {
  ferry_status st;
  Py_BEGIN_ALLOW_THREADS st = ferry_pool_trim();
  Py_END_ALLOW_THREADS if (no_cuda(st)) ferry_clear_error();
  else if (st != FERRY_OK) return ferry_py_raise(st);
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
