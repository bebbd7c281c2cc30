/* handle.c — ferry.Transfer, the handle returned by transfer_tensor_d2h_async / transfer_tensor_h2d_async.
 *
 * The call has submitted every copy and built the torch outputs when it returns; wait() waits (GIL released),
 * builds the other outputs and rebuilds the batch, once: later calls return the same object (or raise the same
 * exception). done() never blocks. A handle dropped before wait() waits for its copies in its deallocator, so
 * nothing they read or write is released under them.
 *
 * Threads: finishing runs Python code (consumers' from_dlpack, container constructors) and releases the GIL at
 * times, so no lock is held while it runs. The finishing thread is recorded instead: another thread's wait()
 * sleeps (GIL released, Ctrl-C honoured) until it is done; the same thread calling wait() again from that Python
 * code gets a RuntimeError rather than a deadlock.
 */
#include "ferry_py.h"

#include <pythread.h>
#include <time.h>

typedef struct {
  PyObject_HEAD
  ferry_py_job job;
  PyObject *error;               /* the exception a failed wait() raised, raised again by later calls */
  PyObject *error_tb;            /* its traceback then: each raise starts from it, so the exception does not grow */
  size_t tensors;                /* the batch's tensors, for repr (the job's tape is cleared when it finishes) */
  _Atomic unsigned long finisher; /* the thread finishing the job (PyThread ident), 0 when none */
  pthread_mutex_t lock;          /* with `done`: wakes threads waiting for the finisher */
  pthread_cond_t done;
} Transfer;

static PyObject *start(bool h2d, const char *name, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  Transfer *self = PyObject_GC_New(Transfer, &ferry_py_Transfer_Type);
  if (!self) return NULL;
  pthread_mutex_init(&self->lock, NULL);
  pthread_cond_init(&self->done, NULL);
  self->error = NULL;
  self->error_tb = NULL;
  atomic_init(&self->finisher, 0);
  if (ferry_py_job_start(&self->job, h2d, name, args, nargs, kwnames) < 0) { /* the job is left cleared */
    Py_DECREF(self);
    return NULL;
  }
  self->tensors = self->job.tape.n_leaves;
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
  ferry_py_job_clear(&self->job, true); /* waits for copies still running */
  Py_CLEAR(self->error);
  Py_CLEAR(self->error_tb);
  pthread_cond_destroy(&self->done);
  pthread_mutex_destroy(&self->lock);
  PyObject_GC_Del(self);
}

/* Everything the handle holds is visited, so that a handle in a reference cycle (stored in the batch it
 * transfers, or in its own error's traceback) is collected and its pinned memory returned. */
static int transfer_traverse(Transfer *self, visitproc visit, void *arg) {
  Py_VISIT(self->error);
  Py_VISIT(self->error_tb);
  Py_VISIT(self->job.batch);
  Py_VISIT(self->job.result);
  const ferry_py_batch *tape = &self->job.tape;
  for (size_t i = 0; i < tape->n_nodes; i++) {
    Py_VISIT(tape->nodes[i].obj);
    Py_VISIT(tape->nodes[i].key);
  }
  for (size_t i = 0; i < tape->n_leaves; i++) Py_VISIT(tape->leaves[i].output);
  return 0;
}

/* Breaks a cycle: the copies are waited for first (with the GIL held: a collector must not let other threads
 * in half-way), then everything is released. A handle being finished is never garbage (its thread holds it). */
static int transfer_clear(Transfer *self) {
  ferry_py_job_clear(&self->job, false);
  Py_CLEAR(self->error);
  Py_CLEAR(self->error_tb);
  return 0;
}

static PyObject *raise_stored(Transfer *self) {
  if (PyException_SetTraceback(self->error, self->error_tb ? self->error_tb : Py_None) < 0) return NULL;
  PyErr_SetObject((PyObject *)Py_TYPE(self->error), self->error);
  return NULL;
}

static PyObject *outcome(Transfer *self) {
  if (self->job.state == FERRY_PY_JOB_FINISHED) return Py_NewRef(self->job.result);
  if (self->error) return raise_stored(self);
  PyErr_SetString(PyExc_RuntimeError, "ferry.Transfer: the transfer was released");
  return NULL;
}

/* Another thread is finishing the job: sleeps until it is done, the GIL released, waking to honour Ctrl-C. */
static int await_finisher(Transfer *self) {
  while (atomic_load(&self->finisher) != 0) {
    PyThreadState *ts = ferry_py_pace_unlock(NULL);
    pthread_mutex_lock(&self->lock);
    if (atomic_load(&self->finisher) != 0) {
      struct timespec until;
      clock_gettime(CLOCK_REALTIME, &until);
      until.tv_nsec += 100 * 1000000;
      if (until.tv_nsec >= 1000000000) until.tv_sec++, until.tv_nsec -= 1000000000;
      (void)pthread_cond_timedwait(&self->done, &self->lock, &until);
    }
    pthread_mutex_unlock(&self->lock);
    ferry_py_pace_relock(NULL, ts);
    if (PyErr_CheckSignals() < 0) return -1;
  }
  return 0;
}

static PyObject *transfer_wait(Transfer *self, PyObject *unused) {
  unsigned long me = PyThread_get_thread_ident();
  unsigned long finisher = atomic_load(&self->finisher);
  if (finisher == me) {
    PyErr_SetString(PyExc_RuntimeError, "ferry.Transfer.wait() was called again while this thread is finishing "
                    "the same transfer (from a container's constructor or a consumer's from_dlpack)");
    return NULL;
  }
  if (finisher != 0 && await_finisher(self) < 0) return NULL;
  if (self->job.state != FERRY_PY_JOB_SUBMITTED) return outcome(self);
  atomic_store(&self->finisher, me); /* under the GIL: no other thread can be here at the same time */
  if (ferry_py_job_finish(&self->job) < 0 && self->job.state != FERRY_PY_JOB_SUBMITTED) {
    /* Failed for good (the job was cleared): every later wait() raises the same. An interruption (Ctrl-C) leaves
     * the job submitted, and the next wait() finishes it. */
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb) PyException_SetTraceback(value, tb);
    self->error = Py_NewRef(value);
    self->error_tb = Py_XNewRef(tb);
    PyErr_Restore(type, value, tb);
  }
  pthread_mutex_lock(&self->lock);
  atomic_store(&self->finisher, 0);
  pthread_cond_broadcast(&self->done);
  pthread_mutex_unlock(&self->lock);
  if (PyErr_Occurred()) return NULL;
  return outcome(self);
}

static PyObject *transfer_done(Transfer *self, PyObject *unused) {
  if (self->error) Py_RETURN_TRUE;
  /* Another thread may be in wait(), possibly still waiting for the copies (finisher is set before the wait):
   * ask the ticket, which may be queried while another thread waits on it. The finisher drops job.ticket (and
   * sets the state) under the GIL before it releases the ticket, so a non-NULL ticket here is alive. */
  return PyBool_FromLong(ferry_py_job_query(&self->job));
}

static PyObject *transfer_repr(Transfer *self) {
  const char *dir = self->job.h2d ? "h2d" : "d2h";
  if (self->error) return PyUnicode_FromFormat("<ferry.Transfer %s failed: %s>", dir, Py_TYPE(self->error)->tp_name);
  const char *state = self->job.state == FERRY_PY_JOB_SUBMITTED  ? "submitted"
                      : self->job.state == FERRY_PY_JOB_FINISHED ? "finished"
                                                                 : "released";
  return PyUnicode_FromFormat("<ferry.Transfer %s %s, %zu tensor(s)>", dir, state, self->tensors);
}

static PyMethodDef transfer_methods[] = {
    {"wait", (PyCFunction)transfer_wait, METH_NOARGS,
     "wait()\n--\n\n"
     "Waits for the copies (the GIL is released meanwhile) and returns the rebuilt batch. Later calls return the\n"
     "same object; if the transfer failed, every call raises the same exception."},
    {"done", (PyCFunction)transfer_done, METH_NOARGS,
     "done()\n--\n\n"
     "True when the copies have finished (or failed, or nothing needed copying); never blocks. wait() is still\n"
     "needed to get the batch (or the error)."},
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
              "Holds the inputs, the outputs and the pinned slabs until wait() has returned the batch; dropping\n"
              "it without wait() waits for the copies first. Not constructible directly.",
    .tp_methods = transfer_methods,
};
