/* outfile.h - output files that appear whole or not at all.
 *
 * Data goes to a file without a name (O_TMPFILE) in the target's folder;
 * commit fsyncs it, links it in under the target name (straight there when
 * the target does not exist, else under a temporary name renamed over it)
 * and fsyncs the folder. abort (or a failed commit) closes it, and the
 * system frees its blocks. Nothing is ever named until it is whole, so a
 * writer that is killed (SIGKILL, power loss) leaves nothing behind.
 *
 * Where the filesystem has no O_TMPFILE (NFS, some FUSE filesystems), data
 * goes to a named temporary ".NAME.tmp-XXXXXX" beside the target, renamed
 * over it by commit and unlinked by abort. Its writer holds an exclusive
 * flock on it until then; each open of a target first removes the
 * temporaries of that target whose lock can be taken, which only a dead
 * writer's can. So a killed writer's temporary lasts until the next writer
 * of the same target, never longer.
 *
 * An output opened with ARENA_OUTFILE_NEW never replaces a file: a target
 * that exists is OUTPUT_EXISTS at the open, and one that appears while the
 * output is written is OUTPUT_EXISTS at commit, left as it is (the output
 * is linked in only where no name is, in one step).
 *
 * Writes can be made to fail by injection (tests): arena_fault_write(n) makes
 * the nth write call from now fail with ENOSPC. */
#ifndef ARENA_COMMON_OUTFILE_H
#define ARENA_COMMON_OUTFILE_H

#include <stddef.h>
#include <stdint.h>

typedef struct arena_outfile {
	char *path;     /* target */
	char *dir;      /* the target's folder */
	char *tmp_path; /* the temporary's name (room for it, while named is 0) */
	int named;      /* tmp_path exists and is this file */
	int fd;
	int dfd;        /* the temporary opened with O_DIRECT, or -1 */
	int rfd;        /* the temporary opened to read back, without read-ahead, or -1 */
	int keep;       /* ARENA_OUTFILE_NEW: an existing target is never replaced */
	uint64_t size;  /* bytes appended with arena_outfile_write */
} arena_outfile;

/* Create the temporary for `path`; at commit it replaces a file there.
 * Errors: USAGE (path names a folder or something that is not a regular
 * file: it would not be replaced), NOT_FOUND (no such folder), IO. */
int arena_outfile_open(const char *path, arena_outfile **out);
/* Flags of arena_outfile_create. */
enum { ARENA_OUTFILE_NEW = 1 /* refuse a target that exists: OUTPUT_EXISTS */ };
/* arena_outfile_open with flags (0: the same). */
int arena_outfile_create(const char *path, unsigned flags, arena_outfile **out);
/* OUTPUT_EXISTS, with a message that says how to replace it, when `path`
 * names anything (a file, a folder, a symlink, dangling or not); else 0.
 * For a writer that would do much work before it opens its output. */
int arena_outfile_check_new(const char *path);
/* Append n bytes (the whole of them, retrying short writes). */
int arena_outfile_write(arena_outfile *f, const void *buf, size_t n);
/* Write n bytes at offset (does not move the append position). */
int arena_outfile_pwrite(arena_outfile *f, const void *buf, size_t n, uint64_t off);
/* Reserve `size` bytes on disk for the file (fallocate): a full disk is
 * reported now (IO, "No space left on device") rather than halfway through.
 * Filesystems without fallocate are left alone. */
int arena_outfile_reserve(arena_outfile *f, uint64_t size);
/* Like arena_outfile_pwrite, but with O_DIRECT when buf, n and off are all
 * 4096-aligned and the filesystem supports it: large writes from several
 * threads then neither copy through the page cache nor queue on the file's
 * lock. Falls back to arena_outfile_pwrite otherwise. */
int arena_outfile_pwrite_direct(arena_outfile *f, const void *buf, size_t n, uint64_t off);
/* Read the n bytes at `off` back into `scratch` and compare them with `want`,
 * the bytes written there: IO naming the first byte that differs, or a read's
 * IO error. Bytes written with O_DIRECT come back from the disk, through the
 * page cache (without read-ahead), which then holds them for the reads that
 * follow. */
int arena_outfile_check(arena_outfile *f, void *scratch, const void *want, size_t n, uint64_t off);

/* Set the file's length (after a reserve larger than what was written). */
int arena_outfile_truncate(arena_outfile *f, uint64_t size);
/* fsync, put in place under the target name, fsync the folder; frees f in
 * every case. An error leaves the target as it was. */
int arena_outfile_commit(arena_outfile *f);
/* Drop the temporary and free f. Accepts NULL. */
void arena_outfile_abort(arena_outfile *f);

/* An output must not be one of the inputs: OUTPUT_IS_INPUT (class USAGE),
 * with a message naming both, when `path` is (through symlinks or hard
 * links) the file that `input_fd` has open; `input` names it. 0 otherwise,
 * also when path does not exist. Call before anything is written. */
int arena_outfile_check_input(const char *path, int input_fd, const char *input);
/* The same for an input known by its st_dev and st_ino. */
int arena_outfile_check_input_id(const char *path, uint64_t dev, uint64_t ino, const char *input);

/* Fault injection (tests only): the nth write from now fails with ENOSPC;
 * 0 disarms. */
void arena_fault_write(long n);
/* Fault injection (tests only): the nth arena_outfile_check from now reads
 * back one byte other than was written (a disk that did not keep it); 0
 * disarms. */
void arena_fault_stored(long n);
/* Tests only: 1 makes every output use a named temporary, as where the
 * filesystem has no O_TMPFILE; 0 goes back. */
void arena__outfile_force_named(int on);

#endif
