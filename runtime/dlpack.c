/* dlpack.c - DLPack managed tensors over an arena's memory (include/arena.h,
 * arena_dlpack). The struct and its deleter live here, in C, so a consumer
 * (torch, numpy, a C runtime) that frees a tensor late - during an
 * interpreter's shutdown, from a thread of its own - calls no code of the
 * language that made it, only arena_release. */
#include <inttypes.h>
#include <stdint.h>

#include "../common/alloc.h"
#include "../common/err.h"
#include "open.h"

/* DLPack's ABI (dlpack.h, v0.8 and later: DLManagedTensor, unversioned). */
typedef struct {
	int32_t device_type;
	int32_t device_id;
} dl_device;

typedef struct {
	uint8_t code;
	uint8_t bits;
	uint16_t lanes;
} dl_dtype;

typedef struct {
	void *data;
	dl_device device;
	int32_t ndim;
	dl_dtype dtype;
	int64_t *shape;
	int64_t *strides;
	uint64_t byte_offset;
} dl_tensor;

typedef struct dl_managed {
	dl_tensor dl_tensor;
	void *manager_ctx;
	void (*deleter)(struct dl_managed *self);
} dl_managed;

/* What arena_dlpack allocates: the managed tensor and its one-element shape. */
typedef struct {
	dl_managed m;
	int64_t shape[1];
} dl_owned;

static void dl_delete(dl_managed *self)
{
	if (!self)
		return;
	arena_release(self->manager_ctx);
	arena_free(self);
}

int arena_dlpack(arena *a, void *data, uint64_t nbytes, int device_type, int device_id, void **out)
{
	if (!out)
		return arena_errorf(ARENA_E_USAGE, "arena_dlpack: out is NULL");
	*out = NULL;
	if (nbytes > INT64_MAX)
		return arena_errorf(ARENA_E_USAGE, "arena_dlpack: %" PRIu64 " bytes do not fit a DLPack shape", nbytes);
	if (device_type != 1 && device_type != 2 && device_type != 3)
		return arena_errorf(ARENA_E_USAGE, "arena_dlpack: device type %d is not kDLCPU (1), kDLCUDA (2) or kDLCUDAHost (3)",
				    device_type);
	if (!data && nbytes)
		return arena_errorf(ARENA_E_USAGE, "arena_dlpack: data is NULL");
	dl_owned *o = arena_calloc(1, sizeof(*o));
	if (!o)
		return arena_errorf(ARENA_E_NOMEM, "arena_dlpack: out of memory");
	int rc = arena__enter_open(a, "arena_dlpack"); /* the reference the tensor holds */
	if (rc) {
		arena_free(o);
		return rc;
	}
	o->shape[0] = (int64_t)nbytes;
	o->m.dl_tensor.data = data;
	o->m.dl_tensor.device = (dl_device){device_type, device_id};
	o->m.dl_tensor.ndim = 1;
	o->m.dl_tensor.dtype = (dl_dtype){1, 8, 1}; /* kDLUInt, 8 bits, 1 lane */
	o->m.dl_tensor.shape = o->shape;
	o->m.manager_ctx = a;
	o->m.deleter = dl_delete;
	*out = &o->m;
	return 0;
}
