/* engine_int.h - what the parts of the prefetch engine share: its state
 * (struct arena_engine) and the functions one part calls in another. Not
 * installed. engine.h says what the engine does, its state machine and its
 * invariants; each part's own invariants are at its top.
 *
 * The parts, each of which includes this header and calls the others only
 * through what it declares:
 *   engine.c        create and free; the step and the ring: step_begin,
 *                   acquire, release, step_end, prefetch; traces
 *   engine_copy.c   a block's copy to the device: from a host slab, from a
 *                   host copy held coded (device stages, decoded there), or
 *                   from the image (the disk tier)
 *   engine_disk.c   the disk tier: blocks read from their image by the
 *                   stager ahead of their copies; the host budget's edge
 *   engine_moves.c  moves between resident and streamed: demote, promote,
 *                   the set a move goes to, what it costs, whether it pays
 *   engine_plan.c   between steps: the budget, the plan for it (kept while
 *                   it holds), adapt; the mode, profile and rest the caller
 *                   sets
 *   engine_learn.c  learning: device timing, the compute profile and step
 *                   gap learned from it, looks at that profile planned on a
 *                   thread, the order the caller runs
 *   engine_decide.c the record of decisions: one per change of the plan,
 *                   what moved and why
 * The planner they run is pure (residency.c, residency_timed.c:
 * residency_int.h). */
#ifndef ARENA_ENGINE_INT_H
#define ARENA_ENGINE_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "../formats/wire.h"
#include "engine.h"
#include "residency_int.h"
#include "stager.h"
#include "trace.h"

enum { ST_IDLE, ST_STEP, ST_FAILED };
enum { ENGINE_REST_WORKS = 16, ENGINE_COPY_PAIRS = 32, ENGINE_MEMO_STEPS = 64, ENGINE_WIRE_STAGES = ARENA_WIRE_STAGES, ENGINE_WIRE_RUN = 16 };

struct arena_engine {
	/* --- engine.c: the model, the plan, the step and the ring ------------------ */
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
	arena__timed tscr; /* for arena__engine_predict */
	struct hold {
		uint32_t block;
		size_t j; /* its entry in seq, or SIZE_MAX: fetched on its own */
	} *held;           /* streamed blocks acquired and not released, oldest first */
	size_t n_held, max_held;
	/* per block */
	arena_event **ev_use;  /* its last release (resident or in the ring) */
	arena_event **ev_fill; /* the copy that put it where it is */
	unsigned *res_held;
	/* records */
	arena_engine_step rec;
	arena_engine_step *hist;
	uint64_t steps;
	int begun; /* first copies of the coming step issued */
	arena_trace *tr; /* a trace being recorded, or NULL */
	/* --- engine_copy.c: coded copies ------------------------------------------- */
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
	/* --- engine_disk.c: the disk tier ------------------------------------------ */
	/* The disk tier: a block with neither a device nor a host copy is read
	 * from its image (o->reread: its chunks checked) by the stager, ahead
	 * of its copy, in parts of disk_part() (a coded block in parts of whole
	 * regions as large) into staging slots (stager.h); made at the first
	 * such copy. */
	arena_stager *stg;
	arena_wire **disk_plans; /* per block, arena__engine_disk_coded when the stager was made (or NULL) */
	/* --- engine_moves.c: moves between resident and streamed ------------------ */
	uint8_t *near;   /* near_set's resident set (and switch_set's) */
	uint8_t *named;  /* switch_set's: the blocks the new schedule names */
	/* Per block: a schedule change moved it (switch_set): its host copy is
	 * kept (release_hosts), for the next change that moves it back. */
	uint8_t *switched;
	/* A look's move under way over step ends (pace_next): the set it goes
	 * to; the bytes a step end demotes toward it; the ring slot its plan
	 * needs; the plan_gen it holds under (a mode, schedule or profile set
	 * since ends it, as do moves adapt makes). pace_on 0: none. */
	uint8_t *pace;
	int pace_on;
	uint64_t pace_bytes, pace_slot, pace_gen;
	/* moves timed against move_cost_raw's estimate (apply): their ratio,
	 * averaged, scales the next estimates (1 until a move estimated at over
	 * a millisecond has been timed) */
	double move_scale;
	unsigned moves_timed;
	/* --- engine_plan.c: the budget and the plan -------------------------------- */
	uint64_t all_bytes; /* every block's bytes: a budget that holds them holds the model */
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
	/* The rest of the process (torch's allocator) and the rest of its
	 * memory (include/arena.h, "The process's device memory"). What the
	 * rest holds now is e->o.rest (the caller's last report) and `other`
	 * e->o.other (read at each budget: the process's figure less the
	 * engine's allocations and the rest's). With learn_rest, the most the
	 * rest held in a step is kept per (mode, work): e->o.reserve is then
	 * what the next step's work needs (its peak and a margin), or
	 * ARENA_ENGINE_REST_UNKNOWN for a work not seen (the safe plan).
	 *   1. rest_peak >= every `now` and `peak` reported since the last
	 *      step end; it is learned at the step end under the step's mode
	 *      and `work`, then `work` becomes `next_work`.
	 *   2. works[0, n_works) hold distinct (mode, key) pairs; past
	 *      ENGINE_REST_WORKS the least recently used one goes. */
	uint64_t rest_peak;
	int rest_reported;
	uint64_t work, next_work;
	struct engine_work {
		uint64_t key, peak, used;
		int mode;
	} works[ENGINE_REST_WORKS];
	unsigned n_works;
	uint64_t work_clock;
	uint64_t reserve_given; /* o.reserve as opened (ARENA_ENGINE_AUTO or bytes) */
	int other_measured;     /* o.other read from the backend's proc_mem (0: estimated) */
	int room_now;           /* the rest needs less than planned: promote at the next adapt */
	/* --- engine_learn.c: timing, the profile, looks, the order run ------------- */
	double *cost;    /* the engine's copy of a given o->cost (o.cost points at it); NULL: none given */
	/* device timing (be can time): per step parity, block, occurrence (2:
	 * forward, backward) the events ready (before the wait), start, end */
	int timed;
	int profile_learned; /* the learned profile was looked at (o.cost is it once that look is taken) */
	uint64_t relearn_at; /* the step at which learn() looks at the learned profile again */
	arena_event **tm;     /* TM_EV a slot: ready, start, end (release), next (the next acquire) */
	uint8_t *tm_rec;      /* same index without the event: 1 acquired, 3 released */
	size_t *tm_nx;        /* same index: the event (index into tm) of the next acquire, SIZE_MAX none:
			       * that acquire's own ready event when it is timed, else this slot's 4th */
	size_t tm_prev;       /* the slot of this step's last timed acquire (SIZE_MAX: none) */
	uint64_t tm_step[2];  /* the step each parity holds */
	int tm_mode[2];       /* and the mode it ran in */
	uint8_t tm_settling[2]; /* and whether it began right after a move (its times are not learned) */
	int moved_end;        /* blocks moved since the last step began */
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
	/* what the caller did this step: the scheduled blocks acquired, in order */
	uint32_t *obs;
	size_t n_obs;
	int obs_over; /* more than max_sched acquires: not learned from */
	/* per mode: the schedule learned in it (NULL: the mode's default) */
	uint32_t *msched[2];
	size_t mn[2];
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
		uint64_t gran; /* the backend's alloc_granularity (arena_residency_plan_rounded) */
		double need;
		arena_residency_plan t; /* its plan (zero until made, and once taken) */
		double took_s;          /* the thread's seconds making it */
		int rc;
		char msg[1024];
		/* Read ahead: once its plan is made, the thread reads the host
		 * copies of the blocks that plan demotes which have none (resident
		 * blocks loaded straight to the device, or whose host copy went
		 * back: release_host), so that a move to it copies and reads
		 * nothing more on the caller's thread. prep[b]: b may be read
		 * ahead (resident, no host copy, raw, not globals: set at the
		 * start); pre[b]: its slab once read (pinned: pre_pin[b]), until
		 * taken (host_adopt) or dropped with the look. Within pre_room
		 * bytes (the host budget's room at the start). */
		uint8_t *prep, *pre_pin;
		uint8_t **pre;
		uint64_t pre_room;
		/* The plan in force at the start (its schedule, backward marks,
		 * resident set, slots): the thread predicts it by the look's
		 * profile and reads ahead only for a plan that look_take will
		 * find faster (need); a look dropped stops reading (stop). */
		uint32_t *now_sched;
		uint8_t *now_bwd, *now_res;
		size_t now_n;
		unsigned now_slots;
		_Atomic int stop;
		/* The thread has planned (`planned`), and is done (`done`): a take
		 * that finds it still reading ahead leaves it to the next step end
		 * (at most LOOK_DEFER of them, `deferred`) rather than wait. */
		_Atomic int planned, done;
		unsigned deferred;
		arena_reread_fn reread;
		void *reread_ctx;
		arena_backend *be;
		arena_pin_budget *pins;
	} look;
	/* release_host's unpinning and unmapping, on a thread of its own
	 * during the step after (cudaHostUnregister and munmap of the host
	 * copies a move's promotions let go took 0.05-0.08 s of an H100's
	 * step end): drops[0..n_drops) its work; joined at the next
	 * release_hosts and at arena_engine_free. */
	struct reaper {
		pthread_t th;
		int running;
		arena_host_drop *drops;
		size_t n_drops;
		arena_pin_budget *pins;
		arena_backend *be;
	} reap;
	/* --- engine_decide.c: the record of decisions ------------------------------ */
	/* Moves counted as they are made (demote, promote): a decision is the
	 * difference across a change of the plan. */
	uint64_t mv_prom_n, mv_dem_n, mv_prom_b, mv_dem_b;
	arena_engine_decision *dec; /* ARENA_ENGINE_HISTORY kept, decision i at i % that */
	uint64_t n_dec;
	uint8_t *dec_res; /* the resident set at decide_begin (n_blocks) */
	int ending; /* inside step_end: its decisions are not `between` */
	/* What the budget was read from at the last planning point (budget_now):
	 * the budget, the free memory, the device memory that is not other
	 * programs' (free + the engine's + the rest's as reported: `avail`), what
	 * the rest takes of it at its peak (`need`: the larger of what it holds
	 * and its reserve; `unknown`: a work not seen, the safe plan), and the
	 * same at the last decision (or at the last step end with nothing to do:
	 * the basis a move is explained against). rest_oom: a report of an
	 * out-of-memory since the last adapt. */
	uint64_t seen_budget, seen_free, seen_avail, seen_need;
	int seen_unknown;
	uint64_t why_avail, why_need;
	int why_unknown;
	int rest_oom;
};

/* A plan about to change (arena__engine_decide_begin) and the record made
 * of it once it has (decide_end). */
typedef struct arena__decide_snap {
	uint64_t resident, ring, stream;
	double step_s;  /* the plan's predicted step before */
	double after_s; /* after, when a caller predicted both (a look); 0: the plan's step_s after */
	uint64_t prom_n, dem_n, prom_b, dem_b;
} arena__decide_snap;

/* --- helpers every part uses ------------------------------------------------ */

/* Device bytes the coded copies' stages take (wstage_each is set only
 * when there are stages, just before they are allocated). */
static inline uint64_t arena__engine_wire_stage_bytes(const arena_engine *e)
{
	return ENGINE_WIRE_STAGES * e->wstage_each;
}

/* Block b's coded form when the disk tier reads it coded (an hb4 image,
 * stages there), else NULL. */
static inline arena_wire *arena__engine_disk_coded(const arena_engine *e, uint32_t b)
{
	arena_wire *w = e->m->mem[b].disk_wire;
	return w && e->o.reread_wire && e->wstage ? w : NULL;
}

/* A block whose bytes are in its image only (the disk tier). */
static inline int arena__engine_on_disk(const arena_engine *e, uint32_t b)
{
	return !e->m->mem[b].dev && !e->m->mem[b].host && !e->m->mem[b].wire && e->l->blocks[b].bytes;
}

/* Entry j of the streamed schedule; j >= n_seq is the next step's j - n_seq. */
static inline uint32_t arena__engine_seq_at(const arena_engine *e, size_t j)
{
	return e->seq[j < e->n_seq ? j : j - e->n_seq];
}

/* --- engine.c: the step and the ring ---------------------------------------- */

/* A failing device op fails the engine (USAGE does not); returns rc. */
int arena__engine_fail(arena_engine *e, int rc);
/* The plan's derived fields and the streamed schedule (seq) from
 * plan.resident, and the predicted step. */
void arena__engine_refresh(arena_engine *e);
/* The plan's predicted step under the profile (given or learned), -1 without one. */
double arena__engine_predict(arena_engine *e);
/* Wait for what the ring is part of and free it; a ring of n_slots x bytes. */
int arena__engine_ring_free(arena_engine *e);
int arena__engine_ring_alloc(arena_engine *e, uint64_t bytes);
/* Forget the entries fetched ahead and not yet acquired. */
void arena__engine_drop_ahead(arena_engine *e);

/* --- engine_copy.c: copies to the device ------------------------------------ */

/* Queue block b's copy to dst (src: its host slab, or NULL); *fill gets
 * the stream its fill event goes on. */
int arena__engine_send(arena_engine *e, uint32_t b, uint8_t *dst, const uint8_t *src, arena_stream **fill);
/* The copy of a coded form w to dst (its segments' dst are the block's). */
int arena__engine_send_wire(arena_engine *e, const arena_wire *w, uint8_t *dst, arena_stream **fill);
/* Where block b's bytes are in host memory for a copy (NULL: coded or on disk). */
int arena__engine_host_src(const arena_engine *e, uint32_t b, const uint8_t **src);
/* Bytes a copy of block b moves. */
uint64_t arena__engine_moved_bytes(const arena_engine *e, uint32_t b);
/* At create: the coded copies' stages, decode stream and events when
 * something streams coded (their bytes out of *budget), and moved[];
 * at free: all of that. */
int arena__engine_wire_init(arena_engine *e, const arena_engine_opts *o, uint64_t *budget);
void arena__engine_wire_free(arena_engine *e);

/* --- engine_disk.c: the disk tier ------------------------------------------- */

/* Copy block b, in its image only, to dst through the stager. */
int arena__engine_disk_parts(arena_engine *e, uint32_t b, uint8_t *dst, arena_stream **fill);
/* The host bytes a copy of block b takes; whether one, with `more` taken
 * first, would go over the host budget (it stays in the disk tier). */
uint64_t arena__engine_host_copy_bytes(const arena_engine *e, uint32_t b);
int arena__engine_past_host_budget(const arena_engine *e, uint32_t b, uint64_t more);
/* The stager and the coded plans it reads by (the streams synced first). */
void arena__engine_disk_free(arena_engine *e);
/* At create, with a host budget (o.host_cap) and an image to read: the
 * stager's two slots at least within it beside the host copies (what
 * o.disk_staging lacks for them comes out of host_cap). BUDGET when they
 * do not fit. */
int arena__engine_disk_init(arena_engine *e);

/* --- engine_moves.c: moves between resident and streamed -------------------- */

int arena__engine_demote(arena_engine *e, uint32_t b);
int arena__engine_promote(arena_engine *e, uint32_t b);
/* Make the ring fit the plan, demoting while its allocation fails. */
int arena__engine_fit_ring(arena_engine *e);
/* release_host: give back the host copies of blocks on the device for good. */
int arena__engine_release_hosts(arena_engine *e);
/* Move to the resident set `want`, timed against its estimate. */
int arena__engine_apply(arena_engine *e, const uint8_t *want);
/* A look's move to plan t (made for `budget`, predicted faster): the first
 * step end's part of it, and the rest left to pace_next at the next ones
 * (engine.h, move_pace). */
int arena__engine_pace_start(arena_engine *e, const arena_residency_plan *t, uint64_t budget);
/* At a step end after adapt: the next part of the look's move under way,
 * if any, or its end (see pace). */
int arena__engine_pace_next(arena_engine *e);
/* The resident set to move to for plan t: the nearest to now as good as t's. */
const uint8_t *arena__engine_near_set(arena_engine *e, const arena_residency_plan *t, uint64_t budget, int grow);
const uint8_t *arena__engine_switch_set(arena_engine *e, const arena_residency_plan *t, uint64_t budget);
/* Does a move to `want` (rather than `alt`, NULL: staying) pay for itself? */
int arena__engine_move_pays(arena_engine *e, const uint8_t *want, const uint8_t *alt, double gain);
/* (arena__engine_move_bytes: engine.h, for tests.) */

/* --- engine_plan.c: the budget and the plan between steps ------------------- */

/* What rounding device allocations adds to `bytes`; that rounding of the
 * model's blocks (and of e's ring and stages; e may be NULL). */
uint64_t arena__engine_gran_loss(const arena_backend *be, uint64_t bytes);
uint64_t arena__engine_own_rounding(const arena_model *m, const arena_engine *e);
/* The options the plan depends on changed: the next adapt plans anew. */
void arena__engine_plan_changed(arena_engine *e);
/* Does plan t, made for budget `made`, hold for `budget`? */
int arena__engine_plan_holds(const arena_engine *e, const arena_residency_plan *t, uint64_t made, uint64_t budget);
/* Keep t as the plan for `budget` for the steps after. */
void arena__engine_memo_keep(arena_engine *e, const arena_residency_plan *t, uint64_t budget);
/* At a step's end: the budget read again and the move it asks for
 * (new_sched: the schedule was learned this step). */
int arena__engine_adapt(arena_engine *e, int new_sched);
/* The weights budget before the coded copies' stages, from the device read
 * now (free, total), the engine's allocations (`held`: its device bytes,
 * counted in free memory's stead) and the rest as reported: reads the
 * process's memory into o.other first; a rest of unknown need gets the safe
 * budget (stage: the stages' bytes, for that choice). headroom and reserve
 * as used (may be NULL). */
uint64_t arena__engine_budget(arena_engine *e, uint64_t free_b, uint64_t total, uint64_t held, uint64_t stage,
			      uint64_t *headroom, uint64_t *reserve);
/* A budget read (budget_now): what a decision says it was made for, and the
 * inputs it is explained by (engine_decide.c); held: the engine's device bytes. */
void arena__engine_seen(arena_engine *e, uint64_t budget, uint64_t free_b, uint64_t held);
/* The device bytes the engine has allocated: resident blocks, the ring, the
 * stages, with their rounding. */
uint64_t arena__engine_alloc_bytes(const arena_engine *e);
/* At a step's end, before adapt: learn what the rest held in the step under
 * its mode and work, and plan the next work's need (learn_rest). */
void arena__engine_rest_step_end(arena_engine *e);

/* --- engine_learn.c: timing, the learned profile, looks, the order run ------ */

/* Create: the timing events and learned arrays (on backends that can
 * time); free: them. */
int arena__engine_time_init(arena_engine *e);
void arena__engine_time_free(arena_engine *e);
/* step_begin: this step's parity of timing slots. */
void arena__engine_time_begin(arena_engine *e);
/* Around an acquire's wait (its slot to *slot) and at its release. */
int arena__engine_time_ready(arena_engine *e, uint32_t b, arena_stream *s, size_t *slot);
int arena__engine_time_start(arena_engine *e, size_t slot, arena_stream *s);
int arena__engine_time_end(arena_engine *e, uint32_t b, arena_stream *s);
/* Read copy pair k's time if its copy is done (0, 1 not yet, or an error):
 * before the pair times another copy. */
int arena__engine_read_copy(arena_engine *e, unsigned k);
/* Log an acquire of a scheduled block; at the step's end, adopt the order
 * seen as the schedule (1 when it did). */
void arena__engine_observe(arena_engine *e, uint32_t b);
int arena__engine_adopt_order(arena_engine *e);
/* The learned profile in force does not time every block of the schedule now
 * (another caller's blocks): plan by bytes until it does (engine_learn.c). */
void arena__engine_profile_cover(arena_engine *e);
/* At a step's end, after adapt: the gap, what the device timed, the look
 * started at the last step end taken, a new one started. */
int arena__engine_learn_end(arena_engine *e);
/* Wait for a look and drop it (and the host copies it read ahead that no
 * move took). */
void arena__engine_look_free(struct look *k);
/* Wait for release_host's thread and free what it was given. */
void arena__engine_reap_wait(arena_engine *e);
/* Wait for a look's thread, if one runs (it may be reading from the image:
 * a read on the caller's thread waits for it first). */
void arena__engine_look_wait(arena_engine *e);


/* --- engine_decide.c: the record of decisions ------------------------------- */

/* Create: the records (NOMEM); free: them. */
int arena__engine_decide_init(arena_engine *e);
void arena__engine_decide_free(arena_engine *e);
/* Before a change of the plan: what it is now. */
void arena__engine_decide_begin(arena_engine *e, arena__decide_snap *s);
/* After it: a record, with `why`, when blocks moved or the ring's bytes
 * changed since s; the basis the next move is explained against becomes
 * the inputs read now. */
void arena__engine_decide_end(arena_engine *e, const arena__decide_snap *s, int why);
/* Why adapt moves (grow: promotions into room, else demotions): the input
 * that moved most since the basis (the device's free memory: PRESSURE, or
 * YIELD under a share; the rest's need: NEED, or OOM after an out-of-memory
 * report), else LEARNED (new_sched: the order learned this step, or a
 * learned profile in force) or REPLAN. */
int arena__engine_why(const arena_engine *e, int grow, int new_sched);
/* The inputs read now become the basis (adapt found nothing to do). */
void arena__engine_why_settle(arena_engine *e);

#endif
