/* test_subclass.c - tensor subclasses through convert (convert/subclass.h):
 * arena's convention, torchao's safetensors and optimum-quanto's state dicts
 * grouped into torch-subclass tensors (format 1.3), their bytes as the
 * inner tensors held them, export -> convert the same again; refusals. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "arena.h"
#include "../../formats/image.h"
#include "../../formats/st_write.h"
#include "../../convert/convert.h"
#include "../../convert/export.h"
#include "testutil.h"

static char dir[256];

static const char *tmp(const char *name)
{
	static char b[4][512];
	static int k;
	char *s = b[k++ % 4];
	snprintf(s, 512, "%s/%s", dir, name);
	return s;
}

static void setup(void)
{
	tmpdir_make(dir, sizeof(dir), "test-sub");
}

static void teardown(void)
{
	tmpdir_remove(dir);
}

TestSuite(subclass, .init = setup, .fini = teardown);

typedef struct spec {
	const char *name;
	arena_dtype dt;
	uint32_t rank;
	uint64_t shape[2];
} spec;

/* A safetensors file of the tensors `t` (byte j of tensor i is i * 16 + j,
 * mod 251) with the metadata keys[k] = values[k], k < n_meta. */
static void write_meta(const char *path, const spec *t, size_t n, const char *const *keys, const char *const *values,
		       size_t n_meta)
{
	arena_stw *w;
	cr_assert_eq(arena_stw_create(path, &w), 0);
	for (size_t k = 0; k < n_meta; k++)
		cr_assert_eq(arena_stw_meta(w, keys[k], values[k]), 0);
	for (size_t i = 0; i < n; i++)
		cr_assert_eq(arena_stw_add(w, t[i].name, t[i].dt, t[i].rank, t[i].shape), 0, "%s", arena_last_error());
	cr_assert_eq(arena_stw_begin(w), 0);
	for (size_t k = 0; k < arena_stw_count(w); k++) {
		const arena_stw_tensor *st = arena_stw_get(w, k);
		size_t i = 0;
		while (strcmp(t[i].name, st->name))
			i++;
		for (uint64_t j = 0; j < st->nbytes; j++) {
			uint8_t b = (uint8_t)((i * 16 + j) % 251);
			cr_assert_eq(arena_stw_write(w, &b, 1), 0);
		}
	}
	cr_assert_eq(arena_stw_commit(w), 0, "%s", arena_last_error());
}

/* The same with one metadata key (NULL: none). */
static void write_file(const char *path, const spec *t, size_t n, const char *key, const char *value)
{
	write_meta(path, t, n, &key, &value, key != NULL);
}

static int convert(const char *in, const char *out)
{
	return arena_convert(&in, 1, out, &(arena_convert_options){.threads = 1}, NULL);
}

/* The image's tensor `name`: its scheme, its subclass object and component c's
 * name, dtype and first byte. */
static void expect(arena *a, const char *name, const char *scheme, const char *sub_has, uint32_t n_comp)
{
	size_t i;
	cr_assert_eq(arena_tensor_find(a, name, &i), 0, "%s", name);
	arena_tensor_info ti;
	cr_assert_eq(arena_tensor_get(a, i, &ti), 0);
	cr_assert_str_eq(ti.scheme, scheme, "%s", name);
	cr_assert_eq(ti.n_components, n_comp, "%s", name);
	const char *s = arena_tensor_subclass(a, i);
	if (sub_has)
		cr_assert(s && strstr(s, sub_has), "%s: %s", name, s ? s : "(none)");
	else
		cr_assert_null(s);
}

static const uint8_t *comp_bytes(arena *a, const char *name, uint32_t c, const char **cname, const char **dtype)
{
	size_t i;
	cr_assert_eq(arena_tensor_find(a, name, &i), 0);
	arena_tensor_info ti;
	cr_assert_eq(arena_tensor_get(a, i, &ti), 0);
	*cname = ti.component[c].name;
	*dtype = ti.component[c].dtype;
	return ti.component[c].device;
}

static arena *open_sim(const char *path)
{
	arena_open_options o = {.backend = "sim", .vram_cap = 64 << 20};
	arena *a = NULL;
	cr_assert_eq(arena_open(path, &o, &a), 0, "%s", arena_last_error());
	return a;
}

Test(subclass, arena_convention_grouped_and_round_trips)
{
	const spec t[] = {
		{"blocks.0.lin.weight_qdata", ARENA_DTYPE_F8_E4M3, 2, {8, 16}},
		{"blocks.0.lin.weight_scale", ARENA_DTYPE_F32, 2, {8, 1}},
		{"blocks.0.lin.bias", ARENA_DTYPE_BF16, 1, {8}},
		{"blocks.1.lin.weight_qdata", ARENA_DTYPE_F8_E4M3, 2, {8, 16}},
		{"blocks.1.lin.weight_scale", ARENA_DTYPE_F32, 2, {8, 1}},
	};
	const char *meta =
		"{\"blocks.0.lin.weight\":{\"dtype\":\"BF16\",\"shape\":[8,16],\"subclass\":{\"type\":\"lib.F8\",\"k\":[1]},"
		"\"components\":[[\"qdata\",\"blocks.0.lin.weight_qdata\"],[\"scale\",\"blocks.0.lin.weight_scale\"]]},"
		"\"blocks.1.lin.weight\":{\"dtype\":\"BF16\",\"shape\":[8,16],\"subclass\":{\"type\":\"lib.F8\"},"
		"\"components\":[[\"scale\",\"blocks.1.lin.weight_scale\"],[\"qdata\",\"blocks.1.lin.weight_qdata\"]]}}";
	write_file(tmp("a.safetensors"), t, 5, "arena.subclass", meta);
	cr_assert_eq(convert(tmp("a.safetensors"), tmp("a.arena")), 0, "%s", arena_last_error());
	arena *a = open_sim(tmp("a.arena"));
	cr_assert_eq(arena_tensor_count(a), 3);
	expect(a, "blocks.0.lin.weight", "torch-subclass", "\"k\":[1]", 2);
	expect(a, "blocks.1.lin.weight", "torch-subclass", "lib.F8", 2);
	expect(a, "blocks.0.lin.bias", "none", NULL, 1);
	const char *cn, *dt;
	/* components in the listed order, each the bytes of its file tensor */
	const uint8_t *p = comp_bytes(a, "blocks.1.lin.weight", 0, &cn, &dt);
	cr_assert_str_eq(cn, "scale");
	cr_assert_str_eq(dt, "F32");
	cr_assert_eq(p[0], (uint8_t)(4 * 16 % 251));
	p = comp_bytes(a, "blocks.1.lin.weight", 1, &cn, &dt);
	cr_assert_str_eq(cn, "qdata");
	cr_assert_str_eq(dt, "F8_E4M3");
	cr_assert_eq(p[5], (uint8_t)(3 * 16 + 5));
	arena_close(a);
	/* format 1.3: the subclass flag */
	arena_image *img;
	cr_assert_eq(arena_img_open(tmp("a.arena"), &img), 0, "%s", arena_last_error());
	cr_assert_eq(img->hdr.minor, 3);
	cr_assert(img->hdr.flags & ARENA_IMG_FLAG_SUBCLASS);
	arena_img_close(img);
	/* export writes arena's convention, convert groups it again, coded too */
	cr_assert_eq(arena_export(tmp("a.arena"), tmp("x.safetensors"), 1, NULL), 0, "%s", arena_last_error());
	const char *in = tmp("x.safetensors");
	cr_assert_eq(arena_convert(&in, 1, tmp("x.arena"), &(arena_convert_options){.codec = "zstd", .threads = 1}, NULL), 0, "%s", arena_last_error());
	arena *b = open_sim(tmp("x.arena"));
	expect(b, "blocks.0.lin.weight", "torch-subclass", "\"k\":[1]", 2);
	p = comp_bytes(b, "blocks.1.lin.weight", 1, &cn, &dt);
	cr_assert_str_eq(cn, "qdata");
	cr_assert_eq(p[5], (uint8_t)(3 * 16 + 5));
	arena_close(b);
}

Test(subclass, torchao_and_quanto_files)
{
	/* torchao: "<module>._<leaf>_<attr>" and its metadata */
	const spec ao[] = {
		{"blocks.0.lin._weight_qdata", ARENA_DTYPE_I8, 2, {8, 16}},
		{"blocks.0.lin._weight_scale", ARENA_DTYPE_F32, 2, {8, 1}},
		{"blocks.0.lin._weight_zero_point", ARENA_DTYPE_I8, 2, {8, 1}},
		{"blocks.0.lin.bias", ARENA_DTYPE_BF16, 1, {8}},
	};
	const char *const keys[] = {"tensor_names", "blocks.0.lin.weight", "blocks.0.lin.bias"};
	const char *const vals[] = {"[\"blocks.0.lin.weight\", \"blocks.0.lin.bias\"]",
				    "{\"_type\": \"Int8Tensor\", \"_data\": {\"block_size\": [1, 16], \"dtype\": "
				    "{\"_type\": \"torch.dtype\", \"_data\": \"bfloat16\"}}, \"_tensor_data_names\": "
				    "[\"zero_point\", \"qdata\", \"scale\"]}",
				    "{\"_type\": \"Tensor\"}"};
	write_meta(tmp("ao.safetensors"), ao, 4, keys, vals, 3);
	cr_assert_eq(convert(tmp("ao.safetensors"), tmp("ao.arena")), 0, "%s", arena_last_error());
	arena *a = open_sim(tmp("ao.arena"));
	expect(a, "blocks.0.lin.weight", "torch-subclass", "\"type\":\"torchao.quantization.Int8Tensor\"", 3);
	expect(a, "blocks.0.lin.weight", "torch-subclass", "\"size\":[8,16],\"stride\":[16,1]", 3);
	size_t i;
	arena_tensor_info ti;
	cr_assert_eq(arena_tensor_find(a, "blocks.0.lin.weight", &i), 0);
	cr_assert_eq(arena_tensor_get(a, i, &ti), 0);
	cr_assert_str_eq(ti.dtype, "BF16");
	cr_assert_eq(ti.rank, 2);
	cr_assert_eq(ti.shape[1], 16);
	cr_assert_str_eq(ti.component[0].name, "zero_point");
	arena_close(a);

	/* quanto: "<x>.weight._data" and "._scale": a WeightQBytesTensor */
	const spec q[] = {
		{"blocks.0.lin.weight._data", ARENA_DTYPE_F8_E4M3, 2, {8, 16}},
		{"blocks.0.lin.weight._scale", ARENA_DTYPE_BF16, 2, {8, 1}},
		{"blocks.0.lin.input_scale", ARENA_DTYPE_BF16, 0, {0}},
	};
	write_file(tmp("q.safetensors"), q, 3, NULL, NULL);
	cr_assert_eq(convert(tmp("q.safetensors"), tmp("q.arena")), 0, "%s", arena_last_error());
	a = open_sim(tmp("q.arena"));
	expect(a, "blocks.0.lin.weight", "torch-subclass", "\"qtype\":\"qfloat8_e4m3fn\"", 2);
	expect(a, "blocks.0.lin.weight", "torch-subclass", "\"size\":\"[8, 16]\",\"stride\":\"[16, 1]\"", 2);
	expect(a, "blocks.0.lin.input_scale", "none", NULL, 1);
	arena_close(a);

	/* refused, nothing written: a packed quanto weight (no shape), a torchao type without its
	 * shape, an inner tensor the metadata names and the file lacks */
	const spec packed[] = {
		{"blocks.0.lin.weight._data._data", ARENA_DTYPE_U8, 2, {8, 8}},
		{"blocks.0.lin.weight._scale", ARENA_DTYPE_BF16, 2, {8, 1}},
	};
	write_file(tmp("p.safetensors"), packed, 2, NULL, NULL);
	cr_assert_eq(convert(tmp("p.safetensors"), tmp("p.arena")), ARENA_E(QUANT_NOT_APPLICABLE));
	cr_assert(strstr(arena_last_error(), "packed optimum-quanto weight"), "%s", arena_last_error());
	cr_assert_eq(access(tmp("p.arena"), F_OK), -1);
	const spec one[] = {{"blocks.0.lin._weight_qdata", ARENA_DTYPE_U8, 2, {8, 8}}};
	write_file(tmp("t.safetensors"), one, 1, "tensor_names", "[\"blocks.0.lin.weight\"]");
	cr_assert_eq(convert(tmp("t.safetensors"), tmp("t.arena")), ARENA_E(ST_BAD_METADATA));
	const char *bad = "{\"blocks.0.lin.weight\":{\"dtype\":\"BF16\",\"shape\":[8,16],\"subclass\":{},"
			  "\"components\":[[\"qdata\",\"blocks.0.lin.weight_nope\"]]}}";
	write_file(tmp("b.safetensors"), one, 1, "arena.subclass", bad);
	cr_assert_eq(convert(tmp("b.safetensors"), tmp("b.arena")), ARENA_E(ST_BAD_METADATA));
	cr_assert(strstr(arena_last_error(), "its inner tensor 'blocks.0.lin.weight_nope' is not in the checkpoint"), "%s",
		  arena_last_error());
	cr_assert_eq(access(tmp("b.arena"), F_OK), -1);
	const char *dup = "{\"blocks.0.lin._weight_qdata\":{\"dtype\":\"BF16\",\"shape\":[8,16],\"subclass\":{},"
			  "\"components\":[[\"qdata\",\"blocks.0.lin._weight_qdata\"]]}}";
	write_file(tmp("d.safetensors"), one, 1, "arena.subclass", dup);
	cr_assert_eq(convert(tmp("d.safetensors"), tmp("d.arena")), ARENA_E(DUPLICATE_TENSOR), "%s", arena_last_error());
}
