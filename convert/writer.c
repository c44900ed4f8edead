/* writer.c - an image written from tensors handed over in memory, a block at
 * a time (arena_writer_*, arena.h).
 *
 * The checkpoint is a safetensors header alone (arena_st_parse_header): the
 * plan, the quantization choices, the manifest and the header are the ones
 * convert makes of the file the header describes (convert_int.h's job,
 * set up the same way). The data region is then written in order: when a
 * block's last tensor comes, every chunk that ends at or before the next
 * block's slab (the bytes between are padding) is filled from the tensors'
 * bytes in memory (the job's `mem`), quantized, coded and written by the
 * job's workers; the first bytes of the chunk that runs on into the next
 * block are kept in `carry` (one chunk at most), and that chunk is written
 * with the next block. So nothing of a block is read after the put that
 * completed it returns, and the writer holds one chunk of its own beside
 * its workers' buffers. */
#include <stdlib.h>
#include <string.h>

#include "../common/alloc.h"
#include "../common/err.h"
#include "arena.h"
#include "convert_int.h"

struct arena_writer {
	arena_conv_job j;
	arena_ckpt *ck;
	const arena_st_file *f; /* the header's file: the sources, by index */
	const uint8_t **mem;    /* per source: its bytes while its block is not written */
	uint32_t *src_block;    /* per source: its block */
	uint8_t *put;           /* per source: given */
	/* Per block: its sources, in the image's order (blk_src[blk_first[b] ..
	 * + blk_n[b])), and how many were given. */
	uint32_t *blk_first, *blk_n, *blk_got, *blk_src;
	size_t cur;          /* the first block not written */
	uint64_t chunks_done; /* chunks [0, chunks_done) are written */
	int failed;          /* the error that failed the writer, or 0 */
	char *why;           /* and its message */
};

/* The writer failed with rc (the thread's message): kept for later calls. */
static int fail(arena_writer *w, int rc)
{
	if (!w->failed) {
		w->failed = rc;
		w->why = arena_strdup(arena_last_error());
	}
	return rc;
}

static int failed_before(const arena_writer *w)
{
	return arena_errorf(w->failed, "%s (the writer failed before; abort it)", w->why ? w->why : "?");
}

static void writer_free(arena_writer *w)
{
	if (!w)
		return;
	arena_conv_free(&w->j);
	arena_ckpt_close(w->ck);
	arena_free(w->mem);
	arena_free(w->src_block);
	arena_free(w->put);
	arena_free(w->blk_first);
	arena_free(w->blk_n);
	arena_free(w->blk_got);
	arena_free(w->blk_src);
	arena_free(w->why);
	arena_free(w);
}

/* The index in the header's file of source s. */
static uint32_t src_index(const arena_writer *w, const arena_st_tensor *s)
{
	return (uint32_t)(s - w->f->tensors);
}

/* Each block's sources (a tensor's, or each component's of a subclass), in
 * the block's order; each source in exactly one block. */
static int index_blocks(arena_writer *w)
{
	const arena_layout *l = w->j.l;
	const size_t ns = w->f->n_tensors, nb = l->n_blocks;
	w->mem = arena_calloc(ns ? ns : 1, sizeof(*w->mem));
	w->src_block = arena_calloc(ns ? ns : 1, sizeof(*w->src_block));
	w->put = arena_calloc(ns ? ns : 1, 1);
	w->blk_first = arena_calloc(nb, sizeof(*w->blk_first));
	w->blk_n = arena_calloc(nb, sizeof(*w->blk_n));
	w->blk_got = arena_calloc(nb, sizeof(*w->blk_got));
	w->blk_src = arena_calloc(ns ? ns : 1, sizeof(*w->blk_src));
	if (!w->mem || !w->src_block || !w->put || !w->blk_first || !w->blk_n || !w->blk_got || !w->blk_src)
		return arena_errorf(ARENA_E_NOMEM, "out of memory for %zu tensors", ns);
	for (size_t i = 0; i < ns; i++)
		w->src_block[i] = UINT32_MAX;
	size_t n = 0;
	for (size_t b = 0; b < nb; b++) {
		const arena_block *blk = &l->blocks[b];
		w->blk_first[b] = (uint32_t)n;
		for (uint32_t k = 0; k < blk->n_tensors; k++) {
			const arena_tensor *t = &l->tensors[l->order[blk->first + k]];
			for (uint32_t c = 0; c < (t->subclass ? t->n_comp : 1); c++) {
				const arena_st_tensor *s = t->subclass ? t->comp_src[c] : t->src;
				uint32_t i = s ? src_index(w, s) : UINT32_MAX;
				if (i >= ns || w->src_block[i] != UINT32_MAX)
					return arena_errorf(ARENA_E_INTERNAL, "tensor '%s': its source is not one of the header's, once",
							    arena_q(t->name));
				w->src_block[i] = (uint32_t)b;
				w->blk_src[n++] = i;
			}
		}
		w->blk_n[b] = (uint32_t)(n - w->blk_first[b]);
	}
	for (size_t i = 0; i < ns; i++)
		if (w->src_block[i] == UINT32_MAX)
			return arena_errorf(ARENA_E_INTERNAL, "tensor '%s' is in no block", arena_q(w->f->tensors[i].name));
	return 0;
}

int arena_writer_open(const char *out, const char *header, const char *label, const arena_convert_options *opt,
		      arena_writer **wp)
{
	static const arena_convert_options none;
	const arena_convert_options *o = opt ? opt : &none;
	if (!wp)
		return arena_errorf(ARENA_E_USAGE, "arena_writer_open: no place for the writer given");
	*wp = NULL;
	if (!out || !*out)
		return arena_errorf(ARENA_E_USAGE, "arena_writer_open: no output given");
	if (!header)
		return arena_errorf(ARENA_E_USAGE, "arena_writer_open: no header given");
	if (!label || !*label)
		return arena_errorf(ARENA_E_USAGE, "arena_writer_open: no label given (the source's name)");
	if (o->progress)
		return arena_errorf(ARENA_E_USAGE, "arena_writer_open: progress is not called by a writer (its puts are "
						   "the caller's progress): leave it NULL");
	arena_convert_opts co;
	int rc = arena_conv_public_opts(o, "arena_writer_open", &co);
	if (rc)
		return rc;
	arena_writer *w = arena_calloc(1, sizeof(*w));
	if (!w)
		return arena_errorf(ARENA_E_NOMEM, "out of memory");
	arena_st_file *f;
	if ((rc = arena_st_parse_header(header, strlen(header), label, &f)) || (rc = arena_ckpt_of_file(f, &w->ck))) {
		writer_free(w);
		return rc;
	}
	w->f = w->ck->files[0];
	if ((rc = arena_conv_setup(&w->j, w->ck, out, &co))) {
		writer_free(w);
		return rc;
	}
	const arena_layout *l = w->j.l;
	for (size_t i = 0; !rc && i < l->n_tensors; i++)
		if (w->j.qs.plans && w->j.qs.plans[i].prequantized)
			rc = arena_errorf(ARENA_E_USAGE,
					  "%s: tensor '%s' is stored quantized already (with its scale): a writer takes "
					  "tensors to store as they are or to quantize; convert such a checkpoint with "
					  "arena convert",
					  label, arena_q(l->tensors[i].name));
	if (!rc)
		rc = index_blocks(w);
	if (!rc) {
		w->j.carry = arena_malloc(w->j.h.chunk_size);
		if (!w->j.carry)
			rc = arena_errorf(ARENA_E_NOMEM, "out of memory for a %llu-byte chunk",
					  (unsigned long long)w->j.h.chunk_size);
	}
	w->j.mem = w->mem;
	if (rc) {
		writer_free(w);
		return rc;
	}
	*wp = w;
	return 0;
}

size_t arena_writer_block_count(const arena_writer *w)
{
	return w ? w->j.l->n_blocks : 0;
}

const char *arena_writer_block_name(const arena_writer *w, size_t i)
{
	return w && i < w->j.l->n_blocks ? w->j.l->blocks[i].name : NULL;
}

size_t arena_writer_block_tensors(const arena_writer *w, size_t i)
{
	return w && i < w->j.l->n_blocks ? w->blk_n[i] : 0;
}

const char *arena_writer_tensor_name(const arena_writer *w, size_t i, size_t k)
{
	if (!w || i >= w->j.l->n_blocks || k >= w->blk_n[i])
		return NULL;
	return w->f->tensors[w->blk_src[w->blk_first[i] + k]].name;
}

/* The first source of block b not given yet. */
static const char *first_missing(const arena_writer *w, size_t b)
{
	for (uint32_t k = 0; k < w->blk_n[b]; k++) {
		uint32_t i = w->blk_src[w->blk_first[b] + k];
		if (!w->put[i])
			return w->f->tensors[i].name;
	}
	return "?";
}

/* Write every complete block from w->cur on: their quantized tensors get
 * their bytes (and the whole-tensor pass), the chunks that end before the
 * next block not complete are written, the start of the one that runs on
 * is kept in the carry. */
static int write_ready(arena_writer *w)
{
	arena_conv_job *j = &w->j;
	const arena_layout *l = j->l;
	const size_t from = w->cur;
	int rc = 0;
	while (!rc && w->cur < l->n_blocks && w->blk_got[w->cur] == w->blk_n[w->cur]) {
		const arena_block *blk = &l->blocks[w->cur];
		for (uint32_t k = 0; !rc && k < blk->n_tensors; k++) {
			const uint32_t ti = l->order[blk->first + k];
			const arena_tensor *t = &l->tensors[ti];
			if (!strcmp(t->scheme, "none") || t->subclass)
				continue;
			j->qs.in[ti].data = w->mem[src_index(w, t->src)];
			if (arena_quant_scan_needed(&j->qs.plans[ti]))
				rc = arena_quant_scan(&j->qs.plans[ti], &j->qs.in[ti], j->threads);
		}
		w->cur++;
	}
	if (rc)
		return rc;
	const arena_img_header *h = &j->h;
	const uint64_t avail = w->cur < l->n_blocks ? l->blocks[w->cur].offset : h->data_length;
	const uint64_t complete = avail >= h->data_length ? h->chunk_count : avail / h->chunk_size;
	if ((rc = arena_conv_run(j, w->chunks_done, complete)))
		return rc;
	if (avail < h->data_length && avail % h->chunk_size) { /* the chunk that runs on: its start kept */
		const uint64_t c0 = avail / h->chunk_size * h->chunk_size;
		if ((rc = arena_conv_fill(j, c0, avail - c0, j->carry)))
			return rc;
	}
	j->lo = avail;
	w->chunks_done = complete;
	/* The blocks written: their bytes are the caller's again. */
	for (size_t b = from; b < w->cur; b++)
		for (uint32_t k = 0; k < w->blk_n[b]; k++)
			w->mem[w->blk_src[w->blk_first[b] + k]] = NULL;
	for (size_t b = from; b < w->cur; b++) {
		const arena_block *blk = &l->blocks[b];
		for (uint32_t k = 0; k < blk->n_tensors; k++)
			j->qs.in[l->order[blk->first + k]].data = NULL;
	}
	return 0;
}

int arena_writer_put(arena_writer *w, const char *name, const void *data, uint64_t nbytes)
{
	if (!w)
		return arena_errorf(ARENA_E_USAGE, "arena_writer_put: no writer");
	if (w->failed)
		return failed_before(w);
	const char *label = w->f->path;
	if (!name)
		return fail(w, arena_errorf(ARENA_E_USAGE, "arena_writer_put: no tensor name"));
	const arena_st_tensor *s = arena_st_find(w->f, name);
	if (!s)
		return fail(w, arena_errorf(ARENA_E_USAGE, "%s: '%s' is no tensor of the header", label, arena_q(name)));
	const uint32_t i = src_index(w, s);
	if (w->put[i])
		return fail(w, arena_errorf(ARENA_E_USAGE, "%s: tensor '%s' was put already", label, arena_q(name)));
	if (nbytes != s->nbytes)
		return fail(w, arena_errorf(ARENA_E_USAGE, "%s: tensor '%s' is %llu bytes (%s), not the %llu given", label,
					    arena_q(name), (unsigned long long)s->nbytes, arena_dtype_name(s->dtype),
					    (unsigned long long)nbytes));
	if (!data && nbytes)
		return fail(w, arena_errorf(ARENA_E_USAGE, "%s: tensor '%s': no bytes given", label, arena_q(name)));
	const uint32_t b = w->src_block[i];
	if (b != w->cur) /* (b < cur: all of its sources were put) */
		return fail(w, arena_errorf(ARENA_E_USAGE,
					    "%s: tensor '%s' is in block '%s', after block '%s', whose '%s' is not put "
					    "yet: put each block's tensors before the next block's (arena_writer_block_*)",
					    label, arena_q(name), w->j.l->blocks[b].name, w->j.l->blocks[w->cur].name,
					    arena_q(first_missing(w, w->cur))));
	w->mem[i] = data;
	w->put[i] = 1;
	if (++w->blk_got[b] == w->blk_n[b]) {
		int rc = write_ready(w);
		if (rc)
			return fail(w, rc);
	}
	return 0;
}

int arena_writer_finish(arena_writer *w, arena_convert_info *info)
{
	if (info)
		memset(info, 0, sizeof(*info));
	if (!w)
		return arena_errorf(ARENA_E_USAGE, "arena_writer_finish: no writer");
	int rc;
	if (w->failed) {
		rc = failed_before(w);
	} else if (w->cur < w->j.l->n_blocks) {
		rc = arena_errorf(ARENA_E_USAGE, "%s: block '%s' is not complete ('%s' is not put): nothing was written",
				  w->f->path, w->j.l->blocks[w->cur].name, arena_q(first_missing(w, w->cur)));
	} else {
		arena_convert_result r;
		rc = arena_conv_commit(&w->j, &r);
		if (!rc && info)
			*info = arena_conv_info(&r);
	}
	writer_free(w);
	return rc;
}

void arena_writer_abort(arena_writer *w)
{
	writer_free(w);
}
