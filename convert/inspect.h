/* inspect.h - what a checkpoint or an image holds, as JSON (arena_inspect in
 * arena.h; `arena inspect` prints it, or text made from it). */
#ifndef ARENA_CONVERT_INSPECT_H
#define ARENA_CONVERT_INSPECT_H

#include <jansson.h>

/* The document arena_inspect returns, as a jansson object (the caller's
 * reference). Errors as arena_inspect's. */
int arena_inspect_json(const char *path, json_t **out);

#endif
