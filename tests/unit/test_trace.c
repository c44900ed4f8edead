/* test_trace.c - the engine's traces (engine/trace.h) on sim: the file is
 * trace-event JSON with the documented fields; every acquire-release and
 * every copy of a run appears once, in order (copies logged by a shim over
 * the backend's copy op); stalls, step boundaries, demotions, promotions
 * and counters are there; a full buffer is said; usage errors, allocation
 * and write failures leave no file. */
#include <criterion/criterion.h>

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "arena.h"
#include "../../device/backend.h"
#include "../../device/budget.h"
#include "../../engine/engine.h"
#include "../../engine/trace.h"
#include "../../common/alloc.h"
#include "../../common/outfile.h"
#include "../../convert/convert.h"
#include "../../runtime/load.h"
#include "../../runtime/reread.h"
#include "testutil.h"

static char dir[256], img_path[300], out_path[300];
static arena_backend *be;
static arena_pin_budget pb;
static arena_model *M;
static arena_slab_reader *RR;

/* The copies the engine queues, in order (a shim over sim's copy_h2d):
 * the block whose host slab each reads, or UINT32_MAX. */
static arena_backend_ops shim;
static const arena_backend_ops *real_ops;
static uint32_t copies[4096];
static size_t n_copies;

static int shim_copy(arena_backend *b, void *dst, const void *src, uint64_t bytes, arena_stream *s)
{
	uint32_t blk = UINT32_MAX;
	for (uint32_t k = 0; M && k < M->layout->n_blocks; k++)
		if (M->mem[k].host == src)
			blk = k;
	if (n_copies < sizeof(copies) / sizeof(copies[0]))
		copies[n_copies++] = blk;
	return real_ops->copy_h2d(b, dst, src, bytes, s);
}

/* sim's own calls check its ops table: the shim steps aside for them
 * (the engine runs on this thread only). */
static int compute(arena_stream *s, double seconds)
{
	be->ops = real_ops;
	int rc = arena_backend_sim_compute(be, s, seconds);
	be->ops = &shim;
	return rc;
}

static int pressure(uint64_t bytes)
{
	be->ops = real_ops;
	int rc = arena_backend_sim_pressure(be, bytes);
	be->ops = &shim;
	return rc;
}

static void setup(void)
{
	tmpdir_make(dir, sizeof(dir), "test-trace");
	snprintf(img_path, sizeof(img_path), "%s/f.arena", dir);
	snprintf(out_path, sizeof(out_path), "%s/t.json", dir);
	const char *in = fixture_path("tiny_flux.safetensors");
	arena_convert_opts co = {.chunk_size = 64 << 10, .threads = 1};
	cr_assert_eq(arena_convert_inputs(&in, 1, img_path, &co, NULL), 0, "%s", arena_last_error());
	arena_sim_opts so = {.capacity = 2 << 20, .h2d_bytes_per_s = 2e8};
	cr_assert_eq(arena_backend_sim_create(&so, &be), 0);
	real_ops = be->ops;
	shim = *real_ops;
	shim.copy_h2d = shim_copy;
	be->ops = &shim;
	arena_pin_budget_probe(&pb, 256 << 20, 0, "");
	arena_load_opts lo = {.backend = be, .budget = &pb, .threads = 1, .io = ARENA_IO_BUFFERED};
	uint8_t on[64] = {1}; /* globals on the device, the rest in host slabs */
	lo.on_device = on;
	cr_assert_eq(arena_load_image(img_path, &lo, &M, NULL), 0, "%s", arena_last_error());
	cr_assert_leq(M->layout->n_blocks, 64);
	cr_assert_eq(arena_slab_reader_open(img_path, M->layout, &RR), 0);
}

static void teardown(void)
{
	arena_slab_reader_close(RR);
	arena_model_free(M);
	M = NULL;
	be->ops = real_ops;
	arena_backend_destroy(be);
	tmpdir_remove(dir);
}

TestSuite(trace, .init = setup, .fini = teardown);

/* An engine over M that streams (a cap of 290 KiB for a 306 KiB model). */
static arena_engine *mk_engine(uint64_t cap, uint64_t headroom)
{
	arena_engine_opts o = {.mode = ARENA_MODE_SAMPLE, .cap = cap, .headroom = headroom, .reserve = 0, .no_learn = 1,
			       .reread = arena_slab_reader_read, .reread_ctx = RR, .hysteresis = 2};
	arena_engine *e;
	cr_assert_eq(arena_engine_create(M, &o, &e), 0, "%s", arena_last_error());
	return e;
}

/* The acquires of the steps run, in order. */
static uint32_t acq[4096];
static size_t n_acq;

/* One step: globals held through it, then every block of the schedule with
 * `work` seconds of modelled work each. */
static void step(arena_engine *e, arena_stream *s, double work)
{
	const arena_residency_plan *p = arena_engine_plan(e);
	void *d;
	cr_assert_eq(arena_engine_step_begin(e), 0, "%s", arena_last_error());
	cr_assert_eq(arena_engine_acquire(e, 0, s, &d), 0, "%s", arena_last_error());
	acq[n_acq++] = 0;
	for (size_t i = 0; i < p->n_sched; i++) {
		uint32_t b = p->sched[i];
		cr_assert_eq(arena_engine_acquire(e, b, s, &d), 0, "%s", arena_last_error());
		acq[n_acq++] = b;
		cr_assert_eq(compute(s, work), 0);
		cr_assert_eq(arena_engine_release(e, b, s), 0, "%s", arena_last_error());
	}
	cr_assert_eq(arena_engine_release(e, 0, s), 0);
	cr_assert_eq(arena_engine_step_end(e), 0, "%s", arena_last_error());
}

/* What a trace holds, by kind. */
typedef struct parsed {
	json_t *root;
	uint32_t compute[4096], copy[4096], stall[4096];
	size_t n_compute, n_copy, n_stall, n_step, n_step_end, n_demote, n_promote, n_mem, n_streamed;
	double last_ts;
	uint64_t dropped;
	int overflowed;
} parsed;

static int is_num(const json_t *v)
{
	return json_is_number(v);
}

/* Parse `path` and check every event against the trace-event format's
 * documented fields: name, ph, pid, tid; ts (microseconds) for all but
 * metadata; dur for X; s for i; numeric args for C; the M names. */
static void parse(const char *path, parsed *p)
{
	memset(p, 0, sizeof(*p));
	json_error_t err;
	p->root = json_load_file(path, 0, &err);
	cr_assert_not_null(p->root, "%s: not JSON: %s (line %d)", path, err.text, err.line);
	cr_assert(json_is_object(p->root));
	cr_assert_str_eq(json_string_value(json_object_get(p->root, "displayTimeUnit")), "ms");
	json_t *od = json_object_get(p->root, "otherData");
	cr_assert(json_is_object(od));
	cr_assert_str_eq(json_string_value(json_object_get(od, "clock")), "device");
	p->dropped = (uint64_t)json_integer_value(json_object_get(od, "dropped_records"));
	p->overflowed = json_is_true(json_object_get(od, "overflowed"));
	cr_assert_eq(p->overflowed, p->dropped > 0);
	json_t *ev = json_object_get(p->root, "traceEvents");
	cr_assert(json_is_array(ev));
	size_t i;
	json_t *e;
	p->last_ts = -1;
	json_array_foreach(ev, i, e)
	{
		cr_assert(json_is_object(e), "event %zu is not an object", i);
		const char *name = json_string_value(json_object_get(e, "name"));
		const char *ph = json_string_value(json_object_get(e, "ph"));
		cr_assert(name && ph, "event %zu: name and ph", i);
		cr_assert(json_is_integer(json_object_get(e, "pid")) && json_is_integer(json_object_get(e, "tid")),
			  "event %zu: pid and tid", i);
		json_t *args = json_object_get(e, "args");
		cr_assert(!args || json_is_object(args));
		if (!strcmp(ph, "M")) {
			cr_assert(!strcmp(name, "process_name") || !strcmp(name, "thread_name") ||
					  !strcmp(name, "thread_sort_index"),
				  "metadata event '%s'", name);
			continue;
		}
		json_t *ts = json_object_get(e, "ts");
		cr_assert(is_num(ts), "event %zu: ts", i);
		double t = json_number_value(ts);
		cr_assert_geq(t, p->last_ts, "event %zu ('%s') before the one before it", i, name);
		p->last_ts = t;
		const char *cat = json_string_value(json_object_get(e, "cat"));
		if (!strcmp(ph, "X")) {
			cr_assert(is_num(json_object_get(e, "dur")) && json_number_value(json_object_get(e, "dur")) >= 0);
			cr_assert_not_null(cat);
			uint32_t b = (uint32_t)json_integer_value(json_object_get(args, "block"));
			if (!strcmp(cat, "compute")) {
				cr_assert_str_eq(name, M->layout->blocks[b].name);
				p->compute[p->n_compute++] = b;
			} else if (!strcmp(cat, "copy")) {
				cr_assert_str_eq(name, M->layout->blocks[b].name);
				cr_assert_eq((uint64_t)json_integer_value(json_object_get(args, "bytes")), M->layout->blocks[b].bytes);
				cr_assert(is_num(json_object_get(args, "GB/s")));
				const char *kind = json_string_value(json_object_get(args, "kind"));
				cr_assert(kind && (!strcmp(kind, "fetch") || !strcmp(kind, "promote")));
				p->copy[p->n_copy++] = b;
			} else {
				cr_assert_str_eq(cat, "stall");
				cr_assert(!strncmp(name, "stall ", 6));
				p->stall[p->n_stall++] = b;
			}
		} else if (!strcmp(ph, "i")) {
			const char *sc = json_string_value(json_object_get(e, "s"));
			cr_assert(sc && (!strcmp(sc, "g") || !strcmp(sc, "p") || !strcmp(sc, "t")));
			if (!strcmp(cat, "step"))
				*(strstr(name, " end") ? &p->n_step_end : &p->n_step) += 1;
			else if (!strncmp(name, "demote ", 7))
				p->n_demote++;
			else if (!strncmp(name, "promote ", 8))
				p->n_promote++;
		} else {
			cr_assert_str_eq(ph, "C", "event %zu: ph '%s'", i, ph);
			const char *k;
			json_t *v;
			json_object_foreach(args, k, v) cr_assert(is_num(v), "counter %s: %s is not a number", name, k);
			if (!strcmp(name, "device memory")) {
				cr_assert(json_object_get(args, "resident") && json_object_get(args, "ring") &&
					  json_object_get(args, "free"));
				p->n_mem++;
			} else {
				cr_assert_str_eq(name, "streamed this step");
				p->n_streamed++;
			}
		}
	}
}

Test(trace, every_acquire_release_and_copy_once_in_order)
{
	arena_engine *e = mk_engine(290 << 10, 0);
	cr_assert_gt(arena_engine_plan(e)->n_streamed, 0);
	arena_stream *s;
	cr_assert_eq(be->ops->stream_create(be, &s), 0);
	n_copies = n_acq = 0;
	cr_assert_eq(arena_engine_trace_begin(e, out_path, "tiny", 0), 0, "%s", arena_last_error());
	cr_assert(arena_engine_tracing(e));
	unsigned stalls = 0;
	uint64_t n_rec_copies = 0;
	for (int i = 0; i < 5; i++)
		step(e, s, 2e-4);
	cr_assert_eq(be->ops->stream_sync(be, s), 0);
	cr_assert_eq(arena_engine_trace_end(e), 0, "%s", arena_last_error());
	cr_assert(!arena_engine_tracing(e));
	cr_assert_eq(arena_engine_collect(e), 0);
	for (uint64_t k = 0; k < 5; k++) {
		arena_engine_step r;
		cr_assert_eq(arena_engine_step_record(e, k, &r), 0);
		stalls += r.stalls;
		n_rec_copies += r.copies;
	}
	parsed p;
	parse(out_path, &p);
	cr_assert_eq(p.dropped, 0);
	/* Every acquire-release once, in the order made. */
	cr_assert_eq(p.n_compute, n_acq, "%zu acquire-releases in the trace, %zu made", p.n_compute, n_acq);
	for (size_t i = 0; i < n_acq; i++)
		cr_assert_eq(p.compute[i], acq[i], "acquire %zu: block %u in the trace, %u made", i, p.compute[i], acq[i]);
	/* Every copy once, in the order queued (the 5th step's copies for a
	 * 6th step too: the engine prefetches across step ends). */
	cr_assert_gt(n_copies, 0);
	cr_assert_eq(p.n_copy, n_copies, "%zu copies in the trace, %zu queued", p.n_copy, n_copies);
	for (size_t i = 0; i < n_copies; i++)
		cr_assert_eq(p.copy[i], copies[i], "copy %zu: block %u in the trace, %u queued", i, p.copy[i], copies[i]);
	cr_assert_geq(n_copies, n_rec_copies);
	cr_assert_eq(p.n_streamed, p.n_copy, "a streamed counter per fetch");
	/* The copies at 2e8 B/s are slower than the work: the caller waits. */
	cr_assert_gt(stalls, 0);
	cr_assert_gt(p.n_stall, 0);
	cr_assert_leq(p.n_stall, n_acq);
	cr_assert_eq(p.n_step, 5);
	cr_assert_eq(p.n_step_end, 5);
	cr_assert_eq(p.n_mem, 6, "at the start and after every step");
	json_decref(p.root);
	be->ops->stream_destroy(be, s);
	arena_engine_free(e);
}

/* Blocks held together go to lanes of their own; a block acquired twice
 * pairs each release with the oldest acquire. */
Test(trace, overlapping_holds)
{
	arena_engine *e = mk_engine(0, 0); /* all resident */
	arena_stream *s;
	cr_assert_eq(be->ops->stream_create(be, &s), 0);
	cr_assert_eq(arena_engine_trace_begin(e, out_path, NULL, 0), 0, "%s", arena_last_error());
	void *d;
	cr_assert_eq(arena_engine_step_begin(e), 0);
	cr_assert_eq(arena_engine_acquire(e, 1, s, &d), 0);
	cr_assert_eq(compute(s, 1e-4), 0);
	cr_assert_eq(arena_engine_acquire(e, 2, s, &d), 0);
	cr_assert_eq(arena_engine_acquire(e, 1, s, &d), 0);
	cr_assert_eq(compute(s, 1e-4), 0);
	cr_assert_eq(arena_engine_release(e, 1, s), 0);
	cr_assert_eq(arena_engine_release(e, 2, s), 0);
	cr_assert_eq(compute(s, 1e-4), 0);
	cr_assert_eq(arena_engine_release(e, 1, s), 0);
	cr_assert_eq(arena_engine_step_end(e), 0);
	cr_assert_eq(arena_engine_trace_end(e), 0, "%s", arena_last_error());
	parsed p;
	parse(out_path, &p);
	cr_assert_eq(p.n_compute, 3);
	json_t *ev = json_object_get(p.root, "traceEvents"), *x;
	size_t i;
	double start[3], dur[3];
	json_int_t tid[3];
	int k = 0;
	json_array_foreach(ev, i, x)
	{
		const char *cat = json_string_value(json_object_get(x, "cat"));
		if (!cat || strcmp(cat, "compute"))
			continue;
		start[k] = json_number_value(json_object_get(x, "ts"));
		dur[k] = json_number_value(json_object_get(x, "dur"));
		tid[k++] = json_integer_value(json_object_get(x, "tid"));
	}
	/* The first acquire of block 1 lasts until the first release of block 1
	 * (the oldest): 2 x 100 us of work; the third until the last release. */
	cr_assert_eq(p.compute[0], 1);
	cr_assert_eq(p.compute[1], 2);
	cr_assert_eq(p.compute[2], 1);
	cr_assert_geq(dur[0], 190, "%.1f us", dur[0]);
	/* It ends before the third (relative: a loaded machine stretches every
	 * sim compute, an absolute bound failed under ASan beside a fuzzer). */
	cr_assert_geq(start[2] + dur[2], start[0] + dur[0] + 90);
	cr_assert(tid[0] != tid[1] && tid[1] != tid[2] && tid[0] != tid[2], "three lanes: %lld %lld %lld",
		  (long long)tid[0], (long long)tid[1], (long long)tid[2]);
	json_decref(p.root);
	be->ops->stream_destroy(be, s);
	arena_engine_free(e);
}

Test(trace, full_buffer_is_said)
{
	arena_engine *e = mk_engine(290 << 10, 0);
	arena_stream *s;
	cr_assert_eq(be->ops->stream_create(be, &s), 0);
	cr_assert_eq(arena_engine_trace_begin(e, out_path, NULL, 9), 0, "%s", arena_last_error());
	for (int i = 0; i < 3; i++)
		step(e, s, 1e-5);
	cr_assert_eq(arena_engine_trace_end(e), 0, "%s", arena_last_error());
	parsed p;
	parse(out_path, &p);
	cr_assert(p.overflowed);
	cr_assert_gt(p.dropped, 0);
	json_t *od = json_object_get(p.root, "otherData");
	cr_assert_eq(json_integer_value(json_object_get(od, "records")), 9);
	cr_assert_eq(json_integer_value(json_object_get(od, "max_records")), 9);
	cr_assert_leq(p.n_compute + p.n_copy + p.n_step + p.n_step_end + p.n_mem, 9);
	json_decref(p.root);
	/* Too many is refused. */
	cr_assert_eq(arena_engine_trace_begin(e, out_path, NULL, ARENA_TRACE_MAX_RECORDS + 1), ARENA_E_USAGE);
	be->ops->stream_destroy(be, s);
	arena_engine_free(e);
}

/* Pressure demotes, room promotes back: instants, and the promotions'
 * copies on the copy stream. */
Test(trace, demotions_and_promotions)
{
	arena_engine *e = mk_engine(0, 200000);
	cr_assert_eq(arena_engine_plan(e)->n_streamed, 0);
	arena_stream *s;
	cr_assert_eq(be->ops->stream_create(be, &s), 0);
	n_copies = 0;
	cr_assert_eq(arena_engine_trace_begin(e, out_path, NULL, 0), 0, "%s", arena_last_error());
	step(e, s, 1e-5);
	uint64_t free_b, total;
	be->ops->mem_info(be, &free_b, &total);
	cr_assert_eq(pressure(free_b), 0);
	step(e, s, 1e-5);
	cr_assert_eq(pressure(0), 0);
	unsigned dem = 0, pro = 0;
	for (int i = 0; i < 5; i++)
		step(e, s, 1e-5);
	for (uint64_t k = 0; k < arena_engine_steps(e); k++) {
		arena_engine_step r;
		cr_assert_eq(arena_engine_step_record(e, k, &r), 0);
		dem += r.demotions;
		pro += r.promotions;
	}
	cr_assert_eq(arena_engine_trace_end(e), 0, "%s", arena_last_error());
	cr_assert_gt(dem, 0);
	cr_assert_gt(pro, 0);
	parsed p;
	parse(out_path, &p);
	cr_assert_eq(p.n_demote, dem);
	cr_assert_eq(p.n_promote, pro);
	cr_assert_eq(p.n_copy, n_copies, "fetches and promotions: %zu in the trace, %zu queued", p.n_copy, n_copies);
	for (size_t i = 0; i < n_copies; i++)
		cr_assert_eq(p.copy[i], copies[i]);
	json_decref(p.root);
	be->ops->stream_destroy(be, s);
	arena_engine_free(e);
}

Test(trace, usage_errors)
{
	arena_engine *e = mk_engine(290 << 10, 0);
	arena_stream *s;
	cr_assert_eq(be->ops->stream_create(be, &s), 0);
	cr_assert_eq(arena_engine_trace_end(e), ARENA_E_USAGE);
	cr_assert(strstr(arena_last_error(), "no trace"), "%s", arena_last_error());
	cr_assert_eq(arena_engine_trace_begin(e, tmpdir_file(dir, "no/such/t.json"), NULL, 0), ARENA_E_NOT_FOUND);
	cr_assert_eq(arena_engine_trace_begin(e, dir, NULL, 0), ARENA_E_USAGE); /* a folder */
	cr_assert_eq(arena_engine_step_begin(e), 0);
	cr_assert_eq(arena_engine_trace_begin(e, out_path, NULL, 0), ARENA_E_USAGE);
	cr_assert(strstr(arena_last_error(), "between steps"), "%s", arena_last_error());
	cr_assert_eq(arena_engine_step_end(e), 0);
	cr_assert_eq(arena_engine_trace_begin(e, out_path, NULL, 0), 0);
	cr_assert_eq(arena_engine_trace_begin(e, out_path, NULL, 0), ARENA_E_USAGE);
	cr_assert(strstr(arena_last_error(), "already"), "%s", arena_last_error());
	cr_assert_eq(arena_engine_step_begin(e), 0);
	cr_assert_eq(arena_engine_trace_end(e), ARENA_E_USAGE);
	cr_assert_eq(arena_engine_step_end(e), 0);
	cr_assert_eq(access(out_path, F_OK), -1, "nothing before the end");
	cr_assert_eq(arena_engine_trace_end(e), 0);
	cr_assert_eq(access(out_path, F_OK), 0);
	be->ops->stream_destroy(be, s);
	arena_engine_free(e);
}

/* An engine freed with a trace running writes it. */
Test(trace, free_writes_a_trace_not_ended)
{
	arena_engine *e = mk_engine(290 << 10, 0);
	arena_stream *s;
	cr_assert_eq(be->ops->stream_create(be, &s), 0);
	cr_assert_eq(arena_engine_trace_begin(e, out_path, NULL, 0), 0);
	n_acq = 0;
	step(e, s, 1e-5);
	be->ops->stream_destroy(be, s);
	arena_engine_free(e);
	parsed p;
	parse(out_path, &p);
	cr_assert_eq(p.n_compute, n_acq);
	json_decref(p.root);
}

/* Every allocation of a trace failing in turn (its start, then its file):
 * a clean error, nothing leaked, no file; then a failed write. */
Test(trace, allocation_and_write_failures)
{
	arena_engine *e = mk_engine(290 << 10, 0);
	arena_stream *s;
	cr_assert_eq(be->ops->stream_create(be, &s), 0);
	int ok = 0;
	for (long n = 1; n < 1000 && !ok; n++) {
		long live = arena_alloc_live();
		arena_fault_alloc(n);
		int rc = arena_engine_trace_begin(e, out_path, "tiny", 64); /* a pool of 64 x 3 events */
		int fired = arena_fault_alloc_fired();
		arena_fault_alloc(0);
		if (!fired) {
			cr_assert_eq(rc, 0, "%s", arena_last_error());
			ok = 1;
			break;
		}
		cr_assert_neq(rc, 0, "allocation %ld failed and trace_begin succeeded", n);
		cr_assert(!arena_engine_tracing(e));
		cr_assert_eq(arena_alloc_live(), live, "N=%ld leaks", n);
	}
	cr_assert(ok);
	cr_assert_eq(arena_engine_trace_end(e), 0);
	ok = 0;
	for (long n = 1; n < 100 && !ok; n++) {
		unlink(out_path);
		cr_assert_eq(arena_engine_trace_begin(e, out_path, "tiny", 0), 0, "%s", arena_last_error());
		step(e, s, 1e-5);
		long live = arena_alloc_live();
		arena_fault_alloc(n);
		int rc = arena_engine_trace_end(e);
		int fired = arena_fault_alloc_fired();
		arena_fault_alloc(0);
		cr_assert(!arena_engine_tracing(e));
		if (!fired) {
			cr_assert_eq(rc, 0, "%s", arena_last_error());
			ok = 1;
		} else {
			cr_assert_eq(rc, ARENA_E_NOMEM, "N=%ld: %s", n, arena_last_error());
			cr_assert_eq(access(out_path, F_OK), -1, "N=%ld: a file after a failure", n);
		}
		cr_assert_leq(arena_alloc_live(), live, "N=%ld leaks", n);
	}
	cr_assert(ok);
	/* The disk full on the first write. */
	unlink(out_path);
	cr_assert_eq(arena_engine_trace_begin(e, out_path, "tiny", 0), 0);
	step(e, s, 1e-5);
	arena_fault_write(1);
	int rc = arena_engine_trace_end(e);
	arena_fault_write(0);
	cr_assert_eq(rc, ARENA_E_IO, "%s", arena_last_error());
	cr_assert_eq(access(out_path, F_OK), -1);
	/* The engine goes on. */
	step(e, s, 1e-5);
	be->ops->stream_destroy(be, s);
	arena_engine_free(e);
}
