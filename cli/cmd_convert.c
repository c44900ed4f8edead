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
#include "../formats/dtype.h"
#include "../formats/image.h"
#include "../formats/layout.h"
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
	"nothing at OUT and no temporary (docs/CLI.md). OUT may not be an input; an\n"
	"existing OUT is replaced only with --force.\n"
	"\n"
	"options:\n"
	"  -o, --output FILE       the image to write (required)\n"
	"  --force                 replace FILE if it exists (when the new one is whole)\n"
	"  --read-back             read each chunk back from the disk after writing it\n"
	"                          and compare: the image comes out verified, the reads\n"
	"                          beside the other chunks' writes (no 'arena verify'\n"
	"                          pass after); a difference is an IO error, no output\n"
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
	"                          cache (format 1.1); other data (f32, fp8, int4)\n"
	"                          stays plain, and the summary says so. zstd stores\n"
	"                          each byte of the chunk's elements as a stream,\n"
	"                          zstd-compressed where that is smaller (bf16\n"
	"                          weights: about 69%); the CPU decodes as it loads:\n"
	"                          for cold loads from slow disks and for copying\n"
	"                          images (format 1.2). Older readers refuse both\n"
	"                          (docs/FORMAT.md, docs/STORAGE.md)\n"
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

/* Why chunks of the hb4 image at `path` stayed plain, in a line each for
 * the two reasons: hb4 codes 16-bit words (a chunk mostly of other data, F32
 * or FP8, is not coded), and a chunk of 16-bit data stays plain where coding
 * would not make it a page smaller. Best effort: nothing is said when the
 * image cannot be read back. */
static void hb4_plain_why(const char *path)
{
	arena_image *img;
	if (arena_img_open(path, &img)) {
		arena_error_clear();
		return;
	}
	const uint64_t n = img->hdr.chunk_count, cs = img->hdr.chunk_size;
	uint64_t *w16 = arena_calloc(n ? n : 1, sizeof(*w16)), *wide = arena_calloc(n ? n : 1, sizeof(*wide));
	/* what the other data is: a dtype's name, or a quantized tensor's scheme */
	enum { KINDS = 32 };
	const char *kind[KINDS];
	uint64_t kind_bytes[KINDS] = {0};
	int kinds = 0;
	if (!w16 || !wide)
		goto out;
	/* Each chunk's bytes of 16-bit data and of other data. */
	const arena_layout *l = img->layout;
	for (size_t t = 0; t < l->n_tensors; t++)
		for (uint32_t c = 0; c < l->tensors[t].n_comp; c++) {
			const arena_component *k = &l->tensors[t].comp[c];
			uint64_t a = l->blocks[l->tensors[t].block].offset + k->offset, z = a + k->bytes;
			for (uint64_t i = a / cs; i < n && i * cs < z; i++) {
				uint64_t lo = a > i * cs ? a : i * cs, hi = z < (i + 1) * cs ? z : (i + 1) * cs;
				*(arena_dtype_bits(k->dtype) == 16 ? &w16[i] : &wide[i]) += hi - lo;
			}
		}
	uint64_t n_wide = 0, n_16 = 0;
	for (uint64_t i = 0; i < n; i++) {
		if (img->chunks[i].codec != ARENA_CODEC_NONE)
			continue;
		if (wide[i] > w16[i])
			n_wide++;
		else
			n_16++;
	}
	/* What the other data is, in the plain chunks that are mostly of it. */
	for (size_t t = 0; n_wide && t < l->n_tensors; t++) {
		const arena_tensor *x = &l->tensors[t];
		int quantized = strcmp(x->scheme, "none") && strcmp(x->scheme, "torch-subclass");
		for (uint32_t c = 0; c < x->n_comp; c++) {
			const arena_component *k = &x->comp[c];
			const char *name = quantized ? x->scheme : arena_dtype_name(k->dtype);
			uint64_t a = l->blocks[x->block].offset + k->offset, z = a + k->bytes, in = 0;
			for (uint64_t i = a / cs; arena_dtype_bits(k->dtype) != 16 && i < n && i * cs < z; i++) {
				uint64_t lo = a > i * cs ? a : i * cs, hi = z < (i + 1) * cs ? z : (i + 1) * cs;
				if (img->chunks[i].codec == ARENA_CODEC_NONE && wide[i] > w16[i])
					in += hi - lo;
			}
			int j = 0;
			while (j < kinds && strcmp(kind[j], name))
				j++;
			if (in && j == kinds && kinds < KINDS)
				kind[kinds++] = name;
			if (in && j < kinds)
				kind_bytes[j] += in;
		}
	}
	if (n_wide && kinds) {
		int most = 0;
		for (int j = 1; j < kinds; j++)
			most = kind_bytes[j] > kind_bytes[most] ? j : most;
		printf("%llu chunk%s %s plain: hb4 codes 16-bit words (BF16, F16), and %s data is %s%s\n",
		       (unsigned long long)n_wide, cli_s(n_wide), n_wide == 1 ? "stays" : "stay", n_wide == 1 ? "its" : "their",
		       kinds > 1 ? "mostly " : "", kind[most]);
	}
	if (n_16)
		printf("%llu chunk%s of 16-bit data %s plain: coded, %s would not be a page smaller\n",
		       (unsigned long long)n_16, cli_s(n_16), n_16 == 1 ? "stays" : "stay", n_16 == 1 ? "it" : "they");
out:
	arena_free(w16);
	arena_free(wide);
	arena_img_close(img);
}

int cmd_convert(int argc, char **argv)
{
	enum { O_PATTERN = 256, O_ORDER, O_CHUNK, O_THREADS, O_QUANT, O_QINC, O_QEXC, O_CODEC, O_LEVEL, O_FORCE, O_READ_BACK };
	static const struct option opts[] = {
		{"output", required_argument, NULL, 'o'},      {"block-pattern", required_argument, NULL, O_PATTERN},
		{"block-order", required_argument, NULL, O_ORDER}, {"chunk-size", required_argument, NULL, O_CHUNK},
		{"threads", required_argument, NULL, O_THREADS}, {"quiet", no_argument, NULL, 'q'},
		{"quant", required_argument, NULL, O_QUANT},     {"quant-include", required_argument, NULL, O_QINC},
		{"quant-exclude", required_argument, NULL, O_QEXC}, {"codec", required_argument, NULL, O_CODEC},
		{"zstd-level", required_argument, NULL, O_LEVEL}, {"force", no_argument, NULL, O_FORCE},
		{"read-back", no_argument, NULL, O_READ_BACK},   {NULL, 0, NULL, 0},
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
		case O_FORCE:
			co.force = 1;
			break;
		case O_READ_BACK:
			co.read_back = 1;
			break;
		case O_PATTERN:
			patterns[co.n_block_patterns++] = optarg;
			break;
		case O_QUANT:
			if ((st = cli_quant_arg("convert", optarg)))
				goto done;
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
		printf("wrote %s: %llu block%s, %llu tensor%s, %s in %.2f s (%.2f GB/s)\n", out,
		       (unsigned long long)res.n_blocks, cli_s(res.n_blocks), (unsigned long long)res.n_tensors,
		       cli_s(res.n_tensors), cli_fmt_bytes(res.file_size, a, sizeof(a)), s,
		       s > 0 ? (double)res.data_bytes / s / 1e9 : 0.0);
		if (co.codec)
			printf("coded %llu of %llu chunk%s with %s: data %.1f%% of its raw size\n",
			       (unsigned long long)res.coded_chunks, (unsigned long long)res.chunk_count,
			       cli_s(res.chunk_count), co.codec,
			       res.data_bytes ? 100.0 * (double)res.stored_bytes / (double)res.data_bytes : 100.0);
		if (co.codec && !strcmp(co.codec, "hb4") && res.coded_chunks < res.chunk_count)
			hb4_plain_why(out);
	}
done:
	arena_free(patterns);
	arena_free(qinc);
	arena_free(qexc);
	arena_free(order);
	return st;
}
