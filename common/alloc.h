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
/* n bytes aligned to `align` (a power of two, a multiple of sizeof(void *));
 * released with arena_free. */
void *arena_aligned_alloc(size_t align, size_t n);
void arena_free(void *p); /* accepts NULL */

/* Number of allocations that failed on this thread so far (real or
 * injected). Lets a caller tell "out of memory" from "bad input" when a
 * library such as jansson reports both the same way: compare before/after. */
unsigned long arena_alloc_failures(void);

/* Bracket a jansson parse (json_load*) of untrusted text:
 *     unsigned long mark = arena_json_parse_begin();
 *     json_t *root = json_loadb(...);
 *     if (arena_json_parse_end(mark))   -> out of memory, whatever root is
 * jansson (2.14) does not survive a failed allocation while parsing: its
 * lexer drops the byte it could not save and parses on, which ends in a
 * wrong result (a syntax error, or success on altered text) or in a write
 * past a buffer (a string whose closing quote was dropped). So between begin
 * and end an injected failure (arena_fault_alloc) on one of jansson's
 * allocations is counted, not enacted: jansson gets its memory and end()
 * reports the failure. A real allocation failure is still passed to jansson;
 * nothing better can be done without another parser. Nests; per thread. */
unsigned long arena_json_parse_begin(void);
/* Nonzero if an allocation failed (real or injected) since `mark`. */
int arena_json_parse_end(unsigned long mark);

/* Blocks allocated through these functions (and jansson's, after
 * arena_alloc_init) and not yet freed, all threads together. Tests compare
 * it before and after an operation to find leaks without a leak checker. */
long arena_alloc_live(void);

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
