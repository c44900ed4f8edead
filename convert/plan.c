/* plan.c - block order, layout and the discovery report (see plan.h); discovery is plan_discover.c's. */
#include "plan_int.h"

#include <ctype.h>
#include <limits.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/alloc.h"
#include "../common/err.h"

/* Path components in the known models' execution order (plan.h, order). */
static const char *const known_order[] = {
	"encoder",     "decoder",   "double_blocks", "transformer_blocks", "single_transformer_blocks", "single_blocks",
	"down_blocks", "mid_block", "up_blocks",     "blocks",             "layers",
};
#define N_KNOWN_ORDER (sizeof(known_order) / sizeof(known_order[0]))

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
		rc = arena__plan_discover(d, ids, ck->n_tensors);
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

int arena_plan_build(const arena_ckpt *ck, const arena_plan_opts *opts, arena_layout **out)
{
	static const arena_plan_opts none = {0};
	const arena_plan_opts *o = opts ? opts : &none;
	*out = NULL;
	disc d = {0};
	key *keys = NULL;
	arena_layout *l = NULL;
	int rc = plan_keys(ck, o, &d, &keys);
	arena__plan_disc_free(&d);
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
	arena__plan_disc_free(&d);
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
