/* look_stress.c - looks at the learned profile under ThreadSanitizer: an
 * image opened on the sim backend with learning on, under a cap that
 * streams blocks, so that the engine times them and looks at what it
 * learned (from the third step on) at the ends of steps 3, 5, 10, 20:
 * each look is planned on a thread of its own beside the caller's steps
 * (and the sim's workers) and taken at the next step end; the mode changes while a look may be running (the
 * look is dropped) and the arena is closed while one may be (it is waited
 * for). Every acquired block's bytes equal those of the same image opened
 * all resident. Built and run by `make test-tsan`.
 * usage: look_stress IMAGE...    Exit status: 0, or 1 with what differed. */
#include <stdio.h>
#include <string.h>

#include "arena.h"
#include "stress_step.h"

int main(int argc, char **argv)
{
	unsigned long steps = 0, moved = 0;
	for (int f = 1; f < argc; f++) {
		arena_open_options ro = {.backend = "sim"};
		arena *ref;
		if (arena_open(argv[f], &ro, &ref)) {
			fprintf(stderr, "look_stress: %s\n", arena_last_error());
			return 1;
		}
		for (int round = 0; round < 3; round++) {
			arena_open_options o = {.backend = "sim",
						/* some blocks stream (hb4: beside ARENA_WIRE_POOL=16K of stages) */
						.sim_capacity = (290 << 10) + (strstr(argv[f], "hb4") ? 16 << 10 : 0),
						.sim_bandwidth = 2e9,
						.headroom = ARENA_ZERO_BYTES,
						.reserve = ARENA_ZERO_BYTES,
						.keep_last = ARENA_ZERO_COUNT};
			arena *a;
			if (arena_open(argv[f], &o, &a)) {
				fprintf(stderr, "look_stress: %s\n", arena_last_error());
				return 1;
			}
			int train = 0;
			/* round 0 runs 20 sample steps; round 1 changes the mode at
			 * steps 4, 6 and 11 (a look started at 3, 5 or 10 is dropped);
			 * round 2 closes the arena after step 5 (a look may be running) */
			const int n = round == 2 ? 6 : 20;
			for (int s = 0; s < n; s++, steps++) {
				if (round == 1 && (s == 4 || s == 6 || s == 11)) {
					train = !train;
					if (arena_set_mode(a, train ? ARENA_MODE_TRAIN : ARENA_MODE_SAMPLE)) {
						fprintf(stderr, "look_stress: %s\n", arena_last_error());
						return 1;
					}
				}
				if (stress_step("look_stress", a, ref, train, s))
					return 1;
				arena_step_info si;
				if (arena_step_get(a, (uint64_t)s, &si)) {
					fprintf(stderr, "look_stress: step %d: no record: %s\n", s, arena_last_error());
					return 1;
				}
				moved += si.profile_learned;
			}
			arena_close(a);
		}
		arena_close(ref);
	}
	printf("look_stress: ok, %lu steps over %d images (%lu moved by a look)\n", steps, argc - 1, moved);
	return 0;
}
