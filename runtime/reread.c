/* reread.c - a block's slab read again from its image, checked (see reread.h). */
#include "reread.h"

#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/alloc.h"
#include "../common/err.h"
#include "../common/firsterr.h"
#include "../common/hash.h"
#include "../common/io.h"
#include "../common/outfile.h"
#include "../formats/image.h"
#include "../formats/wire.h"

/* A read of many chunks is shared by up to REREAD_THREADS threads (the
 * caller's and more), each with its own reader, each taking a run of whole
 * chunks: reading, checking and copying a chunk is one core's work at a
 * few GB/s, and the disk tier re-reads every streamed block it holds at
 * every step. ARENA_REREAD_THREADS sets another count (1: the caller's
 * thread alone), for measuring. */
enum { REREAD_THREADS = 8 };

struct arena_slab_reader {
	arena_image *img;
	const arena_layout *l;
	arena_img_reader rd[REREAD_THREADS]; /* checked, one chunk cached each; rd[0] always set up */
	unsigned n_rd, want_rd;              /* set up; to use */
	int direct;                          /* readers read what is not cached with O_DIRECT */
};

typedef struct part {
	arena_img_reader *rd;
	uint64_t off, len; /* raw data bytes */
	uint8_t *dst;      /* raw bytes to here, or (wire) into its coded form */
	arena_wire *wire;
	uint64_t block_off; /* wire: the block's first data byte */
	arena_first_error *err;
} part;

/* The chunks of [off, off + len) put into the block's coded form. */
static int wire_part(const part *p)
{
	const arena_image *img = p->rd->img;
	const uint64_t cs = img->hdr.chunk_size;
	for (uint64_t c = p->off / cs; c * cs < p->off + p->len; c++) {
		const uint8_t *st;
		int rc = arena_img_read_chunk(p->rd, c, &st);
		if (rc)
			return rc;
		const uint64_t c0 = c * cs, c1 = c0 + img->chunks[c].raw_length;
		const uint64_t x = c0 > p->off ? c0 : p->off, y = c1 < p->off + p->len ? c1 : p->off + p->len;
		const unsigned codec = img->chunks[c].codec;
		arena_wire_put(p->wire, x - p->block_off, y - p->block_off, &p->rd->dec, codec,
			       (int64_t)c0 - (int64_t)p->block_off, codec ? NULL : st + (x - c0));
	}
	return 0;
}

static void *read_part(void *arg)
{
	part *p = arg;
	int rc = p->wire ? wire_part(p) : arena_img_read_raw(p->rd, p->off, p->len, p->dst);
	if (rc)
		arena_first_error_set(p->err, rc);
	return NULL;
}

/* The readers a read uses: ARENA_REREAD_THREADS, else REREAD_THREADS. */
static unsigned reader_count(void)
{
	const char *env = getenv("ARENA_REREAD_THREADS");
	const int t = env ? atoi(env) : 0;
	return t >= 1 && t <= REREAD_THREADS ? (unsigned)t : REREAD_THREADS;
}

uint64_t arena_slab_reader_buffers(const arena_img_header *h, uint64_t largest)
{
	if (!h->chunk_size)
		return 0;
	/* a read of `largest` bytes touches this many chunks at most, each run
	 * its own reader's; a reader fills its raw buffer (a plain image's
	 * chunk read in part), and for a coded image its stored one, and for a
	 * zstd chunk the decoded streams (no more than the image's data each) */
	const uint64_t chunks = (largest ? largest - 1 : 0) / h->chunk_size + 2;
	const uint64_t n = chunks < reader_count() ? chunks : reader_count();
	const uint64_t chunk = h->chunk_size < h->data_length ? h->chunk_size : h->data_length;
	const unsigned bufs = !(h->flags & ARENA_IMG_FLAG_CODED) ? 1 : h->flags & ARENA_IMG_FLAG_ZSTD ? 3 : 2;
	return n * chunk * bufs;
}

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
		rc = arena_img_reader_init(&r->rd[0], r->img, 1);
	if (rc) {
		arena_slab_reader_close(r);
		return rc;
	}
	r->n_rd = 1;
	r->want_rd = reader_count();
	r->l = l;
	*out = r;
	return 0;
}

void arena_slab_reader_close(arena_slab_reader *r)
{
	if (!r)
		return;
	for (unsigned i = 0; i < r->n_rd; i++)
		arena_img_reader_free(&r->rd[i]);
	arena_img_close(r->img);
	arena_free(r);
}

int arena_slab_reader_read(void *reader, uint32_t b, uint8_t *dst, uint64_t bytes)
{
	arena_slab_reader *r = reader;
	if (b >= r->l->n_blocks || bytes != r->l->blocks[b].bytes)
		return arena_errorf(ARENA_E_USAGE, "reread: block %u of %" PRIu64 " bytes is not in the layout", b, bytes);
	return arena_slab_reader_read_part(reader, b, 0, bytes, dst);
}

static int read_runs(arena_slab_reader *r, uint32_t b, uint64_t at, uint64_t bytes, uint8_t *dst, arena_wire *wire);

int arena_slab_reader_read_part(void *reader, uint32_t b, uint64_t at, uint64_t bytes, uint8_t *dst)
{
	arena_slab_reader *r = reader;
	if (b >= r->l->n_blocks || at > r->l->blocks[b].bytes || bytes > r->l->blocks[b].bytes - at)
		return arena_errorf(ARENA_E_USAGE, "reread: bytes %" PRIu64 "..%" PRIu64 " are not in block %u", at,
				    at + bytes, b);
	return read_runs(r, b, at, bytes, dst, NULL);
}

int arena_slab_reader_read_wire(void *reader, uint32_t b, uint64_t at, uint64_t bytes, arena_wire *w)
{
	arena_slab_reader *r = reader;
	if (b >= r->l->n_blocks || !w || !w->buf || at > r->l->blocks[b].bytes || bytes > r->l->blocks[b].bytes - at)
		return arena_errorf(ARENA_E_USAGE, "reread: block %u: no coded form to fill, or bytes %" PRIu64 "..%" PRIu64
				    " not in it", b, at, at + bytes);
	int rc = read_runs(r, b, at, bytes, NULL, w);
	return rc ? rc : arena_wire_seal(w, r->l->blocks[b].name);
}

/* Bytes [at, at + bytes) of block b: raw into dst, or the block's coded
 * form (wire), in runs of whole chunks on up to want_rd threads. */
static int read_runs(arena_slab_reader *r, uint32_t b, uint64_t at, uint64_t bytes, uint8_t *dst, arena_wire *wire)
{
	if (!bytes)
		return 0;
	const uint64_t cs = r->img->hdr.chunk_size, off = r->l->blocks[b].offset + at;
	/* Runs of whole chunks, one a reader: the first and last may be partial. */
	const uint64_t c0 = off / cs, c1 = (off + bytes - 1) / cs + 1;
	int rc = 0;
	/* Readers for the threads, set up on first use. */
	while (!rc && r->n_rd < r->want_rd && r->n_rd < c1 - c0)
		if (!(rc = arena_img_reader_init(&r->rd[r->n_rd], r->img, 1)))
			r->rd[r->n_rd++].direct = r->direct;
	uint64_t n = c1 - c0 < r->n_rd ? c1 - c0 : r->n_rd;
	if (rc) {
		/* the error stands */
	} else if (n <= 1) {
		part one = {&r->rd[0], off, bytes, dst, wire, r->l->blocks[b].offset, NULL};
		rc = wire ? wire_part(&one) : arena_img_read_raw(&r->rd[0], off, bytes, dst);
	} else {
		part p[REREAD_THREADS];
		pthread_t tid[REREAD_THREADS];
		unsigned started = 0;
		arena_first_error err;
		arena_first_error_init(&err);
		for (uint64_t i = 0; i < n; i++) {
			uint64_t a = (c0 + (c1 - c0) * i / n) * cs, z = (c0 + (c1 - c0) * (i + 1) / n) * cs;
			a = a < off ? off : a;
			z = z > off + bytes ? off + bytes : z;
			p[i] = (part){&r->rd[i], a, z - a, dst ? dst + (a - off) : NULL, wire, r->l->blocks[b].offset, &err};
		}
		for (uint64_t i = 1; i < n; i++, started++)
			if (pthread_create(&tid[i], NULL, read_part, &p[i]))
				break;
		read_part(&p[0]);
		for (unsigned i = 1; i <= started; i++)
			pthread_join(tid[i], NULL);
		for (uint64_t i = started + 1; i < n; i++) /* threads that could not start: here */
			read_part(&p[i]);
		rc = arena_first_error_raise(&err);
		arena_first_error_destroy(&err);
	}
	if (rc) /* the callers (the engine) name the block */
		arena_error_prefix("re-reading it from the image");
	return rc;
}

int arena_slab_reader_direct(arena_slab_reader *r)
{
	int rc = arena_img_open_direct(r->img);
	if (rc > 0) {
		r->direct = 1;
		for (unsigned i = 0; i < r->n_rd; i++)
			r->rd[i].direct = 1;
	}
	return rc;
}

int arena_slab_reader_check_output(const arena_slab_reader *r, const char *path)
{
	return arena_outfile_check_input(path, r->img->fd, r->img->path);
}
