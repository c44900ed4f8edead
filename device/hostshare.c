/* hostshare.c - a model's host copies shared by the processes of a host
 * (see hostshare.h and docs/SHARING.md). */
#include "hostshare.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../common/alloc.h"
#include "../common/err.h"
#include "../common/fault.h"

#define PAGE 4096u
#define MAGIC "ARENASHR"
#define VERSION 1u
#define REGISTRY_MAX (1u << 20) /* a registry file larger than this is not one of ours */

enum { LOADING = 0, COMPLETE = 1 };

/* The region's first page. */
typedef struct share_header {
	char magic[8];
	uint32_t version, state;
	uint64_t key[2];
	uint64_t image[2];
	uint64_t len, meta;
} share_header;

/* A registry line: a process holding the region at descriptor fd. */
typedef struct holder {
	long pid;
	int fd;
	unsigned long long start; /* the process's start time (clock ticks after boot): a pid reused is another */
} holder;

struct arena_host_share {
	arena_share_key key;
	char name[48];
	char path[4096];  /* the registry file */
	int fd;           /* the memfd (or our descriptor of it) */
	int lfd;          /* the registry, locked: while loading */
	uint8_t *map;     /* header page, host bytes, meta */
	uint64_t total, len, meta;
	int published;    /* named in the registry */
	int forgotten;    /* its line dropped at exit (exit_forget) */
	arena_host_share *next; /* in `live` */
};

/* The regions this process has published or mapped: at exit (a program
 * that ends without closing its arenas: Python's interpreter leaves the
 * objects DLPack tensors hold) their registry lines go, so that the last
 * process to end removes the file as the last to close does. The memory
 * is the kernel's to free either way. */
static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static arena_host_share *live;
static pid_t live_pid; /* the process the list is of (a forked child's differs: it holds no line) */

unsigned arena__share_publish_delay_ms;
static arena__fault share_fault;

void arena_fault_share(long n)
{
	arena__fault_arm(&share_fault, n);
}

int arena_fault_share_fired(void)
{
	return arena__fault_fired(&share_fault);
}

/* 1 when this system call must fail by injection (errno EIO). */
static int fault(void)
{
	if (!arena__fault_hit(&share_fault))
		return 0;
	errno = EIO;
	return 1;
}

void arena_share_key_name(const arena_share_key *key, char name[48])
{
	snprintf(name, 48, "arena-%016" PRIx64 "%016" PRIx64, key->h[0], key->h[1]);
}

static uint64_t page_up(uint64_t n)
{
	return (n + PAGE - 1) / PAGE * PAGE;
}

/* ---- processes ---------------------------------------------------------------- */

/* The start time of process pid (field 22 of /proc/pid/stat), or 0 when it
 * is gone or a zombie. */
static unsigned long long proc_start(long pid)
{
	char p[64], buf[1024];
	snprintf(p, sizeof(p), "/proc/%ld/stat", pid);
	int fd = open(p, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = 0;
	const char *s = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
	if (!s || s[1] != ' ' || s[2] == 'Z' || s[2] == 'X')
		return 0;
	s += 2;
	for (int field = 3; field < 22 && s; field++) { /* s is at field `field` */
		s = strchr(s, ' ');
		if (s)
			s++;
	}
	return s ? strtoull(s, NULL, 10) : 0;
}

static int holder_live(const holder *h)
{
	return h->start && proc_start(h->pid) == h->start;
}

/* ---- the registry file ------------------------------------------------------ */

/* Lines of the registry at lfd ("pid fd start"; others ignored): the live
 * holders only. NOMEM, IO (quiet: no message, for close, which keeps the
 * message of the failure that may have led to it). */
#define SAY(q, expr) ((q) ? ARENA_E_IO : (expr))
static int registry_read(int lfd, holder **out, size_t *n, int quiet)
{
	*out = NULL;
	*n = 0;
	struct stat st;
	if (fstat(lfd, &st) < 0)
		return SAY(quiet, arena_syserrorf(ARENA_E_IO, errno, "host share: cannot read its registry"));
	if (st.st_size <= 0 || st.st_size > REGISTRY_MAX)
		return 0; /* empty, or not ours: rewritten */
	char *buf = arena_malloc((size_t)st.st_size + 1);
	if (!buf)
		return SAY(quiet, arena_errorf(ARENA_E_NOMEM, "out of memory"));
	ssize_t got = pread(lfd, buf, (size_t)st.st_size, 0);
	if (got < 0) {
		arena_free(buf);
		return SAY(quiet, arena_syserrorf(ARENA_E_IO, errno, "host share: cannot read its registry"));
	}
	buf[got] = 0;
	size_t cap = 0;
	int rc = 0;
	for (char *line = buf, *next; line && *line && !rc; line = next) {
		next = strchr(line, '\n');
		if (next)
			*next++ = 0;
		holder h;
		if (sscanf(line, "%ld %d %llu", &h.pid, &h.fd, &h.start) != 3 || h.pid <= 0 || h.fd < 0 ||
		    !holder_live(&h))
			continue;
		if (*n == cap) {
			size_t nc = cap ? 2 * cap : 8;
			holder *t = arena_realloc(*out, nc * sizeof(*t));
			if (!t) {
				rc = SAY(quiet, arena_errorf(ARENA_E_NOMEM, "out of memory"));
				break;
			}
			*out = t, cap = nc;
		}
		(*out)[(*n)++] = h;
	}
	arena_free(buf);
	if (rc) {
		arena_free(*out);
		*out = NULL;
		*n = 0;
	}
	return rc;
}

/* Rewrite the registry with these holders. IO (inject: failures may be
 * injected and are said; else quiet). */
static int registry_write(int lfd, const holder *h, size_t n, int inject)
{
	char line[96];
	uint64_t off = 0;
	if ((inject && fault()) || ftruncate(lfd, 0) < 0)
		return SAY(!inject, arena_syserrorf(ARENA_E_IO, errno, "host share: cannot write its registry"));
	for (size_t i = 0; i < n; i++) {
		int k = snprintf(line, sizeof(line), "%ld %d %llu\n", h[i].pid, h[i].fd, h[i].start);
		if ((inject && fault()) || pwrite(lfd, line, (size_t)k, (off_t)off) != k)
			return SAY(!inject, arena_syserrorf(ARENA_E_IO, errno, "host share: cannot write its registry"));
		off += (uint64_t)k;
	}
	return 0;
}

/* Rewrite the registry with holders h[0..n) (failures injectable); when
 * that fails, put back h[0..n_before), the lines it had, as far as it can
 * (a registry that lost a live holder's line would make the next process
 * load the region again). IO. */
static int registry_set(int lfd, const holder *h, size_t n, size_t n_before)
{
	int rc = registry_write(lfd, h, n, 1);
	if (rc)
		(void)registry_write(lfd, h, n_before, 0);
	return rc;
}

/* Open and lock the registry file (created when `create`): its descriptor,
 * or -1 with *rc set (0 and -1: it does not exist and create is 0). The
 * file may be removed by its last holder between open and lock: then it
 * is opened again. inject: failures may be injected and are said (else
 * quiet). nonblock: fail rather than wait for the lock. */
static int registry_lock(const char *path, int create, int inject, int nonblock, int *rc)
{
	*rc = 0;
	for (int tries = 0; tries < 1000; tries++) {
		/* made here (O_EXCL): removed again when it cannot be locked */
		int made = create, lfd = -1;
		if (!(inject && fault())) {
			lfd = create ? open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_CREAT | O_EXCL, 0600) : -1;
			if (lfd < 0 && (!create || errno == EEXIST)) {
				made = 0;
				lfd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
				if (lfd < 0 && errno == ENOENT && create)
					continue; /* removed meanwhile: make it */
			}
		}
		if (lfd < 0) {
			if (errno == ENOENT && !create)
				return -1;
			*rc = SAY(!inject, arena_syserrorf(ARENA_E_IO, errno, "host share: cannot open its registry %s", path));
			return -1;
		}
		int e = 0;
		while ((inject && fault()) || flock(lfd, LOCK_EX | (nonblock ? LOCK_NB : 0)) < 0) {
			if (errno != EINTR) {
				e = errno;
				break;
			}
		}
		if (e) {
			if (made) /* a process that opened it meanwhile finds it gone once it has the lock, and makes it anew */
				unlink(path);
			close(lfd);
			*rc = SAY(!inject, arena_syserrorf(ARENA_E_IO, e, "host share: cannot lock its registry %s", path));
			return -1;
		}
		struct stat a, b;
		if (fstat(lfd, &a) == 0 && stat(path, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino)
			return lfd;
		close(lfd); /* removed (or replaced) while we waited: the file at path now */
	}
	*rc = SAY(!inject, arena_errorf(ARENA_E_IO, "host share: its registry %s keeps being replaced", path));
	return -1;
}

/* Drop holder (pid, fd) from the registry lfd holds, and remove the file
 * when no live holder remains. Best effort: a line left is dropped by the
 * next process once this one is gone. */
static void registry_forget(const char *path, int lfd, long pid, int fd)
{
	holder *h = NULL;
	size_t n = 0;
	if (registry_read(lfd, &h, &n, 1))
		return;
	size_t k = 0;
	for (size_t i = 0; i < n; i++)
		if (!(h[i].pid == pid && h[i].fd == fd))
			h[k++] = h[i];
	if (!k)
		unlink(path);
	else
		(void)registry_write(lfd, h, k, 0);
	arena_free(h);
}

/* ---- the region ---------------------------------------------------------------- */

/* Open holder h's descriptor when it is a complete region called `name`
 * (the link names our memfd, the header says so): the descriptor (O_RDWR
 * when `rw`), its header in *hd; or -1. */
static int holder_open(const char *name, const holder *h, int rw, share_header *hd)
{
	char p[64], link[256];
	snprintf(p, sizeof(p), "/proc/%ld/fd/%d", h->pid, h->fd);
	ssize_t n = readlink(p, link, sizeof(link) - 1);
	if (n <= 0)
		return -1;
	link[n] = 0;
	char want[64];
	int k = snprintf(want, sizeof(want), "/memfd:%s", name);
	if (strncmp(link, want, (size_t)k) || (link[k] && link[k] != ' '))
		return -1; /* that descriptor is something else now: never opened */
	int fd = open(p, (rw ? O_RDWR : O_RDONLY) | O_CLOEXEC);
	if (fd < 0)
		return -1;
	struct stat st;
	if (fstat(fd, &st) < 0 || pread(fd, hd, sizeof(*hd), 0) != (ssize_t)sizeof(*hd) || memcmp(hd->magic, MAGIC, 8) ||
	    hd->version != VERSION || hd->state != COMPLETE ||
	    (uint64_t)st.st_size != PAGE + page_up(hd->len) + page_up(hd->meta)) {
		close(fd);
		return -1;
	}
	return fd;
}

/* Map holder h's region when it is the complete region s names: 1 (s->fd
 * and s->map set), 0 (not it), or -1 (it, but it could not be mapped:
 * errno). */
static int map_holder(arena_host_share *s, const holder *h)
{
	share_header hd;
	int fd = holder_open(s->name, h, 1, &hd);
	if (fd < 0)
		return 0;
	if (hd.key[0] != s->key.h[0] || hd.key[1] != s->key.h[1] || hd.len != s->len || hd.meta != s->meta) {
		close(fd);
		return 0;
	}
	void *m = fault() ? MAP_FAILED : mmap(NULL, s->total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED) {
		const int e = errno;
		close(fd);
		errno = e;
		return -1;
	}
	s->fd = fd;
	s->map = m;
	return 1;
}

static const char *share_dir(void)
{
	const char *dir = getenv("ARENA_SHARE_DIR");
	return dir && *dir ? dir : "/dev/shm";
}

uint64_t arena_host_share_image_bytes(const uint64_t image[2])
{
	DIR *d = opendir(share_dir());
	if (!d)
		return 0;
	uint64_t best = 0;
	for (struct dirent *e; (e = readdir(d));) {
		size_t n = strlen(e->d_name);
		if (strncmp(e->d_name, "arena-", 6) || n != 6 + 32 + 5 || strcmp(e->d_name + n - 5, ".lock"))
			continue;
		char name[48], path[4096];
		snprintf(name, sizeof(name), "%.*s", (int)(n - 5), e->d_name);
		snprintf(path, sizeof(path), "%s/%s", share_dir(), e->d_name);
		int rc, lfd = registry_lock(path, 0, 0, 1, &rc); /* a loader holds it: skipped */
		if (lfd < 0)
			continue;
		holder *h = NULL;
		size_t k = 0;
		if (registry_read(lfd, &h, &k, 1) == 0)
			for (size_t i = 0; i < k; i++) {
				share_header hd;
				int fd = holder_open(name, &h[i], 0, &hd);
				if (fd < 0)
					continue;
				close(fd);
				if (hd.image[0] == image[0] && hd.image[1] == image[1] && hd.len + hd.meta > best)
					best = hd.len + hd.meta;
				break;
			}
		arena_free(h);
		flock(lfd, LOCK_UN);
		close(lfd);
	}
	closedir(d);
	return best;
}

/* A new region: the memfd sized and mapped, its header LOADING. IO, NOMEM. */
static int make_region(arena_host_share *s)
{
	int fd = fault() ? -1 : memfd_create(s->name, MFD_CLOEXEC);
	if (fd < 0)
		return arena_syserrorf(ARENA_E_IO, errno, "host share: cannot make a memory file for %" PRIu64 " bytes",
				       s->total);
	if (fault() || ftruncate(fd, (off_t)s->total) < 0) {
		int e = errno;
		close(fd);
		return arena_syserrorf(ARENA_E_NOMEM, e, "host share: cannot size a memory file of %" PRIu64 " bytes",
				       s->total);
	}
	void *m = fault() ? MAP_FAILED : mmap(NULL, s->total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED) {
		int e = errno;
		close(fd);
		return arena_syserrorf(ARENA_E_NOMEM, e, "host share: cannot map %" PRIu64 " bytes of a memory file",
				       s->total);
	}
	madvise((uint8_t *)m + PAGE, s->total - PAGE, MADV_HUGEPAGE); /* as the private mapping (shmem THP permitting) */
	share_header *hd = m;
	memcpy(hd->magic, MAGIC, 8);
	hd->version = VERSION;
	hd->state = LOADING;
	hd->key[0] = s->key.h[0];
	hd->key[1] = s->key.h[1];
	hd->image[0] = s->key.image[0];
	hd->image[1] = s->key.image[1];
	hd->len = s->len;
	hd->meta = s->meta;
	s->fd = fd;
	s->map = m;
	return 0;
}

static void region_drop(arena_host_share *s)
{
	if (s->map)
		munmap(s->map, s->total);
	if (s->fd >= 0)
		close(s->fd);
	s->map = NULL;
	s->fd = -1;
}

static holder self_holder(const arena_host_share *s)
{
	holder me = {(long)getpid(), s->fd, 0};
	me.start = proc_start(me.pid);
	return me;
}

static void exit_forget(void)
{
	pthread_mutex_lock(&live_mu);
	for (arena_host_share *s = live; s && live_pid == getpid(); s = s->next) {
		int rc, lfd = registry_lock(s->path, 0, 0, 1, &rc); /* never waits at exit: a line left is dropped later */
		if (lfd >= 0) {
			registry_forget(s->path, lfd, (long)live_pid, s->fd);
			flock(lfd, LOCK_UN);
			close(lfd);
		}
		s->forgotten = 1;
	}
	pthread_mutex_unlock(&live_mu);
}

/* s is named in the registry now: listed for exit_forget. */
static void live_add(arena_host_share *s)
{
	static int at_exit; /* exit_forget registered */
	pthread_mutex_lock(&live_mu);
	if (!at_exit)
		at_exit = atexit(exit_forget) == 0;
	if (live_pid != getpid()) /* a forked child: its parent's list is not its own */
		live = NULL, live_pid = getpid();
	s->next = live;
	live = s;
	pthread_mutex_unlock(&live_mu);
}

static void live_remove(arena_host_share *s)
{
	pthread_mutex_lock(&live_mu);
	for (arena_host_share **p = &live; *p && live_pid == getpid(); p = &(*p)->next)
		if (*p == s) {
			*p = s->next;
			break;
		}
	pthread_mutex_unlock(&live_mu);
}

int arena_host_share_open(const arena_share_key *key, uint64_t len, uint64_t meta, arena_host_share **out,
			  int *complete)
{
	*out = NULL;
	*complete = 0;
	arena_host_share *s = arena_calloc(1, sizeof(*s));
	if (!s)
		return arena_errorf(ARENA_E_NOMEM, "out of memory");
	s->key = *key;
	s->fd = s->lfd = -1;
	s->len = len;
	s->meta = meta;
	s->total = PAGE + page_up(len) + page_up(meta);
	arena_share_key_name(key, s->name);
	snprintf(s->path, sizeof(s->path), "%s/%s.lock", share_dir(), s->name);
	int rc;
	holder *h = NULL;
	size_t n = 0;
	s->lfd = registry_lock(s->path, 1, 1, 0, &rc);
	if (s->lfd < 0)
		goto fail;
	if ((rc = registry_read(s->lfd, &h, &n, 0)))
		goto fail;
	int mapped = 0;
	for (size_t i = 0; i < n && !mapped; i++)
		if ((mapped = map_holder(s, &h[i])) < 0) {
			rc = arena_syserrorf(ARENA_E_NOMEM, errno, "host share: cannot map %" PRIu64 " bytes of %s",
					     s->total, s->name);
			goto fail;
		}
	if (mapped) {
		holder *t = arena_realloc(h, (n + 1) * sizeof(*t));
		if (!t) {
			rc = arena_errorf(ARENA_E_NOMEM, "out of memory");
			goto fail;
		}
		h = t;
		h[n] = self_holder(s);
		if ((rc = registry_set(s->lfd, h, n + 1, n)))
			goto fail;
		s->published = 1;
		live_add(s);
		*complete = 1;
		flock(s->lfd, LOCK_UN);
		close(s->lfd);
		s->lfd = -1;
	} else {
		if ((rc = registry_set(s->lfd, h, n, n)) || (rc = make_region(s)))
			goto fail;
	}
	arena_free(h);
	*out = s;
	return 0;
fail:
	arena_free(h);
	s->published = 0;
	arena_host_share_close(s);
	return rc;
}

uint8_t *arena_host_share_base(const arena_host_share *s)
{
	return s->map + PAGE;
}

uint8_t *arena_host_share_meta(const arena_host_share *s)
{
	return s->map + PAGE + page_up(s->len);
}

int arena_host_share_publish(arena_host_share *s)
{
	if (s->published || s->lfd < 0)
		return arena_errorf(ARENA_E_INTERNAL, "host share: %s published twice", s->name);
	if (arena__share_publish_delay_ms) { /* tests: a slow loader */
		struct timespec ts = {arena__share_publish_delay_ms / 1000, (long)(arena__share_publish_delay_ms % 1000) * 1000000L};
		while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
			;
	}
	holder *h = NULL;
	size_t n = 0;
	int rc = registry_read(s->lfd, &h, &n, 0);
	if (!rc) {
		holder *t = arena_realloc(h, (n + 1) * sizeof(*t));
		if (!t)
			rc = arena_errorf(ARENA_E_NOMEM, "out of memory");
		else
			h = t, h[n] = self_holder(s);
	}
	if (!rc) {
		atomic_thread_fence(memory_order_release);
		((share_header *)s->map)->state = COMPLETE; /* before the line: whoever reads it finds it whole */
		rc = registry_set(s->lfd, h, n + 1, n);
		if (rc)
			((share_header *)s->map)->state = LOADING;
	}
	arena_free(h);
	if (rc)
		return rc;
	mprotect(s->map, PAGE, PROT_READ); /* best effort: the header is never written again */
	s->published = 1;
	live_add(s);
	flock(s->lfd, LOCK_UN);
	close(s->lfd);
	s->lfd = -1;
	return 0;
}

void arena_host_share_close(arena_host_share *s)
{
	if (!s)
		return;
	const long pid = (long)getpid();
	if (s->lfd >= 0) { /* never published: nobody else knows it */
		holder *h = NULL;
		size_t n = 0;
		if (registry_read(s->lfd, &h, &n, 1) == 0 && !n)
			unlink(s->path);
		arena_free(h);
		region_drop(s);
		flock(s->lfd, LOCK_UN);
		close(s->lfd);
	} else if (s->published) {
		live_remove(s);
		int rc, lfd = s->forgotten ? -1 : registry_lock(s->path, 0, 0, 0, &rc);
		if (lfd >= 0) {
			registry_forget(s->path, lfd, pid, s->fd);
			flock(lfd, LOCK_UN);
			close(lfd);
		}
		region_drop(s); /* after the line is gone: nobody opens a descriptor being closed */
	} else {
		region_drop(s);
	}
	arena_free(s);
}
