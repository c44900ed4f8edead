/* synth.h - synthetic checkpoints: a real model's tensor names and shapes,
 * random values, written streaming. For benchmarks and tests.
 *
 * Layouts are made by small generator functions from a model config, the
 * same config the real library takes (diffusers FluxTransformer2DModel,
 * transformers LlamaForCausalLM), so a layout's names and shapes can be
 * checked against a file the real library wrote (tests/unit/test_synth.c).
 *
 * Values. Element i of tensor NAME, for a seed S, is a function of
 * (S, NAME, i) only: key = XXH64(NAME, S); the 64 bits
 * splitmix64(key + (i/2 + 1) * 0x9E3779B97F4A7C15) give 32 bits to each of
 * the elements 2p and 2p+1 (low half to the even one). Of those 32 bits, the
 * top one is the sign and the rest pick a point of the half-normal
 * distribution through its quantile function, tabulated at 1024 points and
 * interpolated linearly (the outermost segment recurses into a finer table
 * from fresh bits, three times, so the tails reach 7 sigma). The value is
 * computed in f32, times ARENA_SYNTH_STD, and rounded to the output dtype to
 * nearest even. So the bytes depend on the seed, the names and the dtype, not
 * on the thread count, the chunking, the order of the tensors or --blocks
 * (a tensor has the same values in a smaller model). The tables are built
 * once with libm's erfc; a libm that differs in the last bit could in rare
 * cases change an f32 value's last bit.
 */
#ifndef ARENA_CONVERT_SYNTH_H
#define ARENA_CONVERT_SYNTH_H

#include <stddef.h>
#include <stdint.h>

#include "../formats/dtype.h"

#define ARENA_SYNTH_STD 0.02f
#define ARENA_SYNTH_NAME_MAX 128
#define ARENA_SYNTH_MAX_RANK 4

typedef struct arena_synth_tensor {
	char name[ARENA_SYNTH_NAME_MAX];
	uint32_t rank;
	uint64_t shape[ARENA_SYNTH_MAX_RANK];
} arena_synth_tensor;

/* A list of tensors; zero-initialise it, release it with arena_synth_list_release. */
typedef struct arena_synth_list {
	arena_synth_tensor *t;
	size_t n, cap;
} arena_synth_list;

/* diffusers FluxTransformer2DModel's constructor arguments (those that shape
 * weights). axes_dims_rope has no weights. */
typedef struct arena_synth_flux_config {
	uint64_t patch_size;            /* 1 */
	uint64_t in_channels;           /* 64 */
	uint64_t out_channels;          /* 0: same as in_channels */
	uint64_t num_layers;            /* double-stream blocks: transformer_blocks.N */
	uint64_t num_single_layers;     /* single-stream blocks: single_transformer_blocks.N */
	uint64_t attention_head_dim;    /* 128 */
	uint64_t num_attention_heads;   /* 24; inner dim = heads x head_dim */
	uint64_t joint_attention_dim;   /* 4096 (T5 width) */
	uint64_t pooled_projection_dim; /* 768 (CLIP pooled width) */
	uint64_t timestep_channels;     /* 256 (sinusoidal projection width) */
	uint64_t mlp_ratio;             /* 4 */
	int guidance_embeds;            /* 1: time_text_embed.guidance_embedder */
} arena_synth_flux_config;

/* transformers LlamaConfig (the fields that shape weights). */
typedef struct arena_synth_llama_config {
	uint64_t hidden_size;
	uint64_t intermediate_size;
	uint64_t num_hidden_layers;    /* model.layers.N */
	uint64_t num_attention_heads;
	uint64_t num_key_value_heads;
	uint64_t head_dim;             /* 0: hidden_size / num_attention_heads */
	uint64_t vocab_size;
	int tie_word_embeddings;       /* 1: no lm_head.weight */
} arena_synth_llama_config;

extern const arena_synth_flux_config arena_synth_flux_dev;   /* FLUX.1-dev */
extern const arena_synth_flux_config arena_synth_flux_tiny;  /* the reference tiny_flux fixture */
extern const arena_synth_llama_config arena_synth_llama_8b;  /* Llama-3-8B */
extern const arena_synth_llama_config arena_synth_llama_tiny; /* the reference tiny_llama fixture */

/* Append the tensors of a Flux transformer / a Llama causal LM to `out`, in
 * module order. blocks < 0 keeps every repeated block; blocks >= 0 keeps the
 * first `blocks` of each repeated container. Errors: USAGE (a zero or
 * inconsistent dimension), NOMEM. On failure `out` may hold part of the list. */
int arena_synth_flux(const arena_synth_flux_config *c, long blocks, arena_synth_list *out);
int arena_synth_llama(const arena_synth_llama_config *c, long blocks, arena_synth_list *out);

/* The named layouts. */
typedef struct arena_synth_layout {
	const char *name;    /* "flux-dev" */
	const char *summary; /* one line for --help */
	int (*make)(long blocks, arena_synth_list *out);
} arena_synth_layout;

/* The layout table, terminated by an entry with name NULL. */
extern const arena_synth_layout arena_synth_layouts[];

/* Fill `out` (zero-initialised) with layout `name`. Errors: USAGE for an
 * unknown layout (the message lists the known ones), NOMEM. */
int arena_synth_layout_make(const char *name, long blocks, arena_synth_list *out);

/* Sum of the tensors' element counts. */
uint64_t arena_synth_params(const arena_synth_list *l);

/* Free the list's storage and zero it. Accepts NULL. */
void arena_synth_list_release(arena_synth_list *l);

/* The per-tensor key of the value stream (see the top of this file). */
uint64_t arena_synth_key(uint64_t seed, const char *name);

/* The value of element `index` of the stream `key`, in f32 (before rounding
 * to the output dtype). */
float arena_synth_value(uint64_t key, uint64_t index);

/* Write elements [first, first + n) of the stream `key` at dst (little
 * endian) as `dtype`: F32, F16 or BF16 (anything else is USAGE). */
int arena_synth_fill(void *dst, arena_dtype dtype, uint64_t key, uint64_t first, size_t n);

/* f32 -> f16 / bf16, round to nearest even (NaN stays NaN, overflow is inf). */
uint16_t arena_f32_to_f16(float f);
uint16_t arena_f32_to_bf16(float f);

/* Called from the thread that called arena_synth_write, about every 0.1 s
 * while the fill threads work and once more at the end (done == total, before
 * the commit's fsync), with the data bytes written and the total. A non-zero
 * return cancels the write: that value is returned and nothing is left. */
typedef int (*arena_synth_progress_fn)(void *ctx, uint64_t done, uint64_t total);

typedef struct arena_synth_opts {
	const char *layout;      /* recorded as metadata "layout" */
	arena_dtype dtype;       /* F32, F16 or BF16 */
	uint64_t seed;
	unsigned threads;        /* fill threads; 0: one per online CPU (at most 64) */
	arena_synth_progress_fn progress; /* may be NULL */
	void *progress_ctx;
	int force;               /* 1: a file at the path is replaced; 0: it is OUTPUT_EXISTS */
} arena_synth_opts;

/* Write the tensors of `l` with synthetic values to `path` as safetensors
 * (formats/st_write.h: data order by name), metadata {"format": "pt",
 * "generator": "arena synth", "layout": opts->layout}. Each fill thread
 * takes the next 4 MiB piece of the data section, fills it and writes it at
 * its place (arena_stw_pwrite), so the page-cache copies run in parallel too;
 * memory is one piece per thread whatever the model's size. The file appears
 * whole at commit or not at all. Errors: USAGE (bad dtype or list), NOMEM,
 * NOT_FOUND / IO (output), DUPLICATE_TENSOR, or the progress callback's code. */
int arena_synth_write(const char *path, const arena_synth_list *l, const arena_synth_opts *opts);

#endif
