/* hash.h - XXH3-64 (seed 0) for image checksums, using the widest vector
 * unit the CPU has. Same values as xxHash's XXH3_64bits (libxxhash); the
 * system library is built for baseline x86-64 (SSE2), which halves the
 * checksum rate of the loader's reader threads, so on x86-64 an AVX2 build
 * of the same header-only code is picked at run time. */
#ifndef ARENA_COMMON_HASH_H
#define ARENA_COMMON_HASH_H

#include <stddef.h>
#include <stdint.h>

/* Streaming state: reset, update with pieces in order, digest. */
typedef struct arena_hash {
	_Alignas(64) unsigned char opaque[640]; /* an XXH3_state_t */
} arena_hash;

uint64_t arena_xxh3(const void *p, size_t n);
void arena_hash_reset(arena_hash *h);
void arena_hash_update(arena_hash *h, const void *p, size_t n);
uint64_t arena_hash_digest(const arena_hash *h);
/* "avx2" or "baseline": what this CPU runs (ARENA_HASH_ISA=baseline forces it). */
const char *arena_hash_isa(void);

#endif
