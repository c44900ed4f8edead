/* reg_probe.c - can the GPU copy straight from the page cache? Registers
 * pieces of a read-only mapping of FILE with cudaHostRegister(ReadOnly) from
 * 1, 4, 8 and 16 threads (and 16 again, each piece hashed by the CPU while
 * its copy runs), copies each piece to the device, unregisters it.
 * The limit to hold it to: the pinned copy rate (bench/gpu_probe, same
 * machine) and `arena load` of the same file, warm.
 * Prints one JSON line a thread count: seconds, GB/s end to end, the
 * threads' seconds in registration.
 *
 *   reg_probe FILE [PIECE_MIB]      (default 64; FILE in the page cache first: cat FILE >/dev/null)
 *
 * Build: `make bench` (needs CUDA): build/bench/reg_probe. Exit status: 0,
 * 2 for usage, 3 when the device memory cannot be had. */
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/clock.h"
#include "../common/hash.h"

typedef struct job {
	uint8_t *map;
	uint64_t size, piece;
	uint8_t *dev;
	atomic_uint_fast64_t next;
	_Atomic double reg_s;
	atomic_int err;
	int hash;
} job;

static void *worker(void *arg)
{
	job *j = arg;
	cudaStream_t s;
	cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
	double reg = 0;
	uint64_t sum = 0;
	for (;;) {
		uint64_t off = atomic_fetch_add(&j->next, j->piece);
		if (off >= j->size)
			break;
		uint64_t n = j->size - off < j->piece ? j->size - off : j->piece;
		double t0 = arena_now_s();
		cudaError_t e = cudaHostRegister(j->map + off, n, cudaHostRegisterReadOnly);
		reg += arena_now_s() - t0;
		if (e != cudaSuccess) {
			fprintf(stderr, "register: %s\n", cudaGetErrorString(e));
			atomic_store(&j->err, 1);
			break;
		}
		cudaMemcpyAsync(j->dev + off, j->map + off, n, cudaMemcpyHostToDevice, s);
		if (j->hash)
			sum += arena_xxh3(j->map + off, n);
		cudaStreamSynchronize(s);
		cudaHostUnregister(j->map + off);
	}
	(void)sum;
	double cur = atomic_load(&j->reg_s);
	while (!atomic_compare_exchange_weak(&j->reg_s, &cur, cur + reg))
		;
	cudaStreamDestroy(s);
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: reg_probe FILE [PIECE_MIB]\n");
		return 2;
	}
	int fd = open(argv[1], O_RDONLY);
	struct stat st;
	fstat(fd, &st);
	uint64_t size = (uint64_t)st.st_size & ~(uint64_t)4095;
	uint64_t piece = (argc > 2 ? strtoull(argv[2], NULL, 10) : 64) << 20;
	uint8_t *dev;
	if (cudaMalloc((void **)&dev, size) != cudaSuccess) {
		fprintf(stderr, "cudaMalloc failed\n");
		return 3;
	}
	int threads[] = {1, 4, 8, 16, 16};
	for (int k = 0; k < 5; k++) {
		uint8_t *map = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
		job j = {.map = map, .size = size, .piece = piece, .dev = dev, .hash = k == 4};
		pthread_t tid[16];
		double t0 = arena_now_s();
		for (int i = 0; i < threads[k]; i++)
			pthread_create(&tid[i], NULL, worker, &j);
		for (int i = 0; i < threads[k]; i++)
			pthread_join(tid[i], NULL);
		double t = arena_now_s() - t0;
		printf("{\"threads\": %d, \"piece_mib\": %llu, \"hash\": %d, \"ok\": %d, \"seconds\": %.3f, \"gbps\": %.2f, \"register_thread_seconds\": %.3f}\n",
		       threads[k], (unsigned long long)(piece >> 20), j.hash, !atomic_load(&j.err), t, (double)size / t / 1e9,
		       atomic_load(&j.reg_s));
		fflush(stdout);
		munmap(map, size);
		if (atomic_load(&j.err))
			break;
	}
	return 0;
}
