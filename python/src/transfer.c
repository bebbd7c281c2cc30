/* transfer.c — one transfer from Python: arguments → walk and submit in parts → wait → rebuilt batch.
 *
 * The call is a pipeline, so that its time approaches max(host work, copies) instead of their sum, and so that
 * no GIL hold is longer than a slice (pace.c):
 *   1. parse the arguments (syntax only); no CUDA -> the batch itself, as SPDL does, after walking it (cycles,
 *      depth) and checking LOCAL_RANK;
 *   2. resolve the device; walk the batch, reading source-side tensors and copying their descriptors;
 *   3. release the GIL at points of the walk (every slice of holding), and hand the tensors walked so far to
 *      ferry as one part (ferry_transfer_add, GIL released) each time they make a part's count (part_point):
 *      their copies start at once. The first part also begins
 *      the transfer, ordered after the producer (producer_event, else the framework's current stream: an event
 *      recorded there, which is SPDL's contract; producers read through __dlpack__ order themselves on our
 *      stream);
 *   4. end the transfer, then build the torch outputs (zero-copy views of the parts' slabs, through the DLPack
 *      exchange API) while the copies run, in slices like the walk, and rebuild the batch too when that runs no
 *      Python code (plain lists, tuples and dicts of str or int keys);
 *   5. wait with the GIL released;
 *   6. build the other frameworks' outputs and rebuild the containers if step 4 did not, in slices (no Python
 *      code sees an output before its data has arrived).
 * transfer_tensor_*_async (handle.c) returns after step 4, and does the wait and step 6 in wait().
 */
#include "ferry_py.h"

#include <string.h>
#include <time.h>

static bool driver_checked; /* the first ferry_init loads the driver (milliseconds): done without the GIL */

/* ---- phase stamps and GIL statistics (off by default) ----------------------------------------------------------- */

static bool phase_timing;
static _Thread_local int64_t last_phases[FERRY_PY_PHASE_COUNT];
static _Thread_local ferry_py_pace last_pace;
static _Thread_local size_t last_parts;
static _Thread_local bool last_rebuilt_ahead;

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline void stamp(ferry_py_job *job, int phase) {
  if (phase_timing && !job->phases[phase]) job->phases[phase] = now_ns();
}

/* ---- parts ------------------------------------------------------------------------------------------------------ */

/* The stream of the framework's current work on the device, for ordering the copies after it. 0 or -1. */
static int current_stream(ferry_py_job *job, const DLPackExchangeAPI *api, void **out) {
  if (api->current_work_stream(kDLCUDA, job->ctx.device, out) != 0) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "the framework could not tell its current stream");
    return -1;
  }
  return 0; /* NULL is the legacy default stream, as for ferry */
}

/* Options for the first part (step 3's ordering). 0 or -1. */
static int make_options(ferry_py_job *job, const ferry_py_args *a) {
  ferry_transfer_options *o = &job->opts;
  ferry_transfer_options_init(o);
  o->device = job->ctx.device;
  o->stream = a->stream;
  o->producer_event = a->producer_event;
  if (a->producer_event) return 0;
  if (job->ctx.producer_api) {
    job->ordered_after = job->ctx.producer_api;
    return current_stream(job, job->ctx.producer_api, &o->producer_stream);
  }
  /* Only __dlpack__ producers (ordered on our stream already) or host inputs so far: ferry skips the event when
   * the producer stream is the copy stream itself. */
  if (!job->ctx.have_copy_stream) {
    ferry_status st = ferry_copy_stream(job->ctx.device, &job->ctx.copy_stream);
    if (st != FERRY_OK) {
      ferry_py_raise(st);
      return -1;
    }
    job->ctx.have_copy_stream = true;
  }
  o->producer_stream = job->ctx.copy_stream;
  return 0;
}

static int push_block(ferry_py_job *job, ferry_py_outputs *block) {
  if (job->n_blocks == job->cap_blocks) {
    size_t cap = job->cap_blocks ? 2 * job->cap_blocks : 8;
    ferry_py_outputs **p = PyMem_Realloc(job->blocks, cap * sizeof *p);
    if (!p) {
      ferry_py_outputs_unref(block);
      PyErr_NoMemory();
      return -1;
    }
    job->blocks = p;
    job->cap_blocks = cap;
  }
  job->blocks[job->n_blocks++] = block;
  return 0;
}

/* Takes `block`, the outputs of leaves [first, first + count): each leaf learns where its output lies. 0 or -1. */
static int place_outputs(ferry_py_job *job, ferry_py_outputs *block, size_t first, size_t count) {
  if (push_block(job, block) < 0) return -1;
  for (size_t i = 0; i < count; i++) {
    job->tape.leaves[first + i].block = block;
    job->tape.leaves[first + i].local = (uint32_t)i;
  }
  return 0;
}

/* Builds the torch (exchange API) outputs of every part and, when that runs no Python code, the rebuilt batch,
 * while the copies run (step 4): after the last part is queued, so that no part waits for the outputs of the
 * ones before it. Nothing sees them before the copies are done: they are the job's until finish. 0 or -1. */
static int build_ahead(ferry_py_job *job) {
  int rc = 0, deferring_gc = ferry_py_gc_defer_begin(); /* the new outputs: no collection among them */
  for (size_t i = 0; i < job->tape.n_leaves && rc == 0; i++) {
    ferry_py_leaf *leaf = &job->tape.leaves[i];
    if (!leaf->api || !leaf->block || !ferry_py_outputs_copied(leaf->block, leaf->local)) continue;
    leaf->output = ferry_py_math_bits_flip(ferry_py_output_exchange(leaf->block, leaf->local, leaf->api),
                                          leaf->math_bits);
    rc = !leaf->output || ferry_py_pace_tick(&job->pace) < 0 ? -1 : 0;
  }
  if (rc == 0 && ferry_py_batch_rebuild_is_plain(&job->tape) &&
      !(job->result = ferry_py_batch_rebuild(&job->tape, &job->pace)))
    rc = -1;
  ferry_py_gc_defer_end(deferring_gc);
  return rc;
}

/* Hands the leaves walked since the last part to ferry as one part, with the GIL released. 0 or -1. */
static int submit_walked(ferry_py_job *job) {
  ferry_py_batch *tape = &job->tape;
  void *order_stream = NULL;
  bool reorder = false;
  if (!job->ticket) {
    if (make_options(job, job->args) < 0) return -1;
  } else if (!job->opts.producer_event && job->ctx.producer_api && job->ctx.producer_api != job->ordered_after) {
    /* The first torch tensor came after the first part: order the copies from here on after its stream too. */
    if (current_stream(job, job->ctx.producer_api, &order_stream) < 0) return -1;
    job->ordered_after = job->ctx.producer_api;
    reorder = true;
  }
  size_t first, count;
  const ferry_tensor *tensors = ferry_py_batch_take_pending(tape, &first, &count);
  ferry_status st = FERRY_OK;
  bool began = false;
  PyThreadState *ts = ferry_py_pace_unlock(&job->pace);
  if (!job->ticket) {
    st = job->h2d ? ferry_transfer_begin_h2d(&job->opts, &job->ticket) : ferry_transfer_begin_d2h(&job->opts, &job->ticket);
    began = st == FERRY_OK;
  }
  if (st == FERRY_OK && reorder) st = ferry_transfer_order_after(job->ticket, NULL, order_stream);
  if (st == FERRY_OK) st = ferry_transfer_add(job->ticket, tensors, count);
  ferry_py_outputs *block = st == FERRY_OK ? ferry_py_outputs_new(job->ticket, first, count) : NULL;
  ferry_py_pace_relock(&job->pace, ts);
  if (began) job->state = FERRY_PY_JOB_SUBMITTED; /* from here on, clearing the job waits for the copies */
  if (st != FERRY_OK) {
    ferry_py_raise(st);
    return -1;
  }
  if (!block) {
    PyErr_Format(PyExc_MemoryError, "allocating the outputs of %zu tensors", count);
    return -1;
  }
  stamp(job, FERRY_PY_PHASE_FIRST);
  return place_outputs(job, block, first, count);
}

/* Parts are cut by tensor count alone, never where a time slice ends, so that every call of one batch is cut at
 * the same tensors: its slabs have the same sizes from call to call and the pinned pool serves them from the
 * ranges the first call pinned instead of growing. Part k (from 0) goes early, after FIRST_PART_TENSORS << k
 * tensors for k < EARLY_PARTS, when those average under FERRY_PY_EARLY_PART_MAX_MEAN_BYTES: so small tensors'
 * copies start early and each part is queued before the one ahead of it has copied. Otherwise a part is
 * PART_TENSORS: a part costs ~30-50 us of driver calls (a slab, a gather launch, its upload, events), against
 * ~0.3 us per tensor walked. */
#define FIRST_PART_TENSORS 64
#define EARLY_PARTS 4 /* 64, 128, 256, 512: the ramp up to PART_TENSORS */
#define PART_TENSORS 1024
_Static_assert(FIRST_PART_TENSORS << EARLY_PARTS == PART_TENSORS, "the ramp ends at a full part");

/* After each leaf walked: a part when the leaves walked since the last one make a part's count. 0 or -1. */
static int part_point(void *arg) {
  ferry_py_job *job = arg;
  const size_t pending = job->tape.n_leaves - job->tape.pending, parts = job->n_blocks;
  const bool early = parts < EARLY_PARTS && pending == (size_t)FIRST_PART_TENSORS << parts &&
                     job->tape.pending_bytes / pending < FERRY_PY_EARLY_PART_MAX_MEAN_BYTES;
  return pending == PART_TENSORS || early ? submit_walked(job) : 0;
}

/* ---- the job ----------------------------------------------------------------------------------------------------- */

/* Nothing to copy: the job's result is the batch itself. */
static int finish_as_is(ferry_py_job *job) {
  ferry_py_batch_clear(&job->tape, NULL);
  job->result = Py_NewRef(job->batch);
  job->state = FERRY_PY_JOB_FINISHED;
  return 0;
}

/* Without CUDA the batch comes back as it is, after the checks that need no device: LOCAL_RANK's syntax, and the
 * batch's structure (cycles, depth, dicts changing under the walk). */
static int pass_through(ferry_py_job *job, const ferry_py_args *a) {
  int device;
  ferry_status st = ferry_device_resolve(a->device >= 0 ? a->device : -1, &device);
  if (st == FERRY_INVALID_ARGUMENT) {
    ferry_py_raise(st);
    return -1;
  }
  job->ctx.pass_all = true;
  if (ferry_py_batch_walk(&job->tape, job->batch, &job->ctx, NULL, NULL, NULL) < 0) return -1;
  return finish_as_is(job);
}

int ferry_py_job_start(ferry_py_job *job, bool h2d, const char *name, PyObject *const *args, Py_ssize_t nargs,
                       PyObject *kwnames) {
  memset(job, 0, sizeof *job);
  job->h2d = h2d;
  stamp(job, FERRY_PY_PHASE_START);
  ferry_py_args a;
  if (ferry_py_args_parse(name, args, nargs, kwnames, &a) < 0) return -1;
  job->batch = Py_NewRef(a.batch);
  job->args = &a;
  job->ctx.h2d = h2d;
  int sharing = 0;

  ferry_status st;
  if (!driver_checked) {
    PyThreadState *ts = ferry_py_pace_unlock(NULL);
    st = ferry_init();
    ferry_py_pace_relock(NULL, ts);
    driver_checked = true;
  } else {
    st = ferry_init();
  }
  if (st == FERRY_NO_DRIVER || st == FERRY_NO_DEVICE) {
    if (pass_through(job, &a) < 0) goto fail;
    job->args = NULL;
    return 0;
  }
  if (st != FERRY_OK) {
    ferry_py_raise(st);
    goto fail;
  }
  if (ferry_py_args_resolve_device(&a, &job->ctx.device) < 0) goto fail;
  job->ctx.copy_stream = a.stream;
  job->ctx.have_copy_stream = a.stream != NULL;
  job->ctx.producer_event_given = a.producer_event != NULL;

  if ((sharing = ferry_py_gil_share_begin()) < 0) goto fail;
  ferry_py_gil_start_yield(sharing);
  ferry_py_pace_init(&job->pace, ferry_py_gil_slice_ns, phase_timing);
  if (ferry_py_batch_walk(&job->tape, job->batch, &job->ctx, &job->pace, part_point, job) < 0) goto fail;
  if (job->tape.n_leaves == 0) {
    ferry_py_gil_share_end(sharing);
    job->args = NULL;
    return finish_as_is(job);
  }
  if (job->tape.pending < job->tape.n_leaves && submit_walked(job) < 0) goto fail; /* the last part */
  PyThreadState *ts = ferry_py_pace_unlock(&job->pace);
  st = ferry_transfer_end(job->ticket);
  ferry_py_pace_relock(&job->pace, ts);
  if (st != FERRY_OK) {
    ferry_py_raise(st);
    goto fail;
  }
  if (build_ahead(job) < 0) goto fail;
  stamp(job, FERRY_PY_PHASE_WALKED);
  ferry_py_gil_share_end(sharing);
  job->args = NULL;
  return 0;

fail:
  ferry_py_gil_share_end(sharing);
  job->args = NULL;
  ferry_py_job_clear(job, true); /* waits for submitted copies before anything they touch is released */
  return -1;
}

/* Waits for the copies with the GIL released, so other Python threads run meanwhile. */
static ferry_status wait_copies(ferry_py_job *job) {
  PyThreadState *ts = ferry_py_pace_unlock(&job->pace);
  ferry_status st = ferry_transfer_wait(job->ticket);
  ferry_py_pace_relock(&job->pace, ts);
  return st;
}

static void save_last(ferry_py_job *job, size_t parts, bool rebuilt_ahead) {
  if (!phase_timing) return;
  memcpy(last_phases, job->phases, sizeof last_phases);
  last_pace = job->pace;
  last_parts = parts;
  last_rebuilt_ahead = rebuilt_ahead;
}

int ferry_py_job_finish(ferry_py_job *job) {
  if (job->state != FERRY_PY_JOB_SUBMITTED) return 0;
  int sharing = ferry_py_gil_share_begin(), deferring_gc = 0;
  if (sharing < 0) goto fail;
  ferry_py_pace_resume(&job->pace);
  job->pace.interrupted = false;
  ferry_status st = wait_copies(job);
  if (st != FERRY_OK) {
    ferry_py_raise(st);
    goto fail;
  }
  stamp(job, FERRY_PY_PHASE_WAITED);
  ferry_py_batch *tape = &job->tape;
  for (size_t i = 0; i < tape->n_leaves; i++) { /* the copies out of the producers' memory are done */
    ferry_py_leaf_release_input(&tape->leaves[i]);
    if (ferry_py_pace_tick(&job->pace) < 0) goto fail;
  }
  deferring_gc = ferry_py_gc_defer_begin(); /* the remaining outputs and the rebuilt containers */
  for (size_t i = 0; i < tape->n_leaves; i++) {
    ferry_py_leaf *leaf = &tape->leaves[i];
    if (!leaf->output && leaf->block && ferry_py_outputs_copied(leaf->block, leaf->local) &&
        !(leaf->output = ferry_py_math_bits_flip(
              ferry_py_output_wrap(leaf->block, leaf->local, leaf->family, job->h2d), leaf->math_bits)))
      goto fail;
    if (ferry_py_pace_tick(&job->pace) < 0) goto fail;
  }
  const bool rebuilt_ahead = job->result != NULL; /* by build_ahead */
  if (!rebuilt_ahead && !(job->result = ferry_py_batch_rebuild(tape, &job->pace))) goto fail;
  ferry_py_gc_defer_end(deferring_gc);
  deferring_gc = 0;
  /* The outputs hold the slabs now; the blocks' own references, the tape and the ticket can go. */
  size_t parts = job->n_blocks;
  for (size_t k = 0; k < job->n_blocks; k++) ferry_py_outputs_unref(job->blocks[k]);
  job->n_blocks = 0;
  bool large = ferry_py_batch_large(tape);
  ferry_py_batch_clear(tape, &job->pace);
  ferry_transfer *ticket = job->ticket;
  job->ticket = NULL;
  job->state = FERRY_PY_JOB_FINISHED;
  stamp(job, FERRY_PY_PHASE_FINISHED);
  ferry_py_pace_pause(&job->pace);
  if (large) { /* freeing a large plan's memory needs no GIL */
    PyThreadState *ts = ferry_py_pace_unlock(NULL);
    ferry_transfer_release(ticket);
    ferry_py_pace_relock(NULL, ts);
  } else {
    ferry_transfer_release(ticket);
  }
  save_last(job, parts, rebuilt_ahead);
  ferry_py_gil_share_end(sharing);
  return 0;

fail:
  ferry_py_gc_defer_end(deferring_gc);
  ferry_py_gil_share_end(sharing);
  /* Interrupted (Ctrl-C at a release point) rather than failed: the copies are fine and every step above can be
   * run again, so the job stays submitted for the next wait(); its caller clears it if it wants no retry. */
  if (job->pace.interrupted) return -1;
  ferry_py_job_clear(job, true);
  return -1;
}

int ferry_py_job_query(ferry_py_job *job) {
  if (job->state != FERRY_PY_JOB_SUBMITTED || !job->ticket) return 1; /* finished, failed or being cleared */
  return ferry_transfer_query(job->ticket) != FERRY_NOT_READY; /* a failure is reported by wait() */
}

void ferry_py_job_clear(ferry_py_job *job, bool release_gil) {
  if (job->ticket) {
    /* Copies may still read the inputs and write the outputs: end the transfer if the walk stopped half-way,
     * and wait for everything queued (errors are moot now). */
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyThreadState *ts = release_gil ? ferry_py_pace_unlock(NULL) : NULL;
    (void)ferry_transfer_end(job->ticket);
    (void)ferry_transfer_wait(job->ticket);
    if (ts) ferry_py_pace_relock(NULL, ts);
    PyErr_Restore(type, value, tb);
    ferry_transfer_release(job->ticket);
    job->ticket = NULL;
  }
  ferry_py_batch_clear(&job->tape, NULL); /* drops outputs built so far, then the inputs */
  for (size_t k = 0; k < job->n_blocks; k++) ferry_py_outputs_unref(job->blocks[k]);
  PyMem_Free(job->blocks);
  job->blocks = NULL;
  job->n_blocks = job->cap_blocks = 0;
  Py_CLEAR(job->batch);
  Py_CLEAR(job->result);
  job->state = FERRY_PY_JOB_EMPTY;
}

/* ---- the synchronous functions ---------------------------------------------------------------------------- */

static PyObject *transfer(bool h2d, const char *name, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  ferry_py_job job;
  if (ferry_py_job_start(&job, h2d, name, args, nargs, kwnames) < 0) return NULL;
  if (ferry_py_job_finish(&job) < 0) {
    ferry_py_job_clear(&job, true); /* no-op unless it was interrupted */
    return NULL;
  }
  PyObject *result = job.result;
  job.result = NULL;
  ferry_py_job_clear(&job, true);
  return result;
}

PyObject *ferry_py_transfer_d2h(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  return transfer(false, "transfer_tensor_d2h", args, nargs, kwnames);
}

PyObject *ferry_py_transfer_h2d(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  return transfer(true, "transfer_tensor_h2d", args, nargs, kwnames);
}

/* ---- private switches for the benchmarks and tests ---------------------------------------------------------- */

PyObject *ferry_py_gil_pacing(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs > 2) {
    PyErr_Format(PyExc_TypeError, "_gil_pacing() takes at most 2 arguments (%zd given)", nargs);
    return NULL;
  }
  PyObject *old = Py_BuildValue("(LL)", (long long)(ferry_py_gil_slice_ns / 1000),
                                (long long)(ferry_py_gil_switch_ns / 1000));
  int64_t *settings[2] = {&ferry_py_gil_slice_ns, &ferry_py_gil_switch_ns};
  for (Py_ssize_t i = 0; old && i < nargs; i++) {
    if (args[i] == Py_None) continue;
    long long us = PyLong_AsLongLong(args[i]);
    if (us == -1 && PyErr_Occurred()) Py_CLEAR(old);
    else if (us < 0 || us > 1000000) {
      PyErr_Format(PyExc_ValueError, "_gil_pacing: %lld us: expected 0 to 1000000", us);
      Py_CLEAR(old);
    } else {
      *settings[i] = (int64_t)us * 1000;
    }
  }
  return old;
}

PyObject *ferry_py_gil_start_yield_us(PyObject *self, PyObject *arg) {
  long long old = ferry_py_gil_start_yield_ns / 1000;
  if (arg != Py_None) {
    long long us = PyLong_AsLongLong(arg);
    if (us == -1 && PyErr_Occurred()) return NULL;
    if (us < 0 || us > 1000000) {
      PyErr_Format(PyExc_ValueError, "_gil_start_yield_us: %lld us: expected 0 to 1000000", us);
      return NULL;
    }
    ferry_py_gil_start_yield_ns = (int64_t)us * 1000;
  }
  return PyLong_FromLongLong(old);
}

PyObject *ferry_py_phase_timing(PyObject *self, PyObject *flag) {
  int on = PyObject_IsTrue(flag);
  if (on < 0) return NULL;
  bool old = phase_timing;
  phase_timing = on;
  return PyBool_FromLong(old);
}

PyObject *ferry_py_last_phases(PyObject *self, PyObject *unused) {
  static const char *names[FERRY_PY_PHASE_COUNT] = {"start", "first_part", "walked", "waited", "finished"};
  PyObject *d = PyDict_New();
  for (int i = 0; d && i < FERRY_PY_PHASE_COUNT; i++) {
    PyObject *v = last_phases[i] ? PyLong_FromLongLong(last_phases[i]) : Py_NewRef(Py_None);
    if (!v || PyDict_SetItemString(d, names[i], v) < 0) Py_CLEAR(d);
    Py_XDECREF(v);
  }
  PyObject *hist = d ? PyTuple_New(8) : NULL;
  for (int i = 0; hist && i < 8; i++) {
    PyObject *v = PyLong_FromUnsignedLong(last_pace.hold_hist[i]);
    if (!v) Py_CLEAR(hist);
    else PyTuple_SET_ITEM(hist, i, v);
  }
  PyObject *extra = hist ? Py_BuildValue("{s:L,s:I,s:N,s:n,s:I,s:O}", "max_hold_ns",
                                          (long long)last_pace.max_hold_ns, "holds", (unsigned)last_pace.holds,
                                          "hold_hist", hist, "parts", (Py_ssize_t)last_parts, "tape_grown_holding",
                                          (unsigned)last_pace.tape_grown_holding, "rebuilt_ahead",
                                          last_rebuilt_ahead ? Py_True : Py_False)
                         : NULL;
  if (!extra || PyDict_Update(d, extra) < 0) Py_CLEAR(d);
  Py_XDECREF(extra);
  return d;
}
