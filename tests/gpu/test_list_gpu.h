/* test_list_gpu.h — the GPU transfer tests (ferry_test_gpu; ctest name gpu, label gpu), in the order the runner
 * runs them. Each test's process takes the device in gpu_setup and checks the pool in gpu_teardown (gpu_test.c);
 * without a GPU every test skips. */
#define TEST_LIST(X)                              \
  X(round_trips)                                  \
  X(mixed_dtypes_and_pass_through)                \
  X(odd_width_strided_elements)                   \
  X(producer_event_is_waited_for)                 \
  X(producer_stream_is_waited_for)                \
  X(pool_never_reuses_under_a_running_copy)       \
  X(sixteen_threads_round_trip)                   \
  X(large_first_call_is_cut_and_exact)

#define TEST_SUITE_HELP "ferry's GPU transfer tests on cuda:0 (LOCAL_RANK honoured); without a GPU every test skips.\n"
void gpu_setup(void);
void gpu_teardown(void);
#define TEST_SETUP gpu_setup
#define TEST_TEARDOWN gpu_teardown
