/* cmd_inspect.c - `arena inspect`: what a checkpoint or image holds. */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "../common/err.h"
#include "../formats/checkpoint.h"
#include "arena.h"
#include "cli.h"

const char cmd_inspect_usage[] =
	"usage: arena inspect PATH [--json]\n"
	"\n"
	"Show what PATH holds: metadata, then every tensor (name, dtype, shape, bytes,\n"
	"file, offset), then totals by dtype. PATH is a .safetensors file, a sharded\n"
	"checkpoint's index (model.safetensors.index.json) or a folder holding either.\n"
	"The input is fully validated first; an invalid file is an error (exit 1).\n"
	"\n"
	"options:\n"
	"  --json     machine-readable output (schema in README.md, 'arena inspect --json')\n"
	"  -h, --help this text\n";

static const char *base_name(const char *p)
{
	const char *s = strrchr(p, '/');
	return s ? s + 1 : p;
}

typedef struct dtype_total {
	uint64_t tensors, bytes;
} dtype_total;

static void totals(const arena_ckpt *c, dtype_total *t)
{
	memset(t, 0, sizeof(dtype_total) * ARENA_DTYPE_COUNT);
	for (size_t i = 0; i < c->n_tensors; i++) {
		t[c->tensors[i]->dtype].tensors++;
		t[c->tensors[i]->dtype].bytes += c->tensors[i]->nbytes;
	}
}

static json_t *shape_json(const arena_st_tensor *t)
{
	json_t *a = json_array();
	for (uint32_t k = 0; k < t->rank; k++)
		json_array_append_new(a, json_integer((json_int_t)t->shape[k]));
	return a;
}

static int print_ckpt_json(const char *path, const arena_ckpt *c)
{
	json_t *o = json_object();
	json_object_set_new(o, "kind", json_string("safetensors"));
	json_object_set_new(o, "path", json_string(path));
	json_object_set_new(o, "index", c->index_path ? json_string(c->index_path) : json_null());
	json_object_set_new(o, "index_metadata",
			    c->index_meta ? json_deep_copy((const json_t *)c->index_meta) : json_null());
	json_t *files = json_array();
	for (size_t i = 0; i < c->n_files; i++) {
		const arena_st_file *f = c->files[i];
		json_t *fo = json_object(), *meta = json_object();
		json_object_set_new(fo, "path", json_string(f->path));
		json_object_set_new(fo, "size", json_integer((json_int_t)f->size));
		json_object_set_new(fo, "header_bytes", json_integer((json_int_t)f->header_len));
		json_object_set_new(fo, "data_offset", json_integer((json_int_t)f->data_off));
		json_object_set_new(fo, "tensors", json_integer((json_int_t)f->n_tensors));
		for (size_t k = 0; k < f->n_meta; k++)
			json_object_set_new(meta, f->meta_keys[k], json_string(f->meta_vals[k]));
		json_object_set_new(fo, "metadata", meta);
		json_array_append_new(files, fo);
	}
	json_object_set_new(o, "files", files);
	json_t *ts = json_array();
	for (size_t i = 0; i < c->n_tensors; i++) {
		const arena_st_tensor *t = c->tensors[i];
		json_t *to = json_object();
		json_object_set_new(to, "name", json_string(t->name));
		json_object_set_new(to, "dtype", json_string(arena_dtype_name(t->dtype)));
		json_object_set_new(to, "shape", shape_json(t));
		json_object_set_new(to, "bytes", json_integer((json_int_t)t->nbytes));
		json_object_set_new(to, "file", json_string(t->file->path));
		json_object_set_new(to, "offset", json_integer((json_int_t)(t->file->data_off + t->begin)));
		json_object_set_new(to, "data_offsets",
				    json_pack("[II]", (json_int_t)t->begin, (json_int_t)t->end));
		json_array_append_new(ts, to);
	}
	json_object_set_new(o, "tensors", ts);
	dtype_total tot[ARENA_DTYPE_COUNT];
	totals(c, tot);
	json_t *by = json_array();
	for (int d = 0; d < ARENA_DTYPE_COUNT; d++)
		if (tot[d].tensors)
			json_array_append_new(by, json_pack("{s:s,s:I,s:I}", "dtype", arena_dtype_name((arena_dtype)d),
							    "tensors", (json_int_t)tot[d].tensors, "bytes",
							    (json_int_t)tot[d].bytes));
	json_object_set_new(o, "totals",
			    json_pack("{s:I,s:I,s:o}", "tensors", (json_int_t)c->n_tensors, "bytes",
				      (json_int_t)arena_ckpt_bytes(c), "by_dtype", by));
	return cli_print_json(o);
}

static void fmt_shape(const arena_st_tensor *t, char *buf, size_t len)
{
	size_t o = (size_t)snprintf(buf, len, "[");
	for (uint32_t k = 0; k < t->rank && o < len; k++)
		o += (size_t)snprintf(buf + o, len - o, "%s%llu", k ? ", " : "", (unsigned long long)t->shape[k]);
	if (o < len)
		snprintf(buf + o, len - o, "]");
}

static int print_ckpt_text(const char *path, const arena_ckpt *c)
{
	char b1[32];
	printf("checkpoint: %s\n", path);
	if (c->index_path)
		printf("index:      %s\n", c->index_path);
	printf("tensors:    %zu in %zu file%s, %s (%llu bytes)\n", c->n_tensors, c->n_files,
	       c->n_files == 1 ? "" : "s", cli_fmt_bytes(arena_ckpt_bytes(c), b1, sizeof(b1)),
	       (unsigned long long)arena_ckpt_bytes(c));
	for (size_t i = 0; i < c->n_files; i++) {
		const arena_st_file *f = c->files[i];
		printf("\nfile %s: %llu bytes, header %llu bytes, %zu tensors\n", f->path,
		       (unsigned long long)f->size, (unsigned long long)f->header_len, f->n_tensors);
		if (f->n_meta) {
			printf("metadata:\n");
			for (size_t k = 0; k < f->n_meta; k++)
				printf("  %s: %s\n", arena_q(f->meta_keys[k]), arena_q(f->meta_vals[k]));
		}
	}
	int w = 4;
	for (size_t i = 0; i < c->n_tensors; i++) {
		int l = (int)strlen(arena_q(c->tensors[i]->name));
		w = l > w ? l : w;
	}
	printf("\n%-*s  %-11s  %-18s %12s  %s\n", w, "name", "dtype", "shape", "bytes", "file@offset");
	for (size_t i = 0; i < c->n_tensors; i++) {
		const arena_st_tensor *t = c->tensors[i];
		char shape[256];
		fmt_shape(t, shape, sizeof(shape));
		printf("%-*s  %-11s  %-18s %12llu  %s@%llu\n", w, arena_q(t->name), arena_dtype_name(t->dtype), shape,
		       (unsigned long long)t->nbytes, base_name(t->file->path),
		       (unsigned long long)(t->file->data_off + t->begin));
	}
	dtype_total tot[ARENA_DTYPE_COUNT];
	totals(c, tot);
	printf("\ntotals by dtype:\n");
	for (int d = 0; d < ARENA_DTYPE_COUNT; d++)
		if (tot[d].tensors)
			printf("  %-11s %6llu tensors %14llu bytes  %s\n", arena_dtype_name((arena_dtype)d),
			       (unsigned long long)tot[d].tensors, (unsigned long long)tot[d].bytes,
			       cli_fmt_bytes(tot[d].bytes, b1, sizeof(b1)));
	return 0;
}

int cmd_inspect(int argc, char **argv)
{
	int json = 0;
	static const struct option opts[] = {{"json", no_argument, NULL, 'j'}, {NULL, 0, NULL, 0}};
	int ch;
	optind = 0;
	opterr = 0;
	while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (ch == 'j')
			json = 1;
		else
			return cli_usage_error("inspect", "unknown option '%s'", argv[optind - 1]);
	}
	if (argc - optind != 1)
		return cli_usage_error("inspect", "expected one PATH, got %d", argc - optind);
	const char *path = argv[optind];
	arena_ckpt *c;
	int rc = arena_ckpt_open(path, &c);
	if (rc)
		return cli_fail(rc);
	int st = json ? print_ckpt_json(path, c) : print_ckpt_text(path, c);
	arena_ckpt_close(c);
	return st;
}
