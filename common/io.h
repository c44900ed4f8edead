/* io.h - whole reads with clear errors, and injectable read failures for tests. */
#ifndef ARENA_COMMON_IO_H
#define ARENA_COMMON_IO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

/* Open an input file for reading: every reader of a checkpoint, an index, an
 * image or a profile opens its file here. Only a regular file is opened; the
 * open does not block (O_NONBLOCK until fstat has said what the file is), so
 * a FIFO is refused like a folder or a device. `flags` adds to O_RDONLY |
 * O_CLOEXEC (O_DIRECT). On success *fd is a blocking descriptor and *st (when
 * not NULL) its fstat. Errors, one line naming path:
 *   NOT_FOUND           no such file (ENOENT, ENOTDIR)
 *   INPUT_NOT_READABLE  not a readable regular file: a folder, FIFO, device or
 *                       socket ("not a regular file"), a symlink loop, no
 *                       permission, ... (class INVALID, as for a bad input)
 *   NOMEM, IO           the system's: out of memory, too many open files, EIO
 * errno is that of the failed call (EINVAL: O_DIRECT refused). */
int arena_open_input(const char *path, int flags, int *fd, struct stat *st);
/* The error for an input path that a system call refused with errnum, as
 * arena_open_input classes it: "<path>: cannot open: <strerror>". */
int arena_input_syserror(const char *path, int errnum);

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
