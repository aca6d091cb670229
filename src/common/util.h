/*
 * common/util.h — internal helpers shared by the modules: recording errors
 * (tio_fail), logging, growable arrays, atomic file writes, a line reader,
 * the environment (tio_env).  Not part of the public API.
 */
#ifndef TERAIO_UTIL_H
#define TERAIO_UTIL_H

#include <errno.h>
#include <stdio.h>
#include <sys/types.h>
#include "teraio/common.h"

/* Record a printf-style message for tio_last_error() and return `code`,
 * so that a failure reads:  return tio_fail(-EINVAL, "capacity must be > 0"); */
int tio_fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Clear the thread's last error message. */
void tio_clear_error(void);

/* Log through the application's callback (no-op when none is set). */
void tio_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Grow *array (of *cap elements of `elem` bytes) to hold at least `need`.
 * Returns 0 or -ENOMEM (the old array is kept). */
int tio_grow(void **array, uint32_t *cap, uint32_t need, size_t elem);

/* Atomic file write (atomic_file.c): open a temporary file
 * "<name>.tmp.<pid>.<random>" in the target's directory (openat on the
 * directory, O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600, flock'ed while it lives);
 * commit with tio_atomic_commit (fflush, fsync, renameat over the target,
 * fsync of the directory) or drop it with tio_atomic_abort (unlink, close).
 * Temporary files of the same target left by dead writers (unlocked, ours)
 * are removed first.  An existing regular file of ours keeps its mode;
 * anything else new is 0600.  A target that is a symbolic link is refused
 * (-ELOOP), except our own or root's link to a FIFO, socket or character
 * device (/dev/stdout); a link owned by another user is never followed.
 * A FIFO, socket or character device of ours or root's (/dev/null) is
 * written in place; one owned by another user is refused (-EACCES), a block
 * device (-EINVAL) and a directory (-EISDIR) too.  Errors name the file. */
typedef struct {
    FILE *f;
    char *path;     /* as given, for messages */
    int dirfd;      /* the target's directory; -1 when written in place */
    char *name;     /* the target's name in dirfd */
    char *tmp_name; /* the temporary file's name in dirfd; NULL in place */
} tio_atomic_file;
int tio_atomic_open(tio_atomic_file *af, const char *path);
int tio_atomic_commit(tio_atomic_file *af);
void tio_atomic_abort(tio_atomic_file *af);

/* 64 unpredictable bits (getrandom), for file names others must not guess. */
uint64_t tio_random_u64(void);

/* Create `name` in directory `dirfd` (openat with `flags` | O_CREAT |
 * O_EXCL | O_NOFOLLOW | O_CLOEXEC, `mode`) and hold an exclusive flock on it
 * until the descriptor is closed, which marks it as in use for
 * tio_remove_unlocked.  Returns the descriptor, -EEXIST (the name is
 * taken), -EAGAIN (a clean-up removed it before it was locked: try another
 * name) or another -errno. */
int tio_create_locked(int dirfd, const char *name, int flags, mode_t mode);

/* Remove the regular files of directory `dirfd` that `match` accepts, that
 * this user owns and whose flock nobody holds (files tio_create_locked made
 * for a process that is gone), calling `removed` (may be NULL) with each
 * name.  Returns how many were removed, or -errno when the directory cannot
 * be read. */
int tio_remove_unlocked(int dirfd, bool (*match)(const char *name, void *ctx), void *ctx,
                        void (*removed)(const char *name, void *ctx));

/* Read a whole file into a NUL-terminated malloc'ed buffer.
 * Returns 0 or -errno (message names the file). */
int tio_read_file(const char *path, char **text, size_t *len);

/* Format a byte count for people: "812 B", "1.50 MiB" (powers of 1024, two
 * decimals).  `buf` holds at least 32 bytes; returns buf.  Used by the
 * library's messages and by the CLI, so both read the same. */
char *tio_format_bytes(uint64_t bytes, char *buf);

/* Monotonic clock in nanoseconds. */
uint64_t tio_now_ns(void);

/* The process's resident set in bytes as the OS counts it (rss.c; Linux's
 * /proc/self/statm), 0 where it cannot be read.  Thread-safe; one system
 * call. */
uint64_t tio_process_rss_bytes(void);

/* The environment variable TERAIO_<suffix> (env.c), or, when that is unset,
 * the older TIO_<suffix>: tio_env("ENGINE_BACKEND") reads
 * $TERAIO_ENGINE_BACKEND, then $TIO_ENGINE_BACKEND.  A TERAIO_ variable that
 * is set wins even when empty.  Returns getenv's string (not to be freed;
 * valid until the environment changes), or NULL when neither is set or the
 * name would exceed 127 bytes.  As thread-safe as getenv. */
const char *tio_env(const char *suffix);

#endif
