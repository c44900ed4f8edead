/* io.c - pread loops with errors that name the file and offset. */
#include "io.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <unistd.h>

#include "err.h"

static atomic_long read_fault_at, read_count;

void arena_fault_read(long n)
{
	atomic_store(&read_count, 0);
	atomic_store(&read_fault_at, n);
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
