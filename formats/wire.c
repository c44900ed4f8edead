/* wire.c - a streamed block's bytes kept coded in host memory (see wire.h). */
#include "wire.h"

#include <stdlib.h>
#include <string.h>

#include "../common/alloc.h"
#include "../common/err.h"
#include "../common/units.h"

enum { WIRE_ALIGN = 256, WIRE_MIN_HB4 = 4096 };

uint64_t arena__wire_seg_max;
uint64_t arena__wire_stage_pool;

void arena_wire_env(void)
{
	const char *seg = getenv("ARENA_WIRE_SEGMENT"), *pool = getenv("ARENA_WIRE_POOL");
	uint64_t v;
	if (seg && arena_size_parse(seg, &v) == 0)
		arena__wire_seg_max = v;
	if (pool && arena_size_parse(pool, &v) == 0)
		arena__wire_stage_pool = v;
	arena_error_clear();
}

/* Exceptions of hb4 chunk k, from its lengths (its stored bytes beyond
 * the planes are 5 a exception). */
static uint64_t chunk_exceptions(const arena_img_chunk *k)
{
	return (k->stored_length - arena_hb4_stored_length(k->raw_length, 0)) / 5;
}

uint64_t arena_wire_stage_each(uint64_t most)
{
	uint64_t pool = arena__wire_stage_pool ? arena__wire_stage_pool : 64ull << 20;
	uint64_t each = arena_align_up(pool / ARENA_WIRE_STAGES, WIRE_ALIGN);
	return each > most ? each : arena_align_up(most, WIRE_ALIGN);
}

/* Append a segment (merging a plain one into a plain one it continues). */
static int add(arena_wire *w, size_t *room, unsigned codec, uint64_t dst, uint64_t raw, uint64_t chunk,
	       uint64_t coff, uint64_t cap)
{
	if (!raw)
		return 0;
	if (codec == ARENA_CODEC_NONE && w->n && w->seg[w->n - 1].codec == ARENA_CODEC_NONE &&
	    w->seg[w->n - 1].dst + w->seg[w->n - 1].raw == dst) {
		w->seg[w->n - 1].raw += raw;
		w->seg[w->n - 1].cap += raw;
		return 0;
	}
	if (w->n == *room) {
		size_t r = *room ? 2 * *room : 8;
		arena_wire_seg *s = arena_realloc(w->seg, r * sizeof(*s));
		if (!s)
			return arena_errorf(ARENA_E_NOMEM, "out of memory");
		w->seg = s;
		*room = r;
	}
	arena_wire_seg *s = &w->seg[w->n++];
	memset(s, 0, sizeof(*s));
	s->codec = codec;
	s->dst = dst;
	s->raw = raw;
	s->chunk = chunk;
	s->coff = coff;
	s->cap = cap;
	return 0;
}

int arena_wire_plan(const arena_img_chunk *chunks, uint64_t n_chunks, uint64_t chunk_size, uint64_t off,
		    uint64_t bytes, arena_wire **out)
{
	*out = NULL;
	if (!bytes || !chunk_size)
		return 0;
	arena_wire *w = arena_calloc(1, sizeof(*w));
	if (!w)
		return arena_errorf(ARENA_E_NOMEM, "out of memory");
	size_t room = 0;
	int rc = 0;
	const uint64_t end = off + bytes;
	for (uint64_t c = off / chunk_size; !rc && c < n_chunks && c * chunk_size < end; c++) {
		const arena_img_chunk *k = &chunks[c];
		const uint64_t c0 = c * chunk_size, c1 = c0 + k->raw_length;
		const uint64_t a = off > c0 ? off : c0, z = end < c1 ? end : c1;
		if (z <= a)
			continue;
		uint64_t ia = c0 + arena_align_up(a - c0, 4), iz = c0 + ((z - c0) & ~(uint64_t)1), cap = 0;
		const uint64_t E = k->codec == ARENA_CODEC_HB4 ? chunk_exceptions(k) : 0;
		if (k->codec == ARENA_CODEC_HB4 && iz > ia && iz - ia >= WIRE_MIN_HB4)
			cap = arena_hb4_sub_bound(ia - c0, iz - c0, E);
		if (cap && cap < iz - ia) {
			/* the part's segments share one region: room for each one's
			 * planes and, once, for every exception of the chunk */
			const uint64_t most = arena__wire_seg_max >= 4 ? arena__wire_seg_max / 4 * 4 : iz - ia;
			if ((rc = add(w, &room, ARENA_CODEC_NONE, a - off, ia - a, 0, 0, ia - a)))
				break;
			size_t first = w->n;
			uint64_t region = 5 * E;
			for (uint64_t x = ia; !rc && x < iz; x += most) {
				uint64_t y = iz - x < most ? iz : x + most;
				rc = add(w, &room, ARENA_CODEC_HB4, x - off, y - x, c, x - c0, 0);
				const uint64_t big = arena_hb4_sub_bound(x - c0, y - c0, E < (y - x) / 2 ? E : (y - x) / 2);
				w->most = big > w->most ? big : w->most;
				region += arena_align_up(arena_hb4_stored_length(y - x, 0), WIRE_ALIGN) + WIRE_ALIGN;
				w->n_hb4++;
			}
			if (rc)
				break;
			w->seg[first].cap = region;
			w->seg[first].first = 1;
			if ((rc = add(w, &room, ARENA_CODEC_NONE, iz - off, z - iz, 0, 0, z - iz)))
				break;
		} else if ((rc = add(w, &room, ARENA_CODEC_NONE, a - off, z - a, 0, 0, z - a))) {
			break;
		}
	}
	uint64_t at = 0;
	for (size_t i = 0; !rc && i < w->n; i++) {
		w->seg[i].src = at; /* an hb4 segment's own place is set when it is filled */
		at = arena_align_up(at + w->seg[i].cap, WIRE_ALIGN);
	}
	w->cap = at;
	if (rc || !w->n_hb4 || w->cap > bytes - bytes / 20) {
		arena_wire_free(w);
		return rc;
	}
	*out = w;
	return 0;
}

uint64_t arena_wire_stage_bound(const arena_img_chunk *chunks, uint64_t n_chunks)
{
	uint64_t most = 0;
	for (uint64_t c = 0; c < n_chunks; c++) {
		const arena_img_chunk *k = &chunks[c];
		if (k->codec != ARENA_CODEC_HB4)
			continue;
		const uint64_t E = chunk_exceptions(k);
		uint64_t raw = arena__wire_seg_max >= 4 && arena__wire_seg_max / 4 * 4 < k->raw_length
				       ? arena__wire_seg_max / 4 * 4
				       : k->raw_length;
		uint64_t b = arena_align_up(arena_hb4_sub_bound(0, raw, E < raw / 2 ? E : raw / 2), WIRE_ALIGN);
		most = b > most ? b : most;
	}
	return most ? ARENA_WIRE_STAGES * arena_wire_stage_each(most) : 0;
}

int arena_wire_plans(const arena_image *img, const arena_layout *l, arena_wire **plans, uint64_t *host_len)
{
	for (size_t b = 0; b < l->n_blocks; b++) {
		arena_wire *w = NULL;
		int rc = arena_wire_plan(img->chunks, img->hdr.chunk_count, img->hdr.chunk_size, l->blocks[b].offset,
					 l->blocks[b].bytes, &w);
		if (rc)
			return rc;
		if (host_len)
			host_len[b] = w ? w->cap : l->blocks[b].bytes;
		if (plans)
			plans[b] = w;
		else
			arena_wire_free(w);
	}
	return 0;
}

void arena_wire_free(arena_wire *w)
{
	if (!w)
		return;
	arena_free(w->seg);
	arena_free(w);
}

size_t arena_wire_find(const arena_wire *w, uint64_t d)
{
	size_t lo = 0, hi = w->n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (w->seg[mid].dst + w->seg[mid].raw <= d)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

void arena_wire_put(arena_wire *w, uint64_t x, uint64_t y, const arena_img_dec *dec, unsigned codec, int64_t cb,
		    const uint8_t *raw)
{
	for (size_t i = arena_wire_find(w, x); i < w->n && w->seg[i].dst < y; i++) {
		arena_wire_seg *g = &w->seg[i];
		const uint64_t u = g->dst > x ? g->dst : x, v = g->dst + g->raw < y ? g->dst + g->raw : y;
		uint8_t *out = w->buf + g->src;
		if (g->codec == ARENA_CODEC_HB4)
			arena_wire_fill_hb4(w, i, &dec->hb4);
		else if (raw)
			memcpy(out + (u - g->dst), raw + (u - x), v - u);
		else
			arena_img_dec_raw(dec, codec, (uint64_t)((int64_t)u - cb), (uint64_t)((int64_t)v - cb),
					  out + (u - g->dst));
	}
}

size_t arena_wire_region_end(const arena_wire *w, size_t i)
{
	size_t j = i + 1;
	while (j < w->n && w->seg[j].codec == ARENA_CODEC_HB4 && !w->seg[j].first)
		j++;
	return j;
}

uint64_t arena_wire_room(const arena_wire *w, size_t i, size_t j)
{
	return (j < w->n ? w->seg[j].src : w->cap) - w->seg[i].src;
}

uint64_t arena_wire_region_most(const arena_wire *w)
{
	uint64_t most = 0;
	for (size_t i = 0; w && i < w->n;) {
		const size_t j = arena_wire_region_end(w, i);
		most = arena_wire_room(w, i, j) > most ? arena_wire_room(w, i, j) : most;
		i = j;
	}
	return most;
}

void arena_wire_sub(const arena_wire *plan, size_t i, size_t j, arena_wire_seg *seg, uint8_t *buf, arena_wire *out)
{
	const uint64_t base = plan->seg[i].src;
	uint64_t hb4 = 0;
	memcpy(seg, plan->seg + i, (j - i) * sizeof(*seg));
	for (size_t k = 0; k < j - i; k++) {
		seg[k].filled = 0;
		seg[k].src -= base;
		hb4 += seg[k].codec == ARENA_CODEC_HB4;
	}
	*out = (arena_wire){.seg = seg, .n = j - i, .buf = buf, .cap = arena_wire_room(plan, i, j), .n_hb4 = hb4,
			    .most = plan->most};
}

uint64_t arena_wire_seg_stored(const arena_wire_seg *s)
{
	return s->codec == ARENA_CODEC_HB4 ? s->v.hi_off + s->v.n_exc : s->raw;
}

uint64_t arena_wire_fill_hb4(arena_wire *w, size_t i, const arena_hb4 *v)
{
	arena_wire_seg *g = &w->seg[i];
	if (!g->first) { /* after the segment before it in the region */
		const arena_wire_seg *p = &w->seg[i - 1];
		g->src = arena_align_up(p->src + arena_wire_seg_stored(p), WIRE_ALIGN);
	}
	uint64_t n = arena_hb4_sub(v, g->coff, g->coff + g->raw, w->buf + g->src, &g->v);
	g->filled = 1;
	return n;
}

int arena_wire_seal(arena_wire *w, const char *block)
{
	w->stored = 0;
	w->max_stage = 0;
	for (size_t i = 0; i < w->n; i++) {
		const arena_wire_seg *s = &w->seg[i];
		if (s->codec == ARENA_CODEC_HB4 && !s->filled)
			return arena_errorf(ARENA_E_INTERNAL, "block '%s': coded segment %zu (chunk %llu) was never filled",
					    block, i, (unsigned long long)s->chunk);
		w->stored += arena_wire_seg_stored(s);
		if (s->codec == ARENA_CODEC_HB4 && arena_wire_seg_stored(s) > w->max_stage)
			w->max_stage = arena_wire_seg_stored(s);
	}
	return 0;
}

void arena_wire_decode(const arena_wire *w, uint64_t a, uint64_t z, uint8_t *dst)
{
	for (size_t i = arena_wire_find(w, a); i < w->n && w->seg[i].dst < z; i++) {
		const arena_wire_seg *s = &w->seg[i];
		const uint64_t x = s->dst > a ? s->dst : a, y = s->dst + s->raw < z ? s->dst + s->raw : z;
		if (s->codec == ARENA_CODEC_NONE) {
			memcpy(dst + (x - a), w->buf + s->src + (x - s->dst), y - x);
			continue;
		}
		/* hb4 decodes whole words: an odd byte at either end comes from its word */
		uint64_t lo = x - s->dst, hi = y - s->dst; /* in the segment */
		uint8_t word[2];
		if (lo % 2) {
			arena_hb4_decode(&s->v, lo - 1, lo + 1, word);
			dst[s->dst + lo - a] = word[1];
			lo++;
		}
		if (hi % 2 && hi > lo) {
			arena_hb4_decode(&s->v, hi - 1, hi + 1, word);
			dst[s->dst + hi - 1 - a] = word[0];
			hi--;
		}
		if (lo < hi)
			arena_hb4_decode(&s->v, lo, hi, dst + (s->dst + lo - a));
	}
}
