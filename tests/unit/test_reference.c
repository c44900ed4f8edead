/* test_reference.c - the reader against files written by the real safetensors
 * and PyTorch libraries (fixtures/, made by fixtures/make_fixtures.py):
 * every dtype, shape and value of dtypes.safetensors against
 * dtypes.expected.json, decoded here independently of the library; the tiny
 * Flux model; the sharded tiny Llama; the quantization references open. */
#include <criterion/criterion.h>

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "../../formats/checkpoint.h"
#include "../../formats/safetensors.h"
#include "testutil.h"

static char *read_text(const char *path)
{
	FILE *fp = fopen(path, "rb");
	cr_assert_not_null(fp, "%s: %s", path, strerror(errno));
	cr_assert_eq(fseek(fp, 0, SEEK_END), 0);
	long n = ftell(fp);
	cr_assert_geq(n, 0);
	rewind(fp);
	char *s = malloc((size_t)n + 1);
	cr_assert_not_null(s);
	cr_assert_eq(fread(s, 1, (size_t)n, fp), (size_t)n);
	s[n] = '\0';
	fclose(fp);
	return s;
}

/* jansson holds integers as long long; dtypes.expected.json has a U64 value
 * of 2^63. Rewrite every integer literal outside strings that does not fit as
 * a string holding its digits, compared exactly below. */
static char *quote_big_ints(const char *s)
{
	size_t n = strlen(s);
	char *o = malloc(3 * n + 1);
	cr_assert_not_null(o);
	size_t k = 0;
	int in_str = 0;
	for (size_t i = 0; i < n;) {
		char c = s[i];
		if (in_str) {
			o[k++] = c;
			if (c == '\\' && i + 1 < n)
				o[k++] = s[++i];
			else if (c == '"')
				in_str = 0;
			i++;
		} else if (c == '"') {
			in_str = 1;
			o[k++] = s[i++];
		} else if (c == '-' || (c >= '0' && c <= '9')) {
			size_t j = i + 1, frac = 0;
			while (j < n && strchr("0123456789.eE+-", s[j])) {
				frac |= strchr(".eE", s[j]) != NULL;
				j++;
			}
			char tok[64];
			cr_assert_lt(j - i, sizeof(tok));
			memcpy(tok, s + i, j - i);
			tok[j - i] = '\0';
			errno = 0;
			(void)strtoll(tok, NULL, 10);
			int big = !frac && errno == ERANGE;
			if (big)
				o[k++] = '"';
			memcpy(o + k, tok, j - i);
			k += j - i;
			if (big)
				o[k++] = '"';
			i = j;
		} else {
			o[k++] = s[i++];
		}
	}
	o[k] = '\0';
	return o;
}

static json_t *load_json(const char *path, int quote)
{
	char *text = read_text(path);
	if (quote) {
		char *q = quote_big_ints(text);
		free(text);
		text = q;
	}
	json_error_t err;
	json_t *j = json_loads(text, JSON_REJECT_DUPLICATES, &err);
	cr_assert_not_null(j, "%s: line %d: %s", path, err.line, err.text);
	free(text);
	return j;
}

/* --- decoders, written from the format definitions ------------------------ */

static double f16_to_double(uint16_t h)
{
	int s = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
	double v;
	if (e == 0)
		v = ldexp(m, -24);
	else if (e == 31)
		v = m ? NAN : INFINITY;
	else
		v = ldexp(m | 0x400, e - 25);
	return s ? -v : v;
}

static double bf16_to_double(uint16_t b)
{
	uint32_t u = (uint32_t)b << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

/* F8_E4M3 is the "fn" variant: bias 7, no infinities, S.1111.111 is NaN. */
static double e4m3fn_to_double(uint8_t b)
{
	int s = b >> 7, e = (b >> 3) & 0xf, m = b & 7;
	double v;
	if (e == 15 && m == 7)
		v = NAN;
	else if (e == 0)
		v = ldexp(m, -9);
	else
		v = ldexp(m | 8, e - 10);
	return s ? -v : v;
}

/* F8_E5M2: IEEE-like, bias 15, with infinities and NaNs. */
static double e5m2_to_double(uint8_t b)
{
	int s = b >> 7, e = (b >> 2) & 0x1f, m = b & 3;
	double v;
	if (e == 0)
		v = ldexp(m, -16);
	else if (e == 31)
		v = m ? NAN : INFINITY;
	else
		v = ldexp(m | 4, e - 17);
	return s ? -v : v;
}

static uint64_t le(const uint8_t *p, int bytes)
{
	uint64_t v = 0;
	for (int i = bytes - 1; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}

static double f32_at(const uint8_t *p)
{
	uint32_t u = (uint32_t)le(p, 4);
	float f;
	memcpy(&f, &u, 4);
	return f;
}

static double f64_at(const uint8_t *p)
{
	uint64_t u = le(p, 8);
	double d;
	memcpy(&d, &u, 8);
	return d;
}

/* --- expected values -------------------------------------------------------- */

static const struct {
	const char *torch, *st;
} dtype_map[] = {
	{"torch.bool", "BOOL"},
	{"torch.uint8", "U8"},
	{"torch.int8", "I8"},
	{"torch.uint16", "U16"},
	{"torch.int16", "I16"},
	{"torch.uint32", "U32"},
	{"torch.int32", "I32"},
	{"torch.uint64", "U64"},
	{"torch.int64", "I64"},
	{"torch.float16", "F16"},
	{"torch.bfloat16", "BF16"},
	{"torch.float32", "F32"},
	{"torch.float64", "F64"},
	{"torch.complex64", "C64"},
	{"torch.float8_e4m3fn", "F8_E4M3"},
	{"torch.float8_e5m2", "F8_E5M2"},
	{"torch.float8_e8m0fnu", "F8_E8M0"},
	{"torch.float8_e4m3fnuz", "F8_E4M3FNUZ"},
	{"torch.float8_e5m2fnuz", "F8_E5M2FNUZ"},
};

static const char *st_dtype_of(const char *torch)
{
	for (size_t i = 0; i < sizeof(dtype_map) / sizeof(dtype_map[0]); i++)
		if (strcmp(dtype_map[i].torch, torch) == 0)
			return dtype_map[i].st;
	return NULL;
}

/* Flatten nested value lists (row-major) into out; returns the count. */
static size_t flatten(json_t *v, json_t **out, size_t cap, size_t n)
{
	if (json_is_array(v)) {
		size_t i;
		json_t *x;
		json_array_foreach(v, i, x)
			n = flatten(x, out, cap, n);
		return n;
	}
	cr_assert_lt(n, cap, "more values than expected");
	out[n] = v;
	return n + 1;
}

/* The expected number as a double: a JSON number, or "nan", "inf", "-inf". */
static double expected_real(const char *name, size_t i, json_t *v)
{
	if (json_is_string(v)) {
		const char *s = json_string_value(v);
		if (strcmp(s, "nan") == 0)
			return NAN;
		if (strcmp(s, "inf") == 0)
			return INFINITY;
		if (strcmp(s, "-inf") == 0)
			return -INFINITY;
		cr_assert_fail("%s[%zu]: unexpected string \"%s\"", name, i, s);
	}
	cr_assert(json_is_number(v), "%s[%zu]: not a number", name, i);
	return json_number_value(v);
}

static void check_real(const char *name, size_t i, double got, json_t *want_j)
{
	double want = expected_real(name, i, want_j);
	if (isnan(want)) {
		cr_assert(isnan(got), "%s[%zu]: got %.17g, want nan", name, i, got);
		return;
	}
	cr_assert(got == want && signbit(got) == signbit(want), "%s[%zu]: got %.17g, want %.17g", name, i, got,
		  want);
}

/* Integers compared exactly: JSON integers, or big ones quoted as digits. */
static void check_int(const char *name, size_t i, const uint8_t *p, int bytes, int is_signed, json_t *want_j)
{
	uint64_t raw = le(p, bytes);
	if (is_signed) {
		int64_t got = bytes == 8 ? (int64_t)raw : (int64_t)(raw << (64 - 8 * bytes)) >> (64 - 8 * bytes);
		long long want;
		if (json_is_string(want_j)) {
			errno = 0;
			want = strtoll(json_string_value(want_j), NULL, 10);
			cr_assert_eq(errno, 0);
		} else {
			cr_assert(json_is_integer(want_j), "%s[%zu]: not an integer", name, i);
			want = json_integer_value(want_j);
		}
		cr_assert_eq(got, want, "%s[%zu]: got %lld, want %lld", name, i, (long long)got, want);
	} else {
		unsigned long long want;
		if (json_is_string(want_j)) {
			errno = 0;
			want = strtoull(json_string_value(want_j), NULL, 10);
			cr_assert_eq(errno, 0);
		} else {
			cr_assert(json_is_integer(want_j) && json_integer_value(want_j) >= 0, "%s[%zu]", name, i);
			want = (unsigned long long)json_integer_value(want_j);
		}
		cr_assert_eq(raw, want, "%s[%zu]: got %llu, want %llu", name, i, (unsigned long long)raw, want);
	}
}

static void check_tensor(const arena_st_tensor *t, json_t *want)
{
	const char *name = t->name;
	const char *torch = json_string_value(json_object_get(want, "dtype"));
	cr_assert_not_null(torch, "%s: expected dtype missing", name);
	const char *st = st_dtype_of(torch);
	cr_assert_not_null(st, "%s: no safetensors dtype for %s in the test's map", name, torch);
	cr_assert_str_eq(arena_dtype_name(t->dtype), st, "%s: dtype %s, want %s (%s)", name,
			 arena_dtype_name(t->dtype), st, torch);

	json_t *shape = json_object_get(want, "shape");
	cr_assert(json_is_array(shape));
	cr_assert_eq(t->rank, json_array_size(shape), "%s: rank", name);
	uint64_t nelem = 1;
	for (uint32_t k = 0; k < t->rank; k++) {
		cr_assert_eq(t->shape[k], (uint64_t)json_integer_value(json_array_get(shape, k)), "%s: dim %u", name,
			     k);
		nelem *= t->shape[k];
	}
	cr_assert_eq(t->nelem, nelem, "%s: nelem", name);
	cr_assert_eq(t->nbytes, nelem * arena_dtype_bits(t->dtype) / 8, "%s: nbytes", name);

	/* C64 values are interleaved re, im. */
	size_t nvals = (size_t)nelem * (t->dtype == ARENA_DTYPE_C64 ? 2 : 1);
	json_t **vals = calloc(nvals + 1, sizeof(*vals));
	cr_assert_not_null(vals);
	size_t got_n = flatten(json_object_get(want, "values"), vals, nvals + 1, 0);
	cr_assert_eq(got_n, nvals, "%s: %zu expected values for %zu elements", name, got_n, nvals);

	const uint8_t *d = arena_st_data(t);
	for (size_t i = 0; i < nvals; i++) {
		switch (t->dtype) {
		case ARENA_DTYPE_BOOL:
			cr_assert(json_is_boolean(vals[i]), "%s[%zu]: not a boolean", name, i);
			cr_assert(d[i] == 0 || d[i] == 1, "%s[%zu]: byte %u", name, i, d[i]);
			cr_assert_eq(d[i], json_is_true(vals[i]), "%s[%zu]", name, i);
			break;
		case ARENA_DTYPE_U8:
			check_int(name, i, d + i, 1, 0, vals[i]);
			break;
		case ARENA_DTYPE_I8:
			check_int(name, i, d + i, 1, 1, vals[i]);
			break;
		case ARENA_DTYPE_U16:
			check_int(name, i, d + 2 * i, 2, 0, vals[i]);
			break;
		case ARENA_DTYPE_I16:
			check_int(name, i, d + 2 * i, 2, 1, vals[i]);
			break;
		case ARENA_DTYPE_U32:
			check_int(name, i, d + 4 * i, 4, 0, vals[i]);
			break;
		case ARENA_DTYPE_I32:
			check_int(name, i, d + 4 * i, 4, 1, vals[i]);
			break;
		case ARENA_DTYPE_U64:
			check_int(name, i, d + 8 * i, 8, 0, vals[i]);
			break;
		case ARENA_DTYPE_I64:
			check_int(name, i, d + 8 * i, 8, 1, vals[i]);
			break;
		case ARENA_DTYPE_F16:
			check_real(name, i, f16_to_double((uint16_t)le(d + 2 * i, 2)), vals[i]);
			break;
		case ARENA_DTYPE_BF16:
			check_real(name, i, bf16_to_double((uint16_t)le(d + 2 * i, 2)), vals[i]);
			break;
		case ARENA_DTYPE_F32:
		case ARENA_DTYPE_C64:
			check_real(name, i, f32_at(d + 4 * i), vals[i]);
			break;
		case ARENA_DTYPE_F64:
			check_real(name, i, f64_at(d + 8 * i), vals[i]);
			break;
		case ARENA_DTYPE_F8_E4M3:
			check_real(name, i, e4m3fn_to_double(d[i]), vals[i]);
			break;
		case ARENA_DTYPE_F8_E5M2:
			check_real(name, i, e5m2_to_double(d[i]), vals[i]);
			break;
		default:
			cr_assert_fail("%s: no decoder for %s in the test", name, arena_dtype_name(t->dtype));
		}
	}
	free(vals);
}

/* --- the decoders themselves, on known bit patterns ------------------------- */

Test(reference, decoders)
{
	cr_assert_eq(f16_to_double(0x3c00), 1.0);
	cr_assert_eq(f16_to_double(0x7bff), 65504.0);
	cr_assert_eq(f16_to_double(0x0001), ldexp(1, -24));
	cr_assert_eq(f16_to_double(0xc000), -2.0);
	cr_assert(isinf(f16_to_double(0xfc00)) && f16_to_double(0xfc00) < 0);
	cr_assert(isnan(f16_to_double(0x7e00)));
	cr_assert_eq(bf16_to_double(0x3f80), 1.0);
	cr_assert_eq(bf16_to_double(0xc040), -3.0);
	cr_assert_eq(e4m3fn_to_double(0x38), 1.0);
	cr_assert_eq(e4m3fn_to_double(0x7e), 448.0);
	cr_assert_eq(e4m3fn_to_double(0x01), ldexp(1, -9));
	cr_assert(isnan(e4m3fn_to_double(0x7f)) && isnan(e4m3fn_to_double(0xff)));
	cr_assert_eq(e4m3fn_to_double(0x78), 256.0, "e4m3fn has no infinity");
	cr_assert_eq(e5m2_to_double(0x3c), 1.0);
	cr_assert_eq(e5m2_to_double(0x7b), 57344.0);
	cr_assert_eq(e5m2_to_double(0x01), ldexp(1, -16));
	cr_assert(isinf(e5m2_to_double(0x7c)));
	cr_assert(isnan(e5m2_to_double(0x7d)));
}

/* --- dtypes.safetensors ----------------------------------------------------- */

Test(reference, dtypes_values)
{
	arena_st_file *f;
	int rc = arena_st_open(fixture_path("dtypes.safetensors"), &f);
	cr_assert_eq(rc, 0, "%s", arena_last_error());
	json_t *exp = load_json(fixture_path("dtypes.expected.json"), 1);
	size_t n_expected = 0;
	const char *key;
	json_t *v;
	json_object_foreach(exp, key, v) {
		if (strcmp(key, "__metadata__") == 0)
			continue;
		n_expected++;
		const arena_st_tensor *t = arena_st_find(f, key);
		cr_assert_not_null(t, "tensor '%s' not in the file", key);
		check_tensor(t, v);
	}
	cr_assert_eq(f->n_tensors, n_expected, "file has %zu tensors, expected %zu", f->n_tensors, n_expected);
	cr_assert_geq(n_expected, 18);
	json_decref(exp);
	arena_st_close(f);
}

Test(reference, dtypes_special_cases)
{
	arena_st_file *f;
	cr_assert_eq(arena_st_open(fixture_path("dtypes.safetensors"), &f), 0, "%s", arena_last_error());
	const arena_st_tensor *s = arena_st_find(f, "scalar_f32");
	cr_assert_not_null(s);
	cr_assert_eq(s->rank, 0);
	cr_assert_eq(s->nelem, 1);
	cr_assert_eq(s->nbytes, 4);
	const arena_st_tensor *e = arena_st_find(f, "empty_f32");
	cr_assert_not_null(e);
	cr_assert_eq(e->rank, 2);
	cr_assert_eq(e->nbytes, 0);
	/* Sorted by name, every byte of the data section used once. */
	uint64_t total = 0;
	for (size_t i = 0; i < f->n_tensors; i++) {
		total += f->tensors[i].nbytes;
		if (i)
			cr_assert_lt(strcmp(f->tensors[i - 1].name, f->tensors[i].name), 0);
	}
	cr_assert_eq(total, f->size - f->data_off);
	arena_st_close(f);
}

Test(reference, dtypes_metadata)
{
	arena_st_file *f;
	cr_assert_eq(arena_st_open(fixture_path("dtypes.safetensors"), &f), 0, "%s", arena_last_error());
	json_t *exp = load_json(fixture_path("dtypes.expected.json"), 1);
	json_t *meta = json_object_get(exp, "__metadata__");
	cr_assert(json_is_object(meta));
	cr_assert_eq(f->n_meta, json_object_size(meta));
	for (size_t i = 0; i < f->n_meta; i++) {
		json_t *want = json_object_get(meta, f->meta_keys[i]);
		cr_assert(json_is_string(want), "unexpected metadata key '%s'", f->meta_keys[i]);
		cr_assert_str_eq(f->meta_vals[i], json_string_value(want), "metadata '%s'", f->meta_keys[i]);
	}
	/* The non-ASCII value, byte for byte. */
	int found = 0;
	for (size_t i = 0; i < f->n_meta; i++)
		if (strcmp(f->meta_keys[i], "unicode") == 0) {
			cr_assert_str_eq(f->meta_vals[i], "\xc3\xbcn\xc3\xaf" "c\xc3\xb8" "d\xc3\xa9 \xe2\x9c\x93");
			found = 1;
		}
	cr_assert(found, "no 'unicode' metadata");
	json_decref(exp);
	arena_st_close(f);
}

/* --- tiny_flux.safetensors ---------------------------------------------------- */

static size_t count_prefix(const arena_st_file *f, const char *prefix)
{
	size_t n = 0;
	for (size_t i = 0; i < f->n_tensors; i++)
		n += strncmp(f->tensors[i].name, prefix, strlen(prefix)) == 0;
	return n;
}

Test(reference, tiny_flux)
{
	arena_st_file *f;
	int rc = arena_st_open(fixture_path("tiny_flux.safetensors"), &f);
	cr_assert_eq(rc, 0, "%s", arena_last_error());
	cr_assert_eq(f->n_tensors, 126);
	for (size_t i = 0; i < f->n_tensors; i++)
		cr_assert_eq(f->tensors[i].dtype, ARENA_DTYPE_BF16, "%s", f->tensors[i].name);
	cr_assert_gt(count_prefix(f, "transformer_blocks.0."), 0);
	cr_assert_gt(count_prefix(f, "transformer_blocks.1."), 0);
	cr_assert_eq(count_prefix(f, "transformer_blocks.2."), 0);
	cr_assert_gt(count_prefix(f, "single_transformer_blocks.2."), 0);
	cr_assert_eq(count_prefix(f, "single_transformer_blocks.3."), 0);
	cr_assert_eq(count_prefix(f, "transformer_blocks.0."), count_prefix(f, "transformer_blocks.1."));
	arena_st_close(f);

	/* The same through the checkpoint layer (by file: its folder holds other
	 * fixtures too, so the folder itself is ambiguous). */
	arena_ckpt *c;
	rc = arena_ckpt_open(fixture_path("tiny_flux.safetensors"), &c);
	cr_assert_eq(rc, 0, "%s", arena_last_error());
	cr_assert_eq(c->n_tensors, 126);
	cr_assert_eq(c->n_files, 1);
	cr_assert_null(c->index_path);
	arena_ckpt_close(c);
}

Test(reference, quant_reference_opens)
{
	arena_st_file *f;
	int rc = arena_st_open(fixture_path("quant_reference.safetensors"), &f);
	cr_assert_eq(rc, 0, "%s", arena_last_error());
	cr_assert_eq(f->n_tensors, 12);
	cr_assert_gt(f->n_meta, 0);
	arena_st_close(f);
}

/* The int4 reference: 6 inputs, and for each of 3 group sizes their codes,
 * scales, zero points and values (tests/unit/test_quant.c compares them). */
Test(reference, int4_reference_opens)
{
	arena_st_file *f;
	int rc = arena_st_open(fixture_path("int4_reference.safetensors"), &f);
	cr_assert_eq(rc, 0, "%s", arena_last_error());
	cr_assert_eq(f->n_tensors, 6 + 6 * 3 * 4);
	cr_assert_gt(f->n_meta, 0);
	arena_st_close(f);
}

/* --- tiny_llama_sharded ------------------------------------------------------ */

static const char *base_name(const char *p)
{
	const char *s = strrchr(p, '/');
	return s ? s + 1 : p;
}

static void check_llama(const char *path)
{
	arena_ckpt *c;
	int rc = arena_ckpt_open(path, &c);
	cr_assert_eq(rc, 0, "%s: %s", path, arena_last_error());
	cr_assert_eq(c->n_tensors, 30, "%s: %zu tensors", path, c->n_tensors);
	cr_assert_eq(c->n_files, 2);
	cr_assert_not_null(c->index_path);
	cr_assert_str_eq(base_name(c->index_path), "model.safetensors.index.json");
	cr_assert_str_eq(base_name(c->files[0]->path), "model-00001-of-00002.safetensors");
	cr_assert_str_eq(base_name(c->files[1]->path), "model-00002-of-00002.safetensors");
	cr_assert_eq(c->files[0]->n_tensors + c->files[1]->n_tensors, 30);
	for (size_t i = 0; i < c->n_tensors; i++) {
		cr_assert_eq(c->tensors[i]->dtype, ARENA_DTYPE_F16, "%s", c->tensors[i]->name);
		if (i)
			cr_assert_lt(strcmp(c->tensors[i - 1]->name, c->tensors[i]->name), 0);
	}

	/* Every tensor the index names resolves to its shard. */
	json_t *idx = load_json(fixture_path("tiny_llama_sharded/model.safetensors.index.json"), 0);
	json_t *wm = json_object_get(idx, "weight_map");
	cr_assert_eq(json_object_size(wm), 30);
	const char *key;
	json_t *v;
	json_object_foreach(wm, key, v) {
		const arena_st_tensor *t = arena_ckpt_find(c, key);
		cr_assert_not_null(t, "'%s' does not resolve", key);
		cr_assert_str_eq(t->name, key);
		cr_assert_str_eq(base_name(t->file->path), json_string_value(v), "'%s' is in %s, the index says %s",
				 key, t->file->path, json_string_value(v));
		cr_assert_eq(arena_st_find(t->file, key), t);
	}
	cr_assert_null(arena_ckpt_find(c, "model.layers.3.input_layernorm.weight"));
	cr_assert_null(arena_ckpt_find(c, ""));
	/* The index's metadata, and its total size, agree with the shards. */
	cr_assert_not_null(c->index_meta);
	json_t *total = json_object_get((const json_t *)c->index_meta, "total_size");
	cr_assert(json_is_integer(total));
	cr_assert_eq(arena_ckpt_bytes(c), (uint64_t)json_integer_value(total));
	json_decref(idx);
	arena_ckpt_close(c);
}

Test(reference, llama_sharded_through_folder)
{
	check_llama(fixture_path("tiny_llama_sharded"));
}

Test(reference, llama_sharded_through_folder_with_slash)
{
	check_llama(fixture_path("tiny_llama_sharded/"));
}

Test(reference, llama_sharded_through_index)
{
	check_llama(fixture_path("tiny_llama_sharded/model.safetensors.index.json"));
}

Test(reference, llama_one_shard_alone)
{
	/* A shard opened on its own is a valid single file with its share of tensors. */
	arena_ckpt *c;
	int rc = arena_ckpt_open(fixture_path("tiny_llama_sharded/model-00002-of-00002.safetensors"), &c);
	cr_assert_eq(rc, 0, "%s", arena_last_error());
	cr_assert_eq(c->n_files, 1);
	cr_assert_null(c->index_path);
	cr_assert_gt(c->n_tensors, 0);
	cr_assert_lt(c->n_tensors, 30);
	arena_ckpt_close(c);
}
