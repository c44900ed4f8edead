/* budget.h - the pinned host memory ledger.
 *
 * Pinned (page-locked) memory is taken from what the OS will really allow:
 * the smallest of RLIMIT_MEMLOCK (when not unlimited), MemAvailable from
 * /proc/meminfo, and cgroup v2 memory.max minus memory.current (when a limit
 * is set), minus a reserve left for everything else; a user cap can only
 * lower it. Every pinned byte in arena is taken from one ledger and given
 * back to it; over budget is an answer (BUDGET), never a crash: callers fall
 * back to pageable memory and a bounce ring. */
#ifndef ARENA_BUDGET_H
#define ARENA_BUDGET_H

#include <stdatomic.h>
#include <stdint.h>

typedef struct arena_pin_budget {
	uint64_t limit;         /* bytes that may be pinned in all */
	atomic_uint_fast64_t used;
	uint64_t peak;          /* most ever used (approximate under races) */
	/* What each source said (UINT64_MAX = no limit from it). */
	uint64_t memlock, mem_available, cgroup_free, reserve, user_cap;
	char bound_by[32];      /* which source set the limit */
} arena_pin_budget;

/* Default reserve: 2 GiB or 10% of MemAvailable, whichever is larger. */
#define ARENA_PIN_RESERVE_AUTO UINT64_MAX

/* Probe the system. `user_cap` 0 = none; `reserve` ARENA_PIN_RESERVE_AUTO =
 * default. `root` is "" for the real system, or a folder holding fake
 * proc/meminfo, proc/self/cgroup and sys/fs/cgroup/... files (tests). */
int arena_pin_budget_probe(arena_pin_budget *b, uint64_t user_cap, uint64_t reserve, const char *root);

/* Take `bytes` from the ledger: 0, or ARENA_E(BUDGET) (nothing taken). */
int arena_pin_budget_take(arena_pin_budget *b, uint64_t bytes);
/* Give back bytes taken before. */
void arena_pin_budget_give(arena_pin_budget *b, uint64_t bytes);

/* Pin `bytes` of host memory at p with backend be (host_register: p must
 * be writable) while the ledger allows: 1 pinned (taken from b), 0 left
 * pageable (nothing taken, no error left: copies from it are slower, not
 * wrong). b NULL: never pinned. arena_pin_budget_unregister undoes a 1. */
struct arena_backend;
int arena_pin_budget_register(arena_pin_budget *b, struct arena_backend *be, void *p, uint64_t bytes);
void arena_pin_budget_unregister(arena_pin_budget *b, struct arena_backend *be, void *p, uint64_t bytes);

#endif
