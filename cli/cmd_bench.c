/* cmd_bench.c - `arena bench stream`: run a schedule with a synthetic compute
 * load per block through the engine and report step time against its bound. */
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../arena/engine.h"
#include "../arena/probe.h"
#include "../common/alloc.h"
#include "../common/err.h"
#include "../formats/image.h"
#include "../loader/load.h"
#include "../loader/reread.h"
#include "arena.h"
#include "cli.h"

const char cmd_bench_usage[] =
	"usage: arena bench stream IMAGE [options]\n"
	"\n"
	"Run IMAGE's schedule for a number of steps through the residency engine with\n"
	"a synthetic compute load per block (2 x T x parameters FLOPs at a modelled\n"
	"rate; backward entries of train cost twice that on top of the recompute) and\n"
	"report per step: time, the bound max(compute, streamed bytes / measured\n"
	"host-to-device rate) and efficiency = bound / time; then the same steps with\n"
	"every block resident (compute only) for comparison.\n"
	"\n"
	"options:\n"
	"  --backend sim       device backend (sim only in this build of the command)\n"
	"  --mode sample|train schedule (default sample)\n"
	"  --vram-cap SIZE     device memory arena may use (default: all of the device)\n"
	"  --sim-capacity SIZE the simulated device (default 24G, or the cap if larger)\n"
	"  --sim-bandwidth R   sim host-to-device bytes per second (default 55e9)\n"
	"  --flops R           modelled compute rate, FLOP/s (default 700e12)\n"
	"  --steps N           steps (default 10)\n"
	"  --tokens T          rows of the synthetic GEMM (default 4608: Flux at 1024x1024)\n"
	"  --depth N           copies issued ahead (default 2)\n"
	"  --pressure SIZE@STEP  at STEP take SIZE of device memory (what is free, at\n"
	"                      most), give it back 5 steps later\n"
	"  --strict-vram-cap   over the cap after demoting all it can is an error\n"
	"  --json              machine-readable report (schema in README.md)\n"
	"  -h, --help          this text\n"
	"\n"
	"Exit status: 0 done, 1 invalid image, 2 usage error or the model cannot run\n"
	"within the cap, 3 system error.\n";

/* The synthetic compute of one schedule entry; a backend provides one.
 * sim: modelled time on the stream. (A cuda one, in a *_cuda.c file, runs a
 * bf16 GEMM with T rows over the block's weights at dptr.) */
typedef struct bench_compute {
	int (*run)(void *ctx, arena_stream *s, const void *dptr, uint64_t params, int backward);
	void *ctx;
} bench_compute;

typedef struct sim_compute_ctx {
	arena_backend *be;
	double tokens, flops;
} sim_compute_ctx;

static double entry_seconds(double tokens, double flops, uint64_t params, int backward)
{
	return (backward ? 3.0 : 1.0) * 2.0 * tokens * (double)params / flops;
}

static int sim_compute_run(void *ctx, arena_stream *s, const void *dptr, uint64_t params, int backward)
{
	sim_compute_ctx *c = ctx;
	(void)dptr;
	return arena_backend_sim_compute(c->be, s, entry_seconds(c->tokens, c->flops, params, backward));
}

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

typedef struct step_out {
	double time_s, compute_s, bound_s;
	arena_engine_step rec;
} step_out;

/* Elements of block b's tensors (parameters). */
static uint64_t block_params(const arena_layout *l, uint32_t b)
{
	uint64_t n = 0;
	for (size_t t = 0; t < l->n_tensors; t++) {
		if (l->tensors[t].block != b)
			continue;
		uint64_t e = 1;
		for (uint32_t k = 0; k < l->tensors[t].rank; k++)
			e *= l->tensors[t].shape[k];
		n += e;
	}
	return n;
}

int cmd_bench(int argc, char **argv)
{
	enum { O_BACKEND = 256, O_MODE, O_CAP, O_SIMCAP, O_SIMBW, O_FLOPS, O_STEPS, O_TOKENS, O_DEPTH, O_PRESSURE,
	       O_STRICT, O_JSON };
	static const struct option opts[] = {
		{"backend", required_argument, NULL, O_BACKEND},
		{"mode", required_argument, NULL, O_MODE},
		{"vram-cap", required_argument, NULL, O_CAP},
		{"sim-capacity", required_argument, NULL, O_SIMCAP},
		{"sim-bandwidth", required_argument, NULL, O_SIMBW},
		{"flops", required_argument, NULL, O_FLOPS},
		{"steps", required_argument, NULL, O_STEPS},
		{"tokens", required_argument, NULL, O_TOKENS},
		{"depth", required_argument, NULL, O_DEPTH},
		{"pressure", required_argument, NULL, O_PRESSURE},
		{"strict-vram-cap", no_argument, NULL, O_STRICT},
		{"json", no_argument, NULL, O_JSON},
		{NULL, 0, NULL, 0},
	};
	if (argc < 2 || strcmp(argv[1], "stream"))
		return cli_usage_error("bench", "expected 'stream' (arena bench stream IMAGE)");
	argc--;
	argv++;
	arena_engine_opts o = {.headroom = ARENA_ENGINE_AUTO, .reserve = ARENA_ENGINE_AUTO, .keep_last = 1};
	uint64_t simcap = 0, psize = 0;
	double bw = 55e9, flops = 700e12, tokens = 4608;
	long steps = 10, pstep = -1;
	int json = 0, ch;
	optind = 0;
	opterr = 0;
	while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		char *end;
		switch (ch) {
		case O_BACKEND:
			if (strcmp(optarg, "sim"))
				return cli_usage_error("bench", "--backend '%s': only sim is supported by bench stream so far",
						       optarg);
			break;
		case O_MODE:
			if (strcmp(optarg, "sample") && strcmp(optarg, "train"))
				return cli_usage_error("bench", "--mode '%s': use sample or train", optarg);
			o.mode = !strcmp(optarg, "train") ? ARENA_MODE_TRAIN : ARENA_MODE_SAMPLE;
			break;
		case O_CAP:
			if (cli_parse_size(optarg, &o.cap) || !o.cap)
				return cli_usage_error("bench", "--vram-cap '%s' is not a size", optarg);
			break;
		case O_SIMCAP:
			if (cli_parse_size(optarg, &simcap) || !simcap)
				return cli_usage_error("bench", "--sim-capacity '%s' is not a size", optarg);
			break;
		case O_SIMBW:
			bw = strtod(optarg, &end);
			if (*end || !(bw > 0) || bw > 1e15)
				return cli_usage_error("bench", "--sim-bandwidth '%s' is not a rate in bytes/s", optarg);
			break;
		case O_FLOPS:
			flops = strtod(optarg, &end);
			if (*end || !(flops > 0) || flops > 1e18)
				return cli_usage_error("bench", "--flops '%s' is not a rate in FLOP/s", optarg);
			break;
		case O_STEPS:
			steps = strtol(optarg, &end, 10);
			if (*end || steps < 1 || steps > 100000)
				return cli_usage_error("bench", "--steps '%s' is not a number from 1 to 100000", optarg);
			break;
		case O_TOKENS:
			tokens = (double)strtol(optarg, &end, 10);
			if (*end || tokens < 1 || tokens > 1e7)
				return cli_usage_error("bench", "--tokens '%s' is not a number from 1 to 10000000", optarg);
			break;
		case O_DEPTH: {
			long d = strtol(optarg, &end, 10);
			if (*end || d < 1 || d > 64)
				return cli_usage_error("bench", "--depth '%s' is not a number from 1 to 64", optarg);
			o.depth = (unsigned)d;
			break;
		}
		case O_PRESSURE: {
			char buf[64];
			const char *at = strchr(optarg, '@');
			if (!at || (size_t)(at - optarg) >= sizeof(buf))
				return cli_usage_error("bench", "--pressure '%s' is not SIZE@STEP", optarg);
			memcpy(buf, optarg, (size_t)(at - optarg));
			buf[at - optarg] = 0;
			pstep = strtol(at + 1, &end, 10);
			if (cli_parse_size(buf, &psize) || !psize || *end || at[1] == 0 || pstep < 0)
				return cli_usage_error("bench", "--pressure '%s' is not SIZE@STEP", optarg);
			break;
		}
		case O_STRICT:
			o.strict = 1;
			break;
		case O_JSON:
			json = 1;
			break;
		default:
			return cli_usage_error("bench", "unknown or incomplete option '%s'", argv[optind - 1]);
		}
	}
	if (argc - optind != 1)
		return cli_usage_error("bench", "expected one IMAGE, got %d", argc - optind);
	const char *path = argv[optind];
	if (!simcap)
		simcap = o.cap > (24ull << 30) ? o.cap : (24ull << 30);

	int rc = 0, status = 0;
	arena_backend *be = NULL;
	arena_model *m = NULL;
	arena_slab_reader *rr = NULL;
	arena_engine *e = NULL;
	arena_stream *cs = NULL;
	arena_image *img = NULL;
	uint8_t *on = NULL;
	uint64_t *params = NULL;
	step_out *out = NULL;
	arena_pin_budget budget;
	arena_sim_opts so = {.capacity = simcap, .h2d_bytes_per_s = bw};
	if ((rc = arena_backend_sim_create(&so, &be)))
		goto done;
	arena_pin_budget_probe(&budget, 0, ARENA_PIN_RESERVE_AUTO, "");
	/* Host slabs for everything but globals: the engine puts on the device what stays. */
	if ((rc = arena_img_open(path, &img)))
		goto done;
	size_t n = img->layout->n_blocks;
	on = arena_calloc(n ? n : 1, 1);
	params = arena_calloc(n ? n : 1, sizeof(*params));
	out = arena_calloc((size_t)steps, sizeof(*out));
	if (!on || !params || !out) {
		rc = arena_errorf(ARENA_E_NOMEM, "out of memory");
		goto done;
	}
	for (size_t b = 0; b < n; b++)
		on[b] = (uint8_t)arena_block_is_globals(img->layout, (uint32_t)b);
	arena_img_close(img);
	img = NULL;
	arena_load_opts lo = {.backend = be, .budget = &budget, .on_device = on, .io = ARENA_IO_AUTO};
	if ((rc = arena_load_image(path, &lo, &m, NULL)))
		goto done;
	const arena_layout *l = m->layout;
	for (size_t b = 0; b < n; b++)
		params[b] = block_params(l, (uint32_t)b);
	if ((rc = arena_slab_reader_open(path, l, &rr)))
		goto done;
	o.reread = arena_slab_reader_read;
	o.reread_ctx = rr;
	if ((rc = arena_engine_create(m, &o, &e)))
		goto done;
	if ((rc = be->ops->stream_create(be, &cs)))
		goto done;
	sim_compute_ctx sc = {be, tokens, flops};
	bench_compute comp = {sim_compute_run, &sc};
	/* The host-to-device rate as measured in this run (the second, warm probe). */
	double h2d = 0;
	uint64_t fr = 0, tot = 0, pbytes;
	be->ops->mem_info(be, &fr, &tot);
	pbytes = fr / 4 < (256ull << 20) ? fr / 4 / 4096 * 4096 : (256ull << 20); /* the probe takes it twice */
	if (!pbytes || arena_probe_h2d(be, &budget, pbytes, 0.2, &h2d) || arena_probe_h2d(be, &budget, pbytes, 0.5, &h2d) ||
	    !(h2d > 0)) {
		char why[512];
		snprintf(why, sizeof(why), "%s", pbytes ? arena_last_error() : "no free device memory");
		rc = arena_errorf(ARENA_E_IO, "cannot measure the host-to-device rate: %s", why);
		goto done;
	}
	h2d *= 1e9;
	uint32_t globals = UINT32_MAX;
	for (uint32_t b = 0; b < n; b++)
		if (arena_block_is_globals(l, b) && l->blocks[b].bytes)
			globals = b;
	for (long st = 0; st < steps; st++) {
		if (st == pstep) {
			be->ops->mem_info(be, &fr, &tot);
			if ((rc = arena_backend_sim_pressure(be, psize < fr ? psize : fr)))
				goto done;
		} else if (pstep >= 0 && st == pstep + 5 && (rc = arena_backend_sim_pressure(be, 0))) {
			goto done;
		}
		const arena_residency_plan *p = arena_engine_plan(e);
		double t0 = now_s(), compute = 0;
		void *d;
		if ((rc = arena_engine_step_begin(e)))
			goto done;
		if (globals != UINT32_MAX && (rc = arena_engine_acquire(e, globals, cs, &d)))
			goto done;
		for (size_t i = 0; i < p->n_sched; i++) {
			uint32_t b = p->sched[i];
			int bwd = i >= p->n_sched / 2 && o.mode == ARENA_MODE_TRAIN;
			if ((rc = arena_engine_acquire(e, b, cs, &d)) ||
			    (rc = comp.run(comp.ctx, cs, d, params[b], bwd)) || (rc = arena_engine_release(e, b, cs)))
				goto done;
			compute += entry_seconds(tokens, flops, params[b], bwd);
		}
		if (globals != UINT32_MAX && (rc = arena_engine_release(e, globals, cs)))
			goto done;
		if ((rc = arena_engine_step_end(e)) || (rc = be->ops->stream_sync(be, cs)))
			goto done;
		out[st].time_s = now_s() - t0;
		out[st].compute_s = compute;
		arena_engine_step_record(e, (uint64_t)st, &out[st].rec);
		double copy = (double)out[st].rec.streamed_bytes / h2d;
		out[st].bound_s = compute > copy ? compute : copy;
	}
	/* The same steps with every block resident: compute only. */
	const arena_residency_plan *p = arena_engine_plan(e);
	double res_total = 0;
	long res_steps = steps < 3 ? steps : 3;
	for (long st = 0; st < res_steps; st++) {
		double t0 = now_s();
		for (size_t i = 0; i < p->n_sched; i++) {
			int bwd = i >= p->n_sched / 2 && o.mode == ARENA_MODE_TRAIN;
			if ((rc = comp.run(comp.ctx, cs, NULL, params[p->sched[i]], bwd)))
				goto done;
		}
		if ((rc = be->ops->stream_sync(be, cs)))
			goto done;
		res_total += now_s() - t0;
	}
	double res_step = res_total / (double)res_steps;
	/* Steady state: the steps after the first. */
	double sum_t = 0, sum_b = 0;
	for (long st = steps > 1 ? 1 : 0; st < steps; st++)
		sum_t += out[st].time_s, sum_b += out[st].bound_s;
	double eff = sum_t > 0 ? sum_b / sum_t : 0;
	long cnt = steps > 1 ? steps - 1 : 1;
	if (json) {
		json_t *arr = json_array();
		for (long st = 0; st < steps; st++) {
			const arena_engine_step *r = &out[st].rec;
			json_array_append_new(
				arr, json_pack("{s:i,s:f,s:f,s:f,s:f,s:I,s:I,s:I,s:i,s:f,s:i,s:i,s:b}", "step", (int)st,
					       "time_s", out[st].time_s, "compute_s", out[st].compute_s, "bound_s",
					       out[st].bound_s, "efficiency",
					       out[st].time_s > 0 ? out[st].bound_s / out[st].time_s : 0.0, "streamed_bytes",
					       (json_int_t)r->streamed_bytes, "resident_bytes", (json_int_t)r->resident_bytes,
					       "budget", (json_int_t)r->budget, "stalls", (int)r->stalls, "stall_s",
					       r->stall_s, "demotions", (int)r->demotions, "promotions", (int)r->promotions,
					       "over_budget", r->over_budget));
		}
		json_t *root = json_pack("{s:s,s:s,s:s,s:f,s:f,s:f,s:f,s:I,s:I,s:I}", "path", path, "backend", "sim",
					 "mode", o.mode == ARENA_MODE_TRAIN ? "train" : "sample", "tokens", tokens,
					 "flops", flops, "h2d_bytes_per_s", h2d, "sim_bandwidth", bw, "vram_cap",
					 (json_int_t)o.cap, "sim_capacity", (json_int_t)simcap, "predicted_stream_bytes_per_step",
					 (json_int_t)p->stream_bytes_per_step);
		json_object_set_new(root, "steps", arr);
		json_object_set_new(root, "summary",
				    json_pack("{s:f,s:f,s:f,s:f,s:f}", "step_s", sum_t / (double)cnt, "bound_s",
					      sum_b / (double)cnt, "efficiency", eff, "all_resident_step_s", res_step,
					      "vs_all_resident", res_step > 0 ? sum_t / (double)cnt / res_step : 0.0));
		status = cli_print_json(root);
	} else {
		char a[32], b2[32], c[32];
		printf("bench stream %s on sim (%s, T=%g, %.3g FLOP/s, measured h2d %.2f GB/s)\n", path,
		       o.mode == ARENA_MODE_TRAIN ? "train" : "sample", tokens, flops, h2d / 1e9);
		printf("plan: %zu resident (%s), %zu streamed through %u slots x %s; predicted %s streamed per step\n",
		       p->n_resident, cli_fmt_bytes(p->resident_bytes, a, sizeof(a)), p->n_streamed,
		       p->n_streamed ? p->slots : 0, cli_fmt_bytes(p->slot_bytes, b2, sizeof(b2)),
		       cli_fmt_bytes(p->stream_bytes_per_step, c, sizeof(c)));
		printf("%5s %9s %9s %9s %6s %12s %12s %6s %8s %4s %4s\n", "step", "time_s", "compute", "bound", "eff",
		       "streamed", "resident", "stalls", "stall_s", "dem", "pro");
		for (long st = 0; st < steps; st++) {
			const arena_engine_step *r = &out[st].rec;
			printf("%5ld %9.4f %9.4f %9.4f %6.3f %12s %12s %6u %8.4f %4u %4u%s\n", st, out[st].time_s,
			       out[st].compute_s, out[st].bound_s, out[st].time_s > 0 ? out[st].bound_s / out[st].time_s : 0,
			       cli_fmt_bytes(r->streamed_bytes, a, sizeof(a)), cli_fmt_bytes(r->resident_bytes, b2, sizeof(b2)),
			       r->stalls, r->stall_s, r->demotions, r->promotions, r->over_budget ? " over budget" : "");
		}
		printf("steady state: %.4f s/step, bound %.4f s, efficiency %.3f; all resident %.4f s/step (%.3fx)\n",
		       sum_t / (double)cnt, sum_b / (double)cnt, eff, res_step,
		       res_step > 0 ? sum_t / (double)cnt / res_step : 0.0);
	}
done:
	if (cs)
		be->ops->stream_destroy(be, cs);
	arena_engine_free(e);
	arena_slab_reader_close(rr);
	arena_model_free(m);
	arena_img_close(img);
	arena_backend_destroy(be);
	arena_free(on);
	arena_free(params);
	arena_free(out);
	return rc ? cli_fail(rc) : status;
}
