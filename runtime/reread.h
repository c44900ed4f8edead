/* reread.h - a block's slab read again from its image, checked: how the
 * engine gives a block that was loaded straight to the device a host copy
 * before it drops the device copy (engine/engine.h, invariant 1).
 *
 * The reader opens the image once (header, manifest and chunk table checked)
 * and checks that its layout is the model's (same blocks, offsets, sizes).
 * A read covers whole chunks: every chunk the slab touches is read and its
 * xxh3 checked before any of its bytes are used. */
#ifndef ARENA_RUNTIME_REREAD_H
#define ARENA_RUNTIME_REREAD_H

#include <stdint.h>

#include "../formats/layout.h"

typedef struct arena_slab_reader arena_slab_reader;

/* Open `path` for re-reading the slabs of `l` (borrowed; must outlive the
 * reader). Errors: those of arena_img_open, IMG_MANIFEST_BAD (the image's
 * layout is not l's), NOMEM. */
int arena_slab_reader_open(const char *path, const arena_layout *l, arena_slab_reader **out);
/* The same for a model whose blocks are the image's in pieces of
 * `piece_bytes` (arena_layout_pieces; 0 = whole blocks). */
int arena_slab_reader_open_pieces(const char *path, const arena_layout *l, uint64_t piece_bytes,
				  arena_slab_reader **out);
void arena_slab_reader_close(arena_slab_reader *r);

/* Read block b's slab (`bytes` = its length) into dst, chunks checked.
 * Matches arena_reread_fn (ctx = the reader). Errors: IO,
 * IMG_CHUNK_CHECKSUM, USAGE (wrong size), NOMEM, their messages prefixed
 * "re-reading it from the image" (the caller names the block). */
int arena_slab_reader_read(void *reader, uint32_t b, uint8_t *dst, uint64_t bytes);

/* Bytes [off, off + len) of block b's slab into dst, chunks checked (the
 * chunks the range touches, read whole). Matches arena_reread_part_fn. */
int arena_slab_reader_read_part(void *reader, uint32_t b, uint64_t off, uint64_t len, uint8_t *dst);

/* The disk tier of an hb4 image: bytes [at, at + bytes) of block b in
 * their coded form, w (the plan's segments for that range, block-relative
 * dst, src within w->buf's room of w->cap bytes; the range starts and ends
 * where segments do), filled from the chunks the range touches, each read
 * and checked (checksum, structure, padding) and not decoded; then w is
 * sealed. Up to 8 threads share the chunks. Errors: those of
 * arena_slab_reader_read. */
struct arena_wire;
int arena_slab_reader_read_wire(void *reader, uint32_t b, uint64_t at, uint64_t bytes, struct arena_wire *w);

/* The host memory the readers' chunk buffers may hold while blocks of at
 * most `largest` bytes are read again (a block's host copy is read whole,
 * the disk tier reads parts) from an image with header h: a reader a
 * thread, as many as such a read's chunks and at most 8
 * (ARENA_REREAD_THREADS), each filling a chunk's raw bytes (a plain chunk
 * read in part), and for a coded image its stored bytes, and for a zstd
 * chunk its decoded streams. The host budget holds them beside the
 * stager's slots (arena_residency_staging). */
struct arena_img_header;
uint64_t arena_slab_reader_buffers(const struct arena_img_header *h, uint64_t largest);

/* Read from the page cache only what it holds, the rest with O_DIRECT
 * (arena_pread_cached_or_direct): a disk tier read again every step
 * neither evicts the rest of the page cache nor holds the image in it.
 * 1 on; 0 not possible here (arena_img_open_direct): reads stay buffered. */
int arena_slab_reader_direct(arena_slab_reader *r);

/* An output must not be the image being read: OUTPUT_IS_INPUT when `path`
 * is that file (by any name; common/outfile.h), else 0. */
int arena_slab_reader_check_output(const arena_slab_reader *r, const char *path);

#endif
