/* export.c - write an image's tensors back to safetensors (see export.h). */
#include "export.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common/alloc.h"
#include "../common/err.h"
#include "../common/io.h"
#include "../common/outfile.h"
#include "../formats/image.h"
#include "../formats/scheme.h"
#include "../formats/st_write.h"

typedef struct piece {
	char *name;      /* exported name (owned) */
	uint64_t offset; /* raw data offset in the image */
	uint64_t bytes;
} piece;

static int cmp_piece(const void *a, const void *b)
{
	return strcmp(((const piece *)a)->name, ((const piece *)b)->name);
}

/* "<name>" for data and qdata, "<name>_<component>" for the others; every
 * component of a torch-subclass tensor "<name>_<component>" (and the
 * metadata "arena.subclass" says how they group again: subclass_meta). */
static char *export_name(const arena_tensor *t, const arena_component *c)
{
	if ((!strcmp(c->name, "data") || !strcmp(c->name, "qdata")) && strcmp(t->scheme, ARENA_SCHEME_SUBCLASS))
		return arena_strdup(t->name);
	size_t n = strlen(t->name) + strlen(c->name) + 2;
	char *s = arena_malloc(n);
	if (s)
		snprintf(s, n, "%s_%s", t->name, c->name);
	return s;
}

/* Every exported name is one tensor's (an image converted before convert
 * refused clashes may hold a tensor named like another's scale). */
static int check_names(const arena_image *img)
{
	const arena_layout *l = img->layout;
	for (size_t i = 0; i < l->n_tensors; i++) {
		const arena_tensor *t = &l->tensors[i];
		for (uint32_t c = 0; c < t->n_comp; c++) {
			char *nm = export_name(t, &t->comp[c]);
			if (!nm)
				return arena_errorf(ARENA_E_NOMEM, "out of memory");
			const arena_tensor *o = strcmp(nm, t->name) ? arena_layout_find(l, nm) : NULL;
			int rc = o ? arena_errorf(ARENA_E(DUPLICATE_TENSOR),
						  "%s: tensor '%s': its %s would be exported as '%s', the name of another "
						  "tensor; this image cannot be written as safetensors",
						  img->path, arena_q(t->name), t->comp[c].name, arena_q(nm))
				   : 0;
			arena_free(nm);
			if (rc)
				return rc;
		}
	}
	return 0;
}

/* The image's torch-subclass tensors in arena's convention (convert/subclass.h):
 * __metadata__ "arena.subclass", so that convert groups the exported
 * components again. NULL text and 0 when there are none. */
static int subclass_meta(const arena_layout *l, char **out)
{
	*out = NULL;
	json_t *root = json_object();
	int fail = !root, any = 0;
	for (size_t i = 0; !fail && i < l->n_tensors; i++) {
		const arena_tensor *t = &l->tensors[i];
		if (!t->subclass)
			continue;
		any = 1;
		json_t *shape = json_array(), *comps = json_array();
		for (uint32_t k = 0; shape && k < t->rank; k++)
			fail |= json_array_append_new(shape, json_integer((json_int_t)t->shape[k]));
		for (uint32_t c = 0; comps && c < t->n_comp; c++) {
			char *nm = export_name(t, &t->comp[c]);
			fail |= !nm || json_array_append_new(comps, json_pack("[ss]", t->comp[c].name, nm));
			arena_free(nm);
		}
		json_t *o = json_pack("{s:s,s:o,s:o,s:o}", "dtype", arena_dtype_name(t->dtype), "shape", shape, "subclass",
				      json_loads(t->subclass, 0, NULL), "components", comps);
		fail |= !shape || !comps || !o || json_object_set_new(root, t->name, o);
	}
	if (!fail && any)
		fail = !(*out = json_dumps(root, JSON_COMPACT));
	json_decref(root);
	return fail ? arena_errorf(ARENA_E_NOMEM, "out of memory") : 0;
}

/* Progress over both passes: the verification's stored bytes, then the
 * bytes written. */
typedef struct xprog {
	arena_export_progress_fn fn;
	void *ctx;
	uint64_t verify, total;
} xprog;

static int verify_progress(void *c, uint64_t done, uint64_t total)
{
	xprog *x = c;
	(void)total;
	x->fn(x->ctx, done, x->total);
	return 0;
}

int arena_export(const char *image, const char *out, unsigned threads, arena_export_result *res)
{
	return arena_export_progress(image, out, threads, res, NULL, NULL, 1);
}

int arena_export_progress(const char *image, const char *out, unsigned threads, arena_export_result *res,
			  arena_export_progress_fn progress, void *pctx, int force)
{
	xprog x = {progress, pctx, 0, 0};
	arena_image *img = NULL;
	arena_stw *w = NULL;
	piece *pieces = NULL;
	size_t n = 0;
	uint8_t *buf = NULL;
	const size_t BUF = 8u << 20;
	arena_img_reader rd = {0};
	if (!threads) {
		long c = sysconf(_SC_NPROCESSORS_ONLN);
		threads = c < 1 ? 1 : c > 8 ? 8 : (unsigned)c;
	}
	int rc = arena_img_open(image, &img);
	if (!rc && progress) {
		for (uint64_t i = 0; i < img->hdr.chunk_count; i++)
			x.verify += img->chunks[i].stored_length;
		x.total = x.verify;
		for (size_t i = 0; i < img->layout->n_tensors; i++)
			for (uint32_t c = 0; c < img->layout->tensors[i].n_comp; c++)
				x.total += img->layout->tensors[i].comp[c].bytes;
	}
	/* Verified whole first: nothing is written from a bad image, nor over it. */
	if (rc || (rc = arena_outfile_check_input(out, img->fd, image)) || (!force && (rc = arena_outfile_check_new(out))) ||
	    (rc = arena_img_verify_data_progress(img, threads, NULL, NULL, NULL, progress ? verify_progress : NULL, &x)) ||
	    (rc = arena_img_reader_init(&rd, img, 0)))
		goto out;
	uint64_t written = 0;
	const arena_layout *l = img->layout;
	if ((rc = check_names(img)))
		goto out;
	size_t total = 0;
	for (size_t i = 0; i < l->n_tensors; i++)
		total += l->tensors[i].n_comp;
	pieces = arena_calloc(total, sizeof(*pieces));
	buf = arena_malloc(BUF);
	if (!pieces || !buf) {
		rc = arena_errorf(ARENA_E_NOMEM, "out of memory");
		goto out;
	}
	if ((rc = arena_stw_create_flags(out, force ? 0 : ARENA_OUTFILE_NEW, &w)))
		goto out;
	const char *k;
	json_t *v;
	char *sub = NULL;
	if ((rc = subclass_meta(l, &sub)))
		goto out;
	if (img->metadata)
		json_object_foreach((json_t *)(uintptr_t)img->metadata, k, v) {
			if (sub && !strcmp(k, "arena.subclass"))
				continue; /* the source's: the image's own below */
			if ((rc = arena_stw_meta(w, k, json_string_value(v)))) {
				arena_free(sub);
				goto out;
			}
		}
	if (sub) {
		rc = arena_stw_meta(w, "arena.subclass", sub);
		arena_free(sub);
		if (rc)
			goto out;
	}
	for (size_t i = 0; i < l->n_tensors; i++) {
		const arena_tensor *t = &l->tensors[i];
		const arena_block *b = &l->blocks[t->block];
		for (uint32_t c = 0; c < t->n_comp; c++) {
			const arena_component *cp = &t->comp[c];
			int plain = !strcmp(t->scheme, "none");
			piece *p = &pieces[n];
			if (!(p->name = export_name(t, cp))) {
				rc = arena_errorf(ARENA_E_NOMEM, "out of memory");
				goto out;
			}
			n++;
			p->offset = b->offset + cp->offset;
			p->bytes = cp->bytes;
			rc = plain ? arena_stw_add(w, p->name, t->dtype, t->rank, t->shape)
				   : arena_stw_add(w, p->name, cp->dtype, cp->rank, cp->shape);
			if (rc) /* the message names `out` */
				goto out;
		}
	}
	qsort(pieces, n, sizeof(*pieces), cmp_piece);
	if ((rc = arena_stw_begin(w)))
		goto out;
	for (size_t i = 0; i < arena_stw_count(w); i++) {
		const arena_stw_tensor *st = arena_stw_get(w, i);
		piece key = {.name = (char *)(uintptr_t)st->name};
		const piece *p = bsearch(&key, pieces, n, sizeof(*pieces), cmp_piece);
		if (!p || p->bytes != st->nbytes) {
			rc = arena_errorf(ARENA_E_INTERNAL, "%s: tensor '%s' lost its bytes", out, arena_q(st->name));
			goto out;
		}
		for (uint64_t done = 0; done < p->bytes;) {
			size_t len = p->bytes - done < BUF ? (size_t)(p->bytes - done) : BUF;
			if ((rc = arena_img_read_raw(&rd, p->offset + done, len, buf)) ||
			    (rc = arena_stw_write(w, buf, len)))
				goto out;
			done += len;
			written += len;
			if (progress)
				progress(pctx, x.verify + written, x.total);
		}
	}
	if (res) {
		res->tensors = arena_stw_count(w);
		res->data_bytes = arena_stw_data_size(w);
		res->file_size = arena_stw_data_offset(w) + arena_stw_data_size(w);
	}
	rc = arena_stw_commit(w);
	w = NULL;
out:
	arena_stw_abort(w);
	for (size_t i = 0; i < n; i++)
		arena_free(pieces[i].name);
	arena_free(pieces);
	arena_free(buf);
	arena_img_reader_free(&rd);
	arena_img_close(img);
	return rc;
}
