/* codec_cuda.cu - the hb4 decoder on the GPU (formats/codec.h has the
 * layout; codec_cuda.h the contract).
 *
 * Two kernels on the caller's stream, in order:
 *   1. words: one thread per word i of the range (grid-stride): its code is
 *      nibble i of the nibble plane (byte i/2, low nibble for even i), the
 *      word is low[i] | table[code] << 8. The 16-byte table travels by value
 *      in the kernel's parameters, as four words a thread keeps in registers.
 *   2. exceptions, only when some fall in the range: the exceptions with
 *      index in [w0, w1) are a contiguous run [e0, e1) of the sorted list,
 *      found on the host by binary search over v's host copy of the indices;
 *      one thread per exception reads its index and high byte from the
 *      device copy and overwrites the word's high byte (kernel 1 wrote it
 *      from code 0 before, same stream).
 * Every write is inside [dst, dst + z - a): kernel 1 by its loop bound,
 * kernel 2 by checking each index it reads against [w0, w1) (the device
 * bytes may not be the chunk v describes if the caller got its order wrong;
 * then the output is wrong, but only the output).
 *
 * Speed: one byte of nibbles and one low byte read and two bytes written per
 * word, coalesced across a warp; far beyond the PCIe rate that feeds it. */
#include "codec_cuda.h"

#include <stdint.h>

#include "arena.h"

extern "C" {
#include "../formats/codec.h"

/* From common/err.h, which is C11 only (_Noreturn). */
int arena_errorf(int code, const char *fmt, ...);
}

namespace {

const unsigned kThreads = 256;
const unsigned kMaxBlocks = 8192; /* grid-stride beyond this */

/* The table: code c's high byte is byte c % 4 of t[c / 4]. */
struct hb4_table {
	uint32_t t[4];
};

__device__ __forceinline__ unsigned hb4_high(uint32_t t0, uint32_t t1, uint32_t t2, uint32_t t3, unsigned code)
{
	uint32_t w = code & 8 ? (code & 4 ? t3 : t2) : (code & 4 ? t1 : t0);
	return (w >> (8 * (code & 3))) & 0xffu;
}

/* Words w0 .. w0 + n - 1 to dst (word w0 + j at dst + 2j); Aligned: dst is
 * 2-byte aligned, so a word is one 16-bit store. */
template <bool Aligned>
__global__ void hb4_words(uint8_t *__restrict__ dst, const uint8_t *__restrict__ nib, const uint8_t *__restrict__ low,
			  uint64_t w0, uint64_t n, hb4_table tb)
{
	const uint32_t t0 = tb.t[0], t1 = tb.t[1], t2 = tb.t[2], t3 = tb.t[3];
	const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
	for (uint64_t j = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += stride) {
		const uint64_t i = w0 + j;
		const unsigned code = (nib[i / 2] >> (4 * (unsigned)(i & 1))) & 15u;
		const unsigned word = low[i] | hb4_high(t0, t1, t2, t3, code) << 8;
		if (Aligned) {
			reinterpret_cast<uint16_t *>(dst)[j] = (uint16_t)word;
		} else {
			dst[2 * j] = (uint8_t)word;
			dst[2 * j + 1] = (uint8_t)(word >> 8);
		}
	}
}

/* Exceptions e0 .. e0 + n - 1: the high byte of each word in [w0, w1). */
__global__ void hb4_exceptions(uint8_t *__restrict__ dst, const uint8_t *__restrict__ idx,
			       const uint8_t *__restrict__ hi, uint64_t e0, uint64_t n, uint64_t w0, uint64_t w1)
{
	const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
	for (uint64_t t = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; t < n; t += stride) {
		const uint64_t e = e0 + t;
		const uint8_t *p = idx + 4 * e; /* little-endian u32, any alignment */
		const uint64_t k = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
		if (k >= w0 && k < w1)
			dst[2 * (k - w0) + 1] = hi[e];
	}
}

uint32_t get32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* First exception of v (host indices) with index >= i. */
uint64_t exc_lower(const arena_hb4 *v, uint64_t i)
{
	uint64_t lo = 0, hi = v->n_exc;
	while (lo < hi) {
		uint64_t mid = lo + (hi - lo) / 2;
		if (get32(v->exc_idx + 4 * mid) < i)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

unsigned blocks_for(uint64_t n)
{
	uint64_t b = (n + kThreads - 1) / kThreads;
	return b > kMaxBlocks ? kMaxBlocks : (unsigned)b;
}

/* DEV_ERROR for a failed launch; cudaGetLastError has cleared it. */
int launch_fail(cudaError_t e, const char *kernel)
{
	return arena_errorf(ARENA_E(DEV_ERROR), "cuda: decode_hb4: %s kernel launch: %s", kernel, cudaGetErrorString(e));
}

} // namespace

extern "C" int arena__hb4_decode_cuda(void *dst, const void *src, const struct arena_hb4 *v, uint64_t a, uint64_t z,
				      cudaStream_t s)
{
	const uint64_t w0 = a / 2, w1 = z / 2;
	if (w0 >= w1)
		return 0;
	const uint8_t *chunk = static_cast<const uint8_t *>(src);
	uint8_t *out = static_cast<uint8_t *>(dst);
	hb4_table tb;
	for (int k = 0; k < 4; k++)
		tb.t[k] = get32(v->table + 4 * k);

	cudaError_t e;
	const uint64_t n = w1 - w0;
	if (reinterpret_cast<uintptr_t>(dst) % 2 == 0)
		hb4_words<true><<<blocks_for(n), kThreads, 0, s>>>(out, chunk + v->nib_off, chunk + v->low_off, w0, n, tb);
	else
		hb4_words<false><<<blocks_for(n), kThreads, 0, s>>>(out, chunk + v->nib_off, chunk + v->low_off, w0, n, tb);
	if ((e = cudaGetLastError()) != cudaSuccess)
		return launch_fail(e, "word");

	const uint64_t e0 = exc_lower(v, w0), e1 = exc_lower(v, w1);
	if (e0 < e1) {
		hb4_exceptions<<<blocks_for(e1 - e0), kThreads, 0, s>>>(out, chunk + v->idx_off, chunk + v->hi_off, e0,
									  e1 - e0, w0, w1);
		if ((e = cudaGetLastError()) != cudaSuccess)
			return launch_fail(e, "exception");
	}
	return 0;
}
