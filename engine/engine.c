/* engine.c - the prefetch engine: a plan run on a device, adapted between
 * steps, timed on the device (see engine.h; the planner is residency.c). */
#include "engine.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/alloc.h"
#include "../common/clock.h"
#include "../common/err.h"
#include "../common/units.h"
#include "../formats/wire.h"
#include "residency_int.h"
#include "stager.h"
#include "trace.h"

enum { ST_IDLE, ST_STEP, ST_FAILED };
enum { ENGINE_COPY_PAIRS = 32, ENGINE_MEMO_STEPS = 64, ENGINE_WIRE_STAGES = ARENA_WIRE_STAGES, ENGINE_WIRE_RUN = 16 };

/* --- engine ------------------------------------------------------------------- */

struct look;
static void look_free(struct look *k);

struct arena_engine {
	arena_model *m;
	arena_backend *be;
	const arena_layout *l;
	arena_engine_opts o;
	arena_residency_plan plan;
	int state, failed_rc;
	arena_stream *cs; /* copy stream */
	/* ring: one buffer of n_slots x slot_bytes when something is streamed */
	unsigned n_slots;    /* arena__ring_slots(o) */
	void *ring_dptr;
	uint64_t slot_bytes; /* of the allocated ring; 0 none */
	arena__ring ring;     /* what it holds */
	/* streamed schedule of the step: seq[0..n_seq), the entries of the plan's
	 * schedule whose blocks are streamed; entries [cur, fetched) are fetched
	 * ahead (each counted in ring.pending) and not yet acquired */
	uint32_t *seq;
	size_t n_seq, cur, fetched;
	/* How many entries past cur prefetch fetches: after a miss one, twice
	 * as many at each hit since, up to the whole ring (SIZE_MAX: no limit
	 * but the ring's room). A schedule that is not the caller's order (the
	 * first step of a mode, blocks in pieces acquired in another order than
	 * their numbers) then does not refill the ring at every miss: on the
	 * H200 the first training step at 4 GiB in 128 MiB pieces copied 251 GB
	 * for 34 GB used, 324 misses. */
	size_t ahead;
	unsigned ring_epoch;  /* counts the ring's resets: pending counts start anew */
	unsigned fetch_epoch; /* the ring_epoch [cur, fetched) were fetched in */
	uint64_t next_bytes, next_copies, next_moved; /* copied for the next step's entries */
	size_t max_sched;    /* capacity of seq, obs and a schedule: arena_residency_max_sched */
	arena__ring scratch; /* for arena__plan_derive */
	arena__timed tscr; /* for engine_predict */
	struct hold {
		uint32_t block;
		size_t j; /* its entry in seq, or SIZE_MAX: fetched on its own */
	} *held;           /* streamed blocks acquired and not released, oldest first */
	size_t n_held, max_held;
	/* what the caller did this step: the scheduled blocks acquired, in order */
	uint32_t *obs;
	size_t n_obs;
	int obs_over; /* more than max_sched acquires: not learned from */
	/* per mode: the schedule learned in it (NULL: the mode's default) */
	uint32_t *msched[2];
	size_t mn[2];
	/* per block */
	arena_event **ev_use;  /* its last release (resident or in the ring) */
	arena_event **ev_fill; /* the copy that put it where it is */
	unsigned *res_held;
	uint8_t *near;   /* near_set's resident set */
	double *cost;    /* the engine's copy of a given o->cost (o.cost points at it); NULL: none given */
	/* device timing (be can time): per step parity, block, occurrence (2:
	 * forward, backward) the events ready (before the wait), start, end */
	int timed;
	int profile_learned; /* the learned profile was looked at (o.cost is it once that look is taken) */
	uint64_t relearn_at; /* the step at which learn() looks at the learned profile again */
	/* moves timed against move_cost_raw's estimate (apply): their ratio,
	 * averaged, scales the next estimates (1 until a move estimated at over
	 * a millisecond has been timed) */
	double move_scale;
	unsigned moves_timed;
	uint64_t all_bytes; /* every block's bytes: a budget that holds them holds the model */
	arena_event **tm;     /* TM_EV a slot: ready, start, end (release), next (the next acquire) */
	uint8_t *tm_rec;      /* same index without the event: 1 acquired, 3 released */
	size_t *tm_nx;        /* same index: the event (index into tm) of the next acquire, SIZE_MAX none:
			       * that acquire's own ready event when it is timed, else this slot's 4th */
	size_t tm_prev;       /* the slot of this step's last timed acquire (SIZE_MAX: none) */
	uint64_t tm_step[2];  /* the step each parity holds */
	int tm_mode[2];       /* and the mode it ran in */
	unsigned *acq_n, *rel_n; /* per block, this step */
	/* copy timing: pairs of timed events around ring copies, used round robin
	 * (a block copied again before its last copy was read loses nothing) */
	arena_event *cp_a[ENGINE_COPY_PAIRS], *cp_z[ENGINE_COPY_PAIRS];
	uint64_t cp_bytes[ENGINE_COPY_PAIRS];
	uint8_t cp_rec[ENGINE_COPY_PAIRS];
	unsigned cp_next;
	double lc_rate[64];   /* the last copies' rates (bytes/s), a ring */
	unsigned lc_n;        /* copies timed so far */
	double *lcost;        /* learned forward seconds per block, start to the next acquire; < 0 not yet */
	double *lhold;        /* learned forward seconds per block, start to release */
	double *lbcost, *lbhold; /* train: the same for the backward pass (its recompute and backward) */
	double lbwd_sum, lfwd_sum; /* train: backward and forward seconds seen together */
	double gap_sum;            /* step gaps timed (time_gap), and how many */
	unsigned gap_n;
	arena_event *gap_a[2], *gap_b[2]; /* per step parity: its end, its first scheduled acquire */
	uint64_t gap_a_step[2], gap_b_step[2]; /* the step each was recorded for; UINT64_MAX none */
	uint64_t gap_taken;   /* the last step whose gap was read; UINT64_MAX none */
	arena_stream *last_s; /* the stream of the last release */
	/* records */
	arena_engine_step rec;
	arena_engine_step *hist;
	uint64_t steps;
	unsigned room_steps;
	/* The last plan adapt() made, kept for the steps after it: planning with
	 * a profile (the timed greedy) costs milliseconds, and between steps the
	 * device waits for it in a caller that waits for its steps. Made anew
	 * when the budget moves out of [need, budget + slack], when the options
	 * change (plan_gen), and every ENGINE_MEMO_STEPS steps (learned costs
	 * drift). */
	arena_residency_plan memo;
	int memo_ok;
	uint64_t memo_budget, memo_gen, plan_gen;
	unsigned memo_age;
	uint64_t plans_made; /* by arena_residency_plan_make, for tests */
	/* With a cap, the cap is all the process's device memory: the rest of
	 * it (torch's allocator) is to stay within the reserve. `rest` is what
	 * the caller last said the rest holds (arena_engine_set_rest): what it
	 * holds past the reserve comes out of the budget when planning
	 * (plan_now), at once, as free memory below the headroom does, and
	 * comes back the same way (after `hysteresis` steps of room). The
	 * device's free memory cannot say it: other programs' memory is in it
	 * too. */
	uint64_t rest;
	/* A look at the learned profile plans on a thread of its own: the timed
	 * greedy over flux-dev in 128 MiB pieces takes 0.05 s sampling and 0.4 s
	 * training, host time of the caller's thread when made in step_end
	 * (each look a step that much longer on the H200). learn() starts it
	 * with copies of what it plans from; the next step_end takes it (waiting
	 * there if it is not done) and moves as a look made there would. */
	struct look {
		pthread_t th;
		int on;              /* started and not taken */
		int threaded;        /* th runs it and is not joined */
		const arena_layout *l;
		arena_engine_opts o; /* its arrays: the copies below */
		double *prof;        /* cost, hold, bcost, bhold: n_blocks each */
		uint64_t *moved;
		uint32_t *sched;
		uint64_t budget, gen;
		double need;
		arena_residency_plan t; /* its plan (zero until made, and once taken) */
		double took_s;          /* the thread's seconds making it */
		int rc;
		char msg[1024];
	} look;
	int begun; /* first copies of the coming step issued */
	arena_trace *tr; /* a trace being recorded, or NULL */
	/* The disk tier: a block with neither a device nor a host copy is read
	 * from its image (o->reread: its chunks checked) by the stager, ahead
	 * of its copy, in parts of disk_part() (a coded block in parts of whole
	 * regions as large) into staging slots (stager.h); made at the first
	 * such copy. */
	arena_stager *stg;
	arena_wire **disk_plans; /* per block, disk_coded() when the stager was made (or NULL) */
	/* Coded streaming: blocks held coded (m->mem[b].wire) are copied in
	 * runs of hb4 segments, each run into one of ENGINE_WIRE_STAGES device stages on
	 * the copy stream and decoded from there into place on the decode
	 * stream ds, which runs beside the copies: stage k is copied into once
	 * its last decodes are done (wdec[k]), decoded once its copy is
	 * (wcp[k]). Plain segments go straight to their place on the copy
	 * stream. A block's fill event is recorded on ds after its last decode
	 * (and, when it has plain segments, after its copies: wx). */
	arena_stream *ds;
	uint8_t *wstage;      /* ENGINE_WIRE_STAGES x wstage_each device bytes, or NULL */
	uint64_t wstage_each;
	arena_event *wcp[ENGINE_WIRE_STAGES], *wdec[ENGINE_WIRE_STAGES], *wx;
	unsigned wnext;
	uint64_t *moved; /* per block, what a copy moves (o.moved points at it); NULL: none held coded */
};

/* Device bytes the coded copies' stages take (wstage_each is set only
 * when there are stages, just before they are allocated). */
static uint64_t wire_stage_bytes(const arena_engine *e)
{
	return ENGINE_WIRE_STAGES * e->wstage_each;
}

uint64_t arena__disk_part;

uint64_t arena_engine_disk_staging(void)
{
	const char *s = getenv("ARENA_DISK_STAGING");
	uint64_t v;
	if (!s || arena_size_parse(s, &v)) {
		arena_error_clear();
		return ARENA_ENGINE_DISK_STAGING;
	}
	return v;
}

/* The disk tier's part size. */
static uint64_t disk_part(void)
{
	return arena__disk_part ? arena__disk_part : ARENA_ENGINE_DISK_PART;
}

/* Block b's coded form when the disk tier reads it coded (an hb4 image,
 * stages there), else NULL. */
static arena_wire *disk_coded(const arena_engine *e, uint32_t b)
{
	arena_wire *w = e->m->mem[b].disk_wire;
	return w && e->o.reread_wire && e->wstage ? w : NULL;
}

/* Bytes a copy of block b moves: its coded form's when it is held or read coded. */
static uint64_t moved_bytes(const arena_engine *e, uint32_t b)
{
	const arena_wire *w = e->m->mem[b].wire, *d = disk_coded(e, b);
	if (w)
		return w->stored;
	if (d) /* read coded: what the last read held, or at most its room */
		return d->stored ? d->stored : d->cap;
	return e->l->blocks[b].bytes;
}

static int disk_parts(arena_engine *e, uint32_t b, uint8_t *dst, arena_stream **fill);

/* Queue the copy of block b to dst (its device slab or ring slot): from
 * src (raw host bytes) on the copy stream, or, held coded, segment by
 * segment as above. *fill is the stream the block's fill event goes on. */
static int send_wire(arena_engine *e, const arena_wire *w, uint8_t *dst, arena_stream **fill);

static int send(arena_engine *e, uint32_t b, uint8_t *dst, const uint8_t *src, arena_stream **fill)
{
	arena_backend *be = e->be;
	const arena_wire *w = e->m->mem[b].wire;
	*fill = e->cs;
	if (!w && !src && e->l->blocks[b].bytes)
		return disk_parts(e, b, dst, fill);
	if (!w)
		return e->l->blocks[b].bytes ? be->ops->copy_h2d(be, dst, src, e->l->blocks[b].bytes, e->cs) : 0;
	return send_wire(e, w, dst, fill);
}

/* The copy of a coded form w to dst (see send). */
static int send_wire(arena_engine *e, const arena_wire *w, uint8_t *dst, arena_stream **fill)
{
	arena_backend *be = e->be;
	int rc = 0;
	int plain = 0;
	for (size_t i = 0; i < w->n && !rc;) {
		const arena_wire_seg *g = &w->seg[i];
		if (g->codec == ARENA_CODEC_NONE) { /* raw bytes: straight to their place */
			rc = be->ops->copy_h2d(be, dst + g->dst, w->buf + g->src, g->raw, e->cs);
			plain = 1;
			i++;
			continue;
		}
		/* A run of hb4 segments whose stored bytes (adjacent in the buffer)
		 * fit a stage goes in one copy: copies back to back without a wait
		 * between them keep the bus busy. */
		const uint64_t a = g->src;
		size_t j = i + 1;
		while (j < w->n && w->seg[j].codec == ARENA_CODEC_HB4 &&
		       w->seg[j].src + arena_wire_seg_stored(&w->seg[j]) - a <= e->wstage_each)
			j++;
		const uint64_t z = w->seg[j - 1].src + arena_wire_seg_stored(&w->seg[j - 1]);
		const unsigned k = e->wnext++ % ENGINE_WIRE_STAGES;
		uint8_t *stage = e->wstage + (uint64_t)k * e->wstage_each;
		if ((rc = be->ops->stream_wait(be, e->cs, e->wdec[k])) ||
		    (rc = be->ops->copy_h2d(be, stage, w->buf + a, z - a, e->cs)) ||
		    (rc = be->ops->event_record(be, e->wcp[k], e->cs)) || (rc = be->ops->stream_wait(be, e->ds, e->wcp[k])))
			break;
		arena_hb4_job jobs[ENGINE_WIRE_RUN];
		size_t nj = 0;
		for (; i < j && !rc; i++) {
			jobs[nj++] = (arena_hb4_job){dst + w->seg[i].dst, stage + (w->seg[i].src - a), &w->seg[i].v, 0,
						     w->seg[i].raw};
			if (nj == ENGINE_WIRE_RUN || i + 1 == j) {
				if (be->ops->decode_hb4_many)
					rc = be->ops->decode_hb4_many(be, jobs, nj, e->ds);
				for (size_t q = 0; !be->ops->decode_hb4_many && q < nj && !rc; q++)
					rc = be->ops->decode_hb4(be, jobs[q].dst, jobs[q].src, jobs[q].v, 0, jobs[q].z, e->ds);
				nj = 0;
			}
		}
		if (!rc)
			rc = be->ops->event_record(be, e->wdec[k], e->ds);
	}
	if (!rc && plain && !(rc = be->ops->event_record(be, e->wx, e->cs)))
		rc = be->ops->stream_wait(be, e->ds, e->wx);
	*fill = e->ds;
	return rc;
}

/* A block whose bytes are in its image only (the disk tier). */
static int on_disk(const arena_engine *e, uint32_t b)
{
	return !e->m->mem[b].dev && !e->m->mem[b].host && !e->m->mem[b].wire && e->l->blocks[b].bytes;
}

/* Entry j of the streamed schedule; j >= n_seq is the next step's j - n_seq. */
static uint32_t seq_at(const arena_engine *e, size_t j)
{
	return e->seq[j < e->n_seq ? j : j - e->n_seq];
}

/* The disk tier's parts of block b: its bytes in parts of disk_part()
 * (whole without reread_part), or the whole block coded; n of them at most
 * into p; returns how many it has. */
static size_t disk_parts_of(const arena_engine *e, uint32_t b, arena_stage_part *p, size_t n)
{
	const uint64_t sz = e->l->blocks[b].bytes;
	const arena_wire *w = disk_coded(e, b);
	if (w) { /* whole regions, as many as a part's room holds (one at least) */
		size_t k = 0;
		for (size_t i = 0; i < w->n; k++) {
			size_t j = arena_wire_region_end(w, i);
			while (j < w->n && arena_wire_room(w, i, arena_wire_region_end(w, j)) <= disk_part())
				j = arena_wire_region_end(w, j);
			if (k < n) {
				const arena_wire_seg *z = &w->seg[j - 1];
				p[k] = (arena_stage_part){b, w->seg[i].dst, z->dst + z->raw - w->seg[i].dst, 1, i, j};
			}
			i = j;
		}
		return k;
	}
	const uint64_t part = e->o.reread_part && disk_part() < sz ? disk_part() : sz;
	size_t k = 0;
	for (uint64_t off = 0; off < sz; off += part, k++)
		if (k < n)
			p[k] = (arena_stage_part){b, off, sz - off < part ? sz - off : part, 0, 0, 0};
	return k;
}

/* The stager, made at the first disk-tier copy: slots as large as a part
 * (a block without reread_part) or a block read coded, as many as
 * o.disk_staging (default ARENA_ENGINE_DISK_STAGING) holds and the tier's
 * blocks fill, 2 at least. */
static int stager_up(arena_engine *e)
{
	if (e->stg)
		return 0;
	/* A slot holds any block's part (a block may join the tier later) or
	 * coded form; the slots need not hold more than the tier's blocks. */
	uint64_t slot = 0, on = 0;
	int coded = 0;
	for (uint32_t b = 0; b < e->l->n_blocks; b++) {
		const arena_wire *w = disk_coded(e, b);
		const uint64_t sz = e->l->blocks[b].bytes;
		uint64_t need = e->o.reread_part && disk_part() < sz ? disk_part() : sz;
		for (size_t i = 0; w && i < w->n;) { /* its coded parts' room (a region may pass a part) */
			const size_t j = arena_wire_region_end(w, i);
			need = arena_wire_room(w, i, j) > need ? arena_wire_room(w, i, j) : need;
			i = j;
		}
		slot = need > slot ? need : slot;
		coded |= w != NULL;
		on += on_disk(e, b) ? (w ? w->cap : sz) : 0;
	}
	slot = arena_align_up(slot ? slot : 1, 4096);
	const uint64_t total = e->o.disk_staging ? e->o.disk_staging : ARENA_ENGINE_DISK_STAGING;
	uint64_t n = total / slot, most = (on + slot - 1) / slot;
	n = n > most ? most : n;
	n = n < 2 ? 2 : n > ARENA_STAGER_MAX_SLOTS ? ARENA_STAGER_MAX_SLOTS : n;
	if (coded && !e->disk_plans) {
		if (!(e->disk_plans = arena_calloc(e->l->n_blocks, sizeof(*e->disk_plans))))
			return arena_errorf(ARENA_E_NOMEM, "out of memory for the disk tier");
		for (uint32_t b = 0; b < e->l->n_blocks; b++)
			e->disk_plans[b] = disk_coded(e, b);
	}
	arena_stager_src src = {.whole = e->o.reread,
				.part = e->o.reread_part,
				.wire = e->o.reread_wire,
				.ctx = e->o.reread_ctx,
				.plans = e->disk_plans,
				.l = e->l};
	return arena_stager_create(e->be, e->m->budget, &src, slot, (unsigned)n, !e->o.disk_sync, &e->stg);
}

/* Parts of the disk tier's list (disk_parts): a block's, and those after it. */
enum { DISK_MAXP = 4 * ARENA_STAGER_MAX_SLOTS };

/* Tell the stager what comes: p[0, n) (block b's parts), then, appended to
 * p (room for DISK_MAXP), those of the disk blocks the schedule streams
 * after entry e->fetched (a step ahead at most), twice as many parts as it
 * has slots. */
static int disk_want(arena_engine *e, uint32_t b, arena_stage_part *p, size_t n)
{
	const size_t lim = n + 2 * (size_t)arena_stager_slots(e->stg);
	for (size_t j = e->fetched + 1; j < e->fetched + e->n_seq && j < 2 * e->n_seq && n < lim && n < DISK_MAXP;
	     j++) {
		const uint32_t q = seq_at(e, j);
		if (q != b && on_disk(e, q))
			n += disk_parts_of(e, q, p + n, DISK_MAXP - n);
	}
	return arena_stager_want(e->stg, p, n < DISK_MAXP ? n : DISK_MAXP);
}

/* The disk tier: block b's parts taken from the stager as they are read
 * (ahead of now, usually) and copied to dst on the copy stream; a coded
 * block (an hb4 image) is copied coded and decoded on the device. Each
 * slot is read into again once its copies (and decodes) are done. */
static int disk_parts(arena_engine *e, uint32_t b, uint8_t *dst, arena_stream **fill)
{
	arena_backend *be = e->be;
	arena_stage_part p[DISK_MAXP];
	const size_t n = disk_parts_of(e, b, p, DISK_MAXP);
	if (n > DISK_MAXP)
		return arena_errorf(ARENA_E_INTERNAL, "block '%s': %zu parts for the disk tier (at most %d)",
				    e->l->blocks[b].name, n, DISK_MAXP);
	int rc = stager_up(e);
	if (!rc)
		rc = disk_want(e, b, p, n);
	uint64_t stored = 0;
	for (size_t i = 0; i < n && !rc; i++) {
		unsigned k;
		uint8_t *buf;
		arena_wire *w;
		const double t0 = arena_now_s();
		rc = arena_stager_take(e->stg, &k, &buf, &w);
		e->rec.disk_wait_s += arena_now_s() - t0;
		if (rc)
			break;
		*fill = e->cs;
		if (w) { /* its segments' dst are the block's */
			if (!(rc = send_wire(e, w, dst, fill)))
				stored += w->stored;
		} else if (!(rc = be->ops->copy_h2d(be, dst + p[i].off, buf, p[i].len, e->cs))) {
			stored += p[i].len;
		}
		if (!rc) /* after its copies (and a coded part's decodes) */
			rc = be->ops->event_record(be, arena_stager_event(e->stg, k), *fill);
		if (rc) { /* some copies from the slot may be queued, and no event after them */
			char keep[1024];
			snprintf(keep, sizeof(keep), "%s", arena_last_error());
			be->ops->stream_sync(be, e->cs);
			if (e->ds)
				be->ops->stream_sync(be, e->ds);
			rc = arena_errorf(rc, "%s", keep);
		}
		arena_stager_put(e->stg, k);
	}
	if (!rc && disk_coded(e, b))
		e->m->mem[b].disk_wire->stored = stored; /* what its copies move */
	if (!rc)
		e->rec.disk_bytes += stored;
	return rc;
}

/* Where the bytes of block b are in host memory for a copy: its host slab,
 * or NULL (held coded: send() copies its coded form; in the image only:
 * send() reads it through the staging buffers). */
static int host_src(const arena_engine *e, uint32_t b, const uint8_t **src)
{
	*src = e->m->mem[b].host;
	if (on_disk(e, b) && !e->o.reread)
		return arena_errorf(ARENA_E_INTERNAL, "block '%s' has no host copy and no source to re-read",
				    e->l->blocks[b].name);
	return 0;
}

static int fail_engine(arena_engine *e, int rc)
{
	if (rc && rc != ARENA_E_USAGE) {
		e->state = ST_FAILED;
		e->failed_rc = rc;
	}
	return rc;
}

/* What rounding device allocations to the backend's granularity adds to
 * `bytes` (0 for none). */
static uint64_t gran_loss(const arena_backend *be, uint64_t bytes)
{
	uint64_t g = be->alloc_granularity;
	return g > 1 && bytes % g ? g - bytes % g : 0;
}

/* The rounding of every device allocation of the model's blocks (and of the
 * ring when e is not NULL): memory that free does not show and that is ours,
 * not another program's. */
static uint64_t own_rounding(const arena_model *m, const arena_engine *e)
{
	uint64_t r = 0;
	for (size_t b = 0; b < m->layout->n_blocks; b++)
		if (m->mem[b].dev)
			r += gran_loss(m->backend, m->layout->blocks[b].bytes);
	if (e && e->ring_dptr)
		r += gran_loss(m->backend, (uint64_t)e->n_slots * e->slot_bytes);
	if (e && e->wstage)
		r += gran_loss(m->backend, wire_stage_bytes(e));
	return r;
}

static uint64_t dev_used(const arena_engine *e)
{
	return e->plan.resident_bytes + (uint64_t)(e->plan.n_streamed ? e->n_slots : 0) * e->plan.slot_bytes;
}

/* The same with the engine's own scratch (no allocation). */
static double engine_predict(arena_engine *e)
{
	if (!arena__have_profile(&e->o))
		return -1;
	return arena__timed_run(e->l, &e->o, e->plan.sched, e->plan.bwd, e->plan.n_sched, e->plan.resident, e->plan.slots,
				&e->tscr);
}

static void refresh(arena_engine *e)
{
	arena__plan_derive(e->l, &e->plan, e->seq, &e->scratch);
	/* the predicted step by the profile (given or learned); 0 without one */
	double t = engine_predict(e);
	e->plan.step_s = t > 0 ? t : 0;
	e->n_seq = 0;
	for (size_t i = 0; i < e->plan.n_sched; i++)
		if (!e->plan.resident[e->plan.sched[i]])
			e->seq[e->n_seq++] = e->plan.sched[i];
}

/* Wait for everything the ring is part of, then free it. */
static int ring_free(arena_engine *e)
{
	int rc = 0;
	arena_backend *be = e->be;
	if ((e->cs && (rc = be->ops->stream_sync(be, e->cs))) || (e->ds && (rc = be->ops->stream_sync(be, e->ds))))
		return rc;
	for (size_t i = 0; i < e->ring.n_order; i++) {
		uint32_t q = e->ring.order[i];
		if (!rc)
			rc = be->ops->event_sync(be, e->ev_use[q]);
	}
	if (e->ring_dptr)
		be->ops->dev_free(be, e->ring_dptr);
	e->ring_dptr = NULL;
	arena__ring_reset(&e->ring, e->l->n_blocks, 0);
	e->ring_epoch++;
	e->slot_bytes = 0;
	return rc;
}

/* A ring of n_slots x `bytes` (0: none). DEV_OOM leaves no ring allocated. */
static int ring_alloc(arena_engine *e, uint64_t bytes)
{
	int rc;
	if (bytes == e->slot_bytes && (!bytes || e->ring.bytes == (uint64_t)e->n_slots * bytes))
		return 0;
	if ((rc = ring_free(e)) || !bytes)
		return rc;
	if ((rc = e->be->ops->dev_alloc(e->be, (uint64_t)e->n_slots * bytes, &e->ring_dptr)))
		return rc;
	arena__ring_reset(&e->ring, e->l->n_blocks, (uint64_t)e->n_slots * bytes);
	e->ring_epoch++;
	e->slot_bytes = bytes;
	return 0;
}

/* The host bytes a copy of block b takes: its slab, or an hb4 disk tier's
 * coded form. */
static uint64_t host_copy_bytes(const arena_engine *e, uint32_t b)
{
	const arena_wire *plan = disk_coded(e, b);
	return arena_align_up(plan ? plan->cap : e->l->blocks[b].bytes, ARENA_SLAB_ALIGN);
}

/* A host copy of block b, with `more` host bytes taken first, would go over
 * the host budget: it stays in its image (the disk tier). */
static int past_host_budget(const arena_engine *e, uint32_t b, uint64_t more)
{
	return e->o.reread && e->o.host_cap && e->m->host_bytes + more + host_copy_bytes(e, b) > e->o.host_cap;
}

/* Give block b a host copy (re-read from its source, checked) if it has
 * none: a raw slab, or, for an hb4 image streaming coded (the plan of its
 * coded form is there and so are the stages), its coded form, read coded:
 * a quarter fewer bytes held and copied, nothing decoded on the host. */
static int ensure_host(arena_engine *e, uint32_t b)
{
	arena_model *m = e->m;
	if (m->mem[b].host || m->mem[b].wire || !e->l->blocks[b].bytes)
		return 0;
	const arena_wire *plan = disk_coded(e, b);
	if (past_host_budget(e, b, 0))
		return 0; /* over the host budget: it stays in its image (the disk tier) */
	if (!e->o.reread)
		return arena_errorf(ARENA_E_INTERNAL, "block '%s' has no host copy and no source to re-read",
				    e->l->blocks[b].name);
	uint8_t *slab = NULL;
	arena_wire *w = NULL;
	int rc = plan ? arena_model_wire_add(m, b, &w) : arena_model_host_add(m, b, &slab);
	if (!rc) {
		if (e->stg) /* the stager reads from the same source */
			arena_stager_lock(e->stg);
		rc = w ? e->o.reread_wire(e->o.reread_ctx, b, 0, e->l->blocks[b].bytes, w)
		       : e->o.reread(e->o.reread_ctx, b, slab, e->l->blocks[b].bytes);
		if (e->stg)
			arena_stager_unlock(e->stg);
		if (rc)
			arena_model_host_discard(m, b);
	}
	if (rc) {
		arena_error_prefix(e->l->blocks[b].name);
		return rc;
	}
	arena_model_host_seal(m, b);
	if (e->moved)
		e->moved[b] = moved_bytes(e, b);
	return 0;
}

static int demotable(const arena_engine *e, uint32_t b)
{
	return !arena_block_is_globals(e->l, b) && e->plan.resident[b] && e->l->blocks[b].bytes &&
	       (e->m->mem[b].host || e->m->mem[b].wire || e->o.reread);
}

/* Drop block b's device copy (between steps; invariant 3). */
static int demote(arena_engine *e, uint32_t b)
{
	arena_model *m = e->m;
	int rc = ensure_host(e, b);
	if (!rc && m->mem[b].dev && (rc = e->be->ops->event_sync(e->be, e->ev_use[b])) == 0)
		rc = e->be->ops->event_sync(e->be, e->ev_fill[b]);
	if (rc)
		return rc;
	if (m->mem[b].dev) {
		e->be->ops->dev_free(e->be, m->mem[b].dev);
		m->mem[b].dev = NULL;
		m->dev_bytes -= e->l->blocks[b].bytes;
	}
	e->plan.resident[b] = 0;
	e->rec.demotions++;
	if (e->tr)
		arena_trace_instant(e->tr, ARENA_TRACE_DEMOTE, b, e->steps, e->l->blocks[b].bytes);
	return 0;
}

/* release_host: the host copies of blocks on the device for good go back to
 * the OS (promoted at an earlier step end: the copy from them is done by
 * now, synced to be sure), unless the caller keeps them; ensure_host reads
 * one again if the block is streamed later. (The H200, session 10: a
 * sampling run's RSS grew from 17.2 to 20.8 GiB after a move promoted 45
 * pieces, whose host copies stayed.) */
static int release_hosts(arena_engine *e)
{
	if (!e->o.release_host || !e->o.reread)
		return 0;
	arena_model *m = e->m;
	for (uint32_t b = 0; b < e->l->n_blocks; b++) {
		const arena_block_mem *bm = &m->mem[b];
		if (!e->plan.resident[b] || !bm->dev || bm->kept || !(bm->host || bm->wire))
			continue;
		int rc = e->be->ops->event_sync(e->be, e->ev_fill[b]);
		if (rc)
			return rc;
		arena_model_host_release(m, b);
	}
	return 0;
}

/* Saving of demoting b with the ring's slot S (0: nothing streamed): its
 * bytes less the ring's growth when b is larger than a slot. */
static int64_t saving_at(const arena_engine *e, uint32_t b, uint64_t S)
{
	uint64_t sz = e->l->blocks[b].bytes;
	uint64_t grow = sz > S ? (uint64_t)e->n_slots * (sz - S) : 0;
	return (int64_t)sz - (int64_t)grow;
}

/* The same with the ring as the plan has it. */
static int64_t saving(const arena_engine *e, uint32_t b)
{
	return saving_at(e, b, e->plan.n_streamed ? e->plan.slot_bytes : 0);
}

/* Demote the resident block that saves most; 0, 1 if none could go, or an error. */
static int demote_best(arena_engine *e)
{
	int64_t pick = -1, best = 0;
	for (uint32_t b = 0; b < e->l->n_blocks; b++)
		if (demotable(e, b) && saving(e, b) > best)
			best = saving(e, b), pick = b;
	if (pick < 0)
		return 1;
	int rc = demote(e, (uint32_t)pick);
	if (!rc)
		refresh(e);
	return rc;
}

/* Put block b on the device: allocate and copy from its host slab. */
static int promote(arena_engine *e, uint32_t b)
{
	arena_model *m = e->m;
	arena_backend *be = e->be;
	uint64_t sz = e->l->blocks[b].bytes;
	int rc = 0;
	if (!m->mem[b].dev && sz) {
		const uint8_t *src;
		if ((rc = host_src(e, b, &src)))
			return rc;
		if ((rc = be->ops->dev_alloc(be, sz, &m->mem[b].dev)))
			return rc;
		m->dev_bytes += sz;
		int k = -1;
		arena_stream *fs;
		if ((e->tr && (rc = arena_trace_copy_begin(e->tr, e->cs, b, sz, ARENA_TRACE_PROMOTE_COPY, e->steps, &k))) ||
		    (rc = send(e, b, m->mem[b].dev, src, &fs)) ||
		    (e->tr && (rc = arena_trace_copy_end(e->tr, k, e->cs))) ||
		    (rc = be->ops->event_record(be, e->ev_fill[b], fs))) {
			be->ops->stream_sync(be, e->cs);
			if (e->ds)
				be->ops->stream_sync(be, e->ds);
			be->ops->dev_free(be, m->mem[b].dev);
			m->mem[b].dev = NULL;
			m->dev_bytes -= sz;
			return rc;
		}
		e->rec.promoted_bytes += sz;
		e->rec.moved_bytes += moved_bytes(e, b);
		if (e->tr)
			arena_trace_instant(e->tr, ARENA_TRACE_PROMOTE, b, e->steps, sz);
	}
	e->plan.resident[b] = 1;
	return 0;
}

/* Make the ring fit the plan; a device allocation failure demotes and retries. */
static int fit_ring(arena_engine *e)
{
	for (;;) {
		uint64_t want = e->plan.n_streamed ? e->plan.slot_bytes : 0;
		int rc = ring_alloc(e, want);
		if (rc != ARENA_E(DEV_OOM))
			return rc;
		e->rec.alloc_retries++;
		int d = demote_best(e);
		if (d < 0)
			return d;
		if (d > 0)
			return rc; /* nothing left to demote: the DEV_OOM stands */
	}
}

/* --- device timing ------------------------------------------------------------ */

#define TM_EV 4 /* timing events a slot (see tm) */

static size_t tm_at(const arena_engine *e, unsigned par, uint32_t b, unsigned k)
{
	return ((size_t)par * e->l->n_blocks + b) * 2 + k;
}

/* Read copy pair k if its copy is done: 0 (read, or not recorded), 1 not
 * done yet, or an error. */
static int read_copy(arena_engine *e, unsigned k)
{
	double c;
	if (!e->cp_rec[k])
		return 0;
	int rc = e->be->ops->event_elapsed(e->be, e->cp_a[k], e->cp_z[k], &c);
	if (rc)
		return rc;
	e->cp_rec[k] = 0;
	if (c > 0)
		e->lc_rate[e->lc_n++ % 64] = (double)e->cp_bytes[k] / c;
	return 0;
}

static int harvest_copies(arena_engine *e)
{
	for (unsigned k = 0; k < ENGINE_COPY_PAIRS; k++) {
		int rc = read_copy(e, k);
		if (rc < 0)
			return rc;
	}
	return 0;
}

/* A learned time taken in: the first as it is, then a running mean. */
static void learned(double *v, double x)
{
	*v = *v < 0 ? x : 0.5 * *v + 0.5 * x;
}

/* Read what the device timed for parity `par` (non-blocking: nothing is
 * taken unless all of it is done): the step record's gpu_* and, without a
 * given profile, the learned costs. */
static int harvest(arena_engine *e, unsigned par)
{
	arena_backend *be = e->be;
	size_t n = e->l->n_blocks;
	unsigned stalls = 0, any = 0;
	double stall_s = 0, comp = 0, fwd = 0, bwd = 0;
	for (int pass = 0; pass < 2; pass++) {
		for (uint32_t b = 0; b < n; b++) {
			for (unsigned k = 0; k < 2; k++) {
				size_t i = tm_at(e, par, b, k);
				if (e->tm_rec[i] != 3)
					continue;
				double st, c, g = -1;
				int rc = be->ops->event_elapsed(be, e->tm[TM_EV * i], e->tm[TM_EV * i + 1], &st);
				if (!rc)
					rc = be->ops->event_elapsed(be, e->tm[TM_EV * i + 1], e->tm[TM_EV * i + 2], &c);
				if (!rc && e->tm_nx[i] != SIZE_MAX)
					rc = be->ops->event_elapsed(be, e->tm[TM_EV * i + 1], e->tm[e->tm_nx[i]], &g);
				if (rc < 0)
					return rc;
				if (rc > 0)
					return 0; /* not done yet: later */
				if (!pass)
					continue;
				any = 1;
				comp += c;
				if (st > 2e-5) {
					stalls++;
					stall_s += st;
				}
				/* What it costs the step: from its start to the next
				 * acquire (the work between blocks that uses no weights,
				 * attention in a transformer, is the block's before it);
				 * the last of a step, to its release. */
				const double cost = g >= 0 ? g : c;
				const int fw = k == 0 || e->tm_mode[par] != ARENA_MODE_TRAIN; /* sample: a later pass too */
				*(fw ? &fwd : &bwd) += cost;
				learned(fw ? &e->lcost[b] : &e->lbcost[b], cost);
				learned(fw ? &e->lhold[b] : &e->lbhold[b], c);
				e->tm_rec[i] = 0;
			}
		}
	}
	if (!any)
		return 0;
	if (bwd > 0) {
		e->lbwd_sum += bwd;
		e->lfwd_sum += fwd;
	}
	arena_engine_step *r = &e->hist[e->tm_step[par] % ARENA_ENGINE_HISTORY];
	if (e->tm_step[par] < e->steps && r->step == e->tm_step[par]) {
		r->gpu_timed = 1;
		r->stalls = stalls;
		r->stall_s = stall_s;
		r->compute_s = comp;
	}
	return 0;
}

/* The gap before step t, when both its events are done: from the device
 * reaching step t-1's end (arena_step_end, on the stream of its last
 * release) to step t's first scheduled acquire. */
static int gap_try(arena_engine *e, uint64_t t)
{
	if (t < 1 || (e->gap_taken != UINT64_MAX && e->gap_taken >= t))
		return 0;
	unsigned pa = (unsigned)((t - 1) & 1), pb = (unsigned)(t & 1);
	if (e->gap_a_step[pa] != t - 1 || e->gap_b_step[pb] != t)
		return 0;
	double g;
	int rc = e->be->ops->event_elapsed(e->be, e->gap_a[pa], e->gap_b[pb], &g);
	if (rc < 0)
		return rc;
	if (rc > 0)
		return 0; /* not done yet: at the next step's end */
	e->gap_taken = t;
	if (g >= 0 && g < 10) {
		e->gap_sum += g;
		e->gap_n++;
		e->o.step_gap_s = e->gap_sum / e->gap_n;
	}
	return 0;
}

/* At a step's end, without a given profile: read the gaps before this step
 * and the one before (opts.step_gap_s is their mean), then mark this
 * step's end. A caller that runs more than a step ahead of its device
 * gives no gap; its device then has none worth the name. */
static int time_gap(arena_engine *e)
{
	if (!e->timed || e->cost || e->o.no_learn)
		return 0;
	int rc;
	if ((e->steps && (rc = gap_try(e, e->steps - 1))) || (rc = gap_try(e, e->steps)))
		return rc;
	if (!e->last_s)
		return 0;
	unsigned p = (unsigned)(e->steps & 1);
	if ((rc = e->be->ops->event_record(e->be, e->gap_a[p], e->last_s)))
		return rc;
	e->gap_a_step[p] = e->steps;
	return 0;
}

/* The copy into the ring waits for the last release of each block it overwrites. */
static int evict_wait(void *ctx, uint32_t q)
{
	arena_engine *e = ctx;
	return e->be->ops->stream_wait(e->be, e->cs, e->ev_use[q]);
}

/* Put block b in the ring for one more use: its copy is issued unless it
 * is there already (the copy counts in the record of the step whose entry
 * it is for: this one, or the next when `next`); 0, 1 no room in the ring
 * now, or an error. */
static int fetch_block(arena_engine *e, uint32_t b, int next)
{
	arena_backend *be = e->be;
	uint64_t at, sz = e->l->blocks[b].bytes;
	int reuse, rc;
	if (arena__ring_place(&e->ring, e->l, b, &at, &reuse))
		return 1;
	if (!reuse) {
		unsigned k = e->cp_next % ENGINE_COPY_PAIRS;
		int tk = -1;
		int timing = e->timed && sz;
		const uint8_t *src = NULL;
		arena_stream *fs = e->cs;
		if ((rc = host_src(e, b, &src)))
			return rc;
		if (timing) { /* the pair's last copy, read if done, else dropped */
			if ((rc = read_copy(e, k)) < 0)
				return rc;
			e->cp_rec[k] = 0;
			e->cp_next++;
		}
		if ((rc = arena__ring_take(&e->ring, e->l, b, at, evict_wait, e)) ||
		    (timing && (rc = be->ops->event_record(be, e->cp_a[k], e->cs))) ||
		    (e->tr && sz &&
		     (rc = arena_trace_copy_begin(e->tr, e->cs, b, sz, ARENA_TRACE_FETCH, e->steps + (next ? 1 : 0), &tk))) ||
		    (rc = send(e, b, (uint8_t *)e->ring_dptr + at, src, &fs)) ||
		    (e->tr && (rc = arena_trace_copy_end(e->tr, tk, e->cs))) ||
		    (timing && (rc = be->ops->event_record(be, e->cp_z[k], e->cs))) ||
		    (rc = be->ops->event_record(be, e->ev_fill[b], fs)))
			return rc;
		if (timing) {
			e->cp_rec[k] = 1;
			e->cp_bytes[k] = moved_bytes(e, b);
		}
		if (next) {
			e->next_bytes += sz;
			e->next_moved += moved_bytes(e, b);
			e->next_copies++;
		} else {
			e->rec.streamed_bytes += sz;
			e->rec.moved_bytes += moved_bytes(e, b);
			e->rec.copies++;
		}
	}
	e->ring.pending[b]++;
	return 0;
}

static int fetch_one(arena_engine *e, size_t j)
{
	return fetch_block(e, seq_at(e, j), j >= e->n_seq);
}

/* Forget the entries fetched ahead and not yet acquired (their copies stay
 * issued; their bytes stay in the ring, reused if asked for while there). */
static void drop_ahead(arena_engine *e)
{
	if (e->ring_epoch == e->fetch_epoch)
		for (size_t j = e->cur; j < e->fetched; j++)
			e->ring.pending[seq_at(e, j)]--;
	e->fetched = e->cur;
}

/* Fetch streamed entries ahead as far as the ring has room: past the end of
 * the step into the next one's first entries too (at most a step ahead), so
 * that a caller whose step ends with a wait for its work (a host sync) finds
 * the next step's first blocks on their way. */
static int prefetch(arena_engine *e)
{
	if (e->fetch_epoch != e->ring_epoch) { /* the ring was made anew: nothing in it is ours */
		e->fetch_epoch = e->ring_epoch;
		e->fetched = e->cur;
	}
	const size_t ahead = e->ahead < e->n_seq ? e->ahead : e->n_seq;
	while (e->fetched < e->cur + ahead && e->fetched < 2 * e->n_seq) {
		int rc = fetch_one(e, e->fetched);
		if (rc < 0)
			return rc;
		if (rc > 0)
			break;
		e->fetched++;
	}
	return 0;
}

void arena_engine_free(arena_engine *e)
{
	if (!e)
		return;
	arena_backend *be = e->be;
	look_free(&e->look);
	/* A trace not ended is written now (an error here has no one to go to). */
	arena_trace_close(e->tr, e->state != ST_FAILED && e->state != ST_STEP);
	if (e->ring.present)
		ring_free(e);
	if (e->cs)
		be->ops->stream_sync(be, e->cs);
	if (e->ds)
		be->ops->stream_sync(be, e->ds);
	arena_stager_free(e->stg); /* its thread stopped, its slots' copies done */
	arena_free(e->disk_plans);
	if (e->wstage)
		be->ops->dev_free(be, e->wstage);
	for (unsigned k = 0; k < ENGINE_WIRE_STAGES; k++) {
		if (e->wcp[k])
			be->ops->event_destroy(be, e->wcp[k]);
		if (e->wdec[k])
			be->ops->event_destroy(be, e->wdec[k]);
	}
	if (e->wx)
		be->ops->event_destroy(be, e->wx);
	if (e->ds)
		be->ops->stream_destroy(be, e->ds);
	for (size_t b = 0; b < e->l->n_blocks; b++) {
		if (e->ev_use && e->ev_use[b]) {
			be->ops->event_sync(be, e->ev_use[b]);
			be->ops->event_destroy(be, e->ev_use[b]);
		}
		if (e->ev_fill && e->ev_fill[b])
			be->ops->event_destroy(be, e->ev_fill[b]);
	}
	for (size_t i = 0; e->tm && i < TM_EV * 2 * (e->l->n_blocks ? e->l->n_blocks : 1) * 2; i++)
		if (e->tm[i])
			be->ops->event_destroy(be, e->tm[i]);
	for (unsigned k = 0; k < ENGINE_COPY_PAIRS; k++) {
		if (e->cp_a[k])
			be->ops->event_destroy(be, e->cp_a[k]);
		if (e->cp_z[k])
			be->ops->event_destroy(be, e->cp_z[k]);
	}
	for (unsigned k = 0; k < 2; k++) {
		if (e->gap_a[k])
			be->ops->event_destroy(be, e->gap_a[k]);
		if (e->gap_b[k])
			be->ops->event_destroy(be, e->gap_b[k]);
	}
	arena_free(e->tm);
	arena_free(e->tm_rec);
	arena_free(e->tm_nx);
	arena_free(e->lhold);
	arena_free(e->acq_n);
	arena_free(e->rel_n);
	arena_free(e->lcost);
	arena_free(e->lbcost);
	arena_free(e->lbhold);
	if (e->cs)
		be->ops->stream_destroy(be, e->cs);
	arena__ring_release(&e->ring);
	arena__ring_release(&e->scratch);
	arena_residency_plan_release(&e->memo);
	arena__timed_release(&e->tscr);
	arena_free(e->seq);
	arena_free(e->obs);
	arena_free(e->msched[0]);
	arena_free(e->msched[1]);
	arena_free(e->held);
	arena_free(e->ev_use);
	arena_free(e->ev_fill);
	arena_free(e->res_held);
	arena_free(e->near);
	arena_free(e->hist);
	arena_free(e->cost);
	arena_free(e->moved);
	arena_residency_plan_release(&e->plan);
	arena_free(e);
}

int arena_engine_create(arena_model *m, const arena_engine_opts *o, arena_engine **out)
{
	*out = NULL;
	arena_backend *be = m->backend;
	const arena_layout *l = m->layout;
	uint64_t free_b = 0, total = 0, budget, headroom, reserve;
	int rc = be->ops->mem_info(be, &free_b, &total);
	if (rc)
		return rc;
	arena_residency_budget(total, free_b + m->dev_bytes + own_rounding(m, NULL), o, &budget, &headroom, &reserve);
	arena_engine *e = arena_calloc(1, sizeof(*e));
	if (!e)
		return arena_errorf(ARENA_E_NOMEM, "engine: out of memory");
	e->m = m;
	e->be = be;
	e->l = l;
	e->o = *o;
	e->move_scale = 1;
	e->ahead = SIZE_MAX;
	for (uint32_t b = 0; b < l->n_blocks; b++)
		e->all_bytes += l->blocks[b].bytes;
	e->o.sched = NULL; /* the engine's own copy is made below */
	e->o.hold = NULL;  /* learned only (engine.h) */
	e->o.bcost = e->o.bhold = NULL;
	e->o.n_sched = 0;
	if (o->cost) { /* the engine keeps its own copy of the profile */
		double *c = arena_calloc(l->n_blocks ? l->n_blocks : 1, sizeof(*c));
		if (!c) {
			arena_free(e);
			return arena_errorf(ARENA_E_NOMEM, "engine: out of memory");
		}
		memcpy(c, o->cost, l->n_blocks * sizeof(*c));
		e->cost = c;
		e->o.cost = c;
	}
	/* Coded streaming: the stages its copies go through are device memory
	 * the plan leaves room for. */
	int coded = 0; /* something streams coded: a host copy held coded, or a disk-tier block read coded */
	uint64_t stage = 0;
	for (size_t b = 0; b < l->n_blocks; b++) {
		const arena_block_mem *bm = &m->mem[b];
		coded |= bm->wire || (bm->disk_wire && !bm->dev && o->reread_wire);
		if (bm->wire && bm->wire->max_stage > stage)
			stage = arena_align_up(bm->wire->max_stage, 256); /* within arena_wire_stage_bound */
		/* not yet read (the disk tier, or a resident block that may leave
		 * the device and get a coded host copy): the most */
		if (bm->disk_wire && o->reread_wire && bm->disk_wire->most > stage)
			stage = arena_align_up(bm->disk_wire->most, 256);
	}
	e->wstage_each = coded ? stage : 0;
	if (e->wstage_each) {
		if (!(e->moved = arena_calloc(l->n_blocks, sizeof(*e->moved)))) {
			rc = arena_errorf(ARENA_E_NOMEM, "engine: out of memory");
			goto fail;
		}
		e->wstage_each = arena_wire_stage_each(e->wstage_each);
		uint64_t st = wire_stage_bytes(e) + gran_loss(be, wire_stage_bytes(e));
		budget = budget > st ? budget - st : 0;
		if ((rc = be->ops->dev_alloc(be, wire_stage_bytes(e), (void **)&e->wstage)) ||
		    (rc = (be->ops->stream_create_urgent ? be->ops->stream_create_urgent : be->ops->stream_create)(be, &e->ds)) ||
		    (rc = be->ops->event_create(be, &e->wx)))
			goto fail;
		for (unsigned k = 0; k < ENGINE_WIRE_STAGES; k++)
			if ((rc = be->ops->event_create(be, &e->wcp[k])) || (rc = be->ops->event_create(be, &e->wdec[k])))
				goto fail;
		for (size_t b = 0; b < l->n_blocks; b++) /* (the stages are there: disk_coded) */
			e->moved[b] = moved_bytes(e, (uint32_t)b);
		e->o.moved = e->moved;
	}
	arena_engine_opts po = *o;
	po.moved = e->moved;
	if ((rc = arena_residency_plan_make(l, &po, budget, &e->plan))) {
		if (rc == ARENA_E(BUDGET)) {
			char msg[1024];
			snprintf(msg, sizeof(msg), "%s", arena_last_error());
			uint64_t avail = free_b + m->dev_bytes + own_rounding(m, NULL);
			if (o->cap && o->cap < avail)
				avail = o->cap;
			arena_errorf(rc,
				     "%s: does not fit: %s; with a working reserve of %s and headroom of %s it needs %s of "
				     "device memory, %s is available%s",
				     be->ops->name, msg, arena__fmtb(reserve), arena__fmtb(headroom),
				     arena__fmtb(e->plan.min_need_bytes + reserve + headroom), arena__fmtb(avail),
				     o->cap ? " under the cap" : "");
		}
		goto fail;
	}
	e->plan.headroom = headroom;
	e->plan.reserve = reserve;
	e->tm_mode[0] = e->tm_mode[1] = o->mode;
	size_t n = l->n_blocks;
	e->max_sched = arena_residency_max_sched(l);
	size_t ns = e->max_sched > e->plan.n_sched ? e->max_sched : e->plan.n_sched;
	ns = ns ? ns : 1;
	e->max_held = ns + n;
	e->n_slots = arena__ring_slots(o);
	int rr = arena__ring_init(&e->ring, n), rs = arena__ring_init(&e->scratch, n);
	if (!rs)
		rs = arena__timed_init(&e->tscr, n, ns);
	e->seq = arena_calloc(ns, sizeof(*e->seq));
	e->obs = arena_calloc(ns, sizeof(*e->obs));
	e->held = arena_calloc(e->max_held, sizeof(*e->held));
	e->ev_use = arena_calloc(n ? n : 1, sizeof(*e->ev_use));
	e->ev_fill = arena_calloc(n ? n : 1, sizeof(*e->ev_fill));
	e->res_held = arena_calloc(n ? n : 1, sizeof(*e->res_held));
	e->near = arena_calloc(n ? n : 1, 1);
	e->hist = arena_calloc(ARENA_ENGINE_HISTORY, sizeof(*e->hist));
	e->msched[0] = arena_calloc(ns, sizeof(uint32_t));
	e->msched[1] = arena_calloc(ns, sizeof(uint32_t));
	if (rr || rs || !e->seq || !e->obs || !e->held || !e->msched[0] || !e->msched[1] ||
	    !e->ev_use || !e->ev_fill || !e->res_held || !e->near || !e->hist) {
		rc = arena_errorf(ARENA_E_NOMEM, "engine: out of memory");
		goto fail;
	}
	if (o->sched && o->n_sched) { /* a given schedule is the mode's until another is learned */
		int md = o->mode == ARENA_MODE_TRAIN;
		memcpy(e->msched[md], o->sched, o->n_sched * sizeof(uint32_t));
		e->mn[md] = o->n_sched;
		e->o.sched = e->msched[md];
		e->o.n_sched = o->n_sched;
	}
	if ((rc = be->ops->stream_create(be, &e->cs)))
		goto fail;
	e->timed = be->ops->event_create_timed && be->ops->event_elapsed;
	if (e->timed) {
		size_t nt = 2 * (n ? n : 1) * 2;
		e->tm = arena_calloc(TM_EV * nt, sizeof(*e->tm));
		e->tm_rec = arena_calloc(nt, 1);
		e->tm_nx = arena_calloc(nt, sizeof(*e->tm_nx));
		e->lhold = arena_calloc(n ? n : 1, sizeof(*e->lhold));
		e->acq_n = arena_calloc(n ? n : 1, sizeof(*e->acq_n));
		e->rel_n = arena_calloc(n ? n : 1, sizeof(*e->rel_n));
		e->lcost = arena_calloc(n ? n : 1, sizeof(*e->lcost));
		e->lbcost = arena_calloc(n ? n : 1, sizeof(*e->lbcost));
		e->lbhold = arena_calloc(n ? n : 1, sizeof(*e->lbhold));
		if (!e->tm || !e->tm_rec || !e->tm_nx || !e->lhold || !e->acq_n || !e->rel_n || !e->lcost || !e->lbcost ||
		    !e->lbhold) {
			rc = arena_errorf(ARENA_E_NOMEM, "engine: out of memory");
			goto fail;
		}
		for (size_t b = 0; b < n; b++)
			e->lcost[b] = e->lhold[b] = e->lbcost[b] = e->lbhold[b] =
				arena_block_is_globals(l, (uint32_t)b) ? 0 : -1;
		for (size_t i = 0; i < TM_EV * nt; i++)
			if (n && (rc = be->ops->event_create_timed(be, &e->tm[i])))
				goto fail;
		for (unsigned k = 0; k < ENGINE_COPY_PAIRS; k++)
			if ((rc = be->ops->event_create_timed(be, &e->cp_a[k])) ||
			    (rc = be->ops->event_create_timed(be, &e->cp_z[k])))
				goto fail;
		for (unsigned k = 0; k < 2; k++)
			if ((rc = be->ops->event_create_timed(be, &e->gap_a[k])) ||
			    (rc = be->ops->event_create_timed(be, &e->gap_b[k])))
				goto fail;
	}
	e->gap_a_step[0] = e->gap_a_step[1] = e->gap_b_step[0] = e->gap_b_step[1] = e->gap_taken = UINT64_MAX;
	for (size_t b = 0; b < n; b++)
		if ((rc = be->ops->event_create(be, &e->ev_use[b])) ||
		    (rc = e->timed ? be->ops->event_create_timed(be, &e->ev_fill[b]) : be->ops->event_create(be, &e->ev_fill[b])))
			goto fail;
	/* Every block must be somewhere it can come back from: the device, a
	 * host slab, or its image (the disk tier). */
	for (uint32_t b = 0; b < n; b++)
		if (on_disk(e, b) && !o->reread) {
			rc = arena_errorf(ARENA_E_USAGE,
					  "engine: block '%s' is neither on the device nor in a host slab, and there is "
					  "no image to read it from",
					  l->blocks[b].name);
			goto fail;
		}
	/* Device-only blocks that cannot be re-read stay resident. */
	uint8_t *want = e->plan.resident;
	for (uint32_t b = 0; b < n; b++)
		if (!want[b] && m->mem[b].dev && !m->mem[b].host && !m->mem[b].wire && !o->reread)
			want[b] = 1;
	/* Apply: free what goes first, then place what stays, then the ring. */
	for (uint32_t b = 0; b < n; b++)
		if (!want[b] && m->mem[b].dev) {
			want[b] = 1; /* demote() expects a resident block */
			if ((rc = demote(e, b)))
				goto fail;
		}
	for (uint32_t b = 0; b < n; b++) {
		if (!want[b] || m->mem[b].dev || !l->blocks[b].bytes)
			continue;
		rc = promote(e, b);
		if (rc == ARENA_E(DEV_OOM) && !arena_block_is_globals(l, b)) {
			e->plan.resident[b] = 0; /* demote and go on */
			e->rec.alloc_retries++;
			rc = 0;
		}
		if (rc)
			goto fail;
	}
	refresh(e);
	if ((rc = fit_ring(e)))
		goto fail;
	refresh(e);
	if ((rc = be->ops->stream_sync(be, e->cs)))
		goto fail;
	e->rec.demotions = 0;
	e->rec.promoted_bytes = 0;
	*out = e;
	return 0;
fail:
	arena_engine_free(e);
	return rc;
}

int arena_engine_step_begin(arena_engine *e)
{
	if (e->state == ST_FAILED)
		return e->failed_rc;
	if (e->state != ST_IDLE)
		return arena_errorf(ARENA_E_USAGE, "engine: step_begin inside a step");
	e->state = ST_STEP;
	if (e->timed) {
		unsigned par = (unsigned)(e->steps & 1);
		memset(e->acq_n, 0, e->l->n_blocks * sizeof(*e->acq_n));
		memset(e->rel_n, 0, e->l->n_blocks * sizeof(*e->rel_n));
		memset(e->tm_rec + tm_at(e, par, 0, 0), 0, e->l->n_blocks * 2); /* unread timing of 2 steps ago goes */
		e->tm_prev = SIZE_MAX; /* the last step's last block has no next acquire */
		e->tm_step[par] = e->steps;
		e->tm_mode[par] = e->o.mode;
	}
	e->rec.mode = e->o.mode;
	if (e->tr)
		arena_trace_instant(e->tr, ARENA_TRACE_STEP_BEGIN, 0, e->steps, 0);
	if (!e->begun) {
		e->cur = e->fetched = 0;
		e->begun = 1;
	}
	return fail_engine(e, prefetch(e));
}

/* Device timing of acquires and releases of scheduled blocks (the first two
 * of each per step: forward and backward). */
static int time_ready(arena_engine *e, uint32_t b, arena_stream *s, size_t *slot)
{
	*slot = SIZE_MAX;
	if (!e->timed)
		return 0;
	const size_t prev = e->tm_prev;
	e->tm_prev = SIZE_MAX;
	if (arena_block_is_globals(e->l, b) || e->acq_n[b] >= 2) {
		if (prev == SIZE_MAX) /* the last timed one's next acquire, untimed: an event of its own */
			return 0;
		e->tm_nx[prev] = TM_EV * prev + 3;
		return e->be->ops->event_record(e->be, e->tm[TM_EV * prev + 3], s);
	}
	unsigned par = (unsigned)(e->steps & 1);
	size_t i = tm_at(e, par, b, e->acq_n[b]++);
	*slot = i;
	e->tm_rec[i] = 0;
	e->tm_nx[i] = SIZE_MAX;
	e->tm_prev = i;
	if (prev != SIZE_MAX) /* the last timed one's next acquire: this one's ready event, below */
		e->tm_nx[prev] = TM_EV * i;
	if (e->gap_b_step[par] != e->steps) { /* the step's first scheduled acquire */
		int rc = e->be->ops->event_record(e->be, e->gap_b[par], s);
		if (rc)
			return rc;
		e->gap_b_step[par] = e->steps;
	}
	return e->be->ops->event_record(e->be, e->tm[TM_EV * i], s);
}

static int time_start(arena_engine *e, size_t slot, arena_stream *s)
{
	if (slot == SIZE_MAX)
		return 0;
	e->tm_rec[slot] = 1;
	return e->be->ops->event_record(e->be, e->tm[TM_EV * slot + 1], s);
}

static int time_end(arena_engine *e, uint32_t b, arena_stream *s)
{
	if (!e->timed || arena_block_is_globals(e->l, b) || e->rel_n[b] >= 2)
		return 0;
	size_t i = tm_at(e, (unsigned)(e->steps & 1), b, e->rel_n[b]++);
	if (e->tm_rec[i] != 1)
		return 0;
	e->tm_rec[i] = 3;
	return e->be->ops->event_record(e->be, e->tm[TM_EV * i + 2], s);
}

/* Make `s` wait for block b's bytes, timed (the step's records, a trace). */
static int wait_fill(arena_engine *e, uint32_t b, arena_stream *s)
{
	size_t ts;
	int k = -1, rc;
	if ((rc = time_ready(e, b, s, &ts)) || (e->tr && (rc = arena_trace_acquire_ready(e->tr, s, b, e->steps, &k))) ||
	    (rc = e->be->ops->stream_wait(e->be, s, e->ev_fill[b])) || (rc = time_start(e, ts, s)))
		return rc;
	return e->tr ? arena_trace_acquire_start(e->tr, k, s) : 0;
}

/* The caller's work with b ends on s: timed, then b's last use. */
static int mark_release(arena_engine *e, uint32_t b, arena_stream *s)
{
	int rc;
	if ((rc = time_end(e, b, s)) || (e->tr && (rc = arena_trace_release(e->tr, b, s))))
		return rc;
	e->last_s = s;
	return e->be->ops->event_record(e->be, e->ev_use[b], s);
}

/* Log an acquire of a scheduled block (the order the caller really runs). */
static void observe(arena_engine *e, uint32_t b)
{
	if (arena_block_is_globals(e->l, b))
		return;
	e->rec.acquires++;
	if (e->n_obs < e->max_sched)
		e->obs[e->n_obs++] = b;
	else
		e->obs_over = 1;
}

/* Where a streamed block acquired now sits in seq: the next entry if it is
 * b; otherwise (a miss) the prefetches ahead are dropped and the position
 * moves to b's next entry, or its first, or SIZE_MAX (none: b is fetched on
 * its own). */
static size_t locate(arena_engine *e, uint32_t b)
{
	if (e->cur < e->n_seq && e->seq[e->cur] == b) {
		if (e->ahead < e->n_seq)
			e->ahead *= 2;
		return e->cur;
	}
	e->rec.misses++;
	drop_ahead(e);
	size_t j = SIZE_MAX;
	for (size_t i = e->cur; i < e->n_seq && j == SIZE_MAX; i++)
		if (e->seq[i] == b)
			j = i;
	for (size_t i = 0; i < e->cur && j == SIZE_MAX; i++)
		if (e->seq[i] == b)
			j = i;
	if (j != SIZE_MAX)
		e->cur = e->fetched = j;
	e->ahead = 1;
	return j;
}

int arena_engine_acquire(arena_engine *e, uint32_t block, arena_stream *stream, void **dptr)
{
	int rc;
	*dptr = NULL;
	if (e->state == ST_FAILED)
		return e->failed_rc;
	if (e->state != ST_STEP)
		return arena_errorf(ARENA_E_USAGE, "engine: acquire outside a step (call step_begin first)");
	if (block >= e->l->n_blocks)
		return arena_errorf(ARENA_E_USAGE, "engine: no block %u (the model has %zu)", block, e->l->n_blocks);
	if (e->plan.resident[block]) {
		if ((rc = wait_fill(e, block, stream)))
			return fail_engine(e, rc);
		e->res_held[block]++;
		observe(e, block);
		*dptr = e->m->mem[block].dev;
		return 0;
	}
	if (e->n_held >= e->max_held)
		return arena_errorf(ARENA_E_USAGE, "engine: %zu blocks held; release some before acquiring '%s'", e->n_held,
				    e->l->blocks[block].name);
	size_t j = locate(e, block);
	if (j == SIZE_MAX || e->fetched <= j) {
		if ((rc = j == SIZE_MAX ? fetch_block(e, block, 0) : fetch_one(e, j)) < 0)
			return fail_engine(e, rc);
		if (rc > 0)
			return arena_errorf(ARENA_E_USAGE,
					    "engine: %zu blocks held fill the ring (%u x %s): no room for block '%s'; "
					    "release blocks before acquiring more",
					    e->n_held, e->n_slots, arena__fmtb(e->slot_bytes), e->l->blocks[block].name);
		if (j != SIZE_MAX)
			e->fetched = j + 1;
	}
	if ((rc = wait_fill(e, block, stream)))
		return fail_engine(e, rc);
	e->held[e->n_held++] = (struct hold){block, j};
	if (j != SIZE_MAX)
		e->cur = j + 1;
	observe(e, block);
	*dptr = (uint8_t *)e->ring_dptr + e->ring.off[block];
	if ((rc = prefetch(e)))
		return fail_engine(e, rc);
	return 0;
}

int arena_engine_release(arena_engine *e, uint32_t block, arena_stream *stream)
{
	int rc;
	if (e->state == ST_FAILED)
		return e->failed_rc;
	if (e->state != ST_STEP)
		return arena_errorf(ARENA_E_USAGE, "engine: release of block %u outside a step", block);
	if (block >= e->l->n_blocks)
		return arena_errorf(ARENA_E_USAGE, "engine: no block %u (the model has %zu)", block, e->l->n_blocks);
	if (e->plan.resident[block]) {
		if (!e->res_held[block])
			return arena_errorf(ARENA_E_USAGE, "engine: release of block '%s' that is not acquired",
					    e->l->blocks[block].name);
		e->res_held[block]--;
		return fail_engine(e, mark_release(e, block, stream));
	}
	size_t h = 0;
	while (h < e->n_held && e->held[h].block != block)
		h++;
	if (h == e->n_held)
		return arena_errorf(ARENA_E_USAGE, "engine: release of block '%s' that is not acquired",
				    e->l->blocks[block].name);
	memmove(&e->held[h], &e->held[h + 1], (e->n_held - h - 1) * sizeof(*e->held));
	e->n_held--;
	if ((rc = mark_release(e, block, stream)))
		return fail_engine(e, rc);
	e->ring.pending[block]--;
	if ((rc = prefetch(e)))
		return fail_engine(e, rc);
	return 0;
}

/* Move to the resident set `want` (between steps): demote what goes, largest
 * first, free the ring, promote what comes (a device allocation failure
 * leaves that block streamed), then a ring for what is streamed now. */
static int apply_moves(arena_engine *e, const uint8_t *want)
{
	int rc, same = 1;
	for (uint32_t b = 0; b < e->l->n_blocks && same; b++)
		same = !want[b] == !e->plan.resident[b];
	if (same) { /* nothing moves: the ring only, if its shape changed */
		refresh(e);
		return fit_ring(e);
	}
	for (;;) {
		int64_t pick = -1;
		for (uint32_t b = 0; b < e->l->n_blocks; b++)
			if (!want[b] && demotable(e, b) && (pick < 0 || e->l->blocks[b].bytes > e->l->blocks[pick].bytes))
				pick = b;
		if (pick < 0)
			break;
		if ((rc = demote(e, (uint32_t)pick)))
			return rc;
	}
	if ((rc = ring_free(e)))
		return rc;
	for (uint32_t b = 0; b < e->l->n_blocks; b++) {
		if (!want[b] || e->plan.resident[b])
			continue;
		rc = promote(e, b);
		if (rc == ARENA_E(DEV_OOM)) {
			e->rec.alloc_retries++;
			arena_error_clear();
			continue;
		}
		if (rc)
			return rc;
		e->rec.promotions++;
	}
	refresh(e);
	return fit_ring(e);
}

/* The demoted block of a move to `want` after (sz, b) in the order
 * apply_moves demotes them: the largest first, the lower number first
 * among equals; -1 after the last. (sz, b) = (UINT64_MAX, -1): the first. */
static int64_t next_demoted(const arena_engine *e, const uint8_t *want, uint64_t sz, int64_t b)
{
	int64_t pick = -1;
	for (uint32_t i = 0; i < e->l->n_blocks; i++) {
		const uint64_t z = e->l->blocks[i].bytes;
		if (arena_block_is_globals(e->l, i) || want[i] || !e->plan.resident[i] || !z)
			continue;
		if (z > sz || (z == sz && (int64_t)i <= b))
			continue; /* at or before (sz, b) */
		if (pick < 0 || z > e->l->blocks[pick].bytes)
			pick = i;
	}
	return pick;
}

/* What a move from the resident set now to `want` reads and copies:
 * *copy_b, the bytes promoted blocks copy to the device; *read_b, the bytes
 * read from the image now (promoted blocks with no host copy, and demoted
 * blocks whose host copy is gone (release_host) while the host budget
 * takes them, in the order apply_moves demotes them and ensure_host gives
 * them copies); *disk_b, the bytes each step would read from the image
 * more than now (demoted blocks the host budget no longer takes, less
 * promoted blocks that were in the disk tier; 0 without a host budget). */
static void move_bytes(const arena_engine *e, const uint8_t *want, double *copy_b, double *read_b, double *disk_b)
{
	const arena_model *m = e->m;
	const int tier = e->o.reread && e->o.host_cap;
	*copy_b = *read_b = *disk_b = 0;
	for (uint32_t b = 0; b < e->l->n_blocks; b++) {
		if (arena_block_is_globals(e->l, b) || !want[b] || e->plan.resident[b] || !e->l->blocks[b].bytes)
			continue;
		*copy_b += (double)e->l->blocks[b].bytes;
		if (!m->mem[b].host && !m->mem[b].wire) {
			*read_b += (double)e->l->blocks[b].bytes;
			*disk_b -= tier ? (double)host_copy_bytes(e, b) : 0; /* read each step no more */
		}
	}
	uint64_t taken = 0; /* host copies the move's demotions make before this one */
	for (int64_t b = next_demoted(e, want, UINT64_MAX, -1); b >= 0;
	     b = next_demoted(e, want, e->l->blocks[b].bytes, b)) {
		if (m->mem[b].host || m->mem[b].wire)
			continue; /* it has its host copy */
		if (past_host_budget(e, (uint32_t)b, taken)) {
			*disk_b += (double)host_copy_bytes(e, (uint32_t)b);
		} else {
			*read_b += (double)e->l->blocks[b].bytes;
			taken += host_copy_bytes(e, (uint32_t)b);
		}
	}
}

void arena__engine_move_bytes(const arena_engine *e, const uint8_t *want, double *copy_b, double *read_b,
			      double *disk_b)
{
	move_bytes(e, want, copy_b, read_b, disk_b);
}

static double move_read_bps(const arena_engine *e)
{
	return e->o.move_read_bps > 0 ? e->o.move_read_bps : ARENA_ENGINE_MOVE_READ_BPS;
}

/* The host seconds a move to `want` is estimated to take (apply_moves),
 * unscaled: its copies at move_copy_bps, its reads at move_read_bps; and
 * (disk_b, may be NULL) the bytes it adds to each step's reads from the
 * image (move_bytes). */
static double move_cost_raw(const arena_engine *e, const uint8_t *want, double *disk_b)
{
	const double cb = e->o.move_copy_bps > 0 ? e->o.move_copy_bps : ARENA_ENGINE_MOVE_COPY_BPS;
	double copy_b, read_b, d;
	move_bytes(e, want, &copy_b, &read_b, &d);
	if (disk_b)
		*disk_b = d;
	return copy_b / cb + read_b / move_read_bps(e);
}

/* Is a move to `want`, rather than to `alt` (NULL: staying), worth `gain`
 * seconds a step, less the disk tier's reads it adds a step (at
 * move_read_bps): does it pay for itself within payback_steps steps
 * (ARENA_ENGINE_DEFAULT_PAYBACK), its cost move_cost_raw's less alt's,
 * scaled by what timed moves took against it? The step's record keeps the
 * estimate and that gain, and says when the move was held back. (On the
 * H200, sampling at 8 GiB with 3.1 GB a step in the disk tier, a look's
 * swap put 3.3 GB more there: 0.55 s steps became 0.73 s.) */
static int move_pays(arena_engine *e, const uint8_t *want, const uint8_t *alt, double gain)
{
	const unsigned n = e->o.payback_steps ? e->o.payback_steps : ARENA_ENGINE_DEFAULT_PAYBACK;
	double disk_w, disk_a = 0;
	double cost = move_cost_raw(e, want, &disk_w) - (alt ? move_cost_raw(e, alt, &disk_a) : 0);
	cost = (cost > 0 ? cost : 0) * e->move_scale;
	gain -= (disk_w - disk_a) / move_read_bps(e); /* the predictions time copies from host memory */
	e->rec.move_est_s = cost;
	e->rec.move_gain_s = gain;
	if (gain > 0 && gain * n >= cost)
		return 1;
	e->rec.move_held = 1;
	return 0;
}

/* apply_moves, its host time counted in the step's record and timed
 * against its estimate (move_scale: an average of the ratios in which each
 * move weighs as much as all before it; estimates under a millisecond say
 * too little to learn from). */
static int apply(arena_engine *e, const uint8_t *want)
{
	const double est = move_cost_raw(e, want, NULL);
	const double t0 = arena_now_s();
	int rc = apply_moves(e, want);
	const double took = arena_now_s() - t0;
	e->rec.move_s += took;
	if (!rc && est > 1e-3) {
		double r = took / est;
		r = r < 0.05 ? 0.05 : r > 20 ? 20 : r;
		e->move_scale = e->moves_timed++ ? 0.5 * e->move_scale + 0.5 * r : r;
	}
	return rc;
}

/* Room: a plan t for the budget now is worth moving to when it keeps more
 * resident and is not predicted slower (within 0.5%: fewer copies for the
 * same time), or, with a profile, is predicted 2% faster. */
static int room_better(arena_engine *e, const arena_residency_plan *t)
{
	double now_t = engine_predict(e);
	int more = t->resident_bytes > e->plan.resident_bytes;
	if (!(now_t > 0) || !(t->step_s > 0))
		return more;
	return (more && t->step_s <= now_t * 1.005) || t->step_s < now_t * 0.98;
}

/* Take t's schedule and ring shape into the engine's plan (t gets the old
 * arrays, released with it); the caller refreshes. */
static void take_sched(arena_engine *e, arena_residency_plan *t)
{
	uint32_t *sc = e->plan.sched;
	uint8_t *bw = e->plan.bwd;
	size_t n = e->plan.n_sched;
	e->plan.sched = t->sched;
	e->plan.bwd = t->bwd;
	e->plan.n_sched = t->n_sched;
	t->sched = sc;
	t->bwd = bw;
	t->n_sched = n;
	e->plan.slots = t->slots;
	e->plan.depth = t->depth;
}

/* The options the plan depends on changed: the next adapt() plans anew. */
static void plan_changed(arena_engine *e)
{
	e->plan_gen++;
}

/* arena_residency_plan_make, counted. */
static int make_plan(arena_engine *e, uint64_t budget, arena_residency_plan *t)
{
	e->plans_made++;
	const double t0 = arena_now_s();
	int rc = arena_residency_plan_make(e->l, &e->o, budget, t);
	e->rec.plan_s += arena_now_s() - t0;
	return rc;
}

/* Keep t as the memo for `budget` (an allocation failure only loses the memo). */
static void memo_keep(arena_engine *e, const arena_residency_plan *t, uint64_t budget)
{
	arena_residency_plan_release(&e->memo);
	e->memo_ok = 0;
	if (arena_residency_plan_copy(t, &e->memo)) {
		arena_error_clear();
		return;
	}
	e->memo_budget = budget;
	e->memo_gen = e->plan_gen;
	e->memo_age = 0;
	e->memo_ok = 1;
}

/* Does plan t, made for budget `made`, hold for `budget`? Room less than its
 * smallest streamed block makes no block resident; a budget that holds every
 * block does (the ring goes too); less than t needs does not, except that
 * over budget the smallest plan holds for the budget it was made for. */
static int plan_holds(const arena_engine *e, const arena_residency_plan *t, uint64_t made, uint64_t budget)
{
	uint64_t slack = UINT64_MAX;
	for (size_t i = 0; i < t->n_sched; i++) {
		uint32_t b = t->sched[i];
		if (!t->resident[b] && e->l->blocks[b].bytes < slack)
			slack = e->l->blocks[b].bytes;
	}
	if (budget < t->need_bytes && budget != made)
		return 0;
	if (budget > made + (slack == UINT64_MAX ? 0 : slack))
		return 0;
	return !t->n_streamed || budget < e->all_bytes;
}

/* The plan for the budget now under e->o: the weights budget and the plan
 * (the smallest one when none fits, unless strict). With `memo`, the last
 * plan made this way when it still holds (see struct arena_engine). */
static int plan_now(arena_engine *e, uint64_t used, uint64_t *budget, uint64_t *free_out, arena_residency_plan *t,
		    int memo)
{
	arena_backend *be = e->be;
	uint64_t free_b, total, h, w;
	int rc = be->ops->mem_info(be, &free_b, &total);
	if (rc)
		return rc;
	arena_residency_budget(total, free_b + used + wire_stage_bytes(e) + own_rounding(e->m, e), &e->o, budget, &h, &w);
	if (e->o.cap && e->rest > w) { /* the rest of the process past its reserve comes out of ours */
		uint64_t over = e->rest - w;
		*budget = *budget > over ? *budget - over : 0;
	}
	if (e->wstage) { /* the coded copies' stages stay */
		uint64_t st = wire_stage_bytes(e) + gran_loss(be, wire_stage_bytes(e));
		*budget = *budget > st ? *budget - st : 0;
	}
	*free_out = free_b;
	if (memo && e->memo_ok && e->memo_gen == e->plan_gen && e->memo_age < ENGINE_MEMO_STEPS &&
	    plan_holds(e, &e->memo, e->memo_budget, *budget)) {
		if ((rc = arena_residency_plan_copy(&e->memo, t)) == 0)
			e->memo_age++;
		return rc;
	}
	rc = make_plan(e, *budget, t);
	if (rc == ARENA_E(BUDGET)) {
		if (e->o.strict) {
			char why[512];
			snprintf(why, sizeof(why), "%s", arena_last_error());
			return arena_errorf(ARENA_E(BUDGET), "engine: the budget for weights fell to %s (%s free): %s",
					    arena__fmtb(*budget), arena__fmtb(free_b), why);
		}
		arena_error_clear();
		rc = make_plan(e, t->min_need_bytes, t); /* the smallest plan */
	}
	if (!rc && memo)
		memo_keep(e, t, *budget);
	return rc;
}

/* Device memory the engine would use with resident set `res` (dev_used's
 * measure, the ring's slot the largest streamed block); its slot to *slot
 * (0 when nothing streams: the rest is the resident bytes). */
static uint64_t set_used(const arena_engine *e, const uint8_t *res, uint64_t min_slot, uint64_t *slot)
{
	uint64_t rb = 0, sl = 0;
	size_t ns = 0;
	for (uint32_t b = 0; b < e->l->n_blocks; b++) {
		uint64_t sz = e->l->blocks[b].bytes;
		if (arena_block_is_globals(e->l, b) || res[b]) {
			rb += sz;
		} else {
			ns++;
			sl = sz > sl ? sz : sl;
		}
	}
	sl = ns && sl < min_slot ? min_slot : ns ? sl : 0;
	*slot = sl;
	return rb + (uint64_t)(ns ? e->n_slots : 0) * sl;
}

/* The resident set to move to for plan t (made anew for `budget`): the
 * nearest to the set resident now, when it is as good as t's. Planned anew
 * at another budget, the planner can pick another set of about the same
 * bytes (its spread over the schedule shifts), and moving to it swaps
 * blocks both ways, each move a copy and, with release_host, a read from
 * the image (the H200, session 12: 1.8 GiB less swapped 65 pieces out and
 * 67 in where about 28 out would have done, a step of 1.71 s against 0.31
 * s). Over the budget (`grow` 0) it only demotes, until the set fits: among
 * blocks t streams first, the smallest whose demotion (its bytes less the
 * ring's growth) is enough, else the one saving most. With room (`grow` 1)
 * it only promotes blocks t keeps, in t's order, while the set fits. As
 * good: by bytes, resident within one ring slot of t's; with a profile,
 * predicted within 1 % of t's step. Returns e->near, or t's set. */
static const uint8_t *near_set(arena_engine *e, const arena_residency_plan *t, uint64_t budget, int grow)
{
	const arena_layout *l = e->l;
	uint8_t *w = e->near;
	uint64_t slot, used;
	memcpy(w, e->plan.resident, l->n_blocks);
	while (!grow && (used = set_used(e, w, t->min_slot, &slot)) > budget) {
		const uint64_t excess = used - budget;
		int64_t pick = -1, pick_sv = 0;
		int pick_key = 0; /* 4: t streams it, 2: enough; then the smallest enough, or the largest saving */
		for (uint32_t b = 0; b < l->n_blocks; b++) {
			if (!w[b] || !demotable(e, b))
				continue;
			int64_t sv = saving_at(e, b, slot);
			if (sv <= 0)
				continue;
			int key = (t->resident[b] ? 0 : 4) + ((uint64_t)sv >= excess ? 2 : 0);
			if (pick < 0 || key > pick_key || (key == pick_key && ((key & 2) ? sv < pick_sv : sv > pick_sv)))
				pick = b, pick_sv = sv, pick_key = key;
		}
		if (pick < 0)
			return t->resident; /* nothing left that helps: t's set */
		w[pick] = 0;
	}
	for (size_t i = 0; grow && i < t->n_sched + l->n_blocks; i++) { /* t's order, then the blocks it does not name */
		uint32_t c = i < t->n_sched ? t->sched[i] : (uint32_t)(i - t->n_sched);
		if (w[c] || !t->resident[c] || arena_block_is_globals(l, c))
			continue;
		w[c] = 1;
		if (set_used(e, w, t->min_slot, &slot) > budget)
			w[c] = 0;
	}
	if (arena__have_profile(&e->o) && t->step_s > 0) {
		double mine = arena__timed_run(l, &e->o, e->plan.sched, e->plan.bwd, e->plan.n_sched, w, e->plan.slots,
					       &e->tscr);
		if (mine > 0 && (mine <= t->step_s * 1.01 || !move_pays(e, t->resident, w, mine - t->step_s)))
			return w;
		return t->resident;
	}
	const uint64_t rb = set_used(e, w, t->min_slot, &slot) - (uint64_t)e->n_slots * slot; /* resident bytes */
	return rb + t->slot_bytes >= t->resident_bytes ? w : t->resident;
}

/* Between steps: re-read free memory; under pressure move to the plan for
 * the new budget at once (to the nearest set as good as its own, near_set),
 * with room after `hysteresis` steps of it. With a
 * new schedule (learned), the plan takes it and keeps its resident blocks
 * unless they no longer fit. */
static int adapt(arena_engine *e, int new_sched)
{
	uint64_t free_b, budget;
	arena_residency_plan t;
	uint64_t used = dev_used(e);
	int rc = plan_now(e, used, &budget, &free_b, &t, 1);
	if (rc)
		return rc;
	e->rec.budget = budget;
	e->rec.free_bytes = free_b;
	if (new_sched) {
		take_sched(e, &t);
		refresh(e);
	}
	unsigned hyst = e->o.hysteresis ? e->o.hysteresis : ARENA_ENGINE_DEFAULT_HYSTERESIS;
	if (used > budget) {
		e->room_steps = 0;
		rc = apply(e, near_set(e, &t, budget, 0));
	} else if (room_better(e, &t)) {
		if (++e->room_steps >= hyst) {
			e->room_steps = 0;
			rc = apply(e, near_set(e, &t, budget, 1));
		}
	} else {
		e->room_steps = 0;
	}
	arena_residency_plan_release(&t);
	if (!rc && dev_used(e) > budget) {
		e->rec.over_budget = 1;
		if (e->o.strict)
			rc = arena_errorf(ARENA_E(BUDGET),
					  "engine: %s of device memory needed, over the budget of %s (%s free), and "
					  "nothing left to demote",
					  arena__fmtb(dev_used(e)), arena__fmtb(budget), arena__fmtb(free_b));
	}
	return rc;
}

/* The learned copy rate: the median of the last copies timed (one copy held
 * up by something else does not move it); 0 before any. */
static double learned_h2d(const arena_engine *e)
{
	unsigned n = e->lc_n < 64 ? e->lc_n : 64;
	double v[64];
	if (!n)
		return 0;
	memcpy(v, e->lc_rate, n * sizeof(*v));
	for (unsigned i = 1; i < n; i++) /* insertion sort: 64 at most */
		for (unsigned j = i; j > 0 && v[j - 1] > v[j]; j--) {
			double t = v[j];
			v[j] = v[j - 1];
			v[j - 1] = t;
		}
	return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void *look_thread(void *arg)
{
	struct look *k = arg;
	const double t0 = arena_now_s();
	k->rc = arena_residency_plan_make(k->l, &k->o, k->budget, &k->t);
	k->took_s = arena_now_s() - t0;
	if (k->rc)
		snprintf(k->msg, sizeof(k->msg), "%s", arena_last_error());
	return NULL;
}

/* Wait for the look's plan, if one is being made. */
static void look_join(struct look *k)
{
	if (k->threaded)
		pthread_join(k->th, NULL);
	k->threaded = 0;
}

/* Wait for it and drop it. */
static void look_free(struct look *k)
{
	look_join(k);
	arena_residency_plan_release(&k->t);
	arena_free(k->prof);
	arena_free(k->moved);
	arena_free(k->sched);
	*k = (struct look){0};
}

/* Start a look (learn()): plan for this step's budget with the profile
 * learned so far, from copies of it, on a thread (in place when none can
 * start). */
static int look_start(arena_engine *e, double need)
{
	struct look *k = &e->look;
	const size_t n = e->l->n_blocks;
	look_free(k); /* (one is taken before another starts: nothing to drop) */
	*k = (struct look){.l = e->l, .o = e->o, .budget = e->rec.budget, .need = need, .gen = e->plan_gen};
	k->prof = arena_malloc((n ? 4 * n : 1) * sizeof(*k->prof));
	k->moved = e->o.moved ? arena_malloc((n ? n : 1) * sizeof(*k->moved)) : NULL;
	k->sched = e->o.sched && e->o.n_sched ? arena_malloc(e->o.n_sched * sizeof(*k->sched)) : NULL;
	if (!k->prof || (e->o.moved && !k->moved) || (e->o.sched && e->o.n_sched && !k->sched)) {
		look_free(k);
		return arena_errorf(ARENA_E_NOMEM, "engine: out of memory for a look at the learned profile");
	}
	const double *from[4] = {e->lcost, e->lhold, e->lbcost, e->lbhold};
	for (int j = 0; j < 4; j++)
		memcpy(k->prof + j * n, from[j], n * sizeof(*k->prof));
	if (k->moved)
		memcpy(k->moved, e->o.moved, n * sizeof(*k->moved));
	if (k->sched)
		memcpy(k->sched, e->o.sched, e->o.n_sched * sizeof(*k->sched));
	k->o.cost = k->prof;
	k->o.hold = k->prof + n;
	k->o.bcost = k->prof + 2 * n; /* < 0 where not timed yet: the factor */
	k->o.bhold = k->prof + 3 * n;
	k->o.moved = k->moved;
	k->o.sched = k->sched;
	k->o.h2d_bytes_per_s = learned_h2d(e);
	k->o.backward_factor = e->lfwd_sum > 0 ? e->lbwd_sum / e->lfwd_sum : 0;
	k->on = 1;
	e->plans_made++;
	if (pthread_create(&k->th, NULL, look_thread, k) == 0) {
		k->threaded = 1;
	} else {
		const double t0 = arena_now_s();
		look_thread(k);
		e->rec.plan_s += arena_now_s() - t0;
	}
	return 0;
}

/* Take the look learn() started (step_end, the step after): wait for its
 * plan (that wait counted as planning), put the learned profile in the
 * options, keep the plan as the memo for the next step's adapt, and move to
 * it if it is predicted `need` faster than the plan now, as a look made in
 * place would. A look whose options changed meanwhile (the mode, a new
 * schedule: plan_gen) is dropped. */
static int look_take(arena_engine *e)
{
	struct look *k = &e->look;
	if (!k->on)
		return 0;
	const double t0 = arena_now_s();
	look_join(k);
	e->rec.plan_s += arena_now_s() - t0;
	if (k->gen != e->plan_gen) {
		look_free(k);
		return 0;
	}
	e->rec.looked = 1;
	e->rec.look_s = k->took_s;
	e->o.cost = e->lcost;
	e->o.hold = e->lhold;
	e->o.bcost = e->lbcost;
	e->o.bhold = e->lbhold;
	e->o.h2d_bytes_per_s = k->o.h2d_bytes_per_s;
	e->o.backward_factor = k->o.backward_factor;
	plan_changed(e);
	int rc = k->rc;
	if (rc) { /* BUDGET: adapt keeps the smallest plan, so do we */
		rc = rc == ARENA_E(BUDGET) ? 0 : arena_errorf(rc, "%s", k->msg);
		look_free(k);
		return rc;
	}
	if (!plan_holds(e, &k->t, k->budget, e->rec.budget)) { /* the budget moved on: the next adapt plans by the profile */
		look_free(k);
		return 0;
	}
	arena_residency_plan t = k->t;
	const double need = k->need;
	const uint64_t budget = k->budget;
	k->t = (arena_residency_plan){0}; /* ours now */
	look_free(k);
	double now_t = engine_predict(e);
	memo_keep(e, &t, budget); /* the next step's adapt plans for the same budget: it takes this one */
	if (now_t > 0 && t.step_s > 0 && t.step_s < now_t * need && move_pays(e, t.resident, NULL, now_t - t.step_s)) {
		e->rec.profile_learned = 1;
		e->room_steps = 0;
		rc = apply(e, t.resident);
	} else if (now_t > 0) {
		e->plan.step_s = now_t; /* the plan stays; the profile predicts it now */
	}
	arena_residency_plan_release(&t);
	return rc;
}

/* Without a given profile: once every scheduled block has been timed and a
 * copy seen, plan by the learned profile and move to that plan if it is
 * predicted 2% faster; later replans under pressure use it too. The first
 * steps' times are not the steady ones (a caller's first step warms up its
 * kernels, the copies stall until the plan settles), and the profile keeps
 * learning: it is asked again 2 steps later, then at twice the step count
 * each time, and a later look moves for 4% (the adapter's coded 8 GiB
 * step: the first look kept the plan, the steady profile predicted one 9%
 * faster; on the H200 the step went from 0.262 to 0.252 s). A look is
 * planned on a thread (look_start) and taken at the next step_end
 * (look_take; a look whose plan no longer holds for the budget, which has
 * moved since, is not moved to: the profile is taken, the next step end
 * plans by it). */
static int learn(arena_engine *e)
{
	if (!e->timed || e->cost || e->o.no_learn || !e->plan.n_streamed || !e->lc_n ||
	    (e->profile_learned && e->steps < e->relearn_at))
		return 0;
	for (size_t i = 0; i < e->plan.n_sched; i++)
		if (e->lcost[e->plan.sched[i]] < 0)
			return 0;
	const double need = e->profile_learned ? 0.96 : 0.98; /* a move is a slow step: later, 4 % */
	e->relearn_at = e->profile_learned ? 2 * e->steps : e->steps + 2;
	e->profile_learned = 1;
	return look_start(e, need);
}

/* A trace's memory counters now, and what the device has timed so far. */
static int trace_memory(arena_engine *e)
{
	uint64_t free_b = 0, total = 0;
	int rc = e->be->ops->mem_info(e->be, &free_b, &total);
	if (rc)
		return rc;
	arena_trace_counter(e->tr, e->plan.resident_bytes, e->ring_dptr ? (uint64_t)e->n_slots * e->slot_bytes : 0,
			    free_b);
	return arena_trace_poll(e->tr);
}

int arena_engine_step_end(arena_engine *e)
{
	int rc;
	if (e->state == ST_FAILED)
		return e->failed_rc;
	if (e->state != ST_STEP)
		return arena_errorf(ARENA_E_USAGE, "engine: step_end outside a step");
	if (e->n_held)
		return arena_errorf(ARENA_E_USAGE, "engine: step_end with %zu streamed blocks still acquired", e->n_held);
	const double t_end = arena_now_s();
	for (uint32_t b = 0; b < e->l->n_blocks; b++)
		if (e->res_held[b])
			return arena_errorf(ARENA_E_USAGE, "engine: step_end with block '%s' still acquired",
					    e->l->blocks[b].name);
	if (e->tr)
		arena_trace_instant(e->tr, ARENA_TRACE_STEP_END, 0, e->steps, 0);
	/* The order the caller ran: the schedule from the next step on, unless it
	 * is the schedule, or a part of it cut short. */
	int md = e->o.mode == ARENA_MODE_TRAIN, learned = 0;
	const uint32_t *ps = e->plan.sched;
	size_t pn = e->plan.n_sched, no = e->n_obs;
	int prefix = no <= pn && (!no || !memcmp(e->obs, ps, no * sizeof(*ps)));
	e->rec.stopped_early = prefix && no < pn;
	if (!prefix && !e->obs_over && !e->o.fixed_schedule) {
		memcpy(e->msched[md], e->obs, no * sizeof(*e->obs));
		e->mn[md] = no;
		e->o.sched = e->msched[md];
		e->o.n_sched = no;
		e->rec.schedule_learned = learned = 1;
		e->ahead = SIZE_MAX; /* the order just seen: prefetch as far as the ring goes */
		plan_changed(e);
	}
	e->n_obs = 0;
	e->obs_over = 0;
	/* What this step did not use goes; what was fetched for the next step
	 * stays its first entries, unless the schedule changes or the ring is
	 * made anew (prefetch sees the epoch). */
	size_t carry = e->fetched > e->n_seq ? e->fetched - e->n_seq : 0;
	e->fetched = e->fetched < e->n_seq ? e->fetched : e->n_seq;
	drop_ahead(e);
	e->cur = e->fetched = 0;
	if (carry && learned) {
		for (size_t j = 0; j < carry && e->fetch_epoch == e->ring_epoch; j++)
			e->ring.pending[e->seq[j]]--;
		carry = 0;
	}
	e->fetched = carry;
	rc = release_hosts(e);
	if (!rc)
		rc = adapt(e, learned);
	if (!rc)
		rc = time_gap(e);
	/* What the device has timed so far, before learning from it (the step
	 * before this one is done in a caller that waits for its steps). */
	if (!rc && e->timed && e->steps) /* the previous step's record is in the history */
		rc = harvest(e, (unsigned)((e->steps - 1) & 1));
	if (!rc && e->timed)
		rc = harvest_copies(e);
	if (!rc)
		rc = look_take(e);
	if (!rc)
		rc = learn(e);
	e->rec.step = e->steps;
	e->rec.resident_bytes = e->plan.resident_bytes;
	e->rec.slot_bytes = e->plan.n_streamed ? e->plan.slot_bytes : 0;
	e->rec.slots = e->plan.n_streamed ? e->n_slots : 0;
	e->hist[e->steps % ARENA_ENGINE_HISTORY] = e->rec;
	e->steps++;
	memset(&e->rec, 0, sizeof(e->rec));
	e->rec.streamed_bytes = e->next_bytes; /* fetched during the step just ended */
	e->rec.moved_bytes = e->next_moved;
	e->rec.copies = e->next_copies;
	e->next_bytes = e->next_copies = e->next_moved = 0;
	e->state = ST_IDLE;
	if (!rc)
		rc = arena_engine_collect(e);
	if (!rc && e->tr)
		rc = trace_memory(e);
	if (rc)
		return fail_engine(e, rc);
	/* The next step's first copies run behind this step's last compute. */
	e->begun = 1;
	rc = prefetch(e);
	e->hist[(e->steps - 1) % ARENA_ENGINE_HISTORY].end_s = arena_now_s() - t_end;
	return fail_engine(e, rc);
}

int arena_engine_trace_begin(arena_engine *e, const char *path, const char *label, size_t max_records)
{
	if (e->state == ST_FAILED)
		return e->failed_rc;
	if (e->state != ST_IDLE)
		return arena_errorf(ARENA_E_USAGE, "%s: a trace starts between steps (end the step first)", path);
	if (e->tr)
		return arena_errorf(ARENA_E_USAGE, "%s: a trace is being recorded already (end it first)", path);
	int rc = arena_trace_open(e->be, e->l, path, label, max_records, &e->tr);
	if (!rc && (rc = trace_memory(e))) {
		arena_trace_close(e->tr, 0);
		e->tr = NULL;
	}
	return rc;
}

int arena_engine_trace_end(arena_engine *e)
{
	if (!e->tr)
		return arena_errorf(ARENA_E_USAGE, "engine: no trace is being recorded");
	if (e->state == ST_STEP)
		return arena_errorf(ARENA_E_USAGE, "engine: a trace ends between steps (end the step first)");
	arena_trace *t = e->tr;
	e->tr = NULL;
	if (e->state == ST_FAILED) { /* the device's times may be lost with it: nothing is written */
		arena_trace_close(t, 0);
		return e->failed_rc;
	}
	return arena_trace_close(t, 1);
}

int arena_engine_tracing(const arena_engine *e)
{
	return e->tr != NULL;
}

int arena_engine_set_mode(arena_engine *e, int mode)
{
	int rc;
	if (e->state == ST_FAILED)
		return e->failed_rc;
	if (e->state != ST_IDLE)
		return arena_errorf(ARENA_E_USAGE, "engine: set_mode inside a step (end the step first)");
	if (mode != ARENA_MODE_SAMPLE && mode != ARENA_MODE_TRAIN)
		return arena_errorf(ARENA_E_USAGE, "engine: mode %d is neither sample nor train", mode);
	if (mode == e->o.mode)
		return 0;
	if (e->tr)
		arena_trace_instant(e->tr, ARENA_TRACE_MODE, 0, e->steps, (uint64_t)mode);
	/* The copies issued for the next step in the old mode are forgotten. */
	e->cur = 0;
	drop_ahead(e);
	e->begun = 0;
	uint64_t used = dev_used(e), budget, free_b;
	int md = mode == ARENA_MODE_TRAIN;
	arena_engine_opts old = e->o;
	e->o.mode = mode;
	e->o.sched = e->mn[md] ? e->msched[md] : NULL;
	e->o.n_sched = e->mn[md];
	e->ahead = SIZE_MAX;
	arena_residency_plan t;
	plan_changed(e);
	if ((rc = plan_now(e, used, &budget, &free_b, &t, 0))) {
		e->o = old;
		return rc == ARENA_E_USAGE ? rc : fail_engine(e, rc);
	}
	e->n_slots = arena__ring_slots(&e->o);
	take_sched(e, &t);
	refresh(e); /* the resident blocks as they are, with the new schedule and ring */
	if (e->plan.need_bytes > budget)
		rc = apply(e, t.resident);
	else
		rc = fit_ring(e);
	if (!rc)
		refresh(e);
	arena_residency_plan_release(&t);
	e->room_steps = 0;
	return fail_engine(e, rc);
}

int arena_engine_set_profile(arena_engine *e, const double *cost, double h2d_bytes_per_s, double backward_factor)
{
	size_t n = e->l->n_blocks;
	if (e->state == ST_FAILED)
		return e->failed_rc;
	if (e->state != ST_IDLE)
		return arena_errorf(ARENA_E_USAGE, "engine: set_profile inside a step (end the step first)");
	if (!(h2d_bytes_per_s > 0 && h2d_bytes_per_s < 1e15) || !(backward_factor >= 0 && backward_factor < 1e6))
		return arena_errorf(ARENA_E_USAGE, "engine: a profile's rate must be > 0 and its backward factor >= 0, finite");
	for (size_t b = 0; b < n; b++)
		if (!(cost[b] >= 0 && cost[b] < 1e9))
			return arena_errorf(ARENA_E_USAGE, "engine: the cost of block '%s' is not a finite number >= 0",
					    e->l->blocks[b].name);
	if (!e->cost && !(e->cost = arena_calloc(n ? n : 1, sizeof(*e->cost))))
		return arena_errorf(ARENA_E_NOMEM, "engine: out of memory");
	memcpy(e->cost, cost, n * sizeof(*cost));
	e->o.cost = e->cost;
	e->o.hold = NULL;
	e->o.bcost = e->o.bhold = NULL;
	e->o.h2d_bytes_per_s = h2d_bytes_per_s;
	e->o.backward_factor = backward_factor;
	e->profile_learned = 1; /* nothing more to learn */
	uint64_t budget, free_b;
	arena_residency_plan t;
	plan_changed(e);
	int rc = plan_now(e, dev_used(e), &budget, &free_b, &t, 0);
	if (rc)
		return rc == ARENA_E_USAGE ? rc : fail_engine(e, rc);
	/* Move to the plan the profile prefers, now (the caller asked for it). */
	e->cur = 0;
	drop_ahead(e);
	e->begun = 0;
	rc = apply(e, t.resident);
	arena_residency_plan_release(&t);
	return fail_engine(e, rc);
}

void arena_engine_set_rest(arena_engine *e, uint64_t bytes)
{
	e->rest = bytes;
}

int arena_engine_mode(const arena_engine *e)
{
	return e->o.mode;
}

int arena_engine_collect(arena_engine *e)
{
	int rc = 0;
	if (e->timed && e->state != ST_STEP) {
		for (unsigned par = 0; par < 2 && !rc; par++)
			rc = harvest(e, par);
		if (!rc)
			rc = harvest_copies(e);
	}
	return rc;
}

int arena_engine_profile(const arena_engine *e, double *cost, double *h2d, double *bwd)
{
	size_t n = e->l->n_blocks;
	if (e->cost) { /* given */
		memcpy(cost, e->cost, n * sizeof(*cost));
		*h2d = e->o.h2d_bytes_per_s;
		*bwd = e->o.backward_factor;
		return 0;
	}
	if (!e->lcost)
		return arena_errorf(ARENA_E_NOT_FOUND, "engine: no profile (none given, and %s cannot time)",
				    e->be->ops->name);
	for (size_t i = 0; i < e->plan.n_sched; i++)
		if (e->lcost[e->plan.sched[i]] < 0)
			return arena_errorf(ARENA_E_NOT_FOUND, "engine: block '%s' not timed yet",
					    e->l->blocks[e->plan.sched[i]].name);
	for (size_t b = 0; b < n; b++)
		cost[b] = e->lcost[b] < 0 ? 0 : e->lcost[b];
	*h2d = learned_h2d(e);
	*bwd = e->lfwd_sum > 0 ? e->lbwd_sum / e->lfwd_sum : 0;
	return 0;
}

int arena_engine_backward_costs(const arena_engine *e, double *bcost)
{
	if (e->cost || !e->lbcost)
		return arena_errorf(ARENA_E_NOT_FOUND, "engine: no learned backward costs (%s)",
				    e->cost ? "a profile was given" : "the backend cannot time");
	memcpy(bcost, e->lbcost, e->l->n_blocks * sizeof(*bcost));
	return 0;
}

const arena_residency_plan *arena_engine_plan(const arena_engine *e)
{
	return &e->plan;
}

int arena_engine_step_record(const arena_engine *e, uint64_t step, arena_engine_step *out)
{
	if (step >= e->steps || e->steps - step > ARENA_ENGINE_HISTORY)
		return arena_errorf(ARENA_E_NOT_FOUND, "engine: no record of step %" PRIu64, step);
	*out = e->hist[step % ARENA_ENGINE_HISTORY];
	return 0;
}

double arena_engine_step_gap(const arena_engine *e)
{
	return e->o.step_gap_s;
}

uint64_t arena_engine_plans_made(const arena_engine *e)
{
	return e->plans_made;
}

int arena_engine_looking(const arena_engine *e)
{
	return e->look.on;
}

uint64_t arena_engine_steps(const arena_engine *e)
{
	return e->steps;
}

int arena_engine_is_resident(const arena_engine *e, uint32_t block)
{
	return block < e->l->n_blocks && e->plan.resident[block];
}

arena_stream *arena_engine_copy_stream(const arena_engine *e)
{
	return e->cs;
}
