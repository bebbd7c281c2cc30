/* args.c — the arguments of transfer_tensor_d2h/h2d: (batch, /, *, device=None, stream=None, producer_event=None).
 *
 * Parsing checks syntax only and makes no driver call, so a bad argument is reported even on a machine without
 * CUDA (where the batch is otherwise returned as it is). Framework objects are read through plain attributes
 * (torch.device .type/.index, torch.cuda.Stream .cuda_stream, CuPy .ptr, the __cuda_stream__ protocol) so that
 * no framework is imported and no slow framework call is made per transfer.
 */
#include "ferry_py.h"

#include <limits.h>
#include <string.h>

/* CUDA's handle for the legacy default stream. A framework's "default stream" object reports handle 0, which
 * ferry's options would read as "no stream given". */
#define LEGACY_STREAM ((void *)(uintptr_t)0x1)

/* ---- device -------------------------------------------------------------------------------------------------- */

static int device_from_index(PyObject *index, PyObject *device_obj, int *out) {
  if (PyBool_Check(index)) {
    PyErr_Format(PyExc_TypeError, "device must be None, an int, a str such as 'cuda:0' or a torch.device; got %R",
                 device_obj);
    return -1;
  }
  long v = PyLong_AsLong(index);
  if (v == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    PyErr_Format(PyExc_ValueError, "device index %R is out of range", index);
    return -1;
  }
  if (v < 0 || v > INT_MAX) {
    PyErr_Format(PyExc_ValueError, "device index must be a non-negative int, got %R", device_obj);
    return -1;
  }
  *out = (int)v;
  return 0;
}

/* "cuda" -> current device, "cuda:N" -> N; anything else is not a CUDA device. */
static int device_from_string(PyObject *s, PyObject *device_obj, int *out) {
  Py_ssize_t n;
  const char *text = PyUnicode_AsUTF8AndSize(s, &n);
  if (!text) return -1;
  if (n == 4 && memcmp(text, "cuda", 4) == 0) {
    *out = FERRY_PY_DEVICE_CURRENT;
    return 0;
  }
  if (n > 5 && n <= 5 + 9 && memcmp(text, "cuda:", 5) == 0) {
    int v = 0;
    for (Py_ssize_t i = 5; i < n; i++) {
      if (text[i] < '0' || text[i] > '9') goto bad;
      v = v * 10 + (text[i] - '0');
    }
    *out = v;
    return 0;
  }
bad:
  if (n >= 4 && memcmp(text, "cuda", 4) == 0)
    PyErr_Format(PyExc_ValueError, "invalid CUDA device %R: expected 'cuda' or 'cuda:N'", device_obj);
  else
    PyErr_Format(PyExc_ValueError, "device must be a CUDA device, got %R", device_obj);
  return -1;
}

static int parse_device(PyObject *obj, int *out) {
  if (obj == Py_None) {
    *out = FERRY_PY_DEVICE_UNSET;
    return 0;
  }
  if (PyLong_Check(obj)) return device_from_index(obj, obj, out);
  if (PyUnicode_Check(obj)) return device_from_string(obj, obj, out);
  /* A torch.device, or anything shaped like one: .type is "cuda", .index an int or None. */
  PyObject *type = PyObject_GetAttrString(obj, "type");
  PyObject *index = type ? PyObject_GetAttrString(obj, "index") : NULL;
  int rc = -1;
  if (!type || !index) {
    if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
      PyErr_Clear();
      PyErr_Format(PyExc_TypeError,
                   "device must be None, an int, a str such as 'cuda:0' or a torch.device; got %R (%s)", obj,
                   Py_TYPE(obj)->tp_name);
    }
  } else if (!PyUnicode_Check(type) || PyUnicode_CompareWithASCIIString(type, "cuda") != 0) {
    PyErr_Format(PyExc_ValueError, "device must be a CUDA device, got %R", obj);
  } else if (index == Py_None) {
    *out = FERRY_PY_DEVICE_CURRENT;
    rc = 0;
  } else if (PyLong_Check(index)) {
    rc = device_from_index(index, obj, out);
  } else {
    PyErr_Format(PyExc_TypeError, "device %R has a non-integer index %R", obj, index);
  }
  Py_XDECREF(type);
  Py_XDECREF(index);
  return rc;
}

/* ---- streams and events ---------------------------------------------------------------------------------- */

/* Reads attribute `name` if the object has it: 1 with a new reference, 0 without, -1 on another error. */
static int optional_attr(PyObject *obj, const char *name, PyObject **out) {
  *out = PyObject_GetAttrString(obj, name);
  if (*out) return 1;
  if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
  PyErr_Clear();
  return 0;
}

/* A raw CUDA handle from a Python int (non-negative, pointer-sized). */
static int handle_from_int(PyObject *v, const char *what, PyObject *obj, void **out) {
  if (PyBool_Check(v) || !PyLong_Check(v)) {
    PyErr_Format(PyExc_TypeError, "%s handle of %R is not an int", what, obj);
    return -1;
  }
  unsigned long long h = PyLong_AsUnsignedLongLong(v);
  if (h == (unsigned long long)-1 && PyErr_Occurred()) {
    PyErr_Clear();
    PyErr_Format(PyExc_ValueError, "%s %R is not a valid CUDA handle (negative or too large)", what, obj);
    return -1;
  }
  *out = (void *)(uintptr_t)h;
  return 0;
}

/* stream: None, an int handle, an object with __cuda_stream__() -> (version, handle), torch's .cuda_stream or
 * CuPy's .ptr. Also reads the device the stream object says it is on (torch .device_index, CuPy .device_id). */
static int parse_stream(PyObject *obj, void **out, int *out_device) {
  *out = NULL;
  *out_device = -1;
  if (obj == Py_None) return 0;
  PyObject *v = NULL;
  int has;
  if (PyLong_Check(obj)) {
    v = Py_NewRef(obj);
  } else if ((has = optional_attr(obj, "__cuda_stream__", &v)) != 0) {
    if (has < 0) return -1;
    PyObject *pair = PyObject_CallNoArgs(v);
    Py_DECREF(v);
    v = NULL;
    if (!pair) return -1;
    if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
      PyErr_Format(PyExc_TypeError, "%R.__cuda_stream__() returned %R, expected a (version, handle) tuple", obj,
                   pair);
      Py_DECREF(pair);
      return -1;
    }
    v = Py_NewRef(PyTuple_GET_ITEM(pair, 1));
    Py_DECREF(pair);
  } else if ((has = optional_attr(obj, "cuda_stream", &v)) == 0) {
    if ((has = optional_attr(obj, "ptr", &v)) == 0) {
      PyErr_Format(PyExc_TypeError,
                   "stream must be None, an int handle, a torch.cuda.Stream, a CuPy stream or an object with "
                   "__cuda_stream__; got %R (%s)", obj, Py_TYPE(obj)->tp_name);
      return -1;
    }
  }
  if (!v) return -1;
  int rc = handle_from_int(v, "stream", obj, out);
  Py_DECREF(v);
  if (rc < 0) return -1;
  if (*out == NULL) *out = LEGACY_STREAM;
  if (!PyLong_Check(obj)) {
    PyObject *d = NULL;
    if ((has = optional_attr(obj, "device_index", &d)) == 0) has = optional_attr(obj, "device_id", &d);
    if (has < 0) return -1;
    if (has > 0) {
      long index = PyLong_Check(d) && !PyBool_Check(d) ? PyLong_AsLong(d) : -1;
      bool past = (index == -1 && PyErr_Occurred()) || index > INT_MAX; /* must not wrap onto cuda:0 */
      PyErr_Clear();
      if (past) PyErr_Format(PyExc_ValueError, "stream %R has device index %R, past any device", obj, d);
      else if (index >= 0) *out_device = (int)index;
      Py_DECREF(d);
      if (past) return -1;
    }
  }
  return 0;
}

int ferry_py_stream_from_object(PyObject *obj, void **out, int *out_device) {
  return parse_stream(obj, out, out_device);
}

/* producer_event: None, an int handle, torch.cuda.Event (.cuda_event) or a CuPy event (.ptr). */
static int parse_event(PyObject *obj, void **out) {
  *out = NULL;
  if (obj == Py_None) return 0;
  PyObject *v = NULL;
  int has;
  if (PyLong_Check(obj)) {
    v = Py_NewRef(obj);
  } else if ((has = optional_attr(obj, "cuda_event", &v)) == 0) {
    if ((has = optional_attr(obj, "ptr", &v)) == 0) {
      PyErr_Format(PyExc_TypeError,
                   "producer_event must be None, an int handle, a torch.cuda.Event or a CuPy event; got %R (%s)",
                   obj, Py_TYPE(obj)->tp_name);
      return -1;
    }
  }
  if (!v) return -1;
  int rc = handle_from_int(v, "producer_event", obj, out);
  Py_DECREF(v);
  if (rc < 0) return -1;
  if (*out == NULL) {
    PyErr_Format(PyExc_ValueError,
                 "producer_event %R has no CUDA event yet (a torch.cuda.Event gets one on its first record())", obj);
    return -1;
  }
  return 0;
}

/* ---- the call --------------------------------------------------------------------------------------------- */

int ferry_py_args_parse(const char *name, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                        ferry_py_args *out) {
  PyObject *device = Py_None, *stream = Py_None, *event = Py_None;
  if (nargs != 1) {
    PyErr_Format(PyExc_TypeError, "%s() takes exactly 1 positional argument (the batch), %zd given", name, nargs);
    return -1;
  }
  Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  for (Py_ssize_t i = 0; i < nkw; i++) {
    PyObject *k = PyTuple_GET_ITEM(kwnames, i);
    if (PyUnicode_CompareWithASCIIString(k, "device") == 0)
      device = args[nargs + i];
    else if (PyUnicode_CompareWithASCIIString(k, "stream") == 0)
      stream = args[nargs + i];
    else if (PyUnicode_CompareWithASCIIString(k, "producer_event") == 0)
      event = args[nargs + i];
    else {
      PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument %R", name, k);
      return -1;
    }
  }
  out->batch = args[0];
  out->device_obj = device;
  out->stream_obj = stream;
  if (parse_device(device, &out->device) < 0) return -1;
  if (stream != Py_None && device == Py_None) {
    PyErr_Format(PyExc_ValueError,
                 "%s(): stream=%R was given without device=; pass the device the stream belongs to", name, stream);
    return -1;
  }
  if (parse_stream(stream, &out->stream, &out->stream_device) < 0) return -1;
  if (parse_event(event, &out->producer_event) < 0) return -1;
  return 0;
}

/* torch.cuda.current_device() when torch is already imported (device="cuda" means the current device there);
 * otherwise the same default as device=None. */
static int current_device(int *out) {
  *out = FERRY_PY_DEVICE_UNSET;
  PyObject *torch = PyDict_GetItemString(PyImport_GetModuleDict(), "torch"); /* borrowed */
  if (!torch) return 0;
  PyObject *cuda = PyObject_GetAttrString(torch, "cuda");
  if (!cuda) return -1;
  PyObject *index = PyObject_CallMethod(cuda, "current_device", NULL);
  Py_DECREF(cuda);
  if (!index) return -1;
  long v = PyLong_AsLong(index);
  Py_DECREF(index);
  if (v == -1 && PyErr_Occurred()) return -1;
  *out = (int)v;
  return 0;
}

int ferry_py_args_resolve_device(ferry_py_args *a, int *out_device) {
  int requested = a->device;
  if (requested == FERRY_PY_DEVICE_CURRENT && current_device(&requested) < 0) return -1;
  ferry_status st = ferry_device_resolve(requested >= 0 ? requested : -1, out_device);
  if (st != FERRY_OK) {
    ferry_py_raise(st);
    return -1;
  }
  if (a->stream_device >= 0 && a->stream_device != *out_device) {
    PyErr_Format(PyExc_ValueError, "stream %R belongs to cuda:%d, but the transfer is on cuda:%d (device=%R)",
                 a->stream_obj, a->stream_device, *out_device, a->device_obj);
    return -1;
  }
  return 0;
}
