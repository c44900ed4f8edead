/* dtype.h - the safetensors dtype table: names, bit widths, kinds.
 *
 * Sub-byte types (F4, F6_*) are sized by bit count: a tensor's byte size is
 * elements x bits / 8 and must be whole. */
#ifndef ARENA_FORMATS_DTYPE_H
#define ARENA_FORMATS_DTYPE_H

#include <stdint.h>

/* X(NAME, bits, kind) ; kind: 'b' bool, 'u' unsigned, 'i' signed, 'f' float, 'c' complex */
#define ARENA_DTYPES(X)      \
	X(BOOL, 8, 'b')      \
	X(U8, 8, 'u')        \
	X(I8, 8, 'i')        \
	X(U16, 16, 'u')      \
	X(I16, 16, 'i')      \
	X(U32, 32, 'u')      \
	X(I32, 32, 'i')      \
	X(U64, 64, 'u')      \
	X(I64, 64, 'i')      \
	X(F16, 16, 'f')      \
	X(BF16, 16, 'f')     \
	X(F32, 32, 'f')      \
	X(F64, 64, 'f')      \
	X(C64, 64, 'c')      \
	X(F8_E4M3, 8, 'f')   \
	X(F8_E5M2, 8, 'f')   \
	X(F8_E8M0, 8, 'f')   \
	X(F8_E4M3FNUZ, 8, 'f') \
	X(F8_E5M2FNUZ, 8, 'f') \
	X(F4, 4, 'f')        \
	X(F6_E2M3, 6, 'f')   \
	X(F6_E3M2, 6, 'f')

typedef enum arena_dtype {
	ARENA_DTYPE_INVALID = -1,
#define ARENA__DT_ENUM(n, b, k) ARENA_DTYPE_##n,
	ARENA_DTYPES(ARENA__DT_ENUM)
#undef ARENA__DT_ENUM
	ARENA_DTYPE_COUNT
} arena_dtype;

/* The dtype named `name` (exact, case-sensitive, as in safetensors), or
 * ARENA_DTYPE_INVALID. */
arena_dtype arena_dtype_from_name(const char *name);
/* "BF16"; "?" for an invalid dtype. */
const char *arena_dtype_name(arena_dtype dt);
/* Bits per element; 0 for an invalid dtype. */
unsigned arena_dtype_bits(arena_dtype dt);
/* 1 if the dtype is a real floating type (F16, BF16, F32, F64, F8*, F4, F6*). */
int arena_dtype_is_float(arena_dtype dt);

#endif
