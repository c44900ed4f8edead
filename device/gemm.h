/* gemm.h - a synthetic compute load on the device: a bf16 GEMM with T rows
 * over a block's weights, the stand-in for a block's compute in `arena bench
 * stream` (2 x T x parameters FLOPs, the cost of a transformer block's
 * forward over T tokens).
 *
 * The block's bytes at w are read as `params` bf16 elements: a matrix W of
 * params / ARENA_GEMM_K rows of ARENA_GEMM_K elements, then a tail of
 * params % ARENA_GEMM_K elements. One run computes C = A x W^T (A: T x K
 * activations, C: T x rows, both device buffers owned by the gemm) in
 * column chunks of at most ARENA_GEMM_CHUNK rows of W that reuse one C
 * buffer, plus one T x 1 product for the tail: exactly 2 x T x params FLOPs.
 * Only the time matters; C is overwritten and never read.
 *
 * cuda only: cuBLAS is loaded at run time (dlopen of $ARENA_CUBLAS if set,
 * then libcublas.so.13, then libcublas.so), never linked, so a binary starts
 * without it and only arena_gemm_create fails ("cuBLAS not found: ...").
 * Builds without CUDA get stubs that fail with NO_DEVICE.
 *
 * Single-threaded: one gemm is used from one thread at a time.
 */
#ifndef ARENA_GEMM_H
#define ARENA_GEMM_H

#include <stdint.h>

#include "backend.h"

#define ARENA_GEMM_K 3072u      /* inner dimension (Flux's hidden size) */
#define ARENA_GEMM_CHUNK 16384u /* rows of W per cuBLAS call (C buffer: T x this at most) */

typedef struct arena_gemm arena_gemm;

/* Load cuBLAS, create a handle on b's device bound to stream s, allocate A
 * (rows x K, filled with values in [-1, 1)) and C (rows x min(chunk, largest
 * W)) through b's dev_alloc, for blocks of up to max_params elements, and
 * run one warm-up product of each shape (so cuBLAS's own device memory is
 * taken now, not in the middle of a measured run). Errors: NO_DEVICE (not a
 * cuda backend, built without CUDA, "cuBLAS not found: ...", a missing
 * symbol), DEV_OOM, DEV_ERROR, USAGE (rows 0 or over INT_MAX). */
int arena_gemm_create(arena_backend *b, arena_stream *s, uint32_t rows, uint64_t max_params, arena_gemm **out);

/* Queue one product over the `params` bf16 elements at device address w on
 * stream s (w must stay valid until the work on s is done). params must be
 * at most the create's max_params (USAGE otherwise); 0 queues nothing. */
int arena_gemm_run(arena_gemm *g, arena_stream *s, const void *w, uint64_t params);

/* Wait for the gemm's work (the device is synchronized), free its buffers
 * and handle; leaves arena_last_error alone. Accepts NULL. */
void arena_gemm_free(arena_gemm *g);

#endif
