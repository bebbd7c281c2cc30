/* handle.c — ferry.Transfer, the handle returned by transfer_tensor_d2h_async / transfer_tensor_h2d_async.
 *
 * The call has submitted the copies and built the torch outputs when it returns; wait() waits (GIL released),
 * builds the other outputs and rebuilds the batch, once: later calls return the same object (or raise the same
 * exception). done() never blocks. A handle dropped before wait() waits for its copies in its deallocator, so
 * nothing they read or write is released under them.
 *
 * Threads: several threads may call wait() on one handle. A mutex, taken with the GIL released (so the GIL and
 * the mutex are never waited for in opposite orders), lets one of them finish the job; the others then find it
 * finished.
 */
#include "ferry_py.h"

typedef struct {
  PyObject_HEAD
  ferry_py_job job;
  pthread_mutex_t lock; /* held by the thread finishing the job */
  PyObject *error;      /* the exception a failed wait() raised, raised again by later calls */
} Transfer;

static PyObject *start(bool h2d, const char *name, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  Transfer *self = PyObject_GC_New(Transfer, &ferry_py_Transfer_Type);
  if (!self) return NULL;
  pthread_mutex_init(&self->lock, NULL);
  self->error = NULL;
  if (ferry_py_job_start(&self->job, h2d, false, name, args, nargs, kwnames) < 0) { /* the job is left cleared */
    Py_DECREF(self);
    return NULL;
  }
  PyObject_GC_Track(self);
  return (PyObject *)self;
}

PyObject *ferry_py_transfer_d2h_async(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  return start(false, "transfer_tensor_d2h_async", args, nargs, kwnames);
}

PyObject *ferry_py_transfer_h2d_async(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  return start(true, "transfer_tensor_h2d_async", args, nargs, kwnames);
}

static void transfer_dealloc(Transfer *self) {
  PyObject_GC_UnTrack(self);
  ferry_py_job_clear(&self->job); /* waits for copies still running */
  Py_CLEAR(self->error);
  pthread_mutex_destroy(&self->lock);
  PyObject_GC_Del(self);
}

/* The stored error's traceback holds the frames that called wait(), and so usually the handle itself: a cycle
 * that only the garbage collector can break, through the error (the job's references are left alone: clearing
 * them under running copies is not safe, and the error is enough to break it). */
static int transfer_traverse(Transfer *self, visitproc visit, void *arg) {
  Py_VISIT(self->error);
  return 0;
}

static int transfer_clear(Transfer *self) {
  Py_CLEAR(self->error);
  return 0;
}

static PyObject *raise_stored(Transfer *self) {
  PyErr_SetObject((PyObject *)Py_TYPE(self->error), self->error);
  return NULL;
}

static PyObject *transfer_wait(Transfer *self, PyObject *unused) {
  if (self->job.state == FERRY_PY_JOB_FINISHED) return Py_NewRef(self->job.result);
  if (self->error) return raise_stored(self);
  Py_BEGIN_ALLOW_THREADS pthread_mutex_lock(&self->lock);
  Py_END_ALLOW_THREADS if (self->job.state == FERRY_PY_JOB_SUBMITTED && ferry_py_job_finish(&self->job) < 0) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb) PyException_SetTraceback(value, tb);
    self->error = Py_NewRef(value);
    PyErr_Restore(type, value, tb);
  }
  pthread_mutex_unlock(&self->lock);
  if (self->job.state == FERRY_PY_JOB_FINISHED) return Py_NewRef(self->job.result);
  if (PyErr_Occurred()) return NULL;
  if (self->error) return raise_stored(self);
  PyErr_SetString(PyExc_RuntimeError, "ferry.Transfer: the transfer was released");
  return NULL;
}

static PyObject *transfer_done(Transfer *self, PyObject *unused) {
  if (self->error) Py_RETURN_TRUE;
  int done = ferry_py_job_query(&self->job, &self->lock);
  if (done < 0) return NULL;
  return PyBool_FromLong(done);
}

static PyObject *transfer_repr(Transfer *self) {
  const char *state = self->error                                    ? "failed"
                      : self->job.state == FERRY_PY_JOB_SUBMITTED ? "submitted"
                      : self->job.state == FERRY_PY_JOB_FINISHED  ? "finished"
                                                                     : "released";
  return PyUnicode_FromFormat("<ferry.Transfer %s %s, %zu tensor(s) copied>", self->job.h2d ? "h2d" : "d2h", state,
                              self->job.tape.n_leaves);
}

static PyMethodDef transfer_methods[] = {
    {"wait", (PyCFunction)transfer_wait, METH_NOARGS,
     "wait()\n--\n\n"
     "Waits for the copies (the GIL is released meanwhile) and returns the rebuilt batch. Later calls return the\n"
     "same object; if the transfer failed, every call raises the same exception."},
    {"done", (PyCFunction)transfer_done, METH_NOARGS,
     "done()\n--\n\n"
     "True when the copies have finished (or failed, or nothing needed copying); never blocks. wait() is still\n"
     "needed to get the batch."},
    {NULL, NULL, 0, NULL}};

PyTypeObject ferry_py_Transfer_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ferry.Transfer",
    .tp_basicsize = sizeof(Transfer),
    .tp_dealloc = (destructor)transfer_dealloc,
    .tp_repr = (reprfunc)transfer_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)transfer_traverse,
    .tp_clear = (inquiry)transfer_clear,
    .tp_doc = "A submitted transfer (from transfer_tensor_d2h_async / transfer_tensor_h2d_async).\n\n"
              "Holds the inputs, the outputs and the pinned slab until wait() has returned the batch; dropping\n"
              "it without wait() waits for the copies first. Not constructible directly.",
    .tp_methods = transfer_methods,
};
