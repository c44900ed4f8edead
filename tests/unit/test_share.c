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

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
#include "../../loader/convert.h"
#include "../../loader/open.h"
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
	char err[200];
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
	report r = {.opened = now_s(), .file_bytes = st.file_bytes, .host_bytes = p.host_bytes};
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
		if (share && i)
			cr_assert_leq(r.file_bytes, full_read - host_bytes + MiB,
				     "process %d of %d read %llu bytes of the image: it loaded the host copies again", i, n,
				     (unsigned long long)r.file_bytes);
		else
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
	 * sharing: its growth less one copy), plus 1 MiB a process of slack. */
	const uint64_t own = u > n * host ? (u - n * host) / (uint64_t)n : 0;
	cr_log_info("share: N=%d host copies %.1f MiB: PSS growth, summed: shared %.1f MiB, not shared %.1f MiB", n,
		    host / (double)MiB, s / (double)MiB, u / (double)MiB);
	cr_assert_geq(u, (uint64_t)n * host * 9 / 10, "not shared: %d copies of %llu bytes, PSS grew %llu", n,
		      (unsigned long long)host, (unsigned long long)u);
	cr_assert_leq(s, host * 11 / 10 + (uint64_t)n * (own + MiB),
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

Test(share, failures_of_the_sharing_path_leave_nothing_behind)
{
	arena_open_options o = opts(1, 0);
	/* the loader's path, then a mapper's (a first arena holds the region) */
	for (int mapper = 0; mapper < 2; mapper++) {
		arena *first = NULL;
		if (mapper)
			cr_assert_eq(arena_open(img, &o, &first), 0, "%s", arena_last_error());
		int failed = 0;
		for (long n = 1; n < 64; n++) {
			const long live = arena_alloc_live();
			arena *a = NULL;
			arena_fault_share(n);
			int rc = arena_open(img, &o, &a);
			const int fired = arena_fault_share_fired();
			arena_fault_share(0);
			if (!fired) {
				cr_assert_eq(rc, 0, "%s", arena_last_error());
				arena_close(a);
				break;
			}
			failed++;
			cr_assert(rc == ARENA_E_IO || rc == ARENA_E_NOMEM, "call %ld: %s (%d)", n, arena_last_error(), rc);
			cr_assert_null(a);
			const char *msg = arena_last_error();
			cr_assert(strstr(msg, "host share: ") && !strchr(msg, '\n'), "call %ld: %s", n, msg);
			cr_assert_eq(arena_alloc_live(), live, "call %ld: allocations left behind", n);
			cr_assert_eq(registries(), mapper, "call %ld: registry files left behind", n);
			cr_assert_eq(maps_a_region(), mapper, "call %ld: a mapping left behind", n);
		}
		cr_assert_geq(failed, mapper ? 2 : 5, "the injected failures reached the sharing path's calls (%d)", failed);
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
