/* Status table and last-error record. */
#include "internal.h"
#include "test.h"

TEST(status_names_cover_the_table) {
#define CHECK_GEN(name, code, text)                              \
  ASSERT(strcmp(ferry_status_name(FERRY_##name), #name) == 0);   \
  ASSERT(strcmp(ferry_status_str(FERRY_##name), text) == 0);     \
  ASSERT_EQ(FERRY_##name, code);
  FERRY_STATUS_MAP(CHECK_GEN)
#undef CHECK_GEN
}

TEST(status_unknown_value) {
  ASSERT(strcmp(ferry_status_name((ferry_status)12345), "UNKNOWN") == 0);
  ASSERT(strcmp(ferry_status_str((ferry_status)12345), "unknown status") == 0);
}

TEST(last_error_starts_clear) {
  ASSERT_EQ(ferry_last_error()->status, FERRY_OK);
  ASSERT_EQ(ferry_last_error_message()[0], 0);
  ASSERT_EQ(ferry__error(FERRY_INVALID_ARGUMENT, __FILE__, 7, "bad %d", 3), FERRY_INVALID_ARGUMENT);
  ASSERT(strcmp(ferry_last_error_message(), "bad 3") == 0);
  ASSERT_EQ(ferry_last_error()->line, 7);
  ferry_clear_error();
  ASSERT_EQ(ferry_last_error()->status, FERRY_OK);
}
