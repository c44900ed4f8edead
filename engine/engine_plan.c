/* engine_plan.c - between steps: the weights budget read from the device,
 * the plan for it (kept for the steps after while it holds: the memo), the
 * move adapt makes to it, and the mode, profile and rest the caller sets.
 *
 * Invariants:
 *   1. The budget is engine.h's: under a cap, cap - other - max(rest,
 *      reserve) - headroom, and never more than free + what the engine holds
 *      - max(0, reserve - rest) - max(headroom, share); less the coded
 *      copies' stages.
 *      What the engine holds counts the rounding of its device allocations
 *      (own_rounding). `other` is read at each budget (measure_other).
 *   5. With learn_rest, the reserve is the need learned for the next
 *      step's mode and work (the peak the rest reported in such a step and
 *      a margin), or ARENA_ENGINE_REST_UNKNOWN: then the budget is the safe
 *      one (arena_residency_budget_unknown).
 *   2. A plan is taken from the memo only when it was made under the same
 *      options (memo_gen == plan_gen), has been taken fewer than
 *      ENGINE_MEMO_STEPS times, and holds for the budget now (plan_holds).
 *      Whatever changes the options a plan depends on (the mode, the
 *      schedule, the profile) calls arena__engine_plan_changed.
 *   3. Over the budget, adapt moves at once (demotions only: near_set);
 *      with room, only after `hysteresis` step ends of it, to a plan
 *      room_better prefers. After adapt, the engine uses more than the
 *      budget only when nothing more can be demoted (engine.h invariant 4:
 *      over_budget, or BUDGET with strict).
 *   4. The mode and the profile change only between steps, and a change
 *      drops the entries fetched ahead for the next step.
 *   6. Every change of the plan adapt, take_plan or set_profile makes is
 *      bracketed by decide_begin/decide_end (engine_decide.c), with its why;
 *      budget_now records what each budget was read from (arena__engine_seen). */
#include "engine_int.h"

#include <stdio.h>
#include <string.h>

#include "../common/alloc.h"
#include "../common/clock.h"
#include "../common/err.h"
#include "../common/units.h"

/* What rounding device allocations to the backend's granularity adds to
 * `bytes` (0 for none). */
uint64_t arena__engine_gran_loss(const arena_backend *be, uint64_t bytes)
{
	uint64_t g = be->alloc_granularity;
	return g > 1 && bytes % g ? g - bytes % g : 0;
}

/* The rounding of every device allocation of the model's blocks (and of the
 * ring when e is not NULL): memory that free does not show and that is ours,
 * not another program's. */
uint64_t arena__engine_own_rounding(const arena_model *m, const arena_engine *e)
{
	uint64_t r = 0;
	for (size_t b = 0; b < m->layout->n_blocks; b++)
		if (m->mem[b].dev)
			r += arena__engine_gran_loss(m->backend, m->layout->blocks[b].bytes);
	if (e && e->ring_dptr)
		r += arena__engine_gran_loss(m->backend, (uint64_t)e->n_slots * e->slot_bytes);
	if (e && e->wstage)
		r += arena__engine_gran_loss(m->backend, arena__engine_wire_stage_bytes(e));
	return r;
}

static uint64_t dev_used(const arena_engine *e)
{
	return e->plan.resident_bytes + (uint64_t)(e->plan.n_streamed ? e->n_slots : 0) * e->plan.slot_bytes;
}

/* dev_used as the backend allocates it: with the rounding of the blocks on
 * the device and of the ring, what a budget is held against (a rounded
 * plan's need, near_set's sets). */
static uint64_t dev_alloc(const arena_engine *e)
{
	uint64_t r = arena__engine_own_rounding(e->m, e);
	if (e->wstage) /* (the stages are the budget's already: budget_now) */
		r -= arena__engine_gran_loss(e->be, arena__engine_wire_stage_bytes(e));
	return dev_used(e) + r;
}

/* Room: a plan t for the budget now is worth moving to when it keeps more
 * resident and is not predicted slower (within 0.5%: fewer copies for the
 * same time), or, with a profile, is predicted 2% faster. */
static int room_better(arena_engine *e, const arena_residency_plan *t)
{
	double now_t = arena__engine_predict(e);
	int more = t->resident_bytes > e->plan.resident_bytes;
	if (!(now_t > 0) || !(t->step_s > 0))
		return more;
	return (more && t->step_s <= now_t * 1.005) || t->step_s < now_t * 0.98;
}

/* Take t's schedule and ring shape into the engine's plan (t gets the old
 * arrays, released with it); the caller refreshes. */
static void take_sched(arena_engine *e, arena_residency_plan *t)
{
	uint32_t *sc = e->plan.sched;
	uint8_t *bw = e->plan.bwd;
	size_t n = e->plan.n_sched;
	e->plan.sched = t->sched;
	e->plan.bwd = t->bwd;
	e->plan.n_sched = t->n_sched;
	t->sched = sc;
	t->bwd = bw;
	t->n_sched = n;
	e->plan.slots = t->slots;
	e->plan.depth = t->depth;
}

/* The options the plan depends on changed: the next adapt plans anew. */
void arena__engine_plan_changed(arena_engine *e)
{
	e->plan_gen++;
}

static void rest_need(arena_engine *e);

uint64_t arena_residency_plan_rounding(const arena_layout *l, const arena_residency_plan *p, uint64_t gran)
{
	if (gran <= 1 || !p->resident)
		return 0;
	uint64_t r = 0, ring = p->n_streamed ? (uint64_t)p->slots * p->slot_bytes : 0;
	for (size_t b = 0; b < l->n_blocks; b++)
		if (p->resident[b] && l->blocks[b].bytes % gran)
			r += gran - l->blocks[b].bytes % gran;
	return r + (ring % gran ? gran - ring % gran : 0);
}

/* Does p fit `budget` as a device allocating in `gran` granules holds it? */
static int fits_allocated(const arena_layout *l, const arena_residency_plan *p, uint64_t gran, uint64_t budget)
{
	return p->need_bytes + arena_residency_plan_rounding(l, p, gran) <= budget;
}

/* Is t a better plan than p by the planner's rule: with a profile the
 * shorter predicted step (ties: more resident), else more resident bytes? */
static int plan_better(const arena_residency_plan *t, const arena_residency_plan *p)
{
	if (t->step_s > 0 && p->step_s > 0)
		return t->step_s < p->step_s * (1 - 1e-9) ||
		       (t->step_s <= p->step_s * (1 + 1e-9) && t->resident_bytes > p->resident_bytes);
	return t->resident_bytes > p->resident_bytes;
}

int arena_residency_plan_rounded(const arena_layout *l, const arena_engine_opts *o, uint64_t gran, uint64_t budget,
				 arena_residency_plan *p)
{
	int rc = arena_residency_plan_make(l, o, budget, p);
	if (rc || gran <= 1 || fits_allocated(l, p, gran, budget))
		return rc;
	/* Over as allocated: the plan for the budget less what it is over, a
	 * few times (fewer resident blocks round less), ... */
	arena_residency_plan t;
	int have = 0;
	for (int k = 0; k < 4 && !have; k++) {
		uint64_t over = p->need_bytes + arena_residency_plan_rounding(l, p, gran) - budget;
		rc = arena_residency_plan_make(l, o, p->budget > over ? p->budget - over : 0, &t);
		if (rc == ARENA_E(BUDGET))
			break;
		arena_residency_plan_release(p);
		if (rc)
			return rc;
		*p = t;
		have = fits_allocated(l, p, gran, budget);
	}
	arena_error_clear();
	/* ... and the plan for the budget less the most rounding can add (a
	 * granule for each block and the ring), which fits: a plan that fills
	 * the room it freed refills it with other blocks and their rounding
	 * again, and the planner's fill is not monotonic in the budget. The
	 * better of the two. */
	const uint64_t most = ((uint64_t)l->n_blocks + 1) * gran;
	rc = budget > most ? arena_residency_plan_make(l, o, budget - most, &t) : ARENA_E(BUDGET);
	if (rc == 0) {
		if (!have || plan_better(&t, p)) {
			arena_residency_plan_release(p);
			*p = t;
		} else {
			arena_residency_plan_release(&t);
		}
		return 0;
	}
	if (rc != ARENA_E(BUDGET)) {
		arena_residency_plan_release(p);
		return rc;
	}
	arena_error_clear();
	if (have)
		return 0;
	/* None fits as allocated: the smallest plan (its bytes fit the budget,
	 * its rounding may not: the caller's over-budget rules apply, as to a
	 * budget below the smallest plan's need). */
	arena_residency_plan_release(p);
	if ((rc = arena_residency_plan_make(l, o, 0, p)) != ARENA_E(BUDGET))
		return rc; /* NOMEM, or a plan that needs nothing */
	arena_error_clear();
	return arena_residency_plan_make(l, o, p->min_need_bytes, p);
}

/* arena_residency_plan_make, counted, for what the backend allocates
 * (`rounded`: arena_residency_plan_rounded; 0: for the smallest plan, made
 * for its own need when nothing fits). */
static int make_plan(arena_engine *e, uint64_t budget, arena_residency_plan *t, int rounded)
{
	e->plans_made++;
	const double t0 = arena_now_s();
	int rc = rounded ? arena_residency_plan_rounded(e->l, &e->o, e->be->alloc_granularity, budget, t)
			 : arena_residency_plan_make(e->l, &e->o, budget, t);
	e->rec.plan_s += arena_now_s() - t0;
	return rc;
}

/* Keep t as the memo for `budget` (an allocation failure only loses the memo). */
void arena__engine_memo_keep(arena_engine *e, const arena_residency_plan *t, uint64_t budget)
{
	arena_residency_plan_release(&e->memo);
	e->memo_ok = 0;
	if (arena_residency_plan_copy(t, &e->memo)) {
		arena_error_clear();
		return;
	}
	e->memo_budget = budget;
	e->memo_gen = e->plan_gen;
	e->memo_age = 0;
	e->memo_ok = 1;
}

/* Does plan t, made for budget `made`, hold for `budget`? Room less than its
 * smallest streamed block makes no block resident; a budget that holds every
 * block does (the ring goes too); less than t needs does not, except that
 * over budget the smallest plan holds for the budget it was made for. */
int arena__engine_plan_holds(const arena_engine *e, const arena_residency_plan *t, uint64_t made, uint64_t budget)
{
	uint64_t slack = UINT64_MAX;
	for (size_t i = 0; i < t->n_sched; i++) {
		uint32_t b = t->sched[i];
		if (!t->resident[b] && e->l->blocks[b].bytes < slack)
			slack = e->l->blocks[b].bytes;
	}
	if (!fits_allocated(e->l, t, e->be->alloc_granularity, budget) && budget != made)
		return 0;
	if (budget > made + (slack == UINT64_MAX ? 0 : slack))
		return 0;
	return !t->n_streamed || budget < e->all_bytes;
}

uint64_t arena__engine_alloc_bytes(const arena_engine *e)
{
	uint64_t b = e->m->dev_bytes + arena__engine_wire_stage_bytes(e) + arena__engine_own_rounding(e->m, e);
	if (e->ring_dptr)
		b += (uint64_t)e->n_slots * e->slot_bytes;
	return b;
}

/* The process's device memory beside the engine's and the rest's: the
 * backend's figure for the process (*proc; 0 when it cannot read it) less
 * both; where the backend cannot read it, the device's use less both, at
 * most 1 GiB (other programs' memory would be in it). `held`: the engine's
 * device bytes. Returns it; *measured says which. */
static uint64_t other_now(arena_engine *e, uint64_t free_b, uint64_t total, uint64_t held, uint64_t *proc,
			  int *measured)
{
	arena_backend *be = e->be;
	uint64_t p = 0, known = arena_size_add(held, e->o.rest); /* (rest: as the caller reported it) */
	if (be->ops->proc_mem && be->ops->proc_mem(be, &p) == 0) {
		*proc = p;
		*measured = 1;
		return p > known ? p - known : 0;
	}
	arena_error_clear();
	*proc = 0;
	*measured = 0;
	uint64_t used = total > free_b ? total - free_b : 0;
	uint64_t est = used > known ? used - known : 0;
	return est < (1ull << 30) ? est : 1ull << 30;
}

/* other_now into o.other, at a planning point (a step end, a mode change, a
 * work told between steps), where the rest's report is fresh: read inside a
 * step, torch's memory not yet reported would count as the process's other. */
static void measure_other(arena_engine *e, uint64_t free_b, uint64_t total, uint64_t held)
{
	uint64_t proc;
	e->o.other = other_now(e, free_b, total, held, &proc, &e->other_measured);
}

uint64_t arena__engine_budget(arena_engine *e, uint64_t free_b, uint64_t total, uint64_t held, uint64_t stage,
			      uint64_t *headroom, uint64_t *reserve)
{
	uint64_t b, h, w;
	measure_other(e, free_b, total, held);
	arena_residency_budget(total, arena_size_add(free_b, held), &e->o, &b, &h, &w);
	if (e->o.reserve == ARENA_ENGINE_REST_UNKNOWN)
		b = arena_residency_budget_unknown(e->l, &e->o, b, stage);
	if (headroom)
		*headroom = h;
	if (reserve)
		*reserve = w;
	return b;
}

void arena__engine_seen(arena_engine *e, uint64_t budget, uint64_t free_b, uint64_t held)
{
	e->seen_budget = budget;
	e->seen_free = free_b;
	e->seen_avail = arena_size_add(arena_size_add(free_b, held), e->o.rest);
	e->seen_need = e->o.rest > e->plan.reserve ? e->o.rest : e->plan.reserve;
	e->seen_unknown = e->o.reserve == ARENA_ENGINE_REST_UNKNOWN;
}

/* The weights budget now (engine.h): the device's free memory read again,
 * what the engine holds (`used`, its stages, the rounding of its
 * allocations) counted in; less what the process holds beside the engine
 * (the rest at its need, `other`); less the coded copies' stages. *free_out:
 * the free memory read. */
static int budget_now(arena_engine *e, uint64_t used, uint64_t *budget, uint64_t *free_out)
{
	arena_backend *be = e->be;
	uint64_t free_b, total;
	int rc = be->ops->mem_info(be, &free_b, &total);
	if (rc)
		return rc;
	const uint64_t held = used + arena__engine_wire_stage_bytes(e) + arena__engine_own_rounding(e->m, e);
	uint64_t st = e->wstage ? arena__engine_wire_stage_bytes(e) +
					  arena__engine_gran_loss(be, arena__engine_wire_stage_bytes(e))
				: 0;
	*budget = arena__engine_budget(e, free_b, total, held, st, &e->plan.headroom, &e->plan.reserve);
	*budget = *budget > st ? *budget - st : 0; /* the coded copies' stages stay */
	*free_out = free_b;
	arena__engine_seen(e, *budget, free_b, held);
	return 0;
}

/* The plan for the budget now under e->o: the weights budget and the plan
 * (the smallest one when none fits, unless strict). With `memo`, the last
 * plan made this way when it still holds (see struct arena_engine). */
static int plan_now(arena_engine *e, uint64_t used, uint64_t *budget, uint64_t *free_out, arena_residency_plan *t,
		    int memo)
{
	uint64_t free_b;
	int rc = budget_now(e, used, budget, &free_b);
	if (rc)
		return rc;
	*free_out = free_b;
	if (memo && e->memo_ok && e->memo_gen == e->plan_gen && e->memo_age < ENGINE_MEMO_STEPS &&
	    arena__engine_plan_holds(e, &e->memo, e->memo_budget, *budget)) {
		if ((rc = arena_residency_plan_copy(&e->memo, t)) == 0)
			e->memo_age++;
		return rc;
	}
	rc = make_plan(e, *budget, t, 1);
	if (rc == ARENA_E(BUDGET)) {
		if (e->o.strict && e->o.reserve != ARENA_ENGINE_REST_UNKNOWN) {
			char why[512];
			snprintf(why, sizeof(why), "%s", arena_last_error());
			return arena_errorf(ARENA_E(BUDGET), "engine: the budget for weights fell to %s (%s free): %s",
					    arena__fmtb(*budget), arena__fmtb(free_b), why);
		}
		arena_error_clear();
		rc = make_plan(e, t->min_need_bytes, t, 0); /* the smallest plan (its need: BUDGET's, unrounded) */
	}
	if (!rc && memo)
		arena__engine_memo_keep(e, t, *budget);
	return rc;
}

/* Between steps: re-read free memory; under pressure move to the plan for
 * the new budget at once (to the nearest set as good as its own, near_set),
 * with room after `hysteresis` steps of it. With a
 * new schedule (learned), the plan takes it and keeps its resident blocks
 * unless they no longer fit. */
int arena__engine_adapt(arena_engine *e, int new_sched)
{
	uint64_t free_b, budget;
	arena_residency_plan t;
	uint64_t used = dev_used(e);
	int rc = plan_now(e, used, &budget, &free_b, &t, 1);
	if (rc)
		return rc;
	e->rec.budget = budget;
	e->rec.free_bytes = free_b;
	e->plan.budget = budget;
	if (new_sched) {
		take_sched(e, &t);
		arena__engine_refresh(e);
	}
	unsigned hyst = e->o.hysteresis ? e->o.hysteresis : ARENA_ENGINE_DEFAULT_HYSTERESIS;
	arena__decide_snap snap;
	arena__engine_decide_begin(e, &snap);
	int why = 0;
	if (dev_alloc(e) > budget) {
		e->room_steps = 0;
		why = arena__engine_why(e, 0, new_sched);
		rc = arena__engine_apply(e, arena__engine_near_set(e, &t, budget, 0));
	} else if (!e->pace_on && room_better(e, &t)) { /* a look's move under way is the move to the memo */
		if (++e->room_steps >= hyst || e->room_now) {
			e->room_steps = 0;
			why = arena__engine_why(e, 1, new_sched);
			rc = arena__engine_apply(e, arena__engine_near_set(e, &t, budget, 1));
		}
	} else {
		e->room_steps = 0;
	}
	if (why)
		arena__engine_decide_end(e, &snap, why);
	else if (!e->room_steps) /* nothing to do, nothing pending: what the next move is explained against */
		arena__engine_why_settle(e);
	e->room_now = 0;
	e->rest_oom = 0;
	arena_residency_plan_release(&t);
	if (!rc && dev_alloc(e) > budget) {
		e->rec.over_budget = 1;
		if (e->o.strict)
			rc = arena_errorf(ARENA_E(BUDGET),
					  "engine: %s of device memory needed, over the budget of %s (%s free), and "
					  "nothing left to demote",
					  arena__fmtb(dev_alloc(e)), arena__fmtb(budget), arena__fmtb(free_b));
	}
	return rc;
}

/* Between steps, after plan t for `budget` under new options (a mode, a
 * schedule given: `why`): take its schedule and ring; the resident blocks
 * stay as they are where they fit, else t's set is moved to at once. A
 * schedule that does not name blocks resident now (a pipeline's next
 * component) moves to switch_set's set. Releases t. */
static int take_plan(arena_engine *e, arena_residency_plan *t, uint64_t budget, int why)
{
	int rc;
	arena__decide_snap snap;
	arena__engine_decide_begin(e, &snap);
	take_sched(e, t);
	arena__engine_refresh(e); /* the resident blocks as they are, with the new schedule and ring */
	const uint8_t *sw = why == ARENA_WHY_SCHEDULE ? arena__engine_switch_set(e, t, budget) : NULL;
	if (sw)
		rc = arena__engine_apply(e, sw);
	else if (e->plan.need_bytes > budget)
		rc = arena__engine_apply(e, t->resident);
	else
		rc = arena__engine_fit_ring(e);
	if (!rc)
		arena__engine_refresh(e);
	arena__engine_decide_end(e, &snap, why);
	arena_residency_plan_release(t);
	e->room_steps = 0;
	return rc;
}

int arena_engine_set_schedule(arena_engine *e, const uint32_t *sched, size_t n)
{
	if (e->state == ST_FAILED)
		return e->failed_rc;
	if (e->state != ST_IDLE)
		return arena_errorf(ARENA_E_USAGE, "engine: set_schedule inside a step (end the step first)");
	if (!sched || !n || n > e->max_sched)
		return arena_errorf(ARENA_E_USAGE, "engine: a schedule of %zu entries (1 to %zu for this model)", n,
				    e->max_sched);
	for (size_t i = 0; i < n; i++)
		if (sched[i] >= e->l->n_blocks || arena_block_is_globals(e->l, sched[i]))
			return arena_errorf(ARENA_E_USAGE, "engine: schedule entry %zu is block %u, %s", i, sched[i],
					    sched[i] >= e->l->n_blocks ? "out of range" : "the globals block (always resident)");
	int md = e->o.mode == ARENA_MODE_TRAIN;
	if (e->o.sched == e->msched[md] && e->o.n_sched == n && !memcmp(e->msched[md], sched, n * sizeof(*sched)))
		return 0;
	/* The copies issued for the next step in the old order are forgotten. */
	e->cur = 0;
	arena__engine_drop_ahead(e);
	e->begun = 0;
	uint64_t used = dev_used(e), budget, free_b;
	arena_engine_opts old = e->o;
	uint32_t *keep = arena_malloc(e->max_sched * sizeof(*keep));
	if (!keep)
		return arena_errorf(ARENA_E_NOMEM, "engine: out of memory for a schedule");
	size_t keep_n = e->mn[md];
	memcpy(keep, e->msched[md], keep_n * sizeof(*keep));
	memcpy(e->msched[md], sched, n * sizeof(*sched));
	e->mn[md] = n;
	e->o.sched = e->msched[md];
	e->o.n_sched = n;
	arena__engine_profile_cover(e);
	e->ahead = SIZE_MAX;
	arena_residency_plan t;
	arena__engine_plan_changed(e);
	int rc = plan_now(e, used, &budget, &free_b, &t, 0);
	if (rc) {
		memcpy(e->msched[md], keep, keep_n * sizeof(*keep));
		e->mn[md] = keep_n;
		e->o = old;
		arena_free(keep);
		return rc == ARENA_E_USAGE ? rc : arena__engine_fail(e, rc);
	}
	arena_free(keep);
	e->n_slots = arena__ring_slots(&e->o);
	return arena__engine_fail(e, take_plan(e, &t, budget, ARENA_WHY_SCHEDULE));
}

int arena_engine_set_mode(arena_engine *e, int mode)
{
	return arena_engine_set_mode_ring(e, mode, 0);
}

int arena_engine_set_mode_ring(arena_engine *e, int mode, unsigned depth)
{
	int rc;
	if (e->state == ST_FAILED)
		return e->failed_rc;
	if (e->state != ST_IDLE)
		return arena_errorf(ARENA_E_USAGE, "engine: set_mode inside a step (end the step first)");
	if (mode != ARENA_MODE_SAMPLE && mode != ARENA_MODE_TRAIN)
		return arena_errorf(ARENA_E_USAGE, "engine: mode %d is neither sample nor train", mode);
	if (mode == e->o.mode)
		return 0;
	if (e->tr)
		arena_trace_instant(e->tr, ARENA_TRACE_MODE, 0, e->steps, (uint64_t)mode);
	/* The copies issued for the next step in the old mode are forgotten. */
	e->cur = 0;
	arena__engine_drop_ahead(e);
	e->begun = 0;
	uint64_t used = dev_used(e), budget, free_b;
	int md = mode == ARENA_MODE_TRAIN;
	arena_engine_opts old = e->o;
	e->o.mode = mode;
	if (depth)
		e->o.depth = depth;
	rest_need(e);
	e->o.sched = e->mn[md] ? e->msched[md] : NULL;
	e->o.n_sched = e->mn[md];
	arena__engine_profile_cover(e);
	e->ahead = SIZE_MAX;
	arena_residency_plan t;
	arena__engine_plan_changed(e);
	if ((rc = plan_now(e, used, &budget, &free_b, &t, 0))) {
		e->o = old;
		return rc == ARENA_E_USAGE ? rc : arena__engine_fail(e, rc);
	}
	e->n_slots = arena__ring_slots(&e->o);
	return arena__engine_fail(e, take_plan(e, &t, budget, ARENA_WHY_MODE));
}

int arena_engine_set_profile(arena_engine *e, const double *cost, double h2d_bytes_per_s, double backward_factor)
{
	size_t n = e->l->n_blocks;
	if (e->state == ST_FAILED)
		return e->failed_rc;
	if (e->state != ST_IDLE)
		return arena_errorf(ARENA_E_USAGE, "engine: set_profile inside a step (end the step first)");
	if (!(h2d_bytes_per_s > 0 && h2d_bytes_per_s < 1e15) || !(backward_factor >= 0 && backward_factor < 1e6))
		return arena_errorf(ARENA_E_USAGE, "engine: a profile's rate must be > 0 and its backward factor >= 0, finite");
	for (size_t b = 0; b < n; b++)
		if (!(cost[b] >= 0 && cost[b] < 1e9))
			return arena_errorf(ARENA_E_USAGE, "engine: the cost of block '%s' is not a finite number >= 0",
					    e->l->blocks[b].name);
	if (!e->cost && !(e->cost = arena_calloc(n ? n : 1, sizeof(*e->cost))))
		return arena_errorf(ARENA_E_NOMEM, "engine: out of memory");
	memcpy(e->cost, cost, n * sizeof(*cost));
	e->o.cost = e->cost;
	e->o.hold = NULL;
	e->o.bcost = e->o.bhold = NULL;
	e->o.h2d_bytes_per_s = h2d_bytes_per_s;
	e->o.backward_factor = backward_factor;
	e->profile_learned = 1; /* nothing more to learn */
	uint64_t budget, free_b;
	arena_residency_plan t;
	arena__engine_plan_changed(e);
	int rc = plan_now(e, dev_used(e), &budget, &free_b, &t, 0);
	if (rc)
		return rc == ARENA_E_USAGE ? rc : arena__engine_fail(e, rc);
	/* Move to the plan the profile prefers, now (the caller asked for it). */
	e->cur = 0;
	arena__engine_drop_ahead(e);
	e->begun = 0;
	arena__decide_snap snap;
	arena__engine_decide_begin(e, &snap);
	rc = arena__engine_apply(e, t.resident);
	arena__engine_decide_end(e, &snap, ARENA_WHY_PROFILE);
	arena_residency_plan_release(&t);
	return arena__engine_fail(e, rc);
}

/* --- the rest of the process ---------------------------------------------------- */

/* The learned entry of (mode, key), or NULL. */
static struct engine_work *work_find(arena_engine *e, int mode, uint64_t key)
{
	for (unsigned i = 0; i < e->n_works; i++)
		if (e->works[i].key == key && e->works[i].mode == mode)
			return &e->works[i];
	return NULL;
}

/* o.reserve for the next step: what its mode and work need, learned (its
 * peak and a margin), or unknown (learn_rest only). */
static void rest_need(arena_engine *e)
{
	if (!e->o.learn_rest)
		return;
	struct engine_work *w = work_find(e, e->o.mode, e->work);
	uint64_t old = e->o.reserve;
	if (!w) {
		e->o.reserve = ARENA_ENGINE_REST_UNKNOWN;
	} else {
		uint64_t total = 0, f = 0;
		if (e->be->ops->mem_info(e->be, &f, &total))
			arena_error_clear();
		uint64_t base = e->o.cap && (e->o.cap < total || !total) ? e->o.cap : total;
		e->o.reserve = arena_size_add(w->peak, arena_residency_rest_margin(w->peak, base));
		if (e->o.reserve >= ARENA_ENGINE_REST_UNKNOWN) /* (a peak near 2^64: as large, not "unknown") */
			e->o.reserve = ARENA_ENGINE_REST_UNKNOWN - 1;
		w->used = ++e->work_clock;
	}
	if (e->o.reserve != old) {
		arena__engine_plan_changed(e);
		if (old == ARENA_ENGINE_REST_UNKNOWN || (e->o.reserve != ARENA_ENGINE_REST_UNKNOWN && e->o.reserve < old))
			e->room_now = 1; /* room the rest does not need: take it now, not after hysteresis */
	}
}

/* Learn that the rest held `peak` at most in a step of the mode in force
 * and work `key` (learn_rest). */
static void work_learn(arena_engine *e, uint64_t key, uint64_t peak)
{
	struct engine_work *w = work_find(e, e->o.mode, key);
	if (!w) {
		unsigned k = e->n_works;
		if (k == ENGINE_REST_WORKS) { /* the least recently used goes */
			k = 0;
			for (unsigned i = 1; i < e->n_works; i++)
				if (e->works[i].used < e->works[k].used)
					k = i;
		} else {
			e->n_works++;
		}
		w = &e->works[k];
		*w = (struct engine_work){.key = key, .mode = e->o.mode};
	}
	if (peak > w->peak)
		w->peak = peak;
	w->used = ++e->work_clock;
}

void arena__engine_rest_step_end(arena_engine *e)
{
	if (e->o.learn_rest && e->rest_reported)
		work_learn(e, e->work, e->rest_peak);
	if (e->rest_reported)
		e->work = e->next_work;
	e->rest_peak = e->o.rest;
	e->rest_reported = 0;
	rest_need(e);
}

int arena_engine_rest_report(arena_engine *e, uint64_t now, uint64_t peak, uint64_t work, unsigned flags)
{
	if (e->state == ST_FAILED)
		return e->failed_rc;
	e->o.rest = now;
	if (peak < now)
		peak = now;
	if (peak > e->rest_peak)
		e->rest_peak = peak;
	if (flags & ARENA_REST_OOM)
		e->rest_oom = 1; /* the moves this need causes are the out-of-memory's (engine_decide.c) */
	if (e->state == ST_STEP) { /* the step that ends: its successor's work */
		e->next_work = work ? work : e->work;
		e->rest_reported = 1;
		return 0;
	}
	const int oom = !!(flags & ARENA_REST_OOM);
	if (!oom && (!work || work == e->work))
		return 0;
	/* Between steps, another work, or what the rest needed when it ran out of
	 * memory: the step about to begin is planned for it now, as a mode
	 * change is (what was fetched for it under the old plan goes; a need
	 * larger than the room demotes at once), so that a step run again after
	 * an out-of-memory finds that room. */
	if (work)
		e->work = e->next_work = work;
	uint64_t old = e->o.reserve;
	if (oom && e->o.learn_rest) {
		work_learn(e, e->work, peak);
		e->rest_peak = e->o.rest;
	}
	rest_need(e);
	if (e->o.reserve == old && !oom)
		return 0;
	e->cur = 0;
	arena__engine_drop_ahead(e);
	e->begun = 0;
	return arena__engine_fail(e, arena__engine_adapt(e, 0));
}

void arena_engine_set_rest(arena_engine *e, uint64_t bytes)
{
	(void)arena_engine_rest_report(e, bytes, bytes, 0, 0); /* (work 0: nothing planned here) */
}

int arena_engine_memory(arena_engine *e, arena_memory_info *out)
{
	arena_backend *be = e->be;
	uint64_t free_b = 0, total = 0;
	int rc = be->ops->mem_info(be, &free_b, &total);
	if (rc)
		return rc;
	/* what the last planning point read: the rest's limit a step runs under */
	uint64_t alloc = arena__engine_alloc_bytes(e), b, h, need, proc = 0;
	int measured = 0;
	(void)other_now(e, free_b, total, alloc, &proc, &measured); /* (only the process's figure now) */
	arena_residency_budget(total, arena_size_add(free_b, alloc), &e->o, &b, &h, &need);
	uint64_t limit = 0;
	if (e->o.cap) {
		uint64_t used = arena_size_add(arena_size_add(e->o.other, alloc), h / 2);
		limit = e->o.cap > used ? e->o.cap - used : 0;
	}
	const uint64_t slack = e->o.share > h ? e->o.share : h; /* what the plan leaves free */
	if (e->o.reserve == ARENA_ENGINE_REST_UNKNOWN) /* all it may take */
		need = e->o.cap ? limit
				: (arena_size_add(free_b, e->o.rest) > slack ? arena_size_add(free_b, e->o.rest) - slack : 0);
	*out = (arena_memory_info){.cap = e->o.cap,
				   .process = proc,
				   .other = e->o.other,
				   .arena = alloc,
				   .rest = e->o.rest,
				   .rest_need = need,
				   .rest_limit = limit,
				   .headroom = h,
				   .learned = e->o.learn_rest && e->o.reserve != ARENA_ENGINE_REST_UNKNOWN,
				   .other_measured = e->other_measured,
				   .works = e->n_works,
				   .share_card = e->o.share};
	return 0;
}

uint64_t arena_engine_plans_made(const arena_engine *e)
{
	return e->plans_made;
}
