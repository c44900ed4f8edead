/* cmd_bench_int.h - what the parts of `arena bench stream` share: its
 * options, the caller's loop, the run's state and results. The parts:
 * cmd_bench.c (usage, options, the command), cmd_bench_run.c (the caller's
 * loop through the engine, and the all-resident run for the bound) and
 * cmd_bench_report.c (the steady state and the report, text or JSON). The
 * caller's work, limit and outside memory are bench_work.c's. */
#ifndef ARENA_CLI_CMD_BENCH_INT_H
#define ARENA_CLI_CMD_BENCH_INT_H

#include <stdint.h>

#include "arena.h"
#include "bench_work.h"

/* The command line, checked and with its defaults filled in. */
typedef struct bench_stream_opts {
	arena_open_options ao; /* backend, cap, mode and the engine options, as arena_open takes them */
	const char *path;
	uint64_t cap, simcap, psize, devfree;
	double bw, flops, tokens;
	long steps, pstep, passes, every; /* pstep: --pressure's step, or -1 */
	int json, cuda;
	int profile; /* 0 none, 1 given, 2 learn */
	const char *save_profile, *trace;
	int log; /* --log: each decision of the engine on stderr as it is made */
} bench_stream_opts;

typedef struct step_out {
	int mode, passes;
	double time_s, compute_s, bound_s;
	uint64_t pressure_bytes; /* held by --pressure during the step */
	arena_step_info rec;
} step_out;

/* The caller's loop. */
typedef struct bench_loop {
	arena *a;
	bench_work *w;
	size_t n;           /* blocks */
	uint32_t globals;   /* UINT32_MAX: none */
	const uint64_t *params;
	uint32_t *order;    /* one step's entries */
	uint8_t *bwd;
} bench_loop;

/* A run: what it holds (bench_stream_free lets it go) and what it found. */
typedef struct bench_stream_state {
	bench_work *w;
	arena *a;
	bench_loop L;
	uint64_t *params;
	double *cost;
	step_out *out;       /* o->steps entries, bound_s filled in */
	double h2d;          /* the measured host-to-device rate, bytes per second */
	uint64_t bheld;      /* --device-free: device bytes held from the start */
	int measured;        /* cuda: compute_s is the all-resident run's step time */
	arena_plan_info p;   /* the plan the run ended with */
	arena_decision_info *dec; /* the engine's decisions in the run (the last 256 of them) */
	size_t n_dec;
	int status;          /* an exit status for a failure reported here (3: out of memory) */
} bench_stream_state;

/* One decision as a line of text (no newline): "step 4: learned: promoted 3
 * blocks (1.20 GiB), demoted 0; ...". */
void bench_decision_line(const arena_decision_info *d, char *buf, size_t len);

/* Run o's steps (and on cuda the all-resident run) into S. Returns an arena
 * error code, or 0 with S->status set when it reported a failure itself. */
int bench_stream_run(const bench_stream_opts *o, bench_stream_state *S);
/* Print the report of a run that succeeded; returns the exit status. */
int bench_stream_report(const bench_stream_opts *o, const bench_stream_state *S);
/* Give back what S holds (the ballast, the arena, the work, the arrays). */
void bench_stream_free(bench_stream_state *S);

#endif
