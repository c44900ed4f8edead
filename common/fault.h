/* fault.h - an injectable Nth-call failure, the one idiom of the allocation,
 * read, write and host-share injections (arena_fault_alloc, _read, _write,
 * _share: the tests' switches). Armed with n > 0, the nth check after
 * arming fails, once; 0 disarms. Every check is counted, armed or not (the
 * count since arming is what a test reads to size its sweep). */
#ifndef ARENA_COMMON_FAULT_H
#define ARENA_COMMON_FAULT_H

#include <stdatomic.h>

typedef struct arena__fault {
	atomic_long at;    /* the check that fails; 0: none */
	atomic_long count; /* checks since arming */
} arena__fault;

static inline void arena__fault_arm(arena__fault *f, long n)
{
	atomic_store(&f->count, 0);
	atomic_store(&f->at, n);
}

/* 1 when this check is the one that must fail. */
static inline int arena__fault_hit(arena__fault *f)
{
	const long at = atomic_load_explicit(&f->at, memory_order_relaxed);
	return atomic_fetch_add_explicit(&f->count, 1, memory_order_relaxed) + 1 == at && at > 0;
}

/* Whether the armed failure happened. */
static inline int arena__fault_fired(arena__fault *f)
{
	const long at = atomic_load(&f->at);
	return at > 0 && atomic_load(&f->count) >= at;
}

static inline long arena__fault_count(arena__fault *f)
{
	return atomic_load(&f->count);
}

#endif
