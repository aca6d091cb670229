/*
 * sim/swap.c — the swapping baselines: on-demand LRU swapping and the two
 * ZeRO offload models (docs/baselines.md has each model's assumptions).
 *
 * One engine, configured per tensor kind (tio_swap_model): tensors the
 * device holds are kept in least-recently-used order; before a kernel,
 * whatever it needs that is not resident is fetched, after evicting the
 * least recently used tensors it does not need until everything fits;
 * evicted tensors that are still alive are written out (unless their home
 * is the swap tier and the device copy is clean).  The kernel waits for the
 * evictions that free its memory and for its fetches.  With cpu_step the
 * kernels that touch CPU-resident tensors (the optimizer step) leave the
 * GPU stream and the CPU update runs after the backward pass, once the
 * gradients have streamed out: ZeRO's model.
 *
 * Two iterations are simulated and the second is reported (the first warms
 * the device up from "globals resident in id order while they fit").
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "sim/sim_internal.h"

enum { LOC_NONE = 0, LOC_DEV = 1, LOC_OFF = 2 };

typedef struct {
    const tio_trace *trace;
    const tio_hw *hw;
    const tio_swap_model *m;
    uint32_t nt, nil;
    uint8_t *loc;
    double *ready;
    uint32_t *prv, *nxt;       /* LRU list over tensors, sentinel nil */
    uint32_t *stamp;           /* kernel + 1 that last marked the tensor needed */
    uint32_t *gpu_first, *gpu_last;
    bool *cpu_kernel;
    uint64_t resident, cap;
    double ch_free[TIO_CH_N], gbps[TIO_CH_N], lat[TIO_CH_N];
    tio_sim_report *r;
    bool record;
    double stall_ns, iteration_ns; /* of the recorded iteration, stored at the end */
} swapper;

static void lru_remove(swapper *s, uint32_t t)
{
    s->nxt[s->prv[t]] = s->nxt[t];
    s->prv[s->nxt[t]] = s->prv[t];
}

static void lru_push(swapper *s, uint32_t t)
{
    s->prv[t] = s->prv[s->nil];
    s->nxt[t] = s->nil;
    s->nxt[s->prv[s->nil]] = t;
    s->prv[s->nil] = t;
}

static double transfer(swapper *s, int ch, uint64_t bytes, double at)
{
    double s0 = at > s->ch_free[ch] ? at : s->ch_free[ch];
    s->ch_free[ch] = s0 + s->lat[ch] + (double)bytes / s->gbps[ch];
    if (s->record) {
        s->r->bytes[ch] += bytes;
        s->r->busy_ns[ch] += (double)bytes / s->gbps[ch];
    }
    return s->ch_free[ch];
}

static tio_swap_policy policy_of(const swapper *s, uint32_t t)
{
    return s->m->policy[s->trace->tensors[t].kind];
}

/* Make room for `need` more bytes at time `now`; returns when the evicted
 * memory is free. */
static double evict_for(swapper *s, uint64_t need, uint32_t stamp, double now)
{
    double freed = now;
    uint32_t v = s->nxt[s->nil];
    while (s->resident + need > s->cap && v != s->nil) {
        uint32_t nx = s->nxt[v];
        if (s->stamp[v] == stamp) {
            v = nx;
            continue;
        }
        const tio_trace_tensor *tt = &s->trace->tensors[v];
        lru_remove(s, v);
        s->resident -= tt->bytes;
        s->loc[v] = LOC_OFF;
        if (policy_of(s, v) != TIO_SWAP_HOME) {
            double done = transfer(s, s->m->write_ch[tt->kind], tt->bytes, now);
            freed = done > freed ? done : freed;
        }
        v = nx;
    }
    return freed;
}

/* One GPU kernel: returns its start time. */
static double run_kernel(swapper *s, uint32_t k, double now)
{
    const tio_trace *tr = s->trace;
    const tio_trace_kernel *kn = &tr->kernels[k];
    uint32_t stamp = k + 1;
    uint64_t need = 0;
    for (uint32_t i = 0; i < kn->n_accesses; i++) {
        uint32_t t = tr->accesses[kn->first_access + i].tensor;
        s->stamp[t] = stamp;
        if (s->loc[t] == LOC_DEV) {
            lru_remove(s, t);
            lru_push(s, t);
        } else {
            need += tr->tensors[t].bytes;
        }
    }
    double freed = need ? evict_for(s, need, stamp, now) : now;
    double start = freed;
    for (uint32_t i = 0; i < kn->n_accesses; i++) {
        uint32_t t = tr->accesses[kn->first_access + i].tensor;
        const tio_trace_tensor *tt = &tr->tensors[t];
        if (s->loc[t] == LOC_OFF) {
            s->ready[t] = transfer(s, s->m->read_ch[tt->kind], tt->bytes, freed);
        } else if (s->loc[t] == LOC_NONE) {
            s->ready[t] = freed;
        }
        if (s->loc[t] != LOC_DEV) {
            s->loc[t] = LOC_DEV;
            s->resident += tt->bytes;
            lru_push(s, t);
        }
        if (s->ready[t] > start)
            start = s->ready[t];
    }
    return start;
}

/* After kernel k ends at `end`: free dead intermediates, stream out. */
static double retire(swapper *s, uint32_t k, double end, double stream_done)
{
    const tio_trace *tr = s->trace;
    const tio_trace_kernel *kn = &tr->kernels[k];
    for (uint32_t i = 0; i < kn->n_accesses; i++) {
        uint32_t t = tr->accesses[kn->first_access + i].tensor;
        const tio_trace_tensor *tt = &tr->tensors[t];
        tio_swap_policy p = policy_of(s, t);
        bool dies = !tt->global && s->gpu_last[t] == k;
        bool streams = p == TIO_SWAP_STREAM && s->gpu_last[t] == k;
        if (!(dies || streams) || s->loc[t] != LOC_DEV)
            continue;
        if (streams) {
            double d = transfer(s, s->m->write_ch[tt->kind], tt->bytes, end);
            stream_done = d > stream_done ? d : stream_done;
        }
        lru_remove(s, t);
        s->resident -= tt->bytes;
        s->loc[t] = LOC_NONE;
    }
    return stream_done;
}

/* Issue fetches of kernel k's home tensors ahead of time if they fit. */
static void prefetch_home(swapper *s, uint32_t k, double at)
{
    const tio_trace *tr = s->trace;
    const tio_trace_kernel *kn = &tr->kernels[k];
    for (uint32_t i = 0; i < kn->n_accesses; i++) {
        uint32_t t = tr->accesses[kn->first_access + i].tensor;
        const tio_trace_tensor *tt = &tr->tensors[t];
        if (s->loc[t] != LOC_OFF || policy_of(s, t) != TIO_SWAP_HOME ||
            s->resident + tt->bytes > s->cap)
            continue;
        s->ready[t] = transfer(s, s->m->read_ch[tt->kind], tt->bytes, at);
        s->loc[t] = LOC_DEV;
        s->resident += tt->bytes;
        lru_push(s, t);
    }
}

/* The CPU optimizer step after the backward pass; returns its end. */
static double cpu_step(swapper *s, double begin)
{
    const tio_trace *tr = s->trace;
    uint64_t param_bytes = 0, state_bytes = 0;
    for (uint32_t t = 0; t < tr->n_tensors; t++) {
        if (tr->tensors[t].kind == TIO_KIND_PARAMETER)
            param_bytes += tr->tensors[t].bytes;
        else if (tr->tensors[t].kind == TIO_KIND_OPTIMIZER_STATE)
            state_bytes += tr->tensors[t].bytes;
    }
    double adam_ns = 1e9 * ((double)param_bytes / 4.0) / s->hw->cpu_adam_params_per_s;
    double step = adam_ns;
    if (s->m->states_on_ssd) {
        uint64_t io = state_bytes + param_bytes; /* moments + FP32 master weights */
        double io_ns = (double)io / s->gbps[TIO_CH_SSD_READ] + (double)io / s->gbps[TIO_CH_SSD_WRITE];
        if (s->record) {
            s->r->bytes[TIO_CH_SSD_READ] += io;
            s->r->bytes[TIO_CH_SSD_WRITE] += io;
            s->r->busy_ns[TIO_CH_SSD_READ] += (double)io / s->gbps[TIO_CH_SSD_READ];
            s->r->busy_ns[TIO_CH_SSD_WRITE] += (double)io / s->gbps[TIO_CH_SSD_WRITE];
        }
        step = io_ns > adam_ns ? io_ns : adam_ns;
    }
    double end = begin + step;
    if (s->m->policy[TIO_KIND_PARAMETER] == TIO_SWAP_HOME) {
        for (uint32_t t = 0; t < tr->n_tensors; t++)
            if (tr->tensors[t].kind == TIO_KIND_PARAMETER && s->loc[t] == LOC_DEV) {
                lru_remove(s, t);
                s->resident -= tr->tensors[t].bytes;
                s->loc[t] = LOC_OFF;
            }
    } else {
        /* updated FP32 parameters go back over the whole PCIe link */
        end += (double)param_bytes / s->hw->pcie_h2d_gbps;
        if (s->record)
            s->r->bytes[TIO_CH_HOST_READ] += param_bytes;
    }
    return end;
}

static double iterate(swapper *s, double now)
{
    const tio_trace *tr = s->trace;
    double stream_done = now, iter_start = now;
    uint32_t n = tr->n_kernels;
    for (uint32_t k = 0; k < n; k++) {
        if (s->cpu_kernel[k]) {
            if (s->record)
                s->r->memory_bytes[k] = s->resident;
            continue;
        }
        double start = run_kernel(s, k, now);
        if (s->record) {
            if (start > now + 0.5) {
                s->stall_ns += floor(start - now);
                s->r->n_stalls++;
            }
            s->r->memory_bytes[k] = s->resident;
            if (s->resident > s->r->peak_bytes)
                s->r->peak_bytes = s->resident;
        }
        uint32_t next = k + 1;
        while (next < n && s->cpu_kernel[next])
            next++;
        if (next < n)
            prefetch_home(s, next, start);
        now = start + (double)tr->kernels[k].duration_ns;
        stream_done = retire(s, k, now, stream_done);
    }
    if (s->m->cpu_step) {
        double begin = stream_done > now ? stream_done : now;
        double end = cpu_step(s, begin);
        if (s->record) {
            s->stall_ns += floor(end - now);
            s->r->n_stalls++;
        }
        now = end;
    }
    if (s->record)
        s->iteration_ns = now - iter_start;
    return now;
}

static void swapper_free(swapper *s)
{
    free(s->loc);
    free(s->ready);
    free(s->prv);
    free(s->nxt);
    free(s->stamp);
    free(s->gpu_first);
    free(s->gpu_last);
    free(s->cpu_kernel);
}

static int swapper_init(swapper *s, const tio_trace *trace, const tio_hw *hw,
                        const tio_swap_model *m, tio_sim_report *r)
{
    memset(s, 0, sizeof *s);
    s->trace = trace;
    s->hw = hw;
    s->m = m;
    s->r = r;
    s->nt = trace->n_tensors;
    s->nil = s->nt;
    s->cap = hw->capacity_bytes;
    size_t nt1 = (size_t)s->nt + 1;
    s->loc = calloc(nt1, 1);
    s->ready = calloc(nt1, sizeof *s->ready);
    s->prv = malloc(nt1 * sizeof *s->prv);
    s->nxt = malloc(nt1 * sizeof *s->nxt);
    s->stamp = calloc(nt1, sizeof *s->stamp);
    s->gpu_first = malloc(nt1 * sizeof *s->gpu_first);
    s->gpu_last = malloc(nt1 * sizeof *s->gpu_last);
    s->cpu_kernel = calloc((size_t)trace->n_kernels + 1, sizeof *s->cpu_kernel);
    if (!s->loc || !s->ready || !s->prv || !s->nxt || !s->stamp || !s->gpu_first ||
        !s->gpu_last || !s->cpu_kernel) {
        swapper_free(s);
        return tio_fail(-ENOMEM, "out of memory simulating %u tensors", s->nt);
    }
    s->prv[s->nil] = s->nxt[s->nil] = s->nil;
    for (int c = 0; c < TIO_CH_N; c++) {
        s->gbps[c] = tio_sim_channel_gbps(hw, c);
        s->lat[c] = tio_sim_latency_ns(hw, c);
    }
    for (uint32_t t = 0; t < s->nt; t++) {
        s->gpu_first[t] = UINT32_MAX;
        s->gpu_last[t] = 0;
    }
    for (uint32_t k = 0; k < trace->n_kernels; k++) {
        const tio_trace_kernel *kn = &trace->kernels[k];
        for (uint32_t i = 0; i < kn->n_accesses && m->cpu_step; i++)
            if (m->policy[trace->tensors[trace->accesses[kn->first_access + i].tensor].kind] ==
                TIO_SWAP_CPU)
                s->cpu_kernel[k] = true;
        for (uint32_t i = 0; i < kn->n_accesses && !s->cpu_kernel[k]; i++) {
            uint32_t t = trace->accesses[kn->first_access + i].tensor;
            if (s->gpu_first[t] == UINT32_MAX)
                s->gpu_first[t] = k;
            s->gpu_last[t] = k;
        }
    }
    for (uint32_t t = 0; t < s->nt; t++) {
        const tio_trace_tensor *tt = &trace->tensors[t];
        tio_swap_policy p = m->policy[tt->kind];
        if (!tt->global || p == TIO_SWAP_STREAM || p == TIO_SWAP_CPU ||
            s->gpu_first[t] == UINT32_MAX)
            continue;
        if (p == TIO_SWAP_LRU && s->resident + tt->bytes <= s->cap) {
            s->loc[t] = LOC_DEV;
            s->resident += tt->bytes;
            lru_push(s, t);
        } else {
            s->loc[t] = LOC_OFF;
        }
    }
    return 0;
}

int tio_sim_swap(const tio_trace *trace, const tio_lifetime *lt, const tio_hw *hw,
                 const tio_swap_model *model, tio_sim_report *out)
{
    if (!trace || !lt || !hw || !model || !out)
        return tio_fail(-EINVAL, "tio_sim_swap: arguments are required");
    int rc = tio_sim_report_init(out, trace->n_kernels);
    if (rc)
        return rc;
    swapper s;
    rc = swapper_init(&s, trace, hw, model, out);
    if (rc) {
        tio_sim_report_free(out);
        return rc;
    }
    double now = iterate(&s, 0);
    s.record = true;
    iterate(&s, now);
    swapper_free(&s);
    if ((rc = tio_sim_store_ns(s.iteration_ns + 0.5, "iteration", &out->iteration_ns)) ||
        (rc = tio_sim_store_ns(s.stall_ns, "stall", &out->stall_ns))) {
        tio_sim_report_free(out);
        return rc;
    }
    tio_sim_report_finish(out, trace);
    return 0;
}
