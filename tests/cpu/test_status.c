/* Status table and last-error record. */
#include "internal.h"
#include "test.h"

TEST(version_is_the_builds) { /* ferry.h's macros and CMakeLists.txt's project() version: one fact, checked */
  ASSERT(!strcmp(ferry_version(), FERRY_PROJECT_VERSION));
}

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

TEST(call_error_names_the_call) {
  ASSERT_EQ(ferry__call_error(FERRY_IO_ERROR, "rename", "src/x.c", 12, "renaming %s", "a"), FERRY_IO_ERROR);
  const ferry_error *e = ferry_last_error();
  ASSERT_EQ(e->status, FERRY_IO_ERROR);
  ASSERT(strcmp(e->call, "rename") == 0);
  ASSERT(strcmp(e->cu_name, "") == 0);
  ASSERT_EQ(e->cu_result, 0);
  ASSERT(strcmp(e->file, "x.c") == 0);
  ASSERT_EQ(e->line, 12);
  ASSERT(strcmp(e->message, "renaming a") == 0);
  /* A library's own result name goes beside the call; the message may quote the record's previous message. */
  ASSERT_EQ(ferry__lib_error(FERRY_COMPILE_FAILED, "nvrtcCompileProgram", "NVRTC_ERROR_COMPILATION", __FILE__, 3,
                             "%s; then %s", ferry_last_error_message(), "compiling"),
            FERRY_COMPILE_FAILED);
  ASSERT(strcmp(e->call, "nvrtcCompileProgram") == 0);
  ASSERT(strcmp(e->cu_name, "NVRTC_ERROR_COMPILATION") == 0);
  ASSERT(strcmp(e->message, "renaming a; then compiling") == 0);
  /* A plain error afterwards names no call. */
  ferry__error(FERRY_INVALID_ARGUMENT, __FILE__, 4, "bad");
  ASSERT(strcmp(e->call, "") == 0 && strcmp(e->cu_name, "") == 0);
  ferry_clear_error();
}

TEST(error_restore_puts_it_back) {
  ferry__call_error(FERRY_IO_ERROR, "open", __FILE__, 5, "the caller's error");
  ferry_error saved = *ferry_last_error();
  ferry__error(FERRY_NO_DEVICE, __FILE__, 6, "a probe's failure");
  ferry__error_restore(&saved);
  ASSERT_EQ(ferry_last_error()->status, FERRY_IO_ERROR);
  ASSERT(strcmp(ferry_last_error()->call, "open") == 0);
  ASSERT_EQ(ferry_last_error()->line, 5);
  ASSERT(strcmp(ferry_last_error_message(), "the caller's error") == 0);
  ferry_clear_error();
}
