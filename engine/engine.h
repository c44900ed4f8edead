/* engine.h - the residency planner and the prefetch engine: a loaded model
 * run on any amount of device memory, as much of it resident as fits, the
 * rest streamed through a ring of device memory just in time.
 *
 * Plan (arena_residency_plan, a pure function; `arena plan` uses it without
 * a device). Blocks in execution order; the globals block (container NULL)
 * is always resident and is not part of the schedule. The schedule of one
 * step is the one given (opts sched: the blocks in the order a caller
 * acquires them, repeats allowed) or the mode's default:
 *   sample: the other blocks in order (n entries);
 *   train:  forward in order, then backward in reverse, each block needed
 *           again once for recompute + backward (2n entries).
 * In train a block's entries after its first are backward entries (their
 * compute costs backward_factor times the forward's).
 * The budget is the device memory the engine may use for weights. The cap
 * is the whole process's (include/arena.h, "The process's device memory"):
 *   with a cap:  cap - other - max(rest, reserve) - headroom
 *   always:      free + what the engine holds - max(0, reserve - rest)
 *                - max(headroom, share)
 * the lesser of the two, where `other` is what the process holds beside
 * the engine and the rest of it (its CUDA context: opts other, measured),
 * `rest` what the rest (torch's allocator) holds now, as the caller last
 * said (arena_engine_rest_report), and `reserve` what the rest needs at its
 * peak in a step: given, the default, or learned per mode and work
 * (learn_rest; a work not seen plans the smallest plan unless the whole
 * model fits in half of what there is).
 * `share` is what the plan leaves free for other programs (opts share; 0
 * none). headroom (physical slack) defaults to min(512 MiB, 2% of total);
 * reserve (working memory for activations) to 1 GiB for sample and 4 GiB for train,
 * at most a quarter of what is left after the headroom. If everything fits,
 * everything is resident. Otherwise the streamed blocks go through a ring:
 * one device buffer of `slots` times the largest streamed block, slots =
 * depth + 1 (depth blocks ahead plus the block in use), plus keep_last in
 * train (so the last forward blocks are still there when backward needs
 * them).
 * For every candidate slot size (each distinct block size) the planner keeps
 * blocks above it resident, then spreads the remaining room over the
 * schedule (an error-diffusion walk: resident blocks evenly between the
 * streamed ones, so copies hide behind the compute of resident blocks) and
 * fills what is left largest first; the candidate with the most resident
 * bytes wins. Predicted streamed bytes per step come from a dry run of the
 * ring (below) over two steps, so they include blocks still in the ring
 * when they are needed again (the last forward blocks reused by backward).
 *
 * With a compute profile (opts cost and h2d_bytes_per_s) the resident blocks
 * are chosen differently: the dry run is timed (copies one after another at
 * the given rate, each waiting for the release of what it overwrites; each
 * entry computing once its block is there and the previous entry is done)
 * and, for every candidate slot size, blocks are made resident one at a time,
 * each time the one that shortens the predicted step most per byte (the
 * largest when none does), while they fit. Copies then sit where the compute
 * can hide them: where blocks cost little compute for their bytes, more of
 * them stay; the plan with the shortest predicted step wins (ties: most
 * resident bytes).
 *
 * The ring (run and dry run alike): blocks are placed one after another,
 * first in first out, at the head, or at the start when a block does not
 * fit before the end (where that would overwrite a block fetched and not
 * yet released, as when a caller holds two blocks at once in a backward:
 * the first place that would not, at 0 or right after a block in the
 * ring); a placed block evicts those whose bytes it overlaps,
 * and its copy waits (on the device) for their last release. A block still
 * in the ring when its entry comes is not copied again. Entries are fetched
 * as far ahead as the ring has room (a block fetched and not yet released
 * is never overwritten), so where blocks are smaller than the largest, more
 * of them are in flight: copies run further ahead of the compute than
 * `depth` blocks. Fetching goes on past the end of a step into the next
 * step's first entries (at most one step ahead), so a caller that waits for
 * its work between steps finds them on their way; they stay fetched for the
 * next step unless its schedule changes or the ring is made anew.
 *
 * Callers need not follow the schedule. An acquire of a streamed block
 * that is not the next one the schedule expects is a miss: the prefetches
 * ahead are dropped (their bytes stay in the ring and are reused if still
 * there when asked for), the engine moves to the schedule's next entry of
 * that block (or its first, or none: then the block is fetched on its own)
 * and fetches it at once, then prefetches from there. A step may end before
 * the schedule does. Every step records the blocks acquired in order; when
 * that differs from the schedule and is not a part of it cut short (a step
 * stopped early), it becomes the schedule of the mode from the next step on
 * (the plan is made again for it). So a caller need give no schedule: the
 * first step may miss, later ones prefetch in the order observed.
 *
 * Engine state machine (not thread-safe: one thread at a time drives it):
 *
 *     create ──► IDLE ──step_begin──► STEP ──step_end──► IDLE
 *                 │  ▲                │  ▲                 │
 *        set_mode └──┘                └──┘ acquire/release │
 *                 └──────────── free (any state) ◄─────────┘
 *     any failing device op ──► FAILED (every later call returns the error;
 *                                       free still releases everything)
 *     but a ring a step_end cannot place (DEV_OOM with every block demoted)
 *     leaves it IDLE without a ring: each step_begin places it first, or
 *     returns DEV_OOM and stays IDLE
 *
 *   | transition                         | performed by                     |
 *   | plan, slots, resident copies       | arena_engine_create              |
 *   | first prefetch of a step           | step_begin (or step_end before)  |
 *   | prefetch of entries ahead          | acquire, release                 |
 *   | adapt: demote / promote, new ring  | step_end                         |
 *   | adopt the observed schedule        | step_end                         |
 *   | another mode's schedule and budget | arena_engine_set_mode            |
 *   | a schedule given between steps     | arena_engine_set_schedule        |
 *   | device timing read; learned plan   | step_end, arena_engine_collect   |
 *   | drop device copies, slots          | arena_engine_free                |
 *
 * Invariants (hold between calls):
 *   1. Offload is forgetting the device copy: the engine never copies from
 *      the device to the host (DESIGN.md invariant 3). A block leaves the
 *      device only when it has a host slab; a block loaded straight to the
 *      device gets one first (re-read from its image through `reread`,
 *      checksums checked), so no block is ever lost.
 *   2. Ring bytes are overwritten only after the copy stream has waited for
 *      the event recorded at the last release of each block they held, and
 *      never while such a block is fetched and not yet released; a block's
 *      device address is handed out only after the caller's stream has been
 *      made to wait for the copy that filled it.
 *   3. A resident block's device memory is freed (demotion) only after the
 *      event of its last release is done, and only between steps.
 *   4. Device memory used = globals + resident blocks + the ring (slots x
 *      slot_bytes),
 *      and after every step_end it is within the budget read at that step
 *      unless nothing more can be demoted (then the step record says
 *      over_budget; with `strict` step_end fails with BUDGET instead).
 *   5. No allocation on the hot path: acquire and release use only arrays
 *      sized at create, and a trace only buffers sized at its start (the
 *      backend may allocate inside its own ops).
 *
 * While an engine is attached, it owns the device side of the model's blocks
 * (m->mem[b].dev, m->dev_bytes): it allocates, fills and frees them. When it
 * is freed, each block is left on the device (resident ones) or in a host
 * slab (streamed ones), and the model stays whole.
 */
#ifndef ARENA_ENGINE_H
#define ARENA_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "../formats/layout.h"
#include "../device/backend.h"
#include "../device/model.h"

#include "arena.h" /* ARENA_MODE_SAMPLE, ARENA_MODE_TRAIN */

#define ARENA_ENGINE_AUTO UINT64_MAX /* headroom / reserve: the default */
#define ARENA_ENGINE_DEFAULT_DEPTH 2u
#define ARENA_ENGINE_MAX_DEPTH 64u /* the most a ring's depth may be (arena_residency_ring) */
#define ARENA_ENGINE_DEFAULT_HYSTERESIS 3u
/* A move between resident sets that a prediction asks for (see
 * arena_engine_opts.payback_steps) is to pay for itself within this many
 * steps, its cost estimated at these rates until moves have been timed:
 * promotions copied at 16 GB/s and demoted blocks' host copies read again
 * at 4 GB/s (the H200, 64 MiB pieces of flux-dev: 32 promotions, 2.1 GB,
 * took 0.133 s; 32 demotions read again, 2.1 GB, 0.49 s). */
#define ARENA_ENGINE_DEFAULT_PAYBACK 16u
#define ARENA_ENGINE_MOVE_COPY_BPS 16e9
#define ARENA_ENGINE_MOVE_READ_BPS 4e9
/* A look's move demotes, each step end, this much of the step its plan
 * predicts at the learned copy rate (arena_engine_opts.move_pace): on an
 * H100 (2026-12-07, FLUX.1-dev at 12G) a swap that demoted 3.4 GB at once
 * made the step after it 0.317 s, against 0.281 before and 0.253 after. */
#define ARENA_ENGINE_DEFAULT_PACE 0.1
#define ARENA_ENGINE_HISTORY 256u /* step records kept */
#define ARENA_ENGINE_DISK_PART (64ull << 20) /* the disk tier's parts (arena__disk_part: tests) */
/* The disk tier's staging for reads ahead of use (arena_engine_opts.disk_staging). */
#define ARENA_ENGINE_DISK_STAGING (384ull << 20)
/* ARENA_ENGINE_DISK_STAGING, or ARENA_DISK_STAGING where set (for
 * measuring; arena_open and `arena plan` read it). */
uint64_t arena_engine_disk_staging(void);
extern uint64_t arena__disk_part;

/* Fill `dst` (the block's slab bytes) from the block's source, checked.
 * Used to give a device-only block a host copy before it leaves the device. */
typedef int (*arena_reread_fn)(void *ctx, uint32_t block, uint8_t *dst, uint64_t bytes);
/* The same for bytes [off, off + len) of the block's slab (the disk tier
 * copies a block a part at a time through small staging buffers). */
typedef int (*arena_reread_part_fn)(void *ctx, uint32_t block, uint64_t off, uint64_t len, uint8_t *dst);

struct arena_wire;

typedef struct arena_engine_opts {
	int mode;             /* ARENA_MODE_SAMPLE (default) or ARENA_MODE_TRAIN */
	uint64_t cap;         /* device bytes the process may hold at most (arena's, the rest's and
			       * `other`); 0 = no cap */
	uint64_t other;       /* the process's device bytes beside the engine's and the rest's (its
			       * context): counted against the cap */
	uint64_t rest;        /* what the rest of the process holds now (arena_engine_rest_report) */
	int learn_rest;       /* reserve learned from the rest's reports (engine.h above) */
	uint64_t headroom;    /* ARENA_ENGINE_AUTO = min(512 MiB, 2% of total) */
	uint64_t reserve;     /* ARENA_ENGINE_AUTO = 1 GiB sample / 4 GiB train, <= 1/4 */
	unsigned depth;       /* ring = (depth + 1 [+ keep_last]) x largest streamed block;
			       * 0 = ARENA_ENGINE_DEFAULT_DEPTH */
	unsigned keep_last;   /* train: extra ring slots for the last forward blocks
			       * (arena_engine_opts_default: 1) */
	unsigned hysteresis;  /* steps of room before a promotion; 0 = default */
	int strict;           /* over the cap after demoting all it can: error, not a warning */
	/* Optional compute profile: cost[b] = seconds of block b's forward work
	 * per step (n_blocks entries, globals ignored), backward entries of train
	 * cost backward_factor x that (0 = 3: recompute + backward), and the
	 * host-to-device rate. With both cost and h2d_bytes_per_s, the planner
	 * chooses resident blocks by a timed dry run (see above) instead of
	 * spreading them by bytes. The array is copied. */
	const double *cost;
	/* Optional, with cost: hold[b] = seconds block b stays acquired from its
	 * start (cost is then the time from its start to the next acquire: the
	 * weightless work after it included; a block held past the next
	 * acquire releases its ring slot later than its cost says). NULL: a
	 * block is released when its cost is spent. The planner uses it; the
	 * engine learns its own with the profile (and ignores one given here). */
	const double *hold;
	/* Optional, train, with cost: bcost[b] and bhold[b] = block b's own
	 * seconds in the backward pass (its recompute and backward: from its
	 * start to the next acquire, and to its release), where >= 0; where
	 * NULL or < 0, its forward's times backward_factor. A single factor
	 * misplaces the backward's time: on the H200 a Flux double block's
	 * pieces took 3.2 x their forward, a single block's 5.8 x. The engine
	 * learns its own with the profile. */
	const double *bcost, *bhold;
	double backward_factor;
	double h2d_bytes_per_s;
	/* Device seconds between two steps outside the blocks: from the device
	 * reaching a step's end (arena_engine_step_end, on the stream of its
	 * last release) to the next step's first scheduled acquire (the
	 * caller's own work there, and the device waiting for its host). The
	 * timed dry run adds it at each step's start: copies for the next step
	 * run through it, and a ring full of them idles. Learned with the
	 * profile (the mean of the gaps timed; each is read at the end of its
	 * step or of the next, when done) when none is given; 0 = none. */
	double step_gap_s;
	/* Without a given profile, the engine learns one on backends that can
	 * time (each scheduled block's time from its start to the next acquire
	 * and to its release, each copy's rate) and, once every block has been
	 * timed and a copy seen, moves to the plan that profile predicts faster
	 * (by 2% or more); it looks again 2 steps later, then at twice the step
	 * count each time, with the profile learned since. A look is planned on
	 * a thread of its own from the step_end that starts it and taken (its
	 * move made) at the next one, which waits for it only if it is not done.
	 * no_learn turns that off (the timing that fills gpu_* stays). */
	int no_learn;
	/* A move that only a prediction asks for (a look at the learned profile;
	 * a plan made anew at another budget whose own set is predicted faster
	 * than the set nearest the one resident) is made only when the seconds
	 * it is predicted to save a step, payback_steps times, are more than the
	 * move's own: each promoted byte copied at move_copy_bps, each byte of a
	 * demoted block whose host copy is gone (release_host) read again at
	 * move_read_bps, the sum scaled by how long the engine's timed moves
	 * took against it. A move is a slow step: on the H200 a swap of 20 and
	 * 66 pieces for a predicted few percent took 0.79 s, and the steps
	 * after it were not faster. Demoted blocks that go past host_cap (the
	 * disk tier) are read from the image each step: those bytes at
	 * move_read_bps come off the predicted saving (the predictions time
	 * copies from host memory). 0: ARENA_ENGINE_DEFAULT_PAYBACK and the
	 * ARENA_ENGINE_MOVE_*_BPS rates. Moves the budget forces (demotions
	 * over it, promotions into room) are not held back. */
	unsigned payback_steps;
	double move_copy_bps, move_read_bps;
	/* A look's move swaps blocks, and the blocks it demotes are copied from
	 * the next step on, beside the copies of those it promotes: that step
	 * copies the demoted bytes more than the plan it left did. So the move
	 * goes over step ends (arena__engine_pace_next), each demoting about
	 * move_pace of the step the look's plan predicts, at the learned copy
	 * rate (at least one block). 0: ARENA_ENGINE_DEFAULT_PACE; below 0: the
	 * whole move at once. */
	double move_pace;
	/* Give back the host copies of blocks on the device for good (promoted
	 * at an earlier step end), unless kept (arena_block_mem.kept) or moved
	 * by a schedule change (a pipeline's components: the next change moves
	 * them back): read again (o.reread) if the block is streamed later.
	 * Needs reread. */
	int release_host;
	/* Per block, the bytes a copy of it moves when fewer than its slab's
	 * (coded streaming; the engine sets it from the model), or NULL: the
	 * timed planner's copy times use them. */
	const uint64_t *moved;
	arena_reread_fn reread; /* NULL: device-only blocks stay resident */
	/* Optional, with reread: a part of a block (same ctx). With it the disk
	 * tier reads and copies a block in parts of at most ARENA_ENGINE_DISK_PART
	 * bytes through staging slots of that size (host memory stays small:
	 * disk_staging, not blocks); without it, whole blocks. */
	arena_reread_part_fn reread_part;
	/* Optional, with reread: fill the coded form of bytes [off, off + len)
	 * of a block (an hb4 image's disk tier: the segments of
	 * m->mem[b].disk_wire's plan for that range, in a staging slot), chunks
	 * checked. With it such blocks are read and copied coded, in parts. */
	int (*reread_wire)(void *ctx, uint32_t block, uint64_t off, uint64_t len, struct arena_wire *w);
	/* With reread: host memory the blocks' host copies may take (0: no
	 * limit; arena_open: the host budget less the disk tier's staging). A
	 * block leaving the device gets a host copy only within it; past it,
	 * it stays in its image and is read from there when streamed (the disk
	 * tier), so demotions keep the host budget arena_open was given. */
	uint64_t host_cap;
	void *reread_ctx;
	/* The disk tier's reads: staging bytes for the stager's slots (0:
	 * ARENA_ENGINE_DISK_STAGING; arena_open: the host budget's share,
	 * arena_residency_staging). Two slots at least: with host_cap set, what
	 * it lacks for them comes out of host_cap (arena__engine_disk_init),
	 * and disk_sync = 1 to read each part when it is copied, on the
	 * caller's thread (no read-ahead: for measuring). */
	uint64_t disk_staging;
	int disk_sync;
	/* The step's schedule (n_sched block indices, globals excluded), or
	 * NULL for the mode's default. At most arena_residency_max_sched(l)
	 * entries. The engine copies it; it then learns its own (above)
	 * unless fixed_schedule is set. */
	const uint32_t *sched;
	size_t n_sched;
	int fixed_schedule;
	/* Train: a ring slot is at least this many bytes, whatever streams (0:
	 * the largest streamed block). arena_open in pieces sets the largest
	 * piece: a checkpointed caller holds a block's pieces from its recompute
	 * to its backward, the depth is chosen so that the ring holds them, and
	 * a ring of the largest streamed piece no longer does once the largest
	 * pieces have become resident. */
	uint64_t min_slot;
	/* Device bytes left free for other programs at every step end
	 * (arena_open_options.share_card, resolved): the budget's free-memory
	 * side keeps max(headroom, share) free instead of the headroom, so that
	 * another program's allocation finds room, and when the device's free
	 * memory falls under it the next adapt demotes (a decision whose why
	 * is ARENA_WHY_YIELD). 0 = none. */
	uint64_t share;
} arena_engine_opts;

/* The library's defaults (the CLI's too): sample mode, automatic headroom and
 * reserve, depth 2, keep_last 1, the default hysteresis, learning on. */
void arena_engine_opts_default(arena_engine_opts *o);

/* The longest schedule a step may have: 8 entries per scheduled block. */
size_t arena_residency_max_sched(const arena_layout *l);

/* A plan. Arrays are owned; release with arena_residency_plan_release. */
typedef struct arena_residency_plan {
	size_t n_blocks;         /* of the layout */
	uint8_t *resident;       /* per block: 1 resident (globals always), 0 streamed */
	uint32_t *sched;         /* the step's schedule: block per entry */
	uint8_t *bwd;            /* per entry: 1 a backward entry (train, not the block's first) */
	size_t n_sched;
	uint64_t budget;         /* bytes for weights the plan was made for */
	uint64_t headroom, reserve;
	uint64_t globals_bytes, resident_bytes, streamed_block_bytes; /* resident_bytes has globals */
	uint64_t slot_bytes;     /* 0 when nothing is streamed */
	uint64_t min_slot;       /* train: o->min_slot (slot_bytes is at least it); else 0 */
	unsigned slots, depth;
	uint64_t need_bytes;     /* globals + resident + slots x slot_bytes */
	uint64_t min_need_bytes; /* the least any plan needs: globals + slots x largest block */
	uint64_t stream_bytes_per_step; /* predicted, steady state */
	double step_s;           /* predicted step seconds (timed dry run); 0 without a profile */
	uint64_t copies_per_step;
	size_t n_resident, n_streamed; /* among scheduled blocks */
} arena_residency_plan;

/* Work out where a budget comes from: total and free device bytes (free
 * includes what the model already holds), cap 0 = none, headroom and reserve
 * ARENA_ENGINE_AUTO or bytes. Writes the weights budget and what was used. */
void arena_residency_budget(uint64_t total, uint64_t free_bytes, const arena_engine_opts *o, uint64_t *budget,
			    uint64_t *headroom, uint64_t *reserve);
/* The reserve that stands for a rest whose need is not known (learning, a
 * work not seen yet): everything past the smallest plan. */
#define ARENA_ENGINE_REST_UNKNOWN (UINT64_MAX - 1)
/* The budget for a rest whose need is not known: `b0` is the budget with no
 * reserve (arena_residency_budget with reserve 0); `stage` the device
 * stages streaming takes beside the weights. Half of b0 when the whole
 * model and its stages fit in it (then all of it is resident and the rest
 * has the other half), else the smallest plan's need (plus the stages when
 * anything streams), or 0 when that does not fit b0 (BUDGET follows). */
uint64_t arena_residency_budget_unknown(const arena_layout *l, const arena_engine_opts *o, uint64_t b0, uint64_t stage);
/* The margin a learned need carries over the peak it was learned from:
 * 1/32 of it and min(64 MiB, 1/64 of the cap or the device) (allocators
 * vary a little from step to step: cuBLAS's choice of workspace, where a
 * block splits). */
uint64_t arena_residency_rest_margin(uint64_t peak, uint64_t base);

/* The floor: the least device memory (`vram`, as a cap on a device of that
 * size: headroom and reserve from o as arena_residency_budget takes them)
 * at which `l` has a plan in o->mode with o's ring options, and the weights'
 * bytes of that smallest plan (globals + the ring + blocks larger than a
 * slot). A profile does not change it. Errors: USAGE (bad options), BUDGET
 * (no size is enough: a fixed reserve past any device), NOMEM. */
int arena_residency_floor(const arena_layout *l, const arena_engine_opts *o, uint64_t *vram, uint64_t *weights);

/* For a layout whose whole blocks do not fit `budget`: the largest piece
 * size among six powers of two below the largest block at which its pieces
 * (arena_layout_pieces) have a plan (by bytes) in o->mode; *piece = 0 when
 * none does. For messages that say what would run. Errors: NOMEM. */
int arena_residency_piece_fit(const arena_layout *l, const arena_engine_opts *o, uint64_t budget, uint64_t *piece);

/* The disk tier: which streamed blocks of plan p keep a host copy under
 * `host_budget` bytes (slabs rounded up to ARENA_SLAB_ALIGN) and which do
 * not: disk[b] = 1 (n_blocks entries, set here). The host budget is all
 * the host memory the weights take: the disk tier's `staging`
 * (arena_residency_staging: the host memory its reads go through) comes
 * out of it, and the streamed blocks keep host copies without a tier only
 * when they fit beside it (a block that leaves the device later and finds
 * no room joins the tier, whose staging is then made). Otherwise the tier
 * takes the blocks the schedule does not name first, then blocks spread
 * evenly through the schedule (each read while the host blocks before it
 * are copied), and the budget's room left goes back to host copies in
 * schedule order. host_len: each block's host copy (coded streaming keeps
 * them smaller), NULL: its slab. *host and *disk_b (may be NULL) get their
 * bytes. UINT64_MAX: no limit, no tier. Errors: NOMEM. */
/* The host memory left for streamed blocks' copies: the budget less the
 * disk tier's staging (0 when that takes it all). UINT64_MAX (no limit)
 * stays. */
uint64_t arena_residency_host_copies(uint64_t host_budget, uint64_t staging);
/* A slot of the disk tier's stager for layout l, as engine_disk.c makes
 * them: the largest block's bytes, at most a part (ARENA_ENGINE_DISK_PART,
 * or arena__disk_part where set), or `region` (an hb4 image's largest
 * coded region, read whole: arena_wire_region_most; 0: none) when larger;
 * rounded up to 4096. */
uint64_t arena_residency_stage_slot(const arena_layout *l, uint64_t region);
/* The stager's share of a host budget (bytes in whole slots of `slot`,
 * into *slots), beside `fixed` bytes the re-reads hold (the slab reader's
 * chunk buffers, arena_slab_reader_buffers): a quarter of the budget, at
 * least two slots (the least the stager reads ahead with), at most `want`
 * (ARENA_ENGINE_DISK_STAGING, ARENA_DISK_STAGING) and ARENA_STAGER_MAX_SLOTS
 * slots. The disk tier's staging is *slots + fixed. host_budget 0: the
 * least (no host copies: every streamed block in the tier); UINT64_MAX (no
 * limit): want. BUDGET (message: the least) when the budget is smaller
 * than the least. */
int arena_residency_staging(uint64_t host_budget, uint64_t want, uint64_t slot, uint64_t fixed, uint64_t *slots);
int arena_residency_host_split(const arena_layout *l, const arena_residency_plan *p, uint64_t host_budget,
			       uint64_t staging, const uint64_t *host_len, uint8_t *disk, uint64_t *host,
			       uint64_t *disk_b);

/* An image's host side under a host budget, as arena_open plans it and
 * `arena plan` shows it: the staging (arena_residency_staging: slots of
 * `slot` bytes, arena_residency_stage_slot, up to `want`, beside `fixed`), then the
 * streamed blocks' host copies beside it, or the disk tier
 * (arena_residency_host_split; disk[] as there). host_budget 0: the least;
 * one not `given` (what the host has to spare) and smaller than the least
 * is taken as the least. Errors: BUDGET (a budget given below the least),
 * NOMEM. */
typedef struct arena_host_plan {
	uint64_t budget;  /* the budget in force (UINT64_MAX: no limit) */
	uint64_t slots;   /* the stager's share of it */
	uint64_t staging; /* slots + fixed: out of the budget */
	uint64_t host;    /* the streamed blocks' host copies */
	uint64_t disk;    /* bytes of the blocks left in the image */
	size_t n_disk;
} arena_host_plan;
int arena_residency_host_plan(const arena_layout *l, const arena_residency_plan *p, uint64_t host_budget, int given,
			      uint64_t slot, uint64_t want, uint64_t fixed, const uint64_t *host_len, uint8_t *disk,
			      arena_host_plan *out);

/* The ring's rule: the one arena_open, arena_set_mode, arena plan (its plan
 * and both floors), arena load and arena.torch's attach go by. Sets o->depth
 * and o->min_slot for a caller of `l` (a layout in pieces when `pieces`) in
 * o->mode with o->keep_last, from `depth` (the caller's; 0: the rule's). A
 * caller holds blocks while it acquires the next, so the ring has at least:
 * sampling 2 slots, 3 in pieces (a block's call holds a piece while the
 * next is acquired: held anywhere in a ring of 2 slots it can leave no room
 * for a slot's bytes); training 3 (a recompute holds its block past the
 * next block's recompute), in pieces the largest block's bytes in slots of
 * its largest piece, plus one (a recompute holds all of a block's pieces
 * until its backward). Slots = depth + 1 (+ keep_last in train). Without a
 * depth: ARENA_ENGINE_DEFAULT_DEPTH, training in pieces the largest block's
 * slots (keep_last on top), at least what the mode needs; in pieces
 * min_slot is the largest piece (engine_opts.min_slot). USAGE, saying the
 * least depth that works, for a depth given below it, or for pieces too
 * small for any depth (a larger piece size then). Pure. */
int arena_residency_ring(const arena_layout *l, int pieces, unsigned depth, arena_engine_opts *o);

/* The largest block that is a container's member (what pieces split; in a
 * layout in pieces, its largest piece); 0 when there is none. */
uint64_t arena_residency_largest_block(const arena_layout *l);

/* The piece size "auto" (ARENA_PIECE_AUTO) chooses for `l` under `budget`:
 * 0 (whole blocks) when whole blocks all fit on the device, or when no
 * piece size has a plan (the whole-block error then stands); else the
 * largest power of two no larger than an eighth of the largest block in
 * sample mode, in train mode a third of the largest block rounded down to a
 * multiple of that (64 and 192 MiB for a 648 MiB Flux double block), or the
 * largest piece size that fits when that one does not
 * (arena_residency_piece_fit). By bytes, in o->mode. Errors: NOMEM. */
int arena_residency_piece_auto(const arena_layout *l, const arena_engine_opts *o, uint64_t budget, uint64_t *piece);
/* The budget arena_residency_piece_auto is asked with while the rest's need
 * is still to be learned, of `b0`, the budget with no reserve: half in
 * sample mode (whole blocks only when they all fit in it, all resident from
 * the first step), a third in train mode (whole blocks when their floor fits
 * it), two fifths when the image streams coded (`coded`). Pure. */
uint64_t arena_residency_piece_auto_share(int mode, int coded, uint64_t b0);

/* Plan `l` for `budget` weight bytes. Errors: BUDGET (the smallest plan does
 * not fit; the message says what it needs: globals, ring, reserve), USAGE
 * (a layout with no block to schedule is fine: all resident), NOMEM. */
int arena_residency_plan_make(const arena_layout *l, const arena_engine_opts *o, uint64_t budget,
			      arena_residency_plan *p);

/* The same when streaming anything also takes `stage` device bytes (coded
 * streaming's stages; 0: none): a plan that streams is made again for
 * *budget less the stages, and *budget says what the plan had. */
int arena_residency_plan_staged(const arena_layout *l, const arena_engine_opts *o, uint64_t *budget, uint64_t stage,
				arena_residency_plan *p);
/* The bytes a backend that allocates in units of `gran` (its
 * alloc_granularity; 0 or 1: exact) adds to plan p's allocations: each
 * resident block rounded up, and the ring (one allocation). */
uint64_t arena_residency_plan_rounding(const arena_layout *l, const arena_residency_plan *p, uint64_t gran);
/* arena_residency_plan_make on a device that allocates in units of `gran`:
 * a plan whose bytes and their rounding pass `budget` is made again for the
 * budget less its rounding (a few times at most: fewer resident blocks round
 * less), so that what the backend allocates for it fits the budget; when
 * none does, the smallest plan (its bytes fit the budget, its rounding may
 * not: the caller's over-budget rules apply, as below the smallest plan's
 * need). */
int arena_residency_plan_rounded(const arena_layout *l, const arena_engine_opts *o, uint64_t gran, uint64_t budget,
				 arena_residency_plan *p);
void arena_residency_plan_release(arena_residency_plan *p);
/* A deep copy of src into dst (NOMEM: dst holds nothing to release). */
int arena_residency_plan_copy(const arena_residency_plan *src, arena_residency_plan *dst);
/* Predicted seconds of a steady step of plan p under o's compute profile
 * (the timed dry run), for any plan of l; -1 without a profile or memory. */
double arena_residency_plan_predict(const arena_layout *l, const arena_engine_opts *o, const arena_residency_plan *p);

/* One thing a step does, laid out in time by the timed dry run. */
typedef struct arena_plan_span {
	uint32_t block;
	uint32_t entry; /* the schedule entry computing; UINT32_MAX for a copy */
	int copy;       /* 1 a copy into the ring, 0 an entry's compute */
	int bwd;        /* a backward entry (train) */
	double t0, t1;  /* seconds from the start of the step */
} arena_plan_span;

/* The steady step of plan p under o's compute profile, in time (the dry run
 * that gives step_s): every entry's compute and the copies that run during
 * it, clipped to it, in the order the dry run made them. *spans is
 * allocated (arena_free); *step_s the step's seconds. USAGE without a
 * profile, NOMEM. */
int arena_residency_plan_timeline(const arena_layout *l, const arena_engine_opts *o, const arena_residency_plan *p,
				  arena_plan_span **spans, size_t *n, double *step_s);

/* One step's record: every decision the engine made. */
typedef struct arena_engine_step {
	uint64_t step;           /* 0, 1, ... */
	uint64_t budget;         /* weight bytes allowed when the step ended */
	uint64_t free_bytes;     /* mem_info free at step_end */
	uint64_t resident_bytes; /* resident at the end of the step (with globals) */
	uint64_t slot_bytes;
	unsigned slots;
	uint64_t streamed_bytes; /* copied into the ring for this step's entries (some of
				  * them during the step before: see "The ring") */
	uint64_t copies;
	uint64_t promoted_bytes; /* copied to the device by promotions */
	/* Measured on the device (backends that can time), filled in once the
	 * step's work is done (at a later step_end, or by arena_engine_collect
	 * after a sync); gpu_timed is 0 until then and on backends that cannot
	 * time. stalls counts acquires where the caller's stream waited for a
	 * copy, stall_s the time it waited, compute_s the time between acquires
	 * and releases of scheduled blocks. */
	int gpu_timed;
	unsigned stalls;
	double stall_s, compute_s;
	int profile_learned;     /* the plan was changed this step by the learned profile */
	int mode;                /* the mode the step ran in */
	uint64_t acquires;       /* acquires of scheduled blocks (globals not counted) */
	unsigned misses;         /* acquires not in the order the schedule expected */
	int schedule_learned;    /* the step's order became the schedule from the next step */
	int stopped_early;       /* the step ended before its schedule did */
	unsigned demotions, promotions, alloc_retries;
	int over_budget;         /* nothing left to demote and still over */
	/* Host seconds: the step's step_end call, the planning counted for this
	 * step (in its step_end, or a mode change before it), and the moves of
	 * blocks to and from the device (promotions, demotions, a new ring). */
	double end_s, plan_s, move_s;
	uint64_t disk_bytes;     /* read from the image for copies (the disk tier) */
	uint64_t moved_bytes;    /* host-to-device bytes of the copies counted in streamed_bytes
				  * and promoted_bytes: fewer when blocks are held coded */
	double disk_wait_s;      /* host seconds disk-tier copies waited for their reads */
	/* A look at the learned profile was taken at this step's end (moved to
	 * or not: profile_learned says), and the seconds its plan took on its
	 * thread (beside the steps, not in plan_s unless waited for), and the
	 * steady step the profile it learned predicts for the plan in force
	 * (look_now_s) and for the look's plan (look_plan_s): it is moved to
	 * when look_plan_s < look_now_s x 0.98 (the first look; later ones
	 * 0.96) and the move pays. 0 where not predicted (no look, or one
	 * dropped or not planned for the budget now). */
	int looked;
	double look_s, look_now_s, look_plan_s;
	/* The last move this step's end weighed against its cost
	 * (payback_steps): its estimated host seconds, the seconds a step it was
	 * predicted to save less the disk tier's reads it adds a step
	 * (move_bytes' disk bytes at move_read_bps), and whether it was held back for
	 * that. */
	double move_est_s, move_gain_s;
	int move_held;
	/* Host copies of blocks this step end's moves demoted: the bytes read
	 * from the image for them on the caller's thread (in move_s), and those
	 * a look read ahead on its own thread, beside the step before, for the
	 * blocks its plan demotes (engine_learn.c, "read ahead"). */
	uint64_t host_read_bytes, prepared_bytes;
} arena_engine_step;

/* One change of the plan (include/arena.h's arena_decision_info, less
 * why_name): made by step_end's adapt or a look taken there, or between
 * steps by set_mode, set_schedule, set_profile or a rest report; recorded
 * when blocks moved or the ring's bytes changed. */
typedef struct arena_engine_decision {
	uint64_t step;  /* the engine's step count when made: the record that counts its moves */
	int between;    /* made between steps (not in step_end) */
	int why;        /* ARENA_WHY_* */
	unsigned promoted, demoted;
	uint64_t promoted_bytes, demoted_bytes;
	uint64_t resident_before, resident_after;
	uint64_t ring_before, ring_after;
	uint64_t budget, free_bytes;
	uint64_t stream_before, stream_after;
	double step_before_s, step_after_s;
} arena_engine_decision;

/* The name of an ARENA_WHY_* value ("learned", ...; "?" for another). */
const char *arena_engine_why_name(int why);

typedef struct arena_engine arena_engine;

/* Plan for `m` on its backend and set it up: resident blocks on the device
 * (copied from host slabs where they were not loaded there), streamed ones
 * off it (re-read through o->reread when they have no host slab), the
 * ring's slots, a copy stream and events. BUDGET before anything is moved
 * when the smallest plan does not fit. `m` is borrowed and must outlive the
 * engine. On failure nothing is changed but which blocks are on the device
 * (every block stays on the device or in a host slab). */
int arena_engine_create(arena_model *m, const arena_engine_opts *o, arena_engine **out);
/* Wait for the engine's work, free its slots and streams. Resident blocks
 * stay on the device (the model frees them). Accepts NULL. */
void arena_engine_free(arena_engine *e);

/* Start a step (IDLE -> STEP): issues the first copies if not yet issued.
 * Blocks streamed without a ring (a step_end could not place it): the ring
 * is placed first (demoting more if it must); DEV_OOM when it cannot be,
 * the engine staying IDLE (not failed). */
int arena_engine_step_begin(arena_engine *e);
/* Make `stream` wait for block b's bytes and return their device address in
 * *dptr, valid until the matching release. Any block at any time inside a
 * step; a streamed block out of the schedule's order is a miss (above).
 * USAGE: outside a step, b out of range, or no room in the ring because
 * the blocks held fill it. */
int arena_engine_acquire(arena_engine *e, uint32_t block, arena_stream *stream, void **dptr);
/* Record on `stream` when the caller's work with b ends; after it the block's
 * ring bytes may be reused. Pairs with the oldest unreleased acquire of b. */
int arena_engine_release(arena_engine *e, uint32_t block, arena_stream *stream);
/* End the step (STEP -> IDLE): every acquire must have been released (USAGE
 * otherwise, and the step goes on). Adopts the observed order as the
 * schedule where it differs (above), reads free memory again and adapts
 * (demotes at once under pressure, promotes after `hysteresis` steps of
 * room), then issues the next step's first copies. The step's record is
 * then available. DEV_OOM, the step ended and the engine not failed, when
 * the ring cannot be placed even with every block demoted (the device has
 * not the memory: another program took it): the next step_begin places it. */
int arena_engine_step_end(arena_engine *e);

/* Between steps: run in `mode` from the next step on, with that mode's
 * schedule (the one learned in it before, else its default), reserve and
 * ring. The resident blocks stay where the new budget allows (no copies
 * for a switch and back); what does not fit is demoted at once. USAGE
 * inside a step or for an unknown mode. */
int arena_engine_set_mode(arena_engine *e, int mode);
/* The same with that mode's ring depth (arena_residency_ring; 0: the one in
 * force). */
int arena_engine_set_mode_ring(arena_engine *e, int mode, unsigned depth);
/* Between steps: `sched` (n block indices, globals excluded, at most
 * arena_residency_max_sched) is the schedule of the mode in force from the
 * next step on, as if the caller had run it: the plan takes it and keeps its
 * resident blocks unless they no longer fit (demoted at once) or it does
 * not name them (arena__engine_switch_set: they give way to the blocks it
 * names as far as the budget holds those, and keep their host copies), the next
 * step's copies follow it, and the engine goes on learning the order run.
 * A learned profile that has not timed its blocks is not planned by until it
 * has. USAGE inside a step or for a bad schedule. */
int arena_engine_set_schedule(arena_engine *e, const uint32_t *sched, size_t n);
/* What the rest of the process (the adapter: torch's allocator) holds now,
 * the most it held since the last report (0: now), and the key of the next
 * step's work (0: the same): include/arena.h's arena_rest_report. Counted
 * from the next step end on (see the budget above); between steps, another
 * work is planned for at once (demotions when it needs more room). flags
 * ARENA_REST_OOM: the peak is what the rest needed when it ran out of
 * memory: the moves it causes are recorded as ARENA_WHY_OOM, and told
 * between steps it is learned for the coming work and planned for at once.
 * Errors: the engine's device errors. */
int arena_engine_rest_report(arena_engine *e, uint64_t now, uint64_t peak, uint64_t work, unsigned flags);
/* The same with now = peak = bytes and the same work. */
void arena_engine_set_rest(arena_engine *e, uint64_t bytes);
/* The process's device memory as the engine sees it now (arena_memory_get). */
int arena_engine_memory(arena_engine *e, arena_memory_info *out);
/* Between steps: plan by this compute profile (cost: the layout's n_blocks
 * entries; as opts cost/h2d/backward_factor) and move to that plan now. */
int arena_engine_set_profile(arena_engine *e, const double *cost, double h2d_bytes_per_s, double backward_factor);
/* The mode the engine runs in. */
int arena_engine_mode(const arena_engine *e);

/* Read what the device has timed so far, without waiting (step_end does it
 * too): fills the gpu_* fields of records whose work is done, and the
 * learned profile. Call it after synchronizing to complete the last steps'
 * records. USAGE-free; errors only from the backend. Not inside a step. */
int arena_engine_collect(arena_engine *e);

/* The compute profile the engine plans by, or has learned so far: cost (the
 * layout's n_blocks entries: each block's forward seconds, globals 0), the
 * host-to-device rate (0 while no copy has been timed) and the backward
 * factor (0: none seen). 0, or NOT_FOUND while a scheduled block has not
 * been timed yet (or the backend cannot time and none was given). */
int arena_engine_profile(const arena_engine *e, double *cost, double *h2d_bytes_per_s, double *backward_factor);
/* Train: each block's learned backward seconds (its recompute and backward,
 * from its start to the next acquire; n_blocks entries, < 0 where not timed
 * yet, globals 0), which the planner takes over the backward factor where
 * known. NOT_FOUND when the backend cannot time or a profile was given. */
int arena_engine_backward_costs(const arena_engine *e, double *bcost);

/* A trace of the engine's work (engine/trace.h: copies, acquires and
 * releases timed on the device, stalls, step boundaries, demotions,
 * promotions, memory counters) to `path`, from now until trace_end, which
 * writes it (whole or not at all). Between steps only (USAGE inside a step
 * or while another trace runs); the copies issued before it began (the next
 * step's first, prefetched at the last step_end) are not in it. `label`
 * names the model in the file (may be NULL); max_records as
 * arena_trace_open. arena_engine_free writes a trace not ended, unless the
 * engine failed or is inside a step. */
int arena_engine_trace_begin(arena_engine *e, const char *path, const char *label, size_t max_records);
/* Wait for the device's times of what was traced and write the file.
 * USAGE inside a step or without a trace; the engine's error (nothing
 * written) when it has failed. */
int arena_engine_trace_end(arena_engine *e);
/* 1 while a trace is being recorded. */
int arena_engine_tracing(const arena_engine *e);

/* The current plan (borrowed; changes at step_end). */
const arena_residency_plan *arena_engine_plan(const arena_engine *e);
/* Record of step `step`: 0, or NOT_FOUND if it is not (or no longer) kept. */
int arena_engine_step_record(const arena_engine *e, uint64_t step, arena_engine_step *out);
/* Steps ended so far. */
uint64_t arena_engine_steps(const arena_engine *e);
/* Decisions recorded so far, and decision i: 0, or NOT_FOUND when it is not
 * (or no longer: the last ARENA_ENGINE_HISTORY) kept. */
uint64_t arena_engine_decisions(const arena_engine *e);
int arena_engine_decision_get(const arena_engine *e, uint64_t i, arena_engine_decision *out);
/* Plans made so far (the planner's runs: at create, when the budget, mode,
 * schedule or profile change, and every 64 steps; not every step). */
uint64_t arena_engine_plans_made(const arena_engine *e);
/* Whether looks at the learned profile read ahead, on their own thread, the
 * host copies of the blocks their plans demote (1, the default; 0: the
 * move reads them in the step end, for tests and measuring). */
extern int arena__engine_read_ahead;
/* Bytes read ahead by looks so far, all engines of the process (tests). */
extern _Atomic uint64_t arena__engine_read_ahead_bytes;

/* Whether a look at the learned profile is being planned (on a thread of
 * its own since a step_end; the next step_end takes it). For tests. */
int arena_engine_looking(const arena_engine *e);
/* The gap between steps the engine learned (opts.step_gap_s; 0 none). */
double arena_engine_step_gap(const arena_engine *e);
/* Where block b is now: 1 resident, 0 streamed. */
int arena_engine_is_resident(const arena_engine *e, uint32_t block);
/* Is p where block b's bytes are for the caller now (1, else 0): its device
 * slab while it is resident, or its ring slot while an acquire of it is held
 * (what arena_block_acquire gave)? An address inside the bytes is not. */
int arena_engine_block_at(const arena_engine *e, uint32_t block, const void *p);
/* Tests: what a move from the resident set now to `want` (per block, 1
 * resident) would copy to the device, read from the image now, and read
 * from it each step more than now (the estimates a move is weighed by). */
void arena__engine_move_bytes(const arena_engine *e, const uint8_t *want, double *copy_b, double *read_b,
			      double *disk_b);
/* The engine's copy stream (tests: sync on it). */
arena_stream *arena_engine_copy_stream(const arena_engine *e);

/* Pure helpers exposed for tests and the CLI. */
/* 1 if block b of l is the globals block (always resident, not scheduled). */
int arena_block_is_globals(const arena_layout *l, uint32_t b);

#endif
