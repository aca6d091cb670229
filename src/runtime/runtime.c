/*
 * runtime/runtime.c — executes a plan while training runs (runtime.h).
 *
 * Two tables, both built once at create:
 *
 *   The tensor table, indexed by trace id.  Each entry holds the tensor's
 *   address and size (from bind or from the allocate callback), its state,
 *   where its stored copy lives (an engine extent, allocated at the first SSD
 *   offload and reused until unbind/destroy, and/or a malloc'ed host copy,
 *   likewise kept), the request the engine is running for it (at most one;
 *   its tag is the tensor id), and an error from a completion that arrived
 *   while nobody was waiting for it.
 *
 *   The plan indexed by kernel: four bucket lists (CSR arrays of migration
 *   indices) — offloads whose deadline is k, prefetches whose deadline is k,
 *   offloads triggered at k, prefetches triggered at k — so kernel_begin(k)
 *   costs O(migrations at k) plus the completions it reaps, never a scan of
 *   the tensor table.
 *
 * States of a bound tensor and what moves it:
 *
 *   RESIDENT --offload trigger--> OFFLOADING --deadline: write done,
 *                                     |          release callback--> OFFLOADED
 *                                     | ensure_resident (tensor used: the
 *                                     v   release is cancelled) / write failed
 *                                  RESIDENT
 *   OFFLOADED --prefetch trigger: allocate, read--> PREFETCHING
 *   PREFETCHING --read done--> RESIDENT;  --read failed: release--> OFFLOADED
 *   OFFLOADED --ensure_resident: allocate, urgent read, wait--> RESIDENT
 *
 * A migration whose tensor is not in the state it expects (unbound, never
 * offloaded because this is the first iteration after profiling, refused for
 * lack of space, cancelled by a use) is skipped; the state machine, not the
 * plan, decides what is safe.  A tensor used during its offload must be
 * passed to ensure_resident: that cancels the release, because the write
 * may have copied bytes the kernel is about to change.  The extent keeps
 * whatever the cancelled write stored; it is overwritten by the next offload.
 *
 * Memory accounting: resident_bytes counts every bound tensor whose memory
 * is held (RESIDENT, OFFLOADING, PREFETCHING) plus the adapter's untracked
 * bytes (added by account_untracked, or set at kernel_begin from the
 * program's bytes that account_program gave, less every bound tensor's
 * full size).  A kernel's window opens at the end of its kernel_begin (releases
 * precede allocations there, so that is the largest value inside the call)
 * and closes at the next kernel_begin or iteration_end; every growth inside
 * an open window is checked against the peak and the capacity.
 *
 * Placement at iteration_begin: a tensor's `at0` is where it is at
 * kernel 0 in the plan's steady state (resident, its offload's write in
 * flight, or away), computed once at create from the tensor's migrations.
 * Each iteration_begin compares it with the tensor's state and moves what
 * differs, so the first iteration, an iteration after a diverged one and an
 * iteration after uses between iterations all start where the plan starts.
 *
 * Held past the free (tio_runtime_held_past_free): each intermediate
 * tensor's end in the trace (the kernel before which the profiled iteration
 * freed it: its free_kernel, or the kernel after its last access) indexes a
 * per-kernel list, built at create.  A call for kernel k walks the lists of
 * the ends it has not seen yet in this iteration and lists the tensors
 * among them that are bound; tensor_bind lists a tensor bound after its end
 * was walked; the call drops what was unbound since and counts the listed
 * tensors that hold memory: O(new ends + tensors listed) per call.
 *
 * Staging (optional callbacks): when the tensor's memory is not addressable
 * by the engine, every transfer goes through a host buffer the adapter
 * provides: stage_out before a write (the adapter copies the bytes out),
 * stage_in before a read, and unstage when the request is over (after a
 * successful read the adapter copies the buffer in).  `io_addr` below is
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
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "teraio/gpu.h"
#include "teraio/runtime.h"

typedef enum {
    TENSOR_RESIDENT = 0,
    TENSOR_OFFLOADING,  /* stored copy being written / written; memory held */
    TENSOR_OFFLOADED,   /* memory released; bytes only in the stored copy */
    TENSOR_PREFETCHING, /* memory allocated; read in flight */
} tensor_state;

typedef enum {
    IO_NONE = 0,
    IO_WRITE,       /* planned offload to SSD */
    IO_READ,        /* planned prefetch from SSD */
    IO_READ_DEMAND, /* fetch on demand in an iteration, fetch_all, iteration_begin/end */
    IO_READ_OUTSIDE,/* fetch on demand between iterations */
} io_kind;

/* Where a tensor is at kernel 0 in the plan's steady state. */
typedef enum { AT0_RESIDENT = 0, AT0_WRITING, AT0_AWAY } initial_place;

typedef struct {
    void *addr;        /* valid unless OFFLOADED */
    uint64_t bytes;
    tensor_state state;
    tio_tier stored;   /* tier holding the copy while OFFLOADING/OFFLOADED/PREFETCHING */
    bool bound;
    bool has_extent;
    io_kind io;        /* engine request in flight, tag = tensor id */
    int err;           /* error of a completion reaped in passing, 0 if none */
    char *err_msg;     /* its message (malloc'ed), may be NULL */
    tio_extent extent;
    void *host_copy;   /* [bytes] once the tensor was offloaded to the host tier */
    void *io_addr;     /* staging buffer of the request in flight, or NULL */
    initial_place at0; /* steady-state place at kernel 0 */
    uint32_t end;      /* the kernel before which the trace frees it; n_kernels: never */
    bool listed;       /* in the runtime's `held` list */
    uint32_t at0_offload; /* the offload migration that puts it there (unless RESIDENT) */
} rt_tensor;

enum { B_OFFLOAD_DEADLINE, B_PREFETCH_DEADLINE, B_OFFLOAD_TRIGGER, B_PREFETCH_TRIGGER, B_COUNT };

struct tio_runtime {
    const tio_plan *plan;
    const tio_trace *trace;
    tio_engine *engine;
    tio_runtime_callbacks cb;
    rt_tensor *tensors;            /* [trace->n_tensors] */
    uint32_t *bucket_start[B_COUNT]; /* [n_kernels + 1] offsets into bucket_mig */
    uint32_t *bucket_mig[B_COUNT];   /* migration indices, grouped by kernel */
    tio_runtime_stats stats;
    pthread_t owner;               /* the only thread that may drive the runtime */
    bool in_iteration;             /* between iteration_begin and iteration_end */
    bool iter_diverged;            /* this iteration left the trace: no planned migrations */
    bool window_open;              /* a kernel's window is open (see the file comment) */
    bool window_over;              /* ... and has been counted over the capacity */
    bool over_logged;              /* the first kernel over the capacity was logged */
    uint32_t window_kernel;        /* the kernel whose window is open */
    uint32_t next_kernel;          /* one past the last kernel_begin index of the iteration */
    uint64_t untracked_bytes;      /* tio_runtime_account_untracked total */
    uint64_t bound_bytes;          /* full size of every bound tensor, whatever its state */
    uint64_t program_bytes;        /* tio_runtime_account_program's value, for the next kernel */
    bool program_pending;          /* ... not yet applied */
    uint32_t *end_start;           /* [n_kernels + 1] offsets into end_ids, by end kernel */
    uint32_t *end_ids;             /* intermediate tensors grouped by their end in the trace */
    uint32_t *held;                /* [n_tensors] bound tensors past their end (`listed`) */
    uint32_t n_held;
    uint32_t ends_seen;            /* end kernels [0, ends_seen) were walked this iteration */
};

#define REAP_BATCH 64

/* The first divergence and the first kernel over the capacity in the
 * process are logged as warnings, later ones at info level: a training job
 * that switches plans makes a runtime per plan, and says each thing once. */
static atomic_bool warned_divergence, warned_over_capacity;

static int first_warning(atomic_bool *warned)
{
    return atomic_exchange(warned, true) ? TIO_LOG_INFO : TIO_LOG_WARN;
}

static uint32_t refresh_held(tio_runtime *rt, uint32_t k, uint32_t *ids, uint32_t cap);

/* Why a kernel may hold more than the plan said, as far as the runtime
 * can tell; `buf` may receive the text. */
static const char *over_capacity_reason(tio_runtime *rt, char *buf, size_t size)
{
    if (rt->iter_diverged)
        return "the iteration left the profiled sequence";
    if (rt->stats.offloads_refused)
        return "offloads were refused for lack of SSD or host space";
    if (!rt->plan->fits)
        return "the plan itself does not fit the capacity";
    uint32_t id, n = refresh_held(rt, rt->window_kernel, &id, 1);
    if (n) {
        char b[32];
        snprintf(buf, size, "%u tensor%s held past the kernel the trace frees %s at, "
                 "such as tensor %u (%s)", n, n == 1 ? "" : "s", n == 1 ? "it" : "them", id,
                 tio_format_bytes(rt->tensors[id].bytes, b));
        return buf;
    }
    return "memory the trace did not show";
}

/* Check the resident bytes against the peak and the capacity, if a
 * kernel's window is open. */
static void note_resident(tio_runtime *rt)
{
    if (!rt->window_open)
        return;
    uint64_t r = rt->stats.resident_bytes, cap = rt->stats.capacity_bytes;
    if (r > rt->stats.peak_resident_bytes)
        rt->stats.peak_resident_bytes = r;
    if (r <= cap)
        return;
    if (r - cap > rt->stats.over_capacity_bytes_max)
        rt->stats.over_capacity_bytes_max = r - cap;
    if (rt->window_over)
        return;
    rt->window_over = true;
    rt->stats.over_capacity_kernels++;
    if (rt->over_logged)
        return;
    rt->over_logged = true;
    char rb[32], cb[32], why[160];
    uint32_t k = rt->window_kernel;
    tio_log(first_warning(&warned_over_capacity),
            "runtime: kernel %u ('%s') holds %s resident, over the capacity of %s (%s); "
            "stats over_capacity_kernels and over_capacity_bytes_max count every such kernel",
            k, k < rt->trace->n_kernels ? rt->trace->kernels[k].name : "past the trace",
            tio_format_bytes(r, rb), tio_format_bytes(cap, cb),
            over_capacity_reason(rt, why, sizeof why));
}

static void resident_add(tio_runtime *rt, uint64_t bytes)
{
    rt->stats.resident_bytes += bytes;
    note_resident(rt);
}

/* Calls from a thread other than the creator's are refused. */
static int check_thread(const tio_runtime *rt, const char *fn)
{
    if (pthread_equal(rt->owner, pthread_self()))
        return 0;
    return tio_fail(-EPERM,
                    "%s: called from another thread; a runtime is driven only from the thread "
                    "that created it", fn);
}

/* Keep the first error of a sequence of steps that must all run. */
static void keep_first(int *first, int rc)
{
    if (rc < 0 && *first == 0)
        *first = rc;
}

static void set_pending_error(rt_tensor *t, int code, const char *msg)
{
    free(t->err_msg);
    t->err = code;
    t->err_msg = strdup(msg);
}

static void clear_pending_error(rt_tensor *t)
{
    free(t->err_msg);
    t->err_msg = NULL;
    t->err = 0;
}

/* Report (and forget) the error a completion left on tensor `id`. */
static int take_error(tio_runtime *rt, uint32_t id)
{
    rt_tensor *t = &rt->tensors[id];
    if (t->err == 0)
        return 0;
    int code = t->err;
    if (t->err_msg)
        tio_fail(code, "%s", t->err_msg);
    else
        tio_fail(code, "tensor %u: I/O failed: %s", id, tio_strerror(code));
    clear_pending_error(t);
    return code;
}

/* Give tensor `id`'s memory back to the framework: it is now OFFLOADED. */
static int release_tensor(tio_runtime *rt, uint32_t id)
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
    resident_add(rt, t->bytes);
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
static int stage_out(tio_runtime *rt, uint32_t id, void **addr)
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
static int unstage(tio_runtime *rt, uint32_t id, bool copy_in)
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
static int copy_host_tier(tio_runtime *rt, uint32_t id, void *dst, const void *src)
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
        unstage(rt, id, false);
        if (kind == IO_WRITE) {
            if (t->state == TENSOR_OFFLOADING)
                t->state = TENSOR_RESIDENT;
        } else {
            abandon_read(rt, id);
        }
        return;
    }
    int rc = unstage(rt, id, kind != IO_WRITE);
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
static int reap(tio_runtime *rt, uint32_t min_complete)
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
 * for take_error; only an engine failure is returned here. */
static int wait_io(tio_runtime *rt, uint32_t id, uint64_t *wait_ns)
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
        rc = reap(rt, 1);
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
static int wait_result(tio_runtime *rt, uint32_t id, uint64_t *wait_ns)
{
    int rc = wait_io(rt, id, wait_ns);
    if (rc < 0)
        return rc;
    return take_error(rt, id);
}

/* An engine call for tensor `id` failed; the engine's message (if it left
 * one: callers clear the last error before the call) is kept. */
static int submit_failed(int rc, uint32_t id, const char *what)
{
    char msg[512];
    snprintf(msg, sizeof msg, "%s", tio_last_error());
    return tio_fail(rc, "tensor %u: %s: %s", id, what, msg[0] ? msg : tio_strerror(rc));
}

/* Step 1: offload deadline — wait for the write, then release. */
static int offload_deadline(tio_runtime *rt, const tio_migration *m)
{
    rt_tensor *t = &rt->tensors[m->tensor];
    if (!t->bound)
        return 0;
    int rc = wait_result(rt, m->tensor, &rt->stats.wait_ns);
    if (rc < 0 || t->state != TENSOR_OFFLOADING)
        return rc;
    return release_tensor(rt, m->tensor);
}

/* Step 2: prefetch deadline — wait for the read. */
static int prefetch_deadline(tio_runtime *rt, const tio_migration *m)
{
    rt_tensor *t = &rt->tensors[m->tensor];
    if (!t->bound)
        return 0;
    return wait_result(rt, m->tensor, &rt->stats.wait_ns);
}

/* An offload found no space: the tensor stays resident, counted, and the
 * first refusal is logged as a warning (the rest at debug level). */
static void refuse_offload(tio_runtime *rt, uint32_t id, const char *tier, const char *why)
{
    rt->stats.offloads_refused++;
    tio_log(rt->stats.offloads_refused == 1 ? TIO_LOG_WARN : TIO_LOG_DEBUG,
            "runtime: offload of tensor %u (%llu bytes) to %s refused: %s; it stays resident "
            "(%llu refused so far, counted in offloads_refused)", id,
            (unsigned long long)rt->tensors[id].bytes, tier, why,
            (unsigned long long)rt->stats.offloads_refused);
}

/* Step 3: offload trigger — start writing a resident tensor's bytes to its
 * tier.  No space: the tensor stays resident (offloads_refused). */
static int offload_trigger(tio_runtime *rt, const tio_migration *m)
{
    uint32_t id = m->tensor;
    rt_tensor *t = &rt->tensors[id];
    /* A read started by iteration_begin may still be running: finish it so
     * the tensor leaves as planned.  A cancelled offload's write may still be
     * running too; one request per tensor at a time, and its error is
     * reported now. */
    if (!t->bound || (t->state != TENSOR_RESIDENT && t->state != TENSOR_PREFETCHING))
        return 0;
    int rc = wait_result(rt, id, &rt->stats.wait_ns);
    if (rc < 0 || t->state != TENSOR_RESIDENT)
        return rc;
    if (m->tier == TIO_TIER_HOST) {
        if (!t->host_copy && !(t->host_copy = malloc(t->bytes))) {
            refuse_offload(rt, id, "host memory", "out of memory");
            return 0;
        }
        void *src;
        if ((rc = stage_out(rt, id, &src)) < 0)
            return rc;
        if ((rc = copy_host_tier(rt, id, t->host_copy, src)) < 0) {
            unstage(rt, id, false);
            return rc;
        }
        if ((rc = unstage(rt, id, false)) < 0)
            return rc;
        rt->stats.bytes_offloaded += t->bytes;
        rt->stats.bytes_offloaded_host += t->bytes;
        rt->stats.n_offloads++;
        t->stored = TIO_TIER_HOST;
        t->state = TENSOR_OFFLOADING;
        return 0;
    }
    tio_clear_error();
    if (!t->has_extent) {
        rc = tio_engine_alloc(rt->engine, t->bytes, &t->extent);
        if (rc == -ENOSPC) {
            refuse_offload(rt, id, "SSD", tio_last_error());
            return 0;
        }
        if (rc < 0)
            return submit_failed(rc, id, "reserving SSD space");
        t->has_extent = true;
    }
    void *src;
    if ((rc = stage_out(rt, id, &src)) < 0)
        return rc;
    tio_clear_error();
    rc = tio_engine_submit_write(rt->engine, &t->extent, src, t->bytes, id, false);
    if (rc < 0) {
        rc = submit_failed(rc, id, "submitting the SSD write");
        unstage(rt, id, false);
        return rc;
    }
    t->io = IO_WRITE;
    t->stored = TIO_TIER_SSD;
    t->state = TENSOR_OFFLOADING;
    return 0;
}

/* Start bringing offloaded tensor `id` back: allocate, then copy from the
 * host tier (done at once) or submit the SSD read as `kind`. */
static int start_fetch(tio_runtime *rt, uint32_t id, io_kind kind, bool urgent)
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
        if ((rc = copy_host_tier(rt, id, dst, t->host_copy)) < 0) {
            unstage(rt, id, false);
            abandon_read(rt, id);
            return rc;
        }
        if ((rc = unstage(rt, id, true)) < 0) {
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
        rc = submit_failed(rc, id, "submitting the SSD read");
        unstage(rt, id, false);
        abandon_read(rt, id);
        return rc;
    }
    t->io = kind;
    t->state = TENSOR_PREFETCHING;
    return 0;
}

/* Step 4: prefetch trigger — bring an offloaded tensor back. */
static int prefetch_trigger(tio_runtime *rt, const tio_migration *m)
{
    rt_tensor *t = &rt->tensors[m->tensor];
    if (!t->bound || t->state != TENSOR_OFFLOADED)
        return 0;
    int rc = take_error(rt, m->tensor);
    keep_first(&rc, start_fetch(rt, m->tensor, IO_READ, false));
    return rc;
}

/* The iteration left the trace at kernel k (`why` says how): let every
 * migration in flight finish (writes are waited for and released, reads
 * complete), then stop planned migrations until the next iteration_begin. */
static int diverge(tio_runtime *rt, uint32_t k, const char *why)
{
    tio_log(first_warning(&warned_divergence),
            "runtime: iteration %llu left the trace at kernel %u: %s; planned migrations stop "
            "for this iteration, offloaded tensors are fetched on demand",
            (unsigned long long)rt->stats.iterations, k, why);
    rt->stats.diverged = true;
    rt->stats.diverged_kernel = k;
    rt->stats.diverged_iterations++;
    rt->iter_diverged = true;
    int first = 0;
    for (uint32_t id = 0; id < rt->trace->n_tensors; id++) {
        rt_tensor *t = &rt->tensors[id];
        if (!t->bound)
            continue;
        keep_first(&first, wait_result(rt, id, &rt->stats.wait_ns));
        if (t->state == TENSOR_OFFLOADING)
            keep_first(&first, release_tensor(rt, id));
    }
    return first < 0 ? first : 1;
}

/* tio_runtime_account_program's value becomes the untracked total (its
 * window closed: nothing is checked here). */
static void apply_program_bytes(tio_runtime *rt)
{
    if (!rt->program_pending)
        return;
    rt->program_pending = false;
    uint64_t u = rt->program_bytes > rt->bound_bytes ? rt->program_bytes - rt->bound_bytes : 0;
    rt->stats.resident_bytes = rt->stats.resident_bytes - rt->untracked_bytes + u;
    rt->untracked_bytes = u;
}

/* Kernel k's window opens (the previous one closed at the start of this
 * kernel_begin). */
static void open_window(tio_runtime *rt, uint32_t k)
{
    rt->window_open = true;
    rt->window_over = false;
    rt->window_kernel = k;
    note_resident(rt);
}

int tio_runtime_kernel_begin(tio_runtime *rt, uint32_t k, const char *name)
{
    if (!rt)
        return tio_fail(-EINVAL, "runtime_kernel_begin: runtime is NULL");
    int first = check_thread(rt, "tio_runtime_kernel_begin");
    if (first < 0)
        return first;
    rt->window_open = false;
    apply_program_bytes(rt);
    if (k >= rt->next_kernel)
        rt->next_kernel = k + 1;
    if (rt->iter_diverged) {
        open_window(rt, k);
        return 0;
    }
    first = reap(rt, 0);
    if (first > 0)
        first = 0;
    if (k >= rt->trace->n_kernels || !name || strcmp(name, rt->trace->kernels[k].name) != 0) {
        char why[512];
        snprintf(why, sizeof why, "kernel '%s', the trace has '%s'", name ? name : "(null)",
                 k < rt->trace->n_kernels ? rt->trace->kernels[k].name : "(none: it ends before)");
        int rc = diverge(rt, k, why);
        open_window(rt, k);
        return first < 0 ? first : rc;
    }
    static int (*const step[B_COUNT])(tio_runtime *, const tio_migration *) = {
        [B_OFFLOAD_DEADLINE] = offload_deadline,
        [B_PREFETCH_DEADLINE] = prefetch_deadline,
        [B_OFFLOAD_TRIGGER] = offload_trigger,
        [B_PREFETCH_TRIGGER] = prefetch_trigger,
    };
    /* A migration triggered and due at the same kernel is synchronous: its
     * deadline step runs right after its trigger (steps 1 and 2 ran before
     * the transfer existed). */
    static int (*const due_now[B_COUNT])(tio_runtime *, const tio_migration *) = {
        [B_OFFLOAD_TRIGGER] = offload_deadline,
        [B_PREFETCH_TRIGGER] = prefetch_deadline,
    };
    for (int b = 0; b < B_COUNT; b++) {
        for (uint32_t i = rt->bucket_start[b][k]; i < rt->bucket_start[b][k + 1]; i++) {
            const tio_migration *m = &rt->plan->migrations[rt->bucket_mig[b][i]];
            int rc = step[b](rt, m);
            if (rc == 0 && due_now[b] && m->deadline_kernel == k)
                rc = due_now[b](rt, m);
            keep_first(&first, rc);
        }
    }
    open_window(rt, k);
    return first;
}

static int check_bound(const tio_runtime *rt, uint32_t tensor)
{
    if (tensor >= rt->trace->n_tensors)
        return tio_fail(TIO_EUNKNOWN, "tensor %u does not exist (the trace has %u tensors)",
                        tensor, rt->trace->n_tensors);
    if (!rt->tensors[tensor].bound)
        return tio_fail(TIO_EUNKNOWN, "tensor %u is not bound", tensor);
    return 0;
}

/* Make bound tensor `id` resident.  Returns 0 (it was), 1 (it had to be
 * waited for or fetched; *waited_ns gets the time), or an error. */
static int make_resident(tio_runtime *rt, uint32_t id, io_kind kind, uint64_t *waited_ns)
{
    rt_tensor *t = &rt->tensors[id];
    if (t->state == TENSOR_OFFLOADING) {
        t->state = TENSOR_RESIDENT; /* used during its offload: never release it */
        return 0;
    }
    if (t->state == TENSOR_RESIDENT)
        return 0;
    uint64_t t0 = tio_now_ns();
    int rc = 0;
    if (t->state == TENSOR_OFFLOADED) {
        if (t->err) {
            tio_log(TIO_LOG_WARN, "runtime: %s; fetching it again on demand",
                    t->err_msg ? t->err_msg : tio_strerror(t->err));
            clear_pending_error(t);
        }
        rc = start_fetch(rt, id, kind, true);
    }
    if (rc == 0)
        rc = wait_result(rt, id, NULL);
    *waited_ns = tio_now_ns() - t0;
    return rc < 0 ? rc : 1;
}

int tio_runtime_ensure_resident(tio_runtime *rt, uint32_t tensor, void **addr)
{
    if (!rt)
        return tio_fail(-EINVAL, "runtime_ensure_resident: runtime is NULL");
    int rc = check_thread(rt, "tio_runtime_ensure_resident");
    if (rc == 0)
        rc = check_bound(rt, tensor);
    if (rc < 0)
        return rc;
    rc = reap(rt, 0);
    if (rc < 0)
        return tio_fail(rc, "tensor %u: reaping the engine: %s", tensor, tio_last_error());
    rt_tensor *t = &rt->tensors[tensor];
    bool outside = !rt->in_iteration && rt->stats.iterations > 0;
    bool fetching = t->state == TENSOR_OFFLOADED;
    uint64_t waited_ns = 0;
    rc = make_resident(rt, tensor, outside ? IO_READ_OUTSIDE : IO_READ_DEMAND, &waited_ns);
    if (outside) {
        rt->stats.fetches_outside += rc == 1 && fetching;
    } else if (rc != 0) {
        rt->stats.stalls++;
        rt->stats.stall_ns += waited_ns;
    }
    if (rc < 0)
        return rc;
    if (addr)
        *addr = t->addr;
    return rc;
}

bool tio_runtime_is_resident(const tio_runtime *rt, uint32_t tensor)
{
    return rt && tensor < rt->trace->n_tensors && rt->tensors[tensor].bound &&
           rt->tensors[tensor].state == TENSOR_RESIDENT;
}

/* Does the tensor hold memory counted in resident_bytes? */
static bool holds_memory(const rt_tensor *t)
{
    return t->bound && t->state != TENSOR_OFFLOADED;
}

static void list_held(tio_runtime *rt, uint32_t id)
{
    rt->tensors[id].listed = true;
    rt->held[rt->n_held++] = id;
}

/* Bring `held` up to kernel k: list the bound tensors whose end is in
 * [ends_seen, k], drop the ones unbound since.  Returns how many listed
 * tensors hold memory (an offloaded one does not) and writes the first
 * `cap` of them to ids. */
static uint32_t refresh_held(tio_runtime *rt, uint32_t k, uint32_t *ids, uint32_t cap)
{
    uint32_t nk = rt->trace->n_kernels;
    for (; rt->ends_seen <= k && rt->ends_seen < nk; rt->ends_seen++)
        for (uint32_t i = rt->end_start[rt->ends_seen]; i < rt->end_start[rt->ends_seen + 1]; i++)
            if (rt->tensors[rt->end_ids[i]].bound && !rt->tensors[rt->end_ids[i]].listed)
                list_held(rt, rt->end_ids[i]);
    uint32_t kept = 0, holding = 0;
    for (uint32_t i = 0; i < rt->n_held; i++) {
        rt_tensor *t = &rt->tensors[rt->held[i]];
        if (!t->bound) {
            t->listed = false;
            continue;
        }
        rt->held[kept++] = rt->held[i];
        if (holds_memory(t) && holding++ < cap)
            ids[holding - 1] = rt->held[i];
    }
    rt->n_held = kept;
    return holding;
}

int tio_runtime_held_past_free(tio_runtime *rt, uint32_t k, uint32_t *ids, uint32_t cap)
{
    if (!rt)
        return tio_fail(-EINVAL, "runtime_held_past_free: runtime is NULL");
    int rc = check_thread(rt, "tio_runtime_held_past_free");
    if (rc < 0)
        return rc;
    if (cap && !ids)
        return tio_fail(-EINVAL, "runtime_held_past_free: ids is NULL with cap %u", cap);
    if (!rt->in_iteration || rt->iter_diverged)
        return 0;
    uint32_t n = refresh_held(rt, k, ids, cap);
    return n > INT_MAX ? INT_MAX : (int)n;
}

int tio_runtime_tensor_bind(tio_runtime *rt, uint32_t tensor, void *addr, uint64_t bytes)
{
    if (!rt)
        return tio_fail(-EINVAL, "runtime_tensor_bind: runtime is NULL");
    int rc = check_thread(rt, "tio_runtime_tensor_bind");
    if (rc < 0)
        return rc;
    if (!addr)
        return tio_fail(-EINVAL, "tensor %u: bound to a NULL address", tensor);
    char why[160];
    if (tensor >= rt->trace->n_tensors)
        snprintf(why, sizeof why, "tensor %u does not exist (the trace has %u tensors)", tensor,
                 rt->trace->n_tensors);
    else if (bytes != rt->tensors[tensor].bytes)
        snprintf(why, sizeof why, "tensor %u has %llu bytes, the trace %llu", tensor,
                 (unsigned long long)bytes, (unsigned long long)rt->tensors[tensor].bytes);
    else
        why[0] = 0;
    if (why[0]) {
        uint32_t k = rt->next_kernel ? rt->next_kernel - 1 : 0;
        if (rt->iter_diverged)
            return 1;
        rc = diverge(rt, k, why);
        note_resident(rt);
        return rc;
    }
    rt_tensor *t = &rt->tensors[tensor];
    /* Rebinding replaces the tensor's contents: an old request's outcome no
     * longer matters, but its buffer must not be in use when we return. */
    rc = wait_io(rt, tensor, NULL);
    if (rc < 0)
        return rc;
    clear_pending_error(t);
    if (holds_memory(t))
        rt->stats.resident_bytes -= t->bytes;
    if (!t->bound)
        rt->bound_bytes += t->bytes;
    t->addr = addr;
    t->bound = true;
    t->state = TENSOR_RESIDENT;
    if (rt->in_iteration && t->end < rt->ends_seen && !t->listed)
        list_held(rt, tensor);
    resident_add(rt, bytes);
    return 0;
}

/* Forget bound tensor `id`: wait for its I/O, drop its stored copy. */
static int unbind(tio_runtime *rt, uint32_t id)
{
    rt_tensor *t = &rt->tensors[id];
    int rc = wait_io(rt, id, NULL);
    clear_pending_error(t); /* the tensor is dead: its copy no longer matters */
    if (holds_memory(t))
        rt->stats.resident_bytes -= t->bytes;
    if (t->has_extent) {
        tio_engine_free(rt->engine, &t->extent);
        t->has_extent = false;
    }
    free(t->host_copy);
    t->host_copy = NULL;
    if (t->bound)
        rt->bound_bytes -= t->bytes;
    t->addr = NULL;
    t->bound = false;
    t->state = TENSOR_RESIDENT;
    return rc;
}

int tio_runtime_tensor_unbind(tio_runtime *rt, uint32_t tensor)
{
    if (!rt)
        return tio_fail(-EINVAL, "runtime_tensor_unbind: runtime is NULL");
    int rc = check_thread(rt, "tio_runtime_tensor_unbind");
    if (rc == 0)
        rc = check_bound(rt, tensor);
    if (rc < 0)
        return rc;
    return unbind(rt, tensor);
}

/* The prefetch trigger that ends offload `o`'s stay away from the device:
 * the same tensor's prefetch whose trigger comes first, cyclically, at or
 * after o's deadline, among migrations [from, to) of by_tensor.  Returns
 * false if there is none. */
static bool matching_prefetch(const tio_plan *plan, const uint32_t *by_tensor, uint32_t from,
                              uint32_t to, const tio_migration *o, uint32_t *trigger)
{
    uint32_t n = plan->n_kernels, best = UINT32_MAX;
    for (uint32_t i = from; i < to; i++) {
        const tio_migration *m = &plan->migrations[by_tensor[i]];
        if (m->kind != TIO_MIGRATION_PREFETCH)
            continue;
        uint32_t dist = (m->trigger_kernel + n - o->deadline_kernel) % n;
        if (dist < best) {
            best = dist;
            *trigger = m->trigger_kernel;
        }
    }
    return best != UINT32_MAX;
}

/* Each tensor's place at kernel 0 in the plan's steady state.  A plan's
 * wrap-around periods start in the tail of one iteration and end in the
 * next; at kernel 0 such a tensor is
 *   writing: the offload's deadline wraps (deadline < trigger), its write is
 *     in flight at kernel 0;
 *   away: the offload completed before the end (deadline >= trigger) and
 *     the prefetch trigger wraps (prefetch trigger < deadline).
 * The migrations are grouped by tensor first (counting sort), so this costs
 * O(sum over tensors of its migrations squared), small per tensor. */
static int compute_initial_places(tio_runtime *rt)
{
    const tio_plan *plan = rt->plan;
    uint32_t nt = rt->trace->n_tensors;
    uint32_t *start = calloc((size_t)nt + 1, sizeof *start);
    uint32_t *by_tensor = malloc(((size_t)plan->n_migrations + 1) * sizeof *by_tensor);
    if (!start || !by_tensor) {
        free(start);
        free(by_tensor);
        return tio_fail(-ENOMEM, "runtime: out of memory grouping %u migrations by tensor",
                        plan->n_migrations);
    }
    for (uint32_t i = 0; i < plan->n_migrations; i++)
        start[plan->migrations[i].tensor + 1]++;
    for (uint32_t t = 0; t < nt; t++)
        start[t + 1] += start[t];
    for (uint32_t i = 0; i < plan->n_migrations; i++)
        by_tensor[start[plan->migrations[i].tensor]++] = i;
    for (uint32_t t = nt; t > 0; t--) /* restore the offsets the fill advanced */
        start[t] = start[t - 1];
    start[0] = 0;
    for (uint32_t t = 0; t < nt; t++) {
        for (uint32_t i = start[t]; i < start[t + 1]; i++) {
            const tio_migration *o = &plan->migrations[by_tensor[i]];
            uint32_t pre;
            if (o->kind != TIO_MIGRATION_OFFLOAD ||
                !matching_prefetch(plan, by_tensor, start[t], start[t + 1], o, &pre))
                continue;
            bool writing = o->deadline_kernel < o->trigger_kernel;
            bool away = !writing && pre < o->deadline_kernel;
            if (writing || away) {
                rt->tensors[t].at0 = writing ? AT0_WRITING : AT0_AWAY;
                rt->tensors[t].at0_offload = by_tensor[i];
            }
        }
    }
    free(start);
    free(by_tensor);
    return 0;
}

/* Before kernel 0: move every bound tensor whose state differs from its
 * steady-state place at kernel 0.  A resident tensor the plan has writing
 * gets its write started (the deadline releases it); one the plan has away
 * is written, waited for and released; an offloaded one the plan has
 * resident (left so by a diverged iteration) starts coming back. */
static int place_at_begin(tio_runtime *rt)
{
    int first = 0;
    for (uint32_t id = 0; id < rt->trace->n_tensors; id++) {
        rt_tensor *t = &rt->tensors[id];
        if (!t->bound)
            continue;
        if (t->at0 == AT0_RESIDENT) {
            if (t->state == TENSOR_OFFLOADED) {
                clear_pending_error(t);
                keep_first(&first, start_fetch(rt, id, IO_READ_DEMAND, false));
            }
            continue;
        }
        if (t->state != TENSOR_RESIDENT)
            continue;
        const tio_migration *o = &rt->plan->migrations[t->at0_offload];
        int rc = offload_trigger(rt, o);
        if (rc == 0 && t->at0 == AT0_AWAY)
            rc = offload_deadline(rt, o);
        keep_first(&first, rc);
    }
    return first;
}

int tio_runtime_iteration_begin(tio_runtime *rt)
{
    if (!rt)
        return tio_fail(-EINVAL, "runtime_iteration_begin: runtime is NULL");
    int rc = check_thread(rt, "tio_runtime_iteration_begin");
    if (rc < 0)
        return rc;
    rt->window_open = false;
    rt->in_iteration = true;
    rt->iter_diverged = false;
    rt->next_kernel = 0;
    for (uint32_t i = 0; i < rt->n_held; i++)
        rt->tensors[rt->held[i]].listed = false;
    rt->n_held = 0;
    rt->ends_seen = 0;
    rc = reap(rt, 0);
    if (rc > 0)
        rc = 0;
    keep_first(&rc, place_at_begin(rt));
    rt->stats.iterations++;
    return rc;
}

int tio_runtime_iteration_end(tio_runtime *rt)
{
    if (!rt)
        return tio_fail(-EINVAL, "runtime_iteration_end: runtime is NULL");
    int rc = check_thread(rt, "tio_runtime_iteration_end");
    if (rc < 0)
        return rc;
    if (!rt->in_iteration)
        return tio_fail(-EINVAL, "runtime_iteration_end: no iteration was begun");
    rt->window_open = false;
    int first = 0;
    if (!rt->iter_diverged && rt->next_kernel != rt->trace->n_kernels) {
        char why[96];
        snprintf(why, sizeof why, "the iteration ended after %u kernels, the trace has %u",
                 rt->next_kernel, rt->trace->n_kernels);
        keep_first(&first, diverge(rt, rt->next_kernel, why));
    }
    for (uint32_t id = 0; id < rt->trace->n_tensors; id++) {
        rt_tensor *t = &rt->tensors[id];
        if (!t->bound || rt->trace->tensors[id].global)
            continue;
        uint64_t waited_ns;
        int r = make_resident(rt, id, IO_READ_DEMAND, &waited_ns);
        keep_first(&first, r);
        if (r >= 0)
            keep_first(&first, unbind(rt, id));
    }
    rt->stats.resident_bytes -= rt->untracked_bytes;
    rt->untracked_bytes = 0;
    rt->program_pending = false;
    rt->in_iteration = false;
    rt->iter_diverged = false;
    return first;
}

int tio_runtime_account_untracked(tio_runtime *rt, int64_t delta_bytes)
{
    if (!rt)
        return tio_fail(-EINVAL, "runtime_account_untracked: runtime is NULL");
    int rc = check_thread(rt, "tio_runtime_account_untracked");
    if (rc < 0)
        return rc;
    if (delta_bytes < 0) {
        uint64_t drop = (uint64_t)0 - (uint64_t)delta_bytes;
        if (drop > rt->untracked_bytes)
            return tio_fail(-EINVAL,
                            "runtime_account_untracked: removing %llu bytes, only %llu are "
                            "accounted",
                            (unsigned long long)drop, (unsigned long long)rt->untracked_bytes);
        rt->untracked_bytes -= drop;
        rt->stats.resident_bytes -= drop;
        return 0;
    }
    rt->untracked_bytes += (uint64_t)delta_bytes;
    resident_add(rt, (uint64_t)delta_bytes);
    return 0;
}

int tio_runtime_account_program(tio_runtime *rt, uint64_t held_bytes)
{
    if (!rt)
        return tio_fail(-EINVAL, "runtime_account_program: runtime is NULL");
    int rc = check_thread(rt, "tio_runtime_account_program");
    if (rc < 0)
        return rc;
    if (!rt->in_iteration)
        return tio_fail(-EINVAL, "runtime_account_program: no iteration was begun");
    rt->program_bytes = held_bytes;
    rt->program_pending = true;
    return 0;
}

int tio_runtime_fetch_all(tio_runtime *rt)
{
    if (!rt)
        return tio_fail(-EINVAL, "runtime_fetch_all: runtime is NULL");
    int first = check_thread(rt, "tio_runtime_fetch_all");
    if (first < 0)
        return first;
    /* Submit every read first so they overlap, then wait for them all. */
    for (uint32_t id = 0; id < rt->trace->n_tensors; id++) {
        rt_tensor *t = &rt->tensors[id];
        if (!t->bound)
            continue;
        if (t->state == TENSOR_OFFLOADING) {
            t->state = TENSOR_RESIDENT;
        } else if (t->state == TENSOR_OFFLOADED) {
            clear_pending_error(t);
            keep_first(&first, start_fetch(rt, id, IO_READ_DEMAND, false));
        }
    }
    for (uint32_t id = 0; id < rt->trace->n_tensors; id++) {
        if (rt->tensors[id].bound)
            keep_first(&first, wait_result(rt, id, &rt->stats.wait_ns));
    }
    return first;
}

void tio_runtime_get_stats(const tio_runtime *rt, tio_runtime_stats *out)
{
    if (rt && out)
        *out = rt->stats;
}

/* The plan is const and borrowed: check what the runtime relies on. */
static int validate_plan(const tio_plan *plan, const tio_trace *trace, const tio_engine *engine)
{
    if (plan->n_kernels != trace->n_kernels)
        return tio_fail(-EINVAL, "plan has %u kernels, the trace %u", plan->n_kernels,
                        trace->n_kernels);
    if (plan->n_migrations > 0 && !plan->migrations)
        return tio_fail(-EINVAL, "plan has %u migrations but no array", plan->n_migrations);
    for (uint32_t i = 0; i < plan->n_migrations; i++) {
        const tio_migration *m = &plan->migrations[i];
        if (m->tensor >= trace->n_tensors)
            return tio_fail(TIO_EUNKNOWN,
                            "plan migration %u names tensor %u; the trace has %u tensors", i,
                            m->tensor, trace->n_tensors);
        if (m->kind != TIO_MIGRATION_OFFLOAD && m->kind != TIO_MIGRATION_PREFETCH)
            return tio_fail(-EINVAL, "plan migration %u (tensor %u): bad kind %d", i, m->tensor,
                            (int)m->kind);
        if (m->trigger_kernel >= plan->n_kernels || m->deadline_kernel >= plan->n_kernels)
            return tio_fail(-EINVAL,
                            "plan migration %u (tensor %u): kernels %u/%u outside [0, %u)", i,
                            m->tensor, m->trigger_kernel, m->deadline_kernel, plan->n_kernels);
        if (m->tier != TIO_TIER_HOST && m->tier != TIO_TIER_SSD)
            return tio_fail(-EINVAL, "plan migration %u (tensor %u): tier must be host or ssd",
                            i, m->tensor);
        if (m->tier == TIO_TIER_SSD && !engine)
            return tio_fail(-EINVAL, "plan migration %u (tensor %u): SSD tier but no engine", i,
                            m->tensor);
        if (m->bytes != trace->tensors[m->tensor].bytes)
            return tio_fail(-EINVAL,
                            "plan migration %u (tensor %u): %llu bytes, the trace says %llu", i,
                            m->tensor, (unsigned long long)m->bytes,
                            (unsigned long long)trace->tensors[m->tensor].bytes);
    }
    return 0;
}

/* end[t] = where tensor t's memory ends in the trace: the kernel before
 * which it was freed (its free_kernel, or the kernel after its last
 * access); n_kernels for a global tensor.  `end` is zeroed, [n_tensors]. */
static void tensor_ends(const tio_trace *trace, uint32_t *end)
{
    for (uint32_t k = 0; k < trace->n_kernels; k++)
        for (uint32_t a = 0; a < trace->kernels[k].n_accesses; a++)
            end[trace->accesses[trace->kernels[k].first_access + a].tensor] = k;
    for (uint32_t t = 0; t < trace->n_tensors; t++) {
        const tio_trace_tensor *tt = &trace->tensors[t];
        end[t] = tt->global ? trace->n_kernels : tt->free_kernel ? tt->free_kernel : end[t] + 1;
    }
}

/* The SSD space the plan needs at once, at least: a tensor keeps its
 * 4 KiB-aligned extent from its first SSD offload on, a global tensor for
 * good, an intermediate one until it dies (its free kernel, or its last use
 * in the trace).  Returns 0 with the peak over the kernels in *out, or
 * -ENOMEM. */
static int plan_ssd_peak_bytes(const tio_plan *plan, const tio_trace *trace, uint64_t *out)
{
    uint32_t nt = trace->n_tensors, nk = trace->n_kernels;
    uint32_t *first = malloc(((size_t)nt + 1) * sizeof *first);
    uint32_t *ends = calloc((size_t)nt + 1, sizeof *ends);
    int64_t *delta = calloc((size_t)nk + 1, sizeof *delta);
    if (!first || !ends || !delta) {
        free(first);
        free(ends);
        free(delta);
        return tio_fail(-ENOMEM, "runtime: out of memory checking the plan's SSD space");
    }
    for (uint32_t t = 0; t < nt; t++)
        first[t] = UINT32_MAX;
    for (uint32_t i = 0; i < plan->n_migrations; i++) {
        const tio_migration *m = &plan->migrations[i];
        if (m->kind == TIO_MIGRATION_OFFLOAD && m->tier == TIO_TIER_SSD &&
            m->trigger_kernel < first[m->tensor])
            first[m->tensor] = m->trigger_kernel;
    }
    tensor_ends(trace, ends);
    uint64_t held = 0, peak = 0;
    for (uint32_t t = 0; t < nt; t++) {
        if (first[t] == UINT32_MAX)
            continue;
        uint64_t bytes = (trace->tensors[t].bytes + TIO_EXTENT_ALIGN - 1) &
                         ~(uint64_t)(TIO_EXTENT_ALIGN - 1);
        if (trace->tensors[t].global) {
            held += bytes;
            continue;
        }
        /* Held until the tensor dies (at its end), and at least over its offload. */
        uint32_t end = ends[t] > first[t] ? ends[t] : first[t] + 1;
        delta[first[t]] += (int64_t)bytes;
        delta[end] -= (int64_t)bytes;
    }
    int64_t now = 0;
    for (uint32_t k = 0; k < nk; k++) {
        now += delta[k];
        if ((uint64_t)now > peak)
            peak = (uint64_t)now;
    }
    free(first);
    free(ends);
    free(delta);
    *out = held + peak;
    return 0;
}

/* Each tensor's end (tensor_ends), and the intermediate tensors grouped by
 * it: the per-kernel lists of tio_runtime_held_past_free. */
static int build_ends(tio_runtime *rt)
{
    const tio_trace *trace = rt->trace;
    uint32_t nt = trace->n_tensors, nk = trace->n_kernels;
    uint32_t *end = calloc((size_t)nt + 1, sizeof *end);
    rt->end_start = calloc((size_t)nk + 1, sizeof *rt->end_start);
    rt->end_ids = malloc(((size_t)nt + 1) * sizeof *rt->end_ids);
    rt->held = malloc(((size_t)nt + 1) * sizeof *rt->held);
    if (!end || !rt->end_start || !rt->end_ids || !rt->held) {
        free(end);
        return tio_fail(-ENOMEM, "runtime: out of memory indexing %u tensors' ends", nt);
    }
    tensor_ends(trace, end);
    for (uint32_t t = 0; t < nt; t++) {
        rt->tensors[t].end = end[t];
        if (end[t] < nk)
            rt->end_start[end[t] + 1]++;
    }
    for (uint32_t k = 0; k < nk; k++)
        rt->end_start[k + 1] += rt->end_start[k];
    for (uint32_t t = 0; t < nt; t++) /* fill with a moving cursor, restored after */
        if (end[t] < nk)
            rt->end_ids[rt->end_start[end[t]]++] = t;
    for (uint32_t k = nk; k > 0; k--)
        rt->end_start[k] = rt->end_start[k - 1];
    rt->end_start[0] = 0;
    free(end);
    return 0;
}

/* Which bucket a migration goes to for its trigger (or deadline). */
static int bucket_of(const tio_migration *m, bool deadline)
{
    if (m->kind == TIO_MIGRATION_OFFLOAD)
        return deadline ? B_OFFLOAD_DEADLINE : B_OFFLOAD_TRIGGER;
    return deadline ? B_PREFETCH_DEADLINE : B_PREFETCH_TRIGGER;
}

/* Counting sort of the migrations into the four per-kernel buckets. */
static int build_buckets(tio_runtime *rt)
{
    const tio_plan *plan = rt->plan;
    uint32_t nk = plan->n_kernels;
    for (int b = 0; b < B_COUNT; b++) {
        rt->bucket_start[b] = calloc((size_t)nk + 1, sizeof(uint32_t));
        rt->bucket_mig[b] = malloc(((size_t)plan->n_migrations + 1) * sizeof(uint32_t));
        if (!rt->bucket_start[b] || !rt->bucket_mig[b])
            return tio_fail(-ENOMEM, "runtime: out of memory indexing %u migrations",
                            plan->n_migrations);
    }
    for (uint32_t i = 0; i < plan->n_migrations; i++) {
        const tio_migration *m = &plan->migrations[i];
        rt->bucket_start[bucket_of(m, false)][m->trigger_kernel + 1]++;
        rt->bucket_start[bucket_of(m, true)][m->deadline_kernel + 1]++;
    }
    for (int b = 0; b < B_COUNT; b++)
        for (uint32_t k = 0; k < nk; k++)
            rt->bucket_start[b][k + 1] += rt->bucket_start[b][k];
    /* Fill using a moving cursor per kernel; restore the offsets after. */
    for (uint32_t i = 0; i < plan->n_migrations; i++) {
        const tio_migration *m = &plan->migrations[i];
        int bt = bucket_of(m, false), bd = bucket_of(m, true);
        rt->bucket_mig[bt][rt->bucket_start[bt][m->trigger_kernel]++] = i;
        rt->bucket_mig[bd][rt->bucket_start[bd][m->deadline_kernel]++] = i;
    }
    for (int b = 0; b < B_COUNT; b++) {
        for (uint32_t k = nk; k > 0; k--)
            rt->bucket_start[b][k] = rt->bucket_start[b][k - 1];
        rt->bucket_start[b][0] = 0;
    }
    return 0;
}

int tio_runtime_create(const tio_plan *plan, const tio_trace *trace, tio_engine *engine,
                       const tio_runtime_callbacks *cb, tio_runtime **out)
{
    if (!out)
        return tio_fail(-EINVAL, "runtime_create: out is NULL");
    *out = NULL;
    if (!plan || !trace || !cb)
        return tio_fail(-EINVAL, "runtime_create: plan, trace and callbacks are required");
    if (!cb->allocate || !cb->release)
        return tio_fail(-EINVAL, "runtime_create: allocate and release callbacks are required");
    int n_staging = !!cb->stage_out + !!cb->stage_in + !!cb->unstage;
    if (n_staging != 0 && n_staging != 3)
        return tio_fail(-EINVAL, "runtime_create: stage_out, stage_in and unstage must be set together");
    int rc = tio_trace_validate(trace); /* the tables below rely on it */
    if (rc == 0)
        rc = validate_plan(plan, trace, engine);
    if (rc < 0)
        return rc;
    uint64_t ssd_bytes = 0;
    if (engine && (rc = plan_ssd_peak_bytes(plan, trace, &ssd_bytes)) < 0)
        return rc;
    if (ssd_bytes) {
        tio_engine_space sp;
        tio_engine_space_stats(engine, &sp);
        if (ssd_bytes > sp.free_bytes)
            return tio_fail(-ENOSPC, "runtime: the plan keeps up to %llu bytes on SSD at once, "
                            "the engine has %llu of its %llu bytes free (create it with "
                            "space_bytes >= %llu)", (unsigned long long)ssd_bytes,
                            (unsigned long long)sp.free_bytes,
                            (unsigned long long)sp.space_bytes,
                            (unsigned long long)(ssd_bytes + sp.space_bytes - sp.free_bytes));
    }
    tio_runtime *rt = calloc(1, sizeof *rt);
    if (!rt)
        return tio_fail(-ENOMEM, "runtime: out of memory");
    rt->plan = plan;
    rt->trace = trace;
    rt->engine = tio_engine_retain(engine); /* dropped by tio_runtime_destroy */
    rt->cb = *cb;
    rt->tensors = calloc(trace->n_tensors ? trace->n_tensors : 1, sizeof *rt->tensors);
    if (!rt->tensors) {
        tio_runtime_destroy(rt);
        return tio_fail(-ENOMEM, "runtime: out of memory for %u tensors", trace->n_tensors);
    }
    for (uint32_t id = 0; id < trace->n_tensors; id++)
        rt->tensors[id].bytes = trace->tensors[id].bytes;
    rt->owner = pthread_self();
    rt->stats.capacity_bytes = plan->capacity_bytes;
    rc = build_buckets(rt);
    if (rc == 0)
        rc = compute_initial_places(rt);
    if (rc == 0)
        rc = build_ends(rt);
    if (rc < 0) {
        tio_runtime_destroy(rt);
        return rc;
    }
    *out = rt;
    return 0;
}

void tio_runtime_destroy(tio_runtime *rt)
{
    if (!rt)
        return;
    if (rt->tensors) {
        for (uint32_t id = 0; id < rt->trace->n_tensors; id++) {
            rt_tensor *t = &rt->tensors[id];
            if (wait_io(rt, id, NULL) < 0)
                tio_log(TIO_LOG_ERROR, "runtime: destroy: %s", tio_last_error());
            if (t->has_extent)
                tio_engine_free(rt->engine, &t->extent);
            free(t->host_copy);
            free(t->err_msg);
        }
        free(rt->tensors);
    }
    for (int b = 0; b < B_COUNT; b++) {
        free(rt->bucket_start[b]);
        free(rt->bucket_mig[b]);
    }
    free(rt->end_start);
    free(rt->end_ids);
    free(rt->held);
    tio_engine_destroy(rt->engine);
    free(rt);
}
