/* engine_moves.c - moves between resident and streamed: a block demoted
 * (its device copy let go) or promoted (copied to the device), the ring
 * fitted to what streams, the set a move goes to (near_set, switch_set),
 * what a move reads and copies, whether it pays for itself, and a look's
 * move made over step ends (pace_start, pace_next).
 *
 * Invariants (engine.h's 1, 3 and 4 are kept here):
 *   1. A block is demoted only when it can come back: it has a host copy,
 *      gets one (ensure_host), or is left to the disk tier with a source to
 *      read it from. Its device memory is freed only after its last release
 *      (ev_use) and its fill (ev_fill) are done, and only between steps.
 *   2. A move (apply_moves) runs in one order: demotions, largest first;
 *      the ring freed; promotions in block order, a DEV_OOM leaving that
 *      block streamed (alloc_retries); then a ring for what streams now,
 *      demoting more while its allocation fails (fit_ring).
 *   3. A move's estimate (arena__engine_move_bytes) walks its demotions in
 *      apply_moves' order (next_demoted), so it asks of each block what
 *      ensure_host will: a host copy within the host budget, or the disk
 *      tier.
 *   4. A move that only a prediction asks for is made only when it pays
 *      (move_pays: engine.h, payback_steps); moves the budget forces are
 *      not held back.
 *   5. plan.resident says where each block is: promote sets it once the
 *      copy is queued, demote clears it once the device copy is gone; the
 *      plan's derived fields follow at arena__engine_refresh. */
#include "engine_int.h"

#include <string.h>

#include "../common/alloc.h"
#include "../common/clock.h"
#include "../common/err.h"

/* Give block b a host copy (re-read from its source, checked) if it has
 * none: a raw slab, or, for an hb4 image streaming coded (the plan of its
 * coded form is there and so are the stages), its coded form, read coded:
 * a quarter fewer bytes held and copied, nothing decoded on the host. */
static int ensure_host(arena_engine *e, uint32_t b)
{
	arena_model *m = e->m;
	if (m->mem[b].host || m->mem[b].wire || !e->l->blocks[b].bytes)
		return 0;
	const arena_wire *plan = arena__engine_disk_coded(e, b);
	if (arena__engine_past_host_budget(e, b, 0))
		return 0; /* over the host budget: it stays in its image (the disk tier) */
	if (!e->o.reread)
		return arena_errorf(ARENA_E_INTERNAL, "block '%s' has no host copy and no source to re-read",
				    e->l->blocks[b].name);
	uint8_t *slab = NULL;
	arena_wire *w = NULL;
	arena__engine_look_wait(e); /* a look's thread may be reading ahead through the same reader */
	int rc = plan ? arena_model_wire_add(m, b, &w) : arena_model_host_add(m, b, &slab);
	if (!rc) {
		if (e->stg) /* the stager reads from the same source */
			arena_stager_lock(e->stg);
		rc = w ? e->o.reread_wire(e->o.reread_ctx, b, 0, e->l->blocks[b].bytes, w)
		       : e->o.reread(e->o.reread_ctx, b, slab, e->l->blocks[b].bytes);
		if (e->stg)
			arena_stager_unlock(e->stg);
		if (rc)
			arena_model_host_discard(m, b);
	}
	if (rc) {
		arena_error_prefix(e->l->blocks[b].name);
		return rc;
	}
	arena_model_host_seal(m, b);
	if (e->moved)
		e->moved[b] = arena__engine_moved_bytes(e, b);
	e->rec.host_read_bytes += e->l->blocks[b].bytes;
	return 0;
}

static int demotable(const arena_engine *e, uint32_t b)
{
	return !arena_block_is_globals(e->l, b) && e->plan.resident[b] && e->l->blocks[b].bytes &&
	       (e->m->mem[b].host || e->m->mem[b].wire || e->o.reread);
}

/* Drop block b's device copy (between steps; invariant 3). */
int arena__engine_demote(arena_engine *e, uint32_t b)
{
	arena_model *m = e->m;
	int rc = ensure_host(e, b);
	if (!rc && m->mem[b].dev && (rc = e->be->ops->event_sync(e->be, e->ev_use[b])) == 0)
		rc = e->be->ops->event_sync(e->be, e->ev_fill[b]);
	if (rc)
		return rc;
	if (m->mem[b].dev) {
		e->be->ops->dev_free(e->be, m->mem[b].dev);
		m->mem[b].dev = NULL;
		m->dev_bytes -= e->l->blocks[b].bytes;
	}
	e->plan.resident[b] = 0;
	e->rec.demotions++;
	e->mv_dem_n++;
	e->mv_dem_b += e->l->blocks[b].bytes;
	if (e->tr)
		arena_trace_instant(e->tr, ARENA_TRACE_DEMOTE, b, e->steps, e->l->blocks[b].bytes);
	return 0;
}

/* The reaper: the unpinning and unmapping a step end's release_hosts left. */
static void *reap_thread(void *arg)
{
	struct reaper *r = arg;
	for (size_t i = 0; i < r->n_drops; i++)
		arena_model_host_drop_do(r->pins, r->be, &r->drops[i]);
	return NULL;
}

void arena__engine_reap_wait(arena_engine *e)
{
	struct reaper *r = &e->reap;
	if (r->running)
		pthread_join(r->th, NULL);
	r->running = 0;
	r->n_drops = 0;
}

/* release_host: the host copies of blocks on the device for good go back to
 * the OS (promoted at an earlier step end: the copy from them is done by
 * now, synced to be sure), unless the caller keeps them or a schedule
 * change moved them (switch_set: the next change moves them back, and
 * demoted then without a host copy they would be read from the image
 * again at every switch); ensure_host reads one again if the block is
 * streamed later. (On the H200, 2026-12-02, a
 * sampling run's RSS grew from 17.2 to 20.8 GiB after a move promoted 45
 * pieces, whose host copies stayed.)
 * The copies go out of the model here; their unpinning and unmapping (or
 * the pages discarded) on the reaper's thread, during the step after. */
int arena__engine_release_hosts(arena_engine *e)
{
	arena__engine_reap_wait(e); /* the last step end's, done during the step */
	if (!e->o.release_host || !e->o.reread)
		return 0;
	arena_model *m = e->m;
	struct reaper *r = &e->reap;
	if (!r->drops && !(r->drops = arena_calloc(e->l->n_blocks ? e->l->n_blocks : 1, sizeof(*r->drops))))
		return arena_errorf(ARENA_E_NOMEM, "engine: out of memory for releasing host copies");
	int rc = 0;
	for (uint32_t b = 0; b < e->l->n_blocks && !rc; b++) {
		const arena_block_mem *bm = &m->mem[b];
		if (!e->plan.resident[b] || !bm->dev || bm->kept || e->switched[b] || !(bm->host || bm->wire) ||
		    (e->pace_on && !e->pace[b]))
			continue;
		rc = e->be->ops->event_sync(e->be, e->ev_fill[b]);
		if (!rc)
			arena_model_host_release_later(m, b, &r->drops[r->n_drops++]);
	}
	if (!r->n_drops)
		return rc;
	r->pins = m->budget;
	r->be = e->be;
	if (pthread_create(&r->th, NULL, reap_thread, r) == 0) {
		r->running = 1;
	} else { /* no thread: here */
		reap_thread(r);
		r->n_drops = 0;
	}
	return rc;
}

/* Saving of demoting b with the ring's slot S (0: nothing streamed): its
 * bytes less the ring's growth when b is larger than a slot. */
static int64_t saving_at(const arena_engine *e, uint32_t b, uint64_t S)
{
	uint64_t sz = e->l->blocks[b].bytes;
	uint64_t grow = sz > S ? (uint64_t)e->n_slots * (sz - S) : 0;
	return (int64_t)sz - (int64_t)grow;
}

/* The same with the ring as the plan has it. */
static int64_t saving(const arena_engine *e, uint32_t b)
{
	return saving_at(e, b, e->plan.n_streamed ? e->plan.slot_bytes : 0);
}

/* Demote the resident block that saves most; 0, 1 if none could go, or an error. */
static int demote_best(arena_engine *e)
{
	int64_t pick = -1, best = 0;
	for (uint32_t b = 0; b < e->l->n_blocks; b++)
		if (demotable(e, b) && saving(e, b) > best)
			best = saving(e, b), pick = b;
	if (pick < 0)
		return 1;
	int rc = arena__engine_demote(e, (uint32_t)pick);
	if (!rc)
		arena__engine_refresh(e);
	return rc;
}

/* Put block b on the device: allocate and copy from its host slab. */
int arena__engine_promote(arena_engine *e, uint32_t b)
{
	arena_model *m = e->m;
	arena_backend *be = e->be;
	uint64_t sz = e->l->blocks[b].bytes;
	int rc = 0;
	if (!m->mem[b].dev && sz) {
		const uint8_t *src;
		if ((rc = arena__engine_host_src(e, b, &src)))
			return rc;
		if ((rc = be->ops->dev_alloc(be, sz, &m->mem[b].dev)))
			return rc;
		m->dev_bytes += sz;
		int k = -1;
		arena_stream *fs;
		if ((e->tr && (rc = arena_trace_copy_begin(e->tr, e->cs, b, sz, ARENA_TRACE_PROMOTE_COPY, e->steps, &k))) ||
		    (rc = arena__engine_send(e, b, m->mem[b].dev, src, &fs)) ||
		    (e->tr && (rc = arena_trace_copy_end(e->tr, k, e->cs))) ||
		    (rc = be->ops->event_record(be, e->ev_fill[b], fs))) {
			be->ops->stream_sync(be, e->cs);
			if (e->ds)
				be->ops->stream_sync(be, e->ds);
			be->ops->dev_free(be, m->mem[b].dev);
			m->mem[b].dev = NULL;
			m->dev_bytes -= sz;
			return rc;
		}
		e->rec.promoted_bytes += sz;
		e->rec.moved_bytes += arena__engine_moved_bytes(e, b);
		e->mv_prom_n++;
		e->mv_prom_b += sz;
		if (e->tr)
			arena_trace_instant(e->tr, ARENA_TRACE_PROMOTE, b, e->steps, sz);
	}
	e->plan.resident[b] = 1;
	return 0;
}

/* Make the ring fit the plan; a device allocation failure demotes and retries. */
int arena__engine_fit_ring(arena_engine *e)
{
	for (;;) {
		uint64_t want = e->plan.n_streamed ? e->plan.slot_bytes : 0;
		int rc = arena__engine_ring_alloc(e, want);
		if (rc != ARENA_E(DEV_OOM))
			return rc;
		e->rec.alloc_retries++;
		int d = demote_best(e);
		if (d < 0)
			return d;
		if (d > 0)
			return rc; /* nothing left to demote: the DEV_OOM stands */
	}
}

/* Move to the resident set `want` (between steps): demote what goes, largest
 * first, free the ring, promote what comes (a device allocation failure
 * leaves that block streamed), then a ring for what is streamed now. */
static int apply_moves(arena_engine *e, const uint8_t *want)
{
	int rc, same = 1;
	for (uint32_t b = 0; b < e->l->n_blocks && same; b++)
		same = !want[b] == !e->plan.resident[b];
	if (same) { /* nothing moves: the ring only, if its shape changed */
		arena__engine_refresh(e);
		return arena__engine_fit_ring(e);
	}
	for (;;) {
		int64_t pick = -1;
		for (uint32_t b = 0; b < e->l->n_blocks; b++)
			if (!want[b] && demotable(e, b) && (pick < 0 || e->l->blocks[b].bytes > e->l->blocks[pick].bytes))
				pick = b;
		if (pick < 0)
			break;
		if ((rc = arena__engine_demote(e, (uint32_t)pick)))
			return rc;
	}
	if ((rc = arena__engine_ring_free(e)))
		return rc;
	for (uint32_t b = 0; b < e->l->n_blocks; b++) {
		if (!want[b] || e->plan.resident[b])
			continue;
		rc = arena__engine_promote(e, b);
		if (rc == ARENA_E(DEV_OOM)) {
			e->rec.alloc_retries++;
			arena_error_clear();
			continue;
		}
		if (rc)
			return rc;
		e->rec.promotions++;
	}
	arena__engine_refresh(e);
	return arena__engine_fit_ring(e);
}

/* The demoted block of a move to `want` after (sz, b) in the order
 * apply_moves demotes them: the largest first, the lower number first
 * among equals; -1 after the last. (sz, b) = (UINT64_MAX, -1): the first. */
static int64_t next_demoted(const arena_engine *e, const uint8_t *want, uint64_t sz, int64_t b)
{
	int64_t pick = -1;
	for (uint32_t i = 0; i < e->l->n_blocks; i++) {
		const uint64_t z = e->l->blocks[i].bytes;
		if (arena_block_is_globals(e->l, i) || want[i] || !e->plan.resident[i] || !z)
			continue;
		if (z > sz || (z == sz && (int64_t)i <= b))
			continue; /* at or before (sz, b) */
		if (pick < 0 || z > e->l->blocks[pick].bytes)
			pick = i;
	}
	return pick;
}

/* What a move from the resident set now to `want` reads and copies:
 * *copy_b, the bytes promoted blocks copy to the device; *read_b, the bytes
 * read from the image now (promoted blocks with no host copy, and demoted
 * blocks whose host copy is gone (release_host) while the host budget
 * takes them, in the order apply_moves demotes them and ensure_host gives
 * them copies); *disk_b, the bytes each step would read from the image
 * more than now (demoted blocks the host budget no longer takes, less
 * promoted blocks that were in the disk tier; 0 without a host budget). */
void arena__engine_move_bytes(const arena_engine *e, const uint8_t *want, double *copy_b, double *read_b,
			      double *disk_b)
{
	const arena_model *m = e->m;
	const int tier = e->o.reread && e->o.host_cap;
	*copy_b = *read_b = *disk_b = 0;
	for (uint32_t b = 0; b < e->l->n_blocks; b++) {
		if (arena_block_is_globals(e->l, b) || !want[b] || e->plan.resident[b] || !e->l->blocks[b].bytes)
			continue;
		*copy_b += (double)e->l->blocks[b].bytes;
		if (!m->mem[b].host && !m->mem[b].wire) {
			*read_b += (double)e->l->blocks[b].bytes;
			*disk_b -= tier ? (double)arena__engine_host_copy_bytes(e, b) : 0; /* read each step no more */
		}
	}
	uint64_t taken = 0; /* host copies the move's demotions make before this one */
	for (int64_t b = next_demoted(e, want, UINT64_MAX, -1); b >= 0;
	     b = next_demoted(e, want, e->l->blocks[b].bytes, b)) {
		if (m->mem[b].host || m->mem[b].wire)
			continue; /* it has its host copy */
		if (arena__engine_past_host_budget(e, (uint32_t)b, taken)) {
			*disk_b += (double)arena__engine_host_copy_bytes(e, (uint32_t)b);
		} else {
			*read_b += (double)e->l->blocks[b].bytes;
			taken += arena__engine_host_copy_bytes(e, (uint32_t)b);
		}
	}
}

static double move_read_bps(const arena_engine *e)
{
	return e->o.move_read_bps > 0 ? e->o.move_read_bps : ARENA_ENGINE_MOVE_READ_BPS;
}

/* The host seconds a move to `want` is estimated to take (apply_moves),
 * unscaled: its copies at move_copy_bps, its reads at move_read_bps; and
 * (disk_b, may be NULL) the bytes it adds to each step's reads from the
 * image (move_bytes). */
static double move_cost_raw(const arena_engine *e, const uint8_t *want, double *disk_b)
{
	const double cb = e->o.move_copy_bps > 0 ? e->o.move_copy_bps : ARENA_ENGINE_MOVE_COPY_BPS;
	double copy_b, read_b, d;
	arena__engine_move_bytes(e, want, &copy_b, &read_b, &d);
	if (disk_b)
		*disk_b = d;
	return copy_b / cb + read_b / move_read_bps(e);
}

/* Is a move to `want`, rather than to `alt` (NULL: staying), worth `gain`
 * seconds a step, less the disk tier's reads it adds a step (at
 * move_read_bps): does it pay for itself within payback_steps steps
 * (ARENA_ENGINE_DEFAULT_PAYBACK), its cost move_cost_raw's less alt's,
 * scaled by what timed moves took against it? The step's record keeps the
 * estimate and that gain, and says when the move was held back. (On the
 * H200, sampling at 8 GiB with 3.1 GB a step in the disk tier, a look's
 * swap put 3.3 GB more there: 0.55 s steps became 0.73 s.) */
int arena__engine_move_pays(arena_engine *e, const uint8_t *want, const uint8_t *alt, double gain)
{
	const unsigned n = e->o.payback_steps ? e->o.payback_steps : ARENA_ENGINE_DEFAULT_PAYBACK;
	double disk_w, disk_a = 0;
	double cost = move_cost_raw(e, want, &disk_w) - (alt ? move_cost_raw(e, alt, &disk_a) : 0);
	cost = (cost > 0 ? cost : 0) * e->move_scale;
	gain -= (disk_w - disk_a) / move_read_bps(e); /* the predictions time copies from host memory */
	e->rec.move_est_s = cost;
	e->rec.move_gain_s = gain;
	if (gain > 0 && gain * n >= cost)
		return 1;
	e->rec.move_held = 1;
	return 0;
}

/* apply_moves, its host time counted in the step's record and timed
 * against its estimate (move_scale: an average of the ratios in which each
 * move weighs as much as all before it; estimates under a millisecond say
 * too little to learn from). */
int arena__engine_apply(arena_engine *e, const uint8_t *want)
{
	const double est = move_cost_raw(e, want, NULL);
	const double t0 = arena_now_s();
	const unsigned n0 = e->rec.promotions + e->rec.demotions;
	int rc = apply_moves(e, want);
	const double took = arena_now_s() - t0;
	if (e->rec.promotions + e->rec.demotions != n0)
		e->moved_end = 1; /* the next step settles: engine_learn.c does not learn its times */
	e->rec.move_s += took;
	if (!rc && est > 1e-3) {
		double r = took / est;
		r = r < 0.05 ? 0.05 : r > 20 ? 20 : r;
		e->move_scale = e->moves_timed++ ? 0.5 * e->move_scale + 0.5 * r : r;
	}
	return rc;
}

/* Device memory the engine would allocate with resident set `res`: each
 * resident block and the ring (its slot the largest streamed block) rounded
 * up as the backend allocates them, as a rounded plan counts its need
 * against the budget (a set grown by its bytes alone went past the budget
 * by the rounding: 272 MB with FLUX.1-dev's 170 resident pieces on an
 * H100, 2026-12-06). Its slot to *slot (0 when nothing streams), its
 * resident blocks' bytes unrounded to *resident. */
static uint64_t set_used(const arena_engine *e, const uint8_t *res, uint64_t min_slot, uint64_t *slot,
			 uint64_t *resident)
{
	uint64_t rb = 0, loss = 0, sl = 0;
	size_t ns = 0;
	for (uint32_t b = 0; b < e->l->n_blocks; b++) {
		uint64_t sz = e->l->blocks[b].bytes;
		if (arena_block_is_globals(e->l, b) || res[b]) {
			rb += sz;
			loss += arena__engine_gran_loss(e->be, sz);
		} else {
			ns++;
			sl = sz > sl ? sz : sl;
		}
	}
	sl = ns && sl < min_slot ? min_slot : ns ? sl : 0;
	*slot = sl;
	if (resident)
		*resident = rb;
	const uint64_t ring = (uint64_t)(ns ? e->n_slots : 0) * sl;
	return rb + loss + ring + arena__engine_gran_loss(e->be, ring);
}

/* Into w, the blocks `keep` names that w has not, in sched's order (then,
 * with `rest`, in block order the ones sched does not name), each while
 * the set still fits `budget` (one that does not is left out, the next
 * tried). */
static void fill_in_order(const arena_engine *e, uint8_t *w, const uint8_t *keep, const uint32_t *sched,
			  size_t n_sched, int rest, uint64_t min_slot, uint64_t budget)
{
	uint64_t slot;
	const size_t n = n_sched + (rest ? e->l->n_blocks : 0);
	for (size_t i = 0; i < n; i++) {
		uint32_t c = i < n_sched ? sched[i] : (uint32_t)(i - n_sched);
		if (w[c] || !keep[c] || arena_block_is_globals(e->l, c))
			continue;
		w[c] = 1;
		if (set_used(e, w, min_slot, &slot, NULL) > budget)
			w[c] = 0;
	}
}

/* The resident set to move to for plan t (made anew for `budget`): the
 * nearest to the set resident now, when it is as good as t's. Planned anew
 * at another budget, the planner can pick another set of about the same
 * bytes (its spread over the schedule shifts), and moving to it swaps
 * blocks both ways, each move a copy and, with release_host, a read from
 * the image (on the H200, 2026-12-02: 1.8 GiB less swapped 65 pieces out
 * and 67 in where about 28 out would have done, a step of 1.71 s against
 * 0.31 s). Over the budget (`grow` 0) it only demotes, until the set fits:
 * among blocks t streams first, the smallest whose demotion (its bytes
 * less the ring's growth) is enough, else the one saving most. With room
 * (`grow` 1) it only promotes blocks t keeps, in t's order, while the set
 * fits. As good: by bytes, resident within one ring slot of t's; with a
 * profile, predicted within 1 % of t's step. Returns e->near, or t's set. */
const uint8_t *arena__engine_near_set(arena_engine *e, const arena_residency_plan *t, uint64_t budget, int grow)
{
	const arena_layout *l = e->l;
	uint8_t *w = e->near;
	uint64_t slot, used;
	memcpy(w, e->plan.resident, l->n_blocks);
	while (!grow && (used = set_used(e, w, t->min_slot, &slot, NULL)) > budget) {
		const uint64_t excess = used - budget;
		int64_t pick = -1, pick_sv = 0;
		int pick_key = 0; /* 4: t streams it, 2: enough; then the smallest enough, or the largest saving */
		for (uint32_t b = 0; b < l->n_blocks; b++) {
			if (!w[b] || !demotable(e, b))
				continue;
			int64_t sv = saving_at(e, b, slot);
			if (sv <= 0)
				continue;
			int key = (t->resident[b] ? 0 : 4) + ((uint64_t)sv >= excess ? 2 : 0);
			if (pick < 0 || key > pick_key || (key == pick_key && ((key & 2) ? sv < pick_sv : sv > pick_sv)))
				pick = b, pick_sv = sv, pick_key = key;
		}
		if (pick < 0)
			return t->resident; /* nothing left that helps: t's set */
		w[pick] = 0;
	}
	if (grow) /* t's order, then the blocks it does not name */
		fill_in_order(e, w, t->resident, t->sched, t->n_sched, 1, t->min_slot, budget);
	if (arena__have_profile(&e->o) && t->step_s > 0) {
		double mine = arena__timed_run(l, &e->o, e->plan.sched, e->plan.bwd, e->plan.n_sched, w, e->plan.slots,
					       &e->tscr);
		if (mine > 0 && (mine <= t->step_s * 1.01 || !arena__engine_move_pays(e, t->resident, w, mine - t->step_s)))
			return w;
		return t->resident;
	}
	uint64_t rb;
	(void)set_used(e, w, t->min_slot, &slot, &rb);
	return rb + t->slot_bytes >= t->resident_bytes ? w : t->resident;
}

/* The resident set to move to at a schedule change (set_schedule between
 * steps: a pipeline's next component, such as Wan 2.2's second expert) for
 * plan t, made for `budget` with the new schedule (taken: e->plan's
 * schedule is the new one); NULL when every block
 * resident now is one the schedule names (the set stays as it is, as for a
 * model's own order given). Blocks resident now that the schedule does not
 * name (the last component's) are of no use to the steps that come: they
 * give way to the blocks t keeps that it names, in t's order, as far as
 * the budget holds them (each promotion a copy the block's first use would
 * make anyway); the blocks it names that are resident now stay; then those
 * it does not name stay while the budget still holds them (they cost
 * nothing there). Kept as they were, the first component's blocks filled
 * the budget and the next streamed every block of every step (a tiny Wan
 * 2.2 pipeline: the text encoder's blocks resident while both experts
 * streamed, tests/python/test_models.py, Wan22Pipeline). The blocks it
 * moves either way keep their host copies from then on (e->switched,
 * release_hosts): the next change moves them back. */
const uint8_t *arena__engine_switch_set(arena_engine *e, const arena_residency_plan *t, uint64_t budget)
{
	const arena_layout *l = e->l;
	uint8_t *w = e->near, *named = e->named;
	uint64_t mine = 0, theirs = 0;
	int other = 0;
	memset(named, 0, l->n_blocks);
	for (size_t i = 0; i < e->plan.n_sched; i++)
		named[e->plan.sched[i]] = 1;
	for (uint32_t b = 0; b < l->n_blocks; b++) {
		w[b] = e->plan.resident[b] && (named[b] || !demotable(e, b));
		other |= e->plan.resident[b] && !w[b];
	}
	if (!other)
		return NULL;
	fill_in_order(e, w, t->resident, e->plan.sched, e->plan.n_sched, 0, t->min_slot, budget);
	for (uint32_t b = 0; b < l->n_blocks; b++) {
		if (named[b] && !arena_block_is_globals(l, b)) {
			mine += w[b] ? l->blocks[b].bytes : 0;
			theirs += t->resident[b] ? l->blocks[b].bytes : 0;
		}
	}
	if (mine + t->slot_bytes < theirs)
		w = t->resident; /* the named blocks resident now hold t's room from it */
	else /* the rest resident now, in block order */
		fill_in_order(e, w, e->plan.resident, NULL, 0, 1, t->min_slot, budget);
	for (uint32_t b = 0; b < l->n_blocks; b++)
		if (!arena_block_is_globals(l, b) && !w[b] != !e->plan.resident[b])
			e->switched[b] = 1;
	return w;
}

/* --- a look's move, over step ends ------------------------------------------- */

/* The part of the move to e->pace this step end makes, into e->near: from
 * the set resident now, demote the blocks pace streams in the order
 * apply_moves demotes them (next_demoted: largest first) until pace_bytes
 * are demoted (at least one block); then promote the blocks pace keeps,
 * in the schedule's order, that fit `budget`. */
static void pace_part(arena_engine *e, uint64_t budget)
{
	const arena_layout *l = e->l;
	uint8_t *w = e->near;
	uint64_t dem = 0;
	memcpy(w, e->plan.resident, l->n_blocks);
	for (int64_t b = next_demoted(e, e->pace, UINT64_MAX, -1); b >= 0 && !(dem && dem >= e->pace_bytes);
	     b = next_demoted(e, e->pace, l->blocks[b].bytes, b)) {
		if (demotable(e, (uint32_t)b)) {
			w[b] = 0;
			dem += l->blocks[b].bytes;
		}
	}
	fill_in_order(e, w, e->pace, e->plan.sched, e->plan.n_sched, 1, e->pace_slot, budget);
}

/* Make this step end's part of the move to e->pace (within the weights
 * budget in force); the move ends when the set is pace's, when a part
 * moves nothing, or when pace no longer fits the budget. */
static int pace_move(arena_engine *e, uint64_t budget)
{
	uint64_t slot;
	if (set_used(e, e->pace, e->pace_slot, &slot, NULL) > budget) {
		e->pace_on = 0; /* the budget moved on: adapt plans for it */
		return 0;
	}
	pace_part(e, budget);
	const unsigned n0 = e->mv_prom_n + e->mv_dem_n;
	int rc = arena__engine_apply(e, e->near);
	if (rc || e->mv_prom_n + e->mv_dem_n == n0 || !memcmp(e->plan.resident, e->pace, e->l->n_blocks))
		e->pace_on = 0;
	return rc;
}

int arena__engine_pace_start(arena_engine *e, const arena_residency_plan *t, uint64_t budget)
{
	const double f = e->o.move_pace ? e->o.move_pace : ARENA_ENGINE_DEFAULT_PACE;
	const double bytes = f * t->step_s * e->o.h2d_bytes_per_s;
	e->pace_on = 0;
	if (!(f > 0) || !(bytes >= 1))
		return arena__engine_apply(e, t->resident);
	memcpy(e->pace, t->resident, e->l->n_blocks);
	e->pace_bytes = bytes < 0x1p63 ? (uint64_t)bytes : UINT64_MAX;
	e->pace_slot = t->min_slot;
	e->pace_gen = e->plan_gen;
	e->pace_on = 1;
	return pace_move(e, budget);
}

int arena__engine_pace_next(arena_engine *e)
{
	if (!e->pace_on)
		return 0;
	/* a mode, schedule or profile set since, or a move adapt made this
	 * step end (pressure, the rest's need): the move is given up */
	if (e->pace_gen != e->plan_gen || e->rec.promotions + e->rec.demotions) {
		e->pace_on = 0;
		return 0;
	}
	arena__decide_snap snap;
	arena__engine_decide_begin(e, &snap);
	int rc = pace_move(e, e->plan.budget);
	arena__engine_decide_end(e, &snap, ARENA_WHY_LEARNED);
	return rc;
}
