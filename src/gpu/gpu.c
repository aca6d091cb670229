/*
 * gpu/gpu.c — attaching a GPU to an engine (gpu.h): options, the per-
 * directory choice between the staging ring and cuFile, routing device
 * requests, the events that order them after the compute stream.
 *
 * The choice is measured, not assumed: for each directory whose backing
 * file cuFile accepted, the probe writes and reads back probe_bytes of
 * device memory through each path, checks the bytes, and keeps cuFile only
 * where it took less time.  In compatibility mode (no nvidia-fs) cuFile
 * does POSIX I/O plus a copy inside the library, usually slower than the
 * ring: the probe then keeps staging, and the reason says so.
 *
 * The engine reaches this folder only through the device route that attach
 * sets (tio_engine_device_route, engine_internal.h): src/gpu includes the
 * engine, never the other way round.
 */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"
#include "gpu/gpu_internal.h"

#define MIB (1024ull * 1024ull)

void tio_engine_gpu_options_default(tio_engine_gpu_options *opt)
{
    memset(opt, 0, sizeof *opt);
    opt->device = -1;
    opt->pinned_bytes = TIO_GPU_DEFAULT_PINNED_BYTES;
    opt->path = TIO_GPU_PATH_AUTO;
    opt->probe_bytes = TIO_GPU_DEFAULT_PROBE_BYTES;
}

const char *tio_gpu_path_name(tio_gpu_path path)
{
    switch (path) {
    case TIO_GPU_PATH_AUTO: return "auto";
    case TIO_GPU_PATH_STAGING: return "staging";
    case TIO_GPU_PATH_CUFILE: return "cufile";
    }
    return "unknown";
}

int tio_gpu_fail(const tio_engine_gpu *g, int code, const char *call, tio_cuda_err err)
{
    char msg[256];
    tio_cuda_msg(g->rt, call, err, msg, sizeof msg);
    g->rt->GetLastError();
    return tio_fail(code, "gpu: %s", msg);
}

void tio_gpu_bind_thread(const tio_engine_gpu *g)
{
    tio_cuda_err err = g->rt->SetDevice(g->device);
    if (err != TIO_CUDA_SUCCESS) {
        char msg[256];
        tio_log(TIO_LOG_ERROR, "gpu: %s",
                tio_cuda_msg(g->rt, "cudaSetDevice", err, msg, sizeof msg));
    }
}

static void append_reason(tio_engine_gpu *g, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void append_reason(tio_engine_gpu *g, const char *fmt, ...)
{
    size_t n = strlen(g->reason);
    if (n && n + 2 < sizeof g->reason) {
        memcpy(g->reason + n, "; ", 3);
        n += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->reason + n, sizeof g->reason - n, fmt, ap);
    va_end(ap);
}

/* ---- events ---------------------------------------------------------- */

static int event_get(tio_engine_gpu *g, tio_cuda_event *out)
{
    pthread_mutex_lock(&g->ev_mu);
    if (g->n_ev_free) {
        *out = g->ev_free[--g->n_ev_free];
        pthread_mutex_unlock(&g->ev_mu);
        return 0;
    }
    int rc = 0;
    tio_cuda_event ev;
    tio_cuda_err err = g->rt->EventCreateWithFlags(&ev, TIO_CUDA_EVENT_DISABLE_TIMING);
    if (err != TIO_CUDA_SUCCESS)
        rc = tio_gpu_fail(g, -ENOMEM, "cudaEventCreateWithFlags", err);
    else if ((rc = tio_grow((void **)&g->ev_all, &g->cap_ev_all, g->n_ev_all + 1,
                            sizeof *g->ev_all)) != 0 ||
             (rc = tio_grow((void **)&g->ev_free, &g->cap_ev, g->n_ev_all + 1,
                            sizeof *g->ev_free)) != 0)
        g->rt->EventDestroy(ev);
    else
        g->ev_all[g->n_ev_all++] = *out = ev;
    pthread_mutex_unlock(&g->ev_mu);
    return rc;
}

/* Route: the request is finished, recycle its event; done_mu held (ev_mu is
 * a leaf lock). */
static void request_done(tio_engine *e, tio_req *r)
{
    tio_engine_gpu *g = e->gpu;
    if (!r->ready_ev)
        return;
    pthread_mutex_lock(&g->ev_mu);
    g->ev_free[g->n_ev_free++] = r->ready_ev; /* room: cap_ev >= n_ev_all */
    pthread_mutex_unlock(&g->ev_mu);
    r->ready_ev = NULL;
}

/* ---- routing ----------------------------------------------------------- */

/* Route: is `buf` device memory? */
static bool is_device(const tio_engine *e, const void *buf)
{
    return tio_cuda_is_device(e->gpu->rt, buf);
}

/* Route: set the chunks' paths (force_path: TIO_CHUNK_STAGED or _CUFILE for
 * all, 0: each directory's) and record the ready event on the compute
 * stream.  Returns 0 or -errno (message set); caller's thread. */
static int prepare_request(tio_engine *e, tio_req *r, uint8_t force_path)
{
    tio_engine_gpu *g = e->gpu;
    for (uint32_t i = 0; i < r->n_chunks; i++) {
        tio_chunk *c = &r->chunks[i];
        uint8_t path = force_path ? force_path
                       : g->dir_path[c->dir->index] == TIO_GPU_PATH_CUFILE ? TIO_CHUNK_CUFILE
                                                                           : TIO_CHUNK_STAGED;
        c->path = path;
        if (path == TIO_CHUNK_CUFILE) {
            /* cuFile takes any length; no bounce, nothing past the caller's bytes */
            c->io_ptr = c->user_ptr;
            c->io_len = c->user_len;
            r->no_crc = true;
        }
    }
    int rc = event_get(g, &r->ready_ev);
    if (rc)
        return rc;
    tio_cuda_err err = g->rt->EventRecord(r->ready_ev, g->stream);
    if (err != TIO_CUDA_SUCCESS) {
        rc = tio_gpu_fail(g, -EIO, "cudaEventRecord on the compute stream", err);
        pthread_mutex_lock(&g->ev_mu);
        g->ev_free[g->n_ev_free++] = r->ready_ev;
        pthread_mutex_unlock(&g->ev_mu);
        r->ready_ev = NULL;
    }
    return rc;
}

/* Route: hand the chunks to the cuFile threads and the staging ring. */
static void enqueue_request(tio_engine *e, tio_req *r)
{
    tio_engine_gpu *g = e->gpu;
    bool staged = false, cufile = false;
    for (uint32_t i = 0; i < r->n_chunks; i++) {
        staged |= r->chunks[i].path == TIO_CHUNK_STAGED;
        cufile |= r->chunks[i].path == TIO_CHUNK_CUFILE;
    }
    if (cufile)
        tio_gds_enqueue_request(g->gds, r);
    if (staged)
        tio_staging_submit(g->staging, r);
}

/* ---- attach ---------------------------------------------------------- */

static int check_gpu_options(const tio_engine *e, const tio_engine_gpu_options *in,
                             tio_engine_gpu_options *opt)
{
    tio_engine_gpu_options_default(opt);
    if (in)
        *opt = *in;
    if (opt->pinned_bytes == 0)
        opt->pinned_bytes = TIO_GPU_DEFAULT_PINNED_BYTES;
    if (opt->probe_bytes == 0)
        opt->probe_bytes = TIO_GPU_DEFAULT_PROBE_BYTES;
    if (opt->path > TIO_GPU_PATH_CUFILE)
        return tio_fail(-EINVAL, "gpu: unknown path %d", (int)opt->path);
    uint64_t engine_chunk = e->bounce_bytes; /* min(request_bytes, stripe_bytes) */
    if (opt->chunk_bytes == 0) {
        uint64_t c = (opt->pinned_bytes / TIO_GPU_MAX_SLOTS) & ~(2 * MIB - 1);
        opt->chunk_bytes = c > engine_chunk ? c : engine_chunk;
    } else if (opt->chunk_bytes % TIO_EXTENT_ALIGN || opt->chunk_bytes < engine_chunk) {
        return tio_fail(-EINVAL, "gpu: chunk_bytes %llu must be a multiple of 4096 and at least "
                        "the engine's chunk of %llu bytes (min of request_bytes and "
                        "stripe_bytes)", (unsigned long long)opt->chunk_bytes,
                        (unsigned long long)engine_chunk);
    }
    if (opt->pinned_bytes < opt->chunk_bytes)
        return tio_fail(-EINVAL, "gpu: pinned budget of %llu bytes is below one chunk of %llu "
                        "bytes: give at least %llu", (unsigned long long)opt->pinned_bytes,
                        (unsigned long long)opt->chunk_bytes,
                        (unsigned long long)opt->chunk_bytes);
    opt->probe_bytes = (opt->probe_bytes + TIO_EXTENT_ALIGN - 1) & ~(uint64_t)(TIO_EXTENT_ALIGN - 1);
    return 0;
}

/* One timed direction of the probe: ns, or a negative error. */
static int64_t probe_once(tio_engine *e, uint32_t dir, int op, void *dev, uint64_t bytes,
                          uint8_t path)
{
    uint64_t t0 = tio_now_ns();
    int rc = tio_engine_dir_io(e, dir, op, dev, bytes, path);
    return rc ? rc : (int64_t)(tio_now_ns() - t0);
}

/* Write `src` (device, pattern) and read it back into `dst` through `path`
 * in directory `dir`; check the bytes through `host`.  Returns the time in
 * ns or a negative error. */
static int64_t probe_path(tio_engine *e, uint32_t dir, uint8_t path, void *src, void *dst,
                          unsigned char *host, uint64_t bytes)
{
    tio_engine_gpu *g = e->gpu;
    int64_t w = probe_once(e, dir, TIO_OP_WRITE, src, bytes, path);
    if (w < 0)
        return w;
    int64_t r = probe_once(e, dir, TIO_OP_READ, dst, bytes, path);
    if (r < 0)
        return r;
    tio_cuda_err err = g->rt->Memcpy(host + bytes, dst, bytes, TIO_CUDA_MEMCPY_D2H);
    if (err != TIO_CUDA_SUCCESS)
        return tio_gpu_fail(g, -EIO, "cudaMemcpy of the probe", err);
    if (memcmp(host, host + bytes, bytes) != 0)
        return tio_fail(-EIO, "gpu: probe of '%s' by %s read back other bytes than it wrote",
                        e->dirs[dir].file, path == TIO_CHUNK_CUFILE ? "cufile" : "staging");
    return w + r;
}

/* AUTO: measure both paths in every directory cuFile can use. */
static int probe_dirs(tio_engine *e)
{
    tio_engine_gpu *g = e->gpu;
    uint64_t bytes = g->opt.probe_bytes;
    for (uint32_t i = 0; i < e->n_dirs; i++)
        if (e->dirs[i].file_bytes < bytes)
            bytes = e->dirs[i].file_bytes & ~(uint64_t)(TIO_EXTENT_ALIGN - 1);
    void *src = NULL, *dst = NULL;
    unsigned char *host = malloc(2 * bytes);
    tio_cuda_err err;
    int rc = 0;
    if (!host)
        return tio_fail(-ENOMEM, "gpu: out of memory for the probe");
    if ((err = g->rt->Malloc(&src, bytes)) != TIO_CUDA_SUCCESS ||
        (err = g->rt->Malloc(&dst, bytes)) != TIO_CUDA_SUCCESS) {
        rc = tio_gpu_fail(g, -ENOMEM, "cudaMalloc of the probe buffers", err);
        goto out;
    }
    for (uint64_t k = 0; k < bytes; k++)
        host[k] = (unsigned char)(k * 131u + (k >> 12) * 7u + 1u);
    if ((err = g->rt->Memcpy(src, host, bytes, TIO_CUDA_MEMCPY_H2D)) != TIO_CUDA_SUCCESS) {
        rc = tio_gpu_fail(g, -EIO, "cudaMemcpy of the probe", err);
        goto out;
    }
    for (uint32_t i = 0; i < e->n_dirs && !rc; i++) {
        const char *why;
        if (!tio_gds_dir_usable(g->gds, i, &why)) {
            append_reason(g, "dir %u: staging (cufile: %s)", i, why);
            continue;
        }
        int64_t ts = probe_path(e, i, TIO_CHUNK_STAGED, src, dst, host, bytes);
        int64_t tc = ts < 0 ? 0 : probe_path(e, i, TIO_CHUNK_CUFILE, src, dst, host, bytes);
        if (ts < 0 || tc < 0) {
            rc = (int)(ts < 0 ? ts : tc);
            break;
        }
        bool cufile = tc < ts || g->test.probe_prefer_cufile;
        char a[32];
        append_reason(g, "dir %u: %s (cufile%s %.2f GB/s, staging %.2f GB/s, write + read of %s)",
                      i, cufile ? "cufile" : "staging",
                      tio_gds_compat_mode(g->gds) ? " in compatibility mode" : "",
                      2.0 * bytes / (double)(tc ? tc : 1), 2.0 * bytes / (double)(ts ? ts : 1),
                      tio_format_bytes(bytes, a));
        g->dir_path[i] = cufile ? TIO_GPU_PATH_CUFILE : TIO_GPU_PATH_STAGING;
    }
out:
    if (src)
        g->rt->Free(src);
    if (dst)
        g->rt->Free(dst);
    free(host);
    return rc;
}

static void free_gpu(tio_engine *e)
{
    tio_engine_gpu *g = e->gpu;
    if (!g)
        return;
    if (g->staging)
        tio_staging_stop(e, g->staging);
    if (g->gds)
        tio_gds_stop(e, g->gds);
    for (uint32_t i = 0; i < g->n_ev_all; i++)
        g->rt->EventDestroy(g->ev_all[i]);
    free(g->ev_all);
    free(g->ev_free);
    free(g->dir_path);
    pthread_mutex_destroy(&g->ev_mu);
    free(g);
    e->gpu = NULL;
    e->device = NULL;
}

/* What the engine calls for device memory (engine_internal.h). */
static const tio_engine_device_route gpu_route = {
    .is_device = is_device,
    .prepare = prepare_request,
    .enqueue = enqueue_request,
    .request_done = request_done,
    .chunk_done = tio_staging_chunk_done,
    .detach = free_gpu,
};

int tio_engine_gpu_attach(tio_engine *e, const tio_engine_gpu_options *opt)
{
    return tio_engine_gpu_attach_test(e, opt, NULL);
}

/* Start cuFile and decide each directory's path (options' path). */
static int choose_paths(tio_engine *e)
{
    tio_engine_gpu *g = e->gpu;
    for (uint32_t i = 0; i < e->n_dirs; i++)
        g->dir_path[i] = TIO_GPU_PATH_STAGING;
    if (g->opt.path == TIO_GPU_PATH_STAGING) {
        append_reason(g, "staging for every directory (requested)");
        return 0;
    }
    char why[400] = "";
    int rc = tio_gds_start(e, &g->gds, why, sizeof why);
    if (rc) {
        if (g->opt.path == TIO_GPU_PATH_CUFILE)
            return tio_fail(-EPROTONOSUPPORT, "gpu: cufile path refused: %s", why);
        append_reason(g, "staging for every directory (cufile: %s)", why);
        return 0;
    }
    append_reason(g, "%s", tio_gds_describe(g->gds));
    if (g->opt.path == TIO_GPU_PATH_CUFILE) {
        for (uint32_t i = 0; i < e->n_dirs; i++) {
            const char *dir_why;
            if (!tio_gds_dir_usable(g->gds, i, &dir_why))
                return tio_fail(-EPROTONOSUPPORT, "gpu: cufile path refused for '%s': %s",
                                e->dirs[i].path, dir_why);
            g->dir_path[i] = TIO_GPU_PATH_CUFILE;
        }
        append_reason(g, "cufile for every directory (requested)");
        return 0;
    }
    if (e->map.n_used)
        return tio_fail(-EINVAL, "gpu: attach with path auto before the engine holds data (the "
                        "probe writes at the start of each backing file)");
    return probe_dirs(e);
}

int tio_engine_gpu_attach_test(tio_engine *e, const tio_engine_gpu_options *in,
                               const tio_engine_gpu_test_options *test)
{
    if (e->gpu)
        return tio_fail(-EINVAL, "gpu: a GPU is attached to this engine already");
    tio_cuda_info info;
    const tio_cudart *rt = tio_cudart_load(&info);
    if (info.state == TIO_GPU_NOT_BUILT)
        return tio_fail(-EOPNOTSUPP, "gpu: %s", info.reason);
    if (!rt)
        return tio_fail(-ENODEV, "gpu: CUDA unavailable: %s", info.reason);
    tio_engine_gpu_options opt;
    int rc = check_gpu_options(e, in, &opt);
    if (rc)
        return rc;
    int current = 0;
    tio_cuda_err err = rt->GetDevice(&current);
    if (err != TIO_CUDA_SUCCESS) {
        char msg[256];
        return tio_fail(-ENODEV, "gpu: %s", tio_cuda_msg(rt, "cudaGetDevice", err, msg,
                                                         sizeof msg));
    }
    int devices = 0;
    if (rt->GetDeviceCount(&devices) != TIO_CUDA_SUCCESS)
        devices = 0;
    if (opt.device < 0)
        opt.device = current;
    if (opt.device >= devices || opt.device != current)
        return tio_fail(-ENODEV, "gpu: device %d is not the calling thread's current device "
                        "(%d of %d): make it current first (torch.cuda.set_device)",
                        opt.device, current, devices);
    tio_engine_gpu *g = calloc(1, sizeof *g);
    if (!g || !(g->dir_path = calloc(e->n_dirs, 1))) {
        free(g);
        return tio_fail(-ENOMEM, "gpu: out of memory");
    }
    g->rt = rt;
    g->device = opt.device;
    g->opt = opt;
    if (test)
        g->test = *test;
    pthread_mutex_init(&g->ev_mu, NULL);
    e->gpu = g;
    e->device = &gpu_route; /* the probe (choose_paths) moves device memory */
    char ring[200] = "";
    if ((rc = tio_staging_start(e, &g->staging)) != 0 || (rc = choose_paths(e)) != 0) {
        free_gpu(e);
        return rc;
    }
    tio_staging_describe(g->staging, NULL, ring, sizeof ring);
    char rest[sizeof g->reason];
    snprintf(rest, sizeof rest, "%s", g->reason);
    snprintf(g->reason, sizeof g->reason, "%s", ring);
    if (rest[0])
        append_reason(g, "%s", rest);
    tio_log(TIO_LOG_INFO, "gpu: device %d attached: %s", g->device, g->reason);
    return 0;
}

/* ---- queries ------------------------------------------------------------ */

int tio_engine_gpu_set_stream(tio_engine *e, void *stream)
{
    if (!e->gpu)
        return tio_fail(-EINVAL, "gpu: no GPU attached to this engine");
    e->gpu->stream = stream;
    return 0;
}

tio_gpu_path tio_engine_gpu_dir_path(const tio_engine *e, uint32_t dir)
{
    if (!e->gpu || dir >= e->n_dirs)
        return TIO_GPU_PATH_AUTO;
    return (tio_gpu_path)e->gpu->dir_path[dir];
}

const char *tio_engine_gpu_reason(const tio_engine *e) { return e->gpu ? e->gpu->reason : ""; }

void tio_engine_gpu_get_stats(const tio_engine *e, tio_engine_gpu_stats *out)
{
    memset(out, 0, sizeof *out);
    tio_engine_gpu *g = e->gpu;
    if (!g)
        return;
    tio_staging_describe(g->staging, out, NULL, 0);
    out->staged_offload_bytes = atomic_load(&g->staged_bytes[TIO_OP_WRITE]);
    out->staged_prefetch_bytes = atomic_load(&g->staged_bytes[TIO_OP_READ]);
    out->cufile_write_bytes = atomic_load(&g->cufile_bytes[TIO_OP_WRITE]);
    out->cufile_read_bytes = atomic_load(&g->cufile_bytes[TIO_OP_READ]);
    out->unchecked_bytes = out->cufile_write_bytes + out->cufile_read_bytes;
    out->copies = atomic_load(&g->copies);
    out->batches = atomic_load(&g->batches);
    out->max_batch_entries_used = atomic_load(&g->max_batch);
    out->cufile_compat_mode = g->gds && tio_gds_compat_mode(g->gds);
}

int tio_engine_gpu_register_buffer(tio_engine *e, void *dev, uint64_t bytes)
{
    if (!e->gpu || !dev || bytes == 0)
        return tio_fail(-EINVAL, "gpu: register_buffer needs an attached GPU, an address and "
                        "bytes > 0");
    if (!e->gpu->gds)
        return 0;
    const tio_cufile_api *api = tio_gds_api(e->gpu->gds);
    tio_cufile_error ce = api->BufRegister(dev, bytes, 0);
    if (ce.err != TIO_CU_FILE_SUCCESS) {
        char msg[200];
        return tio_fail(tio_cufile_errno(ce), "gpu: %s",
                        tio_cufile_msg("cuFileBufRegister", ce, msg, sizeof msg));
    }
    return 0;
}

int tio_engine_gpu_unregister_buffer(tio_engine *e, void *dev)
{
    if (!e->gpu)
        return tio_fail(-EINVAL, "gpu: no GPU attached to this engine");
    if (!e->gpu->gds)
        return 0;
    const tio_cufile_api *api = tio_gds_api(e->gpu->gds);
    tio_cufile_error ce = api->BufDeregister(dev);
    if (ce.err != TIO_CU_FILE_SUCCESS) {
        char msg[200];
        return tio_fail(tio_cufile_errno(ce), "gpu: %s",
                        tio_cufile_msg("cuFileBufDeregister", ce, msg, sizeof msg));
    }
    return 0;
}

int tio_engine_copy(tio_engine *e, void *dst, const void *src, uint64_t bytes)
{
    tio_engine_gpu *g = e ? e->gpu : NULL;
    if (!bytes)
        return 0;
    if (!g || (!tio_cuda_is_device(g->rt, dst) && !tio_cuda_is_device(g->rt, src))) {
        memcpy(dst, src, bytes);
        return 0;
    }
    tio_cuda_err err = g->rt->MemcpyAsync(dst, src, bytes, TIO_CUDA_MEMCPY_DEFAULT, g->stream);
    if (err == TIO_CUDA_SUCCESS)
        err = g->rt->StreamSynchronize(g->stream);
    return err == TIO_CUDA_SUCCESS ? 0 : tio_gpu_fail(g, -EIO, "cudaMemcpyAsync", err);
}
