/* ops_stream.c — which CUDA stream a run of ferry.ops goes on.
 *
 * stream=None means "the framework's current stream", as torch.mm would use: the current work stream of the
 * operands' framework, asked through its DLPack exchange API at every call (a C call into torch, no Python). That
 * is what makes op.run inside `with torch.cuda.graph(g):` land on the capturing stream, and never on a stream
 * remembered from an earlier call. Operands that came through __dlpack__ only (CuPy, JAX) have no such API: their
 * runs default to the legacy default stream, and a caller on another stream passes it.
 *
 * A stream object (torch.cuda.Stream, a CuPy stream, __cuda_stream__) is read with the transfer half's parser
 * (args.c); reading it costs attribute look-ups, so the last object given is remembered (a strong reference, so its
 * address cannot be reused) with its handle: the notebook's loop passes the same stream object at every call.
 */
#include "ops_py.h"

static PyObject *last_obj; /* strong */
static void *last_handle;
static int last_device;

void ferry_py_ops_stream_clear(void) { Py_CLEAR(last_obj); }

static int check_device(PyObject *obj, int stream_device, int device) {
  if (stream_device < 0 || stream_device == device) return 0;
  PyErr_Format(PyExc_ValueError, "stream %R belongs to cuda:%d, but the operands are on cuda:%d", obj, stream_device,
               device);
  return -1;
}

int ferry_py_ops_stream(PyObject *obj, const DLPackExchangeAPI *api, int device, void **out) {
  if (!obj || obj == Py_None) {
    void *s = NULL;
    if (api && api->current_work_stream(kDLCUDA, device, &s) != 0) {
      if (!PyErr_Occurred())
        PyErr_Format(PyExc_RuntimeError, "the framework could not say its current stream on cuda:%d", device);
      return -1;
    }
    *out = s; /* torch's default stream is the legacy default stream, NULL to ferry as well */
    return 0;
  }
  if (obj == last_obj) {
    if (check_device(obj, last_device, device) < 0) return -1;
    *out = last_handle;
    return 0;
  }
  void *handle;
  int stream_device;
  if (ferry_py_stream_from_object(obj, &handle, &stream_device) < 0) return -1;
  if (!PyLong_Check(obj)) { /* ints are read at once; objects are worth remembering */
    Py_XSETREF(last_obj, Py_NewRef(obj));
    last_handle = handle;
    last_device = stream_device;
  }
  if (check_device(obj, stream_device, device) < 0) return -1;
  *out = handle;
  return 0;
}
