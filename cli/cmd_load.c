/* cmd_load.c - `arena load`: an image or safetensors file into device memory, measured. */
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../device/probe.h"
#include "../common/alloc.h"
#include "../common/err.h"
#include "../common/hash.h"
#include "../common/io.h"
#include "../formats/image.h"
#include "../formats/wire.h"
#include "../runtime/load.h"
#include "../runtime/open.h"
#include "../convert/quant_select.h"
#include "arena.h"
#include "cli.h"

const char cmd_load_usage[] =
	"usage: arena load PATH [options]\n"
	"\n"
	"Load PATH into device memory as fast as the machine allows and report how\n"
	"fast, next to this run's own limits: the raw pinned host-to-device copy rate\n"
	"and the raw parallel read rate of the file. PATH is an arena image (checksums\n"
	"verified as the data arrives) or a safetensors checkpoint (loaded\n"
	"destination-first, no image). Nothing is kept: the command measures.\n"
	"\n"
	"options:\n"
	"  --backend cuda|sim  device backend (default: cuda when a GPU is usable, else sim)\n"
	"  --device N          CUDA device (default 0)\n"
	"  --vram SIZE         device memory arena may use (default: what is free; sim:\n"
	"                      a 16G device). What the residency plan keeps resident\n"
	"                      goes to the device, the rest to host slabs (streamed by\n"
	"                      the engine when used); a model that cannot run within\n"
	"                      the cap at all is an error that says what it needs\n"
	CLI_VRAM_ALIAS_HELP
	"  --pin-budget SIZE   cap on pinned host memory (default: what the OS allows:\n"
	"                      RLIMIT_MEMLOCK, MemAvailable, cgroup memory.max, minus a reserve)\n"
	"  --threads N         reader threads (default: CPUs, at most 32)\n"
	"  --slot-size SIZE    ring slot (one read) size (default 1M)\n"
	"  --slots N           ring slots per reader thread (default 4); the ring is\n"
	"                      lowered to the bytes to read and the pinned budget\n"
	"                      (a note says so; --json: \"ring\")\n"
	"  --io auto|direct|buffered\n"
	"                      auto (default): page-cache reads when the bytes are\n"
	"                      cached, O_DIRECT when they are not\n"
	"  --quant SCHEME      safetensors only: store 2-D block weights quantized\n"
	"                      (schemes and selection as 'arena convert --quant'),\n"
	"                      converted on their way from the file into place\n"
	CLI_ENGINE_OPTIONS_HELP
	"  --check             read every block back (device and host) and compare with the file\n"
	"  --no-probe          skip the limit measurements\n"
	"  -q, --quiet         no progress line (one goes to stderr while loading when\n"
	"                      it is a terminal)\n"
	"  --json              machine-readable report (schema in docs/CLI.md)\n"
	"  -h, --help          this text\n"
	"\n"
	CLI_SIZE_HELP
	"\n"
	"Ctrl-C cancels cleanly. Exit status: 0 loaded, 1 invalid or corrupt input,\n"
	"2 usage error, 3 system error (I/O, memory, device, no CUDA device).\n";

static volatile sig_atomic_t cancelled;

static void on_signal(int sig)
{
	(void)sig;
	cancelled = 1;
}

/* Compare each device block with the image's slab bytes. */
static int check_device(const char *path, const arena_model *m, int is_image, int *ok)
{
	*ok = 1;
	if (!is_image)
		return 0; /* safetensors: slab padding on the device is unspecified */
	arena_image *img;
	int rc = arena_img_open(path, &img);
	if (rc)
		return rc;
	uint64_t maxb = 0;
	for (size_t b = 0; b < m->layout->n_blocks; b++)
		maxb = m->layout->blocks[b].bytes > maxb ? m->layout->blocks[b].bytes : maxb;
	uint8_t *a = arena_malloc(maxb ? maxb : 1), *f = arena_malloc(maxb ? maxb : 1);
	arena_img_reader rd = {0};
	if (!a || !f)
		rc = arena_errorf(ARENA_E_NOMEM, "out of memory for the check");
	else
		rc = arena_img_reader_init(&rd, img, 1);
	for (size_t b = 0; !rc && b < m->layout->n_blocks; b++) {
		const arena_block *blk = &m->layout->blocks[b];
		if (!blk->bytes || (!m->mem[b].dev && !m->mem[b].host && !m->mem[b].wire)) /* the disk tier: in the image only */
			continue;
		if ((rc = arena_img_read_raw(&rd, blk->offset, blk->bytes, f)))
			break;
		const uint8_t *have = m->mem[b].host;
		if (!m->mem[b].dev && m->mem[b].wire) { /* held coded: decoded here as the device would */
			arena_wire_decode(m->mem[b].wire, 0, blk->bytes, a);
			have = a;
		}
		if (m->mem[b].dev) {
			if ((rc = m->backend->ops->copy_d2h_sync(m->backend, a, m->mem[b].dev, blk->bytes)))
				break;
			have = a;
		}
		if (memcmp(have, f, blk->bytes)) {
			*ok = 0;
			fprintf(stderr, "check: block '%s' differs from the image\n", blk->name);
		}
	}
	arena_free(a);
	arena_free(f);
	arena_img_reader_free(&rd);
	arena_img_close(img);
	return rc;
}

/* "2 threads x 4 slots x 1.00 MiB = 8.00 MiB" */
static const char *ring_str(const arena_ring_shape *r, char *buf, size_t len)
{
	char a[32], b[32];
	snprintf(buf, len, "%u thread%s x %u slot%s x %s = %s", r->threads, cli_s(r->threads), r->slots, cli_s(r->slots), cli_fmt_bytes(r->slot, a, sizeof(a)),
		 cli_fmt_bytes((uint64_t)r->threads * r->slots * r->slot, b, sizeof(b)));
	return buf;
}

static void ring_note(const arena_load_stats *st, uint64_t pin_limit)
{
	char used[128], asked[128], need[32], lim[32];
	fprintf(stderr, "note: read ring %s, lowered from %s:%s%s%s\n", ring_str(&st->ring, used, sizeof(used)),
		ring_str(&st->ring_asked, asked, sizeof(asked)),
		st->ring_lowered & ARENA_RING_BY_BYTES ? " no larger than the " : "",
		st->ring_lowered & ARENA_RING_BY_BYTES ? cli_fmt_bytes(st->ring_need, need, sizeof(need)) : "",
		st->ring_lowered & ARENA_RING_BY_BYTES ? " that go through it" : "");
	if (st->ring_lowered & ARENA_RING_BY_BUDGET)
		fprintf(stderr, "note: read ring lowered to fit the pinned budget of %s (--pin-budget)\n",
			cli_fmt_bytes(pin_limit, lim, sizeof(lim)));
	if (st->ring_lowered & ARENA_RING_BY_HOST)
		fprintf(stderr, "note: read ring lowered to fit the host budget's staging (--host-budget)\n");
}

static json_t *ring_json(const arena_load_stats *st)
{
	json_t *why = json_array();
	if (st->ring_lowered & ARENA_RING_BY_BYTES)
		json_array_append_new(why, json_string("bytes_to_read"));
	if (st->ring_lowered & ARENA_RING_BY_BUDGET)
		json_array_append_new(why, json_string("pin_budget"));
	if (st->ring_lowered & ARENA_RING_BY_HOST)
		json_array_append_new(why, json_string("host_budget"));
	const arena_ring_shape *r = &st->ring, *q = &st->ring_asked;
	return json_pack("{s:I,s:b,s:i,s:i,s:I,s:I,s:I,s:{s:i,s:i,s:I},s:o}", "bytes", (json_int_t)st->ring_bytes, "pinned",
			 st->ring_pinned, "threads", (int)r->threads, "slots_per_thread", (int)r->slots, "slot_bytes",
			 (json_int_t)r->slot, "bytes_through", (json_int_t)st->ring_need, "requested_bytes",
			 (json_int_t)((uint64_t)q->threads * q->slots * q->slot), "requested", "threads", (int)q->threads,
			 "slots_per_thread", (int)q->slots, "slot_bytes", (json_int_t)q->slot, "lowered_by", why);
}

int cmd_load(int argc, char **argv)
{
	enum { O_BACKEND = 256, O_DEVICE, O_CAP, O_PIN, O_THREADS, O_IO, O_CHECK, O_NOPROBE, O_JSON, O_SLOT, O_SLOTS, O_QUANT };
	static const struct option opts[] = {
		{"backend", required_argument, NULL, O_BACKEND}, {"device", required_argument, NULL, O_DEVICE},
		CLI_VRAM_OPTIONS(O_CAP),                       {"pin-budget", required_argument, NULL, O_PIN},
		{"threads", required_argument, NULL, O_THREADS}, {"io", required_argument, NULL, O_IO},
		{"check", no_argument, NULL, O_CHECK},           {"no-probe", no_argument, NULL, O_NOPROBE},
		{"json", no_argument, NULL, O_JSON},             {"slot-size", required_argument, NULL, O_SLOT},
		{"slots", required_argument, NULL, O_SLOTS},     {"quant", required_argument, NULL, O_QUANT},
		{"quiet", no_argument, NULL, 'q'},
		CLI_ENGINE_OPTIONS,
		{NULL, 0, NULL, 0},
	};
	arena_open_options ao = {0};
	const char *backend = NULL;
	int device = 0, json = 0, check = 0, probe = 1, shaped = 0, quiet = 0, ch;
	uint64_t cap = 0, pin_cap = 0;
	arena_quant_opts quant = {0};
	arena_load_opts lo = {.io = ARENA_IO_AUTO, .cancel = &cancelled};
	optind = 0;
	opterr = 0;
	int li = -1;
	char on[32];
	while ((ch = getopt_long(argc, argv, "q", opts, &li)) != -1) {
		uint64_t n;
		int rc;
		switch (ch) {
		case 'q':
			quiet = 1;
			break;
		case O_BACKEND:
			if (strcmp(optarg, "cuda") && strcmp(optarg, "sim"))
				return cli_usage_error("load", "--backend '%s': use cuda or sim", arena_q(optarg));
			backend = optarg;
			break;
		case O_DEVICE:
			if ((rc = cli_count_arg("load", "--device", optarg, 0, 1023, &n)))
				return rc;
			device = (int)n;
			break;
		case O_CAP:
			if ((rc = cli_size_arg("load", cli_opt_name(opts, li, on, sizeof(on)), optarg, 1, &cap)))
				return rc;
			break;
		case O_PIN:
			if ((rc = cli_size_arg("load", "--pin-budget", optarg, 0, &pin_cap)))
				return rc;
			if (!pin_cap)
				pin_cap = 1; /* 0 means "pin nothing" */
			break;
		case O_THREADS:
			if ((rc = cli_count_arg("load", "--threads", optarg, 1, 256, &n)))
				return rc;
			lo.threads = (unsigned)n;
			shaped = 1;
			break;
		case O_IO:
			lo.io = !strcmp(optarg, "auto")       ? ARENA_IO_AUTO
				: !strcmp(optarg, "direct")   ? ARENA_IO_DIRECT
				: !strcmp(optarg, "buffered") ? ARENA_IO_BUFFERED
							      : -2;
			if (lo.io == -2)
				return cli_usage_error("load", "--io '%s': use auto, direct or buffered", arena_q(optarg));
			break;
		case O_SLOT:
			if ((rc = cli_size_arg("load", "--slot-size", optarg, 4096, &lo.slot_bytes)))
				return rc;
			shaped = 1;
			break;
		case O_SLOTS:
			if ((rc = cli_count_arg("load", "--slots", optarg, 1, 64, &n)))
				return rc;
			lo.slots_per_thread = (unsigned)n;
			shaped = 1;
			break;
		case O_QUANT:
			if ((rc = cli_quant_arg("load", optarg)))
				return rc;
			quant.scheme = optarg;
			lo.quant = &quant;
			break;
		case O_CHECK:
			check = 1;
			break;
		case O_NOPROBE:
			probe = 0;
			break;
		case O_JSON:
			json = 1;
			break;
		default: {
			int r = cli_engine_option("load", ch, optarg, &ao);
			if (r > 0)
				return r;
			if (r < 0)
				return cli_usage_error("load", "unknown or incomplete option '%s'", argv[optind - 1]);
			break;
		}
		}
	}
	if (argc - optind != 1)
		return cli_usage_error("load", "expected one PATH, got %d", argc - optind);
	const char *path = argv[optind];

	ao.backend = backend;
	ao.device = device;
	ao.vram_cap = cap;
	ao.pin_budget = pin_cap;
	ao.threads = lo.threads;
	ao.quant = quant.scheme;
	struct sigaction sa = {.sa_handler = on_signal};
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	arena *a = NULL;
	arena_load_stats st;
	cli_progress pg;
	cli_progress_start(&pg, "load", quiet);
	lo.progress = cli_progress_update;
	lo.progress_ctx = &pg;
	int rc = arena__open_tuned(path, &ao, &lo, &a, &st, &cancelled);
	cli_progress_end(&pg);
	signal(SIGINT, SIG_DFL);
	signal(SIGTERM, SIG_DFL);
	if (rc)
		return cli_fail(rc);
	if (!backend && !json && !strcmp(arena_backend_name(a), "sim"))
		fprintf(stderr, "note: no usable CUDA device; loaded on the simulator (--backend sim)\n");
	/* A ring smaller than asked: say so where the asking was explicit (a
	 * small model always takes less than the defaults), or the budget did it. */
	if (st.ring_lowered && (shaped || (st.ring_lowered & (ARENA_RING_BY_BUDGET | ARENA_RING_BY_HOST))))
		ring_note(&st, a->budget.limit);
	arena_backend *be = a->be;
	arena_model *m = a->m;
	int is_image = a->is_image;
	uint64_t rss = arena_peak_rss();
	uint64_t payload = st.dev_bytes + st.host_bytes;
	double gbps = st.seconds > 0 ? (double)payload / st.seconds / 1e9 : 0;
	int ok = 1;
	if (check && (rc = check_device(path, m, is_image, &ok))) {
		arena_close(a);
		return cli_fail(rc);
	}
	uint64_t pinned = m->pinned_bytes, disk_bytes = 0;
	size_t disk_blocks = 0; /* the disk tier: in the image only */
	for (size_t b = 0; b < m->layout->n_blocks; b++)
		if (!m->mem[b].dev && !m->mem[b].host && !m->mem[b].wire && m->layout->blocks[b].bytes)
			disk_blocks++, disk_bytes += m->layout->blocks[b].bytes;
	arena_plan_info pi; /* the host budget and what it holds */
	const int have_pi = disk_blocks && !arena_plan_get(a, &pi);
	arena_error_clear();
	arena__drop_model(a); /* free the device memory before the probes */
	m = NULL;
	arena_pin_budget *budget = &a->budget;
	double h2d = 0, rd = 0;
	int direct_mode = st.direct_bytes * 2 > st.file_bytes;
	if (probe) {
		uint64_t room = budget->limit - atomic_load(&budget->used), pb = 1ull << 30;
		pb = room < pb ? room / (64u << 20) * (64u << 20) : pb;
		if (!pb || arena_probe_h2d(be, budget, pb, 1.0, &h2d)) {
			if (!json)
				fprintf(stderr, "note: no pinned copy probe: %s\n",
					pb ? arena_last_error() : "the pinned budget has no room for a 64 MiB buffer");
			h2d = 0;
		}
		if (arena_probe_read(path, st.threads, direct_mode, 0, &rd))
			rd = 0;
	}
	double bound = h2d > 0 && rd > 0 ? (h2d < rd ? h2d : rd) : (h2d > 0 ? h2d : rd);
	/* A coded image moves fewer bytes than it delivers: the limits, which are
	 * rates of moved bytes, carry payload/file_bytes times as much payload. */
	const int coded = st.gpu_decoded + st.cpu_decoded > 0;
	const double carry = coded && st.file_bytes ? (double)payload / (double)st.file_bytes : 1.0;
	const double raw_bound = bound;
	bound *= carry;
	int status = ok ? 0 : 1;
	if (json) {
		json_t *o = json_pack("{s:s,s:s,s:s,s:I,s:f,s:f,s:I,s:I,s:I,s:b,s:I,s:I,s:i,s:{s:I,s:I},s:I}", "path",
				      path, "kind", is_image ? "arena-image" : "safetensors", "backend", be->ops->name,
				      "bytes", (json_int_t)payload, "seconds", st.seconds, "gbps", gbps, "device_bytes",
				      (json_int_t)st.dev_bytes, "host_bytes", (json_int_t)st.host_bytes, "ring_bytes",
				      (json_int_t)st.ring_bytes, "ring_pinned", st.ring_pinned, "pinned_bytes",
				      (json_int_t)pinned, "pin_budget", (json_int_t)(budget->limit > INT64_MAX ? -1 : (json_int_t)budget->limit),
				      "threads", st.threads, "io", "direct_bytes", (json_int_t)st.direct_bytes,
				      "buffered_bytes", (json_int_t)(st.file_bytes - st.direct_bytes), "peak_rss",
				      (json_int_t)rss);
		json_object_set_new(o, "ring", ring_json(&st));
		json_object_set_new(o, "check", check ? json_boolean(ok) : json_null());
		json_object_set_new(o, "phases",
				    json_pack("{s:f,s:f,s:f,s:f,s:f}", "open", st.t_open, "ring", st.t_ring, "prepare",
					      st.t_prepare, "populate", st.t_populate, "commit", st.t_commit));
		json_object_set_new(o, "reader_thread_s",
				    json_pack("{s:f,s:f,s:f,s:f,s:f}", "all", st.w_all, "ring", st.w_ring, "wait", st.w_wait,
					      "read", st.w_read, "decode", st.w_decode));
		json_object_set_new(o, "hash_isa", json_string(arena_hash_isa()));
		json_object_set_new(o, "disk_tier", json_pack("{s:I,s:I}", "blocks", (json_int_t)disk_blocks, "bytes",
							      (json_int_t)disk_bytes));
		json_object_set_new(o, "file_bytes", json_integer((json_int_t)st.file_bytes));
		json_object_set_new(o, "coded_stream",
				    st.wire_raw ? json_pack("{s:I,s:I}", "host_bytes", (json_int_t)st.wire_bytes, "raw_bytes",
							    (json_int_t)st.wire_raw)
						: json_null());
		json_object_set_new(o, "decoded",
				    coded ? json_pack("{s:I,s:I,s:f,s:f}", "gpu_bytes", (json_int_t)st.gpu_decoded, "cpu_bytes",
						      (json_int_t)st.cpu_decoded, "cpu_seconds", st.cpu_decode_s,
						      "payload_per_file_byte", carry)
					  : json_null());
		json_object_set_new(o, "limits",
				    probe ? json_pack("{s:f,s:f,s:s,s:f,s:f}", "h2d_gbps", h2d, "read_gbps", rd, "read_mode",
						      direct_mode ? "direct" : "buffered", "moved_bound_gbps", raw_bound,
						      "payload_bound_gbps", bound)
					  : json_null());
		json_object_set_new(o, "fraction_of_bound", probe && bound > 0 ? json_real(gbps / bound) : json_null());
		int pst = cli_print_json(o);
		status = status ? status : pst;
	} else {
		char b1[32], b2[32], c[32], d[32], e[32];
		printf("loaded %s on %s: %s in %.3f s = %.2f GB/s (%u thread%s, %s read with O_DIRECT)\n", path,
		       be->ops->name, cli_fmt_bytes(payload, b1, sizeof(b1)), st.seconds, gbps, st.threads,
		       cli_s(st.threads), cli_fmt_bytes(st.direct_bytes, b2, sizeof(b2)));
		printf("memory: %s on the device, %s in host slabs (%s pinned); ring %s %s; peak RSS %s\n",
		       cli_fmt_bytes(st.dev_bytes, b1, sizeof(b1)), cli_fmt_bytes(st.host_bytes, b2, sizeof(b2)),
		       cli_fmt_bytes(pinned, c, sizeof(c)), cli_fmt_bytes(st.ring_bytes, d, sizeof(d)),
		       st.ring_pinned ? "pinned" : "pageable", cli_fmt_bytes(rss, e, sizeof(e)));
		if (disk_blocks) {
			printf("disk tier: %zu block%s (%s) kept in the image only, read from it when streamed (--host-budget)",
			       disk_blocks, cli_s(disk_blocks), cli_fmt_bytes(disk_bytes, b1, sizeof(b1)));
			if (have_pi)
				printf("; host budget %s: host copies %s, staging %s", cli_fmt_bytes(pi.host_budget, b1, sizeof(b1)),
				       cli_fmt_bytes(pi.host_bytes, b2, sizeof(b2)), cli_fmt_bytes(pi.staging_bytes, c, sizeof(c)));
			printf("\n");
		}
		if (st.wire_raw)
			printf("coded streaming: streamed blocks' host copies kept coded, %s for %s (%.1f %%): what each copy "
			       "moves\n",
			       cli_fmt_bytes(st.wire_bytes, b1, sizeof(b1)), cli_fmt_bytes(st.wire_raw, b2, sizeof(b2)),
			       100.0 * (double)st.wire_bytes / (double)st.wire_raw);
		if (coded)
			printf("decoded: %s read for %s (%.2f payload bytes a byte moved); %s decoded by the device, %s by the "
			       "CPU (%.3f CPU s)\n",
			       cli_fmt_bytes(st.file_bytes, b1, sizeof(b1)), cli_fmt_bytes(payload, b2, sizeof(b2)), carry,
			       cli_fmt_bytes(st.gpu_decoded, c, sizeof(c)), cli_fmt_bytes(st.cpu_decoded, d, sizeof(d)),
			       st.cpu_decode_s);
		if (probe && coded)
			printf("limits: pinned host->device %.2f GB/s, parallel %s read %.2f GB/s of moved bytes, so %.2f GB/s "
			       "of payload; load reached %.0f%% of that\n",
			       h2d, direct_mode ? "O_DIRECT" : "buffered", rd, bound, bound > 0 ? 100 * gbps / bound : 0.0);
		else if (probe)
			printf("limits: pinned host->device %.2f GB/s, parallel %s read %.2f GB/s; load reached %.0f%% of the lower\n",
			       h2d, direct_mode ? "O_DIRECT" : "buffered", rd, bound > 0 ? 100 * gbps / bound : 0.0);
		if (check)
			printf("check: device bytes %s the image\n", ok ? "match" : "DIFFER FROM");
	}
	arena_close(a);
	return status;
}
