/*
 * plan/plan.c — the plan object and the one planner entry point.
 *
 * tio_plan_build checks its inputs once and hands them to the planner
 * opts.planner names: planner_fast.c (TIO_PLANNER_TERAIO, the default) or
 * planner.c (TIO_PLANNER_ALG1, the faithful Algorithm 1).  What both share
 * lives here: the options' defaults, the channel bandwidths, emitting an
 * offload/prefetch pair, the one migration order (plan_internal.h) and
 * assembling the finished plan.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "plan/plan_internal.h"

static const char *const PLANNER_NAMES[] = {
    [TIO_PLANNER_TERAIO] = "teraio",
    [TIO_PLANNER_ALG1] = "alg1",
};

void tio_plan_options_default(tio_plan_options *opt)
{
    memset(opt, 0, sizeof *opt);
    opt->planner = TIO_PLANNER_TERAIO;
    opt->ssd_read_gbps = 2.0;
    opt->ssd_write_gbps = 1.5;
    opt->best_tier = true;
    opt->planned_stalls = true;
    opt->synchronous_moves = true;
}

const char *tio_planner_name(tio_planner planner)
{
    return (unsigned)planner <= TIO_PLANNER_ALG1 ? PLANNER_NAMES[planner] : NULL;
}

int tio_planner_parse(const char *name, tio_planner *out)
{
    for (unsigned i = 0; name && i <= TIO_PLANNER_ALG1; i++)
        if (!strcmp(name, PLANNER_NAMES[i])) {
            *out = (tio_planner)i;
            return 0;
        }
    return tio_fail(-EINVAL, "unknown planner '%s' (teraio, alg1)", name ? name : "");
}

void tio_plan_channel_gbps(const tio_plan_options *opt, double gbps[TIO_CH_N])
{
    gbps[TIO_CH_SSD_WRITE] = opt->ssd_write_gbps;
    gbps[TIO_CH_SSD_READ] = opt->ssd_read_gbps;
    gbps[TIO_CH_HOST_WRITE] = opt->device_to_host_gbps > 0 ? opt->device_to_host_gbps
                                                           : opt->ssd_write_gbps;
    gbps[TIO_CH_HOST_READ] = opt->host_to_device_gbps > 0 ? opt->host_to_device_gbps
                                                          : opt->ssd_read_gbps;
}

uint64_t tio_plan_budget_bytes(double gbps, double ns, uint64_t max)
{
    double b = floor(gbps * ns);
    return b >= (double)max ? max : (uint64_t)b;
}

uint64_t tio_plan_stall_ns(double ns)
{
    return tio_plan_budget_bytes(1.0, ns + 0.5, UINT64_MAX);
}

/* The checks both planners rely on; the messages are tio_plan_build's. */
static int check_inputs(const tio_trace *trace, const tio_lifetime *lt,
                        const tio_plan_options *opt)
{
    if (!trace || !lt || !opt)
        return tio_fail(-EINVAL, "tio_plan_build: trace, lifetime and options are required");
    if (!tio_planner_name(opt->planner))
        return tio_fail(-EINVAL, "tio_plan_build: unknown planner %d (TIO_PLANNER_TERAIO, "
                        "TIO_PLANNER_ALG1)", (int)opt->planner);
    if (lt->n_kernels != trace->n_kernels || lt->n_tensors != trace->n_tensors)
        return tio_fail(-EINVAL, "lifetime analysis (%u kernels, %u tensors) is not of this "
                        "trace (%u kernels, %u tensors)", lt->n_kernels, lt->n_tensors,
                        trace->n_kernels, trace->n_tensors);
    if (trace->n_kernels == 0)
        return tio_fail(-EINVAL, "the trace has no kernels: there is nothing to plan");
    if (opt->capacity_bytes == 0)
        return tio_fail(-EINVAL, "capacity must be > 0 bytes");
    if (!(opt->ssd_read_gbps > 0) || !isfinite(opt->ssd_read_gbps) ||
        !(opt->ssd_write_gbps > 0) || !isfinite(opt->ssd_write_gbps))
        return tio_fail(-EINVAL, "SSD bandwidths must be finite and > 0 GB/s (read %g, write %g)",
                        opt->ssd_read_gbps, opt->ssd_write_gbps);
    if (!(opt->host_to_device_gbps >= 0) || !isfinite(opt->host_to_device_gbps) ||
        !(opt->device_to_host_gbps >= 0) || !isfinite(opt->device_to_host_gbps))
        return tio_fail(-EINVAL, "host channel bandwidths must be finite and >= 0 GB/s");
    for (uint32_t i = 0; i < lt->n_periods; i++) {
        const tio_inactive_period *per = &lt->periods[i];
        if (per->tensor >= trace->n_tensors || per->last_use >= lt->n_kernels ||
            per->next_use < (uint64_t)per->last_use + 2 ||
            per->next_use > (uint64_t)per->last_use + lt->n_kernels || per->bytes == 0)
            return tio_fail(-EINVAL, "inactive period %u (tensor %u, kernels %u..%u) is "
                            "malformed", i, per->tensor, per->last_use, per->next_use);
    }
    if (opt->capacity_bytes < lt->floor_bytes) {
        uint32_t k = lt->floor_kernel;
        char cap[32], need[32], held[32];
        tio_format_bytes(opt->capacity_bytes, cap);
        tio_format_bytes(lt->floor_bytes, need);
        if (!strcmp(cap, need)) { /* rounded alike: the exact counts */
            snprintf(cap, sizeof cap, "%llu B", (unsigned long long)opt->capacity_bytes);
            snprintf(need, sizeof need, "%llu B", (unsigned long long)lt->floor_bytes);
        }
        uint64_t held_bytes = lt->floor_bytes - lt->active_bytes[k];
        if (held_bytes == 0)
            return tio_fail(TIO_EINFEASIBLE, "capacity %s is below kernel %u (%s)'s need of %s, "
                            "the working-set floor: no plan fits below it",
                            cap, k, trace->kernels[k].name, need);
        return tio_fail(TIO_EINFEASIBLE, "capacity %s is below kernel %u (%s)'s need of %s, the "
                        "working-set floor: what it accesses and %s held there by tensors with "
                        "no later use before they are freed; no plan fits below it",
                        cap, k, trace->kernels[k].name, need,
                        tio_format_bytes(held_bytes, held));
    }
    return 0;
}

int tio_plan_build(const tio_trace *trace, const tio_lifetime *lt,
                   const tio_plan_options *opt, tio_plan **out)
{
    if (!out)
        return tio_fail(-EINVAL, "tio_plan_build: out is NULL");
    *out = NULL;
    uint64_t t0 = tio_now_ns();
    int rc = check_inputs(trace, lt, opt);
    if (rc)
        return rc;
    return opt->planner == TIO_PLANNER_ALG1 ? tio_plan_build_alg1(trace, lt, opt, t0, out)
                                            : tio_plan_build_teraio(trace, lt, opt, t0, out);
}

int tio_plan_emit_pair(tio_migration_list *list, uint32_t n_kernels,
                       const tio_inactive_period *per, uint64_t k_off, uint64_t k_pre,
                       tio_tier tier)
{
    int rc = tio_grow((void **)&list->m, &list->cap, list->n + 2, sizeof *list->m);
    if (rc)
        return rc;
    list->m[list->n++] = (tio_migration){
        .tensor = per->tensor,
        .kind = TIO_MIGRATION_OFFLOAD,
        .trigger_kernel = (uint32_t)((per->last_use + 1ull) % n_kernels),
        .deadline_kernel = (uint32_t)(k_off % n_kernels),
        .tier = tier,
        .bytes = per->bytes,
    };
    list->m[list->n++] = (tio_migration){
        .tensor = per->tensor,
        .kind = TIO_MIGRATION_PREFETCH,
        .trigger_kernel = (uint32_t)(k_pre % n_kernels),
        .deadline_kernel = (uint32_t)(per->next_use % n_kernels),
        .tier = tier,
        .bytes = per->bytes,
    };
    return 0;
}

typedef struct {
    tio_migration m;
    uint32_t seq;
} seq_migration;

static int cmp_trigger(const void *x, const void *y)
{
    const seq_migration *a = x, *b = y;
    if (a->m.trigger_kernel != b->m.trigger_kernel)
        return a->m.trigger_kernel < b->m.trigger_kernel ? -1 : 1;
    if (a->m.kind != b->m.kind)
        return a->m.kind == TIO_MIGRATION_OFFLOAD ? -1 : 1;
    return a->seq < b->seq ? -1 : a->seq > b->seq;
}

int tio_plan_sort_migrations(tio_migration *m, uint32_t n)
{
    if (n < 2)
        return 0;
    seq_migration *tmp = malloc((size_t)n * sizeof *tmp);
    if (!tmp)
        return tio_fail(-ENOMEM, "out of memory sorting %u migrations", n);
    for (uint32_t i = 0; i < n; i++)
        tmp[i] = (seq_migration){m[i], i};
    qsort(tmp, n, sizeof *tmp, cmp_trigger);
    for (uint32_t i = 0; i < n; i++)
        m[i] = tmp[i].m;
    free(tmp);
    return 0;
}

int tio_plan_assemble(tio_plan_result *res, const tio_trace *trace, uint64_t capacity_bytes,
                      uint64_t t0_ns, tio_plan **out)
{
    int rc = tio_plan_sort_migrations(res->migrations.m, res->migrations.n);
    if (rc)
        return rc;
    tio_plan *plan = calloc(1, sizeof *plan);
    if (!plan)
        return tio_fail(-ENOMEM, "out of memory for the plan");
    plan->n_kernels = trace->n_kernels;
    plan->n_tensors = trace->n_tensors;
    plan->capacity_bytes = capacity_bytes;
    plan->n_migrations = res->migrations.n;
    plan->migrations = res->migrations.m;
    plan->planned_memory_bytes = res->planned;
    for (uint32_t k = 0; k < trace->n_kernels; k++)
        if (res->planned[k] > plan->planned_peak_bytes)
            plan->planned_peak_bytes = res->planned[k];
    plan->peak_host_bytes = res->peak_host_bytes;
    plan->bytes_to_ssd = res->bytes_to_ssd;
    plan->bytes_to_host = res->bytes_to_host;
    plan->predicted_stall_ns = res->predicted_stall_ns;
    plan->fits = plan->planned_peak_bytes <= capacity_bytes;
    plan->plan_seconds = (double)(tio_now_ns() - t0_ns) / 1e9;
    res->migrations = (tio_migration_list){0};
    res->planned = NULL;
    *out = plan;
    return 0;
}

void tio_plan_destroy(tio_plan *plan)
{
    if (!plan)
        return;
    free(plan->migrations);
    free(plan->planned_memory_bytes);
    free(plan);
}
