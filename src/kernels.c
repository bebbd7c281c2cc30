/* kernels.c — loads ferry's embedded device code (the gather kernel) into each device's primary context, once.
 *
 * The kernel is compiled by nvcc when ferry is built and embedded as a fatbin (machine code for sm_80 and sm_90,
 * PTX for newer chips), so the first transfer pays a module load (about 0.1 ms) instead of a run-time compile.
 * A build without nvcc has no kernel: ferry__gather_available() says so and transfers fall back to DMA.
 */
#include "internal.h"

static pthread_mutex_t module_lock = PTHREAD_MUTEX_INITIALIZER;
static CUmodule modules[FERRY_MAX_DEVICES];
static _Atomic(CUfunction) functions[FERRY_MAX_DEVICES];

int ferry__gather_available(void) { return ferry__gather_fatbin_size > 0; }

ferry_status ferry__gather_function(int device, CUfunction *out) {
  ferry_status st = FERRY_OK;
  CUfunction f = atomic_load_explicit(&functions[device], memory_order_acquire);
  if (f) {
    *out = f;
    return FERRY_OK;
  }
  if (!ferry__gather_available())
    return FERRY_ERR(FERRY_UNSUPPORTED, "this build of ferry has no gather kernel (nvcc was not found when it "
                     "was built), so strided tensors cannot be transferred");
  pthread_mutex_lock(&module_lock);
  f = atomic_load(&functions[device]);
  if (!f) {
    CUmodule m = modules[device];
    if (!m) {
      FERRY_TRY_CU(("loading the gather kernel on cuda:%d", device), cuModuleLoadData, &m, ferry__gather_fatbin);
      modules[device] = m;
    }
    FERRY_TRY_CU(("finding the gather kernel on cuda:%d", device), cuModuleGetFunction, &f, m,
                 "ferry_gather_kernel");
    atomic_store_explicit(&functions[device], f, memory_order_release);
  }
  *out = f;
cleanup:
  pthread_mutex_unlock(&module_lock);
  return st;
}

/* fork.c: held across fork() so a child never inherits the lock held by a thread it does not have. */
void ferry__gather_fork_lock(int lock) { lock ? pthread_mutex_lock(&module_lock) : pthread_mutex_unlock(&module_lock); }
