/* err.h - internal helpers to set the thread's last error message. */
#ifndef ARENA_COMMON_ERR_H
#define ARENA_COMMON_ERR_H

#include "arena.h"

#if defined(__GNUC__)
#define ARENA_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define ARENA_PRINTF(f, a)
#endif

/* Record a message for `code` on this thread and return `code`.
 * Messages follow the house style: lower case, no full stop, subject first,
 * things quoted: "model.safetensors: tensor 'x': data_offsets [10, 8) end before begin". */
int arena_errorf(int code, const char *fmt, ...) ARENA_PRINTF(2, 3);
/* Same, for a failed system call: appends ": <strerror(errnum)>" and maps
 * ENOENT to NOT_FOUND, ENOMEM to NOMEM, anything else to `code`. */
int arena_syserrorf(int code, int errnum, const char *fmt, ...) ARENA_PRINTF(3, 4);
/* Prefix the current message with "<prefix>: " (used to add context). */
void arena_error_prefix(const char *prefix);
/* Clear the last error. */
void arena_error_clear(void);

/* Escape `s` for a one-line message: control and non-ASCII-safe bytes become
 * \xNN, quotes and backslashes are escaped, over 200 bytes are cut with "...".
 * Returns one of 4 rotating thread-local buffers (valid for 3 more calls). */
const char *arena_q(const char *s);

/* Programmer error: print and abort. Never for bad input. */
#define ARENA_BUG(msg) arena__bug(__FILE__, __LINE__, (msg))
_Noreturn void arena__bug(const char *file, int line, const char *msg);

#endif
