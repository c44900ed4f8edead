/* test_backend.c - the device backends: the sim's memory, copy, event, stream
 * and timing model, its fault paths; the same byte checks on cuda when a
 * device is present (skipped otherwise).
 *
 * The hb4 decode tests (suite `backend`) run on sim, or with
 * ARENA_TEST_BACKEND=cuda on device 0 (a machine with a GPU), as test_engine.c's
 * do; the few about the sim's own model always run on sim. */
#include <criterion/criterion.h>
#include <criterion/redirect.h>

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "arena.h"
#include "../../device/backend.h"
#include "../../common/err.h"
#include "../../common/alloc.h"
#include "../../common/clock.h"
#include "../../formats/codec.h"

#define KiB (1024ull)
#define MiB (1024ull * 1024)
#define GBPS 1e9

static arena_backend *sim(uint64_t capacity, double rate)
{
	arena_sim_opts o = {.capacity = capacity, .h2d_bytes_per_s = rate};
	arena_backend *b = NULL;
	int rc = arena_backend_sim_create(&o, &b);
	cr_assert_eq(rc, 0, "%s", arena_last_error());
	cr_assert_not_null(b);
	cr_assert_str_eq(b->ops->name, "sim");
	return b;
}

static void fill(uint8_t *p, size_t n, uint32_t seed)
{
	uint32_t x = seed * 2654435761u + 1;
	for (size_t i = 0; i < n; i++) {
		x ^= x << 13, x ^= x >> 17, x ^= x << 5;
		p[i] = (uint8_t)x;
	}
}

static uint64_t free_bytes(arena_backend *b)
{
	uint64_t f = 0, t = 0;
	cr_assert_eq(b->ops->mem_info(b, &f, &t), 0, "%s", arena_last_error());
	return f;
}

/* --- checks both backends must pass, the same bytes ------------------------ */

/* Copies of odd sizes to odd offsets land byte-exact. */
static void check_copies(arena_backend *b)
{
	const size_t n = 3 * MiB + 17;
	uint8_t *src = malloc(n), *back = malloc(n);
	cr_assert(src && back);
	fill(src, n, 7);
	void *d = NULL;
	arena_stream *s = NULL;
	cr_assert_eq(b->ops->dev_alloc(b, n + 4096, &d), 0, "%s", arena_last_error());
	cr_assert_eq((uintptr_t)d % 256, 0, "device pointers are 256-byte aligned");
	cr_assert_eq(b->ops->stream_create(b, &s), 0, "%s", arena_last_error());
	/* In pieces, each to its own offset, out of order. */
	size_t cuts[] = {0, 1, 255, 4097, MiB + 3, 2 * MiB, n};
	for (int i = 5; i >= 0; i--)
		cr_assert_eq(b->ops->copy_h2d(b, (char *)d + 1 + cuts[i], src + cuts[i], cuts[i + 1] - cuts[i], s), 0,
			     "%s", arena_last_error());
	cr_assert_eq(b->ops->copy_h2d(b, d, src, 0, s), 0, "a copy of 0 bytes is a no-op");
	cr_assert_eq(b->ops->stream_sync(b, s), 0, "%s", arena_last_error());
	memset(back, 0, n);
	cr_assert_eq(b->ops->copy_d2h_sync(b, back, (char *)d + 1, n), 0, "%s", arena_last_error());
	cr_assert_eq(memcmp(back, src, n), 0, "device bytes differ from the source");
	b->ops->stream_destroy(b, s);
	b->ops->dev_free(b, d);
	free(src);
	free(back);
}

/* A copy on stream a, an event after it, stream b waits on the event: once
 * b is synced the data is there, though b's host thread never waited on a.
 * `slow` queues work ahead of the copy on a (sim only) so that a broken wait
 * would show. */
static void check_event_order(arena_backend *b, void (*slow)(arena_backend *, arena_stream *))
{
	const size_t n = 8 * MiB;
	uint8_t *src = malloc(n), *back = malloc(n);
	cr_assert(src && back);
	fill(src, n, 11);
	void *d = NULL;
	arena_stream *sa = NULL, *sb = NULL;
	arena_event *e = NULL, *eb = NULL;
	cr_assert_eq(b->ops->dev_alloc(b, n, &d), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->stream_create(b, &sa), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->stream_create(b, &sb), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->event_create(b, &e), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->event_create(b, &eb), 0, "%s", arena_last_error());
	if (slow)
		slow(b, sa);
	cr_assert_eq(b->ops->copy_h2d(b, d, src, n, sa), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->event_record(b, e, sa), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->stream_wait(b, sb, e), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->event_record(b, eb, sb), 0, "%s", arena_last_error());
	if (slow)
		cr_assert_eq(b->ops->event_query(b, eb), 0, "b's event waits for a's copy");
	cr_assert_eq(b->ops->stream_sync(b, sb), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->event_query(b, e), 1);
	cr_assert_eq(b->ops->event_query(b, eb), 1);
	cr_assert_eq(b->ops->copy_d2h_sync(b, back, d, n), 0, "%s", arena_last_error());
	cr_assert_eq(memcmp(back, src, n), 0, "b was synced before a's copy landed");
	b->ops->event_destroy(b, e);
	b->ops->event_destroy(b, eb);
	b->ops->stream_destroy(b, sa);
	b->ops->stream_destroy(b, sb);
	b->ops->dev_free(b, d);
	free(src);
	free(back);
}

/* Pinned memory: register, copy from it, unregister. */
static void check_registered(arena_backend *b)
{
	const size_t n = 2 * MiB;
	uint8_t *src = aligned_alloc(4096, n), *back = malloc(n);
	cr_assert(src && back);
	fill(src, n, 3);
	void *d = NULL;
	arena_stream *s = NULL;
	cr_assert_eq(b->ops->host_register(b, src, n), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->dev_alloc(b, n, &d), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->stream_create(b, &s), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->copy_h2d(b, d, src, n, s), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->stream_sync(b, s), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->copy_d2h_sync(b, back, d, n), 0, "%s", arena_last_error());
	cr_assert_eq(memcmp(back, src, n), 0);
	b->ops->host_unregister(b, src);
	/* Read-only pages cannot be registered (CUDA's rule, which sim follows);
	 * pages registered while writable stay registered and copyable after
	 * mprotect (arena_model_commit's order). */
	uint8_t *ro = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	cr_assert_neq(ro, MAP_FAILED);
	fill(ro, n, 5);
	cr_assert_eq(mprotect(ro, n, PROT_READ), 0);
	cr_assert_neq(b->ops->host_register(b, ro, n), 0, "read-only memory registered");
	arena_error_clear();
	cr_assert_eq(mprotect(ro, n, PROT_READ | PROT_WRITE), 0);
	cr_assert_eq(b->ops->host_register(b, ro, n), 0, "%s", arena_last_error());
	cr_assert_eq(mprotect(ro, n, PROT_READ), 0);
	cr_assert_eq(b->ops->copy_h2d(b, d, ro, n, s), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->stream_sync(b, s), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->copy_d2h_sync(b, back, d, n), 0, "%s", arena_last_error());
	cr_assert_eq(memcmp(back, ro, n), 0);
	b->ops->host_unregister(b, ro);
	munmap(ro, n);
	/* Memory mapped read-only from the start (a shared region sealed
	 * against writes, as another process's is mapped): host_register_ro. */
	int mfd = memfd_create("arena-test-ro", MFD_CLOEXEC);
	cr_assert_geq(mfd, 0);
	cr_assert_eq(ftruncate(mfd, (off_t)n), 0);
	uint8_t *w = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
	cr_assert_neq(w, MAP_FAILED);
	fill(w, n, 7);
	ro = mmap(NULL, n, PROT_READ, MAP_SHARED, mfd, 0);
	cr_assert_neq(ro, MAP_FAILED);
	cr_assert_neq(b->ops->host_register(b, ro, n), 0, "read-only memory registered as writable");
	arena_error_clear();
	const int rc = b->ops->host_register_ro(b, ro, n);
	if (rc && !strcmp(b->ops->name, "cuda") && strstr(arena_last_error(), "cannot pin read-only")) {
		cr_log_warn("%s: read-only registration not supported here", arena_last_error()); /* the device's answer */
		arena_error_clear();
	} else {
		cr_assert_eq(rc, 0, "%s", arena_last_error());
		cr_assert_eq(b->ops->copy_h2d(b, d, ro, n, s), 0, "%s", arena_last_error());
		cr_assert_eq(b->ops->stream_sync(b, s), 0, "%s", arena_last_error());
		cr_assert_eq(b->ops->copy_d2h_sync(b, back, d, n), 0, "%s", arena_last_error());
		cr_assert_eq(memcmp(back, w, n), 0);
		b->ops->host_unregister(b, ro);
	}
	munmap(ro, n);
	munmap(w, n);
	close(mfd);
	b->ops->stream_destroy(b, s);
	b->ops->dev_free(b, d);
	free(src);
	free(back);
}

static void sim_slow(arena_backend *b, arena_stream *s)
{
	cr_assert_eq(arena_backend_sim_compute(b, s, 0.05), 0, "%s", arena_last_error());
}

/* A wait whose end lies past what time_t holds (a compute op of 1e300 s; a
 * copy at a rate near 0 was one) sleeps until the backend ends it: its
 * deadline saturates, where a cast of 1e300 to time_t gave a deadline in the
 * past and the worker spun on it, a core busy for good. */
Test(backend_sim, a_wait_past_any_clock_sleeps)
{
	arena_backend *b = sim(MiB, 0);
	arena_stream *s = NULL;
	cr_assert_eq(b->ops->stream_create(b, &s), 0);
	cr_assert_eq(arena_backend_sim_compute(b, s, 1e300), 0, "%s", arena_last_error());
	struct timespec c0, c1;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
	arena_sleep_s(0.3);
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
	const double cpu = (double)(c1.tv_sec - c0.tv_sec) + (double)(c1.tv_nsec - c0.tv_nsec) * 1e-9;
	cr_assert_lt(cpu, 0.1, "the worker used %.3f s of CPU in 0.3 s of waiting", cpu);
	arena_backend_destroy(b); /* cancels the wait */
	/* the deadlines themselves: saturated, never negative */
	const double at[] = {1e300, 5e304, 1.0 / 0.0, 9.3e18, 1e12};
	for (size_t k = 0; k < sizeof(at) / sizeof(*at); k++) {
		struct timespec t = arena_timespec_at(at[k]);
		cr_assert_eq(t.tv_sec, ARENA_TIME_MAX_S, "%g", at[k]);
		cr_assert_eq(t.tv_nsec, 0);
	}
	const double none[] = {-1, -1e300, 0.0 / 0.0, 0};
	for (size_t k = 0; k < sizeof(none) / sizeof(*none); k++) {
		struct timespec t = arena_timespec_at(none[k]);
		cr_assert(t.tv_sec == 0 && t.tv_nsec == 0, "%g", none[k]);
	}
	struct timespec t = arena_timespec_at(12.25);
	cr_assert(t.tv_sec == 12 && t.tv_nsec == 250000000L);
}

/* --- sim: memory ------------------------------------------------------------ */

Test(backend_sim, alloc_up_to_capacity_then_oom)
{
	arena_backend *b = sim(MiB, 0);
	uint64_t f, t;
	cr_assert_eq(b->ops->mem_info(b, &f, &t), 0);
	cr_assert_eq(f, MiB);
	cr_assert_eq(t, MiB);
	void *p[4];
	for (int i = 0; i < 4; i++) {
		cr_assert_eq(b->ops->dev_alloc(b, 256 * KiB, &p[i]), 0, "%s", arena_last_error());
		cr_assert_eq((uintptr_t)p[i] % 256, 0);
	}
	cr_assert_eq(free_bytes(b), 0);
	void *q = (void *)1;
	cr_assert_eq(b->ops->dev_alloc(b, 1, &q), ARENA_E(DEV_OOM));
	cr_assert_null(q);
	cr_assert_str_eq(arena_last_error(), "sim: cannot allocate 1 bytes, 0 free of 1048576");
	b->ops->dev_free(b, p[2]);
	cr_assert_eq(free_bytes(b), 256 * KiB);
	cr_assert_eq(b->ops->dev_alloc(b, 256 * KiB + 1, &q), ARENA_E(DEV_OOM));
	cr_assert_eq(b->ops->dev_alloc(b, 256 * KiB, &p[2]), 0);
	for (int i = 0; i < 4; i++)
		b->ops->dev_free(b, p[i]);
	b->ops->dev_free(b, NULL);
	cr_assert_eq(free_bytes(b), MiB);
	arena_backend_destroy(b);
}

Test(backend_sim, sizes_count_rounded_to_256)
{
	arena_backend *b = sim(MiB, 0);
	void *p = NULL;
	cr_assert_eq(b->ops->dev_alloc(b, 1, &p), 0);
	cr_assert_eq(free_bytes(b), MiB - 256);
	cr_assert_eq(b->ops->dev_alloc(b, 0, &p), ARENA_E_USAGE);
	cr_assert_null(p);
	cr_assert_eq(b->ops->dev_alloc(b, UINT64_MAX, &p), ARENA_E(DEV_OOM));
	arena_backend_destroy(b); /* frees what is left */
}

Test(backend_sim, pressure_takes_and_gives_back)
{
	arena_backend *b = sim(MiB, 0);
	void *p = NULL, *q = NULL;
	cr_assert_eq(arena_backend_sim_pressure(b, 768 * KiB), 0, "%s", arena_last_error());
	cr_assert_eq(free_bytes(b), 256 * KiB);
	cr_assert_eq(b->ops->dev_alloc(b, 512 * KiB, &p), ARENA_E(DEV_OOM));
	cr_assert_eq(b->ops->dev_alloc(b, 256 * KiB, &p), 0);
	cr_assert_eq(free_bytes(b), 0);
	/* Pressure is a level, not an increment: 1 MiB no longer fits beside p. */
	cr_assert_eq(arena_backend_sim_pressure(b, MiB), ARENA_E(DEV_OOM));
	cr_assert_str_eq(arena_last_error(), "sim: outside pressure of 1048576 bytes does not fit, 786432 free of 1048576");
	cr_assert_eq(free_bytes(b), 0, "a failed pressure changes nothing");
	cr_assert_eq(arena_backend_sim_pressure(b, 0), 0);
	cr_assert_eq(free_bytes(b), 768 * KiB);
	cr_assert_eq(b->ops->dev_alloc(b, 512 * KiB, &q), 0, "%s", arena_last_error());
	b->ops->dev_free(b, p);
	b->ops->dev_free(b, q);
	cr_assert_eq(free_bytes(b), MiB);
	arena_backend_destroy(b);
}

Test(backend_sim, injected_allocation_failures)
{
	arena_backend *b = sim(MiB, 0);
	void *p[4] = {NULL};
	/* the next allocation goes on, the two after it fail, then they go on again */
	cr_assert_eq(arena_backend_sim_fail_alloc(b, 1, 2), 0);
	cr_assert_eq(b->ops->dev_alloc(b, KiB, &p[0]), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->dev_alloc(b, KiB, &p[1]), ARENA_E(DEV_OOM));
	cr_assert_null(p[1]);
	cr_assert_str_eq(arena_last_error(), "sim: cannot allocate 1024 bytes (an injected failure), 1047552 free of 1048576");
	cr_assert_eq(b->ops->dev_alloc(b, KiB, &p[1]), ARENA_E(DEV_OOM));
	cr_assert_eq(free_bytes(b), MiB - KiB, "a failed allocation takes nothing");
	cr_assert_eq(b->ops->dev_alloc(b, KiB, &p[1]), 0, "%s", arena_last_error());
	/* count 0 clears what was set */
	cr_assert_eq(arena_backend_sim_fail_alloc(b, 0, 5), 0);
	cr_assert_eq(arena_backend_sim_fail_alloc(b, 0, 0), 0);
	cr_assert_eq(b->ops->dev_alloc(b, KiB, &p[2]), 0, "%s", arena_last_error());
	for (int i = 0; i < 3; i++)
		b->ops->dev_free(b, p[i]);
	cr_assert_eq(free_bytes(b), MiB);
	arena_backend_destroy(b);
}

static int fake_mem_info(arena_backend *b, uint64_t *f, uint64_t *t)
{
	*f = *t = 0;
	return 0;
}

Test(backend_sim, sim_only_calls_refuse_other_backends)
{
	static const arena_backend_ops fake_ops = {.name = "fake", .mem_info = fake_mem_info};
	arena_backend fake = {&fake_ops, 0};
	cr_assert_eq(arena_backend_sim_pressure(&fake, 0), ARENA_E_USAGE);
	cr_assert_eq(arena_backend_sim_fail_alloc(&fake, 0, 1), ARENA_E_USAGE);
	cr_assert_eq(arena_backend_sim_compute(&fake, NULL, 0), ARENA_E_USAGE);
	cr_assert_eq(arena_backend_sim_pressure(NULL, 0), ARENA_E_USAGE);
}

Test(backend_sim, options)
{
	arena_backend *b = NULL;
	cr_assert_eq(arena_backend_sim_create(NULL, &b), 0);
	uint64_t f, t;
	cr_assert_eq(b->ops->mem_info(b, &f, &t), 0);
	cr_assert_eq(t, 8ull << 30, "default capacity is 8 GiB");
	cr_assert_eq(f, t);
	arena_backend_destroy(b);
	arena_sim_opts o = {.capacity = MiB, .h2d_bytes_per_s = -1};
	b = (arena_backend *)1;
	cr_assert_eq(arena_backend_sim_create(&o, &b), ARENA_E_USAGE);
	cr_assert_null(b);
	o.h2d_bytes_per_s = 1.0 / 0.0;
	cr_assert_eq(arena_backend_sim_create(&o, &b), ARENA_E_USAGE);
	/* A rate so low that a copy's end lies past any clock (1e-300 B/s: 5e304 s
	 * for 50 KiB) is refused: from 1 KB/s to 1e15 B/s, or 0 (unmodelled). */
	const double bad_rates[] = {1e-300, 1e-3, 999, 1.01e15};
	for (size_t k = 0; k < sizeof(bad_rates) / sizeof(*bad_rates); k++) {
		o.h2d_bytes_per_s = bad_rates[k];
		cr_assert_eq(arena_backend_sim_create(&o, &b), ARENA_E_USAGE, "%g", bad_rates[k]);
		cr_assert(strstr(arena_last_error(), "h2d_bytes_per_s"), "%s", arena_last_error());
	}
	const double good_rates[] = {1e3, 1e15};
	for (size_t k = 0; k < sizeof(good_rates) / sizeof(*good_rates); k++) {
		o.h2d_bytes_per_s = good_rates[k];
		cr_assert_eq(arena_backend_sim_create(&o, &b), 0, "%g: %s", good_rates[k], arena_last_error());
		arena_backend_destroy(b);
	}
	/* Allocation granularity: a power of two from 256; sizes count rounded up to it. */
	o.h2d_bytes_per_s = 0;
	o.alloc_granularity = 300;
	cr_assert_eq(arena_backend_sim_create(&o, &b), ARENA_E_USAGE);
	o.alloc_granularity = 128;
	cr_assert_eq(arena_backend_sim_create(&o, &b), ARENA_E_USAGE);
	o.alloc_granularity = 4096;
	cr_assert_eq(arena_backend_sim_create(&o, &b), 0, "%s", arena_last_error());
	cr_assert_eq(b->alloc_granularity, 4096);
	void *d;
	cr_assert_eq(b->ops->dev_alloc(b, 1, &d), 0);
	cr_assert_eq(b->ops->mem_info(b, &f, &t), 0);
	cr_assert_eq(t - f, 4096, "1 byte takes a granule");
	b->ops->dev_free(b, d);
	arena_backend_destroy(b);
	arena_backend_destroy(NULL);
}

Test(backend_sim, create_by_name)
{
	arena_backend *b = NULL;
	arena_sim_opts o = {.capacity = MiB};
	cr_assert_eq(arena_backend_create("sim", 0, &o, &b), 0);
	cr_assert_str_eq(b->ops->name, "sim");
	cr_assert_eq(free_bytes(b), MiB);
	arena_backend_destroy(b);
	cr_assert_eq(arena_backend_create("sim", 0, NULL, &b), 0);
	arena_backend_destroy(b);
	b = (arena_backend *)1;
	cr_assert_eq(arena_backend_create("opencl", 0, NULL, &b), ARENA_E_USAGE);
	cr_assert_null(b);
	cr_assert_str_eq(arena_last_error(), "unknown backend 'opencl' (cuda, sim)");
	cr_assert_eq(arena_backend_create(NULL, 0, NULL, &b), ARENA_E_USAGE);
	/* cuda: a device, or NO_DEVICE with the reason (no driver, or a build
	 * without CUDA). */
	int rc = arena_backend_create("cuda", 0, NULL, &b);
	if (rc == 0) {
		cr_assert_str_eq(b->ops->name, "cuda");
		arena_backend_destroy(b);
	} else {
		cr_assert_eq(rc, ARENA_E_NO_DEVICE, "%s", arena_last_error());
		cr_assert_null(b);
		cr_assert(!strncmp(arena_last_error(), "cuda: no CUDA device", 20), "%s", arena_last_error());
	}
}

Test(backend_sim, host_register_is_a_ledger)
{
	arena_backend *b = sim(MiB, 0);
	static char buf[8192];
	cr_assert_eq(b->ops->host_register(b, buf, 4096), 0);
	cr_assert_eq(b->ops->host_register(b, buf + 4095, 10), ARENA_E(DEV_ERROR), "overlap");
	cr_assert_eq(b->ops->host_register(b, buf, 4096), ARENA_E(DEV_ERROR), "twice");
	cr_assert_eq(b->ops->host_register(b, buf + 4096, 4096), 0, "adjacent");
	cr_assert_eq(b->ops->host_register(b, buf, 0), ARENA_E_USAGE);
	cr_assert_eq(b->ops->host_register(b, NULL, 1), ARENA_E_USAGE);
	b->ops->host_unregister(b, buf);
	b->ops->host_unregister(b, NULL);
	cr_assert_eq(b->ops->host_register(b, buf, 4096), 0, "after unregister");
	b->ops->host_unregister(b, buf);
	b->ops->host_unregister(b, buf + 4096);
	arena_backend_destroy(b);
}

Test(backend_sim, registered_copies)
{
	arena_backend *b = sim(16 * MiB, 0);
	check_registered(b);
	arena_backend_destroy(b);
}

Test(backend_sim, dev_free_of_unknown_pointer_is_a_bug, .signal = SIGABRT, .init = cr_redirect_stderr)
{
	arena_backend *b = sim(MiB, 0);
	void *p = NULL;
	cr_assert_eq(b->ops->dev_alloc(b, 4096, &p), 0);
	b->ops->dev_free(b, (char *)p + 256);
}

Test(backend_sim, host_unregister_of_unregistered_memory_is_a_bug, .signal = SIGABRT, .init = cr_redirect_stderr)
{
	arena_backend *b = sim(MiB, 0);
	static char buf[64];
	b->ops->host_unregister(b, buf);
}

/* --- sim: copies and events -------------------------------------------------- */

Test(backend_sim, copies_land_byte_exact)
{
	arena_backend *b = sim(64 * MiB, 0);
	check_copies(b);
	cr_assert_eq(free_bytes(b), 64 * MiB);
	arena_backend_destroy(b);
}

Test(backend_sim, copies_outside_device_memory_are_refused)
{
	arena_backend *b = sim(MiB, 0);
	void *d = NULL;
	arena_stream *s = NULL;
	static char host[8192];
	cr_assert_eq(b->ops->dev_alloc(b, 4096, &d), 0);
	cr_assert_eq(b->ops->stream_create(b, &s), 0);
	cr_assert_eq(b->ops->copy_h2d(b, (char *)d + 1, host, 4096, s), ARENA_E_USAGE, "past the end");
	cr_assert_eq(b->ops->copy_h2d(b, host, host + 4096, 16, s), ARENA_E_USAGE, "host destination");
	cr_assert_eq(b->ops->copy_h2d(b, d, NULL, 16, s), ARENA_E_USAGE);
	cr_assert_eq(b->ops->copy_d2h_sync(b, host, (char *)d + 4000, 97), ARENA_E_USAGE);
	cr_assert_eq(b->ops->copy_h2d(b, d, host, 4096, s), 0, "exactly the allocation");
	cr_assert_eq(b->ops->copy_d2h_sync(b, host, (char *)d + 4000, 96), 0);
	arena_backend_destroy(b); /* with a stream and memory left */
}

Test(backend_sim, stream_wait_orders_streams)
{
	arena_backend *b = sim(64 * MiB, 0);
	check_event_order(b, sim_slow);
	arena_backend_destroy(b);
}

Test(backend_sim, stream_wait_orders_modelled_copies)
{
	arena_backend *b = sim(64 * MiB, 1 * GBPS);
	double t0 = arena_now_s();
	check_event_order(b, NULL);
	double dt = arena_now_s() - t0;
	cr_assert_geq(dt, 8.0 * MiB / GBPS * 0.95, "syncing b waited for a's copy: %.3f s", dt);
	arena_backend_destroy(b);
}

Test(backend_sim, event_query_before_and_after)
{
	arena_backend *b = sim(MiB, 0);
	arena_stream *s = NULL, *s2 = NULL;
	arena_event *e = NULL;
	cr_assert_eq(b->ops->stream_create(b, &s), 0);
	cr_assert_eq(b->ops->stream_create(b, &s2), 0);
	cr_assert_eq(b->ops->event_create(b, &e), 0);
	cr_assert_eq(b->ops->event_query(b, e), 1, "never recorded is done");
	cr_assert_eq(b->ops->event_sync(b, e), 0);
	cr_assert_eq(b->ops->event_record(b, e, s), 0);
	cr_assert_eq(b->ops->event_query(b, e), 1, "recorded on an idle stream is done");
	cr_assert_eq(b->ops->stream_wait(b, s2, e), 0, "waiting on a done event");
	cr_assert_eq(arena_backend_sim_compute(b, s, 0.05), 0);
	cr_assert_eq(b->ops->event_query(b, e), 1, "a record captures only the work before it");
	cr_assert_eq(b->ops->event_record(b, e, s), 0);
	cr_assert_eq(b->ops->event_query(b, e), 0);
	double t0 = arena_now_s();
	cr_assert_eq(b->ops->event_sync(b, e), 0);
	cr_assert_geq(arena_now_s() - t0, 0.04);
	cr_assert_eq(b->ops->event_query(b, e), 1);
	/* An event outlives the stream it was recorded on. */
	cr_assert_eq(arena_backend_sim_compute(b, s, 0.02), 0);
	cr_assert_eq(b->ops->event_record(b, e, s), 0);
	b->ops->stream_destroy(b, s);
	cr_assert_eq(b->ops->event_query(b, e), 1, "a destroyed stream's work is done");
	cr_assert_eq(arena_backend_sim_compute(b, s2, -1), ARENA_E_USAGE);
	b->ops->event_destroy(b, e);
	b->ops->event_destroy(b, NULL);
	b->ops->stream_destroy(b, s2);
	b->ops->stream_destroy(b, NULL);
	arena_backend_destroy(b);
}

Test(backend_sim, stream_destroy_waits_for_its_work)
{
	arena_backend *b = sim(16 * MiB, 0);
	arena_stream *s = NULL;
	uint8_t *src = malloc(MiB), *back = malloc(MiB);
	void *d = NULL;
	fill(src, MiB, 5);
	cr_assert_eq(b->ops->dev_alloc(b, MiB, &d), 0);
	cr_assert_eq(b->ops->stream_create(b, &s), 0);
	cr_assert_eq(arena_backend_sim_compute(b, s, 0.03), 0);
	cr_assert_eq(b->ops->copy_h2d(b, d, src, MiB, s), 0);
	double t0 = arena_now_s();
	b->ops->stream_destroy(b, s);
	cr_assert_geq(arena_now_s() - t0, 0.025);
	cr_assert_eq(b->ops->copy_d2h_sync(b, back, d, MiB), 0);
	cr_assert_eq(memcmp(back, src, MiB), 0);
	arena_backend_destroy(b);
	free(src);
	free(back);
}

Test(backend_sim, destroy_with_work_queued_is_clean)
{
	arena_backend *b = sim(64 * MiB, 1e6); /* 1 MB/s: 16 MiB would take 16 s */
	arena_stream *sa = NULL, *sb = NULL, *sc = NULL;
	arena_event *e = NULL;
	static uint8_t src[16 * MiB];
	void *d = NULL;
	cr_assert_eq(b->ops->dev_alloc(b, sizeof(src), &d), 0);
	cr_assert_eq(b->ops->stream_create(b, &sa), 0);
	cr_assert_eq(b->ops->stream_create(b, &sb), 0);
	cr_assert_eq(b->ops->stream_create(b, &sc), 0);
	cr_assert_eq(b->ops->event_create(b, &e), 0);
	cr_assert_eq(arena_backend_sim_compute(b, sa, 10), 0);
	for (int i = 0; i < 4; i++)
		cr_assert_eq(b->ops->copy_h2d(b, d, src, sizeof(src), sa), 0);
	cr_assert_eq(b->ops->event_record(b, e, sa), 0);
	cr_assert_eq(b->ops->stream_wait(b, sb, e), 0);
	cr_assert_eq(b->ops->copy_h2d(b, d, src, sizeof(src), sb), 0);
	cr_assert_eq(b->ops->copy_h2d(b, d, src, sizeof(src), sc), 0);
	cr_assert_eq(b->ops->event_query(b, e), 0);
	double t0 = arena_now_s();
	arena_backend_destroy(b);
	cr_assert_lt(arena_now_s() - t0, 2.0, "destroy cancels queued work");
}

/* --- sim: the timing model ---------------------------------------------------- */

/* A copy engine at 1 GB/s. The first copy touches the device pages so that
 * page faults do not count in the timed ones. */
static arena_backend *timed_sim(void **d, uint8_t **src, size_t n)
{
	arena_backend *b = sim(256 * MiB, 1 * GBPS);
	arena_stream *s = NULL;
	*src = malloc(n);
	cr_assert_not_null(*src);
	fill(*src, n, 1);
	cr_assert_eq(b->ops->dev_alloc(b, n, d), 0);
	cr_assert_eq(b->ops->stream_create(b, &s), 0);
	cr_assert_eq(b->ops->copy_h2d(b, *d, *src, n, s), 0);
	b->ops->stream_destroy(b, s);
	return b;
}

Test(backend_sim, modelled_bandwidth)
{
	const size_t n = 64 * MiB;
	void *d;
	uint8_t *src;
	arena_backend *b = timed_sim(&d, &src, n);
	arena_stream *s = NULL;
	cr_assert_eq(b->ops->stream_create(b, &s), 0);
	double t0 = arena_now_s();
	cr_assert_eq(b->ops->copy_h2d(b, d, src, n, s), 0);
	cr_assert_eq(b->ops->stream_sync(b, s), 0);
	double dt = arena_now_s() - t0; /* 64 MiB at 1 GB/s = 67 ms */
	cr_assert(dt >= 0.050 && dt <= 0.200, "64 MiB at 1 GB/s took %.3f s", dt);
	arena_backend_destroy(b);
	free(src);
}

Test(backend_sim, streams_share_one_copy_engine)
{
	const size_t n = 64 * MiB;
	void *d;
	uint8_t *src;
	arena_backend *b = timed_sim(&d, &src, n);
	arena_stream *s[4] = {0};
	for (int i = 0; i < 4; i++)
		cr_assert_eq(b->ops->stream_create(b, &s[i]), 0);
	double t0 = arena_now_s();
	for (int i = 0; i < 4; i++) /* 4 x 16 MiB, one stream each */
		cr_assert_eq(b->ops->copy_h2d(b, (char *)d + i * (n / 4), src + i * (n / 4), n / 4, s[i]), 0);
	for (int i = 0; i < 4; i++)
		cr_assert_eq(b->ops->stream_sync(b, s[i]), 0);
	double dt = arena_now_s() - t0;
	cr_assert(dt >= 0.95 * n / GBPS && dt <= 0.200, "4 streams x 16 MiB at 1 GB/s shared took %.3f s", dt);
	uint8_t *back = malloc(n);
	cr_assert_eq(b->ops->copy_d2h_sync(b, back, d, n), 0);
	cr_assert_eq(memcmp(back, src, n), 0);
	free(back);
	arena_backend_destroy(b);
	free(src);
}

Test(backend_sim, compute_overlaps_copies)
{
	const size_t n = 100 * 1000 * 1000; /* 100 ms at 1 GB/s */
	void *d;
	uint8_t *src;
	arena_backend *b = timed_sim(&d, &src, n);
	arena_stream *copy = NULL, *compute = NULL;
	cr_assert_eq(b->ops->stream_create(b, &copy), 0);
	cr_assert_eq(b->ops->stream_create(b, &compute), 0);
	double t0 = arena_now_s();
	cr_assert_eq(arena_backend_sim_compute(b, compute, 0.1), 0);
	cr_assert_eq(b->ops->copy_h2d(b, d, src, n, copy), 0);
	cr_assert_eq(b->ops->stream_sync(b, copy), 0);
	cr_assert_eq(b->ops->stream_sync(b, compute), 0);
	double dt = arena_now_s() - t0;
	cr_assert(dt >= 0.095 && dt <= 0.170, "100 ms compute beside 100 ms of copy took %.3f s, not ~0.1", dt);
	/* The same on one stream runs one after the other. */
	t0 = arena_now_s();
	cr_assert_eq(arena_backend_sim_compute(b, copy, 0.1), 0);
	cr_assert_eq(b->ops->copy_h2d(b, d, src, n, copy), 0);
	cr_assert_eq(b->ops->stream_sync(b, copy), 0);
	dt = arena_now_s() - t0;
	cr_assert(dt >= 0.19, "one stream runs in order: %.3f s", dt);
	arena_backend_destroy(b);
	free(src);
}

/* --- sim: threads --------------------------------------------------------------- */

struct copier {
	arena_backend *b;
	arena_stream *s;
	char *d;
	const uint8_t *src;
	size_t n;
	int rc;
};

static void *copier_main(void *arg)
{
	struct copier *c = arg;
	for (size_t off = 0; off < c->n && !c->rc; off += 4096)
		c->rc = c->b->ops->copy_h2d(c->b, c->d + off, c->src + off, c->n - off < 4096 ? c->n - off : 4096, c->s);
	return NULL;
}

Test(backend_sim, copies_from_many_threads)
{
	enum { T = 8 };
	const size_t n = 256 * KiB;
	arena_backend *b = sim(16 * MiB, 0);
	arena_stream *shared = NULL, *own[T];
	uint8_t *src = malloc(n * T), *back = malloc(n * T);
	void *d = NULL;
	fill(src, n * T, 9);
	cr_assert_eq(b->ops->dev_alloc(b, n * T, &d), 0);
	cr_assert_eq(b->ops->stream_create(b, &shared), 0);
	struct copier c[T];
	pthread_t th[T];
	for (int i = 0; i < T; i++) {
		/* Half the threads share a stream, half have their own. */
		own[i] = NULL;
		if (i % 2)
			cr_assert_eq(b->ops->stream_create(b, &own[i]), 0);
		c[i] = (struct copier){b, i % 2 ? own[i] : shared, (char *)d + i * n, src + i * n, n, 0};
		cr_assert_eq(pthread_create(&th[i], NULL, copier_main, &c[i]), 0);
	}
	for (int i = 0; i < T; i++) {
		pthread_join(th[i], NULL);
		cr_assert_eq(c[i].rc, 0);
	}
	for (int i = 0; i < T; i++)
		if (own[i])
			b->ops->stream_destroy(b, own[i]);
	cr_assert_eq(b->ops->stream_sync(b, shared), 0);
	cr_assert_eq(b->ops->copy_d2h_sync(b, back, d, n * T), 0);
	cr_assert_eq(memcmp(back, src, n * T), 0);
	arena_backend_destroy(b);
	free(src);
	free(back);
}

/* --- sim: allocation failures ------------------------------------------------------ */

static void disarm(void)
{
	arena_fault_alloc(0);
}

/* Every op that allocates, in turn; `n`th allocation fails. Returns the
 * first failure (NOMEM expected) or 0. Frees everything either way. */
static int sim_session(void)
{
	static uint8_t src[4096];
	arena_backend *b = NULL;
	arena_stream *sa = NULL, *sb = NULL;
	arena_event *e = NULL;
	void *d = NULL;
	int rc = arena_backend_sim_create(NULL, &b);
	if (rc) {
		cr_assert_null(b);
		return rc;
	}
	if (!(rc = b->ops->stream_create(b, &sa)) && !(rc = b->ops->stream_create(b, &sb)) &&
	    !(rc = b->ops->event_create(b, &e)) && !(rc = b->ops->dev_alloc(b, sizeof(src), &d)) &&
	    !(rc = b->ops->host_register(b, src, sizeof(src))) &&
	    !(rc = arena_backend_sim_compute(b, sa, 0.001)) && !(rc = b->ops->copy_h2d(b, d, src, sizeof(src), sa)) &&
	    !(rc = b->ops->event_record(b, e, sa)) && !(rc = b->ops->stream_wait(b, sb, e)))
		rc = b->ops->stream_sync(b, sb);
	if (!rc) {
		b->ops->host_unregister(b, src);
		b->ops->event_destroy(b, e);
		b->ops->stream_destroy(b, sa);
		b->ops->stream_destroy(b, sb);
		b->ops->dev_free(b, d);
	}
	arena_backend_destroy(b); /* on failure, with what was made so far */
	return rc;
}

Test(backend_sim, allocation_failures_end_in_nomem, .fini = disarm)
{
	long n;
	for (n = 1; n < 1000; n++) {
		arena_fault_alloc(n);
		int rc = sim_session();
		int fired = arena_fault_alloc_fired();
		arena_fault_alloc(0);
		if (!fired) {
			cr_assert_eq(rc, 0, "%s", arena_last_error());
			break;
		}
		cr_assert_eq(rc, ARENA_E_NOMEM, "allocation %ld: %s (%s)", n, arena_err_name(rc), arena_last_error());
	}
	cr_assert_gt(n, 5, "the session allocates");
	cr_assert_lt(n, 1000);
}

/* --- cuda: only with a device ---------------------------------------------------- */

static arena_backend *cuda_or_skip(void)
{
	arena_backend *b = NULL;
	int rc = arena_backend_cuda_create(0, &b);
	if (rc == ARENA_E_NO_DEVICE)
		cr_skip_test("%s", arena_last_error());
	cr_assert_eq(rc, 0, "%s", arena_last_error());
	cr_assert_str_eq(b->ops->name, "cuda");
	return b;
}

/* Timed events: elapsed is the time of the work between them, 1 before it
 * is done, USAGE for an event never recorded or not timed. `work` queues
 * about `seconds` of work on s. */
static void check_timed(arena_backend *b, void (*work)(arena_backend *, arena_stream *, double), double seconds)
{
	arena_stream *s;
	arena_event *a, *z, *plain;
	double t = -1;
	cr_assert_eq(b->ops->stream_create(b, &s), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->event_create_timed(b, &a), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->event_create_timed(b, &z), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->event_create(b, &plain), 0, "%s", arena_last_error());
	cr_assert_neq(b->ops->event_elapsed(b, a, z, &t), 0, "never recorded: not an elapsed time");
	arena_error_clear();
	cr_assert_eq(b->ops->event_record(b, a, s), 0);
	work(b, s, seconds);
	cr_assert_eq(b->ops->event_record(b, z, s), 0);
	int rc = b->ops->event_elapsed(b, a, z, &t);
	cr_assert(rc == 0 || rc == 1, "%s", arena_last_error());
	cr_assert_eq(b->ops->stream_sync(b, s), 0);
	cr_assert_eq(b->ops->event_elapsed(b, a, z, &t), 0, "%s", arena_last_error());
	cr_assert(t >= seconds * 0.8 && t < seconds * 5 + 0.05, "elapsed %.6f s for %.6f s of work", t, seconds);
	cr_assert_eq(b->ops->event_elapsed(b, z, a, &t), 0);
	cr_assert_lt(t, 0, "z before a is negative");
	cr_assert_eq(b->ops->event_record(b, plain, s), 0);
	cr_assert_neq(b->ops->event_elapsed(b, a, plain, &t), 0, "an untimed event");
	arena_error_clear();
	/* Destroying a timed event whose record is still queued is fine. */
	work(b, s, seconds);
	cr_assert_eq(b->ops->event_record(b, a, s), 0);
	b->ops->event_destroy(b, a);
	b->ops->event_destroy(b, z);
	b->ops->event_destroy(b, plain);
	b->ops->stream_destroy(b, s);
}

static void sim_work(arena_backend *b, arena_stream *s, double seconds)
{
	cr_assert_eq(arena_backend_sim_compute(b, s, seconds), 0, "%s", arena_last_error());
}

Test(backend_sim, timed_events)
{
	arena_backend *b = sim(MiB, 0);
	check_timed(b, sim_work, 0.03);
	arena_backend_destroy(b);
}

/* cuda: 256 MiB from pinned memory, at most a few tens of ms */
static uint8_t *cuda_src;
static void *cuda_dst;
static void cuda_work(arena_backend *b, arena_stream *s, double seconds)
{
	(void)seconds;
	cr_assert_eq(b->ops->copy_h2d(b, cuda_dst, cuda_src, 256 * MiB, s), 0, "%s", arena_last_error());
}

Test(backend_cuda, copies_land_byte_exact)
{
	arena_backend *b = cuda_or_skip();
	uint64_t f = 0, t = 0;
	cr_assert_eq(b->ops->mem_info(b, &f, &t), 0, "%s", arena_last_error());
	cr_assert(f > 0 && f <= t);
	check_copies(b);
	check_registered(b);
	check_event_order(b, NULL);
	arena_backend_destroy(b);
}

Test(backend_cuda, timed_events)
{
	arena_backend *b = cuda_or_skip();
	cuda_src = aligned_alloc(4096, 256 * MiB);
	cr_assert_not_null(cuda_src);
	memset(cuda_src, 1, 256 * MiB);
	cr_assert_eq(b->ops->host_register(b, cuda_src, 256 * MiB), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->dev_alloc(b, 256 * MiB, &cuda_dst), 0, "%s", arena_last_error());
	check_timed(b, cuda_work, 0.001); /* 256 MiB takes >= 1 ms at any PCIe rate */
	b->ops->dev_free(b, cuda_dst);
	b->ops->host_unregister(b, cuda_src);
	free(cuda_src);
	arena_backend_destroy(b);
}

Test(backend_cuda, oom_is_dev_oom)
{
	arena_backend *b = cuda_or_skip();
	uint64_t f = 0, t = 0;
	void *d = (void *)1;
	cr_assert_eq(b->ops->mem_info(b, &f, &t), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->dev_alloc(b, t * 2, &d), ARENA_E(DEV_OOM), "%s", arena_last_error());
	cr_assert_null(d);
	/* The failure is not sticky. */
	cr_assert_eq(b->ops->dev_alloc(b, MiB, &d), 0, "%s", arena_last_error());
	b->ops->dev_free(b, d);
	arena_backend_destroy(b);
}

/* --- decode_hb4: sim, or cuda with ARENA_TEST_BACKEND=cuda ---------------------- */

static int test_on_cuda(void)
{
	const char *tb = getenv("ARENA_TEST_BACKEND");
	return tb && !strcmp(tb, "cuda");
}

/* The backend under test: device 0 with ARENA_TEST_BACKEND=cuda, else sim. */
static arena_backend *test_backend(void)
{
	if (!test_on_cuda())
		return sim(256 * MiB, 0);
	arena_backend *b = NULL;
	cr_assert_eq(arena_backend_cuda_create(0, &b), 0, "ARENA_TEST_BACKEND=cuda: %s", arena_last_error());
	cr_assert_str_eq(b->ops->name, "cuda");
	return b;
}

/* bf16 words of a layer's weights, N(0, 0.02), with what hb4 lists as
 * exceptions: outliers scattered, a run of them, the first and the last word;
 * zeros and tiny values (high bytes outside the 16 commonest) elsewhere. */
static uint8_t *bf16_weights(uint64_t words, uint32_t seed)
{
	uint8_t *b = malloc(2 * words);
	cr_assert_not_null(b);
	uint32_t x = seed * 2654435761u + 1;
	for (uint64_t i = 0; i < words; i++) {
		double u[2];
		for (int k = 0; k < 2; k++) {
			x ^= x << 13, x ^= x >> 17, x ^= x << 5;
			u[k] = (x + 1.0) / 4294967297.0;
		}
		float f = (float)(0.02 * sqrt(-2 * log(u[0])) * cos(6.283185307179586 * u[1]));
		if (i % 9973 == 5 || i == 0 || i == words - 1 || (i >= 1000 && i < 1037))
			f = i % 2 ? -3e30f : 1e30f;
		else if (i % 7919 == 3)
			f = 0;
		else if (i % 4999 == 7)
			f = 1e-30f;
		uint32_t w;
		memcpy(&w, &f, 4);
		b[2 * i] = (uint8_t)(w >> 16);
		b[2 * i + 1] = (uint8_t)(w >> 24);
	}
	return b;
}

static uint64_t exc_at(const arena_hb4 *v, uint64_t e)
{
	const uint8_t *p = v->exc_idx + 4 * e;
	return (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 24;
}

/* Exceptions with index in [w0, w1). */
static uint64_t exc_in(const arena_hb4 *v, uint64_t w0, uint64_t w1)
{
	uint64_t n = 0;
	for (uint64_t e = 0; e < v->n_exc; e++)
		n += exc_at(v, e) >= w0 && exc_at(v, e) < w1;
	return n;
}

#define MAX_RANGES 24
struct word_range {
	uint64_t w0, w1;
};

/* The word ranges to decode of a chunk: the whole, its ends, odd starts and
 * ends, a stretch with no exception, ranges that start or end at an
 * exception, an empty one. */
static size_t hb4_ranges(const arena_hb4 *v, struct word_range *r)
{
	const uint64_t W = v->words;
	size_t n = 0;
	cr_assert_geq(v->n_exc, 40, "the weights have exceptions (%llu)", (unsigned long long)v->n_exc);
	r[n++] = (struct word_range){0, W};
	r[n++] = (struct word_range){0, 1};
	r[n++] = (struct word_range){W - 1, W};
	r[n++] = (struct word_range){W - 2, W};
	r[n++] = (struct word_range){1, W};
	r[n++] = (struct word_range){0, W - 1};
	r[n++] = (struct word_range){3, 4100};
	r[n++] = (struct word_range){W / 3 | 1, 2 * W / 3};
	r[n++] = (struct word_range){W / 2, W / 2 + 1};
	r[n++] = (struct word_range){W / 2 + 1, W / 2 + 2};
	r[n++] = (struct word_range){999, 1038}; /* the run of exceptions and a word either side */
	/* Inside the widest gap between exceptions, from an odd word. */
	uint64_t g0 = 0, g1 = 0;
	for (uint64_t e = 0; e + 1 < v->n_exc; e++)
		if (exc_at(v, e + 1) - exc_at(v, e) > g1 - g0)
			g0 = exc_at(v, e), g1 = exc_at(v, e + 1);
	cr_assert_gt(g1 - g0, 100);
	uint64_t q0 = (g0 + 2) | 1;
	r[n++] = (struct word_range){q0, g1 - 1};
	cr_assert_eq(exc_in(v, q0, g1 - 1), 0);
	/* From an exception to one past another, and strictly between two. */
	uint64_t k1 = exc_at(v, v->n_exc / 3), k2 = exc_at(v, 2 * v->n_exc / 3);
	r[n++] = (struct word_range){k1, k2 + 1};
	r[n++] = (struct word_range){k1 + 1, k2};
	r[n++] = (struct word_range){k1, k1 + 1};
	r[n++] = (struct word_range){k2, W};
	r[n++] = (struct word_range){5, 5};
	cr_assert_leq(n, MAX_RANGES);
	return n;
}

/* Encode a chunk of W weights, copy it to the device at an odd offset, decode
 * each range: one at a time into a buffer of guard bytes (at even and odd
 * destinations; the guards must stay), then all of them queued back to back
 * from a parse that is overwritten once they are queued (the contract: v is
 * read while queueing, never after). */
static void check_decode(arena_backend *b, uint64_t W, uint32_t seed)
{
	const uint64_t len = 2 * W, guard = 64;
	uint8_t *raw = bf16_weights(W, seed), *st = malloc(len), *pat = malloc(len + 2 * guard);
	uint8_t *back = malloc(len + 2 * guard);
	cr_assert(st && pat && back);
	const uint64_t n = arena_hb4_encode(raw, len, st);
	cr_assert_gt(n, 0, "the weights are coded");
	cr_assert_lt(n, len * 0.8);
	arena_hb4 v;
	cr_assert_eq(arena_hb4_parse(st, n, len, "t", &v), 0, "%s", arena_last_error());
	struct word_range r[MAX_RANGES];
	const size_t nr = hb4_ranges(&v, r);
	memset(pat, 0xa5, len + 2 * guard);

	void *dsrc = NULL, *ddst = NULL, *dall = NULL;
	arena_stream *s = NULL;
	cr_assert_eq(b->ops->stream_create(b, &s), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->dev_alloc(b, n + 3, &dsrc), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->dev_alloc(b, len + 2 * guard, &ddst), 0, "%s", arena_last_error());
	uint8_t *src = (uint8_t *)dsrc + 3; /* the chunk at an odd device address */
	/* No sync between the copy and the first decode: the stream orders them. */
	cr_assert_eq(b->ops->copy_h2d(b, src, st, n, s), 0, "%s", arena_last_error());
	for (size_t i = 0; i < nr; i++) {
		const uint64_t a = 2 * r[i].w0, z = 2 * r[i].w1, at = guard - (i % 2); /* odd destinations too */
		cr_assert_eq(b->ops->copy_h2d(b, ddst, pat, len + 2 * guard, s), 0, "%s", arena_last_error());
		cr_assert_eq(b->ops->decode_hb4(b, (uint8_t *)ddst + at, src, &v, a, z, s), 0, "range [%llu, %llu): %s",
			     (unsigned long long)a, (unsigned long long)z, arena_last_error());
		cr_assert_eq(b->ops->stream_sync(b, s), 0, "%s", arena_last_error());
		cr_assert_eq(b->ops->copy_d2h_sync(b, back, ddst, len + 2 * guard), 0, "%s", arena_last_error());
		cr_assert_eq(memcmp(back + at, raw + a, z - a), 0, "W %llu: range [%llu, %llu) decodes wrong",
			     (unsigned long long)W, (unsigned long long)a, (unsigned long long)z);
		cr_assert_eq(memcmp(back, pat, at), 0, "range [%llu, %llu): written before dst", (unsigned long long)a,
			     (unsigned long long)z);
		cr_assert_eq(memcmp(back + at + (z - a), pat, len + 2 * guard - at - (z - a)), 0,
			     "range [%llu, %llu): written past dst + z - a", (unsigned long long)a, (unsigned long long)z);
	}

	/* All queued, then one sync; the host parse and its bytes are gone by then. */
	uint64_t total = 0;
	for (size_t i = 0; i < nr; i++)
		total += 2 * (r[i].w1 - r[i].w0) + 1;
	cr_assert_eq(b->ops->dev_alloc(b, total, &dall), 0, "%s", arena_last_error());
	uint8_t *st2 = malloc(n);
	arena_hb4 *v2 = malloc(sizeof(*v2));
	cr_assert(st2 && v2);
	memcpy(st2, st, n);
	cr_assert_eq(arena_hb4_parse(st2, n, len, "t", v2), 0, "%s", arena_last_error());
	uint64_t off = 0;
	for (size_t i = 0; i < nr; i++) {
		cr_assert_eq(b->ops->decode_hb4(b, (uint8_t *)dall + off, src, v2, 2 * r[i].w0, 2 * r[i].w1, s), 0, "%s",
			     arena_last_error());
		off += 2 * (r[i].w1 - r[i].w0) + 1;
	}
	memset(st2, 0xff, n);
	memset(v2, 0xff, sizeof(*v2));
	free(st2);
	free(v2);
	cr_assert_eq(b->ops->stream_sync(b, s), 0, "%s", arena_last_error());
	uint8_t *all = malloc(total);
	cr_assert_not_null(all);
	cr_assert_eq(b->ops->copy_d2h_sync(b, all, dall, total), 0, "%s", arena_last_error());
	off = 0;
	for (size_t i = 0; i < nr; i++) {
		const uint64_t a = 2 * r[i].w0, z = 2 * r[i].w1;
		cr_assert_eq(memcmp(all + off, raw + a, z - a), 0, "queued: range [%llu, %llu) decodes wrong",
			     (unsigned long long)a, (unsigned long long)z);
		off += z - a + 1;
	}
	free(all);
	b->ops->dev_free(b, dall);
	b->ops->dev_free(b, ddst);
	b->ops->dev_free(b, dsrc);
	b->ops->stream_destroy(b, s);
	free(raw);
	free(st);
	free(pat);
	free(back);
}

Test(backend, decode_hb4_ranges)
{
	arena_backend *b = test_backend();
	check_decode(b, 196608, 1); /* 384 KiB */
	check_decode(b, 65537, 2);  /* an odd word count: the last nibble byte is half used */
	arena_backend_destroy(b);
}

/* Two streams decoding from one chunk at once, each after an event of the
 * stream that copied it. */
Test(backend, decode_hb4_after_event)
{
	arena_backend *b = test_backend();
	const uint64_t W = 100001, len = 2 * W;
	uint8_t *raw = bf16_weights(W, 3), *st = malloc(len), *back = malloc(len);
	cr_assert(st && back);
	const uint64_t n = arena_hb4_encode(raw, len, st);
	arena_hb4 v;
	cr_assert_eq(arena_hb4_parse(st, n, len, "t", &v), 0, "%s", arena_last_error());
	void *dsrc = NULL, *ddst = NULL;
	arena_stream *sc = NULL, *s1 = NULL, *s2 = NULL;
	arena_event *e = NULL;
	cr_assert_eq(b->ops->dev_alloc(b, n, &dsrc), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->dev_alloc(b, len, &ddst), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->stream_create(b, &sc), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->stream_create(b, &s1), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->stream_create(b, &s2), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->event_create(b, &e), 0, "%s", arena_last_error());
	if (!test_on_cuda())
		sim_slow(b, sc); /* a decode that did not wait would read nothing yet */
	cr_assert_eq(b->ops->copy_h2d(b, dsrc, st, n, sc), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->event_record(b, e, sc), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->stream_wait(b, s1, e), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->stream_wait(b, s2, e), 0, "%s", arena_last_error());
	const uint64_t mid = 2 * (W / 2 | 1);
	cr_assert_eq(b->ops->decode_hb4(b, ddst, dsrc, &v, 0, mid, s1), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->decode_hb4(b, (uint8_t *)ddst + mid, dsrc, &v, mid, len, s2), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->stream_sync(b, s1), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->stream_sync(b, s2), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->copy_d2h_sync(b, back, ddst, len), 0, "%s", arena_last_error());
	cr_assert_eq(memcmp(back, raw, len), 0);
	b->ops->event_destroy(b, e);
	b->ops->stream_destroy(b, sc);
	b->ops->stream_destroy(b, s1);
	b->ops->stream_destroy(b, s2);
	b->ops->dev_free(b, dsrc);
	b->ops->dev_free(b, ddst);
	arena_backend_destroy(b);
	free(raw);
	free(st);
	free(back);
}

#define CHECK_USAGE(call, what)                                                                                 \
	do {                                                                                                     \
		arena_error_clear();                                                                             \
		int rc_ = (call);                                                                                \
		cr_assert_eq(rc_, ARENA_E_USAGE, "%s: %s (%s)", what, arena_err_name(rc_), arena_last_error()); \
		cr_assert(strstr(arena_last_error(), "decode_hb4"), "%s: message '%s'", what, arena_last_error()); \
	} while (0)

/* Bad arguments are USAGE with a message, queue nothing (on sim, device
 * pointers outside its allocations too). */
Test(backend, decode_hb4_bad_arguments)
{
	arena_backend *b = test_backend();
	const uint64_t W = 4097, len = 2 * W;
	uint8_t *raw = bf16_weights(W, 4), *st = malloc(len), *back = malloc(len);
	cr_assert(st && back);
	const uint64_t n = arena_hb4_encode(raw, len, st);
	arena_hb4 v;
	cr_assert_eq(arena_hb4_parse(st, n, len, "t", &v), 0, "%s", arena_last_error());
	void *dsrc = NULL, *ddst = NULL;
	arena_stream *s = NULL;
	cr_assert_eq(b->ops->dev_alloc(b, n, &dsrc), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->dev_alloc(b, len, &ddst), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->stream_create(b, &s), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->copy_h2d(b, dsrc, st, n, s), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->copy_h2d(b, ddst, raw, len, s), 0, "%s", arena_last_error());

	CHECK_USAGE(b->ops->decode_hb4(b, ddst, dsrc, &v, 1, 8, s), "odd a");
	CHECK_USAGE(b->ops->decode_hb4(b, ddst, dsrc, &v, 0, 7, s), "odd z");
	CHECK_USAGE(b->ops->decode_hb4(b, ddst, dsrc, &v, 8, 6, s), "a after z");
	CHECK_USAGE(b->ops->decode_hb4(b, ddst, dsrc, &v, 0, len + 2, s), "z beyond the chunk");
	CHECK_USAGE(b->ops->decode_hb4(b, ddst, dsrc, &v, len + 2, len + 2, s), "an empty range beyond the chunk");
	CHECK_USAGE(b->ops->decode_hb4(b, ddst, dsrc, NULL, 0, 2, s), "no chunk");
	CHECK_USAGE(b->ops->decode_hb4(b, NULL, dsrc, &v, 0, 2, s), "no destination");
	CHECK_USAGE(b->ops->decode_hb4(b, ddst, NULL, &v, 0, 2, s), "no source");
	arena_hb4 bad = v;
	bad.low_off += 16;
	CHECK_USAGE(b->ops->decode_hb4(b, ddst, dsrc, &bad, 0, 2, s), "offsets that are not the counts'");
	bad = v;
	bad.n_exc++;
	CHECK_USAGE(b->ops->decode_hb4(b, ddst, dsrc, &bad, 0, 2, s), "exceptions that are not the offsets'");
	bad = v;
	bad.words = 0;
	CHECK_USAGE(b->ops->decode_hb4(b, ddst, dsrc, &bad, 0, 0, s), "no words");
	if (!test_on_cuda()) {
		CHECK_USAGE(b->ops->decode_hb4(b, ddst, st, &v, 0, 2, s), "a source in host memory");
		CHECK_USAGE(b->ops->decode_hb4(b, ddst, (uint8_t *)dsrc + 256, &v, 0, 2, s), /* past the rounding too */
			    "a source whose chunk ends past its allocation");
		CHECK_USAGE(b->ops->decode_hb4(b, back, dsrc, &v, 0, 2, s), "a destination in host memory");
		CHECK_USAGE(b->ops->decode_hb4(b, (uint8_t *)ddst + 256, dsrc, &v, 0, len, s),
			    "a destination that ends past its allocation");
	}
	/* An empty range is a no-op; a good call still works after the bad ones. */
	cr_assert_eq(b->ops->decode_hb4(b, ddst, dsrc, &v, 6, 6, s), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->decode_hb4(b, (uint8_t *)ddst + 2, dsrc, &v, 2, len, s), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->stream_sync(b, s), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->copy_d2h_sync(b, back, ddst, len), 0, "%s", arena_last_error());
	cr_assert_eq(memcmp(back, raw, len), 0, "nothing bad was queued");
	b->ops->stream_destroy(b, s);
	b->ops->dev_free(b, dsrc);
	b->ops->dev_free(b, ddst);
	arena_backend_destroy(b);
	free(raw);
	free(st);
	free(back);
}

/* sim: the decode is device work, not booked on the copy engine: at 10 MB/s
 * the 8 MB it writes would take 0.8 s as copies; it takes far less. */
Test(backend, sim_decode_hb4_is_not_a_copy)
{
	arena_backend *b = sim(64 * MiB, 10e6);
	const uint64_t W = 100000, len = 2 * W;
	uint8_t *raw = bf16_weights(W, 5), *st = malloc(len), *back = malloc(len);
	cr_assert(st && back);
	const uint64_t n = arena_hb4_encode(raw, len, st);
	arena_hb4 v;
	cr_assert_eq(arena_hb4_parse(st, n, len, "t", &v), 0, "%s", arena_last_error());
	void *dsrc = NULL, *ddst = NULL;
	arena_stream *s = NULL;
	arena_event *t0 = NULL, *t1 = NULL;
	cr_assert_eq(b->ops->dev_alloc(b, n, &dsrc), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->dev_alloc(b, len, &ddst), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->stream_create(b, &s), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->event_create_timed(b, &t0), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->event_create_timed(b, &t1), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->copy_h2d(b, dsrc, st, n, s), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->event_record(b, t0, s), 0, "%s", arena_last_error());
	for (int i = 0; i < 40; i++)
		cr_assert_eq(b->ops->decode_hb4(b, ddst, dsrc, &v, 0, len, s), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->event_record(b, t1, s), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->stream_sync(b, s), 0, "%s", arena_last_error());
	double t = -1;
	cr_assert_eq(b->ops->event_elapsed(b, t0, t1, &t), 0, "%s", arena_last_error());
	cr_assert_lt(t, 0.4, "40 decodes of %llu bytes took %.3f s", (unsigned long long)len, t);
	cr_assert_eq(b->ops->copy_d2h_sync(b, back, ddst, len), 0, "%s", arena_last_error());
	cr_assert_eq(memcmp(back, raw, len), 0);
	b->ops->event_destroy(b, t0);
	b->ops->event_destroy(b, t1);
	b->ops->stream_destroy(b, s);
	b->ops->dev_free(b, dsrc);
	b->ops->dev_free(b, ddst);
	arena_backend_destroy(b);
	free(raw);
	free(st);
	free(back);
}

/* sim: a decode whose chunk never reached the device (no copy before it) is
 * the caller's bug; the sim says so instead of following garbage exception
 * indices through host memory. (The tests of a BUG() take its message off
 * stderr: it is what they expect.) */
Test(backend, sim_decode_hb4_before_its_copy_is_a_bug, .signal = SIGABRT, .init = cr_redirect_stderr)
{
	arena_backend *b = sim(64 * MiB, 0);
	const uint64_t W = 4097, len = 2 * W;
	uint8_t *raw = bf16_weights(W, 6), *st = malloc(len), *junk = malloc(len);
	cr_assert(st && junk);
	const uint64_t n = arena_hb4_encode(raw, len, st);
	arena_hb4 v;
	cr_assert_eq(arena_hb4_parse(st, n, len, "t", &v), 0, "%s", arena_last_error());
	fill(junk, len, 9);
	void *dsrc = NULL, *ddst = NULL;
	arena_stream *s = NULL;
	cr_assert_eq(b->ops->dev_alloc(b, n, &dsrc), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->dev_alloc(b, len, &ddst), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->stream_create(b, &s), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->copy_h2d(b, dsrc, junk, n, s), 0, "%s", arena_last_error());
	cr_assert_eq(b->ops->decode_hb4(b, ddst, dsrc, &v, 0, len, s), 0, "%s", arena_last_error());
	b->ops->stream_sync(b, s);
	cr_assert_fail("the decode of junk ran");
}
