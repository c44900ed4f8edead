/* stager.h - the disk tier's reads, ahead of use.
 *
 * A block in the disk tier (no device copy, no host copy) is read from its
 * image every time it is streamed. The stager reads it before the engine
 * copies it: a thread of its own reads the parts the engine says it will
 * copy next, in that order, into a pool of staging slots (pinned while the
 * pinned budget allows), while the device computes and the copy stream
 * moves earlier parts; the engine takes each part when it copies it, and
 * the slot is read into again once the copies from it are done (an event
 * the engine records after them). Reading is the disk's time, copying the
 * bus's and computing the device's: with the reads on their own thread the
 * three overlap, and the caller's thread (which launches the work) does not
 * wait for the disk unless the disk is behind.
 *
 * The engine names what it wants next with arena_stager_want: the part it
 * copies now first, then the parts of the disk blocks its schedule streams
 * after it. A new list replaces the last; slots already holding (or
 * reading) a part of the new list keep it, the others are read into anew.
 * Every part is read through the source's checked reads (checksums and
 * coded structure checked before the bytes are used): a read that fails is
 * the error of the take that wanted it, never of a part the engine no
 * longer wants.
 *
 * Without a thread (ARENA_DISK_READAHEAD=0, or when one cannot be started)
 * the take reads its part itself: the same bytes, no overlap. */
#ifndef ARENA_STAGER_H
#define ARENA_STAGER_H

#include <stddef.h>
#include <stdint.h>

#include "../device/backend.h"
#include "../device/budget.h"
#include "engine.h"

struct arena_wire;

typedef struct arena_stage_part {
	uint32_t block;
	uint64_t off, len; /* raw bytes [off, off + len) of the block */
	int coded;         /* read coded: segments [seg0, seg1) of the block's plan, which cover
			    * [off, off + len) */
	size_t seg0, seg1;
} arena_stage_part;

/* Where parts are read from (the engine's options). */
typedef struct arena_stager_src {
	arena_reread_fn whole;          /* a whole block */
	arena_reread_part_fn part;      /* or a part of one (may be NULL: whole blocks only) */
	int (*wire)(void *ctx, uint32_t block, uint64_t off, uint64_t len, struct arena_wire *w);
	void *ctx;
	/* per block, the coded form's plan (m->mem[b].disk_wire) of blocks read coded */
	struct arena_wire *const *plans;
	const arena_layout *l; /* the blocks (names for messages) */
} arena_stager_src;

enum { ARENA_STAGER_MAX_SLOTS = 64 };

typedef struct arena_stager arena_stager;

/* n_slots (1 to ARENA_STAGER_MAX_SLOTS) slots of slot_bytes each (4096-aligned, pinned within budget
 * (may be NULL) and registered with be), each with an event; a reader
 * thread when `threaded`. NOMEM, or the backend's error. */
int arena_stager_create(arena_backend *be, arena_pin_budget *budget, const arena_stager_src *src,
			uint64_t slot_bytes, unsigned n_slots, int threaded, arena_stager **out);
/* Stops the thread (after its read), waits for every slot's copies, frees. */
void arena_stager_free(arena_stager *s);

/* The parts to read, in the order they will be taken (replaces the last
 * list). Each part fits a slot. NOMEM. */
int arena_stager_want(arena_stager *s, const arena_stage_part *parts, size_t n);
/* The first part of the list not yet taken, staged: waits for its read
 * (or, without a thread, reads it). *buf holds its raw bytes, or for a
 * coded part *w its coded form (w->buf in the slot); both valid until
 * arena_stager_put. Errors: the read's (the source's message), USAGE when
 * the list is empty. */
int arena_stager_take(arena_stager *s, unsigned *slot, uint8_t **buf, struct arena_wire **w);
/* Its slots. */
unsigned arena_stager_slots(const arena_stager *s);
/* The event to record after the copies from a taken slot. */
arena_event *arena_stager_event(arena_stager *s, unsigned slot);
/* Copies from the slot are queued and its event recorded after them: the
 * slot is read into again once the event is done. */
void arena_stager_put(arena_stager *s, unsigned slot);

/* The source is not shared: a caller reading from it outside the stager
 * (a host copy for a demoted block) holds this lock around its read. */
void arena_stager_lock(arena_stager *s);
void arena_stager_unlock(arena_stager *s);

typedef struct arena_stager_stats {
	double wait_s;      /* host seconds takes waited for reads */
	uint64_t read_bytes; /* bytes read into slots (coded parts: coded) */
	uint64_t wasted;    /* parts read and dropped unused (the list changed) */
	uint64_t taken, ready; /* parts taken; of which staged before the take asked */
} arena_stager_stats;
void arena_stager_stats_get(arena_stager *s, arena_stager_stats *out);

#endif
