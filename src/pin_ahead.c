/* pin_ahead.c — a region faulted in on a thread of its own while the caller registers and fills the one before it.
 *
 * Pinning a fresh region is two steps of about equal cost on the H200 host (tools/probe_pinning.c, 256 MiB with
 * transparent huge pages: the fault-in by 16 threads 6.2 ms, cuMemHostRegister 4.9 ms on one thread). A batch cut
 * into sub-parts (transfer.c) runs them side by side, one sub-part apart, so its first call pins at the pace of the
 * slower step instead of their sum, with the copies of the sub-parts already pinned running underneath.
 */
#include "internal.h"

#include <sys/mman.h>

atomic_int ferry__pin_ahead_outstanding;

static void *fault_in(void *arg) {
  ferry__pin_ahead *a = arg;
  double t0 = ferry__seconds_now();
  ferry__prefault(a->base, a->size);
  a->fault_seconds = ferry__seconds_now() - t0;
  return NULL;
}

ferry_status ferry__pin_ahead_start(size_t bytes, ferry__pin_ahead *a) {
  a->base = NULL;
  ferry_status st = ferry__pin_map(bytes, &a->base, &a->size);
  if (st != FERRY_OK) return st;
  atomic_fetch_add(&ferry__pin_ahead_outstanding, 1);
  /* The thread uses `a`, which the caller keeps in place until finish or cancel joins it. */
  a->threaded = pthread_create(&a->thread, NULL, fault_in, a) == 0;
  if (!a->threaded) fault_in(a); /* no thread to be had: fault it in here */
  return FERRY_OK;
}

void ferry__pin_ahead_wait(ferry__pin_ahead *a) {
  if (a->threaded) pthread_join(a->thread, NULL);
  a->threaded = false;
}

ferry_status ferry__pin_ahead_finish(ferry__pin_ahead *a) {
  ferry__pin_ahead_wait(a);
  char *base = a->base;
  a->base = NULL;
  atomic_fetch_sub(&ferry__pin_ahead_outstanding, 1);
  double t0 = ferry__seconds_now();
  ferry_status st = ferry__pin_register(base, a->size);
  if (st != FERRY_OK) return st; /* the range is unmapped */
  return ferry__pool_adopt(base, a->size, a->fault_seconds + (ferry__seconds_now() - t0));
}

void ferry__pin_ahead_cancel(ferry__pin_ahead *a) {
  if (!a->base) return;
  ferry__pin_ahead_wait(a);
  munmap(a->base, a->size);
  a->base = NULL;
  atomic_fetch_sub(&ferry__pin_ahead_outstanding, 1);
}
