/* dequant_cuda.cu - dequantization on the GPU (formats/elem.h has the element
 * rules, formats/dequant.h the job, codec_cuda.h the contract).
 *
 * One kernel on the caller's stream. A thread converts runs of 16 elements:
 * one 16-byte load (fp8, int8; two for bf16), one product each by the run's
 * scale, 32 or 64 bytes stored in 16-byte stores. A row scale is looked up
 * once a run when the rows are a multiple of 16 long (every weight of a
 * diffusion model), with a 32-bit division when the tensor has fewer than
 * 2^32 elements. int4 (groups of 32, 64 or 128 along a row) goes by runs of
 * 32 codes, one 16-byte load, inside one group (its scale and zero point
 * read once), when the rows are a multiple of 32 long.
 * Tensors whose bytes are not aligned for those loads, or whose rows are
 * not, take the one-element path of dequant.h. On devices that have them
 * (e4m3: compute capability 8.9; bf16 pairs: 8.0) the conversions are the
 * device's own instructions, the same values as the elem.h rules (e4m3 to
 * f16 is exact, the rounding to bf16 is to nearest even, NaN made 0x7FC0):
 * the kernel is then bound by memory, not by the rules' integer work. */
#include <stdint.h>

#include "arena.h"
#include "codec_cuda.h"
#include "../formats/dequant.h"

extern "C" {
/* From common/err.h, which is C11 only (_Noreturn). */
int arena_errorf(int code, const char *fmt, ...);
}

namespace {

const unsigned kThreads = 256;
const uint64_t kMaxBlocks = 8192;

const int kRun = 16; /* elements a thread converts at a time */

/* kRun source elements: one 16-byte load (fp8, int8) or two (bf16). */
template <int SRC>
__device__ __forceinline__ void load_run(const void *src, uint64_t i0, float v[kRun])
{
	if (SRC == ARENA_DTYPE_BF16) {
		const uint4 *p = (const uint4 *)((const uint16_t *)src + i0);
		for (int h = 0; h < 2; h++) {
			const uint4 w = p[h];
			const uint32_t q[4] = {w.x, w.y, w.z, w.w};
			for (int k = 0; k < 4; k++) {
				v[8 * h + 2 * k] = arena__bf16_to_f32(q[k] & 0xFFFFu);
				v[8 * h + 2 * k + 1] = arena__bf16_to_f32(q[k] >> 16);
			}
		}
	} else {
		const uint4 w = *(const uint4 *)((const uint8_t *)src + i0);
		const uint32_t q[4] = {w.x, w.y, w.z, w.w};
#if __CUDA_ARCH__ >= 890
		/* e4m3 by the device's conversion (every e4m3 value is an f16 one),
		 * unless the run holds a NaN (S.1111.111: a zero byte of ~(q | 0x80)),
		 * whose bits the rules give as sign | 0x7FC00000 */
		uint32_t nan = 0;
		for (int k = 0; SRC == ARENA_DTYPE_F8_E4M3 && k < 4; k++) {
			const uint32_t y = ~(q[k] | 0x80808080u);
			nan |= (y - 0x01010101u) & ~y & 0x80808080u;
		}
		if (SRC == ARENA_DTYPE_F8_E4M3 && !nan) {
			for (int k = 0; k < kRun; k += 2) {
				const uint16_t pair = (uint16_t)(q[k / 4] >> (8 * (k & 3)));
				uint32_t h2;
				unsigned short lo, hi;
				asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(pair));
				lo = (unsigned short)h2, hi = (unsigned short)(h2 >> 16);
				asm("cvt.f32.f16 %0, %1;" : "=f"(v[k]) : "h"(lo));
				asm("cvt.f32.f16 %0, %1;" : "=f"(v[k + 1]) : "h"(hi));
			}
		} else
#endif
			for (int k = 0; k < kRun; k++) {
				const uint32_t b = (q[k / 4] >> (8 * (k & 3))) & 0xFFu;
				v[k] = SRC == ARENA_DTYPE_F8_E4M3   ? arena__e4m3_to_f32(b)
				       : SRC == ARENA_DTYPE_F8_E5M2 ? arena__e5m2_to_f32(b)
								    : (float)(int8_t)b;
			}
	}
}

/* kRun results: two 16-byte stores (bf16, f16) or four (f32). */
template <int DST>
__device__ __forceinline__ void store_run(void *dst, uint64_t i0, const float v[kRun])
{
	if (DST == ARENA_DTYPE_F32) {
		float4 *d = (float4 *)((float *)dst + i0);
		for (int h = 0; h < 4; h++)
			d[h] = make_float4(v[4 * h], v[4 * h + 1], v[4 * h + 2], v[4 * h + 3]);
	} else {
		uint4 *d = (uint4 *)((uint16_t *)dst + i0);
		for (int h = 0; h < 2; h++) {
			uint32_t p[4];
			for (int k = 0; k < 4; k++) {
				const float lo = v[8 * h + 2 * k], hi = v[8 * h + 2 * k + 1];
#if __CUDA_ARCH__ >= 800
				if (DST == ARENA_DTYPE_BF16) { /* the device's rounding (to nearest even), NaN made 0x7FC0 */
					uint32_t r;
					asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
					r = lo != lo ? (r & 0xFFFF0000u) | 0x7FC0u : r;
					p[k] = hi != hi ? (r & 0xFFFFu) | 0x7FC00000u : r;
				} else
#endif
					p[k] = DST == ARENA_DTYPE_BF16 ? arena__f32_to_bf16(lo) | arena__f32_to_bf16(hi) << 16
								       : arena__f32_to_f16(lo) | arena__f32_to_f16(hi) << 16;
			}
			d[h] = make_uint4(p[0], p[1], p[2], p[3]);
		}
	}
}

/* Runs of kRun: n % kRun == 0, the rows (if scaled by row) a multiple of kRun long. */
template <int SRC, int DST>
__global__ void dequant_runs(arena_dequant_job j)
{
	const uint64_t runs = j.n / kRun;
	const bool small = j.n < ((uint64_t)1 << 32);
	for (uint64_t g = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; g < runs; g += (uint64_t)gridDim.x * blockDim.x) {
		const uint64_t i0 = g * kRun;
		float v[kRun];
		load_run<SRC>(j.src, i0, v);
		if (j.scale_n) {
			uint64_t r = 0;
			if (j.scale_n != 1)
				r = small ? (uint64_t)((uint32_t)i0 / (uint32_t)j.cols) : i0 / j.cols;
			const float s = ((const float *)j.scale)[r];
			for (int k = 0; k < kRun; k++)
				v[k] = __fmul_rn(v[k], s);
		}
		store_run<DST>(j.dst, i0, v);
	}
}

const int kRun4 = 32; /* int4 codes a thread converts at a time: 16 bytes */

/* int4 runs of kRun4: the rows a multiple of kRun4 long, so a run is 16
 * bytes of one row's codes, at 16 x its index, inside one group (the groups
 * are a multiple of kRun4 long); SDT is the scale's dtype. */
template <int DST, int SDT>
__global__ void dequant_int4_runs(arena_dequant_job j)
{
	const uint64_t runs = j.n / kRun4;
	const uint64_t per_row = j.cols / kRun4, per_group = j.group / kRun4;
	const uint64_t groups = (j.cols + j.group - 1) / j.group;
	const bool small = runs < ((uint64_t)1 << 32);
	for (uint64_t g = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; g < runs; g += (uint64_t)gridDim.x * blockDim.x) {
		const uint64_t r = small ? (uint64_t)((uint32_t)g / (uint32_t)per_row) : g / per_row;
		const uint64_t in_row = g - r * per_row; /* the run's place in its row */
		const uint64_t k = r * groups + (small ? (uint64_t)((uint32_t)in_row / (uint32_t)per_group) : in_row / per_group);
		const float s = SDT == ARENA_DTYPE_BF16  ? arena__bf16_to_f32(((const uint16_t *)j.scale)[k])
				: SDT == ARENA_DTYPE_F16 ? arena__f16_to_f32(((const uint16_t *)j.scale)[k])
							 : ((const float *)j.scale)[k];
		const uint32_t z = j.zero[k];
		const uint4 w = *(const uint4 *)((const uint8_t *)j.src + g * 16);
		const uint32_t q[4] = {w.x, w.y, w.z, w.w};
		float v[kRun4];
		for (int b = 0; b < 16; b++) {
			const uint32_t byte = (q[b / 4] >> (8 * (b & 3))) & 0xFFu;
			v[2 * b] = arena__int4_value(byte & 15u, z, s);
			v[2 * b + 1] = arena__int4_value(byte >> 4, z, s);
		}
		store_run<DST>(j.dst, g * kRun4, v);
		store_run<DST>(j.dst, g * kRun4 + kRun, v + kRun);
	}
}

template <int SDT>
void launch_int4(const arena_dequant_job &j, unsigned blocks, cudaStream_t s)
{
	switch (j.dst_dtype) {
	case ARENA_DTYPE_BF16:
		dequant_int4_runs<ARENA_DTYPE_BF16, SDT><<<blocks, kThreads, 0, s>>>(j);
		break;
	case ARENA_DTYPE_F16:
		dequant_int4_runs<ARENA_DTYPE_F16, SDT><<<blocks, kThreads, 0, s>>>(j);
		break;
	default:
		dequant_int4_runs<ARENA_DTYPE_F32, SDT><<<blocks, kThreads, 0, s>>>(j);
		break;
	}
}

__global__ void dequant1(arena_dequant_job j)
{
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < j.n; i += (uint64_t)gridDim.x * blockDim.x)
		arena__dq_one(&j, i);
}

template <int SRC>
void launch_runs(const arena_dequant_job &j, unsigned blocks, cudaStream_t s)
{
	switch (j.dst_dtype) {
	case ARENA_DTYPE_BF16:
		dequant_runs<SRC, ARENA_DTYPE_BF16><<<blocks, kThreads, 0, s>>>(j);
		break;
	case ARENA_DTYPE_F16:
		dequant_runs<SRC, ARENA_DTYPE_F16><<<blocks, kThreads, 0, s>>>(j);
		break;
	default:
		dequant_runs<SRC, ARENA_DTYPE_F32><<<blocks, kThreads, 0, s>>>(j);
		break;
	}
}

} // namespace

extern "C" int arena__dequant_cuda(const arena_dequant_job *j, cudaStream_t s)
{
	if (!j->n)
		return 0;
	const bool aligned = (uintptr_t)j->src % 16 == 0 && (uintptr_t)j->dst % 16 == 0;
	const bool int4 = j->group && j->cols % kRun4 == 0 && j->group % kRun4 == 0 && aligned;
	const bool runs = !j->group && j->n % kRun == 0 && (j->scale_n <= 1 || j->cols % kRun == 0) && aligned;
	const uint64_t work = int4 ? j->n / kRun4 : runs ? j->n / kRun : j->n;
	uint64_t blocks = (work + kThreads - 1) / kThreads;
	if (blocks > kMaxBlocks)
		blocks = kMaxBlocks;
	if (int4 && j->scale_dtype == ARENA_DTYPE_BF16)
		launch_int4<ARENA_DTYPE_BF16>(*j, (unsigned)blocks, s);
	else if (int4 && j->scale_dtype == ARENA_DTYPE_F16)
		launch_int4<ARENA_DTYPE_F16>(*j, (unsigned)blocks, s);
	else if (int4)
		launch_int4<ARENA_DTYPE_F32>(*j, (unsigned)blocks, s);
	else if (!runs)
		dequant1<<<(unsigned)blocks, kThreads, 0, s>>>(*j);
	else if (j->src_dtype == ARENA_DTYPE_F8_E4M3)
		launch_runs<ARENA_DTYPE_F8_E4M3>(*j, (unsigned)blocks, s);
	else if (j->src_dtype == ARENA_DTYPE_F8_E5M2)
		launch_runs<ARENA_DTYPE_F8_E5M2>(*j, (unsigned)blocks, s);
	else if (j->src_dtype == ARENA_DTYPE_I8)
		launch_runs<ARENA_DTYPE_I8>(*j, (unsigned)blocks, s);
	else
		launch_runs<ARENA_DTYPE_BF16>(*j, (unsigned)blocks, s);
	const cudaError_t e = cudaGetLastError();
	if (e != cudaSuccess)
		return arena_errorf(ARENA_E(DEV_ERROR), "cuda: dequantize: kernel launch: %s", cudaGetErrorString(e));
	return 0;
}
