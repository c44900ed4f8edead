/* utf8.h - strict UTF-8 validation (RFC 3629: no overlongs, no surrogates, <= U+10FFFF). */
#ifndef ARENA_FORMATS_UTF8_H
#define ARENA_FORMATS_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* Returns len if all `len` bytes are valid UTF-8, else the offset of the
 * first byte of the first invalid sequence. */
size_t arena_utf8_check(const uint8_t *s, size_t len);

#endif
