/* quant_int4.c - the int4 schemes: group kernels (baseline and AVX2) and their drivers; see quant.h.
 *
 * int4-g32, int4-g64 and int4-g128 store each row in groups of N columns:
 * codes packed two a byte, a scale (the source's dtype) and a zero point a
 * group (docs/QUANT.md). quant.c's public calls hand an int4 plan to the
 * drivers here (arena__quant_int4_run, _fill, _dequant: quant_int.h); the
 * kernels follow quant.c's pattern: specialized by always_inline on the
 * source kind and group size, built for the baseline ISA and for AVX2. */
#include "quant_int.h"

#include <stdint.h>
#include <string.h>

#include "../common/err.h"

#define E(name) ARENA_E(name)

/* ---- int4 groups ----------------------------------------------------------------
 *
 * One group of an int4 scheme (formats/elem.h's rules): its range, its scale
 * as stored and its zero point and, when asked for, its codes packed two a
 * byte. Specialized on the source kind and, for groups of 32, 64 and 128
 * values, on the count (a constant trip count: gcc vectorizes the loops); a
 * row's short last group takes the same code with its own count. (int4_group,
 * the results, and int4_fn, the kernels' type: quant_int.h.) */

/* The float order of a float's bits as a signed integer (an involution: it
 * also turns such an integer back into the bits); NaNs lie beyond +-inf. */
INLINE int32_t order_key(uint32_t b)
{
	return (int32_t)(b ^ ((uint32_t)((int32_t)b >> 31) & 0x7FFFFFFFu));
}

INLINE int16_t order_key16(uint16_t h)
{
	return (int16_t)(h ^ ((uint16_t)((int16_t)h >> 15) & 0x7FFFu));
}

/* The group's lo = min(0, min x) and hi = max(0, max x) as f32, from the
 * order keys of its bits (16-bit lanes for BF16 and F16: twice as many a
 * vector); 0 when it holds a NaN or an infinity. */
INLINE int int4_range(int sk, const unsigned char *restrict s, size_t n, float *lo, float *hi)
{
	if (sk == SK_F32) {
		int32_t l = 0, h = 0;
		for (size_t i = 0; i < n; i++) {
			uint32_t u;
			memcpy(&u, s + 4 * i, 4);
			const int32_t k = order_key(u);
			l = k < l ? k : l;
			h = k > h ? k : h;
		}
		*lo = arena__f32_of((uint32_t)order_key((uint32_t)l));
		*hi = arena__f32_of((uint32_t)h);
		return l >= (int32_t)0x80800000u && h <= 0x7F7FFFFF; /* -FLT_MAX <= lo, hi <= FLT_MAX */
	}
	int16_t l = 0, h = 0;
	for (size_t i = 0; i < n; i++) {
		uint16_t u;
		memcpy(&u, s + 2 * i, 2);
		const int16_t k = order_key16(u);
		l = k < l ? k : l;
		h = k > h ? k : h;
	}
	const uint16_t lb = (uint16_t)order_key16((uint16_t)l), hb = (uint16_t)h;
	if (sk == SK_BF16) {
		*lo = arena__bf16_to_f32(lb);
		*hi = arena__bf16_to_f32(hb);
		return l >= (int16_t)0x8080 && h <= 0x7F7F;
	}
	*lo = arena__f16_to_f32(lb);
	*hi = arena__f16_to_f32(hb);
	return l >= (int16_t)0x8400 && h <= 0x7BFF;
}

INLINE int4_group int4_group_n(int sk, const unsigned char *restrict s, size_t n, unsigned char *restrict q)
{
	float flo, fhi;
	int4_group g;
	g.finite = int4_range(sk, s, n, &flo, &fhi);
	const float t = (fhi - flo) / 15.0f;
	g.finite &= arena__bits_of(t) < ARENA_F32_INF; /* hi - lo did not overflow */
	float sf;
	if (sk == SK_BF16) {
		g.sbits = arena__f32_to_bf16(t);
		sf = arena__bf16_to_f32(g.sbits);
	} else if (sk == SK_F16) {
		g.sbits = arena__f32_to_f16(t);
		sf = arena__f16_to_f32(g.sbits);
	} else {
		g.sbits = arena__bits_of(t);
		sf = t;
	}
	const float d = sf == 0.0f ? 1.0f : sf;
	g.z = arena__int4_zero(flo, d);
	if (q) {
		uint32_t c[128];
		for (size_t i = 0; i < n; i++)
			c[i] = arena__int4_code(load(sk, s, i), d, g.z);
		for (size_t k = 0; k < n / 2; k++)
			q[k] = (unsigned char)(c[2 * k] | c[2 * k + 1] << 4);
		if (n & 1)
			q[n / 2] = (unsigned char)c[n - 1];
	}
	return g;
}

/* The kernels int4_fn (quant_int.h) stands for, over a row's groups. */
INLINE uint64_t int4_groups(const arena_quant_plan *p, int sk, size_t G, const unsigned char *src, uint64_t r,
			    uint64_t g, uint64_t count, int4_group *out, unsigned char *q)
{
	const unsigned char *s = src + (r * p->cols + g * G) * sk_size[sk];
	for (uint64_t k = 0; k < count; k++, s += G * sk_size[sk]) {
		const uint64_t c0 = (g + k) * G;
		unsigned char *qk = q ? q + k * (G / 2) : NULL;
		if (p->cols - c0 >= G)
			out[k] = int4_group_n(sk, s, G, qk);
		else
			out[k] = int4_group_n(sk, s, (size_t)(p->cols - c0), qk);
		if (!out[k].finite)
			return k;
	}
	return count;
}

#define ARENA__QUANT_INT4(NAME, ATTR)                                                                          \
	ATTR static uint64_t NAME(const arena_quant_plan *p, int sk, const unsigned char *src, uint64_t r,    \
				  uint64_t g, uint64_t count, int4_group *out, unsigned char *q)               \
	{                                                                                                      \
		switch (sk * 256 + (int)p->group) {                                                            \
			I4(SK_BF16)                                                                           \
			I4(SK_F16)                                                                            \
			I4(SK_F32)                                                                            \
		}                                                                                              \
		return 0;                                                                                      \
	}
#define I4(SK)                                                                  \
	case SK * 256 + 32:                                                     \
		return int4_groups(p, SK, 32, src, r, g, count, out, q);        \
	case SK * 256 + 64:                                                     \
		return int4_groups(p, SK, 64, src, r, g, count, out, q);        \
	case SK * 256 + 128:                                                    \
		return int4_groups(p, SK, 128, src, r, g, count, out, q);

ARENA__QUANT_INT4(int4_base, )
#ifdef HAVE_AVX2_KERNELS
ARENA__QUANT_INT4(int4_avx2, __attribute__((target("avx2"))))
#endif
#undef I4

/* The int4 kernels that go with the converters `cv` (arena__quant_pick_convert). */
static int4_fn int4_kernels(convert_fn cv)
{
#ifdef HAVE_AVX2_KERNELS
	if (arena__quant_is_avx2(cv))
		return int4_avx2;
#endif
	(void)cv;
	return int4_base;
}

#define INT4_BATCH 64 /* groups a kernel call does at most (the results on the stack) */

static int int4_refuse(const arena_quant_plan *p, uint64_t r, uint64_t g)
{
	const uint64_t c0 = g * p->group, c1 = (p->cols - c0 < p->group ? p->cols : c0 + p->group) - 1;
	return arena_errorf(E(QUANT_NOT_APPLICABLE),
			    "%s: row %llu, columns %llu to %llu (group %llu) hold a NaN or an infinity, or values "
			    "too far apart for an f32 scale: int4 has no code for them; leave the tensor out "
			    "(--quant-exclude) or mend its values",
			    arena_quant_name(p->scheme), (unsigned long long)r, (unsigned long long)c0,
			    (unsigned long long)c1, (unsigned long long)g);
}

/* int4: rows [first, first + count) of the range (its row 0 at src and the
 * dst*), every group straight into its place; a worker stops at its first
 * group refused. */
static void task_int4_rows(task *t, uint64_t first, uint64_t count, unsigned slot)
{
	const arena_quant_plan *p = t->p;
	const uint64_t rb = p->cols / 2 + p->cols % 2, es = sk_size[t->sk];
	int4_group res[INT4_BATCH];
	t->bad[slot] = UINT64_MAX;
	for (uint64_t r = first; r < first + count; r++) {
		for (uint64_t g = 0; g < p->groups; g += INT4_BATCH) {
			const uint64_t k = p->groups - g < INT4_BATCH ? p->groups - g : INT4_BATCH;
			const uint64_t ok = t->i4(p, t->sk, t->src, r, g, k, res, t->dst + r * rb + g * (p->group / 2));
			for (uint64_t i = 0; i < ok; i++) {
				const uint64_t v = r * p->groups + g + i;
				memcpy(t->dst2 + v * es, &res[i].sbits, es); /* little-endian: the low bytes */
				t->dst3[v] = (unsigned char)res[i].z;
			}
			if (ok < k) {
				t->bad[slot] = r * p->groups + g + ok;
				return;
			}
		}
	}
}

/* int4: rows [first, first + count) of values (q - z) x scale as f32. */
static void task_int4_deq_rows(task *t, uint64_t first, uint64_t count, unsigned slot)
{
	(void)slot;
	const arena_quant_plan *p = t->p;
	const uint64_t rb = p->cols / 2 + p->cols % 2;
	for (uint64_t r = first; r < first + count; r++) {
		float *d = (float *)(void *)t->dst + r * p->cols;
		for (uint64_t c = 0; c < p->cols; c++) {
			const uint64_t v = r * p->groups + c / p->group;
			const uint32_t b = t->src[r * rb + c / 2];
			uint16_t h;
			float s;
			if (t->sk == SK_F32) {
				memcpy(&s, t->src2 + 4 * v, 4);
			} else {
				memcpy(&h, t->src2 + 2 * v, 2);
				s = t->sk == SK_BF16 ? arena__bf16_to_f32(h) : arena__f16_to_f32(h);
			}
			d[c] = arena__int4_value((c & 1) ? b >> 4 : b & 15u, t->src3[v], s);
		}
	}
}

/* As for the row schemes: the range seen as units [0, count). */
int arena__quant_int4_run(const arena_quant_plan *p, int sk, const unsigned char *s, uint64_t first, uint64_t count,
			  void *const dst[], unsigned threads)
{
	const uint64_t rb = p->cols / 2 + p->cols % 2;
	const convert_fn cv = arena__quant_pick_convert();
	task t = {.fn = task_int4_rows,
		  .cv = cv,
		  .i4 = int4_kernels(cv),
		  .p = p,
		  .sk = sk,
		  .src = s,
		  .dst = (unsigned char *)dst[0] + first * rb,
		  .dst2 = (unsigned char *)dst[1] + first * p->groups * sk_size[sk],
		  .dst3 = (unsigned char *)dst[2] + first * p->groups};
	const unsigned used = arena__quant_parallel(&t, count, p->cols, threads);
	uint64_t bad = UINT64_MAX;
	for (unsigned k = 0; k < used; k++)
		bad = t.bad[k] < bad ? t.bad[k] : bad;
	if (bad != UINT64_MAX)
		return int4_refuse(p, first + bad / p->groups, bad % p->groups);
	return 0;
}

void arena__quant_int4_dequant(const arena_quant_plan *p, int sk, const void *const src[], float *dst,
			       unsigned threads)
{
	task t = {.fn = task_int4_deq_rows, .p = p, .sk = sk, .src = src[0], .src2 = src[1], .src3 = src[2],
		  .dst = (unsigned char *)dst};
	arena__quant_parallel(&t, p->rows, p->cols, threads);
}

/* int4: bytes [off, off + len) of component comp, group by group: codes
 * (whole groups straight to d, a group cut by the range through a scratch),
 * or the scale or zero point of each (row, group) the range touches. */
int arena__quant_int4_fill(const arena_quant_plan *p, int sk, const unsigned char *src, uint32_t comp, uint64_t off,
			   uint64_t len, unsigned char *d)
{
	const int4_fn f = int4_kernels(arena__quant_pick_convert());
	const uint64_t end = off + len;
	int4_group res[INT4_BATCH];
	if (comp == 0) {
		const uint64_t rb = p->cols / 2 + p->cols % 2, gb = p->group / 2; /* bytes a row, a whole group */
		for (uint64_t r = off / rb; r * rb < end; r++) {
			/* the row's bytes [a, z) in the range: groups [g0, g1) touch them,
			 * the inner ones [w0, w1) lie whole inside */
			const uint64_t a = (r * rb > off ? r * rb : off) - r * rb;
			const uint64_t z = ((r + 1) * rb < end ? (r + 1) * rb : end) - r * rb;
			const uint64_t g0 = a / gb, g1 = (z + gb - 1) / gb;
			const uint64_t w0 = (a + gb - 1) / gb, w1 = z == rb ? p->groups : z / gb;
			for (uint64_t g = g0; g < g1;) {
				const int whole = g >= w0 && g < w1;
				const uint64_t k = whole ? (w1 - g < INT4_BATCH ? w1 - g : INT4_BATCH) : 1;
				unsigned char tmp[64];
				const uint64_t ok = f(p, sk, src, r, g, k, res, whole ? d + (r * rb + g * gb - off) : tmp);
				if (ok < k)
					return int4_refuse(p, r, g + ok);
				if (!whole) { /* the part of group g's bytes in [a, z) */
					const uint64_t b0 = g * gb, b1 = b0 + gb < rb ? b0 + gb : rb;
					const uint64_t x = b0 > a ? b0 : a, y = b1 < z ? b1 : z;
					memcpy(d + (r * rb + x - off), tmp + (x - b0), y - x);
				}
				g += k;
			}
		}
		return 0;
	}
	const uint64_t es = comp == 1 ? sk_size[sk] : 1; /* bytes a value */
	const uint64_t last = (end - 1) / es;            /* the last value the range touches */
	for (uint64_t v = off / es; v <= last;) {
		/* values of one row at a time, INT4_BATCH groups a call */
		const uint64_t r = v / p->groups, g = v % p->groups;
		uint64_t k = p->groups - g < INT4_BATCH ? p->groups - g : INT4_BATCH;
		k = last - v + 1 < k ? last - v + 1 : k;
		const uint64_t ok = f(p, sk, src, r, g, k, res, NULL);
		if (ok < k)
			return int4_refuse(p, r, g + ok);
		for (uint64_t i = 0; i < k; i++, v++) {
			const uint32_t x = comp == 1 ? res[i].sbits : res[i].z; /* little-endian: the low es bytes */
			const uint64_t a0 = v * es > off ? v * es : off, z0 = v * es + es < end ? v * es + es : end;
			memcpy(d + (a0 - off), (const unsigned char *)&x + (a0 - v * es), z0 - a0);
		}
	}
	return 0;
}
