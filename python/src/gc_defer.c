/* gc_defer.c — no cyclic garbage collection inside a transfer call.
 *
 * A call that makes thousands of output tensors triggers CPython's collector every 700 allocations: at 16384
 * tensors about 23 young collections a call, every tenth of them an older one, and now and then a full pass over
 * every object of the process (tens of ms), all with the GIL held inside ferry's call, past its slice. The
 * outputs are all reachable, so collecting while they are made finds nothing of theirs. While a call's GIL-holding
 * phase runs, the collector is off; at its end it is back on and the next allocation runs one young collection
 * over everything the call made, so the older passes come about twenty times less often.
 */
#include "ferry_py.h"

bool ferry_py_gc_deferral = true;

static int deferring;     /* nested phases (threads transferring at once); guarded by the GIL */
static bool disabled_it;  /* the first of them turned the collector off (it was on) */

int ferry_py_gc_defer_begin(void) {
#ifdef Py_GIL_DISABLED
  return 0; /* no GIL to guard the count; the free-threaded collector stops the world anyway */
#else
  if (!ferry_py_gc_deferral) return 0;
  if (deferring++ == 0) disabled_it = PyGC_Disable() == 1;
  return 1;
#endif
}

void ferry_py_gc_defer_end(int began) {
  if (began <= 0 || --deferring > 0) return;
  /* Back on if ferry turned it off. A gc.disable() by another thread during the phase is undone too: the two
   * cannot be told apart, and leaving the collector off for good would be the worse mistake. */
  if (disabled_it) PyGC_Enable();
  disabled_it = false;
}

#ifdef FERRY_PYTHON_TEST_HOOKS
PyObject *ferry_py_gc_deferral_hook(PyObject *self, PyObject *flag) {
  int on = PyObject_IsTrue(flag);
  if (on < 0) return NULL;
  bool old = ferry_py_gc_deferral;
  ferry_py_gc_deferral = on;
  return PyBool_FromLong(old);
}
#endif
