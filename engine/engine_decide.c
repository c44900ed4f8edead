/* engine_decide.c - the record of decisions: one record per change of the
 * plan (blocks promoted or demoted, the ring made anew), with what moved,
 * the budget and free memory it was made for, the streamed bytes and the
 * step the plan predicts before and after, and why it changed.
 *
 * Why: a change the caller asked for between steps is named by its call
 * (mode, schedule, profile); a look at the learned profile that moves is
 * LEARNED. For a move adapt makes, the inputs of the budget are compared
 * with those of the last decision (or of the last step end that found
 * nothing to do, so that a promotion made `hysteresis` steps after the room
 * came is explained by what made the room): the device memory that is not
 * other programs' (free + the engine's own + the rest's as reported) and
 * what the rest of the process takes of it at its peak (the larger of what
 * it holds and its reserve). The one that gave (promotions) or took
 * (demotions) more names the move: other programs, PRESSURE (YIELD with a
 * share left to them: the move gives memory back); the rest, NEED (OOM when
 * its need was reported after it ran out of memory); a work not seen yet,
 * or seen at last, is the rest's. Neither: LEARNED when the order was
 * learned at this step end or the plan is by a learned profile, else
 * REPLAN (the plan made anew).
 *
 * Invariants:
 *   1. Records are made only between steps (step_end, or a call between
 *      steps), in the order made; dec[i % ARENA_ENGINE_HISTORY] is decision
 *      i for the last ARENA_ENGINE_HISTORY of them.
 *   2. A record says only what changed: promoted/demoted count the moves
 *      made since decide_begin (demote, promote count every move), and a
 *      change that moved nothing and left the ring's bytes as they were is
 *      not recorded. */
#include "engine_int.h"

#include <inttypes.h>
#include <string.h>

#include "../common/alloc.h"
#include "../common/err.h"

const char *arena_engine_why_name(int why)
{
	static const char *const names[] = {"?",	"learned", "pressure", "yield", "need",
					    "oom",	"mode",    "schedule", "profile", "replan"};
	return why > 0 && why <= ARENA_WHY_REPLAN ? names[why] : names[0];
}

int arena__engine_decide_init(arena_engine *e)
{
	e->dec = arena_calloc(ARENA_ENGINE_HISTORY, sizeof(*e->dec));
	e->dec_res = arena_calloc(e->l->n_blocks ? e->l->n_blocks : 1, 1);
	return e->dec && e->dec_res ? 0 : arena_errorf(ARENA_E_NOMEM, "engine: out of memory");
}

void arena__engine_decide_free(arena_engine *e)
{
	arena_free(e->dec);
	arena_free(e->dec_res);
	e->dec = NULL;
	e->dec_res = NULL;
}

/* The ring's device bytes as allocated now. */
static uint64_t ring_bytes(const arena_engine *e)
{
	return e->ring_dptr ? e->ring.bytes : 0;
}

void arena__engine_decide_begin(arena_engine *e, arena__decide_snap *s)
{
	memcpy(e->dec_res, e->plan.resident, e->l->n_blocks);
	*s = (arena__decide_snap){.resident = e->plan.resident_bytes,
				  .ring = ring_bytes(e),
				  .stream = e->plan.n_streamed ? e->plan.stream_bytes_per_step : 0,
				  .step_s = e->plan.step_s,
				  .prom_n = e->mv_prom_n,
				  .dem_n = e->mv_dem_n,
				  .prom_b = e->mv_prom_b,
				  .dem_b = e->mv_dem_b};
}

void arena__engine_why_settle(arena_engine *e)
{
	e->why_avail = e->seen_avail;
	e->why_need = e->seen_need;
	e->why_unknown = e->seen_unknown;
}

void arena__engine_decide_end(arena_engine *e, const arena__decide_snap *s, int why)
{
	const uint64_t ring = ring_bytes(e);
	if (e->mv_prom_n == s->prom_n && e->mv_dem_n == s->dem_n && ring == s->ring)
		return;
	/* The step before and after, by one profile: the one in force now (the
	 * plan's step_s before was predicted when the plan was made, and the
	 * profile learned has moved since), over the schedule in force for a
	 * move within one (a mode or schedule set: the old plan's prediction). */
	double before = s->step_s;
	if (!(s->after_s > 0) && why != ARENA_WHY_MODE && why != ARENA_WHY_SCHEDULE && arena__have_profile(&e->o)) {
		const double t = arena__timed_run(e->l, &e->o, e->plan.sched, e->plan.bwd, e->plan.n_sched, e->dec_res,
						  e->plan.slots, &e->tscr);
		before = t > 0 ? t : 0;
	}
	e->dec[e->n_dec % ARENA_ENGINE_HISTORY] = (arena_engine_decision){
		.step = e->steps,
		.between = !e->ending,
		.why = why,
		.promoted = (unsigned)(e->mv_prom_n - s->prom_n),
		.demoted = (unsigned)(e->mv_dem_n - s->dem_n),
		.promoted_bytes = e->mv_prom_b - s->prom_b,
		.demoted_bytes = e->mv_dem_b - s->dem_b,
		.resident_before = s->resident,
		.resident_after = e->plan.resident_bytes,
		.ring_before = s->ring,
		.ring_after = ring,
		.budget = e->seen_budget,
		.free_bytes = e->seen_free,
		.stream_before = s->stream,
		.stream_after = e->plan.n_streamed ? e->plan.stream_bytes_per_step : 0,
		.step_before_s = before,
		.step_after_s = s->after_s > 0 ? s->after_s : e->plan.step_s};
	e->n_dec++;
	arena__engine_why_settle(e);
}

/* a - b as a signed amount (both below 2^63 in any real device). */
static int64_t diff(uint64_t a, uint64_t b)
{
	return a >= b ? (int64_t)(a - b) : -(int64_t)(b - a);
}

int arena__engine_why(const arena_engine *e, int grow, int new_sched)
{
	/* bytes that made room (grow) or took it (demotions): other programs', the rest's */
	int64_t dev = diff(e->seen_avail, e->why_avail), need = diff(e->why_need, e->seen_need);
	if (!grow)
		dev = -dev, need = -need;
	if (e->seen_unknown != e->why_unknown && e->seen_unknown == !grow)
		need = INT64_MAX; /* a work not seen (the safe plan), or one learned at last */
	if (need > 0 && need >= dev)
		return e->rest_oom ? ARENA_WHY_OOM : ARENA_WHY_NEED;
	if (dev > 0)
		return !grow && e->o.share ? ARENA_WHY_YIELD : ARENA_WHY_PRESSURE;
	if (new_sched || (e->lcost && e->o.cost == e->lcost))
		return ARENA_WHY_LEARNED;
	return ARENA_WHY_REPLAN;
}

uint64_t arena_engine_decisions(const arena_engine *e)
{
	return e->n_dec;
}

int arena_engine_decision_get(const arena_engine *e, uint64_t i, arena_engine_decision *out)
{
	if (i >= e->n_dec || e->n_dec - i > ARENA_ENGINE_HISTORY)
		return arena_errorf(ARENA_E_NOT_FOUND, "engine: no record of decision %" PRIu64 " (%" PRIu64
						       " made, the last %u kept)",
				    i, e->n_dec, ARENA_ENGINE_HISTORY);
	*out = e->dec[i % ARENA_ENGINE_HISTORY];
	return 0;
}
