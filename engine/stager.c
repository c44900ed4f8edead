/* stager.c - the disk tier's reads, ahead of use (see stager.h). */
#include "stager.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "../common/alloc.h"
#include "../common/clock.h"
#include "../common/err.h"
#include "../include/arena.h"
#include "../formats/wire.h"
#include "residency_int.h"

/* A slot's life: FREE -> READING (the thread, or a take without one) ->
 * READY or FAILED -> TAKEN (the engine copies from it) -> COPYING (its
 * event recorded after the copies) -> FREE once the event is done. A slot
 * READING for a part the list dropped is `stale`: FREE when its read ends. */
enum { S_FREE, S_READING, S_READY, S_FAILED, S_TAKEN, S_COPYING };

typedef struct stage_slot {
	int state, stale, pinned;
	uint64_t taken;        /* TAKEN, COPYING: the take's number (copies end in that order) */
	arena_stage_part part;
	size_t entry;          /* READING, READY, FAILED: its part's index in the list */
	uint8_t *buf;
	arena_event *ev;
	arena_wire w;          /* a coded part's form: its segments of the block's plan, filled here */
	arena_wire_seg *seg;   /* their room (the largest plan's count) */
	int rc;                /* FAILED: the read's error */
	char msg[1024];
} stage_slot;

struct arena_stager {
	arena_backend *be;
	arena_pin_budget *budget;
	arena_stager_src src;
	uint64_t slot_bytes;
	unsigned n_slots;
	stage_slot *slots;
	size_t max_seg;
	/* the list: parts [head, n) still to be taken; at[j]: the slot holding
	 * or reading part j, -1 none yet */
	arena_stage_part *want;
	int *at;
	size_t n, head, cap;
	pthread_mutex_t mu;
	pthread_cond_t cv_work;  /* the thread: a new list, a slot put, stop */
	pthread_cond_t cv_ready; /* takes: a read ended */
	pthread_mutex_t src_mu;  /* held around every read from the source */
	pthread_t tid;
	int threaded, stop;
	uint64_t takes;
	arena_stager_stats st;
};

static int same_part(const arena_stage_part *a, const arena_stage_part *b)
{
	return a->block == b->block && a->off == b->off && a->len == b->len && a->coded == b->coded &&
	       (!a->coded || (a->seg0 == b->seg0 && a->seg1 == b->seg1));
}

/* Read part p into slot x (called without s->mu, holding src_mu). */
static int read_part(arena_stager *s, stage_slot *x, const arena_stage_part *p)
{
	const arena_stager_src *r = &s->src;
	int rc;
	if (p->coded) { /* the plan's segments of the part, placed in the slot */
		const arena_wire *plan = r->plans ? r->plans[p->block] : NULL;
		if (!plan || p->seg1 > plan->n || p->seg0 >= p->seg1 || p->seg1 - p->seg0 > s->max_seg ||
		    arena_wire_room(plan, p->seg0, p->seg1) > s->slot_bytes)
			return arena_errorf(ARENA_E_INTERNAL, "stager: block '%s': segments %zu..%zu of its coded plan do "
					    "not fit a slot", r->l->blocks[p->block].name, p->seg0, p->seg1);
		arena_wire_sub(plan, p->seg0, p->seg1, x->seg, x->buf, &x->w);
		rc = r->wire(r->ctx, p->block, p->off, p->len, &x->w);
	} else if (r->part) {
		rc = r->part(r->ctx, p->block, p->off, p->len, x->buf);
	} else {
		rc = r->whole(r->ctx, p->block, x->buf, p->len);
	}
	if (rc)
		arena_error_prefix(r->l->blocks[p->block].name);
	return rc;
}

/* The first part of the list with no slot, and a slot to read it into:
 * FREE; or COPYING with its copies done; or the COPYING slot taken first
 * (its copies end first: they are queued in take order on one stream;
 * its event waited for outside the lock); or READY with a part further
 * down the list (read again when its turn comes: the head goes first, and
 * a new list may keep every slot for parts after it). -1 if none. Called
 * with s->mu held; may drop it to wait for an event (no one else moves a
 * COPYING slot: the reads are one at a time). */
static int next_job(arena_stager *s, size_t *j)
{
	for (;;) {
		size_t k = s->head;
		while (k < s->n && s->at[k] >= 0)
			k++;
		if (k >= s->n)
			return -1;
		int fr = -1, cp = -1, late = -1;
		for (unsigned i = 0; i < s->n_slots && fr < 0; i++) {
			stage_slot *x = &s->slots[i];
			if (x->state == S_COPYING) {
				const int q = s->be->ops->event_query(s->be, x->ev);
				if (q > 0)
					x->state = S_FREE;
				else if (q < 0) /* the device failed: the engine sees it on its own stream */
					arena_error_clear();
			}
			if (x->state == S_FREE)
				fr = (int)i;
			else if (x->state == S_COPYING && (cp < 0 || x->taken < s->slots[cp].taken))
				cp = (int)i;
			else if (x->state == S_READY && x->entry > k && (late < 0 || x->entry > s->slots[late].entry))
				late = (int)i;
		}
		if (fr < 0 && cp >= 0) { /* wait for that slot's copies, then look again */
			stage_slot *x = &s->slots[cp];
			pthread_mutex_unlock(&s->mu);
			int rc = s->be->ops->event_sync(s->be, x->ev);
			pthread_mutex_lock(&s->mu);
			if (rc) /* the device failed: the engine sees it on its own stream */
				arena_error_clear();
			x->state = S_FREE;
			continue;
		}
		if (fr < 0 && late >= 0) {
			s->at[s->slots[late].entry] = -1;
			s->slots[late].state = S_FREE;
			s->st.wasted++;
			fr = late;
		}
		*j = k;
		return fr;
	}
}

/* Read the list's next unread part into a slot; 0 when there was none to
 * read (or no slot). Called with s->mu held (dropped while reading). */
static int read_one(arena_stager *s)
{
	size_t j;
	int i = next_job(s, &j);
	if (i < 0)
		return 0;
	stage_slot *x = &s->slots[i];
	x->state = S_READING;
	x->stale = 0;
	x->part = s->want[j];
	x->entry = j;
	s->at[j] = i;
	const arena_stage_part p = x->part;
	pthread_mutex_unlock(&s->mu);
	pthread_mutex_lock(&s->src_mu);
	int rc = read_part(s, x, &p);
	pthread_mutex_unlock(&s->src_mu);
	pthread_mutex_lock(&s->mu);
	if (rc) {
		x->rc = rc;
		snprintf(x->msg, sizeof(x->msg), "%s", arena_last_error());
		arena_error_clear();
	}
	if (!rc)
		s->st.read_bytes += p.coded ? x->w.stored : p.len;
	if (x->stale) {
		x->state = S_FREE;
		s->st.wasted++;
	} else {
		x->state = rc ? S_FAILED : S_READY;
	}
	pthread_cond_broadcast(&s->cv_ready);
	return 1;
}

static void *reader(void *arg)
{
	arena_stager *s = arg;
	pthread_mutex_lock(&s->mu);
	/* stop is looked at again before each wait: read_one may have dropped
	 * the lock (a read, an event waited for) while arena_stager_free set it
	 * and woke no one yet waiting (a fresh clone's TSan run hung here). */
	while (!s->stop)
		if (!read_one(s) && !s->stop)
			pthread_cond_wait(&s->cv_work, &s->mu);
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

static void slots_free(arena_stager *s)
{
	for (unsigned i = 0; s->slots && i < s->n_slots; i++) {
		stage_slot *x = &s->slots[i];
		if (x->ev) {
			if (x->state == S_COPYING || x->state == S_TAKEN)
				s->be->ops->event_sync(s->be, x->ev);
			s->be->ops->event_destroy(s->be, x->ev);
		}
		if (x->pinned)
			arena_pin_budget_unregister(s->budget, s->be, x->buf, s->slot_bytes);
		arena_free(x->buf);
		arena_free(x->seg);
	}
	arena_free(s->slots);
	s->slots = NULL;
}

int arena_stager_create(arena_backend *be, arena_pin_budget *budget, const arena_stager_src *src,
			uint64_t slot_bytes, unsigned n_slots, int threaded, arena_stager **out)
{
	*out = NULL;
	arena_stager *s = arena_calloc(1, sizeof(*s));
	if (!s)
		return arena_errorf(ARENA_E_NOMEM, "out of memory for the disk tier's stager");
	s->be = be;
	s->budget = budget;
	s->src = *src;
	s->slot_bytes = slot_bytes;
	s->n_slots = n_slots;
	pthread_mutex_init(&s->mu, NULL);
	pthread_mutex_init(&s->src_mu, NULL);
	pthread_cond_init(&s->cv_work, NULL);
	pthread_cond_init(&s->cv_ready, NULL);
	int rc = 0;
	if (!n_slots || n_slots > ARENA_STAGER_MAX_SLOTS)
		rc = arena_errorf(ARENA_E_USAGE, "stager: %u slots (1 to %d)", n_slots, ARENA_STAGER_MAX_SLOTS);
	for (size_t b = 0; src->plans && b < src->l->n_blocks; b++)
		if (src->plans[b] && src->plans[b]->n > s->max_seg)
			s->max_seg = src->plans[b]->n;
	if (!rc && !(s->slots = arena_calloc(n_slots, sizeof(*s->slots))))
		rc = arena_errorf(ARENA_E_NOMEM, "out of memory for the disk tier's stager");
	for (unsigned i = 0; !rc && i < n_slots; i++) {
		stage_slot *x = &s->slots[i];
		if (!(x->buf = arena_aligned_alloc(4096, slot_bytes)) ||
		    (s->max_seg && !(x->seg = arena_calloc(s->max_seg, sizeof(*x->seg))))) {
			rc = arena_errorf(ARENA_E_NOMEM, "out of memory for the disk tier's staging (%u x %s)", n_slots,
					  arena__fmtb(slot_bytes));
			break;
		}
		if ((rc = be->ops->event_create(be, &x->ev)))
			break;
		x->pinned = arena_pin_budget_register(budget, be, x->buf, slot_bytes);
	}
	if (!rc && threaded) {
		s->threaded = pthread_create(&s->tid, NULL, reader, s) == 0; /* else: takes read */
	}
	if (rc) {
		arena_stager_free(s); /* no thread yet: what was made is freed */
		return rc;
	}
	*out = s;
	return 0;
}

void arena_stager_free(arena_stager *s)
{
	if (!s)
		return;
	if (s->threaded) {
		pthread_mutex_lock(&s->mu);
		s->stop = 1;
		pthread_cond_broadcast(&s->cv_work);
		pthread_mutex_unlock(&s->mu);
		pthread_join(s->tid, NULL);
	}
	slots_free(s);
	arena_free(s->want);
	arena_free(s->at);
	pthread_mutex_destroy(&s->mu);
	pthread_mutex_destroy(&s->src_mu);
	pthread_cond_destroy(&s->cv_work);
	pthread_cond_destroy(&s->cv_ready);
	arena_free(s);
}

int arena_stager_want(arena_stager *s, const arena_stage_part *parts, size_t n)
{
	pthread_mutex_lock(&s->mu);
	if (n > s->cap) {
		size_t c = n > 2 * s->cap ? n : 2 * s->cap;
		arena_stage_part *w = arena_realloc(s->want, c * sizeof(*w));
		if (w)
			s->want = w;
		int *at = w ? arena_realloc(s->at, c * sizeof(*at)) : NULL;
		if (at)
			s->at = at;
		if (!w || !at) {
			pthread_mutex_unlock(&s->mu);
			return arena_errorf(ARENA_E_NOMEM, "out of memory for the disk tier's list of %zu parts", n);
		}
		s->cap = c;
	}
	memcpy(s->want, parts, n * sizeof(*parts));
	s->n = n;
	s->head = 0;
	/* Slots keep the parts of the new list they hold or read (each slot one
	 * entry, in order); the rest are read into anew. */
	uint8_t kept[ARENA_STAGER_MAX_SLOTS] = {0};
	for (size_t j = 0; j < n; j++) {
		s->at[j] = -1;
		for (unsigned i = 0; i < s->n_slots; i++) {
			stage_slot *x = &s->slots[i];
			if (!kept[i] && (x->state == S_READING || x->state == S_READY) && same_part(&x->part, &parts[j])) {
				kept[i] = 1;
				x->stale = 0;
				x->entry = j;
				s->at[j] = (int)i;
				break;
			}
		}
	}
	for (unsigned i = 0; i < s->n_slots; i++) {
		stage_slot *x = &s->slots[i];
		if (kept[i])
			continue;
		if (x->state == S_READING) {
			x->stale = 1;
		} else if (x->state == S_READY || x->state == S_FAILED) { /* a failed read is tried again */
			s->st.wasted += x->state == S_READY;
			x->state = S_FREE;
		}
	}
	pthread_cond_broadcast(&s->cv_work);
	pthread_mutex_unlock(&s->mu);
	return 0;
}

int arena_stager_take(arena_stager *s, unsigned *slot_out, uint8_t **buf, arena_wire **w)
{
	*buf = NULL;
	*w = NULL;
	pthread_mutex_lock(&s->mu);
	if (s->head >= s->n) {
		pthread_mutex_unlock(&s->mu);
		return arena_errorf(ARENA_E_INTERNAL, "stager: a take with nothing wanted");
	}
	const size_t j = s->head;
	int ready = s->at[j] >= 0 && (s->slots[s->at[j]].state == S_READY || s->slots[s->at[j]].state == S_FAILED);
	double t0 = arena_now_s();
	while (s->at[j] < 0 || s->slots[s->at[j]].state == S_READING) {
		if (!s->threaded && s->at[j] < 0) { /* no thread: read it here */
			if (!read_one(s)) {
				pthread_mutex_unlock(&s->mu);
				return arena_errorf(ARENA_E_INTERNAL, "stager: no slot to read into (all %u taken)", s->n_slots);
			}
			continue;
		}
		pthread_cond_wait(&s->cv_ready, &s->mu);
	}
	s->st.wait_s += arena_now_s() - t0;
	s->st.taken++;
	s->st.ready += ready;
	stage_slot *x = &s->slots[s->at[j]];
	s->head++;
	int rc = 0;
	if (x->state == S_FAILED) {
		rc = arena_errorf(x->rc, "%s", x->msg);
		x->state = S_FREE;
	} else {
		x->state = S_TAKEN;
		x->taken = s->takes++;
		*slot_out = (unsigned)(x - s->slots);
		if (x->part.coded)
			*w = &x->w;
		else
			*buf = x->buf;
	}
	pthread_cond_broadcast(&s->cv_work);
	pthread_mutex_unlock(&s->mu);
	return rc;
}

unsigned arena_stager_slots(const arena_stager *s)
{
	return s->n_slots;
}

arena_event *arena_stager_event(arena_stager *s, unsigned slot)
{
	return s->slots[slot].ev;
}

void arena_stager_put(arena_stager *s, unsigned slot)
{
	pthread_mutex_lock(&s->mu);
	s->slots[slot].state = S_COPYING;
	pthread_cond_broadcast(&s->cv_work);
	pthread_mutex_unlock(&s->mu);
}

void arena_stager_lock(arena_stager *s)
{
	pthread_mutex_lock(&s->src_mu);
}

void arena_stager_unlock(arena_stager *s)
{
	pthread_mutex_unlock(&s->src_mu);
}

void arena_stager_stats_get(arena_stager *s, arena_stager_stats *out)
{
	pthread_mutex_lock(&s->mu);
	*out = s->st;
	pthread_mutex_unlock(&s->mu);
}
