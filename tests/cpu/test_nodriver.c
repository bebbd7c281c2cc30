/* Without libcuda (CI has none; the test also forces it with a bogus library path): everything passes through.
 * These tests assume no GPU driver is present and report a skip if one is. */
#include "internal.h"
#include "test.h"

static int driver_present(void) {
  if (ferry_init() == FERRY_OK) SKIP("a CUDA driver is present; the no-driver behaviour cannot be observed here");
  return 0;
}

TEST(no_driver_passes_everything_through) {
  if (driver_present()) return;
  /* Successful calls leave the last error alone: an earlier failure's record is still there after them. */
  ASSERT(ferry_tensor_nbytes(NULL, NULL) == FERRY_INVALID_ARGUMENT);
  ferry_error before = *ferry_last_error();
  int64_t shape[1] = {4};
  float data[4] = {1, 2, 3, 4};
  ferry_tensor t = {data, {FERRY_DEVICE_CUDA, 0}, 1, {FERRY_DTYPE_FLOAT, 32, 1}, shape, NULL, 0};
  ferry_transfer *tr = NULL;
  ASSERT_OK(ferry_transfer_d2h(&t, 1, NULL, &tr));
  ASSERT_EQ(ferry_transfer_count(tr), 1);
  ASSERT_EQ(ferry_transfer_device(tr), -1);
  ASSERT(ferry_transfer_outputs(tr)[0].data == data);
  shape[0] = 5; /* the caller's arrays are its own again once the call returns: the output's shape is the ticket's */
  ASSERT_EQ(ferry_transfer_outputs(tr)[0].shape[0], 4);
  shape[0] = 4;
  ASSERT_EQ(ferry_transfer_output_copied(tr, 0), 0);
  ASSERT(ferry_transfer_slab(tr) == NULL);
  ASSERT_OK(ferry_transfer_wait(tr));
  ASSERT_OK(ferry_transfer_query(tr));
  ferry_transfer_release(tr);
  ASSERT_OK(ferry_transfer_h2d(&t, 1, NULL, &tr));
  ferry_transfer_release(tr);
  ASSERT_EQ(ferry_last_error()->status, before.status);
  ASSERT(strcmp(ferry_last_error()->message, before.message) == 0);
}

TEST(no_driver_still_refuses_a_descriptor_a_device_would_refuse) {
  if (driver_present()) return;
  int64_t negative[1] = {-4};
  float data[4] = {0};
  ferry_tensor ok = {data, {FERRY_DEVICE_CUDA, 0}, 1, {FERRY_DTYPE_FLOAT, 32, 1}, negative, NULL, 0};
  ferry_tensor bad[3] = {ok, ok, ok};
  int64_t four[1] = {4};
  bad[0].shape = bad[1].shape = four;
  ferry_transfer *tr = NULL;
  ASSERT_EQ(ferry_transfer_d2h(bad, 3, NULL, &tr), FERRY_INVALID_ARGUMENT); /* tensor 2: a negative dimension */
  ASSERT(tr == NULL && strstr(ferry_last_error()->message, "tensor 2: dimension 0 is negative") != NULL);
  bad[2].device.device_type = FERRY_DEVICE_CPU; /* a host tensor in a D2H passes through unchecked, as with a device */
  ASSERT_OK(ferry_transfer_d2h(bad, 3, NULL, &tr));
  ferry_transfer_release(tr);
  ASSERT_EQ(ferry_transfer_h2d(bad, 3, NULL, &tr), FERRY_INVALID_ARGUMENT); /* ... which H2D copies */
}

TEST(no_driver_reports_zero_devices) {
  if (driver_present()) return;
  ASSERT(ferry_tensor_nbytes(NULL, NULL) == FERRY_INVALID_ARGUMENT);
  ferry_error before = *ferry_last_error();
  ASSERT_EQ(ferry_device_count(), 0); /* never an error: the caller's last error stays */
  ASSERT_EQ(ferry_last_error()->status, before.status);
  ASSERT(strcmp(ferry_last_error()->message, before.message) == 0);
  int d;
  ferry_status st = ferry_device_resolve(-1, &d);
  ASSERT(st == FERRY_NO_DRIVER || st == FERRY_NO_DEVICE);
  ASSERT(strlen(ferry_last_error_message()) > 10);
}

TEST(no_driver_pool_calls_fail_cleanly) {
  if (driver_present()) return;
  ferry_status st = ferry_pool_reserve(1 << 20);
  ASSERT(st == FERRY_NO_DRIVER || st == FERRY_NO_DEVICE);
  ASSERT_OK(ferry_pool_trim());
  ferry_pool_stats s;
  ferry_pool_stats_get(&s);
  ASSERT_EQ(s.bytes_pinned, 0);
}

TEST(options_struct_size_checked) {
  ferry_transfer_options o;
  ferry_transfer_options_init(&o);
  o.struct_size = 4;
  ferry_transfer *tr = NULL;
  ASSERT_STATUS(ferry_transfer_d2h(NULL, 0, &o, &tr), FERRY_INVALID_ARGUMENT);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "struct_size");
  ferry_transfer_options_init(&o);
  ASSERT_STATUS(ferry_transfer_d2h(NULL, 0, &o, NULL), FERRY_INVALID_ARGUMENT);
}
