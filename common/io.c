/* io.c - pread loops with errors that name the file and offset. */
#include "io.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "err.h"
#include "fault.h"

static arena__fault read_fault;
static void (*_Atomic opened_fn)(int fd, const char *path, void *ctx);
static void *_Atomic opened_ctx;

void arena_fault_opened(void (*fn)(int fd, const char *path, void *ctx), void *ctx)
{
	atomic_store(&opened_ctx, ctx);
	atomic_store(&opened_fn, fn);
}

void arena_fault_read(long n)
{
	arena__fault_arm(&read_fault, n);
}

int arena_fault_read_fired(void)
{
	return arena__fault_fired(&read_fault);
}

int arena__read_fault(void)
{
	return arena__fault_hit(&read_fault);
}

/* n bytes at off, retrying short reads and EINTR; a read that comes back
 * empty, or (O_DIRECT: unit 4096) with a part of a unit, met the end of
 * the file. */
static int pread_all(int fd, void *buf, size_t n, uint64_t off, const char *label, size_t unit)
{
	uint8_t *p = buf;
	while (n) {
		ssize_t r = arena__read_fault() ? (errno = EIO, -1) : pread(fd, p, n, (off_t)off);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return arena_syserrorf(ARENA_E_IO, errno, "%s: read failed at byte %llu", label,
					       (unsigned long long)off);
		if (r == 0 || (size_t)r % unit) /* its size was checked when opened: it shrank since */
			return arena_errorf(ARENA_E(INPUT_CHANGED),
					    "%s: file changed while reading: unexpected end of file at byte %llu", label,
					    (unsigned long long)(off + (uint64_t)r));
		p += r, n -= (size_t)r, off += (uint64_t)r;
	}
	return 0;
}

int arena_pread_full(int fd, void *buf, size_t n, uint64_t off, const char *label)
{
	return pread_all(fd, buf, n, off, label, 1);
}

/* The file mapped read-only to ask the page cache, or NULL where it cannot
 * say (see arena_open_direct). */
static void *map_to_ask_cache(int fd, uint64_t size)
{
	uint8_t page[ARENA_DIRECT_ALIGN];
	if (size < sizeof(page) || pread(fd, page, sizeof(page), 0) != (ssize_t)sizeof(page))
		return NULL;
	void *m = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED)
		return NULL;
	unsigned char v = 0;
	if (mincore(m, sizeof(page), &v) || !(v & 1)) { /* the page just read looks uncached: blind */
		munmap(m, (size_t)size);
		return NULL;
	}
	return m;
}

int arena_open_direct(int fd, const char *path, uint64_t size, int ask, int *dfd, void **map)
{
	*dfd = -1;
	*map = NULL;
	/* The same file as fd (a name may have been given to another since). */
	char proc[64];
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
	int d = open(proc, O_RDONLY | O_DIRECT | O_CLOEXEC);
	if (d < 0 && (errno == ENOENT || errno == ENOTDIR)) { /* no /proc: by its name */
		int rc = arena_open_input(path, O_DIRECT, &d, NULL);
		if (rc && errno != EINVAL)
			return rc;
		arena_error_clear();
	} else if (d < 0 && errno != EINVAL) {
		return arena_input_syserror(path, errno);
	}
	if (d < 0) /* EINVAL: the filesystem has no O_DIRECT (tmpfs) */
		return 0;
	if (ask && !(*map = map_to_ask_cache(fd, size))) { /* cannot ask: O_DIRECT for all would read a cached file
							 * from the disk */
		close(d);
		return 0;
	}
	*dfd = d;
	return 0;
}

/* From page-aligned off, the run of at most n bytes (whole pages) whose
 * pages the page cache holds (*cached 1) or does not (0); where mincore
 * fails, not. */
static uint64_t cache_run(const void *map, uint64_t off, uint64_t n, int *cached)
{
	enum { RUN = 256 }; /* pages a query */
	const uint64_t A = ARENA_DIRECT_ALIGN;
	unsigned char v[RUN];
	uint64_t at = off;
	*cached = -1;
	while (at < off + n) {
		const uint64_t q = (off + n - at + A - 1) / A < RUN ? (off + n - at + A - 1) / A : RUN;
		if (mincore((void *)((uintptr_t)map + at), q * A, v))
			memset(v, 0, q);
		for (uint64_t i = 0; i < q; i++, at += A) {
			if (*cached < 0)
				*cached = v[i] & 1;
			else if ((v[i] & 1) != *cached)
				return at - off;
		}
	}
	return n;
}

uint64_t arena_cached_prefix(const void *map, uint64_t off, uint64_t n)
{
	const uint64_t a = off - off % ARENA_DIRECT_ALIGN;
	int cached;
	const uint64_t r = cache_run(map, a, n + (off - a), &cached);
	return !cached ? 0 : r - (off - a) < n ? r - (off - a) : n;
}

int arena_pread_cached_or_direct(int fd, int dfd, const void *map, void *buf, size_t n, uint64_t off,
				 const char *label, uint64_t *direct)
{
	if (dfd < 0 || !map || ((uintptr_t)buf | n | off) % ARENA_DIRECT_ALIGN)
		return arena_pread_full(fd, buf, n, off, label);
	/* Runs of cached pages from the cache, the others with O_DIRECT. */
	uint8_t *p = buf;
	while (n) {
		int cached;
		const uint64_t len = cache_run(map, off, n, &cached);
		int rc = cached ? pread_all(fd, p, len, off, label, 1) : pread_all(dfd, p, len, off, label, ARENA_DIRECT_ALIGN);
		if (rc)
			return rc;
		if (!cached && direct)
			*direct += len;
		p += len, n -= len, off += len;
	}
	return 0;
}

int arena_input_syserror(const char *path, int errnum)
{
	switch (errnum) {
	case ENOENT:
	case ENOTDIR:
	case ENOMEM:
	case EIO:
	case EMFILE:
	case ENFILE:
	case EAGAIN: /* a lease another process holds */
	case EINTR:
		return arena_syserrorf(ARENA_E_IO, errnum, "%s: cannot open", path);
	default: /* ELOOP, EACCES, EPERM, ENXIO, ENODEV, ENAMETOOLONG, EOVERFLOW, ... */
		return arena_syserrorf(ARENA_E(INPUT_NOT_READABLE), errnum, "%s: cannot open", path);
	}
}

static const char *file_kind(mode_t m)
{
	return S_ISDIR(m) ? "a folder" : S_ISFIFO(m) ? "a FIFO" : S_ISCHR(m) || S_ISBLK(m) ? "a device"
	       : S_ISSOCK(m) ? "a socket" : "not a file";
}

int arena_open_input(const char *path, int flags, int *fd, struct stat *st)
{
	*fd = -1;
	int f;
	do {
		f = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC | flags);
	} while (f < 0 && errno == EINTR);
	if (f < 0) {
		int e = errno;
		int rc = arena_input_syserror(path, e);
		errno = e;
		return rc;
	}
	struct stat s;
	int rc = 0, e = 0, fl;
	if (fstat(f, &s) < 0) {
		e = errno;
		rc = arena_syserrorf(ARENA_E_IO, e, "%s: cannot stat", path);
	} else if (!S_ISREG(s.st_mode)) {
		rc = arena_errorf(ARENA_E(INPUT_NOT_READABLE), "%s: not a regular file (%s)", path, file_kind(s.st_mode));
	} else if ((fl = fcntl(f, F_GETFL)) < 0 || fcntl(f, F_SETFL, fl & ~O_NONBLOCK) < 0) {
		e = errno;
		rc = arena_syserrorf(ARENA_E_IO, e, "%s: cannot open", path);
	}
	if (rc) {
		close(f);
		errno = e;
		return rc;
	}
	void (*hook)(int, const char *, void *) = atomic_load(&opened_fn);
	if (hook)
		hook(f, path, atomic_load(&opened_ctx));
	if (st)
		*st = s;
	*fd = f;
	return 0;
}
