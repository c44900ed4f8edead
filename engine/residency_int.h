/* residency_int.h - what the planner's parts (residency.c by bytes,
 * residency_timed.c with a profile) and the engine's (engine_int.h) share:
 * the ring's state and rules, the timed dry run and greedy, plan
 * derivation. Not installed; see engine.h for what they do. */
#ifndef ARENA_RESIDENCY_INT_H
#define ARENA_RESIDENCY_INT_H

#include <stddef.h>
#include <stdint.h>

#include "engine.h"

#define ARENA__MAX_DEPTH ARENA_ENGINE_MAX_DEPTH
#define ARENA__MAX_KEEP 64u

/* "12.34 GiB" into one of 4 rotating buffers (per thread). */
const char *arena__fmtb(uint64_t n);
/* Slots of the ring for o: depth + 1 (+ keep_last in train). */
unsigned arena__ring_slots(const arena_engine_opts *o);
/* The least a ring slot may be in o's mode (engine.h: min_slot). */
uint64_t arena__min_slot(const arena_engine_opts *o);
/* o carries a compute profile the planner can use (cost and a rate). */
int arena__have_profile(const arena_engine_opts *o);

/* The ring: one device buffer of `bytes` holding streamed blocks placed
 * first in, first out (engine.h, "The ring"). Per block (arrays of the
 * layout's size): present, off, pending; `order` lists the present blocks,
 * oldest first. */
typedef struct arena__ring {
	uint64_t bytes, head;
	uint8_t *present;
	uint64_t *off;
	unsigned *pending;
	uint32_t *order;
	size_t n_order;
	uint64_t *span; /* scratch of arena__ring_place: the pending blocks' [lo, hi), by offset */
	size_t n_span;  /* pairs span holds (and as many more, a sort's) */
} arena__ring;

/* 0, or -1 (nothing allocated) when out of memory. */
int arena__ring_init(arena__ring *r, size_t n);
void arena__ring_release(arena__ring *r);
void arena__ring_reset(arena__ring *r, size_t n, uint64_t bytes);
/* Where block b would go: 0 with *at (*reuse = 1 if it is in the ring
 * already), or 1 when it cannot go now (a block it would overwrite is
 * pending, or it is larger than the ring). `in_order`: a fetch ahead of
 * its use in a ring that keeps its order (arena__ring_in_order), which
 * goes only where that order puts it (the head, or 0 when it does not fit
 * before the end); else the first place that overwrites nothing pending. */
int arena__ring_place(const arena__ring *r, const arena_layout *l, uint32_t b, int in_order, uint64_t *at,
		      int *reuse);
/* Whether fetches ahead keep the ring's order: training in pieces, where
 * a backward holds a block's pieces at once (arena__ring_place). */
static inline int arena__ring_in_order(const arena_engine_opts *o)
{
	return o->mode == ARENA_MODE_TRAIN && o->min_slot;
}
/* Put block b at `at` (from arena__ring_place): the blocks it overlaps leave
 * the ring, each passed to evict(ctx, q) first; the first error of evict is
 * returned, the ring's state is updated either way. */
int arena__ring_take(arena__ring *r, const arena_layout *l, uint32_t b, uint64_t at, int (*evict)(void *, uint32_t),
		     void *ctx);

/* Scratch of the timed dry run (arrays sized at init). */
typedef struct arena__timed {
	arena__ring r;
	double *fill_t, *rel_t; /* per block: its copy is done, its last release */
	double *gain;           /* per block: the greedy's gain per byte */
	uint8_t *swappable;     /* per block: chosen by the greedy, may be swapped */
	uint32_t *cands;         /* the greedy's candidates of a round */
	uint32_t *seq;          /* the streamed entries' blocks */
	arena_plan_span *spans; /* when not NULL: every copy and entry of the run, in time */
	size_t n_spans;
	/* When cl_b is not NULL (3 x n_sched entries; cp_of of the layout's
	 * blocks): every copy of the run in order (its block, start, end) and
	 * the compute the steady step waited for it (cl_stall); cp_of[b] is
	 * block b's latest copy. */
	uint32_t *cl_b, *cp_of;
	double *cl_t0, *cl_t1, *cl_stall;
	double *cl_left; /* the stall a period of copies (at its first copy) has left to remove */
	uint32_t *cl_per; /* a copy's period: the first copy of the copy stream's busy run it is in */
	struct arena__pick *picks; /* the greedy's candidates of a round, sorted (of the layout's blocks) */
	size_t n_cl;
	uint8_t *cl_step; /* a copy's step: the step (0, 1, 2) of the entry it was fetched for */
	double *cl_sum;   /* per block: its steady copies' savings together (the greedy's) */
	uint32_t *cl_head, *cl_next; /* per block its last steady copy, per copy the one before it */
	uint8_t *alt;     /* per block: the other greedy's resident set (greedy_stalls) */
} arena__timed;

/* A candidate of the greedy past ARENA__GREEDY_SWAP_MAX blocks. */
typedef struct arena__pick {
	double per_byte; /* its estimated gain per byte */
	uint64_t bytes;
	uint32_t b, c; /* the block, the copy its gain is from */
	uint32_t pos;  /* its place in the greedy's order (ties) */
} arena__pick;

int arena__timed_init(arena__timed *t, size_t n, size_t n_sched);
/* The copy log (cl_* above) and the greedy's picks for a layout of n
 * blocks, a schedule of n_sched: 0, or -1 (out of memory; t as it was). */
int arena__timed_log(arena__timed *t, size_t n, size_t n_sched);

/* Threads the timed greedy may use for a layout of many blocks (pieces):
 * 0 = as many as there are cores, at most 8; tests set 1 to compare. */
extern unsigned arena__greedy_threads;
/* Which gain rules the greedy past ARENA__GREEDY_SWAP_MAX blocks tries in
 * training (greedy_stalls): 0 both (the default), 1 a block's best copy
 * only, 2 the sum of its steady copies where more only. For the tests. */
extern unsigned arena__greedy_rules;
/* Nonzero: no refinement (arena__refine_swaps) after the greedy. For the tests. */
extern unsigned arena__no_refine;
void arena__timed_release(arena__timed *t);
/* Predicted seconds of a steady step of `sched` with the blocks in `res`
 * resident under o's profile; negative when a block cannot be placed. */
double arena__timed_run(const arena_layout *l, const arena_engine_opts *o, const uint32_t *sched, const uint8_t *bwd,
			size_t n_sched, const uint8_t *res, unsigned slots, arena__timed *t);

/* Past this many blocks (pieces), the timed greedy does not time each
 * candidate (a timed run of the whole schedule per candidate per round: 457
 * pieces took 26 s, 1,000 over a minute) but promotes, a batch a round, the
 * blocks whose copies the compute waits for, in at most
 * ARENA__GREEDY_ROUNDS timed runs, and tries fewer slot sizes; the plan by
 * bytes is a candidate too, so the plan is never predicted slower than it. */
#define ARENA__GREEDY_SWAP_MAX 128
#define ARENA__GREEDY_ROUNDS 16

/* Past ARENA__GREEDY_SWAP_MAX blocks, after the plan is chosen: swaps of a
 * resident block for a streamed one, each timed (residency_timed.c). A round
 * times the plan (its copy log: what each streamed block's steady copies
 * would save at most), each resident block that could go (no larger than a
 * slot) demoted, and then the pairs of the REFINE_Q streamed blocks that
 * would save most per byte and the REFINE_R resident ones that lose least,
 * most promising first; the pair that shortens the step most is taken (the
 * set still fits `budget`). Until a round finds none, at most REFINE_ROUNDS
 * rounds and REFINE_RUNS timed runs in all. Returns the predicted step of
 * res (changed in place); -2 out of memory, -1 a block cannot be placed. */
#define REFINE_Q 8
#define REFINE_R 8
#define REFINE_ROUNDS 12
#define REFINE_RUNS 1200
double arena__refine_swaps(const arena_layout *l, const arena_engine_opts *o, const arena_residency_plan *p,
			   const uint32_t *order, size_t k, uint8_t *res, uint64_t budget, arena__timed *ts);

/* With a profile: from the resident set `cand` of plan p's candidate slot
 * size (room bytes left), make blocks resident one at a time, each the one
 * that shortens the predicted step most per byte (residency_timed.c); the
 * predicted step of the result, negative when a block could not be placed.
 * order/k: the scheduled blocks in the order first needed; gain and ts:
 * scratch. */
double arena__greedy_timed(const arena_layout *l, const arena_engine_opts *o, const arena_residency_plan *p,
			   const uint32_t *order, size_t k, uint8_t *cand, uint64_t *room, double *gain, arena__timed *ts);

/* Recompute a plan's derived fields from p->resident (p->sched, slots and
 * depth set). `seq` (n_sched entries) and `r` (of the layout's blocks) are
 * scratch. */
void arena__plan_derive(const arena_layout *l, arena_residency_plan *p, uint32_t *seq, arena__ring *r);

#endif
