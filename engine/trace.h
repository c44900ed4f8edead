/* trace.h - the engine's work as a timeline people can open: a recorder the
 * engine feeds while a trace runs, written as Chrome's trace-event JSON
 * (https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU;
 * Perfetto and chrome://tracing open it).
 *
 * Times are the device's own: every copy, acquire and release traced gets
 * timed events of the trace's own (cuda events, sim markers) recorded on the
 * stream the work runs on, read relative to a reference event recorded at
 * the start on an idle stream of the trace's own and waited for. Host
 * decisions (step boundaries, demotions, promotions, mode switches) and the
 * memory counters are host clock times, placed on the same time line by the
 * host time read just after the reference was done.
 *
 * Bounded: `max_records` records (a copy, an acquire-release, an instant, a
 * counter sample) are kept in a buffer sized at the start, and at most
 * min(max_records, 2048) timed records wait for the device at a time (each
 * holds three timed events of a pool made at the start; done ones are read
 * without waiting at every step end, and when the pool runs out). What does
 * not fit is dropped and counted; the trace's metadata says how many
 * (otherData.dropped_records). Recording allocates nothing (the backend may,
 * inside its own ops).
 *
 * The file (written by arena_trace_close, whole or not at all):
 *   {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}
 * pid 1, threads (tid):
 *   1  "engine (host)": instants "step N" (s: g) at step_begin, "step N end"
 *      at step_end, "demote B" / "promote B" / "mode M" (s: p); counters
 *      "device memory" {resident, ring, free} at the start and every step
 *      end;
 *   2  "copy stream": one X event per host-to-device copy (name: the block;
 *      args block, bytes, GB/s, kind fetch|promote, step), and the counter
 *      "streamed this step" {bytes} at each fetch's end;
 *   3+ "caller stream" (more lanes when acquires overlap: 4, 5, ...): one X
 *      event per acquire-release of a block (from when its bytes were there
 *      to the release; args block, step, nth acquire of the block in the
 *      step, stall_us), preceded by an X event "stall B" (cat stall) where
 *      the caller's stream waited for the copy (more than 20 us, as the step
 *      records count stalls).
 * Events are written in time order; ts and dur in microseconds. */
#ifndef ARENA_TRACE_H
#define ARENA_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "../formats/layout.h"
#include "../device/backend.h"

#define ARENA_TRACE_DEFAULT_RECORDS 65536u
#define ARENA_TRACE_MAX_RECORDS (16u << 20)

enum { ARENA_TRACE_FETCH, ARENA_TRACE_PROMOTE_COPY };
enum { ARENA_TRACE_STEP_BEGIN, ARENA_TRACE_STEP_END, ARENA_TRACE_DEMOTE, ARENA_TRACE_PROMOTE, ARENA_TRACE_MODE };

typedef struct arena_trace arena_trace;

/* Start a trace of the work on `l`'s blocks to `path` (created now: USAGE,
 * NOT_FOUND, IO as arena_outfile_open says): the buffers, the event pool and
 * the reference event. `label` names the model in the file (may be NULL).
 * max_records 0 = ARENA_TRACE_DEFAULT_RECORDS; more than
 * ARENA_TRACE_MAX_RECORDS is USAGE, as is a backend that cannot time. */
int arena_trace_open(arena_backend *be, const arena_layout *l, const char *path, const char *label,
		     size_t max_records, arena_trace **out);

/* A copy of `bytes` of block b on stream s: _begin records its start (call
 * it right before the copy is queued), _end its end (right after). kind:
 * ARENA_TRACE_FETCH or ARENA_TRACE_PROMOTE_COPY. *slot is -1 when the copy is
 * not traced (dropped); _end accepts that. */
int arena_trace_copy_begin(arena_trace *t, arena_stream *s, uint32_t b, uint64_t bytes, int kind, uint64_t step,
			   int *slot);
int arena_trace_copy_end(arena_trace *t, int slot, arena_stream *s);
/* An acquire of block b on stream s: _ready before the stream waits for the
 * block's bytes, _start after; arena_trace_release pairs with the oldest
 * open acquire of b (as the engine's release does). */
int arena_trace_acquire_ready(arena_trace *t, arena_stream *s, uint32_t b, uint64_t step, int *slot);
int arena_trace_acquire_start(arena_trace *t, int slot, arena_stream *s);
int arena_trace_release(arena_trace *t, uint32_t b, arena_stream *s);
/* A host instant (ARENA_TRACE_STEP_BEGIN ...); `value`: bytes for demote and
 * promote, the mode for ARENA_TRACE_MODE. */
void arena_trace_instant(arena_trace *t, int kind, uint32_t b, uint64_t step, uint64_t value);
/* The device memory counters now. */
void arena_trace_counter(arena_trace *t, uint64_t resident, uint64_t ring, uint64_t free_bytes);
/* Read the device's times of what is done, without waiting. */
int arena_trace_poll(arena_trace *t);
/* Wait for the device's times, write the file when `write` (whole or not at
 * all), free everything (also on error). Accepts NULL (0). */
int arena_trace_close(arena_trace *t, int write);

/* Records dropped so far (the buffer or the pool was full). */
uint64_t arena_trace_dropped(const arena_trace *t);

#endif
