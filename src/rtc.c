/* rtc.c — loads NVRTC (libnvrtc) at run time and fills its table; with driver.c, the only code that knows how
 * CUDA's libraries are loaded.
 *
 * NVRTC is optional: a program that never compiles an operator never opens it, and a machine without it can still
 * run imported artifacts. The library is found by soname first (the loader's path, LD_LIBRARY_PATH, ldconfig),
 * then in the usual toolkit directories, because pip- and conda-installed toolkits are rarely on ldconfig's path.
 */
#include "rtc.h"

#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

ferry__rtc_table ferry__rtc;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER; /* held while loading: fork.c waits for it */
static ferry_status load_status = FERRY_NO_COMPILER;
static char load_message[400];

static void *open_nvrtc(char *tried, size_t tried_size) {
  static const char *names[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"};
  const char *env = getenv("FERRY_NVRTC");
  const char *home = getenv("CUDA_HOME");
  size_t used = 0;
  tried[0] = '\0';
  char path[512];
  for (int round = 0; round < 4; round++) {
    size_t n = round == 0 ? 1 : sizeof names / sizeof names[0];
    for (size_t i = 0; i < n; i++) {
      if (round == 0) {
        if (!env || !*env) break;
        snprintf(path, sizeof path, "%s", env);
      } else if (round == 1) {
        snprintf(path, sizeof path, "%s", names[i]);
      } else if (round == 2) {
        if (!home || !*home) break;
        snprintf(path, sizeof path, "%s/lib64/%s", home, names[i]);
      } else {
        snprintf(path, sizeof path, "/usr/local/cuda/lib64/%s", names[i]);
      }
      void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
      if (lib) {
        snprintf(ferry__rtc.path, sizeof ferry__rtc.path, "%.255s", path);
        return lib;
      }
      if (used < tried_size) {
        int w = snprintf(tried + used, tried_size - used, "%s%s", used ? ", " : "", path);
        used += w > 0 ? (size_t)w : 0;
      }
      /* FERRY_NVRTC names one library on purpose: do not silently fall back to another. */
      if (round == 0) return NULL;
    }
  }
  return NULL;
}

static void load_locked(void) {
  char tried[256];
  void *lib = open_nvrtc(tried, sizeof tried);
  if (!lib) {
    snprintf(load_message, sizeof load_message, "NVRTC could not be opened (tried %s); install the CUDA toolkit's "
             "NVRTC or set FERRY_NVRTC to libnvrtc.so's path", tried);
    return;
  }
  ferry__rtc_table t;
  memset(&t, 0, sizeof t);
  memcpy(t.path, ferry__rtc.path, sizeof t.path);
#define FERRY_RTC_RESOLVE_GEN(name, args)                                                                    \
  *(void **)&t.name = dlsym(lib, #name);                                                                     \
  if (!t.name) {                                                                                             \
    snprintf(load_message, sizeof load_message, "%s lacks %s; ferry needs NVRTC 12.0 or newer", t.path,     \
             #name);                                                                                         \
    dlclose(lib);                                                                                            \
    return;                                                                                                  \
  }
  FERRY_RTC_MAP(FERRY_RTC_RESOLVE_GEN)
#undef FERRY_RTC_RESOLVE_GEN
  *(void **)&t.nvrtcGetErrorString = dlsym(lib, "nvrtcGetErrorString");
  int n = 0;
  if (t.nvrtcVersion(&t.major, &t.minor) != NVRTC_SUCCESS || t.nvrtcGetNumSupportedArchs(&n) != NVRTC_SUCCESS ||
      n <= 0 || n > (int)(sizeof t.archs / sizeof t.archs[0]) || t.nvrtcGetSupportedArchs(t.archs) != NVRTC_SUCCESS) {
    snprintf(load_message, sizeof load_message, "%s does not answer nvrtcVersion/nvrtcGetSupportedArchs", t.path);
    dlclose(lib);
    return;
  }
  t.n_archs = n;
  ferry__rtc = t;
  /* The handle stays open for the life of the process: the function pointers point into it. */
  load_status = FERRY_OK;
  ferry__fork_guard_install_rtc(); /* from now on a forked child must not compile (fork.c) */
}

static void load(void) {
  pthread_mutex_lock(&load_lock);
  load_locked();
  pthread_mutex_unlock(&load_lock);
}

void ferry__rtc_fork_lock(int lock) { lock ? pthread_mutex_lock(&load_lock) : pthread_mutex_unlock(&load_lock); }

ferry_status ferry__rtc_load(void) {
  if (ferry__fork_no_rtc) return ferry__fork_refuse();
  pthread_once(&load_once, load);
  if (load_status != FERRY_OK) return ferry__call_error(load_status, "dlopen", __FILE__, __LINE__, "%s", load_message);
  return FERRY_OK;
}

int ferry__rtc_supports_arch(int sm) {
  for (int i = 0; i < ferry__rtc.n_archs; i++)
    if (ferry__rtc.archs[i] == sm) return 1;
  return 0;
}

const char *ferry__rtc_name(nvrtcResult r) {
  switch (r) {
  case NVRTC_SUCCESS: return "NVRTC_SUCCESS";
  case NVRTC_ERROR_OUT_OF_MEMORY: return "NVRTC_ERROR_OUT_OF_MEMORY";
  case NVRTC_ERROR_PROGRAM_CREATION_FAILURE: return "NVRTC_ERROR_PROGRAM_CREATION_FAILURE";
  case NVRTC_ERROR_INVALID_INPUT: return "NVRTC_ERROR_INVALID_INPUT";
  case NVRTC_ERROR_INVALID_PROGRAM: return "NVRTC_ERROR_INVALID_PROGRAM";
  case NVRTC_ERROR_INVALID_OPTION: return "NVRTC_ERROR_INVALID_OPTION";
  case NVRTC_ERROR_COMPILATION: return "NVRTC_ERROR_COMPILATION";
  case NVRTC_ERROR_BUILTIN_OPERATION_FAILURE: return "NVRTC_ERROR_BUILTIN_OPERATION_FAILURE";
  case NVRTC_ERROR_INTERNAL_ERROR: return "NVRTC_ERROR_INTERNAL_ERROR";
  default: return "NVRTC_ERROR_UNKNOWN_CODE";
  }
}

ferry_status ferry__rtc_error(nvrtcResult r, const char *call, const char *file, int line, const char *fmt, ...) {
  char what[300];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  ferry_status status = r == NVRTC_ERROR_OUT_OF_MEMORY ? FERRY_OUT_OF_HOST_MEMORY : FERRY_COMPILE_FAILED;
  return ferry__lib_error(status, call, ferry__rtc_name(r), file, line, "%s%s%s failed with %s", what,
                          *what ? ": " : "", call, ferry__rtc_name(r));
}
