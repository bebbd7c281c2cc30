/* test.h — a small test harness in the libuv manner: TEST(name) defines a test, the runner runs each in its own
 * process with a timeout, and ASSERT_* print both values with file and line. */
#ifndef FERRY_TEST_H
#define FERRY_TEST_H
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*test_fn)(void);
typedef struct test_entry { const char *name; test_fn fn; } test_entry;

#define TEST(name) void test_##name(void)

#define FAIL_AT(...)                                                                  \
  do {                                                                                \
    fprintf(stderr, "  %s:%d: ", __FILE__, __LINE__);                                 \
    fprintf(stderr, __VA_ARGS__);                                                     \
    fprintf(stderr, "\n");                                                            \
    exit(1);                                                                          \
  } while (0)

/* Ends the test as skipped, saying why: the runner reports it as a skip, not a pass. */
#define TEST_SKIP_EXIT 77
#define SKIP(...)                                                                     \
  do {                                                                                \
    fprintf(stderr, "  skipped: ");                                                   \
    fprintf(stderr, __VA_ARGS__);                                                     \
    fprintf(stderr, "\n");                                                            \
    exit(TEST_SKIP_EXIT);                                                             \
  } while (0)

#define ASSERT(cond) do { if (!(cond)) FAIL_AT("assertion failed: %s", #cond); } while (0)
#define ASSERT_EQ(a, b)                                                                                    \
  do {                                                                                                     \
    long long a_ = (long long)(a), b_ = (long long)(b);                                                    \
    if (a_ != b_) FAIL_AT("%s == %s failed: %lld != %lld", #a, #b, a_, b_);                                \
  } while (0)
#define ASSERT_STATUS(expr, want)                                                                          \
  do {                                                                                                     \
    ferry_status s_ = (expr);                                                                              \
    if (s_ != (want)) FAIL_AT("%s returned %s, expected %s (last error: %s)", #expr, ferry_status_name(s_), \
                              ferry_status_name(want), ferry_last_error_message());                      \
  } while (0)
#define ASSERT_OK(expr) ASSERT_STATUS(expr, FERRY_OK)
#define ASSERT_STR_CONTAINS(hay, needle)                                                                   \
  do {                                                                                                     \
    const char *h_ = (hay), *n_ = (needle);                                                                \
    if (!h_ || !strstr(h_, n_)) FAIL_AT("\"%s\" does not contain \"%s\"", h_ ? h_ : "(null)", n_);        \
  } while (0)
#endif
