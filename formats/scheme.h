/* scheme.h - storage schemes as the image format knows them: each scheme's
 * name and the components it stores a tensor as (docs/QUANT.md). The
 * arithmetic that fills the components is convert/quant.h's.
 *
 * A scheme turns a source tensor (dtype + shape) into one or two components,
 * each an ordinary dtype + shape + bytes that the image and the movers treat
 * as opaque byte ranges (DESIGN.md, "Opaque storage"):
 *
 *   scheme            sources               components (in this order)
 *   none              any whole-byte dtype  data    <src dtype>  <shape>
 *   bf16              BF16 F16 F32          data    BF16         <shape>
 *   fp8-e4m3          BF16 F16 F32 F8_E4M3  qdata   F8_E4M3      <shape>
 *   fp8-e4m3-tensor   BF16 F16 F32 (F8_E4M3*) qdata F8_E4M3      <shape>
 *                                           scale   F32          [1]
 *   fp8-e4m3-row      BF16 F16 F32 (F8_E4M3*) qdata F8_E4M3      <shape>
 *                                           scale   F32          [rows, 1, ...]
 *   int8-row          BF16 F16 F32          qdata   I8           <shape>
 *                                           scale   F32          [rows, 1, ...]
 *   fp8-e5m2          BF16 F16 F32 F8_E5M2  qdata   F8_E5M2      <shape>
 *   int4-g32, -g64,   BF16 F16 F32          qdata   U8           [rows, ceil(cols / 2)]
 *   -g128                                   scale   <src dtype>  [rows, groups]
 *                                           zero    U8           [rows, groups]
 *
 * int4-gN: each row's columns in groups of N (the last one of a row shorter
 * when N does not divide cols), groups = ceil(cols / N); a group's values are
 * codes q in [0, 15], two a byte (the even column in the low nibble, the odd
 * one in the high nibble; a row of odd cols ends with a high nibble of 0),
 * with one scale (in the source's dtype) and one zero point z in [0, 15]:
 * value = (q - z) x scale. rows = shape[0] for rank >= 2, else 1 (a vector
 * is one row); cols = the product of the other dims (the whole vector).
 *
 * Row schemes need rank >= 2: rows = shape[0] (the output dimension of a
 * weight), cols = the product of the other dims; the scale has the source's
 * rank with every dim but the first equal to 1, so `qdata * scale` broadcasts
 * in torch/numpy (for a [out, in] weight: [out, 1]). A source of the target's
 * own dtype (bf16 from BF16, fp8-e4m3 from F8_E4M3, fp8-e5m2 from F8_E5M2) is
 * copied. (F8_E4M3*): an already-quantized source (compressed-tensors,
 * below) is planned by arena_quant_plan_prequant, not arena_quant_plan_init:
 * its qdata is copied and its scale comes from a second tensor.
 *
 * Why this table is in formats/ and not in convert/quant: it is a rule of the
 * image format. A manifest entry is well formed only when its components are
 * exactly those its scheme makes of its dtype and shape, and formats/image.c
 * checks that when an image is opened, before any data is read, so that every
 * reader (verify, export, inspect, load) gets the check from the one open.
 * formats/ must not depend on convert/; a validation callback passed into the
 * open would leave any opener that forgot it unchecked, so the pure table
 * (names, components, shapes, byte counts: no kernels, no threads, no
 * allocation) lives here and convert/quant.h builds its conversions on it.
 */
#ifndef ARENA_FORMATS_SCHEME_H
#define ARENA_FORMATS_SCHEME_H

#include <stddef.h>
#include <stdint.h>

#include "dtype.h"
#include "layout.h"

/* X(ENUM, "name"); the enum values are not stored anywhere (manifests use
 * the names), but append new schemes at the end anyway. */
#define ARENA_QUANT_SCHEMES(X)                    \
	X(NONE, "none")                           \
	X(BF16, "bf16")                           \
	X(FP8_E4M3, "fp8-e4m3")                   \
	X(FP8_E4M3_TENSOR, "fp8-e4m3-tensor")     \
	X(FP8_E4M3_ROW, "fp8-e4m3-row")           \
	X(INT8_ROW, "int8-row")                   \
	X(FP8_E5M2, "fp8-e5m2")                   \
	X(INT4_G32, "int4-g32")                   \
	X(INT4_G64, "int4-g64")                   \
	X(INT4_G128, "int4-g128")

typedef enum arena_quant_scheme {
#define ARENA__QS_ENUM(e, n) ARENA_QUANT_##e,
	ARENA_QUANT_SCHEMES(ARENA__QS_ENUM)
#undef ARENA__QS_ENUM
	ARENA_QUANT_COUNT
} arena_quant_scheme;

#define ARENA_QUANT_MAX_RANK 8
#define ARENA_QUANT_MAX_COMPONENTS 3

/* Find the scheme called `name` ("fp8-e4m3-row"): 0, or QUANT_UNKNOWN_SCHEME
 * with a message listing the known names. `name` NULL is USAGE. */
int arena_quant_from_name(const char *name, arena_quant_scheme *out);
/* "fp8-e4m3-row"; "?" for a value outside the enum. */
const char *arena_quant_name(arena_quant_scheme s);

/* Scaled schemes (a scale component beside qdata): fp8-e4m3-tensor,
 * fp8-e4m3-row, int8-row and the int4 ones; of those, the row schemes (one
 * F32 scale per row: fp8-e4m3-row, int8-row). */
int arena_quant_is_scaled(arena_quant_scheme s);
int arena_quant_is_row(arena_quant_scheme s);
/* The group size of an int4 scheme (32, 64, 128); 0 for the others. */
unsigned arena_quant_group(arena_quant_scheme s);

typedef struct arena_quant_component {
	const char *name;  /* "data", "qdata", "scale" or "zero"; static storage */
	arena_dtype dtype;
	uint32_t rank;
	uint64_t shape[ARENA_QUANT_MAX_RANK];
	uint64_t nelem;
	uint64_t nbytes;
} arena_quant_component;

/* What arena_quant_plan_init decided; plain data, no resources: copy it,
 * keep it, no release needed. */
typedef struct arena_quant_plan {
	arena_quant_scheme scheme;
	arena_dtype src_dtype;   /* the original (logical) dtype and shape */
	uint32_t rank;
	uint64_t shape[ARENA_QUANT_MAX_RANK];
	uint64_t nelem;
	uint64_t src_nbytes;     /* bytes the source holds */
	uint64_t rows, cols;     /* row and int4 schemes: rows and the elements of a row
				  * (above); else 1, nelem */
	uint64_t group, groups;  /* int4: elements a group, groups a row; else 0 */
	int prequantized;        /* from arena_quant_plan_prequant: use run_scaled */
	size_t n_comps;
	arena_quant_component comps[ARENA_QUANT_MAX_COMPONENTS];
} arena_quant_plan;

/* Decide how a tensor of dtype `src`, rank `rank` and dims `shape` (may be
 * NULL when rank is 0) is stored under `scheme`, and describe its components.
 * `label` (the tensor's name; may be NULL) starts the error message.
 * Returns 0, or (nothing written to *out then):
 *   QUANT_UNKNOWN_SCHEME  `scheme` outside the enum;
 *   QUANT_NOT_APPLICABLE  the source dtype is not one the scheme takes (table
 *                         above: integer, F64, F8_E4M3 for a scaled scheme
 *                         (it needs its scale: arena_quant_plan_prequant),
 *                         other FP8, sub-byte ...), a row
 *                         scheme on rank < 2, a scaled (int4 included)
 *                         scheme on an empty
 *                         tensor (0 rows or 0 columns: there is no amax), rank
 *                         over ARENA_QUANT_MAX_RANK, or a byte count that
 *                         overflows 64 bits or is not whole;
 *   USAGE                 `out` NULL, or `shape` NULL with rank > 0.
 * An empty tensor is fine for the unscaled schemes (components of 0 bytes). */
int arena_quant_plan_init(arena_quant_plan *out, arena_quant_scheme scheme, arena_dtype src,
			  uint32_t rank, const uint64_t *shape, const char *label);

/* Plan an already-quantized tensor: F8_E4M3 data of rank `rank` and dims
 * `shape` whose scale is a separate tensor (compressed-tensors). `scheme` is
 * FP8_E4M3_TENSOR or FP8_E4M3_ROW (as arena_quant_ct_classify says); the
 * components are the same as arena_quant_plan_init's for a BF16 source, and
 * src_dtype is F8_E4M3. Errors as arena_quant_plan_init (another scheme is
 * QUANT_NOT_APPLICABLE). */
int arena_quant_plan_prequant(arena_quant_plan *out, arena_quant_scheme scheme, uint32_t rank,
			      const uint64_t *shape, const char *label);

/* ---- layouts (formats/layout.h) -------------------------------------------- */

/* Set t->scheme and t->n_comp / t->comp[] (name, dtype, rank, shape, bytes;
 * offsets are left to placement) from the plan. t's own name, dtype and shape
 * are not touched (they are the original ones, as in the plan). Returns 0, or
 * USAGE (NULL). */
int arena_quant_describe(const arena_quant_plan *p, arena_tensor *t);

/* The plan of a tensor read from an image's manifest (a torch-subclass
 * tensor: arena_subclass_check, and a plan of scheme NONE with no
 * components, whose bytes are nobody's to compute): re-plans t->scheme for
 * t->dtype and t->shape (F8_E4M3 with a scaled scheme: a prequantized plan)
 * and checks that t's components are exactly the plan's (count, order,
 * names, dtypes, shapes, bytes). Returns 0, or IMG_MANIFEST_BAD with a
 * message "tensor '<name>': <the first rule broken>" (an unknown scheme name,
 * a dtype the scheme does not take, a component missing, extra, renamed,
 * swapped or of another dtype, shape or size); the caller adds the file.
 * formats/image.c calls it for every tensor of every image it opens. */
int arena_quant_plan_from_tensor(const arena_tensor *t, arena_quant_plan *out);

/* ---- tensor subclasses (format 1.3) ------------------------------------------ */

/* The scheme of a tensor stored as the inner tensors of a PyTorch tensor
 * subclass (torchao's, optimum-quanto's: docs/QUANT.md, "Tensor subclasses"):
 * its components are the subclass's plain tensors under their attribute
 * names, and the manifest entry's "subclass" object says how the library
 * rebuilds the tensor from them. The format does not interpret either: it
 * checks their form (arena_subclass_check), streams the bytes and hands them
 * out. Images holding one set ARENA_IMG_FLAG_SUBCLASS (a required feature). */
#define ARENA_SCHEME_SUBCLASS "torch-subclass"

/* A torch-subclass tensor is well formed: 1 to ARENA_MAX_COMPONENTS
 * components of any dtype and shape with distinct names of 1 to 15
 * characters from [A-Za-z0-9_.], and its "subclass" object present (the
 * caller parsed it: t->subclass not NULL). Returns 0, or IMG_MANIFEST_BAD
 * "tensor '<name>': <rule broken>". */
int arena_subclass_check(const arena_tensor *t);

/* ---- dequantization (formats/dequant.h) ----------------------------------------- */

/* The job that writes the values of t (a tensor of a checked layout) in its
 * original dtype to dst from its block's bytes at `block` (its components
 * at block + comp[i].offset). Returns 0, or USAGE naming the tensor when it
 * is stored as is (none: "view its bytes instead"), under an unknown scheme,
 * or its stored and original dtypes are not a dequantization (an 8-bit
 * original, say). */
struct arena_dequant_job;
int arena_quant_dequant_job(const arena_tensor *t, const void *block, void *dst, struct arena_dequant_job *j);

#endif
