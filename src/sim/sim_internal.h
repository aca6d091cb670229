/*
 * sim/sim_internal.h — pieces shared by the plan replay (sim.c), the
 * swapping baselines (swap.c) and the strategy table (strategy.c).
 */
#ifndef TERAIO_SIM_INTERNAL_H
#define TERAIO_SIM_INTERNAL_H

#include "teraio/sim.h"

/* Bandwidth (GB/s = bytes/ns) and latency (ns) of channel `ch`. */
double tio_sim_channel_gbps(const tio_hw *hw, int ch);
double tio_sim_latency_ns(const tio_hw *hw, int ch);

/* Zero a report and allocate its memory timeline of n kernels (0/-ENOMEM). */
int tio_sim_report_init(tio_sim_report *r, uint32_t n);

/* Store a simulated time of ns (rounded down) in *out; -ERANGE with a
 * message naming `what` when it is not below 2^64 ns (584 years) — a
 * bandwidth far too small for the trace — never a wrapped value. */
int tio_sim_store_ns(double ns, const char *what, uint64_t *out);

/* Fill ideal_ns and fraction_of_ideal from iteration_ns. */
void tio_sim_report_finish(tio_sim_report *r, const tio_trace *trace);

/* How a swapping baseline treats the tensors of one kind. */
typedef enum {
    TIO_SWAP_LRU,       /* on the device, evicted least recently used first;
                           written out on eviction while still alive */
    TIO_SWAP_HOME,      /* lives on the swap tier; fetched for use, dropped
                           (not written) when evicted; prefetched one kernel ahead */
    TIO_SWAP_STREAM,    /* sent off the device after its last GPU use */
    TIO_SWAP_CPU,       /* never on the device; kernels using it run on the CPU */
} tio_swap_policy;

typedef struct {
    tio_swap_policy policy[5];  /* per tio_tensor_kind */
    int write_ch[5], read_ch[5];/* channels per kind */
    bool cpu_step;              /* the optimizer step runs on the CPU (ZeRO) */
    bool states_on_ssd;         /* CPU step streams states from/to the SSDs */
} tio_swap_model;

/* Simulate a swapping baseline (lru, zero-offload, zero-infinity). */
int tio_sim_swap(const tio_trace *trace, const tio_lifetime *lt, const tio_hw *hw,
                 const tio_swap_model *model, tio_sim_report *out);

#endif
