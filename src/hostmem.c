/* hostmem.c — how much host memory a new pinned region may take: the kernel's estimate of available memory
 * (MemAvailable) and, where this process sees a cgroup v2 memory limit at the root of its cgroup mount, what that
 * limit leaves. Pinning more than that fails with an error before the fault-in, which would otherwise wake the OOM
 * killer midway through a state dict. */
#include "internal.h"

#include <stdio.h>
#include <string.h>

const char *ferry__meminfo_path = "/proc/meminfo";
const char *ferry__cgroup_dir = "/sys/fs/cgroup";

/* The number in the file at dir/name; false when it is absent or says "max" (no limit). */
static bool read_limit(const char *dir, const char *name, uint64_t *out) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "r");
  if (!f) return false;
  unsigned long long v;
  bool ok = fscanf(f, "%llu", &v) == 1;
  fclose(f);
  if (ok) *out = (uint64_t)v;
  return ok;
}

uint64_t ferry__host_available(void) {
  uint64_t available = UINT64_MAX;
  FILE *f = fopen(ferry__meminfo_path, "r");
  if (f) {
    char line[160];
    unsigned long long kib;
    while (fgets(line, sizeof line, f))
      if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) {
        available = (uint64_t)kib << 10;
        break;
      }
    fclose(f);
  }
  uint64_t max, current;
  if (read_limit(ferry__cgroup_dir, "memory.max", &max) && read_limit(ferry__cgroup_dir, "memory.current", &current)) {
    uint64_t left = current < max ? max - current : 0;
    if (left < available) available = left;
  }
  return available;
}
