/* share_check.c - a mapped region's host copies checked against this
 * process's image before use (see share_check.h). */
#include "share_check.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../common/alloc.h"
#include "../common/clock.h"
#include "../common/err.h"
#include "../common/hash.h"
#include "../common/io.h"
#include "../formats/wire.h"
#include "reread.h"

/* Hashing a region is a core's work at memory speed: up to this many
 * threads share its chunks. */
enum { CHECK_THREADS = 8 };
/* Bytes of a slab read again and compared at a time. */
#define PART (64ull << 20)

/* Raw data bytes [a, z) of block b, held in the region at p. */
typedef struct span {
	uint64_t a, z;
	const uint8_t *p;
	uint32_t b;
} span;

typedef struct hash_job {
	const arena_image *img;
	const span *sp;
	size_t n_sp;
	const uint64_t *chunks; /* the plain chunks to hash */
	size_t n_chunks;
	atomic_size_t next;
	atomic_int bad;
	atomic_uint_fast64_t hashed, read;
	pthread_mutex_t mu;
	char msg[200]; /* the first difference */
} hash_job;

static int span_cmp(const void *x, const void *y)
{
	const span *a = x, *b = y;
	return a->a < b->a ? -1 : a->a > b->a;
}

/* The first span that ends after byte x. */
static size_t span_after(const span *sp, size_t n, uint64_t x)
{
	size_t lo = 0, hi = n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (sp[mid].z <= x)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* The first difference or failure: chunk c, and what of it. */
static void job_fail(hash_job *j, uint64_t c, const char *what)
{
	pthread_mutex_lock(&j->mu);
	if (!atomic_load(&j->bad))
		snprintf(j->msg, sizeof(j->msg), "chunk %llu of the image: %s", (unsigned long long)c, what);
	atomic_store(&j->bad, 1);
	pthread_mutex_unlock(&j->mu);
}

/* Each chunk: its raw bytes hashed in order, from the region where a slab
 * holds them and from the image elsewhere, against its checksum. */
static void *hash_chunks(void *arg)
{
	hash_job *j = arg;
	const arena_image *img = j->img;
	const uint64_t cs = img->hdr.chunk_size;
	uint8_t *buf = NULL;
	for (size_t k; !atomic_load(&j->bad) && (k = atomic_fetch_add(&j->next, 1)) < j->n_chunks;) {
		const uint64_t c = j->chunks[k];
		const arena_img_chunk *ch = &img->chunks[c];
		const uint64_t c0 = c * cs, c1 = c0 + ch->raw_length;
		arena_hash h;
		arena_hash_reset(&h);
		size_t i = span_after(j->sp, j->n_sp, c0);
		uint64_t x = c0, hashed = 0, read = 0;
		int failed = 0;
		while (x < c1 && !failed) {
			if (i < j->n_sp && j->sp[i].a <= x) {
				const uint64_t y = j->sp[i].z < c1 ? j->sp[i].z : c1;
				arena_hash_update(&h, j->sp[i].p + (x - j->sp[i].a), y - x);
				hashed += y - x;
				if (y == j->sp[i].z)
					i++;
				x = y;
				continue;
			}
			const uint64_t y = i < j->n_sp && j->sp[i].a < c1 ? j->sp[i].a : c1;
			if (!buf && !(buf = arena_malloc(cs))) {
				job_fail(j, c, "out of memory");
				failed = 1;
			} else if (arena_pread_full(img->fd, buf, y - x, img->hdr.data_offset + ch->offset + (x - c0),
						    img->path)) {
				job_fail(j, c, arena_last_error());
				arena_error_clear();
				failed = 1;
			} else {
				arena_hash_update(&h, buf, y - x);
				read += y - x;
				x = y;
			}
		}
		atomic_fetch_add(&j->hashed, hashed);
		atomic_fetch_add(&j->read, read);
		if (!failed && arena_hash_digest(&h) != ch->xxh3)
			job_fail(j, c, "the region's bytes do not have its checksum");
	}
	arena_free(buf);
	return NULL;
}

static unsigned threads_for(size_t n)
{
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	unsigned t = cpus > 0 && cpus < CHECK_THREADS ? (unsigned)cpus : CHECK_THREADS;
	return n < t ? (unsigned)n : t;
}

/* The plain chunks under the region's raw slabs, hashed. 0, or 1 with why. */
static int hash_plain(const arena_image *img, const span *sp, size_t n_sp, const uint64_t *chunks, size_t n_chunks,
		      char why[ARENA_SHARE_WHY], arena_share_check_stats *st)
{
	if (!n_chunks)
		return 0;
	hash_job j = {.img = img, .sp = sp, .n_sp = n_sp, .chunks = chunks, .n_chunks = n_chunks};
	atomic_init(&j.next, 0);
	atomic_init(&j.bad, 0);
	atomic_init(&j.hashed, 0);
	atomic_init(&j.read, 0);
	pthread_mutex_init(&j.mu, NULL);
	pthread_t tid[CHECK_THREADS];
	unsigned started = 0, n = threads_for(n_chunks);
	for (; started + 1 < n; started++) /* the caller is one of them */
		if (pthread_create(&tid[started], NULL, hash_chunks, &j))
			break;
	hash_chunks(&j);
	for (unsigned i = 0; i < started; i++)
		pthread_join(tid[i], NULL);
	pthread_mutex_destroy(&j.mu);
	st->hashed += atomic_load(&j.hashed);
	st->read += atomic_load(&j.read);
	if (!atomic_load(&j.bad))
		return 0;
	snprintf(why, ARENA_SHARE_WHY, "host share: the region's host copies are not the image's bytes (%s)", j.msg);
	return 1;
}

/* Stored bytes of the chunks raw data bytes [a, z) touch: what the slab
 * reader reads for them. */
static uint64_t stored_under(const arena_image *img, uint64_t a, uint64_t z)
{
	const uint64_t cs = img->hdr.chunk_size;
	uint64_t n = 0;
	for (uint64_t c = a / cs; c * cs < z && c < img->hdr.chunk_count; c++)
		n += img->chunks[c].stored_length;
	return n;
}

/* A coded copy's segments unfilled again (its buffer is the region's). */
static void unfill(arena_wire *w, uint8_t *region)
{
	w->buf = region;
	for (size_t i = 0; i < w->n; i++)
		w->seg[i].filled = 0;
	w->stored = w->max_stage = 0;
}

/* Whether segment i of w is a whole hb4 chunk of the image, a region of
 * its own: its stored bytes are then the chunk's stored bytes, as the
 * image holds them (arena_hb4_sub of a whole chunk is the chunk). */
static int whole_chunk(const arena_image *img, const arena_wire *w, size_t i)
{
	const arena_wire_seg *g = &w->seg[i];
	if (g->codec != ARENA_CODEC_HB4 || !g->first || g->coff || g->chunk >= img->hdr.chunk_count ||
	    arena_wire_region_end(w, i) != i + 1)
		return 0;
	const arena_img_chunk *ch = &img->chunks[g->chunk];
	return ch->codec == ARENA_CODEC_HB4 && g->raw == ch->raw_length && ch->stored_length <= g->cap;
}

/* Block b's coded copy in the region (w: this process's plan of it, its
 * buffer the region's; its segments unfilled): each whole hb4 chunk's
 * segment hashed in the region against the chunk's checksum (and its
 * structure checked as a reader checks it), the segments between them (a
 * chunk the block shares with the next, raw bytes) made again from the
 * image in scratch and compared. Equal: w's segments filled, pointing into
 * the region, 0. Else 1 with why (some of w's segments may be filled: the
 * caller unfills them). */
static int check_wire(arena_slab_reader *r, const arena_image *img, const arena_layout *l, uint32_t b, arena_wire *w,
		      uint8_t *scratch, arena_wire_seg *tmp, char why[ARENA_SHARE_WHY], arena_share_check_stats *st)
{
	uint8_t *region = w->buf;
	const char *name = l->blocks[b].name;
	for (size_t i = 0; i < w->n;) {
		arena_wire_seg *g = &w->seg[i];
		if (whole_chunk(img, w, i)) {
			const arena_img_chunk *ch = &img->chunks[g->chunk];
			const uint8_t *p = region + g->src;
			char what[96];
			snprintf(what, sizeof(what), "chunk %llu", (unsigned long long)g->chunk);
			st->hashed += ch->stored_length;
			if (arena_xxh3(p, ch->stored_length) != ch->xxh3) {
				snprintf(why, ARENA_SHARE_WHY,
					 "host share: block '%s': the region's coded chunk %llu does not have the image's checksum",
					 name, (unsigned long long)g->chunk);
				return 1;
			}
			if (arena_hb4_parse(p, ch->stored_length, ch->raw_length, what, &g->v)) {
				snprintf(why, ARENA_SHARE_WHY, "host share: block '%s': %s", name, arena_last_error());
				arena_error_clear();
				return 1;
			}
			g->filled = 1;
			i++;
			continue;
		}
		size_t j = i;
		while (j < w->n && (j == i || !whole_chunk(img, w, j)))
			j = arena_wire_region_end(w, j);
		const uint64_t base = g->src, at = g->dst, end = w->seg[j - 1].dst + w->seg[j - 1].raw;
		arena_wire sub;
		arena_wire_sub(w, i, j, tmp, scratch, &sub);
		memset(scratch, 0, sub.cap);
		if (arena_slab_reader_read_wire(r, b, at, end - at, &sub)) {
			snprintf(why, ARENA_SHARE_WHY, "host share: block '%s' could not be checked: %s", name,
				 arena_last_error());
			arena_error_clear();
			return 1;
		}
		st->read += stored_under(img, l->blocks[b].offset + at, l->blocks[b].offset + end);
		st->compared += sub.cap;
		if (memcmp(scratch, region + base, sub.cap)) {
			snprintf(why, ARENA_SHARE_WHY, "host share: block '%s': the region's coded copy is not the image's bytes",
				 name);
			return 1;
		}
		for (size_t k = 0; k < j - i; k++) { /* this process's own tables, pointing into the region */
			arena_wire_seg *d = &w->seg[i + k];
			*d = sub.seg[k];
			d->src += base;
			if (d->codec != ARENA_CODEC_HB4 || !d->filled)
				continue;
			const uint8_t **pp[4] = {&d->v.nib, &d->v.low, &d->v.exc_idx, &d->v.exc_hi};
			for (int q = 0; q < 4; q++)
				*pp[q] = region + base + (*pp[q] - scratch);
		}
		i = j;
	}
	if (arena_wire_seal(w, name)) {
		snprintf(why, ARENA_SHARE_WHY, "host share: %s", arena_last_error());
		arena_error_clear();
		return 1;
	}
	return 0;
}

/* A raw slab over coded chunks against the same bytes read from the image,
 * PART at a time, cut at chunk boundaries. 0, or 1 with why. */
static int check_slab(arena_slab_reader *r, const arena_image *img, const arena_layout *l, const span *s,
		      uint8_t *scratch, char why[ARENA_SHARE_WHY], arena_share_check_stats *st)
{
	const uint64_t cs = img->hdr.chunk_size, bytes = s->z - s->a;
	for (uint64_t at = 0; at < bytes;) {
		uint64_t end = (s->a + at + PART) / cs * cs - s->a;
		if (end <= at || end > bytes)
			end = at + PART < bytes ? at + PART : bytes;
		if (arena_slab_reader_read_part(r, s->b, at, end - at, scratch)) {
			snprintf(why, ARENA_SHARE_WHY, "host share: block '%s' could not be checked: %s", l->blocks[s->b].name,
				 arena_last_error());
			arena_error_clear();
			return 1;
		}
		st->read += stored_under(img, s->a + at, s->a + end);
		st->compared += end - at;
		if (memcmp(scratch, s->p + at, end - at)) {
			snprintf(why, ARENA_SHARE_WHY, "host share: block '%s': the region's bytes are not the image's",
				 l->blocks[s->b].name);
			return 1;
		}
		at = end;
	}
	return 0;
}

int arena__share_check(const char *path, const arena_image *img, arena_model *m, uint64_t piece_bytes,
		       char why[ARENA_SHARE_WHY], arena_share_check_stats *stp)
{
	arena_share_check_stats st = {0};
	const double t0 = arena_now_s();
	const arena_layout *l = m->layout;
	const uint64_t cs = img->hdr.chunk_size;
	int rc = 1;
	span *sp = arena_calloc(l->n_blocks ? l->n_blocks : 1, sizeof(*sp));
	uint8_t *coded = arena_calloc(l->n_blocks ? l->n_blocks : 1, 1); /* per span: over a coded chunk */
	uint8_t *plain = arena_calloc(img->hdr.chunk_count ? img->hdr.chunk_count : 1, 1);
	uint64_t *list = NULL;
	uint8_t *scratch = MAP_FAILED;
	uint64_t scratch_len = 0;
	arena_wire_seg *tmp = NULL; /* a run of a coded copy's segments, made again */
	size_t tmp_n = 0;
	arena_slab_reader *r = NULL;
	size_t n_sp = 0, n_list = 0;
	snprintf(why, ARENA_SHARE_WHY, "host share: out of memory to check the region");
	if (!sp || !coded || !plain)
		goto out;
	for (uint32_t b = 0; b < l->n_blocks; b++) {
		const arena_block_mem *bm = &m->mem[b];
		if (bm->own_host || !l->blocks[b].bytes)
			continue;
		if (bm->wire) {
			scratch_len = bm->wire->cap > scratch_len ? bm->wire->cap : scratch_len;
			tmp_n = bm->wire->n > tmp_n ? bm->wire->n : tmp_n;
		} else if (bm->host) {
			sp[n_sp++] = (span){l->blocks[b].offset, l->blocks[b].offset + l->blocks[b].bytes, bm->host, b};
		}
	}
	qsort(sp, n_sp, sizeof(*sp), span_cmp);
	for (size_t i = 0; i < n_sp; i++)
		for (uint64_t c = sp[i].a / cs; c * cs < sp[i].z && c < img->hdr.chunk_count; c++) {
			if (img->chunks[c].codec == ARENA_CODEC_NONE)
				n_list += !plain[c], plain[c] = 1;
			else
				coded[i] = 1;
		}
	if (!(list = arena_malloc((n_list ? n_list : 1) * sizeof(*list))))
		goto out;
	n_list = 0;
	for (uint64_t c = 0; c < img->hdr.chunk_count; c++)
		if (plain[c])
			list[n_list++] = c;
	if (hash_plain(img, sp, n_sp, list, n_list, why, &st))
		goto out;
	for (size_t i = 0; i < n_sp; i++)
		if (coded[i]) {
			const uint64_t len = sp[i].z - sp[i].a < PART + cs ? sp[i].z - sp[i].a : PART + cs;
			scratch_len = len > scratch_len ? len : scratch_len;
		}
	if (scratch_len) { /* coded chunks or coded copies: read again from the image */
		scratch = mmap(NULL, scratch_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (scratch == MAP_FAILED || (tmp_n && !(tmp = arena_calloc(tmp_n, sizeof(*tmp)))))
			goto out;
		if (arena_slab_reader_open_pieces(path, l, piece_bytes, &r)) {
			snprintf(why, ARENA_SHARE_WHY, "host share: the image could not be read to check the region: %s",
				 arena_last_error());
			arena_error_clear();
			goto out;
		}
		(void)arena_slab_reader_direct(r); /* nothing here is read twice: leave the page cache alone */
		for (size_t i = 0; i < n_sp; i++)
			if (coded[i] && check_slab(r, img, l, &sp[i], scratch, why, &st))
				goto out;
		for (uint32_t b = 0; b < l->n_blocks; b++) {
			arena_block_mem *bm = &m->mem[b];
			if (bm->wire && !bm->own_host && l->blocks[b].bytes && check_wire(r, img, l, b, bm->wire, scratch, tmp, why, &st))
				goto out;
		}
	}
	why[0] = 0;
	rc = 0;
out:
	for (uint32_t b = 0; rc && b < l->n_blocks; b++) /* given up: none of the region's tables is kept */
		if (m->mem[b].wire && !m->mem[b].own_host)
			unfill(m->mem[b].wire, m->mem[b].wire->buf);
	arena_slab_reader_close(r);
	arena_free(tmp);
	if (scratch != MAP_FAILED)
		munmap(scratch, scratch_len);
	arena_free(list);
	arena_free(plain);
	arena_free(coded);
	arena_free(sp);
	st.seconds = arena_now_s() - t0;
	if (stp)
		*stp = st;
	return rc;
}
