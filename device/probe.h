/* probe.h - the limits a load is measured against, measured in the same run:
 * the raw pinned host-to-device copy rate and the raw parallel read rate of
 * a file. */
#ifndef ARENA_PROBE_H
#define ARENA_PROBE_H

#include <stdint.h>

#include "backend.h"
#include "budget.h"

/* Copy from a pinned `bytes` host buffer to the device in 64 MiB pieces on
 * two streams for about `seconds`; *gbps = bytes moved / time / 1e9. The
 * buffer is pinned within the budget (BUDGET if it does not fit). */
int arena_probe_h2d(arena_backend *be, arena_pin_budget *b, uint64_t bytes, double seconds, double *gbps);

/* Read up to `max_bytes` of `path` (0 = all) with `threads` threads in
 * 1 MiB pieces (the loader's read size) into private buffers, nothing else;
 * O_DIRECT when `direct` (buffered where the filesystem has none). */
int arena_probe_read(const char *path, unsigned threads, int direct, uint64_t max_bytes, double *gbps);

/* Peak resident set size of this process so far, in bytes. */
uint64_t arena_peak_rss(void);

#endif
