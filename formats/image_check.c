/* image_check.c - an image's data region checked: a chunk's checksum,
 * structure and padding, every chunk on threads (verify), and what a chunk
 * holds for the messages (docs/FORMAT.md, "Padding").
 *
 * Every byte no checksum covers is zero, and raw padding is zero too: every
 * reader that reads a chunk checks, in this order, its checksum, a coded
 * chunk's structure, then its stored and its raw padding. Only bytes the
 * checksum covered are decoded, and only once their structure holds. */
#include "image_int.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "../common/alloc.h"
#include "../common/firsterr.h"
#include "../common/hash.h"
#include "../common/io.h"
#include "codec.h"

/* ---- one chunk checked ----------------------------------------------------- */

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

/* ---- what a chunk holds (for messages) ------------------------------------ */

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

/* ---- every chunk, on threads (verify) -------------------------------------- */

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
