/* scheme.c - storage schemes: names, plans, and the component table a
 * manifest entry is checked against (see scheme.h). */
#include "scheme.h"

#include <stdio.h>
#include <string.h>

#include "../common/err.h"
#include "dequant.h"

#define E(name) ARENA_E(name)

/* ---- names ------------------------------------------------------------------- */

static const char *const scheme_names[] = {
#define ARENA__QS_NAME(e, n) n,
	ARENA_QUANT_SCHEMES(ARENA__QS_NAME)
#undef ARENA__QS_NAME
};

const char *arena_quant_name(arena_quant_scheme s)
{
	return (unsigned)s < ARENA_QUANT_COUNT ? scheme_names[s] : "?";
}

int arena_quant_from_name(const char *name, arena_quant_scheme *out)
{
	if (!name || !out)
		return arena_errorf(E(USAGE), "quantization scheme: no name given");
	for (unsigned i = 0; i < ARENA_QUANT_COUNT; i++) {
		if (strcmp(name, scheme_names[i]) == 0) {
			*out = (arena_quant_scheme)i;
			return 0;
		}
	}
	char list[256];
	size_t o = 0;
	for (unsigned i = 0; i < ARENA_QUANT_COUNT; i++) {
		int w = snprintf(list + o, sizeof(list) - o, "%s%s", i ? ", " : "", scheme_names[i]);
		if (w < 0 || (size_t)w >= sizeof(list) - o)
			break;
		o += (size_t)w;
	}
	return arena_errorf(E(QUANT_UNKNOWN_SCHEME), "unknown quantization scheme '%s' (known: %s)", arena_q(name),
			    list);
}

/* ---- plans ------------------------------------------------------------------- */

int arena_quant_is_scaled(arena_quant_scheme s)
{
	return s == ARENA_QUANT_FP8_E4M3_TENSOR || s == ARENA_QUANT_FP8_E4M3_ROW || s == ARENA_QUANT_INT8_ROW ||
	       arena_quant_group(s);
}

unsigned arena_quant_group(arena_quant_scheme s)
{
	switch (s) {
	case ARENA_QUANT_INT4_G32:
		return 32;
	case ARENA_QUANT_INT4_G64:
		return 64;
	case ARENA_QUANT_INT4_G128:
		return 128;
	default:
		return 0;
	}
}

int arena_quant_is_row(arena_quant_scheme s)
{
	return s == ARENA_QUANT_FP8_E4M3_ROW || s == ARENA_QUANT_INT8_ROW;
}

static int is_wide_float(arena_dtype dt)
{
	return dt == ARENA_DTYPE_BF16 || dt == ARENA_DTYPE_F16 || dt == ARENA_DTYPE_F32;
}

/* "[64, 256]" into buf. */
static const char *shape_str(char *buf, size_t size, uint32_t rank, const uint64_t *shape)
{
	size_t o = 0;
	buf[o++] = '[';
	for (uint32_t k = 0; k < rank && o + 24 < size; k++)
		o += (size_t)snprintf(buf + o, size - o, "%s%llu", k ? ", " : "", (unsigned long long)shape[k]);
	snprintf(buf + o, size - o, "]");
	return buf;
}

static void set_comp(arena_quant_component *c, const char *name, arena_dtype dt, uint32_t rank,
		     const uint64_t *shape, uint64_t nelem)
{
	memset(c, 0, sizeof(*c));
	c->name = name;
	c->dtype = dt;
	c->rank = rank;
	for (uint32_t k = 0; k < rank; k++)
		c->shape[k] = shape[k];
	c->nelem = nelem;
	c->nbytes = nelem * arena_dtype_bits(dt) / 8; /* callers checked that it fits */
}

static int plan(arena_quant_plan *out, arena_quant_scheme scheme, arena_dtype src, uint32_t rank,
		const uint64_t *shape, const char *label, int prequant)
{
	char sb[256];
	char who[300]; /* "tensor 'x.weight'" or "tensor" */
	if (label)
		snprintf(who, sizeof(who), "tensor '%s'", arena_q(label));
	else
		snprintf(who, sizeof(who), "tensor");
	const char *lbl = who;
	if (!out || (rank && !shape))
		return arena_errorf(E(USAGE), "%s: quantization plan: NULL argument", lbl);
	if ((unsigned)scheme >= ARENA_QUANT_COUNT)
		return arena_errorf(E(QUANT_UNKNOWN_SCHEME), "%s: unknown quantization scheme %d", lbl,
				    (int)scheme);
	const char *sname = scheme_names[scheme];
	if (rank > ARENA_QUANT_MAX_RANK)
		return arena_errorf(E(QUANT_NOT_APPLICABLE), "%s: rank %u is over the limit of %d", lbl,
				    rank, ARENA_QUANT_MAX_RANK);
	unsigned bits = arena_dtype_bits(src);
	if (!bits)
		return arena_errorf(E(QUANT_NOT_APPLICABLE), "%s: invalid source dtype %d", lbl, (int)src);

	/* which sources the scheme takes */
	const char *takes = NULL;
	int ok;
	if (prequant) {
		ok = scheme == ARENA_QUANT_FP8_E4M3_TENSOR || scheme == ARENA_QUANT_FP8_E4M3_ROW;
		if (!ok)
			return arena_errorf(E(QUANT_NOT_APPLICABLE),
					    "%s: scheme %s cannot hold an already-quantized F8_E4M3 tensor "
					    "(only fp8-e4m3-tensor and fp8-e4m3-row)",
					    lbl, sname);
		src = ARENA_DTYPE_F8_E4M3;
		bits = 8;
	} else {
		switch (scheme) {
		case ARENA_QUANT_NONE:
			ok = 1;
			break;
		case ARENA_QUANT_BF16:
			ok = is_wide_float(src);
			takes = "BF16, F16 or F32";
			break;
		case ARENA_QUANT_FP8_E4M3:
			ok = is_wide_float(src) || src == ARENA_DTYPE_F8_E4M3;
			takes = "BF16, F16, F32 or F8_E4M3";
			break;
		case ARENA_QUANT_FP8_E5M2:
			ok = is_wide_float(src) || src == ARENA_DTYPE_F8_E5M2;
			takes = "BF16, F16, F32 or F8_E5M2";
			break;
		default:
			ok = is_wide_float(src);
			takes = src == ARENA_DTYPE_F8_E4M3 && !arena_quant_group(scheme)
					? "BF16, F16 or F32; F8_E4M3 data needs its scale tensor"
					: "BF16, F16 or F32";
			break;
		}
		if (!ok)
			return arena_errorf(E(QUANT_NOT_APPLICABLE), "%s: scheme %s does not apply to dtype %s (it takes %s)",
					    lbl, sname, arena_dtype_name(src), takes);
	}

	uint64_t nelem = 1;
	for (uint32_t k = 0; k < rank; k++) {
		if (shape[k] && nelem > UINT64_MAX / shape[k])
			return arena_errorf(E(QUANT_NOT_APPLICABLE), "%s: shape %s: element count overflows",
					    lbl, shape_str(sb, sizeof(sb), rank, shape));
		nelem *= shape[k];
	}
	if (nelem > UINT64_MAX / 32 || (nelem * bits) % 8)
		return arena_errorf(E(QUANT_NOT_APPLICABLE), "%s: shape %s of %s is not a whole number of bytes",
				    lbl, shape_str(sb, sizeof(sb), rank, shape), arena_dtype_name(src));
	uint64_t rows = 1, cols = nelem;
	const uint64_t group = arena_quant_group(scheme);
	if (group && rank >= 2) {
		rows = shape[0];
		cols = rows ? nelem / rows : 0;
	}
	if (arena_quant_is_row(scheme)) {
		if (rank < 2)
			return arena_errorf(E(QUANT_NOT_APPLICABLE),
					    "%s: scheme %s needs a tensor of rank 2 or more (one scale per row), got %s",
					    lbl, sname, shape_str(sb, sizeof(sb), rank, shape));
		rows = shape[0];
		cols = rows ? nelem / rows : 0;
	}
	if (arena_quant_is_scaled(scheme) && nelem == 0)
		return arena_errorf(E(QUANT_NOT_APPLICABLE), "%s: scheme %s needs values to scale, shape %s is empty",
				    lbl, sname, shape_str(sb, sizeof(sb), rank, shape));

	arena_quant_plan p;
	memset(&p, 0, sizeof(p));
	p.scheme = scheme;
	p.src_dtype = src;
	p.rank = rank;
	for (uint32_t k = 0; k < rank; k++)
		p.shape[k] = shape[k];
	p.nelem = nelem;
	p.src_nbytes = nelem * bits / 8;
	p.rows = rows;
	p.cols = cols;
	if (group) {
		p.group = group;
		p.groups = (cols + group - 1) / group;
	}
	p.prequantized = prequant;
	switch (scheme) {
	case ARENA_QUANT_NONE:
		set_comp(&p.comps[0], "data", src, rank, shape, nelem);
		break;
	case ARENA_QUANT_BF16:
		set_comp(&p.comps[0], "data", ARENA_DTYPE_BF16, rank, shape, nelem);
		break;
	case ARENA_QUANT_FP8_E5M2:
		set_comp(&p.comps[0], "qdata", ARENA_DTYPE_F8_E5M2, rank, shape, nelem);
		break;
	case ARENA_QUANT_INT8_ROW:
		set_comp(&p.comps[0], "qdata", ARENA_DTYPE_I8, rank, shape, nelem);
		break;
	case ARENA_QUANT_INT4_G32:
	case ARENA_QUANT_INT4_G64:
	case ARENA_QUANT_INT4_G128: {
		const uint64_t qs[2] = {rows, cols / 2 + cols % 2}, gs[2] = {rows, p.groups};
		set_comp(&p.comps[0], "qdata", ARENA_DTYPE_U8, 2, qs, rows * qs[1]);
		set_comp(&p.comps[1], "scale", src, 2, gs, rows * p.groups);
		set_comp(&p.comps[2], "zero", ARENA_DTYPE_U8, 2, gs, rows * p.groups);
		p.n_comps = 3;
		break;
	}
	default:
		set_comp(&p.comps[0], "qdata", ARENA_DTYPE_F8_E4M3, rank, shape, nelem);
		break;
	}
	if (!group)
		p.n_comps = 1;
	if (scheme == ARENA_QUANT_FP8_E4M3_TENSOR) {
		const uint64_t one = 1;
		set_comp(&p.comps[1], "scale", ARENA_DTYPE_F32, 1, &one, 1);
		p.n_comps = 2;
	} else if (arena_quant_is_row(scheme)) {
		uint64_t ss[ARENA_QUANT_MAX_RANK];
		ss[0] = rows;
		for (uint32_t k = 1; k < rank; k++)
			ss[k] = 1;
		set_comp(&p.comps[1], "scale", ARENA_DTYPE_F32, rank, ss, rows);
		p.n_comps = 2;
	}
	*out = p;
	return 0;
}

int arena_quant_plan_init(arena_quant_plan *out, arena_quant_scheme scheme, arena_dtype src, uint32_t rank,
			  const uint64_t *shape, const char *label)
{
	return plan(out, scheme, src, rank, shape, label, 0);
}

int arena_quant_plan_prequant(arena_quant_plan *out, arena_quant_scheme scheme, uint32_t rank,
			      const uint64_t *shape, const char *label)
{
	return plan(out, scheme, ARENA_DTYPE_F8_E4M3, rank, shape, label, 1);
}

/* ---- layouts ------------------------------------------------------------------------- */

int arena_quant_describe(const arena_quant_plan *p, arena_tensor *t)
{
	if (!p || !t || p->n_comps > ARENA_MAX_COMPONENTS)
		return arena_errorf(E(USAGE), "quantization describe: NULL argument");
	snprintf(t->scheme, sizeof(t->scheme), "%s", arena_quant_name(p->scheme));
	t->n_comp = (uint32_t)p->n_comps;
	for (size_t i = 0; i < p->n_comps; i++) {
		const arena_quant_component *c = &p->comps[i];
		arena_component *o = &t->comp[i];
		memset(o, 0, sizeof(*o));
		snprintf(o->name, sizeof(o->name), "%s", c->name);
		o->dtype = c->dtype;
		o->rank = c->rank;
		for (uint32_t k = 0; k < c->rank; k++)
			o->shape[k] = c->shape[k];
		o->bytes = c->nbytes;
	}
	return 0;
}

int arena_subclass_check(const arena_tensor *t)
{
	const char *name = t->name ? t->name : "?";
	if (t->n_comp < 1 || t->n_comp > ARENA_MAX_COMPONENTS)
		return arena_errorf(E(IMG_MANIFEST_BAD), "tensor '%s': scheme %s: %u components, not 1 to %d", arena_q(name),
				    ARENA_SCHEME_SUBCLASS, t->n_comp, ARENA_MAX_COMPONENTS);
	if (!t->subclass)
		return arena_errorf(E(IMG_MANIFEST_BAD), "tensor '%s': scheme %s without its \"subclass\" object",
				    arena_q(name), ARENA_SCHEME_SUBCLASS);
	for (uint32_t i = 0; i < t->n_comp; i++) {
		const char *c = t->comp[i].name;
		size_t n = strnlen(c, sizeof(t->comp[i].name));
		int ok = n >= 1 && n < sizeof(t->comp[i].name);
		for (size_t k = 0; ok && k < n; k++)
			ok = (c[k] >= 'a' && c[k] <= 'z') || (c[k] >= 'A' && c[k] <= 'Z') || (c[k] >= '0' && c[k] <= '9') ||
			     c[k] == '_' || c[k] == '.';
		for (uint32_t k = 0; ok && k < i; k++)
			ok = strcmp(t->comp[k].name, c) != 0;
		if (!ok)
			return arena_errorf(E(IMG_MANIFEST_BAD),
					    "tensor '%s': scheme %s: component %u's name '%s' is empty, repeated, too long or "
					    "not made of [A-Za-z0-9_.]",
					    arena_q(name), ARENA_SCHEME_SUBCLASS, i, arena_q(c));
		if (!arena_dtype_bits(t->comp[i].dtype))
			return arena_errorf(E(IMG_MANIFEST_BAD), "tensor '%s': scheme %s: component '%s' has no dtype",
					    arena_q(name), ARENA_SCHEME_SUBCLASS, arena_q(c));
	}
	return 0;
}

int arena_quant_plan_from_tensor(const arena_tensor *t, arena_quant_plan *out)
{
	if (!t || !out)
		return arena_errorf(E(USAGE), "quantization plan: NULL argument");
	const char *name = t->name ? t->name : "?";
	if (!strcmp(t->scheme, ARENA_SCHEME_SUBCLASS)) {
		int rc = arena_subclass_check(t);
		if (rc)
			return rc;
		memset(out, 0, sizeof(*out));
		out->scheme = ARENA_QUANT_NONE;
		out->src_dtype = t->dtype;
		return 0;
	}
	if (t->subclass)
		return arena_errorf(E(IMG_MANIFEST_BAD), "tensor '%s': a \"subclass\" object on scheme %s (only %s has one)",
				    arena_q(name), arena_q(t->scheme), ARENA_SCHEME_SUBCLASS);
	arena_quant_scheme s;
	if (arena_quant_from_name(t->scheme, &s))
		return arena_errorf(E(IMG_MANIFEST_BAD), "tensor '%s': unknown storage scheme '%s'", arena_q(name),
				    arena_q(t->scheme));
	arena_quant_plan p;
	int rc;
	if (t->dtype == ARENA_DTYPE_F8_E4M3 && (s == ARENA_QUANT_FP8_E4M3_TENSOR || s == ARENA_QUANT_FP8_E4M3_ROW))
		rc = arena_quant_plan_prequant(&p, s, t->rank, t->shape, name);
	else
		rc = arena_quant_plan_init(&p, s, t->dtype, t->rank, t->shape, name);
	if (rc)
		return E(IMG_MANIFEST_BAD); /* the message names the tensor and what does not apply */
	if (t->n_comp != p.n_comps)
		return arena_errorf(E(IMG_MANIFEST_BAD), "tensor '%s': scheme %s has %zu components, the manifest %u",
				    arena_q(name), arena_quant_name(s), p.n_comps, t->n_comp);
	for (size_t i = 0; i < p.n_comps; i++) {
		const arena_quant_component *c = &p.comps[i];
		const arena_component *o = &t->comp[i];
		int same = strcmp(o->name, c->name) == 0 && o->dtype == c->dtype && o->rank == c->rank &&
			   o->bytes == c->nbytes;
		for (uint32_t k = 0; same && k < c->rank; k++)
			same = o->shape[k] == c->shape[k];
		if (!same) {
			char want[256], got[256];
			return arena_errorf(E(IMG_MANIFEST_BAD),
					    "tensor '%s': scheme %s: component %zu is '%s' %s %s, %llu bytes; expected '%s' %s %s, %llu bytes",
					    arena_q(name), arena_quant_name(s), i, arena_q(o->name), arena_dtype_name(o->dtype),
					    shape_str(got, sizeof(got), o->rank > ARENA_MAX_RANK ? ARENA_MAX_RANK : o->rank, o->shape),
					    (unsigned long long)o->bytes, c->name, arena_dtype_name(c->dtype),
					    shape_str(want, sizeof(want), c->rank, c->shape), (unsigned long long)c->nbytes);
		}
	}
	*out = p;
	return 0;
}

/* ---- dequantization ---------------------------------------------------------------- */

int arena_quant_dequant_job(const arena_tensor *t, const void *block, void *dst, arena_dequant_job *j)
{
	arena_quant_scheme q = ARENA_QUANT_COUNT;
	if (!strcmp(t->scheme, ARENA_SCHEME_SUBCLASS))
		return arena_errorf(E(USAGE), "'%s' is stored %s: its components are a tensor subclass's, which its "
				    "library computes with (arena.torch binds them)", arena_q(t->name), t->scheme);
	if (arena_quant_from_name(t->scheme, &q) || q == ARENA_QUANT_NONE)
		return arena_errorf(E(USAGE), "'%s' is stored %s: %s", arena_q(t->name), t->scheme,
				    q == ARENA_QUANT_NONE ? "view its bytes instead" : "an unknown scheme");
	const arena_dtype sd = t->comp[0].dtype, dd = t->dtype;
	const unsigned group = arena_quant_group(q);
	if ((group ? sd != ARENA_DTYPE_U8
		   : sd != ARENA_DTYPE_F8_E4M3 && sd != ARENA_DTYPE_F8_E5M2 && sd != ARENA_DTYPE_I8 &&
			     sd != ARENA_DTYPE_BF16) ||
	    (dd != ARENA_DTYPE_BF16 && dd != ARENA_DTYPE_F16 && dd != ARENA_DTYPE_F32))
		return arena_errorf(E(USAGE), "'%s': %s to %s is not a dequantization", arena_q(t->name),
				    arena_dtype_name(sd), arena_dtype_name(dd));
	arena_quant_plan p;
	int rc = arena_quant_plan_from_tensor(t, &p);
	if (rc)
		return rc;
	const uint8_t *base = block;
	*j = (arena_dequant_job){.dst = dst,
				 .src = base + t->comp[0].offset,
				 .n = p.nelem,
				 .cols = p.cols,
				 .src_dtype = sd,
				 .dst_dtype = dd,
				 .scale_dtype = ARENA_DTYPE_F32};
	if (arena_quant_is_scaled(q)) {
		j->scale = base + t->comp[1].offset;
		j->scale_n = p.comps[1].nelem;
		j->scale_dtype = p.comps[1].dtype;
	}
	if (group) {
		j->zero = base + t->comp[2].offset;
		j->group = group;
	}
	return 0;
}
