/* cli.h - shared plumbing of the arena command: the subcommand table,
 * error reporting and option helpers. */
#ifndef ARENA_CLI_H
#define ARENA_CLI_H

#include <pthread.h>
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
	X(cache, "the cache of converted images: list, verify, prune") \
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

/* Option arguments, one grammar each (common/units.h). Each returns 0 with
 * *out set, or prints a one-line usage error naming `cmd`, `opt` and `arg`
 * and returns 2 (the usage exit status).
 * cli_size_arg: a SIZE of at least `min` bytes ("8G", "512M", "1.5GiB").
 * cli_count_arg: a whole number from min to max, decimal digits only.
 * cli_rate_arg: a number above 0, at least min and at most max, exponent allowed ("700e12"). */
int cli_size_arg(const char *cmd, const char *opt, const char *arg, uint64_t min, uint64_t *out);
int cli_count_arg(const char *cmd, const char *opt, const char *arg, uint64_t min, uint64_t max, uint64_t *out);
int cli_rate_arg(const char *cmd, const char *opt, const char *arg, double min, double max, double *out);
/* A quantization scheme (--quant of convert and load): 0 when `arg` names
 * one, else a usage error that lists them. */
int cli_quant_arg(const char *cmd, const char *arg);
/* SIZE@STEP (bench stream --pressure): a SIZE above 0 and a step from 0 to 100000. */
int cli_pressure_arg(const char *cmd, const char *opt, const char *arg, uint64_t *size, uint64_t *step);
/* The device memory a command may use (plan, load, bench stream): --vram
 * SIZE, also accepted by its older name --vram-cap (getopt_long entries, both
 * with the value `val`), and the --help line that says so. */
#define CLI_VRAM_OPTIONS(val) {"vram", required_argument, NULL, (val)}, {"vram-cap", required_argument, NULL, (val)}
#define CLI_VRAM_ALIAS_HELP "                      (--vram-cap is another name for --vram)\n"
/* "--NAME" of the long option opts[index] (as given: an alias by its own
 * name), for messages; "--?" when index is not one. */
struct option;
const char *cli_opt_name(const struct option *opts, int index, char *buf, size_t len);
/* What a SIZE is, for the --help of each command that takes one. */
#define CLI_SIZE_HELP                                                                   \
	"SIZE: a number of bytes, whole or with a fraction, with an optional unit K, M,\n" \
	"G or T in either case (powers of 1024; KiB or KB mean the same as K), e.g.\n"     \
	"4096, 64K, 1.5G, 8gb; no sign, spaces, exponent or hex.\n"
/* The plural ending of a count's noun: "" for 1, else "s" ("1 chunk", "2 chunks"). */
static inline const char *cli_s(uint64_t n)
{
	return n == 1 ? "" : "s";
}
/* Bytes in the unit that fits them: "512 B", "331.50 KiB", "22.17 GiB". */
const char *cli_fmt_bytes(uint64_t n, char *buf, size_t len);

/* The residency planner's options, shared by `arena plan`, `arena load` and
 * `arena bench stream`: getopt_long entries (put CLI_ENGINE_OPTIONS in the
 * table), their --help lines, and their parsing into the library's
 * arena_open_options (whose zeros are the defaults: the CLI's defaults are
 * the library's). cli_engine_option returns -1 when ch is not one of them,
 * else 0 or the usage exit status. */
enum { CLI_O_MODE = 1000, CLI_O_DEPTH, CLI_O_KEEP, CLI_O_HEAD, CLI_O_RES, CLI_O_PIECE, CLI_O_HOST };
#define CLI_ENGINE_OPTIONS                                                                                   \
	{"mode", required_argument, NULL, CLI_O_MODE}, {"depth", required_argument, NULL, CLI_O_DEPTH},     \
		{"keep-last", required_argument, NULL, CLI_O_KEEP},                                         \
		{"headroom", required_argument, NULL, CLI_O_HEAD}, {"reserve", required_argument, NULL, CLI_O_RES}, \
		{"piece-size", required_argument, NULL, CLI_O_PIECE}, {"host-budget", required_argument, NULL, CLI_O_HOST}
#define CLI_ENGINE_OPTIONS_HELP                                                                   \
	"  --mode sample|train sample: forward in block order (default); train:\n"                \
	"                      forward, then backward in reverse (recompute + backward)\n"          \
	"  --depth N           the ring holds N + 1 of the largest streamed block\n"                 \
	"                      (default 2); copies run ahead as far as it has room\n"               \
	"  --keep-last N       train: extra slots keeping the last forward blocks (default 1)\n"    \
	"  --headroom SIZE     physical slack (default min(512M, 2% of the device or cap))\n"     \
	"  --reserve SIZE      working memory for activations (default 1G sample,\n"              \
	"                      4G train, at most a quarter of what is left)\n"                     \
	"  --piece-size SIZE|auto  images: stream blocks larger than SIZE in pieces, cut\n"     \
	"                      where a module's tensors start, at most SIZE unless one\n"        \
	"                      module is larger: the ring holds pieces, more stays\n"            \
	"                      resident, the model runs in less memory (plan shows the\n"        \
	"                      floor); auto: whole blocks when all fit (train: when they\n"   \
	"                      fit at all), else pieces of an eighth of the largest\n"        \
	"                      block (64M for Flux; train: a third in whole eighths,\n"      \
	"                      192M) or smaller ones that fit; default whole blocks\n"       \
	"  --host-budget SIZE  images: all the host memory the weights take: streamed\n"       \
	"                      blocks' copies, and the staging the blocks beyond it are\n"  \
	"                      read through from the image, checked, when streamed (a\n"    \
	"                      quarter of it, up to 384M; at least two read slots of up\n"  \
	"                      to 64M and the readers' chunk buffers). Default:\n"          \
	"                      MemAvailable less a reserve; 0: that least, no copies\n"
struct arena_open_options;
int cli_engine_option(const char *cmd, int ch, const char *arg, struct arena_open_options *o);

/* A progress line for a command that can take more than a second: on
 * stderr, redrawn in place ("LABEL: 3.20 GiB / 22.17 GiB (14%), 2.10 GB/s,
 * 9 s left"), at most ten times a second and always at the end; nothing
 * when stderr is not a terminal or the command is --quiet. update has the
 * library's progress callback signature (ctx = the cli_progress) and may be
 * called from any thread; end finishes the line (before a summary or an
 * error line). */
typedef struct cli_progress {
	const char *label;
	int on, shown, final;
	double start, last;
	uint64_t done;
	pthread_mutex_t mu;
} cli_progress;
void cli_progress_start(cli_progress *p, const char *label, int quiet);
void cli_progress_update(void *ctx, uint64_t done, uint64_t total);
void cli_progress_end(cli_progress *p);

/* Print a jansson value to stdout (indented, keys in insertion order) and
 * release it. Returns 0, or 3 if writing failed. */
int cli_print_json(void *json);
/* A byte count as a JSON number (a json_t *): an integer up to INT64_MAX,
 * past it (a size given up to 2^64 - 1) a real, never a negative integer. */
void *cli_json_u64(uint64_t v);

#endif
