/* hostshare.h - one host copy of a model's streamed blocks for every process
 * on the host that opens the same image with the same layout
 * (ARENA_OPEN_SHARE_HOST; docs/SHARING.md).
 *
 * The region is a memfd (memfd_create, MFD_CLOEXEC): a header page, the
 * host mapping's bytes (the model's host slabs and coded copies, laid out
 * as arena_model_prepare lays them out), then `meta` bytes of the loader's
 * own (coded copies' segment tables). Processes find it through a registry
 * file, DIR/arena-<32 hex>.lock (DIR: $ARENA_SHARE_DIR, else /dev/shm),
 * which names each process holding it ("pid fd start-time" lines): a
 * process maps a live holder's /proc/<pid>/fd/<fd>. The memory is the
 * kernel's to free once the last descriptor and mapping are gone, after a
 * kill -9 too.
 *
 * Open holds flock(LOCK_EX) on the registry file: a process that finds no
 * complete region becomes the loader and keeps the lock until it publishes
 * (or fails, or dies: the lock goes with it); a process that opens
 * meanwhile blocks on the lock, then finds the region complete and maps
 * it, or (the loader failed or died) loads it itself. Registry lines of
 * dead processes (or of a pid now another process) are dropped when the
 * file is next rewritten; the last holder to close removes the file. */
#ifndef ARENA_HOSTSHARE_H
#define ARENA_HOSTSHARE_H

#include <stdint.h>

typedef struct arena_host_share arena_host_share;

/* The region's identity: a hash of everything that decides its bytes (the
 * image's content checksums and the host mapping's layout), and the
 * image's identity alone (arena_host_share_image_bytes). */
typedef struct arena_share_key {
	uint64_t h[2];
	uint64_t image[2];
} arena_share_key;

/* Find the complete region `key` of `len` host bytes and `meta` bytes
 * after them and map it (*complete = 1: the bytes are there, read-only by
 * contract: the caller must not write them), or make one (*complete = 0:
 * the caller fills it and calls arena_host_share_publish; the registry
 * stays locked until then). Both map it writable (CUDA registers writable
 * pages only): the caller makes it read-only. IO, NOMEM; nothing is left
 * behind on failure (no registry file this call made, no mapping). */
int arena_host_share_open(const arena_share_key *key, uint64_t len, uint64_t meta, arena_host_share **out,
			  int *complete);
/* The host bytes (page aligned) and the meta bytes. */
uint8_t *arena_host_share_base(const arena_host_share *s);
uint8_t *arena_host_share_meta(const arena_host_share *s);
/* The loader's region is complete: marked so, this process named in the
 * registry, the lock released. IO. */
int arena_host_share_publish(arena_host_share *s);
/* Unmap and close; the registry forgets this process (and is removed when
 * no live holder remains). An unpublished region is dropped (a process
 * waiting on it then loads). Accepts NULL. */
void arena_host_share_close(arena_host_share *s);

/* The host bytes (len + meta) of the largest complete region of image
 * `image` (arena_share_key.image) that a live process holds, found through
 * the registry files; 0 when there is none. A process that opens the image
 * with a layout like that one maps those bytes instead of allocating them,
 * yet the host's free memory (MemAvailable, the cgroup's) no longer counts
 * them: open adds them back to its host and pinned budgets. Never waits
 * (a registry being loaded is skipped); sets no error. */
uint64_t arena_host_share_image_bytes(const uint64_t image[2]);

/* The region's name, "arena-<32 hex>" (a buffer of 48 bytes). */
void arena_share_key_name(const arena_share_key *key, char name[48]);

/* Tests: the nth system call of the sharing path from now (open, flock,
 * memfd_create, ftruncate, mmap, the registry's writes) fails with EIO
 * (n >= 1; 0 disarms); arena_fault_share_fired says whether it did. And
 * a delay in milliseconds the loader waits, holding the lock, before it
 * publishes (0: none), to test a process that opens meanwhile. */
void arena_fault_share(long n);
int arena_fault_share_fired(void);
extern unsigned arena__share_publish_delay_ms;

#endif
