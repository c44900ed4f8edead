/* convert.h - safetensors checkpoint -> arena image, streaming.
 *
 * Memory stays bounded (threads x chunk_size, twice that when coding, three
 * times with zstd and its compression context, plus the manifest) for any
 * model size. Worker threads each build whole data
 * chunks: gather the bytes of the components the chunk covers straight from
 * the source files (pread), code it (when asked), checksum it and write it
 * at its final offset (in a coded image, chunks take their offsets in chunk
 * order as they finish). The image goes through common/outfile.h and appears
 * at OUT only when whole; any failure (or a kill) leaves nothing. An OUT that
 * is one of the inputs (a file of the checkpoint or an index it read, by any
 * name) is OUTPUT_IS_INPUT, before anything is written. */
#ifndef ARENA_CONVERT_CONVERT_H
#define ARENA_CONVERT_CONVERT_H

#include <signal.h>
#include <stdint.h>

#include "plan.h"
#include "quant_select.h"

typedef struct arena_convert_opts {
	arena_plan_opts plan;
	uint64_t chunk_size; /* 0 = ARENA_IMG_DEFAULT_CHUNK */
	unsigned threads;    /* 0 = number of CPUs */
	/* Called from the calling thread about 4 times a second, and once at the end. */
	void (*progress)(void *ctx, uint64_t done, uint64_t total);
	void *progress_ctx;
	volatile sig_atomic_t *cancel; /* non-zero: stop with CANCELLED */
	/* Quantization (convert/quant_select.h). Compressed-tensors pairs in the
	 * input are recognized whatever this says. plan.choose must be NULL. */
	arena_quant_opts quant;
	/* Chunk codec (formats/codec.h): ARENA_CODEC_NONE (0, the default),
	 * ARENA_CODEC_HB4 or ARENA_CODEC_ZSTD, which code each chunk where that
	 * saves a page of the file and pack the chunks (a coded image, format
	 * 1.1 for hb4, 1.2 for zstd). */
	unsigned codec;
	int zstd_level; /* 1..ARENA_ZSTD_MAX_LEVEL; 0 = ARENA_ZSTD_DEFAULT_LEVEL */
	/* 1: a file at the output is replaced; 0: it is OUTPUT_EXISTS, said
	 * before anything is read past the inputs' headers. */
	int force;
	int read_back; /* 1: each chunk read back after its write and compared (arena_outfile_check) */
} arena_convert_opts;

/* Summary of a finished conversion. */
typedef struct arena_convert_result {
	uint64_t file_size, data_bytes, payload_bytes;
	uint64_t stored_bytes, coded_chunks; /* data bytes in the file; chunks stored with a codec */
	size_t n_blocks, n_tensors;
	uint64_t chunk_count;
} arena_convert_result;

/* Convert the checkpoint made of `inputs` (see arena_ckpt_open_many) into the
 * image `out`. `res` may be NULL. */
int arena_convert_inputs(const char *const *inputs, size_t n_inputs, const char *out, const arena_convert_opts *opts,
		  arena_convert_result *res);

/* Same, from an open checkpoint. */
int arena_convert_ckpt(const arena_ckpt *ck, const char *out, const arena_convert_opts *opts,
		       arena_convert_result *res);

#endif
