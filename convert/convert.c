/* convert.c - write an arena image from a checkpoint (see convert.h). */
#include "convert.h"

#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "../common/hash.h"
#include "convert_int.h"

#include "../common/alloc.h"
#include "../common/err.h"
#include "../common/firsterr.h"
#include "../common/io.h"
#include "../common/outfile.h"
#include "../formats/codec.h"
#include "../formats/image.h"
#include "arena.h"

typedef arena_conv_job job;
typedef arena_conv_extent extent;

/* Fail the job and wake the workers waiting for their place. */
static void job_fail(job *j, int rc)
{
	arena_first_error_set(&j->err, rc);
	pthread_mutex_lock(&j->mu);
	pthread_cond_broadcast(&j->cv);
	pthread_mutex_unlock(&j->mu);
}

/* Chunk i's stored offset, once chunk i-1 has taken its own; UINT64_MAX
 * when the job failed meanwhile. */
static uint64_t place(job *j, uint64_t i, uint64_t wlen)
{
	uint64_t off = UINT64_MAX;
	pthread_mutex_lock(&j->mu);
	while (j->next_place != i && !arena_first_error_get(&j->err))
		pthread_cond_wait(&j->cv, &j->mu);
	if (j->next_place == i) {
		off = j->stored_at;
		j->stored_at += wlen;
		j->next_place++;
		pthread_cond_broadcast(&j->cv);
	}
	pthread_mutex_unlock(&j->mu);
	return off;
}

static int cmp_extent(const void *a, const void *b)
{
	const extent *x = a, *y = b;
	return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* The first extent that ends after data byte c0 (n_ext: none). */
static size_t first_extent(const job *j, uint64_t c0)
{
	size_t lo = 0, hi = j->n_ext;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (j->ext[mid].begin + j->ext[mid].bytes <= c0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* Bytes [off, off+len) of source tensor s: from memory (writer.c) or the file. */
static int read_source(const job *j, const arena_st_tensor *s, uint64_t off, uint64_t len, uint8_t *dst)
{
	if (j->mem) {
		memcpy(dst, j->mem[s - s->file->tensors] + off, len);
		return 0;
	}
	return arena_pread_full(s->file->fd, dst, len, s->file->data_off + s->begin + off, s->file->path);
}

/* Fill buf with data bytes [c0, c0+len). */
static int fill_range(job *j, uint64_t c0, uint64_t len, uint8_t *buf)
{
	uint64_t done = c0; /* bytes before this are written; gaps are zeroed as they come */
	const size_t lo = first_extent(j, c0);
	for (size_t k = lo; k < j->n_ext && j->ext[k].begin < c0 + len; k++) {
		const extent *e = &j->ext[k];
		uint64_t a = e->begin > c0 ? e->begin : c0;
		uint64_t z = e->begin + e->bytes < c0 + len ? e->begin + e->bytes : c0 + len;
		if (z <= a)
			continue;
		uint64_t off = a - e->begin; /* within the component */
		uint8_t *dst = buf + (a - c0);
		int rc;
		if (a > done)
			memset(buf + (done - c0), 0, a - done); /* padding */
		done = z;
		if (!strcmp(e->t->scheme, "none") || !strcmp(e->t->scheme, ARENA_SCHEME_SUBCLASS)) {
			/* as is: the tensor's bytes, or a subclass's inner tensor's */
			const arena_st_tensor *s = e->t->comp_src[e->comp] ? e->t->comp_src[e->comp] : e->t->src;
			rc = read_source(j, s, off, z - a, dst);
		} else {
			rc = arena_quant_state_fill(&j->qs, j->l, e->t, e->comp, off, z - a, dst);
		}
		if (rc)
			return rc;
	}
	if (c0 + len > done)
		memset(buf + (done - c0), 0, c0 + len - done);
	return 0;
}

/* Fill buf with data bytes [c0, c0+len): those below j->lo from the carry
 * (the part of this chunk an earlier block's write kept), the rest from
 * the sources. */
static int fill_chunk(job *j, uint64_t c0, uint64_t len, uint8_t *buf)
{
	if (c0 >= j->lo)
		return fill_range(j, c0, len, buf);
	const uint64_t head = j->lo - c0;
	if (buf != j->carry)
		memcpy(buf, j->carry, head);
	return fill_range(j, j->lo, len - head, buf + head);
}

int arena_conv_fill(job *j, uint64_t c0, uint64_t len, uint8_t *buf)
{
	return fill_chunk(j, c0, len, buf);
}

/* The element width of data bytes [c0, c0+len) for zstd: the width of the
 * dtype most of its component bytes have (padding alone: 1). */
static unsigned chunk_width(const job *j, uint64_t c0, uint64_t len)
{
	uint64_t by[9] = {0};
	const size_t lo = first_extent(j, c0);
	for (size_t k = lo; k < j->n_ext && j->ext[k].begin < c0 + len; k++) {
		const extent *e = &j->ext[k];
		uint64_t a = e->begin > c0 ? e->begin : c0;
		uint64_t z = e->begin + e->bytes < c0 + len ? e->begin + e->bytes : c0 + len;
		arena_dtype dt = e->t->comp[e->comp].dtype;
		unsigned bits = dt == ARENA_DTYPE_C64 ? 32 : arena_dtype_bits(dt); /* complex64: two f32 */
		if (z > a)
			by[arena_zstd_width_for_bits(bits)] += z - a;
	}
	unsigned best = 1;
	for (unsigned w = 2; w <= 8; w *= 2)
		if (by[w] > by[best])
			best = w;
	return best;
}

static void *worker(void *arg)
{
	job *j = arg;
	const arena_img_header *h = &j->h;
	const arena_convert_opts *o = &j->o;
	const int coded = !!(h->flags & ARENA_IMG_FLAG_CODED);
	uint8_t *buf = arena_aligned_alloc(4096, h->chunk_size); /* for O_DIRECT writes */
	uint8_t *enc = coded ? arena_aligned_alloc(4096, h->chunk_size) : NULL;
	uint8_t *back = o->read_back ? arena_aligned_alloc(4096, h->chunk_size) : NULL; /* what the disk kept */
	arena_zstd_work zw = {0};
	if (!buf || (coded && !enc) || (o->read_back && !back)) {
		arena_free(buf);
		buf = NULL;
		arena_errorf(ARENA_E_NOMEM, "out of memory for a %llu-byte chunk buffer", (unsigned long long)h->chunk_size);
		job_fail(j, ARENA_E_NOMEM);
	}
	while (buf && !arena_first_error_get(&j->err)) {
		if (o->cancel && *o->cancel) {
			arena_errorf(ARENA_E_CANCELLED, "%s: cancelled", j->out->path);
			job_fail(j, ARENA_E_CANCELLED);
			break;
		}
		uint64_t i = atomic_fetch_add(&j->next, 1);
		if (i >= j->end)
			break;
		uint64_t c0 = i * h->chunk_size;
		uint64_t len = h->data_length - c0 < h->chunk_size ? h->data_length - c0 : h->chunk_size;
		int rc = fill_chunk(j, c0, len, buf);
		if (!rc && !coded) {
			j->chunks[i] = (arena_img_chunk){.offset = c0,
							 .stored_length = (uint32_t)len,
							 .raw_length = (uint32_t)len,
							 .xxh3 = arena_xxh3(buf, len)};
			rc = arena_outfile_pwrite_direct(j->out, buf, len, h->data_offset + c0);
			if (!rc && back)
				rc = arena_outfile_check(j->out, back, buf, len, h->data_offset + c0);
		} else if (!rc) {
			uint64_t n = 0;
			if (o->codec == ARENA_CODEC_HB4)
				n = arena_hb4_encode(buf, len, enc);
			else
				rc = arena_zstd_encode(&zw, buf, len, chunk_width(j, c0, len), o->zstd_level, enc, &n);
			if (rc) {
				job_fail(j, rc);
				break;
			}
			if (arena_align_up(n, 4096) >= len)
				n = 0; /* saves no page of the file: store it as is */
			const uint8_t *out = n ? enc : buf;
			uint64_t stored = n ? n : len, wlen = arena_align_up(stored, 4096);
			memset(enc + stored, 0, wlen - stored); /* zero to the next page (when coded) */
			uint64_t off = place(j, i, wlen);
			if (off == UINT64_MAX)
				break; /* another worker failed */
			j->chunks[i] = (arena_img_chunk){.offset = off,
							 .stored_length = (uint32_t)stored,
							 .raw_length = (uint32_t)len,
							 .xxh3 = arena_xxh3(out, stored),
							 .codec = n ? (uint16_t)o->codec : ARENA_CODEC_NONE};
			if (n)
				atomic_fetch_add(&j->coded, 1);
			rc = arena_outfile_pwrite_direct(j->out, out, wlen, h->data_offset + off);
			if (!rc && back)
				rc = arena_outfile_check(j->out, back, out, wlen, h->data_offset + off);
		}
		if (rc) {
			job_fail(j, rc);
			break;
		}
		atomic_fetch_add(&j->done_bytes, len);
	}
	arena_free(buf);
	arena_free(enc);
	arena_free(back);
	arena_zstd_work_free(&zw);
	atomic_fetch_sub(&j->running, 1);
	return NULL;
}

static unsigned cpu_count(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	return n < 1 ? 1 : n > 64 ? 64 : (unsigned)n;
}

/* Sources and merged metadata for the manifest. */
static int build_sources(const arena_ckpt *ck, json_t **sources, json_t **meta)
{
	*sources = json_array();
	*meta = json_object();
	int fail = !*sources || !*meta;
	for (size_t i = 0; i < ck->n_files && !fail; i++) {
		const arena_st_file *f = ck->files[i];
		json_t *m = json_object();
		for (size_t k = 0; m && k < f->n_meta; k++) {
			if (json_object_set_new(m, f->meta_keys[k], json_string(f->meta_vals[k])))
				fail = 1;
			if (!json_object_get(*meta, f->meta_keys[k]) &&
			    json_object_set_new(*meta, f->meta_keys[k], json_string(f->meta_vals[k])))
				fail = 1;
		}
		json_t *o = m ? json_pack("{s:s,s:I,s:o}", "path", f->path, "size", (json_int_t)f->size, "metadata", m)
			      : NULL;
		if (!o || json_array_append_new(*sources, o))
			fail = 1;
	}
	if (fail) {
		json_decref(*sources);
		json_decref(*meta);
		*sources = *meta = NULL;
		return arena_errorf(ARENA_E_NOMEM, "out of memory describing the sources");
	}
	return 0;
}

/* The output is none of the inputs: no file of the checkpoint, no index. */
static int check_not_input(const arena_ckpt *ck, const char *out)
{
	int rc = 0;
	for (size_t i = 0; !rc && i < ck->n_indexes; i++)
		rc = arena_outfile_check_input_id(out, ck->indexes[i].dev, ck->indexes[i].ino, ck->indexes[i].path);
	for (size_t i = 0; !rc && i < ck->n_files; i++)
		if (ck->files[i]->fd >= 0)
			rc = arena_outfile_check_input(out, ck->files[i]->fd, ck->files[i]->path);
	return rc;
}

int arena_conv_setup(job *j, const arena_ckpt *ck, const char *out, const arena_convert_opts *opts)
{
	static const arena_convert_opts defaults = {0};
	memset(j, 0, sizeof(*j));
	arena_first_error_init(&j->err);
	pthread_mutex_init(&j->mu, NULL);
	pthread_cond_init(&j->cv, NULL);
	j->set_up = 1;
	j->ck = ck;
	j->o = opts ? *opts : defaults;
	const arena_convert_opts *o = &j->o;
	uint64_t cs = o->chunk_size ? o->chunk_size : ARENA_IMG_DEFAULT_CHUNK;
	if (!arena_codec_name(o->codec))
		return arena_errorf(ARENA_E_USAGE, "unknown chunk codec %u", o->codec);
	if (o->zstd_level < 0 || o->zstd_level > ARENA_ZSTD_MAX_LEVEL)
		return arena_errorf(ARENA_E_USAGE, "zstd level %d is not from 1 to %d", o->zstd_level, ARENA_ZSTD_MAX_LEVEL);
	if (cs < ARENA_IMG_MIN_CHUNK || cs > ARENA_IMG_MAX_CHUNK || (cs & (cs - 1)))
		return arena_errorf(ARENA_E_USAGE, "chunk size %llu is not a power of two from 64 KiB to 1 GiB",
				    (unsigned long long)cs);
	if (check_not_input(ck, out))
		return ARENA_E(OUTPUT_IS_INPUT);
	int rc = o->force ? 0 : arena_outfile_check_new(out);
	if (rc)
		return rc;
	json_t *sources = NULL, *meta = NULL;
	arena_plan_opts *po = &j->o.plan;
	if ((rc = arena_subclass_find(ck, &j->sub)))
		return rc;
	if ((rc = arena_quant_select_init(&j->qc, &o->quant, po)))
		return rc;
	j->qc.sub = &j->sub;
	if ((rc = arena_plan_build(ck, po, &j->l)))
		return rc;
	const arena_layout *l = j->l;
	int subclass = 0; /* format 1.3: torch-subclass tensors */
	for (size_t i = 0; i < l->n_tensors; i++)
		subclass |= l->tensors[i].subclass != NULL;
	rc = arena_quant_select_finish(&j->qc);
	if (!rc)
		rc = arena_quant_state_init(&j->qs, l, ck);
	if (!rc)
		rc = build_sources(ck, &sources, &meta);
	if (!rc)
		rc = arena_img_manifest_build(l, sources, meta, cs,
					      subclass ? 3 : o->codec == ARENA_CODEC_ZSTD ? 2 : o->codec ? 1 : 0,
					      &j->manifest, &j->mlen);
	json_decref(sources);
	json_decref(meta);
	if (rc)
		return rc;
	arena_img_header *h = &j->h;
	arena_img_header_plan(h, j->mlen, l->data_length, cs);
	if (o->codec == ARENA_CODEC_HB4)
		arena_img_header_set_coded(h);
	else if (o->codec == ARENA_CODEC_ZSTD)
		arena_img_header_set_zstd(h);
	if (subclass)
		arena_img_header_set_subclass(h);

	size_t n_ext = 0;
	for (size_t i = 0; i < l->n_tensors; i++)
		n_ext += l->tensors[i].n_comp;
	j->ext = arena_calloc(n_ext, sizeof(*j->ext));
	j->chunks = arena_calloc(h->chunk_count, sizeof(*j->chunks));
	if (!j->ext || !j->chunks)
		return arena_errorf(ARENA_E_NOMEM, "out of memory planning %llu chunks", (unsigned long long)h->chunk_count);
	n_ext = 0;
	for (size_t i = 0; i < l->n_tensors; i++) {
		const arena_tensor *t = &l->tensors[i];
		for (uint32_t c = 0; c < t->n_comp; c++)
			if (t->comp[c].bytes)
				j->ext[n_ext++] = (extent){l->blocks[t->block].offset + t->comp[c].offset, t->comp[c].bytes, t, c};
	}
	j->n_ext = n_ext;
	qsort(j->ext, n_ext, sizeof(*j->ext), cmp_extent);
	j->threads = o->threads ? o->threads : cpu_count();
	/* A full disk is reported before anything is written. A coded image's
	 * size is not known in advance: the raw size (its most) is reserved
	 * where the disk has room for it, so that the workers' O_DIRECT writes
	 * land inside the file, not past its end (a write that extends a file
	 * takes the inode's lock alone and waits for its I/O on ext4, which
	 * would put one write in flight at a time), and the file is cut to its
	 * length at the end; a disk without that room is reported when a write
	 * fails. */
	if ((rc = arena_outfile_create(out, o->force ? 0 : ARENA_OUTFILE_NEW, &j->out)))
		return rc;
	if (!o->codec)
		rc = arena_outfile_reserve(j->out, h->file_size);
	else if (arena_outfile_reserve(j->out, h->data_offset + h->data_length))
		arena_error_clear();
	return rc;
}

int arena_conv_run(job *j, uint64_t from, uint64_t to)
{
	if (from >= to)
		return 0;
	const arena_convert_opts *o = &j->o;
	unsigned threads = j->threads;
	if (threads > to - from)
		threads = (unsigned)(to - from);
	pthread_t *tid = arena_calloc(threads, sizeof(*tid));
	if (!tid)
		return arena_errorf(ARENA_E_NOMEM, "out of memory for %u threads", threads);
	atomic_store(&j->next, from);
	j->end = to;
	atomic_store(&j->running, threads);
	unsigned started = 0;
	for (; started < threads; started++)
		if (pthread_create(&tid[started], NULL, worker, j))
			break;
	atomic_fetch_sub(&j->running, threads - started);
	if (started == 0) {
		atomic_fetch_add(&j->running, 1);
		worker(j);
	}
	for (unsigned tick = 0; atomic_load(&j->running) > 0; tick++) {
		if (o->progress && tick % 50 == 49)
			o->progress(o->progress_ctx, atomic_load(&j->done_bytes), j->h.data_length);
		struct timespec ts = {0, 5 * 1000 * 1000};
		nanosleep(&ts, NULL);
	}
	for (unsigned i = 0; i < started; i++)
		pthread_join(tid[i], NULL);
	arena_free(tid);
	int rc = arena_first_error_raise(&j->err);
	if (!rc && o->cancel && *o->cancel)
		rc = arena_errorf(ARENA_E_CANCELLED, "%s: cancelled", j->out->path);
	return rc;
}

int arena_conv_commit(job *j, arena_convert_result *res)
{
	arena_img_header *h = &j->h;
	int rc;
	if (h->flags & ARENA_IMG_FLAG_CODED) { /* the file ends where the last chunk's page does */
		arena_img_header_set_stored(h, j->stored_at);
		if ((rc = arena_outfile_truncate(j->out, h->file_size)))
			return rc;
	}
	/* Chunk table, manifest, header; then rename into place. */
	uint8_t *table = arena_calloc(1, h->chunk_table_length);
	if (!table)
		return arena_errorf(ARENA_E_NOMEM, "out of memory for the chunk table");
	for (uint64_t i = 0; i < h->chunk_count; i++)
		arena_img_chunk_encode(&j->chunks[i], table + i * ARENA_IMG_CHUNK_ENTRY);
	h->chunk_table_xxh3 = arena_xxh3(table, h->chunk_table_length);
	h->manifest_xxh3 = arena_xxh3(j->manifest, j->mlen);
	rc = arena_outfile_pwrite(j->out, table, h->chunk_table_length, h->chunk_table_offset);
	arena_free(table);
	if (rc || (rc = arena_outfile_pwrite(j->out, j->manifest, j->mlen, h->manifest_offset)))
		return rc;
	uint8_t page[ARENA_IMG_HEADER_SIZE];
	arena_img_header_encode(h, page);
	if ((rc = arena_outfile_pwrite(j->out, page, sizeof(page), 0)))
		return rc;
	rc = arena_outfile_commit(j->out);
	j->out = NULL;
	if (rc)
		return rc;
	if (j->o.progress)
		j->o.progress(j->o.progress_ctx, h->data_length, h->data_length);
	if (res) {
		res->file_size = h->file_size;
		res->data_bytes = h->data_length;
		res->stored_bytes = arena_img_stored_data(h);
		res->coded_chunks = atomic_load(&j->coded);
		res->payload_bytes = arena_layout_payload(j->l);
		res->n_blocks = j->l->n_blocks;
		res->n_tensors = j->l->n_tensors;
		res->chunk_count = h->chunk_count;
	}
	return 0;
}

void arena_conv_free(job *j)
{
	if (!j->set_up)
		return;
	arena_outfile_abort(j->out);
	arena_subclass_free(&j->sub);
	arena_quant_state_free(&j->qs);
	arena_quant_select_free(&j->qc);
	arena_first_error_destroy(&j->err);
	pthread_mutex_destroy(&j->mu);
	pthread_cond_destroy(&j->cv);
	arena_free(j->chunks);
	arena_free(j->ext);
	arena_free(j->manifest);
	arena_free(j->carry);
	arena_layout_free(j->l);
	memset(j, 0, sizeof(*j));
}

int arena_convert_ckpt(const arena_ckpt *ck, const char *out, const arena_convert_opts *opts,
		       arena_convert_result *res)
{
	job j;
	int rc = arena_conv_setup(&j, ck, out, opts);
	if (!rc)
		rc = arena_conv_run(&j, 0, j.h.chunk_count);
	if (!rc)
		rc = arena_conv_commit(&j, res);
	arena_conv_free(&j);
	return rc;
}

int arena_convert_inputs(const char *const *inputs, size_t n_inputs, const char *out, const arena_convert_opts *opts,
		  arena_convert_result *res)
{
	arena_ckpt *ck;
	int rc = arena_ckpt_open_many(inputs, n_inputs, &ck);
	if (rc)
		return rc;
	rc = arena_convert_ckpt(ck, out, opts, res);
	arena_ckpt_close(ck);
	return rc;
}

/* ---- arena_convert (arena.h): the options checked, a progress that cancels ---- */

typedef struct pub_progress {
	arena_progress_fn fn;
	void *ctx;
	volatile sig_atomic_t stop;
} pub_progress;

static void pub_progress_cb(void *c, uint64_t done, uint64_t total)
{
	pub_progress *p = c;
	if (p->fn(p->ctx, done, total))
		p->stop = 1;
}

/* n entries at v: none NULL (v may be NULL when n is 0). */
static int check_list(const char *const *v, size_t n, const char *who, const char *what)
{
	if (n && !v)
		return arena_errorf(ARENA_E_USAGE, "%s: %s is NULL with %zu entries", who, what, n);
	for (size_t i = 0; i < n; i++)
		if (!v[i])
			return arena_errorf(ARENA_E_USAGE, "%s: %s[%zu] is NULL", who, what, i);
	return 0;
}

int arena_conv_public_opts(const arena_convert_options *o, const char *who, arena_convert_opts *co)
{
	int rc, codec = 0;
	if ((rc = check_list(o->block_patterns, o->n_block_patterns, who, "block_patterns")) ||
	    (rc = check_list(o->block_order, o->n_block_order, who, "block_order")) ||
	    (rc = check_list(o->quant_include, o->n_quant_include, who, "quant_include")) ||
	    (rc = check_list(o->quant_exclude, o->n_quant_exclude, who, "quant_exclude")))
		return rc;
	const uint64_t cs = o->chunk_size;
	if (cs && (cs < (64u << 10) || cs > (1u << 30) || (cs & (cs - 1))))
		return arena_errorf(ARENA_E_USAGE, "%s: chunk_size %llu is not a power of two from 64K to 1G", who,
				    (unsigned long long)cs);
	if (o->codec && (codec = arena_codec_from_name(o->codec)) < 0)
		return arena_errorf(ARENA_E_USAGE, "%s: codec '%s' is not none, hb4 or zstd", who, arena_q(o->codec));
	if (o->zstd_level && codec != ARENA_CODEC_ZSTD)
		return arena_errorf(ARENA_E_USAGE, "%s: zstd_level is for codec zstd", who);
	if (o->zstd_level < 0 || o->zstd_level > ARENA_ZSTD_MAX_LEVEL)
		return arena_errorf(ARENA_E_USAGE, "%s: zstd_level %d is not from 1 to %d", who, o->zstd_level,
				    ARENA_ZSTD_MAX_LEVEL);
	if (o->threads > 256)
		return arena_errorf(ARENA_E_USAGE, "%s: threads %u is more than 256", who, o->threads);
	*co = (arena_convert_opts){
		.plan = {.patterns = o->block_patterns, .n_patterns = o->n_block_patterns, .order = o->block_order,
			 .n_order = o->n_block_order},
		.chunk_size = cs,
		.threads = o->threads,
		.quant = {.scheme = o->quant, .include = o->quant_include, .n_include = o->n_quant_include,
			  .exclude = o->quant_exclude, .n_exclude = o->n_quant_exclude},
		.codec = (unsigned)codec,
		.zstd_level = o->zstd_level,
		.force = o->force,
		.read_back = !!o->read_back,
	};
	return 0;
}

int arena_convert(const char *const *inputs, size_t n_inputs, const char *out, const arena_convert_options *opt,
		  arena_convert_info *info)
{
	static const arena_convert_options none;
	const arena_convert_options *o = opt ? opt : &none;
	int rc;
	if (info)
		memset(info, 0, sizeof(*info));
	if (!n_inputs)
		return arena_errorf(ARENA_E_USAGE, "arena_convert: no inputs given");
	if (!out || !*out)
		return arena_errorf(ARENA_E_USAGE, "arena_convert: no output given");
	arena_convert_opts co;
	if ((rc = check_list(inputs, n_inputs, "arena_convert", "inputs")) ||
	    (rc = arena_conv_public_opts(o, "arena_convert", &co)))
		return rc;
	pub_progress pp = {.fn = o->progress, .ctx = o->progress_ctx};
	co.progress = o->progress ? pub_progress_cb : NULL;
	co.progress_ctx = &pp;
	co.cancel = &pp.stop;
	arena_convert_result r;
	if ((rc = arena_convert_inputs(inputs, n_inputs, out, &co, &r)))
		return rc;
	if (info)
		*info = arena_conv_info(&r);
	return 0;
}

arena_convert_info arena_conv_info(const arena_convert_result *r)
{
	return (arena_convert_info){
		.file_size = r->file_size,
		.data_bytes = r->data_bytes,
		.stored_bytes = r->stored_bytes,
		.chunk_count = r->chunk_count,
		.coded_chunks = r->coded_chunks,
		.n_blocks = r->n_blocks,
		.n_tensors = r->n_tensors,
	};
}
