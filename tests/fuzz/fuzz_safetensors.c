/* fuzz_safetensors.c - libFuzzer target: arena_st_parse on arbitrary bytes.
 *
 * On success every tensor is touched (name, shape, every data byte) so that
 * a reader accepting a layout it should not shows up as an out-of-bounds
 * read under ASan. Built as a libFuzzer binary by 'make fuzz' and as a
 * corpus replayer (with replay.c) by 'make unit'. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "../../formats/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint64_t sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	arena_st_file *f;
	if (arena_st_parse(data, size, "fuzz", &f))
		return 0;
	uint64_t sum = f->n_meta;
	for (size_t i = 0; i < f->n_meta; i++)
		sum += strlen(f->meta_keys[i]) + strlen(f->meta_vals[i]);
	for (size_t i = 0; i < f->n_tensors; i++) {
		const arena_st_tensor *t = &f->tensors[i];
		uint64_t nelem = 1;
		sum += strlen(t->name) + arena_dtype_bits(t->dtype);
		for (uint32_t k = 0; k < t->rank; k++)
			nelem *= t->shape[k];
		if (nelem != t->nelem || t->end - t->begin != t->nbytes)
			__builtin_trap();
		if (arena_st_find(f, t->name) != t)
			__builtin_trap();
		const uint8_t *p = arena_st_data(t);
		for (uint64_t b = 0; b < t->nbytes; b++)
			sum += p[b];
	}
	sink = sum;
	arena_st_close(f);
	return 0;
}
