/* engine.c - the prefetch engine's core: create and free, the step
 * (step_begin, acquire, release, step_end) and the ring it streams blocks
 * through, prefetching ahead of the caller. engine.h says what the engine
 * does, its state machine and its invariants (2 and 5 are kept here);
 * engine_int.h lists the other parts.
 *
 * Invariants of the step and the ring:
 *   1. [cur, fetched) are the streamed entries fetched ahead and not yet
 *      acquired. While fetch_epoch == ring_epoch each holds a count in
 *      ring.pending, and a block with a pending count is never overwritten
 *      (arena__ring_place finds no place over it). A ring made anew counts
 *      a new epoch: the old ring's counts are not given back.
 *   2. A copy into the ring waits on the copy stream for the last release
 *      (ev_use) of every block it evicts (evict_wait); an acquire makes the
 *      caller's stream wait for the block's fill event (wait_fill) before
 *      its address is handed out.
 *   3. held[0, n_held) are the streamed blocks acquired and not released,
 *      oldest first, at most max_held of them; res_held counts the resident
 *      ones. A step ends only with none held.
 *   4. Prefetch runs at most a step ahead (fetched <= 2 n_seq). Entries
 *      fetched past the step's end are the next step's first; their copies
 *      count in next_bytes, next_moved and next_copies, and they stay fetched
 *      across step_end unless the schedule is learned anew there (their
 *      pending counts given back), the mode changes or the ring is made anew.
 *   5. Acquire and release allocate nothing: held, seq, obs and the timing
 *      slots are sized at create.
 *   6. A device error in any transition fails the engine (arena__engine_fail):
 *      every later call returns it; a USAGE error does not, nor a ring that
 *      a step end could not place (DEV_OOM with every block demoted: the
 *      device has not the memory now): the step ends without a ring
 *      (ring_missing), and each step_begin places it first or returns
 *      DEV_OOM, the engine idle as before. */
#include "engine_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "../common/alloc.h"
#include "../common/clock.h"
#include "../common/err.h"
#include "../common/units.h"

int arena__engine_fail(arena_engine *e, int rc)
{
	if (rc && rc != ARENA_E_USAGE) {
		e->state = ST_FAILED;
		e->failed_rc = rc;
	}
	return rc;
}

/* The plan's predicted step by the profile (arena_residency_plan_predict
 * with the engine's own scratch: no allocation); -1 without a profile. */
double arena__engine_predict(arena_engine *e)
{
	if (!arena__have_profile(&e->o))
		return -1;
	return arena__timed_run(e->l, &e->o, e->plan.sched, e->plan.bwd, e->plan.n_sched, e->plan.resident, e->plan.slots,
				&e->tscr);
}

void arena__engine_refresh(arena_engine *e)
{
	arena__plan_derive(e->l, &e->plan, e->seq, &e->scratch);
	/* the predicted step by the profile (given or learned); 0 without one */
	double t = arena__engine_predict(e);
	e->plan.step_s = t > 0 ? t : 0;
	e->n_seq = 0;
	for (size_t i = 0; i < e->plan.n_sched; i++)
		if (!e->plan.resident[e->plan.sched[i]])
			e->seq[e->n_seq++] = e->plan.sched[i];
}

/* Wait for everything the ring is part of, then free it. */
int arena__engine_ring_free(arena_engine *e)
{
	int rc = 0;
	arena_backend *be = e->be;
	if ((e->cs && (rc = be->ops->stream_sync(be, e->cs))) || (e->ds && (rc = be->ops->stream_sync(be, e->ds))))
		return rc;
	for (size_t i = 0; i < e->ring.n_order; i++) {
		uint32_t q = e->ring.order[i];
		if (!rc)
			rc = be->ops->event_sync(be, e->ev_use[q]);
	}
	if (e->ring_dptr)
		be->ops->dev_free(be, e->ring_dptr);
	e->ring_dptr = NULL;
	arena__ring_reset(&e->ring, e->l->n_blocks, 0);
	e->ring_epoch++;
	e->slot_bytes = 0;
	return rc;
}

/* A ring of n_slots x `bytes` (0: none). DEV_OOM leaves no ring allocated. */
int arena__engine_ring_alloc(arena_engine *e, uint64_t bytes)
{
	int rc;
	if (bytes == e->slot_bytes && (!bytes || e->ring.bytes == (uint64_t)e->n_slots * bytes))
		return 0;
	if ((rc = arena__engine_ring_free(e)) || !bytes)
		return rc;
	if ((rc = e->be->ops->dev_alloc(e->be, (uint64_t)e->n_slots * bytes, &e->ring_dptr)))
		return rc;
	arena__ring_reset(&e->ring, e->l->n_blocks, (uint64_t)e->n_slots * bytes);
	e->ring_epoch++;
	e->slot_bytes = bytes;
	return 0;
}

/* The copy into the ring waits for the last release of each block it overwrites. */
static int evict_wait(void *ctx, uint32_t q)
{
	arena_engine *e = ctx;
	return e->be->ops->stream_wait(e->be, e->cs, e->ev_use[q]);
}

/* Put block b in the ring for one more use: its copy is issued unless it
 * is there already (the copy counts in the record of the step whose entry
 * it is for: this one, or the next when `next`); `ahead`: fetched ahead of
 * its use (arena__ring_place); 0, 1 no room in the ring now, or an error. */
static int fetch_block(arena_engine *e, uint32_t b, int next, int ahead)
{
	arena_backend *be = e->be;
	uint64_t at, sz = e->l->blocks[b].bytes;
	int reuse, rc;
	if (arena__ring_place(&e->ring, e->l, b, ahead && arena__ring_in_order(&e->o), &at, &reuse))
		return 1;
	if (!reuse) {
		unsigned k = e->cp_next % ENGINE_COPY_PAIRS;
		int tk = -1;
		int timing = e->timed && sz;
		const uint8_t *src = NULL;
		arena_stream *fs = e->cs;
		if ((rc = arena__engine_host_src(e, b, &src)))
			return rc;
		if (timing) { /* the pair's last copy, read if done, else dropped */
			if ((rc = arena__engine_read_copy(e, k)) < 0)
				return rc;
			e->cp_rec[k] = 0;
			e->cp_next++;
		}
		if ((rc = arena__ring_take(&e->ring, e->l, b, at, evict_wait, e)) ||
		    (timing && (rc = be->ops->event_record(be, e->cp_a[k], e->cs))) ||
		    (e->tr && sz &&
		     (rc = arena_trace_copy_begin(e->tr, e->cs, b, sz, ARENA_TRACE_FETCH, e->steps + (next ? 1 : 0), &tk))) ||
		    (rc = arena__engine_send(e, b, (uint8_t *)e->ring_dptr + at, src, &fs)) ||
		    (e->tr && (rc = arena_trace_copy_end(e->tr, tk, e->cs))) ||
		    (timing && (rc = be->ops->event_record(be, e->cp_z[k], e->cs))) ||
		    (rc = be->ops->event_record(be, e->ev_fill[b], fs)))
			return rc;
		if (timing) {
			e->cp_rec[k] = 1;
			e->cp_bytes[k] = arena__engine_moved_bytes(e, b);
		}
		if (next) {
			e->next_bytes += sz;
			e->next_moved += arena__engine_moved_bytes(e, b);
			e->next_copies++;
		} else {
			e->rec.streamed_bytes += sz;
			e->rec.moved_bytes += arena__engine_moved_bytes(e, b);
			e->rec.copies++;
		}
	}
	e->ring.pending[b]++;
	return 0;
}

static int fetch_one(arena_engine *e, size_t j, int ahead)
{
	return fetch_block(e, arena__engine_seq_at(e, j), j >= e->n_seq, ahead);
}

/* Forget the entries fetched ahead and not yet acquired (their copies stay
 * issued; their bytes stay in the ring, reused if asked for while there). */
void arena__engine_drop_ahead(arena_engine *e)
{
	if (e->ring_epoch == e->fetch_epoch)
		for (size_t j = e->cur; j < e->fetched; j++)
			e->ring.pending[arena__engine_seq_at(e, j)]--;
	e->fetched = e->cur;
}

/* Fetch streamed entries ahead as far as the ring has room: past the end of
 * the step into the next one's first entries too (at most a step ahead), so
 * that a caller whose step ends with a wait for its work (a host sync) finds
 * the next step's first blocks on their way. */
static int prefetch(arena_engine *e)
{
	if (e->fetch_epoch != e->ring_epoch) { /* the ring was made anew: nothing in it is ours */
		e->fetch_epoch = e->ring_epoch;
		e->fetched = e->cur;
	}
	const size_t ahead = e->ahead < e->n_seq ? e->ahead : e->n_seq;
	while (e->fetched < e->cur + ahead && e->fetched < 2 * e->n_seq) {
		int rc = fetch_one(e, e->fetched, 1);
		if (rc < 0)
			return rc;
		if (rc > 0)
			break;
		e->fetched++;
	}
	return 0;
}

void arena_engine_free(arena_engine *e)
{
	if (!e)
		return;
	arena_backend *be = e->be;
	arena__engine_look_free(&e->look);
	arena__engine_reap_wait(e);
	arena_free(e->reap.drops);
	/* A trace not ended is written now (an error here has no one to go to). */
	arena_trace_close(e->tr, e->state != ST_FAILED && e->state != ST_STEP);
	if (e->ring.present)
		arena__engine_ring_free(e);
	if (e->cs)
		be->ops->stream_sync(be, e->cs);
	if (e->ds)
		be->ops->stream_sync(be, e->ds);
	arena__engine_disk_free(e); /* its thread stopped, its slots' copies done */
	arena__engine_wire_free(e);
	for (size_t b = 0; b < e->l->n_blocks; b++) {
		if (e->ev_use && e->ev_use[b]) {
			be->ops->event_sync(be, e->ev_use[b]);
			be->ops->event_destroy(be, e->ev_use[b]);
		}
		if (e->ev_fill && e->ev_fill[b])
			be->ops->event_destroy(be, e->ev_fill[b]);
	}
	arena__engine_time_free(e);
	if (e->cs)
		be->ops->stream_destroy(be, e->cs);
	arena__ring_release(&e->ring);
	arena__ring_release(&e->scratch);
	arena_residency_plan_release(&e->memo);
	arena__timed_release(&e->tscr);
	arena_free(e->seq);
	arena_free(e->obs);
	arena_free(e->msched[0]);
	arena_free(e->msched[1]);
	arena_free(e->held);
	arena_free(e->ev_use);
	arena_free(e->ev_fill);
	arena_free(e->res_held);
	arena_free(e->near);
	arena_free(e->named);
	arena_free(e->switched);
	arena_free(e->pace);
	arena_free(e->hist);
	arena__engine_decide_free(e);
	arena_free(e->cost);
	arena_residency_plan_release(&e->plan);
	arena_free(e);
}

int arena_engine_create(arena_model *m, const arena_engine_opts *o, arena_engine **out)
{
	*out = NULL;
	arena_backend *be = m->backend;
	const arena_layout *l = m->layout;
	uint64_t free_b = 0, total = 0, budget, headroom, reserve;
	int rc = be->ops->mem_info(be, &free_b, &total);
	if (rc)
		return rc;
	arena_engine *e = arena_calloc(1, sizeof(*e));
	if (!e)
		return arena_errorf(ARENA_E_NOMEM, "engine: out of memory");
	e->m = m;
	e->be = be;
	e->l = l;
	e->o = *o;
	e->reserve_given = o->reserve;
	e->o.learn_rest = o->learn_rest && o->reserve == ARENA_ENGINE_AUTO; /* a reserve given is used as it is */
	if (e->o.learn_rest)
		e->o.reserve = ARENA_ENGINE_REST_UNKNOWN; /* nothing seen yet: the safe plan */
	e->move_scale = 1;
	e->ahead = SIZE_MAX;
	for (uint32_t b = 0; b < l->n_blocks; b++)
		e->all_bytes += l->blocks[b].bytes;
	e->o.sched = NULL; /* the engine's own copy is made below */
	e->o.hold = NULL;  /* learned only (engine.h) */
	e->o.bcost = e->o.bhold = NULL;
	e->o.n_sched = 0;
	if (o->cost) { /* the engine keeps its own copy of the profile */
		double *c = arena_calloc(l->n_blocks ? l->n_blocks : 1, sizeof(*c));
		if (!c) {
			arena_free(e);
			return arena_errorf(ARENA_E_NOMEM, "engine: out of memory");
		}
		memcpy(c, o->cost, l->n_blocks * sizeof(*c));
		e->cost = c;
		e->o.cost = c;
	}
	uint64_t b0 = 0;
	if ((rc = arena__engine_wire_init(e, o, &b0)))
		goto fail;
	/* The budget as a step end reads it (the stages are allocated now). */
	if ((rc = be->ops->mem_info(be, &free_b, &total)))
		goto fail;
	const uint64_t held = m->dev_bytes + arena__engine_wire_stage_bytes(e) + arena__engine_own_rounding(m, e);
	const uint64_t st = e->wstage ? arena__engine_wire_stage_bytes(e) +
						arena__engine_gran_loss(be, arena__engine_wire_stage_bytes(e))
				      : 0;
	budget = arena__engine_budget(e, free_b, total, held, st, &headroom, &reserve);
	budget = budget > st ? budget - st : 0;
	arena_engine_opts po = *o;
	po.moved = e->moved;
	po.reserve = e->o.reserve;
	po.learn_rest = e->o.learn_rest;
	po.other = e->o.other;
	if ((rc = arena_residency_plan_rounded(l, &po, be->alloc_granularity, budget, &e->plan))) {
		if (rc == ARENA_E(BUDGET)) {
			char msg[1024];
			snprintf(msg, sizeof(msg), "%s", arena_last_error());
			uint64_t avail = arena_size_add(free_b, held);
			if (o->cap && o->cap < avail)
				avail = o->cap;
			arena_errorf(rc,
				     "%s: does not fit: %s; with a working reserve of %s and headroom of %s it needs %s of "
				     "device memory, %s is available%s",
				     be->ops->name, msg, arena__fmtb(reserve), arena__fmtb(headroom),
				     arena__fmtb(arena_size_add(arena_size_add(e->plan.min_need_bytes, reserve),
								arena_size_add(headroom, e->o.other))),
				     arena__fmtb(avail),
				     o->cap ? " under the cap" : "");
		}
		goto fail;
	}
	e->plan.headroom = headroom;
	e->plan.reserve = reserve;
	e->tm_mode[0] = e->tm_mode[1] = o->mode;
	size_t n = l->n_blocks;
	e->max_sched = arena_residency_max_sched(l);
	size_t ns = e->max_sched > e->plan.n_sched ? e->max_sched : e->plan.n_sched;
	ns = ns ? ns : 1;
	e->max_held = ns + n;
	e->n_slots = arena__ring_slots(o);
	int rr = arena__ring_init(&e->ring, n), rs = arena__ring_init(&e->scratch, n);
	if (!rs)
		rs = arena__timed_init(&e->tscr, n, ns);
	e->seq = arena_calloc(ns, sizeof(*e->seq));
	e->obs = arena_calloc(ns, sizeof(*e->obs));
	e->held = arena_calloc(e->max_held, sizeof(*e->held));
	e->ev_use = arena_calloc(n ? n : 1, sizeof(*e->ev_use));
	e->ev_fill = arena_calloc(n ? n : 1, sizeof(*e->ev_fill));
	e->res_held = arena_calloc(n ? n : 1, sizeof(*e->res_held));
	e->near = arena_calloc(n ? n : 1, 1);
	e->named = arena_calloc(n ? n : 1, 1);
	e->switched = arena_calloc(n ? n : 1, 1);
	e->pace = arena_calloc(n ? n : 1, 1);
	e->hist = arena_calloc(ARENA_ENGINE_HISTORY, sizeof(*e->hist));
	e->msched[0] = arena_calloc(ns, sizeof(uint32_t));
	e->msched[1] = arena_calloc(ns, sizeof(uint32_t));
	if (rr || rs || !e->seq || !e->obs || !e->held || !e->msched[0] || !e->msched[1] ||
	    !e->ev_use || !e->ev_fill || !e->res_held || !e->near || !e->named ||
	    !e->switched || !e->pace || !e->hist || arena__engine_decide_init(e)) {
		rc = arena_errorf(ARENA_E_NOMEM, "engine: out of memory");
		goto fail;
	}
	if (o->sched && o->n_sched) { /* a given schedule is the mode's until another is learned */
		int md = o->mode == ARENA_MODE_TRAIN;
		memcpy(e->msched[md], o->sched, o->n_sched * sizeof(uint32_t));
		e->mn[md] = o->n_sched;
		e->o.sched = e->msched[md];
		e->o.n_sched = o->n_sched;
	}
	if ((rc = be->ops->stream_create(be, &e->cs)))
		goto fail;
	if ((rc = arena__engine_time_init(e)))
		goto fail;
	for (size_t b = 0; b < n; b++)
		if ((rc = be->ops->event_create(be, &e->ev_use[b])) ||
		    (rc = e->timed ? be->ops->event_create_timed(be, &e->ev_fill[b]) : be->ops->event_create(be, &e->ev_fill[b])))
			goto fail;
	/* Every block must be somewhere it can come back from: the device, a
	 * host slab, or its image (the disk tier). */
	for (uint32_t b = 0; b < n; b++)
		if (arena__engine_on_disk(e, b) && !o->reread) {
			rc = arena_errorf(ARENA_E_USAGE,
					  "engine: block '%s' is neither on the device nor in a host slab, and there is "
					  "no image to read it from",
					  l->blocks[b].name);
			goto fail;
		}
	if ((rc = arena__engine_disk_init(e)))
		goto fail;
	/* Device-only blocks that cannot be re-read stay resident. */
	uint8_t *want = e->plan.resident;
	for (uint32_t b = 0; b < n; b++)
		if (!want[b] && m->mem[b].dev && !m->mem[b].host && !m->mem[b].wire && !o->reread)
			want[b] = 1;
	/* Apply: free what goes first, then place what stays, then the ring. */
	for (uint32_t b = 0; b < n; b++)
		if (!want[b] && m->mem[b].dev) {
			want[b] = 1; /* demote expects a resident block */
			if ((rc = arena__engine_demote(e, b)))
				goto fail;
		}
	for (uint32_t b = 0; b < n; b++) {
		if (!want[b] || m->mem[b].dev || !l->blocks[b].bytes)
			continue;
		rc = arena__engine_promote(e, b);
		if (rc == ARENA_E(DEV_OOM) && !arena_block_is_globals(l, b)) {
			e->plan.resident[b] = 0; /* demote and go on */
			e->rec.alloc_retries++;
			rc = 0;
		}
		if (rc)
			goto fail;
	}
	arena__engine_refresh(e);
	if ((rc = arena__engine_fit_ring(e)))
		goto fail;
	arena__engine_refresh(e);
	if ((rc = be->ops->stream_sync(be, e->cs)))
		goto fail;
	e->rec.demotions = 0;
	e->rec.promoted_bytes = 0;
	/* The plan made here is the first, no decision: what the next is explained against. */
	arena__engine_seen(e, budget, free_b, held);
	arena__engine_why_settle(e);
	*out = e;
	return 0;
fail:
	arena_engine_free(e);
	return rc;
}

/* Blocks are streamed and there is no ring: a step end could not place it. */
static int ring_missing(const arena_engine *e)
{
	return e->plan.n_streamed && !e->ring_dptr;
}

int arena_engine_step_begin(arena_engine *e)
{
	if (e->state == ST_FAILED)
		return e->failed_rc;
	if (e->state != ST_IDLE)
		return arena_errorf(ARENA_E_USAGE, "engine: step_begin inside a step");
	if (ring_missing(e)) { /* placed now, or DEV_OOM again with nothing changed */
		int rc = arena__engine_fit_ring(e);
		if (rc == ARENA_E(DEV_OOM)) {
			char why[512];
			snprintf(why, sizeof(why), "%s", arena_last_error());
			return arena_errorf(ARENA_E(DEV_OOM), "engine: no room for the ring of streamed blocks (%s): %s",
					    arena__fmtb((uint64_t)e->n_slots * e->plan.slot_bytes), why);
		}
		if (rc)
			return arena__engine_fail(e, rc);
	}
	e->state = ST_STEP;
	arena__engine_time_begin(e);
	e->rec.mode = e->o.mode;
	if (e->tr)
		arena_trace_instant(e->tr, ARENA_TRACE_STEP_BEGIN, 0, e->steps, 0);
	if (!e->begun) {
		e->cur = e->fetched = 0;
		e->begun = 1;
	}
	return arena__engine_fail(e, prefetch(e));
}

/* Make `s` wait for block b's bytes, timed (the step's records, a trace). */
static int wait_fill(arena_engine *e, uint32_t b, arena_stream *s)
{
	size_t ts;
	int k = -1, rc;
	if ((rc = arena__engine_time_ready(e, b, s, &ts)) ||
	    (e->tr && (rc = arena_trace_acquire_ready(e->tr, s, b, e->steps, &k))) ||
	    (rc = e->be->ops->stream_wait(e->be, s, e->ev_fill[b])) || (rc = arena__engine_time_start(e, ts, s)))
		return rc;
	return e->tr ? arena_trace_acquire_start(e->tr, k, s) : 0;
}

/* The caller's work with b ends on s: timed, then b's last use. */
static int mark_release(arena_engine *e, uint32_t b, arena_stream *s)
{
	int rc;
	if ((rc = arena__engine_time_end(e, b, s)) || (e->tr && (rc = arena_trace_release(e->tr, b, s))))
		return rc;
	e->last_s = s;
	return e->be->ops->event_record(e->be, e->ev_use[b], s);
}

/* Where a streamed block acquired now sits in seq: the next entry if it is
 * b; otherwise (a miss) the prefetches ahead are dropped and the position
 * moves to b's next entry, or its first, or SIZE_MAX (none: b is fetched on
 * its own). */
static size_t locate(arena_engine *e, uint32_t b)
{
	if (e->cur < e->n_seq && e->seq[e->cur] == b) {
		if (e->ahead < e->n_seq)
			e->ahead *= 2;
		return e->cur;
	}
	e->rec.misses++;
	arena__engine_drop_ahead(e);
	size_t j = SIZE_MAX;
	for (size_t i = e->cur; i < e->n_seq && j == SIZE_MAX; i++)
		if (e->seq[i] == b)
			j = i;
	for (size_t i = 0; i < e->cur && j == SIZE_MAX; i++)
		if (e->seq[i] == b)
			j = i;
	if (j != SIZE_MAX)
		e->cur = e->fetched = j;
	e->ahead = 1;
	return j;
}

int arena_engine_acquire(arena_engine *e, uint32_t block, arena_stream *stream, void **dptr)
{
	int rc;
	*dptr = NULL;
	if (e->state == ST_FAILED)
		return e->failed_rc;
	if (e->state != ST_STEP)
		return arena_errorf(ARENA_E_USAGE, "engine: acquire outside a step (call step_begin first)");
	if (block >= e->l->n_blocks)
		return arena_errorf(ARENA_E_USAGE, "engine: no block %u (the model has %zu)", block, e->l->n_blocks);
	if (e->plan.resident[block]) {
		if ((rc = wait_fill(e, block, stream)))
			return arena__engine_fail(e, rc);
		e->res_held[block]++;
		arena__engine_observe(e, block);
		*dptr = e->m->mem[block].dev;
		return 0;
	}
	if (e->n_held >= e->max_held)
		return arena_errorf(ARENA_E_USAGE, "engine: %zu blocks held; release some before acquiring '%s'", e->n_held,
				    e->l->blocks[block].name);
	size_t j = locate(e, block);
	if (j == SIZE_MAX || e->fetched <= j) {
		if ((rc = j == SIZE_MAX ? fetch_block(e, block, 0, 0) : fetch_one(e, j, 0)) < 0)
			return arena__engine_fail(e, rc);
		if (rc > 0)
			return arena_errorf(ARENA_E_USAGE,
					    "engine: %zu blocks held fill the ring (%u x %s): no room for block '%s'; "
					    "release blocks before acquiring more",
					    e->n_held, e->n_slots, arena__fmtb(e->slot_bytes), e->l->blocks[block].name);
		if (j != SIZE_MAX)
			e->fetched = j + 1;
	}
	if ((rc = wait_fill(e, block, stream)))
		return arena__engine_fail(e, rc);
	e->held[e->n_held++] = (struct hold){block, j};
	if (j != SIZE_MAX)
		e->cur = j + 1;
	arena__engine_observe(e, block);
	*dptr = (uint8_t *)e->ring_dptr + e->ring.off[block];
	if ((rc = prefetch(e)))
		return arena__engine_fail(e, rc);
	return 0;
}

int arena_engine_release(arena_engine *e, uint32_t block, arena_stream *stream)
{
	int rc;
	if (e->state == ST_FAILED)
		return e->failed_rc;
	if (e->state != ST_STEP)
		return arena_errorf(ARENA_E_USAGE, "engine: release of block %u outside a step", block);
	if (block >= e->l->n_blocks)
		return arena_errorf(ARENA_E_USAGE, "engine: no block %u (the model has %zu)", block, e->l->n_blocks);
	if (e->plan.resident[block]) {
		if (!e->res_held[block])
			return arena_errorf(ARENA_E_USAGE, "engine: release of block '%s' that is not acquired",
					    e->l->blocks[block].name);
		e->res_held[block]--;
		return arena__engine_fail(e, mark_release(e, block, stream));
	}
	size_t h = 0;
	while (h < e->n_held && e->held[h].block != block)
		h++;
	if (h == e->n_held)
		return arena_errorf(ARENA_E_USAGE, "engine: release of block '%s' that is not acquired",
				    e->l->blocks[block].name);
	memmove(&e->held[h], &e->held[h + 1], (e->n_held - h - 1) * sizeof(*e->held));
	e->n_held--;
	if ((rc = mark_release(e, block, stream)))
		return arena__engine_fail(e, rc);
	e->ring.pending[block]--;
	if ((rc = prefetch(e)))
		return arena__engine_fail(e, rc);
	return 0;
}

/* A trace's memory counters now, and what the device has timed so far. */
static int trace_memory(arena_engine *e)
{
	uint64_t free_b = 0, total = 0;
	int rc = e->be->ops->mem_info(e->be, &free_b, &total);
	if (rc)
		return rc;
	arena_trace_counter(e->tr, e->plan.resident_bytes, e->ring_dptr ? (uint64_t)e->n_slots * e->slot_bytes : 0,
			    free_b);
	return arena_trace_poll(e->tr);
}

int arena_engine_step_end(arena_engine *e)
{
	int rc;
	if (e->state == ST_FAILED)
		return e->failed_rc;
	if (e->state != ST_STEP)
		return arena_errorf(ARENA_E_USAGE, "engine: step_end outside a step");
	if (e->n_held)
		return arena_errorf(ARENA_E_USAGE, "engine: step_end with %zu streamed blocks still acquired", e->n_held);
	const double t_end = arena_now_s();
	for (uint32_t b = 0; b < e->l->n_blocks; b++)
		if (e->res_held[b])
			return arena_errorf(ARENA_E_USAGE, "engine: step_end with block '%s' still acquired",
					    e->l->blocks[b].name);
	if (e->tr)
		arena_trace_instant(e->tr, ARENA_TRACE_STEP_END, 0, e->steps, 0);
	const int learned = arena__engine_adopt_order(e);
	/* What this step did not use goes; what was fetched for the next step
	 * stays its first entries, unless the schedule changes or the ring is
	 * made anew (prefetch sees the epoch). */
	size_t carry = e->fetched > e->n_seq ? e->fetched - e->n_seq : 0;
	e->fetched = e->fetched < e->n_seq ? e->fetched : e->n_seq;
	arena__engine_drop_ahead(e);
	e->cur = e->fetched = 0;
	if (carry && learned) {
		for (size_t j = 0; j < carry && e->fetch_epoch == e->ring_epoch; j++)
			e->ring.pending[e->seq[j]]--;
		carry = 0;
	}
	e->fetched = carry;
	rc = arena__engine_release_hosts(e);
	arena__engine_rest_step_end(e);
	e->ending = 1; /* (the decisions made here are this step end's) */
	if (!rc)
		rc = arena__engine_adapt(e, learned);
	/* No room for the ring with every block demoted: the step ends all the
	 * same, without a ring and without learning from it; the next step_begin
	 * places the ring or says so (invariant 6). */
	char no_ring[512] = "";
	if (rc == ARENA_E(DEV_OOM) && ring_missing(e)) {
		snprintf(no_ring, sizeof(no_ring), "%s", arena_last_error());
		rc = 0;
	} else if (!rc) {
		rc = arena__engine_learn_end(e);
	}
	e->ending = 0;
	e->rec.step = e->steps;
	e->rec.resident_bytes = e->plan.resident_bytes;
	e->rec.slot_bytes = e->plan.n_streamed ? e->plan.slot_bytes : 0;
	e->rec.slots = e->plan.n_streamed ? e->n_slots : 0;
	e->hist[e->steps % ARENA_ENGINE_HISTORY] = e->rec;
	e->steps++;
	memset(&e->rec, 0, sizeof(e->rec));
	e->rec.streamed_bytes = e->next_bytes; /* fetched during the step just ended */
	e->rec.moved_bytes = e->next_moved;
	e->rec.copies = e->next_copies;
	e->next_bytes = e->next_copies = e->next_moved = 0;
	e->state = ST_IDLE;
	if (!rc)
		rc = arena_engine_collect(e);
	if (!rc && e->tr)
		rc = trace_memory(e);
	if (rc)
		return arena__engine_fail(e, rc);
	/* The next step's first copies run behind this step's last compute. */
	e->begun = 1;
	rc = ring_missing(e) ? 0 : prefetch(e);
	e->hist[(e->steps - 1) % ARENA_ENGINE_HISTORY].end_s = arena_now_s() - t_end;
	if (!rc && no_ring[0])
		return arena_errorf(ARENA_E(DEV_OOM), "%s; the step ended, and the next places the ring once the device has "
				    "the memory", no_ring);
	return arena__engine_fail(e, rc);
}

int arena_engine_trace_begin(arena_engine *e, const char *path, const char *label, size_t max_records)
{
	if (e->state == ST_FAILED)
		return e->failed_rc;
	if (e->state != ST_IDLE)
		return arena_errorf(ARENA_E_USAGE, "%s: a trace starts between steps (end the step first)", path);
	if (e->tr)
		return arena_errorf(ARENA_E_USAGE, "%s: a trace is being recorded already (end it first)", path);
	int rc = arena_trace_open(e->be, e->l, path, label, max_records, &e->tr);
	if (!rc && (rc = trace_memory(e))) {
		arena_trace_close(e->tr, 0);
		e->tr = NULL;
	}
	return rc;
}

int arena_engine_trace_end(arena_engine *e)
{
	if (!e->tr)
		return arena_errorf(ARENA_E_USAGE, "engine: no trace is being recorded");
	if (e->state == ST_STEP)
		return arena_errorf(ARENA_E_USAGE, "engine: a trace ends between steps (end the step first)");
	arena_trace *t = e->tr;
	e->tr = NULL;
	if (e->state == ST_FAILED) { /* the device's times may be lost with it: nothing is written */
		arena_trace_close(t, 0);
		return e->failed_rc;
	}
	return arena_trace_close(t, 1);
}

int arena_engine_tracing(const arena_engine *e)
{
	return e->tr != NULL;
}

int arena_engine_mode(const arena_engine *e)
{
	return e->o.mode;
}

const arena_residency_plan *arena_engine_plan(const arena_engine *e)
{
	return &e->plan;
}

int arena_engine_step_record(const arena_engine *e, uint64_t step, arena_engine_step *out)
{
	if (step >= e->steps || e->steps - step > ARENA_ENGINE_HISTORY)
		return arena_errorf(ARENA_E_NOT_FOUND, "engine: no record of step %" PRIu64, step);
	*out = e->hist[step % ARENA_ENGINE_HISTORY];
	return 0;
}

uint64_t arena_engine_steps(const arena_engine *e)
{
	return e->steps;
}

int arena_engine_is_resident(const arena_engine *e, uint32_t block)
{
	return block < e->l->n_blocks && e->plan.resident[block];
}

int arena_engine_block_at(const arena_engine *e, uint32_t block, const void *p)
{
	if (!p || block >= e->l->n_blocks)
		return 0;
	if (e->plan.resident[block])
		return p == e->m->mem[block].dev;
	for (size_t h = 0; h < e->n_held; h++) /* held: its slot stays its own until the release */
		if (e->held[h].block == block)
			return p == (const uint8_t *)e->ring_dptr + e->ring.off[block];
	return 0;
}

arena_stream *arena_engine_copy_stream(const arena_engine *e)
{
	return e->cs;
}
