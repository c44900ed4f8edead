/* codec_bench.c - the chunk codecs on an image's own data, one thread, no
 * disk: for each chunk of an image (up to --max-bytes of raw data, evenly
 * spread over the image), the stored size and the encode and decode rates of
 * hb4, zstd at each level asked (byte-grouped, each chunk's element width as
 * convert picks it) and plain zstd on the interleaved bytes (width 1), and
 * the entropy of the data's bytes by position in a 16-bit word. Sizes are
 * what an image stores: a chunk kept only where it saves a 4 KiB page, each
 * chunk rounded up to 4 KiB. Rates are GB/s of raw (decoded) bytes, best of
 * --repeat passes, each decode into a chunk buffer from the stored bytes in
 * memory (zstd: parse, decompress the packed streams, gather; hb4: parse and
 * decode). The limit beside the sizes, from the same data: the entropy of
 * each byte position (what an ideal code of each position alone would
 * store). Needs no GPU: `make bench-cpu` (build/bench/codec_bench).
 *
 *   codec_bench IMAGE [--levels 1,2,3] [--max-bytes SIZE_MIB] [--repeat N]
 *
 * Prints one JSON object. Exit status: 0, 2 for usage, 3 on an error.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "../common/alloc.h"
#include "../common/clock.h"
#include "../formats/codec.h"
#include "../formats/image.h"

#define MAX_LEVELS 19

static int fail(const char *what)
{
	fprintf(stderr, "error: %s: %s\n", what, arena_last_error());
	return 3;
}

/* The width convert gives chunk i: the dtype width most of its bytes have. */
static unsigned chunk_width(const arena_image *img, uint64_t i)
{
	const arena_layout *l = img->layout;
	uint64_t c0 = i * img->hdr.chunk_size, c1 = c0 + img->chunks[i].raw_length, by[9] = {0};
	for (size_t t = 0; t < l->n_tensors; t++)
		for (uint32_t c = 0; c < l->tensors[t].n_comp; c++) {
			const arena_component *cp = &l->tensors[t].comp[c];
			uint64_t a = l->blocks[l->tensors[t].block].offset + cp->offset, z = a + cp->bytes;
			a = a > c0 ? a : c0;
			z = z < c1 ? z : c1;
			unsigned bits = cp->dtype == ARENA_DTYPE_C64 ? 32 : arena_dtype_bits(cp->dtype);
			if (z > a)
				by[arena_zstd_width_for_bits(bits)] += z - a;
		}
	unsigned best = 1;
	for (unsigned w = 2; w <= 8; w *= 2)
		if (by[w] > by[best])
			best = w;
	return best;
}

typedef struct acc {
	uint64_t stored;     /* bytes in an image */
	double enc_s, dec_s; /* best pass, summed over chunks */
} acc;

static uint64_t page(uint64_t n, uint64_t raw)
{
	uint64_t p = (n + 4095) / 4096 * 4096;
	return n && p < raw ? p : raw;
}

static double entropy(const uint64_t *h)
{
	uint64_t n = 0;
	for (int k = 0; k < 256; k++)
		n += h[k];
	double e = 0;
	for (int k = 0; k < 256; k++)
		if (h[k])
			e -= (double)h[k] / (double)n * log2((double)h[k] / (double)n);
	return e;
}

int main(int argc, char **argv)
{
	const char *path = NULL;
	int levels[MAX_LEVELS], n_levels = 0, repeat = 3;
	uint64_t max_bytes = 1024ull << 20;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--levels") && i + 1 < argc) {
			for (char *s = strtok(argv[++i], ","); s && n_levels < MAX_LEVELS; s = strtok(NULL, ","))
				levels[n_levels++] = atoi(s);
		} else if (!strcmp(argv[i], "--max-bytes") && i + 1 < argc) {
			max_bytes = strtoull(argv[++i], NULL, 10) << 20;
		} else if (!strcmp(argv[i], "--repeat") && i + 1 < argc) {
			repeat = atoi(argv[++i]);
		} else if (argv[i][0] != '-' && !path) {
			path = argv[i];
		} else {
			fprintf(stderr, "usage: codec_bench IMAGE [--levels 1,2,3] [--max-bytes MIB] [--repeat N]\n");
			return 2;
		}
	}
	if (!path) {
		fprintf(stderr, "usage: codec_bench IMAGE [--levels 1,2,3] [--max-bytes MIB] [--repeat N]\n");
		return 2;
	}
	if (!n_levels)
		levels[n_levels++] = ARENA_ZSTD_DEFAULT_LEVEL;
	if (repeat < 1)
		repeat = 1;
	arena_image *img;
	if (arena_img_open(path, &img))
		return fail(path);
	arena_img_reader rd;
	if (arena_img_reader_init(&rd, img, 1))
		return fail(path);
	const uint64_t cs = img->hdr.chunk_size, nc = img->hdr.chunk_count;
	uint64_t take = max_bytes / cs ? max_bytes / cs : 1;
	if (take > nc)
		take = nc;
	uint8_t *raw = arena_malloc(cs), *st = arena_malloc(cs), *back = arena_malloc(cs);
	arena_zstd_work w = {0}, d = {0};
	acc hb4 = {0}, interleaved = {0}, lv[MAX_LEVELS] = {{0}};
	uint64_t hist[2][256] = {{0}}, raw_total = 0, widths[9] = {0};
	if (!raw || !st || !back)
		return fail("memory");
	for (uint64_t t = 0; t < take; t++) {
		const uint64_t i = t * nc / take, len = img->chunks[i].raw_length;
		if (arena_img_read_raw(&rd, i * cs, len, raw))
			return fail(path);
		raw_total += len;
		for (uint64_t k = 0; k < len; k++)
			hist[k % 2][raw[k]]++;
		const unsigned width = chunk_width(img, i);
		widths[width] += len;
		/* hb4 */
		double be = 1e9, bd = 1e9;
		uint64_t n = 0;
		for (int r = 0; r < repeat; r++) {
			double t0 = arena_now_s();
			n = arena_hb4_encode(raw, len, st);
			double t1 = arena_now_s();
			if (n) {
				arena_hb4 v;
				if (arena_hb4_parse(st, n, len, "bench", &v))
					return fail("hb4 parse");
				arena_hb4_decode(&v, 0, len, back);
			}
			double t2 = arena_now_s();
			be = t1 - t0 < be ? t1 - t0 : be;
			bd = t2 - t1 < bd ? t2 - t1 : bd;
		}
		if (n && memcmp(back, raw, len))
			return fail("hb4 round trip");
		hb4.stored += page(n, len), hb4.enc_s += be, hb4.dec_s += n ? bd : 0;
		/* zstd, byte-grouped at each level, then on the interleaved bytes */
		for (int k = 0; k <= n_levels; k++) {
			const int level = k < n_levels ? levels[k] : ARENA_ZSTD_DEFAULT_LEVEL;
			const unsigned g = k < n_levels ? width : 1;
			acc *a = k < n_levels ? &lv[k] : &interleaved;
			be = bd = 1e9;
			for (int r = 0; r < repeat; r++) {
				double t0 = arena_now_s();
				if (arena_zstd_encode(&w, raw, len, g, level, st, &n))
					return fail("zstd encode");
				double t1 = arena_now_s();
				if (n) {
					arena_zstd v;
					if (arena_zstd_parse(st, n, len, "bench", &v) || arena_zstd_decode(&d, &v, st, "bench"))
						return fail("zstd decode");
					arena_zstd_gather(&v, 0, len, back);
				}
				double t2 = arena_now_s();
				be = t1 - t0 < be ? t1 - t0 : be;
				bd = t2 - t1 < bd ? t2 - t1 : bd;
			}
			if (n && memcmp(back, raw, len))
				return fail("zstd round trip");
			a->stored += page(n, len), a->enc_s += be, a->dec_s += n ? bd : 0;
		}
	}
	const double R = (double)raw_total;
	printf("{\"image\": \"%s\", \"chunks\": %llu, \"chunk_size\": %llu, \"raw_bytes\": %llu,\n", path,
	       (unsigned long long)take, (unsigned long long)cs, (unsigned long long)raw_total);
	printf(" \"bytes_by_width\": {\"1\": %llu, \"2\": %llu, \"4\": %llu, \"8\": %llu},\n",
	       (unsigned long long)widths[1], (unsigned long long)widths[2], (unsigned long long)widths[4],
	       (unsigned long long)widths[8]);
	printf(" \"entropy_bits\": {\"even_bytes\": %.3f, \"odd_bytes\": %.3f},\n", entropy(hist[0]), entropy(hist[1]));
	printf(" \"hb4\": {\"stored\": %.4f, \"encode_gbps\": %.3f, \"decode_gbps\": %.3f},\n", (double)hb4.stored / R,
	       R / hb4.enc_s / 1e9, hb4.dec_s > 0 ? R / hb4.dec_s / 1e9 : 0.0);
	printf(" \"zstd_interleaved_level%d\": {\"stored\": %.4f, \"encode_gbps\": %.3f, \"decode_gbps\": %.3f},\n",
	       ARENA_ZSTD_DEFAULT_LEVEL, (double)interleaved.stored / R, R / interleaved.enc_s / 1e9,
	       interleaved.dec_s > 0 ? R / interleaved.dec_s / 1e9 : 0.0);
	printf(" \"zstd\": [");
	for (int k = 0; k < n_levels; k++)
		printf("%s\n  {\"level\": %d, \"stored\": %.4f, \"encode_gbps\": %.3f, \"decode_gbps\": %.3f}", k ? "," : "",
		       levels[k], (double)lv[k].stored / R, R / lv[k].enc_s / 1e9,
		       lv[k].dec_s > 0 ? R / lv[k].dec_s / 1e9 : 0.0);
	printf("]}\n");
	arena_zstd_work_free(&w);
	arena_zstd_work_free(&d);
	arena_free(raw);
	arena_free(st);
	arena_free(back);
	arena_img_reader_free(&rd);
	arena_img_close(img);
	return 0;
}
