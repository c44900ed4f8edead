/* io.c - pread loops with errors that name the file and offset. */
#include "io.h"

#include <errno.h>
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
