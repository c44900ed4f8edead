/* load_st.c - the loader's safetensors source: a checkpoint's plain tensors
 * read straight into the plan's slabs, destination-first, and its quantized
 * components made from the mapped files (see load.h).
 *
 * Only plain tensors are read from the files: their segments, sorted by
 * file and offset, are what the pieces cover (aligned for O_DIRECT). A
 * quantized tensor's components are made from the mapped files instead, at
 * most a ring slot's bytes a piece of work. */
#include "load_int.h"

#include <stdlib.h>
#include <string.h>

#include "../common/alloc.h"
#include "../common/clock.h"
#include "../common/err.h"
#include "../formats/checkpoint.h"

/* A range of a quantized component: converted from the mapped source
 * straight into its host slab, or into a ring slot and on to the device. */
int arena__load_st_qpiece(loader *L, worker *w, const qpiece *q)
{
	const arena_layout *l = L->m->layout;
	const arena_tensor *t = &l->tensors[q->tensor];
	const arena_block_mem *bm = &L->m->mem[t->block];
	uint64_t at = t->comp[q->comp].offset + q->off;
	if (!bm->dev)
		return arena_quant_state_fill(L->qs, l, t, q->comp, q->off, q->len, bm->host + at);
	uint8_t *buf;
	unsigned si;
	arena_backend *be = L->m->backend;
	int rc = arena__load_next_slot(L, w, &buf, &si);
	if (!rc)
		rc = arena_quant_state_fill(L->qs, l, t, q->comp, q->off, q->len, buf);
	if (!rc)
		rc = be->ops->copy_h2d(be, (uint8_t *)bm->dev + at, buf, q->len, w->s);
	if (!rc)
		rc = be->ops->event_record(be, w->ev[si], w->s);
	return rc;
}

static int cmp_seg(const void *a, const void *b)
{
	const seg *x = a, *y = b;
	if (x->file != y->file)
		return x->file < y->file ? -1 : 1;
	return x->foff < y->foff ? -1 : x->foff > y->foff;
}

/* File pieces over the bytes of plain tensors only (segs sorted), aligned for
 * O_DIRECT; neighbouring ranges closer than a piece are read as one. */
static int plan_pieces(loader *L)
{
	size_t cap = 16;
	L->pieces = arena_calloc(cap, sizeof(*L->pieces));
	if (!L->pieces)
		return arena_errorf(ARENA_E_NOMEM, "out of memory");
	for (size_t k = 0; k < L->n_segs;) {
		uint32_t f = L->segs[k].file;
		uint64_t a = L->segs[k].foff / DIRECT_ALIGN * DIRECT_ALIGN, z = L->segs[k].foff + L->segs[k].len;
		for (k++; k < L->n_segs && L->segs[k].file == f && L->segs[k].foff <= z + PIECE; k++)
			z = L->segs[k].foff + L->segs[k].len > z ? L->segs[k].foff + L->segs[k].len : z;
		for (uint64_t x = a; x < z; x += PIECE) {
			if (L->n_pieces == cap) {
				piece *np = arena_realloc(L->pieces, 2 * cap * sizeof(*np));
				if (!np)
					return arena_errorf(ARENA_E_NOMEM, "out of memory");
				L->pieces = np;
				cap *= 2;
			}
			uint64_t end = arena_align_up(x + PIECE < z ? x + PIECE : z, DIRECT_ALIGN);
			if (end > L->files[f].size)
				end = L->files[f].size;
			L->pieces[L->n_pieces++] = (piece){f, x, end - x, 0};
		}
	}
	return 0;
}

static int plan_qpieces(loader *L, const arena_layout *l)
{
	size_t n = 0;
	for (int pass = 0; pass < 2; pass++) {
		for (size_t i = 0; i < l->n_tensors; i++) {
			const arena_tensor *t = &l->tensors[i];
			if (!strcmp(t->scheme, "none"))
				continue;
			for (uint32_t c = 0; c < t->n_comp; c++)
				for (uint64_t off = 0; off < t->comp[c].bytes; off += L->slot, n++)
					if (pass)
						L->qp[n] = (qpiece){(uint32_t)i, c, off,
								    t->comp[c].bytes - off < L->slot ? t->comp[c].bytes - off
												     : L->slot};
		}
		if (!pass) {
			if (!n)
				return 0;
			L->qp = arena_calloc(n, sizeof(*L->qp));
			if (!L->qp)
				return arena_errorf(ARENA_E_NOMEM, "out of memory");
			L->n_qp = n;
			n = 0;
		}
	}
	return 0;
}

int arena_load_safetensors(const char *const *inputs, size_t n, const arena_plan_opts *plan,
			   const arena_load_opts *o, arena_model **out, arena_load_stats *st)
{
	*out = NULL;
	if (o->piece_bytes)
		return arena_errorf(ARENA_E_USAGE, "%s: pieces need an image (arena convert it first)", n ? inputs[0] : "");
	double t0 = arena_now_s();
	loader L;
	arena__load_init(&L, o);
	arena_ckpt *ck = NULL;
	arena_layout *lay = NULL;
	arena_quant_state qs = {0};
	arena_quant_ctx qc = {0};
	static const arena_plan_opts no_plan = {0};
	static const arena_quant_opts no_quant = {0};
	arena_plan_opts po = plan ? *plan : no_plan;
	int rc = arena_ckpt_open_many(inputs, n, &ck);
	if (rc)
		return rc;
	if ((rc = arena_quant_select_init(&qc, o->quant ? o->quant : &no_quant, &po)))
		goto fail;
	rc = arena_plan_build(ck, &po, &lay);
	if (!rc)
		rc = arena_quant_select_finish(&qc);
	if (rc || (rc = arena_quant_state_init(&qs, lay, ck)) || (rc = arena__load_place(&L, lay)))
		goto fail;
	L.qs = &qs;
	L.t_open = arena_now_s() - t0;
	L.t_mark = arena_now_s();
	L.n_files = ck->n_files;
	L.files = arena_calloc(ck->n_files, sizeof(*L.files));
	L.segs = arena_calloc(lay->n_tensors, sizeof(*L.segs));
	if (!L.files || !L.segs) {
		rc = arena_errorf(ARENA_E_NOMEM, "out of memory");
		goto fail;
	}
	for (size_t i = 0; i < ck->n_files; i++) {
		const arena_st_file *f = ck->files[i];
		L.files[i] = (lsrc){.path = f->path, .fd = f->fd, .size = f->size, .dfd = -1};
		if ((rc = arena__load_open_direct(&L.files[i], o->io)))
			goto fail;
	}
	for (size_t i = 0; i < lay->n_tensors; i++) {
		const arena_tensor *t = &lay->tensors[i];
		const arena_st_tensor *s = t->src;
		uint32_t fi = 0;
		while (ck->files[fi] != s->file)
			fi++;
		if (s->nbytes && !strcmp(t->scheme, "none"))
			L.segs[L.n_segs++] = (seg){fi, s->file->data_off + s->begin, s->nbytes, t->block, t->comp[0].offset};
	}
	qsort(L.segs, L.n_segs, sizeof(*L.segs), cmp_seg);
	if ((rc = plan_pieces(&L)))
		goto fail;
	/* Through the ring: the pieces read, and the quantized components
	 * (made in slot-sized pieces, which the ring's slot decides). */
	uint64_t need = 0, max_read = 0, qbytes = 0, qmax = 0;
	for (size_t i = 0; i < L.n_pieces; i++) {
		need += L.pieces[i].len;
		max_read = L.pieces[i].len > max_read ? L.pieces[i].len : max_read;
	}
	for (size_t i = 0; i < lay->n_tensors; i++)
		for (uint32_t c = 0; strcmp(lay->tensors[i].scheme, "none") && c < lay->tensors[i].n_comp; c++) {
			qbytes += lay->tensors[i].comp[c].bytes;
			qmax = lay->tensors[i].comp[c].bytes > qmax ? lay->tensors[i].comp[c].bytes : qmax;
		}
	max_read = qmax > max_read ? qmax : max_read;
	uint64_t qunits = 0, slot = L.slot < arena_align_up(max_read ? max_read : 1, DIRECT_ALIGN)
					   ? L.slot
					   : arena_align_up(max_read ? max_read : 1, DIRECT_ALIGN);
	for (size_t i = 0; i < lay->n_tensors; i++)
		for (uint32_t c = 0; strcmp(lay->tensors[i].scheme, "none") && c < lay->tensors[i].n_comp; c++)
			qunits += (lay->tensors[i].comp[c].bytes + slot - 1) / slot;
	if ((rc = arena__load_ring_setup(&L, need + qbytes, max_read, L.n_pieces + qunits)))
		goto fail;
	L.t_ring = arena_now_s() - L.t_mark;
	L.t_mark = arena_now_s();
	if ((rc = plan_qpieces(&L, lay)))
		goto fail;
	arena_model *m;
	rc = arena_model_prepare(lay, o->backend, o->budget, arena__load_on_device(&L), &m);
	lay = NULL;
	if (rc)
		goto fail;
	L.m = m;
	rc = arena__load_run(&L, out, st, t0);
	if (!rc)
		for (size_t i = 0; i < m->layout->n_tensors; i++)
			m->layout->tensors[i].src = NULL; /* the checkpoint closes now */
fail:
	arena__load_files_close(&L);
	arena_quant_state_free(&qs);
	arena_quant_select_free(&qc);
	arena_layout_free(lay);
	arena_ckpt_close(ck);
	return rc;
}
