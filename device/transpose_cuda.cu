/* transpose_cuda.cu - a matrix of one-byte elements transposed on the GPU
 * (arena_fp8_transpose): an FP8 weight [N, K] as [K, N], the column-major
 * operand torch._scaled_mm takes for the input's gradient (grad @ W reduces
 * over N, and Hopper's FP8 products read both operands along the reduced
 * dimension).
 *
 * Tiles of 128 x 128 bytes, 256 threads a tile: each thread loads four
 * 16-byte words of the tile's rows into shared memory (rows 144 bytes apart:
 * 16-byte aligned, and the reads below fall on distinct banks), then builds
 * four output rows of 16 bytes from a 16 x 4 block of it, read as sixteen
 * 32-bit words and transposed in registers four bytes at a time
 * (__byte_perm), and stores them as 16-byte words. The rows and columns
 * must be multiples of 16 and both pointers 16-byte aligned (every 16-byte
 * word is then wholly inside the matrix or wholly outside: the last tiles
 * are partial by whole words); other shapes go by a byte a thread. */
#include <stdint.h>

#include "arena.h"
#include "codec_cuda.h"

extern "C" {
/* From common/err.h, which is C11 only (_Noreturn). */
int arena_errorf(int code, const char *fmt, ...);
}

namespace {

const unsigned kTile = 128;	      /* bytes a side */
const unsigned kRow = kTile + 16;     /* a tile row in shared memory, bytes */
const unsigned kThreads = 256;

/* The 4 x 4 bytes of rows a, b, c, d (one 32-bit word each) transposed:
 * word i of the result holds byte i of a, b, c and d, in that order. */
__device__ __forceinline__ void t4(uint32_t a, uint32_t b, uint32_t c, uint32_t d, uint32_t o[4])
{
	const uint32_t ab_lo = __byte_perm(a, b, 0x5140), ab_hi = __byte_perm(a, b, 0x7362);
	const uint32_t cd_lo = __byte_perm(c, d, 0x5140), cd_hi = __byte_perm(c, d, 0x7362);
	o[0] = __byte_perm(ab_lo, cd_lo, 0x5410);
	o[1] = __byte_perm(ab_lo, cd_lo, 0x7632);
	o[2] = __byte_perm(ab_hi, cd_hi, 0x5410);
	o[3] = __byte_perm(ab_hi, cd_hi, 0x7632);
}

__global__ void __launch_bounds__(kThreads) t_vec(const uint8_t *__restrict__ x, uint64_t rows, uint64_t cols,
						  uint8_t *__restrict__ t, uint64_t col_tiles, uint64_t tiles)
{
	__shared__ __align__(16) uint8_t sh[kTile * kRow];
	const unsigned tid = threadIdx.x;
	for (uint64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
		const uint64_t r0 = tile / col_tiles * kTile, c0 = tile % col_tiles * kTile;
		/* in: 128 rows of 8 words; thread tid loads rows tid / 8 + 32 i, word tid % 8 */
		const unsigned w = tid % 8;
		for (unsigned i = 0; i < 4; i++) {
			const unsigned r = tid / 8 + 32 * i;
			if (r0 + r < rows && c0 + 16 * w < cols)
				*(uint4 *)(sh + r * kRow + 16 * w) = *(const uint4 *)(x + (r0 + r) * cols + c0 + 16 * w);
		}
		__syncthreads();
		/* out: thread tid makes output rows c0 + 4 j .. + 3 (input columns), bytes
		 * r0 + 16 k .. + 15 of them (input rows); a warp shares k, its lanes take
		 * consecutive j: the words each lane reads are on distinct banks */
		const unsigned j = tid % 32, k = tid / 32;
		if (c0 + 4 * j < cols && r0 + 16 * k < rows) {
			uint32_t o[4][4]; /* [output row][word] */
			for (unsigned q = 0; q < 4; q++) {
				const uint8_t *p = sh + (16 * k + 4 * q) * kRow + 4 * j;
				uint32_t v[4];
				t4(*(const uint32_t *)p, *(const uint32_t *)(p + kRow), *(const uint32_t *)(p + 2 * kRow),
				   *(const uint32_t *)(p + 3 * kRow), v);
				for (unsigned m = 0; m < 4; m++)
					o[m][q] = v[m];
			}
			for (unsigned m = 0; m < 4; m++)
				*(uint4 *)(t + (c0 + 4 * j + m) * rows + r0 + 16 * k) =
					make_uint4(o[m][0], o[m][1], o[m][2], o[m][3]);
		}
		__syncthreads();
	}
}

/* Any shape and alignment: 32 x 32 tiles, a byte a thread. */
__global__ void t_any(const uint8_t *__restrict__ x, uint64_t rows, uint64_t cols, uint8_t *__restrict__ t,
		      uint64_t col_tiles, uint64_t tiles)
{
	__shared__ uint8_t sh[32][33];
	const unsigned tx = threadIdx.x % 32, ty = threadIdx.x / 32; /* 256 threads: 8 rows at a time */
	for (uint64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
		const uint64_t r0 = tile / col_tiles * 32, c0 = tile % col_tiles * 32;
		for (unsigned r = ty; r < 32; r += 8)
			if (r0 + r < rows && c0 + tx < cols)
				sh[r][tx] = x[(r0 + r) * cols + c0 + tx];
		__syncthreads();
		for (unsigned c = ty; c < 32; c += 8)
			if (c0 + c < cols && r0 + tx < rows)
				t[(c0 + c) * rows + r0 + tx] = sh[tx][c];
		__syncthreads();
	}
}

} // namespace

extern "C" int arena__transpose8_cuda(const void *x, uint64_t rows, uint64_t cols, void *t, cudaStream_t s)
{
	if (!rows || !cols)
		return 0;
	const uint8_t *xs = (const uint8_t *)x;
	uint8_t *ts = (uint8_t *)t;
	const bool vec = rows % 16 == 0 && cols % 16 == 0 && !((uintptr_t)x & 15) && !((uintptr_t)t & 15);
	const uint64_t side = vec ? kTile : 32;
	const uint64_t col_tiles = (cols + side - 1) / side, tiles = (rows + side - 1) / side * col_tiles;
	const unsigned grid = (unsigned)(tiles < (1u << 20) ? tiles : (1u << 20));
	if (vec)
		t_vec<<<grid, kThreads, 0, s>>>(xs, rows, cols, ts, col_tiles, tiles);
	else
		t_any<<<grid, 256, 0, s>>>(xs, rows, cols, ts, col_tiles, tiles);
	const cudaError_t e = cudaGetLastError();
	if (e != cudaSuccess)
		return arena_errorf(ARENA_E(DEV_ERROR), "cuda: transposing %llu x %llu bytes: %s", (unsigned long long)rows,
				    (unsigned long long)cols, cudaGetErrorString(e));
	return 0;
}
