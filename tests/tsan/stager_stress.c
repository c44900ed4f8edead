/* stager_stress.c - the disk tier's stager (engine/stager.h) under
 * ThreadSanitizer: random lists, replaced at random points, parts taken,
 * copied on the sim backend's workers and put back, some reads failing,
 * for a few thousand rounds; every part taken holds its bytes, every
 * device copy lands whole. Built and run by `make test-tsan` (criterion's
 * runner does not work under TSan, so this is a program of its own).
 * Exit status: 0, or 1 with a line saying what differed. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "../../device/backend.h"
#include "../../engine/stager.h"
#include "../../common/err.h"
#include "../../formats/layout.h"

enum { PART = 4096, NB = 8, ROUNDS = 3000 };

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned long reads;
static uint32_t rng = 12345;

static uint8_t pattern(uint32_t b, uint64_t at)
{
	return (uint8_t)(b * 31 + at * 7 + (at >> 8));
}

static int src_part(void *ctx, uint32_t b, uint64_t off, uint64_t len, uint8_t *dst)
{
	(void)ctx;
	pthread_mutex_lock(&mu);
	unsigned long k = ++reads;
	pthread_mutex_unlock(&mu);
	if (k % 97 == 0)
		return arena_errorf(ARENA_E_IO, "injected: block %u at %llu", b, (unsigned long long)off);
	for (uint64_t i = 0; i < len; i++)
		dst[i] = pattern(b, off + i);
	return 0;
}

static int src_whole(void *ctx, uint32_t b, uint8_t *dst, uint64_t bytes)
{
	return src_part(ctx, b, 0, bytes, dst);
}

static unsigned rnd(unsigned n)
{
	rng ^= rng << 13, rng ^= rng >> 17, rng ^= rng << 5;
	return rng % n;
}

int main(void)
{
	static arena_block blocks[NB];
	static char names[NB][4];
	for (int b = 0; b < NB; b++) {
		snprintf(names[b], sizeof(names[b]), "b%d", b);
		blocks[b] = (arena_block){.name = names[b], .offset = (uint64_t)b * 2 * PART, .bytes = 2 * PART};
	}
	arena_layout l = {.n_blocks = NB, .blocks = blocks};
	arena_sim_opts so = {.capacity = 16 << 20, .h2d_bytes_per_s = 2e9};
	arena_backend *be;
	arena_stream *cs;
	if (arena_backend_sim_create(&so, &be) || be->ops->stream_create(be, &cs)) {
		fprintf(stderr, "stager_stress: %s\n", arena_last_error());
		return 1;
	}
	void *dev;
	if (be->ops->dev_alloc(be, 64 * PART, &dev))
		return 1;
	uint8_t *got = malloc(PART);
	unsigned long taken = 0, failed = 0;
	for (int threaded = 1; threaded >= 0; threaded--) {
		arena_stager_src src = {.whole = src_whole, .part = src_part, .l = &l};
		arena_stager *s;
		if (arena_stager_create(be, NULL, &src, PART, 1 + (unsigned)threaded * 3, threaded, &s)) {
			fprintf(stderr, "stager_stress: %s\n", arena_last_error());
			return 1;
		}
		for (int r = 0; r < (threaded ? ROUNDS : ROUNDS / 10); r++) {
			arena_stage_part want[12];
			unsigned n = 1 + rnd(12);
			for (unsigned i = 0; i < n; i++)
				want[i] = (arena_stage_part){rnd(NB), rnd(2) * (uint64_t)PART, PART, 0, 0, 0};
			if (arena_stager_want(s, want, n))
				return 1;
			unsigned k = rnd(n + 1);
			for (unsigned i = 0; i < k; i++) {
				unsigned slot;
				uint8_t *buf;
				struct arena_wire *w;
				int rc = arena_stager_take(s, &slot, &buf, &w);
				if (rc) {
					if (rc != ARENA_E_IO || !strstr(arena_last_error(), "injected")) {
						fprintf(stderr, "stager_stress: take: %s\n", arena_last_error());
						return 1;
					}
					failed++;
					continue;
				}
				for (uint64_t j = 0; j < PART; j++)
					if (buf[j] != pattern(want[i].block, want[i].off + j)) {
						fprintf(stderr, "stager_stress: round %d part %u byte %llu differs\n", r, i,
							(unsigned long long)j);
						return 1;
					}
				uint8_t *d = (uint8_t *)dev + (uint64_t)(taken % 64) * PART;
				if (be->ops->copy_h2d(be, d, buf, PART, cs) ||
				    be->ops->event_record(be, arena_stager_event(s, slot), cs))
					return 1;
				arena_stager_put(s, slot);
				if (rnd(8) == 0) { /* now and then: the copy landed whole */
					if (be->ops->stream_sync(be, cs) || be->ops->copy_d2h_sync(be, got, d, PART))
						return 1;
					for (uint64_t j = 0; j < PART; j++)
						if (got[j] != pattern(want[i].block, want[i].off + j)) {
							fprintf(stderr, "stager_stress: round %d: device copy of part %u differs at %llu\n",
								r, i, (unsigned long long)j);
							return 1;
						}
				}
				taken++;
			}
		}
		arena_stager_free(s);
	}
	be->ops->stream_sync(be, cs);
	be->ops->dev_free(be, dev);
	be->ops->stream_destroy(be, cs);
	arena_backend_destroy(be);
	free(got);
	printf("stager_stress: ok, %lu parts taken, %lu failed reads seen, %lu reads\n", taken, failed, reads);
	return 0;
}
