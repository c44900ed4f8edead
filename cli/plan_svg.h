/* plan_svg.h - `arena plan --svg`: the plan as a picture (plain SVG text).
 *
 * What it shows, top to bottom:
 *   - the blocks in execution order as a strip, each as wide as its bytes
 *     (globals, resident, streamed: one <rect class="block WHERE"> per
 *     block, with data-block, data-index, data-bytes and a <title>), the
 *     containers named under it, and a legend with the totals;
 *   - the device memory: globals, resident blocks, the ring's slots (one
 *     <rect class="slot"> each), the weights budget left, the working
 *     reserve and the headroom, to scale;
 *   - with a compute profile, one steady step as the planner predicts it:
 *     the copies into the ring (<rect class="copy">) and each entry's
 *     compute (<rect class="compute resident|streamed">) on a time axis, so
 *     that where copies hide behind compute, and where the compute waits,
 *     can be seen. */
#ifndef ARENA_CLI_PLAN_SVG_H
#define ARENA_CLI_PLAN_SVG_H

#include <stdint.h>

#include "../engine/engine.h"

typedef struct plan_svg_in {
	const char *image;          /* its name, for the title */
	const arena_layout *l;
	const arena_engine_opts *o; /* with cost and h2d_bytes_per_s when a profile is given */
	const arena_residency_plan *p;
	const char *profile;        /* the profile's file name, or NULL */
	uint64_t vram, budget, headroom, reserve;
	int image_fd;               /* the image (the output may not be it) */
} plan_svg_in;

/* Write the picture to `path`, whole or not at all. Errors as
 * arena_outfile_open / write, OUTPUT_IS_INPUT, NOMEM. */
int plan_svg_write(const char *path, const plan_svg_in *in);

#endif
