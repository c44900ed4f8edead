/* test_disk.c - the disk tier: an image opened with a host budget smaller
 * than its streamed blocks keeps the others in the image and reads them when
 * they are streamed, checked. Every acquired block holds the image's bytes,
 * step after step, whole blocks and pieces; host copies stay within the
 * budget; a checkpoint cannot; read faults, a truncated image and corrupted
 * bytes on disk are errors that name the block, never wrong bytes. */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "arena.h"
#include "../../common/alloc.h"
#include "../../common/err.h"
#include "../../common/io.h"
#include "../../convert/convert.h"
#include "../../engine/engine.h"
#include "../../runtime/open.h"
#include "testutil.h"

static char dir[256];
static const char *img;

static void setup(void)
{
	arena__disk_part = 16384; /* blocks of 32-77 KiB copied in parts, through small staging buffers */
	tmpdir_make(dir, sizeof(dir), "test-disk");
	const char *in = fixture_path("tiny_flux.safetensors");
	img = tmpdir_file(dir, "d.arena");
	arena_convert_opts co = {.chunk_size = 64 << 10, .threads = 1};
	cr_assert_eq(arena_convert_inputs(&in, 1, img, &co, NULL), 0, "%s", arena_last_error());
}

static void teardown(void)
{
	arena__disk_part = 0;
	tmpdir_remove(dir);
}

TestSuite(disk, .init = setup, .fini = teardown);

/* Streams most blocks (a cap just above the floor), with a host budget of
 * `host` (ARENA_ZERO_BYTES: none). */
static arena_open_options opts(uint64_t host, uint64_t piece)
{
	return (arena_open_options){.backend = "sim",
				    .vram_cap = piece ? 160 << 10 : 285 << 10,
				    .headroom = ARENA_ZERO_BYTES,
				    .reserve = ARENA_ZERO_BYTES,
				    .piece_size = piece,
				    .host_budget = host,
				    .flags = ARENA_OPEN_NO_LEARN};
}

/* `steps` steps over every block, each checked against ref's; the bytes
 * read from disk. */
static uint64_t run_steps(arena *a, arena *ref, int steps)
{
	arena_step_info sum;
	steps_over_blocks(a, ref, steps, 0, &sum);
	return sum.disk_bytes;
}

Test(disk, blocks_beyond_the_host_budget_come_from_the_image)
{
	arena_open_options ro = {.backend = "sim"};
	arena *ref;
	cr_assert_eq(arena_open(img, &ro, &ref), 0, "%s", arena_last_error());
	uint64_t pieces[] = {0, 16384};
	for (int k = 0; k < 2; k++) {
		/* No budget: every streamed block from the image. */
		arena_open_options o = opts(ARENA_ZERO_BYTES, pieces[k]);
		arena *a;
		cr_assert_eq(arena_open(img, &o, &a), 0, "%s", arena_last_error());
		arena_plan_info p;
		cr_assert_eq(arena_plan_get(a, &p), 0);
		cr_assert_gt(p.n_streamed, 1);
		cr_assert_eq(p.n_disk, p.n_streamed, "%zu of %zu streamed blocks on disk", p.n_disk, p.n_streamed);
		cr_assert_eq(p.host_bytes, 0);
		/* the least budget: the disk tier's staging alone */
		const uint64_t least = p.host_budget;
		cr_assert_gt(least, 0);
		cr_assert_eq(p.staging_bytes, least);
		cr_assert_gt(run_steps(a, ref, 3), 0);
		arena_close(a);
		/* The default budget holds a tiny model. */
		o = opts(0, pieces[k]);
		cr_assert_eq(arena_open(img, &o, &a), 0, "%s", arena_last_error());
		cr_assert_eq(arena_plan_get(a, &p), 0);
		cr_assert_eq(p.n_disk, 0);
		uint64_t big = 0; /* two of the largest block: some in host memory, not all */
		for (size_t i = 0; i < arena_block_count(a); i++)
			big = arena_block_bytes(a, i) > big ? arena_block_bytes(a, i) : big;
		const uint64_t two = 2 * big;
		arena_close(a);
		o = opts(least + two + (8 << 10), pieces[k]);
		cr_assert_eq(arena_open(img, &o, &a), 0, "%s", arena_last_error());
		cr_assert_eq(arena_plan_get(a, &p), 0);
		cr_assert_gt(p.n_disk, 0);
		cr_assert_lt(p.n_disk, p.n_streamed);
		cr_assert_gt(p.host_bytes, 0);
		cr_assert_eq(p.host_budget, least + two + (8 << 10));
		cr_assert_eq(p.staging_bytes, least);
		cr_assert_leq(p.host_bytes + p.staging_bytes, p.host_budget, "host copies and staging within the budget");
		uint64_t d = run_steps(a, ref, 3);
		cr_assert_gt(d, 0);
		arena_close(a);
	}
	arena_close(ref);
}

/* What only disk-tier blocks need is not read at open (a piece of one
 * 64 KiB chunk each here): fewer file bytes, the same bytes streamed. */
Test(disk, blocks_left_in_the_image_are_not_read_at_open)
{
	setenv("ARENA_LOAD_PIECE", "64K", 1);
	arena_open_options ro = {.backend = "sim"};
	arena *ref, *a;
	cr_assert_eq(arena_open(img, &ro, &ref), 0, "%s", arena_last_error());
	arena_load_stats all, some;
	arena_open_options o = opts(0, 0);
	cr_assert_eq(arena__open_tuned(img, &o, NULL, &a, &all, NULL), 0, "%s", arena_last_error());
	arena_close(a);
	o = opts(ARENA_ZERO_BYTES, 0);
	cr_assert_eq(arena__open_tuned(img, &o, NULL, &a, &some, NULL), 0, "%s", arena_last_error());
	cr_assert_lt(some.file_bytes, all.file_bytes / 2, "read %llu of %llu bytes", (unsigned long long)some.file_bytes,
		     (unsigned long long)all.file_bytes);
	cr_assert_gt(run_steps(a, ref, 2), 0);
	arena_close(a);
	arena_close(ref);
	unsetenv("ARENA_LOAD_PIECE");
}

Test(disk, a_checkpoint_cannot_be_read_again)
{
	arena_open_options o = opts(ARENA_ZERO_BYTES, 0);
	arena *a;
	cr_assert_eq(arena_open(fixture_path("tiny_flux.safetensors"), &o, &a), ARENA_E_USAGE);
	cr_assert_null(a);
	cr_assert(strstr(arena_last_error(), "only an image can be read again"), "%s", arena_last_error());
}

/* A read of the image failing while streaming: the acquire fails naming the
 * block, the arena stays failed (never wrong bytes), closing frees all. */
Test(disk, read_faults_while_streaming)
{
	long live = arena_alloc_live();
	for (long n = 1; n < 40; n++) {
		arena_open_options o = opts(ARENA_ZERO_BYTES, 0);
		arena *a;
		cr_assert_eq(arena_open(img, &o, &a), 0, "%s", arena_last_error());
		arena_fault_read(n);
		int rc = arena_step_begin(a), failed = 0;
		for (size_t i = 0; !rc && i < arena_block_count(a); i++) {
			void *d;
			if ((rc = arena_block_acquire(a, i, NULL, &d)))
				break;
			rc = arena_block_release(a, i, NULL);
		}
		if (!rc)
			rc = arena_step_end(a);
		arena_fault_read(0);
		if (rc) {
			failed = 1;
			cr_assert_eq(rc, ARENA_E_IO, "n=%ld: %s: %s", n, arena_err_name(rc), arena_last_error());
			cr_assert(strstr(arena_last_error(), "blocks.") != NULL, "n=%ld: names no block: %s", n,
				  arena_last_error());
			void *d;
			cr_assert_neq(arena_block_acquire(a, 1, NULL, &d), 0, "a failed arena stays failed");
		}
		arena_close(a);
		cr_assert_eq(arena_alloc_live(), live, "n=%ld leaked", n);
		if (!failed)
			break;
	}
}

/* The image truncated, or its bytes changed, after it was opened: the
 * block read from it is refused (INPUT_CHANGED, or the chunk's checksum:
 * both of class INVALID, as IMG_TRUNCATED is at the open), not used. */
Test(disk, a_truncated_or_corrupted_image_while_streaming)
{
	for (int k = 0; k < 2; k++) {
		char copy[512];
		snprintf(copy, sizeof(copy), "%s/c%d.arena", dir, k);
		FILE *in = fopen(img, "rb"), *out = fopen(copy, "wb");
		cr_assert(in && out);
		char buf[65536];
		size_t n;
		while ((n = fread(buf, 1, sizeof(buf), in)) > 0)
			cr_assert_eq(fwrite(buf, 1, n, out), n);
		fclose(in);
		fclose(out);
		arena_open_options o = opts(ARENA_ZERO_BYTES, 0);
		arena *a;
		cr_assert_eq(arena_open(copy, &o, &a), 0, "%s", arena_last_error());
		/* the first streamed block's bytes in the file */
		size_t first = 0;
		for (size_t i = 1; i < arena_block_count(a) && !first; i++) {
			arena_block_info bi;
			cr_assert_eq(arena_block_get(a, i, &bi), 0);
			if (!bi.resident)
				first = i;
		}
		cr_assert_gt(first, 0);
		if (k == 0) {
			int fd = open(copy, O_RDWR);
			cr_assert_geq(fd, 0);
			cr_assert_eq(ftruncate(fd, lseek(fd, 0, SEEK_END) / 3), 0);
			close(fd);
		} else { /* flip a byte in every 4 KiB of the data: whatever is read is corrupt */
			flip_a_byte_a_page(copy, 65536, 8192);
		}
		int rc = try_step_over_blocks(a, NULL);
		cr_assert_neq(rc, 0, "k=%d: a changed image streamed without an error", k);
		if (k == 0)
			cr_assert(rc == ARENA_E(INPUT_CHANGED) || rc == ARENA_E(IMG_CHUNK_CHECKSUM), "%s: %s", arena_err_name(rc),
				  arena_last_error());
		else
			cr_assert_eq(rc, ARENA_E(IMG_CHUNK_CHECKSUM), "%s: %s", arena_err_name(rc), arena_last_error());
		cr_assert_eq(arena_err_class(rc), ARENA_CLASS_INVALID);
		cr_assert(strstr(arena_last_error(), "blocks.") != NULL, "names no block: %s", arena_last_error());
		arena_close(a);
	}
}

/* Demotions keep the host budget: blocks pushed off the device by outside
 * pressure get host copies only while the budget lasts; the others stay in
 * the image and are read from it when streamed, bytes checked. */
Test(disk, demotions_keep_the_host_budget)
{
	arena_open_options ro = {.backend = "sim"};
	arena *ref;
	cr_assert_eq(arena_open(img, &ro, &ref), 0, "%s", arena_last_error());
	uint64_t big = 0;
	for (size_t i = 0; i < arena_block_count(ref); i++)
		big = arena_block_bytes(ref, i) > big ? arena_block_bytes(ref, i) : big;
	/* everything resident (the headroom is what outside pressure can take);
	 * a host budget of the disk tier's least staging and one block */
	arena_open_options o = {.backend = "sim",
				.sim_capacity = 340 << 10,
				.headroom = 40 << 10,
				.reserve = ARENA_ZERO_BYTES,
				.depth = 1,
				.host_budget = ARENA_ZERO_BYTES,
				.flags = ARENA_OPEN_NO_LEARN};
	arena *a;
	arena_plan_info p;
	cr_assert_eq(arena_open(img, &o, &a), 0, "%s", arena_last_error());
	cr_assert_eq(arena_plan_get(a, &p), 0);
	const uint64_t least = p.staging_bytes;
	arena_close(a);
	o.host_budget = least + big + 4096;
	cr_assert_eq(arena_open(img, &o, &a), 0, "%s", arena_last_error());
	cr_assert_eq(arena_plan_get(a, &p), 0);
	cr_assert_eq(p.staging_bytes, least);
	cr_assert_eq(p.n_streamed, 0);
	cr_assert_eq(p.host_bytes, 0);
	/* another program takes most of the device: blocks must leave it */
	cr_assert_eq(arena_sim_pressure(a, 30 << 10), 0, "%s", arena_last_error());
	run_steps(a, ref, 4);
	cr_assert_eq(arena_plan_get(a, &p), 0);
	cr_assert_gt(p.n_streamed, 1, "pressure streamed blocks");
	cr_assert_leq(p.host_bytes, big + 4096, "host copies %lu within the budget %lu", (unsigned long)p.host_bytes,
		      (unsigned long)(big + 4096));
	cr_assert_gt(p.n_disk, 0, "the blocks past the budget stay in the image");
	arena_close(a);
	arena_close(ref);
}

/* The disk tier's reads ahead (the stager's thread), on the caller's
 * thread (ARENA_DISK_READAHEAD=0), through the page cache only
 * (ARENA_DISK_IO=buffered) and with two slots (ARENA_DISK_STAGING): the
 * same bytes every step, whole blocks and pieces, sample and train. */
Test(disk, every_way_of_reading_gives_the_same_bytes)
{
	arena_open_options ro = {.backend = "sim"};
	arena *ref;
	cr_assert_eq(arena_open(img, &ro, &ref), 0, "%s", arena_last_error());
	const char *env[][2] = {{"ARENA_DISK_READAHEAD", "1"},
				{"ARENA_DISK_READAHEAD", "0"},
				{"ARENA_DISK_IO", "buffered"},
				{"ARENA_DISK_STAGING", "1"}};
	for (int k = 0; k < 4; k++) {
		setenv(env[k][0], env[k][1], 1);
		for (int piece = 0; piece < 2; piece++)
			for (int train = 0; train < 2; train++) {
				arena_open_options o = opts(ARENA_ZERO_BYTES, piece ? 16384 : 0);
				arena *a;
				cr_assert_eq(arena_open(img, &o, &a), 0, "%s", arena_last_error());
				arena_step_info sum;
				steps_over_blocks(a, ref, 3, train, &sum);
				cr_assert_gt(sum.disk_bytes, 0, "%s=%s", env[k][0], env[k][1]);
				arena_close(a);
			}
		unsetenv(env[k][0]);
	}
	arena_close(ref);
}

/* Read faults while the stager reads ahead: whichever read fails, the
 * bytes handed out are right. A failed read of the part being copied fails
 * the step with IO naming the block; one of a part further ahead is read
 * again when the engine next names what it wants (a fault that does not
 * last is then gone); closing frees everything. */
Test(disk, read_faults_in_reads_ahead)
{
	arena_open_options ro = {.backend = "sim"};
	arena *ref;
	cr_assert_eq(arena_open(img, &ro, &ref), 0, "%s", arena_last_error());
	long live = arena_alloc_live();
	int failures = 0, retried = 0;
	for (long n = 1; n < 60; n++) {
		arena_open_options o = opts(ARENA_ZERO_BYTES, 16384);
		arena *a;
		cr_assert_eq(arena_open(img, &o, &a), 0, "%s", arena_last_error());
		arena_fault_read(n);
		int rc = try_step_over_blocks(a, ref);
		if (!rc)
			rc = try_step_over_blocks(a, ref);
		retried += !rc && arena_fault_read_fired();
		arena_fault_read(0);
		if (rc) {
			failures++;
			cr_assert_eq(rc, ARENA_E_IO, "n=%ld: %s: %s", n, arena_err_name(rc), arena_last_error());
			cr_assert(strstr(arena_last_error(), "blocks.") != NULL, "n=%ld: names no block: %s", n,
				  arena_last_error());
		}
		arena_close(a);
		cr_assert_eq(arena_alloc_live(), live, "n=%ld leaked", n);
	}
	cr_assert_gt(failures, 0);
	cr_assert_gt(retried, 0, "no fault hit a read ahead");
	arena_close(ref);
}

/* arena_pread_cached_or_direct: bytes the page cache holds come from it,
 * the rest with O_DIRECT (where the filesystem has it), the same bytes
 * either way; an unaligned read is buffered; the end of the file inside
 * the range and an injected failure are IO errors naming the file. */
Test(disk, reads_from_the_page_cache_or_around_it)
{
	const char *path = tmpdir_file(dir, "direct.bin");
	enum { N = 1 << 20 };
	uint8_t *want = arena_malloc(N), *got = arena_aligned_alloc(4096, N + 4096);
	cr_assert(want && got);
	for (size_t i = 0; i < N; i++)
		want[i] = (uint8_t)(i * 131 + (i >> 12));
	int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
	cr_assert_geq(fd, 0);
	cr_assert_eq(pwrite(fd, want, N, 0), N);
	cr_assert_eq(fsync(fd), 0);
	int dfd = open(path, O_RDONLY | O_DIRECT);
	if (dfd < 0) {
		cr_assert_eq(errno, EINVAL, "O_DIRECT open: %s", strerror(errno));
		close(fd);
		cr_skip_test("this filesystem has no O_DIRECT (tmpfs): only buffered reads to check");
	}
	void *map = mmap(NULL, N, PROT_READ, MAP_SHARED, fd, 0);
	cr_assert_neq(map, MAP_FAILED);
	/* Not cached: the bytes come around the page cache. */
	cr_assert_eq(posix_fadvise(fd, 0, N, POSIX_FADV_DONTNEED), 0);
	uint64_t direct = 0;
	cr_assert_eq(arena_pread_cached_or_direct(fd, dfd, map, got, N, 0, path, &direct), 0, "%s", arena_last_error());
	cr_assert_eq(memcmp(got, want, N), 0);
	cr_assert_gt(direct, 0, "nothing read with O_DIRECT after the pages were dropped");
	/* Cached: none of it with O_DIRECT. */
	cr_assert_eq(arena_pread_full(fd, got, N, 0, path), 0);
	memset(got, 0, N);
	direct = 0;
	cr_assert_eq(arena_pread_cached_or_direct(fd, dfd, map, got, N, 0, path, &direct), 0, "%s", arena_last_error());
	cr_assert_eq(memcmp(got, want, N), 0);
	cr_assert_eq(direct, 0, "%llu bytes read O_DIRECT from a cached file", (unsigned long long)direct);
	/* Unaligned: buffered, the same bytes. */
	cr_assert_eq(posix_fadvise(fd, 0, N, POSIX_FADV_DONTNEED), 0);
	cr_assert_eq(arena_pread_cached_or_direct(fd, dfd, map, got + 1, 8192, 4096, path, &direct), 0);
	cr_assert_eq(memcmp(got + 1, want + 4096, 8192), 0);
	cr_assert_eq(direct, 0);
	/* The end of the file inside the range. */
	int rc = arena_pread_cached_or_direct(fd, dfd, map, got, N, 4096, path, &direct);
	cr_assert_eq(rc, ARENA_E(INPUT_CHANGED));
	cr_assert(strstr(arena_last_error(), "file changed while reading: unexpected end of file") &&
			  strstr(arena_last_error(), "direct.bin"),
		  "%s", arena_last_error());
	/* An injected failure, cached or not. */
	for (int k = 0; k < 2; k++) {
		arena_fault_read(k + 1);
		rc = arena_pread_cached_or_direct(fd, dfd, map, got, N, 0, path, NULL);
		arena_fault_read(0);
		cr_assert_eq(rc, ARENA_E_IO, "k=%d: %s", k, arena_last_error());
		cr_assert(strstr(arena_last_error(), "read failed"), "%s", arena_last_error());
	}
	/* Without a mapping: all buffered. */
	cr_assert_eq(posix_fadvise(fd, 0, N, POSIX_FADV_DONTNEED), 0);
	direct = 0;
	cr_assert_eq(arena_pread_cached_or_direct(fd, dfd, NULL, got, N, 0, path, &direct), 0);
	cr_assert_eq(memcmp(got, want, N), 0);
	cr_assert_eq(direct, 0);
	/* Half cached (every other 64 KiB): the cached half from the cache. */
	cr_assert_eq(posix_fadvise(fd, 0, N, POSIX_FADV_DONTNEED), 0);
	cr_assert_eq(posix_fadvise(fd, 0, N, POSIX_FADV_RANDOM), 0); /* no read-ahead past what is read */
	for (size_t at = 0; at < N; at += 128 << 10)
		cr_assert_eq(arena_pread_full(fd, got, 64 << 10, at, path), 0);
	cr_assert_eq(posix_fadvise(fd, 0, N, POSIX_FADV_NORMAL), 0);
	memset(got, 0, N);
	direct = 0;
	cr_assert_eq(arena_pread_cached_or_direct(fd, dfd, map, got, N, 0, path, &direct), 0);
	cr_assert_eq(memcmp(got, want, N), 0);
	cr_assert(direct >= N / 2 - (64 << 10) && direct <= N / 2, "%llu bytes O_DIRECT of %d, half of them cached",
		  (unsigned long long)direct, N);
	/* and nothing of the rest was brought into the page cache */
	unsigned char v[N / 4096];
	cr_assert_eq(mincore(map, N, v), 0);
	size_t resident = 0;
	for (size_t i = 0; i < N / 4096; i++)
		resident += v[i] & 1;
	cr_assert_leq(resident, N / 4096 / 2 + 16, "%zu of %d pages cached after the read", resident, N / 4096);
	munmap(map, N);
	close(dfd);
	close(fd);
	arena_free(want);
	arena_free(got);
}

/* The disk tier's staging comes out of the budget at open: host copies and
 * staging within it; a quarter of a large budget goes to the stager's
 * slots (up to ARENA_DISK_STAGING: a smaller one leaves host copies more);
 * a budget below the least is refused, naming the least. */
Test(disk, the_staging_comes_out_of_the_budget_at_open)
{
	arena_open_options ro = {.backend = "sim"};
	arena *ref, *a;
	cr_assert_eq(arena_open(img, &ro, &ref), 0, "%s", arena_last_error());
	arena_open_options o = opts(ARENA_ZERO_BYTES, 0);
	cr_assert_eq(arena_open(img, &o, &a), 0, "%s", arena_last_error());
	arena_plan_info p;
	cr_assert_eq(arena_plan_get(a, &p), 0);
	const uint64_t least = p.staging_bytes;
	uint64_t streamed = 0;
	for (size_t i = 0; i < arena_block_count(a); i++) {
		arena_block_info bi;
		cr_assert_eq(arena_block_get(a, i, &bi), 0);
		streamed += bi.resident ? 0 : arena_block_bytes(a, i);
	}
	arena_close(a);
	/* A budget of the least and half the streamed blocks: a tier */
	uint64_t budget = least + streamed / 2;
	o = opts(budget, 0);
	cr_assert_eq(arena_open(img, &o, &a), 0, "%s", arena_last_error());
	cr_assert_eq(arena_plan_get(a, &p), 0);
	cr_assert_eq(p.staging_bytes, least);
	cr_assert_gt(p.n_disk, 0);
	cr_assert_leq(p.host_bytes + p.staging_bytes, budget, "host copies %llu, staging %llu, budget %llu",
		      (unsigned long long)p.host_bytes, (unsigned long long)p.staging_bytes, (unsigned long long)budget);
	cr_assert_gt(run_steps(a, ref, 2), 0);
	arena_close(a);
	/* Eight times the least: a quarter for the staging, beside every host copy */
	budget = 8 * least;
	o = opts(budget, 0);
	cr_assert_eq(arena_open(img, &o, &a), 0, "%s", arena_last_error());
	cr_assert_eq(arena_plan_get(a, &p), 0);
	cr_assert_gt(p.staging_bytes, least, "a quarter of the budget: %llu", (unsigned long long)p.staging_bytes);
	cr_assert_leq(p.staging_bytes, budget / 4);
	cr_assert_eq(p.n_disk, 0);
	cr_assert_leq(p.host_bytes + p.staging_bytes, budget);
	arena_close(a);
	setenv("ARENA_DISK_STAGING", "1K", 1); /* two slots: the least */
	cr_assert_eq(arena_open(img, &o, &a), 0, "%s", arena_last_error());
	unsetenv("ARENA_DISK_STAGING");
	cr_assert_eq(arena_plan_get(a, &p), 0);
	cr_assert_eq(p.staging_bytes, least);
	arena_close(a);
	/* Below the least: refused, naming it */
	o = opts(least - 1, 0);
	cr_assert_eq(arena_open(img, &o, &a), ARENA_E(BUDGET));
	char want[64];
	snprintf(want, sizeof(want), "least staging, %.2f KiB", (double)least / 1024);
	cr_assert(strstr(arena_last_error(), want), "%s (want '%s')", arena_last_error(), want);
	arena_close(ref);
}

/* The host budget is all the host memory the weights take: the disk tier's
 * staging comes out of it whatever its size, so that host copies and
 * staging together stay within it; what is left holds host copies. */
Test(disk, the_staging_comes_out_of_any_budget)
{
	enum { N = 21, MiB = 1 << 20 };
	arena__disk_part = 0; /* parts of ARENA_ENGINE_DISK_PART */
	arena_layout *l;
	cr_assert_eq(arena_layout_create(N, 0, &l), 0);
	uint8_t resident[N] = {1}; /* block 0: globals */
	uint32_t sched[N];
	for (size_t b = 0; b < N; b++) {
		l->blocks[b].offset = b * 16 * MiB;
		l->blocks[b].bytes = 16 * MiB;
	}
	arena_residency_plan p = {.n_blocks = N, .resident = resident, .sched = sched};
	for (uint32_t b = 1; b < N; b++)
		sched[p.n_sched++] = b;
	uint8_t disk[N];
	uint64_t host, out;
	/* 320 MiB of streamed blocks, a budget of 240 MiB with 64 MiB of
	 * staging (less than four times it): 176 MiB hold 11 host copies. */
	cr_assert_eq(arena_residency_host_split(l, &p, 15 * 16 * MiB, 64 * MiB, NULL, disk, &host, &out), 0);
	cr_assert_leq(host + 64 * MiB, 15 * 16 * MiB, "host copies %llu MiB and 64 MiB of staging in a 240 MiB budget",
		      (unsigned long long)(host / MiB));
	cr_assert_eq(host, 11 * 16 * MiB);
	cr_assert_eq(out, 9 * 16 * MiB);
	cr_assert_eq(arena_residency_host_copies(15 * 16 * MiB, 64 * MiB), 11 * 16 * MiB);
	/* A budget the staging takes whole: every streamed block in the tier. */
	cr_assert_eq(arena_residency_host_split(l, &p, 64 * MiB, 64 * MiB, NULL, disk, &host, &out), 0);
	cr_assert_eq(host, 0);
	cr_assert_eq(out, 20 * 16 * MiB);
	/* Host copies fit beside the staging: no tier; not beside it: a tier,
	 * though the copies alone would fit. */
	cr_assert_eq(arena_residency_host_split(l, &p, 24 * 16 * MiB, 64 * MiB, NULL, disk, &host, &out), 0);
	cr_assert_eq(out, 0);
	cr_assert_eq(host, 20 * 16 * MiB);
	cr_assert_eq(arena_residency_host_split(l, &p, 21 * 16 * MiB, 64 * MiB, NULL, disk, &host, &out), 0);
	cr_assert_eq(host, 17 * 16 * MiB);
	cr_assert_eq(out, 3 * 16 * MiB);
	/* No limit: no tier. */
	cr_assert_eq(arena_residency_host_split(l, &p, UINT64_MAX, 64 * MiB, NULL, disk, &host, &out), 0);
	cr_assert_eq(out, 0);

	/* The stager's share: a quarter of the budget in whole slots beside the
	 * chunk buffers (32 MiB here), two slots at least, `want` at most. */
	uint64_t slots;
	cr_assert_eq(arena_residency_staging(1024 * MiB, 384 * MiB, 64 * MiB, 32 * MiB, &slots), 0);
	cr_assert_eq(slots, 3 * 64 * MiB, "%llu MiB", (unsigned long long)(slots / MiB)); /* 256 less 32 */
	cr_assert_eq(arena_residency_staging(8192ull * MiB, 384 * MiB, 64 * MiB, 32 * MiB, &slots), 0);
	cr_assert_eq(slots, 384 * MiB);
	cr_assert_eq(arena_residency_staging(8192ull * MiB, 100 * MiB, 64 * MiB, 32 * MiB, &slots), 0);
	cr_assert_eq(slots, 2 * 64 * MiB, "two slots at least");
	cr_assert_eq(arena_residency_staging(1ull << 50, 1ull << 40, 64 * MiB, 0, &slots), 0);
	cr_assert_eq(slots, 64ull * 64 * MiB, "at most the stager's slots");
	cr_assert_eq(arena_residency_staging(512 * MiB, 384 * MiB, 64 * MiB, 32 * MiB, &slots), 0);
	cr_assert_eq(slots, 2 * 64 * MiB);
	cr_assert_eq(arena_residency_staging(160 * MiB, 384 * MiB, 64 * MiB, 32 * MiB, &slots), 0); /* the least */
	cr_assert_eq(slots, 2 * 64 * MiB);
	cr_assert_eq(arena_residency_staging(160 * MiB - 1, 384 * MiB, 64 * MiB, 32 * MiB, &slots), ARENA_E(BUDGET));
	cr_assert(strstr(arena_last_error(), "least staging, 160.00 MiB"), "%s", arena_last_error());
	cr_assert_eq(arena_residency_staging(0, 384 * MiB, 64 * MiB, 32 * MiB, &slots), 0); /* 0: the least */
	cr_assert_eq(slots, 2 * 64 * MiB);
	cr_assert_eq(arena_residency_staging(UINT64_MAX, 384 * MiB, 64 * MiB, 32 * MiB, &slots), 0);
	cr_assert_eq(slots, 384 * MiB);

	/* The whole host side: 16 MiB slots (the blocks are smaller than a
	 * part), 8 MiB of chunk buffers. 384 MiB: 88 MiB of staging (five
	 * slots), 296 MiB hold 18 of the 20 host copies. */
	arena_host_plan hp;
	cr_assert_eq(arena_residency_host_plan(l, &p, 24 * 16 * MiB, 1, 16 * MiB, 384 * MiB, 8 * MiB, NULL, disk, &hp), 0);
	cr_assert_eq(hp.slots, 5 * 16 * MiB);
	cr_assert_eq(hp.staging, 88 * MiB);
	cr_assert_eq(hp.host, 18 * 16 * MiB);
	cr_assert_eq(hp.n_disk, 2);
	cr_assert_eq(hp.disk, 2 * 16 * MiB);
	cr_assert_leq(hp.host + hp.staging, hp.budget);
	/* 0: the least, no host copies; a budget given below the least: BUDGET;
	 * one the host spares (not given) below the least: the least. */
	cr_assert_eq(arena_residency_host_plan(l, &p, 0, 1, 16 * MiB, 384 * MiB, 8 * MiB, NULL, disk, &hp), 0);
	cr_assert_eq(hp.budget, 40 * MiB);
	cr_assert_eq(hp.staging, 40 * MiB);
	cr_assert_eq(hp.host, 0);
	cr_assert_eq(hp.n_disk, 20);
	cr_assert_eq(arena_residency_host_plan(l, &p, 39 * MiB, 1, 16 * MiB, 384 * MiB, 8 * MiB, NULL, disk, &hp), ARENA_E(BUDGET));
	cr_assert_eq(arena_residency_host_plan(l, &p, 39 * MiB, 0, 16 * MiB, 384 * MiB, 8 * MiB, NULL, disk, &hp), 0);
	cr_assert_eq(hp.budget, 40 * MiB);
	cr_assert_eq(hp.n_disk, 20);
	/* No limit: the most staging, no tier. */
	cr_assert_eq(arena_residency_host_plan(l, &p, UINT64_MAX, 0, 16 * MiB, 384 * MiB, 8 * MiB, NULL, disk, &hp), 0);
	cr_assert_eq(hp.slots, 384 * MiB);
	cr_assert_eq(hp.n_disk, 0);
	cr_assert_eq(hp.host, 20 * 16 * MiB);
	arena_layout_free(l);
}

/* The disk tier is spread through the schedule, not its end: a tier read
 * back to back keeps the copies waiting on the disk (2026-12-02, H200:
 * 3.1 GB at the end of sampling's schedule took 0.34 s steps to 0.55 s),
 * while a tier block between host blocks is read during their copies.
 * Blocks the schedule does not stream join it first (read no step); the
 * host copies use the budget as before. */
Test(disk, the_tier_is_spread_through_the_schedule)
{
	enum { N = 21, MiB = 1 << 20 };
	arena_layout *l;
	cr_assert_eq(arena_layout_create(N, 0, &l), 0);
	uint8_t resident[N] = {1}; /* block 0: globals */
	uint32_t sched[N];
	for (size_t b = 0; b < N; b++) {
		l->blocks[b].offset = b * 16 * MiB;
		l->blocks[b].bytes = 16 * MiB;
	}
	arena_residency_plan p = {.n_blocks = N, .resident = resident, .sched = sched};
	for (uint32_t b = 1; b < N; b++) /* 20 streamed blocks, in reverse order */
		sched[p.n_sched++] = N - b;
	uint8_t disk[N];
	uint64_t host, out;
	/* Room for 15 of 20 (no staging here: the_staging_comes_out_of_any_budget). */
	cr_assert_eq(arena_residency_host_split(l, &p, 15 * 16 * MiB, 0, NULL, disk, &host, &out), 0);
	cr_assert_eq(host, 15 * 16 * MiB);
	cr_assert_eq(out, 5 * 16 * MiB);
	cr_assert_eq(disk[0], 0, "globals");
	size_t run = 0, longest = 0, last = 0, first = N;
	for (size_t i = 0; i < p.n_sched; i++) {
		const uint32_t b = sched[i];
		run = disk[b] ? run + 1 : 0;
		longest = run > longest ? run : longest;
		if (disk[b]) {
			last = i;
			first = first < i ? first : i;
		}
	}
	cr_assert_eq(longest, 1, "no two tier blocks in a row (longest run %zu)", longest);
	cr_assert_lt(first, 5, "the tier starts within the schedule's first quarter (at %zu)", first);
	cr_assert_lt(last, p.n_sched - 1, "the tier does not end the schedule");
	/* A block the schedule does not name goes first. */
	p.n_sched = 0;
	for (uint32_t b = 2; b < N; b++)
		sched[p.n_sched++] = b;
	cr_assert_eq(arena_residency_host_split(l, &p, 19 * 16 * MiB, 0, NULL, disk, &host, &out), 0);
	cr_assert_eq(out, 16 * MiB);
	cr_assert(disk[1], "block 1 is not scheduled: it is the tier");
	/* Everything fits: no tier; an odd budget: host copies as many as fit. */
	cr_assert_eq(arena_residency_host_split(l, &p, 20 * 16 * MiB, 0, NULL, disk, &host, &out), 0);
	cr_assert_eq(out, 0);
	cr_assert_eq(host, 20 * 16 * MiB);
	cr_assert_eq(arena_residency_host_split(l, &p, 12 * 16 * MiB + 5 * MiB, 0, NULL, disk, &host, &out), 0);
	cr_assert_eq(host, 12 * 16 * MiB);
	cr_assert_eq(out, 8 * 16 * MiB);
	/* With the staging out of the budget. */
	cr_assert_eq(arena_residency_host_split(l, &p, 18 * 16 * MiB, 64 * MiB, NULL, disk, &host, &out), 0);
	cr_assert_eq(host, 14 * 16 * MiB);
	/* Out of memory for its lists: NOMEM, each allocation in turn. */
	for (long k = 1; k <= 2; k++) {
		arena_fault_alloc(k);
		int rc = arena_residency_host_split(l, &p, 12 * 16 * MiB, 64 * MiB, NULL, disk, &host, &out);
		int fired = arena_fault_alloc_fired();
		arena_fault_alloc(0);
		cr_assert(fired, "allocation %ld", k);
		cr_assert_eq(rc, ARENA_E_NOMEM, "allocation %ld: %s", k, arena_last_error());
	}
	arena_layout_free(l);
}
