/* firsterr.h - the first error among worker threads.
 *
 * Workers record failures with arena_first_error_set (only the first one is
 * kept, with the message it set on its own thread); they poll
 * arena_first_error_get to stop early; the thread that joined them calls
 * arena_first_error_raise to make that error its own (code and message). */
#ifndef ARENA_COMMON_FIRSTERR_H
#define ARENA_COMMON_FIRSTERR_H

#include <pthread.h>
#include <stdatomic.h>

typedef struct arena_first_error {
	atomic_int rc;
	pthread_mutex_t lock;
	char msg[1024];
} arena_first_error;

void arena_first_error_init(arena_first_error *e);
void arena_first_error_destroy(arena_first_error *e);
/* Keep rc and this thread's arena_last_error() unless an error is kept already. */
void arena_first_error_set(arena_first_error *e, int rc);
/* The kept code, 0 if none (cheap: for polling). */
static inline int arena_first_error_get(arena_first_error *e)
{
	return atomic_load_explicit(&e->rc, memory_order_relaxed);
}
/* Make the kept error this thread's last error; returns its code (0 if none). */
int arena_first_error_raise(arena_first_error *e);

#endif
