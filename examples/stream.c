/* stream.c - a model streamed through arena's public API: a program of your own.
 *
 *   cc -o stream stream.c $(pkg-config --cflags --libs arena)
 *   ./stream MODEL [VRAM] [STEPS]
 *
 * MODEL is a safetensors checkpoint (a file, an index.json or a folder) or an
 * arena image (`arena convert`); it is converted to MODEL.arena first when it
 * is not an image, with a progress line. VRAM (bytes, or K/M/G; default: what
 * the device has free) is all the device memory the weights may use: what
 * does not fit is streamed through a ring of device memory as the steps ask
 * for it. Each step walks the blocks in order, as a model's forward does,
 * acquiring each block's bytes, "running" it, and releasing it.
 *
 * Without a GPU arena runs on its simulated device, whose memory is host
 * memory: there the work is a checksum of each block's bytes, and every step
 * must see the same bytes as the first (exit 1 otherwise). On a GPU the work
 * would be your kernels on `stream`, reading the block at the address
 * acquire gives; here it is nothing.
 */
#include <arena.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const char *what)
{
	fprintf(stderr, "stream: %s: %s\n", what, arena_last_error());
	return 1;
}

static int show_progress(void *ctx, uint64_t done, uint64_t total)
{
	fprintf(stderr, "\r%s: %3.0f%%", (const char *)ctx, total ? 100.0 * (double)done / (double)total : 100.0);
	if (done == total)
		fputc('\n', stderr);
	return 0; /* nonzero would cancel the conversion, leaving nothing behind */
}

/* A size: digits with an optional K, M or G. */
static uint64_t parse_size(const char *s)
{
	char *end;
	double v = strtod(s, &end);
	switch (*end) {
	case 'K': case 'k': v *= 1024; break;
	case 'M': case 'm': v *= 1024 * 1024; break;
	case 'G': case 'g': v *= 1024.0 * 1024 * 1024; break;
	default: break;
	}
	return v > 0 ? (uint64_t)v : 0;
}

/* FNV-1a over a block's bytes: the "work" on the simulated device. */
static uint64_t checksum(const unsigned char *p, uint64_t n)
{
	uint64_t h = 1469598103934665603ull;
	for (uint64_t i = 0; i < n; i++)
		h = (h ^ p[i]) * 1099511628211ull;
	return h;
}

int main(int argc, char **argv)
{
	if (argc < 2 || argc > 4) {
		fprintf(stderr, "usage: stream MODEL [VRAM] [STEPS]\n");
		return 2;
	}
	const char *model = argv[1];
	int steps = argc > 3 ? atoi(argv[3]) : 3;
	char image[4096];
	size_t n = strlen(model);
	if (n > 6 && strcmp(model + n - 6, ".arena") == 0) {
		snprintf(image, sizeof(image), "%s", model);
	} else {
		snprintf(image, sizeof(image), "%s.arena", model);
		arena_convert_options co = {.progress = show_progress, .progress_ctx = "convert"};
		arena_convert_info ci;
		if (arena_convert(&model, 1, image, &co, &ci))
			return fail("convert");
		printf("converted %s: %llu blocks, %llu tensors, %llu bytes\n", image, (unsigned long long)ci.n_blocks,
		       (unsigned long long)ci.n_tensors, (unsigned long long)ci.file_size);
	}

	arena_open_options o = {0};
	if (argc > 2)
		o.vram_cap = parse_size(argv[2]);
	o.headroom = ARENA_ZERO_BYTES; /* small models: no slack kept */
	o.reserve = ARENA_ZERO_BYTES;  /* nothing else of ours on the device */
	arena *a;
	if (arena_open(image, &o, &a))
		return fail(image);
	arena_plan_info plan;
	if (arena_plan_get(a, &plan))
		return fail("plan");
	const size_t nb = arena_block_count(a);
	printf("%s on %s: %zu blocks, %zu resident, %zu streamed through %u slots of %llu bytes\n", image,
	       arena_backend_name(a), nb, plan.n_resident, plan.n_streamed, plan.slots,
	       (unsigned long long)plan.slot_bytes);

	const int sim = strcmp(arena_backend_name(a), "sim") == 0;
	uint64_t *first = calloc(nb, sizeof(*first));
	if (!first)
		return fprintf(stderr, "stream: out of memory\n"), 1;
	int bad = 0;
	for (int s = 0; s < steps; s++) {
		if (arena_step_begin(a))
			return fail("step_begin");
		for (size_t b = 0; b < nb; b++) {
			void *dptr;
			/* stream NULL: on a GPU, the default stream; on sim, the host */
			if (arena_block_acquire(a, b, NULL, &dptr))
				return fail("acquire");
			if (sim) {
				uint64_t h = checksum(dptr, arena_block_bytes(a, b));
				if (s == 0)
					first[b] = h;
				else if (h != first[b]) {
					fprintf(stderr, "stream: step %d: block %s holds other bytes than at step 0\n", s,
						arena_block_name(a, b));
					bad = 1;
				}
			}
			if (arena_block_release(a, b, NULL))
				return fail("release");
		}
		if (arena_step_end(a))
			return fail("step_end");
		arena_step_info si;
		if (arena_step_get(a, (uint64_t)s, &si) == 0)
			printf("step %d: %llu bytes streamed in %llu copies, %llu resident, %u misses\n", s,
			       (unsigned long long)si.streamed_bytes, (unsigned long long)si.copies,
			       (unsigned long long)si.resident_bytes, si.misses);
	}
	free(first);
	arena_close(a);
	if (bad)
		return 1;
	printf("ok: %d steps%s\n", steps, sim ? ", every block's bytes the same at every step" : "");
	return 0;
}
