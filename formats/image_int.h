/* image_int.h - what the image module's parts share: the byte order of the
 * header and chunk entries (little-endian) and where the header's checksum
 * sits. The parts: image.c (open: header, manifest, chunk table),
 * image_write.c (encode for the writer), image_check.c (the data region's
 * checks), image_read.c (the checked chunk reader). Not installed; the API
 * is image.h. */
#ifndef ARENA_FORMATS_IMAGE_INT_H
#define ARENA_FORMATS_IMAGE_INT_H

#include <stdint.h>

#include "../common/err.h"
#include "image.h"

#define E(name) ARENA_E(name)
/* header_xxh3: XXH3-64 of header bytes [0, 4088), stored at 4088. */
#define HDR_HASH_AT 4088u

static inline void put16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8);
}
static inline void put32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}
static inline void put64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint16_t get16(const uint8_t *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}
static inline uint32_t get32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t get64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

#endif
