/* layout.h - the in-memory description of an arena: blocks, their slabs,
 * and where each tensor's components live. Built by convert/plan.c from a
 * checkpoint, written to and read from an image's manifest (formats/image.c).
 *
 * Invariants once arena_layout_place() or arena_layout_check() succeeded:
 *  1. blocks[] is in execution order; blocks[b].offset is a multiple of
 *     ARENA_SLAB_ALIGN, slabs are in increasing offset order, do not overlap,
 *     and end within data_length (a multiple of ARENA_SLAB_ALIGN).
 *  2. tensors[] is sorted by name, names unique; each names its block.
 *  3. Every component offset is relative to its block's slab, a multiple of
 *     ARENA_TENSOR_ALIGN, and [offset, offset+bytes) lies within the slab's
 *     bytes; components of one slab do not overlap; bytes match dtype x shape.
 *  4. order[blocks[b].first .. + blocks[b].n_tensors) lists block b's tensor
 *     indices in slab order.
 */
#ifndef ARENA_FORMATS_LAYOUT_H
#define ARENA_FORMATS_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "dtype.h"

#define ARENA_SLAB_ALIGN 4096u
#define ARENA_TENSOR_ALIGN 256u
#define ARENA_MAX_RANK 8
#define ARENA_MAX_COMPONENTS 4

typedef struct arena_component {
	char name[16];   /* "data", "qdata", "scale", ... */
	arena_dtype dtype;
	uint32_t rank;
	uint64_t shape[ARENA_MAX_RANK];
	uint64_t offset; /* within the slab */
	uint64_t bytes;
} arena_component;

typedef struct arena_tensor {
	char *name;      /* owned */
	arena_dtype dtype; /* logical (original) dtype and shape */
	uint32_t rank;
	uint64_t shape[ARENA_MAX_RANK];
	uint32_t block;
	char scheme[24]; /* "none", a quant scheme name or "torch-subclass" */
	uint32_t n_comp;
	arena_component comp[ARENA_MAX_COMPONENTS];
	char *subclass;  /* owned: torch-subclass only, the manifest's "subclass" object as compact JSON; else NULL */
	const void *src; /* convert only: the source (arena_st_tensor), borrowed */
	const void *comp_src[ARENA_MAX_COMPONENTS]; /* convert, torch-subclass: each component's source, borrowed */
} arena_tensor;

typedef struct arena_block {
	char *name;      /* owned: "globals", "transformer_blocks.7", "mid_block" */
	char *container; /* owned or NULL */
	int64_t index;   /* -1 when not an indexed container member */
	uint64_t offset; /* slab offset within the data region */
	uint64_t bytes;  /* slab length */
	uint32_t first;  /* into order[] */
	uint32_t n_tensors;
} arena_block;

typedef struct arena_layout {
	size_t n_blocks;
	arena_block *blocks;
	size_t n_tensors;
	arena_tensor *tensors;
	uint32_t *order;      /* n_tensors entries, grouped by block */
	uint64_t data_length; /* end of the last slab rounded up to ARENA_SLAB_ALIGN */
} arena_layout;

/* Allocate a zeroed layout with room for the given counts. */
int arena_layout_create(size_t n_blocks, size_t n_tensors, arena_layout **out);
void arena_layout_free(arena_layout *l);

/* Bytes of `rank` dims of `dt`; returns -1 on overflow or partial bytes. */
int arena_nbytes(arena_dtype dt, uint32_t rank, const uint64_t *shape, uint64_t *out);

/* Given blocks (name, order) and tensors (block, components with bytes),
 * sort tensors by name, group them by block (slab order: by name) and assign
 * every offset. Establishes the invariants above. */
int arena_layout_place(arena_layout *l);

/* Check the invariants of a layout read from a file (`label` for messages).
 * Builds order[] and each block's first/n_tensors. Errors: IMG_SLAB_BAD,
 * IMG_TENSOR_BAD, IMG_MANIFEST_BAD. */
int arena_layout_check(arena_layout *l, const char *label);

/* Binary search by name; NULL if absent. */
const arena_tensor *arena_layout_find(const arena_layout *l, const char *name);

/* Total bytes of the tensors' components (what a loader moves). */
uint64_t arena_layout_payload(const arena_layout *l);

/* The layout with every block larger than `piece` bytes (globals excepted)
 * split into pieces, for streaming in smaller units: consecutive ranges of
 * the block's slab that tile it, each starting where a tensor starts, at
 * most `piece` bytes unless one tensor (its components together) is larger.
 * Piece k of block "transformer_blocks.3" is a block "transformer_blocks.3#k"
 * with the container and index of its block; blocks not split keep their
 * names. Tensors move to the piece holding them, offsets relative to it.
 * Pieces are offset within their block's slab: not ARENA_SLAB_ALIGN
 * aligned (arena_layout_check does not hold; the data region is the same).
 * *parent (when not NULL) gets each new block's block in l (arena_free).
 * Errors: USAGE (piece 0), NOMEM. */
int arena_layout_pieces(const arena_layout *l, uint64_t piece, arena_layout **out, uint32_t **parent);

static inline uint64_t arena_align_up(uint64_t v, uint64_t a)
{
	return (v + a - 1) / a * a;
}

#endif
