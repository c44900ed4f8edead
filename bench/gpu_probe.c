/* gpu_probe.c - the raw host-to-device limits on this machine, through arena's
 * cuda backend: pinned (cudaHostRegister'd) copy rate over 1, 2 and 4 streams,
 * pageable copy rate, and the time to pin. Prints one JSON object on stdout.
 *
 *   gpu_probe [--device N] [--mib BUFFER_MIB] [--chunk-mib CHUNK_MIB] [--reps N]
 *
 * Defaults: device 0, a 1024 MiB buffer copied in 64 MiB pieces, 5 timed
 * repetitions after one warm-up (the best and every rate are reported, in
 * GB/s = 1e9 bytes/s). These rates are the limits the loader and the
 * engine are held to (each also measures them in its own run).
 * Build: `make bench` (needs CUDA): build/bench/gpu_probe. Exit status: 0,
 * 2 for usage, or the class of an arena error (3 for no CUDA device) with
 * a one-line message on stderr.
 */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "../device/backend.h"
#include "../common/clock.h"

#define MAX_REPS 100
#define MAX_STREAMS 4

struct probe {
	arena_backend *b;
	arena_stream *s[MAX_STREAMS];
	unsigned char *host;
	void *dev;
	size_t size, chunk;
	int reps;
};

/* Copy the whole buffer in chunks spread round-robin over `ns` streams, wait
 * for all; the rate in GB/s, or a negative error. */
static int copy_once(struct probe *p, int ns, double *gbps)
{
	int rc = 0;
	double t0 = arena_now_s();
	for (size_t off = 0, i = 0; off < p->size && !rc; off += p->chunk, i++) {
		size_t n = p->size - off < p->chunk ? p->size - off : p->chunk;
		rc = p->b->ops->copy_h2d(p->b, (char *)p->dev + off, p->host + off, n, p->s[i % (size_t)ns]);
	}
	for (int i = 0; i < ns && !rc; i++)
		rc = p->b->ops->stream_sync(p->b, p->s[i]);
	*gbps = (double)p->size / (arena_now_s() - t0) / 1e9;
	return rc;
}

/* One warm-up, then p->reps timed runs: prints {"streams":..,"gbps_best":..,"gbps":[..]}. */
static int measure(struct probe *p, int ns)
{
	double r[MAX_REPS], best = 0;
	int rc = copy_once(p, ns, &r[0]);
	for (int i = 0; i < p->reps && !rc; i++) {
		rc = copy_once(p, ns, &r[i]);
		if (r[i] > best)
			best = r[i];
	}
	if (rc)
		return rc;
	printf("{\"streams\": %d, \"gbps_best\": %.2f, \"gbps\": [", ns, best);
	for (int i = 0; i < p->reps; i++)
		printf("%s%.2f", i ? ", " : "", r[i]);
	printf("]}");
	return 0;
}

/* The device bytes equal the host bytes (checks the last chunk copied). */
static int verify(struct probe *p, int *same)
{
	size_t n = p->chunk < p->size ? p->chunk : p->size;
	unsigned char *back = malloc(n);
	int rc = back ? p->b->ops->copy_d2h_sync(p->b, back, (char *)p->dev + (p->size - n), n) : ARENA_E_NOMEM;
	*same = !rc && !memcmp(back, p->host + (p->size - n), n);
	free(back);
	return rc;
}

static int usage(void)
{
	fprintf(stderr, "usage: gpu_probe [--device N] [--mib BUFFER_MIB] [--chunk-mib CHUNK_MIB] [--reps N]\n");
	return 2;
}

int main(int argc, char **argv)
{
	struct probe p = {.size = 1024ull << 20, .chunk = 64ull << 20, .reps = 5};
	int device = 0, rc = 0, same = 0, registered = 0;
	for (int i = 1; i < argc; i++) {
		long v;
		char *end;
		if (i + 1 >= argc)
			return usage();
		v = strtol(argv[i + 1], &end, 10);
		if (*end || end == argv[i + 1] || v < 0)
			return usage();
		if (!strcmp(argv[i], "--device"))
			device = (int)v;
		else if (!strcmp(argv[i], "--mib") && v > 0)
			p.size = (size_t)v << 20;
		else if (!strcmp(argv[i], "--chunk-mib") && v > 0)
			p.chunk = (size_t)v << 20;
		else if (!strcmp(argv[i], "--reps") && v > 0 && v <= MAX_REPS)
			p.reps = (int)v;
		else
			return usage();
		i++;
	}

	rc = arena_backend_cuda_create(device, &p.b);
	struct cudaDeviceProp prop;
	memset(&prop, 0, sizeof(prop));
	int rt = 0, drv = 0;
	double t_register = 0;
	if (!rc && cudaGetDeviceProperties(&prop, device) != cudaSuccess)
		strcpy(prop.name, "?");
	cudaRuntimeGetVersion(&rt);
	cudaDriverGetVersion(&drv);
	if (!rc && !(p.host = aligned_alloc(4096, p.size)))
		rc = ARENA_E_NOMEM;
	if (!rc)
		for (size_t i = 0; i < p.size; i++)
			p.host[i] = (unsigned char)(i * 131 + (i >> 20));
	if (!rc)
		rc = p.b->ops->dev_alloc(p.b, p.size, &p.dev);
	for (int i = 0; i < MAX_STREAMS && !rc; i++)
		rc = p.b->ops->stream_create(p.b, &p.s[i]);
	if (!rc) {
		printf("{\"device\": %d, \"name\": \"%s\", \"cuda_runtime\": %d, \"cuda_driver\": %d,\n", device,
		       prop.name, rt, drv);
		printf(" \"buffer_bytes\": %zu, \"chunk_bytes\": %zu, \"reps\": %d,\n \"pageable\": ", p.size, p.chunk,
		       p.reps);
		rc = measure(&p, 1);
	}
	if (!rc) {
		double t0 = arena_now_s();
		rc = p.b->ops->host_register(p.b, p.host, p.size);
		t_register = arena_now_s() - t0;
		registered = !rc;
	}
	if (!rc) {
		printf(",\n \"register_s\": %.3f,\n \"pinned\": [", t_register);
		for (int ns = 1; ns <= MAX_STREAMS && !rc; ns *= 2) {
			printf("%s\n  ", ns > 1 ? "," : "");
			rc = measure(&p, ns);
		}
	}
	if (!rc)
		rc = verify(&p, &same);
	if (!rc)
		printf("],\n \"verified\": %s}\n", same ? "true" : "false");
	fflush(stdout);

	if (rc)
		fprintf(stderr, "gpu_probe: %s\n", rc == ARENA_E_NOMEM ? "out of memory" : arena_last_error());
	else if (!same)
		fprintf(stderr, "gpu_probe: device bytes differ from the host bytes\n");
	if (p.b) {
		if (registered)
			p.b->ops->host_unregister(p.b, p.host);
		for (int i = 0; i < MAX_STREAMS; i++)
			p.b->ops->stream_destroy(p.b, p.s[i]);
		p.b->ops->dev_free(p.b, p.dev);
		arena_backend_destroy(p.b);
	}
	free(p.host);
	return rc ? arena_err_class(rc) : same ? 0 : 1;
}
