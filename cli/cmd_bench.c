/* cmd_bench.c - `arena bench stream`: a caller's loop through the residency
 * engine with a synthetic work load per block, step time against its bound;
 * this part holds the usage, the options and the command.
 *
 * The engine is driven through include/arena.h alone (arena_open, steps,
 * acquire/release on the caller's stream, records): what this measures is
 * what a library caller gets. The loop is cmd_bench_run.c, the report
 * cmd_bench_report.c; the caller's work, the limit and memory taken by
 * "another program" are in bench_work.c. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "arena.h"
#include "cli.h"
#include "cmd_bench_int.h"

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
	"  --vram SIZE         device memory arena may use (default: all of the device)\n"
	CLI_VRAM_ALIAS_HELP
	"  --sim-capacity SIZE the simulated device (default 24G, or the cap if larger)\n"
	"  --sim-bandwidth R   sim host-to-device bytes per second, 1e3 to 1e15 (default 55e9)\n"
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
	"  --share-card SIZE|F|on  without --vram: leave SIZE (or the fraction F of the\n"
	"                      device, 0 < F < 1; on: min(a tenth, 2G)) free for other\n"
	"                      programs at every step end, giving memory back at the\n"
	"                      next step end when they take it (default: none)\n"
	"  --log               print each change of the plan on stderr as it is made:\n"
	"                      the step, why, what moved, the predicted step\n"
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
	"                      in https://ui.perfetto.dev (tracks in docs/CLI.md)\n"
	"  --json              machine-readable report (schema in docs/CLI.md)\n"
	"  -h, --help          this text\n"
	"\n"
	CLI_SIZE_HELP
	"\n"
	"Exit status: 0 done, 1 invalid image, 2 usage error or the model cannot run\n"
	"within the cap, 3 system error (no CUDA device, cuBLAS not found, ...).\n";

/* --share-card's argument into ao: "on" (the library's default amount), a
 * fraction (a number with a point and no unit, above 0 and below 1), or a
 * size. 0, or the exit status of a usage error (told). */
static int share_card_arg(const char *arg, arena_open_options *ao)
{
	ao->share_card = 0;
	ao->share_card_fraction = 0;
	if (!strcmp(arg, "on")) {
		ao->share_card = ARENA_SHARE_CARD_DEFAULT;
		return 0;
	}
	if (strchr(arg, '.') && strspn(arg, "0123456789.") == strlen(arg)) {
		double f;
		int rc = cli_rate_arg("bench", "--share-card", arg, 0, 1, &f);
		if (rc)
			return rc;
		if (!(f > 0 && f < 1))
			return cli_usage_error("bench", "--share-card %s: a fraction of the device is above 0 and below 1 "
							"(or give a size, e.g. 4G, or on)", arg);
		ao->share_card_fraction = f;
		return 0;
	}
	return cli_size_arg("bench", "--share-card", arg, 1, &ao->share_card);
}

/* The command line into *o: 0, or the exit status of a usage error (told). */
static int bench_options(int argc, char **argv, bench_stream_opts *o)
{
	enum { O_BACKEND = 256, O_CAP, O_SIMCAP, O_SIMBW, O_DEVFREE, O_FLOPS, O_STEPS, O_TOKENS, O_PRESSURE, O_STRICT,
	       O_PROFILE, O_SAVEPROF, O_JSON, O_PASSES, O_SAMPLE_EVERY, O_TRACE, O_PAYBACK, O_SHARE, O_LOG };
	static const struct option opts[] = {
		{"backend", required_argument, NULL, O_BACKEND},
		CLI_ENGINE_OPTIONS,
		CLI_VRAM_OPTIONS(O_CAP),
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
		{"share-card", required_argument, NULL, O_SHARE},
		{"log", no_argument, NULL, O_LOG},
		{NULL, 0, NULL, 0},
	};
	if (argc < 2 || strcmp(argv[1], "stream"))
		return cli_usage_error("bench", "expected 'stream' (arena bench stream IMAGE)");
	argc--;
	argv++;
	arena_open_options ao = {0};
	uint64_t cap = 0, simcap = 0, psize = 0, devfree = 0;
	double bw = 55e9, flops = 700e12, tokens = 4608;
	long steps = 10, pstep = -1, passes = 1, every = 0;
	int json = 0, cuda = 0, simopt = 0, strict = 0, profile = 2, log = 0, ch; /* 0 none, 1 given, 2 learn */
	const char *save_profile = NULL, *trace = NULL;
	optind = 0;
	opterr = 0;
	int li = -1;
	char on[32];
	while ((ch = getopt_long(argc, argv, "", opts, &li)) != -1) {
		uint64_t n;
		int rc;
		switch (ch) {
		case O_BACKEND:
			if (strcmp(optarg, "sim") && strcmp(optarg, "cuda"))
				return cli_usage_error("bench", "--backend '%s': use sim or cuda", optarg);
			cuda = !strcmp(optarg, "cuda");
			break;
		case O_CAP:
			if ((rc = cli_size_arg("bench", cli_opt_name(opts, li, on, sizeof(on)), optarg, 1, &cap)))
				return rc;
			break;
		case O_SIMCAP:
			if ((rc = cli_size_arg("bench", "--sim-capacity", optarg, 1, &simcap)))
				return rc;
			simopt = 1;
			break;
		case O_SIMBW:
			if ((rc = cli_rate_arg("bench", "--sim-bandwidth", optarg, 1e3, 1e15, &bw)))
				return rc;
			simopt = 1;
			break;
		case O_DEVFREE:
			if ((rc = cli_size_arg("bench", "--device-free", optarg, 1, &devfree)))
				return rc;
			break;
		case O_FLOPS:
			if ((rc = cli_rate_arg("bench", "--flops", optarg, 0, 1e18, &flops)))
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
		case O_LOG:
			log = 1;
			break;
		case O_SHARE:
			if ((rc = share_card_arg(optarg, &ao)))
				return rc;
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
	if (cap && (ao.share_card || ao.share_card_fraction > 0))
		return cli_usage_error("bench", "--share-card is for runs without --vram (a cap leaves the rest of the "
						"card to other programs already)");
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
	*o = (bench_stream_opts){.ao = ao, .path = path, .cap = cap, .simcap = simcap, .psize = psize,
				 .devfree = devfree, .bw = bw, .flops = flops, .tokens = tokens, .steps = steps,
				 .pstep = pstep, .passes = passes, .every = every, .json = json, .cuda = cuda,
				 .profile = profile, .save_profile = save_profile, .trace = trace, .log = log};
	return 0;
}

int cmd_bench(int argc, char **argv)
{
	bench_stream_opts o;
	int rc = bench_options(argc, argv, &o);
	if (rc)
		return rc;
	bench_stream_state S = {0};
	rc = bench_stream_run(&o, &S);
	int status = S.status;
	if (!rc && !status)
		status = bench_stream_report(&o, &S);
	bench_stream_free(&S);
	return rc ? cli_fail(rc) : status;
}
