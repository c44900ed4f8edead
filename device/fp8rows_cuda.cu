/* fp8rows_cuda.cu - an activation's rows to FP8 e4m3 on the GPU, one pass
 * (arena_fp8_quantize_rows; formats/elem.h has the element rules).
 *
 * A block of 256 threads a row: the row's largest |x| (a block reduction),
 * its scale, then x / scale rounded to e4m3 and saturated, written with the
 * scale. With column scales (a gradient times a weight's row scales, for the
 * FP8 backward), x is each element times its column's scale, in f32. Rows
 * of a multiple of 8 BF16 elements on 16-byte boundaries go by 16-byte
 * loads and 8-byte stores; others one element at a time. The second read of
 * a row comes from the cache: a row is one block's. */
#include <stdint.h>

#include "arena.h"
#include "codec_cuda.h"
#include "../formats/elem.h"

extern "C" {
/* From common/err.h, which is C11 only (_Noreturn). */
int arena_errorf(int code, const char *fmt, ...);
}

namespace {

const unsigned kThreads = 256;

/* Element k of x's row times its column's scale (COL), in f32. */
template <bool COL>
__device__ __forceinline__ float elem(uint32_t bits, const float *__restrict__ cs, uint64_t k)
{
	const float v = arena__bf16_to_f32(bits);
	return COL ? __fmul_rn(v, cs[k]) : v;
}

template <bool VEC, bool COL>
__global__ void rows_e4m3(const uint16_t *__restrict__ x, uint64_t cols, const float *__restrict__ cs,
			  uint8_t *__restrict__ q, float *__restrict__ scale)
{
	__shared__ float part[kThreads / 32];
	const uint64_t row = blockIdx.x;
	const uint16_t *xr = x + row * cols;
	uint8_t *qr = q + row * cols;
	float m = 0.0f;
	if (VEC) {
		for (uint64_t i = threadIdx.x * 8ull; i < cols; i += kThreads * 8ull) {
			const uint4 w = *(const uint4 *)(xr + i);
			const uint32_t v[4] = {w.x, w.y, w.z, w.w};
			for (int k = 0; k < 4; k++) {
				m = arena__amax_step(m, elem<COL>(v[k] & 0xFFFFu, cs, i + 2 * k));
				m = arena__amax_step(m, elem<COL>(v[k] >> 16, cs, i + 2 * k + 1));
			}
		}
	} else {
		for (uint64_t i = threadIdx.x; i < cols; i += kThreads)
			m = arena__amax_step(m, elem<COL>(xr[i], cs, i));
	}
	for (int off = 16; off; off >>= 1)
		m = arena__amax_step(m, __shfl_xor_sync(0xFFFFFFFFu, m, off));
	if ((threadIdx.x & 31) == 0)
		part[threadIdx.x / 32] = m;
	__syncthreads();
	m = 0.0f;
	for (unsigned w = 0; w < kThreads / 32; w++)
		m = arena__amax_step(m, part[w]);
	const float s = arena__e4m3_row_scale(m);
	if (threadIdx.x == 0)
		scale[row] = s;
	if (VEC) {
		for (uint64_t i = threadIdx.x * 8ull; i < cols; i += kThreads * 8ull) {
			const uint4 w = *(const uint4 *)(xr + i);
			const uint32_t v[4] = {w.x, w.y, w.z, w.w};
			uint32_t o[2] = {0, 0};
			for (int k = 0; k < 4; k++) {
				const uint32_t lo = arena__f32_to_e4m3_sat(ARENA__DIV(elem<COL>(v[k] & 0xFFFFu, cs, i + 2 * k), s));
				const uint32_t hi = arena__f32_to_e4m3_sat(ARENA__DIV(elem<COL>(v[k] >> 16, cs, i + 2 * k + 1), s));
				o[k / 2] |= (lo | hi << 8) << (16 * (k & 1));
			}
			*(uint2 *)(qr + i) = make_uint2(o[0], o[1]);
		}
	} else {
		for (uint64_t i = threadIdx.x; i < cols; i += kThreads)
			qr[i] = (uint8_t)arena__f32_to_e4m3_sat(ARENA__DIV(elem<COL>(xr[i], cs, i), s));
	}
}

template <bool COL>
void launch(const void *x, uint64_t rows, uint64_t cols, const float *cs, void *q, float *scale, cudaStream_t s)
{
	const bool vec = cols % 8 == 0 && ((uintptr_t)x & 15) == 0 && ((uintptr_t)q & 7) == 0;
	if (vec)
		rows_e4m3<true, COL><<<(unsigned)rows, kThreads, 0, s>>>((const uint16_t *)x, cols, cs, (uint8_t *)q,
									 scale);
	else
		rows_e4m3<false, COL><<<(unsigned)rows, kThreads, 0, s>>>((const uint16_t *)x, cols, cs, (uint8_t *)q,
									  scale);
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
