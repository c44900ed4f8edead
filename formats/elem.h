/* elem.h - the element rules of the storage schemes (docs/QUANT.md): the
 * exact widening of every stored element type to f32, and the roundings
 * from f32 to each of them, bit for bit as torch (c10) computes them. One
 * definition for every user: convert/quant.c's conversion kernels (which gcc
 * vectorizes), the sim backend's dequantization loop and the CUDA kernel
 * (device/dequant_cuda.cu), the last two through formats/dequant.h.
 *
 * Written without branches: every value is computed on every path and
 * chosen with arena__sel, a mask select. A `?:` would let gcc move the float
 * arithmetic of one side into a branch, and it will not if-convert (so not
 * vectorize) a float operation that may trap. Compares are signed compares
 * on values whose sign bit is clear (SSE2 has no unsigned ones).
 *
 * No float operation here makes a subnormal operand of its own (only a
 * subnormal input is one): on x86 a subnormal operand costs a microcode
 * assist, about 16 times the loop's time (an fp8 decode by one multiply by
 * 2^120 of the subnormal f32 its bits make, against the decode below;
 * measured on the 2-core Xeon build machine, 2026-12-03). A subnormal fp8's
 * value is made by subtracting two normal numbers instead (exact: Sterbenz).
 *
 * Plain C11 and C++ (nvcc): functions are host and device functions there. */
#ifndef ARENA_FORMATS_ELEM_H
#define ARENA_FORMATS_ELEM_H

#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define ARENA_ELEM static __host__ __device__ __forceinline__
#elif defined(__GNUC__)
#define ARENA_ELEM static inline __attribute__((always_inline))
#else
#define ARENA_ELEM static inline
#endif

/* Float arithmetic as written: CUDA would fuse a multiply and an add into one
 * fma (one rounding instead of two); the intrinsics forbid it on the device. */
#ifdef __CUDA_ARCH__
#define ARENA__MUL(a, b) __fmul_rn((a), (b))
#define ARENA__ADD(a, b) __fadd_rn((a), (b))
#define ARENA__DIV(a, b) __fdiv_rn((a), (b))
#else
#define ARENA__MUL(a, b) ((a) * (b))
#define ARENA__ADD(a, b) ((a) + (b))
#define ARENA__DIV(a, b) ((a) / (b))
#endif

#define ARENA_F32_INF 0x7F800000u /* |x|'s bits above it: NaN */
#define ARENA_F32_QNAN 0x7FC00000u

/* ---- bit casts --------------------------------------------------------------- */

ARENA_ELEM float arena__f32_of(uint32_t u)
{
	float f;
	memcpy(&f, &u, sizeof(f));
	return f;
}

ARENA_ELEM uint32_t arena__bits_of(float f)
{
	uint32_t u;
	memcpy(&u, &f, sizeof(u));
	return u;
}

/* c ? a : b for c in {0, 1}, as masks. */
ARENA_ELEM uint32_t arena__sel(uint32_t c, uint32_t a, uint32_t b)
{
	const uint32_t m = 0u - c;
	return (a & m) | (b & ~m);
}

/* ---- to f32, exact --------------------------------------------------------------- */

ARENA_ELEM float arena__bf16_to_f32(uint32_t h)
{
	return arena__f32_of(h << 16);
}

/* F16 -> F32 (c10 fp16_ieee_to_fp32_value). */
ARENA_ELEM float arena__f16_to_f32(uint32_t h)
{
	const uint32_t w = h << 16;
	const uint32_t sign = w & 0x80000000u;
	const uint32_t two_w = w + w;
	const float norm = ARENA__MUL(arena__f32_of((two_w >> 4) + (0xE0u << 23)), 0x1.0p-112f);
	const float denorm = ARENA__ADD(arena__f32_of((two_w >> 17) | (126u << 23)), -0.5f);
	return arena__f32_of(sign | arena__sel(two_w < (1u << 27), arena__bits_of(denorm), arena__bits_of(norm)));
}

/* F8_E4M3 (fn: no infinities; S.1111.111 is NaN) -> F32; NaN -> sign |
 * 0x7FC00000. Normal: the exponent and mantissa bits at the top of an f32's,
 * rebiased by adding 120 to the exponent; subnormal (exponent 0): 1.m x 2^-6
 * less 2^-6. */
ARENA_ELEM float arena__e4m3_to_f32(uint32_t b)
{
	const uint32_t a = b & 0x7Fu;
	const uint32_t nrm = (a << 20) + (120u << 23);
	const uint32_t sub = arena__bits_of(ARENA__ADD(arena__f32_of((a << 20) | (121u << 23)), -0x1p-6f));
	uint32_t r = arena__sel(a < 0x08u, sub, nrm);
	r = arena__sel(a == 0x7Fu, ARENA_F32_QNAN, r);
	return arena__f32_of(r | (b & 0x80u) << 24);
}

/* F8_E5M2 -> F32 the same way (exponent + 112; subnormal: 1.m x 2^-14 less
 * 2^-14); S.11111.00 is infinity, S.11111.xx NaN (-> sign | 0x7FC00000). */
ARENA_ELEM float arena__e5m2_to_f32(uint32_t b)
{
	const uint32_t a = b & 0x7Fu;
	const uint32_t nrm = (a << 21) + (112u << 23);
	const uint32_t sub = arena__bits_of(ARENA__ADD(arena__f32_of((a << 21) | (113u << 23)), -0x1p-14f));
	uint32_t r = arena__sel(a < 0x04u, sub, nrm);
	r = arena__sel(a >= 0x7Cu, arena__sel(a != 0x7Cu, ARENA_F32_QNAN, ARENA_F32_INF), r);
	return arena__f32_of(r | (b & 0x80u) << 24);
}

/* ---- from f32, rounded to nearest even ------------------------------------------- */

/* F32 -> BF16 (c10 round_to_nearest_even); NaN -> 0x7FC0. */
ARENA_ELEM uint32_t arena__f32_to_bf16(float f)
{
	const uint32_t u = arena__bits_of(f);
	const uint32_t r = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
	return arena__sel((int32_t)(u & 0x7FFFFFFFu) > (int32_t)ARENA_F32_INF, 0x7FC0u, r);
}

/* F32 -> F16, overflow to infinity, NaN -> sign | 0x7E00 (c10
 * fp16_ieee_from_fp32_value; its two unsigned compares on 2w are made signed
 * compares on |w|). */
ARENA_ELEM uint32_t arena__f32_to_f16(float f)
{
	const uint32_t w = arena__bits_of(f);
	const uint32_t sign = w & 0x80000000u;
	const int32_t aw = (int32_t)(w & 0x7FFFFFFFu);
	float base = ARENA__MUL(ARENA__MUL(arena__f32_of((uint32_t)aw), 0x1.0p+112f), 0x1.0p-110f);
	/* bias = max(exponent, 0x71) << 23, kept in 2w's form: bits 24..31 */
	uint32_t bias = (w << 1) & 0xFF000000u;
	bias = arena__sel((aw & 0x7F800000) < 0x38800000, 0x71000000u, bias);
	base = ARENA__ADD(arena__f32_of((bias >> 1) + 0x07800000u), base);
	const uint32_t bits = arena__bits_of(base);
	const uint32_t nonsign = ((bits >> 13) & 0x00007C00u) + (bits & 0x00000FFFu);
	return (sign >> 16) | arena__sel(aw > (int32_t)ARENA_F32_INF, 0x7E00u, nonsign);
}

/* F32 -> F8_E4M3, saturating: torch's cast(clamp(x, -448, 448)), rounded as
 * c10 fp8e4m3fn_from_fp32_value; |x| > 448 (inf included) gives +-448, NaN
 * gives NaN with its sign. */
ARENA_ELEM uint32_t arena__f32_to_e4m3_sat(float f)
{
	const uint32_t b = arena__bits_of(f);
	const uint32_t sign = b & 0x80000000u;
	const uint32_t a = b ^ sign;
	/* below 2^-6 (subnormal results): the f32 add does the rounding */
	const uint32_t dn = arena__bits_of(ARENA__ADD(arena__f32_of(a), arena__f32_of(141u << 23))) - (141u << 23);
	/* normal: rebias the exponent, add half an ulp minus one plus the odd bit */
	const uint32_t nm = (a + ((uint32_t)(7 - 127) << 23) + 0x7FFFFu + ((a >> 20) & 1u)) >> 20;
	const int32_t sa = (int32_t)a;
	uint32_t r = arena__sel(sa < (int32_t)(121u << 23), dn, nm);
	r = arena__sel(sa > (int32_t)0x43E00000u /* 448 */, 0x7Eu, r);
	r = arena__sel(sa > (int32_t)ARENA_F32_INF, 0x7Fu, r);
	return r | (sign >> 24);
}

/* A row's FP8 e4m3 scale from its largest |x| (NaN if any was): as torch's
 * (amax / 448).clamp(min=1e-12) in f32 (arena.torch._fp8.quantize_rows). */
ARENA_ELEM float arena__e4m3_row_scale(float amax)
{
	const float s = ARENA__DIV(amax, 448.0f);
	return s < 1e-12f ? 1e-12f : s; /* NaN stays NaN */
}

/* |x| folded into a running maximum, NaN sticking (torch's amax). */
ARENA_ELEM float arena__amax_step(float m, float x)
{
	const float a = arena__f32_of(arena__bits_of(x) & 0x7FFFFFFFu);
	return (a > m || a != a) && m == m ? a : m;
}

/* F32 -> F8_E5M2, saturating: torch's cast(clamp(x, -57344, 57344)), rounded
 * as c10 fp8e5m2_from_fp32_value; NaN gives NaN (0x7F) with its sign. */
ARENA_ELEM uint32_t arena__f32_to_e5m2_sat(float f)
{
	const uint32_t b = arena__bits_of(f);
	const uint32_t sign = b & 0x80000000u;
	const uint32_t a = b ^ sign;
	const uint32_t dn = arena__bits_of(ARENA__ADD(arena__f32_of(a), arena__f32_of(134u << 23))) - (134u << 23);
	const uint32_t nm = (a + ((uint32_t)(15 - 127) << 23) + 0xFFFFFu + ((a >> 21) & 1u)) >> 21;
	const int32_t sa = (int32_t)a;
	uint32_t r = arena__sel(sa < (int32_t)(113u << 23), dn, nm);
	r = arena__sel(sa > (int32_t)0x47600000u /* 57344 */, 0x7Bu, r);
	r = arena__sel(sa > (int32_t)ARENA_F32_INF, 0x7Fu, r);
	return r | (sign >> 24);
}

/* F32 -> I8: clamp(round_half_even(v), -127, 127); NaN -> 0. */
ARENA_ELEM uint32_t arena__f32_to_i8_sat(float v)
{
	const uint32_t b = arena__bits_of(v);
	const uint32_t neg = b >> 31;
	const uint32_t a = b & 0x7FFFFFFFu;
	const uint32_t c = arena__sel((int32_t)a > (int32_t)0x42FE0000u /* 127 */, 0x42FE0000u, a);
	/* |v| <= 127: adding 1.5 * 2^23 leaves units in the last place, rounded
	 * half to even by the f32 add itself; the low bits are the integer */
	uint32_t k = arena__bits_of(ARENA__ADD(arena__f32_of(c), 12582912.0f)) - 0x4B400000u;
	k = (k ^ (0u - neg)) + neg; /* rounding is symmetric: negate after */
	return arena__sel((int32_t)a > (int32_t)ARENA_F32_INF, 0u, k) & 0xFFu;
}

/* ---- int4 with a zero point (the int4-gN schemes) --------------------------------
 *
 * A group of values x (its row's columns [g x N, (g + 1) x N), the last group
 * of a row shorter) is stored as codes q in [0, 15], a zero point z in
 * [0, 15] and a scale s (the source's dtype), value = (q - z) x s:
 *   lo = min(0, min x), hi = max(0, max x);  s = round_to_dtype((hi - lo) / 15);
 *   d = s, or 1 where s is 0;  z = clamp(rne(-lo / d), 0, 15);
 *   q = clamp(rne(x / d) + z, 0, 15).
 * The caller refuses groups holding a NaN or an infinity, or whose hi - lo
 * overflows (docs/QUANT.md). */

/* round_half_even(clamp(v, -32, 32)) as an integer (a NaN counts as 32):
 * |v| clamped on its bits, rounded by adding 1.5 x 2^23 (the f32 add leaves
 * units in the last place, rounded half to even), the sign put back (the
 * rounding is symmetric). The clamp does not change what the callers make
 * of it (codes and zero points lie in [0, 15]). */
ARENA_ELEM int32_t arena__rne_clamp32(float v)
{
	const uint32_t b = arena__bits_of(v);
	const uint32_t neg = b >> 31;
	const uint32_t a = b & 0x7FFFFFFFu;
	const uint32_t c = arena__sel((int32_t)a > (int32_t)0x42000000u /* 32 */, 0x42000000u, a);
	const uint32_t k = arena__bits_of(ARENA__ADD(arena__f32_of(c), 12582912.0f)) - 0x4B400000u;
	return (int32_t)((k ^ (0u - neg)) + neg);
}

/* clamp(k, 0, 15). */
ARENA_ELEM uint32_t arena__clamp_u4(int32_t k)
{
	k = k < 0 ? 0 : k;
	return (uint32_t)(k > 15 ? 15 : k);
}

/* The zero point of a group whose lo is `lo`, with divisor d. */
ARENA_ELEM uint32_t arena__int4_zero(float lo, float d)
{
	return arena__clamp_u4(arena__rne_clamp32(ARENA__DIV(-lo, d)));
}

/* The code of x in a group with divisor d and zero point z. */
ARENA_ELEM uint32_t arena__int4_code(float x, float d, uint32_t z)
{
	return arena__clamp_u4(arena__rne_clamp32(ARENA__DIV(x, d)) + (int32_t)z);
}

/* The value of code q in a group of scale s (widened) and zero point z:
 * (q - z) x s, one f32 multiply. */
ARENA_ELEM float arena__int4_value(uint32_t q, uint32_t z, float s)
{
	return ARENA__MUL((float)((int32_t)q - (int32_t)z), s);
}

#endif
