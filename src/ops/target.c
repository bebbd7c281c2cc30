/* target.c — which chip to compile for: FERRY_ARCH when set (so a machine without a GPU can build artifacts, as
 * CUTLASS's CUTE_DSL_ARCH allows), else the device's compute capability, read once per device.
 */
#include "ops.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Atomic int ferry__device_sm_cache[FERRY_MAX_DEVICES];
_Atomic int ferry__device_sms_cache[FERRY_MAX_DEVICES];

int ferry__parse_arch(const char *s) {
  if (!strncmp(s, "sm_", 3)) s += 3;
  else if (!strncmp(s, "compute_", 8)) s += 8;
  int major = 0, minor = 0, digits = 0;
  /* "M.m" with a one- or two-digit major: "9.0" and "10.0", "12.0" (sm_100, sm_120) alike */
  int dot = isdigit((unsigned char)s[0]) ? (isdigit((unsigned char)s[1]) ? 2 : 1) : 0;
  if (dot && s[dot] == '.' && isdigit((unsigned char)s[dot + 1])) {
    major = dot == 2 ? (s[0] - '0') * 10 + (s[1] - '0') : s[0] - '0';
    minor = s[dot + 1] - '0';
    s += dot + 2;
  } else {
    int v = 0;
    while (isdigit((unsigned char)*s) && digits < 4) v = v * 10 + (*s++ - '0'), digits++;
    if (digits < 2 || digits > 3) return 0;
    major = v / 10;
    minor = v % 10;
  }
  if (*s == 'a' || *s == 'f') s++; /* arch- and family-specific variants name the same chip */
  if (*s != '\0' || major < 1) return 0;
  return major * 10 + minor;
}

int ferry__driver_quiet(void) {
  ferry_error saved = *ferry_last_error();
  if (ferry__driver_load() == FERRY_OK) return 1;
  /* The library's own probe for a device must not overwrite an error the caller is still reading. */
  ferry__error_restore(&saved);
  return 0;
}

/* Attribute `attr` of `device`; `what` names it in an error. */
static ferry_status read_attribute(int device, CUdevice_attribute attr, const char *what, int *out) {
  ferry_status st = FERRY_OK;
  CUdevice dev;
  FERRY_TRY_CU(("reading the %s of cuda:%d", what, device), cuDeviceGet, &dev, device);
  FERRY_TRY_CU(("reading the %s of cuda:%d", what, device), cuDeviceGetAttribute, out, attr, dev);
cleanup:
  return st;
}

/* A per-device cache's value (0: not read yet), and its filling; devices past the table are not cached. */
static int cached(const _Atomic int *cache, int device) {
  return device >= 0 && device < FERRY_MAX_DEVICES ? cache[device] : 0;
}
static void cache_put(_Atomic int *cache, int device, int value) {
  if (device >= 0 && device < FERRY_MAX_DEVICES) cache[device] = value;
}

ferry_status ferry__device_sm(int device, int *out_sm) {
  ferry_status st = FERRY_OK;
  int sm = cached(ferry__device_sm_cache, device), major = 0, minor = 0;
  if (!sm) {
    FERRY_TRY(read_attribute(device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, "compute capability", &major));
    FERRY_TRY(read_attribute(device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, "compute capability", &minor));
    sm = major * 10 + minor;
    cache_put(ferry__device_sm_cache, device, sm);
  }
  *out_sm = sm;
cleanup:
  return st;
}

ferry_status ferry__device_sms(int device, int *out_sms) {
  ferry_status st = FERRY_OK;
  int sms = cached(ferry__device_sms_cache, device);
  if (!sms) {
    FERRY_TRY(read_attribute(device, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, "multiprocessor count", &sms));
    if (sms < 1) return FERRY_ERR(FERRY_INTERNAL, "cuda:%d reports %d multiprocessors", device, sms);
    cache_put(ferry__device_sms_cache, device, sms);
  }
  *out_sms = sms;
cleanup:
  return st;
}

ferry_status ferry_target_sm(int device, int *out_sm) {
  ferry_status st = FERRY_OK;
  if (!out_sm) return FERRY_ERR(FERRY_INVALID_ARGUMENT, "ferry_target_sm: out_sm is NULL");
  const char *env = getenv("FERRY_ARCH");
  if (env && *env) {
    int sm = ferry__parse_arch(env);
    if (!sm)
      return FERRY_ERR(FERRY_INVALID_ARGUMENT, "FERRY_ARCH=\"%s\" is not a target; write it as sm_90, 90 or 9.0",
                       env);
    *out_sm = sm;
    return FERRY_OK;
  }
  int d;
  FERRY_TRY(ferry_device_resolve(device, &d));
  FERRY_TRY(ferry__device_sm(d, out_sm));
cleanup:
  return st;
}

ferry_status ferry_target_supports(int min_sm, char *reason, size_t reason_size) {
  char why[300];
  int sm = 0;
  ferry_status st = ferry_target_sm(-1, &sm);
  if (st != FERRY_OK) {
    snprintf(why, sizeof why, "no target: %s (set FERRY_ARCH, e.g. sm_90, to compile without a GPU)",
             ferry_last_error_message());
  } else if (sm < min_sm) {
    const char *env = getenv("FERRY_ARCH");
    if (env && *env) {
      snprintf(why, sizeof why, "this needs sm_%d or newer; FERRY_ARCH=%s is sm_%d", min_sm, env, sm);
    } else {
      ferry_device_info info;
      int have = ferry_device_info_get(-1, &info) == FERRY_OK;
      snprintf(why, sizeof why, "this needs sm_%d or newer; cuda:%d (%.100s) is sm_%d", min_sm, have ? info.ordinal : 0,
               have ? info.name : "?", sm);
    }
    st = FERRY_UNSUPPORTED;
  } else {
    if (reason && reason_size) reason[0] = '\0';
    return FERRY_OK;
  }
  if (reason && reason_size) snprintf(reason, reason_size, "%s", why);
  return FERRY_ERR(FERRY_UNSUPPORTED, "%s", why);
}
