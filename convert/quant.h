/* quant.h - storage schemes: how a tensor's values are laid out in a slab.
 * The schemes' names, plans and components (the table below) are
 * formats/scheme.h's, a rule of the image format; this is their arithmetic.
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
 * Row schemes need rank >= 2: rows = shape[0] (the output dimension of a
 * weight), cols = the product of the other dims; the scale has the source's
 * rank with every dim but the first equal to 1, so `qdata * scale` broadcasts
 * in torch/numpy (for a [out, in] weight: [out, 1]). A source of the target's
 * own dtype (bf16 from BF16, fp8-e4m3 from F8_E4M3, fp8-e5m2 from F8_E5M2) is
 * copied. (F8_E4M3*): an already-quantized source (compressed-tensors,
 * below) is planned by arena_quant_plan_prequant, not arena_quant_plan_init:
 * its qdata is copied and its scale comes from a second tensor.
 *
 * Arithmetic, bit-identical to torch (checked against
 * fixtures/quant_reference.safetensors, written by torch): sources are widened
 * exactly to f32, all arithmetic is f32 with round to nearest even.
 *   bf16:            RNE; NaN becomes 0x7FC0 (torch's c10 rule).
 *   fp8-e4m3:        cast(clamp(x, -448, 448)).
 *   fp8-e5m2:        cast(clamp(x, -57344, 57344)); so +-inf become +-57344.
 *   fp8-e4m3-tensor: scale = max(amax(|x|) / 448, 1e-12);
 *                    q = cast(clamp(x / scale, -448, 448)).
 *   fp8-e4m3-row:    per row: scale = max(amax(|row|) / 448, 1e-12); q as above.
 *   int8-row:        per row: scale = max(amax(|row|) / 127, 1e-12);
 *                    q = clamp(round_half_even(x / scale), -127, 127).
 *   int4-gN:         per row, per group of N columns (the last one of a row
 *                    shorter): lo = min(0, min x), hi = max(0, max x);
 *                    scale = round_to_src_dtype((hi - lo) / 15); d = scale, or 1
 *                    where scale is 0; z = clamp(round_half_even(-lo / d), 0, 15);
 *                    q = clamp(round_half_even(x / d) + z, 0, 15), two a byte, the
 *                    even column in the low nibble; value = (q - z) * scale. A
 *                    group holding a NaN or an infinity, or whose hi - lo
 *                    overflows f32, is refused (QUANT_NOT_APPLICABLE naming its
 *                    row, columns and group; the components are then partly
 *                    written). rows = shape[0] for rank >= 2, else 1.
 * x / scale is a true f32 division (not x * (1/scale)), as torch computes it.
 * The tensor scale's 1e-12 floor is ours (torch's rule is amax / 448, which
 * makes an all-zero tensor all NaN); it changes nothing unless amax < 4.5e-10.
 * NaN: the casts keep NaN as NaN with its sign (FP8 0x7F / 0xFF, F16 0x7E00
 * with the sign); amax propagates NaN, so a row (or a tensor) that holds a NaN
 * gets a NaN scale (always 0x7FC00000) and all-NaN FP8 values, as in torch;
 * for int8 a NaN quotient becomes 0 (torch leaves the cast of NaN to int8
 * undefined). Subnormal inputs and results are exact (no flush to zero).
 *
 * Compressed-tensors checkpoints (vLLM, llm-compressor): a tensor `<name>`
 * of dtype F8_E4M3 with a tensor `<name>_scale` is already quantized; see
 * arena_quant_ct_classify. Such a pair is stored as fp8-e4m3-tensor or
 * fp8-e4m3-row with the F8_E4M3 source dtype (arena_quant_plan_prequant),
 * qdata copied and scale widened exactly to F32 (arena_quant_run_scaled).
 *
 * The element rules (widenings, roundings, the int4 codes) are
 * formats/elem.h's, shared with the dequantization kernels; this file holds
 * the conversion driver: the kernels over blocks, threads, tensor walks.
 *
 * Use, whole tensors (loading a safetensors file straight into slabs):
 *   arena_quant_plan p;
 *   if ((rc = arena_quant_plan_init(&p, scheme, t->dtype, t->rank, t->shape, t->name)))
 *           return rc;                      // nothing written yet
 *   ... place p.comps[i] (p.comps[i].nbytes bytes each, 256-aligned) ...
 *   rc = arena_quant_run(&p, arena_st_data(t), dst, 0);  // dst[i] -> component i
 * or byte ranges of components, in any order (arena convert's chunks):
 *   arena_quant_describe(&p, layout_tensor);    // scheme and components
 *   arena_quant_input in = {.data = arena_st_data(t)};
 *   arena_quant_scan(&p, &in, 0);               // once per tensor, keep `in`
 *   arena_quant_fill(&p, &in, comp, off, len, chunk + pos);
 *
 * Kernels: branch-free C that gcc -O2 vectorizes, built twice on x86-64
 * (baseline SSE2 and AVX2, picked at run time; ARENA_QUANT_ISA=baseline in
 * the environment forces the baseline ones). Both give the same bits.
 *
 * Threads: every function is safe to call from several threads at once (no
 * global state). `threads` = 0 means one per available core; a call never
 * uses more threads than its tensor has 1 Mi-element pieces, so small tensors
 * run on the calling thread (convert many small tensors concurrently instead).
 * Results never depend on the thread count. No function allocates memory
 * (beyond the stacks of the threads it starts); if a thread cannot be started
 * its share runs on the calling thread.
 *
 * Pointers: sources and destinations need no particular alignment; source
 * and destination must not overlap.
 */
#ifndef ARENA_CONVERT_QUANT_H
#define ARENA_CONVERT_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "../formats/checkpoint.h"
#include "../formats/dtype.h"
#include "../formats/layout.h"
#include "../formats/scheme.h"

#define ARENA_QUANT_E4M3_MAX 448.0f
#define ARENA_QUANT_E5M2_MAX 57344.0f
#define ARENA_QUANT_INT8_MAX 127.0f
#define ARENA_QUANT_MIN_SCALE 1e-12f

/* Schemes, their names, plans and components: formats/scheme.h. */

/* Convert the source bytes `src` (p->src_nbytes of them: a mapped
 * safetensors tensor, say) straight into the component buffers dst[0 ..
 * p->n_comps) (dst[i] holds p->comps[i].nbytes bytes, typically slab memory).
 * Nothing else is written, no full-size intermediate is made: the tensor
 * scheme reads the source twice (amax, then cast), row schemes once per row
 * plus a re-read of the row from cache. Returns 0, or USAGE when p, src or a
 * dst is NULL (with bytes to write) or p is prequantized. */
int arena_quant_run(const arena_quant_plan *p, const void *src, void *const dst[], unsigned threads);

/* Streaming form of arena_quant_run, for sources read in pieces: convert
 * units [first, first + count) where a unit is a row (p->cols elements) for
 * row and int4 schemes and one element otherwise; `src` points at the first unit's
 * bytes, dst[] are the component buffers' starts (as for arena_quant_run: the
 * units are written at their own offsets). For fp8-e4m3-tensor pass
 * `tensor_scale` = arena_quant_tensor_scale(amax over the whole tensor) (the
 * scale component is written by every call); it is ignored otherwise.
 * Returns 0, or USAGE (NULL pointers, units out of range, prequantized plan,
 * a sub-byte `none` source with first or count not whole bytes), or for int4
 * QUANT_NOT_APPLICABLE (a group refused: the first one, whatever the thread
 * count). */
int arena_quant_run_part(const arena_quant_plan *p, const void *src, uint64_t first, uint64_t count,
			 float tensor_scale, void *const dst[], unsigned threads);

/* ---- byte ranges (arena convert's chunk filler) ---------------------------
 *
 * A converter that builds its output in chunks asks for any byte range of any
 * component. What a plan reads: */
typedef struct arena_quant_input {
	const void *data;        /* the source tensor's bytes (p->src_nbytes), e.g. arena_st_data() */
	float tensor_scale;      /* fp8-e4m3-tensor from a wide source: set by arena_quant_scan */
	const void *scale;       /* prequantized plans: the `<name>_scale` tensor's bytes */
	arena_dtype scale_dtype; /* and its dtype: F32, BF16 or F16 */
} arena_quant_input;

/* The pass that must see the whole tensor before any byte can be made: for
 * fp8-e4m3-tensor from a wide source, sets in->tensor_scale from in->data
 * (amax over all of it); nothing for the other plans. Call once per tensor
 * (keep `in` with the tensor), before arena_quant_fill. Returns 0, or USAGE
 * (NULL pointers). */
int arena_quant_scan(const arena_quant_plan *p, arena_quant_input *in, unsigned threads);
/* 1 when arena_quant_scan has work for p (fp8-e4m3-tensor from a wide
 * source), else 0. A caller that reads the source itself sets
 * in->tensor_scale = arena_quant_tensor_scale(amax over all of it), in
 * pieces merged with arena_quant_amax_merge: the same value. */
int arena_quant_scan_needed(const arena_quant_plan *p);

/* Write bytes [off, off + len) of component `comp` to dst (dst[0] is byte
 * `off`), computed from `in` alone: any range, in any order, from any number
 * of threads at once (each call runs on the calling thread). A range that
 * starts or ends inside a row recomputes that row's scale (one extra read of
 * the row; for int4, a group's, a group at a time). The bytes are those
 * arena_quant_run writes. Returns 0, or USAGE (NULL pointers, comp or range
 * out of bounds, a prequantized plan without in->scale or with another scale
 * dtype), or for int4 QUANT_NOT_APPLICABLE (a group the range touches is
 * refused; the message names it). */
int arena_quant_fill(const arena_quant_plan *p, const arena_quant_input *in, uint32_t comp, uint64_t off,
		     uint64_t len, void *dst);

/* amax(|x|) of n values of dtype `dt` (BF16, F16, F32) at `src`, as f32; the
 * quiet NaN 0x7FC00000 if any is NaN (whatever its payload). Combine pieces
 * with arena_quant_amax_merge. Returns 0, or USAGE for another dtype or NULL
 * pointers (n > 0). n = 0 gives 0. */
int arena_quant_amax(arena_dtype dt, const void *src, uint64_t n, unsigned threads, float *out);
/* max of two amax values; NaN (0x7FC00000) if either is NaN. */
float arena_quant_amax_merge(float a, float b);
/* The fp8-e4m3-tensor scale for an amax: max(amax / 448, 1e-12) in f32. */
float arena_quant_tensor_scale(float amax);

/* Fill the components of a prequantized plan (p->prequantized): qdata is a
 * copy of the F8_E4M3 bytes at `qsrc`, scale is the p->comps[1].nelem values
 * of dtype `scale_dtype` (F32, BF16 or F16) at `scale_src`, widened exactly to
 * F32 (ordered as in the source: [out], [out, 1] and [out, 1, ...] are the
 * same bytes). Returns 0, or USAGE (not a prequantized plan, another scale
 * dtype, NULL pointers). */
int arena_quant_run_scaled(const arena_quant_plan *p, const void *qsrc, arena_dtype scale_dtype,
			   const void *scale_src, void *const dst[], unsigned threads);

/* The tensor's values as f32 (p->nelem of them, source order) from its
 * components src[0 .. p->n_comps): q * scale for the scaled schemes (one f32
 * multiply; int4: (q - z) * scale), widened values otherwise. For `none` the source dtype must be
 * F32, BF16, F16, F8_E4M3 or F8_E5M2 (QUANT_NOT_APPLICABLE otherwise). USAGE
 * for NULL pointers (with values to write). */
int arena_quant_dequant_f32(const arena_quant_plan *p, const void *const src[], float *dst, unsigned threads);

/* Element-wise cast of n values: sources F32, BF16, F16, F8_E4M3, F8_E5M2;
 * targets F32, BF16, F16, F8_E4M3, F8_E5M2. Same rules as the schemes: RNE;
 * FP8 targets saturate (clamp to +-max first, NaN stays NaN); F16 does not
 * (past 65520 becomes inf, as torch's .to(float16)). Same dtype = copy.
 * Returns 0, QUANT_NOT_APPLICABLE for another pair, USAGE for NULL (n > 0). */
int arena_quant_cast(arena_dtype dst_dt, void *dst, arena_dtype src_dt, const void *src, uint64_t n,
		     unsigned threads);

/* ---- compressed-tensors (already-quantized) checkpoints -------------------
 *
 * The convention (vLLM, llm-compressor, AutoFP8): `<name>` holds F8_E4M3 data
 * and `<name>_scale` its dequantization scale (value = q * scale), one value
 * for the tensor or one per output row. Recognized pairs, checked in order:
 *   1. q is F8_E4M3 and the scale is F32, BF16 or F16 (otherwise: not a pair);
 *   2. the scale holds exactly one value ([], [1], [1, 1], ...)
 *      -> fp8-e4m3-tensor;
 *   3. q has rank >= 2, the scale is [rows] or [rows, 1, ..., 1] with at most
 *      q's rank dims, rows = q.shape[0] -> fp8-e4m3-row.
 * Anything else (per-group or block scales, [rows, 2], mismatched rows, a
 * scale over an empty tensor) is not recognized: the two tensors are then
 * ordinary tensors, stored as they are by `none`, so nothing is lost; `why`
 * says why, so that convert can warn. */

/* Classify the pair (q, s). Returns the scheme (FP8_E4M3_TENSOR or
 * FP8_E4M3_ROW) or ARENA_QUANT_NONE when it is not a recognized pair; then
 * *why (if why is not NULL) is a static one-line reason ("scale dtype I32 is
 * not F32, BF16 or F16"), else NULL. Pure: no error state is touched. */
arena_quant_scheme arena_quant_ct_classify(arena_dtype q_dtype, uint32_t q_rank, const uint64_t *q_shape,
					   arena_dtype s_dtype, uint32_t s_rank, const uint64_t *s_shape,
					   const char **why);

/* Look up `<name>` and `<name>_scale` in `c` and classify them. Returns the
 * scheme, with *scale_out (may be NULL) the scale tensor, borrowed from c; or
 * ARENA_QUANT_NONE (and *scale_out NULL) when `<name>` is absent, has no
 * `<name>_scale`, or the pair is not recognized (*why as above; NULL when
 * there was no pair at all). Pure; names over 1000 bytes never match (no
 * allocation). Other tensors of the convention (`<module>.input_scale`,
 * activation scales) are not pairs and stay ordinary tensors. */
arena_quant_scheme arena_quant_ct_match(const arena_ckpt *c, const char *name, const arena_st_tensor **scale_out,
					const char **why);

/* 1 if `name` is "<base>_scale" and arena_quant_ct_match(c, base) recognizes
 * the pair: the tensor is then a component of <base>, not a tensor of its own
 * (convert skips it). 0 otherwise. */
int arena_quant_ct_is_scale(const arena_ckpt *c, const char *name);

#endif
