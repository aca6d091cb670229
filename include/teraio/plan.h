/*
 * teraio/plan.h — which tensors move where and when.
 *
 * A plan is a list of migrations: for an inactive period of a tensor, an
 * offload (device -> host or ssd) and the matching prefetch (back to the
 * device).  Kernel semantics, which the runtime and the simulator follow:
 *
 *   offload:  issued at kernel_begin(trigger_kernel) (= last_use + 1); must be
 *             complete at kernel_begin(deadline_kernel) (= k_off), where the
 *             tensor's memory is released.  Not resident during [k_off, k_pre).
 *   prefetch: memory re-allocated and read issued at kernel_begin(trigger_kernel)
 *             (= k_pre); must be complete at kernel_begin(deadline_kernel)
 *             (= the next use).
 *
 * Kernel indices are stored modulo n_kernels: for a wrap-around period a
 * prefetch's trigger (or an offload's deadline) can be smaller than the
 * offload's trigger, meaning "in the next iteration".
 *
 * Planner v1 is TERAIO's Algorithm 1 (arXiv 2506.06472, §3.3) as DESIGN.md
 * states it: repeatedly take the inactive period with the largest benefit/
 * cost (sum of over-capacity kernel time it covers), book its bandwidth per
 * kernel, SSD first and host memory (up to a cap) when the SSD channel cannot
 * fit it, until max M' <= capacity or nothing viable is left.
 *
 * Ownership: a tio_plan owns its arrays.  Read-only after creation.
 */
#ifndef TERAIO_PLAN_H
#define TERAIO_PLAN_H

#include "teraio/lifetime.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TIO_PLAN_VERSION 1

typedef enum { TIO_TIER_DEVICE = 0, TIO_TIER_HOST = 1, TIO_TIER_SSD = 2 } tio_tier;
typedef enum { TIO_MIGRATION_OFFLOAD = 0, TIO_MIGRATION_PREFETCH = 1 } tio_migration_kind;

typedef struct {
    uint32_t tensor;
    tio_migration_kind kind;
    uint32_t trigger_kernel;  /* in [0, n_kernels) */
    uint32_t deadline_kernel; /* in [0, n_kernels) */
    tio_tier tier;            /* destination of an offload / source of a prefetch */
    uint64_t bytes;
} tio_migration;

typedef struct {
    uint64_t capacity_bytes;      /* device budget (required, > 0) */
    double ssd_read_gbps;         /* aggregate SSD read bandwidth, GB/s (1e9 B/s) */
    double ssd_write_gbps;        /* aggregate SSD write bandwidth, GB/s */
    double host_to_device_gbps;   /* host tier channel; 0 = same as ssd_read */
    double device_to_host_gbps;   /* 0 = same as ssd_write */
    uint64_t host_cap_bytes;      /* host tier cap; 0 = no host tier */
} tio_plan_options;

/* Defaults: capacity 0 (must be set), SSD 2.0/1.5 GB/s, host channels 0,
 * host cap 0. */
TIO_API void tio_plan_options_default(tio_plan_options *opt);

typedef struct tio_plan {
    uint32_t n_kernels;
    uint32_t n_tensors;           /* of the trace it was built for */
    uint64_t capacity_bytes;
    uint32_t n_migrations;
    tio_migration *migrations;    /* [n_migrations] sorted by trigger_kernel */
    uint64_t *planned_memory_bytes; /* [n_kernels] M'[k]; NULL for a loaded plan
                                       unless tio_plan_attach was called */
    uint64_t planned_peak_bytes;  /* max M' (0 if unknown) */
    uint64_t peak_host_bytes;     /* host tier high-water mark */
    uint64_t bytes_to_ssd, bytes_to_host; /* per iteration */
    bool fits;                    /* planned_peak_bytes <= capacity_bytes */
    double plan_seconds;          /* wall time spent planning */
} tio_plan;

/* Build a plan with planner v1 (Algorithm 1).
 * Returns 0 (check plan->fits: a plan that cannot reach capacity is still
 * returned, best effort); -EINVAL (bad options, or a trace without kernels:
 * a plan file needs at least one); TIO_EINFEASIBLE when
 * capacity < lt->max_active_bytes (the message names the kernel and its
 * need); -ENOMEM. */
TIO_API int tio_plan_build(const tio_trace *trace, const tio_lifetime *lt,
                           const tio_plan_options *opt, tio_plan **out);

/* Options of the fast planner (tio_plan_build_fast). */
typedef struct {
    uint32_t kind_mask;   /* bit (1 << tio_tensor_kind) per kind that may move;
                             0 = every kind */
    bool best_tier;       /* place each period on whichever tier (SSD or host)
                             covers more over-capacity time, instead of SSD
                             first (Algorithm 1's rule) */
    bool planned_stalls;  /* where memory stays above capacity, give the
                             over-capacity kernels stall time as bandwidth
                             budget and plan again (planner_fast.c), instead
                             of leaving the excess to on-demand swapping */
} tio_plan_fast_options;

/* Defaults: kind_mask 0 (all kinds), best_tier true, planned_stalls true. */
TIO_API void tio_plan_fast_options_default(tio_plan_fast_options *fopt);

/* Build a plan with the fast planner (strategy "teraio"): Algorithm 1's
 * greedy choice (largest over-capacity kernel time covered, then larger
 * size, then earlier period) found by lazy re-ranking — scores only fall as
 * M' and the bandwidth budgets fall, so a stale score is an upper bound and
 * only the top of a heap is re-scored — with Fenwick trees for the
 * bandwidth walks and a segment tree for the over-capacity time, so a round
 * costs O(log^2 kernels) instead of O(candidates x kernels).  With
 * fopt->best_tier it may pick the host tier where it covers more.
 * `fopt` may be NULL (defaults).  Same returns and plan semantics as
 * tio_plan_build (plan_seconds is set). */
TIO_API int tio_plan_build_fast(const tio_trace *trace, const tio_lifetime *lt,
                                const tio_plan_options *opt,
                                const tio_plan_fast_options *fopt, tio_plan **out);

TIO_API void tio_plan_destroy(tio_plan *plan);

/* Write/read the plan file (docs/formats.md, "teraio-plan" version 1).
 * Save is atomic; it returns -EINVAL for a plan the reader would refuse
 * (no valid kind/tier, kernel count outside 1 .. 2^31 - 1) and -errno of a
 * failed system call.  Load returns TIO_EPARSE/TIO_EVERSION with
 * "path:line: field ..." in tio_last_error(). */
TIO_API int tio_plan_save(const tio_plan *plan, const char *path);
TIO_API int tio_plan_load(const char *path, tio_plan **out);
TIO_API int tio_plan_parse(const char *text, size_t len, const char *origin, tio_plan **out);

/* Check a plan against the trace it is applied to: every tensor id exists,
 * kernels in range, sizes match, offload/prefetch pairs balanced, each pair
 * inside one inactive period of its tensor, and two pairs of a tensor in the
 * same period one after the other (the prefetch due before the next offload
 * is issued, at an earlier kernel).  Fills planned_memory_bytes if NULL.  Returns 0, TIO_EUNKNOWN (unknown tensor:
 * the message names it), TIO_EPARSE (inconsistent), -ENOMEM. */
TIO_API int tio_plan_check(tio_plan *plan, const tio_trace *trace, const tio_lifetime *lt);

TIO_API const char *tio_tier_name(tio_tier tier);

#ifdef __cplusplus
}
#endif
#endif
