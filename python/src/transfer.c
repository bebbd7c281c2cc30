/* transfer.c — one transfer from Python arguments to the rebuilt batch: transfer_tensor_d2h / transfer_tensor_h2d.
 *
 * The order of work, so that host work overlaps the copies:
 *   1. parse the arguments (syntax only); no CUDA -> the batch itself, as SPDL does;
 *   2. resolve the device; walk the batch, reading source-side tensors without copying them;
 *   3. order after the producer (producer_event, else the torch current stream: an event recorded there, which
 *      is SPDL's contract; producers read through __dlpack__ ordered themselves on our stream);
 *   4. submit with the GIL released (ferry_transfer_d2h/h2d, non-blocking);
 *   5. (synchronous form, 32 or more torch outputs) hand the GIL over for a short window while the copies run;
 *   6. build the torch output tensors while the copies run (zero-copy views of the slab);
 *   7. wait with the GIL released;
 *   8. build the other frameworks' outputs and rebuild the containers (no Python code sees an output before
 *      its data has arrived).
 * transfer_tensor_*_async (handle.c) stops after step 6, without step 5, and does 7-8 in wait().
 */
#include "ferry_py.h"

#include <string.h>
#include <time.h>

static bool driver_checked; /* the first ferry_init loads the driver (milliseconds): done without the GIL */

/* ---- phase stamps (off by default) ------------------------------------------------------------------------- */

static bool phase_timing;
static _Thread_local int64_t last_phases[FERRY_PY_PHASE_COUNT];

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline void stamp(ferry_py_job *job, int phase) {
  if (phase_timing) job->phases[phase] = now_ns();
}

/* ---- handing the GIL over while the copies run -------------------------------------------------------------- *
 *
 * Building a torch output costs ~0.6 us with the GIL held (torch's own tensor construction), so a batch of 256
 * holds it for ~150 us right after the copies are submitted. A foreground thread that wants the GIL meanwhile
 * (to launch its compute, in the seed's overlap experiment) cannot get in through brief releases between slices:
 * CPython does not hand the GIL to a waiter on release. The waiter sleeps on a condition variable and takes
 * 10-100 us to wake; the releasing thread takes the GIL back within ~0.05 us, and the waiter goes back to sleep
 * (measured on the CI machine: a release + reacquire costs 0.04 us uncontended, and releasing it every 20 us
 * did not let a thread on another core in any sooner than not releasing it at all). Only forced switching (5 ms,
 * sys.getswitchinterval) would. So the synchronous form, whose thread waits for the copies anyway, releases the
 * GIL for one window long enough for a waiter to wake and take it, and builds the outputs afterwards. The window
 * ends early when the copies finish; while the copies outlast window + build (64 MiB: ~1.3 ms against ~0.25 ms
 * for 256 outputs) it costs nothing end to end; otherwise at most the window. It is skipped when no other Python
 * thread exists (nobody to hand over to), for batches with fewer than HANDOFF_MIN_OUTPUTS torch outputs (their
 * build holds the GIL for less than a waiter's wake-up), in the async form (whose caller wants control back at
 * once), and when the submission itself kept the GIL released for a whole window (thousands of tensors: ~0.3 ms),
 * which gave a waiter the same chance; a second window would only delay the build, which is then the transfer's
 * critical path (4096 outputs: ~1.1-2 ms of build against ~1.2 ms of copies). The two cannot be added up: a waiter
 * that wakes after the GIL was taken back sleeps again and needs a whole new wake-up. The walk before submission
 * is not shortened the same way: it must finish before the copies can start, and per tensor it is a cached type
 * look-up plus torch's dltensor_from_py_object_no_sync (ferry's own part measured at ~0.04 us per tensor on the
 * CI machine), nothing that can move out of the GIL. */

#define HANDOFF_MIN_OUTPUTS 32
#define HANDOFF_QUERY_NS 10000 /* how often the window asks whether the copies are done */

static unsigned handoff_us = 100;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* Whether another Python thread exists that could want the GIL: threading._active (threads started through
 * threading, and foreign threads that called threading.current_thread()) holds more than the caller. Without the
 * threading module loaded there is none (short of bare _thread use). If the registry cannot be read: assume yes. */
static bool other_python_threads(void) {
  static PyObject *active; /* threading._active: one dict for the life of the process */
  if (!active) {
    PyObject *name = PyUnicode_FromString("threading");
    PyObject *threading = name ? PyImport_GetModule(name) : NULL;
    Py_XDECREF(name);
    if (!threading) {
      bool unknown = PyErr_Occurred() != NULL;
      PyErr_Clear();
      return unknown;
    }
    PyObject *a = PyObject_GetAttrString(threading, "_active");
    Py_DECREF(threading);
    if (!a || !PyDict_Check(a)) {
      Py_XDECREF(a);
      PyErr_Clear();
      return true;
    }
    active = a;
  }
  return PyDict_GET_SIZE(active) > 1;
}

/* Releases the GIL for up to handoff_us, or until the copies of `t` are done. */
static void hand_off_gil(ferry_transfer *t) {
  int64_t end = now_ns() + (int64_t)handoff_us * 1000, next_query = 0;
  Py_BEGIN_ALLOW_THREADS for (int64_t now = now_ns(); now < end; now = now_ns()) {
    if (now >= next_query) {
      if (ferry_transfer_query(t) != FERRY_NOT_READY) break; /* done, or failed: wait() reports it */
      next_query = now + HANDOFF_QUERY_NS;
    }
    cpu_relax();
  }
  Py_END_ALLOW_THREADS
}

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

int ferry_py_job_start(ferry_py_job *job, bool h2d, bool sync, const char *name, PyObject *const *args,
                       Py_ssize_t nargs, PyObject *kwnames) {
  memset(job, 0, sizeof *job);
  job->h2d = h2d;
  job->sync = sync;
  stamp(job, FERRY_PY_PHASE_START);
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
  stamp(job, FERRY_PY_PHASE_WALKED);
  /* From release to re-acquisition: a thread that took the GIL meanwhile lengthens it, rightly (it got in). */
  int64_t released_from = now_ns();
  Py_BEGIN_ALLOW_THREADS st = h2d ? ferry_transfer_h2d(tensors, n, &opts, &ticket)
                                  : ferry_transfer_d2h(tensors, n, &opts, &ticket);
  Py_END_ALLOW_THREADS int64_t released_ns = now_ns() - released_from;
  if (st != FERRY_OK) {
    ferry_py_raise(st);
    goto fail;
  }
  job->ticket = ticket;
  job->state = FERRY_PY_JOB_SUBMITTED;
  stamp(job, FERRY_PY_PHASE_SUBMITTED);

  /* Steps 5 and 6: the copies run; build the exchange-path outputs meanwhile, after a hand-off window if the
   * build is long enough to keep another thread out. */
  if (!(job->outputs = ferry_py_outputs_new(ticket))) goto fail;
  size_t exchange_outputs = 0;
  for (size_t i = 0; i < n; i++) exchange_outputs += job->tape.leaves[i].api != NULL;
  if (sync && handoff_us > 0 && exchange_outputs >= HANDOFF_MIN_OUTPUTS &&
      released_ns < (int64_t)handoff_us * 1000 && other_python_threads())
    hand_off_gil(ticket);
  stamp(job, FERRY_PY_PHASE_HANDED);
  for (size_t i = 0; i < n; i++) {
    ferry_py_leaf *leaf = &job->tape.leaves[i];
    if (!leaf->api || !ferry_py_outputs_copied(job->outputs, i)) continue;
    if (!(leaf->output = ferry_py_output_exchange(job->outputs, i, leaf->api))) goto fail;
  }
  stamp(job, FERRY_PY_PHASE_BUILT);
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
  stamp(job, FERRY_PY_PHASE_WAITED);
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
  stamp(job, FERRY_PY_PHASE_FINISHED);
  if (phase_timing) memcpy(last_phases, job->phases, sizeof last_phases);
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
  if (ferry_py_job_start(&job, h2d, true, name, args, nargs, kwnames) < 0) return NULL;
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

/* ---- private switches for the benchmarks -------------------------------------------------------------------- */

PyObject *ferry_py_gil_handoff_us(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs > 1) {
    PyErr_Format(PyExc_TypeError, "_gil_handoff_us() takes at most 1 argument (%zd given)", nargs);
    return NULL;
  }
  unsigned old = handoff_us;
  if (nargs == 1 && args[0] != Py_None) {
    long us = PyLong_AsLong(args[0]);
    if (us == -1 && PyErr_Occurred()) return NULL;
    if (us < 0 || us > 1000000) {
      PyErr_Format(PyExc_ValueError, "_gil_handoff_us(%ld): expected 0 to 1000000 microseconds", us);
      return NULL;
    }
    handoff_us = (unsigned)us;
  }
  return PyLong_FromUnsignedLong(old);
}

PyObject *ferry_py_phase_timing(PyObject *self, PyObject *flag) {
  int on = PyObject_IsTrue(flag);
  if (on < 0) return NULL;
  bool old = phase_timing;
  phase_timing = on;
  return PyBool_FromLong(old);
}

PyObject *ferry_py_last_phases(PyObject *self, PyObject *unused) {
  static const char *names[FERRY_PY_PHASE_COUNT] = {"start", "walked", "submitted", "handed", "built", "waited",
                                                    "finished"};
  PyObject *d = PyDict_New();
  for (int i = 0; d && i < FERRY_PY_PHASE_COUNT; i++) {
    PyObject *v = last_phases[i] ? PyLong_FromLongLong(last_phases[i]) : Py_NewRef(Py_None);
    if (!v || PyDict_SetItemString(d, names[i], v) < 0) Py_CLEAR(d);
    Py_XDECREF(v);
  }
  return d;
}
