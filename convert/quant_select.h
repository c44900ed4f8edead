/* quant_select.h - which tensors `arena convert --quant` quantizes, and the
 * glue between the plan/convert machinery and convert/quant.
 *
 * Default selection: floating tensors of rank 2 named "*.weight" inside a
 * block (not globals), whose module is not a norm or an embedding (the last
 * module segment contains neither "norm" nor "embed"). --quant-include GLOB
 * adds tensors, --quant-exclude GLOB removes them (fnmatch globs on the full
 * name, repeatable). A tensor matched by both is a usage error, as is a glob
 * that matches no tensor, and a selected tensor the scheme cannot apply to
 * (QUANT_NOT_APPLICABLE): all before anything is written.
 *
 * Already-quantized compressed-tensors pairs (`<name>` F8_E4M3 +
 * `<name>_scale`) are always kept as their scheme, never re-quantized.
 *
 * A selected tensor whose exported names (export.h) would clash is refused
 * (DUPLICATE_TENSOR, naming both tensors), before anything is written: a
 * scale exported as `<name>_scale` where another tensor has that name, or an
 * F8_E4M3 result next to an unrelated `<name>_scale` that would read back as
 * its compressed-tensors scale. */
#ifndef ARENA_CONVERT_QUANT_SELECT_H
#define ARENA_CONVERT_QUANT_SELECT_H

#include <stddef.h>

#include "../formats/checkpoint.h"
#include "../formats/layout.h"
#include "plan.h"
#include "quant.h"
#include "subclass.h"

typedef struct arena_quant_opts {
	const char *scheme; /* NULL or "none" = no quantization */
	const char *const *include;
	size_t n_include;
	const char *const *exclude;
	size_t n_exclude;
} arena_quant_opts;

/* Per-tensor state for filling quantized components. */
typedef struct arena_quant_state {
	size_t n;                 /* = layout's n_tensors */
	arena_quant_plan *plans;  /* indexed like layout->tensors; scheme NONE = plain */
	arena_quant_input *in;
	const arena_st_tensor **scale_src; /* prequantized plans: the scale tensor read, else NULL */
} arena_quant_state;

/* Set up `po` (choose callback) for `qo`; `ctx` must outlive the plan build.
 * Checks the scheme name and globs (QUANT_UNKNOWN_SCHEME, USAGE). */
typedef struct arena_quant_ctx {
	const arena_quant_opts *o;
	arena_quant_scheme scheme;
	unsigned char *inc_used, *exc_used; /* which globs matched something */
	arena_subclass_set *sub; /* convert: tensor subclasses, each planned as one torch-subclass tensor; or NULL */
} arena_quant_ctx;
int arena_quant_select_init(arena_quant_ctx *ctx, const arena_quant_opts *qo, arena_plan_opts *po);
/* After the plan: every glob matched a tensor? (USAGE otherwise). Frees ctx. */
int arena_quant_select_finish(arena_quant_ctx *ctx);
void arena_quant_select_free(arena_quant_ctx *ctx);

/* The default rule alone (exposed for tests). */
int arena_quant_default_selects(const char *name, arena_dtype dt, uint32_t rank, int in_block);

/* Plans and inputs for every non-"none" tensor of a placed layout built from
 * `ck` (sources must be mapped), with the whole-tensor scans done (read
 * with pread). A source from a header alone (arena_st_parse_header) gets
 * in[i].data NULL and no scan: its caller sets both once it has the bytes
 * (convert/writer.c). */
int arena_quant_state_init(arena_quant_state *qs, const arena_layout *l, const arena_ckpt *ck);
void arena_quant_state_free(arena_quant_state *qs);
/* Bytes [off, off+len) of component `comp` of t (one of l's tensors), from
 * the state built for l, read through the files' mappings under a guard
 * (common/mapguard.h): a file cut since it was opened is INPUT_CHANGED. */
int arena_quant_state_fill(arena_quant_state *qs, const arena_layout *l, const arena_tensor *t, uint32_t comp, uint64_t off,
			   uint64_t len, uint8_t *dst);

#endif
