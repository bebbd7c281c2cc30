/* failing_alloc.c — the wrappers behind failing_alloc.h. The linker's --wrap=SYMBOL makes every call to SYMBOL from
 * the program's objects (libferry's included) call __wrap_SYMBOL, which reaches the C library's as __real_SYMBOL. */
#include "failing_alloc.h"

#include <stdatomic.h>
#include <stddef.h>
#include <string.h>

void *__real_malloc(size_t size);
void *__real_calloc(size_t count, size_t size);
void *__real_realloc(void *p, size_t size);
char *__real_strdup(const char *s);
void __real_free(void *p);

static atomic_long countdown = -1; /* allocations left before the one that fails; -1: none fails */
static atomic_int failed;
static atomic_long live;

void failing_alloc_fail_nth(long nth) {
  atomic_store(&failed, 0);
  atomic_store(&countdown, nth);
}

int failing_alloc_failed(void) { return atomic_load(&failed); }

long failing_alloc_live(void) { return atomic_load(&live); }

/* 1 when this allocation is the one to fail. */
static int fail_now(void) {
  long left = atomic_load(&countdown);
  while (left >= 0) {
    if (atomic_compare_exchange_weak(&countdown, &left, left - 1)) {
      if (left > 0) return 0;
      atomic_store(&failed, 1);
      return 1;
    }
  }
  return 0;
}

static void *counted(void *p) {
  if (p) atomic_fetch_add(&live, 1);
  return p;
}

void *__wrap_malloc(size_t size) { return fail_now() ? NULL : counted(__real_malloc(size)); }
void *__wrap_calloc(size_t count, size_t size) { return fail_now() ? NULL : counted(__real_calloc(count, size)); }
char *__wrap_strdup(const char *s) { return fail_now() ? NULL : counted(__real_strdup(s)); }

void *__wrap_realloc(void *p, size_t size) {
  if (fail_now()) return NULL;
  void *q = __real_realloc(p, size);
  if (!p) return counted(q);
  if (!size) atomic_fetch_sub(&live, 1); /* realloc(p, 0) frees p */
  return q;
}

void __wrap_free(void *p) {
  if (p) atomic_fetch_sub(&live, 1);
  __real_free(p);
}
