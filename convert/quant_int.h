/* quant_int.h - what quant.c and quant_int4.c share: source kinds, element loads, kernel choice, threads.
 *
 * quant.c holds the fused block kernels, amax, the thread splitter and the
 * public calls (runs, byte ranges, dequantization, casts, compressed-tensors
 * recognition); quant_int4.c the int4 schemes' group kernels and their
 * drivers, which quant.c's calls hand int4 plans to. Not installed; the API
 * is quant.h. */
#ifndef ARENA_CONVERT_QUANT_INT_H
#define ARENA_CONVERT_QUANT_INT_H

#include <stdint.h>
#include <string.h>

#include "../formats/elem.h"
#include "quant.h"

#define MAX_THREADS 64

#if defined(__GNUC__)
#define INLINE static inline __attribute__((always_inline))
#else
#define INLINE static inline
#endif

#if defined(__x86_64__) && defined(__GNUC__)
#define HAVE_AVX2_KERNELS 1 /* every kernel is built a second time for AVX2 */
#endif

/* Source kinds and operations; kernels are specialized on both. */
enum { SK_BF16, SK_F16, SK_F32, SK_E4M3, SK_E5M2, SK_I8 };
enum { OP_F32, OP_BF16, OP_F16, OP_E4M3, OP_E5M2, OP_E4M3_SCALED, OP_I8_SCALED, OP_DEQ };

static const unsigned sk_size[] = {2, 2, 4, 1, 1, 1};

/* Element i of kind sk at s, widened exactly to f32 (formats/elem.h's rules,
 * always inlined into the kernels). */
INLINE float load(int sk, const unsigned char *s, size_t i)
{
	uint16_t h;
	float f;
	switch (sk) {
	case SK_BF16:
		memcpy(&h, s + 2 * i, 2);
		return arena__bf16_to_f32(h);
	case SK_F16:
		memcpy(&h, s + 2 * i, 2);
		return arena__f16_to_f32(h);
	case SK_F32:
		memcpy(&f, s + 4 * i, 4);
		return f;
	case SK_E4M3:
		return arena__e4m3_to_f32(s[i]);
	case SK_E5M2:
		return arena__e5m2_to_f32(s[i]);
	default:
		return (float)(int8_t)s[i];
	}
}

/* convert(sk, op, d, s, n, scale): run kernel (sk, op) over n elements;
 * returns -1 for a pair not built. Made twice (quant.c): for the baseline ISA
 * and, on x86-64, for AVX2 (chosen at run time: arena__quant_pick_convert).
 * Both are the same C: integer operations and IEEE f32 operations with no
 * contraction (ISO C mode), so they give the same bits. */
typedef int (*convert_fn)(int sk, int op, void *d, const void *s, uint64_t n, float scale);

/* The converters for this CPU; ARENA_QUANT_ISA=baseline forces the baseline
 * ones (tests compare both). */
convert_fn arena__quant_pick_convert(void);

/* Whether cv is the AVX2 build of the converters: the other kernels (amax,
 * int4 groups) go with the converters picked. */
int arena__quant_is_avx2(convert_fn cv);

/* ---- int4 groups (quant_int4.c) ---- */

typedef struct int4_group {
	uint32_t sbits; /* the scale as stored: BF16 or F16 bits (the low 16), F32 bits */
	uint32_t z;     /* the zero point */
	int finite;     /* 0: the group holds a NaN or an infinity, or hi - lo overflows */
} int4_group;

/* Groups [g, g + count) of row r of p's source (src: row 0), g + count <=
 * p->groups: their results into out[], and with q their codes from q on (the
 * groups' bytes, one after the other). Returns the index (from g) of the
 * first group holding a NaN or an infinity, or count. Built twice like the
 * converters (baseline and, on x86-64, AVX2), each specialized on the source
 * kind and the group size; a row's whole groups take the size as a constant. */
typedef uint64_t (*int4_fn)(const arena_quant_plan *p, int sk, const unsigned char *src, uint64_t r, uint64_t g,
			    uint64_t count, int4_group *out, unsigned char *q);

/* ---- threads ---- */

typedef struct task task;
/* Do units [first, first + count) of t; `slot` is the worker's index. */
typedef void (*task_fn)(task *t, uint64_t first, uint64_t count, unsigned slot);

struct task {
	task_fn fn;
	convert_fn cv;             /* the kernels (arena__quant_pick_convert) */
	int sk, op;                /* kernel for element and row tasks */
	float scale, div;          /* OP_*_SCALED / OP_DEQ scale; row scale divisor */
	uint64_t cols;             /* elements per unit (row tasks) */
	const unsigned char *src;  /* unit 0 */
	const unsigned char *src2; /* row scales (dequant) */
	unsigned char *dst;        /* unit 0 of the first output */
	unsigned char *dst2;       /* unit 0 of the row scales */
	const arena_quant_plan *p; /* int4 tasks: the plan; */
	int4_fn i4;                /* their kernels; */
	const unsigned char *src3; /* their zero points (dequant); */
	unsigned char *dst3;       /* and unit 0 of the zero points */
	float partial[MAX_THREADS];
	uint64_t bad[MAX_THREADS]; /* int4: the worker's first group refused (row x groups + group), or UINT64_MAX */
};

/* Split units into contiguous ranges, one per worker; the calling thread
 * does the first. Returns the number of workers used. */
unsigned arena__quant_parallel(task *t, uint64_t units, uint64_t unit_elems, unsigned threads);

/* ---- the int4 drivers (quant_int4.c), called by quant.c's public calls
 * with an int4 plan (p->group != 0) and its source kind sk ---- */

/* arena_quant_run_part's units [first, first + count) (rows) of source s
 * (row `first` at s); a group that has no codes is refused naming it. */
int arena__quant_int4_run(const arena_quant_plan *p, int sk, const unsigned char *s, uint64_t first, uint64_t count,
			  void *const dst[], unsigned threads);

/* arena_quant_fill's bytes [off, off + len) of component comp from the whole
 * source src. */
int arena__quant_int4_fill(const arena_quant_plan *p, int sk, const unsigned char *src, uint32_t comp, uint64_t off,
			   uint64_t len, unsigned char *d);

/* arena_quant_dequant_f32: (q - z) x scale of every element as f32. */
void arena__quant_int4_dequant(const arena_quant_plan *p, int sk, const void *const src[], float *dst,
			       unsigned threads);

#endif
