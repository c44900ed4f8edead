/* st_write.c - streaming safetensors writer; see st_write.h for the layout and life cycle. */
#include "st_write.h"

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/alloc.h"
#include "../common/err.h"
#include "../common/outfile.h"
#include "safetensors.h"
#include "utf8.h"

#define STW_BUF_SIZE (1u << 20)

enum stw_state { STW_DECLARE, STW_WRITING, STW_BROKEN };
enum stw_mode { STW_NONE, STW_APPEND, STW_POSITIONED }; /* how data is written */

typedef struct stw_entry {
	arena_stw_tensor t; /* name and shape point into owned allocations */
	char *name;
	uint64_t *shape;
} stw_entry;

struct arena_stw {
	arena_outfile *out;
	const char *path;  /* borrowed from out */
	_Atomic int state; /* enum stw_state; pwrite may break it from any thread */
	_Atomic int mode;  /* enum stw_mode, fixed by the first data write */
	char **meta;       /* key, value, key, value, ... in the order set */
	size_t n_meta;
	json_t *names;     /* object used as a set of declared names */
	stw_entry *e;
	size_t n, cap;
	uint64_t data_size, data_off;
	_Atomic uint64_t written; /* append: the position; positioned: the count */
	uint8_t *buf;      /* gathers small writes */
	size_t buf_len;
	pthread_mutex_t fail_mu; /* guards the first data-write failure: */
	int fail_rc;             /* its code (0: none) */
	char fail_msg[512];      /* and its message */
};

/* The reference library's dtype order, ascending (safetensors `Dtype` enum). */
static const arena_dtype dtype_order[] = {
	ARENA_DTYPE_BOOL, ARENA_DTYPE_F4, ARENA_DTYPE_F6_E2M3, ARENA_DTYPE_F6_E3M2,
	ARENA_DTYPE_U8, ARENA_DTYPE_I8, ARENA_DTYPE_F8_E5M2, ARENA_DTYPE_F8_E4M3,
	ARENA_DTYPE_F8_E8M0, ARENA_DTYPE_F8_E4M3FNUZ, ARENA_DTYPE_F8_E5M2FNUZ, ARENA_DTYPE_I16,
	ARENA_DTYPE_U16, ARENA_DTYPE_F16, ARENA_DTYPE_BF16, ARENA_DTYPE_I32,
	ARENA_DTYPE_U32, ARENA_DTYPE_F32, ARENA_DTYPE_C64, ARENA_DTYPE_F64,
	ARENA_DTYPE_I64, ARENA_DTYPE_U64,
};
_Static_assert(sizeof(dtype_order) / sizeof(dtype_order[0]) == ARENA_DTYPE_COUNT,
	       "every dtype needs a place in the data order");

int arena_stw_dtype_rank(arena_dtype dt)
{
	for (int i = 0; i < (int)ARENA_DTYPE_COUNT; i++)
		if (dtype_order[i] == dt)
			return i;
	return -1;
}

static int is_utf8(const char *s)
{
	size_t n = strlen(s);
	return arena_utf8_check((const uint8_t *)s, n) == n;
}

int arena_stw_create(const char *path, arena_stw **out)
{
	return arena_stw_create_flags(path, 0, out);
}

int arena_stw_create_flags(const char *path, unsigned flags, arena_stw **out)
{
	*out = NULL;
	arena_alloc_init();
	arena_stw *w = arena_calloc(1, sizeof(*w));
	if (!w)
		return arena_errorf(ARENA_E_NOMEM, "%s: out of memory", path);
	pthread_mutex_init(&w->fail_mu, NULL);
	w->names = json_object();
	if (!w->names) {
		pthread_mutex_destroy(&w->fail_mu);
		arena_free(w);
		return arena_errorf(ARENA_E_NOMEM, "%s: out of memory", path);
	}
	int rc = arena_outfile_create(path, flags, &w->out);
	if (rc) {
		pthread_mutex_destroy(&w->fail_mu);
		json_decref(w->names);
		arena_free(w);
		return rc;
	}
	w->path = w->out->path;
	*out = w;
	return 0;
}

static int check_declaring(arena_stw *w, const char *what)
{
	if (atomic_load(&w->state) != STW_DECLARE)
		return arena_errorf(ARENA_E_USAGE, "%s: %s after the header was written", w->path, what);
	return 0;
}

int arena_stw_meta(arena_stw *w, const char *key, const char *value)
{
	int rc = check_declaring(w, "metadata set");
	if (rc)
		return rc;
	if (!is_utf8(key) || !is_utf8(value))
		return arena_errorf(ARENA_E_USAGE, "%s: metadata '%s': not valid UTF-8", w->path, arena_q(key));
	for (size_t i = 0; i < w->n_meta; i++)
		if (strcmp(w->meta[2 * i], key) == 0)
			return arena_errorf(ARENA_E_USAGE, "%s: metadata '%s' set twice", w->path, arena_q(key));
	char **m = arena_realloc(w->meta, (w->n_meta + 1) * 2 * sizeof(char *));
	if (!m)
		return arena_errorf(ARENA_E_NOMEM, "%s: out of memory", w->path);
	w->meta = m;
	m[2 * w->n_meta] = arena_strdup(key);
	m[2 * w->n_meta + 1] = arena_strdup(value);
	if (!m[2 * w->n_meta] || !m[2 * w->n_meta + 1]) {
		arena_free(m[2 * w->n_meta]);
		arena_free(m[2 * w->n_meta + 1]);
		return arena_errorf(ARENA_E_NOMEM, "%s: out of memory", w->path);
	}
	w->n_meta++;
	return 0;
}

int arena_stw_add(arena_stw *w, const char *name, arena_dtype dtype, uint32_t rank, const uint64_t *shape)
{
	int rc = check_declaring(w, "tensor declared");
	if (rc)
		return rc;
	if (!is_utf8(name) || strcmp(name, "__metadata__") == 0)
		return arena_errorf(ARENA_E_USAGE, "%s: tensor '%s': not a valid tensor name", w->path, arena_q(name));
	if (arena_dtype_bits(dtype) == 0)
		return arena_errorf(ARENA_E_USAGE, "%s: tensor '%s': invalid dtype %d", w->path, arena_q(name),
				    (int)dtype);
	if (json_object_get(w->names, name))
		return arena_errorf(ARENA_E(DUPLICATE_TENSOR), "%s: tensor '%s' declared twice", w->path,
				    arena_q(name));
	/* Sizes: every number goes into JSON as a signed 64-bit integer. */
	uint64_t nelem = 1;
	for (uint32_t k = 0; k < rank; k++) {
		if (shape[k] > (uint64_t)INT64_MAX || (shape[k] && nelem > (uint64_t)INT64_MAX / shape[k]))
			return arena_errorf(ARENA_E(ST_SIZE_OVERFLOW), "%s: tensor '%s': element count overflows",
					    w->path, arena_q(name));
		nelem *= shape[k];
	}
	unsigned bits = arena_dtype_bits(dtype);
	if (nelem > (uint64_t)INT64_MAX / bits)
		return arena_errorf(ARENA_E(ST_SIZE_OVERFLOW), "%s: tensor '%s': byte count overflows", w->path,
				    arena_q(name));
	if (nelem * bits % 8)
		return arena_errorf(ARENA_E(ST_PARTIAL_BYTES),
				    "%s: tensor '%s': %llu elements of %s are not a whole number of bytes", w->path,
				    arena_q(name), (unsigned long long)nelem, arena_dtype_name(dtype));
	uint64_t nbytes = nelem * bits / 8;
	if (w->n == w->cap) {
		size_t cap = w->cap ? w->cap * 2 : 64;
		stw_entry *e = cap < ((size_t)-1) / sizeof(*e) ? arena_realloc(w->e, cap * sizeof(*e)) : NULL;
		if (!e)
			return arena_errorf(ARENA_E_NOMEM, "%s: out of memory", w->path);
		w->e = e;
		w->cap = cap;
	}
	stw_entry *e = &w->e[w->n];
	memset(e, 0, sizeof(*e));
	e->name = arena_strdup(name);
	e->shape = arena_malloc((rank ? rank : 1) * sizeof(uint64_t));
	if (!e->name || !e->shape || json_object_set_new(w->names, name, json_null())) {
		arena_free(e->name);
		arena_free(e->shape);
		return arena_errorf(ARENA_E_NOMEM, "%s: out of memory", w->path);
	}
	if (rank)
		memcpy(e->shape, shape, rank * sizeof(uint64_t));
	e->t.name = e->name;
	e->t.dtype = dtype;
	e->t.rank = rank;
	e->t.shape = e->shape;
	e->t.nelem = nelem;
	e->t.nbytes = nbytes;
	w->n++;
	return 0;
}

static int entry_cmp(const void *a, const void *b)
{
	const stw_entry *x = a, *y = b;
	int rx = arena_stw_dtype_rank(x->t.dtype), ry = arena_stw_dtype_rank(y->t.dtype);
	if (rx != ry)
		return rx > ry ? -1 : 1;
	return strcmp(x->name, y->name);
}

/* The header is serialised here, not with json_dumps: jansson 2.14 drops an
 * object key without an error when an allocation fails while dumping it
 * (seen with fault injection), and a header must never be silently wrong.
 * The output is serde_json's compact form, as the reference writes it:
 * strings escape '"', '\\' and control characters only (\b \f \n \r \t,
 * others as \u00xx), UTF-8 passes through. hdr_* count the bytes when
 * h->out is NULL. */
typedef struct hdr {
	char *out;
	size_t n;
} hdr;

static void hdr_put(hdr *h, const char *s, size_t len)
{
	if (h->out)
		memcpy(h->out + h->n, s, len);
	h->n += len;
}

static void hdr_lit(hdr *h, const char *s)
{
	hdr_put(h, s, strlen(s));
}

static void hdr_u64(hdr *h, uint64_t v)
{
	char b[24];
	int len = snprintf(b, sizeof(b), "%llu", (unsigned long long)v);
	hdr_put(h, b, (size_t)len);
}

static void hdr_str(hdr *h, const char *s)
{
	static const char hex[] = "0123456789abcdef";
	hdr_put(h, "\"", 1);
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		char e[6] = {'\\', 0, '0', '0', hex[c >> 4], hex[c & 15]};
		switch (c) {
		case '"': case '\\': e[1] = (char)c; break;
		case '\b': e[1] = 'b'; break;
		case '\f': e[1] = 'f'; break;
		case '\n': e[1] = 'n'; break;
		case '\r': e[1] = 'r'; break;
		case '\t': e[1] = 't'; break;
		default: e[1] = c < 0x20 ? 'u' : 0; break;
		}
		if (!e[1])
			hdr_put(h, s, 1);
		else
			hdr_put(h, e, e[1] == 'u' ? 6 : 2);
	}
	hdr_put(h, "\"", 1);
}

static void hdr_emit(const arena_stw *w, hdr *h)
{
	hdr_lit(h, "{");
	if (w->n_meta) {
		hdr_lit(h, "\"__metadata__\":{");
		for (size_t i = 0; i < w->n_meta; i++) {
			if (i)
				hdr_lit(h, ",");
			hdr_str(h, w->meta[2 * i]);
			hdr_lit(h, ":");
			hdr_str(h, w->meta[2 * i + 1]);
		}
		hdr_lit(h, w->n ? "}," : "}");
	}
	for (size_t i = 0; i < w->n; i++) {
		const arena_stw_tensor *t = &w->e[i].t;
		if (i)
			hdr_lit(h, ",");
		hdr_str(h, t->name);
		hdr_lit(h, ":{\"dtype\":");
		hdr_str(h, arena_dtype_name(t->dtype));
		hdr_lit(h, ",\"shape\":[");
		for (uint32_t k = 0; k < t->rank; k++) {
			if (k)
				hdr_lit(h, ",");
			hdr_u64(h, t->shape[k]);
		}
		hdr_lit(h, "],\"data_offsets\":[");
		hdr_u64(h, t->begin);
		hdr_lit(h, ",");
		hdr_u64(h, t->end);
		hdr_lit(h, "]}");
	}
	hdr_lit(h, "}");
}

int arena_stw_begin(arena_stw *w)
{
	int rc = check_declaring(w, "header begun");
	if (rc)
		return rc;
	atomic_store(&w->state, STW_BROKEN); /* until it succeeds */
	if (w->n > 1)
		qsort(w->e, w->n, sizeof(*w->e), entry_cmp);
	uint64_t off = 0;
	for (size_t i = 0; i < w->n; i++) {
		arena_stw_tensor *t = &w->e[i].t;
		if (t->nbytes > (uint64_t)INT64_MAX - off)
			return arena_errorf(ARENA_E(ST_SIZE_OVERFLOW), "%s: data section over 2^63 bytes", w->path);
		t->begin = off;
		t->end = off + t->nbytes;
		off = t->end;
	}
	w->data_size = off;

	hdr h = {NULL, 0};
	hdr_emit(w, &h);
	size_t len = h.n, padded = (len + 7) & ~(size_t)7;
	if (padded > ARENA_ST_MAX_HEADER)
		return arena_errorf(ARENA_E(ST_HEADER_TOO_LARGE), "%s: header of %zu bytes is over %llu", w->path,
				    padded, (unsigned long long)ARENA_ST_MAX_HEADER);
	uint8_t *head = arena_malloc(8 + padded);
	w->buf = arena_malloc(STW_BUF_SIZE);
	if (!head || !w->buf) {
		arena_free(head);
		return arena_errorf(ARENA_E_NOMEM, "%s: out of memory", w->path);
	}
	for (int k = 0; k < 8; k++)
		head[k] = (uint8_t)((uint64_t)padded >> (8 * k));
	h.out = (char *)head + 8;
	h.n = 0;
	hdr_emit(w, &h);
	memset(head + 8 + len, ' ', padded - len);
	rc = arena_outfile_write(w->out, head, 8 + padded);
	arena_free(head);
	if (rc)
		return rc;
	w->data_off = 8 + padded;
	atomic_store(&w->state, STW_WRITING);
	return 0;
}

size_t arena_stw_count(const arena_stw *w)
{
	return w->n;
}

const arena_stw_tensor *arena_stw_get(const arena_stw *w, size_t i)
{
	return atomic_load(&w->state) == STW_WRITING && i < w->n ? &w->e[i].t : NULL;
}

uint64_t arena_stw_data_size(const arena_stw *w)
{
	return w->data_size;
}

uint64_t arena_stw_data_offset(const arena_stw *w)
{
	return w->data_off;
}

uint64_t arena_stw_written(const arena_stw *w)
{
	return atomic_load(&w->written);
}

static int flush_buf(arena_stw *w)
{
	if (!w->buf_len)
		return 0;
	int rc = arena_outfile_write(w->out, w->buf, w->buf_len);
	w->buf_len = 0;
	return rc;
}

/* Fix the data mode on first use; USAGE when the other one is in use. */
static int claim_mode(arena_stw *w, int mode)
{
	int none = STW_NONE;
	if (atomic_compare_exchange_strong(&w->mode, &none, mode) || none == mode)
		return 0;
	return arena_errorf(ARENA_E_USAGE, "%s: data written both in order and by position", w->path);
}

/* A data write failed with rc (its message set on this thread): break the
 * writer, keeping the first failure so that calls on other threads report
 * it rather than a consequence of it. Returns rc. */
static int data_failed(arena_stw *w, int rc)
{
	pthread_mutex_lock(&w->fail_mu);
	if (!w->fail_rc) {
		w->fail_rc = rc;
		snprintf(w->fail_msg, sizeof(w->fail_msg), "%s", arena_last_error());
	}
	pthread_mutex_unlock(&w->fail_mu);
	atomic_store(&w->state, STW_BROKEN);
	return rc;
}

static int check_writing(arena_stw *w)
{
	int st = atomic_load(&w->state);
	if (st == STW_WRITING)
		return 0;
	if (st == STW_DECLARE)
		return arena_errorf(ARENA_E_USAGE, "%s: data written before the header", w->path);
	pthread_mutex_lock(&w->fail_mu);
	int rc = w->fail_rc;
	if (rc)
		arena_errorf(rc, "%s", w->fail_msg);
	pthread_mutex_unlock(&w->fail_mu);
	return rc ? rc : arena_errorf(ARENA_E_USAGE, "%s: data written after a failure", w->path);
}

int arena_stw_write(arena_stw *w, const void *buf, size_t n)
{
	int rc = check_writing(w);
	if (!rc)
		rc = claim_mode(w, STW_APPEND);
	if (rc)
		return rc;
	uint64_t pos = atomic_load(&w->written);
	if (n > w->data_size - pos)
		return data_failed(w, arena_errorf(ARENA_E_USAGE,
						   "%s: %zu data bytes written past the end of the last tensor",
						   w->path, n - (size_t)(w->data_size - pos)));
	if (n <= STW_BUF_SIZE - w->buf_len) {
		memcpy(w->buf + w->buf_len, buf, n);
		w->buf_len += n;
		if (w->buf_len == STW_BUF_SIZE)
			rc = flush_buf(w);
	} else {
		rc = flush_buf(w);
		if (!rc)
			rc = arena_outfile_write(w->out, buf, n);
	}
	if (rc)
		return data_failed(w, rc);
	atomic_store(&w->written, pos + n);
	return 0;
}

int arena_stw_pwrite(arena_stw *w, uint64_t off, const void *buf, size_t n)
{
	int rc = check_writing(w);
	if (!rc)
		rc = claim_mode(w, STW_POSITIONED);
	if (rc)
		return rc;
	if (n > w->data_size || off > w->data_size - n)
		return data_failed(w, arena_errorf(ARENA_E_USAGE,
						   "%s: data bytes [%llu, %llu) written past the end of the last tensor",
						   w->path, (unsigned long long)off, (unsigned long long)off + n));
	rc = arena_outfile_pwrite(w->out, buf, n, w->data_off + off);
	if (rc)
		return data_failed(w, rc);
	atomic_fetch_add(&w->written, n);
	return 0;
}

static void stw_free(arena_stw *w)
{
	for (size_t i = 0; i < w->n; i++) {
		arena_free(w->e[i].name);
		arena_free(w->e[i].shape);
	}
	arena_free(w->e);
	arena_free(w->buf);
	for (size_t i = 0; i < 2 * w->n_meta; i++)
		arena_free(w->meta[i]);
	arena_free(w->meta);
	json_decref(w->names);
	pthread_mutex_destroy(&w->fail_mu);
	arena_free(w);
}

int arena_stw_commit(arena_stw *w)
{
	int rc = 0;
	if (atomic_load(&w->state) == STW_DECLARE)
		rc = arena_stw_begin(w);
	if (!rc && atomic_load(&w->state) != STW_WRITING)
		rc = arena_errorf(ARENA_E_USAGE, "%s: commit after a failure", w->path);
	uint64_t written = atomic_load(&w->written);
	if (!rc && written != w->data_size && atomic_load(&w->mode) == STW_POSITIONED) {
		rc = arena_errorf(ARENA_E_USAGE, "%s: incomplete: %llu of %llu data bytes written", w->path,
				  (unsigned long long)written, (unsigned long long)w->data_size);
	} else if (!rc && written != w->data_size) {
		size_t i = 0;
		while (i + 1 < w->n && w->e[i].t.end <= written)
			i++;
		rc = arena_errorf(ARENA_E_USAGE, "%s: tensor '%s' incomplete: %llu of %llu data bytes written",
				  w->path, arena_q(w->e[i].name), (unsigned long long)written,
				  (unsigned long long)w->data_size);
	}
	if (!rc)
		rc = flush_buf(w);
	if (rc) {
		arena_outfile_abort(w->out);
	} else {
		rc = arena_outfile_commit(w->out);
	}
	w->out = NULL;
	stw_free(w);
	return rc;
}

void arena_stw_abort(arena_stw *w)
{
	if (!w)
		return;
	arena_outfile_abort(w->out);
	stw_free(w);
}
