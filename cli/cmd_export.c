/* cmd_export.c - `arena export`: arena image -> safetensors. */
#include <getopt.h>
#include <stdio.h>

#include "../convert/export.h"
#include "arena.h"
#include "cli.h"

const char cmd_export_usage[] =
	"usage: arena export IMAGE -o OUT.safetensors [--force] [--quiet]\n"
	"\n"
	"Write an arena image back to a standard safetensors file with the original\n"
	"names, dtypes, shapes and metadata; unquantized tensors' bytes are identical\n"
	"to the source. Quantized tensors are written in the compressed-tensors\n"
	"convention: '<name>' holds the quantized data, '<name>_scale' its scale.\n"
	"The image is verified first; OUT appears whole or not at all, and may not be\n"
	"IMAGE itself; an existing OUT is replaced only with --force.\n"
	"\n"
	"options:\n"
	"  -o, --output FILE   the safetensors file to write (required)\n"
	"  --force             replace FILE if it exists (when the new one is whole)\n"
	"  -q, --quiet         no progress line and no summary line (the progress line\n"
	"                      goes to stderr when it is a terminal)\n"
	"  -h, --help          this text\n";

int cmd_export(int argc, char **argv)
{
	static const struct option opts[] = {
		{"output", required_argument, NULL, 'o'}, {"quiet", no_argument, NULL, 'q'},
		{"force", no_argument, NULL, 'f'},        {NULL, 0, NULL, 0}};
	const char *out = NULL;
	int quiet = 0, force = 0, ch;
	optind = 0;
	opterr = 0;
	while ((ch = getopt_long(argc, argv, "o:q", opts, NULL)) != -1) {
		if (ch == 'o')
			out = optarg;
		else if (ch == 'q')
			quiet = 1;
		else if (ch == 'f') /* --force: no short form ("o:q") */
			force = 1;
		else
			return cli_usage_error("export", "unknown or incomplete option '%s'", argv[optind - 1]);
	}
	if (!out)
		return cli_usage_error("export", "no output given (-o OUT.safetensors)");
	if (argc - optind != 1)
		return cli_usage_error("export", "expected one IMAGE, got %d", argc - optind);
	arena_export_result res;
	cli_progress pg;
	cli_progress_start(&pg, "export", quiet);
	int rc = arena_export_progress(argv[optind], out, 0, &res, cli_progress_update, &pg, force);
	cli_progress_end(&pg);
	if (rc)
		return cli_fail(rc);
	if (!quiet)
		printf("wrote %s: %llu tensor%s, %llu byte%s\n", out, res.tensors, cli_s(res.tensors), res.file_size,
		       cli_s(res.file_size));
	return 0;
}
