/* driver.c — loads libcuda.so.1 at run time and fills the driver table; the one file that knows how CUDA is
 * loaded.
 *
 * Entry points are resolved once through cuGetProcAddress, asking for the ABI version whose prototype ferry
 * declares (12.0 for the stable calls, 13.0 or 12.8 for cuMemcpyBatchAsync depending on the running driver), so
 * a newer driver never hands ferry a function with a different signature than the one it calls.
 */
#include "internal.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

ferry__driver ferry__drv;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER; /* held while loading: fork.c waits for it */
static ferry_status load_status = FERRY_NO_DRIVER;
static char load_message[400];
static const ferry__driver *installed_fake;

typedef CUresult (*get_proc_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

static void load_real(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    snprintf(load_message, sizeof load_message, "libcuda.so.1 could not be opened (%s); is the NVIDIA driver "
             "installed?", dlerror());
    load_status = FERRY_NO_DRIVER;
    return;
  }
  get_proc_fn get_proc = (get_proc_fn)dlsym(lib, "cuGetProcAddress_v2");
  CUresult (*get_version)(int *) = (CUresult(*)(int *))dlsym(lib, "cuDriverGetVersion");
  int version = 0;
  if (!get_proc || !get_version || get_version(&version) != CUDA_SUCCESS || version < 12000) {
    snprintf(load_message, sizeof load_message, "the CUDA driver is too old (version %d; ferry needs 12.0 or "
             "newer, with cuGetProcAddress_v2)", version);
    load_status = FERRY_NO_DRIVER;
    return;
  }
  ferry__driver d;
  memset(&d, 0, sizeof d);
  d.version = version;
  CUdriverProcAddressQueryResult found;
#define FERRY_RESOLVE_GEN(name, args)                                                                    \
  if (get_proc(#name, (void **)&d.name, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &found) != CUDA_SUCCESS ||   \
      found != CU_GET_PROC_ADDRESS_SUCCESS || !d.name) {                                                 \
    snprintf(load_message, sizeof load_message, "the CUDA driver (version %d) lacks %s", version, #name); \
    load_status = FERRY_NO_DRIVER;                                                                       \
    return;                                                                                              \
  }
  FERRY_DRIVER_MAP(FERRY_RESOLVE_GEN)
#undef FERRY_RESOLVE_GEN
  void *batch = NULL;
  if (version >= 13000) {
    if (get_proc("cuMemcpyBatchAsync", &batch, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &found) == CUDA_SUCCESS &&
        found == CU_GET_PROC_ADDRESS_SUCCESS)
      d.cuMemcpyBatchAsync_v13 = (ferry__batch_v13_fn)batch;
  } else if (version >= 12080) {
    if (get_proc("cuMemcpyBatchAsync", &batch, 12080, CU_GET_PROC_ADDRESS_DEFAULT, &found) == CUDA_SUCCESS &&
        found == CU_GET_PROC_ADDRESS_SUCCESS)
      d.cuMemcpyBatchAsync_v12 = (ferry__batch_v12_fn)batch;
  }
  ferry__drv = d;
  /* The library handle stays open for the life of the process: function pointers into it are cached. */
  load_status = FERRY_OK;
}

static void load_locked(void) {
  if (installed_fake) {
    ferry__drv = *installed_fake;
    load_status = FERRY_OK;
  } else {
    load_real();
    if (load_status != FERRY_OK) return;
  }
  CUresult r = ferry__drv.cuInit(0);
  if (r == CUDA_ERROR_NO_DEVICE) {
    snprintf(load_message, sizeof load_message, "the CUDA driver (version %d) loaded but reports no device",
             ferry__drv.version);
    load_status = FERRY_NO_DEVICE;
  } else if (r != CUDA_SUCCESS) {
    snprintf(load_message, sizeof load_message, "cuInit failed with %s; the driver cannot be used",
             ferry__cu_name(r));
    load_status = FERRY_NO_DRIVER;
  } else {
    int count = 0;
    if (ferry__drv.cuDeviceGetCount(&count) != CUDA_SUCCESS || count == 0) {
      snprintf(load_message, sizeof load_message, "the CUDA driver (version %d) loaded but reports no device",
               ferry__drv.version);
      load_status = FERRY_NO_DEVICE;
    }
  }
  if (load_status == FERRY_OK) ferry__fork_guard_install(); /* from now on a forked child must not use CUDA */
}

static void load(void) {
  pthread_mutex_lock(&load_lock);
  load_locked();
  pthread_mutex_unlock(&load_lock);
}

void ferry__driver_fork_lock(int lock) { lock ? pthread_mutex_lock(&load_lock) : pthread_mutex_unlock(&load_lock); }

ferry_status ferry__driver_load(void) {
  if (ferry__fork_child) return ferry__fork_refuse();
  pthread_once(&load_once, load);
  if (load_status != FERRY_OK) return FERRY_ERR(load_status, "%s", load_message);
  return FERRY_OK;
}

ferry_status ferry_init(void) { return ferry__driver_load(); }

void ferry__driver_install(const ferry__driver *fake) { installed_fake = fake; }

/* ---- fault injection -------------------------------------------------------------------------------------
 * Tests arm the seam from one thread while others make driver calls, so all of its state is atomic. The armed
 * call's name is interned in a table whose slots are written once, under a lock, before their index is published,
 * and never rewritten: a reader comparing a name against the armed slot never sees a torn string. Arming stores
 * the count and result, then the slot, then the flag, each published with release; readers load with acquire. */

#define FAULT_NAMES 256
static char fault_names[FAULT_NAMES][64];
static int fault_names_used; /* under fault_names_lock */
static pthread_mutex_t fault_names_lock = PTHREAD_MUTEX_INITIALIZER;

_Atomic int ferry__fault_armed;
static atomic_int fault_slot = -1, fault_nth, fault_hits, fault_result, fault_counting;
static atomic_int fault_counts[FAULT_NAMES]; /* calls per interned name while counting */

/* The slot holding `name`, added on first use; -1 when the table is full (nothing is armed then). */
static int fault_intern(const char *name) {
  pthread_mutex_lock(&fault_names_lock);
  int i = 0;
  while (i < fault_names_used && strncmp(fault_names[i], name, sizeof fault_names[i] - 1) != 0) i++;
  if (i == fault_names_used && i < FAULT_NAMES)
    snprintf(fault_names[fault_names_used++], sizeof fault_names[i], "%s", name);
  pthread_mutex_unlock(&fault_names_lock);
  return i < FAULT_NAMES ? i : -1;
}

/* Every driver call consults the seam while a fault is armed, calls are counted, or in a forked child. */
static void fault_publish(void) {
  int on = ferry__fork_child || atomic_load_explicit(&fault_slot, memory_order_relaxed) >= 0 ||
           atomic_load_explicit(&fault_counting, memory_order_relaxed);
  atomic_store_explicit(&ferry__fault_armed, on, memory_order_release);
}

void ferry__fault_arm(const char *call_name, int nth, CUresult result) {
  int slot = fault_intern(call_name);
  atomic_store_explicit(&fault_nth, nth, memory_order_relaxed);
  atomic_store_explicit(&fault_result, (int)result, memory_order_relaxed);
  atomic_store_explicit(&fault_hits, 0, memory_order_relaxed);
  atomic_store_explicit(&fault_slot, slot, memory_order_release);
  fault_publish();
}

void ferry__fault_disarm(void) {
  atomic_store_explicit(&fault_slot, -1, memory_order_release);
  fault_publish(); /* a forked child stays armed: every driver call there must reach the refusal below */
}

int ferry__fault_hits(void) { return atomic_load_explicit(&fault_hits, memory_order_relaxed); }

void ferry__fault_count(int on) {
  if (on)
    for (int i = 0; i < FAULT_NAMES; i++) atomic_store_explicit(&fault_counts[i], 0, memory_order_relaxed);
  atomic_store_explicit(&fault_counting, on, memory_order_release);
  fault_publish();
}

int ferry__fault_calls(int i, const char **name) {
  pthread_mutex_lock(&fault_names_lock);
  int used = fault_names_used;
  pthread_mutex_unlock(&fault_names_lock);
  if (i < 0 || i >= used) return -1;
  *name = fault_names[i]; /* written once, before `used` counted it */
  return atomic_load_explicit(&fault_counts[i], memory_order_relaxed);
}

CUresult ferry__fault_check(const char *call_name) {
  if (ferry__fork_child) return CUDA_ERROR_NOT_INITIALIZED; /* see fork.c: no driver call from a forked child */
  if (atomic_load_explicit(&fault_counting, memory_order_acquire)) {
    int counted = fault_intern(call_name);
    if (counted >= 0) atomic_fetch_add_explicit(&fault_counts[counted], 1, memory_order_relaxed);
  }
  int slot = atomic_load_explicit(&fault_slot, memory_order_acquire);
  if (slot < 0 || strcmp(call_name, fault_names[slot]) != 0) return CUDA_SUCCESS;
  /* Each call takes its own use number, so with several threads exactly one of them gets the nth. */
  int use = atomic_fetch_add_explicit(&fault_hits, 1, memory_order_relaxed) + 1;
  int nth = atomic_load_explicit(&fault_nth, memory_order_relaxed);
  if (nth == 0 || use == nth) return (CUresult)atomic_load_explicit(&fault_result, memory_order_relaxed);
  return CUDA_SUCCESS;
}

const char *ferry__cu_name(CUresult r) {
  const char *name = NULL;
  if (ferry__drv.cuGetErrorName && ferry__drv.cuGetErrorName(r, &name) == CUDA_SUCCESS && name) return name;
  switch (r) {
  case CUDA_SUCCESS: return "CUDA_SUCCESS";
  case CUDA_ERROR_INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
  case CUDA_ERROR_OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
  case CUDA_ERROR_NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
  case CUDA_ERROR_NO_DEVICE: return "CUDA_ERROR_NO_DEVICE";
  case CUDA_ERROR_INVALID_DEVICE: return "CUDA_ERROR_INVALID_DEVICE";
  case CUDA_ERROR_INVALID_CONTEXT: return "CUDA_ERROR_INVALID_CONTEXT";
  case CUDA_ERROR_LAUNCH_FAILED: return "CUDA_ERROR_LAUNCH_FAILED";
  case CUDA_ERROR_NOT_READY: return "CUDA_ERROR_NOT_READY";
  case CUDA_ERROR_ILLEGAL_ADDRESS: return "CUDA_ERROR_ILLEGAL_ADDRESS";
  case CUDA_ERROR_NOT_SUPPORTED: return "CUDA_ERROR_NOT_SUPPORTED";
  default: return "CUDA_ERROR_UNKNOWN_CODE";
  }
}
