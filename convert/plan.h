/* plan.h - block discovery, block order and slab layout for a checkpoint.
 *
 * A block is the weights one repeated layer needs. Blocks are found from the
 * checkpoint's structure, whatever its containers are called (block, h,
 * layers, blocks, resblocks, down_blocks, transformer_blocks, ...).
 *
 * Names are paths of '.'-separated components. An index is a component of
 * decimal digits without a leading zero ("0", "12"; not "07" or "3a"), at
 * most 18 digits. A container is a path X, not empty, followed in some name
 * by an index that is not the name's last component: "X.<N>.rest". Its
 * members are the indices N with tensors under "X.<N>."; a member's names
 * are its tensors' names after "X.<N>.". Two modules are alike when they
 * share at least half of the names of the one with fewer names (shapes are
 * not compared: a UNet's stages differ in width, and blocks of one list may
 * differ in size).
 *
 * Walking the names from the top, the first container on each path is
 * judged; it is a block sequence, each member a block "X.<N>" (index N),
 * when:
 *   1. it has one member: only if its last component is a known list name
 *      (double_blocks, transformer_blocks, single_transformer_blocks,
 *      single_blocks, down_blocks, up_blocks, blocks, layers), so that a
 *      checkpoint cut to one block of a known layout keeps it; one member
 *      of any other name repeats nothing (attn.to_out.0, a T5 cut to one
 *      block);
 *   2. else its indices are consecutive (every index from the smallest to
 *      the largest has tensors: an nn.Sequential with parameter-free layers
 *      between, as Linear, GELU, Linear at 0 and 2, is the parts of one
 *      layer, not a list of blocks), and
 *   3. more than half of its members are alike another member (with two
 *      members, the two alike), among at most 64 different sets of names.
 *      The members that are alike no other are blocks too: the last down
 *      block of a UNet without a downsampler, T5's block 0 that alone holds
 *      relative_attention_bias, SD3's last block (context_pre_only).
 * A block sequence holds everything under it: containers inside its members
 * are not judged (model.layers.3.mlp.experts.5 is in block model.layers.3).
 * A container that is not a sequence is looked into: the containers inside
 * each member are judged the same way. The top level is not a container
 * (numbered names at the top are looked into); paths deeper than 128
 * components are not looked into.
 *
 * Single blocks: a module S (not an index) beside a block sequence X (the
 * same parent path; a UNet's mid_block beside down_blocks and up_blocks, a
 * VAE's encoder.mid_block beside encoder.down_blocks) that is alike one of
 * X's members is one unit. It is one block "S" (index -1) when its bytes are
 * at least those of X's smallest block: as big as the blocks beside it, it
 * is worth streaming like them; the PyTorch adapter binds it as a module of
 * its own (it is not a list member). Alike but smaller than every block
 * beside it, all of it stays in globals (it is not cut into smaller blocks).
 * A module alike no block beside it is looked into like any other.
 *
 * Everything in no block forms the "globals" block, which comes first.
 *
 * User patterns replace discovery: each is a POSIX extended regex with
 * exactly one capture group matching the block's decimal index, e.g.
 * 'layers\.([0-9]+)\.'; the block is the name up to the end of the capture,
 * the container the name up to the capture without its trailing '.'.
 *
 * Block order is execution order: globals, then the containers named by
 * --block-order (each entry matches a container equal to it or ending in
 * ".<entry>"), in that order; then the others by path, compared component
 * by component: at the first component that differs, the known models'
 * order (encoder, decoder, double_blocks, transformer_blocks,
 * single_transformer_blocks, single_blocks, down_blocks, mid_block,
 * up_blocks, blocks, layers) before other names, others by name (a
 * checkpoint's header is sorted by name, so this is the order its containers
 * appear in); a path before the longer paths it starts. Indices
 * numerically. The PyTorch adapter may reorder from the module. */
#ifndef ARENA_CONVERT_PLAN_H
#define ARENA_CONVERT_PLAN_H

#include "../formats/checkpoint.h"
#include "../formats/layout.h"

typedef struct arena_plan_opts {
	const char *const *patterns; /* block regexes; NULL/0 = discovery */
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

/* The block a tensor name falls in by its name alone: the first (outermost)
 * known container in it ("<known>.<digits>." at a '.' boundary, the known
 * list names of rule 1 above) or "mid_block."; writes the container (length
 * *clen from name's start) and index (-1 for mid_block); returns 0 if none.
 * Discovery does not use it (it is the rule before discovery, kept for
 * comparison in tests). */
int arena_plan_match_builtin(const char *name, size_t *clen, int64_t *index);

/* ---- the discovery report (what arena inspect prints) -------------------- */

typedef enum arena_plan_verdict {
	ARENA_PLAN_SEQUENCE, /* a block sequence: each member a block */
	ARENA_PLAN_SINGLE,   /* one module, one block of its own */
	ARENA_PLAN_REJECTED, /* judged and not blocks: its tensors were looked into, or are globals */
} arena_plan_verdict;

typedef enum arena_plan_reason {
	ARENA_PLAN_SAME,       /* sequence: every member has the same names and shapes */
	ARENA_PLAN_SAME_NAMES, /* sequence: the same names, shapes differ */
	ARENA_PLAN_MOST,       /* sequence: names differ; most members alike another */
	ARENA_PLAN_KNOWN_ONE,  /* sequence: one member, a known list name */
	ARENA_PLAN_PATTERN,    /* sequence: found by --block-pattern */
	ARENA_PLAN_LIKE,       /* single: alike a block beside it, as big as the smallest */
	ARENA_PLAN_ONE,        /* rejected: one member */
	ARENA_PLAN_GAPS,       /* rejected: indices not consecutive */
	ARENA_PLAN_DIFFER,     /* rejected: members differ (half or fewer alike, or over 64 kinds) */
	ARENA_PLAN_SMALL,      /* rejected single: alike a block beside it, smaller than all: globals */
} arena_plan_reason;

typedef struct arena_plan_found {
	char *path;                 /* "transformer_blocks", "encoder.block", "mid_block", "attn.to_out" */
	arena_plan_verdict verdict;
	arena_plan_reason reason;
	uint64_t members;           /* indices holding tensors (1 for a single module) */
	uint64_t alike;             /* members alike another member (sequences judged by rule 3) */
	int64_t first, last;        /* smallest and largest index; -1 for a single module */
	uint64_t tensors, bytes;    /* under it */
	char *like;                 /* SINGLE, SMALL: the block it is alike ("down_blocks.1"); else NULL */
} arena_plan_found;

typedef struct arena_plan_report {
	size_t n_found;
	arena_plan_found *found; /* sequences and singles in execution order, then the rejected by path */
	size_t n_blocks;         /* blocks of the layout, globals included */
	uint64_t global_tensors, global_bytes;
} arena_plan_report;

/* What block discovery (or opts' patterns) finds in `ck`, and why: every
 * container judged and every single-block candidate, with the verdict the
 * layout arena_plan_build makes follows. opts as for arena_plan_build (its
 * choose is not called; NULL = discovery). Errors as arena_plan_build. */
int arena_plan_describe(const arena_ckpt *ck, const arena_plan_opts *opts, arena_plan_report **out);
void arena_plan_report_free(arena_plan_report *r);

/* A reason in words: "repeating", "one member", ... (static). */
const char *arena_plan_reason_text(arena_plan_reason r);

/* The report on one line, snprintf-like (returns the length it needs):
 * "blocks: transformer_blocks (19, repeating), single_transformer_blocks
 * (38, repeating), mid_block (single, like down_blocks.1); globals: 20
 * tensors; rejected: attn.to_out (one member)". "blocks: none" when every
 * tensor is in globals; no "rejected" part when nothing was rejected. */
size_t arena_plan_report_line(const arena_plan_report *r, char *buf, size_t len);

#endif
