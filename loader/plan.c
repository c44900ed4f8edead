/* plan.c - block discovery, execution order and placement (see plan.h). */
#include "plan.h"

#include <ctype.h>
#include <limits.h>
#include <regex.h>
#include <stdio.h>
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

/* Path components in the known models' execution order (plan.h, order). */
static const char *const known_order[] = {
	"encoder",     "decoder",   "double_blocks", "transformer_blocks", "single_transformer_blocks", "single_blocks",
	"down_blocks", "mid_block", "up_blocks",     "blocks",             "layers",
};
#define N_KNOWN_ORDER (sizeof(known_order) / sizeof(known_order[0]))

#define DEPTH_MAX 128 /* components looked into */
#define KINDS_MAX 64  /* different sets of names among a container's members */

static int known_in(const char *const *list, size_t n, const char *c, size_t len)
{
	for (size_t k = 0; k < n; k++)
		if (strlen(list[k]) == len && memcmp(list[k], c, len) == 0)
			return (int)k;
	return -1;
}

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

typedef struct disc {
	const arena_ckpt *ck;
	uint8_t *hit;   /* per tensor: in a block (else globals) */
	size_t *clen;   /* per tensor: its block's container length */
	int64_t *index; /* per tensor: its block's index, -1 for a single */
	arena_plan_found *found; /* the report, or NULL when not wanted */
	size_t n_found, cap_found;
} disc;

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

/* ---- order ---------------------------------------------------------------- */

/* Paths compared component by component (plan.h, order). */
static int path_cmp(const char *a, const char *b)
{
	for (;;) {
		if (!*a || !*b)
			return (*a != '\0') - (*b != '\0');
		size_t la = strcspn(a, "."), lb = strcspn(b, ".");
		if (la != lb || memcmp(a, b, la) != 0) {
			int ka = known_in(known_order, N_KNOWN_ORDER, a, la);
			int kb = known_in(known_order, N_KNOWN_ORDER, b, lb);
			if (ka >= 0 || kb >= 0) {
				if (ka < 0 || kb < 0)
					return ka < 0 ? 1 : -1;
				return ka < kb ? -1 : 1;
			}
			int c = memcmp(a, b, la < lb ? la : lb);
			return c ? c : (la < lb ? -1 : 1);
		}
		a += la + (a[la] == '.');
		b += lb + (b[lb] == '.');
	}
}

typedef struct key {
	char *container; /* NULL for globals */
	int64_t index;
	int rank;        /* -1 globals, [0, n_order) --block-order, n_order the rest */
	uint32_t tensor;
} key;

static int container_rank(const char *c, const arena_plan_opts *o)
{
	if (!c)
		return -1; /* globals first */
	for (size_t i = 0; i < o->n_order; i++) {
		size_t n = strlen(c), m = strlen(o->order[i]);
		if (strcmp(c, o->order[i]) == 0 || (n > m && c[n - m - 1] == '.' && strcmp(c + n - m, o->order[i]) == 0))
			return (int)i;
	}
	return (int)o->n_order;
}

static int cmp_key(const void *a, const void *b)
{
	const key *x = a, *y = b;
	if (x->rank != y->rank)
		return x->rank < y->rank ? -1 : 1;
	if (x->container && y->container) {
		int c = path_cmp(x->container, y->container);
		if (c)
			return c;
	}
	if (x->index != y->index)
		return x->index < y->index ? -1 : 1;
	return x->tensor < y->tensor ? -1 : x->tensor > y->tensor;
}

static int same_block(const key *x, const key *y)
{
	if (!x->container || !y->container)
		return !x->container && !y->container;
	return strcmp(x->container, y->container) == 0 && x->index == y->index;
}

/* Match with user regexes; returns 1 and fills clen/index, 0 if global. */
static int match_user(const regex_t *re, size_t n, const char *name, size_t *clen, int64_t *index)
{
	for (size_t i = 0; i < n; i++) {
		regmatch_t m[2];
		if (regexec(&re[i], name, 2, m, 0) != 0 || m[1].rm_so < 0)
			continue;
		int64_t idx = 0;
		regoff_t k = m[1].rm_so;
		if (k == m[1].rm_eo)
			continue;
		for (; k < m[1].rm_eo; k++) {
			if (!isdigit((unsigned char)name[k]) || idx > (INT64_MAX - 9) / 10)
				break;
			idx = idx * 10 + (name[k] - '0');
		}
		if (k != m[1].rm_eo)
			continue;
		size_t c = (size_t)m[1].rm_so;
		while (c && (name[c - 1] == '.' || name[c - 1] == '_'))
			c--;
		*clen = c;
		*index = idx;
		return 1;
	}
	return 0;
}

void arena_plan_plain(const arena_st_tensor *src, arena_tensor *t)
{
	strcpy(t->scheme, "none");
	t->n_comp = 1;
	strcpy(t->comp[0].name, "data");
	t->comp[0].dtype = src->dtype;
	t->comp[0].rank = src->rank;
	memcpy(t->comp[0].shape, src->shape, src->rank * sizeof(uint64_t));
	t->comp[0].bytes = src->nbytes;
}

static char *block_name(const key *k)
{
	if (!k->container)
		return arena_strdup("globals");
	if (k->index < 0)
		return arena_strdup(k->container);
	size_t n = strlen(k->container) + 24;
	char *s = arena_malloc(n);
	if (s)
		snprintf(s, n, "%s.%lld", k->container, (long long)k->index);
	return s;
}

const char *arena_plan_ckpt_name(const arena_ckpt *ck, char *buf, size_t len)
{
	if (ck->index_path)
		snprintf(buf, len, "%s", ck->index_path);
	else if (ck->n_files == 1)
		snprintf(buf, len, "%s", ck->files[0]->path);
	else if (ck->n_files > 1)
		snprintf(buf, len, "%s and %zu other file%s", ck->files[0]->path, ck->n_files - 1,
			 ck->n_files == 2 ? "" : "s");
	else
		snprintf(buf, len, "checkpoint");
	return buf;
}

int arena_plan_check_ckpt(const arena_ckpt *ck)
{
	for (size_t i = 0; i < ck->n_tensors; i++) {
		const arena_st_tensor *t = ck->tensors[i];
		if (t->rank > ARENA_MAX_RANK)
			return arena_errorf(ARENA_E(ST_BAD_SHAPE), "%s: tensor '%s': rank %u is over arena's limit of %d",
					    t->file->path, arena_q(t->name), t->rank, ARENA_MAX_RANK);
	}
	return 0;
}

/* Every tensor's block as sorted keys (execution order): by opts' patterns
 * or by discovery, recording what discovery judged in d->found when it is
 * not NULL. Checks the patterns and the order. */
static int plan_keys(const arena_ckpt *ck, const arena_plan_opts *o, disc *d, key **out)
{
	char who[1100];
	*out = NULL;
	if (ck->n_tensors == 0)
		return arena_errorf(ARENA_E(PLAN_EMPTY), "%s: checkpoint has no tensors",
				    arena_plan_ckpt_name(ck, who, sizeof(who)));
	int rc = arena_plan_check_ckpt(ck);
	if (rc)
		return rc;
	regex_t *re = NULL;
	size_t n_re = 0;
	key *keys = NULL;
	uint8_t *order_used = NULL;
	uint32_t *ids = NULL;

	if (o->n_patterns) {
		re = arena_calloc(o->n_patterns, sizeof(*re));
		if (!re)
			return arena_errorf(ARENA_E_NOMEM, "out of memory");
		for (; n_re < o->n_patterns; n_re++) {
			int e = regcomp(&re[n_re], o->patterns[n_re], REG_EXTENDED);
			if (e) {
				char msg[128];
				regerror(e, &re[n_re], msg, sizeof(msg));
				rc = arena_errorf(ARENA_E(PLAN_BAD_PATTERN), "block pattern '%s': %s",
						  arena_q(o->patterns[n_re]), msg);
				goto out;
			}
			if (re[n_re].re_nsub != 1) {
				rc = arena_errorf(ARENA_E(PLAN_BAD_PATTERN),
						  "block pattern '%s': needs exactly one capture group for the index, has %zu",
						  arena_q(o->patterns[n_re]), (size_t)re[n_re].re_nsub);
				n_re++;
				goto out;
			}
		}
	}
	keys = arena_calloc(ck->n_tensors, sizeof(*keys));
	order_used = arena_calloc(o->n_order + 1, 1);
	d->ck = ck;
	d->clen = arena_calloc(ck->n_tensors, sizeof(*d->clen));
	d->index = arena_calloc(ck->n_tensors, sizeof(*d->index));
	d->hit = arena_calloc(ck->n_tensors, 1);
	if (!keys || !order_used || !d->clen || !d->index || !d->hit) {
		rc = arena_errorf(ARENA_E_NOMEM, "out of memory");
		goto out;
	}
	if (n_re) {
		for (size_t i = 0; i < ck->n_tensors; i++)
			d->hit[i] = (uint8_t)match_user(re, n_re, ck->tensors[i]->name, &d->clen[i], &d->index[i]);
	} else {
		ids = arena_malloc(ck->n_tensors * sizeof(*ids));
		if (!ids) {
			rc = arena_errorf(ARENA_E_NOMEM, "out of memory");
			goto out;
		}
		for (size_t i = 0; i < ck->n_tensors; i++)
			ids[i] = (uint32_t)i;
		rc = walk(d, (span){ids, ck->n_tensors, 0}, 0, NULL);
		if (rc < 0)
			goto out;
		rc = 0;
	}
	for (size_t i = 0; i < ck->n_tensors; i++) {
		const char *name = ck->tensors[i]->name;
		size_t clen = d->clen[i];
		keys[i].tensor = (uint32_t)i;
		keys[i].index = d->hit[i] ? d->index[i] : -1;
		if (d->hit[i]) {
			keys[i].container = arena_malloc(clen + 1);
			if (!keys[i].container) {
				rc = arena_errorf(ARENA_E_NOMEM, "out of memory");
				goto out;
			}
			memcpy(keys[i].container, name, clen);
			keys[i].container[clen] = '\0';
		}
		keys[i].rank = container_rank(keys[i].container, o);
		if (keys[i].rank >= 0 && (size_t)keys[i].rank < o->n_order)
			order_used[keys[i].rank] = 1;
	}
	for (size_t i = 0; i < o->n_order; i++)
		if (!order_used[i]) {
			rc = arena_errorf(ARENA_E(PLAN_BAD_ORDER), "%s: block order: '%s' names no container of this model",
					  arena_plan_ckpt_name(ck, who, sizeof(who)), arena_q(o->order[i]));
			goto out;
		}
	qsort(keys, ck->n_tensors, sizeof(*keys), cmp_key);
out:
	arena_free(ids);
	arena_free(order_used);
	for (size_t i = 0; i < n_re; i++)
		regfree(&re[i]);
	arena_free(re);
	if (rc) {
		for (size_t i = 0; keys && i < ck->n_tensors; i++)
			arena_free(keys[i].container);
		arena_free(keys);
		return rc;
	}
	*out = keys;
	return 0;
}

static void keys_free(key *keys, size_t n)
{
	for (size_t i = 0; keys && i < n; i++)
		arena_free(keys[i].container);
	arena_free(keys);
}

static void disc_free(disc *d)
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

int arena_plan_build(const arena_ckpt *ck, const arena_plan_opts *opts, arena_layout **out)
{
	static const arena_plan_opts none = {0};
	const arena_plan_opts *o = opts ? opts : &none;
	*out = NULL;
	disc d = {0};
	key *keys = NULL;
	arena_layout *l = NULL;
	int rc = plan_keys(ck, o, &d, &keys);
	disc_free(&d);
	if (rc)
		return rc;
	size_t nb = 0;
	for (size_t i = 0; i < ck->n_tensors; i++)
		if (i == 0 || !same_block(&keys[i - 1], &keys[i]))
			nb++;
	if ((rc = arena_layout_create(nb, ck->n_tensors, &l)))
		goto out;
	size_t b = (size_t)-1, nt = 0;
	for (size_t i = 0; i < ck->n_tensors; i++) {
		if (i == 0 || !same_block(&keys[i - 1], &keys[i])) {
			b++;
			l->blocks[b].name = block_name(&keys[i]);
			l->blocks[b].container = keys[i].container ? arena_strdup(keys[i].container) : NULL;
			l->blocks[b].index = keys[i].index;
			if (!l->blocks[b].name || (keys[i].container && !l->blocks[b].container)) {
				rc = arena_errorf(ARENA_E_NOMEM, "out of memory");
				goto out;
			}
		}
		const arena_st_tensor *src = ck->tensors[keys[i].tensor];
		arena_tensor *t = &l->tensors[nt];
		t->name = arena_strdup(src->name);
		if (!t->name) {
			rc = arena_errorf(ARENA_E_NOMEM, "out of memory");
			goto out;
		}
		t->dtype = src->dtype;
		t->rank = src->rank;
		memcpy(t->shape, src->shape, src->rank * sizeof(uint64_t));
		t->block = (uint32_t)b;
		t->src = src;
		int skip = 0;
		if (o->choose) {
			rc = o->choose(o->choose_ctx, src, ck, &l->blocks[b], t, &skip);
			if (rc)
				goto out;
		} else {
			arena_plan_plain(src, t);
		}
		if (skip) { /* folded into another tensor (e.g. a compressed-tensors scale) */
			arena_free(t->name);
			memset(t, 0, sizeof(*t));
			continue;
		}
		nt++;
	}
	l->n_tensors = nt;
	rc = arena_layout_place(l);
out:
	keys_free(keys, ck->n_tensors);
	if (rc) {
		arena_layout_free(l);
		return rc;
	}
	*out = l;
	return 0;
}

/* ---- the discovery report ------------------------------------------------- */

/* The report's order: blocks in execution order, then the rejected by path. */
typedef struct found_key {
	arena_plan_found f;
	int rank; /* container_rank, or INT_MAX for the rejected */
} found_key;

static int cmp_found(const void *a, const void *b)
{
	const found_key *x = a, *y = b;
	if (x->rank != y->rank)
		return x->rank < y->rank ? -1 : 1;
	if (x->f.verdict == ARENA_PLAN_REJECTED)
		return strcmp(x->f.path, y->f.path);
	return path_cmp(x->f.path, y->f.path);
}

static int report_sort(arena_plan_found *f, size_t n, const arena_plan_opts *o)
{
	if (n < 2)
		return 0;
	found_key *fk = arena_malloc(n * sizeof(*fk));
	if (!fk)
		return arena_errorf(ARENA_E_NOMEM, "out of memory");
	for (size_t i = 0; i < n; i++) {
		fk[i].f = f[i];
		fk[i].rank = f[i].verdict == ARENA_PLAN_REJECTED ? INT_MAX : container_rank(f[i].path, o);
	}
	qsort(fk, n, sizeof(*fk), cmp_found);
	for (size_t i = 0; i < n; i++)
		f[i] = fk[i].f;
	arena_free(fk);
	return 0;
}

int arena_plan_describe(const arena_ckpt *ck, const arena_plan_opts *opts, arena_plan_report **out)
{
	static const arena_plan_opts none = {0};
	const arena_plan_opts *o = opts ? opts : &none;
	*out = NULL;
	disc d = {0};
	key *keys = NULL;
	arena_plan_report *r = arena_calloc(1, sizeof(*r));
	if (!r)
		return arena_errorf(ARENA_E_NOMEM, "out of memory");
	/* a non-NULL found asks discovery to record */
	d.found = arena_malloc(16 * sizeof(*d.found));
	d.cap_found = 16;
	if (!d.found) {
		arena_free(r);
		return arena_errorf(ARENA_E_NOMEM, "out of memory");
	}
	int rc = plan_keys(ck, o, &d, &keys);
	if (rc)
		goto out;
	/* blocks, and with patterns the containers they found */
	for (size_t i = 0; i < ck->n_tensors; i++) {
		const key *k = &keys[i];
		const arena_st_tensor *t = ck->tensors[k->tensor];
		if (i == 0 || !same_block(&keys[i - 1], k))
			r->n_blocks++;
		if (!k->container) {
			r->global_tensors++;
			r->global_bytes += t->nbytes;
			continue;
		}
		if (!o->n_patterns)
			continue;
		arena_plan_found *f = d.n_found ? &d.found[d.n_found - 1] : NULL;
		if (!f || strcmp(f->path, k->container) != 0) {
			if (d.n_found == d.cap_found) {
				arena_plan_found *nf = arena_realloc(d.found, 2 * d.cap_found * sizeof(*nf));
				if (!nf) {
					rc = arena_errorf(ARENA_E_NOMEM, "out of memory");
					goto out;
				}
				d.found = nf;
				d.cap_found *= 2;
			}
			f = &d.found[d.n_found];
			memset(f, 0, sizeof(*f));
			if (!(f->path = arena_strdup(k->container))) {
				rc = arena_errorf(ARENA_E_NOMEM, "out of memory");
				goto out;
			}
			d.n_found++;
			f->verdict = ARENA_PLAN_SEQUENCE;
			f->reason = ARENA_PLAN_PATTERN;
			f->first = f->last = k->index;
		}
		if (i == 0 || !same_block(&keys[i - 1], k))
			f->members++;
		f->first = k->index < f->first ? k->index : f->first;
		f->last = k->index > f->last ? k->index : f->last;
		f->tensors++;
		f->bytes += t->nbytes;
	}
	if ((rc = report_sort(d.found, d.n_found, o)))
		goto out;
	r->found = d.found;
	r->n_found = d.n_found;
	d.found = NULL;
	d.n_found = 0;
out:
	keys_free(keys, ck->n_tensors);
	disc_free(&d);
	if (rc) {
		arena_plan_report_free(r);
		return rc;
	}
	*out = r;
	return 0;
}

void arena_plan_report_free(arena_plan_report *r)
{
	if (!r)
		return;
	for (size_t i = 0; i < r->n_found; i++) {
		arena_free(r->found[i].path);
		arena_free(r->found[i].like);
	}
	arena_free(r->found);
	arena_free(r);
}

const char *arena_plan_reason_text(arena_plan_reason r)
{
	switch (r) {
	case ARENA_PLAN_SAME:
		return "repeating";
	case ARENA_PLAN_SAME_NAMES:
		return "repeating, shapes differ";
	case ARENA_PLAN_MOST:
		return "mostly repeating";
	case ARENA_PLAN_KNOWN_ONE:
		return "one member, known name";
	case ARENA_PLAN_PATTERN:
		return "block pattern";
	case ARENA_PLAN_LIKE:
		return "single";
	case ARENA_PLAN_ONE:
		return "one member";
	case ARENA_PLAN_GAPS:
		return "indices not consecutive";
	case ARENA_PLAN_DIFFER:
		return "members differ";
	case ARENA_PLAN_SMALL:
		return "smaller than the blocks it is like";
	}
	return "?";
}

size_t arena_plan_report_line(const arena_plan_report *r, char *buf, size_t len)
{
	size_t n = 0;
#define PUT(...)                                                                         \
	do {                                                                             \
		int w_ = snprintf(buf ? buf + (n < len ? n : len) : NULL,                  \
				  buf && n < len ? len - n : 0, __VA_ARGS__);               \
		n += w_ > 0 ? (size_t)w_ : 0;                                            \
	} while (0)
	if (buf && len)
		buf[0] = '\0';
	PUT("blocks: ");
	size_t shown = 0, rejected = 0;
	for (size_t i = 0; i < r->n_found; i++) {
		const arena_plan_found *f = &r->found[i];
		if (f->verdict == ARENA_PLAN_REJECTED) {
			rejected++;
			continue;
		}
		PUT("%s", shown++ ? ", " : "");
		if (f->verdict == ARENA_PLAN_SINGLE)
			PUT("%s (single, like %s)", f->path, f->like);
		else if (f->reason == ARENA_PLAN_MOST)
			PUT("%s (%llu, %s: %llu alike)", f->path, (unsigned long long)f->members,
			    arena_plan_reason_text(f->reason), (unsigned long long)f->alike);
		else
			PUT("%s (%llu, %s)", f->path, (unsigned long long)f->members, arena_plan_reason_text(f->reason));
	}
	if (!shown)
		PUT("none");
	PUT("; globals: %llu tensor%s", (unsigned long long)r->global_tensors, r->global_tensors == 1 ? "" : "s");
	if (rejected) {
		PUT("; rejected: ");
		shown = 0;
		for (size_t i = 0; i < r->n_found; i++) {
			const arena_plan_found *f = &r->found[i];
			if (f->verdict != ARENA_PLAN_REJECTED)
				continue;
			PUT("%s", shown++ ? ", " : "");
			if (f->reason == ARENA_PLAN_SMALL)
				PUT("%s (%s %s)", f->path, arena_plan_reason_text(f->reason), f->like);
			else
				PUT("%s (%s)", f->path, arena_plan_reason_text(f->reason));
		}
	}
#undef PUT
	return n;
}
