/* profile.c - a compute profile on disk (see profile.h). */
#include "profile.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "../common/alloc.h"
#include "../common/err.h"
#include "../common/io.h"
#include "../common/outfile.h"
#include "engine.h"

#define FORMAT "arena-profile-1"

static int finite_ge0(double v)
{
	return isfinite(v) && v >= 0;
}

int arena_profile_write(const char *path, const arena_layout *l, const double *cost, double h2d, double bwd)
{
	if (!(finite_ge0(h2d) && h2d > 0) || !finite_ge0(bwd))
		return arena_errorf(ARENA_E_USAGE, "profile: the rate (%g) must be > 0 and the backward factor (%g) >= 0",
				    h2d, bwd);
	for (size_t b = 0; b < l->n_blocks; b++)
		if (!arena_block_is_globals(l, (uint32_t)b) && !finite_ge0(cost[b]))
			return arena_errorf(ARENA_E_USAGE, "profile: block '%s' costs %g seconds", l->blocks[b].name,
					    cost[b]);
	json_t *blocks = json_object(), *root = json_object();
	int rc = blocks && root ? 0 : arena_errorf(ARENA_E_NOMEM, "profile: out of memory");
	for (size_t b = 0; !rc && b < l->n_blocks; b++)
		if (!arena_block_is_globals(l, (uint32_t)b) &&
		    json_object_set_new(blocks, l->blocks[b].name, json_real(cost[b])))
			rc = arena_errorf(ARENA_E_NOMEM, "profile: out of memory");
	if (!rc && (json_object_set_new(root, "format", json_string(FORMAT)) ||
		    json_object_set_new(root, "h2d_bytes_per_s", json_real(h2d)) ||
		    json_object_set_new(root, "backward_factor", json_real(bwd)) || json_object_set(root, "blocks", blocks)))
		rc = arena_errorf(ARENA_E_NOMEM, "profile: out of memory");
	char *text = rc ? NULL : json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
	json_decref(blocks);
	json_decref(root);
	if (!rc && !text)
		rc = arena_errorf(ARENA_E_NOMEM, "profile: out of memory");
	arena_outfile *f = NULL;
	if (!rc && !(rc = arena_outfile_open(path, &f)) && !(rc = arena_outfile_write(f, text, strlen(text))) &&
	    !(rc = arena_outfile_write(f, "\n", 1))) {
		rc = arena_outfile_commit(f);
		f = NULL;
	}
	arena_outfile_abort(f);
	json_free_t jfree;
	json_get_alloc_funcs(NULL, &jfree);
	if (text)
		jfree(text); /* jansson's own allocator (arena's after arena_alloc_init) */
	return rc;
}

static int bad(const char *path, const char *what)
{
	return arena_errorf(ARENA_E(PROFILE_BAD), "%s: %s", path, what);
}

int arena_profile_read(const char *path, const arena_layout *l, double *cost, double *h2d, double *bwd)
{
	int fd;
	int rc = arena_open_input(path, 0, &fd, NULL);
	if (rc)
		return rc;
	json_error_t jerr;
	unsigned long mark = arena_json_parse_begin();
	json_t *root = json_loadfd(fd, JSON_REJECT_DUPLICATES, &jerr);
	int err = errno, oom = arena_json_parse_end(mark);
	close(fd);
	char msg[512];
	if (!root) {
		enum json_error_code code = json_error_code(&jerr);
		if (code == json_error_cannot_open_file)
			return arena_syserrorf(ARENA_E_IO, err, "%s: cannot read", path);
		if (code == json_error_out_of_memory || oom)
			return arena_errorf(ARENA_E_NOMEM, "%s: out of memory", path);
		return arena_errorf(ARENA_E(PROFILE_BAD), "%s: line %d column %d: %s", path, jerr.line, jerr.column,
				    arena_q(jerr.text));
	}
	if (oom) {
		json_decref(root);
		return arena_errorf(ARENA_E_NOMEM, "%s: out of memory", path);
	}
	json_t *fmt = json_object_get(root, "format"), *r = json_object_get(root, "h2d_bytes_per_s"),
	       *f = json_object_get(root, "backward_factor"), *blocks = json_object_get(root, "blocks");
	const char *key;
	json_t *v;
	if (!json_is_object(root))
		rc = bad(path, "not a JSON object");
	else if (!json_is_string(fmt) || strcmp(json_string_value(fmt), FORMAT))
		rc = bad(path, "\"format\" is not \"" FORMAT "\"");
	else if (!json_is_number(r) || !(json_number_value(r) > 0) || !isfinite(json_number_value(r)))
		rc = bad(path, "\"h2d_bytes_per_s\" is not a number > 0");
	else if (!json_is_number(f) || !finite_ge0(json_number_value(f)))
		rc = bad(path, "\"backward_factor\" is not a number >= 0");
	else if (!json_is_object(blocks))
		rc = bad(path, "\"blocks\" is not an object of block names to seconds");
	if (!rc)
		json_object_foreach(root, key, v) if (strcmp(key, "format") && strcmp(key, "h2d_bytes_per_s") &&
						      strcmp(key, "backward_factor") && strcmp(key, "blocks"))
		{
			snprintf(msg, sizeof(msg), "unknown field %s", arena_q(key));
			rc = bad(path, msg);
			break;
		}
	for (size_t b = 0; !rc && b < l->n_blocks; b++) {
		cost[b] = 0;
		if (arena_block_is_globals(l, (uint32_t)b))
			continue;
		json_t *c = json_object_get(blocks, l->blocks[b].name);
		if (!c || !json_is_number(c) || !finite_ge0(json_number_value(c))) {
			snprintf(msg, sizeof(msg), "block %s: %s", arena_q(l->blocks[b].name),
				 c ? "its seconds are not a number >= 0" : "missing (a profile of another model?)");
			rc = bad(path, msg);
		} else {
			cost[b] = json_number_value(c);
		}
	}
	if (!rc)
		json_object_foreach(blocks, key, v)
		{
			size_t b = 0;
			while (b < l->n_blocks && (strcmp(l->blocks[b].name, key) || arena_block_is_globals(l, (uint32_t)b)))
				b++;
			if (b == l->n_blocks) {
				snprintf(msg, sizeof(msg), "block %s is not a block of this model", arena_q(key));
				rc = bad(path, msg);
				break;
			}
		}
	if (!rc) {
		*h2d = json_number_value(r);
		*bwd = json_number_value(f);
	}
	json_decref(root);
	return rc;
}
