/* slab.c — a slab's life: references, the streams whose work must finish before its memory is reused, the
 * registry that finds the slab holding an address, and the release that hands the memory back (pinned.c's pool
 * for host slabs, devmem.c's stream-ordered free for device slabs).
 *
 * Reuse rule: the memory goes back only after the copies into or out of it (its fence) and, for every stream
 * recorded with ferry_slab_record_stream, after the work queued there when the last reference went. A consumer that
 * queues work on a stream of its own and drops the output before that work runs is safe once it recorded the
 * stream (the Python package records the releasing thread's current stream for every output it hands out).
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

/* ---- the registry: live slabs by address --------------------------------------------------------------------- */

/* Sorted by address; one entry per slab (a part of a transfer), so it stays small. Host and device addresses
 * share one unified address space under CUDA, so one array holds both kinds. */
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static ferry_slab **live;
static size_t n_live, cap_live;

static size_t lower_bound(uintptr_t address) {
  size_t lo = 0, hi = n_live;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if ((uintptr_t)live[mid]->data < address) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

void ferry__slab_register(ferry_slab *s) {
  pthread_mutex_lock(&registry_lock);
  if (n_live == cap_live) {
    size_t cap = cap_live ? 2 * cap_live : 64;
    ferry_slab **grown = realloc(live, cap * sizeof *grown);
    if (!grown) { /* only ferry_slab_find misses it: the slab itself works */
      pthread_mutex_unlock(&registry_lock);
      return;
    }
    live = grown;
    cap_live = cap;
  }
  size_t at = lower_bound((uintptr_t)s->data);
  memmove(live + at + 1, live + at, (n_live - at) * sizeof *live);
  live[at] = s;
  n_live++;
  pthread_mutex_unlock(&registry_lock);
}

static void forget(ferry_slab *s) {
  pthread_mutex_lock(&registry_lock);
  for (size_t at = lower_bound((uintptr_t)s->data); at < n_live && live[at]->data == s->data; at++) {
    if (live[at] != s) continue;
    memmove(live + at, live + at + 1, (n_live - at - 1) * sizeof *live);
    n_live--;
    break;
  }
  pthread_mutex_unlock(&registry_lock);
}

ferry_slab *ferry_slab_find(const void *address) {
  pthread_mutex_lock(&registry_lock);
  size_t at = lower_bound((uintptr_t)address + 1); /* the first slab starting after it */
  ferry_slab *s = at > 0 ? live[at - 1] : NULL;
  if (s && ((uintptr_t)address < (uintptr_t)s->data || (uintptr_t)address >= (uintptr_t)s->data + s->size)) s = NULL;
  pthread_mutex_unlock(&registry_lock);
  return s;
}

/* ---- recorded streams -------------------------------------------------------------------------------------------- */

static pthread_mutex_t uses_lock = PTHREAD_MUTEX_INITIALIZER;

/* The device whose primary context `stream` belongs to; the legacy default stream is the slab's device's. */
static ferry_status stream_device(CUstream stream, int fallback, int *out) {
  ferry_status st = FERRY_OK;
  if (stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD) {
    *out = fallback;
    return FERRY_OK;
  }
  CUcontext ctx = NULL;
  FERRY_TRY_CU(("finding the device of stream %p", (void *)stream), cuStreamGetCtx, stream, &ctx);
  for (int d = 0; d < FERRY_MAX_DEVICES; d++)
    if (ferry__device_ctx(d) == ctx) {
      *out = d;
      return FERRY_OK;
    }
  return FERRY_ERR(FERRY_DEVICE_MISMATCH, "stream %p belongs to a context ferry does not work in (ferry works in "
                   "the devices' primary contexts, the CUDA runtime's)", (void *)stream);
cleanup:
  return st;
}

ferry_status ferry_slab_record_stream(ferry_slab *slab, void *stream) {
  if (!slab) return FERRY_ERR(FERRY_INVALID_ARGUMENT, "ferry_slab_record_stream: slab is NULL");
  CUstream s = stream ? (CUstream)stream : CU_STREAM_LEGACY;
  ferry_status st = ferry__driver_load();
  if (st != FERRY_OK) return st;
  int device = slab->device;
  st = stream_device(s, slab->device, &device);
  if (st != FERRY_OK) return st;
  pthread_mutex_lock(&uses_lock);
  for (int i = 0; i < slab->n_uses; i++)
    if (slab->uses[i].stream == s) {
      pthread_mutex_unlock(&uses_lock);
      return FERRY_OK;
    }
  if (slab->n_uses == FERRY_SLAB_MAX_USES) {
    pthread_mutex_unlock(&uses_lock);
    return FERRY_ERR(FERRY_UNSUPPORTED, "a slab waits for at most %d streams; stream %p is one too many",
                     FERRY_SLAB_MAX_USES, stream);
  }
  slab->uses[slab->n_uses].stream = s;
  slab->uses[slab->n_uses].device = device;
  slab->n_uses++;
  pthread_mutex_unlock(&uses_lock);
  return FERRY_OK;
}

/* When the last reference goes: marks where each recorded stream has got to. A stream being captured into a graph
 * is skipped (an event there would become a node of the user's graph, and a replay can come at any later time);
 * if an event cannot be recorded, the stream is drained instead. The calling thread is put in relaxed capture mode
 * meanwhile, so that another thread's capture is not invalidated by these calls. */
static void record_uses(ferry_slab *s) {
  for (int i = 0; i < s->n_uses; i++) {
    int device = s->uses[i].device;
    CUstream stream = s->uses[i].stream;
    if (ferry__ctx_enter(device) != FERRY_OK) continue; /* the context is gone: nothing of it runs any more */
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    (void)FERRY_CU(cuThreadExchangeStreamCaptureMode, &mode);
    CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
    (void)FERRY_CU(cuStreamIsCapturing, stream, &capture);
    if (capture == CU_STREAM_CAPTURE_STATUS_NONE) {
      ferry_error saved = *ferry_last_error();
      ferry__fence *f = NULL;
      if (ferry__fence_record(device, stream, &f) == FERRY_OK) s->use_fences[s->n_use_fences++] = f;
      else (void)FERRY_CU(cuStreamSynchronize, stream);
      ferry__error_restore(&saved); /* a release reports nothing */
    }
    (void)FERRY_CU(cuThreadExchangeStreamCaptureMode, &mode);
    ferry__ctx_leave();
  }
  s->n_uses = 0;
}

int ferry__slab_idle(ferry_slab *s) {
  if (s->fence && !ferry__fence_done(s->fence)) return 0;
  for (int i = 0; i < s->n_use_fences; i++)
    if (!ferry__fence_done(s->use_fences[i])) return 0;
  return 1;
}

void ferry__slab_drop_fences(ferry_slab *s) {
  ferry__fence_unref(s->fence);
  s->fence = NULL;
  for (int i = 0; i < s->n_use_fences; i++) ferry__fence_unref(s->use_fences[i]);
  s->n_use_fences = 0;
}

/* ---- references ---------------------------------------------------------------------------------------------- */

ferry_slab *ferry_slab_retain(ferry_slab *slab) {
  if (slab) atomic_fetch_add_explicit(&slab->refs, 1, memory_order_relaxed);
  return slab;
}

void ferry_slab_release(ferry_slab *slab) {
  if (!slab || atomic_fetch_sub_explicit(&slab->refs, 1, memory_order_acq_rel) != 1) return;
  forget(slab);
  if (slab->n_uses) record_uses(slab);
  if (slab->kind == FERRY__SLAB_PINNED) ferry__pool_give(slab); /* takes over the fences */
  else ferry__devmem_slab_free(slab);
}

void *ferry_slab_data(const ferry_slab *slab) { return slab ? slab->data : NULL; }
size_t ferry_slab_size(const ferry_slab *slab) { return slab ? slab->size : 0; }

/* fork.c: held across fork() so a child never inherits these locks held by a thread it does not have. Both are
 * leaves: nothing else is locked while either is held. */
void ferry__slab_fork_lock(int lock) {
  if (lock) {
    pthread_mutex_lock(&registry_lock);
    pthread_mutex_lock(&uses_lock);
  } else {
    pthread_mutex_unlock(&uses_lock);
    pthread_mutex_unlock(&registry_lock);
  }
}
