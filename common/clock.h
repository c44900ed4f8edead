/* clock.h - the monotonic clock in seconds, for timing and timeouts. */
#ifndef ARENA_CLOCK_H
#define ARENA_CLOCK_H

#include <errno.h>
#include <stdint.h>
#include <time.h>

static inline double arena_now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* The latest deadline a wait takes: 2^31 - 1 s of the monotonic clock (it
 * counts from boot: 68 years), within every time_t. */
#define ARENA_TIME_MAX_S ((time_t)INT32_MAX)

/* The timespec of monotonic time `t` seconds, a wait's absolute deadline,
 * saturated: {0, 0} for t not above 0 (NaN too), ARENA_TIME_MAX_S for t at
 * or past it (infinity too). Converting a double past time_t's range is
 * undefined behaviour; on x86-64 it gave a negative tv_sec, a deadline in the
 * past, so a wait meant to last 5e304 s returned at once, again and again. */
static inline struct timespec arena_timespec_at(double t)
{
	struct timespec ts = {0, 0};
	if (!(t > 0))
		return ts;
	if (t >= (double)ARENA_TIME_MAX_S) {
		ts.tv_sec = ARENA_TIME_MAX_S;
		return ts;
	}
	ts.tv_sec = (time_t)t;
	ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
	if (ts.tv_nsec > 999999999L)
		ts.tv_nsec = 999999999L;
	return ts;
}

/* Sleep `seconds` (to an absolute deadline, so a signal does not shorten it). */
static inline void arena_sleep_s(double seconds)
{
	if (!(seconds > 0))
		return;
	struct timespec t = arena_timespec_at(arena_now_s() + seconds);
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &t, NULL) == EINTR)
		;
}

#endif
