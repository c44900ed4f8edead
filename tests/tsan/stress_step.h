/* stress_step.h - one step of the TSan stress programs: every block
 * acquired (train: and again in reverse, as a checkpointed backward does)
 * on `a` and on `ref` (the same image opened all resident), their bytes
 * compared (sim: device memory is host memory), released; both steps
 * ended. 0, or 1 with what differed or failed on stderr, after `who`. */
#ifndef ARENA_TESTS_TSAN_STRESS_STEP_H
#define ARENA_TESTS_TSAN_STRESS_STEP_H

#include <stdio.h>
#include <string.h>

#include "arena.h"

static int stress_step(const char *who, arena *a, arena *ref, int train, int s)
{
	const size_t n = arena_block_count(a);
	int rc = arena_step_begin(a);
	if (!rc)
		rc = arena_step_begin(ref);
	for (size_t k = 0; !rc && k < (train ? 2 * n : n); k++) {
		const size_t i = k < n ? k : 2 * n - 1 - k;
		void *d, *r;
		if ((rc = arena_block_acquire(a, i, NULL, &d)) || (rc = arena_block_acquire(ref, i, NULL, &r)))
			break;
		if (memcmp(d, r, arena_block_bytes(a, i))) {
			fprintf(stderr, "%s: step %d: block %zu differs\n", who, s, i);
			return 1;
		}
		if ((rc = arena_block_release(ref, i, NULL)) || (rc = arena_block_release(a, i, NULL)))
			break;
	}
	if (!rc)
		rc = arena_step_end(a);
	if (!rc)
		rc = arena_step_end(ref);
	if (rc) {
		fprintf(stderr, "%s: step %d: %s\n", who, s, arena_last_error());
		return 1;
	}
	return 0;
}

#endif
