/* fuzz_codec.c - libFuzzer target for the chunk codecs (formats/codec.h).
 *
 * Four uses of one input, by its first byte:
 * - 'z': the rest is a stored zstd chunk; bytes 1..4 give raw_length. It is
 *   parsed, and when the parse accepts it, its streams are decoded (each into
 *   exactly its size: ASan catches a write past it) and, when they decode,
 *   gathered whole and in pieces into buffers exactly as long as asked; the
 *   pieces must agree, and the first non-zero byte of a range must be the
 *   gathered bytes' first.
 * - 'Z': byte 1 picks the element width, byte 2 the level (1..3), the rest
 *   is raw data; it is encoded, and when zstd takes it, the result must be
 *   shorter, parse, decode and gather back to the same bytes.
 * Otherwise, hb4:
 * - even: the rest is a stored chunk; bytes 1..4 give raw_length. It is
 *   parsed, and when the parse accepts it, decoded whole and in pieces into
 *   buffers exactly as long as asked (ASan catches any write past them).
 *   The first non-zero byte of a range (odd ends too) must be the decoded
 *   bytes' first non-zero byte, also from a copy of the chunk that holds only
 *   the bytes arena_hb4_reads names and the exception lists.
 * - odd: the rest is raw data; it is encoded, and when hb4 takes it, the
 *   result must parse and decode back to the same bytes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/err.h"
#include "../../formats/codec.h"

static void zstd_stored(const uint8_t *data, size_t size)
{
	if (size < 5)
		return;
	uint64_t raw = ((uint64_t)data[1] | (uint64_t)data[2] << 8 | (uint64_t)data[3] << 16 |
			(uint64_t)data[4] << 24) % (1u << 22);
	uint64_t n = size - 5;
	uint8_t *copy = malloc(n ? n : 1); /* exactly n bytes */
	if (!copy)
		return;
	memcpy(copy, data + 5, n);
	arena_zstd v;
	arena_zstd_work w = {0};
	if (arena_zstd_parse(copy, n, raw, "fuzz", &v) == 0 && arena_zstd_decode(&w, &v, copy, "fuzz") == 0) {
		uint8_t *out = malloc(raw ? raw : 1);
		if (out) {
			arena_zstd_gather(&v, 0, raw, out);
			uint64_t a = raw / 3, z = raw - raw / 5;
			uint8_t *part = malloc(z - a ? z - a : 1);
			if (part) {
				arena_zstd_gather(&v, a, z, part);
				if (memcmp(part, out + a, z - a))
					abort();
				free(part);
			}
			uint64_t fa = raw / 7, fz = raw - raw / 3, want = fa;
			while (want < fz && !out[want])
				want++;
			if (arena_zstd_first_nonzero(&v, fa, fz) != want)
				abort();
			free(out);
		}
	}
	arena_zstd_work_free(&w);
	arena_error_clear();
	free(copy);
}

static void zstd_encoded(const uint8_t *data, size_t size)
{
	if (size < 3)
		return;
	const unsigned width = 1u << (data[1] % 4);
	const int level = 1 + data[2] % 3;
	const uint64_t raw = (size - 3) / width * width;
	if (!raw)
		return;
	uint8_t *st = malloc(raw), *back = malloc(raw);
	arena_zstd_work w = {0}, d = {0};
	uint64_t n = 0;
	if (st && back && arena_zstd_encode(&w, data + 3, raw, width, level, st, &n) == 0 && n) {
		arena_zstd v;
		if (n >= raw || arena_zstd_parse(st, n, raw, "fuzz", &v) || arena_zstd_decode(&d, &v, st, "fuzz"))
			abort();
		arena_zstd_gather(&v, 0, raw, back);
		if (memcmp(back, data + 3, raw))
			abort();
	}
	arena_zstd_work_free(&w);
	arena_zstd_work_free(&d);
	arena_error_clear();
	free(st);
	free(back);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	if (data[0] == 'z') {
		zstd_stored(data, size);
		return 0;
	}
	if (data[0] == 'Z') {
		zstd_encoded(data, size);
		return 0;
	}
	if (data[0] % 2 == 0) {
		if (size < 5)
			return 0;
		uint64_t raw = ((uint64_t)data[1] | (uint64_t)data[2] << 8 | (uint64_t)data[3] << 16 |
				(uint64_t)data[4] << 24) % (1u << 22);
		const uint8_t *st = data + 5;
		uint64_t n = size - 5;
		uint8_t *copy = malloc(n ? n : 1); /* exactly n bytes: reads past it are caught */
		if (!copy)
			return 0;
		memcpy(copy, st, n);
		arena_hb4 v;
		if (arena_hb4_parse(copy, n, raw, "fuzz", &v) == 0) {
			uint8_t *out = malloc(raw);
			if (out) {
				arena_hb4_decode(&v, 0, raw, out);
				uint64_t a = (raw / 3) & ~1ull, z = (raw - raw / 5) & ~1ull;
				if (a <= z) {
					uint8_t *part = malloc(z - a ? z - a : 1);
					if (part) {
						arena_hb4_decode(&v, a, z, part);
						if (memcmp(part, out + a, z - a))
							abort();
						free(part);
					}
				}
				uint64_t fa = raw / 3, fz = raw - raw / 7, want = fa;
				while (want < fz && !out[want])
					want++;
				uint64_t nib[2], low[2];
				arena_hb4_reads(v.words, fa, fz, nib, low);
				uint8_t *sparse = malloc(n ? n : 1);
				if (sparse) {
					memset(sparse, 0xEE, n);
					memcpy(sparse + nib[0], copy + nib[0], nib[1] - nib[0]);
					memcpy(sparse + low[0], copy + low[0], low[1] - low[0]);
					memcpy(sparse + v.idx_off, copy + v.idx_off, n - v.idx_off);
					arena_hb4 sv = v;
					sv.nib = sparse + v.nib_off, sv.low = sparse + v.low_off;
					sv.exc_idx = sparse + v.idx_off, sv.exc_hi = sparse + v.hi_off;
					if (arena_hb4_first_nonzero(&v, fa, fz) != want ||
					    arena_hb4_first_nonzero(&sv, fa, fz) != want)
						abort();
					free(sparse);
				}
				free(out);
			}
		}
		arena_error_clear();
		free(copy);
		return 0;
	}
	uint64_t raw = (size - 1) & ~(size_t)1;
	if (!raw)
		return 0;
	uint8_t *st = malloc(raw), *back = malloc(raw);
	if (st && back) {
		uint64_t n = arena_hb4_encode(data + 1, raw, st);
		if (n) {
			arena_hb4 v;
			if (n >= raw || arena_hb4_parse(st, n, raw, "fuzz", &v))
				abort();
			arena_hb4_decode(&v, 0, raw, back);
			if (memcmp(back, data + 1, raw))
				abort();
		}
	}
	free(st);
	free(back);
	return 0;
}
