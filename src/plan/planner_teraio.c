/*
 * plan/planner_teraio.c — TIO_PLANNER_TERAIO, the default planner
 * (strategy "teraio"), called by tio_plan_build (plan.c); what it shares
 * with planner_alg1.c (channels, emitting a pair, the synchronous finish,
 * assembling the plan) it takes from plan_common.c and plan_sync.c.
 *
 * It makes Algorithm 1's greedy choice (planner_alg1.c has the reference and
 * the meaning of every quantity) without re-scoring every candidate each
 * round:
 *
 *  - Lazy re-ranking.  A candidate's score (over-capacity kernel time
 *    covered by its placement) can only fall from round to round: M' only
 *    goes down, bandwidth budgets only go down (so the walks only get
 *    longer and the covered window shorter) and host use only goes up.  So
 *    a score computed in an earlier round is an upper bound.  Candidates sit
 *    in a max-heap keyed (bound, bytes, -index) — Algorithm 1's order — and
 *    are re-scored from the top until the best exact score found beats the
 *    next bound: that candidate is the round's best, exactly as a full
 *    re-scan would find.  Under Algorithm 1's tier rule (SSD whenever it
 *    scores) a candidate's score can jump up to its host placement's when
 *    the SSD one stops scoring, so the bound is the larger of the two
 *    tiers' scores, each of which only falls; with that, the plan equals
 *    planner_alg1.c's with or without a host tier (tests/c/test_sim.c).
 *  - Bandwidth walks by prefix sums.  Each channel's per-kernel budget is a
 *    Fenwick tree, so "first kernel where the cumulative budget reaches s"
 *    is a binary descent, O(log n).  Booking drains whole kernels, found by
 *    two union-find "next/previous kernel with budget left" maps, so each
 *    kernel is drained once per channel over the whole run.
 *  - Over-capacity time by a segment tree over M' that keeps, per node, the
 *    summed duration of kernels still above capacity and the smallest M'
 *    among them: a range decrease that leaves all of them above capacity is
 *    lazy, and each kernel drops below capacity once.
 *  - Host-tier room by a max segment tree with lazy range add.
 *
 * With best_tier the planner also considers the host tier when the SSD
 * placement scores, and takes whichever covers more over-capacity time
 * (Algorithm 1 takes the SSD whenever it scores at all).
 *
 * With planned_stalls, memory still above capacity when no candidate is
 * left is not left to on-demand swapping (which moves it synchronously,
 * twice, at the SSD's speed).  The planner gives each contiguous run of
 * over-capacity kernels extra time — stall it plans to take there — as
 * bandwidth budget on every channel: the run's largest excess over the
 * write channels' bandwidth, spread over the run where kernels are too
 * short to bring in what they touch (the optimizer step's many short
 * kernels over large states), and plans again from scratch, since earlier
 * choices were made without that budget.  It keeps the attempt with the
 * lowest estimated cost (planned stall plus the time to swap what is left
 * above capacity), stopping when the plan fits, after STALL_ROUNDS
 * attempts, or when two attempts in a row cost more.  The plan file
 * carries no stall: when replayed, the migrations due at those kernels take
 * longer than the kernels between them, and the compute stream waits.  kind_mask limits
 * which tensor kinds may move (the FlashNeuron baseline moves activations
 * only).  Indices past n_kernels wrap into the next iteration, as in
 * planner_alg1.c.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "plan/plan_internal.h"

/* ---- a channel's budget: Fenwick tree + next/prev union-find --------------- */

typedef struct {
    uint32_t n;
    uint64_t *cell;   /* [n] bytes left per kernel */
    uint64_t *fen;    /* [n + 1] Fenwick tree over cell */
    uint32_t *next;   /* [n + 1] union-find: first kernel >= i with budget (n: none) */
    uint32_t *prev;   /* [n + 1] union-find over i + 1: last kernel <= i with budget, +1 */
    uint64_t total;
    int log2n;
} channel;

static void fen_add(channel *c, uint32_t i, int64_t delta)
{
    for (uint32_t x = i + 1; x <= c->n; x += x & -x)
        c->fen[x] += (uint64_t)delta;
    c->total += (uint64_t)delta;
}

static uint64_t fen_prefix(const channel *c, uint32_t x) /* sum of cells [0, x) */
{
    uint64_t s = 0;
    for (; x > 0; x -= x & -x)
        s += c->fen[x];
    return s;
}

/* Smallest x in [1, n] with prefix(x) >= t (t >= 1, t <= total). */
static uint32_t fen_lower_bound(const channel *c, uint64_t t)
{
    uint32_t pos = 0;
    for (int b = c->log2n; b >= 0; b--) {
        uint32_t nx = pos + (1u << b);
        if (nx <= c->n && c->fen[nx] < t) {
            pos = nx;
            t -= c->fen[nx];
        }
    }
    return pos + 1;
}

/* F(x): cumulative budget of unwrapped kernels [0, x), x in [0, 2n]. */
static uint64_t ch_F(const channel *c, uint64_t x)
{
    return x <= c->n ? fen_prefix(c, (uint32_t)x) : c->total + fen_prefix(c, (uint32_t)(x - c->n));
}

/* Smallest unwrapped x in [1, 2n] with F(x) >= t; 0 if none. */
static uint64_t ch_lower_bound(const channel *c, uint64_t t)
{
    if (t <= c->total)
        return fen_lower_bound(c, t);
    if (t - c->total <= c->total)
        return c->n + fen_lower_bound(c, t - c->total);
    return 0;
}

static uint32_t uf_find(uint32_t *p, uint32_t i)
{
    uint32_t r = i;
    while (p[r] != r)
        r = p[r];
    while (p[i] != r) {
        uint32_t nx = p[i];
        p[i] = r;
        i = nx;
    }
    return r;
}

static void ch_drain(channel *c, uint32_t k, uint64_t take)
{
    c->cell[k] -= take;
    fen_add(c, k, -(int64_t)take);
    if (c->cell[k] == 0) {
        c->next[k] = k + 1;  /* skip k going forward */
        c->prev[k + 1] = k;  /* slot k+1 stands for kernel k; point it below */
    }
}

/* First kernel >= k with budget left, or n. */
static uint32_t ch_next(channel *c, uint32_t k) { return uf_find(c->next, k); }

/* Last kernel <= k with budget left, or UINT32_MAX. */
static uint32_t ch_prev(channel *c, uint32_t k)
{
    uint32_t s = uf_find(c->prev, k + 1);
    return s == 0 ? UINT32_MAX : s - 1;
}

static int ch_init(channel *c, uint32_t n, double gbps, const tio_trace *trace,
                   const double *extra_ns)
{
    memset(c, 0, sizeof *c);
    c->n = n;
    c->cell = malloc(((size_t)n + 1) * sizeof *c->cell);
    c->fen = calloc((size_t)n + 1, sizeof *c->fen);
    c->next = malloc(((size_t)n + 1) * sizeof *c->next);
    c->prev = malloc(((size_t)n + 1) * sizeof *c->prev);
    if (!c->cell || !c->fen || !c->next || !c->prev)
        return -ENOMEM;
    while ((1u << (c->log2n + 1)) <= n)
        c->log2n++;
    for (uint32_t k = 0; k <= n; k++) {
        c->next[k] = k;
        c->prev[k] = k;
    }
    c->prev[0] = 0;
    for (uint32_t k = 0; k < n; k++) {
        /* 2 x the total must fit in 64 bits (ch_F over two iterations) */
        c->cell[k] = tio_plan_budget_bytes(gbps, (double)trace->kernels[k].duration_ns + extra_ns[k],
                                           TIO_PLAN_BUDGET_MAX(n));
        c->fen[k + 1] += c->cell[k];
        uint32_t up = (k + 1) + ((k + 1) & -(k + 1));
        if (up <= n)
            c->fen[up] += c->fen[k + 1];
        c->total += c->cell[k];
        if (c->cell[k] == 0) {
            c->next[k] = k + 1;
            c->prev[k + 1] = k;
        }
    }
    return 0;
}

static void ch_free(channel *c)
{
    free(c->cell);
    free(c->fen);
    free(c->next);
    free(c->prev);
}

/* Forward walk (a, b): k_off = one past the kernel where s bytes are done. */
static bool ch_walk_offload(const channel *c, uint64_t a, uint64_t b, uint64_t s, uint64_t *k_off)
{
    uint64_t x = ch_lower_bound(c, ch_F(c, a + 1) + s);
    if (x == 0 || x > b)
        return false;
    *k_off = x;
    return true;
}

/* Backward walk (a, b): k_pre = the kernel where s bytes are done counting
 * back from b - 1. */
static bool ch_walk_prefetch(const channel *c, uint64_t a, uint64_t b, uint64_t s, uint64_t *k_pre)
{
    uint64_t fb = ch_F(c, b);
    if (fb < s)
        return false;
    uint64_t x = ch_lower_bound(c, fb - s + 1);
    if (x == 0)
        return false;
    uint64_t p = x - 1;
    if (p <= a)
        return false;
    *k_pre = p;
    return true;
}

static void ch_book_offload(channel *c, uint64_t a, uint64_t s)
{
    uint64_t u = a + 1, left = s;
    while (left > 0) {
        uint32_t k = (uint32_t)(u % c->n);
        uint32_t d = ch_next(c, k);
        if (d == c->n) {
            u += c->n - k;
            continue;
        }
        u += d - k;
        uint64_t take = c->cell[d] < left ? c->cell[d] : left;
        ch_drain(c, d, take);
        left -= take;
        u++;
    }
}

static void ch_book_prefetch(channel *c, uint64_t b, uint64_t s)
{
    uint64_t u = b - 1 + c->n, left = s; /* offset keeps u >= 0 across a wrap */
    while (left > 0) {
        uint32_t k = (uint32_t)(u % c->n);
        uint32_t d = ch_prev(c, k);
        if (d == UINT32_MAX) {
            u -= (uint64_t)k + 1;
            continue;
        }
        u -= k - d;
        uint64_t take = c->cell[d] < left ? c->cell[d] : left;
        ch_drain(c, d, take);
        left -= take;
        u--;
    }
}

/* ---- over-capacity time: segment tree over M' ------------------------------ */

typedef struct {
    uint32_t n, size;
    uint64_t capacity;
    uint64_t *over_ns;   /* [2 size] summed duration of kernels above capacity */
    uint64_t *min_over;  /* [2 size] smallest M' among them (UINT64_MAX: none) */
    uint64_t *lazy;      /* [2 size] pending decrease for the subtree */
} overtree;

static void ot_pull(overtree *t, uint32_t i)
{
    t->over_ns[i] = t->over_ns[2 * i] + t->over_ns[2 * i + 1];
    uint64_t l = t->min_over[2 * i], r = t->min_over[2 * i + 1];
    t->min_over[i] = l < r ? l : r;
}

static void ot_apply(overtree *t, uint32_t i, uint64_t d)
{
    if (t->min_over[i] != UINT64_MAX)
        t->min_over[i] -= d;
    t->lazy[i] += d;
}

static void ot_push(overtree *t, uint32_t i)
{
    if (t->lazy[i]) {
        ot_apply(t, 2 * i, t->lazy[i]);
        ot_apply(t, 2 * i + 1, t->lazy[i]);
        t->lazy[i] = 0;
    }
}

static void ot_sub(overtree *t, uint32_t i, uint32_t lo, uint32_t hi, uint32_t l, uint32_t r,
                   uint64_t d)
{
    if (r <= lo || hi <= l || t->min_over[i] == UINT64_MAX)
        return;
    if (l <= lo && hi <= r && t->min_over[i] - t->capacity > d) {
        ot_apply(t, i, d);
        return;
    }
    if (hi - lo == 1) { /* a leaf that drops to capacity or below */
        t->min_over[i] = UINT64_MAX;
        t->over_ns[i] = 0;
        return;
    }
    ot_push(t, i);
    uint32_t mid = (lo + hi) / 2;
    ot_sub(t, 2 * i, lo, mid, l, r, d);
    ot_sub(t, 2 * i + 1, mid, hi, l, r, d);
    ot_pull(t, i);
}

static uint64_t ot_sum(const overtree *t, uint32_t i, uint32_t lo, uint32_t hi, uint32_t l,
                       uint32_t r)
{
    if (r <= lo || hi <= l || t->over_ns[i] == 0)
        return 0;
    if (l <= lo && hi <= r)
        return t->over_ns[i];
    uint32_t mid = (lo + hi) / 2;
    return ot_sum(t, 2 * i, lo, mid, l, r) + ot_sum(t, 2 * i + 1, mid, hi, l, r);
}

/* Call fn on the (at most two) cell ranges of unwrapped [from, to). */
#define FOR_CELL_RANGES(n, from, to, L, R, body)                                  \
    do {                                                                          \
        uint64_t f_ = (from) % (n), len_ = (to) - (from);                          \
        uint32_t L = (uint32_t)f_, R = (uint32_t)(f_ + len_ < (n) ? f_ + len_ : (n)); \
        body;                                                                     \
        if (f_ + len_ > (n)) {                                                     \
            L = 0;                                                                \
            R = (uint32_t)(f_ + len_ - (n));                                       \
            body;                                                                 \
        }                                                                         \
    } while (0)

static uint64_t ot_range_ns(const overtree *t, uint64_t from, uint64_t to)
{
    uint64_t s = 0;
    FOR_CELL_RANGES(t->n, from, to, L, R, s += ot_sum(t, 1, 0, t->size, L, R));
    return s;
}

static void ot_range_sub(overtree *t, uint64_t from, uint64_t to, uint64_t d)
{
    FOR_CELL_RANGES(t->n, from, to, L, R, ot_sub(t, 1, 0, t->size, L, R, d));
}

static int ot_init(overtree *t, const uint64_t *m, const tio_trace *trace, uint64_t capacity)
{
    memset(t, 0, sizeof *t);
    t->n = trace->n_kernels;
    t->capacity = capacity;
    t->size = 1;
    while (t->size < t->n)
        t->size *= 2;
    t->over_ns = calloc(2 * (size_t)t->size, sizeof *t->over_ns);
    t->min_over = malloc(2 * (size_t)t->size * sizeof *t->min_over);
    t->lazy = calloc(2 * (size_t)t->size, sizeof *t->lazy);
    if (!t->over_ns || !t->min_over || !t->lazy)
        return -ENOMEM;
    for (uint32_t i = 0; i < t->size; i++) {
        bool over = i < t->n && m[i] > capacity;
        t->min_over[t->size + i] = over ? m[i] : UINT64_MAX;
        t->over_ns[t->size + i] = over ? trace->kernels[i].duration_ns : 0;
    }
    for (uint32_t i = t->size - 1; i >= 1; i--)
        ot_pull(t, i);
    return 0;
}

static void ot_free(overtree *t)
{
    free(t->over_ns);
    free(t->min_over);
    free(t->lazy);
}

/* ---- host tier: max segment tree with lazy add ----------------------------- */

typedef struct {
    uint32_t n, size;
    uint64_t *max, *lazy;
} maxtree;

static void mt_add(maxtree *t, uint32_t i, uint32_t lo, uint32_t hi, uint32_t l, uint32_t r,
                   uint64_t d)
{
    if (r <= lo || hi <= l)
        return;
    if (l <= lo && hi <= r) {
        t->max[i] += d;
        t->lazy[i] += d;
        return;
    }
    uint32_t mid = (lo + hi) / 2;
    mt_add(t, 2 * i, lo, mid, l, r, d);
    mt_add(t, 2 * i + 1, mid, hi, l, r, d);
    uint64_t a = t->max[2 * i], b = t->max[2 * i + 1];
    t->max[i] = (a > b ? a : b) + t->lazy[i];
}

static uint64_t mt_max(const maxtree *t, uint32_t i, uint32_t lo, uint32_t hi, uint32_t l,
                       uint32_t r)
{
    if (r <= lo || hi <= l)
        return 0;
    if (l <= lo && hi <= r)
        return t->max[i];
    uint32_t mid = (lo + hi) / 2;
    uint64_t a = mt_max(t, 2 * i, lo, mid, l, r), b = mt_max(t, 2 * i + 1, mid, hi, l, r);
    return (a > b ? a : b) + t->lazy[i];
}

static uint64_t mt_range_max(const maxtree *t, uint64_t from, uint64_t to)
{
    uint64_t m = 0;
    FOR_CELL_RANGES(t->n, from, to, L, R, {
        uint64_t v = mt_max(t, 1, 0, t->size, L, R);
        if (v > m)
            m = v;
    });
    return m;
}

static void mt_range_add(maxtree *t, uint64_t from, uint64_t to, uint64_t d)
{
    FOR_CELL_RANGES(t->n, from, to, L, R, mt_add(t, 1, 0, t->size, L, R, d));
}

/* ---- the planner ------------------------------------------------------------ */

typedef struct {
    uint64_t score, bytes;
    uint32_t index;
} heap_item;

typedef struct {
    const tio_trace *trace;
    const tio_lifetime *lt;
    tio_plan_options opt;
    tio_plan_windows win;       /* the periods chosen, and their windows */
    double planned_stall_ns;    /* sum of the stall budget this attempt was given */
    double sync_stall_ns;       /* predicted wait of its synchronous moves */
    double gbps[TIO_CH_N];
    uint32_t n;
    uint64_t capacity, host_cap;
    channel ch[TIO_CH_N];
    overtree over;
    maxtree host;
    heap_item *heap;
    uint32_t heap_n;
    tio_plan_result res;        /* migrations, M' (res.planned) and totals */
    /* While the greedy rounds run, nothing reads res.planned (they read the
     * over-capacity tree), so a window's uncover is two entries here
     * (uint64 arithmetic wraps alike in any order), applied to res.planned
     * at once when the rounds end (planned_settle); NULL: applied as it
     * happens. */
    uint64_t *planned_delta;    /* [n + 1] */
} fast;

typedef struct {
    bool ok;
    tio_tier tier;
    uint64_t k_off, k_pre, score_ns;
} placement;

static bool heap_less(const heap_item *x, const heap_item *y) /* x ranks below y */
{
    if (x->score != y->score)
        return x->score < y->score;
    if (x->bytes != y->bytes)
        return x->bytes < y->bytes;
    return x->index > y->index;
}

static void heap_push(fast *f, heap_item it)
{
    uint32_t i = f->heap_n++;
    f->heap[i] = it;
    while (i > 0 && heap_less(&f->heap[(i - 1) / 2], &f->heap[i])) {
        heap_item t = f->heap[i];
        f->heap[i] = f->heap[(i - 1) / 2];
        f->heap[(i - 1) / 2] = t;
        i = (i - 1) / 2;
    }
}

static heap_item heap_pop(fast *f)
{
    heap_item top = f->heap[0];
    f->heap[0] = f->heap[--f->heap_n];
    uint32_t i = 0;
    for (;;) {
        uint32_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < f->heap_n && heap_less(&f->heap[m], &f->heap[l]))
            m = l;
        if (r < f->heap_n && heap_less(&f->heap[m], &f->heap[r]))
            m = r;
        if (m == i)
            break;
        heap_item t = f->heap[i];
        f->heap[i] = f->heap[m];
        f->heap[m] = t;
        i = m;
    }
    return top;
}

static placement place_on(const fast *f, const tio_inactive_period *per, int wch, int rch,
                          tio_tier tier)
{
    placement pl = {.ok = false, .tier = tier};
    uint64_t a = per->last_use, b = per->next_use, s = per->bytes;
    pl.k_pre = b; /* a tail's window runs to the free */
    if (!ch_walk_offload(&f->ch[wch], a, b, s, &pl.k_off) ||
        (tio_period_reads_back(per) && !ch_walk_prefetch(&f->ch[rch], a, b, s, &pl.k_pre)) ||
        pl.k_off >= pl.k_pre)
        return pl;
    pl.score_ns = ot_range_ns(&f->over, pl.k_off, pl.k_pre);
    pl.ok = pl.score_ns > 0;
    return pl;
}

static bool host_has_room(const fast *f, const tio_inactive_period *per)
{
    if (per->bytes > f->host_cap)
        return false;
    if (f->host.max[1] <= f->host_cap - per->bytes)
        return true; /* the most host memory in use anywhere leaves room */
    return mt_range_max(&f->host, (uint64_t)per->last_use + 1, per->next_use) <=
           f->host_cap - per->bytes;
}

/* This round's placement of `per` under the tier rule, and in *bound an
 * upper bound on its score in every later round.  Algorithm 1's rule (SSD
 * whenever the SSD placement scores, else the host tier) can raise a
 * candidate's score when its SSD placement stops scoring, so the bound is
 * the larger of the two tiers' scores, each of which only falls. */
static placement place(const fast *f, const tio_inactive_period *per, uint64_t *bound)
{
    placement ssd = place_on(f, per, TIO_CH_SSD_WRITE, TIO_CH_SSD_READ, TIO_TIER_SSD);
    placement host = {.ok = false, .tier = TIO_TIER_HOST};
    if (f->host_cap > 0 && host_has_room(f, per))
        host = place_on(f, per, TIO_CH_HOST_WRITE, TIO_CH_HOST_READ, TIO_TIER_HOST);
    uint64_t s = ssd.ok ? ssd.score_ns : 0, h = host.ok ? host.score_ns : 0;
    *bound = s > h ? s : h;
    if (ssd.ok && !f->opt.best_tier)
        return ssd;
    return host.ok && h > s ? host : ssd;
}

/* M' -= bytes over [from, to) (to - from < 2n: one wrap at most), in the
 * array, or its pending deltas, and the over-capacity tree. */
static void uncover(void *p, uint64_t from, uint64_t to, uint64_t bytes)
{
    fast *f = p;
    if (f->planned_delta) {
        for (uint64_t a = from; a < to;) {
            uint64_t base = a - a % f->n, b = to < base + f->n ? to : base + f->n;
            f->planned_delta[a - base] -= bytes;
            f->planned_delta[b - base] += bytes;
            a = b;
        }
    } else {
        for (uint64_t k = from; k < to; k++)
            f->res.planned[k % f->n] -= bytes;
    }
    ot_range_sub(&f->over, from, to, bytes);
}

/* Apply the pending deltas to res.planned; uncover applies at once after. */
static void planned_settle(fast *f)
{
    uint64_t run = 0;
    for (uint32_t k = 0; f->planned_delta && k < f->n; k++) {
        run += f->planned_delta[k];
        f->res.planned[k] += run;
    }
    free(f->planned_delta);
    f->planned_delta = NULL;
}

/* Commit period i's placement over [k_off, k_pre) on `tier`: its
 * migrations, the bandwidth it books on each channel (all of s for a
 * placement the walks found; less for a synchronous one, whose rest is
 * stall), M', the host tier. */
static int apply_booked(void *p, uint32_t i, uint64_t k_off, uint64_t k_pre, tio_tier tier,
                        uint64_t write_bytes, uint64_t read_bytes)
{
    fast *f = p;
    const tio_inactive_period *per = &f->lt->periods[i];
    uint64_t a = per->last_use, b = per->next_use, s = per->bytes;
    bool ssd = tier == TIO_TIER_SSD;
    int rc = tio_plan_choose(&f->res, &f->win, f->n, per, i, k_off, k_pre, tier);
    if (rc)
        return rc;
    ch_book_offload(&f->ch[ssd ? TIO_CH_SSD_WRITE : TIO_CH_HOST_WRITE], a, write_bytes);
    if (tio_period_reads_back(per))
        ch_book_prefetch(&f->ch[ssd ? TIO_CH_SSD_READ : TIO_CH_HOST_READ], b, read_bytes);
    uncover(f, k_off, k_pre, s);
    if (ssd) {
        f->res.bytes_to_ssd += s;
    } else {
        f->res.bytes_to_host += s;
        mt_range_add(&f->host, a + 1, b, s);
    }
    return 0;
}

static bool movable(const fast *f, const tio_inactive_period *per)
{
    uint32_t mask = f->opt.kind_mask;
    return mask == 0 || (mask >> f->trace->tensors[per->tensor].kind) & 1u;
}

/* Each round pops candidates in order of their score bounds, scoring each
 * exactly, until the best exact score found ranks above the next bound:
 * no candidate left in the heap can beat it, so it is the candidate a full
 * re-scan would pick (same order: score, then size, then earlier period).
 * The others popped go back keyed by their new bounds. */
static int fast_rounds(fast *f)
{
    const tio_lifetime *lt = f->lt;
    heap_item *popped = malloc(((size_t)lt->n_periods + 1) * sizeof *popped);
    if (!popped)
        return tio_fail(-ENOMEM, "out of memory for %u planning candidates", lt->n_periods);
    int rc = 0;
    while (f->heap_n > 0 && f->over.min_over[1] != UINT64_MAX && !rc) {
        uint32_t n_popped = 0;
        heap_item best = {0, 0, 0};
        placement best_pl = {.ok = false};
        while (f->heap_n > 0 && !(best_pl.ok && heap_less(&f->heap[0], &best))) {
            heap_item top = heap_pop(f);
            uint64_t bound;
            placement pl = place(f, &lt->periods[top.index], &bound);
            if (bound == 0)
                continue; /* no placement now, hence none later */
            heap_item now = {pl.score_ns, top.bytes, top.index};
            if (pl.ok && (!best_pl.ok || heap_less(&best, &now))) {
                best = now;
                best_pl = pl;
            }
            popped[n_popped++] = (heap_item){bound, top.bytes, top.index};
        }
        if (!best_pl.ok)
            break;
        for (uint32_t i = 0; i < n_popped; i++)
            if (popped[i].index != best.index)
                heap_push(f, popped[i]);
        uint64_t bytes = lt->periods[best.index].bytes;
        rc = apply_booked(f, best.index, best_pl.k_off, best_pl.k_pre, best_pl.tier, bytes, bytes);
    }
    free(popped);
    return rc;
}

/* Seed the heap with every movable period not chosen yet. */
static void fast_seed(fast *f)
{
    const tio_lifetime *lt = f->lt;
    f->heap_n = 0;
    for (uint32_t i = 0; i < lt->n_periods; i++) {
        if (f->win.chosen[i] || !movable(f, &lt->periods[i]))
            continue;
        uint64_t bound;
        place(f, &lt->periods[i], &bound);
        if (bound > 0)
            heap_push(f, (heap_item){bound, lt->periods[i].bytes, i});
    }
}

enum { STALL_ROUNDS = 8 };

/* Where kernel k's own duration is too short to bring in the bytes it
 * touches over the read channels (the optimizer step's many short kernels
 * over large states), the time missing; 0 elsewhere. */
static double deficit_ns(const fast *f, uint32_t k, double read_gbps)
{
    double need = (double)f->lt->active_bytes[k] / read_gbps;
    double have = (double)f->trace->kernels[k].duration_ns;
    return need > have ? need - have : 0;
}

/* Add stall time to extra_ns[] for every contiguous run of over-capacity
 * kernels of M': the run's largest excess over the write channels' summed
 * bandwidth, spread over the run in proportion to each kernel's time
 * deficit (deficit_ns), or to its excess where no kernel of the run has
 * one. */
static void add_planned_stalls(const fast *f, double *extra_ns)
{
    double write_gbps = f->gbps[TIO_CH_SSD_WRITE] + (f->host_cap ? f->gbps[TIO_CH_HOST_WRITE] : 0);
    double read_gbps = f->gbps[TIO_CH_SSD_READ] + (f->host_cap ? f->gbps[TIO_CH_HOST_READ] : 0);
    uint32_t k = 0;
    while (k < f->n) {
        if (f->res.planned[k] <= f->capacity) {
            k++;
            continue;
        }
        uint32_t end = k;
        uint64_t peak = 0;
        double sum = 0, deficit = 0;
        while (end < f->n && f->res.planned[end] > f->capacity) {
            uint64_t e = f->res.planned[end] - f->capacity;
            peak = e > peak ? e : peak;
            sum += (double)e;
            deficit += deficit_ns(f, end, read_gbps);
            end++;
        }
        double run_ns = (double)peak / write_gbps;
        for (uint32_t j = k; j < end; j++) {
            double w = deficit > 0 ? deficit_ns(f, j, read_gbps) / deficit
                                   : (double)(f->res.planned[j] - f->capacity) / sum;
            extra_ns[j] += run_ns * w;
        }
        k = end;
    }
}

/* Estimated cost of an attempt, ns: the stall it plans plus, for memory
 * left above capacity, the on-demand swapping the replay will charge (each
 * rise and fall of the excess, and once out and back an excess present at
 * every kernel, moved at the SSD's speed: src/sim/sim.c). */
static double attempt_cost(const fast *f, const double *extra_ns)
{
    double cost = 0, swap = 0;
    uint64_t floor = UINT64_MAX;
    for (uint32_t k = 0; k < f->n; k++) {
        cost += extra_ns[k];
        uint32_t p = k ? k - 1 : f->n - 1;
        uint64_t o = f->res.planned[k] > f->capacity ? f->res.planned[k] - f->capacity : 0;
        uint64_t q = f->res.planned[p] > f->capacity ? f->res.planned[p] - f->capacity : 0;
        swap += (double)(o > q ? o - q : q - o);
        floor = o < floor ? o : floor;
    }
    return cost + (swap + 2.0 * (double)floor) / f->gbps[TIO_CH_SSD_WRITE];
}

static void fast_free(fast *f)
{
    free(f->res.planned);
    free(f->planned_delta);
    for (int c = 0; c < TIO_CH_N; c++)
        ch_free(&f->ch[c]);
    ot_free(&f->over);
    free(f->host.max);
    free(f->host.lazy);
    free(f->heap);
    tio_plan_windows_free(&f->win);
    free(f->res.migrations.m);
}

static int fast_init(fast *f, const tio_trace *trace, const tio_lifetime *lt,
                     const tio_plan_options *opt, const double *extra_ns)
{
    f->trace = trace;
    f->lt = lt;
    f->n = lt->n_kernels;
    f->capacity = opt->capacity_bytes;
    f->host_cap = opt->host_cap_bytes;
    f->res.planned = malloc((size_t)f->n * sizeof *f->res.planned);
    f->planned_delta = calloc((size_t)f->n + 1, sizeof *f->planned_delta);
    f->heap = malloc(((size_t)lt->n_periods + 1) * sizeof *f->heap);
    int wrc = tio_plan_windows_init(&f->win, lt->n_periods);
    f->host.n = f->n;
    f->host.size = 1;
    while (f->host.size < f->n)
        f->host.size *= 2;
    f->host.max = calloc(2 * (size_t)f->host.size, sizeof *f->host.max);
    f->host.lazy = calloc(2 * (size_t)f->host.size, sizeof *f->host.lazy);
    if (wrc || !f->res.planned || !f->planned_delta || !f->heap || !f->host.max || !f->host.lazy)
        return tio_fail(-ENOMEM, "out of memory for planner state of %u kernels", f->n);
    memcpy(f->res.planned, lt->memory_bytes, (size_t)f->n * sizeof *f->res.planned);
    for (uint32_t k = 0; k < f->n; k++)
        f->planned_stall_ns += extra_ns[k];
    tio_plan_channel_gbps(opt, f->gbps);
    for (int c = 0; c < TIO_CH_N; c++)
        if (ch_init(&f->ch[c], f->n, f->gbps[c], trace, extra_ns))
            return tio_fail(-ENOMEM, "out of memory for planner state of %u kernels", f->n);
    if (ot_init(&f->over, f->res.planned, trace, f->capacity))
        return tio_fail(-ENOMEM, "out of memory for planner state of %u kernels", f->n);
    return 0;
}

/* ---- the synchronous finish's operations (plan_sync.c) --------------------- */

static uint64_t op_budget(void *p, int ch, uint64_t from, uint64_t to)
{
    const fast *f = p;
    return from < to ? ch_F(&f->ch[ch], to) - ch_F(&f->ch[ch], from) : 0;
}

static bool op_walk(void *p, int ch, bool offload, const tio_inactive_period *per, uint64_t *k)
{
    const fast *f = p;
    if (!offload && !tio_period_reads_back(per)) {
        *k = per->next_use; /* a tail: nothing to read */
        return true;
    }
    return (offload ? ch_walk_offload : ch_walk_prefetch)(&f->ch[ch], per->last_use,
                                                          per->next_use, per->bytes, k);
}

static bool op_host_room(void *p, const tio_inactive_period *per) { return host_has_room(p, per); }

static int sync_finish(fast *f, double *stall_ns)
{
    tio_plan_sync sy = {
        .trace = f->trace, .lt = f->lt, .capacity = f->capacity, .host_cap = f->host_cap,
        .kind_mask = f->opt.kind_mask, .gbps = f->gbps, .res = &f->res, .win = &f->win,
        .planner = f, .budget = op_budget, .walk = op_walk, .host_room = op_host_room,
        .place = apply_booked, .uncover = uncover,
    };
    return tio_plan_sync_finish(&sy, stall_ns);
}

int tio_plan_build_teraio(const tio_trace *trace, const tio_lifetime *lt,
                          const tio_plan_options *opt, uint64_t t0_ns, tio_plan **out)
{
    double *extra_ns = calloc(lt->n_kernels, sizeof *extra_ns);
    if (!extra_ns)
        return tio_fail(-ENOMEM, "out of memory for planner state of %u kernels", lt->n_kernels);
    fast f;
    double best_cost = 0;
    bool have = false;
    int rc = 0;
    for (int attempt = 0, worse = 0; !rc && attempt <= STALL_ROUNDS && worse < 2; attempt++) {
        fast g;
        memset(&g, 0, sizeof g);
        g.opt = *opt;
        rc = fast_init(&g, trace, lt, opt, extra_ns);
        if (!rc) {
            fast_seed(&g);
            rc = fast_rounds(&g);
            planned_settle(&g);
        }
        if (rc) {
            fast_free(&g);
            break;
        }
        double cost = attempt_cost(&g, extra_ns);
        bool over = g.over.min_over[1] != UINT64_MAX;
        if (over && opt->planned_stalls)
            add_planned_stalls(&g, extra_ns);
        if (over && opt->synchronous_moves) {
            rc = sync_finish(&g, &g.sync_stall_ns);
            cost = g.planned_stall_ns + g.sync_stall_ns;
        }
        if (rc) {
            fast_free(&g);
            break;
        }
        if (!have || cost < best_cost) {
            if (have)
                fast_free(&f);
            f = g;
            best_cost = cost;
            have = true;
            worse = 0;
        } else {
            fast_free(&g);
            worse++;
        }
        if (!over || !opt->planned_stalls)
            break;
    }
    free(extra_ns);
    if (rc) {
        if (have)
            fast_free(&f);
        return rc;
    }
    f.res.peak_host_bytes = mt_range_max(&f.host, 0, f.n);
    f.res.predicted_stall_ns = tio_plan_stall_ns(f.planned_stall_ns + f.sync_stall_ns);
    rc = tio_plan_assemble(&f.res, trace, f.capacity, t0_ns, out);
    fast_free(&f);
    return rc;
}
