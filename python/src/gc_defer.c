/* gc_defer.c — no cyclic garbage collection while a transfer makes its outputs.
 *
 * A call that makes thousands of output tensors triggers CPython's collector every 700 allocations: at 16384
 * tensors about 23 young collections a call, every tenth of them an older one, and now and then a full pass over
 * every object of the process (tens of ms), all with the GIL held inside ferry's call, past its slice. The
 * outputs are all reachable, so collecting while they are made finds nothing of theirs. So the collector is off
 * in the regions where ferry makes outputs and rebuilds containers, and only while it holds the GIL there: at
 * every release (release points, driver calls) and around every call into Python code (a consumer's from_dlpack,
 * a container's constructor, a key's __hash__) it is lent back as the application has it, and its state is read
 * again afterwards. So no other thread, fork() child or application code ever meets ferry's setting, and a
 * gc.disable() made meanwhile is kept. After the call the next allocation runs one young collection over what it
 * made, so the older passes come about twenty times less often.
 */
#include "ferry_py.h"

bool ferry_py_gc_deferral = true;

/* Per thread, since only the GIL holder touches the collector: its nested regions; whether it turned the collector
 * off (it was on, as the application had it); and its nested loans (a transfer started from Python code that ferry
 * called runs inside a loan, and leaves the collector to the outer one). */
static _Thread_local int depth, lent;
static _Thread_local bool turned_off;

int ferry_py_gc_defer_begin(void) {
#ifdef Py_GIL_DISABLED
  return 0; /* no GIL holds to keep collections out of; the free-threaded collector stops the world anyway */
#else
  if (!ferry_py_gc_deferral) return 0;
  if (depth++ == 0) turned_off = PyGC_Disable() == 1, lent = 0;
  return 1;
#endif
}

void ferry_py_gc_defer_end(int began) {
  if (began <= 0 || --depth > 0) return;
  if (turned_off) PyGC_Enable();
  turned_off = false;
}

void ferry_py_gc_lend(void) {
  if (depth > 0 && turned_off && lent++ == 0) PyGC_Enable();
}

void ferry_py_gc_reclaim(void) {
  if (depth > 0 && turned_off && --lent == 0) turned_off = PyGC_Disable() == 1; /* off meanwhile: kept */
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
