/* gemm.c - the synthetic GEMM's stubs for builds without CUDA (the real one
 * is gemm_cuda.c). */
#include "gemm.h"

#include "../common/err.h"

#ifndef ARENA_HAVE_CUDA
int arena_gemm_create(arena_backend *b, arena_stream *s, uint32_t rows, uint64_t max_params, arena_gemm **out)
{
	(void)b;
	(void)s;
	(void)rows;
	(void)max_params;
	*out = NULL;
	return arena_errorf(ARENA_E_NO_DEVICE, "cuda: no CUDA device (arena was built without CUDA)");
}

int arena_gemm_run(arena_gemm *g, arena_stream *s, const void *w, uint64_t params)
{
	(void)g;
	(void)s;
	(void)w;
	(void)params;
	return arena_errorf(ARENA_E_NO_DEVICE, "cuda: no CUDA device (arena was built without CUDA)");
}

void arena_gemm_free(arena_gemm *g)
{
	(void)g;
}
#endif
