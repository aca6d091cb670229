/*
 * plan/plan_common.c — what both planners (planner_alg1.c, planner_teraio.c)
 * and the plan file reader (plan_io.c) share: the channel bandwidths and
 * their per-kernel budgets, emitting an offload/prefetch pair, the one
 * migration order (plan_internal.h), assembling the finished plan, and
 * freeing it.
 *
 * It sits below the planners and calls none of them: the entry point
 * (plan.c) calls the planners, and the planners call this.  Kept once so
 * that both planners round budgets, emit pairs and order migrations alike
 * (with its extensions off the teraio planner makes exactly Algorithm 1's
 * plan, tests/c/test_sim.c).
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "common/util.h"
#include "plan/plan_internal.h"

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
    if (per->tail)
        return 0; /* no next use: nothing comes back (plan.h) */
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
