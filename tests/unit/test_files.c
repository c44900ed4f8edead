/* test_files.c - paths that are not plain files, and writers that die.
 *
 * input: every reader refuses what is not a regular file (FIFO, device,
 * folder, symlink loop) at once, with a class-INVALID error naming the path,
 * and never blocks on a FIFO.
 * outfile: a writer killed with SIGKILL mid-write leaves no temporary once
 * the next writer of the same output has run (O_TMPFILE: none ever has a
 * name; named temporaries: the next open removes those whose lock is free);
 * an output that is a folder or not a regular file is refused, and so is a
 * profile saved over the image it was measured on. */
#include <criterion/criterion.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "arena.h"
#include "../../common/outfile.h"
#include "../../formats/checkpoint.h"
#include "../../formats/image.h"
#include "../../formats/safetensors.h"
#include "../../convert/convert.h"
#include "testutil.h"

static char tmp[1024];

static void mk_tmp(void)
{
	tmpdir_make(tmp, sizeof(tmp), "files");
}

static pid_t writers[4]; /* started, not yet killed: killed at the end */

static void rm_tmp(void)
{
	for (size_t i = 0; i < sizeof(writers) / sizeof(*writers); i++)
		if (writers[i] > 0) {
			kill(writers[i], SIGKILL);
			waitpid(writers[i], NULL, 0);
		}
	arena__outfile_force_named(0);
	tmpdir_remove(tmp);
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
	const char *p = tmpdir_file(tmp, "f.safetensors");
	cr_assert_eq(mkfifo(p, 0644), 0);
	try_all_readers(p, "not a regular file");
	arena_ckpt *c = (arena_ckpt *)1;
	expect_not_file(arena_ckpt_open(p, &c), p, "arena_ckpt_open");
	cr_assert_null(c);
	const char *ix = tmpdir_file(tmp, "model.safetensors.index.json");
	cr_assert_eq(mkfifo(ix, 0644), 0);
	expect_not_file(arena_ckpt_open(ix, &c), ix, "arena_ckpt_open (index)");
	expect_not_file(arena_ckpt_open(tmp, &c), ix, "arena_ckpt_open (folder)");
}

Test(input, device_folder_loop)
{
	try_all_readers("/dev/null", "not a regular file");
	try_all_readers(tmp, "not a regular file");
	const char *a = tmpdir_file(tmp, "a"), *b = tmpdir_file(tmp, "b");
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
	const char *p = tmpdir_file(tmp, "none.safetensors");
	cr_assert_eq(arena_st_open(p, &f), ARENA_E_NOT_FOUND);
	cr_assert_eq(arena_img_open(p, &img), ARENA_E_NOT_FOUND);
	cr_assert_eq(arena_ckpt_open(p, &c), ARENA_E_NOT_FOUND);
}

/* --- output files -------------------------------------------------------------- */

TestSuite(outfile, .init = mk_tmp, .fini = rm_tmp, .timeout = 60);

static const char *target(void)
{
	return tmpdir_file(tmp, "out.bin");
}

/* Write and commit a small file at `path`. */
static int write_small(const char *path)
{
	arena_outfile *f;
	int rc = arena_outfile_open(path, &f);
	if (rc)
		return rc;
	if ((rc = arena_outfile_write(f, "arena", 5))) {
		arena_outfile_abort(f);
		return rc;
	}
	return arena_outfile_commit(f);
}

/* A child process that opens an output file for `path`, reserves 64 MiB,
 * writes 4 MiB and waits (for SIGKILL). Returns when it has written. */
static pid_t start_writer(const char *path)
{
	int p[2];
	cr_assert_eq(pipe(p), 0);
	pid_t pid = fork();
	cr_assert_neq(pid, -1);
	if (pid == 0) {
		close(p[0]);
		static uint8_t buf[1 << 20];
		memset(buf, 7, sizeof(buf));
		arena_outfile *f;
		if (arena_outfile_open(path, &f) || arena_outfile_reserve(f, 64u << 20))
			_exit(1);
		for (int i = 0; i < 4; i++)
			if (arena_outfile_write(f, buf, sizeof(buf)))
				_exit(1);
		if (write(p[1], "w", 1) != 1)
			_exit(1);
		for (;;)
			pause();
	}
	close(p[1]);
	for (size_t i = 0; i < sizeof(writers) / sizeof(*writers); i++)
		if (writers[i] <= 0) {
			writers[i] = pid;
			break;
		}
	char c;
	ssize_t n = read(p[0], &c, 1);
	close(p[0]);
	cr_assert_eq(n, 1, "the writer failed before it had written");
	return pid;
}

static void kill_writer(pid_t pid)
{
	int st;
	for (size_t i = 0; i < sizeof(writers) / sizeof(*writers); i++)
		if (writers[i] == pid)
			writers[i] = 0;
	cr_assert_eq(kill(pid, SIGKILL), 0);
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
}

Test(outfile, killed_writer_leaves_no_temporary)
{
	kill_writer(start_writer(target()));
	int fd = open(tmp, O_TMPFILE | O_RDWR, 0600);
	if (fd >= 0) { /* the filesystem has O_TMPFILE: the file never had a name */
		close(fd);
		cr_assert_eq(dir_entries(tmp), 0, "the killed writer's file has a name");
	}
	cr_assert_eq(write_small(target()), 0, "%s", arena_last_error());
	cr_assert_eq(dir_entries(tmp), 1, "a temporary of the killed writer is left beside the target");
	/* and again, over an existing target */
	kill_writer(start_writer(target()));
	cr_assert_eq(write_small(target()), 0, "%s", arena_last_error());
	cr_assert_eq(dir_entries(tmp), 1, "a temporary of the killed writer is left beside the target");
}

/* Where temporaries have names (no O_TMPFILE): the next writer removes the
 * dead ones of its target and no other file. */
Test(outfile, killed_named_writer_swept)
{
	arena__outfile_force_named(1);
	kill_writer(start_writer(target()));
	DIR *d = opendir(tmp);
	struct dirent *e;
	char dead[256] = "";
	while ((e = readdir(d)))
		if (e->d_name[0] == '.' && strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
			snprintf(dead, sizeof(dead), "%s", e->d_name);
	closedir(d);
	cr_assert_eq(dir_entries(tmp), 1, "the killed writer left no named temporary");
	cr_assert(*dead);
	/* the next writer removes it; its own (a live writer's) is kept */
	pid_t live = start_writer(target());
	struct stat st;
	cr_assert_eq(lstat(tmpdir_file(tmp, dead), &st), -1, "the dead writer's temporary is still there");
	cr_assert_eq(dir_entries(tmp), 1);
	/* and so are other files: another target's temporary, names not ours */
	const char *keep[] = {".other.bin.tmp-abcdef", ".out.bin.tmp-abcdefg", "out.bin.tmp-abcdef", ".out.bin.tmp-"};
	for (size_t i = 0; i < sizeof(keep) / sizeof(*keep); i++) {
		FILE *x = fopen(tmpdir_file(tmp, keep[i]), "w");
		cr_assert_not_null(x, "%s", keep[i]);
		fclose(x);
	}
	cr_assert_eq(dir_entries(tmp), 5);
	cr_assert_eq(write_small(target()), 0, "%s", arena_last_error());
	cr_assert_eq(dir_entries(tmp), 6, "the target, the live writer's temporary and the 4 others");
	kill_writer(live);
	cr_assert_eq(write_small(target()), 0, "%s", arena_last_error());
	cr_assert_eq(dir_entries(tmp), 5, "the dead writer's temporary is still there");
	cr_assert_eq(stat(target(), &st), 0);
	cr_assert_eq(st.st_size, 5);
}

/* Two outputs of one target open at once in one process: neither removes
 * the other's temporary; the last commit wins. */
Test(outfile, two_writers_one_target)
{
	for (int named = 0; named < 2; named++) {
		arena__outfile_force_named(named);
		arena_outfile *a, *b;
		cr_assert_eq(arena_outfile_open(target(), &a), 0, "%s", arena_last_error());
		cr_assert_eq(arena_outfile_write(a, "aaaa", 4), 0);
		cr_assert_eq(arena_outfile_open(target(), &b), 0, "%s", arena_last_error());
		cr_assert_eq(arena_outfile_write(b, "bb", 2), 0);
		cr_assert_eq(arena_outfile_commit(a), 0, "%s", arena_last_error());
		cr_assert_eq(arena_outfile_commit(b), 0, "%s", arena_last_error());
		struct stat st;
		cr_assert_eq(stat(target(), &st), 0);
		cr_assert_eq(st.st_size, 2);
		cr_assert_eq(dir_entries(tmp), 1);
	}
}

/* The content of the file at path (at most 63 bytes), "" when none. */
static const char *content(const char *path)
{
	static char buf[64];
	buf[0] = 0;
	FILE *f = fopen(path, "rb");
	if (f) {
		buf[fread(buf, 1, sizeof(buf) - 1, f)] = 0;
		fclose(f);
	}
	return buf;
}

/* ARENA_OUTFILE_NEW: a target that exists (a file, a symlink, dangling or
 * not) is OUTPUT_EXISTS at the open; one that appears while the output is
 * written is OUTPUT_EXISTS at commit and stays as it is; no temporary is
 * left. Without the flag, the same target is replaced. */
Test(outfile, new_output_never_replaces)
{
	for (int named = 0; named < 2; named++) {
		arena__outfile_force_named(named);
		arena_outfile *f = (arena_outfile *)1;
		cr_assert_eq(write_small(target()), 0, "%s", arena_last_error());
		cr_assert_eq(arena_outfile_create(target(), ARENA_OUTFILE_NEW, &f), ARENA_E(OUTPUT_EXISTS));
		cr_assert_null(f);
		cr_assert(strstr(arena_last_error(), target()) && strstr(arena_last_error(), "--force"), "%s",
			  arena_last_error());
		cr_assert_eq(arena_err_class(ARENA_E(OUTPUT_EXISTS)), ARENA_CLASS_USAGE);
		cr_assert_eq(arena_outfile_check_new(target()), ARENA_E(OUTPUT_EXISTS));
		const char *link = tmpdir_file(tmp, "dangling");
		cr_assert_eq(symlink("nowhere", link), 0);
		cr_assert_eq(arena_outfile_create(link, ARENA_OUTFILE_NEW, &f), ARENA_E(OUTPUT_EXISTS));
		cr_assert_eq(unlink(link), 0);
		/* another writer's file appears meanwhile */
		cr_assert_eq(unlink(target()), 0);
		cr_assert_eq(arena_outfile_check_new(target()), 0);
		cr_assert_eq(arena_outfile_create(target(), ARENA_OUTFILE_NEW, &f), 0, "%s", arena_last_error());
		cr_assert_eq(arena_outfile_write(f, "mine", 4), 0);
		FILE *other = fopen(target(), "wx");
		cr_assert_not_null(other);
		fputs("theirs", other);
		fclose(other);
		cr_assert_eq(arena_outfile_commit(f), ARENA_E(OUTPUT_EXISTS), "%s", arena_last_error());
		cr_assert_str_eq(content(target()), "theirs");
		cr_assert_eq(dir_entries(tmp), 1, "named %d: a temporary left", named);
		/* where none is, it is placed */
		cr_assert_eq(unlink(target()), 0);
		cr_assert_eq(arena_outfile_create(target(), ARENA_OUTFILE_NEW, &f), 0, "%s", arena_last_error());
		cr_assert_eq(arena_outfile_write(f, "mine", 4), 0);
		cr_assert_eq(arena_outfile_commit(f), 0, "%s", arena_last_error());
		cr_assert_str_eq(content(target()), "mine");
		/* without the flag: replaced */
		cr_assert_eq(arena_outfile_create(target(), 0, &f), 0, "%s", arena_last_error());
		cr_assert_eq(arena_outfile_write(f, "again", 5), 0);
		cr_assert_eq(arena_outfile_commit(f), 0, "%s", arena_last_error());
		cr_assert_str_eq(content(target()), "again");
		cr_assert_eq(dir_entries(tmp), 1);
		cr_assert_eq(unlink(target()), 0);
	}
}

Test(outfile, output_not_a_regular_file)
{
	arena_outfile *f = (arena_outfile *)1;
	const char *d = tmpdir_file(tmp, "od"), *p = tmpdir_file(tmp, "fifo");
	cr_assert_eq(mkdir(d, 0755), 0);
	cr_assert_eq(mkfifo(p, 0644), 0);
	const char *outs[] = {d, tmpdir_file(tmp, "od/"), p, "/dev/null"};
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
	cr_assert_eq(dir_entries(tmp), 2);
	cr_assert_eq(dir_entries(d), 0);
}

/* arena_profile_save (what bench stream --save-profile calls) does not
 * write over the image the arena was opened from, by any name. */
Test(outfile, profile_save_not_over_its_image)
{
	const char *in = fixture_path("tiny_flux.safetensors"), *img = tmpdir_file(tmp, "f.arena");
	cr_assert_eq(arena_convert_inputs(&in, 1, img, NULL, NULL), 0, "%s", arena_last_error());
	cr_assert_eq(symlink("f.arena", tmpdir_file(tmp, "l.arena")), 0);
	struct stat before, after;
	cr_assert_eq(stat(img, &before), 0);
	arena_open_options o = {.backend = "sim", .vram_cap = 64 << 20};
	arena *a;
	cr_assert_eq(arena_open(img, &o, &a), 0, "%s", arena_last_error());
	double cost[6] = {0, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3};
	cr_assert_eq(arena_block_count(a), 6);
	cr_assert_eq(arena_profile_set(a, cost, 6, 1e9, 0), 0, "%s", arena_last_error());
	cr_assert_eq(arena_profile_save(a, tmpdir_file(tmp, "p.json")), 0, "%s", arena_last_error());
	const char *outs[] = {img, tmpdir_file(tmp, "l.arena")};
	for (size_t i = 0; i < 2; i++) {
		int rc = arena_profile_save(a, outs[i]);
		cr_assert_eq(rc, ARENA_E(OUTPUT_IS_INPUT), "%s gave %s (%s)", outs[i], arena_err_name(rc),
			     arena_last_error());
		cr_assert(strstr(arena_last_error(), "is an input"), "%s", arena_last_error());
	}
	arena_close(a);
	cr_assert_eq(stat(img, &after), 0);
	cr_assert(before.st_ino == after.st_ino && before.st_size == after.st_size, "the image was replaced");
}
