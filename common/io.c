/* io.c - pread loops with errors that name the file and offset. */
#include "io.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "err.h"

static atomic_long read_fault_at, read_count;

void arena_fault_read(long n)
{
	atomic_store(&read_count, 0);
	atomic_store(&read_fault_at, n);
}

int arena_fault_read_fired(void)
{
	long at = atomic_load(&read_fault_at);
	return at > 0 && atomic_load(&read_count) >= at;
}

int arena__read_fault(void)
{
	long at = atomic_load_explicit(&read_fault_at, memory_order_relaxed);
	return at > 0 && atomic_fetch_add(&read_count, 1) + 1 == at;
}

int arena_pread_full(int fd, void *buf, size_t n, uint64_t off, const char *label)
{
	uint8_t *p = buf;
	while (n) {
		ssize_t r;
		if (arena__read_fault()) {
			errno = EIO;
			r = -1;
		} else {
			r = pread(fd, p, n, (off_t)off);
		}
		if (r < 0) {
			if (errno == EINTR)
				continue;
			return arena_syserrorf(ARENA_E_IO, errno, "%s: read failed at byte %llu", label,
					       (unsigned long long)off);
		}
		if (r == 0)
			return arena_errorf(ARENA_E_IO, "%s: unexpected end of file at byte %llu (file changed?)", label,
					    (unsigned long long)off);
		p += r, n -= (size_t)r, off += (uint64_t)r;
	}
	return 0;
}

void *arena_map_to_ask_cache(int fd, uint64_t size)
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

uint64_t arena_cached_prefix(const void *map, uint64_t off, uint64_t n)
{
	enum { RUN = 256 };
	const uint64_t A = ARENA_DIRECT_ALIGN;
	unsigned char v[RUN];
	uint64_t at = off - off % A, end = off + n;
	while (at < end) {
		const uint64_t q = (end - at + A - 1) / A < RUN ? (end - at + A - 1) / A : RUN;
		if (mincore((void *)((uintptr_t)map + at), q * A, v))
			return at > off ? at - off : 0;
		for (uint64_t i = 0; i < q; i++, at += A)
			if (!(v[i] & 1))
				return at > off ? at - off : 0;
	}
	return n;
}

int arena_pread_cached_or_direct(int fd, int dfd, const void *map, void *buf, size_t n, uint64_t off,
				 const char *label, uint64_t *direct)
{
	const uint64_t A = ARENA_DIRECT_ALIGN;
	if (dfd < 0 || !map || ((uintptr_t)buf | n | off) % A)
		return arena_pread_full(fd, buf, n, off, label);
	/* Which pages the page cache holds (mincore on the file's mapping: no
	 * I/O; a read with RWF_NOWAIT would ask for the rest, read ahead into
	 * the cache, and the disk would read them twice). Runs of cached pages
	 * are read from the cache, the others with O_DIRECT. */
	enum { RUN = 256 }; /* pages a query */
	unsigned char v[RUN];
	uint8_t *p = buf;
	while (n) {
		const size_t q = n / A < RUN ? n / A : RUN;
		if (mincore((void *)((uintptr_t)map + off), q * A, v))
			memset(v, 0, q); /* cannot tell: from the disk */
		size_t i = 0;
		while (i < q) {
			const int cached = v[i] & 1;
			size_t j = i + 1;
			while (j < q && (v[j] & 1) == cached)
				j++;
			const size_t len = (j - i) * A;
			if (cached) {
				int rc = arena_pread_full(fd, p, len, off, label);
				if (rc)
					return rc;
			} else {
				size_t got = 0;
				while (got < len) {
					ssize_t r = arena__read_fault() ? (errno = EIO, -1)
									: pread(dfd, p + got, len - got, (off_t)(off + got));
					if (r < 0 && errno == EINTR)
						continue;
					if (r < 0)
						return arena_syserrorf(ARENA_E_IO, errno, "%s: read failed at byte %llu", label,
								       (unsigned long long)(off + got));
					if (r == 0 || r % (ssize_t)A) /* the end of the file inside the range */
						return arena_errorf(ARENA_E_IO,
								    "%s: unexpected end of file at byte %llu (file changed?)",
								    label, (unsigned long long)(off + got + (uint64_t)r));
					got += (size_t)r;
				}
				if (direct)
					*direct += len;
			}
			p += len, n -= len, off += len;
			i = j;
		}
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
	if (st)
		*st = s;
	*fd = f;
	return 0;
}
