/* test_image.c - arena images: convert, verify, export round trips, and every
 * corruption and failure named by docs/FORMAT.md and the image issue. */
#include <criterion/criterion.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "arena.h"
#include "../../common/alloc.h"
#include "../../common/io.h"
#include "../../common/outfile.h"
#include "../../formats/codec.h"
#include "../../formats/image.h"
#include "../../formats/st_write.h"
#include "../../convert/convert.h"
#include "../../convert/export.h"
#include "../../convert/plan.h"
#include "../../runtime/reread.h"
#include "testutil.h"

static char tmpdir[256];

static void mk_tmpdir(void)
{
	tmpdir_make(tmpdir, sizeof(tmpdir), "test-image");
}

static const char *tmp(const char *name)
{
	return tmpdir_file(tmpdir, name);
}

static void rm_tmpdir(void)
{
	tmpdir_remove(tmpdir);
}

static uint8_t *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	cr_assert_not_null(f, "open %s", path);
	fseek(f, 0, SEEK_END);
	*len = (size_t)ftell(f);
	fseek(f, 0, SEEK_SET);
	uint8_t *b = malloc(*len ? *len : 1);
	cr_assert_eq(fread(b, 1, *len, f), *len);
	fclose(f);
	return b;
}

static void spit(const char *path, const uint8_t *b, size_t len)
{
	FILE *f = fopen(path, "wb");
	cr_assert_not_null(f);
	cr_assert_eq(fwrite(b, 1, len, f), len);
	fclose(f);
}

/* A small checkpoint: two blocks of two tensors and a global. */
static void write_small(const char *path)
{
	arena_stw *w;
	cr_assert_eq(arena_stw_create(path, &w), 0);
	cr_assert_eq(arena_stw_meta(w, "format", "pt"), 0);
	uint64_t s1[2] = {8, 16}, s2[1] = {16}, s3[1] = {300};
	cr_assert_eq(arena_stw_add(w, "blocks.0.w", ARENA_DTYPE_BF16, 2, s1), 0);
	cr_assert_eq(arena_stw_add(w, "blocks.0.b", ARENA_DTYPE_F32, 1, s2), 0);
	cr_assert_eq(arena_stw_add(w, "blocks.1.w", ARENA_DTYPE_BF16, 2, s1), 0);
	cr_assert_eq(arena_stw_add(w, "blocks.1.b", ARENA_DTYPE_F32, 1, s2), 0);
	cr_assert_eq(arena_stw_add(w, "embed", ARENA_DTYPE_U8, 1, s3), 0);
	cr_assert_eq(arena_stw_begin(w), 0);
	uint8_t buf[1024];
	for (size_t i = 0; i < sizeof(buf); i++)
		buf[i] = (uint8_t)(i * 7 + 1);
	cr_assert_eq(arena_stw_write(w, buf, arena_stw_data_size(w)), 0);
	cr_assert_eq(arena_stw_commit(w), 0);
}

static int convert1(const char *in, const char *out)
{
	arena_convert_opts o = {.threads = 2};
	return arena_convert_inputs(&in, 1, out, &o, NULL);
}

static int open_verify(const char *path)
{
	arena_image *img = NULL;
	int rc = arena_img_open(path, &img);
	if (!rc)
		rc = arena_img_verify_data(img, 2, NULL, NULL, NULL);
	else
		cr_assert_null(img);
	arena_img_close(img);
	return rc;
}

#define expect_code(rc, name)                                                                             \
	cr_assert_eq((rc), ARENA_E(name), "expected %s, got %s: %s", #name, arena_err_name(rc), arena_last_error())

TestSuite(image, .init = mk_tmpdir, .fini = rm_tmpdir);

/* Every data byte outside the tensors' components is zero (docs/FORMAT.md). */
static void expect_zero_padding(const char *path)
{
	arena_image *img;
	cr_assert_eq(arena_img_open(path, &img), 0);
	uint64_t n = img->hdr.data_length;
	uint8_t *d = malloc(n), *used = calloc(n, 1);
	cr_assert_eq(arena_pread_full(img->fd, d, n, img->hdr.data_offset, path), 0);
	const arena_layout *l = img->layout;
	for (size_t i = 0; i < l->n_tensors; i++)
		for (uint32_t c = 0; c < l->tensors[i].n_comp; c++)
			memset(used + l->blocks[l->tensors[i].block].offset + l->tensors[i].comp[c].offset, 1,
			       l->tensors[i].comp[c].bytes);
	for (uint64_t k = 0; k < n; k++)
		if (!used[k])
			cr_assert_eq(d[k], 0, "padding byte %llu of the data is %u", (unsigned long long)k, d[k]);
	free(d);
	free(used);
	arena_img_close(img);
}

/* ---- round trips ------------------------------------------------------------ */

Test(image, tiny_flux_round_trip)
{
	cr_assert_eq(convert1(fixture_path("tiny_flux.safetensors"), tmp("f.arena")), 0, "%s", arena_last_error());
	cr_assert_eq(open_verify(tmp("f.arena")), 0, "%s", arena_last_error());
	arena_image *img;
	cr_assert_eq(arena_img_open(tmp("f.arena"), &img), 0);
	const char *want[] = {"globals",
			      "transformer_blocks.0",
			      "transformer_blocks.1",
			      "single_transformer_blocks.0",
			      "single_transformer_blocks.1",
			      "single_transformer_blocks.2"};
	cr_assert_eq(img->layout->n_blocks, 6);
	for (int i = 0; i < 6; i++)
		cr_assert_str_eq(img->layout->blocks[i].name, want[i]);
	cr_assert_eq(img->layout->n_tensors, 126);
	for (size_t b = 0; b < img->layout->n_blocks; b++)
		cr_assert_eq(img->layout->blocks[b].offset % 4096, 0);
	for (size_t i = 0; i < img->layout->n_tensors; i++)
		cr_assert_eq(img->layout->tensors[i].comp[0].offset % 256, 0);
	arena_img_close(img);
	cr_assert_eq(arena_export(tmp("f.arena"), tmp("f.safetensors"), 2, NULL), 0, "%s", arena_last_error());
	size_t a, b;
	uint8_t *x = slurp(fixture_path("tiny_flux.safetensors"), &a), *y = slurp(tmp("f.safetensors"), &b);
	cr_assert_eq(a, b);
	cr_assert(memcmp(x, y, a) == 0, "export differs from the reference file");
	free(x);
	free(y);
}

Test(image, sharded_llama_round_trip)
{
	cr_assert_eq(convert1(fixture_path("tiny_llama_sharded"), tmp("l.arena")), 0, "%s", arena_last_error());
	cr_assert_eq(open_verify(tmp("l.arena")), 0);
	arena_image *img;
	cr_assert_eq(arena_img_open(tmp("l.arena"), &img), 0);
	cr_assert_eq(img->layout->n_blocks, 4);
	cr_assert_str_eq(img->layout->blocks[0].name, "globals");
	cr_assert_str_eq(img->layout->blocks[1].name, "model.layers.0");
	cr_assert_str_eq(img->layout->blocks[3].name, "model.layers.2");
	cr_assert_str_eq(img->layout->blocks[3].container, "model.layers");
	cr_assert_eq(img->layout->blocks[3].index, 2);
	arena_img_close(img);
	cr_assert_eq(arena_export(tmp("l.arena"), tmp("l.safetensors"), 1, NULL), 0);
	arena_ckpt *src, *dst;
	cr_assert_eq(arena_ckpt_open(fixture_path("tiny_llama_sharded"), &src), 0);
	cr_assert_eq(arena_ckpt_open(tmp("l.safetensors"), &dst), 0);
	cr_assert_eq(src->n_tensors, dst->n_tensors);
	for (size_t i = 0; i < src->n_tensors; i++) {
		const arena_st_tensor *s = src->tensors[i], *d = dst->tensors[i];
		cr_assert_str_eq(s->name, d->name);
		cr_assert_eq(s->dtype, d->dtype);
		cr_assert_eq(s->rank, d->rank);
		cr_assert_eq(s->nbytes, d->nbytes);
		cr_assert(memcmp(arena_st_data(s), arena_st_data(d), s->nbytes) == 0, "tensor %s differs", s->name);
	}
	arena_ckpt_close(src);
	arena_ckpt_close(dst);
}

Test(image, small_chunks_many_threads)
{
	write_small(tmp("s.safetensors"));
	char in_path[512];
	snprintf(in_path, sizeof(in_path), "%s", tmp("s.safetensors"));
	const char *in = in_path;
	arena_convert_opts o = {.threads = 3, .chunk_size = 64 << 10};
	cr_assert_eq(convert1(fixture_path("tiny_flux.safetensors"), tmp("a.arena")), 0);
	cr_assert_eq(arena_convert_inputs(&(const char *){fixture_path("tiny_flux.safetensors")}, 1, tmp("b.arena"), &o, NULL), 0);
	cr_assert_eq(open_verify(tmp("b.arena")), 0);
	arena_image *img;
	cr_assert_eq(arena_img_open(tmp("b.arena"), &img), 0);
	cr_assert_gt(img->hdr.chunk_count, 4);
	arena_img_close(img);
	expect_zero_padding(tmp("b.arena"));
	cr_assert_eq(arena_convert_inputs(&in, 1, tmp("c.arena"), &o, NULL), 0, "%s", arena_last_error());
	cr_assert_eq(open_verify(tmp("c.arena")), 0);
	expect_zero_padding(tmp("c.arena"));
	/* Quantized components leave padding of their own in every slab. */
	arena_convert_opts q = {.threads = 3, .chunk_size = 64 << 10, .quant = {.scheme = "fp8-e4m3-row"}};
	cr_assert_eq(arena_convert_inputs(&(const char *){fixture_path("tiny_flux.safetensors")}, 1, tmp("q.arena"), &q, NULL), 0,
		     "%s", arena_last_error());
	expect_zero_padding(tmp("q.arena"));
}

Test(image, bad_chunk_size_is_usage)
{
	arena_convert_opts o = {.chunk_size = 1000};
	const char *in = fixture_path("tiny_flux.safetensors");
	expect_code(arena_convert_inputs(&in, 1, tmp("x.arena"), &o, NULL), USAGE);
	cr_assert_eq(dir_entries(tmpdir), 0);
}

/* ---- corruption ------------------------------------------------------------- */

/* Which region of the image does byte i fall in? */
static int region_code(const arena_img_header *h, uint64_t i)
{
	if (i < 8)
		return ARENA_E(IMG_MAGIC);
	if (i < 4096)
		return ARENA_E(IMG_HEADER_CHECKSUM);
	if (i < h->chunk_table_offset)
		return ARENA_E(IMG_MANIFEST_CHECKSUM);
	if (i < h->data_offset)
		return ARENA_E(IMG_CHUNK_TABLE_CHECKSUM);
	return ARENA_E(IMG_CHUNK_CHECKSUM);
}

static void flip_every(const char *path, uint64_t stride)
{
	arena_image *img;
	cr_assert_eq(arena_img_open(path, &img), 0);
	arena_img_header h = img->hdr;
	arena_img_close(img);
	int fd = open(path, O_RDWR);
	cr_assert_geq(fd, 0);
	for (uint64_t i = 0; i < h.file_size; i += (i < h.data_offset ? 1 : stride)) {
		uint8_t c, x;
		cr_assert_eq(pread(fd, &c, 1, (off_t)i), 1);
		x = c ^ 0x10;
		cr_assert_eq(pwrite(fd, &x, 1, (off_t)i), 1);
		int rc = open_verify(path);
		cr_assert_eq(rc, region_code(&h, i), "byte %llu flipped: got %s (%s)", (unsigned long long)i,
			     arena_err_name(rc), arena_last_error());
		cr_assert_eq(pwrite(fd, &c, 1, (off_t)i), 1);
	}
	close(fd);
	cr_assert_eq(open_verify(path), 0);
}

Test(image, every_byte_flipped_small)
{
	write_small(tmp("s.safetensors"));
	cr_assert_eq(convert1(tmp("s.safetensors"), tmp("s.arena")), 0);
	flip_every(tmp("s.arena"), 1);
}

Test(image, bytes_flipped_tiny_flux)
{
	slow_test();
	cr_assert_eq(convert1(fixture_path("tiny_flux.safetensors"), tmp("f.arena")), 0);
	flip_every(tmp("f.arena"), 509);
}

Test(image, bad_chunk_named_with_blocks_and_tensors)
{
	write_small(tmp("s.safetensors"));
	cr_assert_eq(convert1(tmp("s.safetensors"), tmp("s.arena")), 0);
	arena_image *img;
	cr_assert_eq(arena_img_open(tmp("s.arena"), &img), 0);
	uint64_t off = img->hdr.data_offset + img->layout->blocks[1].offset; /* blocks.0 */
	arena_img_close(img);
	int fd = open(tmp("s.arena"), O_RDWR);
	uint8_t x = 0xFF;
	cr_assert_eq(pwrite(fd, &x, 1, (off_t)off), 1);
	close(fd);
	expect_code(open_verify(tmp("s.arena")), IMG_CHUNK_CHECKSUM);
	cr_assert(strstr(arena_last_error(), "chunk 0"), "%s", arena_last_error());
	cr_assert(strstr(arena_last_error(), "'blocks.0'"), "%s", arena_last_error());
	cr_assert(strstr(arena_last_error(), "'blocks.0.b'"), "%s", arena_last_error());
}

Test(image, truncated_anywhere)
{
	write_small(tmp("s.safetensors"));
	cr_assert_eq(convert1(tmp("s.safetensors"), tmp("s.arena")), 0);
	size_t len;
	uint8_t *b = slurp(tmp("s.arena"), &len);
	size_t cuts[] = {0, 1, 7, 8, 100, 4095, 4096, 4097, 6000, 8192, 10000, 12288, 13000, len - 4096, len - 1};
	for (size_t k = 0; k < sizeof(cuts) / sizeof(cuts[0]); k++) {
		spit(tmp("t.arena"), b, cuts[k]);
		int rc = open_verify(tmp("t.arena"));
		cr_assert(rc == ARENA_E(IMG_TRUNCATED), "cut at %zu: got %s (%s)", cuts[k], arena_err_name(rc),
			  arena_last_error());
	}
	/* Longer than the header says. */
	uint8_t *c = calloc(1, len + 1);
	memcpy(c, b, len);
	spit(tmp("t.arena"), c, len + 1);
	expect_code(open_verify(tmp("t.arena")), IMG_SIZE);
	free(b);
	free(c);
}

/* ---- structural: rebuild an image with a changed header or manifest -------- */

typedef struct raw_image {
	uint8_t *buf;
	size_t len;
	arena_img_header h;
} raw_image;

static void raw_load(raw_image *r, const char *path)
{
	r->buf = slurp(path, &r->len);
	cr_assert_eq(arena_img_header_decode(r->buf, r->len, path, &r->h), 0);
}

/* Write r with a new manifest text (NULL = keep) and header edits, recomputing
 * every checksum, to path. */
static void raw_write(raw_image *r, const char *manifest, const char *path, void (*edit)(arena_img_header *))
{
	arena_img_header h = r->h;
	const uint8_t *table = r->buf + h.chunk_table_offset, *data = r->buf + h.data_offset;
	size_t mlen = manifest ? (strlen(manifest) + 4096) / 4096 * 4096 : h.manifest_length;
	uint8_t *m = malloc(mlen);
	if (manifest) {
		memset(m, ' ', mlen);
		memcpy(m, manifest, strlen(manifest));
	} else {
		memcpy(m, r->buf + h.manifest_offset, mlen);
	}
	arena_img_header nh;
	arena_img_header_plan(&nh, mlen, h.data_length, h.chunk_size);
	if (h.flags & ARENA_IMG_FLAG_CODED) {
		arena_img_header_set_coded(&nh);
		if (h.flags & ARENA_IMG_FLAG_ZSTD)
			arena_img_header_set_zstd(&nh);
		arena_img_header_set_stored(&nh, h.stored_length);
	}
	if (h.flags & ARENA_IMG_FLAG_SUBCLASS)
		arena_img_header_set_subclass(&nh);
	nh.manifest_xxh3 = XXH3_64bits(m, mlen);
	nh.chunk_table_xxh3 = XXH3_64bits(table, h.chunk_table_length);
	if (edit)
		edit(&nh);
	uint8_t page[4096];
	arena_img_header_encode(&nh, page);
	FILE *f = fopen(path, "wb");
	fwrite(page, 1, 4096, f);
	fwrite(m, 1, mlen, f);
	fwrite(table, 1, h.chunk_table_length, f);
	fwrite(data, 1, arena_img_stored_data(&h), f);
	fclose(f);
	free(m);
}

static json_t *raw_manifest(raw_image *r)
{
	json_error_t e;
	json_t *j = json_loadb((const char *)r->buf + r->h.manifest_offset, r->h.manifest_length, 0, &e);
	cr_assert_not_null(j);
	return j;
}

static void with_manifest(raw_image *r, json_t *j, const char *path)
{
	char *s = json_dumps(j, JSON_COMPACT);
	raw_write(r, s, path, NULL);
	free(s);
	json_decref(j);
}

static void small_raw(raw_image *r)
{
	write_small(tmp("s.safetensors"));
	cr_assert_eq(convert1(tmp("s.safetensors"), tmp("s.arena")), 0);
	raw_load(r, tmp("s.arena"));
}

Test(image, resealed_unchanged_is_valid)
{
	raw_image r;
	small_raw(&r);
	raw_write(&r, NULL, tmp("o.arena"), NULL);
	cr_assert_eq(open_verify(tmp("o.arena")), 0, "%s", arena_last_error());
	with_manifest(&r, raw_manifest(&r), tmp("o.arena"));
	cr_assert_eq(open_verify(tmp("o.arena")), 0, "%s", arena_last_error());
	free(r.buf);
}

static void major2(arena_img_header *h) { h->major = 2; }
static void minor9(arena_img_header *h) { h->minor = 9; }
static void req_flag(arena_img_header *h) { h->flags = 8; }
static void zstd_flag_alone(arena_img_header *h) { h->flags = ARENA_IMG_FLAG_ZSTD; }
static void opt_flag(arena_img_header *h) { h->flags = 1u << 20; }
static void bad_chunk_size(arena_img_header *h) { h->chunk_size = 3000; }
static void bad_manifest_off(arena_img_header *h) { h->manifest_offset = 8192; }

Test(image, wrong_magic)
{
	raw_image r;
	small_raw(&r);
	memcpy(r.buf, "ARENAIMX", 8);
	spit(tmp("o.arena"), r.buf, r.len);
	expect_code(open_verify(tmp("o.arena")), IMG_MAGIC);
	spit(tmp("o.arena"), (const uint8_t *)"hello", 5);
	expect_code(open_verify(tmp("o.arena")), IMG_TRUNCATED);
	/* A safetensors file is not an image. */
	expect_code(open_verify(fixture_path("tiny_flux.safetensors")), IMG_MAGIC);
	free(r.buf);
}

Test(image, versions_and_flags)
{
	raw_image r;
	small_raw(&r);
	raw_write(&r, NULL, tmp("o.arena"), major2);
	expect_code(open_verify(tmp("o.arena")), IMG_VERSION);
	raw_write(&r, NULL, tmp("o.arena"), minor9);
	cr_assert_eq(open_verify(tmp("o.arena")), 0, "a newer minor version must be read: %s", arena_last_error());
	raw_write(&r, NULL, tmp("o.arena"), req_flag);
	expect_code(open_verify(tmp("o.arena")), IMG_FLAGS);
	raw_write(&r, NULL, tmp("o.arena"), zstd_flag_alone);
	expect_code(open_verify(tmp("o.arena")), IMG_HEADER_BAD);
	raw_write(&r, NULL, tmp("o.arena"), opt_flag);
	cr_assert_eq(open_verify(tmp("o.arena")), 0, "unknown optional flags are ignored: %s", arena_last_error());
	raw_write(&r, NULL, tmp("o.arena"), bad_chunk_size);
	expect_code(open_verify(tmp("o.arena")), IMG_HEADER_BAD);
	raw_write(&r, NULL, tmp("o.arena"), bad_manifest_off);
	expect_code(open_verify(tmp("o.arena")), IMG_HEADER_BAD);
	free(r.buf);
}

Test(image, manifest_does_not_match_chunk_table)
{
	raw_image r;
	small_raw(&r);
	json_t *j = raw_manifest(&r);
	json_object_set_new(json_object_get(j, "layout"), "chunk_count", json_integer(2));
	with_manifest(&r, j, tmp("o.arena"));
	expect_code(open_verify(tmp("o.arena")), IMG_CHUNK_TABLE_BAD);
	j = raw_manifest(&r);
	json_object_set_new(json_object_get(j, "layout"), "data_length", json_integer((json_int_t)r.h.data_length + 4096));
	with_manifest(&r, j, tmp("o.arena"));
	expect_code(open_verify(tmp("o.arena")), IMG_CHUNK_TABLE_BAD);
	free(r.buf);
}

Test(image, manifest_malformed)
{
	raw_image r;
	small_raw(&r);
	raw_write(&r, "{\"format\": \"arena-image\",", tmp("o.arena"), NULL);
	expect_code(open_verify(tmp("o.arena")), IMG_MANIFEST_BAD);
	json_t *j = raw_manifest(&r);
	json_object_set_new(j, "format", json_string("other"));
	with_manifest(&r, j, tmp("o.arena"));
	expect_code(open_verify(tmp("o.arena")), IMG_MANIFEST_BAD);
	j = raw_manifest(&r);
	json_object_set_new(json_array_get(json_object_get(j, "tensors"), 0), "dtype", json_string("Q7"));
	with_manifest(&r, j, tmp("o.arena"));
	expect_code(open_verify(tmp("o.arena")), IMG_MANIFEST_BAD);
	cr_assert(strstr(arena_last_error(), "Q7"), "%s", arena_last_error());
	j = raw_manifest(&r);
	json_object_set_new(json_array_get(json_object_get(j, "tensors"), 0), "block", json_integer(99));
	with_manifest(&r, j, tmp("o.arena"));
	expect_code(open_verify(tmp("o.arena")), IMG_MANIFEST_BAD);
	j = raw_manifest(&r);
	json_object_set_new(json_array_get(json_object_get(j, "blocks"), 1), "tensors", json_integer(5));
	with_manifest(&r, j, tmp("o.arena"));
	expect_code(open_verify(tmp("o.arena")), IMG_MANIFEST_BAD);
	free(r.buf);
}

Test(image, overlapping_or_outside_slabs)
{
	raw_image r;
	small_raw(&r);
	json_t *j = raw_manifest(&r);
	json_t *blocks = json_object_get(j, "blocks");
	json_object_set(json_array_get(blocks, 2), "offset", json_object_get(json_array_get(blocks, 1), "offset"));
	with_manifest(&r, j, tmp("o.arena"));
	expect_code(open_verify(tmp("o.arena")), IMG_SLAB_BAD);
	j = raw_manifest(&r);
	blocks = json_object_get(j, "blocks");
	json_object_set_new(json_array_get(blocks, json_array_size(blocks) - 1), "offset",
			    json_integer((json_int_t)r.h.data_length));
	with_manifest(&r, j, tmp("o.arena"));
	expect_code(open_verify(tmp("o.arena")), IMG_SLAB_BAD);
	j = raw_manifest(&r);
	json_object_set_new(json_array_get(json_object_get(j, "blocks"), 1), "offset", json_integer(100));
	with_manifest(&r, j, tmp("o.arena"));
	expect_code(open_verify(tmp("o.arena")), IMG_SLAB_BAD);
	free(r.buf);
}

Test(image, tensor_outside_its_slab_or_overlapping)
{
	raw_image r;
	small_raw(&r);
	json_t *j = raw_manifest(&r);
	json_t *t0 = json_array_get(json_object_get(j, "tensors"), 0);
	json_t *c0 = json_array_get(json_object_get(t0, "components"), 0);
	json_object_set_new(c0, "offset", json_integer(1 << 20));
	with_manifest(&r, j, tmp("o.arena"));
	expect_code(open_verify(tmp("o.arena")), IMG_TENSOR_BAD);
	/* blocks.0.b and blocks.0.w share a slab: put one on top of the other. */
	j = raw_manifest(&r);
	json_t *ts = json_object_get(j, "tensors");
	json_t *a = json_array_get(json_object_get(json_array_get(ts, 0), "components"), 0);
	json_t *b = json_array_get(json_object_get(json_array_get(ts, 1), "components"), 0);
	json_object_set(b, "offset", json_object_get(a, "offset"));
	with_manifest(&r, j, tmp("o.arena"));
	expect_code(open_verify(tmp("o.arena")), IMG_TENSOR_BAD);
	/* A component whose bytes do not match its dtype and shape. */
	j = raw_manifest(&r);
	a = json_array_get(json_object_get(json_array_get(json_object_get(j, "tensors"), 0), "components"), 0);
	json_object_set_new(a, "bytes", json_integer(3));
	with_manifest(&r, j, tmp("o.arena"));
	expect_code(open_verify(tmp("o.arena")), IMG_TENSOR_BAD);
	free(r.buf);
}

/* ---- schemes: each manifest entry against its scheme's component table ------ */

/* write_small converted with blocks.1.w stored as fp8-e4m3-tensor (components
 * qdata F8_E4M3 [8, 16] and scale F32 [1]); the other tensors as they are. */
static void quant_raw(raw_image *r)
{
	write_small(tmp("s.safetensors"));
	const char *in = tmp("s.safetensors"), *glob = "blocks.1.w";
	arena_convert_opts o = {.threads = 2, .quant = {.scheme = "fp8-e4m3-tensor", .include = &glob, .n_include = 1}};
	cr_assert_eq(arena_convert_inputs(&in, 1, tmp("q.arena"), &o, NULL), 0, "%s", arena_last_error());
	raw_load(r, tmp("q.arena"));
}

static json_t *mtensor(json_t *j, const char *name)
{
	json_t *ts = json_object_get(j, "tensors");
	for (size_t i = 0; i < json_array_size(ts); i++)
		if (!strcmp(json_string_value(json_object_get(json_array_get(ts, i), "name")), name))
			return json_array_get(ts, i);
	cr_assert_fail("no tensor %s in the manifest", name);
	return NULL;
}

static json_t *mcomps(json_t *j, const char *name)
{
	return json_object_get(mtensor(j, name), "components");
}

/* Every reader refuses the image at path when it is opened, before any data
 * is read: verify, export (which then writes nothing) and load; the message
 * names the file, the tensor and the rule. */
static void expect_manifest_bad(const char *path, const char *tensor, const char *rule)
{
	expect_code(open_verify(path), IMG_MANIFEST_BAD);
	const char *msg = arena_last_error();
	cr_assert(strstr(msg, path) && strstr(msg, tensor) && strstr(msg, rule), "want %s, '%s' and '%s' in: %s", path,
		  tensor, rule, msg);
	expect_code(arena_export(path, tmp("e.safetensors"), 1, NULL), IMG_MANIFEST_BAD);
	cr_assert_eq(access(tmp("e.safetensors"), F_OK), -1, "export wrote a file from a bad manifest");
	arena_open_options o = {.backend = "sim", .vram_cap = 64 << 20};
	arena *a = NULL;
	expect_code(arena_open(path, &o, &a), IMG_MANIFEST_BAD);
	cr_assert_null(a);
}

Test(image, scheme_resealed_quantized_is_valid)
{
	raw_image r;
	quant_raw(&r);
	with_manifest(&r, raw_manifest(&r), tmp("o.arena"));
	cr_assert_eq(open_verify(tmp("o.arena")), 0, "%s", arena_last_error());
	cr_assert_eq(arena_export(tmp("o.arena"), tmp("e.safetensors"), 1, NULL), 0, "%s", arena_last_error());
	free(r.buf);
}

static void subclass_flag(arena_img_header *h)
{
	arena_img_header_set_subclass(h);
}

/* blocks.0.w as a tensor subclass's one inner tensor "qdata" (its bytes as they are). */
static json_t *as_subclass(raw_image *r)
{
	json_t *j = raw_manifest(r), *t = mtensor(j, "blocks.0.w");
	json_object_set_new(t, "scheme", json_string("torch-subclass"));
	json_object_set_new(t, "subclass", json_pack("{s:s,s:{s:i}}", "type", "mylib.Q", "attributes", "k", 1));
	json_object_set_new(json_array_get(mcomps(j, "blocks.0.w"), 0), "name", json_string("qdata"));
	return j;
}

Test(image, scheme_torch_subclass)
{
	raw_image r;
	small_raw(&r);
	/* valid with the flag (1.3): its object kept as written, its bytes read as any */
	json_t *j = as_subclass(&r);
	char *s = json_dumps(j, JSON_COMPACT);
	json_decref(j);
	raw_write(&r, s, tmp("o.arena"), subclass_flag);
	free(s);
	cr_assert_eq(open_verify(tmp("o.arena")), 0, "%s", arena_last_error());
	arena_open_options o = {.backend = "sim", .vram_cap = 64 << 20};
	arena *a = NULL;
	cr_assert_eq(arena_open(tmp("o.arena"), &o, &a), 0, "%s", arena_last_error());
	size_t i;
	cr_assert_eq(arena_tensor_find(a, "blocks.0.w", &i), 0);
	cr_assert_str_eq(arena_tensor_subclass(a, i), "{\"type\":\"mylib.Q\",\"attributes\":{\"k\":1}}");
	arena_tensor_info ti;
	cr_assert_eq(arena_tensor_get(a, i, &ti), 0);
	cr_assert_str_eq(ti.scheme, "torch-subclass");
	cr_assert_str_eq(ti.component[0].name, "qdata");
	uint8_t out[64];
	cr_assert_eq(arena_tensor_dequantize(a, i, (uint8_t *)ti.component[0].device - ti.component[0].offset, out, NULL),
		     ARENA_E(USAGE));
	cr_assert(strstr(arena_last_error(), "tensor subclass's"), "%s", arena_last_error());
	cr_assert_eq(arena_tensor_find(a, "blocks.1.w", &i), 0);
	cr_assert_null(arena_tensor_subclass(a, i));
	arena_close(a);
	/* the flag is required: a reader of 1.2 refuses it by the flag, this one by the manifest */
	with_manifest(&r, as_subclass(&r), tmp("o.arena"));
	expect_manifest_bad(tmp("o.arena"), "'blocks.0.w'", "without the torch-subclass flag");
	free(r.buf);
}

Test(image, scheme_torch_subclass_rules)
{
	raw_image r;
	small_raw(&r);
	struct {
		const char *what, *rule;
	} cases[] = {
		{"no object", "scheme torch-subclass without its \"subclass\" object"},
		{"not an object", "\"subclass\" is not an object"},
		{"on another scheme", "a \"subclass\" object on scheme none"},
		{"bad name", "component 0's name 'a b' is empty, repeated, too long or not made of [A-Za-z0-9_.]"},
	};
	for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
		json_t *j = as_subclass(&r), *t = mtensor(j, "blocks.0.w");
		if (k == 0)
			json_object_del(t, "subclass");
		else if (k == 1)
			json_object_set_new(t, "subclass", json_string("mylib.Q"));
		else if (k == 2)
			json_object_set_new(t, "scheme", json_string("none"));
		else
			json_object_set_new(json_array_get(mcomps(j, "blocks.0.w"), 0), "name", json_string("a b"));
		char *s = json_dumps(j, JSON_COMPACT);
		json_decref(j);
		raw_write(&r, s, tmp("o.arena"), subclass_flag);
		free(s);
		expect_manifest_bad(tmp("o.arena"), "'blocks.0.w'", cases[k].rule);
	}
	free(r.buf);
}

Test(image, scheme_unknown)
{
	raw_image r;
	quant_raw(&r);
	json_t *j = raw_manifest(&r);
	json_object_set_new(mtensor(j, "blocks.1.w"), "scheme", json_string("fp9-e4m3"));
	with_manifest(&r, j, tmp("o.arena"));
	expect_manifest_bad(tmp("o.arena"), "'blocks.1.w'", "unknown storage scheme 'fp9-e4m3'");
	free(r.buf);
}

Test(image, scheme_row_on_one_bf16_component)
{
	raw_image r;
	quant_raw(&r);
	json_t *j = raw_manifest(&r);
	json_object_set_new(mtensor(j, "blocks.0.w"), "scheme", json_string("fp8-e4m3-row"));
	with_manifest(&r, j, tmp("o.arena"));
	expect_manifest_bad(tmp("o.arena"), "'blocks.0.w'", "scheme fp8-e4m3-row has 2 components, the manifest 1");
	free(r.buf);
}

Test(image, scheme_scale_missing)
{
	raw_image r;
	quant_raw(&r);
	json_t *j = raw_manifest(&r);
	json_array_remove(mcomps(j, "blocks.1.w"), 1);
	with_manifest(&r, j, tmp("o.arena"));
	expect_manifest_bad(tmp("o.arena"), "'blocks.1.w'", "scheme fp8-e4m3-tensor has 2 components, the manifest 1");
	free(r.buf);
}

Test(image, scheme_qdata_missing)
{
	raw_image r;
	quant_raw(&r);
	json_t *j = raw_manifest(&r);
	json_array_remove(mcomps(j, "blocks.1.w"), 0);
	with_manifest(&r, j, tmp("o.arena"));
	expect_manifest_bad(tmp("o.arena"), "'blocks.1.w'", "scheme fp8-e4m3-tensor has 2 components, the manifest 1");
	free(r.buf);
}

Test(image, scheme_components_swapped)
{
	raw_image r;
	quant_raw(&r);
	json_t *j = raw_manifest(&r);
	json_t *c = mcomps(j, "blocks.1.w"), *q = json_incref(json_array_get(c, 0));
	json_array_remove(c, 0);
	json_array_append_new(c, q);
	with_manifest(&r, j, tmp("o.arena"));
	expect_manifest_bad(tmp("o.arena"), "'blocks.1.w'", "component 0 is 'scale'");
	free(r.buf);
}

Test(image, scheme_component_renamed)
{
	raw_image r;
	quant_raw(&r);
	/* Export would write it as "blocks.0.b_zzz". */
	json_t *j = raw_manifest(&r);
	json_object_set_new(json_array_get(mcomps(j, "blocks.0.b"), 0), "name", json_string("zzz"));
	with_manifest(&r, j, tmp("o.arena"));
	expect_manifest_bad(tmp("o.arena"), "'blocks.0.b'", "component 0 is 'zzz'");
	/* And a quantized tensor's scale. */
	j = raw_manifest(&r);
	json_object_set_new(json_array_get(mcomps(j, "blocks.1.w"), 1), "name", json_string("scales"));
	with_manifest(&r, j, tmp("o.arena"));
	expect_manifest_bad(tmp("o.arena"), "'blocks.1.w'", "component 1 is 'scales'");
	free(r.buf);
}

Test(image, scheme_original_dtype_changed)
{
	raw_image r;
	quant_raw(&r);
	json_t *j = raw_manifest(&r);
	json_object_set_new(mtensor(j, "blocks.1.w"), "dtype", json_string("I32"));
	with_manifest(&r, j, tmp("o.arena"));
	expect_manifest_bad(tmp("o.arena"), "'blocks.1.w'", "does not apply to dtype I32");
	/* A component's shape that is not the tensor's. */
	j = raw_manifest(&r);
	json_t *sh = json_object_get(json_array_get(mcomps(j, "blocks.1.w"), 0), "shape");
	json_array_set_new(sh, 0, json_integer(16));
	json_array_set_new(sh, 1, json_integer(8));
	with_manifest(&r, j, tmp("o.arena"));
	expect_manifest_bad(tmp("o.arena"), "'blocks.1.w'", "component 0 is 'qdata' F8_E4M3 [16, 8]");
	free(r.buf);
}

Test(image, unknown_codec)
{
	raw_image r;
	small_raw(&r);
	r.buf[r.h.chunk_table_offset + 24] = 7; /* chunk 0 codec */
	raw_write(&r, NULL, tmp("o.arena"), NULL);
	expect_code(open_verify(tmp("o.arena")), IMG_CODEC);
	free(r.buf);
}

/* ---- failures while converting ---------------------------------------------- */

Test(image, disk_full_during_convert_leaves_nothing)
{
	const char *in = fixture_path("tiny_flux.safetensors");
	arena_convert_opts o = {.threads = 1, .chunk_size = 64 << 10};
	int fired = 0;
	for (long n = 1; n < 64; n++) {
		arena_fault_write(n);
		int rc = arena_convert_inputs(&in, 1, tmp("x.arena"), &o, NULL);
		arena_fault_write(0);
		if (rc == 0) {
			cr_assert_gt(n, 3, "convert must write several times");
			break;
		}
		fired++;
		expect_code(rc, IO);
		cr_assert(strstr(arena_last_error(), "No space left"), "%s", arena_last_error());
		cr_assert_eq(dir_entries(tmpdir), 0, "a failed convert left a file behind (n=%ld)", n);
	}
	cr_assert_gt(fired, 3);
	cr_assert_eq(open_verify(tmp("x.arena")), 0);
}

Test(image, read_failure_during_convert_leaves_nothing)
{
	const char *in = fixture_path("tiny_flux.safetensors");
	arena_convert_opts o = {.threads = 2, .chunk_size = 64 << 10};
	arena_fault_read(3);
	int rc = arena_convert_inputs(&in, 1, tmp("x.arena"), &o, NULL);
	arena_fault_read(0);
	expect_code(rc, IO);
	cr_assert_eq(dir_entries(tmpdir), 0);
}

Test(image, output_path_unwritable)
{
	const char *in = fixture_path("tiny_flux.safetensors");
	expect_code(arena_convert_inputs(&in, 1, "/nonexistent-dir/x.arena", NULL, NULL), NOT_FOUND);
	spit(tmp("file"), (const uint8_t *)"x", 1);
	expect_code(arena_convert_inputs(&in, 1, tmp("file/x.arena"), NULL, NULL), NOT_FOUND);
	cr_assert_eq(dir_entries(tmpdir), 1);
	int rc = arena_convert_inputs(&in, 1, tmpdir, NULL, NULL); /* a folder: cannot rename over it */
	cr_assert_neq(rc, 0);
	cr_assert_eq(dir_entries(tmpdir), 1);
}

Test(image, two_inputs_same_tensor)
{
	const char *in[2] = {fixture_path("tiny_flux.safetensors"), fixture_path("tiny_flux.safetensors")};
	expect_code(arena_convert_inputs(in, 2, tmp("x.arena"), NULL, NULL), DUPLICATE_TENSOR);
	cr_assert(strstr(arena_last_error(), "context_embedder.bias"), "%s", arena_last_error());
	cr_assert_eq(dir_entries(tmpdir), 0);
	/* Two inputs without shared names form one model. */
	const char *two[2] = {fixture_path("tiny_flux.safetensors"), fixture_path("tiny_llama_sharded")};
	cr_assert_eq(arena_convert_inputs(two, 2, tmp("y.arena"), NULL, NULL), 0, "%s", arena_last_error());
	cr_assert_eq(open_verify(tmp("y.arena")), 0);
}

/* Converts of `in` to x.arena with the nth allocation failing, n = 1,
 * 1 + step, ...: NOMEM (or whole: jansson survives some failed allocations)
 * and no file left (the directory holds `others` besides), until a convert
 * makes fewer than n allocations (after more than min_n): whole. */
static void convert_alloc_faults(const char *in, const arena_convert_opts *o, long step, long min_n, int others)
{
	long n;
	for (n = 1; n < 1000000; n += step) {
		arena_fault_alloc(n);
		int rc = arena_convert_inputs(&in, 1, tmp("x.arena"), o, NULL);
		int fired = arena_fault_alloc_fired();
		arena_fault_alloc(0);
		if (!fired) {
			cr_assert_eq(rc, 0, "%s", arena_last_error());
			break;
		}
		cr_assert(rc == ARENA_E_NOMEM || rc == 0, "n=%ld: %s: %s", n, arena_err_name(rc), arena_last_error());
		cr_assert_eq(dir_entries(tmpdir), others + (rc == 0), "n=%ld left a file", n);
		unlink(tmp("x.arena"));
	}
	cr_assert_gt(n, min_n);
}

Test(image, allocation_failures_convert_and_open)
{
	/* Every N on a small model (a few hundred allocations). */
	write_small(tmp("s.safetensors"));
	char in_path[512];
	snprintf(in_path, sizeof(in_path), "%s", tmp("s.safetensors"));
	const char *in = in_path;
	arena_convert_opts o = {.threads = 1};
	convert_alloc_faults(in, &o, 1, 10, 1);
	unlink(tmp("x.arena")); /* the last, whole one */
	cr_assert_eq(convert1(in, tmp("x.arena")), 0);
	cr_assert_eq(dir_entries(tmpdir), 2);
	long n;
	for (n = 1; n < 100000; n++) {
		arena_image *img = NULL;
		arena_fault_alloc(n);
		int rc = arena_img_open(tmp("x.arena"), &img);
		if (!rc)
			rc = arena_img_verify_data(img, 2, NULL, NULL, NULL);
		int fired = arena_fault_alloc_fired();
		arena_fault_alloc(0);
		arena_img_close(img);
		if (!fired) {
			cr_assert_eq(rc, 0);
			break;
		}
		cr_assert(rc == ARENA_E_NOMEM || rc == 0, "n=%ld: %s: %s", n, arena_err_name(rc), arena_last_error());
	}
	cr_assert_gt(n, 10);
}

Test(image, allocation_failures_tiny_flux_strided)
{
	/* The real model, every 13th N (thousands of allocations in all). */
	const char *in = fixture_path("tiny_flux.safetensors");
	arena_convert_opts o = {.threads = 2};
	convert_alloc_faults(in, &o, 13, 500, 0);
}

/* ---- blocks ---------------------------------------------------------------- */

static void match(const char *name, const char *container, int64_t index)
{
	size_t clen = 0;
	int64_t idx = -2;
	int hit = arena_plan_match_builtin(name, &clen, &idx);
	if (!container) {
		cr_assert_eq(hit, 0, "%s should be global", name);
		return;
	}
	cr_assert_eq(hit, 1, "%s should be in a block", name);
	cr_assert_eq(clen, strlen(container), "%s: container length %zu", name, clen);
	cr_assert(strncmp(name, container, clen) == 0);
	cr_assert_eq(idx, index, "%s: index %lld", name, (long long)idx);
}

Test(plan, builtin_patterns)
{
	match("transformer_blocks.7.attn.to_q.weight", "transformer_blocks", 7);
	match("single_transformer_blocks.12.proj_out.weight", "single_transformer_blocks", 12);
	match("down_blocks.1.attentions.0.transformer_blocks.0.attn1.to_q.weight", "down_blocks", 1);
	match("up_blocks.3.resnets.2.conv1.weight", "up_blocks", 3);
	match("mid_block.resnets.0.conv1.weight", "mid_block", -1);
	match("blocks.4.self_attn.q.weight", "blocks", 4);
	match("double_blocks.18.img_attn.qkv.weight", "double_blocks", 18);
	match("model.diffusion_model.single_blocks.37.linear1.weight", "model.diffusion_model.single_blocks", 37);
	match("model.layers.31.mlp.down_proj.weight", "model.layers", 31);
	match("model.embed_tokens.weight", NULL, 0);
	match("x_embedder.weight", NULL, 0);
	match("my_blocks.3.weight", NULL, 0);        /* not at a '.' boundary */
	match("transformer_blocks.x.weight", NULL, 0); /* no index */
	match("transformer_blocks.3", NULL, 0);       /* nothing after the index */
}

static arena_layout *plan_of(const char *path, const arena_plan_opts *o, int *rc)
{
	arena_ckpt *ck;
	cr_assert_eq(arena_ckpt_open(path, &ck), 0);
	arena_layout *l = NULL;
	*rc = arena_plan_build(ck, o, &l);
	arena_ckpt_close(ck);
	return l;
}

Test(plan, user_pattern_and_order)
{
	int rc;
	const char *pat[] = {"^model\\.layers\\.([0-9]+)\\."};
	arena_plan_opts o = {.patterns = pat, .n_patterns = 1};
	arena_layout *l = plan_of(fixture_path("tiny_llama_sharded"), &o, &rc);
	cr_assert_eq(rc, 0, "%s", arena_last_error());
	cr_assert_eq(l->n_blocks, 4);
	cr_assert_str_eq(l->blocks[2].name, "model.layers.1");
	cr_assert_str_eq(l->blocks[2].container, "model.layers");
	arena_layout_free(l);

	const char *order[] = {"single_transformer_blocks", "transformer_blocks"};
	arena_plan_opts o2 = {.order = order, .n_order = 2};
	l = plan_of(fixture_path("tiny_flux.safetensors"), &o2, &rc);
	cr_assert_eq(rc, 0);
	cr_assert_str_eq(l->blocks[1].name, "single_transformer_blocks.0");
	cr_assert_str_eq(l->blocks[4].name, "transformer_blocks.0");
	arena_layout_free(l);
}

Test(plan, bad_patterns_and_orders)
{
	int rc;
	const char *bad[] = {"layers\\.([0-9]+"};
	arena_plan_opts o = {.patterns = bad, .n_patterns = 1};
	cr_assert_null(plan_of(fixture_path("tiny_flux.safetensors"), &o, &rc));
	expect_code(rc, PLAN_BAD_PATTERN);
	const char *nogroup[] = {"layers\\.[0-9]+"};
	o.patterns = nogroup;
	cr_assert_null(plan_of(fixture_path("tiny_flux.safetensors"), &o, &rc));
	expect_code(rc, PLAN_BAD_PATTERN);
	cr_assert(strstr(arena_last_error(), "capture group"), "%s", arena_last_error());
	const char *order[] = {"transformer_blockz"};
	arena_plan_opts o2 = {.order = order, .n_order = 1};
	cr_assert_null(plan_of(fixture_path("tiny_flux.safetensors"), &o2, &rc));
	expect_code(rc, PLAN_BAD_ORDER);
	cr_assert(strstr(arena_last_error(), "transformer_blockz"), "%s", arena_last_error());
}

/* ---- coded images (--codec hb4) ------------------------------------------------ */

static int convert_coded(const char *in, const char *out, uint64_t chunk)
{
	arena_convert_opts o = {.threads = 2, .chunk_size = chunk, .codec = ARENA_CODEC_HB4, .force = 1};
	return arena_convert_inputs(&in, 1, out, &o, NULL);
}

/* Raw data bytes of an image through the checked reader. */
static uint8_t *raw_data(const char *path, uint64_t *n)
{
	arena_image *img;
	cr_assert_eq(arena_img_open(path, &img), 0, "%s", arena_last_error());
	arena_img_reader rd;
	cr_assert_eq(arena_img_reader_init(&rd, img, 1), 0);
	*n = img->hdr.data_length;
	uint8_t *b = malloc(*n);
	cr_assert_eq(arena_img_read_raw(&rd, 0, *n, b), 0, "%s", arena_last_error());
	arena_img_reader_free(&rd);
	arena_img_close(img);
	return b;
}

Test(image, coded_round_trip_is_lossless)
{
	const char *in = fixture_path("tiny_flux.safetensors");
	cr_assert_eq(convert1(in, tmp("p.arena")), 0);
	arena_convert_result res;
	arena_convert_opts o = {.threads = 3, .chunk_size = 64 << 10, .codec = ARENA_CODEC_HB4};
	cr_assert_eq(arena_convert_inputs(&in, 1, tmp("c.arena"), &o, &res), 0, "%s", arena_last_error());
	cr_assert_gt(res.coded_chunks, 0);
	cr_assert_lt(res.stored_bytes, res.data_bytes * 9 / 10, "bf16 weights should code to about 75-80%%");
	cr_assert_eq(open_verify(tmp("c.arena")), 0, "%s", arena_last_error());
	arena_image *img;
	cr_assert_eq(arena_img_open(tmp("c.arena"), &img), 0);
	cr_assert_eq(img->hdr.minor, 1);
	cr_assert(img->hdr.flags & ARENA_IMG_FLAG_CODED);
	arena_img_close(img);
	/* The same raw bytes as the plain image, and the same export. */
	uint64_t n1, n2;
	uint8_t *a = raw_data(tmp("p.arena"), &n1), *b = raw_data(tmp("c.arena"), &n2);
	cr_assert_eq(n1, n2);
	cr_assert_eq(memcmp(a, b, n1), 0);
	free(a);
	free(b);
	cr_assert_eq(arena_export(tmp("c.arena"), tmp("c.safetensors"), 2, NULL), 0, "%s", arena_last_error());
	size_t l1, l2;
	uint8_t *x = slurp(in, &l1), *y = slurp(tmp("c.safetensors"), &l2);
	cr_assert_eq(l1, l2);
	cr_assert_eq(memcmp(x, y, l1), 0, "export of a coded image differs from the source");
	free(x);
	free(y);
	/* A plain (uncoded) image stays format 1.0. */
	cr_assert_eq(arena_img_open(tmp("p.arena"), &img), 0);
	cr_assert_eq(img->hdr.minor, 0);
	arena_img_close(img);
}

Test(image, coded_incompressible_chunks_stay_plain)
{
	/* Random bytes are not worth coding. Still a coded (packed) image, with
	 * every chunk stored as is. */
	arena_stw *w;
	cr_assert_eq(arena_stw_create(tmp("n.safetensors"), &w), 0);
	uint64_t shape[1] = {256 << 10};
	cr_assert_eq(arena_stw_add(w, "blocks.0.w", ARENA_DTYPE_U8, 1, shape), 0);
	cr_assert_eq(arena_stw_add(w, "blocks.1.w", ARENA_DTYPE_U8, 1, shape), 0);
	cr_assert_eq(arena_stw_begin(w), 0);
	uint8_t *noise = malloc(512 << 10);
	uint64_t x = 88172645463325252ull;
	for (size_t i = 0; i < (512u << 10); i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		noise[i] = (uint8_t)x;
	}
	cr_assert_eq(arena_stw_write(w, noise, 512 << 10), 0);
	cr_assert_eq(arena_stw_commit(w), 0);
	free(noise);
	cr_assert_eq(convert_coded(tmp("n.safetensors"), tmp("c.arena"), 64 << 10), 0, "%s", arena_last_error());
	cr_assert_eq(open_verify(tmp("c.arena")), 0);
	arena_image *img;
	cr_assert_eq(arena_img_open(tmp("c.arena"), &img), 0);
	for (uint64_t i = 0; i < img->hdr.chunk_count; i++)
		cr_assert_eq(img->chunks[i].codec, ARENA_CODEC_NONE);
	arena_img_close(img);
}

static void coded_raw(raw_image *r)
{
	cr_assert_eq(convert_coded(fixture_path("tiny_flux.safetensors"), tmp("c.arena"), 64 << 10), 0);
	raw_load(r, tmp("c.arena"));
}

static void no_coded_flag(arena_img_header *h) { h->flags = 0; h->minor = 0; }
static void stored_odd(arena_img_header *h) { h->stored_length += 7; }

Test(image, coded_header_rules)
{
	raw_image r;
	coded_raw(&r);
	raw_write(&r, NULL, tmp("o.arena"), NULL);
	cr_assert_eq(open_verify(tmp("o.arena")), 0, "%s", arena_last_error());
	raw_write(&r, NULL, tmp("o.arena"), no_coded_flag);
	expect_code(open_verify(tmp("o.arena")), IMG_HEADER_BAD);
	raw_write(&r, NULL, tmp("o.arena"), stored_odd);
	expect_code(open_verify(tmp("o.arena")), IMG_HEADER_BAD);
	free(r.buf);
}

static void put32le(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

Test(image, coded_chunk_table_rules)
{
	raw_image r;
	coded_raw(&r);
	uint8_t *e1 = r.buf + r.h.chunk_table_offset + 32; /* chunk 1 */
	uint8_t keep[32];
	memcpy(keep, e1, 32);
	e1[0] ^= 0x10; /* chunk 1 not right after chunk 0 */
	raw_write(&r, NULL, tmp("o.arena"), NULL);
	expect_code(open_verify(tmp("o.arena")), IMG_CHUNK_TABLE_BAD);
	cr_assert(strstr(arena_last_error(), "chunk 1"), "%s", arena_last_error());
	memcpy(e1, keep, 32);
	put32le(e1 + 8, (uint32_t)(e1[12] | e1[13] << 8 | e1[14] << 16 | (uint32_t)e1[15] << 24)); /* stored = raw for hb4 */
	raw_write(&r, NULL, tmp("o.arena"), NULL);
	expect_code(open_verify(tmp("o.arena")), IMG_CHUNK_TABLE_BAD);
	memcpy(e1, keep, 32);
	e1[24] = 9;
	raw_write(&r, NULL, tmp("o.arena"), NULL);
	expect_code(open_verify(tmp("o.arena")), IMG_CODEC);
	memcpy(e1, keep, 32);
	free(r.buf);
	/* hb4 in an image without the coded flag. */
	small_raw(&r);
	r.buf[r.h.chunk_table_offset + 24] = ARENA_CODEC_HB4;
	raw_write(&r, NULL, tmp("o.arena"), NULL);
	expect_code(open_verify(tmp("o.arena")), IMG_CODEC);
	free(r.buf);
}

/* Rewrite chunk i's stored bytes with edit(), then reseal its checksum (so
 * only the structure check can catch it). */
static void reseal_chunk(raw_image *r, uint64_t i, void (*edit)(uint8_t *st, const arena_hb4 *v))
{
	uint8_t *e = r->buf + r->h.chunk_table_offset + i * 32;
	uint64_t off = 0, stored = e[8] | e[9] << 8 | e[10] << 16 | (uint64_t)e[11] << 24;
	uint64_t raw = e[12] | e[13] << 8 | e[14] << 16 | (uint64_t)e[15] << 24;
	for (int k = 7; k >= 0; k--)
		off = off << 8 | e[k];
	uint8_t *st = r->buf + r->h.data_offset + off;
	arena_hb4 v;
	cr_assert_eq(arena_hb4_parse(st, stored, raw, "t", &v), 0);
	edit(st, &v);
	uint64_t hsh = XXH3_64bits(st, stored);
	for (int k = 0; k < 8; k++)
		e[16 + k] = (uint8_t)(hsh >> (8 * k));
}

static void exc_out_of_range(uint8_t *st, const arena_hb4 *v)
{
	cr_assert_gt(v->n_exc, 0, "the test needs a chunk with exceptions");
	put32le(st + v->idx_off + 4 * (v->n_exc - 1), (uint32_t)v->words + 5);
}

static void header_words(uint8_t *st, const arena_hb4 *v)
{
	put32le(st + 4, (uint32_t)v->words - 1);
}

Test(image, coded_chunk_malformed_under_a_good_checksum)
{
	void (*edits[])(uint8_t *, const arena_hb4 *) = {exc_out_of_range, header_words};
	for (size_t k = 0; k < 2; k++) {
		raw_image r;
		coded_raw(&r);
		/* The chunk with the most exceptions. */
		uint64_t best = 0, most = 0;
		for (uint64_t i = 0; i < r.h.chunk_count; i++) {
			uint8_t *e = r.buf + r.h.chunk_table_offset + i * 32;
			uint64_t off = 0;
			for (int b = 7; b >= 0; b--)
				off = off << 8 | e[b];
			uint32_t n = r.buf[r.h.data_offset + off] | r.buf[r.h.data_offset + off + 1] << 8;
			if (e[24] == ARENA_CODEC_HB4 && n > most)
				most = n, best = i;
		}
		reseal_chunk(&r, best, edits[k]);
		raw_write(&r, NULL, tmp("o.arena"), NULL);
		expect_code(open_verify(tmp("o.arena")), IMG_CHUNK_BAD);
		char want[64];
		snprintf(want, sizeof(want), "chunk %llu", (unsigned long long)best);
		cr_assert(strstr(arena_last_error(), want), "%s", arena_last_error());
		/* Export refuses it and writes nothing. */
		cr_assert_neq(arena_export(tmp("o.arena"), tmp("o.safetensors"), 1, NULL), 0);
		cr_assert_eq(access(tmp("o.safetensors"), F_OK), -1);
		free(r.buf);
	}
}

/* ---- padding: every byte no checksum covers is checked to be zero ------------- */

/* Every reader of data refuses the image at path with `code`, and the message
 * names the file and holds `what` (the chunk and the offset): verify, export
 * (which then writes nothing), the checked reader (load --check), the slab
 * re-reader (the engine) and load. */
static void every_reader_refuses(const char *path, int code, const char *what)
{
	int rc = open_verify(path);
	cr_assert_eq(rc, code, "verify: %s: %s", arena_err_name(rc), arena_last_error());
	cr_assert(strstr(arena_last_error(), path) && strstr(arena_last_error(), what), "want %s and '%s' in: %s",
		  path, what, arena_last_error());
	rc = arena_export(path, tmp("e.safetensors"), 1, NULL);
	cr_assert_eq(rc, code, "export: %s: %s", arena_err_name(rc), arena_last_error());
	cr_assert_eq(access(tmp("e.safetensors"), F_OK), -1, "export wrote a file");
	arena_image *img;
	cr_assert_eq(arena_img_open(path, &img), 0, "%s", arena_last_error());
	arena_img_reader rd;
	cr_assert_eq(arena_img_reader_init(&rd, img, 1), 0);
	uint8_t *raw = malloc(img->hdr.data_length);
	rc = arena_img_read_raw(&rd, 0, img->hdr.data_length, raw);
	cr_assert_eq(rc, code, "reader: %s: %s", arena_err_name(rc), arena_last_error());
	cr_assert(strstr(arena_last_error(), what), "reader: want '%s' in: %s", what, arena_last_error());
	arena_img_reader_free(&rd);
	arena_slab_reader *sr;
	cr_assert_eq(arena_slab_reader_open(path, img->layout, &sr), 0, "%s", arena_last_error());
	int refused = 0;
	for (size_t b = 0; b < img->layout->n_blocks; b++) {
		rc = arena_slab_reader_read(sr, (uint32_t)b, raw, img->layout->blocks[b].bytes);
		cr_assert(rc == 0 || rc == code, "reread: %s: %s", arena_err_name(rc), arena_last_error());
		refused += rc == code;
	}
	arena_slab_reader_close(sr);
	free(raw);
	arena_img_close(img);
	cr_assert_gt(refused, 0, "no slab re-read was refused (the bad byte's chunk holds slab bytes in these tests)");
	arena_open_options o = {.backend = "sim", .vram_cap = 64 << 20};
	arena *a = NULL;
	rc = arena_open(path, &o, &a);
	cr_assert_eq(rc, code, "load: %s: %s", arena_err_name(rc), arena_last_error());
	cr_assert(strstr(arena_last_error(), what), "load: want '%s' in: %s", what, arena_last_error());
	cr_assert_null(a);
}

/* Chunk i's entry in a raw image. */
static void entry_of(const raw_image *r, uint64_t i, uint64_t *off, uint64_t *stored, uint64_t *raw, int *codec)
{
	const uint8_t *e = r->buf + r->h.chunk_table_offset + i * 32;
	*off = 0;
	for (int k = 7; k >= 0; k--)
		*off = *off << 8 | e[k];
	*stored = e[8] | e[9] << 8 | e[10] << 16 | (uint64_t)e[11] << 24;
	*raw = e[12] | e[13] << 8 | e[14] << 16 | (uint64_t)e[15] << 24;
	*codec = e[24] | e[25] << 8;
}

static void reseal_entry(raw_image *r, uint64_t i)
{
	uint64_t off, stored, raw;
	int codec;
	entry_of(r, i, &off, &stored, &raw, &codec);
	uint64_t hsh = XXH3_64bits(r->buf + r->h.data_offset + off, stored);
	for (int k = 0; k < 8; k++)
		r->buf[r->h.chunk_table_offset + i * 32 + 16 + k] = (uint8_t)(hsh >> (8 * k));
}

Test(image, coded_stored_padding_flipped)
{
	/* The bytes after a coded chunk's stored bytes, up to the next chunk's
	 * 4096-aligned start, are in no checksum: every reader checks them. */
	raw_image r;
	coded_raw(&r);
	uint64_t tried = 0;
	for (uint64_t i = 0; i < r.h.chunk_count; i++) {
		uint64_t off, stored, raw;
		int codec;
		entry_of(&r, i, &off, &stored, &raw, &codec);
		uint64_t end = (off + stored + 4095) / 4096 * 4096;
		if (end == off + stored || (i && i + 1 < r.h.chunk_count && tried))
			continue; /* the first chunk with padding and the last */
		uint64_t at[3] = {off + stored, (off + stored + end) / 2, end - 1};
		for (int k = 0; k < 3; k++) {
			uint64_t f = r.h.data_offset + at[k];
			r.buf[f] = 0x01;
			spit(tmp("o.arena"), r.buf, r.len);
			char what[128];
			snprintf(what, sizeof(what), "chunk %llu: file byte %llu", (unsigned long long)i, (unsigned long long)f);
			every_reader_refuses(tmp("o.arena"), ARENA_E(IMG_PADDING), what);
			r.buf[f] = 0;
		}
		tried++;
	}
	cr_assert_eq(tried, 2, "the test needs chunks with padding");
	spit(tmp("o.arena"), r.buf, r.len);
	cr_assert_eq(open_verify(tmp("o.arena")), 0, "%s", arena_last_error());
	free(r.buf);
}

Test(image, every_byte_flipped_coded)
{
	slow_test();
	/* Every byte of a coded image is in a checksum or checked to be zero:
	 * every 11th byte of the stored padding after each chunk, fewer elsewhere. */
	cr_assert_eq(convert_coded(fixture_path("tiny_flux.safetensors"), tmp("c.arena"), 64 << 10), 0);
	arena_image *img;
	cr_assert_eq(arena_img_open(tmp("c.arena"), &img), 0);
	arena_img_header h = img->hdr;
	uint64_t n = h.chunk_count, *end = calloc(n, sizeof(*end)), pad = 0;
	for (uint64_t i = 0; i < n; i++) {
		end[i] = h.data_offset + img->chunks[i].offset + img->chunks[i].stored_length;
		pad += arena_img_chunk_padded(img, i) - img->chunks[i].stored_length;
	}
	arena_img_close(img);
	cr_assert_gt(pad, 4096, "the test needs stored padding");
	int fd = open(tmp("c.arena"), O_RDWR);
	for (uint64_t i = 0, k = 0; i < h.file_size;) {
		uint8_t c, x;
		cr_assert_eq(pread(fd, &c, 1, (off_t)i), 1);
		x = c ^ 0x04;
		cr_assert_eq(pwrite(fd, &x, 1, (off_t)i), 1);
		while (k + 1 < n && i >= (end[k] + 4095) / 4096 * 4096)
			k++;
		int in_pad = i >= h.data_offset && i >= end[k] && i < (end[k] + 4095) / 4096 * 4096;
		int want = in_pad ? ARENA_E(IMG_PADDING) : region_code(&h, i), rc = open_verify(tmp("c.arena"));
		cr_assert_eq(rc, want, "byte %llu flipped: got %s (%s)", (unsigned long long)i, arena_err_name(rc),
			     arena_last_error());
		cr_assert_eq(pwrite(fd, &c, 1, (off_t)i), 1);
		i += i < h.data_offset ? 61 : in_pad ? 11 : 127;
	}
	close(fd);
	free(end);
	cr_assert_eq(open_verify(tmp("c.arena")), 0);
}

/* Raw data bytes that are padding (in no component) of an image: the first
 * inside a slab (between or after its components), the first between two
 * slabs, and the last byte of the data; UINT64_MAX where there is none.
 * even: only even offsets (a low byte of an hb4 word). */
static void padding_bytes(const char *path, int even, uint64_t *in_slab, uint64_t *between, uint64_t *last)
{
	arena_image *img;
	cr_assert_eq(arena_img_open(path, &img), 0);
	const arena_layout *l = img->layout;
	uint64_t n = img->hdr.data_length;
	uint8_t *used = calloc(n, 1), *slab = calloc(n, 1);
	for (size_t b = 0; b < l->n_blocks; b++)
		memset(slab + l->blocks[b].offset, 1, l->blocks[b].bytes);
	for (size_t i = 0; i < l->n_tensors; i++)
		for (uint32_t c = 0; c < l->tensors[i].n_comp; c++)
			memset(used + l->blocks[l->tensors[i].block].offset + l->tensors[i].comp[c].offset, 1,
			       l->tensors[i].comp[c].bytes);
	*in_slab = *between = *last = UINT64_MAX;
	for (uint64_t k = 0; k < n; k++) {
		if (used[k] || (even && k % 2))
			continue;
		if (slab[k] && *in_slab == UINT64_MAX)
			*in_slab = k;
		if (!slab[k] && *between == UINT64_MAX)
			*between = k;
		*last = k;
	}
	free(used);
	free(slab);
	arena_img_close(img);
}

Test(image, raw_padding_not_zero_plain)
{
	/* Under a good checksum: between components, between slabs, the tail. */
	raw_image r;
	small_raw(&r);
	uint64_t at[3];
	padding_bytes(tmp("s.arena"), 0, &at[0], &at[1], &at[2]);
	for (int k = 0; k < 3; k++) {
		cr_assert_neq(at[k], UINT64_MAX);
		r.buf[r.h.data_offset + at[k]] = 0x80;
		reseal_entry(&r, at[k] / r.h.chunk_size);
		raw_write(&r, NULL, tmp("o.arena"), NULL);
		char what[128];
		snprintf(what, sizeof(what), "chunk %llu: data byte %llu", (unsigned long long)(at[k] / r.h.chunk_size),
			 (unsigned long long)at[k]);
		every_reader_refuses(tmp("o.arena"), ARENA_E(IMG_PADDING), what);
		r.buf[r.h.data_offset + at[k]] = 0;
		reseal_entry(&r, at[k] / r.h.chunk_size);
	}
	raw_write(&r, NULL, tmp("o.arena"), NULL);
	cr_assert_eq(open_verify(tmp("o.arena")), 0, "%s", arena_last_error());
	free(r.buf);
}

Test(image, raw_padding_not_zero_coded)
{
	/* A padding word's low byte made non-zero in the stored planes of an hb4
	 * chunk, chunk checksum resealed: the checksum holds, the raw bytes the
	 * chunk decodes to do not. */
	raw_image r;
	coded_raw(&r);
	uint64_t at[3];
	padding_bytes(tmp("c.arena"), 1, &at[0], &at[1], &at[2]);
	for (int k = 0; k < 3; k++) {
		cr_assert_neq(at[k], UINT64_MAX);
		uint64_t i = at[k] / r.h.chunk_size, off, stored, raw;
		int codec;
		entry_of(&r, i, &off, &stored, &raw, &codec);
		cr_assert_eq(codec, ARENA_CODEC_HB4, "the test needs padding in coded chunks");
		uint8_t *st = r.buf + r.h.data_offset + off;
		arena_hb4 v;
		cr_assert_eq(arena_hb4_parse(st, stored, raw, "t", &v), 0);
		uint8_t *low = st + v.low_off + (at[k] - i * r.h.chunk_size) / 2;
		cr_assert_eq(*low, 0);
		*low = 0x80;
		reseal_entry(&r, i);
		raw_write(&r, NULL, tmp("o.arena"), NULL);
		char what[128];
		snprintf(what, sizeof(what), "chunk %llu: data byte %llu", (unsigned long long)i, (unsigned long long)at[k]);
		every_reader_refuses(tmp("o.arena"), ARENA_E(IMG_PADDING), what);
		*low = 0;
		reseal_entry(&r, i);
	}
	raw_write(&r, NULL, tmp("o.arena"), NULL);
	cr_assert_eq(open_verify(tmp("o.arena")), 0, "%s", arena_last_error());
	free(r.buf);
}

/* Write failures (disk full), allocation failures and read failures at each
 * point of a coded convert: an error, and nothing left behind. */
static void coded_faults_leave_nothing(unsigned codec)
{
	const char *in = fixture_path("tiny_flux.safetensors");
	arena_convert_opts o = {.threads = 2, .chunk_size = 64 << 10, .codec = codec};
	int fired = 0;
	for (long n = 1; n < 64; n++) {
		arena_fault_write(n);
		int rc = arena_convert_inputs(&in, 1, tmp("x.arena"), &o, NULL);
		arena_fault_write(0);
		if (rc == 0)
			break;
		fired++;
		expect_code(rc, IO);
		cr_assert_eq(dir_entries(tmpdir), 0, "a failed convert left a file behind (n=%ld)", n);
	}
	cr_assert_gt(fired, 3);
	cr_assert_eq(open_verify(tmp("x.arena")), 0);
	unlink(tmp("x.arena"));
	convert_alloc_faults(in, &o, 7, 100, 0);
	unlink(tmp("x.arena"));
	/* A read failure in the middle of a coded convert (workers waiting for
	 * their place in the file must not hang). */
	for (long k = 1; k < 12; k++) {
		arena_fault_read(k);
		int rc = arena_convert_inputs(&in, 1, tmp("x.arena"), &o, NULL);
		arena_fault_read(0);
		cr_assert(rc == ARENA_E_IO || rc == 0, "%s", arena_last_error());
		cr_assert_eq(dir_entries(tmpdir), rc == 0, "k=%ld rc=%d entries %d", k, rc, dir_entries(tmpdir));
		unlink(tmp("x.arena"));
	}
}

Test(image, coded_disk_full_and_allocation_failures_leave_nothing)
{
	slow_test();
	coded_faults_leave_nothing(ARENA_CODEC_HB4);
}

/* ---- zstd images (format 1.2) ------------------------------------------------- */

static int convert_zstd(const char *in, const char *out, uint64_t chunk, int level)
{
	arena_convert_opts o = {.threads = 2, .chunk_size = chunk, .codec = ARENA_CODEC_ZSTD, .zstd_level = level, .force = 1};
	return arena_convert_inputs(&in, 1, out, &o, NULL);
}

static void zstd_raw(raw_image *r)
{
	cr_assert_eq(convert_zstd(fixture_path("tiny_flux.safetensors"), tmp("z.arena"), 64 << 10, 0), 0, "%s",
		     arena_last_error());
	raw_load(r, tmp("z.arena"));
}

static void write_weights(const char *path, size_t n, const char *const *names, const arena_dtype *dt,
			  const uint64_t (*shape)[2]);

/* A zstd image of bf16 blocks whose low bytes are noise (stored as is) and
 * whose tensors leave padding inside and between slabs; z.arena. */
static void zstd_weights_raw(raw_image *r)
{
	const char *names[] = {"blocks.0.w", "blocks.0.b", "blocks.1.w", "blocks.1.b", "blocks.2.w", "embed"};
	const arena_dtype dt[] = {ARENA_DTYPE_BF16, ARENA_DTYPE_F32, ARENA_DTYPE_BF16,
				  ARENA_DTYPE_F32, ARENA_DTYPE_BF16, ARENA_DTYPE_BF16};
	const uint64_t shape[6][2] = {{600, 130}, {130, 0}, {600, 130}, {130, 0}, {600, 130}, {77, 64}};
	write_weights(tmp("zw.safetensors"), 6, names, dt, shape);
	cr_assert_eq(convert_zstd(tmp("zw.safetensors"), tmp("z.arena"), 64 << 10, 0), 0, "%s", arena_last_error());
	raw_load(r, tmp("z.arena"));
}

Test(image, zstd_round_trip_is_lossless)
{
	const char *in = fixture_path("tiny_flux.safetensors");
	cr_assert_eq(convert1(in, tmp("p.arena")), 0);
	for (int level = 0; level <= 19; level += level < 3 ? 1 : 8) {
		arena_convert_result res;
		arena_convert_opts o = {.threads = 3, .chunk_size = 64 << 10, .codec = ARENA_CODEC_ZSTD, .zstd_level = level,
					.force = 1};
		cr_assert_eq(arena_convert_inputs(&in, 1, tmp("z.arena"), &o, &res), 0, "%s", arena_last_error());
		cr_assert_eq(res.coded_chunks, res.chunk_count);
		cr_assert_lt(res.stored_bytes, res.data_bytes * 3 / 4, "level %d: %llu of %llu", level,
			     (unsigned long long)res.stored_bytes, (unsigned long long)res.data_bytes);
		cr_assert_eq(open_verify(tmp("z.arena")), 0, "%s", arena_last_error());
		arena_image *img;
		cr_assert_eq(arena_img_open(tmp("z.arena"), &img), 0);
		cr_assert_eq(img->hdr.minor, 2);
		cr_assert_eq(img->hdr.flags, ARENA_IMG_FLAG_CODED | ARENA_IMG_FLAG_ZSTD);
		json_t *ver = json_object_get(img->manifest, "version");
		cr_assert_eq(json_integer_value(json_array_get(ver, 1)), 2);
		for (uint64_t i = 0; i < img->hdr.chunk_count; i++)
			cr_assert_eq(img->chunks[i].codec, ARENA_CODEC_ZSTD);
		arena_img_close(img);
		uint64_t n1, n2;
		uint8_t *a = raw_data(tmp("p.arena"), &n1), *b = raw_data(tmp("z.arena"), &n2);
		cr_assert_eq(n1, n2);
		cr_assert_eq(memcmp(a, b, n1), 0, "level %d", level);
		free(a);
		free(b);
	}
	cr_assert_eq(arena_export(tmp("z.arena"), tmp("z.safetensors"), 2, NULL), 0, "%s", arena_last_error());
	size_t l1, l2;
	uint8_t *x = slurp(in, &l1), *y = slurp(tmp("z.safetensors"), &l2);
	cr_assert_eq(l1, l2);
	cr_assert_eq(memcmp(x, y, l1), 0, "export of a zstd image differs from the source");
	free(x);
	free(y);
	arena_convert_opts bad = {.codec = ARENA_CODEC_ZSTD, .zstd_level = 20};
	expect_code(arena_convert_inputs(&in, 1, tmp("b.arena"), &bad, NULL), USAGE);
	cr_assert_eq(access(tmp("b.arena"), F_OK), -1);
}

/* Weights-like bytes for a tensor of `dtype`: random low bytes, and in each
 * element's top byte (and an f64's next) few values, as in real weights. */
static void weight_bytes(arena_dtype dtype, uint8_t *b, uint64_t n, uint64_t *x)
{
	const unsigned size = arena_dtype_bits(dtype) / 8;
	for (uint64_t i = 0; i < n; i++) {
		*x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;
		b[i] = (uint8_t)*x;
	}
	for (uint64_t e = 0; e < n / size; e++) {
		uint8_t *el = b + e * size;
		el[size - 1] = (uint8_t)((0x3c + (el[0] & 3)) | (el[1 % size] & 0x80));
		if (size == 8)
			el[6] = (uint8_t)(0xf0 + (el[0] >> 6));
	}
}

/* A checkpoint of the tensors named, shaped and typed as given (rank 1 or
 * 2), each filled with weight_bytes. */
static void write_weights(const char *path, size_t n, const char *const *names, const arena_dtype *dt,
			  const uint64_t (*shape)[2])
{
	arena_stw *w;
	cr_assert_eq(arena_stw_create(path, &w), 0);
	for (size_t k = 0; k < n; k++)
		cr_assert_eq(arena_stw_add(w, names[k], dt[k], shape[k][1] ? 2 : 1, shape[k]), 0);
	cr_assert_eq(arena_stw_begin(w), 0);
	uint64_t x = 0x9E3779B97F4A7C15ull;
	for (size_t i = 0; i < arena_stw_count(w); i++) { /* in the file's order */
		const arena_stw_tensor *t = arena_stw_get(w, i);
		uint8_t *b = malloc(t->nbytes);
		weight_bytes(t->dtype, b, t->nbytes, &x);
		cr_assert_eq(arena_stw_write(w, b, t->nbytes), 0);
		free(b);
	}
	cr_assert_eq(arena_stw_commit(w), 0);
}

/* One block of 320 KiB for each element width: chunks of 64 KiB, each of
 * one width. */
Test(image, zstd_every_element_width)
{
	const char *names[] = {"blocks.0.w", "blocks.1.w", "blocks.2.w", "blocks.3.w"};
	const arena_dtype dt[] = {ARENA_DTYPE_F8_E4M3, ARENA_DTYPE_BF16, ARENA_DTYPE_F32, ARENA_DTYPE_F64};
	const uint64_t shape[4][2] = {{320 << 10, 0}, {160 << 10, 0}, {80 << 10, 0}, {40 << 10, 0}};
	const unsigned size[] = {1, 2, 4, 8};
	write_weights(tmp("w.safetensors"), 4, names, dt, shape);
	cr_assert_eq(convert_zstd(tmp("w.safetensors"), tmp("w.arena"), 64 << 10, 0), 0, "%s", arena_last_error());
	cr_assert_eq(convert1(tmp("w.safetensors"), tmp("p.arena")), 0);
	arena_image *img;
	cr_assert_eq(arena_img_open(tmp("w.arena"), &img), 0);
	unsigned seen = 0;
	for (uint64_t i = 0; i < img->hdr.chunk_count; i++) {
		const arena_img_chunk *c = &img->chunks[i];
		cr_assert_eq(c->codec, ARENA_CODEC_ZSTD, "chunk %llu", (unsigned long long)i);
		uint8_t g;
		cr_assert_eq(arena_pread_full(img->fd, &g, 1, img->hdr.data_offset + c->offset, "t"), 0);
		/* Chunk i lies in block i / 5: the width of its dtype. */
		cr_assert_eq(g, size[i / 5], "chunk %llu has width %u", (unsigned long long)i, g);
		seen |= g;
	}
	cr_assert_eq(seen, 1 | 2 | 4 | 8);
	arena_img_close(img);
	uint64_t n1, n2;
	uint8_t *p = raw_data(tmp("p.arena"), &n1), *z = raw_data(tmp("w.arena"), &n2);
	cr_assert_eq(n1, n2);
	cr_assert_eq(memcmp(p, z, n1), 0);
	free(p);
	free(z);
	cr_assert_eq(arena_export(tmp("w.arena"), tmp("w2.safetensors"), 2, NULL), 0, "%s", arena_last_error());
	size_t l1, l2;
	uint8_t *s1 = slurp(tmp("w.safetensors"), &l1), *s2 = slurp(tmp("w2.safetensors"), &l2);
	cr_assert(l1 == l2 && !memcmp(s1, s2, l1));
	free(s1);
	free(s2);
}

static void zstd_without_its_flag(arena_img_header *h) { h->flags = ARENA_IMG_FLAG_CODED; h->minor = 1; }

Test(image, zstd_header_and_chunk_table_rules)
{
	raw_image r;
	zstd_raw(&r);
	raw_write(&r, NULL, tmp("o.arena"), NULL);
	cr_assert_eq(open_verify(tmp("o.arena")), 0, "%s", arena_last_error());
	/* zstd chunks in an image without the zstd flag (a 1.1 image). */
	raw_write(&r, NULL, tmp("o.arena"), zstd_without_its_flag);
	expect_code(open_verify(tmp("o.arena")), IMG_CODEC);
	cr_assert(strstr(arena_last_error(), "without the zstd flag"), "%s", arena_last_error());
	/* A zstd chunk whose entry says it is no smaller than raw. */
	uint8_t *e1 = r.buf + r.h.chunk_table_offset + 32, keep[32];
	memcpy(keep, e1, 32);
	put32le(e1 + 8, (uint32_t)(e1[12] | e1[13] << 8 | e1[14] << 16 | (uint32_t)e1[15] << 24));
	raw_write(&r, NULL, tmp("o.arena"), NULL);
	expect_code(open_verify(tmp("o.arena")), IMG_CHUNK_TABLE_BAD);
	memcpy(e1, keep, 32);
	e1[24] = 3;
	raw_write(&r, NULL, tmp("o.arena"), NULL);
	expect_code(open_verify(tmp("o.arena")), IMG_CODEC);
	memcpy(e1, keep, 32);
	free(r.buf);
	/* zstd in a plain image, and in an hb4 image. */
	small_raw(&r);
	r.buf[r.h.chunk_table_offset + 24] = ARENA_CODEC_ZSTD;
	raw_write(&r, NULL, tmp("o.arena"), NULL);
	expect_code(open_verify(tmp("o.arena")), IMG_CODEC);
	free(r.buf);
	coded_raw(&r);
	r.buf[r.h.chunk_table_offset + 24] = ARENA_CODEC_ZSTD;
	raw_write(&r, NULL, tmp("o.arena"), NULL);
	expect_code(open_verify(tmp("o.arena")), IMG_CODEC);
	free(r.buf);
}

/* Chunk i's stored bytes in a raw image, parsed as zstd. */
static uint8_t *zstd_chunk(raw_image *r, uint64_t i, arena_zstd *v, uint64_t *stored, uint64_t *raw)
{
	uint64_t off;
	int codec;
	entry_of(r, i, &off, stored, raw, &codec);
	cr_assert_eq(codec, ARENA_CODEC_ZSTD);
	uint8_t *st = r->buf + r->h.data_offset + off;
	cr_assert_eq(arena_zstd_parse(st, *stored, *raw, "t", v), 0, "%s", arena_last_error());
	return st;
}

Test(image, zstd_chunk_malformed_under_a_good_checksum)
{
	/* Damage under a resealed checksum, so that only the structure check
	 * (header, frame headers, then the bounded decode) can catch it; every
	 * reader names the chunk and writes nothing. */
	for (int k = 0; k < 5; k++) {
		raw_image r;
		zstd_weights_raw(&r);
		arena_zstd v;
		uint64_t stored, raw, i = 0;
		uint8_t *st;
		do /* a chunk whose high bytes are packed, its low bytes (noise) stored as is */
			st = zstd_chunk(&r, i, &v, &stored, &raw);
		while (v.packed != 2 && ++i < r.h.chunk_count);
		cr_assert_lt(i, r.h.chunk_count, "no chunk with only its high bytes packed");
		const char *says = NULL;
		switch (k) {
		case 0: st[4] ^= 1, says = "raw bytes, the chunk table"; break;          /* header raw length */
		case 1: st[1] = 3, says = "zstd stream 0: a "; break;                     /* low stream said packed */
		case 2: st[v.off[1]] ^= 0xff, says = "not a zstd frame"; break;          /* frame magic */
		case 3: st[v.off[1] + v.len[1] / 2] ^= 0x5a, says = "zstd stream 1"; break; /* a block */
		case 4: st[v.off[1] + v.len[1] - 1] ^= 0x80, says = "zstd stream 1"; break; /* the last block */
		}
		reseal_entry(&r, i);
		raw_write(&r, NULL, tmp("o.arena"), NULL);
		int rc = open_verify(tmp("o.arena"));
		if (k >= 3 && rc == 0) { /* zstd decoded the damaged block to the same size: the bytes differ */
			uint64_t n;
			uint8_t *b = raw_data(tmp("o.arena"), &n), *p = raw_data(tmp("z.arena"), &n);
			cr_assert_neq(memcmp(b, p, n), 0);
			free(b), free(p), free(r.buf);
			continue;
		}
		char want[64];
		snprintf(want, sizeof(want), "chunk %llu (file bytes", (unsigned long long)i);
		every_reader_refuses(tmp("o.arena"), ARENA_E(IMG_CHUNK_BAD), want);
		cr_assert(strstr(arena_last_error(), says), "case %d: want '%s' in: %s", k, says, arena_last_error());
		free(r.buf);
	}
}

Test(image, zstd_stored_padding_flipped)
{
	raw_image r;
	zstd_raw(&r);
	uint64_t tried = 0;
	for (uint64_t i = 0; i < r.h.chunk_count && tried < 2; i++) {
		uint64_t off, stored, raw;
		int codec;
		entry_of(&r, i, &off, &stored, &raw, &codec);
		uint64_t end = (off + stored + 4095) / 4096 * 4096;
		if (end == off + stored)
			continue;
		uint64_t f = r.h.data_offset + (tried ? end - 1 : off + stored);
		r.buf[f] = 0x01;
		spit(tmp("o.arena"), r.buf, r.len);
		char what[128];
		snprintf(what, sizeof(what), "chunk %llu: file byte %llu", (unsigned long long)i, (unsigned long long)f);
		every_reader_refuses(tmp("o.arena"), ARENA_E(IMG_PADDING), what);
		r.buf[f] = 0;
		tried++;
	}
	cr_assert_eq(tried, 2);
	free(r.buf);
}

/* Chunk i of a raw zstd image coded again from its raw bytes with one byte
 * set to x (at raw offset `at` of the chunk), in the same pages, its
 * entry's stored length and checksum updated. */
static void recode_zstd_chunk(raw_image *r, uint64_t i, uint64_t at, uint8_t x)
{
	arena_zstd v;
	uint64_t stored, raw, off, s2, r2;
	int codec;
	uint8_t *st = zstd_chunk(r, i, &v, &stored, &raw);
	arena_zstd_work w = {0};
	cr_assert_eq(arena_zstd_decode(&w, &v, st, "t"), 0);
	uint8_t *b = malloc(raw), *enc = malloc(raw);
	arena_zstd_gather(&v, 0, raw, b);
	b[at] = x;
	uint64_t n;
	cr_assert_eq(arena_zstd_encode(&w, b, raw, v.width, 0, enc, &n), 0);
	cr_assert_eq((n + 4095) / 4096, (stored + 4095) / 4096, "the chunk no longer fits its pages");
	memset(st, 0, (stored + 4095) / 4096 * 4096);
	memcpy(st, enc, n);
	put32le(r->buf + r->h.chunk_table_offset + i * 32 + 8, (uint32_t)n);
	entry_of(r, i, &off, &s2, &r2, &codec);
	cr_assert_eq(s2, n);
	reseal_entry(r, i);
	arena_zstd_work_free(&w);
	free(b);
	free(enc);
}

Test(image, zstd_raw_padding_not_zero)
{
	/* Padding bytes made non-zero in the raw bytes a zstd chunk decodes to,
	 * the chunk coded again and its checksum resealed: the checksum holds,
	 * the raw bytes do not. Inside a slab, between slabs, the data's last. */
	raw_image r;
	zstd_weights_raw(&r);
	uint64_t at[3];
	padding_bytes(tmp("z.arena"), 0, &at[0], &at[1], &at[2]);
	for (int k = 0; k < 3; k++) {
		cr_assert_neq(at[k], UINT64_MAX);
		uint64_t i = at[k] / r.h.chunk_size, c0 = i * r.h.chunk_size;
		uint8_t *keep = malloc(r.len);
		memcpy(keep, r.buf, r.len);
		recode_zstd_chunk(&r, i, at[k] - c0, 0x80);
		raw_write(&r, NULL, tmp("o.arena"), NULL);
		char what[128];
		snprintf(what, sizeof(what), "chunk %llu: data byte %llu", (unsigned long long)i, (unsigned long long)at[k]);
		every_reader_refuses(tmp("o.arena"), ARENA_E(IMG_PADDING), what);
		memcpy(r.buf, keep, r.len);
		free(keep);
	}
	/* The same recoding with the byte left zero is a valid image. */
	recode_zstd_chunk(&r, at[0] / r.h.chunk_size, at[0] % r.h.chunk_size, 0);
	raw_write(&r, NULL, tmp("o.arena"), NULL);
	cr_assert_eq(open_verify(tmp("o.arena")), 0, "%s", arena_last_error());
	free(r.buf);
}

Test(image, every_byte_flipped_zstd)
{
	slow_test();
	/* Every byte of a zstd image is in a checksum or checked to be zero. */
	cr_assert_eq(convert_zstd(fixture_path("tiny_flux.safetensors"), tmp("z.arena"), 64 << 10, 0), 0);
	arena_image *img;
	cr_assert_eq(arena_img_open(tmp("z.arena"), &img), 0);
	arena_img_header h = img->hdr;
	uint64_t n = h.chunk_count, *end = calloc(n, sizeof(*end));
	for (uint64_t i = 0; i < n; i++)
		end[i] = h.data_offset + img->chunks[i].offset + img->chunks[i].stored_length;
	arena_img_close(img);
	int fd = open(tmp("z.arena"), O_RDWR);
	for (uint64_t i = 0, k = 0; i < h.file_size;) {
		uint8_t c, x;
		cr_assert_eq(pread(fd, &c, 1, (off_t)i), 1);
		x = c ^ 0x04;
		cr_assert_eq(pwrite(fd, &x, 1, (off_t)i), 1);
		while (k + 1 < n && i >= (end[k] + 4095) / 4096 * 4096)
			k++;
		int in_pad = i >= h.data_offset && i >= end[k] && i < (end[k] + 4095) / 4096 * 4096;
		int want = in_pad ? ARENA_E(IMG_PADDING) : region_code(&h, i), rc = open_verify(tmp("z.arena"));
		cr_assert_eq(rc, want, "byte %llu flipped: got %s (%s)", (unsigned long long)i, arena_err_name(rc),
			     arena_last_error());
		cr_assert_eq(pwrite(fd, &c, 1, (off_t)i), 1);
		i += i < h.data_offset ? 61 : in_pad ? 11 : 97;
	}
	close(fd);
	free(end);
	cr_assert_eq(open_verify(tmp("z.arena")), 0);
}

Test(image, zstd_disk_full_and_allocation_failures_leave_nothing)
{
	slow_test();
	coded_faults_leave_nothing(ARENA_CODEC_ZSTD);
}
