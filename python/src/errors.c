/* errors.c — ferry_status to Python exception: one table maps each status to an exception class, one function
 * raises it with the message of ferry_last_error().
 *
 * The classes are the builtins a Python caller already catches (ValueError for bad arguments, RuntimeError for a
 * missing device, MemoryError when memory runs out, OSError for files that cannot be read or written), and
 * ferry.FerryError, a RuntimeError, for the driver and ferry itself. Every exception raised for a status carries
 * the details of the C error record as attributes: status (the name, e.g. "DEVICE_MISMATCH"), cu_result and
 * cu_name (the failing driver call's CUresult), call, and where (file:line in ferry). The class holds empty
 * defaults, so every FerryError has them; the argument checks of the Python layer raise plain exceptions.
 */
#include "ferry_py.h"

#include <string.h>

PyObject *ferry_py_FerryError;

/* The one table: status -> exception class. A status not listed raises FerryError. */
static PyObject **exception_for(ferry_status status) {
  switch (status) {
  case FERRY_INVALID_ARGUMENT:
  case FERRY_DEVICE_MISMATCH:
    return &PyExc_ValueError;
  case FERRY_NO_DRIVER:
  case FERRY_NO_DEVICE:
  case FERRY_DEVICE_UNAVAILABLE:
    return &PyExc_RuntimeError;
  case FERRY_OUT_OF_HOST_MEMORY:
  case FERRY_OUT_OF_DEVICE_MEMORY:
    return &PyExc_MemoryError;
  case FERRY_OVERFLOW:
    return &PyExc_OverflowError;
  case FERRY_IO_ERROR: /* artifact files (ferry.ops) */
    return &PyExc_OSError;
  case FERRY_DRIVER_ERROR:
  case FERRY_NOT_READY:
  case FERRY_UNSUPPORTED:
  case FERRY_INTERNAL:
  default:
    return &ferry_py_FerryError;
  }
}

/* Sets one attribute on the exception; failures to do so are not worth hiding the original error for. */
static void set_detail(PyObject *exc, const char *name, PyObject *value) {
  if (!value) {
    PyErr_Clear();
    return;
  }
  if (PyObject_SetAttrString(exc, name, value) < 0) PyErr_Clear();
  Py_DECREF(value);
}

PyObject *ferry_py_raise(ferry_status status) {
  const ferry_error *e = ferry_last_error();
  /* The record describes this status only if the failing call wrote it; otherwise say what we know. */
  const char *message = e->status == status && e->message[0] ? e->message : ferry_status_str(status);
  PyObject *cls = *exception_for(status);
  PyObject *exc = PyObject_CallFunction(cls, "s", message);
  if (!exc) return NULL;
  set_detail(exc, "status", PyUnicode_FromString(ferry_status_name(status)));
  if (e->status == status) {
    set_detail(exc, "cu_result", PyLong_FromLong(e->cu_result));
    set_detail(exc, "cu_name", PyUnicode_FromString(e->cu_name ? e->cu_name : ""));
    set_detail(exc, "call", PyUnicode_FromString(e->call ? e->call : ""));
    set_detail(exc, "where", PyUnicode_FromFormat("%s:%d", e->file ? e->file : "", e->line));
  }
  PyErr_SetObject(cls, exc);
  Py_DECREF(exc);
  return NULL;
}

int ferry_py_errors_init(PyObject *module) {
  if (ferry_py_FerryError) goto add; /* one class for the process, also when the module is imported again */
  ferry_py_FerryError = PyErr_NewExceptionWithDoc(
      "ferry.FerryError",
      "A CUDA driver call, or ferry itself, failed (status DRIVER_ERROR, UNSUPPORTED, INTERNAL, ...).\n\n"
      "Attributes (also set on the ValueError, RuntimeError, MemoryError, OverflowError and OSError that ferry\n"
      "raises for a status of its C library; not on those of argument checks made before it is called): status\n"
      "(the ferry status name), cu_result and cu_name (the CUresult of the failing driver call, 0 and '' when\n"
      "none), call (the failing call's name) and where (file:line inside ferry).",
      PyExc_RuntimeError, NULL);
  if (!ferry_py_FerryError) return -1;
  static const char *const defaults = "status\0cu_name\0call\0where\0"; /* and cu_result, 0 */
  PyObject *empty = PyUnicode_FromString(""), *zero = PyLong_FromLong(0);
  int rc = empty && zero ? PyObject_SetAttrString(ferry_py_FerryError, "cu_result", zero) : -1;
  for (const char *name = defaults; rc == 0 && *name; name += strlen(name) + 1)
    rc = PyObject_SetAttrString(ferry_py_FerryError, name, empty);
  Py_XDECREF(empty);
  Py_XDECREF(zero);
  if (rc < 0) return -1;
add:
  Py_INCREF(ferry_py_FerryError);
  if (PyModule_AddObject(module, "FerryError", ferry_py_FerryError) < 0) {
    Py_DECREF(ferry_py_FerryError);
    return -1;
  }
  return 0;
}
