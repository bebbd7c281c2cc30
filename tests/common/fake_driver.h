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
/* What the fake cuTensorMapEncodeTiled writes into a CUtensorMap (128 bytes): its arguments, checked as the
 * driver documents (16-byte address and strides, boxes of at most 256 rows and 128 swizzled bytes). */
typedef struct fake_tensor_map {
  unsigned long long address, dims[3], strides[2];
  unsigned box[3], data_type, rank, swizzle;
  unsigned char rest[128 - 6 * 8 - 6 * 4];
} fake_tensor_map;
extern int fake_tensor_maps_encoded;
typedef struct fake_launch_record {
  unsigned grid_x, grid_z, block, smem;
  unsigned char params[FERRY_OP_PARAMS_MAX];
  fake_tensor_map maps[2]; /* a TMA kernel's second parameter, as the fake cuTensorMapEncodeTiled wrote it */
} fake_launch_record;
extern _Atomic int fake_live_libraries, fake_live_graphs, fake_live_execs, fake_launches, fake_replays;
extern fake_launch_record fake_last_launch;
extern int fake_kernel_registers; /* CU_FUNC_ATTRIBUTE_NUM_REGS of every fake kernel (168) */
extern int fake_max_clusters;     /* what cuOccupancyMaxActiveClusters answers for every kernel (60) */
const fake_launch_record *fake_exec_node(void *exec, int index);
#endif
