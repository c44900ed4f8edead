/* test_decide.c - the record of decisions and share_card, through the
 * public API on sim: each cause provoked (another program's pressure, the
 * rest's need learned or told, an out-of-memory reported, a mode, a profile)
 * leaves one record saying why, what moved and the budget it was made for;
 * with share_card the plan leaves the share free at every step end and
 * gives memory back when another program takes it (why "yield"), where
 * without it arena only gives way to what it needs.
 *
 * The model is tiny_flux (300 KiB: globals of about 50 KiB, two double
 * blocks of 74 KiB, three single blocks of 31 KiB), in pieces of 16 KiB,
 * so that the plans move a little at a time. */
#include <criterion/criterion.h>

#include <string.h>

#include "arena.h"
#include "../../convert/convert.h"
#include "testutil.h"

static char dir[256];
static const char *img;

static void setup(void)
{
	tmpdir_make(dir, sizeof(dir), "test-decide");
	const char *in = fixture_path("tiny_flux.safetensors");
	img = tmpdir_file(dir, "d.arena");
	arena_convert_opts co = {.chunk_size = 64 << 10, .threads = 1};
	cr_assert_eq(arena_convert_inputs(&in, 1, img, &co, NULL), 0, "%s", arena_last_error());
}

static void teardown(void)
{
	tmpdir_remove(dir);
}

TestSuite(decide, .init = setup, .fini = teardown);

#define KiB(x) ((uint64_t)(x) << 10)

/* No cap: a simulated card of 640 KiB, the rest's reserve 100 KiB, no
 * headroom (the budget is free + arena's own - 100 KiB - the share), the
 * model in pieces of 16 KiB, promotions one step after room appears. */
static arena *open_free(uint64_t share)
{
	arena_open_options o = {.backend = "sim",
				.sim_capacity = KiB(640),
				.reserve = KiB(100),
				.headroom = ARENA_ZERO_BYTES,
				.piece_size = KiB(16),
				.hysteresis = 1,
				.share_card = share,
				.flags = ARENA_OPEN_NO_LEARN};
	arena *a = NULL;
	cr_assert_eq(arena_open(img, &o, &a), 0, "%s", arena_last_error());
	return a;
}

/* One sample step over every block but the globals, in order. */
static void step(arena *a)
{
	cr_assert_eq(arena_step_begin(a), 0, "%s", arena_last_error());
	size_t n = arena_block_count(a);
	for (size_t b = 0; b < n; b++) {
		arena_block_info bi;
		cr_assert_eq(arena_block_get(a, b, &bi), 0, "%s", arena_last_error());
		if (!bi.container)
			continue;
		void *d;
		cr_assert_eq(arena_block_acquire(a, b, NULL, &d), 0, "%s", arena_last_error());
		cr_assert_eq(arena_block_release(a, b, NULL), 0, "%s", arena_last_error());
	}
	cr_assert_eq(arena_step_end(a), 0, "%s", arena_last_error());
}

static arena_plan_info plan(arena *a)
{
	arena_plan_info p;
	cr_assert_eq(arena_plan_get(a, &p), 0, "%s", arena_last_error());
	return p;
}

static uint64_t free_now(arena *a)
{
	uint64_t f, t;
	cr_assert_eq(arena_device_memory(a, &f, &t), 0, "%s", arena_last_error());
	return f;
}

static arena_decision_info decision(arena *a, uint64_t i)
{
	arena_decision_info d;
	cr_assert_eq(arena_decision_get(a, i, &d), 0, "decision %llu: %s", (unsigned long long)i, arena_last_error());
	return d;
}

/* Each record says what it moved, consistently. */
static void check_record(const arena_decision_info *d)
{
	cr_assert_str_neq(d->why_name, "?");
	cr_assert(d->promoted || d->demoted || d->ring_before != d->ring_after, "a record of nothing (%s)", d->why_name);
	cr_assert_eq(d->resident_after + d->demoted_bytes, d->resident_before + d->promoted_bytes,
		     "%s: resident %llu -> %llu, promoted %llu, demoted %llu", d->why_name,
		     (unsigned long long)d->resident_before, (unsigned long long)d->resident_after,
		     (unsigned long long)d->promoted_bytes, (unsigned long long)d->demoted_bytes);
	cr_assert_eq(!d->promoted, !d->promoted_bytes);
	cr_assert_eq(!d->demoted, !d->demoted_bytes);
}

/* Another program takes most of the free memory between steps: the next
 * step end demotes, one record saying "pressure" with the budget and the
 * free memory it read; the memory given back promotes again, recorded so. */
Test(decide, another_programs_pressure_is_recorded_both_ways)
{
	arena *a = open_free(0);
	step(a);
	step(a);
	cr_assert_eq(arena_decision_count(a), 0, "nothing changed: no decision");
	const arena_plan_info p0 = plan(a);
	cr_assert_eq(p0.n_streamed, 0, "(all of it fits at first)");
	cr_assert_eq(arena_sim_pressure(a, KiB(300)), 0, "%s", arena_last_error());
	step(a); /* step 2: its end reads the pressure */
	cr_assert_eq(arena_decision_count(a), 1);
	arena_decision_info d = decision(a, 0);
	check_record(&d);
	cr_assert_eq(d.why, ARENA_WHY_PRESSURE, "why %s", d.why_name);
	cr_assert_str_eq(d.why_name, "pressure");
	cr_assert_eq(d.step, 2);
	cr_assert_eq(d.between, 0);
	cr_assert_gt(d.demoted, 0);
	cr_assert_eq(d.promoted, 0);
	cr_assert_eq(d.resident_before, p0.resident_bytes);
	cr_assert_eq(d.resident_after, plan(a).resident_bytes);
	cr_assert_eq(d.ring_before, 0);
	cr_assert_gt(d.ring_after, 0, "what streams goes through a ring made then");
	cr_assert_eq(d.stream_before, 0);
	cr_assert_gt(d.stream_after, 0, "the blocks demoted stream each step from then on");
	cr_assert_eq(d.free_bytes, KiB(640) - KiB(300) - p0.resident_bytes, "the free memory read at the step end");
	cr_assert_eq(d.budget, d.free_bytes + p0.resident_bytes - KiB(100));
	cr_assert_leq(d.resident_after + d.ring_after, d.budget);
	arena_step_info r;
	cr_assert_eq(arena_step_get(a, 2, &r), 0, "%s", arena_last_error());
	cr_assert_eq(r.demotions, d.demoted, "the step's record counts the decision's moves");
	step(a);
	cr_assert_eq(arena_decision_count(a), 1, "the plan holds under the same pressure");
	cr_assert_eq(arena_sim_pressure(a, 0), 0, "%s", arena_last_error());
	step(a);
	step(a);
	cr_assert_eq(arena_decision_count(a), 2);
	d = decision(a, 1);
	check_record(&d);
	cr_assert_eq(d.why, ARENA_WHY_PRESSURE, "the room came back: why %s", d.why_name);
	cr_assert_gt(d.promoted, 0);
	cr_assert_eq(d.demoted, 0);
	cr_assert_eq(d.resident_after, p0.resident_bytes, "everything is back");
	cr_assert_eq(d.ring_after, 0);
	cr_assert_eq(arena_decision_get(a, 2, &d), ARENA_E(NOT_FOUND));
	cr_assert_eq(arena_decision_get(a, 0, NULL), ARENA_E_USAGE);
	arena_close(a);
	cr_assert_eq(arena_decision_count(a), 0, "(a closed handle: 0)");
}

/* share_card: the plan leaves the share free at every step end; another
 * program that takes some of it makes the next step end give memory back
 * (why "yield") until the share is free again, and the free memory at
 * every step end is at least the share, or the plan is its smallest. The
 * same pressure without share_card moves nothing: arena needs no more than
 * it has. */
Test(decide, share_card_leaves_its_share_free_and_yields_to_another_program)
{
	const uint64_t share = KiB(200);
	for (int with = 0; with < 2; with++) {
		arena *a = open_free(with ? share : 0);
		arena_memory_info mi;
		cr_assert_eq(arena_memory_get(a, &mi), 0, "%s", arena_last_error());
		cr_assert_eq(mi.share_card, with ? share : 0);
		step(a);
		cr_assert_geq(free_now(a), with ? share : 0);
		const arena_plan_info p0 = plan(a);
		cr_assert_eq(p0.n_streamed, 0, "(the model fits beside the share)");
		/* another program takes what is free past the share and more: the
		 * free memory falls under the share (the rest's reserve of 100 KiB
		 * and the share were free) */
		cr_assert_eq(arena_sim_pressure(a, KiB(160)), 0, "%s", arena_last_error());
		if (with)
			cr_assert_lt(free_now(a), share);
		step(a);
		if (!with) {
			cr_assert_eq(arena_decision_count(a), 0, "without share_card the pressure moved blocks");
			cr_assert_eq(plan(a).resident_bytes, p0.resident_bytes);
			arena_close(a);
			continue;
		}
		cr_assert_eq(arena_decision_count(a), 1);
		arena_decision_info d = decision(a, 0);
		check_record(&d);
		cr_assert_eq(d.why, ARENA_WHY_YIELD, "why %s", d.why_name);
		cr_assert_str_eq(d.why_name, "yield");
		cr_assert_eq(d.step, 1);
		cr_assert_gt(d.demoted, 0);
		cr_assert_geq(free_now(a), share, "free %llu after the yield, under the share %llu",
			      (unsigned long long)free_now(a), (unsigned long long)share);
		/* more: as far as the smallest plan goes */
		cr_assert_eq(arena_sim_pressure(a, KiB(310)), 0, "%s", arena_last_error());
		step(a);
		arena_plan_info p = plan(a);
		cr_assert(free_now(a) >= share || p.need_bytes == p.min_need_bytes,
			  "free %llu, under the share, and the plan (%llu) is not the smallest (%llu)",
			  (unsigned long long)free_now(a), (unsigned long long)p.need_bytes,
			  (unsigned long long)p.min_need_bytes);
		cr_assert_eq(arena_decision_count(a), 2);
		d = decision(a, 1);
		cr_assert_eq(d.why, ARENA_WHY_YIELD, "why %s", d.why_name);
		/* the other program gives its memory back: the weights come back, the share still free */
		cr_assert_eq(arena_sim_pressure(a, 0), 0, "%s", arena_last_error());
		step(a);
		step(a);
		cr_assert_eq(plan(a).resident_bytes, p0.resident_bytes);
		cr_assert_geq(free_now(a), share);
		d = decision(a, arena_decision_count(a) - 1);
		cr_assert_eq(d.why, ARENA_WHY_PRESSURE, "why %s", d.why_name);
		cr_assert_gt(d.promoted, 0);
		arena_close(a);
	}
}

Test(decide, share_card_options)
{
	arena_open_options o = {.backend = "sim", .sim_capacity = KiB(640), .share_card = ARENA_SHARE_CARD_DEFAULT};
	arena *a = NULL;
	cr_assert_eq(arena_open(img, &o, &a), 0, "%s", arena_last_error());
	arena_memory_info mi;
	cr_assert_eq(arena_memory_get(a, &mi), 0, "%s", arena_last_error());
	cr_assert_eq(mi.share_card, KiB(64), "the default: a tenth of the device (under 2 GiB)");
	arena_close(a);
	o.sim_capacity = 64ull << 30;
	cr_assert_eq(arena_open(img, &o, &a), 0, "%s", arena_last_error());
	cr_assert_eq(arena_memory_get(a, &mi), 0, "%s", arena_last_error());
	cr_assert_eq(mi.share_card, 2ull << 30, "the default: at most 2 GiB");
	arena_close(a);
	o = (arena_open_options){.backend = "sim", .sim_capacity = KiB(640), .share_card_fraction = 0.25};
	cr_assert_eq(arena_open(img, &o, &a), 0, "%s", arena_last_error());
	cr_assert_eq(arena_memory_get(a, &mi), 0, "%s", arena_last_error());
	cr_assert_eq(mi.share_card, KiB(160));
	arena_close(a);
	/* refused: with a cap, a fraction out of range, both given */
	const arena_open_options bad[] = {
		{.backend = "sim", .vram_cap = KiB(600), .share_card = KiB(100)},
		{.backend = "sim", .vram_cap = KiB(600), .share_card_fraction = 0.1},
		{.backend = "sim", .share_card_fraction = 1},
		{.backend = "sim", .share_card_fraction = -0.5},
		{.backend = "sim", .share_card = KiB(100), .share_card_fraction = 0.1},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		a = (arena *)1;
		cr_assert_eq(arena_open(img, &bad[i], &a), ARENA_E_USAGE, "case %zu", i);
		cr_assert_null(a);
		cr_assert(strstr(arena_last_error(), "share_card"), "case %zu: %s", i, arena_last_error());
	}
	cr_assert(strstr(arena_last_error(), "give one"), "%s", arena_last_error());
	/* a share that leaves the model no room: BUDGET, saying so */
	o = (arena_open_options){.backend = "sim", .sim_capacity = KiB(640), .share_card = KiB(600)};
	cr_assert_eq(arena_open(img, &o, &a), ARENA_E(BUDGET));
	cr_assert(strstr(arena_last_error(), "share_card left free"), "%s", arena_last_error());
}

/* The rest's need under a cap, learned per work (ARENA_OPEN_LEARN_REST): the
 * first step runs the safe plan, its end learns the need and promotes (why
 * "need"); a new work told between steps plans the safe plan at once
 * (demotions then, between steps); a need reported with ARENA_REST_OOM, at
 * a step's end or between steps, demotes with why "oom", between steps at
 * once, leaving the rest that room. */
static arena *open_capped(uint64_t cap)
{
	arena_open_options o = {.backend = "sim",
				.vram_cap = cap,
				.sim_capacity = 64ull << 20,
				.sim_context = KiB(24),
				.piece_size = KiB(16),
				.hysteresis = 1,
				.flags = ARENA_OPEN_LEARN_REST | ARENA_OPEN_NO_LEARN};
	arena *a = NULL;
	cr_assert_eq(arena_open(img, &o, &a), 0, "%s", arena_last_error());
	return a;
}

static void report(arena *a, uint64_t now, uint64_t peak, uint64_t work, unsigned flags)
{
	arena_rest_info r = {now, peak, work, flags};
	cr_assert_eq(arena_rest_report(a, &r), 0, "%s", arena_last_error());
}

/* A step whose rest held `peak` at most, told at its end. */
static void step_told(arena *a, uint64_t peak, uint64_t next_work, unsigned flags)
{
	cr_assert_eq(arena_step_begin(a), 0, "%s", arena_last_error());
	size_t n = arena_block_count(a);
	for (size_t b = 0; b < n; b++) {
		arena_block_info bi;
		cr_assert_eq(arena_block_get(a, b, &bi), 0, "%s", arena_last_error());
		void *d;
		if (!bi.container)
			continue;
		cr_assert_eq(arena_block_acquire(a, b, NULL, &d), 0, "%s", arena_last_error());
		cr_assert_eq(arena_block_release(a, b, NULL), 0, "%s", arena_last_error());
	}
	report(a, KiB(40), peak, next_work, flags);
	cr_assert_eq(arena_step_end(a), 0, "%s", arena_last_error());
}

Test(decide, the_rests_need_and_its_out_of_memory_are_recorded)
{
	arena *a = open_capped(KiB(480));
	cr_assert_eq(arena_sim_rest(a, KiB(40)), 0, "%s", arena_last_error());
	const uint64_t r0 = plan(a).resident_bytes;
	step_told(a, KiB(40), 0, 0); /* step 0: the need learned */
	cr_assert_eq(arena_decision_count(a), 1);
	arena_decision_info d = decision(a, 0);
	check_record(&d);
	cr_assert_eq(d.why, ARENA_WHY_NEED, "why %s", d.why_name);
	cr_assert_eq(d.step, 0);
	cr_assert_eq(d.between, 0);
	cr_assert_gt(d.promoted, 0, "the learned need left the weights room");
	cr_assert_eq(d.resident_before, r0);
	step_told(a, KiB(40), 0, 0);
	cr_assert_eq(arena_decision_count(a), 1, "a steady work: no decision");
	const uint64_t full = plan(a).resident_bytes;

	/* torch ran out: what it needed, reported at the step's end */
	arena_memory_info mi;
	cr_assert_eq(arena_memory_get(a, &mi), 0, "%s", arena_last_error());
	const uint64_t more = mi.rest_limit + KiB(32);
	step_told(a, more, 0, ARENA_REST_OOM); /* step 2 */
	cr_assert_eq(arena_decision_count(a), 2);
	d = decision(a, 1);
	check_record(&d);
	cr_assert_eq(d.why, ARENA_WHY_OOM, "why %s", d.why_name);
	cr_assert_str_eq(d.why_name, "oom");
	cr_assert_eq(d.step, 2);
	cr_assert_eq(d.between, 0);
	cr_assert_gt(d.demoted, 0);
	cr_assert_eq(arena_memory_get(a, &mi), 0, "%s", arena_last_error());
	cr_assert_geq(mi.rest_limit, more, "the next step leaves torch what it needed");
	step_told(a, more, 0, 0);
	cr_assert_eq(arena_decision_count(a), 2, "learned: the same need moves nothing");

	/* ... and between steps: planned for at once */
	const uint64_t most = mi.rest_limit + KiB(32);
	const uint64_t steps = arena_step_count(a);
	report(a, KiB(40), most, 0, ARENA_REST_OOM);
	cr_assert_eq(arena_decision_count(a), 3, "an out-of-memory told between steps moves at once");
	d = decision(a, 2);
	check_record(&d);
	cr_assert_eq(d.why, ARENA_WHY_OOM, "why %s", d.why_name);
	cr_assert_eq(d.between, 1);
	cr_assert_eq(d.step, steps, "counted in the step about to begin");
	cr_assert_gt(d.demoted, 0);
	cr_assert_eq(arena_memory_get(a, &mi), 0, "%s", arena_last_error());
	cr_assert_geq(mi.rest_limit, most);

	/* a new work told between steps: the safe plan at once */
	step_told(a, most, 0, 0);
	const uint64_t n0 = arena_decision_count(a);
	report(a, KiB(40), 0, 7, 0);
	cr_assert_eq(arena_decision_count(a), n0 + 1);
	d = decision(a, n0);
	cr_assert_eq(d.why, ARENA_WHY_NEED, "why %s", d.why_name);
	cr_assert_eq(d.between, 1);
	cr_assert_gt(d.demoted, 0);
	cr_assert_lt(d.resident_after, full);
	arena_rest_info r = {0, 0, 0, 2};
	cr_assert_eq(arena_rest_report(a, &r), ARENA_E_USAGE, "unknown flags");
	cr_assert(strstr(arena_last_error(), "flags"), "%s", arena_last_error());
	arena_close(a);
}

/* Changes asked for between steps are named by their call: a mode, a
 * profile. */
Test(decide, a_mode_and_a_profile_set_are_recorded_as_such)
{
	arena *a = open_free(0);
	cr_assert_eq(arena_sim_pressure(a, KiB(300)), 0, "%s", arena_last_error());
	step(a);
	const uint64_t n0 = arena_decision_count(a);
	cr_assert_eq(n0, 1);
	const uint64_t steps = arena_step_count(a);
	cr_assert_eq(arena_set_mode(a, ARENA_MODE_TRAIN), 0, "%s", arena_last_error());
	cr_assert_eq(arena_decision_count(a), n0 + 1, "train's ring holds more slots");
	arena_decision_info d = decision(a, n0);
	check_record(&d);
	cr_assert_eq(d.why, ARENA_WHY_MODE, "why %s", d.why_name);
	cr_assert_eq(d.between, 1);
	cr_assert_eq(d.step, steps);
	cr_assert_neq(d.ring_after, d.ring_before);
	size_t n = arena_block_count(a);
	double cost[64];
	cr_assert_leq(n, 64);
	for (size_t b = 0; b < n; b++)
		cost[b] = 1e-3 * (double)(b % 3); /* cheap and dear pieces: the profile places others */
	cr_assert_eq(arena_profile_set(a, cost, n, 1e6, 0), 0, "%s", arena_last_error());
	cr_assert_eq(arena_decision_count(a), n0 + 2, "the profile places other pieces");
	d = decision(a, n0 + 1);
	check_record(&d);
	cr_assert_eq(d.why, ARENA_WHY_PROFILE, "why %s", d.why_name);
	/* both by the profile given: the plans it moved from and to */
	cr_assert_gt(d.step_before_s, 0);
	cr_assert_gt(d.step_after_s, 0);
	cr_assert_leq(d.step_after_s, d.step_before_s, "the profile's plan is predicted no slower: %g s -> %g s",
		      d.step_before_s, d.step_after_s);
	arena_close(a);
}
