/* load.c - the reader pipeline that fills a model from a file (see load.h). */
#include "load.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include "../common/alloc.h"
#include "../common/clock.h"
#include "../common/err.h"
#include "../common/firsterr.h"
#include "../common/hash.h"
#include "../common/io.h"
#include "../common/units.h"
#include "../formats/codec.h"
#include "../formats/image.h"
#include "../formats/wire.h"
#include "quant_select.h"

#define DIRECT_ALIGN 4096u
#define DEFAULT_SLOT (1u << 20)  /* a read: hashed while in cache, copied while in the LLC */
#define DEFAULT_SPT 4u
#define PIECE (16u << 20)        /* a unit of work (whole chunks for images) */
#define ZSTD_PIECE (64u << 20)   /* zstd images: a piece of stored chunks, read in one read */

typedef struct lsrc {
	const char *path; /* borrowed */
	int fd, dfd;      /* buffered; O_DIRECT or -1 */
	void *map;        /* with dfd under ARENA_IO_AUTO: the file mapped, to ask the page cache (mincore) */
	uint64_t size;
	int own_fd;
} lsrc;

/* Bytes of a file that belong at (block, dst) in a slab. */
typedef struct seg {
	uint32_t file;
	uint64_t foff, len;
	uint32_t block;
	uint64_t dst;
} seg;

typedef struct piece {
	uint32_t file;
	uint64_t off, len; /* the file range read */
	uint64_t chunk0;   /* image: first chunk; pieces hold whole chunks */
} piece;

/* A byte range of a quantized component, made by loader/quant from the mapped source. */
typedef struct qpiece {
	uint32_t tensor, comp;
	uint64_t off, len;
} qpiece;

typedef struct loader {
	const arena_load_opts *o;
	uint8_t *placed; /* o->place's choice of on_device, or NULL */
	arena_wire **wplan; /* coded streaming: each block's coded form (NULL: not worth it), or NULL */
	size_t n_wplan;
	arena_quant_state *qs; /* safetensors with a quant scheme, else NULL */
	qpiece *qp;
	size_t n_qp;
	arena_model *m;
	const arena_image *img; /* NULL for safetensors */
	int coded;              /* img holds coded chunks: read and decoded chunk by chunk */
	int hb4;                /* and some are hb4 (a device stage is worth having) */
	int disk;               /* image: some blocks stay in it (the disk tier), unread here */
	uint64_t per;           /* image: chunks a piece */
	lsrc *files;
	size_t n_files;
	seg *segs;
	size_t n_segs;
	piece *pieces;
	size_t n_pieces;
	uint8_t *ring;
	uint64_t ring_len, slot;
	unsigned spt, threads;
	uint64_t ask_slot, ring_need; /* the slot asked for; bytes through the ring */
	unsigned ask_spt, ask_threads, ring_lowered;
	int ring_pinned;     /* the ring's bytes are taken from the pinned budget */
	int ring_pinned_all; /* and every worker's share was registered */
	double t_open, t_ring, t_prepare, t_populate, t_commit, t_mark;
	atomic_size_t next;
	arena_first_error err;
	atomic_uint_fast64_t file_bytes, direct_bytes, gpu_decoded, cpu_decoded;
	atomic_uint_fast64_t prog_done; /* o->progress: bytes of the pieces done, of prog_total */
	uint64_t prog_total;
} loader;

typedef struct worker {
	loader *L;
	unsigned id;
	unsigned k;       /* slots used so far */
	int registered;   /* its ring share was pinned (and is unpinned as it exits) */
	arena_stream *s;
	arena_event **ev;
	uint8_t *stage; /* coded images: a device chunk the stored bytes stream into, or NULL */
	uint8_t *whole; /* coded images: a stored chunk read whole (CPU decode) */
	uint8_t *span;  /* zstd images: a piece's stored chunks read in one */
	uint64_t span_cap;
	arena_img_dec dec; /* and its parse or decoded streams */
	double t_ring, t_wait, t_read, t_decode, t_all; /* where its time went (load stats) */
} worker;

static void fail(loader *L, int rc)
{
	arena_first_error_set(&L->err, rc);
}

/* ---- reading -------------------------------------------------------------- */

/* Read [off, off+n) of f into buf with fd; short only at end of file. Returns
 * bytes read (>= 0) or a negative error. */
static int64_t read_some(const lsrc *f, int fd, uint8_t *buf, uint64_t n, uint64_t off)
{
	uint64_t want = off >= f->size ? 0 : (f->size - off < n ? f->size - off : n);
	uint64_t got = 0;
	while (got < want) {
		ssize_t r = arena__read_fault() ? (errno = EIO, -1) : pread(fd, buf + got, (size_t)(n - got), (off_t)(off + got));
		if (r < 0) {
			if (errno == EINTR)
				continue;
			return arena_syserrorf(ARENA_E_IO, errno, "%s: read failed at byte %" PRIu64, f->path, off + got);
		}
		if (r == 0)
			return arena_errorf(ARENA_E_IO, "%s: unexpected end of file at byte %" PRIu64 " (file changed?)",
					    f->path, off + got);
		got += (uint64_t)r;
	}
	return (int64_t)(got > want ? want : got);
}

/* ---- scatter: slot bytes to device or host slabs --------------------------- */

/* Bytes [a, z) of p's file are at buf: send each part to its slab. */
static int scatter(loader *L, worker *w, const piece *p, const uint8_t *buf, uint64_t a, uint64_t z)
{
	const uint64_t a0 = a;
	/* First seg of this file ending after a. */
	size_t lo = 0, hi = L->n_segs;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		const seg *s = &L->segs[mid];
		if (s->file < p->file || (s->file == p->file && s->foff + s->len <= a))
			lo = mid + 1;
		else
			hi = mid;
	}
	arena_backend *be = L->m->backend;
	for (size_t k = lo; k < L->n_segs && L->segs[k].file == p->file && L->segs[k].foff < z; k++) {
		const seg *s = &L->segs[k];
		uint64_t x = s->foff > a ? s->foff : a, y = s->foff + s->len < z ? s->foff + s->len : z;
		if (y <= x)
			continue;
		const arena_block_mem *bm = &L->m->mem[s->block];
		const uint8_t *src = buf + (x - a0);
		uint64_t d = s->dst + (x - s->foff);
		if (bm->dev) {
			int rc = be->ops->copy_h2d(be, (uint8_t *)bm->dev + d, src, y - x, w->s);
			if (rc)
				return rc;
		} else if (bm->wire) {
			arena_wire_put(bm->wire, d, d + (y - x), NULL, 0, 0, src);
		} else {
			memcpy(bm->host + d, src, y - x);
		}
	}
	return 0;
}

/* ---- one piece --------------------------------------------------------------- */

typedef struct hasher {
	arena_hash st;
	uint64_t chunk;   /* current chunk index */
	uint64_t in_chunk;
	uint64_t pad_bad; /* the chunk's first raw padding byte that is not zero, or UINT64_MAX */
} hasher;

/* Feed file bytes [a, z) (in order, at buf) of a plain image to the chunk
 * checks: each chunk's checksum, then its raw padding (looked at while the
 * bytes are cached). A chunk is checked when its last byte has been fed; its
 * bytes may already be on their way to the device: a bad chunk fails the
 * load, and nothing is committed. */
static int check(loader *L, const uint8_t *buf, hasher *h, uint64_t a, uint64_t z)
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

/* The worker's next ring slot, once the copies from its last use are done. */
static int next_slot(loader *L, worker *w, uint8_t **buf, unsigned *si)
{
	*si = w->k++ % L->spt;
	*buf = L->ring + ((uint64_t)w->id * L->spt + *si) * L->slot;
	double t = arena_now_s();
	int rc = L->m->backend->ops->event_sync(L->m->backend, w->ev[*si]);
	w->t_wait += arena_now_s() - t;
	return rc;
}

/* Read file bytes [off, off+n) into buf: from the page cache while they are
 * there, O_DIRECT from where they are not (*direct then stays set). */
static int read_range(loader *L, worker *w, const lsrc *f, uint8_t *buf, uint64_t n, uint64_t off, int *direct)
{
	const int io = L->o->io;
	const double t0 = arena_now_s();
	uint64_t got = 0;
	while (got < n) {
		int64_t r;
		if (*direct) {
			r = read_some(f, f->dfd, buf + got, arena_align_up(n - got, DIRECT_ALIGN), off + got);
			if (r >= 0)
				atomic_fetch_add(&L->direct_bytes, (uint64_t)r);
		} else {
			/* AUTO: what the page cache holds from it, the rest (of the
			 * piece) O_DIRECT. Asking the mapping costs no I/O; a read
			 * with RWF_NOWAIT would start read-ahead of what is not
			 * there, and the disk would read those bytes twice. */
			uint64_t want = n - got;
			if (io == ARENA_IO_AUTO && f->map && !((off + got) % DIRECT_ALIGN)) {
				uint64_t c = arena_cached_prefix(f->map, off + got, want);
				if (c < want) {
					want = c & ~(uint64_t)(DIRECT_ALIGN - 1);
					if (!want) {
						*direct = 1; /* not all in the page cache: the rest goes O_DIRECT */
						continue;
					}
				}
			}
			r = read_some(f, f->fd, buf + got, want, off + got);
		}
		if (r < 0)
			return (int)r;
		if (r == 0 && !*direct)
			return arena_errorf(ARENA_E_IO, "%s: no progress reading at byte %" PRIu64, f->path, off + got);
		got += (uint64_t)r;
	}
	w->t_read += arena_now_s() - t0;
	return 0;
}

static int unwanted(const loader *L, uint64_t a, uint64_t z);

/* Read a piece slot by slot: each slot's bytes are read (from the page cache
 * when they are there, O_DIRECT when not), checked while still in cache,
 * copied on, and the slot's event recorded. */
static int do_piece(loader *L, worker *w, const piece *p)
{
	if (L->img && unwanted(L, p->off, p->off + p->len))
		return 0;
	const lsrc *f = &L->files[p->file];
	arena_backend *be = L->m->backend;
	int direct = L->o->io == ARENA_IO_DIRECT && f->dfd >= 0;
	hasher h;
	arena_hash_reset(&h.st);
	h.chunk = p->chunk0;
	h.in_chunk = 0;
	h.pad_bad = UINT64_MAX;
	uint64_t pos = 0, end = p->off + p->len > f->size ? f->size - p->off : p->len;
	while (pos < end) {
		uint8_t *buf;
		unsigned si;
		int rc = next_slot(L, w, &buf, &si);
		if (rc)
			return rc;
		uint64_t n = end - pos < L->slot ? end - pos : L->slot;
		if ((rc = read_range(L, w, f, buf, n, p->off + pos, &direct)))
			return rc;
		uint64_t a = p->off + pos;
		atomic_fetch_add(&L->file_bytes, n);
		if ((L->img && (rc = check(L, buf, &h, a, a + n))) || (rc = scatter(L, w, p, buf, a, a + n)) ||
		    (rc = be->ops->event_record(be, w->ev[si], w->s)))
			return rc;
		pos += n;
	}
	return 0;
}

/* ---- coded images ------------------------------------------------------------ */

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
static int unwanted(const loader *L, uint64_t a, uint64_t z)
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
		if ((rc = read_range(L, w, &L->files[0], w->whole, n, off, direct)))
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
			if ((rc = next_slot(L, w, &buf, &si)))
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
		if ((rc = next_slot(L, w, &buf, &si)))
			return rc;
		uint64_t m = n - pos < L->slot ? n - pos : L->slot;
		uint64_t valid = pos < ck->stored_length ? (ck->stored_length - pos < m ? ck->stored_length - pos : m) : 0;
		if ((rc = read_range(L, w, &L->files[0], buf, m, off + pos, direct)))
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
			rc = scatter(L, w, p, buf, a + pos, a + pos + valid);
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
static int do_cpiece(loader *L, worker *w, const piece *p)
{
	const arena_img_header *h = &L->img->hdr;
	int direct = L->o->io == ARENA_IO_DIRECT && L->files[0].dfd >= 0;
	uint64_t c1 = p->chunk0 + L->per < h->chunk_count ? p->chunk0 + L->per : h->chunk_count;
	if (unwanted(L, h->data_offset + p->chunk0 * h->chunk_size, h->data_offset + c1 * h->chunk_size))
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
		int rc = read_range(L, w, &L->files[0], w->span, p->len, p->off, &direct);
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

/* A range of a quantized component: converted from the mapped source
 * straight into its host slab, or into a ring slot and on to the device. */
static int do_qpiece(loader *L, worker *w, const qpiece *q)
{
	const arena_layout *l = L->m->layout;
	const arena_tensor *t = &l->tensors[q->tensor];
	const arena_block_mem *bm = &L->m->mem[t->block];
	uint64_t at = t->comp[q->comp].offset + q->off;
	if (!bm->dev)
		return arena_quant_state_fill(L->qs, l, t, q->comp, q->off, q->len, bm->host + at);
	uint8_t *buf;
	unsigned si;
	arena_backend *be = L->m->backend;
	int rc = next_slot(L, w, &buf, &si);
	if (!rc)
		rc = arena_quant_state_fill(L->qs, l, t, q->comp, q->off, q->len, buf);
	if (!rc)
		rc = be->ops->copy_h2d(be, (uint8_t *)bm->dev + at, buf, q->len, w->s);
	if (!rc)
		rc = be->ops->event_record(be, w->ev[si], w->s);
	return rc;
}

/* Fault in and pin this worker's share of the ring (workers do it at once:
 * the page clearing runs in parallel, registration overlaps others' reads). */
static void worker_ring(loader *L, worker *w)
{
	uint64_t len = (uint64_t)L->spt * L->slot;
	uint8_t *mine = L->ring + (uint64_t)w->id * len;
#ifdef MADV_POPULATE_WRITE
	if (madvise(mine, len, MADV_POPULATE_WRITE))
#endif
		memset(mine, 0, len);
	if (L->ring_pinned) {
		arena_backend *be = L->o->backend;
		if (be->ops->host_register(be, mine, len) == 0)
			w->registered = 1;
		else
			arena_error_clear(); /* pageable: slower copies, still correct */
	}
}

static void *worker_main(void *arg)
{
	worker *w = arg;
	loader *L = w->L;
	arena_backend *be = L->m->backend;
	const double t0 = arena_now_s();
	worker_ring(L, w);
	w->t_ring = arena_now_s() - t0;
	while (!arena_first_error_get(&L->err)) {
		if (L->o->cancel && *L->o->cancel) {
			arena_errorf(ARENA_E_CANCELLED, "load cancelled");
			fail(L, ARENA_E_CANCELLED);
			break;
		}
		size_t i = atomic_fetch_add(&L->next, 1);
		if (i >= L->n_pieces + L->n_qp)
			break;
		int rc = i >= L->n_pieces ? do_qpiece(L, w, &L->qp[i - L->n_pieces])
			 : L->coded      ? do_cpiece(L, w, &L->pieces[i])
					 : do_piece(L, w, &L->pieces[i]);
		if (rc) {
			fail(L, rc);
			break;
		}
		if (L->o->progress) {
			uint64_t n = i >= L->n_pieces ? L->qp[i - L->n_pieces].len : L->pieces[i].len;
			L->o->progress(L->o->progress_ctx, atomic_fetch_add(&L->prog_done, n) + n, L->prog_total);
		}
	}
	/* Copies may still read the ring: wait for them whatever happened. */
	int rc = be->ops->stream_sync(be, w->s);
	if (rc)
		fail(L, rc);
	if (w->registered)
		be->ops->host_unregister(be, L->ring + (uint64_t)w->id * L->spt * L->slot);
	w->t_all = arena_now_s() - t0;
	return NULL;
}

/* ---- setup ------------------------------------------------------------------- */

static unsigned cpus(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	return n < 1 ? 1 : n > 32 ? 32 : (unsigned)n;
}

/* Size the ring (see load.h): no larger than the bytes that go through it
 * (`need`; a slot no larger than the largest read, `max_read`; no more slots
 * than reads fill, no more threads than slots or than `units` of work), then
 * within the pinned budget; a budget too small for even the smallest ring
 * leaves it pageable. */
static int ring_setup(loader *L, uint64_t need, uint64_t max_read, uint64_t units)
{
	arena_pin_budget *b = L->o->budget;
	L->ask_slot = L->slot, L->ask_spt = L->spt, L->ask_threads = L->threads;
	L->ring_need = need;
	uint64_t slot = L->slot;
	unsigned spt = L->spt, thr = L->threads;
	const uint64_t most = arena_align_up(max_read ? max_read : 1, DIRECT_ALIGN);
	if (slot > most)
		slot = most;
	uint64_t reads = need ? (need + slot - 1) / slot : 1;
	if (thr > reads)
		thr = (unsigned)reads;
	if (thr > units)
		thr = units ? (unsigned)units : 1;
	if (spt > (reads + thr - 1) / thr)
		spt = (unsigned)((reads + thr - 1) / thr);
	/* Slots more than the bytes fill: share the bytes out evenly. */
	uint64_t even = arena_align_up((need + (uint64_t)thr * spt - 1) / ((uint64_t)thr * spt), DIRECT_ALIGN);
	if (even < slot)
		slot = even ? even : DIRECT_ALIGN;
	if (slot != L->slot || spt != L->spt || thr != L->threads)
		L->ring_lowered |= ARENA_RING_BY_BYTES;
	const uint64_t full_slot = slot;
	const unsigned full_spt = spt, full_thr = thr;
	for (;;) {
		uint64_t total = (uint64_t)thr * spt * slot;
		if (!arena_pin_budget_take(b, total)) {
			L->ring_pinned = 1;
			break;
		}
		if (spt > 2)
			spt--;
		else if (slot / 2 >= (64u << 10))
			slot = slot / 2 / DIRECT_ALIGN * DIRECT_ALIGN;
		else if (thr > 1)
			thr = thr / 2;
		else {
			slot = full_slot, spt = full_spt, thr = full_thr; /* pageable, as large as it is useful */
			break;
		}
	}
	arena_error_clear();
	if (slot != full_slot || spt != full_spt || thr != full_thr)
		L->ring_lowered |= ARENA_RING_BY_BUDGET;
	L->slot = slot, L->spt = spt, L->threads = thr;
	L->ring_len = (uint64_t)thr * spt * slot;
	/* Mapped here; each worker faults in and pins its own share. */
	void *p = mmap(NULL, L->ring_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		if (L->ring_pinned)
			arena_pin_budget_give(b, L->ring_len);
		L->ring_pinned = 0;
		return arena_syserrorf(ARENA_E_NOMEM, errno, "cannot map a %" PRIu64 "-byte read ring", L->ring_len);
	}
	madvise(p, L->ring_len, MADV_HUGEPAGE); /* fewer TLB misses for the readers' copies */
	L->ring = p;
	return 0;
}

static void ring_free(loader *L)
{
	if (!L->ring)
		return;
	if (L->ring_pinned)
		arena_pin_budget_give(L->o->budget, L->ring_len);
	munmap(L->ring, L->ring_len);
	L->ring = NULL;
}

static int open_direct(lsrc *f, int io)
{
	f->dfd = -1;
	f->map = NULL;
	if (io == ARENA_IO_BUFFERED)
		return 0;
	/* AUTO asks the page cache (f->map); where a second descriptor cannot
	 * be had, AUTO reads buffered and DIRECT fails */
	int rc = arena_open_direct(f->fd, f->path, f->size, io == ARENA_IO_AUTO, &f->dfd, &f->map);
	if (rc && io != ARENA_IO_DIRECT) {
		arena_error_clear();
		rc = 0;
	}
	return rc;
}

/* Coded images: each worker's device stage (one stored chunk), when some
 * block lives on the device. Where device memory is short (the model fills
 * it), a worker decodes on the CPU instead: slower, not a failure. */
static int stage_setup(loader *L, worker *w)
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

/* Run the pipeline over L's pieces; then commit or free the model. */
static int run(loader *L, arena_model **out, arena_load_stats *st, double t0)
{
	const arena_load_opts *o = L->o;
	arena_backend *be = L->m->backend;
	int rc = 0;
	worker *w = NULL;
	pthread_t *tid = NULL;
	unsigned started = 0;
	L->ring_pinned_all = 1;
	arena_first_error_init(&L->err);
	atomic_init(&L->next, 0);
	atomic_init(&L->file_bytes, 0);
	atomic_init(&L->direct_bytes, 0);
	atomic_init(&L->gpu_decoded, 0);
	atomic_init(&L->cpu_decoded, 0);
	atomic_init(&L->prog_done, 0);
	L->prog_total = 0;
	for (size_t i = 0; i < L->n_pieces; i++)
		L->prog_total += L->pieces[i].len;
	for (size_t i = 0; i < L->n_qp; i++)
		L->prog_total += L->qp[i].len;
	w = arena_calloc(L->threads, sizeof(*w));
	tid = arena_calloc(L->threads, sizeof(*tid));
	if (!w || !tid) {
		rc = arena_errorf(ARENA_E_NOMEM, "out of memory");
		goto out;
	}
	for (unsigned i = 0; i < L->threads; i++) {
		w[i].L = L;
		w[i].id = i;
		w[i].ev = arena_calloc(L->spt, sizeof(*w[i].ev));
		if (!w[i].ev) {
			rc = arena_errorf(ARENA_E_NOMEM, "out of memory");
			goto out;
		}
		if ((rc = be->ops->stream_create(be, &w[i].s)))
			goto out;
		for (unsigned k = 0; k < L->spt; k++)
			if ((rc = be->ops->event_create(be, &w[i].ev[k])))
				goto out;
	}
	if (L->coded && (rc = stage_setup(L, w)))
		goto out;
	L->t_prepare = arena_now_s() - L->t_mark;
	L->t_mark = arena_now_s();
	for (; started < L->threads; started++)
		if (pthread_create(&tid[started], NULL, worker_main, &w[started]))
			break;
	if (!started) {
		rc = arena_errorf(ARENA_E_NOMEM, "cannot start reader threads");
		goto out;
	}
	/* Threads that did not start: their pieces are taken by the others. */
	for (unsigned i = 0; i < started; i++)
		pthread_join(tid[i], NULL);
	if ((rc = arena_first_error_raise(&L->err)))
		goto out;
	if (o->cancel && *o->cancel) {
		rc = arena_errorf(ARENA_E_CANCELLED, "load cancelled");
		goto out;
	}
	for (unsigned i = 0; i < started; i++)
		if (!w[i].registered)
			L->ring_pinned_all = 0;
	for (size_t b = 0; b < L->m->layout->n_blocks; b++)
		if (L->m->mem[b].wire && (rc = arena_wire_seal(L->m->mem[b].wire, L->m->layout->blocks[b].name)))
			goto out;
	L->t_populate = arena_now_s() - L->t_mark;
	L->t_mark = arena_now_s();
	rc = arena_model_commit(L->m);
	L->t_commit = arena_now_s() - L->t_mark;
out:;
	double wt[5] = {0}, decode = 0;
	for (unsigned i = 0; w && i < started; i++) {
		wt[4] += w[i].t_decode / started;
		decode += w[i].t_decode;
		wt[0] += w[i].t_all / started;
		wt[1] += w[i].t_ring / started;
		wt[2] += w[i].t_wait / started;
		wt[3] += w[i].t_read / started;
	}
	for (unsigned i = 0; w && i < L->threads; i++) {
		for (unsigned k = 0; w[i].ev && k < L->spt; k++)
			if (w[i].ev[k])
				be->ops->event_destroy(be, w[i].ev[k]);
		arena_free(w[i].ev);
		if (w[i].s)
			be->ops->stream_destroy(be, w[i].s);
		if (w[i].stage)
			be->ops->dev_free(be, w[i].stage);
		arena_img_dec_free(&w[i].dec);
		arena_free(w[i].whole);
		arena_free(w[i].span);
	}
	arena_free(w);
	arena_free(tid);
	arena_first_error_destroy(&L->err);
	if (st) {
		memset(st, 0, sizeof(*st));
		st->file_bytes = atomic_load(&L->file_bytes);
		st->direct_bytes = atomic_load(&L->direct_bytes);
		st->gpu_decoded = atomic_load(&L->gpu_decoded);
		st->cpu_decoded = atomic_load(&L->cpu_decoded);
		st->dev_bytes = L->m->dev_bytes;
		st->host_bytes = L->m->host_bytes;
		for (size_t b = 0; b < L->m->layout->n_blocks; b++)
			if (L->m->mem[b].wire) {
				st->wire_bytes += L->m->mem[b].wire->stored;
				st->wire_raw += L->m->layout->blocks[b].bytes;
			}
		st->ring_bytes = L->ring_len;
		st->ring_pinned = L->ring_pinned && L->ring_pinned_all;
		st->threads = L->threads;
		st->ring = (arena_ring_shape){L->threads, L->spt, L->slot};
		st->ring_asked = (arena_ring_shape){L->ask_threads, L->ask_spt, L->ask_slot};
		st->ring_need = L->ring_need;
		st->ring_lowered = L->ring_lowered;
		st->seconds = arena_now_s() - t0;
		st->t_open = L->t_open;
		st->t_ring = L->t_ring;
		st->t_prepare = L->t_prepare;
		st->t_populate = L->t_populate;
		st->t_commit = L->t_commit;
		st->w_all = wt[0], st->w_ring = wt[1], st->w_wait = wt[2], st->w_read = wt[3], st->w_decode = wt[4];
		st->cpu_decode_s = decode;
	}
	if (rc) {
		arena_model_free(L->m);
		L->m = NULL;
		return rc;
	}
	*out = L->m;
	return 0;
}

static void loader_init(loader *L, const arena_load_opts *o)
{
	memset(L, 0, sizeof(*L));
	L->o = o;
	L->threads = o->threads ? o->threads : cpus();
	L->spt = o->slots_per_thread ? o->slots_per_thread : DEFAULT_SPT;
	L->slot = arena_align_up(o->slot_bytes ? o->slot_bytes : DEFAULT_SLOT, DIRECT_ALIGN);
}

static int wire_plans(loader *L, const arena_layout *l);

/* Ask o->place (if any) where the blocks of l go, before anything is allocated. */
static int place(loader *L, const arena_layout *l)
{
	if (!L->o->place)
		return 0;
	if (!(L->placed = arena_calloc(l->n_blocks ? l->n_blocks : 1, 1)))
		return arena_errorf(ARENA_E_NOMEM, "out of memory");
	uint64_t stage = 0, *host_len = NULL;
	if (L->img && L->o->coded_stream && L->o->backend->ops->decode_hb4) {
		arena_wire_env();
		stage = arena_wire_stage_bound(L->img->chunks, L->img->hdr.chunk_count);
	}
	if (stage) { /* what a coded host copy would take */
		int rc = wire_plans(L, l);
		if (!rc && !(host_len = arena_calloc(l->n_blocks ? l->n_blocks : 1, sizeof(*host_len))))
			rc = arena_errorf(ARENA_E_NOMEM, "out of memory");
		if (rc)
			return rc;
		for (size_t b = 0; b < l->n_blocks; b++)
			host_len[b] = L->wplan[b] ? L->wplan[b]->cap : l->blocks[b].bytes;
	}
	int rc = L->o->place(L->o->place_ctx, l, stage, host_len, L->placed);
	arena_free(host_len);
	return rc;
}

static const uint8_t *on_device(const loader *L)
{
	return L->placed ? L->placed : L->o->on_device;
}

static void loader_files_close(loader *L)
{
	arena_free(L->placed);
	L->placed = NULL;
	for (size_t b = 0; L->wplan && b < L->n_wplan; b++)
		arena_wire_free(L->wplan[b]);
	arena_free(L->wplan);
	L->wplan = NULL;
	ring_free(L);
	for (size_t i = 0; L->files && i < L->n_files; i++) {
		if (L->files[i].dfd >= 0)
			close(L->files[i].dfd);
		if (L->files[i].map)
			munmap(L->files[i].map, L->files[i].size);
		if (L->files[i].own_fd && L->files[i].fd >= 0)
			close(L->files[i].fd);
	}
	arena_free(L->files);
	arena_free(L->segs);
	arena_free(L->pieces);
	arena_free(L->qp);
}

/* Coded streaming: each block's coded form where it saves bytes (NULL
 * entries elsewhere), made once (place() needs the sizes; the model takes
 * the forms of the blocks it holds on the host, the engine those it reads
 * from the image; loader_files_close frees the rest). */
static int wire_plans(loader *L, const arena_layout *l)
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
	loader_init(&L, o);
	arena_image *img = NULL;
	int rc = arena_img_open(path, &img);
	if (rc)
		return rc;
	if ((rc = arena_img_use_pieces(img, o->piece_bytes))) { /* the model's blocks are the pieces */
		arena_img_close(img);
		return rc;
	}
	L.img = img;
	if ((rc = place(&L, img->layout))) {
		loader_files_close(&L);
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
		if (L.coded) /* the stored bytes (do_cpiece reads them chunk by chunk) */
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
	if ((rc = ring_setup(&L, need, max_read, L.n_pieces)))
		goto fail;
	L.t_ring = arena_now_s() - L.t_mark;
	L.t_mark = arena_now_s();
	L.n_files = 1;
	L.files[0] = (lsrc){.path = img->path, .fd = img->fd, .size = h->file_size};
	if ((rc = open_direct(&L.files[0], o->io)))
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
	const uint8_t *od = on_device(&L);
	if (o->coded_stream && L.hb4 && o->backend->ops->decode_hb4 && od && (rc = wire_plans(&L, own)))
		goto fail;
	img->layout = NULL;
	arena_model *m; /* takes the host blocks' coded forms from the plans */
	if ((rc = arena_model_prepare_wire(own, o->backend, o->budget, od, L.wplan, &m)))
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
	rc = run(&L, out, st, t0);
	img->layout = NULL;
fail:
	loader_files_close(&L);
	arena_img_close(img);
	return rc;
}

static int cmp_seg(const void *a, const void *b)
{
	const seg *x = a, *y = b;
	if (x->file != y->file)
		return x->file < y->file ? -1 : 1;
	return x->foff < y->foff ? -1 : x->foff > y->foff;
}

/* File pieces over the bytes of plain tensors only (segs sorted), aligned for
 * O_DIRECT; neighbouring ranges closer than a piece are read as one. */
static int plan_pieces(loader *L)
{
	size_t cap = 16;
	L->pieces = arena_calloc(cap, sizeof(*L->pieces));
	if (!L->pieces)
		return arena_errorf(ARENA_E_NOMEM, "out of memory");
	for (size_t k = 0; k < L->n_segs;) {
		uint32_t f = L->segs[k].file;
		uint64_t a = L->segs[k].foff / DIRECT_ALIGN * DIRECT_ALIGN, z = L->segs[k].foff + L->segs[k].len;
		for (k++; k < L->n_segs && L->segs[k].file == f && L->segs[k].foff <= z + PIECE; k++)
			z = L->segs[k].foff + L->segs[k].len > z ? L->segs[k].foff + L->segs[k].len : z;
		for (uint64_t x = a; x < z; x += PIECE) {
			if (L->n_pieces == cap) {
				piece *np = arena_realloc(L->pieces, 2 * cap * sizeof(*np));
				if (!np)
					return arena_errorf(ARENA_E_NOMEM, "out of memory");
				L->pieces = np;
				cap *= 2;
			}
			uint64_t end = arena_align_up(x + PIECE < z ? x + PIECE : z, DIRECT_ALIGN);
			if (end > L->files[f].size)
				end = L->files[f].size;
			L->pieces[L->n_pieces++] = (piece){f, x, end - x, 0};
		}
	}
	return 0;
}

static int plan_qpieces(loader *L, const arena_layout *l)
{
	size_t n = 0;
	for (int pass = 0; pass < 2; pass++) {
		for (size_t i = 0; i < l->n_tensors; i++) {
			const arena_tensor *t = &l->tensors[i];
			if (!strcmp(t->scheme, "none"))
				continue;
			for (uint32_t c = 0; c < t->n_comp; c++)
				for (uint64_t off = 0; off < t->comp[c].bytes; off += L->slot, n++)
					if (pass)
						L->qp[n] = (qpiece){(uint32_t)i, c, off,
								    t->comp[c].bytes - off < L->slot ? t->comp[c].bytes - off
												     : L->slot};
		}
		if (!pass) {
			if (!n)
				return 0;
			L->qp = arena_calloc(n, sizeof(*L->qp));
			if (!L->qp)
				return arena_errorf(ARENA_E_NOMEM, "out of memory");
			L->n_qp = n;
			n = 0;
		}
	}
	return 0;
}

int arena_load_safetensors(const char *const *inputs, size_t n, const arena_plan_opts *plan,
			   const arena_load_opts *o, arena_model **out, arena_load_stats *st)
{
	*out = NULL;
	if (o->piece_bytes)
		return arena_errorf(ARENA_E_USAGE, "%s: pieces need an image (arena convert it first)", n ? inputs[0] : "");
	double t0 = arena_now_s();
	loader L;
	loader_init(&L, o);
	arena_ckpt *ck = NULL;
	arena_layout *lay = NULL;
	arena_quant_state qs = {0};
	arena_quant_ctx qc = {0};
	static const arena_plan_opts no_plan = {0};
	static const arena_quant_opts no_quant = {0};
	arena_plan_opts po = plan ? *plan : no_plan;
	int rc = arena_ckpt_open_many(inputs, n, &ck);
	if (rc)
		return rc;
	if ((rc = arena_quant_select_init(&qc, o->quant ? o->quant : &no_quant, &po)))
		goto fail;
	rc = arena_plan_build(ck, &po, &lay);
	if (!rc)
		rc = arena_quant_select_finish(&qc);
	if (rc || (rc = arena_quant_state_init(&qs, lay, ck)) || (rc = place(&L, lay)))
		goto fail;
	L.qs = &qs;
	L.t_open = arena_now_s() - t0;
	L.t_mark = arena_now_s();
	L.n_files = ck->n_files;
	L.files = arena_calloc(ck->n_files, sizeof(*L.files));
	L.segs = arena_calloc(lay->n_tensors, sizeof(*L.segs));
	if (!L.files || !L.segs) {
		rc = arena_errorf(ARENA_E_NOMEM, "out of memory");
		goto fail;
	}
	for (size_t i = 0; i < ck->n_files; i++) {
		const arena_st_file *f = ck->files[i];
		L.files[i] = (lsrc){.path = f->path, .fd = f->fd, .size = f->size, .dfd = -1};
		if ((rc = open_direct(&L.files[i], o->io)))
			goto fail;
	}
	for (size_t i = 0; i < lay->n_tensors; i++) {
		const arena_tensor *t = &lay->tensors[i];
		const arena_st_tensor *s = t->src;
		uint32_t fi = 0;
		while (ck->files[fi] != s->file)
			fi++;
		if (s->nbytes && !strcmp(t->scheme, "none"))
			L.segs[L.n_segs++] = (seg){fi, s->file->data_off + s->begin, s->nbytes, t->block, t->comp[0].offset};
	}
	qsort(L.segs, L.n_segs, sizeof(*L.segs), cmp_seg);
	if ((rc = plan_pieces(&L)))
		goto fail;
	/* Through the ring: the pieces read, and the quantized components
	 * (made in slot-sized pieces, which the ring's slot decides). */
	uint64_t need = 0, max_read = 0, qbytes = 0, qmax = 0;
	for (size_t i = 0; i < L.n_pieces; i++) {
		need += L.pieces[i].len;
		max_read = L.pieces[i].len > max_read ? L.pieces[i].len : max_read;
	}
	for (size_t i = 0; i < lay->n_tensors; i++)
		for (uint32_t c = 0; strcmp(lay->tensors[i].scheme, "none") && c < lay->tensors[i].n_comp; c++) {
			qbytes += lay->tensors[i].comp[c].bytes;
			qmax = lay->tensors[i].comp[c].bytes > qmax ? lay->tensors[i].comp[c].bytes : qmax;
		}
	max_read = qmax > max_read ? qmax : max_read;
	uint64_t qunits = 0, slot = L.slot < arena_align_up(max_read ? max_read : 1, DIRECT_ALIGN)
					   ? L.slot
					   : arena_align_up(max_read ? max_read : 1, DIRECT_ALIGN);
	for (size_t i = 0; i < lay->n_tensors; i++)
		for (uint32_t c = 0; strcmp(lay->tensors[i].scheme, "none") && c < lay->tensors[i].n_comp; c++)
			qunits += (lay->tensors[i].comp[c].bytes + slot - 1) / slot;
	if ((rc = ring_setup(&L, need + qbytes, max_read, L.n_pieces + qunits)))
		goto fail;
	L.t_ring = arena_now_s() - L.t_mark;
	L.t_mark = arena_now_s();
	if ((rc = plan_qpieces(&L, lay)))
		goto fail;
	arena_model *m;
	rc = arena_model_prepare(lay, o->backend, o->budget, on_device(&L), &m);
	lay = NULL;
	if (rc)
		goto fail;
	L.m = m;
	rc = run(&L, out, st, t0);
	if (!rc)
		for (size_t i = 0; i < m->layout->n_tensors; i++)
			m->layout->tensors[i].src = NULL; /* the checkpoint closes now */
fail:
	loader_files_close(&L);
	arena_quant_state_free(&qs);
	arena_quant_select_free(&qc);
	arena_layout_free(lay);
	arena_ckpt_close(ck);
	return rc;
}
