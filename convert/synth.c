/* synth.c - synthetic checkpoints: layouts, the value stream, the threaded writer. */
#include "synth.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "../common/alloc.h"
#include "../common/err.h"
#include "../common/outfile.h"
#include "../formats/st_write.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "synth.c writes little-endian values with memcpy: port it before building on a big-endian host"
#endif

/* ------------------------------------------------------------------------ */
/* Layouts                                                                  */

const arena_synth_flux_config arena_synth_flux_dev = {
	.patch_size = 1,
	.in_channels = 64,
	.out_channels = 0,
	.num_layers = 19,
	.num_single_layers = 38,
	.attention_head_dim = 128,
	.num_attention_heads = 24,
	.joint_attention_dim = 4096,
	.pooled_projection_dim = 768,
	.timestep_channels = 256,
	.mlp_ratio = 4,
	.guidance_embeds = 1,
};

const arena_synth_flux_config arena_synth_flux_tiny = {
	.patch_size = 1,
	.in_channels = 16,
	.out_channels = 0,
	.num_layers = 2,
	.num_single_layers = 3,
	.attention_head_dim = 16,
	.num_attention_heads = 2,
	.joint_attention_dim = 32,
	.pooled_projection_dim = 16,
	.timestep_channels = 256,
	.mlp_ratio = 4,
	.guidance_embeds = 1,
};

const arena_synth_llama_config arena_synth_llama_8b = {
	.hidden_size = 4096,
	.intermediate_size = 14336,
	.num_hidden_layers = 32,
	.num_attention_heads = 32,
	.num_key_value_heads = 8,
	.head_dim = 0,
	.vocab_size = 128256,
	.tie_word_embeddings = 0,
};

const arena_synth_llama_config arena_synth_llama_tiny = {
	.hidden_size = 32,
	.intermediate_size = 64,
	.num_hidden_layers = 3,
	.num_attention_heads = 4,
	.num_key_value_heads = 2,
	.head_dim = 8,
	.vocab_size = 128,
	.tie_word_embeddings = 0,
};

/* Append one tensor; the name is printf-formatted. */
static int push(arena_synth_list *l, uint32_t rank, uint64_t d0, uint64_t d1, const char *fmt, ...)
	ARENA_PRINTF(5, 6);

static int push(arena_synth_list *l, uint32_t rank, uint64_t d0, uint64_t d1, const char *fmt, ...)
{
	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 256;
		arena_synth_tensor *t = arena_realloc(l->t, cap * sizeof(*t));
		if (!t)
			return arena_errorf(ARENA_E_NOMEM, "synth: out of memory");
		l->t = t;
		l->cap = cap;
	}
	arena_synth_tensor *t = &l->t[l->n];
	memset(t, 0, sizeof(*t));
	va_list ap;
	va_start(ap, fmt);
	int len = vsnprintf(t->name, sizeof(t->name), fmt, ap);
	va_end(ap);
	if (len < 0 || (size_t)len >= sizeof(t->name))
		return arena_errorf(ARENA_E_USAGE, "synth: tensor name over %d bytes", ARENA_SYNTH_NAME_MAX - 1);
	t->rank = rank;
	t->shape[0] = d0;
	t->shape[1] = d1;
	l->n++;
	return 0;
}

/* nn.Linear(in, out, bias): weight [out, in], bias [out]. */
static int linear(arena_synth_list *l, const char *prefix, long idx, const char *name, uint64_t in,
		  uint64_t out, int bias)
{
	char base[ARENA_SYNTH_NAME_MAX];
	int n = idx < 0 ? snprintf(base, sizeof(base), "%s%s", prefix, name)
			: snprintf(base, sizeof(base), "%s%ld.%s", prefix, idx, name);
	if (n < 0 || (size_t)n >= sizeof(base))
		return arena_errorf(ARENA_E_USAGE, "synth: tensor name over %d bytes", ARENA_SYNTH_NAME_MAX - 1);
	int rc = push(l, 2, out, in, "%s.weight", base);
	if (!rc && bias)
		rc = push(l, 1, out, 0, "%s.bias", base);
	return rc;
}

/* A weight-only vector (RMSNorm). */
static int vec(arena_synth_list *l, const char *prefix, long idx, const char *name, uint64_t dim)
{
	return idx < 0 ? push(l, 1, dim, 0, "%s%s.weight", prefix, name)
		       : push(l, 1, dim, 0, "%s%ld.%s.weight", prefix, idx, name);
}

static uint64_t keep(uint64_t n, long blocks)
{
	return blocks < 0 || (uint64_t)blocks > n ? n : (uint64_t)blocks;
}

/* Largest dimension accepted: keeps every product of two dims below 2^63. */
#define DIM_MAX (1ull << 31)

int arena_synth_flux(const arena_synth_flux_config *c, long blocks, arena_synth_list *out)
{
	const uint64_t dims[] = {c->patch_size, c->in_channels, c->attention_head_dim, c->num_attention_heads,
				 c->joint_attention_dim, c->pooled_projection_dim, c->timestep_channels,
				 c->mlp_ratio};
	for (size_t i = 0; i < sizeof(dims) / sizeof(dims[0]); i++)
		if (dims[i] == 0 || dims[i] > DIM_MAX)
			return arena_errorf(ARENA_E_USAGE, "synth: flux config: dimension %zu is 0 or over 2^31", i);
	uint64_t D = c->num_attention_heads * c->attention_head_dim; /* inner dim */
	uint64_t hd = c->attention_head_dim;
	uint64_t mlp = D * c->mlp_ratio;
	uint64_t oc = c->out_channels ? c->out_channels : c->in_channels;
	if (D > DIM_MAX || mlp > DIM_MAX || oc > DIM_MAX || c->patch_size * c->patch_size * oc > DIM_MAX)
		return arena_errorf(ARENA_E_USAGE, "synth: flux config: a derived dimension is over 2^31");
	int rc = 0;
	/* CombinedTimestep[Guidance]TextProjEmbeddings */
	const char *tte = "time_text_embed.";
	rc = rc ? rc : linear(out, tte, -1, "timestep_embedder.linear_1", c->timestep_channels, D, 1);
	rc = rc ? rc : linear(out, tte, -1, "timestep_embedder.linear_2", D, D, 1);
	if (c->guidance_embeds) {
		rc = rc ? rc : linear(out, tte, -1, "guidance_embedder.linear_1", c->timestep_channels, D, 1);
		rc = rc ? rc : linear(out, tte, -1, "guidance_embedder.linear_2", D, D, 1);
	}
	rc = rc ? rc : linear(out, tte, -1, "text_embedder.linear_1", c->pooled_projection_dim, D, 1);
	rc = rc ? rc : linear(out, tte, -1, "text_embedder.linear_2", D, D, 1);
	rc = rc ? rc : linear(out, "", -1, "context_embedder", c->joint_attention_dim, D, 1);
	rc = rc ? rc : linear(out, "", -1, "x_embedder", c->in_channels, D, 1);

	/* FluxTransformerBlock: AdaLayerNormZero (6 modulations), joint attention
	 * with QK RMSNorm on both streams, GELU(tanh) feed-forwards. */
	const char *tb = "transformer_blocks.";
	for (long i = 0; !rc && (uint64_t)i < keep(c->num_layers, blocks); i++) {
		rc = rc ? rc : linear(out, tb, i, "norm1.linear", D, 6 * D, 1);
		rc = rc ? rc : linear(out, tb, i, "norm1_context.linear", D, 6 * D, 1);
		rc = rc ? rc : vec(out, tb, i, "attn.norm_q", hd);
		rc = rc ? rc : vec(out, tb, i, "attn.norm_k", hd);
		rc = rc ? rc : linear(out, tb, i, "attn.to_q", D, D, 1);
		rc = rc ? rc : linear(out, tb, i, "attn.to_k", D, D, 1);
		rc = rc ? rc : linear(out, tb, i, "attn.to_v", D, D, 1);
		rc = rc ? rc : vec(out, tb, i, "attn.norm_added_q", hd);
		rc = rc ? rc : vec(out, tb, i, "attn.norm_added_k", hd);
		rc = rc ? rc : linear(out, tb, i, "attn.add_q_proj", D, D, 1);
		rc = rc ? rc : linear(out, tb, i, "attn.add_k_proj", D, D, 1);
		rc = rc ? rc : linear(out, tb, i, "attn.add_v_proj", D, D, 1);
		rc = rc ? rc : linear(out, tb, i, "attn.to_out.0", D, D, 1);
		rc = rc ? rc : linear(out, tb, i, "attn.to_add_out", D, D, 1);
		rc = rc ? rc : linear(out, tb, i, "ff.net.0.proj", D, mlp, 1);
		rc = rc ? rc : linear(out, tb, i, "ff.net.2", mlp, D, 1);
		rc = rc ? rc : linear(out, tb, i, "ff_context.net.0.proj", D, mlp, 1);
		rc = rc ? rc : linear(out, tb, i, "ff_context.net.2", mlp, D, 1);
	}
	/* FluxSingleTransformerBlock: AdaLayerNormZeroSingle (3 modulations),
	 * attention and MLP in parallel, one output projection over both. */
	const char *sb = "single_transformer_blocks.";
	for (long i = 0; !rc && (uint64_t)i < keep(c->num_single_layers, blocks); i++) {
		rc = rc ? rc : linear(out, sb, i, "norm.linear", D, 3 * D, 1);
		rc = rc ? rc : linear(out, sb, i, "proj_mlp", D, mlp, 1);
		rc = rc ? rc : linear(out, sb, i, "proj_out", D + mlp, D, 1);
		rc = rc ? rc : vec(out, sb, i, "attn.norm_q", hd);
		rc = rc ? rc : vec(out, sb, i, "attn.norm_k", hd);
		rc = rc ? rc : linear(out, sb, i, "attn.to_q", D, D, 1);
		rc = rc ? rc : linear(out, sb, i, "attn.to_k", D, D, 1);
		rc = rc ? rc : linear(out, sb, i, "attn.to_v", D, D, 1);
	}
	/* AdaLayerNormContinuous (shift, scale; no affine) and the output projection. */
	rc = rc ? rc : linear(out, "", -1, "norm_out.linear", D, 2 * D, 1);
	rc = rc ? rc : linear(out, "", -1, "proj_out", D, c->patch_size * c->patch_size * oc, 1);
	return rc;
}

int arena_synth_llama(const arena_synth_llama_config *c, long blocks, arena_synth_list *out)
{
	uint64_t hd = c->head_dim ? c->head_dim : c->num_attention_heads ? c->hidden_size / c->num_attention_heads : 0;
	const uint64_t dims[] = {c->hidden_size, c->intermediate_size, c->num_attention_heads,
				 c->num_key_value_heads, hd, c->vocab_size};
	for (size_t i = 0; i < sizeof(dims) / sizeof(dims[0]); i++)
		if (dims[i] == 0 || dims[i] > DIM_MAX)
			return arena_errorf(ARENA_E_USAGE, "synth: llama config: dimension %zu is 0 or over 2^31", i);
	uint64_t q = c->num_attention_heads * hd, kv = c->num_key_value_heads * hd;
	if (q > DIM_MAX || kv > DIM_MAX)
		return arena_errorf(ARENA_E_USAGE, "synth: llama config: a derived dimension is over 2^31");
	uint64_t H = c->hidden_size, I = c->intermediate_size;
	int rc = linear(out, "model.", -1, "embed_tokens", H, c->vocab_size, 0);
	const char *lp = "model.layers.";
	for (long i = 0; !rc && (uint64_t)i < keep(c->num_hidden_layers, blocks); i++) {
		rc = rc ? rc : vec(out, lp, i, "input_layernorm", H);
		rc = rc ? rc : linear(out, lp, i, "self_attn.q_proj", H, q, 0);
		rc = rc ? rc : linear(out, lp, i, "self_attn.k_proj", H, kv, 0);
		rc = rc ? rc : linear(out, lp, i, "self_attn.v_proj", H, kv, 0);
		rc = rc ? rc : linear(out, lp, i, "self_attn.o_proj", q, H, 0);
		rc = rc ? rc : vec(out, lp, i, "post_attention_layernorm", H);
		rc = rc ? rc : linear(out, lp, i, "mlp.gate_proj", H, I, 0);
		rc = rc ? rc : linear(out, lp, i, "mlp.up_proj", H, I, 0);
		rc = rc ? rc : linear(out, lp, i, "mlp.down_proj", I, H, 0);
	}
	rc = rc ? rc : vec(out, "model.", -1, "norm", H);
	if (!c->tie_word_embeddings)
		rc = rc ? rc : linear(out, "", -1, "lm_head", H, c->vocab_size, 0);
	return rc;
}

static int make_flux_dev(long b, arena_synth_list *o) { return arena_synth_flux(&arena_synth_flux_dev, b, o); }
static int make_flux_tiny(long b, arena_synth_list *o) { return arena_synth_flux(&arena_synth_flux_tiny, b, o); }
static int make_llama_8b(long b, arena_synth_list *o) { return arena_synth_llama(&arena_synth_llama_8b, b, o); }
static int make_llama_tiny(long b, arena_synth_list *o) { return arena_synth_llama(&arena_synth_llama_tiny, b, o); }

/* Keep the list in cli/cmd_synth.c's usage text in step with this table. */
const arena_synth_layout arena_synth_layouts[] = {
	{"flux-dev",
	 "diffusers FluxTransformer2DModel, FLUX.1-dev config: 19 double + 38 single blocks, "
	 "11.90 B params (22.17 GiB in bf16)",
	 make_flux_dev},
	{"flux-tiny",
	 "the same structure at the config of the reference tiny_flux fixture: 2 double + 3 single "
	 "blocks, inner dim 32, 147 K params",
	 make_flux_tiny},
	{"llama-8b",
	 "transformers LlamaForCausalLM, Llama-3-8B: 32 layers, hidden 4096, GQA 32/8 heads, vocab "
	 "128256, untied lm_head, 8.03 B params (14.96 GiB in bf16)",
	 make_llama_8b},
	{"llama-tiny",
	 "the same structure at the config of the reference tiny_llama fixture: 3 layers, hidden 32, "
	 "36 K params",
	 make_llama_tiny},
	{NULL, NULL, NULL},
};

int arena_synth_layout_make(const char *name, long blocks, arena_synth_list *out)
{
	for (const arena_synth_layout *l = arena_synth_layouts; l->name; l++)
		if (strcmp(l->name, name) == 0)
			return l->make(blocks, out);
	char known[256];
	size_t o = 0;
	for (const arena_synth_layout *l = arena_synth_layouts; l->name && o < sizeof(known); l++)
		o += (size_t)snprintf(known + o, sizeof(known) - o, "%s%s", o ? ", " : "", l->name);
	return arena_errorf(ARENA_E_USAGE, "unknown layout '%s' (known: %s)", arena_q(name), known);
}

uint64_t arena_synth_params(const arena_synth_list *l)
{
	uint64_t total = 0;
	for (size_t i = 0; i < l->n; i++) {
		uint64_t n = 1;
		for (uint32_t k = 0; k < l->t[i].rank; k++)
			n *= l->t[i].shape[k];
		total += n;
	}
	return total;
}

void arena_synth_list_release(arena_synth_list *l)
{
	if (!l)
		return;
	arena_free(l->t);
	memset(l, 0, sizeof(*l));
}

/* ------------------------------------------------------------------------ */
/* Values                                                                   */

#define SEG_BITS 10
#define SEGS (1u << SEG_BITS)
#define LEVELS 4

/* level L covers the two-sided tail mass r in (0, 2^-10L]; node k sits at
 * r = 2^-10L (1 - k/1024), i.e. |z| grows with k. T holds |z| x STD at the
 * nodes, D the differences to the next node. */
static float tab_t[LEVELS][SEGS + 1];
static float tab_d[LEVELS][SEGS];
static pthread_once_t tab_once = PTHREAD_ONCE_INIT;

/* |z| with P(|Z| > |z|) = r, for 0 < r <= 1: bisection on erfc, to the last bit. */
static double half_normal_quantile(double r)
{
	double lo = 0, hi = 40;
	for (int i = 0; i < 200 && lo < hi; i++) {
		double mid = 0.5 * (lo + hi);
		if (mid == lo || mid == hi)
			break;
		if (erfc(mid * M_SQRT1_2) > r)
			lo = mid;
		else
			hi = mid;
	}
	return 0.5 * (lo + hi);
}

static void build_tables(void)
{
	for (int L = 0; L < LEVELS; L++) {
		double top = ldexp(1.0, -SEG_BITS * L);
		for (unsigned k = 0; k < SEGS; k++)
			tab_t[L][k] = (float)(half_normal_quantile(top * (1.0 - (double)k / SEGS)) * ARENA_SYNTH_STD);
		/* Node SEGS is infinite; the last level's last segment ends halfway into it. */
		tab_t[L][SEGS] = (float)(half_normal_quantile(top / SEGS / 2) * ARENA_SYNTH_STD);
		for (unsigned k = 0; k < SEGS; k++)
			tab_d[L][k] = tab_t[L][k + 1] - tab_t[L][k];
	}
}

static inline uint64_t splitmix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

#define GOLDEN 0x9E3779B97F4A7C15ULL

/* The outermost segment of level 0: fresh bits, finer tables. */
static __attribute__((noinline)) float tail_value(uint64_t h, unsigned j)
{
	for (unsigned L = 1;; L++) {
		uint64_t t = splitmix64(h + j + L * 0xD1B54A32D192ED03ULL);
		unsigned k = (unsigned)(t >> (64 - SEG_BITS));
		if (k < SEGS - 1 || L == LEVELS - 1) {
			float fr = (float)(uint32_t)((t >> 16) & 0xFFFFFF) * 0x1p-24f;
			return tab_t[L][k] + fr * tab_d[L][k];
		}
	}
}

/* Element j (0 or 1) of the pair whose hash is h: f32 bits. Plain f32
 * arithmetic; -std=c11 keeps the compiler from contracting it into an FMA,
 * which would change the last bit on some machines. */
static inline uint32_t value_bits(uint64_t h, unsigned j)
{
	uint32_t w = (uint32_t)(h >> (32 * j));
	unsigned k = (w >> 21) & (SEGS - 1);
	float z;
	if (__builtin_expect(k == SEGS - 1, 0))
		z = tail_value(h, j);
	else
		z = tab_t[0][k] + (float)(int32_t)(w & 0x1FFFFF) * 0x1p-21f * tab_d[0][k];
	uint32_t b;
	memcpy(&b, &z, 4);
	return b | (w & 0x80000000u);
}

static inline uint64_t pair_hash(uint64_t key, uint64_t pair)
{
	return splitmix64(key + (pair + 1) * GOLDEN);
}

uint64_t arena_synth_key(uint64_t seed, const char *name)
{
	return XXH64(name, strlen(name), seed);
}

float arena_synth_value(uint64_t key, uint64_t index)
{
	pthread_once(&tab_once, build_tables);
	uint32_t b = value_bits(pair_hash(key, index >> 1), (unsigned)(index & 1));
	float f;
	memcpy(&f, &b, 4);
	return f;
}

static inline uint16_t f32_to_bf16(float f)
{
	uint32_t b;
	memcpy(&b, &f, 4);
	if ((b & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((b >> 16) | 0x40); /* quiet NaN */
	b += 0x7fffu + ((b >> 16) & 1);
	return (uint16_t)(b >> 16);
}

static inline uint16_t f32_to_f16(float f)
{
	uint32_t x;
	memcpy(&x, &f, 4);
	uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
	x &= 0x7fffffffu;
	if (x >= 0x47800000u) /* >= 65536 (or inf, NaN): inf or NaN */
		return sign | (x > 0x7f800000u ? 0x7e00 : 0x7c00);
	if (x < 0x38800000u) { /* below 2^-14: subnormal or zero */
		/* Adding 0.5 puts the 10 result bits at the bottom of the mantissa,
		 * rounded to nearest even by the FPU. */
		float v, half = 0.5f;
		memcpy(&v, &x, 4);
		v += half;
		uint32_t r;
		memcpy(&r, &v, 4);
		return sign | (uint16_t)(r - 0x3f000000u);
	}
	/* Normal: rebias the exponent (127 -> 15), round the 13 dropped bits
	 * to nearest even; a carry into the exponent is the right result (up to inf). */
	x += ((uint32_t)(15 - 127) << 23) + 0xfffu + ((x >> 13) & 1);
	return sign | (uint16_t)(x >> 13);
}

uint16_t arena_f32_to_bf16(float f)
{
	return f32_to_bf16(f);
}

uint16_t arena_f32_to_f16(float f)
{
	return f32_to_f16(f);
}

int arena_synth_fill(void *dst, arena_dtype dtype, uint64_t key, uint64_t first, size_t n)
{
	if (dtype != ARENA_DTYPE_F32 && dtype != ARENA_DTYPE_F16 && dtype != ARENA_DTYPE_BF16)
		return arena_errorf(ARENA_E_USAGE, "synth: dtype %s: only F32, F16 and BF16 values are made",
				    arena_dtype_name(dtype));
	pthread_once(&tab_once, build_tables);
	uint8_t *p = dst;
	uint64_t i = first, end = first + n;
	size_t es = dtype == ARENA_DTYPE_F32 ? 4 : 2;
#define PUT(idx, bits)                                                                                  \
	do {                                                                                            \
		uint32_t b_ = (bits);                                                                   \
		uint8_t *q_ = p + ((idx) - first) * es;                                                 \
		if (dtype == ARENA_DTYPE_F32) {                                                         \
			memcpy(q_, &b_, 4);                                                             \
		} else {                                                                                \
			float f_;                                                                       \
			memcpy(&f_, &b_, 4);                                                            \
			uint16_t h_ = dtype == ARENA_DTYPE_BF16 ? f32_to_bf16(f_) : f32_to_f16(f_); \
			memcpy(q_, &h_, 2);                                                             \
		}                                                                                       \
	} while (0)
	if (i < end && (i & 1)) {
		PUT(i, value_bits(pair_hash(key, i >> 1), 1));
		i++;
	}
	/* Pairs: one hash, two values; a loop per dtype. */
	if (dtype == ARENA_DTYPE_BF16) {
		for (; i + 1 < end; i += 2) {
			uint64_t h = pair_hash(key, i >> 1);
			uint32_t b0 = value_bits(h, 0), b1 = value_bits(h, 1);
			b0 += 0x7fffu + ((b0 >> 16) & 1);
			b1 += 0x7fffu + ((b1 >> 16) & 1);
			uint32_t two = (b0 >> 16) | (b1 & 0xffff0000u);
			memcpy(p + (i - first) * 2, &two, 4);
		}
	} else if (dtype == ARENA_DTYPE_F16) {
		for (; i + 1 < end; i += 2) {
			uint64_t h = pair_hash(key, i >> 1);
			uint32_t b0 = value_bits(h, 0), b1 = value_bits(h, 1);
			float f0, f1;
			memcpy(&f0, &b0, 4);
			memcpy(&f1, &b1, 4);
			uint32_t two = (uint32_t)f32_to_f16(f0) | (uint32_t)f32_to_f16(f1) << 16;
			memcpy(p + (i - first) * 2, &two, 4);
		}
	} else {
		for (; i + 1 < end; i += 2) {
			uint64_t h = pair_hash(key, i >> 1);
			uint32_t two[2] = {value_bits(h, 0), value_bits(h, 1)};
			memcpy(p + (i - first) * 4, two, 8);
		}
	}
	if (i < end)
		PUT(i, value_bits(pair_hash(key, i >> 1), 0));
#undef PUT
	return 0;
}

/* ------------------------------------------------------------------------ */
/* The writer: threads fill 4 MiB pieces of the data section and write each  */
/* at its place (arena_stw_pwrite); the caller's thread reports progress.     */

#define PIECE_SIZE (4u << 20)
#define PROGRESS_NS 100000000L /* progress every 0.1 s */

typedef struct synth_run {
	arena_stw *w;
	const arena_stw_tensor **t; /* data order */
	uint64_t *keys;
	size_t n;
	arena_dtype dtype;
	unsigned esize;
	uint64_t total;
	size_t npieces;
	uint8_t **buf;              /* one piece per thread */
	_Atomic size_t next;        /* next piece to claim */
	_Atomic uint64_t done;      /* data bytes written */
	_Atomic int stop;
	pthread_mutex_t mu;         /* guards what follows */
	pthread_cond_t cv;
	unsigned running;
	int rc;                     /* first failure of a thread, its message in msg */
	char msg[1024];
} synth_run;

typedef struct synth_worker {
	synth_run *r;
	uint8_t *buf;
} synth_worker;

/* First tensor whose data ends after byte `off`. */
static size_t tensor_at(const synth_run *r, uint64_t off)
{
	size_t lo = 0, hi = r->n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (r->t[mid]->end <= off)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* Fill data bytes [off, end) into dst. */
static void fill_range(const synth_run *r, uint64_t off, uint64_t end, uint8_t *dst)
{
	uint64_t base = off;
	for (size_t i = tensor_at(r, off); i < r->n && off < end; i++) {
		const arena_stw_tensor *t = r->t[i];
		uint64_t a = off > t->begin ? off : t->begin;
		uint64_t b = t->end < end ? t->end : end;
		if (a >= b)
			continue;
		arena_synth_fill(dst + (a - base), r->dtype, r->keys[i], (a - t->begin) / r->esize,
				 (size_t)((b - a) / r->esize));
		off = b;
	}
}

static void *fill_thread(void *arg)
{
	synth_worker *wk = arg;
	synth_run *r = wk->r;
	int rc = 0;
	while (!rc && !atomic_load(&r->stop)) {
		size_t k = atomic_fetch_add(&r->next, 1);
		if (k >= r->npieces)
			break;
		uint64_t off = (uint64_t)k * PIECE_SIZE;
		uint64_t len = r->total - off < PIECE_SIZE ? r->total - off : PIECE_SIZE;
		fill_range(r, off, off + len, wk->buf);
		rc = arena_stw_pwrite(r->w, off, wk->buf, (size_t)len);
		if (!rc)
			atomic_fetch_add(&r->done, len);
	}
	pthread_mutex_lock(&r->mu);
	if (rc && !r->rc) {
		r->rc = rc;
		snprintf(r->msg, sizeof(r->msg), "%s", arena_last_error()); /* this thread's message */
		atomic_store(&r->stop, 1);
	}
	r->running--;
	pthread_cond_broadcast(&r->cv);
	pthread_mutex_unlock(&r->mu);
	return NULL;
}

static unsigned default_threads(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	return n < 1 ? 1 : n > 64 ? 64 : (unsigned)n;
}

/* Run the threads to the end (or the first failure or cancel), reporting
 * progress from this thread. */
static int run_threads(synth_run *r, unsigned nthreads, const arena_synth_opts *o)
{
	pthread_t *th = arena_calloc(nthreads, sizeof(*th));
	synth_worker *wk = arena_calloc(nthreads, sizeof(*wk));
	if (!th || !wk) {
		arena_free(th);
		arena_free(wk);
		return arena_errorf(ARENA_E_NOMEM, "synth: out of memory");
	}
	int rc = 0;
	unsigned started = 0;
	pthread_mutex_lock(&r->mu);
	for (; started < nthreads; started++) {
		wk[started] = (synth_worker){r, r->buf[started]};
		int e = pthread_create(&th[started], NULL, fill_thread, &wk[started]);
		if (e) { /* go on with fewer threads, if there is one */
			if (!started)
				rc = arena_syserrorf(ARENA_E_NOMEM, e, "synth: cannot start a fill thread");
			break;
		}
		r->running++;
	}
	while (r->running) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += PROGRESS_NS;
		if (ts.tv_nsec >= 1000000000L)
			ts.tv_sec++, ts.tv_nsec -= 1000000000L;
		pthread_cond_timedwait(&r->cv, &r->mu, &ts);
		if (!rc && o->progress && r->running) {
			pthread_mutex_unlock(&r->mu);
			rc = o->progress(o->progress_ctx, atomic_load(&r->done), r->total);
			if (rc)
				atomic_store(&r->stop, 1);
			pthread_mutex_lock(&r->mu);
		}
	}
	pthread_mutex_unlock(&r->mu);
	for (unsigned i = 0; i < started; i++)
		pthread_join(th[i], NULL);
	arena_free(th);
	arena_free(wk);
	if (!rc && r->rc)
		rc = arena_errorf(r->rc, "%s", r->msg);
	if (!rc && atomic_load(&r->done) != r->total)
		rc = arena_errorf(ARENA_E_INTERNAL, "synth: %llu of %llu bytes made",
				  (unsigned long long)atomic_load(&r->done), (unsigned long long)r->total);
	if (!rc && o->progress) /* the last call sees done == total and may still cancel */
		rc = o->progress(o->progress_ctx, r->total, r->total);
	return rc;
}

int arena_synth_write(const char *path, const arena_synth_list *l, const arena_synth_opts *o)
{
	arena_dtype dt = o->dtype;
	if (dt != ARENA_DTYPE_F32 && dt != ARENA_DTYPE_F16 && dt != ARENA_DTYPE_BF16)
		return arena_errorf(ARENA_E_USAGE, "%s: dtype %s: only F32, F16 and BF16 values are made", path,
				    arena_dtype_name(dt));
	pthread_once(&tab_once, build_tables);
	unsigned nthreads = o->threads ? o->threads : default_threads();
	synth_run r;
	memset(&r, 0, sizeof(r));
	atomic_init(&r.next, 0);
	atomic_init(&r.done, 0);
	atomic_init(&r.stop, 0);
	r.dtype = dt;
	r.esize = arena_dtype_bits(dt) / 8;
	int rc = arena_stw_create_flags(path, o->force ? 0 : ARENA_OUTFILE_NEW, &r.w);
	if (rc)
		return rc;
	rc = arena_stw_meta(r.w, "format", "pt");
	rc = rc ? rc : arena_stw_meta(r.w, "generator", "arena synth");
	rc = rc ? rc : arena_stw_meta(r.w, "layout", o->layout ? o->layout : "");
	for (size_t i = 0; !rc && i < l->n; i++)
		rc = arena_stw_add(r.w, l->t[i].name, dt, l->t[i].rank, l->t[i].shape);
	rc = rc ? rc : arena_stw_begin(r.w);
	int locks = 0;
	if (!rc) {
		r.n = arena_stw_count(r.w);
		r.total = arena_stw_data_size(r.w);
		r.npieces = (size_t)((r.total + PIECE_SIZE - 1) / PIECE_SIZE);
		if (nthreads > r.npieces)
			nthreads = r.npieces ? (unsigned)r.npieces : 1;
		r.t = arena_calloc(r.n, sizeof(*r.t));
		r.keys = arena_calloc(r.n, sizeof(*r.keys));
		r.buf = arena_calloc(nthreads, sizeof(*r.buf));
		if (!r.t || !r.keys || !r.buf)
			rc = arena_errorf(ARENA_E_NOMEM, "%s: out of memory", path);
		for (unsigned s = 0; !rc && s < nthreads; s++)
			if (!(r.buf[s] = arena_malloc(PIECE_SIZE)))
				rc = arena_errorf(ARENA_E_NOMEM, "%s: out of memory for %u buffers of %u MiB", path,
						  nthreads, PIECE_SIZE >> 20);
		for (size_t i = 0; !rc && i < r.n; i++) {
			r.t[i] = arena_stw_get(r.w, i);
			r.keys[i] = arena_synth_key(o->seed, r.t[i]->name);
		}
	}
	if (!rc) {
		pthread_mutex_init(&r.mu, NULL);
		pthread_cond_init(&r.cv, NULL);
		locks = 1;
		rc = run_threads(&r, nthreads, o);
	}
	if (!rc)
		rc = arena_stw_commit(r.w);
	else
		arena_stw_abort(r.w);
	if (locks) {
		pthread_cond_destroy(&r.cv);
		pthread_mutex_destroy(&r.mu);
	}
	for (unsigned s = 0; r.buf && s < nthreads; s++)
		arena_free(r.buf[s]);
	arena_free(r.buf);
	arena_free(r.keys);
	arena_free(r.t);
	return rc;
}
