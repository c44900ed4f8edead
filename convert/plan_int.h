/* plan_int.h - what plan.c (order, layout, report) and plan_discover.c (block discovery) share.
 *
 * plan_discover.c finds the blocks from the checkpoint's structure (plan.h's
 * rules 1-3 and single blocks) and records what it judged; plan.c orders
 * the tensors into blocks (by discovery or by --block-pattern), builds the
 * layout and the discovery report. Not installed; the API is plan.h. */
#ifndef ARENA_CONVERT_PLAN_INT_H
#define ARENA_CONVERT_PLAN_INT_H

#include <stdint.h>
#include <string.h>

#include "plan.h"

/* Discovery's state: what it found per tensor, and the report's entries. */
typedef struct disc {
	const arena_ckpt *ck;
	uint8_t *hit;   /* per tensor: in a block (else globals) */
	size_t *clen;   /* per tensor: its block's container length */
	int64_t *index; /* per tensor: its block's index, -1 for a single */
	arena_plan_found *found; /* the report, or NULL when not wanted */
	size_t n_found, cap_found;
} disc;

/* The index in list[0..n) of the component c[0..len), or -1. */
static inline int known_in(const char *const *list, size_t n, const char *c, size_t len)
{
	for (size_t k = 0; k < n; k++)
		if (strlen(list[k]) == len && memcmp(list[k], c, len) == 0)
			return (int)k;
	return -1;
}

/* Discover the blocks among the tensors ids[0..n) of d->ck (in name order;
 * d->hit, clen and index sized for every tensor, zeroed): each tensor in a
 * block gets hit, its container's length and its index; with d->found, what
 * was judged is recorded. Returns >= 0, or an error (NOMEM). */
int arena__plan_discover(disc *d, const uint32_t *ids, size_t n);

/* Free d's arrays and report entries; d is zeroed. */
void arena__plan_disc_free(disc *d);

#endif
