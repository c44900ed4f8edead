/* cmd_bench.c - `arena bench stream`: run a schedule with a synthetic compute
 * load per block through the engine and report step time against its bound.
 * sim: modelled compute, compared with the same compute alone; cuda: a bf16
 * cuBLAS GEMM per block (arena/gemm.h), compared with a real run of the
 * engine with every block resident, whose step time is the compute. */
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../arena/engine.h"
#include "../arena/gemm.h"
#include "../arena/profile.h"
#include "../arena/probe.h"
#include "../common/alloc.h"
#include "../common/clock.h"
#include "../common/err.h"
#include "../common/units.h"
#include "../formats/image.h"
#include "../loader/load.h"
#include "../loader/reread.h"
#include "arena.h"
#include "cli.h"

const char cmd_bench_usage[] =
	"usage: arena bench stream IMAGE [options]\n"
	"\n"
	"Run IMAGE's schedule for a number of steps through the residency engine with\n"
	"a synthetic compute load per block of 2 x T x parameters FLOPs (backward\n"
	"entries of train cost twice that on top of the recompute) and report per\n"
	"step: time, the bound max(compute, streamed bytes / measured host-to-device\n"
	"rate) and efficiency = bound / time. sim: the compute is modelled at --flops\n"
	"and compared with the same compute alone. cuda: a bf16 cuBLAS GEMM with T\n"
	"rows over the block's bytes (parameters = bytes / 2; cuBLAS is loaded at run\n"
	"time), compared with a real run with every block resident, whose step time\n"
	"is the compute of the bound (modelled at --flops if the model does not fit).\n"
	"\n"
	"options:\n"
	"  --backend sim|cuda  device backend (default sim; cuda uses device 0)\n"
	"  --vram-cap SIZE     device memory arena may use (default: all of the device)\n"
	"  --sim-capacity SIZE the simulated device (default 24G, or the cap if larger)\n"
	"  --sim-bandwidth R   sim host-to-device bytes per second (default 55e9)\n"
	"  --device-free SIZE  cuda: hold the device's memory but SIZE from the start,\n"
	"                      as another program would (a smaller card)\n"
	"  --flops R           modelled compute rate, FLOP/s (default 700e12)\n"
	"  --steps N           steps (default 10)\n"
	"  --tokens T          rows of the synthetic GEMM (default 4608: Flux at 1024x1024)\n"
	CLI_ENGINE_OPTIONS_HELP
	"  --pressure SIZE@STEP  at STEP take SIZE of device memory (what is free, at\n"
	"                      most), give it back 5 steps later (cuda: allocated)\n"
	"  --strict-vram-cap   over the cap after demoting all it can is an error\n"
	"  --profile learn|given|none\n"
	"                      the compute profile the planner places blocks by:\n"
	"                      learn (default): the engine times each block on the\n"
	"                      device during the first steps and re-plans by it;\n"
	"                      given: each block's compute timed before the run (cuda)\n"
	"                      or modelled (sim) and given to the engine; none: by bytes\n"
	"  --save-profile FILE write the profile the engine ended with (learned or given;\n"
	"                      the rate: the engine's, else this run's probe) for\n"
	"                      `arena plan --profile` (format in arena/profile.h)\n"
	"  --json              machine-readable report (schema in README.md)\n"
	"  -h, --help          this text\n"
	"\n"
	CLI_SIZE_HELP
	"\n"
	"Exit status: 0 done, 1 invalid image, 2 usage error or the model cannot run\n"
	"within the cap, 3 system error (no CUDA device, cuBLAS not found, ...).\n";

/* The synthetic compute of one schedule entry; a backend provides one.
 * sim: modelled time on the stream; cuda: the GEMM over the block's bytes at
 * dptr (three times for a backward entry). */
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

static int gemm_compute_run(void *ctx, arena_stream *s, const void *dptr, uint64_t params, int backward)
{
	int rc = 0;
	for (int i = 0; i < (backward ? 3 : 1) && !rc; i++)
		rc = arena_gemm_run(ctx, s, dptr, params);
	return rc;
}

/* Take up to `want` bytes of device memory, as another program would: on
 * sim as injected pressure; on cuda allocated, 256 MiB less at a time while
 * the device refuses (a device never hands out all it calls free). */
static int dev_take(arena_backend *be, int cuda, uint64_t want, void **held, uint64_t *got)
{
	*held = NULL;
	*got = 0;
	if (!cuda) {
		uint64_t f0 = 0, f1 = 0, t = 0;
		be->ops->mem_info(be, &f0, &t);
		int rc = arena_backend_sim_pressure(be, want);
		be->ops->mem_info(be, &f1, &t);
		*got = f0 > f1 ? f0 - f1 : 0;
		return rc;
	}
	while (want >= (256ull << 20)) {
		int rc = be->ops->dev_alloc(be, want, held);
		if (rc != ARENA_E(DEV_OOM)) {
			*got = rc ? 0 : want;
			return rc;
		}
		arena_error_clear();
		want -= 256ull << 20;
	}
	return 0;
}

static void dev_give(arena_backend *be, int cuda, void **held)
{
	if (cuda)
		be->ops->dev_free(be, *held);
	else if (arena_backend_sim_pressure(be, 0))
		arena_error_clear();
	*held = NULL;
}

typedef struct step_out {
	double time_s, compute_s, bound_s;
	uint64_t pressure_bytes; /* held by --pressure during the step */
	arena_engine_step rec;
} step_out;

/* What one step needs besides the engine. */
typedef struct bench_run {
	arena_backend *be;
	arena_stream *cs; /* the compute stream */
	bench_compute comp;
	const uint64_t *params; /* per block */
	uint32_t globals;       /* UINT32_MAX: none */
	int train;
} bench_run;

/* One step through e: every entry acquired, computed and released in
 * schedule order; returns when the step's work is done, *t its seconds. */
static int bench_step(const bench_run *r, arena_engine *e, double *t)
{
	const arena_residency_plan *p = arena_engine_plan(e);
	double t0 = arena_now_s();
	void *d;
	int rc = arena_engine_step_begin(e);
	if (!rc && r->globals != UINT32_MAX)
		rc = arena_engine_acquire(e, r->globals, r->cs, &d);
	for (size_t i = 0; !rc && i < p->n_sched; i++) {
		uint32_t b = p->sched[i];
		int bwd = i >= p->n_sched / 2 && r->train;
		if (!(rc = arena_engine_acquire(e, b, r->cs, &d)) && !(rc = r->comp.run(r->comp.ctx, r->cs, d, r->params[b], bwd)))
			rc = arena_engine_release(e, b, r->cs);
	}
	if (!rc && r->globals != UINT32_MAX)
		rc = arena_engine_release(e, r->globals, r->cs);
	if (!rc && !(rc = arena_engine_step_end(e)))
		rc = r->be->ops->stream_sync(r->be, r->cs);
	*t = arena_now_s() - t0;
	return rc;
}

/* Per block, the seconds of its forward compute (globals 0): sim, the model;
 * cuda, its GEMM timed over its own bytes (copied to a scratch buffer; the
 * mean of two runs after a warm-up). */
static int bench_profile(const bench_run *r, const arena_model *m, int cuda, double *cost)
{
	const arena_layout *l = m->layout;
	arena_backend *be = r->be;
	void *scratch = NULL;
	uint64_t maxb = 0;
	int rc = 0;
	for (size_t b = 0; b < l->n_blocks; b++)
		if (!arena_block_is_globals(l, (uint32_t)b) && l->blocks[b].bytes > maxb)
			maxb = l->blocks[b].bytes;
	if (cuda && maxb && (rc = be->ops->dev_alloc(be, maxb, &scratch)))
		return rc;
	for (uint32_t b = 0; b < l->n_blocks && !rc; b++) {
		uint64_t sz = l->blocks[b].bytes;
		cost[b] = 0;
		if (arena_block_is_globals(l, b) || !sz)
			continue;
		if (!cuda) {
			const sim_compute_ctx *c = r->comp.ctx;
			cost[b] = entry_seconds(c->tokens, c->flops, r->params[b], 0);
			continue;
		}
		/* a host slab to the scratch buffer, or the block where it is on the device */
		const void *w = m->mem[b].host ? scratch : m->mem[b].dev;
		if (m->mem[b].host)
			rc = be->ops->copy_h2d(be, scratch, m->mem[b].host, sz, r->cs);
		if (!rc)
			rc = r->comp.run(r->comp.ctx, r->cs, w, r->params[b], 0);
		if (!rc)
			rc = be->ops->stream_sync(be, r->cs);
		double t0 = arena_now_s();
		for (int k = 0; k < 2 && !rc; k++)
			rc = r->comp.run(r->comp.ctx, r->cs, w, r->params[b], 0);
		if (!rc)
			rc = be->ops->stream_sync(be, r->cs);
		cost[b] = (arena_now_s() - t0) / 2;
	}
	if (scratch)
		be->ops->dev_free(be, scratch);
	return rc;
}

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
	enum { O_BACKEND = 256, O_CAP, O_SIMCAP, O_SIMBW, O_DEVFREE, O_FLOPS, O_STEPS, O_TOKENS, O_PRESSURE, O_STRICT,
	       O_PROFILE, O_SAVEPROF, O_JSON };
	static const struct option opts[] = {
		{"backend", required_argument, NULL, O_BACKEND},
		CLI_ENGINE_OPTIONS,
		{"vram-cap", required_argument, NULL, O_CAP},
		{"sim-capacity", required_argument, NULL, O_SIMCAP},
		{"sim-bandwidth", required_argument, NULL, O_SIMBW},
		{"device-free", required_argument, NULL, O_DEVFREE},
		{"flops", required_argument, NULL, O_FLOPS},
		{"steps", required_argument, NULL, O_STEPS},
		{"tokens", required_argument, NULL, O_TOKENS},
		{"pressure", required_argument, NULL, O_PRESSURE},
		{"strict-vram-cap", no_argument, NULL, O_STRICT},
		{"profile", required_argument, NULL, O_PROFILE},
		{"save-profile", required_argument, NULL, O_SAVEPROF},
		{"json", no_argument, NULL, O_JSON},
		{NULL, 0, NULL, 0},
	};
	if (argc < 2 || strcmp(argv[1], "stream"))
		return cli_usage_error("bench", "expected 'stream' (arena bench stream IMAGE)");
	argc--;
	argv++;
	arena_engine_opts o;
	cli_engine_defaults(&o);
	uint64_t simcap = 0, psize = 0, devfree = 0, pheld = 0, bheld = 0;
	double bw = 55e9, flops = 700e12, tokens = 4608;
	long steps = 10, pstep = -1;
	int json = 0, cuda = 0, simopt = 0, profile = 2, ch; /* 0 none, 1 given, 2 learn */
	const char *save_profile = NULL;
	optind = 0;
	opterr = 0;
	while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		uint64_t n;
		int rc;
		switch (ch) {
		case O_BACKEND:
			if (strcmp(optarg, "sim") && strcmp(optarg, "cuda"))
				return cli_usage_error("bench", "--backend '%s': use sim or cuda", arena_q(optarg));
			cuda = !strcmp(optarg, "cuda");
			break;
		case O_CAP:
			if ((rc = cli_size_arg("bench", "--vram-cap", optarg, 1, &o.cap)))
				return rc;
			break;
		case O_SIMCAP:
			if ((rc = cli_size_arg("bench", "--sim-capacity", optarg, 1, &simcap)))
				return rc;
			simopt = 1;
			break;
		case O_SIMBW:
			if ((rc = cli_rate_arg("bench", "--sim-bandwidth", optarg, 1e15, &bw)))
				return rc;
			simopt = 1;
			break;
		case O_DEVFREE:
			if ((rc = cli_size_arg("bench", "--device-free", optarg, 1, &devfree)))
				return rc;
			break;
		case O_FLOPS:
			if ((rc = cli_rate_arg("bench", "--flops", optarg, 1e18, &flops)))
				return rc;
			break;
		case O_STEPS:
			if ((rc = cli_count_arg("bench", "--steps", optarg, 1, 100000, &n)))
				return rc;
			steps = (long)n;
			break;
		case O_TOKENS:
			if ((rc = cli_count_arg("bench", "--tokens", optarg, 1, 10000000, &n)))
				return rc;
			tokens = (double)n;
			break;
		case O_PRESSURE: {
			/* SIZE@STEP: the same SIZE as every size option, a whole STEP */
			char buf[64];
			const char *at = strchr(optarg, '@');
			if (!at || (size_t)(at - optarg) >= sizeof(buf) || arena_count_parse(at + 1, 0, 100000, &n))
				return cli_usage_error("bench", "--pressure '%s' is not SIZE@STEP: a size as for --vram-cap, "
								"then a step number from 0 to 100000", arena_q(optarg));
			memcpy(buf, optarg, (size_t)(at - optarg));
			buf[at - optarg] = 0;
			if (arena_size_parse(buf, &psize) || !psize)
				return cli_usage_error("bench", "--pressure '%s' is not SIZE@STEP: a size above 0 as for "
								"--vram-cap, then a step number from 0 to 100000", arena_q(optarg));
			pstep = (long)n;
			break;
		}
		case O_STRICT:
			o.strict = 1;
			break;
		case O_SAVEPROF:
			save_profile = optarg;
			break;
		case O_PROFILE:
			if (!strcmp(optarg, "none"))
				profile = 0;
			else if (!strcmp(optarg, "given"))
				profile = 1;
			else if (!strcmp(optarg, "learn"))
				profile = 2;
			else
				return cli_usage_error("bench", "--profile '%s': use learn, given or none", arena_q(optarg));
			break;
		case O_JSON:
			json = 1;
			break;
		default:
			rc = cli_engine_option("bench", ch, optarg, &o);
			if (rc > 0)
				return rc;
			if (rc < 0)
				return cli_usage_error("bench", "unknown or incomplete option '%s'", argv[optind - 1]);
			break;
		}
	}
	if (argc - optind != 1)
		return cli_usage_error("bench", "expected one IMAGE, got %d", argc - optind);
	const char *path = argv[optind];
	if (cuda && simopt)
		return cli_usage_error("bench", "--sim-capacity and --sim-bandwidth are for --backend sim");
	if (!cuda && devfree)
		return cli_usage_error("bench", "--device-free is for --backend cuda (sim: --sim-capacity)");
	if (!simcap)
		simcap = o.cap > (24ull << 30) ? o.cap : (24ull << 30);

	int rc = 0, status = 0;
	arena_backend *be = NULL;
	arena_model *m = NULL;
	arena_slab_reader *rr = NULL;
	arena_engine *e = NULL;
	arena_gemm *gemm = NULL;
	arena_stream *cs = NULL;
	arena_image *img = NULL;
	uint8_t *on = NULL;
	uint64_t *params = NULL;
	step_out *out = NULL;
	double *cost = NULL;
	void *ballast = NULL, *pressure = NULL;
	arena_pin_budget budget;
	arena_sim_opts so = {.capacity = simcap, .h2d_bytes_per_s = bw};
	if ((rc = cuda ? arena_backend_cuda_create(0, &be) : arena_backend_sim_create(&so, &be)))
		goto done;
	uint64_t fr = 0, tot = 0, pbytes;
	if (devfree && !(rc = be->ops->mem_info(be, &fr, &tot)) && fr > devfree)
		rc = dev_take(be, cuda, fr - devfree, &ballast, &bheld);
	if (rc || (rc = be->ops->stream_create(be, &cs)))
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
	uint64_t max_params = 0;
	for (size_t b = 0; b < n; b++) {
		on[b] = (uint8_t)arena_block_is_globals(img->layout, (uint32_t)b);
		if (!on[b] && img->layout->blocks[b].bytes / 2 > max_params)
			max_params = img->layout->blocks[b].bytes / 2;
	}
	arena_img_close(img);
	img = NULL;
	/* cuda: the GEMM (and cuBLAS) before the load, so that a missing cuBLAS fails at once. */
	if (cuda && (rc = arena_gemm_create(be, cs, (uint32_t)tokens, max_params, &gemm)))
		goto done;
	arena_load_opts lo = {.backend = be, .budget = &budget, .on_device = on, .io = ARENA_IO_AUTO};
	if ((rc = arena_load_image(path, &lo, &m, NULL)))
		goto done;
	const arena_layout *l = m->layout;
	for (size_t b = 0; b < n; b++)
		params[b] = cuda ? l->blocks[b].bytes / 2 : block_params(l, (uint32_t)b);
	if ((rc = arena_slab_reader_open(path, l, &rr)))
		goto done;
	o.reread = arena_slab_reader_read;
	o.reread_ctx = rr;
	sim_compute_ctx sc = {be, tokens, flops};
	bench_run run = {.be = be, .cs = cs, .params = params, .globals = UINT32_MAX, .train = o.mode == ARENA_MODE_TRAIN};
	run.comp = cuda ? (bench_compute){gemm_compute_run, gemm} : (bench_compute){sim_compute_run, &sc};
	/* The host-to-device rate as measured in this run (the second, warm probe). */
	double h2d = 0;
	be->ops->mem_info(be, &fr, &tot);
	pbytes = fr / 4 < (256ull << 20) ? fr / 4 / 4096 * 4096 : (256ull << 20); /* the probe takes it twice */
	if (!cuda && pbytes > bw / 20) /* sim: a pass of at most ~50 ms at the modelled rate */
		pbytes = bw / 20 < 4096 ? 4096 : (uint64_t)(bw / 20) / 4096 * 4096;
	if (!pbytes || arena_probe_h2d(be, &budget, pbytes, 0.2, &h2d) || arena_probe_h2d(be, &budget, pbytes, 0.5, &h2d) ||
	    !(h2d > 0)) {
		char why[512];
		snprintf(why, sizeof(why), "%s", pbytes ? arena_last_error() : "no free device memory");
		rc = arena_errorf(ARENA_E_IO, "cannot measure the host-to-device rate: %s", why);
		goto done;
	}
	h2d *= 1e9;
	/* The compute profile the planner places resident blocks by: sim, the
	 * modelled seconds; cuda, each block's GEMM timed once over its own
	 * bytes in a scratch buffer. */
	o.no_learn = profile != 2;
	if (profile == 1) {
		if (!(cost = arena_calloc(n ? n : 1, sizeof(*cost)))) {
			rc = arena_errorf(ARENA_E_NOMEM, "out of memory");
			goto done;
		}
		if ((rc = bench_profile(&run, m, cuda, cost)))
			goto done;
		o.cost = cost;
		o.h2d_bytes_per_s = h2d;
	}
	if ((rc = arena_engine_create(m, &o, &e)))
		goto done;
	for (uint32_t b = 0; b < n; b++)
		if (arena_block_is_globals(l, b) && l->blocks[b].bytes)
			run.globals = b;
	for (long st = 0; st < steps; st++) {
		if (st == pstep) {
			be->ops->mem_info(be, &fr, &tot);
			if ((rc = dev_take(be, cuda, psize < fr ? psize : fr, &pressure, &pheld)))
				goto done;
		} else if (pstep >= 0 && st == pstep + 5) {
			dev_give(be, cuda, &pressure);
			pheld = 0;
		}
		out[st].pressure_bytes = pheld;
		const arena_residency_plan *p = arena_engine_plan(e);
		for (size_t i = 0; i < p->n_sched; i++)
			out[st].compute_s += entry_seconds(tokens, flops, params[p->sched[i]],
							   i >= p->n_sched / 2 && run.train);
		if ((rc = bench_step(&run, e, &out[st].time_s)))
			goto done;
		arena_engine_step_record(e, (uint64_t)st, &out[st].rec);
	}
	/* The device's timing of the last steps, now that their work is done. */
	if ((rc = arena_engine_collect(e)))
		goto done;
	if (save_profile) {
		double *pc = arena_calloc(n ? n : 1, sizeof(*pc)), ph = 0, pbw = 0;
		if (!pc)
			rc = arena_errorf(ARENA_E_NOMEM, "out of memory");
		else if (!(rc = arena_engine_profile(e, pc, &ph, &pbw)))
			rc = arena_profile_write(save_profile, l, pc, ph > 0 ? ph : h2d, pbw);
		arena_free(pc);
		if (rc)
			goto done;
	}
	for (long st = 0; st < steps; st++)
		if (arena_engine_step_record(e, (uint64_t)st, &out[st].rec))
			arena_error_clear(); /* older than the history kept: as read after its step */
	/* The plan's figures for the report (its arrays are not used after the engine is freed). */
	arena_residency_plan pl = *arena_engine_plan(e);
	const arena_residency_plan *p = &pl;
	double res_step = 0;
	long res_steps = steps < 3 ? steps : 3;
	int measured = 0;
	if (!cuda) {
		/* sim: the same steps with every block resident: compute only. */
		double res_total = 0;
		for (long st = 0; st < res_steps; st++) {
			double t0 = arena_now_s();
			for (size_t i = 0; i < p->n_sched; i++) {
				int bwd = i >= p->n_sched / 2 && run.train;
				if ((rc = run.comp.run(run.comp.ctx, cs, NULL, params[p->sched[i]], bwd)))
					goto done;
			}
			if ((rc = be->ops->stream_sync(be, cs)))
				goto done;
			res_total += arena_now_s() - t0;
		}
		res_step = res_total / (double)res_steps;
	} else {
		/* cuda: a real run with every block resident (nothing held by us
		 * but the GEMM's buffers, no cap); one warm-up step, then the mean.
		 * Its step time is the compute of the bound. */
		arena_engine_opts ao = o;
		ao.cap = 0;
		ao.strict = 0;
		arena_engine_free(e);
		e = NULL;
		dev_give(be, cuda, &pressure);
		dev_give(be, cuda, &ballast);
		if ((rc = arena_engine_create(m, &ao, &e)))
			goto done;
		if (!arena_engine_plan(e)->n_streamed) {
			double t, res_total = 0;
			for (long st = -1; st < res_steps; st++) {
				if ((rc = bench_step(&run, e, &t)))
					goto done;
				res_total += st >= 0 ? t : 0;
			}
			res_step = res_total / (double)res_steps;
			measured = 1;
		} else {
			fprintf(stderr, "note: the model does not fit the device all resident: no all-resident run, "
					"compute modelled at --flops\n");
		}
	}
	for (long st = 0; st < steps; st++) {
		if (measured)
			out[st].compute_s = res_step;
		double copy = (double)out[st].rec.streamed_bytes / h2d;
		out[st].bound_s = out[st].compute_s > copy ? out[st].compute_s : copy;
	}
	/* Steady state: the steps after the first and after the last one that
	 * changed the plan (a demotion, promotion or the learned profile): the
	 * plan in force at the end; without such steps, those after the first. */
	long from = steps > 1 ? 1 : 0;
	for (long st = 0; st + 1 < steps; st++)
		if (out[st].rec.demotions || out[st].rec.promotions || out[st].rec.profile_learned)
			from = st + 2 > from ? st + 2 : from; /* the step after a change still refills */
	if (from >= steps)
		from = steps > 1 ? 1 : 0;
	double sum_t = 0, sum_b = 0;
	for (long st = from; st < steps; st++)
		sum_t += out[st].time_s, sum_b += out[st].bound_s;
	double eff = sum_t > 0 ? sum_b / sum_t : 0;
	long cnt = steps - from > 0 ? steps - from : 1;
	if (json) {
		json_t *arr = json_array();
		for (long st = 0; st < steps; st++) {
			const arena_engine_step *r = &out[st].rec;
			json_array_append_new(
				arr, json_pack("{s:i,s:f,s:f,s:f,s:f,s:I,s:I,s:I,s:i,s:f,s:i,s:i,s:b,s:I}", "step", (int)st,
					       "time_s", out[st].time_s, "compute_s", out[st].compute_s, "bound_s",
					       out[st].bound_s, "efficiency",
					       out[st].time_s > 0 ? out[st].bound_s / out[st].time_s : 0.0, "streamed_bytes",
					       (json_int_t)r->streamed_bytes, "resident_bytes", (json_int_t)r->resident_bytes,
					       "budget", (json_int_t)r->budget, "stalls", (int)r->stalls, "stall_s",
					       r->stall_s, "demotions", (int)r->demotions, "promotions", (int)r->promotions,
					       "over_budget", r->over_budget, "pressure_bytes",
					       (json_int_t)out[st].pressure_bytes));
			json_t *last = json_array_get(arr, json_array_size(arr) - 1);
			json_object_set_new(last, "gpu_timed", json_boolean(r->gpu_timed));
			json_object_set_new(last, "gpu_compute_s", json_real(r->compute_s));
			json_object_set_new(last, "profile_learned", json_boolean(r->profile_learned));
		}
		json_t *root = json_pack("{s:s,s:s,s:s,s:f,s:f,s:f,s:f,s:I,s:I,s:I,s:s,s:s,s:f,s:I,s:I,s:I}", "path", path, "backend",
					 be->ops->name, "mode", o.mode == ARENA_MODE_TRAIN ? "train" : "sample", "tokens",
					 tokens, "flops", flops, "h2d_bytes_per_s", h2d, "sim_bandwidth", cuda ? 0.0 : bw,
					 "vram_cap", (json_int_t)o.cap, "sim_capacity", (json_int_t)(cuda ? 0 : simcap),
					 "predicted_stream_bytes_per_step", (json_int_t)p->stream_bytes_per_step,
					 "compute", measured ? "all_resident" : "modelled", "profile",
					 profile == 0 ? "none" : profile == 2 ? "learn" : cuda ? "measured" : "modelled",
					 "predicted_step_s", p->step_s,
					 "device_free",
					 (json_int_t)devfree, "device_held_bytes", (json_int_t)bheld, "host_pinned_bytes", (json_int_t)m->pinned_bytes);
		json_object_set_new(root, "steps", arr);
		json_object_set_new(root, "summary",
				    json_pack("{s:i,s:f,s:f,s:f,s:f,s:f}", "steady_from", (int)from, "step_s", sum_t / (double)cnt, "bound_s",
					      sum_b / (double)cnt, "efficiency", eff, "all_resident_step_s", res_step,
					      "vs_all_resident", res_step > 0 ? sum_t / (double)cnt / res_step : 0.0));
		status = cli_print_json(root);
	} else {
		char a[32], b2[32], c[32];
		printf("bench stream %s on %s (%s, T=%g, %.3g FLOP/s, measured h2d %.2f GB/s)\n", path, be->ops->name,
		       o.mode == ARENA_MODE_TRAIN ? "train" : "sample", tokens, flops, h2d / 1e9);
		if (cuda)
			printf("compute: %s; host slabs pinned: %s of %s\n",
			       measured ? "the all-resident run's step time" : "modelled at --flops",
			       cli_fmt_bytes(m->pinned_bytes, a, sizeof(a)), cli_fmt_bytes(m->host_bytes, b2, sizeof(b2)));
		printf("plan: %zu resident (%s), %zu streamed through %u slots x %s; predicted %s streamed per step\n",
		       p->n_resident, cli_fmt_bytes(p->resident_bytes, a, sizeof(a)), p->n_streamed,
		       p->n_streamed ? p->slots : 0, cli_fmt_bytes(p->slot_bytes, b2, sizeof(b2)),
		       cli_fmt_bytes(p->stream_bytes_per_step, c, sizeof(c)));
		if (p->step_s > 0)
			printf("plan by the compute profile (%s): predicted %.4f s per step\n",
			       profile == 2 ? "learned" : cuda ? "measured" : "modelled", p->step_s);
		else
			printf("plan by bytes (%s)\n", profile == 2 ? "no compute profile learned: nothing streamed, or too few steps"
								  : "no compute profile");
		printf("%5s %9s %9s %9s %6s %12s %12s %6s %9s %4s %4s\n", "step", "time_s", "compute", "bound", "eff",
		       "streamed", "resident", "stalls", "gpu_wait", "dem", "pro");
		for (long st = 0; st < steps; st++) {
			const arena_engine_step *r = &out[st].rec;
			char pz[48] = "";
			if (out[st].pressure_bytes)
				snprintf(pz, sizeof(pz), " pressure %s", cli_fmt_bytes(out[st].pressure_bytes, c, sizeof(c)));
			/* stalls and their wait as the device timed them; "-" where it could not */
			char gs[16] = "-", gw[16] = "-";
			if (r->gpu_timed) {
				snprintf(gs, sizeof(gs), "%u", r->stalls);
				snprintf(gw, sizeof(gw), "%.4f", r->stall_s);
			}
			printf("%5ld %9.4f %9.4f %9.4f %6.3f %12s %12s %6s %9s %4u %4u%s%s%s\n", st, out[st].time_s,
			       out[st].compute_s, out[st].bound_s, out[st].time_s > 0 ? out[st].bound_s / out[st].time_s : 0,
			       cli_fmt_bytes(r->streamed_bytes, a, sizeof(a)), cli_fmt_bytes(r->resident_bytes, b2, sizeof(b2)),
			       gs, gw, r->demotions, r->promotions, pz, r->profile_learned ? " learned profile" : "",
			       r->over_budget ? " over budget" : "");
		}
		printf("steady state (steps %ld..%ld): %.4f s/step, bound %.4f s, efficiency %.3f; all resident %.4f s/step (%.3fx)\n",
		       from, steps - 1, sum_t / (double)cnt, sum_b / (double)cnt, eff, res_step,
		       res_step > 0 ? sum_t / (double)cnt / res_step : 0.0);
	}
done:
	arena_engine_free(e);
	arena_gemm_free(gemm);
	if (pressure || ballast) {
		dev_give(be, cuda, &pressure);
		dev_give(be, cuda, &ballast);
	}
	if (cs)
		be->ops->stream_destroy(be, cs);
	arena_slab_reader_close(rr);
	arena_model_free(m);
	arena_img_close(img);
	arena_backend_destroy(be);
	arena_free(on);
	arena_free(params);
	arena_free(out);
	arena_free(cost);
	return rc ? cli_fail(rc) : status;
}
