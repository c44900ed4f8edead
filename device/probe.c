/* probe.c - raw copy and read rates (see probe.h). */
#include "probe.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/alloc.h"
#include "../common/clock.h"
#include "../common/err.h"
#include "../common/io.h"

uint64_t arena_peak_rss(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return (uint64_t)ru.ru_maxrss * 1024;
}

int arena_probe_h2d(arena_backend *be, arena_pin_budget *b, uint64_t bytes, double seconds, double *gbps)
{
	/* 64 MiB pieces; a small device (a tiny sim) gets one piece of what it asked. */
	uint64_t piece = 64u << 20;
	if (bytes < piece)
		piece = bytes < 4096 ? 4096 : (bytes + 4095) / 4096 * 4096;
	bytes = (bytes + piece - 1) / piece * piece;
	*gbps = 0;
	int rc, registered = 0, taken = 0;
	void *dev = NULL;
	arena_stream *s[2] = {NULL, NULL};
	uint8_t *host = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (host == MAP_FAILED)
		return arena_syserrorf(ARENA_E_NOMEM, errno, "probe: cannot map %" PRIu64 " bytes", bytes);
	if ((rc = arena_pin_budget_take(b, bytes)))
		goto out;
	taken = 1;
	if ((rc = be->ops->host_register(be, host, bytes)))
		goto out;
	registered = 1;
	if ((rc = be->ops->dev_alloc(be, bytes, &dev)) || (rc = be->ops->stream_create(be, &s[0])) ||
	    (rc = be->ops->stream_create(be, &s[1])))
		goto out;
	/* Warm up once, then time whole passes until `seconds` have gone by. */
	for (uint64_t o = 0; o < bytes && !rc; o += piece)
		rc = be->ops->copy_h2d(be, (uint8_t *)dev + o, host + o, piece, s[(o / piece) & 1]);
	if (rc || (rc = be->ops->stream_sync(be, s[0])) || (rc = be->ops->stream_sync(be, s[1])))
		goto out;
	double t0 = arena_now_s(), t = t0;
	uint64_t moved = 0;
	while (t - t0 < seconds && !rc) {
		for (uint64_t o = 0; o < bytes && !rc; o += piece)
			rc = be->ops->copy_h2d(be, (uint8_t *)dev + o, host + o, piece, s[(o / piece) & 1]);
		if (!rc && !(rc = be->ops->stream_sync(be, s[0])))
			rc = be->ops->stream_sync(be, s[1]);
		moved += bytes;
		t = arena_now_s();
	}
	if (!rc)
		*gbps = (double)moved / (t - t0) / 1e9;
out:
	if (s[0])
		be->ops->stream_destroy(be, s[0]);
	if (s[1])
		be->ops->stream_destroy(be, s[1]);
	if (dev)
		be->ops->dev_free(be, dev);
	if (registered)
		be->ops->host_unregister(be, host);
	if (taken)
		arena_pin_budget_give(b, bytes);
	munmap(host, bytes);
	return rc;
}

typedef struct read_job {
	int fd;
	uint64_t size;
	atomic_uint_fast64_t next;
	atomic_int rc;
	int err;
} read_job;

#define READ_PIECE (1u << 20) /* the loader's read size: the same reads, nothing else */

static void *read_worker(void *arg)
{
	read_job *j = arg;
	uint8_t *buf = mmap(NULL, READ_PIECE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED) {
		atomic_store(&j->rc, ARENA_E_NOMEM);
		return NULL;
	}
	for (;;) {
		uint64_t off = atomic_fetch_add(&j->next, READ_PIECE);
		if (off >= j->size || atomic_load(&j->rc))
			break;
		uint64_t got = 0;
		while (got < READ_PIECE && off + got < j->size) {
			ssize_t r = pread(j->fd, buf + got, READ_PIECE - got, (off_t)(off + got));
			if (r < 0 && errno == EINTR)
				continue;
			if (r <= 0) {
				j->err = r < 0 ? errno : EIO;
				atomic_store(&j->rc, ARENA_E_IO);
				break;
			}
			got += (uint64_t)r;
		}
	}
	munmap(buf, READ_PIECE);
	return NULL;
}

int arena_probe_read(const char *path, unsigned threads, int direct, uint64_t max_bytes, double *gbps)
{
	*gbps = 0;
	int fd = -1;
	struct stat st;
	if (!direct || arena_open_input(path, O_DIRECT, &fd, &st)) {
		int rc = arena_open_input(path, 0, &fd, &st);
		if (rc)
			return rc;
	}
	read_job j = {.fd = fd, .size = (uint64_t)st.st_size};
	if (max_bytes && max_bytes < j.size)
		j.size = max_bytes;
	atomic_init(&j.next, 0);
	atomic_init(&j.rc, 0);
	if (threads < 1)
		threads = 1;
	if (threads > 64)
		threads = 64;
	pthread_t tid[64];
	unsigned started = 0;
	double t0 = arena_now_s();
	for (; started < threads; started++)
		if (pthread_create(&tid[started], NULL, read_worker, &j))
			break;
	if (!started)
		read_worker(&j);
	for (unsigned i = 0; i < started; i++)
		pthread_join(tid[i], NULL);
	double t = arena_now_s() - t0;
	close(fd);
	int rc = atomic_load(&j.rc);
	if (rc)
		return rc == ARENA_E_IO ? arena_syserrorf(ARENA_E_IO, j.err, "%s: read failed", path)
					: arena_errorf(rc, "probe: out of memory");
	*gbps = t > 0 ? (double)j.size / t / 1e9 : 0;
	return 0;
}
