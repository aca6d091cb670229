/*
 * sim/calibrate.c — fitting a CPU's host costs so that the simulator can
 * predict a measured iteration (the CPU demo's simulator check,
 * docs/eval.md).
 *
 * On a GPU the host runs ahead of the device and the copy engines and SSDs
 * move the bytes, so a trace's kernel times are the iteration.  On the CPU
 * demo the device is the host: each kernel also costs the framework's and
 * the offload adapter's dispatch (host_overhead_us), and each migrated byte
 * costs host work on the cores that compute (migration_host_ns_per_byte).
 * Both are fitted to two measured iterations of the same job and the third
 * is predicted:
 *
 *   E (empty plan, nothing moves): simulated = kernels + n x dispatch, so
 *     dispatch = (E - kernels) / n.  Where E ran faster than the traced
 *     kernels (the machine sped up since profiling) the kernel times are
 *     scaled down to E instead, with no dispatch.
 *   C (a calibration plan): simulated time grows with the host cost per
 *     byte, so it is found by doubling then bisection (50 steps) to match
 *     the measured C.  If C measured faster than its simulation with no
 *     host cost at all, no cost fits (-ERANGE): the machine's speed changed
 *     during the check.
 *   R (the plan to predict): simulated on the fitted profile and compared
 *     with its measured time.
 *
 * The profile is one disk at the measured bandwidths with a 100 us
 * latency, no host tier, and a link that is not the bound (the memory
 * bus).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "sim/sim_internal.h"

/* Iteration time of `plan` on hw at `capacity`, ns; < 0: an error code. */
static double simulate_ns(const tio_trace *trace, const tio_lifetime *lt, const tio_plan *plan,
                          tio_hw hw, uint64_t capacity)
{
    hw.capacity_bytes = capacity;
    tio_sim_report r;
    int rc = tio_sim_plan(trace, lt, &hw, plan, &r);
    if (rc)
        return rc;
    double ns = (double)r.iteration_ns;
    tio_sim_report_free(&r);
    return ns;
}

static bool positive(double x, double max) { return x > 0 && x <= max; }

static int check_calibration(const tio_trace *trace, const tio_sim_calibration *in)
{
    if (!in->calibration || !in->plan)
        return tio_fail(-EINVAL, "tio_sim_fit_host_costs: the calibration plan and the plan to "
                        "predict are required");
    if (in->calibration->n_kernels != trace->n_kernels || in->plan->n_kernels != trace->n_kernels)
        return tio_fail(-EINVAL, "tio_sim_fit_host_costs: the plans (%u and %u kernels) are not "
                        "of this trace (%u kernels)", in->calibration->n_kernels,
                        in->plan->n_kernels, trace->n_kernels);
    if (!positive(in->empty_s, 1e5) || !positive(in->calibration_s, 1e5) ||
        !positive(in->measured_s, 1e5))
        return tio_fail(-EINVAL, "tio_sim_fit_host_costs: measured iteration times must be in "
                        "(0, 1e5] s (empty %g, calibration %g, measured %g)", in->empty_s,
                        in->calibration_s, in->measured_s);
    if (!positive(in->ssd_read_gbps, 1e4) || !positive(in->ssd_write_gbps, 1e4))
        return tio_fail(-EINVAL, "tio_sim_fit_host_costs: measured SSD bandwidths must be in "
                        "(0, 1e4] GB/s (read %g, write %g)", in->ssd_read_gbps,
                        in->ssd_write_gbps);
    if (in->calibration_capacity_bytes == 0 || in->capacity_bytes == 0)
        return tio_fail(-EINVAL, "tio_sim_fit_host_costs: capacities must be > 0 bytes");
    return 0;
}

/* Host ns per migrated byte that makes C's simulation take cal_ns. */
static int fit_per_byte(const tio_trace *trace, const tio_lifetime *lt,
                        const tio_sim_calibration *in, tio_hw hw, double cal_ns, double *out)
{
    hw.migration_host_ns_per_byte = 0;
    double t = simulate_ns(trace, lt, in->calibration, hw, in->calibration_capacity_bytes);
    if (t < 0)
        return (int)t;
    if (t > cal_ns * 1.001)
        return tio_fail(-ERANGE, "the calibration plan's measured iteration (%.3f s) is shorter "
                        "than its simulation without host costs (%.3f s): no host cost per byte "
                        "fits; the machine's speed changed during the check, run it again",
                        cal_ns / 1e9, t / 1e9);
    *out = 0;
    if (t >= cal_ns)
        return 0;
    double lo = 0, hi = 1;
    for (;;) {
        hw.migration_host_ns_per_byte = hi;
        t = simulate_ns(trace, lt, in->calibration, hw, in->calibration_capacity_bytes);
        if (t < 0)
            return (int)t;
        if (t >= cal_ns)
            break;
        if (hi >= 1e4)
            return tio_fail(-ERANGE, "no host cost per byte up to 10 us makes the calibration "
                            "plan take its measured %.3f s", cal_ns / 1e9);
        lo = hi;
        hi *= 2;
    }
    for (int it = 0; it < 50; it++) {
        hw.migration_host_ns_per_byte = (lo + hi) / 2;
        t = simulate_ns(trace, lt, in->calibration, hw, in->calibration_capacity_bytes);
        if (t < 0)
            return (int)t;
        if (t < cal_ns)
            lo = hw.migration_host_ns_per_byte;
        else
            hi = hw.migration_host_ns_per_byte;
    }
    *out = (lo + hi) / 2;
    return 0;
}

int tio_sim_fit_host_costs(const tio_trace *trace, const tio_lifetime *lt,
                           const tio_sim_calibration *in, tio_sim_fit *out)
{
    if (!trace || !lt || !in || !out)
        return tio_fail(-EINVAL, "tio_sim_fit_host_costs: trace, lifetime, calibration and "
                        "result are required");
    memset(out, 0, sizeof *out);
    if (trace->n_kernels == 0 || lt->n_kernels != trace->n_kernels)
        return tio_fail(-EINVAL, "tio_sim_fit_host_costs: a trace with kernels and its "
                        "lifetime analysis are required");
    int rc = check_calibration(trace, in);
    if (rc)
        return rc;
    tio_hw hw = {.pcie_h2d_gbps = 1e4, .pcie_d2h_gbps = 1e4, .ssd_count = 1,
                 .ssd_read_gbps = in->ssd_read_gbps, .ssd_write_gbps = in->ssd_write_gbps,
                 .ssd_latency_us = 100, .host_latency_us = 0, .cpu_adam_params_per_s = 1e9};
    snprintf(hw.name, sizeof hw.name, "cpu-fitted");
    uint32_t n = trace->n_kernels;
    double kernels_ns = (double)tio_trace_iteration_ns(trace);
    double host_us = (in->empty_s * 1e9 - kernels_ns) / n / 1e3, scale = 1;
    /* Scaled kernel times live in a copy of the kernel table: the caller's
     * trace is not touched. */
    tio_trace scaled = *trace;
    tio_trace_kernel *kernels = NULL;
    if (host_us < 0) {
        scale = in->empty_s * 1e9 / kernels_ns;
        kernels = malloc((size_t)n * sizeof *kernels);
        if (!kernels)
            return tio_fail(-ENOMEM, "out of memory for %u kernels", n);
        for (uint32_t k = 0; k < n; k++) {
            kernels[k] = trace->kernels[k];
            kernels[k].duration_ns = (uint64_t)((double)kernels[k].duration_ns * scale + 0.5);
        }
        scaled.kernels = kernels;
        host_us = 0;
    }
    hw.host_overhead_us = host_us;
    rc = fit_per_byte(&scaled, lt, in, hw, in->calibration_s * 1e9,
                      &hw.migration_host_ns_per_byte);
    double sim_ns = rc ? 0 : simulate_ns(&scaled, lt, in->plan, hw, in->capacity_bytes);
    free(kernels);
    if (rc)
        return rc;
    if (sim_ns < 0)
        return (int)sim_ns;
    *out = (tio_sim_fit){.hw = hw, .kernel_scale = scale, .kernels_s = kernels_ns / 1e9,
                         .simulated_s = sim_ns / 1e9, .measured_s = in->measured_s,
                         .error = fabs(sim_ns / 1e9 - in->measured_s) / in->measured_s};
    return 0;
}
