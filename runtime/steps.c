/* steps.c - the public step calls (include/arena.h): acquire and release
 * blocks, steps, modes, the rest of the process's memory and the host
 * copies kept, records, profiles; each under the arena's lock. */
#include <stdio.h>
#include <string.h>

#include "../formats/dequant.h"
#include "../engine/profile.h"
#include "../formats/scheme.h"
#include "../common/alloc.h"
#include "../common/err.h"
#include "open.h"

/* Enter a and lock it for an engine call: 0, or USAGE (not live, closed). */
static int lock(const arena *ca, const char *what)
{
	arena *a = arena__mut(ca);
	int rc = arena__enter(a);
	if (rc)
		return rc;
	pthread_mutex_lock(&a->mu);
	if (a->closed) {
		pthread_mutex_unlock(&a->mu);
		arena__leave(a);
		return arena_errorf(ARENA_E_USAGE, "%s: the arena is closed", what);
	}
	return 0;
}

static int unlock(const arena *ca, int rc)
{
	arena *a = arena__mut(ca);
	pthread_mutex_unlock(&a->mu);
	arena__leave(a);
	return rc;
}

/* The backend's stream for a native handle (a->mu held). */
static int stream_of(arena *a, void *native, arena_stream **s)
{
	return a->be->ops->stream_native(a->be, native, s);
}

int arena_step_begin(arena *a)
{
	int rc = lock(a, "arena_step_begin");
	return rc ? rc : unlock(a, arena_engine_step_begin(a->e));
}

int arena_block_acquire(arena *a, size_t block, void *stream, void **dptr)
{
	int rc = lock(a, "arena_block_acquire");
	if (rc)
		return rc;
	arena_stream *s;
	if (!dptr)
		rc = arena_errorf(ARENA_E_USAGE, "arena_block_acquire: NULL dptr");
	else if (block >= a->m->layout->n_blocks)
		rc = arena_errorf(ARENA_E_USAGE, "arena_block_acquire: block index %zu is out of range (%zu blocks)", block,
				  a->m->layout->n_blocks);
	else if (!(rc = stream_of(a, stream, &s)))
		rc = arena_engine_acquire(a->e, (uint32_t)block, s, dptr);
	return unlock(a, rc);
}

int arena_block_acquire_name(arena *a, const char *name, void *stream, void **dptr, size_t *index)
{
	size_t i;
	int rc = arena_block_find(a, name, &i);
	if (!rc && index)
		*index = i;
	return rc ? rc : arena_block_acquire(a, i, stream, dptr);
}

int arena_block_release(arena *a, size_t block, void *stream)
{
	int rc = lock(a, "arena_block_release");
	if (rc)
		return rc;
	arena_stream *s;
	if (block >= a->m->layout->n_blocks)
		rc = arena_errorf(ARENA_E_USAGE, "arena_block_release: block index %zu is out of range (%zu blocks)", block,
				  a->m->layout->n_blocks);
	else if (!(rc = stream_of(a, stream, &s)))
		rc = arena_engine_release(a->e, (uint32_t)block, s);
	return unlock(a, rc);
}

int arena_step_end(arena *a)
{
	int rc = lock(a, "arena_step_end");
	return rc ? rc : unlock(a, arena_engine_step_end(a->e));
}

int arena_rest_report(arena *a, const arena_rest_info *r)
{
	int rc = lock(a, "arena_rest_report");
	if (rc)
		return rc;
	if (!r)
		return unlock(a, arena_errorf(ARENA_E_USAGE, "arena_rest_report: NULL report"));
	if (r->flags & ~ARENA_REST_OOM)
		return unlock(a, arena_errorf(ARENA_E_USAGE, "arena_rest_report: unknown flags 0x%x", r->flags));
	return unlock(a, arena_engine_rest_report(a->e, r->now, r->peak, r->work, r->flags));
}

int arena_set_rest_memory(arena *a, uint64_t bytes)
{
	arena_rest_info r = {bytes, bytes, 0, 0};
	return arena_rest_report(a, &r);
}

int arena_memory_get(const arena *a, arena_memory_info *out)
{
	int rc = lock(a, "arena_memory_get");
	if (rc)
		return rc;
	if (!out)
		return unlock(a, arena_errorf(ARENA_E_USAGE, "arena_memory_get: NULL out"));
	return unlock(a, arena_engine_memory(a->e, out));
}

int arena_block_keep_host(arena *a, size_t i)
{
	int rc = lock(a, "arena_block_keep_host");
	if (rc)
		return rc;
	if (i >= a->m->layout->n_blocks)
		rc = arena_errorf(ARENA_E_USAGE, "block index %zu is out of range (%zu blocks)", i, a->m->layout->n_blocks);
	else
		a->m->mem[i].kept = 1;
	return unlock(a, rc);
}

int arena_set_mode(arena *a, int mode)
{
	int rc = lock(a, "arena_set_mode");
	if (rc)
		return rc;
	/* the new mode's ring, by the rule arena_open went by */
	arena_engine_opts r = a->eo;
	r.mode = mode;
	if ((mode == ARENA_MODE_SAMPLE || mode == ARENA_MODE_TRAIN) &&
	    (rc = arena_residency_ring(a->m->layout, a->piece_size != 0, a->depth, &r))) {
		char why[512];
		snprintf(why, sizeof(why), "%s", arena_last_error());
		return unlock(a, arena_errorf(rc, "%s: %s", a->path, why));
	}
	return unlock(a, arena_engine_set_mode_ring(a->e, mode, r.depth));
}

int arena_mode(const arena *a)
{
	if (lock(a, "arena_mode"))
		return -1;
	return unlock(a, arena_engine_mode(a->e));
}

int arena_sync(arena *a)
{
	int rc = lock(a, "arena_sync");
	if (rc)
		return rc;
	rc = a->be->ops->stream_sync(a->be, arena_engine_copy_stream(a->e));
	if (!rc)
		rc = arena_engine_collect(a->e);
	return unlock(a, rc);
}

/* Tensor t's dequantization job into dst from its block's bytes at `block`
 * (formats/scheme.h's arena_quant_dequant_job, its message prefixed). */
static int dequant_job(const arena_tensor *t, const void *block, void *dst, arena_dequant_job *j)
{
	int rc = arena_quant_dequant_job(t, block, dst, j);
	if (rc)
		arena_error_prefix("arena_tensor_dequantize");
	return rc;
}

int arena_tensor_dequantize(arena *a, size_t tensor, const void *block, void *dst, void *stream)
{
	int rc = lock(a, "arena_tensor_dequantize");
	if (rc)
		return rc;
	const arena_layout *l = a->m->layout;
	arena_dequant_job j;
	arena_stream *s;
	if (tensor >= l->n_tensors)
		rc = arena_errorf(ARENA_E_USAGE, "arena_tensor_dequantize: tensor index %zu is out of range (%zu tensors)",
				  tensor, l->n_tensors);
	else if (!block || !dst)
		rc = arena_errorf(ARENA_E_USAGE, "arena_tensor_dequantize: NULL %s", block ? "dst" : "block");
	else if (!(rc = dequant_job(&l->tensors[tensor], block, dst, &j))) { /* (reads nothing yet) */
		const arena_tensor *t = &l->tensors[tensor];
		if (!arena_engine_block_at(a->e, t->block, block))
			/* an address inside a slab reads misaligned or past the block (another ring slot) */
			rc = arena_errorf(ARENA_E_USAGE,
					  "arena_tensor_dequantize: %p is not the address of block '%s' (tensor '%s'): pass "
					  "what arena_block_acquire gave while it is held, or the block's device address while "
					  "it is resident",
					  block, l->blocks[t->block].name, t->name);
		else if (!(rc = stream_of(a, stream, &s)))
			rc = a->be->ops->dequant(a->be, &j, s);
	}
	return unlock(a, rc);
}

/* arena_fp8_quantize_rows and its _scaled form (scaled: col_scale required). */
static int fp8_rows(arena *a, const char *fn, int scaled, const void *x, uint64_t rows, uint64_t cols,
		    const float *col_scale, void *q, float *scale, void *stream)
{
	int rc = lock(a, fn);
	if (rc)
		return rc;
	arena_stream *s;
	if ((rows && cols && (!x || !q || (scaled && !col_scale))) || (rows && !scale))
		rc = arena_errorf(ARENA_E_USAGE, "%s: NULL %s", fn,
				  !scale ? "scale" : !x ? "x" : !q ? "q" : "col_scale");
	else if (rows >= (1ull << 31) || (rows && cols > UINT64_MAX / rows))
		rc = arena_errorf(ARENA_E_USAGE, "%s: %llu rows of %llu: too many", fn, (unsigned long long)rows,
				  (unsigned long long)cols);
	else if (rows && !(rc = stream_of(a, stream, &s)))
		rc = a->be->ops->fp8_rows(a->be, x, rows, cols, col_scale, q, scale, s);
	return unlock(a, rc);
}

int arena_fp8_quantize_rows(arena *a, const void *x, uint64_t rows, uint64_t cols, void *q, float *scale,
			    void *stream)
{
	return fp8_rows(a, "arena_fp8_quantize_rows", 0, x, rows, cols, NULL, q, scale, stream);
}

int arena_fp8_quantize_rows_scaled(arena *a, const void *x, uint64_t rows, uint64_t cols, const float *col_scale,
				   void *q, float *scale, void *stream)
{
	return fp8_rows(a, "arena_fp8_quantize_rows_scaled", 1, x, rows, cols, col_scale, q, scale, stream);
}

int arena_fp8_transpose(arena *a, const void *x, uint64_t rows, uint64_t cols, void *t, void *stream)
{
	int rc = lock(a, "arena_fp8_transpose");
	if (rc)
		return rc;
	arena_stream *s;
	const uint64_t n = rows && cols ? rows * cols : 0;
	if (n && (!x || !t))
		rc = arena_errorf(ARENA_E_USAGE, "arena_fp8_transpose: NULL %s", !x ? "x" : "t");
	else if (rows >= (1ull << 31) || cols >= (1ull << 31))
		rc = arena_errorf(ARENA_E_USAGE, "arena_fp8_transpose: %llu rows of %llu: too many", (unsigned long long)rows,
				  (unsigned long long)cols);
	else if (n && (uintptr_t)x < (uintptr_t)t + n && (uintptr_t)t < (uintptr_t)x + n)
		rc = arena_errorf(ARENA_E_USAGE, "arena_fp8_transpose: x and t overlap (the transpose needs memory of its own)");
	else if (n && !(rc = stream_of(a, stream, &s)))
		rc = a->be->ops->transpose8(a->be, x, rows, cols, t, s);
	return unlock(a, rc);
}

uint64_t arena_step_count(const arena *a)
{
	if (lock(a, "arena_step_count"))
		return 0;
	uint64_t n = arena_engine_steps(a->e);
	unlock(a, 0);
	return n;
}

int arena_step_get(const arena *a, uint64_t step, arena_step_info *out)
{
	int rc = lock(a, "arena_step_get");
	if (rc)
		return rc;
	arena_engine_step r;
	if (!out)
		rc = arena_errorf(ARENA_E_USAGE, "arena_step_get: NULL out");
	else if (!(rc = arena_engine_step_record(a->e, step, &r)))
		*out = (arena_step_info){.step = r.step,
					 .mode = r.mode,
					 .budget = r.budget,
					 .free_bytes = r.free_bytes,
					 .resident_bytes = r.resident_bytes,
					 .ring_bytes = r.slot_bytes * r.slots,
					 .streamed_bytes = r.streamed_bytes,
					 .copies = r.copies,
					 .promoted_bytes = r.promoted_bytes,
					 .acquires = r.acquires,
					 .misses = r.misses,
					 .demotions = r.demotions,
					 .promotions = r.promotions,
					 .over_budget = r.over_budget,
					 .schedule_learned = r.schedule_learned,
					 .stopped_early = r.stopped_early,
					 .profile_learned = r.profile_learned,
					 .gpu_timed = r.gpu_timed,
					 .stalls = r.stalls,
					 .stall_s = r.stall_s,
					 .compute_s = r.compute_s,
					 .end_s = r.end_s,
					 .plan_s = r.plan_s,
					 .move_s = r.move_s,
					 .disk_bytes = r.disk_bytes,
					 .moved_bytes = r.moved_bytes,
					 .disk_wait_s = r.disk_wait_s,
					 .looked = r.looked,
					 .look_s = r.look_s,
					 .look_now_s = r.look_now_s,
					 .look_plan_s = r.look_plan_s,
					 .move_est_s = r.move_est_s,
					 .move_gain_s = r.move_gain_s,
					 .move_held = r.move_held,
					 .host_read_bytes = r.host_read_bytes,
					 .prepared_bytes = r.prepared_bytes};
	return unlock(a, rc);
}

uint64_t arena_decision_count(const arena *a)
{
	if (lock(a, "arena_decision_count"))
		return 0;
	uint64_t n = arena_engine_decisions(a->e);
	unlock(a, 0);
	return n;
}

int arena_decision_get(const arena *a, uint64_t i, arena_decision_info *out)
{
	int rc = lock(a, "arena_decision_get");
	if (rc)
		return rc;
	arena_engine_decision d;
	if (!out)
		rc = arena_errorf(ARENA_E_USAGE, "arena_decision_get: NULL out");
	else if (!(rc = arena_engine_decision_get(a->e, i, &d)))
		*out = (arena_decision_info){.step = d.step,
					     .between = d.between,
					     .why = d.why,
					     .why_name = arena_engine_why_name(d.why),
					     .promoted = d.promoted,
					     .demoted = d.demoted,
					     .promoted_bytes = d.promoted_bytes,
					     .demoted_bytes = d.demoted_bytes,
					     .resident_before = d.resident_before,
					     .resident_after = d.resident_after,
					     .ring_before = d.ring_before,
					     .ring_after = d.ring_after,
					     .budget = d.budget,
					     .free_bytes = d.free_bytes,
					     .stream_before = d.stream_before,
					     .stream_after = d.stream_after,
					     .step_before_s = d.step_before_s,
					     .step_after_s = d.step_after_s};
	return unlock(a, rc);
}

int arena_plan_get(const arena *a, arena_plan_info *out)
{
	int rc = lock(a, "arena_plan_get");
	if (rc)
		return rc;
	if (!out)
		return unlock(a, arena_errorf(ARENA_E_USAGE, "arena_plan_get: NULL out"));
	const arena_residency_plan *p = arena_engine_plan(a->e);
	size_t n_disk = 0;
	for (size_t b = 0; b < a->m->layout->n_blocks; b++)
		n_disk += !a->m->mem[b].dev && !a->m->mem[b].host && !a->m->mem[b].wire && a->m->layout->blocks[b].bytes;
	*out = (arena_plan_info){.mode = arena_engine_mode(a->e),
				 .budget = p->budget,
				 .headroom = p->headroom,
				 .reserve = p->reserve,
				 .globals_bytes = p->globals_bytes,
				 .resident_bytes = p->resident_bytes,
				 .streamed_block_bytes = p->streamed_block_bytes,
				 .slot_bytes = p->n_streamed ? p->slot_bytes : 0,
				 .slots = p->n_streamed ? p->slots : 0,
				 .depth = p->depth,
				 .need_bytes = p->need_bytes,
				 .min_need_bytes = p->min_need_bytes,
				 .stream_bytes_per_step = p->stream_bytes_per_step,
				 .copies_per_step = p->copies_per_step,
				 .n_resident = p->n_resident,
				 .n_streamed = p->n_streamed,
				 .schedule_length = p->n_sched,
				 .predicted_step_s = p->step_s,
				 .piece_size = a->piece_size,
				 .host_bytes = a->m->host_bytes,
				 .n_disk = n_disk,
				 .host_budget = a->host_budget,
				 .staging_bytes = a->staging};
	return unlock(a, 0);
}

int arena_share_get(const arena *a, arena_share_info *out)
{
	int rc = lock(a, "arena_share_get");
	if (rc)
		return rc;
	if (!out)
		return unlock(a, arena_errorf(ARENA_E_USAGE, "arena_share_get: NULL out"));
	const arena_model *m = a->m;
	*out = (arena_share_info){.state = m->share_state,
				  .check_s = m->share_check_s,
				  .checked_bytes = m->share_checked,
				  .check_read_bytes = m->share_check_read};
	if (m->share_state == ARENA_SHARE_PRIVATE)
		snprintf(out->why, sizeof(out->why), "%s", m->share_why);
	return unlock(a, 0);
}

int arena_schedule_get(const arena *a, uint32_t *blocks, size_t cap, size_t *n)
{
	int rc = lock(a, "arena_schedule_get");
	if (rc)
		return rc;
	if (!n || (cap && !blocks))
		return unlock(a, arena_errorf(ARENA_E_USAGE, "arena_schedule_get: NULL n or blocks"));
	const arena_residency_plan *p = arena_engine_plan(a->e);
	memcpy(blocks, p->sched, (cap < p->n_sched ? cap : p->n_sched) * sizeof(*blocks));
	*n = p->n_sched;
	return unlock(a, 0);
}

int arena_schedule_set(arena *a, const uint32_t *blocks, size_t n)
{
	int rc = lock(a, "arena_schedule_set");
	return rc ? rc : unlock(a, arena_engine_set_schedule(a->e, blocks, n));
}

int arena_profile_get(const arena *a, double *cost, size_t n, double *h2d, double *bwd)
{
	int rc = lock(a, "arena_profile_get");
	if (rc)
		return rc;
	size_t nb = a->m->layout->n_blocks;
	double h = 0, w = 0;
	if (!cost || n != nb)
		rc = arena_errorf(ARENA_E_USAGE, "arena_profile_get: cost must have %zu entries (got %zu%s)", nb, n,
				  cost ? "" : ", NULL");
	else if (!(rc = arena_engine_profile(a->e, cost, &h, &w))) {
		if (h2d)
			*h2d = h;
		if (bwd)
			*bwd = w;
	}
	return unlock(a, rc);
}

int arena_profile_set(arena *a, const double *cost, size_t n, double h2d, double bwd)
{
	int rc = lock(a, "arena_profile_set");
	if (rc)
		return rc;
	size_t nb = a->m->layout->n_blocks;
	if (!cost || n != nb)
		rc = arena_errorf(ARENA_E_USAGE, "arena_profile_set: cost must have %zu entries (got %zu%s)", nb, n,
				  cost ? "" : ", NULL");
	else
		rc = arena_engine_set_profile(a->e, cost, h2d, bwd);
	return unlock(a, rc);
}

int arena_profile_save(const arena *a, const char *path)
{
	int rc = lock(a, "arena_profile_save");
	if (rc)
		return rc;
	size_t nb = a->m->layout->n_blocks;
	double *c = arena_calloc(nb ? nb : 1, sizeof(*c)), h = 0, w = 0;
	if (!path)
		rc = arena_errorf(ARENA_E_USAGE, "arena_profile_save: NULL path");
	else if (!c)
		rc = arena_errorf(ARENA_E_NOMEM, "out of memory");
	else if (!(rc = a->rr ? arena_slab_reader_check_output(a->rr, path) : 0) && /* not over the image */
		 !(rc = arena_engine_profile(a->e, c, &h, &w))) {
		if (!(h > 0))
			rc = arena_errorf(ARENA_E_NOT_FOUND, "%s: no host-to-device rate yet (no copy timed)", path);
		else
			rc = arena_profile_write(path, a->m->layout, c, h, w);
	}
	arena_free(c);
	return unlock(a, rc);
}

int arena_trace_begin(arena *a, const char *path, size_t max_events)
{
	int rc = lock(a, "arena_trace_begin");
	if (rc)
		return rc;
	if (!path)
		rc = arena_errorf(ARENA_E_USAGE, "arena_trace_begin: NULL path");
	else if (!(rc = a->rr ? arena_slab_reader_check_output(a->rr, path) : 0)) /* not over the image */
		rc = arena_engine_trace_begin(a->e, path, a->path, max_events);
	return unlock(a, rc);
}

int arena_trace_end(arena *a)
{
	int rc = lock(a, "arena_trace_end");
	return rc ? rc : unlock(a, arena_engine_trace_end(a->e));
}

int arena_device_memory(const arena *a, uint64_t *free_bytes, uint64_t *total_bytes)
{
	int rc = lock(a, "arena_device_memory");
	if (rc)
		return rc;
	uint64_t f = 0, t = 0;
	if (!free_bytes || !total_bytes)
		rc = arena_errorf(ARENA_E_USAGE, "arena_device_memory: NULL out");
	else if (!(rc = a->be->ops->mem_info(a->be, &f, &t)))
		*free_bytes = f, *total_bytes = t;
	return unlock(a, rc);
}

int arena_sim_pressure(arena *a, uint64_t bytes)
{
	int rc = lock(a, "arena_sim_pressure");
	if (rc)
		return rc;
	if (strcmp(a->be->ops->name, "sim"))
		rc = arena_errorf(ARENA_E_USAGE, "arena_sim_pressure: the backend is %s, not sim", a->be->ops->name);
	else
		rc = arena_backend_sim_pressure(a->be, bytes);
	return unlock(a, rc);
}

int arena_sim_rest(arena *a, uint64_t bytes)
{
	int rc = lock(a, "arena_sim_rest");
	if (rc)
		return rc;
	if (strcmp(a->be->ops->name, "sim"))
		rc = arena_errorf(ARENA_E_USAGE, "arena_sim_rest: the backend is %s, not sim", a->be->ops->name);
	else
		rc = arena_backend_sim_rest(a->be, bytes);
	return unlock(a, rc);
}

int arena_sim_fail_alloc(arena *a, uint64_t after, uint64_t count)
{
	int rc = lock(a, "arena_sim_fail_alloc");
	if (rc)
		return rc;
	if (strcmp(a->be->ops->name, "sim"))
		rc = arena_errorf(ARENA_E_USAGE, "arena_sim_fail_alloc: the backend is %s, not sim", a->be->ops->name);
	else
		rc = arena_backend_sim_fail_alloc(a->be, after, count);
	return unlock(a, rc);
}

int arena_sim_peak(arena *a, int reset, uint64_t *peak)
{
	int rc = lock(a, "arena_sim_peak");
	if (rc)
		return rc;
	if (!peak)
		rc = arena_errorf(ARENA_E_USAGE, "arena_sim_peak: NULL peak");
	else if (strcmp(a->be->ops->name, "sim"))
		rc = arena_errorf(ARENA_E_USAGE, "arena_sim_peak: the backend is %s, not sim", a->be->ops->name);
	else
		rc = arena_backend_sim_peak(a->be, reset, peak);
	return unlock(a, rc);
}
