/* hash_avx2.c - xxHash's header-only XXH3 compiled for AVX2 (see hash.h).
 * Only called after a run-time check that the CPU has AVX2. */
#if defined(__x86_64__) && defined(__GNUC__)
#ifdef __clang__
/* clang ignores GCC's target pragma (and defines no __AVX2__, so xxhash.h
 * would not include the intrinsics): attributes and the header by hand. */
#include <immintrin.h>
#pragma clang attribute push(__attribute__((target("avx2"))), apply_to = function)
#else
#pragma GCC target("avx2")
#endif
#define XXH_INLINE_ALL
#define XXH_VECTOR 2 /* XXH_AVX2 */
#include <stddef.h>
#include <stdint.h>
#include <xxhash.h>

uint64_t arena__xxh3_avx2(const void *p, size_t n);
void arena__xxh3_avx2_reset(void *st);
void arena__xxh3_avx2_update(void *st, const void *p, size_t n);
uint64_t arena__xxh3_avx2_digest(const void *st);

uint64_t arena__xxh3_avx2(const void *p, size_t n)
{
	return XXH3_64bits(p, n);
}

void arena__xxh3_avx2_reset(void *st)
{
	XXH3_64bits_reset((XXH3_state_t *)st);
}

void arena__xxh3_avx2_update(void *st, const void *p, size_t n)
{
	XXH3_64bits_update((XXH3_state_t *)st, p, n);
}

uint64_t arena__xxh3_avx2_digest(const void *st)
{
	return XXH3_64bits_digest((const XXH3_state_t *)st);
}
#ifdef __clang__
#pragma clang attribute pop
#endif
#else
typedef int arena__hash_avx2_unused;
#endif
