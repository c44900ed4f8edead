/* err.c - the error table's names and descriptions, and per-thread messages. */
#include "err.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
	const char *name;
	int cls;
	const char *desc;
} err_table[] = {
#define ARENA__ERR_ROW(name, cls, desc) {#name, ARENA_CLASS_##cls, desc},
	ARENA_ERRORS(ARENA__ERR_ROW)
#undef ARENA__ERR_ROW
};

static _Thread_local char last_msg[1024];

static int err_index(int code)
{
	int i = -code;
	return (i >= 0 && i < (int)ARENA__ERR_COUNT) ? i : -1;
}

const char *arena_err_name(int code)
{
	int i = err_index(code);
	return i < 0 ? "UNKNOWN" : err_table[i].name;
}

const char *arena_strerror(int code)
{
	int i = err_index(code);
	return i < 0 ? "unknown error" : err_table[i].desc;
}

int arena_err_class(int code)
{
	int i = err_index(code);
	return i < 0 ? ARENA_CLASS_SYSTEM : err_table[i].cls;
}

const char *arena_last_error(void)
{
	return last_msg;
}

void arena_error_clear(void)
{
	last_msg[0] = '\0';
}

int arena_errorf(int code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(last_msg, sizeof(last_msg), fmt, ap);
	va_end(ap);
	return code;
}

int arena_syserrorf(int code, int errnum, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(last_msg, sizeof(last_msg), fmt, ap);
	va_end(ap);
	if (n >= 0 && (size_t)n < sizeof(last_msg))
		snprintf(last_msg + n, sizeof(last_msg) - (size_t)n, ": %s", strerror(errnum));
	if (errnum == ENOENT || errnum == ENOTDIR)
		return ARENA_E_NOT_FOUND;
	if (errnum == ENOMEM)
		return ARENA_E_NOMEM;
	return code;
}

void arena_error_prefix(const char *prefix)
{
	char tmp[sizeof(last_msg)];
	memcpy(tmp, last_msg, sizeof(tmp));
	int n = snprintf(last_msg, sizeof(last_msg), "%s: ", prefix);
	if (n >= 0 && (size_t)n < sizeof(last_msg))
		snprintf(last_msg + n, sizeof(last_msg) - (size_t)n, "%.*s", (int)(sizeof(last_msg) - (size_t)n - 1), tmp);
}

_Noreturn void arena__bug(const char *file, int line, const char *msg)
{
	fprintf(stderr, "BUG: %s:%d: %s\n", file, line, msg);
	abort();
}

const char *arena_version(void)
{
	return ARENA_VERSION_STRING;
}

const char *arena_q(const char *s)
{
	static _Thread_local char bufs[4][256 * 4 + 8];
	static _Thread_local unsigned next;
	char *out = bufs[next++ % 4];
	size_t o = 0, i = 0;
	if (!s)
		s = "(null)";
	for (; s[i] && o < 200; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c < 0x20 || c == 0x7f)
			o += (size_t)sprintf(out + o, "\\x%02x", c);
		else if (c == '\'' || c == '\\')
			out[o++] = '\\', out[o++] = (char)c;
		else
			out[o++] = (char)c;
	}
	if (s[i])
		memcpy(out + o, "...", 3), o += 3;
	out[o] = '\0';
	return out;
}
