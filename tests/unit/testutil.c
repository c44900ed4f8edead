/* testutil.c - helpers the unit tests share (testutil.h). */
#include <criterion/criterion.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "arena.h"
#include "testutil.h"

#define FIXTURES_DEFAULT "fixtures"

const char *fixture_path(const char *name)
{
	static char buf[8][4096];
	static unsigned next;
	const char *d = getenv("ARENA_FIXTURES_DIR");
	char *p = buf[next++ % 8];
	int n = snprintf(p, sizeof(buf[0]), "%s/%s", d && *d ? d : FIXTURES_DEFAULT, name);
	cr_assert(n > 0 && (size_t)n < sizeof(buf[0]), "fixture path for '%s': too long", name);
	return p;
}

void slow_test(void)
{
	const char *q = getenv("ARENA_TEST_QUICK");
	if (q && *q && strcmp(q, "0") != 0)
		cr_skip_test("slow: make test runs it");
}

const char *tmp_base(void)
{
	const char *b = getenv("TMPDIR");
	return b && *b ? b : "/tmp";
}

void tmpdir_make(char *dir, size_t size, const char *tag)
{
	int n = snprintf(dir, size, "%s/arena-%s-XXXXXX", tmp_base(), tag);
	cr_assert(n > 0 && (size_t)n < size, "temporary folder under '%s': path too long", tmp_base());
	cr_assert_not_null(mkdtemp(dir), "mkdtemp '%s': %s", dir, strerror(errno));
}

const char *tmpdir_file(const char *dir, const char *name)
{
	static char buf[8][4096];
	static unsigned next;
	char *p = buf[next++ % 8];
	int n = snprintf(p, sizeof(buf[0]), "%s/%s", dir, name);
	cr_assert(n > 0 && (size_t)n < sizeof(buf[0]), "path of '%s' under '%s': too long", name, dir);
	return p;
}

void copy_file(const char *src, const char *dst)
{
	FILE *in = fopen(src, "rb"), *out = fopen(dst, "wb");
	cr_assert(in && out, "%s -> %s: %s", src, dst, strerror(errno));
	char buf[65536];
	size_t n;
	while ((n = fread(buf, 1, sizeof(buf), in)) > 0)
		cr_assert_eq(fwrite(buf, 1, n, out), n);
	fclose(in);
	cr_assert_eq(fclose(out), 0);
}

int dir_entries(const char *dir)
{
	DIR *d = opendir(dir);
	cr_assert_not_null(d, "opendir '%s': %s", dir, strerror(errno));
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)))
		n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
	closedir(d);
	return n;
}

static int remove_one(const char *p, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st, (void)flag, (void)ftw;
	return remove(p);
}

void tmpdir_remove(const char *dir)
{
	if (dir && *dir)
		nftw(dir, remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

void expect_block_tensors(struct arena *a, struct arena *ref, size_t i, const void *d, int step)
{
	for (size_t t = 0; t < arena_tensor_count(a); t++) {
		arena_tensor_info ti, tr;
		cr_assert_eq(arena_tensor_get(a, t, &ti), 0);
		if (ti.block != i)
			continue;
		cr_assert_eq(arena_tensor_get(ref, t, &tr), 0);
		cr_assert_str_eq(ti.name, tr.name);
		for (uint32_t c = 0; c < ti.n_components; c++) {
			cr_assert_leq(ti.component[c].offset + ti.component[c].bytes, arena_block_bytes(a, i));
			cr_assert(memcmp((const uint8_t *)d + ti.component[c].offset, tr.component[c].device,
					 ti.component[c].bytes) == 0,
				  "step %d: %s in block %s differs from the image", step, ti.name, arena_block_name(a, i));
		}
	}
}

void steps_over_blocks(struct arena *a, struct arena *ref, int steps, int train, struct arena_step_info *sum)
{
	arena_step_info all = {0};
	const size_t n = arena_block_count(a);
	for (int step = 0; step < steps; step++) {
		cr_assert_eq(arena_step_begin(a), 0, "%s", arena_last_error());
		for (size_t k = 0; k < (train ? 2 * n : n); k++) {
			const size_t i = k < n ? k : 2 * n - 1 - k;
			void *d;
			cr_assert_eq(arena_block_acquire(a, i, NULL, &d), 0, "%s", arena_last_error());
			expect_block_tensors(a, ref, i, d, step);
			cr_assert_eq(arena_block_release(a, i, NULL), 0, "%s", arena_last_error());
		}
		cr_assert_eq(arena_step_end(a), 0, "%s", arena_last_error());
		arena_step_info si;
		cr_assert_eq(arena_step_get(a, (uint64_t)step, &si), 0);
		all.streamed_bytes += si.streamed_bytes;
		all.moved_bytes += si.moved_bytes;
		all.disk_bytes += si.disk_bytes;
	}
	if (sum)
		*sum = all;
}

int try_step_over_blocks(struct arena *a, struct arena *ref)
{
	int rc = arena_step_begin(a);
	void *d;
	for (size_t i = 0; !rc && i < arena_block_count(a); i++)
		if (!(rc = arena_block_acquire(a, i, NULL, &d))) {
			if (ref)
				expect_block_tensors(a, ref, i, d, 0);
			rc = arena_block_release(a, i, NULL);
		}
	return rc ? rc : arena_step_end(a);
}

void flip_a_byte_a_page(const char *path, long long first, long long keep_tail)
{
	int fd = open(path, O_RDWR);
	cr_assert_geq(fd, 0, "%s", path);
	const off_t size = lseek(fd, 0, SEEK_END);
	for (off_t at = (off_t)first; at < size - (off_t)keep_tail; at += 4096) {
		unsigned char c;
		cr_assert_eq(pread(fd, &c, 1, at), 1);
		c ^= 0x5a;
		cr_assert_eq(pwrite(fd, &c, 1, at), 1);
	}
	close(fd);
}
