/* hash.c - XXH3 with run-time choice between the system library and an AVX2
 * build of xxHash's own header-only code (see hash.h). */
#include "hash.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

_Static_assert(sizeof(XXH3_state_t) <= sizeof(((arena_hash *)0)->opaque), "arena_hash too small");

#if defined(__x86_64__) && defined(__GNUC__)
uint64_t arena__xxh3_avx2(const void *p, size_t n);
void arena__xxh3_avx2_reset(void *st);
void arena__xxh3_avx2_update(void *st, const void *p, size_t n);
uint64_t arena__xxh3_avx2_digest(const void *st);

/* Decided once, whichever thread asks first (readers ask at once). */
static int avx2;
static pthread_once_t avx2_once = PTHREAD_ONCE_INIT;

static void decide_avx2(void)
{
	const char *e = getenv("ARENA_HASH_ISA");
	__builtin_cpu_init();
	avx2 = (!e || strcmp(e, "baseline")) && __builtin_cpu_supports("avx2");
}

static int use_avx2(void)
{
	pthread_once(&avx2_once, decide_avx2);
	return avx2;
}
#else
static int use_avx2(void)
{
	return 0;
}
#define arena__xxh3_avx2(p, n) 0
#define arena__xxh3_avx2_reset(st) (void)0
#define arena__xxh3_avx2_update(st, p, n) (void)0
#define arena__xxh3_avx2_digest(st) 0
#endif

uint64_t arena_xxh3(const void *p, size_t n)
{
	return use_avx2() ? arena__xxh3_avx2(p, n) : XXH3_64bits(p, n);
}

void arena_hash_reset(arena_hash *h)
{
	if (use_avx2())
		arena__xxh3_avx2_reset(h->opaque);
	else
		XXH3_64bits_reset((XXH3_state_t *)(void *)h->opaque);
}

void arena_hash_update(arena_hash *h, const void *p, size_t n)
{
	if (use_avx2())
		arena__xxh3_avx2_update(h->opaque, p, n);
	else
		XXH3_64bits_update((XXH3_state_t *)(void *)h->opaque, p, n);
}

uint64_t arena_hash_digest(const arena_hash *h)
{
	return use_avx2() ? arena__xxh3_avx2_digest(h->opaque)
			  : XXH3_64bits_digest((const XXH3_state_t *)(const void *)h->opaque);
}

const char *arena_hash_isa(void)
{
	return use_avx2() ? "avx2" : "baseline";
}
