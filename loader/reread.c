/* reread.c - a block's slab read again from its image, checked (see reread.h). */
#include "reread.h"

#include <inttypes.h>
#include <string.h>

#include "../common/alloc.h"
#include "../common/err.h"
#include "../common/hash.h"
#include "../common/io.h"
#include "../formats/image.h"

struct arena_slab_reader {
	arena_image *img;
	const arena_layout *l;
	uint8_t *buf; /* one chunk */
};

int arena_slab_reader_open(const char *path, const arena_layout *l, arena_slab_reader **out)
{
	*out = NULL;
	arena_slab_reader *r = arena_calloc(1, sizeof(*r));
	if (!r)
		return arena_errorf(ARENA_E_NOMEM, "out of memory");
	int rc = arena_img_open(path, &r->img);
	const arena_layout *il = r->img ? r->img->layout : NULL;
	if (!rc && il->n_blocks != l->n_blocks)
		rc = arena_errorf(ARENA_E(IMG_MANIFEST_BAD), "%s: %zu blocks, the model has %zu", path, il->n_blocks,
				  l->n_blocks);
	for (size_t b = 0; !rc && b < l->n_blocks; b++)
		if (il->blocks[b].offset != l->blocks[b].offset || il->blocks[b].bytes != l->blocks[b].bytes ||
		    strcmp(il->blocks[b].name, l->blocks[b].name))
			rc = arena_errorf(ARENA_E(IMG_MANIFEST_BAD), "%s: block '%s' is not the model's block '%s'", path,
					  il->blocks[b].name, l->blocks[b].name);
	if (!rc && !(r->buf = arena_malloc(r->img->hdr.chunk_size)))
		rc = arena_errorf(ARENA_E_NOMEM, "out of memory for a chunk of %" PRIu64 " bytes",
				  r->img->hdr.chunk_size);
	if (rc) {
		arena_slab_reader_close(r);
		return rc;
	}
	r->l = l;
	*out = r;
	return 0;
}

void arena_slab_reader_close(arena_slab_reader *r)
{
	if (!r)
		return;
	arena_img_close(r->img);
	arena_free(r->buf);
	arena_free(r);
}

int arena_slab_reader_read(void *reader, uint32_t b, uint8_t *dst, uint64_t bytes)
{
	arena_slab_reader *r = reader;
	const arena_img_header *h = &r->img->hdr;
	if (b >= r->l->n_blocks || bytes != r->l->blocks[b].bytes)
		return arena_errorf(ARENA_E_USAGE, "reread: block %u of %" PRIu64 " bytes is not in the layout", b, bytes);
	uint64_t a = r->l->blocks[b].offset, z = a + bytes;
	for (uint64_t c = a / h->chunk_size; bytes && c < h->chunk_count && c * h->chunk_size < z; c++) {
		const arena_img_chunk *ch = &r->img->chunks[c];
		int rc = arena_pread_full(r->img->fd, r->buf, ch->raw_length, h->data_offset + ch->offset, r->img->path);
		if (rc)
			return rc;
		uint64_t got = arena_xxh3(r->buf, ch->raw_length);
		if (got != ch->xxh3)
			return arena_errorf(ARENA_E(IMG_CHUNK_CHECKSUM),
					    "%s: chunk %" PRIu64 " checksum mismatch, caught while re-reading block '%s'",
					    r->img->path, c, r->l->blocks[b].name);
		uint64_t c0 = ch->offset, c1 = c0 + ch->raw_length;
		uint64_t lo = a > c0 ? a : c0, hi = z < c1 ? z : c1;
		if (lo < hi)
			memcpy(dst + (lo - a), r->buf + (lo - c0), (size_t)(hi - lo));
	}
	return 0;
}
