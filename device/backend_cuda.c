/* backend_cuda.c - the CUDA backend: thin wrappers over the CUDA runtime API.
 *
 * Plain C against cuda_runtime_api.h; the runtime is linked statically, so a
 * binary needs only the driver and says NO_DEVICE on a machine without one.
 * The kernels (the hb4 decoder) are in codec_cuda.cu, built by nvcc.
 *
 * Handles: an arena_stream * is the cudaStream_t itself and an arena_event *
 * the cudaEvent_t (neither is ever NULL when created), so no op allocates
 * host memory.
 *
 * The current device is per host thread in CUDA: every op first makes the
 * backend's device current on the calling thread (the loader calls from
 * threads of its own), which leaves it current there afterwards.
 *
 * Unlike sim, destroy does not free streams, events, device memory or
 * registrations the caller left: free them first (the process's exit or
 * cudaDeviceReset would).
 */
#include "backend.h"

#include <cuda_runtime_api.h>
#include <stdio.h>

#include "../common/alloc.h"
#include "../common/err.h"
#include "../formats/codec.h"
#include "../formats/dequant.h"
#include "codec_cuda.h"
#include "nvml.h"

typedef struct cuda_backend {
	arena_backend base;
	int device;
	char bus_id[32]; /* its PCI bus id, for NVML (proc_mem) */
} cuda_backend;

static const arena_backend_ops cuda_ops;

/* DEV_ERROR for a failed call, with CUDA's words; clears the runtime's last
 * error so that a later cudaGetLastError does not report it again. */
static int cuda_fail(cudaError_t e, const char *call)
{
	(void)cudaGetLastError();
	return arena_errorf(ARENA_E(DEV_ERROR), "cuda: %s: %s", call, cudaGetErrorString(e));
}

/* Make b's device current on this thread. */
static int cuda_bind(cuda_backend *b)
{
	int cur = -1;
	cudaError_t e = cudaGetDevice(&cur);
	if (e == cudaSuccess && cur != b->device)
		e = cudaSetDevice(b->device);
	return e == cudaSuccess ? 0 : cuda_fail(e, "cudaSetDevice");
}

static int cuda_mem_info(arena_backend *base, uint64_t *free_bytes, uint64_t *total_bytes)
{
	cuda_backend *b = (cuda_backend *)base;
	size_t f = 0, t = 0;
	int rc = cuda_bind(b);
	cudaError_t e;
	if (!rc && (e = cudaMemGetInfo(&f, &t)) != cudaSuccess)
		rc = cuda_fail(e, "cudaMemGetInfo");
	*free_bytes = rc ? 0 : f;
	*total_bytes = rc ? 0 : t;
	return rc;
}

static int cuda_proc_mem(arena_backend *base, uint64_t *bytes)
{
	cuda_backend *b = (cuda_backend *)base;
	*bytes = 0;
	if (!b->bus_id[0])
		return arena_errorf(ARENA_E_NOT_FOUND, "cuda: device %d has no PCI bus id to find it in NVML", b->device);
	return arena_nvml_process_used(b->bus_id, bytes, NULL);
}

static int cuda_dev_alloc(arena_backend *base, uint64_t bytes, void **dptr)
{
	cuda_backend *b = (cuda_backend *)base;
	int rc = 0;
	cudaError_t e;
	*dptr = NULL;
	if (!bytes)
		return arena_errorf(ARENA_E_USAGE, "cuda: cannot allocate 0 bytes");
	if (bytes > SIZE_MAX)
		return arena_errorf(ARENA_E(DEV_OOM), "cuda: cannot allocate %llu bytes", (unsigned long long)bytes);
	rc = cuda_bind(b);
	if (!rc && (e = cudaMalloc(dptr, (size_t)bytes)) != cudaSuccess) {
		*dptr = NULL;
		if (e == cudaErrorMemoryAllocation) {
			(void)cudaGetLastError();
			size_t f = 0, t = 0;
			if (cudaMemGetInfo(&f, &t) != cudaSuccess)
				(void)cudaGetLastError();
			rc = arena_errorf(ARENA_E(DEV_OOM), "cuda: cannot allocate %llu bytes, %llu free of %llu",
					  (unsigned long long)bytes, (unsigned long long)f, (unsigned long long)t);
		} else {
			rc = cuda_fail(e, "cudaMalloc");
		}
	}
	return rc;
}

/* A failure here (a device already in error) cannot be reported: cleared. */
static void cuda_dev_free(arena_backend *base, void *dptr)
{
	if (!dptr)
		return;
	if (cuda_bind((cuda_backend *)base) || cudaFree(dptr) != cudaSuccess)
		(void)cudaGetLastError();
}

static int cuda_host_register(arena_backend *base, void *p, uint64_t bytes)
{
	cuda_backend *b = (cuda_backend *)base;
	cudaError_t e;
	if (!p || !bytes)
		return arena_errorf(ARENA_E_USAGE, "cuda: host_register of %s", p ? "0 bytes" : "a NULL pointer");
	int rc = cuda_bind(b);
	if (!rc && (e = cudaHostRegister(p, (size_t)bytes, cudaHostRegisterDefault)) != cudaSuccess)
		rc = cuda_fail(e, "cudaHostRegister");
	return rc;
}

/* Read-only pages: cudaHostRegisterReadOnly, where the device says it
 * takes it (cudaDevAttrHostRegisterReadOnlySupported). */
static int cuda_host_register_ro(arena_backend *base, void *p, uint64_t bytes)
{
	cuda_backend *b = (cuda_backend *)base;
	cudaError_t e;
	int ok = 0;
	if (!p || !bytes)
		return arena_errorf(ARENA_E_USAGE, "cuda: host_register of %s", p ? "0 bytes" : "a NULL pointer");
	int rc = cuda_bind(b);
	if (!rc && (e = cudaDeviceGetAttribute(&ok, cudaDevAttrHostRegisterReadOnlySupported, b->device)) != cudaSuccess)
		rc = cuda_fail(e, "cudaDeviceGetAttribute");
	if (!rc && !ok)
		rc = arena_errorf(ARENA_E(DEV_ERROR), "cuda: device %d cannot pin read-only host memory", b->device);
	if (!rc && (e = cudaHostRegister(p, (size_t)bytes, cudaHostRegisterReadOnly)) != cudaSuccess)
		rc = cuda_fail(e, "cudaHostRegister(read-only)");
	return rc;
}

static void cuda_host_unregister(arena_backend *base, void *p)
{
	if (!p)
		return;
	cudaError_t e = cuda_bind((cuda_backend *)base) ? cudaErrorUnknown : cudaHostUnregister(p);
	if (e == cudaErrorHostMemoryNotRegistered)
		ARENA_BUG("cuda: host_unregister of memory that host_register did not register");
	if (e != cudaSuccess)
		(void)cudaGetLastError();
}

static int cuda_stream_create(arena_backend *base, arena_stream **s)
{
	cudaStream_t st = NULL;
	cudaError_t e;
	*s = NULL;
	int rc = cuda_bind((cuda_backend *)base);
	if (!rc && (e = cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking)) != cudaSuccess)
		rc = cuda_fail(e, "cudaStreamCreateWithFlags");
	if (!rc)
		*s = (arena_stream *)st;
	return rc;
}

/* The highest priority the device has: its kernels (the engine's decodes)
 * get the next free multiprocessors ahead of the caller's. */
static int cuda_stream_create_urgent(arena_backend *base, arena_stream **s)
{
	cudaStream_t st = NULL;
	cudaError_t e;
	int least = 0, greatest = 0;
	*s = NULL;
	int rc = cuda_bind((cuda_backend *)base);
	if (!rc && (e = cudaDeviceGetStreamPriorityRange(&least, &greatest)) != cudaSuccess)
		rc = cuda_fail(e, "cudaDeviceGetStreamPriorityRange");
	if (!rc && (e = cudaStreamCreateWithPriority(&st, cudaStreamNonBlocking, greatest)) != cudaSuccess)
		rc = cuda_fail(e, "cudaStreamCreateWithPriority");
	if (!rc)
		*s = (arena_stream *)st;
	return rc;
}

/* Returns at once; CUDA releases the stream once its work is done. */
static void cuda_stream_destroy(arena_backend *base, arena_stream *s)
{
	if (s && cudaStreamDestroy((cudaStream_t)s) != cudaSuccess)
		(void)cudaGetLastError();
}

static int cuda_stream_sync(arena_backend *base, arena_stream *s)
{
	cudaError_t e = cudaStreamSynchronize((cudaStream_t)s);
	return e == cudaSuccess ? 0 : cuda_fail(e, "cudaStreamSynchronize");
}

static int cuda_copy_h2d(arena_backend *base, void *dst, const void *src, uint64_t bytes, arena_stream *s)
{
	if (!bytes)
		return 0;
	int rc = cuda_bind((cuda_backend *)base);
	cudaError_t e;
	if (!rc && (e = cudaMemcpyAsync(dst, src, (size_t)bytes, cudaMemcpyHostToDevice, (cudaStream_t)s)) != cudaSuccess)
		rc = cuda_fail(e, "cudaMemcpyAsync");
	return rc;
}

static int cuda_copy_d2h_sync(arena_backend *base, void *dst, const void *src, uint64_t bytes)
{
	if (!bytes)
		return 0;
	int rc = cuda_bind((cuda_backend *)base);
	cudaError_t e;
	if (!rc && (e = cudaMemcpy(dst, src, (size_t)bytes, cudaMemcpyDeviceToHost)) != cudaSuccess)
		rc = cuda_fail(e, "cudaMemcpy");
	return rc;
}

static int cuda_event_create(arena_backend *base, arena_event **out)
{
	cudaEvent_t ev = NULL;
	cudaError_t e;
	*out = NULL;
	int rc = cuda_bind((cuda_backend *)base);
	if (!rc && (e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming)) != cudaSuccess)
		rc = cuda_fail(e, "cudaEventCreateWithFlags");
	if (!rc)
		*out = (arena_event *)ev;
	return rc;
}

static int cuda_event_create_timed(arena_backend *base, arena_event **out)
{
	cudaEvent_t ev = NULL;
	cudaError_t e;
	*out = NULL;
	int rc = cuda_bind((cuda_backend *)base);
	if (!rc && (e = cudaEventCreate(&ev)) != cudaSuccess)
		rc = cuda_fail(e, "cudaEventCreate");
	if (!rc)
		*out = (arena_event *)ev;
	return rc;
}

static int cuda_event_elapsed(arena_backend *base, arena_event *a, arena_event *z, double *seconds)
{
	float ms = 0;
	*seconds = 0;
	cudaError_t e = cudaEventElapsedTime(&ms, (cudaEvent_t)a, (cudaEvent_t)z);
	if (e == cudaErrorNotReady) {
		(void)cudaGetLastError();
		return 1;
	}
	if (e != cudaSuccess)
		return cuda_fail(e, "cudaEventElapsedTime");
	*seconds = (double)ms * 1e-3;
	return 0;
}

static void cuda_event_destroy(arena_backend *base, arena_event *e)
{
	if (e && cudaEventDestroy((cudaEvent_t)e) != cudaSuccess)
		(void)cudaGetLastError();
}

static int cuda_event_record(arena_backend *base, arena_event *ev, arena_stream *s)
{
	cudaError_t e = cudaEventRecord((cudaEvent_t)ev, (cudaStream_t)s);
	return e == cudaSuccess ? 0 : cuda_fail(e, "cudaEventRecord");
}

static int cuda_event_query(arena_backend *base, arena_event *ev)
{
	cudaError_t e = cudaEventQuery((cudaEvent_t)ev);
	if (e == cudaSuccess)
		return 1;
	if (e == cudaErrorNotReady)
		return 0;
	return cuda_fail(e, "cudaEventQuery");
}

static int cuda_event_sync(arena_backend *base, arena_event *ev)
{
	cudaError_t e = cudaEventSynchronize((cudaEvent_t)ev);
	return e == cudaSuccess ? 0 : cuda_fail(e, "cudaEventSynchronize");
}

static int cuda_stream_wait(arena_backend *base, arena_stream *s, arena_event *ev)
{
	cudaError_t e = cudaStreamWaitEvent((cudaStream_t)s, (cudaEvent_t)ev, 0);
	return e == cudaSuccess ? 0 : cuda_fail(e, "cudaStreamWaitEvent");
}

/* A native handle is a cudaStream_t, and so is an arena_stream * here;
 * NULL is the default stream. */
static int cuda_stream_native(arena_backend *base, void *native, arena_stream **s)
{
	*s = (arena_stream *)native;
	return 0;
}

/* The kernels are in codec_cuda.cu. The arguments are checked here as sim
 * checks them, except that device pointers are not checked (CUDA reports a
 * bad one when the kernel runs, at the next sync). */
static int cuda_decode_hb4(arena_backend *base, void *dst, const void *src, const struct arena_hb4 *v, uint64_t a,
			   uint64_t z, arena_stream *s)
{
	int rc = arena_hb4_decode_args("cuda", dst, src, v, a, z);
	if (rc || a == z)
		return rc;
	rc = cuda_bind((cuda_backend *)base);
	if (!rc)
		rc = arena__hb4_decode_cuda(dst, src, v, a, z, (cudaStream_t)s);
	return rc;
}

static int cuda_decode_hb4_many(arena_backend *base, const arena_hb4_job *jobs, size_t n, arena_stream *s)
{
	int rc = 0;
	for (size_t i = 0; i < n && !rc; i++)
		rc = arena_hb4_decode_args("cuda", jobs[i].dst, jobs[i].src, jobs[i].v, jobs[i].a, jobs[i].z);
	if (!rc && n)
		rc = cuda_bind((cuda_backend *)base);
	if (!rc && n)
		rc = arena__hb4_decode_many_cuda(jobs, n, (cudaStream_t)s);
	return rc;
}

/* The kernel is in dequant_cuda.cu; the job was checked by the caller. */
static int cuda_dequant(arena_backend *base, const arena_dequant_job *j, arena_stream *s)
{
	int rc = cuda_bind((cuda_backend *)base);
	if (!rc)
		rc = arena__dequant_cuda(j, (cudaStream_t)s);
	return rc;
}

/* The kernel is in fp8rows_cuda.cu; the arguments were checked by the caller. */
static int cuda_fp8_rows(arena_backend *base, const void *x, uint64_t rows, uint64_t cols, const float *col_scale,
			 void *q, float *scale, arena_stream *s)
{
	int rc = cuda_bind((cuda_backend *)base);
	if (!rc)
		rc = arena__fp8_rows_cuda(x, rows, cols, col_scale, q, scale, (cudaStream_t)s);
	return rc;
}

/* The kernel is in transpose_cuda.cu; the arguments were checked by the caller. */
static int cuda_transpose8(arena_backend *base, const void *x, uint64_t rows, uint64_t cols, void *t, arena_stream *s)
{
	int rc = cuda_bind((cuda_backend *)base);
	if (!rc)
		rc = arena__transpose8_cuda(x, rows, cols, t, (cudaStream_t)s);
	return rc;
}

static void cuda_destroy(arena_backend *base)
{
	arena_free(base);
}

static const arena_backend_ops cuda_ops = {
	.name = "cuda",
	.mem_info = cuda_mem_info,
	.proc_mem = cuda_proc_mem,
	.dev_alloc = cuda_dev_alloc,
	.dev_free = cuda_dev_free,
	.host_register = cuda_host_register,
	.host_register_ro = cuda_host_register_ro,
	.host_unregister = cuda_host_unregister,
	.stream_create = cuda_stream_create,
	.stream_create_urgent = cuda_stream_create_urgent,
	.decode_hb4_many = cuda_decode_hb4_many,
	.stream_destroy = cuda_stream_destroy,
	.stream_sync = cuda_stream_sync,
	.copy_h2d = cuda_copy_h2d,
	.copy_d2h_sync = cuda_copy_d2h_sync,
	.event_create = cuda_event_create,
	.event_destroy = cuda_event_destroy,
	.event_record = cuda_event_record,
	.event_query = cuda_event_query,
	.event_sync = cuda_event_sync,
	.stream_wait = cuda_stream_wait,
	.stream_native = cuda_stream_native,
	.event_create_timed = cuda_event_create_timed,
	.event_elapsed = cuda_event_elapsed,
	.decode_hb4 = cuda_decode_hb4,
	.dequant = cuda_dequant,
	.fp8_rows = cuda_fp8_rows,
	.transpose8 = cuda_transpose8,
	.destroy = cuda_destroy,
};

int arena_backend_cuda_stream(arena_backend *base, arena_stream *s, void **native)
{
	*native = NULL;
	if (!base || base->ops != &cuda_ops || !s)
		return arena_errorf(ARENA_E_USAGE, "cuda: not a stream of the cuda backend");
	int rc = cuda_bind((cuda_backend *)base);
	if (!rc)
		*native = (void *)(cudaStream_t)s;
	return rc;
}

int arena_backend_cuda_create(int device, arena_backend **out)
{
	int n = 0, rc = 0;
	cudaError_t e;
	*out = NULL;
	if ((e = cudaGetDeviceCount(&n)) != cudaSuccess) {
		(void)cudaGetLastError();
		return arena_errorf(ARENA_E_NO_DEVICE, "cuda: no CUDA device (%s)", cudaGetErrorString(e));
	}
	if (n <= 0)
		return arena_errorf(ARENA_E_NO_DEVICE, "cuda: no CUDA device (none found)");
	if (device < 0 || device >= n)
		return arena_errorf(ARENA_E_NO_DEVICE, "cuda: no CUDA device %d (%d found)", device, n);
	/* cudaSetDevice also creates the device's primary context: a broken
	 * device or driver shows here, not at the first copy. */
	if ((e = cudaSetDevice(device)) != cudaSuccess) {
		(void)cudaGetLastError();
		return arena_errorf(ARENA_E_NO_DEVICE, "cuda: device %d is not usable (%s)", device, cudaGetErrorString(e));
	}
	cuda_backend *b = arena_calloc(1, sizeof(*b));
	if (!b) {
		rc = arena_errorf(ARENA_E_NOMEM, "cuda: out of memory");
	} else {
		b->base.ops = &cuda_ops;
		b->base.alloc_granularity = 2ull << 20; /* cudaMalloc rounds large allocations to 2 MiB */
		b->device = device;
		if (cudaDeviceGetPCIBusId(b->bus_id, (int)sizeof(b->bus_id), device) != cudaSuccess) {
			(void)cudaGetLastError();
			b->bus_id[0] = 0; /* proc_mem says NOT_FOUND */
		}
		*out = &b->base;
	}
	return rc;
}
