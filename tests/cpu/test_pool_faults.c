/* test_pool_faults.c — the pool's own driver calls failing, through the simulated driver (which, like the real
 * driver, refuses to register a range that overlaps one still registered). */
#include "fake_driver.h"
#include "reliability_util.h"
#include "test.h"

static unsigned char src[3][1 << 20];
static int64_t shapes[3] = {1 << 20, 1 << 20, 1 << 20};

/* Three 1 MiB device tensors (DMA), exact, released; fails the test otherwise. */
static void exact_d2h(void) {
  ferry_tensor t[3];
  for (int i = 0; i < 3; i++) {
    for (size_t k = 0; k < sizeof src[i]; k++) src[i][k] = (unsigned char)(k * 13 + i);
    t[i] = (ferry_tensor){src[i], {FERRY_DEVICE_CUDA, 0}, 1, {FERRY_DTYPE_UINT, 8, 1}, &shapes[i], NULL, 0};
  }
  ferry_transfer_options o;
  ferry_transfer_options_init(&o);
  o.device = 0;
  o.flags = FERRY_TRANSFER_BLOCKING;
  ferry_transfer *tr = NULL;
  ASSERT_OK(ferry_transfer_d2h(t, 3, &o, &tr));
  for (int i = 0; i < 3; i++) ASSERT_EQ(rel_diff_elements(&t[i], &ferry_transfer_outputs(tr)[i]), 0);
  ferry_transfer_release(tr);
}

TEST(trim_with_a_failing_unregister_keeps_the_pool_usable) {
  fake_driver_use();
  ASSERT_OK(ferry_init());
  for (int round = 0; round < 3; round++) {
    exact_d2h();
    /* Every unregister fails: the regions leave the pool's books, but their addresses must not be reused while
     * the driver still holds them, or the next pin there is refused (CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED). */
    ferry__fault_arm("cuMemHostUnregister", 0, CUDA_ERROR_LAUNCH_FAILED);
    ASSERT_OK(ferry_pool_trim());
    ferry__fault_disarm();
    ferry_pool_stats s;
    ferry_pool_stats_get(&s);
    ASSERT_EQ(s.bytes_pinned, 0);
  }
  exact_d2h();
  ASSERT_EQ(fake_registered, 4); /* three leaked (still registered, still mapped) and the live one */
}

TEST(reserve_with_a_failing_register_reports_it_and_recovers) {
  fake_driver_use();
  ASSERT_OK(ferry_init());
  ferry__fault_arm("cuMemHostRegister", 1, CUDA_ERROR_OUT_OF_MEMORY);
  ASSERT_STATUS(ferry_pool_reserve(32 << 20), FERRY_OUT_OF_HOST_MEMORY);
  ferry__fault_disarm();
  ASSERT_STR_CONTAINS(ferry_last_error()->call, "cuMemHostRegister");
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "cuMemHostRegister");
  ferry_pool_stats s;
  ferry_pool_stats_get(&s);
  ASSERT_EQ(s.bytes_pinned, 0);
  ASSERT_EQ(fake_registered, 0);
  ASSERT_OK(ferry_pool_reserve(32 << 20));
  exact_d2h();
}
