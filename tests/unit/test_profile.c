/* test_profile.c - a compute profile on disk (engine/profile.h): round trip,
 * every malformed field named, write and allocation failures injected. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "arena.h"
#include "../../engine/engine.h"
#include "../../engine/profile.h"
#include "../../common/alloc.h"
#include "../../common/err.h"
#include "../../common/outfile.h"
#include "testutil.h"

static char dir[1024], path[1100];
static arena_layout *L;

static void setup(void)
{
	tmpdir_make(dir, sizeof(dir), "test-profile");
	snprintf(path, sizeof(path), "%s/p.json", dir);
	cr_assert_eq(arena_layout_create(4, 0, &L), 0);
	const char *names[4] = {"globals", "blocks.0", "blocks.1", "blocks.2"};
	for (size_t b = 0; b < 4; b++) {
		L->blocks[b].name = arena_strdup(names[b]);
		L->blocks[b].bytes = 4096 * (b + 1);
		if (b) {
			L->blocks[b].container = arena_strdup("blocks");
			L->blocks[b].index = (int64_t)b - 1;
		}
	}
}

static void teardown(void)
{
	arena_layout_free(L);
	tmpdir_remove(dir);
}

TestSuite(profile, .init = setup, .fini = teardown);

Test(profile, round_trip)
{
	double cost[4] = {0, 0.001, 0.25, 3e-6}, got[4] = {9, 9, 9, 9}, h2d = 0, bwd = 0;
	cr_assert_eq(arena_profile_write(path, L, cost, 5.5e10, 2.5), 0, "%s", arena_last_error());
	cr_assert_eq(arena_profile_read(path, L, got, &h2d, &bwd), 0, "%s", arena_last_error());
	for (size_t b = 0; b < 4; b++)
		cr_assert_float_eq(got[b], cost[b], 1e-15);
	cr_assert_float_eq(h2d, 5.5e10, 1);
	cr_assert_float_eq(bwd, 2.5, 1e-15);
}

static void write_text(const char *t)
{
	FILE *f = fopen(path, "w");
	cr_assert_not_null(f);
	fputs(t, f);
	fclose(f);
}

static void expect_bad(const char *text, const char *says)
{
	double got[4], h2d, bwd;
	write_text(text);
	cr_assert_eq(arena_profile_read(path, L, got, &h2d, &bwd), ARENA_E(PROFILE_BAD), "%s", text);
	cr_assert(strstr(arena_last_error(), says), "'%s' does not say '%s'", arena_last_error(), says);
	cr_assert_null(strchr(arena_last_error(), '\n'));
}

#define HEAD "{\"format\": \"arena-profile-1\", \"h2d_bytes_per_s\": 1e9, \"backward_factor\": 0, "

Test(profile, malformed_is_named)
{
	expect_bad("[1]", "not a JSON object");
	expect_bad("{\"format\": \"x\"}", "\"format\"");
	expect_bad("{\"format\": \"arena-profile-1\", \"h2d_bytes_per_s\": -1}", "h2d_bytes_per_s");
	expect_bad("{\"format\": \"arena-profile-1\", \"h2d_bytes_per_s\": 1e9, \"backward_factor\": \"3\"}",
		   "backward_factor");
	expect_bad(HEAD "\"blocks\": []}", "\"blocks\"");
	expect_bad(HEAD "\"blocks\": {\"blocks.0\": 1, \"blocks.1\": 1}}", "block blocks.2: missing");
	expect_bad(HEAD "\"blocks\": {\"blocks.0\": 1, \"blocks.1\": -2, \"blocks.2\": 1}}", "block blocks.1:");
	expect_bad(HEAD "\"blocks\": {\"blocks.0\": 1, \"blocks.1\": 2, \"blocks.2\": 1, \"globals\": 0}}",
		   "not a block of this model");
	expect_bad(HEAD "\"blocks\": {\"blocks.0\": 1, \"blocks.1\": 2, \"blocks.2\": 1}, \"x\": 0}", "unknown field");
	expect_bad(HEAD "\"blocks\": {\"blocks.0\": 1, \"blocks.0\": 1}}", "line 1");
	expect_bad("{\"format\": ", "line 1");
	double got[4], h2d, bwd;
	unlink(path);
	cr_assert_eq(arena_profile_read(path, L, got, &h2d, &bwd), ARENA_E_NOT_FOUND);
}

Test(profile, bad_values_are_not_written)
{
	double cost[4] = {0, 1, -1, 1};
	cr_assert_eq(arena_profile_write(path, L, cost, 1e9, 0), ARENA_E_USAGE);
	cost[2] = 1;
	cr_assert_eq(arena_profile_write(path, L, cost, 0, 0), ARENA_E_USAGE);
	cr_assert_neq(access(path, F_OK), 0, "nothing written");
}

/* Every allocation and every write of a save and a read failing in turn:
 * an error, no leak, and no file (or the old one) left at the path. */
Test(profile, failures_injected)
{
	double cost[4] = {0, 0.5, 0.25, 0.125}, got[4], h2d, bwd;
	int ok = 0;
	for (long n = 1; n < 500 && !ok; n++) {
		long live = arena_alloc_live();
		arena_fault_alloc(n);
		int rc = arena_profile_write(path, L, cost, 1e9, 3);
		int fired = arena_fault_alloc_fired();
		arena_fault_alloc(0);
		cr_assert_eq(arena_alloc_live(), live, "N=%ld leaks", n);
		if (!fired) {
			cr_assert_eq(rc, 0, "%s", arena_last_error());
			ok = 1;
		} else {
			cr_assert_neq(rc, 0, "allocation %ld failed and the write succeeded", n);
			cr_assert_neq(access(path, F_OK), 0, "N=%ld: a file was left", n);
		}
	}
	cr_assert(ok);
	unlink(path);
	arena_fault_write(1);
	cr_assert_neq(arena_profile_write(path, L, cost, 1e9, 3), 0);
	arena_fault_write(0);
	cr_assert_neq(access(path, F_OK), 0, "a failed write leaves nothing");
	cr_assert_eq(arena_profile_write(path, L, cost, 1e9, 3), 0);
	ok = 0;
	for (long n = 1; n < 500 && !ok; n++) {
		long live = arena_alloc_live();
		arena_fault_alloc(n);
		int rc = arena_profile_read(path, L, got, &h2d, &bwd);
		int fired = arena_fault_alloc_fired();
		arena_fault_alloc(0);
		cr_assert_eq(arena_alloc_live(), live, "read N=%ld leaks", n);
		if (!fired) {
			cr_assert_eq(rc, 0, "%s", arena_last_error());
			ok = 1;
		} else {
			cr_assert_eq(rc, ARENA_E_NOMEM, "read N=%ld: %s", n, arena_last_error());
		}
	}
	cr_assert(ok);
}
