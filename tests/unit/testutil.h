/* testutil.h - helpers the unit tests share: where the fixtures are, and a
 * temporary folder per test. Each failure is a Criterion assertion. */
#ifndef ARENA_TESTUTIL_H
#define ARENA_TESTUTIL_H

#include <stddef.h>

/* The path of a fixture: $ARENA_FIXTURES_DIR/name, or fixtures/name relative
 * to the folder the tests run in (the project root). The result is in one of
 * 8 rotating buffers: valid until 8 more calls, not for use across threads. */
const char *fixture_path(const char *name);

/* Marks the calling test slow (seconds on a two-core machine: a sweep over
 * every byte, every allocation or every input): where $ARENA_TEST_QUICK is set
 * to anything but "" or "0" (make check) it is skipped, saying so; make test
 * runs it. Call it first in the test. */
void slow_test(void);

/* The folder temporary files go under: $TMPDIR, or /tmp. */
const char *tmp_base(void);

/* Make a fresh folder tmp_base()/arena-TAG-XXXXXX; its path goes into dir
 * (size bytes). */
void tmpdir_make(char *dir, size_t size, const char *tag);

/* dir/name, in one of 8 rotating buffers (as fixture_path). */
const char *tmpdir_file(const char *dir, const char *name);
/* A copy of src at dst (tests' own small files); a failure fails the test. */
void copy_file(const char *src, const char *dst);

/* Entries in a folder, "." and ".." aside (an assertion fails when it cannot
 * be opened). */
int dir_entries(const char *dir);

/* Remove dir and everything under it (symbolic links are removed, not
 * followed); nothing when dir is NULL or empty. */
void tmpdir_remove(const char *dir);

struct arena;
/* Every tensor of block i of arena a, acquired at d (sim: host memory),
 * holds what the same tensor holds in ref (an arena of the same image with
 * every block resident), within the block; `step` names the step in the
 * message. */
void expect_block_tensors(struct arena *a, struct arena *ref, size_t i, const void *d, int step);

/* `steps` steps of a over every block in order (train: then back in
 * reverse), each acquired block checked against ref (expect_block_tensors);
 * the steps' records summed into *sum: streamed_bytes, moved_bytes,
 * disk_bytes (may be NULL). */
struct arena_step_info;
void steps_over_blocks(struct arena *a, struct arena *ref, int steps, int train, struct arena_step_info *sum);

/* One step over every block (each checked against ref unless it is NULL)
 * that stops at the first error and returns it (0: the step ended): for
 * injected faults and changed files. */
int try_step_over_blocks(struct arena *a, struct arena *ref);

/* Flip a byte (xor 0x5a) every 4 KiB of the file at path: at first, first +
 * 4096, ... while the byte is more than keep_tail bytes before its end. */
void flip_a_byte_a_page(const char *path, long long first, long long keep_tail);

#endif
