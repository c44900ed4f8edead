/* image.c - open an arena image: its header, manifest and chunk table read
 * and checked, before any data byte is read (docs/FORMAT.md).
 *
 * Nothing is trusted before its checksum holds, in the order FORMAT.md
 * gives: the header (magic, checksum, version, flags, region rules, size),
 * then the manifest (checksum, structure, each tensor against its scheme),
 * then the chunk table (checksum, agreement with header and manifest). An
 * image that opens has a layout whose components lie in their slabs and
 * whose names, dtypes and shapes readers may trust from here on. */
#include "image_int.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/alloc.h"
#include "../common/hash.h"
#include "../common/io.h"
#include "codec.h"
#include "scheme.h"

/* ---- header ---------------------------------------------------------------- */

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

/* ---- manifest: reading ---------------------------------------------------- */

typedef struct mctx {
	const char *label;
	char where[96];
	uint32_t flags; /* the header's */
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
		json_t *sub = json_object_get(o, "subclass");
		if (sub && !json_is_object(sub))
			return mbad(&m, "\"subclass\" is not an object");
		t->name = arena_strdup(name);
		t->subclass = sub ? json_dumps(sub, JSON_COMPACT) : NULL;
		if (!t->name || (sub && !t->subclass))
			return arena_errorf(ARENA_E_NOMEM, "%s: out of memory reading the manifest", m.label);
		if (sub && !(m.flags & ARENA_IMG_FLAG_SUBCLASS))
			return mbad(&m, "a \"subclass\" object in an image without the torch-subclass flag (bit 2)");
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
	mctx m = {.label = img->path, .where = "", .flags = img->hdr.flags};
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

int arena_img_read_header(const char *path, arena_img_header *h)
{
	int fd;
	struct stat st;
	int rc = arena_open_input(path, 0, &fd, &st);
	if (rc)
		return rc;
	uint8_t page[ARENA_IMG_HEADER_SIZE];
	const uint64_t size = (uint64_t)st.st_size;
	rc = size < ARENA_IMG_HEADER_SIZE ? arena_errorf(E(IMG_TRUNCATED), "%s: file is %llu bytes, shorter than the "
									 "4096-byte header", path, (unsigned long long)size)
					  : arena_pread_full(fd, page, sizeof(page), 0, path);
	if (!rc)
		rc = arena_img_header_decode(page, size, path, h);
	close(fd);
	return rc;
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
