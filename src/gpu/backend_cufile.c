/*
 * gpu/backend_cufile.c — GPUDirect Storage: device memory to and from
 * the backing files through cuFile, without host memory in between.
 *
 * One cuFile handle per backing file (registered once at attach; the file
 * must be open with O_DIRECT), and per directory a queue of device chunks
 * (urgent first, normal reads and writes in turn, as the host path) served
 * by two threads.  Each thread owns one batch handle and the arrays its
 * batches use: up to min(max_batch_io_size, 128) chunks go out in one
 * cuFileBatchIOSubmit, and the thread then collects their completions with
 * cuFileBatchIOGetStatus until every entry has reported.  Two threads per
 * directory keep one batch on the disk while the other collects.
 *
 * Every argument cuFile may read after the call that took it stays alive
 * until that batch has completed: the parameter array, the events array and
 * the chunks (the cookies) belong to the thread and are reused only for its
 * next batch.  A peer (LMCache #3589) freed stack-held size and offset
 * pointers of cuFileReadAsync before the I/O ran; teraio does not use the
 * stream API, and nothing it passes to the batch API lives on a stack.
 *
 * Ordering: before a batch holding a chunk of a request goes out, the
 * thread waits for that request's ready event (cudaEventSynchronize), so
 * cuFile reads device memory only after the kernels that wrote it, and
 * writes memory only after the kernels that used it before.
 *
 * Each completion is checked like any other chunk (tio_chunk_account): a
 * short transfer goes back to the front of the queue for the rest, an error
 * fails the request with the cuFile code in its message.  Where the batch
 * API is missing (cuFile < 1.7), the threads call cuFileRead / cuFileWrite
 * one chunk at a time.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/engine_internal.h"
#include "gpu/gpu_internal.h"

#define GDS_THREADS_PER_DIR 2u
#define GDS_MAX_BUFS 16u

typedef struct gds_dir gds_dir;

typedef struct {
    gds_dir *gd;
    pthread_t thread;
    bool started;
    tio_cufile_batch_handle batch;    /* NULL without the batch API */
    tio_cufile_io_params *params;     /* [max_entries], alive until the batch completes */
    tio_cufile_io_event *events;      /* [max_entries] */
    tio_chunk **chunks;               /* [max_entries] */
} gds_worker;

struct gds_dir {
    tio_gds *g;
    tio_dir *d;
    tio_cufile_handle fh;
    bool registered;
    char why[200];                    /* why not usable */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    tio_queue q;
    bool stop;
    gds_worker workers[GDS_THREADS_PER_DIR];
};

struct tio_gds {
    tio_engine *e;
    const tio_cufile_api *api;
    tio_cufile_drv_props props;
    bool compat;
    bool driver_open;
    uint32_t max_entries;
    gds_dir *dirs;
    uint32_t n_dirs;
    char library[256];
    char desc[400];
};

/* ---- one batch ---------------------------------------------------------- */

/* The bytes a completion moved, as tio_chunk_account takes them. */
static int64_t event_result(const tio_cufile_io_event *ev)
{
    ssize_t ret = (ssize_t)ev->ret;
    if (ev->status == TIO_CUFILE_COMPLETE)
        return ret;
    if (ret < 0 && -ret >= 5000)
        return tio_cufile_errno((tio_cufile_error){.err = (int)-ret});
    if (ret < 0 && -ret < 4096)
        return ret;
    return ev->status == TIO_CUFILE_TIMEOUT ? -ETIMEDOUT
           : ev->status == TIO_CUFILE_CANCELED ? -ECANCELED : -EIO;
}

/* Account one transfer attempt of chunk c; requeue, or finish it. */
static void settle(gds_dir *gd, tio_chunk *c, int64_t res)
{
    tio_engine *e = gd->g->e;
    int err = 0;
    switch (tio_chunk_account(c, res, &err)) {
    case TIO_CHUNK_RETRY:
        pthread_mutex_lock(&gd->mu);
        tio_queue_push_front(&gd->q, c);
        pthread_cond_signal(&gd->cv);
        pthread_mutex_unlock(&gd->mu);
        return;
    case TIO_CHUNK_DONE:
        atomic_fetch_add(&e->gpu->cufile_bytes[c->op], c->user_len);
        tio_chunk_finish(e, c, 0);
        return;
    default:
        tio_chunk_finish(e, c, err);
        return;
    }
}

/* A whole batch failed before any of it ran (submit or status error). */
static void fail_all(gds_worker *w, uint32_t n, tio_cufile_error ce, const char *call)
{
    char msg[200];
    tio_log(TIO_LOG_ERROR, "gpu: %s on '%s'", tio_cufile_msg(call, ce, msg, sizeof msg),
            w->gd->d->file);
    int err = tio_cufile_errno(ce);
    for (uint32_t i = 0; i < n; i++)
        tio_chunk_finish(w->gd->g->e, w->chunks[i], err ? err : -EIO);
}

/* Wait for each distinct request's ready event among the chunks. */
static void wait_ready(gds_worker *w, uint32_t n)
{
    const tio_cudart *rt = w->gd->g->e->gpu->rt;
    tio_req *last = NULL;
    for (uint32_t i = 0; i < n; i++) {
        tio_req *r = w->chunks[i]->req;
        if (r == last || !r->ready_ev)
            continue;
        last = r;
        tio_cuda_err err = rt->EventSynchronize(r->ready_ev);
        if (err != TIO_CUDA_SUCCESS) {
            char msg[200];
            tio_log(TIO_LOG_ERROR, "gpu: %s",
                    tio_cuda_msg(rt, "cudaEventSynchronize", err, msg, sizeof msg));
            rt->GetLastError();
        }
    }
}

/* Chunks with an injected EIO/ENOSPC fail without I/O; a delay waits.
 * Returns how many of the n remain for the batch (compacted). */
static uint32_t apply_faults(gds_worker *w, uint32_t n)
{
    uint32_t m = 0;
    for (uint32_t i = 0; i < n; i++) {
        tio_chunk *c = w->chunks[i];
        if (c->fault == TIO_FAULT_EIO || c->fault == TIO_FAULT_ENOSPC) {
            settle(w->gd, c, 0);
            continue;
        }
        if (c->fault == TIO_FAULT_DELAY) {
            uint32_t ms = w->gd->g->e->test.fault_delay_ms;
            struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
            while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
                ;
            c->fault = TIO_FAULT_NONE;
        }
        w->chunks[m++] = c;
    }
    return m;
}

static void run_batch(gds_worker *w, uint32_t n)
{
    gds_dir *gd = w->gd;
    const tio_cufile_api *api = gd->g->api;
    for (uint32_t i = 0; i < n; i++) {
        tio_chunk *c = w->chunks[i];
        w->params[i] = (tio_cufile_io_params){
            .mode = TIO_CUFILE_BATCH,
            .dev_ptr_base = c->io_ptr,
            .file_offset = (off_t)(c->file_off + c->done),
            .dev_ptr_offset = (off_t)c->done,
            .size = c->io_len - c->done,
            .fh = gd->fh,
            .opcode = c->op == TIO_OP_WRITE ? TIO_CUFILE_WRITE : TIO_CUFILE_READ,
            .cookie = c,
        };
    }
    tio_cufile_error ce = api->BatchIOSubmit(w->batch, n, w->params, 0);
    if (ce.err != TIO_CU_FILE_SUCCESS)
        return fail_all(w, n, ce, "cuFileBatchIOSubmit");
    tio_engine_gpu *gpu = gd->g->e->gpu;
    atomic_fetch_add(&gpu->batches, 1);
    for (unsigned prev = atomic_load(&gpu->max_batch);
         n > prev && !atomic_compare_exchange_weak(&gpu->max_batch, &prev, n);)
        ;
    uint32_t reported = 0;
    while (reported < n) {
        unsigned nr = n - reported;
        struct timespec timeout = {.tv_sec = 1};
        ce = api->BatchIOGetStatus(w->batch, 1, &nr, w->events, &timeout);
        if (ce.err != TIO_CU_FILE_SUCCESS) {
            /* the entries may still run: cancel, then fail what is left */
            api->BatchIOCancel(w->batch);
            char msg[200];
            tio_log(TIO_LOG_ERROR, "gpu: %s on '%s'",
                    tio_cufile_msg("cuFileBatchIOGetStatus", ce, msg, sizeof msg), gd->d->file);
            for (uint32_t i = 0; i < n; i++)
                if (w->chunks[i]) /* not reported yet */
                    tio_chunk_finish(gd->g->e, w->chunks[i], tio_cufile_errno(ce));
            return;
        }
        for (unsigned k = 0; k < nr; k++) {
            tio_chunk *c = w->events[k].cookie;
            for (uint32_t i = 0; i < n; i++)
                if (w->chunks[i] == c) {
                    w->chunks[i] = NULL; /* reported */
                    break;
                }
            settle(gd, c, event_result(&w->events[k]));
        }
        reported += nr;
    }
}

/* Without the batch API: one blocking cuFileRead / cuFileWrite per chunk. */
static void run_sync(gds_worker *w, uint32_t n)
{
    gds_dir *gd = w->gd;
    const tio_cufile_api *api = gd->g->api;
    for (uint32_t i = 0; i < n; i++) {
        tio_chunk *c = w->chunks[i];
        size_t len = c->io_len - c->done;
        off_t off = (off_t)(c->file_off + c->done), boff = (off_t)c->done;
        ssize_t got = c->op == TIO_OP_WRITE ? api->Write(gd->fh, c->io_ptr, len, off, boff)
                                            : api->Read(gd->fh, c->io_ptr, len, off, boff);
        /* >= 0: bytes; -1: see errno; below: a negated cuFile code */
        int64_t res = got >= 0 ? got
                      : got == -1 ? -errno
                      : -got >= 5000 ? tio_cufile_errno((tio_cufile_error){.err = (int)-got})
                                     : got;
        settle(gd, c, res);
    }
}

static void *worker_main(void *arg)
{
    gds_worker *w = arg;
    gds_dir *gd = w->gd;
    tio_gpu_bind_thread(gd->g->e->gpu);
    uint32_t max = gd->g->max_entries;
    pthread_mutex_lock(&gd->mu);
    for (;;) {
        uint32_t n = 0;
        tio_chunk *c;
        while (n < max && (c = tio_queue_pop(&gd->q)) != NULL)
            w->chunks[n++] = c;
        if (n == 0) {
            if (gd->stop)
                break;
            pthread_cond_wait(&gd->cv, &gd->mu);
            continue;
        }
        pthread_mutex_unlock(&gd->mu);
        wait_ready(w, n);
        n = apply_faults(w, n);
        if (n && w->batch)
            run_batch(w, n);
        else if (n)
            run_sync(w, n);
        pthread_mutex_lock(&gd->mu);
    }
    pthread_mutex_unlock(&gd->mu);
    return NULL;
}

/* ---- start / stop ------------------------------------------------------ */

/* All of a request's chunks of a directory are queued under one lock, so a
 * thread that wakes finds them all and fills its batch. */
void tio_gds_enqueue_request(tio_gds *g, tio_req *r)
{
    for (uint32_t di = 0; di < g->n_dirs; di++) {
        gds_dir *gd = &g->dirs[di];
        bool any = false;
        pthread_mutex_lock(&gd->mu);
        for (uint32_t i = 0; i < r->n_chunks; i++) {
            tio_chunk *c = &r->chunks[i];
            if (c->path == TIO_CHUNK_CUFILE && c->dir->index == di) {
                tio_queue_push_back(&gd->q, c);
                any = true;
            }
        }
        if (any)
            pthread_cond_broadcast(&gd->cv);
        pthread_mutex_unlock(&gd->mu);
    }
}

static void stop_dir(tio_gds *g, gds_dir *gd)
{
    pthread_mutex_lock(&gd->mu);
    gd->stop = true;
    pthread_cond_broadcast(&gd->cv);
    pthread_mutex_unlock(&gd->mu);
    for (uint32_t i = 0; i < GDS_THREADS_PER_DIR; i++) {
        gds_worker *w = &gd->workers[i];
        if (w->started)
            pthread_join(w->thread, NULL);
        if (w->batch)
            g->api->BatchIODestroy(w->batch);
        free(w->params);
        free(w->events);
        free(w->chunks);
    }
    if (gd->registered)
        g->api->HandleDeregister(gd->fh);
    pthread_mutex_destroy(&gd->mu);
    pthread_cond_destroy(&gd->cv);
}

void tio_gds_stop(tio_engine *e, tio_gds *g)
{
    for (uint32_t i = 0; i < g->n_dirs; i++)
        stop_dir(g, &g->dirs[i]);
    if (g->driver_open)
        tio_cufile_driver_close(g->api);
    free(g->dirs);
    free(g);
}

/* Register directory i's backing file and start its threads; a refusal
 * leaves the directory unusable (gd->why) but is no error. */
static void start_dir(tio_gds *g, uint32_t i)
{
    gds_dir *gd = &g->dirs[i];
    tio_dir *d = &g->e->dirs[i];
    gd->g = g;
    gd->d = d;
    if (!d->direct) {
        snprintf(gd->why, sizeof gd->why, "'%s' is not open with O_DIRECT (the file system "
                 "refused it)", d->file);
        return;
    }
    tio_cufile_descr descr;
    memset(&descr, 0, sizeof descr); /* fs_ops must be NULL */
    descr.type = TIO_CU_FILE_HANDLE_TYPE_OPAQUE_FD;
    descr.handle.fd = d->fd;
    tio_cufile_error ce = g->api->HandleRegister(&gd->fh, &descr);
    if (ce.err != TIO_CU_FILE_SUCCESS) {
        char msg[160];
        snprintf(gd->why, sizeof gd->why, "%s for '%s'",
                 tio_cufile_msg("cuFileHandleRegister", ce, msg, sizeof msg), d->file);
        return;
    }
    gd->registered = true;
    for (uint32_t k = 0; k < GDS_THREADS_PER_DIR; k++) {
        gds_worker *w = &gd->workers[k];
        w->gd = gd;
        w->params = calloc(g->max_entries, sizeof *w->params);
        w->events = calloc(g->max_entries, sizeof *w->events);
        w->chunks = calloc(g->max_entries, sizeof *w->chunks);
        if (!w->params || !w->events || !w->chunks) {
            snprintf(gd->why, sizeof gd->why, "out of memory");
            return;
        }
        if (g->api->BatchIOSetUp) {
            ce = g->api->BatchIOSetUp(&w->batch, g->max_entries);
            if (ce.err != TIO_CU_FILE_SUCCESS) {
                char msg[160];
                w->batch = NULL;
                snprintf(gd->why, sizeof gd->why, "%s",
                         tio_cufile_msg("cuFileBatchIOSetUp", ce, msg, sizeof msg));
                return;
            }
        }
    }
    for (uint32_t k = 0; k < GDS_THREADS_PER_DIR; k++) {
        gds_worker *w = &gd->workers[k];
        int rc = pthread_create(&w->thread, NULL, worker_main, w);
        if (rc) {
            snprintf(gd->why, sizeof gd->why, "cannot start a thread: %s", tio_strerror(-rc));
            return;
        }
        w->started = true;
    }
}

int tio_gds_start(tio_engine *e, tio_gds **out, char *why, size_t why_len)
{
    char lib[256], load_why[320];
    const tio_cufile_api *api = tio_cufile_load(lib, sizeof lib, load_why, sizeof load_why);
    if (!api) {
        snprintf(why, why_len, "%s", load_why);
        return -ENOENT;
    }
    tio_gds *g = calloc(1, sizeof *g);
    if (!g || !(g->dirs = calloc(e->n_dirs, sizeof *g->dirs))) {
        free(g);
        snprintf(why, why_len, "out of memory");
        return -ENOMEM;
    }
    g->e = e;
    g->api = api;
    g->n_dirs = e->n_dirs;
    snprintf(g->library, sizeof g->library, "%s", lib);
    for (uint32_t i = 0; i < e->n_dirs; i++) {
        pthread_mutex_init(&g->dirs[i].mu, NULL);
        pthread_cond_init(&g->dirs[i].cv, NULL);
    }
    int rc = tio_cufile_driver_open(api, &g->props, why, why_len);
    if (rc) {
        tio_gds_stop(e, g);
        return rc;
    }
    g->driver_open = true;
    g->compat = g->props.nvfs.major_version == 0 && g->props.nvfs.minor_version == 0;
    if (g->compat && !(g->props.nvfs.dcontrolflags & TIO_CU_FILE_ALLOW_COMPAT_MODE)) {
        snprintf(why, why_len, "nvidia-fs is not loaded and allow_compat_mode is off: cuFile "
                 "would refuse every transfer");
        tio_gds_stop(e, g);
        return -EOPNOTSUPP;
    }
    uint32_t max = g->props.max_batch_io_size ? g->props.max_batch_io_size : TIO_CUFILE_MAX_BATCH;
    g->max_entries = max < TIO_CUFILE_MAX_BATCH ? max : TIO_CUFILE_MAX_BATCH;
    uint32_t usable = 0;
    for (uint32_t i = 0; i < e->n_dirs; i++) {
        start_dir(g, i);
        usable += g->dirs[i].why[0] == '\0';
    }
    if (g->compat)
        snprintf(g->desc, sizeof g->desc, "cufile %s in compatibility mode (nvidia-fs is not "
                 "loaded: cuFile does POSIX I/O and copies)", g->library);
    else
        snprintf(g->desc, sizeof g->desc, "cufile %s with nvidia-fs %u.%u", g->library,
                 g->props.nvfs.major_version, g->props.nvfs.minor_version);
    size_t n = strlen(g->desc);
    snprintf(g->desc + n, sizeof g->desc - n, ", %s, batches of up to %u",
             api->BatchIOSubmit ? "batch API" : "no batch API (cuFileRead/Write)",
             g->max_entries);
    if (usable == 0) {
        snprintf(why, why_len, "no directory usable: %s", g->dirs[0].why);
        tio_gds_stop(e, g);
        return -EOPNOTSUPP;
    }
    *out = g;
    return 0;
}

bool tio_gds_dir_usable(const tio_gds *g, uint32_t dir, const char **why)
{
    if (!g) {
        *why = "not started";
        return false;
    }
    *why = g->dirs[dir].why;
    return g->dirs[dir].why[0] == '\0';
}

bool tio_gds_compat_mode(const tio_gds *g) { return g->compat; }

const tio_cufile_api *tio_gds_api(const tio_gds *g) { return g->api; }

const char *tio_gds_describe(const tio_gds *g) { return g->desc; }
