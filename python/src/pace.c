/* pace.c — bounded GIL holds: while ferry holds the GIL for long work, a thread that wants it gets it within about
 * a slice.
 *
 * A C extension is never preempted by CPython's switch interval: a walk over 4096 tensors holds the GIL for
 * ~1 ms, and a foreground thread launching kernels waits all that time. So long work ticks a pace, and at most
 * every slice (50 us) a tick makes a release point. Releasing alone is not enough: CPython does not hand the GIL
 * to a waiter on release, and a waiter sleeps until its own timed wait (the switch interval) expires; only then
 * does it ask, and the holder's next release waits until the waiter has taken the GIL (CPython's forced
 * switching). So while sharing, ferry shortens the switch interval to its slice: a waiting thread asks within a
 * slice, and is handed the GIL at ferry's next release point, within another. A thread that started waiting
 * before that (released from the same barrier as the transfer's thread) still waits out its old interval, so a
 * call that shares first steps aside for ~30 us. With nobody waiting, a release point costs a release and a
 * re-acquisition (~0.1 us). docs/results.md has the measurements behind these numbers.
 */
#include "ferry_py.h"

#include <sched.h>
#include <string.h>
#include <time.h>

int64_t ferry_py_gil_slice_ns = 50000;
int64_t ferry_py_gil_switch_ns = 50000;
int64_t ferry_py_gil_start_yield_ns = 30000;

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void ferry_py_pace_init(ferry_py_pace *p, int64_t slice_ns, bool measure) {
  memset(p, 0, sizeof *p);
  p->slice_ns = slice_ns;
  p->measure = measure;
  p->since = now_ns();
}

static void end_hold(ferry_py_pace *p, int64_t now) {
  if (!p->measure) return;
  int64_t held = now - p->since;
  if (held > p->max_hold_ns) p->max_hold_ns = held;
  p->holds++;
  int bucket = 0;
  for (int64_t limit = 25000; bucket < 7 && held >= limit; limit *= 2) bucket++;
  p->hold_hist[bucket]++;
}

void ferry_py_pace_pause(ferry_py_pace *p) { end_hold(p, now_ns()); }
void ferry_py_pace_resume(ferry_py_pace *p) { p->since = now_ns(); }

PyThreadState *ferry_py_pace_unlock(ferry_py_pace *p) {
  if (p) ferry_py_pace_pause(p);
  ferry_py_gc_lend();
  return PyEval_SaveThread();
}

void ferry_py_pace_relock(ferry_py_pace *p, PyThreadState *ts) {
  PyEval_RestoreThread(ts);
  ferry_py_gc_reclaim();
  if (p) ferry_py_pace_resume(p);
}

/* A release point. With `signals`, Python's signal handlers run there too (while the collector is lent: they are
 * the application's code); -1 when one raised. */
static int hand_over(ferry_py_pace *p, bool signals) {
  end_hold(p, now_ns());
  ferry_py_gc_lend();
  Py_BEGIN_ALLOW_THREADS Py_END_ALLOW_THREADS
  int rc = signals && PyErr_CheckSignals() < 0 ? -1 : 0;
  ferry_py_gc_reclaim();
  p->since = now_ns();
  return rc;
}

int ferry_py_pace_check(ferry_py_pace *p) {
  if (now_ns() - p->since < p->slice_ns) return 0;
  /* Long work is interruptible: Ctrl-C raises here (on the main thread) instead of after the whole batch. */
  if (hand_over(p, true) == 0) return 0;
  p->interrupted = true;
  return -1;
}

void ferry_py_pace_check_quiet(ferry_py_pace *p) {
  if (now_ns() - p->since >= p->slice_ns) (void)hand_over(p, false);
}

/* ---- the switch interval while sharing -------------------------------------------------------------------- */

static int sharing;         /* nested begin calls (threads transferring at once); guarded by the GIL */
static double saved_switch; /* CPython's interval before the first of them, seconds */
static double ferry_switch; /* the interval ferry set */

static double switch_interval(void) {
  PyObject *f = PySys_GetObject("getswitchinterval"); /* borrowed */
  PyObject *v = f ? PyObject_CallNoArgs(f) : NULL;
  double s = v ? PyFloat_AsDouble(v) : -1.0;
  Py_XDECREF(v);
  return s;
}

static int set_switch_interval(double seconds) {
  PyObject *f = PySys_GetObject("setswitchinterval");
  PyObject *arg = PyFloat_FromDouble(seconds);
  PyObject *v = f && arg ? PyObject_CallOneArg(f, arg) : NULL;
  Py_XDECREF(arg);
  if (!v) return -1;
  Py_DECREF(v);
  return 0;
}

bool ferry_py_other_python_threads(void) {
  static PyObject *active; /* threading._active: one dict for the life of the process */
  if (!active) {
    PyObject *name = PyUnicode_FromString("threading");
    PyObject *threading = name ? PyImport_GetModule(name) : NULL;
    Py_XDECREF(name);
    if (!threading) { /* not imported: no thread started through it (short of bare _thread use) */
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

int ferry_py_gil_share_begin(void) {
#ifdef Py_GIL_DISABLED
  return 0; /* no GIL to share */
#else
  if (ferry_py_gil_switch_ns <= 0 || !ferry_py_gil_slice_ns || !ferry_py_other_python_threads()) return 0;
  if (sharing++ > 0) return 1;
  double want = (double)ferry_py_gil_switch_ns * 1e-9;
  saved_switch = switch_interval();
  if (saved_switch < 0 || saved_switch <= want || set_switch_interval(want) < 0) {
    ferry_switch = -1; /* already as short (or unreadable): leave it */
    PyErr_Clear();
    return 1;
  }
  ferry_switch = switch_interval(); /* as CPython reports it back (it keeps microseconds) */
  return 1;
#endif
}

void ferry_py_gil_start_yield(int sharing) {
  if (sharing <= 0 || ferry_py_gil_start_yield_ns <= 0) return;
  /* A thread released together with this one (from a barrier, an event) is waiting for the GIL with the old,
   * long switch interval: stepping aside for about one wake-up lets it run to its next release first. */
  PyThreadState *ts = ferry_py_pace_unlock(NULL);
  for (int64_t until = now_ns() + ferry_py_gil_start_yield_ns; now_ns() < until;) sched_yield();
  ferry_py_pace_relock(NULL, ts);
}

/* A child forked while a thread of this process was sharing has no such thread: the interval goes back to the
 * application's, and the count to zero (os.register_at_fork's after_in_child, registered at import). */
static PyObject *after_fork_in_child(PyObject *self, PyObject *unused) {
  if (sharing > 0 && ferry_switch >= 0 && switch_interval() == ferry_switch && set_switch_interval(saved_switch) < 0)
    PyErr_Clear();
  sharing = 0;
  Py_RETURN_NONE;
}

int ferry_py_pace_module_init(void) {
  static PyMethodDef def = {"_after_fork_in_child", after_fork_in_child, METH_NOARGS, NULL};
  PyObject *os = PyImport_ImportModule("os");
  PyObject *reg = os ? PyObject_GetAttrString(os, "register_at_fork") : NULL;
  PyObject *fn = reg ? PyCFunction_New(&def, NULL) : NULL;
  PyObject *kwargs = fn ? Py_BuildValue("{s:O}", "after_in_child", fn) : NULL;
  PyObject *args = kwargs ? PyTuple_New(0) : NULL;
  PyObject *done = args ? PyObject_Call(reg, args, kwargs) : NULL;
  Py_XDECREF(os), Py_XDECREF(reg), Py_XDECREF(fn), Py_XDECREF(kwargs), Py_XDECREF(args);
  if (!done) {
    if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
    PyErr_Clear(); /* no fork on this platform */
    return 0;
  }
  Py_DECREF(done);
  return 0;
}

void ferry_py_gil_share_end(int began) {
  if (began <= 0 || --sharing > 0 || ferry_switch < 0) return;
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb); /* may run on the way out of a failed call */
  /* Put CPython's interval back unless someone changed it meanwhile: theirs wins. */
  if (switch_interval() == ferry_switch && set_switch_interval(saved_switch) < 0) PyErr_Clear();
  PyErr_Clear();
  PyErr_Restore(type, value, tb);
}
