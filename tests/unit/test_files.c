/* test_files.c - paths that are not plain files.
 *
 * input: every reader refuses what is not a regular file (FIFO, device,
 * folder, symlink loop) at once, with a class-INVALID error naming the path,
 * and never blocks on a FIFO.
 * outfile: an output that is a folder or not a regular file is refused. */
#include <criterion/criterion.h>

#include <dirent.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "arena.h"
#include "../../common/outfile.h"
#include "../../formats/checkpoint.h"
#include "../../formats/image.h"
#include "../../formats/safetensors.h"

static char tmp[1024];

static void mk_tmp(void)
{
	const char *base = getenv("TMPDIR");
	snprintf(tmp, sizeof(tmp), "%s/arena-files-XXXXXX", base && *base ? base : "/tmp");
	cr_assert_not_null(mkdtemp(tmp));
}

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st, (void)flag, (void)ftw;
	return remove(p);
}

static void rm_tmp(void)
{
	if (tmp[0])
		nftw(tmp, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static const char *in_tmp(const char *name)
{
	static char buf[4][2048];
	static unsigned next;
	char *p = buf[next++ % 4];
	snprintf(p, sizeof(buf[0]), "%s/%s", tmp, name);
	return p;
}

/* --- inputs ------------------------------------------------------------------ */

TestSuite(input, .init = mk_tmp, .fini = rm_tmp, .timeout = 20);

/* rc is the error for "not a readable regular file", its message names path. */
static void expect_not_file(int rc, const char *path, const char *what)
{
	cr_assert_eq(arena_err_class(rc), ARENA_CLASS_INVALID, "%s: %s gave %s (%s), want class INVALID", path, what,
		     arena_err_name(rc), arena_last_error());
	cr_assert(strstr(arena_last_error(), path), "%s: %s", what, arena_last_error());
}

static void try_all_readers(const char *path, const char *rule)
{
	arena_st_file *f = (arena_st_file *)1;
	int rc = arena_st_open(path, &f);
	expect_not_file(rc, path, "arena_st_open");
	cr_assert_null(f);
	if (rule)
		cr_assert(strstr(arena_last_error(), rule), "%s", arena_last_error());
	arena_image *img = (arena_image *)1;
	rc = arena_img_open(path, &img);
	expect_not_file(rc, path, "arena_img_open");
	cr_assert_null(img);
	if (rule)
		cr_assert(strstr(arena_last_error(), rule), "%s", arena_last_error());
	cr_assert_eq(arena_img_sniff(path), 0);
}

Test(input, fifo)
{
	const char *p = in_tmp("f.safetensors");
	cr_assert_eq(mkfifo(p, 0644), 0);
	try_all_readers(p, "not a regular file");
	arena_ckpt *c = (arena_ckpt *)1;
	expect_not_file(arena_ckpt_open(p, &c), p, "arena_ckpt_open");
	cr_assert_null(c);
	const char *ix = in_tmp("model.safetensors.index.json");
	cr_assert_eq(mkfifo(ix, 0644), 0);
	expect_not_file(arena_ckpt_open(ix, &c), ix, "arena_ckpt_open (index)");
	expect_not_file(arena_ckpt_open(tmp, &c), ix, "arena_ckpt_open (folder)");
}

Test(input, device_folder_loop)
{
	try_all_readers("/dev/null", "not a regular file");
	try_all_readers(tmp, "not a regular file");
	const char *a = in_tmp("a"), *b = in_tmp("b");
	cr_assert_eq(symlink("b", a), 0);
	cr_assert_eq(symlink("a", b), 0);
	try_all_readers(a, NULL);
	arena_ckpt *c;
	expect_not_file(arena_ckpt_open(a, &c), a, "arena_ckpt_open");
}

Test(input, missing_is_not_found)
{
	arena_st_file *f;
	arena_image *img;
	arena_ckpt *c;
	const char *p = in_tmp("none.safetensors");
	cr_assert_eq(arena_st_open(p, &f), ARENA_E_NOT_FOUND);
	cr_assert_eq(arena_img_open(p, &img), ARENA_E_NOT_FOUND);
	cr_assert_eq(arena_ckpt_open(p, &c), ARENA_E_NOT_FOUND);
}

/* Entries in a folder, "." and ".." aside. */
static int count_entries(const char *dir)
{
	DIR *d = opendir(dir);
	cr_assert_not_null(d, "%s", dir);
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)))
		n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
	closedir(d);
	return n;
}

/* --- output files -------------------------------------------------------------- */

TestSuite(outfile, .init = mk_tmp, .fini = rm_tmp, .timeout = 60);

Test(outfile, output_not_a_regular_file)
{
	arena_outfile *f = (arena_outfile *)1;
	const char *d = in_tmp("od"), *p = in_tmp("fifo");
	cr_assert_eq(mkdir(d, 0755), 0);
	cr_assert_eq(mkfifo(p, 0644), 0);
	const char *outs[] = {d, in_tmp("od/"), p, "/dev/null"};
	for (size_t i = 0; i < sizeof(outs) / sizeof(*outs); i++) {
		int rc = arena_outfile_open(outs[i], &f);
		cr_assert_eq(arena_err_class(rc), ARENA_CLASS_USAGE, "%s gave %s (%s)", outs[i], arena_err_name(rc),
			     arena_last_error());
		cr_assert_null(f);
		cr_assert(strstr(arena_last_error(), outs[i]), "%s", arena_last_error());
	}
	struct stat st;
	cr_assert_eq(stat(p, &st), 0);
	cr_assert(S_ISFIFO(st.st_mode));
	cr_assert_eq(count_entries(tmp), 2);
	cr_assert_eq(count_entries(d), 0);
}
