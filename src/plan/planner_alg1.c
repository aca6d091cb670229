/*
 * plan/planner_alg1.c — TIO_PLANNER_ALG1: TERAIO's Algorithm 1 (arXiv
 * 2506.06472, §3.3), in the faithful form DESIGN.md describes ("Planning").
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
 * stays simple enough to verify by hand.  tio_plan_build (plan.c) calls it
 * once the inputs are checked; what it shares with planner_teraio.c
 * (channels, emitting a pair, the synchronous finish, assembling the plan)
 * is in plan_common.c and plan_sync.c.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "plan/plan_internal.h"

typedef struct {
    const tio_trace *trace;
    const tio_lifetime *lt;
    uint32_t n;                    /* kernels per iteration */
    uint64_t capacity;
    uint64_t host_cap;
    uint64_t *budget[TIO_CH_N];    /* [n] bytes left per channel */
    uint64_t *prefix[TIO_CH_N];    /* [n + 1] prefix sums of budget, for the
                                      synchronous finish's range sums */
    bool prefix_stale[TIO_CH_N];   /* budget changed since prefix was summed */
    uint64_t *host;                /* [n] bytes in the host tier */
    tio_plan_result res;           /* migrations, M' (res.planned) and totals */
    tio_plan_windows win;          /* the periods chosen, and their windows */
    double gbps[TIO_CH_N];
} planner;

/* Where one candidate would go this round. */
typedef struct {
    bool ok;
    tio_tier tier;
    uint64_t k_off, k_pre;         /* unwrapped: a < k_off < k_pre < b */
    uint64_t score_ns;
} placement;

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
        if (p->res.planned[k % p->n] > p->capacity)
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
    pl.k_pre = b; /* a tail's window runs to the free */
    if (!walk_offload(p->budget[write_ch], p->n, a, b, s, false, &pl.k_off) ||
        (tio_period_reads_back(per) &&
         !walk_prefetch(p->budget[read_ch], p->n, a, b, s, false, &pl.k_pre)) ||
        pl.k_off >= pl.k_pre)
        return pl;
    pl.score_ns = over_capacity_ns(p, pl.k_off, pl.k_pre);
    pl.ok = pl.score_ns > 0;
    return pl;
}

static placement place(const planner *p, const tio_inactive_period *per)
{
    placement pl = place_on(p, per, TIO_CH_SSD_WRITE, TIO_CH_SSD_READ, TIO_TIER_SSD);
    if (pl.ok || p->host_cap == 0 || !host_has_room(p, per))
        return pl;
    return place_on(p, per, TIO_CH_HOST_WRITE, TIO_CH_HOST_READ, TIO_TIER_HOST);
}

/* Commit a placement: migrations, M', bandwidth, host tier. */
/* M' -= bytes over [from, to). */
static void uncover(void *q, uint64_t from, uint64_t to, uint64_t bytes)
{
    planner *p = q;
    for (uint64_t k = from; k < to; k++)
        p->res.planned[k % p->n] -= bytes;
}

/* Commit period i's placement over [k_off, k_pre) on `tier`: migrations,
 * M', bandwidth (write_bytes booked forward from the last use, read_bytes
 * back from the next use: all of s for a placement the walks found, less
 * for a synchronous one), host tier. */
static int apply_booked(void *q, uint32_t i, uint64_t k_off, uint64_t k_pre, tio_tier tier,
                        uint64_t write_bytes, uint64_t read_bytes)
{
    planner *p = q;
    const tio_inactive_period *per = &p->lt->periods[i];
    uint64_t a = per->last_use, b = per->next_use, s = per->bytes, unused;
    bool ssd = tier == TIO_TIER_SSD;
    int rc = tio_plan_choose(&p->res, &p->win, p->n, per, i, k_off, k_pre, tier);
    if (rc)
        return rc;
    p->prefix_stale[ssd ? TIO_CH_SSD_WRITE : TIO_CH_HOST_WRITE] = true;
    p->prefix_stale[ssd ? TIO_CH_SSD_READ : TIO_CH_HOST_READ] = true;
    walk_offload(p->budget[ssd ? TIO_CH_SSD_WRITE : TIO_CH_HOST_WRITE], p->n, a, b, write_bytes,
                 true, &unused);
    if (tio_period_reads_back(per))
        walk_prefetch(p->budget[ssd ? TIO_CH_SSD_READ : TIO_CH_HOST_READ], p->n, a, b,
                      read_bytes, true, &unused);
    uncover(p, k_off, k_pre, s);
    if (ssd) {
        p->res.bytes_to_ssd += s;
    } else {
        p->res.bytes_to_host += s;
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
    while (max_of(p->res.planned, p->n) > p->capacity) {
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
        uint64_t bytes = lt->periods[best_i].bytes;
        rc = apply_booked(p, best_i, best.k_off, best.k_pre, best.tier, bytes, bytes);
        if (rc)
            break;
    }
    free(alive);
    return rc;
}

static void planner_free(planner *p)
{
    free(p->res.planned);
    for (int c = 0; c < TIO_CH_N; c++) {
        free(p->budget[c]);
        free(p->prefix[c]);
    }
    free(p->host);
    free(p->res.migrations.m);
    tio_plan_windows_free(&p->win);
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
    p->res.planned = malloc((size_t)p->n * sizeof *p->res.planned);
    p->host = calloc(p->n, sizeof *p->host);
    bool ok = p->res.planned && p->host && !tio_plan_windows_init(&p->win, lt->n_periods);
    for (int c = 0; c < TIO_CH_N; c++) {
        ok = (p->budget[c] = malloc((size_t)p->n * sizeof *p->budget[c])) && ok;
        ok = (p->prefix[c] = calloc((size_t)p->n + 1, sizeof *p->prefix[c])) && ok;
        p->prefix_stale[c] = true;
    }
    if (!ok) {
        planner_free(p);
        return tio_fail(-ENOMEM, "out of memory for planner state of %u kernels", p->n);
    }
    tio_plan_channel_gbps(opt, p->gbps);
    for (uint32_t k = 0; k < p->n; k++) {
        p->res.planned[k] = lt->memory_bytes[k];
        for (int c = 0; c < TIO_CH_N; c++)
            p->budget[c][k] = tio_plan_budget_bytes(p->gbps[c],
                                                    (double)trace->kernels[k].duration_ns,
                                                    TIO_PLAN_BUDGET_MAX(p->n));
    }
    return 0;
}

/* ---- the synchronous finish's operations (plan_sync.c) --------------------- */

/* Budget of unwrapped kernels [0, x), x <= 2n. */
static uint64_t prefix_at(const planner *p, int ch, uint64_t x)
{
    return x <= p->n ? p->prefix[ch][x] : p->prefix[ch][p->n] + p->prefix[ch][x - p->n];
}

static uint64_t op_budget(void *q, int ch, uint64_t from, uint64_t to)
{
    planner *p = q;
    if (p->prefix_stale[ch]) {
        for (uint32_t k = 0; k < p->n; k++)
            p->prefix[ch][k + 1] = p->prefix[ch][k] + p->budget[ch][k];
        p->prefix_stale[ch] = false;
    }
    return from < to ? prefix_at(p, ch, to) - prefix_at(p, ch, from) : 0;
}

static bool op_walk(void *q, int ch, bool offload, const tio_inactive_period *per, uint64_t *k)
{
    planner *p = q;
    if (!offload && !tio_period_reads_back(per)) {
        *k = per->next_use; /* a tail: nothing to read */
        return true;
    }
    return (offload ? walk_offload : walk_prefetch)(p->budget[ch], p->n, per->last_use,
                                                    per->next_use, per->bytes, false, k);
}

static bool op_host_room(void *q, const tio_inactive_period *per) { return host_has_room(q, per); }

int tio_plan_build_alg1(const tio_trace *trace, const tio_lifetime *lt,
                        const tio_plan_options *opt, uint64_t t0_ns, tio_plan **out)
{
    planner p;
    int rc = planner_init(&p, trace, lt, opt);
    if (rc)
        return rc;
    rc = plan_rounds(&p);
    double stall_ns = 0;
    if (!rc && opt->synchronous_moves) {
        tio_plan_sync sy = {
            .trace = trace, .lt = lt, .capacity = p.capacity, .host_cap = p.host_cap,
            .gbps = p.gbps, .res = &p.res, .win = &p.win, .planner = &p,
            .budget = op_budget, .walk = op_walk, .host_room = op_host_room,
            .place = apply_booked, .uncover = uncover,
        };
        rc = tio_plan_sync_finish(&sy, &stall_ns);
    }
    if (!rc) {
        p.res.peak_host_bytes = max_of(p.host, p.n);
        p.res.predicted_stall_ns = tio_plan_stall_ns(stall_ns);
        rc = tio_plan_assemble(&p.res, trace, p.capacity, t0_ns, out);
    }
    planner_free(&p);
    return rc;
}
