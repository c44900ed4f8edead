/* plan.h - block discovery, block order and slab layout for a checkpoint.
 *
 * A block is the weights one repeated layer needs. A tensor belongs to the
 * first (outermost) repeated container in its name, matched at a '.'
 * boundary as "<container>.<digits>.": built in are the containers of common
 * layouts (diffusers transformer_blocks, single_transformer_blocks,
 * down_blocks, up_blocks, blocks; BFL double_blocks, single_blocks; HF LLM
 * layers, as in model.layers.N) and the single block mid_block. Everything
 * else forms the "globals" block, which comes first.
 *
 * User patterns replace the built-ins: each is a POSIX extended regex with
 * exactly one capture group matching the block's decimal index, e.g.
 * 'layers\.([0-9]+)\.'; the block is the name up to the end of the capture,
 * the container the name up to the capture without its trailing '.'.
 *
 * Block order is execution order: containers in the user's --block-order
 * (each entry matches a container equal to it or ending in ".<entry>"), then
 * known containers in their models' order (double_blocks, transformer_blocks,
 * single_transformer_blocks, single_blocks, down_blocks, mid_block,
 * up_blocks, blocks, layers), then others by name; indices numerically. */
#ifndef ARENA_LOADER_PLAN_H
#define ARENA_LOADER_PLAN_H

#include "../formats/checkpoint.h"
#include "../formats/layout.h"

typedef struct arena_plan_opts {
	const char *const *patterns; /* block regexes; NULL/0 = built-ins */
	size_t n_patterns;
	const char *const *order;    /* container names in execution order */
	size_t n_order;
	/* Storage scheme chooser (quantization). NULL = every tensor "none".
	 * Called once per tensor with its block (container NULL = globals);
	 * returns 0 and fills t's scheme and components (bytes set, offsets left
	 * to placement), or sets *skip when the tensor is folded into another
	 * (a compressed-tensors scale), or returns a negative error. */
	int (*choose)(void *ctx, const arena_st_tensor *src, const arena_ckpt *ck, const arena_block *blk,
		      arena_tensor *t, int *skip);
	void *choose_ctx;
} arena_plan_opts;

/* Build the layout of `ck`: blocks, order, components, offsets. The layout's
 * tensors point at their sources (t->src) in `ck`, which must outlive it.
 * Errors: PLAN_BAD_PATTERN, PLAN_BAD_ORDER, PLAN_EMPTY, ST_BAD_SHAPE, NOMEM. */
int arena_plan_build(const arena_ckpt *ck, const arena_plan_opts *opts, arena_layout **out);

/* The rules a checkpoint must meet for arena beyond the safetensors format
 * (convert, load and inspect apply them alike): no tensor of rank over
 * ARENA_MAX_RANK (ST_BAD_SHAPE, naming the file and the tensor).
 * arena_plan_build checks them too, and that there is a tensor at all. */
int arena_plan_check_ckpt(const arena_ckpt *ck);

/* The checkpoint's name for messages: its index, its file, or "a.safetensors
 * and 2 other files". Returns buf. */
const char *arena_plan_ckpt_name(const arena_ckpt *ck, char *buf, size_t len);

/* Describe src stored as it is: scheme "none", one component "data". */
void arena_plan_plain(const arena_st_tensor *src, arena_tensor *t);

/* The block a tensor name falls in under the built-in patterns: writes the
 * container (length *clen from name's start) and index (-1 for a single
 * block); returns 0 if the name is global. Exposed for tests. */
int arena_plan_match_builtin(const char *name, size_t *clen, int64_t *index);

#endif
