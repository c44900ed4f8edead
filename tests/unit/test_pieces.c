/* test_pieces.c - blocks split into pieces (arena_layout_pieces): pieces
 * tile their block's slab, start where tensors start, stay within the piece
 * size unless one tensor is larger; every tensor keeps its bytes' place in
 * the data region; globals and blocks no larger than a piece stay as they
 * are. On the tiny Flux fixture and on a quantized layout (components of a
 * tensor apart). */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "../../common/alloc.h"
#include "../../common/err.h"
#include "../../engine/engine.h"
#include "../../formats/image.h"
#include "../../formats/layout.h"
#include "../../loader/convert.h"
#include "testutil.h"

static char dir[256];

static arena_image *image_of(const char *fixture, const char *quant)
{
	const char *in = fixture_path(fixture);
	const char *out = tmpdir_file(dir, quant ? "q.arena" : "p.arena");
	arena_convert_opts co = {.chunk_size = 64 << 10, .threads = 1, .quant = {.scheme = quant}};
	cr_assert_eq(arena_convert_inputs(&in, 1, out, &co, NULL), 0, "%s", arena_last_error());
	arena_image *img;
	cr_assert_eq(arena_img_open(out, &img), 0, "%s", arena_last_error());
	return img;
}

/* The span of tensor t's components, [lo, hi) within its block. */
static int same_module(const char *a, const char *b)
{
	const char *da = strrchr(a, '.'), *db = strrchr(b, '.');
	return da && db && da - a == db - b && !strncmp(a, b, (size_t)(da - a));
}

static void span(const arena_tensor *t, uint64_t *lo, uint64_t *hi)
{
	*lo = UINT64_MAX;
	*hi = 0;
	for (uint32_t c = 0; c < t->n_comp; c++) {
		*lo = t->comp[c].offset < *lo ? t->comp[c].offset : *lo;
		*hi = t->comp[c].offset + t->comp[c].bytes > *hi ? t->comp[c].offset + t->comp[c].bytes : *hi;
	}
}

static void check_pieces(const arena_layout *l, uint64_t piece)
{
	arena_layout *p;
	uint32_t *par;
	cr_assert_eq(arena_layout_pieces(l, piece, &p, &par), 0, "%s", arena_last_error());
	cr_assert_eq(p->n_tensors, l->n_tensors);
	cr_assert_eq(p->data_length, l->data_length);
	uint64_t largest = 0; /* the largest module's span (a module's tensors stay in one piece) */
	for (size_t i = 0; i < l->n_tensors; i++) {
		uint64_t lo, hi, a = UINT64_MAX, z = 0;
		for (size_t k = 0; k < l->n_tensors; k++)
			if (l->tensors[k].block == l->tensors[i].block && same_module(l->tensors[k].name, l->tensors[i].name)) {
				span(&l->tensors[k], &lo, &hi);
				a = lo < a ? lo : a;
				z = hi > z ? hi : z;
			}
		if (z > a)
			largest = z - a > largest ? z - a : largest;
	}
	/* Pieces of each block tile its slab, in order. */
	size_t j = 0;
	for (size_t b = 0; b < l->n_blocks; b++) {
		const arena_block *blk = &l->blocks[b];
		uint64_t at = blk->offset;
		size_t k = 0;
		for (; j < p->n_blocks && par[j] == b; j++, k++) {
			const arena_block *q = &p->blocks[j];
			cr_assert_eq(q->offset, at, "block %s piece %zu starts at %llu, want %llu", blk->name, k,
				     (unsigned long long)q->offset, (unsigned long long)at);
			at += q->bytes;
			cr_assert_gt(q->bytes, 0);
			cr_assert_eq(q->index, blk->index);
			cr_assert((q->container == NULL) == (blk->container == NULL));
			if (piece >= largest && blk->container) /* globals stay whole */
				cr_assert(q->bytes <= piece || q->bytes - piece <= 256, "%s: %llu bytes, pieces of %llu", q->name,
					      (unsigned long long)q->bytes, (unsigned long long)piece);
		}
		cr_assert_eq(at, blk->offset + blk->bytes, "block %s: pieces end at %llu, its slab at %llu", blk->name,
			     (unsigned long long)at, (unsigned long long)(blk->offset + blk->bytes));
		if (!blk->container || blk->bytes <= piece) {
			cr_assert_eq(k, 1, "block %s (%llu bytes) split with pieces of %llu", blk->name,
				     (unsigned long long)blk->bytes, (unsigned long long)piece);
			cr_assert_str_eq(p->blocks[j - 1].name, blk->name);
		} else {
			char want[256];
			snprintf(want, sizeof(want), "%s#0", blk->name);
			cr_assert_str_eq(p->blocks[j - k].name, want);
		}
	}
	cr_assert_eq(j, p->n_blocks);
	/* Every tensor: same name, same bytes in the data region, inside its piece. */
	for (size_t i = 0; i < l->n_tensors; i++) {
		const arena_tensor *a = &l->tensors[i], *t = &p->tensors[i];
		cr_assert_str_eq(t->name, a->name);
		cr_assert_eq(par[t->block], a->block);
		cr_assert_eq(t->n_comp, a->n_comp);
		for (uint32_t c = 0; c < t->n_comp; c++) {
			cr_assert_eq(p->blocks[t->block].offset + t->comp[c].offset,
				     l->blocks[a->block].offset + a->comp[c].offset, "%s: moved", t->name);
			cr_assert_leq(t->comp[c].offset + t->comp[c].bytes, p->blocks[t->block].bytes, "%s: outside its piece",
				      t->name);
			cr_assert_eq(t->comp[c].offset % ARENA_TENSOR_ALIGN, 0);
		}
		cr_assert_eq(arena_layout_find(p, a->name), t);
		/* a module's tensors (a Linear's weight and bias) in one piece */
		for (size_t k = 0; k < i; k++)
			if (l->tensors[k].block == a->block && same_module(l->tensors[k].name, a->name))
				cr_assert_eq(p->tensors[k].block, t->block, "%s and %s in two pieces (piece size %llu)",
					     l->tensors[k].name, a->name, (unsigned long long)piece);
	}
	/* order[] groups each piece's tensors. */
	for (size_t q = 0; q < p->n_blocks; q++)
		for (uint32_t k = 0; k < p->blocks[q].n_tensors; k++)
			cr_assert_eq(p->tensors[p->order[p->blocks[q].first + k]].block, q);
	arena_free(par);
	arena_layout_free(p);
}

static void sizes(const arena_layout *l)
{
	uint64_t ps[] = {1, 256, 4096, 10000, 65536, 300000, 1 << 20, UINT64_MAX};
	for (size_t i = 0; i < sizeof(ps) / sizeof(ps[0]); i++)
		check_pieces(l, ps[i]);
	uint64_t maxb = 0;
	for (size_t b = 0; b < l->n_blocks; b++)
		maxb = l->blocks[b].bytes > maxb ? l->blocks[b].bytes : maxb;
	for (uint64_t q = maxb / 8; q <= maxb; q += maxb / 8 ? maxb / 8 : 1)
		check_pieces(l, q);
}

Test(pieces, tile_blocks_and_keep_every_tensor)
{
	tmpdir_make(dir, sizeof(dir), "test-pieces");
	arena_image *img = image_of("tiny_flux.safetensors", NULL);
	sizes(img->layout);
	/* No split at all: the same blocks. */
	arena_layout *p;
	cr_assert_eq(arena_layout_pieces(img->layout, UINT64_MAX, &p, NULL), 0);
	cr_assert_eq(p->n_blocks, img->layout->n_blocks);
	arena_layout_free(p);
	/* Small pieces: more blocks than before, none but the tensors' own larger. */
	cr_assert_eq(arena_layout_pieces(img->layout, 4096, &p, NULL), 0);
	cr_assert_gt(p->n_blocks, img->layout->n_blocks);
	arena_layout_free(p);
	cr_assert_eq(arena_layout_pieces(img->layout, 0, &p, NULL), ARENA_E_USAGE);
	cr_assert_null(p);
	arena_img_close(img);
	tmpdir_remove(dir);
}

Test(pieces, quantized_components_stay_together)
{
	tmpdir_make(dir, sizeof(dir), "test-pieces-q");
	arena_image *img = image_of("tiny_flux.safetensors", "fp8-e4m3-row");
	sizes(img->layout);
	arena_img_close(img);
	tmpdir_remove(dir);
}

/* Opened with piece_size under a cap at the pieces' floor: the arena's blocks
 * are the pieces, streamed through the ring; every tensor of every acquired
 * piece holds the bytes a whole-block open of the image holds, step after
 * step. A checkpoint cannot be opened in pieces. */
Test(pieces, streamed_pieces_hold_the_image_bytes)
{
	tmpdir_make(dir, sizeof(dir), "test-pieces-open");
	arena_image *img = image_of("tiny_flux.safetensors", NULL);
	const char *path = tmpdir_file(dir, "p.arena");
	const uint64_t piece = 16384;
	arena_layout *pl;
	cr_assert_eq(arena_layout_pieces(img->layout, piece, &pl, NULL), 0);
	size_t n_whole = img->layout->n_blocks;
	arena_img_close(img);
	arena_open_options ro = {.backend = "sim"};
	arena *ref;
	cr_assert_eq(arena_open(path, &ro, &ref), 0, "%s", arena_last_error());
	/* The least device memory the pieces run in, with no headroom or reserve. */
	arena_engine_opts eo = {.mode = ARENA_MODE_SAMPLE, .headroom = 0, .reserve = 0};
	uint64_t cap, wts;
	cr_assert_eq(arena_residency_floor(pl, &eo, &cap, &wts), 0, "%s", arena_last_error());
	arena_layout_free(pl);
	arena_open_options o = {.backend = "sim", .piece_size = piece, .vram_cap = cap, .headroom = ARENA_ZERO_BYTES,
				.reserve = ARENA_ZERO_BYTES, .flags = ARENA_OPEN_NO_LEARN};
	arena *a;
	cr_assert_eq(arena_open(path, &o, &a), 0, "%s", arena_last_error());
	size_t nb = arena_block_count(a);
	cr_assert_gt(nb, n_whole, "%zu blocks with pieces, %zu whole", nb, n_whole);
	cr_assert_eq(arena_tensor_count(a), arena_tensor_count(ref));
	uint64_t streamed = 0;
	for (int step = 0; step < 3; step++) {
		cr_assert_eq(arena_step_begin(a), 0, "%s", arena_last_error());
		for (size_t i = 0; i < nb; i++) {
			void *d;
			cr_assert_eq(arena_block_acquire(a, i, NULL, &d), 0, "%s", arena_last_error());
			cr_assert_eq((uintptr_t)d % 256, 0, "piece %s at %p", arena_block_name(a, i), d);
			expect_block_tensors(a, ref, i, d, step);
			cr_assert_eq(arena_block_release(a, i, NULL), 0, "%s", arena_last_error());
		}
		cr_assert_eq(arena_step_end(a), 0, "%s", arena_last_error());
		arena_step_info si;
		cr_assert_eq(arena_step_get(a, (uint64_t)step, &si), 0, "%s", arena_last_error());
		streamed += si.streamed_bytes;
	}
	cr_assert_gt(streamed, 0, "pieces were streamed");
	arena_close(a);
	arena_close(ref);
	/* Pieces need an image. */
	arena_open_options so = {.backend = "sim", .piece_size = piece};
	cr_assert_eq(arena_open(fixture_path("tiny_flux.safetensors"), &so, &a), ARENA_E_USAGE);
	cr_assert_null(a);
	/* "auto" opens a checkpoint in whole blocks. */
	so.piece_size = ARENA_PIECE_AUTO;
	cr_assert_eq(arena_open(fixture_path("tiny_flux.safetensors"), &so, &a), 0, "%s", arena_last_error());
	arena_plan_info pi;
	cr_assert_eq(arena_plan_get(a, &pi), 0);
	cr_assert_eq(pi.piece_size, 0);
	arena_close(a);
	tmpdir_remove(dir);
}

/* piece_size "auto": whole blocks when they all fit (train: when they fit
 * at all); pieces of an eighth of the largest block (a power of two; a
 * quarter in train mode) when blocks stream or do not fit; smaller ones when those do not fit; whole blocks
 * (and the whole-block error) when nothing fits. arena_open says what it
 * chose. */
Test(pieces, auto_size_from_the_budget)
{
	tmpdir_make(dir, sizeof(dir), "test-pieces-auto");
	arena_image *img = image_of("tiny_flux.safetensors", NULL);
	const char *path = tmpdir_file(dir, "p.arena");
	const arena_layout *l = img->layout;
	uint64_t big = 0, total = 0;
	for (size_t b = 0; b < l->n_blocks; b++) {
		total += l->blocks[b].bytes;
		if (l->blocks[b].container && l->blocks[b].bytes > big)
			big = l->blocks[b].bytes;
	}
	uint64_t quarter = 1, eighth = 1;
	while (quarter * 2 <= big / 4)
		quarter *= 2;
	while (eighth * 2 <= big / 8)
		eighth *= 2;
	cr_assert_eq(eighth * 2, quarter);
	arena_engine_opts eo = {.mode = ARENA_MODE_TRAIN, .headroom = 0, .reserve = 0, .keep_last = 0, .depth = 7};
	uint64_t p = 1;
	cr_assert_eq(arena_residency_piece_auto(l, &eo, total - big, &p), 0, "%s", arena_last_error());
	cr_assert_eq(p, quarter, "train: pieces of %llu, got %llu", (unsigned long long)quarter, (unsigned long long)p);
	/* Training where whole blocks stream and fit: whole blocks. */
	eo.depth = 1;
	uint64_t glob = 0;
	for (size_t b = 0; b < l->n_blocks; b++)
		glob += l->blocks[b].container ? 0 : l->blocks[b].bytes;
	const uint64_t wb = glob + 2 * big + big / 2; /* a ring of 2 and room beside it */
	cr_assert_lt(wb, total);
	arena_residency_plan wt;
	cr_assert_eq(arena_residency_plan_make(l, &eo, wb, &wt), 0, "%s", arena_last_error());
	cr_assert_gt(wt.n_streamed, 0);
	arena_residency_plan_release(&wt);
	cr_assert_eq(arena_residency_piece_auto(l, &eo, wb, &p), 0);
	cr_assert_eq(p, 0, "train, whole blocks fit: whole blocks");
	eo.depth = 7;
	eo = (arena_engine_opts){.mode = ARENA_MODE_SAMPLE, .headroom = 0, .reserve = 0};
	cr_assert_eq(arena_residency_piece_auto(l, &eo, total * 2, &p), 0);
	cr_assert_eq(p, 0, "all fits: whole blocks");
	cr_assert_eq(arena_residency_piece_auto(l, &eo, total - big, &p), 0);
	cr_assert_eq(p, eighth, "blocks stream: pieces of %llu, got %llu", (unsigned long long)eighth,
		     (unsigned long long)p);
	/* Below the whole-block floor, at the floor of those pieces. */
	arena_layout *pl;
	uint64_t cap, wts;
	cr_assert_eq(arena_layout_pieces(l, eighth, &pl, NULL), 0);
	cr_assert_eq(arena_residency_floor(pl, &eo, &cap, &wts), 0, "%s", arena_last_error());
	arena_layout_free(pl);
	cr_assert_eq(arena_residency_piece_auto(l, &eo, wts, &p), 0);
	cr_assert_eq(p, eighth);
	/* Below that: a smaller piece size that fits, or none. */
	cr_assert_eq(arena_residency_piece_auto(l, &eo, wts - 1, &p), 0);
	cr_assert_lt(p, eighth);
	if (p) {
		cr_assert_eq(arena_layout_pieces(l, p, &pl, NULL), 0);
		arena_residency_plan t;
		cr_assert_eq(arena_residency_plan_make(pl, &eo, wts - 1, &t), 0, "%s", arena_last_error());
		arena_residency_plan_release(&t);
		arena_layout_free(pl);
	}
	cr_assert_eq(arena_residency_piece_auto(l, &eo, 1024, &p), 0);
	cr_assert_eq(p, 0, "nothing fits");
	arena_img_close(img);
	/* Through arena_open: what it chose. */
	arena_open_options o = {.backend = "sim", .piece_size = ARENA_PIECE_AUTO, .vram_cap = wts,
				.headroom = ARENA_ZERO_BYTES, .reserve = ARENA_ZERO_BYTES};
	arena *a;
	cr_assert_eq(arena_open(path, &o, &a), 0, "%s", arena_last_error());
	arena_plan_info pi;
	cr_assert_eq(arena_plan_get(a, &pi), 0);
	cr_assert_eq(pi.piece_size, eighth);
	cr_assert_gt(arena_block_count(a), l ? 6 : 0);
	arena_close(a);
	o.vram_cap = 0;
	cr_assert_eq(arena_open(path, &o, &a), 0, "%s", arena_last_error());
	cr_assert_eq(arena_plan_get(a, &pi), 0);
	cr_assert_eq(pi.piece_size, 0, "no cap: whole blocks");
	arena_close(a);
	/* Training in pieces: unless a depth is given, the ring holds the
	 * largest block's pieces and one more (a recompute holds them). */
	arena_open_options t = {.backend = "sim", .piece_size = quarter, .vram_cap = 2 * total, .mode = ARENA_MODE_TRAIN,
				.keep_last = ARENA_ZERO_COUNT, .headroom = ARENA_ZERO_BYTES, .reserve = ARENA_ZERO_BYTES};
	t.vram_cap = total - big; /* some blocks stream */
	cr_assert_eq(arena_open(path, &t, &a), 0, "%s", arena_last_error());
	cr_assert_eq(arena_plan_get(a, &pi), 0);
	cr_assert_gt(pi.n_streamed, 0);
	cr_assert_geq((uint64_t)pi.slots * pi.slot_bytes, big + pi.slot_bytes, "%u slots of %llu for a block of %llu",
		      pi.slots, (unsigned long long)pi.slot_bytes, (unsigned long long)big);
	arena_close(a);
	t.depth = 2; /* given: as given */
	cr_assert_eq(arena_open(path, &t, &a), 0, "%s", arena_last_error());
	cr_assert_eq(arena_plan_get(a, &pi), 0);
	cr_assert_eq(pi.depth, 2);
	arena_close(a);
	tmpdir_remove(dir);
}
