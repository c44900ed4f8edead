/* quant_select.c - tensor selection for --quant and the convert glue (see quant_select.h). */
#include "quant_select.h"

#include <fnmatch.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "../common/alloc.h"
#include "../common/err.h"
#include "../common/io.h"
#include "../common/mapguard.h"

int arena_quant_default_selects(const char *name, arena_dtype dt, uint32_t rank, int in_block)
{
	size_t n = strlen(name);
	if (!in_block || rank != 2 || !arena_dtype_is_float(dt) || n < 8 || strcmp(name + n - 7, ".weight"))
		return 0;
	/* The module segment just before ".weight". */
	const char *end = name + n - 7, *seg = end;
	while (seg > name && seg[-1] != '.')
		seg--;
	char mod[128];
	size_t len = (size_t)(end - seg) < sizeof(mod) - 1 ? (size_t)(end - seg) : sizeof(mod) - 1;
	memcpy(mod, seg, len);
	mod[len] = '\0';
	return !strstr(mod, "norm") && !strstr(mod, "embed");
}

static int glob_hit(const char *const *globs, size_t n, const char *name, unsigned char *used, size_t *which)
{
	int hit = 0;
	for (size_t i = 0; i < n; i++)
		if (fnmatch(globs[i], name, 0) == 0) {
			if (!hit)
				*which = i;
			hit = 1;
			used[i] = 1;
		}
	return hit;
}

/* The names a quantized tensor takes once exported (convert/export.h: its own
 * name for "data" and "qdata", "<name>_<component>" for the others) must not
 * be another source tensor's; and quantized to F8_E4M3 without a scale of its
 * own, it must not sit next to an unrelated "<name>_scale" that would then
 * read as its scale (a compressed-tensors pair: export, convert again, and
 * its values would be scaled). DUPLICATE_TENSOR naming both tensors. */
static int check_export_names(const arena_ckpt *ck, const arena_st_tensor *src, const arena_quant_plan *p)
{
	const char *scheme = arena_quant_name(p->scheme);
	char nm[1100];
	for (size_t i = 0; i < p->n_comps; i++) {
		const char *c = p->comps[i].name;
		if (!strcmp(c, "data") || !strcmp(c, "qdata"))
			continue;
		snprintf(nm, sizeof(nm), "%s_%s", src->name, c);
		const arena_st_tensor *o = arena_ckpt_find(ck, nm);
		if (o)
			return arena_errorf(ARENA_E(DUPLICATE_TENSOR),
					    "%s: tensor '%s': quantized as %s it would be exported with its %s as '%s', the "
					    "name of another tensor (in %s); leave one of them out (--quant-exclude)",
					    src->file->path, arena_q(src->name), scheme, c, arena_q(nm), o->file->path);
	}
	if (p->n_comps == 1 && p->comps[0].dtype == ARENA_DTYPE_F8_E4M3 && src->dtype != ARENA_DTYPE_F8_E4M3) {
		snprintf(nm, sizeof(nm), "%s_scale", src->name);
		const arena_st_tensor *o = arena_ckpt_find(ck, nm);
		if (o && arena_quant_ct_classify(ARENA_DTYPE_F8_E4M3, src->rank, src->shape, o->dtype, o->rank, o->shape,
						 NULL) != ARENA_QUANT_NONE)
			return arena_errorf(ARENA_E(DUPLICATE_TENSOR),
					    "%s: tensor '%s': quantized as %s it would be F8_E4M3 next to the tensor '%s' (in %s), "
					    "which would then read as its scale (compressed-tensors); leave one of them out "
					    "(--quant-exclude)",
					    src->file->path, arena_q(src->name), scheme, arena_q(nm), o->file->path);
	}
	return 0;
}

static int choose(void *arg, const arena_st_tensor *src, const arena_ckpt *ck, const arena_block *blk,
		  arena_tensor *t, int *skip)
{
	arena_quant_ctx *c = arg;
	const arena_quant_opts *o = c->o;
	arena_quant_plan p;
	int rc;
	arena_subclass_group *g = c->sub ? arena_subclass_member(c->sub, src) : NULL;
	if (g) { /* one tensor of its inner tensors, planned at the first met */
		if (g->planned) {
			*skip = 1;
			return 0;
		}
		g->planned = 1;
		return arena_subclass_describe(g, t);
	}
	if (arena_quant_ct_is_scale(ck, src->name)) {
		*skip = 1;
		return 0;
	}
	const arena_st_tensor *scale = NULL;
	arena_quant_scheme pre = arena_quant_ct_match(ck, src->name, &scale, NULL);
	if (pre != ARENA_QUANT_NONE) {
		if ((rc = arena_quant_plan_prequant(&p, pre, src->rank, src->shape, src->name))) {
			arena_error_prefix(src->file->path);
			return rc;
		}
		return arena_quant_describe(&p, t);
	}
	size_t inc = 0, exc = 0;
	int in = glob_hit(o->include, o->n_include, src->name, c->inc_used, &inc);
	int ex = glob_hit(o->exclude, o->n_exclude, src->name, c->exc_used, &exc);
	if (in && ex)
		return arena_errorf(ARENA_E_USAGE, "%s: tensor '%s' matches --quant-include '%s' and --quant-exclude '%s'",
				    src->file->path, arena_q(src->name), arena_q(o->include[inc]), arena_q(o->exclude[exc]));
	int sel = c->scheme != ARENA_QUANT_NONE &&
		  (in || (!ex && arena_quant_default_selects(src->name, src->dtype, src->rank, blk->container != NULL)));
	if (!sel) {
		arena_plan_plain(src, t);
		return 0;
	}
	if ((rc = arena_quant_plan_init(&p, c->scheme, src->dtype, src->rank, src->shape, src->name))) {
		arena_error_prefix(src->file->path);
		return rc;
	}
	if ((rc = check_export_names(ck, src, &p)))
		return rc;
	return arena_quant_describe(&p, t);
}

int arena_quant_select_init(arena_quant_ctx *c, const arena_quant_opts *qo, arena_plan_opts *po)
{
	memset(c, 0, sizeof(*c));
	c->o = qo;
	c->scheme = ARENA_QUANT_NONE;
	if (qo->scheme) {
		int rc = arena_quant_from_name(qo->scheme, &c->scheme);
		if (rc)
			return rc;
	}
	if (c->scheme == ARENA_QUANT_NONE && qo->n_include)
		return arena_errorf(ARENA_E_USAGE, "--quant-include '%s' needs --quant SCHEME", arena_q(qo->include[0]));
	for (size_t i = 0; i < qo->n_include; i++)
		for (size_t k = 0; k < qo->n_exclude; k++)
			if (!strcmp(qo->include[i], qo->exclude[k]))
				return arena_errorf(ARENA_E_USAGE, "'%s' is both --quant-include and --quant-exclude",
						    arena_q(qo->include[i]));
	c->inc_used = arena_calloc(qo->n_include + 1, 1);
	c->exc_used = arena_calloc(qo->n_exclude + 1, 1);
	if (!c->inc_used || !c->exc_used) {
		arena_quant_select_free(c);
		return arena_errorf(ARENA_E_NOMEM, "out of memory");
	}
	po->choose = choose;
	po->choose_ctx = c;
	return 0;
}

int arena_quant_select_finish(arena_quant_ctx *c)
{
	int rc = 0;
	for (size_t i = 0; !rc && i < c->o->n_include; i++)
		if (!c->inc_used[i])
			rc = arena_errorf(ARENA_E_USAGE, "--quant-include '%s' matches no tensor", arena_q(c->o->include[i]));
	for (size_t i = 0; !rc && i < c->o->n_exclude; i++)
		if (!c->exc_used[i])
			rc = arena_errorf(ARENA_E_USAGE, "--quant-exclude '%s' matches no tensor", arena_q(c->o->exclude[i]));
	arena_quant_select_free(c);
	return rc;
}

void arena_quant_select_free(arena_quant_ctx *c)
{
	arena_free(c->inc_used);
	arena_free(c->exc_used);
	c->inc_used = c->exc_used = NULL;
}

/* The whole-tensor pass of arena_quant_scan, over src's bytes read with
 * pread a piece at a time rather than through the mapping: a file that
 * shrinks meanwhile is INPUT_CHANGED (and the amax still runs on every
 * core). Sources parsed from memory (no descriptor) are scanned there. */
static int scan_source(const arena_quant_plan *p, const arena_st_tensor *src, arena_quant_input *in)
{
	const arena_st_file *f = src->file;
	if (!arena_quant_scan_needed(p) || f->fd < 0)
		return arena_quant_scan(p, in, 0);
	enum { PIECE = 16 << 20 }; /* a whole number of elements of any wide float */
	const uint64_t esize = arena_dtype_bits(src->dtype) / 8;
	uint8_t *buf = arena_malloc(src->nbytes < PIECE ? (size_t)src->nbytes + 1 : PIECE);
	if (!buf)
		return arena_errorf(ARENA_E_NOMEM, "out of memory");
	float m = 0.0f;
	int rc = 0;
	for (uint64_t off = 0; !rc && off < src->nbytes; off += PIECE) {
		const uint64_t len = src->nbytes - off < PIECE ? src->nbytes - off : PIECE;
		float a;
		rc = arena_pread_full(f->fd, buf, (size_t)len, f->data_off + src->begin + off, f->path);
		if (!rc)
			rc = arena_quant_amax(src->dtype, buf, len / esize, 0, &a);
		if (!rc)
			m = off ? arena_quant_amax_merge(m, a) : a;
	}
	arena_free(buf);
	if (!rc)
		in->tensor_scale = arena_quant_tensor_scale(m);
	return rc;
}

int arena_quant_state_init(arena_quant_state *qs, const arena_layout *l, const arena_ckpt *ck)
{
	memset(qs, 0, sizeof(*qs));
	qs->n = l->n_tensors;
	qs->plans = arena_calloc(l->n_tensors, sizeof(*qs->plans));
	qs->in = arena_calloc(l->n_tensors, sizeof(*qs->in));
	qs->scale_src = arena_calloc(l->n_tensors, sizeof(*qs->scale_src));
	if (!qs->plans || !qs->in || !qs->scale_src) {
		arena_quant_state_free(qs);
		return arena_errorf(ARENA_E_NOMEM, "out of memory");
	}
	for (size_t i = 0; i < l->n_tensors; i++) {
		const arena_tensor *t = &l->tensors[i];
		if (!strcmp(t->scheme, "none") || !strcmp(t->scheme, ARENA_SCHEME_SUBCLASS))
			continue;
		const arena_st_tensor *src = t->src;
		int rc = arena_quant_plan_from_tensor(t, &qs->plans[i]);
		if (!rc && qs->plans[i].prequantized) {
			const arena_st_tensor *scale = NULL;
			arena_quant_ct_match(ck, src->name, &scale, NULL);
			if (!scale)
				rc = arena_errorf(ARENA_E_INTERNAL, "tensor '%s': lost its scale", arena_q(t->name));
			else
				qs->in[i].scale = arena_st_data(scale), qs->in[i].scale_dtype = scale->dtype,
				qs->scale_src[i] = scale;
		}
		/* A header without its file's bytes (convert/writer.c): the bytes,
		 * and the whole-tensor pass, come when the writer is given them. */
		qs->in[i].data = src->file->base ? arena_st_data(src) : NULL;
		if (!rc && qs->in[i].data)
			rc = scan_source(&qs->plans[i], src, &qs->in[i]);
		if (rc) {
			arena_quant_state_free(qs);
			return rc;
		}
	}
	return 0;
}

void arena_quant_state_free(arena_quant_state *qs)
{
	arena_free(qs->plans);
	arena_free(qs->in);
	arena_free(qs->scale_src);
	qs->plans = NULL;
	qs->in = NULL;
	qs->scale_src = NULL;
}

typedef struct fill_call {
	const arena_quant_plan *p;
	const arena_quant_input *in;
	uint32_t comp;
	uint64_t off, len;
	uint8_t *dst;
} fill_call;

static int fill_mapped(void *ctx)
{
	const fill_call *c = ctx;
	return arena_quant_fill(c->p, c->in, c->comp, c->off, c->len, c->dst);
}

/* Add f's mapping to the n files and regions at fs and r (once); the new
 * count. */
static size_t add_file(const arena_st_file **fs, arena_map_region *r, size_t n, const arena_st_file *f)
{
	if (!f || !f->mapped || (n && fs[0] == f))
		return n;
	fs[n] = f;
	r[n].base = f->base;
	r[n].len = f->size;
	r[n].label = f->path;
	return n + 1;
}

int arena_quant_state_fill(arena_quant_state *qs, const arena_layout *l, const arena_tensor *t, uint32_t comp,
			   uint64_t off, uint64_t len, uint8_t *dst)
{
	size_t i = (size_t)(t - l->tensors);
	const arena_st_tensor *src = t->src;
	/* The bytes come through the mappings of the source's file and its
	 * scale tensor's (another shard, maybe): reads guarded, so a file cut
	 * meanwhile is INPUT_CHANGED rather than a SIGBUS. */
	fill_call c = {&qs->plans[i], &qs->in[i], comp, off, len, dst};
	const arena_st_file *fs[2];
	arena_map_region r[2];
	size_t n = add_file(fs, r, 0, src ? src->file : NULL);
	n = add_file(fs, r, n, qs->scale_src && qs->scale_src[i] ? qs->scale_src[i]->file : NULL);
	int rc = n ? arena_map_guard_run(r, n, fill_mapped, &c) : fill_mapped(&c);
	/* The last page of a file cut inside it reads as zeros past the new
	 * end, without a fault: the files are as long as when opened, after
	 * the reads, or the bytes made are not used. */
	struct stat st;
	for (size_t k = 0; !rc && k < n; k++)
		if (fstat(fs[k]->fd, &st) == 0 && (uint64_t)st.st_size < fs[k]->size)
			rc = arena_errorf(ARENA_E(INPUT_CHANGED),
					  "%s: file changed while reading: %llu bytes now, %llu when it was opened; read it again once it is whole",
					  fs[k]->path, (unsigned long long)st.st_size, (unsigned long long)fs[k]->size);
	if (rc && rc != ARENA_E(INPUT_CHANGED)) { /* an int4 group refused: name the file and the tensor */
		char who[1400];
		snprintf(who, sizeof(who), "%s: tensor '%s'", src ? src->file->path : "?", arena_q(t->name));
		arena_error_prefix(who);
	}
	return rc;
}
