/* trace.c - the engine's timeline in Chrome's trace-event format (trace.h). */
#include "trace.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/alloc.h"
#include "../common/clock.h"
#include "../common/err.h"
#include "../common/outfile.h"

#define TRACE_POOL_MAX 2048u
#define TRACE_STALL_S 2e-5 /* as the engine's step records count stalls */
#define TRACE_LANES 16
#define TID_HOST 1
#define TID_COPY 2
#define TID_CALLER 3

enum { R_COPY, R_COMPUTE, R_INSTANT, R_COUNTER };
enum { S_FREE, S_OPEN, S_RECORDED };

typedef struct tr_rec {
	double t[3];   /* seconds from the reference: copy start, end; acquire ready, start, release; host: t[0] */
	uint64_t step;
	uint64_t v[3]; /* copy: bytes; instant: its value; counter: resident, ring, free */
	uint32_t block;
	uint32_t occ;  /* acquire: the nth of its block in its step (0 the first) */
	uint8_t kind, sub;
	uint8_t done;  /* its times are in */
} tr_rec;

typedef struct tr_slot {
	arena_event *ev[3];
	size_t rec;
	int next;      /* the free list, or the next open acquire of the same block */
	unsigned skip; /* releases that belong to dropped acquires before this one */
	uint8_t state, nev;
} tr_slot;

struct arena_trace {
	arena_backend *be;
	const arena_layout *l;
	arena_outfile *f;
	char *label;
	arena_event *ref;
	double host0; /* host time when the reference was done */
	tr_rec *rec;
	size_t n_rec, cap_rec;
	tr_slot *slot;
	unsigned n_slot;
	int free_head;
	int *open_head, *open_tail; /* per block: its open acquires, oldest first */
	unsigned *tail_drops;       /* per block: acquires dropped after its last open one */
	uint32_t *occ;              /* per block: acquires in step occ_step */
	uint64_t occ_step;
	uint64_t dropped;
};

uint64_t arena_trace_dropped(const arena_trace *t)
{
	return t->dropped;
}

static void trace_free(arena_trace *t)
{
	if (!t)
		return;
	arena_backend *be = t->be;
	for (unsigned k = 0; t->slot && k < t->n_slot; k++)
		for (int i = 0; i < 3; i++)
			if (t->slot[k].ev[i])
				be->ops->event_destroy(be, t->slot[k].ev[i]);
	if (t->ref)
		be->ops->event_destroy(be, t->ref);
	arena_outfile_abort(t->f);
	arena_free(t->label);
	arena_free(t->rec);
	arena_free(t->slot);
	arena_free(t->open_head);
	arena_free(t->open_tail);
	arena_free(t->tail_drops);
	arena_free(t->occ);
	arena_free(t);
}

int arena_trace_open(arena_backend *be, const arena_layout *l, const char *path, const char *label,
		     size_t max_records, arena_trace **out)
{
	*out = NULL;
	if (!be->ops->event_create_timed || !be->ops->event_elapsed)
		return arena_errorf(ARENA_E_USAGE, "%s: trace: the %s backend cannot time its work", path, be->ops->name);
	if (max_records > ARENA_TRACE_MAX_RECORDS)
		return arena_errorf(ARENA_E_USAGE, "%s: trace: %zu records is more than %u", path, max_records,
				    ARENA_TRACE_MAX_RECORDS);
	if (!max_records)
		max_records = ARENA_TRACE_DEFAULT_RECORDS;
	arena_trace *t = arena_calloc(1, sizeof(*t));
	if (!t)
		return arena_errorf(ARENA_E_NOMEM, "%s: trace: out of memory", path);
	size_t n = l->n_blocks ? l->n_blocks : 1;
	t->be = be;
	t->l = l;
	t->cap_rec = max_records;
	t->n_slot = max_records < TRACE_POOL_MAX ? (unsigned)max_records : TRACE_POOL_MAX;
	t->rec = arena_calloc(t->cap_rec, sizeof(*t->rec));
	t->slot = arena_calloc(t->n_slot, sizeof(*t->slot));
	t->open_head = arena_malloc(n * sizeof(int));
	t->open_tail = arena_malloc(n * sizeof(int));
	t->tail_drops = arena_calloc(n, sizeof(unsigned));
	t->occ = arena_calloc(n, sizeof(uint32_t));
	t->label = arena_strdup(label ? label : "");
	int rc = 0;
	if (!t->rec || !t->slot || !t->open_head || !t->open_tail || !t->tail_drops || !t->occ || !t->label) {
		rc = arena_errorf(ARENA_E_NOMEM, "%s: trace: out of memory", path);
		goto fail;
	}
	for (size_t b = 0; b < n; b++)
		t->open_head[b] = t->open_tail[b] = -1;
	for (unsigned k = 0; k < t->n_slot; k++) {
		t->slot[k].next = k + 1 < t->n_slot ? (int)k + 1 : -1;
		for (int i = 0; i < 3; i++)
			if ((rc = be->ops->event_create_timed(be, &t->slot[k].ev[i])))
				goto fail;
	}
	t->free_head = 0;
	if ((rc = arena_outfile_open(path, &t->f)))
		goto fail;
	/* The reference: on an idle stream of its own, done at once; the host
	 * time read right after it places host events on the device's line. */
	arena_stream *s = NULL;
	if ((rc = be->ops->event_create_timed(be, &t->ref)) || (rc = be->ops->stream_create(be, &s)) ||
	    (rc = be->ops->event_record(be, t->ref, s)) || (rc = be->ops->event_sync(be, t->ref))) {
		if (s)
			be->ops->stream_destroy(be, s);
		goto fail;
	}
	t->host0 = arena_now_s();
	be->ops->stream_destroy(be, s);
	*out = t;
	return 0;
fail:
	trace_free(t);
	return rc;
}

/* A record, or NULL (counted as dropped) when the buffer is full. */
static tr_rec *new_rec(arena_trace *t, int kind, uint32_t b, uint64_t step)
{
	if (t->n_rec == t->cap_rec) {
		t->dropped++;
		return NULL;
	}
	tr_rec *r = &t->rec[t->n_rec++];
	memset(r, 0, sizeof(*r));
	r->kind = (uint8_t)kind;
	r->block = b;
	r->step = step;
	return r;
}

/* A free slot, reading what the device has done when none is: its index,
 * or -1 (none: the record is dropped), or an error. */
static int take_slot(arena_trace *t, int *k)
{
	*k = -1;
	if (t->free_head < 0) {
		int rc = arena_trace_poll(t);
		if (rc)
			return rc;
	}
	if (t->free_head < 0)
		return 0;
	*k = t->free_head;
	t->free_head = t->slot[*k].next;
	t->slot[*k].next = -1;
	t->slot[*k].skip = 0;
	return 0;
}

static void put_slot(arena_trace *t, int k)
{
	t->slot[k].state = S_FREE;
	t->slot[k].next = t->free_head;
	t->free_head = k;
}

/* A timed record: a slot and a record, the first event recorded on s. *k is
 * -1 when either is full (dropped). */
static int timed_begin(arena_trace *t, int kind, uint32_t b, uint64_t step, arena_stream *s, int *k)
{
	int rc;
	*k = -1;
	if (t->n_rec == t->cap_rec) {
		t->dropped++;
		return 0;
	}
	if ((rc = take_slot(t, k)))
		return rc;
	if (*k < 0) {
		t->dropped++;
		return 0;
	}
	tr_slot *sl = &t->slot[*k];
	sl->rec = t->n_rec;
	new_rec(t, kind, b, step);
	sl->state = S_OPEN;
	sl->nev = kind == R_COPY ? 2 : 3;
	if ((rc = t->be->ops->event_record(t->be, sl->ev[0], s))) {
		put_slot(t, *k); /* the record stays without times: not written */
		*k = -1;
	}
	return rc;
}

int arena_trace_copy_begin(arena_trace *t, arena_stream *s, uint32_t b, uint64_t bytes, int kind, uint64_t step,
			   int *slot)
{
	int rc = timed_begin(t, R_COPY, b, step, s, slot);
	if (*slot >= 0) {
		tr_rec *r = &t->rec[t->slot[*slot].rec];
		r->v[0] = bytes;
		r->sub = (uint8_t)kind;
	}
	return rc;
}

int arena_trace_copy_end(arena_trace *t, int k, arena_stream *s)
{
	if (k < 0)
		return 0;
	int rc = t->be->ops->event_record(t->be, t->slot[k].ev[1], s);
	if (!rc)
		t->slot[k].state = S_RECORDED;
	return rc;
}

int arena_trace_acquire_ready(arena_trace *t, arena_stream *s, uint32_t b, uint64_t step, int *slot)
{
	if (step != t->occ_step) {
		memset(t->occ, 0, t->l->n_blocks * sizeof(*t->occ));
		t->occ_step = step;
	}
	uint32_t occ = t->occ[b]++;
	int rc = timed_begin(t, R_COMPUTE, b, step, s, slot);
	if (*slot < 0) {
		if (!rc)
			t->tail_drops[b]++; /* its release is not traced either */
		return rc;
	}
	tr_slot *sl = &t->slot[*slot];
	t->rec[sl->rec].occ = occ;
	sl->skip = t->tail_drops[b];
	t->tail_drops[b] = 0;
	if (t->open_tail[b] >= 0)
		t->slot[t->open_tail[b]].next = *slot;
	else
		t->open_head[b] = *slot;
	t->open_tail[b] = *slot;
	return 0;
}

int arena_trace_acquire_start(arena_trace *t, int k, arena_stream *s)
{
	if (k < 0)
		return 0;
	return t->be->ops->event_record(t->be, t->slot[k].ev[1], s);
}

int arena_trace_release(arena_trace *t, uint32_t b, arena_stream *s)
{
	int k = t->open_head[b];
	if (k < 0) {
		if (t->tail_drops[b])
			t->tail_drops[b]--;
		return 0;
	}
	tr_slot *sl = &t->slot[k];
	if (sl->skip) { /* a dropped acquire before this one is the one released */
		sl->skip--;
		return 0;
	}
	t->open_head[b] = sl->next;
	if (t->open_head[b] < 0)
		t->open_tail[b] = -1;
	sl->next = -1;
	int rc = t->be->ops->event_record(t->be, sl->ev[2], s);
	if (!rc)
		sl->state = S_RECORDED;
	return rc;
}

void arena_trace_instant(arena_trace *t, int kind, uint32_t b, uint64_t step, uint64_t value)
{
	tr_rec *r = new_rec(t, R_INSTANT, b, step);
	if (!r)
		return;
	r->sub = (uint8_t)kind;
	r->v[0] = value;
	r->t[0] = arena_now_s() - t->host0;
	r->done = 1;
}

void arena_trace_counter(arena_trace *t, uint64_t resident, uint64_t ring, uint64_t free_bytes)
{
	tr_rec *r = new_rec(t, R_COUNTER, 0, 0);
	if (!r)
		return;
	r->v[0] = resident;
	r->v[1] = ring;
	r->v[2] = free_bytes;
	r->t[0] = arena_now_s() - t->host0;
	r->done = 1;
}

int arena_trace_poll(arena_trace *t)
{
	arena_backend *be = t->be;
	for (unsigned k = 0; k < t->n_slot; k++) {
		tr_slot *sl = &t->slot[k];
		if (sl->state != S_RECORDED)
			continue;
		double v[3];
		int rc = 0;
		for (unsigned i = 0; i < sl->nev && !rc; i++)
			rc = be->ops->event_elapsed(be, t->ref, sl->ev[i], &v[i]);
		if (rc < 0)
			return rc;
		if (rc > 0)
			continue; /* not done yet */
		tr_rec *r = &t->rec[sl->rec];
		memcpy(r->t, v, sl->nev * sizeof(*v));
		r->done = 1;
		put_slot(t, (int)k);
	}
	return 0;
}

/* --- the file ------------------------------------------------------------------ */

#define JW_BUF (64u << 10)

typedef struct jw {
	arena_outfile *f;
	char *buf;
	size_t n;
	int rc;
} jw;

static void jw_flush(jw *w)
{
	if (!w->rc && w->n)
		w->rc = arena_outfile_write(w->f, w->buf, w->n);
	w->n = 0;
}

static void jw_printf(jw *w, const char *fmt, ...) ARENA_PRINTF(2, 3);
static void jw_printf(jw *w, const char *fmt, ...)
{
	if (w->rc)
		return;
	if (JW_BUF - w->n < 1024)
		jw_flush(w);
	va_list ap;
	va_start(ap, fmt);
	int k = vsnprintf(w->buf + w->n, JW_BUF - w->n, fmt, ap);
	va_end(ap);
	if (k < 0 || (size_t)k >= JW_BUF - w->n)
		w->rc = arena_errorf(ARENA_E_INTERNAL, "trace: an event does not fit the write buffer");
	else
		w->n += (size_t)k;
}

/* Text inside a JSON string: quotes, backslashes and control bytes escaped. */
static void jw_esc(jw *w, const char *s)
{
	for (; *s && !w->rc; s++) {
		unsigned char c = (unsigned char)*s;
		if (JW_BUF - w->n < 16)
			jw_flush(w);
		if (c == '"' || c == '\\')
			w->n += (size_t)snprintf(w->buf + w->n, 3, "\\%c", c);
		else if (c < 0x20)
			w->n += (size_t)snprintf(w->buf + w->n, 7, "\\u%04x", c);
		else
			w->buf[w->n++] = (char)c;
	}
}

/* pre, then s escaped, then post: pre and post hold the quotes. */
static void jw_str(jw *w, const char *pre, const char *s, const char *post)
{
	jw_printf(w, "%s", pre);
	jw_esc(w, s);
	jw_printf(w, "%s", post);
}

/* One thing to write: record `rec`'s main event, its stall, or the copy's
 * "streamed this step" counter, at time ts. */
typedef struct item {
	double ts;
	size_t rec;
	int what; /* 0 main, 1 stall, 2 streamed counter */
} item;

static int item_cmp(const void *pa, const void *pb)
{
	const item *a = pa, *b = pb;
	if (a->ts != b->ts)
		return a->ts < b->ts ? -1 : 1;
	if (a->rec != b->rec)
		return a->rec < b->rec ? -1 : 1;
	return a->what - b->what;
}

static double us(double s)
{
	return s * 1e6;
}

static void write_event(jw *w, const arena_trace *t, const item *it, const uint8_t *lane, uint64_t streamed)
{
	const tr_rec *r = &t->rec[it->rec];
	const char *bn = r->block < t->l->n_blocks ? t->l->blocks[r->block].name : "?";
	jw_printf(w, ",\n");
	switch (r->kind) {
	case R_COPY:
		if (it->what == 2) {
			jw_printf(w,
				  "{\"name\":\"streamed this step\",\"ph\":\"C\",\"ts\":%.3f,\"pid\":1,\"tid\":%d,"
				  "\"args\":{\"bytes\":%" PRIu64 "}}",
				  us(r->t[1]), TID_COPY, streamed);
			break;
		}
		jw_str(w, "{\"name\":\"", bn, "\",");
		double d = r->t[1] - r->t[0];
		jw_printf(w,
			  "\"cat\":\"copy\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":1,\"tid\":%d,\"args\":{\"block\":%u,"
			  "\"bytes\":%" PRIu64 ",\"GB/s\":%.3f,\"kind\":\"%s\",\"step\":%" PRIu64 "}}",
			  us(r->t[0]), us(d), TID_COPY, r->block, r->v[0], d > 0 ? (double)r->v[0] / d / 1e9 : 0.0,
			  r->sub == ARENA_TRACE_PROMOTE_COPY ? "promote" : "fetch", r->step);
		break;
	case R_COMPUTE: {
		double st = r->t[1] - r->t[0];
		if (it->what == 1) {
			jw_str(w, "{\"name\":\"stall ", bn, "\",");
			jw_printf(w,
				  "\"cat\":\"stall\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":1,\"tid\":%d,\"cname\":\"bad\","
				  "\"args\":{\"block\":%u,\"step\":%" PRIu64 ",\"waited_us\":%.3f}}",
				  us(r->t[0]), us(st), TID_CALLER + lane[it->rec], r->block, r->step, us(st));
			break;
		}
		jw_str(w, "{\"name\":\"", bn, "\",");
		jw_printf(w,
			  "\"cat\":\"compute\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":1,\"tid\":%d,\"args\":{\"block\":%u,"
			  "\"step\":%" PRIu64 ",\"acquire\":%u,\"stall_us\":%.3f}}",
			  us(r->t[1]), us(r->t[2] - r->t[1]), TID_CALLER + lane[it->rec], r->block, r->step, r->occ, us(st));
		break;
	}
	case R_INSTANT:
		if (r->sub == ARENA_TRACE_STEP_BEGIN || r->sub == ARENA_TRACE_STEP_END) {
			jw_printf(w,
				  "{\"name\":\"step %" PRIu64 "%s\",\"cat\":\"step\",\"ph\":\"i\",\"s\":\"g\",\"ts\":%.3f,"
				  "\"pid\":1,\"tid\":%d,\"args\":{\"step\":%" PRIu64 "}}",
				  r->step, r->sub == ARENA_TRACE_STEP_END ? " end" : "", us(r->t[0]), TID_HOST, r->step);
			break;
		}
		if (r->sub == ARENA_TRACE_MODE) {
			jw_printf(w,
				  "{\"name\":\"mode %s\",\"cat\":\"plan\",\"ph\":\"i\",\"s\":\"p\",\"ts\":%.3f,\"pid\":1,\"tid\":%d,"
				  "\"args\":{\"mode\":\"%s\",\"step\":%" PRIu64 "}}",
				  r->v[0] ? "train" : "sample", us(r->t[0]), TID_HOST, r->v[0] ? "train" : "sample", r->step);
			break;
		}
		jw_str(w, r->sub == ARENA_TRACE_DEMOTE ? "{\"name\":\"demote " : "{\"name\":\"promote ", bn, "\",");
		jw_printf(w,
			  "\"cat\":\"plan\",\"ph\":\"i\",\"s\":\"p\",\"ts\":%.3f,\"pid\":1,\"tid\":%d,\"args\":{\"block\":%u,"
			  "\"bytes\":%" PRIu64 ",\"step\":%" PRIu64 "}}",
			  us(r->t[0]), TID_HOST, r->block, r->v[0], r->step);
		break;
	default:
		jw_printf(w,
			  "{\"name\":\"device memory\",\"ph\":\"C\",\"ts\":%.3f,\"pid\":1,\"tid\":%d,\"args\":{\"resident\":%" PRIu64
			  ",\"ring\":%" PRIu64 ",\"free\":%" PRIu64 "}}",
			  us(r->t[0]), TID_HOST, r->v[0], r->v[1], r->v[2]);
		break;
	}
}

static int write_file(arena_trace *t)
{
	size_t n = 0, cap = 2 * t->n_rec + 1;
	item *it = arena_malloc(cap * sizeof(*it));
	uint8_t *lane = arena_calloc(t->n_rec ? t->n_rec : 1, 1);
	jw w = {.f = t->f, .buf = arena_malloc(JW_BUF)};
	if (!it || !lane || !w.buf) {
		arena_free(it);
		arena_free(lane);
		arena_free(w.buf);
		return arena_errorf(ARENA_E_NOMEM, "trace: out of memory");
	}
	uint64_t incomplete = 0;
	for (size_t i = 0; i < t->n_rec; i++) {
		const tr_rec *r = &t->rec[i];
		if (!r->done) {
			incomplete++;
			continue;
		}
		if (r->kind == R_COMPUTE) {
			if (r->t[1] - r->t[0] > TRACE_STALL_S)
				it[n++] = (item){r->t[0], i, 1};
			it[n++] = (item){r->t[1], i, 0};
		} else {
			it[n++] = (item){r->t[0], i, 0};
			if (r->kind == R_COPY && r->sub == ARENA_TRACE_FETCH)
				it[n++] = (item){r->t[1], i, 2};
		}
	}
	qsort(it, n, sizeof(*it), item_cmp);
	/* Lanes of the caller's stream: an acquire-release goes to the first
	 * lane free at its start (blocks held together overlap). */
	double end[TRACE_LANES];
	unsigned lanes = 1;
	uint8_t *seen = arena_calloc(t->n_rec ? t->n_rec : 1, 1);
	if (!seen) {
		arena_free(it);
		arena_free(lane);
		arena_free(w.buf);
		return arena_errorf(ARENA_E_NOMEM, "trace: out of memory");
	}
	for (int k = 0; k < TRACE_LANES; k++)
		end[k] = -1e300;
	for (size_t i = 0; i < n; i++) {
		const tr_rec *r = &t->rec[it[i].rec];
		if (r->kind != R_COMPUTE || seen[it[i].rec])
			continue;
		seen[it[i].rec] = 1;
		unsigned k = 0, best = 0;
		while (k < TRACE_LANES && end[k] > it[i].ts)
			k++;
		if (k == TRACE_LANES) { /* all busy: the one free first */
			for (unsigned j = 1; j < TRACE_LANES; j++)
				best = end[j] < end[best] ? j : best;
			k = best;
		}
		end[k] = r->t[2];
		lane[it[i].rec] = (uint8_t)k;
		lanes = k + 1 > lanes ? k + 1 : lanes;
	}
	arena_free(seen);
	jw_printf(&w, "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"generator\":\"arena %s\",\"backend\":\"%s\",",
		  ARENA_VERSION_STRING, t->be->ops->name);
	jw_str(&w, "\"model\":\"", t->label, "\",");
	jw_printf(&w,
		  "\"clock\":\"device\",\"records\":%zu,\"max_records\":%zu,\"dropped_records\":%" PRIu64
		  ",\"incomplete_records\":%" PRIu64 ",\"overflowed\":%s},\n\"traceEvents\":[\n",
		  t->n_rec, t->cap_rec, t->dropped, incomplete, t->dropped ? "true" : "false");
	jw_str(&w, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"tid\":0,\"args\":{\"name\":\"arena ", t->label,
	       "\"}}");
	static const char *const tname[] = {"", "engine (host)", "copy stream"};
	for (unsigned tid = TID_HOST; tid < TID_CALLER + lanes; tid++) {
		char nm[64];
		if (tid < TID_CALLER)
			snprintf(nm, sizeof(nm), "%s", tname[tid]);
		else if (tid == TID_CALLER)
			snprintf(nm, sizeof(nm), "caller stream");
		else
			snprintf(nm, sizeof(nm), "caller stream (%u)", tid - TID_CALLER + 1);
		jw_printf(&w,
			  ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":%u,\"args\":{\"name\":\"%s\"}},\n"
			  "{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":1,\"tid\":%u,\"args\":{\"sort_index\":%u}}",
			  tid, nm, tid, tid);
	}
	uint64_t streamed = 0, sstep = UINT64_MAX;
	for (size_t i = 0; i < n && !w.rc; i++) {
		const tr_rec *r = &t->rec[it[i].rec];
		if (it[i].what == 2) {
			if (r->step != sstep)
				streamed = 0, sstep = r->step;
			streamed += r->v[0];
		}
		write_event(&w, t, &it[i], lane, streamed);
	}
	jw_printf(&w, "\n]}\n");
	jw_flush(&w);
	int rc = w.rc;
	arena_free(it);
	arena_free(lane);
	arena_free(w.buf);
	if (!rc) {
		rc = arena_outfile_commit(t->f);
		t->f = NULL;
	}
	return rc;
}

int arena_trace_close(arena_trace *t, int write)
{
	if (!t)
		return 0;
	int rc = 0;
	arena_backend *be = t->be;
	for (unsigned k = 0; k < t->n_slot && !rc; k++)
		for (unsigned i = 0; t->slot[k].state == S_RECORDED && i < t->slot[k].nev && !rc; i++)
			rc = be->ops->event_sync(be, t->slot[k].ev[i]);
	if (!rc)
		rc = arena_trace_poll(t);
	if (!rc && write)
		rc = write_file(t);
	trace_free(t);
	return rc;
}
