/* test_fault.c - injected failures: allocation N fails for N = 1, 2, ...
 * until an open runs without reaching N; every failing N must end in
 * ARENA_E_NOMEM, leak nothing (memory: LeakSanitizer in the ASan run of
 * `make test`; file descriptors: counted here), and leave no output behind.
 * Write failures in output files end in ARENA_E_IO and leave no temporary. */
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
#include "../../common/alloc.h"
#include "../../common/outfile.h"
#include "../../formats/checkpoint.h"
#include "../../formats/safetensors.h"
#include "testutil.h"

#define MAX_ALLOCS 1000000L

/* Leaks: after every N the library's count of live blocks must be back
 * where it was (this names the N that leaks, with or without ASan); under
 * ASan, LeakSanitizer also looks once at the end of each loop (Criterion
 * does not fail a test for what LeakSanitizer reports at the process's exit). */
#if defined(__SANITIZE_ADDRESS__)
#define HAVE_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HAVE_LSAN 1
#endif
#endif
#ifdef HAVE_LSAN
#include <sanitizer/lsan_interface.h>
#define leaked() __lsan_do_recoverable_leak_check()
#else
#define leaked() 0
#endif

static void disarm(void)
{
	arena_fault_alloc(0);
	arena_fault_write(0);
}

TestSuite(fault, .fini = disarm);

static int open_fds(void)
{
	return dir_entries("/proc/self/fd");
}

typedef int (*open_fn)(const void *arg);

static int st_open_close(const void *arg)
{
	arena_st_file *f = (arena_st_file *)1;
	int rc = arena_st_open(arg, &f);
	if (rc)
		cr_assert_null(f);
	arena_st_close(rc ? NULL : f);
	return rc;
}

static int ckpt_open_close(const void *arg)
{
	arena_ckpt *c = (arena_ckpt *)1;
	int rc = arena_ckpt_open(arg, &c);
	if (rc)
		cr_assert_null(c);
	arena_ckpt_close(rc ? NULL : c);
	return rc;
}

/* Run fn under "allocation N fails" for N = 1, 2, ... until a run does not
 * reach allocation N; that run must give `clean_rc`, every earlier one NOMEM.
 * Returns the number of allocations of the clean run. */
static long fault_loop(const char *what, open_fn fn, const void *arg, int clean_rc)
{
	int fds = open_fds();
	long live = arena_alloc_live();
	for (long n = 1; n < MAX_ALLOCS; n++) {
		arena_fault_alloc(n);
		int rc = fn(arg);
		int fired = arena_fault_alloc_fired();
		long count = arena_fault_alloc_count();
		arena_fault_alloc(0);
		cr_assert_eq(open_fds(), fds, "%s: allocation %ld failing leaks a file descriptor", what, n);
		cr_assert_eq(arena_alloc_live(), live, "%s: allocation %ld failing leaks %ld blocks", what, n,
			     arena_alloc_live() - live);
		if (!fired) {
			cr_assert(!leaked(), "%s: memory leaked (LeakSanitizer report above)", what);
			cr_assert_eq(rc, clean_rc, "%s: clean run gave %s (%s), want %s", what, arena_err_name(rc),
				     arena_last_error(), arena_err_name(clean_rc));
			cr_assert_lt(count, n, "%s: %ld allocations but the fault at %ld did not fire", what, count,
				     n);
			return count;
		}
		cr_assert_eq(rc, ARENA_E_NOMEM, "%s: allocation %ld failing gave %s (%s), want NOMEM", what, n,
			     arena_err_name(rc), arena_last_error());
		cr_assert(*arena_last_error(), "%s: allocation %ld: no message", what, n);
	}
	cr_assert_fail("%s: more than %ld allocations", what, MAX_ALLOCS);
	return -1;
}

Test(fault, tiny_flux)
{
	const char *p = fixture_path("tiny_flux.safetensors");
	long n = fault_loop("st_open tiny_flux", st_open_close, p, 0);
	cr_assert_gt(n, 126, "only %ld allocations for 126 tensors?", n);
	fault_loop("ckpt_open tiny_flux", ckpt_open_close, p, 0);
}

Test(fault, tiny_llama_sharded)
{
	fault_loop("ckpt_open tiny_llama_sharded (folder)", ckpt_open_close, fixture_path("tiny_llama_sharded"), 0);
	fault_loop("ckpt_open tiny_llama_sharded (index)", ckpt_open_close,
		   fixture_path("tiny_llama_sharded/model.safetensors.index.json"), 0);
}

/* A pipeline's folder: a component of one file, one sharded, one without weights. */
Test(fault, pipeline)
{
	slow_test();
	char dir[1024], sub[1200];
	tmpdir_make(dir, sizeof(dir), "fault-pipe");
	const char *comps[] = {"transformer", "text_encoder", "scheduler"};
	for (size_t i = 0; i < 3; i++) {
		snprintf(sub, sizeof(sub), "%s/%s", dir, comps[i]);
		cr_assert_eq(mkdir(sub, 0755), 0);
	}
	FILE *f = fopen(tmpdir_file(dir, "model_index.json"), "w");
	cr_assert_not_null(f);
	fputs("{\"_class_name\":\"P\",\"transformer\":[\"diffusers\",\"F\"],\"text_encoder\":[\"transformers\","
	      "\"L\"],\"scheduler\":[\"diffusers\",\"S\"]}", f);
	cr_assert_eq(fclose(f), 0);
	copy_file(fixture_path("tiny_flux.safetensors"), tmpdir_file(dir, "transformer/diffusion_pytorch_model.safetensors"));
	const char *shards[] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
				"model.safetensors.index.json"};
	for (size_t i = 0; i < 3; i++) {
		char from[1200];
		snprintf(from, sizeof(from), "tiny_llama_sharded/%s", shards[i]);
		snprintf(sub, sizeof(sub), "text_encoder/%s", shards[i]);
		copy_file(fixture_path(from), tmpdir_file(dir, sub));
	}
	fault_loop("ckpt_open pipeline", ckpt_open_close, dir, 0);
	tmpdir_remove(dir);
}

Test(fault, dtypes)
{
	fault_loop("st_open dtypes", st_open_close, fixture_path("dtypes.safetensors"), 0);
}

/* Invalid inputs too: before the error the same rule, after it no allocation.
 * The fuzz seed corpus has one file per validation rule. */
typedef struct mem_input {
	const uint8_t *buf;
	size_t len;
} mem_input;

static int st_parse_close(const void *arg)
{
	const mem_input *in = arg;
	arena_st_file *f = (arena_st_file *)1;
	int rc = arena_st_parse(in->buf, in->len, "mem", &f);
	if (rc)
		cr_assert_null(f);
	arena_st_close(rc ? NULL : f);
	return rc;
}

Test(fault, every_corpus_input)
{
	slow_test();
	const char *dir = "tests/fuzz/corpus/safetensors";
	DIR *d = opendir(dir);
	cr_assert_not_null(d, "%s (tests run from the project root)", dir);
	struct dirent *e;
	int files = 0;
	while ((e = readdir(d))) {
		char path[4096];
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		struct stat st;
		if (stat(path, &st) || !S_ISREG(st.st_mode))
			continue;
		FILE *fp = fopen(path, "rb");
		cr_assert_not_null(fp);
		uint8_t *buf = malloc((size_t)st.st_size + 1);
		cr_assert_not_null(buf);
		cr_assert_eq(fread(buf, 1, (size_t)st.st_size, fp), (size_t)st.st_size);
		fclose(fp);
		mem_input in = {buf, (size_t)st.st_size};
		int want = st_parse_close(&in);
		fault_loop(path, st_parse_close, &in, want);
		free(buf);
		files++;
	}
	closedir(d);
	cr_assert_gt(files, 40);
}

/* --- output files -------------------------------------------------------------- */

static char tmp[1024];

static void mk_tmp(void)
{
	tmpdir_make(tmp, sizeof(tmp), "fault");
}

static void rm_tmp(void)
{
	disarm();
	tmpdir_remove(tmp);
}

TestSuite(fault_out, .init = mk_tmp, .fini = rm_tmp);

static const char *out_path(void)
{
	static char p[2048];
	snprintf(p, sizeof(p), "%s/out.bin", tmp);
	return p;
}

/* Open, write `chunks` chunks of 1000 bytes, commit; the first error ends it
 * (after aborting the file). */
static int write_out(int chunks)
{
	arena_outfile *f;
	int rc = arena_outfile_open(out_path(), &f);
	if (rc)
		return rc;
	uint8_t chunk[1000];
	for (int i = 0; i < chunks; i++) {
		memset(chunk, i, sizeof(chunk));
		rc = arena_outfile_write(f, chunk, sizeof(chunk));
		if (rc) {
			arena_outfile_abort(f);
			return rc;
		}
	}
	uint64_t magic = 0x4152454e41ULL;
	rc = arena_outfile_pwrite(f, &magic, sizeof(magic), 0);
	if (rc) {
		arena_outfile_abort(f);
		return rc;
	}
	return arena_outfile_commit(f);
}

Test(fault_out, write_ok)
{
	cr_assert_eq(write_out(4), 0, "%s", arena_last_error());
	cr_assert_eq(dir_entries(tmp), 1, "only the target remains");
	struct stat st;
	cr_assert_eq(stat(out_path(), &st), 0);
	cr_assert_eq(st.st_size, 4000);
}

Test(fault_out, write_fault_every_call)
{
	int fds = open_fds();
	/* 4 appends and 1 pwrite: failing call n, for n = 1..5. */
	for (long n = 1; n <= 5; n++) {
		arena_fault_write(n);
		int rc = write_out(4);
		arena_fault_write(0);
		cr_assert_eq(rc, ARENA_E_IO, "write %ld failing gave %s (%s)", n, arena_err_name(rc),
			     arena_last_error());
		cr_assert(strstr(arena_last_error(), "out.bin"), "%s", arena_last_error());
		cr_assert_eq(dir_entries(tmp), 0, "write %ld failing left a file behind", n);
		cr_assert_eq(open_fds(), fds, "write %ld failing leaks a file descriptor", n);
	}
	/* Past the last write: it succeeds. */
	arena_fault_write(6);
	cr_assert_eq(write_out(4), 0, "%s", arena_last_error());
	arena_fault_write(0);
	cr_assert_eq(dir_entries(tmp), 1);
}

Test(fault_out, write_fault_keeps_existing_target)
{
	cr_assert_eq(write_out(2), 0, "%s", arena_last_error());
	arena_fault_write(2);
	cr_assert_eq(write_out(4), ARENA_E_IO);
	arena_fault_write(0);
	struct stat st;
	cr_assert_eq(stat(out_path(), &st), 0);
	cr_assert_eq(st.st_size, 2000, "the old file is untouched");
	cr_assert_eq(dir_entries(tmp), 1, "no temporary left");
}

static int write_out_arg(const void *arg)
{
	(void)arg;
	return write_out(3);
}

Test(fault_out, alloc_fault)
{
	long live = arena_alloc_live();
	for (long n = 1; n < 1000; n++) {
		arena_fault_alloc(n);
		int rc = write_out_arg(NULL);
		int fired = arena_fault_alloc_fired();
		arena_fault_alloc(0);
		if (!fired) {
			cr_assert_eq(rc, 0, "%s", arena_last_error());
			cr_assert_eq(dir_entries(tmp), 1);
			cr_assert_eq(arena_alloc_live(), live);
			cr_assert(!leaked(), "memory leaked (LeakSanitizer report above)");
			return;
		}
		cr_assert_eq(rc, ARENA_E_NOMEM, "allocation %ld failing gave %s", n, arena_err_name(rc));
		cr_assert_eq(arena_alloc_live(), live, "allocation %ld failing leaks %ld blocks", n,
			     arena_alloc_live() - live);
		cr_assert_eq(dir_entries(tmp), 0, "allocation %ld failing left a file behind", n);
	}
	cr_assert_fail("too many allocations");
}

Test(fault_out, no_folder)
{
	arena_outfile *f = (arena_outfile *)1;
	int rc = arena_outfile_open("/nonexistent-arena-dir/out.bin", &f);
	cr_assert_eq(rc, ARENA_E_NOT_FOUND, "%s", arena_err_name(rc));
	cr_assert_null(f);
	arena_outfile_abort(NULL);
}
