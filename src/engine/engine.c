/*
 * engine/engine.c — the engine's front end: options, choosing a backend,
 * cutting requests into chunks, and handing completions back to the caller.
 *
 * The caller's thread builds each request's chunks and appends them to the
 * pending queues of their directories; the backend's threads do the I/O and
 * call tio_chunk_finish, which moves a request to the completed list when its
 * last chunk is done.  tio_engine_reap and the synchronous helpers only ever
 * take requests off that list, so a synchronous call never swallows another
 * request's completion.  The bounce buffers, the chunk bookkeeping that
 * both backends share (prepare / account / finish) and the per-extent CRC32C
 * live here too.  The backends sit behind tio_backend_ops; the backing files
 * are backing_file.c's, the test hooks fault.c's.  Device memory (gpu.h)
 * leaves here at submit through the device route (tio_engine_device_route,
 * set by src/gpu at attach): its chunks go to the staging ring or the
 * cuFile threads and come back through tio_chunk_complete.
 */
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/resource.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>

#include "engine/engine_internal.h"

#define MIB (1024u * 1024u)
/* Bounce buffers per directory: queue_depth of them (but at least 4, the
 * most psync workers), capped at this many bytes of slab per directory and
 * in all, and at what the directory's file can hold. */
#define TIO_BOUNCE_SLAB_BYTES (64u * MIB)
#define TIO_BOUNCE_TOTAL_BYTES (256u * MIB)
/* Transparent huge page size (x86-64, arm64 with 4 KiB pages). */
#define TIO_HUGE_PAGE_BYTES (2u * MIB)
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25 /* Linux 6.1; older kernels answer EINVAL */
#endif


void tio_engine_options_default(tio_engine_options *opt)
{
    memset(opt, 0, sizeof *opt);
    opt->stripe_bytes = MIB;
    opt->queue_depth = 32;
    opt->request_bytes = MIB;
    opt->backend = TIO_BACKEND_AUTO;
    opt->checksum = true;
}

const char *tio_backend_name(tio_backend backend)
{
    switch (backend) {
    case TIO_BACKEND_AUTO: return "auto";
    case TIO_BACKEND_IO_URING: return "io_uring";
    case TIO_BACKEND_PSYNC: return "psync";
    }
    return "unknown";
}

tio_backend tio_engine_backend(const tio_engine *engine) { return engine->backend; }

const char *tio_engine_backend_reason(const tio_engine *engine) { return engine->reason; }

const char *tio_engine_backing_path(const tio_engine *engine, uint32_t dir)
{
    return dir < engine->n_dirs ? engine->dirs[dir].file : NULL;
}

uint32_t tio_engine_in_flight(const tio_engine *engine) { return engine->in_flight; }

bool tio_engine_fixed_buffers(const tio_engine *engine) { return engine->fixed_bufs; }

bool tio_engine_fixed_files(const tio_engine *engine) { return engine->fixed_files; }

void tio_engine_space_stats(const tio_engine *engine, tio_engine_space *out)
{
    tio_extent_map_stats(&engine->map, out);
}

void tio_engine_append_reason(tio_engine *e, const char *text)
{
    size_t n = strlen(e->reason);
    snprintf(e->reason + n, sizeof e->reason - n, "%s%s", n ? "; " : "", text);
}

void tio_memlock_message(char *out, size_t len, uint64_t bytes)
{
    struct rlimit rl;
    char limit[32] = "unknown";
    if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0) {
        if (rl.rlim_cur == RLIM_INFINITY)
            snprintf(limit, sizeof limit, "unlimited");
        else
            snprintf(limit, sizeof limit, "%llu bytes", (unsigned long long)rl.rlim_cur);
    }
    snprintf(out, len, "fixed buffers off: io_uring could not pin %llu bytes, RLIMIT_MEMLOCK is "
             "%s (raise it: 'ulimit -l unlimited', LimitMEMLOCK=infinity in a systemd unit, "
             "'--ulimit memlock=-1' for docker)", (unsigned long long)bytes, limit);
}

/* ---- options and environment ------------------------------------------ */

static int check_options(const tio_engine_options *in, tio_engine_options *opt)
{
    if (!in || !in->dirs || in->n_dirs == 0)
        return tio_fail(-EINVAL, "engine: at least one ssd directory is required");
    if (in->n_dirs > TIO_ENGINE_MAX_DIRS)
        return tio_fail(-EINVAL, "engine: %u ssd directories, at most %u", in->n_dirs,
                        TIO_ENGINE_MAX_DIRS);
    if (in->space_bytes == 0)
        return tio_fail(-EINVAL, "engine: space_bytes must be > 0");
    *opt = *in;
    if (opt->stripe_bytes == 0)
        opt->stripe_bytes = MIB;
    if (opt->queue_depth == 0)
        opt->queue_depth = 32;
    if (opt->request_bytes == 0)
        opt->request_bytes = MIB;
    if (opt->stripe_bytes % TIO_EXTENT_ALIGN)
        return tio_fail(-EINVAL, "engine: stripe_bytes %u is not a multiple of 4096",
                        opt->stripe_bytes);
    if (opt->request_bytes % TIO_EXTENT_ALIGN || opt->request_bytes > (1u << 30))
        return tio_fail(-EINVAL, "engine: request_bytes %u is not a multiple of 4096 up to 1 GiB",
                        opt->request_bytes);
    if (opt->queue_depth > 4096)
        return tio_fail(-EINVAL, "engine: queue_depth %u exceeds 4096", opt->queue_depth);
    if (opt->backend > TIO_BACKEND_PSYNC)
        return tio_fail(-EINVAL, "engine: unknown backend %d", (int)opt->backend);
    for (uint32_t i = 0; i < opt->n_dirs; i++)
        if (!opt->dirs[i] || !opt->dirs[i][0])
            return tio_fail(-EINVAL, "engine: ssd directory %u is empty", i);
    return 0;
}

/* TIO_ENGINE_BACKEND=auto|io_uring|psync overrides opt->backend (for
 * systems whose seccomp filter breaks io_uring in odd ways). */
static int apply_backend_env(tio_engine *e, bool *forced_by_env)
{
    const char *v = tio_env("ENGINE_BACKEND");
    *forced_by_env = false;
    if (!v || !v[0])
        return 0;
    if (strcmp(v, "auto") == 0)
        e->opt.backend = TIO_BACKEND_AUTO;
    else if (strcmp(v, "io_uring") == 0)
        e->opt.backend = TIO_BACKEND_IO_URING;
    else if (strcmp(v, "psync") == 0)
        e->opt.backend = TIO_BACKEND_PSYNC;
    else
        return tio_fail(-EINVAL, "TIO_ENGINE_BACKEND='%s': expected auto, io_uring or psync", v);
    *forced_by_env = true;
    return 0;
}

/* ---- buffers ----------------------------------------------------------- */

/* Ask the kernel to back [addr, addr + bytes) with transparent huge pages:
 * MADV_HUGEPAGE for pages not there yet, MADV_COLLAPSE for those already
 * faulted in as 4 KiB pages.  Only the 2 MiB-aligned part of the range is
 * touched.  Why: a 1 MiB O_DIRECT request over 4 KiB pages that are not
 * physically contiguous is 256 segments, more than a disk queue takes
 * (virtio-blk: 254, NVMe: 127 or so), so the block layer splits it and can
 * merge no neighbour into it; and the kernel describes a registered (fixed)
 * buffer by one entry per page unless it lies in huge folios, so fixed
 * buffers of 4 KiB pages always look scattered.  In huge pages the same
 * request is one segment.  Best effort: THP off ("never"), no huge page
 * free, memory that is not anonymous (a driver's pinned mapping) or an old
 * kernel only leave the memory as it was. */
void tio_request_huge_pages(void *addr, uint64_t bytes)
{
    uintptr_t start = ((uintptr_t)addr + TIO_HUGE_PAGE_BYTES - 1) & ~(uintptr_t)(TIO_HUGE_PAGE_BYTES - 1);
    uintptr_t end = ((uintptr_t)addr + bytes) & ~(uintptr_t)(TIO_HUGE_PAGE_BYTES - 1);
    if (end <= start)
        return;
    if (madvise((void *)start, end - start, MADV_HUGEPAGE) != 0)
        return;
    if (madvise((void *)start, end - start, MADV_COLLAPSE) != 0)
        tio_log(TIO_LOG_DEBUG, "engine: MADV_COLLAPSE of %llu bytes: %s",
                (unsigned long long)(end - start), strerror(errno));
}

/* How many bounce buffers directory `d` gets: sized from the queue depth,
 * the slab caps and what its share of the space can hold, so that memory
 * follows the space and not the number of directories (issue 12: 64
 * directories for a 1 MiB engine took 2.1 GB).  A directory that holds no
 * stripe unit gets none. */
static uint32_t bounce_count(const tio_engine *e, const tio_dir *d)
{
    uint64_t bb = e->bounce_bytes, n = e->opt.queue_depth;
    if (n < 4)
        n = 4;
    if (n > e->opt.queue_depth)
        n = e->opt.queue_depth;
    if (n > TIO_BOUNCE_SLAB_BYTES / bb)
        n = TIO_BOUNCE_SLAB_BYTES / bb;
    if (n > TIO_BOUNCE_TOTAL_BYTES / (bb * e->opt.n_dirs))
        n = TIO_BOUNCE_TOTAL_BYTES / (bb * e->opt.n_dirs);
    uint64_t fits = (d->data_bytes + bb - 1) / bb;
    if (n > fits)
        n = fits;
    return d->data_bytes ? (n ? (uint32_t)n : 1) : 0;
}

/* The directory's bounce slab and its free stack. */
static int alloc_bounce_slab(tio_engine *e, tio_dir *d)
{
    uint32_t n = bounce_count(e, d);
    if (n == 0)
        return 0;
    void *p;
    size_t bytes = (size_t)n * e->bounce_bytes;
    size_t align = bytes >= TIO_HUGE_PAGE_BYTES ? TIO_HUGE_PAGE_BYTES : TIO_EXTENT_ALIGN;
    if (posix_memalign(&p, align, bytes) != 0)
        return tio_fail(-ENOMEM, "engine: out of memory for %u bounce buffers of %u bytes", n,
                        e->bounce_bytes);
    tio_request_huge_pages(p, bytes);
    d->slab = p;
    d->bounce_free = malloc(n * sizeof *d->bounce_free);
    if (!d->bounce_free)
        return tio_fail(-ENOMEM, "engine: out of memory");
    d->n_bounce = n;
    for (uint32_t i = 0; i < n; i++)
        d->bounce_free[i] = n - 1 - i;
    d->n_bounce_free = n;
    if (n > e->n_bounce)
        e->n_bounce = n;
    return 0;
}

/* ---- create / destroy ------------------------------------------------- */

/* Start the backend options ask for: io_uring when it works (AUTO) or
 * only io_uring (IO_URING), else the psync pool, saying why. */
static int start_backend(tio_engine *e, bool forced_by_env)
{
    char why[384] = "";
    int rc;
    if (e->opt.backend != TIO_BACKEND_PSYNC) {
        rc = tio_uring_ops.start(e, why, sizeof why);
        if (rc == 0) {
            e->ops = &tio_uring_ops;
            e->backend = e->ops->id;
            return 0;
        }
        if (e->opt.backend == TIO_BACKEND_IO_URING)
            return tio_fail(-EPROTONOSUPPORT, "engine: io_uring backend refused: %s", why);
        tio_log(TIO_LOG_WARN, "engine: io_uring refused, using the psync thread pool: %s", why);
    } else {
        snprintf(why, sizeof why, "%s", forced_by_env ? "forced by TIO_ENGINE_BACKEND"
                                                      : "requested in options");
    }
    char fallback[512];
    snprintf(fallback, sizeof fallback, "psync: %s", why);
    char kept[sizeof e->reason];
    memcpy(kept, e->reason, sizeof kept);
    e->reason[0] = '\0';
    tio_engine_append_reason(e, fallback);
    if (kept[0])
        tio_engine_append_reason(e, kept);
    rc = tio_psync_ops.start(e, why, sizeof why);
    if (rc)
        return tio_fail(rc, "engine: psync backend failed to start: %s", why);
    e->ops = &tio_psync_ops;
    e->backend = e->ops->id;
    return 0;
}

static void free_engine(tio_engine *e)
{
    for (uint32_t i = 0; i < e->n_dirs; i++) {
        tio_dir *d = &e->dirs[i];
        tio_backing_file_close(d);
        free(d->file);
        free(d->name);
        free(d->path);
        free(d->slab);
        free(d->bounce_free);
        pthread_mutex_destroy(&d->mu);
        pthread_cond_destroy(&d->cv);
    }
    free(e->dirs);
    free(e->errs);
    tio_extent_map_fini(&e->map);
    pthread_mutex_destroy(&e->done_mu);
    pthread_cond_destroy(&e->done_cv);
    free(e);
}

int tio_engine_create(const tio_engine_options *opt, tio_engine **out)
{
    return tio_engine_create_test(opt, NULL, out);
}

int tio_engine_create_test(const tio_engine_options *opt, const tio_engine_test_options *test,
                           tio_engine **out)
{
    *out = NULL;
    tio_engine_options o;
    tio_engine_test_options t;
    int rc = check_options(opt, &o);
    if (rc || (rc = tio_engine_test_check(test, &t)) != 0)
        return rc;
    for (uint32_t i = 0; i < o.n_dirs; i++)
        if ((rc = tio_dir_check(o.dirs[i])) != 0)
            return rc;

    tio_engine *e = calloc(1, sizeof *e);
    if (!e)
        return tio_fail(-ENOMEM, "engine: out of memory");
    atomic_init(&e->refs, 1);
    e->opt = o;
    e->test = t;
    pthread_mutex_init(&e->done_mu, NULL);
    pthread_cond_init(&e->done_cv, NULL);
    e->bounce_bytes = o.request_bytes < o.stripe_bytes ? o.request_bytes : o.stripe_bytes;
    e->opt.dirs = NULL; /* the caller's array need not outlive create */

    bool forced_by_env;
    if ((rc = apply_backend_env(e, &forced_by_env)) != 0)
        goto fail;
    uint64_t space = (o.space_bytes + TIO_EXTENT_ALIGN - 1) & ~(uint64_t)(TIO_EXTENT_ALIGN - 1);
    if ((rc = tio_extent_map_init(&e->map, space)) != 0)
        goto fail;

    /* Stripe unit u (of `units`) lives in directory u % n_dirs at unit
     * u / n_dirs of its file: directory i holds units i, i + n, ..., and a
     * directory without any still gets a 4 KiB file for the probe. */
    uint64_t units = (space + o.stripe_bytes - 1) / o.stripe_bytes;
    e->dirs = calloc(o.n_dirs, sizeof *e->dirs);
    if (!e->dirs) {
        rc = tio_fail(-ENOMEM, "engine: out of memory");
        goto fail;
    }
    for (uint32_t i = 0; i < o.n_dirs; i++) {
        tio_dir *d = &e->dirs[i];
        d->engine = e;
        d->index = i;
        d->fd = -1;
        d->dirfd = -1;
        d->data_bytes = (units / o.n_dirs + (i < units % o.n_dirs)) * o.stripe_bytes;
        d->file_bytes = d->data_bytes ? d->data_bytes : TIO_EXTENT_ALIGN;
        pthread_mutex_init(&d->mu, NULL);
        pthread_cond_init(&d->cv, NULL);
        e->n_dirs = i + 1;
        d->path = strdup(o.dirs[i]);
        if (!d->path) {
            rc = tio_fail(-ENOMEM, "engine: out of memory");
            goto fail;
        }
        if ((rc = tio_backing_file_open(e, d)) != 0 || (rc = alloc_bounce_slab(e, d)) != 0)
            goto fail;
    }
    if ((rc = start_backend(e, forced_by_env)) != 0)
        goto fail;
    tio_log(TIO_LOG_INFO, "engine: %u dir(s), %llu bytes, backend %s%s%s", e->n_dirs,
            (unsigned long long)space, tio_backend_name(e->backend), e->reason[0] ? ": " : "",
            e->reason);
    *out = e;
    return 0;
fail:
    free_engine(e);
    return rc;
}

tio_engine *tio_engine_retain(tio_engine *engine)
{
    if (engine)
        atomic_fetch_add(&engine->refs, 1);
    return engine;
}

void tio_engine_destroy(tio_engine *engine)
{
    if (!engine || atomic_fetch_sub(&engine->refs, 1) != 1)
        return;
    pthread_mutex_lock(&engine->done_mu);
    while (engine->n_unfinished > 0)
        pthread_cond_wait(&engine->done_cv, &engine->done_mu);
    tio_req *r = engine->done_head;
    engine->done_head = engine->done_tail = NULL;
    pthread_mutex_unlock(&engine->done_mu);
    while (r) {
        tio_req *next = r->next;
        free(r);
        r = next;
    }
    if (engine->device)
        engine->device->detach(engine);
    engine->ops->stop(engine);
    free_engine(engine);
}

/* ---- extents ---------------------------------------------------------- */

int tio_engine_alloc(tio_engine *engine, uint64_t bytes, tio_extent *out)
{
    return tio_extent_map_alloc(&engine->map, bytes, out);
}

int tio_engine_free(tio_engine *engine, const tio_extent *extent)
{
    return tio_extent_map_free(&engine->map, extent);
}

/* ---- bounce buffers and chunk bookkeeping ----------------------------- */

/* Take a bounce buffer of the chunk's directory; dir->mu held. */
static bool bounce_get(tio_engine *e, tio_chunk *c)
{
    tio_dir *d = c->dir;
    if (d->n_bounce_free == 0)
        return false;
    c->bounce_slot = d->bounce_free[--d->n_bounce_free];
    c->bounce = d->slab + (size_t)c->bounce_slot * e->bounce_bytes;
    return true;
}

/* Give it back and let the backend use it (a chunk may be waiting). */
static void bounce_put(tio_engine *e, tio_chunk *c)
{
    tio_dir *d = c->dir;
    pthread_mutex_lock(&d->mu);
    d->bounce_free[d->n_bounce_free++] = c->bounce_slot;
    e->ops->kick(d);
    pthread_mutex_unlock(&d->mu);
    c->bounce = NULL;
}

int tio_chunk_prepare(tio_engine *engine, tio_chunk *c)
{
    if (c->io_ptr)
        return 0;
    if (c->io_len == c->user_len && ((uintptr_t)c->user_ptr % TIO_EXTENT_ALIGN) == 0) {
        c->io_ptr = c->user_ptr;
        return 0;
    }
    if (!bounce_get(engine, c))
        return -EAGAIN;
    if (c->op == TIO_OP_WRITE) {
        memcpy(c->bounce, c->user_ptr, c->user_len);
        memset(c->bounce + c->user_len, 0, c->io_len - c->user_len);
    }
    c->io_ptr = c->bounce;
    return 0;
}

int tio_chunk_account(tio_chunk *c, int64_t res, int *err)
{
    if (c->fault && tio_fault_apply(c, &res))
        return TIO_CHUNK_RETRY;

    if (res == -EINTR || res == -EAGAIN) {
        if (++c->retries > TIO_CHUNK_MAX_RETRIES) {
            *err = (int)res;
            return TIO_CHUNK_FAILED;
        }
        return TIO_CHUNK_RETRY;
    }
    if (res < 0) {
        *err = (int)res;
        return TIO_CHUNK_FAILED;
    }
    if (res == 0) {
        *err = -EIO; /* the file is preallocated: no end of file inside it */
        return TIO_CHUNK_FAILED;
    }
    c->done += (uint32_t)res;
    if (c->done >= c->io_len)
        return TIO_CHUNK_DONE;
    /* Short transfer: continue with the rest.  O_DIRECT needs an aligned
     * offset, so restart from the last 4 KiB boundary; moving the same bytes
     * to the same place again is harmless. */
    if (c->dir->direct)
        c->done &= ~(TIO_EXTENT_ALIGN - 1);
    if (++c->retries > TIO_CHUNK_MAX_RETRIES) {
        *err = -EIO;
        return TIO_CHUNK_FAILED;
    }
    return TIO_CHUNK_RETRY;
}

/* Append a finished request to the completed list; done_mu held. */
static void publish(tio_engine *e, tio_req *r)
{
    r->finished = true;
    r->next = NULL;
    if (e->done_tail)
        e->done_tail->next = r;
    else
        e->done_head = r;
    e->done_tail = r;
    if (!r->sync)
        e->n_done++;
    e->n_unfinished--;
    pthread_cond_broadcast(&e->done_cv);
}

/* Checksum on: the CRC32C of the chunk's bytes as they are on disk (the
 * memory the transfer used: the bounce buffer, the staging ring, or the
 * caller's memory).  A write keeps
 * it for the extent; a read compares it with the one its write left and
 * fails with TIO_ECORRUPT, naming the file and offset, when they differ.
 * Runs on the backend's thread, off the locks, so checking spreads over the
 * directories' threads.  Returns 0 or TIO_ECORRUPT with `msg` filled. */
static int check_chunk(tio_chunk *c, char *msg, size_t len)
{
    tio_req *r = c->req;
    uint32_t got = tio_crc32c(0, c->io_ptr, c->user_len);
    if (r->track)
        c->crc = got;
    if (!r->verify || got == c->crc)
        return 0;
    snprintf(msg, len, "read from '%s' at offset %llu (%u bytes): CRC32C mismatch (written "
             "0x%08x, read 0x%08x); tag %llu, extent at offset %llu (%llu bytes)",
             c->dir->file, (unsigned long long)c->file_off, c->user_len, c->crc, got,
             (unsigned long long)r->tag, (unsigned long long)r->extent.offset,
             (unsigned long long)r->extent.bytes);
    return TIO_ECORRUPT;
}

void tio_chunk_finish(tio_engine *e, tio_chunk *c, int err)
{
    tio_req *r = c->req;
    char msg[sizeof r->msg];
    if (err)
        snprintf(msg, sizeof msg, "%s '%s' at offset %llu (%u bytes): %s",
                 c->op == TIO_OP_WRITE ? "write to" : "read from", c->dir->file,
                 (unsigned long long)(c->file_off + c->done), c->io_len - c->done,
                 tio_strerror(err));
    else if ((r->track && !r->no_crc) || r->verify)
        err = check_chunk(c, msg, sizeof msg);
    if (c->path == TIO_CHUNK_STAGED && e->device) {
        e->device->chunk_done(e, c, err, msg); /* it completes the chunk */
        return;
    }
    if (!err && c->op == TIO_OP_READ && c->bounce)
        memcpy(c->user_ptr, c->bounce, c->user_len);
    if (c->bounce)
        bounce_put(e, c);
    tio_chunk_complete(e, c, err, msg);
}

void tio_chunk_complete(tio_engine *e, tio_chunk *c, int err, const char *msg)
{
    tio_req *r = c->req;
    pthread_mutex_lock(&e->done_mu);
    if (err && r->result == 0) {
        r->result = err;
        snprintf(r->msg, sizeof r->msg, "%s", msg);
    }
    if (--r->chunks_left == 0) {
        if (r->device && e->device)
            e->device->request_done(e, r);
        publish(e, r); /* from here on, r may be freed by its reaper */
    }
    pthread_mutex_unlock(&e->done_mu);
}

bool tio_queue_empty(const tio_queue *q)
{
    for (int cls = 0; cls < TIO_N_CLASSES; cls++)
        if (q->head[cls][TIO_OP_READ] || q->head[cls][TIO_OP_WRITE])
            return false;
    return true;
}

tio_chunk *tio_queue_pop(tio_queue *q)
{
    tio_chunk *c = NULL;
    int cls = TIO_CLASS_URGENT, op = TIO_OP_READ;
    if (q->head[TIO_CLASS_URGENT][TIO_OP_READ])
        op = TIO_OP_READ;
    else if (q->head[TIO_CLASS_URGENT][TIO_OP_WRITE])
        op = TIO_OP_WRITE;
    else {
        cls = TIO_CLASS_NORMAL;
        op = q->head[cls][q->next_op] ? q->next_op : !q->next_op;
        q->next_op = (uint8_t)!op;
    }
    c = q->head[cls][op];
    if (!c)
        return NULL;
    q->head[cls][op] = c->next;
    if (!q->head[cls][op])
        q->tail[cls][op] = NULL;
    c->next = NULL;
    return c;
}

void tio_queue_push_front(tio_queue *q, tio_chunk *c)
{
    c->next = q->head[TIO_CLASS_URGENT][c->op];
    q->head[TIO_CLASS_URGENT][c->op] = c;
    if (!q->tail[TIO_CLASS_URGENT][c->op])
        q->tail[TIO_CLASS_URGENT][c->op] = c;
}

void tio_queue_push_back(tio_queue *q, tio_chunk *c)
{
    c->next = NULL;
    if (q->tail[c->cls][c->op])
        q->tail[c->cls][c->op]->next = c;
    else
        q->head[c->cls][c->op] = c;
    q->tail[c->cls][c->op] = c;
}

void tio_dir_enqueue(tio_engine *e, tio_chunk *c)
{
    tio_dir *d = c->dir;
    pthread_mutex_lock(&d->mu);
    tio_queue_push_back(&d->pending, c);
    e->ops->kick(d);
    pthread_mutex_unlock(&d->mu);
}

/* ---- requests --------------------------------------------------------- */

static int check_request(const tio_engine *e, const tio_extent *x, const void *buf, uint64_t bytes)
{
    if (!x || (!buf && bytes))
        return tio_fail(-EINVAL, "engine: NULL extent or buffer");
    if (x->offset % TIO_EXTENT_ALIGN || x->offset > e->map.space_bytes ||
        x->bytes > e->map.space_bytes - x->offset)
        return tio_fail(-EINVAL, "engine: extent at offset %llu (%llu bytes) is outside the "
                        "%llu-byte space", (unsigned long long)x->offset,
                        (unsigned long long)x->bytes, (unsigned long long)e->map.space_bytes);
    if (bytes > x->bytes)
        return tio_fail(-EINVAL, "engine: request of %llu bytes exceeds its %llu-byte extent",
                        (unsigned long long)bytes, (unsigned long long)x->bytes);
    return 0;
}

/* Cut [x->offset, x->offset + bytes) into chunks: at most request_bytes,
 * never crossing a stripe unit.  Returns the request, or NULL (-ENOMEM). */
static tio_req *build_request(tio_engine *e, int op, const tio_extent *x, char *buf,
                              uint64_t bytes, uint64_t tag, bool urgent, bool sync)
{
    uint64_t stripe = e->opt.stripe_bytes, n = e->n_dirs;
    uint64_t n_chunks = 0;
    for (uint64_t pos = 0; pos < bytes;) {
        uint64_t o = x->offset + pos;
        uint64_t len = stripe - o % stripe;
        if (len > e->opt.request_bytes)
            len = e->opt.request_bytes;
        pos += len;
        n_chunks++;
    }
    if (n_chunks > UINT32_MAX)
        return NULL;
    tio_req *r = calloc(1, sizeof *r + n_chunks * sizeof(tio_chunk));
    if (!r)
        return NULL;
    r->tag = tag;
    r->sync = sync;
    r->op = (uint8_t)op;
    r->buf = buf;
    r->bytes = bytes;
    r->extent = *x;
    r->n_chunks = r->chunks_left = (uint32_t)n_chunks;
    uint64_t pos = 0;
    for (uint32_t i = 0; i < n_chunks; i++) {
        tio_chunk *c = &r->chunks[i];
        uint64_t o = x->offset + pos;
        uint64_t len = stripe - o % stripe;
        if (len > e->opt.request_bytes)
            len = e->opt.request_bytes;
        if (len > bytes - pos)
            len = bytes - pos;
        c->req = r;
        c->dir = &e->dirs[(o / stripe) % n];
        c->op = (uint8_t)op;
        c->cls = urgent ? TIO_CLASS_URGENT : TIO_CLASS_NORMAL;
        c->file_off = (o / (stripe * n)) * stripe + o % stripe;
        c->user_len = (uint32_t)len;
        c->io_len = (uint32_t)((len + TIO_EXTENT_ALIGN - 1) & ~(uint64_t)(TIO_EXTENT_ALIGN - 1));
        c->user_ptr = buf + pos;
        tio_fault_arm(e, c);
        pos += len;
    }
    return r;
}

static void enqueue_request(tio_engine *e, tio_req *r)
{
    pthread_mutex_lock(&e->done_mu);
    e->n_unfinished++;
    if (r->n_chunks == 0)
        publish(e, r);
    pthread_mutex_unlock(&e->done_mu);
    if (r->device && e->device) {
        e->device->enqueue(e, r);
        return;
    }
    for (uint32_t di = 0; di < e->n_dirs && r->n_chunks; di++) {
        tio_dir *d = &e->dirs[di];
        bool any = false;
        pthread_mutex_lock(&d->mu);
        for (uint32_t i = 0; i < r->n_chunks; i++) {
            tio_chunk *c = &r->chunks[i];
            if (c->dir != d)
                continue;
            tio_queue_push_back(&d->pending, c);
            any = true;
        }
        if (any)
            e->ops->kick(d);
        pthread_mutex_unlock(&d->mu);
    }
}

static int submit(tio_engine *e, int op, const tio_extent *x, char *buf, uint64_t bytes,
                  uint64_t tag, bool urgent, bool sync, tio_req **out)
{
    int rc = check_request(e, x, buf, bytes);
    if (rc)
        return rc;
    tio_used_extent *ue = NULL;
    if (e->opt.checksum && bytes) {
        ue = tio_extent_map_find(&e->map, x);
        if (!ue)
            return tio_fail(-EINVAL, "engine: checksum on, but the extent at offset %llu "
                            "(%llu bytes) is not one tio_engine_alloc returned",
                            (unsigned long long)x->offset, (unsigned long long)x->bytes);
        if (op == TIO_OP_READ && ue->state == TIO_XS_FAILED)
            return tio_fail(TIO_ECORRUPT, "read of tag %llu: extent at offset %llu (%llu bytes): "
                            "its last write failed, it holds no valid data",
                            (unsigned long long)tag, (unsigned long long)x->offset,
                            (unsigned long long)x->bytes);
    }
    tio_req *r = build_request(e, op, x, buf, bytes, tag, urgent, sync);
    if (!r || (ue && op == TIO_OP_WRITE && tio_grow((void **)&ue->crcs, &ue->cap_crcs,
                                                    r->n_chunks, sizeof *ue->crcs) != 0)) {
        free(r);
        return tio_fail(-ENOMEM, "engine: out of memory queueing a %llu-byte request",
                        (unsigned long long)bytes);
    }
    if (e->device && bytes && e->device->is_device(e, buf)) {
        r->device = true;
        if ((rc = e->device->prepare(e, r, 0)) != 0) {
            free(r);
            return rc;
        }
    }
    if (ue && op == TIO_OP_WRITE) {
        r->track = true;
        ue->state = TIO_XS_WRITING;
    } else if (ue && ue->state == TIO_XS_VALID && ue->crc_bytes == bytes &&
               ue->n_crcs == r->n_chunks && !r->no_crc) {
        for (uint32_t i = 0; i < r->n_chunks; i++)
            r->chunks[i].crc = ue->crcs[i];
        r->verify = true;
    }
    if (out)
        *out = r;
    if (!sync)
        e->in_flight++;
    enqueue_request(e, r);
    return 0;
}

int tio_engine_submit_write(tio_engine *engine, const tio_extent *extent, const void *buf,
                            uint64_t bytes, uint64_t tag, bool urgent)
{
    return submit(engine, TIO_OP_WRITE, extent, (char *)buf, bytes, tag, urgent, false, NULL);
}

int tio_engine_submit_read(tio_engine *engine, const tio_extent *extent, void *buf,
                           uint64_t bytes, uint64_t tag, bool urgent)
{
    return submit(engine, TIO_OP_READ, extent, buf, bytes, tag, urgent, false, NULL);
}

/* ---- completions ------------------------------------------------------ */

/* A reaped write, checksum on: record what the extent now holds, one CRC32C
 * per chunk (if it is still allocated; when the table cannot grow, the
 * extent counts as failed: no read of it passes unchecked).  Caller's
 * thread, like the allocator. */
static void track_write(tio_engine *e, const tio_req *r)
{
    if (!r->track)
        return;
    tio_used_extent *ue = tio_extent_map_find(&e->map, &r->extent);
    if (!ue)
        return;
    ue->state = TIO_XS_FAILED;
    if (!r->result && r->no_crc) {
        /* written by cuFile: valid, with nothing to check it against */
        ue->n_crcs = 0;
        ue->crc_bytes = 0;
        ue->state = TIO_XS_VALID;
        return;
    }
    if (r->result || tio_grow((void **)&ue->crcs, &ue->cap_crcs, r->n_chunks,
                              sizeof *ue->crcs) != 0)
        return;
    for (uint32_t i = 0; i < r->n_chunks; i++)
        ue->crcs[i] = r->chunks[i].crc;
    ue->n_crcs = r->n_chunks;
    ue->crc_bytes = r->bytes;
    ue->state = TIO_XS_VALID;
}

int tio_engine_reap(tio_engine *e, tio_completion *out, uint32_t max, uint32_t min_complete)
{
    if (min_complete > max || (max && !out))
        return tio_fail(-EINVAL, "engine: reap with min_complete %u > max %u", min_complete, max);
    if (min_complete > e->in_flight)
        return tio_fail(-EINVAL, "engine: reap would wait for %u completions with only %u "
                        "requests in flight", min_complete, e->in_flight);
    tio_req *taken = NULL, **link = &taken;
    uint32_t n = 0;
    pthread_mutex_lock(&e->done_mu);
    while (e->n_done < min_complete)
        pthread_cond_wait(&e->done_cv, &e->done_mu);
    tio_req *prev = NULL;
    for (tio_req *r = e->done_head; r && n < max;) {
        tio_req *next = r->next;
        if (r->sync) {
            prev = r;
        } else {
            if (prev)
                prev->next = next;
            else
                e->done_head = next;
            if (e->done_tail == r)
                e->done_tail = prev;
            r->next = NULL;
            *link = r;
            link = &r->next;
            n++;
            e->n_done--;
        }
        r = next;
    }
    pthread_mutex_unlock(&e->done_mu);

    e->n_errs = 0;
    bool reported = false;
    uint32_t i = 0;
    for (tio_req *r = taken; r; i++) {
        tio_req *next = r->next;
        out[i] = (tio_completion){.tag = r->tag, .result = r->result};
        track_write(e, r);
        if (r->result && tio_grow((void **)&e->errs, &e->cap_errs, e->n_errs + 1,
                                  sizeof *e->errs) == 0) {
            e->errs[e->n_errs].tag = r->tag;
            memcpy(e->errs[e->n_errs].msg, r->msg, sizeof r->msg);
            e->n_errs++;
        }
        if (r->result && !reported) {
            tio_fail(r->result, "%s", r->msg);
            reported = true;
        }
        free(r);
        r = next;
    }
    e->in_flight -= n;
    return (int)n;
}

const char *tio_engine_completion_error(const tio_engine *engine, uint64_t tag)
{
    for (uint32_t i = 0; i < engine->n_errs; i++)
        if (engine->errs[i].tag == tag)
            return engine->errs[i].msg;
    return "";
}

/* Wait for synchronous request `r`, take it off the completed list, record
 * a write's checksums and free it.  Returns its result. */
static int wait_sync(tio_engine *e, tio_req *r)
{
    int rc;
    pthread_mutex_lock(&e->done_mu);
    while (!r->finished)
        pthread_cond_wait(&e->done_cv, &e->done_mu);
    tio_req **p = &e->done_head, *prev = NULL;
    while (*p != r) {
        prev = *p;
        p = &(*p)->next;
    }
    *p = r->next;
    if (e->done_tail == r)
        e->done_tail = prev;
    pthread_mutex_unlock(&e->done_mu);
    track_write(e, r);
    rc = r->result;
    if (rc)
        tio_fail(rc, "%s", r->msg);
    free(r);
    return rc;
}

static int run_sync(tio_engine *e, int op, const tio_extent *x, char *buf, uint64_t bytes)
{
    tio_req *r;
    int rc = submit(e, op, x, buf, bytes, 0, false, true, &r);
    return rc ? rc : wait_sync(e, r);
}

int tio_engine_dir_io(tio_engine *e, uint32_t dir, int op, void *buf, uint64_t bytes,
                      uint8_t path)
{
    tio_dir *d = &e->dirs[dir];
    uint64_t max = e->bounce_bytes; /* min(request_bytes, stripe_bytes), as any chunk */
    uint64_t n = (bytes + max - 1) / max;
    if (!e->device)
        return tio_fail(-EINVAL, "engine: device transfer without a device route");
    if (bytes == 0 || bytes > d->file_bytes || n > UINT32_MAX)
        return tio_fail(-EINVAL, "engine: %llu probe bytes for '%s'", (unsigned long long)bytes,
                        d->file);
    tio_req *r = calloc(1, sizeof *r + n * sizeof(tio_chunk));
    if (!r)
        return tio_fail(-ENOMEM, "engine: out of memory");
    r->sync = true;
    r->op = (uint8_t)op;
    r->buf = buf;
    r->bytes = bytes;
    r->n_chunks = r->chunks_left = (uint32_t)n;
    r->device = true;
    for (uint32_t i = 0; i < n; i++) {
        tio_chunk *c = &r->chunks[i];
        uint64_t pos = i * max, len = bytes - pos < max ? bytes - pos : max;
        c->req = r;
        c->dir = d;
        c->op = (uint8_t)op;
        c->cls = TIO_CLASS_NORMAL;
        c->file_off = pos;
        c->user_len = (uint32_t)len;
        c->io_len = (uint32_t)((len + TIO_EXTENT_ALIGN - 1) & ~(uint64_t)(TIO_EXTENT_ALIGN - 1));
        c->user_ptr = (char *)buf + pos;
    }
    int rc = e->device->prepare(e, r, path);
    if (rc) {
        free(r);
        return rc;
    }
    r->no_crc = true;
    enqueue_request(e, r);
    return wait_sync(e, r);
}

int tio_engine_write(tio_engine *engine, const tio_extent *extent, const void *buf, uint64_t bytes)
{
    return run_sync(engine, TIO_OP_WRITE, extent, (char *)buf, bytes);
}

int tio_engine_read(tio_engine *engine, const tio_extent *extent, void *buf, uint64_t bytes)
{
    return run_sync(engine, TIO_OP_READ, extent, buf, bytes);
}

/* ---- registered buffers ---------------------------------------------- */

static void lock_dirs(tio_engine *e)
{
    for (uint32_t i = 0; i < e->n_dirs; i++)
        pthread_mutex_lock(&e->dirs[i].mu);
}

static void unlock_dirs(tio_engine *e)
{
    for (uint32_t i = e->n_dirs; i-- > 0;)
        pthread_mutex_unlock(&e->dirs[i].mu);
}

/* First slot (absolute) of a free run of n user slots, or TIO_NO_SLOT. */
static uint32_t find_slots(const tio_engine *e, uint32_t n)
{
    uint32_t base = e->n_bounce;
    for (uint32_t s = base; s + n <= base + TIO_ENGINE_MAX_REGISTERED; s++) {
        bool clash = false;
        for (uint32_t i = 0; i < e->n_regions && !clash; i++) {
            const tio_region *r = &e->regions[i];
            clash = s < r->slot + r->n_slots && r->slot < s + n;
        }
        if (!clash)
            return s;
    }
    return TIO_NO_SLOT;
}

int tio_engine_register_buffer(tio_engine *e, void *addr, uint64_t bytes)
{
    if (!addr || bytes == 0)
        return tio_fail(-EINVAL, "engine: register_buffer needs an address and bytes > 0");
    tio_request_huge_pages(addr, bytes);
    if (!e->fixed_bufs)
        return 0;
    char *a = addr;
    for (uint32_t i = 0; i < e->n_regions; i++) {
        const tio_region *r = &e->regions[i];
        if (a < r->addr + r->bytes && r->addr < a + bytes)
            return tio_fail(-EINVAL, "engine: buffer %p (%llu bytes) overlaps a registered one",
                            addr, (unsigned long long)bytes);
    }
    uint64_t n64 = (bytes + TIO_REG_SLOT_BYTES - 1) / TIO_REG_SLOT_BYTES;
    uint32_t slot = n64 <= TIO_ENGINE_MAX_REGISTERED ? find_slots(e, (uint32_t)n64) : TIO_NO_SLOT;
    if (slot == TIO_NO_SLOT || e->n_regions == TIO_ENGINE_MAX_REGISTERED)
        return tio_fail(-ENOSPC, "engine: no room to register %llu more bytes (%u slots of "
                        "1 GiB in all)", (unsigned long long)bytes, TIO_ENGINE_MAX_REGISTERED);
    uint32_t n = (uint32_t)n64;
    struct iovec iov[TIO_ENGINE_MAX_REGISTERED];
    for (uint32_t i = 0; i < n; i++) {
        uint64_t off = (uint64_t)i * TIO_REG_SLOT_BYTES;
        iov[i].iov_base = a + off;
        iov[i].iov_len = bytes - off < TIO_REG_SLOT_BYTES ? bytes - off : TIO_REG_SLOT_BYTES;
    }
    int rc = tio_uring_update_slots(e, slot, iov, n);
    if (rc == -ENOMEM) {
        char msg[400];
        tio_memlock_message(msg, sizeof msg, bytes);
        return tio_fail(-ENOMEM, "engine: register_buffer: %s", msg);
    }
    if (rc)
        return tio_fail(rc, "engine: register_buffer of %llu bytes: io_uring_register: %s",
                        (unsigned long long)bytes, tio_strerror(rc));
    lock_dirs(e);
    e->regions[e->n_regions++] = (tio_region){.addr = a, .bytes = bytes, .slot = slot,
                                              .n_slots = n};
    unlock_dirs(e);
    return 0;
}

int tio_engine_unregister_buffer(tio_engine *e, void *addr)
{
    if (!e->fixed_bufs)
        return 0;
    for (uint32_t i = 0; i < e->n_regions; i++) {
        if (e->regions[i].addr != (char *)addr)
            continue;
        tio_region r = e->regions[i];
        lock_dirs(e);
        e->regions[i] = e->regions[--e->n_regions];
        unlock_dirs(e);
        int rc = tio_uring_update_slots(e, r.slot, NULL, r.n_slots);
        if (rc)
            return tio_fail(rc, "engine: unregister_buffer: io_uring_register: %s",
                            tio_strerror(rc));
        return 0;
    }
    return tio_fail(-EINVAL, "engine: buffer %p is not registered", addr);
}
