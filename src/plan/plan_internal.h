/*
 * plan/plan_internal.h — what the two planners (planner.c: Algorithm 1,
 * planner_fast.c: teraio) and the plan file reader (plan_io.c) share; it
 * is implemented in plan.c, the plan object and the one entry point.
 *
 * Every plan leaves tio_plan.migrations in the one order the header
 * promises (by trigger kernel, offloads before prefetches at the same
 * kernel, then in the order they were emitted or read), so that a saved
 * plan loads back byte-for-byte identical; the ordering lives here once.
 */
#ifndef TERAIO_PLAN_INTERNAL_H
#define TERAIO_PLAN_INTERNAL_H

#include "teraio/plan.h"

/* Sort `n` migrations by (trigger_kernel, offload before prefetch), keeping
 * the current order among equal keys.  Returns 0 or -ENOMEM. */
int tio_plan_sort_migrations(tio_migration *m, uint32_t n);

/* The two planners, as tio_plan_build calls them once it has checked the
 * inputs (tio_plan_build documents returns and semantics). */
int tio_plan_build_alg1(const tio_trace *trace, const tio_lifetime *lt,
                        const tio_plan_options *opt, uint64_t t0_ns, tio_plan **out);
int tio_plan_build_teraio(const tio_trace *trace, const tio_lifetime *lt,
                          const tio_plan_options *opt, uint64_t t0_ns, tio_plan **out);

/* Bandwidth of each channel (TIO_CH_*), GB/s = bytes per ns: the options'
 * SSD channels, and their host channels with 0 meaning "as the SSD's". */
void tio_plan_channel_gbps(const tio_plan_options *opt, double gbps[TIO_CH_N]);

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
 * taken modulo n_kernels, as plan.h stores them).  Returns 0 or -ENOMEM. */
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

/* A predicted stall in ns as the plan stores it (rounded, saturated). */
uint64_t tio_plan_stall_ns(double ns);

/* Finish a planner's work: sort the migrations, move them and M' into a
 * new tio_plan with its peak, totals and the planning time since `t0_ns`.
 * On success the result's list and M' are emptied (the plan owns them); on
 * failure (-ENOMEM, or the sort's error) nothing moves. */
int tio_plan_assemble(tio_plan_result *res, const tio_trace *trace, uint64_t capacity_bytes,
                      uint64_t t0_ns, tio_plan **out);

#endif
