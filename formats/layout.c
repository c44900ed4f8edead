/* layout.c - placing blocks and tensors into slabs, and checking a placed layout. */
#include "layout.h"

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
	for (size_t i = 0; l->tensors && i < l->n_tensors; i++)
		arena_free(l->tensors[i].name);
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
