/* fuzz_codec.c - libFuzzer target for the hb4 chunk codec (formats/codec.h).
 *
 * Two uses of one input, by its first byte:
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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
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
