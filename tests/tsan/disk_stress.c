/* disk_stress.c - the disk tier end to end under ThreadSanitizer: an image
 * opened on the sim backend with a host budget of the disk tier's least
 * staging and one block, all resident at first; device pressure comes at
 * step 6 (blocks leave the device: one gets a host copy, read on the
 * caller's thread beside the stager, the
 * others are read from the image when streamed: the stager's thread,
 * the slab reader's threads, the sim's workers) and goes at step 14
 * (promotions copy them back); sample and train, plain and hb4 images;
 * every acquired block's bytes equal those of the same image opened all
 * resident. Built and run by `make test-tsan`.
 * usage: disk_stress IMAGE...    Exit status: 0, or 1 with what differed. */
#include <stdio.h>
#include <string.h>

#include "arena.h"
#include "stress_step.h"

int main(int argc, char **argv)
{
	unsigned long steps = 0, promoted = 0;
	for (int f = 1; f < argc; f++) {
		arena_open_options ro = {.backend = "sim"};
		arena *ref;
		if (arena_open(argv[f], &ro, &ref)) {
			fprintf(stderr, "disk_stress: %s\n", arena_last_error());
			return 1;
		}
		for (int train = 0; train < 2; train++) {
			/* all resident at first on a device with 40 KiB of headroom; then
			 * pressure pushes blocks off it, and with no host budget they
			 * are read from the image when streamed (hb4: coded, through
			 * the device stages) */
			const uint64_t cap = (train ? 380 << 10 : 340 << 10) + (strstr(argv[f], "hb4") ? 16 << 10 : 0);
			arena_open_options o = {.backend = "sim",
						.sim_capacity = cap,
						.headroom = 40 << 10,
						.reserve = ARENA_ZERO_BYTES,
						.depth = 1,
						.host_budget = ARENA_ZERO_BYTES, /* the least: the disk tier's staging */
						.mode = train ? ARENA_MODE_TRAIN : ARENA_MODE_SAMPLE,
						.flags = ARENA_OPEN_NO_LEARN};
			arena *a;
			arena_plan_info p;
			if (arena_open(argv[f], &o, &a) || arena_plan_get(a, &p)) {
				fprintf(stderr, "disk_stress: %s\n", arena_last_error());
				return 1;
			}
			arena_close(a);
			o.host_budget = p.staging_bytes + (80 << 10); /* and one block's host copy (read beside the stager) */
			if (arena_open(argv[f], &o, &a)) {
				fprintf(stderr, "disk_stress: %s\n", arena_last_error());
				return 1;
			}
			uint64_t disk = 0, dem = 0, pro = 0;
			for (int s = 0; s < 24; s++, steps++) {
				arena_step_info si;
				if ((s == 6 && arena_sim_pressure(a, train ? 60 << 10 : 30 << 10)) || /* blocks leave the device */
				    (s == 14 && arena_sim_pressure(a, 0))) {        /* and come back */
					fprintf(stderr, "disk_stress: %s\n", arena_last_error());
					return 1;
				}
				if (stress_step("disk_stress", a, ref, train, s))
					return 1;
				if (arena_step_get(a, (uint64_t)s, &si)) {
					fprintf(stderr, "disk_stress: step %d: no record: %s\n", s, arena_last_error());
					return 1;
				}
				disk += si.disk_bytes, dem += si.demotions, pro += si.promotions;
				promoted += si.promotions;
			}
			if (!disk || !dem) {
				fprintf(stderr, "disk_stress: %s: %llu bytes from the image, %llu demotions, %llu promotions: "
					"the run did not do what it is for\n", argv[f], (unsigned long long)disk,
					(unsigned long long)dem, (unsigned long long)pro);
				return 1;
			}
			arena_close(a);
		}
		arena_close(ref);
	}
	printf("disk_stress: ok, %lu steps over %d images (%lu promotions)\n", steps, argc - 1, promoted);
	return 0;
}
