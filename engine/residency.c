/* residency.c - the residency planner by bytes: budgets and floors, piece
 * sizes, the host/disk split, the ring's rules and its dry run, plans
 * (arena_residency_plan_make; with a profile it hands the choice of resident
 * blocks to the timed greedy, residency_timed.c). Pure: no device. See
 * engine.h for what it plans.
 *
 * Invariants:
 *   1. Pure functions of their arguments: no device, no state kept between
 *      calls (but arena__greedy_threads, a test setting), so the engine, the
 *      CLI and a look's thread may plan at once.
 *   2. The ring here is the one the engine runs (arena__ring_place and
 *      arena__ring_take): a block is placed at the head, or at the first
 *      place from the start where it overwrites no pending block, and its
 *      dry run fetches at most a step ahead, as prefetch does.
 *   3. A plan made fits its budget (need_bytes <= budget), or is refused
 *      with BUDGET and min_need_bytes says what the smallest would need;
 *      the globals are always resident and never scheduled. */
#include "residency_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "../common/alloc.h"
#include "../common/err.h"
#include "../common/units.h"
#include "../formats/layout.h"
#include "stager.h"

/* --- helpers --------------------------------------------------------------- */

/* "12.34 GiB" into one of 4 rotating buffers (per thread). */
const char *arena__fmtb(uint64_t n)
{
	static _Thread_local char buf[4][32];
	static _Thread_local unsigned k;
	return arena_size_str(n, buf[k++ & 3], sizeof(buf[0]));
}

int arena_block_is_globals(const arena_layout *l, uint32_t b)
{
	return l->blocks[b].container == NULL;
}

void arena_engine_opts_default(arena_engine_opts *o)
{
	*o = (arena_engine_opts){.mode = ARENA_MODE_SAMPLE,
				 .headroom = ARENA_ENGINE_AUTO,
				 .reserve = ARENA_ENGINE_AUTO,
				 .depth = ARENA_ENGINE_DEFAULT_DEPTH,
				 .keep_last = 1,
				 .hysteresis = ARENA_ENGINE_DEFAULT_HYSTERESIS};
}

size_t arena_residency_max_sched(const arena_layout *l)
{
	size_t k = 0;
	for (size_t b = 0; b < l->n_blocks; b++)
		k += !arena_block_is_globals(l, (uint32_t)b);
	return 8 * k;
}

static unsigned opt_depth(const arena_engine_opts *o)
{
	return o->depth ? o->depth : ARENA_ENGINE_DEFAULT_DEPTH;
}

unsigned arena__ring_slots(const arena_engine_opts *o)
{
	return opt_depth(o) + 1 + (o->mode == ARENA_MODE_TRAIN ? o->keep_last : 0);
}

/* The least a ring slot may be in o's mode (engine.h: min_slot). */
uint64_t arena__min_slot(const arena_engine_opts *o)
{
	return o->mode == ARENA_MODE_TRAIN ? o->min_slot : 0;
}

void arena_residency_budget(uint64_t total, uint64_t free_bytes, const arena_engine_opts *o, uint64_t *budget,
			    uint64_t *headroom, uint64_t *reserve)
{
	uint64_t h = o->headroom, w = o->reserve;
	if (h == ARENA_ENGINE_AUTO) {
		uint64_t base = o->cap && o->cap < total ? o->cap : total;
		h = base / 50;
		if (h > (512ull << 20))
			h = 512ull << 20;
	}
	/* what the cap leaves past `other` (the context), and what the device
	 * has free past what the rest already holds: both less the headroom */
	uint64_t capleft = UINT64_MAX;
	if (o->cap)
		capleft = o->cap > arena_size_add(o->other, h) ? o->cap - o->other - h : 0;
	/* (what the plan leaves free: the headroom, or the share left to
	 * other programs when that is more) */
	const uint64_t slack = o->share > h ? o->share : h;
	uint64_t physleft = free_bytes > slack ? free_bytes - slack : 0;
	uint64_t left = capleft < physleft ? capleft : physleft;
	if (w == ARENA_ENGINE_AUTO) {
		w = o->mode == ARENA_MODE_TRAIN ? (4ull << 30) : (1ull << 30);
		if (w > left / 4)
			w = left / 4;
	}
	if (w == ARENA_ENGINE_REST_UNKNOWN)
		w = 0; /* arena_residency_budget_unknown takes it from there */
	uint64_t rest = o->rest;
	uint64_t from_cap = rest > w ? rest : w;        /* the rest at its peak, under the cap */
	uint64_t from_free = w > rest ? w - rest : 0;   /* what it will take of free memory */
	uint64_t b = capleft > from_cap ? capleft - from_cap : 0;
	uint64_t bp = physleft > from_free ? physleft - from_free : 0;
	*headroom = h;
	*reserve = w;
	*budget = b < bp ? b : bp;
}

uint64_t arena_residency_rest_margin(uint64_t peak, uint64_t base)
{
	uint64_t fixed = base / 64;
	if (fixed > (64ull << 20))
		fixed = 64ull << 20;
	return peak / 32 + fixed;
}

uint64_t arena_residency_budget_unknown(const arena_layout *l, const arena_engine_opts *o, uint64_t b0, uint64_t stage)
{
	uint64_t all = 0;
	for (size_t b = 0; b < l->n_blocks; b++)
		all += l->blocks[b].bytes;
	if (all <= b0 / 2)
		return b0 / 2;
	arena_engine_opts q = *o;
	q.cost = NULL; /* the least memory; a profile only chooses within it */
	q.h2d_bytes_per_s = 0;
	arena_residency_plan p;
	int rc = arena_residency_plan_make(l, &q, 0, &p);
	uint64_t need;
	if (rc == ARENA_E(BUDGET)) {
		arena_error_clear();
		need = p.min_need_bytes + stage;
	} else if (rc) {
		arena_error_clear();
		return 0;
	} else { /* nothing streams at all */
		need = p.need_bytes;
		arena_residency_plan_release(&p);
	}
	return need <= b0 ? need : 0;
}

int arena_residency_floor(const arena_layout *l, const arena_engine_opts *o, uint64_t *vram, uint64_t *weights)
{
	*vram = *weights = 0;
	arena_engine_opts q = *o;
	q.cost = NULL; /* the floor is the least memory; a profile only chooses within it */
	q.h2d_bytes_per_s = 0;
	q.cap = 0;
	arena_residency_plan p;
	int rc = arena_residency_plan_make(l, &q, 0, &p);
	uint64_t need;
	if (rc == ARENA_E(BUDGET)) {
		arena_error_clear();
		need = p.min_need_bytes;
	} else if (rc) {
		return rc;
	} else { /* nothing to place */
		need = p.need_bytes;
		arena_residency_plan_release(&p);
	}
	uint64_t b, h, w, lo = need, hi = need ? need : 1;
	for (;;) { /* the budget grows with the device: double until it holds need */
		arena_residency_budget(hi, hi, &q, &b, &h, &w);
		if (b >= need)
			break;
		if (hi == UINT64_MAX) /* the sizes given (a reserve, a headroom) leave too little of any device */
			return arena_errorf(ARENA_E(BUDGET), "no device is large enough for %s of weights with these options",
					    arena__fmtb(need));
		lo = hi;
		hi = hi > UINT64_MAX / 2 ? UINT64_MAX : hi * 2;
	}
	while (lo < hi) { /* the least hi whose budget holds need */
		uint64_t mid = lo + (hi - lo) / 2;
		arena_residency_budget(mid, mid, &q, &b, &h, &w);
		if (b >= need)
			hi = mid;
		else
			lo = mid + 1;
	}
	arena_residency_budget(hi, hi, &q, &b, &h, &w);
	if ((rc = arena_residency_plan_make(l, &q, b, &p)))
		return rc == ARENA_E(BUDGET) ? arena_errorf(ARENA_E_INTERNAL, "engine: no plan at the floor found (%s)",
							    arena__fmtb(hi))
					     : rc;
	arena_residency_plan_release(&p);
	*vram = hi;
	*weights = need;
	return 0;
}

/* o planning by bytes alone (no profile, the mode's default schedule): what
 * fits, not what is fastest. */
static arena_engine_opts by_bytes(const arena_engine_opts *o)
{
	arena_engine_opts q = *o;
	q.cost = NULL;
	q.h2d_bytes_per_s = 0;
	q.sched = NULL;
	q.n_sched = 0;
	return q;
}

uint64_t arena_residency_largest_block(const arena_layout *l)
{
	uint64_t big = 0;
	for (size_t b = 0; b < l->n_blocks; b++)
		if (l->blocks[b].container && l->blocks[b].bytes > big)
			big = l->blocks[b].bytes;
	return big;
}

/* The ring's rule (engine.h, arena_residency_ring). A caller holds blocks
 * while it acquires the next: in sample mode, whole blocks none (a block is
 * released before the next is acquired: 2 slots), pieces of a block one
 * (its call holds a piece while a module acquires the next; held anywhere
 * in the ring, it leaves room for a slot's bytes only in a ring of 3);
 * in train mode a recompute holds a whole block past the next block's
 * recompute (3 slots), and in pieces all of a block's pieces until its
 * backward: the ring holds the largest block and one piece more. */
int arena_residency_ring(const arena_layout *l, int pieces, unsigned depth, arena_engine_opts *o)
{
	uint64_t hold = 0, big = 0, run = 0;
	for (size_t b = 0; b < l->n_blocks; b++) {
		const arena_block *k = &l->blocks[b];
		if (!k->container)
			continue;
		const arena_block *prev = b ? &l->blocks[b - 1] : NULL;
		int same = prev && prev->container && prev->index == k->index && !strcmp(prev->container, k->container);
		run = same ? run + k->bytes : k->bytes;
		hold = run > hold ? run : hold;
		big = k->bytes > big ? k->bytes : big;
	}
	const int train = o->mode == ARENA_MODE_TRAIN, split = pieces && hold > big;
	const unsigned kl = train ? o->keep_last : 0;
	uint64_t per = split ? (hold + big - 1) / big : 1; /* slots of the largest piece a block takes */
	uint64_t need = train ? (per + 1 > 3 ? per + 1 : 3) : split ? 3 : 2; /* the least slots */
	uint64_t least = need > 2 + (uint64_t)kl ? need - 1 - kl : 1;  /* the least depth */
	uint64_t dflt = ARENA_ENGINE_DEFAULT_DEPTH;
	if (train && split && per > dflt) /* a block's pieces, keep_last on top */
		dflt = per < ARENA__MAX_DEPTH ? per : ARENA__MAX_DEPTH;
	o->min_slot = pieces ? big : 0;
	const char *why = !train ? "sampling in pieces holds a piece while its block's next one is acquired"
		: split ? "training in pieces holds a block's pieces from its recompute to its backward"
			: "training holds a block from its recompute to its backward, past the next block's recompute";
	char extra[128] = "";
	if (train && split)
		snprintf(extra, sizeof(extra), " (the largest block, %s, and a piece more)", arena__fmtb(hold));
	if (least > ARENA__MAX_DEPTH)
		return arena_errorf(ARENA_E_USAGE,
				    "pieces of %s are too small to train: %s, a ring of %llu slots of %s%s, over the %u "
				    "a ring may have: give a larger piece size",
				    arena__fmtb(big), why, (unsigned long long)need, arena__fmtb(big), extra,
				    ARENA__MAX_DEPTH + 1);
	if (depth && depth < least)
		return arena_errorf(ARENA_E_USAGE,
				    "depth %u is too small: %s, so the ring needs %llu slots%s%s and depth %u%s gives %u; "
				    "give depth %llu or more, or leave it unset",
				    depth, why, (unsigned long long)need, pieces ? " of the largest piece" : "", extra, depth,
				    kl ? " with keep_last" : "", depth + 1 + kl, (unsigned long long)least);
	o->depth = depth ? depth : (unsigned)(dflt > least ? dflt : least);
	return 0;
}

/* Whether l in pieces of `piece` has a plan under budget: 1, 0 (BUDGET,
 * cleared), or an error. */
static int pieces_fit(const arena_layout *l, const arena_engine_opts *q, uint64_t budget, uint64_t piece)
{
	arena_layout *pl;
	int rc = arena_layout_pieces(l, piece, &pl, NULL);
	if (rc)
		return rc;
	arena_residency_plan t;
	arena_engine_opts r = *q; /* the ring those pieces need */
	if (arena_residency_ring(pl, 1, q->depth, &r)) {
		arena_layout_free(pl);
		arena_error_clear(); /* a depth given too small for them: they do not run */
		return 0;
	}
	rc = arena_residency_plan_make(pl, &r, budget, &t);
	arena_layout_free(pl);
	if (rc == 0) {
		arena_residency_plan_release(&t);
		return 1;
	}
	if (rc != ARENA_E(BUDGET))
		return rc;
	arena_error_clear();
	return 0;
}

int arena_residency_piece_fit(const arena_layout *l, const arena_engine_opts *o, uint64_t budget, uint64_t *piece)
{
	*piece = 0;
	const uint64_t big = arena_residency_largest_block(l);
	const arena_engine_opts q = by_bytes(o);
	uint64_t top = 1;
	while (top <= big / 2)
		top <<= 1; /* the largest power of two below the largest block */
	if (top >= big)
		top >>= 1;
	for (int k = 0; k < 6 && top >> k; k++) {
		uint64_t p = top >> k;
		int rc = pieces_fit(l, &q, budget, p);
		if (rc < 0)
			return rc;
		if (rc) {
			*piece = p;
			return 0;
		}
	}
	return 0;
}

uint64_t arena_residency_host_copies(uint64_t host_budget, uint64_t staging)
{
	return host_budget == UINT64_MAX ? host_budget : host_budget > staging ? host_budget - staging : 0;
}

uint64_t arena_residency_stage_slot(const arena_layout *l, uint64_t region)
{
	const uint64_t part = arena__disk_part ? arena__disk_part : ARENA_ENGINE_DISK_PART;
	uint64_t slot = 0;
	for (size_t b = 0; b < l->n_blocks; b++) {
		const uint64_t need = l->blocks[b].bytes < part ? l->blocks[b].bytes : part;
		slot = need > slot ? need : slot;
	}
	slot = region > slot ? region : slot;
	return arena_align_up(slot ? slot : 1, 4096);
}

int arena_residency_staging(uint64_t host_budget, uint64_t want, uint64_t slot, uint64_t fixed, uint64_t *slots)
{
	*slots = 0;
	slot = slot ? slot : 1;
	/* The most: want, in whole slots (two at least, as the stager makes) */
	uint64_t most = want / slot;
	most = most < 2 ? 2 : most > ARENA_STAGER_MAX_SLOTS ? ARENA_STAGER_MAX_SLOTS : most;
	const uint64_t least = arena_size_add(2 * slot, fixed);
	if (host_budget == UINT64_MAX) {
		*slots = most * slot;
		return 0;
	}
	if (host_budget && host_budget < least) {
		char s1[32], s2[32], s3[32], s4[32];
		return arena_errorf(ARENA_E(BUDGET),
				    "a host budget of %s does not hold the disk tier's least staging, %s (2 slots of %s "
				    "and %s of chunk buffers for its reads): give at least that, or 0 for no host copies",
				    arena_size_str(host_budget, s1, sizeof(s1)), arena_size_str(least, s2, sizeof(s2)),
				    arena_size_str(slot, s3, sizeof(s3)), arena_size_str(fixed, s4, sizeof(s4)));
	}
	const uint64_t share = host_budget / 4;
	uint64_t n = share > fixed ? (share - fixed) / slot : 0;
	n = n < 2 ? 2 : n > most ? most : n;
	*slots = n * slot;
	return 0;
}

/* The host bytes block b's copy takes: host_len[b] (a coded copy) or its
 * slab, rounded up to ARENA_SLAB_ALIGN. */
static uint64_t host_copy(const arena_layout *l, const uint64_t *host_len, size_t b)
{
	return arena_align_up(host_len ? host_len[b] : l->blocks[b].bytes, ARENA_SLAB_ALIGN);
}

int arena_residency_host_split(const arena_layout *l, const arena_residency_plan *p, uint64_t host_budget,
			       uint64_t staging, const uint64_t *host_len, uint8_t *disk, uint64_t *host,
			       uint64_t *disk_b)
{
	uint64_t used = 0, out = 0, want = 0, sched_want = 0;
	memset(disk, 0, l->n_blocks);
	uint8_t *seen = arena_calloc(l->n_blocks ? l->n_blocks : 1, 1);
	size_t *order = arena_calloc(l->n_blocks ? l->n_blocks : 1, sizeof(*order));
	if (!seen || !order) {
		arena_free(seen);
		arena_free(order);
		return arena_errorf(ARENA_E_NOMEM, "out of memory");
	}
	/* The streamed blocks in the order the schedule first needs them, then
	 * the blocks it does not name. */
	size_t n = 0, n_sched = 0;
	for (size_t i = 0; i < p->n_sched + l->n_blocks; i++) {
		size_t b = i < p->n_sched ? p->sched[i] : i - p->n_sched;
		if (b >= l->n_blocks || seen[b] || p->resident[b] || !l->blocks[b].bytes)
			continue;
		seen[b] = 1;
		order[n++] = b;
		const uint64_t sz = host_copy(l, host_len, b);
		want += sz;
		if (i < p->n_sched) {
			n_sched = n;
			sched_want += sz;
		}
	}
	/* No tier when the host copies fit beside the staging (a block that
	 * leaves the device later and finds no room joins the tier, which
	 * then reads through it). */
	if (host_budget != UINT64_MAX && (want > host_budget || host_budget - want < staging)) {
		host_budget = arena_residency_host_copies(host_budget, staging); /* the staging first */
		/* Blocks the schedule does not stream cost no reads a step: they go
		 * first. The rest of the tier is spread through the schedule (a
		 * block joins it when the tier's bytes so far are behind its share
		 * of the bytes streamed so far), so that its reads run ahead while
		 * the copies of the host blocks between them go: a tier at the
		 * schedule's end is read back to back, the copies waiting on the
		 * disk (on the H200, 2026-12-02: 3.1 GB a step at the end of
		 * sampling's schedule took 0.34 s steps to 0.55 s). */
		const uint64_t need = want - host_budget; /* (want + staging > the budget) */
		const uint64_t unsched = want - sched_want;
		const uint64_t rest = need > unsched ? need - unsched : 0; /* the scheduled blocks' share */
		uint64_t pos = 0, tier = 0;
		for (size_t k = 0; k < n; k++) {
			const size_t b = order[k];
			const uint64_t sz = host_copy(l, host_len, b);
			if (k >= n_sched) {
				disk[b] = 1;
				tier += sz;
				continue;
			}
			pos += sz;
			/* the tier's share of the scheduled bytes up to this block's end */
			const double due = (double)rest * (double)pos / (double)sched_want;
			if ((double)tier + (double)sz / 2 < due)
				disk[b] = 1, tier += sz;
			else
				used += sz;
		}
		/* What the budget still holds goes back to host copies, in order, */
		for (size_t k = 0; k < n && used < host_budget; k++) {
			const size_t b = order[k];
			const uint64_t sz = host_copy(l, host_len, b);
			if (disk[b] && used + sz <= host_budget)
				disk[b] = 0, used += sz;
		}
		/* and what it cannot hold goes to the tier, from the schedule's end */
		for (size_t k = n; k-- > 0 && used > host_budget;) {
			const size_t b = order[k];
			const uint64_t sz = host_copy(l, host_len, b);
			if (!disk[b])
				disk[b] = 1, used -= sz;
		}
		for (size_t b = 0; b < l->n_blocks; b++)
			out += disk[b] ? l->blocks[b].bytes : 0;
	} else {
		used = want;
	}
	arena_free(seen);
	arena_free(order);
	if (host)
		*host = used;
	if (disk_b)
		*disk_b = out;
	return 0;
}

int arena_residency_host_plan(const arena_layout *l, const arena_residency_plan *p, uint64_t host_budget, int given,
			      uint64_t slot, uint64_t want, uint64_t fixed, const uint64_t *host_len, uint8_t *disk,
			      arena_host_plan *out)
{
	memset(out, 0, sizeof(*out));
	memset(disk, 0, l->n_blocks);
	if (!given && host_budget < arena_size_add(2 * slot, fixed))
		host_budget = 0; /* the host spares less than the least: the least */
	int rc = arena_residency_staging(host_budget, want, slot, fixed, &out->slots);
	if (rc)
		return rc;
	out->staging = out->slots + fixed;
	out->budget = host_budget ? host_budget : out->staging;
	if ((rc = arena_residency_host_split(l, p, out->budget, out->staging, host_len, disk, &out->host, &out->disk)))
		return rc;
	for (size_t b = 0; b < l->n_blocks; b++)
		out->n_disk += disk[b];
	return 0;
}

uint64_t arena_residency_piece_auto_share(int mode, int coded, uint64_t b0)
{
	return mode != ARENA_MODE_TRAIN ? b0 / 2 : coded ? b0 / 5 * 2 : b0 / 3;
}

int arena_residency_piece_auto(const arena_layout *l, const arena_engine_opts *o, uint64_t budget, uint64_t *piece)
{
	*piece = 0;
	const arena_engine_opts q = by_bytes(o);
	arena_engine_opts w = q; /* whole blocks: their ring (a depth it refuses: as given, refused at open) */
	if (arena_residency_ring(l, 0, q.depth, &w))
		arena_error_clear(), w = q;
	arena_residency_plan t;
	int rc = arena_residency_plan_make(l, &w, budget, &t);
	if (rc == 0) {
		size_t streamed = t.n_streamed;
		arena_residency_plan_release(&t);
		/* All resident: nothing to gain. Training streams whole blocks when
		 * they fit: its ring holds a whole block anyway (a recompute and its
		 * backward hold all of a block's pieces), and a whole block's ring
		 * carries more across the pass's turns; on the H200 at 8 GiB (flux-dev,
		 * hb4, LoRA) the step was 0.799 s in whole blocks, 0.83-0.96 s in
		 * 128 MiB pieces, the bytes moved the same (28.3 GB a step) at a
		 * quarter of the acquires. */
		if (!streamed || o->mode == ARENA_MODE_TRAIN)
			return 0;
	} else if (rc != ARENA_E(BUDGET)) {
		return rc;
	} else {
		arena_error_clear();
	}
	const uint64_t big = arena_residency_largest_block(l);
	if (big < 4)
		return 0;
	/* Sampling: an eighth, the largest power of two no larger (64 MiB for
	 * Flux: on the H200 at 8 GiB, 1 % faster than 128 MiB plain and 1-3 %
	 * coded). Training below the whole-block floor: a third, rounded down to
	 * a multiple of that eighth (192 MiB for Flux): its ring holds a whole
	 * block anyway, each piece costs the adapter an acquire and a bind, and
	 * on the H100 at 6 GiB (flux-dev, LoRA) the step was 0.954 s in 192 MiB
	 * pieces against 0.96-0.99 in 128 and 0.99-1.00 in 64, the bytes moved
	 * the same; a plan over twice the pieces also takes about four times as
	 * long to make. */
	uint64_t unit = 1;
	while (unit <= big / 16)
		unit <<= 1; /* the largest power of two <= big / 8 */
	if (o->mode == ARENA_MODE_TRAIN)
		unit *= big / 3 / unit; /* at least 1: unit is 1 or at most big / 8 */
	if ((rc = pieces_fit(l, &q, budget, unit)) < 0)
		return rc;
	if (rc) {
		*piece = unit;
		return 0;
	}
	uint64_t fit = 0;
	if ((rc = arena_residency_piece_fit(l, o, budget, &fit)))
		return rc;
	*piece = fit < unit ? fit : 0;
	return 0;
}

/* --- the ring (shared by the run and the planner's dry run) ---------------- */

/* The ring is one device buffer of `bytes` (slots x the largest streamed
 * block) holding streamed blocks contiguously, placed first in, first out: a
 * block goes at the head, or at 0 when it does not fit before the end, and
 * evicts the blocks whose bytes it overlaps, none of which may be pending
 * (fetched and not yet released). A block still in the ring when it is
 * needed again is not copied again. Small blocks pack: a ring of 3 x 648 MiB
 * holds seven 270 MiB blocks, so copies run further ahead where blocks are
 * small. The state (arena__ring) is in residency_int.h. */

void arena__ring_release(arena__ring *r)
{
	arena_free(r->present);
	arena_free(r->off);
	arena_free(r->pending);
	arena_free(r->order);
	arena_free(r->span);
	memset(r, 0, sizeof(*r));
}

int arena__ring_init(arena__ring *r, size_t n)
{
	memset(r, 0, sizeof(*r));
	r->present = arena_calloc(n ? n : 1, 1);
	r->off = arena_calloc(n ? n : 1, sizeof(*r->off));
	r->pending = arena_calloc(n ? n : 1, sizeof(*r->pending));
	r->order = arena_calloc(n ? n : 1, sizeof(*r->order));
	r->n_span = n ? n : 1;
	r->span = arena_calloc(4 * r->n_span, sizeof(*r->span)); /* and as much for spans_sort */
	if (r->present && r->off && r->pending && r->order && r->span)
		return 0;
	arena__ring_release(r); /* all or nothing */
	return -1;
}

void arena__ring_reset(arena__ring *r, size_t n, uint64_t bytes)
{
	r->bytes = bytes;
	r->head = 0;
	r->n_order = 0;
	memset(r->present, 0, n ? n : 1);
	memset(r->pending, 0, (n ? n : 1) * sizeof(*r->pending));
}

/* Sort the m [lo, hi) pairs of a by lo: a natural merge sort (tmp: room for
 * m more), linear in the usual case, pairs in the ring's first-in-first-out
 * order that wrap once (two ascending runs). */
static void spans_sort(uint64_t *a, uint64_t *tmp, size_t m)
{
	uint64_t *src = a, *dst = tmp;
	for (;;) {
		size_t runs = 0, i = 0, o = 0;
		while (i < m) {
			size_t j = i + 1;
			while (j < m && src[2 * j] >= src[2 * (j - 1)])
				j++;
			size_t k = j + 1; /* the next run: [j, k) */
			while (k < m && k > j && src[2 * k] >= src[2 * (k - 1)])
				k++;
			if (j >= m)
				k = j;
			size_t x = i, y = j;
			while (x < j || y < k) {
				size_t from = y >= k || (x < j && src[2 * x] <= src[2 * y]) ? x++ : y++;
				dst[2 * o] = src[2 * from];
				dst[2 * o + 1] = src[2 * from + 1];
				o++;
			}
			runs++;
			i = k;
		}
		uint64_t *t = src;
		src = dst;
		dst = t;
		if (runs <= 1)
			break;
	}
	if (src != a)
		memcpy(a, src, 2 * m * sizeof(*a));
}

/* The pending blocks of the ring, [lo, hi) pairs in span[], sorted by lo
 * (blocks in the ring do not overlap, so by hi too); their count. */
static size_t pending_spans(const arena__ring *r, const arena_layout *l)
{
	size_t m = 0;
	int sorted = 1;
	for (size_t i = 0; i < r->n_order; i++) {
		uint32_t q = r->order[i];
		if (!r->pending[q])
			continue;
		if (m && r->off[q] < r->span[2 * (m - 1)])
			sorted = 0;
		r->span[2 * m] = r->off[q];
		r->span[2 * m + 1] = r->off[q] + l->blocks[q].bytes;
		m++;
	}
	if (!sorted)
		spans_sort(r->span, r->span + 2 * r->n_span, m);
	return m;
}

/* Does [lo, lo + sz) overlap a pending block of the ring? (A look at each.) */
static int overlaps_any(const arena__ring *r, const arena_layout *l, uint64_t lo, uint64_t sz)
{
	for (size_t i = 0; i < r->n_order; i++) {
		uint32_t q = r->order[i];
		uint64_t a = r->off[q], z = a + l->blocks[q].bytes;
		if (a < lo + sz && lo < z && r->pending[q])
			return 1;
	}
	return 0;
}

/* Does [lo, lo + sz) overlap one of the m pending spans? A binary search
 * for the first that ends past lo: O(log m), where a look at every block
 * in the ring for every place tried made a placement quadratic in the
 * ring's population (4 KiB pieces, 2026-07: 70 % of a plan's time). */
static int overlaps_pending(const arena__ring *r, size_t m, uint64_t lo, uint64_t sz)
{
	size_t a = 0, z = m;
	while (a < z) {
		size_t mid = a + (z - a) / 2;
		if (r->span[2 * mid + 1] <= lo)
			a = mid + 1;
		else
			z = mid;
	}
	return a < m && r->span[2 * a] < lo + sz;
}

/* Where block b would go: 0 with *at (*reuse = 1 if it is in the ring
 * already), or 1 when it cannot go now (a block it would overwrite is
 * pending, or it is larger than the ring). */
int arena__ring_place(const arena__ring *r, const arena_layout *l, uint32_t b, int in_order, uint64_t *at,
		      int *reuse)
{
	uint64_t sz = l->blocks[b].bytes;
	*reuse = 0;
	*at = 0;
	if (r->present[b]) {
		*reuse = 1;
		*at = r->off[b];
		return 0;
	}
	if (sz > r->bytes)
		return 1;
	/* First in, first out: at the head, or at 0 when the block does not fit
	 * before the end. Where that overlaps a pending block (a caller holding
	 * several blocks at once, as a backward does), the first other place that
	 * does not: 0, then right after each block in the ring, oldest first;
	 * but a fetch ahead in a ring that keeps its order waits, so that the
	 * blocks fetched ahead lie one after another and the ring's only gap is
	 * at its end. Training in pieces, fetched ahead into other places, a
	 * backward's pieces scattered over the ring and the gaps between them
	 * grew from block to block until a block's pieces no longer fitted a
	 * ring of 1.5 times their bytes (FLUX.1-dev in 24-64 MiB pieces: 'blocks
	 * held fill the ring' at a recompute). */
	/* Every place is ARENA_TENSOR_ALIGN-aligned: a block (a piece) whose
	 * size is not a multiple of it leaves the next one aligned all the same. */
	const uint64_t head = arena_align_up(r->head, ARENA_TENSOR_ALIGN);
	uint64_t lo = head + sz <= r->bytes ? head : 0;
	if (!overlaps_any(r, l, lo, sz)) { /* the usual case: one look at each block */
		*at = lo;
		return 0;
	}
	if (in_order)
		return 1;
	const size_t m = pending_spans(r, l); /* the other places: a search each */
	if (lo && !overlaps_pending(r, m, 0, sz)) {
		*at = 0;
		return 0;
	}
	for (size_t i = 0; m && i < r->n_order; i++) {
		uint32_t q = r->order[i];
		uint64_t a = arena_align_up(r->off[q] + l->blocks[q].bytes, ARENA_TENSOR_ALIGN);
		if (a + sz <= r->bytes && !overlaps_pending(r, m, a, sz)) {
			*at = a;
			return 0;
		}
	}
	return 1;
}

/* Put block b at `at` (from arena__ring_place): the blocks it overlaps leave the
 * ring, each passed to evict(ctx, q) first (the run makes its copy wait for
 * their last release). The first error of evict is returned; the ring's
 * state is updated either way. */
int arena__ring_take(arena__ring *r, const arena_layout *l, uint32_t b, uint64_t at, int (*evict)(void *, uint32_t),
		     void *ctx)
{
	uint64_t hi = at + l->blocks[b].bytes;
	size_t k = 0;
	int rc = 0;
	for (size_t i = 0; i < r->n_order; i++) {
		uint32_t q = r->order[i];
		uint64_t a = r->off[q], z = a + l->blocks[q].bytes;
		if (a < hi && at < z) {
			if (evict && !rc)
				rc = evict(ctx, q);
			r->present[q] = 0;
		} else {
			r->order[k++] = q;
		}
	}
	r->n_order = k;
	r->present[b] = 1;
	r->off[b] = at;
	r->order[r->n_order++] = b;
	r->head = hi;
	return rc;
}

/* Dry run of steps of seq through a ring of ring_bytes, fetching as far
 * ahead as the ring allows and at most a step ahead, across step ends (as
 * the engine does); the bytes and copies of the entries of the steps after
 * the first, a step's mean (the ring's first-in-first-out placement need
 * not repeat from one step to the next). */
static void dry_run(const arena_layout *l, const uint32_t *seq, size_t len, arena__ring *r, uint64_t ring_bytes,
		    int in_order, uint64_t *bytes, uint64_t *copies)
{
	enum { STEPS = 9 };
	uint64_t by[STEPS] = {0}, co[STEPS] = {0};
	size_t fetched = 0;
	int blocked = 0; /* a placement failed: none can succeed before a block's last release */
	arena__ring_reset(r, l->n_blocks, ring_bytes);
	*bytes = *copies = 0;
	for (size_t i = 0; i <= STEPS * len; i++) {
		while (fetched < i + len && fetched < STEPS * len) {
			size_t s = fetched / len; /* the step whose entry it is */
			uint32_t b = seq[fetched % len];
			uint64_t at;
			int reuse;
			if (blocked || arena__ring_place(r, l, b, in_order && fetched > i, &at, &reuse)) {
				if (fetched > i) {
					blocked = 1;
					break;
				}
				return; /* cannot happen: the ring holds two of the largest block */
			}
			if (!reuse) {
				by[s] += l->blocks[b].bytes;
				co[s]++;
				arena__ring_take(r, l, b, at, NULL, NULL);
			}
			r->pending[b]++;
			fetched++;
		}
		if (i < STEPS * len && !--r->pending[seq[i % len]])
			blocked = 0;
	}
	for (int s = 1; s < STEPS; s++)
		*bytes += by[s], *copies += co[s];
	*bytes /= STEPS - 1;
	*copies /= STEPS - 1;
}

/* --- planner ----------------------------------------------------------------- */

void arena_residency_plan_release(arena_residency_plan *p)
{
	if (!p)
		return;
	arena_free(p->resident);
	arena_free(p->sched);
	arena_free(p->bwd);
	memset(p, 0, sizeof(*p));
}

int arena_residency_plan_copy(const arena_residency_plan *src, arena_residency_plan *dst)
{
	*dst = *src;
	dst->resident = NULL;
	dst->sched = NULL;
	dst->bwd = NULL;
	size_t nb = src->n_blocks ? src->n_blocks : 1, ns = src->n_sched ? src->n_sched : 1;
	if ((src->resident && !(dst->resident = arena_malloc(nb))) ||
	    (src->sched && !(dst->sched = arena_malloc(ns * sizeof(*dst->sched)))) ||
	    (src->bwd && !(dst->bwd = arena_malloc(ns)))) {
		arena_residency_plan_release(dst);
		return arena_errorf(ARENA_E_NOMEM, "engine: out of memory for a plan");
	}
	if (src->resident)
		memcpy(dst->resident, src->resident, src->n_blocks);
	if (src->sched)
		memcpy(dst->sched, src->sched, src->n_sched * sizeof(*dst->sched));
	if (src->bwd)
		memcpy(dst->bwd, src->bwd, src->n_sched);
	return 0;
}

/* Recompute a plan's derived fields from p->resident (p->sched, slots and
 * depth set). `seq` (n_sched entries) and `r` (of the layout's blocks) are
 * scratch. */
void arena__plan_derive(const arena_layout *l, arena_residency_plan *p, uint32_t *seq, arena__ring *r)
{
	p->resident_bytes = p->globals_bytes;
	p->streamed_block_bytes = 0;
	p->slot_bytes = 0;
	p->n_resident = p->n_streamed = 0;
	for (size_t b = 0; b < l->n_blocks; b++) {
		if (arena_block_is_globals(l, (uint32_t)b))
			continue;
		if (p->resident[b]) {
			p->resident_bytes += l->blocks[b].bytes;
			p->n_resident++;
		} else {
			p->streamed_block_bytes += l->blocks[b].bytes;
			p->n_streamed++;
			if (l->blocks[b].bytes > p->slot_bytes)
				p->slot_bytes = l->blocks[b].bytes;
		}
	}
	if (p->n_streamed && p->slot_bytes < p->min_slot)
		p->slot_bytes = p->min_slot;
	size_t len = 0;
	for (size_t i = 0; i < p->n_sched; i++)
		if (!p->resident[p->sched[i]])
			seq[len++] = p->sched[i];
	p->stream_bytes_per_step = p->copies_per_step = 0;
	unsigned slots = p->n_streamed ? p->slots : 0;
	p->need_bytes = p->resident_bytes + (uint64_t)slots * p->slot_bytes;
	if (len)
		dry_run(l, seq, len, r, (uint64_t)p->slots * p->slot_bytes, p->min_slot != 0 /* arena__ring_in_order */,
			&p->stream_bytes_per_step, &p->copies_per_step);
}

/* The bytes of the blocks of order[0..k) resident in `set`. */
static uint64_t named_bytes(const arena_layout *l, const uint32_t *order, size_t k, const uint8_t *set)
{
	uint64_t s = 0;
	for (size_t i = 0; i < k; i++)
		s += set[order[i]] ? l->blocks[order[i]].bytes : 0;
	return s;
}

/* Make blocks of order[0..k) resident (cand) while *room holds them, the
 * largest first. */
static void fill_largest(const arena_layout *l, const uint32_t *order, size_t k, uint8_t *cand, uint64_t *room)
{
	for (;;) {
		int64_t pick = -1;
		for (size_t i = 0; i < k; i++) {
			uint32_t b = order[i];
			if (!cand[b] && l->blocks[b].bytes <= *room &&
			    (pick < 0 || l->blocks[b].bytes > l->blocks[pick].bytes))
				pick = b;
		}
		if (pick < 0)
			return;
		cand[pick] = 1;
		*room -= l->blocks[pick].bytes;
	}
}

int arena_residency_plan_make(const arena_layout *l, const arena_engine_opts *o, uint64_t budget,
			      arena_residency_plan *p)
{
	memset(p, 0, sizeof(*p));
	int rc = 0;
	size_t n = l->n_blocks, k = 0;
	uint8_t *cand = NULL;
	uint32_t *seq = NULL, *order = NULL;
	arena__ring r = {0};
	arena__timed ts = {0};
	int prof = arena__have_profile(o);
	if (o->mode != ARENA_MODE_SAMPLE && o->mode != ARENA_MODE_TRAIN)
		return arena_errorf(ARENA_E_USAGE, "engine: mode %d is neither sample nor train", o->mode);
	if (o->cost && !(o->h2d_bytes_per_s >= 0 && o->h2d_bytes_per_s < 1e15 && o->backward_factor >= 0 &&
			 o->backward_factor < 1e6))
		return arena_errorf(ARENA_E_USAGE, "engine: the profile's rate or backward factor is not a finite number >= 0");
	if (opt_depth(o) > ARENA__MAX_DEPTH || o->keep_last > ARENA__MAX_KEEP)
		return arena_errorf(ARENA_E_USAGE, "engine: depth %u or keep_last %u over %u", opt_depth(o),
				    o->keep_last, ARENA__MAX_DEPTH);
	for (size_t b = 0; b < n; b++)
		k += !arena_block_is_globals(l, (uint32_t)b);
	if (o->sched) {
		if (o->n_sched > arena_residency_max_sched(l))
			return arena_errorf(ARENA_E_USAGE, "engine: a schedule of %zu entries is over the %zu this model allows",
					    o->n_sched, arena_residency_max_sched(l));
		for (size_t i = 0; i < o->n_sched; i++)
			if (o->sched[i] >= n || arena_block_is_globals(l, o->sched[i]))
				return arena_errorf(ARENA_E_USAGE, "engine: schedule entry %zu is block %u, %s", i, o->sched[i],
						    o->sched[i] >= n ? "out of range" : "the globals block (always resident)");
	}
	p->n_blocks = n;
	p->n_sched = o->sched ? o->n_sched : o->mode == ARENA_MODE_TRAIN ? 2 * k : k;
	p->budget = budget;
	p->depth = opt_depth(o);
	p->min_slot = arena__min_slot(o);
	p->slots = arena__ring_slots(o);
	p->resident = arena_calloc(n ? n : 1, 1);
	p->sched = arena_calloc(p->n_sched ? p->n_sched : 1, sizeof(*p->sched));
	p->bwd = arena_calloc(p->n_sched ? p->n_sched : 1, 1);
	cand = arena_calloc(n ? n : 1, 1);
	seq = arena_calloc(p->n_sched ? p->n_sched : 1, sizeof(*seq));
	order = arena_calloc(n ? n : 1, sizeof(*order));
	int rok = arena__ring_init(&r, n);
	if (!rok && prof)
		rok = arena__timed_init(&ts, n, p->n_sched);
	if (!rok && prof && k > ARENA__GREEDY_SWAP_MAX)
		rok = arena__timed_log(&ts, n, p->n_sched);
	if (!p->resident || !p->sched || !p->bwd || !cand || !seq || !order || rok) {
		rc = arena_errorf(ARENA_E_NOMEM, "engine: out of memory for a plan");
		goto out;
	}
	uint64_t all = 0;
	for (size_t b = 0; b < n; b++) {
		uint64_t sz = l->blocks[b].bytes;
		if (arena_block_is_globals(l, (uint32_t)b)) {
			p->resident[b] = 1;
			p->globals_bytes += sz;
			continue;
		}
		all += sz;
	}
	if (o->sched) {
		memcpy(p->sched, o->sched, p->n_sched * sizeof(*p->sched));
	} else {
		size_t j = 0;
		for (size_t b = 0; b < n; b++)
			if (!arena_block_is_globals(l, (uint32_t)b))
				p->sched[j++] = (uint32_t)b;
		for (size_t i = 0; i < k && p->n_sched == 2 * k; i++)
			p->sched[k + i] = p->sched[k - 1 - i];
	}
	/* A profile's costs, of the blocks the schedule names (the timed dry run
	 * reads no other: a learned profile has none for blocks never run, as a
	 * pipeline's VAE encoder). */
	for (size_t i = 0; o->cost && i < p->n_sched; i++) {
		uint32_t b = p->sched[i];
		if (!(o->cost[b] >= 0 && o->cost[b] < 1e9) || (o->bcost && !(o->bcost[b] < 1e9)) ||
		    (o->bhold && !(o->bhold[b] < 1e9))) {
			rc = arena_errorf(ARENA_E_USAGE, "engine: the cost of block '%s' is not a finite number >= 0",
					  l->blocks[b].name);
			goto out;
		}
	}
	/* The blocks in the order the schedule first needs them (the first ks),
	 * then those it does not name (streamed unless room is left once every
	 * block it names is resident: they may still be acquired, and a
	 * pipeline's other components name them); cand marks those seen. Train:
	 * a block's later entries are backward (recompute + backward). */
	size_t ko = 0;
	for (size_t i = 0; i < p->n_sched; i++) {
		uint32_t b = p->sched[i];
		p->bwd[i] = (uint8_t)(o->mode == ARENA_MODE_TRAIN && cand[b]);
		if (!cand[b])
			order[ko++] = b;
		cand[b] = 1;
	}
	const size_t ks = ko;
	for (size_t b = 0; b < n; b++)
		if (!cand[b] && !arena_block_is_globals(l, (uint32_t)b))
			order[ko++] = (uint32_t)b;
	if (p->globals_bytes + all <= budget) {
		for (size_t b = 0; b < n; b++)
			p->resident[b] = 1;
		p->min_need_bytes = p->globals_bytes + all;
		arena__plan_derive(l, p, seq, &r);
		if (prof)
			p->step_s = arena__timed_run(l, o, p->sched, p->bwd, p->n_sched, p->resident, p->slots, &ts);
		goto out;
	}
	/* The least any plan needs: all resident, unless a streaming plan below
	 * needs less. */
	p->min_need_bytes = p->globals_bytes + all;
	/* Each distinct block size is a candidate slot size; largest first. */
	uint64_t best_res = 0, best_named = 0, S = UINT64_MAX, tried = UINT64_MAX;
	double best_t = 0;
	int have = 0;
	if (prof && k > ARENA__GREEDY_SWAP_MAX) {
		/* Many blocks: the plan by bytes (this schedule) is the first
		 * candidate, so the greedy's estimates never make a plan predicted
		 * slower than it. */
		arena_engine_opts q = *o;
		q.cost = NULL;
		q.h2d_bytes_per_s = 0;
		arena_residency_plan bp;
		int brc = arena_residency_plan_make(l, &q, budget, &bp);
		if (brc == ARENA_E(BUDGET)) {
			arena_error_clear();
		} else if (brc) {
			rc = brc;
			goto out;
		} else {
			double t = arena__timed_run(l, o, p->sched, p->bwd, p->n_sched, bp.resident, p->slots, &ts);
			if (t >= 0) {
				have = 1;
				best_t = t;
				best_res = bp.resident_bytes;
				best_named = named_bytes(l, order, ks, bp.resident);
				memcpy(p->resident, bp.resident, n);
			}
			arena_residency_plan_release(&bp);
		}
	}
	for (;;) {
		uint64_t next = 0;
		for (size_t i = 0; i < k; i++) {
			uint64_t sz = l->blocks[order[i]].bytes;
			if (sz < S && sz > next)
				next = sz;
		}
		if (!next)
			break;
		/* Many blocks (pieces), many sizes: try sizes a quarter apart. */
		if (prof && k > ARENA__GREEDY_SWAP_MAX && have && next > tried * 3 / 4) {
			S = next;
			continue;
		}
		S = tried = next;
		uint64_t need = p->globals_bytes + (uint64_t)p->slots * (S > p->min_slot ? S : p->min_slot), elig = 0;
		for (size_t b = 0; b < n; b++) {
			cand[b] = arena_block_is_globals(l, (uint32_t)b) || l->blocks[b].bytes > S;
			if (arena_block_is_globals(l, (uint32_t)b))
				continue;
			if (l->blocks[b].bytes > S)
				need += l->blocks[b].bytes;
		}
		for (size_t i = 0; i < ks; i++) /* the blocks the schedule names share the room */
			if (!cand[order[i]])
				elig += l->blocks[order[i]].bytes;
		if (!p->min_need_bytes || need < p->min_need_bytes)
			p->min_need_bytes = need;
		if (need > budget)
			continue;
		uint64_t room = budget - need;
		double t_cand = 0;
		if (prof) {
			/* the blocks the schedule names, timed; then the room left to the others */
			t_cand = arena__greedy_timed(l, o, p, order, ks, cand, &room, ts.gain, &ts);
			if (t_cand < 0) {
				rc = arena_errorf(ARENA_E_INTERNAL, "engine: the timed dry run could not place a block");
				goto out;
			}
			fill_largest(l, order + ks, k - ks, cand, &room);
			goto chosen;
		}
		double f = elig ? (double)room / (double)elig : 0, acc = 0;
		f = f > 1 ? 1 : f;
		/* Spread: error diffusion over the forward order. */
		for (size_t i = 0; i < ks; i++) {
			uint32_t b = order[i];
			uint64_t sz = l->blocks[b].bytes;
			if (cand[b])
				continue;
			acc += f * (double)sz;
			if (acc + 0.5 >= (double)sz && sz <= room) {
				cand[b] = 1;
				room -= sz;
				acc -= (double)sz;
			}
		}
		/* Fill what is left, largest first: the blocks the schedule names,
		 * then the others. */
		fill_largest(l, order, ks, cand, &room);
		fill_largest(l, order + ks, k - ks, cand, &room);
	chosen:;
		/* the resident weights: what the budget holds less the ring */
		uint64_t res = budget - room - (uint64_t)p->slots * (S > p->min_slot ? S : p->min_slot);
		const uint64_t named = named_bytes(l, order, ks, cand);
		/* Without a profile the most resident bytes of the blocks the
		 * schedule names win, then the most resident bytes (not a larger
		 * ring: a plan of larger slots that keeps less resident copies
		 * more each step; nor blocks the schedule does not name, larger
		 * than a smaller slot: they save no copy of the steps it plans,
		 * and a pipeline's next component kept the last one's resident
		 * and streamed all its own); with one the shortest predicted step
		 * (ties: the same). */
		int more = named > best_named || (named == best_named && res > best_res);
		int better = !have || (prof ? t_cand < best_t * (1 - 1e-9) || (t_cand <= best_t * (1 + 1e-9) && more) : more);
		if (better) {
			have = 1;
			best_res = res;
			best_named = named;
			best_t = t_cand;
			memcpy(p->resident, cand, n);
		}
	}
	if (!have) {
		rc = arena_errorf(ARENA_E(BUDGET),
				  "the smallest plan needs %s for weights (globals %s + a ring of %u slots + the blocks "
				  "larger than a slot), the budget for weights is %s",
				  arena__fmtb(p->min_need_bytes), arena__fmtb(p->globals_bytes), p->slots, arena__fmtb(budget));
		goto out;
	}
	if (prof && k > ARENA__GREEDY_SWAP_MAX && !arena__no_refine) {
		double t = arena__refine_swaps(l, o, p, order, k, p->resident, budget, &ts);
		if (t < 0) {
			rc = t < -1 ? arena_errorf(ARENA_E_NOMEM, "engine: out of memory for a plan")
				    : arena_errorf(ARENA_E_INTERNAL, "engine: the timed dry run could not place a block");
			goto out;
		}
	}
	arena__plan_derive(l, p, seq, &r);
	if (prof)
		p->step_s = arena__timed_run(l, o, p->sched, p->bwd, p->n_sched, p->resident, p->slots, &ts);
out:
	arena_free(cand);
	arena_free(seq);
	arena_free(order);
	arena__ring_release(&r);
	arena__timed_release(&ts);
	if (rc) {
		uint64_t min_need = p->min_need_bytes;
		arena_residency_plan_release(p);
		p->min_need_bytes = min_need; /* for the caller's message */
	}
	return rc;
}

int arena_residency_plan_staged(const arena_layout *l, const arena_engine_opts *o, uint64_t *budget, uint64_t stage,
				arena_residency_plan *p)
{
	int rc = arena_residency_plan_make(l, o, *budget, p);
	if (rc || !stage || !p->n_streamed)
		return rc;
	arena_residency_plan_release(p);
	*budget = *budget > stage ? *budget - stage : 0;
	return arena_residency_plan_make(l, o, *budget, p);
}
