/*
 * sim/sim.c — replaying a plan on a hardware profile.
 *
 * The compute stream runs kernels in order.  A plan's offload/prefetch
 * pair of one inactive period keeps the tensor off the device over
 * [k_off, k_pre) (a tail period's lone offload until the tensor is freed,
 * with nothing read back); at kernel_begin(trigger) a migration is queued on its
 * channel (SSD or host, write or read).  A transfer needs latency + bytes /
 * bandwidth of its channel's time; a channel serves its queued transfers
 * earliest deadline first, preemptively (transfers move in chunks of a few
 * MiB, and the runtime submits the chunk of the queued migration whose
 * deadline kernel comes first; ties in issue order).  That is the order in
 * which the planner booked each kernel's bandwidth, and on one channel it
 * meets every deadline that any order meets.  A kernel starts when the
 * compute stream is free and every migration whose deadline is that kernel
 * is done (the offload must be done before its memory is released, the
 * prefetch before the tensor is used).  Time lost that way is stall.
 *
 * On a profile with host costs (host_overhead_us, migration_host_ns_per_byte:
 * a device that is the host CPU) each kernel also takes its dispatch time
 * and the host work of the migrations it issues on the compute stream.
 *
 * The timeline is unrolled over iterations -1 .. 2: pairs of iteration -1
 * stand for the previous iteration (their transfers issued before time 0
 * count as done at 0, so a wrap-around period starts with its tensor off
 * the device), and iteration 2 is reported — by then the channels carry
 * the backlog a steady state has.
 *
 * Resident memory at kernel k is M'[k] (M minus the tensors a pair keeps
 * off the device), computed here from the pairs.  Where M'[k] exceeds the
 * capacity, the excess is swapped on demand: a rise of the excess by x
 * bytes costs a synchronous SSD write of x before the kernel, a fall a
 * synchronous read of x (both served ahead of every queued transfer), both
 * stall, and an excess present at every kernel
 * is written and read once per iteration; the resident peak therefore never
 * exceeds the capacity and every byte above it is paid for.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "sim/sim_internal.h"

enum { ITERATIONS = 3 };

typedef struct {
    int64_t issue_g, due_g;  /* global kernel indices (iteration * n + k) */
    uint64_t bytes;
    int channel;
    double done_ns;
    double left_ns;          /* service time still owed while queued */
    uint32_t seq;            /* issue order, breaks deadline ties */
} sim_event;

/* One channel: a min-heap of queued transfers by (deadline, issue order),
 * and the time up to which its service has been simulated. */
typedef struct {
    sim_event **heap;
    uint32_t n;
    double now_ns;
} sim_channel;

static bool ev_before(const sim_event *a, const sim_event *b)
{
    return a->due_g != b->due_g ? a->due_g < b->due_g : a->seq < b->seq;
}

static void chan_push(sim_channel *c, sim_event *e)
{
    uint32_t i = c->n++;
    c->heap[i] = e;
    while (i > 0 && ev_before(c->heap[i], c->heap[(i - 1) / 2])) {
        sim_event *t = c->heap[i];
        c->heap[i] = c->heap[(i - 1) / 2];
        c->heap[(i - 1) / 2] = t;
        i = (i - 1) / 2;
    }
}

static void chan_pop(sim_channel *c)
{
    c->heap[0] = c->heap[--c->n];
    uint32_t i = 0;
    for (;;) {
        uint32_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < c->n && ev_before(c->heap[l], c->heap[m]))
            m = l;
        if (r < c->n && ev_before(c->heap[r], c->heap[m]))
            m = r;
        if (m == i)
            break;
        sim_event *t = c->heap[i];
        c->heap[i] = c->heap[m];
        c->heap[m] = t;
        i = m;
    }
}

/* Serve queued transfers, most urgent first, up to time t. */
static void chan_advance(sim_channel *c, double t)
{
    while (c->n > 0 && c->now_ns < t) {
        sim_event *e = c->heap[0];
        if (c->now_ns + e->left_ns <= t) {
            c->now_ns += e->left_ns;
            e->left_ns = 0;
            e->done_ns = c->now_ns;
            chan_pop(c);
        } else {
            e->left_ns -= t - c->now_ns;
            c->now_ns = t;
        }
    }
    if (c->now_ns < t)
        c->now_ns = t;
}

/* Finish every queued transfer due at or before global kernel g (they are
 * the most urgent, so they are served first). */
static void chan_finish_due(sim_channel *c, int64_t g)
{
    while (c->n > 0 && c->heap[0]->due_g <= g) {
        sim_event *e = c->heap[0];
        c->now_ns += e->left_ns;
        e->left_ns = 0;
        e->done_ns = c->now_ns;
        chan_pop(c);
    }
}

typedef struct {
    uint32_t tensor;
    uint64_t off_k, pre_k, trigger_k, due_k; /* unwrapped, trigger in [0, n) */
    uint64_t bytes;
    tio_tier tier;
    bool tail;               /* a lone offload in a tail period: away until the
                                free (pre_k), nothing read back */
} sim_pair;

static int cmp_u32_trigger(const void *x, const void *y, void *ctx)
{
    const tio_migration *m = ctx;
    uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;
    if (m[a].tensor != m[b].tensor)
        return m[a].tensor < m[b].tensor ? -1 : 1;
    if (m[a].trigger_kernel != m[b].trigger_kernel)
        return m[a].trigger_kernel < m[b].trigger_kernel ? -1 : 1;
    if (m[a].kind != m[b].kind)
        return m[a].kind == TIO_MIGRATION_OFFLOAD ? -1 : 1;
    return a < b ? -1 : a > b;
}

/* Pair each offload with the prefetch that follows it (cyclically) among
 * the same tensor's migrations; an intermediate's last offload with no
 * prefetch after it (a tail period, plan.h) stays away until the tensor is
 * freed. */
static int pair_migrations(const tio_plan *plan, const tio_trace *trace, sim_pair **out,
                         uint32_t *n_out)
{
    uint32_t n_tensors = trace->n_tensors;
    uint32_t nm = plan->n_migrations, n = plan->n_kernels;
    uint32_t *idx = malloc(((size_t)nm + 1) * sizeof *idx);
    sim_pair *pairs = malloc(((size_t)nm + 1) * sizeof *pairs); /* lone offloads: one each */
    if (!idx || !pairs) {
        free(idx);
        free(pairs);
        return tio_fail(-ENOMEM, "out of memory pairing %u migrations", nm);
    }
    for (uint32_t i = 0; i < nm; i++) {
        const tio_migration *m = &plan->migrations[i];
        if (m->tensor >= n_tensors || m->trigger_kernel >= n || m->deadline_kernel >= n ||
            m->bytes == 0) {
            free(idx);
            free(pairs);
            return tio_fail(-EINVAL, "plan migration %u (tensor %u) is out of range for the "
                            "trace", i, m->tensor);
        }
        idx[i] = i;
    }
    qsort_r(idx, nm, sizeof *idx, cmp_u32_trigger, plan->migrations);
    uint32_t np = 0, i = 0;
    int rc = 0;
    while (i < nm && !rc) {
        uint32_t j = i;
        while (j < nm && plan->migrations[idx[j]].tensor == plan->migrations[idx[i]].tensor)
            j++;
        uint32_t cnt = j - i, start = i, group_end = j;
        const tio_migration *last = &plan->migrations[idx[j - 1]];
        const tio_trace_tensor *tt = &trace->tensors[last->tensor];
        if (cnt % 2 && last->kind == TIO_MIGRATION_OFFLOAD && !tt->global &&
            tt->free_kernel > last->deadline_kernel && last->deadline_kernel >= last->trigger_kernel) {
            pairs[np++] = (sim_pair){.tensor = last->tensor, .bytes = last->bytes,
                                     .tier = last->tier, .trigger_k = last->trigger_kernel,
                                     .off_k = last->deadline_kernel, .pre_k = tt->free_kernel,
                                     .due_k = tt->free_kernel, .tail = true};
            j--;
            cnt--;
        }
        while (start < j && plan->migrations[idx[start]].kind != TIO_MIGRATION_OFFLOAD)
            start++;
        if (cnt > 0 && (cnt % 2 || start == j)) {
            rc = tio_fail(-EINVAL, "plan: tensor %u has unpaired offloads/prefetches",
                          plan->migrations[idx[i]].tensor);
            break;
        }
        for (uint32_t q = 0; q < cnt; q += 2) {
            const tio_migration *o = &plan->migrations[idx[i + (start - i + q) % cnt]];
            const tio_migration *p = &plan->migrations[idx[i + (start - i + q + 1) % cnt]];
            if (o->kind != TIO_MIGRATION_OFFLOAD || p->kind != TIO_MIGRATION_PREFETCH ||
                o->bytes != p->bytes || o->tier != p->tier) {
                rc = tio_fail(-EINVAL, "plan: tensor %u: a prefetch does not follow its offload",
                              o->tensor);
                break;
            }
            sim_pair *sp = &pairs[np++];
            *sp = (sim_pair){.tail = false};
            sp->tensor = o->tensor;
            sp->bytes = o->bytes;
            sp->tier = o->tier;
            sp->trigger_k = o->trigger_kernel;
            /* deadline == trigger: synchronous (plan.h), not a lap later */
            sp->off_k = o->deadline_kernel;
            while (sp->off_k < sp->trigger_k)
                sp->off_k += n;
            sp->pre_k = p->trigger_kernel;
            while (sp->pre_k < sp->off_k)
                sp->pre_k += n;
            sp->due_k = p->deadline_kernel;
            while (sp->due_k < sp->pre_k)
                sp->due_k += n;
            if (sp->due_k - sp->trigger_k > n) {
                rc = tio_fail(-EINVAL, "plan: tensor %u stays off the device for more than an "
                              "iteration", o->tensor);
                break;
            }
        }
        i = group_end;
    }
    free(idx);
    if (rc) {
        free(pairs);
        return rc;
    }
    *out = pairs;
    *n_out = np;
    return 0;
}

static int cmp_issue(const void *x, const void *y)
{
    const sim_event *a = *(sim_event *const *)x, *b = *(sim_event *const *)y;
    if (a->issue_g != b->issue_g)
        return a->issue_g < b->issue_g ? -1 : 1;
    return a < b ? -1 : a > b;
}

static int cmp_due(const void *x, const void *y)
{
    const sim_event *a = *(sim_event *const *)x, *b = *(sim_event *const *)y;
    if (a->due_g != b->due_g)
        return a->due_g < b->due_g ? -1 : 1;
    return a < b ? -1 : a > b;
}

double tio_sim_channel_gbps(const tio_hw *hw, int ch)
{
    tio_hw_bandwidth bw = tio_hw_channels(hw);
    switch (ch) {
    case TIO_CH_SSD_WRITE: return bw.ssd_write;
    case TIO_CH_SSD_READ: return bw.ssd_read;
    case TIO_CH_HOST_WRITE: return bw.host_write;
    default: return bw.host_read;
    }
}

double tio_sim_latency_ns(const tio_hw *hw, int ch)
{
    return 1e3 * (ch == TIO_CH_SSD_WRITE || ch == TIO_CH_SSD_READ ? hw->ssd_latency_us
                                                                   : hw->host_latency_us);
}

/* M'[k] from the pairs, and the per-kernel overflow stall. */
static int planned_curve(const tio_lifetime *lt, const sim_pair *pairs, uint32_t np,
                         uint64_t **out)
{
    uint32_t n = lt->n_kernels;
    int64_t *diff = calloc((size_t)n + 1, sizeof *diff);
    uint64_t *m = malloc((size_t)n * sizeof *m);
    if (!diff || !m) {
        free(diff);
        free(m);
        return tio_fail(-ENOMEM, "out of memory for a memory curve of %u kernels", n);
    }
    for (uint32_t i = 0; i < np; i++) {
        uint64_t f = pairs[i].off_k % n, len = pairs[i].pre_k - pairs[i].off_k;
        int64_t s = (int64_t)pairs[i].bytes;
        diff[f] -= s;
        if (f + len <= n) {
            diff[f + len] += s;
        } else {
            diff[n] += s;
            diff[0] -= s;
            diff[f + len - n] += s;
        }
    }
    int64_t run = 0;
    for (uint32_t k = 0; k < n; k++) {
        run += diff[k];
        int64_t v = (int64_t)lt->memory_bytes[k] + run;
        m[k] = v < 0 ? 0 : (uint64_t)v;
    }
    free(diff);
    *out = m;
    return 0;
}

static int add_events(const sim_pair *pairs, uint32_t np, uint32_t n, sim_event **out,
                      uint32_t *n_out)
{
    size_t cap = (size_t)np * 2 * (ITERATIONS + 1) + 1;
    sim_event *ev = malloc(cap * sizeof *ev);
    if (!ev)
        return tio_fail(-ENOMEM, "out of memory for %zu simulated transfers", cap);
    uint32_t ne = 0;
    for (uint32_t i = 0; i < np; i++) {
        const sim_pair *p = &pairs[i];
        bool ssd = p->tier == TIO_TIER_SSD;
        for (int it = -1; it < ITERATIONS; it++) {
            int64_t base = (int64_t)it * n;
            ev[ne++] = (sim_event){.issue_g = base + (int64_t)p->trigger_k,
                                   .due_g = base + (int64_t)p->off_k, .bytes = p->bytes,
                                   .channel = ssd ? TIO_CH_SSD_WRITE : TIO_CH_HOST_WRITE};
            if (p->tail)
                continue; /* nothing is read back */
            ev[ne++] = (sim_event){.issue_g = base + (int64_t)p->pre_k,
                                   .due_g = base + (int64_t)p->due_k, .bytes = p->bytes,
                                   .channel = ssd ? TIO_CH_SSD_READ : TIO_CH_HOST_READ};
        }
    }
    *out = ev;
    *n_out = ne;
    return 0;
}

int tio_sim_report_init(tio_sim_report *r, uint32_t n)
{
    memset(r, 0, sizeof *r);
    r->n_kernels = n;
    r->plan_fits = true;
    r->memory_bytes = calloc(n ? n : 1, sizeof *r->memory_bytes);
    if (!r->memory_bytes)
        return tio_fail(-ENOMEM, "out of memory for a report of %u kernels", n);
    return 0;
}

int tio_sim_store_ns(double ns, const char *what, uint64_t *out)
{
    if (!(ns < 18446744073709551616.0)) /* 2^64; also NaN */
        return tio_fail(-ERANGE, "the simulated %s time (%.3g s) does not fit in 64 bits of "
                        "nanoseconds: a bandwidth of the profile is far too small for this trace",
                        what, ns / 1e9);
    *out = ns > 0 ? (uint64_t)ns : 0;
    return 0;
}

void tio_sim_report_finish(tio_sim_report *r, const tio_trace *trace)
{
    r->ideal_ns = tio_trace_iteration_ns(trace);
    r->fraction_of_ideal = r->iteration_ns ? (double)r->ideal_ns / (double)r->iteration_ns : 1.0;
}

static int replay(const tio_trace *trace, const tio_hw *hw, const uint64_t *mcurve,
                  sim_event *ev, uint32_t ne, tio_sim_report *r)
{
    uint32_t n = trace->n_kernels;
    sim_event **by_issue = malloc(((size_t)ne + 1) * sizeof *by_issue);
    sim_event **by_due = malloc(((size_t)ne + 1) * sizeof *by_due);
    if (!by_issue || !by_due) {
        free(by_issue);
        free(by_due);
        return tio_fail(-ENOMEM, "out of memory for %u simulated transfers", ne);
    }
    sim_channel ch[TIO_CH_N];
    memset(ch, 0, sizeof ch);
    for (int c = 0; c < TIO_CH_N; c++)
        if (!(ch[c].heap = malloc(((size_t)ne + 1) * sizeof *ch[c].heap))) {
            for (int d = 0; d < c; d++)
                free(ch[d].heap);
            free(by_issue);
            free(by_due);
            return tio_fail(-ENOMEM, "out of memory for %u simulated transfers", ne);
        }
    for (uint32_t i = 0; i < ne; i++)
        by_issue[i] = by_due[i] = &ev[i];
    qsort(by_issue, ne, sizeof *by_issue, cmp_issue);
    qsort(by_due, ne, sizeof *by_due, cmp_due);
    for (uint32_t i = 0; i < ne; i++)
        by_issue[i]->seq = i;
    double gbps[TIO_CH_N], lat[TIO_CH_N];
    for (int c = 0; c < TIO_CH_N; c++) {
        gbps[c] = tio_sim_channel_gbps(hw, c);
        lat[c] = tio_sim_latency_ns(hw, c);
    }
    uint64_t cap = hw->capacity_bytes;
    double host_kernel_ns = hw->host_overhead_us * 1e3;
    double host_byte_ns = hw->migration_host_ns_per_byte;
    double t = 0, iter_start = 0, stall = 0;
    uint32_t pi = 0, pd = 0;
    uint64_t floor_over = UINT64_MAX;
    for (uint32_t k = 0; k < n; k++) {
        uint64_t o = mcurve[k] > cap ? mcurve[k] - cap : 0;
        floor_over = o < floor_over ? o : floor_over;
    }
    while (pi < ne && by_issue[pi]->issue_g < 0)
        by_issue[pi++]->done_ns = 0;
    for (int64_t g = 0; g < (int64_t)ITERATIONS * n; g++) {
        uint32_t k = (uint32_t)(g % n);
        bool last = g >= (int64_t)(ITERATIONS - 1) * n;
        if (k == 0)
            iter_start = t;
        double start = t;
        for (int c = 0; c < TIO_CH_N; c++) {
            chan_advance(&ch[c], t);
            chan_finish_due(&ch[c], g);
        }
        while (pd < ne && by_due[pd]->due_g < g)
            pd++;
        for (; pd < ne && by_due[pd]->due_g == g; pd++)
            if (by_due[pd]->done_ns > start)
                start = by_due[pd]->done_ns;
        uint64_t over = mcurve[k] > cap ? mcurve[k] - cap : 0;
        uint64_t kp = k ? k - 1 : n - 1;
        uint64_t over_prev = mcurve[kp] > cap ? mcurve[kp] - cap : 0;
        if (k == 0 && floor_over > 0) {
            /* an excess at every kernel still has to leave and come back
             * once per iteration for the kernels that use it */
            for (int c = TIO_CH_SSD_WRITE; c <= TIO_CH_SSD_READ; c++) {
                chan_advance(&ch[c], start);
                ch[c].now_ns += lat[c] + (double)floor_over / gbps[c];
                start = ch[c].now_ns;
                if (last) {
                    r->bytes[c] += floor_over;
                    r->busy_ns[c] += (double)floor_over / gbps[c];
                }
            }
        }
        if (over != over_prev) {
            int c = over > over_prev ? TIO_CH_SSD_WRITE : TIO_CH_SSD_READ;
            uint64_t x = over > over_prev ? over - over_prev : over_prev - over;
            chan_advance(&ch[c], start);
            ch[c].now_ns += lat[c] + (double)x / gbps[c];
            start = ch[c].now_ns;
            if (last) {
                r->bytes[c] += x;
                r->busy_ns[c] += (double)x / gbps[c];
            }
        }
        for (int c = 0; c < TIO_CH_N; c++)
            chan_advance(&ch[c], start);
        uint64_t issued = 0;
        uint32_t first_issued = pi;
        bool sync = false;
        for (; pi < ne && by_issue[pi]->issue_g == g; pi++) {
            sim_event *e = by_issue[pi];
            e->left_ns = lat[e->channel] + (double)e->bytes / gbps[e->channel];
            chan_push(&ch[e->channel], e);
            issued += e->bytes;
            sync = sync || e->due_g == g;
            if (last) {
                r->bytes[e->channel] += e->bytes;
                r->busy_ns[e->channel] += (double)e->bytes / gbps[e->channel];
            }
        }
        if (sync) {
            /* synchronous migrations, due at the kernel that issues them:
             * the most urgent work of their channels, and the kernel waits */
            for (int c = 0; c < TIO_CH_N; c++)
                chan_finish_due(&ch[c], g);
            for (uint32_t i = first_issued; i < pi; i++)
                if (by_issue[i]->due_g == g && by_issue[i]->done_ns > start)
                    start = by_issue[i]->done_ns;
        }
        if (last) {
            if (start > t) {
                stall += start - t;
                r->n_stalls++;
            }
            r->memory_bytes[k] = mcurve[k] < cap ? mcurve[k] : cap;
            if (r->memory_bytes[k] > r->peak_bytes)
                r->peak_bytes = r->memory_bytes[k];
            if (over > r->overflow_bytes)
                r->overflow_bytes = over;
        }
        /* the kernel, the host's dispatch of it, and the host work of the
         * migrations it issued (both 0 on a GPU profile) */
        t = start + (double)trace->kernels[k].duration_ns + host_kernel_ns +
            (double)issued * host_byte_ns;
    }
    for (int c = 0; c < TIO_CH_N; c++)
        free(ch[c].heap);
    free(by_issue);
    free(by_due);
    int rc = tio_sim_store_ns(t - iter_start + 0.5, "iteration", &r->iteration_ns);
    if (!rc) /* any wait, however short, shows */
        rc = tio_sim_store_ns(ceil(stall), "stall", &r->stall_ns);
    return rc;
}

int tio_sim_plan(const tio_trace *trace, const tio_lifetime *lt, const tio_hw *hw,
                 const tio_plan *plan, tio_sim_report *out)
{
    if (!trace || !lt || !hw || !plan || !out)
        return tio_fail(-EINVAL, "tio_sim_plan: trace, lifetime, profile, plan and report are "
                        "required");
    memset(out, 0, sizeof *out);
    uint32_t n = trace->n_kernels;
    if (n == 0)
        return tio_fail(-EINVAL, "the trace has no kernels: there is nothing to simulate");
    if (plan->n_kernels != n || lt->n_kernels != n)
        return tio_fail(-EINVAL, "plan of %u kernels does not match the trace's %u",
                        plan->n_kernels, n);
    sim_pair *pairs = NULL;
    uint32_t np = 0;
    uint64_t *mcurve = NULL;
    sim_event *ev = NULL;
    uint32_t ne = 0;
    int rc = pair_migrations(plan, trace, &pairs, &np);
    if (!rc)
        rc = planned_curve(lt, pairs, np, &mcurve);
    if (!rc)
        rc = add_events(pairs, np, n, &ev, &ne);
    if (!rc)
        rc = tio_sim_report_init(out, n);
    if (!rc)
        rc = replay(trace, hw, mcurve, ev, ne, out);
    if (!rc) {
        uint64_t peak = 0;
        for (uint32_t k = 0; k < n; k++)
            peak = mcurve[k] > peak ? mcurve[k] : peak;
        out->plan_fits = peak <= hw->capacity_bytes;
        out->plan_seconds = plan->plan_seconds;
        tio_sim_report_finish(out, trace);
    } else {
        tio_sim_report_free(out);
    }
    free(pairs);
    free(mcurve);
    free(ev);
    return rc;
}

void tio_sim_report_free(tio_sim_report *r)
{
    if (!r)
        return;
    free(r->memory_bytes);
    r->memory_bytes = NULL;
}
