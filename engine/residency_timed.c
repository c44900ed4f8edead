/* residency_timed.c - the planner with a compute profile: the timed dry
 * run (a step of the ring's rules in time: copies at the profile's rate,
 * each entry's compute once its block is there) and the timed greedy that
 * chooses resident blocks by it, on up to 8 threads; a plan's predicted
 * step and its timeline. Pure: no device (engine.h, "With a compute
 * profile").
 *
 * Invariants:
 *   1. A timed run uses only its scratch (arena__timed) and its arguments:
 *      runs with their own scratch may go at once, on any thread.
 *   2. The timed run follows the ring's rules as the engine runs them
 *      (residency.c's arena__ring_place and arena__ring_take, fetching at
 *      most a step ahead) and times copies one after another on one copy
 *      stream, each after the last release of what it overwrites.
 *   3. The greedy's threads compute exactly what one thread would: each
 *      candidate's gain goes to its own entry, each thread times with its
 *      own resident set and scratch, and the choice is made after all are
 *      joined, so a plan does not depend on arena__greedy_threads. */
#include "residency_int.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common/alloc.h"
#include "../common/err.h"

/* --- the timed dry run (with a compute profile) ----------------------------- */

void arena__timed_release(arena__timed *t)
{
	arena__ring_release(&t->r);
	arena_free(t->fill_t);
	arena_free(t->rel_t);
	arena_free(t->gain);
	arena_free(t->swappable);
	arena_free(t->cands);
	arena_free(t->seq);
	arena_free(t->cl_b);
	arena_free(t->cp_of);
	arena_free(t->cl_t0);
	arena_free(t->cl_t1);
	arena_free(t->cl_stall);
	arena_free(t->cl_left);
	arena_free(t->cl_per);
	arena_free(t->cl_step);
	arena_free(t->cl_sum);
	arena_free(t->cl_head);
	arena_free(t->cl_next);
	arena_free(t->alt);
	arena_free(t->picks);
	memset(t, 0, sizeof(*t));
}

int arena__timed_log(arena__timed *t, size_t n, size_t n_sched)
{
	const size_t m = 3 * (n_sched ? n_sched : 1);
	uint32_t *b = arena_calloc(m, sizeof(*b)), *of = arena_calloc(n ? n : 1, sizeof(*of)),
		 *per = arena_calloc(m, sizeof(*per));
	double *t0 = arena_calloc(m, sizeof(*t0)), *t1 = arena_calloc(m, sizeof(*t1)),
	       *st = arena_calloc(m, sizeof(*st)), *left = arena_calloc(m, sizeof(*left));
	arena__pick *pk = arena_calloc(n ? n : 1, sizeof(*pk));
	uint8_t *stp = arena_calloc(m, 1), *alt = arena_calloc(n ? n : 1, 1);
	uint32_t *head = arena_calloc(n ? n : 1, sizeof(*head)), *next = arena_calloc(m, sizeof(*next));
	double *csum = arena_calloc(n ? n : 1, sizeof(*csum));
	if (!b || !of || !per || !t0 || !t1 || !st || !left || !pk || !stp || !head || !next || !csum || !alt) {
		arena_free(b), arena_free(of), arena_free(per), arena_free(t0);
		arena_free(t1), arena_free(st), arena_free(left), arena_free(pk), arena_free(stp);
		arena_free(head), arena_free(next), arena_free(csum), arena_free(alt);
		return -1;
	}
	t->cl_step = stp, t->cl_head = head, t->cl_next = next, t->cl_sum = csum, t->alt = alt;
	t->cl_b = b, t->cp_of = of, t->cl_per = per, t->cl_t0 = t0;
	t->cl_t1 = t1, t->cl_stall = st, t->cl_left = left, t->picks = pk;
	return 0;
}

int arena__timed_init(arena__timed *t, size_t n, size_t n_sched)
{
	memset(t, 0, sizeof(*t));
	int rc = arena__ring_init(&t->r, n);
	t->fill_t = arena_calloc(n ? n : 1, sizeof(*t->fill_t));
	t->rel_t = arena_calloc(n ? n : 1, sizeof(*t->rel_t));
	t->gain = arena_calloc(n ? n : 1, sizeof(*t->gain));
	t->swappable = arena_calloc(n ? n : 1, 1);
	t->cands = arena_calloc(n ? n : 1, sizeof(*t->cands));
	t->seq = arena_calloc(n_sched ? n_sched : 1, sizeof(*t->seq));
	if (!rc && t->fill_t && t->rel_t && t->gain && t->swappable && t->cands && t->seq)
		return 0;
	arena__timed_release(t);
	return -1;
}

typedef struct timed_evict {
	const double *rel_t;
	double wait;
} timed_evict;

static int timed_on_evict(void *ctx, uint32_t q)
{
	timed_evict *w = ctx;
	if (w->rel_t[q] > w->wait)
		w->wait = w->rel_t[q];
	return 0;
}

/* A backward entry's time over its forward's (recompute + backward). */
static double backward_scale(const arena_engine_opts *o, const uint8_t *bwd, size_t i)
{
	return bwd && bwd[i] ? (o->backward_factor > 0 ? o->backward_factor : 3.0) : 1.0;
}

/* Entry i's cost: a backward entry's own (o->bcost) where known, else its
 * forward's scaled. */
static double entry_cost(const arena_engine_opts *o, const uint32_t *sched, const uint8_t *bwd, size_t i)
{
	const uint32_t b = sched[i];
	if (bwd && bwd[i] && o->bcost && o->bcost[b] >= 0)
		return o->bcost[b];
	return o->cost[b] * backward_scale(o, bwd, i);
}

/* Entry i's hold (with o->hold), the same way. */
static double entry_hold(const arena_engine_opts *o, const uint32_t *sched, const uint8_t *bwd, size_t i)
{
	const uint32_t b = sched[i];
	if (bwd && bwd[i] && o->bhold && o->bhold[b] >= 0)
		return o->bhold[b];
	return o->hold[b] * backward_scale(o, bwd, i);
}

/* Predicted seconds of a steady step of `sched` with the blocks in `res`
 * resident: the second of three steps of the ring's rules in time (copies in
 * order at o->h2d_bytes_per_s, each after the release of what it
 * overwrites, fetched at most a step ahead across step ends; an entry
 * computes once its block is there and the entry before it is done).
 * Negative when a block cannot be placed. */
double arena__timed_run(const arena_layout *l, const arena_engine_opts *o, const uint32_t *sched, const uint8_t *bwd,
			size_t n_sched, const uint8_t *res, unsigned slots, arena__timed *t)
{
	uint64_t slot = 0;
	size_t len = 0;
	for (size_t i = 0; i < n_sched; i++)
		if (!res[sched[i]]) {
			t->seq[len++] = sched[i];
			if (l->blocks[sched[i]].bytes > slot)
				slot = l->blocks[sched[i]].bytes;
		}
	if (len && slot < arena__min_slot(o))
		slot = arena__min_slot(o);
	arena__ring_reset(&t->r, l->n_blocks, (uint64_t)slots * slot);
	memset(t->fill_t, 0, l->n_blocks * sizeof(*t->fill_t));
	memset(t->rel_t, 0, l->n_blocks * sizeof(*t->rel_t));
	double copy_free = 0, comp = 0, t0 = 0, t1 = 0;
	size_t fetched = 0, cur = 0; /* streamed entries, counted across steps */
	int blocked = 0;             /* a placement failed: none can succeed before a block's last release */
	t->n_cl = 0;
	for (int step = 0; step < 3; step++) {
		if (step == 1)
			t0 = comp;
		if (step == 2) { /* the third step's copies start within the second: its start is all it adds */
			t1 = comp;
			break;
		}
		comp += o->step_gap_s > 0 ? o->step_gap_s : 0;
		for (size_t i = 0; i < n_sched; i++) {
			uint32_t b = sched[i];
			double c = entry_cost(o, sched, bwd, i);
			if (res[b]) {
				if (t->spans)
					t->spans[t->n_spans++] =
						(arena_plan_span){b, (uint32_t)i, 0, bwd && bwd[i], comp, comp + c};
				comp += c;
				continue;
			}
			while (fetched < cur + len && fetched < 3 * len) {
				uint32_t f = t->seq[fetched % len];
				uint64_t at;
				int reuse;
				if (blocked ||
				    arena__ring_place(&t->r, l, f, arena__ring_in_order(o) && fetched > cur, &at, &reuse)) {
					if (fetched > cur) {
						blocked = 1;
						break;
					}
					return -1;
				}
				if (!reuse) {
					timed_evict w = {t->rel_t, 0};
					arena__ring_take(&t->r, l, f, at, timed_on_evict, &w);
					double start = copy_free > w.wait ? copy_free : w.wait;
					copy_free = start + (double)(o->moved ? o->moved[f] : l->blocks[f].bytes) /
									o->h2d_bytes_per_s;
					t->fill_t[f] = copy_free;
					if (t->cl_b) {
						t->cp_of[f] = (uint32_t)t->n_cl;
						t->cl_b[t->n_cl] = f;
						t->cl_t0[t->n_cl] = start;
						t->cl_t1[t->n_cl] = copy_free;
						t->cl_step[t->n_cl] = (uint8_t)(fetched / len);
						t->cl_stall[t->n_cl++] = 0;
					}
					if (t->spans)
						t->spans[t->n_spans++] =
							(arena_plan_span){f, UINT32_MAX, 1, 0, start, copy_free};
				}
				t->r.pending[f]++;
				fetched++;
			}
			double start = comp > t->fill_t[b] ? comp : t->fill_t[b];
			if (t->cl_b && step == 1 && start > comp)
				t->cl_stall[t->cp_of[b]] += start - comp;
			comp = start + c;
			if (t->spans)
				t->spans[t->n_spans++] = (arena_plan_span){b, (uint32_t)i, 0, bwd && bwd[i], start, comp};
			t->rel_t[b] = comp;
			if (o->hold && start + entry_hold(o, sched, bwd, i) > comp)
				t->rel_t[b] = start + entry_hold(o, sched, bwd, i); /* held past the next acquire */
			if (!--t->r.pending[b])
				blocked = 0;
			cur++;
		}
	}
	return t1 - t0;
}

int arena__have_profile(const arena_engine_opts *o)
{
	return o->cost && o->h2d_bytes_per_s > 0;
}

/* The greedy's candidates of a round, timed by several threads when there
 * are many (pieces): each evaluates every T-th candidate with its own
 * copy of the resident set and its own scratch; gains go to distinct
 * entries. Exactly what one thread computes, sooner. */
#define GREEDY_PAR_MIN 64 /* candidates a round worth threads */
#define GREEDY_THREADS 8

typedef struct greedy_worker {
	const arena_layout *l;
	const arena_engine_opts *o;
	const arena_residency_plan *p;
	const uint32_t *cands;
	size_t n, first, step;
	uint8_t *cand; /* its own resident set */
	arena__timed ts;
	double cur, *gain;
	double *t_of; /* when not NULL: each candidate's predicted step (t_of[b]) */
	int failed;   /* a candidate could not be placed */
	pthread_t th;
} greedy_worker;

static void greedy_eval(greedy_worker *w)
{
	for (size_t i = w->first; i < w->n; i += w->step) {
		uint32_t b = w->cands[i];
		uint64_t sz = w->l->blocks[b].bytes;
		w->cand[b] ^= 1; /* a greedy's candidate made resident; the refinement's resident block demoted */
		double t = arena__timed_run(w->l, w->o, w->p->sched, w->p->bwd, w->p->n_sched, w->cand, w->p->slots, &w->ts);
		w->cand[b] ^= 1;
		if (t < 0) {
			w->failed = 1;
			return;
		}
		w->gain[b] = w->cur - t > w->cur * 1e-9 && sz ? (w->cur - t) / (double)sz : 0;
		if (w->t_of)
			w->t_of[b] = t;
	}
}

static void *greedy_thread(void *arg)
{
	greedy_eval(arg);
	return NULL;
}

unsigned arena__greedy_threads;

/* Threads for a greedy over k blocks: 1 (the caller alone) when few, or
 * when their scratch cannot be had. */
static unsigned greedy_workers(const arena_layout *l, const arena_residency_plan *p, size_t k, greedy_worker *w)
{
	long cpus = arena__greedy_threads ? (long)arena__greedy_threads : sysconf(_SC_NPROCESSORS_ONLN);
	unsigned n = k < GREEDY_PAR_MIN || cpus < 2 ? 1 : cpus < GREEDY_THREADS ? (unsigned)cpus : GREEDY_THREADS;
	for (unsigned j = 1; j < n; j++) {
		w[j].cand = arena_malloc(l->n_blocks ? l->n_blocks : 1);
		if (!w[j].cand || arena__timed_init(&w[j].ts, l->n_blocks, p->n_sched)) {
			arena_free(w[j].cand);
			w[j].cand = NULL;
			return j; /* as many as had scratch */
		}
	}
	return n;
}

static void greedy_workers_free(greedy_worker *w, unsigned n)
{
	for (unsigned j = 1; j < n; j++) {
		arena__timed_release(&w[j].ts);
		arena_free(w[j].cand);
	}
}

/* Time the n candidates `cands` each flipped in `cand` (added one at a time
 * to a resident set, or taken out of it) with the others as they are: gains
 * per byte into gain[] (of an addition), and with t_of each one's predicted
 * step; -1 when one cannot be placed. */
static int greedy_round(greedy_worker *w, unsigned nw, const arena_layout *l, const arena_engine_opts *o,
			const arena_residency_plan *p, const uint32_t *cands, size_t n, uint8_t *cand, double cur,
			double *gain, double *t_of, arena__timed *ts)
{
	unsigned started = 1;
	for (unsigned j = 0; j < nw; j++) {
		w[j] = (greedy_worker){.l = l, .o = o, .p = p, .cands = cands, .n = n, .first = j, .step = nw,
				      .cand = j ? w[j].cand : cand, .ts = j ? w[j].ts : *ts, .cur = cur, .gain = gain,
				      .t_of = t_of};
		if (j) {
			memcpy(w[j].cand, cand, l->n_blocks);
			if (pthread_create(&w[j].th, NULL, greedy_thread, &w[j]))
				break; /* the caller does the rest */
			started++;
		}
	}
	/* The caller evaluates its share, and the shares of threads that did not start. */
	greedy_eval(&w[0]);
	int failed = w[0].failed;
	for (unsigned j = started; j < nw && !failed; j++) {
		greedy_worker x = w[0];
		x.first = j;
		x.failed = 0;
		greedy_eval(&x);
		failed = x.failed;
	}
	for (unsigned j = 1; j < started; j++) {
		pthread_join(w[j].th, NULL);
		failed |= w[j].failed;
	}
	*ts = w[0].ts;
	return failed ? -1 : 0;
}

/* Picks by gain per byte, most first; ties: the larger, then the first in
 * order. */
static int pick_by_gain(const void *x, const void *y)
{
	const arena__pick *a = x, *b = y;
	if (a->per_byte != b->per_byte)
		return a->per_byte > b->per_byte ? -1 : 1;
	if (a->bytes != b->bytes)
		return a->bytes > b->bytes ? -1 : 1;
	return a->pos < b->pos ? -1 : a->pos > b->pos;
}

/* Picks by size, largest first; ties: the first in order. */
static int pick_by_size(const void *x, const void *y)
{
	const arena__pick *a = x, *b = y;
	if (a->bytes != b->bytes)
		return a->bytes > b->bytes ? -1 : 1;
	return a->pos < b->pos ? -1 : a->pos > b->pos;
}

/* What copy c of the log saves made away with: its time, at most the waits
 * after it in its busy run. */
static double copy_gain(const arena__timed *ts, size_t c)
{
	return fmin(ts->cl_t1[c] - ts->cl_t0[c], ts->cl_left[c]);
}

#define BY_SUM UINT32_MAX /* cp_of[b] and the chains' end: a gain by a block's steady copies */

/* The copy log of the last timed run read by busy runs (the copies back to
 * back on the copy stream), from the end: each copy's waits to come within
 * its run (cl_left) and its run's first copy (cl_per). Returns the waits of
 * the steady step. */
static double log_waits(arena__timed *ts)
{
	const size_t m = ts->n_cl;
	double waits = 0;
	for (size_t c = m; c-- > 0;) {
		const int joined = c + 1 < m && ts->cl_t0[c + 1] <= ts->cl_t1[c];
		ts->cl_left[c] = ts->cl_stall[c] + (joined ? ts->cl_left[c + 1] : 0);
		waits += ts->cl_stall[c];
	}
	for (size_t c = 0; c < m; c++)
		ts->cl_per[c] = c && ts->cl_t0[c] <= ts->cl_t1[c - 1] ? ts->cl_per[c - 1] : (uint32_t)c;
	return waits;
}

/* The greedy past ARENA__GREEDY_SWAP_MAX blocks (ts carries the copy log,
 * arena__timed_log). A round is one timed run: the compute's waits are
 * charged to the copies they waited for; a copy's removal shortens the
 * copies after it in its busy run of the copy stream (the copies back to
 * back, none waiting for a release), so a block made resident saves at most
 * its copy's time and at most the waits left from its copy to the run's
 * end. The round promotes, best gain per byte first, blocks until each busy
 * run's waits are covered (a block's gain is the sum of its copies' in the
 * steady step: in training, its forward's and its backward's); at most
 * ARENA__GREEDY_ROUNDS rounds, then what
 * room is left is filled largest first (the plan by bytes fills the same
 * way). Cost: ARENA__GREEDY_ROUNDS + 1 timed runs and a sort a round. */
static double greedy_stalls_by(const arena_layout *l, const arena_engine_opts *o, const arena_residency_plan *p,
			       const uint32_t *order, size_t k, uint8_t *cand, uint64_t *room, double *gain,
			       arena__timed *ts, int by_sum)
{
	arena__pick *pk = ts->picks;
	double cur = -1;
	for (int round = 0; round < ARENA__GREEDY_ROUNDS; round++) {
		cur = arena__timed_run(l, o, p->sched, p->bwd, p->n_sched, cand, p->slots, ts);
		if (cur < 0)
			return -1;
		const size_t m = ts->n_cl;
		const double waits = log_waits(ts);
		if (!(waits > cur * 1e-9))
			break; /* the compute waits for no copy */
		/* A block's gain: the best of its copies' (min(its time, the waits
		 * after it in its run), cp_of[b] that copy, or, when more, what its
		 * copies for the steady step save together (cp_of[b] BY_SUM; they
		 * are chained from cl_head[b] by cl_next, in order): made resident, a block is
		 * copied neither for its forward nor for its backward. */
		for (size_t i = 0; i < k; i++)
			gain[order[i]] = 0, ts->cl_sum[order[i]] = 0, ts->cl_head[order[i]] = BY_SUM;
		for (size_t c = 0; c < m; c++) {
			const uint32_t b = ts->cl_b[c];
			const double g = copy_gain(ts, c);
			if (g > gain[b])
				gain[b] = g, ts->cp_of[b] = (uint32_t)c;
			if (ts->cl_step[c] == 1)
				ts->cl_sum[b] += g;
		}
		for (size_t c = m; c-- > 0;) /* the chains in the log's order */
			if (ts->cl_step[c] == 1) {
				ts->cl_next[c] = ts->cl_head[ts->cl_b[c]];
				ts->cl_head[ts->cl_b[c]] = (uint32_t)c;
			}
		for (size_t i = 0; i < k && by_sum; i++) {
			const uint32_t b = order[i];
			if (ts->cl_sum[b] > gain[b])
				gain[b] = ts->cl_sum[b], ts->cp_of[b] = BY_SUM;
		}
		size_t n = 0;
		for (size_t i = 0; i < k; i++) {
			const uint32_t b = order[i];
			const uint64_t sz = l->blocks[b].bytes;
			if (!cand[b] && sz && sz <= *room && gain[b] > 0)
				pk[n++] = (arena__pick){gain[b] / (double)sz, sz, b, ts->cp_of[b], (uint32_t)i};
		}
		if (!n)
			break;
		qsort(pk, n, sizeof(*pk), pick_by_gain);
		/* Each busy run's waits (its first copy's cl_left) to be covered: a
		 * block is taken while the run of its best copy (or of one of its
		 * steady copies, by sum) has waits left; what it saves comes off. */
		size_t took = 0;
		for (size_t i = 0; i < n; i++) {
			const uint32_t b = pk[i].b, c0 = pk[i].c;
			if (pk[i].bytes > *room)
				continue;
			int open = c0 != BY_SUM && ts->cl_left[ts->cl_per[c0]] > 0;
			for (uint32_t c = c0 == BY_SUM ? ts->cl_head[b] : BY_SUM; c != BY_SUM && !open; c = ts->cl_next[c])
				open = ts->cl_left[ts->cl_per[c]] > 0;
			if (!open)
				continue;
			cand[b] = 1;
			*room -= pk[i].bytes;
			if (c0 != BY_SUM)
				ts->cl_left[ts->cl_per[c0]] -= gain[b];
			for (uint32_t c = c0 == BY_SUM ? ts->cl_head[b] : BY_SUM; c != BY_SUM; c = ts->cl_next[c])
				ts->cl_left[ts->cl_per[c]] -= copy_gain(ts, c);
			took++;
		}
		if (!took)
			break;
		cur = -1;
	}
	/* The room left, largest first. */
	size_t n = 0;
	for (size_t i = 0; i < k; i++) {
		const uint32_t b = order[i];
		if (!cand[b] && l->blocks[b].bytes <= *room)
			pk[n++] = (arena__pick){0, l->blocks[b].bytes, b, 0, (uint32_t)i};
	}
	qsort(pk, n, sizeof(*pk), pick_by_size);
	size_t added = 0;
	for (size_t i = 0; i < n; i++)
		if (pk[i].bytes <= *room) {
			cand[pk[i].b] = 1;
			*room -= pk[i].bytes;
			added++;
		}
	if (added || cur < 0)
		cur = arena__timed_run(l, o, p->sched, p->bwd, p->n_sched, cand, p->slots, ts);
	return cur;
}

unsigned arena__greedy_rules;
unsigned arena__no_refine;

/* The greedy past ARENA__GREEDY_SWAP_MAX blocks: by each block's best copy,
 * and by the sum of its steady copies where more (a training step copies a
 * streamed block for its forward and again for its backward); the plan
 * predicted faster (the first on a tie). Two greedies' cost. */
static double greedy_stalls(const arena_layout *l, const arena_engine_opts *o, const arena_residency_plan *p,
			    const uint32_t *order, size_t k, uint8_t *cand, uint64_t *room, double *gain, arena__timed *ts)
{
	const size_t n = l->n_blocks;
	if (arena__greedy_rules == 1 || arena__greedy_rules == 2)
		return greedy_stalls_by(l, o, p, order, k, cand, room, gain, ts, arena__greedy_rules == 2);
	if (o->mode != ARENA_MODE_TRAIN) /* one copy a block a step: the rules agree */
		return greedy_stalls_by(l, o, p, order, k, cand, room, gain, ts, 0);
	uint8_t *first = ts->alt;
	memcpy(first, cand, n);
	uint64_t room1 = *room;
	double t1 = greedy_stalls_by(l, o, p, order, k, first, &room1, gain, ts, 0);
	double t2 = greedy_stalls_by(l, o, p, order, k, cand, room, gain, ts, 1);
	if (t2 >= 0 && (t1 < 0 || t2 < t1))
		return t2;
	memcpy(cand, first, n);
	*room = room1;
	return t1;
}

/* With a profile: from the resident set `cand` (room bytes left), make
 * blocks resident one at a time (a few at a time past ARENA__GREEDY_SWAP_MAX),
 * each the one that shortens the predicted step most per byte, or the
 * largest that fits when none does; returns the predicted step of the
 * result (negative: a block could not be placed). */
double arena__greedy_timed(const arena_layout *l, const arena_engine_opts *o, const arena_residency_plan *p,
			   const uint32_t *order, size_t k, uint8_t *cand, uint64_t *room, double *gain, arena__timed *ts)
{
	if (k > ARENA__GREEDY_SWAP_MAX && ts->cl_b)
		return greedy_stalls(l, o, p, order, k, cand, room, gain, ts);
	uint8_t *swappable = ts->swappable; /* not resident by force (larger than a slot) */
	for (size_t b = 0; b < l->n_blocks; b++)
		swappable[b] = !cand[b];
	greedy_worker w[GREEDY_THREADS];
	memset(w, 0, sizeof(w));
	const unsigned nw = greedy_workers(l, p, k, w);
	uint32_t *cands = ts->cands;
	double cur = arena__timed_run(l, o, p->sched, p->bwd, p->n_sched, cand, p->slots, ts);
	while (cur >= 0) {
		int64_t pick = -1, big = -1;
		double best = 0;
		size_t n = 0;
		for (size_t i = 0; i < k; i++) {
			uint32_t b = order[i];
			gain[b] = 0;
			if (cand[b] || l->blocks[b].bytes > *room)
				continue;
			if (big < 0 || l->blocks[b].bytes > l->blocks[big].bytes)
				big = b;
			cands[n++] = b;
		}
		if (greedy_round(w, nw, l, o, p, cands, n, cand, cur, gain, NULL, ts)) {
			greedy_workers_free(w, nw);
			return -1;
		}
		for (size_t i = 0; i < n; i++)
			best = gain[cands[i]] > best ? gain[cands[i]] : best;
		if (big < 0)
			break;
		/* Among the blocks within 2% of the best gain per byte, the largest:
		 * while the copies dominate every block saves the same per byte, and
		 * a large block then leaves the small ones for the compute to hide. */
		for (size_t i = 0; best > 0 && i < k; i++) {
			uint32_t b = order[i];
			if (!cand[b] && l->blocks[b].bytes <= *room && gain[b] >= best * 0.98 &&
			    (pick < 0 || l->blocks[b].bytes > l->blocks[pick].bytes))
				pick = b;
		}
		if (pick < 0)
			pick = big;
		cand[pick] = 1;
		*room -= l->blocks[pick].bytes;
		/* Many blocks: the next best by their gains this round, too. */
		for (size_t more = k > ARENA__GREEDY_SWAP_MAX ? k / 128 : 0; more > 0 && best > 0; more--) {
			int64_t nx = -1;
			for (size_t i = 0; i < k; i++) {
				uint32_t b = order[i];
				if (!cand[b] && gain[b] > 0 && l->blocks[b].bytes <= *room && (nx < 0 || gain[b] > gain[nx]))
					nx = b;
			}
			if (nx < 0)
				break;
			cand[nx] = 1;
			*room -= l->blocks[nx].bytes;
		}
		cur = arena__timed_run(l, o, p->sched, p->bwd, p->n_sched, cand, p->slots, ts);
	}
	/* Then swaps: a resident block for a streamed one that fits in its place
	 * and the room, the best that shortens the step, while one does (the
	 * greedy's ties bunch residents; the compute hides copies better when
	 * they are spread). Bounded: at most 4 x blocks swaps. */
	for (size_t it = 0; cur >= 0 && k <= ARENA__GREEDY_SWAP_MAX && it < 4 * k; it++) {
		int64_t ra = -1, sb = -1;
		double best_t = cur * (1 - 1e-6);
		for (size_t i = 0; i < k; i++) {
			uint32_t r = order[i];
			if (!cand[r] || !swappable[r])
				continue;
			for (size_t j = 0; j < k; j++) {
				uint32_t q = order[j];
				if (cand[q] || l->blocks[q].bytes > l->blocks[r].bytes + *room)
					continue;
				cand[r] = 0;
				cand[q] = 1;
				double t = arena__timed_run(l, o, p->sched, p->bwd, p->n_sched, cand, p->slots, ts);
				cand[q] = 0;
				cand[r] = 1;
				if (t >= 0 && t < best_t) {
					best_t = t;
					ra = r;
					sb = q;
				}
			}
		}
		if (ra < 0)
			break;
		cand[ra] = 0;
		cand[sb] = 1;
		*room = *room + l->blocks[ra].bytes - l->blocks[sb].bytes;
		cur = best_t;
	}
	greedy_workers_free(w, nw);
	return cur;
}

/* The weights a resident set needs: the globals, the ring's slots at the
 * largest streamed block (at least the mode's least slot; none when nothing
 * streams) and the resident blocks. */
static uint64_t set_need(const arena_layout *l, const arena_engine_opts *o, const arena_residency_plan *p,
			 const uint8_t *res)
{
	uint64_t need = 0, slot = 0;
	for (size_t b = 0; b < l->n_blocks; b++) {
		const uint64_t sz = l->blocks[b].bytes;
		if (res[b] || arena_block_is_globals(l, (uint32_t)b))
			need += sz;
		else if (sz > slot)
			slot = sz;
	}
	if (slot && slot < arena__min_slot(o))
		slot = arena__min_slot(o);
	return need + (uint64_t)p->slots * slot;
}

/* A move of the refinement: resident block r for streamed block q. */
typedef struct refine_try {
	double est;
	uint32_t r, q;
} refine_try;

static int by_est(const void *x, const void *y)
{
	const refine_try *a = x, *b = y;
	if (a->est != b->est)
		return a->est > b->est ? -1 : 1;
	return a->r != b->r ? (a->r < b->r ? -1 : 1) : (a->q < b->q ? -1 : a->q > b->q);
}

double arena__refine_swaps(const arena_layout *l, const arena_engine_opts *o, const arena_residency_plan *p,
			   const uint32_t *order, size_t k, uint8_t *res, uint64_t budget, arena__timed *ts)
{
	const size_t n = l->n_blocks;
	double cur = arena__timed_run(l, o, p->sched, p->bwd, p->n_sched, res, p->slots, ts);
	if (cur < 0 || !ts->cl_b)
		return cur;
	double *loss = arena_malloc(n * sizeof(*loss)), *gsum = arena_malloc(n * sizeof(*gsum));
	double *scratch = arena_malloc(n * sizeof(*scratch));
	uint32_t *rs = arena_malloc(n * sizeof(*rs)), *qs = arena_malloc(n * sizeof(*qs));
	refine_try *tr = arena_malloc(REFINE_Q * REFINE_R * sizeof(*tr));
	greedy_worker w[GREEDY_THREADS];
	memset(w, 0, sizeof(w));
	const unsigned nw = loss && gsum && scratch && rs && qs && tr ? greedy_workers(l, p, k, w) : 1;
	if (!loss || !gsum || !scratch || !rs || !qs || !tr) {
		cur = -2;
		goto done;
	}
	size_t runs = 0;
	for (int round = 0; round < REFINE_ROUNDS && runs < REFINE_RUNS; round++) {
		cur = arena__timed_run(l, o, p->sched, p->bwd, p->n_sched, res, p->slots, ts);
		runs++;
		if (cur < 0)
			break;
		/* What each streamed block's steady copies would save, at most. */
		log_waits(ts);
		for (size_t i = 0; i < k; i++)
			gsum[order[i]] = 0;
		for (size_t c = 0; c < ts->n_cl; c++)
			if (ts->cl_step[c] == 1)
				gsum[ts->cl_b[c]] += copy_gain(ts, c);
		uint64_t slot = 0;
		for (size_t i = 0; i < k; i++)
			if (!res[order[i]] && l->blocks[order[i]].bytes > slot)
				slot = l->blocks[order[i]].bytes;
		/* The streamed blocks that would save most per byte; the resident
		 * ones (no larger than a slot: demoted, the ring stays) timed
		 * demoted, the least lost per byte first. */
		size_t nq = 0, nr = 0;
		for (size_t i = 0; i < k; i++) {
			const uint32_t b = order[i];
			if (!res[b] && gsum[b] > 0 && l->blocks[b].bytes)
				qs[nq++] = b;
		}
		for (size_t i = 0; i < nq; i++) /* the best REFINE_Q first (a partial selection) */
			for (size_t j = i + 1; j < nq && i < REFINE_Q; j++)
				if (gsum[qs[j]] / (double)l->blocks[qs[j]].bytes > gsum[qs[i]] / (double)l->blocks[qs[i]].bytes) {
					uint32_t t = qs[i];
					qs[i] = qs[j];
					qs[j] = t;
				}
		nq = nq < REFINE_Q ? nq : REFINE_Q;
		if (!nq)
			break;
		for (size_t i = 0; i < k; i++) {
			const uint32_t b = order[i];
			if (res[b] && l->blocks[b].bytes <= slot && l->blocks[b].bytes)
				rs[nr++] = b;
		}
		if (!nr)
			break;
		if (greedy_round(w, nw, l, o, p, rs, nr, res, cur, scratch, loss, ts)) {
			cur = -1;
			goto done;
		}
		runs += nr;
		for (size_t i = 0; i < nr; i++)
			loss[rs[i]] -= cur;
		for (size_t i = 0; i < nr; i++)
			for (size_t j = i + 1; j < nr && i < REFINE_R; j++)
				if (loss[rs[j]] / (double)l->blocks[rs[j]].bytes < loss[rs[i]] / (double)l->blocks[rs[i]].bytes) {
					uint32_t t = rs[i];
					rs[i] = rs[j];
					rs[j] = t;
				}
		nr = nr < REFINE_R ? nr : REFINE_R;
		/* The pairs that fit, by what the estimates say they save; each timed. */
		size_t nt = 0;
		for (size_t i = 0; i < nq; i++)
			for (size_t j = 0; j < nr; j++) {
				const uint32_t q = qs[i], r = rs[j];
				const double est = fmin(gsum[q], (double)l->blocks[q].bytes / o->h2d_bytes_per_s * 2) - loss[r];
				if (est > 0)
					tr[nt++] = (refine_try){est, r, q};
			}
		qsort(tr, nt, sizeof(*tr), by_est);
		double best = cur * (1 - 1e-6);
		int64_t pick = -1;
		for (size_t i = 0; i < nt && runs < REFINE_RUNS; i++) {
			res[tr[i].r] = 0;
			res[tr[i].q] = 1;
			if (set_need(l, o, p, res) <= budget) {
				double t = arena__timed_run(l, o, p->sched, p->bwd, p->n_sched, res, p->slots, ts);
				runs++;
				if (t >= 0 && t < best)
					best = t, pick = (int64_t)i;
			}
			res[tr[i].q] = 0;
			res[tr[i].r] = 1;
		}
		if (pick < 0)
			break;
		res[tr[pick].r] = 0;
		res[tr[pick].q] = 1;
		cur = best;
	}
	cur = arena__timed_run(l, o, p->sched, p->bwd, p->n_sched, res, p->slots, ts);
done:
	greedy_workers_free(w, nw);
	arena_free(scratch);
	arena_free(loss);
	arena_free(gsum);
	arena_free(rs);
	arena_free(qs);
	arena_free(tr);
	return cur;
}

double arena_residency_plan_predict(const arena_layout *l, const arena_engine_opts *o, const arena_residency_plan *p)
{
	arena__timed ts;
	if (!arena__have_profile(o) || !p->resident || arena__timed_init(&ts, l->n_blocks, p->n_sched))
		return -1;
	double t = arena__timed_run(l, o, p->sched, p->bwd, p->n_sched, p->resident, p->slots, &ts);
	arena__timed_release(&ts);
	return t;
}

int arena_residency_plan_timeline(const arena_layout *l, const arena_engine_opts *o, const arena_residency_plan *p,
				  arena_plan_span **spans, size_t *n, double *step_s)
{
	*spans = NULL;
	*n = 0;
	*step_s = 0;
	if (!arena__have_profile(o))
		return arena_errorf(ARENA_E_USAGE, "plan timeline: no compute profile");
	arena__timed ts;
	if (arena__timed_init(&ts, l->n_blocks, p->n_sched))
		return arena_errorf(ARENA_E_NOMEM, "plan timeline: out of memory");
	/* three steps of copies and entries at most */
	if (!(ts.spans = arena_calloc(3 * 2 * (p->n_sched ? p->n_sched : 1), sizeof(*ts.spans)))) {
		arena__timed_release(&ts);
		return arena_errorf(ARENA_E_NOMEM, "plan timeline: out of memory");
	}
	arena_plan_span *all = ts.spans;
	double t = arena__timed_run(l, o, p->sched, p->bwd, p->n_sched, p->resident, p->slots, &ts);
	size_t got = ts.n_spans;
	ts.spans = NULL;
	arena__timed_release(&ts);
	if (t < 0) {
		arena_free(all);
		return arena_errorf(ARENA_E_USAGE, "plan timeline: a block does not fit the ring");
	}
	/* The steady step: the second, from the end of the first's last entry
	 * (its own first entry may wait for a copy from then on). */
	double t0 = 0;
	size_t seen = 0;
	for (size_t i = 0; i < got && p->n_sched; i++)
		if (!all[i].copy && ++seen == p->n_sched)
			t0 = all[i].t1;
	double t1 = t0 + t;
	size_t k = 0;
	seen = 0;
	for (size_t i = 0; i < got; i++) {
		arena_plan_span sp = all[i];
		size_t nth = sp.copy ? 0 : seen++;
		if (sp.copy ? sp.t1 <= t0 || sp.t0 >= t1 : nth < p->n_sched || nth >= 2 * p->n_sched)
			continue; /* the second step's entries, and the copies while it runs */
		sp.t0 = (sp.t0 < t0 ? t0 : sp.t0) - t0;
		sp.t1 = (sp.t1 > t1 ? t1 : sp.t1) - t0;
		all[k++] = sp;
	}
	*spans = all;
	*n = k;
	*step_s = t;
	return 0;
}
