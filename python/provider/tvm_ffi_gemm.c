/* tvm_ffi_gemm.c — ferry's GEMM operators through Apache TVM-FFI's stable C ABI (libferry_tvm_ffi.so).
 *
 * Exports `__tvm_ffi_gemm`, a TVM-FFI safe call: gemm(A, B, out) computes out = A @ B with the best ferry operator
 * for the problem, on the stream TVM-FFI's environment holds for the operands' device (TVMFFIEnvGetStream: from
 * Python, tvm_ffi sets it to torch's current stream when torch tensors are passed; a C or C++ host sets it
 * itself, else the legacy default stream is used). Operands are TVM-FFI tensors or DLTensor pointers with the
 * layouts ferry_gemm_args_init accepts; the product accumulates in fp32. Errors are raised through
 * TVMFFIErrorSetRaisedFromCStr ("ValueError" for bad operands, "RuntimeError" otherwise) and the call returns -1.
 *
 * The operator chosen for a problem (shapes, strides, types, alignment, device) is remembered in a small table,
 * and each thread keeps the last problem it ran with the operands' layouts it was read from: a call whose three
 * layouts equal those (the Launcher's rule: a few integer compares) and whose pointers are aligned alike skips
 * validation and the table and costs ferry_op_run, which takes the compiled kernel from ferry's memo
 * (NVRTC runs once per kind, never per call). Anything else is validated in full. This library carries its own
 * copy of libferry: its memo, pool and caches are not those of the ferry Python extension in the same process.
 */
#include <dlpack/dlpack.h>
#include <tvm/ffi/c_api.h>
#include <tvm/ffi/extra/c_env_api.h>

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "ferry.h"
#include "ferry/ops.h"

#define EXPORT __attribute__((visibility("default")))
enum { REMEMBERED = 16 }; /* problems whose operator is remembered; the oldest is forgotten first */

typedef struct remembered {
  ferry_gemm_problem problem; /* zero-padded (the args it came from were zeroed before ferry_gemm_args_init) */
  const ferry_op *op;         /* NULL: the slot is empty */
} remembered;

static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static remembered table[REMEMBERED];
static unsigned next_slot;

/* One operand's layout as the last call on this thread read it; ranks above 3 never get here (args_init refuses). */
typedef struct layout {
  int32_t ndim, device_type, device_id;
  DLDataType dtype;
  int64_t shape[3], strides[3];
} layout;

/* This thread's last validated problem: ops are static, so `op` needs no reference. */
static __thread struct {
  const ferry_op *op; /* NULL: nothing remembered yet */
  layout operands[3];
  ferry_gemm_args args;
} last;

/* The layout of `t`, strides made explicit (a NULL strides array is compact row-major). */
static layout layout_of(const DLTensor *t) {
  layout l = {t->ndim, (int32_t)t->device.device_type, t->device.device_id, t->dtype, {0}, {0}};
  int64_t compact = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    l.shape[d] = t->shape[d];
    l.strides[d] = t->strides ? t->strides[d] : compact;
    compact *= t->shape[d];
  }
  return l;
}

static inline bool same_layout(const layout *l, const DLTensor *t) {
  if (t->ndim != l->ndim || (int32_t)t->device.device_type != l->device_type || t->device.device_id != l->device_id ||
      t->dtype.code != l->dtype.code || t->dtype.bits != l->dtype.bits || t->dtype.lanes != l->dtype.lanes)
    return false;
  int64_t compact = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    if (t->shape[d] != l->shape[d] || (t->strides ? t->strides[d] : compact) != l->strides[d]) return false;
    compact *= t->shape[d];
  }
  return true;
}

/* The last problem again with new pointers, when the layouts match and the pointers have the same alignments (so
 * that it is the same problem the table holds, and the same operator is the best). A NULL data pointer goes to the
 * full check, which refuses it for a tensor with elements (set_data would keep the last call's pointer). */
static bool repeat_last(const DLTensor *a, const DLTensor *b, const DLTensor *out, ferry_gemm_args *run) {
  if (!last.op || !a->data || !b->data || !out->data || !same_layout(&last.operands[0], a) ||
      !same_layout(&last.operands[1], b) || !same_layout(&last.operands[2], out))
    return false;
  *run = last.args;
  /* An out that overlaps A or B is refused here: the full check then says so. */
  if (ferry_gemm_args_set_data(run, (char *)a->data + a->byte_offset, (char *)b->data + b->byte_offset,
                               (char *)out->data + out->byte_offset) != FERRY_OK)
    return false;
  const ferry_gemm_problem *p = &run->problem, *q = &last.args.problem;
  return p->a_align == q->a_align && p->b_align == q->b_align && p->out_align == q->out_align;
}

static void remember_last(const DLTensor *a, const DLTensor *b, const DLTensor *out, const ferry_gemm_args *args,
                          const ferry_op *op) {
  last.operands[0] = layout_of(a);
  last.operands[1] = layout_of(b);
  last.operands[2] = layout_of(out);
  last.args = *args;
  last.op = op;
}

static int raise_error(const char *kind, const char *message) {
  TVMFFIErrorSetRaisedFromCStr(kind, message);
  return -1;
}

/* ferry's last error as a TVM-FFI error of the kind that fits its status. */
static int raise_ferry(ferry_status st, const char *doing) {
  char message[1024];
  snprintf(message, sizeof message, "ferry gemm: %s: %s", doing, ferry_last_error_message());
  bool bad_operand = st == FERRY_INVALID_ARGUMENT || st == FERRY_DEVICE_MISMATCH || st == FERRY_OVERFLOW ||
                     st == FERRY_UNSUPPORTED;
  return raise_error(bad_operand ? "ValueError" : "RuntimeError", message);
}

/* The DLTensor an argument holds, or NULL with a TVM-FFI error raised. */
static const DLTensor *tensor_arg(const TVMFFIAny *arg, const char *name) {
  if (arg->type_index == kTVMFFITensor)
    return (const DLTensor *)((const char *)arg->v_obj + sizeof(TVMFFIObject));
  if (arg->type_index == kTVMFFIDLTensorPtr && arg->v_ptr) return arg->v_ptr;
  char message[160];
  snprintf(message, sizeof message, "ferry gemm: %s must be a tensor (TVM-FFI type index %d or %d), got type index %d",
           name, (int)kTVMFFITensor, (int)kTVMFFIDLTensorPtr, (int)arg->type_index);
  raise_error("TypeError", message);
  return NULL;
}

/* DLTensor and ferry_tensor hold the same fields; ferry reads its own struct. */
static ferry_tensor as_ferry(const DLTensor *t) {
  return (ferry_tensor){t->data,    {(int32_t)t->device.device_type, t->device.device_id},
                        t->ndim,    {t->dtype.code, t->dtype.bits, t->dtype.lanes},
                        t->shape,   t->strides,
                        t->byte_offset};
}

/* The operator for this problem: remembered, else the best ferry_ops_find returns (then remembered). */
static ferry_status operator_for(const ferry_gemm_args *args, const ferry_op **out) {
  pthread_mutex_lock(&table_lock);
  for (unsigned i = 0; i < REMEMBERED; i++)
    if (table[i].op && !memcmp(&table[i].problem, &args->problem, sizeof args->problem)) {
      *out = table[i].op;
      pthread_mutex_unlock(&table_lock);
      return FERRY_OK;
    }
  pthread_mutex_unlock(&table_lock);
  size_t found = 0;
  const ferry_op *best = NULL;
  ferry_status st = ferry_ops_find(args, 0, NULL, NULL, &best, 1, &found);
  if (st != FERRY_OK) return st;
  if (found == 0) return FERRY_UNSUPPORTED; /* the caller says so, with the problem's sizes */
  pthread_mutex_lock(&table_lock);
  table[next_slot % REMEMBERED] = (remembered){args->problem, best};
  next_slot++;
  pthread_mutex_unlock(&table_lock);
  *out = best;
  return FERRY_OK;
}

EXPORT int __tvm_ffi_gemm(void *self, const TVMFFIAny *args, int32_t num_args, TVMFFIAny *result) {
  (void)self;
  if (num_args != 3) {
    char message[96];
    snprintf(message, sizeof message, "ferry gemm: expected 3 arguments (A, B, out), got %d", (int)num_args);
    return raise_error("TypeError", message);
  }
  const DLTensor *a = tensor_arg(&args[0], "A"), *b = a ? tensor_arg(&args[1], "B") : NULL;
  const DLTensor *out = b ? tensor_arg(&args[2], "out") : NULL;
  if (!out) return -1;
  ferry_gemm_args gemm;
  const ferry_op *op = last.op;
  ferry_status st;
  if (!repeat_last(a, b, out, &gemm)) {
    ferry_tensor fa = as_ferry(a), fb = as_ferry(b), fo = as_ferry(out);
    memset(&gemm, 0, sizeof gemm); /* so that problems compare with memcmp, padding included */
    st = ferry_gemm_args_init(&gemm, &fa, &fb, &fo, FERRY_SCALAR_F32);
    if (st != FERRY_OK) return raise_ferry(st, "checking the operands");
    st = operator_for(&gemm, &op);
    if (st == FERRY_UNSUPPORTED) {
      char message[200];
      snprintf(message, sizeof message,
               "ferry gemm: no ferry operator supports this problem (%d x %d x %d, batch %d)", gemm.problem.m,
               gemm.problem.n, gemm.problem.k, gemm.problem.l);
      return raise_error("ValueError", message);
    }
    if (st != FERRY_OK) return raise_ferry(st, "finding an operator");
    remember_last(a, b, out, &gemm, op);
  }
  void *stream = TVMFFIEnvGetStream(kDLCUDA, gemm.problem.device);
  st = ferry_op_run(op, &gemm, stream, NULL, FERRY_RUN_ASSUME_SUPPORTED);
  if (st != FERRY_OK) return raise_ferry(st, "running the operator");
  result->type_index = kTVMFFINone;
  result->v_int64 = 0;
  return 0;
}
