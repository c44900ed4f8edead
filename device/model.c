/* model.c - device and host memory of a loaded arena (see model.h). */
#include "model.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "../common/alloc.h"
#include "../common/err.h"
#include "../formats/wire.h"

uint64_t arena_model_host_len(const arena_model *m, uint32_t b)
{
	const arena_wire *w = m->mem[b].wire;
	return arena_align_up(w ? w->cap : m->layout->blocks[b].bytes, ARENA_SLAB_ALIGN);
}

/* Block b's host copy: its slab or its coded form's buffer. */
static uint8_t *host_copy(const arena_block_mem *bm)
{
	return bm->wire ? bm->wire->buf : bm->host;
}

int arena_model_prepare(arena_layout *layout, arena_backend *be, arena_pin_budget *budget,
			const uint8_t *on_device, arena_model **out)
{
	return arena_model_prepare_wire(layout, be, budget, on_device, NULL, out);
}

/* On failure the model still takes (and frees) the host blocks' wires. */
static void drop_host_wires(const arena_layout *layout, const uint8_t *on_device, arena_wire **wires)
{
	for (size_t b = 0; wires && on_device && b < layout->n_blocks; b++)
		if (on_device[b] == ARENA_PLACE_HOST) {
			arena_wire_free(wires[b]);
			wires[b] = NULL;
		}
}

int arena_model_prepare_wire(arena_layout *layout, arena_backend *be, arena_pin_budget *budget,
			     const uint8_t *on_device, arena_wire **wires, arena_model **out)
{
	return arena_model_prepare_shared(layout, be, budget, on_device, wires, NULL, out);
}

int arena_model_prepare_shared(arena_layout *layout, arena_backend *be, arena_pin_budget *budget,
			       const uint8_t *on_device, arena_wire **wires, const arena_share_key *key,
			       arena_model **out)
{
	*out = NULL;
	arena_model *m = arena_calloc(1, sizeof(*m));
	if (!m) {
		drop_host_wires(layout, on_device, wires);
		arena_layout_free(layout);
		return arena_errorf(ARENA_E_NOMEM, "out of memory");
	}
	m->layout = layout;
	m->backend = be;
	m->budget = budget;
	int rc = 0;
	m->mem = arena_calloc(layout->n_blocks, sizeof(*m->mem));
	if (!m->mem) {
		drop_host_wires(layout, on_device, wires);
		rc = arena_errorf(ARENA_E_NOMEM, "out of memory");
		goto fail;
	}
	for (size_t b = 0; wires && on_device && b < layout->n_blocks; b++)
		if (on_device[b] == ARENA_PLACE_HOST) {
			m->mem[b].wire = wires[b];
			wires[b] = NULL;
		}
	uint64_t need_dev = 0;
	for (size_t b = 0; b < layout->n_blocks; b++) {
		if (on_device && on_device[b] == ARENA_PLACE_DISK)
			continue;
		if (on_device && !on_device[b])
			m->host_len += arena_model_host_len(m, (uint32_t)b);
		else
			need_dev += layout->blocks[b].bytes;
	}
	if (need_dev) {
		uint64_t free_b = 0, total = 0;
		if ((rc = be->ops->mem_info(be, &free_b, &total)))
			goto fail;
		if (need_dev > free_b) {
			rc = arena_errorf(ARENA_E(DEV_OOM),
					  "%s: the model needs %" PRIu64 " bytes of device memory, %" PRIu64
					  " of %" PRIu64 " are free",
					  be->ops->name, need_dev, free_b, total);
			goto fail;
		}
	}
	if (m->host_len && key) {
		if ((rc = arena_host_share_open(key, m->host_len, &m->share, &m->host_mapped, m->share_why)))
			goto fail;
		m->share_state = !m->share ? ARENA_SHARE_PRIVATE : m->host_mapped ? ARENA_SHARE_MAPPED : ARENA_SHARE_LOADED;
		if (m->share)
			m->host_base = arena_host_share_base(m->share);
	}
	if (m->host_len && !m->share) {
		void *p = mmap(NULL, m->host_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (p == MAP_FAILED) {
			rc = arena_syserrorf(ARENA_E_NOMEM, errno, "cannot map %" PRIu64 " bytes for host slabs",
					     m->host_len);
			goto fail;
		}
		madvise(p, m->host_len, MADV_HUGEPAGE);
		m->host_base = p;
	}
	uint64_t hoff = 0;
	for (size_t b = 0; b < layout->n_blocks; b++) {
		const arena_block *blk = &layout->blocks[b];
		if (on_device && on_device[b] == ARENA_PLACE_DISK)
			continue;
		if (on_device && !on_device[b] && m->mem[b].wire) {
			m->mem[b].wire->buf = m->host_base + hoff;
			hoff += arena_model_host_len(m, (uint32_t)b);
			m->host_bytes += m->mem[b].wire->cap;
		} else if (on_device && !on_device[b]) {
			m->mem[b].host = m->host_base + hoff;
			hoff += arena_align_up(blk->bytes, ARENA_SLAB_ALIGN);
			m->host_bytes += blk->bytes;
		} else if (blk->bytes) {
			if ((rc = be->ops->dev_alloc(be, blk->bytes, &m->mem[b].dev))) {
				arena_error_prefix(blk->name);
				goto fail;
			}
			m->dev_bytes += blk->bytes;
		}
	}
	*out = m;
	return 0;
fail:
	arena_model_free(m);
	return rc;
}

/* Registering host memory costs about as much per byte as copying it (the
 * driver locks and maps every page): on a 16-core host with 17 GB of host
 * slabs, one thread took 0.36-0.93 s of a 1.3-2.4 s load. Up to
 * PIN_THREADS threads (ARENA_PIN_THREADS: fewer, for measuring) register
 * the slabs; which slabs take the pinned budget is decided first, in block
 * order, so that it does not depend on the threads. */
#define PIN_THREADS 8

typedef struct {
	arena_model *m;
	atomic_size_t next;
} pin_job;

static void *pin_slabs(void *arg)
{
	pin_job *j = arg;
	arena_model *m = j->m;
	for (size_t b; (b = atomic_fetch_add(&j->next, 1)) < m->layout->n_blocks;) {
		arena_block_mem *bm = &m->mem[b];
		if (!bm->pinned) /* not chosen */
			continue;
		uint64_t len = arena_model_host_len(m, (uint32_t)b);
		/* another process's region is mapped read-only */
		int (*reg)(arena_backend *, void *, uint64_t) =
			m->host_mapped ? m->backend->ops->host_register_ro : m->backend->ops->host_register;
		if (!reg || reg(m->backend, host_copy(bm), len)) {
			arena_error_clear(); /* pageable: slower copies, still correct */
			arena_pin_budget_give(m->budget, len);
			bm->pinned = 0;
		}
	}
	return NULL;
}

static unsigned pin_threads(size_t chosen)
{
	unsigned n = PIN_THREADS;
	const char *env = getenv("ARENA_PIN_THREADS");
	if (env && *env >= '1' && *env <= '9' && !env[1])
		n = (unsigned)(*env - '0');
	return chosen < n ? (unsigned)chosen : n;
}

int arena_model_commit(arena_model *m)
{
	/* Pin first: CUDA registers writable pages only; read-only comes after. */
	size_t chosen = 0;
	for (size_t b = 0; m->budget && b < m->layout->n_blocks; b++) {
		arena_block_mem *bm = &m->mem[b];
		uint64_t len = arena_model_host_len(m, (uint32_t)b);
		if (host_copy(bm) && len) {
			if (arena_pin_budget_take(m->budget, len))
				arena_error_clear(); /* past the budget: stays pageable */
			else
				bm->pinned = 1, chosen++;
		}
	}
	pin_job j = {m, 0};
	pthread_t tid[PIN_THREADS];
	unsigned started = 0, n = pin_threads(chosen);
	for (; started + 1 < n; started++) /* the caller is one of them */
		if (pthread_create(&tid[started], NULL, pin_slabs, &j))
			break; /* the others (and the caller) take its share */
	pin_slabs(&j);
	for (unsigned i = 0; i < started; i++)
		pthread_join(tid[i], NULL);
	for (size_t b = 0; b < m->layout->n_blocks; b++)
		if (m->mem[b].pinned)
			m->pinned_bytes += arena_model_host_len(m, (uint32_t)b);
	if (m->host_len && mprotect(m->host_base, m->host_len, PROT_READ) < 0)
		return arena_syserrorf(ARENA_E_IO, errno, "cannot make host slabs read-only");
	m->committed = 1;
	return 0;
}

void arena_model_free(arena_model *m)
{
	if (!m)
		return;
	for (size_t b = 0; m->mem && b < m->layout->n_blocks; b++) {
		arena_block_mem *bm = &m->mem[b];
		uint8_t *p = host_copy(bm);
		const uint64_t len = arena_model_host_len(m, (uint32_t)b);
		if (bm->pinned)
			arena_pin_budget_unregister(m->budget, m->backend, p, len);
		if (bm->own_host)
			munmap(p, len);
		arena_wire_free(bm->wire);
		arena_wire_free(bm->disk_wire);
		if (bm->dev)
			m->backend->ops->dev_free(m->backend, bm->dev);
	}
	if (m->share)
		arena_host_share_close(m->share); /* its mapping; the region goes with its last holder */
	else if (m->host_base)
		munmap(m->host_base, m->host_len);
	arena_free(m->mem);
	arena_layout_free(m->layout);
	arena_free(m);
}

int arena_model_share_publish(arena_model *m)
{
	if (!m->share || m->host_mapped || m->share_state != ARENA_SHARE_LOADED)
		return 0;
	if (arena_host_share_publish(m->share, m->share_why))
		m->share_state = ARENA_SHARE_PRIVATE;
	return 0;
}

int arena_model_unshare(arena_model *m, const char *why)
{
	if (!m->share || !m->host_mapped || m->committed)
		ARENA_BUG("unshare of a model that maps no region, or after commit");
	void *p = mmap(NULL, m->host_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return arena_syserrorf(ARENA_E_NOMEM, errno, "cannot map %" PRIu64 " bytes for host slabs", m->host_len);
	madvise(p, m->host_len, MADV_HUGEPAGE);
	for (size_t b = 0; b < m->layout->n_blocks; b++) {
		arena_block_mem *bm = &m->mem[b];
		if (bm->own_host)
			continue;
		if (bm->wire)
			bm->wire->buf = (uint8_t *)p + (bm->wire->buf - m->host_base);
		else if (bm->host)
			bm->host = (uint8_t *)p + (bm->host - m->host_base);
	}
	arena_host_share_close(m->share);
	m->share = NULL;
	m->host_mapped = 0;
	m->host_base = p;
	m->share_state = ARENA_SHARE_PRIVATE;
	snprintf(m->share_why, sizeof(m->share_why), "%s", why);
	return 0;
}

int arena_model_slab_map(const arena_layout *l, uint32_t b, uint8_t **slab, uint64_t *len)
{
	*slab = NULL;
	*len = arena_align_up(l->blocks[b].bytes, ARENA_SLAB_ALIGN);
	if (!*len)
		return arena_errorf(ARENA_E_INTERNAL, "block '%s' is empty", l->blocks[b].name);
	void *p = mmap(NULL, *len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return arena_syserrorf(ARENA_E_NOMEM, errno, "block '%s': cannot map %" PRIu64 " bytes for a host slab",
				       l->blocks[b].name, *len);
	/* Huge pages where the kernel gives them (transparent huge pages in
	 * "madvise" mode): filling a fresh slab faults 2 MiB at a time, and
	 * pinning it walks 512 times fewer pages. Best effort. */
	madvise(p, *len, MADV_HUGEPAGE);
	*slab = p;
	return 0;
}

int arena_model_slab_pin(arena_pin_budget *budget, arena_backend *be, uint8_t *slab, uint64_t len)
{
	return arena_pin_budget_register(budget, be, slab, len);
}

void arena_model_slab_drop(arena_pin_budget *budget, arena_backend *be, uint8_t *slab, uint64_t len, int pinned)
{
	if (pinned)
		arena_pin_budget_unregister(budget, be, slab, len);
	munmap(slab, len);
}

void arena_model_host_adopt(arena_model *m, uint32_t b, uint8_t *slab, int pinned)
{
	arena_block_mem *bm = &m->mem[b];
	if (bm->host || bm->wire)
		ARENA_BUG("host_adopt: the block has a host copy");
	const uint64_t len = arena_align_up(m->layout->blocks[b].bytes, ARENA_SLAB_ALIGN);
	bm->host = slab;
	bm->own_host = 1;
	m->host_bytes += m->layout->blocks[b].bytes;
	if (pinned) {
		bm->pinned = 1;
		m->pinned_bytes += len;
	}
	mprotect(slab, len, PROT_READ); /* best effort, as host_seal */
}

int arena_model_host_add(arena_model *m, uint32_t b, uint8_t **slab)
{
	*slab = NULL;
	uint64_t len;
	if (m->mem[b].host || !m->layout->blocks[b].bytes)
		return arena_errorf(ARENA_E_INTERNAL, "block '%s' already has a host slab or is empty",
				    m->layout->blocks[b].name);
	uint8_t *p;
	int rc = arena_model_slab_map(m->layout, b, &p, &len);
	if (rc)
		return rc;
	m->mem[b].host = p;
	m->mem[b].own_host = 1;
	m->host_bytes += m->layout->blocks[b].bytes;
	*slab = p;
	return 0;
}

void arena_model_host_seal(arena_model *m, uint32_t b)
{
	arena_block_mem *bm = &m->mem[b];
	const uint64_t len = arena_model_host_len(m, b);
	/* Pin while writable (CUDA's rule), then read-only. */
	if (arena_pin_budget_register(m->budget, m->backend, host_copy(bm), len)) {
		bm->pinned = 1;
		m->pinned_bytes += len;
	}
	mprotect(host_copy(bm), len, PROT_READ); /* best effort: the bytes are right either way */
}

/* Block b's host copy out of the model now (host, wire, the counts); what
 * is left to do goes to *d (nothing where b has no copy). */
void arena_model_host_release_later(arena_model *m, uint32_t b, arena_host_drop *d)
{
	arena_block_mem *bm = &m->mem[b];
	*d = (arena_host_drop){.p = host_copy(bm), .len = arena_model_host_len(m, b), .pinned = bm->pinned,
			       .own = bm->own_host};
	if (!d->p)
		return;
	if (bm->pinned) {
		m->pinned_bytes -= d->len;
		bm->pinned = 0;
	}
	if (bm->wire) {
		m->host_bytes -= bm->wire->cap;
		arena_wire_free(bm->wire); /* its segments; the buffer is d's */
		bm->wire = NULL;
	} else {
		m->host_bytes -= m->layout->blocks[b].bytes;
		bm->host = NULL;
	}
	bm->own_host = 0;
}

/* The memory given back: unpinned, then unmapped (a mapping of its own) or
 * its pages discarded (in the shared mapping, whose slabs start and end on
 * ARENA_SLAB_ALIGN, a multiple of the page: the pages are its own). */
void arena_model_host_drop_do(arena_pin_budget *budget, arena_backend *be, const arena_host_drop *d)
{
	if (!d->p)
		return;
	if (d->pinned)
		arena_pin_budget_unregister(budget, be, d->p, d->len);
	if (d->own)
		munmap(d->p, d->len);
	else
		madvise(d->p, d->len, MADV_DONTNEED); /* best effort: the memory is unused either way */
}

/* Drop block b's host copy now: both halves on this thread. */
static void host_drop(arena_model *m, uint32_t b)
{
	arena_host_drop d;
	arena_model_host_release_later(m, b, &d);
	arena_model_host_drop_do(m->budget, m->backend, &d);
}

void arena_model_host_discard(arena_model *m, uint32_t b)
{
	if (m->mem[b].own_host)
		host_drop(m, b);
}

void arena_model_host_release(arena_model *m, uint32_t b)
{
	if (host_copy(&m->mem[b]))
		host_drop(m, b);
}

int arena_model_wire_add(arena_model *m, uint32_t b, arena_wire **w)
{
	*w = NULL;
	arena_block_mem *bm = &m->mem[b];
	const arena_wire *plan = bm->disk_wire;
	if (bm->host || bm->wire || !plan || !plan->n)
		return arena_errorf(ARENA_E_USAGE, "block '%s' already has a host copy or has no coded form",
				    m->layout->blocks[b].name);
	const uint64_t len = arena_align_up(plan->cap, ARENA_SLAB_ALIGN);
	arena_wire *nw = arena_calloc(1, sizeof(*nw));
	arena_wire_seg *seg = arena_calloc(plan->n, sizeof(*seg));
	void *buf = MAP_FAILED;
	if (nw && seg)
		buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED) {
		arena_free(nw);
		arena_free(seg);
		return arena_errorf(ARENA_E_NOMEM, "block '%s': out of memory for a coded host copy of %" PRIu64 " bytes",
				    m->layout->blocks[b].name, len);
	}
	arena_wire_sub(plan, 0, plan->n, seg, buf, nw);
	bm->wire = nw;
	bm->own_host = 1;
	m->host_bytes += nw->cap;
	*w = nw;
	return 0;
}
