/* cmd_inspect.c - `arena inspect`: what a checkpoint or image holds. */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "../common/err.h"
#include "../formats/checkpoint.h"
#include "../formats/codec.h"
#include "../formats/image.h"
#include "../loader/plan.h"
#include "arena.h"
#include "cli.h"

const char cmd_inspect_usage[] =
	"usage: arena inspect PATH [--json]\n"
	"\n"
	"Show what PATH holds: metadata, then every tensor (name, dtype, shape, bytes,\n"
	"file, offset), then totals by dtype. PATH is a .safetensors file, a sharded\n"
	"checkpoint's index (model.safetensors.index.json), a folder holding either,\n"
	"or an arena image (then also its blocks, chunk size and layout; the image's\n"
	"header, manifest and chunk table are checked, its data is not: see verify).\n"
	"The input is validated first, by the rules convert applies (a tensor's rank\n"
	"at most 8, say); an invalid file is an error (exit 1).\n"
	"\n"
	"options:\n"
	"  --json     machine-readable output (schema in README.md, 'arena inspect --json')\n"
	"  -h, --help this text\n";

static const char *base_name(const char *p)
{
	const char *s = strrchr(p, '/');
	return s ? s + 1 : p;
}

typedef struct dtype_total {
	uint64_t tensors, bytes;
} dtype_total;

static void totals(const arena_ckpt *c, dtype_total *t)
{
	memset(t, 0, sizeof(dtype_total) * ARENA_DTYPE_COUNT);
	for (size_t i = 0; i < c->n_tensors; i++) {
		t[c->tensors[i]->dtype].tensors++;
		t[c->tensors[i]->dtype].bytes += c->tensors[i]->nbytes;
	}
}

static json_t *shape_json(const arena_st_tensor *t)
{
	json_t *a = json_array();
	for (uint32_t k = 0; k < t->rank; k++)
		json_array_append_new(a, json_integer((json_int_t)t->shape[k]));
	return a;
}

static int print_ckpt_json(const char *path, const arena_ckpt *c)
{
	json_t *o = json_object();
	json_object_set_new(o, "kind", json_string("safetensors"));
	json_object_set_new(o, "path", json_string(path));
	json_object_set_new(o, "index", c->index_path ? json_string(c->index_path) : json_null());
	json_object_set_new(o, "index_metadata",
			    c->index_meta ? json_deep_copy((const json_t *)c->index_meta) : json_null());
	json_t *files = json_array();
	for (size_t i = 0; i < c->n_files; i++) {
		const arena_st_file *f = c->files[i];
		json_t *fo = json_object(), *meta = json_object();
		json_object_set_new(fo, "path", json_string(f->path));
		json_object_set_new(fo, "size", json_integer((json_int_t)f->size));
		json_object_set_new(fo, "header_bytes", json_integer((json_int_t)f->header_len));
		json_object_set_new(fo, "data_offset", json_integer((json_int_t)f->data_off));
		json_object_set_new(fo, "tensors", json_integer((json_int_t)f->n_tensors));
		for (size_t k = 0; k < f->n_meta; k++)
			json_object_set_new(meta, f->meta_keys[k], json_string(f->meta_vals[k]));
		json_object_set_new(fo, "metadata", meta);
		json_array_append_new(files, fo);
	}
	json_object_set_new(o, "files", files);
	json_t *ts = json_array();
	for (size_t i = 0; i < c->n_tensors; i++) {
		const arena_st_tensor *t = c->tensors[i];
		json_t *to = json_object();
		json_object_set_new(to, "name", json_string(t->name));
		json_object_set_new(to, "dtype", json_string(arena_dtype_name(t->dtype)));
		json_object_set_new(to, "shape", shape_json(t));
		json_object_set_new(to, "bytes", json_integer((json_int_t)t->nbytes));
		json_object_set_new(to, "file", json_string(t->file->path));
		json_object_set_new(to, "offset", json_integer((json_int_t)(t->file->data_off + t->begin)));
		json_object_set_new(to, "data_offsets",
				    json_pack("[II]", (json_int_t)t->begin, (json_int_t)t->end));
		json_array_append_new(ts, to);
	}
	json_object_set_new(o, "tensors", ts);
	dtype_total tot[ARENA_DTYPE_COUNT];
	totals(c, tot);
	json_t *by = json_array();
	for (int d = 0; d < ARENA_DTYPE_COUNT; d++)
		if (tot[d].tensors)
			json_array_append_new(by, json_pack("{s:s,s:I,s:I}", "dtype", arena_dtype_name((arena_dtype)d),
							    "tensors", (json_int_t)tot[d].tensors, "bytes",
							    (json_int_t)tot[d].bytes));
	json_object_set_new(o, "totals",
			    json_pack("{s:I,s:I,s:o}", "tensors", (json_int_t)c->n_tensors, "bytes",
				      (json_int_t)arena_ckpt_bytes(c), "by_dtype", by));
	return cli_print_json(o);
}

static void fmt_shape(const arena_st_tensor *t, char *buf, size_t len)
{
	size_t o = (size_t)snprintf(buf, len, "[");
	for (uint32_t k = 0; k < t->rank && o < len; k++)
		o += (size_t)snprintf(buf + o, len - o, "%s%llu", k ? ", " : "", (unsigned long long)t->shape[k]);
	if (o < len)
		snprintf(buf + o, len - o, "]");
}

static int print_ckpt_text(const char *path, const arena_ckpt *c)
{
	char b1[32];
	printf("checkpoint: %s\n", path);
	if (c->index_path)
		printf("index:      %s\n", c->index_path);
	printf("tensors:    %zu in %zu file%s, %s (%llu bytes)\n", c->n_tensors, c->n_files,
	       c->n_files == 1 ? "" : "s", cli_fmt_bytes(arena_ckpt_bytes(c), b1, sizeof(b1)),
	       (unsigned long long)arena_ckpt_bytes(c));
	for (size_t i = 0; i < c->n_files; i++) {
		const arena_st_file *f = c->files[i];
		printf("\nfile %s: %llu bytes, header %llu bytes, %zu tensors\n", f->path,
		       (unsigned long long)f->size, (unsigned long long)f->header_len, f->n_tensors);
		if (f->n_meta) {
			printf("metadata:\n");
			for (size_t k = 0; k < f->n_meta; k++)
				printf("  %s: %s\n", arena_q(f->meta_keys[k]), arena_q(f->meta_vals[k]));
		}
	}
	int w = 4;
	for (size_t i = 0; i < c->n_tensors; i++) {
		int l = (int)strlen(arena_q(c->tensors[i]->name));
		w = l > w ? l : w;
	}
	printf("\n%-*s  %-11s  %-18s %12s  %s\n", w, "name", "dtype", "shape", "bytes", "file@offset");
	for (size_t i = 0; i < c->n_tensors; i++) {
		const arena_st_tensor *t = c->tensors[i];
		char shape[256];
		fmt_shape(t, shape, sizeof(shape));
		printf("%-*s  %-11s  %-18s %12llu  %s@%llu\n", w, arena_q(t->name), arena_dtype_name(t->dtype), shape,
		       (unsigned long long)t->nbytes, base_name(t->file->path),
		       (unsigned long long)(t->file->data_off + t->begin));
	}
	dtype_total tot[ARENA_DTYPE_COUNT];
	totals(c, tot);
	printf("\ntotals by dtype:\n");
	for (int d = 0; d < ARENA_DTYPE_COUNT; d++)
		if (tot[d].tensors)
			printf("  %-11s %6llu tensors %14llu bytes  %s\n", arena_dtype_name((arena_dtype)d),
			       (unsigned long long)tot[d].tensors, (unsigned long long)tot[d].bytes,
			       cli_fmt_bytes(tot[d].bytes, b1, sizeof(b1)));
	return 0;
}

static json_t *dims_json(uint32_t rank, const uint64_t *shape)
{
	json_t *a = json_array();
	for (uint32_t k = 0; k < rank; k++)
		json_array_append_new(a, json_integer((json_int_t)shape[k]));
	return a;
}

static void fmt_dims(uint32_t rank, const uint64_t *shape, char *buf, size_t len)
{
	size_t o = (size_t)snprintf(buf, len, "[");
	for (uint32_t k = 0; k < rank && o < len; k++)
		o += (size_t)snprintf(buf + o, len - o, "%s%llu", k ? ", " : "", (unsigned long long)shape[k]);
	if (o < len)
		snprintf(buf + o, len - o, "]");
}

static uint64_t tensor_bytes(const arena_tensor *t)
{
	uint64_t s = 0;
	for (uint32_t c = 0; c < t->n_comp; c++)
		s += t->comp[c].bytes;
	return s;
}

/* Bytes the tensor would take in its original dtype (0 if unknown). */
static uint64_t logical_bytes(const arena_tensor *t)
{
	uint64_t n = 0;
	return arena_nbytes(t->dtype, t->rank, t->shape, &n) ? 0 : n;
}

static int print_image_json(const char *path, const arena_image *img)
{
	const arena_layout *l = img->layout;
	const arena_img_header *h = &img->hdr;
	json_t *o = json_object();
	char ver[16];
	snprintf(ver, sizeof(ver), "%u.%u", h->major, h->minor);
	json_object_set_new(o, "kind", json_string("arena-image"));
	json_object_set_new(o, "path", json_string(path));
	json_object_set_new(o, "version", json_string(ver));
	json_object_set_new(o, "file_size", json_integer((json_int_t)h->file_size));
	json_object_set_new(o, "layout",
			    json_pack("{s:I,s:I,s:I,s:I,s:i,s:i}", "chunk_size", (json_int_t)h->chunk_size, "chunk_count",
				      (json_int_t)h->chunk_count, "data_offset", (json_int_t)h->data_offset, "data_length",
				      (json_int_t)h->data_length, "slab_alignment", ARENA_SLAB_ALIGN, "tensor_alignment",
				      ARENA_TENSOR_ALIGN));
	uint64_t by[ARENA_CODEC_ZSTD + 1] = {0};
	for (uint64_t i = 0; i < h->chunk_count; i++)
		if (img->chunks[i].codec <= ARENA_CODEC_ZSTD) /* the reader takes no other */
			by[img->chunks[i].codec]++;
	/* Offsets below are data_offset + the raw offset: for a coded image, where
	 * the bytes would be if its chunks were stored as is. */
	json_object_set_new(o, "coding",
			    json_pack("{s:b,s:I,s:I,s:I,s:I}", "coded_image", !!(h->flags & ARENA_IMG_FLAG_CODED),
				      "stored_length", (json_int_t)arena_img_stored_data(h), "hb4_chunks",
				      (json_int_t)by[ARENA_CODEC_HB4], "zstd_chunks", (json_int_t)by[ARENA_CODEC_ZSTD],
				      "plain_chunks", (json_int_t)by[ARENA_CODEC_NONE]));
	json_object_set_new(o, "metadata", img->metadata ? json_deep_copy(img->metadata) : json_object());
	json_object_set_new(o, "sources", img->sources ? json_deep_copy(img->sources) : json_array());
	json_t *blocks = json_array();
	for (size_t b = 0; b < l->n_blocks; b++) {
		const arena_block *blk = &l->blocks[b];
		json_array_append_new(
			blocks, json_pack("{s:I,s:s,s:o,s:o,s:I,s:I,s:I}", "index", (json_int_t)b, "name", blk->name,
					  "container", blk->container ? json_string(blk->container) : json_null(),
					  "container_index", blk->index >= 0 ? json_integer(blk->index) : json_null(),
					  "offset", (json_int_t)(h->data_offset + blk->offset), "bytes",
					  (json_int_t)blk->bytes, "tensors", (json_int_t)blk->n_tensors));
	}
	json_object_set_new(o, "blocks", blocks);
	json_t *ts = json_array();
	uint64_t stored = 0, logical = 0, quantized = 0;
	for (size_t i = 0; i < l->n_tensors; i++) {
		const arena_tensor *t = &l->tensors[i];
		json_t *comps = json_array();
		for (uint32_t c = 0; c < t->n_comp; c++) {
			const arena_component *cp = &t->comp[c];
			json_array_append_new(comps, json_pack("{s:s,s:s,s:o,s:I,s:I}", "name", cp->name, "dtype",
							       arena_dtype_name(cp->dtype), "shape",
							       dims_json(cp->rank, cp->shape), "offset",
							       (json_int_t)(h->data_offset + l->blocks[t->block].offset + cp->offset),
							       "bytes", (json_int_t)cp->bytes));
		}
		stored += tensor_bytes(t);
		logical += logical_bytes(t);
		quantized += strcmp(t->scheme, "none") != 0;
		json_array_append_new(ts, json_pack("{s:s,s:s,s:o,s:I,s:s,s:s,s:o}", "name", t->name, "dtype",
						    arena_dtype_name(t->dtype), "shape", dims_json(t->rank, t->shape),
						    "bytes", (json_int_t)tensor_bytes(t), "block",
						    l->blocks[t->block].name, "scheme", t->scheme, "components", comps));
	}
	json_object_set_new(o, "tensors", ts);
	json_object_set_new(o, "totals",
			    json_pack("{s:I,s:I,s:I,s:I,s:I}", "tensors", (json_int_t)l->n_tensors, "blocks",
				      (json_int_t)l->n_blocks, "bytes", (json_int_t)stored, "original_bytes",
				      (json_int_t)logical, "quantized_tensors", (json_int_t)quantized));
	return cli_print_json(o);
}

static int print_image_text(const char *path, const arena_image *img)
{
	const arena_layout *l = img->layout;
	const arena_img_header *h = &img->hdr;
	char a[32], b2[32], b3[32];
	printf("image:      %s (format %u.%u)\n", path, h->major, h->minor);
	printf("file:       %s (%llu bytes); data %llu bytes at %llu\n", cli_fmt_bytes(h->file_size, a, sizeof(a)),
	       (unsigned long long)h->file_size, (unsigned long long)h->data_length, (unsigned long long)h->data_offset);
	printf("chunks:     %llu of %s, xxh3-64\n", (unsigned long long)h->chunk_count,
	       cli_fmt_bytes(h->chunk_size, a, sizeof(a)));
	if (h->flags & ARENA_IMG_FLAG_CODED) {
		uint64_t by[ARENA_CODEC_ZSTD + 1] = {0};
		for (uint64_t i = 0; i < h->chunk_count; i++)
			if (img->chunks[i].codec <= ARENA_CODEC_ZSTD)
				by[img->chunks[i].codec]++;
		const unsigned codec = by[ARENA_CODEC_ZSTD] ? ARENA_CODEC_ZSTD : ARENA_CODEC_HB4;
		char both[64] = "";
		if (by[ARENA_CODEC_ZSTD] && by[ARENA_CODEC_HB4])
			snprintf(both, sizeof(both), ", %llu hb4", (unsigned long long)by[ARENA_CODEC_HB4]);
		printf("coding:     %llu chunks %s%s, %llu as is; %s stored for %s (%.1f%%); offsets below are raw\n",
		       (unsigned long long)by[codec], arena_codec_name(codec), both,
		       (unsigned long long)by[ARENA_CODEC_NONE],
		       cli_fmt_bytes(h->stored_length, a, sizeof(a)), cli_fmt_bytes(h->data_length, b2, sizeof(b2)),
		       h->data_length ? 100.0 * (double)h->stored_length / (double)h->data_length : 100.0);
	}
	printf("layout:     %zu blocks, %zu tensors; slabs %u-aligned, tensors %u-aligned\n", l->n_blocks,
	       l->n_tensors, ARENA_SLAB_ALIGN, ARENA_TENSOR_ALIGN);
	if (img->metadata && json_object_size(img->metadata)) {
		printf("metadata:\n");
		const char *k;
		json_t *v;
		json_object_foreach((json_t *)(uintptr_t)img->metadata, k, v)
			printf("  %s: %s\n", arena_q(k), arena_q(json_string_value(v)));
	}
	printf("\nblocks (execution order):\n  %5s  %-40s %14s %14s %8s\n", "#", "name", "offset", "bytes", "tensors");
	for (size_t i = 0; i < l->n_blocks; i++)
		printf("  %5zu  %-40s %14llu %14llu %8u\n", i, arena_q(l->blocks[i].name),
		       (unsigned long long)(h->data_offset + l->blocks[i].offset), (unsigned long long)l->blocks[i].bytes,
		       l->blocks[i].n_tensors);
	int w = 4;
	for (size_t i = 0; i < l->n_tensors; i++) {
		int n = (int)strlen(arena_q(l->tensors[i].name));
		w = n > w ? n : w;
	}
	printf("\n%-*s  %-8s  %-16s %-16s %12s  %s\n", w, "name", "dtype", "shape", "scheme", "bytes", "block");
	uint64_t stored = 0, nq = 0, qstored = 0, qlogical = 0;
	for (size_t i = 0; i < l->n_tensors; i++) {
		const arena_tensor *t = &l->tensors[i];
		char shape[128];
		fmt_dims(t->rank, t->shape, shape, sizeof(shape));
		printf("%-*s  %-8s  %-16s %-16s %12llu  %s\n", w, arena_q(t->name), arena_dtype_name(t->dtype), shape,
		       t->scheme, (unsigned long long)tensor_bytes(t), arena_q(l->blocks[t->block].name));
		stored += tensor_bytes(t);
		if (strcmp(t->scheme, "none")) {
			nq++;
			qstored += tensor_bytes(t);
			qlogical += logical_bytes(t);
		}
	}
	printf("\ntotals: %zu tensors, %s stored", l->n_tensors, cli_fmt_bytes(stored, a, sizeof(a)));
	if (nq)
		printf("; %llu quantized tensors take %s instead of %s (saved %s)", (unsigned long long)nq,
		       cli_fmt_bytes(qstored, a, sizeof(a)), cli_fmt_bytes(qlogical, b2, sizeof(b2)),
		       cli_fmt_bytes(qlogical > qstored ? qlogical - qstored : 0, b3, sizeof(b3)));
	printf("\n");
	return 0;
}

int cmd_inspect(int argc, char **argv)
{
	int json = 0;
	static const struct option opts[] = {{"json", no_argument, NULL, 'j'}, {NULL, 0, NULL, 0}};
	int ch;
	optind = 0;
	opterr = 0;
	while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (ch == 'j')
			json = 1;
		else
			return cli_usage_error("inspect", "unknown option '%s'", argv[optind - 1]);
	}
	if (argc - optind != 1)
		return cli_usage_error("inspect", "expected one PATH, got %d", argc - optind);
	const char *path = argv[optind];
	if (arena_img_sniff(path)) {
		arena_image *img;
		int rc = arena_img_open(path, &img);
		if (rc)
			return cli_fail(rc);
		int st = json ? print_image_json(path, img) : print_image_text(path, img);
		arena_img_close(img);
		return st;
	}
	arena_ckpt *c;
	int rc = arena_ckpt_open(path, &c);
	if (!rc && (rc = arena_plan_check_ckpt(c)))
		arena_ckpt_close(c); /* the rules convert applies, the same error */
	if (rc)
		return cli_fail(rc);
	int st = json ? print_ckpt_json(path, c) : print_ckpt_text(path, c);
	arena_ckpt_close(c);
	return st;
}
