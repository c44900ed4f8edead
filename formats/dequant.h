/* dequant.h - a quantized tensor's values in a wider dtype (docs/QUANT.md):
 * dst[i] = src[i] x scale[r] in f32, rounded once to dst's dtype, where r is
 * i's row for a row scale, 0 for a tensor scale, and there is no product
 * without a scale; for int4, dst[i] = (q - z) x scale of i's group. The
 * element rules are formats/elem.h's, inline for the CPU (the sim backend)
 * and the GPU (dequant_cuda.cu) alike, so both give the same bits: those of
 * torch's (qdata.float() * scale).to(dtype) (int4: ((q - z) * scale)), except
 * that a NaN becomes 0x7FC0 in BF16 (c10's CPU rule; its CUDA one gives
 * 0x7FFF), and that in F16 and F32 a NaN times a scale is the GPU's one
 * canonical NaN where the CPU keeps the operand's sign and payload (torch
 * alike on each).
 *
 * Sources: F8_E4M3 (fn), F8_E5M2, I8, BF16 (the bf16 scheme: a wider
 * original) and int4 codes (U8, two a byte); destinations: BF16, F16, F32.
 * A job is made from a tensor by formats/scheme.h's arena_quant_dequant_job. */
#ifndef ARENA_DEQUANT_H
#define ARENA_DEQUANT_H

#include <stdint.h>

#include "dtype.h"
#include "elem.h"

#define ARENA_DQ ARENA_ELEM

/* One tensor's dequantization (backend.h's dequant op). */
typedef struct arena_dequant_job {
	void *dst;           /* n elements of dst_dtype, contiguous */
	const void *src;     /* n elements of src_dtype; int4 (group > 0): rows of
			      * ceil(cols / 2) bytes, two codes a byte, the low nibble first */
	const void *scale;   /* scale_n values of scale_dtype (0: NULL) */
	const uint8_t *zero; /* int4: scale_n zero points, one a group */
	uint64_t n;          /* elements */
	uint64_t cols;       /* elements per row: a row scale's value r covers [r * cols, (r + 1) * cols) */
	uint64_t scale_n;    /* 0 (no scale), 1 (one for the tensor), n / cols (one per row) or, for
			      * int4, rows x ceil(cols / group) (one per group, row by row) */
	uint64_t group;      /* int4: elements per group along a row; 0 for the other schemes */
	int src_dtype;       /* arena_dtype (formats/dtype.h); U8 for int4 */
	int dst_dtype;
	int scale_dtype;     /* F32; int4: the original dtype (BF16, F16, F32) */
} arena_dequant_job;

/* Bytes of the job's codes, and of its scale (its zero points: scale_n). */
ARENA_ELEM uint64_t arena__dq_src_bytes(const arena_dequant_job *j)
{
	if (j->group)
		return j->cols ? j->n / j->cols * (j->cols / 2 + j->cols % 2) : 0;
	return j->n * (j->src_dtype == ARENA_DTYPE_BF16 ? 2 : 1);
}

ARENA_ELEM uint64_t arena__dq_scale_bytes(const arena_dequant_job *j)
{
	return j->scale_n * (j->scale_dtype == ARENA_DTYPE_BF16 || j->scale_dtype == ARENA_DTYPE_F16 ? 2 : 4);
}

/* Source element i as f32 (exact). */
ARENA_DQ float arena__dq_load(const void *src, int dt, uint64_t i)
{
	switch (dt) {
	case ARENA_DTYPE_F8_E4M3:
		return arena__e4m3_to_f32(((const uint8_t *)src)[i]);
	case ARENA_DTYPE_F8_E5M2:
		return arena__e5m2_to_f32(((const uint8_t *)src)[i]);
	case ARENA_DTYPE_I8:
		return (float)((const int8_t *)src)[i];
	default: /* BF16 */
		return arena__bf16_to_f32(((const uint16_t *)src)[i]);
	}
}

/* Store f32 v as element i of dst (rounded once). */
ARENA_DQ void arena__dq_store(void *dst, int dt, uint64_t i, float v)
{
	switch (dt) {
	case ARENA_DTYPE_BF16:
		((uint16_t *)dst)[i] = (uint16_t)arena__f32_to_bf16(v);
		break;
	case ARENA_DTYPE_F16:
		((uint16_t *)dst)[i] = (uint16_t)arena__f32_to_f16(v);
		break;
	default: /* F32 */
		((float *)dst)[i] = v;
		break;
	}
}

/* Scale k of job j as f32 (exact). */
ARENA_DQ float arena__dq_scale(const arena_dequant_job *j, uint64_t k)
{
	switch (j->scale_dtype) {
	case ARENA_DTYPE_BF16:
		return arena__bf16_to_f32(((const uint16_t *)j->scale)[k]);
	case ARENA_DTYPE_F16:
		return arena__f16_to_f32(((const uint16_t *)j->scale)[k]);
	default: /* F32 */
		return ((const float *)j->scale)[k];
	}
}

/* Element i of job j, as the job says (host or device). */
ARENA_DQ void arena__dq_one(const arena_dequant_job *j, uint64_t i)
{
	float v;
	if (j->group) {
		const uint64_t r = i / j->cols, c = i - r * j->cols;
		const uint32_t b = ((const uint8_t *)j->src)[r * (j->cols / 2 + j->cols % 2) + c / 2];
		const uint64_t k = r * ((j->cols + j->group - 1) / j->group) + c / j->group;
		v = arena__int4_value((c & 1) ? b >> 4 : b & 15u, j->zero[k], arena__dq_scale(j, k));
	} else {
		v = arena__dq_load(j->src, j->src_dtype, i);
		if (j->scale_n)
			v = ARENA__MUL(v, arena__dq_scale(j, j->scale_n == 1 ? 0 : i / j->cols));
	}
	arena__dq_store(j->dst, j->dst_dtype, i, v);
}

#endif
