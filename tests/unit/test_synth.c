/* test_synth.c - the safetensors writer (formats/st_write) and synthetic
 * checkpoints (convert/synth): byte-identical rewrites of the reference
 * fixtures, writer misuse and injected failures, layouts against the files
 * diffusers and transformers wrote (fixtures/), parameter counts of the
 * full-size layouts, the value stream's determinism and distribution, and
 * reading the output back. */
#include <criterion/criterion.h>

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "arena.h"
#include "../../common/alloc.h"
#include "../../common/err.h"
#include "../../common/outfile.h"
#include "../../formats/checkpoint.h"
#include "../../formats/safetensors.h"
#include "../../formats/st_write.h"
#include "../../convert/synth.h"
#include "testutil.h"

/* A fresh folder per test (Criterion runs each test in its own process). */
static char tmp_dir[1024];

static void make_tmp(void)
{
	tmpdir_make(tmp_dir, sizeof(tmp_dir), "test-synth");
}

static void remove_tmp(void)
{
	arena_fault_alloc(0);
	arena_fault_write(0);
	tmpdir_remove(tmp_dir);
}

static uint8_t *read_all(const char *path, size_t *len)
{
	FILE *fp = fopen(path, "rb");
	cr_assert_not_null(fp, "%s: %s", path, strerror(errno));
	fseek(fp, 0, SEEK_END);
	long n = ftell(fp);
	rewind(fp);
	uint8_t *b = malloc((size_t)n + 1);
	cr_assert_not_null(b);
	cr_assert_eq(fread(b, 1, (size_t)n, fp), (size_t)n);
	fclose(fp);
	*len = (size_t)n;
	return b;
}

static void assert_same_file(const char *a, const char *b)
{
	size_t la, lb;
	uint8_t *x = read_all(a, &la), *y = read_all(b, &lb);
	cr_assert_eq(la, lb, "%s is %zu bytes, %s is %zu", a, la, b, lb);
	size_t i = 0;
	while (i < la && x[i] == y[i])
		i++;
	cr_assert_eq(i, la, "%s and %s differ at byte %zu", a, b, i);
	free(x);
	free(y);
}

/* ---------------------------------------------------------------- writer */

TestSuite(st_write, .init = make_tmp, .fini = remove_tmp);

/* Declare every tensor of `in` (in reverse name order, to show that the
 * writer orders them), then write each tensor's bytes in the writer's order. */
static int rewrite(const arena_st_file *in, const char *out)
{
	arena_stw *w;
	int rc = arena_stw_create(out, &w);
	if (rc)
		return rc;
	for (size_t i = 0; !rc && i < in->n_meta; i++)
		rc = arena_stw_meta(w, in->meta_keys[i], in->meta_vals[i]);
	for (size_t i = in->n_tensors; !rc && i-- > 0;) {
		const arena_st_tensor *t = &in->tensors[i];
		rc = arena_stw_add(w, t->name, t->dtype, t->rank, t->shape);
	}
	rc = rc ? rc : arena_stw_begin(w);
	for (size_t i = 0; !rc && i < arena_stw_count(w); i++) {
		const arena_stw_tensor *s = arena_stw_get(w, i);
		const arena_st_tensor *t = arena_st_find(in, s->name);
		cr_assert_not_null(t);
		cr_assert_eq(s->nbytes, t->nbytes, "%s", s->name);
		rc = arena_stw_write(w, arena_st_data(t), (size_t)t->nbytes);
	}
	if (rc) {
		arena_stw_abort(w);
		return rc;
	}
	return arena_stw_commit(w);
}

/* The reference library's writer made these files; ours must make the same
 * bytes from the same tensors and metadata: header JSON, key order (metadata,
 * then tensors by dtype alignment and name), padding, data order. */
Test(st_write, reference_fixtures_byte_identical)
{
	const char *names[] = {"tiny_flux.safetensors", "dtypes.safetensors", "quant_reference.safetensors"};
	for (size_t k = 0; k < sizeof(names) / sizeof(names[0]); k++) {
		arena_st_file *in;
		cr_assert_eq(arena_st_open(fixture_path(names[k]), &in), 0, "%s", arena_last_error());
		const char *out = tmpdir_file(tmp_dir, names[k]);
		cr_assert_eq(rewrite(in, out), 0, "%s: %s", names[k], arena_last_error());
		assert_same_file(fixture_path(names[k]), out);
		arena_st_close(in);
	}
}

/* Names and metadata that need escapes, against the bytes safetensors 0.8
 * wrote for the same dict (save_file from numpy, metadata {"a": "b",
 * "k\"\n\x02": "v\\\u00e9\x7f"}; its metadata order taken as given). */
Test(st_write, escapes_match_reference)
{
	static const char want[] =
		"{\"__metadata__\":{\"a\":\"b\",\"k\\\"\\n\\u0002\":\"v\\\\\xc3"
		"\xa9"
		"\x7f"
		"\"},\"plain\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]},\"q\\\"b\\\\s\\n\\u0001\\u001f\x7f"
		"\xc3"
		"\xbc"
		"/\\t\\r\\b\\f\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[12,24]},\"\xe2"
		"\x9c"
		"\x93"
		" ok\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[24,36]}}  ";
	const char *names[] = {"q\"b\\s\n\x01\x1f\x7f\xc3\xbc/\t\r\b\f", "plain", "\xe2\x9c\x93 ok"};
	arena_stw *w;
	uint64_t s3[] = {3};
	cr_assert_eq(arena_stw_create(tmpdir_file(tmp_dir, "esc.st"), &w), 0);
	cr_assert_eq(arena_stw_meta(w, "a", "b"), 0);
	cr_assert_eq(arena_stw_meta(w, "k\"\n\x02", "v\\\xc3\xa9\x7f"), 0);
	for (int i = 0; i < 3; i++)
		cr_assert_eq(arena_stw_add(w, names[i], ARENA_DTYPE_F32, 1, s3), 0);
	cr_assert_eq(arena_stw_begin(w), 0);
	cr_assert_eq(arena_stw_data_offset(w), 8 + 256);
	float v[9] = {0};
	cr_assert_eq(arena_stw_write(w, v, sizeof(v)), 0);
	cr_assert_eq(arena_stw_commit(w), 0);
	size_t n;
	uint8_t *b = read_all(tmpdir_file(tmp_dir, "esc.st"), &n);
	cr_assert_eq(n, 8 + 256 + 36);
	cr_assert_eq(b[0], 0);
	cr_assert_eq(b[1], 1);
	cr_assert_eq(memcmp(b + 8, want, 256), 0, "header:\n%.256s\nwant:\n%.256s", (const char *)b + 8, want);
	free(b);
}

/* Positioned writes, from 4 threads, tensors in reverse order: the same file
 * as the reference. */
typedef struct pw_job {
	arena_stw *w;
	const arena_st_file *in;
	unsigned id;
	int rc;
} pw_job;

static void *pw_thread(void *arg)
{
	pw_job *j = arg;
	for (size_t i = arena_stw_count(j->w); i-- > 0;) {
		if (i % 4 != j->id)
			continue;
		const arena_stw_tensor *s = arena_stw_get(j->w, i);
		const arena_st_tensor *t = arena_st_find(j->in, s->name);
		if ((j->rc = arena_stw_pwrite(j->w, s->begin, arena_st_data(t), (size_t)t->nbytes)))
			break;
	}
	return NULL;
}

Test(st_write, positioned_writes_from_threads)
{
	arena_st_file *in;
	cr_assert_eq(arena_st_open(fixture_path("tiny_flux.safetensors"), &in), 0);
	arena_stw *w;
	cr_assert_eq(arena_stw_create(tmpdir_file(tmp_dir, "p.st"), &w), 0);
	for (size_t i = 0; i < in->n_meta; i++)
		cr_assert_eq(arena_stw_meta(w, in->meta_keys[i], in->meta_vals[i]), 0);
	for (size_t i = 0; i < in->n_tensors; i++)
		cr_assert_eq(arena_stw_add(w, in->tensors[i].name, in->tensors[i].dtype, in->tensors[i].rank,
					   in->tensors[i].shape), 0);
	cr_assert_eq(arena_stw_begin(w), 0);
	pthread_t th[4];
	pw_job jobs[4];
	for (unsigned k = 0; k < 4; k++) {
		jobs[k] = (pw_job){w, in, k, 0};
		cr_assert_eq(pthread_create(&th[k], NULL, pw_thread, &jobs[k]), 0);
	}
	for (unsigned k = 0; k < 4; k++) {
		pthread_join(th[k], NULL);
		cr_assert_eq(jobs[k].rc, 0);
	}
	cr_assert_eq(arena_stw_written(w), arena_stw_data_size(w));
	uint8_t b[4] = {0};
	cr_assert_eq(arena_stw_write(w, b, 0), ARENA_E_USAGE); /* no mixing with appends */
	cr_assert_eq(arena_stw_commit(w), 0, "%s", arena_last_error());
	assert_same_file(fixture_path("tiny_flux.safetensors"), tmpdir_file(tmp_dir, "p.st"));
	arena_st_close(in);

	uint64_t s2[] = {2};
	cr_assert_eq(arena_stw_create(tmpdir_file(tmp_dir, "q.st"), &w), 0);
	cr_assert_eq(arena_stw_add(w, "x", ARENA_DTYPE_F32, 1, s2), 0);
	cr_assert_eq(arena_stw_begin(w), 0);
	cr_assert_eq(arena_stw_pwrite(w, 4, b, 4), 0);
	cr_assert_eq(arena_stw_commit(w), ARENA_E_USAGE); /* 4 of 8 */
	cr_assert(strstr(arena_last_error(), "incomplete: 4 of 8"), "%s", arena_last_error());
	cr_assert_eq(arena_stw_create(tmpdir_file(tmp_dir, "q.st"), &w), 0);
	cr_assert_eq(arena_stw_add(w, "x", ARENA_DTYPE_F32, 1, s2), 0);
	cr_assert_eq(arena_stw_begin(w), 0);
	cr_assert_eq(arena_stw_pwrite(w, 6, b, 4), ARENA_E_USAGE); /* past the end */
	arena_stw_abort(w);
	cr_assert_eq(dir_entries(tmp_dir), 1); /* p.st */
}

Test(st_write, empty_file_matches_reference)
{
	/* safetensors serialize({}) is "{}" padded to 8: [8, 0 x7] "{}      " */
	arena_stw *w;
	cr_assert_eq(arena_stw_create(tmpdir_file(tmp_dir, "e.st"), &w), 0);
	cr_assert_eq(arena_stw_commit(w), 0, "%s", arena_last_error());
	size_t n;
	uint8_t *b = read_all(tmpdir_file(tmp_dir, "e.st"), &n);
	cr_assert_eq(n, 16);
	cr_assert_eq(memcmp(b, "\x08\0\0\0\0\0\0\0{}      ", 16), 0);
	free(b);
}

Test(st_write, data_order_is_dtype_alignment_then_name)
{
	arena_stw *w;
	cr_assert_eq(arena_stw_create(tmpdir_file(tmp_dir, "o.st"), &w), 0);
	uint64_t s3[] = {3}, s16[] = {16};
	cr_assert_eq(arena_stw_add(w, "a_u8", ARENA_DTYPE_U8, 1, s3), 0);
	cr_assert_eq(arena_stw_add(w, "b_f32", ARENA_DTYPE_F32, 1, s3), 0);
	cr_assert_eq(arena_stw_add(w, "a_f32", ARENA_DTYPE_F32, 1, s3), 0);
	cr_assert_eq(arena_stw_add(w, "c_f4", ARENA_DTYPE_F4, 1, s16), 0);
	cr_assert_eq(arena_stw_add(w, "d_bf16", ARENA_DTYPE_BF16, 1, s3), 0);
	cr_assert_eq(arena_stw_add(w, "scalar", ARENA_DTYPE_F64, 0, NULL), 0);
	cr_assert_eq(arena_stw_begin(w), 0);
	const char *want[] = {"scalar", "a_f32", "b_f32", "d_bf16", "a_u8", "c_f4"};
	for (size_t i = 0; i < 6; i++) {
		const arena_stw_tensor *t = arena_stw_get(w, i);
		cr_assert_str_eq(t->name, want[i]);
		cr_assert_eq(t->begin % (arena_dtype_bits(t->dtype) >= 8 ? arena_dtype_bits(t->dtype) / 8 : 1), 0);
	}
	cr_assert_null(arena_stw_get(w, 6));
	cr_assert_eq(arena_stw_data_size(w), 8 + 12 + 12 + 6 + 3 + 8);
	cr_assert_eq(arena_stw_data_offset(w) % 8, 0);
	uint8_t zeros[64] = {0};
	cr_assert_eq(arena_stw_write(w, zeros, 10), 0);
	cr_assert_eq(arena_stw_write(w, zeros, 39), 0);
	cr_assert_eq(arena_stw_written(w), 49);
	cr_assert_eq(arena_stw_commit(w), 0, "%s", arena_last_error());
	arena_st_file *f;
	cr_assert_eq(arena_st_open(tmpdir_file(tmp_dir, "o.st"), &f), 0, "%s", arena_last_error());
	cr_assert_eq(f->n_tensors, 6);
	cr_assert_eq(arena_st_find(f, "c_f4")->nbytes, 8);
	cr_assert_eq(arena_st_find(f, "scalar")->rank, 0);
	arena_st_close(f);
}

Test(st_write, misuse_is_an_error_and_leaves_nothing)
{
	arena_stw *w;
	uint64_t s2[] = {2}, s3[] = {3}, huge[] = {1ull << 40, 1ull << 40};
	uint8_t b[16] = {0};
	cr_assert_eq(arena_stw_create(tmpdir_file(tmp_dir, "m.st"), &w), 0);
	cr_assert_eq(arena_stw_add(w, "x", ARENA_DTYPE_F32, 1, s2), 0);
	cr_assert_eq(arena_stw_add(w, "x", ARENA_DTYPE_F16, 1, s2), ARENA_E(DUPLICATE_TENSOR));
	cr_assert(strstr(arena_last_error(), "'x' declared twice"), "%s", arena_last_error());
	cr_assert_eq(arena_stw_add(w, "__metadata__", ARENA_DTYPE_F16, 1, s2), ARENA_E_USAGE);
	cr_assert_eq(arena_stw_add(w, "bad\xff", ARENA_DTYPE_F16, 1, s2), ARENA_E_USAGE);
	cr_assert_eq(arena_stw_add(w, "big", ARENA_DTYPE_F32, 2, huge), ARENA_E(ST_SIZE_OVERFLOW));
	cr_assert_eq(arena_stw_add(w, "odd_f4", ARENA_DTYPE_F4, 1, s3), ARENA_E(ST_PARTIAL_BYTES));
	cr_assert_eq(arena_stw_meta(w, "k", "v"), 0);
	cr_assert_eq(arena_stw_meta(w, "k", "w"), ARENA_E_USAGE);
	cr_assert_eq(arena_stw_write(w, b, 1), ARENA_E_USAGE); /* before begin */
	cr_assert_eq(arena_stw_begin(w), 0);
	cr_assert_eq(arena_stw_add(w, "y", ARENA_DTYPE_F32, 1, s2), ARENA_E_USAGE); /* after begin */
	cr_assert_eq(arena_stw_write(w, b, 4), 0);
	cr_assert_eq(arena_stw_commit(w), ARENA_E_USAGE); /* 4 of 8 bytes */
	cr_assert(strstr(arena_last_error(), "tensor 'x' incomplete: 4 of 8"), "%s", arena_last_error());
	cr_assert_eq(dir_entries(tmp_dir), 0);

	cr_assert_eq(arena_stw_create(tmpdir_file(tmp_dir, "m.st"), &w), 0);
	cr_assert_eq(arena_stw_add(w, "x", ARENA_DTYPE_F32, 1, s2), 0);
	cr_assert_eq(arena_stw_begin(w), 0);
	cr_assert_eq(arena_stw_write(w, b, 9), ARENA_E_USAGE); /* past the end */
	cr_assert_eq(arena_stw_write(w, b, 1), ARENA_E_USAGE); /* broken since */
	cr_assert_eq(arena_stw_commit(w), ARENA_E_USAGE);
	cr_assert_eq(dir_entries(tmp_dir), 0);

	cr_assert_eq(arena_stw_create(tmpdir_file(tmp_dir, "m.st"), &w), 0);
	arena_stw_abort(w);
	arena_stw_abort(NULL);
	cr_assert_eq(dir_entries(tmp_dir), 0);
	cr_assert_eq(arena_stw_create("/nonexistent-folder/x.st", &w), ARENA_E_NOT_FOUND);
	cr_assert_null(w);
}

/* One run with allocation n failing: either NOMEM with nothing left in the
 * folder, or (a failure something below absorbed) the whole, right file.
 * Returns whether the injected failure fired. */
static int check_alloc_fault(long n, int rc, const char *out, const char *want)
{
	int fired = arena_fault_alloc_fired();
	arena_fault_alloc(0);
	if (rc == 0) {
		assert_same_file(want, out);
		unlink(out);
	} else {
		cr_assert(fired, "rc %d without an injected failure: %s", rc, arena_last_error());
		cr_assert_eq(rc, ARENA_E_NOMEM, "allocation %ld: rc %d: %s", n, rc, arena_last_error());
	}
	cr_assert_eq(dir_entries(tmp_dir), 0, "allocation %ld left a file", n);
	return fired;
}

/* Allocation N fails, N = 1, 2, ..., until a run makes no more allocations. */
Test(st_write, alloc_faults)
{
	arena_st_file *in;
	cr_assert_eq(arena_st_open(fixture_path("tiny_flux.safetensors"), &in), 0);
	long n;
	for (n = 1; n < 100000; n++) {
		arena_fault_alloc(n);
		int rc = rewrite(in, tmpdir_file(tmp_dir, "f.st"));
		if (!check_alloc_fault(n, rc, tmpdir_file(tmp_dir, "f.st"), fixture_path("tiny_flux.safetensors")))
			break;
	}
	cr_assert_gt(n, 10);
	arena_st_close(in);
}

Test(st_write, write_faults)
{
	arena_st_file *in;
	cr_assert_eq(arena_st_open(fixture_path("tiny_flux.safetensors"), &in), 0);
	for (long n = 1; n <= 2; n++) { /* the header write, then the data */
		arena_fault_write(n);
		cr_assert_eq(rewrite(in, tmpdir_file(tmp_dir, "f.st")), ARENA_E_IO, "write %ld", n);
		cr_assert(strstr(arena_last_error(), "No space left"), "%s", arena_last_error());
		cr_assert_eq(dir_entries(tmp_dir), 0);
	}
	arena_fault_write(0);
	arena_st_close(in);
}

/* ---------------------------------------------------------------- layouts */

TestSuite(synth, .init = make_tmp, .fini = remove_tmp);

static const arena_synth_tensor *list_find(const arena_synth_list *l, const char *name)
{
	for (size_t i = 0; i < l->n; i++)
		if (strcmp(l->t[i].name, name) == 0)
			return &l->t[i];
	return NULL;
}

/* Same names and shapes, both ways. */
static void assert_list_matches(const arena_synth_list *l, const arena_st_tensor *const *ts, size_t n,
				const char *what)
{
	cr_assert_eq(l->n, n, "%s: %zu tensors generated, %zu in the reference", what, l->n, n);
	for (size_t i = 0; i < n; i++) {
		const arena_synth_tensor *s = list_find(l, ts[i]->name);
		cr_assert_not_null(s, "%s: '%s' not generated", what, ts[i]->name);
		cr_assert_eq(s->rank, ts[i]->rank, "%s: %s rank", what, ts[i]->name);
		for (uint32_t k = 0; k < s->rank; k++)
			cr_assert_eq(s->shape[k], ts[i]->shape[k], "%s: %s dim %u: %llu, reference %llu", what,
				     ts[i]->name, k, (unsigned long long)s->shape[k],
				     (unsigned long long)ts[i]->shape[k]);
	}
}

Test(synth, flux_tiny_matches_reference_fixture)
{
	arena_ckpt *c;
	cr_assert_eq(arena_ckpt_open(fixture_path("tiny_flux.safetensors"), &c), 0, "%s", arena_last_error());
	arena_synth_list l = {0};
	cr_assert_eq(arena_synth_layout_make("flux-tiny", -1, &l), 0);
	assert_list_matches(&l, c->tensors, c->n_tensors, "flux-tiny");

	/* And the file written: same names, dtypes (BF16), shapes, data size. */
	arena_synth_opts o = {.layout = "flux-tiny", .dtype = ARENA_DTYPE_BF16, .seed = 1, .threads = 2};
	cr_assert_eq(arena_synth_write(tmpdir_file(tmp_dir, "t.st"), &l, &o), 0, "%s", arena_last_error());
	arena_ckpt *s;
	cr_assert_eq(arena_ckpt_open(tmpdir_file(tmp_dir, "t.st"), &s), 0, "%s", arena_last_error());
	cr_assert_eq(s->n_tensors, c->n_tensors);
	for (size_t i = 0; i < c->n_tensors; i++) {
		cr_assert_str_eq(s->tensors[i]->name, c->tensors[i]->name);
		cr_assert_eq(s->tensors[i]->dtype, c->tensors[i]->dtype);
		cr_assert_eq(s->tensors[i]->nbytes, c->tensors[i]->nbytes);
		cr_assert_eq(s->tensors[i]->begin, c->tensors[i]->begin, "%s", c->tensors[i]->name);
	}
	arena_ckpt_close(s);
	arena_ckpt_close(c);
	arena_synth_list_release(&l);
}

Test(synth, llama_tiny_matches_reference_fixture)
{
	arena_ckpt *c;
	cr_assert_eq(arena_ckpt_open(fixture_path("tiny_llama_sharded"), &c), 0, "%s", arena_last_error());
	arena_synth_list l = {0};
	cr_assert_eq(arena_synth_layout_make("llama-tiny", -1, &l), 0);
	assert_list_matches(&l, c->tensors, c->n_tensors, "llama-tiny");
	arena_ckpt_close(c);
	arena_synth_list_release(&l);
}

static uint64_t layout_params(const char *name, long blocks, size_t *n_tensors)
{
	arena_synth_list l = {0};
	cr_assert_eq(arena_synth_layout_make(name, blocks, &l), 0, "%s", arena_last_error());
	uint64_t p = arena_synth_params(&l);
	if (n_tensors)
		*n_tensors = l.n;
	arena_synth_list_release(&l);
	return p;
}

Test(synth, flux_dev_parameter_count)
{
	size_t n;
	uint64_t p = layout_params("flux-dev", -1, &n);
	cr_assert_eq(p, 11901408320ull, "flux-dev: %llu parameters (%zu tensors)", (unsigned long long)p, n);
	/* 10 global linears with biases; per double block 14 linears and 4
	 * norms; per single block 6 linears and 2 norms. */
	cr_assert_eq(n, 10 * 2 + 19 * (14 * 2 + 4) + 38 * (6 * 2 + 2));
	/* Each double block has 339,831,296 parameters, each single 141,591,808. */
	cr_assert_eq(layout_params("flux-dev", 1, NULL), p - 18 * 339831296ull - 37 * 141591808ull);
	cr_assert_eq(layout_params("flux-dev", 0, NULL), 64124992ull);
}

Test(synth, llama_8b_parameter_count)
{
	size_t n;
	uint64_t p = layout_params("llama-8b", -1, &n);
	cr_assert_eq(p, 8030261248ull, "llama-8b: %llu parameters (%zu tensors)", (unsigned long long)p, n);
	cr_assert_eq(n, 3 + 32 * 9);
	arena_synth_list l = {0};
	cr_assert_eq(arena_synth_layout_make("llama-8b", 2, &l), 0);
	const arena_synth_tensor *k = list_find(&l, "model.layers.1.self_attn.k_proj.weight");
	cr_assert_not_null(k);
	cr_assert(k->rank == 2 && k->shape[0] == 1024 && k->shape[1] == 4096);
	cr_assert_null(list_find(&l, "model.layers.2.self_attn.k_proj.weight"));
	cr_assert_not_null(list_find(&l, "lm_head.weight"));
	cr_assert_null(list_find(&l, "model.layers.0.self_attn.q_proj.bias"));
	arena_synth_list_release(&l);
}

Test(synth, blocks_keep_the_first_of_each_container)
{
	arena_synth_list l = {0};
	cr_assert_eq(arena_synth_layout_make("flux-dev", 2, &l), 0);
	cr_assert_not_null(list_find(&l, "transformer_blocks.1.attn.to_add_out.weight"));
	cr_assert_null(list_find(&l, "transformer_blocks.2.attn.to_add_out.weight"));
	cr_assert_not_null(list_find(&l, "single_transformer_blocks.1.proj_out.weight"));
	cr_assert_null(list_find(&l, "single_transformer_blocks.2.proj_out.weight"));
	const arena_synth_tensor *t = list_find(&l, "single_transformer_blocks.0.proj_out.weight");
	cr_assert(t->shape[0] == 3072 && t->shape[1] == 15360);
	t = list_find(&l, "transformer_blocks.0.attn.norm_added_k.weight");
	cr_assert(t->rank == 1 && t->shape[0] == 128);
	arena_synth_list_release(&l);
	cr_assert_eq(arena_synth_layout_make("no-such", -1, &l), ARENA_E_USAGE);
	cr_assert(strstr(arena_last_error(), "unknown layout 'no-such' (known: flux-dev"), "%s", arena_last_error());
	arena_synth_list_release(&l);
}

/* ---------------------------------------------------------------- values */

Test(synth, half_float_conversions_round_to_nearest_even)
{
	const struct {
		float f;
		uint16_t h, b;
	} cases[] = {
		{0.0f, 0x0000, 0x0000},
		{-0.0f, 0x8000, 0x8000},
		{1.0f, 0x3c00, 0x3f80},
		{-2.0f, 0xc000, 0xc000},
		{65504.0f, 0x7bff, 0x4780},            /* bf16: 0x477fe000 rounds up */
		{65520.0f, 0x7c00, 0x4780},            /* f16: halfway to 65536 rounds to even: inf */
		{0x1p-24f, 0x0001, 0x3380},            /* smallest f16 subnormal */
		{0x1p-25f, 0x0000, 0x3300},            /* f16: tie between 0 and 2^-24: even */
		{0x1.8p-25f, 0x0001, 0x3340},
		{0x1p-14f, 0x0400, 0x3880},            /* smallest f16 normal */
		{0x1.ffcp-15f, 0x0400, 0x3880},        /* rounds up into the normals */
		{0x1.002p0f, 0x3c00, 0x3f80},          /* f16: tie, even (down) */
		{0x1.006p0f, 0x3c02, 0x3f80},          /* f16: tie, even (up) */
		{0x1.01p0f, 0x3c04, 0x3f80},           /* bf16: tie, even (down) */
		{0x1.03p0f, 0x3c0c, 0x3f82},           /* bf16: tie, even (up) */
		{0.02f, 0x251f, 0x3ca4},
		{INFINITY, 0x7c00, 0x7f80},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		cr_assert_eq(arena_f32_to_f16(cases[i].f), cases[i].h, "f16(%a) = %04x, want %04x", (double)cases[i].f,
			     arena_f32_to_f16(cases[i].f), cases[i].h);
		cr_assert_eq(arena_f32_to_bf16(cases[i].f), cases[i].b, "bf16(%a) = %04x, want %04x",
			     (double)cases[i].f, arena_f32_to_bf16(cases[i].f), cases[i].b);
	}
	cr_assert_eq(arena_f32_to_f16(NAN) & 0x7e00, 0x7e00);
	cr_assert_eq(arena_f32_to_bf16(NAN) & 0x7fc0, 0x7fc0);
}

/* The f32 stream: moments and the normal's mass within 1, 2, 3, 4 sigma. */
Test(synth, values_are_normal_with_std_0_02)
{
	const uint64_t n = 1 << 22;
	uint64_t key = arena_synth_key(0, "x.weight");
	double s1 = 0, s2 = 0, s4 = 0;
	uint64_t within[5] = {0};
	for (uint64_t i = 0; i < n; i++) {
		double v = arena_synth_value(key, i);
		s1 += v, s2 += v * v, s4 += v * v * v * v;
		double z = fabs(v) / 0.02;
		for (int k = 1; k <= 4; k++)
			within[k] += z < k;
	}
	double mean = s1 / n, var = s2 / n - mean * mean, kurt = s4 / n / (var * var);
	cr_assert_lt(fabs(mean), 0.02 * 5 / sqrt((double)n), "mean %.3g", mean); /* 5 standard errors */
	cr_assert_lt(fabs(sqrt(var) - 0.02), 0.02 * 0.002, "std %.6f", sqrt(var));
	cr_assert_lt(fabs(kurt - 3), 0.03, "kurtosis %.3f", kurt);
	const double mass[5] = {0, 0.682689, 0.954500, 0.997300, 0.999937};
	for (int k = 1; k <= 4; k++)
		cr_assert_lt(fabs((double)within[k] / n - mass[k]), 0.001, "within %d sigma: %.6f of the values, want %.6f", k,
			     (double)within[k] / n, mass[k]);
}

Test(synth, values_depend_on_seed_and_name_only)
{
	uint64_t a = arena_synth_key(7, "a.weight"), b = arena_synth_key(7, "b.weight"), c = arena_synth_key(8, "a.weight");
	cr_assert_neq(a, b);
	cr_assert_neq(a, c);
	float x[64], y[64];
	cr_assert_eq(arena_synth_fill(x, ARENA_DTYPE_F32, a, 0, 64), 0);
	/* Any split of the range gives the same values, odd starts included. */
	cr_assert_eq(arena_synth_fill(y, ARENA_DTYPE_F32, a, 0, 3), 0);
	cr_assert_eq(arena_synth_fill(y + 3, ARENA_DTYPE_F32, a, 3, 1), 0);
	cr_assert_eq(arena_synth_fill(y + 4, ARENA_DTYPE_F32, a, 4, 60), 0);
	cr_assert_eq(memcmp(x, y, sizeof(x)), 0);
	for (int i = 0; i < 64; i++)
		cr_assert_eq(x[i], arena_synth_value(a, (uint64_t)i));
	/* The 16-bit outputs are the f32 values rounded. */
	uint16_t h[64], bf[64];
	cr_assert_eq(arena_synth_fill(h, ARENA_DTYPE_F16, a, 0, 64), 0);
	cr_assert_eq(arena_synth_fill(bf, ARENA_DTYPE_BF16, a, 0, 64), 0);
	for (int i = 0; i < 64; i++) {
		cr_assert_eq(h[i], arena_f32_to_f16(x[i]));
		cr_assert_eq(bf[i], arena_f32_to_bf16(x[i]));
	}
	cr_assert_eq(arena_synth_fill(h, ARENA_DTYPE_I8, a, 0, 1), ARENA_E_USAGE);
}

/* A list with odd sizes, spanning several 4 MiB pieces, tensors straddling
 * piece boundaries and starting at odd elements. */
static void odd_list(arena_synth_list *l)
{
	const struct {
		const char *name;
		uint32_t rank;
		uint64_t d0, d1;
	} t[] = {
		{"a.bias", 1, 3, 0},        {"a.weight", 2, 1001, 2047}, {"b.norm", 1, 1, 0},
		{"b.weight", 2, 3000, 999}, {"c.empty", 2, 0, 5},        {"d.weight", 2, 777, 4095},
		{"e.scalar", 0, 0, 0},
	};
	memset(l, 0, sizeof(*l));
	l->n = l->cap = sizeof(t) / sizeof(t[0]);
	l->t = arena_calloc(l->n, sizeof(*l->t));
	cr_assert_not_null(l->t);
	for (size_t i = 0; i < l->n; i++) {
		snprintf(l->t[i].name, sizeof(l->t[i].name), "%s", t[i].name);
		l->t[i].rank = t[i].rank;
		l->t[i].shape[0] = t[i].d0;
		l->t[i].shape[1] = t[i].d1;
	}
}

Test(synth, same_bytes_whatever_the_thread_count)
{
	arena_synth_list l;
	odd_list(&l);
	const unsigned threads[] = {1, 2, 3, 8};
	for (int d = 0; d < 3; d++) {
		arena_dtype dt = d == 0 ? ARENA_DTYPE_BF16 : d == 1 ? ARENA_DTYPE_F16 : ARENA_DTYPE_F32;
		for (size_t k = 0; k < 4; k++) {
			arena_synth_opts o = {.layout = "odd", .dtype = dt, .seed = 42, .threads = threads[k], .force = 1};
			char name[32];
			snprintf(name, sizeof(name), "t%u.st", threads[k]);
			cr_assert_eq(arena_synth_write(tmpdir_file(tmp_dir, name), &l, &o), 0, "%s", arena_last_error());
			if (k)
				assert_same_file(tmpdir_file(tmp_dir, "t1.st"), tmpdir_file(tmp_dir, name));
		}
		/* Every tensor holds its own stream, computed here element by element. */
		arena_st_file *f;
		cr_assert_eq(arena_st_open(tmpdir_file(tmp_dir, "t1.st"), &f), 0, "%s", arena_last_error());
		cr_assert_gt(f->size, 3 * (4u << 20));
		for (size_t i = 0; i < f->n_tensors; i++) {
			const arena_st_tensor *t = &f->tensors[i];
			cr_assert_eq(t->dtype, dt);
			uint64_t key = arena_synth_key(42, t->name);
			const uint8_t *p = arena_st_data(t);
			for (uint64_t e = 0; e < t->nelem; e += 1 + e / 7) {
				float v = arena_synth_value(key, e);
				if (dt == ARENA_DTYPE_F32) {
					float got;
					memcpy(&got, p + 4 * e, 4);
					cr_assert_eq(got, v, "%s[%llu]", t->name, (unsigned long long)e);
				} else {
					uint16_t got, want = dt == ARENA_DTYPE_F16 ? arena_f32_to_f16(v) : arena_f32_to_bf16(v);
					memcpy(&got, p + 2 * e, 2);
					cr_assert_eq(got, want, "%s[%llu]", t->name, (unsigned long long)e);
				}
			}
		}
		arena_st_close(f);
	}
	arena_synth_list_release(&l);
}

/* Cancels at its first call (there is always one, at the end). */
static int cancel_at_once(void *ctx, uint64_t done, uint64_t total)
{
	int *calls = ctx;
	cr_assert_leq(done, total);
	++*calls;
	return arena_errorf(ARENA_E_CANCELLED, "cancelled");
}

static int count_calls(void *ctx, uint64_t done, uint64_t total)
{
	uint64_t *last = ctx;
	cr_assert_leq(done, total);
	cr_assert_geq(done, last[0]);
	last[0] = done;
	last[1] = total;
	return 0;
}

Test(synth, cancel_and_write_failure_leave_nothing)
{
	arena_synth_list l;
	odd_list(&l);
	int calls = 0;
	arena_synth_opts o = {.layout = "odd", .dtype = ARENA_DTYPE_F32, .threads = 3,
			      .progress = cancel_at_once, .progress_ctx = &calls};
	cr_assert_eq(arena_synth_write(tmpdir_file(tmp_dir, "c.st"), &l, &o), ARENA_E_CANCELLED);
	cr_assert_eq(calls, 1);
	cr_assert_eq(dir_entries(tmp_dir), 0);
	uint64_t last[2] = {0, 1};
	o.progress = count_calls;
	o.progress_ctx = last;
	cr_assert_eq(arena_synth_write(tmpdir_file(tmp_dir, "c.st"), &l, &o), 0, "%s", arena_last_error());
	cr_assert(last[0] == last[1] && last[1] > 3 * (4u << 20), "last progress %llu of %llu",
		  (unsigned long long)last[0], (unsigned long long)last[1]);
	unlink(tmpdir_file(tmp_dir, "c.st"));
	o.progress = NULL;
	arena_fault_write(3);
	cr_assert_eq(arena_synth_write(tmpdir_file(tmp_dir, "c.st"), &l, &o), ARENA_E_IO);
	arena_fault_write(0);
	cr_assert_eq(dir_entries(tmp_dir), 0);
	o.dtype = ARENA_DTYPE_I32;
	cr_assert_eq(arena_synth_write(tmpdir_file(tmp_dir, "c.st"), &l, &o), ARENA_E_USAGE);
	cr_assert_eq(dir_entries(tmp_dir), 0);
	arena_synth_list_release(&l);
}

Test(synth, alloc_faults)
{
	arena_synth_list l = {0};
	cr_assert_eq(arena_synth_layout_make("flux-tiny", 1, &l), 0);
	arena_synth_opts o = {.layout = "flux-tiny", .dtype = ARENA_DTYPE_BF16, .threads = 2};
	char want[4096];
	snprintf(want, sizeof(want), "%s.want", tmp_dir); /* beside the folder, which must stay empty */
	cr_assert_eq(arena_synth_write(want, &l, &o), 0, "%s", arena_last_error());
	long n;
	for (n = 1; n < 100000; n++) {
		arena_fault_alloc(n);
		int rc = arena_synth_write(tmpdir_file(tmp_dir, "a.st"), &l, &o);
		if (!check_alloc_fault(n, rc, tmpdir_file(tmp_dir, "a.st"), want))
			break;
	}
	unlink(want);
	cr_assert_gt(n, 10);
	arena_synth_list_release(&l);
}

/* flux-dev --blocks 0 (its 20 global tensors, 122 MiB) written and read
 * back: metadata, shapes, and the values of the largest tensor have mean 0
 * and std 0.02. (tests/cli/t_synth.sh writes --blocks 1, 1 GiB.) */
Test(synth, flux_dev_globals_read_back)
{
	arena_synth_list l = {0};
	cr_assert_eq(arena_synth_layout_make("flux-dev", 0, &l), 0);
	arena_synth_opts o = {.layout = "flux-dev", .dtype = ARENA_DTYPE_BF16, .seed = 3};
	cr_assert_eq(arena_synth_write(tmpdir_file(tmp_dir, "fd.st"), &l, &o), 0, "%s", arena_last_error());
	arena_st_file *f;
	cr_assert_eq(arena_st_open(tmpdir_file(tmp_dir, "fd.st"), &f), 0, "%s", arena_last_error());
	cr_assert_eq(f->n_tensors, l.n);
	cr_assert_eq(f->n_meta, 3);
	cr_assert_str_eq(f->meta_keys[0], "format");
	cr_assert_str_eq(f->meta_vals[0], "pt");
	cr_assert_str_eq(f->meta_keys[1], "generator");
	cr_assert_str_eq(f->meta_vals[1], "arena synth");
	cr_assert_str_eq(f->meta_keys[2], "layout");
	cr_assert_str_eq(f->meta_vals[2], "flux-dev");
	uint64_t params = 0;
	for (size_t i = 0; i < f->n_tensors; i++)
		params += f->tensors[i].nelem;
	cr_assert_eq(params, arena_synth_params(&l));
	const arena_st_tensor *t = arena_st_find(f, "norm_out.linear.weight");
	cr_assert_not_null(t);
	cr_assert(t->rank == 2 && t->shape[0] == 6144 && t->shape[1] == 3072 && t->dtype == ARENA_DTYPE_BF16);
	const uint16_t *p = (const uint16_t *)arena_st_data(t);
	double s1 = 0, s2 = 0;
	for (uint64_t i = 0; i < t->nelem; i++) {
		uint32_t b = (uint32_t)p[i] << 16;
		float v;
		memcpy(&v, &b, 4);
		s1 += v, s2 += (double)v * v;
	}
	double mean = s1 / t->nelem, sd = sqrt(s2 / t->nelem - mean * mean);
	cr_assert_lt(fabs(mean), 1e-4, "%s: mean %.3g over %llu values", t->name, mean, (unsigned long long)t->nelem);
	cr_assert_lt(fabs(sd - 0.02), 1e-4, "%s: std %.6f over %llu values", t->name, sd, (unsigned long long)t->nelem);
	arena_st_close(f);
	arena_synth_list_release(&l);
}
