/* cmd_verify.c - `arena verify`: check every byte of an image. */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../common/err.h"
#include "../formats/image.h"
#include "arena.h"
#include "cli.h"

const char cmd_verify_usage[] =
	"usage: arena verify IMAGE [--json] [--threads N] [--quiet]\n"
	"\n"
	"Check an arena image completely: header, manifest and chunk table checksums\n"
	"and structure, then every data chunk's checksum. Needs no GPU.\n"
	"Exit 0 only if everything holds. On corruption exit 1 and name, in one line,\n"
	"the first bad chunk with the blocks and tensors it covers and how many chunks\n"
	"are bad; --json lists every bad chunk.\n"
	"\n"
	"options:\n"
	"  --json        machine-readable result (schema in README.md)\n"
	"  --threads N   reader threads (default: number of CPUs, at most 8)\n"
	"  -q, --quiet   no progress line (one goes to stderr when it is a terminal)\n"
	"  -h, --help    this text\n";

typedef struct bad_list {
	json_t *arr;
} bad_list;

typedef struct cover {
	const arena_layout *l;
	json_t *blocks, *tensors;
} cover;

static void cover_fn(void *ctx, uint32_t block, int64_t tensor)
{
	cover *c = ctx;
	const char *bn = c->l->blocks[block].name;
	size_t n = json_array_size(c->blocks);
	if (!n || strcmp(json_string_value(json_array_get(c->blocks, n - 1)), bn))
		json_array_append_new(c->blocks, json_string(bn));
	if (tensor >= 0)
		json_array_append_new(c->tensors, json_string(c->l->tensors[tensor].name));
}

static void on_bad(void *ctx, const arena_image *img, uint64_t chunk, uint64_t expect, uint64_t got)
{
	bad_list *b = ctx;
	if (!b->arr)
		return;
	char e[20], g[20];
	snprintf(e, sizeof(e), "%016llx", (unsigned long long)expect);
	snprintf(g, sizeof(g), "%016llx", (unsigned long long)got);
	cover c = {img->layout, json_array(), json_array()};
	arena_img_chunk_cover(img, chunk, cover_fn, &c);
	const arena_img_chunk *ck = &img->chunks[chunk];
	json_array_append_new(b->arr, json_pack("{s:I,s:I,s:I,s:s,s:s,s:o,s:o}", "chunk", (json_int_t)chunk, "offset",
						(json_int_t)(img->hdr.data_offset + ck->offset), "length",
						(json_int_t)ck->stored_length, "expected", e, "actual", g, "blocks",
						c.blocks, "tensors", c.tensors));
}

int cmd_verify(int argc, char **argv)
{
	static const struct option opts[] = {
		{"json", no_argument, NULL, 'j'}, {"threads", required_argument, NULL, 't'},
		{"quiet", no_argument, NULL, 'q'}, {NULL, 0, NULL, 0}};
	int json = 0, quiet = 0, ch;
	long threads = sysconf(_SC_NPROCESSORS_ONLN);
	threads = threads < 1 ? 1 : threads > 8 ? 8 : threads;
	optind = 0;
	opterr = 0;
	while ((ch = getopt_long(argc, argv, "q", opts, NULL)) != -1) {
		if (ch == 'j') {
			json = 1;
		} else if (ch == 'q') {
			quiet = 1;
		} else if (ch == 't') {
			uint64_t n;
			int rc = cli_count_arg("verify", "--threads", optarg, 1, 64, &n);
			if (rc)
				return rc;
			threads = (long)n;
		} else {
			return cli_usage_error("verify", "unknown or incomplete option '%s'", argv[optind - 1]);
		}
	}
	if (argc - optind != 1)
		return cli_usage_error("verify", "expected one IMAGE, got %d", argc - optind);
	const char *path = argv[optind];
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	arena_image *img = NULL;
	bad_list bl = {.arr = json ? json_array() : NULL};
	uint64_t n_bad = 0;
	int rc = arena_img_open(path, &img);
	cli_progress pg;
	cli_progress_start(&pg, "verify", quiet);
	if (!rc)
		rc = arena_img_verify_data_progress(img, (unsigned)threads, on_bad, &bl, &n_bad, cli_progress_update, &pg);
	cli_progress_end(&pg);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
	int st;
	if (json) {
		json_t *o = json_object();
		json_object_set_new(o, "path", json_string(path));
		json_object_set_new(o, "ok", json_boolean(rc == 0));
		json_object_set_new(o, "file_size", img ? json_integer((json_int_t)img->hdr.file_size) : json_null());
		json_object_set_new(o, "chunks", img ? json_integer((json_int_t)img->hdr.chunk_count) : json_null());
		json_object_set_new(o, "bad_chunks", bl.arr);
		json_object_set_new(o, "seconds", json_real(s));
		json_object_set_new(o, "error", rc ? json_pack("{s:s,s:s}", "code", arena_err_name(rc), "message",
							       arena_last_error())
						   : json_null());
		st = cli_print_json(o);
		if (rc)
			st = arena_err_class(rc);
	} else if (rc && n_bad > 1) {
		/* one line: the first bad chunk, and how many there are */
		fprintf(stderr, "error: %s; %llu bad chunks in all ('arena verify --json' lists them)\n", arena_last_error(),
			(unsigned long long)n_bad);
		st = arena_err_class(rc);
	} else if (rc) {
		st = cli_fail(rc);
	} else {
		char a[32];
		printf("ok: %s: %llu chunks, %s verified in %.2f s (%.2f GB/s)\n", path,
		       (unsigned long long)img->hdr.chunk_count, cli_fmt_bytes(img->hdr.file_size, a, sizeof(a)), s,
		       s > 0 ? (double)img->hdr.file_size / s / 1e9 : 0.0);
		st = 0;
	}
	arena_img_close(img);
	return st;
}
