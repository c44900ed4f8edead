/* outfile.c - write to a temporary, fsync, rename: whole files or none. */
#include "outfile.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "alloc.h"
#include "err.h"

static atomic_long write_fault_at, write_count;

void arena_fault_write(long n)
{
	atomic_store(&write_count, 0);
	atomic_store(&write_fault_at, n);
}

static int write_should_fail(void)
{
	long at = atomic_load_explicit(&write_fault_at, memory_order_relaxed);
	return at > 0 && atomic_fetch_add(&write_count, 1) + 1 == at;
}

static char *dir_part(const char *path)
{
	const char *s = strrchr(path, '/');
	if (!s)
		return arena_strdup(".");
	if (s == path)
		return arena_strdup("/");
	char *d = arena_malloc((size_t)(s - path) + 1);
	if (d) {
		memcpy(d, path, (size_t)(s - path));
		d[s - path] = '\0';
	}
	return d;
}

static const char *kind(mode_t m)
{
	return S_ISFIFO(m) ? "a FIFO" : S_ISCHR(m) || S_ISBLK(m) ? "a device" : S_ISSOCK(m) ? "a socket" : "something";
}

int arena_outfile_open(const char *path, arena_outfile **out)
{
	*out = NULL;
	arena_outfile *f = arena_calloc(1, sizeof(*f));
	char *dir = dir_part(path);
	const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
	if (!f || !dir || !(f->path = arena_strdup(path)) ||
	    !(f->tmp_path = arena_malloc(strlen(dir) + strlen(base) + 24))) {
		arena_free(dir);
		if (f) {
			arena_free(f->path);
			arena_free(f);
		}
		return arena_errorf(ARENA_E_NOMEM, "%s: out of memory", path);
	}
	/* Only a regular file is replaced: a folder, FIFO or device is a usage error. */
	struct stat st;
	int exists = *base && stat(path, &st) == 0, rc = 0;
	if (!*base || (exists && S_ISDIR(st.st_mode)))
		rc = arena_errorf(ARENA_E_USAGE, "%s: output path names a folder, not a file", path);
	else if (exists && !S_ISREG(st.st_mode))
		rc = arena_errorf(ARENA_E_USAGE, "%s: output path names %s, not a regular file", path, kind(st.st_mode));
	if (rc) {
		arena_free(dir);
		arena_free(f->tmp_path);
		arena_free(f->path);
		arena_free(f);
		return rc;
	}
	f->dfd = -1;
	sprintf(f->tmp_path, "%s/.%s.tmp-XXXXXX", dir, base);
	arena_free(dir);
	f->fd = mkostemp(f->tmp_path, O_CLOEXEC);
	if (f->fd < 0) {
		int e = errno;
		arena_free(f->tmp_path);
		arena_free(f->path);
		arena_free(f);
		return arena_syserrorf(ARENA_E_IO, e, "%s: cannot create output file", path);
	}
	fchmod(f->fd, 0644);
	f->dfd = open(f->tmp_path, O_WRONLY | O_DIRECT | O_CLOEXEC); /* -1: no direct I/O here */
	*out = f;
	return 0;
}

/* Write all n bytes at off through fd: f->fd, or f->dfd (O_DIRECT), where a
 * write the filesystem refuses (EINVAL) or cuts short goes on buffered. */
static int pwrite_all(arena_outfile *f, int fd, const uint8_t *p, size_t n, uint64_t off)
{
	while (n) {
		ssize_t w;
		if (write_should_fail()) {
			errno = ENOSPC;
			w = -1;
		} else {
			w = pwrite(fd, p, n, (off_t)off);
		}
		if (w < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EINVAL && fd == f->dfd) /* the filesystem refused this direct write */
				return pwrite_all(f, f->fd, p, n, off);
			return arena_syserrorf(ARENA_E_IO, errno, "%s: write failed at byte %llu", f->path,
					       (unsigned long long)off);
		}
		if (fd == f->dfd && w % 4096) /* a short direct write: finish it buffered */
			fd = f->fd;
		p += w, n -= (size_t)w, off += (uint64_t)w;
	}
	return 0;
}

int arena_outfile_pwrite(arena_outfile *f, const void *buf, size_t n, uint64_t off)
{
	return pwrite_all(f, f->fd, buf, n, off);
}

int arena_outfile_reserve(arena_outfile *f, uint64_t size)
{
	int e = posix_fallocate(f->fd, 0, (off_t)size);
	if (e == 0 || e == EOPNOTSUPP || e == EINVAL)
		return 0;
	return arena_syserrorf(ARENA_E_IO, e, "%s: cannot reserve %llu bytes", f->path, (unsigned long long)size);
}

int arena_outfile_pwrite_direct(arena_outfile *f, const void *buf, size_t n, uint64_t off)
{
	if (f->dfd < 0 || ((uintptr_t)buf | n | off) % 4096)
		return arena_outfile_pwrite(f, buf, n, off);
	return pwrite_all(f, f->dfd, buf, n, off);
}

int arena_outfile_write(arena_outfile *f, const void *buf, size_t n)
{
	int rc = arena_outfile_pwrite(f, buf, n, f->size);
	if (!rc)
		f->size += n;
	return rc;
}

static void outfile_free(arena_outfile *f)
{
	if (f->dfd >= 0)
		close(f->dfd);
	if (f->fd >= 0)
		close(f->fd);
	arena_free(f->tmp_path);
	arena_free(f->path);
	arena_free(f);
}

int arena_outfile_commit(arena_outfile *f)
{
	int rc = 0;
	/* Everything that can fail for want of memory happens before the rename:
	 * a commit that returns an error never leaves the target in place. */
	char *dir = dir_part(f->path);
	if (!dir)
		rc = arena_errorf(ARENA_E_NOMEM, "%s: out of memory", f->path);
	else if (fsync(f->fd) < 0)
		rc = arena_syserrorf(ARENA_E_IO, errno, "%s: fsync failed", f->path);
	if (!rc) {
		int cr = close(f->fd);
		f->fd = -1; /* released even when close fails */
		if (cr < 0)
			rc = arena_syserrorf(ARENA_E_IO, errno, "%s: close failed", f->path);
	}
	if (!rc && rename(f->tmp_path, f->path) < 0)
		rc = arena_syserrorf(ARENA_E_IO, errno, "%s: cannot rename the temporary into place", f->path);
	if (rc) {
		unlink(f->tmp_path);
	} else {
		int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (dfd >= 0) {
			fsync(dfd);
			close(dfd);
		}
	}
	arena_free(dir);
	outfile_free(f);
	return rc;
}

void arena_outfile_abort(arena_outfile *f)
{
	if (!f)
		return;
	if (f->tmp_path)
		unlink(f->tmp_path);
	outfile_free(f);
}

int arena_outfile_check_input_id(const char *path, uint64_t dev, uint64_t ino, const char *input)
{
	struct stat st;
	if (stat(path, &st) == 0 && (uint64_t)st.st_dev == dev && (uint64_t)st.st_ino == ino)
		return arena_errorf(ARENA_E(OUTPUT_IS_INPUT), "%s: is an input (the same file as %s); name another output",
				    path, input);
	return 0;
}

int arena_outfile_check_input(const char *path, int input_fd, const char *input)
{
	struct stat st;
	if (input_fd < 0 || fstat(input_fd, &st) < 0)
		return 0;
	return arena_outfile_check_input_id(path, (uint64_t)st.st_dev, (uint64_t)st.st_ino, input);
}
