/* test_api_misuse.c - the public API given what it must refuse: a handle
 * closed while other references hold it, sizes near 2^64 summed in the
 * budget, a block address that is not the block's, a simulated copy rate
 * too low for any clock. On sim; ASan and UBSan run these too. */
#include <criterion/criterion.h>

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "arena.h"
#include "testutil.h"

#define KiB (1024ull)
#define MiB (1024ull * 1024)

static void expect_usage(int rc, const char *text)
{
	cr_assert_eq(rc, ARENA_E_USAGE, "%s: %s", arena_err_name(rc), arena_last_error());
	cr_assert(strstr(arena_last_error(), text), "'%s' lacks '%s'", arena_last_error(), text);
}

/* --- closed: every call but retain, release and close refuses ------------------ */

Test(api_misuse, every_call_after_close_is_usage_while_references_remain)
{
	arena_open_options o = {.backend = "sim", .vram_cap = 64 << 20, .quant = "fp8-e4m3-row"};
	arena *a;
	cr_assert_eq(arena_open(fixture_path("tiny_flux.safetensors"), &o, &a), 0, "%s", arena_last_error());
	size_t ti;
	cr_assert_eq(arena_tensor_find(a, "single_transformer_blocks.0.proj_out.weight", &ti), 0);
	arena_tensor_info t;
	cr_assert_eq(arena_tensor_get(a, ti, &t), 0);
	void *blk = arena_block_device(a, t.block);
	cr_assert_not_null(blk);
	cr_assert_eq(arena_retain(a), 0);
	arena_close(a);
	/* The accessors that return a status say USAGE "closed". */
	arena_block_info bi;
	size_t i;
	void *d = NULL, *dl = NULL;
	uint16_t out[64];
	expect_usage(arena_block_get(a, 1, &bi), "closed");
	expect_usage(arena_block_find(a, "transformer_blocks.0", &i), "closed");
	expect_usage(arena_tensor_get(a, ti, &t), "closed");
	expect_usage(arena_tensor_find(a, t.name, &i), "closed");
	expect_usage(arena_block_acquire_name(a, "transformer_blocks.0", NULL, &d, &i), "closed");
	expect_usage(arena_dlpack(a, blk, 16, 1, 0, &dl), "closed");
	cr_assert_null(dl);
	expect_usage(arena_tensor_dequantize(a, ti, blk, out, NULL), "closed");
	expect_usage(arena_block_keep_host(a, 1), "closed");
	arena_plan_info p;
	expect_usage(arena_plan_get(a, &p), "closed");
	/* Those that return a value give 0 / NULL and say why. */
	cr_assert_eq(arena_block_count(a), 0);
	cr_assert(strstr(arena_last_error(), "closed"), "%s", arena_last_error());
	cr_assert_null(arena_block_name(a, 1));
	cr_assert(strstr(arena_last_error(), "closed"), "%s", arena_last_error());
	cr_assert_null(arena_backend_name(a));
	cr_assert(strstr(arena_last_error(), "closed"), "%s", arena_last_error());
	cr_assert_null(arena_block_device(a, t.block));
	cr_assert_eq(arena_block_bytes(a, 1), 0);
	cr_assert_eq(arena_tensor_count(a), 0);
	cr_assert_null(arena_tensor_subclass(a, ti));
	cr_assert_eq(arena_mode(a), -1);
	cr_assert_eq(arena_step_count(a), 0);
	/* retain, release and close still work */
	cr_assert_eq(arena_retain(a), 0);
	arena_release(a);
	arena_close(a);
	arena_release(a); /* the last reference: freed */
	expect_usage(arena_block_get(a, 1, &bi), "not an open arena");
}

/* --- sizes near 2^64: checked sums, the BUDGET message says what is needed ------- */

/* The bytes the BUDGET message says are needed ("it needs 16.00 EiB of"). */
static void expect_needs(const char *want)
{
	const char *m = arena_last_error();
	char needle[64];
	snprintf(needle, sizeof(needle), "it needs %s of device memory", want);
	cr_assert(strstr(m, needle), "'%s' lacks '%s'", m, needle);
}

Test(api_misuse, huge_headroom_reserve_and_cap_are_summed_without_wrapping)
{
	const char *path = fixture_path("tiny_flux.safetensors");
	arena *a = NULL;
	/* a headroom 2 bytes short of 2^64: the sum of what is needed saturates */
	arena_open_options o = {.backend = "sim", .headroom = UINT64_MAX - 1};
	cr_assert_eq(arena_open(path, &o, &a), ARENA_E(BUDGET), "%s", arena_last_error());
	cr_assert_null(a);
	expect_needs("16.00 EiB");
	/* a reserve that large is a reserve that large (not one the library reads as its own "unknown") */
	o = (arena_open_options){.backend = "sim", .reserve = UINT64_MAX - 1, .headroom = ARENA_ZERO_BYTES};
	cr_assert_eq(arena_open(path, &o, &a), ARENA_E(BUDGET), "%s", arena_last_error());
	cr_assert(strstr(arena_last_error(), "working reserve of 16.00 EiB"), "%s", arena_last_error());
	expect_needs("16.00 EiB");
	/* and both, under a cap as large */
	o = (arena_open_options){.backend = "sim", .vram_cap = UINT64_MAX - 1, .headroom = UINT64_MAX - 1000,
				 .reserve = UINT64_MAX - 1, .sim_capacity = 1ull << 30};
	cr_assert_eq(arena_open(path, &o, &a), ARENA_E(BUDGET), "%s", arena_last_error());
	expect_needs("16.00 EiB");
	o = (arena_open_options){.backend = "sim", .vram_cap = UINT64_MAX - 1, .headroom = UINT64_MAX - 1000,
				 .sim_capacity = 1ull << 30, .sim_context = 1 << 20};
	cr_assert_eq(arena_open(path, &o, &a), ARENA_E(BUDGET), "%s", arena_last_error());
	expect_needs("16.00 EiB");
	/* learning the reserve: the same sums in the message of the safe plan */
	o = (arena_open_options){.backend = "sim", .headroom = UINT64_MAX - 1, .flags = ARENA_OPEN_LEARN_REST};
	cr_assert_eq(arena_open(path, &o, &a), ARENA_E(BUDGET), "%s", arena_last_error());
	cr_assert(strstr(arena_last_error(), "give vram of at least 18446744073709551615"), "%s", arena_last_error());
	/* A cap that large is no cap to speak of: the model opens; what the rest of
	 * the process then reports is taken as it is, and the limits stay sums that hold. */
	o = (arena_open_options){.backend = "sim", .vram_cap = UINT64_MAX - 1, .headroom = ARENA_ZERO_BYTES,
				 .reserve = ARENA_ZERO_BYTES};
	cr_assert_eq(arena_open(path, &o, &a), 0, "%s", arena_last_error());
	cr_assert_eq(arena_set_rest_memory(a, UINT64_MAX - 1), 0, "%s", arena_last_error());
	arena_memory_info m;
	cr_assert_eq(arena_memory_get(a, &m), 0);
	cr_assert_eq(m.rest, UINT64_MAX - 1);
	cr_assert_leq(m.rest_limit, UINT64_MAX - 1 - m.arena, "the rest's limit is what the cap leaves past arena's");
	arena_close(a);
}

/* --- dequantize: the block's own address, nothing inside it ---------------------- */

Test(api_misuse, dequantize_takes_only_the_blocks_address)
{
	const char *path = fixture_path("tiny_flux.safetensors");
	uint16_t out[8192];
	size_t ti, tj;
	arena_tensor_info t, u;
	/* resident (64 MiB: every block): the block's address, nothing else inside its slab */
	arena_open_options o = {.backend = "sim", .vram_cap = 64 * MiB, .quant = "fp8-e4m3-row"};
	arena *a;
	cr_assert_eq(arena_open(path, &o, &a), 0, "%s", arena_last_error());
	cr_assert_eq(arena_tensor_find(a, "single_transformer_blocks.0.proj_out.weight", &ti), 0);
	cr_assert_eq(arena_tensor_find(a, "transformer_blocks.0.attn.to_q.weight", &tj), 0);
	cr_assert_eq(arena_tensor_get(a, ti, &t), 0);
	cr_assert_eq(arena_tensor_get(a, tj, &u), 0);
	cr_assert_str_eq(t.scheme, "fp8-e4m3-row");
	cr_assert_str_eq(u.scheme, "fp8-e4m3-row");
	cr_assert_neq(t.block, u.block);
	uint8_t *rt = arena_block_device(a, t.block), *ru = arena_block_device(a, u.block);
	cr_assert(rt && ru, "resident");
	cr_assert_eq(arena_tensor_dequantize(a, ti, rt, out, NULL), 0, "%s", arena_last_error());
	expect_usage(arena_tensor_dequantize(a, ti, rt + 1, out, NULL), "not the address of block");
	expect_usage(arena_tensor_dequantize(a, ti, rt + 256, out, NULL), "not the address of block");
	expect_usage(arena_tensor_dequantize(a, ti, rt + arena_block_bytes(a, t.block) - 1, out, NULL),
		     "not the address of block");
	expect_usage(arena_tensor_dequantize(a, ti, ru, out, NULL), "not the address of block"); /* another block's */
	/* acquired, a resident block's address is the same */
	cr_assert_eq(arena_step_begin(a), 0);
	void *d;
	cr_assert_eq(arena_block_acquire(a, t.block, NULL, &d), 0);
	cr_assert_eq(d, (void *)rt);
	cr_assert_eq(arena_tensor_dequantize(a, ti, d, out, NULL), 0, "%s", arena_last_error());
	cr_assert_eq(arena_block_release(a, t.block, NULL), 0);
	cr_assert_eq(arena_step_end(a), 0);
	arena_close(a);

	/* streamed (190 KiB: the globals resident, every other block through a ring of
	 * 3): the address an acquire gave, while it is held */
	o = (arena_open_options){.backend = "sim", .vram_cap = 190 * KiB, .quant = "fp8-e4m3-row",
				 .headroom = ARENA_ZERO_BYTES, .reserve = ARENA_ZERO_BYTES};
	cr_assert_eq(arena_open(path, &o, &a), 0, "%s", arena_last_error());
	arena_plan_info p;
	cr_assert_eq(arena_plan_get(a, &p), 0);
	cr_assert_eq(p.n_streamed, 5, "the blocks stream");
	cr_assert_null(arena_block_device(a, t.block));
	uint8_t *globals = arena_block_device(a, 0);
	cr_assert_not_null(globals);
	cr_assert_eq(arena_step_begin(a), 0);
	void *d1, *d2;
	cr_assert_eq(arena_block_acquire(a, t.block, NULL, &d1), 0, "%s", arena_last_error());
	cr_assert_eq(arena_block_acquire(a, u.block, NULL, &d2), 0, "%s", arena_last_error());
	cr_assert_eq(arena_tensor_dequantize(a, ti, d1, out, NULL), 0, "%s", arena_last_error());
	cr_assert_eq(arena_tensor_dequantize(a, tj, d2, out, NULL), 0, "%s", arena_last_error());
	uint8_t *b1 = d1;
	expect_usage(arena_tensor_dequantize(a, ti, b1 + 1, out, NULL), "not the address of block");
	expect_usage(arena_tensor_dequantize(a, ti, b1 + arena_block_bytes(a, t.block) - 1, out, NULL),
		     "not the address of block");
	expect_usage(arena_tensor_dequantize(a, ti, d2, out, NULL), "not the address of block"); /* another block's slot */
	expect_usage(arena_tensor_dequantize(a, tj, d1, out, NULL), "not the address of block");
	expect_usage(arena_tensor_dequantize(a, ti, globals, out, NULL), "not the address of block");
	cr_assert_eq(arena_block_release(a, t.block, NULL), 0);
	/* released: its slot is the ring's again */
	expect_usage(arena_tensor_dequantize(a, ti, d1, out, NULL), "not the address of block");
	cr_assert_eq(arena_tensor_dequantize(a, tj, d2, out, NULL), 0, "%s", arena_last_error());
	cr_assert_eq(arena_block_release(a, u.block, NULL), 0);
	cr_assert_eq(arena_step_end(a), 0, "%s", arena_last_error());
	expect_usage(arena_tensor_dequantize(a, tj, d2, out, NULL), "not the address of block");
	arena_close(a);
}

/* --- the simulated copy rate ---------------------------------------------------- */

Test(api_misuse, sim_bandwidth_below_a_kilobyte_a_second_is_refused, .timeout = 60)
{
	const double bad[] = {1e-300, 1e-3, 999, 1.01e15};
	for (size_t k = 0; k < sizeof(bad) / sizeof(*bad); k++) {
		arena_open_options o = {.backend = "sim", .sim_bandwidth = bad[k]};
		arena *a = (arena *)1;
		expect_usage(arena_open(fixture_path("tiny_flux.safetensors"), &o, &a), "sim_bandwidth");
		cr_assert_null(a);
	}
	const double good[] = {1e7, 1e15}; /* (1e3 takes the backend: test_backend.c; a load at it, minutes) */
	for (size_t k = 0; k < sizeof(good) / sizeof(*good); k++) {
		arena_open_options o = {.backend = "sim", .sim_bandwidth = good[k]};
		arena *a;
		cr_assert_eq(arena_open(fixture_path("tiny_flux.safetensors"), &o, &a), 0, "%s", arena_last_error());
		arena_close(a);
	}
}
