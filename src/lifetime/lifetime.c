/*
 * lifetime/lifetime.c — inactive periods, the memory curve M[k] and the
 * TERAIO paper's statistics (arXiv 2506.06472, §2), from a trace.
 *
 * Everything is O(kernels + tensors + accesses), in a few linear passes:
 *   1. prefix sums of kernel durations (start_ns), so the idle time of any
 *      kernel range is one subtraction;
 *   2. one walk over the accesses in kernel order gives each tensor's first
 *      and last use and the bytes each kernel touches;
 *   3. M[k] from a difference array: an intermediate tensor adds its bytes at
 *      its first use and removes them after its last, or at its free kernel
 *      when the trace recorded a later one (the program held it past its
 *      last use); global tensors add a constant;
 *   4. a counting sort of the accesses by tensor gives each tensor's uses in
 *      kernel order, and periods come from consecutive uses.  Walking
 *      tensors in id order and uses in kernel order, with the wrap-around
 *      period (whose last_use is the tensor's last use) emitted last, yields
 *      the periods already sorted by (tensor, last_use): no sort needed.
 *      An intermediate tensor held past its last use (a free_kernel of at
 *      least last use + 2) gets a tail period last, from that use to the
 *      free, in which a plan may move it out for good.
 *
 * One rule is applied uniformly: a period needs at least one kernel strictly
 * between its two uses (next_use - last_use >= 2).  So a global tensor used
 * once in a one-kernel trace has no period: nothing runs while it is idle.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "teraio/lifetime.h"

void tio_lifetime_destroy(tio_lifetime *lt)
{
    if (!lt)
        return;
    free(lt->memory_bytes);
    free(lt->active_bytes);
    free(lt->first_use);
    free(lt->last_use);
    free(lt->start_ns);
    free(lt->periods);
    free(lt->tensor_bytes);
    free(lt);
}

/* Position in ns of the start of kernel x, where x may lie in a later
 * iteration (x >= n_kernels).  Saturates at UINT64_MAX. */
static uint64_t position_ns(const tio_lifetime *lt, uint64_t x)
{
    uint64_t n = lt->n_kernels, iterations = x / n, at;
    if (__builtin_mul_overflow(iterations, lt->start_ns[n], &at) ||
        __builtin_add_overflow(at, lt->start_ns[x % n], &at))
        return UINT64_MAX;
    return at;
}

uint64_t tio_lifetime_span_ns(const tio_lifetime *lt, uint64_t from, uint64_t to)
{
    if (!lt || lt->n_kernels == 0 || from >= to)
        return 0;
    return position_ns(lt, to) - position_ns(lt, from);
}

static void *alloc_array(size_t n, size_t elem)
{
    return malloc((n ? n : 1) * elem);
}

/* Passes 1 to 3: start_ns, first/last use, active bytes, M[k]. */
static void compute_curves(const tio_trace *tr, tio_lifetime *lt, uint64_t *delta)
{
    uint32_t n = tr->n_kernels;
    lt->start_ns[0] = 0;
    for (uint32_t k = 0; k < n; k++)
        lt->start_ns[k + 1] = lt->start_ns[k] + tr->kernels[k].duration_ns;

    memset(lt->first_use, 0xff, tr->n_tensors * sizeof *lt->first_use);
    for (uint32_t k = 0; k < n; k++) {
        const tio_trace_kernel *kern = &tr->kernels[k];
        const tio_trace_access *a = tr->accesses + kern->first_access;
        uint64_t active = 0;
        for (uint32_t i = 0; i < kern->n_accesses; i++) {
            uint32_t t = a[i].tensor;
            if (lt->first_use[t] == UINT32_MAX)
                lt->first_use[t] = k;
            lt->last_use[t] = k;
            active += tr->tensors[t].bytes;
        }
        lt->active_bytes[k] = active;
        if (active > lt->max_active_bytes) {
            lt->max_active_bytes = active;
            lt->max_active_kernel = k;
        }
    }

    /* Unsigned wrap-around in the difference array is harmless: every
     * prefix sum is a true byte count, which validation keeps below 2^64. */
    uint64_t global_bytes = 0;
    memset(delta, 0, ((size_t)n + 1) * sizeof *delta);
    for (uint32_t t = 0; t < tr->n_tensors; t++) {
        uint64_t b = tr->tensors[t].bytes;
        lt->tensor_bytes[t] = b;
        if (tr->tensors[t].global) {
            global_bytes += b;
        } else {
            uint32_t end = lt->last_use[t] + 1, freed = tr->tensors[t].free_kernel;
            delta[lt->first_use[t]] += b;
            delta[freed > end ? freed : end] -= b;
        }
    }
    uint64_t live = global_bytes;
    for (uint32_t k = 0; k < n; k++) {
        live += delta[k];
        lt->memory_bytes[k] = live;
        if (live > lt->peak_bytes) {
            lt->peak_bytes = live;
            lt->peak_kernel = k;
        }
    }
}

/* Is intermediate t held past its last use with a kernel in between (a tail)? */
static bool has_tail(const tio_trace *tr, const tio_lifetime *lt, uint32_t t)
{
    uint32_t freed = tr->tensors[t].free_kernel;
    return freed && freed >= (uint64_t)lt->last_use[t] + 2;
}

/* Pass 4: each tensor's uses in kernel order (counting sort), then its
 * inactive periods.  `uses` has n_accesses slots, `offset` n_tensors+1. */
static int compute_periods(const tio_trace *tr, tio_lifetime *lt, uint32_t *uses,
                           uint32_t *offset)
{
    uint32_t n = tr->n_kernels, nt = tr->n_tensors;
    memset(offset, 0, ((size_t)nt + 1) * sizeof *offset);
    for (uint32_t i = 0; i < tr->n_accesses; i++)
        offset[tr->accesses[i].tensor + 1]++;
    for (uint32_t t = 0; t < nt; t++)
        offset[t + 1] += offset[t];
    for (uint32_t k = 0; k < n; k++) {
        const tio_trace_kernel *kern = &tr->kernels[k];
        for (uint32_t i = 0; i < kern->n_accesses; i++)
            uses[offset[tr->accesses[kern->first_access + i].tensor]++] = k;
    }
    /* offset[t] now points at the end of tensor t's uses; t's start is
     * offset[t - 1] (0 for t == 0). */

    uint64_t count = 0;
    for (uint32_t t = 0; t < nt; t++) {
        uint32_t begin = t ? offset[t - 1] : 0, end = offset[t];
        for (uint32_t i = begin + 1; i < end; i++)
            count += uses[i] - uses[i - 1] >= 2;
        if (tr->tensors[t].global)
            count += (uint64_t)lt->first_use[t] + n - lt->last_use[t] >= 2;
        else
            count += has_tail(tr, lt, t);
    }
    if (count > UINT32_MAX)
        return tio_fail(-ENOMEM, "trace has more than 2^32 inactive periods");
    lt->periods = alloc_array(count, sizeof *lt->periods);
    if (!lt->periods)
        return tio_fail(-ENOMEM, "out of memory for %llu inactive periods",
                        (unsigned long long)count);

    tio_inactive_period *p = lt->periods;
    for (uint32_t t = 0; t < nt; t++) {
        uint32_t begin = t ? offset[t - 1] : 0, end = offset[t];
        uint64_t bytes = tr->tensors[t].bytes;
        for (uint32_t i = begin + 1; i < end; i++)
            if (uses[i] - uses[i - 1] >= 2)
                *p++ = (tio_inactive_period){
                    .tensor = t, .last_use = uses[i - 1], .next_use = uses[i], .wraps = false,
                    .bytes = bytes,
                    .idle_ns = lt->start_ns[uses[i]] - lt->start_ns[uses[i - 1] + 1]};
        uint32_t next = lt->first_use[t] + n; /* n <= INT32_MAX: no overflow */
        if (tr->tensors[t].global && next - lt->last_use[t] >= 2)
            *p++ = (tio_inactive_period){
                .tensor = t, .last_use = lt->last_use[t], .next_use = next, .wraps = true,
                .bytes = bytes,
                .idle_ns = tio_lifetime_span_ns(lt, (uint64_t)lt->last_use[t] + 1, next)};
        else if (!tr->tensors[t].global && has_tail(tr, lt, t))
            *p++ = (tio_inactive_period){
                .tensor = t, .last_use = lt->last_use[t], .next_use = tr->tensors[t].free_kernel,
                .bytes = bytes, .tail = true,
                .idle_ns = lt->start_ns[tr->tensors[t].free_kernel] - lt->start_ns[lt->last_use[t] + 1]};
    }
    lt->n_periods = (uint32_t)count;
    return 0;
}

/* Pass 5: the floor, M[k] less the periods covering k (a < k < b, b
 * unwrapped), by a difference array over the kernels.  `delta` has n+1 slots. */
static void compute_floor(tio_lifetime *lt, uint64_t *delta)
{
    uint32_t n = lt->n_kernels;
    memset(delta, 0, ((size_t)n + 1) * sizeof *delta);
    for (uint32_t i = 0; i < lt->n_periods; i++) {
        const tio_inactive_period *p = &lt->periods[i];
        uint64_t a = (uint64_t)p->last_use + 1, b = p->next_use; /* covers [a, b) */
        if (b <= n) {
            delta[a] += p->bytes;
            delta[b] -= p->bytes;
        } else {              /* [a, n) and [0, b - n) */
            delta[a] += p->bytes;
            delta[n] -= p->bytes;
            delta[0] += p->bytes;
            delta[b - n] -= p->bytes;
        }
    }
    uint64_t covered = 0;
    for (uint32_t k = 0; k < n; k++) {
        covered += delta[k];
        uint64_t rest = lt->memory_bytes[k] - covered;
        if (k == 0 || rest > lt->floor_bytes) {
            lt->floor_bytes = rest;
            lt->floor_kernel = k;
        }
    }
}

int tio_lifetime_analyze(const tio_trace *trace, tio_lifetime **out)
{
    if (!trace || !out)
        return tio_fail(-EINVAL, "tio_lifetime_analyze: NULL argument");
    *out = NULL;
    int rc = tio_trace_validate(trace);
    if (rc)
        return rc;
    uint32_t n = trace->n_kernels, nt = trace->n_tensors;
    tio_lifetime *lt = calloc(1, sizeof *lt);
    uint64_t *delta = alloc_array((size_t)n + 1, sizeof *delta);
    uint32_t *uses = alloc_array(trace->n_accesses, sizeof *uses);
    uint32_t *offset = alloc_array((size_t)nt + 1, sizeof *offset);
    if (lt) {
        lt->n_kernels = n;
        lt->n_tensors = nt;
        lt->memory_bytes = alloc_array(n, sizeof *lt->memory_bytes);
        lt->active_bytes = alloc_array(n, sizeof *lt->active_bytes);
        lt->first_use = alloc_array(nt, sizeof *lt->first_use);
        lt->last_use = alloc_array(nt, sizeof *lt->last_use);
        lt->start_ns = alloc_array((size_t)n + 1, sizeof *lt->start_ns);
        lt->tensor_bytes = alloc_array(nt, sizeof *lt->tensor_bytes);
    }
    if (!lt || !delta || !uses || !offset || !lt->memory_bytes || !lt->active_bytes ||
        !lt->first_use || !lt->last_use || !lt->start_ns || !lt->tensor_bytes) {
        rc = tio_fail(-ENOMEM, "out of memory analysing a trace of %u kernels", n);
    } else {
        compute_curves(trace, lt, delta);
        rc = compute_periods(trace, lt, uses, offset);
        if (!rc)
            compute_floor(lt, delta);
    }
    free(delta);
    free(uses);
    free(offset);
    if (rc) {
        tio_lifetime_destroy(lt);
        return rc;
    }
    *out = lt;
    return 0;
}

int tio_lifetime_stats_compute(const tio_lifetime *lt, double ssd_read_gbps,
                               double ssd_write_gbps, tio_lifetime_stats *out)
{
    if (!lt || !out)
        return tio_fail(-EINVAL, "tio_lifetime_stats_compute: NULL argument");
    if (!(ssd_read_gbps > 0) || !(ssd_write_gbps > 0) || !isfinite(ssd_read_gbps) ||
        !isfinite(ssd_write_gbps))
        return tio_fail(-EINVAL, "SSD bandwidths must be finite and > 0 GB/s (got %g, %g)",
                        ssd_read_gbps, ssd_write_gbps);
    memset(out, 0, sizeof *out);

    if (lt->peak_bytes > 0 && lt->n_kernels > 0) {
        double sum = 0;
        for (uint32_t k = 0; k < lt->n_kernels; k++) {
            double share = (double)lt->active_bytes[k] / (double)lt->peak_bytes;
            sum += share;
            if (share > out->max_active_share)
                out->max_active_share = share;
        }
        out->mean_active_share = sum / lt->n_kernels;
    }

    static const uint64_t MiB = 1ull << 20;
    const uint64_t limits[TIO_SIZE_BUCKETS] = {MiB,       4 * MiB,    16 * MiB,  64 * MiB,
                                               256 * MiB, 1024 * MiB, 4096 * MiB, UINT64_MAX};
    memcpy(out->size_bucket_limit, limits, sizeof limits);
    for (uint32_t t = 0; t < lt->n_tensors; t++) {
        int b = 0;
        while (b < TIO_SIZE_BUCKETS - 1 && lt->tensor_bytes[t] >= limits[b])
            b++;
        out->size_bucket_count[b]++;
    }

    double all_bytes = 0, long_bytes = 0;
    out->n_periods = lt->n_periods;
    for (uint32_t i = 0; i < lt->n_periods; i++) {
        const tio_inactive_period *p = &lt->periods[i];
        double b = (double)p->bytes;
        double round_trip_ns = b / ssd_write_gbps + b / ssd_read_gbps; /* 1 GB/s = 1 B/ns */
        all_bytes += b;
        if ((double)p->idle_ns >= round_trip_ns) {
            out->n_periods_long++;
            long_bytes += b;
        }
    }
    if (out->n_periods > 0)
        out->long_period_share = (double)out->n_periods_long / out->n_periods;
    if (all_bytes > 0)
        out->long_period_bytes_share = long_bytes / all_bytes;
    return 0;
}

const char *tio_floor_reason_name(tio_floor_reason reason)
{
    switch (reason) {
    case TIO_FLOOR_ACCESSED: return "accessed";
    case TIO_FLOOR_HELD_AFTER_LAST_USE: return "held after its last use";
    case TIO_FLOOR_NEVER_ACCESSED: return "never accessed";
    }
    return "?";
}

static int by_bytes_desc(const void *a, const void *b)
{
    const tio_floor_tensor *x = a, *y = b;
    if (x->bytes != y->bytes)
        return x->bytes < y->bytes ? 1 : -1;
    return (x->tensor > y->tensor) - (x->tensor < y->tensor);
}

/* Is tensor t resident at kernel k if nothing moves (the memory curve's rule)? */
static bool resident_at(const tio_trace *tr, const tio_lifetime *lt, uint32_t t, uint32_t k)
{
    if (tr->tensors[t].global)
        return true;
    if (lt->first_use[t] == UINT32_MAX || k < lt->first_use[t])
        return false;
    uint32_t end = lt->last_use[t] + 1, freed = tr->tensors[t].free_kernel;
    return k < (freed > end ? freed : end);
}

int tio_lifetime_floor_tensors(const tio_trace *trace, const tio_lifetime *lt,
                               tio_floor_tensor *out, uint32_t cap, uint32_t *n)
{
    if (!trace || !lt || !n || (cap > 0 && !out))
        return tio_fail(-EINVAL, "tio_lifetime_floor_tensors: trace, lifetime and n are required "
                        "(and out when cap > 0)");
    *n = 0;
    if (lt->n_kernels != trace->n_kernels || lt->n_tensors != trace->n_tensors)
        return tio_fail(-EINVAL, "tio_lifetime_floor_tensors: the lifetime (%u kernels, %u tensors) "
                        "is not of this trace (%u kernels, %u tensors)", lt->n_kernels, lt->n_tensors,
                        trace->n_kernels, trace->n_tensors);
    if (lt->n_kernels == 0)
        return 0;
    uint32_t k = lt->floor_kernel, nt = trace->n_tensors;
    /* 0: not at the floor; 1: resident there; 2: a period covers it */
    uint8_t *state = calloc(nt ? nt : 1, 1);
    tio_floor_tensor *all = malloc((nt ? nt : 1) * sizeof *all);
    if (!state || !all) {
        free(state);
        free(all);
        return tio_fail(-ENOMEM, "tio_lifetime_floor_tensors: out of memory for %u tensors", nt);
    }
    for (uint32_t t = 0; t < nt; t++)
        state[t] = resident_at(trace, lt, t, k);
    uint64_t n_k = lt->n_kernels;
    for (uint32_t i = 0; i < lt->n_periods; i++) {
        const tio_inactive_period *p = &lt->periods[i];
        uint64_t a = (uint64_t)p->last_use + 1, b = p->next_use;
        if ((k >= a && k < b) || (b > n_k && k < b - n_k))
            state[p->tensor] = 2;
    }
    const tio_trace_kernel *kern = &trace->kernels[k];
    const tio_trace_access *acc = trace->accesses + kern->first_access;
    uint32_t m = 0;
    for (uint32_t t = 0; t < nt; t++) {
        if (state[t] != 1)
            continue;
        tio_floor_reason why = TIO_FLOOR_HELD_AFTER_LAST_USE;
        if (trace->tensors[t].global && lt->first_use[t] == UINT32_MAX)
            why = TIO_FLOOR_NEVER_ACCESSED;
        for (uint32_t i = 0; i < kern->n_accesses; i++)
            if (acc[i].tensor == t) {
                why = TIO_FLOOR_ACCESSED;
                break;
            }
        all[m++] = (tio_floor_tensor){.tensor = t, .bytes = trace->tensors[t].bytes, .reason = why};
    }
    qsort(all, m, sizeof *all, by_bytes_desc);
    if (out && cap)
        memcpy(out, all, (size_t)(m < cap ? m : cap) * sizeof *all);
    *n = m;
    free(state);
    free(all);
    return 0;
}
