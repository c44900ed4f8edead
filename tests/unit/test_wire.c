/* test_wire.c - coded streaming: an hb4 image's streamed blocks kept coded
 * in host memory (formats/wire.h), moved coded and decoded by the device
 * into the ring. Sub-chunks decode to the chunk's bytes at every aligned
 * offset; every acquired block holds the image's bytes, step after step,
 * whole blocks and pieces, sample and train; copies move fewer bytes than
 * the blocks hold and host memory shrinks with them; the flag that turns it
 * off gives raw host copies; corrupted coded bytes fail the open naming the
 * chunk; allocation failures are errors, never wrong bytes. */
#include <criterion/criterion.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "arena.h"
#include "../../common/alloc.h"
#include "../../common/err.h"
#include "../../formats/codec.h"
#include "../../engine/engine.h"
#include "../../formats/wire.h"
#include "../../convert/convert.h"
#include "testutil.h"

/* bf16-like words: a few exponents, noisy mantissas, some outliers. */
static void fill_words(uint8_t *p, uint64_t n, unsigned seed)
{
	uint32_t x = seed * 2654435761u + 1;
	for (uint64_t i = 0; i + 1 < n; i += 2) {
		x = x * 1664525u + 1013904223u;
		p[i] = (uint8_t)(x >> 24);
		unsigned r = (x >> 8) & 255;
		p[i + 1] = r < 3 ? (uint8_t)(x >> 16) : (uint8_t)(0x3c + (r % 6) + (r & 128 ? 0x80 : 0));
	}
}

Test(wire, sub_chunks_decode_to_the_chunks_bytes)
{
	const uint64_t raw = 40000;
	uint8_t *in = arena_malloc(raw), *st = arena_malloc(raw), *sub = arena_malloc(raw + 4096), *out = arena_malloc(raw);
	cr_assert(in && st && sub && out);
	fill_words(in, raw, 7);
	uint64_t stored = arena_hb4_encode(in, raw, st);
	cr_assert_gt(stored, 0);
	arena_hb4 v;
	cr_assert_eq(arena_hb4_parse(st, stored, raw, "t", &v), 0, "%s", arena_last_error());
	cr_assert_gt(v.n_exc, 10);
	const uint64_t cuts[][2] = {{0, raw}, {4, raw}, {0, 2}, {8, 10}, {1000, 1002}, {4, 38998}, {12344, 30002}, {39996, raw}};
	for (size_t k = 0; k < sizeof(cuts) / sizeof(cuts[0]); k++) {
		uint64_t a = cuts[k][0], z = cuts[k][1];
		memset(sub, 0xee, raw + 4096);
		arena_hb4 s;
		uint64_t n = arena_hb4_sub(&v, a, z, sub, &s);
		cr_assert_leq(n, arena_hb4_sub_bound(a, z, v.n_exc));
		cr_assert_eq(n, arena_hb4_stored_length(z - a, s.n_exc));
		/* a chunk of its own: it parses as one where hb4 saves bytes */
		arena_hb4 p;
		if (arena_hb4_lengths_ok(z - a, n))
			cr_assert_eq(arena_hb4_parse(sub, n, z - a, "sub", &p), 0, "[%lu, %lu): %s", (unsigned long)a,
				     (unsigned long)z, arena_last_error());
		memset(out, 0, raw);
		arena_hb4_decode(&s, 0, z - a, out);
		cr_assert_eq(memcmp(out, in + a, z - a), 0, "[%lu, %lu)", (unsigned long)a, (unsigned long)z);
	}
	arena_free(in);
	arena_free(st);
	arena_free(sub);
	arena_free(out);
}

/* A block's coded form decoded on the CPU (load --check) gives the raw bytes
 * of any range, odd ends included. */
Test(wire, a_coded_form_decodes_any_range)
{
	const uint64_t raw = 40000;
	uint8_t *in = arena_malloc(raw), *st = arena_malloc(raw), *out = arena_malloc(raw);
	cr_assert(in && st && out);
	fill_words(in, raw, 3);
	uint64_t stored = arena_hb4_encode(in, raw, st);
	cr_assert_gt(stored, 0);
	arena_img_dec dec = {0};
	cr_assert_eq(arena_hb4_parse(st, stored, raw, "t", &dec.hb4), 0, "%s", arena_last_error());
	arena_img_chunk ch = {.raw_length = (uint32_t)raw, .stored_length = (uint32_t)stored, .codec = ARENA_CODEC_HB4};
	arena_wire *w;
	arena__wire_seg_max = 8192; /* several segments */
	cr_assert_eq(arena_wire_plan(&ch, 1, 65536, 0, raw, &w), 0);
	arena__wire_seg_max = 0;
	cr_assert_not_null(w);
	cr_assert(w->buf = arena_malloc(w->cap));
	arena_wire_put(w, 0, raw, &dec, ARENA_CODEC_HB4, 0, NULL);
	cr_assert_eq(arena_wire_seal(w, "b"), 0, "%s", arena_last_error());
	const uint64_t cuts[][2] = {{0, raw}, {1, raw}, {0, raw - 1}, {3, 4}, {3, 6}, {8191, 8193}, {5, 39999}, {12345, 23457}};
	for (size_t k = 0; k < sizeof(cuts) / sizeof(cuts[0]); k++) {
		uint64_t a = cuts[k][0], z = cuts[k][1];
		memset(out, 0, raw);
		arena_wire_decode(w, a, z, out);
		cr_assert_eq(memcmp(out, in + a, z - a), 0, "[%lu, %lu)", (unsigned long)a, (unsigned long)z);
	}
	arena_free(w->buf);
	arena_wire_free(w);
	arena_free(in);
	arena_free(st);
	arena_free(out);
}

/* A chunk table of hb4 and plain chunks: plans cover the range in order,
 * split straddling chunks between blocks, and say when coding is not worth
 * it. */
Test(wire, plans_cover_blocks_and_split_straddling_chunks)
{
	const uint64_t cs = 65536;
	arena_img_chunk ch[4] = {0};
	for (int i = 0; i < 4; i++) {
		ch[i].raw_length = (uint32_t)cs;
		ch[i].codec = i == 2 ? ARENA_CODEC_NONE : ARENA_CODEC_HB4;
		ch[i].stored_length = i == 2 ? (uint32_t)cs : (uint32_t)arena_hb4_stored_length(cs, 20);
	}
	/* a block from the middle of chunk 0 to the middle of chunk 3, odd edges */
	arena_wire *w;
	const uint64_t off = 30001, bytes = 3 * cs + 5000;
	cr_assert_eq(arena_wire_plan(ch, 4, cs, off, bytes, &w), 0);
	cr_assert_not_null(w);
	uint64_t at = 0;
	for (size_t i = 0; i < w->n; i++) {
		const arena_wire_seg *g = &w->seg[i];
		cr_assert_eq(g->dst, at, "segments in order, no gap");
		at += g->raw;
		cr_assert_eq(g->src % 256, 0);
		if (g->codec == ARENA_CODEC_HB4) {
			cr_assert_eq(g->coff % 4, 0);
			cr_assert_eq(g->raw % 2, 0);
			cr_assert_leq(g->coff + g->raw, cs);
			cr_assert_eq((off + g->dst) / cs, g->chunk, "an hb4 segment lies in its chunk");
		}
		if (i)
			cr_assert(!(g->codec == ARENA_CODEC_NONE && w->seg[i - 1].codec == ARENA_CODEC_NONE), "plain ones merged");
	}
	cr_assert_eq(at, bytes);
	cr_assert_eq(w->n_hb4, 3);
	cr_assert_lt(w->cap, bytes);
	const uint64_t whole = w->cap;
	arena_wire_free(w);
	/* cut into segments of at most 8 KiB: more of them, about the same room */
	arena__wire_seg_max = 8192;
	cr_assert_eq(arena_wire_plan(ch, 4, cs, off, bytes, &w), 0);
	arena__wire_seg_max = 0;
	cr_assert_not_null(w);
	cr_assert_geq(w->n_hb4, 16);
	for (size_t i = 0; i < w->n; i++)
		cr_assert_leq(w->seg[i].codec == ARENA_CODEC_HB4 ? w->seg[i].raw : 0, 8192);
	cr_assert_lt(w->cap, whole + whole / 10);
	arena_wire_free(w);
	/* the plain chunk alone: nothing to gain */
	cr_assert_eq(arena_wire_plan(ch, 4, cs, 2 * cs + 100, 1000, &w), 0);
	cr_assert_null(w);
	/* too many exceptions to save 5 % */
	ch[0].stored_length = (uint32_t)arena_hb4_stored_length(cs, 3000);
	cr_assert_eq(arena_wire_plan(ch, 4, cs, 0, cs, &w), 0);
	cr_assert_null(w);
}

static char dir[256];
static const char *img, *plain;

static void setup(void)
{
	arena__wire_seg_max = 4096; /* four stages of 4 KiB: a tiny model streams coded under small caps */
	arena__wire_stage_pool = 16384;
	tmpdir_make(dir, sizeof(dir), "test-wire");
	const char *in = fixture_path("tiny_flux.safetensors");
	img = tmpdir_file(dir, "c.arena");
	arena_convert_opts co = {.chunk_size = 64 << 10, .threads = 1, .codec = ARENA_CODEC_HB4};
	arena_convert_result cst;
	cr_assert_eq(arena_convert_inputs(&in, 1, img, &co, &cst), 0, "%s", arena_last_error());
	cr_assert_gt(cst.coded_chunks, 0);
	plain = tmpdir_file(dir, "p.arena");
	arena_convert_opts po = {.chunk_size = 64 << 10, .threads = 1};
	cr_assert_eq(arena_convert_inputs(&in, 1, plain, &po, NULL), 0, "%s", arena_last_error());
}

static void teardown(void)
{
	arena__wire_seg_max = 0;
	arena__wire_stage_pool = 0;
	tmpdir_remove(dir);
}

/* Streams most blocks (a cap just above the floor). */
static arena_open_options opts(uint64_t piece, int mode, unsigned flags)
{
	return (arena_open_options){.backend = "sim",
				    .vram_cap = piece ? 200 << 10 : mode ? 297 << 10 : 260 << 10,
				    .depth = piece ? 0 : 1,
				    .headroom = ARENA_ZERO_BYTES,
				    .reserve = ARENA_ZERO_BYTES,
				    .piece_size = piece,
				    .mode = mode,
				    .flags = ARENA_OPEN_NO_LEARN | flags};
}

/* `steps` steps over every block (train: forward then backward), each
 * acquired block's tensors against ref's; the bytes streamed and moved. */
static void run_steps(arena *a, arena *ref, int steps, int train, uint64_t *streamed, uint64_t *moved)
{
	arena_step_info sum;
	steps_over_blocks(a, ref, steps, train, &sum);
	*streamed = sum.streamed_bytes;
	*moved = sum.moved_bytes;
}

Test(wire, streamed_blocks_move_coded_and_hold_the_images_bytes, .init = setup, .fini = teardown)
{
	arena_open_options ro = {.backend = "sim"};
	arena *ref;
	cr_assert_eq(arena_open(plain, &ro, &ref), 0, "%s", arena_last_error());
	const uint64_t pieces[] = {0, 16384};
	for (int k = 0; k < 2; k++)
		for (int mode = 0; mode < 2; mode++) {
			arena_open_options o = opts(pieces[k], mode, 0);
			arena *a;
			cr_assert_eq(arena_open(img, &o, &a), 0, "%s", arena_last_error());
			arena_plan_info p;
			cr_assert_eq(arena_plan_get(a, &p), 0);
			cr_assert_gt(p.n_streamed, 1, "piece %lu mode %d: %zu streamed, %zu blocks, budget %lu need %lu", (unsigned long)pieces[k], mode, p.n_streamed, arena_block_count(a), (unsigned long)p.budget, (unsigned long)p.need_bytes);
			uint64_t streamed, moved;
			run_steps(a, ref, 4, mode, &streamed, &moved);
			cr_assert_gt(streamed, 0);
			cr_assert_lt(moved, streamed - streamed / 10, "coded copies move fewer bytes: %lu of %lu",
				     (unsigned long)moved, (unsigned long)streamed);
			cr_assert_lt(p.host_bytes, p.streamed_block_bytes - p.streamed_block_bytes / 20,
				     "host copies are coded: %lu for %lu", (unsigned long)p.host_bytes,
				     (unsigned long)p.streamed_block_bytes);
			arena_close(a);
			/* the same run with raw host copies */
			o = opts(pieces[k], mode, ARENA_OPEN_PLAIN_STREAM);
			cr_assert_eq(arena_open(img, &o, &a), 0, "%s", arena_last_error());
			cr_assert_eq(arena_plan_get(a, &p), 0);
			uint64_t s2, m2;
			run_steps(a, ref, 4, mode, &s2, &m2);
			cr_assert_eq(m2, s2, "raw host copies move what they hold");
			cr_assert_geq(p.host_bytes, p.streamed_block_bytes);
			arena_close(a);
		}
	arena_close(ref);
}

/* Stages of 12 KiB: copies carry runs of three segments, decoded from one
 * stage; the bytes are the same. */
Test(wire, runs_of_segments_share_a_stage, .init = setup, .fini = teardown)
{
	arena__wire_stage_pool = 48 << 10;
	arena_open_options ro = {.backend = "sim"};
	arena *ref, *a;
	cr_assert_eq(arena_open(plain, &ro, &ref), 0, "%s", arena_last_error());
	arena_open_options o = opts(16384, 0, 0);
	o.vram_cap = 240 << 10;
	cr_assert_eq(arena_open(img, &o, &a), 0, "%s", arena_last_error());
	arena_plan_info p;
	cr_assert_eq(arena_plan_get(a, &p), 0);
	cr_assert_gt(p.n_streamed, 1);
	uint64_t streamed, moved;
	run_steps(a, ref, 3, 0, &streamed, &moved);
	cr_assert_lt(moved, streamed - streamed / 10);
	arena_close(a);
	arena_close(ref);
}

/* The disk tier's least staging for an image opened with options o: what
 * a host budget of 0 holds. */
static uint64_t least_staging(const char *path, arena_open_options o)
{
	arena *a;
	o.host_budget = ARENA_ZERO_BYTES;
	cr_assert_eq(arena_open(path, &o, &a), 0, "%s", arena_last_error());
	arena_plan_info p;
	cr_assert_eq(arena_plan_get(a, &p), 0);
	arena_close(a);
	return p.staging_bytes;
}

/* Under a host budget, coded host copies hold more blocks than raw ones:
 * fewer are left in the image (the disk tier), within the same room for
 * host copies (the budget less each one's staging: the coded image's slots
 * hold its coded regions), and the bytes are the same. */
Test(wire, a_host_budget_holds_more_blocks_coded, .init = setup, .fini = teardown)
{
	arena_open_options ro = {.backend = "sim"};
	arena *ref, *a, *b;
	cr_assert_eq(arena_open(plain, &ro, &ref), 0, "%s", arena_last_error());
	arena_open_options o = opts(16384, 0, 0);
	const uint64_t sa = least_staging(img, o), sb = least_staging(plain, o);
	o.host_budget = sa + (64 << 10);
	cr_assert_eq(arena_open(img, &o, &a), 0, "%s", arena_last_error());
	o.host_budget = sb + (64 << 10);
	cr_assert_eq(arena_open(plain, &o, &b), 0, "%s", arena_last_error());
	arena_plan_info pa, pb;
	cr_assert_eq(arena_plan_get(a, &pa), 0);
	cr_assert_eq(arena_plan_get(b, &pb), 0);
	cr_assert_eq(pa.staging_bytes, sa);
	cr_assert_eq(pb.staging_bytes, sb);
	cr_assert_gt(pb.n_disk, 0);
	/* (the plans differ: the coded one leaves room for its stages) */
	cr_assert_gt(pa.n_streamed - pa.n_disk, pb.n_streamed - pb.n_disk, "host copies: coded %zu blocks, raw %zu",
		     pa.n_streamed - pa.n_disk, pb.n_streamed - pb.n_disk);
	cr_assert_leq(pa.host_bytes, 64 << 10);
	uint64_t streamed, moved;
	run_steps(a, ref, 3, 0, &streamed, &moved);
	cr_assert_lt(moved, streamed);
	arena_close(a);
	arena_close(b);
	arena_close(ref);
}

/* A resident block that leaves the device (here: another program takes
 * device memory) gets a host copy kept coded, re-read coded from the image:
 * after the demotions every streamed block still moves coded, the bytes
 * are the image's, and the host copies hold the coded sizes. (A raw copy,
 * decoded on the host, was what a demoted block got before.) */
Test(wire, demoted_blocks_get_coded_host_copies, .init = setup, .fini = teardown)
{
	arena_open_options ro = {.backend = "sim"};
	arena *ref, *a = NULL;
	cr_assert_eq(arena_open(plain, &ro, &ref), 0, "%s", arena_last_error());
	uint64_t total = 0;
	for (size_t i = 0; i < arena_block_count(ref); i++)
		total += arena_block_bytes(ref, i);
	/* the largest cap that still streams a block or two (so coded copies have their stages) */
	arena_plan_info p = {0};
	uint64_t cap;
	for (cap = total + (64 << 10); cap > (64 << 10); cap -= 4096) {
		arena_open_options o = opts(16384, 0, 0); /* in pieces: most of the model can stay */
		o.vram_cap = 0;
		o.sim_capacity = cap; /* a device of that size, whose headroom another program takes below */
		o.headroom = cap / 3 + 4096;
		cr_assert_eq(arena_open(img, &o, &a), 0, "%s", arena_last_error());
		cr_assert_eq(arena_plan_get(a, &p), 0);
		if (p.n_streamed >= 1)
			break;
		arena_close(a);
		a = NULL;
	}
	cr_assert_not_null(a, "no cap streams a block");
	const size_t before = p.n_streamed;
	const uint64_t host_before = p.host_bytes, res_before = p.resident_bytes;
	uint64_t streamed, moved;
	run_steps(a, ref, 2, 0, &streamed, &moved);
	cr_assert_eq(arena_sim_pressure(a, cap / 3), 0, "%s", arena_last_error());
	run_steps(a, ref, 2, 0, &streamed, &moved); /* the demotions happen at a step's end */
	run_steps(a, ref, 3, 0, &streamed, &moved);
	cr_assert_eq(arena_plan_get(a, &p), 0);
	cr_assert_gt(p.n_streamed, before + 1, "pressure streamed more blocks: %zu, %zu before", p.n_streamed, before);
	cr_assert_lt(moved, streamed - streamed / 10, "every streamed block moves coded: %lu of %lu bytes",
		     (unsigned long)moved, (unsigned long)streamed);
	const uint64_t left = res_before - p.resident_bytes; /* raw bytes that left the device */
	cr_assert_gt(left, 0);
	cr_assert_lt(p.host_bytes - host_before, left, "host copies grew by %lu for %lu raw bytes that left the device",
		     (unsigned long)(p.host_bytes - host_before), (unsigned long)left);
	arena_close(a);
	arena_close(ref);
}

/* The disk tier of an hb4 image: streamed blocks beyond the host budget are
 * read coded from the image (chunks checked, nothing decoded on the host)
 * and copied coded; the bytes are the image's, step after step, whole
 * blocks and pieces; fewer bytes read and moved than streamed. */
Test(wire, the_disk_tier_reads_and_moves_coded_bytes, .init = setup, .fini = teardown)
{
	arena_open_options ro = {.backend = "sim"};
	arena *ref, *a;
	cr_assert_eq(arena_open(plain, &ro, &ref), 0, "%s", arena_last_error());
	const uint64_t pieces[] = {0, 16384};
	for (int k = 0; k < 4; k++) {
		/* and in parts smaller than a block's coded form: several regions of
		 * a block's segments read (and copied) a slot at a time */
		arena__disk_part = k >= 2 ? 8192 : 0;
		arena_open_options o = opts(pieces[k % 2], 0, 0);
		o.host_budget = ARENA_ZERO_BYTES;
		cr_assert_eq(arena_open(img, &o, &a), 0, "%s", arena_last_error());
		arena_plan_info p;
		cr_assert_eq(arena_plan_get(a, &p), 0);
		cr_assert_gt(p.n_disk, 1);
		cr_assert_eq(p.n_disk, p.n_streamed);
		cr_assert_eq(p.host_bytes, 0);
		arena_step_info sum;
		steps_over_blocks(a, ref, 4, 0, &sum);
		cr_assert_gt(sum.disk_bytes, 0);
		cr_assert_lt(sum.disk_bytes, sum.streamed_bytes - sum.streamed_bytes / 10, "read coded: %lu of %lu",
			     (unsigned long)sum.disk_bytes, (unsigned long)sum.streamed_bytes);
		cr_assert_lt(sum.moved_bytes, sum.streamed_bytes - sum.streamed_bytes / 10);
		arena_close(a);
	}
	arena__disk_part = 0;
	arena_close(ref);
}

/* The image changed under a coded disk tier: bytes flipped in every 4 KiB
 * of its data are caught when a block is read (its chunk's checksum, before
 * anything is copied), naming the block; never wrong bytes. */
Test(wire, a_corrupted_image_under_the_coded_disk_tier, .init = setup, .fini = teardown)
{
	arena_open_options o = opts(16384, 0, 0);
	o.host_budget = ARENA_ZERO_BYTES;
	arena *a;
	cr_assert_eq(arena_open(img, &o, &a), 0, "%s", arena_last_error());
	flip_a_byte_a_page(img, 40960 + 100, 4096 - 100);
	int rc = try_step_over_blocks(a, NULL);
	cr_assert_eq(rc, ARENA_E(IMG_CHUNK_CHECKSUM), "%s: %s", arena_err_name(rc), arena_last_error());
	cr_assert(strstr(arena_last_error(), "blocks.") != NULL, "names no block: %s", arena_last_error());
	arena_close(a);
}

/* A flipped byte in a coded chunk of a streamed block: the open fails
 * naming the chunk, and nothing is left open. */
Test(wire, a_corrupted_coded_chunk_fails_the_open, .init = setup, .fini = teardown)
{
	arena_image *im;
	cr_assert_eq(arena_img_open(img, &im), 0, "%s", arena_last_error());
	uint64_t c = im->hdr.chunk_count - 2, at = im->hdr.data_offset + im->chunks[c].offset + 100;
	cr_assert_eq(im->chunks[c].codec, ARENA_CODEC_HB4);
	arena_img_close(im);
	int fd = open(img, O_RDWR);
	cr_assert_geq(fd, 0);
	uint8_t b;
	cr_assert_eq(pread(fd, &b, 1, (off_t)at), 1);
	b ^= 0x40;
	cr_assert_eq(pwrite(fd, &b, 1, (off_t)at), 1);
	close(fd);
	arena_open_options o = opts(0, 0, 0);
	arena *a = NULL;
	int rc = arena_open(img, &o, &a);
	cr_assert_eq(rc, ARENA_E(IMG_CHUNK_CHECKSUM), "%s: %s", arena_err_name(rc), arena_last_error());
	cr_assert_null(a);
	char want[64];
	snprintf(want, sizeof(want), "chunk %lu", (unsigned long)c);
	cr_assert(strstr(arena_last_error(), want), "%s", arena_last_error());
}

Test(wire, allocation_failures, .init = setup, .fini = teardown)
{
	slow_test();
	arena_open_options ro = {.backend = "sim"};
	arena *ref;
	cr_assert_eq(arena_open(plain, &ro, &ref), 0, "%s", arena_last_error());
	arena_open_options o = opts(16384, 0, 0);
	long n;
	for (n = 1; n < 100000; n += 3) {
		arena *a = NULL;
		arena_fault_alloc(n);
		int rc = arena_open(img, &o, &a);
		int fired = arena_fault_alloc_fired();
		arena_fault_alloc(0);
		if (!fired) {
			cr_assert_eq(rc, 0, "%s", arena_last_error());
			uint64_t s, m;
			run_steps(a, ref, 2, 0, &s, &m);
			cr_assert_lt(m, s);
			arena_close(a);
			break;
		}
		cr_assert(rc == ARENA_E_NOMEM || rc == 0, "n=%ld: %s: %s", n, arena_err_name(rc), arena_last_error());
		if (!rc) { /* the failure hit something that has a fallback: the bytes are still right */
			uint64_t s, m;
			run_steps(a, ref, 1, 0, &s, &m);
		}
		arena_close(a);
	}
	cr_assert_gt(n, 50);
	/* the coded disk tier allocates as it first reads (staging, readers):
	 * a failure there fails the step with NOMEM, never wrong bytes */
	o.host_budget = ARENA_ZERO_BYTES;
	for (n = 1; n < 100000; n++) {
		arena *a = NULL;
		cr_assert_eq(arena_open(img, &o, &a), 0, "%s", arena_last_error());
		arena_fault_alloc(n);
		int rc = try_step_over_blocks(a, ref);
		int fired = arena_fault_alloc_fired();
		arena_fault_alloc(0);
		arena_close(a);
		if (!fired) {
			cr_assert_eq(rc, 0, "%s", arena_last_error());
			break;
		}
		cr_assert(rc == ARENA_E_NOMEM || rc == 0, "n=%ld: %s: %s", n, arena_err_name(rc), arena_last_error());
	}
	cr_assert_gt(n, 3);
	arena_close(ref);
}
