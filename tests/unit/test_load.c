/* test_load.c - the loader on the sim backend: images and safetensors into
 * device memory and host slabs, budgets, corruption caught in flight, and
 * every failure releasing everything. */
#include <criterion/criterion.h>

#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <xxhash.h>
#include <zstd.h>

#include "arena.h"
#include "../../device/backend.h"
#include "../../device/budget.h"
#include "../../common/alloc.h"
#include "../../common/io.h"
#include "../../formats/codec.h"
#include "../../formats/image.h"
#include "../../formats/st_write.h"
#include "../../convert/convert.h"
#include "../../runtime/load.h"
#include "../../convert/quant_select.h"
#include "testutil.h"

static char dir[256], img_path[300];
static arena_backend *be;
static arena_pin_budget budget;

static void setup(void)
{
	tmpdir_make(dir, sizeof(dir), "test-load");
	snprintf(img_path, sizeof(img_path), "%s/f.arena", dir);
	const char *in = fixture_path("tiny_flux.safetensors");
	arena_convert_opts co = {.chunk_size = 64 << 10, .threads = 1};
	cr_assert_eq(arena_convert_inputs(&in, 1, img_path, &co, NULL), 0, "%s", arena_last_error());
	arena_sim_opts so = {.capacity = 64 << 20};
	cr_assert_eq(arena_backend_sim_create(&so, &be), 0);
	arena_pin_budget_probe(&budget, 256 << 20, 0, "");
}

static void teardown(void)
{
	arena_backend_destroy(be);
	tmpdir_remove(dir);
}

TestSuite(load, .init = setup, .fini = teardown);

static arena_load_opts opts(void)
{
	return (arena_load_opts){.backend = be, .budget = &budget, .threads = 2, .slot_bytes = 128 << 10,
				 .io = ARENA_IO_AUTO};
}

/* The fault sweeps' loads: every other block on the device, through `io`. */
static const uint8_t every_other[6] = {1, 0, 1, 0, 1, 0};

static arena_load_opts every_other_opts(int io)
{
	arena_load_opts o = opts();
	o.io = io;
	o.on_device = every_other;
	return o;
}

/* Every block's bytes (device or host) equal the image's slab bytes. */
static void expect_image_bytes(const arena_model *m)
{
	arena_image *img;
	cr_assert_eq(arena_img_open(img_path, &img), 0);
	arena_img_reader rd;
	cr_assert_eq(arena_img_reader_init(&rd, img, 1), 0);
	for (size_t b = 0; b < m->layout->n_blocks; b++) {
		const arena_block *blk = &m->layout->blocks[b];
		uint8_t *want = malloc(blk->bytes), *got = malloc(blk->bytes);
		cr_assert_eq(arena_img_read_raw(&rd, blk->offset, blk->bytes, want), 0, "%s", arena_last_error());
		if (m->mem[b].dev)
			cr_assert_eq(be->ops->copy_d2h_sync(be, got, m->mem[b].dev, blk->bytes), 0);
		else
			memcpy(got, m->mem[b].host, blk->bytes);
		cr_assert(memcmp(want, got, blk->bytes) == 0, "block %s differs", blk->name);
		free(want);
		free(got);
	}
	arena_img_reader_free(&rd);
	arena_img_close(img);
}

static void put64le(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t dev_free(void)
{
	uint64_t f, t;
	cr_assert_eq(be->ops->mem_info(be, &f, &t), 0);
	return f;
}

Test(load, image_all_on_device)
{
	arena_load_opts o = opts();
	arena_model *m;
	arena_load_stats st;
	cr_assert_eq(arena_load_image(img_path, &o, &m, &st), 0, "%s", arena_last_error());
	cr_assert(m->committed);
	cr_assert_eq(st.host_bytes, 0);
	cr_assert_gt(st.dev_bytes, 300000);
	cr_assert(st.ring_pinned);
	expect_image_bytes(m);
	arena_model_free(m);
	cr_assert_eq(dev_free(), 64 << 20, "device memory left allocated");
	cr_assert_eq(atomic_load(&budget.used), 0, "pinned budget not given back");
}

Test(load, io_modes_give_the_same_bytes)
{
	int modes[] = {ARENA_IO_BUFFERED, ARENA_IO_DIRECT, ARENA_IO_AUTO};
	for (int k = 0; k < 3; k++) {
		arena_load_opts o = opts();
		o.io = modes[k];
		o.threads = (unsigned)k + 1;
		arena_model *m;
		cr_assert_eq(arena_load_image(img_path, &o, &m, NULL), 0, "%s", arena_last_error());
		expect_image_bytes(m);
		arena_model_free(m);
	}
}

/* A safetensors file at path of four bf16 blocks "blocks.N.w" of rows x
 * cols: weights-like values (an exponent near 0x3c, any mantissa, a rare
 * outlier: hb4 and zstd code them) or, not weights_like, a plain pattern. */
static void write_four_blocks(const char *path, uint64_t rows, uint64_t cols, int weights_like)
{
	arena_stw *w;
	cr_assert_eq(arena_stw_create(path, &w), 0);
	uint64_t shape[2] = {rows, cols};
	char name[64];
	for (int b = 0; b < 4; b++) {
		snprintf(name, sizeof(name), "blocks.%d.w", b);
		cr_assert_eq(arena_stw_add(w, name, ARENA_DTYPE_BF16, 2, shape), 0);
	}
	cr_assert_eq(arena_stw_begin(w), 0);
	const uint64_t n = 4 * rows * cols;
	uint16_t *v = malloc(2 * n);
	cr_assert_not_null(v);
	uint64_t x = 0x9E3779B97F4A7C15ull;
	for (uint64_t i = 0; i < n; i++) {
		if (!weights_like) {
			v[i] = (uint16_t)(i * 40503u);
			continue;
		}
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		/* sign, an exponent near 0x3c (|w| ~ 1e-2), any mantissa; a rare outlier */
		uint16_t e = (uint16_t)(0x3c - (x >> 40) % 4 + (x % 5000 == 0 ? 40 : 0));
		v[i] = (uint16_t)((x >> 63) << 15 | e << 7 | (x >> 20) % 128);
	}
	cr_assert_eq(arena_stw_write(w, v, 2 * n), 0);
	cr_assert_eq(arena_stw_commit(w), 0);
	free(v);
}

/* Pages of the file left in the page cache (mincore through a mapping). */
static size_t cached_pages(const char *path, size_t *total)
{
	int fd = open(path, O_RDONLY);
	cr_assert_geq(fd, 0);
	struct stat st;
	cr_assert_eq(fstat(fd, &st), 0);
	*total = ((size_t)st.st_size + 4095) / 4096;
	void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
	cr_assert_neq(m, MAP_FAILED);
	unsigned char *v = arena_malloc(*total);
	cr_assert_eq(mincore(m, (size_t)st.st_size, v), 0);
	size_t n = 0;
	for (size_t i = 0; i < *total; i++)
		n += v[i] & 1;
	arena_free(v);
	munmap(m, (size_t)st.st_size);
	close(fd);
	return n;
}

static void drop_cached(const char *path)
{
	int fd = open(path, O_RDONLY);
	cr_assert_geq(fd, 0);
	cr_assert_eq(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
	close(fd);
}

/* ARENA_IO_AUTO on a file the page cache does not hold reads it with
 * O_DIRECT and leaves it out of the cache (asking which pages are cached
 * starts no read-ahead, so the disk reads each byte once: a read with
 * RWF_NOWAIT started read-ahead of up to read_ahead_kb at every piece);
 * on a cached file it reads from the cache. A model of 32 MiB in four
 * blocks (opening the image reads its first pages buffered, and the
 * kernel's read-ahead may bring a few MiB after them). */
Test(load, auto_io_reads_each_byte_once)
{
	char st_path[300], path[300];
	snprintf(st_path, sizeof(st_path), "%s/big.safetensors", dir);
	snprintf(path, sizeof(path), "%s/big.arena", dir);
	write_four_blocks(st_path, 2048, 2048, 0);
	const char *in = st_path;
	arena_convert_opts co = {.threads = 2};
	cr_assert_eq(arena_convert_inputs(&in, 1, path, &co, NULL), 0, "%s", arena_last_error());
	unlink(st_path);
	size_t total;
	drop_cached(path);
	if (cached_pages(path, &total) > total / 8)
		cr_skip_test("the page cache keeps this file (tmpfs?): nothing to check");
	arena_load_opts o = opts();
	o.io = ARENA_IO_AUTO;
	arena_model *m;
	arena_load_stats st;
	cr_assert_eq(arena_load_image(path, &o, &m, &st), 0, "%s", arena_last_error());
	arena_model_free(m);
	if (!st.direct_bytes)
		cr_skip_test("no O_DIRECT on this filesystem: nothing to check");
	size_t c = cached_pages(path, &total);
	cr_assert_lt(c, total / 2, "%zu of %zu pages of the file in the page cache after a cold load", c, total);
	cr_assert_gt(st.direct_bytes, st.file_bytes / 2, "%llu of %llu bytes O_DIRECT",
		     (unsigned long long)st.direct_bytes, (unsigned long long)st.file_bytes);
	/* cached: from the cache */
	int fd = open(path, O_RDONLY);
	uint8_t buf[65536];
	while (read(fd, buf, sizeof(buf)) > 0)
		;
	close(fd);
	cr_assert_eq(arena_load_image(path, &o, &m, &st), 0, "%s", arena_last_error());
	arena_model_free(m);
	cr_assert_eq(st.direct_bytes, 0, "%llu bytes O_DIRECT from a cached file", (unsigned long long)st.direct_bytes);
	unlink(path);
}

Test(load, some_blocks_in_host_slabs)
{
	arena_load_opts o = opts();
	uint8_t on[6] = {1, 0, 1, 0, 0, 1};
	o.on_device = on;
	arena_model *m;
	arena_load_stats st;
	cr_assert_eq(arena_load_image(img_path, &o, &m, &st), 0, "%s", arena_last_error());
	cr_assert_eq(m->layout->n_blocks, 6);
	for (int b = 0; b < 6; b++) {
		cr_assert_eq(m->mem[b].dev != NULL, on[b]);
		cr_assert_eq(m->mem[b].host != NULL, !on[b]);
		if (!on[b]) {
			cr_assert(m->mem[b].pinned, "block %d should be pinned within the budget", b);
			cr_assert_eq((uintptr_t)m->mem[b].host % 4096, 0);
		}
	}
	cr_assert_gt(st.host_bytes, 0);
	expect_image_bytes(m);
	arena_model_free(m);
	cr_assert_eq(atomic_load(&budget.used), 0);
}

/* Permissions of the mapping holding p, from /proc/self/maps ("r--p"). */
static void perms_of(const void *p, char out[5])
{
	FILE *f = fopen("/proc/self/maps", "r");
	cr_assert_not_null(f);
	char line[512];
	strcpy(out, "????");
	while (fgets(line, sizeof(line), f)) {
		unsigned long a, z;
		char perm[5];
		if (sscanf(line, "%lx-%lx %4s", &a, &z, perm) == 3 && (uintptr_t)p >= a && (uintptr_t)p < z) {
			memcpy(out, perm, 5);
			break;
		}
	}
	fclose(f);
}

Test(load, host_slabs_are_read_only_after_commit)
{
	arena_load_opts o = opts();
	uint8_t on[6] = {0, 0, 0, 0, 0, 0};
	o.on_device = on;
	arena_model *m;
	cr_assert_eq(arena_load_image(img_path, &o, &m, NULL), 0);
	for (int b = 0; b < 6; b++) {
		char perm[5];
		perms_of(m->mem[b].host, perm);
		cr_assert_str_eq(perm, "r--p", "block %d slab is %s", b, perm);
	}
	arena_model_free(m);
}

Test(load, pinned_budget_smaller_than_a_block)
{
	arena_pin_budget tiny;
	arena_pin_budget_probe(&tiny, 4096, 0, "");
	arena_load_opts o = opts();
	o.budget = &tiny;
	uint8_t on[6] = {1, 0, 0, 1, 1, 0};
	o.on_device = on;
	arena_model *m;
	arena_load_stats st;
	cr_assert_eq(arena_load_image(img_path, &o, &m, &st), 0, "%s", arena_last_error());
	cr_assert_not(st.ring_pinned, "a 4 KiB budget cannot hold the ring");
	for (int b = 0; b < 6; b++)
		cr_assert_not(m->mem[b].pinned);
	expect_image_bytes(m);
	arena_model_free(m);
	cr_assert_eq(atomic_load(&tiny.used), 0);
}

/* Slabs are registered by several threads; which take the pinned budget is
 * still decided in block order: a budget that holds the ring and the first
 * two host slabs pins those two, every time. */
Test(load, pinned_budget_taken_in_block_order)
{
	uint8_t on[6] = {1, 0, 1, 0, 0, 0};
	arena_load_opts o = opts();
	o.on_device = on;
	arena_model *m;
	arena_load_stats st;
	cr_assert_eq(arena_load_image(img_path, &o, &m, &st), 0, "%s", arena_last_error());
	uint64_t want = st.ring_bytes + arena_model_host_len(m, 1) + arena_model_host_len(m, 3);
	for (int b = 1; b < 6; b++)
		cr_assert(on[b] || m->mem[b].pinned, "block %d not pinned within a large budget", b);
	arena_model_free(m);
	for (int round = 0; round < 10; round++) {
		arena_pin_budget part;
		arena_pin_budget_probe(&part, want, 0, "");
		o.budget = &part;
		cr_assert_eq(arena_load_image(img_path, &o, &m, &st), 0, "%s", arena_last_error());
		cr_assert(st.ring_pinned);
		for (int b = 0; b < 6; b++)
			cr_assert_eq(m->mem[b].pinned, b == 1 || b == 3, "round %d: block %d pinned %d", round, b,
				     m->mem[b].pinned);
		cr_assert_eq(m->pinned_bytes, want - st.ring_bytes);
		expect_image_bytes(m);
		arena_model_free(m);
		cr_assert_eq(atomic_load(&part.used), 0);
	}
}

Test(load, device_too_small)
{
	arena_backend *small;
	arena_sim_opts so = {.capacity = 100 << 10};
	cr_assert_eq(arena_backend_sim_create(&so, &small), 0);
	arena_load_opts o = opts();
	o.backend = small;
	arena_model *m = NULL;
	int rc = arena_load_image(img_path, &o, &m, NULL);
	cr_assert_eq(rc, ARENA_E(DEV_OOM), "%s", arena_last_error());
	cr_assert(strstr(arena_last_error(), "needs"), "%s", arena_last_error());
	cr_assert_null(m);
	uint64_t f, t;
	small->ops->mem_info(small, &f, &t);
	cr_assert_eq(f, t);
	arena_backend_destroy(small);
	cr_assert_eq(atomic_load(&budget.used), 0);
}

Test(load, chunk_corrupted_after_verify_is_caught_in_flight)
{
	arena_image *img;
	cr_assert_eq(arena_img_open(img_path, &img), 0);
	cr_assert_eq(arena_img_verify_data(img, 1, NULL, NULL, NULL), 0);
	uint64_t off = img->hdr.data_offset + img->layout->blocks[3].offset + 100;
	arena_img_close(img);
	int fd = open(img_path, O_RDWR);
	uint8_t x = 0x5A;
	cr_assert_eq(pwrite(fd, &x, 1, (off_t)off), 1);
	close(fd);
	arena_load_opts o = opts();
	arena_model *m = NULL;
	int rc = arena_load_image(img_path, &o, &m, NULL);
	cr_assert_eq(rc, ARENA_E(IMG_CHUNK_CHECKSUM), "%s: %s", arena_err_name(rc), arena_last_error());
	cr_assert(strstr(arena_last_error(), "caught while loading"), "%s", arena_last_error());
	cr_assert(strstr(arena_last_error(), "single_transformer_blocks.0"), "%s", arena_last_error());
	cr_assert_null(m);
	cr_assert_eq(dev_free(), 64 << 20, "device memory left after a failed load");
	cr_assert_eq(atomic_load(&budget.used), 0);
}

/* ---- padding: bytes no checksum covers, and padding under a good checksum --------- */

/* The first raw data byte of the image that is padding (in no component),
 * inside a slab or between slabs as asked, at an even offset when `even`;
 * and its chunk. */
static uint64_t padding_at(int in_slab, int even, uint64_t *chunk)
{
	arena_image *img;
	cr_assert_eq(arena_img_open(img_path, &img), 0);
	const arena_layout *l = img->layout;
	uint64_t n = img->hdr.data_length, at = UINT64_MAX;
	uint8_t *used = calloc(n, 1), *slab = calloc(n, 1);
	for (size_t b = 0; b < l->n_blocks; b++)
		memset(slab + l->blocks[b].offset, 1, l->blocks[b].bytes);
	for (size_t i = 0; i < l->n_tensors; i++)
		for (uint32_t c = 0; c < l->tensors[i].n_comp; c++)
			memset(used + l->blocks[l->tensors[i].block].offset + l->tensors[i].comp[c].offset, 1,
			       l->tensors[i].comp[c].bytes);
	for (uint64_t k = 0; k < n && at == UINT64_MAX; k++)
		if (!used[k] && slab[k] == in_slab && (!even || k % 2 == 0))
			at = k;
	cr_assert_neq(at, UINT64_MAX);
	*chunk = at / img->hdr.chunk_size;
	free(used);
	free(slab);
	arena_img_close(img);
	return at;
}

/* Rewrite chunk i's checksum in the chunk table as the hash of its stored
 * bytes, then the chunk table's and the header's checksums. */
static void reseal(uint64_t i)
{
	int fd = open(img_path, O_RDWR);
	uint8_t page[4096];
	cr_assert_eq(pread(fd, page, 4096, 0), 4096);
	arena_img_header h;
	struct stat sb;
	fstat(fd, &sb);
	cr_assert_eq(arena_img_header_decode(page, (uint64_t)sb.st_size, "t", &h), 0);
	uint8_t *table = malloc(h.chunk_table_length);
	cr_assert_eq(pread(fd, table, h.chunk_table_length, (off_t)h.chunk_table_offset), (ssize_t)h.chunk_table_length);
	uint8_t *e = table + i * 32;
	uint64_t off = 0, stored = e[8] | e[9] << 8 | e[10] << 16 | (uint64_t)e[11] << 24;
	for (int k = 7; k >= 0; k--)
		off = off << 8 | e[k];
	uint8_t *b = malloc(stored);
	cr_assert_eq(pread(fd, b, stored, (off_t)(h.data_offset + off)), (ssize_t)stored);
	put64le(e + 16, XXH3_64bits(b, stored));
	h.chunk_table_xxh3 = XXH3_64bits(table, h.chunk_table_length);
	arena_img_header_encode(&h, page);
	cr_assert_eq(pwrite(fd, table, h.chunk_table_length, (off_t)h.chunk_table_offset), (ssize_t)h.chunk_table_length);
	cr_assert_eq(pwrite(fd, page, 4096, 0), 4096);
	close(fd);
	free(b);
	free(table);
}

/* The load fails with IMG_PADDING naming `what`, and leaves nothing behind. */
static void expect_padding_refused(arena_load_opts *o, const char *what)
{
	arena_model *m = NULL;
	int rc = arena_load_image(img_path, o, &m, NULL);
	cr_assert_eq(rc, ARENA_E(IMG_PADDING), "%s: %s", arena_err_name(rc), arena_last_error());
	cr_assert(strstr(arena_last_error(), img_path) && strstr(arena_last_error(), what), "want '%s' in: %s", what,
		  arena_last_error());
	cr_assert_null(m);
	cr_assert_eq(dev_free(), 64 << 20);
	cr_assert_eq(atomic_load(&budget.used), 0);
}

Test(load, raw_padding_not_zero_is_refused)
{
	/* Padding between two components of a slab, under a good checksum. */
	uint64_t chunk, at = padding_at(1, 0, &chunk);
	arena_image *img;
	cr_assert_eq(arena_img_open(img_path, &img), 0);
	uint64_t f = img->hdr.data_offset + at;
	arena_img_close(img);
	int fd = open(img_path, O_RDWR);
	uint8_t x = 0x5A;
	cr_assert_eq(pwrite(fd, &x, 1, (off_t)f), 1);
	close(fd);
	reseal(chunk);
	char what[96];
	snprintf(what, sizeof(what), "chunk %llu: data byte %llu", (unsigned long long)chunk, (unsigned long long)at);
	int modes[] = {ARENA_IO_BUFFERED, ARENA_IO_DIRECT};
	for (int k = 0; k < 2; k++) {
		arena_load_opts o = opts();
		o.io = modes[k];
		expect_padding_refused(&o, what);
	}
}

Test(load, truncated_image)
{
	cr_assert_eq(truncate(img_path, 200000), 0);
	arena_load_opts o = opts();
	arena_model *m = NULL;
	cr_assert_eq(arena_load_image(img_path, &o, &m, NULL), ARENA_E(IMG_TRUNCATED));
	cr_assert_null(m);
}

Test(load, cancelled)
{
	volatile sig_atomic_t stop = 1;
	arena_load_opts o = opts();
	o.cancel = &stop;
	arena_model *m = NULL;
	cr_assert_eq(arena_load_image(img_path, &o, &m, NULL), ARENA_E_CANCELLED);
	cr_assert_null(m);
	cr_assert_eq(dev_free(), 64 << 20);
}

/* Loads of img_path with the nth allocation failing, n = 1, 2, ...: NOMEM
 * (or whole: an allocation jansson survived) and nothing left behind
 * (device memory, the pinned budget, the library's allocations beyond what
 * a whole load keeps), until a load makes fewer than n allocations: whole. */
static void load_alloc_faults(const arena_load_opts *o)
{
	arena_model *m0 = NULL; /* a whole load first: what the library makes once and keeps is made */
	cr_assert_eq(arena_load_image(img_path, o, &m0, NULL), 0, "%s", arena_last_error());
	arena_model_free(m0);
	const long live = arena_alloc_live();
	long n;
	for (n = 1; n < 100000; n++) {
		arena_model *m = NULL;
		arena_fault_alloc(n);
		int rc = arena_load_image(img_path, o, &m, NULL);
		int fired = arena_fault_alloc_fired();
		arena_fault_alloc(0);
		if (!fired) {
			cr_assert_eq(rc, 0, "%s", arena_last_error());
			arena_model_free(m);
			break;
		}
		if (rc == 0) { /* a failure jansson survived */
			arena_model_free(m);
			continue;
		}
		cr_assert_eq(rc, ARENA_E_NOMEM, "n=%ld: %s: %s", n, arena_err_name(rc), arena_last_error());
		cr_assert_null(m);
		cr_assert_eq(dev_free(), 64 << 20, "n=%ld left device memory", n);
		cr_assert_eq(atomic_load(&budget.used), 0, "n=%ld left pinned memory", n);
		cr_assert_eq(arena_alloc_live(), live, "n=%ld leaked", n);
	}
	cr_assert_gt(n, 20);
}

/* The same with the nth read failing: IO, nothing left behind, until a load
 * makes fewer reads: whole, every byte the image's. */
static void load_read_faults(const arena_load_opts *o)
{
	long n;
	for (n = 1; n < 200; n++) {
		arena_model *m = NULL;
		arena_fault_read(n);
		int rc = arena_load_image(img_path, o, &m, NULL);
		arena_fault_read(0);
		if (rc == 0) {
			expect_image_bytes(m);
			arena_model_free(m);
			break;
		}
		cr_assert_eq(rc, ARENA_E_IO, "n=%ld: %s", n, arena_last_error());
		cr_assert_null(m);
		cr_assert_eq(dev_free(), 64 << 20);
		cr_assert_eq(atomic_load(&budget.used), 0);
	}
	cr_assert_gt(n, 3);
}

/* A load cancelled before it starts, and one of the image cut at `cut`:
 * CANCELLED, IMG_TRUNCATED, nothing made. */
static void load_truncated_and_cancelled(off_t cut)
{
	arena_load_opts o = opts();
	arena_model *m = NULL;
	volatile sig_atomic_t stop = 1;
	o.cancel = &stop;
	cr_assert_eq(arena_load_image(img_path, &o, &m, NULL), ARENA_E_CANCELLED);
	cr_assert_null(m);
	cr_assert_eq(dev_free(), 64 << 20);
	cr_assert_eq(truncate(img_path, cut), 0);
	o.cancel = NULL;
	cr_assert_eq(arena_load_image(img_path, &o, &m, NULL), ARENA_E(IMG_TRUNCATED));
	cr_assert_null(m);
}

Test(load, read_failures_at_each_step)
{
	arena_load_opts o = every_other_opts(ARENA_IO_BUFFERED);
	load_read_faults(&o);
}

Test(load, allocation_failures_at_each_step)
{
	slow_test();
	arena_load_opts o = every_other_opts(ARENA_IO_AUTO);
	load_alloc_faults(&o);
}

Test(load, safetensors_destination_first)
{
	arena_load_opts o = opts();
	uint8_t on[6] = {1, 1, 0, 1, 0, 1};
	o.on_device = on;
	const char *in = fixture_path("tiny_flux.safetensors");
	arena_model *m;
	arena_load_stats st;
	cr_assert_eq(arena_load_safetensors(&in, 1, NULL, &o, &m, &st), 0, "%s", arena_last_error());
	arena_st_file *f;
	cr_assert_eq(arena_st_open(in, &f), 0);
	cr_assert_eq(m->layout->n_tensors, f->n_tensors);
	for (size_t i = 0; i < m->layout->n_tensors; i++) {
		const arena_tensor *t = &m->layout->tensors[i];
		const arena_st_tensor *s = arena_st_find(f, t->name);
		cr_assert_not_null(s);
		uint8_t *got = malloc(s->nbytes + 1);
		const arena_block_mem *bm = &m->mem[t->block];
		if (bm->dev)
			cr_assert_eq(be->ops->copy_d2h_sync(be, got, (uint8_t *)bm->dev + t->comp[0].offset, s->nbytes), 0);
		else
			memcpy(got, bm->host + t->comp[0].offset, s->nbytes);
		cr_assert(memcmp(got, arena_st_data(s), s->nbytes) == 0, "tensor %s differs", t->name);
		free(got);
	}
	arena_st_close(f);
	/* Same blocks as the image, by name and order. */
	arena_image *img;
	cr_assert_eq(arena_img_open(img_path, &img), 0);
	for (size_t b = 0; b < img->layout->n_blocks; b++)
		cr_assert_str_eq(img->layout->blocks[b].name, m->layout->blocks[b].name);
	arena_img_close(img);
	arena_model_free(m);
	cr_assert_eq(dev_free(), 64 << 20);
}

/* Quantized while loading: the component bytes equal those of an image
 * converted with the same scheme, on the device and in host slabs. */
Test(load, safetensors_quantized_on_the_way)
{
	const char *in = fixture_path("tiny_flux.safetensors");
	char qimg[320];
	snprintf(qimg, sizeof(qimg), "%s/q.arena", dir);
	arena_convert_opts co = {.threads = 1, .quant = {.scheme = "fp8-e4m3-row"}};
	cr_assert_eq(arena_convert_inputs(&in, 1, qimg, &co, NULL), 0, "%s", arena_last_error());
	arena_quant_opts q = {.scheme = "fp8-e4m3-row"};
	arena_load_opts o = opts();
	o.quant = &q;
	o.slot_bytes = 4096; /* components span several slots */
	uint8_t on[6] = {1, 0, 1, 0, 1, 0};
	o.on_device = on;
	arena_model *m;
	cr_assert_eq(arena_load_safetensors(&in, 1, NULL, &o, &m, NULL), 0, "%s", arena_last_error());
	arena_image *img;
	cr_assert_eq(arena_img_open(qimg, &img), 0);
	cr_assert_eq(img->layout->n_tensors, m->layout->n_tensors);
	size_t nq = 0;
	for (size_t i = 0; i < m->layout->n_tensors; i++) {
		const arena_tensor *t = &m->layout->tensors[i], *it = &img->layout->tensors[i];
		cr_assert_str_eq(t->name, it->name);
		cr_assert_str_eq(t->scheme, it->scheme);
		nq += strcmp(t->scheme, "none") != 0;
		const arena_block_mem *bm = &m->mem[t->block];
		for (uint32_t c = 0; c < t->n_comp; c++) {
			uint64_t len = t->comp[c].bytes;
			uint8_t *got = malloc(len + 1), *want = malloc(len + 1);
			if (bm->dev)
				cr_assert_eq(be->ops->copy_d2h_sync(be, got, (uint8_t *)bm->dev + t->comp[c].offset, len), 0);
			else
				memcpy(got, bm->host + t->comp[c].offset, len);
			cr_assert_eq(arena_pread_full(img->fd, want, len,
						      img->hdr.data_offset + img->layout->blocks[it->block].offset + it->comp[c].offset,
						      "img"),
				     0);
			cr_assert(memcmp(got, want, len) == 0, "tensor %s component %s differs", t->name, t->comp[c].name);
			free(got);
			free(want);
		}
	}
	cr_assert_gt(nq, 40);
	arena_img_close(img);
	unlink(qimg);
	arena_model_free(m);
	cr_assert_eq(dev_free(), 64 << 20);
	cr_assert_eq(atomic_load(&budget.used), 0);
}

/* ---- coded images (hb4): decoded by the device, or by the CPU ------------------ */

static void setup_coded(void)
{
	tmpdir_make(dir, sizeof(dir), "test-load");
	snprintf(img_path, sizeof(img_path), "%s/c.arena", dir);
	const char *in = fixture_path("tiny_flux.safetensors");
	arena_convert_opts co = {.chunk_size = 64 << 10, .threads = 2, .codec = ARENA_CODEC_HB4};
	arena_convert_result res;
	cr_assert_eq(arena_convert_inputs(&in, 1, img_path, &co, &res), 0, "%s", arena_last_error());
	cr_assert_eq(res.coded_chunks, res.chunk_count, "tiny_flux's chunks should all be coded");
	arena_sim_opts so = {.capacity = 64 << 20};
	cr_assert_eq(arena_backend_sim_create(&so, &be), 0);
	arena_pin_budget_probe(&budget, 256 << 20, 0, "");
}

TestSuite(load_coded, .init = setup_coded, .fini = teardown);

Test(load_coded, decoded_by_the_device)
{
	arena_load_opts o = opts();
	arena_model *m;
	arena_load_stats st;
	cr_assert_eq(arena_load_image(img_path, &o, &m, &st), 0, "%s", arena_last_error());
	cr_assert_eq(st.host_bytes, 0);
	cr_assert_gt(st.gpu_decoded, st.dev_bytes * 9 / 10, "%llu of %llu", (unsigned long long)st.gpu_decoded,
		     (unsigned long long)st.dev_bytes);
	cr_assert_eq(st.cpu_decoded, 0);
	cr_assert_lt(st.file_bytes, st.dev_bytes, "a coded image reads fewer bytes than it delivers");
	expect_image_bytes(m);
	arena_model_free(m);
	cr_assert_eq(dev_free(), 64 << 20, "device memory (stage slots) left allocated");
	cr_assert_eq(atomic_load(&budget.used), 0);
}

Test(load_coded, io_modes_and_threads_give_the_same_bytes)
{
	int modes[] = {ARENA_IO_BUFFERED, ARENA_IO_DIRECT, ARENA_IO_AUTO};
	for (int k = 0; k < 3; k++) {
		arena_load_opts o = opts();
		o.io = modes[k];
		o.threads = (unsigned)k * 2 + 1;
		o.slots_per_thread = (unsigned)k + 2;
		arena_model *m;
		cr_assert_eq(arena_load_image(img_path, &o, &m, NULL), 0, "%s", arena_last_error());
		expect_image_bytes(m);
		arena_model_free(m);
	}
}

Test(load_coded, host_slabs_decoded_by_the_cpu)
{
	arena_load_opts o = opts();
	uint8_t on[6] = {1, 0, 1, 0, 0, 1};
	o.on_device = on;
	arena_model *m;
	arena_load_stats st;
	cr_assert_eq(arena_load_image(img_path, &o, &m, &st), 0, "%s", arena_last_error());
	/* Chunks that reach a host slab are decoded by the CPU (for this small
	 * model, every chunk reaches one). */
	cr_assert_gt(st.cpu_decoded, st.host_bytes - 1);
	cr_assert_eq(st.cpu_decoded + st.gpu_decoded, st.dev_bytes + st.host_bytes);
	for (int b = 0; b < 6; b++)
		if (!on[b]) {
			char perm[5];
			perms_of(m->mem[b].host, perm);
			cr_assert_str_eq(perm, "r--p");
		}
	expect_image_bytes(m);
	arena_model_free(m);
	cr_assert_eq(atomic_load(&budget.used), 0);
}

Test(load_coded, no_device_room_for_stage_slots)
{
	/* A device the model fills exactly: no room for the stage slots, so the
	 * CPU decodes and the raw bytes are copied. */
	arena_load_opts o = opts();
	arena_model *m;
	cr_assert_eq(arena_load_image(img_path, &o, &m, NULL), 0);
	uint64_t need = (64 << 20) - dev_free();
	arena_model_free(m);
	arena_backend *tight;
	arena_sim_opts so = {.capacity = need};
	cr_assert_eq(arena_backend_sim_create(&so, &tight), 0);
	o.backend = tight;
	arena_load_stats st;
	cr_assert_eq(arena_load_image(img_path, &o, &m, &st), 0, "%s", arena_last_error());
	cr_assert_eq(st.gpu_decoded, 0);
	cr_assert_eq(st.cpu_decoded, st.dev_bytes);
	arena_backend *keep = be;
	be = tight; /* expect_image_bytes reads through be */
	expect_image_bytes(m);
	be = keep;
	arena_model_free(m);
	uint64_t f, t;
	tight->ops->mem_info(tight, &f, &t);
	cr_assert_eq(f, t);
	arena_backend_destroy(tight);
}

Test(load_coded, pinned_budget_smaller_than_a_chunk)
{
	arena_pin_budget tiny;
	arena_pin_budget_probe(&tiny, 4096, 0, "");
	arena_load_opts o = opts();
	o.budget = &tiny;
	uint8_t on[6] = {1, 0, 0, 1, 1, 0};
	o.on_device = on;
	arena_model *m;
	arena_load_stats st;
	cr_assert_eq(arena_load_image(img_path, &o, &m, &st), 0, "%s", arena_last_error());
	cr_assert_not(st.ring_pinned);
	expect_image_bytes(m);
	arena_model_free(m);
	cr_assert_eq(atomic_load(&tiny.used), 0);
}

/* The stored offset of the first coded chunk with exceptions, its entry. */
static void first_coded_chunk(uint64_t *entry_at, uint64_t *stored_at, arena_hb4 *v, uint8_t **stored)
{
	arena_image *img;
	cr_assert_eq(arena_img_open(img_path, &img), 0);
	for (uint64_t i = 0; i < img->hdr.chunk_count; i++) {
		const arena_img_chunk *c = &img->chunks[i];
		if (c->codec != ARENA_CODEC_HB4)
			continue;
		uint8_t *b = malloc(c->stored_length);
		cr_assert_eq(arena_pread_full(img->fd, b, c->stored_length, img->hdr.data_offset + c->offset, "i"), 0);
		cr_assert_eq(arena_hb4_parse(b, c->stored_length, c->raw_length, "t", v), 0);
		if (!v->n_exc) {
			free(b);
			continue;
		}
		*entry_at = img->hdr.chunk_table_offset + i * 32;
		*stored_at = img->hdr.data_offset + c->offset;
		*stored = b;
		arena_img_close(img);
		return;
	}
	cr_assert_fail("no coded chunk with exceptions");
}

Test(load_coded, chunk_corrupted_after_verify_is_caught_in_flight)
{
	uint64_t entry, at;
	arena_hb4 v;
	uint8_t *b;
	first_coded_chunk(&entry, &at, &v, &b);
	free(b);
	int fd = open(img_path, O_RDWR);
	uint8_t x;
	cr_assert_eq(pread(fd, &x, 1, (off_t)(at + 100)), 1);
	x ^= 0x5A;
	cr_assert_eq(pwrite(fd, &x, 1, (off_t)(at + 100)), 1);
	close(fd);
	arena_load_opts o = opts();
	arena_model *m = NULL;
	int rc = arena_load_image(img_path, &o, &m, NULL);
	cr_assert_eq(rc, ARENA_E(IMG_CHUNK_CHECKSUM), "%s: %s", arena_err_name(rc), arena_last_error());
	cr_assert(strstr(arena_last_error(), "caught while loading"), "%s", arena_last_error());
	cr_assert_null(m);
	cr_assert_eq(dev_free(), 64 << 20);
	cr_assert_eq(atomic_load(&budget.used), 0);
}

Test(load_coded, malformed_chunk_under_a_good_checksum_is_refused)
{
	/* An exception index past the chunk, with every checksum resealed: a
	 * decoder that trusted it would write outside the slab. */
	uint64_t entry, at;
	arena_hb4 v;
	uint8_t *b;
	first_coded_chunk(&entry, &at, &v, &b);
	uint32_t bad = (uint32_t)(v.words + 1000);
	memcpy(b + v.idx_off + 4 * (v.n_exc - 1), &bad, 4);
	uint64_t stored = v.hi_off + v.n_exc;
	int fd = open(img_path, O_RDWR);
	cr_assert_eq(pwrite(fd, b, stored, (off_t)at), (ssize_t)stored);
	/* Chunk checksum, chunk table checksum, header checksum. */
	uint8_t e[32], page[4096];
	cr_assert_eq(pread(fd, e, 32, (off_t)entry), 32);
	put64le(e + 16, XXH3_64bits(b, stored));
	cr_assert_eq(pwrite(fd, e, 32, (off_t)entry), 32);
	cr_assert_eq(pread(fd, page, 4096, 0), 4096);
	arena_img_header h;
	struct stat sb;
	fstat(fd, &sb);
	cr_assert_eq(arena_img_header_decode(page, (uint64_t)sb.st_size, "t", &h), 0);
	uint8_t *table = malloc(h.chunk_table_length);
	cr_assert_eq(pread(fd, table, h.chunk_table_length, (off_t)h.chunk_table_offset), (ssize_t)h.chunk_table_length);
	h.chunk_table_xxh3 = XXH3_64bits(table, h.chunk_table_length);
	arena_img_header_encode(&h, page);
	cr_assert_eq(pwrite(fd, page, 4096, 0), 4096);
	close(fd);
	free(table);
	free(b);
	arena_load_opts o = opts();
	arena_model *m = NULL;
	int rc = arena_load_image(img_path, &o, &m, NULL);
	cr_assert_eq(rc, ARENA_E(IMG_CHUNK_BAD), "%s: %s", arena_err_name(rc), arena_last_error());
	cr_assert(strstr(arena_last_error(), "exception"), "%s", arena_last_error());
	cr_assert_null(m);
	cr_assert_eq(dev_free(), 64 << 20);
	cr_assert_eq(atomic_load(&budget.used), 0);
}

/* Each way a coded chunk is read: streamed to the device stage and decoded
 * there (all blocks on the device), or read whole and decoded by the CPU
 * (chunks that reach a host slab; a device without room for the stage). */
static void every_coded_path_refuses(const char *what)
{
	arena_load_opts o = opts();
	expect_padding_refused(&o, what);
	o.io = ARENA_IO_DIRECT;
	o.slot_bytes = 4096; /* a chunk in many slots, its stored padding in the last */
	expect_padding_refused(&o, what);
	o = opts();
	uint8_t on[6] = {1, 0, 1, 0, 0, 1};
	o.on_device = on;
	expect_padding_refused(&o, what);
}

Test(load_coded, stored_padding_flipped_is_refused)
{
	/* The bytes after a chunk's stored bytes are in no checksum. */
	arena_image *img;
	cr_assert_eq(arena_img_open(img_path, &img), 0);
	uint64_t c = 0;
	while (c < img->hdr.chunk_count && img->chunks[c].stored_length % 4096 == 0)
		c++;
	cr_assert_lt(c, img->hdr.chunk_count);
	uint64_t f = img->hdr.data_offset + img->chunks[c].offset + img->chunks[c].stored_length + 7;
	arena_img_close(img);
	int fd = open(img_path, O_RDWR);
	uint8_t x = 0x01;
	cr_assert_eq(pwrite(fd, &x, 1, (off_t)f), 1);
	close(fd);
	char what[96];
	snprintf(what, sizeof(what), "chunk %llu: file byte %llu", (unsigned long long)c, (unsigned long long)f);
	every_coded_path_refuses(what);
}

Test(load_coded, raw_padding_not_zero_is_refused)
{
	/* A padding word between two slabs made non-zero in the stored planes of
	 * its hb4 chunk, the chunk's checksum resealed. */
	uint64_t chunk, at = padding_at(0, 1, &chunk);
	arena_image *img;
	cr_assert_eq(arena_img_open(img_path, &img), 0);
	const arena_img_chunk *c = &img->chunks[chunk];
	cr_assert_eq(c->codec, ARENA_CODEC_HB4);
	uint8_t *b = malloc(c->stored_length);
	uint64_t st = img->hdr.data_offset + c->offset;
	cr_assert_eq(arena_pread_full(img->fd, b, c->stored_length, st, "t"), 0);
	arena_hb4 v;
	cr_assert_eq(arena_hb4_parse(b, c->stored_length, c->raw_length, "t", &v), 0);
	uint64_t low = st + v.low_off + (at - chunk * img->hdr.chunk_size) / 2;
	arena_img_close(img);
	free(b);
	int fd = open(img_path, O_RDWR);
	uint8_t x = 0x5A;
	cr_assert_eq(pwrite(fd, &x, 1, (off_t)low), 1);
	close(fd);
	reseal(chunk);
	char what[96];
	snprintf(what, sizeof(what), "chunk %llu: data byte %llu", (unsigned long long)chunk, (unsigned long long)at);
	every_coded_path_refuses(what);
}

Test(load_coded, truncated_and_cancelled)
{
	load_truncated_and_cancelled(150000);
}

Test(load_coded, read_and_allocation_failures_at_each_step)
{
	slow_test();
	arena_load_opts o = every_other_opts(ARENA_IO_BUFFERED);
	load_read_faults(&o);
	load_alloc_faults(&o);
}

/* A model of four 320 KiB bf16 blocks (weights-like values), coded in 64 KiB
 * chunks: chunks inside a device block stream to the device and are decoded
 * there, chunks that reach a host slab are decoded by the CPU. */
Test(load_coded, device_and_host_blocks_in_one_model)
{
	char st_path[300], c_path[300];
	snprintf(st_path, sizeof(st_path), "%s/m.safetensors", dir);
	snprintf(c_path, sizeof(c_path), "%s/m.arena", dir);
	write_four_blocks(st_path, 320, 512, 1);
	const char *in = st_path;
	arena_convert_opts co = {.chunk_size = 64 << 10, .threads = 2, .codec = ARENA_CODEC_HB4};
	arena_convert_result res;
	cr_assert_eq(arena_convert_inputs(&in, 1, c_path, &co, &res), 0, "%s", arena_last_error());
	cr_assert_eq(res.coded_chunks, res.chunk_count);
	unlink(img_path); /* teardown removes the image at img_path */
	snprintf(img_path, sizeof(img_path), "%s", c_path);
	arena_load_opts o = opts();
	uint8_t on[4] = {1, 0, 1, 0};
	o.on_device = on;
	arena_model *m;
	arena_load_stats st;
	cr_assert_eq(arena_load_image(img_path, &o, &m, &st), 0, "%s", arena_last_error());
	cr_assert_eq(m->layout->n_blocks, 4);
	cr_assert_gt(st.gpu_decoded, 0);
	cr_assert_gt(st.cpu_decoded, 0);
	cr_assert_eq(st.cpu_decoded + st.gpu_decoded, st.dev_bytes + st.host_bytes);
	expect_image_bytes(m);
	arena_model_free(m);
	/* And all on the device, several thread counts. */
	for (unsigned t = 1; t <= 3; t++) {
		o = opts();
		o.threads = t;
		cr_assert_eq(arena_load_image(img_path, &o, &m, &st), 0, "%s", arena_last_error());
		cr_assert_eq(st.cpu_decoded, 0);
		expect_image_bytes(m);
		arena_model_free(m);
	}
	unlink(st_path);
	cr_assert_eq(dev_free(), 64 << 20);
	cr_assert_eq(atomic_load(&budget.used), 0);
}

/* ---- zstd images: decoded by the reader threads, on the CPU ---------------------- */

static void setup_zstd(void)
{
	tmpdir_make(dir, sizeof(dir), "test-load");
	snprintf(img_path, sizeof(img_path), "%s/z.arena", dir);
	const char *in = fixture_path("tiny_flux.safetensors");
	arena_convert_opts co = {.chunk_size = 64 << 10, .threads = 2, .codec = ARENA_CODEC_ZSTD};
	arena_convert_result res;
	cr_assert_eq(arena_convert_inputs(&in, 1, img_path, &co, &res), 0, "%s", arena_last_error());
	cr_assert_eq(res.coded_chunks, res.chunk_count, "tiny_flux's chunks should all be coded");
	arena_sim_opts so = {.capacity = 64 << 20};
	cr_assert_eq(arena_backend_sim_create(&so, &be), 0);
	arena_pin_budget_probe(&budget, 256 << 20, 0, "");
}

TestSuite(load_zstd, .init = setup_zstd, .fini = teardown);

Test(load_zstd, decoded_by_the_readers_through_the_ring)
{
	arena_load_opts o = opts();
	o.slot_bytes = 16 << 10; /* a chunk's raw bytes in four slots */
	arena_model *m;
	arena_load_stats st;
	cr_assert_eq(arena_load_image(img_path, &o, &m, &st), 0, "%s", arena_last_error());
	cr_assert_eq(st.host_bytes, 0);
	cr_assert_eq(st.gpu_decoded, 0, "zstd is decoded by the CPU");
	cr_assert_eq(st.cpu_decoded, st.dev_bytes);
	cr_assert_lt(st.file_bytes, st.dev_bytes * 3 / 4, "a zstd image reads fewer bytes than it delivers");
	cr_assert_gt(st.cpu_decode_s, 0);
	cr_assert_geq(st.cpu_decode_s, st.w_decode * 0.999);
	cr_assert(st.ring_pinned);
	expect_image_bytes(m);
	arena_model_free(m);
	cr_assert_eq(dev_free(), 64 << 20, "device memory left allocated");
	cr_assert_eq(atomic_load(&budget.used), 0);
}

Test(load_zstd, io_modes_threads_and_slots_give_the_same_bytes)
{
	int modes[] = {ARENA_IO_BUFFERED, ARENA_IO_DIRECT, ARENA_IO_AUTO};
	for (int k = 0; k < 3; k++)
		for (uint64_t slot = 4096; slot <= (1u << 20); slot *= 16) {
			arena_load_opts o = opts();
			o.io = modes[k];
			o.threads = (unsigned)k * 2 + 1;
			o.slots_per_thread = (unsigned)k + 2;
			o.slot_bytes = slot;
			arena_model *m;
			cr_assert_eq(arena_load_image(img_path, &o, &m, NULL), 0, "%s", arena_last_error());
			expect_image_bytes(m);
			arena_model_free(m);
		}
	cr_assert_eq(dev_free(), 64 << 20);
}

/* Pieces of one chunk (each chunk read alone), of two and of the default
 * size (a piece's chunks read in one): the same bytes. */
Test(load_zstd, read_alone_or_a_piece_at_once)
{
	const char *sizes[] = {"64K", "128K", "192K", NULL};
	for (int k = 0; k < 4; k++) {
		if (sizes[k])
			setenv("ARENA_LOAD_PIECE", sizes[k], 1);
		else
			unsetenv("ARENA_LOAD_PIECE");
		arena_load_opts o = opts();
		o.threads = 3;
		o.io = k & 1 ? ARENA_IO_DIRECT : ARENA_IO_AUTO;
		arena_model *m;
		arena_load_stats st;
		cr_assert_eq(arena_load_image(img_path, &o, &m, &st), 0, "%s: %s", sizes[k], arena_last_error());
		cr_assert_lt(st.file_bytes, st.dev_bytes * 3 / 4);
		expect_image_bytes(m);
		arena_model_free(m);
	}
	unsetenv("ARENA_LOAD_PIECE");
	cr_assert_eq(dev_free(), 64 << 20);
}

Test(load_zstd, host_slabs_and_device_blocks)
{
	arena_load_opts o = opts();
	uint8_t on[6] = {1, 0, 1, 0, 0, 1};
	o.on_device = on;
	arena_model *m;
	arena_load_stats st;
	cr_assert_eq(arena_load_image(img_path, &o, &m, &st), 0, "%s", arena_last_error());
	cr_assert_gt(st.host_bytes, 0);
	cr_assert_eq(st.cpu_decoded, st.dev_bytes + st.host_bytes);
	for (int b = 0; b < 6; b++)
		if (!on[b]) {
			char perm[5];
			perms_of(m->mem[b].host, perm);
			cr_assert_str_eq(perm, "r--p");
		}
	expect_image_bytes(m);
	arena_model_free(m);
	cr_assert_eq(dev_free(), 64 << 20);
	cr_assert_eq(atomic_load(&budget.used), 0);
}

Test(load_zstd, a_device_the_model_fills_and_a_tiny_pinned_budget)
{
	/* No device memory is taken for decoding: a device exactly the model's
	 * size loads it; a pinned budget smaller than a chunk leaves the ring
	 * pageable. */
	arena_load_opts o = opts();
	arena_model *m;
	cr_assert_eq(arena_load_image(img_path, &o, &m, NULL), 0);
	uint64_t need = (64 << 20) - dev_free();
	arena_model_free(m);
	arena_backend *tight;
	arena_sim_opts so = {.capacity = need};
	cr_assert_eq(arena_backend_sim_create(&so, &tight), 0);
	arena_pin_budget tiny;
	arena_pin_budget_probe(&tiny, 4096, 0, "");
	o.backend = tight;
	o.budget = &tiny;
	arena_load_stats st;
	cr_assert_eq(arena_load_image(img_path, &o, &m, &st), 0, "%s", arena_last_error());
	cr_assert_not(st.ring_pinned);
	cr_assert_eq(st.cpu_decoded, st.dev_bytes);
	arena_backend *keep = be;
	be = tight;
	expect_image_bytes(m);
	be = keep;
	arena_model_free(m);
	arena_backend_destroy(tight);
	cr_assert_eq(atomic_load(&tiny.used), 0);
}

/* Chunk c's entry and stored bytes, parsed as zstd. */
static uint8_t *zstd_chunk_at(uint64_t c, arena_zstd *v, uint64_t *stored_at)
{
	arena_image *img;
	cr_assert_eq(arena_img_open(img_path, &img), 0);
	const arena_img_chunk *ck = &img->chunks[c];
	cr_assert_eq(ck->codec, ARENA_CODEC_ZSTD);
	uint8_t *b = malloc(ck->stored_length);
	*stored_at = img->hdr.data_offset + ck->offset;
	cr_assert_eq(arena_pread_full(img->fd, b, ck->stored_length, *stored_at, "t"), 0);
	cr_assert_eq(arena_zstd_parse(b, ck->stored_length, ck->raw_length, "t", v), 0, "%s", arena_last_error());
	arena_img_close(img);
	return b;
}

Test(load_zstd, chunk_corrupted_after_verify_is_caught_in_flight)
{
	arena_zstd v;
	uint64_t at;
	free(zstd_chunk_at(1, &v, &at));
	int fd = open(img_path, O_RDWR);
	uint8_t x;
	cr_assert_eq(pread(fd, &x, 1, (off_t)(at + 100)), 1);
	x ^= 0x5A;
	cr_assert_eq(pwrite(fd, &x, 1, (off_t)(at + 100)), 1);
	close(fd);
	arena_load_opts o = opts();
	arena_model *m = NULL;
	int rc = arena_load_image(img_path, &o, &m, NULL);
	cr_assert_eq(rc, ARENA_E(IMG_CHUNK_CHECKSUM), "%s: %s", arena_err_name(rc), arena_last_error());
	cr_assert(strstr(arena_last_error(), "chunk 1 ") && strstr(arena_last_error(), "caught while loading"), "%s",
		  arena_last_error());
	cr_assert_null(m);
	cr_assert_eq(dev_free(), 64 << 20);
	cr_assert_eq(atomic_load(&budget.used), 0);
}

Test(load_zstd, malformed_chunk_under_a_good_checksum_is_refused)
{
	/* A packed stream replaced by a frame that declares the stream's size but
	 * holds a quarter of it, zeros after it, checksums resealed: refused
	 * before a byte reaches the device (the bounded decode of such frames in
	 * exactly their own bytes: codec_zstd/lying_frame_headers_decode_bounded). */
	arena_zstd v;
	uint64_t at;
	uint8_t *b = zstd_chunk_at(2, &v, &at);
	unsigned k = v.packed & 2 ? 1 : 0;
	cr_assert(v.packed >> k & 1, "the test needs a packed stream");
	uint8_t *plane = malloc(v.n), *frame = malloc(ZSTD_compressBound(v.n));
	memset(plane, 0x3c, v.n);
	size_t fl = ZSTD_compress(frame, ZSTD_compressBound(v.n), plane, v.n / 4, 1);
	cr_assert(!ZSTD_isError(fl) && fl <= v.len[k]);
	/* The 2-byte content size field after a single-segment header byte. */
	cr_assert_eq(frame[4] >> 5, 3, "a frame with a 2-byte content size and no window byte");
	frame[5] = (uint8_t)(v.n - 256), frame[6] = (uint8_t)((v.n - 256) >> 8);
	memset(b + v.off[k], 0, v.len[k]);
	memcpy(b + v.off[k], frame, fl);
	int fd = open(img_path, O_RDWR);
	cr_assert_eq(pwrite(fd, b + v.off[k], v.len[k], (off_t)(at + v.off[k])), (ssize_t)v.len[k]);
	close(fd);
	reseal(2);
	arena_load_opts o = opts();
	arena_model *m = NULL;
	int rc = arena_load_image(img_path, &o, &m, NULL);
	cr_assert_eq(rc, ARENA_E(IMG_CHUNK_BAD), "%s: %s", arena_err_name(rc), arena_last_error());
	cr_assert(strstr(arena_last_error(), "chunk 2 (file bytes"), "%s", arena_last_error());
	cr_assert_null(m);
	cr_assert_eq(dev_free(), 64 << 20);
	cr_assert_eq(atomic_load(&budget.used), 0);
	free(plane);
	free(frame);
	free(b);
}

Test(load_zstd, truncated_and_cancelled)
{
	load_truncated_and_cancelled(100000);
}

Test(load_zstd, read_and_allocation_failures_at_each_step)
{
	slow_test();
	arena_load_opts o = every_other_opts(ARENA_IO_BUFFERED);
	load_read_faults(&o);
	load_alloc_faults(&o);
}

/* Four 320 KiB bf16 blocks, coded with zstd in 64 KiB chunks, two of them
 * on the device: the same bytes for any number of threads. */
Test(load_zstd, device_and_host_blocks_of_a_larger_model)
{
	char st_path[300], z_path[300];
	snprintf(st_path, sizeof(st_path), "%s/m.safetensors", dir);
	snprintf(z_path, sizeof(z_path), "%s/m.arena", dir);
	write_four_blocks(st_path, 320, 512, 1);
	const char *in = st_path;
	arena_convert_opts co = {.chunk_size = 64 << 10, .threads = 2, .codec = ARENA_CODEC_ZSTD};
	arena_convert_result res;
	cr_assert_eq(arena_convert_inputs(&in, 1, z_path, &co, &res), 0, "%s", arena_last_error());
	cr_assert_eq(res.coded_chunks, res.chunk_count);
	cr_assert_lt(res.stored_bytes, res.data_bytes * 72 / 100);
	unlink(img_path);
	snprintf(img_path, sizeof(img_path), "%s", z_path);
	for (unsigned t = 1; t <= 4; t++) {
		arena_load_opts o = opts();
		uint8_t on[4] = {1, 0, 1, 0};
		o.on_device = t % 2 ? on : NULL;
		o.threads = t;
		arena_model *m;
		arena_load_stats st;
		cr_assert_eq(arena_load_image(img_path, &o, &m, &st), 0, "%s", arena_last_error());
		cr_assert_eq(st.cpu_decoded, st.dev_bytes + st.host_bytes);
		expect_image_bytes(m);
		arena_model_free(m);
	}
	unlink(st_path);
	cr_assert_eq(dev_free(), 64 << 20);
	cr_assert_eq(atomic_load(&budget.used), 0);
}

/* The ring is no larger than the bytes that go through it: a request of
 * 256 threads x 64 slots x 1 GiB for a 300 KiB model takes about 300 KiB,
 * for an image, a checkpoint, and a checkpoint quantized on the way. */
Test(load, ring_no_larger_than_the_bytes_to_read)
{
	arena_load_opts o = opts();
	o.threads = 256;
	o.slots_per_thread = 64;
	o.slot_bytes = 1ull << 30;
	arena_model *m;
	arena_load_stats st;
	cr_assert_eq(arena_load_image(img_path, &o, &m, &st), 0, "%s", arena_last_error());
	expect_image_bytes(m);
	arena_model_free(m);
	cr_assert_lt(st.ring_bytes, st.file_bytes + 4096 * st.threads, "a %llu-byte ring for %llu bytes",
		     (unsigned long long)st.ring_bytes, (unsigned long long)st.file_bytes);
	cr_assert(st.ring_pinned);
	cr_assert_eq(st.ring_bytes, (uint64_t)st.ring.threads * st.ring.slots * st.ring.slot);
	cr_assert_eq(st.ring.threads, st.threads);
	cr_assert_eq(st.ring_asked.threads, 256);
	cr_assert_eq(st.ring_asked.slots, 64);
	cr_assert_eq(st.ring_asked.slot, 1ull << 30);
	cr_assert_eq(st.ring_lowered, ARENA_RING_BY_BYTES);
	cr_assert_eq(st.ring_need, st.file_bytes);
	/* a request the bytes fill is kept as it is */
	arena_load_opts k = opts();
	k.threads = 1;
	k.slots_per_thread = 2;
	k.slot_bytes = 64 << 10;
	cr_assert_eq(arena_load_image(img_path, &k, &m, &st), 0, "%s", arena_last_error());
	arena_model_free(m);
	cr_assert_eq(st.ring_lowered, 0);
	cr_assert_eq(st.ring_bytes, 128 << 10);
	/* the budget lowers it further */
	arena_pin_budget small;
	arena_pin_budget_probe(&small, 200 << 10, 0, "");
	k.budget = &small;
	k.slots_per_thread = 4;
	cr_assert_eq(arena_load_image(img_path, &k, &m, &st), 0, "%s", arena_last_error());
	arena_model_free(m);
	if (st.ring_pinned) { /* where the OS lets it pin that much */
		cr_assert_eq(st.ring_lowered, ARENA_RING_BY_BUDGET);
		cr_assert_leq(st.ring_bytes, 200 << 10);
	}
	cr_assert_eq(atomic_load(&small.used), 0);
	const char *in = fixture_path("tiny_flux.safetensors");
	uint8_t on[6] = {1, 1, 0, 1, 0, 1};
	o.on_device = on;
	for (int q = 0; q < 2; q++) {
		arena_quant_opts qo = {.scheme = "fp8-e4m3-row"};
		o.quant = q ? &qo : NULL;
		cr_assert_eq(arena_load_safetensors(&in, 1, NULL, &o, &m, &st), 0, "%s", arena_last_error());
		uint64_t through = st.file_bytes; /* through the ring at most: the file's bytes read, quantized components */
		for (size_t i = 0; i < m->layout->n_tensors; i++)
			for (uint32_t c = 0; strcmp(m->layout->tensors[i].scheme, "none") && c < m->layout->tensors[i].n_comp; c++)
				through += m->layout->tensors[i].comp[c].bytes;
		arena_model_free(m);
		cr_assert_lt(st.ring_bytes, through + 4096 * st.threads, "quant %d: a %llu-byte ring for %llu bytes", q,
			     (unsigned long long)st.ring_bytes, (unsigned long long)through);
	}
	cr_assert_eq(atomic_load(&budget.used), 0, "pinned budget not given back");
}
