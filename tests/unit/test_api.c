/* test_api.c - the public API of include/arena.h: open, inspect, close, on sim. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "../../common/alloc.h"
#include "testutil.h"

Test(api, open_safetensors_on_sim)
{
	arena_open_options o = {.backend = "sim", .vram_cap = 64 << 20};
	arena *a;
	cr_assert_eq(arena_open(fixture_path("tiny_flux.safetensors"), &o, &a), 0, "%s", arena_last_error());
	cr_assert_str_eq(arena_backend_name(a), "sim");
	cr_assert_eq(arena_block_count(a), 6);
	cr_assert_str_eq(arena_block_name(a, 1), "transformer_blocks.0");
	cr_assert_not_null(arena_block_device(a, 1));
	cr_assert_gt(arena_block_bytes(a, 1), 0);
	cr_assert_null(arena_block_name(a, 6));
	cr_assert_eq(arena_tensor_count(a), 126);
	size_t i;
	cr_assert_eq(arena_tensor_find(a, "transformer_blocks.1.attn.to_q.weight", &i), 0);
	arena_tensor_info t;
	cr_assert_eq(arena_tensor_get(a, i, &t), 0);
	cr_assert_str_eq(t.name, "transformer_blocks.1.attn.to_q.weight");
	cr_assert_str_eq(t.dtype, "BF16");
	cr_assert_eq(t.rank, 2);
	cr_assert_eq(t.shape[0], 32);
	cr_assert_str_eq(t.scheme, "none");
	cr_assert_eq(t.n_components, 1);
	cr_assert_eq(t.component[0].bytes, 2048);
	cr_assert_eq((uint8_t *)t.component[0].device - (uint8_t *)arena_block_device(a, t.block) >= 0, 1);
	cr_assert_eq(arena_tensor_find(a, "nope", &i), ARENA_E_NOT_FOUND);
	cr_assert_eq(arena_tensor_get(a, 999, &t), ARENA_E_USAGE);
	arena_close(a);
	arena_close(NULL);
}

Test(api, open_quantized_and_errors)
{
	arena_open_options o = {.backend = "sim", .vram_cap = 64 << 20, .quant = "fp8-e4m3-row"};
	arena *a = (arena *)1;
	cr_assert_eq(arena_open(fixture_path("tiny_flux.safetensors"), &o, &a), 0, "%s", arena_last_error());
	size_t i;
	arena_tensor_info t;
	cr_assert_eq(arena_tensor_find(a, "single_transformer_blocks.0.proj_out.weight", &i), 0);
	cr_assert_eq(arena_tensor_get(a, i, &t), 0);
	cr_assert_str_eq(t.scheme, "fp8-e4m3-row");
	cr_assert_eq(t.n_components, 2);
	cr_assert_str_eq(t.component[0].dtype, "F8_E4M3");
	cr_assert_str_eq(t.component[1].name, "scale");
	arena_close(a);

	arena_open_options small = {.backend = "sim", .vram_cap = 100 << 10};
	a = (arena *)1;
	cr_assert_eq(arena_open(fixture_path("tiny_flux.safetensors"), &small, &a), ARENA_E(BUDGET));
	cr_assert_null(a);
	cr_assert(strstr(arena_last_error(), "does not fit") && strstr(arena_last_error(), "it needs"), "%s", arena_last_error());
	cr_assert_eq(arena_open("/nonexistent.arena", &o, &a), ARENA_E_NOT_FOUND);
	arena_open_options bad = {.backend = "tpu"};
	cr_assert_neq(arena_open(fixture_path("tiny_flux.safetensors"), &bad, &a), 0);
	cr_assert_null(a);
}

Test(api, allocation_failures)
{
	arena_open_options o = {.backend = "sim", .vram_cap = 64 << 20};
	long n;
	for (n = 1; n < 100000; n += 7) {
		arena *a = NULL;
		arena_fault_alloc(n);
		int rc = arena_open(fixture_path("tiny_flux.safetensors"), &o, &a);
		int fired = arena_fault_alloc_fired();
		arena_fault_alloc(0);
		arena_close(a);
		if (!fired) {
			cr_assert_eq(rc, 0, "%s", arena_last_error());
			break;
		}
		cr_assert(rc == ARENA_E_NOMEM || rc == 0, "n=%ld: %s: %s", n, arena_err_name(rc), arena_last_error());
	}
	cr_assert_gt(n, 50);
}

/* A streamed run: open on a device smaller than the model, steps in sample
 * and train, a mode switch; returns the first error (0: all done). */
static int streamed_run(arena **keep)
{
	arena_open_options o = {.backend = "sim",
				.sim_capacity = 295 << 10,
				.headroom = ARENA_ZERO_BYTES,
				.reserve = ARENA_ZERO_BYTES,
				.keep_last = ARENA_ZERO_COUNT};
	arena *a = NULL;
	int rc = arena_open(fixture_path("tiny_flux.safetensors"), &o, &a);
	*keep = a;
	if (rc)
		return rc;
	size_t n = arena_block_count(a);
	for (int s = 0; s < 6 && !rc; s++) {
		if (s == 3 && (rc = arena_set_mode(a, ARENA_MODE_TRAIN)))
			break;
		if ((rc = arena_step_begin(a)))
			break;
		for (int pass = 0; pass < (s == 1 ? 2 : 1) && !rc; pass++) /* step 1: two passes (learned) */
			for (size_t b = 0; b < n && !rc; b++) {
				void *d;
				size_t bb = s >= 3 && pass ? n - 1 - b : b;
				if (!(rc = arena_block_acquire(a, bb, NULL, &d)))
					rc = arena_block_release(a, bb, NULL);
			}
		int e = arena_step_end(a);
		rc = rc ? rc : e;
	}
	return rc;
}

Test(api, streamed_run_under_allocation_failures)
{
	arena *a;
	long live = arena_alloc_live();
	cr_assert_eq(streamed_run(&a), 0, "%s", arena_last_error());
	arena_plan_info p;
	cr_assert_eq(arena_plan_get(a, &p), 0);
	cr_assert_gt(p.n_streamed, 0, "the device is smaller than the model");
	arena_close(a);
	cr_assert_eq(arena_alloc_live(), live, "a clean run leaks nothing");
	long n;
	int fired = 1;
	for (n = 1; fired && n < 20000; n++) {
		arena_fault_alloc(n);
		int rc = streamed_run(&a);
		fired = arena_fault_alloc_fired();
		arena_fault_alloc(0);
		if (fired)
			cr_assert(rc == ARENA_E_NOMEM || rc == 0, "n=%ld: %s: %s", n, arena_err_name(rc), arena_last_error());
		else
			cr_assert_eq(rc, 0, "n=%ld: %s", n, arena_last_error());
		arena_close(a);
		cr_assert_eq(arena_alloc_live(), live, "n=%ld: %ld allocations leaked", n, arena_alloc_live() - live);
	}
	cr_assert(!fired, "every allocation point was reached");
	cr_assert_gt(n, 50);
}

/* dlpack.h's DLManagedTensor, as a consumer sees it. */
typedef struct test_dl {
	void *data;
	int32_t device_type, device_id;
	int32_t ndim;
	uint8_t code, bits;
	uint16_t lanes;
	int64_t *shape, *strides;
	uint64_t byte_offset;
	void *manager_ctx;
	void (*deleter)(struct test_dl *);
} test_dl;

Test(api, dlpack_tensors_hold_a_reference_and_free_themselves)
{
	arena_open_options o = {.backend = "sim", .vram_cap = 64 << 20};
	arena *a;
	cr_assert_eq(arena_open(fixture_path("tiny_flux.safetensors"), &o, &a), 0, "%s", arena_last_error());
	size_t i;
	arena_tensor_info t;
	cr_assert_eq(arena_tensor_find(a, "x_embedder.weight", &i), 0);
	cr_assert_eq(arena_tensor_get(a, i, &t), 0);
	void *p = (void *)1;
	cr_assert_eq(arena_dlpack(a, t.component[0].device, t.component[0].bytes, 1, 0, &p), 0, "%s", arena_last_error());
	test_dl *m = p;
	cr_assert_eq(m->data, t.component[0].device);
	cr_assert_eq(m->device_type, 1);
	cr_assert_eq(m->ndim, 1);
	cr_assert_eq(m->shape[0], (int64_t)t.component[0].bytes);
	cr_assert_null(m->strides);
	cr_assert_eq(m->byte_offset, 0);
	cr_assert(m->code == 1 && m->bits == 8 && m->lanes == 1, "uint8");
	cr_assert_not_null(m->deleter);
	/* The tensor outlives the opener's close: the memory stays, the handle lives. */
	arena_close(a);
	cr_assert_eq(arena_retain(a), 0, "a DLPack tensor keeps its arena");
	arena_release(a);
	cr_assert_eq(((uint8_t *)m->data)[0], ((uint8_t *)t.component[0].device)[0]);
	m->deleter(m); /* the last reference: the arena goes */
	cr_assert_eq(arena_retain(a), ARENA_E_USAGE, "the last tensor gone, the arena is freed");
}

Test(api, dlpack_refuses_bad_input_and_survives_allocation_failures)
{
	arena_open_options o = {.backend = "sim", .vram_cap = 64 << 20};
	arena *a;
	cr_assert_eq(arena_open(fixture_path("tiny_flux.safetensors"), &o, &a), 0, "%s", arena_last_error());
	void *d = arena_block_device(a, 1), *p = (void *)1;
	cr_assert_eq(arena_dlpack(a, d, 16, 1, 0, NULL), ARENA_E_USAGE);
	cr_assert_eq(arena_dlpack(a, d, 16, 4, 0, &p), ARENA_E_USAGE);
	cr_assert_null(p);
	cr_assert(strstr(arena_last_error(), "device type 4"), "%s", arena_last_error());
	cr_assert_eq(arena_dlpack(a, NULL, 16, 1, 0, &p), ARENA_E_USAGE);
	cr_assert_eq(arena_dlpack(a, d, (uint64_t)INT64_MAX + 1, 1, 0, &p), ARENA_E_USAGE);
	cr_assert_eq(arena_dlpack((arena *)&o, d, 16, 1, 0, &p), ARENA_E_USAGE, "not an arena");
	cr_assert_null(p);
	arena_fault_alloc(1);
	int rc = arena_dlpack(a, d, 16, 2, 0, &p);
	arena_fault_alloc(0);
	cr_assert_eq(rc, ARENA_E_NOMEM);
	cr_assert_null(p);
	arena_close(a); /* no reference was left behind: the arena goes */
	cr_assert_eq(arena_retain(a), ARENA_E_USAGE);
}

/* An independent decoder for the test: the formats' definitions with ldexpf. */
static float ref_fp8(uint8_t b, int e5m2)
{
	const int mb = e5m2 ? 2 : 3, bias = e5m2 ? 15 : 7;
	const int e = (b & 0x7F) >> mb, m = b & ((1 << mb) - 1);
	const float s = b & 0x80 ? -1.0f : 1.0f;
	if (e5m2 && e == 31)
		return m ? NAN : s * INFINITY;
	if (!e5m2 && (b & 0x7F) == 0x7F)
		return NAN;
	if (!e)
		return s * ldexpf((float)m, 1 - bias - mb);
	return s * ldexpf(1.0f + (float)m / (float)(1 << mb), e - bias);
}

static uint16_t ref_bf16(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	if (isnan(f))
		return 0x7FC0;
	uint32_t lsb = (u >> 16) & 1, rest = u & 0xFFFF;
	uint32_t hi = u >> 16;
	if (rest > 0x8000 || (rest == 0x8000 && lsb))
		hi++;
	return (uint16_t)hi;
}

Test(api, dequantize_every_scheme_on_sim)
{
	const char *schemes[] = {"fp8-e4m3-row", "fp8-e4m3-tensor", "fp8-e4m3", "fp8-e5m2", "int8-row", "bf16"};
	for (size_t k = 0; k < sizeof(schemes) / sizeof(*schemes); k++) {
		arena_open_options o = {.backend = "sim", .vram_cap = 64 << 20, .quant = schemes[k]};
		arena *a;
		cr_assert_eq(arena_open(fixture_path("tiny_flux.safetensors"), &o, &a), 0, "%s", arena_last_error());
		size_t n_quant = 0;
		for (size_t i = 0; i < arena_tensor_count(a); i++) {
			arena_tensor_info t;
			cr_assert_eq(arena_tensor_get(a, i, &t), 0);
			uint16_t out[8192];
			if (!strcmp(t.scheme, "none")) {
				cr_assert_eq(arena_tensor_dequantize(a, i, arena_block_device(a, t.block), out, NULL), ARENA_E_USAGE);
				cr_assert(strstr(arena_last_error(), "is stored none: view its bytes instead"), "%s", arena_last_error());
				continue;
			}
			n_quant++;
			cr_assert_str_eq(t.scheme, schemes[k]);
			cr_assert_str_eq(t.dtype, "BF16");
			uint64_t n = 1;
			for (uint32_t d = 0; d < t.rank; d++)
				n *= t.shape[d];
			cr_assert_leq(n, 8192);
			cr_assert_eq(arena_tensor_dequantize(a, i, arena_block_device(a, t.block), out, NULL), 0, "%s",
				     arena_last_error());
			const uint8_t *q = t.component[0].host ? t.component[0].host : t.component[0].device;
			const float *sc = t.n_components > 1 ? (const float *)(t.component[1].host ? t.component[1].host
												 : t.component[1].device)
							     : NULL;
			const uint64_t scale_n = t.n_components > 1 ? t.component[1].bytes / 4 : 0;
			for (uint64_t e = 0; e < n; e++) {
				float v;
				if (!strcmp(t.component[0].dtype, "I8"))
					v = (float)(int8_t)q[e];
				else if (!strcmp(t.component[0].dtype, "BF16")) {
					uint32_t u = (uint32_t)((const uint16_t *)(const void *)q)[e] << 16;
					memcpy(&v, &u, 4);
				} else
					v = ref_fp8(q[e], !strcmp(t.component[0].dtype, "F8_E5M2"));
				if (scale_n)
					v *= sc[scale_n == 1 ? 0 : e / (n / scale_n)];
				cr_assert_eq(out[e], ref_bf16(v), "%s %s element %llu: %04x, want %04x", schemes[k], t.name,
					     (unsigned long long)e, out[e], ref_bf16(v));
			}
		}
		cr_assert_gt(n_quant, 40, "%s", schemes[k]);
		/* refusals */
		uint16_t out[16];
		size_t i;
		cr_assert_eq(arena_tensor_find(a, "single_transformer_blocks.0.proj_out.weight", &i), 0);
		arena_tensor_info t;
		cr_assert_eq(arena_tensor_get(a, i, &t), 0);
		void *blk = arena_block_device(a, t.block);
		cr_assert_eq(arena_tensor_dequantize(a, 100000, blk, out, NULL), ARENA_E_USAGE);
		cr_assert(strstr(arena_last_error(), "out of range"), "%s", arena_last_error());
		cr_assert_eq(arena_tensor_dequantize(a, i, NULL, out, NULL), ARENA_E_USAGE);
		cr_assert(strstr(arena_last_error(), "NULL block"), "%s", arena_last_error());
		cr_assert_eq(arena_tensor_dequantize(a, i, blk, NULL, NULL), ARENA_E_USAGE);
		cr_assert(strstr(arena_last_error(), "NULL dst"), "%s", arena_last_error());
		cr_assert_eq(arena_tensor_dequantize(a, i, blk, out, (void *)8), ARENA_E_USAGE);
		cr_assert(strstr(arena_last_error(), "the simulator has none"), "%s", arena_last_error());
		static uint8_t not_device[64];
		cr_assert_eq(arena_tensor_dequantize(a, i, not_device, out, NULL), ARENA_E_USAGE);
		cr_assert(strstr(arena_last_error(), "not the address of block"), "%s", arena_last_error());
		arena_close(a);
	}
}

#include "../../formats/dequant.h"

/* Every fp8 byte, both formats, against the formats' definitions (ldexpf). */
Test(api, dequantize_decodes_every_fp8_byte)
{
	for (unsigned b = 0; b < 256; b++) {
		for (int e5m2 = 0; e5m2 < 2; e5m2++) {
			const float want = ref_fp8((uint8_t)b, e5m2);
			const float got = e5m2 ? arena__e5m2_to_f32(b) : arena__e4m3_to_f32(b);
			if (isnan(want))
				cr_assert(isnan(got), "%s %02x: %g, want NaN", e5m2 ? "e5m2" : "e4m3", b, got);
			else
				cr_assert(memcmp(&got, &want, 4) == 0, "%s %02x: %a, want %a", e5m2 ? "e5m2" : "e4m3", b, got,
					  want);
		}
	}
	/* rounding to bf16 and f16 (ties to even, overflow, NaN) */
	cr_assert_eq(arena__f32_to_bf16(1.00390625f), 0x3F80);  /* 1 + 2^-8: a tie, to even */
	cr_assert_eq(arena__f32_to_bf16(1.01171875f), 0x3F82);  /* 1 + 3 x 2^-8: a tie, to even (up) */
	cr_assert_eq(arena__f32_to_bf16(NAN), 0x7FC0);
	cr_assert_eq(arena__f32_to_f16(65520.0f), 0x7C00);      /* past the largest f16: infinity */
	cr_assert_eq(arena__f32_to_f16(1.0f + 0x1p-11f), 0x3C00); /* a tie, to even */
	cr_assert_eq(arena__f32_to_f16(0x1p-25f), 0x0000);      /* half the smallest subnormal: a tie, to 0 */
	cr_assert_eq(arena__f32_to_f16(0x1.8p-25f), 0x0001);
	cr_assert_eq(arena__f32_to_f16(-NAN) & 0x7E00, 0x7E00);
}

/* arena_fp8_quantize_rows on sim: the scale is amax / 448 (a row of zeros:
 * the 1e-12 floor), each code decodes to x / scale within half an e4m3 step
 * (subnormal codes: within half the smallest, 2^-10); no rows does nothing;
 * refusals name what is wrong. */
Test(api, fp8_quantize_rows_on_sim)
{
	arena_open_options o = {.backend = "sim", .vram_cap = 64 << 20};
	arena *a;
	cr_assert_eq(arena_open(fixture_path("tiny_flux.safetensors"), &o, &a), 0, "%s", arena_last_error());
	enum { R = 3, C = 9 };
	const float vals[R][C] = {{1.0f, -2.0f, 0.5f, 448.0f, -3.0f, 0.001f, 7.0f, -0.25f, 100.0f},
				  {0},
				  {1e-30f, -2e-30f, 3e-30f, 0, 0, 0, 0, 0, -1e-30f}};
	uint16_t x[R][C];
	for (int r = 0; r < R; r++)
		for (int c = 0; c < C; c++) {
			uint32_t u;
			memcpy(&u, &vals[r][c], 4);
			x[r][c] = (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16); /* to bf16, nearest even */
		}
	uint8_t q[R][C];
	float s[R];
	cr_assert_eq(arena_fp8_quantize_rows(a, x, R, C, q, s, NULL), 0, "%s", arena_last_error());
	for (int r = 0; r < R; r++) {
		float amax = 0;
		for (int c = 0; c < C; c++) {
			uint32_t u = (uint32_t)x[r][c] << 16;
			float v;
			memcpy(&v, &u, 4);
			amax = fabsf(v) > amax ? fabsf(v) : amax;
		}
		const float want = amax / 448.0f < 1e-12f ? 1e-12f : amax / 448.0f;
		cr_assert_eq(s[r], want, "row %d: scale %g, want %g", r, (double)s[r], (double)want);
		for (int c = 0; c < C; c++) {
			uint32_t u = (uint32_t)x[r][c] << 16;
			float v;
			memcpy(&v, &u, 4);
			const float d = ref_fp8(q[r][c], 0), t = v / s[r];
			cr_assert(fabsf(d - t) <= fabsf(t) / 16 + 0x1p-10f, "row %d col %d: code %02x is %g, want %g", r, c,
				  q[r][c], (double)d, (double)t);
		}
	}
	cr_assert_eq(ref_fp8(q[0][3], 0), 448.0f, "the row's largest is the format's largest");
	cr_assert_eq(arena_fp8_quantize_rows(a, NULL, 0, 8, NULL, NULL, NULL), 0, "no rows: nothing to do");
	cr_assert_eq(arena_fp8_quantize_rows(a, NULL, R, C, q, s, NULL), ARENA_E_USAGE);
	cr_assert(strstr(arena_last_error(), "NULL x"), "%s", arena_last_error());
	cr_assert_eq(arena_fp8_quantize_rows(a, x, R, C, q, NULL, NULL), ARENA_E_USAGE);
	cr_assert(strstr(arena_last_error(), "NULL scale"), "%s", arena_last_error());
	cr_assert_eq(arena_fp8_quantize_rows(a, x, 1ull << 31, C, q, s, NULL), ARENA_E_USAGE);
	cr_assert(strstr(arena_last_error(), "too many"), "%s", arena_last_error());
	cr_assert_eq(arena_fp8_quantize_rows(a, x, R, C, q, s, (void *)8), ARENA_E_USAGE);
	cr_assert(strstr(arena_last_error(), "the simulator has none"), "%s", arena_last_error());
	arena_close(a);
}

/* arena_fp8_quantize_rows_scaled on sim: each element times its column's
 * scale in f32, then the row rule: the scale is amax(|x * cs|) / 448 and each
 * code decodes to x * cs / scale within half an e4m3 step; scales of 1 give
 * the unscaled call's bytes; a NULL col_scale is refused. */
Test(api, fp8_quantize_rows_scaled_on_sim)
{
	arena_open_options o = {.backend = "sim", .vram_cap = 64 << 20};
	arena *a;
	cr_assert_eq(arena_open(fixture_path("tiny_flux.safetensors"), &o, &a), 0, "%s", arena_last_error());
	enum { R = 2, C = 6 };
	const uint16_t x[R][C] = {{0x3F80, 0xC000, 0x3F00, 0x43E0, 0xC040, 0x3A83}, /* 1 -2 .5 448 -3 .001 */
				  {0x4120, 0x0000, 0xBF80, 0x4000, 0x3E80, 0xC2C8}}; /* 10 0 -1 2 .25 -100 */
	const float cs[C] = {3.0f, 0.001f, 1.0f, 0.0f, 7.5f, 1e6f}, ones[C] = {1, 1, 1, 1, 1, 1};
	uint8_t q[R][C], q1[R][C];
	float s[R], s1[R];
	cr_assert_eq(arena_fp8_quantize_rows_scaled(a, x, R, C, cs, q, s, NULL), 0, "%s", arena_last_error());
	for (int r = 0; r < R; r++) {
		float v[C], amax = 0;
		for (int c = 0; c < C; c++) {
			uint32_t u = (uint32_t)x[r][c] << 16;
			memcpy(&v[c], &u, 4);
			v[c] *= cs[c];
			amax = fabsf(v[c]) > amax ? fabsf(v[c]) : amax;
		}
		const float want = amax / 448.0f < 1e-12f ? 1e-12f : amax / 448.0f;
		cr_assert_eq(s[r], want, "row %d: scale %g, want %g", r, (double)s[r], (double)want);
		for (int c = 0; c < C; c++) {
			const float d = ref_fp8(q[r][c], 0), t = v[c] / s[r];
			cr_assert(fabsf(d - t) <= fabsf(t) / 16 + 0x1p-10f, "row %d col %d: code %02x is %g, want %g", r, c,
				  q[r][c], (double)d, (double)t);
		}
	}
	cr_assert_eq(arena_fp8_quantize_rows_scaled(a, x, R, C, ones, q, s, NULL), 0, "%s", arena_last_error());
	cr_assert_eq(arena_fp8_quantize_rows(a, x, R, C, q1, s1, NULL), 0, "%s", arena_last_error());
	cr_assert(!memcmp(q, q1, sizeof(q)) && !memcmp(s, s1, sizeof(s)), "scales of 1: the unscaled bytes");
	cr_assert_eq(arena_fp8_quantize_rows_scaled(a, x, R, C, NULL, q, s, NULL), ARENA_E_USAGE);
	cr_assert(strstr(arena_last_error(), "arena_fp8_quantize_rows_scaled: NULL col_scale"), "%s",
		  arena_last_error());
	cr_assert_eq(arena_fp8_quantize_rows_scaled(a, NULL, 0, C, NULL, NULL, NULL, NULL), 0, "no rows");
	arena_close(a);
}

/* arena_fp8_transpose on sim: every shape's bytes land at t[c][r] (shapes of
 * one row, one column, odd sides, multiples of 16); no rows or columns does
 * nothing; refusals name what is wrong, overlapping memory among them. */
Test(api, fp8_transpose_on_sim)
{
	arena_open_options o = {.backend = "sim", .vram_cap = 64 << 20};
	arena *a;
	cr_assert_eq(arena_open(fixture_path("tiny_flux.safetensors"), &o, &a), 0, "%s", arena_last_error());
	static const uint64_t shapes[][2] = {{1, 1}, {1, 7}, {7, 1}, {3, 5}, {16, 32}, {130, 17}, {33, 160}};
	for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
		const uint64_t R = shapes[i][0], C = shapes[i][1];
		uint8_t *x = malloc(R * C), *t = malloc(R * C);
		cr_assert(x && t);
		for (uint64_t k = 0; k < R * C; k++)
			x[k] = (uint8_t)(k * 131 + k / 7);
		memset(t, 0xA5, R * C);
		cr_assert_eq(arena_fp8_transpose(a, x, R, C, t, NULL), 0, "%s", arena_last_error());
		for (uint64_t r = 0; r < R; r++)
			for (uint64_t c = 0; c < C; c++)
				cr_assert_eq(t[c * R + r], x[r * C + c], "%llu x %llu: [%llu][%llu]", (unsigned long long)R,
					     (unsigned long long)C, (unsigned long long)r, (unsigned long long)c);
		free(x);
		free(t);
	}
	uint8_t m[64];
	cr_assert_eq(arena_fp8_transpose(a, NULL, 0, 8, NULL, NULL), 0, "no rows: nothing to do");
	cr_assert_eq(arena_fp8_transpose(a, NULL, 8, 0, NULL, NULL), 0, "no columns: nothing to do");
	cr_assert_eq(arena_fp8_transpose(a, NULL, 4, 4, m, NULL), ARENA_E_USAGE);
	cr_assert(strstr(arena_last_error(), "NULL x"), "%s", arena_last_error());
	cr_assert_eq(arena_fp8_transpose(a, m, 4, 4, NULL, NULL), ARENA_E_USAGE);
	cr_assert(strstr(arena_last_error(), "NULL t"), "%s", arena_last_error());
	cr_assert_eq(arena_fp8_transpose(a, m, 4, 4, m + 15, NULL), ARENA_E_USAGE);
	cr_assert(strstr(arena_last_error(), "overlap"), "%s", arena_last_error());
	cr_assert_eq(arena_fp8_transpose(a, m, 4, 4, m + 16, NULL), 0, "adjacent is not overlapping: %s",
		     arena_last_error());
	cr_assert_eq(arena_fp8_transpose(a, m, 1ull << 31, 1, m + 32, NULL), ARENA_E_USAGE);
	cr_assert(strstr(arena_last_error(), "too many"), "%s", arena_last_error());
	cr_assert_eq(arena_fp8_transpose(a, m, 4, 4, m + 16, (void *)8), ARENA_E_USAGE);
	cr_assert(strstr(arena_last_error(), "the simulator has none"), "%s", arena_last_error());
	arena_close(a);
}
