/* devmem.c — device memory for H2D outputs and D2H staging: stream-ordered, from a pool per device.
 *
 * ferry's own CUmemoryPool (not the device's default pool, whose settings belong to the application) with its
 * release threshold at the maximum, so memory freed after one transfer is reused by the next without a trip to
 * the driver's allocator.
 */
#include "internal.h"

#include <stdlib.h>

static pthread_mutex_t pools_lock = PTHREAD_MUTEX_INITIALIZER;
static CUmemoryPool pools[FERRY_MAX_DEVICES];

static ferry_status pool_of(int device, CUmemoryPool *out) {
  ferry_status st = FERRY_OK;
  pthread_mutex_lock(&pools_lock);
  if (!pools[device]) {
    CUmemPoolProps props = {0};
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = device;
    CUmemoryPool p = NULL;
    FERRY_TRY_CU(("creating ferry's device memory pool on cuda:%d", device), cuMemPoolCreate, &p, &props);
    cuuint64_t keep = ~(cuuint64_t)0;
    CUresult r = FERRY_CU(cuMemPoolSetAttribute, p, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep);
    if (r != CUDA_SUCCESS) {
      (void)FERRY_CU(cuMemPoolDestroy, p);
      st = ferry__cu_error(r, "cuMemPoolSetAttribute", __FILE__, __LINE__, "configuring the pool of cuda:%d", device);
      goto cleanup;
    }
    pools[device] = p;
  }
  *out = pools[device];
cleanup:
  pthread_mutex_unlock(&pools_lock);
  return st;
}

static void queue_deferred(int device, CUstream stream);

ferry_status ferry__devmem_alloc(int device, size_t bytes, CUstream stream, CUdeviceptr *out) {
  ferry_status st = FERRY_OK;
  CUmemoryPool p = NULL;
  FERRY_TRY(pool_of(device, &p));
  queue_deferred(device, stream);
  FERRY_TRY_CU(("allocating %zu bytes on cuda:%d", bytes, device), cuMemAllocFromPoolAsync, out,
               bytes ? bytes : 1, p, stream);
cleanup:
  return st;
}

ferry_status ferry__devmem_slab(int device, size_t bytes, CUstream stream, ferry_slab **out) {
  ferry_slab *s = calloc(1, sizeof *s);
  if (!s) return FERRY_ERR(FERRY_OUT_OF_HOST_MEMORY, "allocating a slab record");
  CUdeviceptr p = 0;
  ferry_status st = ferry__devmem_alloc(device, bytes, stream, &p);
  if (st != FERRY_OK) {
    free(s);
    return st;
  }
  atomic_init(&s->refs, 1);
  s->kind = FERRY__SLAB_DEVICE;
  s->device = device;
  s->data = (void *)(uintptr_t)p;
  s->size = bytes;
  ferry__slab_register(s);
  *out = s;
  return FERRY_OK;
}

/* Device slabs whose free could not be queued (the context could not be entered, or a driver call on the way
 * failed), per device, under pools_lock: the next allocation on that device, which has the context current and
 * a stream, queues their free. Freeing one without its ordering could hand its memory to a new allocation while
 * work that uses it still runs. */
static ferry_slab *deferred[FERRY_MAX_DEVICES];

static void defer_free(ferry_slab *s) {
  pthread_mutex_lock(&pools_lock);
  s->next_pending = deferred[s->device];
  deferred[s->device] = s;
  pthread_mutex_unlock(&pools_lock);
}

/* Queues the free of `s` on `stream` (its device's context current, the thread in relaxed capture mode) after its
 * own copies (the fence), after the work recorded on other streams (slab.c), and after the work already queued on
 * the legacy default stream, where frameworks run by default: a consumer that dropped its last reference while a
 * kernel on that stream still reads the memory is still safe. Defers the slab when a call fails, and frees the
 * record once the free is queued. */
static void queue_free(ferry_slab *s, CUstream stream) {
  CUresult r = CUDA_SUCCESS;
  if (s->fence && !ferry__fence_done(s->fence)) r = FERRY_CU(cuStreamWaitEvent, stream, s->fence->ev, 0);
  for (int i = 0; i < s->n_use_fences && r == CUDA_SUCCESS; i++)
    if (!ferry__fence_done(s->use_fences[i])) r = FERRY_CU(cuStreamWaitEvent, stream, s->use_fences[i]->ev, 0);
  CUevent legacy_done = NULL;
  if (r == CUDA_SUCCESS && ferry__event_get(s->device, &legacy_done) != FERRY_OK) r = CUDA_ERROR_UNKNOWN;
  if (legacy_done) {
    r = FERRY_CU(cuEventRecord, legacy_done, CU_STREAM_LEGACY);
    if (r == CUDA_SUCCESS) r = FERRY_CU(cuStreamWaitEvent, stream, legacy_done, 0);
    ferry__event_put(s->device, legacy_done);
  }
  if (r == CUDA_SUCCESS) r = FERRY_CU(cuMemFreeAsync, (CUdeviceptr)(uintptr_t)s->data, stream);
  if (r != CUDA_SUCCESS) {
    defer_free(s);
    return;
  }
  ferry__slab_drop_fences(s);
  free(s);
}

/* The deferred frees of `device` (context current), queued on `stream`. A release returns no status, so errors
 * met here are not the caller's: the thread's last error is left as it was. */
static void queue_deferred(int device, CUstream stream) {
  pthread_mutex_lock(&pools_lock);
  ferry_slab *list = deferred[device];
  deferred[device] = NULL;
  pthread_mutex_unlock(&pools_lock);
  if (!list) return;
  ferry_error saved = *ferry_last_error();
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  (void)FERRY_CU(cuThreadExchangeStreamCaptureMode, &mode);
  while (list) {
    ferry_slab *s = list;
    list = s->next_pending;
    s->next_pending = NULL;
    queue_free(s, stream);
  }
  (void)FERRY_CU(cuThreadExchangeStreamCaptureMode, &mode);
  ferry__error_restore(&saved);
}

/* Frees a device slab stream-ordered on this thread's copy stream (queue_free says after what). The thread is in
 * relaxed capture mode meanwhile, so that the legacy stream's event does not invalidate another thread's graph
 * capture. A release returns no status: the thread's last error is left as it was. */
void ferry__devmem_slab_free(ferry_slab *s) {
  if (ferry__fork_child) { /* the parent's memory: a forked child frees nothing and takes no lock (fork.c) */
    ferry__slab_drop_fences(s);
    free(s);
    return;
  }
  ferry_error saved = *ferry_last_error();
  if (ferry__ctx_enter(s->device) != FERRY_OK) {
    defer_free(s);
  } else {
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    (void)FERRY_CU(cuThreadExchangeStreamCaptureMode, &mode);
    CUstream stream;
    if (ferry__thread_stream(s->device, &stream) == FERRY_OK) queue_free(s, stream);
    else defer_free(s);
    (void)FERRY_CU(cuThreadExchangeStreamCaptureMode, &mode);
    ferry__ctx_leave();
  }
  ferry__error_restore(&saved);
}

CUmemoryPool ferry__devmem_pool(int device) {
  pthread_mutex_lock(&pools_lock);
  CUmemoryPool p = device >= 0 && device < FERRY_MAX_DEVICES ? pools[device] : NULL;
  pthread_mutex_unlock(&pools_lock);
  return p;
}

/* fork.c: held across fork() so a child never inherits the lock held by a thread it does not have. */
void ferry__devmem_fork_lock(int lock) { lock ? pthread_mutex_lock(&pools_lock) : pthread_mutex_unlock(&pools_lock); }
