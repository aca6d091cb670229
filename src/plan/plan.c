/*
 * plan/plan.c — the one planner entry point: the options' defaults, the
 * planners' names, and tio_plan_build.
 *
 * tio_plan_build checks its inputs once, here, so that neither planner
 * repeats (or drifts from) the checks and their messages, and hands them
 * to the planner opts.planner names: planner_teraio.c (TIO_PLANNER_TERAIO,
 * the default) or planner_alg1.c (TIO_PLANNER_ALG1, the faithful
 * Algorithm 1).  Calls point one way: this file calls the planners, and
 * what they share lives below them in plan_common.c.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "plan/plan_internal.h"

static const char *const PLANNER_NAMES[] = {
    [TIO_PLANNER_TERAIO] = "teraio",
    [TIO_PLANNER_ALG1] = "alg1",
};

void tio_plan_options_default(tio_plan_options *opt)
{
    memset(opt, 0, sizeof *opt);
    opt->planner = TIO_PLANNER_TERAIO;
    opt->ssd_read_gbps = 2.0;
    opt->ssd_write_gbps = 1.5;
    opt->best_tier = true;
    opt->planned_stalls = true;
    opt->synchronous_moves = true;
}

const char *tio_planner_name(tio_planner planner)
{
    return (unsigned)planner <= TIO_PLANNER_ALG1 ? PLANNER_NAMES[planner] : NULL;
}

int tio_planner_parse(const char *name, tio_planner *out)
{
    for (unsigned i = 0; name && i <= TIO_PLANNER_ALG1; i++)
        if (!strcmp(name, PLANNER_NAMES[i])) {
            *out = (tio_planner)i;
            return 0;
        }
    return tio_fail(-EINVAL, "unknown planner '%s' (teraio, alg1)", name ? name : "");
}

/* Appends one floor tensor ("name (kind, bytes, why)") to buf at *at. */
static void put_floor_tensor(const tio_trace *trace, const tio_lifetime *lt, const tio_floor_tensor *f,
                             char *buf, size_t size, size_t *at, bool first_in_list)
{
    const tio_trace_tensor *t = &trace->tensors[f->tensor];
    char b[32], where[128] = "";
    uint32_t first = lt->first_use[f->tensor];
    if (!t->name && first < trace->n_kernels)
        snprintf(where, sizeof where, ", first used by kernel %u (%s)", first, trace->kernels[first].name);
    if (*at >= size)
        return;
    if (t->name)
        *at += (size_t)snprintf(buf + *at, size - *at, "%s%s", first_in_list ? "" : ", ", t->name);
    else
        *at += (size_t)snprintf(buf + *at, size - *at, "%stensor %u", first_in_list ? "" : ", ", f->tensor);
    if (*at < size)
        *at += (size_t)snprintf(buf + *at, size - *at, " (%s, %s%s)", tio_tensor_kind_name(t->kind),
                                tio_format_bytes(f->bytes, b), where);
}

/* The tensors that make the floor (tio_lifetime_floor_tensors), for the
 * refusal: first those the kernel does not access (never accessed: what a
 * program can release), then those it
 * accesses, the largest of each, three at most; "" when they cannot be listed. */
static void floor_tensors_text(const tio_trace *trace, const tio_lifetime *lt, char *buf, size_t size)
{
    uint32_t n = 0;
    buf[0] = 0;
    if (tio_lifetime_floor_tensors(trace, lt, NULL, 0, &n) < 0 || n == 0)
        return;
    tio_floor_tensor *all = malloc(n * sizeof *all);
    if (!all || tio_lifetime_floor_tensors(trace, lt, all, n, &n) < 0) {
        free(all);
        return;
    }
    size_t at = 0;
    for (int pass = 0; pass < 2; pass++) {
        uint32_t shown = 0, count = 0;
        for (uint32_t i = 0; i < n; i++)
            count += (all[i].reason == TIO_FLOOR_ACCESSED) == (pass == 1);
        uint64_t group_bytes = 0;
        for (uint32_t i = 0; i < n; i++)
            if ((all[i].reason == TIO_FLOOR_ACCESSED) == (pass == 1))
                group_bytes += all[i].bytes;
        if (count == 0 || at >= size)
            continue;
        if (pass == 0 && group_bytes * 100 < lt->floor_bytes) { /* under 1%: a count, not names */
            char b[32];
            at += (size_t)snprintf(buf + at, size - at, "; held: %u tensor%s, %s", count, count > 1 ? "s" : "",
                                   tio_format_bytes(group_bytes, b));
            continue;
        }
        at += (size_t)snprintf(buf + at, size - at, pass ? "; accessed: " : "; held: ");
        for (uint32_t i = 0; i < n && shown < 3; i++)
            if ((all[i].reason == TIO_FLOOR_ACCESSED) == (pass == 1))
                put_floor_tensor(trace, lt, &all[i], buf, size, &at, shown++ == 0);
        if (count > shown && at < size)
            at += (size_t)snprintf(buf + at, size - at, " and %u more", count - shown);
    }
    if (at < size)
        snprintf(buf + at, size - at, " (teraio analyze lists them)");
    free(all);
}

/* The checks both planners rely on; the messages are tio_plan_build's. */
static int check_inputs(const tio_trace *trace, const tio_lifetime *lt,
                        const tio_plan_options *opt)
{
    if (!trace || !lt || !opt)
        return tio_fail(-EINVAL, "tio_plan_build: trace, lifetime and options are required");
    if (!tio_planner_name(opt->planner))
        return tio_fail(-EINVAL, "tio_plan_build: unknown planner %d (TIO_PLANNER_TERAIO, "
                        "TIO_PLANNER_ALG1)", (int)opt->planner);
    if (lt->n_kernels != trace->n_kernels || lt->n_tensors != trace->n_tensors)
        return tio_fail(-EINVAL, "lifetime analysis (%u kernels, %u tensors) is not of this "
                        "trace (%u kernels, %u tensors)", lt->n_kernels, lt->n_tensors,
                        trace->n_kernels, trace->n_tensors);
    if (trace->n_kernels == 0)
        return tio_fail(-EINVAL, "the trace has no kernels: there is nothing to plan");
    if (opt->capacity_bytes == 0)
        return tio_fail(-EINVAL, "capacity must be > 0 bytes");
    if (!(opt->ssd_read_gbps > 0) || !isfinite(opt->ssd_read_gbps) ||
        !(opt->ssd_write_gbps > 0) || !isfinite(opt->ssd_write_gbps))
        return tio_fail(-EINVAL, "SSD bandwidths must be finite and > 0 GB/s (read %g, write %g)",
                        opt->ssd_read_gbps, opt->ssd_write_gbps);
    if (!(opt->host_to_device_gbps >= 0) || !isfinite(opt->host_to_device_gbps) ||
        !(opt->device_to_host_gbps >= 0) || !isfinite(opt->device_to_host_gbps))
        return tio_fail(-EINVAL, "host channel bandwidths must be finite and >= 0 GB/s");
    for (uint32_t i = 0; i < lt->n_periods; i++) {
        const tio_inactive_period *per = &lt->periods[i];
        if (per->tensor >= trace->n_tensors || per->last_use >= lt->n_kernels ||
            per->next_use < (uint64_t)per->last_use + 2 ||
            per->next_use > (uint64_t)per->last_use + lt->n_kernels || per->bytes == 0)
            return tio_fail(-EINVAL, "inactive period %u (tensor %u, kernels %u..%u) is "
                            "malformed", i, per->tensor, per->last_use, per->next_use);
    }
    if (opt->capacity_bytes < lt->floor_bytes) {
        uint32_t k = lt->floor_kernel;
        char cap[32], need[32], held[32], largest[768];
        tio_format_bytes(opt->capacity_bytes, cap);
        tio_format_bytes(lt->floor_bytes, need);
        if (!strcmp(cap, need)) { /* rounded alike: the exact counts */
            snprintf(cap, sizeof cap, "%llu B", (unsigned long long)opt->capacity_bytes);
            snprintf(need, sizeof need, "%llu B", (unsigned long long)lt->floor_bytes);
        }
        floor_tensors_text(trace, lt, largest, sizeof largest);
        uint64_t held_bytes = lt->floor_bytes - lt->active_bytes[k];
        if (held_bytes == 0)
            return tio_fail(TIO_EINFEASIBLE, "capacity %s is below kernel %u (%s)'s need of %s, "
                            "the working-set floor: no plan fits below it%s",
                            cap, k, trace->kernels[k].name, need, largest);
        return tio_fail(TIO_EINFEASIBLE, "capacity %s is below kernel %u (%s)'s need of %s, the "
                        "working-set floor: what it accesses and %s held there by tensors no "
                        "period can move; no plan fits below it%s",
                        cap, k, trace->kernels[k].name, need,
                        tio_format_bytes(held_bytes, held), largest);
    }
    return 0;
}

int tio_plan_build(const tio_trace *trace, const tio_lifetime *lt,
                   const tio_plan_options *opt, tio_plan **out)
{
    if (!out)
        return tio_fail(-EINVAL, "tio_plan_build: out is NULL");
    *out = NULL;
    uint64_t t0 = tio_now_ns();
    int rc = check_inputs(trace, lt, opt);
    if (rc)
        return rc;
    return opt->planner == TIO_PLANNER_ALG1 ? tio_plan_build_alg1(trace, lt, opt, t0, out)
                                            : tio_plan_build_teraio(trace, lt, opt, t0, out);
}

