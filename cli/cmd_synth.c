/* cmd_synth.c - `arena synth`: a checkpoint with a real model's names and shapes and random values. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common/clock.h"
#include "../common/err.h"
#include "../convert/synth.h"
#include "arena.h"
#include "cli.h"

const char cmd_synth_usage[] =
	"usage: arena synth --layout NAME [--blocks N] [--dtype bf16|f16|f32] [--seed S]\n"
	"                   [--threads N] [--force] [--quiet] -o FILE.safetensors\n"
	"\n"
	"Write a safetensors checkpoint with a real model's tensor names and shapes and\n"
	"random values (normal, mean 0, std 0.02), for benchmarks and tests. It is\n"
	"written streaming: memory stays at 4 MiB per thread whatever the model's size.\n"
	"The file appears whole when done, or not at all; an existing FILE is replaced\n"
	"only with --force.\n"
	"\n"
	"layouts:\n"
	"  flux-dev    diffusers FluxTransformer2DModel with the FLUX.1-dev config:\n"
	"              19 double + 38 single blocks, inner dim 3072, 11.90 B parameters\n"
	"              (22.17 GiB in bf16)\n"
	"  flux-tiny   the same structure at the config of the reference tiny_flux\n"
	"              fixture: 2 double + 3 single blocks, inner dim 32\n"
	"  llama-8b    transformers LlamaForCausalLM, Llama-3-8B: 32 layers, hidden\n"
	"              4096, 32/8 heads, vocab 128256, untied lm_head, 8.03 B parameters\n"
	"              (14.96 GiB in bf16)\n"
	"  llama-tiny  the same structure at the config of the reference tiny_llama\n"
	"              fixture: 3 layers, hidden 32\n"
	"\n"
	"options:\n"
	"  --layout NAME    the model (above)\n"
	"  --blocks N       keep only the first N blocks of each repeated container\n"
	"                   (transformer_blocks, single_transformer_blocks, model.layers);\n"
	"                   '--layout flux-dev --blocks 2' is a small but real-shaped model\n"
	"  --dtype T        bf16 (default), f16 or f32\n"
	"  --seed S         seed of the values (default 0; decimal, or hex after 0x);\n"
	"                   the same arguments give the same bytes, whatever\n"
	"                   --threads, and a tensor has the same values whatever\n"
	"                   --blocks\n"
	"  --threads N      fill threads (default: one per CPU)\n"
	"  -o, --output F   the file to write\n"
	"  --force          replace F if it exists (when the new one is whole)\n"
	"  -q, --quiet      no progress line and no summary\n"
	"  -h, --help       this text\n"
	"\n"
	"Metadata: {\"format\": \"pt\", \"generator\": \"arena synth\", \"layout\": NAME}.\n"
	"A progress line (bytes, rate, time left) goes to stderr when it is a terminal;\n"
	"a summary line goes to stdout (neither with --quiet).\n"
	"exit status: 0 written, 2 usage error (unknown layout, bad option, no such\n"
	"folder), 3 system error (cannot write, out of memory, interrupted).\n";

static volatile sig_atomic_t interrupted;

static void on_signal(int sig)
{
	(void)sig;
	interrupted = 1;
}

typedef struct progress {
	const char *path;
	cli_progress line;
} progress;

static int on_progress(void *ctx, uint64_t done, uint64_t total)
{
	progress *p = ctx;
	if (interrupted)
		return arena_errorf(ARENA_E_CANCELLED, "%s: interrupted; nothing written", p->path);
	cli_progress_update(&p->line, done, total);
	return 0;
}

static int parse_u64(const char *s, uint64_t max, uint64_t *out)
{
	char *end;
	errno = 0;
	if (!*s || *s == '-' || *s == '+' || *s == ' ')
		return -1;
	int hex = s[0] == '0' && (s[1] == 'x' || s[1] == 'X'); /* decimal or 0x hex, never octal */
	unsigned long long v = strtoull(s, &end, hex ? 16 : 10);
	if (errno || *end || v > max)
		return -1;
	*out = v;
	return 0;
}

int cmd_synth(int argc, char **argv)
{
	const char *layout = NULL, *out = NULL;
	long blocks = -1;
	arena_dtype dtype = ARENA_DTYPE_BF16;
	uint64_t seed = 0, v;
	unsigned threads = 0;
	static const struct option opts[] = {
		{"layout", required_argument, NULL, 'l'}, {"blocks", required_argument, NULL, 'b'},
		{"dtype", required_argument, NULL, 'd'},  {"seed", required_argument, NULL, 's'},
		{"threads", required_argument, NULL, 't'}, {"output", required_argument, NULL, 'o'},
		{"quiet", no_argument, NULL, 'q'},        {"help", no_argument, NULL, 'h'},
		{"force", no_argument, NULL, 'f'},        {NULL, 0, NULL, 0},
	};
	int ch, rc;
	optind = 0;
	opterr = 0;
	int quiet = 0, force = 0;
	while ((ch = getopt_long(argc, argv, ":o:hq", opts, NULL)) != -1) {
		switch (ch) {
		case 'l':
			layout = optarg;
			break;
		case 'b':
			if ((rc = cli_count_arg("synth", "--blocks", optarg, 0, 1000000, &v)))
				return rc;
			blocks = (long)v;
			break;
		case 'd':
			if (strcasecmp(optarg, "bf16") == 0)
				dtype = ARENA_DTYPE_BF16;
			else if (strcasecmp(optarg, "f16") == 0)
				dtype = ARENA_DTYPE_F16;
			else if (strcasecmp(optarg, "f32") == 0)
				dtype = ARENA_DTYPE_F32;
			else
				return cli_usage_error("synth", "--dtype '%s': expected bf16, f16 or f32",
						       arena_q(optarg));
			break;
		case 's':
			if (parse_u64(optarg, UINT64_MAX, &seed))
				return cli_usage_error("synth", "--seed '%s' is not a whole number 0..2^64-1",
						       arena_q(optarg));
			break;
		case 't':
			if ((rc = cli_count_arg("synth", "--threads", optarg, 1, 256, &v)))
				return rc;
			threads = (unsigned)v;
			break;
		case 'o':
			out = optarg;
			break;
		case 'q':
			quiet = 1;
			break;
		case 'f':
			force = 1;
			break;
		case 'h':
			fputs(cmd_synth_usage, stdout);
			return 0;
		case ':':
			return cli_usage_error("synth", "option '%s' needs a value", argv[optind - 1]);
		default:
			return cli_usage_error("synth", "unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind < argc)
		return cli_usage_error("synth", "unexpected argument '%s'", arena_q(argv[optind]));
	if (!layout)
		return cli_usage_error("synth", "--layout is required");
	if (!out)
		return cli_usage_error("synth", "-o FILE is required");

	arena_synth_list list = {0};
	rc = arena_synth_layout_make(layout, blocks, &list);
	if (rc) {
		arena_synth_list_release(&list);
		if (rc == ARENA_E_USAGE)
			return cli_usage_error("synth", "%s", arena_last_error());
		return cli_fail(rc);
	}

	struct sigaction sa, old_int, old_term;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, &old_int);
	sigaction(SIGTERM, &sa, &old_term);

	progress pg = {.path = out};
	cli_progress_start(&pg.line, "synth", quiet);
	arena_synth_opts o = {layout, dtype, seed, threads, on_progress, &pg, force};
	rc = arena_synth_write(out, &list, &o);
	double secs = arena_now_s() - pg.line.start;

	sigaction(SIGINT, &old_int, NULL);
	sigaction(SIGTERM, &old_term, NULL);
	cli_progress_end(&pg.line);
	if (rc) {
		arena_synth_list_release(&list);
		return cli_fail(rc);
	}
	if (quiet) {
		arena_synth_list_release(&list);
		return 0;
	}
	uint64_t params = arena_synth_params(&list);
	uint64_t bytes = params * (arena_dtype_bits(dtype) / 8);
	char b1[32];
	printf("%s: %s, %zu tensor%s, %llu parameter%s, %s %s, written in %.2f s (%.2f GB/s)\n", out, layout,
	       list.n, cli_s(list.n), (unsigned long long)params, cli_s(params), cli_fmt_bytes(bytes, b1, sizeof(b1)),
	       arena_dtype_name(dtype),
	       secs, secs > 0 ? (double)bytes / secs / 1e9 : 0.0);
	arena_synth_list_release(&list);
	return 0;
}
