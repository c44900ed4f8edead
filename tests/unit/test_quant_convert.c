/* test_quant_convert.c - arena convert --quant end to end: bit-exact with the
 * torch reference through convert -> export, compressed-tensors round trips,
 * and bad requests refused before anything is written. */
#include <criterion/criterion.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "arena.h"
#include "../../formats/image.h"
#include "../../formats/safetensors.h"
#include "../../loader/convert.h"
#include "../../loader/export.h"
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
	tmpdir_make(dir, sizeof(dir), "test-qc");
}

static void teardown(void)
{
	tmpdir_remove(dir);
}

static int entries(void)
{
	DIR *d = opendir(dir);
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)))
		n += e->d_name[0] != '.' || (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."));
	closedir(d);
	return n;
}

TestSuite(qconvert, .init = setup, .fini = teardown);

/* Convert quant_reference with `scheme` on the tensors matching `glob`,
 * export, and return the exported file (opened). */
static arena_st_file *through(const char *scheme, const char *glob)
{
	char img[512], out[512];
	snprintf(img, sizeof(img), "%s", tmp("q.arena"));
	snprintf(out, sizeof(out), "%s", tmp("q.safetensors"));
	const char *in = fixture_path("quant_reference.safetensors");
	arena_convert_opts o = {.threads = 2, .quant = {.scheme = scheme, .include = &glob, .n_include = 1}};
	cr_assert_eq(arena_convert(&in, 1, img, &o, NULL), 0, "%s", arena_last_error());
	cr_assert_eq(arena_export(img, out, 1, NULL), 0, "%s", arena_last_error());
	arena_st_file *f;
	cr_assert_eq(arena_st_open(out, &f), 0, "%s", arena_last_error());
	return f;
}

static void same(const arena_st_file *got, const char *gname, const arena_st_file *want, const char *wname)
{
	const arena_st_tensor *g = arena_st_find(got, gname), *w = arena_st_find(want, wname);
	cr_assert_not_null(g, "%s missing from the export", gname);
	cr_assert_not_null(w);
	cr_assert_eq(g->dtype, w->dtype, "%s: dtype %s, want %s", gname, arena_dtype_name(g->dtype),
		     arena_dtype_name(w->dtype));
	cr_assert_eq(g->nbytes, w->nbytes, "%s: %llu bytes", gname, (unsigned long long)g->nbytes);
	cr_assert_eq(g->rank, w->rank);
	for (uint32_t i = 0; i < g->rank; i++)
		cr_assert_eq(g->shape[i], w->shape[i]);
	size_t bad = 0;
	for (uint64_t i = 0; i < g->nbytes; i++)
		bad += arena_st_data(g)[i] != arena_st_data(w)[i];
	cr_assert_eq(bad, 0, "%s: %zu bytes differ from the torch reference %s", gname, bad, wname);
}

static arena_st_file *reference(void)
{
	arena_st_file *r;
	cr_assert_eq(arena_st_open(fixture_path("quant_reference.safetensors"), &r), 0);
	return r;
}

Test(qconvert, fp8_e4m3_row_bit_exact)
{
	arena_st_file *r = reference(), *f = through("fp8-e4m3-row", "w_bf16");
	same(f, "w_bf16", r, "row_q_e4m3");
	same(f, "w_bf16_scale", r, "row_scale_f32");
	same(f, "x_bf16", r, "x_bf16"); /* not selected: as stored */
	arena_st_close(f);
	arena_st_close(r);
}

Test(qconvert, int8_row_bit_exact)
{
	arena_st_file *r = reference(), *f = through("int8-row", "w_bf16");
	same(f, "w_bf16", r, "row_q_i8");
	same(f, "w_bf16_scale", r, "row_scale_i8_f32");
	arena_st_close(f);
	arena_st_close(r);
}

Test(qconvert, fp8_e4m3_tensor_bit_exact)
{
	arena_st_file *r = reference(), *f = through("fp8-e4m3-tensor", "x_bf16");
	same(f, "x_bf16", r, "tensor_q_e4m3");
	same(f, "x_bf16_scale", r, "tensor_scale");
	arena_st_close(f);
	arena_st_close(r);
}

Test(qconvert, saturating_casts_bit_exact)
{
	arena_st_file *r = reference(), *f = through("fp8-e4m3", "x_bf16");
	same(f, "x_bf16", r, "sat_e4m3");
	arena_st_close(f);
	f = through("fp8-e5m2", "x_bf16");
	same(f, "x_bf16", r, "sat_e5m2");
	arena_st_close(f);
	arena_st_close(r);
}

Test(qconvert, small_chunks_split_rows_and_tensors)
{
	/* Chunks of 64 KiB cut through quantized tensors: the filler makes any range. */
	arena_st_file *r = reference();
	const char *in = fixture_path("quant_reference.safetensors"), *glob = "w_*";
	arena_convert_opts o = {.threads = 2, .chunk_size = 64 << 10, .quant = {.scheme = "fp8-e4m3-row", .include = &glob, .n_include = 1}};
	cr_assert_eq(arena_convert(&in, 1, tmp("c.arena"), &o, NULL), 0, "%s", arena_last_error());
	cr_assert_eq(arena_export(tmp("c.arena"), tmp("c.safetensors"), 1, NULL), 0, "%s", arena_last_error());
	arena_st_file *f;
	cr_assert_eq(arena_st_open(tmp("c.safetensors"), &f), 0);
	same(f, "w_bf16", r, "row_q_e4m3");
	same(f, "w_bf16_scale", r, "row_scale_f32");
	arena_st_close(f);
	arena_st_close(r);
}

Test(qconvert, tiny_flux_fp8_row_and_compressed_tensors_round_trip)
{
	const char *in = fixture_path("tiny_flux.safetensors");
	arena_convert_opts o = {.threads = 2, .quant = {.scheme = "fp8-e4m3-row"}};
	arena_convert_result res;
	cr_assert_eq(arena_convert(&in, 1, tmp("f.arena"), &o, &res), 0, "%s", arena_last_error());
	arena_image *img;
	cr_assert_eq(arena_img_open(tmp("f.arena"), &img), 0);
	cr_assert_eq(arena_img_verify_data(img, 2, NULL, NULL, NULL), 0);
	size_t nq = 0;
	for (size_t i = 0; i < img->layout->n_tensors; i++) {
		const arena_tensor *t = &img->layout->tensors[i];
		int block = img->layout->blocks[t->block].container != NULL;
		int want = block && t->rank == 2 && strstr(t->name, ".weight") && !strstr(t->name, "norm_");
		if (strcmp(t->scheme, "none")) {
			nq++;
			cr_assert(want, "%s should not be quantized", t->name);
			cr_assert_str_eq(t->scheme, "fp8-e4m3-row");
			cr_assert_eq(t->n_comp, 2);
			cr_assert_eq(t->comp[0].dtype, ARENA_DTYPE_F8_E4M3);
			cr_assert_eq(t->comp[1].dtype, ARENA_DTYPE_F32);
			cr_assert_eq(t->comp[1].offset % 256, 0);
		} else {
			cr_assert_not(want, "%s should be quantized", t->name);
		}
	}
	cr_assert_gt(nq, 40);
	arena_img_close(img);
	cr_assert_eq(arena_export(tmp("f.arena"), tmp("f.safetensors"), 1, NULL), 0, "%s", arena_last_error());
	/* The export is compressed-tensors: converting it again keeps the pairs. */
	const char *ct = tmp("f.safetensors");
	char ctp[512];
	snprintf(ctp, sizeof(ctp), "%s", ct);
	const char *ctin = ctp;
	arena_convert_opts plain = {.threads = 1};
	cr_assert_eq(arena_convert(&ctin, 1, tmp("g.arena"), &plain, NULL), 0, "%s", arena_last_error());
	cr_assert_eq(arena_img_open(tmp("g.arena"), &img), 0);
	size_t kept = 0;
	for (size_t i = 0; i < img->layout->n_tensors; i++)
		kept += !strcmp(img->layout->tensors[i].scheme, "fp8-e4m3-row");
	cr_assert_eq(kept, nq);
	cr_assert_eq(img->layout->n_tensors, 126);
	arena_img_close(img);
	cr_assert_eq(arena_export(tmp("g.arena"), tmp("g.safetensors"), 1, NULL), 0);
	FILE *a = fopen(tmp("f.safetensors"), "rb"), *b = fopen(tmp("g.safetensors"), "rb");
	int ca, cb;
	do {
		ca = fgetc(a);
		cb = fgetc(b);
		cr_assert_eq(ca, cb, "the compressed-tensors round trip is not lossless");
	} while (ca != EOF);
	fclose(a);
	fclose(b);
}

Test(qconvert, bad_requests_write_nothing)
{
	const char *in = fixture_path("tiny_flux.safetensors");
	arena_convert_opts o = {.quant = {.scheme = "fp9"}};
	cr_assert_eq(arena_convert(&in, 1, tmp("x.arena"), &o, NULL), ARENA_E(QUANT_UNKNOWN_SCHEME));
	const char *bias = "x_embedder.bias";
	arena_convert_opts o2 = {.quant = {.scheme = "int8-row", .include = &bias, .n_include = 1}};
	cr_assert_eq(arena_convert(&in, 1, tmp("x.arena"), &o2, NULL), ARENA_E(QUANT_NOT_APPLICABLE));
	cr_assert(strstr(arena_last_error(), "x_embedder.bias"), "%s", arena_last_error());
	const char *inc = "*to_q*", *exc = "transformer_blocks.0.*";
	arena_convert_opts o3 = {.quant = {.scheme = "int8-row", .include = &inc, .n_include = 1, .exclude = &exc, .n_exclude = 1}};
	cr_assert_eq(arena_convert(&in, 1, tmp("x.arena"), &o3, NULL), ARENA_E_USAGE);
	cr_assert(strstr(arena_last_error(), "matches --quant-include"), "%s", arena_last_error());
	arena_convert_opts o4 = {.quant = {.include = &inc, .n_include = 1}};
	cr_assert_eq(arena_convert(&in, 1, tmp("x.arena"), &o4, NULL), ARENA_E_USAGE);
	const char *none = "no_such_*";
	arena_convert_opts o5 = {.quant = {.scheme = "fp8-e4m3", .exclude = &none, .n_exclude = 1}};
	cr_assert_eq(arena_convert(&in, 1, tmp("x.arena"), &o5, NULL), ARENA_E_USAGE);
	/* An integer tensor asked for explicitly. */
	const char *i8 = "i8";
	const char *din = fixture_path("dtypes.safetensors");
	arena_convert_opts o6 = {.quant = {.scheme = "fp8-e4m3", .include = &i8, .n_include = 1}};
	cr_assert_eq(arena_convert(&din, 1, tmp("x.arena"), &o6, NULL), ARENA_E(QUANT_NOT_APPLICABLE));
	cr_assert_eq(entries(), 0, "a refused request wrote something");
}
