/* plan_discover.c - block discovery: which containers of a checkpoint are block sequences (see plan.h).
 *
 * The rules are plan.h's (containers, rules 1-3, single blocks); what this
 * file and plan.c share is plan_int.h. Also the known list names, and
 * arena_plan_match_builtin, the rule by name alone kept for comparison. */
#include "plan_int.h"

#include <ctype.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../common/alloc.h"
#include "../common/err.h"

/* Block list names of common layouts: a container of one of these names is
 * a block sequence even with one member (plan.h, rule 1). */
static const char *const known_lists[] = {
	"double_blocks", "transformer_blocks", "single_transformer_blocks", "single_blocks",
	"down_blocks",   "up_blocks",          "blocks",                    "layers",
};
#define N_KNOWN_LISTS (sizeof(known_lists) / sizeof(known_lists[0]))

#define DEPTH_MAX 128 /* components looked into */
#define KINDS_MAX 64  /* different sets of names among a container's members */

/* The index a component stands for, or -1 (plan.h: decimal digits, no
 * leading zero, at most 18 digits). */
static int64_t comp_index(const char *c, size_t len)
{
	if (len == 0 || len > 18 || (c[0] == '0' && len > 1))
		return -1;
	int64_t v = 0;
	for (size_t i = 0; i < len; i++) {
		if (!isdigit((unsigned char)c[i]))
			return -1;
		v = v * 10 + (c[i] - '0');
	}
	return v;
}

int arena_plan_match_builtin(const char *name, size_t *clen, int64_t *index)
{
	for (const char *p = name; *p; p++) {
		if (p != name && p[-1] != '.')
			continue;
		const char *dot = strchr(p, '.');
		if (!dot)
			return 0;
		size_t n = (size_t)(dot - p);
		if (n == 9 && memcmp(p, "mid_block", 9) == 0) {
			*clen = (size_t)(p - name) + n;
			*index = -1;
			return 1;
		}
		if (known_in(known_lists, N_KNOWN_LISTS, p, n) < 0)
			continue;
		const char *q = dot + 1;
		if (!isdigit((unsigned char)*q))
			continue;
		int64_t idx = 0;
		const char *d = q;
		while (isdigit((unsigned char)*d) && idx < (INT64_MAX - 9) / 10)
			idx = idx * 10 + (*d++ - '0');
		if (*d != '.')
			continue;
		*clen = (size_t)(p - name) + n;
		*index = idx;
		return 1;
	}
	return 0;
}

/* ---- discovery ---------------------------------------------------------- */

/* A module's tensors: ids[0..n) in name order, all under the same prefix of
 * `off` characters (ending in '.'), so name + off are its names. */
typedef struct span {
	const uint32_t *ids;
	size_t n, off;
} span;

/* An accepted sequence, for the single-block test of the modules beside it. */
typedef struct seqinfo {
	size_t n_kinds;
	span kind[KINDS_MAX]; /* one member of each set of names */
	uint64_t min_bytes;   /* its smallest block */
} seqinfo;

#define NAME(d, id) ((d)->ck->tensors[id]->name)

/* A child of a module: the tensors whose next component is comp. */
typedef struct group {
	size_t start, n; /* into the module's ids */
	const char *comp;
	size_t len;
	int64_t index;      /* comp as an index, or -1 */
	int indexed_child;  /* some name goes on "<comp>.<index>." */
} group;

static int same_names(const disc *d, span a, span b)
{
	if (a.n != b.n)
		return 0;
	for (size_t i = 0; i < a.n; i++)
		if (strcmp(NAME(d, a.ids[i]) + a.off, NAME(d, b.ids[i]) + b.off) != 0)
			return 0;
	return 1;
}

static int same_shapes(const disc *d, span a, span b)
{
	for (size_t i = 0; i < a.n; i++) {
		const arena_st_tensor *x = d->ck->tensors[a.ids[i]], *y = d->ck->tensors[b.ids[i]];
		if (x->rank != y->rank || memcmp(x->shape, y->shape, x->rank * sizeof(uint64_t)) != 0)
			return 0;
	}
	return 1;
}

/* Alike (plan.h): they share at least half of the smaller one's names. Both
 * lists are sorted (names under one prefix keep their order). */
static int alike(const disc *d, span a, span b)
{
	size_t i = 0, j = 0, common = 0;
	while (i < a.n && j < b.n) {
		int c = strcmp(NAME(d, a.ids[i]) + a.off, NAME(d, b.ids[j]) + b.off);
		if (c == 0)
			common++;
		i += c <= 0;
		j += c >= 0;
	}
	size_t m = a.n < b.n ? a.n : b.n;
	return common > 0 && 2 * common >= m;
}

static uint64_t span_bytes(const disc *d, span s)
{
	uint64_t b = 0;
	for (size_t i = 0; i < s.n; i++)
		b += d->ck->tensors[s.ids[i]]->nbytes;
	return b;
}

/* The block name of a member or module: its path, name up to off - 1. */
static char *span_path(const disc *d, span s)
{
	const char *nm = NAME(d, s.ids[0]);
	size_t n = s.off ? s.off - 1 : 0;
	char *p = arena_malloc(n + 1);
	if (p) {
		memcpy(p, nm, n);
		p[n] = '\0';
	}
	return p;
}

static int record(disc *d, span s, arena_plan_verdict v, arena_plan_reason r, uint64_t members, uint64_t n_alike,
		  int64_t first, int64_t last, const span *like)
{
	if (!d->found)
		return 0;
	if (d->n_found == d->cap_found) {
		size_t cap = d->cap_found ? 2 * d->cap_found : 16;
		arena_plan_found *f = arena_realloc(d->found, cap * sizeof(*f));
		if (!f)
			return arena_errorf(ARENA_E_NOMEM, "out of memory");
		d->found = f;
		d->cap_found = cap;
	}
	arena_plan_found *f = &d->found[d->n_found];
	memset(f, 0, sizeof(*f));
	f->path = span_path(d, s);
	f->like = like ? span_path(d, *like) : NULL;
	if (!f->path || (like && !f->like)) {
		arena_free(f->path);
		arena_free(f->like);
		return arena_errorf(ARENA_E_NOMEM, "out of memory");
	}
	d->n_found++;
	f->verdict = v;
	f->reason = r;
	f->members = members;
	f->alike = n_alike;
	f->first = first;
	f->last = last;
	f->tensors = s.n;
	f->bytes = span_bytes(d, s);
	return 0;
}

/* Split module m into its children (tensors directly in it are left out:
 * they stay where the module's tensors go). Children are runs: names under
 * one prefix are contiguous in name order. */
static size_t children(const disc *d, span m, group *g)
{
	size_t ng = 0;
	for (size_t i = 0; i < m.n; i++) {
		const char *rest = NAME(d, m.ids[i]) + m.off;
		const char *dot = strchr(rest, '.');
		if (!dot)
			continue;
		size_t len = (size_t)(dot - rest);
		if (ng && g[ng - 1].start + g[ng - 1].n == i && g[ng - 1].len == len &&
		    memcmp(g[ng - 1].comp, rest, len) == 0) {
			g[ng - 1].n++;
		} else {
			g[ng] = (group){.start = i, .n = 1, .comp = rest, .len = len, .index = comp_index(rest, len)};
			ng++;
		}
		const char *next = dot + 1, *dot2 = strchr(next, '.');
		if (dot2 && comp_index(next, (size_t)(dot2 - next)) >= 0)
			g[ng - 1].indexed_child = 1;
	}
	return ng;
}

static span child_span(span m, const group *g)
{
	return (span){m.ids + g->start, g->n, m.off + g->len + 1};
}

static void assign(disc *d, span s, size_t clen, int64_t index)
{
	for (size_t i = 0; i < s.n; i++) {
		d->hit[s.ids[i]] = 1;
		d->clen[s.ids[i]] = clen;
		d->index[s.ids[i]] = index;
	}
}

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return x < y ? -1 : x > y;
}

static int walk(disc *d, span m, int depth, seqinfo *self);

/* Judge container m (plan.h, rules 1-3) with its members g[mem[0..k)].
 * Returns 1 (a sequence: its blocks assigned, self filled), 0 or an error. */
static int judge(disc *d, span m, const group *g, const size_t *mem, size_t k, int depth, seqinfo *self)
{
	int64_t first = INT64_MAX, last = -1;
	for (size_t i = 0; i < k; i++) {
		int64_t x = g[mem[i]].index;
		first = x < first ? x : first;
		last = x > last ? x : last;
	}
	arena_plan_reason why = ARENA_PLAN_DIFFER;
	uint64_t n_alike = 0;
	int ok = 0;
	size_t *kind_of = NULL, *count = NULL;
	uint8_t *kind_alike = NULL;
	int64_t *idx = NULL;
	int rc = 0;
	if (k == 1) {
		const char *path = NAME(d, m.ids[0]);
		size_t plen = m.off - 1, s = plen;
		while (s && path[s - 1] != '.')
			s--;
		ok = known_in(known_lists, N_KNOWN_LISTS, path + s, plen - s) >= 0;
		why = ok ? ARENA_PLAN_KNOWN_ONE : ARENA_PLAN_ONE;
		self->n_kinds = 1;
		self->kind[0] = child_span(m, &g[mem[0]]);
		goto done;
	}
	idx = arena_malloc(k * sizeof(*idx));
	kind_of = arena_malloc(k * sizeof(*kind_of));
	count = arena_calloc(KINDS_MAX, sizeof(*count));
	kind_alike = arena_calloc(KINDS_MAX, 1);
	if (!idx || !kind_of || !count || !kind_alike) {
		rc = arena_errorf(ARENA_E_NOMEM, "out of memory");
		goto out;
	}
	for (size_t i = 0; i < k; i++)
		idx[i] = g[mem[i]].index;
	qsort(idx, k, sizeof(*idx), cmp_i64);
	if ((uint64_t)(last - first) != k - 1) { /* indices are distinct: a hole */
		why = ARENA_PLAN_GAPS;
		goto done;
	}
	size_t nk = 0;
	for (size_t i = 0; i < k; i++) {
		span s = child_span(m, &g[mem[i]]);
		size_t r = 0;
		while (r < nk && !same_names(d, s, self->kind[r]))
			r++;
		if (r == nk) {
			if (nk == KINDS_MAX) {
				why = ARENA_PLAN_DIFFER;
				goto done;
			}
			self->kind[nk++] = s;
		}
		kind_of[i] = r;
		count[r]++;
	}
	self->n_kinds = nk;
	for (size_t r = 0; r < nk; r++)
		kind_alike[r] = count[r] > 1;
	for (size_t r = 0; r < nk; r++)
		for (size_t q = r + 1; q < nk; q++)
			if ((!kind_alike[r] || !kind_alike[q]) && alike(d, self->kind[r], self->kind[q]))
				kind_alike[r] = kind_alike[q] = 1;
	for (size_t r = 0; r < nk; r++)
		n_alike += kind_alike[r] ? count[r] : 0;
	ok = 2 * n_alike > k;
	if (!ok) {
		why = ARENA_PLAN_DIFFER;
	} else if (nk > 1) {
		why = ARENA_PLAN_MOST;
	} else {
		why = ARENA_PLAN_SAME;
		for (size_t i = 1; i < k && why == ARENA_PLAN_SAME; i++)
			if (!same_shapes(d, self->kind[0], child_span(m, &g[mem[i]])))
				why = ARENA_PLAN_SAME_NAMES;
	}
done:
	rc = record(d, m, ok ? ARENA_PLAN_SEQUENCE : ARENA_PLAN_REJECTED, why, k, n_alike, first, last, NULL);
	if (!rc && d->found) { /* its members' tensors: not those directly in it or in named children */
		arena_plan_found *f = &d->found[d->n_found - 1];
		f->tensors = f->bytes = 0;
		for (size_t i = 0; i < k; i++) {
			f->tensors += g[mem[i]].n;
			f->bytes += span_bytes(d, child_span(m, &g[mem[i]]));
		}
	}
	if (rc)
		goto out;
	if (ok) {
		self->min_bytes = UINT64_MAX;
		for (size_t i = 0; i < k; i++) {
			span s = child_span(m, &g[mem[i]]);
			uint64_t b = span_bytes(d, s);
			self->min_bytes = b < self->min_bytes ? b : self->min_bytes;
			assign(d, s, m.off - 1, g[mem[i]].index);
		}
	} else {
		for (size_t i = 0; i < k && !rc; i++)
			rc = walk(d, child_span(m, &g[mem[i]]), depth + 1, NULL);
	}
out:
	arena_free(idx);
	arena_free(kind_of);
	arena_free(count);
	arena_free(kind_alike);
	return rc ? rc : ok;
}

/* Module s beside the sequences sib[0..n): a single block, globals, or
 * looked into (plan.h, single blocks). */
static int single(disc *d, span s, const seqinfo *sib, size_t n, int depth)
{
	const span *like = NULL;
	for (size_t j = 0; j < n; j++)
		for (size_t r = 0; r < sib[j].n_kinds; r++) {
			if (!alike(d, s, sib[j].kind[r]))
				continue;
			if (!like)
				like = &sib[j].kind[r];
			if (span_bytes(d, s) >= sib[j].min_bytes) {
				assign(d, s, s.off - 1, -1);
				return record(d, s, ARENA_PLAN_SINGLE, ARENA_PLAN_LIKE, 1, 0, -1, -1, &sib[j].kind[r]);
			}
		}
	if (like)
		return record(d, s, ARENA_PLAN_REJECTED, ARENA_PLAN_SMALL, 1, 0, -1, -1, like);
	return walk(d, s, depth, NULL);
}

/* Look into module m (depth = components above it; the top is 0): judge it
 * if it is a container, then its children. Returns 1 when m is a sequence
 * (self filled), 0, or an error. */
static int walk(disc *d, span m, int depth, seqinfo *self)
{
	if (depth > DEPTH_MAX || m.n == 0)
		return 0;
	group *g = arena_malloc(m.n * sizeof(*g));
	size_t *mem = arena_malloc(m.n * sizeof(*mem));
	size_t *pass1 = arena_malloc(m.n * sizeof(*pass1));
	seqinfo *sib = NULL, *own = NULL;
	int rc = 0, is_seq = 0;
	if (!g || !mem || !pass1) {
		rc = arena_errorf(ARENA_E_NOMEM, "out of memory");
		goto out;
	}
	size_t ng = children(d, m, g), k = 0, n1 = 0;
	for (size_t i = 0; i < ng; i++) {
		if (m.off > 0 && g[i].index >= 0)
			mem[k++] = i;
		else if (g[i].indexed_child)
			pass1[n1++] = i;
	}
	if (k) {
		if (!self && !(self = own = arena_malloc(sizeof(*own)))) {
			rc = arena_errorf(ARENA_E_NOMEM, "out of memory");
			goto out;
		}
		rc = judge(d, m, g, mem, k, depth, self);
		if (rc < 0)
			goto out;
		is_seq = rc;
		rc = 0;
	}
	/* containers among the children first: the modules beside them are
	 * judged against the sequences they turn out to be */
	sib = n1 ? arena_malloc(n1 * sizeof(*sib)) : NULL;
	if (n1 && !sib) {
		rc = arena_errorf(ARENA_E_NOMEM, "out of memory");
		goto out;
	}
	size_t ns = 0;
	for (size_t j = 0; j < n1; j++) {
		rc = walk(d, child_span(m, &g[pass1[j]]), depth + 1, &sib[ns]);
		if (rc < 0)
			goto out;
		ns += (size_t)rc;
		rc = 0;
	}
	for (size_t i = 0; i < ng && !rc; i++) {
		if ((m.off > 0 && g[i].index >= 0) || g[i].indexed_child)
			continue;
		span c = child_span(m, &g[i]);
		rc = ns ? single(d, c, sib, ns, depth + 1) : walk(d, c, depth + 1, NULL);
		if (rc > 0)
			rc = 0;
	}
out:
	arena_free(g);
	arena_free(mem);
	arena_free(pass1);
	arena_free(sib);
	arena_free(own);
	return rc < 0 ? rc : is_seq;
}

int arena__plan_discover(disc *d, const uint32_t *ids, size_t n)
{
	return walk(d, (span){ids, n, 0}, 0, NULL);
}

void arena__plan_disc_free(disc *d)
{
	arena_free(d->hit);
	arena_free(d->clen);
	arena_free(d->index);
	for (size_t i = 0; i < d->n_found; i++) {
		arena_free(d->found[i].path);
		arena_free(d->found[i].like);
	}
	arena_free(d->found);
	memset(d, 0, sizeof(*d));
}
