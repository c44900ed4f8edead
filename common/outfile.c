/* outfile.c - whole files or none: an unnamed file (O_TMPFILE) linked in
 * when whole, else a locked named temporary renamed into place (outfile.h). */
#include "outfile.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "alloc.h"
#include "err.h"
#include "fault.h"
#include "io.h"

static arena__fault write_fault, stored_fault;
static atomic_int force_named;

void arena_fault_write(long n)
{
	arena__fault_arm(&write_fault, n);
}

void arena_fault_stored(long n)
{
	arena__fault_arm(&stored_fault, n);
}

void arena__outfile_force_named(int on)
{
	atomic_store(&force_named, on);
}

static int write_should_fail(void)
{
	return arena__fault_hit(&write_fault);
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

static const char *base_part(const char *path)
{
	const char *s = strrchr(path, '/');
	return s ? s + 1 : path;
}

/* Temporaries are "." base ".tmp-" and 6 letters or digits (mkostemp's). */
#define TMP_MID ".tmp-"
#define TMP_RANDOM 6

static int is_temp_of(const char *name, const char *base)
{
	size_t b = strlen(base), m = strlen(TMP_MID), i = 0;
	if (name[0] != '.' || strncmp(name + 1, base, b) || strncmp(name + 1 + b, TMP_MID, m))
		return 0;
	for (const char *r = name + 1 + b + m; r[i]; i++)
		if (!((r[i] >= '0' && r[i] <= '9') || (r[i] >= 'a' && r[i] <= 'z') || (r[i] >= 'A' && r[i] <= 'Z')))
			return 0;
	return i == TMP_RANDOM;
}

/* A fresh temporary name for f in f->tmp_path (linkat needs a name of its
 * own; it fails, and is retried, when the name is taken). */
static void temp_name(arena_outfile *f)
{
	static const char az[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
	static atomic_uint counter;
	unsigned char r[TMP_RANDOM];
	if (getrandom(r, sizeof(r), GRND_NONBLOCK) != (ssize_t)sizeof(r)) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		unsigned long long x = (unsigned long long)ts.tv_nsec ^ ((unsigned long long)getpid() << 20) ^
				       ((unsigned long long)atomic_fetch_add(&counter, 1) << 40);
		for (size_t i = 0; i < sizeof(r); i++, x >>= 8)
			r[i] = (unsigned char)x;
	}
	char *p = f->tmp_path + sprintf(f->tmp_path, "%s/.%s" TMP_MID, f->dir, base_part(f->path));
	for (size_t i = 0; i < sizeof(r); i++)
		p[i] = az[r[i] % (sizeof(az) - 1)];
	p[sizeof(r)] = '\0';
}

/* The writer holds an exclusive lock on its temporary while the file is
 * open. Where the filesystem has no locks, it goes unprotected, and no
 * sweep can take a lock on it either: it is never removed by one. */
static void lock_temp(int fd)
{
	while (flock(fd, LOCK_EX) < 0 && errno == EINTR)
		;
}

/* Remove the temporaries of `base` in `dir` whose writer is gone: each
 * writer holds its lock until its temporary is renamed or removed, so a
 * temporary whose lock can be taken belongs to a dead process (or to an
 * arena from before the locks). Best effort: nothing here fails an open. */
static void sweep(const char *dir, const char *base)
{
	DIR *d = opendir(dir);
	if (!d)
		return;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (!is_temp_of(e->d_name, base))
			continue;
		/* O_RDWR: NFS emulates flock with byte-range locks, which need it */
		const int fl = O_NONBLOCK | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC;
		int fd = openat(dirfd(d), e->d_name, O_RDWR | fl);
		if (fd < 0 && errno == EACCES)
			fd = openat(dirfd(d), e->d_name, O_RDONLY | fl);
		if (fd < 0)
			continue;
		struct stat a, b;
		if (fstat(fd, &a) == 0 && S_ISREG(a.st_mode) && flock(fd, LOCK_EX | LOCK_NB) == 0 &&
		    fstatat(dirfd(d), e->d_name, &b, AT_SYMLINK_NOFOLLOW) == 0 && a.st_dev == b.st_dev &&
		    a.st_ino == b.st_ino)
			unlinkat(dirfd(d), e->d_name, 0);
		close(fd);
	}
	closedir(d);
}

/* An unnamed file in f->dir (O_TMPFILE), locked. 1 when made, 0 when the
 * filesystem or kernel has none or /proc (to link it in) is missing, or an
 * error. */
static int create_unnamed(arena_outfile *f)
{
	int fd = open(f->dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0644);
	if (fd < 0) {
		int e = errno;
		if (e == EOPNOTSUPP || e == EISDIR || e == EINVAL)
			return 0;
		return arena_syserrorf(ARENA_E_IO, e, "%s: cannot create output file", f->path);
	}
	char proc[64];
	struct stat st;
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
	if (stat(proc, &st) < 0) {
		close(fd);
		return 0;
	}
	lock_temp(fd);
	f->fd = fd;
	return 1;
}

/* A named temporary in f->tmp_path, locked. */
static int create_named(arena_outfile *f)
{
	for (int tries = 0;; tries++) {
		sprintf(f->tmp_path, "%s/.%s" TMP_MID "XXXXXX", f->dir, base_part(f->path));
		int fd = mkostemp(f->tmp_path, O_CLOEXEC);
		if (fd < 0)
			return arena_syserrorf(ARENA_E_IO, errno, "%s: cannot create output file", f->path);
		lock_temp(fd);
		/* A sweep between mkostemp and the lock may have taken the name. */
		struct stat a, b;
		if (tries < 100 && fstat(fd, &a) == 0 &&
		    (stat(f->tmp_path, &b) < 0 || a.st_dev != b.st_dev || a.st_ino != b.st_ino)) {
			close(fd);
			continue;
		}
		f->fd = fd;
		f->named = 1;
		return 0;
	}
}

static const char *kind(mode_t m)
{
	return S_ISFIFO(m) ? "a FIFO" : S_ISCHR(m) || S_ISBLK(m) ? "a device" : S_ISSOCK(m) ? "a socket" : "something";
}

static void outfile_free(arena_outfile *f)
{
	if (f->named)
		unlink(f->tmp_path);
	/* Closed after the unlink or rename: the lock guards the name until it is gone. */
	if (f->dfd >= 0)
		close(f->dfd);
	if (f->rfd >= 0)
		close(f->rfd);
	if (f->fd >= 0)
		close(f->fd);
	arena_free(f->tmp_path);
	arena_free(f->dir);
	arena_free(f->path);
	arena_free(f);
}

static int exists_error(const char *path)
{
	return arena_errorf(ARENA_E(OUTPUT_EXISTS), "%s: exists; --force replaces it (Python: force=True)", path);
}

int arena_outfile_check_new(const char *path)
{
	struct stat st;
	return lstat(path, &st) == 0 ? exists_error(path) : 0;
}

int arena_outfile_open(const char *path, arena_outfile **out)
{
	return arena_outfile_create(path, 0, out);
}

int arena_outfile_create(const char *path, unsigned flags, arena_outfile **out)
{
	*out = NULL;
	arena_outfile *f = arena_calloc(1, sizeof(*f));
	char *dir = dir_part(path);
	const char *base = base_part(path);
	if (!f || !dir || !(f->path = arena_strdup(path)) ||
	    !(f->tmp_path = arena_malloc(strlen(dir) + strlen(base) + 24))) {
		arena_free(dir);
		if (f) {
			arena_free(f->path);
			arena_free(f);
		}
		return arena_errorf(ARENA_E_NOMEM, "%s: out of memory", path);
	}
	f->dir = dir;
	f->fd = f->dfd = f->rfd = -1;
	int rc = 0;
	struct stat st;
	int exists = *base && stat(path, &st) == 0;
	if (!*base || (exists && S_ISDIR(st.st_mode)))
		rc = arena_errorf(ARENA_E_USAGE, "%s: output path names a folder, not a file", path);
	else if (exists && !S_ISREG(st.st_mode))
		rc = arena_errorf(ARENA_E_USAGE, "%s: output path names %s, not a regular file", path, kind(st.st_mode));
	else if (flags & ARENA_OUTFILE_NEW)
		rc = arena_outfile_check_new(path);
	f->keep = !!(flags & ARENA_OUTFILE_NEW);
	if (rc) {
		outfile_free(f);
		return rc;
	}
	sweep(dir, base);
	rc = atomic_load(&force_named) ? 0 : create_unnamed(f);
	if (rc == 0)
		rc = create_named(f);
	else if (rc == 1)
		rc = 0;
	if (rc) {
		outfile_free(f);
		return rc;
	}
	fchmod(f->fd, 0644);
	char proc[64];
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", f->fd);
	f->dfd = open(f->named ? f->tmp_path : proc, O_WRONLY | O_DIRECT | O_CLOEXEC); /* -1: no direct I/O here */
	/* Reads back without read-ahead: only the pages asked for, each already
	 * written whole, so no page of a range another thread is still writing
	 * with O_DIRECT is brought into the cache (its old bytes would stay). */
	f->rfd = open(f->named ? f->tmp_path : proc, O_RDONLY | O_CLOEXEC);
	if (f->rfd >= 0)
		posix_fadvise(f->rfd, 0, 0, POSIX_FADV_RANDOM);
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

int arena_outfile_truncate(arena_outfile *f, uint64_t size)
{
	if (ftruncate(f->fd, (off_t)size) < 0)
		return arena_syserrorf(ARENA_E_IO, errno, "%s: cannot set the length to %llu bytes", f->path,
				       (unsigned long long)size);
	return 0;
}

int arena_outfile_pwrite_direct(arena_outfile *f, const void *buf, size_t n, uint64_t off)
{
	if (f->dfd < 0 || ((uintptr_t)buf | n | off) % 4096)
		return arena_outfile_pwrite(f, buf, n, off);
	return pwrite_all(f, f->dfd, buf, n, off);
}

int arena_outfile_check(arena_outfile *f, void *scratch, const void *want, size_t n, uint64_t off)
{
	/* Through the page cache: after a direct write the pages come from the
	 * disk, and stay cached for the reads that follow (the image's load). */
	const int fd = f->rfd >= 0 ? f->rfd : f->fd;
	for (size_t got = 0; got < n;) {
		ssize_t r = arena__read_fault() ? (errno = EIO, -1) : pread(fd, (uint8_t *)scratch + got, n - got,
									     (off_t)(off + got));
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return arena_syserrorf(ARENA_E_IO, r < 0 ? errno : EIO, "%s: reading back what was written at byte %llu failed",
					       f->path, (unsigned long long)(off + got));
		got += (size_t)r;
	}
	if (arena__fault_hit(&stored_fault))
		((uint8_t *)scratch)[n / 2] ^= 0x20; /* a disk that kept other bytes than it was given */
	if (memcmp(scratch, want, n)) {
		size_t at = 0;
		while (((const uint8_t *)scratch)[at] == ((const uint8_t *)want)[at])
			at++;
		return arena_errorf(ARENA_E_IO,
				    "%s: the bytes read back at byte %llu differ from those written there: the disk "
				    "did not keep what it was given (a failing disk or filesystem); nothing was "
				    "written in place of the output",
				    f->path, (unsigned long long)(off + at));
	}
	return 0;
}

int arena_outfile_write(arena_outfile *f, const void *buf, size_t n)
{
	int rc = arena_outfile_pwrite(f, buf, n, f->size);
	if (!rc)
		f->size += n;
	return rc;
}

/* Name the unnamed file: the target itself where there is none (*placed),
 * else a fresh temporary, to be renamed over it. */
static int link_unnamed(arena_outfile *f, int *placed)
{
	char proc[64];
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", f->fd);
	if (linkat(AT_FDCWD, proc, AT_FDCWD, f->path, AT_SYMLINK_FOLLOW) == 0) {
		*placed = 1;
		return 0;
	}
	int e = errno;
	if (e == EEXIST && f->keep) /* a file appeared meanwhile: it stays */
		return exists_error(f->path);
	for (int tries = 0; e == EEXIST && tries < 100; tries++) {
		temp_name(f);
		if (linkat(AT_FDCWD, proc, AT_FDCWD, f->tmp_path, AT_SYMLINK_FOLLOW) == 0) {
			f->named = 1;
			return 0;
		}
		e = errno;
	}
	return arena_syserrorf(ARENA_E_IO, e, "%s: cannot link the output into place", f->path);
}

/* Rename the named temporary to the target only where no name is, in one
 * step: renameat2's RENAME_NOREPLACE, or where the filesystem has none a
 * hard link (which fails where a name is) and the temporary's unlink. */
static int place_new(arena_outfile *f)
{
	if (renameat2(AT_FDCWD, f->tmp_path, AT_FDCWD, f->path, RENAME_NOREPLACE) == 0)
		return 0;
	int e = errno;
	if (e == EEXIST)
		return exists_error(f->path);
	if (e != EINVAL && e != ENOSYS && e != EOPNOTSUPP)
		return arena_syserrorf(ARENA_E_IO, e, "%s: cannot rename the temporary into place", f->path);
	if (link(f->tmp_path, f->path) < 0) {
		e = errno;
		if (e == EEXIST)
			return exists_error(f->path);
		return arena_syserrorf(ARENA_E_IO, e, "%s: cannot link the output into place", f->path);
	}
	unlink(f->tmp_path);
	return 0;
}

int arena_outfile_commit(arena_outfile *f)
{
	/* Nothing here allocates: a commit that returns an error never leaves
	 * the target changed. The descriptors are closed after the rename (the
	 * lock guards the temporary's name till then); fsync has left close
	 * nothing to write. */
	int rc = 0, placed = 0;
	if (fsync(f->fd) < 0)
		rc = arena_syserrorf(ARENA_E_IO, errno, "%s: fsync failed", f->path);
	if (!rc && !f->named)
		rc = link_unnamed(f, &placed);
	if (!rc && !placed && f->keep)
		rc = place_new(f);
	else if (!rc && !placed && rename(f->tmp_path, f->path) < 0)
		rc = arena_syserrorf(ARENA_E_IO, errno, "%s: cannot rename the temporary into place", f->path);
	if (!rc) {
		f->named = 0; /* renamed: the target's now */
		int dfd = open(f->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (dfd >= 0) {
			fsync(dfd);
			close(dfd);
		}
	}
	outfile_free(f);
	return rc;
}

void arena_outfile_abort(arena_outfile *f)
{
	if (f)
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
