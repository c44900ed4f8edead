/* clock.h - the monotonic clock in seconds, for timing and timeouts. */
#ifndef ARENA_CLOCK_H
#define ARENA_CLOCK_H

#include <time.h>

static inline double arena_now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

#endif
