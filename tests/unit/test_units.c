/* test_units.c - the one size grammar of every command (common/units.h), whole
 * numbers, rates, and byte counts in units that fit them. */
#include <criterion/criterion.h>

#include <stdint.h>
#include <string.h>

#include "../../common/units.h"

static const struct {
	const char *s;
	int rc;
	uint64_t want;
} sizes[] = {
	/* what README, docs and tests use, and the same in other spellings */
	{"4096", 0, 4096},
	{"4096B", 0, 4096},
	{"0", 0, 0},
	{"64K", 0, 65536},
	{"64k", 0, 65536},
	{"64KiB", 0, 65536},
	{"64KB", 0, 65536},
	{"512M", 0, 512ull << 20},
	{"8G", 0, 8ull << 30},
	{"8g", 0, 8ull << 30},
	{"24GiB", 0, 24ull << 30},
	{"8GB", 0, 8ull << 30},
	{"1T", 0, 1ull << 40},
	{"20G", 0, 20ull << 30},
	{"1.5G", 0, 3ull << 29},
	{"1.5GiB", 0, 3ull << 29},
	{".5M", 0, 1ull << 19},
	{"2.", 0, 2},
	{"2.K", 0, 2048},
	{"0.5K", 0, 512},
	{"0.3G", 0, 322122547},           /* 322122547.2, cut */
	{"1.9", 0, 1},                    /* fractions of a byte are cut */
	{"0.0000000000000000001T", 0, 0}, /* digits past the 18th are dropped */
	{"1.0000000000000000000000001K", 0, 1024},
	{"18446744073709551615", 0, UINT64_MAX},
	{"16777215.99999999999T", 0, UINT64_MAX - 10}, /* 2^64 - 2^40 * 1e-11, cut */
	{"16777215.999999999999999999T", 0, UINT64_MAX},
	{"007", 0, 7},
	/* too large */
	{"18446744073709551616", ARENA_PARSE_RANGE, 0},
	{"99999999999999999999999", ARENA_PARSE_RANGE, 0},
	{"16777216T", ARENA_PARSE_RANGE, 0},
	{"17179869184G", ARENA_PARSE_RANGE, 0},
	{"18446744073709551615.5K", ARENA_PARSE_RANGE, 0},
	/* not a size */
	{"", ARENA_PARSE_BAD, 0},
	{".", ARENA_PARSE_BAD, 0},
	{"G", ARENA_PARSE_BAD, 0},
	{"B", ARENA_PARSE_BAD, 0},
	{"iB", ARENA_PARSE_BAD, 0},
	{"nan", ARENA_PARSE_BAD, 0},
	{"NaN", ARENA_PARSE_BAD, 0},
	{"inf", ARENA_PARSE_BAD, 0},
	{"infinity", ARENA_PARSE_BAD, 0},
	{"-1", ARENA_PARSE_BAD, 0},
	{"-0", ARENA_PARSE_BAD, 0},
	{"+8G", ARENA_PARSE_BAD, 0},
	{"0x10", ARENA_PARSE_BAD, 0},
	{"0X1G", ARENA_PARSE_BAD, 0},
	{"1e9", ARENA_PARSE_BAD, 0},
	{"1E3", ARENA_PARSE_BAD, 0},
	{" 8G", ARENA_PARSE_BAD, 0},
	{"8G ", ARENA_PARSE_BAD, 0},
	{"8 G", ARENA_PARSE_BAD, 0},
	{"\t8G", ARENA_PARSE_BAD, 0},
	{"8G\n", ARENA_PARSE_BAD, 0},
	{"8Q", ARENA_PARSE_BAD, 0},
	{"8GiBB", ARENA_PARSE_BAD, 0},
	{"8Gi", ARENA_PARSE_BAD, 0},
	{"8Gb", ARENA_PARSE_BAD, 0},
	{"8gib", ARENA_PARSE_BAD, 0},
	{"8iB", ARENA_PARSE_BAD, 0},
	{"8BB", ARENA_PARSE_BAD, 0},
	{"8P", ARENA_PARSE_BAD, 0},
	{"8g8", ARENA_PARSE_BAD, 0},
	{"1..5G", ARENA_PARSE_BAD, 0},
	{"1.5.G", ARENA_PARSE_BAD, 0},
	{"1,5G", ARENA_PARSE_BAD, 0},
	{"８G", ARENA_PARSE_BAD, 0},
};

Test(units, size_grammar)
{
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		uint64_t v = 12345;
		int rc = arena_size_parse(sizes[i].s, &v);
		cr_expect_eq(rc, sizes[i].rc, "'%s': rc %d, want %d", sizes[i].s, rc, sizes[i].rc);
		if (!sizes[i].rc)
			cr_expect_eq(v, sizes[i].want, "'%s': %llu, want %llu", sizes[i].s, (unsigned long long)v,
				     (unsigned long long)sizes[i].want);
		else
			cr_expect_eq(v, 12345, "'%s': *out written on failure", sizes[i].s);
	}
	cr_expect_eq(arena_size_parse(NULL, &(uint64_t){0}), ARENA_PARSE_BAD);
}

Test(units, count_grammar)
{
	uint64_t v = 0;
	cr_expect_eq(arena_count_parse("16", 1, 256, &v), 0);
	cr_expect_eq(v, 16);
	cr_expect_eq(arena_count_parse("0", 0, 5, &v), 0);
	cr_expect_eq(v, 0);
	cr_expect_eq(arena_count_parse("18446744073709551615", 0, UINT64_MAX, &v), 0);
	cr_expect_eq(v, UINT64_MAX);
	static const char *const range[] = {"0", "257", "18446744073709551616", "99999999999999999999999"};
	for (size_t i = 0; i < sizeof(range) / sizeof(range[0]); i++)
		cr_expect_eq(arena_count_parse(range[i], 1, 256, &v), ARENA_PARSE_RANGE, "'%s'", range[i]);
	static const char *const bad[] = {"", " 4", "4 ", "+4", "-4", "-0", "0x10", "4.0", "4.", "1e1", "nan", "4K", "4\n"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		cr_expect_eq(arena_count_parse(bad[i], 0, UINT64_MAX, &v), ARENA_PARSE_BAD, "'%s'", bad[i]);
}

Test(units, rate_grammar)
{
	double v = 0;
	static const struct {
		const char *s;
		double want;
	} good[] = {{"700e12", 700e12}, {"55e9", 55e9}, {"1.5e9", 1.5e9}, {"4096", 4096}, {"2.5", 2.5},
		    {".5", 0.5},        {"1E3", 1e3},   {"1e+3", 1e3},    {"1e-3", 1e-3}, {"5.", 5}};
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		cr_expect_eq(arena_rate_parse(good[i].s, 1e18, &v), 0, "'%s'", good[i].s);
		cr_expect_eq(v, good[i].want, "'%s': %g", good[i].s, v);
	}
	static const char *const range[] = {"0", "0.0", "0e5", "1e999", "1e-999", "2e18"};
	for (size_t i = 0; i < sizeof(range) / sizeof(range[0]); i++)
		cr_expect_eq(arena_rate_parse(range[i], 1e18, &v), ARENA_PARSE_RANGE, "'%s'", range[i]);
	static const char *const bad[] = {"",    "nan", "inf", "-1",  "+1",   " 1e14", "1e14 ", "0x1p40", "1e14x",
					  "e9", "1e",  "1e+", ".",   ".e5", "1.5.", "1,5",    "7e14 "};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		cr_expect_eq(arena_rate_parse(bad[i], 1e18, &v), ARENA_PARSE_BAD, "'%s'", bad[i]);
}

Test(units, sizes_in_units_that_fit)
{
	static const struct {
		uint64_t n;
		const char *want;
	} c[] = {
		{0, "0 B"},
		{1, "1 B"},
		{1023, "1023 B"},
		{1024, "1.00 KiB"},
		{1536, "1.50 KiB"},
		{102400, "100.00 KiB"},
		{339456, "331.50 KiB"},
		{1048575, "1.00 MiB"}, /* not "1024.00 KiB" */
		{8ull << 30, "8.00 GiB"},
		{23803297792ull, "22.17 GiB"},
		{1ull << 40, "1.00 TiB"},
		{UINT64_MAX, "16.00 EiB"},
	};
	for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
		char b[32];
		cr_expect_str_eq(arena_size_str(c[i].n, b, sizeof(b)), c[i].want, "%llu", (unsigned long long)c[i].n);
	}
}
