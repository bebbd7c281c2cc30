/* fake_driver.c — a CUDA driver table that simulates one device in host memory, for CPU tests of the transfer
 * path and of fault injection. "Device" pointers are host pointers; copies are memcpy; the gather kernel's
 * launch runs its work items on the CPU; events complete at once. */
#include "fake_driver.h"

#include <stdlib.h>
#include <string.h>

static char ctx_token, module_token, function_token;
int fake_live_events, fake_live_streams, fake_live_devmem, fake_registered;

static CUresult f_init(unsigned f) { (void)f; return CUDA_SUCCESS; }
static CUresult f_version(int *v) { *v = 13000; return CUDA_SUCCESS; }
static CUresult f_err_name(CUresult r, const char **s) { (void)r; *s = NULL; return CUDA_ERROR_INVALID_VALUE; }
static CUresult f_count(int *n) { *n = 1; return CUDA_SUCCESS; }
static CUresult f_get(CUdevice *d, int i) { if (i != 0) return CUDA_ERROR_INVALID_DEVICE; *d = 0; return CUDA_SUCCESS; }
static CUresult f_name(char *s, int n, CUdevice d) { (void)d; strncpy(s, "fake", (size_t)n); return CUDA_SUCCESS; }
static CUresult f_attr(int *v, CUdevice_attribute a, CUdevice d) { (void)a; (void)d; *v = 1; return CUDA_SUCCESS; }
static CUresult f_mem(size_t *b, CUdevice d) { (void)d; *b = 1u << 30; return CUDA_SUCCESS; }
static CUresult f_retain(CUcontext *c, CUdevice d) { (void)d; *c = (CUcontext)&ctx_token; return CUDA_SUCCESS; }
static CUresult f_push(CUcontext c) { (void)c; return CUDA_SUCCESS; }
static CUresult f_pop(CUcontext *c) { *c = (CUcontext)&ctx_token; return CUDA_SUCCESS; }
static CUresult f_ctxdev(CUdevice *d) { *d = 0; return CUDA_SUCCESS; }
static CUresult f_screate(CUstream *s, unsigned f) { (void)f; *s = malloc(1); fake_live_streams++; return CUDA_SUCCESS; }
static CUresult f_sdestroy(CUstream s) { free(s); fake_live_streams--; return CUDA_SUCCESS; }
static CUresult f_sctx(CUstream s, CUcontext *c) { (void)s; *c = (CUcontext)&ctx_token; return CUDA_SUCCESS; }
static CUresult f_swait(CUstream s, CUevent e, unsigned f) { (void)s; (void)e; (void)f; return CUDA_SUCCESS; }
static CUresult f_ssync(CUstream s) { (void)s; return CUDA_SUCCESS; }
static CUresult f_ecreate(CUevent *e, unsigned f) { (void)f; *e = malloc(1); fake_live_events++; return CUDA_SUCCESS; }
static CUresult f_edestroy(CUevent e) { free(e); fake_live_events--; return CUDA_SUCCESS; }
static CUresult f_erecord(CUevent e, CUstream s) { (void)e; (void)s; return CUDA_SUCCESS; }
static CUresult f_equery(CUevent e) { (void)e; return CUDA_SUCCESS; }
static CUresult f_esync(CUevent e) { (void)e; return CUDA_SUCCESS; }
/* Registered ranges, so cuPointerGetAttribute can tell pinned (registered) host memory from pageable. */
#define FAKE_MAX_RANGES 64
static struct { uintptr_t lo, hi; } ranges[FAKE_MAX_RANGES];
static CUresult f_reg(void *p, size_t n, unsigned f) {
  (void)f;
  for (int i = 0; i < FAKE_MAX_RANGES; i++)
    if (ranges[i].lo == 0) {
      ranges[i].lo = (uintptr_t)p;
      ranges[i].hi = (uintptr_t)p + n;
      fake_registered++;
      return CUDA_SUCCESS;
    }
  return CUDA_ERROR_OUT_OF_MEMORY;
}
static CUresult f_unreg(void *p) {
  for (int i = 0; i < FAKE_MAX_RANGES; i++)
    if (ranges[i].lo == (uintptr_t)p) {
      ranges[i].lo = ranges[i].hi = 0;
      fake_registered--;
      return CUDA_SUCCESS;
    }
  return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
}
static CUresult f_pcreate(CUmemoryPool *p, const CUmemPoolProps *pr) { (void)pr; *p = (CUmemoryPool)&ctx_token; return CUDA_SUCCESS; }
static CUresult f_pdestroy(CUmemoryPool p) { (void)p; return CUDA_SUCCESS; }
static CUresult f_pset(CUmemoryPool p, CUmemPool_attribute a, void *v) { (void)p; (void)a; (void)v; return CUDA_SUCCESS; }
static CUresult f_alloc(CUdeviceptr *d, size_t n, CUmemoryPool p, CUstream s) {
  (void)p; (void)s;
  void *m = aligned_alloc(256, (n + 255) / 256 * 256);
  if (!m) return CUDA_ERROR_OUT_OF_MEMORY;
  fake_live_devmem++;
  *d = (CUdeviceptr)(uintptr_t)m;
  return CUDA_SUCCESS;
}
static CUresult f_free(CUdeviceptr d, CUstream s) { (void)s; free((void *)(uintptr_t)d); fake_live_devmem--; return CUDA_SUCCESS; }
static CUresult f_copy(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) {
  (void)st; memcpy((void *)(uintptr_t)d, (void *)(uintptr_t)s, n); return CUDA_SUCCESS;
}
static CUresult f_htod(CUdeviceptr d, const void *s, size_t n, CUstream st) { (void)st; memcpy((void *)(uintptr_t)d, s, n); return CUDA_SUCCESS; }
/* Host memory registered with f_reg is mapped at the same address ("device pointer" = host pointer), as under
 * unified addressing; anything else is pageable and the query fails, as the real driver's does. */
static CUresult f_ptr(void *v, CUpointer_attribute a, CUdeviceptr p) {
  for (int i = 0; i < FAKE_MAX_RANGES; i++) {
    if (!ranges[i].lo || (uintptr_t)p < ranges[i].lo || (uintptr_t)p >= ranges[i].hi) continue;
    if (a == CU_POINTER_ATTRIBUTE_DEVICE_POINTER || a == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR)
      *(CUdeviceptr *)v = a == CU_POINTER_ATTRIBUTE_DEVICE_POINTER ? p : (CUdeviceptr)ranges[i].lo;
    else if (a == CU_POINTER_ATTRIBUTE_RANGE_SIZE)
      *(size_t *)v = ranges[i].hi - ranges[i].lo;
    else
      return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
  }
  return CUDA_ERROR_INVALID_VALUE;
}
static CUresult f_mload(CUmodule *m, const void *img) { (void)img; *m = (CUmodule)&module_token; return CUDA_SUCCESS; }
static CUresult f_munload(CUmodule m) { (void)m; return CUDA_SUCCESS; }
static CUresult f_mget(CUfunction *f, CUmodule m, const char *n) { (void)m; (void)n; *f = (CUfunction)&function_token; return CUDA_SUCCESS; }
static CUresult f_launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                         unsigned sh, CUstream s, void **params, void **extra) {
  (void)f; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)sh; (void)s; (void)extra;
  const ferry__gather_item *items = (const ferry__gather_item *)(uintptr_t)*(CUdeviceptr *)params[0];
  const ferry__gather_layout *layouts = (const ferry__gather_layout *)(uintptr_t)*(CUdeviceptr *)params[1];
  for (unsigned i = 0; i < gx; i++) ferry__gather_item_run_host(&items[i], layouts);
  return CUDA_SUCCESS;
}
static CUresult f_batch(CUdeviceptr *d, CUdeviceptr *s, size_t *n, size_t c, CUmemcpyAttributes *a, size_t *ai,
                        size_t na, CUstream st) {
  (void)a; (void)ai; (void)na; (void)st;
  for (size_t i = 0; i < c; i++) memcpy((void *)(uintptr_t)d[i], (void *)(uintptr_t)s[i], n[i]);
  return CUDA_SUCCESS;
}

void fake_driver_use(void) {
  static ferry__driver d;
  d.cuInit = f_init; d.cuDriverGetVersion = f_version; d.cuGetErrorName = f_err_name; d.cuGetErrorString = f_err_name;
  d.cuDeviceGetCount = f_count; d.cuDeviceGet = f_get; d.cuDeviceGetName = f_name; d.cuDeviceGetAttribute = f_attr;
  d.cuDeviceTotalMem = f_mem; d.cuDevicePrimaryCtxRetain = f_retain; d.cuCtxPushCurrent = f_push;
  d.cuCtxPopCurrent = f_pop; d.cuCtxGetDevice = f_ctxdev; d.cuStreamCreate = f_screate; d.cuStreamDestroy = f_sdestroy;
  d.cuStreamGetCtx = f_sctx; d.cuStreamWaitEvent = f_swait; d.cuStreamSynchronize = f_ssync;
  d.cuEventCreate = f_ecreate; d.cuEventDestroy = f_edestroy; d.cuEventRecord = f_erecord; d.cuEventQuery = f_equery;
  d.cuEventSynchronize = f_esync; d.cuMemHostRegister = f_reg; d.cuMemHostUnregister = f_unreg;
  d.cuMemPoolCreate = f_pcreate; d.cuMemPoolDestroy = f_pdestroy; d.cuMemPoolSetAttribute = f_pset;
  d.cuMemAllocFromPoolAsync = f_alloc; d.cuMemFreeAsync = f_free; d.cuMemcpyAsync = f_copy;
  d.cuMemcpyHtoDAsync = f_htod; d.cuPointerGetAttribute = f_ptr; d.cuModuleLoadData = f_mload;
  d.cuModuleUnload = f_munload; d.cuModuleGetFunction = f_mget; d.cuLaunchKernel = f_launch;
  d.cuMemcpyBatchAsync_v13 = f_batch; d.version = 13000;
  ferry__driver_install(&d);
}
