/* backend.c - picking a device backend by name, and the CUDA stub for
 * builds without the toolkit. The backends call nothing here: what their
 * decodes check is the codec's (formats/codec.h, arena_hb4_decode_args). */
#include "backend.h"

#include <string.h>

#include "../common/err.h"

int arena_backend_create(const char *name, int device, const arena_sim_opts *sim, arena_backend **out)
{
	*out = NULL;
	if (name && !strcmp(name, "cuda"))
		return arena_backend_cuda_create(device, out);
	if (name && !strcmp(name, "sim"))
		return arena_backend_sim_create(sim, out);
	return arena_errorf(ARENA_E_USAGE, "unknown backend '%s' (cuda, sim)", arena_q(name));
}

#ifndef ARENA_HAVE_CUDA
int arena_backend_cuda_create(int device, arena_backend **out)
{
	(void)device;
	*out = NULL;
	return arena_errorf(ARENA_E_NO_DEVICE, "cuda: no CUDA device (arena was built without CUDA)");
}

int arena_backend_cuda_stream(arena_backend *b, arena_stream *s, void **native)
{
	(void)b;
	(void)s;
	*native = NULL;
	return arena_errorf(ARENA_E_NO_DEVICE, "cuda: no CUDA device (arena was built without CUDA)");
}
#endif
