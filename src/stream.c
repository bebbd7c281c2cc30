/* stream.c — the calling thread's copy stream per device, and a per-device pool of events.
 *
 * A thread that transfers gets one non-blocking stream per device, created on first use and reused, so its
 * copies never serialise behind the legacy default stream or behind another thread's copies. The streams are
 * destroyed when the thread exits (a pthread key destructor), so short-lived worker threads do not leak them.
 */
#include "internal.h"

#include <stdlib.h>

/* ---- per-thread streams ---------------------------------------------------------------------------------- */

/* Per device: the copy stream (ferry_copy_stream) and a second stream for DMAs that run beside the gather
 * kernel (see transfer.c's pipeline). */
typedef struct thread_streams { CUstream stream[FERRY_MAX_DEVICES][2]; } thread_streams;

static pthread_key_t streams_key;
static pthread_once_t streams_once = PTHREAD_ONCE_INIT;
static _Thread_local thread_streams *tls_streams;

static void destroy_thread_streams(void *p) {
  thread_streams *ts = p;
  for (int d = 0; d < FERRY_MAX_DEVICES; d++) {
    if (!ts->stream[d][0] && !ts->stream[d][1]) continue;
    /* Destroyed even when the context cannot be made current: the call names its stream, whose context it
     * knows, and skipping it would leak the stream for the process's life. */
    bool entered = ferry__ctx_enter(d) == FERRY_OK;
    for (int k = 0; k < 2; k++)
      if (ts->stream[d][k]) (void)FERRY_CU(cuStreamDestroy, ts->stream[d][k]);
    if (entered) ferry__ctx_leave();
  }
  free(ts);
}

static void make_key(void) { (void)pthread_key_create(&streams_key, destroy_thread_streams); }

/* Stream `which` (0: copy, 1: DMA beside the gather) of this thread for `device`, created on first use. */
static ferry_status thread_stream(int device, int which, CUstream *out) {
  ferry_status st = FERRY_OK;
  thread_streams *ts = tls_streams;
  if (ts && ts->stream[device][which]) {
    *out = ts->stream[device][which];
    return FERRY_OK;
  }
  if (!ts) {
    pthread_once(&streams_once, make_key);
    ts = calloc(1, sizeof *ts);
    if (!ts) return FERRY_ERR(FERRY_OUT_OF_HOST_MEMORY, "allocating the thread's stream table");
    if (pthread_setspecific(streams_key, ts) != 0) {
      free(ts);
      return FERRY_ERR(FERRY_INTERNAL, "pthread_setspecific failed for the stream table");
    }
    tls_streams = ts;
  }
  CUstream s = NULL;
  FERRY_TRY_CU(("creating %s stream of cuda:%d", which ? "the second copy" : "the copy", device), cuStreamCreate,
               &s, CU_STREAM_NON_BLOCKING);
  ts->stream[device][which] = s;
  *out = s;
cleanup:
  return st;
}

ferry_status ferry__thread_stream(int device, CUstream *out) { return thread_stream(device, 0, out); }
ferry_status ferry__thread_dma_stream(int device, CUstream *out) { return thread_stream(device, 1, out); }

ferry_status ferry_copy_stream(int device, void **out_stream) {
  ferry_status st = FERRY_OK;
  int d;
  if (!out_stream) return FERRY_ERR(FERRY_INVALID_ARGUMENT, "ferry_copy_stream: out_stream is NULL");
  FERRY_TRY(ferry_device_resolve(device, &d));
  FERRY_TRY(ferry__ctx_enter(d));
  CUstream s;
  st = ferry__thread_stream(d, &s);
  ferry__ctx_leave();
  if (st == FERRY_OK) *out_stream = s;
cleanup:
  return st;
}

ferry_status ferry__stream_check_device(CUstream stream, int device) {
  ferry_status st = FERRY_OK;
  CUcontext ctx = NULL;
  FERRY_TRY_CU(("finding the device of stream %p", (void *)stream), cuStreamGetCtx, stream, &ctx);
  if (ctx == ferry__device_ctx(device)) return FERRY_OK;
  /* Another context: report which device it is on, for the message. */
  CUdevice other = -1;
  if (FERRY_CU(cuCtxPushCurrent, ctx) == CUDA_SUCCESS) {
    (void)FERRY_CU(cuCtxGetDevice, &other);
    ferry__ctx_leave();
  }
  if (other >= 0 && other != device)
    return FERRY_ERR(FERRY_DEVICE_MISMATCH, "stream %p belongs to cuda:%d, but the transfer asked for cuda:%d",
                     (void *)stream, (int)other, device);
  return FERRY_ERR(FERRY_DEVICE_MISMATCH, "stream %p belongs to a context of cuda:%d other than its primary context; "
                   "ferry works in primary contexts (the CUDA runtime's)", (void *)stream, device);
cleanup:
  return st;
}

/* ---- events ---------------------------------------------------------------------------------------------- */

#define EVENTS_KEPT 256 /* free events kept per device; beyond that they are destroyed */

typedef struct event_list { CUevent ev[EVENTS_KEPT]; int n; } event_list;
static event_list free_events[FERRY_MAX_DEVICES];
static pthread_mutex_t events_lock = PTHREAD_MUTEX_INITIALIZER;

ferry_status ferry__event_get(int device, CUevent *out) {
  ferry_status st = FERRY_OK;
  pthread_mutex_lock(&events_lock);
  event_list *l = &free_events[device];
  if (l->n > 0) {
    *out = l->ev[--l->n];
    pthread_mutex_unlock(&events_lock);
    return FERRY_OK;
  }
  pthread_mutex_unlock(&events_lock);
  CUevent ev = NULL;
  FERRY_TRY_CU(("creating an event on cuda:%d", device), cuEventCreate, &ev, CU_EVENT_DISABLE_TIMING);
  *out = ev;
cleanup:
  return st;
}

void ferry__event_put(int device, CUevent ev) {
  if (!ev) return;
  pthread_mutex_lock(&events_lock);
  event_list *l = &free_events[device];
  if (l->n < EVENTS_KEPT) {
    l->ev[l->n++] = ev;
    ev = NULL;
  }
  pthread_mutex_unlock(&events_lock);
  if (ev) (void)FERRY_CU(cuEventDestroy, ev);
}

void ferry__events_trim(void) {
  pthread_mutex_lock(&events_lock);
  for (int d = 0; d < FERRY_MAX_DEVICES; d++) {
    event_list *l = &free_events[d];
    while (l->n > 0) {
      /* Not in the call's arguments: FERRY_CU skips evaluating them when the call is stopped (an injected fault,
       * the fork guard), and the loop would never end. */
      CUevent ev = l->ev[--l->n];
      (void)FERRY_CU(cuEventDestroy, ev);
    }
  }
  pthread_mutex_unlock(&events_lock);
}

/* fork.c: held across fork() so a child never inherits the lock held by a thread it does not have. */
void ferry__events_fork_lock(int lock) {
  lock ? pthread_mutex_lock(&events_lock) : pthread_mutex_unlock(&events_lock);
}
