/* image.h - the arena image file: header, manifest, chunk table, data.
 * The byte layout and every rule are in docs/FORMAT.md; this header is the
 * API. Writing is driven by convert/convert.c; this module owns encoding,
 * decoding and checking. */
#ifndef ARENA_FORMATS_IMAGE_H
#define ARENA_FORMATS_IMAGE_H

#include <stddef.h>
#include <stdint.h>

#include "codec.h"
#include "layout.h"

#define ARENA_IMG_MAGIC "ARENAIMG"
#define ARENA_IMG_MAJOR 1
#define ARENA_IMG_MINOR 3 /* the newest minor this reader knows */
/* Header flag bit 0 (required, 1.1): the data region holds coded chunks,
 * packed (docs/FORMAT.md, "Coded images"). */
#define ARENA_IMG_FLAG_CODED 1u
/* Header flag bit 1 (required, 1.2): chunks may be stored with codec 2,
 * zstd; set only with bit 0. */
#define ARENA_IMG_FLAG_ZSTD 2u
/* Header flag bit 2 (required, 1.3): tensors may be stored torch-subclass
 * (formats/scheme.h: named components and a "subclass" object). */
#define ARENA_IMG_FLAG_SUBCLASS 4u
#define ARENA_IMG_KNOWN_FLAGS (ARENA_IMG_FLAG_CODED | ARENA_IMG_FLAG_ZSTD | ARENA_IMG_FLAG_SUBCLASS)
#define ARENA_IMG_HEADER_SIZE 4096u
#define ARENA_IMG_CHUNK_ENTRY 32u
#define ARENA_IMG_DEFAULT_CHUNK (4u << 20)
#define ARENA_IMG_MIN_CHUNK (64u << 10)
#define ARENA_IMG_MAX_CHUNK (1u << 30)
#define ARENA_IMG_MAX_MANIFEST (1ull << 30)

typedef struct arena_img_header {
	uint16_t major, minor;
	uint32_t flags;
	uint64_t file_size;
	uint64_t manifest_offset, manifest_length, manifest_xxh3;
	uint64_t chunk_table_offset, chunk_table_length, chunk_table_xxh3;
	uint64_t data_offset, data_length;
	uint64_t chunk_size, chunk_count;
	uint64_t stored_length; /* coded images: bytes of the data region in the file; else 0 */
} arena_img_header;

typedef struct arena_img_chunk {
	uint64_t offset; /* relative to data_offset */
	uint32_t stored_length, raw_length;
	uint64_t xxh3;
	uint16_t codec, flags;
} arena_img_chunk;

/* Encode h into a 4096-byte page, computing header_xxh3. */
void arena_img_header_encode(const arena_img_header *h, uint8_t page[ARENA_IMG_HEADER_SIZE]);
/* Decode and check a header page against the real file size (rules and their
 * order in docs/FORMAT.md). */
int arena_img_header_decode(const uint8_t page[ARENA_IMG_HEADER_SIZE], uint64_t real_size, const char *label,
			    arena_img_header *h);
void arena_img_chunk_encode(const arena_img_chunk *c, uint8_t out[ARENA_IMG_CHUNK_ENTRY]);

/* Fill in a header's region fields for a manifest of `manifest_length`
 * padded bytes, `data_length` data bytes and `chunk_size`. A coded image
 * (ARENA_IMG_FLAG_CODED, version 1.1) then sets stored_length and
 * file_size with arena_img_header_set_stored once its chunks are written. */
void arena_img_header_plan(arena_img_header *h, uint64_t manifest_length, uint64_t data_length,
			   uint64_t chunk_size);
void arena_img_header_set_coded(arena_img_header *h);
/* A coded image whose chunks may be zstd (version 1.2). */
void arena_img_header_set_zstd(arena_img_header *h);
/* The image holds torch-subclass tensors: flag bit 2, minor 3. */
void arena_img_header_set_subclass(arena_img_header *h);
void arena_img_header_set_stored(arena_img_header *h, uint64_t stored_length);
/* Bytes of the data region as stored in the file. */
static inline uint64_t arena_img_stored_data(const arena_img_header *h)
{
	return (h->flags & ARENA_IMG_FLAG_CODED) ? h->stored_length : h->data_length;
}

/* Build the manifest text for `l`: `sources` is a JSON array of
 * {"path","size","metadata"} and `metadata` a JSON object (both jansson
 * json_t*, borrowed). Returns the text padded with spaces to a multiple of
 * 4096 in *out (owned by the caller, arena_free) and its length. */
int arena_img_manifest_build(const arena_layout *l, const void *sources, const void *metadata, uint64_t chunk_size,
			     unsigned minor, char **out, size_t *len);

/* Raw data bytes [a, z) (offsets relative to data_offset). */
typedef struct arena_img_span {
	uint64_t a, z;
} arena_img_span;

/* An open image: header, manifest and chunk table read and checked. */
typedef struct arena_image {
	char *path;
	int fd;
	int dfd; /* the file again with O_DIRECT (arena_img_open_direct), or -1 */
	void *map; /* with it, the file mapped to ask which pages are cached, or NULL */
	uint64_t map_len;
	arena_img_header hdr;
	arena_layout *layout;
	arena_img_chunk *chunks;  /* hdr.chunk_count entries */
	void *manifest;           /* json_t root */
	const void *metadata;     /* json_t object (borrowed from manifest) */
	const void *sources;      /* json_t array (borrowed from manifest) */
	arena_img_span *used;     /* the components' bytes, sorted and merged; the rest is padding */
	size_t n_used;
} arena_image;

/* Does the file at `path` start with the image magic? 1 yes, 0 no (including unreadable). */
int arena_img_sniff(const char *path);

/* The header of the image at `path` alone, checked (its checksum and
 * fields; not the manifest or chunk table). Errors: those of arena_img_open
 * for the header. */
int arena_img_read_header(const char *path, arena_img_header *h);

/* Open and check everything but the data chunks (docs/FORMAT.md order).
 * Errors: NOT_FOUND, INPUT_NOT_READABLE (see arena_open_input), IO, NOMEM, IMG_*. */
int arena_img_open(const char *path, arena_image **out);
/* Make img->layout the image's blocks in pieces of piece_bytes
 * (arena_layout_pieces; 0: nothing changes), for a model that streams
 * pieces. The image keeps its chunk table and padding spans. USAGE, NOMEM;
 * on failure the layout is as it was. */
int arena_img_use_pieces(arena_image *img, uint64_t piece_bytes);
void arena_img_close(arena_image *img);
/* Open the file a second time with O_DIRECT (img->dfd), and map it (to
 * ask which pages are cached), for readers that read from the page cache
 * what it holds and the rest around it (arena_open_direct,
 * arena_pread_cached_or_direct; r->direct). 1: done; 0: not possible here
 * (see arena_open_direct, or the open failed): reads stay buffered. */
int arena_img_open_direct(arena_image *img);

/* Called for each bad chunk, in increasing chunk order. */
typedef void (*arena_img_bad_fn)(void *ctx, const arena_image *img, uint64_t chunk, uint64_t expect, uint64_t got);

/* Read every data chunk with `threads` readers and check its checksum.
 * Calls bad() for each bad chunk (may be NULL). Returns 0, or
 * IMG_CHUNK_CHECKSUM with a message naming the first bad chunk and what it
 * covers, or IO/NOMEM. A chunk whose checksum holds is checked further, as
 * arena_img_chunk_check does (IMG_CHUNK_BAD, IMG_PADDING: the first such
 * error stops the walk and is returned). *n_bad (optional) gets the number
 * of bad chunks. */
int arena_img_verify_data(arena_image *img, unsigned threads, arena_img_bad_fn bad, void *ctx, uint64_t *n_bad);
/* The same, reporting the stored bytes checked so far of all of them after
 * each chunk, from the reader threads (progress may be NULL). A progress
 * call that returns nonzero stops the walk: CANCELLED. */
typedef int (*arena_img_progress_fn)(void *ctx, uint64_t done, uint64_t total);
int arena_img_verify_data_progress(arena_image *img, unsigned threads, arena_img_bad_fn bad, void *ctx,
				   uint64_t *n_bad, arena_img_progress_fn progress, void *pctx);

/* A thread's state for checking and decoding coded chunks: the parse of the
 * chunk last checked (hb4), or its streams decoded (zstd, into work's
 * buffer). All zero to start; arena_img_dec_free releases it. */
typedef struct arena_img_dec {
	arena_hb4 hb4;
	arena_zstd zstd;
	arena_zstd_work work;
} arena_img_dec;
void arena_img_dec_free(arena_img_dec *d);
/* Raw bytes [a, z) of the coded chunk (codec 1 or 2) that d last checked
 * into dst; for hb4 a and z are even. */
void arena_img_dec_raw(const arena_img_dec *d, unsigned codec, uint64_t a, uint64_t z, uint8_t *dst);

/* Read raw data bytes (the slabs' bytes, after decoding) from an image,
 * chunk by chunk through a one-chunk cache. verify: check each chunk's
 * checksum as it is read (IMG_CHUNK_CHECKSUM); every chunk read through the
 * cache is checked for structure (coded chunks: IMG_CHUNK_BAD) and padding
 * (IMG_PADDING), also without verify. Uncoded images read without verify go
 * straight to the file. */
typedef struct arena_img_reader {
	arena_image *img;
	int verify;
	int direct;            /* read what is not cached with O_DIRECT (img->dfd) */
	uint8_t *stored, *raw; /* chunk_size each */
	uint64_t chunk;        /* the chunk in raw, or UINT64_MAX */
	arena_img_dec dec;
} arena_img_reader;
int arena_img_reader_init(arena_img_reader *r, arena_image *img, int verify);
int arena_img_read_raw(arena_img_reader *r, uint64_t off, uint64_t len, uint8_t *dst);
/* Chunk i's stored bytes read and checked (checksum, structure, padding),
 * not decoded: *stored points at them (the reader's buffer; for a plain
 * chunk they are its raw bytes) and r->dec holds the parse (hb4: planes
 * into them). Valid until the reader reads again. */
int arena_img_read_chunk(arena_img_reader *r, uint64_t i, const uint8_t **stored);
void arena_img_reader_free(arena_img_reader *r);
/* Chunk i checked, in this order: its checksum (got_hash, the hash of its
 * stored bytes, IMG_CHUNK_CHECKSUM); then, when buf holds its stored bytes
 * followed by its stored padding (arena_img_chunk_padded bytes in all): a
 * coded chunk's structure (IMG_CHUNK_BAD: hb4 parsed; zstd parsed and its
 * streams decoded, bounded, each to exactly its size), its stored padding
 * and its raw padding (IMG_PADDING). The parse and decoded streams are left
 * in *d (a temporary one when d is NULL), from where arena_img_dec_raw
 * gives the raw bytes. buf NULL: the checksum only. `why` says what the read
 * was for in messages ("while loading"). Errors also NOMEM (zstd). */
int arena_img_chunk_check(const arena_image *img, uint64_t i, const uint8_t *buf, uint64_t got_hash, const char *why,
			  arena_img_dec *d);

/* ---- padding (docs/FORMAT.md): every byte no checksum covers is zero ----
 *
 * Stored padding: in a coded image, the bytes after a chunk's stored bytes up
 * to the next 4096-aligned chunk (none in a plain image). Raw padding: the
 * data bytes outside every tensor component (between slabs, between and after
 * the components of a slab, after the last slab); the chunk checksums cover
 * them, and readers check that they are zero too. Every reader that reads a
 * chunk checks both (IMG_PADDING, naming the file, the chunk and the byte). */

/* Bytes of chunk i in the file: its stored bytes and its stored padding. */
uint64_t arena_img_chunk_padded(const arena_image *img, uint64_t i);
/* The n bytes at p follow chunk i's stored bytes in the file (part or all of
 * its stored padding): 0 when they are zero, else IMG_PADDING naming the
 * first that is not. */
int arena_img_stored_padding_check(const arena_image *img, uint64_t i, const uint8_t *p, uint64_t n);
/* Visit the raw padding within raw bytes [a, z): fn(ctx, x, y) for each
 * stretch [x, y) of it, in order; a non-zero return stops the walk and is
 * returned. */
int arena_img_padding(const arena_image *img, uint64_t a, uint64_t z, int (*fn)(void *ctx, uint64_t x, uint64_t y),
		      void *ctx);
/* The first raw padding byte among the n raw bytes at p (raw bytes [a, a+n))
 * that is not zero, or UINT64_MAX. */
uint64_t arena_img_padding_scan(const arena_image *img, uint64_t a, const uint8_t *p, uint64_t n);
/* The same for chunk i decoded from its parse v (whose plane pointers need
 * to hold only what arena_hb4_reads names for the padding, and the exception
 * lists). */
uint64_t arena_img_padding_scan_hb4(const arena_image *img, uint64_t i, const arena_hb4 *v);
/* The same for a zstd chunk i, its streams decoded. */
uint64_t arena_img_padding_scan_zstd(const arena_image *img, uint64_t i, const arena_zstd *v);
/* IMG_PADDING for raw byte `at` of chunk i, which is padding and not zero. */
int arena_img_padding_error(const arena_image *img, uint64_t i, uint64_t at);

/* Describe what chunk `i` covers: "blocks 'a', 'b'; tensors 'x', 'y' (+3 more)"
 * into buf. */
void arena_img_chunk_describe(const arena_image *img, uint64_t i, char *buf, size_t len);

/* Visit each (block, tensor) whose component bytes intersect chunk i. */
void arena_img_chunk_cover(const arena_image *img, uint64_t i, void (*fn)(void *ctx, uint32_t block, int64_t tensor),
			   void *ctx);

#endif
