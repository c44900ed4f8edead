/* cmd_inspect.c - `arena inspect`: what a checkpoint or image holds: the
 * library's document (arena_inspect), printed as it is (--json) or as text. */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "../common/err.h"
#include "../formats/dtype.h"
#include "../formats/layout.h"
#include "arena.h"
#include "cli.h"

const char cmd_inspect_usage[] =
	"usage: arena inspect PATH [--json]\n"
	"\n"
	"Show what PATH holds: metadata, then every tensor (name, dtype, shape, bytes,\n"
	"file, offset), then totals by dtype. For a checkpoint, a line says which\n"
	"blocks convert will make and why (the containers whose members repeat, single\n"
	"modules alike them, what was looked at and left in globals). PATH is a\n"
	".safetensors file, a sharded checkpoint's index (model.safetensors.index.json),\n"
	"a folder holding either, a diffusers pipeline's folder, or an arena image (then also its blocks, chunk size and layout; the image's\n"
	"header, manifest and chunk table are checked, its data is not: see verify).\n"
	"The input is validated first, by the rules convert applies (a tensor's rank\n"
	"at most 8, say); an invalid file is an error (exit 1).\n"
	"\n"
	"options:\n"
	"  --json     machine-readable output (schema in docs/CLI.md, 'arena inspect --json')\n"
	"  -h, --help this text\n";

static const char *base_name(const char *p)
{
	const char *s = strrchr(p, '/');
	return s ? s + 1 : p;
}

/* Fields of the document, which the library wrote: present and typed. */
static const char *str(const json_t *o, const char *k)
{
	const char *v = json_string_value(json_object_get(o, k));
	return v ? v : "";
}

static unsigned long long num(const json_t *o, const char *k)
{
	return (unsigned long long)json_integer_value(json_object_get(o, k));
}

static void fmt_shape(const json_t *shape, char *buf, size_t len)
{
	size_t o = (size_t)snprintf(buf, len, "[");
	for (size_t k = 0; k < json_array_size(shape) && o < len; k++)
		o += (size_t)snprintf(buf + o, len - o, "%s%llu", k ? ", " : "",
				      (unsigned long long)json_integer_value(json_array_get(shape, k)));
	if (o < len)
		snprintf(buf + o, len - o, "]");
}

/* The widest name of `tensors`, as printed (at least 4). */
static int name_width(const json_t *tensors)
{
	int w = 4;
	size_t i;
	const json_t *t;
	json_array_foreach(tensors, i, t) {
		int l = (int)strlen(arena_q(str(t, "name")));
		w = l > w ? l : w;
	}
	return w;
}

static int print_ckpt_text(const json_t *d)
{
	char b1[32];
	const json_t *files = json_object_get(d, "files"), *tensors = json_object_get(d, "tensors");
	const json_t *tot = json_object_get(d, "totals"), *t, *f;
	size_t i;
	printf("checkpoint: %s\n", str(d, "path"));
	if (json_is_string(json_object_get(d, "index")))
		printf("index:      %s\n", str(d, "index"));
	printf("tensors:    %llu in %zu file%s, %s (%llu byte%s)\n", num(tot, "tensors"), json_array_size(files),
	       cli_s(json_array_size(files)), cli_fmt_bytes(num(tot, "bytes"), b1, sizeof(b1)), num(tot, "bytes"),
	       cli_s(num(tot, "bytes")));
	/* block discovery's verdict, as convert will make the layout */
	printf("%s\n", str(json_object_get(d, "discovery"), "line"));
	json_array_foreach(files, i, f) {
		const json_t *meta = json_object_get(f, "metadata");
		printf("\nfile %s: %llu byte%s, header %llu byte%s, %llu tensor%s\n", str(f, "path"), num(f, "size"),
		       cli_s(num(f, "size")), num(f, "header_bytes"), cli_s(num(f, "header_bytes")), num(f, "tensors"),
		       cli_s(num(f, "tensors")));
		if (json_object_size(meta)) {
			const char *k;
			const json_t *v;
			printf("metadata:\n");
			json_object_foreach((json_t *)(uintptr_t)meta, k, v) {
				/* arena_q's buffer is one per thread: one call per printf */
				printf("  %s: ", arena_q(k));
				printf("%s\n", arena_q(json_string_value(v)));
			}
		}
	}
	if (!json_array_size(tensors))
		return 0; /* a valid file with no tensors: its metadata is what it holds */
	const int w = name_width(tensors);
	printf("\n%-*s  %-11s  %-18s %12s  %s\n", w, "name", "dtype", "shape", "bytes", "file@offset");
	json_array_foreach(tensors, i, t) {
		char shape[256];
		fmt_shape(json_object_get(t, "shape"), shape, sizeof(shape));
		printf("%-*s  %-11s  %-18s %12llu  %s@%llu\n", w, arena_q(str(t, "name")), str(t, "dtype"), shape,
		       num(t, "bytes"), base_name(str(t, "file")), num(t, "offset"));
	}
	printf("\ntotals by dtype:\n");
	json_array_foreach(json_object_get(tot, "by_dtype"), i, t)
		printf("  %-11s %6llu tensor%-1s %14llu byte%-1s  %s\n", str(t, "dtype"), num(t, "tensors"),
		       cli_s(num(t, "tensors")), num(t, "bytes"), cli_s(num(t, "bytes")),
		       cli_fmt_bytes(num(t, "bytes"), b1, sizeof(b1)));
	return 0;
}

/* Bytes a tensor of the document would take in its original dtype (0 if unknown). */
static uint64_t logical_bytes(const json_t *t)
{
	const json_t *shape = json_object_get(t, "shape");
	uint64_t dims[ARENA_MAX_RANK], n = 0;
	size_t rank = json_array_size(shape);
	if (rank > ARENA_MAX_RANK)
		return 0;
	for (size_t k = 0; k < rank; k++)
		dims[k] = (uint64_t)json_integer_value(json_array_get(shape, k));
	arena_dtype dt = arena_dtype_from_name(str(t, "dtype"));
	return dt == ARENA_DTYPE_INVALID || arena_nbytes(dt, (uint32_t)rank, dims, &n) ? 0 : n;
}

static int print_image_text(const json_t *d)
{
	const json_t *lay = json_object_get(d, "layout"), *cod = json_object_get(d, "coding");
	const json_t *tot = json_object_get(d, "totals"), *meta = json_object_get(d, "metadata");
	const json_t *blocks = json_object_get(d, "blocks"), *tensors = json_object_get(d, "tensors"), *b, *t;
	const unsigned long long data_length = num(lay, "data_length");
	char a[32], b2[32], b3[32];
	size_t i;
	printf("image:      %s (format %s)\n", str(d, "path"), str(d, "version"));
	printf("file:       %s (%llu byte%s); data %llu byte%s at %llu\n", cli_fmt_bytes(num(d, "file_size"), a, sizeof(a)),
	       num(d, "file_size"), cli_s(num(d, "file_size")), data_length, cli_s(data_length), num(lay, "data_offset"));
	printf("chunks:     %llu of %s, xxh3-64\n", num(lay, "chunk_count"),
	       cli_fmt_bytes(num(lay, "chunk_size"), a, sizeof(a)));
	if (json_is_true(json_object_get(cod, "coded_image"))) {
		const unsigned long long hb4 = num(cod, "hb4_chunks"), zstd = num(cod, "zstd_chunks");
		const unsigned long long stored = num(cod, "stored_length");
		char both[64] = "";
		if (zstd && hb4)
			snprintf(both, sizeof(both), ", %llu hb4", hb4);
		printf("coding:     %llu chunk%s %s%s, %llu as is; %s stored for %s (%.1f%%); offsets below are raw\n",
		       zstd ? zstd : hb4, cli_s(zstd ? zstd : hb4), zstd ? "zstd" : "hb4", both, num(cod, "plain_chunks"),
		       cli_fmt_bytes(stored, a, sizeof(a)), cli_fmt_bytes(data_length, b2, sizeof(b2)),
		       data_length ? 100.0 * (double)stored / (double)data_length : 100.0);
	}
	printf("layout:     %llu block%s, %llu tensor%s; slabs %llu-aligned, tensors %llu-aligned\n", num(tot, "blocks"),
	       cli_s(num(tot, "blocks")), num(tot, "tensors"), cli_s(num(tot, "tensors")), num(lay, "slab_alignment"),
	       num(lay, "tensor_alignment"));
	if (json_object_size(meta)) {
		const char *k;
		const json_t *v;
		printf("metadata:\n");
		json_object_foreach((json_t *)(uintptr_t)meta, k, v) {
			printf("  %s: ", arena_q(k));
			printf("%s\n", arena_q(json_string_value(v)));
		}
	}
	printf("\nblocks (execution order):\n  %5s  %-40s %14s %14s %8s\n", "#", "name", "offset", "bytes", "tensors");
	json_array_foreach(blocks, i, b)
		printf("  %5zu  %-40s %14llu %14llu %8llu\n", i, arena_q(str(b, "name")), num(b, "offset"), num(b, "bytes"),
		       num(b, "tensors"));
	const int w = name_width(tensors);
	printf("\n%-*s  %-8s  %-16s %-16s %12s  %s\n", w, "name", "dtype", "shape", "scheme", "bytes", "block");
	uint64_t nq = 0, qstored = 0, qlogical = 0;
	json_array_foreach(tensors, i, t) {
		char shape[128];
		fmt_shape(json_object_get(t, "shape"), shape, sizeof(shape));
		printf("%-*s  %-8s  %-16s %-16s %12llu  ", w, arena_q(str(t, "name")), str(t, "dtype"), shape,
		       str(t, "scheme"), num(t, "bytes"));
		printf("%s\n", arena_q(str(t, "block")));
		if (strcmp(str(t, "scheme"), "none")) {
			nq++;
			qstored += num(t, "bytes");
			qlogical += logical_bytes(t);
		}
	}
	printf("\ntotals: %llu tensor%s, %s stored", num(tot, "tensors"), cli_s(num(tot, "tensors")),
	       cli_fmt_bytes(num(tot, "bytes"), a, sizeof(a)));
	if (nq)
		printf("; %llu quantized tensor%s take%s %s instead of %s (saved %s)", (unsigned long long)nq, cli_s(nq),
		       nq == 1 ? "s" : "",
		       cli_fmt_bytes(qstored, a, sizeof(a)), cli_fmt_bytes(qlogical, b2, sizeof(b2)),
		       cli_fmt_bytes(qlogical > qstored ? qlogical - qstored : 0, b3, sizeof(b3)));
	printf("\n");
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
	char *doc;
	int rc = arena_inspect(argv[optind], &doc);
	if (rc)
		return cli_fail(rc);
	if (json) {
		int st = fputs(doc, stdout) == EOF || fputc('\n', stdout) == EOF || fflush(stdout);
		arena_string_free(doc);
		if (st) {
			fprintf(stderr, "error: cannot write JSON to standard output\n");
			return 3;
		}
		return 0;
	}
	json_error_t jerr;
	json_t *d = json_loads(doc, 0, &jerr);
	arena_string_free(doc);
	if (!d)
		return cli_fail(arena_errorf(ARENA_E_INTERNAL, "inspect: the library's document does not parse: %s", jerr.text));
	int st = strcmp(str(d, "kind"), "arena-image") ? print_ckpt_text(d) : print_image_text(d);
	json_decref(d);
	return st;
}
