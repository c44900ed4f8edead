/* cmd_verify.c - `arena verify`: check every byte of an image. */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
	"  --json        machine-readable result (schema in docs/CLI.md)\n"
	"  --threads N   reader threads (default: number of CPUs, at most 8)\n"
	"  -q, --quiet   no progress line (one goes to stderr when it is a terminal)\n"
	"  -h, --help    this text\n";

/* --json: every bad chunk, as the library describes it. */
static void on_bad(void *ctx, const arena_bad_chunk *b)
{
	json_t *arr = ctx;
	char e[20], g[20];
	snprintf(e, sizeof(e), "%016llx", (unsigned long long)b->expected);
	snprintf(g, sizeof(g), "%016llx", (unsigned long long)b->actual);
	json_t *blocks = json_array(), *tensors = json_array();
	for (size_t i = 0; i < b->n_blocks; i++)
		json_array_append_new(blocks, json_string(b->blocks[i]));
	for (size_t i = 0; i < b->n_tensors; i++)
		json_array_append_new(tensors, json_string(b->tensors[i]));
	json_array_append_new(arr, json_pack("{s:I,s:I,s:I,s:s,s:s,s:o,s:o}", "chunk", (json_int_t)b->chunk, "offset",
					     (json_int_t)b->offset, "length", (json_int_t)b->length, "expected", e,
					     "actual", g, "blocks", blocks, "tensors", tensors));
}

static int on_progress(void *ctx, uint64_t done, uint64_t total)
{
	cli_progress_update(ctx, done, total);
	return 0;
}

int cmd_verify(int argc, char **argv)
{
	static const struct option opts[] = {
		{"json", no_argument, NULL, 'j'}, {"threads", required_argument, NULL, 't'},
		{"quiet", no_argument, NULL, 'q'}, {NULL, 0, NULL, 0}};
	int json = 0, quiet = 0, ch;
	unsigned threads = 0; /* the library's default: CPUs, at most 8 */
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
			threads = (unsigned)n;
		} else {
			return cli_usage_error("verify", "unknown or incomplete option '%s'", argv[optind - 1]);
		}
	}
	if (argc - optind != 1)
		return cli_usage_error("verify", "expected one IMAGE, got %d", argc - optind);
	const char *path = argv[optind];
	json_t *bad = json ? json_array() : NULL;
	cli_progress pg;
	cli_progress_start(&pg, "verify", quiet);
	arena_verify_options o = {.threads = threads, .progress = on_progress, .progress_ctx = &pg};
	if (bad) {
		o.bad_chunk = on_bad;
		o.bad_chunk_ctx = bad;
	}
	arena_verify_info vi;
	int rc = arena_verify(path, &o, &vi);
	cli_progress_end(&pg);
	int st;
	if (json) {
		json_t *out = json_object();
		json_object_set_new(out, "path", json_string(path));
		json_object_set_new(out, "ok", json_boolean(rc == 0));
		json_object_set_new(out, "file_size", vi.opened ? json_integer((json_int_t)vi.file_size) : json_null());
		json_object_set_new(out, "chunks", vi.opened ? json_integer((json_int_t)vi.chunk_count) : json_null());
		json_object_set_new(out, "bad_chunks", bad);
		json_object_set_new(out, "seconds", json_real(vi.seconds));
		json_object_set_new(out, "error", rc ? json_pack("{s:s,s:s}", "code", arena_err_name(rc), "message",
								 arena_last_error())
						     : json_null());
		st = cli_print_json(out);
		if (rc)
			st = arena_err_class(rc);
	} else if (rc && vi.bad_chunks > 1) {
		/* one line: the first bad chunk, and how many there are */
		fprintf(stderr, "error: %s; %llu bad chunks in all ('arena verify --json' lists them)\n", arena_last_error(),
			(unsigned long long)vi.bad_chunks);
		st = arena_err_class(rc);
	} else if (rc) {
		st = cli_fail(rc);
	} else {
		char a[32];
		const double s = vi.seconds;
		printf("ok: %s: %llu chunk%s, %s verified in %.2f s (%.2f GB/s)\n", path, (unsigned long long)vi.chunk_count,
		       cli_s(vi.chunk_count), cli_fmt_bytes(vi.file_size, a, sizeof(a)), s, s > 0 ? (double)vi.file_size / s / 1e9 : 0.0);
		st = 0;
	}
	return st;
}
