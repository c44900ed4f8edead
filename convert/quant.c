/* quant.c - storage schemes' conversions: fused kernels, amax, threads, runs, ranges, casts; see quant.h.
 *
 * Sections: fused block kernels (over formats/elem.h's element rules), the
 * thread splitter, runs, byte ranges, dequantization, casts,
 * compressed-tensors recognition. The int4 schemes' group kernels and their
 * drivers are quant_int4.c's (what the two share: quant_int.h).
 *
 * Vectorization: gcc -O2 uses the "very cheap" cost model, which vectorizes a
 * loop only when no scalar epilogue is needed. The kernels therefore work on
 * blocks of BLK elements (a constant trip count) and handle the last partial
 * block with the same code and a variable count (scalar, at most BLK - 1
 * elements). Each kernel is a specialization, made by always_inline with a
 * constant source kind and operation, of one loop: load (memcpy from an
 * unaligned byte pointer, widened exactly to f32), operate, store. */
#include "quant_int.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common/err.h"

#define E(name) ARENA_E(name)

#define BLK 1024                    /* elements per kernel block */
#define PIECE ((uint64_t)1 << 20) /* least elements worth a thread (~0.3 ms of work) */

/* The element rules (exact widenings, roundings, bit casts) are
 * formats/elem.h's, always inlined into the kernels below (loads: quant_int.h's
 * load). */

/* ---- fused kernels ----------------------------------------------------------- */

static const unsigned op_size[] = {4, 2, 2, 1, 1, 1, 1, 4};

/* The output of `op` for x, as 32 bits: the code in the low bits, or the
 * f32's bits. */
INLINE uint32_t compute(int op, float x, float scale)
{
	switch (op) {
	case OP_F32:
		return arena__bits_of(x);
	case OP_BF16:
		return arena__f32_to_bf16(x);
	case OP_F16:
		return arena__f32_to_f16(x);
	case OP_E4M3:
		return arena__f32_to_e4m3_sat(x);
	case OP_E5M2:
		return arena__f32_to_e5m2_sat(x);
	case OP_E4M3_SCALED:
		return arena__f32_to_e4m3_sat(x / scale);
	case OP_I8_SCALED:
		return arena__f32_to_i8_sat(x / scale);
	default: /* OP_DEQ */
		return arena__bits_of(x * scale);
	}
}

/* One block: compute n <= BLK results into 32-bit lanes, then narrow them.
 * Narrowing in its own loop matters: in one loop gcc "demotes" the selects
 * to 8-bit lanes and spends most of its time shuffling. */
INLINE void kern_n(int sk, int op, unsigned char *restrict d, const unsigned char *restrict s, size_t n, float scale)
{
	uint32_t t[BLK];
	for (size_t i = 0; i < n; i++)
		t[i] = compute(op, load(sk, s, i), scale);
	switch (op_size[op]) {
	case 1:
		for (size_t i = 0; i < n; i++)
			d[i] = (unsigned char)t[i];
		break;
	case 2:
		for (size_t i = 0; i < n; i++) {
			uint16_t h = (uint16_t)t[i];
			memcpy(d + 2 * i, &h, 2);
		}
		break;
	default:
		memcpy(d, t, 4 * n);
		break;
	}
}

INLINE void kern(int sk, int op, unsigned char *restrict d, const unsigned char *restrict s, uint64_t n, float scale)
{
	const size_t ss = sk_size[sk], ds = op_size[op];
	uint64_t i = 0;
	for (; i + BLK <= n; i += BLK)
		kern_n(sk, op, d + i * ds, s + i * ss, BLK, scale);
	if (i < n)
		kern_n(sk, op, d + i * ds, s + i * ss, (size_t)(n - i), scale);
}

#define ARENA__QUANT_CONVERT(NAME, ATTR)                                                          \
	ATTR static int NAME(int sk, int op, void *d, const void *s, uint64_t n, float scale)    \
	{                                                                                         \
		unsigned char *dd = d;                                                            \
		const unsigned char *ss = s;                                                      \
		switch (sk * 16 + op) {                                                           \
			K_FLOAT_SRC(SK_BF16)                                                      \
			K_FLOAT_SRC(SK_F16)                                                       \
			K_FLOAT_SRC(SK_F32)                                                       \
			K(SK_E4M3, OP_F32)                                                        \
			K(SK_E4M3, OP_BF16)                                                       \
			K(SK_E4M3, OP_F16)                                                        \
			K(SK_E4M3, OP_E5M2)                                                       \
			K(SK_E4M3, OP_DEQ)                                                        \
			K(SK_E5M2, OP_F32)                                                        \
			K(SK_E5M2, OP_BF16)                                                       \
			K(SK_E5M2, OP_F16)                                                        \
			K(SK_E5M2, OP_E4M3)                                                       \
			K(SK_I8, OP_DEQ)                                                          \
		}                                                                                 \
		return -1;                                                                        \
	}
#define K(SK, OP)                                \
	case SK * 16 + OP:                       \
		kern(SK, OP, dd, ss, n, scale);  \
		return 0;
#define K_FLOAT_SRC(SK)          \
	K(SK, OP_F32)            \
	K(SK, OP_BF16)           \
	K(SK, OP_F16)            \
	K(SK, OP_E4M3)           \
	K(SK, OP_E5M2)           \
	K(SK, OP_E4M3_SCALED)    \
	K(SK, OP_I8_SCALED)

ARENA__QUANT_CONVERT(convert_base, )
#ifdef HAVE_AVX2_KERNELS
ARENA__QUANT_CONVERT(convert_avx2, __attribute__((target("avx2"))))
#endif
#undef K_FLOAT_SRC
#undef K

convert_fn arena__quant_pick_convert(void)
{
#ifdef HAVE_AVX2_KERNELS
	const char *isa = getenv("ARENA_QUANT_ISA");
	if (!(isa && strcmp(isa, "baseline") == 0) && __builtin_cpu_supports("avx2"))
		return convert_avx2;
#endif
	return convert_base;
}

int arena__quant_is_avx2(convert_fn cv)
{
#ifdef HAVE_AVX2_KERNELS
	return cv == convert_avx2;
#else
	(void)cv;
	return 0;
#endif
}

/* amax as the bits of |x|: for non-negative floats the integer order is the
 * float order, and NaN patterns lie above inf, so a plain integer max
 * propagates NaN. 16-bit kinds: max of (h & 0x7FFF), widened at the end. */
INLINE uint32_t amax16_n(const unsigned char *restrict s, size_t n)
{
	int16_t m = 0;
	for (size_t i = 0; i < n; i++) {
		uint16_t h;
		memcpy(&h, s + 2 * i, 2);
		int16_t a = (int16_t)(h & 0x7FFFu);
		m = a > m ? a : m;
	}
	return (uint32_t)m;
}

INLINE uint32_t amax32_n(const unsigned char *restrict s, size_t n)
{
	int32_t m = 0;
	for (size_t i = 0; i < n; i++) {
		uint32_t u;
		memcpy(&u, s + 4 * i, 4);
		int32_t a = (int32_t)(u & 0x7FFFFFFFu);
		m = a > m ? a : m;
	}
	return (uint32_t)m;
}

/* Built twice like the converters: baseline and, on x86-64, AVX2. */
#define ARENA__QUANT_AMAX(name16, name32, attr)                          \
	attr static uint32_t name16(const unsigned char *s, uint64_t n)  \
	{                                                                \
		uint32_t m = 0, b;                                       \
		uint64_t i = 0;                                          \
		for (; i + BLK <= n; i += BLK) {                         \
			b = amax16_n(s + 2 * i, BLK);                    \
			m = b > m ? b : m;                               \
		}                                                        \
		b = amax16_n(s + 2 * i, (size_t)(n - i));                \
		return b > m ? b : m;                                    \
	}                                                                \
	attr static uint32_t name32(const unsigned char *s, uint64_t n)  \
	{                                                                \
		uint32_t m = 0, b;                                       \
		uint64_t i = 0;                                          \
		for (; i + BLK <= n; i += BLK) {                         \
			b = amax32_n(s + 4 * i, BLK);                    \
			m = b > m ? b : m;                               \
		}                                                        \
		b = amax32_n(s + 4 * i, (size_t)(n - i));                \
		return b > m ? b : m;                                    \
	}

ARENA__QUANT_AMAX(amax16_base, amax32_base, )
#ifdef HAVE_AVX2_KERNELS
ARENA__QUANT_AMAX(amax16_avx2, amax32_avx2, __attribute__((target("avx2"))))
#endif

/* The amax kernels that go with the converters `cv` (arena__quant_pick_convert). */
static uint32_t amax16(convert_fn cv, const unsigned char *s, uint64_t n)
{
#ifdef HAVE_AVX2_KERNELS
	if (cv == convert_avx2)
		return amax16_avx2(s, n);
#endif
	(void)cv;
	return amax16_base(s, n);
}

static uint32_t amax32(convert_fn cv, const unsigned char *s, uint64_t n)
{
#ifdef HAVE_AVX2_KERNELS
	if (cv == convert_avx2)
		return amax32_avx2(s, n);
#endif
	(void)cv;
	return amax32_base(s, n);
}

/* amax(|x|) of n values of kind sk (BF16, F16, F32) as f32; any NaN gives
 * the one quiet NaN 0x7FC00000, so that no result depends on which NaN
 * payload a piece saw (and so on the thread count). */
static float amax_of(convert_fn cv, int sk, const void *src, uint64_t n)
{
	float m;
	if (sk == SK_F32) {
		m = arena__f32_of(amax32(cv, src, n));
	} else {
		uint32_t h = amax16(cv, src, n);
		m = sk == SK_BF16 ? arena__bf16_to_f32(h) : arena__f16_to_f32(h);
	}
	return m != m ? arena__f32_of(ARENA_F32_QNAN) : m;
}

float arena_quant_amax_merge(float a, float b)
{
	if (a != a || b != b)
		return arena__f32_of(ARENA_F32_QNAN);
	return a > b ? a : b;
}

/* max(amax / div, 1e-12); NaN stays NaN (torch.clamp_min). */
static float scale_of(float amax, float div)
{
	float s = amax / div;
	return s < ARENA_QUANT_MIN_SCALE ? ARENA_QUANT_MIN_SCALE : s;
}

float arena_quant_tensor_scale(float amax)
{
	return scale_of(amax, ARENA_QUANT_E4M3_MAX);
}

/* ---- threads ----------------------------------------------------------------- */

typedef struct worker {
	task *t;
	uint64_t first, count;
	unsigned slot;
} worker;

static void *worker_main(void *arg)
{
	worker *w = arg;
	w->t->fn(w->t, w->first, w->count, w->slot);
	return NULL;
}

static unsigned online_cores(void)
{
	cpu_set_t set;
	if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0)
		return (unsigned)CPU_COUNT(&set);
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	return n > 0 ? (unsigned)n : 1;
}

/* How many workers for `units` units of `unit_elems` elements. */
static unsigned pick_workers(unsigned threads, uint64_t units, uint64_t unit_elems)
{
	uint64_t elems = units * (unit_elems ? unit_elems : 1); /* callers bound this */
	uint64_t by_work = elems / PIECE;
	if (by_work <= 1 || units <= 1)
		return 1;
	uint64_t n = threads ? threads : online_cores();
	n = n < by_work ? n : by_work;
	n = n < units ? n : units;
	return n < MAX_THREADS ? (unsigned)n : MAX_THREADS;
}

unsigned arena__quant_parallel(task *t, uint64_t units, uint64_t unit_elems, unsigned threads)
{
	unsigned n = pick_workers(threads, units, unit_elems);
	if (n <= 1) {
		t->fn(t, 0, units, 0);
		return 1;
	}
	worker w[MAX_THREADS];
	pthread_t tid[MAX_THREADS];
	int started[MAX_THREADS];
	uint64_t per = units / n, extra = units % n, at = 0;
	for (unsigned k = 0; k < n; k++) {
		w[k].t = t;
		w[k].slot = k;
		w[k].first = at;
		w[k].count = per + (k < extra);
		at += w[k].count;
	}
	for (unsigned k = 1; k < n; k++)
		started[k] = pthread_create(&tid[k], NULL, worker_main, &w[k]) == 0;
	worker_main(&w[0]);
	for (unsigned k = 1; k < n; k++) {
		if (started[k])
			pthread_join(tid[k], NULL);
		else
			worker_main(&w[k]);
	}
	return n;
}

static void task_convert(task *t, uint64_t first, uint64_t count, unsigned slot)
{
	(void)slot;
	t->cv(t->sk, t->op, t->dst + first * op_size[t->op], t->src + first * sk_size[t->sk], count, t->scale);
}

static void task_amax(task *t, uint64_t first, uint64_t count, unsigned slot)
{
	t->partial[slot] = amax_of(t->cv, t->sk, t->src + first * sk_size[t->sk], count);
}

static void task_copy(task *t, uint64_t first, uint64_t count, unsigned slot)
{
	(void)slot;
	memcpy(t->dst + first, t->src + first, count);
}

/* Row schemes: per row, amax, scale, then the scaled cast of the row. */
static void task_rows(task *t, uint64_t first, uint64_t count, unsigned slot)
{
	(void)slot;
	const uint64_t in_row = t->cols * sk_size[t->sk];
	for (uint64_t r = first; r < first + count; r++) {
		const unsigned char *s = t->src + r * in_row;
		float scale = scale_of(amax_of(t->cv, t->sk, s, t->cols), t->div);
		memcpy(t->dst2 + 4 * r, &scale, 4);
		t->cv(t->sk, t->op, t->dst + r * t->cols, s, t->cols, scale);
	}
}

/* Dequantize rows: q * scale[row]. */
static void task_deq_rows(task *t, uint64_t first, uint64_t count, unsigned slot)
{
	(void)slot;
	for (uint64_t r = first; r < first + count; r++) {
		float scale;
		memcpy(&scale, t->src2 + 4 * r, 4);
		t->cv(t->sk, OP_DEQ, t->dst + 4 * r * t->cols, t->src + r * t->cols, t->cols, scale);
	}
}

static float amax_parallel(int sk, const void *src, uint64_t n, unsigned threads)
{
	task t = {.fn = task_amax, .cv = arena__quant_pick_convert(), .sk = sk, .src = src};
	unsigned used = arena__quant_parallel(&t, n, 1, threads);
	float m = t.partial[0];
	for (unsigned k = 1; k < used; k++)
		m = arena_quant_amax_merge(m, t.partial[k]);
	return m;
}

static void copy_parallel(void *dst, const void *src, uint64_t n, unsigned threads)
{
	if (!n)
		return;
	task t = {.fn = task_copy, .src = src, .dst = dst};
	arena__quant_parallel(&t, n, 1, threads);
}

static void convert_parallel(int sk, int op, void *dst, const void *src, uint64_t n, float scale, unsigned threads)
{
	task t = {.fn = task_convert,
		  .cv = arena__quant_pick_convert(),
		  .sk = sk,
		  .op = op,
		  .scale = scale,
		  .src = src,
		  .dst = dst};
	arena__quant_parallel(&t, n, 1, threads);
}

/* ---- dtypes (plans are formats/scheme.c's) -------------------------------------- */

static int is_wide_float(arena_dtype dt)
{
	return dt == ARENA_DTYPE_BF16 || dt == ARENA_DTYPE_F16 || dt == ARENA_DTYPE_F32;
}

static int kind_of(arena_dtype dt)
{
	switch (dt) {
	case ARENA_DTYPE_BF16:
		return SK_BF16;
	case ARENA_DTYPE_F16:
		return SK_F16;
	case ARENA_DTYPE_F32:
		return SK_F32;
	case ARENA_DTYPE_F8_E4M3:
		return SK_E4M3;
	case ARENA_DTYPE_F8_E5M2:
		return SK_E5M2;
	case ARENA_DTYPE_I8:
		return SK_I8;
	default:
		return -1;
	}
}

/* ---- runs -------------------------------------------------------------------- */

/* The kernel operation that makes component 0 of scheme s. */
static int op_of(arena_quant_scheme s)
{
	switch (s) {
	case ARENA_QUANT_BF16:
		return OP_BF16;
	case ARENA_QUANT_FP8_E4M3:
		return OP_E4M3;
	case ARENA_QUANT_FP8_E5M2:
		return OP_E5M2;
	case ARENA_QUANT_INT8_ROW:
		return OP_I8_SCALED;
	default:
		return OP_E4M3_SCALED;
	}
}

static int check_dst(const arena_quant_plan *p, void *const dst[])
{
	for (size_t i = 0; i < p->n_comps; i++)
		if (p->comps[i].nbytes && (!dst || !dst[i]))
			return -1;
	return 0;
}

int arena_quant_run_part(const arena_quant_plan *p, const void *src, uint64_t first, uint64_t count,
			 float tensor_scale, void *const dst[], unsigned threads)
{
	if (!p)
		return arena_errorf(E(USAGE), "quantization run: no plan");
	if (p->prequantized)
		return arena_errorf(E(USAGE), "quantization run: already-quantized plan needs arena_quant_run_scaled");
	const int row = arena_quant_is_row(p->scheme) || p->group;
	const uint64_t units = row ? p->rows : p->nelem;
	if (first > units || count > units - first)
		return arena_errorf(E(USAGE), "quantization run: units [%llu, +%llu) outside [0, %llu)",
				    (unsigned long long)first, (unsigned long long)count, (unsigned long long)units);
	if (!count)
		return 0;
	if (!src || check_dst(p, dst))
		return arena_errorf(E(USAGE), "quantization run: NULL source or destination");
	const unsigned char *s = src;
	unsigned char *d0 = dst[0];

	if (p->scheme == ARENA_QUANT_NONE || p->src_dtype == p->comps[0].dtype) {
		unsigned bits = arena_dtype_bits(p->src_dtype);
		if ((first * bits) % 8 || ((count * bits) % 8 && first + count != units))
			return arena_errorf(E(USAGE), "quantization run: units [%llu, +%llu) of %s are not whole bytes",
					    (unsigned long long)first, (unsigned long long)count,
					    arena_dtype_name(p->src_dtype));
		copy_parallel(d0 + first * bits / 8, s, (count * bits + 7) / 8, threads);
		return 0;
	}
	const int sk = kind_of(p->src_dtype);
	if (p->group)
		return arena__quant_int4_run(p, sk, s, first, count, dst, threads);
	const int op = op_of(p->scheme);
	if (row) {
		/* row r of the range is at s + (r - first) * row bytes: the task
		 * sees the range as units [0, count) */
		task t = {.fn = task_rows,
			  .cv = arena__quant_pick_convert(),
			  .sk = sk,
			  .op = op,
			  .div = p->scheme == ARENA_QUANT_INT8_ROW ? ARENA_QUANT_INT8_MAX : ARENA_QUANT_E4M3_MAX,
			  .cols = p->cols,
			  .src = s,
			  .dst = d0 + first * p->cols,
			  .dst2 = (unsigned char *)dst[1] + 4 * first};
		arena__quant_parallel(&t, count, p->cols, threads);
		return 0;
	}
	if (p->scheme == ARENA_QUANT_FP8_E4M3_TENSOR)
		memcpy(dst[1], &tensor_scale, 4);
	convert_parallel(sk, op, d0 + first * op_size[op], s, count, tensor_scale, threads);
	return 0;
}

int arena_quant_run(const arena_quant_plan *p, const void *src, void *const dst[], unsigned threads)
{
	if (!p)
		return arena_errorf(E(USAGE), "quantization run: no plan");
	float scale = 0.0f;
	if (p->scheme == ARENA_QUANT_FP8_E4M3_TENSOR && !p->prequantized) {
		if (!src)
			return arena_errorf(E(USAGE), "quantization run: NULL source");
		scale = arena_quant_tensor_scale(amax_parallel(kind_of(p->src_dtype), src, p->nelem, threads));
	}
	return arena_quant_run_part(p, src, 0, arena_quant_is_row(p->scheme) || p->group ? p->rows : p->nelem, scale,
				    dst, threads);
}

int arena_quant_amax(arena_dtype dt, const void *src, uint64_t n, unsigned threads, float *out)
{
	if (!out || !is_wide_float(dt) || (n && !src))
		return arena_errorf(E(USAGE), "amax: dtype %s or arguments not supported", arena_dtype_name(dt));
	*out = n ? amax_parallel(kind_of(dt), src, n, threads) : 0.0f;
	return 0;
}

int arena_quant_run_scaled(const arena_quant_plan *p, const void *qsrc, arena_dtype scale_dtype,
			   const void *scale_src, void *const dst[], unsigned threads)
{
	if (!p || !p->prequantized)
		return arena_errorf(E(USAGE), "quantization run: not an already-quantized plan");
	if (!is_wide_float(scale_dtype))
		return arena_errorf(E(USAGE), "quantization run: scale dtype %s is not F32, BF16 or F16",
				    arena_dtype_name(scale_dtype));
	if (!qsrc || !scale_src || check_dst(p, dst))
		return arena_errorf(E(USAGE), "quantization run: NULL source or destination");
	copy_parallel(dst[0], qsrc, p->comps[0].nbytes, threads);
	arena__quant_pick_convert()(kind_of(scale_dtype), OP_F32, dst[1], scale_src, p->comps[1].nelem, 0.0f);
	return 0;
}

/* ---- byte ranges ---------------------------------------------------------------- */

int arena_quant_scan_needed(const arena_quant_plan *p)
{
	return p->scheme == ARENA_QUANT_FP8_E4M3_TENSOR && !p->prequantized;
}

int arena_quant_scan(const arena_quant_plan *p, arena_quant_input *in, unsigned threads)
{
	if (!p || !in)
		return arena_errorf(E(USAGE), "quantization scan: NULL argument");
	if (!arena_quant_scan_needed(p))
		return 0;
	if (!in->data)
		return arena_errorf(E(USAGE), "quantization scan: NULL source");
	in->tensor_scale = arena_quant_tensor_scale(amax_parallel(kind_of(p->src_dtype), in->data, p->nelem, threads));
	return 0;
}

/* Output bytes [off, off + len) of op over elements of kind sk at src (whole
 * tensor): whole elements go straight to d, a split one through a scratch. */
static void fill_elems(convert_fn cv, int sk, int op, const unsigned char *src, uint64_t off, uint64_t len,
		       unsigned char *d, float scale)
{
	const uint64_t es = op_size[op], ss = sk_size[sk];
	uint64_t e = off / es, end = off + len;
	unsigned char tmp[4];
	if (off % es) { /* head: the tail bytes of element e */
		cv(sk, op, tmp, src + e * ss, 1, scale);
		uint64_t k = off % es, n = es - k < len ? es - k : len;
		memcpy(d, tmp + k, n);
		d += n;
		e++;
	}
	uint64_t whole_end = end / es; /* elements [e, whole_end) are whole */
	if (whole_end > e) {
		cv(sk, op, d, src + e * ss, whole_end - e, scale);
		d += (whole_end - e) * es;
	}
	if (end % es && whole_end >= e && end / es * es >= off) { /* tail: the head bytes of element whole_end */
		cv(sk, op, tmp, src + whole_end * ss, 1, scale);
		memcpy(d, tmp, end % es);
	}
}

static float row_scale(convert_fn cv, const arena_quant_plan *p, int sk, const unsigned char *src, uint64_t r)
{
	const float div = p->scheme == ARENA_QUANT_INT8_ROW ? ARENA_QUANT_INT8_MAX : ARENA_QUANT_E4M3_MAX;
	return scale_of(amax_of(cv, sk, src + r * p->cols * sk_size[sk], p->cols), div);
}

/* Bytes [off, off + len) of a 4-byte-per-value array whose value v is get(v). */
#define FILL_F32_VALUES(get)                                                              \
	do {                                                                              \
		for (uint64_t v_ = off / 4; v_ * 4 < off + len; v_++) {                  \
			float x_ = (get);                                                 \
			uint64_t a_ = v_ * 4 > off ? v_ * 4 : off;                        \
			uint64_t z_ = v_ * 4 + 4 < off + len ? v_ * 4 + 4 : off + len;    \
			memcpy(d + (a_ - off), (const unsigned char *)&x_ + (a_ - v_ * 4), z_ - a_); \
		}                                                                         \
	} while (0)

int arena_quant_fill(const arena_quant_plan *p, const arena_quant_input *in, uint32_t comp, uint64_t off,
		     uint64_t len, void *dst)
{
	if (!p || !in || comp >= p->n_comps)
		return arena_errorf(E(USAGE), "quantization fill: NULL argument or no component %u", comp);
	const arena_quant_component *c = &p->comps[comp];
	if (off > c->nbytes || len > c->nbytes - off)
		return arena_errorf(E(USAGE), "quantization fill: bytes [%llu, +%llu) outside component '%s' (%llu bytes)",
				    (unsigned long long)off, (unsigned long long)len, c->name,
				    (unsigned long long)c->nbytes);
	if (!len)
		return 0;
	if (!dst || !in->data)
		return arena_errorf(E(USAGE), "quantization fill: NULL source or destination");
	unsigned char *d = dst;
	const unsigned char *src = in->data;
	if (comp == 0 && (p->scheme == ARENA_QUANT_NONE || p->src_dtype == c->dtype)) {
		memcpy(d, src + off, len); /* as stored, or already-quantized data */
		return 0;
	}
	const convert_fn cv = arena__quant_pick_convert();
	if (p->prequantized) { /* comp 1: the scale tensor, widened */
		if (!in->scale || !is_wide_float(in->scale_dtype))
			return arena_errorf(E(USAGE), "quantization fill: no scale tensor of dtype F32, BF16 or F16");
		fill_elems(cv, kind_of(in->scale_dtype), OP_F32, in->scale, off, len, d, 0.0f);
		return 0;
	}
	const int sk = kind_of(p->src_dtype);
	if (p->group)
		return arena__quant_int4_fill(p, sk, src, comp, off, len, d);
	const int op = op_of(p->scheme);
	if (p->scheme == ARENA_QUANT_FP8_E4M3_TENSOR) {
		if (comp == 1)
			FILL_F32_VALUES(in->tensor_scale);
		else
			fill_elems(cv, sk, op, src, off, len, d, in->tensor_scale);
		return 0;
	}
	if (!arena_quant_is_row(p->scheme)) {
		fill_elems(cv, sk, op, src, off, len, d, 0.0f);
		return 0;
	}
	if (comp == 1) {
		FILL_F32_VALUES(row_scale(cv, p, sk, src, v_));
		return 0;
	}
	/* qdata: one byte per element; rows [off / cols, (off + len - 1) / cols] */
	for (uint64_t r = off / p->cols; r * p->cols < off + len; r++) {
		uint64_t a = r * p->cols > off ? r * p->cols : off;
		uint64_t z = (r + 1) * p->cols < off + len ? (r + 1) * p->cols : off + len;
		cv(sk, op, d + (a - off), src + a * sk_size[sk], z - a, row_scale(cv, p, sk, src, r));
	}
	return 0;
}
#undef FILL_F32_VALUES

/* ---- dequantization and casts -------------------------------------------------- */

int arena_quant_dequant_f32(const arena_quant_plan *p, const void *const src[], float *dst, unsigned threads)
{
	if (!p)
		return arena_errorf(E(USAGE), "dequantize: no plan");
	if (!p->nelem)
		return 0;
	if (!dst || !src)
		return arena_errorf(E(USAGE), "dequantize: NULL source or destination");
	for (size_t i = 0; i < p->n_comps; i++)
		if (!src[i])
			return arena_errorf(E(USAGE), "dequantize: NULL component %zu", i);
	const arena_quant_component *q = &p->comps[0];
	if (p->group) {
		arena__quant_int4_dequant(p, kind_of(p->src_dtype), src, dst, threads);
		return 0;
	}
	const int sk = kind_of(q->dtype);
	if (!arena_quant_is_scaled(p->scheme)) {
		if (sk < 0 || sk == SK_I8)
			return arena_errorf(E(QUANT_NOT_APPLICABLE), "dequantize: dtype %s has no f32 values",
					    arena_dtype_name(q->dtype));
		if (sk == SK_F32)
			copy_parallel(dst, src[0], p->nelem * 4, threads);
		else
			convert_parallel(sk, OP_F32, dst, src[0], p->nelem, 0.0f, threads);
		return 0;
	}
	if (p->scheme == ARENA_QUANT_FP8_E4M3_TENSOR) {
		float scale;
		memcpy(&scale, src[1], 4);
		convert_parallel(sk, OP_DEQ, dst, src[0], p->nelem, scale, threads);
		return 0;
	}
	task t = {.fn = task_deq_rows,
		  .cv = arena__quant_pick_convert(),
		  .sk = sk,
		  .cols = p->cols,
		  .src = src[0],
		  .src2 = src[1],
		  .dst = (unsigned char *)dst};
	arena__quant_parallel(&t, p->rows, p->cols, threads);
	return 0;
}

int arena_quant_cast(arena_dtype dst_dt, void *dst, arena_dtype src_dt, const void *src, uint64_t n,
		     unsigned threads)
{
	static const struct {
		arena_dtype dt;
		int op;
	} ops[] = {{ARENA_DTYPE_F32, OP_F32},
		   {ARENA_DTYPE_BF16, OP_BF16},
		   {ARENA_DTYPE_F16, OP_F16},
		   {ARENA_DTYPE_F8_E4M3, OP_E4M3},
		   {ARENA_DTYPE_F8_E5M2, OP_E5M2}};
	int op = -1, sk = kind_of(src_dt);
	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++)
		if (ops[i].dt == dst_dt)
			op = ops[i].op;
	if (op < 0 || sk < 0 || sk == SK_I8)
		return arena_errorf(E(QUANT_NOT_APPLICABLE), "cast from %s to %s is not supported",
				    arena_dtype_name(src_dt), arena_dtype_name(dst_dt));
	if (!n)
		return 0;
	if (!dst || !src)
		return arena_errorf(E(USAGE), "cast: NULL source or destination");
	if (src_dt == dst_dt) {
		copy_parallel(dst, src, n * sk_size[sk], threads);
		return 0;
	}
	convert_parallel(sk, op, dst, src, n, 0.0f, threads);
	return 0;
}

/* ---- compressed-tensors recognition ---------------------------------------------- */

arena_quant_scheme arena_quant_ct_classify(arena_dtype q_dtype, uint32_t q_rank, const uint64_t *q_shape,
					   arena_dtype s_dtype, uint32_t s_rank, const uint64_t *s_shape,
					   const char **why)
{
	const char *w = NULL;
	arena_quant_scheme r = ARENA_QUANT_NONE;
	uint64_t s_n = 1, q_n = 1;
	for (uint32_t k = 0; k < s_rank; k++)
		s_n = s_shape[k] > 1 && s_n > UINT64_MAX / s_shape[k] ? UINT64_MAX : s_n * s_shape[k];
	for (uint32_t k = 0; k < q_rank; k++)
		q_n = q_shape[k] > 1 && q_n > UINT64_MAX / q_shape[k] ? UINT64_MAX : q_n * q_shape[k];
	if (q_dtype != ARENA_DTYPE_F8_E4M3) {
		w = "data dtype is not F8_E4M3";
	} else if (!is_wide_float(s_dtype)) {
		w = "scale dtype is not F32, BF16 or F16";
	} else if (q_n == 0) {
		w = "data is empty";
	} else if (q_rank > ARENA_QUANT_MAX_RANK) {
		w = "data rank is over the limit";
	} else if (s_n == 1) {
		r = ARENA_QUANT_FP8_E4M3_TENSOR;
	} else if (q_rank < 2) {
		w = "scale holds several values but the data has rank < 2 (no rows)";
	} else if (s_rank < 1 || s_rank > q_rank || s_shape[0] != q_shape[0]) {
		w = "scale is neither one value nor one per row ([rows] or [rows, 1])";
	} else {
		r = ARENA_QUANT_FP8_E4M3_ROW;
		for (uint32_t k = 1; k < s_rank; k++)
			if (s_shape[k] != 1)
				r = ARENA_QUANT_NONE;
		if (r == ARENA_QUANT_NONE)
			w = "scale is neither one value nor one per row ([rows] or [rows, 1])";
	}
	if (why)
		*why = w;
	return r;
}

#define CT_SUFFIX "_scale"

arena_quant_scheme arena_quant_ct_match(const arena_ckpt *c, const char *name, const arena_st_tensor **scale_out,
					const char **why)
{
	if (scale_out)
		*scale_out = NULL;
	if (why)
		*why = NULL;
	if (!c || !name)
		return ARENA_QUANT_NONE;
	const arena_st_tensor *q = arena_ckpt_find(c, name);
	if (!q || q->dtype != ARENA_DTYPE_F8_E4M3)
		return ARENA_QUANT_NONE;
	size_t n = strlen(name);
	char stack[1024];
	char *sname = stack;
	if (n + sizeof(CT_SUFFIX) > sizeof(stack))
		return ARENA_QUANT_NONE; /* no allocation here: such names do not occur */
	memcpy(sname, name, n);
	memcpy(sname + n, CT_SUFFIX, sizeof(CT_SUFFIX));
	const arena_st_tensor *s = arena_ckpt_find(c, sname);
	if (!s)
		return ARENA_QUANT_NONE;
	arena_quant_scheme r = arena_quant_ct_classify(q->dtype, q->rank, q->shape, s->dtype, s->rank, s->shape, why);
	if (r != ARENA_QUANT_NONE && scale_out)
		*scale_out = s;
	return r;
}

int arena_quant_ct_is_scale(const arena_ckpt *c, const char *name)
{
	if (!c || !name)
		return 0;
	size_t n = strlen(name), sl = sizeof(CT_SUFFIX) - 1;
	char base[1024];
	if (n <= sl || n - sl >= sizeof(base) || strcmp(name + n - sl, CT_SUFFIX) != 0)
		return 0;
	memcpy(base, name, n - sl);
	base[n - sl] = '\0';
	return arena_quant_ct_match(c, base, NULL, NULL) != ARENA_QUANT_NONE;
}
