/*
 * engine/backend_uring.c — the preferred backend: one io_uring and one
 * completion thread per SSD directory.
 *
 * The submission side of a ring (get_sqe, prep, submit) is only touched with
 * the directory's mutex held, by whichever thread has chunks to start: the
 * caller's thread when it queues a request, the completion thread when a
 * slot frees up.  The completion side (wait/peek/advance) belongs to the
 * completion thread alone; liburing allows one submitter and one reaper to
 * work on a ring at the same time.  At most queue_depth chunks are in a ring;
 * the rest wait in the directory's pending queue, urgent class first, so an
 * urgent request overtakes everything not yet handed to the kernel.
 *
 * Registration: each ring gets its directory's backing file as fixed file 0
 * and a sparse buffer table whose first slots are the directory's bounce
 * buffers and whose other TIO_ENGINE_MAX_REGISTERED slots take the caller's
 * regions (tio_engine_register_buffer).  A chunk whose I/O memory lies in a
 * registered slot goes out as READ_FIXED / WRITE_FIXED, so the kernel need
 * not look up and pin its pages on every request.  Registration is all or
 * nothing across the rings: if any ring refuses, none uses fixed buffers
 * (the reason names RLIMIT_MEMLOCK when that was the cause).
 *
 * Every CQE is checked by tio_chunk_account: a short transfer or
 * -EINTR/-EAGAIN puts the chunk back at the front of the queue for the rest,
 * anything else fails the request.  Injected errors (test hooks) are
 * submitted as a NOP whose result is then replaced, so they travel the same
 * path as a real failure without touching the disk; an injected delay is a
 * TIMEOUT op carrying the chunk, which goes back to the queue when it fires.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/uio.h>

#include "engine/engine_internal.h"
#include "teraio_config.h"

#if TIO_HAVE_LIBURING
#include <liburing.h>

#define CQE_BATCH 64u

struct tio_uring {
    struct io_uring ring;
    pthread_t thread;
    bool files_registered;
    bool bufs_registered;
    struct __kernel_timespec delay; /* for injected delays */
};

/* Submit everything prepared; dir->mu held.  Transient refusals are retried
 * at once; SQEs that could not be submitted stay in the ring and go with the
 * next submit. */
static void submit_ring(tio_dir *d)
{
    for (int tries = 0;; tries++) {
        int rc = io_uring_submit(&d->uring->ring);
        if (rc >= 0)
            return;
        if ((rc == -EINTR || rc == -EAGAIN || rc == -EBUSY) && tries < 100)
            continue;
        tio_log(TIO_LOG_ERROR, "engine: io_uring_submit for '%s': %s", d->file,
                tio_strerror(rc));
        return;
    }
}

/* The registered-buffer slot holding the chunk's I/O memory, or
 * TIO_NO_SLOT; dir->mu held (the region table is stable under it). */
static uint32_t buffer_slot(const tio_engine *e, const tio_chunk *c)
{
    if (!e->fixed_bufs)
        return TIO_NO_SLOT;
    if (c->bounce)
        return c->bounce_slot;
    const char *p = c->io_ptr;
    for (uint32_t i = 0; i < e->n_regions; i++) {
        const tio_region *r = &e->regions[i];
        if (p < r->addr || p + c->io_len > r->addr + r->bytes)
            continue;
        uint64_t first = (uint64_t)(p - r->addr) / TIO_REG_SLOT_BYTES;
        uint64_t last = (uint64_t)(p - r->addr + c->io_len - 1) / TIO_REG_SLOT_BYTES;
        return first == last ? r->slot + (uint32_t)first : TIO_NO_SLOT;
    }
    return TIO_NO_SLOT;
}

static void prep_io(tio_dir *d, struct io_uring_sqe *sqe, tio_chunk *c)
{
    tio_engine *e = d->engine;
    int fd = e->fixed_files ? 0 : d->fd;
    char *p = c->io_ptr + c->done;
    unsigned len = c->io_len - c->done;
    uint64_t off = c->file_off + c->done;
    uint32_t slot = buffer_slot(e, c);
    if (slot != TIO_NO_SLOT && c->op == TIO_OP_WRITE)
        io_uring_prep_write_fixed(sqe, fd, p, len, off, (int)slot);
    else if (slot != TIO_NO_SLOT)
        io_uring_prep_read_fixed(sqe, fd, p, len, off, (int)slot);
    else if (c->op == TIO_OP_WRITE)
        io_uring_prep_write(sqe, fd, p, len, off);
    else
        io_uring_prep_read(sqe, fd, p, len, off);
    if (e->fixed_files)
        sqe->flags |= IOSQE_FIXED_FILE;
}

/* Move pending chunks into the ring up to queue_depth; dir->mu held. */
static void feed(tio_dir *d)
{
    tio_engine *e = d->engine;
    struct io_uring *ring = &d->uring->ring;
    bool queued = false;
    while (d->inflight < e->opt.queue_depth) {
        tio_chunk *c = tio_dir_pop(d);
        if (!c)
            break;
        if (c->fault != TIO_FAULT_DELAY && tio_chunk_prepare(e, c) != 0) {
            tio_dir_push_front(d, c); /* no bounce buffer free: wait for one */
            break;
        }
        struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
        if (!sqe) {
            tio_dir_push_front(d, c);
            break;
        }
        if (c->fault == TIO_FAULT_EIO || c->fault == TIO_FAULT_ENOSPC)
            io_uring_prep_nop(sqe);
        else if (c->fault == TIO_FAULT_DELAY)
            io_uring_prep_timeout(sqe, &d->uring->delay, 0, 0);
        else
            prep_io(d, sqe, c);
        io_uring_sqe_set_data(sqe, c);
        d->inflight++;
        queued = true;
    }
    if (queued)
        submit_ring(d);
}

static void *completion_main(void *arg)
{
    tio_dir *d = arg;
    tio_engine *e = d->engine;
    struct io_uring *ring = &d->uring->ring;
    struct io_uring_cqe *cqes[CQE_BATCH];
    tio_chunk *retry[CQE_BATCH], *fin[CQE_BATCH];
    int fin_err[CQE_BATCH];
    bool stop = false;
    while (!stop) {
        struct io_uring_cqe *first;
        int rc = io_uring_wait_cqe(ring, &first);
        if (rc < 0) {
            if (rc != -EINTR && rc != -EAGAIN)
                tio_log(TIO_LOG_ERROR, "engine: io_uring_wait_cqe for '%s': %s", d->file,
                        tio_strerror(rc));
            continue;
        }
        unsigned n = io_uring_peek_batch_cqe(ring, cqes, CQE_BATCH);
        uint32_t n_retry = 0, n_fin = 0;
        /* The chunks were prepared under d->mu by the submitting thread;
         * taking it here also makes that ordering visible to TSan, which
         * cannot see the kernel's SQE-to-CQE hand-off. */
        pthread_mutex_lock(&d->mu);
        for (unsigned i = 0; i < n; i++) {
            tio_chunk *c = io_uring_cqe_get_data(cqes[i]);
            if (!c) {
                stop = true;
                continue;
            }
            d->inflight--;
            int err = 0;
            switch (tio_chunk_account(c, cqes[i]->res, &err)) {
            case TIO_CHUNK_RETRY:
                retry[n_retry++] = c;
                break;
            case TIO_CHUNK_DONE:
                fin_err[n_fin] = 0;
                fin[n_fin++] = c;
                break;
            default:
                fin_err[n_fin] = err;
                fin[n_fin++] = c;
                break;
            }
        }
        io_uring_cq_advance(ring, n);
        for (uint32_t i = n_retry; i-- > 0;)
            tio_dir_push_front(d, retry[i]);
        feed(d);
        pthread_mutex_unlock(&d->mu);
        for (uint32_t i = 0; i < n_fin; i++)
            tio_chunk_finish(e, fin[i], fin_err[i]);
    }
    return NULL;
}

/* A real 4 KiB write and read through the ring at offset 0 of the backing
 * file.  Returns 0 or -errno, with `why` naming the step. */
static int probe_ring(tio_dir *d, struct io_uring *ring, char *why, size_t why_len)
{
    void *buf;
    if (posix_memalign(&buf, TIO_EXTENT_ALIGN, 2 * TIO_EXTENT_ALIGN) != 0) {
        snprintf(why, why_len, "out of memory");
        return -ENOMEM;
    }
    unsigned char *w = buf, *r = w + TIO_EXTENT_ALIGN;
    for (uint32_t i = 0; i < TIO_EXTENT_ALIGN; i++)
        w[i] = (unsigned char)(i * 13u + 5u);
    memset(r, 0, TIO_EXTENT_ALIGN);
    int rc = 0;
    for (int step = 0; step < 2 && !rc; step++) {
        struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
        if (step == 0)
            io_uring_prep_write(sqe, d->fd, w, TIO_EXTENT_ALIGN, 0);
        else
            io_uring_prep_read(sqe, d->fd, r, TIO_EXTENT_ALIGN, 0);
        rc = io_uring_submit(ring);
        struct io_uring_cqe *cqe;
        if (rc >= 0)
            rc = io_uring_wait_cqe(ring, &cqe);
        if (rc >= 0) {
            rc = cqe->res == (int)TIO_EXTENT_ALIGN ? 0 : cqe->res < 0 ? cqe->res : -EIO;
            io_uring_cqe_seen(ring, cqe);
        }
        if (rc)
            snprintf(why, why_len, "io_uring probe %s of 4096 bytes in '%s': %s",
                     step == 0 ? "write" : "read", d->path, tio_strerror(rc));
    }
    if (!rc && memcmp(w, r, TIO_EXTENT_ALIGN) != 0) {
        snprintf(why, why_len, "io_uring probe in '%s' read back different bytes", d->path);
        rc = -EIO;
    }
    free(buf);
    return rc;
}

static void close_rings(tio_engine *e, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        io_uring_queue_exit(&e->dirs[i].uring->ring);
        free(e->dirs[i].uring);
        e->dirs[i].uring = NULL;
    }
}

/* Fixed file 0 of every ring is its backing file; on refusal none is. */
static void register_files(tio_engine *e)
{
    int rc = 0;
    uint32_t i = 0;
    for (; i < e->n_dirs && !rc; i++) {
        tio_dir *d = &e->dirs[i];
        rc = io_uring_register_files(&d->uring->ring, &d->fd, 1);
        d->uring->files_registered = rc == 0;
    }
    e->fixed_files = rc == 0;
    if (!rc)
        return;
    for (uint32_t j = 0; j < e->n_dirs; j++)
        if (e->dirs[j].uring->files_registered) {
            io_uring_unregister_files(&e->dirs[j].uring->ring);
            e->dirs[j].uring->files_registered = false;
        }
    char text[200];
    snprintf(text, sizeof text, "fixed files off: io_uring_register_files: %s", tio_strerror(rc));
    tio_engine_append_reason(e, text);
    tio_log(TIO_LOG_WARN, "engine: %s", text);
}

/* One ring's buffer table: sparse, the bounce slab in the first slots. */
static int register_ring_buffers(tio_engine *e, tio_dir *d, const char **step)
{
    struct io_uring *ring = &d->uring->ring;
    *step = "io_uring_register_buffers_sparse";
    int rc = io_uring_register_buffers_sparse(ring, e->n_bounce + TIO_ENGINE_MAX_REGISTERED);
    if (rc)
        return rc;
    d->uring->bufs_registered = true;
    *step = "io_uring_register_buffers_update_tag";
    if (e->test.probe_fail & TIO_PROBE_FAIL_MEMLOCK)
        return -ENOMEM;
    if (d->n_bounce == 0)
        return 0;
    struct iovec *iov = calloc(d->n_bounce, sizeof *iov);
    if (!iov)
        return -ENOMEM;
    for (uint32_t i = 0; i < d->n_bounce; i++)
        iov[i] = (struct iovec){.iov_base = d->slab + (size_t)i * e->bounce_bytes,
                                .iov_len = e->bounce_bytes};
    rc = io_uring_register_buffers_update_tag(ring, 0, iov, NULL, d->n_bounce);
    free(iov);
    return rc < 0 ? rc : 0;
}

static void register_buffers(tio_engine *e)
{
    const char *step = "";
    int rc = 0;
    for (uint32_t i = 0; i < e->n_dirs && !rc; i++)
        rc = register_ring_buffers(e, &e->dirs[i], &step);
    e->fixed_bufs = rc == 0;
    if (!rc)
        return;
    for (uint32_t j = 0; j < e->n_dirs; j++)
        if (e->dirs[j].uring->bufs_registered) {
            io_uring_unregister_buffers(&e->dirs[j].uring->ring);
            e->dirs[j].uring->bufs_registered = false;
        }
    char text[400];
    uint64_t slab_bytes = 0;
    for (uint32_t j = 0; j < e->n_dirs; j++)
        slab_bytes += (uint64_t)e->dirs[j].n_bounce * e->bounce_bytes;
    if (rc == -ENOMEM)
        tio_memlock_message(text, sizeof text, slab_bytes);
    else
        snprintf(text, sizeof text, "fixed buffers off: %s: %s", step, tio_strerror(rc));
    if (e->test.probe_fail & TIO_PROBE_FAIL_MEMLOCK)
        snprintf(text + strlen(text), sizeof text - strlen(text), " (forced by a test hook)");
    tio_engine_append_reason(e, text);
    tio_log(TIO_LOG_WARN, "engine: %s", text);
}

int tio_uring_update_slots(tio_engine *e, uint32_t slot, const struct iovec *iov, uint32_t n)
{
    struct iovec empty[TIO_ENGINE_MAX_REGISTERED];
    if (!iov) {
        memset(empty, 0, sizeof empty);
        iov = empty;
    }
    for (uint32_t i = 0; i < e->n_dirs; i++) {
        int rc = io_uring_register_buffers_update_tag(&e->dirs[i].uring->ring, slot, iov, NULL,
                                                      n);
        if (rc < 0) {
            if (iov != empty) {
                memset(empty, 0, sizeof empty);
                for (uint32_t j = 0; j < i; j++)
                    io_uring_register_buffers_update_tag(&e->dirs[j].uring->ring, slot, empty,
                                                         NULL, n);
            }
            return rc;
        }
    }
    return 0;
}

/* Wake directory d's completion thread with a NOP carrying no chunk, which
 * tells it to exit, and wait for it. */
static void stop_thread(tio_dir *d)
{
    pthread_mutex_lock(&d->mu);
    struct io_uring_sqe *sqe = io_uring_get_sqe(&d->uring->ring);
    if (!sqe) {
        submit_ring(d);
        sqe = io_uring_get_sqe(&d->uring->ring);
    }
    io_uring_prep_nop(sqe);
    io_uring_sqe_set_data(sqe, NULL);
    submit_ring(d);
    pthread_mutex_unlock(&d->mu);
    pthread_join(d->uring->thread, NULL);
}

static int uring_start(tio_engine *e, char *why, size_t why_len)
{
    if (e->test.probe_fail & TIO_PROBE_FAIL_URING) {
        snprintf(why, why_len, "io_uring_queue_init: %s (forced by a test hook)",
                 tio_strerror(-EPERM));
        return -EPERM;
    }
    uint32_t n_rings = 0;
    int rc = 0;
    for (; n_rings < e->n_dirs; n_rings++) {
        tio_dir *d = &e->dirs[n_rings];
        d->uring = calloc(1, sizeof *d->uring);
        if (!d->uring) {
            snprintf(why, why_len, "out of memory");
            rc = -ENOMEM;
            break;
        }
        rc = io_uring_queue_init(e->opt.queue_depth, &d->uring->ring, 0);
        if (rc) {
            snprintf(why, why_len, "io_uring_queue_init: %s", tio_strerror(rc));
            free(d->uring);
            d->uring = NULL;
            break;
        }
        d->uring->delay.tv_sec = e->test.fault_delay_ms / 1000;
        d->uring->delay.tv_nsec = (long long)(e->test.fault_delay_ms % 1000) * 1000000;
        rc = probe_ring(d, &d->uring->ring, why, why_len);
        if (rc) {
            n_rings++;
            break;
        }
    }
    if (rc) {
        close_rings(e, n_rings);
        return rc;
    }
    register_files(e);
    register_buffers(e);
    for (uint32_t i = 0; i < e->n_dirs; i++) {
        rc = pthread_create(&e->dirs[i].uring->thread, NULL, completion_main, &e->dirs[i]);
        if (rc) {
            snprintf(why, why_len, "cannot start completion thread: %s", tio_strerror(-rc));
            for (uint32_t j = 0; j < i; j++)
                stop_thread(&e->dirs[j]);
            close_rings(e, e->n_dirs);
            e->fixed_files = e->fixed_bufs = false;
            return -rc;
        }
    }
    return 0;
}

static void uring_stop(tio_engine *e)
{
    for (uint32_t i = 0; i < e->n_dirs; i++)
        stop_thread(&e->dirs[i]);
    close_rings(e, e->n_dirs);
}

const tio_backend_ops tio_uring_ops = {
    .id = TIO_BACKEND_IO_URING, .start = uring_start, .kick = feed, .stop = uring_stop};

#else /* !TIO_HAVE_LIBURING */

/* Built without liburing: the probe always refuses, so the engine never
 * selects this backend and kick/stop have no ring to act on. */
static int uring_start(tio_engine *e, char *why, size_t why_len)
{
    snprintf(why, why_len, "built without liburing");
    return -EPROTONOSUPPORT;
}

static void uring_kick(tio_dir *d) {}

static void uring_stop(tio_engine *e) {}

const tio_backend_ops tio_uring_ops = {
    .id = TIO_BACKEND_IO_URING, .start = uring_start, .kick = uring_kick, .stop = uring_stop};

int tio_uring_update_slots(tio_engine *e, uint32_t slot, const struct iovec *iov, uint32_t n)
{
    return -EOPNOTSUPP;
}

#endif
