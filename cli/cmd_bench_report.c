/* cmd_bench_report.c - `arena bench stream`'s report: the steady state of a
 * run and its steps, as text or as JSON (schema in docs/CLI.md; see
 * cmd_bench.c).
 *
 * The steady state is the steps after the first and after the step after
 * the last one that changed the plan: the plan in force at the end. */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "arena.h"
#include "cli.h"
#include "cmd_bench_int.h"

void bench_decision_line(const arena_decision_info *d, char *buf, size_t len)
{
	char b1[32], b2[32];
	size_t k = 0;
#define PUT(...)                                                                        \
	do {                                                                            \
		int w_ = snprintf(buf + k, k < len ? len - k : 0, __VA_ARGS__);         \
		k += w_ > 0 ? (size_t)w_ : 0;                                           \
	} while (0)
	PUT("%s %llu: %s: promoted %u", d->between ? "before step" : "step", (unsigned long long)d->step,
	    d->why_name ? d->why_name : "?", d->promoted);
	if (d->promoted)
		PUT(" block%s (%s)", cli_s(d->promoted), cli_fmt_bytes(d->promoted_bytes, b1, sizeof(b1)));
	PUT(", demoted %u", d->demoted);
	if (d->demoted)
		PUT(" block%s (%s)", cli_s(d->demoted), cli_fmt_bytes(d->demoted_bytes, b1, sizeof(b1)));
	if (d->ring_before != d->ring_after)
		PUT("; ring %s -> %s", cli_fmt_bytes(d->ring_before, b1, sizeof(b1)),
		    cli_fmt_bytes(d->ring_after, b2, sizeof(b2)));
	PUT("; streams %s -> %s a step", cli_fmt_bytes(d->stream_before, b1, sizeof(b1)),
	    cli_fmt_bytes(d->stream_after, b2, sizeof(b2)));
	if (d->step_before_s > 0 && d->step_after_s > 0)
		PUT("; predicted step %.4f s -> %.4f s", d->step_before_s, d->step_after_s);
	else if (d->step_after_s > 0)
		PUT("; predicted step %.4f s", d->step_after_s);
	PUT("; budget %s, %s free", cli_fmt_bytes(d->budget, b1, sizeof(b1)), cli_fmt_bytes(d->free_bytes, b2, sizeof(b2)));
#undef PUT
}

int bench_stream_report(const bench_stream_opts *o, const bench_stream_state *S)
{
	const step_out *out = S->out;
	const arena_plan_info p = S->p;
	const long steps = o->steps, passes = o->passes, every = o->every;
	const int json = o->json, cuda = o->cuda, profile = o->profile, measured = S->measured;
	const double h2d = S->h2d, bw = o->bw, flops = o->flops, tokens = o->tokens;
	const uint64_t cap = o->cap, simcap = o->simcap, devfree = o->devfree, bheld = S->bheld;
	const char *path = o->path;
	int status = 0;
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
	uint64_t streamed = 0; /* by the steady steps: none, and there is no streaming to measure */
	for (long st = from; st < steps; st++)
		sum_t += out[st].time_s, sum_b += out[st].bound_s, sum_c += out[st].compute_s,
			streamed += out[st].rec.streamed_bytes;
	double eff = sum_t > 0 ? sum_b / sum_t : 0;
	long cnt = steps - from > 0 ? steps - from : 1;
	/* all resident, over the same steps: the compute alone (sim: modelled) */
	double res_mean = sum_c / (double)cnt;
	const char *mname = o->ao.mode == ARENA_MODE_TRAIN ? "train" : "sample";
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
			json_object_set_new(j, "look_now_s", json_real(r->look_now_s));
			json_object_set_new(j, "look_plan_s", json_real(r->look_plan_s));
			json_object_set_new(j, "move_est_s", json_real(r->move_est_s));
			json_object_set_new(j, "move_gain_s", json_real(r->move_gain_s));
			json_object_set_new(j, "move_held", json_boolean(r->move_held));
			json_object_set_new(j, "host_read_bytes", json_integer((json_int_t)r->host_read_bytes));
			json_object_set_new(j, "prepared_bytes", json_integer((json_int_t)r->prepared_bytes));
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
		/* the host budget and what it counted: host copies, the disk tier's staging */
		json_object_set_new(root, "disk_tier",
				    p.host_budget ? json_pack("{s:I,s:I,s:I,s:I}", "host_budget", (json_int_t)p.host_budget,
							      "host_bytes", (json_int_t)p.host_bytes, "staging_bytes",
							      (json_int_t)p.staging_bytes, "blocks", (json_int_t)p.n_disk)
						  : json_null());
		json_object_set_new(root, "passes", json_integer(passes));
		json_object_set_new(root, "sample_every", json_integer(every));
		json_object_set_new(root, "steps", arr);
		json_t *dec = json_array();
		for (size_t i = 0; i < S->n_dec; i++) {
			const arena_decision_info *d = &S->dec[i];
			json_t *j = json_pack("{s:o,s:b,s:s,s:i,s:i,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:f,s:f}", "step",
					      cli_json_u64(d->step), "between", d->between, "why",
					      d->why_name ? d->why_name : "?", "promoted", (int)d->promoted, "demoted",
					      (int)d->demoted, "promoted_bytes", cli_json_u64(d->promoted_bytes),
					      "demoted_bytes", cli_json_u64(d->demoted_bytes), "resident_before",
					      cli_json_u64(d->resident_before), "resident_after",
					      cli_json_u64(d->resident_after), "ring_before", cli_json_u64(d->ring_before),
					      "ring_after", cli_json_u64(d->ring_after), "budget", cli_json_u64(d->budget),
					      "free_bytes", cli_json_u64(d->free_bytes), "stream_before",
					      cli_json_u64(d->stream_before), "stream_after", cli_json_u64(d->stream_after),
					      "step_before_s", d->step_before_s, "step_after_s", d->step_after_s);
			json_array_append_new(dec, j);
		}
		json_object_set_new(root, "decisions", dec);
		json_object_set_new(root, "summary",
				    json_pack("{s:i,s:f,s:f,s:f,s:f,s:f,s:o}", "steady_from", (int)from, "step_s",
					      sum_t / (double)cnt, "bound_s", sum_b / (double)cnt, "efficiency", eff,
					      "all_resident_step_s", res_mean, "vs_all_resident",
					      res_mean > 0 ? sum_t / (double)cnt / res_mean : 0.0, "streamed_bytes",
					      cli_json_u64(streamed)));
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
			printf("disk tier: %zu streamed block%s read from the image each time; host budget %s: host copies "
			       "%s, staging %s\n",
			       p.n_disk, cli_s(p.n_disk), cli_fmt_bytes(p.host_budget, s1, sizeof(s1)),
			       cli_fmt_bytes(p.host_bytes, s2, sizeof(s2)), cli_fmt_bytes(p.staging_bytes, s3, sizeof(s3)));
		printf("plan: %zu resident (%s), %zu streamed through %u slot%s x %s; predicted %s streamed per step\n",
		       p.n_resident, cli_fmt_bytes(p.resident_bytes, s1, sizeof(s1)), p.n_streamed, p.slots, cli_s(p.slots),
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
			if (r->looked && r->look_now_s > 0) /* a look at the learned profile: its two predictions */
				snprintf(pz + strlen(pz), sizeof(pz) - strlen(pz), " look %.4f s a step, %.4f s now%s",
					 r->look_plan_s, r->look_now_s, r->profile_learned ? ": moved" : "");
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
		char which[64]; /* "steps 1..9", or "step 0" for one */
		if (steps - 1 > from)
			snprintf(which, sizeof(which), "steps %ld..%ld", from, steps - 1);
		else
			snprintf(which, sizeof(which), "step %ld", from);
		if (!streamed && !p.n_streamed) /* efficiency and the all-resident ratio would time the loop alone */
			printf("steady state (%s): %.4f s/step; everything is resident (%s): nothing was streamed, so there "
			       "is no streaming to measure (a smaller --vram streams blocks)\n",
			       which, sum_t / (double)cnt, cli_fmt_bytes(p.resident_bytes, s1, sizeof(s1)));
		else if (!streamed)
			printf("steady state (%s): %.4f s/step; nothing was streamed in %s, so there is no streaming to "
			       "measure\n",
			       which, sum_t / (double)cnt, cnt == 1 ? "it" : "these steps");
		else
			printf("steady state (%s): %.4f s/step, bound %.4f s, efficiency %.3f; all resident %.4f s/step "
			       "(%.3fx)\n",
			       which, sum_t / (double)cnt, sum_b / (double)cnt, eff, res_mean,
			       res_mean > 0 ? sum_t / (double)cnt / res_mean : 0.0);
	}
	return status;
}
