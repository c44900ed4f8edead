/* backend.h - the device backend ops table: everything arena asks of a GPU.
 *
 * Two implementations: `cuda` (device/backend_cuda.c, CUDA runtime) and `sim`
 * (device/backend_sim.c, the low-VRAM simulator: device memory is host memory
 * under a capacity, copies run on worker threads at a configurable bandwidth,
 * events are sequence numbers, outside memory pressure can be injected).
 * Shared logic (loader, engine) calls only through this table; a differential
 * test checks that both give the same device bytes.
 *
 * Conventions: every op returns 0 or a negative ARENA_E code with a message
 * (arena_last_error). Streams and events are opaque handles owned by the
 * backend; destroy accepts NULL. Ops on one stream run in order; work on
 * different streams may overlap. A backend is used from several threads:
 * copy_h2d and event ops are thread-safe (the loader's readers issue copies
 * from many threads), create/destroy of the backend itself is not.
 */
#ifndef ARENA_BACKEND_H
#define ARENA_BACKEND_H

#include <stddef.h>
#include <stdint.h>

typedef struct arena_backend arena_backend;
typedef struct arena_stream arena_stream;
typedef struct arena_event arena_event;
struct arena_hb4;
struct arena_dequant_job; /* dequant.h */

/* One decode of decode_hb4_many. */
typedef struct arena_hb4_job {
	void *dst;
	const void *src;
	const struct arena_hb4 *v;
	uint64_t a, z;
} arena_hb4_job;

typedef struct arena_backend_ops {
	const char *name; /* "cuda" or "sim" */

	/* Free and total device memory as the device sees it now (for sim:
	 * capacity minus allocations minus injected pressure). */
	int (*mem_info)(arena_backend *b, uint64_t *free_bytes, uint64_t *total_bytes);
	/* The device memory this process holds as the driver counts it: its
	 * context and loaded modules and every allocation of every library in
	 * it, this backend's included. 0, or NOT_FOUND when the backend cannot
	 * tell (cuda: no NVML, or NVML does not list the process; device/nvml.h).
	 * sim: its modelled context + the rest of the process + allocations. */
	int (*proc_mem)(arena_backend *b, uint64_t *bytes);
	/* Device memory. Out of memory is ARENA_E(DEV_OOM), never a crash. */
	int (*dev_alloc)(arena_backend *b, uint64_t bytes, void **dptr);
	void (*dev_free)(arena_backend *b, void *dptr);

	/* Pin `bytes` of existing host memory at p in place (page-locked, DMA
	 * capable); unregister undoes it. The memory must be writable when it
	 * is registered (CUDA refuses read-only pages; mprotect afterwards is
	 * fine). For sim, a ledger plus that writability check. */
	int (*host_register)(arena_backend *b, void *p, uint64_t bytes);
	/* The same for memory mapped read-only (a region another process
	 * loaded and sealed against writes: device/hostshare.h): the device
	 * only reads it (cuda: cudaHostRegisterReadOnly, where the device
	 * supports it; DEV_ERROR where not, and the memory stays pageable).
	 * host_unregister undoes it. */
	int (*host_register_ro)(arena_backend *b, void *p, uint64_t bytes);
	void (*host_unregister)(arena_backend *b, void *p);

	int (*stream_create)(arena_backend *b, arena_stream **s);
	/* A stream whose kernels go ahead of other streams' when both wait for
	 * the device (cuda: the highest stream priority); NULL: stream_create. */
	int (*stream_create_urgent)(arena_backend *b, arena_stream **s);
	void (*stream_destroy)(arena_backend *b, arena_stream *s);
	/* Block until all work queued on s is done. */
	int (*stream_sync)(arena_backend *b, arena_stream *s);

	/* Queue a host-to-device copy on s. src must stay valid and unchanged
	 * until the copy is done (record an event after it to know). */
	int (*copy_h2d)(arena_backend *b, void *dst, const void *src, uint64_t bytes, arena_stream *s);
	/* Synchronous device-to-host copy (tests and checks only, not a hot path). */
	int (*copy_d2h_sync)(arena_backend *b, void *dst, const void *src, uint64_t bytes);

	int (*event_create)(arena_backend *b, arena_event **e);
	void (*event_destroy)(arena_backend *b, arena_event *e);
	/* Mark the point in s reached by the work queued so far. */
	int (*event_record)(arena_backend *b, arena_event *e, arena_stream *s);
	/* 1 if the recorded work is done, 0 if not, negative on error. An event
	 * never recorded is done. */
	int (*event_query)(arena_backend *b, arena_event *e);
	int (*event_sync)(arena_backend *b, arena_event *e);
	/* Make future work on s wait for e (without blocking the host). */
	int (*stream_wait)(arena_backend *b, arena_stream *s, arena_event *e);
	/* The stream a caller of the public API names by its native handle
	 * (borrowed: never destroy it). cuda: the cudaStream_t itself, NULL
	 * being the default stream. sim: native must be NULL (USAGE otherwise)
	 * and gives the backend's host stream, which stands for a caller
	 * computing on the host: stream_wait on it blocks the calling thread
	 * until the event is done, an event recorded on it is done at once
	 * (timed: stamped now), stream_sync returns at once; copies, decodes
	 * and modelled compute are refused there (USAGE). */
	int (*stream_native)(arena_backend *b, void *native, arena_stream **s);

	/* Timing. A timed event is an event that also knows when the work before
	 * it was done (cuda: a timing event; sim: a marker its stream's worker
	 * stamps). event_elapsed gives z's time minus a's, in seconds, once both
	 * are done: 0, 1 when one is not done yet, or an error (USAGE for an
	 * event never recorded or not timed). */
	int (*event_create_timed)(arena_backend *b, arena_event **e);
	int (*event_elapsed)(arena_backend *b, arena_event *a, arena_event *z, double *seconds);

	/* Decode raw bytes [a, z) (even, z <= 2 * v->words) of an hb4 chunk
	 * (formats/codec.h) into device memory at dst, queued on s. The chunk's
	 * stored bytes are in device memory at src (copied there earlier on s);
	 * v is the host's check of the same bytes (arena_hb4_parse or the
	 * streaming arena_hb4_check_end): the backend takes the plane
	 * offsets, table and counts from it and never reads v's host planes
	 * (they may be NULL). cuda: one kernel; sim: the CPU decoder on the
	 * stream's worker. */
	int (*decode_hb4)(arena_backend *b, void *dst, const void *src, const struct arena_hb4 *v, uint64_t a, uint64_t z,
			  arena_stream *s);

	/* n decodes queued on s, each as decode_hb4 with its own arguments,
	 * in as few launches as the backend can (cuda: up to 16 a kernel);
	 * NULL: call decode_hb4 for each. */
	int (*decode_hb4_many)(arena_backend *b, const struct arena_hb4_job *jobs, size_t n, arena_stream *s);

	/* The dequantization j describes (dequant.h), its src and scale in device
	 * memory, dst in device memory (cuda) or any host memory (sim: the
	 * caller's, a torch tensor), after the work queued on s so far. cuda:
	 * one kernel queued on s; sim: s's queued work waited for, then done on
	 * the calling thread before it returns. The caller has checked j
	 * (arena__dequant_args). */
	int (*dequant)(arena_backend *b, const struct arena_dequant_job *j, arena_stream *s);

	/* x (BF16 [rows, cols]; with col_scale, each element times its
	 * column's f32 scale first, in f32) to FP8 e4m3 a row: q (rows x cols
	 * bytes) and scale (rows floats), the rule of formats/elem.h's
	 * arena__e4m3_row_scale and arena__f32_to_e4m3_sat, after the work queued
	 * on s so far. cuda: device memory, one kernel queued on s; sim: host
	 * memory (a torch CPU tensor's), s's queued work waited for, then done on
	 * the calling thread. The caller has checked the arguments. */
	int (*fp8_rows)(arena_backend *b, const void *x, uint64_t rows, uint64_t cols, const float *col_scale, void *q,
			float *scale, arena_stream *s);
	/* x (rows x cols one-byte elements, row-major) transposed into t (cols
	 * x rows: t[c][r] = x[r][c]), after the work queued on s so far; the
	 * same memory rules as fp8_rows. The caller has checked the
	 * arguments (x and t do not overlap). */
	int (*transpose8)(arena_backend *b, const void *x, uint64_t rows, uint64_t cols, void *t, arena_stream *s);

	void (*destroy)(arena_backend *b);
} arena_backend_ops;

struct arena_backend {
	const arena_backend_ops *ops;
	/* Device allocations are rounded up to a multiple of this (what free
	 * memory loses beyond the bytes asked for): the engine counts it as its
	 * own use, not as another program's. cuda: 2 MiB; sim: its option. */
	uint64_t alloc_granularity;
};

/* The simulator's modelled copy rate: 0 (unmodelled), or from 1 KB/s to
 * 1e15 B/s. A lower one puts a copy's end past any clock (1e-300 B/s: a
 * 50 KiB copy would end in 5e304 s) and models nothing a device does. */
#define ARENA_SIM_RATE_MIN 1e3
#define ARENA_SIM_RATE_MAX 1e15
static inline int arena_sim_rate_ok(double rate)
{
	return rate == 0 || (rate >= ARENA_SIM_RATE_MIN && rate <= ARENA_SIM_RATE_MAX);
}

typedef struct arena_sim_opts {
	uint64_t capacity;       /* device bytes (default 8 GiB) */
	double h2d_bytes_per_s;  /* modelled copy rate (arena_sim_rate_ok); 0 = as fast as memcpy */
	uint64_t alloc_granularity; /* allocations count rounded up to this (a power of
				     * two; default and at least 256) */
	/* The process's own device memory beside allocations (a CUDA context
	 * and its modules: 0.5-0.7 GiB on an H200): taken from the capacity at
	 * create and counted in proc_mem. 0 = none. */
	uint64_t context;
} arena_sim_opts;

/* The simulator. */
int arena_backend_sim_create(const arena_sim_opts *o, arena_backend **out);
/* Outside memory pressure for sim: `bytes` of device memory taken by
 * "another program" (0 gives it back). Fails with DEV_OOM if it does not fit. */
int arena_backend_sim_pressure(arena_backend *b, uint64_t bytes);
/* The rest of the simulated process (a framework's caching allocator, as
 * torch's) holds `bytes` of the device from now on, replacing what it held:
 * counted in proc_mem and taken from free memory. DEV_OOM, with the rest
 * unchanged, when the device has not that much free beside what the rest
 * holds now (a real allocator's cudaMalloc failing). */
int arena_backend_sim_rest(arena_backend *b, uint64_t bytes);
/* Injected failures: of the device allocations from now on, the first `after`
 * go on as memory allows and the `count` after them fail with DEV_OOM (a
 * cudaMalloc failing because another program took the memory); count 0
 * clears what was set. */
int arena_backend_sim_fail_alloc(arena_backend *b, uint64_t after, uint64_t count);
/* The most device memory the simulated process held (proc_mem) since the
 * backend was made or the last call with reset set, into *peak. */
int arena_backend_sim_peak(arena_backend *b, int reset, uint64_t *peak);
/* Queue `seconds` of modelled compute on a sim stream (for the engine's benchmarks). */
int arena_backend_sim_compute(arena_backend *b, arena_stream *s, double seconds);

/* CUDA on `device`. Without a usable device or driver: NO_DEVICE with the
 * reason. Without a CUDA build: NO_DEVICE ("built without CUDA"). */
int arena_backend_cuda_create(int device, arena_backend **out);

/* The CUDA stream behind `s` of the cuda backend `b`, for libraries that
 * queue their own work on it (cuBLAS): writes the cudaStream_t to *native
 * and makes b's device current on the calling thread. USAGE when b is not a
 * cuda backend; NO_DEVICE in a build without CUDA. */
int arena_backend_cuda_stream(arena_backend *b, arena_stream *s, void **native);

/* By name: "cuda" or "sim" (sim options may be NULL for defaults). */
int arena_backend_create(const char *name, int device, const arena_sim_opts *sim, arena_backend **out);

static inline void arena_backend_destroy(arena_backend *b)
{
	if (b)
		b->ops->destroy(b);
}

#endif
