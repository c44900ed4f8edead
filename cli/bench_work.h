/* bench_work.h - what `arena bench stream` does besides driving the engine:
 * the caller's synthetic work per block, the limit it is measured against
 * (the host-to-device rate), and memory taken as another program would.
 *
 * The engine itself is driven through include/arena.h only (cmd_bench.c),
 * so that the benchmark measures what a caller gets. This part stands for
 * the caller and its machine and uses the library's internals for that: on
 * cuda a device backend of its own (the same device: its streams and
 * allocations are another user of the GPU, as a trainer's are), a cuBLAS
 * GEMM over each acquired block (device/gemm.h), the pinned copy probe; on
 * sim the caller's work is host time (the sim backend's caller stream is
 * the host: acquire returns once the bytes are there).
 *
 * Nothing here is exported by libarena.so; it is part of the command. */
#ifndef ARENA_CLI_BENCH_WORK_H
#define ARENA_CLI_BENCH_WORK_H

#include <stdint.h>

#include "arena.h"

typedef struct bench_work bench_work;

/* cuda: device 0, a stream and a GEMM with `tokens` rows for blocks of up to
 * max_params bf16 parameters (NO_DEVICE: "cuBLAS not found", ...). sim: the
 * work is modelled at `flops` (2 x tokens x params per forward entry) and
 * the host-to-device rate is sim_bandwidth. */
int bench_work_create(int cuda, double tokens, double flops, uint64_t max_params, double sim_bandwidth,
		      bench_work **out);
void bench_work_free(bench_work *w);

/* The native stream the work runs on (acquire and release take it): the
 * cudaStream_t on cuda, NULL on sim. */
void *bench_work_stream(const bench_work *w);

/* The work of one schedule entry over the block at dptr: cuda queues the
 * GEMM (three for a backward entry) on the stream; sim sleeps the modelled
 * time. */
int bench_work_run(bench_work *w, const void *dptr, uint64_t params, int backward);
/* Wait for the work queued (cuda); 0 at once on sim. */
int bench_work_sync(bench_work *w);
/* Modelled seconds of an entry at `flops`. */
double bench_work_model_s(const bench_work *w, uint64_t params, int backward);
/* cuda: time the forward work over dptr (a warm-up, then the mean of two);
 * sim: the model. */
int bench_work_time(bench_work *w, const void *dptr, uint64_t params, double *seconds);

/* The host-to-device rate of this machine, measured now (cuda: pinned
 * copies; sim: a simulator at the same modelled rate), bytes per second. */
int bench_work_h2d(bench_work *w, double *bytes_per_s);

/* Take device memory as another program would: cuda allocates up to `want`
 * (256 MiB less at a time while the device refuses), sim takes it from the
 * arena's simulated device (at most `free_hint`). *got says how much. */
int bench_work_take(bench_work *w, arena *a, uint64_t want, uint64_t free_hint, uint64_t *got);
/* Give back all taken. */
void bench_work_give(bench_work *w, arena *a);
/* cuda: hold all of the device's memory but `keep` from now on (a smaller
 * card); *held says how much. */
int bench_work_ballast(bench_work *w, uint64_t keep, uint64_t *held);

#endif
