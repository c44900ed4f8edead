/* export.h - arena image -> standard safetensors file.
 *
 * Names, dtypes, shapes and metadata are the original ones; unquantized
 * tensors' bytes are identical to the source. A quantized tensor is written
 * in the compressed-tensors convention: its main component ("data" or
 * "qdata") under the tensor's name, every other component under
 * "<name>_<component>" (so "x.weight" + "x.weight_scale"). The image's data
 * is verified before anything is written; the output appears whole or not at
 * all, and may not be the image (OUTPUT_IS_INPUT). */
#ifndef ARENA_CONVERT_EXPORT_H
#define ARENA_CONVERT_EXPORT_H

#include <stdint.h>

typedef struct arena_export_result {
	unsigned long long tensors, data_bytes, file_size;
} arena_export_result;

/* Export `image` to `out`, replacing a file there. `threads` for
 * verification (0 = CPUs). `res` may be NULL. */
int arena_export(const char *image, const char *out, unsigned threads, arena_export_result *res);
/* The same, reporting progress over both passes (verifying the image's
 * stored bytes, then writing the tensors' bytes): done of total, from the
 * verifying threads, then from the calling thread. A file at `out` is
 * replaced with `force`; without, it is OUTPUT_EXISTS, said before the
 * image is verified. */
typedef void (*arena_export_progress_fn)(void *ctx, uint64_t done, uint64_t total);
int arena_export_progress(const char *image, const char *out, unsigned threads, arena_export_result *res,
			  arena_export_progress_fn progress, void *pctx, int force);

#endif
