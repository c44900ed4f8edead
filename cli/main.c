/* main.c - the arena command: dispatch to one subcommand per file. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "../arena/engine.h"
#include "../common/alloc.h"
#include "arena.h"
#include "cli.h"

const cli_cmd cli_commands[] = {
#define CLI__ROW(name, summary) {#name, cmd_##name, summary, cmd_##name##_usage},
	CLI_COMMANDS(CLI__ROW)
#undef CLI__ROW
	{NULL, NULL, NULL, NULL},
};

static void usage(FILE *out)
{
	fprintf(out, "usage: arena <command> [options]\n\ncommands:\n");
	for (const cli_cmd *c = cli_commands; c->name; c++)
		fprintf(out, "  %-10s %s\n", c->name, c->summary);
	fprintf(out,
		"\n'arena <command> --help' describes a command.\n"
		"exit status: 0 success, 1 invalid or corrupt input, 2 usage error,\n"
		"3 system error (I/O, out of memory, device).\n");
}

const cli_cmd *cli_find(const char *name)
{
	for (const cli_cmd *c = cli_commands; c->name; c++)
		if (strcmp(c->name, name) == 0)
			return c;
	return NULL;
}

int cli_fail(int rc)
{
	const char *msg = arena_last_error();
	fprintf(stderr, "error: %s\n", *msg ? msg : arena_strerror(rc));
	return arena_err_class(rc);
}

int cli_usage_error(const char *cmd, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "error: %s: ", cmd);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, " (see 'arena %s --help')\n", cmd);
	return 2;
}

int cli_wants_help(const cli_cmd *cmd, int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--") == 0)
			break;
		if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
			fputs(cmd->usage, stdout);
			return 1;
		}
	}
	return 0;
}

int cli_engine_option(const char *cmd, int ch, const char *arg, arena_open_options *o)
{
	char *end;
	long n;
	switch (ch) {
	case CLI_O_MODE:
		if (strcmp(arg, "sample") && strcmp(arg, "train"))
			return cli_usage_error(cmd, "--mode '%s': use sample or train", arg);
		o->mode = !strcmp(arg, "train") ? ARENA_MODE_TRAIN : ARENA_MODE_SAMPLE;
		return 0;
	case CLI_O_DEPTH:
	case CLI_O_KEEP:
		n = strtol(arg, &end, 10);
		if (*end || end == arg || n < (ch == CLI_O_DEPTH) || n > 64)
			return cli_usage_error(cmd, "%s '%s' is not a number from %d to 64",
					       ch == CLI_O_DEPTH ? "--depth" : "--keep-last", arg, ch == CLI_O_DEPTH);
		if (ch == CLI_O_DEPTH)
			o->depth = (unsigned)n;
		else
			o->keep_last = n ? (unsigned)n : ARENA_ZERO_COUNT;
		return 0;
	case CLI_O_HEAD:
	case CLI_O_RES: {
		uint64_t v;
		if (cli_parse_size(arg, &v))
			return cli_usage_error(cmd, "%s '%s' is not a size", ch == CLI_O_HEAD ? "--headroom" : "--reserve",
					       arg);
		*(ch == CLI_O_HEAD ? &o->headroom : &o->reserve) = v ? v : ARENA_ZERO_BYTES;
		return 0;
	}
	default:
		return -1;
	}
}

int cli_parse_size(const char *s, uint64_t *out)
{
	char *end;
	double v = strtod(s, &end);
	if (end == s || v < 0)
		return -1;
	double mul = 1;
	switch (*end) {
	case 'k': case 'K': mul = 1024.0; end++; break;
	case 'm': case 'M': mul = 1024.0 * 1024; end++; break;
	case 'g': case 'G': mul = 1024.0 * 1024 * 1024; end++; break;
	case 't': case 'T': mul = 1024.0 * 1024 * 1024 * 1024; end++; break;
	default: break;
	}
	if (mul > 1 && (strcmp(end, "iB") == 0 || strcmp(end, "B") == 0))
		end += strlen(end);
	else if (mul == 1 && strcmp(end, "B") == 0)
		end++;
	if (*end)
		return -1;
	double b = v * mul;
	if (b >= 18446744073709551615.0)
		return -1;
	*out = (uint64_t)b;
	return 0;
}

const char *cli_fmt_bytes(uint64_t n, char *buf, size_t len)
{
	const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
	double v = (double)n;
	int u = 0;
	while (v >= 1024 && u < 4)
		v /= 1024, u++;
	if (u == 0)
		snprintf(buf, len, "%llu B", (unsigned long long)n);
	else
		snprintf(buf, len, "%.2f %s", v, units[u]);
	return buf;
}

int cli_print_json(void *json)
{
	int rc = json_dumpf((json_t *)json, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
	json_decref((json_t *)json);
	if (rc || fputc('\n', stdout) == EOF || fflush(stdout)) {
		fprintf(stderr, "error: cannot write JSON to standard output\n");
		return 3;
	}
	return 0;
}

int main(int argc, char **argv)
{
	arena_alloc_init();
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "help") == 0) {
		if (argc > 2 && cli_find(argv[2])) {
			fputs(cli_find(argv[2])->usage, stdout);
			return 0;
		}
		usage(stdout);
		return 0;
	}
	if (strcmp(argv[1], "--version") == 0)
		argv[1] = "version";
	const cli_cmd *c = cli_find(argv[1]);
	if (!c) {
		fprintf(stderr, "error: '%s' is not an arena command\n\n", argv[1]);
		usage(stderr);
		return 2;
	}
	if (cli_wants_help(c, argc - 1, argv + 1))
		return 0;
	int rc = c->run(argc - 1, argv + 1);
	if (fflush(stdout) != 0 && rc == 0) {
		fprintf(stderr, "error: cannot write to standard output\n");
		rc = 3;
	}
	return rc;
}
