/* engine_copy.c - a block's copy to the device: from its host slab on the
 * copy stream, from a host copy held coded (an hb4 image) through device
 * stages and decoded there, or from its image (the disk tier,
 * engine_disk.c). Coded streaming is described at struct arena_engine's
 * `ds` (engine_int.h) and in docs/DESIGN.md.
 *
 * Invariants:
 *   1. A copy's fill stream (*fill) is the one its last work is queued on:
 *      the copy stream, or the decode stream ds for a coded copy (ds first
 *      waits for its plain segments' copies: wx). The caller records the
 *      block's fill event there; nothing reads the destination before that
 *      event (engine.h invariant 2).
 *   2. Stage k is copied into only after the decodes from it are done (the
 *      copy stream waits for wdec[k]) and decoded from only after its copy
 *      (ds waits for wcp[k]); the stages are used round robin.
 *   3. The stages exist (wstage) only while something streams coded; their
 *      bytes come out of the weights budget at create and at every budget
 *      read between steps (engine_plan.c), beside the ring.
 *   4. moved[b] (o.moved, the timed planner's copy sizes) is what a copy of
 *      b moves over the bus: its coded size when held or read coded, else
 *      its bytes; set at create and when b gets a host copy. */
#include "engine_int.h"

#include "../common/alloc.h"
#include "../common/err.h"
#include "../common/units.h"

/* Bytes a copy of block b moves: its coded form's when it is held or read coded. */
uint64_t arena__engine_moved_bytes(const arena_engine *e, uint32_t b)
{
	const arena_wire *w = e->m->mem[b].wire, *d = arena__engine_disk_coded(e, b);
	if (w)
		return w->stored;
	if (d) /* read coded: what the last read held, or at most its room */
		return d->stored ? d->stored : d->cap;
	return e->l->blocks[b].bytes;
}

/* Queue the copy of block b to dst (its device slab or ring slot): from
 * src (raw host bytes) on the copy stream, or, held coded, segment by
 * segment as above. *fill is the stream the block's fill event goes on. */
int arena__engine_send(arena_engine *e, uint32_t b, uint8_t *dst, const uint8_t *src, arena_stream **fill)
{
	arena_backend *be = e->be;
	const arena_wire *w = e->m->mem[b].wire;
	*fill = e->cs;
	if (!w && !src && e->l->blocks[b].bytes)
		return arena__engine_disk_parts(e, b, dst, fill);
	if (!w)
		return e->l->blocks[b].bytes ? be->ops->copy_h2d(be, dst, src, e->l->blocks[b].bytes, e->cs) : 0;
	return arena__engine_send_wire(e, w, dst, fill);
}

/* The copy of a coded form w to dst (see arena__engine_send). */
int arena__engine_send_wire(arena_engine *e, const arena_wire *w, uint8_t *dst, arena_stream **fill)
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

/* Where the bytes of block b are in host memory for a copy: its host slab,
 * or NULL (held coded: arena__engine_send copies its coded form; in the
 * image only: it reads it through the staging buffers). */
int arena__engine_host_src(const arena_engine *e, uint32_t b, const uint8_t **src)
{
	*src = e->m->mem[b].host;
	if (arena__engine_on_disk(e, b) && !e->o.reread)
		return arena_errorf(ARENA_E_INTERNAL, "block '%s' has no host copy and no source to re-read",
				    e->l->blocks[b].name);
	return 0;
}

/* At create: when something streams coded, the stages its copies go
 * through (their device bytes out of *budget, which the plan leaves room
 * for), the decode stream and the events that order them, and moved[]
 * (o.moved). Nothing to undo here on failure: arena__engine_wire_free. */
int arena__engine_wire_init(arena_engine *e, const arena_engine_opts *o, uint64_t *budget)
{
	arena_backend *be = e->be;
	const arena_model *m = e->m;
	const arena_layout *l = e->l;
	int rc;
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
	if (!e->wstage_each)
		return 0;
	if (!(e->moved = arena_calloc(l->n_blocks, sizeof(*e->moved))))
		return arena_errorf(ARENA_E_NOMEM, "engine: out of memory");
	e->wstage_each = arena_wire_stage_each(e->wstage_each);
	uint64_t st = arena__engine_wire_stage_bytes(e) + arena__engine_gran_loss(be, arena__engine_wire_stage_bytes(e));
	*budget = *budget > st ? *budget - st : 0;
	if ((rc = be->ops->dev_alloc(be, arena__engine_wire_stage_bytes(e), (void **)&e->wstage)) ||
	    (rc = (be->ops->stream_create_urgent ? be->ops->stream_create_urgent : be->ops->stream_create)(be, &e->ds)) ||
	    (rc = be->ops->event_create(be, &e->wx)))
		return rc;
	for (unsigned k = 0; k < ENGINE_WIRE_STAGES; k++)
		if ((rc = be->ops->event_create(be, &e->wcp[k])) || (rc = be->ops->event_create(be, &e->wdec[k])))
			return rc;
	for (size_t b = 0; b < l->n_blocks; b++) /* (the stages are there: arena__engine_disk_coded) */
		e->moved[b] = arena__engine_moved_bytes(e, (uint32_t)b);
	e->o.moved = e->moved;
	return 0;
}

/* The stages, the decode stream, their events, moved[]. */
void arena__engine_wire_free(arena_engine *e)
{
	arena_backend *be = e->be;
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
	arena_free(e->moved);
}
