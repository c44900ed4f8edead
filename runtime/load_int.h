/* load_int.h - what the loader's parts share: the load's state (files,
 * segments, pieces of work, the ring, the counters), a reader thread's
 * state, and the calls between the pipeline and its two sources. The parts:
 * load.c (the pipeline: reader threads, the ring, placement, commit),
 * load_image.c (an image: chunk checks, coded chunks, the disk tier) and
 * load_st.c (a safetensors checkpoint, destination-first, and its quantized
 * components). Not installed; the API and the pipeline's design are in
 * load.h. */
#ifndef ARENA_RUNTIME_LOAD_INT_H
#define ARENA_RUNTIME_LOAD_INT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "../common/firsterr.h"
#include "../common/hash.h"
#include "../formats/image.h"
#include "../formats/wire.h"
#include "load.h"
#include "../convert/quant_select.h"

#define DIRECT_ALIGN 4096u
#define PIECE (16u << 20)        /* a unit of work (whole chunks for images) */

typedef struct lsrc {
	const char *path; /* borrowed */
	int fd, dfd;      /* buffered; O_DIRECT or -1 */
	void *map;        /* with dfd under ARENA_IO_AUTO: the file mapped, to ask the page cache (mincore) */
	uint64_t size;
	int own_fd;
} lsrc;

/* Bytes of a file that belong at (block, dst) in a slab. */
typedef struct seg {
	uint32_t file;
	uint64_t foff, len;
	uint32_t block;
	uint64_t dst;
} seg;

typedef struct piece {
	uint32_t file;
	uint64_t off, len; /* the file range read */
	uint64_t chunk0;   /* image: first chunk; pieces hold whole chunks */
} piece;

/* A byte range of a quantized component, made by convert/quant from the mapped source. */
typedef struct qpiece {
	uint32_t tensor, comp;
	uint64_t off, len;
} qpiece;

typedef struct loader {
	const arena_load_opts *o;
	uint8_t *placed; /* o->place's choice of on_device, or NULL */
	arena_wire **wplan; /* coded streaming: each block's coded form (NULL: not worth it), or NULL */
	size_t n_wplan;
	arena_quant_state *qs; /* safetensors with a quant scheme, else NULL */
	qpiece *qp;
	size_t n_qp;
	arena_model *m;
	const arena_image *img; /* NULL for safetensors */
	int coded;              /* img holds coded chunks: read and decoded chunk by chunk */
	int hb4;                /* and some are hb4 (a device stage is worth having) */
	int disk;               /* image: some blocks stay in it (the disk tier), unread here */
	uint64_t per;           /* image: chunks a piece */
	lsrc *files;
	size_t n_files;
	seg *segs;
	size_t n_segs;
	piece *pieces;
	size_t n_pieces;
	uint8_t *ring;
	uint64_t ring_len, slot;
	unsigned spt, threads;
	uint64_t ask_slot, ring_need; /* the slot asked for; bytes through the ring */
	unsigned ask_spt, ask_threads, ring_lowered;
	int ring_pinned;     /* the ring's bytes are taken from the pinned budget */
	int ring_pinned_all; /* and every worker's share was registered */
	double t_open, t_ring, t_prepare, t_populate, t_commit, t_mark;
	atomic_size_t next;
	arena_first_error err;
	atomic_uint_fast64_t file_bytes, direct_bytes, gpu_decoded, cpu_decoded;
	atomic_uint_fast64_t prog_done; /* o->progress: bytes of the pieces done, of prog_total */
	uint64_t prog_total;
} loader;

typedef struct worker {
	loader *L;
	unsigned id;
	unsigned k;       /* slots used so far */
	int registered;   /* its ring share was pinned (and is unpinned as it exits) */
	arena_stream *s;
	arena_event **ev;
	uint8_t *stage; /* coded images: a device chunk the stored bytes stream into, or NULL */
	uint8_t *whole; /* coded images: a stored chunk read whole (CPU decode) */
	uint8_t *span;  /* zstd images: a piece's stored chunks read in one */
	uint64_t span_cap;
	arena_img_dec dec; /* and its parse or decoded streams */
	double t_ring, t_wait, t_read, t_decode, t_all; /* where its time went (load stats) */
} worker;

/* A plain image's chunk checks as its bytes pass (arena__load_img_check). */
typedef struct hasher {
	arena_hash st;
	uint64_t chunk;   /* current chunk index */
	uint64_t in_chunk;
	uint64_t pad_bad; /* the chunk's first raw padding byte that is not zero, or UINT64_MAX */
} hasher;

/* ---- the pipeline (load.c) ---- */

/* L for a load with options o: threads, slots and slot size as asked (the
 * defaults filled in), nothing taken yet. */
void arena__load_init(loader *L, const arena_load_opts *o);
/* Ask o->place (if any) where the blocks of l go, into L->placed. */
int arena__load_place(loader *L, const arena_layout *l);
/* Where the blocks go: o->place's choice, else o->on_device (NULL: all device). */
const uint8_t *arena__load_on_device(const loader *L);
/* The file's O_DIRECT descriptor and mapping as io asks (f->dfd, f->map). */
int arena__load_open_direct(lsrc *f, int io);
/* Size, take from the pinned budget and map the ring for `need` bytes through
 * it, reads of at most max_read, `units` pieces of work (see load.h). */
int arena__load_ring_setup(loader *L, uint64_t need, uint64_t max_read, uint64_t units);
/* Run the reader threads over L's pieces, then commit the model into *out or
 * free it; fills st (may be NULL). */
int arena__load_run(loader *L, arena_model **out, arena_load_stats *st, double t0);
/* Release what L holds (placement, coded forms, ring, files, plans). */
void arena__load_files_close(loader *L);
/* A worker's next ring slot, once the copies from its last use are done. */
int arena__load_next_slot(loader *L, worker *w, uint8_t **buf, unsigned *si);
/* File bytes [off, off+n) of f into buf, from the page cache or O_DIRECT. */
int arena__load_read_range(loader *L, worker *w, const lsrc *f, uint8_t *buf, uint64_t n, uint64_t off, int *direct);
/* Bytes [a, z) of p's file, at buf, each part to its slab. */
int arena__load_scatter(loader *L, worker *w, const piece *p, const uint8_t *buf, uint64_t a, uint64_t z);

/* ---- an image (load_image.c) ---- */

/* A plain image's file bytes [a, z) at buf fed to the chunk checks. */
int arena__load_img_check(loader *L, const uint8_t *buf, hasher *h, uint64_t a, uint64_t z);
/* The disk tier: file range [a, z) is wanted by no block read here. */
int arena__load_img_unwanted(const loader *L, uint64_t a, uint64_t z);
/* A piece of a coded image, chunk by chunk. */
int arena__load_img_piece(loader *L, worker *w, const piece *p);
/* Coded images: the workers' device stages, where there is room. */
int arena__load_img_stages(loader *L, worker *w);
/* Coded streaming: each block's coded form where it saves bytes (L->wplan). */
int arena__load_wire_plans(loader *L, const arena_layout *l);

/* ---- a safetensors checkpoint (load_st.c) ---- */

/* A range of a quantized component made into its slab or through a slot. */
int arena__load_st_qpiece(loader *L, worker *w, const qpiece *q);

#endif
