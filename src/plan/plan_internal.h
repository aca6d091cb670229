/*
 * plan/plan_internal.h — what the plan module's files share, and who
 * implements it:
 *   plan.c            the entry point (tio_plan_build): checks the inputs
 *                     and calls one of the two planners declared here;
 *   planner_alg1.c    TIO_PLANNER_ALG1, Algorithm 1 (the reference);
 *   planner_teraio.c  TIO_PLANNER_TERAIO, the default planner;
 *   plan_common.c     what both planners and plan_io.c call: channel
 *                     bandwidths and budgets, emitting a pair, the
 *                     migration order, assembling and freeing a plan;
 *   plan_sync.c       the synchronous finish both planners end with.
 * Calls point one way: plan.c -> planners -> plan_common.c / plan_sync.c.
 *
 * Every plan leaves tio_plan.migrations in the one order the header
 * promises (by trigger kernel, offloads before prefetches at the same
 * kernel, then in the order they were emitted or read), so that a saved
 * plan loads back byte-for-byte identical; the ordering lives here once.
 */
#ifndef TERAIO_PLAN_INTERNAL_H
#define TERAIO_PLAN_INTERNAL_H

#include "teraio/plan.h"

/* The two planners (planner_alg1.c, planner_teraio.c), as tio_plan_build
 * calls them once it has checked the inputs (tio_plan_build documents
 * returns and semantics). */
int tio_plan_build_alg1(const tio_trace *trace, const tio_lifetime *lt,
                        const tio_plan_options *opt, uint64_t t0_ns, tio_plan **out);
int tio_plan_build_teraio(const tio_trace *trace, const tio_lifetime *lt,
                          const tio_plan_options *opt, uint64_t t0_ns, tio_plan **out);

/* Sort `n` migrations by (trigger_kernel, offload before prefetch), keeping
 * the current order among equal keys.  Returns 0 or -ENOMEM. */
int tio_plan_sort_migrations(tio_migration *m, uint32_t n);

/* Bandwidth of each channel (TIO_CH_*), GB/s = bytes per ns: the options'
 * SSD channels, and their host channels with 0 meaning "as the SSD's". */
void tio_plan_channel_gbps(const tio_plan_options *opt, double gbps[TIO_CH_N]);

/* The most bytes one kernel's budget holds in a trace of n kernels, so that
 * twice a channel's whole budget still fits in 64 bits (both planners cap
 * alike, so that they make the same plans at any bandwidth). */
#define TIO_PLAN_BUDGET_MAX(n) (UINT64_MAX / (4 * ((uint64_t)(n) + 1)))

/* Bytes a channel of `gbps` moves in `ns`, rounded down, at most `max`. */
uint64_t tio_plan_budget_bytes(double gbps, double ns, uint64_t max);

/* A growable list of migrations, as a planner emits them. */
typedef struct {
    tio_migration *m;
    uint32_t n, cap;
} tio_migration_list;

/* Append the offload/prefetch pair that takes `per`'s tensor away over
 * [k_off, k_pre) on `tier`: offload triggered at last_use + 1 and due at
 * k_off, prefetch triggered at k_pre and due at next_use (kernel indices
 * taken modulo n_kernels, as plan.h stores them).  A tail period gets the
 * offload alone (k_pre is then its next_use).  Returns 0 or -ENOMEM. */
int tio_plan_emit_pair(tio_migration_list *list, uint32_t n_kernels,
                       const tio_inactive_period *per, uint64_t k_off, uint64_t k_pre,
                       tio_tier tier);

/* What a planner hands over at the end. */
typedef struct {
    tio_migration_list migrations;
    uint64_t *planned;            /* [n_kernels] M' */
    uint64_t peak_host_bytes, bytes_to_ssd, bytes_to_host;
    uint64_t predicted_stall_ns;
} tio_plan_result;

/* A tail period's placement: its offload walk as any other's, no prefetch
 * walk: the window runs to the free (k_pre = next_use), and no read is booked. */
static inline bool tio_period_reads_back(const tio_inactive_period *per) { return !per->tail; }

/* The periods a planner chose, as the synchronous finish needs them. */
typedef struct {
    bool *chosen;                  /* [n_periods] */
    uint64_t *win_off, *win_pre;   /* [n_periods] its window [k_off, k_pre), unwrapped
                                      as the period's kernels are */
    uint32_t *pair_at;             /* [n_periods] its offload's index in the list
                                      (the prefetch follows it, but for a tail) */
} tio_plan_windows;

/* Allocate (zeroed) for n periods (plan_sync.c, as the two below): 0 or
 * -ENOMEM (free either way). */
int tio_plan_windows_init(tio_plan_windows *w, uint32_t n_periods);
void tio_plan_windows_free(tio_plan_windows *w);

/* Emit period i's offload/prefetch pair (tio_plan_emit_pair) into
 * res->migrations and record it in w.  Returns 0 or -ENOMEM. */
int tio_plan_choose(tio_plan_result *res, tio_plan_windows *w, uint32_t n_kernels,
                    const tio_inactive_period *per, uint32_t i, uint64_t k_off, uint64_t k_pre,
                    tio_tier tier);

/* The synchronous finish (plan_sync.c), over a planner's own bandwidth
 * bookkeeping through these operations.  Channels are TIO_CH_*; kernel
 * ranges are unwrapped (< 2 n_kernels). */
typedef struct {
    const tio_trace *trace;
    const tio_lifetime *lt;
    uint64_t capacity, host_cap;
    uint32_t kind_mask;
    const double *gbps;            /* [TIO_CH_N] GB/s */
    tio_plan_result *res;          /* M' (res->planned) and the migrations */
    tio_plan_windows *win;
    void *planner;                 /* handed to the operations */
    /* bytes channel ch can still move over kernels [from, to) */
    uint64_t (*budget)(void *planner, int ch, uint64_t from, uint64_t to);
    /* Algorithm 1's walk for per's bytes on channel ch (planner_alg1.c): forward
     * from the last use for an offload (*k = k_off), back from the next use
     * for a prefetch (*k = k_pre); false if they do not fit in the period */
    bool (*walk)(void *planner, int ch, bool offload, const tio_inactive_period *per,
                 uint64_t *k);
    /* host memory holds per's bytes over [last_use + 1, next_use) */
    bool (*host_room)(void *planner, const tio_inactive_period *per);
    /* choose period i over [k_off, k_pre) on `tier`, booking write_bytes
     * forward from its last use and read_bytes back from its next use */
    int (*place)(void *planner, uint32_t i, uint64_t k_off, uint64_t k_pre, tio_tier tier,
                 uint64_t write_bytes, uint64_t read_bytes);
    /* M' -= bytes over [from, to) */
    void (*uncover)(void *planner, uint64_t from, uint64_t to, uint64_t bytes);
} tio_plan_sync;

/* Move tensors synchronously until M' is within capacity wherever it can
 * be (plan_sync.c); adds the predicted stall to *stall_ns.  0 or -ENOMEM. */
int tio_plan_sync_finish(const tio_plan_sync *sy, double *stall_ns);

/* A predicted stall in ns as the plan stores it (rounded, saturated). */
uint64_t tio_plan_stall_ns(double ns);

/* Finish a planner's work: sort the migrations, move them and M' into a
 * new tio_plan with its peak, totals and the planning time since `t0_ns`.
 * On success the result's list and M' are emptied (the plan owns them); on
 * failure (-ENOMEM, or the sort's error) nothing moves. */
int tio_plan_assemble(tio_plan_result *res, const tio_trace *trace, uint64_t capacity_bytes,
                      uint64_t t0_ns, tio_plan **out);

#endif
