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
#include "../../formats/codec.h"
#include "../../formats/image.h"
#include "../../formats/layout.h"
#include "../../formats/st_write.h"
#include "../../convert/convert.h"
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
 * at all); pieces of an eighth of the largest block (a power of two; in
 * train mode a third, in whole eighths) when blocks stream or do not fit; smaller ones when those do not fit; whole blocks
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
	uint64_t eighth = 1;
	while (eighth * 2 <= big / 8)
		eighth *= 2;
	/* training: a third, in whole eighths */
	const uint64_t third = big / 3 / eighth * eighth;
	cr_assert_gt(third, eighth, "the layout's largest block makes a third of more than one eighth");
	arena_engine_opts eo = {.mode = ARENA_MODE_TRAIN, .headroom = 0, .reserve = 0, .keep_last = 0, .depth = 7};
	uint64_t p = 1;
	/* with room for its ring: a third of the largest block in whole eighths */
	cr_assert_eq(arena_residency_piece_auto(l, &eo, total - big + big / 8, &p), 0, "%s", arena_last_error());
	cr_assert_eq(p, third, "train: pieces of %llu, got %llu", (unsigned long long)third, (unsigned long long)p);
	/* without: a smaller one (a power of two) that fits */
	cr_assert_eq(arena_residency_piece_auto(l, &eo, total - big, &p), 0, "%s", arena_last_error());
	cr_assert(p && p < third && !(p & (p - 1)), "train, a third's ring too large: %llu", (unsigned long long)p);
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
	arena_open_options t = {.backend = "sim", .piece_size = third, .vram_cap = 2 * total, .mode = ARENA_MODE_TRAIN,
				.keep_last = ARENA_ZERO_COUNT, .headroom = ARENA_ZERO_BYTES, .reserve = ARENA_ZERO_BYTES};
	t.vram_cap = total - big; /* some blocks stream */
	cr_assert_eq(arena_open(path, &t, &a), 0, "%s", arena_last_error());
	cr_assert_eq(arena_plan_get(a, &pi), 0);
	cr_assert_gt(pi.n_streamed, 0);
	cr_assert_geq((uint64_t)pi.slots * pi.slot_bytes, big + pi.slot_bytes, "%u slots of %llu for a block of %llu",
		      pi.slots, (unsigned long long)pi.slot_bytes, (unsigned long long)big);
	arena_close(a);
	/* A depth given too small for that ring is refused at open, naming the
	 * least that works (arena_residency_ring); that one is taken as given. */
	const unsigned least = pi.depth;
	t.depth = 2;
	cr_assert_eq(arena_open(path, &t, &a), ARENA_E_USAGE);
	cr_assert_null(a);
	char say[64];
	snprintf(say, sizeof(say), "give depth %u or more", least);
	cr_assert(strstr(arena_last_error(), say) && strstr(arena_last_error(), path) && !strchr(arena_last_error(), '\n'),
		  "%s (want '%s')", arena_last_error(), say);
	t.depth = least;
	cr_assert_eq(arena_open(path, &t, &a), 0, "%s", arena_last_error());
	cr_assert_eq(arena_plan_get(a, &pi), 0);
	cr_assert_eq(pi.depth, least);
	arena_close(a);
	tmpdir_remove(dir);
}

/* The ring's rule on a layout of three blocks, the second in 5 pieces of
 * 10000 bytes (a block of 50000): the least depth of each mode, whole and in
 * pieces, and what it chooses when none is given. */
Test(pieces, the_ring_rule)
{
	arena_layout *l;
	cr_assert_eq(arena_layout_create(8, 0, &l), 0);
	const char *names[8] = {"globals", "b.0", "b.1#0", "b.1#1", "b.1#2", "b.1#3", "b.1#4", "b.2"};
	for (size_t b = 0; b < 8; b++) {
		l->blocks[b].name = arena_strdup(names[b]);
		l->blocks[b].container = b ? arena_strdup("b") : NULL;
		l->blocks[b].index = b == 0 ? -1 : b == 1 ? 0 : b == 7 ? 2 : 1;
		l->blocks[b].bytes = b == 0 ? 4096 : b == 1 || b == 7 ? 9000 : 10000;
	}
	struct {
		int mode, pieces;
		unsigned keep_last, depth; /* depth given, 0: none */
		int rc;
		unsigned want; /* the depth set, or the least named */
	} cases[] = {
		{ARENA_MODE_SAMPLE, 0, 0, 0, 0, 2}, {ARENA_MODE_SAMPLE, 0, 0, 1, 0, 1},
		{ARENA_MODE_SAMPLE, 1, 0, 0, 0, 2}, {ARENA_MODE_SAMPLE, 1, 0, 1, ARENA_E_USAGE, 2},
		{ARENA_MODE_SAMPLE, 1, 0, 2, 0, 2}, {ARENA_MODE_TRAIN, 0, 0, 1, ARENA_E_USAGE, 2},
		{ARENA_MODE_TRAIN, 0, 1, 1, 0, 1},  {ARENA_MODE_TRAIN, 0, 0, 0, 0, 2},
		/* a block of 5 slots and a piece more: 6 slots */
		{ARENA_MODE_TRAIN, 1, 0, 0, 0, 5},  {ARENA_MODE_TRAIN, 1, 1, 0, 0, 5},
		{ARENA_MODE_TRAIN, 1, 0, 4, ARENA_E_USAGE, 5}, {ARENA_MODE_TRAIN, 1, 1, 4, 0, 4},
		{ARENA_MODE_TRAIN, 1, 1, 3, ARENA_E_USAGE, 4}, {ARENA_MODE_TRAIN, 1, 0, 9, 0, 9},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		arena_engine_opts o = {.mode = cases[i].mode, .keep_last = cases[i].keep_last};
		int rc = arena_residency_ring(l, cases[i].pieces, cases[i].depth, &o);
		cr_assert_eq(rc, cases[i].rc, "case %zu: %s", i, rc ? arena_last_error() : "accepted");
		if (rc) {
			char say[64];
			snprintf(say, sizeof(say), "give depth %u or more", cases[i].want);
			cr_assert(strstr(arena_last_error(), say), "case %zu: %s (want '%s')", i, arena_last_error(), say);
			continue;
		}
		cr_assert_eq(o.depth, cases[i].want, "case %zu: depth %u", i, o.depth);
		cr_assert_eq(o.min_slot, cases[i].pieces ? 10000u : 0u, "case %zu", i);
		/* what the rule accepts, a plan of it can hold: the block and a piece (train) */
		if (cases[i].pieces && cases[i].mode == ARENA_MODE_TRAIN)
			cr_assert_geq((uint64_t)(o.depth + 1 + o.keep_last) * o.min_slot, 60000u, "case %zu", i);
	}
	/* Pieces too small for any ring: a block of 70 pieces. */
	arena_layout *m;
	cr_assert_eq(arena_layout_create(71, 0, &m), 0);
	for (size_t b = 0; b < 71; b++) {
		m->blocks[b].name = arena_strdup(b ? "b.0#" : "globals");
		m->blocks[b].container = b ? arena_strdup("b") : NULL;
		m->blocks[b].index = b ? 0 : -1;
		m->blocks[b].bytes = 4096;
	}
	arena_engine_opts o = {.mode = ARENA_MODE_TRAIN};
	cr_assert_eq(arena_residency_ring(m, 1, 0, &o), ARENA_E_USAGE);
	cr_assert(strstr(arena_last_error(), "give a larger piece size"), "%s", arena_last_error());
	o.mode = ARENA_MODE_SAMPLE;
	cr_assert_eq(arena_residency_ring(m, 1, 0, &o), 0, "%s", arena_last_error());
	arena_layout_free(m);
	arena_layout_free(l);
}

/* A ring too small for what the mode holds is refused at arena_open and at
 * arena_set_mode, in one line naming the least depth, not at an acquire in
 * the middle of a step: sampling in pieces with depth 1, training whole
 * blocks in two slots, training in pieces with a ring that cannot hold a
 * block. A refused set_mode leaves the arena in the mode it was. */
Test(pieces, a_ring_too_small_is_refused_at_open)
{
	tmpdir_make(dir, sizeof(dir), "test-pieces-ring");
	arena_img_close(image_of("tiny_flux.safetensors", NULL));
	const char *path = tmpdir_file(dir, "p.arena");
	arena_open_options o = {.backend = "sim", .piece_size = 16384, .sim_capacity = 120 << 10, .depth = 1,
				.keep_last = ARENA_ZERO_COUNT, .headroom = ARENA_ZERO_BYTES, .reserve = ARENA_ZERO_BYTES, .flags = ARENA_OPEN_NO_LEARN};
	arena *a = NULL;
	cr_assert_eq(arena_open(path, &o, &a), ARENA_E_USAGE);
	cr_assert_null(a);
	cr_assert(strstr(arena_last_error(), "give depth 2 or more") && !strchr(arena_last_error(), '\n'), "%s",
		  arena_last_error());
	o.piece_size = 0; /* whole blocks sample in two slots */
	o.sim_capacity = 0;
	cr_assert_eq(arena_open(path, &o, &a), 0, "%s", arena_last_error());
	cr_assert_eq(arena_set_mode(a, ARENA_MODE_TRAIN), ARENA_E_USAGE, "two slots cannot train");
	cr_assert(strstr(arena_last_error(), "give depth 2 or more"), "%s", arena_last_error());
	cr_assert_eq(arena_mode(a), ARENA_MODE_SAMPLE);
	arena_close(a);
	o.mode = ARENA_MODE_TRAIN;
	cr_assert_eq(arena_open(path, &o, &a), ARENA_E_USAGE);
	cr_assert(strstr(arena_last_error(), "give depth 2 or more"), "%s", arena_last_error());
	o.keep_last = 1; /* three slots */
	cr_assert_eq(arena_open(path, &o, &a), 0, "%s", arena_last_error());
	arena_close(a);
	/* In pieces: sampling at the default depth; training asks for the ring
	 * that holds a block, none given: set_mode takes it, and back. */
	o = (arena_open_options){.backend = "sim", .piece_size = 16384, .keep_last = ARENA_ZERO_COUNT,
				 .flags = ARENA_OPEN_NO_LEARN};
	cr_assert_eq(arena_open(path, &o, &a), 0, "%s", arena_last_error());
	arena_plan_info pi;
	cr_assert_eq(arena_plan_get(a, &pi), 0);
	cr_assert_eq(pi.depth, 2);
	cr_assert_eq(arena_set_mode(a, ARENA_MODE_TRAIN), 0, "%s", arena_last_error());
	cr_assert_eq(arena_plan_get(a, &pi), 0);
	cr_assert_gt(pi.depth, 2, "training in pieces: the ring holds a block");
	const unsigned train_depth = pi.depth;
	cr_assert_eq(arena_set_mode(a, ARENA_MODE_SAMPLE), 0, "%s", arena_last_error());
	cr_assert_eq(arena_plan_get(a, &pi), 0);
	cr_assert_eq(pi.depth, 2);
	arena_close(a);
	o.depth = 2; /* given: sampling runs, training refuses it */
	cr_assert_eq(arena_open(path, &o, &a), 0, "%s", arena_last_error());
	cr_assert_eq(arena_set_mode(a, ARENA_MODE_TRAIN), ARENA_E_USAGE);
	char say[64];
	snprintf(say, sizeof(say), "give depth %u or more", train_depth);
	cr_assert(strstr(arena_last_error(), say), "%s (want '%s')", arena_last_error(), say);
	cr_assert_eq(arena_mode(a), ARENA_MODE_SAMPLE);
	arena_close(a);
	tmpdir_remove(dir);
}

/* Six blocks cut as FLUX.1-dev's double block is in 64 MiB pieces, in KiB:
 * 54, 54, 36, 72, 72, 72, 72, 108 and 108 (648 KiB, a module each), and a
 * global. */
static void write_flux_like(const char *path)
{
	static const uint64_t kib[9] = {54, 54, 36, 72, 72, 72, 72, 108, 108};
	arena_stw *w;
	cr_assert_eq(arena_stw_create(path, &w), 0, "%s", arena_last_error());
	char name[64];
	for (int b = 0; b < 6; b++)
		for (int m = 0; m < 9; m++) {
			const uint64_t shape[2] = {kib[m] * 8, 64}; /* bf16: 1 KiB a 8 x 64 */
			snprintf(name, sizeof(name), "transformer_blocks.%d.m%d.weight", b, m);
			cr_assert_eq(arena_stw_add(w, name, ARENA_DTYPE_BF16, 2, shape), 0, "%s", arena_last_error());
		}
	const uint64_t g[1] = {4096};
	cr_assert_eq(arena_stw_add(w, "proj_out.weight", ARENA_DTYPE_BF16, 1, g), 0);
	cr_assert_eq(arena_stw_begin(w), 0, "%s", arena_last_error());
	uint8_t buf[65536];
	for (size_t i = 0; i < sizeof(buf); i++)
		buf[i] = (uint8_t)(i * 13 + 5);
	for (uint64_t left = arena_stw_data_size(w); left;) {
		const size_t n = left < sizeof(buf) ? (size_t)left : sizeof(buf);
		cr_assert_eq(arena_stw_write(w, buf, n), 0, "%s", arena_last_error());
		left -= n;
	}
	cr_assert_eq(arena_stw_commit(w), 0, "%s", arena_last_error());
}

/* The first of the pieces of the block whose piece `last` is: the blocks
 * before it named as it is up to its '#' (block 0 is the globals). */
static size_t first_piece(arena *a, size_t last)
{
	const char *nb = arena_block_name(a, last), *hb = strchr(nb, '#');
	const size_t len = hb ? (size_t)(hb - nb) : strlen(nb);
	size_t lo = last;
	while (lo > 1 && !strncmp(arena_block_name(a, lo - 1), nb, len) && arena_block_name(a, lo - 1)[len] == '#')
		lo--;
	return lo;
}

/* Training in pieces smaller than the ring's slots (the largest piece) at
 * the least depth the ring rule takes, at every cap from the floor up: a
 * checkpointed step's forward (each piece acquired and released) and its
 * backward (each block's pieces acquired in order for its recompute, all
 * held until its backward, released in reverse). Fetched ahead into any
 * place that overwrote nothing pending, the pieces of a backward scattered
 * over the ring until a block's pieces no longer fitted a ring that holds
 * their bytes ("blocks held fill the ring"); fetched ahead in the ring's
 * order, every step runs. */
Test(pieces, training_holds_a_block_of_small_pieces_at_every_cap)
{
	tmpdir_make(dir, sizeof(dir), "test-pieces-frag");
	const char *in = tmpdir_file(dir, "f.safetensors");
	write_flux_like(in);
	const char *path = tmpdir_file(dir, "f.arena");
	arena_convert_opts co = {.chunk_size = 64 << 10, .threads = 1};
	cr_assert_eq(arena_convert_inputs(&in, 1, path, &co, NULL), 0, "%s", arena_last_error());
	unsigned runs = 0;
	for (uint64_t cap = 900 << 10; cap <= 3800 << 10; cap += 100 << 10) {
		arena_open_options o = {.backend = "sim", .piece_size = 64 << 10, .mode = ARENA_MODE_TRAIN,
					.vram_cap = cap, .headroom = ARENA_ZERO_BYTES, .reserve = ARENA_ZERO_BYTES,
					.flags = ARENA_OPEN_NO_LEARN};
		arena *a = NULL;
		int rc = ARENA_E_USAGE;
		for (o.depth = 1; o.depth < 40 && rc == ARENA_E_USAGE; o.depth++) { /* the least depth taken */
			rc = arena_open(path, &o, &a);
			cr_assert(rc == 0 || rc == ARENA_E_USAGE || rc == ARENA_E(BUDGET), "%s", arena_last_error());
		}
		if (rc)
			continue; /* below the floor */
		arena_plan_info pi;
		cr_assert_eq(arena_plan_get(a, &pi), 0);
		const size_t n = arena_block_count(a);
		for (int step = 0; step < 4; step++) {
			void *d;
			cr_assert_eq(arena_step_begin(a), 0, "%s", arena_last_error());
			for (size_t i = 1; i < n; i++) {
				cr_assert_eq(arena_block_acquire(a, i, NULL, &d), 0, "forward %s", arena_last_error());
				cr_assert_eq(arena_block_release(a, i, NULL), 0, "%s", arena_last_error());
			}
			for (size_t hi = n; hi > 1;) {
				const size_t lo = first_piece(a, hi - 1);
				for (size_t i = lo; i < hi; i++)
					cr_assert_eq(arena_block_acquire(a, i, NULL, &d), 0,
						     "cap %llu KiB, %u slots of %llu KiB (depth %u), step %d, backward of %s: %s",
						     (unsigned long long)(cap >> 10), pi.slots,
						     (unsigned long long)(pi.slot_bytes >> 10), pi.depth, step,
						     arena_block_name(a, i), arena_last_error());
				for (size_t i = hi; i-- > lo;)
					cr_assert_eq(arena_block_release(a, i, NULL), 0, "%s", arena_last_error());
				hi = lo;
			}
			cr_assert_eq(arena_step_end(a), 0, "%s", arena_last_error());
		}
		arena_close(a);
		runs++;
	}
	cr_assert_gt(runs, 10, "caps that ran: %u", runs);
	tmpdir_remove(dir);
}

/* The share of the budget piece_size "auto" asks with while the reserve is
 * learned (arena_residency_piece_auto_share): half sampling, a third
 * training, two fifths training an image that streams coded. Through
 * arena_open a plain image trains whole blocks from three times their
 * floor, and the same weights coded but streamed raw
 * (ARENA_OPEN_PLAIN_STREAM) from the same cap (with the coded share they
 * went whole from 6.7 MB where the plain one did from 8.0). */
Test(pieces, auto_in_training_by_the_whole_blocks_share)
{
	slow_test();
	cr_assert_eq(arena_residency_piece_auto_share(ARENA_MODE_SAMPLE, 0, 3000), 1500);
	cr_assert_eq(arena_residency_piece_auto_share(ARENA_MODE_SAMPLE, 1, 3000), 1500);
	cr_assert_eq(arena_residency_piece_auto_share(ARENA_MODE_TRAIN, 0, 3000), 1000);
	cr_assert_eq(arena_residency_piece_auto_share(ARENA_MODE_TRAIN, 1, 3000), 1200);
	cr_assert_eq(arena_residency_piece_auto_share(ARENA_MODE_TRAIN, 1, UINT64_MAX), UINT64_MAX / 5 * 2);
	tmpdir_make(dir, sizeof(dir), "test-pieces-share");
	const char *in = tmpdir_file(dir, "f.safetensors");
	write_flux_like(in);
	char plain[512], coded[512];
	snprintf(plain, sizeof(plain), "%s", tmpdir_file(dir, "p.arena"));
	snprintf(coded, sizeof(coded), "%s", tmpdir_file(dir, "c.arena"));
	arena_convert_opts co = {.chunk_size = 64 << 10, .threads = 1};
	cr_assert_eq(arena_convert_inputs(&in, 1, plain, &co, NULL), 0, "%s", arena_last_error());
	co.codec = ARENA_CODEC_HB4;
	cr_assert_eq(arena_convert_inputs(&in, 1, coded, &co, NULL), 0, "%s", arena_last_error());
	/* Through arena_open: the whole-block floor in training (no reserve), and
	 * the least cap at which "auto", the reserve learned, trains whole blocks
	 * (a third of it for the floor: three floors), for the plain image and
	 * for the coded one streamed raw. */
	const uint64_t step = 32 << 10;
	uint64_t floor = 0, whole = 0, raw = 0;
	for (uint64_t cap = 1 << 20; cap < (64u << 20) && !(whole && raw); cap += step) {
		arena_open_options o = {.backend = "sim", .mode = ARENA_MODE_TRAIN, .vram_cap = cap,
					.headroom = ARENA_ZERO_BYTES, .reserve = ARENA_ZERO_BYTES, .flags = ARENA_OPEN_NO_LEARN};
		arena *a = NULL;
		arena_plan_info pi;
		if (!floor && !arena_open(plain, &o, &a))
			floor = cap, arena_close(a);
		o.piece_size = ARENA_PIECE_AUTO;
		o.reserve = 0;
		o.flags |= ARENA_OPEN_LEARN_REST;
		if (!whole && !arena_open(plain, &o, &a)) {
			cr_assert_eq(arena_plan_get(a, &pi), 0);
			whole = pi.piece_size ? 0 : cap;
			arena_close(a);
		}
		o.flags |= ARENA_OPEN_PLAIN_STREAM;
		if (!raw && !arena_open(coded, &o, &a)) {
			cr_assert_eq(arena_plan_get(a, &pi), 0);
			raw = pi.piece_size ? 0 : cap;
			arena_close(a);
		}
	}
	cr_assert(floor && whole, "floor %llu, whole blocks from %llu", (unsigned long long)floor,
		  (unsigned long long)whole);
	cr_assert(whole + 3 * step >= 3 * floor && whole <= 3 * floor + 3 * step,
		  "whole blocks from %llu, the floor %llu: not three floors", (unsigned long long)whole,
		  (unsigned long long)floor);
	cr_assert_eq(raw, whole, "a coded image streamed raw: whole blocks from %llu, a plain one from %llu",
		     (unsigned long long)raw, (unsigned long long)whole);
	tmpdir_remove(dir);
}
