/* test_codec.c - the hb4 chunk codec: round trips, ranges, what it refuses. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/err.h"
#include "../../formats/codec.h"

/* bf16 words of normal-ish weights (what a real layer looks like), with a
 * few outliers, zeros and infinities. */
static uint8_t *weights(uint64_t words, unsigned seed)
{
	uint8_t *b = malloc(2 * words);
	srand(seed);
	for (uint64_t i = 0; i < words; i++) {
		double u1 = (rand() + 1.0) / (RAND_MAX + 2.0), u2 = (rand() + 1.0) / (RAND_MAX + 2.0);
		float f = (float)(0.02 * sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2));
		if (i % 9973 == 5)
			f = 1e30f;
		if (i % 7919 == 3)
			f = 0;
		uint32_t x;
		memcpy(&x, &f, 4);
		b[2 * i] = (uint8_t)(x >> 16);
		b[2 * i + 1] = (uint8_t)(x >> 24);
	}
	return b;
}

static void roundtrip(const uint8_t *raw, uint64_t len, int expect_coded)
{
	uint8_t *st = malloc(len + 64);
	uint64_t n = arena_hb4_encode(raw, len, st);
	cr_assert_eq(n != 0, expect_coded, "len %llu coded %llu", (unsigned long long)len, (unsigned long long)n);
	if (!n) {
		free(st);
		return;
	}
	cr_assert_lt(n, len);
	cr_assert(arena_hb4_lengths_ok(len, n));
	arena_hb4 v;
	cr_assert_eq(arena_hb4_parse(st, n, len, "t", &v), 0, "%s", arena_last_error());
	uint8_t *out = malloc(len);
	memset(out, 0xa5, len);
	arena_hb4_decode(&v, 0, len, out);
	cr_assert_eq(memcmp(out, raw, len), 0);
	/* Any even sub-range decodes on its own. */
	for (uint64_t a = 0; a < len; a += (len / 7 + 2) & ~1ull)
		for (uint64_t z = a; z <= len; z += (len / 5 + 2) & ~1ull) {
			memset(out, 0xa5, len);
			arena_hb4_decode(&v, a, z, out);
			cr_assert_eq(memcmp(out, raw + a, z - a), 0, "range %llu..%llu", (unsigned long long)a,
				     (unsigned long long)z);
		}
	free(out);
	free(st);
}

Test(codec, bf16_weights_take_three_quarters)
{
	uint64_t W = 1u << 20;
	uint8_t *raw = weights(W, 1);
	uint8_t *st = malloc(2 * W);
	uint64_t n = arena_hb4_encode(raw, 2 * W, st);
	cr_assert_gt(n, 0);
	/* 12 bits a word plus a few exceptions. */
	cr_assert_lt((double)n / (2.0 * W), 0.76, "ratio %f", (double)n / (2.0 * W));
	free(st);
	roundtrip(raw, 2 * W, 1);
	roundtrip(raw, 2 * 4097, 1); /* odd word count */
	roundtrip(raw, 2 * 513, 1);
	free(raw);
}

Test(codec, incompressible_is_refused)
{
	uint64_t len = 1u << 16;
	uint8_t *raw = malloc(len);
	for (uint64_t i = 0; i < len; i++)
		raw[i] = (uint8_t)(i * 2654435761u >> 13);
	roundtrip(raw, len, 0);
	cr_assert_eq(arena_hb4_encode(raw, 3, raw), 0); /* odd length */
	cr_assert_eq(arena_hb4_encode(raw, 0, raw), 0);
	/* All zero: no exceptions. */
	memset(raw, 0, len);
	roundtrip(raw, len, 1);
	free(raw);
}

Test(codec, every_exception_position)
{
	/* 17 distinct high bytes: the rarest is an exception wherever it is. */
	uint64_t W = 4096;
	uint8_t *raw = calloc(2, W);
	for (uint64_t i = 0; i < W; i++)
		raw[2 * i + 1] = (uint8_t)(i % 16), raw[2 * i] = (uint8_t)i;
	for (uint64_t k = 0; k < W; k += 97) {
		raw[2 * k + 1] = 0x80;
		roundtrip(raw, 2 * W, 1);
	}
	raw[1] = 0x80;
	raw[2 * W - 1] = 0x80;
	roundtrip(raw, 2 * W, 1);
	free(raw);
}

static int parse_err(const uint8_t *st, uint64_t n, uint64_t raw)
{
	arena_hb4 v;
	return arena_hb4_parse(st, n, raw, "c", &v);
}

Test(codec, malformed_chunks_are_named)
{
	uint64_t W = 8192, len = 2 * W;
	uint8_t *raw = weights(W, 2);
	for (uint64_t i = 0; i < W; i += 61)
		raw[2 * i + 1] = (uint8_t)(0x10 + i % 20); /* many exceptions */
	uint8_t *st = malloc(len), *bad = malloc(len);
	uint64_t n = arena_hb4_encode(raw, len, st);
	cr_assert_gt(n, 0);
	arena_hb4 v;
	cr_assert_eq(arena_hb4_parse(st, n, len, "c", &v), 0);
	cr_assert_gt(v.n_exc, 2);
	/* Lengths that no E gives, and an odd raw length. */
	cr_assert_eq(parse_err(st, n - 1, len), ARENA_E(IMG_CHUNK_BAD));
	cr_assert_eq(parse_err(st, n, len + 1), ARENA_E(IMG_CHUNK_BAD));
	cr_assert(strstr(arena_last_error(), "c: "));
	/* Header counts that disagree with the lengths. */
	memcpy(bad, st, n);
	bad[0] ^= 1;
	cr_assert_eq(parse_err(bad, n, len), ARENA_E(IMG_CHUNK_BAD));
	memcpy(bad, st, n);
	bad[30] = 1;
	cr_assert_eq(parse_err(bad, n, len), ARENA_E(IMG_CHUNK_BAD));
	/* Padding. */
	memcpy(bad, st, n);
	cr_assert_eq(v.idx_off - v.low_off, W); /* W is a multiple of 16: no low padding */
	/* Exception indices out of order and out of range. */
	memcpy(bad, st, n);
	memcpy(bad + v.idx_off, st + v.idx_off + 4, 4);
	cr_assert_eq(parse_err(bad, n, len), ARENA_E(IMG_CHUNK_BAD));
	memcpy(bad, st, n);
	uint32_t big = (uint32_t)W;
	memcpy(bad + v.idx_off + 4 * (v.n_exc - 1), &big, 4);
	cr_assert_eq(parse_err(bad, n, len), ARENA_E(IMG_CHUNK_BAD));
	cr_assert(strstr(arena_last_error(), "exception"), "%s", arena_last_error());
	/* Odd W: the last nibble byte's high half is padding. */
	uint64_t n2 = arena_hb4_encode(raw, 2 * 4095, st);
	cr_assert_gt(n2, 0);
	cr_assert_eq(arena_hb4_parse(st, n2, 2 * 4095, "c", &v), 0);
	st[v.nib_off + 4095 / 2] |= 0x10;
	cr_assert_eq(parse_err(st, n2, 2 * 4095), ARENA_E(IMG_CHUNK_BAD));
	free(raw);
	free(st);
	free(bad);
}

Test(codec, names)
{
	cr_assert_str_eq(arena_codec_name(ARENA_CODEC_HB4), "hb4");
	cr_assert_str_eq(arena_codec_name(ARENA_CODEC_NONE), "none");
	cr_assert_null(arena_codec_name(7));
	cr_assert_eq(arena_codec_from_name("hb4"), ARENA_CODEC_HB4);
	cr_assert_eq(arena_codec_from_name("zstd"), -1);
}

/* Fed in pieces of any size, the streaming check agrees with parse. */
static int check_pieces(const uint8_t *st, uint64_t n, uint64_t raw, uint64_t piece)
{
	arena_hb4_check c;
	arena_hb4_check_begin(&c, raw, n);
	for (uint64_t at = 0; at < n; at += piece)
		arena_hb4_check_feed(&c, st + at, n - at < piece ? n - at : piece);
	arena_hb4 v;
	return arena_hb4_check_end(&c, "c", &v);
}

Test(codec, streaming_check_agrees_with_parse)
{
	uint64_t W = 6001, len = 2 * W;
	uint8_t *raw = weights(W, 3);
	for (uint64_t i = 0; i < W; i += 53)
		raw[2 * i + 1] = (uint8_t)(0x10 + i % 23);
	uint8_t *st = malloc(len);
	uint64_t n = arena_hb4_encode(raw, len, st);
	cr_assert_gt(n, 0);
	arena_hb4 v;
	cr_assert_eq(arena_hb4_parse(st, n, len, "c", &v), 0);
	uint64_t pieces[] = {1, 3, 4, 7, 16, 33, 4096, n};
	/* Good, then each kind of damage: header, reserved, nibble padding (odd
	 * W's last high nibble), low padding, an index out of order, one too big. */
	for (int k = 0; k < 7; k++) {
		uint8_t *b = malloc(n);
		memcpy(b, st, n);
		uint32_t big = (uint32_t)W + 1;
		switch (k) {
		case 1: b[4] ^= 1; break;
		case 2: b[27] = 9; break;
		case 3: b[v.nib_off + W / 2] |= 0x20; break;
		case 4: b[v.idx_off - 1] = 1; break;
		case 5: memcpy(b + v.idx_off + 4, b + v.idx_off, 4); break;
		case 6: memcpy(b + v.idx_off + 4 * (v.n_exc - 1), &big, 4); break;
		}
		arena_hb4 tmp;
		int want = arena_hb4_parse(b, n, len, "c", &tmp);
		cr_assert_eq(want != 0, k != 0, "case %d", k);
		for (size_t p = 0; p < sizeof(pieces) / sizeof(pieces[0]); p++)
			cr_assert_eq(check_pieces(b, n, len, pieces[p]), want, "case %d piece %llu", k,
				     (unsigned long long)pieces[p]);
		free(b);
	}
	free(st);
	free(raw);
}

/* arena_hb4_first_nonzero against the raw bytes, on a copy of the chunk that
 * holds only what arena_hb4_reads names and the exception lists (the rest
 * 0xEE): the loader checks padding from such a copy. */
static void check_first_nonzero(const uint8_t *raw, uint64_t len)
{
	uint8_t *st = malloc(len), *sparse = malloc(len);
	uint64_t n = arena_hb4_encode(raw, len, st);
	cr_assert_neq(n, 0);
	arena_hb4 v;
	cr_assert_eq(arena_hb4_parse(st, n, len, "t", &v), 0, "%s", arena_last_error());
	for (uint64_t a = 0; a <= len; a += len / 23 + 1)
		for (uint64_t z = a; z <= len; z += len / 17 + 3) {
			uint64_t want = a;
			while (want < z && !raw[want])
				want++;
			uint64_t nib[2], low[2];
			arena_hb4_reads(v.words, a, z, nib, low);
			cr_assert(nib[0] <= nib[1] && nib[1] <= v.low_off && low[0] <= low[1] && low[1] <= v.idx_off);
			memset(sparse, 0xEE, len);
			memcpy(sparse + nib[0], st + nib[0], nib[1] - nib[0]);
			memcpy(sparse + low[0], st + low[0], low[1] - low[0]);
			memcpy(sparse + v.idx_off, st + v.idx_off, n - v.idx_off);
			arena_hb4 s = v;
			s.nib = sparse + v.nib_off, s.low = sparse + v.low_off;
			s.exc_idx = sparse + v.idx_off, s.exc_hi = sparse + v.hi_off;
			cr_assert_eq(arena_hb4_first_nonzero(&v, a, z), want, "[%llu, %llu)", (unsigned long long)a,
				     (unsigned long long)z);
			cr_assert_eq(arena_hb4_first_nonzero(&s, a, z), want, "sparse [%llu, %llu)", (unsigned long long)a,
				     (unsigned long long)z);
		}
	free(st);
	free(sparse);
}

Test(codec, first_nonzero_reads_only_what_it_names)
{
	/* Weights with zero runs of odd lengths at odd places: zero words coded
	 * through the table (0x00 is among the 16 commonest high bytes). */
	uint64_t words = 8000;
	uint8_t *b = weights(words, 7);
	for (uint64_t k = 0; k < 40; k++)
		memset(b + 301 * k + 17 * (k % 5), 0, 3 + 37 * (k % 7));
	check_first_nonzero(b, 2 * words);
	/* High bytes that avoid 0x00 but for a few zero words and a few
	 * non-zero ones with a zero high byte: those are exceptions. */
	for (uint64_t i = 0; i < words; i++)
		b[2 * i + 1] = (uint8_t)(0x30 + i % 16), b[2 * i] = (uint8_t)(i * 7 + 1);
	for (uint64_t k = 0; k < 12; k++) {
		memset(b + 401 * k + 3, 0, 1 + 2 * k);
		b[2 * (307 * k + 5) + 1] = 0;
	}
	check_first_nonzero(b, 2 * words);
	free(b);
}
