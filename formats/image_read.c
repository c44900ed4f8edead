/* image_read.c - the checked chunk reader: raw data bytes read from an
 * image chunk by chunk through a one-chunk cache (see image.h).
 *
 * A reader with buffers (verify, or a coded image) checks every chunk it
 * reads for structure and padding, and with verify its checksum: a read
 * that returns 0 has checked every chunk it read from. Without verify an
 * uncoded image has no buffers: its reads go straight to the file. */
#include "image_int.h"

#include <string.h>

#include "../common/alloc.h"
#include "../common/hash.h"
#include "../common/io.h"
#include "codec.h"

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
