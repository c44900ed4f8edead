/* convert_int.h - what convert.c (a checkpoint read from its files) and
 * writer.c (tensors handed over in block order) share: the job that turns
 * a placed layout into an image's chunks, and its three steps. Not
 * installed; the API is convert.h and arena.h.
 *
 * A job is set up from a checkpoint (plan, quantization state, manifest,
 * header, the output file created and reserved), runs ranges of chunks on
 * worker threads (each chunk filled, coded, checksummed and written at its
 * place), and is committed (chunk table, manifest, header; the file linked
 * in whole) or freed (nothing left at the output). */
#ifndef ARENA_CONVERT_CONVERT_INT_H
#define ARENA_CONVERT_CONVERT_INT_H

#include <pthread.h>
#include <stdatomic.h>

#include "../common/firsterr.h"
#include "../common/outfile.h"
#include "../formats/image.h"
#include "arena.h"
#include "convert.h"
#include "subclass.h"

/* One contiguous component in the data region. */
typedef struct arena_conv_extent {
	uint64_t begin, bytes; /* data-relative */
	const arena_tensor *t;
	uint32_t comp;
} arena_conv_extent;

typedef struct arena_conv_job {
	const arena_ckpt *ck;
	arena_layout *l;
	arena_quant_state qs;
	arena_quant_ctx qc;
	arena_subclass_set sub;
	arena_convert_opts o; /* the caller's, copied; o.plan.choose set by quantization */
	arena_img_header h;
	char *manifest;
	size_t mlen;
	arena_outfile *out;
	arena_conv_extent *ext;
	size_t n_ext;
	arena_img_chunk *chunks;
	unsigned threads;
	/* The range of chunks a run fills: next is taken by the workers, end is
	 * past the last. */
	atomic_uint_fast64_t next, done_bytes;
	uint64_t end;
	arena_first_error err;
	atomic_uint running;
	/* Coded images: chunks take stored offsets in chunk order. */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	uint64_t next_place, stored_at;
	atomic_uint_fast64_t coded;
	/* Sources in memory (writer.c) rather than read from the files: the
	 * bytes of the checkpoint's only file's tensor k (by its index in the
	 * file's tensors) at mem[k]; NULL: read from the files. Data bytes
	 * below lo come from carry (a chunk begun in a block written before;
	 * owned by the job). */
	const uint8_t **mem;
	uint64_t lo;
	uint8_t *carry;
	int set_up; /* the mutex, condition and first error are initialized */
} arena_conv_job;

/* Everything before the data: options checked, the plan, the quantization
 * state, the manifest and header, the output created (OUTPUT_EXISTS unless
 * o->force) and reserved. The job borrows ck (it must outlive the job).
 * After a failure too, arena_conv_free(j) is the caller's. */
int arena_conv_setup(arena_conv_job *j, const arena_ckpt *ck, const char *out, const arena_convert_opts *o);

/* Fill and write chunks [from, to) on the job's threads (fewer when the
 * range is short); o.progress is called from the calling thread meanwhile.
 * The first worker's error, CANCELLED (o.cancel), or 0. */
int arena_conv_run(arena_conv_job *j, uint64_t from, uint64_t to);

/* Data bytes [c0, c0+len) of the chunk starting at c0 into buf, as a
 * worker fills them (bytes below j->lo from the carry; buf may be the
 * carry itself, then only the rest is filled). */
int arena_conv_fill(arena_conv_job *j, uint64_t c0, uint64_t len, uint8_t *buf);

/* Chunk table, manifest and header written, the image linked in at the
 * output; res (may be NULL) filled. */
int arena_conv_commit(arena_conv_job *j, arena_convert_result *res);
/* The public summary of a conversion (arena.h's arena_convert_info) from its result. */
arena_convert_info arena_conv_info(const arena_convert_result *r);

/* Free the job; an output not committed is removed. */
void arena_conv_free(arena_conv_job *j);

/* The public options (arena.h) as the library's, checked: every list's
 * entries, the chunk size, codec, zstd level and threads (USAGE naming the
 * field, `who` before it). The lists and strings stay the caller's. */
int arena_conv_public_opts(const arena_convert_options *o, const char *who, arena_convert_opts *co);

#endif
