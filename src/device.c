/* device.c — device resolution (explicit, LOCAL_RANK, 0), device properties, and primary contexts.
 *
 * ferry works in each device's primary context, the one the CUDA runtime (and so PyTorch, CuPy and JAX) uses,
 * so pointers, streams and events cross between ferry and those frameworks without conversion. A context is
 * retained once per process and never released: releasing it could tear down a framework's context.
 */
#include "internal.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic(CUcontext) contexts[FERRY_MAX_DEVICES];

int ferry_device_count(void) {
  int count = 0;
  ferry_error saved = *ferry_last_error();
  if (ferry__driver_load() != FERRY_OK) {
    ferry__error_restore(&saved); /* documented as never an error */
    return 0;
  }
  if (FERRY_CU(cuDeviceGetCount, &count) != CUDA_SUCCESS) return 0;
  return count;
}

ferry_status ferry_device_resolve(int requested, int *out_device) {
  if (!out_device) return FERRY_ERR(FERRY_INVALID_ARGUMENT, "ferry_device_resolve: out_device is NULL");
  /* The request is read before the driver is loaded, so a bad LOCAL_RANK is reported the same way with and
   * without a GPU. */
  int device = requested;
  const char *source = "requested";
  if (requested < 0) {
    const char *rank = getenv("LOCAL_RANK");
    device = 0;
    source = "default";
    if (rank && *rank) {
      char *end = NULL;
      errno = 0;
      long v = strtol(rank, &end, 10);
      if (errno || *end != '\0' || v < 0 || v > INT_MAX)
        return FERRY_ERR(FERRY_INVALID_ARGUMENT,
                         "LOCAL_RANK=\"%s\" is not a non-negative integer; set it to this process's GPU index or "
                         "pass the device explicitly", rank);
      device = (int)v;
      source = "LOCAL_RANK";
    }
  }
  ferry_status st = ferry__driver_load();
  if (st != FERRY_OK) return st;
  int count = 0;
  CUresult r = FERRY_CU(cuDeviceGetCount, &count);
  if (r != CUDA_SUCCESS) return ferry__cu_error(r, "cuDeviceGetCount", __FILE__, __LINE__, "counting devices");
  if (device >= count || device >= FERRY_MAX_DEVICES)
    return FERRY_ERR(FERRY_DEVICE_UNAVAILABLE, "cuda:%d (%s) is not available: this process sees %d CUDA device%s",
                     device, source, count, count == 1 ? "" : "s");
  *out_device = device;
  return FERRY_OK;
}

CUcontext ferry__device_ctx(int device) { return atomic_load_explicit(&contexts[device], memory_order_acquire); }

ferry_status ferry__ctx_enter(int device) {
  ferry_status st = FERRY_OK;
  CUcontext ctx = ferry__device_ctx(device);
  if (!ctx) {
    pthread_mutex_lock(&ctx_lock);
    ctx = atomic_load(&contexts[device]);
    if (!ctx) {
      CUdevice dev;
      const char *call = "cuDeviceGet"; /* the error names the call that failed, not the step's last call */
      CUresult r = FERRY_CU(cuDeviceGet, &dev, device);
      if (r == CUDA_SUCCESS) {
        call = "cuDevicePrimaryCtxRetain";
        r = FERRY_CU(cuDevicePrimaryCtxRetain, &ctx, dev);
      }
      if (r != CUDA_SUCCESS) {
        pthread_mutex_unlock(&ctx_lock);
        return ferry__cu_error(r, call, __FILE__, __LINE__, "activating the primary context of cuda:%d", device);
      }
      atomic_store_explicit(&contexts[device], ctx, memory_order_release);
    }
    pthread_mutex_unlock(&ctx_lock);
  }
  FERRY_TRY_CU(("making cuda:%d current", device), cuCtxPushCurrent, ctx);
cleanup:
  return st;
}

void ferry__ctx_leave(void) {
  CUcontext popped;
  (void)FERRY_CU(cuCtxPopCurrent, &popped);
}

ferry_status ferry_device_info_get(int device, ferry_device_info *out) {
  ferry_status st = FERRY_OK;
  if (!out) return FERRY_ERR(FERRY_INVALID_ARGUMENT, "ferry_device_info_get: out is NULL");
  int resolved;
  FERRY_TRY(ferry_device_resolve(device, &resolved));
  ferry_device_info info;
  memset(&info, 0, sizeof info);
  CUdevice dev;
  info.ordinal = resolved;
  FERRY_TRY_CU(("querying cuda:%d", resolved), cuDeviceGet, &dev, resolved);
  FERRY_TRY_CU(("querying cuda:%d", resolved), cuDeviceGetName, info.name, (int)sizeof info.name, dev);
  FERRY_TRY_CU(("querying cuda:%d", resolved), cuDeviceGetAttribute, &info.cc_major,
               CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
  FERRY_TRY_CU(("querying cuda:%d", resolved), cuDeviceGetAttribute, &info.cc_minor,
               CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
  FERRY_TRY_CU(("querying cuda:%d", resolved), cuDeviceGetAttribute, &info.multiprocessors,
               CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
  FERRY_TRY_CU(("querying cuda:%d", resolved), cuDeviceGetAttribute, &info.async_engines,
               CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT, dev);
  FERRY_TRY_CU(("querying cuda:%d", resolved), cuDeviceTotalMem, &info.total_memory, dev);
  info.driver_version = ferry__drv.version;
  *out = info;
cleanup:
  return st;
}

/* fork.c: held across fork() so a child never inherits the lock held by a thread it does not have. */
void ferry__device_fork_lock(int lock) { lock ? pthread_mutex_lock(&ctx_lock) : pthread_mutex_unlock(&ctx_lock); }
