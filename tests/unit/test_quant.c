/* test_quant.c - convert/quant: bit-exact against torch's reference file,
 * plans and their errors, thread-count independence, streaming pieces,
 * compressed-tensors recognition, and exhaustive checks of every cast against
 * slow, obviously correct reference implementations written here. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "arena.h"
#include "../../formats/checkpoint.h"
#include "../../formats/layout.h"
#include "../../formats/safetensors.h"
#include "../../convert/quant.h"
#include "testutil.h"

/* ---- helpers ------------------------------------------------------------------ */

static float f32_of(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}

static uint32_t bits_of(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

static float bf16_val(uint16_t h)
{
	return f32_of((uint32_t)h << 16);
}

/* Index of the first differing byte, or -1. */
static long first_diff(const void *a, const void *b, size_t n)
{
	const unsigned char *x = a, *y = b;
	for (size_t i = 0; i < n; i++)
		if (x[i] != y[i])
			return (long)i;
	return -1;
}

#define assert_same_bytes(got, want, n, what)                                                        \
	do {                                                                                         \
		long d_ = first_diff((got), (want), (n));                                            \
		cr_assert(d_ < 0, "%s: first difference at byte %ld: got 0x%02x, want 0x%02x", (what), \
			  d_, d_ < 0 ? 0 : ((const unsigned char *)(got))[d_],                        \
			  d_ < 0 ? 0 : ((const unsigned char *)(want))[d_]);                          \
	} while (0)

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint64_t rnd(void)
{
	/* splitmix64 */
	uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

/* A float from a mix of ranges: ordinary, tiny, huge, specials. */
static float rnd_value(void)
{
	uint64_t r = rnd();
	switch (r % 16) {
	case 0:
		return f32_of((uint32_t)(r >> 32)); /* any pattern, NaN included */
	case 1:
		return (r >> 8) & 1 ? 0.0f : -0.0f;
	case 2:
		return ldexpf((float)((r >> 8) & 0xFFFFFF) / 16777216.0f, -130 + (int)((r >> 40) % 30));
	case 3:
		return ldexpf((float)((r >> 8) & 0xFFFFFF) / 16777216.0f, (int)((r >> 40) % 40)) *
		       ((r >> 60) & 1 ? -1.0f : 1.0f);
	default:
		return ldexpf((float)((r >> 8) & 0xFFFFFF) / 16777216.0f - 0.5f, (int)((r >> 40) % 12) - 6);
	}
}

/* Same, without NaN and inf (scaled schemes turn a NaN row all NaN, which
 * would hide the values). */
static float rnd_finite(void)
{
	float v;
	do
		v = rnd_value();
	while (!isfinite(v));
	return v;
}

static void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);
	cr_assert_not_null(p);
	return p;
}

static int is_int4(int s)
{
	return arena_quant_group((arena_quant_scheme)s) != 0;
}

/* A copy of n values of dtype dt (F32, BF16 or F16) that the int4 schemes
 * take: NaN, infinities and |x| >= 2^126 (a group's range would overflow)
 * made 0 (int4 refuses them: the int4_refuses_* tests). */
static void *int4_safe(const void *src, arena_dtype dt, uint64_t n)
{
	void *out = xmalloc(n * (dt == ARENA_DTYPE_F32 ? 4 : 2));
	for (uint64_t i = 0; i < n; i++) {
		if (dt == ARENA_DTYPE_F32) {
			float v = ((const float *)src)[i];
			((float *)out)[i] = isfinite(v) && fabsf(v) < 0x1p126f ? v : 0.0f;
		} else {
			uint16_t h = ((const uint16_t *)src)[i];
			const int bad = dt == ARENA_DTYPE_BF16 ? (h & 0x7F00) >= 0x7E00 : (h & 0x7C00) == 0x7C00;
			((uint16_t *)out)[i] = bad ? 0 : h;
		}
	}
	return out;
}

/* ---- the reference file --------------------------------------------------------- */

static arena_st_file *ref;

static void ref_open(void)
{
	const char *path = fixture_path("quant_reference.safetensors");
	int rc = arena_st_open(path, &ref);
	cr_assert_eq(rc, 0, "%s: %s", path, arena_last_error());
}

static void ref_close(void)
{
	arena_st_close(ref);
	ref = NULL;
}

static const arena_st_tensor *ref_get(const char *name, arena_dtype dt)
{
	const arena_st_tensor *t = arena_st_find(ref, name);
	cr_assert_not_null(t, "reference tensor '%s' missing", name);
	cr_assert_eq(t->dtype, dt, "reference tensor '%s': dtype %s", name, arena_dtype_name(t->dtype));
	return t;
}

static const char *ref_meta(const char *key)
{
	for (size_t i = 0; i < ref->n_meta; i++)
		if (strcmp(ref->meta_keys[i], key) == 0)
			return ref->meta_vals[i];
	return NULL;
}

/* The rule in __metadata__[key] must mention every fragment: a regenerated
 * file with other rules fails here, not in a confusing byte comparison. */
static void meta_says(const char *key, const char *const *frags)
{
	const char *v = ref_meta(key);
	cr_assert_not_null(v, "__metadata__ has no '%s'", key);
	for (; *frags; frags++)
		cr_assert_not_null(strstr(v, *frags), "__metadata__ '%s' = '%s' does not mention '%s'", key, v, *frags);
}

/* The input an output is computed from: the 1-D outputs come from x_bf16, the
 * [64, 256] ones from w_bf16 (README.md); checked by shape. */
static const arena_st_tensor *input_for(const arena_st_tensor *out)
{
	const arena_st_tensor *x = ref_get("x_bf16", ARENA_DTYPE_BF16), *w = ref_get("w_bf16", ARENA_DTYPE_BF16);
	const arena_st_tensor *in = out->rank == 1 ? x : w;
	cr_assert_eq(in->shape[0], out->shape[0], "'%s' and '%s' do not match in shape", out->name, in->name);
	return in;
}

typedef struct outbuf {
	arena_quant_plan p;
	void *comp[ARENA_QUANT_MAX_COMPONENTS];
} outbuf;

static void run_scheme(outbuf *o, arena_quant_scheme s, arena_dtype dt, uint32_t rank, const uint64_t *shape,
		       const void *src, unsigned threads)
{
	int rc = arena_quant_plan_init(&o->p, s, dt, rank, shape, "t");
	cr_assert_eq(rc, 0, "plan %s: %s", arena_quant_name(s), arena_last_error());
	for (size_t i = 0; i < ARENA_QUANT_MAX_COMPONENTS; i++)
		o->comp[i] = i < o->p.n_comps ? xmalloc(o->p.comps[i].nbytes) : NULL;
	rc = arena_quant_run(&o->p, src, o->comp, threads);
	cr_assert_eq(rc, 0, "run %s: %s", arena_quant_name(s), arena_last_error());
}

static void out_free(outbuf *o)
{
	for (size_t i = 0; i < ARENA_QUANT_MAX_COMPONENTS; i++)
		free(o->comp[i]);
}

static void *widen_to_f32(const arena_st_tensor *t)
{
	float *f = xmalloc(t->nelem * 4);
	cr_assert_eq(arena_quant_cast(ARENA_DTYPE_F32, f, t->dtype, arena_st_data(t), t->nelem, 1), 0);
	return f;
}

/* Run `scheme` on the input of `qname` (as BF16, and widened to F32) and
 * compare component 0 with `qname` and component 1 with `sname`. */
static void check_against(arena_quant_scheme s, const char *qname, arena_dtype qdt, const char *sname)
{
	const arena_st_tensor *q = ref_get(qname, qdt);
	const arena_st_tensor *sc = sname ? ref_get(sname, ARENA_DTYPE_F32) : NULL;
	const arena_st_tensor *in = input_for(q);
	void *f32 = widen_to_f32(in);
	for (int pass = 0; pass < 2; pass++) {
		outbuf o;
		arena_dtype dt = pass ? ARENA_DTYPE_F32 : ARENA_DTYPE_BF16;
		run_scheme(&o, s, dt, in->rank, in->shape, pass ? f32 : arena_st_data(in), 0);
		cr_assert_eq(o.p.comps[0].dtype, qdt);
		cr_assert_eq(o.p.comps[0].nbytes, q->nbytes);
		char what[128];
		snprintf(what, sizeof(what), "%s from %s", qname, arena_dtype_name(dt));
		assert_same_bytes(o.comp[0], arena_st_data(q), q->nbytes, what);
		if (sc) {
			cr_assert_eq(o.p.n_comps, 2);
			cr_assert_eq(o.p.comps[1].rank, sc->rank);
			for (uint32_t k = 0; k < sc->rank; k++)
				cr_assert_eq(o.p.comps[1].shape[k], sc->shape[k], "%s dim %u", sname, k);
			cr_assert_eq(o.p.comps[1].nbytes, sc->nbytes);
			snprintf(what, sizeof(what), "%s from %s", sname, arena_dtype_name(dt));
			assert_same_bytes(o.comp[1], arena_st_data(sc), sc->nbytes, what);
		}
		out_free(&o);
	}
	free(f32);
}

TestSuite(quant_ref, .init = ref_open, .fini = ref_close);

Test(quant_ref, sat_e4m3)
{
	meta_says("sat_e4m3", (const char *[]){"clamp(-448,448)", "nearest even", NULL});
	check_against(ARENA_QUANT_FP8_E4M3, "sat_e4m3", ARENA_DTYPE_F8_E4M3, NULL);
}

Test(quant_ref, sat_e5m2)
{
	meta_says("sat_e5m2", (const char *[]){"clamp(-57344,57344)", NULL});
	check_against(ARENA_QUANT_FP8_E5M2, "sat_e5m2", ARENA_DTYPE_F8_E5M2, NULL);
}

Test(quant_ref, tensor_scale_q_and_dequant)
{
	meta_says("tensor_q_e4m3", (const char *[]){"amax/448", "x/scale", "clamp", NULL});
	check_against(ARENA_QUANT_FP8_E4M3_TENSOR, "tensor_q_e4m3", ARENA_DTYPE_F8_E4M3, "tensor_scale");

	const arena_st_tensor *q = ref_get("tensor_q_e4m3", ARENA_DTYPE_F8_E4M3);
	const arena_st_tensor *sc = ref_get("tensor_scale", ARENA_DTYPE_F32);
	const arena_st_tensor *dq = ref_get("tensor_dequant_f32", ARENA_DTYPE_F32);
	arena_quant_plan p;
	cr_assert_eq(arena_quant_plan_init(&p, ARENA_QUANT_FP8_E4M3_TENSOR, ARENA_DTYPE_BF16, q->rank, q->shape, NULL), 0);
	float *out = xmalloc(dq->nbytes);
	const void *comps[] = {arena_st_data(q), arena_st_data(sc)};
	cr_assert_eq(arena_quant_dequant_f32(&p, comps, out, 0), 0);
	assert_same_bytes(out, arena_st_data(dq), dq->nbytes, "tensor_dequant_f32");
	free(out);
}

Test(quant_ref, row_e4m3)
{
	meta_says("row_q_e4m3", (const char *[]){"amax_row/448", "1e-12", NULL});
	check_against(ARENA_QUANT_FP8_E4M3_ROW, "row_q_e4m3", ARENA_DTYPE_F8_E4M3, "row_scale_f32");
}

Test(quant_ref, row_int8)
{
	meta_says("row_q_i8", (const char *[]){"amax_row/127", "1e-12", "round_half_even", "127", NULL});
	check_against(ARENA_QUANT_INT8_ROW, "row_q_i8", ARENA_DTYPE_I8, "row_scale_i8_f32");
}

Test(quant_ref, to_f16)
{
	meta_says("to_f16", (const char *[]){"f16", "RNE", NULL});
	const arena_st_tensor *want = ref_get("to_f16", ARENA_DTYPE_F16);
	const arena_st_tensor *in = input_for(want);
	void *out = xmalloc(want->nbytes);
	cr_assert_eq(arena_quant_cast(ARENA_DTYPE_F16, out, ARENA_DTYPE_BF16, arena_st_data(in), in->nelem, 0), 0);
	assert_same_bytes(out, arena_st_data(want), want->nbytes, "to_f16 from BF16");
	void *f32 = widen_to_f32(in);
	cr_assert_eq(arena_quant_cast(ARENA_DTYPE_F16, out, ARENA_DTYPE_F32, f32, in->nelem, 0), 0);
	assert_same_bytes(out, arena_st_data(want), want->nbytes, "to_f16 from F32");
	free(f32);
	free(out);
}

/* The reference inputs hold what the issue asks for: +-0, tiny values, values
 * past the FP8 maximum (else the checks above prove less than they seem). */
Test(quant_ref, inputs_cover_the_edges)
{
	const arena_st_tensor *x = ref_get("x_bf16", ARENA_DTYPE_BF16);
	const uint16_t *h = (const uint16_t *)arena_st_data(x);
	int pz = 0, nz = 0, sub = 0, past_e4m3 = 0, past_e5m2 = 0;
	for (uint64_t i = 0; i < x->nelem; i++) {
		float v = bf16_val(h[i]);
		pz += h[i] == 0x0000;
		nz += h[i] == 0x8000;
		sub += v != 0 && fabsf(v) < 0x1p-9f;
		past_e4m3 += fabsf(v) > 448;
		past_e5m2 += fabsf(v) > 57344;
	}
	cr_expect(pz && nz && sub && past_e4m3 && past_e5m2, "+0 %d, -0 %d, tiny %d, >448 %d, >57344 %d", pz, nz,
		  sub, past_e4m3, past_e5m2);
}

/* ---- the int4 reference file (fixtures/int4_reference.safetensors) ------------------------- */

/* Every input of the file (the tensors not named int4_*), under every group
 * size: codes, scales and zero points byte for byte, and the values in the
 * input's dtype (dequant_f32, then the cast) against torch's
 * ((q - z) * s).to(dtype). */
Test(int4_ref, every_input_and_group_size)
{
	arena_st_file *f;
	const char *path = fixture_path("int4_reference.safetensors");
	cr_assert_eq(arena_st_open(path, &f), 0, "%s: %s", path, arena_last_error());
	arena_st_file *saved = ref;
	ref = f; /* meta_says reads `ref` */
	meta_says("int4", (const char *[]){"min(0,min(x))", "(hi-lo)/15", "round(-lo/d)", "round(x/d)+z",
					    "low nibble", NULL});
	meta_says("int4_dq", (const char *[]){"(q-z)", "to(source dtype)", NULL});
	ref = saved;
	const arena_quant_scheme schemes[] = {ARENA_QUANT_INT4_G32, ARENA_QUANT_INT4_G64, ARENA_QUANT_INT4_G128};
	size_t inputs = 0;
	for (size_t i = 0; i < f->n_tensors; i++) {
		const arena_st_tensor *in = &f->tensors[i];
		if (!strncmp(in->name, "int4_", 5))
			continue;
		inputs++;
		for (size_t g = 0; g < 3; g++) {
			outbuf o;
			run_scheme(&o, schemes[g], in->dtype, in->rank, in->shape, arena_st_data(in), 0);
			const char *sfx[] = {"q", "s", "z"};
			for (size_t c = 0; c < 3; c++) {
				char nm[128];
				snprintf(nm, sizeof(nm), "int4_g%u_%s_%s", arena_quant_group(schemes[g]), in->name, sfx[c]);
				const arena_st_tensor *w = arena_st_find(f, nm);
				cr_assert_not_null(w, "%s missing", nm);
				cr_assert_eq(w->dtype, o.p.comps[c].dtype, "%s: %s", nm, arena_dtype_name(w->dtype));
				cr_assert_eq(w->rank, o.p.comps[c].rank, "%s", nm);
				for (uint32_t k = 0; k < w->rank; k++)
					cr_assert_eq(w->shape[k], o.p.comps[c].shape[k], "%s dim %u", nm, k);
				cr_assert_eq(w->nbytes, o.p.comps[c].nbytes, "%s", nm);
				assert_same_bytes(o.comp[c], arena_st_data(w), w->nbytes, nm);
			}
			char nm[128];
			snprintf(nm, sizeof(nm), "int4_g%u_%s_dq", arena_quant_group(schemes[g]), in->name);
			const arena_st_tensor *dq = arena_st_find(f, nm);
			cr_assert_not_null(dq, "%s missing", nm);
			cr_assert(dq->dtype == in->dtype && dq->nelem == in->nelem, "%s", nm);
			float *v = xmalloc(in->nelem * 4);
			unsigned char *out = xmalloc(dq->nbytes);
			cr_assert_eq(arena_quant_dequant_f32(&o.p, (const void *const[]){o.comp[0], o.comp[1], o.comp[2]}, v, 0), 0);
			cr_assert_eq(arena_quant_cast(in->dtype, out, ARENA_DTYPE_F32, v, in->nelem, 0), 0);
			assert_same_bytes(out, arena_st_data(dq), dq->nbytes, nm);
			free(v);
			free(out);
			out_free(&o);
		}
	}
	cr_assert_eq(inputs, 6);
	arena_st_close(f);
}

/* The reference inputs hold what the rule's edges need: a group of zeros
 * (scale 0), an f16 scale that underflows, all-positive and all-negative
 * groups, rows not a multiple of the groups, odd rows, rank 1 and 3. */
Test(int4_ref, inputs_cover_the_edges)
{
	arena_st_file *f;
	cr_assert_eq(arena_st_open(fixture_path("int4_reference.safetensors"), &f), 0, "%s", arena_last_error());
	int zero_scale = 0, tiny_f16 = 0, z0 = 0, z15 = 0, odd = 0, rank1 = 0, rank3 = 0;
	for (size_t i = 0; i < f->n_tensors; i++) {
		const arena_st_tensor *t = &f->tensors[i];
		size_t n = strlen(t->name);
		if (!strncmp(t->name, "int4_", 5) && t->name[n - 1] == 's' && t->name[n - 2] == '_') {
			for (uint64_t k = 0; k < t->nelem; k++) {
				uint16_t h = t->dtype == ARENA_DTYPE_F32 ? 1 : ((const uint16_t *)(const void *)arena_st_data(t))[k];
				zero_scale += h == 0;
				tiny_f16 += t->dtype == ARENA_DTYPE_F16 && h > 0 && h < 0x0400; /* subnormal */
			}
		}
		if (!strncmp(t->name, "int4_", 5) && t->name[n - 1] == 'z' && t->name[n - 2] == '_')
			for (uint64_t k = 0; k < t->nelem; k++) {
				z0 += arena_st_data(t)[k] == 0;
				z15 += arena_st_data(t)[k] == 15;
			}
		if (strncmp(t->name, "int4_", 5)) {
			odd += t->rank == 2 && t->shape[1] % 2 && t->shape[1] % 32;
			rank1 += t->rank == 1;
			rank3 += t->rank == 3;
		}
	}
	cr_expect(zero_scale && tiny_f16 && z0 && z15 && odd && rank1 && rank3, "%d %d %d %d %d %d %d", zero_scale,
		  tiny_f16, z0, z15, odd, rank1, rank3);
	arena_st_close(f);
}

/* F16 sources take the same path after an exact widening: a scheme on F16
 * data equals the scheme on the same values as F32. */
Test(quant, f16_source_equals_f32_source)
{
	const uint64_t shape[] = {37, 1500};
	const uint64_t n = shape[0] * shape[1];
	uint16_t *h = xmalloc(n * 2);
	float *f = xmalloc(n * 4);
	for (uint64_t i = 0; i < n; i++)
		h[i] = (uint16_t)rnd();
	cr_assert_eq(arena_quant_cast(ARENA_DTYPE_F32, f, ARENA_DTYPE_F16, h, n, 0), 0);
	/* not int4: its scale is stored in the source's dtype, so F16 and F32
	 * sources differ by design (int4_against_scalar_reference checks both) */
	for (int s = 1; s < ARENA_QUANT_COUNT && !is_int4(s); s++) {
		outbuf a, b;
		run_scheme(&a, (arena_quant_scheme)s, ARENA_DTYPE_F16, 2, shape, h, 0);
		run_scheme(&b, (arena_quant_scheme)s, ARENA_DTYPE_F32, 2, shape, f, 0);
		for (size_t c = 0; c < a.p.n_comps; c++)
			assert_same_bytes(a.comp[c], b.comp[c], a.p.comps[c].nbytes, arena_quant_name((arena_quant_scheme)s));
		out_free(&a);
		out_free(&b);
	}
	free(h);
	free(f);
}

/* ---- plans -------------------------------------------------------------------------- */

static void expect_plan_error(int want, arena_quant_scheme s, arena_dtype dt, uint32_t rank, const uint64_t *shape,
			      const char *msg_part)
{
	arena_quant_plan p;
	memset(&p, 0xAB, sizeof(p));
	arena_quant_plan before = p;
	int rc = arena_quant_plan_init(&p, s, dt, rank, shape, "blocks.0.w");
	cr_assert_eq(rc, want, "scheme %d dtype %s rank %u: rc %d (%s), want %s", (int)s, arena_dtype_name(dt), rank,
		     rc, arena_last_error(), arena_err_name(want));
	cr_assert_eq(memcmp(&p, &before, sizeof(p)), 0, "plan written on failure");
	cr_assert_not_null(strstr(arena_last_error(), "blocks.0.w"), "message '%s' does not name the tensor",
			   arena_last_error());
	if (msg_part)
		cr_assert_not_null(strstr(arena_last_error(), msg_part), "message '%s' lacks '%s'", arena_last_error(),
				   msg_part);
}

Test(quant, names)
{
	arena_quant_scheme s;
	const char *names[] = {"none",     "bf16",     "fp8-e4m3", "fp8-e4m3-tensor", "fp8-e4m3-row",
			       "int8-row", "fp8-e5m2", "int4-g32", "int4-g64",        "int4-g128"};
	cr_assert_eq(ARENA_QUANT_COUNT, 10);
	for (int i = 0; i < ARENA_QUANT_COUNT; i++) {
		cr_assert_eq(arena_quant_from_name(names[i], &s), 0, "%s", names[i]);
		cr_assert_eq((int)s, i);
		cr_assert_str_eq(arena_quant_name(s), names[i]);
	}
	cr_assert_str_eq(arena_quant_name(ARENA_QUANT_COUNT), "?");
	cr_assert_str_eq(arena_quant_name((arena_quant_scheme)-1), "?");
	int rc = arena_quant_from_name("fp8", &s);
	cr_assert_eq(rc, ARENA_E(QUANT_UNKNOWN_SCHEME));
	cr_assert_eq(arena_err_class(rc), ARENA_CLASS_USAGE);
	cr_assert_not_null(strstr(arena_last_error(), "'fp8'"), "%s", arena_last_error());
	cr_assert_not_null(strstr(arena_last_error(), "fp8-e4m3-row"), "%s", arena_last_error());
	cr_assert_eq(arena_quant_from_name("FP8-E4M3", &s), ARENA_E(QUANT_UNKNOWN_SCHEME));
	cr_assert_eq(arena_quant_from_name("", &s), ARENA_E(QUANT_UNKNOWN_SCHEME));
	cr_assert_eq(arena_quant_from_name(NULL, &s), ARENA_E_USAGE);
	cr_assert_eq(arena_quant_from_name("int4", &s), ARENA_E(QUANT_UNKNOWN_SCHEME));
	cr_assert_not_null(strstr(arena_last_error(), "int4-g64"), "%s", arena_last_error());
	cr_assert_eq(arena_quant_group(ARENA_QUANT_INT4_G32), 32);
	cr_assert_eq(arena_quant_group(ARENA_QUANT_INT4_G64), 64);
	cr_assert_eq(arena_quant_group(ARENA_QUANT_INT4_G128), 128);
	cr_assert_eq(arena_quant_group(ARENA_QUANT_INT8_ROW), 0);
	cr_assert(arena_quant_is_scaled(ARENA_QUANT_INT4_G64) && !arena_quant_is_row(ARENA_QUANT_INT4_G64));
}

Test(quant, plan_errors)
{
	const uint64_t w[] = {64, 256}, v[] = {16}, zr[] = {0, 16}, zc[] = {16, 0}, z1[] = {0};
	const uint64_t big[] = {1ull << 40, 1ull << 40};
	const uint64_t r9[9] = {1, 1, 1, 1, 1, 1, 1, 1, 2};
	const int NA = ARENA_E(QUANT_NOT_APPLICABLE);
	expect_plan_error(ARENA_E(QUANT_UNKNOWN_SCHEME), ARENA_QUANT_COUNT, ARENA_DTYPE_BF16, 2, w, NULL);
	expect_plan_error(ARENA_E(QUANT_UNKNOWN_SCHEME), (arena_quant_scheme)-3, ARENA_DTYPE_BF16, 2, w, NULL);
	/* integer and other sources */
	for (int s = 1; s < ARENA_QUANT_COUNT; s++) {
		expect_plan_error(NA, (arena_quant_scheme)s, ARENA_DTYPE_I32, 2, w, "I32");
		expect_plan_error(NA, (arena_quant_scheme)s, ARENA_DTYPE_I8, 2, w, "I8");
		expect_plan_error(NA, (arena_quant_scheme)s, ARENA_DTYPE_BOOL, 2, w, NULL);
		expect_plan_error(NA, (arena_quant_scheme)s, ARENA_DTYPE_F64, 2, w, "F64");
		expect_plan_error(NA, (arena_quant_scheme)s, ARENA_DTYPE_F8_E4M3FNUZ, 2, w, NULL);
	}
	expect_plan_error(NA, ARENA_QUANT_BF16, ARENA_DTYPE_F8_E4M3, 2, w, NULL);
	expect_plan_error(NA, ARENA_QUANT_FP8_E4M3, ARENA_DTYPE_F8_E5M2, 2, w, NULL);
	expect_plan_error(NA, ARENA_QUANT_FP8_E5M2, ARENA_DTYPE_F8_E4M3, 2, w, NULL);
	/* F8_E4M3 data for a scaled scheme needs its scale: plan_prequant */
	expect_plan_error(NA, ARENA_QUANT_FP8_E4M3_ROW, ARENA_DTYPE_F8_E4M3, 2, w, "scale");
	expect_plan_error(NA, ARENA_QUANT_FP8_E4M3_TENSOR, ARENA_DTYPE_F8_E4M3, 2, w, "scale");
	expect_plan_error(NA, ARENA_QUANT_NONE, ARENA_DTYPE_INVALID, 2, w, NULL);
	/* row schemes: rank >= 2, rows and columns */
	expect_plan_error(NA, ARENA_QUANT_FP8_E4M3_ROW, ARENA_DTYPE_BF16, 1, v, "rank 2");
	expect_plan_error(NA, ARENA_QUANT_INT8_ROW, ARENA_DTYPE_F32, 1, v, "[16]");
	expect_plan_error(NA, ARENA_QUANT_INT8_ROW, ARENA_DTYPE_F32, 0, NULL, "[]");
	expect_plan_error(NA, ARENA_QUANT_FP8_E4M3_ROW, ARENA_DTYPE_BF16, 2, zr, "empty");
	expect_plan_error(NA, ARENA_QUANT_INT8_ROW, ARENA_DTYPE_BF16, 2, zc, "empty");
	expect_plan_error(NA, ARENA_QUANT_FP8_E4M3_TENSOR, ARENA_DTYPE_BF16, 1, z1, "empty");
	/* int4: any rank, but values; only wide float sources */
	expect_plan_error(NA, ARENA_QUANT_INT4_G64, ARENA_DTYPE_BF16, 2, zr, "empty");
	expect_plan_error(NA, ARENA_QUANT_INT4_G32, ARENA_DTYPE_F16, 2, zc, "empty");
	expect_plan_error(NA, ARENA_QUANT_INT4_G128, ARENA_DTYPE_F32, 1, z1, "empty");
	expect_plan_error(NA, ARENA_QUANT_INT4_G64, ARENA_DTYPE_F8_E4M3, 2, w, "BF16, F16 or F32");
	expect_plan_error(NA, ARENA_QUANT_INT4_G64, ARENA_DTYPE_U8, 2, w, "U8");
	/* sizes */
	expect_plan_error(NA, ARENA_QUANT_NONE, ARENA_DTYPE_BF16, 9, r9, "rank 9");
	expect_plan_error(NA, ARENA_QUANT_NONE, ARENA_DTYPE_F32, 2, big, NULL);
	expect_plan_error(NA, ARENA_QUANT_NONE, ARENA_DTYPE_F4, 1, (const uint64_t[]){3}, "whole");
	/* arguments */
	expect_plan_error(ARENA_E_USAGE, ARENA_QUANT_NONE, ARENA_DTYPE_F32, 2, NULL, NULL);
	cr_assert_eq(arena_quant_plan_init(NULL, ARENA_QUANT_NONE, ARENA_DTYPE_F32, 0, NULL, NULL), ARENA_E_USAGE);
	/* prequantized plans only for the two scaled FP8 schemes */
	arena_quant_plan p;
	cr_assert_eq(arena_quant_plan_prequant(&p, ARENA_QUANT_INT8_ROW, 2, w, "x"), NA);
	cr_assert_eq(arena_quant_plan_prequant(&p, ARENA_QUANT_FP8_E4M3, 2, w, "x"), NA);
	cr_assert_eq(arena_quant_plan_prequant(&p, ARENA_QUANT_FP8_E4M3_ROW, 1, v, "x"), NA);
	cr_assert_eq(arena_quant_plan_prequant(&p, ARENA_QUANT_INT4_G64, 2, w, "x"), NA);
	cr_assert_eq(arena_err_class(NA), ARENA_CLASS_USAGE);
}

static void expect_comp(const arena_quant_component *c, const char *name, arena_dtype dt, uint32_t rank,
			const uint64_t *shape, uint64_t nbytes)
{
	cr_assert_str_eq(c->name, name);
	cr_assert_eq(c->dtype, dt, "%s: dtype %s", name, arena_dtype_name(c->dtype));
	cr_assert_eq(c->rank, rank, "%s: rank %u", name, c->rank);
	for (uint32_t k = 0; k < rank; k++)
		cr_assert_eq(c->shape[k], shape[k], "%s: dim %u = %llu", name, k, (unsigned long long)c->shape[k]);
	cr_assert_eq(c->nbytes, nbytes, "%s: %llu bytes", name, (unsigned long long)c->nbytes);
}

Test(quant, plan_components)
{
	arena_quant_plan p;
	const uint64_t w[] = {64, 256}, c4[] = {8, 3, 5, 5}, v[] = {7}, one[] = {1};
	cr_assert_eq(arena_quant_plan_init(&p, ARENA_QUANT_NONE, ARENA_DTYPE_I64, 2, w, NULL), 0);
	cr_assert_eq(p.n_comps, 1);
	expect_comp(&p.comps[0], "data", ARENA_DTYPE_I64, 2, w, 64 * 256 * 8);
	cr_assert_eq(p.src_nbytes, 64 * 256 * 8);

	cr_assert_eq(arena_quant_plan_init(&p, ARENA_QUANT_BF16, ARENA_DTYPE_F32, 1, v, NULL), 0);
	expect_comp(&p.comps[0], "data", ARENA_DTYPE_BF16, 1, v, 14);
	cr_assert_eq(p.src_nbytes, 28);

	cr_assert_eq(arena_quant_plan_init(&p, ARENA_QUANT_FP8_E4M3, ARENA_DTYPE_F16, 2, w, NULL), 0);
	cr_assert_eq(p.n_comps, 1);
	expect_comp(&p.comps[0], "qdata", ARENA_DTYPE_F8_E4M3, 2, w, 64 * 256);

	cr_assert_eq(arena_quant_plan_init(&p, ARENA_QUANT_FP8_E5M2, ARENA_DTYPE_BF16, 2, w, NULL), 0);
	expect_comp(&p.comps[0], "qdata", ARENA_DTYPE_F8_E5M2, 2, w, 64 * 256);

	cr_assert_eq(arena_quant_plan_init(&p, ARENA_QUANT_FP8_E4M3_TENSOR, ARENA_DTYPE_BF16, 0, NULL, NULL), 0);
	cr_assert_eq(p.n_comps, 2);
	expect_comp(&p.comps[0], "qdata", ARENA_DTYPE_F8_E4M3, 0, NULL, 1);
	expect_comp(&p.comps[1], "scale", ARENA_DTYPE_F32, 1, one, 4);

	cr_assert_eq(arena_quant_plan_init(&p, ARENA_QUANT_FP8_E4M3_ROW, ARENA_DTYPE_BF16, 2, w, NULL), 0);
	expect_comp(&p.comps[0], "qdata", ARENA_DTYPE_F8_E4M3, 2, w, 64 * 256);
	expect_comp(&p.comps[1], "scale", ARENA_DTYPE_F32, 2, (const uint64_t[]){64, 1}, 256);
	cr_assert_eq(p.rows, 64);
	cr_assert_eq(p.cols, 256);

	/* rank 4 (a conv weight): rows = out channels, scale broadcasts */
	cr_assert_eq(arena_quant_plan_init(&p, ARENA_QUANT_INT8_ROW, ARENA_DTYPE_F32, 4, c4, NULL), 0);
	expect_comp(&p.comps[0], "qdata", ARENA_DTYPE_I8, 4, c4, 8 * 3 * 5 * 5);
	expect_comp(&p.comps[1], "scale", ARENA_DTYPE_F32, 4, (const uint64_t[]){8, 1, 1, 1}, 32);
	cr_assert_eq(p.rows, 8);
	cr_assert_eq(p.cols, 75);

	/* int4: codes [rows, ceil(cols / 2)], scale [rows, groups] in the
	 * source's dtype, zero points [rows, groups]; a vector is one row, a
	 * rank-4 tensor rows of the other dims */
	cr_assert_eq(arena_quant_plan_init(&p, ARENA_QUANT_INT4_G64, ARENA_DTYPE_BF16, 2, w, NULL), 0);
	cr_assert_eq(p.n_comps, 3);
	expect_comp(&p.comps[0], "qdata", ARENA_DTYPE_U8, 2, (const uint64_t[]){64, 128}, 64 * 128);
	expect_comp(&p.comps[1], "scale", ARENA_DTYPE_BF16, 2, (const uint64_t[]){64, 4}, 64 * 4 * 2);
	expect_comp(&p.comps[2], "zero", ARENA_DTYPE_U8, 2, (const uint64_t[]){64, 4}, 64 * 4);
	cr_assert(p.rows == 64 && p.cols == 256 && p.group == 64 && p.groups == 4);
	cr_assert_eq(arena_quant_plan_init(&p, ARENA_QUANT_INT4_G32, ARENA_DTYPE_F32, 1, v, NULL), 0);
	expect_comp(&p.comps[0], "qdata", ARENA_DTYPE_U8, 2, (const uint64_t[]){1, 4}, 4);
	expect_comp(&p.comps[1], "scale", ARENA_DTYPE_F32, 2, (const uint64_t[]){1, 1}, 4);
	expect_comp(&p.comps[2], "zero", ARENA_DTYPE_U8, 2, (const uint64_t[]){1, 1}, 1);
	cr_assert_eq(arena_quant_plan_init(&p, ARENA_QUANT_INT4_G128, ARENA_DTYPE_F16, 4, c4, NULL), 0);
	expect_comp(&p.comps[0], "qdata", ARENA_DTYPE_U8, 2, (const uint64_t[]){8, 38}, 8 * 38);
	expect_comp(&p.comps[1], "scale", ARENA_DTYPE_F16, 2, (const uint64_t[]){8, 1}, 16);
	cr_assert(p.rows == 8 && p.cols == 75 && p.groups == 1);
	cr_assert_eq(arena_quant_plan_init(&p, ARENA_QUANT_INT4_G32, ARENA_DTYPE_BF16, 0, NULL, NULL), 0);
	expect_comp(&p.comps[0], "qdata", ARENA_DTYPE_U8, 2, (const uint64_t[]){1, 1}, 1); /* a scalar: one row of 1 */

	/* empty tensors are fine for unscaled schemes */
	cr_assert_eq(arena_quant_plan_init(&p, ARENA_QUANT_FP8_E4M3, ARENA_DTYPE_BF16, 2, (const uint64_t[]){0, 4}, NULL),
		     0);
	cr_assert_eq(p.comps[0].nbytes, 0);
	cr_assert_eq(arena_quant_run(&p, NULL, NULL, 0), 0);

	/* the plan describes the original tensor */
	cr_assert_eq(arena_quant_plan_init(&p, ARENA_QUANT_FP8_E4M3_ROW, ARENA_DTYPE_F16, 4, c4, NULL), 0);
	cr_assert_eq(p.src_dtype, ARENA_DTYPE_F16);
	cr_assert_eq(p.rank, 4);
	cr_assert_eq(p.nelem, 8 * 75);
	cr_assert_eq(p.prequantized, 0);
	cr_assert_eq(arena_quant_plan_prequant(&p, ARENA_QUANT_FP8_E4M3_ROW, 4, c4, NULL), 0);
	cr_assert_eq(p.src_dtype, ARENA_DTYPE_F8_E4M3);
	cr_assert_eq(p.prequantized, 1);
	expect_comp(&p.comps[1], "scale", ARENA_DTYPE_F32, 4, (const uint64_t[]){8, 1, 1, 1}, 32);
}

Test(quant, run_arguments)
{
	arena_quant_plan p;
	const uint64_t w[] = {4, 4};
	uint16_t src[16] = {0};
	unsigned char q[16];
	float s[4];
	cr_assert_eq(arena_quant_plan_init(&p, ARENA_QUANT_FP8_E4M3_ROW, ARENA_DTYPE_BF16, 2, w, NULL), 0);
	cr_assert_eq(arena_quant_run(NULL, src, (void *[]){q, s}, 0), ARENA_E_USAGE);
	cr_assert_eq(arena_quant_run(&p, NULL, (void *[]){q, s}, 0), ARENA_E_USAGE);
	cr_assert_eq(arena_quant_run(&p, src, (void *[]){q, NULL}, 0), ARENA_E_USAGE);
	cr_assert_eq(arena_quant_run(&p, src, NULL, 0), ARENA_E_USAGE);
	cr_assert_eq(arena_quant_run_part(&p, src, 3, 2, 0, (void *[]){q, s}, 0), ARENA_E_USAGE);
	cr_assert_eq(arena_quant_run_part(&p, src, 5, 0, 0, (void *[]){q, s}, 0), ARENA_E_USAGE);
	cr_assert_eq(arena_quant_run_part(&p, src, 4, 0, 0, (void *[]){q, s}, 0), 0);
	cr_assert_eq(arena_quant_run_scaled(&p, q, ARENA_DTYPE_F32, s, (void *[]){q, s}, 0), ARENA_E_USAGE);
	cr_assert_eq(arena_quant_plan_prequant(&p, ARENA_QUANT_FP8_E4M3_ROW, 2, w, NULL), 0);
	cr_assert_eq(arena_quant_run(&p, src, (void *[]){q, s}, 0), ARENA_E_USAGE);
	cr_assert_eq(arena_quant_run_scaled(&p, q, ARENA_DTYPE_I32, s, (void *[]){q, s}, 0), ARENA_E_USAGE);
	cr_assert_eq(arena_quant_cast(ARENA_DTYPE_I8, q, ARENA_DTYPE_F32, s, 4, 0), ARENA_E(QUANT_NOT_APPLICABLE));
	cr_assert_eq(arena_quant_cast(ARENA_DTYPE_F32, s, ARENA_DTYPE_I8, q, 4, 0), ARENA_E(QUANT_NOT_APPLICABLE));
	cr_assert_eq(arena_quant_cast(ARENA_DTYPE_F32, NULL, ARENA_DTYPE_BF16, src, 4, 0), ARENA_E_USAGE);
	float m;
	cr_assert_eq(arena_quant_amax(ARENA_DTYPE_F8_E4M3, q, 4, 0, &m), ARENA_E_USAGE);
	cr_assert_eq(arena_quant_amax(ARENA_DTYPE_F32, NULL, 0, 0, &m), 0);
	cr_assert_eq(m, 0.0f);
}

/* Sources and destinations at odd addresses (safetensors data need not be
 * aligned; the ASan/UBSan run checks for misaligned access). */
Test(quant, unaligned_pointers)
{
	const uint64_t w[] = {3, 1100};
	const uint64_t n = w[0] * w[1];
	unsigned char *src = xmalloc(n * 4 + 1), *a[ARENA_QUANT_MAX_COMPONENTS];
	for (size_t c = 0; c < ARENA_QUANT_MAX_COMPONENTS; c++)
		a[c] = xmalloc(n * 2 + 1);
	float *f = xmalloc(n * 4);
	for (uint64_t i = 0; i < n; i++)
		f[i] = rnd_finite();
	memcpy(src + 1, f, n * 4);
	for (int s = 1; s < ARENA_QUANT_COUNT; s++) {
		outbuf ref_out;
		run_scheme(&ref_out, (arena_quant_scheme)s, ARENA_DTYPE_F32, 2, w, f, 1);
		cr_assert_eq(arena_quant_run(&ref_out.p, src + 1, (void *[]){a[0] + 1, a[1] + 1, a[2] + 1}, 1), 0);
		for (size_t c = 0; c < ref_out.p.n_comps; c++)
			assert_same_bytes(a[c] + 1, ref_out.comp[c], ref_out.p.comps[c].nbytes, ref_out.p.comps[c].name);
		out_free(&ref_out);
	}
	free(src);
	for (size_t c = 0; c < ARENA_QUANT_MAX_COMPONENTS; c++)
		free(a[c]);
	free(f);
}

/* ---- threads and pieces ---------------------------------------------------------------- */

Test(quant, thread_count_does_not_change_results)
{
	slow_test();
	/* big enough for 7 threads (1 Mi elements each at least) */
	const uint64_t w[] = {997, 8009};
	const uint64_t n = w[0] * w[1];
	float *f = xmalloc(n * 4);
	for (uint64_t i = 0; i < n; i++)
		f[i] = rnd_value(); /* NaN rows included */
	uint16_t *b = xmalloc(n * 2);
	cr_assert_eq(arena_quant_cast(ARENA_DTYPE_BF16, b, ARENA_DTYPE_F32, f, n, 1), 0);
	float *f4 = int4_safe(f, ARENA_DTYPE_F32, n);
	uint16_t *b4 = int4_safe(b, ARENA_DTYPE_BF16, n);
	const unsigned threads[] = {2, 3, 7, 0, 64};
	for (int dt = 0; dt < 2; dt++) {
		arena_dtype sdt = dt ? ARENA_DTYPE_BF16 : ARENA_DTYPE_F32;
		for (int s = 0; s < ARENA_QUANT_COUNT; s++) {
			const void *src = dt ? (const void *)(is_int4(s) ? b4 : b) : (const void *)(is_int4(s) ? f4 : f);
			outbuf one;
			run_scheme(&one, (arena_quant_scheme)s, sdt, 2, w, src, 1);
			for (size_t t = 0; t < sizeof(threads) / sizeof(threads[0]); t++) {
				outbuf many;
				run_scheme(&many, (arena_quant_scheme)s, sdt, 2, w, src, threads[t]);
				for (size_t c = 0; c < one.p.n_comps; c++)
					assert_same_bytes(many.comp[c], one.comp[c], one.p.comps[c].nbytes,
							  arena_quant_name((arena_quant_scheme)s));
				out_free(&many);
			}
			out_free(&one);
		}
	}
	float m1, m7;
	cr_assert_eq(arena_quant_amax(ARENA_DTYPE_F32, f, n, 1, &m1), 0);
	cr_assert_eq(arena_quant_amax(ARENA_DTYPE_F32, f, n, 7, &m7), 0);
	cr_assert_eq(bits_of(m1), bits_of(m7));
	free(f);
	free(b);
	free(f4);
	free(b4);
}

/* Converting in pieces (rows, elements) gives the bytes of one run. */
Test(quant, pieces_equal_one_run)
{
	const uint64_t w[] = {50, 333};
	const uint64_t n = w[0] * w[1];
	uint16_t *b = xmalloc(n * 2);
	for (uint64_t i = 0; i < n; i++)
		b[i] = (uint16_t)(bits_of(rnd_finite()) >> 16);
	for (int s = 0; s < ARENA_QUANT_COUNT; s++) {
		outbuf one, parts;
		run_scheme(&one, (arena_quant_scheme)s, ARENA_DTYPE_BF16, 2, w, b, 1);
		run_scheme(&parts, (arena_quant_scheme)s, ARENA_DTYPE_BF16, 2, w, b, 1);
		for (size_t c = 0; c < parts.p.n_comps; c++)
			memset(parts.comp[c], 0x55, parts.p.comps[c].nbytes);
		const int row = s == ARENA_QUANT_FP8_E4M3_ROW || s == ARENA_QUANT_INT8_ROW || is_int4(s);
		const uint64_t units = row ? w[0] : n, unit_bytes = row ? w[1] * 2 : 2;
		float scale = 0;
		if (s == ARENA_QUANT_FP8_E4M3_TENSOR) {
			/* amax over two pieces, merged */
			float a, c;
			cr_assert_eq(arena_quant_amax(ARENA_DTYPE_BF16, b, 1000, 1, &a), 0);
			cr_assert_eq(arena_quant_amax(ARENA_DTYPE_BF16, b + 1000, n - 1000, 1, &c), 0);
			scale = arena_quant_tensor_scale(arena_quant_amax_merge(a, c));
		}
		for (uint64_t u = 0; u < units;) {
			uint64_t k = 1 + rnd() % (units / 3);
			k = k < units - u ? k : units - u;
			cr_assert_eq(arena_quant_run_part(&parts.p, (const unsigned char *)b + u * unit_bytes, u, k, scale,
							  parts.comp, 1),
				     0, "%s", arena_last_error());
			u += k;
		}
		for (size_t c = 0; c < one.p.n_comps; c++)
			assert_same_bytes(parts.comp[c], one.comp[c], one.p.comps[c].nbytes,
					  arena_quant_name((arena_quant_scheme)s));
		out_free(&one);
		out_free(&parts);
	}
	free(b);
}

/* Any byte range of any component, filled alone, equals those bytes of one run. */
static void check_fill(const outbuf *whole, const arena_quant_input *in)
{
	for (size_t c = 0; c < whole->p.n_comps; c++) {
		const uint64_t nb = whole->p.comps[c].nbytes;
		unsigned char *buf = xmalloc(nb);
		memset(buf, 0x5A, nb);
		for (uint64_t off = 0; off < nb;) {
			uint64_t k = 1 + rnd() % (nb < 3000 ? nb : 3000);
			k = k < nb - off ? k : nb - off;
			int rc = arena_quant_fill(&whole->p, in, (uint32_t)c, off, k, buf + off);
			cr_assert_eq(rc, 0, "%s", arena_last_error());
			off += k;
		}
		char what[64];
		snprintf(what, sizeof(what), "%s component %zu", arena_quant_name(whole->p.scheme), c);
		assert_same_bytes(buf, whole->comp[c], nb, what);
		/* single bytes at the ends and at a random place */
		uint64_t spots[] = {0, nb - 1, rnd() % nb};
		for (int k = 0; k < 3; k++) {
			unsigned char b;
			cr_assert_eq(arena_quant_fill(&whole->p, in, (uint32_t)c, spots[k], 1, &b), 0);
			cr_assert_eq(b, ((unsigned char *)whole->comp[c])[spots[k]], "%s byte %llu", what,
				     (unsigned long long)spots[k]);
		}
		free(buf);
	}
}

Test(quant, fill_equals_run)
{
	const uint64_t w[] = {37, 301};
	const uint64_t n = w[0] * w[1];
	float *f = xmalloc(n * 4);
	uint16_t *b = xmalloc(n * 2);
	for (uint64_t i = 0; i < n; i++)
		f[i] = rnd_finite();
	cr_assert_eq(arena_quant_cast(ARENA_DTYPE_BF16, b, ARENA_DTYPE_F32, f, n, 0), 0);
	for (int dt = 0; dt < 2; dt++) {
		for (int s = 0; s < ARENA_QUANT_COUNT; s++) {
			outbuf whole;
			const void *src = dt ? (const void *)f : (const void *)b;
			run_scheme(&whole, (arena_quant_scheme)s, dt ? ARENA_DTYPE_F32 : ARENA_DTYPE_BF16, 2, w, src, 0);
			arena_quant_input in = {.data = src};
			cr_assert_eq(arena_quant_scan(&whole.p, &in, 0), 0);
			check_fill(&whole, &in);
			out_free(&whole);
		}
	}
	/* errors */
	arena_quant_plan p;
	cr_assert_eq(arena_quant_plan_init(&p, ARENA_QUANT_FP8_E4M3_ROW, ARENA_DTYPE_BF16, 2, w, NULL), 0);
	arena_quant_input in = {.data = b};
	unsigned char q[16];
	cr_assert_eq(arena_quant_fill(&p, &in, 2, 0, 1, q), ARENA_E_USAGE);
	cr_assert_eq(arena_quant_fill(&p, &in, 1, 37 * 4 - 1, 2, q), ARENA_E_USAGE);
	cr_assert_eq(arena_quant_fill(&p, &in, 0, n, 0, q), 0);
	cr_assert_eq(arena_quant_fill(&p, &in, 0, 0, 1, NULL), ARENA_E_USAGE);
	cr_assert_eq(arena_quant_fill(NULL, &in, 0, 0, 1, q), ARENA_E_USAGE);
	free(f);
	free(b);
}

Test(quant, fill_prequantized)
{
	const uint64_t w[] = {8, 16};
	uint8_t q[8 * 16];
	uint16_t sc[8];
	for (size_t i = 0; i < sizeof(q); i++)
		q[i] = (uint8_t)rnd();
	for (size_t i = 0; i < 8; i++)
		sc[i] = (uint16_t)(0x3C00 + i * 0x40); /* f16 1.0, 1.0625, ... */
	outbuf whole = {0};
	cr_assert_eq(arena_quant_plan_prequant(&whole.p, ARENA_QUANT_FP8_E4M3_ROW, 2, w, "x"), 0);
	whole.comp[0] = xmalloc(whole.p.comps[0].nbytes);
	whole.comp[1] = xmalloc(whole.p.comps[1].nbytes);
	cr_assert_eq(arena_quant_run_scaled(&whole.p, q, ARENA_DTYPE_F16, sc, whole.comp, 0), 0);
	arena_quant_input in = {.data = q, .scale = sc, .scale_dtype = ARENA_DTYPE_F16};
	cr_assert_eq(arena_quant_scan(&whole.p, &in, 0), 0);
	check_fill(&whole, &in);
	in.scale = NULL;
	unsigned char b[4];
	cr_assert_eq(arena_quant_fill(&whole.p, &in, 1, 0, 4, b), ARENA_E_USAGE);
	out_free(&whole);
}

/* Plans to layout tensors and back; a manifest that disagrees is rejected. */
Test(quant, describe_and_plan_from_tensor)
{
	const uint64_t w[] = {64, 3, 3};
	arena_tensor t;
	arena_quant_plan p, back;
	for (int s = 0; s < ARENA_QUANT_COUNT; s++) {
		memset(&t, 0, sizeof(t));
		t.name = (char *)"blocks.1.conv.weight";
		t.dtype = ARENA_DTYPE_F16;
		t.rank = 3;
		memcpy(t.shape, w, sizeof(w));
		cr_assert_eq(arena_quant_plan_init(&p, (arena_quant_scheme)s, t.dtype, t.rank, t.shape, t.name), 0);
		cr_assert_eq(arena_quant_describe(&p, &t), 0);
		cr_assert_str_eq(t.scheme, arena_quant_name((arena_quant_scheme)s));
		cr_assert_eq(t.n_comp, p.n_comps);
		for (size_t c = 0; c < p.n_comps; c++) {
			cr_assert_str_eq(t.comp[c].name, p.comps[c].name);
			cr_assert_eq(t.comp[c].bytes, p.comps[c].nbytes);
		}
		cr_assert_eq(arena_quant_plan_from_tensor(&t, &back), 0, "%s", arena_last_error());
		cr_assert_eq(memcmp(&back, &p, sizeof(p)), 0);
	}
	/* t now holds fp8-e5m2; make it fp8-e4m3-row and break it in turn */
	cr_assert_eq(arena_quant_plan_init(&p, ARENA_QUANT_FP8_E4M3_ROW, t.dtype, t.rank, t.shape, t.name), 0);
	cr_assert_eq(arena_quant_describe(&p, &t), 0);
	arena_tensor good = t, bad;
	const int MB = ARENA_E(IMG_MANIFEST_BAD);
	bad = good, bad.comp[1].shape[1] = 2;
	cr_assert_eq(arena_quant_plan_from_tensor(&bad, &back), MB);
	cr_assert_not_null(strstr(arena_last_error(), "blocks.1.conv.weight"), "%s", arena_last_error());
	cr_assert_not_null(strstr(arena_last_error(), "[64, 2, 1]"), "%s", arena_last_error());
	bad = good, bad.comp[0].dtype = ARENA_DTYPE_F8_E5M2;
	cr_assert_eq(arena_quant_plan_from_tensor(&bad, &back), MB);
	bad = good, bad.comp[1].bytes = 512;
	cr_assert_eq(arena_quant_plan_from_tensor(&bad, &back), MB);
	bad = good, snprintf(bad.comp[1].name, sizeof(bad.comp[1].name), "scales");
	cr_assert_eq(arena_quant_plan_from_tensor(&bad, &back), MB);
	bad = good, bad.n_comp = 1;
	cr_assert_eq(arena_quant_plan_from_tensor(&bad, &back), MB);
	bad = good, snprintf(bad.scheme, sizeof(bad.scheme), "fp8-e4m3-block");
	cr_assert_eq(arena_quant_plan_from_tensor(&bad, &back), MB);
	cr_assert_not_null(strstr(arena_last_error(), "fp8-e4m3-block"), "%s", arena_last_error());
	bad = good, bad.dtype = ARENA_DTYPE_I32; /* the scheme cannot apply */
	cr_assert_eq(arena_quant_plan_from_tensor(&bad, &back), MB);
	cr_assert_eq(arena_err_class(MB), ARENA_CLASS_INVALID);
	/* an already-quantized F8_E4M3 tensor round-trips as a prequantized plan */
	bad = good, bad.dtype = ARENA_DTYPE_F8_E4M3;
	cr_assert_eq(arena_quant_plan_from_tensor(&bad, &back), 0, "%s", arena_last_error());
	cr_assert_eq(back.prequantized, 1);
	/* int4: the scale in the source's dtype, three components, packed codes */
	t.dtype = ARENA_DTYPE_BF16;
	cr_assert_eq(arena_quant_plan_init(&p, ARENA_QUANT_INT4_G32, t.dtype, t.rank, t.shape, t.name), 0);
	cr_assert_eq(arena_quant_describe(&p, &t), 0);
	good = t;
	cr_assert_eq(arena_quant_plan_from_tensor(&good, &back), 0, "%s", arena_last_error());
	bad = good, bad.comp[1].dtype = ARENA_DTYPE_F32, bad.comp[1].bytes *= 2;
	cr_assert_eq(arena_quant_plan_from_tensor(&bad, &back), MB);
	cr_assert_not_null(strstr(arena_last_error(), "expected 'scale' BF16 [64, 1]"), "%s", arena_last_error());
	bad = good, bad.n_comp = 2;
	cr_assert_eq(arena_quant_plan_from_tensor(&bad, &back), MB);
	cr_assert_not_null(strstr(arena_last_error(), "has 3 components, the manifest 2"), "%s", arena_last_error());
	bad = good, bad.comp[0].shape[1] = 9, bad.comp[0].bytes = 64 * 9; /* codes of 18 columns, not 9 */
	cr_assert_eq(arena_quant_plan_from_tensor(&bad, &back), MB);
	cr_assert_not_null(strstr(arena_last_error(), "expected 'qdata' U8 [64, 5]"), "%s", arena_last_error());
	bad = good, snprintf(bad.comp[2].name, sizeof(bad.comp[2].name), "zeros");
	cr_assert_eq(arena_quant_plan_from_tensor(&bad, &back), MB);
	bad = good, snprintf(bad.scheme, sizeof(bad.scheme), "int4-g16");
	cr_assert_eq(arena_quant_plan_from_tensor(&bad, &back), MB);
	cr_assert_not_null(strstr(arena_last_error(), "int4-g16"), "%s", arena_last_error());
}

/* ---- exhaustive casts against slow references ------------------------------------------- */

/* Value of a non-negative FP8 code (no sign bit). */
static double fp8_value(unsigned c, int e5m2)
{
	unsigned mb = e5m2 ? 2 : 3, bias = e5m2 ? 15 : 7;
	unsigned e = c >> mb, m = c & ((1u << mb) - 1);
	if (e == 0)
		return ldexp((double)m, 1 - (int)bias - (int)mb);
	return ldexp((double)((1u << mb) + m), (int)e - (int)bias - (int)mb);
}

/* torch: cast(clamp(x, -max, max)): the nearest of all finite codes, ties to
 * the even code, the sign kept (also on zero); NaN -> 0x7F with the sign. */
static uint8_t ref_fp8_sat(float x, int e5m2)
{
	const unsigned top = e5m2 ? 0x7B : 0x7E; /* largest finite code */
	uint8_t sign = signbit(x) ? 0x80 : 0;
	if (isnan(x))
		return sign | 0x7F;
	double a = fabs((double)x), max = fp8_value(top, e5m2);
	if (a > max)
		a = max;
	unsigned best = 0;
	double bd = INFINITY;
	for (unsigned c = 0; c <= top; c++) {
		double d = fabs(fp8_value(c, e5m2) - a);
		if (d < bd || (d == bd && !(c & 1))) {
			bd = d;
			best = c;
		}
	}
	return sign | (uint8_t)best;
}

Test(quant, fp8_cast_every_bf16_pattern)
{
	uint16_t *in = xmalloc(65536 * 2);
	uint8_t *e4 = xmalloc(65536), *e5 = xmalloc(65536);
	for (unsigned i = 0; i < 65536; i++)
		in[i] = (uint16_t)i;
	cr_assert_eq(arena_quant_cast(ARENA_DTYPE_F8_E4M3, e4, ARENA_DTYPE_BF16, in, 65536, 0), 0);
	cr_assert_eq(arena_quant_cast(ARENA_DTYPE_F8_E5M2, e5, ARENA_DTYPE_BF16, in, 65536, 0), 0);
	for (unsigned i = 0; i < 65536; i++) {
		float x = bf16_val((uint16_t)i);
		cr_assert_eq(e4[i], ref_fp8_sat(x, 0), "e4m3 of bf16 0x%04x (%a): got 0x%02x, want 0x%02x", i, (double)x,
			     e4[i], ref_fp8_sat(x, 0));
		cr_assert_eq(e5[i], ref_fp8_sat(x, 1), "e5m2 of bf16 0x%04x (%a): got 0x%02x, want 0x%02x", i, (double)x,
			     e5[i], ref_fp8_sat(x, 1));
	}
	free(in);
	free(e4);
	free(e5);
}

/* F32 inputs: every midpoint between FP8 neighbours and its f32 neighbours
 * (where rounding decides), plus random patterns. */
Test(quant, fp8_cast_f32_midpoints_and_random)
{
	enum { N = 200000 };
	float *in = xmalloc(N * 4);
	uint8_t *out = xmalloc(N);
	for (int e5m2 = 0; e5m2 < 2; e5m2++) {
		size_t n = 0;
		const unsigned top = e5m2 ? 0x7B : 0x7E;
		for (unsigned c = 0; c < top; c++) {
			float mid = (float)((fp8_value(c, e5m2) + fp8_value(c + 1, e5m2)) / 2); /* exact */
			float cand[] = {mid, nextafterf(mid, 0), nextafterf(mid, INFINITY)};
			for (int k = 0; k < 3; k++) {
				in[n++] = cand[k];
				in[n++] = -cand[k];
			}
		}
		while (n < N)
			in[n++] = (rnd() & 1) ? f32_of((uint32_t)rnd()) : rnd_value();
		arena_dtype dt = e5m2 ? ARENA_DTYPE_F8_E5M2 : ARENA_DTYPE_F8_E4M3;
		cr_assert_eq(arena_quant_cast(dt, out, ARENA_DTYPE_F32, in, N, 0), 0);
		for (size_t i = 0; i < N; i++)
			cr_assert_eq(out[i], ref_fp8_sat(in[i], e5m2), "%s of f32 0x%08x (%a): got 0x%02x, want 0x%02x",
				     e5m2 ? "e5m2" : "e4m3", bits_of(in[i]), (double)in[i], out[i], ref_fp8_sat(in[i], e5m2));
	}
	free(in);
	free(out);
}

/* FP8 -> F32 decoding of all 256 codes. */
Test(quant, fp8_decode_every_code)
{
	uint8_t codes[256];
	float out[256];
	for (unsigned i = 0; i < 256; i++)
		codes[i] = (uint8_t)i;
	for (int e5m2 = 0; e5m2 < 2; e5m2++) {
		cr_assert_eq(arena_quant_cast(ARENA_DTYPE_F32, out, e5m2 ? ARENA_DTYPE_F8_E5M2 : ARENA_DTYPE_F8_E4M3, codes,
					      256, 0),
			     0);
		for (unsigned i = 0; i < 256; i++) {
			unsigned c = i & 0x7F;
			int nan = e5m2 ? c > 0x7C : c == 0x7F, inf = e5m2 && c == 0x7C;
			if (nan) {
				cr_assert(isnan(out[i]), "code 0x%02x", i);
				continue;
			}
			double want = inf ? INFINITY : fp8_value(c, e5m2);
			if (i & 0x80)
				want = -want;
			cr_assert_eq(bits_of(out[i]), bits_of((float)want), "code 0x%02x: %a, want %a", i, (double)out[i], want);
		}
	}
}

/* Round `a` (>= 0, finite) to the nearest of the sorted values v[0..n)
 * (v[0] = 0), ties to the even index. Returns the index. */
static unsigned nearest_sorted(double a, const double *v, unsigned n)
{
	unsigned lo = 0, hi = n - 1;
	if (a >= v[hi])
		return hi;
	while (hi - lo > 1) { /* v[lo] <= a < v[hi] */
		unsigned mid = (lo + hi) / 2;
		if (v[mid] <= a)
			lo = mid;
		else
			hi = mid;
	}
	double dl = a - v[lo], dh = v[hi] - a;
	if (dl < dh)
		return lo;
	if (dh < dl)
		return hi;
	return lo & 1 ? hi : lo;
}

/* bf16 -> f16 for every bf16 pattern, against the nearest of all f16 values
 * (65504 rounds up to "65536", i.e. inf, from 65520 on, as IEEE says). */
Test(quant, f16_cast_every_bf16_pattern)
{
	double *v = xmalloc(0x7C01 * sizeof(double));
	for (unsigned c = 0; c < 0x7C00; c++) {
		unsigned e = c >> 10, m = c & 0x3FF;
		v[c] = e ? ldexp(1024.0 + m, (int)e - 25) : ldexp((double)m, -24);
	}
	v[0x7C00] = 65536.0; /* the next step past 65504: becomes inf */
	uint16_t *in = xmalloc(65536 * 2), *out = xmalloc(65536 * 2);
	for (unsigned i = 0; i < 65536; i++)
		in[i] = (uint16_t)i;
	cr_assert_eq(arena_quant_cast(ARENA_DTYPE_F16, out, ARENA_DTYPE_BF16, in, 65536, 0), 0);
	for (unsigned i = 0; i < 65536; i++) {
		float x = bf16_val((uint16_t)i);
		uint16_t sign = (i & 0x8000) ? 0x8000 : 0, want;
		if (isnan(x))
			want = sign | 0x7E00;
		else if (isinf(x))
			want = sign | 0x7C00;
		else
			want = sign | (uint16_t)nearest_sorted(fabs((double)x), v, 0x7C01);
		cr_assert_eq(out[i], want, "f16 of bf16 0x%04x (%a): got 0x%04x, want 0x%04x", i, (double)x, out[i], want);
	}
	free(v);
	free(in);
	free(out);
}

/* f32 -> f16 on random patterns and on every f16 midpoint and its neighbours. */
Test(quant, f16_cast_random_f32_and_midpoints)
{
	enum { N = 400000 };
	double *v = xmalloc(0x7C01 * sizeof(double));
	for (unsigned c = 0; c < 0x7C00; c++) {
		unsigned e = c >> 10, m = c & 0x3FF;
		v[c] = e ? ldexp(1024.0 + m, (int)e - 25) : ldexp((double)m, -24);
	}
	v[0x7C00] = 65536.0;
	float *in = xmalloc(N * 4);
	uint16_t *out = xmalloc(N * 2);
	size_t n = 0;
	for (unsigned c = 0; c < 0x7C00 && n + 6 <= N / 2; c++) {
		float mid = (float)((v[c] + v[c + 1]) / 2); /* exact in f32 */
		float cand[] = {mid, nextafterf(mid, 0), nextafterf(mid, INFINITY)};
		for (int k = 0; k < 3; k++) {
			in[n++] = cand[k];
			in[n++] = -cand[k];
		}
	}
	while (n < N)
		in[n++] = (rnd() & 1) ? f32_of((uint32_t)rnd()) : rnd_value();
	cr_assert_eq(arena_quant_cast(ARENA_DTYPE_F16, out, ARENA_DTYPE_F32, in, N, 0), 0);
	for (size_t i = 0; i < N; i++) {
		float x = in[i];
		uint16_t sign = signbit(x) ? 0x8000 : 0, want;
		if (isnan(x))
			want = sign | 0x7E00;
		else if (isinf(x))
			want = sign | 0x7C00;
		else
			want = sign | (uint16_t)nearest_sorted(fabs((double)x), v, 0x7C01);
		cr_assert_eq(out[i], want, "f16 of f32 0x%08x (%a): got 0x%04x, want 0x%04x", bits_of(x), (double)x, out[i],
			     want);
	}
	free(v);
	free(in);
	free(out);
}

/* The baseline kernels and the ones picked for this CPU (AVX2 on x86-64
 * machines that have it) give the same bytes. */
Test(quant, baseline_kernels_equal_the_default_ones)
{
	const uint64_t w[] = {33, 2049};
	const uint64_t n = w[0] * w[1];
	float *f = xmalloc(n * 4);
	uint16_t *h = xmalloc(n * 2);
	for (uint64_t i = 0; i < n; i++) {
		f[i] = rnd_value();
		h[i] = (uint16_t)rnd();
	}
	const arena_dtype srcs[] = {ARENA_DTYPE_F32, ARENA_DTYPE_BF16, ARENA_DTYPE_F16};
	void *safe[3] = {int4_safe(f, srcs[0], n), int4_safe(h, srcs[1], n), int4_safe(h, srcs[2], n)};
	const arena_dtype outs[] = {ARENA_DTYPE_F32, ARENA_DTYPE_BF16, ARENA_DTYPE_F16, ARENA_DTYPE_F8_E4M3,
				    ARENA_DTYPE_F8_E5M2};
	unsigned char *a = xmalloc(n * 4), *b = xmalloc(n * 4);
	for (size_t si = 0; si < 3; si++) {
		const void *src = si ? (const void *)h : (const void *)f;
		for (int s = 0; s < ARENA_QUANT_COUNT; s++) {
			outbuf x, y;
			const void *in = is_int4(s) ? safe[si] : src;
			unsetenv("ARENA_QUANT_ISA");
			run_scheme(&x, (arena_quant_scheme)s, srcs[si], 2, w, in, 0);
			setenv("ARENA_QUANT_ISA", "baseline", 1);
			run_scheme(&y, (arena_quant_scheme)s, srcs[si], 2, w, in, 0);
			for (size_t c = 0; c < x.p.n_comps; c++)
				assert_same_bytes(x.comp[c], y.comp[c], x.p.comps[c].nbytes, arena_quant_name((arena_quant_scheme)s));
			out_free(&x);
			out_free(&y);
		}
		for (size_t o = 0; o < sizeof(outs) / sizeof(outs[0]); o++) {
			unsetenv("ARENA_QUANT_ISA");
			cr_assert_eq(arena_quant_cast(outs[o], a, srcs[si], src, n, 0), 0);
			setenv("ARENA_QUANT_ISA", "baseline", 1);
			cr_assert_eq(arena_quant_cast(outs[o], b, srcs[si], src, n, 0), 0);
			assert_same_bytes(a, b, n * arena_dtype_bits(outs[o]) / 8, arena_dtype_name(outs[o]));
		}
	}
	unsetenv("ARENA_QUANT_ISA");
	for (size_t k = 0; k < 3; k++)
		free(safe[k]);
	free(f);
	free(h);
	free(a);
	free(b);
}

/* f16 -> bf16 for every f16 pattern, and random f32 -> bf16: the nearer of
 * the two bf16 values around x, ties to even; NaN -> 0x7FC0. */
static uint16_t ref_bf16(float x)
{
	if (isnan(x))
		return 0x7FC0;
	uint32_t u = bits_of(x);
	uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
	if ((u & 0xFFFF) == 0)
		return lo;
	double a = fabs((double)x), dl = a - fabs((double)bf16_val(lo)), dh = fabs((double)bf16_val(hi)) - a;
	if ((lo & 0x7FFF) == 0x7F7F) /* above the largest finite bf16: inf is the next value, 2^128 */
		dh = ldexp(1.0, 128) - a;
	if (dl < dh)
		return lo;
	if (dh < dl)
		return hi;
	return lo & 1 ? hi : lo;
}

Test(quant, bf16_cast_every_f16_pattern_and_random_f32)
{
	enum { N = 300000 };
	uint16_t *in = xmalloc(65536 * 2), *out = xmalloc(N * 2);
	float *f = xmalloc(N * 4);
	for (unsigned i = 0; i < 65536; i++)
		in[i] = (uint16_t)i;
	cr_assert_eq(arena_quant_cast(ARENA_DTYPE_BF16, out, ARENA_DTYPE_F16, in, 65536, 0), 0);
	cr_assert_eq(arena_quant_cast(ARENA_DTYPE_F32, f, ARENA_DTYPE_F16, in, 65536, 0), 0);
	for (unsigned i = 0; i < 65536; i++)
		cr_assert_eq(out[i], ref_bf16(f[i]), "bf16 of f16 0x%04x: got 0x%04x, want 0x%04x", i, out[i], ref_bf16(f[i]));
	for (size_t i = 0; i < N; i++)
		f[i] = (i & 1) ? f32_of((uint32_t)rnd()) : f32_of(((uint32_t)rnd() & 0xFFFF0000u) | 0x8000u); /* ties */
	cr_assert_eq(arena_quant_cast(ARENA_DTYPE_BF16, out, ARENA_DTYPE_F32, f, N, 0), 0);
	for (size_t i = 0; i < N; i++)
		cr_assert_eq(out[i], ref_bf16(f[i]), "bf16 of f32 0x%08x: got 0x%04x, want 0x%04x", bits_of(f[i]), out[i],
			     ref_bf16(f[i]));
	free(in);
	free(out);
	free(f);
}

/* The scaled schemes against plain scalar C (f32 arithmetic, rintf for round
 * half even in the default rounding mode, the slow FP8 reference above), on
 * random data with NaN and inf in some rows. */
static void ref_rows(arena_quant_scheme s, const float *x, uint64_t rows, uint64_t cols, uint8_t *q, float *scale)
{
	const float div = s == ARENA_QUANT_INT8_ROW ? 127.0f : 448.0f;
	for (uint64_t r = 0; r < rows; r++) {
		float amax = 0;
		int nan = 0;
		for (uint64_t c = 0; c < cols; c++) {
			float a = fabsf(x[r * cols + c]);
			nan |= isnan(a);
			amax = a > amax ? a : amax;
		}
		float sc = nan ? NAN : amax / div;
		sc = sc < 1e-12f ? 1e-12f : sc; /* NaN stays */
		scale[r] = sc;
		for (uint64_t c = 0; c < cols; c++) {
			float v = x[r * cols + c] / sc;
			if (s == ARENA_QUANT_INT8_ROW) {
				v = isnan(v) ? 0.0f : v;
				v = rintf(v);
				v = v < -127 ? -127 : v > 127 ? 127 : v;
				q[r * cols + c] = (uint8_t)(int8_t)v;
			} else {
				q[r * cols + c] = ref_fp8_sat(v, 0);
			}
		}
	}
}

Test(quant, scaled_schemes_against_scalar_reference)
{
	const uint64_t w[] = {40, 777};
	const uint64_t n = w[0] * w[1];
	float *x = xmalloc(n * 4), *sc = xmalloc(w[0] * 4), *deq = xmalloc(n * 4);
	uint8_t *q = xmalloc(n);
	for (uint64_t i = 0; i < n; i++)
		x[i] = rnd_finite();
	x[3 * w[1] + 5] = NAN;       /* row 3: NaN scale, all NaN */
	x[4 * w[1] + 6] = -INFINITY; /* row 4: inf scale */
	for (uint64_t c = 0; c < w[1]; c++)
		x[5 * w[1] + c] = 0.0f; /* row 5: all zero, scale 1e-12 */
	x[6 * w[1]] = 1e-30f;       /* row 6: tiny amax */
	const arena_quant_scheme schemes[] = {ARENA_QUANT_FP8_E4M3_ROW, ARENA_QUANT_INT8_ROW};
	for (int k = 0; k < 2; k++) {
		outbuf o;
		run_scheme(&o, schemes[k], ARENA_DTYPE_F32, 2, w, x, 0);
		ref_rows(schemes[k], x, w[0], w[1], q, sc);
		assert_same_bytes(o.comp[0], q, n, arena_quant_name(schemes[k]));
		for (uint64_t r = 0; r < w[0]; r++) {
			float got;
			memcpy(&got, (char *)o.comp[1] + 4 * r, 4);
			cr_assert(bits_of(got) == bits_of(sc[r]), "row %llu scale %a, want %a",
				  (unsigned long long)r, (double)got, (double)sc[r]);
		}
		/* dequantize: q * scale, one f32 multiply */
		const void *comps[] = {o.comp[0], o.comp[1]};
		cr_assert_eq(arena_quant_dequant_f32(&o.p, comps, deq, 0), 0);
		for (uint64_t i = 0; i < n; i++) {
			float qv;
			if (k)
				qv = (float)(int8_t)q[i];
			else
				cr_assert_eq(arena_quant_cast(ARENA_DTYPE_F32, &qv, ARENA_DTYPE_F8_E4M3, &q[i], 1, 1), 0);
			float want = qv * sc[i / w[1]];
			cr_assert(bits_of(deq[i]) == bits_of(want) || (isnan(deq[i]) && isnan(want)), "%llu: %a, want %a",
				  (unsigned long long)i, (double)deq[i], (double)want);
		}
		out_free(&o);
	}
	/* tensor scheme = one row holding everything, NaN-free here */
	x[3 * w[1] + 5] = 1.0f;
	x[4 * w[1] + 6] = 2.0f;
	outbuf o;
	run_scheme(&o, ARENA_QUANT_FP8_E4M3_TENSOR, ARENA_DTYPE_F32, 2, w, x, 0);
	ref_rows(ARENA_QUANT_FP8_E4M3_ROW, x, 1, n, q, sc);
	assert_same_bytes(o.comp[0], q, n, "fp8-e4m3-tensor");
	assert_same_bytes(o.comp[1], sc, 4, "tensor scale");
	out_free(&o);
	/* an all-zero tensor: scale 1e-12 (the floor), values 0, not NaN */
	memset(x, 0, n * 4);
	run_scheme(&o, ARENA_QUANT_FP8_E4M3_TENSOR, ARENA_DTYPE_F32, 2, w, x, 0);
	float s0;
	memcpy(&s0, o.comp[1], 4);
	cr_assert_eq(s0, 1e-12f);
	cr_assert_eq(first_diff(o.comp[0], x, n), -1);
	out_free(&o);
	free(x);
	free(sc);
	free(deq);
	free(q);
}

/* ---- int4 ------------------------------------------------------------------------------------ */

/* int4 in plain scalar C from docs/QUANT.md's rule (fminf/fmaxf, rintf for
 * round half even), the scale rounded to the source's dtype by the cast
 * checked above; writes the three components and the f32 values. */
static void ref_int4(arena_dtype dt, const float *x, uint64_t rows, uint64_t cols, unsigned n, uint8_t *q, void *scale,
		     uint8_t *zero, float *val)
{
	const uint64_t groups = (cols + n - 1) / n, rb = (cols + 1) / 2;
	memset(q, 0, rows * rb);
	for (uint64_t r = 0; r < rows; r++) {
		for (uint64_t g = 0; g < groups; g++) {
			const uint64_t c0 = g * n, c1 = c0 + n < cols ? c0 + n : cols;
			float lo = 0, hi = 0;
			for (uint64_t c = c0; c < c1; c++) {
				lo = fminf(lo, x[r * cols + c]);
				hi = fmaxf(hi, x[r * cols + c]);
			}
			const float t = (hi - lo) / 15.0f;
			float sw;
			uint16_t h = 0;
			if (dt == ARENA_DTYPE_F32) {
				sw = t;
				memcpy((char *)scale + 4 * (r * groups + g), &t, 4);
			} else {
				cr_assert_eq(arena_quant_cast(dt, &h, ARENA_DTYPE_F32, &t, 1, 1), 0);
				cr_assert_eq(arena_quant_cast(ARENA_DTYPE_F32, &sw, dt, &h, 1, 1), 0);
				memcpy((char *)scale + 2 * (r * groups + g), &h, 2);
			}
			const float d = sw == 0 ? 1.0f : sw;
			float z = rintf(-lo / d);
			z = z < 0 ? 0 : z > 15 ? 15 : z;
			zero[r * groups + g] = (uint8_t)z;
			for (uint64_t c = c0; c < c1; c++) {
				float v = rintf(x[r * cols + c] / d) + z;
				v = v < 0 ? 0 : v > 15 ? 15 : v;
				q[r * rb + c / 2] |= (uint8_t)((unsigned)v << (4 * (c & 1)));
				val[r * cols + c] = (v - z) * sw;
			}
		}
	}
}

/* Values with the edges of the rule: ties of x / d, groups of zeros (scale
 * 0), all positive (z = 0), all negative (z = 15), +-0, tiny (an f16 scale
 * underflows), and ordinary ones; exactly representable in BF16. */
static void int4_values(float *x, uint64_t rows, uint64_t cols)
{
	for (uint64_t i = 0; i < rows * cols; i++)
		x[i] = bf16_val((uint16_t)(bits_of(ldexpf((float)(rnd() % 2001) - 1000.0f, -8)) >> 16));
	for (uint64_t r = 0; r < rows; r++) {
		float *row = x + r * cols;
		switch (r % 6) {
		case 0: /* ties: lo -7, hi 8: scale 1, z 7 */
			for (uint64_t c = 0; c < cols && c < 8; c++)
				row[c] = (const float[]){-7.0f, -3.5f, -0.5f, 0.0f, 0.5f, 1.5f, 2.5f, 8.0f}[c];
			break;
		case 1:
			for (uint64_t c = 0; c < cols && c < 40; c++)
				row[c] = c & 1 ? -0.0f : 0.0f;
			break;
		case 2:
			for (uint64_t c = 0; c < cols; c++)
				row[c] = fabsf(row[c]);
			break;
		case 3:
			for (uint64_t c = 0; c < cols; c++)
				row[c] = -fabsf(row[c]) - 1.0f;
			break;
		case 4:
			for (uint64_t c = 0; c < cols; c++)
				row[c] = row[c] * 0x1p-30f;
			break;
		default:
			break;
		}
	}
}

Test(quant, int4_against_scalar_reference)
{
	/* every group-size edge: cols a multiple of the group, not, under it,
	 * odd, one column; one row; rank 1 and 3 */
	const uint64_t shapes[][3] = {{6, 256, 0}, {6, 77, 0}, {7, 31, 0}, {6, 129, 0}, {1, 7, 0}, {5, 1, 0},
				      {1, 1, 0},   {300, 0, 0}, {6, 5, 7}};
	const uint32_t ranks[] = {2, 2, 2, 2, 2, 2, 2, 1, 3};
	const arena_quant_scheme schemes[] = {ARENA_QUANT_INT4_G32, ARENA_QUANT_INT4_G64, ARENA_QUANT_INT4_G128};
	const arena_dtype dts[] = {ARENA_DTYPE_BF16, ARENA_DTYPE_F16, ARENA_DTYPE_F32};
	for (size_t k = 0; k < sizeof(ranks) / sizeof(ranks[0]); k++) {
		const uint64_t rows = ranks[k] >= 2 ? shapes[k][0] : 1;
		uint64_t n = 1;
		for (uint32_t d = 0; d < ranks[k]; d++)
			n *= shapes[k][d];
		const uint64_t cols = n / rows;
		float *x = xmalloc(n * 4), *val = xmalloc(n * 4), *deq = xmalloc(n * 4);
		int4_values(x, rows, cols);
		uint8_t *q = xmalloc(n), *z = xmalloc(n);
		unsigned char *sc = xmalloc(n * 4), *src = xmalloc(n * 4);
		for (size_t si = 0; si < 3; si++) {
			cr_assert_eq(arena_quant_cast(dts[si], src, ARENA_DTYPE_F32, x, n, 1), 0);
			float *xs = xmalloc(n * 4); /* the values as the source holds them */
			cr_assert_eq(arena_quant_cast(ARENA_DTYPE_F32, xs, dts[si], src, n, 1), 0);
			for (size_t g = 0; g < 3; g++) {
				char what[96];
				snprintf(what, sizeof(what), "%s from %s, shape %zu", arena_quant_name(schemes[g]),
					 arena_dtype_name(dts[si]), k);
				outbuf o;
				run_scheme(&o, schemes[g], dts[si], ranks[k], shapes[k], src, 0);
				cr_assert(o.p.rows == rows && o.p.cols == cols, "%s", what);
				ref_int4(dts[si], xs, rows, cols, arena_quant_group(schemes[g]), q, sc, z, val);
				assert_same_bytes(o.comp[0], q, o.p.comps[0].nbytes, what);
				assert_same_bytes(o.comp[1], sc, o.p.comps[1].nbytes, what);
				assert_same_bytes(o.comp[2], z, o.p.comps[2].nbytes, what);
				const void *comps[] = {o.comp[0], o.comp[1], o.comp[2]};
				cr_assert_eq(arena_quant_dequant_f32(&o.p, comps, deq, 0), 0);
				assert_same_bytes(deq, val, n * 4, what);
				/* any byte range of any component, as convert asks for them */
				arena_quant_input in = {.data = src};
				check_fill(&o, &in);
				out_free(&o);
			}
			free(xs);
		}
		free(x);
		free(val);
		free(deq);
		free(q);
		free(z);
		free(sc);
		free(src);
	}
}

/* The layout spelled out: codes two a byte, the even column low; a row of
 * odd length ends in a high nibble of 0; value = (q - z) x scale. */
Test(quant, int4_layout)
{
	const float x[2][5] = {{-7.0f, -3.5f, 0.5f, 1.5f, 8.0f}, {0.0f, 0.0f, 0.0f, 0.0f, 0.0f}};
	const uint64_t w[] = {2, 5};
	outbuf o;
	run_scheme(&o, ARENA_QUANT_INT4_G32, ARENA_DTYPE_F32, 2, w, x, 1);
	const uint8_t *q = o.comp[0], *z = o.comp[2];
	const float *s = o.comp[1];
	/* row 0: lo -7, hi 8, scale 1, z 7: codes 0, 3 (-3.5 -> -4), 7 (0.5 -> 0), 9 (1.5 -> 2), 15 */
	cr_assert(s[0] == 1.0f && z[0] == 7, "scale %a, zero %u", (double)s[0], z[0]);
	cr_assert(q[0] == 0x30 && q[1] == 0x97 && q[2] == 0x0F, "%02x %02x %02x", q[0], q[1], q[2]);
	/* row 1: all zero: scale 0, zero point 0, codes 0 */
	cr_assert(s[1] == 0.0f && z[1] == 0 && q[3] == 0 && q[4] == 0 && q[5] == 0);
	float v[10];
	cr_assert_eq(arena_quant_dequant_f32(&o.p, (const void *const[]){q, s, z}, v, 1), 0);
	const float want[10] = {-7, -4, 0, 2, 8, 0, 0, 0, 0, 0};
	assert_same_bytes(v, want, sizeof(v), "values");
	out_free(&o);
}

/* NaN, infinities and groups whose range overflows f32 are refused, naming
 * the row, columns and group: the same first group whatever the thread
 * count, and by any byte range that touches it (fill), not by others. */
Test(quant, int4_refuses_nan_inf_and_overflow)
{
	const uint64_t w[] = {2000, 1100}; /* 2.2 Mi elements: several threads */
	const uint64_t n = w[0] * w[1];
	float *f = xmalloc(n * 4);
	for (uint64_t i = 0; i < n; i++)
		f[i] = rnd_finite() * 0x1p-20f;
	const float bad[] = {NAN, -INFINITY, INFINITY};
	for (size_t b = 0; b < 4; b++) {
		float *x = xmalloc(n * 4);
		memcpy(x, f, n * 4);
		if (b < 3) {
			x[1500 * w[1] + 130] = bad[b];
			x[1700 * w[1] + 5] = bad[b]; /* a later one: not named */
		} else {                             /* f32 range: 3e38 - -3e38 overflows */
			x[1500 * w[1] + 130] = 3e38f;
			x[1500 * w[1] + 131] = -3e38f;
		}
		for (unsigned threads = 1; threads <= 7; threads += 6) {
			arena_quant_plan p;
			cr_assert_eq(arena_quant_plan_init(&p, ARENA_QUANT_INT4_G64, ARENA_DTYPE_F32, 2, w, "t"), 0);
			void *comp[3] = {xmalloc(p.comps[0].nbytes), xmalloc(p.comps[1].nbytes), xmalloc(p.comps[2].nbytes)};
			cr_assert_eq(arena_quant_run(&p, x, comp, threads), ARENA_E(QUANT_NOT_APPLICABLE));
			const char *m = arena_last_error();
			cr_assert(strstr(m, "int4-g64: row 1500, columns 128 to 191 (group 2)"), "%s", m);
			cr_assert(strstr(m, "NaN or an infinity") && strstr(m, "--quant-exclude"), "%s", m);
			for (int c = 0; c < 3; c++)
				free(comp[c]);
		}
		arena_quant_plan p;
		cr_assert_eq(arena_quant_plan_init(&p, ARENA_QUANT_INT4_G64, ARENA_DTYPE_F32, 2, w, "t"), 0);
		arena_quant_input in = {.data = x};
		unsigned char buf[600];
		const uint64_t rb = w[1] / 2, v = 1500 * p.groups + 2;
		cr_assert_eq(arena_quant_fill(&p, &in, 0, 1500 * rb + 65, 1, buf), ARENA_E(QUANT_NOT_APPLICABLE));
		cr_assert(strstr(arena_last_error(), "row 1500, columns 128 to 191"), "%s", arena_last_error());
		cr_assert_eq(arena_quant_fill(&p, &in, 0, 1500 * rb + 64 - 10, 10, buf), 0, "%s", arena_last_error());
		cr_assert_eq(arena_quant_fill(&p, &in, 1, 4 * v + 3, 1, buf), ARENA_E(QUANT_NOT_APPLICABLE));
		cr_assert_eq(arena_quant_fill(&p, &in, 2, v - 1, 1, buf), 0);
		cr_assert_eq(arena_quant_fill(&p, &in, 2, v, 500, buf), ARENA_E(QUANT_NOT_APPLICABLE));
		free(x);
	}
	/* values near the f32 maximum in one group are fine when their range is */
	const float big[4] = {3e38f, 2e38f, 1e38f, 0.0f};
	outbuf o;
	run_scheme(&o, ARENA_QUANT_INT4_G32, ARENA_DTYPE_F32, 1, (const uint64_t[]){4}, big, 1);
	out_free(&o);
	free(f);
}

/* NaN keeps its sign in every cast but BF16 (c10: 0x7FC0). */
Test(quant, nan_and_inf)
{
	const float in[] = {NAN, -NAN, INFINITY, -INFINITY};
	uint8_t q[4];
	uint16_t h[4];
	cr_assert_eq(arena_quant_cast(ARENA_DTYPE_F8_E4M3, q, ARENA_DTYPE_F32, in, 4, 1), 0);
	cr_assert(q[0] == 0x7F && q[1] == 0xFF && q[2] == 0x7E && q[3] == 0xFE, "%02x %02x %02x %02x", q[0], q[1], q[2],
		  q[3]);
	cr_assert_eq(arena_quant_cast(ARENA_DTYPE_F8_E5M2, q, ARENA_DTYPE_F32, in, 4, 1), 0);
	cr_assert(q[0] == 0x7F && q[1] == 0xFF && q[2] == 0x7B && q[3] == 0xFB, "%02x %02x %02x %02x", q[0], q[1], q[2],
		  q[3]);
	cr_assert_eq(arena_quant_cast(ARENA_DTYPE_F16, h, ARENA_DTYPE_F32, in, 4, 1), 0);
	cr_assert(h[0] == 0x7E00 && h[1] == 0xFE00 && h[2] == 0x7C00 && h[3] == 0xFC00, "%04x %04x %04x %04x", h[0], h[1],
		  h[2], h[3]);
	cr_assert_eq(arena_quant_cast(ARENA_DTYPE_BF16, h, ARENA_DTYPE_F32, in, 4, 1), 0);
	cr_assert(h[0] == 0x7FC0 && h[1] == 0x7FC0 && h[2] == 0x7F80 && h[3] == 0xFF80, "%04x %04x %04x %04x", h[0], h[1],
		  h[2], h[3]);
	float m;
	cr_assert_eq(arena_quant_amax(ARENA_DTYPE_F32, in, 4, 1, &m), 0);
	cr_assert_eq(bits_of(m), 0x7FC00000u); /* one NaN, whatever the payloads */
	cr_assert_eq(bits_of(arena_quant_amax_merge(1.0f, -NAN)), 0x7FC00000u);
	cr_assert_eq(bits_of(arena_quant_amax_merge(f32_of(0x7FC12345u), 1.0f)), 0x7FC00000u);
	cr_assert_eq(arena_quant_amax_merge(2.0f, 1.0f), 2.0f);
	cr_assert(isnan(arena_quant_tensor_scale(NAN)));
	cr_assert_eq(arena_quant_tensor_scale(0.0f), 1e-12f);
	cr_assert_eq(arena_quant_tensor_scale(448.0f), 1.0f);
}

/* ---- compressed-tensors ------------------------------------------------------------------------ */

Test(quant, ct_classify)
{
	const arena_dtype E4 = ARENA_DTYPE_F8_E4M3, F32 = ARENA_DTYPE_F32;
	const uint64_t w[] = {64, 256}, one[] = {1}, oo[] = {1, 1}, r1[] = {64, 1}, r[] = {64}, r2[] = {64, 2},
		       bad[] = {63, 1}, v[] = {16}, c4[] = {64, 3, 3, 3}, r111[] = {64, 1, 1, 1}, empty[] = {0, 4};
	const char *why;
	cr_assert_eq(arena_quant_ct_classify(E4, 2, w, F32, 1, one, &why), ARENA_QUANT_FP8_E4M3_TENSOR);
	cr_assert_null(why);
	cr_assert_eq(arena_quant_ct_classify(E4, 2, w, F32, 0, NULL, &why), ARENA_QUANT_FP8_E4M3_TENSOR);
	cr_assert_eq(arena_quant_ct_classify(E4, 2, w, F32, 2, oo, &why), ARENA_QUANT_FP8_E4M3_TENSOR);
	cr_assert_eq(arena_quant_ct_classify(E4, 1, v, F32, 1, one, &why), ARENA_QUANT_FP8_E4M3_TENSOR);
	cr_assert_eq(arena_quant_ct_classify(E4, 2, w, F32, 2, r1, &why), ARENA_QUANT_FP8_E4M3_ROW);
	cr_assert_eq(arena_quant_ct_classify(E4, 2, w, F32, 1, r, &why), ARENA_QUANT_FP8_E4M3_ROW);
	cr_assert_eq(arena_quant_ct_classify(E4, 2, w, ARENA_DTYPE_BF16, 2, r1, &why), ARENA_QUANT_FP8_E4M3_ROW);
	cr_assert_eq(arena_quant_ct_classify(E4, 4, c4, F32, 4, r111, &why), ARENA_QUANT_FP8_E4M3_ROW);
	cr_assert_eq(arena_quant_ct_classify(E4, 4, c4, F32, 2, r1, &why), ARENA_QUANT_FP8_E4M3_ROW);
	/* not pairs */
	cr_assert_eq(arena_quant_ct_classify(ARENA_DTYPE_BF16, 2, w, F32, 1, one, &why), ARENA_QUANT_NONE);
	cr_assert_not_null(why);
	cr_assert_eq(arena_quant_ct_classify(ARENA_DTYPE_F8_E5M2, 2, w, F32, 1, one, &why), ARENA_QUANT_NONE);
	cr_assert_eq(arena_quant_ct_classify(E4, 2, w, ARENA_DTYPE_I32, 1, one, &why), ARENA_QUANT_NONE);
	cr_assert_not_null(strstr(why, "dtype"), "%s", why);
	cr_assert_eq(arena_quant_ct_classify(E4, 2, w, ARENA_DTYPE_F8_E4M3, 1, one, &why), ARENA_QUANT_NONE);
	cr_assert_eq(arena_quant_ct_classify(E4, 2, w, F32, 2, bad, &why), ARENA_QUANT_NONE); /* mismatched rows */
	cr_assert_not_null(strstr(why, "per row"), "%s", why);
	cr_assert_eq(arena_quant_ct_classify(E4, 2, w, F32, 2, r2, &why), ARENA_QUANT_NONE); /* per group */
	cr_assert_eq(arena_quant_ct_classify(E4, 1, v, F32, 1, v, &why), ARENA_QUANT_NONE);  /* rows of a vector */
	cr_assert_eq(arena_quant_ct_classify(E4, 2, w, F32, 3, (const uint64_t[]){64, 1, 1}, &why), ARENA_QUANT_NONE);
	cr_assert_eq(arena_quant_ct_classify(E4, 2, empty, F32, 1, one, &why), ARENA_QUANT_NONE);
	cr_assert_eq(arena_quant_ct_classify(E4, 2, w, F32, 1, r, NULL), ARENA_QUANT_FP8_E4M3_ROW);
}

static char tmpdir[1024];

static void tmp_setup(void)
{
	tmpdir_make(tmpdir, sizeof(tmpdir), "quant");
}

static void tmp_teardown(void)
{
	tmpdir_remove(tmpdir);
}

typedef struct st_entry {
	const char *name;
	const char *dtype;
	uint32_t rank;
	uint64_t shape[4];
	const void *data;
	size_t nbytes;
} st_entry;

/* Write a safetensors file of the entries (data back to back, in order). */
static const char *write_st(const char *file, const st_entry *e, size_t n)
{
	static char path[2048];
	char hdr[8192];
	size_t o = 0, off = 0;
	o += (size_t)snprintf(hdr + o, sizeof(hdr) - o, "{");
	for (size_t i = 0; i < n; i++) {
		o += (size_t)snprintf(hdr + o, sizeof(hdr) - o, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", i ? "," : "",
				      e[i].name, e[i].dtype);
		for (uint32_t k = 0; k < e[i].rank; k++)
			o += (size_t)snprintf(hdr + o, sizeof(hdr) - o, "%s%llu", k ? "," : "",
					      (unsigned long long)e[i].shape[k]);
		o += (size_t)snprintf(hdr + o, sizeof(hdr) - o, "],\"data_offsets\":[%zu,%zu]}", off, off + e[i].nbytes);
		off += e[i].nbytes;
	}
	o += (size_t)snprintf(hdr + o, sizeof(hdr) - o, "}");
	cr_assert_lt(o, sizeof(hdr));
	snprintf(path, sizeof(path), "%s/%s", tmpdir, file);
	FILE *fp = fopen(path, "wb");
	cr_assert_not_null(fp, "%s", path);
	uint64_t hl = o;
	unsigned char le[8];
	for (int k = 0; k < 8; k++)
		le[k] = (unsigned char)(hl >> (8 * k));
	cr_assert_eq(fwrite(le, 1, 8, fp), 8);
	cr_assert_eq(fwrite(hdr, 1, o, fp), o);
	for (size_t i = 0; i < n; i++)
		cr_assert_eq(fwrite(e[i].data, 1, e[i].nbytes, fp), e[i].nbytes);
	cr_assert_eq(fclose(fp), 0);
	return path;
}

TestSuite(quant_ct, .init = tmp_setup, .fini = tmp_teardown);

Test(quant_ct, match_in_a_checkpoint)
{
	uint8_t q[8 * 16], q2[4 * 4], q3[6 * 2];
	float rs[8], ts = 0.5f, gs[6 * 2];
	uint16_t bs[4] = {0x3F80, 0x4000, 0x4040, 0x4080}; /* bf16 1, 2, 3, 4 */
	uint16_t qb[4 * 4];
	for (size_t i = 0; i < sizeof(q); i++)
		q[i] = (uint8_t)(i * 7);
	for (size_t i = 0; i < sizeof(q2); i++)
		q2[i] = (uint8_t)(0x38 + (i % 5)); /* 1.0 .. 1.5 */
	for (size_t i = 0; i < 8; i++)
		rs[i] = (float)(i + 1) / 16;
	memset(q3, 0x30, sizeof(q3));
	memset(gs, 0, sizeof(gs));
	memset(qb, 0, sizeof(qb));
	const st_entry e[] = {
		{"a.weight", "F8_E4M3", 2, {8, 16}, q, sizeof(q)},
		{"a.weight_scale", "F32", 2, {8, 1}, rs, sizeof(rs)},
		{"b.weight", "F8_E4M3", 2, {4, 4}, q2, sizeof(q2)},
		{"b.weight_scale", "F32", 0, {0}, &ts, 4},
		{"c.weight", "F8_E4M3", 2, {4, 4}, q2, sizeof(q2)},
		{"c.weight_scale", "BF16", 1, {4}, bs, sizeof(bs)},
		{"d.weight", "F8_E4M3", 2, {6, 2}, q3, sizeof(q3)},
		{"d.weight_scale", "F32", 2, {6, 2}, gs, sizeof(gs)}, /* per group: not recognized */
		{"e.weight", "BF16", 2, {4, 4}, qb, sizeof(qb)},
		{"e.weight_scale", "F32", 1, {1}, &ts, 4}, /* BF16 data: not a pair */
		{"f.weight", "F8_E4M3", 2, {4, 4}, q2, sizeof(q2)}, /* no scale */
	};
	arena_ckpt *c;
	const char *path = write_st("ct.safetensors", e, sizeof(e) / sizeof(e[0]));
	cr_assert_eq(arena_ckpt_open(path, &c), 0, "%s", arena_last_error());
	const arena_st_tensor *s;
	const char *why;
	cr_assert_eq(arena_quant_ct_match(c, "a.weight", &s, &why), ARENA_QUANT_FP8_E4M3_ROW);
	cr_assert_str_eq(s->name, "a.weight_scale");
	cr_assert_eq(arena_quant_ct_match(c, "b.weight", &s, &why), ARENA_QUANT_FP8_E4M3_TENSOR);
	cr_assert_eq(arena_quant_ct_match(c, "c.weight", &s, &why), ARENA_QUANT_FP8_E4M3_ROW);
	cr_assert_eq(arena_quant_ct_match(c, "d.weight", &s, &why), ARENA_QUANT_NONE);
	cr_assert_null(s);
	cr_assert_not_null(why);
	cr_assert_eq(arena_quant_ct_match(c, "e.weight", &s, &why), ARENA_QUANT_NONE);
	cr_assert_eq(arena_quant_ct_match(c, "f.weight", &s, &why), ARENA_QUANT_NONE);
	cr_assert_null(why);
	cr_assert_eq(arena_quant_ct_match(c, "nope", &s, &why), ARENA_QUANT_NONE);
	cr_assert_eq(arena_quant_ct_match(c, "a.weight_scale", &s, &why), ARENA_QUANT_NONE);
	cr_assert_eq(arena_quant_ct_is_scale(c, "a.weight_scale"), 1);
	cr_assert_eq(arena_quant_ct_is_scale(c, "b.weight_scale"), 1);
	cr_assert_eq(arena_quant_ct_is_scale(c, "c.weight_scale"), 1);
	cr_assert_eq(arena_quant_ct_is_scale(c, "d.weight_scale"), 0);
	cr_assert_eq(arena_quant_ct_is_scale(c, "e.weight_scale"), 0);
	cr_assert_eq(arena_quant_ct_is_scale(c, "a.weight"), 0);
	cr_assert_eq(arena_quant_ct_is_scale(c, "_scale"), 0);

	/* keep a.weight: qdata copied, scale as is; then dequantize */
	const arena_st_tensor *a = arena_ckpt_find(c, "a.weight");
	cr_assert_eq(arena_quant_ct_match(c, "a.weight", &s, NULL), ARENA_QUANT_FP8_E4M3_ROW);
	arena_quant_plan p;
	cr_assert_eq(arena_quant_plan_prequant(&p, ARENA_QUANT_FP8_E4M3_ROW, a->rank, a->shape, a->name), 0);
	uint8_t oq[sizeof(q)];
	float os[8], deq[8 * 16];
	cr_assert_eq(arena_quant_run_scaled(&p, arena_st_data(a), s->dtype, arena_st_data(s), (void *[]){oq, os}, 0), 0);
	assert_same_bytes(oq, q, sizeof(q), "qdata");
	assert_same_bytes(os, rs, sizeof(rs), "scale");
	cr_assert_eq(arena_quant_dequant_f32(&p, (const void *[]){oq, os}, deq, 0), 0);
	for (size_t i = 0; i < 8 * 16; i++) {
		float qv;
		arena_quant_cast(ARENA_DTYPE_F32, &qv, ARENA_DTYPE_F8_E4M3, &q[i], 1, 1);
		float want = qv * rs[i / 16];
		cr_assert(bits_of(deq[i]) == bits_of(want) || (isnan(want) && isnan(deq[i])), "%zu", i);
	}

	/* c.weight: BF16 [4] scale widened to F32 [4, 1] */
	const arena_st_tensor *cw = arena_ckpt_find(c, "c.weight");
	cr_assert_eq(arena_quant_ct_match(c, "c.weight", &s, NULL), ARENA_QUANT_FP8_E4M3_ROW);
	cr_assert_eq(arena_quant_plan_prequant(&p, ARENA_QUANT_FP8_E4M3_ROW, cw->rank, cw->shape, cw->name), 0);
	cr_assert_eq(p.comps[1].shape[0], 4);
	cr_assert_eq(p.comps[1].shape[1], 1);
	uint8_t cq[16];
	float cs[4];
	cr_assert_eq(arena_quant_run_scaled(&p, arena_st_data(cw), s->dtype, arena_st_data(s), (void *[]){cq, cs}, 0), 0);
	cr_assert(cs[0] == 1.0f && cs[1] == 2.0f && cs[2] == 3.0f && cs[3] == 4.0f);

	/* b.weight: rank-0 scale -> [1] */
	const arena_st_tensor *bw = arena_ckpt_find(c, "b.weight");
	cr_assert_eq(arena_quant_ct_match(c, "b.weight", &s, NULL), ARENA_QUANT_FP8_E4M3_TENSOR);
	cr_assert_eq(arena_quant_plan_prequant(&p, ARENA_QUANT_FP8_E4M3_TENSOR, bw->rank, bw->shape, bw->name), 0);
	float bsc;
	cr_assert_eq(arena_quant_run_scaled(&p, arena_st_data(bw), s->dtype, arena_st_data(s), (void *[]){cq, &bsc}, 0), 0);
	cr_assert_eq(bsc, 0.5f);
	arena_ckpt_close(c);
}
