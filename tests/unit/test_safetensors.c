/* test_safetensors.c - one test per validation rule of formats/safetensors.h,
 * on small files built in memory (and a few on disk), plus the valid cases. */
#include <criterion/criterion.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "arena.h"
#include "../../formats/safetensors.h"
#include "testutil.h"

#define LABEL "mem.safetensors"

/* A safetensors buffer: the 8-byte little-endian length of `hlen` header
 * bytes, the header, then data_len data bytes (byte i is i & 0xff). */
static uint8_t *st_build_n(const char *header, size_t hlen, size_t data_len, size_t *len)
{
	*len = 8 + hlen + data_len;
	uint8_t *b = malloc(*len ? *len : 1);
	cr_assert_not_null(b);
	for (int i = 0; i < 8; i++)
		b[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
	memcpy(b + 8, header, hlen);
	for (size_t i = 0; i < data_len; i++)
		b[8 + hlen + i] = (uint8_t)i;
	return b;
}

static uint8_t *st_build(const char *header, size_t data_len, size_t *len)
{
	return st_build_n(header, strlen(header), data_len, len);
}

/* Parse raw bytes; returns the error code, checks *out is NULL on failure. */
static int parse_raw(const uint8_t *buf, size_t len)
{
	arena_st_file *f = (arena_st_file *)1;
	int rc = arena_st_parse(buf, len, LABEL, &f);
	if (rc)
		cr_assert_null(f, "a failed parse must leave *out NULL");
	else
		arena_st_close(f);
	return rc;
}

static int parse_str(const char *header, size_t data_len)
{
	size_t len;
	uint8_t *b = st_build(header, data_len, &len);
	int rc = parse_raw(b, len);
	free(b);
	return rc;
}

/* Assert that header + data_len bytes fail with ARENA_E(code), and that the
 * message names the input and, when subject is not NULL, contains it. */
#define expect_err(header, data_len, code, subject)                                               \
	do {                                                                                      \
		int rc_ = parse_str((header), (data_len));                                        \
		cr_assert_eq(rc_, ARENA_E(code), "expected %s, got %s (%s)", #code,                 \
			     arena_err_name(rc_), arena_last_error());                               \
		cr_assert(strstr(arena_last_error(), LABEL), "message does not name the input: %s", \
			  arena_last_error());                                                       \
		const char *s_ = (subject);                                                       \
		if (s_)                                                                           \
			cr_assert(strstr(arena_last_error(), s_), "message lacks \"%s\": %s", s_,    \
				  arena_last_error());                                               \
	} while (0)

#define expect_ok(header, data_len)                                                              \
	do {                                                                                      \
		int rc_ = parse_str((header), (data_len));                                        \
		cr_assert_eq(rc_, 0, "expected success, got %s (%s)", arena_err_name(rc_),          \
			     arena_last_error());                                                    \
	} while (0)

/* A well-formed tensor entry. */
#define ENT(name, dtype, shape, b, e) \
	"\"" name "\":{\"dtype\":\"" dtype "\",\"shape\":" shape ",\"data_offsets\":[" #b "," #e "]}"

/* Parse a header that must be valid; the caller closes *f and frees *buf. */
static arena_st_file *open_ok(const char *header, size_t data_len, uint8_t **buf)
{
	size_t len;
	*buf = st_build(header, data_len, &len);
	arena_st_file *f = NULL;
	int rc = arena_st_parse(*buf, len, LABEL, &f);
	cr_assert_eq(rc, 0, "parse failed: %s (%s)", arena_err_name(rc), arena_last_error());
	cr_assert_not_null(f);
	return f;
}

/* --- the length prefix --------------------------------------------------- */

Test(st_rules, too_short)
{
	static const uint8_t zeros[8];
	for (size_t n = 0; n < 8; n++) {
		int rc = parse_raw(zeros, n);
		cr_assert_eq(rc, ARENA_E(ST_TOO_SHORT), "%zu bytes: got %s", n, arena_err_name(rc));
		cr_assert(strstr(arena_last_error(), LABEL));
	}
}

Test(st_rules, header_too_large)
{
	size_t len;
	uint8_t *b = st_build("{}", 0, &len);
	const uint64_t bad[] = {100000001ULL, 0xffffffffffffffffULL, 1ULL << 63};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		for (int k = 0; k < 8; k++)
			b[k] = (uint8_t)(bad[i] >> (8 * k));
		int rc = parse_raw(b, len);
		cr_assert_eq(rc, ARENA_E(ST_HEADER_TOO_LARGE), "N=%llu: got %s", (unsigned long long)bad[i],
			     arena_err_name(rc));
	}
	/* The limit itself is allowed; a short file then runs past its end. */
	const uint64_t limit = 100000000ULL;
	for (int k = 0; k < 8; k++)
		b[k] = (uint8_t)(limit >> (8 * k));
	cr_assert_eq(parse_raw(b, len), ARENA_E(ST_HEADER_PAST_EOF));
	free(b);
}

Test(st_rules, header_past_eof)
{
	size_t len;
	uint8_t *b = st_build("{}", 0, &len);
	b[0] = 3; /* one byte more than there is */
	cr_assert_eq(parse_raw(b, len), ARENA_E(ST_HEADER_PAST_EOF), "%s", arena_last_error());
	b[0] = 2;
	cr_assert_eq(parse_raw(b, len), 0, "%s", arena_last_error());
	/* Only the length, no header at all. */
	cr_assert_eq(parse_raw(b, 8), ARENA_E(ST_HEADER_PAST_EOF));
	free(b);
}

/* --- UTF-8 --------------------------------------------------------------- */

Test(st_rules, utf8_overlong)
{
	expect_err("{\"__metadata__\":{\"a\":\"\xc0\xaf\"}}", 0, ST_HEADER_UTF8, NULL);
	expect_err("{\"__metadata__\":{\"a\":\"\xe0\x80\xaf\"}}", 0, ST_HEADER_UTF8, NULL);
	expect_err("{\"__metadata__\":{\"a\":\"\xf0\x80\x80\xaf\"}}", 0, ST_HEADER_UTF8, NULL);
}

Test(st_rules, utf8_surrogate)
{
	expect_err("{\"__metadata__\":{\"a\":\"\xed\xa0\x80\"}}", 0, ST_HEADER_UTF8, NULL);
	expect_err("{\"__metadata__\":{\"a\":\"\xed\xbf\xbf\"}}", 0, ST_HEADER_UTF8, NULL);
}

Test(st_rules, utf8_truncated_and_invalid_bytes)
{
	/* A 3-byte sequence cut after 2 bytes, inside the header... */
	expect_err("{\"__metadata__\":{\"a\":\"\xe2\x9c\"}}", 0, ST_HEADER_UTF8, NULL);
	/* ...and at the very end of it. */
	expect_err("{}\xe2\x9c", 0, ST_HEADER_UTF8, NULL);
	/* A lone continuation byte, 0xff, and a code point over U+10FFFF. */
	expect_err("{\"__metadata__\":{\"a\":\"\x80\"}}", 0, ST_HEADER_UTF8, NULL);
	expect_err("{\"__metadata__\":{\"a\":\"\xff\"}}", 0, ST_HEADER_UTF8, NULL);
	expect_err("{\"__metadata__\":{\"a\":\"\xf4\x90\x80\x80\"}}", 0, ST_HEADER_UTF8, NULL);
}

Test(st_rules, utf8_reported_at_its_byte)
{
	/* The bad byte is at file offset 8 + 2. */
	expect_err("{\"\xc0\xaf\":1}", 0, ST_HEADER_UTF8, "byte 10");
}

Test(st_rules, utf8_valid_accepted)
{
	/* 2-, 3- and 4-byte sequences, the largest code point, in a name and metadata. */
	expect_ok("{\"__metadata__\":{\"\xc3\xbc\":\"\xe2\x9c\x93 \xf0\x9f\x98\x80 \xf4\x8f\xbf\xbf\"},"
		  ENT("w\xc3\xa9ight", "U8", "[1]", 0, 1) "}", 1);
}

/* --- JSON ---------------------------------------------------------------- */

Test(st_rules, not_json)
{
	expect_err("{not json}", 0, ST_HEADER_JSON, NULL);
	expect_err("", 0, ST_HEADER_JSON, NULL);
	expect_err("{\"a\":", 0, ST_HEADER_JSON, NULL);
	expect_err("{'a':1}", 0, ST_HEADER_JSON, NULL);
	expect_err("{\"a\":1,}", 0, ST_HEADER_JSON, NULL);
	expect_err("{\"a\":NaN}", 0, ST_HEADER_JSON, NULL);
}

Test(st_rules, deep_nesting_and_nul)
{
	/* Far deeper than any parser stack should go: an error, not a crash. */
	size_t depth = 200000;
	char *h = malloc(2 * depth + 1);
	cr_assert_not_null(h);
	memset(h, '[', depth);
	memset(h + depth, ']', depth);
	h[2 * depth] = '\0';
	int rc = parse_str(h, 0);
	cr_assert(rc == ARENA_E(ST_HEADER_JSON) || rc == ARENA_E(ST_HEADER_NOT_OBJECT), "%s", arena_err_name(rc));
	memset(h, '{', 1);
	rc = parse_str(h, 0);
	cr_assert_eq(rc, ARENA_E(ST_HEADER_JSON), "%s", arena_err_name(rc));
	free(h);
	/* A raw NUL inside a string. */
	size_t len;
	uint8_t *b = st_build_n("{\"a\0\":1}", 8, 0, &len);
	cr_assert_eq(parse_raw(b, len), ARENA_E(ST_HEADER_JSON), "%s", arena_last_error());
	free(b);
	/* An escaped NUL in a name. */
	expect_err("{\"a\\u0000b\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0, ST_HEADER_JSON, NULL);
}

Test(st_rules, trailing_garbage_after_json)
{
	expect_err("{} x", 0, ST_HEADER_JSON, NULL);
	expect_err("{}{}", 0, ST_HEADER_JSON, NULL);
	/* A NUL byte after the object (the header length counts it). */
	size_t len;
	uint8_t *b = st_build_n("{}\0", 3, 0, &len);
	cr_assert_eq(parse_raw(b, len), ARENA_E(ST_HEADER_JSON), "%s", arena_last_error());
	free(b);
}

Test(st_rules, whitespace_around_json_accepted)
{
	expect_ok("   {}", 0);
	expect_ok("{}     ", 0);
	expect_ok(" \t\r\n{" ENT("a", "U8", "[1]", 0, 1) "}\n \t  ", 1);
}

Test(st_rules, not_object)
{
	expect_err("[]", 0, ST_HEADER_NOT_OBJECT, NULL);
	expect_err("[{\"a\":1}]", 0, ST_HEADER_NOT_OBJECT, NULL);
	expect_err("\"x\"", 0, ST_HEADER_NOT_OBJECT, NULL);
	expect_err("42", 0, ST_HEADER_NOT_OBJECT, NULL);
	expect_err("null", 0, ST_HEADER_NOT_OBJECT, NULL);
	expect_err("true", 0, ST_HEADER_NOT_OBJECT, NULL);
}

Test(st_rules, duplicate_key_top_level)
{
	expect_err("{" ENT("a", "U8", "[1]", 0, 1) "," ENT("a", "U8", "[1]", 0, 1) "}", 1, ST_DUPLICATE_KEY,
		   NULL);
	expect_err("{\"__metadata__\":{},\"__metadata__\":{}}", 0, ST_DUPLICATE_KEY, NULL);
}

Test(st_rules, duplicate_key_inside_entry)
{
	expect_err("{\"a\":{\"dtype\":\"U8\",\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
		   ST_DUPLICATE_KEY, NULL);
	expect_err("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"shape\":[1]}}", 1,
		   ST_DUPLICATE_KEY, NULL);
	expect_err("{\"__metadata__\":{\"k\":\"v\",\"k\":\"w\"}}", 0, ST_DUPLICATE_KEY, NULL);
}

/* --- tensor entries -------------------------------------------------------- */

Test(st_rules, entry_not_object)
{
	expect_err("{\"blk.0.w\":[1,2]}", 0, ST_TENSOR_NOT_OBJECT, "'blk.0.w'");
	expect_err("{\"blk.0.w\":\"U8\"}", 0, ST_TENSOR_NOT_OBJECT, "'blk.0.w'");
	expect_err("{\"blk.0.w\":null}", 0, ST_TENSOR_NOT_OBJECT, "'blk.0.w'");
	expect_err("{\"blk.0.w\":7}", 0, ST_TENSOR_NOT_OBJECT, "'blk.0.w'");
}

Test(st_rules, unknown_field)
{
	expect_err("{\"blk.0.w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"extra\":1}}", 1,
		   ST_UNKNOWN_FIELD, "'blk.0.w'");
	cr_assert(strstr(arena_last_error(), "'extra'"), "%s", arena_last_error());
	/* Field names are case-sensitive. */
	expect_err("{\"blk.0.w\":{\"DType\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, ST_UNKNOWN_FIELD,
		   "'blk.0.w'");
	/* An empty entry lacks fields; it has none unknown. */
	expect_err("{\"blk.0.w\":{}}", 0, ST_MISSING_FIELD, "'blk.0.w'");
}

Test(st_rules, missing_dtype)
{
	expect_err("{\"blk.0.w\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 1, ST_MISSING_FIELD, "'blk.0.w'");
	cr_assert(strstr(arena_last_error(), "dtype"), "%s", arena_last_error());
}

Test(st_rules, missing_shape)
{
	expect_err("{\"blk.0.w\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", 1, ST_MISSING_FIELD, "'blk.0.w'");
	cr_assert(strstr(arena_last_error(), "shape"), "%s", arena_last_error());
}

Test(st_rules, missing_data_offsets)
{
	expect_err("{\"blk.0.w\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1, ST_MISSING_FIELD, "'blk.0.w'");
	cr_assert(strstr(arena_last_error(), "data_offsets"), "%s", arena_last_error());
}

Test(st_rules, dtype_not_string)
{
	expect_err("{\"blk.0.w\":{\"dtype\":8,\"shape\":[1],\"data_offsets\":[0,1]}}", 1, ST_BAD_DTYPE, "'blk.0.w'");
	expect_err("{\"blk.0.w\":{\"dtype\":null,\"shape\":[1],\"data_offsets\":[0,1]}}", 1, ST_BAD_DTYPE,
		   "'blk.0.w'");
	expect_err("{\"blk.0.w\":{\"dtype\":[\"U8\"],\"shape\":[1],\"data_offsets\":[0,1]}}", 1, ST_BAD_DTYPE,
		   "'blk.0.w'");
}

Test(st_rules, shape_not_list)
{
	expect_err("{\"blk.0.w\":{\"dtype\":\"U8\",\"shape\":1,\"data_offsets\":[0,1]}}", 1, ST_BAD_SHAPE,
		   "'blk.0.w'");
	expect_err("{\"blk.0.w\":{\"dtype\":\"U8\",\"shape\":{},\"data_offsets\":[0,1]}}", 1, ST_BAD_SHAPE,
		   "'blk.0.w'");
	expect_err("{\"blk.0.w\":{\"dtype\":\"U8\",\"shape\":\"[1]\",\"data_offsets\":[0,1]}}", 1, ST_BAD_SHAPE,
		   "'blk.0.w'");
	expect_err("{\"blk.0.w\":{\"dtype\":\"U8\",\"shape\":null,\"data_offsets\":[0,1]}}", 1, ST_BAD_SHAPE,
		   "'blk.0.w'");
}

Test(st_rules, shape_negative_dim)
{
	expect_err("{\"blk.0.w\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,1]}}", 1, ST_BAD_SHAPE,
		   "'blk.0.w'");
	expect_err("{\"blk.0.w\":{\"dtype\":\"U8\",\"shape\":[1,-2],\"data_offsets\":[0,1]}}", 1, ST_BAD_SHAPE,
		   "'blk.0.w'");
}

Test(st_rules, shape_float_or_other_dims)
{
	expect_err("{\"blk.0.w\":{\"dtype\":\"U8\",\"shape\":[1.0],\"data_offsets\":[0,1]}}", 1, ST_BAD_SHAPE,
		   "'blk.0.w'");
	expect_err("{\"blk.0.w\":{\"dtype\":\"U8\",\"shape\":[1e0],\"data_offsets\":[0,1]}}", 1, ST_BAD_SHAPE,
		   "'blk.0.w'");
	expect_err("{\"blk.0.w\":{\"dtype\":\"U8\",\"shape\":[\"1\"],\"data_offsets\":[0,1]}}", 1, ST_BAD_SHAPE,
		   "'blk.0.w'");
	expect_err("{\"blk.0.w\":{\"dtype\":\"U8\",\"shape\":[[1]],\"data_offsets\":[0,1]}}", 1, ST_BAD_SHAPE,
		   "'blk.0.w'");
	expect_err("{\"blk.0.w\":{\"dtype\":\"U8\",\"shape\":[true],\"data_offsets\":[0,1]}}", 1, ST_BAD_SHAPE,
		   "'blk.0.w'");
}

Test(st_rules, negative_zero_is_not_an_integer)
{
	/* serde_json (the reference's parser) reads "-0" as a float. */
	expect_err("{\"blk.0.w\":{\"dtype\":\"U8\",\"shape\":[-0],\"data_offsets\":[0,0]}}", 0, ST_BAD_SHAPE,
		   "'blk.0.w'");
	expect_err("{\"blk.0.w\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[-0,0]}}", 0, ST_BAD_OFFSETS,
		   "'blk.0.w'");
	expect_err("{\"blk.0.w\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,-0]}}", 0, ST_BAD_OFFSETS,
		   "'blk.0.w'");
	expect_err("{\"blk.0.w\":{\"dtype\":\"U8\",\"shape\":[-0.0],\"data_offsets\":[0,0]}}", 0, ST_BAD_SHAPE,
		   "'blk.0.w'");
	/* The right one among many numbers, after strings that look like numbers. */
	expect_err("{\"__metadata__\":{\"-0\":\"-0\"},\"a\":{\"dtype\":\"U8\",\"shape\":[1,0],\"data_offsets\":[0,0]},"
		   "\"b-0\":{\"dtype\":\"U8\",\"shape\":[0,1,-0],\"data_offsets\":[0,0]}}", 0, ST_BAD_SHAPE, "'b-0'");
	cr_assert(strstr(arena_last_error(), "shape[2]"), "%s", arena_last_error());
	/* -0 inside strings, and 0, -0.5 or -01 spelt otherwise, are not this rule. */
	expect_ok("{\"__metadata__\":{\"k\":\"-0\"},\"x-0\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0);
	expect_err("{\"a\":{\"dtype\":\"U8\",\"shape\":[-0.5],\"data_offsets\":[0,0]}}", 0, ST_BAD_SHAPE, "'a'");
	expect_err("{\"a\":{\"dtype\":\"U8\",\"shape\":[-01],\"data_offsets\":[0,0]}}", 0, ST_HEADER_JSON, NULL);
}

Test(st_rules, data_offsets_wrong_length)
{
	expect_err("{\"blk.0.w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0]}}", 1, ST_BAD_OFFSETS,
		   "'blk.0.w'");
	expect_err("{\"blk.0.w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1,2]}}", 1, ST_BAD_OFFSETS,
		   "'blk.0.w'");
	expect_err("{\"blk.0.w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[]}}", 1, ST_BAD_OFFSETS,
		   "'blk.0.w'");
	expect_err("{\"blk.0.w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":1}}", 1, ST_BAD_OFFSETS,
		   "'blk.0.w'");
	expect_err("{\"blk.0.w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":{\"0\":1}}}", 1, ST_BAD_OFFSETS,
		   "'blk.0.w'");
}

Test(st_rules, data_offsets_negative)
{
	expect_err("{\"blk.0.w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[-1,0]}}", 1, ST_BAD_OFFSETS,
		   "'blk.0.w'");
	expect_err("{\"blk.0.w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,-1]}}", 1, ST_BAD_OFFSETS,
		   "'blk.0.w'");
}

Test(st_rules, data_offsets_float)
{
	expect_err("{\"blk.0.w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1.0]}}", 1, ST_BAD_OFFSETS,
		   "'blk.0.w'");
	expect_err("{\"blk.0.w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0.5,1]}}", 1, ST_BAD_OFFSETS,
		   "'blk.0.w'");
	expect_err("{\"blk.0.w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[\"0\",1]}}", 1, ST_BAD_OFFSETS,
		   "'blk.0.w'");
}

Test(st_rules, unknown_dtype)
{
	expect_err("{" ENT("blk.0.w", "F128", "[1]", 0, 16) "}", 16, ST_UNKNOWN_DTYPE, "'blk.0.w'");
	cr_assert(strstr(arena_last_error(), "F128"), "%s", arena_last_error());
	/* Names are exact and case-sensitive, as safetensors writes them. */
	expect_err("{" ENT("blk.0.w", "bf16", "[1]", 0, 2) "}", 2, ST_UNKNOWN_DTYPE, "'blk.0.w'");
	expect_err("{" ENT("blk.0.w", "f32", "[1]", 0, 4) "}", 4, ST_UNKNOWN_DTYPE, "'blk.0.w'");
	expect_err("{" ENT("blk.0.w", "", "[1]", 0, 1) "}", 1, ST_UNKNOWN_DTYPE, "'blk.0.w'");
	expect_err("{" ENT("blk.0.w", "F8_E4M3FN", "[1]", 0, 1) "}", 1, ST_UNKNOWN_DTYPE, "'blk.0.w'");
	expect_err("{" ENT("blk.0.w", "BF16 ", "[1]", 0, 2) "}", 2, ST_UNKNOWN_DTYPE, "'blk.0.w'");
}

Test(st_rules, metadata_not_object)
{
	expect_err("{\"__metadata__\":[]}", 0, ST_BAD_METADATA, "__metadata__");
	expect_err("{\"__metadata__\":\"x\"}", 0, ST_BAD_METADATA, "__metadata__");
	expect_err("{\"__metadata__\":null}", 0, ST_BAD_METADATA, "__metadata__");
}

Test(st_rules, metadata_non_string_value)
{
	expect_err("{\"__metadata__\":{\"epoch\":1}}", 0, ST_BAD_METADATA, "'epoch'");
	expect_err("{\"__metadata__\":{\"a\":\"ok\",\"n\":null}}", 0, ST_BAD_METADATA, "'n'");
	expect_err("{\"__metadata__\":{\"o\":{\"x\":\"y\"}}}", 0, ST_BAD_METADATA, "'o'");
	expect_err("{\"__metadata__\":{\"l\":[\"x\"]}}", 0, ST_BAD_METADATA, "'l'");
}

/* --- layout -------------------------------------------------------------- */

Test(st_rules, offset_start_not_zero)
{
	expect_err("{" ENT("blk.0.w", "U8", "[1]", 1, 2) "}", 2, ST_OFFSET_START, "'blk.0.w'");
	/* The first by offset, not by header order or name. */
	expect_err("{" ENT("a", "U8", "[1]", 2, 3) "," ENT("z", "U8", "[1]", 1, 2) "}", 3, ST_OFFSET_START, "'z'");
}

Test(st_rules, offset_reversed)
{
	expect_err("{" ENT("blk.0.w", "U8", "[1]", 2, 1) "}", 2, ST_OFFSET_REVERSED, "'blk.0.w'");
	expect_err("{" ENT("a", "U8", "[2]", 0, 2) "," ENT("blk.0.w", "U8", "[1]", 3, 2) "}", 3, ST_OFFSET_REVERSED,
		   "'blk.0.w'");
}

Test(st_rules, offset_gap)
{
	expect_err("{" ENT("a", "U8", "[1]", 0, 1) "," ENT("blk.0.w", "U8", "[1]", 2, 3) "}", 3, ST_OFFSET_GAP,
		   "'blk.0.w'");
}

Test(st_rules, offset_overlap)
{
	expect_err("{" ENT("a", "U8", "[2]", 0, 2) "," ENT("blk.0.w", "U8", "[2]", 1, 3) "}", 3, ST_OFFSET_OVERLAP,
		   "'blk.0.w'");
	/* Two tensors on the same bytes. */
	expect_err("{" ENT("a", "U8", "[2]", 0, 2) "," ENT("b", "U8", "[2]", 0, 2) "}", 2, ST_OFFSET_OVERLAP,
		   "'b'");
	/* A zero-size tensor inside another one's bytes. */
	expect_err("{" ENT("a", "U8", "[4]", 0, 4) "," ENT("z", "U8", "[0]", 2, 2) "}", 4, ST_OFFSET_OVERLAP,
		   "'z'");
}

Test(st_rules, size_overflow)
{
	/* Element count 2^64. */
	expect_err("{" ENT("blk.0.w", "U8", "[4294967296,4294967296]", 0, 1) "}", 1, ST_SIZE_OVERFLOW,
		   "'blk.0.w'");
	/* Element count fits, size in bits does not (2^62 x 32). */
	expect_err("{" ENT("blk.0.w", "F32", "[4611686018427387904]", 0, 4) "}", 4, ST_SIZE_OVERFLOW,
		   "'blk.0.w'");
	/* The largest dims JSON integers can hold. */
	expect_err("{" ENT("blk.0.w", "F64", "[9223372036854775807,9223372036854775807]", 0, 8) "}", 8,
		   ST_SIZE_OVERFLOW, "'blk.0.w'");
	/* A zero dim anywhere makes the product 0, not an overflow. */
	expect_ok("{" ENT("blk.0.w", "F64", "[9223372036854775807,0,9223372036854775807]", 0, 0) "}", 0);
}

Test(st_rules, partial_bytes)
{
	expect_err("{" ENT("blk.0.w", "F4", "[3]", 0, 2) "}", 2, ST_PARTIAL_BYTES, "'blk.0.w'");
	expect_err("{" ENT("blk.0.w", "F4", "[1]", 0, 1) "}", 1, ST_PARTIAL_BYTES, "'blk.0.w'");
	expect_err("{" ENT("blk.0.w", "F6_E2M3", "[3]", 0, 3) "}", 3, ST_PARTIAL_BYTES, "'blk.0.w'");
	expect_err("{" ENT("blk.0.w", "F6_E3M2", "[2,3]", 0, 5) "}", 5, ST_PARTIAL_BYTES, "'blk.0.w'");
}

Test(st_rules, size_mismatch)
{
	expect_err("{" ENT("blk.0.w", "F32", "[2]", 0, 4) "}", 4, ST_SIZE_MISMATCH, "'blk.0.w'");
	expect_err("{" ENT("blk.0.w", "F32", "[2]", 0, 12) "}", 12, ST_SIZE_MISMATCH, "'blk.0.w'");
	expect_err("{" ENT("blk.0.w", "BF16", "[]", 0, 4) "}", 4, ST_SIZE_MISMATCH, "'blk.0.w'");
	expect_err("{" ENT("blk.0.w", "F32", "[0]", 0, 4) "}", 4, ST_SIZE_MISMATCH, "'blk.0.w'");
}

Test(st_rules, data_past_eof)
{
	expect_err("{" ENT("blk.0.w", "F32", "[2]", 0, 8) "}", 4, ST_DATA_PAST_EOF, "'blk.0.w'");
	expect_err("{" ENT("a", "U8", "[1]", 0, 1) "," ENT("blk.0.w", "U8", "[8]", 1, 9) "}", 8, ST_DATA_PAST_EOF,
		   "'blk.0.w'");
	expect_err("{" ENT("blk.0.w", "U8", "[1]", 0, 1) "}", 0, ST_DATA_PAST_EOF, "'blk.0.w'");
}

Test(st_rules, trailing_bytes)
{
	expect_err("{" ENT("a", "U8", "[1]", 0, 1) "}", 2, ST_TRAILING_BYTES, "1 bytes");
	expect_err("{}", 1, ST_TRAILING_BYTES, NULL);
	expect_err("{" ENT("a", "U8", "[0]", 0, 0) "}", 16, ST_TRAILING_BYTES, "16 bytes");
}

/* --- the documented order of the rules ------------------------------------ */

Test(st_order, unknown_field_before_missing_field)
{
	expect_err("{\"a\":{\"dtype\":\"U8\",\"x\":1}}", 0, ST_UNKNOWN_FIELD, "'a'");
}

Test(st_order, entry_rules_in_order)
{
	/* bad dtype type before bad shape before bad offsets before unknown dtype */
	expect_err("{\"a\":{\"dtype\":1,\"shape\":1,\"data_offsets\":1}}", 0, ST_BAD_DTYPE, "'a'");
	expect_err("{\"a\":{\"dtype\":\"XX\",\"shape\":1,\"data_offsets\":1}}", 0, ST_BAD_SHAPE, "'a'");
	expect_err("{\"a\":{\"dtype\":\"XX\",\"shape\":[1],\"data_offsets\":1}}", 0, ST_BAD_OFFSETS, "'a'");
}

Test(st_order, tensors_in_header_order)
{
	/* 'z' comes first in the header, so its error is the one reported. */
	expect_err("{\"z\":1,\"a\":{\"dtype\":\"U8\"}}", 0, ST_TENSOR_NOT_OBJECT, "'z'");
	expect_err("{\"a\":{\"dtype\":\"U8\"},\"z\":1}", 0, ST_MISSING_FIELD, "'a'");
}

Test(st_order, entries_before_metadata)
{
	expect_err("{\"__metadata__\":1,\"a\":{\"dtype\":\"U9\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
		   ST_UNKNOWN_DTYPE, "'a'");
}

Test(st_order, metadata_before_layout)
{
	expect_err("{\"__metadata__\":{\"k\":1}," ENT("a", "U8", "[1]", 5, 6) "}", 1, ST_BAD_METADATA, "'k'");
}

Test(st_order, reversed_before_start)
{
	expect_err("{" ENT("a", "U8", "[1]", 4, 5) "," ENT("b", "U8", "[1]", 9, 3) "}", 9, ST_OFFSET_REVERSED, "'b'");
}

Test(st_order, layout_before_sizes)
{
	expect_err("{" ENT("a", "F32", "[1]", 0, 1) "," ENT("b", "U8", "[1]", 2, 3) "}", 3, ST_OFFSET_GAP, "'b'");
}

Test(st_order, sizes_before_eof)
{
	expect_err("{" ENT("a", "F32", "[2]", 0, 4) "}", 0, ST_SIZE_MISMATCH, "'a'");
}

/* --- valid files ----------------------------------------------------------- */

static const struct {
	const char *name;
	unsigned bits;
} dtype_table[] = {
	{"BOOL", 8}, {"U8", 8}, {"I8", 8}, {"U16", 16}, {"I16", 16}, {"U32", 32}, {"I32", 32}, {"U64", 64},
	{"I64", 64}, {"F16", 16}, {"BF16", 16}, {"F32", 32}, {"F64", 64}, {"C64", 64}, {"F8_E4M3", 8},
	{"F8_E5M2", 8}, {"F8_E8M0", 8}, {"F8_E4M3FNUZ", 8}, {"F8_E5M2FNUZ", 8}, {"F4", 4}, {"F6_E2M3", 6},
	{"F6_E3M2", 6},
};

Test(st_valid, every_dtype_with_its_bit_size)
{
	size_t n = sizeof(dtype_table) / sizeof(dtype_table[0]);
	cr_assert_eq(n, (size_t)ARENA_DTYPE_COUNT, "the test's table is out of date");
	for (size_t i = 0; i < n; i++) {
		/* 8 elements: bits bytes. */
		char hdr[256];
		unsigned bytes = dtype_table[i].bits;
		snprintf(hdr, sizeof(hdr), "{\"t\":{\"dtype\":\"%s\",\"shape\":[2,4],\"data_offsets\":[0,%u]}}",
			 dtype_table[i].name, bytes);
		uint8_t *buf;
		arena_st_file *f = open_ok(hdr, bytes, &buf);
		cr_assert_eq(f->n_tensors, 1);
		const arena_st_tensor *t = &f->tensors[0];
		cr_assert_str_eq(arena_dtype_name(t->dtype), dtype_table[i].name);
		cr_assert_eq(arena_dtype_from_name(dtype_table[i].name), t->dtype);
		cr_assert_eq(arena_dtype_bits(t->dtype), dtype_table[i].bits, "%s", dtype_table[i].name);
		cr_assert_eq(t->nelem, 8);
		cr_assert_eq(t->nbytes, bytes, "%s: %llu bytes", dtype_table[i].name, (unsigned long long)t->nbytes);
		cr_assert_eq(t->rank, 2);
		cr_assert_eq(t->shape[0], 2);
		cr_assert_eq(t->shape[1], 4);
		arena_st_close(f);
		free(buf);
	}
}

Test(st_valid, sub_byte_sizes)
{
	uint8_t *buf;
	arena_st_file *f = open_ok("{" ENT("f4", "F4", "[2]", 0, 1) "," ENT("e2m3", "F6_E2M3", "[4]", 1, 4) ","
				   ENT("e3m2", "F6_E3M2", "[2,4]", 4, 10) "}", 10, &buf);
	cr_assert_eq(arena_st_find(f, "f4")->nbytes, 1);
	cr_assert_eq(arena_st_find(f, "e2m3")->nbytes, 3);
	cr_assert_eq(arena_st_find(f, "e3m2")->nbytes, 6);
	cr_assert_eq(arena_st_find(f, "e3m2")->nelem, 8);
	arena_st_close(f);
	free(buf);
}

Test(st_valid, zero_size_tensors)
{
	uint8_t *buf;
	/* Zero-size tensors at the start, between two others, and at the end. */
	arena_st_file *f = open_ok("{" ENT("z0", "F32", "[0,4]", 0, 0) "," ENT("a", "U8", "[2]", 0, 2) ","
				   ENT("z1", "BF16", "[3,0]", 2, 2) "," ENT("z2", "F4", "[0]", 2, 2) ","
				   ENT("b", "U8", "[1]", 2, 3) "," ENT("z3", "I64", "[0]", 3, 3) "}", 3, &buf);
	cr_assert_eq(f->n_tensors, 6);
	const arena_st_tensor *z = arena_st_find(f, "z0");
	cr_assert_not_null(z);
	cr_assert_eq(z->nelem, 0);
	cr_assert_eq(z->nbytes, 0);
	cr_assert_eq(z->rank, 2);
	cr_assert_eq(arena_st_find(f, "z3")->begin, 3);
	arena_st_close(f);
	free(buf);
	/* A file of nothing but zero-size tensors has no data. */
	expect_ok("{" ENT("z", "F32", "[0]", 0, 0) "," ENT("y", "F16", "[5,0,2]", 0, 0) "}", 0);
}

Test(st_valid, rank0_scalar)
{
	uint8_t *buf;
	arena_st_file *f = open_ok("{" ENT("s", "F32", "[]", 0, 4) "}", 4, &buf);
	const arena_st_tensor *t = arena_st_find(f, "s");
	cr_assert_not_null(t);
	cr_assert_eq(t->rank, 0);
	cr_assert_eq(t->nelem, 1);
	cr_assert_eq(t->nbytes, 4);
	cr_assert_eq(memcmp(arena_st_data(t), "\0\1\2\3", 4), 0);
	arena_st_close(f);
	free(buf);
}

Test(st_valid, empty_header)
{
	uint8_t *buf;
	arena_st_file *f = open_ok("{}", 0, &buf);
	cr_assert_eq(f->n_tensors, 0);
	cr_assert_eq(f->n_meta, 0);
	cr_assert_eq(f->header_len, 2);
	cr_assert_eq(f->data_off, 10);
	cr_assert_eq(f->size, 10);
	cr_assert_null(arena_st_find(f, "x"));
	cr_assert_null(arena_st_find(f, ""));
	arena_st_close(f);
	free(buf);
	/* Metadata alone is fine too. */
	expect_ok("{\"__metadata__\":{}}", 0);
}

Test(st_valid, tensors_sorted_by_name_with_their_data)
{
	uint8_t *buf;
	/* Header order, offset order and name order all differ. */
	arena_st_file *f = open_ok("{" ENT("m.b", "U8", "[2]", 3, 5) "," ENT("z", "U8", "[3]", 0, 3) ","
				   ENT("a.10", "U16", "[1]", 5, 7) "," ENT("a.9", "U8", "[1]", 7, 8) ","
				   ENT("A", "U8", "[1]", 8, 9) "}", 9, &buf);
	cr_assert_eq(f->n_tensors, 5);
	const char *want[] = {"A", "a.10", "a.9", "m.b", "z"};
	const uint64_t begin[] = {8, 5, 7, 3, 0};
	for (size_t i = 0; i < 5; i++) {
		const arena_st_tensor *t = &f->tensors[i];
		cr_assert_str_eq(t->name, want[i]);
		cr_assert_eq(t->begin, begin[i], "%s", t->name);
		cr_assert_eq(t->file, f);
		/* Data byte k of the file is k & 0xff. */
		cr_assert_eq(arena_st_data(t)[0], (uint8_t)begin[i], "%s", t->name);
		cr_assert_eq(arena_st_data(t), buf + f->data_off + begin[i]);
		if (i)
			cr_assert_lt(strcmp(f->tensors[i - 1].name, t->name), 0);
	}
	arena_st_close(f);
	free(buf);
}

Test(st_valid, find)
{
	uint8_t *buf;
	arena_st_file *f = open_ok("{" ENT("b", "U8", "[1]", 0, 1) "," ENT("a", "U8", "[1]", 1, 2) ","
				   ENT("c", "U8", "[2]", 2, 4) "}", 4, &buf);
	const char *names[] = {"a", "b", "c"};
	for (size_t i = 0; i < 3; i++) {
		const arena_st_tensor *t = arena_st_find(f, names[i]);
		cr_assert_not_null(t, "%s", names[i]);
		cr_assert_str_eq(t->name, names[i]);
	}
	cr_assert_eq(arena_st_find(f, "c")->nbytes, 2);
	cr_assert_null(arena_st_find(f, "d"));
	cr_assert_null(arena_st_find(f, ""));
	cr_assert_null(arena_st_find(f, "A"));
	cr_assert_null(arena_st_find(f, "aa"));
	cr_assert_null(arena_st_find(f, "__metadata__"));
	arena_st_close(f);
	free(buf);
}

Test(st_valid, metadata_in_header_order)
{
	uint8_t *buf;
	arena_st_file *f = open_ok("{\"__metadata__\":{\"z\":\"1\",\"a\":\"\",\"u\":\"\xc3\xbcnic\xc3\xb8" "de \\u2713\"},"
				   ENT("w", "U8", "[1]", 0, 1) "}", 1, &buf);
	cr_assert_eq(f->n_meta, 3);
	cr_assert_str_eq(f->meta_keys[0], "z");
	cr_assert_str_eq(f->meta_vals[0], "1");
	cr_assert_str_eq(f->meta_keys[1], "a");
	cr_assert_str_eq(f->meta_vals[1], "");
	cr_assert_str_eq(f->meta_keys[2], "u");
	cr_assert_str_eq(f->meta_vals[2], "\xc3\xbcnic\xc3\xb8" "de \xe2\x9c\x93");
	cr_assert_eq(f->n_tensors, 1, "__metadata__ is not a tensor");
	arena_st_close(f);
	free(buf);
}

Test(st_valid, header_fields)
{
	uint8_t *buf;
	const char *hdr = "{" ENT("w", "U8", "[3]", 0, 3) "}  ";
	arena_st_file *f = open_ok(hdr, 3, &buf);
	cr_assert_eq(f->header_len, strlen(hdr));
	cr_assert_eq(f->data_off, 8 + strlen(hdr));
	cr_assert_eq(f->size, 8 + strlen(hdr) + 3);
	cr_assert_str_eq(f->path, LABEL);
	cr_assert_eq(f->base, buf);
	arena_st_close(f);
	free(buf);
}

Test(st_valid, close_null)
{
	arena_st_close(NULL);
}

/* --- on disk ------------------------------------------------------------- */

/* Write bytes to a new temporary file; returns its path (caller unlinks, frees). */
static char *write_temp(const uint8_t *b, size_t len)
{
	char *path = malloc(4096);
	cr_assert_not_null(path);
	snprintf(path, 4096, "%s/arena-st-XXXXXX", tmp_base());
	int fd = mkstemp(path);
	cr_assert_geq(fd, 0);
	cr_assert_eq(write(fd, b, len), (ssize_t)len);
	close(fd);
	return path;
}

static int open_file_rc(const char *header, size_t data_len, char **path_out)
{
	size_t len;
	uint8_t *b = st_build(header, data_len, &len);
	char *path = write_temp(b, len);
	free(b);
	arena_st_file *f = (arena_st_file *)1;
	int rc = arena_st_open(path, &f);
	if (rc)
		cr_assert_null(f);
	else
		arena_st_close(f);
	*path_out = path;
	return rc;
}

#define expect_file_err(header, data_len, code, subject)                                           \
	do {                                                                                      \
		char *p_;                                                                         \
		int rc_ = open_file_rc((header), (data_len), &p_);                                \
		cr_assert_eq(rc_, ARENA_E(code), "expected %s, got %s (%s)", #code,                 \
			     arena_err_name(rc_), arena_last_error());                               \
		cr_assert(strstr(arena_last_error(), p_), "message lacks the path: %s",             \
			  arena_last_error());                                                       \
		const char *s_ = (subject);                                                       \
		if (s_)                                                                           \
			cr_assert(strstr(arena_last_error(), s_), "%s", arena_last_error());         \
		unlink(p_);                                                                       \
		free(p_);                                                                         \
	} while (0)

Test(st_file, valid_file)
{
	size_t len;
	uint8_t *b = st_build("{\"__metadata__\":{\"format\":\"pt\"}," ENT("w", "F32", "[2,2]", 0, 16) "}", 16, &len);
	char *path = write_temp(b, len);
	arena_st_file *f;
	int rc = arena_st_open(path, &f);
	cr_assert_eq(rc, 0, "%s", arena_last_error());
	cr_assert_str_eq(f->path, path);
	cr_assert_eq(f->size, len);
	cr_assert_eq(f->n_tensors, 1);
	cr_assert_eq(f->n_meta, 1);
	const arena_st_tensor *t = arena_st_find(f, "w");
	cr_assert_not_null(t);
	cr_assert_eq(memcmp(arena_st_data(t), b + f->data_off, 16), 0);
	arena_st_close(f);
	unlink(path);
	free(path);
	free(b);
}

Test(st_file, bad_files)
{
	expect_file_err("{" ENT("w", "F32", "[2]", 0, 8) "}", 4, ST_DATA_PAST_EOF, "'w'");
	expect_file_err("{" ENT("w", "U8", "[1]", 0, 1) "}", 3, ST_TRAILING_BYTES, NULL);
	expect_file_err("{" ENT("w", "bf16", "[1]", 0, 2) "}", 2, ST_UNKNOWN_DTYPE, "'w'");
	expect_file_err("[]", 0, ST_HEADER_NOT_OBJECT, NULL);
}

Test(st_file, short_and_empty_files)
{
	for (size_t n = 0; n < 8; n++) {
		static const uint8_t zeros[8];
		char *path = write_temp(zeros, n);
		arena_st_file *f;
		int rc = arena_st_open(path, &f);
		cr_assert_eq(rc, ARENA_E(ST_TOO_SHORT), "%zu bytes: %s", n, arena_err_name(rc));
		cr_assert(strstr(arena_last_error(), path));
		unlink(path);
		free(path);
	}
}

Test(st_file, not_found_and_not_a_file)
{
	arena_st_file *f = (arena_st_file *)1;
	int rc = arena_st_open("/nonexistent/arena/x.safetensors", &f);
	cr_assert_eq(rc, ARENA_E_NOT_FOUND, "%s", arena_err_name(rc));
	cr_assert_null(f);
	cr_assert(strstr(arena_last_error(), "/nonexistent/arena/x.safetensors"));
	rc = arena_st_open("/", &f);
	cr_assert_lt(rc, 0);
	cr_assert_null(f);
}
