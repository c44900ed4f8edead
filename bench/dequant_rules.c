/* dequant_rules.c - the device's dequantization against formats/elem.h's
 * rules, every source value: all 256 bytes of F8_E4M3, F8_E5M2 and I8 and
 * all 65536 BF16 values, each times every scale of a set that holds the
 * special ones (+-0, denormal, the smallest normal, the largest float, +-inf,
 * NaN), with no scale, one for the tensor and one a row, into BF16, F16 and
 * F32, through the backend's dequant op (cuda: dequant_cuda.cu's kernels,
 * whose fast paths use the device's own conversions where it has them).
 * Every element's bits are compared with arena__dq_one on the host; where
 * both are NaN in F16 or F32 the bits may differ (the device's f32 product
 * of a NaN is the canonical NaN, the host's keeps the operand's sign and
 * payload, torch's alike): counted apart, not a mismatch. In BF16 every
 * NaN is 0x7FC0 on both.
 *
 *   dequant_rules [--backend cuda|sim] [--device N]
 *
 * Prints one JSON object (jobs, elements, mismatches, the first few of
 * them); exit status 0 when none differ, 1 when some do, 2 for usage, or
 * the class of an arena error (3 for no CUDA device) with a one-line
 * message on stderr. Build: `make bench` (build/bench/dequant_rules). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "../device/backend.h"
#include "../common/err.h"
#include "../formats/dequant.h"

/* Scales: one a row, so a row holds every source value times one scale. */
static const float k_scales[] = {1.0f, 0.5f, 3.0f, 1.0f / 448.0f, 1e-12f, 0x1p-126f, 1e-40f, 3.4028235e38f,
				 -2.5f, 7.1e-3f, 123.456f, 0.0f, -0.0f, INFINITY, -INFINITY, NAN};
#define N_SCALES (sizeof(k_scales) / sizeof(k_scales[0]))

struct ctx {
	arena_backend *b;
	arena_stream *s;
	uint64_t jobs, elements, bad, nan_bits;
	int shown;
};

/* An F16 or F32 element at p is a NaN. */
static int is_nan(const unsigned char *p, int dt)
{
	uint32_t u = 0;
	memcpy(&u, p, dt == ARENA_DTYPE_F32 ? 4 : 2);
	return dt == ARENA_DTYPE_F32 ? (u & 0x7FFFFFFFu) > 0x7F800000u : (u & 0x7FFFu) > 0x7C00u;
}

static int fail_arena(int rc)
{
	fprintf(stderr, "dequant_rules: %s\n", arena_last_error());
	return arena_err_class(rc);
}

/* One job over src (n elements of sdt, cols a row), its scale mode, into ddt:
 * the device's bits against the host's. */
static int check(struct ctx *c, const void *src, int sdt, uint64_t n, uint64_t cols, const float *scale,
		 uint64_t scale_n, int ddt)
{
	const uint64_t sb = n * (sdt == ARENA_DTYPE_BF16 ? 2 : 1), db = n * (ddt == ARENA_DTYPE_F32 ? 4 : 2);
	void *dsrc = NULL, *ddst = NULL, *dscale = NULL;
	unsigned char *want = malloc(db), *got = malloc(db);
	int rc = want && got ? 0 : arena_errorf(ARENA_E(NOMEM), "out of memory");
	if (!rc)
		rc = c->b->ops->dev_alloc(c->b, sb, &dsrc);
	if (!rc)
		rc = c->b->ops->dev_alloc(c->b, db, &ddst);
	if (!rc && scale_n)
		rc = c->b->ops->dev_alloc(c->b, scale_n * 4, &dscale);
	if (!rc)
		rc = c->b->ops->copy_h2d(c->b, dsrc, src, sb, c->s);
	if (!rc && scale_n)
		rc = c->b->ops->copy_h2d(c->b, dscale, scale, scale_n * 4, c->s);
	if (!rc) {
		arena_dequant_job j = {.dst = ddst, .src = dsrc, .scale = dscale, .n = n, .cols = cols,
				       .scale_n = scale_n, .src_dtype = sdt, .dst_dtype = ddt,
				       .scale_dtype = ARENA_DTYPE_F32};
		rc = c->b->ops->dequant(c->b, &j, c->s);
	}
	if (!rc)
		rc = c->b->ops->stream_sync(c->b, c->s);
	if (!rc)
		rc = c->b->ops->copy_d2h_sync(c->b, got, ddst, db);
	if (!rc) {
		arena_dequant_job h = {.dst = want, .src = src, .scale = scale, .n = n, .cols = cols,
				       .scale_n = scale_n, .src_dtype = sdt, .dst_dtype = ddt,
				       .scale_dtype = ARENA_DTYPE_F32};
		const unsigned w = ddt == ARENA_DTYPE_F32 ? 4 : 2;
		for (uint64_t i = 0; i < n; i++) {
			arena__dq_one(&h, i);
			if (memcmp(want + i * w, got + i * w, w)) {
				if (ddt != ARENA_DTYPE_BF16 && is_nan(want + i * w, ddt) && is_nan(got + i * w, ddt)) {
					c->nan_bits++; /* the device's product of a NaN is its canonical NaN */
					continue;
				}
				c->bad++;
				if (c->shown++ < 8) {
					uint32_t a = 0, g = 0, x = 0;
					memcpy(&a, want + i * w, w);
					memcpy(&g, got + i * w, w);
					memcpy(&x, (const unsigned char *)src + i * (sdt == ARENA_DTYPE_BF16 ? 2 : 1),
					       sdt == ARENA_DTYPE_BF16 ? 2 : 1);
					fprintf(stderr,
						"mismatch: src dtype %d value 0x%x, scale mode %llu (%g), dst dtype %d: "
						"rules 0x%x, device 0x%x\n",
						sdt, x, (unsigned long long)scale_n,
						scale_n ? (double)scale[scale_n == 1 ? 0 : i / cols] : 1.0, ddt, a, g);
				}
			}
		}
		c->jobs++;
		c->elements += n;
	}
	if (dsrc)
		c->b->ops->dev_free(c->b, dsrc);
	if (ddst)
		c->b->ops->dev_free(c->b, ddst);
	if (dscale)
		c->b->ops->dev_free(c->b, dscale);
	free(want);
	free(got);
	return rc;
}

int main(int argc, char **argv)
{
	const char *backend = "cuda";
	int device = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--backend") && i + 1 < argc)
			backend = argv[++i];
		else if (!strcmp(argv[i], "--device") && i + 1 < argc)
			device = atoi(argv[++i]);
		else {
			fprintf(stderr, "usage: dequant_rules [--backend cuda|sim] [--device N]\n");
			return 2;
		}
	}
	struct ctx c = {0};
	arena_sim_opts so = {0};
	int rc = arena_backend_create(backend, device, &so, &c.b);
	if (rc)
		return fail_arena(rc);
	/* bytes: each row all 256 values, a row a scale */
	static uint8_t bytes[N_SCALES * 256];
	for (size_t i = 0; i < sizeof(bytes); i++)
		bytes[i] = (uint8_t)i;
	/* bf16: each row 4096 values, all 65536 in 16 rows, the set repeated for every scale */
	const uint64_t bcols = 4096, bn = 65536 * N_SCALES;
	uint16_t *bf = malloc(bn * 2);
	float *bscales = malloc(bn / bcols * 4);
	if (!bf || !bscales)
		rc = arena_errorf(ARENA_E(NOMEM), "out of memory");
	else
		rc = c.b->ops->stream_create(c.b, &c.s);
	for (uint64_t i = 0; !rc && i < bn; i++)
		bf[i] = (uint16_t)i;
	for (uint64_t r = 0; !rc && r < bn / bcols; r++)
		bscales[r] = k_scales[r / 16];
	const int srcs[] = {ARENA_DTYPE_F8_E4M3, ARENA_DTYPE_F8_E5M2, ARENA_DTYPE_I8, ARENA_DTYPE_BF16};
	const int dsts[] = {ARENA_DTYPE_BF16, ARENA_DTYPE_F16, ARENA_DTYPE_F32};
	const float tensor_scale = 0.37f;
	for (size_t si = 0; si < sizeof(srcs) / sizeof(srcs[0]) && !rc; si++) {
		const int sdt = srcs[si];
		const int wide = sdt == ARENA_DTYPE_BF16;
		const void *src = wide ? (const void *)bf : (const void *)bytes;
		const uint64_t n = wide ? bn : sizeof(bytes), cols = wide ? bcols : 256;
		const float *rows = wide ? bscales : k_scales;
		for (size_t di = 0; di < sizeof(dsts) / sizeof(dsts[0]) && !rc; di++) {
			const int ddt = dsts[di];
			if (!(rc = check(&c, src, sdt, n, cols, NULL, 0, ddt)))
				if (!(rc = check(&c, src, sdt, n, cols, &tensor_scale, 1, ddt)))
					rc = check(&c, src, sdt, n, cols, rows, n / cols, ddt);
			/* the one-element path too: a length not a multiple of 16 */
			if (!rc)
				rc = check(&c, src, sdt, n - 3, n - 3, &tensor_scale, 1, ddt);
		}
	}
	free(bf);
	free(bscales);
	if (c.s)
		c.b->ops->stream_destroy(c.b, c.s);
	arena_backend_destroy(c.b);
	if (rc)
		return fail_arena(rc);
	printf("{\"backend\": \"%s\", \"jobs\": %llu, \"elements\": %llu, \"mismatches\": %llu, "
	       "\"nan_bits_differ\": %llu}\n",
	       backend, (unsigned long long)c.jobs, (unsigned long long)c.elements, (unsigned long long)c.bad,
	       (unsigned long long)c.nan_bits);
	return c.bad ? 1 : 0;
}
