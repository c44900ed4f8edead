/* main.c - the arena command: dispatch to one subcommand per file. */
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "../engine/engine.h"
#include "../common/alloc.h"
#include "../common/err.h"
#include "../common/units.h"
#include "../formats/scheme.h"
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
	uint64_t n;
	int rc;
	switch (ch) {
	case CLI_O_MODE:
		if (strcmp(arg, "sample") && strcmp(arg, "train"))
			return cli_usage_error(cmd, "--mode '%s': use sample or train", arena_q(arg));
		o->mode = !strcmp(arg, "train") ? ARENA_MODE_TRAIN : ARENA_MODE_SAMPLE;
		return 0;
	case CLI_O_DEPTH:
		if ((rc = cli_count_arg(cmd, "--depth", arg, 1, 64, &n)))
			return rc;
		o->depth = (unsigned)n;
		return 0;
	case CLI_O_KEEP:
		if ((rc = cli_count_arg(cmd, "--keep-last", arg, 0, 64, &n)))
			return rc;
		o->keep_last = n ? (unsigned)n : ARENA_ZERO_COUNT;
		return 0;
	case CLI_O_HEAD:
	case CLI_O_RES:
		if ((rc = cli_size_arg(cmd, ch == CLI_O_HEAD ? "--headroom" : "--reserve", arg, 0, &n)))
			return rc;
		*(ch == CLI_O_HEAD ? &o->headroom : &o->reserve) = n ? n : ARENA_ZERO_BYTES;
		return 0;
	case CLI_O_HOST:
		if ((rc = cli_size_arg(cmd, "--host-budget", arg, 0, &n)))
			return rc;
		o->host_budget = n ? n : ARENA_ZERO_BYTES;
		return 0;
	case CLI_O_PIECE:
		if (!strcmp(arg, "auto")) {
			o->piece_size = ARENA_PIECE_AUTO;
			return 0;
		}
		return cli_size_arg(cmd, "--piece-size", arg, 1, &o->piece_size);
	default:
		return -1;
	}
}

const char *cli_opt_name(const struct option *opts, int index, char *buf, size_t len)
{
	snprintf(buf, len, "--%s", index >= 0 ? opts[index].name : "?");
	return buf;
}

int cli_size_arg(const char *cmd, const char *opt, const char *arg, uint64_t min, uint64_t *out)
{
	uint64_t v;
	int rc = arena_size_parse(arg, &v);
	if (rc == ARENA_PARSE_RANGE)
		return cli_usage_error(cmd, "%s '%s' is 2^64 bytes or more", opt, arena_q(arg));
	if (rc)
		return cli_usage_error(cmd, "%s '%s' is not a size: a number of bytes with an optional unit K, M, G or T, e.g. 64K or 1.5G",
				       opt, arena_q(arg));
	if (v < min) {
		char b[32];
		if (min == 1)
			return cli_usage_error(cmd, "%s '%s': the size must be more than 0", opt, arena_q(arg));
		return cli_usage_error(cmd, "%s '%s': the size must be at least %s", opt, arena_q(arg),
				       cli_fmt_bytes(min, b, sizeof(b)));
	}
	*out = v;
	return 0;
}

int cli_quant_arg(const char *cmd, const char *arg)
{
	arena_quant_scheme s;
	if (!arena_quant_from_name(arg, &s))
		return 0;
	arena_error_clear();
	char list[256] = "";
	for (unsigned i = 0; i < ARENA_QUANT_COUNT; i++) {
		size_t n = strlen(list);
		snprintf(list + n, sizeof(list) - n, "%s%s", i ? ", " : "", arena_quant_name((arena_quant_scheme)i));
	}
	return cli_usage_error(cmd, "--quant '%s' is not a scheme: %s", arena_q(arg), list);
}

int cli_pressure_arg(const char *cmd, const char *opt, const char *arg, uint64_t *size, uint64_t *step)
{
	char buf[64];
	const char *at = strchr(arg, '@');
	if (!at || (size_t)(at - arg) >= sizeof(buf) || arena_count_parse(at + 1, 0, 100000, step))
		return cli_usage_error(cmd, "%s '%s' is not SIZE@STEP: a size as for --vram, then a step number from 0 to 100000",
				       opt, arena_q(arg));
	memcpy(buf, arg, (size_t)(at - arg));
	buf[at - arg] = 0;
	if (arena_size_parse(buf, size) || !*size)
		return cli_usage_error(cmd, "%s '%s' is not SIZE@STEP: a size above 0 as for --vram, then a step number from 0 to 100000",
				       opt, arena_q(arg));
	return 0;
}

int cli_count_arg(const char *cmd, const char *opt, const char *arg, uint64_t min, uint64_t max, uint64_t *out)
{
	if (arena_count_parse(arg, min, max, out))
		return cli_usage_error(cmd, "%s '%s' is not a whole number from %llu to %llu", opt, arena_q(arg),
				       (unsigned long long)min, (unsigned long long)max);
	return 0;
}

int cli_rate_arg(const char *cmd, const char *opt, const char *arg, double min, double max, double *out)
{
	if (arena_rate_parse(arg, max, out) || *out < min) {
		if (min > 0)
			return cli_usage_error(cmd, "%s '%s' is not a number from %g to %g: digits, an optional fraction and "
						    "exponent, e.g. 55e9",
					       opt, arena_q(arg), min, max);
		return cli_usage_error(cmd, "%s '%s' is not a number above 0 and at most %g: digits, an optional fraction and exponent, e.g. 55e9",
				       opt, arena_q(arg), max);
	}
	return 0;
}

const char *cli_fmt_bytes(uint64_t n, char *buf, size_t len)
{
	return arena_size_str(n, buf, len);
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

void *cli_json_u64(uint64_t v)
{
	return v <= (uint64_t)INT64_MAX ? json_integer((json_int_t)v) : json_real((double)v);
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
