/* test_codec.c - the chunk codecs (hb4, zstd): round trips, ranges, what
 * they refuse, bounded decoding, allocation failures. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <zstd.h>

#include "../../common/alloc.h"
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
	cr_assert_str_eq(arena_codec_name(ARENA_CODEC_ZSTD), "zstd");
	cr_assert_eq(arena_codec_from_name("zstd"), ARENA_CODEC_ZSTD);
	cr_assert_eq(arena_codec_from_name("lz4"), -1);
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

/* ---- zstd -------------------------------------------------------------------- */

/* f32 values N(0, 0.02) as little-endian bytes (their bf16 is the top two). */
static uint8_t *f32_weights(uint64_t n, unsigned seed)
{
	uint8_t *b = malloc(4 * n);
	srand(seed);
	for (uint64_t i = 0; i < n; i++) {
		double u1 = (rand() + 1.0) / (RAND_MAX + 2.0), u2 = (rand() + 1.0) / (RAND_MAX + 2.0);
		float f = (float)(0.02 * sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2));
		memcpy(b + 4 * i, &f, 4);
	}
	return b;
}

static uint8_t *noise(uint64_t len, uint64_t x)
{
	uint8_t *b = malloc(len);
	for (uint64_t i = 0; i < len; i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		b[i] = (uint8_t)x;
	}
	return b;
}

/* Encode, parse, decode; every range of the raw bytes (odd ends too) back,
 * and the first non-zero byte of each. Returns the stored length (0: not
 * coded). */
static uint64_t zroundtrip(const uint8_t *raw, uint64_t len, unsigned width, int level)
{
	arena_zstd_work w = {0};
	uint8_t *st = malloc(len);
	uint64_t n;
	cr_assert_eq(arena_zstd_encode(&w, raw, len, width, level, st, &n), 0, "%s", arena_last_error());
	if (n) {
		cr_assert_lt(n, len);
		cr_assert(arena_zstd_lengths_ok(len, n));
		arena_zstd v;
		cr_assert_eq(arena_zstd_parse(st, n, len, "t", &v), 0, "%s", arena_last_error());
		cr_assert_eq(v.width, width);
		arena_zstd_work d = {0};
		cr_assert_eq(arena_zstd_decode(&d, &v, st, "t"), 0, "%s", arena_last_error());
		uint8_t *out = malloc(len);
		memset(out, 0xa5, len);
		arena_zstd_gather(&v, 0, len, out);
		cr_assert_eq(memcmp(out, raw, len), 0, "width %u", width);
		for (uint64_t a = 0; a < len; a += len / 7 + 3)
			for (uint64_t z = a; z <= len; z += len / 5 + 1) {
				memset(out, 0xa5, len);
				arena_zstd_gather(&v, a, z, out);
				cr_assert_eq(memcmp(out, raw + a, z - a), 0, "width %u range %llu..%llu", width,
					     (unsigned long long)a, (unsigned long long)z);
				uint64_t want = a;
				while (want < z && !raw[want])
					want++;
				cr_assert_eq(arena_zstd_first_nonzero(&v, a, z), want);
			}
		free(out);
		arena_zstd_work_free(&d);
	}
	free(st);
	arena_zstd_work_free(&w);
	return n;
}

Test(codec_zstd, round_trips_every_width)
{
	uint64_t len = 256 << 10;
	uint8_t *f = f32_weights(len / 4, 4), *bf = weights(len / 2, 5), *z = calloc(1, len);
	for (unsigned wd = 1; wd <= 8; wd *= 2) {
		cr_assert_gt(zroundtrip(f, len, wd, 1), 0, "f32 weights with width %u", wd);
		cr_assert_gt(zroundtrip(bf, len, wd, 3), 0, "bf16 weights with width %u", wd);
		cr_assert_gt(zroundtrip(z, len, wd, 1), 0, "zeros with width %u", wd);
	}
	/* Grouped by their own width, f32 weights do better than as bytes. */
	cr_assert_lt(zroundtrip(f, len, 4, 1), zroundtrip(f, len, 1, 1));
	/* Lengths that are not whole elements are not coded; nor is noise. */
	cr_assert_eq(zroundtrip(bf, len - 2, 4, 1), 0);
	uint8_t *x = noise(len, 88172645463325252ull);
	cr_assert_eq(zroundtrip(x, len, 2, 1), 0);
	cr_assert_eq(zroundtrip(x, 16, 2, 1), 0);
	free(x);
	free(f);
	free(bf);
	free(z);
}

Test(codec_zstd, bf16_weights_high_bytes_packed_low_bytes_as_is)
{
	uint64_t W = 1u << 20;
	uint8_t *raw = weights(W, 1), *st = malloc(2 * W);
	arena_zstd_work w = {0};
	uint64_t n;
	cr_assert_eq(arena_zstd_encode(&w, raw, 2 * W, 2, 0, st, &n), 0);
	arena_zstd v;
	cr_assert_eq(arena_zstd_parse(st, n, 2 * W, "t", &v), 0, "%s", arena_last_error());
	cr_assert_eq(v.packed, 2, "the low bytes are noise, the high bytes compress");
	/* About 68-70 %: the high byte takes 2.7 bits or so, the low byte 8. */
	cr_assert_lt((double)n / (2.0 * W), 0.72, "ratio %f", (double)n / (2.0 * W));
	uint64_t hb4 = arena_hb4_encode(raw, 2 * W, st);
	cr_assert_lt(n, hb4, "zstd %llu stored bytes against hb4's %llu", (unsigned long long)n, (unsigned long long)hb4);
	arena_zstd_work_free(&w);
	free(raw);
	free(st);
}

Test(codec_zstd, bad_arguments)
{
	arena_zstd_work w = {0};
	uint8_t raw[4096] = {0}, st[4096];
	uint64_t n = 7;
	cr_assert_eq(arena_zstd_encode(&w, raw, sizeof(raw), 3, 1, st, &n), ARENA_E_USAGE);
	cr_assert_eq(n, 0);
	cr_assert_eq(arena_zstd_encode(&w, raw, sizeof(raw), 2, ARENA_ZSTD_MAX_LEVEL + 1, st, &n), ARENA_E_USAGE);
	cr_assert_eq(arena_zstd_encode(&w, raw, sizeof(raw), 2, -1, st, &n), ARENA_E_USAGE);
	cr_assert_eq(arena_zstd_encode(&w, raw, 0, 2, 1, st, &n), 0);
	cr_assert_eq(n, 0);
	cr_assert_eq(arena_zstd_width_for_bits(16), 2);
	cr_assert_eq(arena_zstd_width_for_bits(32), 4);
	cr_assert_eq(arena_zstd_width_for_bits(64), 8);
	cr_assert_eq(arena_zstd_width_for_bits(8), 1);
	cr_assert_eq(arena_zstd_width_for_bits(4), 1);
	arena_zstd_work_free(&w);
}

static void put32_le(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

/* A two-stream chunk of raw bytes 2n whose high stream is `frame` (flen
 * bytes, packed) and low stream n bytes as is: header + streams into out. */
static uint64_t make_chunk(uint8_t *out, uint64_t n, const uint8_t *frame, uint64_t flen)
{
	memset(out, 0, 16);
	out[0] = 2, out[1] = 2;
	put32_le(out + 4, (uint32_t)(2 * n));
	put32_le(out + 8, (uint32_t)n);
	put32_le(out + 12, (uint32_t)flen);
	for (uint64_t i = 0; i < n; i++)
		out[16 + i] = (uint8_t)(i * 151 + 7);
	memcpy(out + 16 + n, frame, flen);
	return 16 + n + flen;
}

static int zparse(const uint8_t *st, uint64_t n, uint64_t raw)
{
	arena_zstd v;
	return arena_zstd_parse(st, n, raw, "c", &v);
}

/* Parse accepts it; decoding must refuse it (IMG_CHUNK_BAD) without a
 * byte written past the stream's room (the buffer is exactly that). */
static void decode_refuses(const uint8_t *st, uint64_t n, uint64_t raw, const char *why)
{
	arena_zstd v;
	cr_assert_eq(arena_zstd_parse(st, n, raw, "c", &v), 0, "%s: %s", why, arena_last_error());
	arena_zstd_work w = {0};
	int rc = arena_zstd_decode(&w, &v, st, "c");
	cr_assert_eq(rc, ARENA_E(IMG_CHUNK_BAD), "%s: %s", why, arena_last_error());
	cr_assert(strstr(arena_last_error(), "c: zstd stream 1"), "%s", arena_last_error());
	cr_assert_eq(w.cap, v.n, "the decode buffer is exactly one stream");
	arena_zstd_work_free(&w);
}

Test(codec_zstd, malformed_chunks_are_named)
{
	const uint64_t n = 32768, raw = 2 * n;
	uint8_t *hi = calloc(1, 2 * n), *frame = malloc(ZSTD_compressBound(2 * n)), *st = malloc(4 * n), *bad = malloc(4 * n);
	for (uint64_t i = 0; i < 2 * n; i++)
		hi[i] = (uint8_t)(0x3c + i % 3);
	size_t fl = ZSTD_compress(frame, ZSTD_compressBound(n), hi, n, 1);
	cr_assert(!ZSTD_isError(fl) && fl < n);
	uint64_t sl = make_chunk(st, n, frame, fl);
	cr_assert_eq(zparse(st, sl, raw), 0, "%s", arena_last_error());
	arena_zstd v;
	arena_zstd_work w = {0};
	cr_assert_eq(arena_zstd_parse(st, sl, raw, "c", &v), 0);
	cr_assert_eq(arena_zstd_decode(&w, &v, st, "c"), 0, "%s", arena_last_error());
	cr_assert_eq(memcmp(v.plane[1], hi, n), 0);
	arena_zstd_work_free(&w);
	/* Lengths: too short for a header, not smaller than raw, raw too large. */
	cr_assert_eq(zparse(st, 11, raw), ARENA_E(IMG_CHUNK_BAD));
	cr_assert_eq(zparse(st, sl, sl), ARENA_E(IMG_CHUNK_BAD));
	/* Each header rule, and each stream rule. */
	struct {
		uint64_t at;
		uint8_t val;
		const char *says;
	} edits[] = {
		{0, 3, "element width 3"},          {0, 0, "element width 0"},
		{0, 4, "does not fit"},             {1, 6, "packed flags 0x06"},
		{1, 0, "stored as is"},             {1, 3, "zstd stream 0: a 32768-byte frame"},
		{2, 1, "bytes 2..3"},               {3, 9, "bytes 2..3"},
		{4, 1, "raw bytes, the chunk table"}, {8, 1, "stream 0 is stored as is in"},
		{12, (uint8_t)(fl + 1), "runs past"}, {12, (uint8_t)(fl - 1), "stream 1"},
		{16 + n, 0x29, "not a zstd frame"},
	};
	for (size_t k = 0; k < sizeof(edits) / sizeof(edits[0]); k++) {
		memcpy(bad, st, sl);
		bad[edits[k].at] = edits[k].val;
		if (edits[k].at == 0 && edits[k].val == 4)
			bad[0] = 8; /* a 40-byte header in 20 bytes */
		uint64_t len = edits[k].at == 0 && edits[k].val == 4 ? 20 : sl;
		cr_assert_eq(zparse(bad, len, raw), ARENA_E(IMG_CHUNK_BAD), "edit %zu", k);
		cr_assert(strstr(arena_last_error(), edits[k].says), "edit %zu: want '%s' in: %s", k, edits[k].says,
			  arena_last_error());
		cr_assert(!strncmp(arena_last_error(), "c: ", 3), "%s", arena_last_error());
	}
	/* Bytes after the last stream. */
	memcpy(bad, st, sl);
	bad[sl] = 0;
	cr_assert_eq(zparse(bad, sl + 1, raw), ARENA_E(IMG_CHUNK_BAD));
	cr_assert(strstr(arena_last_error(), "streams end at"), "%s", arena_last_error());
	/* A frame cut short, and two frames where one belongs. */
	uint64_t l2 = make_chunk(bad, n, frame, fl - 3);
	cr_assert_eq(zparse(bad, l2, raw), ARENA_E(IMG_CHUNK_BAD));
	uint8_t *two = malloc(2 * ZSTD_compressBound(n));
	size_t h1 = ZSTD_compress(two, ZSTD_compressBound(n), hi, n / 2, 1);
	size_t h2 = ZSTD_compress(two + h1, ZSTD_compressBound(n), hi, n / 2, 1);
	cr_assert(!ZSTD_isError(h1) && !ZSTD_isError(h2));
	l2 = make_chunk(bad, n, two, h1 + h2);
	cr_assert_eq(zparse(bad, l2, raw), ARENA_E(IMG_CHUNK_BAD));
	cr_assert(strstr(arena_last_error(), "ends early"), "%s", arena_last_error());
	free(two);
	/* A frame of the wrong declared size, and one that declares none. */
	size_t f2 = ZSTD_compress(frame, ZSTD_compressBound(n), hi, n - 1, 1);
	l2 = make_chunk(bad, n, frame, f2);
	cr_assert_eq(zparse(bad, l2, raw), ARENA_E(IMG_CHUNK_BAD));
	cr_assert(strstr(arena_last_error(), "declares 32767 content bytes"), "%s", arena_last_error());
	ZSTD_CCtx *cc = ZSTD_createCCtx();
	ZSTD_CCtx_setParameter(cc, ZSTD_c_contentSizeFlag, 0);
	ZSTD_inBuffer in = {hi, n, 0};
	ZSTD_outBuffer ob = {frame, ZSTD_compressBound(n), 0};
	cr_assert_eq(ZSTD_compressStream2(cc, &ob, &in, ZSTD_e_end), 0);
	ZSTD_freeCCtx(cc);
	l2 = make_chunk(bad, n, frame, ob.pos);
	cr_assert_eq(zparse(bad, l2, raw), ARENA_E(IMG_CHUNK_BAD));
	cr_assert(strstr(arena_last_error(), "no size"), "%s", arena_last_error());
	free(hi);
	free(frame);
	free(st);
	free(bad);
}

/* Where the frame header's content size field lies and how many bytes it has
 * (RFC 8878 3.1.1.1), for a frame without a dictionary. */
static void fcs_field(const uint8_t *f, uint64_t *at, unsigned *size)
{
	const unsigned fhd = f[4], flag = fhd >> 6, single = fhd >> 5 & 1;
	*at = 5 + !single;
	*size = flag == 0 ? single : flag == 1 ? 2 : flag == 2 ? 4 : 8;
}

static void set_fcs(uint8_t *f, uint64_t v)
{
	uint64_t at;
	unsigned size;
	fcs_field(f, &at, &size);
	if (size == 2)
		v -= 256;
	for (unsigned i = 0; i < size; i++)
		f[at + i] = (uint8_t)(v >> (8 * i));
}

Test(codec_zstd, lying_frame_headers_decode_bounded)
{
	/* Frames whose header declares the stream's size while their blocks hold
	 * more, or fewer, bytes: parse (headers only) takes them, decode refuses
	 * them, and never writes past the stream's room. */
	const uint64_t n = 32768, raw = 2 * n;
	uint8_t *hi = malloc(4 * n), *frame = malloc(ZSTD_compressBound(4 * n)), *st = malloc(8 * n);
	for (uint64_t i = 0; i < 4 * n; i++)
		hi[i] = (uint8_t)(0x3c + (i * 7) % 5);
	uint64_t fat;
	unsigned fsz;
	/* More: 2n bytes inside, n declared (both fit the 2-byte size field). */
	size_t fl = ZSTD_compress(frame, ZSTD_compressBound(4 * n), hi, 2 * n, 1);
	cr_assert(!ZSTD_isError(fl) && fl < n);
	fcs_field(frame, &fat, &fsz);
	cr_assert_eq(fsz, 2, "the test edits a 2-byte content size");
	set_fcs(frame, n);
	decode_refuses(st, make_chunk(st, n, frame, fl), raw, "more bytes than declared");
	/* Fewer: n/2 inside, n declared. */
	fl = ZSTD_compress(frame, ZSTD_compressBound(4 * n), hi, n / 2, 1);
	fcs_field(frame, &fat, &fsz);
	cr_assert_eq(fsz, 2);
	set_fcs(frame, n);
	decode_refuses(st, make_chunk(st, n, frame, fl), raw, "fewer bytes than declared");
	/* A block's bytes damaged under the right header. */
	fl = ZSTD_compress(frame, ZSTD_compressBound(4 * n), hi, n, 1);
	for (uint64_t k = 12; k < fl; k += fl / 9 + 1) {
		uint64_t l = make_chunk(st, n, frame, fl);
		st[16 + n + k] ^= 0x5a;
		arena_zstd v;
		arena_zstd_work w = {0};
		int rc = arena_zstd_parse(st, l, raw, "c", &v);
		if (!rc)
			rc = arena_zstd_decode(&w, &v, st, "c");
		if (!rc) /* zstd decoded it to n bytes anyway: those are what the checksum covered */
			cr_assert_eq(w.cap, n);
		else
			cr_assert_eq(rc, ARENA_E(IMG_CHUNK_BAD), "%s", arena_last_error());
		arena_zstd_work_free(&w);
	}
	free(hi);
	free(frame);
	free(st);
}

Test(codec_zstd, allocation_failures)
{
	uint64_t W = 64 << 10;
	uint8_t *raw = weights(W, 9), *st = malloc(2 * W);
	long live = arena_alloc_live(), n;
	for (n = 1; n < 1000; n++) {
		arena_zstd_work w = {0};
		uint64_t len = 0;
		arena_fault_alloc(n);
		int rc = arena_zstd_encode(&w, raw, 2 * W, 2, 1, st, &len);
		int fired = arena_fault_alloc_fired();
		arena_zstd v;
		if (!rc && !fired) {
			arena_fault_alloc(n - arena_fault_alloc_count());
			cr_assert_eq(arena_zstd_parse(st, len, 2 * W, "t", &v), 0);
			rc = arena_zstd_decode(&w, &v, st, "t");
			fired = arena_fault_alloc_fired();
		}
		arena_fault_alloc(0);
		arena_zstd_work_free(&w);
		cr_assert_eq(arena_alloc_live(), live, "n=%ld leaked", n);
		if (!fired) {
			cr_assert_eq(rc, 0, "%s", arena_last_error());
			break;
		}
		cr_assert(rc == 0 || rc == ARENA_E_NOMEM, "n=%ld: %s: %s", n, arena_err_name(rc), arena_last_error());
	}
	cr_assert_gt(n, 3, "zstd's own allocations go through arena_malloc");
	free(raw);
	free(st);
}
