/* arena.h - public interface of libarena: errors, checkpoints, images.
 *
 * Conventions (every function below follows them unless its contract says
 * otherwise):
 *   - Functions that can fail return 0 on success or a negative arena_err
 *     code. The one-line message for the last failure on the calling thread is
 *     available from arena_last_error() until the next failing call.
 *   - Objects are made by X_open / X_create and released by the matching
 *     X_close / X_free, which accepts NULL.
 *   - Pointers returned by accessors are borrowed: valid until the object that
 *     returned them is closed.
 */
#ifndef ARENA_H
#define ARENA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What libarena.so exports: the functions of this header, nothing else. */
#if defined(__GNUC__)
#define ARENA_API __attribute__((visibility("default")))
#else
#define ARENA_API
#endif

#define ARENA_VERSION_MAJOR 0
#define ARENA_VERSION_MINOR 2
#define ARENA_VERSION_PATCH 0
#define ARENA_VERSION_STRING "0.2.0"

/* Error classes; the CLI's exit code is the class of the error. */
enum {
	ARENA_CLASS_OK = 0,
	ARENA_CLASS_INVALID = 1, /* the input is invalid or corrupt */
	ARENA_CLASS_USAGE = 2,   /* the request is wrong (options, paths) */
	ARENA_CLASS_SYSTEM = 3,  /* I/O, out of memory, device */
};

/* The error table: X(NAME, class, short description).
 * Codes are stable once released: append, never renumber. */
#define ARENA_ERRORS(X)                                                                  \
	X(OK, OK, "success")                                                             \
	X(INTERNAL, SYSTEM, "internal error (a bug in arena)")                            \
	X(USAGE, USAGE, "invalid argument")                                               \
	X(NOMEM, SYSTEM, "out of memory")                                                 \
	X(IO, SYSTEM, "input/output error")                                               \
	X(NOT_FOUND, USAGE, "no such file or directory")                                  \
	X(NO_DEVICE, SYSTEM, "no CUDA device")                                            \
	X(CANCELLED, SYSTEM, "cancelled")                                                 \
	/* safetensors files */                                                           \
	X(ST_TOO_SHORT, INVALID, "file shorter than 8 bytes")                             \
	X(ST_HEADER_TOO_LARGE, INVALID, "header length over 100000000 bytes")             \
	X(ST_HEADER_PAST_EOF, INVALID, "header extends past the end of the file")         \
	X(ST_HEADER_UTF8, INVALID, "header is not valid UTF-8")                           \
	X(ST_HEADER_JSON, INVALID, "header is not valid JSON")                            \
	X(ST_HEADER_NOT_OBJECT, INVALID, "header is not a JSON object")                   \
	X(ST_DUPLICATE_KEY, INVALID, "duplicate key in header")                           \
	X(ST_TENSOR_NOT_OBJECT, INVALID, "tensor entry is not a JSON object")             \
	X(ST_MISSING_FIELD, INVALID, "tensor entry lacks a required field")               \
	X(ST_UNKNOWN_FIELD, INVALID, "tensor entry has an unknown field")                 \
	X(ST_BAD_DTYPE, INVALID, "dtype is not a string")                                 \
	X(ST_UNKNOWN_DTYPE, INVALID, "unknown dtype")                                     \
	X(ST_BAD_SHAPE, INVALID, "shape is not a list of non-negative integers")          \
	X(ST_BAD_OFFSETS, INVALID, "data_offsets is not two non-negative integers")       \
	X(ST_BAD_METADATA, INVALID, "__metadata__ is not a map of strings to strings")    \
	X(ST_OFFSET_START, INVALID, "tensor data does not start at offset 0")             \
	X(ST_OFFSET_REVERSED, INVALID, "data_offsets end before begin")                   \
	X(ST_OFFSET_GAP, INVALID, "gap between tensors")                                  \
	X(ST_OFFSET_OVERLAP, INVALID, "tensors overlap")                                  \
	X(ST_SIZE_OVERFLOW, INVALID, "tensor size overflows")                             \
	X(ST_PARTIAL_BYTES, INVALID, "tensor size is not a whole number of bytes")        \
	X(ST_SIZE_MISMATCH, INVALID, "data_offsets span does not match dtype and shape")  \
	X(ST_DATA_PAST_EOF, INVALID, "tensor data extends past the end of the file")      \
	X(ST_TRAILING_BYTES, INVALID, "bytes after the last tensor")                      \
	/* sharded checkpoints (model.safetensors.index.json) */                          \
	X(IDX_JSON, INVALID, "index is not valid JSON")                                   \
	X(IDX_BAD, INVALID, "index has no valid weight_map")                              \
	X(IDX_BAD_SHARD_NAME, INVALID, "shard name is not a plain file name")             \
	X(IDX_SHARD_MISSING, INVALID, "shard named by the index is missing")              \
	X(IDX_TENSOR_MISSING, INVALID, "tensor named by the index is not in its shard")   \
	X(IDX_TENSOR_UNLISTED, INVALID, "shard holds a tensor the index does not name")   \
	X(DUPLICATE_TENSOR, INVALID, "tensor defined twice")                              \
	X(NO_CHECKPOINT, INVALID, "no safetensors checkpoint at this path")              \
	/* arena images (docs/FORMAT.md) */                                               \
	X(IMG_TRUNCATED, INVALID, "image is truncated")                                   \
	X(IMG_SIZE, INVALID, "image is longer than its header says")                      \
	X(IMG_MAGIC, INVALID, "not an arena image (bad magic)")                           \
	X(IMG_HEADER_CHECKSUM, INVALID, "image header checksum mismatch")                 \
	X(IMG_VERSION, INVALID, "unsupported image major version")                        \
	X(IMG_FLAGS, INVALID, "image requires a feature this reader lacks")               \
	X(IMG_HEADER_BAD, INVALID, "image header fields are inconsistent")                \
	X(IMG_MANIFEST_CHECKSUM, INVALID, "image manifest checksum mismatch")             \
	X(IMG_MANIFEST_BAD, INVALID, "image manifest is malformed")                       \
	X(IMG_SLAB_BAD, INVALID, "block slab overlaps another or lies outside the data")  \
	X(IMG_TENSOR_BAD, INVALID, "tensor lies outside its slab or overlaps another")    \
	X(IMG_CHUNK_TABLE_CHECKSUM, INVALID, "image chunk table checksum mismatch")       \
	X(IMG_CHUNK_TABLE_BAD, INVALID, "chunk table does not match header and manifest") \
	X(IMG_CODEC, INVALID, "unknown chunk codec")                                      \
	X(IMG_CHUNK_CHECKSUM, INVALID, "data chunk checksum mismatch")                     \
	/* block plans */                                                                 \
	X(PLAN_BAD_PATTERN, USAGE, "invalid block pattern")                               \
	X(PLAN_BAD_ORDER, USAGE, "invalid block order")                                   \
	X(PLAN_EMPTY, INVALID, "checkpoint has no tensors")                               \
	/* devices and budgets */                                                         \
	X(DEV_OOM, SYSTEM, "out of device memory")                                        \
	X(DEV_ERROR, SYSTEM, "device error")                                              \
	X(BUDGET, USAGE, "does not fit the memory budget")                               \
	X(PROFILE_BAD, INVALID, "compute profile file is malformed")                     \
	/* quantization (convert/quant.h) */                                              \
	X(QUANT_UNKNOWN_SCHEME, USAGE, "unknown quantization scheme")                     \
	X(QUANT_NOT_APPLICABLE, USAGE, "quantization scheme does not apply to this tensor") \
	X(IMG_CHUNK_BAD, INVALID, "coded data chunk is malformed")                        \
	X(IMG_PADDING, INVALID, "image padding byte is not zero")                         \
	/* paths (common/io.h, common/outfile.h) */                                       \
	X(INPUT_NOT_READABLE, INVALID, "input is not a readable regular file")           \
	X(OUTPUT_IS_INPUT, USAGE, "output is the same file as an input")                 \
	X(INPUT_CHANGED, INVALID, "input changed while it was read")                     \
	X(OUTPUT_EXISTS, USAGE, "output file exists and replacing it was not asked for")

typedef enum arena_err {
#define ARENA__ERR_ENUM(name, cls, desc) ARENA__ERRNUM_##name,
	ARENA_ERRORS(ARENA__ERR_ENUM)
#undef ARENA__ERR_ENUM
	ARENA__ERR_COUNT
} arena_err_index;

/* ARENA_E_<NAME> is the negative error code (ARENA_E_OK is 0). */
#define ARENA_E(name) (-(int)ARENA__ERRNUM_##name)
#define ARENA_E_OK 0
#define ARENA_E_INTERNAL ARENA_E(INTERNAL)
#define ARENA_E_USAGE ARENA_E(USAGE)
#define ARENA_E_NOMEM ARENA_E(NOMEM)
#define ARENA_E_IO ARENA_E(IO)
#define ARENA_E_NOT_FOUND ARENA_E(NOT_FOUND)
#define ARENA_E_NO_DEVICE ARENA_E(NO_DEVICE)
#define ARENA_E_CANCELLED ARENA_E(CANCELLED)

/* Name of an error code ("ST_UNKNOWN_DTYPE"); "UNKNOWN" for codes not in the table. */
ARENA_API const char *arena_err_name(int code);
/* Short description of an error code; never NULL. */
ARENA_API const char *arena_strerror(int code);
/* Class of an error code (ARENA_CLASS_*); also the CLI's exit status. */
ARENA_API int arena_err_class(int code);
/* One-line message of the last failure on this thread ("" if none). Borrowed:
 * valid until the next arena call on this thread. */
ARENA_API const char *arena_last_error(void);

/* Library version string, e.g. "0.2.0". */
ARENA_API const char *arena_version(void);
/* sizeof one of this header's structs by its name ("arena_open_options",
 * "arena_tensor_info", "arena_block_info", "arena_step_info",
 * "arena_plan_info", "arena_rest_info", "arena_memory_info",
 * "arena_convert_options", "arena_convert_info", "arena_bad_chunk",
 * "arena_verify_options", "arena_verify_info"), for bindings that check
 * their layouts; 0 for other names. */
ARENA_API size_t arena_sizeof(const char *type_name);

/* ---- arenas: a model's weights on a device, as much of them as fits ----------
 *
 * An arena is opened from an arena image (checksums verified as the bytes
 * arrive) or a safetensors checkpoint (a file, an index.json or a folder;
 * read destination-first, optionally quantized on the way). Opening is
 * transactional: it returns a whole arena or an error and leaves nothing
 * behind.
 *
 * Residency. The device budget is vram_cap (or what the device has free)
 * minus a headroom and a working reserve for the caller's activations. When
 * the whole model fits it all goes to the device. When it does not, the
 * residency engine keeps what fits resident and streams the other blocks
 * (a block: the weights of one repeated layer, `transformer_blocks.7`)
 * through a ring of device memory just in time; their canonical copies stay
 * in host memory (pinned where the OS allows). A model that cannot run at
 * all (the globals block plus a ring of the largest blocks do not fit) is a
 * BUDGET error from arena_open that says what it would need.
 *
 * A caller's loop (any number of steps, any order):
 *
 *     arena_step_begin(a);
 *     for each layer it runs:
 *         arena_block_acquire(a, block, stream, &dptr);   // bytes ready on `stream`
 *         ... work on stream reading dptr ...
 *         arena_block_release(a, block, stream);          // after that work
 *     arena_step_end(a);
 *
 * `stream` is the native stream handle the work runs on: a cudaStream_t
 * passed as void * on the cuda backend (NULL: the default stream); on the
 * sim backend it must be NULL and the caller's work is host work (acquire
 * returns once the bytes are there; release means the work is done).
 * Resident blocks may be acquired too (the call is cheap) or used through
 * their address from arena_block_get. The engine learns the order the
 * caller really runs from the steps it has run: the first step may miss
 * (a block fetched when asked for), later steps prefetch in the order
 * observed. Several passes a step (classifier-free guidance), steps that
 * stop early, and blocks acquired out of the usual order all work.
 *
 * Threads. Every call may come from any thread (autograd's backward runs on
 * a thread of its own); calls on one arena are serialized by a lock inside
 * it. The message of a failing call is arena_last_error() on the thread
 * that made it.
 *
 * Lifetime. An arena is reference counted: arena_open returns one
 * reference; arena_retain adds one (memory handed to another runtime, a
 * DLPack tensor, holds one), arena_release drops one, and the last one
 * frees everything. arena_close ends the opener's use: it waits for the
 * engine's work, makes every later call through the handle a USAGE error
 * ("closed") except retain/release/close, and drops the opener's
 * reference; device and host memory stay valid while other references
 * exist. Closing twice is harmless while references remain. A handle that
 * was never an arena or whose last reference is gone is refused (USAGE
 * "not an open arena") by every call that takes one, as far as the library
 * can tell (it keeps a registry of live handles); do not rely on that for
 * memory you freed yourself.
 *
 * Out-of-range input: functions returning int give USAGE (block or tensor
 * index out of range, bad mode, NULL where a pointer is required) or
 * NOT_FOUND (a name not in the model, a step record not kept); accessors
 * that cannot fail return 0 / NULL for an index out of range, as each says,
 * and for a handle closed or not live (arena_last_error says which). */

typedef struct arena arena;

enum { ARENA_MODE_SAMPLE = 0, ARENA_MODE_TRAIN = 1 };

/* headroom and reserve: explicitly none (0 means the default). */
#define ARENA_ZERO_BYTES UINT64_MAX
/* keep_last: explicitly none (0 means the default). */
#define ARENA_ZERO_COUNT UINT32_MAX

/* flags */
#define ARENA_OPEN_STRICT 1u         /* over the budget after demoting all it can: step_end fails with BUDGET */
#define ARENA_OPEN_NO_LEARN 2u       /* learn no compute profile (plan by bytes, or by the profile given) */
#define ARENA_OPEN_FIXED_SCHEDULE 4u /* keep the mode's default schedule; learn none from the steps run */
/* An image with hb4 chunks keeps its streamed blocks coded in host memory
 * (copies move ~3/4 of the bytes, the device decodes them: coded
 * streaming) unless this flag asks for raw host copies. */
#define ARENA_OPEN_PLAIN_STREAM 8u
/* A block that moves to the device for good (the engine promotes it when
 * there is room) gives its host copy back to the OS at the next step end,
 * and reads it again from its image if it is streamed later: host memory
 * stays the streamed blocks'. Host addresses from arena_block_get and
 * arena_tensor_get then stay valid only while their block is streamed,
 * unless arena_block_keep_host() keeps that block's for good. */
#define ARENA_OPEN_RELEASE_HOST 16u
/* The caller reports the rest of the process's device memory at every step
 * (arena_rest_report), so the reserve is learned (see "The process's device
 * memory"): a work not seen yet runs the smallest plan, which leaves the
 * rest all the room there is, unless the whole model fits in half of it.
 * arena.torch sets it. An explicit reserve turns the learning off. */
#define ARENA_OPEN_LEARN_REST 32u
/* Images only: one host copy of the streamed blocks for the processes of
 * one user on the host (data-parallel training: torchrun, one process per
 * GPU). The first process to open the image with a given host layout loads
 * the host copies into a memory region the user's processes share; a
 * process that opens it with the same layout maps those pages instead of
 * loading them, after checking them against its own image's chunk
 * checksums (one that opens while it is being loaded waits for it, then
 * maps it; if the loader died, it loads it itself). The layout is
 * everything that decides those bytes: the image's content (its
 * checksums), which blocks have host copies (the residency plan: vram_cap,
 * piece_size, host_budget), raw or coded copies, the library's version;
 * processes whose layouts differ hold a copy each (still correct). Each
 * process keeps its own engine, plan and device blocks (read from the
 * image by each), pins its view of the region within its own pinned
 * budget, and sees the copies read-only as always. ARENA_OPEN_RELEASE_HOST
 * and the disk tier stay per process: releasing a block's copy drops this
 * process's view of it (the bytes stay for the others; the kernel frees
 * the region with its last process, a kill -9 included); copies a process
 * makes later (a block leaving the device) are its own. The default host
 * budget and the pinned budget of a process that will map a region add its
 * bytes back (the host's free memory no longer counts them). The region is a
 * sealed memfd; processes find it through a registry file
 * $ARENA_SHARE_DIR/arena-<32 hex>.lock (default /dev/shm/arena-<uid>, a
 * folder of the user's alone) that names the processes holding it, removed
 * by the last one to close. Nothing of another user's is ever opened or
 * mapped (docs/SHARING.md, "Security"). Sharing never fails the open:
 * where it is not possible (an untrusted folder or file, a registry locked
 * for 5 s, a loader that stalls, bytes that are not the image's, a failed
 * system call) the process holds a private copy, and arena_share_get
 * says why. USAGE for a safetensors checkpoint. */
#define ARENA_OPEN_SHARE_HOST 64u

/* Zero-initialize and set what you need; every 0 is the default (the CLI's
 * defaults are these). NULL options = all defaults. */
typedef struct arena_open_options {
	const char *backend;   /* "cuda", "sim", or NULL: cuda when a GPU is usable, else sim */
	int device;            /* CUDA device number */
	uint64_t vram_cap;     /* device bytes the process may hold as the driver counts them (its
				* CUDA context and modules, the rest of the process's memory,
				* torch's allocator, and arena's), at its peak; 0 = no cap: what
				* the device has free (following other programs as they take
				* and give back memory). See "The process's device memory". */
	uint64_t pin_budget;   /* cap on pinned host bytes; 0 = what the OS allows */
	unsigned threads;      /* reader threads; 0 = CPUs */
	const char *quant;     /* safetensors only: storage scheme for block weights, or NULL */
	/* residency */
	int mode;              /* ARENA_MODE_SAMPLE (default) or ARENA_MODE_TRAIN: forward, then
				* backward in reverse with each block needed again (checkpointing) */
	uint64_t headroom;     /* physical slack; 0 = min(512 MiB, 2% of the device or cap) */
	uint64_t reserve;      /* device memory the rest of the process (the caller's framework:
				* torch's allocator) needs at its peak in a step; 0 = learned when
				* the caller reports it (ARENA_OPEN_LEARN_REST), else 1 GiB
				* sample, 4 GiB train, at most a quarter of what is left after
				* the headroom; a value given is used as it is (nothing learned) */
	unsigned depth;        /* the ring holds depth + 1 of the largest streamed block; 0 = 2,
				* and in train mode in pieces as many as one block's pieces
				* (a checkpointed recompute holds them) when that is more. A
				* depth given must leave what the mode holds room: at least 1;
				* 2 sampling in pieces (a block's call holds a piece while it
				* acquires the next); training 3 slots with keep_last, in
				* pieces the largest block's pieces and one more: less is
				* USAGE at arena_open (and at arena_set_mode to that mode),
				* saying the least that works; so are pieces too small for any
				* ring to train in */
	unsigned keep_last;    /* train: extra ring slots keeping the last forward blocks; 0 = 1 */
	unsigned hysteresis;   /* steps of room before promoting blocks again; 0 = 3 */
	unsigned flags;        /* ARENA_OPEN_* */
	const char *profile;   /* compute profile file to plan by (`arena bench stream
				* --save-profile` writes one), or NULL: learned on the device */
	/* sim backend only */
	uint64_t sim_capacity; /* the simulated device; 0 = 16 GiB, or vram_cap when larger */
	double sim_bandwidth;  /* host-to-device bytes per second, from 1e3 (1 KB/s) to 1e15 (USAGE
				* otherwise); 0 = as fast as memcpy */
	/* images only: stream blocks larger than this in pieces, each cut where a
	 * tensor starts (not between a module's weight and bias) and at most this
	 * size unless one module's tensors are larger; the
	 * pieces are then the arena's blocks ("transformer_blocks.3#0", ...,
	 * same container and index), acquired and released one by one, so the
	 * ring holds pieces and the model runs in less memory (`arena plan
	 * --piece-size` shows the floor). 0 = whole blocks; ARENA_PIECE_AUTO =
	 * whole blocks when they all fit on the device (train mode: when they
	 * fit at all, streamed or not; with ARENA_OPEN_LEARN_REST, when their
	 * floor fits a third of what there is, two fifths for an image streamed
	 * coded), else pieces of an eighth of the largest block rounded down to
	 * a power of two (64 MiB for Flux; in train mode a third of the block in
	 * whole eighths, 192 MiB), or smaller ones when those do not fit
	 * (arena_plan_get's piece_size says what was chosen). */
	uint64_t piece_size;
	/* images only: all the host memory the weights take: the copies of
	 * streamed blocks and the disk tier's staging. Blocks beyond it
	 * (spread through the order they run, each read while the blocks
	 * before it are copied) keep no host copy: each is read from the image
	 * when it is streamed (the disk tier), its chunks checked as the bytes
	 * pass, ahead of use into staging that comes out of the budget whether
	 * or not a tier is planned: a quarter of it, up to 384 MiB, and at
	 * least two read slots (a 64 MiB part, or the largest block) and the
	 * readers' chunk buffers; the load's read ring stays within the budget
	 * too. A budget below that least is BUDGET, naming it (arena_plan_get's
	 * host_budget and staging_bytes say what was taken). 0 = what
	 * MemAvailable (and the cgroup) allow less a reserve of 2 GiB or a
	 * tenth (the least where that is less); ARENA_ZERO_BYTES = the least:
	 * no host copies, every streamed block from disk.
	 * A block the image cannot give again fails the step's call that
	 * needs it (acquire, step_end), naming the block: IO (a read fault),
	 * INPUT_CHANGED (the image is shorter than when it was opened),
	 * IMG_CHUNK_CHECKSUM (its bytes changed). */
	uint64_t host_budget;
	/* A move between resident sets that only a prediction asks for (the
	 * learned profile's, or a plan made anew at another budget) is made
	 * when the time it is predicted to save a step, this many times over,
	 * is more than the move's own (estimated, then timed): 0 = 16. A short
	 * run gains less from a move; a long training run more. */
	unsigned payback_steps;
	/* sim backend only: the process's own device memory beside allocations
	 * (a CUDA context: 0.5-0.7 GiB on an H200), counted in the process's
	 * memory under the cap; 0 = none. */
	uint64_t sim_context;
	/* Other programs on the card. Without a vram_cap the weights' budget
	 * follows the device's free memory, and another program's allocation
	 * that finds no room simply fails: arena cannot see it. share_card
	 * leaves this many device bytes free at every step end (the larger of
	 * it and the headroom, beside what the rest of the process needs), and
	 * when the device's free memory falls under it (another program took
	 * memory) the next step end gives memory back: blocks are demoted until
	 * that much is free again, or as far as the smallest plan goes (a
	 * decision whose why is ARENA_WHY_YIELD); when the memory comes back,
	 * blocks are promoted again, the share still left free. Its cost: the
	 * weights it keeps off the device are streamed, each step copying them
	 * (arena_plan_info's stream_bytes_per_step; docs/TUNING.md). 0 = none;
	 * ARENA_SHARE_CARD_DEFAULT = the lesser of a tenth of the device's
	 * memory and 2 GiB. With vram_cap: USAGE (a cap leaves the rest of the
	 * card to other programs already). */
	uint64_t share_card;
	/* The same as a fraction of the device's memory, above 0 and below 1;
	 * 0 = share_card says. Both given: USAGE. */
	double share_card_fraction;
} arena_open_options;

/* arena_open_options.piece_size: chosen from the budget (see there). */
#define ARENA_PIECE_AUTO UINT64_MAX
/* arena_open_options.share_card: min(a tenth of the device, 2 GiB). */
#define ARENA_SHARE_CARD_DEFAULT UINT64_MAX

/* Open `path` with `opt` (NULL = defaults). On success *out holds the one
 * reference; on failure *out is NULL and arena_last_error() says why.
 * Errors: NOT_FOUND, any IMG_* / ST_* / IDX_* error of the input,
 * INPUT_CHANGED (an input shorter than when it was opened: rewritten or cut
 * meanwhile), BUDGET (the model cannot run within the device budget: the
 * message says what it needs), USAGE (bad options), DEV_OOM, NO_DEVICE,
 * NOMEM, IO, PROFILE_BAD. */
ARENA_API int arena_open(const char *path, const arena_open_options *opt, arena **out);
/* End the opener's use and drop its reference (see Lifetime). Accepts NULL. */
ARENA_API void arena_close(arena *a);
/* One more reference: 0, or USAGE for a handle that is not a live arena. */
ARENA_API int arena_retain(arena *a);
/* Drop one reference; the last frees everything. Accepts NULL. */
ARENA_API void arena_release(arena *a);
/* A DLPack managed tensor (dlpack.h's DLManagedTensor, v0.8 and later) over
 * `nbytes` bytes at `data`, which must be memory of `a` (a tensor's or a
 * block's bytes: arena_tensor, arena_block_acquire; the library does not
 * check), as a 1-D uint8 tensor on DLPack device `device_type` (1 kDLCPU,
 * 2 kDLCUDA, 3 kDLCUDAHost) number `device_id`. It holds one reference to
 * `a`; its deleter, which whoever consumes it calls once, drops that
 * reference and frees the struct (code of the library only: a consumer may
 * free it from any thread, or while an interpreter shuts down). On success
 * *out is the DLManagedTensor *; on failure NULL. Errors: USAGE (not a live
 * arena or closed, NULL out, NULL data with nbytes > 0, nbytes past INT64_MAX, another
 * device type), NOMEM. */
ARENA_API int arena_dlpack(arena *a, void *data, uint64_t nbytes, int device_type, int device_id, void **out);

/* The backend in use: "cuda" or "sim"; NULL for a handle that is not live
 * or is closed. */
ARENA_API const char *arena_backend_name(const arena *a);

/* ---- blocks and tensors ---------------------------------------------------- */

typedef struct arena_block_info {
	const char *name;      /* "transformer_blocks.7", "globals"; borrowed */
	const char *container; /* "transformer_blocks", or NULL for globals */
	int64_t index;         /* in its container; -1 for globals */
	uint64_t bytes;        /* its slab */
	int resident;          /* 1: on the device now (device is its address, valid until
				* the plan changes at a step_end or set_mode); 0: streamed */
	void *device;          /* resident: the slab's device address; else NULL (acquire it) */
	const void *host;      /* its canonical host copy (read-only, never changes; with
				* ARENA_OPEN_RELEASE_HOST see there), or NULL
				* for a block that lives only on the device, only in the
				* image (the disk tier: beyond host_budget), or coded */
	int coded;             /* its host copy holds the image's hb4 chunks, not the raw
				* bytes (coded streaming: copies move those and the device
				* decodes them); host is NULL then */
} arena_block_info;

/* Blocks in execution order; block 0 is globals when the model has any. */
ARENA_API size_t arena_block_count(const arena *a);
/* Block i: 0, or USAGE when i is out of range. */
ARENA_API int arena_block_get(const arena *a, size_t i, arena_block_info *out);
/* The index of the block called `name`: 0, or NOT_FOUND. */
ARENA_API int arena_block_find(const arena *a, const char *name, size_t *index);
/* Keep block i's host copy for the arena's life (ARENA_OPEN_RELEASE_HOST
 * gives it back once the block is on the device for good): call it before
 * using a host address from arena_block_get / arena_tensor_get beyond the
 * next step end. 0, or USAGE (i out of range, a handle not live). */
ARENA_API int arena_block_keep_host(arena *a, size_t i);
/* Block i's name, device address (NULL when streamed) and size; NULL / 0
 * for i out of range. */
ARENA_API const char *arena_block_name(const arena *a, size_t i);
ARENA_API void *arena_block_device(const arena *a, size_t i);
ARENA_API uint64_t arena_block_bytes(const arena *a, size_t i);

typedef struct arena_tensor_info {
	const char *name;       /* borrowed: valid while the arena lives */
	const char *dtype;      /* original dtype ("BF16") */
	uint32_t rank;
	const uint64_t *shape;  /* original shape, rank dims */
	const char *scheme;     /* "none" or a storage scheme (docs/QUANT.md) */
	uint32_t block;         /* index of its block */
	uint32_t n_components;
	struct {
		const char *name;   /* "data", "qdata", "scale" */
		const char *dtype;
		uint32_t rank;
		const uint64_t *shape;
		uint64_t bytes;
		uint64_t offset;    /* in its block's slab: the same offset in a streamed
				     * block's acquired bytes (a view without asking again) */
		void *device;       /* resident blocks: the device address; else NULL */
		const void *host;   /* in the host copy of its block, or NULL */
	} component[4];
} arena_tensor_info;

ARENA_API size_t arena_tensor_count(const arena *a);
/* Tensor i (sorted by name): 0, or USAGE when i is out of range. */
ARENA_API int arena_tensor_get(const arena *a, size_t i, arena_tensor_info *out);
/* The index of the tensor called `name`: 0, or NOT_FOUND. */
ARENA_API int arena_tensor_find(const arena *a, const char *name, size_t *index);
/* Tensor i stored torch-subclass (the inner tensors of a PyTorch tensor
 * subclass as its components, docs/QUANT.md "Tensor subclasses"): the
 * manifest's "subclass" object, compact JSON, borrowed (valid while the
 * arena lives). NULL for another scheme or i out of range. */
ARENA_API const char *arena_tensor_subclass(const arena *a, size_t i);
/* Write the values of tensor `tensor`, stored quantized (docs/QUANT.md), in
 * its original dtype (BF16, F16 or F32) and shape, contiguous, to `dst`:
 * qdata x scale in f32, rounded once to nearest even, bit for bit what
 * torch's (qdata.float() * scale).to(dtype) gives (a NaN becomes 0x7FC0 in
 * BF16); int4 schemes: ((q - zero) x scale) per group, the same way.
 * `block` is the address of the tensor's block, exactly: an acquire's
 * (while it is held: until its release) or a resident block's device
 * address (arena_block_get, arena_block_device); any other pointer, one
 * inside the block's bytes too, is USAGE.
 * cuda: one kernel queued on `stream` after the work queued there so far,
 * dst device memory; sim: done before it returns, dst host memory.
 * USAGE: index out of range, NULL block or dst, a block address that is
 * not the tensor's block's, a tensor stored as is or from an 8-bit source,
 * a stream handle on sim; DEV_ERROR when the launch fails. */
ARENA_API int arena_tensor_dequantize(arena *a, size_t tensor, const void *block, void *dst, void *stream);
/* An activation's rows to FP8 e4m3, for a native FP8 product
 * (torch._scaled_mm; docs/QUANT.md "Native FP8"): x is BF16 [rows, cols],
 * contiguous; q gets rows x cols FP8 e4m3 bytes and scale one f32 a row:
 * scale = max(amax(|row|) / 448, 1e-12) in f32, q = x / scale rounded to
 * nearest even and saturated to +-448 (NaN stays NaN; a NaN in a row makes
 * its scale NaN), bit for bit torch's ((x.float() / s).clamp(-448,
 * 448)).to(float8_e4m3fn). One pass over x. cuda: device memory, one kernel
 * queued on `stream` after the work queued there so far; sim: host memory,
 * done before it returns. No rows: nothing done (NULL pointers allowed where
 * nothing is read or written). USAGE: a NULL pointer that would be used, 2^31
 * rows or more; DEV_ERROR when the launch fails. */
ARENA_API int arena_fp8_quantize_rows(arena *a, const void *x, uint64_t rows, uint64_t cols, void *q, float *scale,
				      void *stream);
/* The same with each element first multiplied by its column's scale,
 * col_scale[cols] (f32, on x's device), in f32: the row rule applies to
 * x[r][c] * col_scale[c], bit for bit torch's (x.float() * col_scale) then
 * as above. For the FP8 backward through a weight with one scale a row
 * (docs/QUANT.md "Native FP8"): the output's gradient times the weight's
 * row scales, quantized a row. USAGE also for a NULL col_scale with rows and
 * cols. */
ARENA_API int arena_fp8_quantize_rows_scaled(arena *a, const void *x, uint64_t rows, uint64_t cols,
					     const float *col_scale, void *q, float *scale, void *stream);
/* An FP8 matrix (any one-byte elements) transposed: x [rows, cols],
 * contiguous, into t [cols, rows] (t[c][r] = x[r][c]). For the FP8
 * backward (docs/QUANT.md "Native FP8"): the input's gradient multiplies
 * the weight's bytes [N, K] along N, and torch._scaled_mm takes that
 * operand as [K, N] rows. One pass (rows and cols multiples of 16 with both
 * addresses 16-byte aligned go by 16-byte words). cuda: device memory, one
 * kernel queued on `stream` after the work queued there so far; sim: host
 * memory, done before it returns. No rows or no cols: nothing done. USAGE:
 * a NULL pointer that would be used, 2^31 rows or columns or more, x and t
 * overlapping, a stream handle on sim; DEV_ERROR when the launch fails. */
ARENA_API int arena_fp8_transpose(arena *a, const void *x, uint64_t rows, uint64_t cols, void *t, void *stream);

/* ---- writing images ---------------------------------------------------------- */

/* ---- steps: acquire and release blocks ------------------------------------- */

/* Start a step. USAGE inside a step or after close. DEV_OOM when the ring of
 * streamed blocks, which a step end could not place (below), still finds no
 * room: the arena is not failed, and a later call places it once the device
 * has the memory. */
ARENA_API int arena_step_begin(arena *a);
/* Make `stream` wait for block `block`'s bytes and write their device
 * address to *dptr, valid until the matching release (the same offsets as
 * the slab: tensor i's component c is at *dptr + component[c].offset).
 * A block may be acquired again while held (each acquire needs a release).
 * Errors: USAGE (outside a step, index out of range, the blocks held fill
 * the ring, a stream handle on sim), the engine's device errors (which
 * leave the arena failed: every later call returns the error). */
ARENA_API int arena_block_acquire(arena *a, size_t block, void *stream, void **dptr);
/* The same by name, also writing the block's index (index may be NULL). NOT_FOUND for a name not in the model. */
ARENA_API int arena_block_acquire_name(arena *a, const char *name, void *stream, void **dptr, size_t *index);
/* The work queued on `stream` so far is the last use of one acquire of the
 * block: after it the block's ring bytes may be reused. USAGE when the
 * block is not acquired. */
ARENA_API int arena_block_release(arena *a, size_t block, void *stream);
/* End the step: every acquire must have been released (USAGE otherwise,
 * naming a block still held; the step goes on). Adapts to device memory
 * (demotes at once under pressure, promotes after `hysteresis` steps of
 * room), learns the order run, and issues the next step's first copies.
 * DEV_OOM when the ring of streamed blocks cannot be placed even with every
 * block demoted (another program took the device's memory): the step has
 * ended all the same and the arena is not failed; the next arena_step_begin
 * places the ring, or returns DEV_OOM while it cannot. */
ARENA_API int arena_step_end(arena *a);
/* ---- the process's device memory -------------------------------------------
 *
 * A process holds, besides arena's device memory (resident blocks, the ring,
 * decode stages), its CUDA context and loaded modules (0.5-0.7 GiB on an
 * H200) and the memory of the rest of it: the caller's framework, whose
 * caching allocator (torch's) holds what it reserved, not only what is in
 * use. The cap (vram_cap) is on all of it, as the driver counts it (NVML's
 * per-process figure on cuda; sim models it: a context size and
 * arena_sim_rest). So the weights' budget for a step is
 *
 *     with a cap:  cap - other - max(rest now, rest need) - headroom
 *     always:      free + arena's own - max(0, rest need - rest now)
 *                  - max(headroom, share_card)
 *
 * (the lesser of the two; share_card, without a cap, what the plan leaves
 * other programs: arena_open_options), where `other` is what the process holds beside
 * arena and the rest (its context: the process's figure less both, read at
 * each step end; where the backend cannot read it, the device's use at
 * open less both, at most 1 GiB) and `rest need` is what the rest needs at
 * its peak in the next step: the reserve given; or, learned
 * (ARENA_OPEN_LEARN_REST), the most it held in a step of the same mode and
 * work (arena_rest_report's peak, for each work key), plus a margin (1/32
 * and 64 MiB); for a work not seen yet, everything past the smallest plan
 * (unless the whole model fits in half of what there is). Blocks are
 * demoted or promoted at the step end to fit.
 *
 * Inside a step arena's own memory does not change; the rest must then stay
 * within `rest_limit` (arena_memory_get): cap - other - arena's -
 * headroom / 2. arena.torch gives torch's allocator that limit
 * (torch.cuda.set_per_process_memory_fraction), so that a process under
 * vram="8G" behaves as it would on an 8 GiB card, and says what a step
 * needed when torch runs out inside it. */

/* What the rest of the process held on the device, reported at a step's
 * end (before arena_step_end; between steps it counts for the next one): `now` the bytes it holds at this moment (torch:
 * torch.cuda.memory_reserved()), `peak` the most it held during the step
 * that ends (torch.cuda.max_memory_reserved() since the last report, its
 * peak statistics reset then; 0 = now), and `work` a key naming the work of
 * the next step: steps with equal keys need the same memory (arena.torch:
 * a hash of the mode, autograd and the inputs' shapes and dtypes); 0 = the
 * same work as the step that ends. The engine learns the peak of the step
 * that ends under its own mode and work, and plans the next step's budget
 * for the next work at arena_step_end (and at arena_set_mode); told between
 * steps, another work is planned for at once (blocks demoted when it needs
 * more room). Without ARENA_OPEN_LEARN_REST only `now` counts (the reserve
 * stays as given). USAGE for a handle not live or a NULL report; the
 * engine's device errors. */
typedef struct arena_rest_info {
	uint64_t now;
	uint64_t peak;
	uint64_t work;
	unsigned flags; /* ARENA_REST_OOM, or 0 */
} arena_rest_info;
/* arena_rest_info.flags: `peak` is what the rest needed when it ran out of
 * device memory (torch's out-of-memory: what it held and asked for). The
 * plan changes it makes are recorded with why ARENA_WHY_OOM. Told between
 * steps, it is planned for at once (blocks demoted now, not at the next
 * step end: with ARENA_OPEN_LEARN_REST the peak is learned for the work of
 * the step about to begin; without, `now` counts), so that the step can be
 * run again with that room. */
#define ARENA_REST_OOM 1u
ARENA_API int arena_rest_report(arena *a, const arena_rest_info *r);
/* The same with now = peak = bytes, work 0 (the call of releases before
 * learning; kept as it was). */
ARENA_API int arena_set_rest_memory(arena *a, uint64_t bytes);

/* The process's device memory as the engine sees it now. */
typedef struct arena_memory_info {
	uint64_t cap;        /* vram_cap; 0 = none */
	uint64_t process;    /* the process's bytes as the driver counts them, read now (0: unknown) */
	uint64_t other;      /* of it, neither arena's nor the rest's (context, modules), as read
			      * at the last step end, mode change or open (read inside a step,
			      * the rest's memory not yet reported would be in it); measured or
			      * estimated (other_measured) */
	uint64_t arena;      /* arena's device bytes: resident blocks, ring, stages, as allocated */
	uint64_t rest;       /* the rest's, as last reported */
	uint64_t rest_need;  /* what the plan in force leaves the rest at its peak */
	uint64_t rest_limit; /* the most the rest may hold in a step for the process to stay within
			      * the cap (0: no cap) */
	uint64_t headroom;
	int learned;         /* rest_need was learned for the work of the next step (0: the reserve
			      * given or the default; or, learning, a work not seen: the safe plan) */
	int other_measured;  /* other was read from the driver (1) or estimated (0) */
	unsigned works;      /* works learned so far */
	uint64_t share_card; /* device bytes the plan leaves free for other programs at every
			      * step end (arena_open_options.share_card resolved); 0 = none */
} arena_memory_info;
/* 0, or USAGE (not live, NULL out). */
ARENA_API int arena_memory_get(const arena *a, arena_memory_info *out);

/* Between steps: run in `mode` from the next step on (a trainer drawing
 * previews switches to sample and back), with that mode's ring (its depth
 * as arena_open_options.depth says). The blocks resident stay where the
 * new mode's budget allows. USAGE inside a step, for an unknown mode, or
 * for a depth given at open too small for the mode (the mode stays). */
ARENA_API int arena_set_mode(arena *a, int mode);
/* The mode now, or -1 for a handle that is not live. */
ARENA_API int arena_mode(const arena *a);
/* Wait for the engine's copies and read the device's timing of the steps
 * run (their records' gpu_* fields). Not inside a step (USAGE). */
ARENA_API int arena_sync(arena *a);

/* One step's record: every decision the engine made. */
typedef struct arena_step_info {
	uint64_t step;           /* 0, 1, ... */
	int mode;                /* ARENA_MODE_* the step ran in */
	uint64_t budget;         /* weight bytes allowed when it ended */
	uint64_t free_bytes;     /* device memory free when it ended */
	uint64_t resident_bytes; /* resident after it (globals included) */
	uint64_t ring_bytes;     /* the ring's device memory */
	uint64_t streamed_bytes; /* copied into the ring during the step */
	uint64_t copies;
	uint64_t promoted_bytes; /* copied to the device by promotions */
	uint64_t acquires;       /* of blocks other than globals */
	unsigned misses;         /* acquires out of the order expected (fetched when asked) */
	unsigned demotions, promotions;
	int over_budget;         /* nothing left to demote and still over */
	int schedule_learned;    /* the order run became the schedule */
	int stopped_early;       /* ended before its schedule did */
	int profile_learned;     /* the plan changed by the compute profile learned */
	/* Timed on the device once the step's work is done (0 until then, and on
	 * backends that cannot time): acquires that waited for a copy, how long
	 * they waited, the time between acquires and releases. */
	int gpu_timed;
	unsigned stalls;
	double stall_s, compute_s;
	/* Host seconds: its arena_step_end call, the planning in it (or in a
	 * mode change before it), the moves of blocks to and from the device in
	 * it. A caller waiting for its steps leaves the device idle that long. */
	double end_s, plan_s, move_s;
	uint64_t disk_bytes;     /* read from the image during it (the disk tier; reads for
				  * the next step's first copies count here): the blocks'
				  * bytes, or an hb4 image's coded bytes when read coded */
	uint64_t moved_bytes;    /* host-to-device bytes of the copies in streamed_bytes and
				  * promoted_bytes: fewer when blocks are held coded (coded
				  * streaming, an hb4 image) */
	double disk_wait_s;      /* host seconds the disk tier's copies waited for their reads
				  * (read ahead of use on a thread of their own: the disk's
				  * time beyond what the steps' work hid) */
	/* A look at the learned compute profile was taken at its end (whether
	 * moved to or not: profile_learned), and the seconds its plan took on
	 * a thread of its own beside the steps; the steady step the profile it
	 * learned predicts for the plan in force and for the look's plan (moved
	 * to when the look's is 2 % faster at the first look, 4 % at later
	 * ones, and the move pays; 0 where not predicted). */
	int looked;
	double look_s, look_now_s, look_plan_s;
	/* A move only a prediction asked for (a look, or a plan made anew
	 * whose own set is predicted faster than the one nearest the set
	 * resident) is made when it pays for itself within payback_steps
	 * (arena_open_options; 16 by default): its estimated host seconds, the
	 * seconds a step it was predicted to save (less the reads from the image
	 * it adds to each step where demoted blocks go past host_budget, at 4
	 * GB/s), and whether it was held back for that. */
	double move_est_s, move_gain_s;
	int move_held;
	/* Host copies of the blocks this step end's moves demoted: the bytes
	 * read from the image for them in the step end (on the caller's
	 * thread, in move_s), and the bytes a look at the learned profile read
	 * ahead for them on its own thread, beside the step before. */
	uint64_t host_read_bytes, prepared_bytes;
} arena_step_info;

/* Steps ended so far. */
ARENA_API uint64_t arena_step_count(const arena *a);
/* The record of step `step`: 0, or NOT_FOUND when it is not (or no longer:
 * the last 256 are kept) there. */
ARENA_API int arena_step_get(const arena *a, uint64_t step, arena_step_info *out);

/* ---- decisions: why the plan changed ------------------------------------------
 * Each change of the plan (blocks promoted to the device or demoted from it,
 * the ring made anew) is recorded once, with what moved, why, and the step
 * the plan predicts before and after. `arena bench stream --log` prints them;
 * Python's Arena.decisions() and the adapter's Handle.decisions() return them. */

/* Why the plan changed. The engine names the input that moved most since
 * the last change: the device's free memory (PRESSURE, YIELD) or what the
 * rest of the process needs (NEED, OOM); a move neither explains comes from
 * what it learned (LEARNED) or is the plan made anew (REPLAN). */
enum {
	ARENA_WHY_LEARNED = 1, /* the compute profile learned on the device (a look at it), or the order
				* learned from the steps run */
	ARENA_WHY_PRESSURE,    /* the device's free memory changed: another program took memory
				* (demotions) or gave it back (promotions) */
	ARENA_WHY_YIELD,       /* share_card: another program took memory: blocks demoted so that the
				* share is free again */
	ARENA_WHY_NEED,        /* the rest of the process needs more (demotions) or less (promotions):
				* its need learned per work, a work told, what it holds now */
	ARENA_WHY_OOM,         /* the same, its need told after it ran out of memory (ARENA_REST_OOM) */
	ARENA_WHY_MODE,        /* arena_set_mode */
	ARENA_WHY_SCHEDULE,    /* arena_schedule_set */
	ARENA_WHY_PROFILE,     /* arena_profile_set */
	ARENA_WHY_REPLAN       /* the plan made anew with none of the above moved (it is made again every
				* 64 steps; a move held back before) */
};

typedef struct arena_decision_info {
	uint64_t step;           /* the step whose record (arena_step_get) counts it: the step at whose
				  * end it was made, or, made between steps (a mode, schedule, profile
				  * or need told), the step about to begin */
	int between;             /* 1: made between steps; 0: at the step's end */
	int why;                 /* ARENA_WHY_* */
	const char *why_name;    /* "learned", "pressure", "yield", "need", "oom", "mode", "schedule",
				  * "profile", "replan" (static) */
	unsigned promoted, demoted;             /* blocks (pieces, in a model in pieces) */
	uint64_t promoted_bytes, demoted_bytes;
	uint64_t resident_before, resident_after; /* resident bytes, globals included */
	uint64_t ring_before, ring_after;         /* the ring's device bytes */
	uint64_t budget;         /* the weights' budget it was made for */
	uint64_t free_bytes;     /* the device's free memory read then */
	uint64_t stream_before, stream_after;     /* bytes a steady step streams, predicted */
	double step_before_s, step_after_s;       /* a steady step, predicted by the compute profile
						   * in force (given or learned); 0 without one */
} arena_decision_info;

/* Decisions made so far (the plan as arena_open made it is none). */
ARENA_API uint64_t arena_decision_count(const arena *a);
/* Decision i (0 the first): 0, or NOT_FOUND when it is not (or no longer:
 * the last 256 are kept) there. USAGE: not live, NULL out. */
ARENA_API int arena_decision_get(const arena *a, uint64_t i, arena_decision_info *out);

/* The plan in force. */
typedef struct arena_plan_info {
	int mode;
	uint64_t budget;         /* bytes for weights */
	uint64_t headroom, reserve;
	uint64_t globals_bytes, resident_bytes; /* resident_bytes includes globals */
	uint64_t streamed_block_bytes;
	uint64_t slot_bytes;     /* the largest streamed block; 0 when nothing streams */
	unsigned slots, depth;
	uint64_t need_bytes;     /* resident + slots x slot_bytes */
	uint64_t min_need_bytes; /* what the smallest plan needs */
	uint64_t stream_bytes_per_step; /* predicted */
	uint64_t copies_per_step;
	size_t n_resident, n_streamed; /* blocks other than globals */
	size_t schedule_length;  /* entries of the schedule (arena_schedule_get) */
	double predicted_step_s; /* by the compute profile; 0 without one */
	uint64_t piece_size;     /* blocks streamed in pieces of at most this; 0 whole blocks */
	uint64_t host_bytes;     /* host copies of blocks held (streamed blocks, and demoted ones) */
	size_t n_disk;           /* blocks with no copy but in the image (the disk tier) */
	uint64_t host_budget;    /* all the host memory the weights may take: host copies and staging
				  * (0: no limit) */
	uint64_t staging_bytes;  /* an image's: of the host budget, the disk tier's reads' (the stager's
				  * slots and the re-readers' chunk buffers), host copies never use it */
} arena_plan_info;

ARENA_API int arena_plan_get(const arena *a, arena_plan_info *out);

/* How an arena holds its host copies (ARENA_OPEN_SHARE_HOST). */
#define ARENA_SHARE_OFF 0     /* sharing not asked for, or no host copies to share */
#define ARENA_SHARE_LOADED 1  /* this process loaded the region the others map */
#define ARENA_SHARE_MAPPED 2  /* it maps a region another process loaded, checked against the image */
#define ARENA_SHARE_PRIVATE 3 /* asked for, not possible: a private copy (why says why) */
typedef struct arena_share_info {
	int state;                 /* ARENA_SHARE_* */
	char why[320];             /* PRIVATE: the one-line reason, e.g. "host share: the share folder
				    * /dev/shm/arena-0 belongs to user 1000, not to this process's user 0";
				    * "" otherwise */
	double check_s;            /* a region mapped (or given up on after its check): seconds
				    * checking it against the image */
	uint64_t checked_bytes;    /* region bytes checked: hashed against chunk checksums, or compared */
	uint64_t check_read_bytes; /* image bytes read for the check */
} arena_share_info;
ARENA_API int arena_share_get(const arena *a, arena_share_info *out);
/* The schedule the engine prefetches by: up to `cap` block indices into
 * `blocks`, the length into *n. */
ARENA_API int arena_schedule_get(const arena *a, uint32_t *blocks, size_t cap, size_t *n);
/* Between steps: the order the caller will acquire blocks in from the next
 * step on (n block indices, repeats allowed, the globals block not; at most
 * 8 entries a block), in the mode in force, as if a step had run it: the
 * engine prefetches by it and plans for it (the blocks resident stay where
 * the budget allows; blocks it does not name give way to those it names,
 * and stay only where room is left, their host copies kept for the next
 * such change), and goes on learning the order run (unless
 * ARENA_OPEN_FIXED_SCHEDULE). For a caller whose steps run different sets of
 * blocks (a pipeline's components through one arena: each one's order, read
 * with arena_schedule_get after its step, set before its next), or that knows
 * the order before the first step. USAGE inside a step, for an empty or too
 * long schedule or an entry out of range or the globals block; the engine's
 * device errors. */
ARENA_API int arena_schedule_set(arena *a, const uint32_t *blocks, size_t n);

/* The device's free and total memory now, as the backend sees it (sim: its
 * capacity less what is allocated and held as pressure). */
ARENA_API int arena_device_memory(const arena *a, uint64_t *free_bytes, uint64_t *total_bytes);

/* ---- compute profiles ---------------------------------------------------------
 * A profile is each block's forward compute seconds, the host-to-device
 * rate and the backward factor; with one, the engine places resident blocks
 * where they hide copies best. */

/* The profile in use or learned so far: `cost` has room for n =
 * arena_block_count entries. NOT_FOUND while a scheduled block has not been
 * timed (or the backend cannot time and none was given). */
ARENA_API int arena_profile_get(const arena *a, double *cost, size_t n, double *h2d_bytes_per_s, double *backward_factor);
/* Plan by this profile from the next step on (n = arena_block_count; globals' entry ignored;
 * backward_factor 0 = 3). Between steps. */
ARENA_API int arena_profile_set(arena *a, const double *cost, size_t n, double h2d_bytes_per_s, double backward_factor);
/* Write the profile (given or learned; as arena_profile_get) to `path`, for
 * `arena plan --profile`. The file appears whole or not at all; a path that
 * is the image the arena was opened from is OUTPUT_IS_INPUT. */
ARENA_API int arena_profile_save(const arena *a, const char *path);

/* ---- traces: what the device did, step by step ---------------------------------
 * A trace is a timeline of the engine's work in Chrome's trace-event JSON
 * format: open it in https://ui.perfetto.dev (or chrome://tracing). Tracks:
 * the copy stream (each host-to-device copy: block, bytes, GB/s), the
 * caller's stream (each block's work from the moment its bytes were there
 * to its release, with the stall before it where the stream waited for a
 * copy), and the engine's host decisions (step boundaries, demotions,
 * promotions, mode switches) with counters of resident, ring and free
 * device bytes. Copies and the caller's work are timed by the device
 * (cuda events; sim markers), so the picture is what the GPU did. The
 * tracks and fields are described in docs/CLI.md. */

/* Start recording a trace, to be written to `path` by arena_trace_end.
 * Between steps. max_events: records kept (a copy, an acquire-release, an
 * instant, a counter sample); 0 = 65536, at most 16777216; what does not
 * fit is dropped and the file says how many (otherData.dropped_records).
 * Recording allocates nothing per call. The copies already issued for the
 * next step when the trace begins are not in it. Errors: USAGE (NULL path,
 * inside a step, a trace already running, max_events too large, a path
 * that is a folder, a backend that cannot time), NOT_FOUND (no such
 * folder), OUTPUT_IS_INPUT (the image the arena was opened from), IO,
 * NOMEM, DEV_ERROR. */
ARENA_API int arena_trace_begin(arena *a, const char *path, size_t max_events);
/* Wait for the device's times of the work traced and write the file: it
 * appears whole or not at all. USAGE inside a step or when no trace is
 * being recorded; IO when it cannot be written. arena_close writes a trace
 * not ended (an error there is lost: end it to see one), unless a step is
 * in progress: then it is dropped. */
ARENA_API int arena_trace_end(arena *a);

/* ---- files: convert, verify, inspect -------------------------------------------
 * What `arena convert`, `arena verify` and `arena inspect` do (the command
 * is built on these), for programs. None needs a device. */

/* Progress of a long call: `done` of `total` bytes. done never goes back
 * and the last call has done == total. Calls come one at a time, from one
 * of the call's threads (not always the caller's), a few times a second at
 * most for convert, after each chunk for verify. Return 0 to go on;
 * nonzero cancels: the call stops within a chunk's work and fails with
 * CANCELLED, leaving nothing behind (a convert's output does not appear).
 * The call convert makes once its image is in place cannot cancel it. */
typedef int (*arena_progress_fn)(void *ctx, uint64_t done, uint64_t total);

/* Zero-initialize and set what you need; every 0 / NULL is the default (the
 * CLI's defaults are these). */
typedef struct arena_convert_options {
	/* Blocks (docs/CLI.md, "Blocks"): POSIX extended regexes with one capture
	 * group for the index ("layers\\.([0-9]+)\\."), replacing the built-in
	 * patterns; and containers in execution order. */
	const char *const *block_patterns;
	size_t n_block_patterns;
	const char *const *block_order;
	size_t n_block_order;
	/* Store selected weights quantized (docs/QUANT.md): a scheme
	 * ("fp8-e4m3-row", "int8-row", ...), or NULL / "none" (as stored); and
	 * globs of tensor names also quantized, or never. */
	const char *quant;
	const char *const *quant_include;
	size_t n_quant_include;
	const char *const *quant_exclude;
	size_t n_quant_exclude;
	uint64_t chunk_size;   /* checksum chunk, a power of two from 64 KiB to 1 GiB; 0 = 4 MiB */
	const char *codec;     /* chunk codec: "none" (or NULL), "hb4" or "zstd" (docs/FORMAT.md) */
	int zstd_level;        /* 1..19, with codec "zstd" only; 0 = 1 */
	unsigned threads;      /* worker threads, at most 256; 0 = CPUs */
	arena_progress_fn progress; /* or NULL */
	void *progress_ctx;
	/* 1: a file at `out` is replaced (whole, when the new one is); 0: it is
	 * OUTPUT_EXISTS, said before the conversion starts (`arena convert
	 * --force`, Python's force=True). */
	int force;
	/* 1: each chunk is read back after it is written (from the disk, after a
	 * direct write; through the page cache, which keeps it for the load that
	 * follows) and compared with what was written, so the image comes out
	 * verified, its reads beside the other chunks' writes rather than a pass
	 * of their own after them (arena.cache's entries); 0: not read back
	 * (`arena verify` checks an image later). */
	int read_back;
} arena_convert_options;

typedef struct arena_convert_info {
	uint64_t file_size;    /* the image's bytes */
	uint64_t data_bytes;   /* its data region, raw */
	uint64_t stored_bytes; /* its data as stored (coded chunks take less) */
	uint64_t chunk_count;
	uint64_t coded_chunks; /* chunks stored with the codec */
	uint64_t n_blocks, n_tensors;
} arena_convert_info;

/* Convert the safetensors checkpoint made of `inputs` (each a .safetensors
 * file, a sharded checkpoint's index.json, or a folder holding either;
 * together one model) into the arena image `out`. `out` appears only when
 * whole: a failure, a cancel or a kill leaves nothing there and no
 * temporary; an existing file there is replaced only with opt->force.
 * `info` may be NULL.
 * Errors: USAGE (bad options: the message names the field; no inputs),
 * OUTPUT_IS_INPUT, OUTPUT_EXISTS, NOT_FOUND, the inputs' ST_* / IDX_* / DUPLICATE_TENSOR /
 * PLAN_* errors, INPUT_CHANGED (an input shorter than when it was opened),
 * QUANT_*, IO, NOMEM, CANCELLED. */
ARENA_API int arena_convert(const char *const *inputs, size_t n_inputs, const char *out,
			    const arena_convert_options *opt, arena_convert_info *info);

/* ---- writing an image tensor by tensor -------------------------------------------
 * The image arena_convert makes of a checkpoint, from tensors a program hands
 * over in memory rather than a file on disk: weights it makes (random ones of
 * a model's shapes: arena_gpu.torch.synth_image), a model it holds a block at
 * a time. Only one block's tensors need to exist at once; the writer keeps
 * the bytes of one chunk (a chunk that runs on into the next block) and its
 * threads' chunk buffers (as arena_convert).
 *
 * open: `header` is the JSON of a safetensors file's header (NUL-ended: each
 * tensor's "dtype", "shape" and "data_offsets" in a file holding them back
 * to back, "__metadata__" optional), as strict as a file's; `label` is the
 * source's name in messages and in the manifest's "source" (its path; its
 * size is the file's the header describes). The image is the one
 * arena_convert makes of that file with the same options: the same plan,
 * quantization (opt->quant: the bytes of every block identical), codec and
 * chunks; only the manifest's "source" differs. Checked at open, before
 * anything is written: the options as arena_convert does (opt->progress must
 * be NULL: the caller's puts are its progress), OUTPUT_EXISTS, the header's
 * ST_* rules, the plan's and quantization's errors; tensors stored already
 * quantized (an F8_E4M3 tensor with its "<name>_scale", which arena_convert
 * keeps as they are) are USAGE. On success the output's room is reserved
 * (a full disk is IO now, not later).
 *
 * The blocks come in the image's order (arena_writer_block_*: block 0 is
 * "globals" when the model has tensors outside its repeated blocks), and a
 * block's tensors in any order: arena_writer_put hands one tensor's bytes
 * (nbytes, its dtype and shape's; borrowed, not copied). The put that gives
 * a block its last tensor writes the block (quantized, coded, checksummed,
 * on opt->threads threads) and returns once it is written: then none of the
 * block's bytes is used again. A tensor of a later block while the current
 * one lacks some is USAGE naming the first missing one; a name the header
 * has not, a tensor put twice or nbytes not its size is USAGE too. A failed
 * put leaves the writer failed: later calls return its error.
 *
 * finish: every block written, the image is linked in at `out` whole (as
 * arena_convert's: a failure, an abort or a kill leaves nothing there) and
 * `info` (may be NULL) filled; a block not complete is USAGE naming its first
 * missing tensor. finish and abort free the writer, whatever they return.
 * One thread at a time per writer. */
typedef struct arena_writer arena_writer;
ARENA_API int arena_writer_open(const char *out, const char *header, const char *label,
				const arena_convert_options *opt, arena_writer **w);
ARENA_API size_t arena_writer_block_count(const arena_writer *w);
/* Block i's name, or NULL past the last. */
ARENA_API const char *arena_writer_block_name(const arena_writer *w, size_t i);
/* The number of tensors to put for block i (0 past the last), and the name
 * of its k-th (NULL past the last), in the block's order in the image. */
ARENA_API size_t arena_writer_block_tensors(const arena_writer *w, size_t i);
ARENA_API const char *arena_writer_tensor_name(const arena_writer *w, size_t i, size_t k);
ARENA_API int arena_writer_put(arena_writer *w, const char *name, const void *data, uint64_t nbytes);
ARENA_API int arena_writer_finish(arena_writer *w, arena_convert_info *info);
ARENA_API void arena_writer_abort(arena_writer *w);

/* A chunk of an image whose checksum does not hold (arena_verify). */
typedef struct arena_bad_chunk {
	uint64_t chunk;          /* its index */
	uint64_t offset, length; /* its bytes in the file */
	uint64_t expected, actual; /* xxh3-64 of the chunk table, and of the bytes */
	const char *const *blocks;  /* the blocks it covers (borrowed: valid during the call) */
	size_t n_blocks;
	const char *const *tensors; /* the tensors it covers */
	size_t n_tensors;
} arena_bad_chunk;

typedef struct arena_verify_options {
	unsigned threads;            /* reader threads, at most 64; 0 = CPUs, at most 8 */
	arena_progress_fn progress;  /* stored bytes checked; or NULL */
	void *progress_ctx;
	/* Called for each bad chunk in file order, from the calling thread, after
	 * all are read; or NULL. */
	void (*bad_chunk)(void *ctx, const arena_bad_chunk *chunk);
	void *bad_chunk_ctx;
} arena_verify_options;

typedef struct arena_verify_info {
	int opened;            /* 1: the header, manifest and chunk table held (the fields below are set) */
	uint64_t file_size;
	uint64_t chunk_count;
	uint64_t bad_chunks;   /* chunks whose checksum does not hold */
	double seconds;        /* the whole call */
} arena_verify_info;

/* Check the arena image at `path` completely: header, manifest and chunk
 * table (checksums and structure), then every data chunk's checksum, and a
 * coded chunk's structure and padding. 0 only when everything holds.
 * Errors: IMG_CHUNK_CHECKSUM (its message names the first bad chunk and the
 * blocks and tensors it holds; every bad chunk goes to bad_chunk and is
 * counted in info), any other IMG_* error, NOT_FOUND, INPUT_NOT_READABLE,
 * INPUT_CHANGED (the file is shorter than when it was opened), IO, NOMEM,
 * CANCELLED. `opt` and `info` may be NULL; info is filled on
 * failure too. */
ARENA_API int arena_verify(const char *path, const arena_verify_options *opt, arena_verify_info *info);

/* What the checkpoint or image at `path` holds, as the JSON document `arena
 * inspect --json` prints (schema in docs/CLI.md): for a safetensors file, an
 * index or a folder (validated by the rules convert applies), its files,
 * metadata, tensors and totals by dtype; for an arena image (its header,
 * manifest and chunk table checked, not its data: arena_verify), its
 * layout, coding, metadata, sources, blocks and tensors. On success *json
 * is a NUL-terminated UTF-8 string for arena_string_free. Errors: those of
 * reading the input (ST_*, IDX_*, IMG_*, NOT_FOUND, NO_CHECKPOINT,
 * INPUT_NOT_READABLE, INPUT_CHANGED, IO), NOMEM. A valid input with no
 * tensors (a header of `__metadata__` alone, or `{}`) is described: no
 * tensors, its metadata; convert and arena_open refuse it (PLAN_EMPTY). */
ARENA_API int arena_inspect(const char *path, char **json);
/* Free a string the library returned. Accepts NULL. */
ARENA_API void arena_string_free(char *s);

/* ---- the simulator ----------------------------------------------------------- */

/* sim only: take `bytes` of the simulated device, as another program would
 * (0 gives it back). USAGE on other backends; DEV_OOM when it is not free. */
ARENA_API int arena_sim_pressure(arena *a, uint64_t bytes);
/* sim only: the rest of this process (its framework's allocator) holds
 * `bytes` of the simulated device from now on, counted as the process's
 * (the modelled torch; report it with arena_rest_report). USAGE on other
 * backends; DEV_OOM when the device has not that much free (as cudaMalloc
 * would fail), the rest unchanged. */
ARENA_API int arena_sim_rest(arena *a, uint64_t bytes);
/* sim only: of arena's device allocations from now on (resident blocks
 * promoted, the ring, decode stages), the first `after` go on as memory
 * allows and the `count` after them fail with DEV_OOM, as cudaMalloc fails
 * when another program took the memory (count 0 clears it). The engine
 * meets such a failure as it meets a real one (a promotion left streamed,
 * the ring fitted by demoting more). USAGE on other backends. */
ARENA_API int arena_sim_fail_alloc(arena *a, uint64_t after, uint64_t count);
/* sim only: the most device memory the simulated process held since the
 * arena was opened or the last call with reset set (context, rest and
 * every allocation: what NVML would have shown at its worst). */
ARENA_API int arena_sim_peak(arena *a, int reset, uint64_t *peak);

#ifdef __cplusplus
}
#endif
#endif /* ARENA_H */
