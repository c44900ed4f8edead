/* test_shrink.c - an input that shrinks after it was opened (rewritten in
 * place, cut by another program) is an error, never a SIGBUS: the reads
 * through a guarded mapping (common/mapguard.h), and every public call
 * that reads a file with the file truncated at the point between its open
 * and its reads (arena_fault_opened) to lengths inside the header, at the
 * end of the header and inside the data: inspect, convert (plain, and
 * quantized: the bytes made through the mapping, and the whole-tensor
 * scan), arena_open of a checkpoint (plain and quantized) and of an image,
 * verify. The error is INPUT_CHANGED (or the format's own error for a
 * length it can tell), class INVALID, and a convert leaves no output. */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "arena.h"
#include "../../common/io.h"
#include "../../common/mapguard.h"
#include "testutil.h"

static char dir[256];

static void setup(void)
{
	tmpdir_make(dir, sizeof(dir), "test-shrink");
}

static void teardown(void)
{
	arena_fault_opened(NULL, NULL);
	tmpdir_remove(dir);
}

TestSuite(shrink, .init = setup, .fini = teardown);

/* A new file of `len` zero bytes in the test's folder, mapped read-only
 * (*fd open read-write, to cut it). */
static unsigned char *map_new_file(const char *name, off_t len, int *fd)
{
	*fd = open(tmpdir_file(dir, name), O_RDWR | O_CREAT | O_TRUNC, 0644);
	cr_assert_geq(*fd, 0);
	cr_assert_eq(ftruncate(*fd, len), 0);
	unsigned char *m = mmap(NULL, (size_t)len, PROT_READ, MAP_SHARED, *fd, 0);
	cr_assert_neq(m, MAP_FAILED);
	return m;
}

static off_t file_size(const char *p)
{
	struct stat st;
	cr_assert_eq(stat(p, &st), 0, "%s: %s", p, strerror(errno));
	return st.st_size;
}

/* ---- the guard itself ---------------------------------------------------- */

typedef struct sum_ctx {
	const volatile unsigned char *p;
	size_t n;
	unsigned long sum;
} sum_ctx;

static int sum_bytes(void *c)
{
	sum_ctx *s = c;
	for (size_t i = 0; i < s->n; i += 4096)
		s->sum += s->p[i];
	return 7;
}

static int nested(void *c)
{
	const arena_map_region *inner = c;
	sum_ctx s = {.p = inner->base, .n = (size_t)inner->len};
	return arena_map_guard_run(inner, 1, sum_bytes, &s) == ARENA_E(INPUT_CHANGED) ? 11 : 0;
}

Test(shrink, a_fault_in_a_guarded_mapping_returns_input_changed)
{
	int fd;
	unsigned char *m = map_new_file("m.bin", 16 * 4096, &fd);
	arena_map_region r = {m, 16 * 4096, "m.bin"};
	sum_ctx s = {.p = m, .n = 16 * 4096};
	/* whole: fn's result */
	cr_assert_eq(arena_map_guard_run(&r, 1, sum_bytes, &s), 7);
	cr_assert_eq(ftruncate(fd, 4 * 4096), 0);
	/* cut: the pages left read, the others an error naming the file, and
	 * again (the handler stays, the mask is restored) */
	s = (sum_ctx){.p = m, .n = 4 * 4096};
	cr_assert_eq(arena_map_guard_run(&r, 1, sum_bytes, &s), 7);
	for (int k = 0; k < 3; k++) {
		s = (sum_ctx){.p = m, .n = 16 * 4096};
		cr_assert_eq(arena_map_guard_run(&r, 1, sum_bytes, &s), ARENA_E(INPUT_CHANGED), "try %d", k);
		cr_assert(strstr(arena_last_error(), "m.bin: file changed while reading"), "%s", arena_last_error());
		cr_assert_eq(arena_err_class(ARENA_E(INPUT_CHANGED)), ARENA_CLASS_INVALID);
	}
	/* nested: the inner guard covers the address and returns; the outer one
	 * goes on */
	arena_map_region other = {&r, sizeof(r), "other"};
	cr_assert_eq(arena_map_guard_run(&other, 1, nested, &r), 11);
	/* the second of two regions: its label */
	arena_map_region two[2] = {other, r};
	s = (sum_ctx){.p = m, .n = 16 * 4096};
	cr_assert_eq(arena_map_guard_run(two, 2, sum_bytes, &s), ARENA_E(INPUT_CHANGED));
	cr_assert(strstr(arena_last_error(), "m.bin:"), "%s", arena_last_error());
	munmap(m, 16 * 4096);
	close(fd);
}

/* A SIGBUS outside every guarded region still ends the process, as it would
 * without arena (and is not taken for a changed file): it goes on to the
 * action there before the guard's handler, here the default (which ASan's
 * own handler would otherwise be). */
Test(shrink, a_fault_outside_the_guarded_regions_is_not_caught)
{
	int fd;
	unsigned char *m = map_new_file("u.bin", 8 * 4096, &fd);
	cr_assert_eq(ftruncate(fd, 4096), 0);
	fflush(NULL);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		signal(SIGBUS, SIG_DFL);
		static unsigned char other[4096];
		arena_map_region r = {other, sizeof(other), "other"};
		sum_ctx s = {.p = m, .n = 8 * 4096};
		int rc = arena_map_guard_run(&r, 1, sum_bytes, &s);
		_exit(rc == ARENA_E(INPUT_CHANGED) ? 3 : 0);
	}
	int status;
	cr_assert_eq(waitpid(pid, &status, 0), pid);
	cr_assert(!(WIFEXITED(status) && (WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == 3)),
		  "a fault outside the guarded regions came back (exit %d)", WEXITSTATUS(status));
	cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGBUS, "status %#x", status);
	munmap(m, 8 * 4096);
	close(fd);
}

/* ---- every reader, the file cut between its open and its reads ----------- */

typedef struct cut {
	const char *name; /* the file's base name: only it is cut */
	off_t to;         /* the length it is cut to; < 0: opens counted only */
	int at, seen;     /* it is cut at its at-th open (from 1); opens so far */
} cut;

static void cut_on_open(int fd, const char *path, void *ctx)
{
	(void)fd;
	cut *c = ctx;
	const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
	if (strcmp(base, c->name) || ++c->seen != c->at || c->to < 0)
		return;
	cr_assert_eq(truncate(path, c->to), 0, "%s: %s", path, strerror(errno));
}

/* rc is an error of class INVALID (INPUT_CHANGED, or what the format says
 * of a file that short), with one line naming the file. */
static void expect_changed(int rc, const char *what, off_t to)
{
	cr_assert_neq(rc, 0, "%s, cut to %lld: no error", what, (long long)to);
	cr_assert_eq(arena_err_class(rc), ARENA_CLASS_INVALID, "%s, cut to %lld: %s: %s", what, (long long)to,
		     arena_err_name(rc), arena_last_error());
	cr_assert(strchr(arena_last_error(), '\n') == NULL, "%s", arena_last_error());
}

static uint64_t header_end(const char *st)
{
	FILE *f = fopen(st, "rb");
	cr_assert_not_null(f);
	unsigned char b[8];
	cr_assert_eq(fread(b, 1, 8, f), 8);
	fclose(f);
	uint64_t n = 0;
	for (int i = 7; i >= 0; i--)
		n = n << 8 | b[i];
	return 8 + n;
}

/* A call that reads the file `name`: setup (a fresh copy), the call, then
 * the checks of its result. */
typedef struct reader {
	const char *what;
	int (*call)(struct reader *r);
	const char *path, *out;
	const char *quant;
	int may_pass; /* 1: the call may succeed (it reads none of the bytes cut) */
	int files;    /* what the test's folder holds between calls */
} reader;

static int do_inspect(reader *r)
{
	char *json = NULL;
	int rc = arena_inspect(r->path, &json);
	arena_string_free(json);
	return rc;
}

static int do_convert(reader *r)
{
	arena_convert_options co = {.quant = r->quant, .chunk_size = 64 << 10, .threads = 2};
	int rc = arena_convert(&r->path, 1, r->out, &co, NULL);
	cr_assert(rc == 0 || access(r->out, F_OK) == -1, "%s: a failed convert left %s", r->what, r->out);
	unlink(r->out);
	return rc;
}

static int do_open(reader *r)
{
	arena_open_options oo = {.backend = "sim", .quant = r->quant, .flags = ARENA_OPEN_NO_LEARN};
	arena *a = NULL;
	int rc = arena_open(r->path, &oo, &a);
	cr_assert(rc == 0 || a == NULL);
	arena_close(a);
	return rc;
}

static int do_verify(reader *r)
{
	arena_verify_info vi;
	return arena_verify(r->path, NULL, &vi);
}

/* r with its file (a copy of src) cut to each of lens at each of the opens
 * the call makes of it. Every failure is of class INVALID, one line, and
 * leaves no file; for each length below must_fail_below (all of them
 * unless r->may_pass) a cut at one open at least fails (a later open may
 * come once the bytes are read: the image's for a disk tier that has no
 * block to read). Returns how many runs failed with INPUT_CHANGED. */
static int cut_everywhere(reader *r, const char *src, const off_t *lens, size_t n, off_t must_fail_below)
{
	const char *base = strrchr(r->path, '/') + 1;
	cut c = {base, -1, 0, 0};
	copy_file(src, r->path);
	arena_fault_opened(cut_on_open, &c);
	int rc = r->call(r);
	arena_fault_opened(NULL, NULL);
	cr_assert_eq(rc, 0, "%s, whole: %s", r->what, arena_last_error());
	const int opens = c.seen;
	cr_assert_gt(opens, 0, "%s never opened %s", r->what, base);
	int changed = 0;
	for (size_t k = 0; k < n; k++) {
		int failed = 0;
		for (int at = 1; at <= opens; at++) {
			c = (cut){base, lens[k], at, 0};
			copy_file(src, r->path);
			arena_fault_opened(cut_on_open, &c);
			rc = r->call(r);
			arena_fault_opened(NULL, NULL);
			if (!rc)
				continue;
			failed++;
			expect_changed(rc, r->what, lens[k]);
			changed += rc == ARENA_E(INPUT_CHANGED);
			cr_assert_eq(dir_entries(dir), r->files, "%s left a file", r->what);
		}
		cr_assert(failed || (r->may_pass && lens[k] >= must_fail_below),
			  "%s, cut to %lld at any of its %d opens: no error", r->what, (long long)lens[k], opens);
	}
	return changed;
}

Test(shrink, a_checkpoint_cut_after_its_open)
{
	const char *src = fixture_path("tiny_flux.safetensors");
	const off_t size = file_size(src);
	const off_t hdr = (off_t)header_end(src);
	const off_t lens[] = {0, 4, hdr / 2, hdr, hdr + 1, hdr + (size - hdr) / 2, size - 1};
	const size_t n = sizeof(lens) / sizeof(lens[0]);
	char st[512], out[512];
	snprintf(st, sizeof(st), "%s", tmpdir_file(dir, "m.safetensors"));
	snprintf(out, sizeof(out), "%s", tmpdir_file(dir, "m.arena"));
	reader insp = {"inspect", do_inspect, st, NULL, NULL, 1, 1};
	cr_assert_gt(cut_everywhere(&insp, src, lens, n, hdr), 0, "inspect never met the file changed");
	const char *quants[] = {NULL, "fp8-e4m3-row", "fp8-e4m3-tensor", "int8-row"};
	for (size_t q = 0; q < sizeof(quants) / sizeof(quants[0]); q++) {
		char what[64];
		snprintf(what, sizeof(what), "convert --quant %s", quants[q] ? quants[q] : "none");
		reader conv = {what, do_convert, st, out, quants[q], 0, 1};
		cr_assert_gt(cut_everywhere(&conv, src, lens, n, size), 0, "%s never met the file changed", what);
		snprintf(what, sizeof(what), "open quant=%s", quants[q] ? quants[q] : "none");
		reader op = {what, do_open, st, NULL, quants[q], 0, 1};
		cr_assert_gt(cut_everywhere(&op, src, lens, n, size), 0, "%s never met the file changed", what);
	}
}

/* Two blocks of one BF16 weight each (256 KiB), every byte quantized with
 * --quant: all of them made through the mapping. */
static void write_blocks(const char *path)
{
	char hdr[512];
	int n = snprintf(hdr, sizeof(hdr),
			 "{\"transformer_blocks.0.ff.weight\":{\"dtype\":\"BF16\",\"shape\":[256,512],\"data_offsets\":[0,262144]},"
			 "\"transformer_blocks.1.ff.weight\":{\"dtype\":\"BF16\",\"shape\":[256,512],\"data_offsets\":[262144,524288]}}");
	while (n % 8)
		hdr[n++] = ' ';
	FILE *f = fopen(path, "wb");
	cr_assert_not_null(f);
	unsigned char len[8];
	for (int i = 0; i < 8; i++)
		len[i] = (unsigned char)((uint64_t)n >> (8 * i));
	cr_assert_eq(fwrite(len, 1, 8, f), 8);
	cr_assert_eq(fwrite(hdr, 1, (size_t)n, f), (size_t)n);
	for (uint32_t i = 0; i < 262144; i++) { /* BF16 values 1.0 .. 2.0 */
		const uint16_t v = (uint16_t)(0x3f80 + i % 128);
		cr_assert_eq(fwrite(&v, 2, 1, f), 1);
	}
	cr_assert_eq(fclose(f), 0);
}

Test(shrink, quantized_weights_cut_after_their_open)
{
	char src[512], st[512], out[512];
	snprintf(src, sizeof(src), "%s", tmpdir_file(dir, "blocks.st"));
	snprintf(st, sizeof(st), "%s", tmpdir_file(dir, "m.safetensors"));
	snprintf(out, sizeof(out), "%s", tmpdir_file(dir, "m.arena"));
	write_blocks(src);
	const off_t size = file_size(src);
	const off_t hdr = (off_t)header_end(src);
	/* the data's start, a page into it, the second weight, its last page
	 * (read as zeros past the end: the size is checked after), one byte */
	const off_t lens[] = {hdr, hdr + 4096, hdr + 262144, size - 3000, size - 1};
	const size_t n = sizeof(lens) / sizeof(lens[0]);
	const char *quants[] = {"fp8-e4m3-row", "fp8-e4m3-tensor", "int8-row", "int4-g64"};
	for (size_t q = 0; q < sizeof(quants) / sizeof(quants[0]); q++) {
		char what[64];
		snprintf(what, sizeof(what), "convert --quant %s", quants[q]);
		reader conv = {what, do_convert, st, out, quants[q], 0, 2};
		cr_assert_gt(cut_everywhere(&conv, src, lens, n, size), 0, "%s never met the file changed", what);
		snprintf(what, sizeof(what), "open quant=%s", quants[q]);
		reader op = {what, do_open, st, NULL, quants[q], 0, 2};
		cr_assert_gt(cut_everywhere(&op, src, lens, n, size), 0, "%s never met the file changed", what);
	}
}

Test(shrink, an_image_cut_after_its_open)
{
	const char *src = fixture_path("tiny_flux.safetensors");
	char img[512], cp[512];
	snprintf(img, sizeof(img), "%s", tmpdir_file(dir, "ref.arena"));
	snprintf(cp, sizeof(cp), "%s", tmpdir_file(dir, "c.arena"));
	arena_convert_options co = {.chunk_size = 64 << 10};
	cr_assert_eq(arena_convert(&src, 1, img, &co, NULL), 0, "%s", arena_last_error());
	const off_t size = file_size(img);
	const off_t lens[] = {0, 100, 4096, 8192, size / 2, size - 1};
	const size_t n = sizeof(lens) / sizeof(lens[0]);
	reader op = {"open", do_open, cp, NULL, NULL, 0, 2};
	cr_assert_gt(cut_everywhere(&op, img, lens, n, size), 0, "open never met the file changed");
	reader ver = {"verify", do_verify, cp, NULL, NULL, 0, 2};
	cr_assert_gt(cut_everywhere(&ver, img, lens, n, size), 0, "verify never met the file changed");
	reader insp = {"inspect", do_inspect, cp, NULL, NULL, 1, 2};
	cut_everywhere(&insp, img, lens, n, 0);
}
