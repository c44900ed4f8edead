/* checkpoint.c - opening single, multi-file and sharded safetensors checkpoints. */
#include "checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/alloc.h"
#include "../common/err.h"
#include "../common/io.h"

#define E(name) ARENA_E(name)

static int ends_with(const char *s, const char *suf)
{
	size_t a = strlen(s), b = strlen(suf);
	return a >= b && strcmp(s + a - b, suf) == 0;
}

static char *path_join(const char *dir, const char *name)
{
	size_t a = strlen(dir), b = strlen(name);
	char *p = arena_malloc(a + b + 2);
	if (!p)
		return NULL;
	memcpy(p, dir, a);
	size_t o = a;
	if (a && dir[a - 1] != '/')
		p[o++] = '/';
	memcpy(p + o, name, b + 1);
	return p;
}

static char *dir_of(const char *path)
{
	const char *slash = strrchr(path, '/');
	if (!slash)
		return arena_strdup(".");
	size_t n = (size_t)(slash - path);
	char *d = arena_malloc(n + 2);
	if (!d)
		return NULL;
	if (n == 0)
		d[n++] = '/';
	else
		memcpy(d, path, n);
	d[n] = '\0';
	return d;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static int cmp_tensor_ptr(const void *a, const void *b)
{
	return strcmp((*(const arena_st_tensor *const *)a)->name, (*(const arena_st_tensor *const *)b)->name);
}

static int add_file(arena_ckpt *c, const char *path)
{
	arena_st_file **nf = arena_realloc(c->files, (c->n_files + 1) * sizeof(*nf));
	if (!nf)
		return arena_errorf(ARENA_E_NOMEM, "%s: out of memory", path);
	c->files = nf;
	arena_st_file *f;
	int rc = arena_st_open(path, &f);
	if (rc)
		return rc;
	c->files[c->n_files++] = f;
	return 0;
}

/* Merge all files' tensors into one sorted list; reject duplicates. */
static int merge_tensors(arena_ckpt *c)
{
	size_t n = 0;
	for (size_t i = 0; i < c->n_files; i++)
		n += c->files[i]->n_tensors;
	c->tensors = arena_calloc(n, sizeof(*c->tensors));
	if (!c->tensors)
		return arena_errorf(ARENA_E_NOMEM, "out of memory for %zu tensors", n);
	for (size_t i = 0; i < c->n_files; i++)
		for (size_t k = 0; k < c->files[i]->n_tensors; k++)
			c->tensors[c->n_tensors++] = &c->files[i]->tensors[k];
	qsort(c->tensors, n, sizeof(*c->tensors), cmp_tensor_ptr);
	for (size_t i = 1; i < n; i++)
		if (strcmp(c->tensors[i - 1]->name, c->tensors[i]->name) == 0)
			return arena_errorf(E(DUPLICATE_TENSOR), "tensor '%s' is defined in both %s and %s",
					    arena_q(c->tensors[i]->name), c->tensors[i - 1]->file->path,
					    c->tensors[i]->file->path);
	return 0;
}

static int valid_shard_name(const char *s)
{
	return *s && !strchr(s, '/') && strcmp(s, ".") && strcmp(s, "..");
}

/* Read the JSON document at path (a sharded checkpoint's index, a pipeline's
 * model_index.json) into *out (the caller's). The file is known by its
 * identity from then on: an output must not replace it. */
static int read_index_json(arena_ckpt *c, const char *path, json_t **out)
{
	*out = NULL;
	arena_alloc_init(); /* jansson allocates through arena's allocator */
	int fd;
	struct stat st;
	int rc = arena_open_input(path, 0, &fd, &st);
	if (rc)
		return rc;
	char *ip = arena_strdup(path);
	arena_ckpt_file_id *ids = ip ? arena_realloc(c->indexes, (c->n_indexes + 1) * sizeof(*ids)) : NULL;
	if (!ids) {
		arena_free(ip);
		close(fd);
		return arena_errorf(ARENA_E_NOMEM, "%s: out of memory", path);
	}
	c->indexes = ids;
	ids[c->n_indexes++] = (arena_ckpt_file_id){ip, (uint64_t)st.st_dev, (uint64_t)st.st_ino};
	json_error_t jerr;
	unsigned long mark = arena_json_parse_begin();
	json_t *root = json_loadfd(fd, JSON_REJECT_DUPLICATES, &jerr);
	int err = errno, oom = arena_json_parse_end(mark);
	close(fd);
	if (!root) {
		enum json_error_code code = json_error_code(&jerr);
		if (code == json_error_cannot_open_file)
			return arena_syserrorf(ARENA_E_IO, err, "%s: cannot read", path);
		if (code == json_error_out_of_memory || oom)
			return arena_errorf(ARENA_E_NOMEM, "%s: out of memory", path);
		return arena_errorf(E(IDX_JSON), "%s: line %d column %d: %s", path, jerr.line, jerr.column,
				    arena_q(jerr.text));
	}
	/* A parse can succeed on altered text after an allocation failed. */
	if (oom) {
		json_decref(root);
		return arena_errorf(ARENA_E_NOMEM, "%s: out of memory", path);
	}
	*out = root;
	return 0;
}

static int open_index(arena_ckpt *c, const char *index_path)
{
	arena_alloc_init();
	c->index_path = arena_strdup(index_path);
	if (!c->index_path)
		return arena_errorf(ARENA_E_NOMEM, "%s: out of memory", index_path);
	json_t *root;
	int rc = read_index_json(c, index_path, &root);
	if (rc)
		return rc;
	c->index_json = root;
	json_t *wm = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
	if (!json_is_object(wm))
		return arena_errorf(E(IDX_BAD), "%s: no \"weight_map\" object", index_path);
	json_t *meta = json_object_get(root, "metadata");
	if (meta && !json_is_object(meta))
		return arena_errorf(E(IDX_BAD), "%s: \"metadata\" is not an object", index_path);
	c->index_meta = meta;

	/* Distinct shard names, sorted. */
	size_t nw = json_object_size(wm), ns = 0;
	const char **shards = arena_calloc(nw, sizeof(*shards));
	char *dir = dir_of(index_path);
	char *p = NULL;
	if (!shards || !dir) {
		rc = arena_errorf(ARENA_E_NOMEM, "%s: out of memory", index_path);
		goto out;
	}
	const char *key;
	json_t *v;
	json_object_foreach(wm, key, v) {
		if (!json_is_string(v)) {
			rc = arena_errorf(E(IDX_BAD), "%s: weight_map '%s': shard is not a string", index_path,
					  arena_q(key));
			goto out;
		}
		if (!valid_shard_name(json_string_value(v))) {
			rc = arena_errorf(E(IDX_BAD_SHARD_NAME), "%s: weight_map '%s': shard '%s' is not a plain file name",
					  index_path, arena_q(key), arena_q(json_string_value(v)));
			goto out;
		}
		shards[ns++] = json_string_value(v);
	}
	qsort(shards, ns, sizeof(*shards), cmp_str);
	for (size_t i = 0; i < ns; i++) {
		if (i && strcmp(shards[i], shards[i - 1]) == 0)
			continue;
		p = path_join(dir, shards[i]);
		if (!p) {
			rc = arena_errorf(ARENA_E_NOMEM, "%s: out of memory", index_path);
			goto out;
		}
		rc = add_file(c, p);
		if (rc == ARENA_E_NOT_FOUND)
			rc = arena_errorf(E(IDX_SHARD_MISSING), "%s: shard '%s' is missing (no file %s)", index_path,
					  arena_q(shards[i]), p);
		arena_free(p);
		p = NULL;
		if (rc)
			goto out;
	}
	if ((rc = merge_tensors(c)))
		goto out;
	/* Every tensor a shard holds is named by the index, for that shard... */
	for (size_t i = 0; i < c->n_tensors; i++) {
		const arena_st_tensor *t = c->tensors[i];
		json_t *s = json_object_get(wm, t->name);
		if (!s) {
			rc = arena_errorf(E(IDX_TENSOR_UNLISTED), "%s: tensor '%s' is in %s but not in the index",
					  index_path, arena_q(t->name), t->file->path);
			goto out;
		}
	}
	/* ...and every tensor the index names is in the shard it names. */
	json_object_foreach(wm, key, v) {
		const arena_st_tensor *t = arena_ckpt_find(c, key);
		const char *base = t ? strrchr(t->file->path, '/') : NULL;
		base = base ? base + 1 : (t ? t->file->path : NULL);
		if (!t || strcmp(base, json_string_value(v)) != 0) {
			rc = arena_errorf(E(IDX_TENSOR_MISSING), "%s: tensor '%s' is not in shard '%s'", index_path,
					  arena_q(key), arena_q(json_string_value(v)));
			goto out;
		}
	}
out:
	arena_free(shards);
	arena_free(dir);
	return rc;
}

/* The weights' file names diffusers and transformers save without a variant. */
static int plain_name(const char *n)
{
	return strcmp(n, "model.safetensors") == 0 || strcmp(n, "diffusion_pytorch_model.safetensors") == 0 ||
	       strcmp(n, "model.safetensors.index.json") == 0 ||
	       strcmp(n, "diffusion_pytorch_model.safetensors.index.json") == 0;
}

/* Pick the checkpoint inside a folder: an index, else the only .safetensors.
 * `plain`: a pipeline's component folder, which may hold variants beside the
 * weights saved without one ("diffusion_pytorch_model.fp16.safetensors"):
 * among several, the one named without a variant. */
static int open_dir(arena_ckpt *c, const char *dir, int plain)
{
	DIR *d = opendir(dir);
	if (!d)
		return arena_input_syserror(dir, errno);
	char *index = NULL, *single = NULL;
	int n_st = 0, n_idx = 0, rc = 0, plain_idx = 0, plain_st = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (ends_with(e->d_name, ".safetensors.index.json")) {
			n_idx++;
			int p = plain && plain_name(e->d_name);
			plain_idx += p;
			if (!index || strcmp(e->d_name, "model.safetensors.index.json") == 0 || p) {
				arena_free(index);
				index = arena_strdup(e->d_name);
			}
		} else if (ends_with(e->d_name, ".safetensors")) {
			n_st++;
			int p = plain && plain_name(e->d_name);
			if (p || !plain_st) {
				arena_free(single);
				single = arena_strdup(e->d_name);
			}
			plain_st += p;
		}
		if ((n_idx && !index) || (n_st && !single)) {
			rc = arena_errorf(ARENA_E_NOMEM, "%s: out of memory", dir);
			goto out;
		}
	}
	const char *pick = NULL;
	if (n_idx > 1 && strcmp(index, "model.safetensors.index.json") != 0 && plain_idx != 1)
		rc = arena_errorf(E(NO_CHECKPOINT), "%s: %d index files and none is model.safetensors.index.json; name one",
				  dir, n_idx);
	else if (n_idx)
		pick = index;
	else if (n_st == 1 || (n_st > 1 && plain_st == 1))
		pick = single;
	else if (n_st > 1)
		rc = arena_errorf(E(NO_CHECKPOINT), "%s: %d .safetensors files and no index; name the files", dir, n_st);
	else
		rc = arena_errorf(E(NO_CHECKPOINT), "%s: no .safetensors file or index in this folder", dir);
	if (pick) {
		char *p = path_join(dir, pick);
		if (!p)
			rc = arena_errorf(ARENA_E_NOMEM, "%s: out of memory", dir);
		else
			rc = n_idx ? open_index(c, p) : add_file(c, p);
		if (rc == ARENA_E_NOT_FOUND) /* listed but gone (a dangling symlink): the folder's fault */
			rc = ARENA_E(INPUT_NOT_READABLE);
		arena_free(p);
	}
out:
	closedir(d);
	arena_free(index);
	arena_free(single);
	return rc;
}

/* What a pipeline's component folder holds: 1 safetensors weights (or an
 * index), 2 only PyTorch pickles (.bin, .pt, .pth), 0 neither (a tokenizer, a
 * scheduler); negative: an error reading it. */
static int component_weights(const char *dir)
{
	DIR *d = opendir(dir);
	if (!d)
		return arena_input_syserror(dir, errno);
	int st = 0, bin = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (ends_with(e->d_name, ".safetensors") || ends_with(e->d_name, ".safetensors.index.json"))
			st = 1;
		else if (ends_with(e->d_name, ".bin") || ends_with(e->d_name, ".pt") || ends_with(e->d_name, ".pth"))
			bin = 1;
	}
	closedir(d);
	return st ? 1 : bin ? 2 : 0;
}

/* Move sub's files and indexes into c (sub keeps none). */
static int adopt(arena_ckpt *c, arena_ckpt *sub)
{
	arena_st_file **nf = arena_realloc(c->files, (c->n_files + sub->n_files) * sizeof(*nf));
	if (!nf)
		return arena_errorf(ARENA_E_NOMEM, "out of memory");
	c->files = nf;
	arena_ckpt_file_id *ids =
		sub->n_indexes ? arena_realloc(c->indexes, (c->n_indexes + sub->n_indexes) * sizeof(*ids)) : c->indexes;
	if (sub->n_indexes && !ids)
		return arena_errorf(ARENA_E_NOMEM, "out of memory");
	c->indexes = ids;
	for (size_t k = 0; k < sub->n_files; k++)
		c->files[c->n_files++] = sub->files[k];
	sub->n_files = 0;
	for (size_t k = 0; k < sub->n_indexes; k++)
		c->indexes[c->n_indexes++] = sub->indexes[k];
	sub->n_indexes = 0;
	return 0;
}

/* A diffusers pipeline's folder: model_index.json names its components
 * ("transformer": ["diffusers", "FluxTransformer2DModel"]); each component's
 * folder holding safetensors weights is opened as a checkpoint of its own and
 * its tensors are named "<component>.<name>". Components without weights (a
 * tokenizer, a scheduler) are passed over; one with only pickled weights is
 * an error. */
static int open_pipeline(arena_ckpt *c, const char *dir, const char *mi)
{
	json_t *root;
	int rc = read_index_json(c, mi, &root);
	if (rc)
		return rc;
	if (!json_is_object(root)) {
		json_decref(root);
		return arena_errorf(E(IDX_BAD), "%s: not a JSON object", mi);
	}
	/* The components, by name: a key not starting with '_' whose value is
	 * [library, class]. */
	size_t n = 0;
	const char **names = arena_calloc(json_object_size(root) + 1, sizeof(*names));
	if (!names) {
		json_decref(root);
		return arena_errorf(ARENA_E_NOMEM, "%s: out of memory", mi);
	}
	const char *key;
	json_t *v;
	json_object_foreach(root, key, v) {
		if (key[0] == '_' || !json_is_array(v) || json_array_size(v) != 2 ||
		    !json_is_string(json_array_get(v, 0)) || !json_is_string(json_array_get(v, 1)))
			continue;
		if (!valid_shard_name(key)) {
			rc = arena_errorf(E(IDX_BAD), "%s: component '%s' is not a plain folder name", mi, arena_q(key));
			goto out;
		}
		names[n++] = key;
	}
	qsort(names, n, sizeof(*names), cmp_str);
	size_t with = 0;
	for (size_t i = 0; i < n && !rc; i++) {
		char *sub_dir = path_join(dir, names[i]);
		if (!sub_dir) {
			rc = arena_errorf(ARENA_E_NOMEM, "%s: out of memory", mi);
			break;
		}
		struct stat sst;
		int w = stat(sub_dir, &sst) == 0 && S_ISDIR(sst.st_mode) ? component_weights(sub_dir) : 0;
		if (w < 0) {
			rc = w;
		} else if (w == 2) {
			rc = arena_errorf(E(NO_CHECKPOINT), "%s: component '%s' has only pickled weights (.bin, .pt): save it "
					  "as safetensors (save_pretrained(..., safe_serialization=True))", sub_dir,
					  arena_q(names[i]));
		} else if (w == 1) {
			arena_ckpt *sub = arena_calloc(1, sizeof(*sub));
			size_t lp = strlen(names[i]);
			char *prefix = arena_malloc(lp + 2);
			if (!sub || !prefix) {
				rc = arena_errorf(ARENA_E_NOMEM, "%s: out of memory", mi);
			} else {
				memcpy(prefix, names[i], lp);
				memcpy(prefix + lp, ".", 2);
				rc = open_dir(sub, sub_dir, 1);
				for (size_t k = 0; k < sub->n_files && !rc; k++)
					rc = arena_st_prefix(sub->files[k], prefix);
				if (!rc)
					rc = adopt(c, sub);
				with++;
			}
			arena_free(prefix);
			arena_ckpt_close(sub);
		}
		arena_free(sub_dir);
	}
	if (!rc && !with)
		rc = arena_errorf(E(NO_CHECKPOINT), "%s: no component of the pipeline has safetensors weights", mi);
	if (!rc)
		rc = merge_tensors(c);
out:
	arena_free(names);
	json_decref(root);
	return rc;
}

static int open_one(arena_ckpt *c, const char *path)
{
	struct stat st;
	if (stat(path, &st) < 0)
		return arena_input_syserror(path, errno);
	if (S_ISDIR(st.st_mode)) {
		char *mi = path_join(path, "model_index.json");
		if (!mi)
			return arena_errorf(ARENA_E_NOMEM, "%s: out of memory", path);
		struct stat ms;
		int rc = stat(mi, &ms) == 0 ? open_pipeline(c, path, mi) : open_dir(c, path, 0);
		arena_free(mi);
		return rc;
	}
	if (ends_with(path, ".json"))
		return open_index(c, path);
	return add_file(c, path);
}

int arena_ckpt_open_many(const char *const *paths, size_t n, arena_ckpt **out)
{
	*out = NULL;
	if (n == 0)
		return arena_errorf(ARENA_E_USAGE, "no input given");
	arena_ckpt *c = arena_calloc(1, sizeof(*c));
	if (!c)
		return arena_errorf(ARENA_E_NOMEM, "out of memory");
	int rc = 0;
	if (n == 1) {
		rc = open_one(c, paths[0]);
		if (!rc && !c->tensors)
			rc = merge_tensors(c);
	} else {
		for (size_t i = 0; i < n && !rc; i++) {
			arena_ckpt *sub;
			rc = arena_ckpt_open(paths[i], &sub);
			if (rc)
				break;
			rc = adopt(c, sub);
			arena_ckpt_close(sub);
		}
		if (!rc)
			rc = merge_tensors(c);
	}
	if (rc) {
		arena_ckpt_close(c);
		return rc;
	}
	*out = c;
	return 0;
}

int arena_ckpt_of_file(arena_st_file *f, arena_ckpt **out)
{
	*out = NULL;
	arena_ckpt *c = arena_calloc(1, sizeof(*c));
	arena_st_file **files = arena_calloc(1, sizeof(*files));
	if (!c || !files) {
		arena_free(c);
		arena_free(files);
		arena_st_close(f);
		return arena_errorf(ARENA_E_NOMEM, "%s: out of memory", f->path);
	}
	c->files = files;
	c->files[c->n_files++] = f;
	int rc = merge_tensors(c);
	if (rc) {
		arena_ckpt_close(c);
		return rc;
	}
	*out = c;
	return 0;
}

int arena_ckpt_open(const char *path, arena_ckpt **out)
{
	return arena_ckpt_open_many(&path, 1, out);
}

void arena_ckpt_close(arena_ckpt *c)
{
	if (!c)
		return;
	for (size_t i = 0; i < c->n_files; i++)
		arena_st_close(c->files[i]);
	arena_free(c->files);
	arena_free(c->tensors);
	arena_free(c->index_path);
	for (size_t i = 0; i < c->n_indexes; i++)
		arena_free(c->indexes[i].path);
	arena_free(c->indexes);
	json_decref((json_t *)c->index_json);
	arena_free(c);
}

static int cmp_key_tensor_ptr(const void *key, const void *t)
{
	return strcmp(key, (*(const arena_st_tensor *const *)t)->name);
}

const arena_st_tensor *arena_ckpt_find(const arena_ckpt *c, const char *name)
{
	const arena_st_tensor *const *t =
		c->n_tensors ? bsearch(name, c->tensors, c->n_tensors, sizeof(*c->tensors), cmp_key_tensor_ptr) : NULL;
	return t ? *t : NULL;
}

uint64_t arena_ckpt_bytes(const arena_ckpt *c)
{
	uint64_t s = 0;
	for (size_t i = 0; i < c->n_tensors; i++)
		s += c->tensors[i]->nbytes;
	return s;
}
