/*
 * plan/plan_internal.h — helpers shared by the planner (planner.c) and the
 * plan file reader/writer (plan_io.c).
 *
 * Both must leave tio_plan.migrations in the one order the header promises
 * (by trigger kernel, offloads before prefetches at the same kernel, then in
 * the order they were emitted or read), so that a saved plan loads back
 * byte-for-byte identical; the ordering lives here once.
 */
#ifndef TERAIO_PLAN_INTERNAL_H
#define TERAIO_PLAN_INTERNAL_H

#include "teraio/plan.h"

/* Sort `n` migrations by (trigger_kernel, offload before prefetch), keeping
 * the current order among equal keys.  Returns 0 or -ENOMEM. */
int tio_plan_sort_migrations(tio_migration *m, uint32_t n);

/* Validate planner inputs (shared by tio_plan_build and
 * tio_plan_build_fast): returns 0, -EINVAL or TIO_EINFEASIBLE with a
 * message, exactly as tio_plan_build documents. */
int tio_plan_check_inputs(const tio_trace *trace, const tio_lifetime *lt,
                          const tio_plan_options *opt);

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

/* Finish a planner's work: sort the migrations, move them and M'
 * (`*planned`, [n_kernels]) into a new tio_plan with its peak, totals and
 * the planning time since `t0_ns`.  On success the list and *planned are
 * emptied (the plan owns them); on failure (-ENOMEM, or the sort's error)
 * nothing moves.  Shared by both planners. */
int tio_plan_assemble(tio_migration_list *list, uint64_t **planned, uint32_t n_kernels,
                      uint32_t n_tensors, uint64_t capacity_bytes, uint64_t peak_host_bytes,
                      uint64_t bytes_to_ssd, uint64_t bytes_to_host, uint64_t t0_ns,
                      tio_plan **out);

#endif
