/*
 * tests/c/standin_cufile.c — a stand-in libcufile: the cuFile entry points
 * teraio looks up, doing POSIX I/O (pread/pwrite) on the registered file
 * descriptors, with "device memory" in host memory (the stand-in libcudart's).
 *
 * It reads every struct teraio passes by the byte offsets of cufile.h
 * (never through a C declaration shared with teraio), so a layout slip in
 * teraio's declarations shows up as wrong I/O.  It checks what cufile.h
 * asks of callers: the descriptor's fs_ops is NULL, the file is open with
 * O_DIRECT, a batch has at most the entries of its set-up (and at most
 * max_batch_io_size), a batch handle is reused only once all its entries
 * have been reported.  Batches run on a thread after a delay, reading the
 * caller's parameter array only then (as the real library may, and as
 * cuFile's stream API does with its size/offset pointers), so parameters
 * freed or reused early make the test fail.
 *
 * Built three ways (CMake): the full library; -DSTANDIN_NO_V2 without
 * cuFileDriverClose_v2 (only the plain cuFileDriverClose, as before cuFile
 * 1.x mapped it); -DSTANDIN_NO_BATCH without the batch API (cuFile < 1.7).
 * Controls (standin_cufile_*): compatibility mode, batch limit, a failure of
 * the Nth I/O with a given cuFile status, a failing driver open, counters.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))

typedef struct { int err; int cu_err; } cferr; /* CUfileError_t, by value */

static cferr ok(void) { return (cferr){0, 0}; }
static cferr fail(int e) { return (cferr){e, 0}; }

enum { INVALID_VALUE = 5022, DRIVER_NOT_INITIALIZED = 5001, HANDLE_NOT_REGISTERED = 5027,
       INVALID_FILE_OPEN_FLAG = 5019, BATCH_FULL = 5037, IO_ERROR = 5044 };
enum { ST_WAITING = 1, ST_PENDING = 2, ST_COMPLETE = 0x10, ST_FAILED = 0x40 };

#define MAX_ENTRIES 256

typedef struct {
    int fd;
} handle;

typedef struct {
    unsigned nr;                /* entries of the set-up */
    const unsigned char *params;/* the caller's array, read when the batch runs */
    unsigned n;                 /* entries of the batch in flight */
    unsigned reported;
    bool running, done[MAX_ENTRIES], given[MAX_ENTRIES];
    void *cookie[MAX_ENTRIES];
    int status[MAX_ENTRIES];
    long long ret[MAX_ENTRIES];
    pthread_t thread;
    bool thread_live;
} batch;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static __attribute__((unused)) pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static struct {
    int open_count, opens, closes_v2, closes_plain;
    int driver_open_error;
    unsigned nvfs_major, nvfs_minor, control_flags, max_batch;
    unsigned batch_delay_us;
    long fail_nth, io_count;
    int fail_status;
    long long fail_ret;
    unsigned max_nr_seen, batches, sync_ios, handles, bufs_registered;
    unsigned layout_errors, misuse;
    char last_misuse[160];
} g = {.nvfs_major = 2, .nvfs_minor = 17, .control_flags = 1, .max_batch = 128};

static __attribute__((unused)) void misuse(const char *what)
{
    g.misuse++;
    snprintf(g.last_misuse, sizeof g.last_misuse, "%s", what);
}

/* ---- driver ---------------------------------------------------------------- */

API cferr cuFileDriverOpen(void)
{
    pthread_mutex_lock(&g_mu);
    cferr r = g.driver_open_error ? fail(g.driver_open_error) : ok();
    if (!r.err) {
        g.open_count++;
        g.opens++;
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

static cferr close_common(int *counter)
{
    pthread_mutex_lock(&g_mu);
    cferr r = g.open_count > 0 ? ok() : fail(DRIVER_NOT_INITIALIZED);
    if (!r.err) {
        g.open_count--;
        (*counter)++;
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

#ifndef STANDIN_NO_V2
API cferr cuFileDriverClose_v2(void) { return close_common(&g.closes_v2); }
#endif
API cferr cuFileDriverClose(void) { return close_common(&g.closes_plain); }

/* CUfileDrvProps_t, written at cufile.h's offsets into 56 bytes. */
API cferr cuFileDriverGetProperties(void *props)
{
    unsigned char *p = props;
    memset(p, 0, 56);
    pthread_mutex_lock(&g_mu);
    unsigned v[] = {g.nvfs_major, g.nvfs_minor};
    memcpy(p + 0, &v[0], 4);
    memcpy(p + 4, &v[1], 4);
    size_t poll = 4096, maxdio = 16u << 20;
    memcpy(p + 8, &poll, 8);
    memcpy(p + 16, &maxdio, 8);
    memcpy(p + 28, &g.control_flags, 4);
    unsigned cache = 131072, per_buf = 1024, pinned = 33554432;
    memcpy(p + 36, &cache, 4);
    memcpy(p + 40, &per_buf, 4);
    memcpy(p + 44, &pinned, 4);
    memcpy(p + 48, &g.max_batch, 4);
    unsigned timeout_ms = 5;
    memcpy(p + 52, &timeout_ms, 4);
    pthread_mutex_unlock(&g_mu);
    return ok();
}

API cferr cuFileGetVersion(int *v)
{
    *v = 1150;
    return ok();
}

/* ---- handles and buffers --------------------------------------------------- */

/* CUfileDescr_t: type (0), fd (8), fs_ops (16). */
API cferr cuFileHandleRegister(void **out, const void *descr)
{
    const unsigned char *d = descr;
    int type, fd;
    void *fs_ops;
    memcpy(&type, d + 0, 4);
    memcpy(&fd, d + 8, 4);
    memcpy(&fs_ops, d + 16, 8);
    pthread_mutex_lock(&g_mu);
    cferr r = ok();
    if (type != 1 || fs_ops) {
        g.layout_errors++;
        r = fail(INVALID_VALUE);
    } else {
        int fl = fcntl(fd, F_GETFL);
        if (fl < 0)
            r = fail(INVALID_VALUE);
        else if (!(fl & O_DIRECT))
            r = fail(INVALID_FILE_OPEN_FLAG);
    }
    if (!r.err)
        g.handles++;
    pthread_mutex_unlock(&g_mu);
    if (r.err)
        return r;
    handle *h = malloc(sizeof *h);
    if (!h)
        return fail(IO_ERROR);
    h->fd = fd;
    *out = h;
    return ok();
}

API void cuFileHandleDeregister(void *h)
{
    pthread_mutex_lock(&g_mu);
    g.handles--;
    pthread_mutex_unlock(&g_mu);
    free(h);
}

API cferr cuFileBufRegister(const void *base, size_t len, int flags)
{
    if (!base || !len || flags)
        return fail(INVALID_VALUE);
    pthread_mutex_lock(&g_mu);
    g.bufs_registered++;
    pthread_mutex_unlock(&g_mu);
    return ok();
}

API cferr cuFileBufDeregister(const void *base)
{
    pthread_mutex_lock(&g_mu);
    cferr r = g.bufs_registered ? ok() : fail(5024);
    if (!r.err)
        g.bufs_registered--;
    pthread_mutex_unlock(&g_mu);
    return r;
}

/* pread/pwrite on an O_DIRECT file whatever the alignment, as cuFile does
 * for unaligned requests (its bounce buffers): an unaligned one goes
 * through an aligned copy, a write by read-modify-write. */
static ssize_t aligned_io(int fd, int write, char *p, size_t size, off_t off)
{
    if (((uintptr_t)p | (uintptr_t)off | size) % 4096 == 0)
        return write ? pwrite(fd, p, size, off) : pread(fd, p, size, off);
    off_t start = off & ~(off_t)4095;
    size_t span = ((size_t)(off - start) + size + 4095) & ~(size_t)4095;
    void *b;
    if (posix_memalign(&b, 4096, span) != 0) {
        errno = ENOMEM;
        return -1;
    }
    ssize_t got = pread(fd, b, span, start);
    if (got >= 0 && write) {
        memcpy((char *)b + (off - start), p, size);
        got = pwrite(fd, b, span, start);
    } else if (got >= 0) {
        memcpy(p, (char *)b + (off - start), size);
    }
    free(b);
    return got < 0 ? -1 : (ssize_t)size;
}

/* One I/O; a planted failure answers instead of the disk. */
static long long do_io(int fd, int write, char *p, size_t size, off_t off, int *status)
{
    pthread_mutex_lock(&g_mu);
    long n = ++g.io_count;
    bool planted = g.fail_nth && n == g.fail_nth;
    pthread_mutex_unlock(&g_mu);
    *status = ST_COMPLETE;
    if (planted && g.fail_status == ST_COMPLETE && g.fail_ret >= 0 && (size_t)g.fail_ret < size)
        size = (size_t)g.fail_ret; /* a short transfer: only that much moves */
    else if (planted) {
        *status = g.fail_status ? g.fail_status : ST_FAILED;
        return g.fail_ret;
    }
    ssize_t got = aligned_io(fd, write, p, size, off);
    if (got < 0) {
        *status = ST_FAILED;
        return -errno;
    }
    return got;
}

API long cuFileRead(void *h, void *base, size_t size, off_t foff, off_t boff)
{
    int st;
    pthread_mutex_lock(&g_mu);
    g.sync_ios++;
    pthread_mutex_unlock(&g_mu);
    long long r = do_io(((handle *)h)->fd, 0, (char *)base + boff, size, foff, &st);
    return st == ST_COMPLETE ? (long)r : r < 0 ? (long)r : -IO_ERROR;
}

API long cuFileWrite(void *h, const void *base, size_t size, off_t foff, off_t boff)
{
    int st;
    pthread_mutex_lock(&g_mu);
    g.sync_ios++;
    pthread_mutex_unlock(&g_mu);
    long long r = do_io(((handle *)h)->fd, 1, (char *)base + boff, size, foff, &st);
    return st == ST_COMPLETE ? (long)r : r < 0 ? (long)r : -IO_ERROR;
}

/* ---- batch API ------------------------------------------------------------- */

#ifndef STANDIN_NO_BATCH
/* CUfileIOParams_t, 64 bytes: mode (0), devPtr_base (8), file_offset (16),
 * devPtr_offset (24), size (32), fh (40), opcode (48), cookie (56). */
static void *batch_main(void *arg)
{
    batch *b = arg;
    pthread_mutex_lock(&g_mu);
    unsigned delay = g.batch_delay_us;
    pthread_mutex_unlock(&g_mu);
    if (delay) {
        struct timespec ts = {.tv_sec = delay / 1000000, .tv_nsec = (long)(delay % 1000000) * 1000};
        while (nanosleep(&ts, &ts) != 0)
            ;
    }
    for (unsigned i = 0; i < b->n; i++) {
        const unsigned char *e = b->params + 64 * (size_t)i; /* read now, not at submit */
        int mode, opcode;
        char *base;
        off_t foff, boff;
        size_t size;
        handle *h;
        void *cookie;
        memcpy(&mode, e + 0, 4);
        memcpy(&base, e + 8, 8);
        memcpy(&foff, e + 16, 8);
        memcpy(&boff, e + 24, 8);
        memcpy(&size, e + 32, 8);
        memcpy(&h, e + 40, 8);
        memcpy(&opcode, e + 48, 4);
        memcpy(&cookie, e + 56, 8);
        int st = ST_FAILED;
        long long ret = -EINVAL;
        if (mode != 1 || (opcode != 0 && opcode != 1) || !h) {
            pthread_mutex_lock(&g_mu);
            g.layout_errors++;
            pthread_mutex_unlock(&g_mu);
        } else {
            ret = do_io(h->fd, opcode == 1, base + boff, size, foff, &st);
        }
        pthread_mutex_lock(&g_mu);
        b->cookie[i] = cookie;
        b->status[i] = st;
        b->ret[i] = ret;
        b->done[i] = true;
        pthread_cond_broadcast(&g_cv);
        pthread_mutex_unlock(&g_mu);
    }
    return NULL;
}

API cferr cuFileBatchIOSetUp(void **out, unsigned nr)
{
    pthread_mutex_lock(&g_mu);
    bool bad = nr == 0 || nr > g.max_batch || nr > MAX_ENTRIES;
    pthread_mutex_unlock(&g_mu);
    if (bad)
        return fail(INVALID_VALUE);
    batch *b = calloc(1, sizeof *b);
    if (!b)
        return fail(IO_ERROR);
    b->nr = nr;
    *out = b;
    return ok();
}

API cferr cuFileBatchIOSubmit(void *bh, unsigned nr, void *params, unsigned flags)
{
    batch *b = bh;
    pthread_mutex_lock(&g_mu);
    if (b->running) {
        misuse("batch handle reused before all its entries were reported");
        pthread_mutex_unlock(&g_mu);
        return fail(BATCH_FULL);
    }
    if (nr == 0 || nr > b->nr || flags) {
        misuse("batch larger than its set-up");
        pthread_mutex_unlock(&g_mu);
        return fail(INVALID_VALUE);
    }
    if (nr > g.max_nr_seen)
        g.max_nr_seen = nr;
    g.batches++;
    pthread_mutex_unlock(&g_mu);
    if (b->thread_live)
        pthread_join(b->thread, NULL);
    b->params = params;
    b->n = nr;
    b->reported = 0;
    memset(b->done, 0, sizeof b->done);
    memset(b->given, 0, sizeof b->given);
    b->running = true;
    b->thread_live = pthread_create(&b->thread, NULL, batch_main, b) == 0;
    return b->thread_live ? ok() : fail(IO_ERROR);
}

/* CUfileIOEvents_t, 24 bytes: cookie (0), status (8), ret (16). */
API cferr cuFileBatchIOGetStatus(void *bh, unsigned min_nr, unsigned *nr, void *events,
                                 struct timespec *timeout)
{
    batch *b = bh;
    unsigned char *ev = events;
    unsigned max = *nr, got = 0;
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += timeout ? timeout->tv_sec : 0;
    deadline.tv_nsec += timeout ? timeout->tv_nsec : 0;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&g_mu);
    for (;;) {
        for (unsigned i = 0; i < b->n && got < max; i++) {
            if (!b->done[i] || b->given[i])
                continue;
            b->given[i] = true;
            long long ret = b->ret[i];
            memcpy(ev + 24 * (size_t)got + 0, &b->cookie[i], 8);
            memcpy(ev + 24 * (size_t)got + 8, &b->status[i], 4);
            memcpy(ev + 24 * (size_t)got + 16, &ret, 8);
            got++;
        }
        if (got >= min_nr || got == max)
            break;
        if (pthread_cond_timedwait(&g_cv, &g_mu, &deadline) != 0)
            break;
    }
    b->reported += got;
    if (b->reported == b->n)
        b->running = false;
    pthread_mutex_unlock(&g_mu);
    *nr = got;
    return ok();
}

API cferr cuFileBatchIOCancel(void *bh) { return ok(); }

API void cuFileBatchIODestroy(void *bh)
{
    batch *b = bh;
    if (b->thread_live)
        pthread_join(b->thread, NULL);
    pthread_mutex_lock(&g_mu);
    if (b->running)
        misuse("batch destroyed with entries in flight");
    pthread_mutex_unlock(&g_mu);
    free(b);
}
#endif

/* ---- controls for tests ------------------------------------------------------ */

API void standin_cufile_set(unsigned nvfs_major, unsigned nvfs_minor, unsigned control_flags,
                            unsigned max_batch, unsigned batch_delay_us)
{
    pthread_mutex_lock(&g_mu);
    g.nvfs_major = nvfs_major;
    g.nvfs_minor = nvfs_minor;
    g.control_flags = control_flags;
    g.max_batch = max_batch;
    g.batch_delay_us = batch_delay_us;
    pthread_mutex_unlock(&g_mu);
}

/* The nth I/O from now (1-based) answers status/ret instead of the disk;
 * status COMPLETE with a ret below the size moves only ret bytes (short). */
API void standin_cufile_fail_io(long nth, int status, long long ret)
{
    pthread_mutex_lock(&g_mu);
    g.fail_nth = nth ? g.io_count + nth : 0;
    g.fail_status = status;
    g.fail_ret = ret;
    pthread_mutex_unlock(&g_mu);
}

API void standin_cufile_fail_open(int cufile_err)
{
    pthread_mutex_lock(&g_mu);
    g.driver_open_error = cufile_err;
    pthread_mutex_unlock(&g_mu);
}

typedef struct {
    int open_count, opens, closes_v2, closes_plain;
    unsigned max_nr_seen, batches, sync_ios, handles, bufs_registered, layout_errors, misuse;
    char last_misuse[160];
} standin_cufile_stats;

API void standin_cufile_get_stats(standin_cufile_stats *out)
{
    pthread_mutex_lock(&g_mu);
    out->open_count = g.open_count;
    out->opens = g.opens;
    out->closes_v2 = g.closes_v2;
    out->closes_plain = g.closes_plain;
    out->max_nr_seen = g.max_nr_seen;
    out->batches = g.batches;
    out->sync_ios = g.sync_ios;
    out->handles = g.handles;
    out->bufs_registered = g.bufs_registered;
    out->layout_errors = g.layout_errors;
    out->misuse = g.misuse;
    memcpy(out->last_misuse, g.last_misuse, sizeof out->last_misuse);
    pthread_mutex_unlock(&g_mu);
}
