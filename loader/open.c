/* open.c - the public arena handle: pick a backend, size the budgets, load
 * (see include/arena.h). */
#include "open.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "../common/alloc.h"
#include "../common/err.h"
#include "../common/units.h"
#include "../formats/image.h"
#include "quant_select.h"

/* A cap smaller than the model: say how many blocks (in order) would fit. */
static int check_cap(const char *path, int is_image, uint64_t cap)
{
	arena_image *img = NULL;
	arena_ckpt *ck = NULL;
	arena_layout *lay = NULL;
	int rc = is_image ? arena_img_open(path, &img) : arena_ckpt_open(path, &ck);
	if (!rc && !is_image)
		rc = arena_plan_build(ck, NULL, &lay);
	const arena_layout *l = img ? img->layout : lay;
	if (!rc) {
		uint64_t need = 0, fit = 0;
		size_t nfit = 0;
		for (size_t b = 0; b < l->n_blocks; b++) {
			need += l->blocks[b].bytes;
			if (need <= cap)
				fit = need, nfit = b + 1;
		}
		char a[32], c[32], d[32];
		if (need > cap && nfit)
			rc = arena_errorf(ARENA_E(BUDGET),
					  "%s: the model needs %s of device memory, over the %s cap; the first %zu of %zu blocks (%s) would fit",
					  path, arena_size_str(need, a, sizeof(a)), arena_size_str(cap, c, sizeof(c)), nfit,
					  l->n_blocks, arena_size_str(fit, d, sizeof(d)));
		else if (need > cap)
			rc = arena_errorf(ARENA_E(BUDGET),
					  "%s: the model needs %s of device memory, over the %s cap; not even the first of its %zu blocks (%s) would fit",
					  path, arena_size_str(need, a, sizeof(a)), arena_size_str(cap, c, sizeof(c)),
					  l->n_blocks, arena_size_str(l->blocks[0].bytes, d, sizeof(d)));
	}
	arena_img_close(img);
	arena_layout_free(lay);
	arena_ckpt_close(ck);
	return rc;
}

int arena__open_tuned(const char *path, const arena_open_options *opt, const arena_load_opts *tune, arena **out,
		      arena_load_stats *st, volatile sig_atomic_t *cancel)
{
	static const arena_open_options defaults = {0};
	const arena_open_options *o = opt ? opt : &defaults;
	*out = NULL;
	arena *a = arena_calloc(1, sizeof(*a));
	if (!a)
		return arena_errorf(ARENA_E_NOMEM, "out of memory");
	arena_sim_opts so = {.capacity = o->vram_cap ? o->vram_cap : (16ull << 30)};
	int rc;
	if (!o->backend) {
		rc = arena_backend_create("cuda", o->device, NULL, &a->be);
		if (rc == ARENA_E_NO_DEVICE)
			rc = arena_backend_create("sim", 0, &so, &a->be);
	} else {
		rc = arena_backend_create(o->backend, o->device, &so, &a->be);
	}
	if (rc)
		goto fail;
	a->is_image = arena_img_sniff(path);
	if (a->is_image && o->quant) {
		rc = arena_errorf(ARENA_E_USAGE, "%s: a quantization scheme applies to safetensors inputs; an image keeps the layout it was converted with",
				  path);
		goto fail;
	}
	if (o->vram_cap && (rc = check_cap(path, a->is_image, o->vram_cap)))
		goto fail;
	arena_pin_budget_probe(&a->budget, o->pin_budget, ARENA_PIN_RESERVE_AUTO, "");
	arena_quant_opts q = {.scheme = o->quant};
	arena_load_opts lo = {.threads = o->threads, .io = ARENA_IO_AUTO};
	if (tune)
		lo = *tune;
	lo.backend = a->be;
	lo.budget = &a->budget;
	lo.cancel = cancel;
	lo.quant = o->quant ? &q : NULL;
	lo.on_device = NULL;
	rc = a->is_image ? arena_load_image(path, &lo, &a->m, st) : arena_load_safetensors(&path, 1, NULL, &lo, &a->m, st);
	if (rc)
		goto fail;
	*out = a;
	return 0;
fail:
	arena_close(a);
	return rc;
}

int arena_open(const char *path, const arena_open_options *opt, arena **out)
{
	return arena__open_tuned(path, opt, NULL, out, NULL, NULL);
}

void arena_close(arena *a)
{
	if (!a)
		return;
	arena_model_free(a->m);
	arena_backend_destroy(a->be);
	arena_free(a);
}

const char *arena_backend_name(const arena *a)
{
	return a->be->ops->name;
}

size_t arena_block_count(const arena *a)
{
	return a->m->layout->n_blocks;
}

const char *arena_block_name(const arena *a, size_t i)
{
	return i < a->m->layout->n_blocks ? a->m->layout->blocks[i].name : NULL;
}

void *arena_block_device(const arena *a, size_t i)
{
	return i < a->m->layout->n_blocks ? a->m->mem[i].dev : NULL;
}

uint64_t arena_block_bytes(const arena *a, size_t i)
{
	return i < a->m->layout->n_blocks ? a->m->layout->blocks[i].bytes : 0;
}

size_t arena_tensor_count(const arena *a)
{
	return a->m->layout->n_tensors;
}

int arena_tensor_get(const arena *a, size_t i, arena_tensor_info *out)
{
	const arena_layout *l = a->m->layout;
	if (i >= l->n_tensors)
		return arena_errorf(ARENA_E_USAGE, "tensor index %zu is out of range (%zu tensors)", i, l->n_tensors);
	const arena_tensor *t = &l->tensors[i];
	memset(out, 0, sizeof(*out));
	out->name = t->name;
	out->dtype = arena_dtype_name(t->dtype);
	out->rank = t->rank;
	out->shape = t->shape;
	out->scheme = t->scheme;
	out->block = t->block;
	out->n_components = t->n_comp;
	uint8_t *base = a->m->mem[t->block].dev;
	for (uint32_t c = 0; c < t->n_comp && c < 4; c++) {
		out->component[c].name = t->comp[c].name;
		out->component[c].dtype = arena_dtype_name(t->comp[c].dtype);
		out->component[c].rank = t->comp[c].rank;
		out->component[c].shape = t->comp[c].shape;
		out->component[c].bytes = t->comp[c].bytes;
		out->component[c].device = base ? base + t->comp[c].offset : NULL;
	}
	return 0;
}

int arena_tensor_find(const arena *a, const char *name, size_t *index)
{
	const arena_tensor *t = arena_layout_find(a->m->layout, name);
	if (!t)
		return arena_errorf(ARENA_E_NOT_FOUND, "no tensor '%s' in this arena", arena_q(name));
	*index = (size_t)(t - a->m->layout->tensors);
	return 0;
}
