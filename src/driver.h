/* driver.h — private: the CUDA driver entry points ferry uses, as one table of function pointers.
 *
 * driver.c fills the table once, from libcuda.so.1 opened with dlopen and cuGetProcAddress, so nothing links
 * against libcuda. Every driver call in ferry goes through FERRY_CU(), which is also where tests inject faults:
 * the table is the single seam between ferry and CUDA. Tests may install a whole fake table before first use.
 */
#ifndef FERRY_DRIVER_H
#define FERRY_DRIVER_H

#include "ferry.h"

#include <cuda.h> /* types and enums only: no symbol of libcuda is referenced at link time */
#include <stddef.h>
#ifndef __cplusplus
#include <stdatomic.h>
#endif

/* CUDA 13 removed failIdx from cuMemcpyBatchAsync; both prototypes are written out so that the one matching the
 * running driver is called, whatever cuda.h the build saw. */
typedef CUresult (*ferry__batch_v12_fn)(CUdeviceptr *, CUdeviceptr *, size_t *, size_t, CUmemcpyAttributes *,
                                         size_t *, size_t, size_t *, CUstream);
typedef CUresult (*ferry__batch_v13_fn)(CUdeviceptr *, CUdeviceptr *, size_t *, size_t, CUmemcpyAttributes *,
                                         size_t *, size_t, CUstream);

/* X(name, return-less prototype arguments) for every entry resolved at the CUDA 12.0 ABI. Optional entries (may
 * be NULL on older drivers) are marked in driver.c. */
#define FERRY_DRIVER_MAP(X)                                                                                   \
  X(cuInit, (unsigned int))                                                                                   \
  X(cuDriverGetVersion, (int *))                                                                              \
  X(cuGetErrorName, (CUresult, const char **))                                                                \
  X(cuGetErrorString, (CUresult, const char **))                                                              \
  X(cuDeviceGetCount, (int *))                                                                                \
  X(cuDeviceGet, (CUdevice *, int))                                                                           \
  X(cuDeviceGetName, (char *, int, CUdevice))                                                                 \
  X(cuDeviceGetAttribute, (int *, CUdevice_attribute, CUdevice))                                              \
  X(cuDeviceTotalMem, (size_t *, CUdevice))                                                                   \
  X(cuDevicePrimaryCtxRetain, (CUcontext *, CUdevice))                                                        \
  X(cuCtxPushCurrent, (CUcontext))                                                                            \
  X(cuCtxPopCurrent, (CUcontext *))                                                                           \
  X(cuCtxGetDevice, (CUdevice *))                                                                             \
  X(cuStreamCreate, (CUstream *, unsigned int))                                                               \
  X(cuStreamDestroy, (CUstream))                                                                              \
  X(cuStreamGetCtx, (CUstream, CUcontext *))                                                                  \
  X(cuStreamWaitEvent, (CUstream, CUevent, unsigned int))                                                     \
  X(cuStreamIsCapturing, (CUstream, CUstreamCaptureStatus *))                                                 \
  X(cuThreadExchangeStreamCaptureMode, (CUstreamCaptureMode *))                                               \
  X(cuStreamSynchronize, (CUstream))                                                                          \
  X(cuEventCreate, (CUevent *, unsigned int))                                                                 \
  X(cuEventDestroy, (CUevent))                                                                                \
  X(cuEventRecord, (CUevent, CUstream))                                                                       \
  X(cuEventQuery, (CUevent))                                                                                  \
  X(cuEventSynchronize, (CUevent))                                                                            \
  X(cuMemHostRegister, (void *, size_t, unsigned int))                                                        \
  X(cuMemHostUnregister, (void *))                                                                            \
  X(cuMemPoolCreate, (CUmemoryPool *, const CUmemPoolProps *))                                                \
  X(cuMemPoolDestroy, (CUmemoryPool))                                                                         \
  X(cuMemPoolSetAttribute, (CUmemoryPool, CUmemPool_attribute, void *))                                      \
  X(cuMemAllocFromPoolAsync, (CUdeviceptr *, size_t, CUmemoryPool, CUstream))                                 \
  X(cuMemFreeAsync, (CUdeviceptr, CUstream))                                                                  \
  X(cuMemcpyAsync, (CUdeviceptr, CUdeviceptr, size_t, CUstream))                                              \
  X(cuMemcpyHtoDAsync, (CUdeviceptr, const void *, size_t, CUstream))                                         \
  X(cuPointerGetAttribute, (void *, CUpointer_attribute, CUdeviceptr))                                        \
  X(cuModuleLoadData, (CUmodule *, const void *))                                                             \
  X(cuModuleUnload, (CUmodule))                                                                               \
  X(cuModuleGetFunction, (CUfunction *, CUmodule, const char *))                                              \
  X(cuLaunchKernel, (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,        \
                     CUstream, void **, void **))                                                              \
  /* operators (src/ops/): context-independent libraries, launches, graphs; all present since CUDA 12.0 */    \
  X(cuCtxGetCurrent, (CUcontext *))                                                                           \
  X(cuLibraryLoadData, (CUlibrary *, const void *, CUjit_option *, void **, unsigned int, CUlibraryOption *,  \
                        void **, unsigned int))                                                               \
  X(cuLibraryUnload, (CUlibrary))                                                                             \
  X(cuLibraryGetKernel, (CUkernel *, CUlibrary, const char *))                                                \
  X(cuKernelGetFunction, (CUfunction *, CUkernel))                                                            \
  X(cuFuncSetAttribute, (CUfunction, CUfunction_attribute, int))                                              \
  X(cuFuncGetAttribute, (int *, CUfunction_attribute, CUfunction))                                           \
  X(cuStreamBeginCapture, (CUstream, CUstreamCaptureMode))                                                    \
  X(cuStreamEndCapture, (CUstream, CUgraph *))                                                                \
  /* the 12.0 ABI's cuStreamGetCaptureInfo (no edge data): status, id, graph, dependencies, their count */      \
  X(cuStreamGetCaptureInfo, (CUstream, CUstreamCaptureStatus *, cuuint64_t *, CUgraph *, const CUgraphNode **, \
                             size_t *))                                                                       \
  X(cuGraphNodeGetType, (CUgraphNode, CUgraphNodeType *))                                                     \
  X(cuGraphInstantiateWithFlags, (CUgraphExec *, CUgraph, unsigned long long))                                \
  X(cuGraphLaunch, (CUgraphExec, CUstream))                                                                   \
  X(cuGraphExecKernelNodeSetParams, (CUgraphExec, CUgraphNode, const CUDA_KERNEL_NODE_PARAMS *))              \
  X(cuGraphDestroy, (CUgraph))                                                                                \
  X(cuGraphExecDestroy, (CUgraphExec))                                                                        \
  X(cuTensorMapEncodeTiled, (CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,      \
                             const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave, \
                             CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill))           \
  X(cuOccupancyMaxActiveClusters, (int *, CUfunction, const CUlaunchConfig *))                                \
  /* for the operator tests and benchmarks: plain allocations, synchronous copies, event timing */             \
  X(cuMemAlloc, (CUdeviceptr *, size_t))                                                                      \
  X(cuMemFree, (CUdeviceptr))                                                                                 \
  X(cuMemcpyHtoD, (CUdeviceptr, const void *, size_t))                                                        \
  X(cuMemcpyDtoH, (void *, CUdeviceptr, size_t))                                                              \
  X(cuEventElapsedTime, (float *, CUevent, CUevent))

typedef struct ferry__driver {
#define FERRY_DRIVER_FIELD_GEN(name, args) CUresult(*name) args;
  FERRY_DRIVER_MAP(FERRY_DRIVER_FIELD_GEN)
#undef FERRY_DRIVER_FIELD_GEN
  /* Exactly one of these is set when the driver has cuMemcpyBatchAsync (12.8+), neither otherwise. */
  ferry__batch_v12_fn cuMemcpyBatchAsync_v12;
  ferry__batch_v13_fn cuMemcpyBatchAsync_v13;
  int version; /* cuDriverGetVersion */
} ferry__driver;

/* The table in use; valid (all required entries set) once ferry__driver_load() returned FERRY_OK. */
extern ferry__driver ferry__drv;

/* Loads the driver once; thread-safe. Returns FERRY_OK, FERRY_NO_DRIVER or FERRY_NO_DEVICE (with the error set
 * on every call that fails, not only the first); FERRY_UNSUPPORTED in a child forked after it succeeded (fork.c). */
ferry_status ferry__driver_load(void);

/* Test seam: use `fake` instead of libcuda. Must be called before the first ferry call that needs the driver. */
void ferry__driver_install(const ferry__driver *fake);

/* Test seam: make the `nth` (1-based) call of `call_name` from now on return `result`; nth = 0 fails every call.
 * ferry__fault_disarm() clears it. ferry__fault_hits() counts calls of the armed name since arming. */
void ferry__fault_arm(const char *call_name, int nth, CUresult result);
void ferry__fault_disarm(void);
int ferry__fault_hits(void);

/* Test seam: while counting is on (from zero at each ferry__fault_count(1)), every call that passes FERRY_CU or
 * FERRY_RTC is counted by name. ferry__fault_calls(i, &name) gives the i-th name the seam has seen and its count,
 * or -1 past the last, so a test can list every call a clean run makes and then fail each use of each. */
void ferry__fault_count(int on);
int ferry__fault_calls(int i, const char **name);

/* Set while a fault is armed (and in a child forked after initialisation, see fork.c). Other threads arm it while
 * driver calls run, so it is atomic: written with release after the rest of the seam, read with acquire. */
CUresult ferry__fault_check(const char *call_name);
#ifndef __cplusplus /* C11 atomics; C++ only ever reads this header's declarations (tests/header) */
extern _Atomic int ferry__fault_armed;
static inline int ferry__fault_is_armed(void) {
  return atomic_load_explicit(&ferry__fault_armed, memory_order_acquire);
}
#endif

/* Calls a driver entry, honouring an armed fault. The branch costs one load when no fault is armed (an acquire
 * load: a plain load on x86, LDAR on ARM64). (A GNU statement expression, so the fault counter is consulted
 * exactly once per call.)
 *
 * The name is stringized before macro expansion on purpose: cuda.h #defines many entry points to versioned
 * symbols (cuCtxPushCurrent -> cuCtxPushCurrent_v2), and errors and the fault seam must use the name as written
 * in ferry's source and in the CUDA documentation. The table's fields carry the expanded names, consistently. */
#define FERRY_CU(name, ...) FERRY__CU_CALL(#name, name, __VA_ARGS__)
#define FERRY__CU_CALL(name_str, field, ...)                                                                  \
  __extension__({                                                                                             \
    CUresult ferry_fault_ = ferry__fault_is_armed() ? ferry__fault_check(name_str) : CUDA_SUCCESS;            \
    ferry_fault_ != CUDA_SUCCESS ? ferry_fault_ : ferry__drv.field(__VA_ARGS__);                              \
  })

/* The driver's name for a CUresult ("CUDA_ERROR_INVALID_VALUE"), static; works for fakes and unknown codes. */
const char *ferry__cu_name(CUresult r);

#endif
