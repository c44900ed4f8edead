/* codec_cuda.h - the CUDA kernels of the cuda backend: the chunk codecs
 * (device/codec_cuda.cu), dequantization (device/dequant_cuda.cu), an
 * activation's FP8 rows (device/fp8rows_cuda.cu) and a one-byte matrix's
 * transpose (device/transpose_cuda.cu); plain C,
 * CUDA builds only. */
#ifndef ARENA_CODEC_CUDA_H
#define ARENA_CODEC_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

struct arena_hb4;

#ifdef __cplusplus
extern "C" {
#endif

/* Queue on s the decode of raw bytes [a, z) of an hb4 chunk into dst (z - a
 * bytes of device memory): the chunk's stored bytes are in device memory at
 * src, v is the host's check of them (formats/codec.h). The caller has
 * checked the arguments (a, z even, a < z <= 2 * v->words, v's offsets
 * those of its counts) and made the device of dst, src and s current. Never
 * reads v's host planes (they may be NULL). Returns 0 or
 * ARENA_E(DEV_ERROR) with a message when a launch fails. */
int arena__hb4_decode_cuda(void *dst, const void *src, const struct arena_hb4 *v, uint64_t a, uint64_t z,
			   cudaStream_t s);

/* The same for n jobs (backend.h's arena_hb4_job), as few launches as
 * they allow: aligned ranges from word 0 share launches of up to 16, the
 * others go one by one. */
struct arena_hb4_job;
int arena__hb4_decode_many_cuda(const struct arena_hb4_job *jobs, size_t n_jobs, cudaStream_t s);

/* Queue on s the dequantization j describes (dequant.h; dequant_cuda.cu):
 * the caller has checked the job (dtypes, counts) and made the device of its
 * pointers and of s current. Returns 0 or ARENA_E(DEV_ERROR) with a message
 * when the launch fails. */
struct arena_dequant_job;
int arena__dequant_cuda(const struct arena_dequant_job *j, cudaStream_t s);

/* Queue on s the FP8 e4m3 rows of x (BF16 [rows, cols], device memory) into
 * q (rows x cols bytes) and scale (rows floats): fp8rows_cuda.cu. The caller
 * has checked the arguments (rows < 2^31) and made the device current.
 * Returns 0 or ARENA_E(DEV_ERROR) with a message when the launch fails. */
int arena__fp8_rows_cuda(const void *x, uint64_t rows, uint64_t cols, const float *col_scale, void *q, float *scale,
			  cudaStream_t s);

/* Queue on s the transpose of x (rows x cols bytes, device memory) into t
 * (cols x rows): transpose_cuda.cu. The caller has checked the arguments
 * and made the device current. Returns 0 or ARENA_E(DEV_ERROR) with a
 * message when the launch fails. */
int arena__transpose8_cuda(const void *x, uint64_t rows, uint64_t cols, void *t, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
