/* profile.h - a compute profile on disk: what the residency planner places
 * blocks by (engine/engine.h, arena_engine_opts cost / backward_factor /
 * h2d_bytes_per_s), saved by `arena bench stream --save-profile` from what
 * the engine timed on a device and read by `arena plan --profile` to plan
 * and predict a step on any machine, GPU or not.
 *
 * The file is one JSON object:
 *   {"format": "arena-profile-1",
 *    "h2d_bytes_per_s": 5.5e10,          > 0
 *    "backward_factor": 3.0,             >= 0 (0: the default, 3)
 *    "blocks": {"transformer_blocks.0": 0.0049, ...}}   seconds >= 0
 * with one entry for every block of the model but its globals block, no
 * other names (a profile is for one model's blocks) and nothing else. */
#ifndef ARENA_PROFILE_H
#define ARENA_PROFILE_H

#include "../formats/layout.h"

/* Write the profile of l's blocks (cost has l->n_blocks entries; the
 * globals block's is not written) to path: a temporary, renamed when whole.
 * Errors: USAGE (a value that is not finite and >= 0, h2d not > 0), IO,
 * NOMEM. */
int arena_profile_write(const char *path, const arena_layout *l, const double *cost, double h2d_bytes_per_s,
			double backward_factor);

/* Read a profile for l: cost[b] for every block (globals 0), the rate and
 * the backward factor. Errors: PROFILE_BAD with what is wrong and where
 * (not JSON, a missing or unknown field, a block of l missing, a name l has
 * not, a value out of range), NOT_FOUND, INPUT_NOT_READABLE (see
 * arena_open_input), IO, NOMEM. */
int arena_profile_read(const char *path, const arena_layout *l, double *cost, double *h2d_bytes_per_s,
		       double *backward_factor);

#endif
