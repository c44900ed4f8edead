/* engine_trace.c - where a streamed step's time goes on the GPU: runs
 * `arena bench stream`'s schedule (a bf16 GEMM with T rows per block)
 * through the engine on cuda and records CUDA timing events on the compute
 * stream around every entry's GEMM. Prints, for the last step, each entry's
 * start and end (ms from the step's first event) and the idle gap before it
 * (the compute waiting for that block's copy), then totals as JSON.
 *
 *   engine_trace IMAGE --vram-cap SIZE [--mode sample|train] [--tokens T] [--steps N] [--depth N]
 *
 * The limit, in the same totals: the GEMMs' busy time (the compute) and
 * the gaps before streamed blocks (what the copies add to it). `arena bench
 * stream --trace` gives the whole timeline; this gives the per-entry gaps.
 * Build: `make bench` (needs CUDA): build/bench/engine_trace. Exit status:
 * 0, 2 for usage, or the class of an arena error.
 */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "../engine/engine.h"
#include "../device/gemm.h"
#include "../common/alloc.h"
#include "../formats/image.h"
#include "../runtime/load.h"
#include "../runtime/reread.h"

static int fail(const char *what)
{
	fprintf(stderr, "error: %s: %s\n", what, arena_last_error());
	return 3;
}

static uint64_t size_arg(const char *s)
{
	char *end;
	double v = strtod(s, &end);
	if (*end == 'G')
		v *= 1073741824.0;
	else if (*end == 'M')
		v *= 1048576.0;
	return (uint64_t)v;
}

int main(int argc, char **argv)
{
	const char *path = NULL;
	arena_engine_opts o = {.headroom = ARENA_ENGINE_AUTO, .reserve = ARENA_ENGINE_AUTO, .keep_last = 1};
	int tokens = 4608, steps = 4;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--vram-cap") && i + 1 < argc)
			o.cap = size_arg(argv[++i]);
		else if (!strcmp(argv[i], "--mode") && i + 1 < argc)
			o.mode = !strcmp(argv[++i], "train") ? ARENA_MODE_TRAIN : ARENA_MODE_SAMPLE;
		else if (!strcmp(argv[i], "--tokens") && i + 1 < argc)
			tokens = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--steps") && i + 1 < argc)
			steps = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--depth") && i + 1 < argc)
			o.depth = (unsigned)atoi(argv[++i]);
		else if (argv[i][0] != '-' && !path)
			path = argv[i];
		else {
			fprintf(stderr, "usage: engine_trace IMAGE --vram-cap SIZE [--mode sample|train] [--tokens T] "
					"[--steps N] [--depth N]\n");
			return 2;
		}
	}
	if (!path || steps < 1 || tokens < 1) {
		fprintf(stderr, "usage: engine_trace IMAGE --vram-cap SIZE [...]\n");
		return 2;
	}
	arena_backend *be;
	arena_stream *cs;
	arena_image *img;
	arena_pin_budget budget;
	if (arena_backend_cuda_create(0, &be) || be->ops->stream_create(be, &cs))
		return fail("cuda");
	arena_pin_budget_probe(&budget, 0, ARENA_PIN_RESERVE_AUTO, "");
	if (arena_img_open(path, &img))
		return fail("image");
	size_t n = img->layout->n_blocks;
	uint8_t *on = calloc(n, 1);
	uint64_t maxp = 0;
	for (size_t b = 0; b < n; b++) {
		on[b] = (uint8_t)arena_block_is_globals(img->layout, (uint32_t)b);
		if (!on[b] && img->layout->blocks[b].bytes / 2 > maxp)
			maxp = img->layout->blocks[b].bytes / 2;
	}
	arena_img_close(img);
	arena_gemm *g;
	arena_model *m;
	arena_slab_reader *rr;
	arena_engine *e;
	if (arena_gemm_create(be, cs, (uint32_t)tokens, maxp, &g))
		return fail("gemm");
	arena_load_opts lo = {.backend = be, .budget = &budget, .on_device = on, .io = ARENA_IO_AUTO};
	if (arena_load_image(path, &lo, &m, NULL) || arena_slab_reader_open(path, m->layout, &rr))
		return fail("load");
	o.reread = arena_slab_reader_read;
	o.reread_ctx = rr;
	if (arena_engine_create(m, &o, &e))
		return fail("engine");
	const arena_residency_plan *p = arena_engine_plan(e);
	const arena_layout *l = m->layout;
	size_t ns = p->n_sched;
	cudaEvent_t *es = calloc(ns + 1, sizeof(*es)), *ee = calloc(ns + 1, sizeof(*ee));
	for (size_t i = 0; i <= ns; i++) {
		cudaEventCreate(&es[i]);
		cudaEventCreate(&ee[i]);
	}
	cudaStream_t c = (cudaStream_t)cs;
	uint32_t globals = UINT32_MAX;
	for (uint32_t b = 0; b < n; b++)
		if (arena_block_is_globals(l, b) && l->blocks[b].bytes)
			globals = b;
	void *d;
	for (int st = 0; st < steps; st++) {
		if (arena_engine_step_begin(e))
			return fail("step_begin");
		cudaEventRecord(es[ns], c);
		if (globals != UINT32_MAX && arena_engine_acquire(e, globals, cs, &d))
			return fail("acquire");
		for (size_t i = 0; i < ns; i++) {
			uint32_t b = p->sched[i];
			int bwd = o.mode == ARENA_MODE_TRAIN && i >= ns / 2;
			if (arena_engine_acquire(e, b, cs, &d))
				return fail("acquire");
			cudaEventRecord(es[i], c);
			for (int k = 0; k < (bwd ? 3 : 1); k++)
				if (arena_gemm_run(g, cs, d, l->blocks[b].bytes / 2))
					return fail("gemm");
			cudaEventRecord(ee[i], c);
			if (arena_engine_release(e, b, cs))
				return fail("release");
		}
		if (globals != UINT32_MAX && arena_engine_release(e, globals, cs))
			return fail("release");
		if (arena_engine_step_end(e))
			return fail("step_end");
		cudaStreamSynchronize(c);
	}
	/* The last step: start, end, gap before each entry. */
	float busy = 0, gap_streamed = 0, gap_resident = 0, prev = 0, total = 0;
	printf("{\"path\": \"%s\", \"mode\": \"%s\", \"tokens\": %d, \"entries\": [\n", path,
	       o.mode == ARENA_MODE_TRAIN ? "train" : "sample", tokens);
	for (size_t i = 0; i < ns; i++) {
		float s0, s1;
		cudaEventElapsedTime(&s0, es[ns], es[i]);
		cudaEventElapsedTime(&s1, es[ns], ee[i]);
		uint32_t b = p->sched[i];
		int res = arena_engine_is_resident(e, b);
		float gap = s0 - prev;
		busy += s1 - s0;
		if (res)
			gap_resident += gap;
		else
			gap_streamed += gap;
		printf("  {\"i\": %zu, \"block\": \"%s\", \"resident\": %d, \"mib\": %.1f, \"start_ms\": %.3f, "
		       "\"end_ms\": %.3f, \"gap_ms\": %.3f}%s\n",
		       i, l->blocks[b].name, res, (double)l->blocks[b].bytes / 1048576.0, s0, s1, gap,
		       i + 1 < ns ? "," : "");
		prev = s1;
		total = s1;
	}
	printf("], \"step_ms\": %.3f, \"compute_busy_ms\": %.3f, \"gap_before_streamed_ms\": %.3f, "
	       "\"gap_before_resident_ms\": %.3f, \"streamed_bytes\": %llu}\n",
	       total, busy, gap_streamed, gap_resident, (unsigned long long)p->stream_bytes_per_step);
	arena_engine_free(e);
	arena_gemm_free(g);
	arena_slab_reader_close(rr);
	arena_model_free(m);
	be->ops->stream_destroy(be, cs);
	arena_backend_destroy(be);
	free(on);
	return 0;
}
