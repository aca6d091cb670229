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

void tio_free(void *p) { free(p); }

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

int tio_read_file(const char *path, char **text, size_t *len)
{
    /* O_NONBLOCK so that opening a FIFO without a writer does not wait
     * forever: it is refused below, like every file that is not regular. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
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
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    /* The size is only a first guess: files under /proc report 0 bytes,
     * under /sys 4096, and a file may change while it is read.  Read to the
     * end of file. */
    size_t cap = (size_t)st.st_size + 1, got = 0;
    if (cap < 4096)
        cap = 4096;
    char *buf = malloc(cap);
    for (;;) {
        if (buf && got + 1 == cap) {
            char *bigger = cap <= SIZE_MAX / 2 ? realloc(buf, cap * 2) : NULL;
            if (!bigger) {
                free(buf);
                buf = NULL;
            } else {
                buf = bigger;
                cap *= 2;
            }
        }
        if (!buf) {
            close(fd);
            return tio_fail(-ENOMEM, "%s: out of memory reading %zu bytes", path, got + 1);
        }
        ssize_t r = read(fd, buf + got, cap - 1 - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            int e = errno;
            free(buf);
            close(fd);
            return tio_fail(-e, "%s: read failed at offset %zu: %s", path, got, strerror(e));
        }
        if (r == 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    buf[got] = '\0';
    *text = buf;
    *len = got;
    return 0;
}

char *tio_format_bytes(uint64_t bytes, char *buf)
{
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, 32, "%llu B", (unsigned long long)bytes);
    else
        snprintf(buf, 32, "%.2f %s", v, units[u]);
    return buf;
}

uint64_t tio_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
