/* test.h — a small test harness in the libuv manner: TEST(name) defines a test, the runner (runner.c) runs each in
 * its own process with a timeout, ASSERT_* print both values with file and line and end the test, and SKIP says
 * why a test cannot run here (counted apart from passes). */
#ifndef FERRY_TEST_H
#define FERRY_TEST_H
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*test_fn)(void);
typedef struct test_entry { const char *name; test_fn fn; } test_entry;

#define TEST(name) void test_##name(void)

/* The exit status of a skipped test's process (automake's, and ctest's SKIP_RETURN_CODE for a program whose every
 * test skipped). */
#define TEST_SKIP_STATUS 77
/* Ends the test as skipped (runner.c); SKIP prints the reason first. */
void test_skipped(void);
#define SKIP(...)                                                                     \
  do {                                                                                \
    printf("  skipped: ");                                                            \
    printf(__VA_ARGS__);                                                              \
    printf("\n");                                                                     \
    test_skipped();                                                                   \
  } while (0)

/* 1 when built with AddressSanitizer. Its allocator records each new allocation stack under a spin lock (GCC 12's
 * libsanitizer) that a fork can leave held by another thread: a child that then allocates hangs in ASan itself. */
#if defined(__SANITIZE_ADDRESS__)
#define TEST_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TEST_UNDER_ASAN 1
#endif
#endif
#ifndef TEST_UNDER_ASAN
#define TEST_UNDER_ASAN 0
#endif

/* Each test's time limit in seconds (0: none): the list's TEST_TIMEOUT_S, or --timeout; a suite's TEST_OPTION may
 * raise it for a long mode. */
extern int test_timeout_s;

#define FAIL_AT(...)                                                                  \
  do {                                                                                \
    fprintf(stderr, "  %s:%d: ", __FILE__, __LINE__);                                 \
    fprintf(stderr, __VA_ARGS__);                                                     \
    fprintf(stderr, "\n");                                                            \
    exit(1);                                                                          \
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
