/* dio_probe.c - O_DIRECT writes of 3 MiB pieces by N threads, into a file
 * reserved first (fallocate: writes land inside the file, as a plain
 * convert's do) or into an empty one (every write extends the file, as a
 * coded convert's did before it reserved the raw size). On ext4 a write that
 * extends the file takes the inode lock alone and waits for its I/O, so
 * extending writes go one at a time; on a device whose rate needs several
 * writes in flight the two differ. The reserved case is the limit a
 * convert's writes are held to on that disk. Needs no GPU: `make bench-cpu`
 * (build/bench/dio_probe).
 *
 *   dio_probe FILE [THREADS [GIB]]      (default 8 threads, 4 GiB; FILE is removed)
 *
 * Prints one line per case and pass (GB/s). Exit status: 0, or 3 on an I/O
 * error. */
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common/clock.h"

#define PIECE (3u << 20)

static int fd;
static atomic_long next;
static long pieces;

static void *writer(void *arg)
{
	(void)arg;
	void *b = NULL;
	if (posix_memalign(&b, 4096, PIECE))
		exit(3);
	memset(b, 0x5a, PIECE);
	for (;;) {
		long i = atomic_fetch_add(&next, 1);
		if (i >= pieces)
			break;
		if (pwrite(fd, b, PIECE, (off_t)i * PIECE) != (ssize_t)PIECE) {
			perror("dio_probe: pwrite");
			exit(3);
		}
	}
	free(b);
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: dio_probe FILE [THREADS [GIB]]\n");
		return 2;
	}
	int threads = argc > 2 ? atoi(argv[2]) : 8;
	double gib = argc > 3 ? atof(argv[3]) : 4;
	threads = threads < 1 ? 1 : threads > 256 ? 256 : threads;
	pieces = (long)(gib * (1u << 30) / PIECE);
	pthread_t tid[256];
	for (int pass = 0; pass < 2; pass++)
		for (int reserve = 0; reserve < 2; reserve++) {
			unlink(argv[1]);
			fd = open(argv[1], O_CREAT | O_TRUNC | O_WRONLY | O_DIRECT, 0644);
			if (fd < 0 || (reserve && posix_fallocate(fd, 0, (off_t)pieces * PIECE))) {
				perror("dio_probe: open or fallocate");
				return 3;
			}
			atomic_store(&next, 0);
			double t0 = arena_now_s();
			for (int t = 0; t < threads; t++)
				pthread_create(&tid[t], NULL, writer, NULL);
			for (int t = 0; t < threads; t++)
				pthread_join(tid[t], NULL);
			double t1 = arena_now_s();
			fsync(fd);
			double t2 = arena_now_s();
			close(fd);
			printf("pass %d %-10s %d threads: %.2f GB/s (writes %.2f s, fsync %.2f s)\n", pass + 1,
			       reserve ? "reserved" : "extending", threads, (double)pieces * PIECE / (t2 - t0) / 1e9, t1 - t0,
			       t2 - t1);
		}
	unlink(argv[1]);
	return 0;
}
