/* reread.c - a block's slab read again from its image, checked (see reread.h). */
#include "reread.h"

#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "../common/alloc.h"
#include "../common/err.h"
#include "../common/hash.h"
#include "../common/io.h"
#include "../common/outfile.h"
#include "../formats/image.h"

struct arena_slab_reader {
	arena_image *img;
	const arena_layout *l;
	arena_img_reader rd; /* checked, one chunk cached */
};

int arena_slab_reader_open(const char *path, const arena_layout *l, arena_slab_reader **out)
{
	return arena_slab_reader_open_pieces(path, l, 0, out);
}

int arena_slab_reader_open_pieces(const char *path, const arena_layout *l, uint64_t piece_bytes,
				  arena_slab_reader **out)
{
	*out = NULL;
	arena_slab_reader *r = arena_calloc(1, sizeof(*r));
	if (!r)
		return arena_errorf(ARENA_E_NOMEM, "out of memory");
	int rc = arena_img_open(path, &r->img);
	if (!rc) /* the model's blocks may be the image's in pieces */
		rc = arena_img_use_pieces(r->img, piece_bytes);
	const arena_layout *il = r->img ? r->img->layout : NULL;
	if (!rc && il->n_blocks != l->n_blocks)
		rc = arena_errorf(ARENA_E(IMG_MANIFEST_BAD), "%s: %zu blocks, the model has %zu", path, il->n_blocks,
				  l->n_blocks);
	for (size_t b = 0; !rc && b < l->n_blocks; b++)
		if (il->blocks[b].offset != l->blocks[b].offset || il->blocks[b].bytes != l->blocks[b].bytes ||
		    strcmp(il->blocks[b].name, l->blocks[b].name))
			rc = arena_errorf(ARENA_E(IMG_MANIFEST_BAD), "%s: block '%s' is not the model's block '%s'", path,
					  il->blocks[b].name, l->blocks[b].name);
	if (!rc)
		rc = arena_img_reader_init(&r->rd, r->img, 1);
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
	arena_img_reader_free(&r->rd);
	arena_img_close(r->img);
	arena_free(r);
}

int arena_slab_reader_read(void *reader, uint32_t b, uint8_t *dst, uint64_t bytes)
{
	arena_slab_reader *r = reader;
	if (b >= r->l->n_blocks || bytes != r->l->blocks[b].bytes)
		return arena_errorf(ARENA_E_USAGE, "reread: block %u of %" PRIu64 " bytes is not in the layout", b, bytes);
	int rc = arena_img_read_raw(&r->rd, r->l->blocks[b].offset, bytes, dst);
	if (rc) {
		char what[300];
		snprintf(what, sizeof(what), "re-reading block '%s'", arena_q(r->l->blocks[b].name));
		arena_error_prefix(what);
	}
	return rc;
}

void arena_slab_reader_advise(void *reader, uint32_t b)
{
	arena_slab_reader *r = reader;
	if (b >= r->l->n_blocks || !r->l->blocks[b].bytes)
		return;
	const arena_img_header *h = &r->img->hdr;
	const uint64_t c0 = r->l->blocks[b].offset / h->chunk_size,
		       c1 = (r->l->blocks[b].offset + r->l->blocks[b].bytes - 1) / h->chunk_size;
	if (c1 >= h->chunk_count)
		return;
	const uint64_t a = h->data_offset + r->img->chunks[c0].offset,
		       z = h->data_offset + r->img->chunks[c1].offset + r->img->chunks[c1].stored_length;
	(void)posix_fadvise(r->img->fd, (off_t)a, (off_t)(z - a), POSIX_FADV_WILLNEED);
}

int arena_slab_reader_check_output(const arena_slab_reader *r, const char *path)
{
	return arena_outfile_check_input(path, r->img->fd, r->img->path);
}
