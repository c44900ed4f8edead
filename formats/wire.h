/* wire.h - a streamed block's bytes kept coded in host memory (coded
 * streaming; docs/FORMAT.md, "Coded streaming").
 *
 * The engine copies a streamed block to the device every time it is used.
 * When the block's chunks are hb4-coded in its image, its host copy can
 * keep them coded: the copy then moves about three quarters of the bytes
 * and the device decodes them into the ring slot (backend decode_hb4)
 * before the block is handed out.
 *
 * A block's wire form is a list of segments that cover its raw bytes in
 * order: an hb4 segment is a chunk of its own (arena_hb4_sub) for the part
 * of one hb4 chunk the block holds, its start a multiple of 4 bytes into
 * the chunk and its length even; a plain segment holds raw bytes (parts of
 * plain or zstd chunks, and the few bytes at a block's edges that an hb4
 * segment cannot start or end on), contiguous ones merged. A chunk that
 * straddles two blocks is split between them: each keeps its own part, so
 * nothing is moved twice. The plan is made from the chunk table alone
 * (room for every exception of the chunk); the loader fills the segments
 * from the chunk's checked stored bytes. A chunk's part may be cut into
 * several hb4 segments (arena__wire_seg_max), which share one region of
 * the buffer with room for the chunk's exceptions once. */
#ifndef ARENA_FORMATS_WIRE_H
#define ARENA_FORMATS_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "codec.h"
#include "image.h"

typedef struct arena_wire_seg {
	uint64_t dst, raw;  /* raw bytes [dst, dst + raw) of the block */
	uint64_t src, cap;  /* its stored bytes' place in the wire buffer, and the room there */
	uint64_t chunk;     /* hb4: the image chunk, and the segment's raw start in it */
	uint64_t coff;
	unsigned codec;     /* ARENA_CODEC_NONE (raw bytes) or ARENA_CODEC_HB4 */
	int filled;         /* hb4: written (v holds its counts and offsets) */
	int first;          /* hb4: the first of its chunk's part; cap is the part's region:
			     * the others follow it there (their src is set when filled) */
	arena_hb4 v;        /* hb4: the sub-chunk, plane pointers into the buffer */
} arena_wire_seg;

typedef struct arena_wire {
	arena_wire_seg *seg;
	size_t n;
	uint8_t *buf;       /* cap bytes of host memory (the model's) */
	uint64_t cap;       /* room of all segments */
	uint64_t stored;    /* bytes a copy moves: known once filled (arena_wire_seal) */
	uint64_t max_stage; /* the largest hb4 segment's stored bytes (arena_wire_seal): the
			     * device stage a copy needs */
	uint64_t n_hb4;     /* hb4 segments */
	uint64_t most;      /* the most an hb4 segment can store (all its chunk's exceptions
			     * in it): a stage that holds it holds any filling */
} arena_wire;

/* Segments of raw data bytes [off, off + bytes) of an image with this chunk
 * table. *out is NULL when keeping them coded would save less than 5 % of
 * the bytes (no hb4 chunk there, or too many exceptions). NOMEM. */
int arena_wire_plan(const arena_img_chunk *chunks, uint64_t n_chunks, uint64_t chunk_size, uint64_t off,
		    uint64_t bytes, arena_wire **out);
void arena_wire_free(arena_wire *w);
/* arena_wire_plan for every block of l (the image's chunk table; l may be
 * the image's blocks in pieces): plans[b] the plan or NULL (plans may be
 * NULL: none kept), host_len[b] (may be NULL) what block b's host copy
 * takes, its coded room or its slab's bytes. NOMEM; the plans made before
 * a failure stay in plans, the caller's to free. */
int arena_wire_plans(const arena_image *img, const arena_layout *l, arena_wire **plans, uint64_t *host_len);

/* hb4 segments hold at most this many raw bytes (a multiple of 4; 0: a
 * chunk's part whole). The device stages are as large as the largest
 * segment's room; tests set it to see small models streamed coded. The
 * loader takes it from ARENA_WIRE_SEGMENT when set (for measuring). */
extern uint64_t arena__wire_seg_max;

/* ARENA_WIRE_SEGMENT and ARENA_WIRE_POOL, when set, into
 * arena__wire_seg_max and arena__wire_stage_pool (for measuring; arena_open
 * and `arena plan` read them). */
void arena_wire_env(void);

/* The engine's device stages for coded copies: a pool of 64 MiB
 * (arena__wire_stage_pool when set: tests) in ARENA_WIRE_STAGES stages,
 * each at least the largest segment (`most`). A copy fills a stage with a
 * run of segments (adjacent in the host buffer) and the device decodes
 * them from there: few large copies with no wait between them keep the
 * bus as busy as raw copies do, and four stages let the copies run a few
 * milliseconds ahead of decodes that wait behind a caller's kernels. */
#define ARENA_WIRE_STAGES 4
/* One stage's bytes for segments of at most `most` stored bytes. */
uint64_t arena_wire_stage_each(uint64_t most);
extern uint64_t arena__wire_stage_pool;

/* Device bytes those stages take at most for an image with this chunk
 * table (stages x the largest hb4 segment any block can have); 0 when it
 * has no hb4 chunk. */
uint64_t arena_wire_stage_bound(const arena_img_chunk *chunks, uint64_t n_chunks);

/* The first segment that ends after block byte d (n when none). */
size_t arena_wire_find(const arena_wire *w, uint64_t d);

/* Fill hb4 segment i (the segments of a chunk's part in order, once each)
 * from v, the parsed chunk it lies in; returns its stored bytes. */
uint64_t arena_wire_fill_hb4(arena_wire *w, size_t i, const arena_hb4 *v);

/* Block bytes [x, y) into w's buffer: from raw bytes at raw (a plain
 * chunk's), or from the chunk dec last checked (codec), whose raw byte 0 is
 * block byte cb (signed: the chunk may start before the block). hb4
 * segments the range covers are written whole (each lies in one chunk,
 * and [x, y) holds all of that chunk's part). Segments of different chunks
 * may be put from different threads. */
void arena_wire_put(arena_wire *w, uint64_t x, uint64_t y, const arena_img_dec *dec, unsigned codec, int64_t cb,
		    const uint8_t *raw);

/* Where the region of segment i ends (the index after it): an hb4 chunk's
 * part is its first segment and those that share its room; any other
 * segment is a region of its own. A range of whole regions can be read,
 * filled and copied apart from the rest (the disk tier reads a block's
 * coded form in such parts). */
size_t arena_wire_region_end(const arena_wire *w, size_t i);
/* The room of segments [i, j) in w's buffer. */
uint64_t arena_wire_room(const arena_wire *w, size_t i, size_t j);
/* The largest room of one of w's regions (0 for NULL): a disk tier's
 * staging slot holds at least that. */
uint64_t arena_wire_region_most(const arena_wire *w);
/* Segments [i, j) of plan (whole regions) as a coded form of their own, in
 * out, with seg (room for j - i segments) and buf (room for
 * arena_wire_room(plan, i, j) bytes): their places rebased to buf, none
 * filled; their dst stay the block's. */
void arena_wire_sub(const arena_wire *plan, size_t i, size_t j, arena_wire_seg *seg, uint8_t *buf, arena_wire *out);
/* Stored bytes of segment s (its raw length for a plain one). */
uint64_t arena_wire_seg_stored(const arena_wire_seg *s);

/* Every hb4 segment filled: sets w->stored. INTERNAL naming the block's
 * first empty segment otherwise (a loader bug, never the image's). */
int arena_wire_seal(arena_wire *w, const char *block);

/* Raw bytes [a, z) of the block from its wire form, decoded on the CPU
 * (tests, and a host view of a block held coded). */
void arena_wire_decode(const arena_wire *w, uint64_t a, uint64_t z, uint8_t *dst);

#endif
