/* dequant.h - a quantized tensor's values in a wider dtype (docs/QUANT.md):
 * dst[i] = src[i] x scale[r] in f32, rounded once to dst's dtype, where r is
 * i's row for a row scale, 0 for a tensor scale, and there is no product
 * without a scale. The element conversions are inline here, for the CPU
 * (the sim backend) and the GPU (dequant_cuda.cu) alike, so both give the
 * same bits: those of torch's (qdata.float() * scale).to(dtype), except that
 * a NaN becomes 0x7FC0 in BF16 (c10's CPU rule; its CUDA one gives 0x7FFF).
 *
 * Sources: F8_E4M3 (fn), F8_E5M2, I8 and BF16 (the bf16 scheme: a wider
 * original); destinations: BF16, F16, F32. */
#ifndef ARENA_DEQUANT_H
#define ARENA_DEQUANT_H

#include <stdint.h>
#include <string.h>

#include "dtype.h"

#ifdef __CUDACC__
#define ARENA_DQ static __host__ __device__ __forceinline__
#else
#define ARENA_DQ static inline
#endif

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

ARENA_DQ float arena__dq_f32(uint32_t u)
{
	float f;
	memcpy(&f, &u, sizeof(f));
	return f;
}

ARENA_DQ uint32_t arena__dq_bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, sizeof(u));
	return u;
}

/* F8_E4M3 (fn: no infinities; S.1111.111 is NaN) -> F32, exact: its
 * exponent and mantissa bits placed at the top of an f32's are the value
 * times 2^-120 (subnormals included: they become f32 subnormals), so one
 * multiply by a power of two, and a select for NaN. */
ARENA_DQ float arena__dq_e4m3(uint32_t b)
{
	const float v = arena__dq_f32((b & 0x7Fu) << 20) * 0x1p120f;
	const uint32_t u = (b & 0x7Fu) == 0x7Fu ? 0x7FC00000u : arena__dq_bits(v);
	return arena__dq_f32((b & 0x80u) << 24 | u);
}

/* F8_E5M2 -> F32, exact, the same way (times 2^-112); S.11111.00 is
 * infinity, S.11111.xx NaN. */
ARENA_DQ float arena__dq_e5m2(uint32_t b)
{
	const float v = arena__dq_f32((b & 0x7Fu) << 21) * 0x1p112f;
	const uint32_t u = (b & 0x7Cu) == 0x7Cu ? ((b & 3u) ? 0x7FC00000u : 0x7F800000u) : arena__dq_bits(v);
	return arena__dq_f32((b & 0x80u) << 24 | u);
}

/* F32 -> BF16, round to nearest even; NaN -> 0x7FC0. */
ARENA_DQ uint16_t arena__dq_to_bf16(float f)
{
	const uint32_t u = arena__dq_bits(f);
	if ((u & 0x7FFFFFFFu) > 0x7F800000u)
		return 0x7FC0u;
	return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* F32 -> F16, round to nearest even, overflow to infinity, NaN -> sign | 0x7E00
 * (c10's fp16_ieee_from_fp32_value). */
ARENA_DQ uint16_t arena__dq_to_f16(float f)
{
	const uint32_t w = arena__dq_bits(f);
	const uint32_t sign = w & 0x80000000u;
	const uint32_t aw = w & 0x7FFFFFFFu;
	if (aw > 0x7F800000u)
		return (uint16_t)(sign >> 16 | 0x7E00u);
	float base = (arena__dq_f32(aw) * 0x1.0p+112f) * 0x1.0p-110f;
	uint32_t bias = (w << 1) & 0xFF000000u;
	if (bias < 0x71000000u)
		bias = 0x71000000u;
	base = arena__dq_f32((bias >> 1) + 0x07800000u) + base;
	const uint32_t bits = arena__dq_bits(base);
	return (uint16_t)(sign >> 16 | (((bits >> 13) & 0x00007C00u) + (bits & 0x00000FFFu)));
}

/* Source element i as f32 (exact). */
ARENA_DQ float arena__dq_load(const void *src, int dt, uint64_t i)
{
	switch (dt) {
	case ARENA_DTYPE_F8_E4M3:
		return arena__dq_e4m3(((const uint8_t *)src)[i]);
	case ARENA_DTYPE_F8_E5M2:
		return arena__dq_e5m2(((const uint8_t *)src)[i]);
	case ARENA_DTYPE_I8:
		return (float)((const int8_t *)src)[i];
	default: /* BF16 */
		return arena__dq_f32((uint32_t)((const uint16_t *)src)[i] << 16);
	}
}

/* Store f32 v as element i of dst (rounded once). */
ARENA_DQ void arena__dq_store(void *dst, int dt, uint64_t i, float v)
{
	switch (dt) {
	case ARENA_DTYPE_BF16:
		((uint16_t *)dst)[i] = arena__dq_to_bf16(v);
		break;
	case ARENA_DTYPE_F16:
		((uint16_t *)dst)[i] = arena__dq_to_f16(v);
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
		v = v * j->scale[j->scale_n == 1 ? 0 : i / j->cols];
	arena__dq_store(j->dst, j->dst_dtype, i, v);
}

#endif
