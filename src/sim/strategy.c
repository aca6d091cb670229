/*
 * sim/strategy.c — the strategies `teraio eval` compares, by name, and how
 * each one is run: planned strategies build a plan and replay it
 * (sim.c); swapping baselines run their own model (swap.c).  The models
 * and their assumptions are written up in docs/baselines.md.
 */
#include <errno.h>
#include <string.h>

#include "common/util.h"
#include "sim/sim_internal.h"

static const char *const NAMES[TIO_SIM_N_STRATEGIES] = {
    [TIO_SIM_IDEAL] = "ideal",
    [TIO_SIM_TERAIO_ALG1] = "teraio-alg1",
    [TIO_SIM_TERAIO] = "teraio",
    [TIO_SIM_ZERO_OFFLOAD] = "zero-offload",
    [TIO_SIM_ZERO_INFINITY] = "zero-infinity",
    [TIO_SIM_FLASHNEURON] = "flashneuron",
    [TIO_SIM_LRU] = "lru",
};

const char *tio_sim_strategy_name(tio_sim_strategy s)
{
    return (unsigned)s < TIO_SIM_N_STRATEGIES ? NAMES[s] : NULL;
}

int tio_sim_strategy_parse(const char *name, tio_sim_strategy *out)
{
    for (int i = 0; name && i < TIO_SIM_N_STRATEGIES; i++)
        if (!strcmp(name, NAMES[i])) {
            *out = (tio_sim_strategy)i;
            return 0;
        }
    return tio_fail(-EINVAL, "unknown strategy '%s' (ideal, teraio-alg1, teraio, zero-offload, "
                    "zero-infinity, flashneuron, lru)", name ? name : "");
}

/* The ideal: unlimited memory, the same kernels back to back. */
static int run_ideal(const tio_trace *trace, const tio_lifetime *lt, tio_sim_report *out)
{
    int rc = tio_sim_report_init(out, trace->n_kernels);
    if (rc)
        return rc;
    for (uint32_t k = 0; k < trace->n_kernels; k++)
        out->memory_bytes[k] = lt->memory_bytes[k];
    out->peak_bytes = lt->peak_bytes;
    out->iteration_ns = tio_trace_iteration_ns(trace);
    tio_sim_report_finish(out, trace);
    return 0;
}

static void swap_model(tio_sim_strategy s, tio_swap_model *m)
{
    memset(m, 0, sizeof *m);
    for (int k = 0; k < 5; k++) {
        m->policy[k] = TIO_SWAP_LRU;
        m->write_ch[k] = TIO_CH_SSD_WRITE;
        m->read_ch[k] = TIO_CH_SSD_READ;
    }
    if (s == TIO_SIM_LRU)
        return;
    /* ZeRO: optimizer states live with the CPU, gradients stream to host
     * memory after their last use, the Adam update runs on the CPU;
     * activations that do not fit are swapped to host memory. */
    m->cpu_step = true;
    m->policy[TIO_KIND_OPTIMIZER_STATE] = TIO_SWAP_CPU;
    m->policy[TIO_KIND_GRADIENT] = TIO_SWAP_STREAM;
    for (int k = 0; k < 5; k++) {
        m->write_ch[k] = TIO_CH_HOST_WRITE;
        m->read_ch[k] = TIO_CH_HOST_READ;
    }
    if (s == TIO_SIM_ZERO_INFINITY) {
        /* ZeRO-Infinity: parameters' home is NVMe, fetched layer by layer
         * ahead of use; optimizer states on NVMe, streamed through the CPU
         * update. */
        m->policy[TIO_KIND_PARAMETER] = TIO_SWAP_HOME;
        m->read_ch[TIO_KIND_PARAMETER] = TIO_CH_SSD_READ;
        m->write_ch[TIO_KIND_PARAMETER] = TIO_CH_SSD_WRITE;
        m->states_on_ssd = true;
    }
}

int tio_sim_run(const tio_trace *trace, const tio_lifetime *lt, const tio_hw *hw,
                tio_sim_strategy strategy, tio_sim_report *out, tio_plan **plan_out)
{
    if (plan_out)
        *plan_out = NULL;
    if (!trace || !lt || !hw || !out)
        return tio_fail(-EINVAL, "tio_sim_run: trace, lifetime, profile and report are required");
    memset(out, 0, sizeof *out);
    if (trace->n_kernels == 0)
        return tio_fail(-EINVAL, "the trace has no kernels: there is nothing to simulate");
    if (lt->n_kernels != trace->n_kernels)
        return tio_fail(-EINVAL, "tio_sim_run: the lifetime analysis is not of this trace");
    if ((unsigned)strategy >= TIO_SIM_N_STRATEGIES)
        return tio_fail(-EINVAL, "tio_sim_run: strategy %d out of range", (int)strategy);
    if (strategy == TIO_SIM_IDEAL)
        return run_ideal(trace, lt, out);
    if (strategy == TIO_SIM_LRU || strategy == TIO_SIM_ZERO_OFFLOAD ||
        strategy == TIO_SIM_ZERO_INFINITY) {
        tio_swap_model m;
        swap_model(strategy, &m);
        return tio_sim_swap(trace, lt, hw, &m, out);
    }
    tio_plan_options opt;
    tio_hw_plan_options(hw, &opt);
    if (strategy == TIO_SIM_TERAIO_ALG1) {
        /* Algorithm 1's rules (with the authors' synchronous finish, the
         * default: docs/baselines.md) on the teraio planner's data
         * structures: the same plan as TIO_PLANNER_ALG1 (tests/c/test_sim.c),
         * in O(log^2 kernels) a round instead of O(candidates x kernels). */
        opt.best_tier = false;
        opt.planned_stalls = false;
    } else if (strategy == TIO_SIM_FLASHNEURON) {
        /* activations only, SSD only, and none of teraio's synchronous moves:
         * FlashNeuron leaves what it cannot hide to on-demand swapping */
        opt.kind_mask = 1u << TIO_KIND_ACTIVATION;
        opt.host_cap_bytes = 0;
        opt.synchronous_moves = false;
    }
    tio_plan *plan = NULL;
    int rc = tio_plan_build(trace, lt, &opt, &plan);
    if (!rc)
        rc = tio_sim_plan(trace, lt, hw, plan, out);
    if (!rc && plan_out)
        *plan_out = plan;
    else
        tio_plan_destroy(plan);
    return rc;
}
