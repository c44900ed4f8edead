/* test_quant_convert.c - arena convert --quant end to end: bit-exact with the
 * torch reference through convert -> export, compressed-tensors round trips,
 * and bad requests refused before anything is written; int4 through convert,
 * export and arena_tensor_dequantize (sim) against its torch reference, its
 * refusals, and convert under injected allocation, write and read failures. */
#include <criterion/criterion.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "arena.h"
#include "../../common/alloc.h"
#include "../../common/io.h"
#include "../../common/outfile.h"
#include "../../formats/image.h"
#include "../../formats/safetensors.h"
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
	arena_convert_opts o = {.threads = 2, .quant = {.scheme = scheme, .include = &glob, .n_include = 1}, .force = 1};
	cr_assert_eq(arena_convert_inputs(&in, 1, img, &o, NULL), 0, "%s", arena_last_error());
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
	cr_assert_eq(arena_convert_inputs(&in, 1, tmp("c.arena"), &o, NULL), 0, "%s", arena_last_error());
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
	cr_assert_eq(arena_convert_inputs(&in, 1, tmp("f.arena"), &o, &res), 0, "%s", arena_last_error());
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
	cr_assert_eq(arena_convert_inputs(&ctin, 1, tmp("g.arena"), &plain, NULL), 0, "%s", arena_last_error());
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
	cr_assert_eq(arena_convert_inputs(&in, 1, tmp("x.arena"), &o, NULL), ARENA_E(QUANT_UNKNOWN_SCHEME));
	const char *bias = "x_embedder.bias";
	arena_convert_opts o2 = {.quant = {.scheme = "int8-row", .include = &bias, .n_include = 1}};
	cr_assert_eq(arena_convert_inputs(&in, 1, tmp("x.arena"), &o2, NULL), ARENA_E(QUANT_NOT_APPLICABLE));
	cr_assert(strstr(arena_last_error(), "x_embedder.bias"), "%s", arena_last_error());
	const char *inc = "*to_q*", *exc = "transformer_blocks.0.*";
	arena_convert_opts o3 = {.quant = {.scheme = "int8-row", .include = &inc, .n_include = 1, .exclude = &exc, .n_exclude = 1}};
	cr_assert_eq(arena_convert_inputs(&in, 1, tmp("x.arena"), &o3, NULL), ARENA_E_USAGE);
	cr_assert(strstr(arena_last_error(), "matches --quant-include"), "%s", arena_last_error());
	arena_convert_opts o4 = {.quant = {.include = &inc, .n_include = 1}};
	cr_assert_eq(arena_convert_inputs(&in, 1, tmp("x.arena"), &o4, NULL), ARENA_E_USAGE);
	const char *none = "no_such_*";
	arena_convert_opts o5 = {.quant = {.scheme = "fp8-e4m3", .exclude = &none, .n_exclude = 1}};
	cr_assert_eq(arena_convert_inputs(&in, 1, tmp("x.arena"), &o5, NULL), ARENA_E_USAGE);
	/* An integer tensor asked for explicitly. */
	const char *i8 = "i8";
	const char *din = fixture_path("dtypes.safetensors");
	arena_convert_opts o6 = {.quant = {.scheme = "fp8-e4m3", .include = &i8, .n_include = 1}};
	cr_assert_eq(arena_convert_inputs(&din, 1, tmp("x.arena"), &o6, NULL), ARENA_E(QUANT_NOT_APPLICABLE));
	cr_assert_eq(entries(), 0, "a refused request wrote something");
}

/* ---- quantized names that would clash once exported ---------------------- */

/* A safetensors file of zeros: tensors "name:DTYPE:d0,d1,..." (nbytes each). */
static void write_st(const char *path, const char *const *spec, size_t n)
{
	char hdr[4096];
	size_t o = (size_t)snprintf(hdr, sizeof(hdr), "{");
	uint64_t off = 0;
	for (size_t i = 0; i < n; i++) {
		char name[256], dt[16], dims[64];
		cr_assert_eq(sscanf(spec[i], "%255[^:]:%15[^:]:%63s", name, dt, dims), 3);
		uint64_t el = 1, bits = !strcmp(dt, "F32") ? 32 : !strcmp(dt, "BF16") ? 16 : 8;
		for (char *p = dims; *p; p++)
			if (p == dims || p[-1] == ',')
				el *= strtoull(p, NULL, 10);
		uint64_t nb = el * bits / 8;
		o += (size_t)snprintf(hdr + o, sizeof(hdr) - o,
				      "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%s],\"data_offsets\":[%llu,%llu]}", i ? "," : "",
				      name, dt, dims, (unsigned long long)off, (unsigned long long)(off + nb));
		off += nb;
	}
	o += (size_t)snprintf(hdr + o, sizeof(hdr) - o, "}");
	FILE *f = fopen(path, "wb");
	uint64_t hl = o;
	fwrite(&hl, 8, 1, f);
	fwrite(hdr, 1, o, f);
	for (uint64_t i = 0; i < off; i++)
		fputc(0, f);
	fclose(f);
}

static int count(const char *hay, const char *needle)
{
	int n = 0;
	for (const char *p = hay; (p = strstr(p, needle)); p++)
		n++;
	return n;
}

Test(qconvert, quantized_names_that_clash_are_refused)
{
	static const char *const clash[] = {"transformer_blocks.0.attn.to_q.weight:BF16:4,4",
					    "transformer_blocks.0.attn.to_q.weight_scale:F32:4"};
	write_st(tmp("c.safetensors"), clash, 2);
	const char *in = tmp("c.safetensors");
	char inpath[512];
	snprintf(inpath, sizeof(inpath), "%s", in);
	const char *in2 = inpath;
	/* every scheme with a scale component exports it as '<name>_scale' */
	static const char *const scaled[] = {"fp8-e4m3-row", "fp8-e4m3-tensor", "int8-row"};
	for (size_t i = 0; i < 3; i++) {
		arena_convert_opts o = {.threads = 1, .quant = {.scheme = scaled[i]}};
		cr_assert_eq(arena_convert_inputs(&in2, 1, tmp("c.arena"), &o, NULL), ARENA_E(DUPLICATE_TENSOR), "%s: %s",
			     scaled[i], arena_last_error());
		const char *m = arena_last_error();
		cr_expect(strstr(m, inpath) == m, "the file first: %s", m);
		cr_expect(strstr(m, "tensor 'transformer_blocks.0.attn.to_q.weight'"), "%s", m);
		cr_expect(strstr(m, "'transformer_blocks.0.attn.to_q.weight_scale'"), "%s", m);
	}
	/* schemes without a scale give no second name; bf16 and fp8-e5m2 make
	 * no compressed-tensors pair either */
	static const char *const plain[] = {"bf16", "fp8-e5m2"};
	for (size_t i = 0; i < 2; i++) {
		arena_convert_opts o = {.threads = 1, .quant = {.scheme = plain[i]}};
		cr_assert_eq(arena_convert_inputs(&in2, 1, tmp("c.arena"), &o, NULL), 0, "%s: %s", plain[i], arena_last_error());
		cr_assert_eq(arena_export(tmp("c.arena"), tmp("c2.safetensors"), 1, NULL), 0, "%s", arena_last_error());
		unlink(tmp("c.arena"));
		unlink(tmp("c2.safetensors"));
	}
	/* fp8-e4m3 would store the weight as F8_E4M3 next to a tensor that then
	 * reads as its scale (per row here); one of another shape does not */
	arena_convert_opts e4 = {.threads = 1, .quant = {.scheme = "fp8-e4m3"}};
	cr_assert_eq(arena_convert_inputs(&in2, 1, tmp("c.arena"), &e4, NULL), ARENA_E(DUPLICATE_TENSOR), "%s",
		     arena_last_error());
	cr_expect(strstr(arena_last_error(), "'transformer_blocks.0.attn.to_q.weight_scale'"), "%s", arena_last_error());
	static const char *const other[] = {"transformer_blocks.0.attn.to_q.weight:BF16:4,4",
					    "transformer_blocks.0.attn.to_q.weight_scale:F32:4,2"};
	write_st(tmp("o.safetensors"), other, 2);
	const char *in3 = tmp("o.safetensors");
	char in3p[512];
	snprintf(in3p, sizeof(in3p), "%s", in3);
	in3 = in3p;
	cr_assert_eq(arena_convert_inputs(&in3, 1, tmp("o.arena"), &e4, NULL), 0, "%s", arena_last_error());
	/* left out, it converts */
	const char *exc = "*.to_q.weight";
	arena_convert_opts ex = {.threads = 1, .quant = {.scheme = "fp8-e4m3-row", .exclude = &exc, .n_exclude = 1}};
	cr_assert_eq(arena_convert_inputs(&in2, 1, tmp("c.arena"), &ex, NULL), 0, "%s", arena_last_error());
	cr_assert_eq(arena_export(tmp("c.arena"), tmp("c2.safetensors"), 1, NULL), 0, "%s", arena_last_error());
	/* a real compressed-tensors pair is kept whatever the scheme */
	static const char *const ct[] = {"transformer_blocks.0.attn.to_q.weight:F8_E4M3:4,4",
					 "transformer_blocks.0.attn.to_q.weight_scale:F32:4,1",
					 "transformer_blocks.0.attn.to_k.weight:BF16:4,4"};
	write_st(tmp("ct.safetensors"), ct, 3);
	char ctp[512];
	snprintf(ctp, sizeof(ctp), "%s", tmp("ct.safetensors"));
	const char *in4 = ctp;
	for (size_t i = 0; i < 3; i++) {
		arena_convert_opts o = {.threads = 1, .quant = {.scheme = scaled[i]}, .force = 1};
		cr_assert_eq(arena_convert_inputs(&in4, 1, tmp("ct.arena"), &o, NULL), 0, "%s: %s", scaled[i], arena_last_error());
		cr_assert_eq(arena_export(tmp("ct.arena"), tmp("ct2.safetensors"), 1, NULL), 0, "%s", arena_last_error());
	}
}

/* An image that holds such a clash (from before convert refused it) fails
 * export with one error that names the image and both tensors, each path once. */
Test(qconvert, export_names_a_clash_once)
{
	static const char *const near[] = {"transformer_blocks.0.attn.to_q.weight:BF16:4,4",
					   "transformer_blocks.0.attn.to_q.weight_scalf:F32:4"};
	write_st(tmp("n.safetensors"), near, 2);
	char inp[512], img[512], out[512];
	snprintf(inp, sizeof(inp), "%s", tmp("n.safetensors"));
	snprintf(img, sizeof(img), "%s", tmp("n.arena"));
	snprintf(out, sizeof(out), "%s", tmp("n2.safetensors"));
	const char *in = inp;
	arena_convert_opts o = {.threads = 1, .quant = {.scheme = "fp8-e4m3-row"}};
	cr_assert_eq(arena_convert_inputs(&in, 1, img, &o, NULL), 0, "%s", arena_last_error());
	/* rename the second tensor in the manifest to '<weight>_scale', checksums redone */
	FILE *f = fopen(img, "r+b");
	cr_assert_not_null(f);
	static uint8_t page[ARENA_IMG_HEADER_SIZE];
	cr_assert_eq(fread(page, 1, sizeof(page), f), sizeof(page));
	fseek(f, 0, SEEK_END);
	arena_img_header h;
	cr_assert_eq(arena_img_header_decode(page, (uint64_t)ftell(f), img, &h), 0, "%s", arena_last_error());
	char *m = malloc(h.manifest_length + 1);
	fseek(f, (long)h.manifest_offset, SEEK_SET);
	cr_assert_eq(fread(m, 1, h.manifest_length, f), h.manifest_length);
	m[h.manifest_length] = 0;
	char *p = strstr(m, "weight_scalf");
	cr_assert_not_null(p);
	p[11] = 'e';
	cr_assert_null(strstr(m, "weight_scalf"));
	h.manifest_xxh3 = XXH3_64bits(m, h.manifest_length);
	arena_img_header_encode(&h, page);
	fseek(f, (long)h.manifest_offset, SEEK_SET);
	fwrite(m, 1, h.manifest_length, f);
	fseek(f, 0, SEEK_SET);
	fwrite(page, 1, sizeof(page), f);
	fclose(f);
	free(m);
	int rc = arena_export(img, out, 1, NULL);
	cr_assert_eq(arena_err_class(rc), ARENA_CLASS_INVALID, "%d: %s", rc, arena_last_error());
	const char *e = arena_last_error();
	cr_expect_eq(count(e, img), 1, "the image named once: %s", e);
	cr_expect_eq(count(e, out), 0, "the output is not at fault: %s", e);
	cr_expect(strstr(e, "'transformer_blocks.0.attn.to_q.weight'"), "%s", e);
	cr_expect(strstr(e, "'transformer_blocks.0.attn.to_q.weight_scale'"), "%s", e);
	cr_expect(access(out, F_OK) != 0, "export left %s", out);
}

/* ---- int4 ---------------------------------------------------------------------------- */

static const char *const int4_inputs[] = {"w_bf16", "o_*", "v_bf16", "c_f16"}; /* int4_reference's inputs */

/* int4_reference.safetensors converted with `scheme` on its inputs (chunks
 * of 64 KiB: components cut across chunks), then exported: every input's
 * codes, scale and zero points are the torch reference's, byte for byte. */
static void int4_through(const char *scheme, unsigned n)
{
	const char *in = fixture_path("int4_reference.safetensors");
	arena_convert_opts o = {.threads = 2,
				.chunk_size = 64 << 10,
				.quant = {.scheme = scheme, .include = int4_inputs, .n_include = 4},
				.force = 1};
	cr_assert_eq(arena_convert_inputs(&in, 1, tmp("i.arena"), &o, NULL), 0, "%s", arena_last_error());
	cr_assert_eq(arena_export(tmp("i.arena"), tmp("i.safetensors"), 1, NULL), 0, "%s", arena_last_error());
	arena_st_file *f, *r;
	cr_assert_eq(arena_st_open(tmp("i.safetensors"), &f), 0, "%s", arena_last_error());
	cr_assert_eq(arena_st_open(in, &r), 0);
	static const char *const names[] = {"w_bf16", "o_bf16", "o_f16", "o_f32", "v_bf16", "c_f16"};
	for (size_t i = 0; i < 6; i++) {
		char g[64], w[64];
		static const char *const comp[][2] = {{"", "q"}, {"_scale", "s"}, {"_zero", "z"}};
		for (size_t c = 0; c < 3; c++) {
			snprintf(g, sizeof(g), "%s%s", names[i], comp[c][0]);
			snprintf(w, sizeof(w), "int4_g%u_%s_%s", n, names[i], comp[c][1]);
			same(f, g, r, w);
		}
	}
	same(f, "int4_g64_o_f16_q", r, "int4_g64_o_f16_q"); /* the rest as stored */
	arena_st_close(f);
	arena_st_close(r);
}

Test(qconvert, int4_bit_exact_through_convert_and_export)
{
	int4_through("int4-g32", 32);
	int4_through("int4-g64", 64);
	int4_through("int4-g128", 128);
}

/* arena_tensor_dequantize on sim (formats/dequant.h's loop) writes torch's
 * ((q - z) * s).to(dtype) for every input and group size; the tensor's
 * description names its three components. */
Test(qconvert, int4_dequantize_on_sim_equals_the_reference)
{
	arena_st_file *r;
	cr_assert_eq(arena_st_open(fixture_path("int4_reference.safetensors"), &r), 0);
	const char *in = fixture_path("int4_reference.safetensors");
	static const char *const schemes[] = {"int4-g32", "int4-g64", "int4-g128"};
	for (size_t k = 0; k < 3; k++) {
		arena_convert_opts o = {.threads = 1, .quant = {.scheme = schemes[k], .include = int4_inputs, .n_include = 4}};
		cr_assert_eq(arena_convert_inputs(&in, 1, tmp("d.arena"), &o, NULL), 0, "%s", arena_last_error());
		arena_open_options ao = {.backend = "sim", .vram_cap = 64 << 20};
		arena *a;
		cr_assert_eq(arena_open(tmp("d.arena"), &ao, &a), 0, "%s", arena_last_error());
		size_t n_int4 = 0;
		for (size_t i = 0; i < arena_tensor_count(a); i++) {
			arena_tensor_info t;
			cr_assert_eq(arena_tensor_get(a, i, &t), 0);
			if (strcmp(t.scheme, schemes[k]))
				continue;
			n_int4++;
			cr_assert_eq(t.n_components, 3);
			cr_assert(!strcmp(t.component[0].name, "qdata") && !strcmp(t.component[0].dtype, "U8"));
			cr_assert(!strcmp(t.component[1].name, "scale") && !strcmp(t.component[1].dtype, t.dtype));
			cr_assert(!strcmp(t.component[2].name, "zero") && !strcmp(t.component[2].dtype, "U8"));
			char nm[96];
			snprintf(nm, sizeof(nm), "int4_g%s_%s_dq", schemes[k] + 6, t.name);
			const arena_st_tensor *want = arena_st_find(r, nm);
			cr_assert_not_null(want, "%s", nm);
			unsigned char *out = malloc(want->nbytes);
			memset(out, 0xEE, want->nbytes);
			cr_assert_eq(arena_tensor_dequantize(a, i, arena_block_device(a, t.block), out, NULL), 0, "%s",
				     arena_last_error());
			size_t bad = 0;
			for (uint64_t b = 0; b < want->nbytes; b++)
				bad += out[b] != arena_st_data(want)[b];
			cr_assert_eq(bad, 0, "%s: %zu bytes differ from %s", t.name, bad, nm);
			free(out);
		}
		cr_assert_eq(n_int4, 6, "%s", schemes[k]);
		arena_close(a);
		unlink(tmp("d.arena"));
	}
	arena_st_close(r);
}

/* A safetensors file of one BF16 tensor with the given values. */
static void write_bf16(const char *path, const char *name, uint64_t rows, uint64_t cols, const uint16_t *v)
{
	char hdr[512];
	int n = snprintf(hdr, sizeof(hdr), "{\"%s\":{\"dtype\":\"BF16\",\"shape\":[%llu,%llu],\"data_offsets\":[0,%llu]}}",
			 name, (unsigned long long)rows, (unsigned long long)cols, (unsigned long long)(rows * cols * 2));
	FILE *f = fopen(path, "wb");
	cr_assert_not_null(f);
	uint64_t hl = (uint64_t)n;
	fwrite(&hl, 8, 1, f);
	fwrite(hdr, 1, (size_t)n, f);
	fwrite(v, 2, rows * cols, f);
	fclose(f);
}

/* A NaN or an infinity in a weight: convert refuses, naming the file, the
 * tensor, the row, columns and group, and writes nothing (the refusal comes
 * from a chunk's filler, after other chunks were written). */
Test(qconvert, int4_refuses_nan_and_inf_and_writes_nothing)
{
	const uint64_t rows = 512, cols = 300;
	uint16_t *v = malloc(rows * cols * 2);
	for (uint64_t i = 0; i < rows * cols; i++)
		v[i] = (uint16_t)(0x3C00 + (i * 7919) % 0x200) ^ (uint16_t)(i & 1 ? 0x8000 : 0); /* +-0.0078 .. 0.03 */
	const uint16_t bad[] = {0x7FC0, 0xFF80};
	for (size_t b = 0; b < 2; b++) {
		v[400 * cols + 70] = bad[b];
		write_bf16(tmp("n.safetensors"), "transformer_blocks.0.ff.weight", rows, cols, v);
		char inp[512];
		snprintf(inp, sizeof(inp), "%s", tmp("n.safetensors"));
		const char *in = inp;
		arena_convert_opts o = {.threads = 2, .chunk_size = 64 << 10, .quant = {.scheme = "int4-g64"}};
		cr_assert_eq(arena_convert_inputs(&in, 1, tmp("n.arena"), &o, NULL), ARENA_E(QUANT_NOT_APPLICABLE));
		const char *m = arena_last_error();
		cr_expect(strstr(m, inp) == m, "the file first: %s", m);
		cr_expect(strstr(m, "tensor 'transformer_blocks.0.ff.weight': int4-g64: row 400, columns 64 to 127 (group 1)"),
			  "%s", m);
		cr_expect(strstr(m, "--quant-exclude"), "%s", m);
		cr_assert_eq(entries(), 1, "a refused convert wrote something");
		/* left out, the tensor converts (stored as it is) */
		const char *exc = "*.ff.weight";
		arena_convert_opts x = {.threads = 2, .quant = {.scheme = "int4-g64", .exclude = &exc, .n_exclude = 1}};
		cr_assert_eq(arena_convert_inputs(&in, 1, tmp("n.arena"), &x, NULL), 0, "%s", arena_last_error());
		unlink(tmp("n.arena"));
		unlink(tmp("n.safetensors"));
	}
	free(v);
}

/* Convert of tiny_flux with --quant int4-g64 under injected failures: the
 * nth allocation (every 7th n), the nth write (disk full), a read; each
 * ends in its error with nothing left behind, and the convert that runs
 * whole gives the image a plain run gives. */
Test(qconvert, int4_convert_under_faults_leaves_nothing)
{
	slow_test();
	const char *in = fixture_path("tiny_flux.safetensors");
	arena_convert_opts o = {.threads = 2, .chunk_size = 64 << 10, .quant = {.scheme = "int4-g64"}};
	cr_assert_eq(arena_convert_inputs(&in, 1, tmp("ref.arena"), &o, NULL), 0, "%s", arena_last_error());
	arena_image *img;
	cr_assert_eq(arena_img_open(tmp("ref.arena"), &img), 0);
	cr_assert_eq(arena_img_verify_data(img, 2, NULL, NULL, NULL), 0);
	size_t nq = 0;
	for (size_t i = 0; i < img->layout->n_tensors; i++)
		nq += !strcmp(img->layout->tensors[i].scheme, "int4-g64");
	cr_assert_gt(nq, 40);
	arena_img_close(img);
	long n;
	for (n = 1; n < 1000000; n += 7) {
		arena_fault_alloc(n);
		int rc = arena_convert_inputs(&in, 1, tmp("x.arena"), &o, NULL);
		int fired = arena_fault_alloc_fired();
		arena_fault_alloc(0);
		if (!fired) {
			cr_assert_eq(rc, 0, "%s", arena_last_error());
			break;
		}
		cr_assert(rc == ARENA_E_NOMEM || rc == 0, "n=%ld: %s: %s", n, arena_err_name(rc), arena_last_error());
		cr_assert_eq(entries(), 1 + (rc == 0), "n=%ld left a file", n);
		unlink(tmp("x.arena"));
	}
	cr_assert_gt(n, 100);
	unlink(tmp("x.arena"));
	int fired = 0;
	for (n = 1; n < 64; n++) {
		arena_fault_write(n);
		int rc = arena_convert_inputs(&in, 1, tmp("x.arena"), &o, NULL);
		arena_fault_write(0);
		if (rc == 0)
			break;
		fired++;
		cr_assert_eq(rc, ARENA_E(IO), "n=%ld: %s", n, arena_last_error());
		cr_assert_eq(entries(), 1, "a failed write left a file (n=%ld)", n);
	}
	cr_assert_gt(fired, 2);
	unlink(tmp("x.arena"));
	arena_fault_read(3);
	int rc = arena_convert_inputs(&in, 1, tmp("x.arena"), &o, NULL);
	arena_fault_read(0);
	cr_assert_eq(rc, ARENA_E(IO), "%s", arena_last_error());
	cr_assert_eq(entries(), 1);
	/* and whole, the same bytes as the first run */
	cr_assert_eq(arena_convert_inputs(&in, 1, tmp("x.arena"), &o, NULL), 0, "%s", arena_last_error());
	FILE *a = fopen(tmp("ref.arena"), "rb"), *b = fopen(tmp("x.arena"), "rb");
	int ca, cb;
	do {
		ca = fgetc(a);
		cb = fgetc(b);
		cr_assert_eq(ca, cb, "the convert after the faults differs");
	} while (ca != EOF);
	fclose(a);
	fclose(b);
}
