/* codec.c - chunk codecs (see codec.h and docs/FORMAT.md). */
#include "codec.h"

#include <inttypes.h>
#include <string.h>

#include "../common/err.h"

#define E(name) ARENA_E(name)

static uint64_t a16(uint64_t x)
{
	return (x + 15) & ~(uint64_t)15;
}

static uint32_t get32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void put32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8), p[2] = (uint8_t)(v >> 16), p[3] = (uint8_t)(v >> 24);
}

uint64_t arena_hb4_nib_off(void)
{
	return ARENA_HB4_HEADER;
}

uint64_t arena_hb4_low_off(uint64_t words)
{
	return ARENA_HB4_HEADER + a16((words + 1) / 2);
}

uint64_t arena_hb4_idx_off(uint64_t words)
{
	return arena_hb4_low_off(words) + a16(words);
}

uint64_t arena_hb4_stored_length(uint64_t raw_length, uint64_t n_exc)
{
	return arena_hb4_idx_off(raw_length / 2) + 5 * n_exc;
}

int arena_hb4_lengths_ok(uint64_t raw_length, uint64_t stored_length)
{
	if (raw_length % 2 || raw_length == 0 || raw_length > UINT32_MAX)
		return 0;
	uint64_t base = arena_hb4_stored_length(raw_length, 0);
	return stored_length >= base && stored_length < raw_length && (stored_length - base) % 5 == 0;
}

uint64_t arena_hb4_encode(const uint8_t *raw, uint64_t raw_length, uint8_t *out)
{
	if (raw_length % 2 || raw_length == 0 || raw_length > UINT32_MAX)
		return 0;
	const uint64_t W = raw_length / 2;
	uint64_t count[256] = {0};
	for (uint64_t i = 0; i < W; i++)
		count[raw[2 * i + 1]]++;
	/* The 16 commonest high bytes, commonest first (ties: smaller value). */
	uint8_t table[16];
	int used[256] = {0};
	uint64_t covered = 0;
	for (int k = 0; k < 16; k++) {
		int best = -1;
		for (int v = 0; v < 256; v++)
			if (!used[v] && (best < 0 || count[v] > count[best]))
				best = v;
		used[best] = 1;
		table[k] = (uint8_t)best;
		covered += count[best];
	}
	const uint64_t E = W - covered;
	const uint64_t stored = arena_hb4_stored_length(raw_length, E);
	if (stored >= raw_length)
		return 0;
	uint8_t code[256];
	memset(code, 0xff, sizeof(code));
	for (int k = 0; k < 16; k++)
		code[table[k]] = (uint8_t)k;
	memset(out, 0, ARENA_HB4_HEADER);
	put32(out, (uint32_t)E);
	put32(out + 4, (uint32_t)W);
	memcpy(out + 8, table, 16);
	uint8_t *nib = out + arena_hb4_nib_off(), *low = out + arena_hb4_low_off(W);
	uint8_t *idx = out + arena_hb4_idx_off(W), *hi = idx + 4 * E;
	uint64_t e = 0;
	for (uint64_t i = 0; i + 1 < W; i += 2) {
		uint8_t c0 = code[raw[2 * i + 1]], c1 = code[raw[2 * i + 3]];
		low[i] = raw[2 * i];
		low[i + 1] = raw[2 * i + 2];
		if (c0 == 0xff) {
			put32(idx + 4 * e, (uint32_t)i);
			hi[e++] = raw[2 * i + 1];
			c0 = 0;
		}
		if (c1 == 0xff) {
			put32(idx + 4 * e, (uint32_t)(i + 1));
			hi[e++] = raw[2 * i + 3];
			c1 = 0;
		}
		nib[i / 2] = (uint8_t)(c0 | c1 << 4);
	}
	if (W % 2) {
		uint64_t i = W - 1;
		uint8_t c0 = code[raw[2 * i + 1]];
		low[i] = raw[2 * i];
		if (c0 == 0xff) {
			put32(idx + 4 * e, (uint32_t)i);
			hi[e++] = raw[2 * i + 1];
			c0 = 0;
		}
		nib[i / 2] = c0;
	}
	/* Zero padding after each plane. */
	memset(nib + (W + 1) / 2, 0, arena_hb4_low_off(W) - arena_hb4_nib_off() - (W + 1) / 2);
	memset(low + W, 0, arena_hb4_idx_off(W) - arena_hb4_low_off(W) - W);
	return stored;
}

void arena_hb4_check_begin(arena_hb4_check *c, uint64_t raw_length, uint64_t stored_length)
{
	memset(c, 0, sizeof(*c));
	c->raw = raw_length;
	c->stored = stored_length;
	c->lengths_ok = arena_hb4_lengths_ok(raw_length, stored_length);
	if (!c->lengths_ok)
		return;
	c->words = raw_length / 2;
	c->n_exc = (stored_length - arena_hb4_stored_length(raw_length, 0)) / 5;
	c->low_off = arena_hb4_low_off(c->words);
	c->idx_off = arena_hb4_idx_off(c->words);
	c->hi_off = c->idx_off + 4 * c->n_exc;
}

static void check_bad(arena_hb4_check *c, const char *why)
{
	if (!c->why)
		c->why = why;
}

/* The stored bytes the check looks at, in order; plane bytes are any value. */
enum { R_HEADER, R_NIB_PAD, R_LOW_PAD, R_INDEX };

void arena_hb4_check_feed(arena_hb4_check *c, const uint8_t *p, uint64_t n)
{
	const uint64_t off = c->at, end = c->at + n;
	c->at = end;
	if (!c->lengths_ok || end > c->stored)
		return; /* check_end reports it */
	const uint64_t W = c->words, nib_end = ARENA_HB4_HEADER + (W + 1) / 2;
	const uint64_t r[4][2] = {{0, ARENA_HB4_HEADER}, {nib_end, c->low_off}, {c->low_off + W, c->idx_off},
				  {c->idx_off, c->hi_off}};
	for (int k = 0; k < 4; k++) {
		const uint64_t x = r[k][0] > off ? r[k][0] : off, y = r[k][1] < end ? r[k][1] : end;
		for (uint64_t at = x; at < y; at++) {
			const uint8_t b = p[at - off];
			if (k == R_HEADER) {
				c->head[at] = b;
			} else if (k != R_INDEX) {
				if (b)
					check_bad(c, "hb4 plane padding is not zero");
			} else {
				const uint64_t q = at - c->idx_off;
				c->part[q % 4] = b;
				if (q % 4 != 3)
					continue;
				const uint64_t i = get32(c->part);
				if (!c->why && (i >= W || (c->e && i <= c->prev))) {
					c->why = "exception";
					c->why_e = c->e, c->why_i = i;
				}
				c->prev = i;
				c->e++;
			}
		}
	}
	/* An odd W: the high nibble of the last nibble byte is padding. */
	const uint64_t last = ARENA_HB4_HEADER + W / 2;
	if (W % 2 && last >= off && last < end && (p[last - off] & 0xf0))
		check_bad(c, "hb4 plane padding is not zero");
}

int arena_hb4_check_end(arena_hb4_check *c, const char *what, arena_hb4 *v)
{
	memset(v, 0, sizeof(*v));
	if (!c->lengths_ok)
		return arena_errorf(E(IMG_CHUNK_BAD), "%s: %" PRIu64 " stored bytes cannot hold %" PRIu64 " bytes with codec hb4",
				    what, c->stored, c->raw);
	if (c->at != c->stored)
		return arena_errorf(ARENA_E_INTERNAL, "%s: hb4 check fed %" PRIu64 " of %" PRIu64 " stored bytes", what, c->at,
				    c->stored);
	const uint64_t W = c->words, E = c->n_exc;
	if (get32(c->head) != E || get32(c->head + 4) != W)
		return arena_errorf(E(IMG_CHUNK_BAD),
				    "%s: hb4 header says %" PRIu32 " words and %" PRIu32 " exceptions, the lengths give %" PRIu64
				    " and %" PRIu64,
				    what, get32(c->head + 4), get32(c->head), W, E);
	for (int k = 24; k < 32; k++)
		if (c->head[k])
			return arena_errorf(E(IMG_CHUNK_BAD), "%s: hb4 header bytes 24..31 are not zero", what);
	if (c->why && !strcmp(c->why, "exception"))
		return arena_errorf(E(IMG_CHUNK_BAD),
				    "%s: hb4 exception %" PRIu64 " names word %" PRIu64 " (words: %" PRIu64
				    ", indices must increase)",
				    what, c->why_e, c->why_i, W);
	if (c->why)
		return arena_errorf(E(IMG_CHUNK_BAD), "%s: %s", what, c->why);
	v->words = W;
	v->n_exc = E;
	memcpy(v->table, c->head + 8, 16);
	v->nib_off = arena_hb4_nib_off();
	v->low_off = c->low_off;
	v->idx_off = c->idx_off;
	v->hi_off = c->hi_off;
	return 0;
}

int arena_hb4_parse(const uint8_t *s, uint64_t stored_length, uint64_t raw_length, const char *what, arena_hb4 *v)
{
	arena_hb4_check c;
	arena_hb4_check_begin(&c, raw_length, stored_length);
	arena_hb4_check_feed(&c, s, stored_length);
	int rc = arena_hb4_check_end(&c, what, v);
	if (rc)
		return rc;
	v->nib = s + v->nib_off;
	v->low = s + v->low_off;
	v->exc_idx = s + v->idx_off;
	v->exc_hi = s + v->hi_off;
	return 0;
}

/* First exception with index >= i. */
static uint64_t exc_lower(const arena_hb4 *v, uint64_t i)
{
	uint64_t lo = 0, hi = v->n_exc;
	while (lo < hi) {
		uint64_t mid = lo + (hi - lo) / 2;
		if (get32(v->exc_idx + 4 * mid) < i)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

void arena_hb4_decode(const arena_hb4 *v, uint64_t a, uint64_t z, uint8_t *dst)
{
	const uint64_t w0 = a / 2, w1 = z / 2;
	const uint8_t *nib = v->nib, *low = v->low, *t = v->table;
	uint64_t i = w0;
	if (i < w1 && i % 2) {
		dst[0] = low[i];
		dst[1] = t[nib[i / 2] >> 4];
		i++;
	}
	uint8_t *d = dst + 2 * (i - w0);
	/* Two words per nibble byte: both high bytes from one lookup. */
	uint32_t pair[256]; /* the two words' high bytes in place, little-endian */
	for (int n = 0; n < 256; n++)
		pair[n] = (uint32_t)t[n & 15] << 8 | (uint32_t)t[n >> 4] << 24;
	for (; i + 1 < w1; i += 2, d += 4) {
		uint32_t x = pair[nib[i / 2]] | (uint32_t)low[i] | (uint32_t)low[i + 1] << 16;
		uint8_t b[4] = {(uint8_t)x, (uint8_t)(x >> 8), (uint8_t)(x >> 16), (uint8_t)(x >> 24)};
		memcpy(d, b, 4);
	}
	if (i < w1) {
		d[0] = low[i];
		d[1] = t[nib[i / 2] & 15];
	}
	for (uint64_t e = exc_lower(v, w0); e < v->n_exc; e++) {
		uint64_t k = get32(v->exc_idx + 4 * e);
		if (k >= w1)
			break;
		dst[2 * (k - w0) + 1] = v->exc_hi[e];
	}
}

uint64_t arena_hb4_first_nonzero(const arena_hb4 *v, uint64_t a, uint64_t z)
{
	const uint64_t w1 = (z + 1) / 2;
	uint64_t e = exc_lower(v, a / 2);
	uint64_t next = e < v->n_exc ? get32(v->exc_idx + 4 * e) : UINT64_MAX;
	for (uint64_t w = a / 2; w < w1; w++) {
		uint8_t hi;
		if (w == next) {
			hi = v->exc_hi[e++];
			next = e < v->n_exc ? get32(v->exc_idx + 4 * e) : UINT64_MAX;
		} else {
			hi = v->table[(v->nib[w / 2] >> (4 * (w % 2))) & 15];
		}
		if (2 * w >= a && v->low[w])
			return 2 * w;
		if (2 * w + 1 >= a && 2 * w + 1 < z && hi)
			return 2 * w + 1;
	}
	return z;
}

void arena_hb4_reads(uint64_t words, uint64_t a, uint64_t z, uint64_t nib[2], uint64_t low[2])
{
	const uint64_t w0 = a / 2, w1 = (z + 1) / 2;
	nib[0] = arena_hb4_nib_off() + w0 / 2;
	nib[1] = w1 > w0 ? arena_hb4_nib_off() + (w1 - 1) / 2 + 1 : nib[0];
	low[0] = arena_hb4_low_off(words) + w0;
	low[1] = arena_hb4_low_off(words) + (w1 > w0 ? w1 : w0);
}

const char *arena_codec_name(unsigned codec)
{
	return codec == ARENA_CODEC_NONE ? "none" : codec == ARENA_CODEC_HB4 ? "hb4" : NULL;
}

int arena_codec_from_name(const char *name)
{
	return !strcmp(name, "none") ? ARENA_CODEC_NONE : !strcmp(name, "hb4") ? ARENA_CODEC_HB4 : -1;
}
