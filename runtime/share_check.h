/* share_check.h - the host copies of a region another process loaded
 * (device/hostshare.h), checked against this process's own image before
 * anything uses them (docs/SHARING.md, "Security").
 *
 * The region's bytes come from outside the process: its header, its
 * layout and its bytes are another process's word. What this process
 * trusts is its own image: its header, manifest and chunk table (checked
 * when it was opened), and so each chunk's checksum. A host slab under
 * plain chunks is checked by hashing each such chunk from the region's
 * bytes (the parts of the chunk that are not in the region's slabs, the
 * ends of device blocks and the padding between slabs, read from the
 * image): the checksum must be the chunk table's. A host slab under coded
 * chunks, and every coded host copy, is read again from the image (its
 * chunks checked, as the loader reads them) and compared byte for byte;
 * a coded copy's segment tables are this process's own, filled from that
 * read: nothing of the region's but the bytes is used. */
#ifndef ARENA_RUNTIME_SHARE_CHECK_H
#define ARENA_RUNTIME_SHARE_CHECK_H

#include <stdint.h>

#include "../device/model.h"
#include "../formats/image.h"

typedef struct arena_share_check_stats {
	uint64_t hashed;   /* region bytes hashed against chunk checksums */
	uint64_t compared; /* region bytes compared with bytes read from the image */
	uint64_t read;     /* image bytes read for it */
	double seconds;
} arena_share_check_stats;

/* Check model m's host copies (m->host_mapped; its blocks are the image's
 * in pieces of piece_bytes, 0: whole) against the image at `path`, opened
 * by this process as img. 0 when they hold the image's bytes (the coded
 * copies' segment tables are then filled, pointing into the region); 1
 * when they do not, or cannot be checked, with why (the caller gives the
 * region up: arena_model_unshare). st may be NULL. */
int arena__share_check(const char *path, const arena_image *img, arena_model *m, uint64_t piece_bytes,
		       char why[ARENA_SHARE_WHY], arena_share_check_stats *st);

#endif
