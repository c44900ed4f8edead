/* fuzz_image.c - libFuzzer target for the arena image reader.
 *
 * Most mutations of an image break a checksum and stop at the header. To
 * reach the manifest, chunk table and layout checks, inputs are "resealed"
 * first (unless the first byte is 'a', which selects the raw input with the
 * magic's 'A' put back): wherever the (mutated) header's regions lie
 * inside the input, their checksums are recomputed and written back, then
 * the header checksum. The input is then opened as a file (memfd) and every
 * data chunk verified. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#include "../../common/alloc.h"
#include "../../formats/image.h"
#include "../../formats/layout.h"

static uint64_t get64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

static void put64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void reseal(uint8_t *b, size_t n)
{
	if (n < 4096)
		return;
	uint64_t mo = get64(b + 24), ml = get64(b + 32), co = get64(b + 48), cl = get64(b + 56);
	if (mo <= n && ml <= n - mo)
		put64(b + 40, XXH3_64bits(b + mo, ml));
	if (co <= n && cl <= n - co)
		put64(b + 64, XXH3_64bits(b + co, cl));
	uint64_t dof = get64(b + 72), cs = get64(b + 88), cc = get64(b + 96);
	/* Chunk checksums too, for entries that lie inside the input. */
	for (uint64_t i = 0; co <= n && cl <= n - co && i < cc && (i + 1) * 32 <= cl && cs; i++) {
		uint8_t *e = b + co + i * 32;
		uint64_t off = get64(e), len = e[8] | e[9] << 8 | e[10] << 16 | (uint64_t)e[11] << 24;
		if (dof <= n && off <= n - dof && len <= n - dof - off)
			put64(e + 16, XXH3_64bits(b + dof + off, len));
	}
	if (co <= n && cl <= n - co)
		put64(b + 64, XXH3_64bits(b + co, cl));
	put64(b + 4088, XXH3_64bits(b, 4088));
}

/* A layout that opened split into pieces: the pieces tile each block's
 * slab, every tensor keeps its place in the data region and lies in its
 * piece; anything else aborts (a crash for the fuzzer). */
static void check_pieces(const arena_layout *l, uint64_t piece)
{
	arena_layout *p;
	uint32_t *par;
	if (arena_layout_pieces(l, piece, &p, &par))
		return; /* out of memory */
	size_t j = 0;
	for (size_t b = 0; b < l->n_blocks; b++) {
		uint64_t at = l->blocks[b].offset;
		for (; j < p->n_blocks && par[j] == b; j++) {
			if (p->blocks[j].offset != at)
				abort();
			at += p->blocks[j].bytes;
		}
		if (at != l->blocks[b].offset + l->blocks[b].bytes)
			abort();
	}
	if (j != p->n_blocks || p->n_tensors != l->n_tensors)
		abort();
	for (size_t i = 0; i < p->n_tensors; i++) {
		const arena_tensor *t = &p->tensors[i], *a = &l->tensors[i];
		if (t->block >= p->n_blocks || par[t->block] != a->block || t->n_comp != a->n_comp)
			abort();
		for (uint32_t c = 0; c < t->n_comp; c++)
			if (p->blocks[t->block].offset + t->comp[c].offset != l->blocks[a->block].offset + a->comp[c].offset ||
			    t->comp[c].offset + t->comp[c].bytes > p->blocks[t->block].bytes)
				abort();
	}
	arena_free(par);
	arena_layout_free(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t *b = malloc(size ? size : 1);
	if (!b)
		return 0;
	memcpy(b, data, size);
	if (size && b[0] == 'a')
		b[0] = 'A';
	else
		reseal(b, size);
	int fd = memfd_create("fuzz-image", MFD_CLOEXEC);
	if (fd < 0 || write(fd, b, size) != (ssize_t)size) {
		if (fd >= 0)
			close(fd);
		free(b);
		return 0;
	}
	char path[64];
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	arena_image *img = NULL;
	if (arena_img_open(path, &img) == 0) {
		if (arena_img_verify_data(img, 1, NULL, NULL, NULL) == 0 && img->hdr.data_length <= (64u << 20)) {
			/* Decode every chunk of a good image (coded ones too). */
			arena_img_reader rd;
			uint8_t *raw = malloc(img->hdr.data_length ? img->hdr.data_length : 1);
			if (raw && arena_img_reader_init(&rd, img, 1) == 0) {
				arena_img_read_raw(&rd, 0, img->hdr.data_length, raw);
				arena_img_reader_free(&rd);
			}
			free(raw);
		}
		if (img->layout) /* pieces of a size the input picks */
			check_pieces(img->layout, size ? 1 + (uint64_t)data[size - 1] * 97 : 1);
		for (uint64_t i = 0; i < img->hdr.chunk_count && i < 4; i++) {
			char buf[512];
			arena_img_chunk_describe(img, i, buf, sizeof(buf));
		}
		arena_img_close(img);
	}
	close(fd);
	free(b);
	return 0;
}
