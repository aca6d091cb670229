/*
 * common/error.c — error codes, the per-thread last-error message, logging,
 * version and small helpers used everywhere.
 *
 * Errors are values: functions return a negative code and record a message
 * in a thread-local buffer; nothing here prints or exits.
 */
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/stat.h>

#include "common/util.h"
#include "teraio_config.h"

static _Thread_local char last_error[1024];
static tio_log_fn log_fn;
static void *log_ctx;
static int log_min_level = TIO_LOG_INFO;

const char *tio_strerror(int err)
{
    switch (err) {
    case 0: return "success";
    case TIO_EPARSE: return "malformed input";
    case TIO_EVERSION: return "unsupported format version";
    case TIO_EINFEASIBLE: return "capacity below a single kernel's need";
    case TIO_EUNKNOWN: return "unknown tensor or kernel";
    case TIO_ECORRUPT: return "data failed integrity check";
    case TIO_ESTATE: return "not allowed in the current state";
    default: break;
    }
    if (err < 0 && err > -4096)
        return strerror(-err); /* glibc: static strings for known codes */
    return "unknown error";
}

const char *tio_last_error(void) { return last_error; }

void tio_clear_error(void) { last_error[0] = '\0'; }

int tio_fail(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return code;
}

void tio_set_log(tio_log_fn fn, void *ctx, int min_level)
{
    log_fn = fn;
    log_ctx = ctx;
    log_min_level = min_level;
}

void tio_log(int level, const char *fmt, ...)
{
    if (!log_fn || level < log_min_level)
        return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    log_fn(log_ctx, level, msg);
}

const char *tio_version(void) { return TIO_VERSION_STRING; }

#if TIO_HAVE_PCRE2
#define TIO_FEATURE_PCRE2 " pcre2"
#else
#define TIO_FEATURE_PCRE2 ""
#endif
#if TIO_HAVE_ZSTD
#define TIO_FEATURE_ZSTD " zstd"
#else
#define TIO_FEATURE_ZSTD ""
#endif
#if TIO_HAVE_ZLIB
#define TIO_FEATURE_ZLIB " zlib"
#else
#define TIO_FEATURE_ZLIB ""
#endif
#define TIO_FEATURE_EXTRA TIO_FEATURE_PCRE2 TIO_FEATURE_ZSTD TIO_FEATURE_ZLIB

const char *tio_features(void)
{
#if TIO_HAVE_LIBURING
    return "io_uring psync o_direct striping" TIO_FEATURE_EXTRA;
#else
    return "psync o_direct striping" TIO_FEATURE_EXTRA;
#endif
}

int tio_grow(void **array, uint32_t *cap, uint32_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    uint64_t n = *cap ? *cap : 16;
    while (n < need)
        n *= 2;
    if (n > UINT32_MAX)
        n = UINT32_MAX;
    void *p = realloc(*array, n * elem);
    if (!p)
        return tio_fail(-ENOMEM, "out of memory growing an array to %llu elements",
                        (unsigned long long)n);
    *array = p;
    *cap = (uint32_t)n;
    return 0;
}

int tio_atomic_open(tio_atomic_file *af, const char *path)
{
    memset(af, 0, sizeof *af);
    size_t n = strlen(path) + 32;
    af->path = strdup(path);
    af->tmp_path = malloc(n);
    if (!af->path || !af->tmp_path) {
        tio_atomic_abort(af);
        return tio_fail(-ENOMEM, "%s: out of memory", path);
    }
    snprintf(af->tmp_path, n, "%s.tmp.%ld", path, (long)getpid());
    af->f = fopen(af->tmp_path, "w");
    if (!af->f) {
        int e = errno;
        free(af->path);
        free(af->tmp_path);
        memset(af, 0, sizeof *af);
        return tio_fail(-e, "%s: cannot create: %s", path, strerror(e));
    }
    return 0;
}

int tio_atomic_commit(tio_atomic_file *af)
{
    int e = 0;
    if (fflush(af->f) != 0 || ferror(af->f))
        e = errno ? errno : EIO;
    else if (fsync(fileno(af->f)) != 0)
        e = errno;
    if (fclose(af->f) != 0 && !e)
        e = errno;
    af->f = NULL;
    if (!e && rename(af->tmp_path, af->path) != 0)
        e = errno;
    if (e) {
        unlink(af->tmp_path);
        int rc = tio_fail(-e, "%s: write failed: %s", af->path, strerror(e));
        tio_atomic_abort(af);
        return rc;
    }
    free(af->path);
    free(af->tmp_path);
    memset(af, 0, sizeof *af);
    return 0;
}

void tio_atomic_abort(tio_atomic_file *af)
{
    if (af->f) {
        fclose(af->f);
        unlink(af->tmp_path);
    }
    free(af->path);
    free(af->tmp_path);
    memset(af, 0, sizeof *af);
}

int tio_read_file(const char *path, char **text, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return tio_fail(-e, "%s: cannot open: %s", path, strerror(e));
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return tio_fail(-e, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return tio_fail(S_ISDIR(st.st_mode) ? -EISDIR : -EINVAL, "%s: not a regular file", path);
    }
    size_t n = (size_t)st.st_size;
    char *buf = malloc(n + 1);
    if (!buf) {
        close(fd);
        return tio_fail(-ENOMEM, "%s: out of memory reading %zu bytes", path, n);
    }
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            int e = r < 0 ? errno : EIO;
            free(buf);
            close(fd);
            return tio_fail(-e, "%s: read failed at offset %zu: %s", path, got,
                            r < 0 ? strerror(e) : "file shrank while reading");
        }
        got += (size_t)r;
    }
    close(fd);
    buf[n] = '\0';
    *text = buf;
    *len = n;
    return 0;
}

uint64_t tio_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
