/* clock.h - the monotonic clock in seconds, for timing and timeouts. */
#ifndef ARENA_CLOCK_H
#define ARENA_CLOCK_H

#include <errno.h>
#include <time.h>

static inline double arena_now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Sleep `seconds` (to an absolute deadline, so a signal does not shorten it). */
static inline void arena_sleep_s(double seconds)
{
	if (!(seconds > 0))
		return;
	double until = arena_now_s() + seconds;
	struct timespec t;
	t.tv_sec = (time_t)until;
	t.tv_nsec = (long)((until - (double)t.tv_sec) * 1e9);
	if (t.tv_nsec > 999999999L)
		t.tv_nsec = 999999999L;
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &t, NULL) == EINTR)
		;
}

#endif
