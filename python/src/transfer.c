/* transfer.c — one transfer from Python arguments to the rebuilt batch: transfer_tensor_d2h / transfer_tensor_h2d.
 *
 * The order of work, so that host work overlaps the copies:
 *   1. parse the arguments (syntax only); no CUDA -> the batch itself, as SPDL does;
 *   2. resolve the device; walk the batch, reading source-side tensors without copying them;
 *   3. order after the producer (producer_event, else the torch current stream: an event recorded there, which
 *      is SPDL's contract; producers read through __dlpack__ ordered themselves on our stream);
 *   4. submit with the GIL released (ferry_transfer_d2h/h2d, non-blocking);
 *   5. build the torch output tensors while the copies run (zero-copy views of the slab);
 *   6. wait with the GIL released;
 *   7. build the other frameworks' outputs and rebuild the containers (no Python code sees an output before
 *      its data has arrived).
 * transfer_tensor_*_async (handle.c) stops after step 5 and does 6-7 in wait().
 */
#include "ferry_py.h"

#include <string.h>

static bool driver_checked; /* the first ferry_init loads the driver (milliseconds): done without the GIL */

/* Nothing to copy: the job's result is the batch itself. */
static int finish_as_is(ferry_py_job *job) {
  ferry_py_batch_clear(&job->tape);
  job->result = Py_NewRef(job->batch);
  job->state = FERRY_PY_JOB_FINISHED;
  return 0;
}

/* Options for ferry: device, stream and the producer ordering (step 3 above). Returns 0 or -1. */
static int make_options(const ferry_py_args *a, ferry_py_read_ctx *ctx, ferry_transfer_options *o) {
  ferry_transfer_options_init(o);
  o->device = ctx->device;
  o->stream = a->stream;
  o->producer_event = a->producer_event;
  if (a->producer_event) return 0;
  if (ctx->producer_api) {
    void *current = NULL;
    if (ctx->producer_api->current_work_stream(kDLCUDA, ctx->device, &current) != 0) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "the framework could not tell its current stream");
      return -1;
    }
    o->producer_stream = current; /* NULL is the legacy default stream, as for ferry */
    return 0;
  }
  /* Only __dlpack__ producers (ordered on our stream already) or host inputs: no further ordering. ferry skips
   * the event when the producer stream is the copy stream itself. */
  if (!ctx->have_copy_stream) {
    ferry_status st = ferry_copy_stream(ctx->device, &ctx->copy_stream);
    if (st != FERRY_OK) {
      ferry_py_raise(st);
      return -1;
    }
    ctx->have_copy_stream = true;
  }
  o->producer_stream = ctx->copy_stream;
  return 0;
}

int ferry_py_job_start(ferry_py_job *job, bool h2d, const char *name, PyObject *const *args, Py_ssize_t nargs,
                       PyObject *kwnames) {
  memset(job, 0, sizeof *job);
  job->h2d = h2d;
  ferry_py_args a;
  if (ferry_py_args_parse(name, args, nargs, kwnames, &a) < 0) return -1;
  job->batch = Py_NewRef(a.batch);

  ferry_status st;
  if (!driver_checked) {
    Py_BEGIN_ALLOW_THREADS st = ferry_init();
    Py_END_ALLOW_THREADS driver_checked = true;
  } else {
    st = ferry_init();
  }
  if (st == FERRY_NO_DRIVER || st == FERRY_NO_DEVICE) { /* no CUDA: the input as it is */
    ferry_clear_error();
    return finish_as_is(job);
  }
  if (st != FERRY_OK) {
    ferry_py_raise(st);
    goto fail;
  }

  ferry_py_read_ctx ctx;
  memset(&ctx, 0, sizeof ctx);
  ctx.h2d = h2d;
  if (ferry_py_args_resolve_device(&a, &ctx.device) < 0) goto fail;
  ctx.copy_stream = a.stream;
  ctx.have_copy_stream = a.stream != NULL;
  ctx.producer_event_given = a.producer_event != NULL;
  if (ferry_py_batch_walk(&job->tape, job->batch, &ctx) < 0) goto fail;
  if (job->tape.n_leaves == 0) return finish_as_is(job);

  ferry_transfer_options opts;
  if (make_options(&a, &ctx, &opts) < 0) goto fail;
  ferry_transfer *ticket = NULL;
  const ferry_tensor *tensors = job->tape.tensors;
  size_t n = job->tape.n_leaves;
  Py_BEGIN_ALLOW_THREADS st = h2d ? ferry_transfer_h2d(tensors, n, &opts, &ticket)
                                  : ferry_transfer_d2h(tensors, n, &opts, &ticket);
  Py_END_ALLOW_THREADS if (st != FERRY_OK) {
    ferry_py_raise(st);
    goto fail;
  }
  job->ticket = ticket;
  job->state = FERRY_PY_JOB_SUBMITTED;

  /* Step 5: the copies run; build the exchange-path outputs meanwhile. */
  if (!(job->outputs = ferry_py_outputs_new(ticket))) goto fail;
  for (size_t i = 0; i < n; i++) {
    ferry_py_leaf *leaf = &job->tape.leaves[i];
    if (!leaf->api || !ferry_py_outputs_copied(job->outputs, i)) continue;
    if (!(leaf->output = ferry_py_output_exchange(job->outputs, i, leaf->api))) goto fail;
  }
  return 0;

fail:
  ferry_py_job_clear(job); /* waits for submitted copies before anything they touch is released */
  return -1;
}

/* Waits for the copies with the GIL released, so other Python threads run meanwhile. */
static ferry_status wait_copies(ferry_py_job *job) {
  ferry_status st;
  ferry_transfer *t = job->ticket;
  Py_BEGIN_ALLOW_THREADS st = ferry_transfer_wait(t);
  Py_END_ALLOW_THREADS return st;
}

int ferry_py_job_finish(ferry_py_job *job) {
  if (job->state != FERRY_PY_JOB_SUBMITTED) return 0;
  ferry_status st = wait_copies(job);
  if (st != FERRY_OK) {
    ferry_py_raise(st);
    goto fail;
  }
  ferry_py_batch *tape = &job->tape;
  for (size_t i = 0; i < tape->n_leaves; i++) {
    ferry_py_leaf *leaf = &tape->leaves[i];
    ferry_py_leaf_release_input(leaf); /* the copies out of the producer's memory are done */
    if (leaf->output || !ferry_py_outputs_copied(job->outputs, i)) continue;
    if (!(leaf->output = ferry_py_output_wrap(job->outputs, i, leaf->family, job->h2d))) goto fail;
  }
  if (!(job->result = ferry_py_batch_rebuild(tape))) goto fail;
  /* The outputs hold the slab now; the ticket, the tape and the block's own reference can go. */
  ferry_transfer_release(job->ticket);
  job->ticket = NULL;
  ferry_py_outputs_unref(job->outputs);
  job->outputs = NULL;
  ferry_py_batch_clear(tape);
  job->state = FERRY_PY_JOB_FINISHED;
  return 0;

fail:
  ferry_py_job_clear(job);
  return -1;
}

int ferry_py_job_query(ferry_py_job *job, pthread_mutex_t *lock) {
  if (job->state != FERRY_PY_JOB_SUBMITTED) return 1;
  if (lock && pthread_mutex_trylock(lock) != 0) return 0; /* another thread is waiting on it */
  ferry_status st = ferry_transfer_query(job->ticket);
  if (lock) pthread_mutex_unlock(lock);
  if (st == FERRY_NOT_READY) return 0;
  return 1; /* done; a failure is reported by wait() */
}

void ferry_py_job_clear(ferry_py_job *job) {
  if (job->state == FERRY_PY_JOB_SUBMITTED && job->ticket) {
    /* Copies may still read the inputs and write the outputs: wait (errors are moot now). */
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    (void)wait_copies(job);
    PyErr_Restore(type, value, tb);
  }
  ferry_transfer_release(job->ticket);
  job->ticket = NULL;
  ferry_py_batch_clear(&job->tape); /* drops outputs built so far, then the inputs */
  ferry_py_outputs_unref(job->outputs);
  job->outputs = NULL;
  Py_CLEAR(job->batch);
  Py_CLEAR(job->result);
  job->state = FERRY_PY_JOB_EMPTY;
}

/* ---- the synchronous functions ---------------------------------------------------------------------------- */

static PyObject *transfer(bool h2d, const char *name, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  ferry_py_job job;
  if (ferry_py_job_start(&job, h2d, name, args, nargs, kwnames) < 0) return NULL;
  if (ferry_py_job_finish(&job) < 0) return NULL;
  PyObject *result = job.result;
  job.result = NULL;
  ferry_py_job_clear(&job);
  return result;
}

PyObject *ferry_py_transfer_d2h(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  return transfer(false, "transfer_tensor_d2h", args, nargs, kwnames);
}

PyObject *ferry_py_transfer_h2d(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  return transfer(true, "transfer_tensor_h2d", args, nargs, kwnames);
}
