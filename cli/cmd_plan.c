/* cmd_plan.c - `arena plan`: the residency plan for an image and a VRAM size, without a GPU. */
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/engine.h"
#include "../engine/profile.h"
#include "../common/alloc.h"
#include "../common/err.h"
#include "../common/units.h"
#include "../formats/image.h"
#include "../formats/wire.h"
#include "../runtime/open.h"
#include "arena.h"
#include "cli.h"
#include "plan_svg.h"

const char cmd_plan_usage[] =
	"usage: arena plan IMAGE --vram SIZE [options]\n"
	"\n"
	"Show which blocks of IMAGE stay resident on a device with SIZE of memory and\n"
	"which are streamed through a ring of slots, and the bytes streamed per step.\n"
	"Reads only the image's manifest; needs no GPU.\n"
	"\n"
	"options:\n"
	"  --vram SIZE         device memory (e.g. 8G, 24GiB); required: all the\n"
	"                      process may hold, as the driver counts it\n"
	CLI_VRAM_ALIAS_HELP
	"  --context SIZE      of it, the process's own beside arena and torch (a CUDA\n"
	"                      context: 0.5-0.7 GiB on a GPU; arena_open reads it from\n"
	"                      the driver); default 0\n"
	CLI_ENGINE_OPTIONS_HELP
	"  --profile FILE      plan by a compute profile (each block's seconds and the\n"
	"                      copy rate, as `arena bench stream --save-profile` writes\n"
	"                      it): resident blocks where they hide copies best, and\n"
	"                      the predicted step time (with --piece-size, a profile of\n"
	"                      whole blocks is shared among their pieces by bytes)\n"
	"  --svg FILE          draw the plan: the blocks in execution order (resident,\n"
	"                      streamed, globals) as wide as their bytes, the device\n"
	"                      memory with the ring's slots, and with --profile one\n"
	"                      step's predicted copies and compute in time (SVG)\n"
	"  --json              machine-readable plan (schema in docs/CLI.md)\n"
	"  -h, --help          this text\n"
	"\n"
	CLI_SIZE_HELP
	"\n"
	"Exit status: 0 a plan, 1 invalid image, 2 usage error or the model cannot\n"
	"run in SIZE at all (the message says what it needs), 3 system error.\n";

int cmd_plan(int argc, char **argv)
{
	enum { O_VRAM = 256, O_PROFILE, O_JSON, O_SVG, O_CONTEXT };
	static const struct option opts[] = {
		CLI_VRAM_OPTIONS(O_VRAM),
		{"context", required_argument, NULL, O_CONTEXT},
		CLI_ENGINE_OPTIONS,
		{"profile", required_argument, NULL, O_PROFILE},
		{"json", no_argument, NULL, O_JSON},
		{"svg", required_argument, NULL, O_SVG},
		{NULL, 0, NULL, 0},
	};
	arena_open_options ao = {0};
	arena_engine_opts o;
	uint64_t vram = 0, piece = 0, context = 0;
	int json = 0, ch, rc, li = -1;
	char on[32];
	const char *profile = NULL, *svg = NULL;
	optind = 0;
	opterr = 0;
	while ((ch = getopt_long(argc, argv, "", opts, &li)) != -1) {
		switch (ch) {
		case O_VRAM:
			if ((rc = cli_size_arg("plan", cli_opt_name(opts, li, on, sizeof(on)), optarg, 1, &vram)))
				return rc;
			break;
		case O_CONTEXT:
			if ((rc = cli_size_arg("plan", "--context", optarg, 0, &context)))
				return rc;
			break;
		case O_PROFILE:
			profile = optarg;
			break;
		case O_JSON:
			json = 1;
			break;
		case O_SVG:
			svg = optarg;
			break;
		default:
			if ((rc = cli_engine_option("plan", ch, optarg, &ao)) >= 0) {
				if (rc)
					return rc;
				break;
			}
			return cli_usage_error("plan", "unknown or incomplete option '%s'", argv[optind - 1]);
		}
	}
	if (argc - optind != 1)
		return cli_usage_error("plan", "expected one IMAGE, got %d", argc - optind);
	if (!vram)
		return cli_usage_error("plan", "--vram SIZE is required");
	const char *path = argv[optind];
	piece = ao.piece_size;
	if ((rc = arena__engine_opts(&ao, &o)))
		return cli_fail(rc);
	if (context >= vram)
		return cli_usage_error("plan", "--context %llu is not less than --vram %llu", (unsigned long long)context,
				       (unsigned long long)vram);
	o.other = context; /* the process's own, under the cap that --vram is */
	o.cap = context ? vram : 0;
	arena_image *img;
	if ((rc = arena_img_open(path, &img)))
		return cli_fail(rc);
	const arena_layout *l = img->layout;
	arena_layout *pl = NULL; /* with --piece-size: the blocks in pieces */
	uint32_t *par = NULL;    /* each piece's block */
	double *cost = NULL;
	uint8_t *disk = NULL;    /* with --host-budget: the blocks read from the image */
	uint64_t *host_len = NULL; /* an hb4 image: each block's coded host copy */
	arena_residency_plan p = {0};
	int status = 0;
	uint64_t budget, headroom, reserve;
	arena_residency_budget(vram, vram, &o, &budget, &headroom, &reserve);
	/* "auto": chosen from the budget, as arena_open does */
	if (piece == ARENA_PIECE_AUTO && (rc = arena_residency_piece_auto(l, &o, budget, &piece)))
		goto out;
	if (piece && (rc = arena_layout_pieces(img->layout, piece, &pl, &par)))
		goto out;
	if (profile) {
		const arena_layout *il = img->layout;
		double *bc = arena_calloc(il->n_blocks ? il->n_blocks : 1, sizeof(*bc));
		if (!bc || (pl && !(cost = arena_calloc(pl->n_blocks ? pl->n_blocks : 1, sizeof(*cost)))))
			rc = arena_errorf(ARENA_E_NOMEM, "out of memory");
		else
			rc = arena_profile_read(profile, il, bc, &o.h2d_bytes_per_s, &o.backward_factor);
		if (!rc && pl) { /* a block's time shared among its pieces by bytes */
			for (size_t q = 0; q < pl->n_blocks; q++) {
				uint64_t pb = il->blocks[par[q]].bytes;
				cost[q] = pb ? bc[par[q]] * (double)pl->blocks[q].bytes / (double)pb : 0;
			}
			arena_free(bc);
		} else if (!rc) {
			cost = bc;
		} else {
			arena_free(bc);
		}
		if (rc)
			goto out;
		o.cost = cost;
	}
	if (pl)
		l = pl;
	/* The ring by the rule arena_open goes by: its depth, its least slot. */
	const arena_engine_opts given = o; /* the depth as given (0: none), for the floors */
	if ((rc = arena_residency_ring(l, pl != NULL, given.depth, &o))) {
		char why[512];
		snprintf(why, sizeof(why), "%s", arena_last_error());
		rc = arena_errorf(rc, "%s: %s", path, why);
		goto out;
	}
	/* As arena_open: streaming an hb4 image coded takes device stages too
	 * (unless ARENA_PLAIN_STREAM asks for raw host copies). */
	const char *ps = getenv("ARENA_PLAIN_STREAM");
	arena_wire_env();
	const uint64_t stage = ps && strcmp(ps, "0") ? 0 : arena_wire_stage_bound(img->chunks, img->hdr.chunk_count);
	rc = arena_residency_plan_staged(l, &o, &budget, stage, &p);
	if (rc) {
		if (rc == ARENA_E(BUDGET)) {
			char msg[1024], a[32], b[32], c[32], d[32];
			snprintf(msg, sizeof(msg), "%s", arena_last_error());
			uint64_t fv, fw, fb, fh, fr;
			if (arena_residency_floor(l, &o, &fv, &fw) == 0) {
				arena_residency_budget(fv, fv, &o, &fb, &fh, &fr);
				char hint[256] = "", e2[32];
				uint64_t fit = 0;
				if (!pl && arena_residency_piece_fit(l, &o, budget, &fit) == 0 && fit)
					snprintf(hint, sizeof(hint), "; in pieces it runs: --piece-size %s",
						 arena_size_arg(fit, e2, sizeof(e2)));
				if (stage) { /* the floor streams: the stages come on top */
					fv += stage;
					size_t k = strlen(hint);
					snprintf(hint + k, sizeof(hint) - k,
						 "; that includes %s of device stages for streaming this hb4 image coded "
						 "(ARENA_PLAIN_STREAM=1: raw host copies, no stages)",
						 cli_fmt_bytes(stage, e2, sizeof(e2)));
				}
				arena_error_clear();
				arena_errorf(rc,
					     "%s: does not fit in %s: %s; with these options it needs %s or more (working "
					     "reserve %s and headroom %s at that size)%s",
					     path, cli_fmt_bytes(vram, a, sizeof(a)), msg, cli_fmt_bytes(fv, b, sizeof(b)),
					     cli_fmt_bytes(fr, c, sizeof(c)), cli_fmt_bytes(fh, d, sizeof(d)), hint);
			} else {
				arena_errorf(rc, "%s: does not fit in %s: %s", path, cli_fmt_bytes(vram, a, sizeof(a)), msg);
			}
		}
		goto out;
	}
	if (svg) {
		plan_svg_in in = {.image = path, .l = l, .o = &o, .p = &p, .profile = profile, .vram = vram,
				  .budget = budget, .headroom = headroom, .reserve = reserve, .image_fd = img->fd};
		if ((rc = plan_svg_write(svg, &in)))
			goto out;
	}
	/* The floor of each mode with these options, each with its mode's ring
	 * (none where the depth given is too small for that mode). */
	uint64_t floor_v[2] = {0, 0}, floor_w[2] = {0, 0};
	/* a mode the depth given does not run: the least depth it needs, or
	 * UINT_MAX when none does (pieces too small for it) */
	unsigned floor_least[2] = {0, 0};
	for (int md = 0; md < 2; md++) {
		arena_engine_opts q = given;
		q.mode = md ? ARENA_MODE_TRAIN : ARENA_MODE_SAMPLE;
		if (arena_residency_ring(l, pl != NULL, given.depth, &q)) {
			arena_error_clear();
			floor_least[md] = UINT_MAX;
			for (unsigned d = given.depth + 1; d <= ARENA_ENGINE_MAX_DEPTH && floor_least[md] == UINT_MAX; d++)
				if (!arena_residency_ring(l, pl != NULL, d, &q))
					floor_least[md] = d;
			arena_error_clear();
			continue;
		}
		if ((rc = arena_residency_floor(l, &q, &floor_v[md], &floor_w[md])))
			goto out;
		floor_v[md] += stage + context; /* the floor streams: coded, with its stages; the context beside it */
	}
	/* --host-budget: the streamed blocks that would be read from the image. */
	uint64_t hb = ao.host_budget == ARENA_ZERO_BYTES ? 0 : ao.host_budget, hbytes = 0, dbytes = 0;
	size_t dn = 0;
	if (!(disk = arena_calloc(l->n_blocks ? l->n_blocks : 1, 1))) {
		rc = arena_errorf(ARENA_E_NOMEM, "out of memory");
		goto out;
	}
	/* An hb4 image streams coded (arena_open does unless asked not to): each
	 * block's host copy in its coded form (room for every exception: at
	 * most that), which is also what a copy of it moves. */
	if (stage && !(host_len = arena_calloc(l->n_blocks ? l->n_blocks : 1, sizeof(*host_len)))) {
		rc = arena_errorf(ARENA_E_NOMEM, "out of memory");
		goto out;
	}
	/* and its largest coded region, which a disk tier's staging slot holds */
	arena_wire **plans = stage ? arena_calloc(l->n_blocks ? l->n_blocks : 1, sizeof(*plans)) : NULL;
	if (stage && !plans) {
		rc = arena_errorf(ARENA_E_NOMEM, "out of memory");
		goto out;
	}
	rc = stage ? arena_wire_plans(img, l, plans, host_len) : 0;
	uint64_t region = 0;
	for (size_t b = 0; plans && b < l->n_blocks; b++) {
		region = arena_wire_region_most(plans[b]) > region ? arena_wire_region_most(plans[b]) : region;
		arena_wire_free(plans[b]);
	}
	arena_free(plans);
	if (rc)
		goto out;
	/* As arena_open: the budget holds the disk tier's staging too. */
	arena_host_plan hp = {0};
	if (ao.host_budget) {
		uint64_t largest = 0;
		for (size_t b = 0; b < l->n_blocks; b++)
			largest = l->blocks[b].bytes > largest ? l->blocks[b].bytes : largest;
		const uint64_t readers = arena_slab_reader_buffers(&img->hdr, largest);
		if ((rc = arena_residency_host_plan(l, &p, hb, 1, arena_residency_stage_slot(l, region),
						    arena_engine_disk_staging(), readers, host_len, disk, &hp))) {
			if (rc == ARENA_E(BUDGET)) {
				char why[512];
				snprintf(why, sizeof(why), "%s", arena_last_error());
				rc = arena_errorf(rc, "%s: %s", path, why);
			}
			goto out;
		}
		hb = hp.budget, hbytes = hp.host, dbytes = hp.disk, dn = hp.n_disk;
	}
	uint64_t wire_raw = 0, wire_host = 0;
	for (size_t b = 0; host_len && b < l->n_blocks; b++) {
		if (p.resident[b] || disk[b] || arena_block_is_globals(l, (uint32_t)b))
			continue;
		wire_raw += l->blocks[b].bytes;
		wire_host += host_len[b];
	}
	const int coded = wire_raw && wire_host < wire_raw;
	const uint64_t moved = coded ? (uint64_t)((double)p.stream_bytes_per_step * (double)wire_host / (double)wire_raw)
				     : p.stream_bytes_per_step;
	double comp = 0, copy = o.h2d_bytes_per_s > 0 ? (double)moved / o.h2d_bytes_per_s : 0;
	for (size_t i = 0; cost && i < p.n_sched; i++)
		comp += cost[p.sched[i]] *
			(o.mode == ARENA_MODE_TRAIN && i >= p.n_sched / 2 ? (o.backward_factor > 0 ? o.backward_factor : 3.0) : 1.0);
	const char *mode = o.mode == ARENA_MODE_TRAIN ? "train" : "sample";
	if (json) {
		json_t *blocks = json_array();
		for (size_t b = 0; b < l->n_blocks; b++)
			json_array_append_new(blocks, json_pack("{s:s,s:o,s:s}", "name", l->blocks[b].name, "bytes",
								cli_json_u64(l->blocks[b].bytes), "where",
								arena_block_is_globals(l, (uint32_t)b) ? "globals"
								: p.resident[b]                        ? "resident"
								: disk[b]                              ? "disk"
													: "streamed"));
		json_t *root = json_pack(
			"{s:s,s:s,s:o,s:o,s:o,s:o,s:i,s:i,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:i,s:i}", "path", path, "mode", mode,
			"vram", cli_json_u64(vram), "headroom", cli_json_u64(headroom), "reserve", cli_json_u64(reserve), "budget",
			cli_json_u64(budget), "depth", (int)p.depth, "slots", (int)(p.n_streamed ? p.slots : 0), "slot_bytes",
			cli_json_u64(p.slot_bytes), "globals_bytes", cli_json_u64(p.globals_bytes), "resident_bytes",
			cli_json_u64(p.resident_bytes), "streamed_block_bytes", cli_json_u64(p.streamed_block_bytes),
			"need_bytes", cli_json_u64(p.need_bytes), "stream_bytes_per_step",
			cli_json_u64(p.stream_bytes_per_step), "copies_per_step", cli_json_u64(p.copies_per_step),
			"schedule_entries", cli_json_u64(p.n_sched), "resident_blocks", (int)p.n_resident, "streamed_blocks",
			(int)p.n_streamed);
		if (cost) {
			json_object_set_new(root, "predicted_step_s", json_real(p.step_s));
			json_object_set_new(root, "predicted_compute_s", json_real(comp));
			json_object_set_new(root, "predicted_copy_s", json_real(copy));
		}
		json_object_set_new(root, "piece_size", piece ? cli_json_u64(piece) : json_null());
		json_object_set_new(root, "context", cli_json_u64(context));
		json_t *fl = json_object();
		for (int md = 0; md < 2; md++)
			json_object_set_new(fl, md ? "train" : "sample",
					    floor_least[md] == UINT_MAX ? json_pack("{s:n,s:n,s:n}", "vram", "weights", "least_depth")
					    : floor_least[md]	      ? json_pack("{s:n,s:n,s:i}", "vram", "weights", "least_depth",
									 (int)floor_least[md])
							    : json_pack("{s:o,s:o}", "vram", cli_json_u64(floor_v[md]), "weights",
									cli_json_u64(floor_w[md])));
		json_object_set_new(root, "floor", fl);
		json_object_set_new(root, "disk_tier",
				    ao.host_budget ? json_pack("{s:o,s:o,s:o,s:o,s:o,s:o}", "host_budget", cli_json_u64(hb), "host_bytes",
							       cli_json_u64(hbytes), "blocks", cli_json_u64(dn), "bytes",
							       cli_json_u64(dbytes), "staging_bytes", cli_json_u64(hp.staging),
							       "staging_slots_bytes", cli_json_u64(hp.slots))
						   : json_null());
		json_object_set_new(root, "coded_stream",
				    coded ? json_pack("{s:o,s:o,s:o}", "host_bytes", cli_json_u64(wire_host), "raw_bytes",
						      cli_json_u64(wire_raw), "moved_bytes_per_step", cli_json_u64(moved))
					  : json_null());
		json_object_set_new(root, "blocks", blocks);
		status = cli_print_json(root);
	} else {
		char a[32], b[32], c[32], d[32], e[32];
		printf("plan for %s, %s, %s of device memory: %s for weights (headroom %s, working reserve %s)\n", path,
		       mode, cli_fmt_bytes(vram, a, sizeof(a)), cli_fmt_bytes(budget, b, sizeof(b)),
		       cli_fmt_bytes(headroom, c, sizeof(c)), cli_fmt_bytes(reserve, d, sizeof(d)));
		printf("assumed beside the weights: the rest of the process (torch) %s at its peak in a step (--reserve; "
		       "arena.torch learns it), the process's context %s (--context), headroom %s\n",
		       cli_fmt_bytes(reserve, a, sizeof(a)), cli_fmt_bytes(context, b, sizeof(b)),
		       cli_fmt_bytes(headroom, c, sizeof(c)));
		if (pl)
			printf("pieces: %zu streaming unit%s of at most %s from %zu block%s (a module's tensors larger than "
			       "that are a piece of their own)\n",
			       pl->n_blocks, cli_s(pl->n_blocks), cli_fmt_bytes(piece, e, sizeof(e)), img->layout->n_blocks,
			       cli_s(img->layout->n_blocks));
		printf("resident: %zu of %zu block%s, %s (globals %s)\n", p.n_resident, p.n_resident + p.n_streamed,
		       cli_s(p.n_resident + p.n_streamed), cli_fmt_bytes(p.resident_bytes, a, sizeof(a)),
		       cli_fmt_bytes(p.globals_bytes, b, sizeof(b)));
		if (p.n_streamed)
			printf("streamed: %zu block%s, %s through a ring of %u slot%s x %s (depth %u)\n", p.n_streamed,
			       cli_s(p.n_streamed), cli_fmt_bytes(p.streamed_block_bytes, a, sizeof(a)), p.slots,
			       cli_s(p.slots), cli_fmt_bytes(p.slot_bytes, b, sizeof(b)), p.depth);
		else
			printf("streamed: nothing, everything is resident\n");
		printf("device memory for weights: %s; streamed per step: %s in %llu cop%s\n",
		       cli_fmt_bytes(p.need_bytes, c, sizeof(c)), cli_fmt_bytes(p.stream_bytes_per_step, d, sizeof(d)),
		       (unsigned long long)p.copies_per_step, p.copies_per_step == 1 ? "y" : "ies");
		if (coded)
			printf("coded streaming (hb4 image): streamed blocks held coded, %s for %s; a copy moves at most "
			       "%.1f %% of the bytes: %s per step\n",
			       cli_fmt_bytes(wire_host, a, sizeof(a)), cli_fmt_bytes(wire_raw, b, sizeof(b)),
			       100.0 * (double)wire_host / (double)wire_raw, cli_fmt_bytes(moved, c, sizeof(c)));
		if (cost)
			printf("predicted step (profile %s): %.4f s; compute %.4f s, copies %.4f s at %.3g %s\n", profile,
			       p.step_s, comp, copy, o.h2d_bytes_per_s >= 1e9 ? o.h2d_bytes_per_s / 1e9 : o.h2d_bytes_per_s / 1e6,
			       o.h2d_bytes_per_s >= 1e9 ? "GB/s" : "MB/s");
		if (ao.host_budget && dn)
			printf("disk tier: %zu streamed block%s (%s) read from the image each time %s stream%s, ahead of use; "
			       "host budget %s: host copies %s, staging %s (%s of read-ahead slots, the rest chunk buffers)\n",
			       dn, cli_s(dn), cli_fmt_bytes(dbytes, a, sizeof(a)), dn == 1 ? "it" : "they", dn == 1 ? "s" : "",
			       cli_fmt_bytes(hb, c, sizeof(c)), cli_fmt_bytes(hbytes, b, sizeof(b)),
			       cli_fmt_bytes(hp.staging, d, sizeof(d)), cli_fmt_bytes(hp.slots, e, sizeof(e)));
		else if (ao.host_budget)
			printf("disk tier: none; host budget %s: the streamed blocks' host copies %s, staging %s kept for "
			       "blocks that leave the device later\n",
			       cli_fmt_bytes(hb, c, sizeof(c)), cli_fmt_bytes(hbytes, b, sizeof(b)),
			       cli_fmt_bytes(hp.staging, d, sizeof(d)));
		char fs[2][96];
		for (int md = 0; md < 2; md++) {
			if (floor_least[md] == UINT_MAX)
				snprintf(fs[md], sizeof(fs[md]), "none (pieces too small: a larger --piece-size)");
			else if (floor_least[md])
				snprintf(fs[md], sizeof(fs[md]), "none (--depth %u or more)", floor_least[md]);
			else
				snprintf(fs[md], sizeof(fs[md]), "%s (%s for weights)", cli_fmt_bytes(floor_v[md], a, sizeof(a)),
					 cli_fmt_bytes(floor_w[md], b, sizeof(b)));
		}
		printf("floor: sample %s, train %s: the least --vram these options run in\n", fs[0], fs[1]);
		printf("blocks (R resident, s streamed, %sG globals):\n  ", dn ? "d streamed from the image, " : "");
		for (size_t i = 0; i < l->n_blocks; i++)
			putchar(arena_block_is_globals(l, (uint32_t)i) ? 'G' : p.resident[i] ? 'R' : disk[i] ? 'd' : 's');
		putchar('\n');
		(void)e;
	}
out:
	arena_free(disk);
	arena_free(host_len);
	arena_residency_plan_release(&p);
	arena_img_close(img);
	arena_layout_free(pl);
	arena_free(par);
	arena_free(cost);
	return rc ? cli_fail(rc) : status;
}
