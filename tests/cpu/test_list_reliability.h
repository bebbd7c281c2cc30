/* test_list_reliability.h — the reliability suite (ferry_test_reliability, ctest name `reliability`): bad inputs,
 * fork, threads. Built from runner.c with -DTEST_LIST_HEADER pointing here. Its executable also answers
 * `--table` (the bad-input table as markdown, for docs/reliability.md) through the runner's main hook. */
#define TEST_LIST(X)             \
  X(bad_inputs_table)            \
  X(million_tiny_tensors)

int reliability_main_hook(int argc, char **argv);
#define TEST_MAIN_HOOK reliability_main_hook
