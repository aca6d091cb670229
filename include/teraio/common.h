/*
 * teraio/common.h — errors, logging and version, shared by every module.
 *
 * Error convention (as in liburing): every public function that can fail
 * returns 0 (or a non-negative count) on success and a negative code on
 * failure.  Codes are either a negated errno value (-EINVAL, -EIO, -ENOSPC,
 * -ENOENT, -ENOMEM, ...) or one of the TIO_E* codes below, which lie outside
 * the errno range.  tio_strerror() names any code.
 *
 * Besides the code, a failing call records a one-line message in a
 * thread-local buffer, readable with tio_last_error(): it names the file,
 * line and field for parse errors, the file and offset for I/O errors, the
 * tensor id for runtime errors.  The library never prints and never exits;
 * diagnostics that are not errors go to the log callback (tio_set_log).
 */
#ifndef TERAIO_COMMON_H
#define TERAIO_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TIO_API __attribute__((visibility("default")))

/* teraio-specific error codes (negative, below -4095 so never an errno). */
enum {
    TIO_EPARSE = -5001,      /* malformed file or string: see tio_last_error() */
    TIO_EVERSION = -5002,    /* file format version this build cannot read */
    TIO_EINFEASIBLE = -5003, /* capacity below what a single kernel needs */
    TIO_EUNKNOWN = -5004,    /* reference to an unknown tensor or kernel */
    TIO_ECORRUPT = -5005,    /* stored data failed its integrity check */
    TIO_ESTATE = -5006,      /* call not allowed in the object's current state */
};

/* Name of an error code ("invalid argument", "malformed input", ...).
 * Never NULL; the string is static.  Thread-safe. */
TIO_API const char *tio_strerror(int err);

/* The message recorded by the most recent failing teraio call on this
 * thread, e.g. "trace.tio:12: field 'bytes': expected an unsigned integer".
 * Empty string if none.  The pointer is valid until the next teraio call on
 * this thread.  Thread-safe (per-thread buffer). */
TIO_API const char *tio_last_error(void);

/* Log levels passed to the log callback. */
enum { TIO_LOG_DEBUG = 0, TIO_LOG_INFO = 1, TIO_LOG_WARN = 2, TIO_LOG_ERROR = 3 };

/* Log callback: `msg` is one line without trailing newline, valid only during
 * the call.  May be called from any teraio thread; must be thread-safe. */
typedef void (*tio_log_fn)(void *ctx, int level, const char *msg);

/* Install the process-wide log callback (NULL: discard all messages, the
 * default).  Messages below `min_level` are not formatted.  Not thread-safe
 * with respect to concurrent logging: call it at start-up. */
TIO_API void tio_set_log(tio_log_fn fn, void *ctx, int min_level);

/* Free memory the library handed to the caller (the buffers of
 * tio_loader_state, tio_loader_state_read, ...: each function says when its
 * output is the caller's to free).  NULL is a no-op.  For programs that
 * cannot call the C library's free() of the same runtime (ctypes, other
 * languages).  Thread-safe. */
TIO_API void tio_free(void *p);

/* Library version, e.g. "0.1.0". */
TIO_API const char *tio_version(void);

/* Compiled-in features, space separated, e.g. "io_uring psync crc32c". */
TIO_API const char *tio_features(void);

#ifdef __cplusplus
}
#endif
#endif
