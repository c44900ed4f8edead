/* safetensors.h - strict reader for the safetensors format.
 *
 * Byte layout (all integers little-endian):
 *   [0, 8)          N: u64, the header length
 *   [8, 8+N)        header: UTF-8 JSON object
 *                     "__metadata__": {string: string}          (optional)
 *                     "<tensor>": {"dtype": "BF16", "shape": [d0, ...],
 *                                  "data_offsets": [begin, end]}
 *   [8+N, EOF)      data: tensors back to back; offsets are relative to 8+N
 *
 * Validation happens before anything is used, in this order; each failure is
 * its own error (ARENA_E(ST_*)):
 *   TOO_SHORT, HEADER_TOO_LARGE (N > 100000000), HEADER_PAST_EOF, HEADER_UTF8,
 *   HEADER_JSON / DUPLICATE_KEY, HEADER_NOT_OBJECT; per tensor in header order:
 *   TENSOR_NOT_OBJECT, UNKNOWN_FIELD, MISSING_FIELD, BAD_DTYPE, BAD_SHAPE,
 *   BAD_OFFSETS, UNKNOWN_DTYPE; then BAD_METADATA; then, over tensors sorted
 *   by offsets: OFFSET_REVERSED, OFFSET_START, OFFSET_GAP / OFFSET_OVERLAP;
 *   then per tensor SIZE_OVERFLOW, PARTIAL_BYTES, SIZE_MISMATCH; finally
 *   DATA_PAST_EOF / TRAILING_BYTES.
 * Stricter than the reference library: duplicate keys anywhere and unknown
 * fields in a tensor entry are rejected.
 */
#ifndef ARENA_FORMATS_SAFETENSORS_H
#define ARENA_FORMATS_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "dtype.h"

#define ARENA_ST_MAX_HEADER 100000000ULL

typedef struct arena_st_file arena_st_file;

typedef struct arena_st_tensor {
	const char *name;      /* borrowed from the file */
	arena_dtype dtype;
	uint32_t rank;
	const uint64_t *shape; /* rank dims; borrowed from the file */
	uint64_t nelem;
	uint64_t nbytes;
	uint64_t begin, end;   /* data_offsets, relative to the data section */
	const arena_st_file *file;
} arena_st_tensor;

struct arena_st_file {
	char *path;              /* owned; the label used in messages */
	const uint8_t *base;     /* the whole file's bytes (mapping or caller buffer) */
	int fd;                  /* open file for pread, or -1 (parsed from memory) */
	uint64_t size;           /* bytes at base */
	uint64_t header_len;     /* N */
	uint64_t data_off;       /* 8 + N: file offset of the data section */
	size_t n_tensors;
	arena_st_tensor *tensors; /* sorted by name (strcmp) */
	size_t n_meta;
	const char **meta_keys;  /* header order */
	const char **meta_vals;
	/* private */
	void *json;              /* json_t root that owns every string above */
	uint64_t *shape_pool;
	char *name_pool;         /* the tensors' names when prefixed (arena_st_prefix) */
	int mapped;
};

/* Read the header of the file at `path` (pread: a file that shrinks
 * meanwhile is INPUT_CHANGED, never a fault) and validate it against the
 * size the file had when opened; then map the file for its tensors' bytes
 * (arena_st_data). On success *out owns the descriptor and the mapping.
 * Errors: NOT_FOUND, INPUT_NOT_READABLE (not a readable regular file: see
 * arena_open_input), INPUT_CHANGED, IO, NOMEM, or an ST_* error naming the
 * rule broken. */
int arena_st_open(const char *path, arena_st_file **out);

/* Validate `size` bytes at `buf` (borrowed: must outlive *out). `label` names
 * the input in messages. Used for fuzzing and in-memory inputs. */
int arena_st_parse(const uint8_t *buf, uint64_t size, const char *label, arena_st_file **out);

/* Validate a safetensors header alone: `json` (len bytes, the JSON a file's
 * first 8 bytes give the length of) describes a file whose data is not
 * here, as long as its data_offsets say (f->size: 8 + len + the last
 * tensor's end). Every rule of the format holds but those on the file's
 * length (DATA_PAST_EOF, TRAILING_BYTES). f->base is NULL and f->fd -1:
 * the tensors' bytes come from elsewhere (convert/writer.c). `label` names
 * it in messages. */
int arena_st_parse_header(const char *json, size_t len, const char *label, arena_st_file **out);

void arena_st_close(arena_st_file *f);

/* Name every tensor of f "<prefix><name>" from now on (a pipeline's component
 * "text_encoder." before its own names; the order by name is kept). Messages
 * about the file still name its path. Errors: NOMEM (f unchanged). */
int arena_st_prefix(arena_st_file *f, const char *prefix);

/* Binary search by name; NULL if absent. */
const arena_st_tensor *arena_st_find(const arena_st_file *f, const char *name);

/* Pointer to a tensor's bytes (nbytes of them) inside the file's bytes.
 * For an opened file they are its mapping: a page the file no longer has
 * (cut since it was opened) raises SIGBUS, so every read of them runs
 * under arena_map_guard_run (common/mapguard.h) with the file's mapping
 * (base, size), and checks the size again after (the page the new end
 * falls in reads as zeros past it). */
static inline const uint8_t *arena_st_data(const arena_st_tensor *t)
{
	return t->file->base + t->file->data_off + t->begin;
}

#endif
