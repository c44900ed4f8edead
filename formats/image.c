/* image.c - encode, decode and check arena images (docs/FORMAT.md). */
#include "image.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "../common/hash.h"

#include "../common/alloc.h"
#include "../common/err.h"
#include "../common/firsterr.h"
#include "../common/io.h"
#include "codec.h"
#include "scheme.h"

#define E(name) ARENA_E(name)
#define HDR_HASH_AT 4088u

static void put16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8);
}
static void put32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}
static uint16_t get16(const uint8_t *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}
static uint32_t get32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

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

int arena_img_header_decode(const uint8_t page[ARENA_IMG_HEADER_SIZE], uint64_t real_size, const char *label,
			    arena_img_header *h)
{
	if (real_size < ARENA_IMG_HEADER_SIZE)
		return arena_errorf(E(IMG_TRUNCATED), "%s: file is %llu bytes, shorter than the 4096-byte header",
				    label, (unsigned long long)real_size);
	if (memcmp(page, ARENA_IMG_MAGIC, 8) != 0)
		return arena_errorf(E(IMG_MAGIC), "%s: not an arena image (magic is not \"ARENAIMG\")", label);
	uint64_t want = get64(page + HDR_HASH_AT), got = arena_xxh3(page, HDR_HASH_AT);
	if (want != got)
		return arena_errorf(E(IMG_HEADER_CHECKSUM), "%s: header checksum is %016llx, header says %016llx",
				    label, (unsigned long long)got, (unsigned long long)want);
	memset(h, 0, sizeof(*h));
	h->major = get16(page + 8);
	h->minor = get16(page + 10);
	h->flags = get32(page + 12);
	h->file_size = get64(page + 16);
	h->manifest_offset = get64(page + 24);
	h->manifest_length = get64(page + 32);
	h->manifest_xxh3 = get64(page + 40);
	h->chunk_table_offset = get64(page + 48);
	h->chunk_table_length = get64(page + 56);
	h->chunk_table_xxh3 = get64(page + 64);
	h->data_offset = get64(page + 72);
	h->data_length = get64(page + 80);
	h->chunk_size = get64(page + 88);
	h->chunk_count = get64(page + 96);
	h->stored_length = get64(page + 104);
	if (h->major != ARENA_IMG_MAJOR)
		return arena_errorf(E(IMG_VERSION), "%s: image format version %u.%u; this reader reads %d.x", label,
				    h->major, h->minor, ARENA_IMG_MAJOR);
	if (h->flags & 0xFFFFu & ~ARENA_IMG_KNOWN_FLAGS)
		return arena_errorf(E(IMG_FLAGS), "%s: image requires features 0x%04x this reader does not know",
				    label, h->flags & 0xFFFFu & ~ARENA_IMG_KNOWN_FLAGS);
	const int coded = !!(h->flags & ARENA_IMG_FLAG_CODED);
	for (unsigned i = 112; i < HDR_HASH_AT; i++)
		if (page[i])
			return arena_errorf(E(IMG_HEADER_BAD), "%s: header: reserved byte %u is not zero", label, i);
	const char *why = NULL;
	uint64_t cs = h->chunk_size;
	if (h->manifest_offset != ARENA_IMG_HEADER_SIZE)
		why = "manifest_offset is not 4096";
	else if (!h->manifest_length || h->manifest_length % 4096 || h->manifest_length > ARENA_IMG_MAX_MANIFEST)
		why = "manifest_length is not a positive multiple of 4096 within 1 GiB";
	else if (cs < ARENA_IMG_MIN_CHUNK || cs > ARENA_IMG_MAX_CHUNK || (cs & (cs - 1)))
		why = "chunk_size is not a power of two from 64 KiB to 1 GiB";
	else if (h->data_length % 4096)
		why = "data_length is not a multiple of 4096";
	else if (h->chunk_count != (h->data_length + cs - 1) / cs)
		why = "chunk_count does not match data_length and chunk_size";
	else if (h->chunk_table_offset != h->manifest_offset + h->manifest_length)
		why = "chunk table does not follow the manifest";
	else if (h->chunk_table_length != arena_align_up(h->chunk_count * ARENA_IMG_CHUNK_ENTRY, 4096))
		why = "chunk_table_length does not match chunk_count";
	else if (h->data_offset != h->chunk_table_offset + h->chunk_table_length)
		why = "data does not follow the chunk table";
	else if ((h->flags & ARENA_IMG_FLAG_ZSTD) && !coded)
		why = "the zstd flag is set without the coded flag";
	else if (!coded && h->stored_length)
		why = "stored_length is set but the coded-chunks flag is not";
	else if (coded && (h->stored_length % 4096 || h->stored_length > h->data_length))
		why = "stored_length is not a multiple of 4096 up to data_length";
	else if (!coded && (h->data_length > UINT64_MAX - h->data_offset || h->file_size != h->data_offset + h->data_length))
		why = "file_size is not data_offset + data_length";
	else if (coded &&
		 (h->stored_length > UINT64_MAX - h->data_offset || h->file_size != h->data_offset + h->stored_length))
		why = "file_size is not data_offset + stored_length";
	if (why)
		return arena_errorf(E(IMG_HEADER_BAD), "%s: header: %s", label, why);
	if (real_size < h->file_size)
		return arena_errorf(E(IMG_TRUNCATED), "%s: file is %llu bytes, the header says %llu (truncated)", label,
				    (unsigned long long)real_size, (unsigned long long)h->file_size);
	if (real_size > h->file_size)
		return arena_errorf(E(IMG_SIZE), "%s: file is %llu bytes, the header says %llu (%llu extra bytes)",
				    label, (unsigned long long)real_size, (unsigned long long)h->file_size,
				    (unsigned long long)(real_size - h->file_size));
	return 0;
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
		json_t *back = json_loads(text, JSON_REJECT_DUPLICATES, NULL);
		if (!back || !json_equal(back, root)) {
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

/* ---- manifest: reading ---------------------------------------------------- */

typedef struct mctx {
	const char *label;
	char where[96];
} mctx;

static int mbad(const mctx *m, const char *fmt, ...) ARENA_PRINTF(2, 3);
static int mbad(const mctx *m, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return arena_errorf(E(IMG_MANIFEST_BAD), "%s: manifest: %s%s%s", m->label, m->where, *m->where ? ": " : "",
			    msg);
}

static int get_u64(const mctx *m, json_t *o, const char *k, uint64_t *out)
{
	json_t *v = json_object_get(o, k);
	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return mbad(m, "\"%s\" is not a non-negative integer", k);
	*out = (uint64_t)json_integer_value(v);
	return 0;
}

static int get_str(const mctx *m, json_t *o, const char *k, const char **out, size_t max)
{
	json_t *v = json_object_get(o, k);
	if (!json_is_string(v))
		return mbad(m, "\"%s\" is not a string", k);
	if (max && json_string_length(v) >= max)
		return mbad(m, "\"%s\" is longer than %zu bytes", k, max - 1);
	if (strlen(json_string_value(v)) != json_string_length(v))
		return mbad(m, "\"%s\" holds a NUL byte", k);
	*out = json_string_value(v);
	return 0;
}

static int get_dtype(const mctx *m, json_t *o, arena_dtype *dt)
{
	const char *s;
	int rc = get_str(m, o, "dtype", &s, 0);
	if (rc)
		return rc;
	if ((*dt = arena_dtype_from_name(s)) == ARENA_DTYPE_INVALID)
		return mbad(m, "unknown dtype '%s'", arena_q(s));
	return 0;
}

static int get_shape(const mctx *m, json_t *o, uint32_t *rank, uint64_t *shape)
{
	json_t *a = json_object_get(o, "shape");
	if (!json_is_array(a) || json_array_size(a) > ARENA_MAX_RANK)
		return mbad(m, "\"shape\" is not a list of at most %d dims", ARENA_MAX_RANK);
	*rank = (uint32_t)json_array_size(a);
	for (uint32_t i = 0; i < *rank; i++) {
		json_t *d = json_array_get(a, i);
		if (!json_is_integer(d) || json_integer_value(d) < 0)
			return mbad(m, "shape[%u] is not a non-negative integer", i);
		shape[i] = (uint64_t)json_integer_value(d);
	}
	return 0;
}

static int parse_blocks(const mctx *m0, json_t *arr, arena_layout *l)
{
	mctx m = *m0;
	for (size_t b = 0; b < l->n_blocks; b++) {
		json_t *o = json_array_get(arr, b);
		arena_block *blk = &l->blocks[b];
		snprintf(m.where, sizeof(m.where), "blocks[%zu]", b);
		if (!json_is_object(o))
			return mbad(&m, "not an object");
		const char *name;
		uint64_t nt;
		int rc;
		if ((rc = get_str(&m, o, "name", &name, 0)) || (rc = get_u64(&m, o, "offset", &blk->offset)) ||
		    (rc = get_u64(&m, o, "bytes", &blk->bytes)) || (rc = get_u64(&m, o, "tensors", &nt)))
			return rc;
		json_t *c = json_object_get(o, "container"), *ix = json_object_get(o, "index");
		if (c && !json_is_null(c) && !json_is_string(c))
			return mbad(&m, "\"container\" is neither a string nor null");
		if (ix && !json_is_null(ix) && !(json_is_integer(ix) && json_integer_value(ix) >= 0))
			return mbad(&m, "\"index\" is neither a non-negative integer nor null");
		blk->name = arena_strdup(name);
		blk->container = json_is_string(c) ? arena_strdup(json_string_value(c)) : NULL;
		blk->index = json_is_integer(ix) ? json_integer_value(ix) : -1;
		blk->n_tensors = (uint32_t)(nt > UINT32_MAX ? UINT32_MAX : nt);
		if (!blk->name || (json_is_string(c) && !blk->container))
			return arena_errorf(ARENA_E_NOMEM, "%s: out of memory reading the manifest", m.label);
	}
	return 0;
}

static int parse_tensors(const mctx *m0, json_t *arr, arena_layout *l)
{
	mctx m = *m0;
	for (size_t i = 0; i < l->n_tensors; i++) {
		json_t *o = json_array_get(arr, i);
		arena_tensor *t = &l->tensors[i];
		snprintf(m.where, sizeof(m.where), "tensors[%zu]", i);
		if (!json_is_object(o))
			return mbad(&m, "not an object");
		const char *name, *scheme;
		uint64_t block;
		int rc;
		if ((rc = get_str(&m, o, "name", &name, 0)))
			return rc;
		snprintf(m.where, sizeof(m.where), "tensor '%s'", arena_q(name));
		if ((rc = get_dtype(&m, o, &t->dtype)) || (rc = get_shape(&m, o, &t->rank, t->shape)) ||
		    (rc = get_u64(&m, o, "block", &block)) || (rc = get_str(&m, o, "scheme", &scheme, sizeof(t->scheme))))
			return rc;
		if (block >= l->n_blocks)
			return mbad(&m, "block %llu does not exist", (unsigned long long)block);
		t->block = (uint32_t)block;
		strcpy(t->scheme, scheme);
		json_t *comps = json_object_get(o, "components");
		if (!json_is_array(comps) || json_array_size(comps) < 1 || json_array_size(comps) > ARENA_MAX_COMPONENTS)
			return mbad(&m, "\"components\" is not a list of 1 to %d", ARENA_MAX_COMPONENTS);
		t->n_comp = (uint32_t)json_array_size(comps);
		for (uint32_t c = 0; c < t->n_comp; c++) {
			json_t *co = json_array_get(comps, c);
			arena_component *cp = &t->comp[c];
			const char *cname;
			if (!json_is_object(co))
				return mbad(&m, "components[%u] is not an object", c);
			if ((rc = get_str(&m, co, "name", &cname, sizeof(cp->name))) || (rc = get_dtype(&m, co, &cp->dtype)) ||
			    (rc = get_shape(&m, co, &cp->rank, cp->shape)) || (rc = get_u64(&m, co, "offset", &cp->offset)) ||
			    (rc = get_u64(&m, co, "bytes", &cp->bytes)))
				return rc;
			strcpy(cp->name, cname);
		}
		t->name = arena_strdup(name);
		if (!t->name)
			return arena_errorf(ARENA_E_NOMEM, "%s: out of memory reading the manifest", m.label);
	}
	return 0;
}

static int cmp_span(const void *x, const void *y)
{
	const arena_img_span *a = x, *b = y;
	return a->a < b->a ? -1 : a->a > b->a;
}

/* img->used: the raw bytes of every component (the layout is checked: they
 * lie in their slabs and do not overlap), sorted, touching ones merged. */
static int build_used(arena_image *img)
{
	const arena_layout *l = img->layout;
	size_t n = 0;
	for (size_t i = 0; i < l->n_tensors; i++)
		for (uint32_t c = 0; c < l->tensors[i].n_comp; c++)
			n += l->tensors[i].comp[c].bytes > 0;
	img->used = arena_malloc((n ? n : 1) * sizeof(*img->used));
	if (!img->used)
		return arena_errorf(ARENA_E_NOMEM, "%s: out of memory reading the manifest", img->path);
	n = 0;
	for (size_t i = 0; i < l->n_tensors; i++) {
		const arena_tensor *t = &l->tensors[i];
		for (uint32_t c = 0; c < t->n_comp; c++)
			if (t->comp[c].bytes) {
				uint64_t a = l->blocks[t->block].offset + t->comp[c].offset;
				img->used[n++] = (arena_img_span){a, a + t->comp[c].bytes};
			}
	}
	qsort(img->used, n, sizeof(*img->used), cmp_span);
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		if (k && img->used[i].a <= img->used[k - 1].z) {
			if (img->used[i].z > img->used[k - 1].z)
				img->used[k - 1].z = img->used[i].z;
		} else {
			img->used[k++] = img->used[i];
		}
	}
	img->n_used = k;
	return 0;
}

static int parse_manifest(arena_image *img, const char *text, size_t len)
{
	mctx m = {.label = img->path, .where = ""};
	json_error_t jerr;
	unsigned long mark = arena_json_parse_begin();
	json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
	int oom = arena_json_parse_end(mark);
	if (!root) {
		if (json_error_code(&jerr) == json_error_out_of_memory || oom)
			return arena_errorf(ARENA_E_NOMEM, "%s: out of memory reading the manifest", img->path);
		return mbad(&m, "not valid JSON at byte %d: %s", jerr.position, arena_q(jerr.text));
	}
	img->manifest = root;
	/* A parse can also succeed, on altered text, after an allocation failed. */
	if (oom)
		return arena_errorf(ARENA_E_NOMEM, "%s: out of memory reading the manifest", img->path);
	json_t *fmt = json_object_get(root, "format"), *ver = json_object_get(root, "version");
	if (!json_is_object(root) || !json_is_string(fmt) || strcmp(json_string_value(fmt), "arena-image"))
		return mbad(&m, "\"format\" is not \"arena-image\"");
	if (!json_is_array(ver) || json_array_size(ver) != 2 || !json_is_integer(json_array_get(ver, 0)) ||
	    json_integer_value(json_array_get(ver, 0)) != img->hdr.major)
		return mbad(&m, "\"version\" does not match the header's %u.%u", img->hdr.major, img->hdr.minor);
	json_t *meta = json_object_get(root, "metadata"), *src = json_object_get(root, "source");
	if (meta) {
		const char *k;
		json_t *v;
		if (!json_is_object(meta))
			return mbad(&m, "\"metadata\" is not an object");
		json_object_foreach(meta, k, v) {
			if (!json_is_string(v))
				return mbad(&m, "metadata '%s' is not a string", arena_q(k));
		}
	}
	img->metadata = meta;
	if (src && (!json_is_object(src) || !json_is_array(json_object_get(src, "files"))))
		return mbad(&m, "\"source\" is not an object with a \"files\" list");
	img->sources = src ? json_object_get(src, "files") : NULL;

	json_t *lay = json_object_get(root, "layout");
	uint64_t sa, ta, cs, dl, cc;
	int rc;
	if (!json_is_object(lay))
		return mbad(&m, "\"layout\" is not an object");
	if ((rc = get_u64(&m, lay, "slab_alignment", &sa)) || (rc = get_u64(&m, lay, "tensor_alignment", &ta)) ||
	    (rc = get_u64(&m, lay, "chunk_size", &cs)) || (rc = get_u64(&m, lay, "data_length", &dl)) ||
	    (rc = get_u64(&m, lay, "chunk_count", &cc)))
		return rc;
	if (sa != ARENA_SLAB_ALIGN || ta != ARENA_TENSOR_ALIGN)
		return mbad(&m, "alignments %llu/%llu, this reader knows %u/%u", (unsigned long long)sa,
			    (unsigned long long)ta, ARENA_SLAB_ALIGN, ARENA_TENSOR_ALIGN);
	if (cs != img->hdr.chunk_size || dl != img->hdr.data_length || cc != img->hdr.chunk_count)
		return arena_errorf(E(IMG_CHUNK_TABLE_BAD),
				    "%s: manifest layout (chunk size %llu, %llu data bytes, %llu chunks) does not match the header and chunk table (%llu, %llu, %llu)",
				    img->path, (unsigned long long)cs, (unsigned long long)dl, (unsigned long long)cc,
				    (unsigned long long)img->hdr.chunk_size, (unsigned long long)img->hdr.data_length,
				    (unsigned long long)img->hdr.chunk_count);
	json_t *blocks = json_object_get(root, "blocks"), *tensors = json_object_get(root, "tensors");
	if (!json_is_array(blocks) || !json_is_array(tensors))
		return mbad(&m, "\"blocks\" or \"tensors\" is not a list");
	if ((rc = arena_layout_create(json_array_size(blocks), json_array_size(tensors), &img->layout)))
		return rc;
	img->layout->data_length = dl;
	if ((rc = parse_blocks(&m, blocks, img->layout)) || (rc = parse_tensors(&m, tensors, img->layout)))
		return rc;
	uint32_t *declared = arena_calloc(img->layout->n_blocks, sizeof(*declared));
	if (!declared)
		return arena_errorf(ARENA_E_NOMEM, "%s: out of memory", img->path);
	for (size_t b = 0; b < img->layout->n_blocks; b++)
		declared[b] = img->layout->blocks[b].n_tensors;
	rc = arena_layout_check(img->layout, img->path);
	for (size_t b = 0; !rc && b < img->layout->n_blocks; b++)
		if (declared[b] != img->layout->blocks[b].n_tensors)
			rc = arena_errorf(E(IMG_MANIFEST_BAD), "%s: manifest: block '%s' declares %u tensors, %u name it",
					  img->path, arena_q(img->layout->blocks[b].name), declared[b],
					  img->layout->blocks[b].n_tensors);
	arena_free(declared);
	/* Each entry against its scheme's component table (formats/scheme.h):
	 * readers trust component names, dtypes and shapes from here on. */
	for (size_t i = 0; !rc && i < img->layout->n_tensors; i++) {
		arena_quant_plan p;
		if ((rc = arena_quant_plan_from_tensor(&img->layout->tensors[i], &p))) {
			char where[512];
			snprintf(where, sizeof(where), "%s: manifest", img->path);
			arena_error_prefix(where);
		}
	}
	return rc ? rc : build_used(img);
}

/* ---- opening -------------------------------------------------------------- */

int arena_img_sniff(const char *path)
{
	char magic[8];
	int fd;
	if (arena_open_input(path, 0, &fd, NULL))
		return 0;
	ssize_t n = pread(fd, magic, 8, 0);
	close(fd);
	return n == 8 && memcmp(magic, ARENA_IMG_MAGIC, 8) == 0;
}

static int read_chunk_table(arena_image *img)
{
	const arena_img_header *h = &img->hdr;
	uint8_t *buf = arena_malloc(h->chunk_table_length);
	img->chunks = arena_calloc(h->chunk_count, sizeof(*img->chunks));
	int rc = 0;
	if (!buf || !img->chunks) {
		rc = arena_errorf(ARENA_E_NOMEM, "%s: out of memory for %llu chunks", img->path,
				  (unsigned long long)h->chunk_count);
		goto out;
	}
	if ((rc = arena_pread_full(img->fd, buf, h->chunk_table_length, h->chunk_table_offset, img->path)))
		goto out;
	uint64_t got = arena_xxh3(buf, h->chunk_table_length);
	if (got != h->chunk_table_xxh3) {
		rc = arena_errorf(E(IMG_CHUNK_TABLE_CHECKSUM), "%s: chunk table checksum is %016llx, header says %016llx",
				  img->path, (unsigned long long)got, (unsigned long long)h->chunk_table_xxh3);
		goto out;
	}
	const int coded = !!(h->flags & ARENA_IMG_FLAG_CODED);
	uint64_t at = 0; /* coded: where the next chunk must start */
	for (uint64_t i = 0; i < h->chunk_count; i++) {
		const uint8_t *e = buf + i * ARENA_IMG_CHUNK_ENTRY;
		arena_img_chunk *c = &img->chunks[i];
		c->offset = get64(e);
		c->stored_length = get32(e + 8);
		c->raw_length = get32(e + 12);
		c->xxh3 = get64(e + 16);
		c->codec = get16(e + 24);
		c->flags = get16(e + 26);
		uint64_t start = i * h->chunk_size;
		uint64_t raw = h->data_length - start < h->chunk_size ? h->data_length - start : h->chunk_size;
		if (!arena_codec_name(c->codec) || (c->codec && !coded) ||
		    (c->codec == ARENA_CODEC_ZSTD && !(h->flags & ARENA_IMG_FLAG_ZSTD))) {
			rc = arena_errorf(E(IMG_CODEC), "%s: chunk %llu: %s codec %u", img->path, (unsigned long long)i,
					  !arena_codec_name(c->codec) ? "unknown"
					  : !coded ? "an image without coded chunks names"
						   : "an image without the zstd flag names",
					  c->codec);
			goto out;
		}
		if (coded) {
			/* Packed: each chunk 4096-aligned right after the one before. */
			int len_ok = c->codec == ARENA_CODEC_HB4    ? arena_hb4_lengths_ok(raw, c->stored_length)
				     : c->codec == ARENA_CODEC_ZSTD ? arena_zstd_lengths_ok(raw, c->stored_length)
								    : c->stored_length == raw;
			if (c->offset != at || c->raw_length != raw || !len_ok || c->flags || get32(e + 28) ||
			    c->offset + c->stored_length > h->stored_length) {
				rc = arena_errorf(E(IMG_CHUNK_TABLE_BAD),
						  "%s: chunk %llu: entry (offset %llu, %u stored bytes for %u, codec %s) does not "
						  "follow the chunk before (offset %llu) or does not fit (%llu raw bytes, %llu "
						  "stored in all)",
						  img->path, (unsigned long long)i, (unsigned long long)c->offset,
						  c->stored_length, c->raw_length, arena_codec_name(c->codec),
						  (unsigned long long)at, (unsigned long long)raw,
						  (unsigned long long)h->stored_length);
				goto out;
			}
			at = arena_align_up(c->offset + c->stored_length, 4096);
			continue;
		}
		if (c->offset != start || c->raw_length != raw || c->stored_length != raw || c->flags || get32(e + 28)) {
			rc = arena_errorf(E(IMG_CHUNK_TABLE_BAD),
					  "%s: chunk %llu: entry (offset %llu, %u/%u bytes) does not match the layout (offset %llu, %llu bytes)",
					  img->path, (unsigned long long)i, (unsigned long long)c->offset,
					  c->stored_length, c->raw_length, (unsigned long long)start, (unsigned long long)raw);
			goto out;
		}
	}
	if (coded && at != h->stored_length) {
		rc = arena_errorf(E(IMG_CHUNK_TABLE_BAD), "%s: the chunks end at stored byte %llu, the header says %llu",
				  img->path, (unsigned long long)at, (unsigned long long)h->stored_length);
		goto out;
	}
	for (uint64_t i = h->chunk_count * ARENA_IMG_CHUNK_ENTRY; i < h->chunk_table_length; i++)
		if (buf[i]) {
			rc = arena_errorf(E(IMG_CHUNK_TABLE_BAD), "%s: chunk table padding byte %llu is not zero",
					  img->path, (unsigned long long)i);
			goto out;
		}
out:
	arena_free(buf);
	return rc;
}

int arena_img_use_pieces(arena_image *img, uint64_t piece_bytes)
{
	arena_layout *pl;
	if (!piece_bytes)
		return 0;
	int rc = arena_layout_pieces(img->layout, piece_bytes, &pl, NULL);
	if (rc)
		return rc;
	arena_layout_free(img->layout);
	img->layout = pl;
	return 0;
}

int arena_img_open(const char *path, arena_image **out)
{
	*out = NULL;
	arena_alloc_init();
	arena_image *img = arena_calloc(1, sizeof(*img));
	if (!img || !(img->path = arena_strdup(path))) {
		arena_free(img);
		return arena_errorf(ARENA_E_NOMEM, "%s: out of memory", path);
	}
	img->fd = img->dfd = -1;
	int rc = 0;
	char *mtext = NULL;
	struct stat st;
	if ((rc = arena_open_input(path, 0, &img->fd, &st)))
		goto out;
	uint8_t page[ARENA_IMG_HEADER_SIZE];
	uint64_t size = (uint64_t)st.st_size;
	if (size >= ARENA_IMG_HEADER_SIZE && (rc = arena_pread_full(img->fd, page, sizeof(page), 0, path)))
		goto out;
	if (size < 8) {
		rc = arena_errorf(E(IMG_TRUNCATED), "%s: file is %llu bytes, shorter than the 4096-byte header", path,
				  (unsigned long long)size);
		goto out;
	}
	if (size < ARENA_IMG_HEADER_SIZE) { /* say "not an image" before "truncated" when the magic is wrong */
		if ((rc = arena_pread_full(img->fd, page, 8, 0, path)))
			goto out;
		rc = memcmp(page, ARENA_IMG_MAGIC, 8)
			     ? arena_errorf(E(IMG_MAGIC), "%s: not an arena image (magic is not \"ARENAIMG\")", path)
			     : arena_errorf(E(IMG_TRUNCATED), "%s: file is %llu bytes, shorter than the 4096-byte header",
					    path, (unsigned long long)size);
		goto out;
	}
	if ((rc = arena_img_header_decode(page, size, path, &img->hdr)))
		goto out;
	mtext = arena_malloc(img->hdr.manifest_length);
	if (!mtext) {
		rc = arena_errorf(ARENA_E_NOMEM, "%s: out of memory for a %llu-byte manifest", path,
				  (unsigned long long)img->hdr.manifest_length);
		goto out;
	}
	if ((rc = arena_pread_full(img->fd, mtext, img->hdr.manifest_length, img->hdr.manifest_offset, path)))
		goto out;
	uint64_t got = arena_xxh3(mtext, img->hdr.manifest_length);
	if (got != img->hdr.manifest_xxh3) {
		rc = arena_errorf(E(IMG_MANIFEST_CHECKSUM), "%s: manifest checksum is %016llx, header says %016llx", path,
				  (unsigned long long)got, (unsigned long long)img->hdr.manifest_xxh3);
		goto out;
	}
	if ((rc = parse_manifest(img, mtext, img->hdr.manifest_length)))
		goto out;
	rc = read_chunk_table(img);
out:
	arena_free(mtext);
	if (rc) {
		arena_img_close(img);
		return rc;
	}
	*out = img;
	return 0;
}

int arena_img_open_direct(arena_image *img)
{
	if (img->dfd >= 0)
		return 1;
	if (arena_open_direct(img->fd, img->path, img->hdr.file_size, 1, &img->dfd, &img->map))
		arena_error_clear(); /* reads stay buffered */
	img->map_len = img->map ? img->hdr.file_size : 0;
	return img->dfd >= 0;
}

void arena_img_close(arena_image *img)
{
	if (!img)
		return;
	if (img->fd >= 0)
		close(img->fd);
	if (img->dfd >= 0)
		close(img->dfd);
	if (img->map)
		munmap(img->map, img->map_len);
	arena_layout_free(img->layout);
	arena_free(img->chunks);
	arena_free(img->used);
	json_decref((json_t *)img->manifest);
	arena_free(img->path);
	arena_free(img);
}

/* ---- data verification ---------------------------------------------------- */

#define VERIFY_PIECE (256u << 10)

typedef struct verify_job {
	arena_image *img;
	atomic_uint_fast64_t next;
	uint64_t *got;   /* per chunk: computed hash */
	uint8_t *bad;    /* per chunk: 1 if mismatched */
	arena_first_error err;
	arena_img_progress_fn progress; /* stored bytes checked, of total */
	void *pctx;
	atomic_uint_fast64_t done;
	uint64_t total;
} verify_job;

static void *verify_worker(void *arg)
{
	verify_job *j = arg;
	const arena_img_header *h = &j->img->hdr;
	/* Coded chunks are read whole: their structure is checked too. */
	const int coded = !!(h->flags & ARENA_IMG_FLAG_CODED);
	uint8_t *buf = arena_malloc(coded ? h->chunk_size : VERIFY_PIECE);
	arena_img_dec dec = {0};
	if (!buf) {
		arena_errorf(ARENA_E_NOMEM, "%s: out of memory for read buffers", j->img->path);
		arena_first_error_set(&j->err, ARENA_E_NOMEM);
		return NULL;
	}
	for (;;) {
		if (arena_first_error_get(&j->err))
			break;
		uint64_t i = atomic_fetch_add(&j->next, 1);
		if (i >= h->chunk_count)
			break;
		const arena_img_chunk *c = &j->img->chunks[i];
		/* Read and hash in L2-sized pieces so the hash reads cached bytes;
		 * a plain chunk's raw padding is looked at while it is cached too. */
		arena_hash st;
		arena_hash_reset(&st);
		int rc = 0;
		uint64_t pad_bad = UINT64_MAX;
		for (uint64_t done = 0; done < c->stored_length && !rc;) {
			uint64_t n = c->stored_length - done < VERIFY_PIECE ? c->stored_length - done : VERIFY_PIECE;
			uint8_t *at = coded ? buf + done : buf;
			rc = arena_pread_full(j->img->fd, at, n, h->data_offset + c->offset + done, j->img->path);
			arena_hash_update(&st, at, n);
			if (!coded && pad_bad == UINT64_MAX)
				pad_bad = arena_img_padding_scan(j->img, c->offset + done, at, n);
			done += n;
		}
		/* A coded chunk's stored padding (no checksum covers it). */
		const uint64_t padded = arena_img_chunk_padded(j->img, i);
		if (!rc && padded > c->stored_length)
			rc = arena_pread_full(j->img->fd, buf + c->stored_length, padded - c->stored_length,
					      h->data_offset + c->offset + c->stored_length, j->img->path);
		if (rc) {
			arena_first_error_set(&j->err, rc);
			break;
		}
		j->got[i] = arena_hash_digest(&st);
		j->bad[i] = j->got[i] != c->xxh3;
		if (!j->bad[i]) /* the structure and padding of a chunk whose checksum holds */
			rc = coded ? arena_img_chunk_check(j->img, i, buf, j->got[i], "while verifying", &dec)
			     : pad_bad != UINT64_MAX ? arena_img_padding_error(j->img, i, pad_bad) : 0;
		if (rc) {
			arena_first_error_set(&j->err, rc);
			break;
		}
		if (j->progress &&
		    j->progress(j->pctx, atomic_fetch_add(&j->done, c->stored_length) + c->stored_length, j->total)) {
			arena_errorf(ARENA_E_CANCELLED, "%s: cancelled", j->img->path);
			arena_first_error_set(&j->err, ARENA_E_CANCELLED);
			break;
		}
	}
	arena_free(buf);
	arena_img_dec_free(&dec);
	return NULL;
}

int arena_img_verify_data(arena_image *img, unsigned threads, arena_img_bad_fn bad, void *ctx, uint64_t *n_bad)
{
	return arena_img_verify_data_progress(img, threads, bad, ctx, n_bad, NULL, NULL);
}

int arena_img_verify_data_progress(arena_image *img, unsigned threads, arena_img_bad_fn bad, void *ctx,
				   uint64_t *n_bad, arena_img_progress_fn progress, void *pctx)
{
	const arena_img_header *h = &img->hdr;
	if (n_bad)
		*n_bad = 0;
	if (threads < 1)
		threads = 1;
	if (threads > 64)
		threads = 64;
	if (threads > h->chunk_count)
		threads = h->chunk_count ? (unsigned)h->chunk_count : 1;
	verify_job j = {.img = img, .progress = progress, .pctx = pctx};
	atomic_init(&j.next, 0);
	atomic_init(&j.done, 0);
	for (uint64_t i = 0; i < h->chunk_count; i++)
		j.total += img->chunks[i].stored_length;
	arena_first_error_init(&j.err);
	j.got = arena_calloc(h->chunk_count, sizeof(uint64_t));
	j.bad = arena_calloc(h->chunk_count, 1);
	pthread_t *tid = arena_calloc(threads, sizeof(*tid));
	int rc = 0;
	if (!j.got || !j.bad || !tid) {
		rc = arena_errorf(ARENA_E_NOMEM, "%s: out of memory", img->path);
		goto out;
	}
	unsigned started = 0;
	for (; started < threads; started++)
		if (pthread_create(&tid[started], NULL, verify_worker, &j))
			break;
	if (started == 0)
		verify_worker(&j);
	for (unsigned i = 0; i < started; i++)
		pthread_join(tid[i], NULL);
	if ((rc = arena_first_error_raise(&j.err)))
		goto out;
	uint64_t nb = 0, first = 0;
	for (uint64_t i = 0; i < h->chunk_count; i++) {
		if (!j.bad[i])
			continue;
		if (!nb++)
			first = i;
		if (bad)
			bad(ctx, img, i, img->chunks[i].xxh3, j.got[i]);
	}
	if (n_bad)
		*n_bad = nb;
	if (nb) {
		char what[512];
		arena_img_chunk_describe(img, first, what, sizeof(what));
		const arena_img_chunk *c = &img->chunks[first];
		rc = arena_errorf(E(IMG_CHUNK_CHECKSUM),
				  "%s: chunk %llu (file bytes %llu..%llu) checksum mismatch%s; it holds %s",
				  img->path, (unsigned long long)first, (unsigned long long)(h->data_offset + c->offset),
				  (unsigned long long)(h->data_offset + c->offset + c->stored_length),
				  nb > 1 ? " (and more chunks)" : "", what);
	}
out:
	arena_first_error_destroy(&j.err);
	arena_free(j.got);
	arena_free(j.bad);
	arena_free(tid);
	return rc;
}

void arena_img_chunk_cover(const arena_image *img, uint64_t i, void (*fn)(void *ctx, uint32_t block, int64_t tensor),
			   void *ctx)
{
	const arena_layout *l = img->layout;
	uint64_t c0 = i * img->hdr.chunk_size, c1 = c0 + img->hdr.chunk_size;
	for (size_t b = 0; b < l->n_blocks; b++) {
		const arena_block *blk = &l->blocks[b];
		uint64_t s0 = blk->offset, s1 = arena_align_up(blk->offset + blk->bytes, ARENA_SLAB_ALIGN);
		if (s1 <= c0 || s0 >= c1)
			continue;
		int any = 0;
		for (uint32_t k = 0; k < blk->n_tensors; k++) {
			uint32_t ti = l->order[blk->first + k];
			const arena_tensor *t = &l->tensors[ti];
			for (uint32_t c = 0; c < t->n_comp; c++) {
				uint64_t a = blk->offset + t->comp[c].offset, z = a + t->comp[c].bytes;
				if (a < c1 && z > c0) {
					fn(ctx, (uint32_t)b, ti);
					any = 1;
					break;
				}
			}
		}
		if (!any)
			fn(ctx, (uint32_t)b, -1); /* only the slab's padding */
	}
}

typedef struct describe_ctx {
	const arena_layout *l;
	char blocks[256];
	char tensors[256];
	int nb, nt, more;
	uint32_t last_block;
} describe_ctx;

static void describe_fn(void *arg, uint32_t block, int64_t tensor)
{
	describe_ctx *d = arg;
	if (!d->nb || d->last_block != block) {
		size_t o = strlen(d->blocks);
		if (d->nb < 3)
			snprintf(d->blocks + o, sizeof(d->blocks) - o, "%s'%s'", d->nb ? ", " : "",
				 arena_q(d->l->blocks[block].name));
		else if (d->nb == 3)
			snprintf(d->blocks + o, sizeof(d->blocks) - o, ", ...");
		d->nb++;
		d->last_block = block;
	}
	if (tensor >= 0) {
		size_t o = strlen(d->tensors);
		if (d->nt < 3)
			snprintf(d->tensors + o, sizeof(d->tensors) - o, "%s'%s'", d->nt ? ", " : "",
				 arena_q(d->l->tensors[tensor].name));
		else
			d->more++;
		d->nt++;
	}
}

void arena_img_chunk_describe(const arena_image *img, uint64_t i, char *buf, size_t len)
{
	describe_ctx d = {.l = img->layout};
	arena_img_chunk_cover(img, i, describe_fn, &d);
	if (!d.nb)
		snprintf(buf, len, "only padding");
	else if (!d.nt)
		snprintf(buf, len, "block%s %s (padding only)", d.nb > 1 ? "s" : "", d.blocks);
	else if (d.more)
		snprintf(buf, len, "block%s %s, tensors %s and %d more", d.nb > 1 ? "s" : "", d.blocks, d.tensors, d.more);
	else
		snprintf(buf, len, "block%s %s, tensor%s %s", d.nb > 1 ? "s" : "", d.blocks, d.nt > 1 ? "s" : "",
			 d.tensors);
}

/* ---- padding ----------------------------------------------------------------- */

uint64_t arena_img_chunk_padded(const arena_image *img, uint64_t i)
{
	const arena_img_chunk *c = &img->chunks[i];
	/* Coded chunks start 4096-aligned; a plain chunk's length is a multiple of 4096. */
	return (img->hdr.flags & ARENA_IMG_FLAG_CODED) ? arena_align_up(c->stored_length, 4096) : c->stored_length;
}

int arena_img_stored_padding_check(const arena_image *img, uint64_t i, const uint8_t *p, uint64_t n)
{
	const arena_img_chunk *c = &img->chunks[i];
	for (uint64_t k = 0; k < n; k++)
		if (p[k]) {
			const uint64_t at = img->hdr.data_offset + c->offset;
			return arena_errorf(E(IMG_PADDING),
					    "%s: chunk %llu: file byte %llu is padding after the chunk's stored bytes (file bytes "
					    "%llu..%llu) and is not zero",
					    img->path, (unsigned long long)i, (unsigned long long)(at + c->stored_length + k),
					    (unsigned long long)at, (unsigned long long)(at + c->stored_length));
		}
	return 0;
}

int arena_img_padding(const arena_image *img, uint64_t a, uint64_t z, int (*fn)(void *ctx, uint64_t x, uint64_t y),
		      void *ctx)
{
	const arena_img_span *u = img->used;
	size_t lo = 0, hi = img->n_used;
	while (lo < hi) { /* the first span ending after a */
		size_t mid = lo + (hi - lo) / 2;
		if (u[mid].z <= a)
			lo = mid + 1;
		else
			hi = mid;
	}
	for (size_t k = lo; a < z; k++) {
		const uint64_t s = k < img->n_used && u[k].a < z ? u[k].a : z;
		if (s > a) {
			int rc = fn(ctx, a, s);
			if (rc)
				return rc;
		}
		if (s == z)
			break;
		if (u[k].z > a)
			a = u[k].z;
	}
	return 0;
}

typedef struct scan_ctx {
	uint64_t a;          /* raw offset of p[0] (plain), or of the chunk (coded) */
	const uint8_t *p;
	const arena_hb4 *v;
	const arena_zstd *z;
	uint64_t bad;
} scan_ctx;

static int scan_plain(void *arg, uint64_t x, uint64_t y)
{
	scan_ctx *s = arg;
	for (uint64_t k = x; k < y; k++)
		if (s->p[k - s->a]) {
			s->bad = k;
			return 1;
		}
	return 0;
}

static int scan_hb4(void *arg, uint64_t x, uint64_t y)
{
	scan_ctx *s = arg;
	uint64_t k = arena_hb4_first_nonzero(s->v, x - s->a, y - s->a);
	if (k == y - s->a)
		return 0;
	s->bad = s->a + k;
	return 1;
}

static int scan_zstd(void *arg, uint64_t x, uint64_t y)
{
	scan_ctx *s = arg;
	uint64_t k = arena_zstd_first_nonzero(s->z, x - s->a, y - s->a);
	if (k == y - s->a)
		return 0;
	s->bad = s->a + k;
	return 1;
}

uint64_t arena_img_padding_scan_zstd(const arena_image *img, uint64_t i, const arena_zstd *v)
{
	scan_ctx s = {.a = i * img->hdr.chunk_size, .z = v, .bad = UINT64_MAX};
	arena_img_padding(img, s.a, s.a + img->chunks[i].raw_length, scan_zstd, &s);
	return s.bad;
}

uint64_t arena_img_padding_scan(const arena_image *img, uint64_t a, const uint8_t *p, uint64_t n)
{
	scan_ctx s = {.a = a, .p = p, .bad = UINT64_MAX};
	arena_img_padding(img, a, a + n, scan_plain, &s);
	return s.bad;
}

uint64_t arena_img_padding_scan_hb4(const arena_image *img, uint64_t i, const arena_hb4 *v)
{
	scan_ctx s = {.a = i * img->hdr.chunk_size, .v = v, .bad = UINT64_MAX};
	arena_img_padding(img, s.a, s.a + img->chunks[i].raw_length, scan_hb4, &s);
	return s.bad;
}

int arena_img_padding_error(const arena_image *img, uint64_t i, uint64_t at)
{
	char file[48] = "", where[320] = "after the last slab";
	if (!(img->hdr.flags & ARENA_IMG_FLAG_CODED))
		snprintf(file, sizeof(file), " (file byte %llu)", (unsigned long long)(img->hdr.data_offset + at));
	const arena_layout *l = img->layout;
	for (size_t b = 0; l && b < l->n_blocks; b++) {
		const arena_block *blk = &l->blocks[b];
		if (at < blk->offset) {
			snprintf(where, sizeof(where), "between slabs");
			break;
		}
		if (at < blk->offset + blk->bytes) {
			snprintf(where, sizeof(where), "in block '%s' outside its tensors", arena_q(blk->name));
			break;
		}
	}
	return arena_errorf(E(IMG_PADDING), "%s: chunk %llu: data byte %llu%s is padding %s and is not zero", img->path,
			    (unsigned long long)i, (unsigned long long)at, file, where);
}

/* ---- checked reads of raw bytes -------------------------------------------- */

void arena_img_dec_free(arena_img_dec *d)
{
	arena_zstd_work_free(&d->work);
	memset(d, 0, sizeof(*d));
}

void arena_img_dec_raw(const arena_img_dec *d, unsigned codec, uint64_t a, uint64_t z, uint8_t *dst)
{
	if (codec == ARENA_CODEC_HB4)
		arena_hb4_decode(&d->hb4, a, z, dst);
	else
		arena_zstd_gather(&d->zstd, a, z, dst);
}

int arena_img_chunk_check(const arena_image *img, uint64_t i, const uint8_t *buf, uint64_t got_hash, const char *why,
			  arena_img_dec *d)
{
	const arena_img_chunk *c = &img->chunks[i];
	const uint64_t at = img->hdr.data_offset + c->offset;
	if (got_hash != c->xxh3) {
		char what[512];
		arena_img_chunk_describe(img, i, what, sizeof(what));
		return arena_errorf(E(IMG_CHUNK_CHECKSUM),
				    "%s: chunk %llu (file bytes %llu..%llu) checksum mismatch, caught %s; it holds %s", img->path,
				    (unsigned long long)i, (unsigned long long)at, (unsigned long long)(at + c->stored_length),
				    why, what);
	}
	if (!buf)
		return 0;
	arena_img_dec tmp = {0};
	if (!d)
		d = &tmp;
	int rc = 0;
	char label[256];
	snprintf(label, sizeof(label), "%s: chunk %llu (file bytes %llu..%llu)", img->path, (unsigned long long)i,
		 (unsigned long long)at, (unsigned long long)(at + c->stored_length));
	/* Only what the checksum covered is decoded, and only once its structure holds. */
	if (c->codec == ARENA_CODEC_HB4)
		rc = arena_hb4_parse(buf, c->stored_length, c->raw_length, label, &d->hb4);
	else if (c->codec == ARENA_CODEC_ZSTD && !(rc = arena_zstd_parse(buf, c->stored_length, c->raw_length, label,
									    &d->zstd)))
		rc = arena_zstd_decode(&d->work, &d->zstd, buf, label);
	if (!rc)
		rc = arena_img_stored_padding_check(img, i, buf + c->stored_length,
						    arena_img_chunk_padded(img, i) - c->stored_length);
	if (!rc) {
		uint64_t bad = c->codec == ARENA_CODEC_HB4    ? arena_img_padding_scan_hb4(img, i, &d->hb4)
			       : c->codec == ARENA_CODEC_ZSTD ? arena_img_padding_scan_zstd(img, i, &d->zstd)
							      : arena_img_padding_scan(img, i * img->hdr.chunk_size, buf,
										       c->raw_length);
		rc = bad == UINT64_MAX ? 0 : arena_img_padding_error(img, i, bad);
	}
	arena_img_dec_free(&tmp);
	return rc;
}

int arena_img_reader_init(arena_img_reader *r, arena_image *img, int verify)
{
	memset(r, 0, sizeof(*r));
	r->img = img;
	r->verify = verify;
	r->chunk = UINT64_MAX;
	if (!verify && !(img->hdr.flags & ARENA_IMG_FLAG_CODED))
		return 0;
	r->stored = arena_aligned_alloc(ARENA_DIRECT_ALIGN, img->hdr.chunk_size); /* for O_DIRECT reads */
	r->raw = arena_aligned_alloc(ARENA_DIRECT_ALIGN, img->hdr.chunk_size);
	if (!r->stored || !r->raw) {
		arena_img_reader_free(r);
		return arena_errorf(ARENA_E_NOMEM, "%s: out of memory for a %llu-byte chunk", img->path,
				    (unsigned long long)img->hdr.chunk_size);
	}
	return 0;
}

void arena_img_reader_free(arena_img_reader *r)
{
	arena_free(r->stored);
	arena_free(r->raw);
	r->stored = r->raw = NULL;
	arena_img_dec_free(&r->dec);
}

/* n bytes of the file at off into buf: through the page cache, or (r->direct)
 * from it where it holds them and with O_DIRECT where not. */
static int reader_pread(arena_img_reader *r, uint8_t *buf, uint64_t n, uint64_t off)
{
	const arena_image *img = r->img;
	return r->direct ? arena_pread_cached_or_direct(img->fd, img->dfd, img->map, buf, n, off, img->path, NULL)
			 : arena_pread_full(img->fd, buf, n, off, img->path);
}

/* Chunk i's raw bytes into r->raw. */
static int reader_load(arena_img_reader *r, uint64_t i)
{
	const arena_image *img = r->img;
	const arena_img_chunk *c = &img->chunks[i];
	r->chunk = UINT64_MAX;
	uint8_t *dst = c->codec ? r->stored : r->raw;
	int rc = reader_pread(r, dst, arena_img_chunk_padded(img, i), img->hdr.data_offset + c->offset);
	if (rc)
		return rc;
	/* Without verify the checksum is taken as read (the expected value is
	 * passed), but a coded chunk's structure and every chunk's padding are
	 * checked all the same. */
	uint64_t got = r->verify ? arena_xxh3(dst, c->stored_length) : c->xxh3;
	if ((rc = arena_img_chunk_check(img, i, dst, got, "while reading", &r->dec)))
		return rc;
	if (c->codec)
		arena_img_dec_raw(&r->dec, c->codec, 0, c->raw_length, r->raw);
	r->chunk = i;
	return 0;
}

int arena_img_read_chunk(arena_img_reader *r, uint64_t i, const uint8_t **stored)
{
	const arena_image *img = r->img;
	*stored = NULL;
	if (i >= img->hdr.chunk_count || !r->stored)
		return arena_errorf(ARENA_E_USAGE, "%s: chunk %llu: no such chunk, or a reader without buffers", img->path,
				    (unsigned long long)i);
	const arena_img_chunk *c = &img->chunks[i];
	r->chunk = UINT64_MAX; /* the raw cache is not this chunk's */
	int rc = reader_pread(r, r->stored, arena_img_chunk_padded(img, i), img->hdr.data_offset + c->offset);
	if (rc)
		return rc;
	uint64_t got = r->verify ? arena_xxh3(r->stored, c->stored_length) : c->xxh3;
	if ((rc = arena_img_chunk_check(img, i, r->stored, got, "while reading", &r->dec)))
		return rc;
	*stored = r->stored;
	return 0;
}

int arena_img_read_raw(arena_img_reader *r, uint64_t off, uint64_t len, uint8_t *dst)
{
	const arena_img_header *h = &r->img->hdr;
	if (off > h->data_length || len > h->data_length - off)
		return arena_errorf(ARENA_E_USAGE, "%s: raw bytes %llu..%llu lie outside the data (%llu bytes)", r->img->path,
				    (unsigned long long)off, (unsigned long long)(off + len),
				    (unsigned long long)h->data_length);
	if (!r->raw)
		return arena_pread_full(r->img->fd, dst, len, h->data_offset + off, r->img->path);
	while (len) {
		uint64_t i = off / h->chunk_size, in = off - i * h->chunk_size;
		int rc;
		const arena_img_chunk *c = &r->img->chunks[i];
		if (!(h->flags & ARENA_IMG_FLAG_CODED) && !in && c->raw_length <= len && r->chunk != i &&
		    !(r->direct && (uintptr_t)dst % ARENA_DIRECT_ALIGN)) {
			/* a whole plain chunk (no stored padding): read and checked in
			 * place (where an O_DIRECT read can go there) */
			if ((rc = reader_pread(r, dst, c->raw_length, h->data_offset + c->offset)) ||
			    (rc = arena_img_chunk_check(r->img, i, dst, r->verify ? arena_xxh3(dst, c->raw_length) : c->xxh3,
							"while reading", &r->dec)))
				return rc;
			dst += c->raw_length;
			off += c->raw_length;
			len -= c->raw_length;
			continue;
		}
		if (r->chunk != i && (rc = reader_load(r, i)))
			return rc;
		uint64_t n = r->img->chunks[i].raw_length - in < len ? r->img->chunks[i].raw_length - in : len;
		memcpy(dst, r->raw + in, n);
		dst += n;
		off += n;
		len -= n;
	}
	return 0;
}
