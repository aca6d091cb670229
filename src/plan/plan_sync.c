/*
 * plan/plan_sync.c — finishing a plan with synchronous moves, for both
 * planners (tio_plan_options.synchronous_moves).
 *
 * Algorithm 1 drops a candidate whose offload and prefetch cannot both be
 * hidden by the bandwidth of its inactive period, and stops with memory
 * above the capacity when no candidate is left: on a real device that is
 * an out-of-memory error, in the simulator on-demand swapping.  The
 * authors' planning code (the G10 lineage, HieronZhang/G10-Artifact,
 * src/analysis.cc) instead schedules such a tensor with a late prefetch
 * whenever that costs less than swapping it, accepting the stall
 * (docs/baselines.md).  This finish does the same, after the greedy rounds:
 *
 *   for each kernel k still above capacity, in order, take the move with
 *   the least predicted stall per byte of k's excess among the periods that
 *   cover k (a < k < b):
 *     - a period not chosen yet, on the SSD or (where the host cap allows
 *       and it is no slower) in host memory: the offload uses the write
 *       budget left in [a+1, k) and is due at k if that is not enough; the
 *       prefetch uses the read budget left in [e, b), e the end of k's run
 *       of over-capacity kernels, and is triggered at e if that is not
 *       enough (a tail period has no prefetch: its window runs to its
 *       free); the bytes no budget hides are the stall;
 *     - a period chosen already whose window misses k: its offload is made
 *       due at k, or its prefetch triggered at e, synchronously (the whole
 *       transfer counts as stall);
 *   until k is within capacity.
 *
 * With every period that covers k moved, M'[k] = M[k] - (bytes of all of
 * them) <= lt->floor_bytes <= capacity, which tio_plan_build guarantees:
 * the plan fits whenever the capacity is at least the working-set floor
 * (and kind_mask lets every kind move).  Each move keeps its tensor away
 * over the whole run of over-capacity kernels, so one move serves the run.
 */
#include <errno.h>
#include <stdlib.h>

#include "plan/plan_internal.h"

/* One candidate move at an over-capacity kernel. */
typedef struct {
    bool ok, widen;          /* widen: period i was chosen; its window grows */
    uint32_t index;
    tio_tier tier;
    uint64_t k_off, k_pre;   /* the window, unwrapped as the period is */
    uint64_t write_bytes, read_bytes; /* bandwidth it books (not hidden: stall) */
    double stall_ns;         /* predicted wait: the bytes no budget hides */
} sync_move;

/* The unwrapped copy of kernel k inside (a, b), or 0 if k is not in it. */
static uint64_t inside(uint64_t k, uint32_t n, uint64_t a, uint64_t b)
{
    if (a < k && k < b)
        return k;
    return a < k + n && k + n < b ? k + n : 0;
}

/* How many kernels from k on (cyclically, at most n) are above capacity. */
static uint64_t run_length(const tio_plan_sync *sy, uint32_t k)
{
    uint32_t n = sy->lt->n_kernels, j = k + 1 < n ? k + 1 : 0;
    uint64_t len = 1;
    while (len < n && sy->res->planned[j] > sy->capacity) {
        len++;
        j = j + 1 < n ? j + 1 : 0;
    }
    return len;
}

/* Period i, not chosen yet, on one tier's channels, over ku..e. */
static sync_move place(const tio_plan_sync *sy, uint32_t i, uint64_t ku, uint64_t e, int wch,
                       int rch, tio_tier tier)
{
    const tio_inactive_period *per = &sy->lt->periods[i];
    uint64_t a = per->last_use, b = per->next_use, s = per->bytes;
    sync_move m = {.ok = true, .index = i, .tier = tier};
    uint64_t w = sy->budget(sy->planner, wch, a + 1, ku);
    uint64_t r = tio_period_reads_back(per) ? sy->budget(sy->planner, rch, e, b) : s;
    if (w < s || !sy->walk(sy->planner, wch, true, per, &m.k_off))
        m.k_off = ku;
    if (r < s || !sy->walk(sy->planner, rch, false, per, &m.k_pre))
        m.k_pre = e; /* a tail's walk gives its next use: nothing to read */
    m.write_bytes = w < s ? w : s;
    m.read_bytes = !tio_period_reads_back(per) ? 0 : r < s ? r : s;
    m.stall_ns = (double)(s - m.write_bytes) / sy->gbps[wch];
    if (tio_period_reads_back(per))
        m.stall_ns += (double)(s - m.read_bytes) / sy->gbps[rch];
    return m;
}

/* Period i, chosen already with a window that misses ku. */
static sync_move widen(const tio_plan_sync *sy, uint32_t i, uint64_t ku, uint64_t e)
{
    const tio_inactive_period *per = &sy->lt->periods[i];
    tio_tier tier = sy->res->migrations.m[sy->win->pair_at[i]].tier;
    bool ssd = tier == TIO_TIER_SSD;
    sync_move m = {.ok = true, .widen = true, .index = i, .tier = tier,
                   .k_off = sy->win->win_off[i], .k_pre = sy->win->win_pre[i]};
    if (ku < m.k_off || !tio_period_reads_back(per)) { /* a tail's window ends at its free */
        m.k_off = ku;
        m.stall_ns = (double)per->bytes / sy->gbps[ssd ? TIO_CH_SSD_WRITE : TIO_CH_HOST_WRITE];
    } else {
        m.k_pre = e;
        m.stall_ns = (double)per->bytes / sy->gbps[ssd ? TIO_CH_SSD_READ : TIO_CH_HOST_READ];
    }
    return m;
}

/* Rank: the stall per byte of the excess it removes, then the larger
 * tensor, then the earlier period. */
static bool better(const tio_plan_sync *sy, const sync_move *x, const sync_move *y,
                   uint64_t excess)
{
    if (!y->ok)
        return true;
    uint64_t sx = sy->lt->periods[x->index].bytes, sy_ = sy->lt->periods[y->index].bytes;
    double cx = x->stall_ns / (double)(sx < excess ? sx : excess);
    double cy = y->stall_ns / (double)(sy_ < excess ? sy_ : excess);
    if (cx != cy)
        return cx < cy;
    return sx != sy_ ? sx > sy_ : x->index < y->index;
}

static bool movable(const tio_plan_sync *sy, const tio_inactive_period *per)
{
    return sy->kind_mask == 0 || (sy->kind_mask >> sy->trace->tensors[per->tensor].kind) & 1u;
}

/* The periods that cover the kernel the finish is at (inside() != 0), as a
 * bitmap kept while k advances: period i covers [a+1, min(b, n) - 1] and,
 * wrapping, [0, b - n - 1]; each end toggles its bit (the two ranges never
 * meet).  toggles[at[k] .. at[k+1]) are the periods whose bit flips at k.
 * The finish then looks at the periods over k, not at all of them. */
typedef struct {
    uint64_t *bits;
    uint32_t *at, *toggles;
} cover_set;

static void cover_free(cover_set *c)
{
    free(c->bits);
    free(c->at);
    free(c->toggles);
}

/* Each range [from, to] of period i: its toggles at from and to + 1 < n,
 * counted (fill false) or placed (fill true). */
static void cover_ranges(const tio_plan_sync *sy, cover_set *c, bool fill)
{
    uint32_t n = sy->lt->n_kernels;
    for (uint32_t i = 0; i < sy->lt->n_periods; i++) {
        const tio_inactive_period *per = &sy->lt->periods[i];
        uint64_t ranges[2][2] = {{per->last_use + 1, (per->next_use < n ? per->next_use : n) - 1},
                                 {0, per->next_use > n ? per->next_use - n - 1 : 0}};
        for (int r = 0; r < 2; r++) {
            if (ranges[r][0] > ranges[r][1] || (r == 1 && per->next_use <= n))
                continue;
            uint64_t ends[2] = {ranges[r][0], ranges[r][1] + 1};
            for (int e = 0; e < 2; e++)
                if (ends[e] < n) {
                    if (fill)
                        c->toggles[c->at[ends[e]]++] = i;
                    else
                        c->at[ends[e] + 1]++;
                }
        }
    }
}

static int cover_init(const tio_plan_sync *sy, cover_set *c)
{
    uint32_t n = sy->lt->n_kernels, words = (sy->lt->n_periods + 63) / 64;
    c->bits = calloc(words ? words : 1, sizeof *c->bits);
    c->at = calloc((size_t)n + 1, sizeof *c->at);
    c->toggles = malloc(4 * ((size_t)sy->lt->n_periods + 1) * sizeof *c->toggles);
    if (!c->bits || !c->at || !c->toggles)
        return -ENOMEM;
    cover_ranges(sy, c, false);
    for (uint32_t k = 0; k < n; k++)
        c->at[k + 1] += c->at[k];
    cover_ranges(sy, c, true); /* advances at[k] to at[k + 1]: shift back */
    for (uint32_t k = n; k > 0; k--)
        c->at[k] = c->at[k - 1];
    c->at[0] = 0;
    return 0;
}

static void cover_advance(cover_set *c, uint32_t k)
{
    for (uint32_t t = c->at[k]; t < c->at[k + 1]; t++)
        c->bits[c->toggles[t] / 64] ^= 1ull << (c->toggles[t] % 64);
}

/* The cheapest move that takes a period off the device at kernel k. */
static sync_move best_move(const tio_plan_sync *sy, const cover_set *cover, uint32_t k,
                           uint64_t excess)
{
    sync_move best = {.ok = false};
    uint64_t run = run_length(sy, k);
    const tio_plan_windows *w = sy->win;
    uint32_t words = (sy->lt->n_periods + 63) / 64;
    for (uint32_t word = 0; word < words; word++)
    for (uint64_t x = cover->bits[word]; x; x &= x - 1) {
        uint32_t i = word * 64 + (uint32_t)__builtin_ctzll(x);
        const tio_inactive_period *per = &sy->lt->periods[i];
        uint64_t ku = inside(k, sy->lt->n_kernels, per->last_use, per->next_use);
        if (!ku || !movable(sy, per) || (w->chosen[i] && w->win_off[i] <= ku && ku < w->win_pre[i]))
            continue;
        uint64_t e = ku + run < per->next_use ? ku + run : per->next_use;
        sync_move m;
        if (w->chosen[i]) {
            m = widen(sy, i, ku, e);
        } else {
            m = place(sy, i, ku, e, TIO_CH_SSD_WRITE, TIO_CH_SSD_READ, TIO_TIER_SSD);
            if (sy->host_cap > 0 && sy->host_room(sy->planner, per)) {
                sync_move h = place(sy, i, ku, e, TIO_CH_HOST_WRITE, TIO_CH_HOST_READ,
                                    TIO_TIER_HOST);
                if (h.stall_ns <= m.stall_ns)
                    m = h; /* host memory where the cap allows and it is no slower */
            }
        }
        if (better(sy, &m, &best, excess))
            best = m;
    }
    return best;
}

/* Grow a chosen period's window to m's, synchronous on the side that moved. */
static void apply_widen(const tio_plan_sync *sy, const sync_move *m)
{
    tio_plan_windows *w = sy->win;
    uint32_t i = m->index, n = sy->lt->n_kernels;
    tio_migration *o = &sy->res->migrations.m[w->pair_at[i]];
    uint64_t from, to;
    if (m->k_off < w->win_off[i] || !tio_period_reads_back(&sy->lt->periods[i])) {
        from = m->k_off, to = w->win_off[i];
        o[0].deadline_kernel = (uint32_t)(m->k_off % n);
        w->win_off[i] = m->k_off;
    } else {
        from = w->win_pre[i], to = m->k_pre;
        o[1].trigger_kernel = (uint32_t)(m->k_pre % n);
        w->win_pre[i] = m->k_pre;
    }
    sy->uncover(sy->planner, from, to, sy->lt->periods[i].bytes);
}

int tio_plan_sync_finish(const tio_plan_sync *sy, double *stall_ns)
{
    cover_set cover = {0};
    int rc = cover_init(sy, &cover);
    for (uint32_t k = 0; !rc && k < sy->lt->n_kernels; k++) {
        cover_advance(&cover, k);
        while (!rc && sy->res->planned[k] > sy->capacity) {
            sync_move m = best_move(sy, &cover, k, sy->res->planned[k] - sy->capacity);
            if (!m.ok)
                break; /* kind_mask keeps what is left on the device */
            *stall_ns += m.stall_ns;
            if (m.widen)
                apply_widen(sy, &m);
            else
                rc = sy->place(sy->planner, m.index, m.k_off, m.k_pre, m.tier, m.write_bytes,
                               m.read_bytes);
        }
    }
    cover_free(&cover);
    return rc;
}

int tio_plan_windows_init(tio_plan_windows *w, uint32_t n_periods)
{
    size_t n = (size_t)n_periods + 1;
    w->chosen = calloc(n, sizeof *w->chosen);
    w->win_off = calloc(n, sizeof *w->win_off);
    w->win_pre = calloc(n, sizeof *w->win_pre);
    w->pair_at = calloc(n, sizeof *w->pair_at);
    return w->chosen && w->win_off && w->win_pre && w->pair_at ? 0 : -ENOMEM;
}

void tio_plan_windows_free(tio_plan_windows *w)
{
    free(w->chosen);
    free(w->win_off);
    free(w->win_pre);
    free(w->pair_at);
}

int tio_plan_choose(tio_plan_result *res, tio_plan_windows *w, uint32_t n_kernels,
                    const tio_inactive_period *per, uint32_t i, uint64_t k_off, uint64_t k_pre,
                    tio_tier tier)
{
    uint32_t at = res->migrations.n;
    int rc = tio_plan_emit_pair(&res->migrations, n_kernels, per, k_off, k_pre, tier);
    if (rc)
        return rc;
    w->chosen[i] = true;
    w->win_off[i] = k_off;
    w->win_pre[i] = k_pre;
    w->pair_at[i] = at;
    return 0;
}
