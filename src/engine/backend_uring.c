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
 * Every CQE is checked by tio_chunk_account: a short transfer or
 * -EINTR/-EAGAIN puts the chunk back at the front of the queue for the rest,
 * anything else fails the request.  Injected errors (TIO_ENGINE_FAULT) are
 * submitted as a NOP whose result is then replaced, so they travel the same
 * path as a real failure without touching the disk.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine_internal.h"
#include "teraio_config.h"

#if TIO_HAVE_LIBURING
#include <liburing.h>

#define CQE_BATCH 64u

struct tio_uring {
    struct io_uring ring;
    pthread_t thread;
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
        int err = tio_chunk_prepare(e, c);
        if (err) {
            tio_chunk_finish(e, c, err);
            continue;
        }
        struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
        if (!sqe) {
            tio_dir_push_front(d, c);
            break;
        }
        if (c->fault == TIO_FAULT_EIO || c->fault == TIO_FAULT_ENOSPC)
            io_uring_prep_nop(sqe);
        else if (c->op == TIO_OP_WRITE)
            io_uring_prep_write(sqe, d->fd, c->io_ptr + c->done, c->io_len - c->done,
                                c->file_off + c->done);
        else
            io_uring_prep_read(sqe, d->fd, c->io_ptr + c->done, c->io_len - c->done,
                               c->file_off + c->done);
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

int tio_uring_start(tio_engine *e, char *why, size_t why_len)
{
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
    for (uint32_t i = 0; i < e->n_dirs; i++) {
        rc = pthread_create(&e->dirs[i].uring->thread, NULL, completion_main, &e->dirs[i]);
        if (rc) {
            snprintf(why, why_len, "cannot start completion thread: %s", tio_strerror(-rc));
            for (uint32_t j = 0; j < i; j++)
                stop_thread(&e->dirs[j]);
            close_rings(e, e->n_dirs);
            return -rc;
        }
    }
    return 0;
}

void tio_uring_kick(tio_dir *d)
{
    feed(d);
}

void tio_uring_stop(tio_engine *e)
{
    for (uint32_t i = 0; i < e->n_dirs; i++)
        stop_thread(&e->dirs[i]);
    close_rings(e, e->n_dirs);
}

#else /* !TIO_HAVE_LIBURING */

/* Built without liburing: the probe always refuses, so the engine never
 * selects this backend and kick/stop have no ring to act on. */
int tio_uring_start(tio_engine *e, char *why, size_t why_len)
{
    snprintf(why, why_len, "built without liburing");
    return -EPROTONOSUPPORT;
}

void tio_uring_kick(tio_dir *d) {}

void tio_uring_stop(tio_engine *e) {}

#endif
