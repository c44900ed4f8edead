/* units.c - sizes, counts and rates from text; byte counts as text (see units.h). */
#include "units.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int is_digit(char c)
{
	return c >= '0' && c <= '9';
}

int arena_size_parse(const char *s, uint64_t *out)
{
	if (!s || !out)
		return ARENA_PARSE_BAD;
	const char *p = s;
	uint64_t whole = 0, frac = 0, den = 1;
	int digits = 0, big = 0;
	for (; is_digit(*p); p++, digits++) {
		unsigned d = (unsigned)(*p - '0');
		if (whole > (UINT64_MAX - d) / 10)
			big = 1;
		else
			whole = whole * 10 + d;
	}
	if (*p == '.')
		/* Digits past the 18th change the result by less than 2^-19 bytes. */
		for (p++; is_digit(*p); p++, digits++)
			if (den < 1000000000000000000ull)
				frac = frac * 10 + (uint64_t)(*p - '0'), den *= 10;
	if (!digits)
		return ARENA_PARSE_BAD;
	unsigned shift = 0;
	switch (*p) {
	case 'k': case 'K': shift = 10; break;
	case 'm': case 'M': shift = 20; break;
	case 'g': case 'G': shift = 30; break;
	case 't': case 'T': shift = 40; break;
	default: break;
	}
	if (shift) {
		p++;
		if ((p[0] == 'i' || p[0] == 'I') && (p[1] == 'b' || p[1] == 'B'))
			p += 2;
		else if (p[0] == 'b' || p[0] == 'B')
			p++;
	} else if (*p == 'b' || *p == 'B') {
		p++;
	}
	if (*p)
		return ARENA_PARSE_BAD;
	if (big || whole > (UINT64_MAX >> shift))
		return ARENA_PARSE_RANGE;
	/* The fraction's bytes, floor(frac * 2^shift / den), exactly: long
	 * division a bit at a time (r < den <= 10^18, so 2r fits). */
	uint64_t r = frac, f = 0;
	for (unsigned i = 0; i < shift; i++) {
		r <<= 1;
		f <<= 1;
		if (r >= den)
			r -= den, f |= 1;
	}
	uint64_t v = whole << shift;
	if (v > UINT64_MAX - f)
		return ARENA_PARSE_RANGE;
	*out = v + f;
	return 0;
}

int arena_count_parse(const char *s, uint64_t min, uint64_t max, uint64_t *out)
{
	if (!s || !out || !*s)
		return ARENA_PARSE_BAD;
	uint64_t v = 0;
	int big = 0;
	for (const char *p = s; *p; p++) {
		if (!is_digit(*p))
			return ARENA_PARSE_BAD;
		unsigned d = (unsigned)(*p - '0');
		if (v > (UINT64_MAX - d) / 10)
			big = 1;
		else
			v = v * 10 + d;
	}
	if (big || v < min || v > max)
		return ARENA_PARSE_RANGE;
	*out = v;
	return 0;
}

int arena_rate_parse(const char *s, double max, double *out)
{
	if (!s || !out)
		return ARENA_PARSE_BAD;
	const char *p = s;
	int digits = 0;
	for (; is_digit(*p); p++)
		digits++;
	if (*p == '.')
		for (p++; is_digit(*p); p++)
			digits++;
	if (!digits)
		return ARENA_PARSE_BAD;
	if (*p == 'e' || *p == 'E') {
		p++;
		if (*p == '+' || *p == '-')
			p++;
		if (!is_digit(*p))
			return ARENA_PARSE_BAD;
		while (is_digit(*p))
			p++;
	}
	if (*p)
		return ARENA_PARSE_BAD;
	/* The text is plain decimal now: strtod reads all of it (in the C
	 * locale, which the arena command never leaves). */
	double v = strtod(s, NULL);
	if (!isfinite(v) || !(v > 0) || v > max)
		return ARENA_PARSE_RANGE;
	*out = v;
	return 0;
}

const char *arena_size_arg(uint64_t n, char *buf, size_t len)
{
	static const char units[] = "KMGT";
	int u = -1;
	while (u < 3 && n && n % 1024 == 0)
		n /= 1024, u++;
	snprintf(buf, len, "%llu%.*s", (unsigned long long)n, u >= 0, u >= 0 ? &units[u] : "");
	return buf;
}

const char *arena_size_str(uint64_t n, char *buf, size_t len)
{
	static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
	if (n < 1024) {
		snprintf(buf, len, "%llu B", (unsigned long long)n);
		return buf;
	}
	double v = (double)n;
	int u = 0;
	/* up while the number would print as 1024.00 or more */
	while (v >= 1023.995 && u < 6)
		v /= 1024, u++;
	snprintf(buf, len, "%.2f %s", v, units[u]);
	return buf;
}
