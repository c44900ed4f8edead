/* image_write.c - encode an arena image's header, chunk entries and
 * manifest for the writer (convert/convert.c drives it; docs/FORMAT.md).
 *
 * A header's region fields come from arena_img_header_plan alone, so that
 * what is written meets every rule arena_img_header_decode checks; a coded
 * image then records its stored length once its chunks are written. The
 * manifest is read back before it is trusted (see below). */
#include "image_int.h"

#include <jansson.h>
#include <string.h>

#include "../common/alloc.h"
#include "../common/hash.h"

/* ---- header and chunk entries ---------------------------------------------- */

void arena_img_header_plan(arena_img_header *h, uint64_t manifest_length, uint64_t data_length, uint64_t chunk_size)
{
	memset(h, 0, sizeof(*h));
	h->major = ARENA_IMG_MAJOR;
	h->minor = 0;
	h->manifest_offset = ARENA_IMG_HEADER_SIZE;
	h->manifest_length = manifest_length;
	h->chunk_size = chunk_size;
	h->chunk_count = (data_length + chunk_size - 1) / chunk_size;
	h->chunk_table_offset = h->manifest_offset + manifest_length;
	h->chunk_table_length = arena_align_up(h->chunk_count * ARENA_IMG_CHUNK_ENTRY, 4096);
	h->data_offset = h->chunk_table_offset + h->chunk_table_length;
	h->data_length = data_length;
	h->file_size = h->data_offset + data_length;
}

void arena_img_header_set_coded(arena_img_header *h)
{
	h->flags |= ARENA_IMG_FLAG_CODED;
	h->minor = 1;
}

void arena_img_header_set_zstd(arena_img_header *h)
{
	h->flags |= ARENA_IMG_FLAG_CODED | ARENA_IMG_FLAG_ZSTD;
	h->minor = 2;
}

void arena_img_header_set_subclass(arena_img_header *h)
{
	h->flags |= ARENA_IMG_FLAG_SUBCLASS;
	h->minor = 3;
}

void arena_img_header_set_stored(arena_img_header *h, uint64_t stored_length)
{
	h->stored_length = stored_length;
	h->file_size = h->data_offset + stored_length;
}

void arena_img_header_encode(const arena_img_header *h, uint8_t page[ARENA_IMG_HEADER_SIZE])
{
	memset(page, 0, ARENA_IMG_HEADER_SIZE);
	memcpy(page, ARENA_IMG_MAGIC, 8);
	put16(page + 8, h->major);
	put16(page + 10, h->minor);
	put32(page + 12, h->flags);
	put64(page + 16, h->file_size);
	put64(page + 24, h->manifest_offset);
	put64(page + 32, h->manifest_length);
	put64(page + 40, h->manifest_xxh3);
	put64(page + 48, h->chunk_table_offset);
	put64(page + 56, h->chunk_table_length);
	put64(page + 64, h->chunk_table_xxh3);
	put64(page + 72, h->data_offset);
	put64(page + 80, h->data_length);
	put64(page + 88, h->chunk_size);
	put64(page + 96, h->chunk_count);
	put64(page + 104, h->stored_length);
	put64(page + HDR_HASH_AT, arena_xxh3(page, HDR_HASH_AT));
}

void arena_img_chunk_encode(const arena_img_chunk *c, uint8_t out[ARENA_IMG_CHUNK_ENTRY])
{
	memset(out, 0, ARENA_IMG_CHUNK_ENTRY);
	put64(out, c->offset);
	put32(out + 8, c->stored_length);
	put32(out + 12, c->raw_length);
	put64(out + 16, c->xxh3);
	put16(out + 24, c->codec);
	put16(out + 26, c->flags);
}

/* ---- manifest: writing ---------------------------------------------------- */

static json_t *shape_json(uint32_t rank, const uint64_t *shape)
{
	json_t *a = json_array();
	for (uint32_t i = 0; a && i < rank; i++)
		if (json_array_append_new(a, json_integer((json_int_t)shape[i]))) {
			json_decref(a);
			return NULL;
		}
	return a;
}

/* json_object_set_new that remembers failure. */
static void jset(json_t *o, const char *k, json_t *v, int *fail)
{
	/* json_object_set_new releases v when it fails, also when o is NULL. */
	if (!v || json_object_set_new(o, k, v) || !o)
		*fail = 1;
}

int arena_img_manifest_build(const arena_layout *l, const void *sources, const void *metadata, uint64_t chunk_size,
			     unsigned minor, char **out, size_t *len)
{
	arena_alloc_init();
	*out = NULL;
	int fail = 0;
	json_t *root = json_object();
	jset(root, "format", json_string("arena-image"), &fail);
	jset(root, "version", json_pack("[ii]", ARENA_IMG_MAJOR, (int)minor), &fail);
	jset(root, "source",
	     sources ? json_pack("{s:O}", "files", (json_t *)(uintptr_t)sources) : json_pack("{s:[]}", "files"), &fail);
	jset(root, "metadata", metadata ? json_copy((json_t *)(uintptr_t)metadata) : json_object(), &fail);
	jset(root, "layout",
	     json_pack("{s:i,s:i,s:I,s:I,s:I}", "slab_alignment", ARENA_SLAB_ALIGN, "tensor_alignment",
		       ARENA_TENSOR_ALIGN, "chunk_size", (json_int_t)chunk_size, "data_length",
		       (json_int_t)l->data_length, "chunk_count",
		       (json_int_t)((l->data_length + chunk_size - 1) / chunk_size)),
	     &fail);
	json_t *blocks = json_array();
	for (size_t b = 0; blocks && b < l->n_blocks && !fail; b++) {
		const arena_block *blk = &l->blocks[b];
		json_t *o = json_object();
		jset(o, "name", json_string(blk->name), &fail);
		jset(o, "container", blk->container ? json_string(blk->container) : json_null(), &fail);
		jset(o, "index", blk->index >= 0 ? json_integer(blk->index) : json_null(), &fail);
		jset(o, "offset", json_integer((json_int_t)blk->offset), &fail);
		jset(o, "bytes", json_integer((json_int_t)blk->bytes), &fail);
		jset(o, "tensors", json_integer(blk->n_tensors), &fail);
		if (json_array_append_new(blocks, o))
			fail = 1;
	}
	jset(root, "blocks", blocks, &fail);
	json_t *tensors = json_array();
	for (size_t i = 0; tensors && i < l->n_tensors && !fail; i++) {
		const arena_tensor *t = &l->tensors[i];
		json_t *o = json_object(), *comps = json_array();
		jset(o, "name", json_string(t->name), &fail);
		jset(o, "dtype", json_string(arena_dtype_name(t->dtype)), &fail);
		jset(o, "shape", shape_json(t->rank, t->shape), &fail);
		jset(o, "block", json_integer(t->block), &fail);
		jset(o, "scheme", json_string(t->scheme), &fail);
		if (t->subclass) {
			unsigned long mark = arena_json_parse_begin(); /* (alloc.h: jansson and failed allocations) */
			json_t *sub = json_loads(t->subclass, JSON_REJECT_DUPLICATES, NULL);
			if (arena_json_parse_end(mark)) {
				json_decref(sub);
				sub = NULL;
			}
			jset(o, "subclass", sub, &fail);
		}
		for (uint32_t c = 0; comps && c < t->n_comp; c++) {
			const arena_component *cp = &t->comp[c];
			json_t *co = json_object();
			jset(co, "name", json_string(cp->name), &fail);
			jset(co, "dtype", json_string(arena_dtype_name(cp->dtype)), &fail);
			jset(co, "shape", shape_json(cp->rank, cp->shape), &fail);
			jset(co, "offset", json_integer((json_int_t)cp->offset), &fail);
			jset(co, "bytes", json_integer((json_int_t)cp->bytes), &fail);
			if (json_array_append_new(comps, co))
				fail = 1;
		}
		jset(o, "components", comps, &fail);
		if (json_array_append_new(tensors, o))
			fail = 1;
	}
	jset(root, "tensors", tensors, &fail);
	char *text = fail ? NULL : json_dumps(root, JSON_COMPACT);
	/* jansson 2.14 can drop a key when an allocation fails inside the dump
	 * and still return text: read it back before trusting it. */
	if (text) {
		unsigned long mark = arena_json_parse_begin(); /* (alloc.h: jansson and failed allocations) */
		json_t *back = json_loads(text, JSON_REJECT_DUPLICATES, NULL);
		if (arena_json_parse_end(mark) || !back || !json_equal(back, root)) {
			arena_free(text);
			text = NULL;
		}
		json_decref(back);
	}
	json_decref(root);
	if (!text)
		return arena_errorf(ARENA_E_NOMEM, "out of memory building the manifest");
	size_t n = strlen(text), padded = (size_t)arena_align_up(n + 1, 4096);
	char *buf = arena_malloc(padded);
	if (!buf) {
		arena_free(text);
		return arena_errorf(ARENA_E_NOMEM, "out of memory building the manifest");
	}
	memcpy(buf, text, n);
	memset(buf + n, ' ', padded - n);
	arena_free(text);
	*out = buf;
	*len = padded;
	return 0;
}
