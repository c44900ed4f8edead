/* units.h - sizes and counts as people write them on a command line, and
 * byte counts as people read them: one grammar and one format for every
 * command and message.
 *
 * SIZE: ASCII digits with an optional fraction (".5", "1.5", "2."; at least
 * one digit), then an optional unit K, M, G or T (powers of 1024), which may
 * be followed by "iB" or "B" with the same meaning (KB is KiB); or "B"
 * alone. Letters in either case ("8gb", "8GIB"). A fraction is cut to whole
 * bytes. Nothing else is a size: no sign, no space anywhere, no exponent, no
 * hex, no nan or inf. Examples: 4096, 4096B, 64K, 512M, 1.5G, 24GiB, 8GB.
 * The Python package's arena.parse_size reads the same strings the same
 * way; tests/sizes.json holds the cases both are tested with. */
#ifndef ARENA_COMMON_UNITS_H
#define ARENA_COMMON_UNITS_H

#include <stddef.h>
#include <stdint.h>

enum { ARENA_PARSE_BAD = -1, ARENA_PARSE_RANGE = -2 };

/* Parse a SIZE into bytes. Returns 0, ARENA_PARSE_BAD (not a size) or
 * ARENA_PARSE_RANGE (2^64 bytes or more); *out is set only on success. */
int arena_size_parse(const char *s, uint64_t *out);

/* Parse a whole number: decimal digits only (no sign, space, fraction or
 * hex). Returns 0, ARENA_PARSE_BAD, or ARENA_PARSE_RANGE (outside [min, max]). */
int arena_count_parse(const char *s, uint64_t min, uint64_t max, uint64_t *out);

/* Parse a rate: digits with an optional fraction and an optional exponent
 * ("700e12", "55e9", "1.5e9", "4096"), finite and above 0. Returns 0,
 * ARENA_PARSE_BAD, or ARENA_PARSE_RANGE (0, or past max, or past a double). */
int arena_rate_parse(const char *s, double max, double *out);

/* a + b bytes, saturated: UINT64_MAX when the sum does not fit. Sizes a
 * user gives (headroom, reserve, cap: up to 2^64 - 2 bytes) are summed so:
 * a wrapped sum says a small number where "more than any device" is meant
 * (a headroom of 16 EiB "needed 469.50 KiB"). */
static inline uint64_t arena_size_add(uint64_t a, uint64_t b)
{
	uint64_t s;
	return __builtin_add_overflow(a, b, &s) ? UINT64_MAX : s;
}

/* n bytes in the unit that fits the number: "512 B", "1.50 KiB", "22.17 GiB"
 * (B, KiB, MiB, GiB, TiB, PiB, EiB; two decimals from KiB on). Returns buf. */
const char *arena_size_str(uint64_t n, char *buf, size_t len);
/* n as a SIZE option takes it, exactly: "512M", "32K", "1G", or bytes
 * ("1000") when no unit divides it. Returns buf. */
const char *arena_size_arg(uint64_t n, char *buf, size_t len);

#endif
