/* test_checkpoint.c - single, multi-file and sharded checkpoints, and every
 * cross-file error, on small files written to a fresh temporary folder. */
#include <criterion/criterion.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "arena.h"
#include "../../formats/checkpoint.h"
#include "testutil.h"

static char tmp[1024];

static void tmp_setup(void)
{
	tmpdir_make(tmp, sizeof(tmp), "ckpt");
}

static void tmp_teardown(void)
{
	tmpdir_remove(tmp);
}

TestSuite(ckpt, .init = tmp_setup, .fini = tmp_teardown);

/* tmp/rel, in one of 4 rotating buffers. */
static const char *at(const char *rel)
{
	static char buf[4][4096];
	static unsigned next;
	char *p = buf[next++ % 4];
	int n = snprintf(p, sizeof(buf[0]), "%s%s%s", tmp, *rel ? "/" : "", rel);
	cr_assert(n > 0 && (size_t)n < sizeof(buf[0]), "path too long");
	return p;
}

static void write_bytes(const char *rel, const void *b, size_t n)
{
	FILE *fp = fopen(at(rel), "wb");
	cr_assert_not_null(fp, "%s", at(rel));
	cr_assert_eq(fwrite(b, 1, n, fp), n);
	cr_assert_eq(fclose(fp), 0);
}

static void write_text(const char *rel, const char *text)
{
	write_bytes(rel, text, strlen(text));
}

/* A safetensors file from a header and data_len data bytes. */
static void write_st(const char *rel, const char *header, size_t data_len)
{
	size_t hl = strlen(header), n = 8 + hl + data_len;
	uint8_t *b = calloc(1, n);
	cr_assert_not_null(b);
	for (int i = 0; i < 8; i++)
		b[i] = (uint8_t)((uint64_t)hl >> (8 * i));
	memcpy(b + 8, header, hl);
	write_bytes(rel, b, n);
	free(b);
}

#define ENT(name, shape, b, e) \
	"\"" name "\":{\"dtype\":\"U8\",\"shape\":" shape ",\"data_offsets\":[" #b "," #e "]}"

/* The good shards: a holds x, y; b holds z. */
static void write_shards(void)
{
	write_st("a.safetensors", "{" ENT("x", "[1]", 0, 1) "," ENT("y", "[2]", 1, 3) "}", 3);
	write_st("b.safetensors", "{\"__metadata__\":{\"format\":\"pt\"}," ENT("z", "[1]", 0, 1) "}", 1);
}

#define INDEX(map) "{\"metadata\":{\"total_size\":4},\"weight_map\":{" map "}}"
#define GOOD_MAP "\"x\":\"a.safetensors\",\"y\":\"a.safetensors\",\"z\":\"b.safetensors\""

static int open_rc(const char *path)
{
	arena_ckpt *c = (arena_ckpt *)1;
	int rc = arena_ckpt_open(path, &c);
	if (rc)
		cr_assert_null(c, "a failed open must leave *out NULL");
	else
		arena_ckpt_close(c);
	return rc;
}

#define expect_err(path, code, subject)                                                           \
	do {                                                                                      \
		int rc_ = open_rc(path);                                                          \
		cr_assert_eq(rc_, ARENA_E(code), "expected %s, got %s (%s)", #code,                 \
			     arena_err_name(rc_), arena_last_error());                               \
		const char *s_ = (subject);                                                       \
		if (s_)                                                                           \
			cr_assert(strstr(arena_last_error(), s_), "message lacks \"%s\": %s", s_,    \
				  arena_last_error());                                               \
	} while (0)

/* --- valid --------------------------------------------------------------- */

Test(ckpt, sharded_ok_by_folder_and_index)
{
	write_shards();
	write_text("model.safetensors.index.json", INDEX(GOOD_MAP));
	const char *paths[] = {at(""), at("model.safetensors.index.json")};
	for (int i = 0; i < 2; i++) {
		arena_ckpt *c;
		int rc = arena_ckpt_open(paths[i], &c);
		cr_assert_eq(rc, 0, "%s: %s", paths[i], arena_last_error());
		cr_assert_eq(c->n_files, 2);
		cr_assert_eq(c->n_tensors, 3);
		cr_assert_str_eq(c->tensors[0]->name, "x");
		cr_assert_str_eq(c->tensors[2]->name, "z");
		cr_assert_eq(arena_ckpt_find(c, "z")->file, c->files[1]);
		cr_assert_null(arena_ckpt_find(c, "w"));
		cr_assert_eq(arena_ckpt_bytes(c), 4);
		cr_assert_not_null(c->index_meta);
		arena_ckpt_close(c);
	}
}

Test(ckpt, single_file_and_folder_of_one)
{
	write_shards();
	arena_ckpt *c;
	cr_assert_eq(arena_ckpt_open(at("a.safetensors"), &c), 0, "%s", arena_last_error());
	cr_assert_eq(c->n_tensors, 2);
	cr_assert_null(c->index_path);
	arena_ckpt_close(c);
	cr_assert_eq(mkdir(at("one"), 0755), 0);
	write_st("one/m.safetensors", "{" ENT("w", "[1]", 0, 1) "}", 1);
	write_text("one/config.json", "{}");
	cr_assert_eq(arena_ckpt_open(at("one"), &c), 0, "%s", arena_last_error());
	cr_assert_eq(c->n_tensors, 1);
	cr_assert_str_eq(c->tensors[0]->name, "w");
	arena_ckpt_close(c);
}

Test(ckpt, open_many)
{
	write_shards();
	const char *paths[] = {at("b.safetensors"), at("a.safetensors")};
	arena_ckpt *c;
	cr_assert_eq(arena_ckpt_open_many(paths, 2, &c), 0, "%s", arena_last_error());
	cr_assert_eq(c->n_files, 2);
	cr_assert_eq(c->n_tensors, 3);
	cr_assert_str_eq(c->tensors[0]->name, "x");
	arena_ckpt_close(c);
	c = (arena_ckpt *)1;
	cr_assert_eq(arena_ckpt_open_many(paths, 0, &c), ARENA_E_USAGE);
	cr_assert_null(c);
	arena_ckpt_close(NULL);
}

Test(ckpt, folder_prefers_model_index)
{
	write_shards();
	write_text("model.safetensors.index.json", INDEX(GOOD_MAP));
	write_text("other.safetensors.index.json", "not json");
	arena_ckpt *c;
	cr_assert_eq(arena_ckpt_open(at(""), &c), 0, "%s", arena_last_error());
	cr_assert_eq(c->n_tensors, 3);
	arena_ckpt_close(c);
}

/* --- index errors ---------------------------------------------------------- */

Test(ckpt, shard_missing)
{
	write_shards();
	write_text("model.safetensors.index.json",
		   INDEX("\"x\":\"a.safetensors\",\"y\":\"a.safetensors\",\"z\":\"c.safetensors\""));
	expect_err(at(""), IDX_SHARD_MISSING, "'c.safetensors'");
	expect_err(at("model.safetensors.index.json"), IDX_SHARD_MISSING, "'c.safetensors'");
}

Test(ckpt, tensor_missing_from_its_shard)
{
	write_shards();
	write_text("model.safetensors.index.json", INDEX(GOOD_MAP ",\"w\":\"a.safetensors\""));
	expect_err(at(""), IDX_TENSOR_MISSING, "'w'");
}

Test(ckpt, tensor_in_another_shard_than_named)
{
	/* z is in b, the index says a (b is still named, for q). */
	write_st("a.safetensors", "{" ENT("x", "[1]", 0, 1) "}", 1);
	write_st("b.safetensors", "{" ENT("z", "[1]", 0, 1) "," ENT("q", "[1]", 1, 2) "}", 2);
	write_text("model.safetensors.index.json",
		   INDEX("\"x\":\"a.safetensors\",\"z\":\"a.safetensors\",\"q\":\"b.safetensors\""));
	expect_err(at(""), IDX_TENSOR_MISSING, "'z'");
}

Test(ckpt, tensor_in_two_shards)
{
	write_st("a.safetensors", "{" ENT("x", "[1]", 0, 1) "," ENT("y", "[2]", 1, 3) "}", 3);
	write_st("b.safetensors", "{" ENT("x", "[1]", 0, 1) "," ENT("z", "[1]", 1, 2) "}", 2);
	write_text("model.safetensors.index.json", INDEX(GOOD_MAP));
	expect_err(at(""), DUPLICATE_TENSOR, "'x'");
	cr_assert(strstr(arena_last_error(), "a.safetensors") && strstr(arena_last_error(), "b.safetensors"), "%s",
		  arena_last_error());
	/* The same two files given by name. */
	const char *paths[] = {at("a.safetensors"), at("b.safetensors")};
	arena_ckpt *c = (arena_ckpt *)1;
	int rc = arena_ckpt_open_many(paths, 2, &c);
	cr_assert_eq(rc, ARENA_E(DUPLICATE_TENSOR), "%s", arena_err_name(rc));
	cr_assert_null(c);
	cr_assert(strstr(arena_last_error(), "'x'"));
}

Test(ckpt, shard_tensor_unlisted)
{
	write_st("a.safetensors", "{" ENT("x", "[1]", 0, 1) "," ENT("y", "[2]", 1, 3) "}", 3);
	write_st("b.safetensors", "{" ENT("z", "[1]", 0, 1) "," ENT("extra", "[1]", 1, 2) "}", 2);
	write_text("model.safetensors.index.json", INDEX(GOOD_MAP));
	expect_err(at(""), IDX_TENSOR_UNLISTED, "'extra'");
}

Test(ckpt, bad_shard_name)
{
	write_shards();
	cr_assert_eq(mkdir(at("sub"), 0755), 0);
	write_shards();
	const char *bad[] = {"sub/a.safetensors", "../a.safetensors", "..", ".", "", "/a.safetensors",
			     "a.safetensors/"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char idx[512];
		snprintf(idx, sizeof(idx), INDEX("\"x\":\"a.safetensors\",\"y\":\"a.safetensors\",\"z\":\"%s\""),
			 bad[i]);
		write_text("model.safetensors.index.json", idx);
		int rc = open_rc(at(""));
		cr_assert_eq(rc, ARENA_E(IDX_BAD_SHARD_NAME), "shard \"%s\": got %s (%s)", bad[i],
			     arena_err_name(rc), arena_last_error());
		cr_assert(strstr(arena_last_error(), "'z'"), "%s", arena_last_error());
	}
}

Test(ckpt, index_not_json)
{
	write_shards();
	const char *bad[] = {"", "{", "not json", "{\"weight_map\":{\"x\":\"a.safetensors\",}}",
			     "{\"weight_map\":{\"x\":\"a.safetensors\",\"x\":\"a.safetensors\"}}"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		write_text("model.safetensors.index.json", bad[i]);
		int rc = open_rc(at(""));
		cr_assert_eq(rc, ARENA_E(IDX_JSON), "index \"%s\": got %s (%s)", bad[i], arena_err_name(rc),
			     arena_last_error());
		cr_assert(strstr(arena_last_error(), "model.safetensors.index.json"), "%s", arena_last_error());
	}
}

Test(ckpt, index_without_weight_map)
{
	write_shards();
	const char *bad[] = {"{}", "[]", "{\"metadata\":{}}", "{\"weight_map\":[]}", "{\"weight_map\":\"a\"}",
			     "{\"weight_map\":{\"x\":1}}", "{\"weight_map\":{\"x\":null}}",
			     "{\"metadata\":[],\"weight_map\":{" GOOD_MAP "}}"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		write_text("model.safetensors.index.json", bad[i]);
		int rc = open_rc(at("model.safetensors.index.json"));
		cr_assert_eq(rc, ARENA_E(IDX_BAD), "index %s: got %s (%s)", bad[i], arena_err_name(rc),
			     arena_last_error());
	}
}

Test(ckpt, bad_shard_error_comes_through)
{
	write_shards();
	/* b has a trailing byte. */
	write_st("b.safetensors", "{" ENT("z", "[1]", 0, 1) "}", 2);
	write_text("model.safetensors.index.json", INDEX(GOOD_MAP));
	expect_err(at(""), ST_TRAILING_BYTES, at("b.safetensors"));
	/* a has an unknown dtype. */
	write_shards();
	write_st("a.safetensors", "{\"x\":{\"dtype\":\"bf16\",\"shape\":[1],\"data_offsets\":[0,2]}}", 2);
	expect_err(at("model.safetensors.index.json"), ST_UNKNOWN_DTYPE, "'x'");
	cr_assert(strstr(arena_last_error(), at("a.safetensors")), "%s", arena_last_error());
	/* A shard that is a folder. */
	write_shards();
	cr_assert_eq(remove(at("b.safetensors")), 0);
	cr_assert_eq(mkdir(at("b.safetensors"), 0755), 0);
	int rc = open_rc(at("model.safetensors.index.json"));
	cr_assert_lt(rc, 0);
	cr_assert(strstr(arena_last_error(), "b.safetensors"), "%s", arena_last_error());
}

/* --- folders and paths ------------------------------------------------------ */

Test(ckpt, no_checkpoint)
{
	/* An empty folder. */
	expect_err(at(""), NO_CHECKPOINT, tmp);
	/* Only other files. */
	write_text("config.json", "{}");
	write_text("README.md", "x");
	expect_err(at(""), NO_CHECKPOINT, NULL);
	/* Several .safetensors and no index. */
	write_shards();
	expect_err(at(""), NO_CHECKPOINT, "2 .safetensors files");
	/* Several indexes, none of them model.safetensors.index.json. */
	write_text("a.safetensors.index.json", INDEX(GOOD_MAP));
	write_text("b.safetensors.index.json", INDEX(GOOD_MAP));
	expect_err(at(""), NO_CHECKPOINT, "index files");
}

Test(ckpt, not_found)
{
	expect_err(at("nonexistent"), NOT_FOUND, "nonexistent");
	expect_err(at("nonexistent.safetensors"), NOT_FOUND, "nonexistent.safetensors");
	expect_err(at("nonexistent.safetensors.index.json"), NOT_FOUND, NULL);
	expect_err(at("no/such/folder/model.safetensors"), NOT_FOUND, NULL);
	expect_err("/nonexistent-arena-path", NOT_FOUND, "/nonexistent-arena-path");
	const char *paths[] = {at("nonexistent.safetensors")};
	arena_ckpt *c;
	cr_assert_eq(arena_ckpt_open_many(paths, 1, &c), ARENA_E_NOT_FOUND);
}

/* --- a diffusers pipeline's folder ------------------------------------------ */

#define PIPE_INDEX                                                                                             \
	"{\"_class_name\":\"FluxPipeline\",\"_diffusers_version\":\"0.42.1\",\"scheduler\":[\"diffusers\","   \
	"\"FlowMatchEulerDiscreteScheduler\"],\"text_encoder\":[\"transformers\",\"CLIPTextModel\"],"         \
	"\"tokenizer\":[\"transformers\",\"CLIPTokenizer\"],\"transformer\":[\"diffusers\",\"Flux\"],"         \
	"\"vae\":[\"diffusers\",\"AutoencoderKL\"],\"image_encoder\":[null,null]}"

/* A pipeline: a component with one file, one sharded, one with a variant beside
 * its plain weights, and components without weights (scheduler, tokenizer, one
 * named null). */
static void write_pipeline(void)
{
	const char *dirs[] = {"pipe", "pipe/scheduler", "pipe/text_encoder", "pipe/tokenizer", "pipe/transformer", "pipe/vae"};
	for (size_t i = 0; i < sizeof(dirs) / sizeof(*dirs); i++)
		cr_assert_eq(mkdir(at(dirs[i]), 0755), 0);
	write_text("pipe/model_index.json", PIPE_INDEX);
	write_text("pipe/scheduler/scheduler_config.json", "{}");
	write_text("pipe/tokenizer/vocab.json", "{}");
	write_st("pipe/text_encoder/model.safetensors", "{" ENT("x", "[1]", 0, 1) "}", 1);
	write_st("pipe/transformer/diffusion_pytorch_model-00001-of-00002.safetensors",
		 "{" ENT("x", "[1]", 0, 1) "," ENT("y", "[2]", 1, 3) "}", 3);
	write_st("pipe/transformer/diffusion_pytorch_model-00002-of-00002.safetensors", "{" ENT("z", "[1]", 0, 1) "}", 1);
	write_text("pipe/transformer/diffusion_pytorch_model.safetensors.index.json",
		   INDEX("\"x\":\"diffusion_pytorch_model-00001-of-00002.safetensors\","
			 "\"y\":\"diffusion_pytorch_model-00001-of-00002.safetensors\","
			 "\"z\":\"diffusion_pytorch_model-00002-of-00002.safetensors\""));
	write_st("pipe/vae/diffusion_pytorch_model.safetensors", "{" ENT("w", "[2]", 0, 2) "}", 2);
	write_st("pipe/vae/diffusion_pytorch_model.fp16.safetensors", "{" ENT("w16", "[1]", 0, 1) "}", 1);
}

Test(ckpt, pipeline_components_named_by_folder)
{
	write_pipeline();
	arena_ckpt *c;
	cr_assert_eq(arena_ckpt_open(at("pipe"), &c), 0, "%s", arena_last_error());
	const char *want[] = {"text_encoder.x", "transformer.x", "transformer.y", "transformer.z", "vae.w"};
	cr_assert_eq(c->n_tensors, 5);
	for (size_t i = 0; i < 5; i++)
		cr_assert_str_eq(c->tensors[i]->name, want[i]);
	cr_assert_eq(c->n_files, 4, "text_encoder 1, transformer 2 shards, vae the file without a variant");
	cr_assert_not_null(arena_ckpt_find(c, "transformer.z"));
	cr_assert_null(arena_ckpt_find(c, "z"));
	cr_assert_eq(arena_ckpt_bytes(c), 7);
	/* the names' own files still name them in messages */
	cr_assert(strstr(arena_ckpt_find(c, "vae.w")->file->path, "pipe/vae/diffusion_pytorch_model.safetensors"));
	arena_ckpt_close(c);
	/* beside another input, as one model */
	write_st("extra.safetensors", "{" ENT("lora.a", "[1]", 0, 1) "}", 1);
	const char *paths[] = {at("pipe"), at("extra.safetensors")};
	cr_assert_eq(arena_ckpt_open_many(paths, 2, &c), 0, "%s", arena_last_error());
	cr_assert_eq(c->n_tensors, 6);
	cr_assert_str_eq(c->tensors[0]->name, "lora.a");
	arena_ckpt_close(c);
}

Test(ckpt, pipeline_errors)
{
	write_pipeline();
	/* a component with only pickled weights */
	cr_assert_eq(remove(at("pipe/text_encoder/model.safetensors")), 0);
	write_text("pipe/text_encoder/pytorch_model.bin", "pickle");
	expect_err(at("pipe"), NO_CHECKPOINT, "component 'text_encoder' has only pickled weights");
	cr_assert_eq(remove(at("pipe/text_encoder/pytorch_model.bin")), 0);
	/* a component's own checkpoint errors come through, naming its file */
	write_text("pipe/text_encoder/model.safetensors", "short");
	int rc = open_rc(at("pipe"));
	cr_assert_lt(rc, 0);
	cr_assert(strstr(arena_last_error(), "pipe/text_encoder/model.safetensors"), "%s", arena_last_error());
	cr_assert_eq(remove(at("pipe/text_encoder/model.safetensors")), 0);
	/* variants alone: none is named without one */
	cr_assert_eq(remove(at("pipe/vae/diffusion_pytorch_model.safetensors")), 0);
	write_st("pipe/vae/diffusion_pytorch_model.bf16.safetensors", "{" ENT("w", "[2]", 0, 2) "}", 2);
	expect_err(at("pipe"), NO_CHECKPOINT, "2 .safetensors files");
	/* no component with weights */
	write_text("pipe/model_index.json", "{\"_class_name\":\"P\",\"scheduler\":[\"diffusers\",\"S\"]}");
	expect_err(at("pipe"), NO_CHECKPOINT, "no component of the pipeline");
	/* model_index.json that is not an object, or not JSON */
	write_text("pipe/model_index.json", "[1]");
	expect_err(at("pipe"), IDX_BAD, "model_index.json");
	write_text("pipe/model_index.json", "{");
	expect_err(at("pipe"), IDX_JSON, "model_index.json");
	/* a component whose name is a path */
	write_text("pipe/model_index.json", "{\"../x\":[\"diffusers\",\"M\"]}");
	expect_err(at("pipe"), IDX_BAD, "not a plain folder name");
}
