/* checkpoint.h - a safetensors checkpoint: one file, several files, or a
 * sharded set described by model.safetensors.index.json.
 *
 * Every file is fully validated (safetensors.h). Across files: a tensor
 * defined twice is DUPLICATE_TENSOR; with an index, a shard it names that is
 * missing is IDX_SHARD_MISSING, a tensor it names that its shard lacks is
 * IDX_TENSOR_MISSING, and a tensor a shard holds that it does not name is
 * IDX_TENSOR_UNLISTED.
 *
 * Paths: one named here that does not exist is NOT_FOUND (a usage error);
 * any file read that is not a readable regular file (a shard or index that
 * is a folder, FIFO, device, symlink loop, unreadable; see arena_open_input)
 * is INPUT_NOT_READABLE, like a bad input. A folder named here is searched. */
#ifndef ARENA_FORMATS_CHECKPOINT_H
#define ARENA_FORMATS_CHECKPOINT_H

#include "safetensors.h"

/* A file that was read and closed: its path (owned), st_dev and st_ino. */
typedef struct arena_ckpt_file_id {
	char *path;
	uint64_t dev, ino;
} arena_ckpt_file_id;

typedef struct arena_ckpt {
	char *index_path;         /* owned; NULL without an index */
	size_t n_indexes;
	arena_ckpt_file_id *indexes; /* every index read (one per sharded input) */
	void *index_json;         /* json_t root of the index (private) */
	const void *index_meta;   /* json_t: the index's "metadata" object, or NULL */
	size_t n_files;
	arena_st_file **files;    /* owned; in the order given (shards sorted by name) */
	size_t n_tensors;
	const arena_st_tensor **tensors; /* every tensor, sorted by name; borrowed from files */
} arena_ckpt;

/* Open PATH: a .safetensors file, an index .json, or a folder holding either
 * (an index is preferred; a folder with several .safetensors files and no
 * index is an error asking for the files to be named), or a diffusers
 * pipeline's folder (it holds model_index.json): every component named there
 * ("text_encoder": [library, class]) whose folder holds safetensors weights,
 * its tensors named "<component>.<name>" (within a component's folder the
 * weights saved without a variant are preferred:
 * diffusion_pytorch_model.safetensors over diffusion_pytorch_model.fp16.
 * safetensors); components without weights (tokenizers, schedulers) are
 * passed over; one with only pickled weights (.bin, .pt) is NO_CHECKPOINT, as
 * is a pipeline none of whose components has weights. */
int arena_ckpt_open(const char *path, arena_ckpt **out);

/* Open several inputs (each as arena_ckpt_open would) as one checkpoint. */
int arena_ckpt_open_many(const char *const *paths, size_t n, arena_ckpt **out);

/* A checkpoint of the one file f (already open or parsed: a header alone,
 * arena_st_parse_header), which it owns from now on, also on failure.
 * Errors: NOMEM. */
int arena_ckpt_of_file(arena_st_file *f, arena_ckpt **out);

void arena_ckpt_close(arena_ckpt *c);

/* Binary search by name; NULL if absent. */
const arena_st_tensor *arena_ckpt_find(const arena_ckpt *c, const char *name);

/* Sum of all tensors' bytes. */
uint64_t arena_ckpt_bytes(const arena_ckpt *c);

#endif
