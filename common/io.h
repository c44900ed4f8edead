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
 * meets the end of the file returns INPUT_CHANGED ("file changed while
 * reading: unexpected end of file"): every reader checks what it reads
 * against the size the file had when opened, so the file shrank since; a
 * failed read, IO. `label` names the file in messages. */
int arena_pread_full(int fd, void *buf, size_t n, uint64_t off, const char *label);

/* Reads of a file that the page cache may or may not hold: what it holds
 * is read from it, the rest with O_DIRECT, and nothing is read twice (a
 * read with RWF_NOWAIT that misses starts the kernel's read-ahead of what
 * it missed: the disk would read those bytes for the cache and again with
 * O_DIRECT). */
enum { ARENA_DIRECT_ALIGN = 4096 };
/* A second descriptor on the file behind fd (*dfd, the same file whatever
 * its name now: /proc/self/fd, else `path`) with O_DIRECT and, when `ask`,
 * the file (size bytes) mapped read-only to ask the page cache which of
 * its pages it holds (*map; mincore, no I/O; munmap(map, size) frees it).
 * 0 with *dfd -1 where that is not possible: the filesystem has no
 * O_DIRECT (tmpfs), or the kernel will not say (it answers only for files
 * the caller owns or may write to; for others every page would look
 * uncached, so the first page is read and asked for), or the mapping
 * fails: reads stay buffered. Else the open's error naming path. */
int arena_open_direct(int fd, const char *path, uint64_t size, int ask, int *dfd, void **map);
/* Of the n bytes at off of a file mapped at map (as above), how many from
 * off on the page cache holds (whole pages; n when all): no I/O. */
uint64_t arena_cached_prefix(const void *map, uint64_t off, uint64_t n);
/* Like arena_pread_full, with dfd and map from arena_open_direct: the
 * cached pages read through fd, the rest through dfd, when buf, n and off
 * are multiples of ARENA_DIRECT_ALIGN (else, or without dfd or map, all
 * through fd). *direct (may be NULL) adds the bytes read with O_DIRECT. */
int arena_pread_cached_or_direct(int fd, int dfd, const void *map, void *buf, size_t n, uint64_t off,
				 const char *label, uint64_t *direct);

/* Fault injection (tests only): the nth read from now fails with EIO
 * (n >= 1); 0 disarms. */
void arena_fault_read(long n);
/* 1 once the armed failure has happened. */
int arena_fault_read_fired(void);
/* For readers that do not go through arena_pread_full: 1 if this read must
 * fail by injection (counts as one read). */
int arena__read_fault(void);
/* Fault injection (tests only): fn(fd, path, ctx) runs as arena_open_input
 * returns each file it opened, after the fstat whose size the readers go
 * by (a test truncates the file there: the point between the open and the
 * reads); NULL disarms. */
void arena_fault_opened(void (*fn)(int fd, const char *path, void *ctx), void *ctx);

#endif
