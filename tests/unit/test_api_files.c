/* test_api_files.c - the public convert, verify and inspect of include/arena.h:
 * options checked, progress that rises to the total, a progress callback
 * that cancels and leaves nothing, an existing output replaced only when
 * forced, bad chunks described, the inspection's JSON; arena_writer: the
 * chunk table and data arena_convert makes (plain, quantized by rows and by
 * tensor, coded), its misuse refused and nothing left; a convert that reads
 * each chunk back catches bytes the disk did not keep and leaves nothing. */
#include <criterion/criterion.h>

#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "arena.h"
#include "../../common/outfile.h"
#include "../../convert/synth.h"
#include "testutil.h"

static char dir[256];

static void setup(void)
{
	tmpdir_make(dir, sizeof(dir), "test-apif");
}

static void teardown(void)
{
	tmpdir_remove(dir);
}

TestSuite(api_files, .init = setup, .fini = teardown);

static int exists(const char *p)
{
	struct stat st;
	return stat(p, &st) == 0;
}

typedef struct prog {
	int calls, stop_at;
	uint64_t last, total;
	int backwards;
} prog;

static int on_progress(void *ctx, uint64_t done, uint64_t total)
{
	prog *p = ctx;
	p->backwards |= done < p->last || done > total;
	p->last = done;
	p->total = total;
	return ++p->calls >= p->stop_at && p->stop_at > 0;
}

Test(api_files, convert_verify_inspect)
{
	const char *in = fixture_path("tiny_flux.safetensors");
	const char *out = tmpdir_file(dir, "f.arena");
	prog p = {0};
	arena_convert_options o = {.codec = "zstd", .chunk_size = 64 << 10, .progress = on_progress, .progress_ctx = &p};
	arena_convert_info ci;
	cr_assert_eq(arena_convert(&in, 1, out, &o, &ci), 0, "%s", arena_last_error());
	cr_assert_eq(ci.n_blocks, 6);
	cr_assert_eq(ci.n_tensors, 126);
	cr_assert_gt(ci.file_size, ci.stored_bytes);
	cr_assert_eq(ci.coded_chunks, ci.chunk_count, "every chunk of random-free weights codes smaller");
	cr_assert_lt(ci.stored_bytes, ci.data_bytes);
	cr_assert_geq(p.calls, 1);
	cr_assert_eq(p.last, p.total, "the last report is the whole");
	cr_assert_not(p.backwards);
	struct stat st;
	cr_assert_eq(stat(out, &st), 0);
	cr_assert_eq((uint64_t)st.st_size, ci.file_size);

	prog vp = {0};
	arena_verify_options vo = {.threads = 2, .progress = on_progress, .progress_ctx = &vp};
	arena_verify_info vi;
	cr_assert_eq(arena_verify(out, &vo, &vi), 0, "%s", arena_last_error());
	cr_assert_eq(vi.opened, 1);
	cr_assert_eq(vi.file_size, ci.file_size);
	cr_assert_eq(vi.chunk_count, ci.chunk_count);
	cr_assert_eq(vi.bad_chunks, 0);
	cr_assert_eq(vp.last, vp.total);
	cr_assert_not(vp.backwards);
	cr_assert_eq(arena_verify(out, NULL, NULL), 0, "%s", arena_last_error());

	char *doc = NULL;
	cr_assert_eq(arena_inspect(out, &doc), 0, "%s", arena_last_error());
	json_t *d = json_loads(doc, 0, NULL);
	arena_string_free(doc);
	cr_assert_not_null(d);
	cr_assert_str_eq(json_string_value(json_object_get(d, "kind")), "arena-image");
	cr_assert_eq(json_array_size(json_object_get(d, "blocks")), 6);
	cr_assert_eq(json_array_size(json_object_get(d, "tensors")), 126);
	cr_assert_eq(json_integer_value(json_object_get(d, "file_size")), (json_int_t)ci.file_size);
	cr_assert(json_is_true(json_object_get(json_object_get(d, "coding"), "coded_image")));
	json_decref(d);
	cr_assert_eq(arena_inspect(in, &doc), 0, "%s", arena_last_error());
	d = json_loads(doc, 0, NULL);
	arena_string_free(doc);
	cr_assert_str_eq(json_string_value(json_object_get(d, "kind")), "safetensors");
	cr_assert_eq(json_integer_value(json_object_get(json_object_get(d, "totals"), "tensors")), 126);
	json_decref(d);
	arena_string_free(NULL);
}

/* read_back: the image comes out whole and verifies, plain and coded; a chunk
 * the disk gave back other than it was written (injected) is an IO error
 * naming the byte, and nothing is left at the output. */
Test(api_files, a_read_back_convert_catches_what_the_disk_did_not_keep)
{
	const char *in = fixture_path("tiny_flux.safetensors");
	const char *out = tmpdir_file(dir, "rb.arena");
	for (int coded = 0; coded < 2; coded++) {
		arena_convert_options o = {.chunk_size = 64 << 10, .threads = 2, .read_back = 1,
					   .codec = coded ? "zstd" : NULL, .force = 1};
		arena_convert_info ci;
		cr_assert_eq(arena_convert(&in, 1, out, &o, &ci), 0, "%s", arena_last_error());
		cr_assert_gt(ci.chunk_count, 4);
		cr_assert_eq(arena_verify(out, NULL, NULL), 0, "%s", arena_last_error());
		cr_assert_eq(unlink(out), 0);
		arena_fault_stored(3);
		int rc = arena_convert(&in, 1, out, &o, NULL);
		arena_fault_stored(0);
		cr_assert_eq(rc, ARENA_E_IO, "coded %d: %s (%s)", coded, arena_err_name(rc), arena_last_error());
		cr_assert(strstr(arena_last_error(), "differ from those written"), "%s", arena_last_error());
		cr_assert_not(exists(out));
		cr_assert_eq(dir_entries(dir), 0, "coded %d: a temporary was left", coded);
	}
}

Test(api_files, options_are_checked)
{
	const char *in = fixture_path("tiny_flux.safetensors");
	const char *out = tmpdir_file(dir, "x.arena");
	const char *null_in[] = {NULL};
	struct {
		arena_convert_options o;
		const char *says;
	} bad[] = {
		{{.chunk_size = 1000}, "chunk_size 1000"},
		{{.chunk_size = 2u << 30}, "chunk_size"},
		{{.codec = "lz4"}, "codec 'lz4'"},
		{{.codec = "hb4", .zstd_level = 3}, "zstd_level is for codec zstd"},
		{{.codec = "zstd", .zstd_level = 20}, "zstd_level 20"},
		{{.threads = 1000}, "threads 1000"},
		{{.n_block_patterns = 1}, "block_patterns is NULL"},
		{{.quant = "fp9"}, "fp9"},
		{{.block_patterns = (const char *const[]){"a("}, .n_block_patterns = 1}, ""},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		int rc = arena_convert(&in, 1, out, &bad[i].o, NULL);
		cr_assert_lt(rc, 0, "case %zu converted", i);
		cr_assert_eq(arena_err_class(rc), ARENA_CLASS_USAGE, "case %zu: %s", i, arena_last_error());
		cr_assert(strstr(arena_last_error(), bad[i].says), "case %zu: '%s' lacks '%s'", i, arena_last_error(),
			  bad[i].says);
		cr_assert_not(exists(out), "case %zu left the output", i);
	}
	cr_assert_eq(arena_convert(&in, 0, out, NULL, NULL), ARENA_E_USAGE);
	cr_assert_eq(arena_convert(null_in, 1, out, NULL, NULL), ARENA_E_USAGE);
	cr_assert_eq(arena_convert(&in, 1, NULL, NULL, NULL), ARENA_E_USAGE);
	cr_assert_eq(arena_convert(&in, 1, in, NULL, NULL), ARENA_E(OUTPUT_IS_INPUT));
	cr_assert_eq(dir_entries(dir), 0);
	arena_verify_options vo = {.threads = 65};
	arena_verify_info vi;
	cr_assert_eq(arena_verify(in, &vo, &vi), ARENA_E_USAGE);
	cr_assert_eq(vi.opened, 0);
	cr_assert_eq(arena_verify(in, NULL, &vi), ARENA_E(IMG_MAGIC), "%s", arena_last_error());
	cr_assert_eq(vi.opened, 0);
	cr_assert_eq(arena_verify(tmpdir_file(dir, "none.arena"), NULL, &vi), ARENA_E_NOT_FOUND);
	char *doc = (char *)1;
	cr_assert_eq(arena_inspect(tmpdir_file(dir, "none"), &doc), ARENA_E_NOT_FOUND);
	cr_assert_null(doc);
	cr_assert_eq(arena_inspect(in, NULL), ARENA_E_USAGE);
}

/* A model that takes seconds to convert with zstd's slowest level on one
 * thread (about 24 M parameters): the progress callback's first report
 * (after a quarter of a second) cancels it. */
Test(api_files, a_cancelled_convert_leaves_nothing, .timeout = 120)
{
	arena_synth_flux_config c = {.patch_size = 1, .in_channels = 64, .num_layers = 2, .num_single_layers = 2,
				     .attention_head_dim = 128, .num_attention_heads = 4, .joint_attention_dim = 512,
				     .pooled_projection_dim = 256, .timestep_channels = 256, .mlp_ratio = 4,
				     .guidance_embeds = 1};
	arena_synth_list l = {0};
	cr_assert_eq(arena_synth_flux(&c, -1, &l), 0, "%s", arena_last_error());
	const char *src = tmpdir_file(dir, "m.safetensors");
	arena_synth_opts so = {.layout = "test", .dtype = ARENA_DTYPE_BF16, .seed = 1};
	cr_assert_eq(arena_synth_write(src, &l, &so), 0, "%s", arena_last_error());
	arena_synth_list_release(&l);
	const char *out = tmpdir_file(dir, "m.arena");
	prog p = {.stop_at = 1};
	arena_convert_options o = {.codec = "zstd", .zstd_level = 19, .threads = 1, .chunk_size = 64 << 10,
				   .progress = on_progress, .progress_ctx = &p};
	cr_assert_eq(arena_convert(&src, 1, out, &o, NULL), ARENA_E_CANCELLED, "%s", arena_last_error());
	cr_assert_eq(p.calls, 1);
	cr_assert_lt(p.last, p.total, "cancelled before the end");
	cr_assert_not(exists(out));
	cr_assert_eq(dir_entries(dir), 1, "only the input is left");
	/* The same without a progress callback converts. */
	o = (arena_convert_options){.threads = 2};
	cr_assert_eq(arena_convert(&src, 1, out, &o, NULL), 0, "%s", arena_last_error());
	/* A verify cancelled at its first report. */
	prog vp = {.stop_at = 1};
	arena_verify_options vo = {.threads = 1, .progress = on_progress, .progress_ctx = &vp};
	arena_verify_info vi;
	cr_assert_eq(arena_verify(out, &vo, &vi), ARENA_E_CANCELLED, "%s", arena_last_error());
	cr_assert_eq(vp.calls, 1);
	cr_assert_eq(vi.opened, 1);
}

typedef struct bads {
	int n;
	uint64_t first_chunk;
	char first_block[128];
	size_t first_tensors;
} bads;

static void on_bad(void *ctx, const arena_bad_chunk *b)
{
	bads *s = ctx;
	if (!s->n++) {
		s->first_chunk = b->chunk;
		snprintf(s->first_block, sizeof(s->first_block), "%s", b->n_blocks ? b->blocks[0] : "");
		s->first_tensors = b->n_tensors;
	}
	cr_assert_neq(b->expected, b->actual);
	cr_assert_gt(b->length, 0);
}

/* An existing output is OUTPUT_EXISTS (said before anything is read past the
 * input's header: no progress reported) and stays as it was, unless force:
 * then it is replaced by the new image. */
Test(api_files, existing_output_needs_force)
{
	const char *in = fixture_path("tiny_flux.safetensors");
	const char *out = tmpdir_file(dir, "f.arena");
	FILE *f = fopen(out, "w");
	cr_assert_not_null(f);
	fputs("keep", f);
	fclose(f);
	prog p = {0};
	arena_convert_options o = {.progress = on_progress, .progress_ctx = &p};
	cr_assert_eq(arena_convert(&in, 1, out, &o, NULL), ARENA_E(OUTPUT_EXISTS));
	cr_assert(strstr(arena_last_error(), out), "%s", arena_last_error());
	cr_assert_eq(p.calls, 0);
	struct stat st;
	cr_assert_eq(stat(out, &st), 0);
	cr_assert_eq(st.st_size, 4);
	cr_assert_eq(dir_entries(dir), 1);
	o.force = 1;
	cr_assert_eq(arena_convert(&in, 1, out, &o, NULL), 0, "%s", arena_last_error());
	cr_assert_eq(arena_verify(out, NULL, NULL), 0, "%s", arena_last_error());
	cr_assert_eq(dir_entries(dir), 1);
}

Test(api_files, bad_chunks_are_described)
{
	const char *in = fixture_path("tiny_flux.safetensors");
	const char *out = tmpdir_file(dir, "f.arena");
	arena_convert_options o = {.chunk_size = 64 << 10};
	arena_convert_info ci;
	cr_assert_eq(arena_convert(&in, 1, out, &o, &ci), 0, "%s", arena_last_error());
	cr_assert_gt(ci.chunk_count, 2);
	char *doc;
	cr_assert_eq(arena_inspect(out, &doc), 0);
	json_t *d = json_loads(doc, 0, NULL);
	arena_string_free(doc);
	const long long data_offset = json_integer_value(json_object_get(json_object_get(d, "layout"), "data_offset"));
	json_decref(d);
	/* a byte in every 4 KiB page of the data, so every chunk is bad */
	flip_a_byte_a_page(out, data_offset + 100, 4096);
	bads s = {0};
	arena_verify_options vo = {.bad_chunk = on_bad, .bad_chunk_ctx = &s};
	arena_verify_info vi;
	int rc = arena_verify(out, &vo, &vi);
	cr_assert_eq(rc, ARENA_E(IMG_CHUNK_CHECKSUM), "%s", arena_last_error());
	cr_assert_eq(vi.opened, 1);
	cr_assert_eq((uint64_t)s.n, vi.bad_chunks);
	cr_assert_geq(vi.bad_chunks, 2);
	cr_assert_eq(s.first_chunk, 0);
	cr_assert_str_eq(s.first_block, "globals");
	cr_assert_gt(s.first_tensors, 0);
	cr_assert(strstr(arena_last_error(), "chunk 0"), "%s", arena_last_error());
}

/* ---- arena_writer: the image arena_convert makes, from tensors in memory ---- */

#include "../../formats/safetensors.h"

/* The file's bytes from `from` on (NULL on error; *n its length). */
static uint8_t *read_from(const char *path, long from, size_t *n)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	long size = ftell(f);
	uint8_t *b = malloc(size > from ? (size_t)(size - from) : 1);
	fseek(f, from, SEEK_SET);
	*n = size > from ? fread(b, 1, (size_t)(size - from), f) : 0;
	fclose(f);
	return b;
}

/* Where an image's manifest ends (its header's manifest offset + length). */
static long manifest_end(const char *path)
{
	uint8_t page[48];
	FILE *f = fopen(path, "rb");
	cr_assert(f && fread(page, 1, sizeof(page), f) == sizeof(page));
	fclose(f);
	uint64_t off = 0, len = 0;
	for (int i = 7; i >= 0; i--)
		off = off << 8 | page[24 + i], len = len << 8 | page[32 + i];
	return (long)(off + len);
}

/* The fixture handed to a writer a block at a time in its order (each
 * block's tensors last to first), with `o`; the image compared with
 * arena_convert's past the manifest (chunk table and data), which must be
 * the same length. */
static void writer_as_convert(const arena_convert_options *o)
{
	const char *in = fixture_path("tiny_flux.safetensors");
	char conv[512], mine[512];
	snprintf(conv, sizeof(conv), "%s", tmpdir_file(dir, "convert.arena"));
	snprintf(mine, sizeof(mine), "%s", tmpdir_file(dir, "writer.arena"));
	unlink(conv), unlink(mine);
	cr_assert_eq(arena_convert(&in, 1, conv, o, NULL), 0, "%s", arena_last_error());
	arena_st_file *f;
	cr_assert_eq(arena_st_open(in, &f), 0, "%s", arena_last_error());
	size_t hn = 0;
	uint8_t *raw = read_from(in, 8, &hn);
	cr_assert(raw);
	char *header = strndup((const char *)raw, f->header_len);
	arena_writer *w;
	cr_assert_eq(arena_writer_open(mine, header, "mem", o, &w), 0, "%s", arena_last_error());
	cr_assert_eq(arena_writer_block_count(w), 6);
	cr_assert_str_eq(arena_writer_block_name(w, 0), "globals");
	size_t total = 0;
	for (size_t b = 0; b < arena_writer_block_count(w); b++) {
		size_t n = arena_writer_block_tensors(w, b);
		total += n;
		for (size_t k = n; k-- > 0;) {
			const arena_st_tensor *t = arena_st_find(f, arena_writer_tensor_name(w, b, k));
			cr_assert(t);
			cr_assert_eq(arena_writer_put(w, t->name, arena_st_data(t), t->nbytes), 0, "%s", arena_last_error());
		}
	}
	cr_assert_eq(total, 126);
	cr_assert_null(arena_writer_tensor_name(w, 6, 0));
	arena_convert_info ci;
	cr_assert_eq(arena_writer_finish(w, &ci), 0, "%s", arena_last_error());
	cr_assert_eq(ci.n_tensors, 126);
	arena_verify_info vi;
	cr_assert_eq(arena_verify(mine, NULL, &vi), 0, "%s", arena_last_error());
	long ea = manifest_end(conv), eb = manifest_end(mine);
	cr_assert_eq(ea, eb);
	size_t na, nb;
	uint8_t *a = read_from(conv, ea, &na), *bb = read_from(mine, eb, &nb);
	cr_assert_eq(na, nb);
	cr_assert(na > 0 && memcmp(a, bb, na) == 0, "chunk table and data as arena_convert's");
	free(a), free(bb), free(header), free(raw);
	arena_st_close(f);
}

Test(api_files, writer_is_convert)
{
	writer_as_convert(&(arena_convert_options){0});
	writer_as_convert(&(arena_convert_options){.chunk_size = 64 << 10, .threads = 3});
	writer_as_convert(&(arena_convert_options){.quant = "fp8-e4m3-row", .chunk_size = 64 << 10, .codec = "zstd"});
	writer_as_convert(&(arena_convert_options){.quant = "fp8-e4m3-tensor", .chunk_size = 64 << 10, .codec = "hb4"});
}

Test(api_files, writer_misuse)
{
	const char *out = tmpdir_file(dir, "w.arena");
	const char *hdr = "{\"a.0.w\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0,8]},"
			  "\"a.1.w\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[8,16]},"
			  "\"g\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[16,24]}}";
	arena_writer *w;
	arena_convert_options prog_set = {.progress = on_progress};
	cr_assert_eq(arena_writer_open(out, hdr, "mem", &prog_set, &w), ARENA_E_USAGE);
	cr_assert_eq(arena_writer_open(out, "{\"x\":1}", "mem", NULL, &w), ARENA_E(ST_TENSOR_NOT_OBJECT));
	cr_assert_eq(arena_writer_open(out, hdr, "mem", NULL, &w), 0, "%s", arena_last_error());
	uint8_t bytes[8] = {0};
	cr_assert_eq(arena_writer_put(w, "a.0.w", bytes, 8), ARENA_E_USAGE, "globals first");
	cr_assert(strstr(arena_last_error(), "'g' is not put yet"), "%s", arena_last_error());
	cr_assert_eq(arena_writer_put(w, "g", bytes, 8), ARENA_E_USAGE, "failed before");
	arena_writer_abort(w);
	cr_assert_not(exists(out));
	cr_assert_eq(arena_writer_open(out, hdr, "mem", NULL, &w), 0, "%s", arena_last_error());
	cr_assert_eq(arena_writer_put(w, "g", bytes, 4), ARENA_E_USAGE, "size");
	arena_writer_abort(w);
	cr_assert_eq(arena_writer_open(out, hdr, "mem", NULL, &w), 0, "%s", arena_last_error());
	cr_assert_eq(arena_writer_put(w, "g", bytes, 8), 0, "%s", arena_last_error());
	cr_assert_eq(arena_writer_finish(w, NULL), ARENA_E_USAGE, "a block missing");
	cr_assert_not(exists(out));
	cr_assert_eq(arena_writer_open(out, hdr, "mem", NULL, &w), 0, "%s", arena_last_error());
	cr_assert_eq(arena_writer_put(w, "g", bytes, 8), 0);
	cr_assert_eq(arena_writer_put(w, "a.0.w", bytes, 8), 0);
	cr_assert_eq(arena_writer_put(w, "a.1.w", bytes, 8), 0);
	cr_assert_eq(arena_writer_finish(w, NULL), 0, "%s", arena_last_error());
	cr_assert(exists(out));
	cr_assert_eq(arena_writer_open(out, hdr, "mem", NULL, &w), ARENA_E(OUTPUT_EXISTS));
}
