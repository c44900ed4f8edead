/* dtype.c - dtype table lookups. */
#include "dtype.h"

#include <string.h>

static const struct {
	const char *name;
	unsigned bits;
	char kind;
} dtypes[] = {
#define ARENA__DT_ROW(n, b, k) {#n, b, k},
	ARENA_DTYPES(ARENA__DT_ROW)
#undef ARENA__DT_ROW
};

arena_dtype arena_dtype_from_name(const char *name)
{
	for (int i = 0; i < ARENA_DTYPE_COUNT; i++)
		if (strcmp(dtypes[i].name, name) == 0)
			return (arena_dtype)i;
	return ARENA_DTYPE_INVALID;
}

static int valid(arena_dtype dt)
{
	return dt >= 0 && dt < ARENA_DTYPE_COUNT;
}

const char *arena_dtype_name(arena_dtype dt)
{
	return valid(dt) ? dtypes[dt].name : "?";
}

unsigned arena_dtype_bits(arena_dtype dt)
{
	return valid(dt) ? dtypes[dt].bits : 0;
}

int arena_dtype_is_float(arena_dtype dt)
{
	return valid(dt) && dtypes[dt].kind == 'f';
}
