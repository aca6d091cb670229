/*
 * runtime/runtime_build.c — tio_runtime_create and tio_runtime_destroy: the
 * plan is checked against the trace and the engine's free space, then
 * everything the running calls (runtime.c) look up is built once, so that
 * none of them scans the plan.
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
 * Besides, per tensor: where it is at kernel 0 in the plan's steady state
 * (`at0`, from its migrations: see compute_initial_places), which the
 * placement at iteration_begin restores, and its end in the trace, by
 * which the intermediate tensors are grouped for held_past_free.
 */
#include <stdlib.h>

#include "common/util.h"
#include "runtime/runtime_internal.h"

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
int rt_check_ssd_space(tio_engine *engine, uint64_t need, uint64_t own, bool whole_only)
{
    tio_engine_space sp;
    tio_engine_space_stats(engine, &sp);
    uint64_t have = whole_only ? sp.space_bytes : sp.free_bytes + own;
    if (need <= have)
        return 0;
    return tio_fail(-ENOSPC, "runtime: the plan keeps up to %llu bytes on SSD at once, "
                    "the engine has %llu of its %llu bytes free (create it with "
                    "space_bytes >= %llu)", (unsigned long long)need,
                    (unsigned long long)(sp.free_bytes + own), (unsigned long long)sp.space_bytes,
                    (unsigned long long)(need + sp.space_bytes - sp.free_bytes - own));
}

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
    /* A plan larger than the whole engine is refused here; one that only
     * finds too little free space is refused at the first iteration_begin,
     * once the stored copies handed over (tio_runtime_tensor_bind_stored),
     * which the runtime reuses, are counted as its own. */
    if (ssd_bytes && (rc = rt_check_ssd_space(engine, ssd_bytes, 0, true)) < 0)
        return rc;
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
    rt->ssd_need_bytes = ssd_bytes;
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
            if (rt_wait_io(rt, id, NULL) < 0)
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
