/* utf8.c - strict UTF-8 validation. */
#include "utf8.h"

size_t arena_utf8_check(const uint8_t *s, size_t len)
{
	size_t i = 0;
	while (i < len) {
		uint8_t c = s[i];
		if (c < 0x80) {
			i++;
			continue;
		}
		size_t n;
		uint32_t cp, min;
		if ((c & 0xE0) == 0xC0)
			n = 2, cp = c & 0x1F, min = 0x80;
		else if ((c & 0xF0) == 0xE0)
			n = 3, cp = c & 0x0F, min = 0x800;
		else if ((c & 0xF8) == 0xF0)
			n = 4, cp = c & 0x07, min = 0x10000;
		else
			return i;
		if (len - i < n)
			return i;
		for (size_t k = 1; k < n; k++) {
			if ((s[i + k] & 0xC0) != 0x80)
				return i;
			cp = (cp << 6) | (s[i + k] & 0x3F);
		}
		if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
			return i;
		i += n;
	}
	return len;
}
