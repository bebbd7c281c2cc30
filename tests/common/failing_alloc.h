/* failing_alloc.h — an allocation-failure seam for tests, made at link time: a test program linked with
 * ferry_failing_alloc(target) (cmake/ops.cmake) sends every malloc, calloc, realloc, strdup and free of its objects
 * and of libferry's through failing_alloc.c, which can fail one allocation on request and counts the blocks
 * outstanding. Nothing of it is compiled into the library. */
#ifndef FERRY_FAILING_ALLOC_H
#define FERRY_FAILING_ALLOC_H

/* Makes the allocation `nth` from now fail (0: the next one), once; -1 fails none. */
void failing_alloc_fail_nth(long nth);

/* 1 when the requested failure has happened since the last failing_alloc_fail_nth. */
int failing_alloc_failed(void);

/* Blocks allocated through the seam and not yet freed. */
long failing_alloc_live(void);

#endif
