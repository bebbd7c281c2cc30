/* fence.c — reference-counted completion events, shared by a ticket and the slabs its copies touch.
 *
 * A ticket may be released before its copies finish, and its slabs may outlive it; each holds a reference to
 * the same fence, and memory returns to a pool only once the fence is seen complete.
 *
 * Errors stick: the first driver error that any query or wait of the fence sees is kept in the fence, so that a
 * poll that saw the copies fail (a pool reaping parked slabs, a caller's done()) can never turn into a later
 * wait that reports success.
 */
#include "internal.h"

#include <stdlib.h>

ferry_status ferry__fence_record(int device, CUstream stream, ferry__fence **out) {
  ferry_status st = FERRY_OK;
  ferry__fence *f = malloc(sizeof *f);
  if (!f) return FERRY_ERR(FERRY_OUT_OF_HOST_MEMORY, "allocating a fence");
  f->ev = NULL;
  f->device = device;
  atomic_init(&f->refs, 1);
  atomic_init(&f->done, 0);
  atomic_init(&f->failure, 0);
  FERRY_TRY(ferry__event_get(device, &f->ev));
  FERRY_TRY_CU(("recording the completion event"), cuEventRecord, f->ev, stream);
  *out = f;
  return FERRY_OK;
cleanup:
  if (f->ev) ferry__event_put(device, f->ev);
  free(f);
  return st;
}

ferry__fence *ferry__fence_ref(ferry__fence *f) {
  if (f) atomic_fetch_add_explicit(&f->refs, 1, memory_order_relaxed);
  return f;
}

void ferry__fence_unref(ferry__fence *f) {
  if (!f || atomic_fetch_sub_explicit(&f->refs, 1, memory_order_acq_rel) != 1) return;
  /* An event whose work may still run, or that failed, is destroyed, not pooled: cuEventDestroy defers the
   * release safely, and a pooled event must be one that completed cleanly. */
  if (atomic_load(&f->done) && !atomic_load(&f->failure)) ferry__event_put(f->device, f->ev);
  else (void)FERRY_CU(cuEventDestroy, f->ev);
  free(f);
}

/* Keeps the first error only (several threads may see errors at once), then publishes completion. */
static void settle(ferry__fence *f, CUresult r, bool from_wait) {
  if (r != CUDA_SUCCESS) {
    uint64_t none = 0;
    atomic_compare_exchange_strong(&f->failure, &none, (uint64_t)r << 1 | (uint64_t)from_wait);
  }
  atomic_store_explicit(&f->done, 1, memory_order_release);
}

int ferry__fence_done(ferry__fence *f) {
  if (!f || atomic_load_explicit(&f->done, memory_order_acquire)) return 1;
  CUresult r = FERRY_CU(cuEventQuery, f->ev);
  if (r == CUDA_ERROR_NOT_READY) return 0;
  settle(f, r, false);
  return 1;
}

ferry_status ferry__fence_wait(ferry__fence *f) {
  if (!f) return FERRY_OK;
  if (!atomic_load_explicit(&f->done, memory_order_acquire)) settle(f, FERRY_CU(cuEventSynchronize, f->ev), true);
  uint64_t failure = atomic_load(&f->failure);
  if (!failure) return FERRY_OK;
  bool from_wait = failure & 1;
  return ferry__cu_error((CUresult)(failure >> 1), from_wait ? "cuEventSynchronize" : "cuEventQuery", __FILE__,
                         __LINE__, "waiting for the transfer's copies");
}
