/* bench_work.c - the caller's side of `arena bench stream` (bench_work.h). */
#include "bench_work.h"

#include <stdio.h>

#include "../device/backend.h"
#include "../device/budget.h"
#include "../device/gemm.h"
#include "../device/probe.h"
#include "../common/alloc.h"
#include "../common/clock.h"
#include "../common/err.h"

struct bench_work {
	int cuda;
	double tokens, flops, sim_bw;
	arena_backend *be;   /* cuda: the caller's own backend on device 0 */
	arena_stream *s;     /* cuda: the caller's stream */
	void *native;        /* its cudaStream_t */
	arena_gemm *gemm;
	void *taken, *ballast; /* cuda: device memory held */
	int sim_pressure;    /* sim: pressure applied to the arena */
};

int bench_work_create(int cuda, double tokens, double flops, uint64_t max_params, double sim_bandwidth,
		      bench_work **out)
{
	*out = NULL;
	bench_work *w = arena_calloc(1, sizeof(*w));
	if (!w)
		return arena_errorf(ARENA_E_NOMEM, "out of memory");
	*w = (bench_work){.cuda = cuda, .tokens = tokens, .flops = flops, .sim_bw = sim_bandwidth};
	int rc = 0;
	if (cuda && !(rc = arena_backend_cuda_create(0, &w->be)) && !(rc = w->be->ops->stream_create(w->be, &w->s)) &&
	    !(rc = arena_backend_cuda_stream(w->be, w->s, &w->native)))
		rc = arena_gemm_create(w->be, w->s, (uint32_t)tokens, max_params, &w->gemm);
	if (rc) {
		bench_work_free(w);
		return rc;
	}
	*out = w;
	return 0;
}

void bench_work_free(bench_work *w)
{
	if (!w)
		return;
	arena_gemm_free(w->gemm);
	if (w->be) {
		if (w->taken)
			w->be->ops->dev_free(w->be, w->taken);
		if (w->ballast)
			w->be->ops->dev_free(w->be, w->ballast);
		if (w->s)
			w->be->ops->stream_destroy(w->be, w->s);
		arena_backend_destroy(w->be);
	}
	arena_free(w);
}

void *bench_work_stream(const bench_work *w)
{
	return w->native;
}

double bench_work_model_s(const bench_work *w, uint64_t params, int backward)
{
	return (backward ? 3.0 : 1.0) * 2.0 * w->tokens * (double)params / w->flops;
}

int bench_work_run(bench_work *w, const void *dptr, uint64_t params, int backward)
{
	if (!w->cuda) {
		arena_sleep_s(bench_work_model_s(w, params, backward));
		return 0;
	}
	int rc = 0;
	for (int i = 0; i < (backward ? 3 : 1) && !rc; i++)
		rc = arena_gemm_run(w->gemm, w->s, dptr, params);
	return rc;
}

int bench_work_sync(bench_work *w)
{
	return w->cuda ? w->be->ops->stream_sync(w->be, w->s) : 0;
}

int bench_work_time(bench_work *w, const void *dptr, uint64_t params, double *seconds)
{
	if (!w->cuda) {
		*seconds = bench_work_model_s(w, params, 0);
		return 0;
	}
	int rc = bench_work_run(w, dptr, params, 0);
	if (!rc)
		rc = bench_work_sync(w);
	double t0 = arena_now_s();
	for (int k = 0; k < 2 && !rc; k++)
		rc = bench_work_run(w, dptr, params, 0);
	if (!rc)
		rc = bench_work_sync(w);
	*seconds = (arena_now_s() - t0) / 2;
	return rc;
}

int bench_work_h2d(bench_work *w, double *rate)
{
	arena_backend *be = w->be, *own = NULL;
	arena_pin_budget budget;
	uint64_t fr = 0, tot = 0, pbytes;
	int rc;
	*rate = 0;
	arena_pin_budget_probe(&budget, 0, ARENA_PIN_RESERVE_AUTO, "");
	if (!w->cuda) {
		arena_sim_opts so = {.capacity = 1ull << 30, .h2d_bytes_per_s = w->sim_bw};
		if ((rc = arena_backend_sim_create(&so, &own)))
			return rc;
		be = own;
	}
	be->ops->mem_info(be, &fr, &tot);
	pbytes = fr / 4 < (256ull << 20) ? fr / 4 / 4096 * 4096 : (256ull << 20); /* the probe takes it twice */
	if (!w->cuda && w->sim_bw > 0 && pbytes > w->sim_bw / 20) /* sim: a pass of at most ~50 ms */
		pbytes = w->sim_bw / 20 < 4096 ? 4096 : (uint64_t)(w->sim_bw / 20) / 4096 * 4096;
	double g = 0;
	if (!pbytes)
		rc = arena_errorf(ARENA_E_IO, "cannot measure the host-to-device rate: no free device memory");
	else if ((rc = arena_probe_h2d(be, &budget, pbytes, 0.2, &g)) || (rc = arena_probe_h2d(be, &budget, pbytes, 0.5, &g)))
		;
	else if (!(g > 0))
		rc = arena_errorf(ARENA_E_IO, "cannot measure the host-to-device rate: no copy was timed");
	arena_backend_destroy(own);
	*rate = g * 1e9;
	return rc;
}

int bench_work_take(bench_work *w, arena *a, uint64_t want, uint64_t free_hint, uint64_t *got)
{
	*got = 0;
	if (!w->cuda) {
		uint64_t n = want < free_hint ? want : free_hint;
		int rc = arena_sim_pressure(a, n);
		if (!rc) {
			*got = n;
			w->sim_pressure = 1;
		}
		return rc;
	}
	while (want >= (256ull << 20)) {
		int rc = w->be->ops->dev_alloc(w->be, want, &w->taken);
		if (rc != ARENA_E(DEV_OOM)) {
			*got = rc ? 0 : want;
			return rc;
		}
		arena_error_clear();
		want -= 256ull << 20;
	}
	return 0;
}

void bench_work_give(bench_work *w, arena *a)
{
	if (w->cuda && w->taken) {
		w->be->ops->dev_free(w->be, w->taken);
		w->taken = NULL;
	} else if (!w->cuda && w->sim_pressure) {
		if (arena_sim_pressure(a, 0))
			arena_error_clear();
		w->sim_pressure = 0;
	}
}

int bench_work_ballast(bench_work *w, uint64_t keep, uint64_t *held)
{
	uint64_t fr = 0, tot = 0;
	*held = 0;
	if (!w->cuda)
		return arena_errorf(ARENA_E_USAGE, "--device-free is for --backend cuda");
	int rc = w->be->ops->mem_info(w->be, &fr, &tot);
	if (rc || fr <= keep)
		return rc;
	uint64_t want = fr - keep;
	while (want >= (256ull << 20)) {
		rc = w->be->ops->dev_alloc(w->be, want, &w->ballast);
		if (rc != ARENA_E(DEV_OOM)) {
			*held = rc ? 0 : want;
			return rc;
		}
		arena_error_clear();
		want -= 256ull << 20;
	}
	return 0;
}
