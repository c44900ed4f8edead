/* test_hash.c - arena's XXH3 equals libxxhash's, one-shot and streamed, on every ISA. */
#include <criterion/criterion.h>

#include <stdlib.h>
#include <xxhash.h>

#include "../../common/hash.h"

Test(hash, equals_libxxhash)
{
	size_t n = 70000;
	unsigned char *b = malloc(n);
	for (size_t i = 0; i < n; i++)
		b[i] = (unsigned char)(i * 131 + (i >> 7));
	for (size_t len = 0; len < n; len = len * 3 / 2 + 1) {
		cr_assert_eq(arena_xxh3(b, len), XXH3_64bits(b, len), "len %zu (%s)", len, arena_hash_isa());
		for (size_t cut = 0; cut <= len; cut += len / 5 + 1) {
			arena_hash h;
			arena_hash_reset(&h);
			arena_hash_update(&h, b, cut);
			arena_hash_update(&h, b + cut, len - cut);
			cr_assert_eq(arena_hash_digest(&h), XXH3_64bits(b, len), "len %zu cut %zu", len, cut);
		}
	}
	free(b);
}
