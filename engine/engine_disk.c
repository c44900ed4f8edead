/* engine_disk.c - the disk tier: blocks with neither a device nor a host
 * copy, read from their image by the stager (stager.h) ahead of their
 * copies, in parts, and copied from its staging slots; and the host budget
 * (o.host_cap) that decides which blocks join it. docs/DESIGN.md tells the
 * tier's story.
 *
 * Invariants:
 *   1. A block is in the tier (arena__engine_on_disk) when it has bytes and
 *      no device copy, no host slab and no coded host copy. It is never lost
 *      (engine.h invariant 1): o.reread reads it, its chunks checked, and
 *      create refuses a model with such a block and no reread.
 *   2. A host copy is made only within the host budget
 *      (arena__engine_past_host_budget); a block that would pass it stays
 *      in the tier.
 *   3. A staging slot goes back to the stager (arena_stager_put) only after
 *      the event recorded after its copies (and a coded part's decodes) on
 *      the fill stream; when a copy from it fails, both streams are synced
 *      first. The stager's thread reads into a slot again only once that
 *      event is done.
 *   4. The stager is told the parts in the order the engine will copy them
 *      (disk_want): this block's, then those of the disk blocks the
 *      schedule streams next, at most a step ahead, up to twice as many
 *      parts as it has slots.
 *   5. The stager's thread and ensure_host (engine_moves.c) read the same
 *      source: ensure_host holds the stager's lock while it reads.
 *   6. The stager's slots, two at least, are within o.disk_staging, which
 *      host copies never take (host_cap is the host budget less it): with
 *      a host budget the weights' host memory stays within it
 *      (arena__engine_disk_init). */
#include "engine_int.h"

#include <stdio.h>
#include <stdlib.h>

#include "../common/alloc.h"
#include "../common/clock.h"
#include "../common/err.h"
#include "../common/units.h"

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

/* The disk tier's parts of block b: its bytes in parts of disk_part()
 * (whole without reread_part), or the whole block coded; n of them at most
 * into p; returns how many it has. */
static size_t disk_parts_of(const arena_engine *e, uint32_t b, arena_stage_part *p, size_t n)
{
	const uint64_t sz = e->l->blocks[b].bytes;
	const arena_wire *w = arena__engine_disk_coded(e, b);
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

/* A stager slot: as large as a part (a block without reread_part: the
 * block) or a coded region, whichever is larger, of any block (a block may
 * join the tier later); 4096-aligned. arena_residency_stage_slot is the
 * raw part of it. *coded: some block is read coded. */
static uint64_t stage_slot(const arena_engine *e, int *coded)
{
	uint64_t slot = 0;
	*coded = 0;
	for (uint32_t b = 0; b < e->l->n_blocks; b++) {
		const arena_wire *w = arena__engine_disk_coded(e, b);
		const uint64_t sz = e->l->blocks[b].bytes;
		uint64_t need = e->o.reread_part && disk_part() < sz ? disk_part() : sz;
		const uint64_t region = arena_wire_region_most(w); /* its coded parts' room (a region may pass a part) */
		need = region > need ? region : need;
		slot = need > slot ? need : slot;
		*coded |= w != NULL;
	}
	return arena_align_up(slot ? slot : 1, 4096);
}

/* The staging the stager may take: o.disk_staging (default
 * ARENA_ENGINE_DISK_STAGING). */
static uint64_t staging_of(const arena_engine *e)
{
	return e->o.disk_staging ? e->o.disk_staging : ARENA_ENGINE_DISK_STAGING;
}

int arena__engine_disk_init(arena_engine *e)
{
	if (!e->o.reread || !e->o.host_cap)
		return 0;
	int coded;
	const uint64_t slot = stage_slot(e, &coded), staging = staging_of(e);
	if (staging / slot >= 2)
		return 0;
	/* Two slots at least: what the staging lacks for them comes out of the
	 * host copies' room (the budget holds both). */
	const uint64_t more = 2 * slot - staging;
	if (e->o.host_cap <= more || e->m->host_bytes > e->o.host_cap - more) {
		char s1[32], s2[32], s3[32];
		return arena_errorf(ARENA_E(BUDGET),
				    "the disk tier's reads need 2 staging slots of %s (a part or a coded region), %s more "
				    "than the host budget leaves beside the host copies (%s)",
				    arena_size_str(slot, s1, sizeof(s1)), arena_size_str(more, s2, sizeof(s2)),
				    arena_size_str(e->m->host_bytes, s3, sizeof(s3)));
	}
	e->o.host_cap -= more;
	e->o.disk_staging = 2 * slot;
	return 0;
}

/* The stager, made at the first disk-tier copy: slots of stage_slot, as
 * many as the staging holds (the host budget's share for it,
 * arena_residency_staging; two at least: arena__engine_disk_init) and the
 * tier's blocks fill. */
static int stager_up(arena_engine *e)
{
	if (e->stg)
		return 0;
	int coded;
	const uint64_t slot = stage_slot(e, &coded);
	uint64_t on = 0; /* the slots need not hold more than the tier's blocks */
	for (uint32_t b = 0; b < e->l->n_blocks; b++) {
		const arena_wire *w = arena__engine_disk_coded(e, b);
		on += arena__engine_on_disk(e, b) ? (w ? w->cap : e->l->blocks[b].bytes) : 0;
	}
	uint64_t n = staging_of(e) / slot, most = (on + slot - 1) / slot;
	n = n > most ? most : n;
	n = n < 2 ? 2 : n > ARENA_STAGER_MAX_SLOTS ? ARENA_STAGER_MAX_SLOTS : n;
	if (coded && !e->disk_plans) {
		if (!(e->disk_plans = arena_calloc(e->l->n_blocks, sizeof(*e->disk_plans))))
			return arena_errorf(ARENA_E_NOMEM, "out of memory for the disk tier");
		for (uint32_t b = 0; b < e->l->n_blocks; b++)
			e->disk_plans[b] = arena__engine_disk_coded(e, b);
	}
	arena_stager_src src = {.whole = e->o.reread,
				.part = e->o.reread_part,
				.wire = e->o.reread_wire,
				.ctx = e->o.reread_ctx,
				.plans = e->disk_plans,
				.l = e->l};
	return arena_stager_create(e->be, e->m->budget, &src, slot, (unsigned)n, !e->o.disk_sync, &e->stg);
}

/* Parts of the disk tier's list (arena__engine_disk_parts): a block's, and
 * those after it. */
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
		const uint32_t q = arena__engine_seq_at(e, j);
		if (q != b && arena__engine_on_disk(e, q))
			n += disk_parts_of(e, q, p + n, DISK_MAXP - n);
	}
	return arena_stager_want(e->stg, p, n < DISK_MAXP ? n : DISK_MAXP);
}

/* The disk tier: block b's parts taken from the stager as they are read
 * (ahead of now, usually) and copied to dst on the copy stream; a coded
 * block (an hb4 image) is copied coded and decoded on the device. Each
 * slot is read into again once its copies (and decodes) are done. */
int arena__engine_disk_parts(arena_engine *e, uint32_t b, uint8_t *dst, arena_stream **fill)
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
			if (!(rc = arena__engine_send_wire(e, w, dst, fill)))
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
	if (!rc && arena__engine_disk_coded(e, b))
		e->m->mem[b].disk_wire->stored = stored; /* what its copies move */
	if (!rc)
		e->rec.disk_bytes += stored;
	return rc;
}

/* The host bytes a copy of block b takes: its slab, or an hb4 disk tier's
 * coded form. */
uint64_t arena__engine_host_copy_bytes(const arena_engine *e, uint32_t b)
{
	const arena_wire *plan = arena__engine_disk_coded(e, b);
	return arena_align_up(plan ? plan->cap : e->l->blocks[b].bytes, ARENA_SLAB_ALIGN);
}

/* A host copy of block b, with `more` host bytes taken first, would go over
 * the host budget: it stays in its image (the disk tier). */
int arena__engine_past_host_budget(const arena_engine *e, uint32_t b, uint64_t more)
{
	return e->o.reread && e->o.host_cap &&
	       e->m->host_bytes + more + arena__engine_host_copy_bytes(e, b) > e->o.host_cap;
}

/* The stager (its thread stopped; the caller has synced the streams its
 * slots' copies were on) and the coded plans it read by. */
void arena__engine_disk_free(arena_engine *e)
{
	arena_stager_free(e->stg);
	arena_free(e->disk_plans);
}
