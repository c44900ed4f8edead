/* test_share.c - host copies shared by the processes of a host
 * (ARENA_OPEN_SHARE_HOST, device/hostshare.h): N processes (fork) that
 * open one image with the same caps hold one host copy of its streamed
 * blocks, measured as the sum of their PSS (proportional set size:
 * /proc/PID/smaps_rollup, where a page mapped by k processes counts 1/k in
 * each; RSS would count it k times), against N copies without the flag in
 * the same test; every process's steps give the bytes one process's do;
 * a process killed with SIGKILL mid-step leaves the others' steps right
 * and the region to the live ones; one that opens while another loads
 * waits, then maps; a loader killed while loading leaves the waiter to
 * load; different layouts get different regions; release of a host copy
 * drops one process's view only; injected failures of every system call
 * of the sharing path are one-line errors that leave no registry file,
 * no mapping and no allocation behind; a checkpoint is refused. */
#include <criterion/criterion.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "arena.h"
#include "../../common/alloc.h"
#include "../../common/hash.h"
#include "../../formats/codec.h"
#include "../../device/hostshare.h"
#include "../../formats/image.h"
#include "../../formats/wire.h"
#include "../../convert/convert.h"
#include "../../runtime/open.h"
#include "testutil.h"

#define BLOCKS 12
#define BLOCK_BYTES (4u << 20) /* bf16 [1024, 2048] */
#define MiB (1ull << 20)

static char dir[256], shm[300];
static char img[300], hb4[300], ckpt[300];

/* A checkpoint of BLOCKS blocks of 4 MiB (transformer_blocks.N.weight,
 * values of about 0.02 in bf16: hb4 codes them) and a small global. */
static void write_checkpoint(const char *path)
{
	FILE *f = fopen(path, "wb");
	cr_assert(f, "%s: %s", path, strerror(errno));
	char hdr[4096];
	int n = snprintf(hdr, sizeof(hdr), "{\"proj_out.weight\":{\"dtype\":\"BF16\",\"shape\":[64,64],\"data_offsets\":[0,8192]}");
	uint64_t off = 8192;
	for (int b = 0; b < BLOCKS; b++) {
		n += snprintf(hdr + n, sizeof(hdr) - (size_t)n,
			      ",\"transformer_blocks.%d.weight\":{\"dtype\":\"BF16\",\"shape\":[1024,2048],\"data_offsets\":[%llu,%llu]}",
			      b, (unsigned long long)off, (unsigned long long)(off + BLOCK_BYTES));
		off += BLOCK_BYTES;
	}
	n += snprintf(hdr + n, sizeof(hdr) - (size_t)n, "}");
	while (n % 8)
		hdr[n++] = ' ';
	uint64_t len = (uint64_t)n;
	cr_assert_eq(fwrite(&len, 8, 1, f), 1);
	cr_assert_eq(fwrite(hdr, 1, (size_t)n, f), (size_t)n);
	uint64_t x = 0x9E3779B97F4A7C15ull;
	uint16_t buf[4096];
	for (uint64_t done = 0; done < off; done += sizeof(buf)) {
		for (size_t i = 0; i < 4096; i++) {
			x ^= x << 13, x ^= x >> 7, x ^= x << 17;
			/* sign, exponent 0x79..0x7a (about 2^-6..2^-4), random mantissa */
			buf[i] = (uint16_t)(((x >> 63) << 15) | ((0x79u + ((x >> 40) & 1)) << 7) | (x & 0x7f));
		}
		cr_assert_eq(fwrite(buf, 1, sizeof(buf), f), sizeof(buf));
	}
	cr_assert_eq(fclose(f), 0);
}

static void setup(void)
{
	tmpdir_make(dir, sizeof(dir), "test-share");
	snprintf(shm, sizeof(shm), "%s/shm", dir);
	cr_assert_eq(mkdir(shm, 0700), 0);
	setenv("ARENA_SHARE_DIR", shm, 1);
	setenv("ARENA_WIRE_SEGMENT", "256K", 1); /* coded copies: several segments a chunk (the tables say where) */
	setenv("ARENA_WIRE_POOL", "2M", 1);     /* and small device stages */
	setenv("ARENA_LOAD_PIECE", "1M", 1); /* pieces of a chunk: a process that maps reads its device blocks only */
	snprintf(ckpt, sizeof(ckpt), "%s/m.safetensors", dir);
	snprintf(img, sizeof(img), "%s/m.arena", dir);
	snprintf(hb4, sizeof(hb4), "%s/m-hb4.arena", dir);
	write_checkpoint(ckpt);
	const char *in = ckpt;
	arena_convert_opts co = {.chunk_size = 1 << 20, .threads = 1};
	cr_assert_eq(arena_convert_inputs(&in, 1, img, &co, NULL), 0, "%s", arena_last_error());
	co.codec = ARENA_CODEC_HB4;
	cr_assert_eq(arena_convert_inputs(&in, 1, hb4, &co, NULL), 0, "%s", arena_last_error());
}

static void teardown(void)
{
	arena__share_publish_delay_ms = 0;
	arena__wire_seg_max = 0;
	arena_fault_share(0);
	tmpdir_remove(dir);
}

TestSuite(share, .init = setup, .fini = teardown, .timeout = 120);

/* Globals and a ring of three blocks on the device: the others streamed
 * (a coded image's stages need extra_cap more). */
static uint64_t extra_cap;

static arena_open_options opts(int share, uint64_t cap)
{
	return (arena_open_options){.backend = "sim",
				    .vram_cap = (cap ? cap : 14 * MiB) + extra_cap,
				    .headroom = ARENA_ZERO_BYTES,
				    .reserve = ARENA_ZERO_BYTES,
				    .threads = 1,
				    .flags = ARENA_OPEN_NO_LEARN | ARENA_OPEN_FIXED_SCHEDULE | (share ? ARENA_OPEN_SHARE_HOST : 0)};
}

/* `steps` steps over every block: a hash of every acquired block's bytes,
 * in order (what the engine gave the "device"). 0 on an error. */
static uint64_t run_steps(arena *a, int steps)
{
	arena_hash h;
	arena_hash_reset(&h);
	size_t n = arena_block_count(a);
	for (int s = 0; s < steps; s++) {
		if (arena_step_begin(a))
			return 0;
		for (size_t i = 0; i < n; i++) {
			void *d;
			if (arena_block_acquire(a, i, NULL, &d))
				return 0;
			arena_hash_update(&h, d, arena_block_bytes(a, i));
			if (arena_block_release(a, i, NULL))
				return 0;
		}
		if (arena_step_end(a))
			return 0;
	}
	return arena_hash_digest(&h);
}

/* The PSS of process pid in bytes. */
static uint64_t pss_of(pid_t pid)
{
	char p[64], line[256];
	snprintf(p, sizeof(p), "/proc/%d/smaps_rollup", (int)pid);
	FILE *f = fopen(p, "r");
	cr_assert(f, "%s: %s", p, strerror(errno));
	unsigned long long kb = 0;
	int found = 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "Pss: %llu kB", &kb) == 1) {
			found = 1;
			break;
		}
	fclose(f);
	cr_assert(found, "%s: no Pss line", p);
	return kb << 10;
}

/* Files in the share folder (registry files). */
static int registries(void)
{
	return dir_entries(shm);
}

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* What a child reports. */
typedef struct report {
	int rc;
	double opened; /* CLOCK_MONOTONIC seconds when its open returned (one clock for all processes) */
	uint64_t digest, file_bytes, host_bytes;
	uint64_t checked; /* region bytes checked against the image (hashed or compared) */
	int state;        /* ARENA_SHARE_* */
	char err[400];
} report;

typedef struct child {
	pid_t pid;
	int to[2], from[2]; /* parent -> child, child -> parent */
} child;

/* The parent's ends of its children's pipes: a child closes its siblings'
 * (else a child would hold another's pipe open past the parent's close). */
static int parent_fds[64];
static int n_parent_fds;

static void child_fail(int fd, const char *what)
{
	report r = {.rc = 1};
	snprintf(r.err, sizeof(r.err), "%s: %s", what, arena_last_error());
	(void)!write(fd, &r, sizeof(r));
	_exit(1);
}

/* Wait for a byte from the parent (0: go on; EOF: exit). */
static int child_wait(int fd)
{
	char c;
	return read(fd, &c, 1) == 1;
}

static void parent_say(const child *c)
{
	cr_assert_eq(write(c->to[1], "g", 1), 1);
}

static void parent_read(const child *c, report *r)
{
	ssize_t n = read(c->from[0], r, sizeof(*r));
	cr_assert_eq(n, (ssize_t)sizeof(*r), "child %d: no report", (int)c->pid);
	cr_assert_eq(r->rc, 0, "child %d: %s", (int)c->pid, r->err);
}

static void forget_fd(int fd)
{
	for (int i = 0; i < n_parent_fds; i++)
		if (parent_fds[i] == fd)
			parent_fds[i] = parent_fds[--n_parent_fds];
}

static void parent_end(child *c, int want_status)
{
	forget_fd(c->to[1]);
	forget_fd(c->from[0]);
	close(c->to[1]);
	int st;
	cr_assert_eq(waitpid(c->pid, &st, 0), c->pid);
	if (want_status >= 0)
		cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == want_status, "child %d: status %d", (int)c->pid, st);
	close(c->from[0]);
}

/* A child: waits for go, opens `path` (share, cap), reports, runs `steps`
 * steps and reports their digest, then waits until told to exit. */
static void spawn(child *c, const char *path, int share, uint64_t cap, int steps, unsigned open_delay_ms)
{
	cr_assert_eq(pipe(c->to), 0);
	cr_assert_eq(pipe(c->from), 0);
	fflush(NULL);
	c->pid = fork();
	cr_assert(c->pid >= 0);
	if (c->pid) {
		close(c->to[0]);
		close(c->from[1]);
		cr_assert_lt(n_parent_fds + 2, 64);
		parent_fds[n_parent_fds++] = c->to[1];
		parent_fds[n_parent_fds++] = c->from[0];
		return;
	}
	for (int i = 0; i < n_parent_fds; i++)
		close(parent_fds[i]);
	close(c->to[1]);
	close(c->from[0]);
	if (!child_wait(c->to[0]))
		_exit(0);
	if (open_delay_ms)
		usleep(open_delay_ms * 1000);
	arena_open_options o = opts(share, cap);
	arena *a;
	arena_load_stats st;
	if (arena__open_tuned(path, &o, NULL, &a, &st, NULL))
		child_fail(c->from[1], "open");
	arena_plan_info p;
	if (arena_plan_get(a, &p))
		child_fail(c->from[1], "plan");
	report r = {.opened = now_s(),
		    .file_bytes = st.file_bytes,
		    .host_bytes = p.host_bytes,
		    .checked = st.share_hashed + st.share_compared};
	arena_share_info si;
	if (arena_share_get(a, &si))
		child_fail(c->from[1], "share");
	r.state = si.state;
	snprintf(r.err, sizeof(r.err), "%s", si.why);
	if (si.checked_bytes != st.share_hashed + st.share_compared)
		child_fail(c->from[1], "the share's record and the load's differ");
	(void)!write(c->from[1], &r, sizeof(r));
	if (!child_wait(c->to[0]))
		_exit(0);
	for (;;) { /* steps until told to stop (a byte: report; EOF: exit) */
		r.digest = run_steps(a, steps);
		if (!r.digest)
			child_fail(c->from[1], "step");
		(void)!write(c->from[1], &r, sizeof(r));
		if (!child_wait(c->to[0]))
			break;
	}
	arena_close(a);
	_exit(0);
}

/* One process's digest of `steps` steps, not shared. */
static uint64_t reference_digest(const char *path, int steps, uint64_t *host_bytes, uint64_t *file_bytes)
{
	arena_open_options o = opts(0, 0);
	arena *a;
	arena_load_stats st;
	cr_assert_eq(arena__open_tuned(path, &o, NULL, &a, &st, NULL), 0, "%s", arena_last_error());
	arena_plan_info p;
	cr_assert_eq(arena_plan_get(a, &p), 0);
	cr_assert(p.n_streamed >= BLOCKS - 4, "the caps stream most blocks (%zu streamed)", p.n_streamed);
	*host_bytes = p.host_bytes;
	*file_bytes = st.file_bytes;
	uint64_t d = run_steps(a, steps);
	cr_assert_neq(d, 0, "%s", arena_last_error());
	arena_close(a);
	return d;
}

/* N processes open path (share or not) one after another and step; the
 * sum of the growth of their PSS from before the open to after the steps,
 * all of them holding the arena. Each process's steps give `want`. */
static uint64_t pss_growth(const char *path, int n, int share, uint64_t want, uint64_t full_read, uint64_t host_bytes)
{
	child c[8];
	uint64_t before = 0, after = 0;
	for (int i = 0; i < n; i++)
		spawn(&c[i], path, share, 0, 2, 0);
	usleep(100 * 1000);
	for (int i = 0; i < n; i++)
		before += pss_of(c[i].pid);
	for (int i = 0; i < n; i++) { /* one after the other: the first loads, the others map */
		report r;
		parent_say(&c[i]);
		parent_read(&c[i], &r);
		if (share && i) {
			cr_assert_eq(r.state, ARENA_SHARE_MAPPED, "process %d of %d: state %d (%s)", i, n, r.state, r.err);
			cr_assert_leq(r.file_bytes, full_read - host_bytes + MiB,
				     "process %d of %d read %llu bytes of the image: it loaded the host copies again", i, n,
				     (unsigned long long)r.file_bytes);
			/* the region's bytes were checked against the image, every one */
			cr_assert_geq(r.checked, host_bytes * 9 / 10, "process %d of %d checked %llu of %llu bytes it maps", i, n,
				      (unsigned long long)r.checked, (unsigned long long)host_bytes);
		} else {
			cr_assert_eq(r.state, share ? ARENA_SHARE_LOADED : ARENA_SHARE_OFF, "process %d: state %d (%s)", i,
				     r.state, r.err);
		}
		if (!(share && i))
			cr_assert_geq(r.file_bytes, full_read, "process %d read %llu bytes of %llu", i,
				      (unsigned long long)r.file_bytes, (unsigned long long)full_read);
	}
	if (share)
		cr_assert_eq(registries(), 1, "one registry file while they hold the region");
	for (int i = 0; i < n; i++) {
		report r;
		parent_say(&c[i]);
		parent_read(&c[i], &r);
		cr_assert_eq(r.digest, want, "process %d of %d: its steps' bytes differ from one process's", i, n);
	}
	for (int i = 0; i < n; i++)
		after += pss_of(c[i].pid);
	for (int i = 0; i < n; i++)
		parent_end(&c[i], 0);
	cr_assert_eq(registries(), 0, "the last process to close removes the registry");
	return after > before ? after - before : 0;
}

static uint64_t pss_shared_vs_not(const char *path, int n)
{
	uint64_t host, full;
	const uint64_t want = reference_digest(path, 2, &host, &full);
	cr_assert_geq(host, 8 * (uint64_t)BLOCK_BYTES * 3 / 4, "most of the model streams (host copies %llu bytes)",
		      (unsigned long long)host);
	const uint64_t s = pss_growth(path, n, 1, want, full, host);
	const uint64_t u = pss_growth(path, n, 0, want, full, host);
	/* Without sharing each process holds the host copies; with it one
	 * copy, plus what each process holds of its own (measured without
	 * sharing: its growth less one copy), plus 1 MiB a process of slack;
	 * a process that maps the region also checked it against the image,
	 * through up to 8 readers of two chunks (1 MiB here) each: freed after
	 * the check, but kept under AddressSanitizer (its quarantine). */
	const uint64_t own = u > n * host ? (u - n * host) / (uint64_t)n : 0;
	const uint64_t check = 8 * 2 * MiB;
	cr_log_info("share: N=%d host copies %.1f MiB: PSS growth, summed: shared %.1f MiB, not shared %.1f MiB", n,
		    host / (double)MiB, s / (double)MiB, u / (double)MiB);
	cr_assert_geq(u, (uint64_t)n * host * 9 / 10, "not shared: %d copies of %llu bytes, PSS grew %llu", n,
		      (unsigned long long)host, (unsigned long long)u);
	cr_assert_leq(s, host * 11 / 10 + (uint64_t)n * (own + MiB) + (uint64_t)(n - 1) * check,
		      "shared: one copy of %llu bytes and %llu of each process's own, PSS grew %llu", (unsigned long long)host,
		      (unsigned long long)own, (unsigned long long)s);
	return host;
}

Test(share, two_processes_hold_one_host_copy)
{
	pss_shared_vs_not(img, 2);
}

Test(share, four_processes_hold_one_host_copy)
{
	pss_shared_vs_not(img, 4);
}

Test(share, coded_host_copies_are_shared_with_their_segments)
{
	extra_cap = 2 * MiB; /* the device stages of coded copies */
	const uint64_t host = pss_shared_vs_not(hb4, 2);
	arena_open_options o = opts(0, 0);
	arena *a;
	cr_assert_eq(arena_open(hb4, &o, &a), 0, "%s", arena_last_error());
	arena_plan_info p;
	cr_assert_eq(arena_plan_get(a, &p), 0);
	arena_block_info bi;
	cr_assert_eq(arena_block_get(a, arena_block_count(a) - 1, &bi), 0);
	cr_assert(bi.coded, "the last block streams coded");
	/* coded: the copies are smaller than the raw blocks they hold */
	cr_assert_lt(host, p.n_streamed * (uint64_t)BLOCK_BYTES * 9 / 10, "host copies of %llu bytes are not coded",
		     (unsigned long long)host);
	arena_close(a);
}

Test(share, a_process_killed_mid_step_leaves_the_others_right)
{
	uint64_t host, full;
	const uint64_t want = reference_digest(img, 1, &host, &full);
	child c[4];
	for (int i = 0; i < 3; i++)
		spawn(&c[i], img, 1, 0, 1, 0);
	for (int i = 0; i < 3; i++) {
		report r;
		parent_say(&c[i]);
		parent_read(&c[i], &r);
	}
	/* All step; the loader (the first) is killed while its steps run. */
	for (int i = 0; i < 3; i++)
		parent_say(&c[i]);
	usleep(2000);
	kill(c[0].pid, SIGKILL);
	parent_end(&c[0], -1);
	for (int k = 0; k < 3; k++)
		for (int i = 1; i < 3; i++) {
			report r;
			parent_read(&c[i], &r);
			cr_assert_eq(r.digest, want, "process %d, step %d after the kill: bytes differ", i, k);
			parent_say(&c[i]);
		}
	/* A process that opens now maps the live processes' region. */
	spawn(&c[3], img, 1, 0, 1, 0);
	report r;
	parent_say(&c[3]);
	parent_read(&c[3], &r);
	cr_assert_leq(r.file_bytes, full - host + MiB, "after the loader's kill, a new process loaded again (%llu bytes read)",
		     (unsigned long long)r.file_bytes);
	parent_say(&c[3]);
	parent_read(&c[3], &r);
	cr_assert_eq(r.digest, want);
	for (int i = 1; i < 4; i++)
		parent_end(&c[i], 0);
	cr_assert_eq(registries(), 0, "the registry is gone with the last process");
	/* Nothing is left to map: a fresh open loads again, and closing removes it. */
	arena_open_options o = opts(1, 0);
	arena *a;
	arena_load_stats st;
	cr_assert_eq(arena__open_tuned(img, &o, NULL, &a, &st, NULL), 0, "%s", arena_last_error());
	cr_assert_geq(st.file_bytes, full, "a fresh open after all exited read %llu bytes, not the whole image",
		      (unsigned long long)st.file_bytes);
	cr_assert_eq(registries(), 1);
	cr_assert_eq(run_steps(a, 1), want);
	arena_close(a);
	cr_assert_eq(registries(), 0);
}

Test(share, a_process_that_opens_while_another_loads_waits_and_maps)
{
	uint64_t host, full;
	const uint64_t want = reference_digest(img, 1, &host, &full);
	arena__share_publish_delay_ms = 2000; /* the loader holds the lock 2 s before it publishes */
	child c[2];
	spawn(&c[0], img, 1, 0, 1, 0);
	spawn(&c[1], img, 1, 0, 1, 500); /* opens 0.5 s after: the other is loading */
	const double t0 = now_s();
	parent_say(&c[0]);
	parent_say(&c[1]);
	report r[2];
	double t[2];
	for (int i = 0; i < 2; i++) {
		parent_read(&c[i], &r[i]);
		t[i] = now_s() - t0;
	}
	/* Whichever took the lock first (the first, unless it was slow to
	 * start) loaded; the other waited for it and mapped. */
	const int l = r[0].file_bytes >= full ? 0 : 1, m = 1 - l;
	cr_assert_geq(r[l].file_bytes, full, "one process loads");
	cr_assert_leq(r[m].file_bytes, full - host + MiB, "the other waited and mapped, it did not load (%llu bytes read)",
		      (unsigned long long)r[m].file_bytes);
	cr_assert_geq(t[m], 1.9, "it opened once the loader had published (%.2f s)", t[m]);
	for (int i = 0; i < 2; i++) {
		report q;
		parent_say(&c[i]);
		parent_read(&c[i], &q);
		cr_assert_eq(q.digest, want);
		parent_end(&c[i], 0);
	}
	cr_assert_eq(registries(), 0);
}

Test(share, a_loader_killed_while_loading_leaves_the_waiter_to_load)
{
	uint64_t host, full;
	const uint64_t want = reference_digest(img, 1, &host, &full);
	arena__share_publish_delay_ms = 5000;
	child c[2];
	spawn(&c[0], img, 1, 0, 1, 0);
	arena__share_publish_delay_ms = 0; /* the second loads at its own pace */
	spawn(&c[1], img, 1, 0, 1, 500);
	const double t0 = now_s();
	parent_say(&c[0]);
	parent_say(&c[1]);
	usleep(1500 * 1000); /* the first holds the lock, the second waits on it */
	const double killed = now_s();
	kill(c[0].pid, SIGKILL);
	parent_end(&c[0], -1);
	report r;
	parent_read(&c[1], &r);
	cr_assert_gt(r.opened, killed, "the second waited for the loader (its open returned %.2f s after the start, the "
		     "kill was at %.2f s)", r.opened - t0, killed - t0);
	cr_assert_geq(r.file_bytes, full, "the waiter found no complete region and loaded (%llu bytes read)",
		      (unsigned long long)r.file_bytes);
	parent_say(&c[1]);
	parent_read(&c[1], &r);
	cr_assert_eq(r.digest, want);
	parent_end(&c[1], 0);
	cr_assert_eq(registries(), 0);
}

Test(share, different_layouts_get_regions_of_their_own)
{
	arena_open_options o1 = opts(1, 0), o2 = opts(1, 30 * MiB);
	arena *a, *b, *c;
	arena_load_stats s1, s2, s3;
	cr_assert_eq(arena__open_tuned(img, &o1, NULL, &a, &s1, NULL), 0, "%s", arena_last_error());
	cr_assert_eq(arena__open_tuned(img, &o2, NULL, &b, &s2, NULL), 0, "%s", arena_last_error());
	arena_plan_info pa, pb;
	cr_assert_eq(arena_plan_get(a, &pa), 0);
	cr_assert_eq(arena_plan_get(b, &pb), 0);
	cr_assert_neq(pa.n_streamed, pb.n_streamed, "the caps give different plans");
	cr_assert_eq(registries(), 2, "two layouts, two regions");
	cr_assert_geq(s2.file_bytes, s1.file_bytes / 2, "the second layout was loaded, not mapped");
	/* the same layout again (in this process too): mapped */
	cr_assert_eq(arena__open_tuned(img, &o1, NULL, &c, &s3, NULL), 0, "%s", arena_last_error());
	cr_assert_leq(s3.file_bytes, s1.file_bytes - pa.host_bytes + MiB, "the same layout again was mapped");
	cr_assert_eq(registries(), 2);
	cr_assert_eq(run_steps(a, 1), run_steps(c, 1));
	cr_assert_eq(run_steps(b, 1), run_steps(c, 1));
	/* a plain and a coded image of the same weights differ too */
	arena *d;
	arena_open_options o4 = opts(1, 16 * MiB);
	cr_assert_eq(arena__open_tuned(hb4, &o4, NULL, &d, &s3, NULL), 0, "%s", arena_last_error());
	cr_assert_eq(registries(), 3);
	arena_close(d);
	arena_close(a);
	arena_close(b);
	cr_assert_eq(registries(), 1, "c still holds its region");
	arena_close(c);
	cr_assert_eq(registries(), 0);
}

Test(share, releasing_a_host_copy_drops_one_process_view)
{
	arena_open_options o = opts(1, 0);
	arena *a, *b;
	cr_assert_eq(arena_open(img, &o, &a), 0, "%s", arena_last_error());
	cr_assert_eq(arena_open(img, &o, &b), 0, "%s", arena_last_error());
	const uint64_t want = run_steps(b, 1);
	size_t k = 0;
	while (k < a->m->layout->n_blocks && !a->m->mem[k].host)
		k++;
	cr_assert_lt(k, a->m->layout->n_blocks, "a block with a host copy");
	cr_assert(a->m->share && b->m->share && !a->m->host_mapped && b->m->host_mapped,
		  "a loaded the region, b mapped it");
	cr_assert_neq(a->m->mem[k].host, b->m->mem[k].host, "two mappings of the region");
	uint8_t first[64];
	memcpy(first, b->m->mem[k].host, sizeof(first));
	arena_model_host_release(a->m, (uint32_t)k);
	cr_assert_null(a->m->mem[k].host);
	cr_assert_eq(memcmp(first, b->m->mem[k].host, sizeof(first)), 0, "the other view keeps the bytes");
	cr_assert_eq(run_steps(b, 1), want);
	arena_close(a);
	cr_assert_eq(run_steps(b, 1), want);
	arena_close(b);
	cr_assert_eq(registries(), 0);
}

/* Does this process map a region of ours? */
static int maps_a_region(void)
{
	FILE *f = fopen("/proc/self/maps", "r");
	cr_assert(f);
	char line[512];
	int found = 0;
	while (fgets(line, sizeof(line), f))
		found |= strstr(line, "memfd:arena-") != NULL;
	fclose(f);
	return found;
}

/* Every system call of the sharing path, failed in turn (the loader's
 * path, then a mapper's while a first arena holds the region): the open
 * still succeeds with a private copy of the image's bytes, says why in one
 * line, and leaves no registry file, mapping or allocation of its own. */
Test(share, failures_of_the_sharing_path_give_a_private_copy_and_leave_nothing_behind)
{
	uint64_t host, full;
	const uint64_t want = reference_digest(img, 1, &host, &full);
	arena_open_options o = opts(1, 0);
	for (int mapper = 0; mapper < 2; mapper++) {
		arena *first = NULL;
		if (mapper) {
			cr_assert_eq(arena_open(img, &o, &first), 0, "%s", arena_last_error());
			arena_share_info si;
			cr_assert_eq(arena_share_get(first, &si), 0);
			cr_assert_eq(si.state, ARENA_SHARE_LOADED);
		}
		int failed = 0;
		for (long n = 1; n < 64; n++) {
			const long live = arena_alloc_live();
			arena *a = NULL;
			arena_fault_share(n);
			int rc = arena_open(img, &o, &a);
			const int fired = arena_fault_share_fired();
			arena_fault_share(0);
			cr_assert_eq(rc, 0, "call %ld: %s", n, arena_last_error());
			arena_share_info si;
			cr_assert_eq(arena_share_get(a, &si), 0);
			const int state = si.state;
			const char *why = si.why;
			if (!fired) {
				cr_assert_eq(state, mapper ? ARENA_SHARE_MAPPED : ARENA_SHARE_LOADED, "%s", why);
				arena_close(a);
				break;
			}
			failed++;
			cr_assert_eq(state, ARENA_SHARE_PRIVATE, "call %ld: state %d", n, state);
			cr_assert(!strncmp(why, "host share: ", 12) && !strchr(why, '\n'), "call %ld: %s", n, why);
			cr_assert_eq(run_steps(a, 1), want, "call %ld: the private copy's bytes", n);
			arena_close(a);
			cr_assert_eq(arena_alloc_live(), live, "call %ld: allocations left behind", n);
			cr_assert_eq(registries(), mapper, "call %ld (%s): registry files left behind", n, why);
			cr_assert_eq(maps_a_region(), mapper, "call %ld (%s): a mapping left behind", n, why);
		}
		cr_assert_geq(failed, mapper ? 4 : 8, "the injected failures reached the sharing path's calls (%d)", failed);
		if (first)
			arena_close(first);
		cr_assert_eq(registries(), 0);
		cr_assert_eq(maps_a_region(), 0);
	}
}

Test(share, a_checkpoint_is_refused)
{
	arena_open_options o = opts(1, 0);
	arena *a = NULL;
	cr_assert_eq(arena_open(ckpt, &o, &a), ARENA_E_USAGE);
	cr_assert(strstr(arena_last_error(), "arena image"), "%s", arena_last_error());
	cr_assert_eq(registries(), 0);
}

Test(share, a_process_that_exits_without_closing_leaves_no_registry)
{
	fflush(NULL);
	pid_t pid = fork();
	cr_assert(pid >= 0);
	if (!pid) {
		arena_open_options o = opts(1, 0);
		arena *a;
		if (arena_open(img, &o, &a) || registries() != 1)
			_exit(2);
		exit(0); /* no arena_close: the library's exit handler drops the line */
	}
	int st;
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child could not open (status %d)", st);
	cr_assert_eq(registries(), 0, "the registry outlived its only process");
}

/* Two holders exit at once (torchrun's processes after their last
 * barrier) while the registry's lock is taken: each exit waits for it and
 * drops its line, and the last removes the file. An exit that did not wait
 * left its line, and the file, behind. */
Test(share, processes_that_exit_together_leave_no_registry)
{
	int ready[2], go[2];
	cr_assert_eq(pipe(ready), 0);
	cr_assert_eq(pipe(go), 0);
	fflush(NULL);
	pid_t pid[2];
	for (int i = 0; i < 2; i++) {
		pid[i] = fork();
		cr_assert(pid[i] >= 0);
		if (!pid[i]) {
			close(ready[0]);
			close(go[1]);
			arena_open_options o = opts(1, 0);
			arena *a;
			if (arena_open(img, &o, &a) || registries() != 1)
				_exit(2);
			(void)!write(ready[1], "r", 1);
			char c;
			(void)!read(go[0], &c, 1); /* EOF: the parent let go */
			exit(0); /* no arena_close: the exit handler drops the line */
		}
	}
	close(ready[1]);
	close(go[0]);
	char c;
	for (int i = 0; i < 2; i++)
		cr_assert_eq(read(ready[0], &c, 1), 1, "a child could not open");
	DIR *d = opendir(shm);
	cr_assert(d);
	char lock[sizeof(shm) + 256] = "";
	for (struct dirent *e; (e = readdir(d));)
		if (strstr(e->d_name, ".lock"))
			snprintf(lock, sizeof(lock), "%s/%s", shm, e->d_name);
	closedir(d);
	int lfd = open(lock, O_RDONLY | O_CLOEXEC);
	cr_assert(lfd >= 0, "%s: %s", lock, strerror(errno));
	cr_assert_eq(flock(lfd, LOCK_EX), 0);
	close(go[1]); /* both exit now, the lock taken for 200 ms more */
	usleep(200 * 1000);
	flock(lfd, LOCK_UN);
	close(lfd);
	for (int i = 0; i < 2; i++) {
		int st;
		cr_assert_eq(waitpid(pid[i], &st, 0), pid[i]);
		cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child %d: status %d", i, st);
	}
	close(ready[0]);
	cr_assert_eq(registries(), 0, "the registry outlived the processes that held it");
}

Test(share, a_region_held_counts_as_host_memory_a_process_will_map)
{
	/* the budgets of a process that will map the region add its bytes
	 * back: the host's free memory no longer counts them */
	arena_image *im;
	cr_assert_eq(arena_img_open(img, &im), 0, "%s", arena_last_error());
	uint64_t id[2], other[2];
	arena__image_share_id(&im->hdr, id);
	arena_img_close(im);
	cr_assert_eq(arena_img_open(hb4, &im), 0, "%s", arena_last_error());
	arena__image_share_id(&im->hdr, other);
	arena_img_close(im);
	cr_assert(id[0] != other[0] || id[1] != other[1], "two images, two identities");
	cr_assert_eq(arena_host_share_image_bytes(id), 0, "no region yet");
	arena_open_options o = opts(1, 0);
	arena *a;
	cr_assert_eq(arena_open(img, &o, &a), 0, "%s", arena_last_error());
	const uint64_t held = arena_host_share_image_bytes(id);
	cr_assert_geq(held, a->m->host_len, "the region's bytes (%llu) are found (%llu host bytes)", (unsigned long long)held,
		      (unsigned long long)a->m->host_len);
	cr_assert_eq(arena_host_share_image_bytes(other), 0, "another image's are not");
	arena *b; /* a second open maps it, with the budgets widened by it */
	cr_assert_eq(arena_open(img, &o, &b), 0, "%s", arena_last_error());
	cr_assert(b->m->host_mapped);
	arena_close(b);
	arena_close(a);
	cr_assert_eq(arena_host_share_image_bytes(id), 0, "gone with its last process");
}

/* ---- what other processes and other users can do ------------------------------
 * The share folder, its registry files and the regions they name are
 * outside the process: each test below is something another process (of
 * this user, or as root of another user) can do to them, and what a
 * process that opens the image with sharing must still get: the image's
 * bytes, an open that returns, nothing of anyone else's written. */

#include <grp.h>
#include <sys/mman.h>

#define NOBODY 65534

/* The descriptor of process pid that is a region (a memfd named
 * "arena-..."), opened here with `flags` through /proc; -1 when it holds
 * none after waiting up to 10 s for one. */
static int open_region_of(pid_t pid, int flags)
{
	char p[64], q[320], link[256];
	for (int tries = 0; tries < 1000; tries++) {
		snprintf(p, sizeof(p), "/proc/%d/fd", (int)pid);
		DIR *d = opendir(p);
		cr_assert(d, "%s: %s", p, strerror(errno));
		int fd = -1;
		for (struct dirent *e; fd < 0 && (e = readdir(d));) {
			snprintf(q, sizeof(q), "%s/%s", p, e->d_name);
			ssize_t n = readlink(q, link, sizeof(link) - 1);
			if (n > 0 && (link[n] = 0, !strncmp(link, "/memfd:arena-", 13)))
				fd = open(q, flags | O_CLOEXEC);
		}
		closedir(d);
		if (fd >= 0)
			return fd;
		usleep(10 * 1000);
	}
	return -1;
}

/* The registry file's name that opening `path` with the test's options
 * makes (opened once here, then closed: the file goes with it). */
static void registry_name_of(const char *path, char *name, size_t n)
{
	arena_open_options o = opts(1, 0);
	arena *a;
	cr_assert_eq(arena_open(path, &o, &a), 0, "%s", arena_last_error());
	DIR *d = opendir(shm);
	cr_assert(d);
	name[0] = 0;
	for (struct dirent *e; (e = readdir(d));)
		if (!strncmp(e->d_name, "arena-", 6))
			snprintf(name, n, "%.*s", 100, e->d_name);
	closedir(d);
	arena_close(a);
	cr_assert(name[0], "opening with sharing made a registry file");
	cr_assert_eq(registries(), 0);
}

/* A child that opens `path` (sharing, the test's options), runs one step
 * and exits with 0 when the step's digest is `want` (and, when `state` is
 * not negative, its share's state is `state`), 2 when the digest differs,
 * 4 when the state does, 1 when the open or the step failed; the parent
 * gives it `limit_s` seconds (then kills it: 3). */
static int open_and_step_as(const char *path, uint64_t want, int state, double limit_s)
{
	fflush(NULL);
	pid_t pid = fork();
	cr_assert(pid >= 0);
	if (!pid) {
		arena_open_options o = opts(1, 0);
		arena *a;
		if (arena_open(path, &o, &a)) {
			fprintf(stderr, "open: %s\n", arena_last_error());
			_exit(1);
		}
		arena_share_info si;
		if (arena_share_get(a, &si))
			_exit(1);
		const uint64_t d = run_steps(a, 1);
		if (!d) {
			fprintf(stderr, "step: %s\n", arena_last_error());
			_exit(1);
		}
		arena_close(a);
		if (d != want)
			_exit(2);
		if (state >= 0 && si.state != state) {
			fprintf(stderr, "share state %d, not %d (%s)\n", si.state, state, si.why);
			_exit(4);
		}
		_exit(0);
	}
	const double t0 = now_s();
	int st = 0;
	while (waitpid(pid, &st, WNOHANG) == 0) {
		if (now_s() - t0 > limit_s) {
			kill(pid, SIGKILL);
			waitpid(pid, &st, 0);
			return 3;
		}
		usleep(20 * 1000);
	}
	if (WIFSIGNALED(st))
		return 100 + WTERMSIG(st);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}

static int open_and_step_in_child(const char *path, uint64_t want, double limit_s)
{
	return open_and_step_as(path, want, -1, limit_s);
}

static const char *child_outcome(int rc)
{
	switch (rc) {
	case 0: return "the image's bytes";
	case 1: return "a failed open or step";
	case 2: return "bytes that are not the image's";
	case 3: return "no return within the time limit (a hang)";
	case 4: return "the image's bytes, yet a share state other than the one expected";
	default: return "death by a signal";
	}
}

/* A loader (a child) publishes its region 1.5 s after it filled it; in
 * that time another process of the user writes `bytes` bytes of 0x41 into
 * the region at `at` (negative: from its end). Then another process opens
 * the image with sharing: it must compute with the image's bytes. */
static void region_written_before_publish(const char *path, long long at, size_t bytes)
{
	uint64_t host, full;
	const uint64_t want = reference_digest(path, 1, &host, &full);
	arena__share_publish_delay_ms = 1500;
	child c;
	spawn(&c, path, 1, 0, 1, 0);
	arena__share_publish_delay_ms = 0;
	parent_say(&c);
	int fd = open_region_of(c.pid, O_RDWR);
	cr_assert_geq(fd, 0, "the loader made a region");
	usleep(700 * 1000); /* filled by now, not published */
	struct stat st;
	cr_assert_eq(fstat(fd, &st), 0);
	char *junk = malloc(bytes);
	memset(junk, 0x41, bytes);
	const off_t where = at >= 0 ? (off_t)at : st.st_size + at;
	cr_assert_eq(pwrite(fd, junk, bytes, where), (ssize_t)bytes, "%s", strerror(errno));
	free(junk);
	close(fd);
	report r;
	parent_read(&c, &r); /* published */
	const int got = open_and_step_as(path, want, ARENA_SHARE_PRIVATE, 60);
	cr_assert_eq(got, 0, "a process that opened the region another process wrote into got %s", child_outcome(got));
	kill(c.pid, SIGKILL); /* its own steps would read what was written */
	parent_end(&c, -1);
}

Test(share, a_region_whose_bytes_are_not_the_image_is_not_used)
{
	region_written_before_publish(img, 4096, 4096); /* the first host block's first page */
}

Test(share, a_coded_region_whose_bytes_or_tables_are_not_the_image_are_not_used)
{
	slow_test();
	extra_cap = 2 * MiB;
	/* segments of 256 KiB: every coded copy is made again from the image */
	region_written_before_publish(hb4, 4096, 4096);  /* the first coded copy's first page */
	region_written_before_publish(hb4, -4096, 4096); /* the region's last page */
	/* a chunk's part whole (the default): whole chunks hashed in place */
	unsetenv("ARENA_WIRE_SEGMENT");
	arena__wire_seg_max = 0;
	region_written_before_publish(hb4, 4096, 4096);
	region_written_before_publish(hb4, 8 << 20, 4096); /* in the middle: a whole chunk's segment */
	region_written_before_publish(hb4, -4096, 4096);
}

/* With a chunk's part whole in one segment (the default), a chunk that
 * lies within a coded copy is checked in place: its segment is the
 * chunk's stored bytes; only the chunks blocks share are read again. */
Test(share, coded_whole_chunks_are_checked_in_place)
{
	extra_cap = 2 * MiB;
	unsetenv("ARENA_WIRE_SEGMENT");
	arena__wire_seg_max = 0;
	arena_open_options o = opts(1, 0);
	arena *a, *b, *ref;
	arena_open_options po = opts(0, 0);
	cr_assert_eq(arena_open(hb4, &po, &ref), 0, "%s", arena_last_error());
	const uint64_t want = run_steps(ref, 1);
	arena_close(ref);
	cr_assert_eq(arena_open(hb4, &o, &a), 0, "%s", arena_last_error());
	cr_assert_eq(arena_open(hb4, &o, &b), 0, "%s", arena_last_error());
	arena_share_info si;
	cr_assert_eq(arena_share_get(b, &si), 0);
	cr_assert_eq(si.state, ARENA_SHARE_MAPPED, "%s", si.why);
	uint64_t coded = 0;
	for (size_t k = 0; k < b->m->layout->n_blocks; k++)
		if (b->m->mem[k].wire)
			coded += b->m->mem[k].wire->stored;
	cr_assert_gt(coded, 0, "coded host copies");
	cr_assert_geq(si.checked_bytes, coded * 9 / 10, "checked %llu of %llu coded bytes",
		      (unsigned long long)si.checked_bytes, (unsigned long long)coded);
	cr_assert_lt(si.check_read_bytes, coded * 3 / 4, "read %llu bytes of the image to check %llu coded bytes",
		     (unsigned long long)si.check_read_bytes, (unsigned long long)coded);
	cr_assert_eq(run_steps(b, 1), want);
	cr_assert_eq(run_steps(a, 1), want);
	arena_close(b);
	arena_close(a);
}

Test(share, a_region_cannot_be_shrunk_under_a_process_that_maps_it)
{
	uint64_t host, full;
	const uint64_t want = reference_digest(img, 1, &host, &full);
	child c[2];
	spawn(&c[0], img, 1, 0, 1, 0);
	spawn(&c[1], img, 1, 0, 1, 0);
	report r;
	for (int i = 0; i < 2; i++) {
		parent_say(&c[i]);
		parent_read(&c[i], &r);
	}
	cr_assert_leq(r.file_bytes, full - host + MiB, "the second process mapped the region");
	int fd = open_region_of(c[0].pid, O_RDWR);
	cr_assert_geq(fd, 0);
	const int shrunk = ftruncate(fd, 4096) == 0;
	close(fd);
	parent_say(&c[1]);
	ssize_t n = read(c[1].from[0], &r, sizeof(r));
	cr_assert_eq(n, (ssize_t)sizeof(r), "the process that maps the region died when it was %s",
		     shrunk ? "shrunk" : "not even shrunk");
	cr_assert_eq(r.digest, want);
	cr_assert_not(shrunk, "the region could be shrunk");
	for (int i = 0; i < 2; i++)
		parent_end(&c[i], -1);
}

/* A process holds the lock of the registry file open will use, forever
 * (another process of the user, stuck; or, as root, a process of another
 * user's holding a file of that user's planted in the folder, which the
 * folder's modes let it reach): open must return, with the image's bytes. */
static void registry_locked_by_another(uid_t uid, mode_t mode)
{
	uint64_t host, full;
	const uint64_t want = reference_digest(img, 1, &host, &full);
	char name[128];
	registry_name_of(img, name, sizeof(name));
	const char *path = tmpdir_file(shm, name);
	if (uid != geteuid()) {
		int fd = open(path, O_RDWR | O_CREAT | O_EXCL, mode);
		cr_assert_geq(fd, 0);
		cr_assert_eq(fchmod(fd, mode), 0);
		cr_assert_eq(fchown(fd, uid, uid), 0);
		close(fd);
		cr_assert_eq(chmod(dir, 0755), 0);
		cr_assert_eq(chmod(shm, 0711), 0); /* the other user reaches the file, cannot write the folder */
	}
	int ready[2];
	cr_assert_eq(pipe(ready), 0);
	fflush(NULL);
	pid_t holder = fork();
	cr_assert(holder >= 0);
	if (!holder) {
		if (uid != geteuid() && (setgroups(0, NULL) || setgid(uid) || setuid(uid)))
			_exit(1);
		int fd = open(path, O_RDWR | O_CREAT, mode);
		if (fd < 0 || flock(fd, LOCK_EX))
			_exit(1);
		(void)!write(ready[1], "r", 1);
		for (;;)
			pause();
	}
	close(ready[1]);
	char c;
	cr_assert_eq(read(ready[0], &c, 1), 1, "the holder took the lock");
	close(ready[0]);
	const double t0 = now_s();
	const int got = open_and_step_in_child(img, want, 30);
	const double took = now_s() - t0;
	kill(holder, SIGKILL);
	waitpid(holder, NULL, 0);
	cr_assert_eq(got, 0, "with the registry locked by another process, open gave %s", child_outcome(got));
	struct stat st;
	cr_assert_eq(stat(path, &st), 0, "the other process's file is still there");
	cr_assert_eq(st.st_uid, uid);
	cr_assert_eq(st.st_size, 0, "nothing was written into the other process's file");
	if (uid != geteuid())
		cr_assert_lt(took, 4.0, "another user's file was waited on (%.1f s)", took);
	unlink(path);
}

Test(share, a_registry_locked_by_another_process_of_the_user_never_hangs_open)
{
	slow_test();
	registry_locked_by_another(geteuid(), 0600);
}

Test(share, a_registry_file_of_another_user_is_neither_used_nor_waited_on)
{
	if (geteuid() != 0)
		cr_skip_test("needs root: the test makes a file of another user (uid %d) in the share folder", NOBODY);
	registry_locked_by_another(NOBODY, 0666);
}

/* What open does with `name` in the share folder being something that is
 * not a registry file of this user's: it opens with a private copy, gives
 * the image's bytes, and leaves the thing as it was. */
static void planted(const char *what)
{
	uint64_t host, full;
	const uint64_t want = reference_digest(img, 1, &host, &full);
	char name[128];
	registry_name_of(img, name, sizeof(name));
	const char *path = tmpdir_file(shm, name);
	const char *precious = tmpdir_file(dir, "precious.txt");
	const char text[] = "a file of the user's that the registry must not write\n";
	FILE *f = fopen(precious, "w");
	cr_assert(f);
	fputs(text, f);
	fclose(f);
	if (!strcmp(what, "symlink"))
		cr_assert_eq(symlink(precious, path), 0);
	else if (!strcmp(what, "hard link"))
		cr_assert_eq(link(precious, path), 0);
	else if (!strcmp(what, "folder"))
		cr_assert_eq(mkdir(path, 0700), 0);
	else if (!strcmp(what, "fifo"))
		cr_assert_eq(mkfifo(path, 0600), 0);
	else if (!strcmp(what, "another user's file")) {
		int fd = open(path, O_RDWR | O_CREAT | O_EXCL, 0600);
		cr_assert_geq(fd, 0);
		cr_assert_eq(write(fd, text, sizeof(text) - 1), (ssize_t)sizeof(text) - 1);
		cr_assert_eq(fchown(fd, NOBODY, NOBODY), 0);
		close(fd);
	}
	const int got = open_and_step_in_child(img, want, 30);
	cr_assert_eq(got, 0, "with a %s at the registry's path, open gave %s", what, child_outcome(got));
	struct stat st;
	cr_assert_eq(lstat(path, &st), 0, "the %s is still there", what);
	if (!strcmp(what, "another user's file"))
		cr_assert_eq(st.st_uid, NOBODY);
	char buf[256] = {0};
	f = fopen(!strcmp(what, "another user's file") ? path : precious, "r");
	cr_assert(f);
	cr_assert(fgets(buf, sizeof(buf), f));
	fclose(f);
	cr_assert_str_eq(buf, text, "the %s's target was written", what);
	if (!strcmp(what, "folder"))
		rmdir(path);
	else
		unlink(path);
}

Test(share, a_symlink_at_the_registry_path_is_not_followed)
{
	planted("symlink");
}

Test(share, a_hard_link_at_the_registry_path_is_not_written)
{
	planted("hard link");
}

Test(share, a_folder_or_fifo_at_the_registry_path_gives_a_private_copy)
{
	planted("folder");
	planted("fifo");
}

Test(share, another_users_registry_file_is_left_alone)
{
	if (geteuid() != 0)
		cr_skip_test("needs root: the test makes a file of another user (uid %d) in the share folder", NOBODY);
	planted("another user's file");
}

/* As root: another user (nobody) opens the image with sharing in a share
 * folder every user can write (as /dev/shm), then writes into its region.
 * Root opens the same image with that folder: it must not compute with
 * the other user's bytes. */
Test(share, a_region_of_another_user_is_never_mapped)
{
	slow_test();
	if (geteuid() != 0)
		cr_skip_test("needs root: the test runs a process as another user (uid %d)", NOBODY);
	uint64_t host, full;
	const uint64_t want = reference_digest(img, 1, &host, &full);
	cr_assert_eq(chmod(dir, 0755), 0);
	cr_assert_eq(chmod(img, 0644), 0);
	cr_assert_eq(chmod(shm, 01777), 0);
	int ready[2];
	cr_assert_eq(pipe(ready), 0);
	fflush(NULL);
	pid_t other = fork();
	cr_assert(other >= 0);
	if (!other) {
		if (setgroups(0, NULL) || setgid(NOBODY) || setuid(NOBODY))
			_exit(1);
		arena_open_options o = opts(1, 0);
		arena *a;
		if (arena_open(img, &o, &a))
			_exit(1);
		(void)!write(ready[1], "r", 1);
		for (;;)
			pause();
	}
	close(ready[1]);
	char c;
	cr_assert_eq(read(ready[0], &c, 1), 1, "the other user's process opened the image");
	close(ready[0]);
	int fd = open_region_of(other, O_RDWR);
	if (fd >= 0) { /* its region, written as that user could */
		char junk[4096];
		memset(junk, 0x41, sizeof(junk));
		(void)!pwrite(fd, junk, sizeof(junk), 4096);
		close(fd);
	}
	const int got = open_and_step_in_child(img, want, 60);
	kill(other, SIGKILL);
	waitpid(other, NULL, 0);
	cr_assert_eq(got, 0, "root, opening an image another user shares, got %s", child_outcome(got));
}

/* A registry file whose line names a region with a header of any size
 * (here 1 TiB, and a memfd as large but sparse): the bytes open adds back
 * to its budgets are at most what the region holds. */
Test(share, a_region_header_claims_no_more_than_the_region_holds)
{
	arena_image *im;
	cr_assert_eq(arena_img_open(img, &im), 0, "%s", arena_last_error());
	uint64_t id[2];
	arena__image_share_id(&im->hdr, id);
	arena_img_close(im);
	const char name[] = "arena-0123456789abcdef0123456789abcdef";
	int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	cr_assert_geq(fd, 0);
	const uint64_t tib = 1ull << 40;
	cr_assert_eq(ftruncate(fd, (off_t)(4096 + tib)), 0);
	struct {
		char magic[8];
		uint32_t version, state;
		uint64_t key[2], image[2], len, meta;
	} hd = {.version = 1, .state = 1, .key = {1, 2}, .image = {id[0], id[1]}, .len = tib, .meta = 0};
	memcpy(hd.magic, "ARENASHR", 8);
	cr_assert_eq(pwrite(fd, &hd, sizeof(hd), 0), (ssize_t)sizeof(hd));
	(void)fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE);
	char line[160];
	FILE *f = fopen(tmpdir_file(shm, "arena-0123456789abcdef0123456789abcdef.lock"), "w");
	cr_assert(f);
	char stat_path[64], buf[1024];
	snprintf(stat_path, sizeof(stat_path), "/proc/%d/stat", (int)getpid());
	FILE *s = fopen(stat_path, "r");
	cr_assert(s && fgets(buf, sizeof(buf), s));
	fclose(s);
	const char *p = strrchr(buf, ')') + 2;
	for (int field = 3; field < 22; field++)
		p = strchr(p, ' ') + 1;
	snprintf(line, sizeof(line), "%d %d %llu\n", (int)getpid(), fd, strtoull(p, NULL, 10));
	fputs(line, f);
	fclose(f);
	const uint64_t claimed = arena_host_share_image_bytes(id);
	struct stat st;
	cr_assert_eq(fstat(fd, &st), 0);
	close(fd);
	unlink(tmpdir_file(shm, "arena-0123456789abcdef0123456789abcdef.lock"));
	cr_assert_leq(claimed, (uint64_t)st.st_blocks * 512,
		      "a region that holds %llu bytes counted as %llu bytes of host memory",
		      (unsigned long long)st.st_blocks * 512, (unsigned long long)claimed);
}

/* A share folder whose path with a registry's name is longer than a path
 * may be: the registry is the file it names, or there is none. */
Test(share, a_long_share_folder_is_never_cut_short)
{
	uint64_t host, full;
	const uint64_t want = reference_digest(img, 1, &host, &full);
	/* a folder of 4080 bytes' path, made a level at a time */
	char path[4200];
	int n = snprintf(path, sizeof(path), "%s", shm);
	int cwd = open(".", O_RDONLY | O_DIRECTORY);
	cr_assert_geq(cwd, 0);
	cr_assert_eq(chdir(shm), 0);
	while (n < 4080) {
		char part[256];
		const int k = 4080 - n - 1 < 200 ? 4080 - n - 1 : 200;
		memset(part, 'd', (size_t)k);
		part[k] = 0;
		cr_assert_eq(mkdir(part, 0700), 0, "%s", strerror(errno));
		cr_assert_eq(chdir(part), 0);
		n += snprintf(path + n, sizeof(path) - (size_t)n, "/%s", part);
	}
	cr_assert_eq(fchdir(cwd), 0);
	close(cwd);
	setenv("ARENA_SHARE_DIR", path, 1);
	child c;
	spawn(&c, img, 1, 0, 1, 0);
	setenv("ARENA_SHARE_DIR", shm, 1);
	report r;
	parent_say(&c);
	parent_read(&c, &r);
	/* while it holds the arena: no file under the folders but a registry of a whole name */
	char cmd[400];
	snprintf(cmd, sizeof(cmd),
		 "test -z \"$(find '%s' -type f ! -regextype posix-extended ! -regex '.*/arena-[0-9a-f]{32}[.]lock')\"", shm);
	const int cut = system(cmd) != 0;
	parent_say(&c);
	parent_read(&c, &r);
	parent_end(&c, 0);
	cr_assert_eq(r.digest, want);
	cr_assert_not(cut, "a file with a name cut short was made under the share folder");
}

/* Once published, nobody writes the region: a write through any
 * descriptor of it, or a new writable mapping, is refused by its seals,
 * and a process that maps it maps it read-only. */
Test(share, a_published_region_is_sealed_against_writes)
{
	arena_open_options o = opts(1, 0);
	arena *a, *b;
	cr_assert_eq(arena_open(img, &o, &a), 0, "%s", arena_last_error());
	cr_assert_eq(arena_open(img, &o, &b), 0, "%s", arena_last_error());
	arena_share_info si;
	cr_assert_eq(arena_share_get(b, &si), 0);
	cr_assert_eq(si.state, ARENA_SHARE_MAPPED);
	cr_assert_gt(si.check_s, 0);
	cr_assert_geq(si.checked_bytes, b->m->host_len * 9 / 10, "the region was checked (%llu of %llu bytes)",
		      (unsigned long long)si.checked_bytes, (unsigned long long)b->m->host_len);
	int fd = open_region_of(getpid(), O_RDWR);
	cr_assert_geq(fd, 0);
	const int seals = fcntl(fd, F_GET_SEALS);
	cr_assert_eq(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE),
		     F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE, "seals %#x", seals);
	char junk[4096];
	memset(junk, 0x41, sizeof(junk));
	cr_assert_eq(pwrite(fd, junk, sizeof(junk), 4096), -1, "a write into a published region");
	cr_assert_eq(errno, EPERM);
	struct stat st;
	cr_assert_eq(fstat(fd, &st), 0);
	cr_assert_eq(mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0), MAP_FAILED,
		     "a new writable mapping of a published region");
	cr_assert_neq(ftruncate(fd, 0), 0, "the region shrunk");
	close(fd);
	/* b's view of the region is read-only */
	FILE *f = fopen("/proc/self/maps", "r");
	cr_assert(f);
	char line[512];
	int shared_views = 0, writable = 0;
	while (fgets(line, sizeof(line), f))
		if (strstr(line, "memfd:arena-")) {
			shared_views++;
			writable += line[strcspn(line, " ") + 2] == 'w';
		}
	fclose(f);
	cr_assert_geq(shared_views, 2, "two views of the region in this process");
	cr_assert_eq(writable, 0, "a writable view of the region");
	arena_close(b);
	arena_close(a);
}

/* A loader that makes no progress (here: it waits before it publishes,
 * longer than a waiter's patience): the waiter gives up on it and opens
 * with a private copy, saying why, instead of waiting for ever. */
Test(share, a_stalled_loader_gives_the_waiter_a_private_copy)
{
	uint64_t host, full;
	const uint64_t want = reference_digest(img, 1, &host, &full);
	arena__share_publish_delay_ms = 20000;
	child c[2];
	spawn(&c[0], img, 1, 0, 1, 0);
	arena__share_publish_delay_ms = 0;
	arena__share_stall_ms = 1000;
	spawn(&c[1], img, 1, 0, 1, 300);
	arena__share_stall_ms = 30000;
	const double t0 = now_s();
	parent_say(&c[0]);
	parent_say(&c[1]);
	report r;
	parent_read(&c[1], &r);
	const double took = now_s() - t0;
	cr_assert_eq(r.state, ARENA_SHARE_PRIVATE, "the waiter's state %d", r.state);
	cr_assert(strstr(r.err, "made no progress"), "%s", r.err);
	cr_assert_lt(took, 10.0, "the waiter gave up after %.1f s", took);
	cr_assert_geq(r.file_bytes, full, "it loaded its own copy");
	parent_say(&c[1]);
	parent_read(&c[1], &r);
	cr_assert_eq(r.digest, want);
	parent_end(&c[1], 0);
	kill(c[0].pid, SIGKILL);
	parent_end(&c[0], -1);
}
