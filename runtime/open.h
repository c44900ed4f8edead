/* open.h - the public arena handle (include/arena.h), for the library's own
 * callers that need its parts (the CLI's `arena load` reads the stats). */
#ifndef ARENA_RUNTIME_OPEN_H
#define ARENA_RUNTIME_OPEN_H

#include <pthread.h>
#include <stdint.h>

#include "../engine/engine.h"
#include "arena.h"
#include "load.h"
#include "reread.h"

/* Invariants:
 *   1. A handle is live while it is in open.c's registry; refs counts the
 *      opener's reference (until arena_close), arena_retain's, and one per
 *      call in progress. The last reference frees everything.
 *   2. mu guards e and closed; every call that touches the engine or asks
 *      where a block is holds it. closed: e is NULL and stays NULL. */
struct arena {
	arena_backend *be;        /* owned */
	arena_pin_budget budget;  /* the ledger every pinned byte goes through */
	arena_model *m;           /* owned */
	arena_engine *e;          /* owned; NULL once closed */
	arena_slab_reader *rr;    /* images: re-reads blocks the engine demotes */
	arena_engine_opts eo;     /* the engine's options (profile: cost) */
	double *cost;             /* a profile read from a file */
	char *path;               /* what it was opened from (traces name it) */
	int is_image;
	uint64_t piece_size;      /* the pieces it was opened in (auto resolved); 0 whole blocks */
	unsigned depth;           /* the ring's depth as the caller gave it (0: the ring's rule's) */
	uint64_t host_budget;     /* the host memory the weights may take (0: no limit) */
	uint64_t staging;         /* of it, the disk tier's staging (an image's) */
	pthread_mutex_t mu;
	int mu_init;
	int closed;
	long refs;                /* under open.c's registry lock */
};

/* arena_open with the loader's tuning taken from `tune` (threads, slot size,
 * slots, I/O mode; NULL = defaults), also returning the load's stats (st may
 * be NULL) and honouring `cancel` (may be NULL). */
int arena__open_tuned(const char *path, const arena_open_options *opt, const arena_load_opts *tune, arena **out,
		      arena_load_stats *st, volatile sig_atomic_t *cancel);

/* The handle behind a const one: the lock and the count change under a
 * const view (the layout does not). */
static inline arena *arena__mut(const arena *a)
{
	return (arena *)(uintptr_t)a;
}

/* The engine's options from the public ones (every 0 the default): 0 or
 * USAGE (an unknown mode or flag, depth or keep_last over 64, a bad rate). */
int arena__engine_opts(const arena_open_options *o, arena_engine_opts *e);

/* Free the engine and the model now (the CLI's `load` measures limits after
 * the load with the device memory given back); the handle is closed for
 * everything but arena_close (and retain and release). */
void arena__drop_model(arena *a);

/* A reference for the duration of a call: 0, or USAGE for a handle that is
 * not live; arena__leave drops it. */
int arena__enter(const arena *a);
void arena__leave(const arena *a);
/* arena__enter, and USAGE "`what`: the arena is closed" (the reference
 * dropped again) after arena_close: every public call but retain, release
 * and close enters so (include/arena.h, Lifetime). */
int arena__enter_open(const arena *a, const char *what);

#endif
