/* cmd_bench.c - `arena bench stream`: a caller's loop through the residency
 * engine with a synthetic work load per block, step time against its bound.
 *
 * The engine is driven through include/arena.h alone (arena_open, steps,
 * acquire/release on the caller's stream, records): what this measures is
 * what a library caller gets. The caller's work, the limit and memory taken
 * by "another program" are in bench_work.c. */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <time.h>

#include "arena.h"
#include "bench_work.h"
#include "cli.h"

const char cmd_bench_usage[] =
	"usage: arena bench stream IMAGE [options]\n"
	"\n"
	"Run a caller's loop over IMAGE's blocks for a number of steps through the\n"
	"residency engine (the public library API, as any caller), with a synthetic\n"
	"work load per block of 2 x T x parameters FLOPs (backward entries of train\n"
	"cost twice that on top of the recompute), and report per step: time, the\n"
	"bound max(compute, copied bytes / measured host-to-device rate: an hb4\n"
	"image's streamed blocks are copied coded, about 3/4 of their bytes) and\n"
	"efficiency = bound / time. sim: the work is host time modelled at --flops\n"
	"and compared with the same work alone. cuda: a bf16 cuBLAS GEMM with T rows\n"
	"over the block's bytes (parameters = bytes / 2; cuBLAS is loaded at run\n"
	"time) on a stream of the caller's, compared with a run of the same steps\n"
	"with every block resident, whose step time is the compute of the bound\n"
	"(modelled at --flops if the model does not fit the device).\n"
	"\n"
	"The loop: sample steps run the blocks in order (--passes times: two for\n"
	"classifier-free guidance); train steps run them forward, then backward in\n"
	"reverse. The engine is given no schedule: it learns the one run.\n"
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
	"  --passes N          sample: forward passes a step (default 1)\n"
	"  --sample-every N    train: every Nth step is a sample step (a preview), then\n"
	"                      back to train (default: none)\n" CLI_ENGINE_OPTIONS_HELP
	"  --pressure SIZE@STEP  at STEP take SIZE of device memory (what is free, at\n"
	"                      most), give it back 5 steps later (cuda: allocated)\n"
	"  --strict-vram-cap   over the cap after demoting all it can is an error\n"
	"  --profile learn|given|none\n"
	"                      the compute profile the planner places blocks by:\n"
	"                      learn (default): the engine times each block on the\n"
	"                      device during the first steps and re-plans by it;\n"
	"                      given: each block's work timed before the run (cuda)\n"
	"                      or modelled (sim) and given to the engine; none: by bytes\n"
	"  --payback N         a move only a prediction asks for (the learned profile's\n"
	"                      plan) is made when it saves its own time within N steps\n"
	"                      (default 16; each step's move_held says when it was not)\n"
	"  --save-profile FILE write the profile the engine ended with (learned or given)\n"
	"                      for `arena plan --profile` (format in engine/profile.h)\n"
	"  --trace FILE        write a timeline of the run's steps (the device's timing of\n"
	"                      every copy, acquire and release, stalls, demotions,\n"
	"                      promotions, memory) as Chrome trace-event JSON: open it\n"
	"                      in https://ui.perfetto.dev (tracks in README.md)\n"
	"  --json              machine-readable report (schema in README.md)\n"
	"  -h, --help          this text\n"
	"\n"
	CLI_SIZE_HELP
	"\n"
	"Exit status: 0 done, 1 invalid image, 2 usage error or the model cannot run\n"
	"within the cap, 3 system error (no CUDA device, cuBLAS not found, ...).\n";

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

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

/* The entries of a step in `mode` with `passes` forward passes; their count. */
static size_t step_entries(bench_loop *L, int mode, int passes)
{
	size_t k = 0;
	for (int p = 0; p < (mode == ARENA_MODE_TRAIN ? 1 : passes); p++)
		for (uint32_t b = 0; b < L->n; b++)
			if (b != L->globals)
				L->bwd[k] = 0, L->order[k++] = b;
	if (mode == ARENA_MODE_TRAIN)
		for (uint32_t b = (uint32_t)L->n; b-- > 0;)
			if (b != L->globals)
				L->bwd[k] = 1, L->order[k++] = b;
	return k;
}

/* One step: every entry acquired on the caller's stream, worked on,
 * released; returns when the work is done, *t its seconds. */
static int loop_step(bench_loop *L, size_t k, double *t)
{
	void *s = bench_work_stream(L->w), *d, *g = NULL;
	double t0 = now_s();
	int rc = arena_step_begin(L->a);
	if (!rc && L->globals != UINT32_MAX)
		rc = arena_block_acquire(L->a, L->globals, s, &g);
	for (size_t i = 0; !rc && i < k; i++) {
		uint32_t b = L->order[i];
		if (!(rc = arena_block_acquire(L->a, b, s, &d)) && !(rc = bench_work_run(L->w, d, L->params[b], L->bwd[i])))
			rc = arena_block_release(L->a, b, s);
	}
	if (!rc && L->globals != UINT32_MAX)
		rc = arena_block_release(L->a, L->globals, s);
	if (!rc && !(rc = arena_step_end(L->a)))
		rc = bench_work_sync(L->w);
	*t = now_s() - t0;
	return rc;
}

/* Parameters of block b: bytes / 2 on cuda (the GEMM reads the slab as
 * bf16), else its tensors' elements. */
static int block_params(arena *a, size_t n, int cuda, uint64_t *params)
{
	for (size_t b = 0; b < n; b++)
		params[b] = cuda ? arena_block_bytes(a, b) / 2 : 0;
	if (cuda)
		return 0;
	size_t nt = arena_tensor_count(a);
	for (size_t i = 0; i < nt; i++) {
		arena_tensor_info t;
		int rc = arena_tensor_get(a, i, &t);
		if (rc)
			return rc;
		uint64_t e = 1;
		for (uint32_t k = 0; k < t.rank; k++)
			e *= t.shape[k];
		params[t.block] += e;
	}
	return 0;
}

/* Per block, the seconds of its forward work (globals 0), timed over its
 * bytes in one step that acquires every block (cuda) or modelled (sim). */
static int given_profile(bench_loop *L, int cuda, double *cost)
{
	void *s = bench_work_stream(L->w), *d;
	int rc = cuda ? arena_step_begin(L->a) : 0;
	for (uint32_t b = 0; b < L->n && !rc; b++) {
		cost[b] = 0;
		if (b == L->globals || !arena_block_bytes(L->a, b))
			continue;
		if (!cuda) {
			cost[b] = bench_work_model_s(L->w, L->params[b], 0);
			continue;
		}
		if (!(rc = arena_block_acquire(L->a, b, s, &d)) && !(rc = bench_work_time(L->w, d, L->params[b], &cost[b])))
			rc = arena_block_release(L->a, b, s);
	}
	if (!rc && cuda)
		rc = arena_step_end(L->a);
	return rc;
}

int cmd_bench(int argc, char **argv)
{
	enum { O_BACKEND = 256, O_CAP, O_SIMCAP, O_SIMBW, O_DEVFREE, O_FLOPS, O_STEPS, O_TOKENS, O_PRESSURE, O_STRICT,
	       O_PROFILE, O_SAVEPROF, O_JSON, O_PASSES, O_SAMPLE_EVERY, O_TRACE, O_PAYBACK };
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
		{"passes", required_argument, NULL, O_PASSES},
		{"sample-every", required_argument, NULL, O_SAMPLE_EVERY},
		{"pressure", required_argument, NULL, O_PRESSURE},
		{"strict-vram-cap", no_argument, NULL, O_STRICT},
		{"profile", required_argument, NULL, O_PROFILE},
		{"save-profile", required_argument, NULL, O_SAVEPROF},
		{"payback", required_argument, NULL, O_PAYBACK},
		{"json", no_argument, NULL, O_JSON},
		{"trace", required_argument, NULL, O_TRACE},
		{NULL, 0, NULL, 0},
	};
	if (argc < 2 || strcmp(argv[1], "stream"))
		return cli_usage_error("bench", "expected 'stream' (arena bench stream IMAGE)");
	argc--;
	argv++;
	arena_open_options ao = {0};
	uint64_t cap = 0, simcap = 0, psize = 0, devfree = 0, pheld = 0, bheld = 0;
	double bw = 55e9, flops = 700e12, tokens = 4608;
	long steps = 10, pstep = -1, passes = 1, every = 0;
	int json = 0, cuda = 0, simopt = 0, strict = 0, profile = 2, ch; /* 0 none, 1 given, 2 learn */
	const char *save_profile = NULL, *trace = NULL;
	optind = 0;
	opterr = 0;
	while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		uint64_t n;
		int rc;
		switch (ch) {
		case O_BACKEND:
			if (strcmp(optarg, "sim") && strcmp(optarg, "cuda"))
				return cli_usage_error("bench", "--backend '%s': use sim or cuda", optarg);
			cuda = !strcmp(optarg, "cuda");
			break;
		case O_CAP:
			if ((rc = cli_size_arg("bench", "--vram-cap", optarg, 1, &cap)))
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
		case O_PAYBACK:
			if ((rc = cli_count_arg("bench", "--payback", optarg, 1, 1000000000, &n)))
				return rc;
			ao.payback_steps = (unsigned)n;
			break;
		case O_TOKENS:
			if ((rc = cli_count_arg("bench", "--tokens", optarg, 1, 10000000, &n)))
				return rc;
			tokens = (double)n;
			break;
		case O_PASSES:
			if ((rc = cli_count_arg("bench", "--passes", optarg, 1, 4, &n)))
				return rc;
			passes = (long)n;
			break;
		case O_SAMPLE_EVERY:
			if ((rc = cli_count_arg("bench", "--sample-every", optarg, 2, 100000, &n)))
				return rc;
			every = (long)n;
			break;
		case O_PRESSURE:
			if ((rc = cli_pressure_arg("bench", "--pressure", optarg, &psize, &n)))
				return rc;
			pstep = (long)n;
			break;
		case O_STRICT:
			strict = 1;
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
				return cli_usage_error("bench", "--profile '%s': use learn, given or none", optarg);
			break;
		case O_JSON:
			json = 1;
			break;
		case O_TRACE:
			trace = optarg;
			break;
		default:
			rc = cli_engine_option("bench", ch, optarg, &ao);
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
	if (every && ao.mode != ARENA_MODE_TRAIN)
		return cli_usage_error("bench", "--sample-every is for --mode train");
	if (passes > 1 && ao.mode == ARENA_MODE_TRAIN && !every)
		return cli_usage_error("bench", "--passes is for sample steps (--mode sample, or --sample-every)");
	/* The library refuses it too, but only once the run is over. */
	struct stat sp, si;
	if (save_profile && stat(save_profile, &sp) == 0 && stat(path, &si) == 0 && sp.st_dev == si.st_dev &&
	    sp.st_ino == si.st_ino)
		return cli_usage_error("bench", "--save-profile '%s' is the image; name another file", save_profile);
	if (!simcap)
		simcap = cap > (24ull << 30) ? cap : (24ull << 30);

	ao.backend = cuda ? "cuda" : "sim";
	ao.vram_cap = cap;
	ao.flags |= (strict ? ARENA_OPEN_STRICT : 0) | (profile != 2 ? ARENA_OPEN_NO_LEARN : 0);
	if (!cuda) {
		ao.sim_capacity = simcap;
		ao.sim_bandwidth = bw;
	}
	int rc = 0, status = 0, measured = 0;
	bench_work *w = NULL;
	arena *a = NULL;
	step_out *out = NULL;
	uint64_t *params = NULL;
	double *cost = NULL, h2d = 0, res_step[2][5] = {{0}};
	bench_loop L = {0};
	/* The caller's side first: the GEMM (a missing cuBLAS fails at once),
	 * the limit, the ballast of a smaller card. Then the arena. */
	if ((rc = bench_work_create(cuda, tokens, flops, 4ull << 30, bw, &w)) || (rc = bench_work_h2d(w, &h2d)))
		goto done;
	if (devfree && (rc = bench_work_ballast(w, devfree, &bheld)))
		goto done;
	if ((rc = arena_open(path, &ao, &a)))
		goto done;
	L.a = a;
	L.w = w;
	L.n = arena_block_count(a);
	L.globals = UINT32_MAX;
	for (size_t b = 0; b < L.n; b++) {
		arena_block_info bi;
		if ((rc = arena_block_get(a, b, &bi)))
			goto done;
		if (!bi.container && bi.bytes)
			L.globals = (uint32_t)b;
	}
	params = calloc(L.n ? L.n : 1, sizeof(*params));
	out = calloc((size_t)steps, sizeof(*out));
	L.order = calloc(4 * (L.n + 1), sizeof(*L.order));
	L.bwd = calloc(4 * (L.n + 1), 1);
	cost = calloc(L.n ? L.n : 1, sizeof(*cost));
	if (!params || !out || !L.order || !L.bwd || !cost) {
		fprintf(stderr, "error: out of memory\n");
		status = 3;
		goto done;
	}
	if ((rc = block_params(a, L.n, cuda, params)))
		goto done;
	L.params = params;
	uint64_t first = 0;
	if (profile == 1) {
		if ((rc = given_profile(&L, cuda, cost)) || (rc = arena_profile_set(a, cost, L.n, h2d, 0)))
			goto done;
		first = arena_step_count(a); /* the timing step */
	}
	if (trace && (rc = arena_trace_begin(a, trace, 0)))
		goto done;
	for (long st = 0; st < steps; st++) {
		int mode = every && st % every == every - 1 ? ARENA_MODE_SAMPLE : ao.mode;
		if (st == pstep) {
			uint64_t fr = 0, tot = 0;
			if ((rc = arena_device_memory(a, &fr, &tot)) || (rc = bench_work_take(w, a, psize, fr, &pheld)))
				goto done;
		} else if (pstep >= 0 && st == pstep + 5) {
			bench_work_give(w, a);
			pheld = 0;
		}
		if (arena_mode(a) != mode && (rc = arena_set_mode(a, mode)))
			goto done;
		size_t k = step_entries(&L, mode, (int)passes);
		step_out *o = &out[st];
		o->mode = mode;
		o->passes = mode == ARENA_MODE_TRAIN ? 1 : (int)passes;
		o->pressure_bytes = pheld;
		for (size_t i = 0; i < k; i++)
			o->compute_s += bench_work_model_s(w, params[L.order[i]], L.bwd[i]);
		if ((rc = loop_step(&L, k, &o->time_s)) || (rc = arena_step_get(a, first + (uint64_t)st, &o->rec)))
			goto done;
	}
	if (trace) {
		if ((rc = arena_trace_end(a)))
			goto done;
		fprintf(stderr, "note: wrote the trace %s (open it in https://ui.perfetto.dev)\n", trace);
	}
	/* The device's timing of the last steps, now that their work is done. */
	if ((rc = arena_sync(a)))
		goto done;
	for (long st = 0; st < steps; st++)
		if (arena_step_get(a, first + (uint64_t)st, &out[st].rec))
			fprintf(stderr, "note: %s\n", arena_last_error()); /* older than the records kept */
	if (save_profile && (rc = arena_profile_save(a, save_profile)))
		goto done;
	arena_plan_info p;
	if ((rc = arena_plan_get(a, &p)))
		goto done;
	bench_work_give(w, a);
	pheld = 0;
	/* The bound's compute. sim: the modelled work, exactly. cuda: a run of
	 * the same kinds of steps with every block resident (no cap, nothing
	 * held), one warm-up and three timed of each kind. */
	if (cuda) {
		const uint64_t piece = p.piece_size; /* the same units as the run ("auto" resolved) */
		arena_close(a);
		a = L.a = NULL;
		bench_work_free(w); /* gives back the ballast, makes a new stream below */
		w = L.w = NULL;
		arena_open_options full = ao;
		full.vram_cap = 0;
		full.piece_size = piece;
		full.flags &= ~ARENA_OPEN_STRICT;
		if ((rc = bench_work_create(cuda, tokens, flops, 4ull << 30, bw, &w)) || (rc = arena_open(path, &full, &a)))
			goto done;
		L.a = a;
		L.w = w;
		arena_plan_info fp;
		if ((rc = arena_plan_get(a, &fp)))
			goto done;
		if (!fp.n_streamed) {
			measured = 1;
			for (int mode = 0; mode < 2; mode++)
				for (int ps = 1; ps <= 4; ps++) {
					int used = 0;
					for (long st = 0; st < steps; st++)
						used |= out[st].mode == mode && out[st].passes == ps;
					if (!used)
						continue;
					if (arena_mode(a) != mode && (rc = arena_set_mode(a, mode)))
						goto done;
					size_t k = step_entries(&L, mode, ps);
					double t, sum = 0;
					for (int r = -1; r < 3; r++) {
						if ((rc = loop_step(&L, k, &t)))
							goto done;
						sum += r >= 0 ? t : 0;
					}
					res_step[mode][ps] = sum / 3;
				}
			for (long st = 0; st < steps; st++)
				out[st].compute_s = res_step[out[st].mode][out[st].passes];
		} else {
			fprintf(stderr, "note: the model does not fit the device all resident: no all-resident run, "
					"compute modelled at --flops\n");
		}
	}
	for (long st = 0; st < steps; st++) {
		/* the bytes that went over the bus: coded ones for blocks held coded */
		double copy = (double)out[st].rec.moved_bytes / h2d;
		out[st].bound_s = out[st].compute_s > copy ? out[st].compute_s : copy;
	}
	/* Steady state: the steps after the first and after the last one that
	 * changed the plan (a demotion, promotion, the learned profile or
	 * schedule): the plan in force at the end. */
	long from = steps > 1 ? 1 : 0;
	for (long st = 0; st + 1 < steps; st++) {
		const arena_step_info *r = &out[st].rec;
		if (r->demotions || r->promotions || r->profile_learned || r->schedule_learned)
			from = st + 2 > from ? st + 2 : from; /* the step after a change still refills */
	}
	if (from >= steps)
		from = steps > 1 ? 1 : 0;
	double sum_t = 0, sum_b = 0, sum_c = 0;
	for (long st = from; st < steps; st++)
		sum_t += out[st].time_s, sum_b += out[st].bound_s, sum_c += out[st].compute_s;
	double eff = sum_t > 0 ? sum_b / sum_t : 0;
	long cnt = steps - from > 0 ? steps - from : 1;
	/* all resident, over the same steps: the compute alone (sim: modelled) */
	double res_mean = sum_c / (double)cnt;
	const char *mname = ao.mode == ARENA_MODE_TRAIN ? "train" : "sample";
	if (json) {
		json_t *arr = json_array();
		for (long st = 0; st < steps; st++) {
			const arena_step_info *r = &out[st].rec;
			json_t *j = json_pack("{s:i,s:s,s:i,s:f,s:f,s:f,s:f,s:I,s:I,s:I,s:i,s:f,s:i,s:i,s:b,s:I}", "step", (int)st,
					      "mode", out[st].mode == ARENA_MODE_TRAIN ? "train" : "sample", "passes",
					      out[st].passes, "time_s", out[st].time_s, "compute_s", out[st].compute_s,
					      "bound_s", out[st].bound_s, "efficiency",
					      out[st].time_s > 0 ? out[st].bound_s / out[st].time_s : 0.0, "streamed_bytes",
					      (json_int_t)r->streamed_bytes, "resident_bytes", (json_int_t)r->resident_bytes,
					      "budget", (json_int_t)r->budget, "stalls", (int)r->stalls, "stall_s", r->stall_s,
					      "demotions", (int)r->demotions, "promotions", (int)r->promotions, "over_budget",
					      r->over_budget, "pressure_bytes", (json_int_t)out[st].pressure_bytes);
			json_object_set_new(j, "misses", json_integer(r->misses));
			json_object_set_new(j, "schedule_learned", json_boolean(r->schedule_learned));
			json_object_set_new(j, "gpu_timed", json_boolean(r->gpu_timed));
			json_object_set_new(j, "gpu_compute_s", json_real(r->compute_s));
			json_object_set_new(j, "profile_learned", json_boolean(r->profile_learned));
			json_object_set_new(j, "end_s", json_real(r->end_s));
			json_object_set_new(j, "plan_s", json_real(r->plan_s));
			json_object_set_new(j, "move_s", json_real(r->move_s));
			json_object_set_new(j, "disk_bytes", json_integer((json_int_t)r->disk_bytes));
			json_object_set_new(j, "moved_bytes", json_integer((json_int_t)r->moved_bytes));
			json_object_set_new(j, "disk_wait_s", json_real(r->disk_wait_s));
			json_object_set_new(j, "looked", json_boolean(r->looked));
			json_object_set_new(j, "look_s", json_real(r->look_s));
			json_object_set_new(j, "move_est_s", json_real(r->move_est_s));
			json_object_set_new(j, "move_gain_s", json_real(r->move_gain_s));
			json_object_set_new(j, "move_held", json_boolean(r->move_held));
			json_array_append_new(arr, j);
		}
		json_t *root = json_pack("{s:s,s:s,s:s,s:f,s:f,s:f,s:f,s:I,s:I,s:I,s:s,s:s,s:f,s:I,s:I}", "path", path, "backend",
					 cuda ? "cuda" : "sim", "mode", mname, "tokens", tokens, "flops", flops,
					 "h2d_bytes_per_s", h2d, "sim_bandwidth", cuda ? 0.0 : bw, "vram_cap", (json_int_t)cap,
					 "sim_capacity", (json_int_t)(cuda ? 0 : simcap), "predicted_stream_bytes_per_step",
					 (json_int_t)p.stream_bytes_per_step, "compute", measured || !cuda ? (cuda ? "all_resident" : "modelled") : "modelled",
					 "profile",
					 profile == 0 ? "none" : profile == 2 ? "learn" : cuda ? "measured" : "modelled",
					 "predicted_step_s", p.predicted_step_s, "device_free", (json_int_t)devfree,
					 "device_held_bytes", (json_int_t)bheld);
		json_object_set_new(root, "piece_size", json_integer((json_int_t)p.piece_size));
		json_object_set_new(root, "passes", json_integer(passes));
		json_object_set_new(root, "sample_every", json_integer(every));
		json_object_set_new(root, "steps", arr);
		json_object_set_new(root, "summary",
				    json_pack("{s:i,s:f,s:f,s:f,s:f,s:f}", "steady_from", (int)from, "step_s",
					      sum_t / (double)cnt, "bound_s", sum_b / (double)cnt, "efficiency", eff,
					      "all_resident_step_s", res_mean, "vs_all_resident",
					      res_mean > 0 ? sum_t / (double)cnt / res_mean : 0.0));
		status = cli_print_json(root);
	} else {
		char s1[32], s2[32], s3[32];
		printf("bench stream %s on %s (%s", path, cuda ? "cuda" : "sim", mname);
		if (passes > 1)
			printf(", %ld passes a sample step", passes);
		if (every)
			printf(", a sample step every %ld", every);
		printf(", T=%g, %.3g FLOP/s, measured h2d %.2f GB/s)\n", tokens, flops, h2d / 1e9);
		if (cuda)
			printf("compute: %s\n", measured ? "the all-resident run's step time" : "modelled at --flops");
		if (p.piece_size)
			printf("pieces: blocks streamed in pieces of at most %s\n", cli_fmt_bytes(p.piece_size, s1, sizeof(s1)));
		if (p.n_disk)
			printf("disk tier: %zu streamed blocks read from the image each time (host copies %s)\n", p.n_disk,
			       cli_fmt_bytes(p.host_bytes, s1, sizeof(s1)));
		printf("plan: %zu resident (%s), %zu streamed through %u slots x %s; predicted %s streamed per step\n",
		       p.n_resident, cli_fmt_bytes(p.resident_bytes, s1, sizeof(s1)), p.n_streamed, p.slots,
		       cli_fmt_bytes(p.slot_bytes, s2, sizeof(s2)), cli_fmt_bytes(p.stream_bytes_per_step, s3, sizeof(s3)));
		if (p.predicted_step_s > 0)
			printf("plan by the compute profile (%s): predicted %.4f s per step\n",
			       profile == 2 ? "learned" : cuda ? "measured" : "modelled", p.predicted_step_s);
		else
			printf("plan by bytes (%s)\n", profile == 2 ? "no compute profile learned: nothing streamed, or too few steps"
								  : "no compute profile");
		printf("%5s %6s %9s %9s %9s %6s %12s %12s %6s %9s %4s %4s %4s\n", "step", "mode", "time_s", "compute",
		       "bound", "eff", "streamed", "resident", "stalls", "gpu_wait", "miss", "dem", "pro");
		for (long st = 0; st < steps; st++) {
			const arena_step_info *r = &out[st].rec;
			char pz[192] = "";
			if (out[st].pressure_bytes)
				snprintf(pz, sizeof(pz), " pressure %s", cli_fmt_bytes(out[st].pressure_bytes, s3, sizeof(s3)));
			if (r->disk_bytes) /* the disk tier: read, and how long the copies waited for it */
				snprintf(pz + strlen(pz), sizeof(pz) - strlen(pz), " disk %s (waited %.4f s)",
					 cli_fmt_bytes(r->disk_bytes, s3, sizeof(s3)), r->disk_wait_s);
			if (r->move_held) /* a move the prediction asked for, not worth its cost */
				snprintf(pz + strlen(pz), sizeof(pz) - strlen(pz), " move held (%.3f s for %.4f s a step)",
					 r->move_est_s, r->move_gain_s);
			/* stalls and their wait as the device timed them; "-" where it could not */
			char gs[16] = "-", gw[16] = "-";
			if (r->gpu_timed) {
				snprintf(gs, sizeof(gs), "%u", r->stalls);
				snprintf(gw, sizeof(gw), "%.4f", r->stall_s);
			}
			printf("%5ld %6s %9.4f %9.4f %9.4f %6.3f %12s %12s %6s %9s %4u %4u %4u%s%s%s%s\n", st,
			       out[st].mode == ARENA_MODE_TRAIN ? "train" : "sample", out[st].time_s, out[st].compute_s,
			       out[st].bound_s, out[st].time_s > 0 ? out[st].bound_s / out[st].time_s : 0,
			       cli_fmt_bytes(r->streamed_bytes, s1, sizeof(s1)), cli_fmt_bytes(r->resident_bytes, s2, sizeof(s2)),
			       gs, gw, r->misses, r->demotions, r->promotions, pz,
			       r->profile_learned ? " learned profile" : "", r->schedule_learned ? " learned order" : "",
			       r->over_budget ? " over budget" : "");
		}
		printf("steady state (steps %ld..%ld): %.4f s/step, bound %.4f s, efficiency %.3f; all resident %.4f s/step (%.3fx)\n",
		       from, steps - 1, sum_t / (double)cnt, sum_b / (double)cnt, eff, res_mean,
		       res_mean > 0 ? sum_t / (double)cnt / res_mean : 0.0);
	}
done:
	if (w && a)
		bench_work_give(w, a);
	arena_close(a);
	bench_work_free(w);
	free(params);
	free(out);
	free(L.order);
	free(L.bwd);
	free(cost);
	return rc ? cli_fail(rc) : status;
}
