/* cmd_bench_run.c - `arena bench stream`'s run: the caller's loop through
 * the engine over the steps asked for, and on cuda the all-resident run
 * whose step time is the compute of the bound (see cmd_bench.c).
 *
 * Every block is acquired on the caller's stream, worked on and released
 * through include/arena.h alone; a step's time is taken once its work is
 * done. The engine's records of a step are read again after arena_sync,
 * once the device has timed the last steps. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "arena.h"
#include "cmd_bench_int.h"

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* The entries of a step in `mode` with `passes` forward passes; their count. */
static size_t step_entries(bench_loop *L, int mode, int passes)
{
	size_t k = 0;
	for (int p = 0; p < (mode == ARENA_MODE_TRAIN ? 1 : passes); p++)
		for (uint32_t b = 0; b < L->n; b++)
			if (b != L->globals)
				L->bwd[k] = 0, L->order[k++] = b;
	if (mode == ARENA_MODE_TRAIN)
		for (uint32_t b = (uint32_t)L->n; b-- > 0;)
			if (b != L->globals)
				L->bwd[k] = 1, L->order[k++] = b;
	return k;
}

/* One step: every entry acquired on the caller's stream, worked on,
 * released; returns when the work is done, *t its seconds. */
static int loop_step(bench_loop *L, size_t k, double *t)
{
	void *s = bench_work_stream(L->w), *d, *g = NULL;
	double t0 = now_s();
	int rc = arena_step_begin(L->a);
	if (!rc && L->globals != UINT32_MAX)
		rc = arena_block_acquire(L->a, L->globals, s, &g);
	for (size_t i = 0; !rc && i < k; i++) {
		uint32_t b = L->order[i];
		if (!(rc = arena_block_acquire(L->a, b, s, &d)) && !(rc = bench_work_run(L->w, d, L->params[b], L->bwd[i])))
			rc = arena_block_release(L->a, b, s);
	}
	if (!rc && L->globals != UINT32_MAX)
		rc = arena_block_release(L->a, L->globals, s);
	if (!rc && !(rc = arena_step_end(L->a)))
		rc = bench_work_sync(L->w);
	*t = now_s() - t0;
	return rc;
}

/* Parameters of block b: bytes / 2 on cuda (the GEMM reads the slab as
 * bf16), else its tensors' elements. */
static int block_params(arena *a, size_t n, int cuda, uint64_t *params)
{
	for (size_t b = 0; b < n; b++)
		params[b] = cuda ? arena_block_bytes(a, b) / 2 : 0;
	if (cuda)
		return 0;
	size_t nt = arena_tensor_count(a);
	for (size_t i = 0; i < nt; i++) {
		arena_tensor_info t;
		int rc = arena_tensor_get(a, i, &t);
		if (rc)
			return rc;
		uint64_t e = 1;
		for (uint32_t k = 0; k < t.rank; k++)
			e *= t.shape[k];
		params[t.block] += e;
	}
	return 0;
}

/* Per block, the seconds of its forward work (globals 0), timed over its
 * bytes in one step that acquires every block (cuda) or modelled (sim). */
static int given_profile(bench_loop *L, int cuda, double *cost)
{
	void *s = bench_work_stream(L->w), *d;
	int rc = cuda ? arena_step_begin(L->a) : 0;
	for (uint32_t b = 0; b < L->n && !rc; b++) {
		cost[b] = 0;
		if (b == L->globals || !arena_block_bytes(L->a, b))
			continue;
		if (!cuda) {
			cost[b] = bench_work_model_s(L->w, L->params[b], 0);
			continue;
		}
		if (!(rc = arena_block_acquire(L->a, b, s, &d)) && !(rc = bench_work_time(L->w, d, L->params[b], &cost[b])))
			rc = arena_block_release(L->a, b, s);
	}
	if (!rc && cuda)
		rc = arena_step_end(L->a);
	return rc;
}

/* --log: the decisions made since the `*seen`th, a line each on stderr. */
static void log_decisions(arena *a, uint64_t *seen)
{
	const uint64_t n = arena_decision_count(a);
	for (; *seen < n; (*seen)++) {
		arena_decision_info d;
		char line[512];
		if (arena_decision_get(a, *seen, &d))
			continue; /* (not kept: more than 256 since the last look) */
		bench_decision_line(&d, line, sizeof(line));
		fprintf(stderr, "%s\n", line);
	}
}

int bench_stream_run(const bench_stream_opts *o, bench_stream_state *S)
{
	const int cuda = o->cuda;
	bench_loop *L = &S->L;
	uint64_t pheld = 0;
	double res_step[2][5] = {{0}};
	int rc;
	/* The caller's side first: the GEMM (a missing cuBLAS fails at once),
	 * the limit, the ballast of a smaller card. Then the arena. */
	if ((rc = bench_work_create(cuda, o->tokens, o->flops, 4ull << 30, o->bw, &S->w)) ||
	    (rc = bench_work_h2d(S->w, &S->h2d)))
		return rc;
	if (o->devfree && (rc = bench_work_ballast(S->w, o->devfree, &S->bheld)))
		return rc;
	if ((rc = arena_open(o->path, &o->ao, &S->a)))
		return rc;
	L->a = S->a;
	L->w = S->w;
	L->n = arena_block_count(S->a);
	L->globals = UINT32_MAX;
	for (size_t b = 0; b < L->n; b++) {
		arena_block_info bi;
		if ((rc = arena_block_get(S->a, b, &bi)))
			return rc;
		if (!bi.container && bi.bytes)
			L->globals = (uint32_t)b;
	}
	S->params = calloc(L->n ? L->n : 1, sizeof(*S->params));
	S->out = calloc((size_t)o->steps, sizeof(*S->out));
	L->order = calloc(4 * (L->n + 1), sizeof(*L->order));
	L->bwd = calloc(4 * (L->n + 1), 1);
	S->cost = calloc(L->n ? L->n : 1, sizeof(*S->cost));
	if (!S->params || !S->out || !L->order || !L->bwd || !S->cost) {
		fprintf(stderr, "error: out of memory\n");
		S->status = 3;
		return 0;
	}
	step_out *out = S->out;
	if ((rc = block_params(S->a, L->n, cuda, S->params)))
		return rc;
	L->params = S->params;
	uint64_t first = 0;
	if (o->profile == 1) {
		if ((rc = given_profile(L, cuda, S->cost)) || (rc = arena_profile_set(S->a, S->cost, L->n, S->h2d, 0)))
			return rc;
		first = arena_step_count(S->a); /* the timing step */
	}
	if (o->trace && (rc = arena_trace_begin(S->a, o->trace, 0)))
		return rc;
	uint64_t logged = 0;
	if (o->log)
		log_decisions(S->a, &logged); /* (a profile given before the run moves the plan) */
	for (long st = 0; st < o->steps; st++) {
		int mode = o->every && st % o->every == o->every - 1 ? ARENA_MODE_SAMPLE : o->ao.mode;
		if (st == o->pstep) {
			uint64_t fr = 0, tot = 0;
			if ((rc = arena_device_memory(S->a, &fr, &tot)) ||
			    (rc = bench_work_take(S->w, S->a, o->psize, fr, &pheld)))
				return rc;
		} else if (o->pstep >= 0 && st == o->pstep + 5) {
			bench_work_give(S->w, S->a);
			pheld = 0;
		}
		if (arena_mode(S->a) != mode && (rc = arena_set_mode(S->a, mode)))
			return rc;
		size_t k = step_entries(L, mode, (int)o->passes);
		step_out *so = &out[st];
		so->mode = mode;
		so->passes = mode == ARENA_MODE_TRAIN ? 1 : (int)o->passes;
		so->pressure_bytes = pheld;
		for (size_t i = 0; i < k; i++)
			so->compute_s += bench_work_model_s(S->w, S->params[L->order[i]], L->bwd[i]);
		if ((rc = loop_step(L, k, &so->time_s)) || (rc = arena_step_get(S->a, first + (uint64_t)st, &so->rec)))
			return rc;
		if (o->log)
			log_decisions(S->a, &logged);
	}
	if (o->trace) {
		if ((rc = arena_trace_end(S->a)))
			return rc;
		fprintf(stderr, "note: wrote the trace %s (open it in https://ui.perfetto.dev)\n", o->trace);
	}
	/* The device's timing of the last steps, now that their work is done. */
	if ((rc = arena_sync(S->a)))
		return rc;
	for (long st = 0; st < o->steps; st++)
		if (arena_step_get(S->a, first + (uint64_t)st, &out[st].rec))
			fprintf(stderr, "note: %s\n", arena_last_error()); /* older than the records kept */
	if (o->save_profile && (rc = arena_profile_save(S->a, o->save_profile)))
		return rc;
	if ((rc = arena_plan_get(S->a, &S->p)))
		return rc;
	if (!(S->dec = calloc(257, sizeof(*S->dec)))) {
		fprintf(stderr, "error: out of memory\n");
		S->status = 3;
		return 0;
	}
	for (uint64_t n = arena_decision_count(S->a), i = n > 256 ? n - 256 : 0; i < n; i++)
		if (arena_decision_get(S->a, i, &S->dec[S->n_dec]) == 0)
			S->n_dec++;
	bench_work_give(S->w, S->a);
	/* The bound's compute. sim: the modelled work, exactly. cuda: a run of
	 * the same kinds of steps with every block resident (no cap, nothing
	 * held), one warm-up and three timed of each kind. */
	if (cuda) {
		const uint64_t piece = S->p.piece_size; /* the same units as the run ("auto" resolved) */
		arena_close(S->a);
		S->a = L->a = NULL;
		bench_work_free(S->w); /* gives back the ballast, makes a new stream below */
		S->w = L->w = NULL;
		arena_open_options full = o->ao;
		full.vram_cap = 0;
		full.piece_size = piece;
		full.flags &= ~ARENA_OPEN_STRICT;
		if ((rc = bench_work_create(cuda, o->tokens, o->flops, 4ull << 30, o->bw, &S->w)) ||
		    (rc = arena_open(o->path, &full, &S->a)))
			return rc;
		L->a = S->a;
		L->w = S->w;
		arena_plan_info fp;
		if ((rc = arena_plan_get(S->a, &fp)))
			return rc;
		if (!fp.n_streamed) {
			S->measured = 1;
			for (int mode = 0; mode < 2; mode++)
				for (int ps = 1; ps <= 4; ps++) {
					int used = 0;
					for (long st = 0; st < o->steps; st++)
						used |= out[st].mode == mode && out[st].passes == ps;
					if (!used)
						continue;
					if (arena_mode(S->a) != mode && (rc = arena_set_mode(S->a, mode)))
						return rc;
					size_t k = step_entries(L, mode, ps);
					double t, sum = 0;
					for (int r = -1; r < 3; r++) {
						if ((rc = loop_step(L, k, &t)))
							return rc;
						sum += r >= 0 ? t : 0;
					}
					res_step[mode][ps] = sum / 3;
				}
			for (long st = 0; st < o->steps; st++)
				out[st].compute_s = res_step[out[st].mode][out[st].passes];
		} else {
			fprintf(stderr, "note: the model does not fit the device all resident: no all-resident run, "
					"compute modelled at --flops\n");
		}
	}
	for (long st = 0; st < o->steps; st++) {
		/* the bytes that went over the bus: coded ones for blocks held coded */
		double copy = (double)out[st].rec.moved_bytes / S->h2d;
		out[st].bound_s = out[st].compute_s > copy ? out[st].compute_s : copy;
	}
	return 0;
}

void bench_stream_free(bench_stream_state *S)
{
	if (S->w && S->a)
		bench_work_give(S->w, S->a);
	arena_close(S->a);
	bench_work_free(S->w);
	free(S->params);
	free(S->out);
	free(S->L.order);
	free(S->L.bwd);
	free(S->cost);
	free(S->dec);
}
