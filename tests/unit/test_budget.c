/* test_budget.c - the pinned budget: sources, reserve, cap, ledger. */
#include <criterion/criterion.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "arena.h"
#include "../../device/budget.h"
#include "testutil.h"

static char root[256];

static void put(const char *rel, const char *text)
{
	char p[512], dir[600];
	snprintf(p, sizeof(p), "%s%s", root, rel);
	snprintf(dir, sizeof(dir), "mkdir -p \"$(dirname '%s')\"", p);
	cr_assert_eq(system(dir), 0);
	FILE *f = fopen(p, "w");
	cr_assert_not_null(f);
	fputs(text, f);
	fclose(f);
}

static void setup(void)
{
	tmpdir_make(root, sizeof(root), "budget");
}

static void teardown(void)
{
	tmpdir_remove(root);
}

TestSuite(budget, .init = setup, .fini = teardown);

#define GiB (1ull << 30)

Test(budget, mem_available_minus_reserve)
{
	put("/proc/meminfo", "MemTotal: 33554432 kB\nMemAvailable: 31457280 kB\n"); /* 30 GiB */
	arena_pin_budget b;
	cr_assert_eq(arena_pin_budget_probe(&b, 0, ARENA_PIN_RESERVE_AUTO, root), 0);
	cr_assert_eq(b.mem_available, 30 * GiB);
	cr_assert_eq(b.reserve, 3 * GiB); /* 10% beats 2 GiB */
	cr_assert_eq(b.limit, 27 * GiB);
	cr_assert_str_eq(b.bound_by, "MemAvailable");
}

Test(budget, small_machine_keeps_two_gib)
{
	put("/proc/meminfo", "MemAvailable: 4194304 kB\n"); /* 4 GiB */
	arena_pin_budget b;
	arena_pin_budget_probe(&b, 0, ARENA_PIN_RESERVE_AUTO, root);
	cr_assert_eq(b.limit, 2 * GiB);
	put("/proc/meminfo", "MemAvailable: 1048576 kB\n"); /* 1 GiB: nothing may be pinned */
	arena_pin_budget_probe(&b, 0, ARENA_PIN_RESERVE_AUTO, root);
	cr_assert_eq(b.limit, 0);
	cr_assert_eq(arena_pin_budget_take(&b, 4096), ARENA_E(BUDGET));
}

Test(budget, cgroup_limit_wins)
{
	put("/proc/meminfo", "MemAvailable: 62914560 kB\n"); /* 60 GiB */
	put("/proc/self/cgroup", "0::/job/step\n");
	put("/sys/fs/cgroup/job/memory.max", "17179869184\n");    /* 16 GiB */
	put("/sys/fs/cgroup/job/memory.current", "4294967296\n"); /* 4 GiB used */
	put("/sys/fs/cgroup/job/step/memory.max", "max\n");
	arena_pin_budget b;
	arena_pin_budget_probe(&b, 0, 1 * GiB, root);
	cr_assert_eq(b.cgroup_free, 12 * GiB);
	cr_assert_eq(b.limit, 11 * GiB);
	cr_assert_str_eq(b.bound_by, "cgroup memory.max");
}

Test(budget, user_cap_only_lowers)
{
	put("/proc/meminfo", "MemAvailable: 10485760 kB\n"); /* 10 GiB */
	arena_pin_budget b;
	arena_pin_budget_probe(&b, 1 * GiB, 0, root);
	cr_assert_eq(b.limit, 1 * GiB);
	cr_assert_str_eq(b.bound_by, "user cap");
	arena_pin_budget_probe(&b, 100 * GiB, 0, root);
	cr_assert_eq(b.limit, 10 * GiB);
}

Test(budget, ledger)
{
	put("/proc/meminfo", "MemAvailable: 10485760 kB\n");
	arena_pin_budget b;
	arena_pin_budget_probe(&b, 8192, 0, root);
	cr_assert_eq(arena_pin_budget_take(&b, 4096), 0);
	cr_assert_eq(arena_pin_budget_take(&b, 4096), 0);
	cr_assert_eq(arena_pin_budget_take(&b, 1), ARENA_E(BUDGET));
	cr_assert(strstr(arena_last_error(), "user cap"), "%s", arena_last_error());
	arena_pin_budget_give(&b, 4096);
	cr_assert_eq(arena_pin_budget_take(&b, 4096), 0);
	cr_assert_eq(b.peak, 8192);
	cr_assert_eq(arena_pin_budget_take(&b, UINT64_MAX), ARENA_E(BUDGET));
}

Test(budget, real_system_probe)
{
	arena_pin_budget b;
	cr_assert_eq(arena_pin_budget_probe(&b, 0, ARENA_PIN_RESERVE_AUTO, ""), 0);
	cr_assert_neq(b.mem_available, UINT64_MAX, "this machine has /proc/meminfo");
	cr_assert_leq(b.limit, b.mem_available);
}
