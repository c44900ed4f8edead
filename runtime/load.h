/* load.h - the fast loader: an image (or a safetensors checkpoint,
 * destination-first) into device memory and host slabs.
 *
 * Pipeline: reader threads each own a backend stream and a few small slots
 * of a pinned ring (default 4 x 1 MiB each). A thread takes the next piece of
 * the file (16 MiB, whole checksum chunks for an image) and goes through it a
 * slot at a time: read into the slot (from the page cache when the bytes are
 * there, O_DIRECT when they are not), hash while the bytes are in the CPU's
 * cache, queue the device copies from the slot (blocks that live on the
 * device) or copy into host slabs, record the slot's event. A slot is reused
 * once its copies are done. A chunk is checked when its last byte has been
 * hashed; a bad one fails the load before anything is committed. Each thread
 * faults in and pins its own share of the ring as it starts.
 *
 * Coded images (docs/FORMAT.md): hb4 chunks stream to a device stage of
 * one chunk each reader has: a chunk's stored bytes go slot by slot to the
 * stage, hashed and structure-checked as they pass; once the chunk has
 * checked out, the device decodes it into its slabs (queued behind the
 * copies on the reader's stream, which also makes the stage free for the
 * next chunk). zstd chunks, hb4 chunks that reach host slabs, and all hb4
 * chunks of a reader the device had no room to stage for are read whole
 * (O_DIRECT when not cached) and decoded by the reader thread on the CPU,
 * after their checksum and structure hold: straight into host slabs, or a
 * slot at a time into the pinned ring and copied on. Readers decode while
 * others read, so a cold load of a zstd image moves fewer bytes from the
 * disk at the cost of CPU time (cpu_decode_s).
 *
 * Transactional: prepare (open and check the image, allocate device memory
 * and host slabs, the ring) -> populate (the pipeline) -> commit (host slabs
 * read-only and pinned within the budget). Any failure, at any point,
 * releases everything and returns one error; nothing half built is visible.
 *
 * The ring (threads x slots x slot size, as asked) is no larger than the
 * bytes that go through it: a slot no larger than the largest read, no more
 * slots than those bytes fill, no more threads than slots or pieces of work
 * (a 300 KiB model asked for 256 x 64 x 1 GiB reads through about 300 KiB).
 * It is taken from the pinned budget; when the budget is smaller it shrinks
 * (fewer slots, smaller slots, fewer threads) and, when even the smallest
 * does not fit, stays pageable: slower, never a failure. The stats say what
 * was used, what was asked and why they differ. */
#ifndef ARENA_RUNTIME_LOAD_H
#define ARENA_RUNTIME_LOAD_H

#include <signal.h>
#include <stdint.h>

#include "../device/model.h"
#include "../convert/plan.h"

enum { ARENA_IO_AUTO = -1, ARENA_IO_BUFFERED = 0, ARENA_IO_DIRECT = 1 };

typedef struct arena_load_opts {
	arena_backend *backend;    /* required */
	arena_pin_budget *budget;  /* required */
	const uint8_t *on_device;  /* per block of the layout: 1 device, 0 host slab; NULL = all device */
	unsigned threads;          /* reader threads; 0 = CPUs (at most 32) */
	uint64_t slot_bytes;       /* ring slot (one read) size; 0 = 1 MiB */
	unsigned slots_per_thread; /* 0 = 4 */
	int io;                    /* ARENA_IO_AUTO (default 0 means buffered: set it) */
	/* Safetensors only: store selected tensors quantized (convert/quant_select.h),
	 * converted on their way from the mapped file into the slab (or a ring
	 * slot, for blocks on the device); NULL = as stored. */
	const struct arena_quant_opts *quant;
	volatile sig_atomic_t *cancel;
	/* Optional: where the blocks go, decided once the layout is known and
	 * before anything is allocated: fill on_device (the layout's n_blocks
	 * entries, 1 device, 0 host slab). `stage`: device bytes that
	 * streaming anything will also take (coded streaming's stages; 0);
	 * host_len: each block's host copy were it streamed (coded streaming
	 * keeps hb4 blocks smaller), or NULL: its slab's bytes; region: the
	 * largest coded region of those copies (arena_wire_region_most: what
	 * a disk tier's staging slot holds at least; 0: none). Its error stops
	 * the load. Replaces `on_device` when set. */
	int (*place)(void *ctx, const arena_layout *l, uint64_t stage, const uint64_t *host_len, uint64_t region,
		     uint8_t *on_device);
	void *place_ctx;
	/* Images only: blocks larger than this many bytes become pieces
	 * (arena_layout_pieces) that the model holds and streams as blocks;
	 * 0 = whole blocks. */
	uint64_t piece_bytes;
	/* Images with hb4 chunks, on a backend that decodes them: blocks that
	 * get a host copy keep it coded (formats/wire.h) where that saves at
	 * least 5 % of the bytes; the engine moves those and the device
	 * decodes them each time (coded streaming). 0: host slabs hold raw
	 * bytes. */
	int coded_stream;
	/* Images only: the host copies (slabs and coded copies) go into a
	 * region shared by the processes of the host that load the same image
	 * with the same host layout (device/hostshare.h): the first loads it,
	 * the others map it and read only their device blocks. */
	int share_host;
	/* Optional: the most host memory the load's own buffers may take: the
	 * read ring and each reader thread's chunk buffers (a coded image's
	 * chunk read whole, a zstd image's piece). Fewer slots, then smaller
	 * ones, then fewer threads (2 slots of 64 KiB on one thread at least).
	 * Read when the ring is made, after o->place: arena_open's place sets
	 * it to what the host budget leaves beside the host copies it plans
	 * (the disk tier's staging at least, which no host copy uses; the
	 * tier's reads come later). 0: no limit. */
	uint64_t buffers_max;
	/* Optional: bytes done of those to do (read from files, and quantized
	 * components), after each piece of work, from the reader threads. */
	void (*progress)(void *ctx, uint64_t done, uint64_t total);
	void *progress_ctx;
} arena_load_opts;

/* A read ring's shape: reader threads, slots per thread, bytes per slot. */
typedef struct arena_ring_shape {
	unsigned threads, slots;
	uint64_t slot;
} arena_ring_shape;

/* Why a ring is smaller than asked (arena_load_stats.ring_lowered). */
enum { ARENA_RING_BY_BYTES = 1, ARENA_RING_BY_BUDGET = 2, ARENA_RING_BY_HOST = 4 /* o->buffers_max */ };

typedef struct arena_load_stats {
	uint64_t file_bytes;      /* bytes read from files */
	uint64_t direct_bytes;    /* of which with O_DIRECT */
	uint64_t gpu_decoded;     /* coded images: raw bytes decoded by the device */
	uint64_t wire_bytes;      /* coded streaming: host bytes kept coded, and the raw bytes they hold */
	uint64_t wire_raw;
	uint64_t cpu_decoded;     /* and by the CPU (host slabs; devices short of memory) */
	uint64_t dev_bytes, host_bytes;
	uint64_t ring_bytes;      /* the ring used: ring.threads x ring.slots x ring.slot */
	int ring_pinned;
	unsigned threads;         /* = ring.threads */
	arena_ring_shape ring, ring_asked; /* used; asked for (defaults filled in) */
	uint64_t ring_need;       /* bytes through the ring: read from files, quantized components */
	unsigned ring_lowered;    /* ARENA_RING_BY_*: why ring < ring_asked */
	double seconds;           /* open to commit */
	/* Where the time went: open and check the file, size and pin the ring,
	 * allocate device memory and host slabs, read+check+copy, commit. */
	double t_open, t_ring, t_prepare, t_populate, t_commit;
	/* A reader thread's time, the mean over threads: in all; faulting in and
	 * pinning its ring share; waiting for a slot's copies (the device is
	 * behind); reading; checking and decoding coded chunks on the CPU. The
	 * rest is hashing, other checks and queueing copies. */
	double w_all, w_ring, w_wait, w_read, w_decode;
	double cpu_decode_s;      /* CPU seconds checking and decoding coded chunks, all threads */
	/* A region another process loaded (ARENA_OPEN_SHARE_HOST), checked
	 * against the image before use (runtime/share_check.h): seconds, region
	 * bytes hashed against chunk checksums, compared with bytes read again,
	 * and image bytes read for it. */
	double share_check_s;
	uint64_t share_hashed, share_compared, share_read;
} arena_load_stats;

/* The image's identity for sharing host copies between processes (its
 * checksums of the manifest and the chunk table, and its sizes):
 * arena_share_key.image. */
struct arena_img_header;
void arena__image_share_id(const struct arena_img_header *h, uint64_t id[2]);

/* Load the image at `path`. On success *out owns the model. `st` may be NULL. */
int arena_load_image(const char *path, const arena_load_opts *o, arena_model **out, arena_load_stats *st);

/* Load a safetensors checkpoint (see arena_ckpt_open_many) destination-first:
 * the plan's slabs are filled straight from the files (no image). `on_device`
 * in `o` indexes the blocks of that plan (NULL = all). */
int arena_load_safetensors(const char *const *inputs, size_t n, const arena_plan_opts *plan,
			   const arena_load_opts *o, arena_model **out, arena_load_stats *st);

#endif
