/* test_units.c - the one size grammar of every command (common/units.h), whole
 * numbers, rates, and byte counts in units that fit them. */
#include <criterion/criterion.h>
#include <jansson.h>

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "../../common/units.h"

/* The cases of the size grammar, shared with the Python package's tests
 * (tests/sizes.json; the unit tests run in the project root): every one
 * must read the same here as there. */
#define SIZES_JSON "tests/sizes.json"

static json_t *size_cases(const char *key)
{
	json_error_t e;
	json_t *root = json_load_file(SIZES_JSON, 0, &e);
	cr_assert(root, "%s: %s (line %d)", SIZES_JSON, e.text, e.line);
	json_t *v = json_incref(json_object_get(root, key));
	json_decref(root);
	cr_assert(json_is_array(v) && json_array_size(v) > 0, "%s: no list '%s'", SIZES_JSON, key);
	return v;
}

Test(units, size_grammar)
{
	size_t i;
	json_t *c, *cases = size_cases("accepted");
	json_array_foreach(cases, i, c) {
		const char *s = json_string_value(json_array_get(c, 0));
		const char *want = json_string_value(json_array_get(c, 1));
		cr_assert(s && want, "%s: accepted[%zu] is not [text, bytes]", SIZES_JSON, i);
		uint64_t v = 12345;
		int rc = arena_size_parse(s, &v);
		char got[32];
		snprintf(got, sizeof(got), "%llu", (unsigned long long)v);
		cr_expect_eq(rc, 0, "'%s': rc %d, want 0", s, rc);
		cr_expect(!rc && !strcmp(got, want), "'%s': %s, want %s", s, got, want);
	}
	json_decref(cases);
	static const struct {
		const char *key;
		int rc;
	} refused[] = {{"too_large", ARENA_PARSE_RANGE}, {"not_a_size", ARENA_PARSE_BAD}};
	for (size_t k = 0; k < sizeof(refused) / sizeof(refused[0]); k++) {
		cases = size_cases(refused[k].key);
		json_array_foreach(cases, i, c) {
			const char *s = json_string_value(c);
			cr_assert(s, "%s: %s[%zu] is not a string", SIZES_JSON, refused[k].key, i);
			uint64_t v = 12345;
			int rc = arena_size_parse(s, &v);
			cr_expect_eq(rc, refused[k].rc, "'%s': rc %d, want %d (%s)", s, rc, refused[k].rc, refused[k].key);
			cr_expect_eq(v, 12345, "'%s': *out written on failure", s);
		}
		json_decref(cases);
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
