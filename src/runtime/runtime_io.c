/*
 * runtime/runtime_io.c — moving one tensor's bytes for the runtime's state
 * machine (runtime.c): the adapter's allocate and release callbacks, the
 * copies to and from the host tier, and the engine's requests — submitted,
 * reaped, applied to their tensor, waited for.  A tensor has at most one
 * request in flight; its tag is the tensor id.
 *
 * Staging (optional callbacks): when the tensor's memory is not addressable
 * by the engine, every transfer goes through a host buffer the adapter
 * provides: stage_out before a write (the adapter copies the bytes out),
 * stage_in before a read, and unstage when the request is over (after a
 * successful read the adapter copies the buffer in).  `io_addr` (rt_tensor) is
 * the address the engine sees: the staging buffer, or the tensor itself.
 *
 * Errors: a failed write leaves the tensor resident and intact, a failed
 * read leaves it offloaded (the memory allocated for it is released).  The
 * error is returned by the call that waited for the request, or, when the
 * completion was reaped in passing, by the next call that processes a
 * migration of that tensor (normally its deadline), with a message naming
 * the tensor.  The engine's completion queue is the runtime's while it
 * exists: completions with tags it does not know are logged and dropped.
 */
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "runtime/runtime_internal.h"
#include "teraio/gpu.h"

#define REAP_BATCH 64

static void set_pending_error(rt_tensor *t, int code, const char *msg)
{
    free(t->err_msg);
    t->err = code;
    t->err_msg = strdup(msg);
}

void rt_clear_pending_error(rt_tensor *t)
{
    free(t->err_msg);
    t->err_msg = NULL;
    t->err = 0;
}

/* Report (and forget) the error a completion left on tensor `id`. */
int rt_take_error(tio_runtime *rt, uint32_t id)
{
    rt_tensor *t = &rt->tensors[id];
    if (t->err == 0)
        return 0;
    int code = t->err;
    if (t->err_msg)
        tio_fail(code, "%s", t->err_msg);
    else
        tio_fail(code, "tensor %u: I/O failed: %s", id, tio_strerror(code));
    rt_clear_pending_error(t);
    return code;
}

/* Give tensor `id`'s memory back to the framework: it is now OFFLOADED. */
int rt_release_tensor(tio_runtime *rt, uint32_t id)
{
    rt_tensor *t = &rt->tensors[id];
    int rc = rt->cb.release(rt->cb.ctx, id);
    if (rc < 0)
        return tio_fail(rc, "tensor %u: release callback failed: %s", id, tio_strerror(rc));
    rt->stats.resident_bytes -= t->bytes;
    t->addr = NULL;
    t->state = TENSOR_OFFLOADED;
    return 0;
}

/* Get memory for offloaded tensor `id` from the framework. */
static int allocate_tensor(tio_runtime *rt, uint32_t id)
{
    rt_tensor *t = &rt->tensors[id];
    void *addr = NULL;
    int rc = rt->cb.allocate(rt->cb.ctx, id, t->bytes, &addr);
    if (rc < 0)
        return tio_fail(rc, "tensor %u: allocate callback failed for %llu bytes: %s", id,
                        (unsigned long long)t->bytes, tio_strerror(rc));
    if (!addr)
        return tio_fail(-ENOMEM, "tensor %u: allocate callback returned no address", id);
    t->addr = addr;
    rt_resident_add(rt, t->bytes);
    return 0;
}

/* A read failed or could not be submitted: the memory allocated for it
 * holds nothing useful, so give it back and stay OFFLOADED. */
static void abandon_read(tio_runtime *rt, uint32_t id)
{
    rt_tensor *t = &rt->tensors[id];
    int rc = rt->cb.release(rt->cb.ctx, id);
    if (rc < 0)
        tio_log(TIO_LOG_ERROR, "runtime: tensor %u: release after a failed read failed: %s", id,
                tio_strerror(rc));
    rt->stats.resident_bytes -= t->bytes;
    t->addr = NULL;
    t->state = TENSOR_OFFLOADED;
}

static bool staged(const tio_runtime *rt) { return rt->cb.stage_out != NULL; }

/* The address the engine should write tensor `id`'s bytes from: its own
 * memory, or a staging buffer holding a copy of it. */
int rt_stage_out(tio_runtime *rt, uint32_t id, void **addr)
{
    rt_tensor *t = &rt->tensors[id];
    if (!staged(rt)) {
        *addr = t->addr;
        return 0;
    }
    int rc = rt->cb.stage_out(rt->cb.ctx, id, t->bytes, addr);
    if (rc < 0 || !*addr)
        return tio_fail(rc < 0 ? rc : -ENOMEM, "tensor %u: stage_out callback failed: %s", id,
                        tio_strerror(rc < 0 ? rc : -ENOMEM));
    t->io_addr = *addr;
    return 0;
}

/* The address the engine should read tensor `id`'s bytes into. */
static int stage_in(tio_runtime *rt, uint32_t id, void **addr)
{
    rt_tensor *t = &rt->tensors[id];
    if (!staged(rt)) {
        *addr = t->addr;
        return 0;
    }
    int rc = rt->cb.stage_in(rt->cb.ctx, id, t->bytes, addr);
    if (rc < 0 || !*addr)
        return tio_fail(rc < 0 ? rc : -ENOMEM, "tensor %u: stage_in callback failed: %s", id,
                        tio_strerror(rc < 0 ? rc : -ENOMEM));
    t->io_addr = *addr;
    return 0;
}

/* The transfer through tensor `id`'s staging buffer is over; copy it into
 * the tensor first if `copy_in`.  No-op without staging. */
int rt_unstage(tio_runtime *rt, uint32_t id, bool copy_in)
{
    rt_tensor *t = &rt->tensors[id];
    if (!t->io_addr)
        return 0;
    t->io_addr = NULL;
    int rc = rt->cb.unstage(rt->cb.ctx, id, copy_in);
    if (rc < 0)
        return tio_fail(rc, "tensor %u: unstage callback failed: %s", id, tio_strerror(rc));
    return 0;
}

/* Copy tensor `id`'s bytes between its memory and its host copy: through
 * the engine, which moves device memory when a GPU is attached to it
 * (tio_engine_copy), else memcpy. */
int rt_copy_host_tier(tio_runtime *rt, uint32_t id, void *dst, const void *src)
{
    uint64_t n = rt->tensors[id].bytes;
    if (!rt->engine) {
        memcpy(dst, src, n);
        return 0;
    }
    int rc = tio_engine_copy(rt->engine, dst, src, n);
    if (rc < 0) {
        char why[256];
        snprintf(why, sizeof why, "%s", tio_last_error());
        return tio_fail(rc, "tensor %u: host-tier copy of %llu bytes failed: %s", id,
                        (unsigned long long)n, why);
    }
    return 0;
}

/* A read of `bytes` of `kind` completed. */
static void count_read(tio_runtime *rt, io_kind kind, uint64_t bytes)
{
    if (kind == IO_READ) {
        rt->stats.bytes_prefetched += bytes;
        rt->stats.n_prefetches++;
    } else if (kind == IO_READ_OUTSIDE) {
        rt->stats.bytes_fetched_outside += bytes;
    } else {
        rt->stats.bytes_fetched_urgent += bytes;
    }
}

/* Apply one engine completion to its tensor. */
static void complete(tio_runtime *rt, const tio_completion *c)
{
    if (c->tag >= rt->trace->n_tensors || rt->tensors[c->tag].io == IO_NONE) {
        tio_log(TIO_LOG_WARN, "runtime: dropped an engine completion with unknown tag %llu",
                (unsigned long long)c->tag);
        return;
    }
    uint32_t id = (uint32_t)c->tag;
    rt_tensor *t = &rt->tensors[id];
    io_kind kind = t->io;
    t->io = IO_NONE;
    if (c->result < 0) {
        const char *why = tio_engine_completion_error(rt->engine, c->tag);
        char msg[1024];
        snprintf(msg, sizeof msg, "tensor %u: SSD %s of %llu bytes failed: %s", id,
                 kind == IO_WRITE ? "write" : "read", (unsigned long long)t->bytes,
                 why[0] ? why : tio_strerror(c->result));
        set_pending_error(t, c->result, msg);
        rt_unstage(rt, id, false);
        if (kind == IO_WRITE) {
            if (t->state == TENSOR_OFFLOADING)
                t->state = TENSOR_RESIDENT;
        } else {
            abandon_read(rt, id);
        }
        return;
    }
    int rc = rt_unstage(rt, id, kind != IO_WRITE);
    if (rc < 0) {
        set_pending_error(t, rc, tio_last_error());
        if (kind != IO_WRITE) {
            abandon_read(rt, id);
            return;
        }
    }
    switch (kind) {
    case IO_WRITE:
        rt->stats.bytes_offloaded += t->bytes;
        rt->stats.bytes_offloaded_ssd += t->bytes;
        rt->stats.n_offloads++;
        break;
    case IO_READ:
    case IO_READ_DEMAND:
    case IO_READ_OUTSIDE:
        count_read(rt, kind, t->bytes);
        t->state = TENSOR_RESIDENT;
        break;
    case IO_NONE:
        break;
    }
}

/* One tio_engine_reap call; every completion is applied.  Returns the
 * number reaped or the engine's error. */
int rt_reap(tio_runtime *rt, uint32_t min_complete)
{
    if (!rt->engine || (min_complete == 0 && tio_engine_in_flight(rt->engine) == 0))
        return 0;
    tio_completion done[REAP_BATCH];
    int n = tio_engine_reap(rt->engine, done, REAP_BATCH, min_complete);
    if (n < 0)
        return n;
    for (int i = 0; i < n; i++)
        complete(rt, &done[i]);
    return n;
}

/* Wait until tensor `id` has no request in flight, adding the time spent to
 * *wait_ns (may be NULL).  The request's own error is left on the tensor
 * for rt_take_error; only an engine failure is returned here. */
int rt_wait_io(tio_runtime *rt, uint32_t id, uint64_t *wait_ns)
{
    rt_tensor *t = &rt->tensors[id];
    if (t->io == IO_NONE)
        return 0;
    uint64_t t0 = tio_now_ns();
    int rc = 0;
    while (t->io != IO_NONE) {
        if (tio_engine_in_flight(rt->engine) == 0) {
            t->io = IO_NONE;
            rc = tio_fail(-EIO, "tensor %u: the engine lost its request", id);
            break;
        }
        rc = rt_reap(rt, 1);
        if (rc < 0) {
            rc = tio_fail(rc, "tensor %u: waiting for the engine: %s", id, tio_last_error());
            break;
        }
        rc = 0;
    }
    if (wait_ns)
        *wait_ns += tio_now_ns() - t0;
    return rc;
}

/* Wait for tensor `id`'s request and return its result. */
int rt_wait_result(tio_runtime *rt, uint32_t id, uint64_t *wait_ns)
{
    int rc = rt_wait_io(rt, id, wait_ns);
    if (rc < 0)
        return rc;
    return rt_take_error(rt, id);
}

/* An engine call for tensor `id` failed; the engine's message (if it left
 * one: callers clear the last error before the call) is kept. */
int rt_submit_failed(int rc, uint32_t id, const char *what)
{
    char msg[512];
    snprintf(msg, sizeof msg, "%s", tio_last_error());
    return tio_fail(rc, "tensor %u: %s: %s", id, what, msg[0] ? msg : tio_strerror(rc));
}

/* Start bringing offloaded tensor `id` back: allocate, then copy from the
 * host tier (done at once) or submit the SSD read as `kind`. */
int rt_start_fetch(tio_runtime *rt, uint32_t id, io_kind kind, bool urgent)
{
    rt_tensor *t = &rt->tensors[id];
    int rc = allocate_tensor(rt, id);
    if (rc < 0)
        return rc;
    if (t->stored == TIO_TIER_HOST) {
        void *dst;
        if ((rc = stage_in(rt, id, &dst)) < 0) {
            abandon_read(rt, id);
            return rc;
        }
        if ((rc = rt_copy_host_tier(rt, id, dst, t->host_copy)) < 0) {
            rt_unstage(rt, id, false);
            abandon_read(rt, id);
            return rc;
        }
        if ((rc = rt_unstage(rt, id, true)) < 0) {
            abandon_read(rt, id);
            return rc;
        }
        t->state = TENSOR_RESIDENT;
        count_read(rt, kind, t->bytes);
        return 0;
    }
    void *dst;
    if ((rc = stage_in(rt, id, &dst)) < 0) {
        abandon_read(rt, id);
        return rc;
    }
    tio_clear_error();
    rc = tio_engine_submit_read(rt->engine, &t->extent, dst, t->bytes, id, urgent);
    if (rc < 0) {
        rc = rt_submit_failed(rc, id, "submitting the SSD read");
        rt_unstage(rt, id, false);
        abandon_read(rt, id);
        return rc;
    }
    t->io = kind;
    t->state = TENSOR_PREFETCHING;
    return 0;
}
