/* fake_driver.h — a simulated one-device CUDA driver for CPU tests (see fake_driver.c). */
#ifndef FERRY_FAKE_DRIVER_H
#define FERRY_FAKE_DRIVER_H
#include "ferry/ops.h"
#include "internal.h"
void fake_driver_use(void);
extern _Atomic int fake_live_events, fake_live_streams, fake_live_devmem, fake_registered;
/* Copy calls (cuMemcpyAsync, cuMemcpyHtoDAsync, cuMemcpyBatchAsync) and successful cuMemHostRegister calls so far;
 * for the first FAKE_REGISTER_LOG registrations, how many copy calls had been made before each. */
#define FAKE_REGISTER_LOG 64
extern _Atomic int fake_copy_calls, fake_register_calls;
extern int fake_copies_before_register[FAKE_REGISTER_LOG];
/* While positive, each cuEventQuery decrements it and answers CUDA_ERROR_NOT_READY (the copies "still run"). */
extern _Atomic int fake_queries_not_ready;
/* Operator runtime (see the end of fake_driver.c): live libraries, graphs and instances; launches of GEMM kernels
 * are recorded, not run. */
#define FAKE_MAX_NODES 64
typedef struct fake_launch_record {
  unsigned grid_x, grid_z, block, smem;
  unsigned char params[FERRY_OP_PARAMS_MAX];
} fake_launch_record;
extern _Atomic int fake_live_libraries, fake_live_graphs, fake_live_execs, fake_launches, fake_replays;
extern fake_launch_record fake_last_launch;
extern int fake_kernel_registers; /* CU_FUNC_ATTRIBUTE_NUM_REGS of every fake kernel (168) */
const fake_launch_record *fake_exec_node(void *exec, int index);
#endif
