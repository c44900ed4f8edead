/* gemm_cuda.c - the synthetic bf16 GEMM on the cuda backend, through cuBLAS
 * loaded at run time (see gemm.h for the shapes and the contract).
 *
 * No CUDA or cuBLAS header is needed: the few cuBLAS types are declared here
 * with the values of cublas_api.h and library_types.h (CUDA 13), device
 * memory comes from the backend's ops and the cudaStream_t from
 * arena_backend_cuda_stream. cuBLAS 13 needs no shared CUDA runtime (only
 * libcublasLt and the driver), and a cudaStream_t is the driver's stream, so
 * its work and ours share the device's primary context and streams.
 *
 * The library stays loaded once opened (no dlclose: cuBLAS registers
 * process-wide state, and unloading it before exit is not worth the risk).
 *
 * Row-major C[T, n] = A[T, K] x W[n, K]^T is, in cuBLAS's column-major
 * terms, C'(n x T) = W'(K x n)^T x A'(K x T): transa = T, transb = N,
 * lda = ldb = K, ldc = n (the layout PyTorch's linear layers use).
 */
#include "gemm.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/alloc.h"
#include "../common/err.h"

/* From cublas_api.h / library_types.h. */
enum {
	CUBLAS_STATUS_SUCCESS_ = 0,
	CUBLAS_OP_N_ = 0,
	CUBLAS_OP_T_ = 1,
	CUDA_R_16BF_ = 14,
	CUBLAS_COMPUTE_32F_ = 68,
	CUBLAS_GEMM_DEFAULT_ = -1,
};
typedef int (*cublas_create_fn)(void **handle);
typedef int (*cublas_destroy_fn)(void *handle);
typedef int (*cublas_set_stream_fn)(void *handle, void *stream);
typedef int (*cublas_gemm_ex_fn)(void *handle, int transa, int transb, int m, int n, int k, const void *alpha,
				 const void *a, int atype, int lda, const void *b, int btype, int ldb, const void *beta,
				 void *c, int ctype, int ldc, int compute, int algo);
typedef const char *(*cublas_status_string_fn)(int status);

typedef struct cublas_api {
	cublas_create_fn create;
	cublas_destroy_fn destroy;
	cublas_set_stream_fn set_stream;
	cublas_gemm_ex_fn gemm_ex;
	cublas_status_string_fn status_string; /* optional */
} cublas_api;

struct arena_gemm {
	arena_backend *be;
	cublas_api api;
	void *handle;      /* cublasHandle_t */
	arena_stream *s;   /* the stream the handle is bound to */
	void *a, *c;       /* device: A (rows x K), C (rows x cols) */
	uint32_t rows;
	uint64_t max_params;
};

static int cublas_fail(const cublas_api *api, int st, const char *call)
{
	const char *why = api->status_string ? api->status_string(st) : NULL;
	return arena_errorf(ARENA_E(DEV_ERROR), "cuBLAS: %s: %s (status %d)", call, why ? why : "failed", st);
}

/* dlopen cuBLAS and look up what we call. */
static int cublas_load(cublas_api *api)
{
	const char *names[] = {getenv("ARENA_CUBLAS"), "libcublas.so.13", "libcublas.so"};
	char why[512] = "";
	void *lib = NULL;
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]) && !lib; i++) {
		if (!names[i] || !*names[i])
			continue;
		lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
		if (!lib) {
			const char *e = dlerror();
			if (!*why)
				snprintf(why, sizeof(why), "%s", e ? e : names[i]);
		}
	}
	if (!lib)
		return arena_errorf(ARENA_E_NO_DEVICE,
				    "cuBLAS not found: %s (install CUDA 13's libcublas or point LD_LIBRARY_PATH or "
				    "ARENA_CUBLAS at it)", why);
	static const char *const syms[] = {"cublasCreate_v2", "cublasDestroy_v2", "cublasSetStream_v2",
					   "cublasGemmEx"};
	void *f[4];
	for (size_t i = 0; i < 4; i++) {
		dlerror();
		if (!(f[i] = dlsym(lib, syms[i])))
			return arena_errorf(ARENA_E_NO_DEVICE, "cuBLAS not found: no %s in the cuBLAS library loaded",
					    syms[i]);
	}
	api->create = (cublas_create_fn)f[0];
	api->destroy = (cublas_destroy_fn)f[1];
	api->set_stream = (cublas_set_stream_fn)f[2];
	api->gemm_ex = (cublas_gemm_ex_fn)f[3];
	api->status_string = (cublas_status_string_fn)dlsym(lib, "cublasGetStatusString");
	return 0;
}

/* Bind the handle to s (cublasSetStream resets cuBLAS's workspace choice:
 * only when the stream changes). */
static int gemm_bind(arena_gemm *g, arena_stream *s)
{
	void *native = NULL;
	int rc = arena_backend_cuda_stream(g->be, s, &native);
	if (rc || s == g->s)
		return rc;
	int st = g->api.set_stream(g->handle, native);
	if (st != CUBLAS_STATUS_SUCCESS_)
		return cublas_fail(&g->api, st, "cublasSetStream_v2");
	g->s = s;
	return 0;
}

/* C'(m x T) = W'(k x m)^T x A'(k x T), W' with leading dimension lda. */
static int gemm_one(arena_gemm *g, const void *w, int m, int k, int lda)
{
	const float one = 1.0f, zero = 0.0f;
	int st = g->api.gemm_ex(g->handle, CUBLAS_OP_T_, CUBLAS_OP_N_, m, (int)g->rows, k, &one, w, CUDA_R_16BF_,
				lda, g->a, CUDA_R_16BF_, (int)ARENA_GEMM_K, &zero, g->c, CUDA_R_16BF_, m,
				CUBLAS_COMPUTE_32F_, CUBLAS_GEMM_DEFAULT_);
	return st == CUBLAS_STATUS_SUCCESS_ ? 0 : cublas_fail(&g->api, st, "cublasGemmEx");
}

int arena_gemm_run(arena_gemm *g, arena_stream *s, const void *w, uint64_t params)
{
	if (params > g->max_params)
		return arena_errorf(ARENA_E_USAGE, "gemm: %llu parameters, more than the %llu it was made for",
				    (unsigned long long)params, (unsigned long long)g->max_params);
	if (!params)
		return 0;
	if (!w)
		return arena_errorf(ARENA_E_USAGE, "gemm: no weights");
	int rc = gemm_bind(g, s);
	const uint16_t *p = w;
	uint64_t n = params / ARENA_GEMM_K;
	for (uint64_t done = 0; !rc && done < n; done += ARENA_GEMM_CHUNK) {
		uint64_t m = n - done < ARENA_GEMM_CHUNK ? n - done : ARENA_GEMM_CHUNK;
		rc = gemm_one(g, p + done * ARENA_GEMM_K, (int)m, (int)ARENA_GEMM_K, (int)ARENA_GEMM_K);
	}
	uint64_t tail = params % ARENA_GEMM_K;
	if (!rc && tail)
		rc = gemm_one(g, p + n * ARENA_GEMM_K, 1, (int)tail, (int)tail);
	return rc;
}

/* A: rows x K bf16 values in [-1, 1) from a fixed sequence, copied on s. */
static int gemm_fill_a(arena_gemm *g, arena_stream *s)
{
	uint64_t count = (uint64_t)g->rows * ARENA_GEMM_K;
	uint16_t *h = arena_malloc((size_t)count * 2);
	if (!h)
		return arena_errorf(ARENA_E_NOMEM, "gemm: out of memory");
	uint32_t x = 0x12345678u;
	for (uint64_t i = 0; i < count; i++) {
		x = x * 1664525u + 1013904223u;
		float f = (float)(x >> 8) / 8388608.0f - 1.0f;
		uint32_t bits;
		memcpy(&bits, &f, sizeof(bits));
		h[i] = (uint16_t)(bits >> 16);
	}
	int rc = g->be->ops->copy_h2d(g->be, g->a, h, count * 2, s);
	if (!rc)
		rc = g->be->ops->stream_sync(g->be, s);
	arena_free(h);
	return rc;
}

int arena_gemm_create(arena_backend *b, arena_stream *s, uint32_t rows, uint64_t max_params, arena_gemm **out)
{
	void *native = NULL;
	*out = NULL;
	if (!rows || rows > INT_MAX)
		return arena_errorf(ARENA_E_USAGE, "gemm: %u rows (1 to %d)", rows, INT_MAX);
	int rc = arena_backend_cuda_stream(b, s, &native);
	if (rc)
		return rc;
	arena_gemm *g = arena_calloc(1, sizeof(*g));
	if (!g)
		return arena_errorf(ARENA_E_NOMEM, "gemm: out of memory");
	g->be = b;
	g->rows = rows;
	g->max_params = max_params;
	uint64_t wrows = max_params / ARENA_GEMM_K;
	uint64_t cols = wrows < ARENA_GEMM_CHUNK ? (wrows ? wrows : 1) : ARENA_GEMM_CHUNK;
	if ((rc = cublas_load(&g->api)))
		goto fail;
	int st = g->api.create(&g->handle);
	if (st != CUBLAS_STATUS_SUCCESS_) {
		g->handle = NULL;
		rc = cublas_fail(&g->api, st, "cublasCreate_v2");
		goto fail;
	}
	if ((rc = gemm_bind(g, s)) || (rc = b->ops->dev_alloc(b, (uint64_t)rows * ARENA_GEMM_K * 2, &g->a)) ||
	    (rc = b->ops->dev_alloc(b, (uint64_t)rows * cols * 2, &g->c)) || (rc = gemm_fill_a(g, s)))
		goto fail;
	/* Warm-up: a full chunk (A's own bytes as W, as many rows as it has) and a tail. */
	uint64_t m = cols < rows ? cols : rows;
	if ((rc = gemm_one(g, g->a, (int)m, (int)ARENA_GEMM_K, (int)ARENA_GEMM_K)) ||
	    (rc = gemm_one(g, g->a, 1, (int)ARENA_GEMM_K / 2, (int)ARENA_GEMM_K / 2)) ||
	    (rc = b->ops->stream_sync(b, s)))
		goto fail;
	*out = g;
	return 0;
fail:
	arena_gemm_free(g);
	return rc;
}

void arena_gemm_free(arena_gemm *g)
{
	if (!g)
		return;
	/* cublasDestroy_v2 synchronizes the device, cudaFree too: no work of
	 * ours is left running on A or C, and no error of ours replaces the
	 * caller's. */
	if (g->handle)
		g->api.destroy(g->handle);
	g->be->ops->dev_free(g->be, g->a);
	g->be->ops->dev_free(g->be, g->c);
	arena_free(g);
}
