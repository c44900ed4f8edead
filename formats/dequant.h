/* dequant.h - a quantized tensor's values in a wider dtype (docs/QUANT.md):
 * dst[i] = src[i] x scale[r] in f32, rounded once to dst's dtype, where r is
 * i's row for a row scale, 0 for a tensor scale, and there is no product
 * without a scale. The element rules are formats/elem.h's, inline for the
 * CPU (the sim backend) and the GPU (dequant_cuda.cu) alike, so both give the
 * same bits: those of torch's (qdata.float() * scale).to(dtype), except that
 * a NaN becomes 0x7FC0 in BF16 (c10's CPU rule; its CUDA one gives 0x7FFF).
 *
 * Sources: F8_E4M3 (fn), F8_E5M2, I8 and BF16 (the bf16 scheme: a wider
 * original); destinations: BF16, F16, F32. */
#ifndef ARENA_DEQUANT_H
#define ARENA_DEQUANT_H

#include <stdint.h>

#include "dtype.h"
#include "elem.h"

#define ARENA_DQ ARENA_ELEM

/* One tensor's dequantization (backend.h's dequant op). */
typedef struct arena_dequant_job {
	void *dst;          /* n elements of dst_dtype, contiguous */
	const void *src;    /* n elements of src_dtype */
	const float *scale; /* scale_n f32 values (0: NULL) */
	uint64_t n;         /* elements */
	uint64_t cols;      /* elements per row: a row scale's value r covers [r * cols, (r + 1) * cols) */
	uint64_t scale_n;   /* 0 (no scale), 1 (one for the tensor) or n / cols (one per row) */
	int src_dtype;      /* arena_dtype (formats/dtype.h) */
	int dst_dtype;
} arena_dequant_job;

/* The names tests/unit/test_api.c checks the element rules under. */
#define arena__dq_e4m3 arena__e4m3_to_f32
#define arena__dq_e5m2 arena__e5m2_to_f32
#define arena__dq_to_bf16 arena__f32_to_bf16
#define arena__dq_to_f16 arena__f32_to_f16

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

/* Element i of job j, as the job says (host or device). */
ARENA_DQ void arena__dq_one(const arena_dequant_job *j, uint64_t i)
{
	float v = arena__dq_load(j->src, j->src_dtype, i);
	if (j->scale_n)
		v = ARENA__MUL(v, j->scale[j->scale_n == 1 ? 0 : i / j->cols]);
	arena__dq_store(j->dst, j->dst_dtype, i, v);
}

#endif
