/* fault_ops.h — `ferry_test_ops_gpu every_failing_runtime_call_is_clean`: fault injection on the operator runtime's
 * driver and NVRTC calls, against the real driver (or, with --simulate, the CPU tests' simulated one). fault_ops_gpu.c runs the matrix of
 * (path, call, use) cases; fault_ops_rig.c is its harness: problems with exact results, device memory and contexts
 * past the fault seam, the census of driver objects, and the simulated driver's GEMMs. */
#ifndef FERRY_FAULT_OPS_H
#define FERRY_FAULT_OPS_H

#include "ops.h"

/* The entry from test_ops_gpu.c's test and its --fault-case mode. `fault_case` NULL runs the whole matrix; otherwise it names one case
 * ("fresh:f32:cuDeviceGet:2") to run in this process, which the matrix spawned for it. `simulate` installs the
 * simulated driver first. Returns the exit status: 0 every case passed, 1 one failed, 2 the harness could not run,
 * 3 (one case only) the call was not made that many times. */
int ops_faults_main(const char *fault_case, int simulate);

/* ---- the harness (fault_ops_rig.c) --------------------------------------------------------------------------- */

/* Every problem is out = A·B with A PROBLEM_M×PROBLEM_K and B PROBLEM_K×PROBLEM_N, row-major, fp32 output. */
enum { PROBLEM_M = 64, PROBLEM_N = 48, PROBLEM_K = 40 };

/* One row-major matrix: its values (exact in its type), its device buffer and its tensor. */
typedef struct operand {
  int type; /* FERRY_SCALAR_F32 or FERRY_SCALAR_F16 */
  int rows, cols;
  float *val;
  CUdeviceptr dev;
  int64_t shape[2], strides[2];
  ferry_tensor t;
} operand;

typedef struct problem {
  operand a, b, out;
  float ref[PROBLEM_M * PROBLEM_N]; /* the exact result */
  ferry_gemm_args args;
} problem;

/* What the harness holds: the device (read directly, not through ferry), the primary context it pushes around its
 * own driver calls, and the stream every operation runs on. */
typedef struct rig {
  int dev, sm, simulated;
  char device_name[128];
  CUcontext ctx;
  CUstream stream;
} rig;

extern rig the_rig;

/* Loads the driver (the simulated one when `simulated`), installs the census and takes the context and the
 * stream without any of ferry's one-time device work (capability read, context retain), which stays on ferry's
 * path for the fresh-process cases. Returns 0 (after saying why) when there is no device. */
int rig_open(int simulated);
void rig_close(void);

/* Pushes / pops the harness's context around its own driver calls: the operations under test run with no context
 * current, so that ferry has to make its own current every time. */
void rig_enter(void);
void rig_leave(void);

/* Pops every context left current on this thread and returns how many there were. */
int rig_pop_leftovers(void);

/* 1 when the stream is not capturing; else ends and discards the capture (so the harness can go on) and returns 0. */
int rig_stream_not_capturing(void);

/* Waits for the stream (the harness's context current). */
void rig_sync(void);

/* A problem of `in_type` operands with values drawn from `seed`, and its operands' device buffers. */
void problem_make(problem *p, int in_type, uint32_t seed);
void problem_free(problem *p);

/* Fills the output buffer with the sentinel: all bits set, a NaN no kernel computes from these operands. */
void problem_poison(problem *p);

/* Reads the output back (after rig_sync): how many of its elements still hold the sentinel and how many equal the
 * reference bit for bit. */
void problem_output(const problem *p, int *sentinel, int *exact);

/* The driver objects alive, as counted by the census (wrappers of the table's create and destroy entries). */
#define CENSUS_MAP(X) X(libraries) X(graphs) X(graph_execs) X(streams) X(events) X(pinned_ranges) X(device_allocations)
typedef struct census {
#define CENSUS_FIELD_GEN(name) int name;
  CENSUS_MAP(CENSUS_FIELD_GEN)
#undef CENSUS_FIELD_GEN
} census;

void census_now(census *out);

/* 1 when `after` equals `before`; else writes the first difference into `why` and returns 0. */
int census_same(const census *before, const census *after, char *why, size_t why_size);

#endif
