/* test_list_ops_gpu.h — the operator runtime's GPU tests (ferry_test_ops_gpu; ctest name ops_gpu, label gpu), in the
 * order the runner runs them (test_ops_gpu.c). Without a GPU they skip; with --simulate the fault matrix runs
 * through the simulated driver (ctest name ops_faults_simulated). */
#define TEST_LIST(X)                                \
  X(every_design_matches_the_float64_reference)     \
  X(graphs_capture_replay_and_update_in_place)      \
  X(registered_kernel_runs_end_to_end)              \
  X(every_failing_runtime_call_is_clean)

#define TEST_SUITE_HELP                                                                                              \
  "The operator runtime's GPU tests (cuda:0 or LOCAL_RANK; without a GPU they skip). Options:\n"                     \
  "  --quick      leave out the 4096^3 cases (for compute-sanitizer, which slows kernels a hundredfold)\n"          \
  "  --sanitize   every design on one odd size (129x127x65, padded), all-row and all-column majors (racecheck)\n"    \
  "  --simulate   every_failing_runtime_call_is_clean through the CPU tests' simulated driver, without a GPU\n"    \
  "every_failing_runtime_call_is_clean: each driver and NVRTC call of compile, disk-cache load, run and graphs\n"  \
  "fails at each of its uses; every case must be reported with the call's name, leak nothing, present no output\n"  \
  "as complete and leave the next operation exact (one line per case).\n"
#define TEST_TIMEOUT_S 900
int ops_gpu_option(int argc, char **argv, int i);
int ops_gpu_main_hook(int argc, char **argv);
#define TEST_OPTION ops_gpu_option
#define TEST_MAIN_HOOK ops_gpu_main_hook
