/* cli.h - shared plumbing of the arena command: the subcommand table,
 * error reporting and option helpers. */
#ifndef ARENA_CLI_H
#define ARENA_CLI_H

#include <stdint.h>
#include <stdio.h>

typedef struct cli_cmd {
	const char *name;
	int (*run)(int argc, char **argv); /* argv[0] is the subcommand name */
	const char *summary;
	const char *usage; /* full --help text */
} cli_cmd;

extern const cli_cmd cli_commands[];

/* The subcommands, one file each (cli/cmd_<name>.c). */
#define CLI_COMMANDS(X) \
	X(convert, "convert a safetensors checkpoint into an arena image") \
	X(verify, "check every byte of an arena image") \
	X(export, "write an arena image back to a safetensors file") \
	X(load, "load an image or checkpoint into device memory, measured") \
	X(plan, "which blocks stay resident and which stream, for a VRAM size") \
	X(bench, "bench stream: run a schedule with streaming on a device or sim") \
	X(inspect, "show tensors, metadata and layout of a checkpoint or image") \
	X(synth, "write a checkpoint with a real model's names and shapes, random values") \
	X(version, "show the version and what this build supports")

#define CLI__DECL(name, summary) \
	int cmd_##name(int argc, char **argv); \
	extern const char cmd_##name##_usage[];
CLI_COMMANDS(CLI__DECL)
#undef CLI__DECL

/* Print "error: <last error>" to stderr and return the exit status for rc. */
int cli_fail(int rc);
/* Print "error: <fmt>" and a hint to run --help; returns 2. */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* If argv has -h/--help, print the usage of `cmd` to stdout and return 1. */
int cli_wants_help(const cli_cmd *cmd, int argc, char **argv);
const cli_cmd *cli_find(const char *name);

/* Parse "8G", "512M", "4096", "1.5GiB" (binary multiples) into bytes. 0 on success. */
int cli_parse_size(const char *s, uint64_t *out);
/* Format bytes as "22.17 GiB" into buf. */
const char *cli_fmt_bytes(uint64_t n, char *buf, size_t len);

/* The residency planner's options, shared by `arena plan`, `arena load` and
 * `arena bench stream`: getopt_long entries (put CLI_ENGINE_OPTIONS in the
 * table), their --help lines, and their parsing into the library's
 * arena_open_options (whose zeros are the defaults: the CLI's defaults are
 * the library's). cli_engine_option returns -1 when ch is not one of them,
 * else 0 or the usage exit status. */
enum { CLI_O_MODE = 1000, CLI_O_DEPTH, CLI_O_KEEP, CLI_O_HEAD, CLI_O_RES };
#define CLI_ENGINE_OPTIONS                                                                                   \
	{"mode", required_argument, NULL, CLI_O_MODE}, {"depth", required_argument, NULL, CLI_O_DEPTH},     \
		{"keep-last", required_argument, NULL, CLI_O_KEEP},                                         \
		{"headroom", required_argument, NULL, CLI_O_HEAD}, {"reserve", required_argument, NULL, CLI_O_RES}
#define CLI_ENGINE_OPTIONS_HELP                                                                   \
	"  --mode sample|train sample: forward in block order (default); train:\n"                \
	"                      forward, then backward in reverse (recompute + backward)\n"          \
	"  --depth N           the ring holds N + 1 of the largest streamed block\n"                 \
	"                      (default 2); copies run ahead as far as it has room\n"               \
	"  --keep-last N       train: extra slots keeping the last forward blocks (default 1)\n"    \
	"  --headroom SIZE     physical slack (default min(512M, 2% of the device or cap))\n"     \
	"  --reserve SIZE      working memory for activations (default 1G sample,\n"              \
	"                      4G train, at most a quarter of what is left)\n"
struct arena_open_options;
int cli_engine_option(const char *cmd, int ch, const char *arg, struct arena_open_options *o);

/* Print a jansson value to stdout (indented, keys in insertion order) and
 * release it. Returns 0, or 3 if writing failed. */
int cli_print_json(void *json);

#endif
