/* subclass.c - tensor subclasses in a checkpoint, grouped (see subclass.h). */
#include "subclass.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "../common/alloc.h"
#include "../common/err.h"
#include "../formats/scheme.h"

#define E(name) ARENA_E(name)

void arena_subclass_free(arena_subclass_set *s)
{
	for (size_t i = 0; s->g && i < s->n; i++) {
		arena_free(s->g[i].name);
		arena_free(s->g[i].meta);
	}
	arena_free(s->g);
	s->g = NULL;
	s->n = 0;
}

arena_subclass_group *arena_subclass_member(const arena_subclass_set *s, const arena_st_tensor *t)
{
	for (size_t i = 0; i < s->n; i++)
		for (uint32_t c = 0; c < s->g[i].n_comp; c++)
			if (s->g[i].comp[c] == t)
				return &s->g[i];
	return NULL;
}

/* Add a group: `meta` (a JSON object) is taken over. */
static int add(arena_subclass_set *s, const arena_ckpt *ck, const char *file, const char *name, arena_dtype dt,
	       uint32_t rank, const uint64_t *shape, json_t *meta, uint32_t n, const char *const *cnames,
	       const arena_st_tensor *const *comps)
{
	int rc = 0;
	if (n < 1 || n > ARENA_MAX_COMPONENTS)
		rc = arena_errorf(E(QUANT_NOT_APPLICABLE),
				  "%s: tensor '%s': a tensor subclass of %u inner tensors (an image tensor holds 1 to %d)",
				  file, arena_q(name), n, ARENA_MAX_COMPONENTS);
	else if (rank > ARENA_MAX_RANK)
		rc = arena_errorf(E(QUANT_NOT_APPLICABLE), "%s: tensor '%s': rank %u is over %d", file, arena_q(name), rank,
				  ARENA_MAX_RANK);
	else if (arena_ckpt_find(ck, name))
		rc = arena_errorf(E(DUPLICATE_TENSOR), "%s: tensor '%s' is held as a tensor subclass's inner tensors and "
				  "as a tensor of its own", file, arena_q(name));
	for (size_t i = 0; !rc && i < s->n; i++)
		if (!strcmp(s->g[i].name, name))
			rc = arena_errorf(E(DUPLICATE_TENSOR), "%s: tensor subclass '%s' is described twice", file,
					  arena_q(name));
	for (uint32_t c = 0; !rc && c < n; c++) {
		size_t len = strlen(cnames[c]);
		if (!len || len > 15)
			rc = arena_errorf(E(QUANT_NOT_APPLICABLE),
					  "%s: tensor '%s': inner tensor name '%s' is empty or over 15 characters", file,
					  arena_q(name), arena_q(cnames[c]));
		else if (comps[c]->rank > ARENA_MAX_RANK)
			rc = arena_errorf(E(QUANT_NOT_APPLICABLE), "%s: tensor '%s': inner tensor '%s' has rank %u, over %d",
					  file, arena_q(name), arena_q(cnames[c]), comps[c]->rank, ARENA_MAX_RANK);
		else if (arena_subclass_member(s, comps[c]))
			rc = arena_errorf(E(DUPLICATE_TENSOR), "%s: tensor '%s' is an inner tensor of two tensor subclasses",
					  file, arena_q(comps[c]->name));
		for (uint32_t k = 0; !rc && k < c; k++)
			if (!strcmp(cnames[k], cnames[c]) || comps[k] == comps[c])
				rc = arena_errorf(E(ST_BAD_METADATA), "%s: tensor subclass '%s': inner tensor '%s' listed twice",
						  file, arena_q(name), arena_q(cnames[c]));
	}
	if (rc) {
		json_decref(meta);
		return rc;
	}
	arena_subclass_group *g = arena_realloc(s->g, (s->n + 1) * sizeof(*g));
	if (!g) {
		json_decref(meta);
		return arena_errorf(ARENA_E_NOMEM, "out of memory");
	}
	s->g = g;
	g = &s->g[s->n];
	memset(g, 0, sizeof(*g));
	g->name = arena_strdup(name);
	g->meta = json_dumps(meta, JSON_COMPACT);
	json_decref(meta);
	if (!g->name || !g->meta) {
		arena_free(g->name);
		arena_free(g->meta);
		return arena_errorf(ARENA_E_NOMEM, "out of memory");
	}
	g->dtype = dt;
	g->rank = rank;
	memcpy(g->shape, shape, rank * sizeof(*shape));
	g->n_comp = n;
	for (uint32_t c = 0; c < n; c++) {
		snprintf(g->comp_name[c], sizeof(g->comp_name[c]), "%s", cnames[c]);
		g->comp[c] = comps[c];
	}
	s->n++;
	return 0;
}

/* The outer size and contiguous stride of a tensor of `rank` dims `shape`, as
 * the subclass object lists them. NULL when out of memory. */
static json_t *size_stride(json_t *meta, uint32_t rank, const uint64_t *shape)
{
	json_t *size = json_array(), *stride = json_array();
	uint64_t st[ARENA_MAX_RANK], acc = 1;
	for (uint32_t k = rank; k-- > 0;) {
		st[k] = acc;
		acc *= shape[k];
	}
	int fail = !meta || !size || !stride;
	for (uint32_t k = 0; !fail && k < rank; k++)
		fail = json_array_append_new(size, json_integer((json_int_t)shape[k])) ||
		       json_array_append_new(stride, json_integer((json_int_t)st[k]));
	if (fail || json_object_set_new(meta, "size", size) || json_object_set_new(meta, "stride", stride)) {
		json_decref(meta);
		return NULL;
	}
	return meta;
}

/* ---- arena's own: __metadata__ "arena.subclass" ----------------------------------- */

static int from_arena(arena_subclass_set *s, const arena_ckpt *ck, const arena_st_file *f, const char *text)
{
	json_t *root = json_loads(text, JSON_REJECT_DUPLICATES, NULL);
	if (!json_is_object(root)) {
		json_decref(root);
		return arena_errorf(E(ST_BAD_METADATA), "%s: __metadata__ \"arena.subclass\" is not a JSON object", f->path);
	}
	const char *name;
	json_t *o;
	int rc = 0;
	json_object_foreach(root, name, o) {
		json_t *dt = json_object_get(o, "dtype"), *sh = json_object_get(o, "shape"),
		       *meta = json_object_get(o, "subclass"), *cs = json_object_get(o, "components");
		arena_dtype dtype = json_is_string(dt) ? arena_dtype_from_name(json_string_value(dt)) : ARENA_DTYPE_INVALID;
		int ok = json_is_object(o) && dtype != ARENA_DTYPE_INVALID && json_is_array(sh) &&
			 json_array_size(sh) <= ARENA_MAX_RANK && json_is_object(meta) && json_is_array(cs) &&
			 json_array_size(cs) >= 1 && json_array_size(cs) <= ARENA_MAX_COMPONENTS;
		uint64_t shape[ARENA_MAX_RANK];
		uint32_t rank = ok ? (uint32_t)json_array_size(sh) : 0;
		for (uint32_t k = 0; ok && k < rank; k++) {
			json_t *d = json_array_get(sh, k);
			ok = json_is_integer(d) && json_integer_value(d) >= 0;
			shape[k] = ok ? (uint64_t)json_integer_value(d) : 0;
		}
		const char *cn[ARENA_MAX_COMPONENTS];
		const arena_st_tensor *ct[ARENA_MAX_COMPONENTS];
		uint32_t n = ok ? (uint32_t)json_array_size(cs) : 0;
		for (uint32_t c = 0; ok && c < n; c++) {
			json_t *p = json_array_get(cs, c);
			ok = json_is_array(p) && json_array_size(p) == 2 && json_is_string(json_array_get(p, 0)) &&
			     json_is_string(json_array_get(p, 1));
			if (!ok)
				break;
			cn[c] = json_string_value(json_array_get(p, 0));
			ct[c] = arena_ckpt_find(ck, json_string_value(json_array_get(p, 1)));
			if (!ct[c]) {
				rc = arena_errorf(E(ST_BAD_METADATA),
						  "%s: __metadata__ \"arena.subclass\": tensor '%s': its inner tensor '%s' is not in "
						  "the checkpoint",
						  f->path, arena_q(name), arena_q(json_string_value(json_array_get(p, 1))));
				break;
			}
		}
		if (rc)
			break;
		if (!ok) {
			rc = arena_errorf(E(ST_BAD_METADATA),
					  "%s: __metadata__ \"arena.subclass\": tensor '%s' is not {\"dtype\", \"shape\", "
					  "\"subclass\": {...}, \"components\": [[name, tensor], ...] (1 to %d)}",
					  f->path, arena_q(name), ARENA_MAX_COMPONENTS);
			break;
		}
		if ((rc = add(s, ck, f->path, name, dtype, rank, shape, json_incref(meta), n, cn, ct)))
			break;
	}
	json_decref(root);
	return rc;
}

/* ---- torchao's safetensors --------------------------------------------------------- */

/* The torchao types whose "qdata" has the weight's own shape, and where
 * they live (the "type" of the subclass object: the class's __module__ and
 * __qualname__ as torchao 0.18 sets them). */
static const char *const torchao_types[][2] = {
	{"Float8Tensor", "torchao.quantization.Float8Tensor"},
	{"Int8Tensor", "torchao.quantization.Int8Tensor"},
	{"IntxUnpackedToInt8Tensor", "torchao.quantization.IntxUnpackedToInt8Tensor"},
};

static arena_dtype torch_dtype_name(const char *s)
{
	if (!strcmp(s, "bfloat16"))
		return ARENA_DTYPE_BF16;
	if (!strcmp(s, "float16"))
		return ARENA_DTYPE_F16;
	if (!strcmp(s, "float32"))
		return ARENA_DTYPE_F32;
	return ARENA_DTYPE_INVALID;
}

static int from_torchao(arena_subclass_set *s, const arena_ckpt *ck, const arena_st_file *f)
{
	const char *names_text = NULL;
	for (size_t k = 0; k < f->n_meta; k++)
		if (!strcmp(f->meta_keys[k], "tensor_names"))
			names_text = f->meta_vals[k];
	if (!names_text)
		return 0;
	json_t *names = json_loads(names_text, 0, NULL);
	if (!json_is_array(names)) {
		json_decref(names);
		return 0; /* not torchao's: another tool's key of that name */
	}
	int rc = 0;
	for (size_t i = 0; !rc && i < json_array_size(names); i++) {
		const char *name = json_string_value(json_array_get(names, i)), *text = NULL;
		for (size_t k = 0; name && k < f->n_meta; k++)
			if (!strcmp(f->meta_keys[k], name))
				text = f->meta_vals[k];
		json_t *o = text ? json_loads(text, 0, NULL) : NULL;
		json_t *ty = json_object_get(o, "_type"), *data = json_object_get(o, "_data"),
		       *dn = json_object_get(o, "_tensor_data_names");
		if (!name || !json_is_string(ty)) {
			rc = arena_errorf(E(ST_BAD_METADATA), "%s: torchao metadata: tensor %zu ('%s') has no {\"_type\"} entry",
					  f->path, i, arena_q(name ? name : "?"));
		} else if (!strcmp(json_string_value(ty), "Tensor")) {
			/* a plain tensor, stored under its own name */
		} else {
			const char *type = json_string_value(ty), *full = NULL;
			for (size_t k = 0; k < sizeof(torchao_types) / sizeof(torchao_types[0]); k++)
				if (!strcmp(type, torchao_types[k][0]))
					full = torchao_types[k][1];
			json_t *dtj = json_object_get(json_object_get(data, "dtype"), "_data");
			arena_dtype dt = json_is_string(dtj) ? torch_dtype_name(json_string_value(dtj)) : ARENA_DTYPE_INVALID;
			const char *dot = strrchr(name, '.');
			if (!full)
				rc = arena_errorf(E(QUANT_NOT_APPLICABLE),
						  "%s: tensor '%s' is a torchao %s, whose saved metadata does not give the "
						  "weight's shape: write the image from the quantized model with "
						  "arena.torch.save_image(module, path)",
						  f->path, arena_q(name), arena_q(type));
			else if (!json_is_object(data) || !json_is_array(dn) || dt == ARENA_DTYPE_INVALID || !dot)
				rc = arena_errorf(E(ST_BAD_METADATA),
						  "%s: torchao metadata: tensor '%s' lacks \"_data\" with its dtype (bfloat16, "
						  "float16 or float32) or \"_tensor_data_names\"",
						  f->path, arena_q(name));
			const char *cn[ARENA_MAX_COMPONENTS];
			const arena_st_tensor *ct[ARENA_MAX_COMPONENTS];
			char tn[ARENA_MAX_COMPONENTS][1024];
			uint32_t n = (uint32_t)json_array_size(dn);
			const arena_st_tensor *qdata = NULL;
			if (!rc && n > ARENA_MAX_COMPONENTS)
				rc = arena_errorf(E(QUANT_NOT_APPLICABLE), "%s: tensor '%s': a torchao %s of %u inner tensors "
						  "(an image tensor holds 1 to %d)", f->path, arena_q(name), type, n,
						  ARENA_MAX_COMPONENTS);
			for (uint32_t c = 0; !rc && c < n; c++) {
				cn[c] = json_string_value(json_array_get(dn, c));
				if (!cn[c]) {
					rc = arena_errorf(E(ST_BAD_METADATA), "%s: torchao metadata: tensor '%s': "
							  "\"_tensor_data_names\" is not a list of names", f->path, arena_q(name));
					break;
				}
				/* "<module>._<leaf>_<attr>" */
				snprintf(tn[c], sizeof(tn[c]), "%.*s._%s_%s", (int)(dot - name), name, dot + 1, cn[c]);
				if (!(ct[c] = arena_ckpt_find(ck, tn[c])))
					rc = arena_errorf(E(ST_BAD_METADATA),
							  "%s: torchao metadata: tensor '%s': its inner tensor '%s' is not in "
							  "the checkpoint",
							  f->path, arena_q(name), arena_q(tn[c]));
				else if (!strcmp(cn[c], "qdata"))
					qdata = ct[c];
			}
			if (!rc && !qdata)
				rc = arena_errorf(E(ST_BAD_METADATA), "%s: torchao metadata: tensor '%s' has no \"qdata\"",
						  f->path, arena_q(name));
			else if (!rc && qdata->rank > ARENA_MAX_RANK)
				rc = arena_errorf(E(QUANT_NOT_APPLICABLE), "%s: tensor '%s': rank %u is over %d", f->path,
						  arena_q(name), qdata->rank, ARENA_MAX_RANK);
			if (!rc) {
				json_t *meta = size_stride(json_pack("{s:s,s:s,s:s,s:O}", "library", "torchao", "type", full,
								     "encoding", "torchao", "attributes", data),
							   qdata->rank, qdata->shape);
				rc = meta ? add(s, ck, f->path, name, dt, qdata->rank, qdata->shape, meta, n, cn, ct)
					  : arena_errorf(ARENA_E_NOMEM, "out of memory");
			}
		}
		json_decref(o);
	}
	json_decref(names);
	return rc;
}

/* ---- optimum-quanto's state_dict ---------------------------------------------------- */

static int from_quanto(arena_subclass_set *s, const arena_ckpt *ck)
{
	char nm[1100];
	int rc = 0;
	for (size_t i = 0; !rc && i < ck->n_tensors; i++) {
		const arena_st_tensor *d = ck->tensors[i];
		size_t len = strlen(d->name);
		if (len < 13 || strcmp(d->name + len - 13, ".weight._data"))
			continue;
		char base[1024];
		snprintf(base, sizeof(base), "%.*s", (int)(len - 6), d->name); /* "<x>.weight" */
		snprintf(nm, sizeof(nm), "%s._scale", base);
		const arena_st_tensor *sc = arena_ckpt_find(ck, nm);
		if (!sc || arena_ckpt_find(ck, base))
			continue;
		const char *path = d->file->path;
		snprintf(nm, sizeof(nm), "%s._data._data", base);
		if (arena_ckpt_find(ck, nm) || d->rank < 1 || d->rank > ARENA_MAX_RANK)
			continue;
		snprintf(nm, sizeof(nm), "%s._shift", base);
		const arena_st_tensor *sh = arena_ckpt_find(ck, nm);
		const char *qtype = d->dtype == ARENA_DTYPE_F8_E4M3 ? "qfloat8_e4m3fn"
				    : d->dtype == ARENA_DTYPE_F8_E5M2 ? "qfloat8_e5m2"
				    : d->dtype == ARENA_DTYPE_I8	  ? "qint8"
									  : NULL;
		int row = sc->rank == d->rank && sc->shape[0] == d->shape[0];
		for (uint32_t k = 1; row && k < sc->rank; k++)
			row = sc->shape[k] == 1;
		if (!qtype || sh || !row || !arena_dtype_is_float(sc->dtype))
			return arena_errorf(E(QUANT_NOT_APPLICABLE),
					    "%s: tensor '%s' is an optimum-quanto weight (data %s, scale %s%s) that is not a "
					    "qint8 or qfloat8 tensor with one scale per row: write the image from the "
					    "quantized model with arena.torch.save_image(module, path)",
					    path, arena_q(base), arena_dtype_name(d->dtype), arena_dtype_name(sc->dtype),
					    sh ? ", a shift" : "");
		/* quanto's own flattening of the tensor (WeightQBytesTensor.__tensor_flatten__):
		 * every attribute a string */
		char size[400] = "[", stride[400] = "[";
		uint64_t st = 1;
		uint64_t strides[ARENA_MAX_RANK];
		for (uint32_t k = d->rank; k-- > 0;) {
			strides[k] = st;
			st *= d->shape[k];
		}
		for (uint32_t k = 0; k < d->rank; k++) {
			snprintf(size + strlen(size), sizeof(size) - strlen(size), "%s%llu", k ? ", " : "",
				 (unsigned long long)d->shape[k]);
			snprintf(stride + strlen(stride), sizeof(stride) - strlen(stride), "%s%llu", k ? ", " : "",
				 (unsigned long long)strides[k]);
		}
		strcat(size, "]");
		strcat(stride, "]");
		json_t *meta = json_pack("{s:s,s:s,s:s,s:{s:s,s:s,s:s,s:s,s:s}}", "library", "optimum.quanto", "type",
					 "optimum.quanto.tensor.weights.qbytes.WeightQBytesTensor", "encoding", "json",
					 "attributes", "qtype", qtype, "axis", "0", "size", size, "stride", stride,
					 "activation_qtype", "none");
		meta = size_stride(meta, d->rank, d->shape);
		const char *cn[2] = {"_data", "_scale"};
		const arena_st_tensor *ct[2] = {d, sc};
		rc = meta ? add(s, ck, path, base, sc->dtype, d->rank, d->shape, meta, 2, cn, ct)
			  : arena_errorf(ARENA_E_NOMEM, "out of memory");
	}
	if (rc)
		return rc;
	/* packed quanto weights: their shape is not in the file */
	for (size_t i = 0; i < ck->n_tensors; i++) {
		const arena_st_tensor *d = ck->tensors[i];
		size_t len = strlen(d->name);
		if (len < 19 || strcmp(d->name + len - 19, ".weight._data._data"))
			continue;
		char base[1024];
		snprintf(base, sizeof(base), "%.*s", (int)(len - 12), d->name);
		snprintf(nm, sizeof(nm), "%s._scale", base);
		if (arena_ckpt_find(ck, nm) && !arena_ckpt_find(ck, base))
			return arena_errorf(E(QUANT_NOT_APPLICABLE),
					    "%s: tensor '%s' is a packed optimum-quanto weight (qint4, qint2): its "
					    "state_dict does not give the weight's shape; write the image from the quantized "
					    "model with arena.torch.save_image(module, path)",
					    d->file->path, arena_q(base));
	}
	return 0;
}

int arena_subclass_find(const arena_ckpt *ck, arena_subclass_set *s)
{
	memset(s, 0, sizeof(*s));
	int rc = 0, own = 0;
	for (size_t i = 0; !rc && i < ck->n_files; i++) {
		const arena_st_file *f = ck->files[i];
		for (size_t k = 0; !rc && k < f->n_meta; k++)
			if (!strcmp(f->meta_keys[k], "arena.subclass")) {
				own = 1;
				rc = from_arena(s, ck, f, f->meta_vals[k]);
			}
	}
	for (size_t i = 0; !rc && !own && i < ck->n_files; i++)
		rc = from_torchao(s, ck, ck->files[i]);
	if (!rc && !own)
		rc = from_quanto(s, ck);
	if (rc)
		arena_subclass_free(s);
	return rc;
}

int arena_subclass_describe(const arena_subclass_group *g, arena_tensor *t)
{
	char *name = arena_strdup(g->name), *meta = arena_strdup(g->meta);
	if (!name || !meta) {
		arena_free(name);
		arena_free(meta);
		return arena_errorf(ARENA_E_NOMEM, "out of memory");
	}
	arena_free(t->name);
	t->name = name;
	t->subclass = meta;
	t->dtype = g->dtype;
	t->rank = g->rank;
	memcpy(t->shape, g->shape, g->rank * sizeof(*g->shape));
	snprintf(t->scheme, sizeof(t->scheme), "%s", ARENA_SCHEME_SUBCLASS);
	t->n_comp = g->n_comp;
	for (uint32_t c = 0; c < g->n_comp; c++) {
		const arena_st_tensor *s = g->comp[c];
		arena_component *o = &t->comp[c];
		memset(o, 0, sizeof(*o));
		snprintf(o->name, sizeof(o->name), "%s", g->comp_name[c]);
		o->dtype = s->dtype;
		o->rank = s->rank;
		memcpy(o->shape, s->shape, s->rank * sizeof(*s->shape));
		o->bytes = s->nbytes;
		t->comp_src[c] = s;
	}
	return 0;
}
