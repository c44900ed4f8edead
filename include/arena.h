/* arena.h - public interface of libarena: errors, checkpoints, images.
 *
 * Conventions (every function below follows them unless its contract says
 * otherwise):
 *   - Functions that can fail return 0 on success or a negative arena_err
 *     code. The one-line message for the last failure on the calling thread is
 *     available from arena_last_error() until the next failing call.
 *   - Objects are made by X_open / X_create and released by the matching
 *     X_close / X_free, which accepts NULL.
 *   - Pointers returned by accessors are borrowed: valid until the object that
 *     returned them is closed.
 */
#ifndef ARENA_H
#define ARENA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ARENA_VERSION_MAJOR 0
#define ARENA_VERSION_MINOR 1
#define ARENA_VERSION_PATCH 0
#define ARENA_VERSION_STRING "0.1.0"

/* Error classes; the CLI's exit code is the class of the error. */
enum {
	ARENA_CLASS_OK = 0,
	ARENA_CLASS_INVALID = 1, /* the input is invalid or corrupt */
	ARENA_CLASS_USAGE = 2,   /* the request is wrong (options, paths) */
	ARENA_CLASS_SYSTEM = 3,  /* I/O, out of memory, device */
};

/* The error table: X(NAME, class, short description).
 * Codes are stable once released: append, never renumber. */
#define ARENA_ERRORS(X)                                                                  \
	X(OK, OK, "success")                                                             \
	X(INTERNAL, SYSTEM, "internal error (a bug in arena)")                            \
	X(USAGE, USAGE, "invalid argument")                                               \
	X(NOMEM, SYSTEM, "out of memory")                                                 \
	X(IO, SYSTEM, "input/output error")                                               \
	X(NOT_FOUND, USAGE, "no such file or directory")                                  \
	X(NO_DEVICE, SYSTEM, "no CUDA device")                                            \
	X(CANCELLED, SYSTEM, "cancelled")                                                 \
	/* safetensors files */                                                           \
	X(ST_TOO_SHORT, INVALID, "file shorter than 8 bytes")                             \
	X(ST_HEADER_TOO_LARGE, INVALID, "header length over 100000000 bytes")             \
	X(ST_HEADER_PAST_EOF, INVALID, "header extends past the end of the file")         \
	X(ST_HEADER_UTF8, INVALID, "header is not valid UTF-8")                           \
	X(ST_HEADER_JSON, INVALID, "header is not valid JSON")                            \
	X(ST_HEADER_NOT_OBJECT, INVALID, "header is not a JSON object")                   \
	X(ST_DUPLICATE_KEY, INVALID, "duplicate key in header")                           \
	X(ST_TENSOR_NOT_OBJECT, INVALID, "tensor entry is not a JSON object")             \
	X(ST_MISSING_FIELD, INVALID, "tensor entry lacks a required field")               \
	X(ST_UNKNOWN_FIELD, INVALID, "tensor entry has an unknown field")                 \
	X(ST_BAD_DTYPE, INVALID, "dtype is not a string")                                 \
	X(ST_UNKNOWN_DTYPE, INVALID, "unknown dtype")                                     \
	X(ST_BAD_SHAPE, INVALID, "shape is not a list of non-negative integers")          \
	X(ST_BAD_OFFSETS, INVALID, "data_offsets is not two non-negative integers")       \
	X(ST_BAD_METADATA, INVALID, "__metadata__ is not a map of strings to strings")    \
	X(ST_OFFSET_START, INVALID, "tensor data does not start at offset 0")             \
	X(ST_OFFSET_REVERSED, INVALID, "data_offsets end before begin")                   \
	X(ST_OFFSET_GAP, INVALID, "gap between tensors")                                  \
	X(ST_OFFSET_OVERLAP, INVALID, "tensors overlap")                                  \
	X(ST_SIZE_OVERFLOW, INVALID, "tensor size overflows")                             \
	X(ST_PARTIAL_BYTES, INVALID, "tensor size is not a whole number of bytes")        \
	X(ST_SIZE_MISMATCH, INVALID, "data_offsets span does not match dtype and shape")  \
	X(ST_DATA_PAST_EOF, INVALID, "tensor data extends past the end of the file")      \
	X(ST_TRAILING_BYTES, INVALID, "bytes after the last tensor")                      \
	/* sharded checkpoints (model.safetensors.index.json) */                          \
	X(IDX_JSON, INVALID, "index is not valid JSON")                                   \
	X(IDX_BAD, INVALID, "index has no valid weight_map")                              \
	X(IDX_BAD_SHARD_NAME, INVALID, "shard name is not a plain file name")             \
	X(IDX_SHARD_MISSING, INVALID, "shard named by the index is missing")              \
	X(IDX_TENSOR_MISSING, INVALID, "tensor named by the index is not in its shard")   \
	X(IDX_TENSOR_UNLISTED, INVALID, "shard holds a tensor the index does not name")   \
	X(DUPLICATE_TENSOR, INVALID, "tensor defined twice")                              \
	X(NO_CHECKPOINT, INVALID, "no safetensors checkpoint at this path")              \
	/* arena images (docs/FORMAT.md) */                                               \
	X(IMG_TRUNCATED, INVALID, "image is truncated")                                   \
	X(IMG_SIZE, INVALID, "image is longer than its header says")                      \
	X(IMG_MAGIC, INVALID, "not an arena image (bad magic)")                           \
	X(IMG_HEADER_CHECKSUM, INVALID, "image header checksum mismatch")                 \
	X(IMG_VERSION, INVALID, "unsupported image major version")                        \
	X(IMG_FLAGS, INVALID, "image requires a feature this reader lacks")               \
	X(IMG_HEADER_BAD, INVALID, "image header fields are inconsistent")                \
	X(IMG_MANIFEST_CHECKSUM, INVALID, "image manifest checksum mismatch")             \
	X(IMG_MANIFEST_BAD, INVALID, "image manifest is malformed")                       \
	X(IMG_SLAB_BAD, INVALID, "block slab overlaps another or lies outside the data")  \
	X(IMG_TENSOR_BAD, INVALID, "tensor lies outside its slab or overlaps another")    \
	X(IMG_CHUNK_TABLE_CHECKSUM, INVALID, "image chunk table checksum mismatch")       \
	X(IMG_CHUNK_TABLE_BAD, INVALID, "chunk table does not match header and manifest") \
	X(IMG_CODEC, INVALID, "unknown chunk codec")                                      \
	X(IMG_CHUNK_CHECKSUM, INVALID, "data chunk checksum mismatch")                     \
	/* block plans */                                                                 \
	X(PLAN_BAD_PATTERN, USAGE, "invalid block pattern")                               \
	X(PLAN_BAD_ORDER, USAGE, "invalid block order")                                   \
	X(PLAN_EMPTY, INVALID, "checkpoint has no tensors")                               \
	/* devices and budgets */                                                         \
	X(DEV_OOM, SYSTEM, "out of device memory")                                        \
	X(DEV_ERROR, SYSTEM, "device error")                                              \
	X(BUDGET, USAGE, "does not fit the memory budget")                               \
	X(PROFILE_BAD, INVALID, "compute profile file is malformed")                     \
	/* quantization (loader/quant.h) */                                               \
	X(QUANT_UNKNOWN_SCHEME, USAGE, "unknown quantization scheme")                     \
	X(QUANT_NOT_APPLICABLE, USAGE, "quantization scheme does not apply to this tensor") \
	X(IMG_CHUNK_BAD, INVALID, "coded data chunk is malformed")

typedef enum arena_err {
#define ARENA__ERR_ENUM(name, cls, desc) ARENA__ERRNUM_##name,
	ARENA_ERRORS(ARENA__ERR_ENUM)
#undef ARENA__ERR_ENUM
	ARENA__ERR_COUNT
} arena_err_index;

/* ARENA_E_<NAME> is the negative error code (ARENA_E_OK is 0). */
#define ARENA_E(name) (-(int)ARENA__ERRNUM_##name)
#define ARENA_E_OK 0
#define ARENA_E_INTERNAL ARENA_E(INTERNAL)
#define ARENA_E_USAGE ARENA_E(USAGE)
#define ARENA_E_NOMEM ARENA_E(NOMEM)
#define ARENA_E_IO ARENA_E(IO)
#define ARENA_E_NOT_FOUND ARENA_E(NOT_FOUND)
#define ARENA_E_NO_DEVICE ARENA_E(NO_DEVICE)
#define ARENA_E_CANCELLED ARENA_E(CANCELLED)

/* Name of an error code ("ST_UNKNOWN_DTYPE"); "UNKNOWN" for codes not in the table. */
const char *arena_err_name(int code);
/* Short description of an error code; never NULL. */
const char *arena_strerror(int code);
/* Class of an error code (ARENA_CLASS_*); also the CLI's exit status. */
int arena_err_class(int code);
/* One-line message of the last failure on this thread ("" if none). Borrowed:
 * valid until the next arena call on this thread. */
const char *arena_last_error(void);

/* Library version string, e.g. "0.1.0". */
const char *arena_version(void);

/* ---- arenas: a model's weights loaded into device memory --------------------
 *
 * An arena is opened from an arena image (checksums verified as the bytes
 * arrive) or a safetensors checkpoint (a file, an index.json or a folder;
 * read destination-first, optionally quantized on the way). Opening is
 * transactional: it returns a whole arena or an error and leaves nothing
 * behind. Every block goes to the device here; the residency engine (which
 * keeps only part of a model on the device) builds on the same objects. */

typedef struct arena arena;

typedef struct arena_open_options {
	const char *backend;   /* "cuda", "sim", or NULL: cuda when a GPU is usable, else sim */
	int device;            /* CUDA device number */
	uint64_t vram_cap;     /* device bytes arena may use; 0 = what is free (sim: 16 GiB) */
	uint64_t pin_budget;   /* cap on pinned host bytes; 0 = what the OS allows */
	unsigned threads;      /* reader threads; 0 = CPUs */
	const char *quant;     /* safetensors only: storage scheme for block weights, or NULL */
} arena_open_options;

/* Open `path` with `opt` (NULL = defaults). On success *out owns the arena;
 * on failure *out is NULL and arena_last_error() says why. Errors: NOT_FOUND,
 * any IMG_* / ST_* / IDX_* error of the input, DEV_OOM or BUDGET when the
 * model does not fit the device, NO_DEVICE, NOMEM, IO. */
int arena_open(const char *path, const arena_open_options *opt, arena **out);
/* Free device memory, host slabs and the backend. Accepts NULL. */
void arena_close(arena *a);

/* The backend in use: "cuda" or "sim". */
const char *arena_backend_name(const arena *a);

typedef struct arena_tensor_info {
	const char *name;       /* borrowed: valid until arena_close */
	const char *dtype;      /* original dtype ("BF16") */
	uint32_t rank;
	const uint64_t *shape;  /* original shape, rank dims */
	const char *scheme;     /* "none" or a storage scheme (docs/QUANT.md) */
	uint32_t block;         /* index of its block */
	uint32_t n_components;
	struct {
		const char *name;   /* "data", "qdata", "scale" */
		const char *dtype;
		uint32_t rank;
		const uint64_t *shape;
		uint64_t bytes;
		void *device;       /* device address (CUDA pointer on cuda) */
	} component[4];
} arena_tensor_info;

size_t arena_block_count(const arena *a);
/* Block i's name ("transformer_blocks.7"), its slab's device address and size. */
const char *arena_block_name(const arena *a, size_t i);
void *arena_block_device(const arena *a, size_t i);
uint64_t arena_block_bytes(const arena *a, size_t i);

size_t arena_tensor_count(const arena *a);
/* Tensor i (sorted by name): 0, or USAGE when i is out of range. */
int arena_tensor_get(const arena *a, size_t i, arena_tensor_info *out);
/* The index of the tensor called `name`: 0, or NOT_FOUND. */
int arena_tensor_find(const arena *a, const char *name, size_t *index);

#ifdef __cplusplus
}
#endif
#endif /* ARENA_H */
