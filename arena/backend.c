/* backend.c - picking a device backend by name; what the backends share;
 * the CUDA stub for builds without the toolkit. */
#include "backend.h"

#include <string.h>

#include "../common/err.h"
#include "../formats/codec.h"

int arena__backend_hb4_args(const char *name, void *dst, const void *src, const struct arena_hb4 *v, uint64_t a,
			    uint64_t z)
{
	if (!v || !dst || !src)
		return arena_errorf(ARENA_E_USAGE, "%s: decode_hb4 with a NULL %s", name,
				    !v ? "chunk" : !dst ? "destination" : "source");
	const uint64_t W = v->words, E = v->n_exc;
	if (!W || W > UINT32_MAX / 2 || E > W || v->nib_off != arena_hb4_nib_off() || v->low_off != arena_hb4_low_off(W) ||
	    v->idx_off != arena_hb4_idx_off(W) || v->hi_off != v->idx_off + 4 * E)
		return arena_errorf(ARENA_E_USAGE, "%s: decode_hb4: the chunk is not an hb4 parse (%llu words, %llu exceptions)",
				    name, (unsigned long long)W, (unsigned long long)E);
	if (a % 2 || z % 2 || a > z || z > 2 * W)
		return arena_errorf(ARENA_E_USAGE,
				    "%s: decode_hb4 of raw bytes [%llu, %llu): not an even range within the chunk's %llu bytes",
				    name, (unsigned long long)a, (unsigned long long)z, (unsigned long long)(2 * W));
	return 0;
}

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
