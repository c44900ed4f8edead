/* cmd_cache.c - `arena cache list|verify|prune`: the cache of converted
 * images that the Python package makes (python/arena_gpu/_cache.py writes
 * the entries; this reads, checks and removes them by the same rules).
 *
 * The root is --cache DIR, else $ARENA_CACHE, else $XDG_CACHE_HOME/arena
 * (an absolute XDG_CACHE_HOME only), else ~/.cache/arena: a folder of this
 * user's, not a symbolic link, that no other user can write. An entry is
 * ROOT/KEY/ (KEY: 16 to 128 lowercase hex digits) holding image.arena and
 * entry.json ({"arena_cache": 1, "key", "label", "record": {"sources",
 * "options", ...}, "image": {"size", "header_xxh3", ...}, "made"}); its last
 * use is entry.json's modification time. Locks (flock): ROOT/KEY.lock,
 * exclusive while an entry is made or removed (a reader of an entry takes it
 * shared); image.arena, shared while a process uses the entry. The key's
 * lock comes first. A lock file is removed only by its holder, and a locker
 * checks that the file it holds is still the one at its path.
 * ROOT/.tmp-KEY-PID and ROOT/.trash-KEY-PID are an entry being made and one
 * being removed: left by a process that stopped when the key's lock is free. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <getopt.h>
#include <jansson.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "../common/err.h"
#include "../common/units.h"
#include "arena.h"
#include "cli.h"

const char cmd_cache_usage[] =
	"usage: arena cache list [--json] [--cache DIR]\n"
	"       arena cache verify [KEY...] [--remove] [--threads N] [--quiet] [--cache DIR]\n"
	"       arena cache prune (--older-than DURATION | --all) [--dry-run] [--cache DIR]\n"
	"\n"
	"The cache of images converted for arena.torch.from_pretrained and offload\n"
	"(docs/PYTHON.md, 'The cache'): DIR, else $ARENA_CACHE, else\n"
	"$XDG_CACHE_HOME/arena, else ~/.cache/arena. An entry is a folder named by its\n"
	"KEY (the sources' identity and the options) holding the image and its record.\n"
	"\n"
	"list    a line per entry, the most recently used first: its key, size, when\n"
	"        it was last used and what it was made from; then the totals.\n"
	"verify  check every byte of each entry's image (all, or those whose KEY starts\n"
	"        with each KEY given), as 'arena verify' does, and its record. A bad\n"
	"        entry is named (exit 1); --remove removes it, and the next use makes it\n"
	"        again.\n"
	"prune   remove the entries not used for DURATION (--older-than) or all of them\n"
	"        (--all), and what a process that stopped while making or removing one\n"
	"        left. An entry in use (a process holds it open) or being made is left\n"
	"        alone, and said. Says what it removed and the bytes freed.\n"
	"\n"
	"options:\n"
	"  --cache DIR           the cache folder (default: as above)\n"
	"  --json                list: the entries as JSON (schema in docs/CLI.md)\n"
	"  --remove              verify: remove each bad entry\n"
	"  --threads N           verify: reader threads (default: CPUs, at most 8)\n"
	"  -q, --quiet           verify: no progress line\n"
	"  --older-than DURATION prune: entries last used longer ago than DURATION, a\n"
	"                        whole number and a unit s, m, h, d or w (30d, 12h)\n"
	"  --all                 prune: every entry\n"
	"  --dry-run             prune: say what would be removed, remove nothing\n"
	"  -h, --help            this text\n"
	"\n"
	"exit status: 0 done (verify: every entry checked is whole), 1 a bad entry\n"
	"(verify), 2 usage (and a cache folder other users can write, or that is\n"
	"not a folder of this user's), 3 a system error.\n";

#define KEY_MAX 128
/* Buffers: the root, an entry's folder (or a name in the root), a file in
 * it or a folder beside it (".trash-KEY-PID"), a message naming one. */
#define ROOT_LEN 4096
#define DIR_LEN (ROOT_LEN + 260)
#define PATH_LEN (DIR_LEN + 160)
#define WHY_LEN (PATH_LEN + 512)
#define FORMAT 1 /* entry.json's "arena_cache" (python/arena_gpu/_cache.py: FORMAT) */
#define HEADER_SUM_AT 4088 /* the image header's xxh3 (docs/FORMAT.md) */

typedef struct ent {
	char key[KEY_MAX + 1];
	char dir[DIR_LEN];
	json_t *doc;   /* entry.json, when it is this library's record of this key; else NULL */
	char why[WHY_LEN]; /* why not: the entry is damaged (or not this user's alone, `foreign`) */
	int foreign;
	uint64_t size;
	double used, made; /* Unix seconds; made < 0: unknown */
} ent;

typedef struct left {
	char path[DIR_LEN];
	char key[KEY_MAX + 1];
	uint64_t size;
} left;

typedef struct cache {
	char root[ROOT_LEN];
	ent *ents;
	size_t n;
	left *lefts; /* .tmp-KEY-PID and .trash-KEY-PID folders */
	size_t n_left;
	char **locks; /* KEY.lock files */
	size_t n_locks;
} cache;

static void cache_free(cache *c)
{
	for (size_t i = 0; i < c->n; i++)
		json_decref(c->ents[i].doc);
	for (size_t i = 0; i < c->n_locks; i++)
		free(c->locks[i]);
	free(c->ents);
	free(c->lefts);
	free(c->locks);
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double mtime_s(const struct stat *st)
{
	return (double)st->st_mtim.tv_sec + (double)st->st_mtim.tv_nsec / 1e9;
}

/* "12 s ago", "5 min ago", "3 h ago", "40 days ago" */
static const char *ago(double t, char *buf, size_t len)
{
	double s = now_s() - t;
	if (s < 0)
		s = 0;
	if (s < 60)
		snprintf(buf, len, "%.0f s ago", s);
	else if (s < 2 * 3600)
		snprintf(buf, len, "%.0f min ago", s / 60);
	else if (s < 48 * 3600)
		snprintf(buf, len, "%.0f h ago", s / 3600);
	else
		snprintf(buf, len, "%.0f days ago", s / 86400);
	return buf;
}

static int is_key(const char *s, size_t n)
{
	if (n < 16 || n > KEY_MAX)
		return 0;
	for (size_t i = 0; i < n; i++)
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
			return 0;
	return 1;
}

/* ---- the root ------------------------------------------------------------------- */

/* The root's path into out; 0, or 2 (usage) with a message. */
static int root_path(const char *opt, char *out, size_t len)
{
	const char *env = getenv("ARENA_CACHE"), *xdg = getenv("XDG_CACHE_HOME");
	int n;
	if (opt)
		n = snprintf(out, len, "%s", opt);
	else if (env && *env)
		n = snprintf(out, len, "%s", env);
	else if (xdg && xdg[0] == '/')
		n = snprintf(out, len, "%s/arena", xdg);
	else {
		const char *home = getenv("HOME");
		if (!home || !*home) {
			struct passwd *pw = getpwuid(geteuid());
			home = pw ? pw->pw_dir : NULL;
		}
		if (!home || !*home) {
			fprintf(stderr, "error: cache: no home folder (HOME unset and no passwd entry); set ARENA_CACHE\n");
			return 2;
		}
		n = snprintf(out, len, "%s/.cache/arena", home);
	}
	if (n > 0 && out[0] != '/') { /* relative: from the current folder, as the package takes it */
		char cwd[ROOT_LEN], rel[ROOT_LEN];
		snprintf(rel, sizeof(rel), "%s", out);
		if (!getcwd(cwd, sizeof(cwd))) {
			fprintf(stderr, "error: cache: the current folder: %s\n", strerror(errno));
			return 3;
		}
		const char *r = rel;
		while (r[0] == '.' && r[1] == '/')
			r += 2;
		n = snprintf(out, len, "%s/%s", strcmp(cwd, "/") ? cwd : "", strcmp(r, ".") ? r : "");
		if (n > 1 && out[n - 1] == '/')
			out[--n] = 0;
	}
	if (n <= 0 || (size_t)n >= len - 300) {
		fprintf(stderr, "error: cache: the cache folder's path is empty or too long\n");
		return 2;
	}
	return 0;
}

/* "" when st (an lstat) is a folder of this user's that no other user can
 * write, else why not into why. */
static int folder_ours(const char *path, const struct stat *st, const char *what, const char *fix, char *why,
		       size_t len)
{
	if (S_ISLNK(st->st_mode))
		snprintf(why, len, "%s %s is a symbolic link, not a folder of this user's: %s", what, path, fix);
	else if (!S_ISDIR(st->st_mode))
		snprintf(why, len, "%s %s is not a folder: %s", what, path, fix);
	else if (st->st_uid != geteuid())
		snprintf(why, len, "%s %s belongs to user %u, not to this process's user %u: %s", what, path,
			 (unsigned)st->st_uid, (unsigned)geteuid(), fix);
	else if (st->st_mode & (S_IWGRP | S_IWOTH))
		snprintf(why, len, "other users can write %s %s (mode %03o; it must be the user's alone): chmod go-w %s",
			 what, path, (unsigned)(st->st_mode & 07777), path);
	else
		return 0;
	return -1;
}

/* 0: the root is there and this user's alone; 1: it does not exist; 2: refused (said). */
static int root_check(const char *root)
{
	struct stat st;
	if (lstat(root, &st) < 0) {
		if (errno == ENOENT)
			return 1;
		fprintf(stderr, "error: cannot read the cache folder %s: %s\n", root, strerror(errno));
		return 3;
	}
	char why[WHY_LEN];
	if (folder_ours(root, &st, "the cache folder", "set ARENA_CACHE (or --cache) to a folder of your own", why,
			sizeof(why))) {
		fprintf(stderr, "error: %s\n", why);
		return 2;
	}
	return 0;
}

/* ---- files and folders --------------------------------------------------------------- */

static uint64_t tree_bytes;
static int tree_add(const char *p, const struct stat *st, int type, struct FTW *f)
{
	(void)p;
	(void)f;
	if (type == FTW_F && S_ISREG(st->st_mode))
		tree_bytes += (uint64_t)st->st_size;
	return 0;
}

/* The bytes of the regular files under dir, symbolic links not followed. */
static uint64_t tree_size(const char *dir)
{
	tree_bytes = 0;
	nftw(dir, tree_add, 16, FTW_PHYS);
	return tree_bytes;
}

static int tree_rm(const char *p, const struct stat *st, int type, struct FTW *f)
{
	(void)st;
	(void)f;
	if ((type == FTW_DP ? rmdir(p) : unlink(p)) < 0 && errno != ENOENT)
		return -1;
	return 0;
}

/* Remove dir and everything in it, no symbolic link followed: 0, or -1 with errno. */
static int tree_remove(const char *dir)
{
	struct stat st;
	if (lstat(dir, &st) < 0)
		return errno == ENOENT ? 0 : -1;
	if (!S_ISDIR(st.st_mode))
		return unlink(dir);
	return nftw(dir, tree_rm, 16, FTW_DEPTH | FTW_PHYS) ? -1 : 0;
}

/* A regular file of this user's at path, opened read-only without following
 * a symbolic link: its descriptor, or -1 with why. */
static int open_ours(const char *path, int flags, char *why, size_t len)
{
	int fd = open(path, flags | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0) {
		snprintf(why, len, "%s: %s", path, errno == ELOOP ? "a symbolic link" : strerror(errno));
		return -1;
	}
	struct stat st;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
	    (st.st_mode & (S_IWGRP | S_IWOTH))) {
		snprintf(why, len, "%s: not a regular file of this user's alone", path);
		close(fd);
		return -1;
	}
	return fd;
}

/* ---- entries ----------------------------------------------------------------------------- */

/* The entry's record and size; why says what is wrong with it. */
static void ent_read(ent *e, const struct stat *dst)
{
	char p[PATH_LEN], err[300];
	e->doc = NULL;
	e->why[0] = 0;
	e->made = -1;
	e->used = mtime_s(dst);
	if (folder_ours(e->dir, dst, "the cache entry", "remove it", e->why, sizeof(e->why))) {
		e->foreign = 1;
		return;
	}
	e->size = tree_size(e->dir);
	snprintf(p, sizeof(p), "%s/entry.json", e->dir);
	int fd = open_ours(p, O_RDONLY, err, sizeof(err));
	if (fd < 0) {
		snprintf(e->why, sizeof(e->why), "its record %s", err);
		return;
	}
	struct stat st;
	if (fstat(fd, &st) == 0)
		e->used = mtime_s(&st);
	json_error_t je;
	json_t *doc = NULL;
	if (st.st_size <= (16 << 20)) {
		char *buf = malloc((size_t)st.st_size + 1);
		ssize_t got = buf ? pread(fd, buf, (size_t)st.st_size, 0) : -1;
		if (got >= 0)
			doc = json_loadb(buf, (size_t)got, 0, &je);
		else
			snprintf(je.text, sizeof(je.text), "%s", strerror(errno));
		free(buf);
	} else {
		snprintf(je.text, sizeof(je.text), "over 16 MiB");
	}
	close(fd);
	if (!doc) {
		snprintf(e->why, sizeof(e->why), "its record entry.json is not JSON (%s)", je.text);
		return;
	}
	json_t *im = json_object_get(doc, "image");
	const char *k = json_string_value(json_object_get(doc, "key"));
	if (json_integer_value(json_object_get(doc, "arena_cache")) != FORMAT || !k || strcmp(k, e->key) ||
	    !json_is_object(im) || !json_is_integer(json_object_get(im, "size")) ||
	    !json_is_string(json_object_get(im, "header_xxh3"))) {
		snprintf(e->why, sizeof(e->why), "its record entry.json is not a record of this library's for key %s",
			 e->key);
		json_decref(doc);
		return;
	}
	json_t *made = json_object_get(doc, "made");
	if (json_is_number(made))
		e->made = json_number_value(made);
	e->doc = doc;
}

static int by_used(const void *a, const void *b)
{
	const ent *x = a, *y = b;
	return x->used < y->used ? 1 : x->used > y->used ? -1 : strcmp(x->key, y->key);
}

/* Read the root's entries, leftovers and lock files. 0, or 3 with a message. */
static int scan(cache *c)
{
	DIR *dir = opendir(c->root);
	if (!dir) {
		fprintf(stderr, "error: cannot read the cache folder %s: %s\n", c->root, strerror(errno));
		return 3;
	}
	size_t cap_e = 0, cap_l = 0, cap_k = 0;
	struct dirent *de;
	int rc = 0;
	while ((de = readdir(dir))) {
		const char *name = de->d_name;
		size_t n = strlen(name);
		char path[DIR_LEN];
		snprintf(path, sizeof(path), "%s/%s", c->root, name);
		struct stat st;
		if (is_key(name, n)) {
			if (lstat(path, &st) < 0)
				continue;
			if (c->n == cap_e) {
				cap_e = cap_e ? 2 * cap_e : 16;
				ent *ne = realloc(c->ents, cap_e * sizeof(*ne));
				if (!ne) {
					rc = 3;
					break;
				}
				c->ents = ne;
			}
			ent *e = &c->ents[c->n++];
			memset(e, 0, sizeof(*e));
			memcpy(e->key, name, n + 1);
			snprintf(e->dir, sizeof(e->dir), "%s", path);
			ent_read(e, &st);
		} else if (n > 5 && !strcmp(name + n - 5, ".lock") && is_key(name, n - 5)) {
			if (c->n_locks == cap_k) {
				cap_k = cap_k ? 2 * cap_k : 16;
				char **nk = realloc(c->locks, cap_k * sizeof(*nk));
				if (!nk) {
					rc = 3;
					break;
				}
				c->locks = nk;
			}
			if (!(c->locks[c->n_locks] = strdup(name))) {
				rc = 3;
				break;
			}
			c->n_locks++;
		} else if (!strncmp(name, ".tmp-", 5) || !strncmp(name, ".trash-", 7)) {
			const char *k = name + (name[1] == 't' && name[2] == 'm' ? 5 : 7);
			const char *dash = strrchr(k, '-');
			if (!dash || !is_key(k, (size_t)(dash - k)) || lstat(path, &st) < 0 || !S_ISDIR(st.st_mode) ||
			    st.st_uid != geteuid())
				continue;
			if (c->n_left == cap_l) {
				cap_l = cap_l ? 2 * cap_l : 8;
				left *nl = realloc(c->lefts, cap_l * sizeof(*nl));
				if (!nl) {
					rc = 3;
					break;
				}
				c->lefts = nl;
			}
			left *l = &c->lefts[c->n_left++];
			snprintf(l->path, sizeof(l->path), "%s", path);
			memcpy(l->key, k, (size_t)(dash - k));
			l->key[dash - k] = 0;
			l->size = tree_size(path);
		}
	}
	closedir(dir);
	if (rc)
		fprintf(stderr, "error: cache: out of memory\n");
	else
		qsort(c->ents, c->n, sizeof(*c->ents), by_used);
	return rc;
}

/* ---- locks ------------------------------------------------------------------------------ */

/* The pid a lock's holder wrote into it, 0 when none. */
static long lock_pid(int fd)
{
	char b[32];
	ssize_t n = pread(fd, b, sizeof(b) - 1, 0);
	if (n <= 0)
		return 0;
	b[n] = 0;
	char *end;
	long pid = strtol(b, &end, 10);
	return (end != b && (*end == '\n' || !*end) && pid > 0) ? pid : 0;
}

/* Whether a process holds a flock on the file st is of (from /proc/locks):
 * its pid; -1 when held by a pid that no longer runs (the lock is the open
 * file's, and the process that took it may have passed the file on and
 * ended); 0 when no lock is seen. */
static long flock_pid(const struct stat *st)
{
	FILE *f = fopen("/proc/locks", "re");
	if (!f)
		return 0;
	char line[512];
	long found = 0;
	while (!found && fgets(line, sizeof(line), f)) {
		char kind[16], mode[16], rw[16];
		long pid;
		unsigned maj, min;
		unsigned long long ino;
		/* "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF"; waiters' lines have "->" */
		if (strstr(line, "->"))
			continue;
		const char *s = strchr(line, ':');
		if (!s || sscanf(s + 1, "%15s %15s %15s %ld %x:%x:%llu", kind, mode, rw, &pid, &maj, &min, &ino) != 7)
			continue;
		if (!strcmp(kind, "FLOCK") && maj == major(st->st_dev) && min == minor(st->st_dev) &&
		    ino == (unsigned long long)st->st_ino)
			found = pid;
	}
	fclose(f);
	if (found > 0 && kill((pid_t)found, 0) < 0 && errno == ESRCH)
		return -1;
	return found;
}

enum { LOCK_BUSY = -1, LOCK_ERR = -2 };

/* The key's lock (ROOT/KEY.lock), exclusive or shared: its descriptor;
 * LOCK_BUSY when `wait` is 0 and another process holds it (*holder: its pid
 * when known); LOCK_ERR with a message. Waiting, it says so after 5 s. An
 * exclusive holder writes its pid into the file. */
static int lock_key(const char *root, const char *key, int excl, int wait, long *holder)
{
	char path[PATH_LEN];
	snprintf(path, sizeof(path), "%s/%s.lock", root, key);
	if (holder)
		*holder = 0;
	double t0 = now_s();
	int said = 0;
	for (;;) {
		char why[WHY_LEN];
		int fd = open_ours(path, O_RDWR | O_CREAT, why, sizeof(why));
		if (fd < 0) {
			fprintf(stderr, "error: the cache lock %s (remove it)\n", why);
			return LOCK_ERR;
		}
		while (flock(fd, (excl ? LOCK_EX : LOCK_SH) | LOCK_NB) < 0) {
			if (errno == EINTR)
				continue;
			if (errno != EWOULDBLOCK) {
				fprintf(stderr, "error: cannot lock %s: %s\n", path, strerror(errno));
				close(fd);
				return LOCK_ERR;
			}
			long pid = lock_pid(fd);
			if (!wait) {
				if (holder)
					*holder = pid;
				close(fd);
				return LOCK_BUSY;
			}
			if (!said && now_s() - t0 >= 5) {
				if (pid)
					fprintf(stderr, "arena: waiting for process %ld, which is making the cache entry %s/%s\n",
						pid, root, key);
				else
					fprintf(stderr, "arena: waiting for another process, which is making the cache entry %s/%s\n",
						root, key);
				said = 1;
			}
			struct timespec ts = {0, 100 * 1000 * 1000};
			nanosleep(&ts, NULL);
		}
		struct stat a, b;
		if (fstat(fd, &a) == 0 && lstat(path, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino) {
			if (excl) {
				char s[32];
				int n = snprintf(s, sizeof(s), "%ld\n", (long)getpid());
				if (ftruncate(fd, 0) < 0 || pwrite(fd, s, (size_t)n, 0) != n)
					(void)0; /* the pid is for messages only */
			}
			return fd;
		}
		close(fd); /* removed (by its holder) while we waited: lock the one there now */
	}
}

/* Remove the entry e (its key's lock held, fd `lk`): renamed aside, then
 * removed; then the lock file. 0, or 3 with a message. */
static int ent_remove(const cache *c, const char *key, const char *dir, int lk)
{
	char trash[PATH_LEN], lp[PATH_LEN];
	snprintf(trash, sizeof(trash), "%s/.trash-%s-%ld", c->root, key, (long)getpid());
	if (tree_remove(trash) < 0 || (rename(dir, trash) < 0 && errno != ENOENT) || tree_remove(trash) < 0) {
		fprintf(stderr, "error: cannot remove the cache entry %s: %s\n", dir, strerror(errno));
		return 3;
	}
	snprintf(lp, sizeof(lp), "%s/%s.lock", c->root, key);
	(void)lk;
	unlink(lp); /* held: a process waiting for it checks the file it got is still the one there */
	return 0;
}

/* "tiny_flux from /a/b.safetensors (+2 files) quant=fp8-e4m3-row" */
static void made_from(const ent *e, char *buf, size_t len)
{
	size_t at = 0;
	buf[0] = 0;
#define PUT(...)                                                                  \
	do {                                                                      \
		if (at < len) {                                                   \
			int w_ = snprintf(buf + at, len - at, __VA_ARGS__);       \
			at += w_ > 0 ? (size_t)w_ : 0;                           \
		}                                                                 \
	} while (0)
	const char *label = json_string_value(json_object_get(e->doc, "label"));
	if (label && *label)
		PUT("%s ", label);
	json_t *rec = json_object_get(e->doc, "record");
	json_t *src = json_object_get(rec, "sources");
	if (json_is_string(src)) {
		PUT("from %s ", json_string_value(src));
	} else if (json_is_array(src) && json_array_size(src) > 0) {
		const char *s0 = json_string_value(json_array_get(src, 0));
		PUT("from %s ", s0 ? s0 : "?");
		if (json_array_size(src) > 1)
			PUT("(+%zu file%s) ", json_array_size(src) - 1, cli_s(json_array_size(src) - 1));
	}
	json_t *opts = json_object_get(rec, "options");
	const char *k;
	json_t *v;
	json_object_foreach(opts, k, v)
	{
		if (json_is_null(v) || json_is_false(v))
			continue;
		if (json_is_string(v))
			PUT("%s=%s ", k, json_string_value(v));
		else if (json_is_true(v))
			PUT("%s ", k);
		else if (json_is_integer(v))
			PUT("%s=%lld ", k, (long long)json_integer_value(v));
		else
			PUT("%s=... ", k);
	}
#undef PUT
	if (at > 0 && at <= len && buf[at - 1] == ' ')
		buf[at - 1] = 0;
	if (!buf[0])
		snprintf(buf, len, "(no record of its sources)");
}

/* ---- list ---------------------------------------------------------------------------------- */

static int cache_list(cache *c, int json)
{
	uint64_t total = 0, left_bytes = 0;
	for (size_t i = 0; i < c->n; i++)
		total += c->ents[i].size;
	for (size_t i = 0; i < c->n_left; i++)
		left_bytes += c->lefts[i].size;
	if (json) {
		json_t *out = json_object(), *arr = json_array(), *la = json_array();
		for (size_t i = 0; i < c->n; i++) {
			const ent *e = &c->ents[i];
			char img[PATH_LEN];
			snprintf(img, sizeof(img), "%s/image.arena", e->dir);
			struct stat st;
			long pid = lstat(img, &st) == 0 ? flock_pid(&st) : 0;
			json_t *rec = json_object_get(e->doc, "record");
			const char *label = json_string_value(json_object_get(e->doc, "label"));
			json_array_append_new(
				arr, json_pack("{s:s,s:s,s:s,s:o,s:o,s:f,s:s,s:o,s:o,s:b,s:o}", "key", e->key, "path", e->dir,
					       "image", img, "size", cli_json_u64(e->size), "made",
					       e->made >= 0 ? json_real(e->made) : json_null(), "used", e->used, "label",
					       label ? label : "", "record",
					       json_is_object(rec) ? json_incref(rec) : json_object(), "problem",
					       e->why[0] ? json_string(e->why) : json_null(), "in_use", pid != 0,
					       "in_use_by", pid > 0 ? json_integer(pid) : json_null()));
		}
		for (size_t i = 0; i < c->n_left; i++)
			json_array_append_new(la, json_pack("{s:s,s:s,s:o}", "path", c->lefts[i].path, "key",
							    c->lefts[i].key, "size", cli_json_u64(c->lefts[i].size)));
		json_object_set_new(out, "root", json_string(c->root));
		json_object_set_new(out, "entries", arr);
		json_object_set_new(out, "size", cli_json_u64(total));
		json_object_set_new(out, "leftovers", la);
		return cli_print_json(out);
	}
	for (size_t i = 0; i < c->n; i++) {
		const ent *e = &c->ents[i];
		char sz[32], a[32], from[1024];
		if (e->why[0]) {
			printf("%.12s  %10s  used %-12s  damaged: %s\n", e->key, cli_fmt_bytes(e->size, sz, sizeof(sz)),
			       ago(e->used, a, sizeof(a)), e->why);
			continue;
		}
		made_from(e, from, sizeof(from));
		char img[PATH_LEN];
		snprintf(img, sizeof(img), "%s/image.arena", e->dir);
		struct stat st;
		long pid = lstat(img, &st) == 0 ? flock_pid(&st) : 0;
		char use[48] = "";
		if (pid > 0)
			snprintf(use, sizeof(use), " (in use by process %ld)", pid);
		else if (pid < 0)
			snprintf(use, sizeof(use), " (in use)");
		printf("%.12s  %10s  used %-12s  %s%s\n", e->key, cli_fmt_bytes(e->size, sz, sizeof(sz)),
		       ago(e->used, a, sizeof(a)), from, use);
	}
	char t[32], l[32];
	printf("%zu entr%s, %s in %s\n", c->n, c->n == 1 ? "y" : "ies", cli_fmt_bytes(total, t, sizeof(t)), c->root);
	if (c->n_left)
		printf("%zu folder%s (%s) of entries being made or removed, or left by a process that stopped "
		       "('arena cache prune' removes those left)\n",
		       c->n_left, cli_s(c->n_left), cli_fmt_bytes(left_bytes, l, sizeof(l)));
	return 0;
}

/* ---- verify -------------------------------------------------------------------------------- */

static int on_progress(void *ctx, uint64_t done, uint64_t total)
{
	cli_progress_update(ctx, done, total);
	return 0;
}

/* Check e's image against its record and every byte of it: 0, or why into why. */
static int ent_verify(const ent *e, unsigned threads, int quiet, char *why, size_t len)
{
	if (e->why[0]) {
		snprintf(why, len, "%s", e->why);
		return -1;
	}
	char img[PATH_LEN], err[WHY_LEN];
	snprintf(img, sizeof(img), "%s/image.arena", e->dir);
	int fd = open_ours(img, O_RDONLY, err, sizeof(err));
	if (fd < 0) {
		snprintf(why, len, "its image %s", err);
		return -1;
	}
	json_t *im = json_object_get(e->doc, "image");
	const uint64_t size = (uint64_t)json_integer_value(json_object_get(im, "size"));
	const char *sum = json_string_value(json_object_get(im, "header_xxh3"));
	struct stat st;
	unsigned char h[8];
	char hex[17] = "";
	int ok = fstat(fd, &st) == 0;
	if (ok && pread(fd, h, 8, HEADER_SUM_AT) == 8)
		for (int i = 0; i < 8; i++)
			snprintf(hex + 2 * i, 3, "%02x", h[i]);
	close(fd);
	if (!ok || (uint64_t)st.st_size != size) {
		snprintf(why, len, "image.arena is %lld bytes, its record says %llu (truncated or rewritten)",
			 ok ? (long long)st.st_size : -1LL, (unsigned long long)size);
		return -1;
	}
	if (strcmp(hex, sum)) {
		snprintf(why, len, "image.arena's header checksum is not the one it was verified with");
		return -1;
	}
	cli_progress pg;
	char label[40];
	snprintf(label, sizeof(label), "verify %.12s", e->key);
	cli_progress_start(&pg, label, quiet);
	arena_verify_options o = {.threads = threads, .progress = on_progress, .progress_ctx = &pg};
	arena_verify_info vi;
	int rc = arena_verify(img, &o, &vi);
	cli_progress_end(&pg);
	if (rc) {
		snprintf(why, len, "%s", arena_last_error());
		if (vi.bad_chunks > 1) {
			size_t n = strlen(why);
			snprintf(why + n, len - n, "; %llu bad chunks in all", (unsigned long long)vi.bad_chunks);
		}
		return -1;
	}
	return 0;
}

static int cache_verify(cache *c, char **keys, int n_keys, int remove, unsigned threads, int quiet)
{
	/* each KEY given names one entry by a prefix of its key */
	char *pick = calloc(c->n ? c->n : 1, 1);
	if (!pick) {
		fprintf(stderr, "error: cache: out of memory\n");
		return 3;
	}
	for (int k = 0; k < n_keys; k++) {
		size_t kn = strlen(keys[k]), hit = 0, at = 0;
		for (size_t i = 0; i < c->n; i++)
			if (!strncmp(c->ents[i].key, keys[k], kn))
				hit++, at = i;
		if (!kn || hit != 1) {
			free(pick);
			if (!kn || !hit)
				return cli_usage_error("cache", "verify: no entry %s in %s ('arena cache list' lists them)",
						       kn ? arena_q(keys[k]) : "''", c->root);
			return cli_usage_error("cache", "verify: %s names %zu entries: give more of its key", arena_q(keys[k]),
					       hit);
		}
		pick[at] = 1;
	}
	size_t bad = 0, good = 0, removed = 0;
	int st = 0;
	for (size_t i = 0; i < c->n; i++) {
		ent *e = &c->ents[i];
		if (n_keys && !pick[i])
			continue;
		/* shared: not while it is made again or removed; exclusive to remove it */
		int lk = e->foreign ? LOCK_BUSY : lock_key(c->root, e->key, remove, 1, NULL);
		if (lk == LOCK_ERR) {
			st = 3;
			continue;
		}
		/* read again under the lock: it may have been made again meanwhile */
		struct stat dst;
		if (!e->foreign) {
			json_decref(e->doc);
			if (lstat(e->dir, &dst) < 0) {
				close(lk);
				continue; /* removed meanwhile */
			}
			ent_read(e, &dst);
		}
		char why[2 * WHY_LEN];
		if (ent_verify(e, threads, quiet, why, sizeof(why)) == 0) {
			char sz[32];
			printf("ok: %.12s  %s  %s\n", e->key, cli_fmt_bytes(e->size, sz, sizeof(sz)), e->dir);
			good++;
		} else {
			bad++;
			fprintf(stderr, "error: the cache entry %s is bad: %s\n", e->dir, why);
			if (remove && e->foreign) {
				fprintf(stderr, "arena: left %s: it is not this user's alone; remove it by hand\n", e->dir);
			} else if (remove) {
				if (ent_remove(c, e->key, e->dir, lk) == 0) {
					printf("removed: %.12s  %s (the next use makes it again)\n", e->key, e->dir);
					removed++;
				} else {
					st = 3;
				}
			}
		}
		if (lk >= 0)
			close(lk);
	}
	free(pick);
	if (good + bad == 0 && !st)
		printf("no entries in %s\n", c->root);
	else if (bad)
		fprintf(stderr, "%zu of %zu entr%s bad%s%s\n", bad, good + bad, good + bad == 1 ? "y" : "ies",
			removed ? ", removed" : "", remove ? "" : " ('arena cache verify --remove' removes them)");
	return st ? st : bad ? 1 : 0;
}

/* ---- prune ----------------------------------------------------------------------------------- */

/* A DURATION: a whole number and a unit s, m, h, d or w. Seconds, or -1. */
static double duration(const char *s)
{
	uint64_t n;
	size_t len = strlen(s);
	if (len < 2 || len > 12)
		return -1;
	char num[16];
	memcpy(num, s, len - 1);
	num[len - 1] = 0;
	if (arena_count_parse(num, 0, 1000000000ull, &n))
		return -1;
	switch (s[len - 1]) {
	case 's':
		return (double)n;
	case 'm':
		return (double)n * 60;
	case 'h':
		return (double)n * 3600;
	case 'd':
		return (double)n * 86400;
	case 'w':
		return (double)n * 7 * 86400;
	default:
		return -1;
	}
}

static int cache_prune(cache *c, double older, int all, int dry)
{
	const double now = now_s();
	uint64_t freed = 0;
	size_t n_removed = 0, n_kept = 0;
	int st = 0;
	const char *verb = dry ? "would remove" : "removed";
	for (size_t j = c->n; j-- > 0;) { /* the oldest first */
		ent *e = &c->ents[j];
		if (!all && now - e->used <= older)
			continue;
		char sz[32], a[32], from[WHY_LEN + 16];
		if (e->foreign) {
			fprintf(stderr, "arena: left %s: %s\n", e->dir, e->why);
			n_kept++;
			continue;
		}
		long pid = 0;
		int lk = lock_key(c->root, e->key, 1, 0, &pid);
		if (lk == LOCK_ERR) {
			st = 3;
			continue;
		}
		if (lk == LOCK_BUSY) {
			if (pid)
				printf("left: %.12s  being made or checked by process %ld\n", e->key, pid);
			else
				printf("left: %.12s  being made or checked by another process\n", e->key);
			n_kept++;
			continue;
		}
		/* in use: a process holds its image (shared); the lock stays ours while it is removed */
		char img[PATH_LEN], why[WHY_LEN];
		snprintf(img, sizeof(img), "%s/image.arena", e->dir);
		int ifd = open_ours(img, O_RDONLY, why, sizeof(why));
		if (ifd >= 0 && flock(ifd, LOCK_EX | LOCK_NB) < 0) {
			struct stat ist;
			long user = fstat(ifd, &ist) == 0 ? flock_pid(&ist) : 0;
			if (user > 0)
				printf("left: %.12s  in use by process %ld\n", e->key, user);
			else
				printf("left: %.12s  in use\n", e->key);
			n_kept++;
			close(ifd);
			close(lk);
			continue;
		}
		/* its last use, again under the locks: used since it was listed, it stays */
		struct stat dst;
		if (lstat(e->dir, &dst) < 0) {
			if (ifd >= 0)
				close(ifd);
			close(lk);
			continue;
		}
		json_decref(e->doc);
		ent_read(e, &dst);
		if (!all && now_s() - e->used <= older) {
			if (ifd >= 0)
				close(ifd);
			close(lk);
			continue;
		}
		if (e->why[0])
			snprintf(from, sizeof(from), "damaged: %s", e->why);
		else
			made_from(e, from, sizeof(from));
		int r = dry ? 0 : ent_remove(c, e->key, e->dir, lk);
		if (ifd >= 0)
			close(ifd);
		close(lk);
		if (r) {
			st = r;
			continue;
		}
		printf("%s: %.12s  %10s  used %-12s  %s\n", verb, e->key, cli_fmt_bytes(e->size, sz, sizeof(sz)),
		       ago(e->used, a, sizeof(a)), from);
		freed += e->size;
		n_removed++;
	}
	/* folders left by a process that stopped while making or removing an entry */
	size_t n_left = 0;
	for (size_t i = 0; i < c->n_left; i++) {
		left *l = &c->lefts[i];
		int lk = lock_key(c->root, l->key, 1, 0, NULL);
		if (lk == LOCK_ERR) {
			st = 3;
			continue;
		}
		if (lk == LOCK_BUSY)
			continue; /* being made or removed now */
		char sz[32];
		if (!dry && tree_remove(l->path) < 0) {
			fprintf(stderr, "error: cannot remove %s: %s\n", l->path, strerror(errno));
			st = 3;
		} else {
			printf("%s: %s  %s (left by a process that stopped)\n", verb, l->path,
			       cli_fmt_bytes(l->size, sz, sizeof(sz)));
			freed += l->size;
			n_left++;
			char p[PATH_LEN];
			struct stat s;
			snprintf(p, sizeof(p), "%s/%s", c->root, l->key);
			if (!dry && lstat(p, &s) < 0 && errno == ENOENT) { /* no entry: its lock goes too, held */
				snprintf(p, sizeof(p), "%s/%s.lock", c->root, l->key);
				unlink(p);
			}
		}
		close(lk);
	}
	/* lock files of keys without an entry or a folder being made: removed holding them */
	if (!dry) {
		for (size_t i = 0; i < c->n_locks; i++) {
			char key[KEY_MAX + 1], p[PATH_LEN], t[PATH_LEN];
			size_t kn = strlen(c->locks[i]) - 5;
			memcpy(key, c->locks[i], kn);
			key[kn] = 0;
			snprintf(p, sizeof(p), "%s/%s", c->root, key);
			int lk = lock_key(c->root, key, 1, 0, NULL);
			if (lk < 0)
				continue;
			struct stat s;
			int busy = lstat(p, &s) == 0;
			for (int k = 0; !busy && k < 2; k++) {
				DIR *d = opendir(c->root);
				struct dirent *de;
				snprintf(t, sizeof(t), k ? ".trash-%s-" : ".tmp-%s-", key);
				while (d && !busy && (de = readdir(d)))
					busy = !strncmp(de->d_name, t, strlen(t));
				if (d)
					closedir(d);
			}
			if (!busy) {
				snprintf(p, sizeof(p), "%s/%s", c->root, c->locks[i]);
				unlink(p);
			}
			close(lk);
		}
	}
	char f[32];
	printf("%s %s: %zu entr%s", dry ? "would free" : "freed", cli_fmt_bytes(freed, f, sizeof(f)), n_removed,
	       n_removed == 1 ? "y" : "ies");
	if (n_left)
		printf(" and %zu folder%s left by a process that stopped", n_left, cli_s(n_left));
	if (n_kept)
		printf("; %zu left (in use, being made, or not this user's)", n_kept);
	printf("\n");
	return st;
}

/* ---- the command ----------------------------------------------------------------------------- */

int cmd_cache(int argc, char **argv)
{
	enum { O_CACHE = 1, O_JSON, O_REMOVE, O_THREADS, O_OLDER, O_ALL, O_DRY };
	static const struct option opts[] = {
		{"cache", required_argument, NULL, O_CACHE},   {"json", no_argument, NULL, O_JSON},
		{"remove", no_argument, NULL, O_REMOVE},       {"threads", required_argument, NULL, O_THREADS},
		{"quiet", no_argument, NULL, 'q'},             {"older-than", required_argument, NULL, O_OLDER},
		{"all", no_argument, NULL, O_ALL},             {"dry-run", no_argument, NULL, O_DRY},
		{NULL, 0, NULL, 0}};
	if (argc < 2)
		return cli_usage_error("cache", "say list, verify or prune");
	const char *sub = argv[1];
	const int is_list = !strcmp(sub, "list"), is_verify = !strcmp(sub, "verify"), is_prune = !strcmp(sub, "prune");
	if (!is_list && !is_verify && !is_prune)
		return cli_usage_error("cache", "'%s' is not list, verify or prune", arena_q(sub));
	const char *dir = NULL;
	int json = 0, remove = 0, quiet = 0, all = 0, dry = 0, ch, idx = -1;
	unsigned threads = 0;
	double older = -1;
	char nb[64];
	char **av = argv + 1; /* from the subcommand's name, which getopt skips as its argv[0] */
	optind = 0;
	opterr = 0;
	while ((ch = getopt_long(argc - 1, av, "q", opts, &idx)) != -1) {
		const char *on = idx >= 0 ? cli_opt_name(opts, idx, nb, sizeof(nb)) : "-q";
		int fits = 1;
		switch (ch) {
		case O_CACHE:
			if (!*optarg)
				return cli_usage_error("cache", "--cache: an empty path");
			dir = optarg;
			break;
		case O_JSON:
			json = 1, fits = is_list;
			break;
		case O_REMOVE:
			remove = 1, fits = is_verify;
			break;
		case 'q':
			quiet = 1, fits = is_verify;
			break;
		case O_THREADS: {
			uint64_t n;
			int rc = cli_count_arg("cache", "--threads", optarg, 1, 64, &n);
			if (rc)
				return rc;
			threads = (unsigned)n;
			fits = is_verify;
			break;
		}
		case O_OLDER:
			if ((older = duration(optarg)) < 0)
				return cli_usage_error("cache", "--older-than '%s' is not a duration: a whole number and a unit s, m, "
								"h, d or w, e.g. 30d or 12h",
						       arena_q(optarg));
			fits = is_prune;
			break;
		case O_ALL:
			all = 1, fits = is_prune;
			break;
		case O_DRY:
			dry = 1, fits = is_prune;
			break;
		default:
			return cli_usage_error("cache", "unknown or incomplete option '%s'", av[optind - 1]);
		}
		if (!fits)
			return cli_usage_error("cache", "%s is not an option of 'arena cache %s'", on, sub);
		idx = -1;
	}
	const int rest = argc - 1 - optind;
	char **args = av + optind;
	if (!is_verify && rest > 0)
		return cli_usage_error("cache", "%s takes no arguments, got '%s'", sub, arena_q(args[0]));
	if (is_prune && older < 0 && !all)
		return cli_usage_error("cache", "prune: say which entries: --older-than DURATION (e.g. 30d) or --all");
	if (is_prune && older >= 0 && all)
		return cli_usage_error("cache", "prune: --older-than and --all together: give one");
	cache c = {0};
	int rc = root_path(dir, c.root, sizeof(c.root));
	if (rc)
		return rc;
	rc = root_check(c.root);
	if (rc == 1) { /* no cache yet */
		if (is_list && json) {
			json_t *out = json_pack("{s:s,s:[],s:i,s:[]}", "root", c.root, "entries", "size", 0, "leftovers");
			return cli_print_json(out);
		}
		if (is_verify && rest > 0)
			return cli_usage_error("cache", "verify: no entry %s: the cache %s does not exist", arena_q(args[0]),
					       c.root);
		printf("%s: the cache %s does not exist yet\n", is_prune ? "freed 0 B" : "0 entries", c.root);
		return 0;
	}
	if (rc)
		return rc;
	if ((rc = scan(&c)) == 0) {
		if (is_list)
			rc = cache_list(&c, json);
		else if (is_verify)
			rc = cache_verify(&c, args, rest, remove, threads, quiet);
		else
			rc = cache_prune(&c, older, all, dry);
	}
	cache_free(&c);
	return rc;
}
