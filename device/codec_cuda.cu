/* codec_cuda.cu - the hb4 decoder on the GPU (formats/codec.h has the
 * layout; codec_cuda.h the contract).
 *
 * One kernel on the caller's stream. Each thread block owns a run of
 * kWordsPerBlock words of the range: its threads write them (word i's code
 * is nibble i of the nibble plane, byte i/2, low nibble for even i; the word
 * is low[i] | table[code] << 8, the 16-byte table travelling by value in
 * the kernel's parameters), then, after __syncthreads, the block finds the
 * exceptions inside its run by binary search over the device copy of the
 * sorted indices and overwrites those words' high bytes. One launch a range,
 * and nothing is read from the host: the loader streams a chunk to the
 * device and lets its host pieces go before the decode is queued.
 *
 * Every write is inside [dst, dst + z - a): words by the loop bound, and
 * each exception's index is checked against the block's run (the host has
 * checked the indices, but the device bytes are not trusted for safety).
 *
 * Speed: one byte of nibbles and one low byte read and two bytes written per
 * word, coalesced across a warp; far beyond the PCIe rate that feeds it. */
#include "codec_cuda.h"

#include <stdint.h>

#include "arena.h"

extern "C" {
#include "../formats/codec.h"
#include "backend.h"

/* From common/err.h, which is C11 only (_Noreturn). */
int arena_errorf(int code, const char *fmt, ...);
}

namespace {

const unsigned kThreads = 256;
const uint64_t kWordsPerBlock = 4096;
const unsigned kManyMax = 16; /* ranges a launch of hb4_decode_many */

/* The table: code c's high byte is byte c % 4 of t[c / 4]. */
struct hb4_table {
	uint32_t t[4];
};

__device__ __forceinline__ unsigned hb4_high(uint32_t t0, uint32_t t1, uint32_t t2, uint32_t t3, unsigned code)
{
	uint32_t w = code & 8 ? (code & 4 ? t3 : t2) : (code & 4 ? t1 : t0);
	return (w >> (8 * (code & 3))) & 0xffu;
}

__device__ __forceinline__ uint64_t idx_at(const uint8_t *idx, uint64_t e)
{
	const uint8_t *p = idx + 4 * e; /* little-endian u32, any alignment */
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* First exception with index >= w (indices sorted; bounded either way). */
__device__ uint64_t exc_lower(const uint8_t *idx, uint64_t n_exc, uint64_t w)
{
	uint64_t lo = 0, hi = n_exc;
	while (lo < hi) {
		uint64_t mid = lo + (hi - lo) / 2;
		if (idx_at(idx, mid) < w)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* Words w0 .. w0 + n - 1 of the chunk to dst (word w0 + j at dst + 2j).
 * Aligned: dst is 2-byte aligned, so a word is one 16-bit store. */
template <bool Aligned>
__global__ void hb4_decode(uint8_t *__restrict__ dst, const uint8_t *__restrict__ nib, const uint8_t *__restrict__ low,
			   const uint8_t *__restrict__ idx, const uint8_t *__restrict__ hi, uint64_t n_exc, uint64_t w0,
			   uint64_t n, hb4_table tb)
{
	const uint32_t t0 = tb.t[0], t1 = tb.t[1], t2 = tb.t[2], t3 = tb.t[3];
	const uint64_t b0 = (uint64_t)blockIdx.x * kWordsPerBlock;
	const uint64_t b1 = b0 + kWordsPerBlock < n ? b0 + kWordsPerBlock : n;
	for (uint64_t j = b0 + threadIdx.x; j < b1; j += blockDim.x) {
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
	if (!n_exc)
		return;
	__shared__ uint64_t e_lo, e_hi;
	if (threadIdx.x == 0) {
		e_lo = exc_lower(idx, n_exc, w0 + b0);
		e_hi = exc_lower(idx, n_exc, w0 + b1);
	}
	__syncthreads(); /* the block's words are written and e_lo/e_hi are set */
	for (uint64_t e = e_lo + threadIdx.x; e < e_hi; e += blockDim.x) {
		const uint64_t k = idx_at(idx, e);
		if (k >= w0 + b0 && k < w0 + b1)
			dst[2 * (k - w0) + 1] = hi[e];
	}
}

/* The same, eight words a thread at a time: one 4-byte load of nibbles,
 * one 8-byte load of low bytes, one 16-byte store. For ranges whose planes
 * and destination are aligned to that (w0 a multiple of 8, the planes 4-
 * and 8-byte aligned there, dst 16-byte aligned): every range coded
 * streaming decodes, and most of a load's. The word-at-a-time kernel moved
 * about 58 GB/s of raw bytes on an H200, no faster than PCIe feeds it; this
 * one is not what a copy waits for. */
__device__ __forceinline__ void hb4_decode8_body(uint8_t *__restrict__ dst, const uint8_t *__restrict__ nib,
						 const uint8_t *__restrict__ low, const uint8_t *__restrict__ idx,
						 const uint8_t *__restrict__ hi, uint64_t n_exc, uint64_t w0, uint64_t n,
						 hb4_table tb, unsigned bx)
{
	const uint32_t t0 = tb.t[0], t1 = tb.t[1], t2 = tb.t[2], t3 = tb.t[3];
	const uint64_t b0 = (uint64_t)bx * kWordsPerBlock;
	const uint64_t b1 = b0 + kWordsPerBlock < n ? b0 + kWordsPerBlock : n;
	const uint32_t *nib4 = reinterpret_cast<const uint32_t *>(nib + w0 / 2);
	const uint2 *low8 = reinterpret_cast<const uint2 *>(low + w0);
	uint4 *out = reinterpret_cast<uint4 *>(dst);
	const uint64_t g1 = b1 / 8; /* whole groups of 8 in the block's run */
	for (uint64_t g = b0 / 8 + threadIdx.x; g < g1; g += blockDim.x) {
		const uint32_t c = nib4[g];
		const uint2 l = low8[g];
		uint32_t w[4];
#pragma unroll
		for (int k = 0; k < 4; k++) {
			const uint32_t lo = k < 2 ? l.x : l.y;
			const unsigned s = 16 * (k & 1);
			const uint32_t a = ((lo >> s) & 0xffu) | hb4_high(t0, t1, t2, t3, (c >> (8 * k)) & 15u) << 8;
			const uint32_t b = ((lo >> (s + 8)) & 0xffu) | hb4_high(t0, t1, t2, t3, (c >> (8 * k + 4)) & 15u) << 8;
			w[k] = a | b << 16;
		}
		out[g] = make_uint4(w[0], w[1], w[2], w[3]);
	}
	for (uint64_t j = g1 * 8 + threadIdx.x; j < b1; j += blockDim.x) { /* the range's last words */
		const uint64_t i = w0 + j;
		const unsigned code = (nib[i / 2] >> (4 * (unsigned)(i & 1))) & 15u;
		reinterpret_cast<uint16_t *>(dst)[j] = (uint16_t)(low[i] | hb4_high(t0, t1, t2, t3, code) << 8);
	}
	if (!n_exc)
		return;
	__shared__ uint64_t e_lo, e_hi;
	if (threadIdx.x == 0) {
		e_lo = exc_lower(idx, n_exc, w0 + b0);
		e_hi = exc_lower(idx, n_exc, w0 + b1);
	}
	__syncthreads();
	for (uint64_t e = e_lo + threadIdx.x; e < e_hi; e += blockDim.x) {
		const uint64_t k = idx_at(idx, e);
		if (k >= w0 + b0 && k < w0 + b1)
			dst[2 * (k - w0) + 1] = hi[e];
	}
}

__global__ void hb4_decode8(uint8_t *__restrict__ dst, const uint8_t *__restrict__ nib, const uint8_t *__restrict__ low,
			    const uint8_t *__restrict__ idx, const uint8_t *__restrict__ hi, uint64_t n_exc, uint64_t w0,
			    uint64_t n, hb4_table tb)
{
	hb4_decode8_body(dst, nib, low, idx, hi, n_exc, w0, n, tb, blockIdx.x);
}

/* Many ranges in one launch (coded streaming decodes a run of segments
 * from one stage): blockIdx.y picks the range, blockIdx.x its run of words,
 * as hb4_decode8 (all aligned, each from word 0 of its chunk). */
struct hb4_many {
	uint8_t *dst[kManyMax];
	const uint8_t *chunk[kManyMax];
	uint32_t nib_off[kManyMax], low_off[kManyMax], idx_off[kManyMax], hi_off[kManyMax];
	uint32_t n[kManyMax], n_exc[kManyMax];
	hb4_table tb[kManyMax];
};

__global__ void hb4_decode_many(const __grid_constant__ hb4_many m)
{
	const unsigned y = blockIdx.y;
	const uint64_t n = m.n[y];
	if ((uint64_t)blockIdx.x * kWordsPerBlock >= n)
		return;
	const uint8_t *c = m.chunk[y];
	hb4_decode8_body(m.dst[y], c + m.nib_off[y], c + m.low_off[y], c + m.idx_off[y], c + m.hi_off[y], m.n_exc[y], 0, n,
			 m.tb[y], blockIdx.x);
}

uint32_t get32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* DEV_ERROR for a failed launch; cudaGetLastError has cleared it. */
int launch_fail(cudaError_t e)
{
	return arena_errorf(ARENA_E(DEV_ERROR), "cuda: decode_hb4: kernel launch: %s", cudaGetErrorString(e));
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

	const uint64_t n = w1 - w0, blocks = (n + kWordsPerBlock - 1) / kWordsPerBlock;
	const uint8_t *nib = chunk + v->nib_off, *low = chunk + v->low_off, *idx = chunk + v->idx_off,
		      *hi = chunk + v->hi_off;
	const uintptr_t al = reinterpret_cast<uintptr_t>(dst) % 16 | (w0 % 8) | reinterpret_cast<uintptr_t>(nib + w0 / 2) % 4 |
			     reinterpret_cast<uintptr_t>(low + w0) % 8;
	if (al == 0)
		hb4_decode8<<<(unsigned)blocks, kThreads, 0, s>>>(out, nib, low, idx, hi, v->n_exc, w0, n, tb);
	else if (reinterpret_cast<uintptr_t>(dst) % 2 == 0)
		hb4_decode<true><<<(unsigned)blocks, kThreads, 0, s>>>(out, nib, low, idx, hi, v->n_exc, w0, n, tb);
	else
		hb4_decode<false><<<(unsigned)blocks, kThreads, 0, s>>>(out, nib, low, idx, hi, v->n_exc, w0, n, tb);
	cudaError_t e = cudaGetLastError();
	if (e != cudaSuccess)
		return launch_fail(e);
	return 0;
}

extern "C" int arena__hb4_decode_many_cuda(const struct arena_hb4_job *jobs, size_t n_jobs, cudaStream_t s)
{
	for (size_t i = 0; i < n_jobs;) {
		hb4_many m;
		unsigned k = 0;
		uint64_t most = 0;
		for (; i < n_jobs && k < kManyMax; i++) {
			const arena_hb4_job *j = &jobs[i];
			const arena_hb4 *v = j->v;
			const uint8_t *c = static_cast<const uint8_t *>(j->src);
			const uint64_t w = j->z / 2;
			const uintptr_t al = reinterpret_cast<uintptr_t>(j->dst) % 16 |
					     reinterpret_cast<uintptr_t>(c + v->nib_off) % 4 |
					     reinterpret_cast<uintptr_t>(c + v->low_off) % 8;
			if (j->a || al || v->hi_off > UINT32_MAX || w > UINT32_MAX || v->n_exc > UINT32_MAX) {
				int rc = arena__hb4_decode_cuda(j->dst, j->src, v, j->a, j->z, s); /* on its own */
				if (rc)
					return rc;
				continue;
			}
			if (!w)
				continue;
			m.dst[k] = static_cast<uint8_t *>(j->dst);
			m.chunk[k] = c;
			m.nib_off[k] = (uint32_t)v->nib_off;
			m.low_off[k] = (uint32_t)v->low_off;
			m.idx_off[k] = (uint32_t)v->idx_off;
			m.hi_off[k] = (uint32_t)v->hi_off;
			m.n[k] = (uint32_t)w;
			m.n_exc[k] = (uint32_t)v->n_exc;
			for (int q = 0; q < 4; q++)
				m.tb[k].t[q] = get32(v->table + 4 * q);
			most = w > most ? w : most;
			k++;
		}
		if (!k)
			continue;
		dim3 grid((unsigned)((most + kWordsPerBlock - 1) / kWordsPerBlock), k);
		hb4_decode_many<<<grid, kThreads, 0, s>>>(m);
		cudaError_t e = cudaGetLastError();
		if (e != cudaSuccess)
			return launch_fail(e);
	}
	return 0;
}
