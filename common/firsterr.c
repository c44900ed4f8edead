/* firsterr.c - the first error among worker threads (see firsterr.h). */
#include "firsterr.h"

#include <stdio.h>

#include "err.h"

void arena_first_error_init(arena_first_error *e)
{
	atomic_init(&e->rc, 0);
	pthread_mutex_init(&e->lock, NULL);
	e->msg[0] = '\0';
}

void arena_first_error_destroy(arena_first_error *e)
{
	pthread_mutex_destroy(&e->lock);
}

void arena_first_error_set(arena_first_error *e, int rc)
{
	pthread_mutex_lock(&e->lock);
	int zero = 0;
	if (atomic_compare_exchange_strong(&e->rc, &zero, rc)) {
		const char *m = arena_last_error();
		snprintf(e->msg, sizeof(e->msg), "%s", *m ? m : arena_strerror(rc));
	}
	pthread_mutex_unlock(&e->lock);
}

int arena_first_error_raise(arena_first_error *e)
{
	int rc = atomic_load(&e->rc);
	if (rc)
		arena_errorf(rc, "%s", e->msg);
	return rc;
}
