/* codec.h - chunk codecs of the arena image (docs/FORMAT.md, "Codecs").
 *
 * Codec 2, "zstd", is at the end of this file.
 *
 * Codec 1, "hb4", is a fixed-rate lossless code for 16-bit little-endian
 * words (bf16 and fp16 weights): each word's low byte is stored as is and
 * its high byte (sign and exponent of a bf16) as a 4-bit code into a table
 * of the chunk's 16 commonest high bytes; words whose high byte is not in
 * the table are exceptions, listed after the planes. A bf16 weight then
 * takes 12 bits instead of 16. Because the rate is fixed, any word range of
 * a chunk decodes on its own: the GPU decodes straight into the slabs.
 *
 * Stored layout of an hb4 chunk of W = raw_length / 2 words, E exceptions:
 *
 *   0                 u32 E             exceptions
 *   4                 u32 W             words (raw_length / 2)
 *   8                 u8[16] table      high byte of codes 0..15
 *   24                u8[8]             zero
 *   32                nibbles           word i's code in byte i/2, low nibble for even i;
 *                                       ceil(W/2) bytes, zero padded to a multiple of 16
 *   32 + N            low bytes         W bytes, zero padded to a multiple of 16
 *   32 + N + L        u32[E] index      exception word indices, strictly increasing, < W
 *   32 + N + L + 4E   u8[E] high        exception high bytes
 *
 * where N = align16(ceil(W/2)) and L = align16(W); stored_length is exactly
 * 32 + N + L + 5E. An exception's nibble is 0 (the decoder overwrites the
 * word's high byte with the listed one). */
#ifndef ARENA_FORMATS_CODEC_H
#define ARENA_FORMATS_CODEC_H

#include <stddef.h>
#include <stdint.h>

enum { ARENA_CODEC_NONE = 0, ARENA_CODEC_HB4 = 1, ARENA_CODEC_ZSTD = 2 };

#define ARENA_HB4_HEADER 32u

/* A parsed hb4 chunk: pointers into the stored bytes. */
typedef struct arena_hb4 {
	uint64_t words, n_exc;
	uint8_t table[16];
	const uint8_t *nib, *low, *exc_idx, *exc_hi;
	uint64_t nib_off, low_off, idx_off, hi_off; /* offsets of the planes in the stored chunk */
} arena_hb4;

/* Offsets of the planes for W words (nib, low, idx) and the stored length
 * for E exceptions. */
uint64_t arena_hb4_nib_off(void);
uint64_t arena_hb4_low_off(uint64_t words);
uint64_t arena_hb4_idx_off(uint64_t words);
uint64_t arena_hb4_stored_length(uint64_t raw_length, uint64_t n_exc);

/* Can a chunk of raw_length bytes be stored in stored_length bytes with hb4?
 * (raw_length even, stored_length = the formula for some E, and fewer than
 * raw_length: hb4 is only used where it saves bytes.) 1 or 0. */
int arena_hb4_lengths_ok(uint64_t raw_length, uint64_t stored_length);

/* Encode raw (raw_length bytes, even) into out (room for raw_length bytes).
 * Returns the stored length, or 0 when hb4 would not store it in fewer than
 * raw_length bytes (then store the chunk as is). */
uint64_t arena_hb4_encode(const uint8_t *raw, uint64_t raw_length, uint8_t *out);

/* Check a stored hb4 chunk and describe it in *v: the header agrees with
 * raw_length and stored_length, padding and reserved bytes are zero,
 * exception indices strictly increase and are < W. Returns 0 or
 * ARENA_E(IMG_CHUNK_BAD) with a message naming what is wrong (prefixed by
 * `what`, e.g. "model.arena: chunk 7"). */
int arena_hb4_parse(const uint8_t *stored, uint64_t stored_length, uint64_t raw_length, const char *what,
		    arena_hb4 *v);

/* The same checks on a chunk that arrives in pieces (the loader streams
 * stored bytes to the device a megabyte at a time): begin with the lengths
 * (from the chunk table), feed every stored byte once, in order, then end,
 * which fills *v's counts, offsets and table (its plane pointers stay NULL)
 * or returns the first problem as arena_hb4_parse would. */
typedef struct arena_hb4_check {
	uint64_t raw, stored, words, n_exc;
	uint64_t low_off, idx_off, hi_off;
	uint64_t at;              /* stored bytes fed so far */
	uint8_t head[ARENA_HB4_HEADER];
	uint8_t part[4];          /* an exception index split between pieces */
	uint64_t prev, e;         /* last index seen, indices seen */
	int lengths_ok;
	const char *why;          /* first problem found, or NULL */
	uint64_t why_e, why_i;
} arena_hb4_check;
void arena_hb4_check_begin(arena_hb4_check *c, uint64_t raw_length, uint64_t stored_length);
void arena_hb4_check_feed(arena_hb4_check *c, const uint8_t *p, uint64_t n);
int arena_hb4_check_end(arena_hb4_check *c, const char *what, arena_hb4 *v);

/* Decode raw bytes [a, z) of a parsed chunk into dst (z - a bytes). a and z
 * are even and z <= raw_length. */
void arena_hb4_decode(const arena_hb4 *v, uint64_t a, uint64_t z, uint8_t *dst);

/* The first raw byte in [a, z) of a parsed chunk that does not decode to
 * zero, or z when they all do (a <= z <= raw_length; a and z need not be
 * even). Reads only the stored bytes that decoding [a, z) reads: those
 * arena_hb4_reads names and the exception lists. */
uint64_t arena_hb4_first_nonzero(const arena_hb4 *v, uint64_t a, uint64_t z);

/* The stored bytes, besides the exception lists [idx_off, stored_length),
 * that decoding raw bytes [a, z) of a chunk of `words` words reads: nibbles
 * [nib[0], nib[1]) and low bytes [low[0], low[1]). */
void arena_hb4_reads(uint64_t words, uint64_t a, uint64_t z, uint64_t nib[2], uint64_t low[2]);

/* A chunk of its own for raw bytes [a, z) of a parsed chunk v (a a multiple
 * of 4, z even, a < z <= 2 * v->words): the same table, the words' nibbles
 * and low bytes, the exceptions among them (indices from a / 2). Coded
 * streaming keeps a streamed block's part of a chunk this way (formats/
 * wire.h). arena_hb4_sub_bound is the most it takes (all of v's
 * exceptions); arena_hb4_sub writes it to out, describes it in *s (plane
 * pointers into out) and returns its stored length. */
uint64_t arena_hb4_sub_bound(uint64_t a, uint64_t z, uint64_t n_exc);
uint64_t arena_hb4_sub(const arena_hb4 *v, uint64_t a, uint64_t z, uint8_t *out, arena_hb4 *s);

/* A device backend's decode of raw bytes [a, z) of parsed chunk v into dst
 * (backend.h's decode_hb4): 0 when the arguments hold, else USAGE with a
 * message naming the backend (`name`); the same checks for every backend. */
int arena_hb4_decode_args(const char *name, void *dst, const void *src, const arena_hb4 *v, uint64_t a, uint64_t z);

/* The codec's name ("none", "hb4", "zstd") or NULL for an unknown number;
 * and back (-1 for an unknown name). */
const char *arena_codec_name(unsigned codec);
int arena_codec_from_name(const char *name);

/* ---- codec 2: zstd, byte-grouped ------------------------------------------------
 *
 * A chunk of raw_length bytes is seen as elements of G bytes (G = 1, 2, 4 or
 * 8: the width of the chunk's commonest element, chosen by the writer) and
 * split into G streams: stream k holds byte k (0 = the least significant,
 * little-endian) of every element, raw_length / G bytes each. For bf16
 * weights stream 1 is the high bytes (sign and exponent: few values, 2.7-3.5
 * bits of entropy) and stream 0 the low bytes (noise). Each stream is stored
 * as one zstd frame where that stores fewer bytes than the stream, else as
 * is. Stored layout, H = 8 + 4G:
 *
 *   0        u8      G            element width, streams: 1, 2, 4 or 8
 *   1        u8      packed       bit k: stream k is a zstd frame; bits G..7 zero
 *   2        u16                  zero
 *   4        u32     raw_length   the chunk's raw length (a multiple of G)
 *   8        u32[G]  length       stream k's stored bytes
 *   H        ...                  the streams, k = 0 .. G-1, back to back
 *
 * stored_length is exactly H + the sum of the lengths, and less than
 * raw_length. A stream stored as is takes exactly raw_length / G bytes; a
 * packed one is a single zstd frame (RFC 8878; magic 0xFD2FB528, no
 * dictionary) of fewer bytes than that, whose header declares a content size
 * of raw_length / G, and which decodes to exactly that many bytes. Decoding
 * is bounded: a stream is decompressed into raw_length / G bytes of room,
 * never more, whatever its bytes say. */

#define ARENA_ZSTD_MAX_STREAMS 8
#define ARENA_ZSTD_DEFAULT_LEVEL 1 /* measured: bench/RESULTS.md */
#define ARENA_ZSTD_MAX_LEVEL 19

/* A thread's zstd state: contexts and a buffer for streams, made on first
 * use through arena_malloc (so allocation failures are injectable). All
 * zero to start; freed by arena_zstd_work_free. Not shared between threads. */
typedef struct arena_zstd_work {
	void *cctx, *dctx; /* ZSTD_CCtx, ZSTD_DCtx */
	uint8_t *buf;      /* split or decoded streams */
	uint64_t cap;      /* bytes at buf */
	int clevel;        /* the level cctx is set to (0: not yet) */
} arena_zstd_work;
void arena_zstd_work_free(arena_zstd_work *w);

/* A parsed zstd chunk. plane[k] points at stream k's raw_length / G bytes:
 * into the stored bytes for a stream stored as is, into the work buffer
 * once arena_zstd_decode has run for a packed one (NULL before). */
typedef struct arena_zstd {
	uint64_t raw, n;        /* raw_length; bytes a stream */
	unsigned width, packed; /* G; bit k: stream k packed */
	uint64_t off[ARENA_ZSTD_MAX_STREAMS], len[ARENA_ZSTD_MAX_STREAMS]; /* stream k's stored bytes */
	const uint8_t *plane[ARENA_ZSTD_MAX_STREAMS];
} arena_zstd;

/* Bytes of the header for G streams. */
uint64_t arena_zstd_header(unsigned width);

/* Can a chunk of raw_length bytes be stored in stored_length bytes with zstd?
 * (at least the smallest header and fewer than raw_length.) 1 or 0. */
int arena_zstd_lengths_ok(uint64_t raw_length, uint64_t stored_length);

/* The element width convert picks for a chunk whose bytes are mostly
 * elements of `bits` bits: 1, 2, 4 or 8 (sub-byte and odd widths: 1). */
unsigned arena_zstd_width_for_bits(unsigned bits);

/* Encode raw (raw_length bytes, a multiple of width) into out (room for
 * raw_length bytes) with zstd at `level` (0: the default). *stored gets the
 * stored length, or 0 when the chunk would not take fewer than raw_length
 * bytes (then store it as is). Returns 0, ARENA_E_NOMEM (zstd's memory
 * comes from arena_malloc) or ARENA_E_USAGE (a width or level out of range). */
int arena_zstd_encode(arena_zstd_work *w, const uint8_t *raw, uint64_t raw_length, unsigned width, int level,
		      uint8_t *out, uint64_t *stored);

/* Check a stored zstd chunk's header and its frames' headers without
 * decoding anything: the rules above but "decodes to exactly". Returns 0 or
 * ARENA_E(IMG_CHUNK_BAD) with a message prefixed by `what`. */
int arena_zstd_parse(const uint8_t *stored, uint64_t stored_length, uint64_t raw_length, const char *what,
		     arena_zstd *v);

/* Decompress the packed streams of a parsed chunk (stored: its stored bytes)
 * into w's buffer, each into exactly raw_length / G bytes of room, and point
 * v->plane at them. Returns 0, ARENA_E(IMG_CHUNK_BAD) (a frame that does not
 * decode, or decodes to fewer bytes) or ARENA_E_NOMEM. */
int arena_zstd_decode(arena_zstd_work *w, arena_zstd *v, const uint8_t *stored, const char *what);

/* Raw bytes [a, z) of a decoded chunk into dst (any a <= z <= raw_length). */
void arena_zstd_gather(const arena_zstd *v, uint64_t a, uint64_t z, uint8_t *dst);

/* The first raw byte in [a, z) of a decoded chunk that is not zero, or z. */
uint64_t arena_zstd_first_nonzero(const arena_zstd *v, uint64_t a, uint64_t z);

#endif
