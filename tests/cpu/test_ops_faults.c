/* Fault injection on the operator paths: every driver and NVRTC call of compile, load, run and graphs is made to
 * fail in turn. Each failure must be reported with the call's name (in the record and in the message), leak no
 * library, graph or instance, and leave the runtime working for the next call. */
#include "test_ops.h"

static void expect_fault_reported(const char *call, ferry_status st) {
  if (st == FERRY_OK) FAIL_AT("a failing %s was not reported", call);
  ASSERT_STR_CONTAINS(ferry_last_error()->call, call);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), call);
}

TEST(fault_at_every_compile_call_is_clean) {
  if (!test_have_nvrtc()) return;
  static const char *calls[] = {"nvrtcCreateProgram", "nvrtcCompileProgram", "nvrtcGetCUBINSize", "nvrtcGetCUBIN",
                                "cuLibraryLoadData", "cuLibraryGetKernel"};
  char home[300];
  test_cache_home(home, sizeof home, "fault-compile");
  setenv("FERRY_DISK_CACHE", "0", 1); /* every compile goes to NVRTC */
  unsetenv("FERRY_ARCH");
  fake_driver_use();
  const ferry_op *op = tiny_op("tiny_fault_compile");
  ferry_gemm_args args;
  test_args(&args, FERRY_SCALAR_F32, FERRY_SCALAR_F32, 8, 8, 8);
  for (size_t c = 0; c < sizeof calls / sizeof calls[0]; c++) {
    ferry_ops_clear_memo();
    ferry__fault_arm(calls[c], 1, CUDA_ERROR_LAUNCH_FAILED);
    ferry_artifact *art = NULL;
    ferry_status st = ferry_op_compile(op, &args, &art);
    int hits = ferry__fault_hits();
    ferry__fault_disarm();
    if (hits == 0) FAIL_AT("compile never called %s", calls[c]);
    expect_fault_reported(calls[c], st);
    ASSERT(art == NULL);
    ASSERT_EQ(st, calls[c][0] == 'n' ? FERRY_COMPILE_FAILED : FERRY_DRIVER_ERROR);
    ASSERT_EQ(fake_live_libraries, 0);
    ASSERT_OK(ferry_op_compile(op, &args, &art)); /* and the next compile works */
    ferry_artifact_release(art);
  }
  ferry_ops_clear_memo();
  ASSERT_EQ(fake_live_libraries, 0);
  test_rm_rf(home);
}

TEST(fault_at_every_load_and_run_call_is_clean) {
  if (!test_have_nvrtc()) return;
  /* 128×128 s4 needs 80 KiB of shared memory: its first function on a device raises the limit too. */
  static const char *calls[] = {"cuLibraryLoadData", "cuLibraryGetKernel", "cuKernelGetFunction",
                                "cuFuncSetAttribute", "cuCtxPushCurrent", "cuCtxGetCurrent", "cuLaunchKernel"};
  char home[300];
  test_cache_home(home, sizeof home, "fault-run");
  unsetenv("FERRY_ARCH");
  fake_driver_use();
  const ferry_op *op = ferry_op_by_name("gemm_mma_f16_128x128x32_s4");
  ferry_gemm_args args;
  test_args(&args, FERRY_SCALAR_F16, FERRY_SCALAR_F16, 256, 256, 64);
  ferry_artifact *art = NULL;
  ASSERT_OK(ferry_op_compile(op, &args, &art)); /* once through NVRTC; then from the disk cache */
  ferry_artifact_release(art);
  for (size_t c = 0; c < sizeof calls / sizeof calls[0]; c++) {
    for (int flags = 0; flags <= 1; flags++) {
      ferry_ops_clear_memo();
      ASSERT_EQ(fake_live_libraries, 0);
      int launches = fake_launches;
      ferry__fault_arm(calls[c], 1, CUDA_ERROR_LAUNCH_FAILED);
      art = NULL;
      ferry_status st = ferry_op_compile(op, &args, &art); /* a disk hit, loaded into the (fake) device */
      if (st == FERRY_OK)
        st = ferry_op_run(op, &args, (void *)0x5400, flags ? NULL : art, flags ? 0 : FERRY_RUN_ASSUME_SUPPORTED);
      int hits = ferry__fault_hits();
      ferry__fault_disarm();
      if (hits == 0) FAIL_AT("compile+run never called %s", calls[c]);
      expect_fault_reported(calls[c], st);
      ASSERT_EQ(ferry_last_error()->cu_result, CUDA_ERROR_LAUNCH_FAILED);
      ASSERT_EQ(fake_launches, launches);
      ferry_artifact_release(art);
      ferry_ops_clear_memo();
      ASSERT_EQ(fake_live_libraries, 0);
      /* the runtime still works */
      ASSERT_OK(ferry_op_run(op, &args, (void *)0x5400, NULL, 0));
      ASSERT_EQ(fake_launches, launches + 1);
    }
  }
  ferry_ops_clear_memo();
  ASSERT_EQ(fake_live_libraries, 0);
  test_rm_rf(home);
}

TEST(fault_at_every_graph_call_is_clean) {
  if (!test_have_nvrtc()) return;
  static const char *calls[] = {"cuStreamGetCtx", "cuStreamBeginCapture", "cuCtxPushCurrent", "cuLaunchKernel",
                                "cuStreamGetCaptureInfo", "cuGraphNodeGetType", "cuStreamEndCapture",
                                "cuGraphInstantiateWithFlags", "cuGraphLaunch", "cuGraphExecKernelNodeSetParams"};
  char home[300];
  test_cache_home(home, sizeof home, "fault-graph");
  unsetenv("FERRY_ARCH");
  fake_driver_use();
  const ferry_op *op = tiny_op("tiny_fault_graph");
  ferry_gemm_args args;
  test_args(&args, FERRY_SCALAR_F32, FERRY_SCALAR_F32, 64, 64, 64);
  ferry_artifact *art = NULL;
  ASSERT_OK(ferry_op_compile(op, &args, &art));
  for (size_t c = 0; c < sizeof calls / sizeof calls[0]; c++) {
    for (int nth = 1; nth <= 2; nth++) {
      ferry__fault_arm(calls[c], nth, CUDA_ERROR_LAUNCH_FAILED);
      ferry_graph *g = NULL;
      ferry_status st = ferry_graph_begin((void *)0x5500, &g);
      for (int r = 0; r < 2 && st == FERRY_OK; r++) st = ferry_graph_run(g, op, &args, art, 0, NULL);
      if (st == FERRY_OK) st = ferry_graph_end(g);
      if (st == FERRY_OK) st = ferry_graph_replay(g, NULL);
      if (st == FERRY_OK) st = ferry_graph_update(g, 1, &args);
      if (st == FERRY_OK) st = ferry_graph_replay(g, NULL);
      int hits = ferry__fault_hits();
      ferry__fault_disarm();
      if (hits < nth) {
        if (nth == 1) FAIL_AT("the graph sequence never called %s", calls[c]);
        ASSERT_OK(st); /* called only once: no second use to fail */
      } else {
        expect_fault_reported(calls[c], st);
        ASSERT(g != NULL || !strcmp(calls[c], "cuStreamGetCtx") || !strcmp(calls[c], "cuStreamBeginCapture") ||
               !strcmp(calls[c], "cuCtxPushCurrent"));
      }
      ferry_graph_destroy(g);
      ASSERT_EQ(fake_live_graphs, 0);
      ASSERT_EQ(fake_live_execs, 0);
    }
  }
  /* a clean sequence afterwards */
  ferry_graph *g = NULL;
  ASSERT_OK(ferry_graph_begin((void *)0x5500, &g));
  ASSERT_OK(ferry_graph_run(g, op, &args, art, 0, NULL));
  ASSERT_OK(ferry_graph_end(g));
  ASSERT_OK(ferry_graph_replay(g, NULL));
  ferry_graph_destroy(g);
  ferry_artifact_release(art);
  ferry_ops_clear_memo();
  ASSERT_EQ(fake_live_libraries, 0);
  test_rm_rf(home);
}
