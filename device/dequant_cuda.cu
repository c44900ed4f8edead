/* dequant_cuda.cu - dequantization on the GPU (formats/elem.h has the element
 * rules, formats/dequant.h the job, codec_cuda.h the contract).
 *
 * One kernel on the caller's stream. A thread converts runs of 16 elements:
 * one 16-byte load (fp8, int8; two for bf16), one product each by the run's
 * scale, 32 or 64 bytes stored in 16-byte stores. A row scale is looked up
 * once a run when the rows are a multiple of 16 long (every weight of a
 * diffusion model), with a 32-bit division when the tensor has fewer than
 * 2^32 elements.
 * Tensors whose bytes are not aligned for those loads, or whose rows are
 * not, take the one-element path of dequant.h. Reading 1 byte and writing 2
 * an element (fp8 to bf16), it runs at the device's memory rate. */
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
			const float s = j.scale[r];
			for (int k = 0; k < kRun; k++)
				v[k] = __fmul_rn(v[k], s);
		}
		store_run<DST>(j.dst, i0, v);
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
	const bool runs = j->n % kRun == 0 && (j->scale_n <= 1 || j->cols % kRun == 0) &&
			  (uintptr_t)j->src % 16 == 0 && (uintptr_t)j->dst % 16 == 0;
	const uint64_t work = runs ? j->n / kRun : j->n;
	uint64_t blocks = (work + kThreads - 1) / kThreads;
	if (blocks > kMaxBlocks)
		blocks = kMaxBlocks;
	if (!runs)
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
