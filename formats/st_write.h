/* st_write.h - streaming safetensors writer: declare, begin, write in order, commit.
 *
 * The file it writes (layout as in safetensors.h):
 *   [0, 8)        N: u64 LE, the header length, a multiple of 8
 *   [8, 8+N)      header: compact JSON as serde_json writes it (no spaces;
 *                 strings escape '"', '\\' and control characters only), then
 *                 spaces up to N:
 *                   {"__metadata__":{k:v,...},            (only if any was set)
 *                    "<name>":{"dtype":"BF16","shape":[..],"data_offsets":[b,e]}, ...}
 *                 metadata keys in the order they were set; tensor keys in
 *                 data order (below)
 *   [8+N, EOF)    data: every tensor's bytes back to back, no gaps
 *
 * Data order, the same as the reference library (safetensors 0.8 `prepare`):
 * by dtype, descending in its alignment order, then by name (strcmp). The
 * dtype order, largest first:
 *   U64 I64 F64 C64 F32 U32 I32 BF16 F16 U16 I16 F8_E5M2FNUZ F8_E4M3FNUZ
 *   F8_E8M0 F8_E4M3 F8_E5M2 I8 U8 F6_E3M2 F6_E2M3 F4 BOOL
 * so every tensor starts at a multiple of its element size, and a file with
 * the same tensors and metadata is byte for byte what the reference writes
 * (tests/unit/test_synth.c rewrites the reference fixtures and compares).
 *
 * Life cycle (each step returns 0 or a negative ARENA_E code; a failed meta
 * or add leaves the writer as it was; after a failed begin or write, commit
 * fails and abort is what is left; a data write after a failed one returns
 * the first failure's code and message, whichever thread it was on):
 *
 *   arena_stw_create ──► arena_stw_meta / arena_stw_add (any number, any order)
 *        ──► arena_stw_begin (header computed and written; order fixed)
 *        ──► arena_stw_write (data bytes in data order, in pieces of any size)
 *            or arena_stw_pwrite (data bytes at data offsets, from any thread)
 *        ──► arena_stw_commit (all bytes written? fsync, rename; frees)
 *   arena_stw_abort at any point: unlink the temporary, free everything.
 *
 * Output goes through common/outfile: nothing appears under the target name
 * until commit succeeds. A writer is used by one thread at a time, except
 * that several threads may call arena_stw_pwrite at once.
 */
#ifndef ARENA_FORMATS_ST_WRITE_H
#define ARENA_FORMATS_ST_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include "dtype.h"

typedef struct arena_stw arena_stw;

/* A declared tensor, as seen after arena_stw_begin. */
typedef struct arena_stw_tensor {
	const char *name;      /* owned by the writer */
	arena_dtype dtype;
	uint32_t rank;
	const uint64_t *shape; /* rank dims, owned by the writer */
	uint64_t nelem;
	uint64_t nbytes;
	uint64_t begin, end;   /* data_offsets, relative to the data section */
} arena_stw_tensor;

/* Open the temporary for `path` (the target is untouched until commit;
 * commit replaces a file there).
 * Errors: NOMEM, NOT_FOUND (no such folder), USAGE (path names a folder), IO. */
int arena_stw_create(const char *path, arena_stw **out);
/* The same with common/outfile.h's flags: ARENA_OUTFILE_NEW refuses a
 * target that exists (OUTPUT_EXISTS, now or at commit). */
int arena_stw_create_flags(const char *path, unsigned flags, arena_stw **out);

/* Add "key": "value" to __metadata__. Both are copied and must be valid
 * UTF-8; setting a key twice is USAGE. Only before begin. */
int arena_stw_meta(arena_stw *w, const char *key, const char *value);

/* Declare a tensor: name (copied; valid UTF-8, not "__metadata__", not
 * declared before), dtype, rank dims at `shape` (copied; rank 0 is a scalar,
 * shape may be NULL then). Only before begin.
 * Errors: USAGE (bad name or dtype, after begin), DUPLICATE_TENSOR,
 * ST_SIZE_OVERFLOW (element or byte count overflows 64 bits),
 * ST_PARTIAL_BYTES (a sub-byte dtype whose size is not whole bytes), NOMEM. */
int arena_stw_add(arena_stw *w, const char *name, arena_dtype dtype, uint32_t rank, const uint64_t *shape);

/* Fix the data order, build the header and write it. After it, the tensors
 * can be listed with arena_stw_count / arena_stw_get and the data is written.
 * Errors: ST_HEADER_TOO_LARGE (header over ARENA_ST_MAX_HEADER), NOMEM, IO. */
int arena_stw_begin(arena_stw *w);

/* Number of declared tensors. */
size_t arena_stw_count(const arena_stw *w);
/* The i-th tensor in data order (i < count); valid after begin, until commit
 * or abort. Borrowed. NULL before begin or when i is out of range. */
const arena_stw_tensor *arena_stw_get(const arena_stw *w, size_t i);
/* Total data bytes (sum of nbytes); valid after begin. */
uint64_t arena_stw_data_size(const arena_stw *w);
/* File offset of the data section (8 + N); valid after begin. */
uint64_t arena_stw_data_offset(const arena_stw *w);
/* Data bytes written so far (thread-safe). */
uint64_t arena_stw_written(const arena_stw *w);

/* Append n bytes of data in data order; a piece may span tensors. Small
 * pieces are gathered in a 1 MiB buffer, large ones go straight to the file.
 * Errors: USAGE (before begin, or more bytes than the tensors hold), IO. */
int arena_stw_write(arena_stw *w, const void *buf, size_t n);

/* Write n data bytes at data offset `off` (relative to the data section; a
 * tensor's bytes go at its `begin`). Safe to call from several threads at
 * once; ranges must not overlap (commit checks only the total). Not to be
 * mixed with arena_stw_write on one writer (USAGE).
 * Errors: USAGE (before begin, past the end, after a failure), IO. */
int arena_stw_pwrite(arena_stw *w, uint64_t off, const void *buf, size_t n);

/* Check that exactly data_size bytes were written (USAGE otherwise, naming
 * the first tensor left short), flush, fsync and rename over the target.
 * Called before begin, it begins first (a file of empty tensors or none).
 * Frees w in every case; on failure the temporary is removed. */
int arena_stw_commit(arena_stw *w);

/* Remove the temporary and free w. Accepts NULL. */
void arena_stw_abort(arena_stw *w);

/* Rank of a dtype in the data order (larger = earlier in the file). */
int arena_stw_dtype_rank(arena_dtype dt);

#endif
