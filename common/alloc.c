/* alloc.c - allocation wrappers with an injectable Nth-call failure. */
#include "alloc.h"
#include "fault.h"

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static arena__fault alloc_fault; /* counts allocations since arming */
static _Thread_local unsigned long failed_here;
static atomic_long live; /* allocations not yet freed */

static int should_fail(void)
{
	if (!arena__fault_hit(&alloc_fault))
		return 0;
	failed_here++;
	return 1;
}

/* Count a new block, or a failure. */
static void *note(void *p)
{
	if (!p)
		failed_here++;
	else
		atomic_fetch_add_explicit(&live, 1, memory_order_relaxed);
	return p;
}

long arena_alloc_live(void)
{
	return atomic_load(&live);
}

unsigned long arena_alloc_failures(void)
{
	return failed_here;
}

void *arena_malloc(size_t n)
{
	if (should_fail())
		return NULL;
	return note(malloc(n ? n : 1));
}

void *arena_calloc(size_t count, size_t size)
{
	if (should_fail())
		return NULL;
	return note(calloc(count ? count : 1, size ? size : 1));
}

void *arena_realloc(void *p, size_t n)
{
	if (should_fail())
		return NULL;
	if (p) {
		void *q = realloc(p, n ? n : 1);
		if (!q)
			failed_here++;
		return q;
	}
	return note(realloc(NULL, n ? n : 1));
}

void *arena_aligned_alloc(size_t align, size_t n)
{
	if (should_fail())
		return NULL;
	void *p = NULL;
	if (posix_memalign(&p, align, n ? n : 1))
		p = NULL;
	return note(p);
}

char *arena_strdup(const char *s)
{
	size_t n = strlen(s) + 1;
	char *d = arena_malloc(n);
	if (d)
		memcpy(d, s, n);
	return d;
}

void arena_free(void *p)
{
	if (p)
		atomic_fetch_sub_explicit(&live, 1, memory_order_relaxed);
	free(p);
}

/* Depth of arena_json_parse_begin/end on this thread. */
static _Thread_local int json_parsing;

unsigned long arena_json_parse_begin(void)
{
	json_parsing++;
	return failed_here;
}

int arena_json_parse_end(unsigned long mark)
{
	json_parsing--;
	return failed_here != mark;
}

/* jansson's allocator. While it parses, an injected failure is counted but
 * not enacted (see alloc.h: jansson cannot survive one there). */
static void *json_malloc(size_t n)
{
	if (json_parsing <= 0)
		return arena_malloc(n);
	(void)should_fail(); /* counts the allocation, and the failure when it fires */
	return note(malloc(n ? n : 1));
}

static void set_json_alloc(void)
{
	json_set_alloc_funcs(json_malloc, arena_free);
}

void arena_alloc_init(void)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	pthread_once(&once, set_json_alloc);
}

void arena_fault_alloc(long n)
{
	arena__fault_arm(&alloc_fault, n);
}

long arena_fault_alloc_count(void)
{
	return arena__fault_count(&alloc_fault);
}

int arena_fault_alloc_fired(void)
{
	return arena__fault_fired(&alloc_fault);
}
