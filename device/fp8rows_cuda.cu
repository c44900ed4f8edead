/* fp8rows_cuda.cu - an activation's rows to FP8 e4m3 on the GPU, one pass
 * (arena_fp8_quantize_rows; formats/elem.h has the element rules).
 *
 * A block a row: the row's largest |x| (a block reduction), its scale, then
 * x / scale rounded to e4m3 and saturated, written with the scale. With
 * column scales (a gradient times a weight's row scales, for the FP8
 * backward), x is each element times its column's scale, in f32.
 *
 * Rows of a multiple of 8 BF16 elements on 16-byte boundaries go by 16-byte
 * loads and 8-byte stores, each thread's loads kept in registers between the
 * two halves (up to kKeep of them: rows of up to 8 x kKeep x the block's
 * threads; longer ones read again, from the cache); the block is 128 threads
 * for rows of up to 4096 (Flux's 3072: three loads a thread, none idle), 256
 * above. The largest |x| is fmaxf's with NaN tracked beside it (torch's
 * amax: a NaN wins). From compute capability 8.9 the quotient is rounded by
 * the device's conversion (cvt.rn.satfinite.e4m3x2.f32: to nearest even,
 * saturated to +-448, the rules' bits for every finite quotient); a row
 * whose scale is not finite (a NaN or an infinity in it) takes the rules'
 * path, which gives NaN its sign. Other rows go one element at a time. */
#include <stdint.h>

#include "arena.h"
#include "codec_cuda.h"
#include "../formats/elem.h"

extern "C" {
/* From common/err.h, which is C11 only (_Noreturn). */
int arena_errorf(int code, const char *fmt, ...);
}

namespace {

const int kKeep = 8; /* 16-byte loads a thread keeps in registers */

/* Element k of x's row times its column's scale (COL), in f32. */
template <bool COL>
__device__ __forceinline__ float elem(uint32_t bits, const float *__restrict__ cs, uint64_t k)
{
	const float v = arena__bf16_to_f32(bits);
	return COL ? __fmul_rn(v, cs[k]) : v;
}

/* The largest of every thread's m (NaN if any thread saw one) */
template <unsigned T>
__device__ __forceinline__ float block_amax(float m, bool nan, float *part)
{
	for (int off = 16; off; off >>= 1)
		m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, off));
	nan = __any_sync(0xFFFFFFFFu, nan);
	if ((threadIdx.x & 31) == 0)
		part[threadIdx.x / 32] = nan ? __int_as_float(0x7FC00000) : m;
	__syncthreads();
	m = 0.0f;
	for (unsigned w = 0; w < T / 32; w++)
		m = arena__amax_step(m, part[w]);
	return m;
}

/* Eight quotients' e4m3 codes, two 32-bit words. */
template <bool HW, bool COL>
__device__ __forceinline__ uint2 quantize8(uint4 w, const float *__restrict__ cs, uint64_t i, float s)
{
	const uint32_t v[4] = {w.x, w.y, w.z, w.w};
	uint32_t o[2] = {0, 0};
	for (int k = 0; k < 4; k++) {
		const float lo = ARENA__DIV(elem<COL>(v[k] & 0xFFFFu, cs, i + 2 * k), s);
		const float hi = ARENA__DIV(elem<COL>(v[k] >> 16, cs, i + 2 * k + 1), s);
		uint32_t pair;
#if __CUDA_ARCH__ >= 890
		if (HW) {
			unsigned short h;
			asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(h) : "f"(hi), "f"(lo));
			pair = h;
		} else
#endif
			pair = arena__f32_to_e4m3_sat(lo) | arena__f32_to_e4m3_sat(hi) << 8;
		o[k / 2] |= pair << (16 * (k & 1));
	}
	return make_uint2(o[0], o[1]);
}

/* Eight elements folded into a thread's largest |x| and its NaN flag. */
template <bool COL>
__device__ __forceinline__ void amax8(uint4 w, const float *__restrict__ cs, uint64_t i, float &m, bool &nan)
{
	const uint32_t v[4] = {w.x, w.y, w.z, w.w};
	for (int k = 0; k < 4; k++) {
		const float lo = elem<COL>(v[k] & 0xFFFFu, cs, i + 2 * k), hi = elem<COL>(v[k] >> 16, cs, i + 2 * k + 1);
		m = fmaxf(m, fmaxf(fabsf(lo), fabsf(hi)));
		nan |= lo != lo || hi != hi;
	}
}

/* Rows of 8k elements, 16-byte aligned; KEEP: each thread's loads fit kKeep. */
template <bool COL, bool KEEP, unsigned T>
__global__ void __launch_bounds__(T) rows_vec(const uint16_t *__restrict__ x, uint64_t cols,
					      const float *__restrict__ cs, uint8_t *__restrict__ q,
					      float *__restrict__ scale)
{
	__shared__ float part[T / 32];
	const uint64_t row = blockIdx.x;
	const uint4 *xr = (const uint4 *)(x + row * cols);
	uint2 *qr = (uint2 *)(q + row * cols);
	const uint64_t n = cols / 8;
	uint4 keep[KEEP ? kKeep : 1];
	float m = 0.0f;
	bool nan = false;
	if (KEEP) {
#pragma unroll
		for (int j = 0; j < kKeep; j++) {
			const uint64_t i = threadIdx.x + (uint64_t)j * T;
			if (i < n) {
				keep[j] = xr[i];
				amax8<COL>(keep[j], cs, 8 * i, m, nan);
			}
		}
	} else {
		for (uint64_t i = threadIdx.x; i < n; i += T)
			amax8<COL>(xr[i], cs, 8 * i, m, nan);
	}
	const float s = arena__e4m3_row_scale(block_amax<T>(m, nan, part));
	if (threadIdx.x == 0)
		scale[row] = s;
	const bool hw = __float_as_uint(fabsf(s)) < ARENA_F32_INF; /* finite: every quotient is */
	if (KEEP) {
#pragma unroll
		for (int j = 0; j < kKeep; j++) {
			const uint64_t i = threadIdx.x + (uint64_t)j * T;
			if (i < n)
				qr[i] = hw ? quantize8<true, COL>(keep[j], cs, 8 * i, s)
					   : quantize8<false, COL>(keep[j], cs, 8 * i, s);
		}
	} else {
		for (uint64_t i = threadIdx.x; i < n; i += T)
			qr[i] = hw ? quantize8<true, COL>(xr[i], cs, 8 * i, s) : quantize8<false, COL>(xr[i], cs, 8 * i, s);
	}
}

/* Any other row, one element at a time (read twice, the second from the cache). */
template <bool COL>
__global__ void rows_any(const uint16_t *__restrict__ x, uint64_t cols, const float *__restrict__ cs,
			 uint8_t *__restrict__ q, float *__restrict__ scale)
{
	const unsigned T = 256;
	__shared__ float part[T / 32];
	const uint64_t row = blockIdx.x;
	const uint16_t *xr = x + row * cols;
	uint8_t *qr = q + row * cols;
	float m = 0.0f;
	bool nan = false;
	for (uint64_t i = threadIdx.x; i < cols; i += T) {
		const float v = elem<COL>(xr[i], cs, i);
		m = fmaxf(m, fabsf(v));
		nan |= v != v;
	}
	const float s = arena__e4m3_row_scale(block_amax<T>(m, nan, part));
	if (threadIdx.x == 0)
		scale[row] = s;
	for (uint64_t i = threadIdx.x; i < cols; i += T)
		qr[i] = (uint8_t)arena__f32_to_e4m3_sat(ARENA__DIV(elem<COL>(xr[i], cs, i), s));
}

template <bool COL>
void launch(const void *x, uint64_t rows, uint64_t cols, const float *cs, void *q, float *scale, cudaStream_t s)
{
	const uint16_t *xs = (const uint16_t *)x;
	uint8_t *qs = (uint8_t *)q;
	const unsigned g = (unsigned)rows;
	if (cols % 8 || ((uintptr_t)x & 15) || ((uintptr_t)q & 7))
		rows_any<COL><<<g, 256, 0, s>>>(xs, cols, cs, qs, scale);
	else if (cols <= 4096)
		rows_vec<COL, true, 128><<<g, 128, 0, s>>>(xs, cols, cs, qs, scale);
	else if (cols <= 8ull * kKeep * 256)
		rows_vec<COL, true, 256><<<g, 256, 0, s>>>(xs, cols, cs, qs, scale);
	else
		rows_vec<COL, false, 256><<<g, 256, 0, s>>>(xs, cols, cs, qs, scale);
}

} // namespace

extern "C" int arena__fp8_rows_cuda(const void *x, uint64_t rows, uint64_t cols, const float *col_scale, void *q,
				    float *scale, cudaStream_t s)
{
	if (!rows)
		return 0;
	if (col_scale)
		launch<true>(x, rows, cols, col_scale, q, scale, s);
	else
		launch<false>(x, rows, cols, NULL, q, scale, s);
	const cudaError_t e = cudaGetLastError();
	if (e != cudaSuccess)
		return arena_errorf(ARENA_E(DEV_ERROR), "cuda: FP8 rows of %llu x %llu: %s", (unsigned long long)rows,
				    (unsigned long long)cols, cudaGetErrorString(e));
	return 0;
}
