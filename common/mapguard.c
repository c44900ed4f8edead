/* mapguard.c - a SIGBUS from a guarded mapping's pages returns from the
 * guard as INPUT_CHANGED (mapguard.h). */
#include "mapguard.h"

#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>

#include "err.h"

typedef struct guard {
	sigjmp_buf jb;
	const arena_map_region *r; /* the guarded regions */
	size_t n;
	volatile size_t hit;       /* the region that faulted */
	struct guard *outer;       /* the guard this one runs inside, or NULL */
} guard;

static _Thread_local guard *volatile top; /* this thread's innermost guard */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct sigaction before;           /* the action ours replaced */
static atomic_int passed;                 /* a SIGBUS went on to `before` */

static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
	(void)uc;
	if (si && si->si_code > 0) { /* raised by a fault (kill and tgkill give codes <= 0) */
		const uintptr_t a = (uintptr_t)si->si_addr;
		for (guard *g = top; g; g = g->outer)
			for (size_t i = 0; i < g->n; i++)
				if (a >= (uintptr_t)g->r[i].base && a - (uintptr_t)g->r[i].base < g->r[i].len) {
					g->hit = i;
					siglongjmp(g->jb, 1);
				}
	}
	/* Not a guarded read: on to the action there before, once (should that
	 * action put this handler back, the next one is the default's). */
	struct sigaction to = before;
	if (atomic_exchange(&passed, 1) ||
	    (!(to.sa_flags & SA_SIGINFO) && (to.sa_handler == SIG_IGN || to.sa_handler == SIG_DFL))) {
		memset(&to, 0, sizeof(to));
		to.sa_handler = SIG_DFL; /* an ignored fault would run again forever */
		sigemptyset(&to.sa_mask);
	}
	sigaction(SIGBUS, &to, NULL);
	if (!si || si->si_code <= 0)
		raise(sig); /* sent: again, to that action (SIGBUS is blocked until this returns) */
	/* A fault: returning runs the faulting instruction again, into that action. */
}

static int is_ours(const struct sigaction *a)
{
	return (a->sa_flags & SA_SIGINFO) && a->sa_sigaction == on_sigbus;
}

/* The handler is the process's SIGBUS action (again, if another was set
 * since: that one is where other faults go). 0, or -1 with errno. */
static int ensure_handler(void)
{
	struct sigaction cur;
	if (sigaction(SIGBUS, NULL, &cur))
		return -1;
	if (is_ours(&cur))
		return 0;
	pthread_mutex_lock(&mu);
	int rc = sigaction(SIGBUS, NULL, &cur);
	if (!rc && !is_ours(&cur)) {
		struct sigaction ours;
		memset(&ours, 0, sizeof(ours));
		ours.sa_sigaction = on_sigbus;
		ours.sa_flags = SA_SIGINFO;
		sigemptyset(&ours.sa_mask);
		before = cur;
		atomic_store(&passed, 0);
		rc = sigaction(SIGBUS, &ours, NULL);
	}
	pthread_mutex_unlock(&mu);
	return rc;
}

int arena_map_guard_run(const arena_map_region *r, size_t n, int (*fn)(void *ctx), void *ctx)
{
	if (ensure_handler())
		return arena_syserrorf(ARENA_E_IO, errno, "%s: cannot install the handler that guards reads of its mapping",
				       n ? r[0].label : "?");
	guard g;
	g.r = r;
	g.n = n;
	g.hit = 0;
	g.outer = top;
	if (sigsetjmp(g.jb, 1)) { /* the mask as it was: SIGBUS unblocked again */
		top = g.outer;
		return arena_errorf(ARENA_E(INPUT_CHANGED),
				    "%s: file changed while reading: it is shorter than when it was opened; read it again once it is whole",
				    r[g.hit].label);
	}
	top = &g;
	int rc = fn(ctx);
	top = g.outer;
	return rc;
}
