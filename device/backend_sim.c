/* backend_sim.c - the low-VRAM simulator: device memory is host memory under a
 * capacity, every stream has a worker thread, one modelled copy engine.
 *
 * The model:
 *   - Device memory: 256-byte aligned host buffers counted against the
 *     capacity; free = capacity - allocated - pressure - context - rest
 *     (pressure stands for another program's VRAM; context for this
 *     process's CUDA context, rest for the rest of this process's memory,
 *     a framework's caching allocator: arena_backend_sim_rest). Failures
 *     can be injected: the allocations after the next `fail_skip` fail
 *     with DEV_OOM, `fail_left` of them (arena_backend_sim_fail_alloc), as
 *     cudaMalloc fails when another program took the memory. The
 *     process's memory (proc_mem) is context + rest + allocated, and its
 *     peak is kept (arena_backend_sim_peak). Sizes are counted rounded up to the
 *     granularity (256 bytes unless the options say more; cuda's is 2 MiB).
 *   - Streams: a FIFO of ops (copy, wait for an event, modelled compute) that
 *     the stream's own worker thread runs in order. The ops queued on a stream
 *     get sequence numbers 1, 2, ...; `done` is the number of the last one
 *     finished.
 *   - Copy engine: one, shared by all streams, like PCIe. A copy of n bytes
 *     books the engine for n / rate seconds from when it is next idle (or
 *     now), does its memcpy, and finishes at the end of its booking. So
 *     copies on several streams together never beat the modelled bandwidth,
 *     and copies overlap fully with compute on other streams. With rate 0 a
 *     copy is just its memcpy.
 *   - Decode (decode_hb4): device-side work, so not booked on the copy
 *     engine; the stream's worker runs the CPU decoder (formats/codec.c) on
 *     the device copy of the chunk, at memcpy-like speed.
 *   - Events: record captures (stream id, sequence number of the last op
 *     queued); the event is done once that stream's `done` reaches it. A
 *     stream is destroyed only after its work is done, so an event whose
 *     stream is gone is done; so is an event never recorded (stream id 0).
 *
 * Invariants (b->mu guards every field of the backend, its streams and its
 * events; a worker drops it only around a memcpy and while it sleeps):
 *   1. For each stream, done <= queued, and its queue holds exactly the ops
 *      numbered done+1 .. queued, in order; the head is the op running.
 *   2. allocated = sum of the sizes in b->allocs, and
 *      allocated + pressure + context + rest <= capacity;
 *      peak >= context + rest + allocated.
 *   3. Every live stream is on b->streams and every live event on b->events,
 *      so destroy can free what the caller left; stream ids are never reused.
 *   4. Once b->cancel is set (destroy), workers skip the ops left in their
 *      queue and exit; nothing else runs after that.
 */
#include "backend.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "../common/alloc.h"
#include "../common/clock.h"
#include "../common/err.h"
#include "../formats/codec.h"
#include "../formats/dequant.h"

#define SIM_ALIGN 256u
#define SIM_DEFAULT_CAPACITY (8ull << 30)

enum sim_op_kind { SIM_COPY, SIM_WAIT, SIM_COMPUTE, SIM_MARK, SIM_DECODE };

struct sim_op {
	struct sim_op *next;
	enum sim_op_kind kind;
	uint64_t seq;
	void *dst; /* SIM_COPY, SIM_DECODE */
	const void *src;
	uint64_t bytes; /* SIM_COPY; SIM_DECODE: the chunk's stored length */
	uint64_t wait_stream; /* SIM_WAIT: the event as recorded when the wait was queued */
	uint64_t wait_seq;
	double seconds; /* SIM_COMPUTE */
	arena_event *ev; /* SIM_MARK: the timed event to stamp, if still recorded here */
	arena_hb4 hb4;   /* SIM_DECODE: the caller's parse, plane pointers cleared */
	uint64_t a, z;   /* SIM_DECODE: the raw byte range */
};

typedef struct sim_backend sim_backend;

struct arena_stream {
	sim_backend *b;
	arena_stream *next; /* on b->streams */
	uint64_t id;        /* >= 1 */
	uint64_t queued;    /* sequence number of the last op queued */
	uint64_t done;      /* sequence number of the last op finished */
	struct sim_op *head, *tail;
	pthread_cond_t cv; /* new work, stop, cancel; the worker's sleeps wait on it */
	pthread_t thread;
	int stop; /* no more work will come: exit once the queue is empty */
	int host; /* the host stream (stream_native): no worker, nothing queued */
};

struct arena_event {
	arena_event *prev, *next; /* on b->events */
	uint64_t stream;          /* 0: never recorded */
	uint64_t seq;
	int timed;      /* record queues a SIM_MARK that stamps t */
	double t;       /* monotonic time its mark ran */
	unsigned marks; /* SIM_MARK ops queued for it and not yet run */
};

struct sim_alloc {
	void *dptr; /* what dev_alloc returned */
	void *raw;  /* what arena_malloc returned */
	uint64_t size;
};

struct sim_pin {
	const void *p;
	uint64_t bytes;
};

struct sim_backend {
	arena_backend base;
	pthread_mutex_t mu;
	pthread_cond_t progress; /* some stream's `done` moved, or cancel */
	uint64_t capacity, allocated, pressure;
	uint64_t context, rest; /* the process's own beside allocations (arena_sim_opts, sim_rest) */
	uint64_t fail_skip, fail_left; /* injected failures: after fail_skip allocations, fail_left fail */
	uint64_t peak;          /* the most context + rest + allocated since the last reset */
	double rate;           /* modelled H2D bytes per second, 0 = unmodelled */
	double engine_idle_at; /* monotonic time the copy engine's bookings end */
	struct sim_alloc *allocs;
	size_t n_allocs, cap_allocs;
	struct sim_pin *pins;
	size_t n_pins, cap_pins;
	uint64_t pinned; /* registered host bytes (a ledger: nothing is pinned) */
	arena_stream *streams;
	arena_event *events;
	uint64_t last_stream_id;
	arena_stream *host; /* the host stream, made by the first stream_native; not on `streams` */
	int cancel;
};

static const arena_backend_ops sim_ops;

/* --- workers --------------------------------------------------------------- */

/* Sleep on s->cv (b->mu held) until monotonic time `until` or cancel. */
static void sim_sleep_until(sim_backend *b, arena_stream *s, double until)
{
	double t;
	while (!b->cancel && (t = arena_now_s()) < until) {
		struct timespec ts = arena_timespec_at(until); /* saturated: never a deadline in the past */
		pthread_cond_timedwait(&s->cv, &b->mu, &ts);
	}
}

/* Is op `seq` of stream `id` done? (b->mu held) */
static int sim_seq_done(const sim_backend *b, uint64_t id, uint64_t seq)
{
	if (!id)
		return 1;
	for (const arena_stream *s = b->streams; s; s = s->next)
		if (s->id == id)
			return s->done >= seq;
	return 1; /* destroyed, so finished */
}

/* The decode of a SIM_DECODE op (b->mu not held): the view of the device
 * copy of the chunk, checked first, because a caller that decodes before its
 * copy has landed (or from another place) would otherwise have the decoder
 * write wherever the garbage exception indices point in host memory. */
static void sim_decode(const struct sim_op *op)
{
	const uint8_t *src = op->src;
	const arena_hb4 *h = &op->hb4;
	arena_hb4 view;
	int bad = arena_hb4_parse(src, op->bytes, 2 * h->words, "sim: decode_hb4: the device bytes at src", &view);
	if (bad || memcmp(view.table, h->table, sizeof(h->table))) {
		fprintf(stderr, "%s\n", bad ? arena_last_error() : "sim: decode_hb4: the device chunk's table differs from v's");
		ARENA_BUG("sim: decode_hb4: the device bytes at src are not the chunk v describes (decoded before its copy landed?)");
	}
	view = *h;
	view.nib = src + h->nib_off;
	view.low = src + h->low_off;
	view.exc_idx = src + h->idx_off;
	view.exc_hi = src + h->hi_off;
	arena_hb4_decode(&view, op->a, op->z, op->dst);
}

/* Run the head op of s (b->mu held; dropped around the memcpy and the decode). */
static void sim_run(sim_backend *b, arena_stream *s, const struct sim_op *op)
{
	switch (op->kind) {
	case SIM_COPY: {
		double end = 0;
		if (b->rate > 0) {
			double t = arena_now_s();
			double start = b->engine_idle_at > t ? b->engine_idle_at : t;
			end = start + (double)op->bytes / b->rate;
			b->engine_idle_at = end;
		}
		pthread_mutex_unlock(&b->mu);
		memcpy(op->dst, op->src, (size_t)op->bytes);
		pthread_mutex_lock(&b->mu);
		sim_sleep_until(b, s, end);
		break;
	}
	case SIM_WAIT:
		while (!b->cancel && !sim_seq_done(b, op->wait_stream, op->wait_seq))
			pthread_cond_wait(&b->progress, &b->mu);
		break;
	case SIM_COMPUTE:
		sim_sleep_until(b, s, arena_now_s() + op->seconds);
		break;
	case SIM_MARK:
		if (op->ev->stream == s->id && op->ev->seq == op->seq) /* not recorded again since */
			op->ev->t = arena_now_s();
		break;
	case SIM_DECODE:
		pthread_mutex_unlock(&b->mu);
		sim_decode(op);
		pthread_mutex_lock(&b->mu);
		break;
	}
}

static void *sim_worker(void *arg)
{
	arena_stream *s = arg;
	sim_backend *b = s->b;
	pthread_mutex_lock(&b->mu);
	for (;;) {
		while (!s->head && !s->stop)
			pthread_cond_wait(&s->cv, &b->mu);
		struct sim_op *op = s->head;
		if (!op)
			break;
		if (!b->cancel)
			sim_run(b, s, op);
		if (op->kind == SIM_MARK)
			op->ev->marks--; /* run or cancelled: the event may go */
		/* Ops may have been queued behind op while the lock was dropped. */
		s->head = op->next;
		if (!s->head)
			s->tail = NULL;
		s->done = op->seq;
		arena_free(op);
		pthread_cond_broadcast(&b->progress);
	}
	pthread_mutex_unlock(&b->mu);
	return NULL;
}

/* The host stream queues nothing: a USAGE error for `what` there, else 0. */
static int sim_not_host(const arena_stream *s, const char *what)
{
	if (s && s->host)
		return arena_errorf(ARENA_E_USAGE, "sim: %s on the host stream (it runs nothing; use a stream of its own)",
				    what);
	return 0;
}

/* Append op to s and wake its worker (b->mu held). */
static void sim_enqueue(arena_stream *s, struct sim_op *op)
{
	op->next = NULL;
	op->seq = ++s->queued;
	if (s->tail)
		s->tail->next = op;
	else
		s->head = op;
	s->tail = op;
	pthread_cond_signal(&s->cv);
}

/* --- tables ----------------------------------------------------------------- */

/* Make room for one more entry in a table of `size`-byte entries. */
static int sim_grow(void **tab, size_t n, size_t *cap, size_t size)
{
	if (n < *cap)
		return 0;
	size_t ncap = *cap ? *cap * 2 : 16;
	void *t = arena_realloc(*tab, ncap * size);
	if (!t)
		return arena_errorf(ARENA_E_NOMEM, "sim: out of memory");
	*tab = t;
	*cap = ncap;
	return 0;
}

/* The allocation that holds [p, p + bytes) whole, or NULL (b->mu held). */
static const struct sim_alloc *sim_find(const sim_backend *b, const void *p, uint64_t bytes)
{
	uintptr_t c = (uintptr_t)p;
	for (size_t i = 0; i < b->n_allocs; i++) {
		uintptr_t d = (uintptr_t)b->allocs[i].dptr;
		if (c >= d && c - d <= b->allocs[i].size && bytes <= b->allocs[i].size - (c - d))
			return &b->allocs[i];
	}
	return NULL;
}

/* Free device memory (b->mu held). */
static uint64_t sim_free(const sim_backend *b)
{
	return b->capacity - b->allocated - b->pressure - b->context - b->rest;
}

/* The peak follows the process's memory (b->mu held). */
static void sim_note_peak(sim_backend *b)
{
	uint64_t now = b->context + b->rest + b->allocated;
	if (now > b->peak)
		b->peak = now;
}

/* --- ops ---------------------------------------------------------------------- */

static int sim_proc_mem(arena_backend *base, uint64_t *bytes)
{
	sim_backend *b = (sim_backend *)base;
	pthread_mutex_lock(&b->mu);
	*bytes = b->context + b->rest + b->allocated;
	pthread_mutex_unlock(&b->mu);
	return 0;
}

static int sim_mem_info(arena_backend *base, uint64_t *free_bytes, uint64_t *total_bytes)
{
	sim_backend *b = (sim_backend *)base;
	pthread_mutex_lock(&b->mu);
	*free_bytes = sim_free(b);
	*total_bytes = b->capacity;
	pthread_mutex_unlock(&b->mu);
	return 0;
}

static int sim_dev_alloc(arena_backend *base, uint64_t bytes, void **dptr)
{
	sim_backend *b = (sim_backend *)base;
	int rc = 0;
	void *raw = NULL;
	*dptr = NULL;
	if (!bytes)
		return arena_errorf(ARENA_E_USAGE, "sim: cannot allocate 0 bytes");
	uint64_t g = b->base.alloc_granularity; /* a power of two >= SIM_ALIGN */
	uint64_t size = bytes > UINT64_MAX - g ? UINT64_MAX : (bytes + g - 1) & ~(g - 1);
	pthread_mutex_lock(&b->mu);
	uint64_t avail = sim_free(b);
	if (b->fail_left && !b->fail_skip) {
		b->fail_left--;
		rc = arena_errorf(ARENA_E(DEV_OOM), "sim: cannot allocate %llu bytes (an injected failure), %llu free of %llu",
				  (unsigned long long)bytes, (unsigned long long)avail, (unsigned long long)b->capacity);
	} else if (b->fail_left) {
		b->fail_skip--;
	}
	if (!rc && size > avail)
		rc = arena_errorf(ARENA_E(DEV_OOM), "sim: cannot allocate %llu bytes, %llu free of %llu",
				  (unsigned long long)bytes, (unsigned long long)avail,
				  (unsigned long long)b->capacity);
	if (!rc)
		rc = sim_grow((void **)&b->allocs, b->n_allocs, &b->cap_allocs, sizeof(*b->allocs));
	if (!rc && (size > SIZE_MAX - SIM_ALIGN || !(raw = arena_malloc((size_t)size + SIM_ALIGN - 1))))
		rc = arena_errorf(ARENA_E_NOMEM, "sim: out of host memory for %llu bytes of device memory",
				  (unsigned long long)bytes);
	if (!rc) {
		*dptr = (void *)(((uintptr_t)raw + SIM_ALIGN - 1) & ~(uintptr_t)(SIM_ALIGN - 1));
		b->allocs[b->n_allocs++] = (struct sim_alloc){*dptr, raw, size};
		b->allocated += size;
		sim_note_peak(b);
	}
	pthread_mutex_unlock(&b->mu);
	return rc;
}

static void sim_dev_free(arena_backend *base, void *dptr)
{
	sim_backend *b = (sim_backend *)base;
	if (!dptr)
		return;
	pthread_mutex_lock(&b->mu);
	size_t i = 0;
	while (i < b->n_allocs && b->allocs[i].dptr != dptr)
		i++;
	if (i == b->n_allocs)
		ARENA_BUG("sim: dev_free of a pointer that dev_alloc did not return");
	b->allocated -= b->allocs[i].size;
	arena_free(b->allocs[i].raw);
	b->allocs[i] = b->allocs[--b->n_allocs];
	pthread_mutex_unlock(&b->mu);
}

/* 1 if every page of [p, p + bytes) is mapped writable (/proc/self/maps),
 * 0 if not or unknown. CUDA refuses to register read-only memory without
 * cudaHostRegisterReadOnly, so the sim refuses it too. */
static int range_writable(const void *p, uint64_t bytes)
{
	FILE *f = fopen("/proc/self/maps", "re");
	if (!f)
		return 1; /* cannot tell: do not invent a failure */
	uintptr_t at = (uintptr_t)p, end = at + bytes;
	char line[512];
	int ok = 0;
	while (at < end && fgets(line, sizeof(line), f)) {
		unsigned long lo, hi;
		char perms[8];
		if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3)
			break;
		if (hi <= at)
			continue;
		if (lo > at || perms[1] != 'w')
			break;
		at = hi;
	}
	ok = at >= end;
	fclose(f);
	return ok;
}

/* Pin p in the ledger; `ro`: read-only memory is taken too (as
 * cudaHostRegisterReadOnly takes it). */
static int sim_pin(arena_backend *base, void *p, uint64_t bytes, int ro)
{
	sim_backend *b = (sim_backend *)base;
	uintptr_t c = (uintptr_t)p;
	int rc = 0;
	if (!p || !bytes)
		return arena_errorf(ARENA_E_USAGE, "sim: host_register of %s", p ? "0 bytes" : "a NULL pointer");
	if (!ro && !range_writable(p, bytes))
		return arena_errorf(ARENA_E(DEV_ERROR),
				    "sim: host_register of %llu bytes at %p: not writable memory (CUDA refuses it)",
				    (unsigned long long)bytes, p);
	pthread_mutex_lock(&b->mu);
	for (size_t i = 0; i < b->n_pins && !rc; i++) {
		uintptr_t q = (uintptr_t)b->pins[i].p;
		if (c - q < b->pins[i].bytes || q - c < bytes) /* the ranges intersect */
			rc = arena_errorf(ARENA_E(DEV_ERROR),
					  "sim: host_register of %llu bytes at %p: overlaps memory already registered",
					  (unsigned long long)bytes, p);
	}
	if (!rc)
		rc = sim_grow((void **)&b->pins, b->n_pins, &b->cap_pins, sizeof(*b->pins));
	if (!rc) {
		b->pins[b->n_pins++] = (struct sim_pin){p, bytes};
		b->pinned += bytes;
	}
	pthread_mutex_unlock(&b->mu);
	return rc;
}

static int sim_host_register(arena_backend *base, void *p, uint64_t bytes)
{
	return sim_pin(base, p, bytes, 0);
}

static int sim_host_register_ro(arena_backend *base, void *p, uint64_t bytes)
{
	return sim_pin(base, p, bytes, 1);
}

static void sim_host_unregister(arena_backend *base, void *p)
{
	sim_backend *b = (sim_backend *)base;
	if (!p)
		return;
	pthread_mutex_lock(&b->mu);
	size_t i = 0;
	while (i < b->n_pins && b->pins[i].p != p)
		i++;
	if (i == b->n_pins)
		ARENA_BUG("sim: host_unregister of memory that host_register did not register");
	b->pinned -= b->pins[i].bytes;
	b->pins[i] = b->pins[--b->n_pins];
	pthread_mutex_unlock(&b->mu);
}

static int sim_stream_create(arena_backend *base, arena_stream **out)
{
	sim_backend *b = (sim_backend *)base;
	int rc = 0, err;
	*out = NULL;
	arena_stream *s = arena_calloc(1, sizeof(*s));
	if (!s)
		return arena_errorf(ARENA_E_NOMEM, "sim: out of memory for a stream");
	s->b = b;
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	err = pthread_cond_init(&s->cv, &ca);
	pthread_condattr_destroy(&ca);
	if (err) {
		rc = arena_syserrorf(ARENA_E_NOMEM, err, "sim: cannot create a stream");
		goto out;
	}
	/* On the list before the worker starts: the worker only ever sees it there. */
	pthread_mutex_lock(&b->mu);
	s->id = ++b->last_stream_id;
	s->next = b->streams;
	b->streams = s;
	err = pthread_create(&s->thread, NULL, sim_worker, s);
	if (err) {
		b->streams = s->next;
		rc = arena_syserrorf(ARENA_E_NOMEM, err, "sim: cannot start a stream worker");
	}
	pthread_mutex_unlock(&b->mu);
	if (rc)
		pthread_cond_destroy(&s->cv);
out:
	if (rc)
		arena_free(s);
	else
		*out = s;
	return rc;
}

/* Tell s's worker to exit once its queue is empty (at once, on cancel) and
 * join it. s stays on b->streams until the caller unlinks it. */
static void sim_stream_join(sim_backend *b, arena_stream *s)
{
	pthread_mutex_lock(&b->mu);
	s->stop = 1;
	pthread_cond_signal(&s->cv);
	pthread_mutex_unlock(&b->mu);
	pthread_join(s->thread, NULL);
}

/* Contract (sim): waits until the work queued on s is done, then frees it;
 * events recorded on s count as done afterwards. */
static void sim_stream_destroy(arena_backend *base, arena_stream *s)
{
	sim_backend *b = (sim_backend *)base;
	if (!s)
		return;
	if (s->host)
		ARENA_BUG("sim: stream_destroy of the host stream (stream_native's streams are borrowed)");
	sim_stream_join(b, s);
	pthread_mutex_lock(&b->mu);
	arena_stream **pp = &b->streams;
	while (*pp != s)
		pp = &(*pp)->next;
	*pp = s->next;
	pthread_mutex_unlock(&b->mu);
	pthread_cond_destroy(&s->cv);
	arena_free(s);
}

static int sim_stream_sync(arena_backend *base, arena_stream *s)
{
	sim_backend *b = (sim_backend *)base;
	pthread_mutex_lock(&b->mu);
	uint64_t target = s->queued;
	while (s->done < target)
		pthread_cond_wait(&b->progress, &b->mu);
	pthread_mutex_unlock(&b->mu);
	return 0;
}

static int sim_copy_h2d(arena_backend *base, void *dst, const void *src, uint64_t bytes, arena_stream *s)
{
	sim_backend *b = (sim_backend *)base;
	int rc = sim_not_host(s, "copy_h2d");
	if (rc || !bytes)
		return rc;
	struct sim_op *op = arena_calloc(1, sizeof(*op));
	if (!op)
		return arena_errorf(ARENA_E_NOMEM, "sim: out of memory for a copy");
	*op = (struct sim_op){.kind = SIM_COPY, .dst = dst, .src = src, .bytes = bytes};
	pthread_mutex_lock(&b->mu);
	if (!src || !sim_find(b, dst, bytes))
		rc = arena_errorf(ARENA_E_USAGE, "sim: copy_h2d of %llu bytes to %p: %s", (unsigned long long)bytes,
				  dst, src ? "not inside one device allocation" : "NULL source");
	else
		sim_enqueue(s, op);
	pthread_mutex_unlock(&b->mu);
	if (rc)
		arena_free(op);
	return rc;
}

static int sim_copy_d2h_sync(arena_backend *base, void *dst, const void *src, uint64_t bytes)
{
	sim_backend *b = (sim_backend *)base;
	int rc = 0;
	if (!bytes)
		return 0;
	pthread_mutex_lock(&b->mu);
	if (!dst || !sim_find(b, src, bytes))
		rc = arena_errorf(ARENA_E_USAGE, "sim: copy_d2h_sync of %llu bytes from %p: %s",
				  (unsigned long long)bytes, src, dst ? "not inside one device allocation" : "NULL destination");
	pthread_mutex_unlock(&b->mu);
	if (!rc)
		memcpy(dst, src, (size_t)bytes);
	return rc;
}

/* Contract (sim): the arguments are checked as cuda's are (an even range
 * within the chunk, a parse whose offsets agree with its counts) and, as for
 * copies, src must hold the whole stored chunk and dst the z - a bytes inside
 * one device allocation each. The op copies v's counts, offsets and table;
 * the worker decodes from the device copy (see sim_decode). */
static int sim_decode_hb4(arena_backend *base, void *dst, const void *src, const struct arena_hb4 *v, uint64_t a,
			  uint64_t z, arena_stream *s)
{
	sim_backend *b = (sim_backend *)base;
	int rc = arena_hb4_decode_args("sim", dst, src, v, a, z);
	if (!rc)
		rc = sim_not_host(s, "decode_hb4");
	if (rc || a == z)
		return rc;
	const uint64_t E = v->n_exc;
	const uint64_t stored = v->hi_off + E;
	struct sim_op *op = arena_calloc(1, sizeof(*op));
	if (!op)
		return arena_errorf(ARENA_E_NOMEM, "sim: out of memory for a decode");
	*op = (struct sim_op){.kind = SIM_DECODE, .dst = dst, .src = src, .bytes = stored, .hb4 = *v, .a = a, .z = z};
	op->hb4.nib = op->hb4.low = op->hb4.exc_idx = op->hb4.exc_hi = NULL; /* the caller's host planes */
	pthread_mutex_lock(&b->mu);
	if (!sim_find(b, src, stored))
		rc = arena_errorf(ARENA_E_USAGE,
				  "sim: decode_hb4 from %p: the chunk's %llu stored bytes are not inside one device allocation",
				  src, (unsigned long long)stored);
	else if (!sim_find(b, dst, z - a))
		rc = arena_errorf(ARENA_E_USAGE, "sim: decode_hb4 of %llu bytes to %p: not inside one device allocation",
				  (unsigned long long)(z - a), dst);
	else
		sim_enqueue(s, op);
	pthread_mutex_unlock(&b->mu);
	if (rc)
		arena_free(op);
	return rc;
}

/* Contract (sim): src (and the scale) must lie inside one device allocation
 * each, as a copy's destination must; dst is the caller's host memory (a
 * torch CPU tensor: sim's device memory is host memory). Done on the calling
 * thread once s's queued work is. */
static int sim_dequant(arena_backend *base, const arena_dequant_job *j, arena_stream *s)
{
	sim_backend *b = (sim_backend *)base;
	const uint64_t bytes = arena__dq_src_bytes(j), scale_bytes = arena__dq_scale_bytes(j);
	pthread_mutex_lock(&b->mu);
	const int src_ok = !j->n || sim_find(b, j->src, bytes);
	const int scale_ok = !j->scale_n || sim_find(b, j->scale, scale_bytes);
	const int zero_ok = !j->group || !j->scale_n || sim_find(b, j->zero, j->scale_n);
	pthread_mutex_unlock(&b->mu);
	if (!src_ok || !scale_ok || !zero_ok)
		return arena_errorf(ARENA_E_USAGE, "sim: dequantize from %p: the tensor's %llu bytes%s are not inside one "
				    "device allocation",
				    !src_ok ? j->src : !scale_ok ? j->scale : (const void *)j->zero,
				    (unsigned long long)(!src_ok ? bytes : !scale_ok ? scale_bytes : j->scale_n),
				    !src_ok ? "" : !scale_ok ? " of scale" : " of zero points");
	int rc = sim_stream_sync(base, s);
	for (uint64_t i = 0; i < j->n && !rc; i++)
		arena__dq_one(j, i);
	return rc;
}

/* Contract (sim): x, q and scale are the caller's host memory (torch CPU
 * tensors); done on the calling thread once s's queued work is. */
static float sim_elem(const uint16_t *xr, const float *cs, uint64_t i)
{
	const float v = arena__bf16_to_f32(xr[i]);
	return cs ? v * cs[i] : v;
}

static int sim_fp8_rows(arena_backend *base, const void *x, uint64_t rows, uint64_t cols, const float *col_scale,
			void *q, float *scale, arena_stream *s)
{
	int rc = sim_stream_sync(base, s);
	const uint16_t *xs = x;
	uint8_t *qs = q;
	for (uint64_t r = 0; r < rows && !rc; r++) {
		const uint16_t *xr = xs + r * cols;
		float m = 0.0f;
		for (uint64_t i = 0; i < cols; i++)
			m = arena__amax_step(m, sim_elem(xr, col_scale, i));
		const float sc = arena__e4m3_row_scale(m);
		scale[r] = sc;
		for (uint64_t i = 0; i < cols; i++)
			qs[r * cols + i] = (uint8_t)arena__f32_to_e4m3_sat(ARENA__DIV(sim_elem(xr, col_scale, i), sc));
	}
	return rc;
}

static int sim_transpose8(arena_backend *base, const void *x, uint64_t rows, uint64_t cols, void *t, arena_stream *s)
{
	int rc = sim_stream_sync(base, s);
	const uint8_t *xs = x;
	uint8_t *ts = t;
	for (uint64_t r = 0; r < rows && !rc; r++)
		for (uint64_t c = 0; c < cols; c++)
			ts[c * rows + r] = xs[r * cols + c];
	return rc;
}

static int sim_event_create(arena_backend *base, arena_event **out)
{
	sim_backend *b = (sim_backend *)base;
	*out = NULL;
	arena_event *e = arena_calloc(1, sizeof(*e));
	if (!e)
		return arena_errorf(ARENA_E_NOMEM, "sim: out of memory for an event");
	pthread_mutex_lock(&b->mu);
	e->next = b->events;
	if (b->events)
		b->events->prev = e;
	b->events = e;
	pthread_mutex_unlock(&b->mu);
	*out = e;
	return 0;
}

static int sim_event_create_timed(arena_backend *base, arena_event **out)
{
	int rc = sim_event_create(base, out);
	if (!rc)
		(*out)->timed = 1;
	return rc;
}

static void sim_event_destroy(arena_backend *base, arena_event *e)
{
	sim_backend *b = (sim_backend *)base;
	if (!e)
		return;
	pthread_mutex_lock(&b->mu);
	while (e->marks) /* a queued SIM_MARK still points at it */
		pthread_cond_wait(&b->progress, &b->mu);
	if (e->prev)
		e->prev->next = e->next;
	else
		b->events = e->next;
	if (e->next)
		e->next->prev = e->prev;
	pthread_mutex_unlock(&b->mu);
	arena_free(e);
}

static int sim_event_record(arena_backend *base, arena_event *e, arena_stream *s)
{
	sim_backend *b = (sim_backend *)base;
	struct sim_op *op = NULL;
	if (s->host) { /* the caller's host work before this call is done: so is the event */
		pthread_mutex_lock(&b->mu);
		e->stream = s->id;
		e->seq = 0;
		e->t = arena_now_s();
		pthread_mutex_unlock(&b->mu);
		return 0;
	}
	if (e->timed && !(op = arena_calloc(1, sizeof(*op))))
		return arena_errorf(ARENA_E_NOMEM, "sim: out of memory for an event");
	pthread_mutex_lock(&b->mu);
	if (op) {
		*op = (struct sim_op){.kind = SIM_MARK, .ev = e};
		sim_enqueue(s, op);
		e->marks++;
		e->t = 0;
	}
	e->stream = s->id;
	e->seq = s->queued;
	pthread_mutex_unlock(&b->mu);
	return 0;
}

static int sim_event_elapsed(arena_backend *base, arena_event *a, arena_event *z, double *seconds)
{
	sim_backend *b = (sim_backend *)base;
	int rc = 0;
	*seconds = 0;
	pthread_mutex_lock(&b->mu);
	if (!a->timed || !z->timed || !a->stream || !z->stream)
		rc = arena_errorf(ARENA_E_USAGE, "sim: event_elapsed of an event %s",
				  !a->timed || !z->timed ? "that is not timed" : "never recorded");
	else if (!sim_seq_done(b, a->stream, a->seq) || !sim_seq_done(b, z->stream, z->seq))
		rc = 1;
	else
		*seconds = z->t - a->t;
	pthread_mutex_unlock(&b->mu);
	return rc;
}

static int sim_event_query(arena_backend *base, arena_event *e)
{
	sim_backend *b = (sim_backend *)base;
	pthread_mutex_lock(&b->mu);
	int done = sim_seq_done(b, e->stream, e->seq);
	pthread_mutex_unlock(&b->mu);
	return done;
}

static int sim_event_sync(arena_backend *base, arena_event *e)
{
	sim_backend *b = (sim_backend *)base;
	pthread_mutex_lock(&b->mu);
	uint64_t id = e->stream, seq = e->seq;
	while (!sim_seq_done(b, id, seq))
		pthread_cond_wait(&b->progress, &b->mu);
	pthread_mutex_unlock(&b->mu);
	return 0;
}

static int sim_stream_wait(arena_backend *base, arena_stream *s, arena_event *e)
{
	sim_backend *b = (sim_backend *)base;
	if (s->host)
		return base->ops->event_sync(base, e);
	struct sim_op *op = arena_calloc(1, sizeof(*op));
	if (!op)
		return arena_errorf(ARENA_E_NOMEM, "sim: out of memory for a stream wait");
	pthread_mutex_lock(&b->mu);
	*op = (struct sim_op){.kind = SIM_WAIT, .wait_stream = e->stream, .wait_seq = e->seq};
	if (sim_seq_done(b, op->wait_stream, op->wait_seq)) {
		arena_free(op); /* nothing to wait for */
	} else {
		sim_enqueue(s, op);
	}
	pthread_mutex_unlock(&b->mu);
	return 0;
}

static int sim_stream_native(arena_backend *base, void *native, arena_stream **out)
{
	sim_backend *b = (sim_backend *)base;
	int rc = 0;
	*out = NULL;
	if (native)
		return arena_errorf(ARENA_E_USAGE, "sim: a stream handle was given (%p); the simulator has none: pass NULL",
				    native);
	pthread_mutex_lock(&b->mu);
	if (!b->host) {
		arena_stream *s = arena_calloc(1, sizeof(*s));
		if (!s || pthread_cond_init(&s->cv, NULL)) {
			arena_free(s);
			rc = arena_errorf(ARENA_E_NOMEM, "sim: out of memory for the host stream");
		} else {
			s->b = b;
			s->host = 1;
			s->id = ++b->last_stream_id;
			b->host = s;
		}
	}
	*out = b->host;
	pthread_mutex_unlock(&b->mu);
	return rc;
}

static void sim_destroy(arena_backend *base)
{
	sim_backend *b = (sim_backend *)base;
	pthread_mutex_lock(&b->mu);
	b->cancel = 1;
	for (arena_stream *s = b->streams; s; s = s->next)
		pthread_cond_signal(&s->cv);
	pthread_cond_broadcast(&b->progress);
	pthread_mutex_unlock(&b->mu);
	/* Workers exit at once now (invariant 4); nothing else touches the lists. */
	while (b->streams) {
		arena_stream *s = b->streams;
		sim_stream_join(b, s);
		b->streams = s->next;
		pthread_cond_destroy(&s->cv);
		arena_free(s);
	}
	if (b->host) {
		pthread_cond_destroy(&b->host->cv);
		arena_free(b->host);
	}
	while (b->events) {
		arena_event *e = b->events;
		b->events = e->next;
		arena_free(e);
	}
	for (size_t i = 0; i < b->n_allocs; i++)
		arena_free(b->allocs[i].raw);
	arena_free(b->allocs);
	arena_free(b->pins);
	pthread_cond_destroy(&b->progress);
	pthread_mutex_destroy(&b->mu);
	arena_free(b);
}

static const arena_backend_ops sim_ops = {
	.name = "sim",
	.mem_info = sim_mem_info,
	.proc_mem = sim_proc_mem,
	.dev_alloc = sim_dev_alloc,
	.dev_free = sim_dev_free,
	.host_register = sim_host_register,
	.host_register_ro = sim_host_register_ro,
	.host_unregister = sim_host_unregister,
	.stream_create = sim_stream_create,
	.stream_destroy = sim_stream_destroy,
	.stream_sync = sim_stream_sync,
	.copy_h2d = sim_copy_h2d,
	.copy_d2h_sync = sim_copy_d2h_sync,
	.event_create = sim_event_create,
	.event_destroy = sim_event_destroy,
	.event_record = sim_event_record,
	.event_query = sim_event_query,
	.event_sync = sim_event_sync,
	.stream_wait = sim_stream_wait,
	.stream_native = sim_stream_native,
	.event_create_timed = sim_event_create_timed,
	.event_elapsed = sim_event_elapsed,
	.decode_hb4 = sim_decode_hb4,
	.dequant = sim_dequant,
	.fp8_rows = sim_fp8_rows,
	.transpose8 = sim_transpose8,
	.destroy = sim_destroy,
};

/* --- public ------------------------------------------------------------------ */

int arena_backend_sim_create(const arena_sim_opts *o, arena_backend **out)
{
	*out = NULL;
	uint64_t capacity = o && o->capacity ? o->capacity : SIM_DEFAULT_CAPACITY;
	double rate = o ? o->h2d_bytes_per_s : 0;
	if (!arena_sim_rate_ok(rate))
		return arena_errorf(ARENA_E_USAGE, "sim: h2d_bytes_per_s %g is not 0 (unmodelled) or a rate from %g to %g bytes/s",
				    rate, ARENA_SIM_RATE_MIN, ARENA_SIM_RATE_MAX);
	uint64_t gran = o && o->alloc_granularity ? o->alloc_granularity : SIM_ALIGN;
	if (gran < SIM_ALIGN || (gran & (gran - 1)) || gran > (1ull << 30))
		return arena_errorf(ARENA_E_USAGE, "sim: alloc_granularity %llu is not a power of two from 256 to 1 GiB",
				    (unsigned long long)gran);
	uint64_t context = o ? o->context : 0;
	if (context > capacity)
		return arena_errorf(ARENA_E_USAGE, "sim: a context of %llu bytes does not fit a capacity of %llu",
				    (unsigned long long)context, (unsigned long long)capacity);
	sim_backend *b = arena_calloc(1, sizeof(*b));
	if (!b)
		return arena_errorf(ARENA_E_NOMEM, "sim: out of memory");
	pthread_condattr_t ca;
	int err = pthread_mutex_init(&b->mu, NULL);
	if (!err) {
		pthread_condattr_init(&ca);
		pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
		err = pthread_cond_init(&b->progress, &ca);
		pthread_condattr_destroy(&ca);
		if (err)
			pthread_mutex_destroy(&b->mu);
	}
	if (err) {
		arena_free(b);
		return arena_syserrorf(ARENA_E_NOMEM, err, "sim: cannot create the backend");
	}
	b->base.ops = &sim_ops;
	b->base.alloc_granularity = gran;
	b->capacity = capacity;
	b->rate = rate;
	b->context = context;
	b->peak = context;
	*out = &b->base;
	return 0;
}

static sim_backend *as_sim(arena_backend *b, const char *what)
{
	if (!b || b->ops != &sim_ops) {
		arena_errorf(ARENA_E_USAGE, "%s: not a sim backend", what);
		return NULL;
	}
	return (sim_backend *)b;
}

int arena_backend_sim_pressure(arena_backend *base, uint64_t bytes)
{
	sim_backend *b = as_sim(base, "sim pressure");
	int rc = 0;
	if (!b)
		return ARENA_E_USAGE;
	pthread_mutex_lock(&b->mu);
	uint64_t avail = sim_free(b) + b->pressure;
	if (bytes > avail)
		rc = arena_errorf(ARENA_E(DEV_OOM), "sim: outside pressure of %llu bytes does not fit, %llu free of %llu",
				  (unsigned long long)bytes, (unsigned long long)avail, (unsigned long long)b->capacity);
	else
		b->pressure = bytes;
	pthread_mutex_unlock(&b->mu);
	return rc;
}

int arena_backend_sim_rest(arena_backend *base, uint64_t bytes)
{
	sim_backend *b = as_sim(base, "sim rest");
	int rc = 0;
	if (!b)
		return ARENA_E_USAGE;
	pthread_mutex_lock(&b->mu);
	uint64_t avail = sim_free(b) + b->rest;
	if (bytes > avail) {
		rc = arena_errorf(ARENA_E(DEV_OOM), "sim: the rest of the process cannot hold %llu bytes, %llu free of %llu",
				  (unsigned long long)bytes, (unsigned long long)avail, (unsigned long long)b->capacity);
	} else {
		b->rest = bytes;
		sim_note_peak(b);
	}
	pthread_mutex_unlock(&b->mu);
	return rc;
}

int arena_backend_sim_fail_alloc(arena_backend *base, uint64_t after, uint64_t count)
{
	sim_backend *b = as_sim(base, "sim fail_alloc");
	if (!b)
		return ARENA_E_USAGE;
	pthread_mutex_lock(&b->mu);
	b->fail_skip = count ? after : 0;
	b->fail_left = count;
	pthread_mutex_unlock(&b->mu);
	return 0;
}

int arena_backend_sim_peak(arena_backend *base, int reset, uint64_t *peak)
{
	sim_backend *b = as_sim(base, "sim peak");
	if (!b)
		return ARENA_E_USAGE;
	pthread_mutex_lock(&b->mu);
	*peak = b->peak;
	if (reset)
		b->peak = b->context + b->rest + b->allocated;
	pthread_mutex_unlock(&b->mu);
	return 0;
}

int arena_backend_sim_compute(arena_backend *base, arena_stream *s, double seconds)
{
	sim_backend *b = as_sim(base, "sim compute");
	if (!b)
		return ARENA_E_USAGE;
	if (!(seconds >= 0) || isinf(seconds))
		return arena_errorf(ARENA_E_USAGE, "sim: compute of %g seconds", seconds);
	struct sim_op *op = arena_calloc(1, sizeof(*op));
	if (!op)
		return arena_errorf(ARENA_E_NOMEM, "sim: out of memory for a compute op");
	if (s->host) { /* the host computes: sleep here */
		arena_free(op);
		arena_sleep_s(seconds);
		return 0;
	}
	*op = (struct sim_op){.kind = SIM_COMPUTE, .seconds = seconds};
	pthread_mutex_lock(&b->mu);
	sim_enqueue(s, op);
	pthread_mutex_unlock(&b->mu);
	return 0;
}
