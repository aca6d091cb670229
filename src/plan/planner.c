/*
 * plan/planner.c — planner v1: TERAIO's Algorithm 1 (arXiv 2506.06472,
 * §3.3), in the faithful form DESIGN.md describes ("Planning").
 *
 * State, one entry per kernel k of the iteration (indices taken modulo
 * n_kernels, so a wrap-around period's kernels n..2n-1 land on 0..n-1):
 *   M'[k]        planned memory curve, starts as lt->memory_bytes;
 *   budget[c][k] bytes channel c can still move during kernel k, starting at
 *                bandwidth (GB/s = 1e9 B/s, hence bytes per ns) x duration_ns,
 *                rounded down; channels: SSD write, SSD read, device->host,
 *                host->device (a host bandwidth of 0 means "as the SSD one").
 *                The four channels are booked independently;
 *   host[k]      bytes parked in the host tier during kernel k.
 *
 * A candidate is an inactive period (tensor, last use a, next use b, size
 * s).  On a pair of channels (write, read) it is placed by two walks:
 * forward from a+1, taking min(budget, what is left) per kernel until s is
 * covered at kernel c, giving k_off = c+1 (memory released there); backward
 * from b-1 until s is covered at kernel p, giving k_pre = p (memory taken
 * back there).  It is viable iff both walks finish inside (a, b) and
 * k_off < k_pre.  Its score (benefit/cost: benefit is s times the area, cost
 * is s) is the sum of kernel durations over [k_off, k_pre) where
 * M'[k] > capacity.  Destination: SSD when that placement scores > 0, else
 * host when its channels score > 0 and host[k] + s <= host cap for every
 * kernel of [a+1, b) (offload issued to prefetch done), else nothing.
 *
 * Each round re-scores every remaining candidate and takes the best (score,
 * then larger size, then earlier in lt->periods), emits its offload and
 * prefetch, lowers M' by s over [k_off, k_pre), books the bytes each walk
 * took on each kernel, and parks s in host[] for a host placement.  It stops
 * when max M' <= capacity or no candidate scores > 0.  A candidate that has
 * no placement in some round is dropped for good: budgets and M' only go
 * down and host[] only up, so its walks can only get longer and its score
 * smaller.
 *
 * This is O(rounds x candidates x kernels) on purpose: it is the reference
 * (strategy "teraio-alg1") that faster planners are checked against, so it
 * stays simple enough to verify by hand.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "plan/plan_internal.h"

enum { CH_SSD_WRITE, CH_SSD_READ, CH_HOST_WRITE, CH_HOST_READ, N_CHANNELS };

typedef struct {
    const tio_trace *trace;
    const tio_lifetime *lt;
    uint32_t n;                    /* kernels per iteration */
    uint64_t capacity;
    uint64_t host_cap;
    uint64_t *planned;             /* [n] M' */
    uint64_t *budget[N_CHANNELS];  /* [n] bytes left per channel */
    uint64_t *host;                /* [n] bytes in the host tier */
    tio_migration_list migrations;
    uint64_t bytes_to_ssd, bytes_to_host;
} planner;

/* Where one candidate would go this round. */
typedef struct {
    bool ok;
    tio_tier tier;
    uint64_t k_off, k_pre;         /* unwrapped: a < k_off < k_pre < b */
    uint64_t score_ns;
} placement;

void tio_plan_options_default(tio_plan_options *opt)
{
    memset(opt, 0, sizeof *opt);
    opt->ssd_read_gbps = 2.0;
    opt->ssd_write_gbps = 1.5;
}

static uint64_t min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }

/* Forward walk over kernels a+1 .. b-1: *k_off = one past the kernel where
 * the channel has moved s bytes.  With `book`, consume what was taken. */
static bool walk_offload(uint64_t *budget, uint32_t n, uint64_t a, uint64_t b, uint64_t s,
                         bool book, uint64_t *k_off)
{
    uint64_t done = 0;
    for (uint64_t k = a + 1; k < b; k++) {
        uint64_t take = min_u64(budget[k % n], s - done);
        if (book)
            budget[k % n] -= take;
        done += take;
        if (done == s) {
            *k_off = k + 1;
            return true;
        }
    }
    return false;
}

/* Backward walk over kernels b-1 .. a+1: *k_pre = the kernel where the
 * channel has moved s bytes counting back from the next use. */
static bool walk_prefetch(uint64_t *budget, uint32_t n, uint64_t a, uint64_t b, uint64_t s,
                          bool book, uint64_t *k_pre)
{
    uint64_t done = 0;
    for (uint64_t k = b - 1; k > a; k--) {
        uint64_t take = min_u64(budget[k % n], s - done);
        if (book)
            budget[k % n] -= take;
        done += take;
        if (done == s) {
            *k_pre = k;
            return true;
        }
    }
    return false;
}

/* Sum of durations over [from, to) of kernels still above capacity. */
static uint64_t over_capacity_ns(const planner *p, uint64_t from, uint64_t to)
{
    uint64_t sum = 0;
    for (uint64_t k = from; k < to; k++)
        if (p->planned[k % p->n] > p->capacity)
            sum += p->trace->kernels[k % p->n].duration_ns;
    return sum;
}

static bool host_has_room(const planner *p, const tio_inactive_period *per)
{
    if (per->bytes > p->host_cap)
        return false;
    for (uint64_t k = (uint64_t)per->last_use + 1; k < per->next_use; k++)
        if (p->host[k % p->n] > p->host_cap - per->bytes)
            return false;
    return true;
}

/* Placement of `per` on one pair of channels (score 0 if not viable). */
static placement place_on(const planner *p, const tio_inactive_period *per, int write_ch,
                          int read_ch, tio_tier tier)
{
    placement pl = {.ok = false, .tier = tier};
    uint64_t a = per->last_use, b = per->next_use, s = per->bytes;
    if (!walk_offload(p->budget[write_ch], p->n, a, b, s, false, &pl.k_off) ||
        !walk_prefetch(p->budget[read_ch], p->n, a, b, s, false, &pl.k_pre) ||
        pl.k_off >= pl.k_pre)
        return pl;
    pl.score_ns = over_capacity_ns(p, pl.k_off, pl.k_pre);
    pl.ok = pl.score_ns > 0;
    return pl;
}

static placement place(const planner *p, const tio_inactive_period *per)
{
    placement pl = place_on(p, per, CH_SSD_WRITE, CH_SSD_READ, TIO_TIER_SSD);
    if (pl.ok || p->host_cap == 0 || !host_has_room(p, per))
        return pl;
    return place_on(p, per, CH_HOST_WRITE, CH_HOST_READ, TIO_TIER_HOST);
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

/* Commit a placement: migrations, M', bandwidth, host tier. */
static int apply(planner *p, const tio_inactive_period *per, const placement *pl)
{
    uint64_t a = per->last_use, b = per->next_use, s = per->bytes, unused;
    bool ssd = pl->tier == TIO_TIER_SSD;
    int rc = tio_plan_emit_pair(&p->migrations, p->n, per, pl->k_off, pl->k_pre, pl->tier);
    if (rc)
        return rc;
    walk_offload(p->budget[ssd ? CH_SSD_WRITE : CH_HOST_WRITE], p->n, a, b, s, true, &unused);
    walk_prefetch(p->budget[ssd ? CH_SSD_READ : CH_HOST_READ], p->n, a, b, s, true, &unused);
    for (uint64_t k = pl->k_off; k < pl->k_pre; k++)
        p->planned[k % p->n] -= s;
    if (ssd) {
        p->bytes_to_ssd += s;
    } else {
        p->bytes_to_host += s;
        for (uint64_t k = a + 1; k < b; k++)
            p->host[k % p->n] += s;
    }
    return 0;
}

static uint64_t max_of(const uint64_t *v, uint32_t n)
{
    uint64_t m = 0;
    for (uint32_t i = 0; i < n; i++)
        if (v[i] > m)
            m = v[i];
    return m;
}

static bool better(const placement *pl, uint64_t bytes, const placement *best,
                   uint64_t best_bytes)
{
    if (!best->ok)
        return true;
    if (pl->score_ns != best->score_ns)
        return pl->score_ns > best->score_ns;
    return bytes > best_bytes;
}

/* The rounds of Algorithm 1. */
static int plan_rounds(planner *p)
{
    const tio_lifetime *lt = p->lt;
    bool *alive = malloc(lt->n_periods ? lt->n_periods : 1);
    if (!alive)
        return tio_fail(-ENOMEM, "out of memory for %u planning candidates", lt->n_periods);
    memset(alive, 1, lt->n_periods);
    int rc = 0;
    while (max_of(p->planned, p->n) > p->capacity) {
        placement best = {.ok = false};
        uint32_t best_i = 0;
        for (uint32_t i = 0; i < lt->n_periods; i++) {
            if (!alive[i])
                continue;
            placement pl = place(p, &lt->periods[i]);
            if (!pl.ok) {
                alive[i] = false;
                continue;
            }
            if (better(&pl, lt->periods[i].bytes, &best, lt->periods[best_i].bytes)) {
                best = pl;
                best_i = i;
            }
        }
        if (!best.ok)
            break;
        alive[best_i] = false;
        rc = apply(p, &lt->periods[best_i], &best);
        if (rc)
            break;
    }
    free(alive);
    return rc;
}

static uint64_t budget_bytes(double gbps, uint64_t duration_ns)
{
    double b = floor(gbps * (double)duration_ns);
    return b >= 18446744073709551615.0 ? UINT64_MAX : (uint64_t)b;
}

int tio_plan_check_inputs(const tio_trace *trace, const tio_lifetime *lt,
                          const tio_plan_options *opt)
{
    if (!trace || !lt || !opt)
        return tio_fail(-EINVAL, "tio_plan_build: trace, lifetime and options are required");
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
    if (opt->capacity_bytes < lt->max_active_bytes) {
        uint32_t k = 0;
        while (k + 1 < lt->n_kernels && lt->active_bytes[k] != lt->max_active_bytes)
            k++;
        char cap[32], need[32];
        return tio_fail(TIO_EINFEASIBLE, "capacity %s is below kernel %u (%s)'s need of %s",
                        tio_format_bytes(opt->capacity_bytes, cap), k,
                        trace->kernels[k].name, tio_format_bytes(lt->max_active_bytes, need));
    }
    return 0;
}

static void planner_free(planner *p)
{
    free(p->planned);
    for (int c = 0; c < N_CHANNELS; c++)
        free(p->budget[c]);
    free(p->host);
    free(p->migrations.m);
}

static int planner_init(planner *p, const tio_trace *trace, const tio_lifetime *lt,
                        const tio_plan_options *opt)
{
    memset(p, 0, sizeof *p);
    p->trace = trace;
    p->lt = lt;
    p->n = lt->n_kernels;
    p->capacity = opt->capacity_bytes;
    p->host_cap = opt->host_cap_bytes;
    size_t cells = p->n ? p->n : 1;
    p->planned = malloc(cells * sizeof *p->planned);
    p->host = calloc(cells, sizeof *p->host);
    for (int c = 0; c < N_CHANNELS; c++)
        p->budget[c] = malloc(cells * sizeof *p->budget[c]);
    bool ok = p->planned && p->host;
    for (int c = 0; c < N_CHANNELS; c++)
        ok = ok && p->budget[c];
    if (!ok) {
        planner_free(p);
        return tio_fail(-ENOMEM, "out of memory for planner state of %u kernels", p->n);
    }
    double gbps[N_CHANNELS] = {
        [CH_SSD_WRITE] = opt->ssd_write_gbps,
        [CH_SSD_READ] = opt->ssd_read_gbps,
        [CH_HOST_WRITE] = opt->device_to_host_gbps > 0 ? opt->device_to_host_gbps
                                                        : opt->ssd_write_gbps,
        [CH_HOST_READ] = opt->host_to_device_gbps > 0 ? opt->host_to_device_gbps
                                                       : opt->ssd_read_gbps,
    };
    for (uint32_t k = 0; k < p->n; k++) {
        p->planned[k] = lt->memory_bytes[k];
        for (int c = 0; c < N_CHANNELS; c++)
            p->budget[c][k] = budget_bytes(gbps[c], trace->kernels[k].duration_ns);
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
    int rc = tio_plan_check_inputs(trace, lt, opt);
    if (rc)
        return rc;
    planner p;
    rc = planner_init(&p, trace, lt, opt);
    if (rc)
        return rc;
    rc = plan_rounds(&p);
    if (!rc)
        rc = tio_plan_assemble(&p.migrations, &p.planned, p.n, trace->n_tensors, p.capacity,
                               max_of(p.host, p.n), p.bytes_to_ssd, p.bytes_to_host, t0, out);
    planner_free(&p);
    return rc;
}

int tio_plan_assemble(tio_migration_list *list, uint64_t **planned, uint32_t n_kernels,
                      uint32_t n_tensors, uint64_t capacity_bytes, uint64_t peak_host_bytes,
                      uint64_t bytes_to_ssd, uint64_t bytes_to_host, uint64_t t0_ns,
                      tio_plan **out)
{
    int rc = tio_plan_sort_migrations(list->m, list->n);
    if (rc)
        return rc;
    tio_plan *plan = calloc(1, sizeof *plan);
    if (!plan)
        return tio_fail(-ENOMEM, "out of memory for the plan");
    plan->n_kernels = n_kernels;
    plan->n_tensors = n_tensors;
    plan->capacity_bytes = capacity_bytes;
    plan->n_migrations = list->n;
    plan->migrations = list->m;
    plan->planned_memory_bytes = *planned;
    plan->planned_peak_bytes = max_of(*planned, n_kernels);
    plan->peak_host_bytes = peak_host_bytes;
    plan->bytes_to_ssd = bytes_to_ssd;
    plan->bytes_to_host = bytes_to_host;
    plan->fits = plan->planned_peak_bytes <= capacity_bytes;
    plan->plan_seconds = (double)(tio_now_ns() - t0_ns) / 1e9;
    *list = (tio_migration_list){0};
    *planned = NULL;
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
