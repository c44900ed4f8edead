/* test_stager.c - the disk tier's reads ahead of use (engine/stager.h), on
 * the sim backend with a source that writes a known pattern per part and
 * counts its reads: parts are read ahead in the order the list gives, as
 * far as the slots allow; a new list keeps what the slots hold of it; the
 * head is read first even when every slot holds a later part; a failed
 * read is the error of the take that wants it and of no other; without a
 * thread a take reads; a slot is not read into again before the copies
 * from it are done; allocation failures at creation are NOMEM. */
#include <criterion/criterion.h>

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "arena.h"
#include "../../device/backend.h"
#include "../../engine/stager.h"
#include "../../common/alloc.h"
#include "../../common/clock.h"
#include "../../common/err.h"
#include "../../formats/layout.h"

enum { PART = 8192 };

typedef struct src_state {
	pthread_mutex_t mu;
	unsigned reads;
	arena_stage_part log[64];
	uint32_t fail_block; /* reads of this block fail while fail_on */
	int fail_on;
} src_state;

static src_state S;
static arena_block blocks[8];
static arena_layout L = {.n_blocks = 8, .blocks = blocks};
static char names[8][4] = {"b0", "b1", "b2", "b3", "b4", "b5", "b6", "b7"};

static uint8_t pattern(uint32_t b, uint64_t at)
{
	return (uint8_t)(b * 31 + at * 7 + (at >> 8));
}

static int src_part(void *ctx, uint32_t b, uint64_t off, uint64_t len, uint8_t *dst)
{
	src_state *s = ctx;
	pthread_mutex_lock(&s->mu);
	if (s->reads < 64)
		s->log[s->reads] = (arena_stage_part){b, off, len, 0, 0, 0};
	s->reads++;
	int fail = s->fail_on && b == s->fail_block;
	pthread_mutex_unlock(&s->mu);
	if (fail)
		return arena_errorf(ARENA_E_IO, "injected: block %u unreadable at %llu", b, (unsigned long long)off);
	for (uint64_t i = 0; i < len; i++)
		dst[i] = pattern(b, off + i);
	return 0;
}

static int src_whole(void *ctx, uint32_t b, uint8_t *dst, uint64_t bytes)
{
	return src_part(ctx, b, 0, bytes, dst);
}

static arena_backend *be;
static arena_stream *cs;

static void setup(void)
{
	memset(&S, 0, sizeof(S));
	pthread_mutex_init(&S.mu, NULL);
	for (int b = 0; b < 8; b++)
		blocks[b] = (arena_block){.name = names[b], .offset = (uint64_t)b * 2 * PART, .bytes = 2 * PART};
	arena_sim_opts o = {.capacity = 64 << 20, .h2d_bytes_per_s = 55e9};
	cr_assert_eq(arena_backend_sim_create(&o, &be), 0, "%s", arena_last_error());
	cr_assert_eq(be->ops->stream_create(be, &cs), 0);
}

static void teardown(void)
{
	be->ops->stream_destroy(be, cs);
	arena_backend_destroy(be);
	pthread_mutex_destroy(&S.mu);
}

TestSuite(stager, .init = setup, .fini = teardown);

static arena_stager *make(unsigned slots, int threaded)
{
	arena_stager_src src = {.whole = src_whole, .part = src_part, .ctx = &S, .l = &L};
	arena_stager *s;
	cr_assert_eq(arena_stager_create(be, NULL, &src, PART, slots, threaded, &s), 0, "%s", arena_last_error());
	return s;
}

static unsigned reads(void)
{
	pthread_mutex_lock(&S.mu);
	unsigned n = S.reads;
	pthread_mutex_unlock(&S.mu);
	return n;
}

/* Wait (a few seconds at most) until the source has done n reads. */
static void wait_reads(unsigned n)
{
	double t = arena_now_s();
	while (reads() < n && arena_now_s() - t < 10)
		arena_sleep_s(0.001);
	cr_assert_geq(reads(), n, "%u reads, waited for %u", reads(), n);
}

static arena_stage_part P(uint32_t b, unsigned k)
{
	return (arena_stage_part){b, (uint64_t)k * PART, PART, 0, 0, 0};
}

/* Take the list's next part, check its bytes are part p's, copy them to
 * dev (when not NULL) and put the slot back. */
static void take_check(arena_stager *s, arena_stage_part p, void *dev)
{
	unsigned k;
	uint8_t *buf;
	struct arena_wire *w;
	cr_assert_eq(arena_stager_take(s, &k, &buf, &w), 0, "%s", arena_last_error());
	cr_assert_not_null(buf);
	cr_assert_null(w);
	for (uint64_t i = 0; i < p.len; i++)
		cr_assert_eq(buf[i], pattern(p.block, p.off + i), "block %u byte %llu", p.block,
			     (unsigned long long)(p.off + i));
	if (dev)
		cr_assert_eq(be->ops->copy_h2d(be, dev, buf, p.len, cs), 0);
	cr_assert_eq(be->ops->event_record(be, arena_stager_event(s, k), cs), 0);
	arena_stager_put(s, k);
}

Test(stager, reads_ahead_in_the_order_of_the_list)
{
	arena_stager *s = make(4, 1);
	arena_stage_part want[6] = {P(2, 0), P(2, 1), P(5, 0), P(5, 1), P(1, 0), P(1, 1)};
	cr_assert_eq(arena_stager_want(s, want, 6), 0);
	wait_reads(4);
	arena_sleep_s(0.02);
	cr_assert_eq(reads(), 4, "read %u parts into 4 slots before any take", reads());
	for (int i = 0; i < 4; i++)
		cr_assert(S.log[i].block == want[i].block && S.log[i].off == want[i].off, "read %d out of order", i);
	for (int i = 0; i < 6; i++)
		take_check(s, want[i], NULL);
	cr_assert_eq(reads(), 6);
	arena_stager_stats st;
	arena_stager_stats_get(s, &st);
	cr_assert_eq(st.taken, 6);
	cr_assert_geq(st.ready, 4, "%llu parts were staged before their take", (unsigned long long)st.ready);
	cr_assert_eq(st.read_bytes, 6 * PART);
	arena_stager_free(s);
}

Test(stager, a_new_list_keeps_what_the_slots_hold)
{
	arena_stager *s = make(4, 1);
	arena_stage_part a[4] = {P(0, 0), P(0, 1), P(3, 0), P(3, 1)};
	cr_assert_eq(arena_stager_want(s, a, 4), 0);
	wait_reads(4);
	arena_stage_part b[3] = {P(3, 0), P(3, 1), P(6, 0)};
	cr_assert_eq(arena_stager_want(s, b, 3), 0);
	for (int i = 0; i < 3; i++)
		take_check(s, b[i], NULL);
	cr_assert_eq(reads(), 5, "block 3 read again: %u reads", reads());
	cr_assert(S.log[4].block == 6);
	arena_stager_stats st;
	arena_stager_stats_get(s, &st);
	cr_assert_eq(st.wasted, 2, "block 0's two parts dropped unused: %llu", (unsigned long long)st.wasted);
	arena_stager_free(s);
}

Test(stager, the_head_is_read_when_every_slot_holds_a_later_part, .timeout = 20)
{
	arena_stager *s = make(2, 1);
	arena_stage_part a[2] = {P(4, 0), P(4, 1)};
	cr_assert_eq(arena_stager_want(s, a, 2), 0);
	wait_reads(2);
	arena_stage_part b[3] = {P(1, 0), P(4, 0), P(4, 1)};
	cr_assert_eq(arena_stager_want(s, b, 3), 0);
	for (int i = 0; i < 3; i++)
		take_check(s, b[i], NULL); /* would wait for ever if the head had no slot */
	cr_assert_eq(reads(), 4, "%u reads: block 1, and block 4's second part again", reads());
	arena_stager_free(s);
}

Test(stager, a_failed_read_is_the_error_of_its_take_only)
{
	arena_stager *s = make(2, 1);
	S.fail_block = 7;
	S.fail_on = 1;
	arena_stage_part a[2] = {P(7, 0), P(2, 0)};
	cr_assert_eq(arena_stager_want(s, a, 2), 0);
	wait_reads(2);
	/* block 7 is no longer wanted: its failure is nobody's */
	arena_stage_part b[1] = {P(2, 0)};
	cr_assert_eq(arena_stager_want(s, b, 1), 0);
	take_check(s, b[0], NULL);
	/* wanted again, still failing: the take's error, with the source's message */
	arena_stage_part c[2] = {P(7, 1), P(2, 1)};
	cr_assert_eq(arena_stager_want(s, c, 2), 0);
	unsigned k;
	uint8_t *buf;
	struct arena_wire *w;
	int rc = arena_stager_take(s, &k, &buf, &w);
	cr_assert_eq(rc, ARENA_E_IO, "%s", arena_last_error());
	cr_assert(strstr(arena_last_error(), "injected: block 7 unreadable at 8192"), "%s", arena_last_error());
	cr_assert(strstr(arena_last_error(), "b7"), "names no block: %s", arena_last_error());
	take_check(s, c[1], NULL); /* the next part is still there */
	/* a failed read is tried again when a new list wants it */
	S.fail_on = 0;
	arena_stage_part d[1] = {P(7, 1)};
	cr_assert_eq(arena_stager_want(s, d, 1), 0);
	take_check(s, d[0], NULL);
	arena_stager_free(s);
}

Test(stager, without_a_thread_the_take_reads)
{
	arena_stager *s = make(2, 0);
	arena_stage_part a[5] = {P(0, 0), P(0, 1), P(6, 0), P(6, 1), P(3, 0)};
	cr_assert_eq(arena_stager_want(s, a, 5), 0);
	arena_sleep_s(0.02);
	cr_assert_eq(reads(), 0, "nothing is read before a take");
	for (int i = 0; i < 5; i++) {
		take_check(s, a[i], NULL);
		cr_assert_eq(reads(), (unsigned)i + 1);
	}
	unsigned k;
	uint8_t *buf;
	struct arena_wire *w;
	cr_assert_eq(arena_stager_take(s, &k, &buf, &w), ARENA_E_INTERNAL, "a take past the list");
	arena_stager_free(s);
}

/* Slow copies (1 MB/s: 8 ms a part) from two slots, eight parts: each
 * part's device bytes are its own, so no slot was read into while a copy
 * from it was still to run. */
Test(stager, a_slot_is_read_again_only_after_its_copies)
{
	be->ops->stream_destroy(be, cs);
	arena_backend_destroy(be);
	arena_sim_opts o = {.capacity = 64 << 20, .h2d_bytes_per_s = 1e6};
	cr_assert_eq(arena_backend_sim_create(&o, &be), 0, "%s", arena_last_error());
	cr_assert_eq(be->ops->stream_create(be, &cs), 0);
	arena_stager *s = make(2, 1);
	arena_stage_part a[8];
	void *dev[8];
	for (int i = 0; i < 8; i++) {
		a[i] = P((uint32_t)i, (unsigned)i % 2);
		cr_assert_eq(be->ops->dev_alloc(be, PART, &dev[i]), 0);
	}
	cr_assert_eq(arena_stager_want(s, a, 8), 0);
	for (int i = 0; i < 8; i++)
		take_check(s, a[i], dev[i]);
	cr_assert_eq(be->ops->stream_sync(be, cs), 0);
	uint8_t got[PART];
	for (int i = 0; i < 8; i++) {
		cr_assert_eq(be->ops->copy_d2h_sync(be, got, dev[i], PART), 0);
		for (uint64_t j = 0; j < PART; j++)
			cr_assert_eq(got[j], pattern(a[i].block, a[i].off + j), "part %d byte %llu", i, (unsigned long long)j);
		be->ops->dev_free(be, dev[i]);
	}
	arena_stager_free(s);
}

Test(stager, allocation_failures_at_creation)
{
	long n;
	for (n = 1; n < 1000; n++) {
		arena_stager_src src = {.whole = src_whole, .part = src_part, .ctx = &S, .l = &L};
		arena_stager *s = NULL;
		arena_fault_alloc(n);
		int rc = arena_stager_create(be, NULL, &src, PART, 3, 1, &s);
		int fired = arena_fault_alloc_fired();
		arena_fault_alloc(0);
		if (!fired) {
			cr_assert_eq(rc, 0, "%s", arena_last_error());
			arena_stager_free(s);
			break;
		}
		cr_assert_eq(rc, ARENA_E_NOMEM, "n=%ld: %s", n, arena_last_error());
		cr_assert_null(s);
	}
	cr_assert_gt(n, 3);
	arena_stager_src src = {.whole = src_whole, .ctx = &S, .l = &L};
	arena_stager *s = NULL;
	cr_assert_eq(arena_stager_create(be, NULL, &src, PART, 0, 1, &s), ARENA_E_USAGE);
	cr_assert_eq(arena_stager_create(be, NULL, &src, PART, ARENA_STAGER_MAX_SLOTS + 1, 1, &s), ARENA_E_USAGE);
}

/* A slow sim link (1 MB/s: a part's copy takes ~8 ms) for the tests below. */
static void slow_link(double bps)
{
	be->ops->stream_destroy(be, cs);
	arena_backend_destroy(be);
	arena_sim_opts o = {.capacity = 64 << 20, .h2d_bytes_per_s = bps};
	cr_assert_eq(arena_backend_sim_create(&o, &be), 0, "%s", arena_last_error());
	cr_assert_eq(be->ops->stream_create(be, &cs), 0);
}

/* Freed while its thread waits for a slot's copies, after a new list that
 * leaves it nothing to read: the thread sees the stop when the wait ends
 * and does not sleep on (a fresh clone's TSan stress run hung there: the
 * stop's wake-up came while the thread was not yet waiting for one). */
Test(stager, freed_while_waiting_for_a_copy, .timeout = 20)
{
	slow_link(PART / 0.5); /* a part's copy: 0.5 s */
	arena_stager *s = make(1, 1);
	void *dev;
	cr_assert_eq(be->ops->dev_alloc(be, PART, &dev), 0);
	arena_stage_part a[2] = {P(0, 0), P(1, 0)};
	cr_assert_eq(arena_stager_want(s, a, 2), 0);
	take_check(s, a[0], dev); /* the one slot COPYING for 0.5 s; part 1 waits for it */
	arena_sleep_s(0.1);       /* the thread is waiting for the copy */
	cr_assert_eq(arena_stager_want(s, a, 0), 0);
	arena_stager_free(s); /* joins the thread: hangs if it sleeps on */
	cr_assert_eq(be->ops->stream_sync(be, cs), 0);
	be->ops->dev_free(be, dev);
}

/* With every slot's copies queued, the thread reads again into the slot
 * whose copies end first (the one taken first: one stream, in order), not
 * the first slot in its table. */
Test(stager, the_slot_taken_first_is_read_into_first, .timeout = 20)
{
	slow_link(PART / 0.2); /* a part's copy: 0.2 s */
	arena_stager *s = make(3, 1);
	void *dev[4];
	arena_stage_part a[4];
	for (int i = 0; i < 4; i++) {
		a[i] = P((uint32_t)i, 0);
		cr_assert_eq(be->ops->dev_alloc(be, PART, &dev[i]), 0);
	}
	cr_assert_eq(arena_stager_want(s, a, 3), 0); /* parts 0, 1, 2 into slots 0, 1, 2 */
	wait_reads(3);
	arena_stage_part b[3] = {a[1], a[2], a[0]}; /* kept where they are, taken 1, 2, 0 */
	cr_assert_eq(arena_stager_want(s, b, 3), 0);
	const double t0 = arena_now_s();
	for (int i = 0; i < 3; i++)
		take_check(s, b[i], dev[i]);
	/* copies end ~0.2 s (slot 1), 0.4 s (slot 2), 0.6 s (slot 0) after t0 */
	cr_assert_eq(arena_stager_want(s, &a[3], 1), 0);
	wait_reads(4);
	const double waited = arena_now_s() - t0;
	cr_assert_eq(reads(), 4, "the kept parts were not read again");
	cr_assert_lt(waited, 0.45, "part 3 was read %.3f s after the copies were queued (slot 1's end at 0.2 s, slot 0's at 0.6)",
		     waited);
	take_check(s, a[3], dev[3]);
	cr_assert_eq(be->ops->stream_sync(be, cs), 0);
	for (int i = 0; i < 4; i++)
		be->ops->dev_free(be, dev[i]);
	arena_stager_free(s);
}
