/* cmd_convert.c - `arena convert`: safetensors checkpoint -> arena image. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../common/alloc.h"
#include "../common/clock.h"
#include "../common/err.h"
#include "../formats/codec.h"
#include "arena.h"
#include "cli.h"

const char cmd_convert_usage[] =
	"usage: arena convert INPUT... -o OUT.arena [options]\n"
	"\n"
	"Convert a safetensors checkpoint into an arena image: one slab per block in\n"
	"execution order, every byte checksummed (docs/FORMAT.md). INPUT is a\n"
	".safetensors file, a sharded checkpoint's index.json, or a folder holding\n"
	"either; several INPUTs form one model (a tensor defined twice is an error).\n"
	"A diffusers pipeline's folder (model_index.json) makes one image of all its\n"
	"components with weights, each tensor named '<component>.<name>'\n"
	"(text_encoder.*, transformer.*, vae.*: arena.torch.attach(pipe, image)).\n"
	"OUT appears only when whole: a failed, interrupted or killed convert leaves\n"
	"nothing at OUT and no temporary (docs/CLI.md). OUT may not be an input.\n"
	"\n"
	"options:\n"
	"  -o, --output FILE       the image to write (required)\n"
	"  --block-pattern REGEX   a block is a match of this POSIX extended regex with\n"
	"                          one capture group for the index, e.g.\n"
	"                          'layers\\.([0-9]+)\\.'; repeatable; replaces the\n"
	"                          built-in patterns (see docs/CLI.md, 'Blocks')\n"
	"  --block-order A,B,...   containers in execution order, e.g.\n"
	"                          transformer_blocks,single_transformer_blocks\n"
	"  --quant SCHEME          store selected weights quantized: fp8-e4m3-row,\n"
	"                          fp8-e4m3-tensor, fp8-e4m3, fp8-e5m2, int8-row, bf16,\n"
	"                          int4-g64, int4-g32, int4-g128 (4 bits in groups of\n"
	"                          64, 32, 128 columns, each with a scale and a zero\n"
	"                          point; NaN and inf refused), none (as stored).\n"
	"                          Selected by default: 2-D float '*.weight' tensors\n"
	"                          inside blocks, not norms or embeddings. Bit-exact\n"
	"                          with torch (docs/CLI.md, docs/QUANT.md)\n"
	"  --quant-include GLOB    also quantize tensors whose name matches (repeatable)\n"
	"  --quant-exclude GLOB    never quantize tensors whose name matches (repeatable)\n"
	"                          Already-quantized inputs (compressed-tensors: F8_E4M3\n"
	"                          '<name>' + '<name>_scale') are kept, never re-quantized.\n"
	"  --chunk-size SIZE       checksum chunk size, power of two, 64K..1G (default 4M)\n"
	"  --codec none|hb4|zstd   code chunks losslessly (default none), wherever that\n"
	"                          saves bytes. hb4 stores each 16-bit word's high byte\n"
	"                          in 4 bits (bf16 weights: 75% of the bytes) and the GPU\n"
	"                          decodes as it loads: the fastest load from the page\n"
	"                          cache (format 1.1). zstd stores each byte of the\n"
	"                          chunk's elements as a stream, zstd-compressed where\n"
	"                          that is smaller (bf16 weights: about 69%); the CPU\n"
	"                          decodes as it loads: for cold loads from slow disks\n"
	"                          and for copying images (format 1.2). Older readers\n"
	"                          refuse both (docs/FORMAT.md, docs/STORAGE.md)\n"
	"  --zstd-level N          zstd's level, 1..19 (default 1: faster levels lose\n"
	"                          little, bench/RESULTS.md); with --codec zstd\n"
	"  --threads N             worker threads (default: number of CPUs)\n"
	"  -q, --quiet             no progress line and no summary\n"
	"  -h, --help              this text\n"
	"\n"
	CLI_SIZE_HELP
	"\n"
	"exit status: 0 written, 1 invalid input, 2 usage error, 3 I/O or memory error\n";

static volatile sig_atomic_t cancelled;

static void on_signal(int sig)
{
	(void)sig;
	cancelled = 1;
}

/* The progress line; a signal cancels the conversion at the next report. */
static int on_progress(void *ctx, uint64_t done, uint64_t total)
{
	cli_progress_update(ctx, done, total);
	return cancelled;
}

/* Split "a,b,c" into a NULL-free array (owned; the strings point into s). */
static int split_list(char *s, const char ***out, size_t *n)
{
	size_t cap = 1;
	for (char *p = s; *p; p++)
		cap += *p == ',';
	const char **v = arena_calloc(cap, sizeof(*v));
	if (!v)
		return -1;
	*n = 0;
	for (char *tok = strtok(s, ","); tok; tok = strtok(NULL, ","))
		v[(*n)++] = tok;
	*out = v;
	return 0;
}

int cmd_convert(int argc, char **argv)
{
	enum { O_PATTERN = 256, O_ORDER, O_CHUNK, O_THREADS, O_QUANT, O_QINC, O_QEXC, O_CODEC, O_LEVEL };
	static const struct option opts[] = {
		{"output", required_argument, NULL, 'o'},      {"block-pattern", required_argument, NULL, O_PATTERN},
		{"block-order", required_argument, NULL, O_ORDER}, {"chunk-size", required_argument, NULL, O_CHUNK},
		{"threads", required_argument, NULL, O_THREADS}, {"quiet", no_argument, NULL, 'q'},
		{"quant", required_argument, NULL, O_QUANT},     {"quant-include", required_argument, NULL, O_QINC},
		{"quant-exclude", required_argument, NULL, O_QEXC}, {"codec", required_argument, NULL, O_CODEC},
		{"zstd-level", required_argument, NULL, O_LEVEL},
		{NULL, 0, NULL, 0},
	};
	const char *out = NULL;
	int quiet = 0, st = 0;
	arena_convert_options co = {0};
	const char **patterns = arena_calloc((size_t)argc, sizeof(char *));
	const char **qinc = arena_calloc((size_t)argc, sizeof(char *));
	const char **qexc = arena_calloc((size_t)argc, sizeof(char *));
	const char **order = NULL;
	co.quant_include = qinc;
	co.quant_exclude = qexc;
	if (!patterns || !qinc || !qexc)
		return cli_fail(arena_errorf(ARENA_E_NOMEM, "out of memory"));
	int ch;
	optind = 0;
	opterr = 0;
	while ((ch = getopt_long(argc, argv, "o:q", opts, NULL)) != -1) {
		switch (ch) {
		case 'o':
			out = optarg;
			break;
		case 'q':
			quiet = 1;
			break;
		case O_PATTERN:
			patterns[co.n_block_patterns++] = optarg;
			break;
		case O_QUANT:
			co.quant = optarg;
			break;
		case O_QINC:
			qinc[co.n_quant_include++] = optarg;
			break;
		case O_QEXC:
			qexc[co.n_quant_exclude++] = optarg;
			break;
		case O_ORDER:
			arena_free(order);
			order = NULL;
			if (split_list(optarg, &order, &co.n_block_order)) {
				st = cli_fail(arena_errorf(ARENA_E_NOMEM, "out of memory"));
				goto done;
			}
			break;
		case O_CHUNK:
			if ((st = cli_size_arg("convert", "--chunk-size", optarg, 1, &co.chunk_size)))
				goto done;
			if (co.chunk_size < (64u << 10) || co.chunk_size > (1u << 30) || (co.chunk_size & (co.chunk_size - 1))) {
				st = cli_usage_error("convert", "--chunk-size '%s' is not a power of two from 64K to 1G",
						     arena_q(optarg));
				goto done;
			}
			break;
		case O_CODEC: {
			int c = arena_codec_from_name(optarg);
			if (c < 0) {
				st = cli_usage_error("convert", "--codec '%s' is not none, hb4 or zstd", arena_q(optarg));
				goto done;
			}
			co.codec = c ? arena_codec_name((unsigned)c) : NULL;
			break;
		}
		case O_LEVEL: {
			uint64_t n;
			if ((st = cli_count_arg("convert", "--zstd-level", optarg, 1, ARENA_ZSTD_MAX_LEVEL, &n)))
				goto done;
			co.zstd_level = (int)n;
			break;
		}
		case O_THREADS: {
			uint64_t n;
			if ((st = cli_count_arg("convert", "--threads", optarg, 1, 256, &n)))
				goto done;
			co.threads = (unsigned)n;
			break;
		}
		default:
			st = cli_usage_error("convert", "unknown or incomplete option '%s'", argv[optind - 1]);
			goto done;
		}
	}
	if (!out) {
		st = cli_usage_error("convert", "no output given (-o OUT.arena)");
		goto done;
	}
	if (optind >= argc) {
		st = cli_usage_error("convert", "no INPUT given");
		goto done;
	}
	if (co.zstd_level && (!co.codec || strcmp(co.codec, "zstd"))) {
		st = cli_usage_error("convert", "--zstd-level is for --codec zstd");
		goto done;
	}
	co.block_patterns = patterns;
	co.block_order = order;
	cli_progress p;
	cli_progress_start(&p, "convert", quiet);
	co.progress = on_progress;
	co.progress_ctx = &p;
	cancelled = 0;
	struct sigaction sa = {.sa_handler = on_signal};
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	arena_convert_info res;
	int rc = arena_convert((const char *const *)argv + optind, (size_t)(argc - optind), out, &co, &res);
	signal(SIGINT, SIG_DFL);
	signal(SIGTERM, SIG_DFL);
	cli_progress_end(&p);
	if (rc) {
		st = cli_fail(rc);
		goto done;
	}
	if (!quiet) {
		double s = arena_now_s() - p.start;
		char a[32];
		printf("wrote %s: %llu blocks, %llu tensors, %s in %.2f s (%.2f GB/s)\n", out,
		       (unsigned long long)res.n_blocks, (unsigned long long)res.n_tensors,
		       cli_fmt_bytes(res.file_size, a, sizeof(a)), s, s > 0 ? (double)res.data_bytes / s / 1e9 : 0.0);
		if (co.codec)
			printf("coded %llu of %llu chunks with %s: data %.1f%% of its raw size\n",
			       (unsigned long long)res.coded_chunks, (unsigned long long)res.chunk_count,
			       co.codec,
			       res.data_bytes ? 100.0 * (double)res.stored_bytes / (double)res.data_bytes : 100.0);
	}
done:
	arena_free(patterns);
	arena_free(qinc);
	arena_free(qexc);
	arena_free(order);
	return st;
}
