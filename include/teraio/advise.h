/*
 * teraio/advise.h — before a run: what fits, how fast it trains, what a
 * token costs, on hardware one does not have yet.
 *
 * Input: the trace of one GPU's training iteration (one micro-batch forward
 * and backward, then the optimizer step) of a model that was never run — a
 * meta-device trace of real model code with roofline kernel times
 * (`python -m teraio.advise trace`, docs/advise.md) — and a list of hardware
 * points.  For each point the simulator (sim.h) replays the iteration under
 * teraio's planner, ZeRO-Infinity, ZeRO-Offload and the ideal (unlimited
 * memory); the row says whether the job fits, how long an iteration takes,
 * how many tokens a second the job trains and what a million tokens cost.
 *
 * A point runs the job data parallel on `gpus` GPUs with FSDP-style
 * sharding (tio_trace_shard): each GPU holds 1/gpus of every global tensor
 * and gradient, runs the optimizer on its shard, and trains its own
 * micro-batch.  Collective communication is not modelled (taken as
 * overlapped with compute); docs/advise.md states what that leaves out.
 *
 * Thread-safety: every function is reentrant; tio_advise_run runs its own
 * worker threads and calls `progress` from them, one call at a time.
 */
#ifndef TERAIO_ADVISE_H
#define TERAIO_ADVISE_H

#include "teraio/sim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A copy of `trace` as one of `shards` GPUs holds it under FSDP-style
 * sharding: every global tensor and every gradient has ceil(bytes / shards)
 * bytes, and every kernel from the first one that touches an optimizer
 * state onward (the optimizer step) runs duration / shards (rounded down):
 * each GPU updates its own shard.  Activations, temporaries and the
 * forward and backward kernels are unchanged.  shards == 1 copies.  *out is
 * owned by the caller (tio_trace_destroy).  Returns 0, -EINVAL (NULL
 * arguments, shards 0), -ENOMEM. */
TIO_API int tio_trace_shard(const tio_trace *trace, uint32_t shards, tio_trace **out);

/* One hardware point: per GPU except `gpus`. */
typedef struct {
    uint32_t gpus;           /* GPUs the job runs on, >= 1 */
    uint64_t capacity_bytes; /* device memory per GPU, > 0 */
    uint32_t ssd_count;      /* SSDs serving each GPU, >= 1 */
    uint64_t host_cap_bytes; /* host memory each GPU may offload to, >= 0 */
} tio_advise_point;

/* Prices, all >= 0; all 0: no costs.  SSDs and host memory are bought:
 * their price is spread over `amortize_hours` of use. */
typedef struct {
    double gpu_hour;        /* per GPU-hour */
    double ssd;             /* per SSD */
    double host_gb;         /* per GB (1e9 bytes) of host memory */
    double amortize_hours;  /* > 0 when ssd or host_gb is set */
} tio_advise_prices;

typedef struct {
    uint64_t tokens_per_iteration; /* tokens one GPU trains per traced iteration, > 0 */
    tio_advise_prices prices;
    uint32_t threads;              /* worker threads; 0: one per online CPU */
} tio_advise_options;

/* The strategies a row compares, in this order: the simulator's
 * TIO_SIM_IDEAL, TIO_SIM_TERAIO, TIO_SIM_ZERO_INFINITY, TIO_SIM_ZERO_OFFLOAD. */
enum {
    TIO_ADVISE_IDEAL = 0,
    TIO_ADVISE_TERAIO = 1,
    TIO_ADVISE_ZERO_INFINITY = 2,
    TIO_ADVISE_ZERO_OFFLOAD = 3,
    TIO_ADVISE_N_STRATEGIES = 4,
};

typedef struct {
    tio_advise_point point;
    tio_hw hw;                  /* the profile the point was simulated on */
    uint64_t peak_bytes;        /* per GPU, nothing moved (the sharded trace's peak) */
    uint64_t floor_bytes;       /* per GPU: the working-set floor (lifetime.h); no
                                   plan goes below it */
    bool fits_without_offload;  /* peak_bytes <= capacity */
    bool fits;                  /* teraio: floor <= capacity and its plan fits */
    /* Per strategy (TIO_ADVISE_*): 0, or the error its simulation returned
     * (TIO_EINFEASIBLE: the capacity is below the working-set floor, which
     * no strategy goes below, or a kernel alone needs more; -ERANGE:
     * a bandwidth far too small for the trace), or -ENOSPC for ZeRO-Offload
     * when the host cap is below zero_offload_host_bytes.  Where it is not 0 the
     * strategy's iteration_s, tokens_per_s and cost are NaN. */
    int status[TIO_ADVISE_N_STRATEGIES];
    double iteration_s[TIO_ADVISE_N_STRATEGIES];   /* simulated steady-state iteration */
    double share_of_ideal[TIO_ADVISE_N_STRATEGIES];/* ideal / iteration */
    double tokens_per_s[TIO_ADVISE_N_STRATEGIES];  /* all GPUs together */
    double usd_per_mtoken[TIO_ADVISE_N_STRATEGIES];/* NaN without prices */
    /* SSDs per GPU each strategy's time was simulated with: fewer than the
     * point has where a point of the same GPUs, device memory and host cap
     * with fewer SSDs ran faster (the simulator splits PCIe between SSD and
     * host traffic statically, so idle disks can slow host transfers; an
     * operator leaves them out).  Its price is still the point's.  0 for
     * ideal and ZeRO-Offload, which use none.  Only the sweep's own points
     * are compared: a point swept alone keeps its own time. */
    uint32_t ssds_used[TIO_ADVISE_N_STRATEGIES];
    uint64_t bytes_to_ssd;      /* teraio, per GPU and iteration */
    uint64_t bytes_to_host;     /* teraio, per GPU and iteration */
    uint64_t zero_offload_host_bytes; /* host memory ZeRO-Offload needs per GPU: the
                                   optimizer states and gradients it keeps there */
} tio_advise_row;

/* Called as points finish: `done` of `total`. */
typedef void (*tio_advise_progress_fn)(void *ctx, uint32_t done, uint32_t total);

/* Simulate every point.  `trace` is one GPU's unsharded iteration; `base`
 * gives everything a point does not: PCIe, per-SSD bandwidth and latency,
 * CPU Adam.  A point's SSD array cap is base's cap scaled by
 * ssd_count / base->ssd_count (a RAID-0 of more disks of the same kind);
 * its CPU Adam rate is base's (per GPU).  rows[i] answers points[i].
 * The trace is sharded and analysed once per distinct `gpus`.  Returns 0,
 * -EINVAL (NULL arguments, n_points 0, a point out of range, tokens 0,
 * prices negative or amortize_hours 0 with a capital price; the message
 * names the point), the errors of tio_trace_shard and
 * tio_lifetime_analyze, -ENOMEM; a strategy's simulation error is
 * the row's status, not the return value. */
TIO_API int tio_advise_run(const tio_trace *trace, const tio_hw *base,
                           const tio_advise_point *points, uint32_t n_points,
                           const tio_advise_options *opt, tio_advise_progress_fn progress,
                           void *ctx, tio_advise_row *rows);

/* The smallest hardware whose teraio row fits and reaches `target` of
 * ideal (0 < target <= 1): fewest GPUs, then least device memory, then
 * fewest SSDs, then least host memory.  Returns its index, or -1 if none. */
TIO_API int tio_advise_smallest(const tio_advise_row *rows, uint32_t n, double target);

/* Among teraio rows that fit and reach `target`, the lowest cost per
 * million tokens; -1 if none or no prices. */
TIO_API int tio_advise_cheapest(const tio_advise_row *rows, uint32_t n, double target);

#ifdef __cplusplus
}
#endif
#endif
