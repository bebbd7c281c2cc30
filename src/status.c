/* status.c — the status table's strings and the thread-local last-error record.
 *
 * Errors travel as a return code plus a per-thread record, so no caller allocates to learn what went wrong and
 * the hot path formats nothing unless something failed.
 */
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local ferry_error tls_error = {FERRY_OK, 0, "", "", "", 0, ""};

const char *ferry_version(void) {
#define FERRY_STR2(x) #x
#define FERRY_STR(x) FERRY_STR2(x)
  return FERRY_STR(FERRY_VERSION_MAJOR) "." FERRY_STR(FERRY_VERSION_MINOR) "." FERRY_STR(FERRY_VERSION_PATCH);
}

const char *ferry_status_name(ferry_status status) {
  switch (status) {
#define FERRY_STATUS_NAME_GEN(name, code, text) \
  case FERRY_##name:                            \
    return #name;
    FERRY_STATUS_MAP(FERRY_STATUS_NAME_GEN)
#undef FERRY_STATUS_NAME_GEN
  }
  return "UNKNOWN";
}

const char *ferry_status_str(ferry_status status) {
  switch (status) {
#define FERRY_STATUS_STR_GEN(name, code, text) \
  case FERRY_##name:                           \
    return text;
    FERRY_STATUS_MAP(FERRY_STATUS_STR_GEN)
#undef FERRY_STATUS_STR_GEN
  }
  return "unknown status";
}

const ferry_error *ferry_last_error(void) { return &tls_error; }
const char *ferry_last_error_message(void) { return tls_error.message; }

void ferry_clear_error(void) {
  tls_error.status = FERRY_OK;
  tls_error.cu_result = 0;
  tls_error.cu_name = "";
  tls_error.call = "";
  tls_error.file = "";
  tls_error.line = 0;
  tls_error.message[0] = '\0';
}

static void record(ferry_status status, int cu, const char *cu_name, const char *call, const char *file, int line) {
  const char *base = strrchr(file, '/');
  tls_error.status = status;
  tls_error.cu_result = cu;
  tls_error.cu_name = cu_name;
  tls_error.call = call;
  tls_error.file = base ? base + 1 : file;
  tls_error.line = line;
}

ferry_status ferry__error(ferry_status status, const char *file, int line, const char *fmt, ...) {
  va_list ap;
  record(status, 0, "", "", file, line);
  va_start(ap, fmt);
  vsnprintf(tls_error.message, sizeof tls_error.message, fmt, ap);
  va_end(ap);
  return status;
}

/* The message is formatted into a local buffer first: an argument may be the record's own message (a caller that
 * wraps the error of a call it just made), and vsnprintf must not write over what it reads. */
static ferry_status record_call(ferry_status status, const char *call, const char *result_name, const char *file,
                                int line, const char *fmt, va_list ap) {
  char message[sizeof tls_error.message];
  vsnprintf(message, sizeof message, fmt, ap);
  record(status, 0, result_name ? result_name : "", call ? call : "", file, line);
  memcpy(tls_error.message, message, sizeof message);
  return status;
}

ferry_status ferry__call_error(ferry_status status, const char *call, const char *file, int line, const char *fmt,
                               ...) {
  va_list ap;
  va_start(ap, fmt);
  record_call(status, call, "", file, line, fmt, ap);
  va_end(ap);
  return status;
}

ferry_status ferry__lib_error(ferry_status status, const char *call, const char *result_name, const char *file,
                              int line, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  record_call(status, call, result_name, file, line, fmt, ap);
  va_end(ap);
  return status;
}

void ferry__error_restore(const ferry_error *saved) { tls_error = *saved; }

static ferry_status status_of(CUresult r, const char *call) {
  switch (r) {
  case CUDA_ERROR_OUT_OF_MEMORY:
    /* Host-side calls report host exhaustion with the same code as device allocations. */
    return (strstr(call, "Host") != NULL) ? FERRY_OUT_OF_HOST_MEMORY : FERRY_OUT_OF_DEVICE_MEMORY;
  case CUDA_ERROR_NO_DEVICE:
    return FERRY_NO_DEVICE;
  case CUDA_ERROR_INVALID_DEVICE:
    return FERRY_DEVICE_UNAVAILABLE;
  case CUDA_ERROR_NOT_READY:
    return FERRY_NOT_READY;
  case CUDA_ERROR_NOT_SUPPORTED:
    return FERRY_UNSUPPORTED;
  default:
    return FERRY_DRIVER_ERROR;
  }
}

ferry_status ferry__cu_error(CUresult r, const char *call, const char *file, int line, const char *fmt, ...) {
  if (ferry__fork_child) return ferry__fork_refuse(); /* the call was stopped by the fork guard (fork.c) */
  ferry_status status = status_of(r, call);
  const char *desc = NULL;
  size_t used = 0;
  record(status, (int)r, ferry__cu_name(r), call, file, line);
  if (fmt) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tls_error.message, sizeof tls_error.message, fmt, ap);
    va_end(ap);
    used = n < 0 ? 0 : ((size_t)n < sizeof tls_error.message - 1 ? (size_t)n : sizeof tls_error.message - 1);
  }
  if (ferry__drv.cuGetErrorString == NULL || ferry__drv.cuGetErrorString(r, &desc) != CUDA_SUCCESS || !desc)
    desc = "no description";
  snprintf(tls_error.message + used, sizeof tls_error.message - used, "%s%s failed with %s (%s)",
           used ? ": " : "", call, ferry__cu_name(r), desc);
  return status;
}
