/* graph.c — CUDA graphs of operator runs: capture, instantiate, replay, and update a captured run's operands in
 * the instantiated graph without capturing again.
 *
 * Capture is the driver's own (the notebook's pattern: runs queued on a capturing stream become kernel nodes).
 * What ferry adds is the bookkeeping that makes updates possible: right after a run is captured, the capture's
 * current dependencies (cuStreamGetCaptureInfo) are exactly the node that run added, so ferry records it; an update
 * later rewrites that node's parameters in the executable graph (cuGraphExecKernelNodeSetParams).
 */
#include "ops.h"

#include <stdlib.h>
#include <string.h>

typedef struct graph_run {
  CUgraphNode node;      /* NULL for a run that launched nothing (an empty problem) */
  const ferry_op *op;
  ferry_artifact *art;   /* a reference */
  int device;
} graph_run;

struct ferry_graph {
  CUstream stream;
  CUcontext ctx;         /* the stream's context: current around every driver call on the graph */
  int capturing;
  CUgraph graph;
  CUgraphExec exec;
  graph_run *runs;
  size_t n_runs, cap_runs;
  /* A run that failed after its kernel was captured: the capture holds a node the graph keeps nothing for (no
   * artifact, no update), so it may never be instantiated. SIZE_MAX when none. */
  size_t broken_run;
};

/* Ends a capture and throws its graph away; the graph's context is current. Not capturing afterwards unless ending
 * failed (destroy then tries again). */
static CUresult discard_capture(ferry_graph *g) {
  CUgraph discarded = NULL;
  CUresult r = FERRY_CU(cuStreamEndCapture, g->stream, &discarded);
  if (discarded) (void)FERRY_CU(cuGraphDestroy, discarded);
  if (r == CUDA_SUCCESS) g->capturing = 0;
  return r;
}

static ferry_status enter(ferry_graph *g) {
  ferry_status st = FERRY_OK;
  FERRY_TRY_CU(("making the graph's context current"), cuCtxPushCurrent, g->ctx);
cleanup:
  return st;
}
static void leave(void) {
  CUcontext popped;
  (void)FERRY_CU(cuCtxPopCurrent, &popped);
}

ferry_status ferry_graph_begin(void *stream, ferry_graph **out) {
  ferry_status st = FERRY_OK;
  ferry_graph *g = NULL;
  int entered = 0;
  if (!out) return FERRY_ERR(FERRY_INVALID_ARGUMENT, "ferry_graph_begin: out is NULL");
  if (!stream)
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "ferry_graph_begin: capture needs a stream of your own; the legacy "
                     "default stream (NULL) cannot be captured");
  FERRY_TRY(ferry__driver_load());
  g = calloc(1, sizeof *g);
  if (!g) return FERRY_ERR(FERRY_OUT_OF_HOST_MEMORY, "allocating a graph");
  g->stream = (CUstream)stream;
  g->broken_run = SIZE_MAX;
  FERRY_TRY_CU(("finding the context of the stream to capture"), cuStreamGetCtx, g->stream, &g->ctx);
  FERRY_TRY(enter(g));
  entered = 1;
  FERRY_TRY_CU(("starting to capture a stream"), cuStreamBeginCapture, g->stream,
               CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
  g->capturing = 1;
  *out = g;
  g = NULL;
cleanup:
  if (entered) leave();
  free(g);
  return st;
}

ferry_status ferry_graph_run(ferry_graph *graph, const ferry_op *op, const ferry_gemm_args *args,
                             ferry_artifact *artifact, uint32_t flags, size_t *out_index) {
  ferry_status st = FERRY_OK;
  ferry_artifact *art = NULL;
  int entered = 0, launched = 0;
  if (!graph) return FERRY_ERR(FERRY_INVALID_ARGUMENT, "ferry_graph_run: graph is NULL");
  FERRY_TRY(ferry__check_op_args("ferry_graph_run", op, args));
  if (!graph->capturing)
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "ferry_graph_run: the graph is not capturing (ferry_graph_end was "
                     "called, or ferry_graph_begin failed)");
  if (graph->broken_run != SIZE_MAX)
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "ferry_graph_run: run %zu of this graph failed after its kernel was "
                     "captured; end (discarding the capture) and capture again", graph->broken_run);
  if (graph->n_runs == graph->cap_runs) {
    size_t cap = graph->cap_runs ? graph->cap_runs * 2 : 16;
    graph_run *grown = realloc(graph->runs, cap * sizeof *grown);
    if (!grown) return FERRY_ERR(FERRY_OUT_OF_HOST_MEMORY, "recording run %zu of a graph", graph->n_runs);
    graph->runs = grown;
    graph->cap_runs = cap;
  }
  FERRY_TRY(ferry__run_artifact(op, args, artifact, flags, &art));
  ferry__launch l;
  FERRY_TRY(ferry__launch_prepare(art, args, &l));
  graph_run run = {NULL, op, NULL, args->problem.device};
  if (l.grid_x) {
    CUstreamCaptureStatus status;
    cuuint64_t id;
    CUgraph captured;
    const CUgraphNode *deps = NULL;
    size_t n_deps = 0;
    CUgraphNodeType type;
    FERRY_TRY(ferry__launch_submit(&l, args->problem.device, graph->stream));
    launched = 1;
    FERRY_TRY(enter(graph));
    entered = 1;
    FERRY_TRY_CU(("recording run %zu of a graph", graph->n_runs), cuStreamGetCaptureInfo, graph->stream, &status,
                 &id, &captured, &deps, &n_deps);
    if (status != CU_STREAM_CAPTURE_STATUS_ACTIVE || n_deps != 1 || !deps) {
      st = FERRY_ERR(FERRY_INTERNAL, "run %zu of a graph: the capture is %s with %zu dependencies after the launch; "
                     "expected one kernel node", graph->n_runs,
                     status == CU_STREAM_CAPTURE_STATUS_ACTIVE ? "active" : "no longer active", n_deps);
      goto cleanup;
    }
    FERRY_TRY_CU(("recording run %zu of a graph", graph->n_runs), cuGraphNodeGetType, deps[0], &type);
    if (type != CU_GRAPH_NODE_TYPE_KERNEL) {
      st = FERRY_ERR(FERRY_INTERNAL, "run %zu of a graph: the captured node is of type %d, not a kernel",
                     graph->n_runs, (int)type);
      goto cleanup;
    }
    run.node = deps[0];
  }
  run.art = ferry_artifact_retain(art);
  graph->runs[graph->n_runs] = run;
  if (out_index) *out_index = graph->n_runs;
  graph->n_runs++;
cleanup:
  if (st != FERRY_OK && launched) graph->broken_run = graph->n_runs;
  if (entered) leave();
  return st;
}

ferry_status ferry_graph_end(ferry_graph *graph) {
  ferry_status st = FERRY_OK;
  int entered = 0;
  if (!graph) return FERRY_ERR(FERRY_INVALID_ARGUMENT, "ferry_graph_end: graph is NULL");
  if (!graph->capturing) return FERRY_ERR(FERRY_INVALID_ARGUMENT, "ferry_graph_end: the graph is not capturing");
  FERRY_TRY(enter(graph));
  entered = 1;
  if (graph->broken_run != SIZE_MAX) {
    CUresult r = discard_capture(graph);
    if (r != CUDA_SUCCESS)
      st = ferry__cu_error(r, "cuStreamEndCapture", __FILE__, __LINE__, "ending the capture of a graph whose run %zu "
                           "failed", graph->broken_run);
    else
      st = FERRY_ERR(FERRY_INVALID_ARGUMENT, "ferry_graph_end: run %zu failed after its kernel was captured, so the "
                     "graph would replay a run it keeps nothing for; the capture is discarded (capture again)",
                     graph->broken_run);
    goto cleanup;
  }
  /* If ending fails the graph stays "capturing", so that destroy tries again and the stream is not left
   * capturing. */
  FERRY_TRY_CU(("ending the capture of a graph of %zu runs", graph->n_runs), cuStreamEndCapture, graph->stream,
               &graph->graph);
  graph->capturing = 0;
  FERRY_TRY_CU(("instantiating a graph of %zu runs", graph->n_runs), cuGraphInstantiateWithFlags, &graph->exec,
               graph->graph, 0);
cleanup:
  if (entered) leave();
  return st;
}

ferry_status ferry_graph_replay(ferry_graph *graph, void *stream) {
  ferry_status st = FERRY_OK;
  if (!graph || !graph->exec)
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "ferry_graph_replay: %s", graph ? "the graph is not instantiated "
                     "(call ferry_graph_end)" : "graph is NULL");
  FERRY_TRY(enter(graph));
  CUresult r = FERRY_CU(cuGraphLaunch, graph->exec, stream ? (CUstream)stream : graph->stream);
  leave();
  if (r != CUDA_SUCCESS) st = ferry__cu_error(r, "cuGraphLaunch", __FILE__, __LINE__, "replaying a graph of %zu runs",
                                               graph->n_runs);
cleanup:
  return st;
}

ferry_status ferry_graph_update(ferry_graph *graph, size_t index, const ferry_gemm_args *args) {
  ferry_status st = FERRY_OK;
  int entered = 0;
  if (!graph || !graph->exec)
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "ferry_graph_update: %s", graph ? "the graph is not instantiated "
                     "(call ferry_graph_end)" : "graph is NULL");
  if (index >= graph->n_runs)
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "ferry_graph_update: run %zu does not exist (the graph has %zu)", index,
                     graph->n_runs);
  graph_run *run = &graph->runs[index];
  FERRY_TRY(ferry__check_op_args("ferry_graph_update", run->op, args));
  if (!run->node)
    return FERRY_ERR(FERRY_UNSUPPORTED, "run %zu was captured empty (no kernel node); capture it again", index);
  if (args->problem.device != run->device)
    return FERRY_ERR(FERRY_DEVICE_MISMATCH, "run %zu was captured on cuda:%d; the new operands are on cuda:%d", index,
                     run->device, args->problem.device);
  ferry_artifact *art = NULL;
  FERRY_TRY(ferry__run_artifact(run->op, args, run->art, 0, &art));
  ferry__launch l;
  FERRY_TRY(ferry__launch_prepare(art, args, &l));
  if (!l.grid_x)
    return FERRY_ERR(FERRY_UNSUPPORTED, "run %zu: the new problem is empty; a kernel node cannot launch nothing",
                     index);
  CUDA_KERNEL_NODE_PARAMS p;
  memset(&p, 0, sizeof p);
  p.func = l.fn;
  p.gridDimX = l.grid_x;
  p.gridDimY = 1;
  p.gridDimZ = l.grid_z;
  p.blockDimX = l.threads;
  p.blockDimY = 1;
  p.blockDimZ = 1;
  p.sharedMemBytes = l.smem;
  p.kernelParams = l.param_ptrs; /* the driver copies the values now; the stack may go */
  FERRY_TRY(enter(graph));
  entered = 1;
  FERRY_TRY_CU(("updating run %zu of a graph", index), cuGraphExecKernelNodeSetParams, graph->exec, run->node, &p);
cleanup:
  if (entered) leave();
  return st;
}

size_t ferry_graph_run_count(const ferry_graph *graph) { return graph ? graph->n_runs : 0; }

void ferry_graph_destroy(ferry_graph *graph) {
  if (!graph) return;
  int entered = enter(graph) == FERRY_OK;
  if (graph->capturing) (void)discard_capture(graph);
  if (graph->exec) (void)FERRY_CU(cuGraphExecDestroy, graph->exec);
  if (graph->graph) (void)FERRY_CU(cuGraphDestroy, graph->graph);
  if (entered) leave();
  for (size_t i = 0; i < graph->n_runs; i++) ferry_artifact_release(graph->runs[i].art);
  free(graph->runs);
  free(graph);
}

CUgraphExec ferry__test_graph_exec(const ferry_graph *graph) { return graph ? graph->exec : NULL; }
