/* model.h - a loaded arena: a layout plus, per block, where its bytes live.
 *
 * A block is on the device (dev != NULL: its slab's bytes at dev), or in a
 * host slab (host != NULL: canonical bytes, read-only after commit, pinned
 * in place when the pinned budget allowed), or both.
 *
 * Life cycle (DESIGN.md invariant 4, transactional build):
 *   arena_model_prepare   allocate device memory and host slabs, take pinned
 *                         budget; nothing is visible to anyone yet
 *   (populate)            the loader fills dev and host bytes
 *   arena_model_commit    host slabs become read-only (mprotect) and are
 *                         pinned in place within the budget; the model is whole
 *   arena_model_free      releases everything, at any point (a failed build
 *                         calls it and leaves nothing behind)
 * Invariant 3 (canonical): after commit host slab bytes never change;
 * dropping a device copy never writes the host copy. */
#ifndef ARENA_MODEL_H
#define ARENA_MODEL_H

#include <stdint.h>

#include "../formats/layout.h"
#include "backend.h"
#include "budget.h"
#include "hostshare.h"

typedef struct arena_block_mem {
	void *dev;        /* device copy of the slab, or NULL */
	uint8_t *host;    /* host slab (4 KiB aligned), or NULL */
	int pinned;       /* host slab registered with the backend */
	int own_host;     /* host slab (or the wire's buffer) is a mapping of its own
			   * (arena_model_host_add, arena_model_wire_add) */
	/* Coded streaming: the block's host copy kept coded (formats/wire.h),
	 * its buffer in the host mapping, pinned like a slab; host is NULL
	 * then (there are no raw host bytes). Owned. */
	struct arena_wire *wire;
	/* An hb4 image's block with no host copy (the disk tier, or a block on
	 * the device that may leave it): its coded form's plan, which a read
	 * of the block fills (segments only; the buffer is the engine's
	 * staging, or a coded host copy's: arena_model_wire_add), or NULL.
	 * Owned. */
	struct arena_wire *disk_wire;
	int kept; /* its host copy is the caller's for good (arena_block_keep_host):
		   * never released while the block is resident */
} arena_block_mem;

typedef struct arena_model {
	arena_layout *layout;     /* owned */
	arena_backend *backend;   /* borrowed; must outlive the model */
	arena_pin_budget *budget; /* borrowed; must outlive the model */
	arena_block_mem *mem;     /* one per block */
	uint8_t *host_base;       /* one mapping holding every host slab */
	uint64_t host_len;
	uint64_t dev_bytes, host_bytes, pinned_bytes;
	int committed;
	/* The host mapping is a region shared by the processes of the host
	 * (arena_model_prepare_shared), or NULL: a private one. */
	arena_host_share *share;
	int host_mapped;          /* it was complete: its bytes came from another
				   * process, mapped read-only; the loader checks them
				   * against the image (and fills the coded copies'
				   * segment tables from it) before anything reads them,
				   * and reads no host block */
	int share_state;          /* ARENA_SHARE_* (include/arena.h) */
	char share_why[ARENA_SHARE_WHY]; /* PRIVATE: why */
	double share_check_s;     /* a mapped region's check (the loader's): seconds, */
	uint64_t share_checked, share_check_read; /* region bytes checked, image bytes read */
} arena_model;

/* on_device[b] values: a host slab, device memory, or neither (the disk
 * tier: the block's bytes stay in its image, read again when needed). */
#define ARENA_PLACE_HOST 0
#define ARENA_PLACE_DEVICE 1
#define ARENA_PLACE_DISK 2

/* Take ownership of `layout` (also on failure) and allocate: device memory
 * for blocks with on_device[b] ARENA_PLACE_DEVICE (NULL = every block), a
 * host slab for ARENA_PLACE_HOST, nothing for ARENA_PLACE_DISK. Device memory beyond what the backend has is DEV_OOM naming how
 * much is needed and free. */
int arena_model_prepare(arena_layout *layout, arena_backend *be, arena_pin_budget *budget,
			const uint8_t *on_device, arena_model **out);
/* The same, and blocks placed ARENA_PLACE_HOST whose wires[b] is not NULL
 * keep a coded host copy of wires[b]->cap bytes instead of a slab: the
 * model takes those wires (wires[b] set to NULL, also on failure, when it
 * frees them) and sets their buffers; the others stay the caller's.
 * wires may be NULL. */
int arena_model_prepare_wire(arena_layout *layout, arena_backend *be, arena_pin_budget *budget,
			     const uint8_t *on_device, struct arena_wire **wires, arena_model **out);

/* The same with the host mapping shared (device/hostshare.h) as the region
 * named `key` (key NULL: private, as arena_model_prepare_wire): found
 * complete (m->host_mapped: the host slabs and the coded copies' buffers
 * are another process's bytes, read-only: the caller checks them against
 * the image, and fills the coded copies' segment tables, before use, or
 * gives them up with arena_model_unshare), or made for the caller to
 * fill, then arena_model_share_publish once committed; or, where sharing
 * is not possible, private (share_state PRIVATE, share_why says why). */
int arena_model_prepare_shared(arena_layout *layout, arena_backend *be, arena_pin_budget *budget,
			       const uint8_t *on_device, struct arena_wire **wires, const arena_share_key *key,
			       arena_model **out);
/* A committed model whose shared region it filled: the region sealed and
 * marked complete for the other processes. Always 0: where that is not
 * possible the region stays this process's (share_state PRIVATE). */
int arena_model_share_publish(arena_model *m);
/* A model that mapped a region (host_mapped), before commit: its host
 * copies move to a private mapping of its own (empty, for the caller to
 * fill), the region is let go, share_state becomes PRIVATE with `why`.
 * NOMEM (the model is unchanged). */
int arena_model_unshare(arena_model *m, const char *why);

/* Make host slabs read-only and pin them in place, block by block, while the
 * budget allows (the rest stay pageable). */
int arena_model_commit(arena_model *m);

void arena_model_free(arena_model *m);

/* Give block b, which has no host slab, one of its own after commit (the
 * engine does this before dropping a device-only block's device copy):
 * host_add maps a writable slab (*slab) for the caller to fill; host_seal
 * makes it read-only and pins it within the budget (pageable when not);
 * host_discard drops a slab that could not be filled. The model owns the
 * slab and frees it with the rest. */
int arena_model_host_add(arena_model *m, uint32_t b, uint8_t **slab);
void arena_model_host_seal(arena_model *m, uint32_t b);
void arena_model_host_discard(arena_model *m, uint32_t b);
/* A slab for block b's raw bytes made apart from the model, on any thread
 * (nothing of the model is touched): slab_map maps a writable slab of the
 * length host_add's would have (*len), transparent huge pages asked for
 * (faulting it in a page of 2 MiB at a time); slab_pin pins it within the
 * budget (1 when pinned, 0 when it stays pageable; thread-safe: the budget
 * is atomic); host_adopt makes it block b's host copy (b has none), sealed
 * read-only, as host_add + host_seal would, counted in host_bytes and
 * pinned_bytes; slab_drop unpins (when pinned) and unmaps one not adopted. */
int arena_model_slab_map(const arena_layout *l, uint32_t b, uint8_t **slab, uint64_t *len);
int arena_model_slab_pin(arena_pin_budget *budget, arena_backend *be, uint8_t *slab, uint64_t len);
void arena_model_host_adopt(arena_model *m, uint32_t b, uint8_t *slab, int pinned);
void arena_model_slab_drop(arena_pin_budget *budget, arena_backend *be, uint8_t *slab, uint64_t len, int pinned);
/* arena_model_host_release in two halves: release_later takes block b's
 * host copy from the model now (host, wire, the counts: as released) and
 * leaves in *d what is left to do; drop_do does it (unpin, unmap or
 * discard the pages), on any thread (the budget is atomic), before the
 * memory could be registered again. */
typedef struct arena_host_drop {
	uint8_t *p; /* NULL: nothing */
	uint64_t len;
	int pinned, own;
} arena_host_drop;
void arena_model_host_release_later(arena_model *m, uint32_t b, arena_host_drop *d);
void arena_model_host_drop_do(arena_pin_budget *budget, arena_backend *be, const arena_host_drop *d);
/* Give block b's host copy (raw or coded, in its own mapping or the
 * shared one) back to the OS: unpinned, its pages discarded, host and wire
 * NULL. For a block on the device whose copy nothing else holds. In a
 * region shared with other processes only this process's view of the
 * pages goes (the bytes stay for the others; the kernel frees them with
 * the region). */
void arena_model_host_release(arena_model *m, uint32_t b);
/* The same for a host copy kept coded: block b (no host copy, its coded
 * form's plan in disk_wire) gets a wire of that plan in a writable mapping
 * of its own (*w: fill it, e.g. arena_slab_reader_read_wire), sealed or
 * discarded as a slab is (the two above take either). NOMEM; USAGE when b
 * has a host copy or no plan. */
int arena_model_wire_add(arena_model *m, uint32_t b, struct arena_wire **w);

/* Bytes of block b's host copy: its slab, or its coded form. */
uint64_t arena_model_host_len(const arena_model *m, uint32_t b);

/* Bytes of block b's slab. */
static inline uint64_t arena_model_slab_bytes(const arena_model *m, uint32_t b)
{
	return m->layout->blocks[b].bytes;
}

#endif
