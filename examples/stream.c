/* stream.c - a model streamed through arena's public API: a program of your own.
 *
 *   cc -o stream stream.c $(pkg-config --cflags --libs arena)
 *   ./stream MODEL [VRAM] [STEPS]
 *
 * MODEL is a safetensors checkpoint (a file, an index.json or a folder) or an
 * arena image (`arena convert`). A checkpoint is converted to MODEL.arena, with
 * a progress line, once: a MODEL.arena newer than MODEL (a folder: than every
 * file in it) is used as it is, and one older is converted again over.
 * VRAM (a size as the arena command reads one: bytes, or with K, M, G or T,
 * "512M", "1.5G", "8gb"; default: what the device has free) is all the device
 * memory the weights may use: what does not fit is streamed through a ring of
 * device memory as the steps ask for it, in pieces where whole blocks would
 * not fit. STEPS (default 3) is how many steps to run. Each step walks the
 * blocks in order, as a model's forward does, acquiring each block's bytes,
 * "running" it, and releasing it.
 *
 * Without a GPU arena runs on its simulated device, whose memory is host
 * memory: there the work is a checksum of each block's bytes, and every step
 * must see the same bytes as the first (exit 1 otherwise). On a GPU the work
 * would be your kernels on `stream`, reading the block at the address
 * acquire gives; here it is nothing.
 */
#define _XOPEN_SOURCE 700 /* nftw, stat's st_mtim */
#include <arena.h>

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

/* The library's last error, which names its file and object. */
static int fail(void)
{
	fprintf(stderr, "stream: %s\n", arena_last_error());
	return 1;
}

/* A bad argument: what is wrong with it, and the usage; exit status 2. */
static int bad_arg(const char *what, const char *arg, const char *rule)
{
	fprintf(stderr, "stream: %s '%s' is not %s (usage: stream MODEL [VRAM] [STEPS])\n", what, arg, rule);
	return 2;
}

static int show_progress(void *ctx, uint64_t done, uint64_t total)
{
	fprintf(stderr, "\r%s: %3.0f%%", (const char *)ctx, total ? 100.0 * (double)done / (double)total : 100.0);
	if (done == total)
		fputc('\n', stderr);
	return 0; /* nonzero would cancel the conversion, leaving nothing behind */
}

/* A size as the arena command reads one: digits with an optional fraction,
 * then an optional K, M, G or T (powers of 1024) and an optional "B" or
 * "iB", in either case; a fraction of a byte is cut. 0 and *out set, or -1
 * (not a size, or 2^64 bytes or more). */
static int parse_size(const char *s, uint64_t *out)
{
	const char *p = s;
	uint64_t whole = 0;
	double frac = 0, scale = 1;
	int digits = 0, big = 0;
	for (; *p >= '0' && *p <= '9'; p++, digits++) {
		big |= whole > (UINT64_MAX - 9) / 10;
		whole = whole * 10 + (uint64_t)(*p - '0');
	}
	if (*p == '.')
		for (p++; *p >= '0' && *p <= '9'; p++, digits++)
			frac += (*p - '0') * (scale /= 10);
	if (!digits)
		return -1;
	const char *units = "kmgt", *u = *p ? strchr(units, *p | 0x20) : NULL;
	unsigned shift = u ? 10 * (unsigned)(u - units + 1) : 0;
	if (u) {
		p++;
		if ((p[0] | 0x20) == 'i' && (p[1] | 0x20) == 'b')
			p += 2;
		else if ((*p | 0x20) == 'b')
			p++;
	} else if ((*p | 0x20) == 'b') {
		p++;
	}
	uint64_t f = (uint64_t)(frac * (double)(1ull << shift));
	if (*p || big || whole > (UINT64_MAX >> shift) || (whole << shift) > UINT64_MAX - f)
		return -1;
	*out = (whole << shift) + f;
	return 0;
}

/* The newest modification time among MODEL's files (nftw's callback). */
static struct timespec newest;

static int newer(const char *path, const struct stat *st, int type, struct FTW *f)
{
	(void)path, (void)f;
	if (type == FTW_F && (st->st_mtim.tv_sec > newest.tv_sec ||
			      (st->st_mtim.tv_sec == newest.tv_sec && st->st_mtim.tv_nsec > newest.tv_nsec)))
		newest = st->st_mtim;
	return 0;
}

/* 1 when `image` exists and is at least as new as everything `model` is
 * made of: the file; every file under the folder; for a sharded
 * checkpoint's index.json, every file in its folder. */
static int up_to_date(const char *model, const char *image)
{
	struct stat im, m;
	if (stat(image, &im) || stat(model, &m))
		return 0;
	newest = m.st_mtim;
	char dir[4096] = "";
	size_t n = strlen(model);
	if (S_ISDIR(m.st_mode)) {
		snprintf(dir, sizeof(dir), "%s", model);
	} else if (n > 5 && !strcmp(model + n - 5, ".json")) {
		const char *slash = strrchr(model, '/');
		snprintf(dir, sizeof(dir), "%.*s", slash ? (int)(slash - model) : 1, slash ? model : ".");
	}
	if (dir[0] && nftw(dir, newer, 16, FTW_PHYS))
		return 0;
	return im.st_mtim.tv_sec > newest.tv_sec ||
	       (im.st_mtim.tv_sec == newest.tv_sec && im.st_mtim.tv_nsec >= newest.tv_nsec);
}

/* The plural ending of a count's noun. */
static const char *plural(unsigned long long n)
{
	return n == 1 ? "" : "s";
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
	uint64_t vram = 0;
	if (argc > 2 && parse_size(argv[2], &vram))
		return bad_arg("VRAM", argv[2], "a size below 16 EiB: bytes, or a number with K, M, G or T (512M, 1.5G)");
	int steps = 3;
	if (argc > 3) {
		char *end;
		long v = strtol(argv[3], &end, 10);
		if (argv[3][0] < '0' || argv[3][0] > '9' || *end || v < 1 || v > 1000000)
			return bad_arg("STEPS", argv[3], "a whole number from 1 to 1000000");
		steps = (int)v;
	}
	char image[4096];
	size_t n = strlen(model);
	if (n > 6 && strcmp(model + n - 6, ".arena") == 0) {
		snprintf(image, sizeof(image), "%s", model);
	} else if (snprintf(image, sizeof(image), "%s.arena", model) >= (int)sizeof(image)) {
		return bad_arg("MODEL", model, "a path of less than 4090 bytes");
	} else if (up_to_date(model, image)) {
		printf("using %s (newer than %s)\n", image, model);
	} else {
		/* force: an older image of the model is replaced (when the new one is whole) */
		arena_convert_options co = {.progress = show_progress, .progress_ctx = "convert", .force = 1};
		arena_convert_info ci;
		if (arena_convert(&model, 1, image, &co, &ci))
			return fail();
		printf("converted %s: %llu block%s, %llu tensor%s, %llu bytes\n", image, (unsigned long long)ci.n_blocks,
		       plural(ci.n_blocks), (unsigned long long)ci.n_tensors, plural(ci.n_tensors),
		       (unsigned long long)ci.file_size);
	}

	arena_open_options o = {0};
	o.vram_cap = vram;
	o.headroom = ARENA_ZERO_BYTES;      /* small models: no slack kept */
	o.reserve = ARENA_ZERO_BYTES;       /* nothing else of ours on the device */
	o.piece_size = ARENA_PIECE_AUTO;    /* whole blocks where they fit, else pieces */
	arena *a;
	if (arena_open(image, &o, &a))
		return fail();
	arena_plan_info plan;
	if (arena_plan_get(a, &plan))
		return fail();
	const size_t nb = arena_block_count(a);
	printf("%s on %s: %zu block%s, %zu resident, %zu streamed through %u slot%s of %llu bytes\n", image,
	       arena_backend_name(a), nb, plural(nb), plan.n_resident, plan.n_streamed, plan.slots, plural(plan.slots),
	       (unsigned long long)plan.slot_bytes);

	const int sim = strcmp(arena_backend_name(a), "sim") == 0;
	uint64_t *first = calloc(nb, sizeof(*first));
	if (!first)
		return fprintf(stderr, "stream: out of memory\n"), 1;
	int bad = 0;
	for (int s = 0; s < steps; s++) {
		if (arena_step_begin(a))
			return fail();
		for (size_t b = 0; b < nb; b++) {
			void *dptr;
			/* stream NULL: on a GPU, the default stream; on sim, the host */
			if (arena_block_acquire(a, b, NULL, &dptr))
				return fail();
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
				return fail();
		}
		if (arena_step_end(a))
			return fail();
		arena_step_info si;
		if (arena_step_get(a, (uint64_t)s, &si) == 0)
			printf("step %d: %llu bytes streamed in %llu cop%s, %llu resident, %u miss%s\n", s,
			       (unsigned long long)si.streamed_bytes, (unsigned long long)si.copies,
			       si.copies == 1 ? "y" : "ies", (unsigned long long)si.resident_bytes, si.misses,
			       si.misses == 1 ? "" : "es");
	}
	free(first);
	arena_close(a);
	if (bad)
		return 1;
	printf("ok: %d step%s%s\n", steps, plural((unsigned long long)steps),
	       sim ? ", every block's bytes the same at every step" : "");
	return 0;
}
