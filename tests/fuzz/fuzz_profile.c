/* fuzz_profile.c - libFuzzer target for the compute profile reader
 * (engine/profile.h): any bytes, read against a four-block layout (globals,
 * blocks.0..2). A profile that reads must hold what the reader promises:
 * finite costs >= 0 for every block, a rate > 0, a backward factor >= 0. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../../engine/profile.h"
#include "../../common/alloc.h"

static arena_layout *layout(void)
{
	static arena_layout *l;
	if (l)
		return l;
	if (arena_layout_create(4, 0, &l))
		abort();
	const char *names[4] = {"globals", "blocks.0", "blocks.1", "blocks.2"};
	for (size_t b = 0; b < 4; b++) {
		l->blocks[b].name = arena_strdup(names[b]);
		l->blocks[b].bytes = 4096 * (b + 1);
		if (b) {
			l->blocks[b].container = arena_strdup("blocks");
			l->blocks[b].index = (int64_t)b - 1;
		}
	}
	return l;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	arena_layout *l = layout();
	int fd = memfd_create("fuzz-profile", MFD_CLOEXEC);
	if (fd < 0)
		return 0;
	if (write(fd, data, size) != (ssize_t)size) {
		close(fd);
		return 0;
	}
	char path[64];
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	double cost[4], h2d = 0, bwd = 0;
	if (arena_profile_read(path, l, cost, &h2d, &bwd) == 0) {
		if (!(h2d > 0) || !isfinite(h2d) || !(bwd >= 0) || !isfinite(bwd))
			abort();
		for (size_t b = 0; b < 4; b++)
			if (!(cost[b] >= 0) || !isfinite(cost[b]) || (b == 0 && cost[b] != 0))
				abort();
	}
	close(fd);
	return 0;
}
