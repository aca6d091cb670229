/*
 * runtime/runtime.c — executes a plan while training runs (runtime.h): the
 * states a tensor goes through, the public calls that move it between
 * them, and the accounting of resident memory.  The tables these calls
 * read are built once at create (runtime_build.c); the transfers
 * themselves, and their completions and errors, are runtime_io.c's.
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
 */
#include <limits.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "runtime/runtime_internal.h"

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

void rt_resident_add(tio_runtime *rt, uint64_t bytes)
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

/* Step 1: offload deadline — wait for the write, then release. */
static int offload_deadline(tio_runtime *rt, const tio_migration *m)
{
    rt_tensor *t = &rt->tensors[m->tensor];
    if (!t->bound)
        return 0;
    int rc = rt_wait_result(rt, m->tensor, &rt->stats.wait_ns);
    if (rc < 0 || t->state != TENSOR_OFFLOADING)
        return rc;
    return rt_release_tensor(rt, m->tensor);
}

/* Step 2: prefetch deadline — wait for the read. */
static int prefetch_deadline(tio_runtime *rt, const tio_migration *m)
{
    rt_tensor *t = &rt->tensors[m->tensor];
    if (!t->bound)
        return 0;
    return rt_wait_result(rt, m->tensor, &rt->stats.wait_ns);
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
    int rc = rt_wait_result(rt, id, &rt->stats.wait_ns);
    if (rc < 0 || t->state != TENSOR_RESIDENT)
        return rc;
    if (m->tier == TIO_TIER_HOST) {
        if (!t->host_copy && !(t->host_copy = malloc(t->bytes))) {
            refuse_offload(rt, id, "host memory", "out of memory");
            return 0;
        }
        void *src;
        if ((rc = rt_stage_out(rt, id, &src)) < 0)
            return rc;
        if ((rc = rt_copy_host_tier(rt, id, t->host_copy, src)) < 0) {
            rt_unstage(rt, id, false);
            return rc;
        }
        if ((rc = rt_unstage(rt, id, false)) < 0)
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
            return rt_submit_failed(rc, id, "reserving SSD space");
        t->has_extent = true;
    }
    void *src;
    if ((rc = rt_stage_out(rt, id, &src)) < 0)
        return rc;
    tio_clear_error();
    rc = tio_engine_submit_write(rt->engine, &t->extent, src, t->bytes, id, false);
    if (rc < 0) {
        rc = rt_submit_failed(rc, id, "submitting the SSD write");
        rt_unstage(rt, id, false);
        return rc;
    }
    t->io = IO_WRITE;
    t->stored = TIO_TIER_SSD;
    t->state = TENSOR_OFFLOADING;
    return 0;
}

/* Step 4: prefetch trigger — bring an offloaded tensor back. */
static int prefetch_trigger(tio_runtime *rt, const tio_migration *m)
{
    rt_tensor *t = &rt->tensors[m->tensor];
    if (!t->bound || t->state != TENSOR_OFFLOADED)
        return 0;
    int rc = rt_take_error(rt, m->tensor);
    keep_first(&rc, rt_start_fetch(rt, m->tensor, IO_READ, false));
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
        keep_first(&first, rt_wait_result(rt, id, &rt->stats.wait_ns));
        if (t->state == TENSOR_OFFLOADING)
            keep_first(&first, rt_release_tensor(rt, id));
    }
    return first < 0 ? first : 1;
}

/* tio_runtime_account_program's value, less the bound tensors' full size,
 * becomes the untracked total: at kernel_begin (the window closed, nothing
 * is checked here), and again whenever a tensor is bound or unbound while
 * it is in effect (the program's bytes count that tensor already). */
static void refresh_program_bytes(tio_runtime *rt)
{
    uint64_t u = rt->program_bytes > rt->bound_bytes ? rt->program_bytes - rt->bound_bytes : 0;
    rt->stats.resident_bytes = rt->stats.resident_bytes - rt->untracked_bytes + u;
    rt->untracked_bytes = u;
}

static void apply_program_bytes(tio_runtime *rt)
{
    if (!rt->program_pending)
        return;
    rt->program_pending = false;
    rt->program_active = true;
    refresh_program_bytes(rt);
}

/* Kernel k's window opens (the previous one closed at the start of this
 * kernel_begin). */
static void open_window(tio_runtime *rt, uint32_t k)
{
    if (rt->in_iteration) {
        uint64_t rss = tio_process_rss_bytes();
        if (rss > rt->stats.peak_process_rss_bytes)
            rt->stats.peak_process_rss_bytes = rss;
    }
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
    first = rt_reap(rt, 0);
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
            rt_clear_pending_error(t);
        }
        rc = rt_start_fetch(rt, id, kind, true);
    }
    if (rc == 0)
        rc = rt_wait_result(rt, id, NULL);
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
    rc = rt_reap(rt, 0);
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
    rc = rt_wait_io(rt, tensor, NULL);
    if (rc < 0)
        return rc;
    rt_clear_pending_error(t);
    if (holds_memory(t))
        rt->stats.resident_bytes -= t->bytes;
    if (!t->bound)
        rt->bound_bytes += t->bytes;
    t->addr = addr;
    t->bound = true;
    t->state = TENSOR_RESIDENT;
    if (rt->in_iteration && t->end < rt->ends_seen && !t->listed)
        list_held(rt, tensor);
    if (rt->program_active)
        refresh_program_bytes(rt);
    rt_resident_add(rt, bytes);
    return 0;
}

static int unbind(tio_runtime *rt, uint32_t id);

int tio_runtime_tensor_bind_stored(tio_runtime *rt, uint32_t tensor, uint64_t bytes,
                                   const tio_extent *extent)
{
    if (!rt)
        return tio_fail(-EINVAL, "runtime_tensor_bind_stored: runtime is NULL");
    int rc = check_thread(rt, "tio_runtime_tensor_bind_stored");
    if (rc < 0)
        return rc;
    if (!extent || !rt->engine)
        return tio_fail(-EINVAL, "tensor %u: a stored copy needs an extent and a runtime with an engine",
                        tensor);
    if (tensor >= rt->trace->n_tensors)
        return tio_fail(-EINVAL, "tensor %u does not exist (the trace has %u tensors)", tensor,
                        rt->trace->n_tensors);
    rt_tensor *t = &rt->tensors[tensor];
    if (bytes != t->bytes || extent->bytes < bytes)
        return tio_fail(-EINVAL, "tensor %u: a stored copy of %llu bytes (extent %llu), the trace has %llu",
                        tensor, (unsigned long long)bytes, (unsigned long long)extent->bytes,
                        (unsigned long long)t->bytes);
    if (t->bound) {
        rc = unbind(rt, tensor);
        if (rc < 0)
            return rc;
    }
    t->bound = true;
    t->state = TENSOR_OFFLOADED;
    t->stored = TIO_TIER_SSD;
    t->extent = *extent;
    t->has_extent = true;
    t->addr = NULL;
    rt->bound_bytes += t->bytes;
    if (rt->program_active)
        refresh_program_bytes(rt);
    return 0;
}

/* Forget bound tensor `id`: wait for its I/O, drop its stored copy. */
static int unbind(tio_runtime *rt, uint32_t id)
{
    rt_tensor *t = &rt->tensors[id];
    int rc = rt_wait_io(rt, id, NULL);
    rt_clear_pending_error(t); /* the tensor is dead: its copy no longer matters */
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
    if (rt->program_active)
        refresh_program_bytes(rt);
    return rc;
}

int tio_runtime_tensor_detach(tio_runtime *rt, uint32_t tensor, bool *resident, tio_extent *extent)
{
    if (!rt)
        return tio_fail(-EINVAL, "runtime_tensor_detach: runtime is NULL");
    int rc = check_thread(rt, "tio_runtime_tensor_detach");
    if (rc == 0)
        rc = check_bound(rt, tensor);
    if (rc < 0)
        return rc;
    if (!resident || !extent)
        return tio_fail(-EINVAL, "runtime_tensor_detach: resident and extent are required");
    rt_tensor *t = &rt->tensors[tensor];
    if ((rc = rt_wait_io(rt, tensor, NULL)) < 0)
        return rc;
    /* A failed write left the tensor resident: its error no longer matters.
     * A failed read left it offloaded with its copy intact. */
    rt_clear_pending_error(t);
    if (t->state == TENSOR_OFFLOADED && t->stored == TIO_TIER_HOST) {
        uint64_t waited_ns;
        if ((rc = make_resident(rt, tensor, IO_READ_DEMAND, &waited_ns)) < 0)
            return rc;
    }
    if (t->state == TENSOR_OFFLOADING)
        t->state = TENSOR_RESIDENT;
    memset(extent, 0, sizeof *extent);
    *resident = t->state != TENSOR_OFFLOADED;
    if (!*resident) {
        *extent = t->extent;
        t->has_extent = false; /* the caller owns it now */
    }
    return unbind(rt, tensor);
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
                rt_clear_pending_error(t);
                keep_first(&first, rt_start_fetch(rt, id, IO_READ_DEMAND, false));
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
    if (rt->ssd_need_bytes && !rt->space_checked) {
        uint64_t own = 0;
        for (uint32_t id = 0; id < rt->trace->n_tensors; id++)
            if (rt->tensors[id].bound && rt->tensors[id].has_extent)
                own += rt->tensors[id].extent.bytes;
        if ((rc = rt_check_ssd_space(rt->engine, rt->ssd_need_bytes, own, false)) < 0)
            return rc;
        rt->space_checked = true;
    }
    rt->window_open = false;
    rt->in_iteration = true;
    rt->iter_diverged = false;
    rt->next_kernel = 0;
    for (uint32_t i = 0; i < rt->n_held; i++)
        rt->tensors[rt->held[i]].listed = false;
    rt->n_held = 0;
    rt->ends_seen = 0;
    rc = rt_reap(rt, 0);
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
    rt->program_pending = rt->program_active = false;
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
    rt_resident_add(rt, (uint64_t)delta_bytes);
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
            rt_clear_pending_error(t);
            keep_first(&first, rt_start_fetch(rt, id, IO_READ_DEMAND, false));
        }
    }
    for (uint32_t id = 0; id < rt->trace->n_tensors; id++) {
        if (rt->tensors[id].bound)
            keep_first(&first, rt_wait_result(rt, id, &rt->stats.wait_ns));
    }
    return first;
}

void tio_runtime_get_stats(const tio_runtime *rt, tio_runtime_stats *out)
{
    if (rt && out)
        *out = rt->stats;
}
