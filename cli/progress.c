/* progress.c - one progress line on a terminal for long commands (cli.h). */
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

#include "../common/clock.h"
#include "cli.h"

#define PROGRESS_EVERY_S 0.1

void cli_progress_start(cli_progress *p, const char *label, int quiet)
{
	*p = (cli_progress){.label = label, .on = !quiet && isatty(STDERR_FILENO), .start = arena_now_s()};
	pthread_mutex_init(&p->mu, NULL);
}

static void fmt_rate(double r, char *buf, size_t len)
{
	if (r >= 1e9)
		snprintf(buf, len, "%.2f GB/s", r / 1e9);
	else
		snprintf(buf, len, "%.1f MB/s", r / 1e6);
}

/* The line for done of total bytes (p->mu held). */
static void draw(cli_progress *p, uint64_t done, uint64_t total, double now)
{
	double el = now - p->start, rate = el > 0 ? (double)done / el : 0;
	char a[32], b[32], r[32], left[48] = "";
	fmt_rate(rate, r, sizeof(r));
	if (done < total && rate > 0) {
		long s = (long)((double)(total - done) / rate + 0.5);
		if (s >= 60)
			snprintf(left, sizeof(left), ", %ld min %02ld s left", s / 60, s % 60);
		else
			snprintf(left, sizeof(left), ", %ld s left", s);
	}
	fprintf(stderr, "\r%s: %s / %s (%.0f%%), %s%s\033[K", p->label, cli_fmt_bytes(done, a, sizeof(a)),
		cli_fmt_bytes(total, b, sizeof(b)), total ? 100.0 * (double)done / (double)total : 100.0, r, left);
	fflush(stderr);
	p->shown = 1;
	p->last = now;
}

void cli_progress_update(void *ctx, uint64_t done, uint64_t total)
{
	cli_progress *p = ctx;
	if (!p || !p->on)
		return;
	double now = arena_now_s();
	pthread_mutex_lock(&p->mu);
	if (done > total)
		done = total;
	/* the last state always, others at most every 0.1 s and never backwards
	 * (threads report out of order) */
	if ((done == total && !p->final) || (done > p->done && now - p->last >= PROGRESS_EVERY_S)) {
		p->final = done == total;
		p->done = done;
		draw(p, done, total, now);
	}
	pthread_mutex_unlock(&p->mu);
}

void cli_progress_end(cli_progress *p)
{
	pthread_mutex_lock(&p->mu);
	if (p->shown)
		fputc('\n', stderr);
	p->shown = 0;
	pthread_mutex_unlock(&p->mu);
	pthread_mutex_destroy(&p->mu);
}
