/* test_rest.c - the process's device memory on sim: a cap counts the
 * context, the rest of the process (a modelled framework allocator whose
 * demand changes from step to step) and arena's own, at its peak; the rest's
 * need is learned per work; pressure from outside demotes and promotes.
 *
 * The modelled framework behaves as torch's caching allocator under
 * arena.torch: it holds its peak of a step as a cache after it, and it never
 * holds more than the limit arena gives it for a step (rest_limit: torch's
 * per-process memory fraction); a demand past the limit is refused there, as
 * torch raises out of memory, and reported as the step's peak. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <string.h>

#include "arena.h"
#include "../../convert/convert.h"
#include "testutil.h"

static char dir[256];
static const char *img;

static void setup(void)
{
	tmpdir_make(dir, sizeof(dir), "test-rest");
	const char *in = fixture_path("tiny_flux.safetensors");
	img = tmpdir_file(dir, "r.arena");
	arena_convert_opts co = {.chunk_size = 64 << 10, .threads = 1};
	cr_assert_eq(arena_convert_inputs(&in, 1, img, &co, NULL), 0, "%s", arena_last_error());
}

static void teardown(void)
{
	tmpdir_remove(dir);
}

TestSuite(rest, .init = setup, .fini = teardown);

#define KiB(x) ((uint64_t)(x) << 10)
#define CONTEXT KiB(24)

/* The tiny model: 300 KiB in all (globals 50 KiB, two double blocks of 77
 * KiB, three single blocks of 32 KiB). A big simulated card under a cap, a
 * context, learning on. */
static arena *open_capped(uint64_t cap, unsigned flags)
{
	arena_open_options o = {.backend = "sim",
				.vram_cap = cap,
				.sim_capacity = 64ull << 20,
				.sim_context = CONTEXT,
				.flags = ARENA_OPEN_LEARN_REST | flags};
	arena *a = NULL;
	cr_assert_eq(arena_open(img, &o, &a), 0, "%s", arena_last_error());
	return a;
}

/* The modelled framework allocator. */
typedef struct fake {
	uint64_t held; /* what it holds now (its cache) */
	uint64_t peak; /* the most it held since the last report */
	int refused;   /* demands refused past the limit (torch's out of memory) */
} fake;

/* Hold `bytes` now (a demand: the cache grows to it; less: the cache stays). */
static void fake_need(arena *a, fake *f, uint64_t bytes)
{
	if (bytes <= f->held)
		return;
	arena_memory_info mi;
	cr_assert_eq(arena_memory_get(a, &mi), 0, "%s", arena_last_error());
	if (mi.rest_limit && bytes > mi.rest_limit) {
		f->refused++;
		if (bytes > f->peak) /* the step needed that much: it is reported */
			f->peak = bytes;
		return;
	}
	cr_assert_eq(arena_sim_rest(a, bytes), 0, "%s", arena_last_error());
	f->held = bytes;
	if (bytes > f->peak)
		f->peak = bytes;
}

/* One sample step over every block in order, the framework needing
 * `demand` while block 2 runs; the report names the next step's work. */
static void step(arena *a, fake *f, uint64_t demand, uint64_t next_work)
{
	cr_assert_eq(arena_step_begin(a), 0, "%s", arena_last_error());
	size_t n = arena_block_count(a);
	for (size_t b = 1; b < n; b++) {
		void *d;
		cr_assert_eq(arena_block_acquire(a, b, NULL, &d), 0, "%s", arena_last_error());
		if (b == 2)
			fake_need(a, f, demand);
		cr_assert_eq(arena_block_release(a, b, NULL), 0, "%s", arena_last_error());
	}
	arena_rest_info r = {f->held, f->peak, next_work, 0};
	cr_assert_eq(arena_rest_report(a, &r), 0, "%s", arena_last_error());
	f->peak = f->held;
	cr_assert_eq(arena_step_end(a), 0, "%s", arena_last_error());
}

static uint64_t peak_and_reset(arena *a)
{
	uint64_t p;
	cr_assert_eq(arena_sim_peak(a, 1, &p), 0, "%s", arena_last_error());
	return p;
}

static uint64_t resident(arena *a)
{
	arena_plan_info p;
	cr_assert_eq(arena_plan_get(a, &p), 0, "%s", arena_last_error());
	return p.resident_bytes;
}

Test(rest, the_context_counts_and_other_is_measured)
{
	arena *a = open_capped(KiB(600), 0);
	arena_memory_info mi;
	cr_assert_eq(arena_memory_get(a, &mi), 0, "%s", arena_last_error());
	cr_assert_eq(mi.cap, KiB(600));
	cr_assert_eq(mi.other, CONTEXT, "other %llu", (unsigned long long)mi.other);
	cr_assert(mi.other_measured);
	cr_assert_eq(mi.process, mi.other + mi.rest + mi.arena);
	cr_assert_eq(mi.learned, 0);
	cr_assert(mi.rest_limit > 0 && mi.rest_limit <= mi.cap - mi.other - mi.arena);
	fake f = {0};
	step(a, &f, KiB(40), 0);
	cr_assert_eq(arena_memory_get(a, &mi), 0, "%s", arena_last_error());
	cr_assert_eq(mi.rest, KiB(40));
	cr_assert_eq(mi.process, CONTEXT + KiB(40) + mi.arena);
	cr_assert(mi.learned);
	cr_assert_eq(mi.works, 1);
	cr_assert_geq(mi.rest_need, KiB(40));
	arena_memory_info null;
	cr_assert_eq(arena_memory_get(a, NULL), ARENA_E_USAGE);
	cr_assert_eq(arena_rest_report(a, NULL), ARENA_E_USAGE);
	(void)null;
	arena_close(a);
}

/* A cap that holds the model beside a small rest but not beside an unknown
 * one: the first step runs the smallest plan, the steps after it what the
 * learned need leaves; the process stays within the cap at every step. */
Test(rest, a_learned_reserve_never_lets_the_process_pass_the_cap)
{
	const uint64_t cap = KiB(480);
	arena *a = open_capped(cap, 0);
	uint64_t r0 = resident(a);
	fake f = {0};
	for (int k = 0; k < 8; k++) {
		step(a, &f, KiB(60), 0);
		uint64_t p = peak_and_reset(a);
		cr_assert_leq(p, cap, "step %d: the process peaked at %llu over the cap %llu", k, (unsigned long long)p,
			      (unsigned long long)cap);
	}
	cr_assert_eq(f.refused, 0);
	cr_assert_gt(resident(a), r0, "nothing was promoted once the rest's need was known (%llu resident)",
		     (unsigned long long)resident(a));
	arena_memory_info mi;
	cr_assert_eq(arena_memory_get(a, &mi), 0, "%s", arena_last_error());
	cr_assert(mi.learned);
	cr_assert_leq(mi.other + mi.arena + mi.rest_need + mi.headroom, cap);
	arena_close(a);
}

/* A new work (a larger resolution) is planned as unknown: the step before
 * it demotes to the smallest plan, so its larger demand fits; then it is
 * learned, and going back to the first work plans by what it learned. */
Test(rest, a_new_work_runs_the_safe_plan_then_is_learned)
{
	const uint64_t cap = KiB(480);
	arena *a = open_capped(cap, 0);
	fake f = {0};
	arena_rest_info r = {0, 0, 1, 0}; /* between steps: the first step's work */
	cr_assert_eq(arena_rest_report(a, &r), 0, "%s", arena_last_error());
	for (int k = 0; k < 4; k++)
		step(a, &f, KiB(40), k == 3 ? 2 : 1); /* the last report names work 2 */
	arena_memory_info mi;
	cr_assert_eq(arena_memory_get(a, &mi), 0, "%s", arena_last_error());
	cr_assert_eq(mi.learned, 0, "work 2 was not seen: its plan is the safe one");
	cr_assert_geq(mi.rest_limit, KiB(160), "the safe plan leaves the rest %llu", (unsigned long long)mi.rest_limit);
	for (int k = 0; k < 4; k++) {
		step(a, &f, KiB(160), k == 3 ? 1 : 2); /* then back to work 1 */
		cr_assert_leq(peak_and_reset(a), cap);
	}
	cr_assert_eq(f.refused, 0, "a demand of the new work was refused");
	cr_assert_eq(arena_memory_get(a, &mi), 0, "%s", arena_last_error());
	cr_assert(mi.learned);
	cr_assert_eq(mi.works, 2);
	step(a, &f, KiB(40), 0);
	cr_assert_leq(peak_and_reset(a), cap);
	arena_close(a);
}

/* The same work needing more than it did (nothing told the engine): the
 * modelled framework is refused past its limit once (torch would raise out
 * of memory, and arena.torch says what the step needed); reported as the
 * step's peak, the next step has room for it. The cap holds throughout. */
Test(rest, a_demand_that_grows_is_refused_once_then_learned)
{
	const uint64_t cap = KiB(480);
	arena *a = open_capped(cap, 0);
	fake f = {0};
	for (int k = 0; k < 4; k++)
		step(a, &f, KiB(40), 0);
	arena_memory_info mi;
	cr_assert_eq(arena_memory_get(a, &mi), 0, "%s", arena_last_error());
	uint64_t more = mi.rest_limit + KiB(8);
	cr_assert_lt(more + CONTEXT + KiB(50) + KiB(3 * 77), cap, "(the test's demand must fit beside the smallest plan)");
	step(a, &f, more, 0);
	cr_assert_eq(f.refused, 1);
	cr_assert_leq(peak_and_reset(a), cap);
	for (int k = 0; k < 3; k++) {
		step(a, &f, more, 0);
		cr_assert_leq(peak_and_reset(a), cap);
	}
	cr_assert_eq(f.refused, 1, "the grown demand was refused again after it was reported");
	arena_close(a);
}

Test(rest, a_cap_too_small_is_refused_at_open_saying_the_smallest_that_works)
{
	arena_open_options o = {.backend = "sim",
				.vram_cap = KiB(160),
				.sim_capacity = 64ull << 20,
				.sim_context = CONTEXT,
				.flags = ARENA_OPEN_LEARN_REST};
	arena *a = (arena *)1;
	cr_assert_eq(arena_open(img, &o, &a), ARENA_E(BUDGET));
	cr_assert_null(a);
	const char *m = arena_last_error();
	cr_assert(strstr(m, "at least"), "%s", m);
	cr_assert_null(strchr(m, '\n'), "one line: %s", m);
	/* what it says is enough is enough for the weights */
	const char *p = strstr(m, "at least ");
	char num[64] = "";
	cr_assert(sscanf(p + 9, "%63s", num) == 1);
}

/* No cap: the budget follows the device's free memory; another program
 * taking memory between steps demotes blocks, giving it back promotes them
 * again, and the rest's learned need stays planned for throughout. */
Test(rest, pressure_demotes_and_room_promotes_under_a_learned_reserve)
{
	arena_open_options o = {.backend = "sim",
				.sim_capacity = KiB(640),
				.sim_context = CONTEXT,
				.hysteresis = 1,
				.flags = ARENA_OPEN_LEARN_REST};
	arena *a = NULL;
	cr_assert_eq(arena_open(img, &o, &a), 0, "%s", arena_last_error());
	fake f = {0};
	for (int k = 0; k < 3; k++)
		step(a, &f, KiB(60), 0);
	uint64_t before = resident(a);
	arena_plan_info pl;
	cr_assert_eq(arena_plan_get(a, &pl), 0, "%s", arena_last_error());
	cr_assert_eq(pl.n_streamed, 0, "(everything fits beside the rest at first)");
	/* another program takes most of what is free: the weights must give way */
	cr_assert_eq(arena_sim_pressure(a, KiB(250)), 0, "%s", arena_last_error());
	step(a, &f, KiB(60), 0);
	step(a, &f, KiB(60), 0);
	cr_assert_lt(resident(a), before, "pressure demoted nothing");
	cr_assert_eq(f.refused, 0);
	cr_assert_eq(arena_sim_pressure(a, 0), 0, "%s", arena_last_error());
	for (int k = 0; k < 4; k++)
		step(a, &f, KiB(60), 0);
	cr_assert_eq(resident(a), before, "room did not promote the blocks back");
	cr_assert_eq(f.refused, 0);
	arena_close(a);
}

/* An explicit reserve is used as it is: nothing learned, the default
 * behaviour of a caller that reports only what the rest holds now. */
Test(rest, an_explicit_reserve_learns_nothing)
{
	arena_open_options o = {.backend = "sim",
				.vram_cap = KiB(600),
				.sim_capacity = 64ull << 20,
				.sim_context = CONTEXT,
				.reserve = KiB(100),
				.flags = ARENA_OPEN_LEARN_REST};
	arena *a = NULL;
	cr_assert_eq(arena_open(img, &o, &a), 0, "%s", arena_last_error());
	fake f = {0};
	step(a, &f, KiB(40), 0);
	arena_memory_info mi;
	cr_assert_eq(arena_memory_get(a, &mi), 0, "%s", arena_last_error());
	cr_assert_eq(mi.learned, 0);
	cr_assert_eq(mi.works, 0);
	cr_assert_eq(mi.rest_need, KiB(100));
	arena_close(a);
}
