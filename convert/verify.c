/* verify.c - arena_verify (arena.h): an image checked completely, the bad
 * chunks described, progress that can cancel. */
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "../common/alloc.h"
#include "../common/clock.h"
#include "../common/err.h"
#include "../formats/image.h"
#include "arena.h"

/* The caller's progress function, called one at a time with done rising
 * (the reader threads report out of order); once it asks to stop, every
 * later report stops the walk too. */
typedef struct vprog {
	arena_progress_fn fn;
	void *ctx;
	pthread_mutex_t mu;
	uint64_t last;
	int stop;
} vprog;

static int vprog_cb(void *c, uint64_t done, uint64_t total)
{
	vprog *p = c;
	pthread_mutex_lock(&p->mu);
	if (!p->stop && done > p->last) {
		p->last = done;
		p->stop = p->fn(p->ctx, done, total) != 0;
	}
	int stop = p->stop;
	pthread_mutex_unlock(&p->mu);
	return stop;
}

/* A bad chunk's blocks (each once, in order) and tensors. */
typedef struct cover {
	const arena_layout *l;
	const char **blocks, **tensors;
	size_t n_blocks, n_tensors, cap_blocks, cap_tensors;
	int nomem;
} cover;

static int push(const char ***v, size_t *n, size_t *cap, const char *s)
{
	if (*n == *cap) {
		size_t nc = *cap ? *cap * 2 : 16;
		const char **nv = arena_realloc(*v, nc * sizeof(*nv));
		if (!nv)
			return -1;
		*v = nv;
		*cap = nc;
	}
	(*v)[(*n)++] = s;
	return 0;
}

static void cover_fn(void *ctx, uint32_t block, int64_t tensor)
{
	cover *c = ctx;
	const char *bn = c->l->blocks[block].name;
	if (!c->n_blocks || strcmp(c->blocks[c->n_blocks - 1], bn))
		c->nomem |= push(&c->blocks, &c->n_blocks, &c->cap_blocks, bn);
	if (tensor >= 0)
		c->nomem |= push(&c->tensors, &c->n_tensors, &c->cap_tensors, c->l->tensors[tensor].name);
}

typedef struct bad_ctx {
	const arena_verify_options *o;
	cover cv;
} bad_ctx;

static void on_bad(void *ctx, const arena_image *img, uint64_t chunk, uint64_t expect, uint64_t got)
{
	bad_ctx *b = ctx;
	b->cv.n_blocks = b->cv.n_tensors = 0;
	arena_img_chunk_cover(img, chunk, cover_fn, &b->cv);
	const arena_img_chunk *ck = &img->chunks[chunk];
	arena_bad_chunk r = {
		.chunk = chunk,
		.offset = img->hdr.data_offset + ck->offset,
		.length = ck->stored_length,
		.expected = expect,
		.actual = got,
		.blocks = b->cv.blocks,
		.n_blocks = b->cv.n_blocks,
		.tensors = b->cv.tensors,
		.n_tensors = b->cv.n_tensors,
	};
	b->o->bad_chunk(b->o->bad_chunk_ctx, &r);
}

int arena_verify(const char *path, const arena_verify_options *opt, arena_verify_info *info)
{
	static const arena_verify_options none;
	const arena_verify_options *o = opt ? opt : &none;
	const double t0 = arena_now_s();
	arena_verify_info vi = {0};
	arena_image *img = NULL;
	unsigned threads = o->threads;
	int rc = 0;
	if (!path) {
		rc = arena_errorf(ARENA_E_USAGE, "arena_verify: no path given");
		goto out;
	}
	if (threads > 64) {
		rc = arena_errorf(ARENA_E_USAGE, "arena_verify: threads %u is more than 64", threads);
		goto out;
	}
	if (!threads) {
		long n = sysconf(_SC_NPROCESSORS_ONLN);
		threads = n < 1 ? 1 : n > 8 ? 8 : (unsigned)n;
	}
	if ((rc = arena_img_open(path, &img)))
		goto out;
	vi.opened = 1;
	vi.file_size = img->hdr.file_size;
	vi.chunk_count = img->hdr.chunk_count;
	vprog vp = {.fn = o->progress, .ctx = o->progress_ctx};
	pthread_mutex_init(&vp.mu, NULL);
	bad_ctx bc = {.o = o, .cv = {.l = img->layout}};
	rc = arena_img_verify_data_progress(img, threads, o->bad_chunk ? on_bad : NULL, &bc, &vi.bad_chunks,
					    o->progress ? vprog_cb : NULL, &vp);
	pthread_mutex_destroy(&vp.mu);
	arena_free(bc.cv.blocks);
	arena_free(bc.cv.tensors);
out:
	arena_img_close(img);
	vi.seconds = arena_now_s() - t0;
	if (info)
		*info = vi;
	return rc;
}
