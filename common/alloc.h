/* alloc.h - the one allocator of libarena, with fault injection for tests.
 *
 * Every heap allocation in the library (and jansson's, once
 * arena_alloc_init() has run) goes through these functions, so a test can make
 * the Nth allocation fail and check that every path ends in a clean error
 * without leaks. */
#ifndef ARENA_COMMON_ALLOC_H
#define ARENA_COMMON_ALLOC_H

#include <stddef.h>

void *arena_malloc(size_t n);
void *arena_calloc(size_t count, size_t size);
void *arena_realloc(void *p, size_t n);
char *arena_strdup(const char *s);
void arena_free(void *p); /* accepts NULL */

/* Number of allocations that failed on this thread so far (real or
 * injected). Lets a caller tell "out of memory" from "bad input" when a
 * library such as jansson reports both the same way: compare before/after. */
unsigned long arena_alloc_failures(void);

/* Route jansson's allocations through arena_malloc/arena_free. Idempotent,
 * thread-safe; called by every entry point that parses JSON. */
void arena_alloc_init(void);

/* Fault injection (tests only). arena_fault_alloc(n): the nth allocation from
 * now fails (n >= 1) and every later one succeeds; n = 0 disarms.
 * arena_fault_alloc_count() returns allocations made since the last arming. */
void arena_fault_alloc(long n);
long arena_fault_alloc_count(void);
/* Did an injected failure fire since the last arming? */
int arena_fault_alloc_fired(void);

#endif
