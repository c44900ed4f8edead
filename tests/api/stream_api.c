/* stream_api.c - the streaming engine through the public API alone: this
 * file includes only arena.h and links only libarena.so (tests/api/run.sh).
 *
 *   stream_api write FILE.safetensors   write the test model (deterministic bytes)
 *   stream_api run IMAGE                open IMAGE (converted from that model) on a
 *                                       simulated device smaller than the model and
 *                                       drive it as real callers do
 *
 * Every acquired block's bytes are checked against the bytes the model was
 * written with, tensor by tensor, at the offsets arena_tensor_get gives.
 * Prints "ok N checks" and exits 0, or names the first failure and exits 1. */
#include <arena.h>

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NBLK 12
#define GLOBALS_BYTES 20000u

static unsigned checks;

static void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "FAIL: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	exit(1);
}

#define CHECK(cond, ...)                    \
	do {                                \
		checks++;                   \
		if (!(cond))                \
			die(__VA_ARGS__);   \
	} while (0)

#define OK(call)                                                                                      \
	do {                                                                                          \
		int rc_ = (call);                                                                     \
		checks++;                                                                             \
		if (rc_)                                                                              \
			die("%s:%d: %s: %s: %s", __FILE__, __LINE__, #call, arena_err_name(rc_), \
			    arena_last_error());                                                      \
	} while (0)

#define FAILS(call, code, text)                                                                              \
	do {                                                                                                 \
		int rc_ = (call);                                                                            \
		checks++;                                                                                    \
		if (rc_ != (code))                                                                           \
			die("%s:%d: %s gave %s, want %s", __FILE__, __LINE__, #call, arena_err_name(rc_),   \
			    arena_err_name(code));                                                           \
		if (!strstr(arena_last_error(), (text)) || strchr(arena_last_error(), '\n'))               \
			die("%s:%d: %s: message '%s' lacks '%s' or is not one line", __FILE__, __LINE__, #call, \
			    arena_last_error(), (text));                                                     \
	} while (0)

/* The model: globals (pos_embed.weight) and NBLK blocks of two U8 tensors. */
static uint64_t blk_w(unsigned i)
{
	static const uint64_t w[NBLK] = {90000, 120000, 60000, 150000, 100000, 100000,
					 80000, 150000, 70000,  110000, 95000,  130000};
	return w[i];
}

static uint8_t byte_of(const char *name, uint64_t k)
{
	uint64_t h = 1469598103934665603ull;
	for (const char *p = name; *p; p++)
		h = (h ^ (uint8_t)*p) * 1099511628211ull;
	h ^= k * 0x9E3779B97F4A7C15ull;
	h ^= h >> 29;
	h *= 0xBF58476D1CE4E5B9ull;
	return (uint8_t)(h >> 32);
}

static void write_model(const char *path)
{
	char hdr[8192], name[64];
	size_t len = 0;
	uint64_t off = GLOBALS_BYTES;
	len += (size_t)snprintf(hdr + len, sizeof(hdr) - len,
				"{\"pos_embed.weight\":{\"dtype\":\"U8\",\"shape\":[%u],\"data_offsets\":[0,%u]}", GLOBALS_BYTES,
				GLOBALS_BYTES);
	for (unsigned i = 0; i < NBLK; i++) {
		len += (size_t)snprintf(hdr + len, sizeof(hdr) - len,
					",\"transformer_blocks.%u.b\":{\"dtype\":\"U8\",\"shape\":[1000],\"data_offsets\":[%llu,%llu]}"
					",\"transformer_blocks.%u.w\":{\"dtype\":\"U8\",\"shape\":[%llu],\"data_offsets\":[%llu,%llu]}",
					i, (unsigned long long)off, (unsigned long long)(off + 1000), i,
					(unsigned long long)blk_w(i), (unsigned long long)(off + 1000),
					(unsigned long long)(off + 1000 + blk_w(i)));
		off += 1000 + blk_w(i);
	}
	len += (size_t)snprintf(hdr + len, sizeof(hdr) - len, "}");
	while (len % 8)
		hdr[len++] = ' ';
	FILE *f = fopen(path, "wb");
	if (!f)
		die("cannot write %s", path);
	uint64_t hl = len;
	fwrite(&hl, 8, 1, f);
	fwrite(hdr, 1, len, f);
	for (uint64_t k = 0; k < GLOBALS_BYTES; k++)
		fputc(byte_of("pos_embed.weight", k), f);
	for (unsigned i = 0; i < NBLK; i++) {
		snprintf(name, sizeof(name), "transformer_blocks.%u.b", i);
		for (uint64_t k = 0; k < 1000; k++)
			fputc(byte_of(name, k), f);
		snprintf(name, sizeof(name), "transformer_blocks.%u.w", i);
		for (uint64_t k = 0; k < blk_w(i); k++)
			fputc(byte_of(name, k), f);
	}
	if (fclose(f))
		die("cannot write %s", path);
}

/* Every tensor of block b at dptr (the block's slab as acquired) has its bytes. */
static void check_block(arena *a, size_t b, const uint8_t *dptr)
{
	size_t nt = arena_tensor_count(a), seen = 0;
	for (size_t i = 0; i < nt; i++) {
		arena_tensor_info t;
		OK(arena_tensor_get(a, i, &t));
		if (t.block != b)
			continue;
		seen++;
		const uint8_t *p = dptr + t.component[0].offset;
		for (uint64_t k = 0; k < t.component[0].bytes; k++)
			if (p[k] != byte_of(t.name, k))
				die("block %zu tensor %s byte %llu: %u, want %u", b, t.name, (unsigned long long)k, p[k],
				    byte_of(t.name, k));
	}
	CHECK(seen > 0, "block %zu has no tensors", b);
}

static size_t nblocks;

/* A step that acquires blocks in `order`, each checked, held only while used. */
static void step(arena *a, const size_t *order, size_t n, arena_step_info *r)
{
	void *g, *d;
	OK(arena_step_begin(a));
	OK(arena_block_acquire(a, 0, NULL, &g));
	check_block(a, 0, g);
	for (size_t i = 0; i < n; i++) {
		OK(arena_block_acquire(a, order[i], NULL, &d));
		check_block(a, order[i], d);
		OK(arena_block_release(a, order[i], NULL));
	}
	OK(arena_block_release(a, 0, NULL));
	OK(arena_step_end(a));
	OK(arena_step_get(a, arena_step_count(a) - 1, r));
}

typedef struct bwd_job {
	arena *a;
	const size_t *order;
	size_t n;
	int rc;
} bwd_job;

/* Backward on a thread of its own, as autograd does. */
static void *bwd_thread(void *arg)
{
	bwd_job *j = arg;
	void *d;
	for (size_t i = 0; i < j->n; i++) {
		if ((j->rc = arena_block_acquire(j->a, j->order[i], NULL, &d))) {
			fprintf(stderr, "backward thread: %s\n", arena_last_error());
			return NULL;
		}
		check_block(j->a, j->order[i], d);
		if ((j->rc = arena_block_release(j->a, j->order[i], NULL)))
			return NULL;
	}
	return NULL;
}

static void run(const char *image)
{
	arena_open_options o = {.backend = "sim",
				.sim_capacity = 700u << 10,
				.headroom = ARENA_ZERO_BYTES,
				.reserve = ARENA_ZERO_BYTES};
	arena *a;
	/* A device too small for the smallest plan: an early, clear BUDGET. */
	arena_open_options tiny = o;
	tiny.sim_capacity = 200u << 10;
	a = (arena *)&o;
	FAILS(arena_open(image, &tiny, &a), ARENA_E(BUDGET), "it needs");
	CHECK(a == NULL, "a failed open leaves *out NULL");

	OK(arena_open(image, &o, &a));
	nblocks = arena_block_count(a);
	CHECK(nblocks == NBLK + 1, "%zu blocks", nblocks);
	arena_plan_info p;
	OK(arena_plan_get(a, &p));
	uint64_t model = 0;
	for (size_t b = 0; b < nblocks; b++)
		model += arena_block_bytes(a, b);
	CHECK(model > (700u << 10), "the model (%llu bytes) is larger than the device", (unsigned long long)model);
	CHECK(p.n_streamed > 0 && p.n_resident + p.n_streamed == NBLK, "plan: %zu resident, %zu streamed", p.n_resident,
	      p.n_streamed);
	CHECK(p.need_bytes <= (700u << 10), "plan needs %llu", (unsigned long long)p.need_bytes);
	/* Resident blocks have an address for good; streamed ones none. */
	for (size_t b = 0; b < nblocks; b++) {
		arena_block_info bi;
		OK(arena_block_get(a, b, &bi));
		CHECK(bi.resident == (bi.device != NULL), "block %zu: resident %d, device %p", b, bi.resident, bi.device);
		CHECK(bi.host || bi.resident, "block %zu lives somewhere", b);
		if (bi.device)
			check_block(a, b, bi.device);
		if (bi.host)
			check_block(a, b, bi.host);
	}
	size_t idx;
	OK(arena_block_find(a, "transformer_blocks.3", &idx));
	CHECK(idx == 4, "transformer_blocks.3 is block %zu", idx);
	FAILS(arena_block_find(a, "transformer_blocks.99", &idx), ARENA_E_NOT_FOUND, "transformer_blocks.99");

	size_t fwd[NBLK], rev[NBLK], two[2 * NBLK], train[2 * NBLK];
	for (size_t i = 0; i < NBLK; i++) {
		fwd[i] = two[i] = two[NBLK + i] = train[i] = i + 1;
		rev[i] = train[NBLK + i] = NBLK - i;
	}
	arena_step_info r;
	/* Sample steps in the planned order: no misses; traced (the file is
	 * written by trace_end, not before; never over the image). */
	char trace[4096];
	snprintf(trace, sizeof(trace), "%s.trace.json", image);
	remove(trace);
	FAILS(arena_trace_end(a), ARENA_E_USAGE, "no trace");
	FAILS(arena_trace_begin(a, image, 0), ARENA_E(OUTPUT_IS_INPUT), "");
	FAILS(arena_trace_begin(a, NULL, 0), ARENA_E_USAGE, "NULL path");
	OK(arena_trace_begin(a, trace, 0));
	FAILS(arena_trace_begin(a, trace, 0), ARENA_E_USAGE, "already");
	for (int s = 0; s < 3; s++) {
		step(a, fwd, NBLK, &r);
		CHECK(r.misses == 0 && r.mode == ARENA_MODE_SAMPLE && r.acquires == NBLK, "step %d: %u misses", s, r.misses);
	}
	FILE *tf = fopen(trace, "r");
	CHECK(tf == NULL, "the trace appears at its end only");
	OK(arena_trace_end(a));
	tf = fopen(trace, "r");
	CHECK(tf != NULL, "the trace is written");
	if (tf) {
		char head[32] = "";
		CHECK(fread(head, 1, 20, tf) == 20 && !strncmp(head, "{\"displayTimeUnit\":", 18), "the trace is JSON: %.20s", head);
		fclose(tf);
	}
	remove(trace);
	/* Two passes a step (classifier-free guidance): one miss, then learned. */
	step(a, two, 2 * NBLK, &r);
	CHECK(r.misses == 1 && r.schedule_learned, "two passes: %u misses, learned %d", r.misses, r.schedule_learned);
	for (int s = 0; s < 2; s++) {
		step(a, two, 2 * NBLK, &r);
		CHECK(r.misses == 0, "two passes, step %d after learning: %u misses", s, r.misses);
	}
	size_t len;
	uint32_t sched[4 * NBLK];
	OK(arena_schedule_get(a, sched, 4 * NBLK, &len));
	CHECK(len == 2 * NBLK && sched[NBLK] == 1, "the schedule learned has %zu entries", len);
	/* A step that stops early: no error, nothing relearned. */
	step(a, two, NBLK / 2, &r);
	CHECK(r.stopped_early && !r.schedule_learned, "early stop: stopped %d learned %d", r.stopped_early,
	      r.schedule_learned);
	/* Out of order: misses, fetched when asked, bytes right. */
	step(a, rev, NBLK, &r);
	CHECK(r.misses > 0 && r.schedule_learned, "reversed: %u misses", r.misses);
	step(a, rev, NBLK, &r);
	CHECK(r.misses == 0, "reversed again: %u misses", r.misses);

	/* Train: forward, then backward in reverse on another thread. */
	OK(arena_set_mode(a, ARENA_MODE_TRAIN));
	CHECK(arena_mode(a) == ARENA_MODE_TRAIN, "mode");
	for (int s = 0; s < 3; s++) {
		void *g, *d;
		OK(arena_step_begin(a));
		OK(arena_block_acquire(a, 0, NULL, &g));
		for (size_t i = 0; i < NBLK; i++) {
			OK(arena_block_acquire(a, fwd[i], NULL, &d));
			check_block(a, fwd[i], d);
			OK(arena_block_release(a, fwd[i], NULL));
		}
		bwd_job j = {a, rev, NBLK, 0};
		pthread_t th;
		CHECK(pthread_create(&th, NULL, bwd_thread, &j) == 0, "pthread_create");
		pthread_join(th, NULL);
		CHECK(j.rc == 0, "backward thread failed: %s", arena_err_name(j.rc));
		OK(arena_block_release(a, 0, NULL));
		OK(arena_step_end(a));
		OK(arena_step_get(a, arena_step_count(a) - 1, &r));
		CHECK(r.mode == ARENA_MODE_TRAIN && r.acquires == 2 * NBLK, "train step %d", s);
		CHECK(r.misses == 0, "train step %d: %u misses (the default train schedule)", s, r.misses);
	}
	/* A preview in the middle of training, and back. */
	OK(arena_set_mode(a, ARENA_MODE_SAMPLE));
	step(a, rev, NBLK, &r);
	CHECK(r.misses == 0 && r.mode == ARENA_MODE_SAMPLE, "sample mode keeps what it learned: %u misses", r.misses);
	OK(arena_set_mode(a, ARENA_MODE_TRAIN));
	step(a, train, 2 * NBLK, &r);
	CHECK(r.misses == 0, "back to train: %u misses", r.misses);

	/* Misuse: clear errors, never a crash; the arena goes on. */
	void *d;
	FAILS(arena_block_acquire(a, 1, NULL, &d), ARENA_E_USAGE, "outside a step");
	OK(arena_step_begin(a));
	FAILS(arena_step_begin(a), ARENA_E_USAGE, "inside a step");
	FAILS(arena_block_release(a, 2, NULL), ARENA_E_USAGE, "not acquired");
	FAILS(arena_block_acquire(a, nblocks, NULL, &d), ARENA_E_USAGE, "out of range");
	FAILS(arena_block_acquire(a, 1, (void *)&o, &d), ARENA_E_USAGE, "pass NULL");
	FAILS(arena_block_acquire_name(a, "nope.0", NULL, &d, NULL), ARENA_E_NOT_FOUND, "nope.0");
	OK(arena_block_acquire_name(a, "transformer_blocks.0", NULL, &d, &idx));
	CHECK(idx == 1, "by name: index %zu", idx);
	check_block(a, 1, d);
	FAILS(arena_step_end(a), ARENA_E_USAGE, "still acquired");
	FAILS(arena_set_mode(a, ARENA_MODE_SAMPLE), ARENA_E_USAGE, "inside a step");
	OK(arena_block_release(a, 1, NULL));
	OK(arena_step_end(a));
	FAILS(arena_set_mode(a, 5), ARENA_E_USAGE, "neither sample nor train");
	/* The rest of the process's device memory counts under a cap only (none here). */
	OK(arena_step_get(a, arena_step_count(a) - 1, &r));
	const uint64_t budget0 = r.budget;
	OK(arena_set_rest_memory(a, 1u << 20));
	step(a, train, 2 * NBLK, &r);
	CHECK(r.budget == budget0 && r.demotions == 0, "no cap: the rest's memory moved the budget (%llu, was %llu)",
	      (unsigned long long)r.budget, (unsigned long long)budget0);
	OK(arena_set_rest_memory(a, 0));
	OK(arena_block_keep_host(a, 1));
	FAILS(arena_block_keep_host(a, nblocks), ARENA_E_USAGE, "out of range");
	arena_tensor_info ti;
	FAILS(arena_tensor_get(a, 100000, &ti), ARENA_E_USAGE, "out of range");
	arena_block_info bi;
	FAILS(arena_block_get(a, nblocks, &bi), ARENA_E_USAGE, "out of range");
	CHECK(arena_block_name(a, nblocks) == NULL && arena_block_bytes(a, nblocks) == 0, "accessors out of range");

	/* Lifetime: a reference keeps the memory after close; calls through the
	 * handle then fail cleanly; the last release frees. */
	OK(arena_retain(a));
	size_t t3;
	OK(arena_tensor_find(a, "transformer_blocks.3.w", &t3));
	OK(arena_tensor_get(a, t3, &ti));
	const uint8_t *host = ti.component[0].host;
	CHECK(host != NULL, "a streamed block's tensor has host bytes");
	arena_close(a);
	arena_close(a); /* harmless while a reference remains */
	CHECK(host[7] == byte_of("transformer_blocks.3.w", 7), "memory stays while referenced");
	FAILS(arena_step_begin(a), ARENA_E_USAGE, "closed");
	FAILS(arena_set_rest_memory(a, 0), ARENA_E_USAGE, "closed");
	FAILS(arena_block_keep_host(a, 1), ARENA_E_USAGE, "closed");
	FAILS(arena_block_acquire(a, 1, NULL, &d), ARENA_E_USAGE, "closed");
	FAILS(arena_block_get(a, 1, &bi), ARENA_E_USAGE, "closed");
	FAILS(arena_tensor_get(a, t3, &ti), ARENA_E_USAGE, "closed");
	CHECK(arena_block_count(a) == 0 && strstr(arena_last_error(), "closed"), "block_count after close");
	CHECK(arena_block_name(a, 1) == NULL && strstr(arena_last_error(), "closed"), "block_name after close");
	CHECK(arena_backend_name(a) == NULL && strstr(arena_last_error(), "closed"), "backend_name after close");
	CHECK(arena_tensor_count(a) == 0 && arena_block_bytes(a, 1) == 0, "counts after close");
	arena_release(a);
	FAILS(arena_block_acquire(a, 1, NULL, &d), ARENA_E_USAGE, "not an open arena");
	FAILS(arena_retain(a), ARENA_E_USAGE, "not an open arena");
	arena_close(a);   /* no-op on a handle that is gone */
	arena_release(a); /* likewise */
	arena_close(NULL);
	arena_release(NULL);
}

int main(int argc, char **argv)
{
	if (argc == 3 && !strcmp(argv[1], "write")) {
		write_model(argv[2]);
		return 0;
	}
	if (argc == 3 && !strcmp(argv[1], "run")) {
		run(argv[2]);
		printf("stream_api: ok, %u checks\n", checks);
		return 0;
	}
	fprintf(stderr, "usage: stream_api write FILE.safetensors | stream_api run IMAGE\n");
	return 2;
}
