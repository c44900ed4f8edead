/* open.h - the public arena handle (include/arena.h), for the library's own
 * callers that need its parts (the CLI's `arena load` reads the stats). */
#ifndef ARENA_LOADER_OPEN_H
#define ARENA_LOADER_OPEN_H

#include "arena.h"
#include "load.h"

struct arena {
	arena_backend *be;        /* owned */
	arena_pin_budget budget;  /* the ledger every pinned byte goes through */
	arena_model *m;           /* owned */
	int is_image;
};

/* arena_open with the loader's tuning taken from `tune` (threads, slot size,
 * slots, I/O mode; NULL = defaults), also returning the load's stats (st may
 * be NULL) and honouring `cancel` (may be NULL). */
int arena__open_tuned(const char *path, const arena_open_options *opt, const arena_load_opts *tune, arena **out,
		      arena_load_stats *st, volatile sig_atomic_t *cancel);

#endif
