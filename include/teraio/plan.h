/*
 * teraio/plan.h — which tensors move where and when.
 *
 * A plan is a list of migrations: for an inactive period of a tensor, an
 * offload (device -> host or ssd) and the matching prefetch (back to the
 * device).  For a period (a, b) of a tensor of s bytes — a its last use,
 * b its next use, unwrapped so that a + 2 <= b <= a + n_kernels — a pair
 * keeps the tensor off the device over the kernels [k_off, k_pre):
 *
 *   offload   trigger_kernel  = a + 1   the write may start (the last use is
 *                                       over);
 *             deadline_kernel = k_off,  a + 1 <= k_off < b: the write is
 *                                       complete and the device memory
 *                                       released before kernel k_off runs;
 *   prefetch  trigger_kernel  = k_pre,  k_off < k_pre <= b: device memory is
 *                                       allocated and the read started;
 *             deadline_kernel = b       the read is complete before the
 *                                       tensor's next use runs.
 *
 * A tail period (lifetime.h: an intermediate held after its last use a
 * until it is freed before kernel b) has no next use, so it gets the
 * offload alone, no prefetch: the tensor stays off the device over
 * [k_off, b) and its stored copy is dropped when it dies.  A program that
 * touches it there after all has it fetched on demand (a stall; the
 * iteration has left its trace).  One still alive at the iteration's end
 * is brought back then (tio_runtime_iteration_end).
 *
 * The planned memory curve is M'[k] = M[k] - (s of every pair with
 * k in [k_off, k_pre), k_pre = b for a tail's lone offload): the bytes resident while kernel k runs, the
 * kernel's own outputs included.  What happens at kernel_begin(k), in this
 * order (the runtime and the simulator both follow it):
 *   1. offloads due at k: wait for the write, release the memory;
 *   2. prefetches due at k: wait for the read;
 *   3. offloads triggered at k start; one that is also due at k is a
 *      synchronous offload: wait for it and release its memory here;
 *   4. prefetches triggered at k allocate and start; one that is also due
 *      at k is a synchronous prefetch: wait for it here.
 * Releases come before allocations, so between two kernels the resident
 * bytes never exceed max(M'[k-1], M'[k]): a plan whose planned peak
 * (max M') is within the capacity keeps every kernel within it.
 *
 * Synchronous moves: trigger_kernel == deadline_kernel means "due at the
 * kernel that issues it", never "an iteration later" (a deadline is always
 * less than n_kernels after its trigger).  The kernel then waits for the
 * transfer: a stall the plan accepts because the kernels between the uses
 * are too short to hide the move.  A move whose deadline comes before its
 * channel can finish it (the bandwidth budget was not enough) stalls the
 * same way for the part not hidden; predicted_stall_ns sums the planner's
 * estimate of both.
 *
 * Kernel indices are stored modulo n_kernels: for a wrap-around period a
 * prefetch's trigger (or an offload's deadline) can be smaller than the
 * offload's trigger, meaning "in the next iteration".
 *
 * Two planners, one entry point (tio_plan_build, opts.planner):
 *   TIO_PLANNER_TERAIO (default) — planner_teraio.c: Algorithm 1's greedy
 *     choice found by lazy re-ranking over Fenwick and segment trees
 *     (O(log^2 kernels) a round), placing each period on whichever tier
 *     covers more over-capacity time, planning stalls where the kernels are
 *     too short for the bytes they need (optimizer steps), and finishing
 *     with synchronous moves so that the plan fits whenever the capacity is
 *     at least the largest per-kernel working set.
 *   TIO_PLANNER_ALG1 — planner_alg1.c: TERAIO's Algorithm 1 (arXiv
 *     2506.06472, section 3.3) as DESIGN.md states it, verbatim:
 *     repeatedly take the inactive period with the largest benefit/cost
 *     (sum of over-capacity kernel time it covers), book its bandwidth per
 *     kernel, SSD first and host memory (up to a cap) when the SSD channel
 *     cannot fit it, until max M' <= capacity or nothing viable is left;
 *     then, with
 *     synchronous_moves (the default), the authors' rule the paper leaves
 *     unsaid: what is still above capacity moves late, as a stall, instead
 *     of being left to on-demand swapping.  It re-scores every
 *     candidate each round, O(rounds x candidates x kernels): about cubic
 *     in the kernel count, the reference the teraio planner is checked
 *     against (tests/c/test_sim.c), not for large traces.
 *
 * Ownership: a tio_plan owns its arrays.  Read-only after creation.
 * Thread-safety: every function is reentrant; a plan may be read from
 * several threads.
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

/* The four migration channels, in the order plans and reports index them. */
enum { TIO_CH_SSD_WRITE = 0, TIO_CH_SSD_READ = 1, TIO_CH_HOST_WRITE = 2, TIO_CH_HOST_READ = 3,
       TIO_CH_N = 4 };

typedef enum { TIO_PLANNER_TERAIO = 0, TIO_PLANNER_ALG1 = 1 } tio_planner;

typedef struct {
    tio_planner planner;          /* default TIO_PLANNER_TERAIO */
    uint64_t capacity_bytes;      /* device budget for the trace's tensors (required,
                                     > 0): leave out what the runtime itself holds
                                     on the device (staging buffers and the like) */
    double ssd_read_gbps;         /* aggregate SSD read bandwidth, GB/s (1e9 B/s) */
    double ssd_write_gbps;        /* aggregate SSD write bandwidth, GB/s */
    double host_to_device_gbps;   /* host tier channel; 0 = same as ssd_read */
    double device_to_host_gbps;   /* 0 = same as ssd_write */
    uint64_t host_cap_bytes;      /* host tier cap; 0 = no host tier */
    /* The teraio planner's own rules; TIO_PLANNER_ALG1 follows Algorithm 1
     * and ignores them, except synchronous_moves.  With kind_mask 0 and
     * best_tier and planned_stalls false the teraio planner makes exactly
     * Algorithm 1's plan, with or without synchronous moves (test_sim.c). */
    uint32_t kind_mask;           /* bit (1 << tio_tensor_kind) per kind that may
                                     move; 0 = every kind */
    bool best_tier;               /* place each period on whichever tier (SSD or
                                     host) covers more over-capacity time,
                                     instead of SSD first (Algorithm 1's rule) */
    bool planned_stalls;          /* where memory stays above capacity, give the
                                     over-capacity kernels stall time as
                                     bandwidth budget and plan again
                                     (planner_teraio.c) */
    bool synchronous_moves;       /* both planners: where memory is still above
                                     capacity after the greedy rounds, move
                                     tensors synchronously (a predicted stall)
                                     until it is not (plan_sync.c): with
                                     kind_mask 0 the plan then fits whenever
                                     capacity >= lt->floor_bytes.  For
                                     Algorithm 1 this is the authors' rule of
                                     a late prefetch over swapping
                                     (docs/baselines.md); false leaves the
                                     excess, as DESIGN.md's text does */
} tio_plan_options;

/* Defaults: planner TIO_PLANNER_TERAIO, capacity 0 (must be set), SSD
 * 2.0/1.5 GB/s, host channels 0, host cap 0, kind_mask 0, best_tier,
 * planned_stalls and synchronous_moves true. */
TIO_API void tio_plan_options_default(tio_plan_options *opt);

typedef struct tio_plan {
    uint32_t n_kernels;
    uint32_t n_tensors;           /* of the trace it was built for */
    uint64_t capacity_bytes;
    uint32_t n_migrations;
    tio_migration *migrations;    /* [n_migrations] sorted by trigger_kernel */
    uint64_t *planned_memory_bytes; /* [n_kernels] M'[k]; NULL for a loaded plan
                                       until tio_plan_check fills it */
    uint64_t planned_peak_bytes;  /* max M' (0 if unknown) */
    uint64_t peak_host_bytes;     /* host tier high-water mark */
    uint64_t bytes_to_ssd, bytes_to_host; /* per iteration */
    bool fits;                    /* planned_peak_bytes <= capacity_bytes */
    double plan_seconds;          /* wall time spent planning */
    uint64_t predicted_stall_ns;  /* per iteration, the planner's estimate of the
                                     waits it accepts: planned stall budget and
                                     the part of synchronous moves no bandwidth
                                     budget hides (0 for a loaded plan: the
                                     file does not carry it;
                                     tio_sim_plan measures it) */
} tio_plan;

/* Build a plan with the planner opt->planner selects (file comment).
 * Returns 0 — check plan->fits: a plan that cannot reach capacity is still
 * returned, best effort (without synchronous_moves, or with a kind_mask;
 * with the defaults both planners always fit above the floor); -EINVAL (bad options, an unknown
 * planner, or a trace without kernels: a plan file needs at least one);
 * TIO_EINFEASIBLE when capacity < lt->floor_bytes, the working-set
 * floor (the message names it, its kernel and the capacity); -ENOMEM.
 * plan_seconds is the wall time it took. */
TIO_API int tio_plan_build(const tio_trace *trace, const tio_lifetime *lt,
                           const tio_plan_options *opt, tio_plan **out);

/* "teraio" or "alg1"; NULL if out of range. */
TIO_API const char *tio_planner_name(tio_planner planner);

/* Planner by name ("teraio", "alg1"); returns 0 or -EINVAL (message lists
 * the names). */
TIO_API int tio_planner_parse(const char *name, tio_planner *out);

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
 * is issued, at an earlier kernel); an offload with no prefetch only as an
 * intermediate's last, in its tail period.  Fills planned_memory_bytes if NULL.  Returns 0, TIO_EUNKNOWN (unknown tensor:
 * the message names it), TIO_EPARSE (inconsistent), -ENOMEM. */
TIO_API int tio_plan_check(tio_plan *plan, const tio_trace *trace, const tio_lifetime *lt);

TIO_API const char *tio_tier_name(tio_tier tier);

#ifdef __cplusplus
}
#endif
#endif
