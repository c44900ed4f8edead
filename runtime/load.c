/* load.c - the loader's pipeline: reader threads over pieces of work, the
 * pinned read ring, placement, commit (see load.h; the sources are
 * load_image.c and load_st.c).
 *
 * A ring slot is reused only once the copies from it are done (its event);
 * a worker waits for its stream's copies before it exits, whatever happened,
 * and before its share of the ring is unpinned. The first error stops every
 * worker; the model is committed only after all of them have finished
 * without one, and freed otherwise: nothing half built is visible. */
#include "load_int.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../common/alloc.h"
#include "../common/clock.h"
#include "../common/err.h"
#include "../common/io.h"

#define DEFAULT_SLOT (1u << 20)  /* a read: hashed while in cache, copied while in the LLC */
#define DEFAULT_SPT 4u

static void fail(loader *L, int rc)
{
	arena_first_error_set(&L->err, rc);
}


/* ---- reading -------------------------------------------------------------- */

/* Read [off, off+n) of f into buf with fd; short only at end of file. Returns
 * bytes read (>= 0) or a negative error. */
static int64_t read_some(const lsrc *f, int fd, uint8_t *buf, uint64_t n, uint64_t off)
{
	uint64_t want = off >= f->size ? 0 : (f->size - off < n ? f->size - off : n);
	uint64_t got = 0;
	while (got < want) {
		ssize_t r = arena__read_fault() ? (errno = EIO, -1) : pread(fd, buf + got, (size_t)(n - got), (off_t)(off + got));
		if (r < 0) {
			if (errno == EINTR)
				continue;
			return arena_syserrorf(ARENA_E_IO, errno, "%s: read failed at byte %" PRIu64, f->path, off + got);
		}
		if (r == 0) /* its size was checked when opened: it shrank since */
			return arena_errorf(ARENA_E(INPUT_CHANGED),
					    "%s: file changed while reading: unexpected end of file at byte %" PRIu64, f->path,
					    off + got);
		got += (uint64_t)r;
	}
	return (int64_t)(got > want ? want : got);
}

/* Read file bytes [off, off+n) into buf: from the page cache while they are
 * there, O_DIRECT from where they are not (*direct then stays set). */
int arena__load_read_range(loader *L, worker *w, const lsrc *f, uint8_t *buf, uint64_t n, uint64_t off, int *direct)
{
	const int io = L->o->io;
	const double t0 = arena_now_s();
	uint64_t got = 0;
	while (got < n) {
		int64_t r;
		if (*direct) {
			r = read_some(f, f->dfd, buf + got, arena_align_up(n - got, DIRECT_ALIGN), off + got);
			if (r >= 0)
				atomic_fetch_add(&L->direct_bytes, (uint64_t)r);
		} else {
			/* AUTO: what the page cache holds from it, the rest (of the
			 * piece) O_DIRECT. Asking the mapping costs no I/O; a read
			 * with RWF_NOWAIT would start read-ahead of what is not
			 * there, and the disk would read those bytes twice. */
			uint64_t want = n - got;
			if (io == ARENA_IO_AUTO && f->map && !((off + got) % DIRECT_ALIGN)) {
				uint64_t c = arena_cached_prefix(f->map, off + got, want);
				if (c < want) {
					want = c & ~(uint64_t)(DIRECT_ALIGN - 1);
					if (!want) {
						*direct = 1; /* not all in the page cache: the rest goes O_DIRECT */
						continue;
					}
				}
			}
			r = read_some(f, f->fd, buf + got, want, off + got);
		}
		if (r < 0)
			return (int)r;
		if (r == 0 && !*direct)
			return arena_errorf(ARENA_E_IO, "%s: no progress reading at byte %" PRIu64, f->path, off + got);
		got += (uint64_t)r;
	}
	w->t_read += arena_now_s() - t0;
	return 0;
}

/* ---- the ring's slots, and scatter: slot bytes to device or host slabs ---- */

/* The worker's next ring slot, once the copies from its last use are done. */
int arena__load_next_slot(loader *L, worker *w, uint8_t **buf, unsigned *si)
{
	*si = w->k++ % L->spt;
	*buf = L->ring + ((uint64_t)w->id * L->spt + *si) * L->slot;
	double t = arena_now_s();
	int rc = L->m->backend->ops->event_sync(L->m->backend, w->ev[*si]);
	w->t_wait += arena_now_s() - t;
	return rc;
}

/* Bytes [a, z) of p's file are at buf: send each part to its slab. */
int arena__load_scatter(loader *L, worker *w, const piece *p, const uint8_t *buf, uint64_t a, uint64_t z)
{
	const uint64_t a0 = a;
	/* First seg of this file ending after a. */
	size_t lo = 0, hi = L->n_segs;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		const seg *s = &L->segs[mid];
		if (s->file < p->file || (s->file == p->file && s->foff + s->len <= a))
			lo = mid + 1;
		else
			hi = mid;
	}
	arena_backend *be = L->m->backend;
	for (size_t k = lo; k < L->n_segs && L->segs[k].file == p->file && L->segs[k].foff < z; k++) {
		const seg *s = &L->segs[k];
		uint64_t x = s->foff > a ? s->foff : a, y = s->foff + s->len < z ? s->foff + s->len : z;
		if (y <= x)
			continue;
		const arena_block_mem *bm = &L->m->mem[s->block];
		const uint8_t *src = buf + (x - a0);
		uint64_t d = s->dst + (x - s->foff);
		if (bm->dev) {
			int rc = be->ops->copy_h2d(be, (uint8_t *)bm->dev + d, src, y - x, w->s);
			if (rc)
				return rc;
		} else if (bm->wire) {
			arena_wire_put(bm->wire, d, d + (y - x), NULL, 0, 0, src);
		} else {
			memcpy(bm->host + d, src, y - x);
		}
	}
	return 0;
}

/* ---- one piece --------------------------------------------------------------- */

/* Read a piece slot by slot: each slot's bytes are read (from the page cache
 * when they are there, O_DIRECT when not), checked while still in cache,
 * copied on, and the slot's event recorded. */
static int do_piece(loader *L, worker *w, const piece *p)
{
	if (L->img && arena__load_img_unwanted(L, p->off, p->off + p->len))
		return 0;
	const lsrc *f = &L->files[p->file];
	arena_backend *be = L->m->backend;
	int direct = L->o->io == ARENA_IO_DIRECT && f->dfd >= 0;
	hasher h;
	arena_hash_reset(&h.st);
	h.chunk = p->chunk0;
	h.in_chunk = 0;
	h.pad_bad = UINT64_MAX;
	uint64_t pos = 0, end = p->off + p->len > f->size ? f->size - p->off : p->len;
	while (pos < end) {
		uint8_t *buf;
		unsigned si;
		int rc = arena__load_next_slot(L, w, &buf, &si);
		if (rc)
			return rc;
		uint64_t n = end - pos < L->slot ? end - pos : L->slot;
		if ((rc = arena__load_read_range(L, w, f, buf, n, p->off + pos, &direct)))
			return rc;
		uint64_t a = p->off + pos;
		atomic_fetch_add(&L->file_bytes, n);
		if ((L->img && (rc = arena__load_img_check(L, buf, &h, a, a + n))) ||
		    (rc = arena__load_scatter(L, w, p, buf, a, a + n)) ||
		    (rc = be->ops->event_record(be, w->ev[si], w->s)))
			return rc;
		pos += n;
	}
	return 0;
}

/* ---- reader threads -------------------------------------------------------- */

/* Fault in and pin this worker's share of the ring (workers do it at once:
 * the page clearing runs in parallel, registration overlaps others' reads). */
static void worker_ring(loader *L, worker *w)
{
	uint64_t len = (uint64_t)L->spt * L->slot;
	uint8_t *mine = L->ring + (uint64_t)w->id * len;
#ifdef MADV_POPULATE_WRITE
	if (madvise(mine, len, MADV_POPULATE_WRITE))
#endif
		memset(mine, 0, len);
	if (L->ring_pinned) {
		arena_backend *be = L->o->backend;
		if (be->ops->host_register(be, mine, len) == 0)
			w->registered = 1;
		else
			arena_error_clear(); /* pageable: slower copies, still correct */
	}
}

static void *worker_main(void *arg)
{
	worker *w = arg;
	loader *L = w->L;
	arena_backend *be = L->m->backend;
	const double t0 = arena_now_s();
	worker_ring(L, w);
	w->t_ring = arena_now_s() - t0;
	while (!arena_first_error_get(&L->err)) {
		if (L->o->cancel && *L->o->cancel) {
			arena_errorf(ARENA_E_CANCELLED, "load cancelled");
			fail(L, ARENA_E_CANCELLED);
			break;
		}
		size_t i = atomic_fetch_add(&L->next, 1);
		if (i >= L->n_pieces + L->n_qp)
			break;
		int rc = i >= L->n_pieces ? arena__load_st_qpiece(L, w, &L->qp[i - L->n_pieces])
			 : L->coded      ? arena__load_img_piece(L, w, &L->pieces[i])
					 : do_piece(L, w, &L->pieces[i]);
		if (rc) {
			fail(L, rc);
			break;
		}
		if (L->o->progress) {
			uint64_t n = i >= L->n_pieces ? L->qp[i - L->n_pieces].len : L->pieces[i].len;
			L->o->progress(L->o->progress_ctx, atomic_fetch_add(&L->prog_done, n) + n, L->prog_total);
		}
	}
	/* Copies may still read the ring: wait for them whatever happened. */
	int rc = be->ops->stream_sync(be, w->s);
	if (rc)
		fail(L, rc);
	if (w->registered)
		be->ops->host_unregister(be, L->ring + (uint64_t)w->id * L->spt * L->slot);
	w->t_all = arena_now_s() - t0;
	return NULL;
}

/* ---- setup ------------------------------------------------------------------- */

static unsigned cpus(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	return n < 1 ? 1 : n > 32 ? 32 : (unsigned)n;
}

/* Size the ring (see load.h): no larger than the bytes that go through it
 * (`need`; a slot no larger than the largest read, `max_read`; no more slots
 * than reads fill, no more threads than slots or than `units` of work), then
 * within the pinned budget; a budget too small for even the smallest ring
 * leaves it pageable. */
/* The ring one step smaller (fewer slots a thread down to 2, then slots
 * halved down to 64 KiB, then threads halved): 0 when it is already the
 * smallest. */
static int ring_smaller(uint64_t *slot, unsigned *spt, unsigned *thr)
{
	if (*spt > 2)
		--*spt;
	else if (*slot / 2 >= (64u << 10))
		*slot = *slot / 2 / DIRECT_ALIGN * DIRECT_ALIGN;
	else if (*thr > 1)
		*thr /= 2;
	else
		return 0;
	return 1;
}

int arena__load_ring_setup(loader *L, uint64_t need, uint64_t max_read, uint64_t units)
{
	arena_pin_budget *b = L->o->budget;
	L->ask_slot = L->slot, L->ask_spt = L->spt, L->ask_threads = L->threads;
	L->ring_need = need;
	uint64_t slot = L->slot;
	unsigned spt = L->spt, thr = L->threads;
	const uint64_t most = arena_align_up(max_read ? max_read : 1, DIRECT_ALIGN);
	if (slot > most)
		slot = most;
	uint64_t reads = need ? (need + slot - 1) / slot : 1;
	if (thr > reads)
		thr = (unsigned)reads;
	if (thr > units)
		thr = units ? (unsigned)units : 1;
	if (spt > (reads + thr - 1) / thr)
		spt = (unsigned)((reads + thr - 1) / thr);
	/* Slots more than the bytes fill: share the bytes out evenly. */
	uint64_t even = arena_align_up((need + (uint64_t)thr * spt - 1) / ((uint64_t)thr * spt), DIRECT_ALIGN);
	if (even < slot)
		slot = even ? even : DIRECT_ALIGN;
	if (slot != L->slot || spt != L->spt || thr != L->threads)
		L->ring_lowered |= ARENA_RING_BY_BYTES;
	/* Within o->buffers_max: the ring and each thread's chunk buffers (a
	 * coded chunk read whole; a zstd image's piece read in one). */
	const arena_img_header *h = L->img ? &L->img->hdr : NULL;
	const uint64_t extra = h && L->coded ? h->chunk_size * (1 + (h->flags & ARENA_IMG_FLAG_ZSTD ? L->per : 0)) : 0;
	const uint64_t max = L->o->buffers_max;
	while (max && (uint64_t)thr * (spt * slot + extra) > max && ring_smaller(&slot, &spt, &thr))
		L->ring_lowered |= ARENA_RING_BY_HOST;
	const uint64_t full_slot = slot;
	const unsigned full_spt = spt, full_thr = thr;
	for (;;) {
		uint64_t total = (uint64_t)thr * spt * slot;
		if (!arena_pin_budget_take(b, total)) {
			L->ring_pinned = 1;
			break;
		}
		if (!ring_smaller(&slot, &spt, &thr)) {
			slot = full_slot, spt = full_spt, thr = full_thr; /* pageable, as large as it is useful */
			break;
		}
	}
	arena_error_clear();
	if (slot != full_slot || spt != full_spt || thr != full_thr)
		L->ring_lowered |= ARENA_RING_BY_BUDGET;
	L->slot = slot, L->spt = spt, L->threads = thr;
	L->ring_len = (uint64_t)thr * spt * slot;
	/* Mapped here; each worker faults in and pins its own share. */
	void *p = mmap(NULL, L->ring_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		if (L->ring_pinned)
			arena_pin_budget_give(b, L->ring_len);
		L->ring_pinned = 0;
		return arena_syserrorf(ARENA_E_NOMEM, errno, "cannot map a %" PRIu64 "-byte read ring", L->ring_len);
	}
	madvise(p, L->ring_len, MADV_HUGEPAGE); /* fewer TLB misses for the readers' copies */
	L->ring = p;
	return 0;
}

static void ring_free(loader *L)
{
	if (!L->ring)
		return;
	if (L->ring_pinned)
		arena_pin_budget_give(L->o->budget, L->ring_len);
	munmap(L->ring, L->ring_len);
	L->ring = NULL;
}

int arena__load_open_direct(lsrc *f, int io)
{
	f->dfd = -1;
	f->map = NULL;
	if (io == ARENA_IO_BUFFERED)
		return 0;
	/* AUTO asks the page cache (f->map); where a second descriptor cannot
	 * be had, AUTO reads buffered and DIRECT fails */
	int rc = arena_open_direct(f->fd, f->path, f->size, io == ARENA_IO_AUTO, &f->dfd, &f->map);
	if (rc && io != ARENA_IO_DIRECT) {
		arena_error_clear();
		rc = 0;
	}
	return rc;
}

/* ---- a load ------------------------------------------------------------------ */

/* Run the pipeline over L's pieces; then commit or free the model. */
int arena__load_run(loader *L, arena_model **out, arena_load_stats *st, double t0)
{
	const arena_load_opts *o = L->o;
	arena_backend *be = L->m->backend;
	int rc = 0;
	worker *w = NULL;
	pthread_t *tid = NULL;
	unsigned started = 0;
	L->ring_pinned_all = 1;
	arena_first_error_init(&L->err);
	atomic_init(&L->next, 0);
	atomic_init(&L->file_bytes, 0);
	atomic_init(&L->direct_bytes, 0);
	atomic_init(&L->gpu_decoded, 0);
	atomic_init(&L->cpu_decoded, 0);
	atomic_init(&L->prog_done, 0);
	L->prog_total = 0;
	for (size_t i = 0; i < L->n_pieces; i++)
		L->prog_total += L->pieces[i].len;
	for (size_t i = 0; i < L->n_qp; i++)
		L->prog_total += L->qp[i].len;
	w = arena_calloc(L->threads, sizeof(*w));
	tid = arena_calloc(L->threads, sizeof(*tid));
	if (!w || !tid) {
		rc = arena_errorf(ARENA_E_NOMEM, "out of memory");
		goto out;
	}
	for (unsigned i = 0; i < L->threads; i++) {
		w[i].L = L;
		w[i].id = i;
		w[i].ev = arena_calloc(L->spt, sizeof(*w[i].ev));
		if (!w[i].ev) {
			rc = arena_errorf(ARENA_E_NOMEM, "out of memory");
			goto out;
		}
		if ((rc = be->ops->stream_create(be, &w[i].s)))
			goto out;
		for (unsigned k = 0; k < L->spt; k++)
			if ((rc = be->ops->event_create(be, &w[i].ev[k])))
				goto out;
	}
	if (L->coded && (rc = arena__load_img_stages(L, w)))
		goto out;
	L->t_prepare = arena_now_s() - L->t_mark;
	L->t_mark = arena_now_s();
	for (; started < L->threads; started++)
		if (pthread_create(&tid[started], NULL, worker_main, &w[started]))
			break;
	if (!started) {
		rc = arena_errorf(ARENA_E_NOMEM, "cannot start reader threads");
		goto out;
	}
	/* Threads that did not start: their pieces are taken by the others. */
	for (unsigned i = 0; i < started; i++)
		pthread_join(tid[i], NULL);
	if ((rc = arena_first_error_raise(&L->err)))
		goto out;
	if (o->cancel && *o->cancel) {
		rc = arena_errorf(ARENA_E_CANCELLED, "load cancelled");
		goto out;
	}
	for (unsigned i = 0; i < started; i++)
		if (!w[i].registered)
			L->ring_pinned_all = 0;
	for (size_t b = 0; b < L->m->layout->n_blocks; b++)
		if (L->m->mem[b].wire && (rc = arena_wire_seal(L->m->mem[b].wire, L->m->layout->blocks[b].name)))
			goto out;
	L->t_populate = arena_now_s() - L->t_mark;
	L->t_mark = arena_now_s();
	rc = arena_model_commit(L->m);
	L->t_commit = arena_now_s() - L->t_mark;
out:;
	double wt[5] = {0}, decode = 0;
	for (unsigned i = 0; w && i < started; i++) {
		wt[4] += w[i].t_decode / started;
		decode += w[i].t_decode;
		wt[0] += w[i].t_all / started;
		wt[1] += w[i].t_ring / started;
		wt[2] += w[i].t_wait / started;
		wt[3] += w[i].t_read / started;
	}
	for (unsigned i = 0; w && i < L->threads; i++) {
		for (unsigned k = 0; w[i].ev && k < L->spt; k++)
			if (w[i].ev[k])
				be->ops->event_destroy(be, w[i].ev[k]);
		arena_free(w[i].ev);
		if (w[i].s)
			be->ops->stream_destroy(be, w[i].s);
		if (w[i].stage)
			be->ops->dev_free(be, w[i].stage);
		arena_img_dec_free(&w[i].dec);
		arena_free(w[i].whole);
		arena_free(w[i].span);
	}
	arena_free(w);
	arena_free(tid);
	arena_first_error_destroy(&L->err);
	if (st) {
		memset(st, 0, sizeof(*st));
		st->file_bytes = atomic_load(&L->file_bytes);
		st->direct_bytes = atomic_load(&L->direct_bytes);
		st->gpu_decoded = atomic_load(&L->gpu_decoded);
		st->cpu_decoded = atomic_load(&L->cpu_decoded);
		st->dev_bytes = L->m->dev_bytes;
		st->host_bytes = L->m->host_bytes;
		for (size_t b = 0; b < L->m->layout->n_blocks; b++)
			if (L->m->mem[b].wire) {
				st->wire_bytes += L->m->mem[b].wire->stored;
				st->wire_raw += L->m->layout->blocks[b].bytes;
			}
		st->ring_bytes = L->ring_len;
		st->ring_pinned = L->ring_pinned && L->ring_pinned_all;
		st->threads = L->threads;
		st->ring = (arena_ring_shape){L->threads, L->spt, L->slot};
		st->ring_asked = (arena_ring_shape){L->ask_threads, L->ask_spt, L->ask_slot};
		st->ring_need = L->ring_need;
		st->ring_lowered = L->ring_lowered;
		st->seconds = arena_now_s() - t0;
		st->t_open = L->t_open;
		st->t_ring = L->t_ring;
		st->t_prepare = L->t_prepare;
		st->t_populate = L->t_populate;
		st->t_commit = L->t_commit;
		st->w_all = wt[0], st->w_ring = wt[1], st->w_wait = wt[2], st->w_read = wt[3], st->w_decode = wt[4];
		st->cpu_decode_s = decode;
	}
	if (rc) {
		arena_model_free(L->m);
		L->m = NULL;
		return rc;
	}
	*out = L->m;
	return 0;
}

void arena__load_init(loader *L, const arena_load_opts *o)
{
	memset(L, 0, sizeof(*L));
	L->o = o;
	L->threads = o->threads ? o->threads : cpus();
	L->spt = o->slots_per_thread ? o->slots_per_thread : DEFAULT_SPT;
	L->slot = arena_align_up(o->slot_bytes ? o->slot_bytes : DEFAULT_SLOT, DIRECT_ALIGN);
}

/* Ask o->place (if any) where the blocks of l go, before anything is allocated. */
int arena__load_place(loader *L, const arena_layout *l)
{
	if (!L->o->place)
		return 0;
	if (!(L->placed = arena_calloc(l->n_blocks ? l->n_blocks : 1, 1)))
		return arena_errorf(ARENA_E_NOMEM, "out of memory");
	uint64_t stage = 0, *host_len = NULL, region = 0;
	if (L->img && L->o->coded_stream && L->o->backend->ops->decode_hb4) {
		arena_wire_env();
		stage = arena_wire_stage_bound(L->img->chunks, L->img->hdr.chunk_count);
	}
	if (stage) { /* what a coded host copy would take */
		int rc = arena__load_wire_plans(L, l);
		if (!rc && !(host_len = arena_calloc(l->n_blocks ? l->n_blocks : 1, sizeof(*host_len))))
			rc = arena_errorf(ARENA_E_NOMEM, "out of memory");
		if (rc)
			return rc;
		for (size_t b = 0; b < l->n_blocks; b++) {
			host_len[b] = L->wplan[b] ? L->wplan[b]->cap : l->blocks[b].bytes;
			region = arena_wire_region_most(L->wplan[b]) > region ? arena_wire_region_most(L->wplan[b]) : region;
		}
	}
	int rc = L->o->place(L->o->place_ctx, l, stage, host_len, region, L->placed);
	arena_free(host_len);
	return rc;
}

const uint8_t *arena__load_on_device(const loader *L)
{
	return L->placed ? L->placed : L->o->on_device;
}

void arena__load_files_close(loader *L)
{
	arena_free(L->placed);
	L->placed = NULL;
	for (size_t b = 0; L->wplan && b < L->n_wplan; b++)
		arena_wire_free(L->wplan[b]);
	arena_free(L->wplan);
	L->wplan = NULL;
	ring_free(L);
	for (size_t i = 0; L->files && i < L->n_files; i++) {
		if (L->files[i].dfd >= 0)
			close(L->files[i].dfd);
		if (L->files[i].map)
			munmap(L->files[i].map, L->files[i].size);
		if (L->files[i].own_fd && L->files[i].fd >= 0)
			close(L->files[i].fd);
	}
	arena_free(L->files);
	arena_free(L->segs);
	arena_free(L->pieces);
	arena_free(L->qp);
}
