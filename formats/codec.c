/* codec.c - chunk codecs (see codec.h and docs/FORMAT.md). */
#include "codec.h"

#include <inttypes.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif
/* ZSTD_customMem and the _advanced constructors: zstd's memory comes from
 * arena_malloc like every other allocation of the library (exported by
 * libzstd.so, unchanged since zstd 1.0). */
#define ZSTD_STATIC_LINKING_ONLY
#include <zstd.h>
#include <zstd_errors.h>

#include "../common/alloc.h"
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

uint64_t arena_hb4_sub_bound(uint64_t a, uint64_t z, uint64_t n_exc)
{
	return arena_hb4_stored_length(z - a, n_exc);
}

uint64_t arena_hb4_sub(const arena_hb4 *v, uint64_t a, uint64_t z, uint8_t *out, arena_hb4 *s)
{
	const uint64_t w0 = a / 2, W = (z - a) / 2;
	memset(s, 0, sizeof(*s));
	s->words = W;
	memcpy(s->table, v->table, 16);
	s->nib_off = arena_hb4_nib_off();
	s->low_off = arena_hb4_low_off(W);
	s->idx_off = arena_hb4_idx_off(W);
	uint8_t *nib = out + s->nib_off, *low = out + s->low_off, *idx = out + s->idx_off;
	memcpy(nib, v->nib + w0 / 2, (W + 1) / 2);
	if (W % 2) /* the last byte's high nibble is a word past z */
		nib[W / 2] &= 15;
	memset(nib + (W + 1) / 2, 0, s->low_off - s->nib_off - (W + 1) / 2);
	memcpy(low, v->low + w0, W);
	memset(low + W, 0, s->idx_off - s->low_off - W);
	uint64_t e0 = exc_lower(v, w0), e1 = exc_lower(v, w0 + W), E = e1 - e0;
	for (uint64_t e = e0; e < e1; e++)
		put32(idx + 4 * (e - e0), get32(v->exc_idx + 4 * e) - (uint32_t)w0);
	memcpy(idx + 4 * E, v->exc_hi + e0, E);
	s->n_exc = E;
	s->hi_off = s->idx_off + 4 * E;
	memset(out, 0, ARENA_HB4_HEADER);
	put32(out, (uint32_t)E);
	put32(out + 4, (uint32_t)W);
	memcpy(out + 8, v->table, 16);
	s->nib = nib;
	s->low = low;
	s->exc_idx = idx;
	s->exc_hi = idx + 4 * E;
	return s->hi_off + E;
}

int arena_hb4_decode_args(const char *name, void *dst, const void *src, const arena_hb4 *v, uint64_t a, uint64_t z)
{
	if (!v || !dst || !src)
		return arena_errorf(ARENA_E_USAGE, "%s: decode_hb4 with a NULL %s", name,
				    !v ? "chunk" : !dst ? "destination" : "source");
	const uint64_t W = v->words, E = v->n_exc;
	if (!W || W > UINT32_MAX / 2 || E > W || v->nib_off != arena_hb4_nib_off() || v->low_off != arena_hb4_low_off(W) ||
	    v->idx_off != arena_hb4_idx_off(W) || v->hi_off != v->idx_off + 4 * E)
		return arena_errorf(ARENA_E_USAGE, "%s: decode_hb4: the chunk is not an hb4 parse (%llu words, %llu exceptions)",
				    name, (unsigned long long)W, (unsigned long long)E);
	if (a % 2 || z % 2 || a > z || z > 2 * W)
		return arena_errorf(ARENA_E_USAGE,
				    "%s: decode_hb4 of raw bytes [%llu, %llu): not an even range within the chunk's %llu bytes",
				    name, (unsigned long long)a, (unsigned long long)z, (unsigned long long)(2 * W));
	return 0;
}

const char *arena_codec_name(unsigned codec)
{
	return codec == ARENA_CODEC_NONE ? "none"
	       : codec == ARENA_CODEC_HB4 ? "hb4"
	       : codec == ARENA_CODEC_ZSTD ? "zstd"
					   : NULL;
}

int arena_codec_from_name(const char *name)
{
	return !strcmp(name, "none")   ? ARENA_CODEC_NONE
	       : !strcmp(name, "hb4")  ? ARENA_CODEC_HB4
	       : !strcmp(name, "zstd") ? ARENA_CODEC_ZSTD
				       : -1;
}

/* ---- zstd ------------------------------------------------------------------------ */

static void *zalloc(void *opaque, size_t n)
{
	(void)opaque;
	return arena_malloc(n);
}

static void zfree(void *opaque, void *p)
{
	(void)opaque;
	arena_free(p);
}

static const ZSTD_customMem zmem = {zalloc, zfree, NULL};

void arena_zstd_work_free(arena_zstd_work *w)
{
	ZSTD_freeCCtx(w->cctx);
	ZSTD_freeDCtx(w->dctx);
	arena_free(w->buf);
	memset(w, 0, sizeof(*w));
}

static int work_buf(arena_zstd_work *w, uint64_t n)
{
	if (w->cap >= n)
		return 0;
	arena_free(w->buf);
	w->cap = 0;
	if (!(w->buf = arena_malloc(n)))
		return arena_errorf(ARENA_E_NOMEM, "out of memory for a %" PRIu64 "-byte zstd stream buffer", n);
	w->cap = n;
	return 0;
}

static int valid_width(unsigned g)
{
	return g == 1 || g == 2 || g == 4 || g == 8;
}

uint64_t arena_zstd_header(unsigned width)
{
	return 8 + 4 * (uint64_t)width;
}

int arena_zstd_lengths_ok(uint64_t raw_length, uint64_t stored_length)
{
	return raw_length <= UINT32_MAX && stored_length >= arena_zstd_header(1) && stored_length < raw_length;
}

unsigned arena_zstd_width_for_bits(unsigned bits)
{
	return bits == 16 ? 2 : bits == 32 ? 4 : bits == 64 ? 8 : 1;
}

/* raw (n elements of g bytes) into g streams of n bytes at planes. */
static void split(const uint8_t *raw, uint64_t n, unsigned g, uint8_t *planes)
{
	uint64_t e = 0;
#ifdef __SSE2__
	if (g == 2) {
		const __m128i m = _mm_set1_epi16(0xff);
		for (; e + 16 <= n; e += 16) {
			__m128i a = _mm_loadu_si128((const __m128i *)(const void *)(raw + 2 * e));
			__m128i b = _mm_loadu_si128((const __m128i *)(const void *)(raw + 2 * e + 16));
			_mm_storeu_si128((__m128i *)(void *)(planes + e),
					 _mm_packus_epi16(_mm_and_si128(a, m), _mm_and_si128(b, m)));
			_mm_storeu_si128((__m128i *)(void *)(planes + n + e),
					 _mm_packus_epi16(_mm_srli_epi16(a, 8), _mm_srli_epi16(b, 8)));
		}
	}
#endif
	for (; e < n; e++)
		for (unsigned k = 0; k < g; k++)
			planes[k * n + e] = raw[g * e + k];
}

int arena_zstd_encode(arena_zstd_work *w, const uint8_t *raw, uint64_t raw_length, unsigned width, int level,
		      uint8_t *out, uint64_t *stored)
{
	*stored = 0;
	if (!valid_width(width))
		return arena_errorf(ARENA_E_USAGE, "zstd element width %u is not 1, 2, 4 or 8", width);
	if (!level)
		level = ARENA_ZSTD_DEFAULT_LEVEL;
	if (level < 1 || level > ARENA_ZSTD_MAX_LEVEL)
		return arena_errorf(ARENA_E_USAGE, "zstd level %d is not from 1 to %d", level, ARENA_ZSTD_MAX_LEVEL);
	const uint64_t H = arena_zstd_header(width), n = raw_length / width;
	if (!raw_length || raw_length % width || raw_length > UINT32_MAX || H >= raw_length)
		return 0;
	if (!w->cctx && !(w->cctx = ZSTD_createCCtx_advanced(zmem)))
		return arena_errorf(ARENA_E_NOMEM, "out of memory for a zstd compression context");
	if (w->clevel != level) {
		size_t r = ZSTD_CCtx_setParameter(w->cctx, ZSTD_c_compressionLevel, level);
		if (!ZSTD_isError(r))
			r = ZSTD_CCtx_setParameter(w->cctx, ZSTD_c_contentSizeFlag, 1);
		if (!ZSTD_isError(r))
			r = ZSTD_CCtx_setParameter(w->cctx, ZSTD_c_checksumFlag, 0); /* the chunk's xxh3 covers it */
		if (!ZSTD_isError(r))
			r = ZSTD_CCtx_setParameter(w->cctx, ZSTD_c_dictIDFlag, 0);
		if (ZSTD_isError(r))
			return arena_errorf(ARENA_E_INTERNAL, "zstd: cannot set level %d: %s", level, ZSTD_getErrorName(r));
		w->clevel = level;
	}
	const uint8_t *plane[ARENA_ZSTD_MAX_STREAMS] = {raw};
	if (width > 1) {
		int rc = work_buf(w, raw_length);
		if (rc)
			return rc;
		split(raw, n, width, w->buf);
		for (unsigned k = 0; k < width; k++)
			plane[k] = w->buf + k * n;
	}
	memset(out, 0, H);
	uint64_t pos = H;
	unsigned packed = 0;
	for (unsigned k = 0; k < width; k++) {
		/* Everything must end before raw_length: a stream gets what is left. */
		if (pos >= raw_length)
			return 0;
		const uint64_t room = raw_length - 1 - pos, cap = n - 1 < room ? n - 1 : room;
		size_t r = 0;
		if (cap) {
			r = ZSTD_compress2(w->cctx, out + pos, cap, plane[k], n);
			if (ZSTD_isError(r) && ZSTD_getErrorCode(r) == ZSTD_error_memory_allocation)
				return arena_errorf(ARENA_E_NOMEM, "out of memory compressing a chunk with zstd");
		}
		uint64_t len;
		if (cap && !ZSTD_isError(r)) {
			packed |= 1u << k;
			len = r;
		} else { /* no smaller (dstSize_tooSmall): as is */
			if (n > room)
				return 0;
			memcpy(out + pos, plane[k], n);
			len = n;
		}
		put32(out + 8 + 4 * k, (uint32_t)len);
		pos += len;
	}
	out[0] = (uint8_t)width;
	out[1] = (uint8_t)packed;
	put32(out + 4, (uint32_t)raw_length);
	*stored = pos;
	return 0;
}

#define ZBAD(...) arena_errorf(E(IMG_CHUNK_BAD), __VA_ARGS__)

int arena_zstd_parse(const uint8_t *s, uint64_t stored_length, uint64_t raw_length, const char *what, arena_zstd *v)
{
	memset(v, 0, sizeof(*v));
	if (!arena_zstd_lengths_ok(raw_length, stored_length))
		return ZBAD("%s: %" PRIu64 " stored bytes cannot hold %" PRIu64 " bytes with codec zstd", what, stored_length,
			    raw_length);
	const unsigned G = s[0], packed = s[1];
	if (!valid_width(G))
		return ZBAD("%s: zstd header: element width %u is not 1, 2, 4 or 8", what, G);
	const uint64_t H = arena_zstd_header(G);
	if (stored_length < H)
		return ZBAD("%s: zstd header of %" PRIu64 " bytes does not fit in %" PRIu64 " stored bytes", what, H,
			    stored_length);
	if (packed >> G)
		return ZBAD("%s: zstd header: packed flags 0x%02x name streams past the %u there are", what, packed, G);
	if (s[2] || s[3])
		return ZBAD("%s: zstd header bytes 2..3 are not zero", what);
	if (get32(s + 4) != raw_length)
		return ZBAD("%s: zstd header says %" PRIu32 " raw bytes, the chunk table %" PRIu64, what, get32(s + 4),
			    raw_length);
	if (raw_length % G)
		return ZBAD("%s: %" PRIu64 " raw bytes are not whole %u-byte elements", what, raw_length, G);
	const uint64_t n = raw_length / G;
	uint64_t pos = H;
	for (unsigned k = 0; k < G; k++) {
		const uint64_t len = get32(s + 8 + 4 * k);
		const uint8_t *f = s + pos;
		if (len > stored_length - pos)
			return ZBAD("%s: zstd stream %u of %" PRIu64 " bytes at stored byte %" PRIu64
				    " runs past the %" PRIu64 " stored bytes",
				    what, k, len, pos, stored_length);
		if (!(packed >> k & 1)) {
			if (len != n)
				return ZBAD("%s: zstd stream %u is stored as is in %" PRIu64 " bytes, not %" PRIu64, what,
					    k, len, n);
			v->plane[k] = f;
		} else {
			if (len >= n)
				return ZBAD("%s: zstd stream %u: a %" PRIu64 "-byte frame for %" PRIu64
					    " bytes (a frame must be smaller than its stream)",
					    what, k, len, n);
			if (len < 4 || get32(f) != ZSTD_MAGICNUMBER)
				return ZBAD("%s: zstd stream %u is not a zstd frame", what, k);
			const size_t fs = ZSTD_findFrameCompressedSize(f, len);
			if (ZSTD_isError(fs) || fs != len)
				return ZBAD("%s: zstd stream %u: %s%s (the stream is %" PRIu64 " bytes)", what, k,
					    ZSTD_isError(fs) ? "the frame is malformed: " : "the frame ends early",
					    ZSTD_isError(fs) ? ZSTD_getErrorName(fs) : "", len);
			const unsigned long long cs = ZSTD_getFrameContentSize(f, len);
			if (cs != n)
				return ZBAD("%s: zstd stream %u: the frame declares %s%llu content bytes, the stream is %" PRIu64,
					    what, k, cs == ZSTD_CONTENTSIZE_UNKNOWN || cs == ZSTD_CONTENTSIZE_ERROR ? "no size: " : "",
					    cs == ZSTD_CONTENTSIZE_UNKNOWN || cs == ZSTD_CONTENTSIZE_ERROR ? 0ull : cs, n);
			if (ZSTD_getDictID_fromFrame(f, len))
				return ZBAD("%s: zstd stream %u: the frame names dictionary %u (none may be used)", what, k,
					    ZSTD_getDictID_fromFrame(f, len));
		}
		v->off[k] = pos;
		v->len[k] = len;
		pos += len;
	}
	if (pos != stored_length)
		return ZBAD("%s: zstd streams end at stored byte %" PRIu64 " of %" PRIu64, what, pos, stored_length);
	v->raw = raw_length;
	v->n = n;
	v->width = G;
	v->packed = packed;
	return 0;
}

int arena_zstd_decode(arena_zstd_work *w, arena_zstd *v, const uint8_t *stored, const char *what)
{
	unsigned m = 0;
	for (unsigned k = 0; k < v->width; k++)
		m += v->packed >> k & 1;
	if (!m)
		return 0;
	int rc = work_buf(w, m * v->n);
	if (rc)
		return rc;
	if (!w->dctx && !(w->dctx = ZSTD_createDCtx_advanced(zmem)))
		return arena_errorf(ARENA_E_NOMEM, "out of memory for a zstd decompression context");
	uint8_t *dst = w->buf;
	for (unsigned k = 0; k < v->width; k++) {
		if (!(v->packed >> k & 1))
			continue;
		/* Bounded: room for the stream's n bytes and not one more. */
		const size_t r = ZSTD_decompressDCtx(w->dctx, dst, v->n, stored + v->off[k], v->len[k]);
		if (ZSTD_isError(r) && ZSTD_getErrorCode(r) == ZSTD_error_memory_allocation)
			return arena_errorf(ARENA_E_NOMEM, "out of memory decompressing a zstd stream");
		if (ZSTD_isError(r))
			return ZBAD("%s: zstd stream %u does not decode to its %" PRIu64 " bytes: %s", what, k, v->n,
				    ZSTD_getErrorName(r));
		if (r != v->n)
			return ZBAD("%s: zstd stream %u decodes to %zu bytes, not %" PRIu64, what, k, r, v->n);
		v->plane[k] = dst;
		dst += v->n;
	}
	return 0;
}

/* Whole elements [e0, e1) of a decoded chunk into dst. */
static void interleave(const arena_zstd *v, uint64_t e0, uint64_t e1, uint8_t *dst)
{
	const unsigned g = v->width;
	uint64_t e = e0;
	uint8_t *d = dst;
	if (g == 2) {
		const uint8_t *p0 = v->plane[0], *p1 = v->plane[1];
#ifdef __SSE2__
		for (; e + 16 <= e1; e += 16, d += 32) {
			__m128i lo = _mm_loadu_si128((const __m128i *)(const void *)(p0 + e));
			__m128i hi = _mm_loadu_si128((const __m128i *)(const void *)(p1 + e));
			_mm_storeu_si128((__m128i *)(void *)d, _mm_unpacklo_epi8(lo, hi));
			_mm_storeu_si128((__m128i *)(void *)(d + 16), _mm_unpackhi_epi8(lo, hi));
		}
#endif
		for (; e < e1; e++, d += 2)
			d[0] = p0[e], d[1] = p1[e];
		return;
	}
	for (; e < e1; e++, d += g)
		for (unsigned k = 0; k < g; k++)
			d[k] = v->plane[k][e];
}

void arena_zstd_gather(const arena_zstd *v, uint64_t a, uint64_t z, uint8_t *dst)
{
	const unsigned g = v->width;
	if (g == 1) {
		memcpy(dst, v->plane[0] + a, z - a);
		return;
	}
	for (; a < z && a % g; a++)
		*dst++ = v->plane[a % g][a / g];
	if (a >= z)
		return;
	const uint64_t e0 = a / g, e1 = z / g;
	interleave(v, e0, e1, dst);
	dst += (e1 - e0) * g;
	for (a = e1 * g; a < z; a++)
		*dst++ = v->plane[a % g][a / g];
}

uint64_t arena_zstd_first_nonzero(const arena_zstd *v, uint64_t a, uint64_t z)
{
	const unsigned g = v->width;
	uint64_t best = z;
	for (unsigned k = 0; k < g; k++) {
		/* Plane k holds raw bytes e*g + k: from the first at or after a. */
		for (uint64_t e = a > k ? (a - k + g - 1) / g : 0; e * g + k < best; e++)
			if (v->plane[k][e]) {
				best = e * g + k;
				break;
			}
	}
	return best;
}
