/*
 * engine/backend_psync.c — the portable backend: a few worker threads per
 * directory doing pread/pwrite, for systems where io_uring is refused
 * (old kernels, seccomp filters in containers).
 *
 * Each directory gets min(queue_depth, 4) workers that pop chunks from the
 * directory's pending queues, urgent class first, and loop on pread/pwrite
 * until the chunk is complete, applying the same length check, retry and
 * error rules as the io_uring backend (tio_chunk_account).  A few threads per
 * directory are enough to keep an NVMe SSD's queue busy with 1 MiB requests;
 * more would only add contention.
 */
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "engine/engine_internal.h"

#define TIO_PSYNC_MAX_WORKERS 4u

/* Run one prepared chunk to completion (or failure) with blocking calls. */
static void run_chunk(tio_engine *e, tio_chunk *c)
{
    int err = 0;
    if (c->fault == TIO_FAULT_DELAY) {
        struct timespec ts = {.tv_sec = e->test.fault_delay_ms / 1000,
                              .tv_nsec = (long)(e->test.fault_delay_ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
            ;
        c->fault = TIO_FAULT_NONE;
    }
    for (;;) {
        int64_t res;
        if (c->fault == TIO_FAULT_EIO || c->fault == TIO_FAULT_ENOSPC) {
            res = 0; /* injected failure: tio_chunk_account replaces it */
        } else {
            size_t len = c->io_len - c->done;
            off_t off = (off_t)(c->file_off + c->done);
            ssize_t n = c->op == TIO_OP_WRITE ? pwrite(c->dir->fd, c->io_ptr + c->done, len, off)
                                              : pread(c->dir->fd, c->io_ptr + c->done, len, off);
            res = n < 0 ? -errno : n;
        }
        if (tio_chunk_account(c, res, &err) != TIO_CHUNK_RETRY)
            break;
    }
    tio_chunk_finish(e, c, err);
}

static void *worker_main(void *arg)
{
    tio_dir *d = arg;
    pthread_mutex_lock(&d->mu);
    for (;;) {
        tio_chunk *c = tio_dir_pop(d);
        if (c && tio_chunk_prepare(d->engine, c) != 0) {
            tio_dir_push_front(d, c); /* wait for a bounce buffer */
            c = NULL;
        }
        if (!c) {
            if (d->stop)
                break;
            pthread_cond_wait(&d->cv, &d->mu);
            continue;
        }
        pthread_mutex_unlock(&d->mu);
        run_chunk(d->engine, c);
        pthread_mutex_lock(&d->mu);
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

static void stop_dir(tio_dir *d)
{
    pthread_mutex_lock(&d->mu);
    d->stop = true;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
    for (uint32_t i = 0; i < d->n_workers; i++)
        pthread_join(d->workers[i], NULL);
    free(d->workers);
    d->workers = NULL;
    d->n_workers = 0;
    d->stop = false;
}

static int psync_start(tio_engine *e, char *why, size_t why_len)
{
    uint32_t per_dir = e->opt.queue_depth < TIO_PSYNC_MAX_WORKERS ? e->opt.queue_depth
                                                                 : TIO_PSYNC_MAX_WORKERS;
    for (uint32_t i = 0; i < e->n_dirs; i++) {
        tio_dir *d = &e->dirs[i];
        d->workers = calloc(per_dir, sizeof *d->workers);
        int rc = d->workers ? 0 : ENOMEM;
        while (!rc && d->n_workers < per_dir) {
            rc = pthread_create(&d->workers[d->n_workers], NULL, worker_main, d);
            if (!rc)
                d->n_workers++;
        }
        if (rc) {
            snprintf(why, why_len, "cannot start worker threads for '%s': %s", d->path,
                     tio_strerror(-rc));
            for (uint32_t j = 0; j <= i; j++)
                stop_dir(&e->dirs[j]);
            return -rc;
        }
    }
    return 0;
}

static void psync_kick(tio_dir *d)
{
    pthread_cond_broadcast(&d->cv);
}

static void psync_stop(tio_engine *e)
{
    for (uint32_t i = 0; i < e->n_dirs; i++)
        stop_dir(&e->dirs[i]);
}

const tio_backend_ops tio_psync_ops = {
    .id = TIO_BACKEND_PSYNC, .start = psync_start, .kick = psync_kick, .stop = psync_stop};
