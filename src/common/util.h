/*
 * common/util.h — internal helpers shared by the modules: recording errors
 * (tio_fail), logging, growable arrays, atomic file writes, a line reader.
 * Not part of the public API.
 */
#ifndef TERAIO_UTIL_H
#define TERAIO_UTIL_H

#include <errno.h>
#include <stdio.h>
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

/* Atomic file write: open "<path>.tmp.<pid>" for writing; commit with
 * tio_atomic_commit (fflush, fsync, fclose, rename) or drop it with
 * tio_atomic_abort (close, unlink).  An existing file keeps its permissions;
 * a symbolic link is followed (the file it names is replaced, the link
 * stays).  A path that exists and is not a regular file or a directory
 * (/dev/null, a FIFO) is written in place: nothing replaces it.  A directory
 * is refused (-EISDIR).  Errors name the file. */
typedef struct {
    FILE *f;
    char *path;     /* as given, for messages */
    char *target;   /* the file the rename replaces; NULL when written in place */
    char *tmp_path; /* NULL when written in place */
} tio_atomic_file;
int tio_atomic_open(tio_atomic_file *af, const char *path);
int tio_atomic_commit(tio_atomic_file *af);
void tio_atomic_abort(tio_atomic_file *af);

/* Read a whole file into a NUL-terminated malloc'ed buffer.
 * Returns 0 or -errno (message names the file). */
int tio_read_file(const char *path, char **text, size_t *len);

/* Format a byte count for people: "812 B", "1.50 MiB" (powers of 1024, two
 * decimals).  `buf` holds at least 32 bytes; returns buf.  Used by the
 * library's messages and by the CLI, so both read the same. */
char *tio_format_bytes(uint64_t bytes, char *buf);

/* Monotonic clock in nanoseconds. */
uint64_t tio_now_ns(void);

#endif
