/* hostshare.h - one host copy of a model's streamed blocks for the
 * processes of one user on the host that open the same image with the same
 * layout (ARENA_OPEN_SHARE_HOST; docs/SHARING.md, its "Security" section
 * says what is trusted).
 *
 * The region is a memfd (memfd_create, MFD_CLOEXEC | MFD_ALLOW_SEALING): a
 * header page, then the host mapping's bytes (the model's host slabs and
 * coded copies, laid out as arena_model_prepare lays them out). Its size is
 * sealed when it is made (F_SEAL_SHRINK | F_SEAL_GROW: nobody can truncate
 * it under a process that maps it) and its bytes once they are loaded
 * (F_SEAL_FUTURE_WRITE: no write, no new writable mapping; the loader's own
 * mapping is read-only by then). Processes find it through a registry file,
 * DIR/arena-<32 hex>.lock, which names each process holding it ("pid fd
 * start-time" lines): a process maps a live holder's /proc/<pid>/fd/<fd>.
 *
 * DIR is $ARENA_SHARE_DIR, else /dev/shm/arena-<euid> (made 0700): it must
 * be a folder this user owns that no other user can write, or nothing is
 * shared. Registry files must be regular files of one link that this user
 * owns (opened with O_NOFOLLOW); a holder must be a process of this user
 * and its memfd this user's, named as ours, of the size its header says,
 * sealed. Anything else is not ours: never opened for writing, never
 * mapped. The bytes a process maps are checked against its own image by
 * the loader (runtime/share_check.c) before first use.
 *
 * The registry's lock (flock) is held only to read and rewrite its lines,
 * and is waited for at most arena__share_lock_wait_ms. The loader's line
 * is in the registry from the moment it makes the region: a process that
 * opens meanwhile finds it LOADING and waits, with the lock released,
 * until it is COMPLETE (then maps it), or its loader is gone (then loads
 * it itself), or the loader made no progress (its region's pages, its CPU
 * time) for arena__share_stall_ms (then uses a private copy). The memory is
 * the kernel's to free once the last descriptor and mapping are gone,
 * after a kill -9 too.
 *
 * Sharing never fails an open: whatever stops it (an untrusted folder or
 * file, a lock not granted in time, a stalled loader, a failed system call
 * of the sharing path) gives the caller a private copy and one line saying
 * why (ARENA_SHARE_WHY bytes). */
#ifndef ARENA_HOSTSHARE_H
#define ARENA_HOSTSHARE_H

#include <stdint.h>

typedef struct arena_host_share arena_host_share;

/* The region's format, in its header: processes of other versions of the
 * library never map each other's regions. */
#define ARENA_HOST_SHARE_VERSION 2u

/* Room for the one line that says why an open did not share. */
#define ARENA_SHARE_WHY 320

/* The region's identity: a hash of everything that decides its bytes (the
 * image's content checksums and the host mapping's layout), and the
 * image's identity alone (arena_host_share_image_bytes). */
typedef struct arena_share_key {
	uint64_t h[2];
	uint64_t image[2];
} arena_share_key;

/* Find the complete region `key` of `len` host bytes and map it read-only
 * (*complete = 1: its bytes are another process's, to be checked before
 * use), or make one, mapped writable (*complete = 0: the caller fills it
 * and calls arena_host_share_publish). When sharing is not possible,
 * *out is NULL and `why` says why (the caller uses private memory): 0 in
 * all three cases. NOMEM only when this call's own state cannot be
 * allocated. Nothing is left behind when *out is NULL. */
int arena_host_share_open(const arena_share_key *key, uint64_t len, arena_host_share **out, int *complete,
			  char why[ARENA_SHARE_WHY]);
/* The host bytes (page aligned). */
uint8_t *arena_host_share_base(const arena_host_share *s);
/* The loader's region is filled and committed (its mapping read-only):
 * sealed against writes and marked COMPLETE for the other processes: 0.
 * 1 when it cannot be (`why` says why): the registry forgets it and it
 * stays the caller's private memory. */
int arena_host_share_publish(arena_host_share *s, char why[ARENA_SHARE_WHY]);
/* Unmap and close; the registry forgets this process (and is removed when
 * no live holder remains). Accepts NULL. */
void arena_host_share_close(arena_host_share *s);

/* The host bytes of the largest complete region of image `image`
 * (arena_share_key.image) that a live process of this user holds, found
 * through the registry files, and never more than the memory its memfd
 * holds; 0 when there is none. A process that opens the image with a
 * layout like that one maps those bytes instead of allocating them, yet
 * the host's free memory (MemAvailable, the cgroup's) no longer counts
 * them: open adds them back to its host and pinned budgets. Never waits
 * (a registry locked or being loaded is skipped); sets no error. */
uint64_t arena_host_share_image_bytes(const uint64_t image[2]);

/* The region's name, "arena-<32 hex>" (a buffer of 48 bytes). */
void arena_share_key_name(const arena_share_key *key, char name[48]);

/* Tests: the nth system call of the sharing path from now (the folder's
 * mkdir and open, the registry's open, flock and writes, memfd_create,
 * ftruncate, the seals, mmap) fails with EIO (n >= 1; 0 disarms);
 * arena_fault_share_fired says whether it did. A delay in milliseconds
 * the loader waits before it publishes (0: none), to test a process that
 * opens meanwhile. How long a registry's lock is waited for (5000 ms) and
 * how long a loader may make no progress before a waiter gives up on it
 * (30000 ms), and how long a process's exit waits for the lock to drop
 * its lines (1000 ms). */
void arena_fault_share(long n);
int arena_fault_share_fired(void);
extern unsigned arena__share_publish_delay_ms;
extern unsigned arena__share_lock_wait_ms;
extern unsigned arena__share_stall_ms;
extern unsigned arena__share_exit_wait_ms;

#endif
