/* hostshare.c - a model's host copies shared by the processes of one user
 * on a host (see hostshare.h and docs/SHARING.md). */
#include "hostshare.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
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

#ifndef F_SEAL_FUTURE_WRITE /* Linux 5.1; older C libraries' headers lack it */
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

#define PAGE 4096u
#define MAGIC "ARENASHR"
#define REGISTRY_MAX (1u << 20) /* a registry file larger than this is not one of ours */
#define DIR_MAX 4096            /* the share folder's path, its NUL included */
#define SEALS_SIZE (F_SEAL_SHRINK | F_SEAL_GROW)
#define SEALS_DONE (SEALS_SIZE | F_SEAL_FUTURE_WRITE)
#define ROUNDS 64 /* looks at the registry before giving up on one that keeps changing */

/* LOADING: its loader fills it; COMPLETE: whole and sealed; ABANDONED: its
 * loader gave up on sharing it (waiters look again). */
enum { LOADING = 0, COMPLETE = 1, ABANDONED = 2 };

/* The region's first page. */
typedef struct share_header {
	char magic[8];
	uint32_t version, state;
	uint64_t key[2];
	uint64_t image[2];
	uint64_t len;
	uint64_t reserved; /* 0 */
} share_header;

/* A registry line: a process holding the region at descriptor fd. */
typedef struct holder {
	long pid;
	int fd;
	unsigned long long start; /* the process's start time (clock ticks after boot): a pid reused is another */
} holder;

struct arena_host_share {
	arena_share_key key;
	char name[48];      /* arena-<32 hex> */
	char lock[64];      /* its registry's name in the folder */
	char dir[DIR_MAX];  /* the share folder (for messages) */
	int dfd;            /* the share folder */
	int fd;             /* the memfd (or our descriptor of it) */
	uint8_t *map;       /* header page, host bytes */
	uint64_t total, len;
	int writable;       /* made here: the map is writable until published */
	int listed;         /* our line is in the registry */
	int published;
	int forgotten;      /* its line dropped at exit (exit_forget) */
	arena_host_share *next; /* in `live` */
};

/* The regions this process has named in a registry: at exit (a program
 * that ends without closing its arenas: Python's interpreter leaves the
 * objects DLPack tensors hold) their registry lines go, so that the last
 * process to end removes the file as the last to close does. The memory
 * is the kernel's to free either way. */
static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static arena_host_share *live;
static pid_t live_pid; /* the process the list is of (a forked child's differs: it holds no line) */

unsigned arena__share_publish_delay_ms;
unsigned arena__share_lock_wait_ms = 5000;
unsigned arena__share_stall_ms = 30000;
unsigned arena__share_exit_wait_ms = 1000;
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

/* why = "host share: " + the message (one line). */
__attribute__((format(printf, 2, 3))) static void say(char why[ARENA_SHARE_WHY], const char *fmt, ...)
{
	int n = snprintf(why, ARENA_SHARE_WHY, "host share: ");
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why + n, ARENA_SHARE_WHY - (size_t)n, fmt, ap);
	va_end(ap);
	for (char *p = why; *p; p++)
		if (*p == '\n')
			*p = ' ';
}

void arena_share_key_name(const arena_share_key *key, char name[48])
{
	snprintf(name, 48, "arena-%016" PRIx64 "%016" PRIx64, key->h[0], key->h[1]);
}

static uint64_t page_up(uint64_t n)
{
	return (n + PAGE - 1) / PAGE * PAGE;
}

static double now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static void sleep_ms(unsigned ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

/* ---- processes ---------------------------------------------------------------- */

/* The start time of process pid (field 22 of /proc/pid/stat; clock ticks
 * after boot) and its CPU time so far (fields 14 and 15, all its threads),
 * or 0 when it is gone, a zombie, or not this user's. */
static unsigned long long proc_start(long pid, unsigned long long *cpu)
{
	char p[64], buf[1024];
	struct stat st;
	snprintf(p, sizeof(p), "/proc/%ld", pid);
	if (stat(p, &st) < 0 || st.st_uid != geteuid())
		return 0;
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
	unsigned long long utime = 0, stime = 0;
	for (int field = 3; field < 22 && s; field++) { /* s is at field `field` */
		if (field == 14)
			utime = strtoull(s, NULL, 10);
		if (field == 15)
			stime = strtoull(s, NULL, 10);
		s = strchr(s, ' ');
		if (s)
			s++;
	}
	if (cpu)
		*cpu = utime + stime;
	return s ? strtoull(s, NULL, 10) : 0;
}

static int holder_live(const holder *h)
{
	return h->start && proc_start(h->pid, NULL) == h->start;
}

/* ---- the share folder ------------------------------------------------------------ */

/* The share folder, opened (made when `make` and missing, 0700) and
 * checked: a folder (not a symbolic link) that this user owns and no other
 * user can write. Its descriptor, its path in dir; -1 with why. */
static int share_dir_open(char dir[DIR_MAX], char why[ARENA_SHARE_WHY], int make, int inject)
{
	const char *env = getenv("ARENA_SHARE_DIR");
	if (env && *env) {
		const size_t n = strlen(env);
		if (n >= DIR_MAX) {
			say(why, "ARENA_SHARE_DIR is %zu bytes long, longer than a path may be (%d)", n, DIR_MAX - 1);
			return -1;
		}
		memcpy(dir, env, n + 1);
	} else {
		snprintf(dir, DIR_MAX, "/dev/shm/arena-%u", (unsigned)geteuid());
	}
	if (make && (((inject && fault()) || mkdir(dir, 0700) < 0) && errno != EEXIST)) {
		say(why, "cannot make the share folder %s: %s", dir, strerror(errno));
		return -1;
	}
	int dfd = (inject && fault()) ? -1 : open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (dfd < 0) {
		if (errno == ELOOP)
			say(why, "the share folder %s is a symbolic link, not a folder of this user's", dir);
		else if (errno != ENOENT || make)
			say(why, "cannot open the share folder %s: %s", dir, strerror(errno));
		else
			why[0] = 0;
		return -1;
	}
	struct stat st;
	if (fstat(dfd, &st) < 0) {
		say(why, "cannot read the share folder %s: %s", dir, strerror(errno));
	} else if (st.st_uid != geteuid()) {
		say(why, "the share folder %s belongs to user %u, not to this process's user %u", dir, (unsigned)st.st_uid,
		    (unsigned)geteuid());
	} else if (st.st_mode & (S_IWGRP | S_IWOTH)) {
		say(why, "other users can write the share folder %s (mode %03o; it must be the user's alone: 0700)", dir,
		    (unsigned)(st.st_mode & 07777));
	} else {
		return dfd;
	}
	close(dfd);
	return -1;
}

/* ---- the registry file ------------------------------------------------------ */

/* Lines of the registry at lfd ("pid fd start"; others ignored): the live
 * holders of this user only. 0, or -1 with why. */
static int registry_read(int lfd, holder **out, size_t *n, char why[ARENA_SHARE_WHY])
{
	*out = NULL;
	*n = 0;
	struct stat st;
	if (fstat(lfd, &st) < 0) {
		say(why, "cannot read its registry: %s", strerror(errno));
		return -1;
	}
	if (st.st_size <= 0 || st.st_size > REGISTRY_MAX)
		return 0; /* empty, or not ours: rewritten */
	char *buf = arena_malloc((size_t)st.st_size + 1);
	if (!buf) {
		say(why, "out of memory");
		return -1;
	}
	ssize_t got = pread(lfd, buf, (size_t)st.st_size, 0);
	if (got < 0) {
		say(why, "cannot read its registry: %s", strerror(errno));
		arena_free(buf);
		return -1;
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
				say(why, "out of memory");
				rc = -1;
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

/* Rewrite the registry with these holders: 0 or an errno (inject:
 * failures may be injected). */
static int registry_write(int lfd, const holder *h, size_t n, int inject)
{
	char line[96];
	uint64_t off = 0;
	if ((inject && fault()) || ftruncate(lfd, 0) < 0)
		return errno;
	for (size_t i = 0; i < n; i++) {
		int k = snprintf(line, sizeof(line), "%ld %d %llu\n", h[i].pid, h[i].fd, h[i].start);
		if ((inject && fault()) || pwrite(lfd, line, (size_t)k, (off_t)off) != k)
			return errno ? errno : EIO;
		off += (uint64_t)k;
	}
	return 0;
}

/* Rewrite the registry with holders h[0..n) (failures injectable); when
 * that fails, put back h[0..n_before), the lines it had, as far as it can
 * (a registry that lost a live holder's line would make the next process
 * load the region again). 0, or -1 with why. */
static int registry_set(int lfd, const holder *h, size_t n, size_t n_before, char why[ARENA_SHARE_WHY])
{
	int e = registry_write(lfd, h, n, 1);
	if (!e)
		return 0;
	(void)registry_write(lfd, h, n_before, 0);
	say(why, "cannot write its registry: %s", strerror(e));
	return -1;
}

/* Wait up to wait_ms for lfd's lock: 0, or an errno (EWOULDBLOCK: not
 * granted in time). */
static int lock_wait(int lfd, unsigned wait_ms, int inject)
{
	const double t0 = now_ms();
	unsigned d = 1;
	for (;;) {
		if (inject && fault())
			return errno;
		if (flock(lfd, LOCK_EX | LOCK_NB) == 0)
			return 0;
		if (errno == EINTR)
			continue;
		if (errno != EWOULDBLOCK)
			return errno;
		if (now_ms() - t0 >= wait_ms)
			return EWOULDBLOCK;
		sleep_ms(d);
		d = d < 25 ? 2 * d : 50;
	}
}

static void unlock_close(int lfd)
{
	flock(lfd, LOCK_UN);
	close(lfd);
}

/* Open and lock the registry `lock` in folder dfd (`dir` its path, for
 * messages), made (0600) when `create` and missing: its descriptor, once
 * it is a regular file of one link that this user owns and no other can
 * write, locked within wait_ms, and still the file at that name. -1 with
 * why (empty: it does not exist and create is 0). inject: failures may be
 * injected. */
static int registry_lock(int dfd, const char *dir, const char *lock, int create, int inject, unsigned wait_ms,
			 char why[ARENA_SHARE_WHY])
{
	why[0] = 0;
	for (int tries = 0; tries < ROUNDS; tries++) {
		const int flags = O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK; /* a FIFO planted there never blocks */
		int made = 0, lfd = -1, e = 0;
		if (inject && fault()) {
			e = errno;
		} else {
			if (create) {
				lfd = openat(dfd, lock, flags | O_CREAT | O_EXCL, 0600);
				made = lfd >= 0;
			}
			if (lfd < 0 && (!create || errno == EEXIST)) {
				lfd = openat(dfd, lock, flags);
				if (lfd < 0 && errno == ENOENT && create)
					continue; /* removed meanwhile: make it */
			}
			e = errno;
		}
		if (lfd < 0) {
			if (e == ENOENT && !create)
				return -1;
			if (e == ELOOP)
				say(why, "its registry %s/%s is a symbolic link", dir, lock);
			else
				say(why, "cannot open its registry %s/%s: %s", dir, lock, strerror(e));
			return -1;
		}
		struct stat st;
		const char *bad = NULL;
		if (fstat(lfd, &st) < 0)
			bad = "cannot be read";
		else if (!S_ISREG(st.st_mode))
			bad = "is not a regular file";
		else if (st.st_uid != geteuid())
			bad = "belongs to another user";
		else if (st.st_nlink != 1)
			bad = "has other names (hard links)";
		else if (st.st_mode & (S_IWGRP | S_IWOTH))
			bad = "can be written by other users";
		if (bad) {
			close(lfd);
			say(why, "its registry %s/%s %s: not used", dir, lock, bad);
			return -1;
		}
		if ((e = lock_wait(lfd, wait_ms, inject))) {
			if (made) /* a process that opened it meanwhile finds it gone once it has the lock, and makes it anew */
				unlinkat(dfd, lock, 0);
			close(lfd);
			if (e == EWOULDBLOCK)
				say(why, "its registry %s/%s stayed locked for %.1f s (another process of this user holds it)", dir,
				    lock, wait_ms / 1e3);
			else
				say(why, "cannot lock its registry %s/%s: %s", dir, lock, strerror(e));
			return -1;
		}
		struct stat b;
		if (fstatat(dfd, lock, &b, AT_SYMLINK_NOFOLLOW) == 0 && st.st_dev == b.st_dev && st.st_ino == b.st_ino)
			return lfd;
		close(lfd); /* removed (or replaced) while we waited: the file at that name now */
	}
	say(why, "its registry %s/%s keeps being replaced", dir, lock);
	return -1;
}

/* Drop holder (pid, fd) from the registry lfd holds, and remove the file
 * when no live holder remains. Best effort: a line left is dropped by the
 * next process once this one is gone. */
static void registry_forget(int dfd, const char *lock, int lfd, long pid, int fd)
{
	char why[ARENA_SHARE_WHY];
	holder *h = NULL;
	size_t n = 0;
	if (registry_read(lfd, &h, &n, why))
		return;
	size_t k = 0;
	for (size_t i = 0; i < n; i++)
		if (!(h[i].pid == pid && h[i].fd == fd))
			h[k++] = h[i];
	if (!k)
		unlinkat(dfd, lock, 0);
	else
		(void)registry_write(lfd, h, k, 0);
	arena_free(h);
}

/* ---- the region ---------------------------------------------------------------- */

/* Holder h's descriptor when it is a region of this user's called `name`
 * (the link names our memfd; the memfd is this user's, its size is what
 * its header says, its size is sealed): the descriptor (read-only), its
 * header in *hd, its seals in *seals, its stat in *st; or -1. */
static int holder_open(const char *name, const holder *h, share_header *hd, int *seals, struct stat *st)
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
	int fd = open(p, O_RDONLY | O_CLOEXEC); /* a magic link: followed to the memfd itself */
	if (fd < 0)
		return -1;
	if (fstat(fd, st) < 0 || !S_ISREG(st->st_mode) || st->st_uid != geteuid() ||
	    pread(fd, hd, sizeof(*hd), 0) != (ssize_t)sizeof(*hd) || memcmp(hd->magic, MAGIC, 8) ||
	    hd->version != ARENA_HOST_SHARE_VERSION || hd->reserved || hd->len > (uint64_t)INT64_MAX - 2 * PAGE ||
	    (uint64_t)st->st_size != PAGE + page_up(hd->len) || (*seals = fcntl(fd, F_GET_SEALS)) < 0 ||
	    (*seals & SEALS_SIZE) != SEALS_SIZE) {
		close(fd);
		return -1;
	}
	return fd;
}

static int is_complete(const share_header *hd, int seals)
{
	return hd->state == COMPLETE && (seals & SEALS_DONE) == SEALS_DONE;
}

/* Whether the header is of region s (its key and size). */
static int is_ours(const arena_host_share *s, const share_header *hd)
{
	return hd->key[0] == s->key.h[0] && hd->key[1] == s->key.h[1] && hd->image[0] == s->key.image[0] &&
	       hd->image[1] == s->key.image[1] && hd->len == s->len;
}

uint64_t arena_host_share_image_bytes(const uint64_t image[2])
{
	char dir[DIR_MAX], why[ARENA_SHARE_WHY];
	int dfd = share_dir_open(dir, why, 0, 0);
	if (dfd < 0)
		return 0;
	int dd = dup(dfd);
	DIR *d = dd >= 0 ? fdopendir(dd) : NULL;
	if (!d) {
		if (dd >= 0)
			close(dd);
		close(dfd);
		return 0;
	}
	uint64_t best = 0;
	for (struct dirent *e; (e = readdir(d));) {
		size_t n = strlen(e->d_name);
		if (strncmp(e->d_name, "arena-", 6) || n != 6 + 32 + 5 || strcmp(e->d_name + n - 5, ".lock"))
			continue;
		char name[48];
		snprintf(name, sizeof(name), "%.*s", (int)(n - 5), e->d_name);
		int lfd = registry_lock(dfd, dir, e->d_name, 0, 0, 0, why); /* locked or not ours: skipped */
		if (lfd < 0)
			continue;
		holder *h = NULL;
		size_t k = 0;
		if (registry_read(lfd, &h, &k, why) == 0)
			for (size_t i = 0; i < k; i++) {
				share_header hd;
				struct stat st;
				int seals, fd = holder_open(name, &h[i], &hd, &seals, &st);
				if (fd < 0)
					continue;
				close(fd);
				if (!is_complete(&hd, seals) || hd.image[0] != image[0] || hd.image[1] != image[1])
					continue;
				/* never more than the memory it holds: a header may say anything */
				uint64_t held = page_up(hd.len), mem = (uint64_t)st.st_blocks * 512;
				held = held < mem ? held : mem;
				best = held > best ? held : best;
				break;
			}
		arena_free(h);
		unlock_close(lfd);
	}
	closedir(d);
	close(dfd);
	return best;
}

/* A new region: the memfd sized, its size sealed, mapped writable, its
 * header LOADING. 0, or -1 with why. */
static int make_region(arena_host_share *s, char why[ARENA_SHARE_WHY])
{
	int fd = fault() ? -1 : memfd_create(s->name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0) {
		say(why, "cannot make a memory file of %" PRIu64 " bytes: %s", s->total, strerror(errno));
		return -1;
	}
	if (fault() || ftruncate(fd, (off_t)s->total) < 0) {
		say(why, "cannot size a memory file of %" PRIu64 " bytes: %s", s->total, strerror(errno));
		close(fd);
		return -1;
	}
	if (fault() || fcntl(fd, F_ADD_SEALS, SEALS_SIZE) < 0) {
		say(why, "cannot seal the size of a memory file: %s", strerror(errno));
		close(fd);
		return -1;
	}
	void *m = fault() ? MAP_FAILED : mmap(NULL, s->total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED) {
		say(why, "cannot map %" PRIu64 " bytes of a memory file: %s", s->total, strerror(errno));
		close(fd);
		return -1;
	}
	madvise((uint8_t *)m + PAGE, s->total - PAGE, MADV_HUGEPAGE); /* as the private mapping (shmem THP permitting) */
	share_header *hd = m;
	memcpy(hd->magic, MAGIC, 8);
	hd->version = ARENA_HOST_SHARE_VERSION;
	hd->state = LOADING;
	hd->key[0] = s->key.h[0];
	hd->key[1] = s->key.h[1];
	hd->image[0] = s->key.image[0];
	hd->image[1] = s->key.image[1];
	hd->len = s->len;
	s->fd = fd;
	s->map = m;
	s->writable = 1;
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
	me.start = proc_start(me.pid, NULL);
	return me;
}

static void exit_forget(void)
{
	pthread_mutex_lock(&live_mu);
	for (arena_host_share *s = live; s && live_pid == getpid(); s = s->next) {
		char why[ARENA_SHARE_WHY];
		/* Waits at exit a little only: the processes of a job end together
		 * (torchrun's, after their last barrier), and one that found the lock
		 * taken by another's exit left its line, and the registry, behind
		 * (dropped only by a later open of the same image). */
		int lfd = registry_lock(s->dfd, s->dir, s->lock, 0, 0, arena__share_exit_wait_ms, why);
		if (lfd >= 0) {
			registry_forget(s->dfd, s->lock, lfd, (long)live_pid, s->fd);
			unlock_close(lfd);
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
	s->listed = 1;
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

/* The registry forgets this process's line for s (waiting for its lock as
 * an open does; a line left is dropped by a later process). */
static void unlist(arena_host_share *s)
{
	if (!s->listed)
		return;
	live_remove(s);
	if (!s->forgotten) {
		char why[ARENA_SHARE_WHY];
		int lfd = registry_lock(s->dfd, s->dir, s->lock, 0, 0, arena__share_lock_wait_ms, why);
		if (lfd >= 0) {
			registry_forget(s->dfd, s->lock, lfd, (long)getpid(), s->fd);
			unlock_close(lfd);
		}
	}
	s->listed = 0;
}

/* Wait, with the registry unlocked, for the region a live holder h is
 * loading (fd: our descriptor of it): 0 when it is complete, abandoned or
 * gone (look at the registry again); -1 with why when its loader made no
 * progress (neither its region's pages nor its CPU time grew) for
 * arena__share_stall_ms. */
static int wait_loader(const arena_host_share *s, const holder *h, int fd, char why[ARENA_SHARE_WHY])
{
	unsigned long long cpu0 = 0, cpu = 0;
	struct stat st;
	if (fstat(fd, &st) < 0)
		return 0;
	blkcnt_t blocks0 = st.st_blocks;
	(void)proc_start(h->pid, &cpu0);
	double t_progress = now_ms();
	unsigned d = 5;
	for (;;) {
		sleep_ms(d);
		d = d < 50 ? 2 * d : 100;
		share_header hd;
		if (pread(fd, &hd, sizeof(hd), 0) != (ssize_t)sizeof(hd))
			return 0;
		const int seals = fcntl(fd, F_GET_SEALS);
		if (hd.state != LOADING || (seals >= 0 && is_complete(&hd, seals)))
			return 0;
		if (proc_start(h->pid, &cpu) != h->start)
			return 0; /* its loader is gone */
		char p[64];
		struct stat at;
		snprintf(p, sizeof(p), "/proc/%ld/fd/%d", h->pid, h->fd);
		if (stat(p, &at) < 0 || fstat(fd, &st) < 0 || at.st_dev != st.st_dev || at.st_ino != st.st_ino)
			return 0; /* its loader let go of it */
		if (st.st_blocks != blocks0 || cpu != cpu0) {
			blocks0 = st.st_blocks;
			cpu0 = cpu;
			t_progress = now_ms();
		} else if (now_ms() - t_progress > arena__share_stall_ms) {
			say(why, "the process loading %s (pid %ld) made no progress in %.1f s", s->name, h->pid,
			    arena__share_stall_ms / 1e3);
			return -1;
		}
	}
}

int arena_host_share_open(const arena_share_key *key, uint64_t len, arena_host_share **out, int *complete,
			  char why[ARENA_SHARE_WHY])
{
	*out = NULL;
	*complete = 0;
	why[0] = 0;
	arena_host_share *s = arena_calloc(1, sizeof(*s));
	if (!s)
		return arena_errorf(ARENA_E_NOMEM, "out of memory");
	s->key = *key;
	s->fd = -1;
	s->len = len;
	s->total = PAGE + page_up(len);
	arena_share_key_name(key, s->name);
	snprintf(s->lock, sizeof(s->lock), "%s.lock", s->name);
	if ((s->dfd = share_dir_open(s->dir, why, 1, 1)) < 0)
		goto refuse;
	for (int round = 0; round < ROUNDS; round++) {
		int lfd = registry_lock(s->dfd, s->dir, s->lock, 1, 1, arena__share_lock_wait_ms, why);
		if (lfd < 0)
			goto refuse;
		holder *h = NULL, loader = {0, -1, 0};
		size_t n = 0;
		if (registry_read(lfd, &h, &n, why)) {
			unlock_close(lfd);
			goto refuse;
		}
		int wfd = -1, found = 0; /* a loader's region (wfd), a complete one (s->fd) */
		for (size_t i = 0; i < n && !found; i++) {
			share_header hd;
			struct stat st;
			int seals, fd = holder_open(s->name, &h[i], &hd, &seals, &st);
			if (fd < 0 || !is_ours(s, &hd)) {
				if (fd >= 0)
					close(fd);
			} else if (is_complete(&hd, seals)) {
				void *m = fault() ? MAP_FAILED : mmap(NULL, s->total, PROT_READ, MAP_SHARED, fd, 0);
				if (m == MAP_FAILED) {
					say(why, "cannot map %" PRIu64 " bytes of %s: %s", s->total, s->name, strerror(errno));
					close(fd);
					break;
				}
				s->fd = fd;
				s->map = m;
				found = 1;
			} else if (hd.state == LOADING && wfd < 0) {
				wfd = fd;
				loader = h[i];
			} else {
				close(fd);
			}
		}
		if (found || (wfd < 0 && !why[0])) { /* mapped, or none: this process loads */
			if (found || !make_region(s, why)) {
				holder *t = arena_realloc(h, (n + 1) * sizeof(*t));
				if (!t) {
					say(why, "out of memory");
				} else {
					h = t;
					h[n] = self_holder(s);
					if (!registry_set(lfd, h, n + 1, n, why)) {
						live_add(s);
						*complete = found;
					}
				}
			}
		}
		if (!s->listed && !n) /* a registry of no live holder, this open's or an old one: gone */
			unlinkat(s->dfd, s->lock, 0);
		arena_free(h);
		unlock_close(lfd);
		if (s->listed) {
			if (wfd >= 0)
				close(wfd);
			*out = s;
			return 0;
		}
		if (why[0]) {
			if (wfd >= 0)
				close(wfd);
			goto refuse;
		}
		/* a process loads it: wait for it, then look again */
		const int r = wait_loader(s, &loader, wfd, why);
		close(wfd);
		if (r < 0)
			goto refuse;
	}
	say(why, "its registry %s/%s kept changing", s->dir, s->lock);
refuse:
	region_drop(s);
	if (s->dfd >= 0)
		close(s->dfd);
	arena_free(s);
	return 0;
}

uint8_t *arena_host_share_base(const arena_host_share *s)
{
	return s->map + PAGE;
}

int arena_host_share_publish(arena_host_share *s, char why[ARENA_SHARE_WHY])
{
	if (s->published || !s->writable)
		ARENA_BUG("host share: publish of a region this process did not make, or twice");
	if (arena__share_publish_delay_ms) /* tests: a slow loader */
		sleep_ms(arena__share_publish_delay_ms);
	share_header *hd = (share_header *)s->map;
	/* Its bytes sealed first: a process that sees it COMPLETE can trust
	 * that nobody writes it any more (the loader's mapping is read-only). */
	if (fault() || fcntl(s->fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) < 0) {
		if (errno == EINVAL)
			say(why, "this kernel cannot seal memory against writes (F_SEAL_FUTURE_WRITE, Linux 5.1)");
		else
			say(why, "cannot seal %s against writes: %s", s->name, strerror(errno));
		hd->state = ABANDONED;
		unlist(s);
		return 1;
	}
	atomic_thread_fence(memory_order_release);
	hd->state = COMPLETE;
	mprotect(s->map, PAGE, PROT_READ); /* best effort: the header is never written again */
	s->writable = 0;
	s->published = 1;
	return 0;
}

void arena_host_share_close(arena_host_share *s)
{
	if (!s)
		return;
	if (s->writable && s->map) /* never published: a process waiting on it looks again */
		((share_header *)s->map)->state = ABANDONED;
	unlist(s);
	region_drop(s); /* after the line is gone: nobody opens a descriptor being closed */
	if (s->dfd >= 0)
		close(s->dfd);
	arena_free(s);
}
