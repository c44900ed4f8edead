/* mapguard.h - reads through a file's mapping that end in an error, not a
 * SIGBUS, when the file shrinks under them.
 *
 * A page of a mapped file past its end (the file was truncated after it was
 * mapped: rewritten in place, cut by another program) raises SIGBUS on the
 * thread that touches it, and the process dies with nothing said. Every
 * read of a mapped input's bytes runs inside arena_map_guard_run: a SIGBUS
 * at an address of the guarded mapping, on the thread that runs the guard,
 * returns from the guard instead. The handler is the process's SIGBUS
 * action while guards are in use; any other SIGBUS (another address, an
 * unguarded thread, one sent by kill) goes on to the action that was there
 * before it (the default kills the process, as without arena).
 *
 * What runs inside a guard must read the mapping and write plain memory
 * only: no locks taken, nothing allocated, no threads started, since a
 * fault leaves it at any point. */
#ifndef ARENA_COMMON_MAPGUARD_H
#define ARENA_COMMON_MAPGUARD_H

#include <stddef.h>
#include <stdint.h>

/* A mapping whose bytes are read: [base, base + len) of the file `label`. */
typedef struct arena_map_region {
	const void *base;
	uint64_t len;
	const char *label;
} arena_map_region;

/* Run fn(ctx) on this thread, guarding reads of the n regions at r. Returns
 * fn's result, or INPUT_CHANGED ("<label>: file changed while reading: ...")
 * when a read of a region faulted: its file is shorter than when it was
 * mapped. Guards nest (the innermost one that covers the address returns).
 * IO when the handler cannot be installed. */
int arena_map_guard_run(const arena_map_region *r, size_t n, int (*fn)(void *ctx), void *ctx);

#endif
