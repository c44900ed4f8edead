/* engine_learn.c - what the engine learns from its caller: the device's
 * timing of each scheduled block and copy, the compute profile and step gap
 * made of them, looks at that profile planned on a thread of their own,
 * and the order the caller runs its blocks in (engine.h: arena_engine_opts
 * no_learn, step_gap_s; "Callers need not follow the schedule").
 *
 * Invariants:
 *   1. Timing slots go by step parity: a step records only into its own
 *      parity's slots, cleared at its begin, and harvest takes a parity's
 *      times only when all of them are done (nothing from a step half
 *      timed). Unread times of two steps ago are dropped.
 *   2. Only events the device timed are learned from, and the learned
 *      profile is planned by only when none was given (cost) and learning
 *      is on (no_learn).
 *   3. A look's thread touches only its struct look and what does not
 *      change while it runs (the layout): the options it plans with point
 *      at the look's own copies of the profile, the moved bytes and the
 *      schedule; reading ahead, the caller's reader (every read on the
 *      caller's thread joins the look first: ensure_host), slabs of its own
 *      and the atomic pinned budget. The engine reads the look only after
 *      joining its thread (look_join), but its planned/done flags; one
 *      look at a time (learn starts none while one is on); a take finding
 *      it reading ahead leaves it to a later step end (LOOK_DEFER at
 *      most); arena_engine_free joins it, a look dropped stops reading.
 *   4. A look planned under options that changed since (plan_gen) is
 *      dropped; one whose plan no longer holds for the budget is not moved
 *      to (its profile is taken).
 *   5. The order seen becomes the schedule only when it is neither the
 *      schedule nor a part of it cut short, fits max_sched entries, and the
 *      schedule is not fixed. */
#include "engine_int.h"

#include <stdio.h>
#include <string.h>

#include "../common/alloc.h"
#include "../common/clock.h"
#include "../common/err.h"

/* --- device timing ------------------------------------------------------------- */

#define TM_EV 4 /* timing events a slot (see tm) */

static size_t tm_at(const arena_engine *e, unsigned par, uint32_t b, unsigned k)
{
	return ((size_t)par * e->l->n_blocks + b) * 2 + k;
}

/* Read copy pair k if its copy is done: 0 (read, or not recorded), 1 not
 * done yet, or an error. */
int arena__engine_read_copy(arena_engine *e, unsigned k)
{
	double c;
	if (!e->cp_rec[k])
		return 0;
	int rc = e->be->ops->event_elapsed(e->be, e->cp_a[k], e->cp_z[k], &c);
	if (rc)
		return rc;
	e->cp_rec[k] = 0;
	if (c > 0)
		e->lc_rate[e->lc_n++ % 64] = (double)e->cp_bytes[k] / c;
	return 0;
}

static int harvest_copies(arena_engine *e)
{
	for (unsigned k = 0; k < ENGINE_COPY_PAIRS; k++) {
		int rc = arena__engine_read_copy(e, k);
		if (rc < 0)
			return rc;
	}
	return 0;
}

/* The steps the profile learns from (harvest's `steady`): from a caller's
 * third on, and none that begins right after a move. Neither kind is
 * steady (the first warm up kernels and settle the first plan's copies; a
 * step after a move has nothing fetched ahead and its copies settle), and
 * in the running mean they misled the looks. Measured on H100s sampling
 * flux-dev in FP8 at 8 GiB (2026-12-06): first steps 0.32 and 0.31 s,
 * steady 0.204; learning from step 0 the look at step 2 predicted its plan
 * slower, the one at step 4 3.7 % faster (4 % asked) and only step 7's
 * moved (to 0.191 s); from step 2 the look at step 4 predicted 7.7 % and
 * moved (0.192 s from step 6). On another, the step after a move ran 0.29
 * s against 0.19 after; learned, it made the next look predict the plan
 * just moved to at 0.27 s, and that look moved again. The records of the
 * steps left out still say what the device timed; a caller that moves
 * blocks every step is learned from every other one (time_begin). */
#define LEARN_FROM 2

/* A learned time taken in: the first as it is, then a running mean. */
static void learned(double *v, double x)
{
	*v = *v < 0 ? x : 0.5 * *v + 0.5 * x;
}

/* Read what the device timed for parity `par` (non-blocking: nothing is
 * taken unless all of it is done): the step record's gpu_* and, without a
 * given profile, the learned costs. */
static int harvest(arena_engine *e, unsigned par)
{
	arena_backend *be = e->be;
	size_t n = e->l->n_blocks;
	unsigned stalls = 0, any = 0;
	double stall_s = 0, comp = 0, fwd = 0, bwd = 0;
	const int steady = e->tm_step[par] >= LEARN_FROM && !e->tm_settling[par];
	for (int pass = 0; pass < 2; pass++) {
		for (uint32_t b = 0; b < n; b++) {
			for (unsigned k = 0; k < 2; k++) {
				size_t i = tm_at(e, par, b, k);
				if (e->tm_rec[i] != 3)
					continue;
				double st, c, g = -1;
				int rc = be->ops->event_elapsed(be, e->tm[TM_EV * i], e->tm[TM_EV * i + 1], &st);
				if (!rc)
					rc = be->ops->event_elapsed(be, e->tm[TM_EV * i + 1], e->tm[TM_EV * i + 2], &c);
				if (!rc && e->tm_nx[i] != SIZE_MAX)
					rc = be->ops->event_elapsed(be, e->tm[TM_EV * i + 1], e->tm[e->tm_nx[i]], &g);
				if (rc < 0)
					return rc;
				if (rc > 0)
					return 0; /* not done yet: later */
				if (!pass)
					continue;
				any = 1;
				comp += c;
				if (st > 2e-5) {
					stalls++;
					stall_s += st;
				}
				/* What it costs the step: from its start to the next
				 * acquire (the work between blocks that uses no weights,
				 * attention in a transformer, is the block's before it);
				 * the last of a step, to its release. */
				const double cost = g >= 0 ? g : c;
				const int fw = k == 0 || e->tm_mode[par] != ARENA_MODE_TRAIN; /* sample: a later pass too */
				*(fw ? &fwd : &bwd) += cost;
				if (steady) {
					learned(fw ? &e->lcost[b] : &e->lbcost[b], cost);
					learned(fw ? &e->lhold[b] : &e->lbhold[b], c);
				}
				e->tm_rec[i] = 0;
			}
		}
	}
	if (!any)
		return 0;
	if (bwd > 0 && steady) {
		e->lbwd_sum += bwd;
		e->lfwd_sum += fwd;
	}
	arena_engine_step *r = &e->hist[e->tm_step[par] % ARENA_ENGINE_HISTORY];
	if (e->tm_step[par] < e->steps && r->step == e->tm_step[par]) {
		r->gpu_timed = 1;
		r->stalls = stalls;
		r->stall_s = stall_s;
		r->compute_s = comp;
	}
	return 0;
}

/* The gap before step t, when both its events are done: from the device
 * reaching step t-1's end (arena_step_end, on the stream of its last
 * release) to step t's first scheduled acquire. */
static int gap_try(arena_engine *e, uint64_t t)
{
	if (t < 1 || (e->gap_taken != UINT64_MAX && e->gap_taken >= t))
		return 0;
	unsigned pa = (unsigned)((t - 1) & 1), pb = (unsigned)(t & 1);
	if (e->gap_a_step[pa] != t - 1 || e->gap_b_step[pb] != t)
		return 0;
	double g;
	int rc = e->be->ops->event_elapsed(e->be, e->gap_a[pa], e->gap_b[pb], &g);
	if (rc < 0)
		return rc;
	if (rc > 0)
		return 0; /* not done yet: at the next step's end */
	e->gap_taken = t;
	if (g >= 0 && g < 10) {
		e->gap_sum += g;
		e->gap_n++;
		e->o.step_gap_s = e->gap_sum / e->gap_n;
	}
	return 0;
}

/* At a step's end, without a given profile: read the gaps before this step
 * and the one before (opts.step_gap_s is their mean), then mark this
 * step's end. A caller that runs more than a step ahead of its device
 * gives no gap; its device then has none worth the name. */
static int time_gap(arena_engine *e)
{
	if (!e->timed || e->cost || e->o.no_learn)
		return 0;
	int rc;
	if ((e->steps && (rc = gap_try(e, e->steps - 1))) || (rc = gap_try(e, e->steps)))
		return rc;
	if (!e->last_s)
		return 0;
	unsigned p = (unsigned)(e->steps & 1);
	if ((rc = e->be->ops->event_record(e->be, e->gap_a[p], e->last_s)))
		return rc;
	e->gap_a_step[p] = e->steps;
	return 0;
}

/* At create: on backends that can time, the timing slots (TM_EV events
 * each, per step parity, block and occurrence), the copy pairs, the gap
 * events, and the learned arrays, < 0 (not yet) but for the globals.
 * Nothing to undo here on failure: arena__engine_time_free. */
int arena__engine_time_init(arena_engine *e)
{
	arena_backend *be = e->be;
	const arena_layout *l = e->l;
	const size_t n = l->n_blocks;
	int rc;
	e->timed = be->ops->event_create_timed && be->ops->event_elapsed;
	if (e->timed) {
		size_t nt = 2 * (n ? n : 1) * 2;
		e->tm = arena_calloc(TM_EV * nt, sizeof(*e->tm));
		e->tm_rec = arena_calloc(nt, 1);
		e->tm_nx = arena_calloc(nt, sizeof(*e->tm_nx));
		e->lhold = arena_calloc(n ? n : 1, sizeof(*e->lhold));
		e->acq_n = arena_calloc(n ? n : 1, sizeof(*e->acq_n));
		e->rel_n = arena_calloc(n ? n : 1, sizeof(*e->rel_n));
		e->lcost = arena_calloc(n ? n : 1, sizeof(*e->lcost));
		e->lbcost = arena_calloc(n ? n : 1, sizeof(*e->lbcost));
		e->lbhold = arena_calloc(n ? n : 1, sizeof(*e->lbhold));
		if (!e->tm || !e->tm_rec || !e->tm_nx || !e->lhold || !e->acq_n || !e->rel_n || !e->lcost || !e->lbcost ||
		    !e->lbhold) {
			return arena_errorf(ARENA_E_NOMEM, "engine: out of memory");
		}
		for (size_t b = 0; b < n; b++)
			e->lcost[b] = e->lhold[b] = e->lbcost[b] = e->lbhold[b] =
				arena_block_is_globals(l, (uint32_t)b) ? 0 : -1;
		for (size_t i = 0; i < TM_EV * nt; i++)
			if (n && (rc = be->ops->event_create_timed(be, &e->tm[i])))
				return rc;
		for (unsigned k = 0; k < ENGINE_COPY_PAIRS; k++)
			if ((rc = be->ops->event_create_timed(be, &e->cp_a[k])) ||
			    (rc = be->ops->event_create_timed(be, &e->cp_z[k])))
				return rc;
		for (unsigned k = 0; k < 2; k++)
			if ((rc = be->ops->event_create_timed(be, &e->gap_a[k])) ||
			    (rc = be->ops->event_create_timed(be, &e->gap_b[k])))
				return rc;
	}
	e->gap_a_step[0] = e->gap_a_step[1] = e->gap_b_step[0] = e->gap_b_step[1] = e->gap_taken = UINT64_MAX;
	return 0;
}

/* The timing events and the learned arrays. */
void arena__engine_time_free(arena_engine *e)
{
	arena_backend *be = e->be;
	for (size_t i = 0; e->tm && i < TM_EV * 2 * (e->l->n_blocks ? e->l->n_blocks : 1) * 2; i++)
		if (e->tm[i])
			be->ops->event_destroy(be, e->tm[i]);
	for (unsigned k = 0; k < ENGINE_COPY_PAIRS; k++) {
		if (e->cp_a[k])
			be->ops->event_destroy(be, e->cp_a[k]);
		if (e->cp_z[k])
			be->ops->event_destroy(be, e->cp_z[k]);
	}
	for (unsigned k = 0; k < 2; k++) {
		if (e->gap_a[k])
			be->ops->event_destroy(be, e->gap_a[k]);
		if (e->gap_b[k])
			be->ops->event_destroy(be, e->gap_b[k]);
	}
	arena_free(e->tm);
	arena_free(e->tm_rec);
	arena_free(e->tm_nx);
	arena_free(e->lhold);
	arena_free(e->acq_n);
	arena_free(e->rel_n);
	arena_free(e->lcost);
	arena_free(e->lbcost);
	arena_free(e->lbhold);
}

/* A step begins: its parity's slots are cleared (the unread timing of two
 * steps ago goes) and say which step and mode they time. */
void arena__engine_time_begin(arena_engine *e)
{
	const int moved = e->moved_end;
	e->moved_end = 0;
	if (!e->timed)
		return;
	unsigned par = (unsigned)(e->steps & 1);
	/* never two in a row: a caller whose every step moves blocks (its
	 * memory swinging) is still learned from every other step */
	const int settling = moved && !(e->steps && e->tm_step[par ^ 1] == e->steps - 1 && e->tm_settling[par ^ 1]);
	memset(e->acq_n, 0, e->l->n_blocks * sizeof(*e->acq_n));
	memset(e->rel_n, 0, e->l->n_blocks * sizeof(*e->rel_n));
	memset(e->tm_rec + tm_at(e, par, 0, 0), 0, e->l->n_blocks * 2); /* unread timing of 2 steps ago goes */
	e->tm_prev = SIZE_MAX; /* the last step's last block has no next acquire */
	e->tm_step[par] = e->steps;
	e->tm_mode[par] = e->o.mode;
	e->tm_settling[par] = (uint8_t)settling;
}

/* Device timing of acquires and releases of scheduled blocks (the first two
 * of each per step: forward and backward). */
int arena__engine_time_ready(arena_engine *e, uint32_t b, arena_stream *s, size_t *slot)
{
	*slot = SIZE_MAX;
	if (!e->timed)
		return 0;
	const size_t prev = e->tm_prev;
	e->tm_prev = SIZE_MAX;
	if (arena_block_is_globals(e->l, b) || e->acq_n[b] >= 2) {
		if (prev == SIZE_MAX) /* the last timed one's next acquire, untimed: an event of its own */
			return 0;
		e->tm_nx[prev] = TM_EV * prev + 3;
		return e->be->ops->event_record(e->be, e->tm[TM_EV * prev + 3], s);
	}
	unsigned par = (unsigned)(e->steps & 1);
	size_t i = tm_at(e, par, b, e->acq_n[b]++);
	*slot = i;
	e->tm_rec[i] = 0;
	e->tm_nx[i] = SIZE_MAX;
	e->tm_prev = i;
	if (prev != SIZE_MAX) /* the last timed one's next acquire: this one's ready event, below */
		e->tm_nx[prev] = TM_EV * i;
	if (e->gap_b_step[par] != e->steps) { /* the step's first scheduled acquire */
		int rc = e->be->ops->event_record(e->be, e->gap_b[par], s);
		if (rc)
			return rc;
		e->gap_b_step[par] = e->steps;
	}
	return e->be->ops->event_record(e->be, e->tm[TM_EV * i], s);
}

int arena__engine_time_start(arena_engine *e, size_t slot, arena_stream *s)
{
	if (slot == SIZE_MAX)
		return 0;
	e->tm_rec[slot] = 1;
	return e->be->ops->event_record(e->be, e->tm[TM_EV * slot + 1], s);
}

int arena__engine_time_end(arena_engine *e, uint32_t b, arena_stream *s)
{
	if (!e->timed || arena_block_is_globals(e->l, b) || e->rel_n[b] >= 2)
		return 0;
	size_t i = tm_at(e, (unsigned)(e->steps & 1), b, e->rel_n[b]++);
	if (e->tm_rec[i] != 1)
		return 0;
	e->tm_rec[i] = 3;
	return e->be->ops->event_record(e->be, e->tm[TM_EV * i + 2], s);
}

/* --- the order the caller runs ------------------------------------------------- */

/* Log an acquire of a scheduled block (the order the caller really runs). */
void arena__engine_observe(arena_engine *e, uint32_t b)
{
	if (arena_block_is_globals(e->l, b))
		return;
	e->rec.acquires++;
	if (e->n_obs < e->max_sched)
		e->obs[e->n_obs++] = b;
	else
		e->obs_over = 1;
}

/* At a step's end: the order the caller ran (the scheduled blocks it
 * acquired) becomes the schedule of its mode from the next step on, unless
 * it is the schedule, or a part of it cut short (engine.h); the record says
 * whether the step stopped early. Returns 1 when the schedule was learned. */
int arena__engine_adopt_order(arena_engine *e)
{
	int md = e->o.mode == ARENA_MODE_TRAIN, learned = 0;
	const uint32_t *ps = e->plan.sched;
	size_t pn = e->plan.n_sched, no = e->n_obs;
	int prefix = no <= pn && (!no || !memcmp(e->obs, ps, no * sizeof(*ps)));
	e->rec.stopped_early = prefix && no < pn;
	if (!prefix && !e->obs_over && !e->o.fixed_schedule) {
		memcpy(e->msched[md], e->obs, no * sizeof(*e->obs));
		e->mn[md] = no;
		e->o.sched = e->msched[md];
		e->o.n_sched = no;
		e->rec.schedule_learned = learned = 1;
		e->ahead = SIZE_MAX; /* the order just seen: prefetch as far as the ring goes */
		arena__engine_plan_changed(e);
		arena__engine_profile_cover(e);
	}
	e->n_obs = 0;
	e->obs_over = 0;
	return learned;
}

/* --- the learned profile and looks at it --------------------------------------- */

/* A schedule whose blocks the learned profile has not all timed (a caller
 * that runs other blocks from one step to the next: a pipeline's text
 * encoder, then its transformer, then its VAE decoder, through one arena)
 * is planned by bytes until they are timed; the profile is looked at again
 * then (learn). A profile given stays. */
void arena__engine_profile_cover(arena_engine *e)
{
	if (!e->lcost || e->o.cost != e->lcost)
		return;
	size_t n = e->o.sched ? e->o.n_sched : e->l->n_blocks; /* (no schedule: the mode's default, every block) */
	for (size_t i = 0; i < n; i++)
		if (e->lcost[e->o.sched ? e->o.sched[i] : i] < 0) {
			e->o.cost = e->o.hold = e->o.bcost = e->o.bhold = NULL;
			e->profile_learned = 0;
			return;
		}
}

/* The learned copy rate: the median of the last copies timed (one copy held
 * up by something else does not move it); 0 before any. */
static double learned_h2d(const arena_engine *e)
{
	unsigned n = e->lc_n < 64 ? e->lc_n : 64;
	double v[64];
	if (!n)
		return 0;
	memcpy(v, e->lc_rate, n * sizeof(*v));
	for (unsigned i = 1; i < n; i++) /* insertion sort: 64 at most */
		for (unsigned j = i; j > 0 && v[j - 1] > v[j]; j--) {
			double t = v[j];
			v[j] = v[j - 1];
			v[j - 1] = t;
		}
	return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int arena__engine_read_ahead = 1;
_Atomic uint64_t arena__engine_read_ahead_bytes;

/* Read ahead (the look's thread, after its plan): a host copy of each block
 * the plan demotes that has none, largest first as apply_moves demotes
 * them, within pre_room: mapped (huge pages), read from the image and
 * checked (the reader is the caller's, which waits for this thread before
 * it reads: arena__engine_look_wait), pinned within the pinned budget. A
 * read that fails leaves that block to the move, which reads it again and
 * says why. On the H100 (2026-12-07) a move's demotions read their host
 * copies on the caller's thread in step_end: a fresh slab faulted a page
 * at a time, read and pinned, the device idle meanwhile. */
static void read_ahead(struct look *k)
{
	const arena_layout *l = k->l;
	uint64_t taken = 0;
	for (;;) {
		int64_t pick = -1;
		for (uint32_t b = 0; b < l->n_blocks; b++)
			if (k->prep[b] && !k->pre[b] && !k->t.resident[b] &&
			    (pick < 0 || l->blocks[b].bytes > l->blocks[pick].bytes))
				pick = b;
		if (pick < 0 || atomic_load(&k->stop))
			return;
		const uint32_t b = (uint32_t)pick;
		k->prep[b] = 0; /* tried */
		if (l->blocks[b].bytes > k->pre_room - taken)
			continue;
		uint8_t *slab;
		uint64_t len;
		if (arena_model_slab_map(l, b, &slab, &len)) {
			arena_error_clear();
			return; /* out of memory: the move reads what is left */
		}
		if (k->reread(k->reread_ctx, b, slab, l->blocks[b].bytes)) {
			arena_error_clear();
			arena_model_slab_drop(k->pins, k->be, slab, len, 0);
			continue;
		}
		k->pre_pin[b] = (uint8_t)arena_model_slab_pin(k->pins, k->be, slab, len);
		k->pre[b] = slab;
		taken += l->blocks[b].bytes;
		atomic_fetch_add(&arena__engine_read_ahead_bytes, l->blocks[b].bytes);
	}
}

/* Whether the look's plan is predicted faster than the plan in force at its
 * start by `need`, both by the profile it planned with: the test look_take
 * moves by (a look that will not move reads nothing ahead: on the H100 a
 * step end waited 0.21 s for the reads of one such). */
static int faster_than_now(struct look *k)
{
	arena__timed ts = {0};
	if (arena__timed_init(&ts, k->l->n_blocks, k->now_n))
		return 0;
	const double now_t = arena__timed_run(k->l, &k->o, k->now_sched, k->now_bwd, k->now_n, k->now_res, k->now_slots, &ts);
	arena__timed_release(&ts);
	return now_t > 0 && k->t.step_s < now_t * k->need;
}

static void *look_thread(void *arg)
{
	struct look *k = arg;
	const double t0 = arena_now_s();
	k->rc = arena_residency_plan_rounded(k->l, &k->o, k->gran, k->budget, &k->t);
	k->took_s = arena_now_s() - t0;
	if (k->rc)
		snprintf(k->msg, sizeof(k->msg), "%s", arena_last_error());
	atomic_store(&k->planned, 1);
	if (!k->rc && k->pre && k->t.resident && k->t.step_s > 0 && faster_than_now(k))
		read_ahead(k);
	atomic_store(&k->done, 1);
	return NULL;
}

/* Wait for the look's plan, if one is being made. */
static void look_join(struct look *k)
{
	if (k->threaded)
		pthread_join(k->th, NULL);
	k->threaded = 0;
}

void arena__engine_look_wait(arena_engine *e)
{
	look_join(&e->look);
}

/* Wait for it and drop it. */
void arena__engine_look_free(struct look *k)
{
	atomic_store(&k->stop, 1); /* a look dropped reads no more */
	look_join(k);
	if (k->pre)
		for (uint32_t b = 0; b < k->l->n_blocks; b++)
			if (k->pre[b])
				arena_model_slab_drop(k->pins, k->be, k->pre[b],
						      arena_align_up(k->l->blocks[b].bytes, ARENA_SLAB_ALIGN), k->pre_pin[b]);
	arena_free(k->pre);
	arena_free(k->prep);
	arena_free(k->pre_pin);
	arena_free(k->now_sched);
	arena_free(k->now_bwd);
	arena_free(k->now_res);
	arena_residency_plan_release(&k->t);
	arena_free(k->prof);
	arena_free(k->moved);
	arena_free(k->sched);
	*k = (struct look){0};
}

/* Start a look (learn()): plan for this step's budget with the profile
 * learned so far, from copies of it, on a thread (in place when none can
 * start). */
static int look_start(arena_engine *e, double need)
{
	struct look *k = &e->look;
	const size_t n = e->l->n_blocks;
	arena__engine_look_free(k); /* (one is taken before another starts: nothing to drop) */
	*k = (struct look){.l = e->l,
			   .o = e->o,
			   .gran = e->be->alloc_granularity,
			   .budget = e->rec.budget,
			   .need = need,
			   .gen = e->plan_gen};
	k->prof = arena_malloc((n ? 4 * n : 1) * sizeof(*k->prof));
	k->moved = e->o.moved ? arena_malloc((n ? n : 1) * sizeof(*k->moved)) : NULL;
	k->sched = e->o.sched && e->o.n_sched ? arena_malloc(e->o.n_sched * sizeof(*k->sched)) : NULL;
	if (!k->prof || (e->o.moved && !k->moved) || (e->o.sched && e->o.n_sched && !k->sched)) {
		arena__engine_look_free(k);
		return arena_errorf(ARENA_E_NOMEM, "engine: out of memory for a look at the learned profile");
	}
	const double *from[4] = {e->lcost, e->lhold, e->lbcost, e->lbhold};
	for (int j = 0; j < 4; j++)
		memcpy(k->prof + j * n, from[j], n * sizeof(*k->prof));
	/* Read ahead where a move would read on the caller's thread: blocks
	 * re-read from the image into raw host copies, with no disk tier (whose
	 * stager reads from the same reader during the steps). */
	if (arena__engine_read_ahead && e->o.reread && !e->stg && n) {
		k->prep = arena_calloc(n, 1);
		k->pre_pin = arena_calloc(n, 1);
		k->pre = arena_calloc(n, sizeof(*k->pre));
		if (!k->prep || !k->pre_pin || !k->pre) {
			arena_free(k->prep);
			arena_free(k->pre_pin);
			arena_free(k->pre);
			k->prep = k->pre_pin = NULL;
			k->pre = NULL;
		}
	}
	if (k->pre) {
		const arena_model *m = e->m;
		uint64_t n_prep = 0;
		for (uint32_t b = 0; b < n; b++) {
			/* no host copy, or one the next step end's release_host gives
			 * back (a block promoted at this step end's move) */
			const int goes = m->mem[b].host && e->o.release_host && m->mem[b].dev && !m->mem[b].kept &&
					 !e->switched[b];
			k->prep[b] = e->plan.resident[b] && !arena_block_is_globals(e->l, b) && e->l->blocks[b].bytes &&
				     (!m->mem[b].host || goes) && !m->mem[b].wire && !arena__engine_disk_coded(e, b);
			n_prep += k->prep[b];
		}
		k->pre_room = !e->o.host_cap ? UINT64_MAX
			      : e->o.host_cap > m->host_bytes ? e->o.host_cap - m->host_bytes : 0;
		k->reread = e->o.reread;
		k->reread_ctx = e->o.reread_ctx;
		k->be = e->be;
		k->pins = m->budget;
		const size_t ns = e->plan.n_sched;
		k->now_n = ns;
		k->now_slots = e->plan.slots;
		k->now_sched = arena_malloc((ns ? ns : 1) * sizeof(*k->now_sched));
		k->now_bwd = arena_malloc(ns ? ns : 1);
		k->now_res = arena_malloc(n);
		if (k->now_sched && k->now_bwd && k->now_res) {
			if (ns) {
				memcpy(k->now_sched, e->plan.sched, ns * sizeof(*k->now_sched));
				if (e->plan.bwd)
					memcpy(k->now_bwd, e->plan.bwd, ns);
				else
					memset(k->now_bwd, 0, ns);
			}
			memcpy(k->now_res, e->plan.resident, n);
		} else {
			n_prep = 0;
		}
		if (!n_prep || !k->pre_room) { /* nothing to read ahead */
			arena_free(k->prep);
			arena_free(k->pre_pin);
			arena_free(k->pre);
			k->prep = k->pre_pin = NULL;
			k->pre = NULL;
		}
	}
	if (k->moved)
		memcpy(k->moved, e->o.moved, n * sizeof(*k->moved));
	if (k->sched)
		memcpy(k->sched, e->o.sched, e->o.n_sched * sizeof(*k->sched));
	k->o.cost = k->prof;
	k->o.hold = k->prof + n;
	k->o.bcost = k->prof + 2 * n; /* < 0 where not timed yet: the factor */
	k->o.bhold = k->prof + 3 * n;
	k->o.moved = k->moved;
	k->o.sched = k->sched;
	k->o.h2d_bytes_per_s = learned_h2d(e);
	k->o.backward_factor = e->lfwd_sum > 0 ? e->lbwd_sum / e->lfwd_sum : 0;
	k->on = 1;
	e->plans_made++;
	if (pthread_create(&k->th, NULL, look_thread, k) == 0) {
		k->threaded = 1;
	} else {
		const double t0 = arena_now_s();
		look_thread(k);
		e->rec.plan_s += arena_now_s() - t0;
	}
	return 0;
}

/* The host copies the look read ahead become the model's, for the blocks
 * its plan (want) demotes that are resident with none still, within the
 * host budget (as ensure_host would give them); the rest are dropped with
 * the look. A move not made after all leaves them to release_host, which
 * gives back the host copies of resident blocks at the next step end. */
static void adopt_read_ahead(arena_engine *e, struct look *k, const uint8_t *want)
{
	if (!k->pre)
		return;
	arena_model *m = e->m;
	for (uint32_t b = 0; b < e->l->n_blocks; b++) {
		if (!k->pre[b] || want[b] || !e->plan.resident[b] || m->mem[b].host || m->mem[b].wire ||
		    arena__engine_past_host_budget(e, b, 0))
			continue;
		arena_model_host_adopt(m, b, k->pre[b], k->pre_pin[b]);
		k->pre[b] = NULL;
		if (e->moved)
			e->moved[b] = arena__engine_moved_bytes(e, b);
		e->rec.prepared_bytes += e->l->blocks[b].bytes;
	}
}

/* Take the look learn() started (step_end, the step after): wait for its
 * plan (that wait counted as planning), put the learned profile in the
 * options, keep the plan as the memo for the next step's adapt, and move to
 * it if it is predicted `need` faster than the plan now, as a look made in
 * place would. A look whose options changed meanwhile (the mode, a new
 * schedule: plan_gen) is dropped. */
/* Step ends a take leaves a look that is reading ahead to (the caller's
 * thread would wait for the reads: on the H100 the step end of a move
 * waited 0.083 s for them); then it waits. */
enum { LOOK_DEFER = 2 };

static int look_take(arena_engine *e)
{
	struct look *k = &e->look;
	if (!k->on)
		return 0;
	if (k->threaded && atomic_load(&k->planned) && !atomic_load(&k->done) && k->deferred < LOOK_DEFER) {
		k->deferred++;
		return 0;
	}
	const double t0 = arena_now_s();
	look_join(k);
	e->rec.plan_s += arena_now_s() - t0;
	if (k->gen != e->plan_gen) {
		arena__engine_look_free(k);
		return 0;
	}
	e->rec.looked = 1;
	e->rec.look_s = k->took_s;
	e->o.cost = e->lcost;
	e->o.hold = e->lhold;
	e->o.bcost = e->lbcost;
	e->o.bhold = e->lbhold;
	e->o.h2d_bytes_per_s = k->o.h2d_bytes_per_s;
	e->o.backward_factor = k->o.backward_factor;
	arena__engine_plan_changed(e);
	int rc = k->rc;
	if (rc) { /* BUDGET: adapt keeps the smallest plan, so do we */
		rc = rc == ARENA_E(BUDGET) ? 0 : arena_errorf(rc, "%s", k->msg);
		arena__engine_look_free(k);
		return rc;
	}
	/* the budget moved on: the next adapt plans by the profile */
	if (!arena__engine_plan_holds(e, &k->t, k->budget, e->rec.budget)) {
		arena__engine_look_free(k);
		return 0;
	}
	arena_residency_plan t = k->t;
	const double need = k->need;
	const uint64_t budget = k->budget;
	/* The plan in force, predicted by the profile the look planned with:
	 * the two predictions compared are of one profile (the engine's has
	 * learned a step more since; that step, after a move, once made the
	 * plan in force look 0.27 s against the look's 0.19 on an H100). */
	const double now_t = arena__timed_run(e->l, &k->o, e->plan.sched, e->plan.bwd, e->plan.n_sched, e->plan.resident,
					      e->plan.slots, &e->tscr);
	k->t = (arena_residency_plan){0}; /* ours now */
	const int faster = now_t > 0 && t.step_s > 0 && t.step_s < now_t * need;
	if (faster)
		adopt_read_ahead(e, k, t.resident);
	arena__engine_look_free(k);
	e->rec.look_now_s = now_t > 0 ? now_t : 0;
	e->rec.look_plan_s = t.step_s > 0 ? t.step_s : 0;
	arena__engine_memo_keep(e, &t, budget); /* the next step's adapt plans for the same budget: it takes this one */
	if (faster && arena__engine_move_pays(e, t.resident, NULL, now_t - t.step_s)) {
		e->rec.profile_learned = 1;
		e->room_steps = 0;
		arena__decide_snap snap;
		arena__engine_decide_begin(e, &snap);
		snap.step_s = now_t; /* both plans by the profile the look planned with */
		snap.after_s = t.step_s;
		rc = arena__engine_pace_start(e, &t, budget);
		if (e->pace_on)
			snap.after_s = 0; /* a part of the move: the set it leaves predicted by the plan */
		arena__engine_decide_end(e, &snap, ARENA_WHY_LEARNED);
	} else {
		const double p = arena__engine_predict(e); /* the plan stays; the profile predicts it now */
		if (p > 0)
			e->plan.step_s = p;
	}
	arena_residency_plan_release(&t);
	return rc;
}

/* Without a given profile: once every scheduled block has been timed and a
 * copy seen, plan by the learned profile and move to that plan if it is
 * predicted 2% faster; later replans under pressure use it too. The first
 * steps' times are not the steady ones (a caller's first step warms up its
 * kernels, the copies stall until the plan settles), and the profile keeps
 * learning: it is asked again 2 steps later, then at twice the step count
 * each time, and a later look moves for 4% (the adapter's coded 8 GiB
 * step: the first look kept the plan, the steady profile predicted one 9%
 * faster; on the H200 the step went from 0.262 to 0.252 s). A look is
 * planned on a thread (look_start) and taken at the next step_end
 * (look_take; a look whose plan no longer holds for the budget, which has
 * moved since, is not moved to: the profile is taken, the next step end
 * plans by it). */
static int learn(arena_engine *e)
{
	if (e->look.on) /* one still reading ahead: taken at a later step end */
		return 0;
	if (!e->timed || e->cost || e->o.no_learn || !e->plan.n_streamed || !e->lc_n ||
	    (e->profile_learned && e->steps < e->relearn_at))
		return 0;
	for (size_t i = 0; i < e->plan.n_sched; i++)
		if (e->lcost[e->plan.sched[i]] < 0)
			return 0;
	const double need = e->profile_learned ? 0.96 : 0.98; /* a move is a slow step: later, 4 % */
	e->relearn_at = e->profile_learned ? 2 * e->steps : e->steps + 2;
	e->profile_learned = 1;
	return look_start(e, need);
}

/* At a step's end, after adapt: the gap before it, what the device has
 * timed so far, the next part of a look's move under way, the look the
 * last step end started taken, a new look started when one is due. */
int arena__engine_learn_end(arena_engine *e)
{
	int rc = time_gap(e);
	/* What the device has timed so far, before learning from it (the step
	 * before this one is done in a caller that waits for its steps). */
	if (!rc && e->timed && e->steps) /* the previous step's record is in the history */
		rc = harvest(e, (unsigned)((e->steps - 1) & 1));
	if (!rc && e->timed)
		rc = harvest_copies(e);
	if (!rc)
		rc = arena__engine_pace_next(e); /* before a take, whose move would be counted as adapt's */
	if (!rc)
		rc = look_take(e);
	if (!rc)
		rc = learn(e);
	return rc;
}

/* --- what the engine has learned ----------------------------------------------- */

int arena_engine_collect(arena_engine *e)
{
	int rc = 0;
	if (e->timed && e->state != ST_STEP) {
		for (unsigned par = 0; par < 2 && !rc; par++)
			rc = harvest(e, par);
		if (!rc)
			rc = harvest_copies(e);
	}
	return rc;
}

int arena_engine_profile(const arena_engine *e, double *cost, double *h2d, double *bwd)
{
	size_t n = e->l->n_blocks;
	if (e->cost) { /* given */
		memcpy(cost, e->cost, n * sizeof(*cost));
		*h2d = e->o.h2d_bytes_per_s;
		*bwd = e->o.backward_factor;
		return 0;
	}
	if (!e->lcost)
		return arena_errorf(ARENA_E_NOT_FOUND, "engine: no profile (none given, and %s cannot time)",
				    e->be->ops->name);
	for (size_t i = 0; i < e->plan.n_sched; i++)
		if (e->lcost[e->plan.sched[i]] < 0)
			return arena_errorf(ARENA_E_NOT_FOUND, "engine: block '%s' not timed yet",
					    e->l->blocks[e->plan.sched[i]].name);
	for (size_t b = 0; b < n; b++)
		cost[b] = e->lcost[b] < 0 ? 0 : e->lcost[b];
	*h2d = learned_h2d(e);
	*bwd = e->lfwd_sum > 0 ? e->lbwd_sum / e->lfwd_sum : 0;
	return 0;
}

int arena_engine_backward_costs(const arena_engine *e, double *bcost)
{
	if (e->cost || !e->lbcost)
		return arena_errorf(ARENA_E_NOT_FOUND, "engine: no learned backward costs (%s)",
				    e->cost ? "a profile was given" : "the backend cannot time");
	memcpy(bcost, e->lbcost, e->l->n_blocks * sizeof(*bcost));
	return 0;
}

double arena_engine_step_gap(const arena_engine *e)
{
	return e->o.step_gap_s;
}

int arena_engine_looking(const arena_engine *e)
{
	return e->look.on;
}
