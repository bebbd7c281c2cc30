/* test_list_reliability.h — the reliability suite (ferry_test_reliability, ctest name `reliability`): bad inputs,
 * fork, threads. Built from runner.c with -DTEST_LIST_HEADER pointing here. Its executable also answers
 * `--table` (the bad-input table as markdown, for docs/reliability.md) through the runner's main hook. */
#define TEST_LIST(X)                                             \
  X(bad_inputs_table)                                            \
  X(million_tiny_tensors)                                       \
  X(fork_after_init_refuses_in_the_child)                        \
  X(forked_child_makes_no_driver_call_and_leaves_the_pool_alone) \
  X(fork_while_another_thread_uses_the_pool_never_hangs)         \
  X(fork_before_init_leaves_the_child_free)                       \
  X(forked_child_cannot_read_the_pinned_pool)                    \
  X(fork_while_threads_use_the_operator_runtime_never_hangs)     \
  X(fork_after_nvrtc_refuses_compiles_in_the_child)              \
  X(sixteen_threads_random_batches_exact)                        \
  X(cache_dir_owned_by_another_user_is_refused)                  \
  X(cache_file_owned_by_another_user_is_not_loaded)              \
  X(cache_file_that_is_a_symlink_is_not_loaded)                  \
  X(cache_file_with_a_hard_link_is_not_loaded)                   \
  X(import_of_a_fifo_does_not_block)                             \
  X(cache_entry_that_is_a_fifo_does_not_block)                   \
  X(import_of_a_huge_sparse_file_is_refused_unread)              \
  X(cache_dir_that_is_a_file_is_refused)                         \
  X(trim_with_a_failing_unregister_keeps_the_pool_usable)        \
  X(reserve_with_a_failing_register_reports_it_and_recovers)

int reliability_main_hook(int argc, char **argv);
#define TEST_MAIN_HOOK reliability_main_hook
