/* test_list.h — every CPU test, in the order the runner runs them. */
#define TEST_LIST(X)                        \
  X(status_names_cover_the_table)           \
  X(status_unknown_value)                   \
  X(last_error_starts_clear)                \
  X(call_error_names_the_call)              \
  X(error_restore_puts_it_back)             \
  X(nbytes_multiplies_shape_and_dtype)      \
  X(nbytes_rejects_negative_dimension)      \
  X(nbytes_detects_overflow)                \
  X(nbytes_rejects_sub_byte_dtype)          \
  X(compact_detection)                      \
  X(layout_merges_contiguous_dimensions)    \
  X(plan_routes_large_to_dma)               \
  X(plan_routes_many_small_to_gather)       \
  X(plan_single_small_stays_dma)            \
  X(plan_strided_without_gather_fails)      \
  X(plan_offsets_are_aligned_and_disjoint)  \
  X(plan_pass_through_and_empty)            \
  X(plan_h2d_pageable_small_is_packed)      \
  X(gather_items_reproduce_strided_tensor)  \
  X(gather_items_split_large_contiguous)    \
  X(no_driver_passes_everything_through)    \
  X(no_driver_reports_zero_devices)         \
  X(no_driver_pool_calls_fail_cleanly)      \
  X(options_struct_size_checked)            \
  X(fake_d2h_is_exact_and_returns_slab)     \
  X(fake_d2h_pipeline_chunks_are_exact)     \
  X(fake_h2d_is_exact_over_every_route)     \
  X(fault_at_every_d2h_call_is_clean)       \
  X(fault_at_every_h2d_call_is_clean)       \
  X(pool_reuses_and_trims)                  \
  X(device_index_past_count_names_both)
