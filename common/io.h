/* io.h - whole reads with clear errors, and injectable read failures for tests. */
#ifndef ARENA_COMMON_IO_H
#define ARENA_COMMON_IO_H

#include <stddef.h>
#include <stdint.h>

/* Read exactly n bytes at off (retrying short reads and EINTR). A read that
 * ends early returns IO with "unexpected
 * end of file"; `label` names the file in messages. */
int arena_pread_full(int fd, void *buf, size_t n, uint64_t off, const char *label);

/* Fault injection (tests only): the nth read from now fails with EIO
 * (n >= 1); 0 disarms. */
void arena_fault_read(long n);
/* For readers that do not go through arena_pread_full: 1 if this read must
 * fail by injection (counts as one read). */
int arena__read_fault(void);

#endif
