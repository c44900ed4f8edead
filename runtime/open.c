/* open.c - the public arena handle (include/arena.h): open with a residency
 * plan, the registry of live handles and their references, blocks and
 * tensors. The step calls are in steps.c. */
#include "open.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/profile.h"
#include "../common/alloc.h"
#include "../common/err.h"
#include "../common/units.h"
#include "../formats/image.h"
#include "../convert/quant_select.h"

/* --- the registry of live handles ---------------------------------------------
 *
 * Every live arena is in `reg`; refs are counted under reg_mu. A call takes
 * a reference for its duration (arena__enter), so a handle cannot be freed
 * under it by another thread's release. */

static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static arena **reg;
static size_t n_reg, cap_reg;

static size_t reg_find(const arena *a)
{
	for (size_t i = 0; i < n_reg; i++)
		if (reg[i] == a)
			return i;
	return SIZE_MAX;
}

static int reg_add(arena *a)
{
	int rc = 0;
	pthread_mutex_lock(&reg_mu);
	if (n_reg == cap_reg) {
		size_t nc = cap_reg ? 2 * cap_reg : 16;
		arena **t = arena_realloc(reg, nc * sizeof(*t));
		if (!t)
			rc = arena_errorf(ARENA_E_NOMEM, "out of memory");
		else
			reg = t, cap_reg = nc;
	}
	if (!rc)
		reg[n_reg++] = a;
	pthread_mutex_unlock(&reg_mu);
	return rc;
}

static void arena_free_all(arena *a)
{
	arena_engine_free(a->e);
	arena_slab_reader_close(a->rr);
	arena_model_free(a->m);
	arena_backend_destroy(a->be);
	arena_free(a->cost);
	arena_free(a->path);
	if (a->mu_init)
		pthread_mutex_destroy(&a->mu);
	arena_free(a);
}

void arena__drop_model(arena *a)
{
	pthread_mutex_lock(&a->mu);
	arena_engine_free(a->e);
	a->e = NULL;
	a->closed = 1;
	arena_slab_reader_close(a->rr);
	a->rr = NULL;
	arena_model_free(a->m);
	a->m = NULL;
	pthread_mutex_unlock(&a->mu);
}

/* One more reference to a if it is live: 1, else 0 (nothing said). */
static int take_ref(arena *a)
{
	int live = 0;
	if (a) {
		pthread_mutex_lock(&reg_mu);
		live = reg_find(a) != SIZE_MAX;
		if (live)
			a->refs++;
		pthread_mutex_unlock(&reg_mu);
	}
	return live;
}

/* Take a reference to a live handle for a call: 0, or USAGE. */
int arena__enter(const arena *ca)
{
	if (!ca)
		return arena_errorf(ARENA_E_USAGE, "arena: NULL handle");
	if (!take_ref(arena__mut(ca)))
		return arena_errorf(ARENA_E_USAGE, "arena: not an open arena (closed and released, or never opened)");
	return 0;
}

int arena__enter_open(const arena *ca, const char *what)
{
	int rc = arena__enter(ca);
	if (rc)
		return rc;
	arena *a = arena__mut(ca);
	pthread_mutex_lock(&a->mu);
	const int closed = a->closed;
	pthread_mutex_unlock(&a->mu);
	if (closed) {
		arena__leave(a);
		return arena_errorf(ARENA_E_USAGE, "%s: the arena is closed", what);
	}
	return 0;
}

/* Drop a reference; the last frees the arena. */
void arena__leave(const arena *ca)
{
	arena *a = arena__mut(ca);
	int last = 0;
	pthread_mutex_lock(&reg_mu);
	size_t i = reg_find(a);
	if (i != SIZE_MAX && --a->refs == 0) {
		reg[i] = reg[--n_reg];
		last = 1;
		if (!n_reg) { /* no arena left: nothing of the library stays allocated */
			arena_free(reg);
			reg = NULL;
			cap_reg = 0;
		}
	}
	pthread_mutex_unlock(&reg_mu);
	if (last)
		arena_free_all(a);
}

int arena_retain(arena *a)
{
	return arena__enter(a);
}

void arena_release(arena *a)
{
	if (!a)
		return;
	pthread_mutex_lock(&reg_mu);
	int live = reg_find(a) != SIZE_MAX;
	pthread_mutex_unlock(&reg_mu);
	if (live)
		arena__leave(a);
}

void arena_close(arena *a)
{
	if (!take_ref(a)) /* NULL, or gone: nothing to do (and the last error stays) */
		return;
	pthread_mutex_lock(&a->mu);
	int was = a->closed;
	a->closed = 1;
	if (!was) {
		/* The engine's work ends here; resident blocks stay (the model owns them). */
		arena_engine_free(a->e);
		a->e = NULL;
	}
	pthread_mutex_unlock(&a->mu);
	if (!was)
		arena__leave(a); /* the opener's reference */
	arena__leave(a);
}

size_t arena_sizeof(const char *n)
{
	static const struct {
		const char *name;
		size_t size;
	} t[] = {
		{"arena_open_options", sizeof(arena_open_options)}, {"arena_tensor_info", sizeof(arena_tensor_info)},
		{"arena_block_info", sizeof(arena_block_info)},     {"arena_step_info", sizeof(arena_step_info)},
		{"arena_plan_info", sizeof(arena_plan_info)},       {"arena_rest_info", sizeof(arena_rest_info)},
		{"arena_memory_info", sizeof(arena_memory_info)},   {"arena_convert_options", sizeof(arena_convert_options)},
		{"arena_convert_info", sizeof(arena_convert_info)}, {"arena_bad_chunk", sizeof(arena_bad_chunk)},
		{"arena_verify_options", sizeof(arena_verify_options)},
		{"arena_verify_info", sizeof(arena_verify_info)},
		{"arena_share_info", sizeof(arena_share_info)},
		{"arena_decision_info", sizeof(arena_decision_info)},
	};
	for (size_t i = 0; n && i < sizeof(t) / sizeof(t[0]); i++)
		if (!strcmp(t[i].name, n))
			return t[i].size;
	return 0;
}

/* --- open ------------------------------------------------------------------------ */


int arena__engine_opts(const arena_open_options *o, arena_engine_opts *e)
{
	arena_engine_opts_default(e);
	if (o->mode != ARENA_MODE_SAMPLE && o->mode != ARENA_MODE_TRAIN)
		return arena_errorf(ARENA_E_USAGE, "arena_open: mode %d is neither ARENA_MODE_SAMPLE nor ARENA_MODE_TRAIN",
				    o->mode);
	if (o->flags & ~(ARENA_OPEN_STRICT | ARENA_OPEN_NO_LEARN | ARENA_OPEN_FIXED_SCHEDULE | ARENA_OPEN_PLAIN_STREAM |
			 ARENA_OPEN_RELEASE_HOST | ARENA_OPEN_LEARN_REST | ARENA_OPEN_SHARE_HOST))
		return arena_errorf(ARENA_E_USAGE, "arena_open: unknown flags 0x%x", o->flags);
	if (o->depth > 64 || (o->keep_last > 64 && o->keep_last != ARENA_ZERO_COUNT))
		return arena_errorf(ARENA_E_USAGE, "arena_open: depth %u or keep_last %u over 64", o->depth, o->keep_last);
	if (!arena_sim_rate_ok(o->sim_bandwidth))
		return arena_errorf(ARENA_E_USAGE,
				    "arena_open: sim_bandwidth %g is not 0 (as fast as memcpy) or a rate from %g to %g bytes/s",
				    o->sim_bandwidth, ARENA_SIM_RATE_MIN, ARENA_SIM_RATE_MAX);
	e->mode = o->mode;
	e->cap = o->vram_cap;
	if (o->headroom)
		e->headroom = o->headroom == ARENA_ZERO_BYTES ? 0 : o->headroom;
	/* A reserve given is used as it is, short of the engine's own "not learned
	 * yet" (ARENA_ENGINE_REST_UNKNOWN, 2^64 - 2): one byte less is as large. */
	if (o->reserve)
		e->reserve = o->reserve == ARENA_ZERO_BYTES			? 0
			     : o->reserve >= ARENA_ENGINE_REST_UNKNOWN ? ARENA_ENGINE_REST_UNKNOWN - 1
								       : o->reserve;
	e->depth = o->depth; /* 0: the ring's rule chooses (arena_residency_ring) */
	if (o->keep_last)
		e->keep_last = o->keep_last == ARENA_ZERO_COUNT ? 0 : o->keep_last;
	if (o->hysteresis)
		e->hysteresis = o->hysteresis;
	e->payback_steps = o->payback_steps;
	e->strict = !!(o->flags & ARENA_OPEN_STRICT);
	e->no_learn = !!(o->flags & ARENA_OPEN_NO_LEARN);
	e->fixed_schedule = !!(o->flags & ARENA_OPEN_FIXED_SCHEDULE);
	e->release_host = !!(o->flags & ARENA_OPEN_RELEASE_HOST);
	/* a reserve given is used as it is: nothing to learn */
	e->learn_rest = (o->flags & ARENA_OPEN_LEARN_REST) && !o->reserve;
	if (o->share_card_fraction != 0 && !(o->share_card_fraction > 0 && o->share_card_fraction < 1))
		return arena_errorf(ARENA_E_USAGE,
				    "arena_open: share_card_fraction %g is not a fraction of the device above 0 and below 1",
				    o->share_card_fraction);
	if (o->share_card && o->share_card_fraction != 0)
		return arena_errorf(ARENA_E_USAGE, "arena_open: share_card and share_card_fraction both given: give one");
	if ((o->share_card || o->share_card_fraction != 0) && o->vram_cap)
		return arena_errorf(ARENA_E_USAGE,
				    "arena_open: share_card leaves other programs room where arena follows the device's "
				    "free memory (no vram cap); with a vram cap the process holds at most the cap and the "
				    "rest of the card is theirs already: give vram or share_card, not both");
	return 0;
}

/* The bytes share_card leaves free on a device of `total` bytes (0: none). */
static uint64_t share_card_of(const arena_open_options *o, uint64_t total)
{
	if (o->share_card_fraction > 0)
		return (uint64_t)((double)total * o->share_card_fraction);
	if (o->share_card == ARENA_SHARE_CARD_DEFAULT) {
		const uint64_t tenth = total / 10;
		return tenth < (2ull << 30) ? tenth : 2ull << 30;
	}
	return o->share_card;
}

/* What open's place callback needs. */
typedef struct open_ctx {
	arena *a;
	const char *path;
	const char *profile;
	int image, pieces; /* an image; opened in pieces */
	uint64_t host_budget; /* host memory for the weights (UINT64_MAX: no limit; 0: the least) */
	int host_given;       /* the caller chose it */
	uint64_t staging;     /* the stager's most (ARENA_DISK_STAGING), then its share of the budget */
	arena_img_header hdr; /* an image's header (chunk_size 0: not read; the load says why) */
	arena_load_opts *lo;  /* the load's options: its buffers within the staging */
	uint64_t readers;     /* set by place_host: the re-readers' chunk buffers */
	int disk_tier;        /* set by place_host: some streamed blocks stay in the image */
} open_ctx;

/* The host budget is all the host memory the weights take: host copies,
 * and for an image the disk tier's staging (arena_residency_staging: the
 * stager's slots and the re-readers' chunk buffers), which comes out of it
 * whether or not a tier is planned (a block that leaves the device later
 * may join one) and which the load's ring and chunk buffers use before
 * that. Streamed blocks get host copies within the rest; an image's
 * others, spread through the schedule (arena_residency_host_split), stay
 * in the image (the disk tier). A checkpoint cannot be read again: a host
 * budget given too small for it is USAGE. */
static int place_host(open_ctx *c, const arena_layout *l, const arena_residency_plan *p,
		      const uint64_t *host_len, uint64_t region, uint8_t *on_device)
{
	uint64_t want = 0, largest = 0;
	for (size_t b = 0; b < l->n_blocks; b++) {
		if (!on_device[b])
			want += arena_align_up(host_len ? host_len[b] : l->blocks[b].bytes, ARENA_SLAB_ALIGN);
		largest = l->blocks[b].bytes > largest ? l->blocks[b].bytes : largest;
	}
	if (!c->image) {
		if (want <= c->host_budget || !c->host_given)
			return 0; /* as before: the host holds them */
		char s1[32], s2[32];
		return arena_errorf(ARENA_E_USAGE,
				    "%s: the streamed blocks need %s of host memory, the host budget is %s: only an "
				    "image can be read again while streaming (arena convert it)",
				    c->path, arena_size_str(want, s1, sizeof(s1)), arena_size_str(c->host_budget, s2, sizeof(s2)));
	}
	c->readers = arena_slab_reader_buffers(&c->hdr, largest);
	uint8_t *disk = arena_calloc(l->n_blocks ? l->n_blocks : 1, 1);
	if (!disk)
		return arena_errorf(ARENA_E_NOMEM, "out of memory");
	arena_host_plan hp;
	int rc = arena_residency_host_plan(l, p, c->host_budget, c->host_given, arena_residency_stage_slot(l, region),
					   c->staging, c->readers, host_len, disk, &hp);
	if (rc == ARENA_E(BUDGET)) {
		char why[512];
		snprintf(why, sizeof(why), "%s", arena_last_error());
		rc = arena_errorf(rc, "%s: %s", c->path, why);
	}
	if (!rc) {
		c->host_budget = hp.budget;
		c->staging = hp.slots;
		/* the load's own buffers: within what the host copies leave (the
		 * staging at least; the stager comes later) */
		if (hp.budget != UINT64_MAX)
			c->lo->buffers_max = hp.budget - hp.host;
		c->disk_tier = hp.n_disk > 0;
	}
	for (size_t b = 0; !rc && b < l->n_blocks; b++)
		if (disk[b])
			on_device[b] = ARENA_PLACE_DISK;
	arena_free(disk);
	return rc;
}

/* The host budget for streamed blocks' copies: given, or what the memory
 * sources the pinned budget probed allow less its reserve, plus `shared`
 * (host copies another process holds that this one will map: memory the
 * sources no longer count as free). */
static uint64_t host_budget_of(const arena *a, const arena_open_options *o, uint64_t shared)
{
	if (o->host_budget == ARENA_ZERO_BYTES)
		return 0;
	if (o->host_budget)
		return o->host_budget;
	const arena_pin_budget *b = &a->budget;
	uint64_t avail = b->mem_available < b->cgroup_free ? b->mem_available : b->cgroup_free;
	if (avail == UINT64_MAX || avail + shared < avail)
		return UINT64_MAX;
	avail += shared;
	return avail > b->reserve ? avail - b->reserve : 0;
}

/* ARENA_OPEN_SHARE_HOST: the host bytes of the image's region that another
 * process holds complete (0: none, or not an image that opens), which this
 * process maps rather than allocates when its layout is that one's. */
static uint64_t shared_bytes_of(const char *path)
{
	arena_image *img;
	if (arena_img_open(path, &img)) {
		arena_error_clear(); /* the load says what is wrong with it */
		return 0;
	}
	uint64_t id[2];
	arena__image_share_id(&img->hdr, id);
	arena_img_close(img);
	return arena_host_share_image_bytes(id);
}

/* What the process holds on the device before arena allocates anything
 * (the CUDA context, the caller's framework): the backend's figure for the
 * process, or the device's use at most 1 GiB (engine.h: `other`); the
 * engine reads it again at every step end, less the rest as reported. */
static void open_other(arena *a, uint64_t free_b, uint64_t total)
{
	uint64_t proc = 0;
	if (a->be->ops->proc_mem && a->be->ops->proc_mem(a->be, &proc) == 0) {
		a->eo.other = proc;
		return;
	}
	arena_error_clear();
	uint64_t used = total > free_b ? total - free_b : 0;
	a->eo.other = used < (1ull << 30) ? used : 1ull << 30;
}

/* Once the layout is known, before anything is allocated: read the profile
 * (if one is given), plan for the device as it is now, and put on the device
 * what the plan keeps resident. A model that cannot run is BUDGET here. */
static int place(void *ctx, const arena_layout *l, uint64_t stage, const uint64_t *host_len, uint64_t region,
		 uint8_t *on_device)
{
	open_ctx *c = ctx;
	arena *a = c->a;
	arena_engine_opts *o = &a->eo;
	int rc;
	if ((rc = arena_residency_ring(l, c->pieces, o->depth, o))) { /* its depth and least slot */
		char why[512];
		snprintf(why, sizeof(why), "%s", arena_last_error());
		return arena_errorf(rc, "%s: %s", c->path, why);
	}
	if (c->profile) {
		if (!(a->cost = arena_calloc(l->n_blocks ? l->n_blocks : 1, sizeof(*a->cost))))
			return arena_errorf(ARENA_E_NOMEM, "out of memory");
		if ((rc = arena_profile_read(c->profile, l, a->cost, &o->h2d_bytes_per_s, &o->backward_factor)))
			return rc;
		o->cost = a->cost;
	}
	uint64_t free_b = 0, total = 0, budget, headroom, reserve;
	if ((rc = a->be->ops->mem_info(a->be, &free_b, &total)))
		return rc;
	open_other(a, free_b, total);
	arena_residency_budget(total, free_b, o, &budget, &headroom, &reserve);
	/* what the plan leaves free, for the messages: the headroom, or the share
	 * left to other programs when that is more */
	const uint64_t slack = o->share > headroom ? o->share : headroom;
	const char *slack_is = o->share > headroom ? "share_card left free" : "headroom";
	arena_residency_plan p;
	if (o->learn_rest) { /* nothing seen yet: the safe plan (engine.h) */
		uint64_t b0 = budget; /* with no reserve (learn_rest: reserve unknown) */
		budget = arena_residency_budget_unknown(l, o, b0, stage);
		if (!budget) {
			uint64_t need = stage; /* the smallest plan's */
			if (arena_residency_plan_make(l, o, 0, &p) == ARENA_E(BUDGET))
				need = arena_size_add(need, p.min_need_bytes);
			else
				arena_residency_plan_release(&p);
			arena_error_clear();
			char s1[32], s2[32], s3[32], s4[32], s5[32], s6[32];
			const uint64_t dev = arena_size_add(free_b, o->other);
			uint64_t avail = o->cap && o->cap < dev ? o->cap : dev;
			return arena_errorf(ARENA_E(BUDGET),
					    "%s: does not fit: %s %s leaves %s after the process's context (%s) and %s "
					    "(%s); its smallest plan needs %s: give vram of at least %s, plus what torch "
					    "needs at its peak in a step",
					    c->path, o->cap && o->cap <= dev ? "vram" : "the device's free",
					    arena_size_str(avail, s1, sizeof(s1)), arena_size_str(b0, s2, sizeof(s2)),
					    arena_size_str(o->other, s3, sizeof(s3)), slack_is,
					    arena_size_str(slack, s4, sizeof(s4)), arena_size_str(need, s5, sizeof(s5)),
					    arena_size_arg(arena_size_add(need, arena_size_add(o->other, slack)), s6, sizeof(s6)));
		}
	}
	rc = arena_residency_plan_staged(l, o, &budget, stage, &p); /* streaming coded takes stages too */
	if (!rc && p.need_bytes + arena_residency_plan_rounding(l, &p, a->be->alloc_granularity) > budget) {
		arena_residency_plan_release(&p); /* as the device allocates it (cuda: in 2 MiB units) */
		rc = arena_residency_plan_rounded(l, o, a->be->alloc_granularity, budget, &p);
	}
	if (rc == ARENA_E(BUDGET)) {
		char why[512], s1[32], s2[32], s3[32], s4[32];
		snprintf(why, sizeof(why), "%s", arena_last_error());
		uint64_t avail = o->cap && o->cap < free_b ? o->cap : free_b, fit = 0;
		char hint[256] = "", s5[32];
		char s6[32];
		if (!c->pieces && c->image && arena_residency_piece_fit(l, o, budget, &fit) == 0 && fit)
			snprintf(hint, sizeof(hint), "; in pieces of %s it runs (piece_size, --piece-size %s)",
				 arena_size_str(fit, s5, sizeof(s5)), arena_size_arg(fit, s6, sizeof(s6)));
		if (stage) { /* the smallest plan streams: its coded copies' stages come on top */
			size_t k = strlen(hint);
			snprintf(hint + k, sizeof(hint) - k,
				 "; that includes %s of device stages for streaming this hb4 image coded "
				 "(ARENA_OPEN_PLAIN_STREAM, plain_stream=True or ARENA_PLAIN_STREAM=1: raw host copies, no stages)",
				 arena_size_str(stage, s5, sizeof(s5)));
		}
		arena_error_clear();
		char cx[64] = ""; /* the process's own, when it has any */
		if (o->other)
			snprintf(cx, sizeof(cx), ", the process's context of %s,", arena_size_str(o->other, s6, sizeof(s6)));
		return arena_errorf(rc,
				    "%s: does not fit: %s; with a working reserve of %s%s and %s of %s it needs %s of "
				    "device memory, %s is %s%s",
				    c->path, why, arena_size_str(reserve, s1, sizeof(s1)), cx, slack_is,
				    arena_size_str(slack, s2, sizeof(s2)),
				    arena_size_str(arena_size_add(arena_size_add(p.min_need_bytes, stage),
								  arena_size_add(arena_size_add(reserve, slack), o->other)),
						   s3, sizeof(s3)),
				    arena_size_str(avail, s4, sizeof(s4)), o->cap && o->cap <= free_b ? "the cap" : "free", hint);
	}
	if (rc)
		return rc;
	memcpy(on_device, p.resident, l->n_blocks);
	rc = place_host(c, l, &p, host_len, region, on_device);
	arena_residency_plan_release(&p);
	return rc;
}

/* piece_size ARENA_PIECE_AUTO: what the image's whole-block layout needs
 * under the budget the device gives now (arena_residency_piece_auto). With
 * the rest's need to be learned (learn_rest), that budget is a share of what
 * there is: sampling keeps whole blocks only when they all fit in half of it
 * (then they are all resident from the first step: engine.h's safe plan);
 * training when their floor fits in a third (two fifths when the image
 * streams coded). On the H200 (FLUX.1-dev, 1024x1024, LoRA) the
 * whole-block floor is 2.85 GB, a ring of four 648 MiB blocks: at vram 6G
 * it left torch's 2.60 GiB no room (6.04 GiB peak, 2026-12-03). At 8G,
 * where it is over half of the weights' budget, a plain image trained in
 * 128 MiB pieces (a ring of 1.06 GB) at 0.855-0.866 s a step against
 * 0.912 s in whole blocks (1.021-1.031 and 1.050 x their limits), but an
 * hb4 image, streamed coded, at 0.817 s in pieces against 0.794 s in whole
 * blocks (its pieces' decodes cost more than the ring saves); at 12G whole
 * blocks trained at 0.774 s against 0.826 in pieces (2026-12-04). Pieces
 * otherwise, whose floor leaves the rest far more. */
static int auto_piece(arena *a, const char *path, int coded_stream, uint64_t *piece)
{
	*piece = 0;
	arena_image *img;
	int rc = arena_img_open(path, &img);
	if (rc)
		return rc;
	uint64_t free_b = 0, total = 0, budget, headroom, reserve;
	if (!(rc = a->be->ops->mem_info(a->be, &free_b, &total))) {
		open_other(a, free_b, total);
		arena_engine_opts q = a->eo;
		if (q.learn_rest)
			q.reserve = 0;
		arena_residency_budget(total, free_b, &q, &budget, &headroom, &reserve);
		const int coded = coded_stream && (img->hdr.flags & ARENA_IMG_FLAG_CODED);
		if (q.learn_rest)
			budget = arena_residency_piece_auto_share(q.mode, coded, budget);
		rc = arena_residency_piece_auto(img->layout, &a->eo, budget, piece);
	}
	arena_img_close(img);
	return rc;
}

int arena__open_tuned(const char *path, const arena_open_options *opt, const arena_load_opts *tune, arena **out,
		      arena_load_stats *st, volatile sig_atomic_t *cancel)
{
	static const arena_open_options defaults = {0};
	const arena_open_options *o = opt ? opt : &defaults;
	*out = NULL;
	if (!path)
		return arena_errorf(ARENA_E_USAGE, "arena_open: NULL path");
	arena *a = arena_calloc(1, sizeof(*a));
	if (!a)
		return arena_errorf(ARENA_E_NOMEM, "out of memory");
	int rc;
	if (pthread_mutex_init(&a->mu, NULL)) {
		arena_free(a);
		return arena_errorf(ARENA_E_NOMEM, "arena_open: cannot make a lock");
	}
	a->mu_init = 1;
	a->refs = 1;
	if (!(a->path = arena_strdup(path))) {
		rc = arena_errorf(ARENA_E_NOMEM, "out of memory");
		goto fail;
	}
	if ((rc = arena__engine_opts(o, &a->eo)))
		goto fail;
	uint64_t simcap = o->sim_capacity ? o->sim_capacity : o->vram_cap > (16ull << 30) ? o->vram_cap : (16ull << 30);
	arena_sim_opts so = {.capacity = simcap, .h2d_bytes_per_s = o->sim_bandwidth, .context = o->sim_context};
	if (!o->backend) {
		rc = arena_backend_create("cuda", o->device, NULL, &a->be);
		if (rc == ARENA_E_NO_DEVICE)
			rc = arena_backend_create("sim", 0, &so, &a->be);
	} else {
		rc = arena_backend_create(o->backend, o->device, &so, &a->be);
	}
	if (rc)
		goto fail;
	if (o->share_card || o->share_card_fraction > 0) {
		uint64_t free_b, total;
		if ((rc = a->be->ops->mem_info(a->be, &free_b, &total)))
			goto fail;
		a->eo.share = share_card_of(o, total);
	}
	a->is_image = arena_img_sniff(path);
	if (a->is_image && o->quant) {
		rc = arena_errorf(ARENA_E_USAGE, "%s: a quantization scheme applies to safetensors inputs; an image keeps the layout it was converted with",
				  path);
		goto fail;
	}
	if (!a->is_image && (o->flags & ARENA_OPEN_SHARE_HOST)) {
		rc = arena_errorf(ARENA_E_USAGE,
				  "%s: sharing host copies between processes (ARENA_OPEN_SHARE_HOST, share_host) needs an "
				  "arena image, whose checksums name its bytes: arena convert it",
				  path);
		goto fail;
	}
	arena_pin_budget_probe(&a->budget, o->pin_budget, ARENA_PIN_RESERVE_AUTO, "");
	/* Host copies another process of the host holds for this image: mapped,
	 * not allocated, and pinned in place; the free memory the budgets were
	 * probed from no longer counts them. */
	const uint64_t shared = a->is_image && (o->flags & ARENA_OPEN_SHARE_HOST) ? shared_bytes_of(path) : 0;
	if (shared && !o->pin_budget && a->budget.limit + shared > a->budget.limit &&
	    a->budget.memlock > a->budget.limit + shared) /* never past RLIMIT_MEMLOCK */
		a->budget.limit += shared;
	arena_quant_opts q = {.scheme = o->quant};
	arena_load_opts lo = {.threads = o->threads, .io = ARENA_IO_AUTO};
	if (tune)
		lo = *tune;
	uint64_t piece = o->piece_size; /* "auto": chosen for an image, whole blocks for a checkpoint */
	if (piece == ARENA_PIECE_AUTO && !a->is_image)
		piece = 0;
	const char *ps = getenv("ARENA_PLAIN_STREAM"); /* for measuring: 1 = raw host copies */
	const int coded_stream = !(o->flags & ARENA_OPEN_PLAIN_STREAM) && !(ps && strcmp(ps, "0"));
	if (piece == ARENA_PIECE_AUTO && (rc = auto_piece(a, path, coded_stream, &piece)))
		goto fail;
	a->piece_size = piece;
	a->depth = o->depth;
	/* For measuring: the disk tier's parts and staging, reads on the
	 * caller's thread (ARENA_DISK_READAHEAD=0), through the page cache only
	 * (ARENA_DISK_IO=buffered; default: what it holds from it, the rest
	 * O_DIRECT). */
	const char *dp = getenv("ARENA_DISK_PART"), *dr = getenv("ARENA_DISK_READAHEAD"), *dio = getenv("ARENA_DISK_IO");
	uint64_t dpv;
	if (dp && arena_size_parse(dp, &dpv) == 0)
		arena__disk_part = dpv;
	arena_error_clear();
	open_ctx pc = {.a = a,
		       .path = path,
		       .profile = o->profile,
		       .image = a->is_image,
		       .pieces = piece != 0,
		       .host_budget = host_budget_of(a, o, shared),
		       .host_given = o->host_budget != 0,
		       .staging = arena_engine_disk_staging(),
		       .lo = &lo};
	if (a->is_image && arena_img_read_header(path, &pc.hdr)) { /* the load says what is wrong with it */
		arena_error_clear();
		pc.hdr.chunk_size = 0;
	}
	lo.backend = a->be;
	lo.budget = &a->budget;
	lo.cancel = cancel;
	lo.quant = o->quant ? &q : NULL;
	lo.on_device = NULL;
	lo.place = place;
	lo.place_ctx = &pc;
	lo.piece_bytes = piece;
	lo.coded_stream = coded_stream;
	lo.share_host = !!(o->flags & ARENA_OPEN_SHARE_HOST);
	rc = a->is_image ? arena_load_image(path, &lo, &a->m, st) : arena_load_safetensors(&path, 1, NULL, &lo, &a->m, st);
	if (rc)
		goto fail;
	/* An image's blocks can be read again, so resident ones may leave the
	 * device under pressure; a checkpoint's device blocks stay. */
	if (a->is_image && (rc = arena_slab_reader_open_pieces(path, a->m->layout, piece, &a->rr)))
		goto fail;
	a->eo.reread = a->rr ? arena_slab_reader_read : NULL;
	a->eo.reread_part = a->rr ? arena_slab_reader_read_part : NULL;
	a->eo.reread_wire = a->rr ? arena_slab_reader_read_wire : NULL;
	a->eo.disk_staging = pc.staging; /* the stager's share of the budget (place_host) */
	a->eo.disk_sync = dr && !strcmp(dr, "0");
	if (a->rr && !(dio && !strcmp(dio, "buffered")))
		arena_slab_reader_direct(a->rr);
	arena_error_clear();
	a->eo.reread_ctx = a->rr;
	/* Demotions keep the host budget too: host copies within it less the
	 * staging (beyond it a block stays in the image). */
	const uint64_t cap = a->rr ? arena_residency_host_copies(pc.host_budget, pc.staging + pc.readers) : pc.host_budget;
	a->eo.host_cap = a->rr && cap != UINT64_MAX ? (cap ? cap : 1) : 0;
	a->host_budget = pc.host_budget == UINT64_MAX ? 0 : pc.host_budget;
	a->staging = a->rr ? pc.staging + pc.readers : 0;
	if ((rc = arena_engine_create(a->m, &a->eo, &a->e)))
		goto fail;
	if ((rc = reg_add(a)))
		goto fail;
	*out = a;
	return 0;
fail:
	arena_free_all(a);
	return rc;
}

int arena_open(const char *path, const arena_open_options *opt, arena **out)
{
	if (!out)
		return arena_errorf(ARENA_E_USAGE, "arena_open: NULL out");
	return arena__open_tuned(path, opt, NULL, out, NULL, NULL);
}

/* --- blocks and tensors ---------------------------------------------------------
 * The layout never changes; where a block is does (step_end, set_mode), so
 * those read under the arena's lock. */

const char *arena_backend_name(const arena *a)
{
	if (arena__enter_open(a, "arena_backend_name"))
		return NULL;
	const char *n = a->be->ops->name;
	arena__leave(a);
	return n;
}

size_t arena_block_count(const arena *a)
{
	if (arena__enter_open(a, "arena_block_count"))
		return 0;
	size_t n = a->m->layout->n_blocks;
	arena__leave(a);
	return n;
}

/* Is block b on the device for good now? (a->mu held) */
static int resident(const arena *a, size_t b)
{
	return a->m->mem[b].dev && (!a->e || arena_engine_is_resident(a->e, (uint32_t)b));
}

int arena_block_get(const arena *ca, size_t i, arena_block_info *out)
{
	int rc = arena__enter_open(ca, "arena_block_get");
	if (rc)
		return rc;
	arena *a = arena__mut(ca);
	const arena_layout *l = a->m->layout;
	if (!out)
		rc = arena_errorf(ARENA_E_USAGE, "arena_block_get: NULL out");
	else if (i >= l->n_blocks)
		rc = arena_errorf(ARENA_E_USAGE, "block index %zu is out of range (%zu blocks)", i, l->n_blocks);
	if (!rc) {
		const arena_block *b = &l->blocks[i];
		pthread_mutex_lock(&a->mu);
		*out = (arena_block_info){.name = b->name,
					  .container = b->container,
					  .index = b->container ? b->index : -1,
					  .bytes = b->bytes,
					  .resident = resident(a, i),
					  .host = a->m->mem[i].host,
					  .coded = a->m->mem[i].wire != NULL};
		out->device = out->resident ? a->m->mem[i].dev : NULL;
		pthread_mutex_unlock(&a->mu);
	}
	arena__leave(a);
	return rc;
}

int arena_block_find(const arena *a, const char *name, size_t *index)
{
	int rc = arena__enter_open(a, "arena_block_find");
	if (rc)
		return rc;
	const arena_layout *l = a->m->layout;
	rc = arena_errorf(ARENA_E_NOT_FOUND, "no block '%s' in this arena", arena_q(name ? name : "(null)"));
	for (size_t b = 0; name && index && b < l->n_blocks; b++)
		if (!strcmp(l->blocks[b].name, name)) {
			*index = b;
			arena_error_clear();
			rc = 0;
			break;
		}
	if (!index)
		rc = arena_errorf(ARENA_E_USAGE, "arena_block_find: NULL index");
	arena__leave(a);
	return rc;
}

const char *arena_block_name(const arena *a, size_t i)
{
	if (arena__enter_open(a, "arena_block_name"))
		return NULL;
	const char *n = i < a->m->layout->n_blocks ? a->m->layout->blocks[i].name : NULL;
	arena__leave(a);
	return n;
}

void *arena_block_device(const arena *ca, size_t i)
{
	if (arena__enter_open(ca, "arena_block_device"))
		return NULL;
	arena *a = arena__mut(ca);
	void *d = NULL;
	pthread_mutex_lock(&a->mu);
	if (i < a->m->layout->n_blocks && resident(a, i))
		d = a->m->mem[i].dev;
	pthread_mutex_unlock(&a->mu);
	arena__leave(a);
	return d;
}

uint64_t arena_block_bytes(const arena *a, size_t i)
{
	if (arena__enter_open(a, "arena_block_bytes"))
		return 0;
	uint64_t n = i < a->m->layout->n_blocks ? a->m->layout->blocks[i].bytes : 0;
	arena__leave(a);
	return n;
}

size_t arena_tensor_count(const arena *a)
{
	if (arena__enter_open(a, "arena_tensor_count"))
		return 0;
	size_t n = a->m->layout->n_tensors;
	arena__leave(a);
	return n;
}

int arena_tensor_get(const arena *ca, size_t i, arena_tensor_info *out)
{
	int rc = arena__enter_open(ca, "arena_tensor_get");
	if (rc)
		return rc;
	arena *a = arena__mut(ca);
	const arena_layout *l = a->m->layout;
	if (!out)
		rc = arena_errorf(ARENA_E_USAGE, "arena_tensor_get: NULL out");
	else if (i >= l->n_tensors)
		rc = arena_errorf(ARENA_E_USAGE, "tensor index %zu is out of range (%zu tensors)", i, l->n_tensors);
	if (rc) {
		arena__leave(a);
		return rc;
	}
	const arena_tensor *t = &l->tensors[i];
	memset(out, 0, sizeof(*out));
	out->name = t->name;
	out->dtype = arena_dtype_name(t->dtype);
	out->rank = t->rank;
	out->shape = t->shape;
	out->scheme = t->scheme;
	out->block = t->block;
	out->n_components = t->n_comp;
	pthread_mutex_lock(&a->mu);
	uint8_t *base = resident(a, t->block) ? a->m->mem[t->block].dev : NULL;
	const uint8_t *host = a->m->mem[t->block].host;
	pthread_mutex_unlock(&a->mu);
	for (uint32_t c = 0; c < t->n_comp && c < 4; c++) {
		out->component[c].name = t->comp[c].name;
		out->component[c].dtype = arena_dtype_name(t->comp[c].dtype);
		out->component[c].rank = t->comp[c].rank;
		out->component[c].shape = t->comp[c].shape;
		out->component[c].bytes = t->comp[c].bytes;
		out->component[c].offset = t->comp[c].offset;
		out->component[c].device = base ? base + t->comp[c].offset : NULL;
		out->component[c].host = host ? host + t->comp[c].offset : NULL;
	}
	arena__leave(a);
	return 0;
}

const char *arena_tensor_subclass(const arena *a, size_t i)
{
	if (arena__enter_open(a, "arena_tensor_subclass"))
		return NULL;
	const char *s = i < a->m->layout->n_tensors ? a->m->layout->tensors[i].subclass : NULL;
	arena__leave(a);
	return s;
}

int arena_tensor_find(const arena *a, const char *name, size_t *index)
{
	int rc = arena__enter_open(a, "arena_tensor_find");
	if (rc)
		return rc;
	const arena_tensor *t = name ? arena_layout_find(a->m->layout, name) : NULL;
	if (!index)
		rc = arena_errorf(ARENA_E_USAGE, "arena_tensor_find: NULL index");
	else if (!t)
		rc = arena_errorf(ARENA_E_NOT_FOUND, "no tensor '%s' in this arena", arena_q(name ? name : "(null)"));
	else
		*index = (size_t)(t - a->m->layout->tensors);
	arena__leave(a);
	return rc;
}
