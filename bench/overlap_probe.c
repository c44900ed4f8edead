/* overlap_probe.c - does a host-to-device copy slow down while a GEMM runs
 * beside it, or the GEMM while copies run? The residency engine's bound
 * assumes neither: max(compute, bytes / copy rate). Measured with CUDA's
 * timing events on two streams of arena's cuda backend:
 *   copy alone, GEMM alone (bench stream's bf16 GEMM, T rows, per Flux block
 *   size), then both at once with no dependency between them.
 * Prints one JSON object on stdout.
 *
 *   overlap_probe [--tokens T] [--reps N]
 *
 * Sizes: a Flux double block (339.8 M parameters, 679.6 MB) and a single
 * block (141.6 M, 283.2 MB). The limit is each alone, in the same run: both
 * at once should take the longer of the two. Build: `make bench` (needs
 * CUDA): build/bench/overlap_probe. Exit status: 0, 2 for usage, or the
 * class of an arena error (3 for no CUDA device) with a one-line message
 * on stderr.
 */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "arena.h"
#include "../device/backend.h"
#include "../device/gemm.h"

#define NSIZES 2
static const uint64_t PARAMS[NSIZES] = {339804160ull, 141557760ull};
static const char *NAMES[NSIZES] = {"double", "single"};

static int fail(const char *what)
{
	fprintf(stderr, "error: %s: %s\n", what, arena_last_error());
	return 3;
}

static float ms(cudaEvent_t a, cudaEvent_t b)
{
	float t = 0;
	cudaEventSynchronize(b);
	cudaEventElapsedTime(&t, a, b);
	return t;
}

int main(int argc, char **argv)
{
	int tokens = 4608, reps = 12;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--tokens") && i + 1 < argc)
			tokens = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
			reps = atoi(argv[++i]);
		else {
			fprintf(stderr, "usage: overlap_probe [--tokens T] [--reps N]\n");
			return 2;
		}
	}
	if (tokens < 1 || reps < 2 || reps > 1000) {
		fprintf(stderr, "usage: overlap_probe [--tokens T >= 1] [--reps 2..1000]\n");
		return 2;
	}
	arena_backend *be;
	arena_stream *cs, *xs;
	if (arena_backend_cuda_create(0, &be))
		return fail("cuda");
	if (be->ops->stream_create(be, &cs) || be->ops->stream_create(be, &xs))
		return fail("stream");
	uint64_t big = PARAMS[0] * 2;
	uint8_t *host = mmap(NULL, 2 * big, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (host == MAP_FAILED) {
		fprintf(stderr, "error: cannot map host memory\n");
		return 3;
	}
	memset(host, 0x3c, 2 * big);
	void *slot[2], *w;
	if (be->ops->host_register(be, host, 2 * big) || be->ops->dev_alloc(be, big, &slot[0]) ||
	    be->ops->dev_alloc(be, big, &slot[1]) || be->ops->dev_alloc(be, big, &w))
		return fail("memory");
	cudaMemset(w, 0x3c, big); /* bf16 ~0.011: finite products */
	arena_gemm *g;
	if (arena_gemm_create(be, cs, (uint32_t)tokens, PARAMS[0], &g))
		return fail("gemm");
	cudaStream_t c = (cudaStream_t)cs, x = (cudaStream_t)xs;
	cudaEvent_t e[6];
	for (int i = 0; i < 6; i++)
		cudaEventCreate(&e[i]);
	printf("{\"tokens\": %d, \"reps\": %d, \"sizes\": [", tokens, reps);
	for (int k = 0; k < NSIZES; k++) {
		uint64_t p = PARAMS[k], bytes = p * 2;
		/* alone: copies, then GEMMs (one warm-up each) */
		be->ops->copy_h2d(be, slot[0], host, bytes, xs);
		arena_gemm_run(g, cs, w, p);
		cudaDeviceSynchronize();
		cudaEventRecord(e[0], x);
		for (int r = 0; r < reps; r++)
			be->ops->copy_h2d(be, slot[r & 1], host + (r & 1) * big, bytes, xs);
		cudaEventRecord(e[1], x);
		float copy_ms = ms(e[0], e[1]);
		cudaEventRecord(e[0], c);
		for (int r = 0; r < reps; r++)
			arena_gemm_run(g, cs, w, p);
		cudaEventRecord(e[1], c);
		float gemm_ms = ms(e[0], e[1]);
		/* together: the same work on both streams, started at once; the
		 * GEMMs repeated so they last longer than the copies */
		int greps = (int)(reps * (copy_ms / gemm_ms) * 1.5) + 1;
		cudaDeviceSynchronize();
		cudaEventRecord(e[0], c);
		cudaStreamWaitEvent(x, e[0], 0);
		cudaEventRecord(e[2], x);
		for (int r = 0; r < reps; r++)
			be->ops->copy_h2d(be, slot[r & 1], host + (r & 1) * big, bytes, xs);
		cudaEventRecord(e[3], x);
		for (int r = 0; r < greps; r++)
			arena_gemm_run(g, cs, w, p);
		cudaEventRecord(e[1], c);
		float both_copy_ms = ms(e[2], e[3]), both_gemm_ms = ms(e[0], e[1]);
		double copy_gbs = (double)bytes * reps / (copy_ms * 1e-3) / 1e9;
		double both_copy_gbs = (double)bytes * reps / (both_copy_ms * 1e-3) / 1e9;
		double gemm_run = gemm_ms / reps, both_gemm_run = both_gemm_ms / greps;
		printf("%s{\"block\": \"%s\", \"params\": %llu, \"copy_alone_gbs\": %.2f, \"copy_with_gemm_gbs\": %.2f, "
		       "\"gemm_alone_ms\": %.3f, \"gemm_with_copy_ms\": %.3f, \"gemm_alone_tflops\": %.1f, "
		       "\"copy_ms_per_block\": %.3f}",
		       k ? ", " : "", NAMES[k], (unsigned long long)p, copy_gbs, both_copy_gbs, gemm_run, both_gemm_run,
		       2.0 * tokens * (double)p / (gemm_run * 1e-3) / 1e12, copy_ms / reps);
	}
	printf("]}\n");
	arena_gemm_free(g);
	be->ops->dev_free(be, w);
	be->ops->dev_free(be, slot[0]);
	be->ops->dev_free(be, slot[1]);
	be->ops->host_unregister(be, host);
	munmap(host, 2 * big);
	be->ops->stream_destroy(be, cs);
	be->ops->stream_destroy(be, xs);
	arena_backend_destroy(be);
	return 0;
}
