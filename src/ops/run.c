/* run.c — the launch path: fill the kernel's parameter on the stack, compute the grid, one cuLaunchKernel.
 *
 * Everything that can be decided once was decided before: the arguments were validated into a descriptor, the
 * artifact holds its function per device and its launch layout. What remains per call is a support check (a few
 * compares, skippable), a memo lookup when no artifact is given, a ~100-byte copy, two divisions, a check of the
 * current context (a thread-local read in the driver) and the launch. Nothing allocates, formats or locks unless
 * it fails or runs for the first time on a device.
 */
#include "ops.h"

#include <string.h>

/* Cold: reasons are formatted only here. */
static ferry_status __attribute__((noinline, cold)) unsupported(const ferry_op *op, const ferry_gemm_args *args) {
  char why[256];
  ferry__supports_reason(op, args, why, sizeof why);
  return FERRY_ERR(FERRY_UNSUPPORTED, "operator %s does not support these arguments: %s", op->info.name, why);
}

static ferry_status __attribute__((noinline, cold)) wrong_artifact(const ferry_op *op, const ferry_gemm_args *args,
                                                                 const ferry_artifact *art, int dev_sm) {
  if (art->op != op)
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "the artifact is of operator %s, the run asks for %s",
                     art->op->info.name, op->info.name);
  if (art->kind != args->problem.kind)
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "the artifact of operator %s was compiled for problem kind 0x%05x "
                     "(types, majors, epilogue, scales); these arguments are of kind 0x%05x: compile for them",
                     op->info.name, art->kind, args->problem.kind);
  return FERRY_ERR(FERRY_INVALID_ARGUMENT, "the artifact of operator %s was compiled for sm_%d; cuda:%d is sm_%d",
                   op->info.name, art->sm, args->problem.device, dev_sm);
}

/* The memo's artifact for the device's capability, compiled on first need. */
static ferry_status __attribute__((noinline)) memo_artifact(const ferry_op *op, const ferry_gemm_args *args,
                                                          ferry_artifact **out) {
  ferry_status st = FERRY_OK;
  int sm = 0;
  ferry_artifact *art = NULL;
  FERRY_TRY(ferry__driver_load());
  FERRY_TRY(ferry__device_sm(args->problem.device, &sm));
  *out = ferry__memo_lookup(op, args->problem.kind, sm);
  if (*out) return FERRY_OK;
  /* First run of this kind on this chip: compile (or read the cache) once; the memo keeps a reference. */
  FERRY_TRY(ferry_op_compile_for(op, args, sm, &art));
  *out = ferry__memo_lookup(op, args->problem.kind, sm);
  if (!*out)
    st = FERRY_ERR(FERRY_INTERNAL, "operator %s: the memo is full; pass an artifact to ferry_op_run", op->info.name);
  ferry_artifact_release(art);
cleanup:
  return st;
}

ferry_status ferry__run_artifact(const ferry_op *op, const ferry_gemm_args *args, ferry_artifact *art,
                                 uint32_t flags, ferry_artifact **out) {
  const ferry_gemm_problem *p = &args->problem;
  if (!(flags & FERRY_RUN_ASSUME_SUPPORTED) && !ferry__supports_fast(op, args)) return unsupported(op, args);
  if (!art) {
    /* The device's capability is cached after the first call: a load of a global and a table probe. */
    int sm = ferry__device_sm_cache[p->device];
    art = sm ? ferry__memo_lookup(op, p->kind, sm) : NULL;
    if (!art) {
      ferry_status st = memo_artifact(op, args, &art);
      if (st != FERRY_OK) return st;
    }
  } else if (!(flags & FERRY_RUN_ASSUME_SUPPORTED)) {
    int sm = ferry__device_sm_cache[p->device];
    if (art->op != op || art->kind != p->kind || (sm && art->sm / 10 != sm / 10))
      return wrong_artifact(op, args, art, sm);
  }
  *out = art;
  return FERRY_OK;
}

ferry_status ferry__launch_prepare(ferry_artifact *art, const ferry_gemm_args *args, ferry__launch *l) {
  const ferry_gemm_problem *p = &args->problem;
  const ferry_op *op = art->op;
  if (p->m == 0 || p->n == 0 || p->l == 0) {
    l->grid_x = 0;
    return FERRY_OK;
  }
  CUfunction f = atomic_load_explicit(&art->fn[p->device], memory_order_acquire);
  if (__builtin_expect(!f, 0)) {
    ferry_status st = ferry__artifact_function(art, p->device, &f);
    if (st != FERRY_OK) return st;
  }
  l->fn = f;
  l->grid_x = ((uint32_t)p->m + art->tile_m - 1) / art->tile_m * (((uint32_t)p->n + art->tile_n - 1) / art->tile_n);
  l->grid_z = (unsigned)p->l;
  if (art->persistent) {
    /* at most a block per multiprocessor, each looping over the tiles of every batch (read once per device) */
    int sms = ferry__device_sms_cache[p->device];
    if (__builtin_expect(!sms, 0)) {
      ferry_status st = ferry__device_sms(p->device, &sms);
      if (st != FERRY_OK) return st;
    }
    uint64_t tiles = (uint64_t)l->grid_x * (uint64_t)p->l;
    l->grid_x = tiles < (uint64_t)sms ? (unsigned)tiles : (unsigned)sms;
    l->grid_z = 1;
    if (art->cluster > 1) { /* whole clusters, each taking tiles of `cluster` tiles along m, as many as fit */
      const uint32_t cluster_m = art->tile_m * (uint32_t)art->cluster;
      const uint64_t cluster_tiles = (uint64_t)(((uint32_t)p->m + cluster_m - 1) / cluster_m) *
                                     (((uint32_t)p->n + art->tile_n - 1) / art->tile_n) * (uint64_t)p->l;
      const uint64_t fit = (uint64_t)art->max_clusters[p->device];
      l->grid_x = (unsigned)(cluster_tiles < fit ? cluster_tiles : fit) * (unsigned)art->cluster;
    }
  }
  l->threads = art->threads;
  l->smem = art->smem;
  l->param_ptrs[0] = l->params;
  l->param_ptrs[1] = l->maps;
  if (art->tma) {
    ferry_status st = ferry__tma_encode(art, args, l->maps);
    if (st != FERRY_OK) return st;
  }
  if (op->params) {
    op->params(args, l->params, op->user);
  } else {
    ferry_gemm_params *k = (ferry_gemm_params *)(void *)l->params;
    k->a = args->a;
    k->b = args->b;
    k->out = args->out;
    k->lda = p->lda;
    k->ldb = p->ldb;
    k->ldc = p->ldc;
    k->batch_a = p->batch_a;
    k->batch_b = p->batch_b;
    k->batch_c = p->batch_c;
    k->m = p->m;
    k->n = p->n;
    k->k = p->k;
    k->l = p->l;
    k->alpha = args->alpha;
    k->beta = args->beta;
    k->kind = p->kind;
    k->reserved = 0;
    k->bias = args->bias;
    k->scale_a = args->scale_a;
    k->scale_b = args->scale_b;
  }
  return FERRY_OK;
}

ferry_status ferry__launch_submit(const ferry__launch *l, int device, CUstream stream) {
  ferry_status st = FERRY_OK;
  CUcontext current = NULL, mine = ferry__device_ctx(device);
  int pushed = 0;
  /* The function belongs to the device's primary context (the one PyTorch and the runtime use): launch with it
   * current. Usually it already is, and checking costs a thread-local read in the driver. */
  FERRY_TRY_CU(("launching on cuda:%d", device), cuCtxGetCurrent, &current);
  if (current != mine) {
    FERRY_TRY_CU(("making cuda:%d current for a launch", device), cuCtxPushCurrent, mine);
    pushed = 1;
  }
  FERRY_TRY_CU(("launching %u×%u blocks of %u threads (%u bytes of shared memory) on cuda:%d", l->grid_x, l->grid_z,
                l->threads, l->smem, device),
               cuLaunchKernel, l->fn, l->grid_x, 1, l->grid_z, l->threads, 1, 1, l->smem, stream,
               (void **)l->param_ptrs, NULL);
cleanup:
  if (pushed) {
    CUcontext popped;
    (void)FERRY_CU(cuCtxPopCurrent, &popped);
  }
  return st;
}

ferry_status ferry_op_run(const ferry_op *op, const ferry_gemm_args *args, void *stream, ferry_artifact *artifact,
                          uint32_t flags) {
  ferry_status st;
  if (__builtin_expect(!op || !args || args->struct_size != sizeof *args, 0))
    return ferry__check_op_args("ferry_op_run", op, args);
  if (!(flags & FERRY_RUN_ASSUME_SUPPORTED) || !artifact) {
    st = ferry__run_artifact(op, args, artifact, flags, &artifact);
    if (st != FERRY_OK) return st;
  }
  ferry__launch l;
  st = ferry__launch_prepare(artifact, args, &l);
  if (st != FERRY_OK || l.grid_x == 0) return st;
  return ferry__launch_submit(&l, args->problem.device, (CUstream)stream);
}
