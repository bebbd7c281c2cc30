/* stress.h — shared by ferry_stress's parts (stress.c: load and soak; fault_gpu.c: driver faults; fork_gpu.c:
 * fork): what they need from each other and the few driver entries they resolve themselves. */
#ifndef FERRY_STRESS_H
#define FERRY_STRESS_H

#include "gpu_test.h"

/* Device memory in use on the current context's device (total - free, cuMemGetInfo), or -1 when that entry is
 * not available (the simulated driver). Resolved from libcuda by the test itself: ferry's table does not carry it. */
long long stress_device_used(void);

/* ferry's per-device memory pool's bytes in use (CU_MEMPOOL_ATTR_USED_MEM_CURRENT); 0 before ferry has made the
 * pool (nothing of ferry's is on the device then), -1 when the driver cannot tell. */
long long stress_devmem_pool_used(int dev);

/* Nonzero when --simulate installed the simulated driver (tests/common/fake_driver.c) instead of libcuda. */
extern int stress_simulated;

/* The parts other than load and soak. Each prints its own table and returns the number of failures. */
int stress_faults(int dev, int verbose);
int stress_fault_case(int dev, const char *spec); /* one case in this process: "d2h:cuStreamCreate:1" */
int stress_fork(int dev);
int stress_fork_foreign(void); /* case 2 of the fork check, in a process of its own (--fork-foreign) */

#endif
