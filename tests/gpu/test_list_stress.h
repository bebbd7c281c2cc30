/* test_list_stress.h — ferry_stress (stress.c, fault_gpu.c, fork_gpu.c): load and soak, real-driver faults and fork
 * on a GPU, in the order the runner runs them; ctest names stress_simulated (through the simulated driver, no GPU)
 * and stress (label gpu). Without a GPU and without --simulate every test skips. */
#define TEST_LIST(X)                          \
  X(random_batches_are_exact)                 \
  X(every_failing_driver_call_is_clean)       \
  X(fork_after_init_is_a_clear_error)

#define TEST_SUITE_HELP                                                                                             \
  "Load, soak, fault and fork checks of the transfer path on cuda:0 (LOCAL_RANK honoured). Options:\n"              \
  "  --threads N (16)  --batches N (1000) | --seconds S  --max-count N (256)  --max-bytes B (1 MiB)  --seed N\n"    \
  "  --plateau-tolerance F (0.05)  --csv FILE  --verbose\n"                                                          \
  "  --simulate        everything through the CPU tests' simulated driver, without a GPU\n"                         \
  "random_batches_are_exact: N threads each run random D2H then H2D batches, byte-exact; with --seconds, a soak\n" \
  "that samples the pool every second and fails unless pinned and device bytes plateau (--csv: the samples).\n"    \
  "every_failing_driver_call_is_clean: each driver call of the transfer and pool paths fails at each of its uses.\n"\
  "fork_after_init_is_a_clear_error: fork after CUDA initialisation gives a clear error in the child, never a hang.\n"
#define TEST_TIMEOUT_S 900
int stress_option(int argc, char **argv, int i);
int stress_main_hook(int argc, char **argv);
void stress_setup(void);
#define TEST_OPTION stress_option
#define TEST_MAIN_HOOK stress_main_hook
#define TEST_SETUP stress_setup
