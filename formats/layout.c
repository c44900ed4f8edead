/* layout.c - placing blocks and tensors into slabs, and checking a placed layout. */
#include "layout.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/alloc.h"
#include "../common/err.h"

int arena_layout_create(size_t n_blocks, size_t n_tensors, arena_layout **out)
{
	*out = NULL;
	arena_layout *l = arena_calloc(1, sizeof(*l));
	if (!l)
		return arena_errorf(ARENA_E_NOMEM, "out of memory for the layout");
	l->blocks = arena_calloc(n_blocks, sizeof(*l->blocks));
	l->tensors = arena_calloc(n_tensors, sizeof(*l->tensors));
	l->order = arena_calloc(n_tensors, sizeof(*l->order));
	if (!l->blocks || !l->tensors || !l->order) {
		arena_layout_free(l);
		return arena_errorf(ARENA_E_NOMEM, "out of memory for a layout of %zu tensors", n_tensors);
	}
	l->n_blocks = n_blocks;
	l->n_tensors = n_tensors;
	*out = l;
	return 0;
}

void arena_layout_free(arena_layout *l)
{
	if (!l)
		return;
	for (size_t i = 0; l->blocks && i < l->n_blocks; i++) {
		arena_free(l->blocks[i].name);
		arena_free(l->blocks[i].container);
	}
	for (size_t i = 0; l->tensors && i < l->n_tensors; i++) {
		arena_free(l->tensors[i].name);
		arena_free(l->tensors[i].subclass);
	}
	arena_free(l->blocks);
	arena_free(l->tensors);
	arena_free(l->order);
	arena_free(l);
}

int arena_nbytes(arena_dtype dt, uint32_t rank, const uint64_t *shape, uint64_t *out)
{
	uint64_t n = 1, bits;
	for (uint32_t i = 0; i < rank; i++)
		if (__builtin_mul_overflow(n, shape[i], &n))
			return -1;
	if (arena_dtype_bits(dt) == 0 || __builtin_mul_overflow(n, (uint64_t)arena_dtype_bits(dt), &bits) ||
	    bits % 8)
		return -1;
	*out = bits / 8;
	return 0;
}

static int cmp_tensor_name(const void *a, const void *b)
{
	return strcmp(((const arena_tensor *)a)->name, ((const arena_tensor *)b)->name);
}

/* order[] grouped by block, name order inside a block (tensors are sorted). */
static void group_by_block(arena_layout *l)
{
	for (size_t b = 0; b < l->n_blocks; b++)
		l->blocks[b].n_tensors = 0;
	for (size_t i = 0; i < l->n_tensors; i++)
		l->blocks[l->tensors[i].block].n_tensors++;
	uint32_t pos = 0;
	for (size_t b = 0; b < l->n_blocks; b++) {
		l->blocks[b].first = pos;
		pos += l->blocks[b].n_tensors;
		l->blocks[b].n_tensors = 0;
	}
	for (size_t i = 0; i < l->n_tensors; i++) {
		arena_block *b = &l->blocks[l->tensors[i].block];
		l->order[b->first + b->n_tensors++] = (uint32_t)i;
	}
}

int arena_layout_place(arena_layout *l)
{
	qsort(l->tensors, l->n_tensors, sizeof(*l->tensors), cmp_tensor_name);
	for (size_t i = 1; i < l->n_tensors; i++)
		if (strcmp(l->tensors[i - 1].name, l->tensors[i].name) == 0)
			return arena_errorf(ARENA_E(DUPLICATE_TENSOR), "tensor '%s' is defined twice",
					    arena_q(l->tensors[i].name));
	group_by_block(l);
	uint64_t pos = 0;
	for (size_t b = 0; b < l->n_blocks; b++) {
		arena_block *blk = &l->blocks[b];
		blk->offset = pos = arena_align_up(pos, ARENA_SLAB_ALIGN);
		uint64_t off = 0;
		for (uint32_t k = 0; k < blk->n_tensors; k++) {
			arena_tensor *t = &l->tensors[l->order[blk->first + k]];
			for (uint32_t c = 0; c < t->n_comp; c++) {
				off = arena_align_up(off, ARENA_TENSOR_ALIGN);
				t->comp[c].offset = off;
				off += t->comp[c].bytes;
			}
		}
		blk->bytes = arena_align_up(off, ARENA_TENSOR_ALIGN);
		pos += blk->bytes;
	}
	l->data_length = arena_align_up(pos, ARENA_SLAB_ALIGN);
	return 0;
}

typedef struct span {
	uint64_t begin, end;
	uint32_t tensor, comp;
} span;

static int cmp_span(const void *a, const void *b)
{
	const span *x = a, *y = b;
	if (x->begin != y->begin)
		return x->begin < y->begin ? -1 : 1;
	return x->end < y->end ? -1 : x->end > y->end;
}

int arena_layout_check(arena_layout *l, const char *label)
{
	uint64_t prev_end = 0;
	if (l->data_length % ARENA_SLAB_ALIGN)
		return arena_errorf(ARENA_E(IMG_SLAB_BAD), "%s: data length %llu is not a multiple of %u", label,
				    (unsigned long long)l->data_length, ARENA_SLAB_ALIGN);
	for (size_t b = 0; b < l->n_blocks; b++) {
		const arena_block *blk = &l->blocks[b];
		uint64_t end;
		if (blk->offset % ARENA_SLAB_ALIGN || blk->offset < prev_end ||
		    __builtin_add_overflow(blk->offset, blk->bytes, &end) || end > l->data_length)
			return arena_errorf(ARENA_E(IMG_SLAB_BAD),
					    "%s: block '%s': slab [%llu, +%llu) is misaligned, overlaps the previous slab or lies outside the %llu data bytes",
					    label, arena_q(blk->name), (unsigned long long)blk->offset,
					    (unsigned long long)blk->bytes, (unsigned long long)l->data_length);
		prev_end = end;
	}
	for (size_t i = 0; i < l->n_tensors; i++) {
		const arena_tensor *t = &l->tensors[i];
		if (i && strcmp(l->tensors[i - 1].name, t->name) >= 0)
			return arena_errorf(ARENA_E(IMG_MANIFEST_BAD), "%s: tensor '%s': tensors are not sorted by unique name",
					    label, arena_q(t->name));
		if (t->block >= l->n_blocks)
			return arena_errorf(ARENA_E(IMG_MANIFEST_BAD), "%s: tensor '%s': block %u does not exist",
					    label, arena_q(t->name), t->block);
		const arena_block *blk = &l->blocks[t->block];
		for (uint32_t c = 0; c < t->n_comp; c++) {
			const arena_component *cp = &t->comp[c];
			uint64_t need, end;
			if (arena_nbytes(cp->dtype, cp->rank, cp->shape, &need) || need != cp->bytes)
				return arena_errorf(ARENA_E(IMG_TENSOR_BAD),
						    "%s: tensor '%s': component '%s' has %llu bytes, its dtype and shape need another size",
						    label, arena_q(t->name), arena_q(cp->name), (unsigned long long)cp->bytes);
			if (cp->offset % ARENA_TENSOR_ALIGN || __builtin_add_overflow(cp->offset, cp->bytes, &end) ||
			    end > blk->bytes)
				return arena_errorf(ARENA_E(IMG_TENSOR_BAD),
						    "%s: tensor '%s': component '%s' [%llu, +%llu) lies outside its block '%s' slab of %llu bytes or is misaligned",
						    label, arena_q(t->name), arena_q(cp->name), (unsigned long long)cp->offset,
						    (unsigned long long)cp->bytes, arena_q(blk->name),
						    (unsigned long long)blk->bytes);
		}
	}
	group_by_block(l);
	/* Components of one slab must not overlap: sort each block's spans. */
	size_t total = 0;
	for (size_t i = 0; i < l->n_tensors; i++)
		total += l->tensors[i].n_comp;
	span *sp = arena_calloc(total, sizeof(*sp));
	if (!sp)
		return arena_errorf(ARENA_E_NOMEM, "%s: out of memory checking the layout", label);
	int rc = 0;
	for (size_t b = 0; b < l->n_blocks && !rc; b++) {
		const arena_block *blk = &l->blocks[b];
		size_t n = 0;
		for (uint32_t k = 0; k < blk->n_tensors; k++) {
			uint32_t ti = l->order[blk->first + k];
			for (uint32_t c = 0; c < l->tensors[ti].n_comp; c++)
				sp[n++] = (span){l->tensors[ti].comp[c].offset,
						 l->tensors[ti].comp[c].offset + l->tensors[ti].comp[c].bytes, ti, c};
		}
		qsort(sp, n, sizeof(*sp), cmp_span);
		for (size_t k = 1; k < n; k++)
			if (sp[k].begin < sp[k - 1].end) {
				rc = arena_errorf(ARENA_E(IMG_TENSOR_BAD),
						  "%s: tensor '%s': component '%s' overlaps tensor '%s' in block '%s'", label,
						  arena_q(l->tensors[sp[k].tensor].name),
						  arena_q(l->tensors[sp[k].tensor].comp[sp[k].comp].name),
						  arena_q(l->tensors[sp[k - 1].tensor].name), arena_q(blk->name));
				break;
			}
	}
	arena_free(sp);
	return rc;
}

static int cmp_key_name(const void *key, const void *t)
{
	return strcmp(key, ((const arena_tensor *)t)->name);
}

const arena_tensor *arena_layout_find(const arena_layout *l, const char *name)
{
	return l->n_tensors ? bsearch(name, l->tensors, l->n_tensors, sizeof(*l->tensors), cmp_key_name) : NULL;
}

uint64_t arena_layout_payload(const arena_layout *l)
{
	uint64_t s = 0;
	for (size_t i = 0; i < l->n_tensors; i++)
		for (uint32_t c = 0; c < l->tensors[i].n_comp; c++)
			s += l->tensors[i].comp[c].bytes;
	return s;
}

/* --- pieces ------------------------------------------------------------------ */

typedef struct atom {
	uint64_t begin, end;
	const char *name; /* a tensor of the module (the name up to its last '.') it holds */
} atom;

/* Whether tensors a and b belong to one module: their names equal up to
 * their last '.' (a Linear's weight and bias). */
static int same_module(const char *a, const char *b)
{
	const char *da = strrchr(a, '.'), *db = strrchr(b, '.');
	return da && db && da - a == db - b && !memcmp(a, b, (size_t)(da - a));
}

static int cmp_atom(const void *a, const void *b)
{
	const atom *x = a, *y = b;
	return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* The bytes tensor t's components span in its slab. */
static atom tensor_span(const arena_tensor *t)
{
	atom a = {UINT64_MAX, 0, NULL};
	for (uint32_t c = 0; c < t->n_comp; c++) {
		if (t->comp[c].offset < a.begin)
			a.begin = t->comp[c].offset;
		if (t->comp[c].offset + t->comp[c].bytes > a.end)
			a.end = t->comp[c].offset + t->comp[c].bytes;
	}
	return a;
}

/* Where block b's pieces start (cuts[0] = 0), at most `piece` bytes each
 * unless one tensor (or one module's tensors) is larger; returns how many
 * (>= 1). `at` has room for the block's tensors, cuts for one more. */
static size_t cut_block(const arena_layout *l, size_t b, uint64_t piece, atom *at, uint64_t *cuts)
{
	const arena_block *blk = &l->blocks[b];
	size_t n = 0;
	for (uint32_t k = 0; k < blk->n_tensors; k++) {
		const arena_tensor *t = &l->tensors[l->order[blk->first + k]];
		if (t->n_comp) {
			at[n] = tensor_span(t);
			at[n++].name = t->name;
		}
	}
	qsort(at, n, sizeof(*at), cmp_atom);
	/* A tensor's components (and tensors whose spans overlap) stay together,
	 * and so do neighbouring tensors of one module (a caller that acquires a
	 * module's tensors then needs one piece). */
	size_t m = 0;
	for (size_t i = 0; i < n; i++) {
		if (m && (at[i].begin < at[m - 1].end || same_module(at[i].name, at[m - 1].name))) {
			if (at[i].end > at[m - 1].end)
				at[m - 1].end = at[i].end;
		} else {
			at[m++] = at[i];
		}
	}
	size_t k = 0;
	uint64_t start = 0;
	cuts[k++] = 0;
	if (!blk->container || blk->bytes <= piece) /* globals (no container) stay whole */
		return k;
	for (size_t i = 0; i < m; i++)
		if (at[i].end - start > piece && at[i].begin > start) {
			cuts[k++] = at[i].begin;
			start = at[i].begin;
		}
	return k;
}

int arena_layout_pieces(const arena_layout *l, uint64_t piece, arena_layout **out, uint32_t **parent)
{
	*out = NULL;
	if (parent)
		*parent = NULL;
	if (!piece)
		return arena_errorf(ARENA_E_USAGE, "pieces: a piece size of 0 bytes");
	size_t nt = l->n_tensors ? l->n_tensors : 1;
	atom *at = arena_calloc(nt, sizeof(*at));
	uint64_t *cuts = arena_calloc(nt + 1, sizeof(*cuts));
	arena_layout *o = NULL;
	uint32_t *par = NULL;
	int rc = 0;
	if (!at || !cuts) {
		rc = arena_errorf(ARENA_E_NOMEM, "pieces: out of memory");
		goto out;
	}
	size_t total = 0;
	for (size_t b = 0; b < l->n_blocks; b++)
		total += cut_block(l, b, piece, at, cuts);
	if ((rc = arena_layout_create(total, l->n_tensors, &o)))
		goto out;
	if (!(par = arena_calloc(total ? total : 1, sizeof(*par)))) {
		rc = arena_errorf(ARENA_E_NOMEM, "pieces: out of memory");
		goto out;
	}
	o->data_length = l->data_length;
	size_t j = 0;
	for (size_t b = 0; b < l->n_blocks; b++) {
		const arena_block *blk = &l->blocks[b];
		size_t k = cut_block(l, b, piece, at, cuts);
		for (size_t q = 0; q < k; q++, j++) {
			arena_block *nb = &o->blocks[j];
			uint64_t a = cuts[q], z = q + 1 < k ? cuts[q + 1] : blk->bytes;
			par[j] = (uint32_t)b;
			if (k == 1) {
				nb->name = arena_strdup(blk->name);
			} else {
				size_t len = strlen(blk->name) + 24;
				if ((nb->name = arena_malloc(len)))
					snprintf(nb->name, len, "%s#%zu", blk->name, q);
			}
			nb->container = blk->container ? arena_strdup(blk->container) : NULL;
			if (!nb->name || (blk->container && !nb->container)) {
				rc = arena_errorf(ARENA_E_NOMEM, "pieces: out of memory");
				goto out;
			}
			nb->index = blk->index;
			nb->offset = blk->offset + a;
			nb->bytes = z - a;
		}
		/* Each tensor of b to the piece holding its first byte. */
		for (uint32_t t = 0; t < blk->n_tensors; t++) {
			uint32_t ti = l->order[blk->first + t];
			const arena_tensor *src = &l->tensors[ti];
			uint64_t lo = tensor_span(src).begin;
			size_t q = 0;
			while (src->n_comp && q + 1 < k && cuts[q + 1] <= lo)
				q++;
			arena_tensor *dt = &o->tensors[ti];
			*dt = *src;
			dt->name = NULL;
			dt->subclass = NULL;
			dt->block = (uint32_t)(j - k + q);
			for (uint32_t c = 0; c < dt->n_comp; c++)
				dt->comp[c].offset -= cuts[q];
		}
	}
	for (size_t i = 0; i < l->n_tensors; i++) {
		if (!(o->tensors[i].name = arena_strdup(l->tensors[i].name)) ||
		    (l->tensors[i].subclass && !(o->tensors[i].subclass = arena_strdup(l->tensors[i].subclass)))) {
			rc = arena_errorf(ARENA_E_NOMEM, "pieces: out of memory");
			goto out;
		}
		o->tensors[i].src = NULL;
	}
	group_by_block(o);
out:
	arena_free(at);
	arena_free(cuts);
	if (rc) {
		arena_layout_free(o);
		arena_free(par);
		return rc;
	}
	*out = o;
	if (parent)
		*parent = par;
	else
		arena_free(par);
	return 0;
}
