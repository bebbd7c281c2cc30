/* rtc.h — private: the NVRTC entry points ferry uses, as one table of function pointers (the run-time compiler's
 * counterpart of driver.h).
 *
 * rtc.c opens libnvrtc with dlopen at first use, so ferry neither links against NVRTC nor needs it unless an
 * operator is compiled. Every NVRTC call goes through FERRY_RTC(), which honours the driver table's fault seam
 * (ferry__fault_arm("nvrtcCompileProgram", ...)), so tests can fail each compiler call too.
 */
#ifndef FERRY_RTC_H
#define FERRY_RTC_H

#include "internal.h"

#include <nvrtc.h> /* types and enums only: no symbol of libnvrtc is referenced at link time */

/* X(name, arguments) for every NVRTC entry ferry calls; all return nvrtcResult. */
#define FERRY_RTC_MAP(X)                                                                                      \
  X(nvrtcVersion, (int *, int *))                                                                             \
  X(nvrtcGetNumSupportedArchs, (int *))                                                                       \
  X(nvrtcGetSupportedArchs, (int *))                                                                          \
  X(nvrtcCreateProgram, (nvrtcProgram *, const char *, const char *, int, const char *const *,               \
                         const char *const *))                                                                \
  X(nvrtcDestroyProgram, (nvrtcProgram *))                                                                    \
  X(nvrtcCompileProgram, (nvrtcProgram, int, const char *const *))                                            \
  X(nvrtcGetCUBINSize, (nvrtcProgram, size_t *))                                                              \
  X(nvrtcGetCUBIN, (nvrtcProgram, char *))                                                                    \
  X(nvrtcGetProgramLogSize, (nvrtcProgram, size_t *))                                                         \
  X(nvrtcGetProgramLog, (nvrtcProgram, char *))

typedef struct ferry__rtc_table {
#define FERRY_RTC_FIELD_GEN(name, args) nvrtcResult(*name) args;
  FERRY_RTC_MAP(FERRY_RTC_FIELD_GEN)
#undef FERRY_RTC_FIELD_GEN
  const char *(*nvrtcGetErrorString)(nvrtcResult);
  int major, minor;      /* nvrtcVersion */
  int archs[64];         /* nvrtcGetSupportedArchs, ascending (75, 80, ..., 90, ...) */
  int n_archs;
  char path[256];        /* the library that was opened */
} ferry__rtc_table;

/* The table in use; valid once ferry__rtc_load() returned FERRY_OK. */
extern ferry__rtc_table ferry__rtc;

/* Loads NVRTC once (thread-safe): $FERRY_NVRTC when set, else libnvrtc.so.13, .12, libnvrtc.so, then the same
 * names under $CUDA_HOME/lib64 and /usr/local/cuda/lib64. Returns FERRY_OK or FERRY_NO_COMPILER (error set on
 * every failing call, naming what was tried); FERRY_UNSUPPORTED in a child forked after the parent loaded NVRTC or
 * initialised the driver (fork.c). */
ferry_status ferry__rtc_load(void);

/* 1 when NVRTC can compile for sm_`sm` (loaded first). */
int ferry__rtc_supports_arch(int sm);

/* NVRTC's name for a result ("NVRTC_ERROR_COMPILATION"), static; works before loading and for fault codes. */
const char *ferry__rtc_name(nvrtcResult r);

/* Records a failed NVRTC call as FERRY_COMPILE_FAILED (FERRY_OUT_OF_HOST_MEMORY for NVRTC_ERROR_OUT_OF_MEMORY),
 * with the call's name in the error record and the message "<what>: <call> failed with <name>". */
ferry_status ferry__rtc_error(nvrtcResult r, const char *call, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* Calls an NVRTC entry, honouring an armed fault (which fails it with NVRTC_ERROR_INTERNAL_ERROR, or
 * NVRTC_ERROR_OUT_OF_MEMORY when armed with CUDA_ERROR_OUT_OF_MEMORY). */
#define FERRY_RTC(name, ...)                                                                                  \
  __extension__({                                                                                             \
    CUresult ferry_rtc_fault_ = ferry__fault_is_armed() ? ferry__fault_check(#name) : CUDA_SUCCESS;           \
    ferry_rtc_fault_ == CUDA_SUCCESS        ? ferry__rtc.name(__VA_ARGS__)                                    \
    : ferry_rtc_fault_ == CUDA_ERROR_OUT_OF_MEMORY ? NVRTC_ERROR_OUT_OF_MEMORY                                \
                                            : NVRTC_ERROR_INTERNAL_ERROR;                                     \
  })

/* As FERRY_TRY_CU, for NVRTC: on failure records the error, sets `st` and jumps to `cleanup`. */
#define FERRY_TRY_RTC(what_fmt_and_args, name, ...)                                                           \
  do {                                                                                                        \
    nvrtcResult ferry_rtc_r_ = FERRY_RTC(name, __VA_ARGS__);                                                  \
    if (ferry_rtc_r_ != NVRTC_SUCCESS) {                                                                      \
      st = ferry__rtc_error(ferry_rtc_r_, #name, __FILE__, __LINE__, FERRY_UNPAREN what_fmt_and_args);        \
      goto cleanup;                                                                                           \
    }                                                                                                         \
  } while (0)

#endif
