/* inspect.c - what a checkpoint or image holds, as JSON (inspect.h). The
 * schema is docs/CLI.md's, "arena inspect --json". */
#include "inspect.h"

#include <string.h>

#include "../common/alloc.h"
#include "../common/err.h"
#include "../formats/checkpoint.h"
#include "../formats/codec.h"
#include "../formats/image.h"
#include "plan.h"
#include "arena.h"

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

static json_t *dims_json(uint32_t rank, const uint64_t *shape)
{
	json_t *a = json_array();
	for (uint32_t k = 0; k < rank; k++)
		json_array_append_new(a, json_integer((json_int_t)shape[k]));
	return a;
}

/* What block discovery finds in the checkpoint, and why (arena_plan_describe):
 * the report's line, each container or module judged, and the globals. */
static json_t *discovery_json(const arena_plan_report *r)
{
	static const char *verdicts[] = {"sequence", "single", "rejected"};
	size_t n = arena_plan_report_line(r, NULL, 0);
	char *line = arena_malloc(n + 1);
	if (!line)
		return NULL;
	arena_plan_report_line(r, line, n + 1);
	json_t *found = json_array();
	for (size_t i = 0; i < r->n_found; i++) {
		const arena_plan_found *f = &r->found[i];
		json_array_append_new(
			found, json_pack("{s:s,s:s,s:s,s:I,s:I,s:o,s:o,s:I,s:I,s:o}", "path", f->path, "verdict",
					 verdicts[f->verdict], "reason", arena_plan_reason_text(f->reason), "members",
					 (json_int_t)f->members, "alike", (json_int_t)f->alike, "first",
					 f->first >= 0 ? json_integer(f->first) : json_null(), "last",
					 f->last >= 0 ? json_integer(f->last) : json_null(), "tensors",
					 (json_int_t)f->tensors, "bytes", (json_int_t)f->bytes, "like",
					 f->like ? json_string(f->like) : json_null()));
	}
	json_t *o = json_pack("{s:s,s:I,s:I,s:I,s:o}", "line", line, "blocks", (json_int_t)r->n_blocks,
			      "global_tensors", (json_int_t)r->global_tensors, "global_bytes",
			      (json_int_t)r->global_bytes, "found", found);
	arena_free(line);
	return o;
}

static json_t *ckpt_json(const char *path, const arena_ckpt *c, const arena_plan_report *r)
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
		json_object_set_new(to, "shape", dims_json(t->rank, t->shape));
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
	json_t *disc = discovery_json(r);
	if (!disc) {
		json_decref(o);
		return NULL;
	}
	json_object_set_new(o, "discovery", disc);
	return o;
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

static json_t *image_json(const char *path, const arena_image *img)
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
	return o;
}

int arena_inspect_json(const char *path, json_t **out)
{
	*out = NULL;
	if (!path)
		return arena_errorf(ARENA_E_USAGE, "arena_inspect: no path given");
	json_t *o;
	if (arena_img_sniff(path)) {
		arena_image *img;
		int rc = arena_img_open(path, &img);
		if (rc)
			return rc;
		o = image_json(path, img);
		arena_img_close(img);
	} else {
		arena_ckpt *c;
		arena_plan_report *r = NULL, none = {0};
		int rc = arena_ckpt_open(path, &c);
		/* the rules convert applies, the same error; but a valid file with
		 * no tensors (a header of __metadata__ alone, or {}) is shown, its
		 * discovery finding nothing: convert and load refuse it */
		if (!rc && ((rc = arena_plan_check_ckpt(c)) || (c->n_tensors && (rc = arena_plan_describe(c, NULL, &r)))))
			arena_ckpt_close(c);
		if (rc)
			return rc;
		o = ckpt_json(path, c, r ? r : &none);
		arena_plan_report_free(r);
		arena_ckpt_close(c);
	}
	if (!o)
		return arena_errorf(ARENA_E_NOMEM, "%s: out of memory", path);
	*out = o;
	return 0;
}

int arena_inspect(const char *path, char **json)
{
	if (!json)
		return arena_errorf(ARENA_E_USAGE, "arena_inspect: json is NULL");
	*json = NULL;
	json_t *o;
	int rc = arena_inspect_json(path, &o);
	if (rc)
		return rc;
	const size_t flags = JSON_INDENT(2) | JSON_PRESERVE_ORDER;
	size_t n = json_dumpb(o, NULL, 0, flags);
	char *s = n ? arena_malloc(n + 1) : NULL;
	if (!s || json_dumpb(o, s, n, flags) != n) {
		arena_free(s);
		json_decref(o);
		return arena_errorf(ARENA_E_NOMEM, "%s: out of memory for the inspection's JSON", path);
	}
	s[n] = 0;
	json_decref(o);
	*json = s;
	return 0;
}

void arena_string_free(char *s)
{
	arena_free(s);
}
