/* plan.c - block discovery, execution order and placement (see plan.h). */
#include "plan.h"

#include <ctype.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/alloc.h"
#include "../common/err.h"

/* Known containers in execution order across the layouts that use them.
 * `single` marks blocks that are not indexed (a UNet's mid_block). */
static const struct {
	const char *name;
	int single;
} known[] = {
	{"double_blocks", 0}, {"transformer_blocks", 0}, {"single_transformer_blocks", 0},
	{"single_blocks", 0}, {"down_blocks", 0},        {"mid_block", 1},
	{"up_blocks", 0},     {"blocks", 0},             {"layers", 0},
};
#define N_KNOWN (sizeof(known) / sizeof(known[0]))

int arena_plan_match_builtin(const char *name, size_t *clen, int64_t *index)
{
	for (const char *p = name; *p; p++) {
		if (p != name && p[-1] != '.')
			continue;
		for (size_t k = 0; k < N_KNOWN; k++) {
			size_t n = strlen(known[k].name);
			if (strncmp(p, known[k].name, n) != 0 || p[n] != '.')
				continue;
			const char *q = p + n + 1;
			if (known[k].single) {
				*clen = (size_t)(p - name) + n;
				*index = -1;
				return 1;
			}
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
	}
	return 0;
}

typedef struct key {
	char *container; /* NULL for globals */
	int64_t index;
	int rank;        /* order rank of the container */
	uint32_t tensor;
} key;

static int container_rank(const char *c, const arena_plan_opts *o)
{
	if (!c)
		return -1; /* globals first */
	const char *last = strrchr(c, '.');
	last = last ? last + 1 : c;
	for (size_t i = 0; i < o->n_order; i++) {
		size_t n = strlen(c), m = strlen(o->order[i]);
		if (strcmp(c, o->order[i]) == 0 || (n > m && c[n - m - 1] == '.' && strcmp(c + n - m, o->order[i]) == 0))
			return (int)i;
	}
	for (size_t k = 0; k < N_KNOWN; k++)
		if (strcmp(last, known[k].name) == 0)
			return (int)(o->n_order + k);
	return (int)(o->n_order + N_KNOWN);
}

static int cmp_key(const void *a, const void *b)
{
	const key *x = a, *y = b;
	if (x->rank != y->rank)
		return x->rank < y->rank ? -1 : 1;
	if (x->container && y->container) {
		int c = strcmp(x->container, y->container);
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
static int match_user(const regex_t *re, size_t n, const char *name, size_t *clen, int64_t *index, size_t *blen)
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
		*blen = (size_t)m[1].rm_eo;
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

int arena_plan_build(const arena_ckpt *ck, const arena_plan_opts *opts, arena_layout **out)
{
	static const arena_plan_opts none = {0};
	const arena_plan_opts *o = opts ? opts : &none;
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
	arena_layout *l = NULL;
	uint8_t *order_used = NULL;

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
	if (!keys || !order_used) {
		rc = arena_errorf(ARENA_E_NOMEM, "out of memory");
		goto out;
	}
	for (size_t i = 0; i < ck->n_tensors; i++) {
		const char *name = ck->tensors[i]->name;
		size_t clen = 0, blen = 0;
		int64_t idx = -1;
		int hit = n_re ? match_user(re, n_re, name, &clen, &idx, &blen)
			       : arena_plan_match_builtin(name, &clen, &idx);
		keys[i].tensor = (uint32_t)i;
		keys[i].index = idx;
		if (hit) {
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
	for (size_t i = 0; keys && i < ck->n_tensors; i++)
		arena_free(keys[i].container);
	arena_free(keys);
	arena_free(order_used);
	for (size_t i = 0; i < n_re; i++)
		regfree(&re[i]);
	arena_free(re);
	if (rc) {
		arena_layout_free(l);
		return rc;
	}
	*out = l;
	return 0;
}
