/* load_image.c - the loader's image source: pieces of whole chunks, each
 * chunk checked as it passes, coded chunks decoded by the device or the CPU,
 * disk-tier blocks left unread (see load.h, "Coded images").
 *
 * A chunk's bytes may be on their way to the device before it is checked:
 * a chunk is checked (checksum, structure, stored and raw padding) when its
 * last byte has been hashed, and a bad one fails the load before anything
 * is committed. A coded chunk is decoded only once it has checked out. */
#include "load_int.h"
#include "share_check.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/alloc.h"
#include "../common/clock.h"
#include "../common/err.h"
#include "../common/io.h"
#include "../common/units.h"
#include "../formats/codec.h"

#define ZSTD_PIECE (64u << 20)   /* zstd images: a piece of stored chunks, read in one read */

/* ---- plain chunks ------------------------------------------------------------ */

/* Feed file bytes [a, z) (in order, at buf) of a plain image to the chunk
 * checks: each chunk's checksum, then its raw padding (looked at while the
 * bytes are cached). A chunk is checked when its last byte has been fed; its
 * bytes may already be on their way to the device: a bad chunk fails the
 * load, and nothing is committed. */
int arena__load_img_check(loader *L, const uint8_t *buf, hasher *h, uint64_t a, uint64_t z)
{
	const uint8_t *q = buf;
	while (a < z) {
		const arena_img_chunk *c = &L->img->chunks[h->chunk];
		uint64_t n = c->raw_length - h->in_chunk;
		if (n > z - a)
			n = z - a;
		arena_hash_update(&h->st, q, (size_t)n);
		if (h->pad_bad == UINT64_MAX)
			h->pad_bad = arena_img_padding_scan(L->img, a - L->img->hdr.data_offset, q, n);
		h->in_chunk += n;
		a += n;
		q += n;
		if (h->in_chunk == c->raw_length) {
			int rc = arena_img_chunk_check(L->img, h->chunk, NULL, arena_hash_digest(&h->st), "while loading", NULL);
			if (!rc && h->pad_bad != UINT64_MAX)
				rc = arena_img_padding_error(L->img, h->chunk, h->pad_bad);
			if (rc)
				return rc;
			h->chunk++;
			h->in_chunk = 0;
			h->pad_bad = UINT64_MAX;
			arena_hash_reset(&h->st);
		}
	}
	return 0;
}

/* ---- which blocks a range reaches ------------------------------------------ */

/* First seg ending after raw position a (segs of a coded image are in raw
 * coordinates, data_offset-based, one file). */
static size_t seg_after(const loader *L, uint64_t a)
{
	size_t lo = 0, hi = L->n_segs;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (L->segs[mid].foff + L->segs[mid].len <= a)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* The disk tier: is file range [a, z) of an image wanted by no block kept
 * on the device or in a host slab? Then it is not read at all (its chunks
 * are checked when a block in them is streamed). */
int arena__load_img_unwanted(const loader *L, uint64_t a, uint64_t z)
{
	if (!L->disk)
		return 0;
	size_t k = seg_after(L, a);
	return k == L->n_segs || L->segs[k].foff >= z;
}

/* Does raw range [a, z) reach a block that lives in a host slab? */
static int reaches_host(const loader *L, uint64_t a, uint64_t z)
{
	for (size_t k = seg_after(L, a); k < L->n_segs && L->segs[k].foff < z; k++)
		if (!L->m->mem[L->segs[k].block].dev)
			return 1;
	return 0;
}

/* ---- coded images ------------------------------------------------------------ */

/* A coded chunk decoded by the CPU: read whole into the worker's own
 * buffer, checked (checksum, then structure: an hb4 chunk parsed, a zstd
 * chunk's streams decoded, bounded; then padding), then its raw bytes made
 * straight into their host slabs, and for device blocks into the worker's
 * pinned ring slots, a slot at a time, each copied on as it is filled. For
 * every zstd chunk; for hb4 chunks that reach host slabs, and on workers
 * without device stage room. */
static int chunk_whole(loader *L, worker *w, uint64_t c, const uint8_t *src, int *direct)
{
	const arena_image *img = L->img;
	const arena_img_chunk *ck = &img->chunks[c];
	const uint64_t cs = img->hdr.chunk_size;
	arena_backend *be = L->m->backend;
	int rc;
	if (!src) { /* not read yet: read it alone */
		if (!w->whole && !(w->whole = arena_aligned_alloc(DIRECT_ALIGN, cs)))
			return arena_errorf(ARENA_E_NOMEM, "out of memory for a %" PRIu64 "-byte chunk buffer", cs);
		uint64_t off = img->hdr.data_offset + ck->offset, n = arena_align_up(ck->stored_length, DIRECT_ALIGN);
		if ((rc = arena__load_read_range(L, w, &L->files[0], w->whole, n, off, direct)))
			return rc;
		atomic_fetch_add(&L->file_bytes, n);
		src = w->whole;
	}
	const uint64_t hash = arena_xxh3(src, ck->stored_length);
	double t = arena_now_s();
	rc = arena_img_chunk_check(img, c, src, hash, "while loading", &w->dec);
	w->t_decode += arena_now_s() - t;
	if (rc)
		return rc;
	const uint64_t a = img->hdr.data_offset + c * cs, z = a + ck->raw_length;
	for (size_t k = seg_after(L, a); k < L->n_segs && L->segs[k].foff < z; k++) {
		const seg *s = &L->segs[k];
		uint64_t x = s->foff > a ? s->foff : a, y = s->foff + s->len < z ? s->foff + s->len : z;
		if (y <= x)
			continue;
		const arena_block_mem *bm = &L->m->mem[s->block];
		uint64_t d = s->dst + (x - s->foff);
		if (bm->wire) {
			t = arena_now_s();
			arena_wire_put(bm->wire, d, d + (y - x), &w->dec, ck->codec, (int64_t)d - (int64_t)(x - a), NULL);
			w->t_decode += arena_now_s() - t;
		} else if (!bm->dev) {
			t = arena_now_s();
			arena_img_dec_raw(&w->dec, ck->codec, x - a, y - a, bm->host + d);
			w->t_decode += arena_now_s() - t;
		}
		for (uint64_t u = x; bm->dev && u < y;) {
			uint8_t *buf;
			unsigned si;
			const uint64_t v = y - u < L->slot ? y : u + L->slot;
			if ((rc = arena__load_next_slot(L, w, &buf, &si)))
				return rc;
			t = arena_now_s();
			arena_img_dec_raw(&w->dec, ck->codec, u - a, v - a, buf);
			w->t_decode += arena_now_s() - t;
			if ((rc = be->ops->copy_h2d(be, (uint8_t *)bm->dev + d + (u - x), buf, v - u, w->s)) ||
			    (rc = be->ops->event_record(be, w->ev[si], w->s)))
				return rc;
			u = v;
		}
		if (!bm->wire)
			atomic_fetch_add(&L->cpu_decoded, y - x);
	}
	return 0;
}

/* An hb4 chunk streamed: the stored bytes its raw padding check decodes
 * (the padding words' nibbles and low bytes, and the exception lists) kept,
 * at their own offsets, from a slot that holds stored bytes [pos, pos+valid). */
typedef struct capture {
	uint8_t *dst;
	const uint8_t *src;
	uint64_t pos, valid, words, c0;
} capture;

static void capture_part(const capture *k, uint64_t s, uint64_t e)
{
	uint64_t x = s > k->pos ? s : k->pos, y = e < k->pos + k->valid ? e : k->pos + k->valid;
	if (x < y)
		memcpy(k->dst + x, k->src + (x - k->pos), y - x);
}

static int capture_fn(void *arg, uint64_t x, uint64_t y)
{
	const capture *k = arg;
	uint64_t nib[2], low[2];
	arena_hb4_reads(k->words, x - k->c0, y - k->c0, nib, low);
	capture_part(k, nib[0], nib[1]);
	capture_part(k, low[0], low[1]);
	return 0;
}

/* A chunk streamed: read a slot at a time, each piece hashed while in cache
 * and sent on at once (a plain chunk straight to its slabs, an hb4 chunk to
 * the worker's device stage, its structure checked as it passes); once the
 * whole chunk has checked out (checksum, structure, stored padding, raw
 * padding: a plain chunk's looked at as it passes, an hb4 chunk's decoded
 * by the CPU from the few stored bytes kept for it), an hb4 chunk is decoded
 * by the device into its slabs. The stage is reused safely without a wait:
 * the next chunk's copies queue on the same stream behind this decode. */
static int chunk_stream(loader *L, worker *w, const piece *p, uint64_t c, int *direct)
{
	const arena_image *img = L->img;
	const arena_img_chunk *ck = &img->chunks[c];
	arena_backend *be = L->m->backend;
	const int coded = ck->codec == ARENA_CODEC_HB4;
	const uint64_t cs = img->hdr.chunk_size, c0 = c * cs;
	const uint64_t a = img->hdr.data_offset + c0, z = a + ck->raw_length;
	const uint64_t off = img->hdr.data_offset + ck->offset, n = arena_align_up(ck->stored_length, DIRECT_ALIGN);
	arena_hash st;
	arena_hash_reset(&st);
	arena_hb4_check chk;
	if (coded) {
		arena_hb4_check_begin(&chk, ck->raw_length, ck->stored_length);
		if (!w->whole && !(w->whole = arena_aligned_alloc(DIRECT_ALIGN, cs)))
			return arena_errorf(ARENA_E_NOMEM, "out of memory for a %" PRIu64 "-byte chunk buffer", cs);
	}
	uint8_t pad[DIRECT_ALIGN]; /* the stored padding: less than a page, in the last slot */
	uint64_t n_pad = 0, pad_bad = UINT64_MAX;
	int rc = 0;
	for (uint64_t pos = 0; pos < n && !rc; pos += L->slot) {
		uint8_t *buf;
		unsigned si;
		if ((rc = arena__load_next_slot(L, w, &buf, &si)))
			return rc;
		uint64_t m = n - pos < L->slot ? n - pos : L->slot;
		uint64_t valid = pos < ck->stored_length ? (ck->stored_length - pos < m ? ck->stored_length - pos : m) : 0;
		if ((rc = arena__load_read_range(L, w, &L->files[0], buf, m, off + pos, direct)))
			return rc;
		atomic_fetch_add(&L->file_bytes, m);
		arena_hash_update(&st, buf, valid);
		if (m > valid) {
			n_pad = m - valid;
			memcpy(pad, buf + valid, n_pad);
		}
		if (coded) {
			arena_hb4_check_feed(&chk, buf, valid);
			if (chk.lengths_ok) {
				capture k = {w->whole, buf, pos, valid, chk.words, c0};
				arena_img_padding(img, c0, c0 + ck->raw_length, capture_fn, &k);
				capture_part(&k, chk.idx_off, ck->stored_length);
			}
			rc = valid ? be->ops->copy_h2d(be, w->stage + pos, buf, valid, w->s) : 0;
		} else {
			if (pad_bad == UINT64_MAX)
				pad_bad = arena_img_padding_scan(img, c0 + pos, buf, valid);
			rc = arena__load_scatter(L, w, p, buf, a + pos, a + pos + valid);
		}
		if (!rc)
			rc = be->ops->event_record(be, w->ev[si], w->s);
	}
	if (rc || (rc = arena_img_chunk_check(img, c, NULL, arena_hash_digest(&st), "while loading", NULL)))
		return rc;
	arena_hb4 v;
	if (coded) {
		char what[512];
		snprintf(what, sizeof(what), "%s: chunk %" PRIu64 " (file bytes %" PRIu64 "..%" PRIu64 ")", img->path, c,
			 off, off + ck->stored_length);
		if ((rc = arena_hb4_check_end(&chk, what, &v)))
			return rc;
		arena_hb4 kept = v;
		kept.nib = w->whole + v.nib_off;
		kept.low = w->whole + v.low_off;
		kept.exc_idx = w->whole + v.idx_off;
		kept.exc_hi = w->whole + v.hi_off;
		pad_bad = arena_img_padding_scan_hb4(img, c, &kept);
	}
	if ((rc = arena_img_stored_padding_check(img, c, pad, n_pad)))
		return rc;
	if (pad_bad != UINT64_MAX)
		return arena_img_padding_error(img, c, pad_bad);
	if (!coded)
		return 0;
	for (size_t k = seg_after(L, a); k < L->n_segs && L->segs[k].foff < z; k++) {
		const seg *s = &L->segs[k];
		uint64_t x = s->foff > a ? s->foff : a, y = s->foff + s->len < z ? s->foff + s->len : z;
		if (y <= x)
			continue;
		uint8_t *dst = (uint8_t *)L->m->mem[s->block].dev + s->dst + (x - s->foff);
		if ((rc = be->ops->decode_hb4(be, dst, w->stage, &v, x - a, y - a, w->s)))
			return rc;
		atomic_fetch_add(&L->gpu_decoded, y - x);
	}
	return 0;
}

/* A piece of a coded image, chunk by chunk. */
int arena__load_img_piece(loader *L, worker *w, const piece *p)
{
	const arena_img_header *h = &L->img->hdr;
	int direct = L->o->io == ARENA_IO_DIRECT && L->files[0].dfd >= 0;
	uint64_t c1 = p->chunk0 + L->per < h->chunk_count ? p->chunk0 + L->per : h->chunk_count;
	if (arena__load_img_unwanted(L, h->data_offset + p->chunk0 * h->chunk_size,
				     h->data_offset + c1 * h->chunk_size))
		return 0;
	/* A piece of zstd chunks only is read in one read (a disk gives more to
	 * few large reads than to one per chunk), then decoded chunk by chunk. */
	int span = c1 - p->chunk0 > 1;
	for (uint64_t c = p->chunk0; c < c1 && span; c++)
		span = L->img->chunks[c].codec == ARENA_CODEC_ZSTD;
	if (span) {
		if (w->span_cap < p->len) {
			arena_free(w->span);
			w->span_cap = 0;
			if (!(w->span = arena_aligned_alloc(DIRECT_ALIGN, p->len)))
				return arena_errorf(ARENA_E_NOMEM, "out of memory for a %" PRIu64 "-byte read buffer", p->len);
			w->span_cap = p->len;
		}
		int rc = arena__load_read_range(L, w, &L->files[0], w->span, p->len, p->off, &direct);
		if (rc)
			return rc;
		atomic_fetch_add(&L->file_bytes, p->len);
	}
	for (uint64_t c = p->chunk0; c < c1; c++) {
		const arena_img_chunk *ck = &L->img->chunks[c];
		uint64_t a = h->data_offset + c * h->chunk_size;
		const int cpu = ck->codec == ARENA_CODEC_ZSTD ||
				(ck->codec && (!w->stage || reaches_host(L, a, a + ck->raw_length)));
		const uint8_t *src = span ? w->span + (h->data_offset + ck->offset - p->off) : NULL;
		int rc = cpu ? chunk_whole(L, w, c, src, &direct) : chunk_stream(L, w, p, c, &direct);
		if (rc)
			return rc;
	}
	return 0;
}

/* Coded images: each worker's device stage (one stored chunk), when some
 * block lives on the device. Where device memory is short (the model fills
 * it), a worker decodes on the CPU instead: slower, not a failure. */
int arena__load_img_stages(loader *L, worker *w)
{
	arena_backend *be = L->m->backend;
	int any = 0;
	for (size_t b = 0; b < L->m->layout->n_blocks && !any; b++)
		any = L->m->mem[b].dev != NULL;
	if (!any || !L->hb4)
		return 0;
	for (unsigned i = 0; i < L->threads; i++) {
		void *p = NULL;
		if (be->ops->decode_hb4 && be->ops->dev_alloc(be, L->img->hdr.chunk_size, &p) == 0)
			w[i].stage = p;
		else
			arena_error_clear();
	}
	return 0;
}

/* ---- a shared host region's name ------------------------------------------------ */

static void key_feed(arena_hash h[2], const void *p, size_t n)
{
	arena_hash_update(&h[0], p, n);
	arena_hash_update(&h[1], p, n);
}

static void key_u64(arena_hash h[2], uint64_t v)
{
	key_feed(h, &v, sizeof(v));
}

void arena__image_share_id(const arena_img_header *hd, uint64_t id[2])
{
	const uint64_t f[] = {hd->major, hd->minor, hd->flags, hd->file_size, hd->manifest_xxh3, hd->chunk_table_xxh3,
			      hd->data_length, hd->chunk_size, hd->chunk_count, hd->stored_length, 0};
	uint64_t g[sizeof(f) / sizeof(f[0])];
	memcpy(g, f, sizeof(f));
	id[0] = arena_xxh3(g, sizeof(g));
	g[sizeof(g) / sizeof(g[0]) - 1] = 1; /* the second half: another hash of the same fields */
	id[1] = arena_xxh3(g, sizeof(g));
}

/* The shared host region's key (device/hostshare.h): the image's identity
 * (its header's checksums of the manifest and of the chunk table, which
 * holds every chunk's checksum, and its sizes) and everything that decides
 * the host mapping's bytes and places: each block's placement, place in
 * the image and size (pieces included), and a coded copy's segments; the
 * library's version and the sizes of the structs the region holds. */
static void share_key(const arena_image *img, const arena_layout *l, const uint8_t *od, arena_wire *const *wplan,
		      uint64_t piece_bytes, arena_share_key *k)
{
	static const char tag[] = "arena host share 1 " ARENA_VERSION_STRING;
	arena_hash h[2];
	arena_hash_reset(&h[0]);
	arena_hash_reset(&h[1]);
	arena_hash_update(&h[1], "\x5a", 1); /* the second half: another hash of the same bytes */
	key_feed(h, tag, sizeof(tag));
	const arena_img_header *hd = &img->hdr;
	const uint64_t id[] = {hd->major, hd->minor, hd->flags, hd->file_size, hd->manifest_xxh3, hd->chunk_table_xxh3,
			       hd->data_length, hd->chunk_size, hd->chunk_count, hd->stored_length, piece_bytes,
			       sizeof(arena_wire_seg), sizeof(arena_hb4), ARENA_SLAB_ALIGN, l->n_blocks};
	key_feed(h, id, sizeof(id));
	for (size_t b = 0; b < l->n_blocks; b++) {
		const uint64_t place = od ? od[b] : ARENA_PLACE_DEVICE;
		key_u64(h, place);
		key_u64(h, l->blocks[b].offset);
		key_u64(h, l->blocks[b].bytes);
		const arena_wire *w = place == ARENA_PLACE_HOST && wplan ? wplan[b] : NULL;
		key_u64(h, w ? w->n : UINT64_MAX);
		key_u64(h, w ? w->cap : 0);
		for (size_t i = 0; w && i < w->n; i++) {
			const arena_wire_seg *g = &w->seg[i];
			const uint64_t f[] = {g->dst, g->raw, g->src, g->cap, g->chunk, g->coff, g->codec, (uint64_t)g->first};
			key_feed(h, f, sizeof(f));
		}
	}
	k->h[0] = arena_hash_digest(&h[0]);
	k->h[1] = arena_hash_digest(&h[1]);
	arena__image_share_id(hd, k->image);
}

/* The host blocks of a model that mapped a complete shared region are
 * there already: not read (the ranges only they want are skipped, as the
 * disk tier's are). */
static void drop_host_segs(loader *L)
{
	size_t k = 0;
	for (size_t i = 0; i < L->n_segs; i++) {
		const arena_block_mem *bm = &L->m->mem[L->segs[i].block];
		if (bm->dev)
			L->segs[k++] = L->segs[i];
	}
	L->disk |= k != L->n_segs;
	L->n_segs = k;
}

/* ---- the load ---------------------------------------------------------------- */

/* Coded streaming: each block's coded form where it saves bytes (NULL
 * entries elsewhere), made once (arena__load_place needs the sizes; the
 * model takes the forms of the blocks it holds on the host, the engine
 * those it reads from the image; arena__load_files_close frees the rest). */
int arena__load_wire_plans(loader *L, const arena_layout *l)
{
	if (L->wplan)
		return 0;
	if (!(L->wplan = arena_calloc(l->n_blocks ? l->n_blocks : 1, sizeof(*L->wplan))))
		return arena_errorf(ARENA_E_NOMEM, "out of memory");
	L->n_wplan = l->n_blocks;
	return arena_wire_plans(L->img, l, L->wplan, NULL);
}

int arena_load_image(const char *path, const arena_load_opts *o, arena_model **out, arena_load_stats *st)
{
	*out = NULL;
	double t0 = arena_now_s();
	loader L;
	arena__load_init(&L, o);
	arena_image *img = NULL;
	int rc = arena_img_open(path, &img);
	if (rc)
		return rc;
	if ((rc = arena_img_use_pieces(img, o->piece_bytes))) { /* the model's blocks are the pieces */
		arena_img_close(img);
		return rc;
	}
	L.img = img;
	if ((rc = arena__load_place(&L, img->layout))) {
		arena__load_files_close(&L);
		arena_img_close(img);
		return rc;
	}
	L.t_open = arena_now_s() - t0;
	L.t_mark = arena_now_s();
	const arena_img_header *h = &img->hdr;
	L.coded = !!(h->flags & ARENA_IMG_FLAG_CODED);
	int zstd = 0;
	for (uint64_t c = 0; c < h->chunk_count; c++) {
		L.hb4 |= img->chunks[c].codec == ARENA_CODEC_HB4;
		zstd |= img->chunks[c].codec == ARENA_CODEC_ZSTD;
	}
	/* Pieces of whole chunks (ARENA_LOAD_PIECE: another size, for measuring). */
	/* zstd: a cold load on the GPU machine's disk was 3-13 % faster with
	 * 64 MiB read in one than with 16 MiB read chunk by chunk, and 16 MiB read
	 * in one was 20-25 % slower (bench/RESULTS.md). */
	const uint64_t dflt = zstd ? ZSTD_PIECE : PIECE;
	uint64_t piece_bytes = dflt;
	const char *env = getenv("ARENA_LOAD_PIECE");
	if (env && (arena_size_parse(env, &piece_bytes) || !piece_bytes)) {
		arena_error_clear();
		piece_bytes = dflt;
	}
	uint64_t per = piece_bytes / h->chunk_size ? piece_bytes / h->chunk_size : 1;
	L.per = per;
	L.n_pieces = (size_t)((h->chunk_count + per - 1) / per);
	L.files = arena_calloc(1, sizeof(*L.files));
	L.segs = arena_calloc(img->layout->n_blocks, sizeof(*L.segs));
	L.pieces = arena_calloc(L.n_pieces ? L.n_pieces : 1, sizeof(*L.pieces));
	if (!L.files || !L.segs || !L.pieces) {
		rc = arena_errorf(ARENA_E_NOMEM, "out of memory");
		goto fail;
	}
	uint64_t need = 0, max_read = 0;
	for (size_t i = 0; i < L.n_pieces; i++) {
		uint64_t c0 = i * per, c1 = c0 + per < h->chunk_count ? c0 + per : h->chunk_count;
		uint64_t a = c0 * h->chunk_size, z = c1 * h->chunk_size < h->data_length ? c1 * h->chunk_size : h->data_length;
		if (L.coded) /* the stored bytes (arena__load_img_piece reads them chunk by chunk) */
			a = img->chunks[c0].offset,
			z = arena_align_up(img->chunks[c1 - 1].offset + img->chunks[c1 - 1].stored_length, DIRECT_ALIGN);
		L.pieces[i] = (piece){0, h->data_offset + a, z - a, c0};
		need += z - a;
		/* A zstd chunk is read whole outside the ring; its raw bytes go through it. */
		for (uint64_t c = c0; L.coded && c < c1; c++)
			if (img->chunks[c].codec == ARENA_CODEC_ZSTD)
				need += img->chunks[c].raw_length - arena_align_up(img->chunks[c].stored_length, DIRECT_ALIGN);
		max_read = z - a > max_read ? z - a : max_read;
	}
	if (L.coded && max_read > h->chunk_size) /* read a chunk at a time */
		max_read = h->chunk_size;
	/* The ring is sized (within the budget) before anything else is taken. */
	if ((rc = arena__load_ring_setup(&L, need, max_read, L.n_pieces)))
		goto fail;
	L.t_ring = arena_now_s() - L.t_mark;
	L.t_mark = arena_now_s();
	L.n_files = 1;
	L.files[0] = (lsrc){.path = img->path, .fd = img->fd, .size = h->file_size};
	if ((rc = arena__load_open_direct(&L.files[0], o->io)))
		goto fail;
	const arena_layout *lay = img->layout;
	for (size_t b = 0; b < lay->n_blocks; b++) { /* disk-tier blocks: not read here (checked when streamed) */
		if (L.placed && L.placed[b] == ARENA_PLACE_DISK)
			L.disk = 1;
		else if (lay->blocks[b].bytes)
			L.segs[L.n_segs++] = (seg){0, h->data_offset + lay->blocks[b].offset, lay->blocks[b].bytes, (uint32_t)b, 0};
	}
	/* The model takes the layout; the image keeps its chunk table for checks. */
	arena_layout *own = img->layout;
	const uint8_t *od = arena__load_on_device(&L);
	if (o->coded_stream && L.hb4 && o->backend->ops->decode_hb4 && od && (rc = arena__load_wire_plans(&L, own)))
		goto fail;
	img->layout = NULL;
	arena_share_key key;
	arena_share_check_stats cs = {0};
	if (o->share_host)
		share_key(img, own, od, L.wplan, o->piece_bytes, &key);
	arena_model *m; /* takes the host blocks' coded forms from the plans */
	if ((rc = arena_model_prepare_shared(own, o->backend, o->budget, od, L.wplan, o->share_host ? &key : NULL, &m)))
		goto fail;
	/* The disk tier of an hb4 image reads blocks coded too (engine), and a
	 * block that leaves the device later gets a coded host copy. */
	for (size_t b = 0; L.wplan && b < m->layout->n_blocks; b++)
		if (od[b] == ARENA_PLACE_DISK || od[b] == ARENA_PLACE_DEVICE) {
			m->mem[b].disk_wire = L.wplan[b];
			L.wplan[b] = NULL;
		}
	/* Chunk descriptions need the layout: lend the model's. */
	img->layout = m->layout;
	L.m = m;
	if (m->host_mapped) { /* another process's bytes: the image's, or not used */
		char why[ARENA_SHARE_WHY];
		int bad = arena__share_check(path, img, m, o->piece_bytes, why, &cs);
		m->share_check_s = cs.seconds;
		m->share_checked = cs.hashed + cs.compared;
		m->share_check_read = cs.read;
		if (bad && (rc = arena_model_unshare(m, why))) {
			arena_model_free(m);
			img->layout = NULL;
			goto fail;
		}
	}
	if (m->host_mapped)
		drop_host_segs(&L);
	rc = arena__load_run(&L, out, st, t0);
	img->layout = NULL;
	if (st) {
		st->share_check_s = cs.seconds;
		st->share_hashed = cs.hashed;
		st->share_compared = cs.compared;
		st->share_read = cs.read;
	}
	if (!rc && (rc = arena_model_share_publish(*out))) { /* whole, then the others may map it */
		arena_model_free(*out);
		*out = NULL;
	}
fail:
	arena__load_files_close(&L);
	arena_img_close(img);
	return rc;
}
