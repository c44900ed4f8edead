/* test_plan.c - block discovery from a checkpoint's structure (convert/plan.h):
 * the tensor names and shapes of real model families built in memory (no
 * files), the blocks and order arena_plan_build makes of them, and the
 * discovery report (arena_plan_describe, arena_plan_report_line). */
#include <criterion/criterion.h>

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "../../common/alloc.h"
#include "../../formats/checkpoint.h"
#include "../../convert/plan.h"
#include "../../convert/synth.h"
#include "testutil.h"

/* ---- a checkpoint in memory ------------------------------------------------ */

#define MAX_T 8192

typedef struct model {
	size_t n;
	arena_st_tensor t[MAX_T];
	char *names[MAX_T];
	uint64_t shapes[MAX_T][ARENA_MAX_RANK];
	const arena_st_tensor *ptrs[MAX_T];
	arena_st_file file;
	arena_st_file *files[1];
	arena_ckpt ck;
} model;

static model *model_new(void)
{
	model *m = calloc(1, sizeof(*m));
	cr_assert_not_null(m);
	m->file.path = "model.safetensors";
	return m;
}

static void model_free(model *m)
{
	for (size_t i = 0; i < m->n; i++)
		free(m->names[i]);
	free(m);
}

/* Add a BF16 tensor: shape "d0,d1,..." ("" for a scalar), name printf-style. */
static void add(model *m, const char *shape, const char *fmt, ...)
{
	cr_assert_lt(m->n, MAX_T);
	char name[2048];
	va_list ap;
	va_start(ap, fmt);
	cr_assert_lt(vsnprintf(name, sizeof(name), fmt, ap), (int)sizeof(name));
	va_end(ap);
	for (size_t i = 0; i < m->n; i++)
		cr_assert_str_neq(m->names[i], name, "the test adds %s twice", name);
	arena_st_tensor *t = &m->t[m->n];
	m->names[m->n] = strdup(name);
	t->name = m->names[m->n];
	t->dtype = ARENA_DTYPE_BF16;
	t->nelem = 1;
	for (const char *p = shape; *p;) {
		char *end;
		uint64_t d = strtoull(p, &end, 10);
		cr_assert(end != p, "bad shape '%s'", shape);
		m->shapes[m->n][t->rank++] = d;
		t->nelem *= d;
		p = *end == ',' ? end + 1 : end;
	}
	t->shape = m->shapes[m->n];
	t->nbytes = 2 * t->nelem;
	t->file = &m->file;
	m->n++;
}

/* weight [o, i] and bias [o] */
static void linear(model *m, uint64_t o, uint64_t i, int bias, const char *fmt, ...)
{
	char p[480], s[64];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(p, sizeof(p), fmt, ap);
	va_end(ap);
	snprintf(s, sizeof(s), "%llu,%llu", (unsigned long long)o, (unsigned long long)i);
	add(m, s, "%s.weight", p);
	if (bias) {
		snprintf(s, sizeof(s), "%llu", (unsigned long long)o);
		add(m, s, "%s.bias", p);
	}
}

/* a norm's weight and bias [c] */
static void norm(model *m, uint64_t c, int bias, const char *fmt, ...)
{
	char p[480], s[32];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(p, sizeof(p), fmt, ap);
	va_end(ap);
	snprintf(s, sizeof(s), "%llu", (unsigned long long)c);
	add(m, s, "%s.weight", p);
	if (bias)
		add(m, s, "%s.bias", p);
}

/* a 2-D convolution [o, i, k, k] and its bias */
static void conv(model *m, uint64_t o, uint64_t i, uint64_t k, const char *fmt, ...)
{
	char p[480], s[64];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(p, sizeof(p), fmt, ap);
	va_end(ap);
	snprintf(s, sizeof(s), "%llu,%llu,%llu,%llu", (unsigned long long)o, (unsigned long long)i,
		 (unsigned long long)k, (unsigned long long)k);
	add(m, s, "%s.weight", p);
	snprintf(s, sizeof(s), "%llu", (unsigned long long)o);
	add(m, s, "%s.bias", p);
}

static int by_name(const void *a, const void *b)
{
	return strcmp((*(const arena_st_tensor *const *)a)->name, (*(const arena_st_tensor *const *)b)->name);
}

/* The checkpoint as arena_ckpt_open gives it: tensors sorted by name. */
static const arena_ckpt *ckpt(model *m)
{
	for (size_t i = 0; i < m->n; i++)
		m->ptrs[i] = &m->t[i];
	qsort(m->ptrs, m->n, sizeof(m->ptrs[0]), by_name);
	m->files[0] = &m->file;
	m->ck.n_files = 1;
	m->ck.files = m->files;
	m->ck.n_tensors = m->n;
	m->ck.tensors = m->ptrs;
	return &m->ck;
}

static model *from_synth(const char *layout, long blocks)
{
	arena_synth_list l = {0};
	cr_assert_eq(arena_synth_layout_make(layout, blocks, &l), 0);
	model *m = model_new();
	for (size_t i = 0; i < l.n; i++) {
		char s[128] = "";
		size_t o = 0;
		for (uint32_t k = 0; k < l.t[i].rank; k++)
			o += (size_t)snprintf(s + o, sizeof(s) - o, "%s%llu", k ? "," : "", (unsigned long long)l.t[i].shape[k]);
		add(m, s, "%s", l.t[i].name);
	}
	arena_synth_list_release(&l);
	return m;
}

/* ---- expectations -------------------------------------------------------------- */

static arena_layout *plan(model *m, const arena_plan_opts *o)
{
	arena_layout *l = NULL;
	int rc = arena_plan_build(ckpt(m), o, &l);
	cr_assert_eq(rc, 0, "%s", arena_last_error());
	return l;
}

/* The blocks in execution order, as "name name ..." with runs of one
 * container written "container.{first..last}". */
static void blocks_text(const arena_layout *l, char *buf, size_t len)
{
	size_t o = 0;
	buf[0] = '\0';
	for (size_t b = 0; b < l->n_blocks; b++) {
		const arena_block *k = &l->blocks[b];
		size_t e = b;
		while (k->container && k->index >= 0 && e + 1 < l->n_blocks && l->blocks[e + 1].container &&
		       strcmp(l->blocks[e + 1].container, k->container) == 0 && l->blocks[e + 1].index == l->blocks[e].index + 1)
			e++;
		if (e > b)
			o += (size_t)snprintf(buf + o, len - o, "%s%s.{%lld..%lld}", o ? " " : "", k->container,
					      (long long)k->index, (long long)l->blocks[e].index);
		else
			o += (size_t)snprintf(buf + o, len - o, "%s%s", o ? " " : "", k->name);
		cr_assert_lt(o, len);
		b = e;
	}
}

static void expect_blocks(model *m, const char *want)
{
	arena_layout *l = plan(m, NULL);
	char got[4096];
	blocks_text(l, got, sizeof(got));
	cr_expect_str_eq(got, want);
	arena_layout_free(l);
}

/* The block a tensor lands in. */
static const char *block_of(const arena_layout *l, const char *name)
{
	for (size_t i = 0; i < l->n_tensors; i++)
		if (strcmp(l->tensors[i].name, name) == 0)
			return l->blocks[l->tensors[i].block].name;
	cr_assert_fail("no tensor %s", name);
	return NULL;
}

static void expect_in(model *m, const char *tensor, const char *block)
{
	arena_layout *l = plan(m, NULL);
	cr_expect_str_eq(block_of(l, tensor), block, "%s", tensor);
	arena_layout_free(l);
}

static arena_plan_report *describe(model *m)
{
	arena_plan_report *r = NULL;
	cr_assert_eq(arena_plan_describe(ckpt(m), NULL, &r), 0, "%s", arena_last_error());
	return r;
}

static void expect_line(model *m, const char *want)
{
	arena_plan_report *r = describe(m);
	char line[4096];
	size_t n = arena_plan_report_line(r, line, sizeof(line));
	cr_assert_lt(n, sizeof(line));
	cr_expect_str_eq(line, want);
	arena_plan_report_free(r);
}

static const arena_plan_found *found(const arena_plan_report *r, const char *path)
{
	for (size_t i = 0; i < r->n_found; i++)
		if (strcmp(r->found[i].path, path) == 0)
			return &r->found[i];
	cr_assert_fail("the report has no %s", path);
	return NULL;
}

/* ---- model families -------------------------------------------------------------- */

/* diffusers FluxTransformer2DModel (inner dim d, text width 32). */
static void flux_diffusers(model *m, int nd, int ns, uint64_t d)
{
	linear(m, d, 16, 1, "x_embedder");
	linear(m, d, 32, 1, "context_embedder");
	const char *emb[] = {"timestep_embedder", "guidance_embedder", "text_embedder"};
	for (int e = 0; e < 3; e++) {
		linear(m, d, e == 2 ? 16 : 256, 1, "time_text_embed.%s.linear_1", emb[e]);
		linear(m, d, d, 1, "time_text_embed.%s.linear_2", emb[e]);
	}
	for (int b = 0; b < nd; b++) {
		linear(m, 6 * d, d, 1, "transformer_blocks.%d.norm1.linear", b);
		linear(m, 6 * d, d, 1, "transformer_blocks.%d.norm1_context.linear", b);
		const char *p[] = {"to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out", "to_out.0"};
		for (int k = 0; k < 8; k++)
			linear(m, d, d, 1, "transformer_blocks.%d.attn.%s", b, p[k]);
		const char *n[] = {"norm_q", "norm_k", "norm_added_q", "norm_added_k"};
		for (int k = 0; k < 4; k++)
			norm(m, 16, 0, "transformer_blocks.%d.attn.%s", b, n[k]);
		const char *ff[] = {"ff", "ff_context"};
		for (int k = 0; k < 2; k++) {
			linear(m, 4 * d, d, 1, "transformer_blocks.%d.%s.net.0.proj", b, ff[k]);
			linear(m, d, 4 * d, 1, "transformer_blocks.%d.%s.net.2", b, ff[k]);
		}
	}
	for (int b = 0; b < ns; b++) {
		linear(m, 3 * d, d, 1, "single_transformer_blocks.%d.norm.linear", b);
		linear(m, 4 * d, d, 1, "single_transformer_blocks.%d.proj_mlp", b);
		linear(m, d, 5 * d, 1, "single_transformer_blocks.%d.proj_out", b);
		const char *p[] = {"to_q", "to_k", "to_v"};
		for (int k = 0; k < 3; k++)
			linear(m, d, d, 1, "single_transformer_blocks.%d.attn.%s", b, p[k]);
		norm(m, 16, 0, "single_transformer_blocks.%d.attn.norm_q", b);
		norm(m, 16, 0, "single_transformer_blocks.%d.attn.norm_k", b);
	}
	linear(m, 2 * d, d, 1, "norm_out.linear");
	linear(m, 16, d, 1, "proj_out");
}

/* The original (Black Forest Labs) Flux names, under prefix ("" or
 * "model.diffusion_model."). */
static void flux_bfl(model *m, const char *pre, int nd, int ns, uint64_t d)
{
	linear(m, d, 64, 1, "%simg_in", pre);
	linear(m, d, 64, 1, "%stxt_in", pre);
	const char *mlp[] = {"time_in", "vector_in", "guidance_in"};
	for (int k = 0; k < 3; k++) {
		linear(m, d, 256, 1, "%s%s.in_layer", pre, mlp[k]);
		linear(m, d, d, 1, "%s%s.out_layer", pre, mlp[k]);
	}
	for (int b = 0; b < nd; b++) {
		const char *s[] = {"img", "txt"};
		for (int k = 0; k < 2; k++) {
			linear(m, 6 * d, d, 1, "%sdouble_blocks.%d.%s_mod.lin", pre, b, s[k]);
			linear(m, 3 * d, d, 1, "%sdouble_blocks.%d.%s_attn.qkv", pre, b, s[k]);
			add(m, "16", "%sdouble_blocks.%d.%s_attn.norm.query_norm.scale", pre, b, s[k]);
			add(m, "16", "%sdouble_blocks.%d.%s_attn.norm.key_norm.scale", pre, b, s[k]);
			linear(m, d, d, 1, "%sdouble_blocks.%d.%s_attn.proj", pre, b, s[k]);
			linear(m, 4 * d, d, 1, "%sdouble_blocks.%d.%s_mlp.0", pre, b, s[k]);
			linear(m, d, 4 * d, 1, "%sdouble_blocks.%d.%s_mlp.2", pre, b, s[k]);
		}
	}
	for (int b = 0; b < ns; b++) {
		linear(m, 7 * d, d, 1, "%ssingle_blocks.%d.linear1", pre, b);
		linear(m, d, 5 * d, 1, "%ssingle_blocks.%d.linear2", pre, b);
		add(m, "16", "%ssingle_blocks.%d.norm.query_norm.scale", pre, b);
		add(m, "16", "%ssingle_blocks.%d.norm.key_norm.scale", pre, b);
		linear(m, 3 * d, d, 1, "%ssingle_blocks.%d.modulation.lin", pre, b);
	}
	linear(m, 64, d, 1, "%sfinal_layer.linear", pre);
	linear(m, 2 * d, d, 1, "%sfinal_layer.adaLN_modulation.1", pre);
}

/* diffusers SD3Transformer2DModel: the last block is context_pre_only (no
 * ff_context, no to_add_out, a 2d-wide norm1_context); with dual > 0 the
 * first `dual` blocks have a second attention (SD3.5 medium). */
static void sd3(model *m, int nb, int dual, uint64_t d)
{
	conv(m, d, 16, 2, "pos_embed.proj");
	add(m, "1,4096,32", "pos_embed.pos_embed");
	linear(m, d, 256, 1, "time_text_embed.timestep_embedder.linear_1");
	linear(m, d, d, 1, "time_text_embed.timestep_embedder.linear_2");
	linear(m, d, 64, 1, "time_text_embed.text_embedder.linear_1");
	linear(m, d, d, 1, "time_text_embed.text_embedder.linear_2");
	linear(m, d, 64, 1, "context_embedder");
	for (int b = 0; b < nb; b++) {
		int last = b == nb - 1;
		linear(m, (b < dual ? 9 : 6) * d, d, 1, "transformer_blocks.%d.norm1.linear", b);
		linear(m, (last ? 2 : 6) * d, d, 1, "transformer_blocks.%d.norm1_context.linear", b);
		const char *p[] = {"to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj", "to_out.0"};
		for (int k = 0; k < 7; k++)
			linear(m, d, d, 1, "transformer_blocks.%d.attn.%s", b, p[k]);
		if (!last)
			linear(m, d, d, 1, "transformer_blocks.%d.attn.to_add_out", b);
		if (b < dual) {
			const char *q[] = {"to_q", "to_k", "to_v", "to_out.0"};
			for (int k = 0; k < 4; k++)
				linear(m, d, d, 1, "transformer_blocks.%d.attn2.%s", b, q[k]);
		}
		linear(m, 4 * d, d, 1, "transformer_blocks.%d.ff.net.0.proj", b);
		linear(m, d, 4 * d, 1, "transformer_blocks.%d.ff.net.2", b);
		if (!last) {
			linear(m, 4 * d, d, 1, "transformer_blocks.%d.ff_context.net.0.proj", b);
			linear(m, d, 4 * d, 1, "transformer_blocks.%d.ff_context.net.2", b);
		}
	}
	linear(m, 2 * d, d, 1, "norm_out.linear");
	linear(m, 64, d, 1, "proj_out");
}

/* diffusers ResnetBlock2D (temb: with time_emb_proj) */
static void resnet(model *m, uint64_t i, uint64_t o, int temb, const char *p)
{
	norm(m, i, 1, "%s.norm1", p);
	conv(m, o, i, 3, "%s.conv1", p);
	if (temb)
		linear(m, o, 4 * 32, 1, "%s.time_emb_proj", p);
	norm(m, o, 1, "%s.norm2", p);
	conv(m, o, o, 3, "%s.conv2", p);
	if (i != o)
		conv(m, o, i, 1, "%s.conv_shortcut", p);
}

/* diffusers Transformer2DModel with one BasicTransformerBlock (cross
 * attention to width x) */
static void xformer(model *m, uint64_t c, uint64_t x, const char *p)
{
	norm(m, c, 1, "%s.norm", p);
	conv(m, c, c, 1, "%s.proj_in", p);
	const char *a[] = {"attn1", "attn2"};
	for (int k = 0; k < 2; k++) {
		norm(m, c, 1, "%s.transformer_blocks.0.norm%d", p, k + 1);
		linear(m, c, c, 0, "%s.transformer_blocks.0.%s.to_q", p, a[k]);
		linear(m, c, k ? x : c, 0, "%s.transformer_blocks.0.%s.to_k", p, a[k]);
		linear(m, c, k ? x : c, 0, "%s.transformer_blocks.0.%s.to_v", p, a[k]);
		linear(m, c, c, 1, "%s.transformer_blocks.0.%s.to_out.0", p, a[k]);
	}
	norm(m, c, 1, "%s.transformer_blocks.0.norm3", p);
	linear(m, 8 * c, c, 1, "%s.transformer_blocks.0.ff.net.0.proj", p);
	linear(m, c, 4 * c, 1, "%s.transformer_blocks.0.ff.net.2", p);
	conv(m, c, c, 1, "%s.proj_out", p);
}

/* diffusers UNet2DConditionModel: stages of ch[s] channels, attn[s] marks
 * the cross-attention stages (down in this order, up reversed), lpb
 * layers per block. */
static void unet(model *m, int n, const uint64_t *ch, const int *attn, int lpb)
{
	char p[256];
	conv(m, ch[0], 4, 3, "conv_in");
	linear(m, 4 * 32, ch[0], 1, "time_embedding.linear_1");
	linear(m, 4 * 32, 4 * 32, 1, "time_embedding.linear_2");
	uint64_t in = ch[0];
	for (int s = 0; s < n; s++) {
		for (int j = 0; j < lpb; j++) {
			snprintf(p, sizeof(p), "down_blocks.%d.resnets.%d", s, j);
			resnet(m, j ? ch[s] : in, ch[s], 1, p);
			if (attn[s]) {
				snprintf(p, sizeof(p), "down_blocks.%d.attentions.%d", s, j);
				xformer(m, ch[s], 48, p);
			}
		}
		if (s < n - 1)
			conv(m, ch[s], ch[s], 3, "down_blocks.%d.downsamplers.0.conv", s);
		in = ch[s];
	}
	uint64_t c = ch[n - 1];
	resnet(m, c, c, 1, "mid_block.resnets.0");
	xformer(m, c, 48, "mid_block.attentions.0");
	resnet(m, c, c, 1, "mid_block.resnets.1");
	for (int u = 0; u < n; u++) {
		int s = n - 1 - u;
		uint64_t prev = u ? ch[s + 1] : c;
		for (int j = 0; j <= lpb; j++) {
			uint64_t skip = j < lpb ? ch[s] : (s ? ch[s - 1] : ch[0]);
			snprintf(p, sizeof(p), "up_blocks.%d.resnets.%d", u, j);
			resnet(m, (j ? ch[s] : prev) + skip, ch[s], 1, p);
			if (attn[s]) {
				snprintf(p, sizeof(p), "up_blocks.%d.attentions.%d", u, j);
				xformer(m, ch[s], 48, p);
			}
		}
		if (u < n - 1)
			conv(m, ch[s], ch[s], 3, "up_blocks.%d.upsamplers.0.conv", u);
	}
	norm(m, ch[0], 1, "conv_norm_out");
	conv(m, 4, ch[0], 3, "conv_out");
}

/* diffusers AutoencoderKL (4 stages of ch[s], two resnets down, three up). */
static void vae(model *m, const uint64_t *ch)
{
	char p[256];
	conv(m, ch[0], 3, 3, "encoder.conv_in");
	uint64_t in = ch[0];
	for (int s = 0; s < 4; s++) {
		for (int j = 0; j < 2; j++) {
			snprintf(p, sizeof(p), "encoder.down_blocks.%d.resnets.%d", s, j);
			resnet(m, j ? ch[s] : in, ch[s], 0, p);
		}
		if (s < 3)
			conv(m, ch[s], ch[s], 3, "encoder.down_blocks.%d.downsamplers.0.conv", s);
		in = ch[s];
	}
	const char *coder[] = {"encoder", "decoder"};
	for (int e = 0; e < 2; e++) {
		snprintf(p, sizeof(p), "%s.mid_block.resnets.0", coder[e]);
		resnet(m, ch[3], ch[3], 0, p);
		snprintf(p, sizeof(p), "%s.mid_block.resnets.1", coder[e]);
		resnet(m, ch[3], ch[3], 0, p);
		norm(m, ch[3], 1, "%s.mid_block.attentions.0.group_norm", coder[e]);
		const char *a[] = {"to_q", "to_k", "to_v", "to_out.0"};
		for (int k = 0; k < 4; k++)
			linear(m, ch[3], ch[3], 1, "%s.mid_block.attentions.0.%s", coder[e], a[k]);
	}
	norm(m, ch[3], 1, "encoder.conv_norm_out");
	conv(m, 8, ch[3], 3, "encoder.conv_out");
	conv(m, 8, 8, 1, "quant_conv");
	conv(m, 4, 4, 1, "post_quant_conv");
	conv(m, ch[3], 4, 3, "decoder.conv_in");
	in = ch[3];
	for (int u = 0; u < 4; u++) {
		int s = 3 - u;
		for (int j = 0; j < 3; j++) {
			snprintf(p, sizeof(p), "decoder.up_blocks.%d.resnets.%d", u, j);
			resnet(m, j ? ch[s] : in, ch[s], 0, p);
		}
		if (u < 3)
			conv(m, ch[s], ch[s], 3, "decoder.up_blocks.%d.upsamplers.0.conv", u);
		in = ch[s];
	}
	norm(m, ch[0], 1, "decoder.conv_norm_out");
	conv(m, 3, ch[0], 3, "decoder.conv_out");
}

/* transformers T5EncoderModel (gated-gelu, as T5 v1.1 / Flux's T5-XXL):
 * block 0 alone holds relative_attention_bias; untied adds
 * encoder.embed_tokens.weight (a tied one is stored once, as shared). */
static void t5_encoder(model *m, int nb, uint64_t d, int untied)
{
	add(m, "128,32", "shared.weight");
	if (untied)
		add(m, "128,32", "encoder.embed_tokens.weight");
	for (int b = 0; b < nb; b++) {
		const char *qkvo[] = {"q", "k", "v", "o"};
		for (int k = 0; k < 4; k++)
			linear(m, d, d, 0, "encoder.block.%d.layer.0.SelfAttention.%s", b, qkvo[k]);
		if (b == 0)
			add(m, "32,4", "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight");
		norm(m, d, 0, "encoder.block.%d.layer.0.layer_norm", b);
		linear(m, 2 * d, d, 0, "encoder.block.%d.layer.1.DenseReluDense.wi_0", b);
		linear(m, 2 * d, d, 0, "encoder.block.%d.layer.1.DenseReluDense.wi_1", b);
		linear(m, d, 2 * d, 0, "encoder.block.%d.layer.1.DenseReluDense.wo", b);
		norm(m, d, 0, "encoder.block.%d.layer.1.layer_norm", b);
	}
	norm(m, d, 0, "encoder.final_layer_norm");
}

/* transformers CLIPTextModel */
static void clip_text(model *m, int nl, uint64_t d)
{
	add(m, "49408,32", "text_model.embeddings.token_embedding.weight");
	add(m, "77,32", "text_model.embeddings.position_embedding.weight");
	add(m, "1,77", "text_model.embeddings.position_ids");
	for (int b = 0; b < nl; b++) {
		const char *p[] = {"q_proj", "k_proj", "v_proj", "out_proj"};
		for (int k = 0; k < 4; k++)
			linear(m, d, d, 1, "text_model.encoder.layers.%d.self_attn.%s", b, p[k]);
		norm(m, d, 1, "text_model.encoder.layers.%d.layer_norm1", b);
		linear(m, 4 * d, d, 1, "text_model.encoder.layers.%d.mlp.fc1", b);
		linear(m, d, 4 * d, 1, "text_model.encoder.layers.%d.mlp.fc2", b);
		norm(m, d, 1, "text_model.encoder.layers.%d.layer_norm2", b);
	}
	norm(m, d, 1, "text_model.final_layer_norm");
}

/* transformers LlamaForCausalLM; qkv_bias: Qwen2; experts: a mixture of
 * experts MLP (Qwen2-MoE style model.layers.N.mlp.experts.E). */
static void llama(model *m, int nl, uint64_t d, int qkv_bias, int experts)
{
	add(m, "256,32", "model.embed_tokens.weight");
	for (int b = 0; b < nl; b++) {
		linear(m, d, d, qkv_bias, "model.layers.%d.self_attn.q_proj", b);
		linear(m, d / 2, d, qkv_bias, "model.layers.%d.self_attn.k_proj", b);
		linear(m, d / 2, d, qkv_bias, "model.layers.%d.self_attn.v_proj", b);
		linear(m, d, d, 0, "model.layers.%d.self_attn.o_proj", b);
		if (experts) {
			linear(m, (uint64_t)experts, d, 0, "model.layers.%d.mlp.gate", b);
			for (int e = 0; e < experts; e++) {
				linear(m, 2 * d, d, 0, "model.layers.%d.mlp.experts.%d.gate_proj", b, e);
				linear(m, 2 * d, d, 0, "model.layers.%d.mlp.experts.%d.up_proj", b, e);
				linear(m, d, 2 * d, 0, "model.layers.%d.mlp.experts.%d.down_proj", b, e);
			}
		} else {
			linear(m, 3 * d, d, 0, "model.layers.%d.mlp.gate_proj", b);
			linear(m, 3 * d, d, 0, "model.layers.%d.mlp.up_proj", b);
			linear(m, d, 3 * d, 0, "model.layers.%d.mlp.down_proj", b);
		}
		norm(m, d, 0, "model.layers.%d.input_layernorm", b);
		norm(m, d, 0, "model.layers.%d.post_attention_layernorm", b);
	}
	norm(m, d, 0, "model.norm");
	add(m, "256,32", "lm_head.weight");
}

/* transformers GPT2Model (pre: "" or "transformer." as in GPT2LMHeadModel);
 * attn.bias is the causal mask buffer older checkpoints hold. */
static void gpt2(model *m, const char *pre, int nl, uint64_t d)
{
	add(m, "256,32", "%swte.weight", pre);
	add(m, "64,32", "%swpe.weight", pre);
	for (int b = 0; b < nl; b++) {
		norm(m, d, 1, "%sh.%d.ln_1", pre, b);
		linear(m, d, 3 * d, 1, "%sh.%d.attn.c_attn", pre, b); /* Conv1D: [in, out] */
		linear(m, d, d, 1, "%sh.%d.attn.c_proj", pre, b);
		add(m, "1,1,64,64", "%sh.%d.attn.bias", pre, b);
		norm(m, d, 1, "%sh.%d.ln_2", pre, b);
		linear(m, d, 4 * d, 1, "%sh.%d.mlp.c_fc", pre, b);
		linear(m, 4 * d, d, 1, "%sh.%d.mlp.c_proj", pre, b);
	}
	norm(m, d, 1, "%sln_f", pre);
}

/* timm VisionTransformer */
static void vit(model *m, int nb, uint64_t d)
{
	add(m, "1,1,32", "cls_token");
	add(m, "1,197,32", "pos_embed");
	conv(m, d, 3, 16, "patch_embed.proj");
	for (int b = 0; b < nb; b++) {
		norm(m, d, 1, "blocks.%d.norm1", b);
		linear(m, 3 * d, d, 1, "blocks.%d.attn.qkv", b);
		linear(m, d, d, 1, "blocks.%d.attn.proj", b);
		norm(m, d, 1, "blocks.%d.norm2", b);
		linear(m, 4 * d, d, 1, "blocks.%d.mlp.fc1", b);
		linear(m, d, 4 * d, 1, "blocks.%d.mlp.fc2", b);
	}
	norm(m, d, 1, "norm");
	linear(m, 1000, d, 1, "head");
}

/* open_clip CLIP: a text tower (transformer.resblocks) and a vision tower
 * (visual.transformer.resblocks) of another width. */
static void open_clip(model *m, int nt, int nv)
{
	add(m, "77,32", "positional_embedding");
	add(m, "32,16", "text_projection");
	add(m, "", "logit_scale");
	add(m, "49408,32", "token_embedding.weight");
	norm(m, 32, 1, "ln_final");
	const char *tower[] = {"transformer", "visual.transformer"};
	for (int t = 0; t < 2; t++) {
		uint64_t d = t ? 48 : 32;
		for (int b = 0; b < (t ? nv : nt); b++) {
			norm(m, d, 1, "%s.resblocks.%d.ln_1", tower[t], b);
			char s[32];
			snprintf(s, sizeof(s), "%llu,%llu", (unsigned long long)(3 * d), (unsigned long long)d);
			add(m, s, "%s.resblocks.%d.attn.in_proj_weight", tower[t], b);
			snprintf(s, sizeof(s), "%llu", (unsigned long long)(3 * d));
			add(m, s, "%s.resblocks.%d.attn.in_proj_bias", tower[t], b);
			linear(m, d, d, 1, "%s.resblocks.%d.attn.out_proj", tower[t], b);
			norm(m, d, 1, "%s.resblocks.%d.ln_2", tower[t], b);
			linear(m, 4 * d, d, 1, "%s.resblocks.%d.mlp.c_fc", tower[t], b);
			linear(m, d, 4 * d, 1, "%s.resblocks.%d.mlp.c_proj", tower[t], b);
		}
	}
	add(m, "48", "visual.class_embedding");
	add(m, "50,48", "visual.positional_embedding");
	add(m, "48,16", "visual.proj");
	add(m, "48,3,32,32", "visual.conv1.weight");
	norm(m, 48, 1, "visual.ln_pre");
	norm(m, 48, 1, "visual.ln_post");
}

/* diffusers WanTransformer3DModel */
static void wan(model *m, int nb, uint64_t d)
{
	add(m, "32,16,1,2,2", "patch_embedding.weight");
	add(m, "32", "patch_embedding.bias");
	linear(m, d, 256, 1, "condition_embedder.time_embedder.linear_1");
	linear(m, d, d, 1, "condition_embedder.time_embedder.linear_2");
	linear(m, 6 * d, d, 1, "condition_embedder.time_proj");
	linear(m, d, 64, 1, "condition_embedder.text_embedder.linear_1");
	linear(m, d, d, 1, "condition_embedder.text_embedder.linear_2");
	for (int b = 0; b < nb; b++) {
		add(m, "1,6,32", "blocks.%d.scale_shift_table", b);
		const char *a[] = {"attn1", "attn2"};
		for (int k = 0; k < 2; k++) {
			const char *p[] = {"to_q", "to_k", "to_v", "to_out.0"};
			for (int j = 0; j < 4; j++)
				linear(m, d, d, 1, "blocks.%d.%s.%s", b, a[k], p[j]);
			norm(m, d, 0, "blocks.%d.%s.norm_q", b, a[k]);
			norm(m, d, 0, "blocks.%d.%s.norm_k", b, a[k]);
		}
		norm(m, d, 1, "blocks.%d.norm2", b);
		linear(m, 4 * d, d, 1, "blocks.%d.ffn.net.0.proj", b);
		linear(m, d, 4 * d, 1, "blocks.%d.ffn.net.2", b);
	}
	linear(m, 64, d, 1, "proj_out");
	add(m, "1,2,32", "scale_shift_table");
}

/* The original Wan 2.1 names: nn.Sequential embeddings (Linear, SiLU,
 * Linear: members 0 and 2; SiLU, Linear: member 1). */
static void wan_original(model *m, int nb, uint64_t d)
{
	add(m, "32,16,1,2,2", "patch_embedding.weight");
	add(m, "32", "patch_embedding.bias");
	linear(m, d, 64, 1, "text_embedding.0");
	linear(m, d, d, 1, "text_embedding.2");
	linear(m, d, 256, 1, "time_embedding.0");
	linear(m, d, d, 1, "time_embedding.2");
	linear(m, 6 * d, d, 1, "time_projection.1");
	for (int b = 0; b < nb; b++) {
		add(m, "1,6,32", "blocks.%d.modulation", b);
		const char *a[] = {"self_attn", "cross_attn"};
		for (int k = 0; k < 2; k++) {
			const char *p[] = {"q", "k", "v", "o"};
			for (int j = 0; j < 4; j++)
				linear(m, d, d, 1, "blocks.%d.%s.%s", b, a[k], p[j]);
			norm(m, d, 0, "blocks.%d.%s.norm_q", b, a[k]);
			norm(m, d, 0, "blocks.%d.%s.norm_k", b, a[k]);
		}
		norm(m, d, 1, "blocks.%d.norm3", b);
		linear(m, 4 * d, d, 1, "blocks.%d.ffn.0", b);
		linear(m, d, 4 * d, 1, "blocks.%d.ffn.2", b);
	}
	linear(m, 64, d, 1, "head.head");
	add(m, "1,2,32", "head.modulation");
}

/* ---- the families ------------------------------------------------------------- */

Test(discover, flux_diffusers)
{
	model *m = model_new();
	flux_diffusers(m, 3, 4, 32);
	expect_blocks(m, "globals transformer_blocks.{0..2} single_transformer_blocks.{0..3}");
	/* numbers inside a block are not containers: to_out.0, ff.net.0 */
	expect_in(m, "transformer_blocks.2.attn.to_out.0.weight", "transformer_blocks.2");
	expect_in(m, "transformer_blocks.1.ff.net.0.proj.bias", "transformer_blocks.1");
	expect_in(m, "norm_out.linear.weight", "globals");
	expect_line(m, "blocks: transformer_blocks (3, repeating), single_transformer_blocks (4, repeating); "
		       "globals: 20 tensors");
	model_free(m);
}

Test(discover, flux_bfl)
{
	const char *pre[] = {"", "model.diffusion_model."};
	for (int p = 0; p < 2; p++) {
		model *m = model_new();
		flux_bfl(m, pre[p], 2, 3, 32);
		char want[512];
		snprintf(want, sizeof(want), "globals %sdouble_blocks.{0..1} %ssingle_blocks.{0..2}", pre[p], pre[p]);
		expect_blocks(m, want);
		/* img_mlp.0 / img_mlp.2 (Linear, GELU, Linear) stay in their block */
		char t[256];
		snprintf(t, sizeof(t), "%sdouble_blocks.1.img_mlp.2.weight", pre[p]);
		snprintf(want, sizeof(want), "%sdouble_blocks.1", pre[p]);
		expect_in(m, t, want);
		/* final_layer.adaLN_modulation (SiLU, Linear) has one member */
		arena_plan_report *r = describe(m);
		snprintf(t, sizeof(t), "%sfinal_layer.adaLN_modulation", pre[p]);
		const arena_plan_found *f = found(r, t);
		cr_expect_eq(f->verdict, ARENA_PLAN_REJECTED);
		cr_expect_eq(f->reason, ARENA_PLAN_ONE);
		cr_expect_eq(f->first, 1);
		arena_plan_report_free(r);
		model_free(m);
	}
}

Test(discover, sd3_last_block_differs)
{
	model *m = model_new();
	sd3(m, 4, 0, 32);
	expect_blocks(m, "globals transformer_blocks.{0..3}");
	expect_in(m, "pos_embed.pos_embed", "globals");
	arena_plan_report *r = describe(m);
	const arena_plan_found *f = found(r, "transformer_blocks");
	cr_expect_eq(f->verdict, ARENA_PLAN_SEQUENCE);
	cr_expect_eq(f->reason, ARENA_PLAN_MOST);
	cr_expect_eq(f->members, 4);
	cr_expect_eq(f->alike, 4);
	cr_expect_eq(r->n_found, 1, "%zu", r->n_found);
	arena_plan_report_free(r);
	expect_line(m, "blocks: transformer_blocks (4, mostly repeating: 4 alike); globals: 17 tensors");
	model_free(m);
	/* SD3.5 medium: a second attention in the first blocks */
	m = model_new();
	sd3(m, 6, 3, 32);
	expect_blocks(m, "globals transformer_blocks.{0..5}");
	model_free(m);
}

Test(discover, unet_sd15)
{
	/* SD 1.5's shape at small widths: stages 0-2 cross-attention with a
	 * downsampler, stage 3 plain without; up blocks mirrored */
	static const uint64_t ch[] = {32, 64, 96, 96};
	static const int attn[] = {1, 1, 1, 0};
	model *m = model_new();
	unet(m, 4, ch, attn, 2);
	expect_blocks(m, "globals down_blocks.{0..3} mid_block up_blocks.{0..3}");
	expect_in(m, "mid_block.attentions.0.transformer_blocks.0.attn2.to_k.weight", "mid_block");
	expect_in(m, "down_blocks.3.resnets.1.conv2.weight", "down_blocks.3");
	expect_in(m, "time_embedding.linear_1.weight", "globals");
	arena_plan_report *r = describe(m);
	const arena_plan_found *d = found(r, "down_blocks"), *mid = found(r, "mid_block"), *up = found(r, "up_blocks");
	cr_expect_eq(d->reason, ARENA_PLAN_MOST);
	cr_expect_eq(d->alike, 4);
	cr_expect_eq(up->reason, ARENA_PLAN_MOST);
	cr_expect_eq(mid->verdict, ARENA_PLAN_SINGLE);
	cr_expect_eq(mid->first, -1);
	cr_expect_str_eq(mid->like, "down_blocks.0");
	/* execution order in the report too */
	cr_expect_str_eq(r->found[0].path, "down_blocks");
	cr_expect_str_eq(r->found[1].path, "mid_block");
	cr_expect_str_eq(r->found[2].path, "up_blocks");
	arena_plan_report_free(r);
	model_free(m);
}

Test(discover, unet_tiny_two_stages)
{
	/* diffusers' test config: (32, 64), DownBlock2D then CrossAttnDownBlock2D,
	 * two blocks of different kinds (no downsampler in the last) */
	static const uint64_t ch[] = {32, 64};
	static const int attn[] = {0, 1};
	model *m = model_new();
	unet(m, 2, ch, attn, 2);
	expect_blocks(m, "globals down_blocks.{0..1} mid_block up_blocks.{0..1}");
	model_free(m);
}

Test(discover, unet_mid_block_smaller_than_every_block_stays_global)
{
	/* a mid block narrower than every stage: alike them, too small to stream */
	model *m = model_new();
	char p[128];
	for (int s = 0; s < 2; s++)
		for (int j = 0; j < 2; j++) {
			snprintf(p, sizeof(p), "down_blocks.%d.resnets.%d", s, j);
			resnet(m, 64, 64, 1, p);
		}
	resnet(m, 8, 8, 1, "mid_block.resnets.0");
	resnet(m, 8, 8, 1, "mid_block.resnets.1");
	expect_blocks(m, "globals down_blocks.{0..1}");
	expect_in(m, "mid_block.resnets.1.conv1.weight", "globals");
	arena_plan_report *r = describe(m);
	const arena_plan_found *f = found(r, "mid_block");
	cr_expect_eq(f->verdict, ARENA_PLAN_REJECTED);
	cr_expect_eq(f->reason, ARENA_PLAN_SMALL);
	cr_expect_str_eq(f->like, "down_blocks.0");
	arena_plan_report_free(r);
	/* mid_block.resnets is not looked into: it is one unit like a block */
	expect_line(m, "blocks: down_blocks (2, repeating); globals: 20 tensors; "
		       "rejected: mid_block (smaller than the blocks it is like down_blocks.0)");
	model_free(m);
}

Test(discover, vae_encoder_before_decoder)
{
	static const uint64_t ch[] = {16, 32, 64, 64};
	model *m = model_new();
	vae(m, ch);
	expect_blocks(m, "globals encoder.down_blocks.{0..3} encoder.mid_block decoder.mid_block decoder.up_blocks.{0..3}");
	expect_in(m, "quant_conv.weight", "globals");
	model_free(m);
}

Test(discover, t5_encoder)
{
	for (int untied = 0; untied < 2; untied++) {
		model *m = model_new();
		t5_encoder(m, 4, 32, untied);
		expect_blocks(m, "globals encoder.block.{0..3}");
		expect_in(m, "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight", "encoder.block.0");
		expect_in(m, "encoder.block.3.layer.1.DenseReluDense.wo.weight", "encoder.block.3");
		expect_in(m, "shared.weight", "globals");
		expect_in(m, "encoder.final_layer_norm.weight", "globals");
		if (untied)
			expect_in(m, "encoder.embed_tokens.weight", "globals");
		arena_plan_report *r = describe(m);
		const arena_plan_found *f = found(r, "encoder.block");
		cr_expect_eq(f->reason, ARENA_PLAN_MOST); /* block 0 holds one name more */
		cr_expect_eq(f->alike, 4);
		cr_expect_eq(r->global_tensors, 2u + (unsigned)untied);
		arena_plan_report_free(r);
		model_free(m);
	}
	/* two blocks: still a sequence; one block of this name: globals */
	model *m = model_new();
	t5_encoder(m, 2, 32, 0);
	expect_blocks(m, "globals encoder.block.{0..1}");
	model_free(m);
	m = model_new();
	t5_encoder(m, 1, 32, 0);
	expect_blocks(m, "globals");
	expect_line(m, "blocks: none; globals: 12 tensors; rejected: encoder.block (one member), "
		       "encoder.block.0.layer (members differ)");
	model_free(m);
}

Test(discover, clip_text)
{
	model *m = model_new();
	clip_text(m, 3, 32);
	expect_blocks(m, "globals text_model.encoder.layers.{0..2}");
	expect_in(m, "text_model.embeddings.position_ids", "globals");
	model_free(m);
}

Test(discover, llama_qwen2_and_experts)
{
	for (int qwen = 0; qwen < 2; qwen++) {
		model *m = model_new();
		llama(m, 4, 32, qwen, 0);
		expect_blocks(m, "globals model.layers.{0..3}");
		expect_in(m, "lm_head.weight", "globals");
		expect_in(m, "model.norm.weight", "globals");
		model_free(m);
	}
	/* experts inside a layer stay in the layer */
	model *m = model_new();
	llama(m, 3, 32, 1, 4);
	expect_blocks(m, "globals model.layers.{0..2}");
	expect_in(m, "model.layers.2.mlp.experts.3.down_proj.weight", "model.layers.2");
	arena_plan_report *r = describe(m);
	cr_expect_eq(r->n_found, 1, "inner containers are not judged: %zu", r->n_found);
	arena_plan_report_free(r);
	model_free(m);
}

Test(discover, gpt2)
{
	const char *pre[] = {"", "transformer."};
	for (int p = 0; p < 2; p++) {
		model *m = model_new();
		gpt2(m, pre[p], 3, 32);
		char want[128];
		snprintf(want, sizeof(want), "globals %sh.{0..2}", pre[p]);
		expect_blocks(m, want);
		model_free(m);
	}
}

Test(discover, vit_timm)
{
	model *m = model_new();
	vit(m, 4, 32);
	expect_blocks(m, "globals blocks.{0..3}");
	expect_in(m, "patch_embed.proj.weight", "globals");
	expect_in(m, "cls_token", "globals");
	model_free(m);
}

Test(discover, open_clip_two_towers)
{
	model *m = model_new();
	open_clip(m, 3, 2);
	expect_blocks(m, "globals transformer.resblocks.{0..2} visual.transformer.resblocks.{0..1}");
	model_free(m);
}

Test(discover, wan)
{
	model *m = model_new();
	wan(m, 3, 32);
	expect_blocks(m, "globals blocks.{0..2}");
	expect_in(m, "blocks.1.scale_shift_table", "blocks.1");
	expect_in(m, "scale_shift_table", "globals");
	expect_in(m, "condition_embedder.time_proj.weight", "globals");
	model_free(m);
}

Test(discover, wan_original_sequential_embeddings)
{
	model *m = model_new();
	wan_original(m, 3, 32);
	expect_blocks(m, "globals blocks.{0..2}");
	expect_in(m, "time_embedding.2.weight", "globals");
	expect_in(m, "blocks.2.ffn.2.weight", "blocks.2");
	expect_line(m, "blocks: blocks (3, repeating); globals: 15 tensors; rejected: text_embedding (indices not "
		       "consecutive), time_embedding (indices not consecutive), time_projection (one member)");
	model_free(m);
}

Test(discover, no_repeats_all_globals)
{
	model *m = model_new();
	conv(m, 8, 3, 3, "conv");
	linear(m, 10, 8, 1, "fc");
	norm(m, 8, 1, "norm");
	linear(m, 10, 10, 1, "head.1");
	expect_blocks(m, "globals");
	arena_plan_report *r = describe(m);
	cr_expect_eq(r->n_blocks, 1);
	cr_expect_eq(r->global_tensors, 8);
	cr_expect_eq(r->global_bytes, 2 * (8 * 3 * 9 + 8 + 80 + 10 + 8 + 8 + 100 + 10));
	arena_plan_report_free(r);
	expect_line(m, "blocks: none; globals: 8 tensors; rejected: head (one member)");
	model_free(m);
}

/* ---- adversarial names -------------------------------------------------------- */

Test(discover, numbers_that_are_not_indices)
{
	model *m = model_new();
	add(m, "4", "layers.07.w"); /* leading zero */
	add(m, "4", "layers.08.w");
	add(m, "4", "stack.3a.w"); /* not all digits */
	add(m, "4", "stack.4a.w");
	add(m, "4", "params.0"); /* an index that ends the name: a ParameterList */
	add(m, "4", "params.1");
	add(m, "4", "big.1234567890123456789.w"); /* 19 digits */
	add(m, "4", "big.1234567890123456788.w");
	expect_blocks(m, "globals");
	arena_plan_report *r = describe(m);
	cr_expect_eq(r->n_found, 0, "nothing is a container: %zu", r->n_found);
	arena_plan_report_free(r);
	model_free(m);
}

Test(discover, one_member)
{
	model *m = model_new();
	linear(m, 4, 4, 1, "to_out.0");
	linear(m, 4, 4, 1, "stack.0.proj");
	expect_blocks(m, "globals");
	expect_line(m, "blocks: none; globals: 4 tensors; rejected: stack (one member), to_out (one member)");
	model_free(m);
	/* a known list name keeps its one member: a checkpoint cut to one block */
	m = model_new();
	linear(m, 4, 4, 1, "transformer_blocks.0.attn.to_q");
	linear(m, 4, 4, 1, "single_transformer_blocks.0.proj_out");
	linear(m, 4, 4, 1, "x_embedder");
	expect_blocks(m, "globals transformer_blocks.0 single_transformer_blocks.0");
	arena_plan_report *r = describe(m);
	cr_expect_eq(found(r, "transformer_blocks")->reason, ARENA_PLAN_KNOWN_ONE);
	arena_plan_report_free(r);
	model_free(m);
}

Test(discover, members_that_differ)
{
	/* three members with nothing in common: not a sequence; looked into */
	model *m = model_new();
	linear(m, 4, 4, 1, "mix.0.attn");
	linear(m, 4, 4, 1, "mix.1.mlp.fc");
	linear(m, 4, 4, 1, "mix.2.norm");
	linear(m, 4, 4, 1, "mix.1.sub.0.w");
	linear(m, 4, 4, 1, "mix.1.sub.1.w");
	expect_blocks(m, "globals mix.1.sub.{0..1}");
	arena_plan_report *r = describe(m);
	const arena_plan_found *f = found(r, "mix");
	cr_expect_eq(f->verdict, ARENA_PLAN_REJECTED);
	cr_expect_eq(f->reason, ARENA_PLAN_DIFFER);
	cr_expect_eq(f->alike, 0);
	cr_expect_eq(found(r, "mix.1.sub")->verdict, ARENA_PLAN_SEQUENCE);
	arena_plan_report_free(r);
	model_free(m);
	/* half alike is not most: two of four */
	m = model_new();
	linear(m, 4, 4, 1, "mix.0.a");
	linear(m, 4, 4, 1, "mix.1.a");
	linear(m, 4, 4, 1, "mix.2.b");
	linear(m, 4, 4, 1, "mix.3.c");
	expect_blocks(m, "globals");
	model_free(m);
	/* two of three are: the third is a block too */
	m = model_new();
	linear(m, 4, 4, 1, "mix.0.a");
	linear(m, 4, 4, 1, "mix.1.a");
	linear(m, 4, 4, 1, "mix.2.b");
	expect_blocks(m, "mix.{0..2}"); /* no globals block: every tensor is in a block */
	model_free(m);
	/* alike: half of the smaller one's names in common (shapes aside) */
	m = model_new();
	linear(m, 4, 4, 1, "pair.0.a");
	linear(m, 4, 4, 1, "pair.0.b"); /* 4 names */
	linear(m, 8, 8, 1, "pair.1.a");
	linear(m, 8, 8, 1, "pair.1.c");
	linear(m, 8, 8, 1, "pair.1.d"); /* 6 names, 2 in common: half of the smaller one's 4 */
	expect_blocks(m, "pair.{0..1}");
	model_free(m);
	m = model_new();
	linear(m, 4, 4, 1, "pair.0.a");
	add(m, "4", "pair.0.x");
	add(m, "4", "pair.0.y"); /* 4 names */
	linear(m, 4, 4, 0, "pair.1.a");
	add(m, "4", "pair.1.z");
	add(m, "4", "pair.1.u"); /* 3 names, 1 in common: 1 < 3 / 2 */
	expect_blocks(m, "globals");
	model_free(m);
}

Test(discover, shapes_may_differ)
{
	/* blocks of one list of different sizes (tests and cut models) */
	model *m = model_new();
	add(m, "1000", "transformer_blocks.0.w");
	add(m, "3000", "transformer_blocks.1.w");
	add(m, "2000", "transformer_blocks.2.w");
	add(m, "64", "pos_embed.weight");
	expect_blocks(m, "globals transformer_blocks.{0..2}");
	expect_line(m, "blocks: transformer_blocks (3, repeating, shapes differ); globals: 1 tensor");
	model_free(m);
}

Test(discover, indices_with_holes)
{
	model *m = model_new();
	linear(m, 16, 4, 1, "mlp.0");
	linear(m, 4, 16, 1, "mlp.2");
	linear(m, 4, 4, 1, "list.3");
	linear(m, 4, 4, 1, "list.4"); /* consecutive, not from 0: a shard's part of a list */
	expect_blocks(m, "globals list.{3..4}");
	arena_plan_report *r = describe(m);
	cr_expect_eq(found(r, "mlp")->reason, ARENA_PLAN_GAPS);
	cr_expect_eq(found(r, "list")->first, 3);
	cr_expect_eq(found(r, "list")->last, 4);
	arena_plan_report_free(r);
	model_free(m);
}

Test(discover, outermost_wins_and_rejected_outer_is_looked_into)
{
	/* an outer container of one member, an inner list */
	model *m = model_new();
	for (int i = 0; i < 3; i++)
		linear(m, 4, 4, 1, "enc.0.layers.%d.fc", i);
	linear(m, 4, 4, 1, "enc.0.norm");
	expect_blocks(m, "globals enc.0.layers.{0..2}");
	expect_in(m, "enc.0.norm.weight", "globals");
	model_free(m);
	/* nested lists: the outer one */
	m = model_new();
	for (int s = 0; s < 2; s++)
		for (int i = 0; i < 3; i++)
			linear(m, 4, 4, 1, "stages.%d.blocks.%d.fc", s, i);
	expect_blocks(m, "stages.{0..1}");
	model_free(m);
	/* numbered at the top: looked into (the top level is not a container) */
	m = model_new();
	for (int s = 0; s < 2; s++)
		for (int i = 0; i < 2; i++)
			linear(m, 4, 4, 1, "%d.layers.%d.fc", s, i);
	expect_blocks(m, "0.layers.{0..1} 1.layers.{0..1}");
	model_free(m);
}

Test(discover, a_leaf_named_like_a_member)
{
	/* "c.0" is a tensor and a member's prefix (a crafted header): the
	 * tensor stays in globals, the members are a list */
	model *m = model_new();
	add(m, "4", "c.0");
	add(m, "4", "c.0-x.w");
	add(m, "4", "c.0.w");
	add(m, "4", "c.1.w");
	add(m, "4", "c.0.v");
	add(m, "4", "c.1.v");
	expect_blocks(m, "globals c.{0..1}");
	expect_in(m, "c.0", "globals");
	expect_in(m, "c.0-x.w", "globals");
	model_free(m);
}

Test(discover, too_many_kinds_of_member)
{
	/* 65 members, each with its own name beside two shared ones: alike,
	 * but over 64 different sets of names */
	model *m = model_new();
	for (int i = 0; i < 65; i++) {
		add(m, "4", "x.%d.a", i);
		add(m, "4", "x.%d.b", i);
		add(m, "4", "x.%d.own%d", i, i);
	}
	expect_blocks(m, "globals");
	arena_plan_report *r = describe(m);
	cr_expect_eq(found(r, "x")->reason, ARENA_PLAN_DIFFER);
	arena_plan_report_free(r);
	model_free(m);
	m = model_new();
	for (int i = 0; i < 64; i++) {
		add(m, "4", "x.%d.a", i);
		add(m, "4", "x.%d.b", i);
		add(m, "4", "x.%d.own%d", i, i);
	}
	expect_blocks(m, "x.{0..63}");
	model_free(m);
}

Test(discover, deep_names)
{
	/* 300 components: not looked into past 128, no crash */
	model *m = model_new();
	for (int k = 0; k < 2; k++) {
		char name[2048];
		size_t o = 0;
		for (int i = 0; i < 150; i++)
			o += (size_t)snprintf(name + o, sizeof(name) - o, "a.%d.", i == 149 ? k : 0);
		snprintf(name + o, sizeof(name) - o, "w");
		add(m, "4", "%s", name);
	}
	expect_blocks(m, "globals");
	model_free(m);
}

/* ---- the rule before discovery, on the layouts it was made for -------------- */

/* Discovery gives every tensor the block the built-in names gave it. */
static void same_as_builtin(model *m)
{
	arena_layout *l = plan(m, NULL);
	for (size_t i = 0; i < l->n_tensors; i++) {
		const char *name = l->tensors[i].name;
		const arena_block *b = &l->blocks[l->tensors[i].block];
		size_t clen = 0;
		int64_t idx = -2;
		if (!arena_plan_match_builtin(name, &clen, &idx)) {
			cr_expect_null(b->container, "%s: %s, built-in: globals", name, b->name);
			continue;
		}
		cr_assert_not_null(b->container, "%s: globals, built-in: a block", name);
		cr_expect(strlen(b->container) == clen && strncmp(name, b->container, clen) == 0 && b->index == idx,
			  "%s: %s, built-in: %.*s %lld", name, b->name, (int)clen, name, (long long)idx);
	}
	arena_layout_free(l);
}

Test(discover, builtin_layouts_unchanged)
{
	const char *layouts[] = {"flux-dev", "flux-tiny", "llama-8b", "llama-tiny"};
	for (int k = 0; k < 4; k++) {
		model *m = from_synth(layouts[k], -1);
		same_as_builtin(m);
		model_free(m);
		for (long b = 1; b <= 2; b++) {
			m = from_synth(layouts[k], b);
			same_as_builtin(m);
			model_free(m);
		}
	}
	model *m = model_new();
	flux_bfl(m, "model.diffusion_model.", 3, 2, 32);
	same_as_builtin(m);
	model_free(m);
	static const uint64_t ch[] = {32, 64, 96, 96};
	static const int attn[] = {1, 1, 1, 0};
	m = model_new();
	unet(m, 4, ch, attn, 2);
	same_as_builtin(m);
	model_free(m);
}

Test(discover, fixtures_unchanged)
{
	const char *fx[] = {"tiny_flux.safetensors", "tiny_llama_sharded"};
	const char *want[] = {"globals transformer_blocks.0 transformer_blocks.1 single_transformer_blocks.0 "
			      "single_transformer_blocks.1 single_transformer_blocks.2",
			      "globals model.layers.0 model.layers.1 model.layers.2"};
	for (int k = 0; k < 2; k++) {
		arena_ckpt *ck;
		cr_assert_eq(arena_ckpt_open(fixture_path(fx[k]), &ck), 0, "%s", arena_last_error());
		arena_layout *l = NULL;
		cr_assert_eq(arena_plan_build(ck, NULL, &l), 0, "%s", arena_last_error());
		char got[1024];
		size_t o = 0;
		for (size_t b = 0; b < l->n_blocks; b++)
			o += (size_t)snprintf(got + o, sizeof(got) - o, "%s%s", b ? " " : "", l->blocks[b].name);
		cr_expect_str_eq(got, want[k]);
		arena_plan_report *r;
		cr_assert_eq(arena_plan_describe(ck, NULL, &r), 0);
		cr_expect_eq(r->n_blocks, l->n_blocks);
		arena_plan_report_free(r);
		arena_layout_free(l);
		arena_ckpt_close(ck);
	}
}

/* ---- order, patterns, report ----------------------------------------------------- */

Test(discover, order_by_name_otherwise)
{
	model *m = model_new();
	for (int i = 0; i < 11; i++) {
		linear(m, 4, 4, 1, "zeta.%d.fc", i);
		linear(m, 4, 4, 1, "alpha.%d.fc", i);
	}
	/* indices numerically (10 after 9), containers by name */
	arena_layout *l = plan(m, NULL);
	cr_expect_str_eq(l->blocks[0].name, "alpha.0"); /* no globals block: every tensor is in a block */
	cr_expect_str_eq(l->blocks[9].name, "alpha.9");
	cr_expect_str_eq(l->blocks[10].name, "alpha.10");
	cr_expect_str_eq(l->blocks[11].name, "zeta.0");
	arena_layout_free(l);
	/* --block-order first */
	const char *order[] = {"zeta"};
	arena_plan_opts o = {.order = order, .n_order = 1};
	l = plan(m, &o);
	cr_expect_str_eq(l->blocks[0].name, "zeta.0");
	arena_layout_free(l);
	arena_plan_report *r;
	cr_assert_eq(arena_plan_describe(ckpt(m), &o, &r), 0);
	cr_expect_str_eq(r->found[0].path, "zeta");
	cr_expect_str_eq(r->found[1].path, "alpha");
	arena_plan_report_free(r);
	model_free(m);
}

Test(discover, patterns_override)
{
	model *m = model_new();
	flux_diffusers(m, 2, 2, 32);
	const char *pat[] = {"^single_transformer_blocks\\.([0-9]+)\\."};
	arena_plan_opts o = {.patterns = pat, .n_patterns = 1};
	arena_layout *l = plan(m, &o);
	cr_expect_eq(l->n_blocks, 3);
	cr_expect_str_eq(block_of(l, "transformer_blocks.0.attn.to_q.weight"), "globals");
	arena_layout_free(l);
	arena_plan_report *r;
	cr_assert_eq(arena_plan_describe(ckpt(m), &o, &r), 0);
	cr_expect_eq(r->n_found, 1);
	cr_expect_str_eq(r->found[0].path, "single_transformer_blocks");
	cr_expect_eq(r->found[0].reason, ARENA_PLAN_PATTERN);
	cr_expect_eq(r->found[0].members, 2);
	cr_expect_eq(r->found[0].tensors, 2 * 14);
	cr_expect_eq(r->n_blocks, 3);
	char line[512];
	arena_plan_report_line(r, line, sizeof(line));
	cr_expect_str_eq(line, "blocks: single_transformer_blocks (2, block pattern); globals: 84 tensors");
	arena_plan_report_free(r);
	/* the same errors as arena_plan_build */
	const char *bad[] = {"x\\.[0-9]+"};
	arena_plan_opts ob = {.patterns = bad, .n_patterns = 1};
	cr_expect_eq(arena_plan_describe(ckpt(m), &ob, &r), ARENA_E(PLAN_BAD_PATTERN));
	const char *order[] = {"nothing"};
	arena_plan_opts oo = {.order = order, .n_order = 1};
	cr_expect_eq(arena_plan_describe(ckpt(m), &oo, &r), ARENA_E(PLAN_BAD_ORDER));
	model_free(m);
}

Test(discover, report_counts_and_line_truncation)
{
	model *m = model_new();
	flux_diffusers(m, 2, 3, 32);
	arena_plan_report *r = describe(m);
	cr_expect_eq(r->n_blocks, 6);
	const arena_plan_found *f = found(r, "transformer_blocks");
	cr_expect_eq(f->members, 2);
	cr_expect_eq(f->first, 0);
	cr_expect_eq(f->last, 1);
	cr_expect_eq(f->tensors, 2 * 32);
	uint64_t all = 0, blocks = 0;
	for (size_t i = 0; i < m->n; i++)
		all += m->t[i].nbytes;
	for (size_t i = 0; i < r->n_found; i++)
		blocks += r->found[i].bytes;
	cr_expect_eq(blocks + r->global_bytes, all);
	/* snprintf-like: the length it needs, cut and terminated */
	char full[512], cut[16];
	size_t n = arena_plan_report_line(r, full, sizeof(full));
	cr_expect_eq(n, strlen(full));
	cr_expect_eq(arena_plan_report_line(r, cut, sizeof(cut)), n);
	cr_expect_eq(strlen(cut), sizeof(cut) - 1);
	cr_expect(strncmp(cut, full, sizeof(cut) - 1) == 0);
	cr_expect_eq(arena_plan_report_line(r, NULL, 0), n);
	arena_plan_report_free(r);
	model_free(m);
}

Test(discover, empty_checkpoint)
{
	model *m = model_new();
	arena_plan_report *r = NULL;
	cr_expect_eq(arena_plan_describe(ckpt(m), NULL, &r), ARENA_E(PLAN_EMPTY));
	cr_expect_null(r);
	model_free(m);
}

/* Allocation N fails for N = 1, 2, ...: every path ends in NOMEM (or
 * success once N is past the last allocation), nothing leaks. */
Test(discover, allocation_failures)
{
	static const uint64_t ch[] = {32, 64};
	static const int attn[] = {0, 1};
	model *m = model_new();
	unet(m, 2, ch, attn, 2);
	t5_encoder(m, 1, 32, 0); /* rejected containers too */
	const arena_ckpt *ck = ckpt(m);
	for (int what = 0; what < 2; what++) {
		long n = 1;
		for (;; n++) {
			long live = arena_alloc_live();
			arena_fault_alloc(n);
			arena_layout *l = NULL;
			arena_plan_report *r = NULL;
			int rc = what ? arena_plan_describe(ck, NULL, &r) : arena_plan_build(ck, NULL, &l);
			int fired = arena_fault_alloc_fired();
			arena_fault_alloc(0);
			if (!fired) {
				cr_assert_eq(rc, 0, "%s", arena_last_error());
				arena_layout_free(l);
				arena_plan_report_free(r);
				cr_assert_eq(arena_alloc_live(), live);
				break;
			}
			cr_assert_eq(rc, ARENA_E_NOMEM, "n=%ld: %s", n, arena_last_error());
			cr_assert(!l && !r);
			cr_assert_eq(arena_alloc_live(), live, "n=%ld leaks", n);
		}
		cr_assert_gt(n, 20, "%ld", n);
	}
	model_free(m);
}
