/* safetensors.c - strict safetensors validation; see safetensors.h for the rules and their order. */
#include "safetensors.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/alloc.h"
#include "../common/err.h"
#include "../common/io.h"
#include "utf8.h"

#define E(name) ARENA_E(name)

static uint64_t le64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}

static int is_uint(const json_t *v)
{
	return json_is_integer(v) && json_integer_value(v) >= 0;
}

/* "-0" is valid JSON that jansson reads as the integer 0, but serde_json
 * (behind the reference library) reads it as a float, so there a shape or
 * data_offsets entry spelt "-0" is not an integer and the file is refused.
 * To be no more lenient, every integer token spelt "-0" is turned into the
 * real -0.0 before the checks. The k-th number token of the text is the k-th
 * number met walking the parsed tree in order (jansson keeps object order,
 * and duplicate keys are refused), so tokens are matched by their ordinal. */
typedef struct neg_zeros {
	size_t *ord;  /* ordinals of the "-0" tokens, ascending */
	size_t n, next;
	size_t seen;  /* numbers met so far in the walk */
} neg_zeros;

/* Count (and, with z->ord, record) the "-0" integer tokens of valid JSON text. */
static size_t scan_neg_zeros(const char *s, size_t len, neg_zeros *z)
{
	size_t count = 0, k = 0;
	int in_str = 0;
	for (size_t i = 0; i < len; i++) {
		char c = s[i];
		if (in_str) {
			if (c == '\\')
				i++;
			else if (c == '"')
				in_str = 0;
		} else if (c == '"') {
			in_str = 1;
		} else if (c == '-' || (c >= '0' && c <= '9')) {
			size_t b = i;
			while (i + 1 < len && s[i + 1] && strchr("0123456789+-.eE", s[i + 1]))
				i++;
			if (i == b + 1 && s[b] == '-' && s[b + 1] == '0') {
				if (z->ord)
					z->ord[count] = k;
				count++;
			}
			k++;
		}
	}
	return count;
}

/* Replace the recorded "-0" integers below v by -0.0; 0 or NOMEM. */
static int fix_neg_zeros(json_t *v, neg_zeros *z)
{
	size_t i;
	const char *key;
	json_t *x;
	if (json_is_array(v)) {
		json_array_foreach(v, i, x) {
			if (z->next == z->n)
				return 0;
			if (json_is_number(x)) {
				if (z->ord[z->next] == z->seen++) {
					z->next++;
					if (json_array_set_new(v, i, json_real(-0.0)))
						return ARENA_E_NOMEM;
				}
			} else if (fix_neg_zeros(x, z)) {
				return ARENA_E_NOMEM;
			}
		}
	} else if (json_is_object(v)) {
		json_object_foreach(v, key, x) {
			if (z->next == z->n)
				return 0;
			if (json_is_number(x)) {
				if (z->ord[z->next] == z->seen++) {
					z->next++;
					if (json_object_set_new(v, key, json_real(-0.0)))
						return ARENA_E_NOMEM;
				}
			} else if (fix_neg_zeros(x, z)) {
				return ARENA_E_NOMEM;
			}
		}
	}
	return 0;
}

static int neg_zeros_to_reals(arena_st_file *f, json_t *root, const char *text)
{
	neg_zeros z = {0};
	z.n = scan_neg_zeros(text, (size_t)f->header_len, &z);
	if (!z.n)
		return 0;
	z.ord = arena_calloc(z.n, sizeof(*z.ord));
	if (!z.ord)
		return arena_errorf(ARENA_E_NOMEM, "%s: out of memory parsing the header", f->path);
	scan_neg_zeros(text, (size_t)f->header_len, &z);
	int rc = fix_neg_zeros(root, &z);
	arena_free(z.ord);
	if (rc)
		return arena_errorf(ARENA_E_NOMEM, "%s: out of memory parsing the header", f->path);
	return 0;
}

/* Per-entry checks, in the documented order. Fills t except sizes. */
static int check_entry(arena_st_file *f, const char *name, json_t *v, arena_st_tensor *t,
		       uint64_t **shape_cursor)
{
	const char *lbl = f->path;
	if (!json_is_object(v))
		return arena_errorf(E(ST_TENSOR_NOT_OBJECT), "%s: tensor '%s': entry is not a JSON object",
				    lbl, arena_q(name));
	const char *key;
	json_t *field;
	json_object_foreach(v, key, field) {
		if (strcmp(key, "dtype") && strcmp(key, "shape") && strcmp(key, "data_offsets"))
			return arena_errorf(E(ST_UNKNOWN_FIELD), "%s: tensor '%s': unknown field '%s'", lbl,
					    arena_q(name), arena_q(key));
	}
	json_t *dt = json_object_get(v, "dtype");
	json_t *shape = json_object_get(v, "shape");
	json_t *offs = json_object_get(v, "data_offsets");
	const char *missing = !dt ? "dtype" : !shape ? "shape" : !offs ? "data_offsets" : NULL;
	if (missing)
		return arena_errorf(E(ST_MISSING_FIELD), "%s: tensor '%s': missing field '%s'", lbl,
				    arena_q(name), missing);
	if (!json_is_string(dt))
		return arena_errorf(E(ST_BAD_DTYPE), "%s: tensor '%s': dtype is not a string", lbl,
				    arena_q(name));
	if (!json_is_array(shape))
		return arena_errorf(E(ST_BAD_SHAPE), "%s: tensor '%s': shape is not a list", lbl,
				    arena_q(name));
	size_t rank = json_array_size(shape);
	for (size_t i = 0; i < rank; i++)
		if (!is_uint(json_array_get(shape, i)))
			return arena_errorf(E(ST_BAD_SHAPE),
					    "%s: tensor '%s': shape[%zu] is not a non-negative integer", lbl,
					    arena_q(name), i);
	if (!json_is_array(offs) || json_array_size(offs) != 2)
		return arena_errorf(E(ST_BAD_OFFSETS), "%s: tensor '%s': data_offsets is not a list of 2",
				    lbl, arena_q(name));
	for (size_t i = 0; i < 2; i++)
		if (!is_uint(json_array_get(offs, i)))
			return arena_errorf(E(ST_BAD_OFFSETS),
					    "%s: tensor '%s': data_offsets[%zu] is not a non-negative integer",
					    lbl, arena_q(name), i);
	arena_dtype d = arena_dtype_from_name(json_string_value(dt));
	if (d == ARENA_DTYPE_INVALID)
		return arena_errorf(E(ST_UNKNOWN_DTYPE), "%s: tensor '%s': unknown dtype '%s'", lbl,
				    arena_q(name), arena_q(json_string_value(dt)));
	t->name = name;
	t->dtype = d;
	t->rank = (uint32_t)rank;
	t->shape = *shape_cursor;
	for (size_t i = 0; i < rank; i++)
		(*shape_cursor)[i] = (uint64_t)json_integer_value(json_array_get(shape, i));
	*shape_cursor += rank;
	t->begin = (uint64_t)json_integer_value(json_array_get(offs, 0));
	t->end = (uint64_t)json_integer_value(json_array_get(offs, 1));
	t->file = f;
	return 0;
}

static int check_metadata(arena_st_file *f, json_t *meta)
{
	if (!json_is_object(meta))
		return arena_errorf(E(ST_BAD_METADATA), "%s: __metadata__ is not a JSON object", f->path);
	size_t n = json_object_size(meta);
	f->meta_keys = arena_calloc(n, sizeof(char *));
	f->meta_vals = arena_calloc(n, sizeof(char *));
	if (!f->meta_keys || !f->meta_vals)
		return arena_errorf(ARENA_E_NOMEM, "%s: out of memory reading __metadata__", f->path);
	const char *key;
	json_t *v;
	json_object_foreach(meta, key, v) {
		if (!json_is_string(v))
			return arena_errorf(E(ST_BAD_METADATA), "%s: __metadata__ '%s': value is not a string",
					    f->path, arena_q(key));
		f->meta_keys[f->n_meta] = key;
		f->meta_vals[f->n_meta] = json_string_value(v);
		f->n_meta++;
	}
	return 0;
}

static int cmp_by_offsets(const void *a, const void *b)
{
	const arena_st_tensor *x = *(const arena_st_tensor *const *)a, *y = *(const arena_st_tensor *const *)b;
	if (x->begin != y->begin)
		return x->begin < y->begin ? -1 : 1;
	if (x->end != y->end)
		return x->end < y->end ? -1 : 1;
	return strcmp(x->name, y->name);
}

static int cmp_by_name(const void *a, const void *b)
{
	return strcmp(((const arena_st_tensor *)a)->name, ((const arena_st_tensor *)b)->name);
}

static int check_sizes(arena_st_file *f, arena_st_tensor *t)
{
	uint64_t nelem = 1;
	for (uint32_t i = 0; i < t->rank; i++)
		if (__builtin_mul_overflow(nelem, t->shape[i], &nelem))
			return arena_errorf(E(ST_SIZE_OVERFLOW), "%s: tensor '%s': element count overflows",
					    f->path, arena_q(t->name));
	uint64_t bits;
	if (__builtin_mul_overflow(nelem, (uint64_t)arena_dtype_bits(t->dtype), &bits))
		return arena_errorf(E(ST_SIZE_OVERFLOW), "%s: tensor '%s': size in bits overflows", f->path,
				    arena_q(t->name));
	if (bits % 8)
		return arena_errorf(E(ST_PARTIAL_BYTES),
				    "%s: tensor '%s': %llu elements of %s are not a whole number of bytes",
				    f->path, arena_q(t->name), (unsigned long long)nelem,
				    arena_dtype_name(t->dtype));
	t->nelem = nelem;
	t->nbytes = bits / 8;
	if (t->end - t->begin != t->nbytes)
		return arena_errorf(E(ST_SIZE_MISMATCH),
				    "%s: tensor '%s': data_offsets [%llu, %llu) span %llu bytes, dtype and shape need %llu",
				    f->path, arena_q(t->name), (unsigned long long)t->begin,
				    (unsigned long long)t->end, (unsigned long long)(t->end - t->begin),
				    (unsigned long long)t->nbytes);
	return 0;
}

/* Offsets pass over tensors sorted by (begin, end). */
static int check_layout(arena_st_file *f, arena_st_tensor **by_off, size_t n, uint64_t data_len)
{
	for (size_t i = 0; i < n; i++)
		if (by_off[i]->end < by_off[i]->begin)
			return arena_errorf(E(ST_OFFSET_REVERSED),
					    "%s: tensor '%s': data_offsets [%llu, %llu) end before begin", f->path,
					    arena_q(by_off[i]->name), (unsigned long long)by_off[i]->begin,
					    (unsigned long long)by_off[i]->end);
	uint64_t pos = 0;
	for (size_t i = 0; i < n; i++) {
		const arena_st_tensor *t = by_off[i];
		if (t->begin != pos) {
			if (i == 0)
				return arena_errorf(E(ST_OFFSET_START),
						    "%s: tensor '%s': first tensor starts at %llu, not 0", f->path,
						    arena_q(t->name), (unsigned long long)t->begin);
			if (t->begin > pos)
				return arena_errorf(E(ST_OFFSET_GAP),
						    "%s: tensor '%s': gap of %llu bytes before it (begins at %llu, previous ends at %llu)",
						    f->path, arena_q(t->name), (unsigned long long)(t->begin - pos),
						    (unsigned long long)t->begin, (unsigned long long)pos);
			return arena_errorf(E(ST_OFFSET_OVERLAP),
					    "%s: tensor '%s': begins at %llu, inside '%s' which ends at %llu", f->path,
					    arena_q(t->name), (unsigned long long)t->begin,
					    arena_q(by_off[i - 1]->name), (unsigned long long)pos);
		}
		pos = t->end;
	}
	for (size_t i = 0; i < n; i++) {
		int rc = check_sizes(f, by_off[i]);
		if (rc)
			return rc;
	}
	if (data_len == UINT64_MAX) /* a header alone (arena_st_parse_header): the data is as long as it says */
		return 0;
	if (pos > data_len)
		return arena_errorf(E(ST_DATA_PAST_EOF),
				    "%s: tensor '%s': data ends at %llu, past the %llu bytes of data in the file",
				    f->path, arena_q(by_off[n - 1]->name), (unsigned long long)pos,
				    (unsigned long long)data_len);
	if (pos < data_len)
		return arena_errorf(E(ST_TRAILING_BYTES), "%s: %llu bytes after the last tensor's data",
				    f->path, (unsigned long long)(data_len - pos));
	return 0;
}

/* Validate the file whose first bytes are at buf: its first 8 (when it has
 * them), and all 8 + N of the header when N passes the length checks. */
static int parse_header(arena_st_file *f, const uint8_t *buf)
{
	if (f->size < 8)
		return arena_errorf(E(ST_TOO_SHORT), "%s: file is %llu bytes, shorter than the 8-byte header length",
				    f->path, (unsigned long long)f->size);
	uint64_t n = le64(buf);
	if (n > ARENA_ST_MAX_HEADER)
		return arena_errorf(E(ST_HEADER_TOO_LARGE), "%s: header length %llu is over the limit of %llu",
				    f->path, (unsigned long long)n, ARENA_ST_MAX_HEADER);
	if (n > f->size - 8)
		return arena_errorf(E(ST_HEADER_PAST_EOF),
				    "%s: header length %llu runs past the end of the %llu-byte file", f->path,
				    (unsigned long long)n, (unsigned long long)f->size);
	f->header_len = n;
	f->data_off = 8 + n;
	size_t bad = arena_utf8_check(buf + 8, (size_t)n);
	if (bad != (size_t)n)
		return arena_errorf(E(ST_HEADER_UTF8), "%s: header is not UTF-8 at byte %llu of the file",
				    f->path, (unsigned long long)(8 + bad));

	arena_alloc_init();
	json_error_t jerr;
	unsigned long mark = arena_json_parse_begin();
	json_t *root = json_loadb((const char *)buf + 8, (size_t)n, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
	int oom = arena_json_parse_end(mark);
	if (!root) {
		enum json_error_code c = json_error_code(&jerr);
		if (c == json_error_out_of_memory || oom)
			return arena_errorf(ARENA_E_NOMEM, "%s: out of memory parsing the header", f->path);
		return arena_errorf(c == json_error_duplicate_key ? E(ST_DUPLICATE_KEY) : E(ST_HEADER_JSON),
				    "%s: header JSON at byte %d: %s", f->path, 8 + jerr.position,
				    arena_q(jerr.text));
	}
	f->json = root;
	/* A parse can also succeed, on altered text, after an allocation failed. */
	if (oom)
		return arena_errorf(ARENA_E_NOMEM, "%s: out of memory parsing the header", f->path);
	int rc = neg_zeros_to_reals(f, root, (const char *)buf + 8);
	if (rc)
		return rc;
	if (!json_is_object(root))
		return arena_errorf(E(ST_HEADER_NOT_OBJECT), "%s: header is not a JSON object", f->path);

	/* Count tensors and dims to size the allocations (bounded by the header). */
	size_t nt = 0, ndims = 0;
	const char *key;
	json_t *v;
	json_object_foreach(root, key, v) {
		if (strcmp(key, "__metadata__") == 0)
			continue;
		nt++;
		json_t *shape = json_is_object(v) ? json_object_get(v, "shape") : NULL;
		if (json_is_array(shape))
			ndims += json_array_size(shape);
	}
	f->tensors = arena_calloc(nt, sizeof(*f->tensors));
	f->shape_pool = arena_calloc(ndims, sizeof(uint64_t));
	arena_st_tensor **by_off = arena_calloc(nt, sizeof(*by_off));
	if (!f->tensors || !f->shape_pool || !by_off) {
		arena_free(by_off);
		return arena_errorf(ARENA_E_NOMEM, "%s: out of memory for %zu tensors", f->path, nt);
	}
	rc = 0;
	uint64_t *cursor = f->shape_pool;
	json_object_foreach(root, key, v) {
		if (strcmp(key, "__metadata__") == 0)
			continue;
		rc = check_entry(f, key, v, &f->tensors[f->n_tensors], &cursor);
		if (rc)
			goto out;
		by_off[f->n_tensors] = &f->tensors[f->n_tensors];
		f->n_tensors++;
	}
	json_t *meta = json_object_get(root, "__metadata__");
	if (meta && (rc = check_metadata(f, meta)))
		goto out;
	qsort(by_off, nt, sizeof(*by_off), cmp_by_offsets);
	rc = check_layout(f, by_off, nt, f->base ? f->size - f->data_off : UINT64_MAX);
	if (rc)
		goto out;
	qsort(f->tensors, nt, sizeof(*f->tensors), cmp_by_name);
out:
	arena_free(by_off);
	return rc;
}

static int st_new(const char *label, arena_st_file **out)
{
	*out = NULL;
	arena_st_file *f = arena_calloc(1, sizeof(*f));
	if (!f)
		return arena_errorf(ARENA_E_NOMEM, "%s: out of memory", label);
	f->path = arena_strdup(label);
	if (!f->path) {
		arena_free(f);
		return arena_errorf(ARENA_E_NOMEM, "%s: out of memory", label);
	}
	f->fd = -1;
	*out = f;
	return 0;
}

int arena_st_parse(const uint8_t *buf, uint64_t size, const char *label, arena_st_file **out)
{
	*out = NULL;
	arena_st_file *f;
	int rc = st_new(label, &f);
	if (rc)
		return rc;
	f->base = buf;
	f->size = size;
	f->fd = -1;
	rc = parse_header(f, buf);
	if (rc) {
		arena_st_close(f);
		return rc;
	}
	*out = f;
	return 0;
}

int arena_st_parse_header(const char *json, size_t len, const char *label, arena_st_file **out)
{
	*out = NULL;
	arena_st_file *f;
	int rc = st_new(label, &f);
	if (rc)
		return rc;
	uint8_t *buf = arena_malloc(8 + len);
	if (!buf) {
		arena_st_close(f);
		return arena_errorf(ARENA_E_NOMEM, "%s: out of memory for a header of %zu bytes", label, len);
	}
	for (int i = 0; i < 8; i++)
		buf[i] = (uint8_t)((uint64_t)len >> (8 * i));
	memcpy(buf + 8, json, len);
	f->size = 8 + (uint64_t)len; /* the header's bytes; the data's are added once they are known */
	rc = parse_header(f, buf); /* f->base NULL: no data to check the offsets against */
	arena_free(buf);
	if (rc) {
		arena_st_close(f);
		return rc;
	}
	for (size_t i = 0; i < f->n_tensors; i++)
		if (f->data_off + f->tensors[i].end > f->size)
			f->size = f->data_off + f->tensors[i].end;
	*out = f;
	return 0;
}

/* The file's first bytes as parse_header reads them, with pread: the
 * length, and the header when the length passes its checks (else only
 * the length: parse_header refuses it from those). A file that shrinks
 * meanwhile is INPUT_CHANGED, never a fault. *buf is the caller's. */
static int read_header(arena_st_file *f, uint8_t **buf)
{
	*buf = NULL;
	uint8_t len[8];
	const uint64_t have = f->size < 8 ? f->size : 8;
	int rc = arena_pread_full(f->fd, len, (size_t)have, 0, f->path);
	if (rc)
		return rc;
	const uint64_t n = f->size < 8 ? 0 : le64(len);
	const uint64_t want = n <= ARENA_ST_MAX_HEADER && n <= f->size - have ? have + n : have;
	*buf = arena_malloc(want ? (size_t)want : 1);
	if (!*buf)
		return arena_errorf(ARENA_E_NOMEM, "%s: out of memory for a header of %llu bytes", f->path,
				    (unsigned long long)n);
	memcpy(*buf, len, (size_t)have);
	return want > have ? arena_pread_full(f->fd, *buf + have, (size_t)(want - have), have, f->path) : 0;
}

int arena_st_open(const char *path, arena_st_file **out)
{
	*out = NULL;
	int fd;
	struct stat st;
	int rc = arena_open_input(path, 0, &fd, &st);
	if (rc)
		return rc;
	arena_st_file *f;
	rc = st_new(path, &f);
	if (rc) {
		close(fd);
		return rc;
	}
	f->size = (uint64_t)st.st_size;
	f->fd = fd;
	f->base = (const uint8_t *)"";
	/* The header is read, not mapped: only tensor data is read through the
	 * mapping (quantized on the way), each such read guarded
	 * (common/mapguard.h). */
	uint8_t *hdr;
	rc = read_header(f, &hdr);
	if (!rc)
		rc = parse_header(f, hdr);
	arena_free(hdr);
	if (!rc && f->size > 0) {
		void *m = mmap(NULL, (size_t)f->size, PROT_READ, MAP_PRIVATE, fd, 0);
		if (m == MAP_FAILED)
			rc = arena_syserrorf(ARENA_E_IO, errno, "%s: cannot map", path);
		else
			f->base = m, f->mapped = 1;
	}
	if (rc) {
		arena_st_close(f);
		return rc;
	}
	*out = f;
	return 0;
}

void arena_st_close(arena_st_file *f)
{
	if (!f)
		return;
	if (f->fd >= 0)
		close(f->fd);
	if (f->mapped)
		munmap((void *)(uintptr_t)f->base, (size_t)f->size);
	json_decref((json_t *)f->json);
	arena_free(f->tensors);
	arena_free(f->shape_pool);
	arena_free(f->name_pool);
	arena_free(f->meta_keys);
	arena_free(f->meta_vals);
	arena_free(f->path);
	arena_free(f);
}

int arena_st_prefix(arena_st_file *f, const char *prefix)
{
	size_t lp = strlen(prefix), total = 0;
	for (size_t i = 0; i < f->n_tensors; i++)
		total += lp + strlen(f->tensors[i].name) + 1;
	char *pool = arena_malloc(total ? total : 1);
	if (!pool)
		return arena_errorf(ARENA_E_NOMEM, "%s: out of memory", f->path);
	char *at = pool;
	for (size_t i = 0; i < f->n_tensors; i++) {
		size_t ln = strlen(f->tensors[i].name);
		memcpy(at, prefix, lp);
		memcpy(at + lp, f->tensors[i].name, ln + 1);
		f->tensors[i].name = at;
		at += lp + ln + 1;
	}
	arena_free(f->name_pool); /* (names prefixed before: the new ones hold them) */
	f->name_pool = pool;
	return 0;
}

static int cmp_key_name(const void *key, const void *t)
{
	return strcmp(key, ((const arena_st_tensor *)t)->name);
}

const arena_st_tensor *arena_st_find(const arena_st_file *f, const char *name)
{
	return f->n_tensors ? bsearch(name, f->tensors, f->n_tensors, sizeof(*f->tensors), cmp_key_name) : NULL;
}
