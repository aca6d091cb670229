/*
 * sim/advise.c — `teraio advise`'s engine: one trace, many hardware points,
 * every point simulated under teraio, ZeRO-Infinity, ZeRO-Offload and the
 * ideal (teraio/advise.h).
 *
 * The work is the planner and the simulator, seconds per point on a 70B
 * trace, and points are independent: a pool of worker threads takes them
 * one at a time.  What points share is made once before the pool starts:
 * one sharded trace and its lifetime analysis per distinct GPU count.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"
#include "teraio/advise.h"

static const tio_sim_strategy COLUMNS[TIO_ADVISE_N_STRATEGIES] = {
    [TIO_ADVISE_IDEAL] = TIO_SIM_IDEAL,
    [TIO_ADVISE_TERAIO] = TIO_SIM_TERAIO,
    [TIO_ADVISE_ZERO_INFINITY] = TIO_SIM_ZERO_INFINITY,
    [TIO_ADVISE_ZERO_OFFLOAD] = TIO_SIM_ZERO_OFFLOAD,
};

/* The optimizer step: from the first kernel that touches an optimizer state. */
static uint32_t optimizer_start(const tio_trace *t)
{
    for (uint32_t k = 0; k < t->n_kernels; k++) {
        const tio_trace_kernel *kern = &t->kernels[k];
        for (uint32_t a = kern->first_access; a < kern->first_access + kern->n_accesses; a++)
            if (t->tensors[t->accesses[a].tensor].kind == TIO_KIND_OPTIMIZER_STATE)
                return k;
    }
    return t->n_kernels;
}

int tio_trace_shard(const tio_trace *trace, uint32_t shards, tio_trace **out)
{
    if (!trace || !out || !shards)
        return tio_fail(-EINVAL, "tio_trace_shard: %s", !shards ? "shards must be >= 1"
                                                                : "NULL argument");
    *out = NULL;
    tio_trace *t = NULL;
    int rc = tio_trace_create(trace->model, &t);
    for (uint32_t i = 0; !rc && i < trace->n_tensors; i++) {
        const tio_trace_tensor *x = &trace->tensors[i];
        bool split = x->global || x->kind == TIO_KIND_GRADIENT;
        uint64_t bytes = split ? x->bytes / shards + (x->bytes % shards != 0) : x->bytes;
        uint32_t id;
        rc = tio_trace_add_tensor(t, bytes, x->kind, x->global, x->name, &id);
    }
    uint32_t opt = optimizer_start(trace);
    for (uint32_t k = 0; !rc && k < trace->n_kernels; k++) {
        const tio_trace_kernel *kern = &trace->kernels[k];
        uint64_t ns = k >= opt ? kern->duration_ns / shards : kern->duration_ns;
        rc = tio_trace_add_kernel(t, kern->name, ns);
        for (uint32_t a = 0; !rc && a < kern->n_accesses; a++) {
            const tio_trace_access *acc = &trace->accesses[kern->first_access + a];
            rc = tio_trace_add_access(t, acc->tensor, acc->mode);
        }
    }
    for (uint32_t i = 0; !rc && i < trace->n_tensors; i++)
        if (trace->tensors[i].free_kernel)
            rc = tio_trace_set_free_kernel(t, i, trace->tensors[i].free_kernel);
    if (rc) {
        tio_trace_destroy(t);
        return rc;
    }
    *out = t;
    return 0;
}

/* One distinct GPU count: its sharded trace and lifetime. */
typedef struct {
    uint32_t gpus;
    tio_trace *trace;
    tio_lifetime *lt;
    uint64_t offload_host_bytes; /* ZeRO-Offload's home in host memory */
} shard_set;

/* ZeRO-Offload keeps the optimizer states and the gradients in host memory
 * (Ren et al., ATC'21, section 4.1). */
static uint64_t offload_host_bytes(const tio_trace *t)
{
    uint64_t sum = 0;
    for (uint32_t i = 0; i < t->n_tensors; i++)
        if (t->tensors[i].kind == TIO_KIND_OPTIMIZER_STATE || t->tensors[i].kind == TIO_KIND_GRADIENT)
            sum += t->tensors[i].bytes;
    return sum;
}

typedef struct {
    const tio_hw *base;
    const tio_advise_point *points;
    const tio_advise_options *opt;
    tio_advise_row *rows;
    shard_set *sets;
    uint32_t n_sets, n_points;
    uint32_t next, done;            /* guarded by mu */
    pthread_mutex_t mu;
    tio_advise_progress_fn progress;
    void *ctx;
} advise_job;

static const shard_set *set_for(const advise_job *j, uint32_t gpus)
{
    for (uint32_t i = 0; i < j->n_sets; i++)
        if (j->sets[i].gpus == gpus)
            return &j->sets[i];
    return NULL;
}

/* The profile of one point: base with its capacity, disks and host cap. */
static void point_hw(const tio_hw *base, const tio_advise_point *p, tio_hw *hw)
{
    *hw = *base;
    hw->capacity_bytes = p->capacity_bytes;
    hw->ssd_count = p->ssd_count;
    hw->host_cap_bytes = p->host_cap_bytes;
    double scale = (double)p->ssd_count / base->ssd_count;
    hw->ssd_array_read_gbps = base->ssd_array_read_gbps * scale;
    hw->ssd_array_write_gbps = base->ssd_array_write_gbps * scale;
}

static double hourly_cost(const tio_advise_prices *pr, const tio_advise_point *p)
{
    double capital = p->ssd_count * pr->ssd + (double)p->host_cap_bytes / 1e9 * pr->host_gb;
    return p->gpus * (pr->gpu_hour + (capital > 0 ? capital / pr->amortize_hours : 0));
}

/* Row r's column c at an iteration of it seconds (NaN: it did not run). */
static void set_time(const advise_job *j, tio_advise_row *r, int c, double it, double ideal_s)
{
    const tio_advise_prices *pr = &j->opt->prices;
    bool priced = pr->gpu_hour > 0 || pr->ssd > 0 || pr->host_gb > 0;
    double tokens = (double)j->opt->tokens_per_iteration * r->point.gpus;
    r->iteration_s[c] = it;
    r->share_of_ideal[c] = ideal_s / it;
    r->tokens_per_s[c] = tokens / it;
    r->usd_per_mtoken[c] = priced ? hourly_cost(pr, &r->point) / (tokens / it * 3600) * 1e6 : NAN;
}

/* The simulator gives host transfers the PCIe bandwidth the SSD array
 * leaves (tio_hw_channels), whether or not the SSDs are busy, so more
 * disks can slow a strategy that also uses host memory.  An operator would
 * leave the extra disks out (teraio and ZeRO-Infinity take the SSD
 * directories they are given): each strategy's row takes the best time of
 * the points of its group (same GPUs, device memory and host cap) with no
 * more SSDs, and says how many it used.  The price stays the row's. */
static void use_fewer_ssds(const advise_job *j)
{
    for (uint32_t i = 0; i < j->n_points; i++) {
        tio_advise_row *r = &j->rows[i];
        for (int c = TIO_ADVISE_TERAIO; c < TIO_ADVISE_N_STRATEGIES; c++) {
            const tio_advise_row *best = NULL;
            for (uint32_t o = 0; o < j->n_points; o++) {
                const tio_advise_row *q = &j->rows[o];
                if (q->point.gpus == r->point.gpus && q->point.ssd_count < r->point.ssd_count &&
                    q->point.capacity_bytes == r->point.capacity_bytes &&
                    q->point.host_cap_bytes == r->point.host_cap_bytes && !q->status[c] &&
                    q->ssds_used[c] == q->point.ssd_count &&
                    (r->status[c] || q->iteration_s[c] < r->iteration_s[c]) &&
                    (!best || q->iteration_s[c] < best->iteration_s[c]))
                    best = q;
            }
            if (!best)
                continue;
            r->status[c] = 0;
            r->ssds_used[c] = best->point.ssd_count;
            set_time(j, r, c, best->iteration_s[c], r->iteration_s[TIO_ADVISE_IDEAL]);
            if (c == TIO_ADVISE_TERAIO) {
                r->fits = best->fits;
                r->bytes_to_ssd = best->bytes_to_ssd;
                r->bytes_to_host = best->bytes_to_host;
            }
        }
    }
}

static void run_point(const advise_job *j, uint32_t i)
{
    const tio_advise_point *p = &j->points[i];
    const shard_set *s = set_for(j, p->gpus);
    tio_advise_row *r = &j->rows[i];
    memset(r, 0, sizeof *r);
    r->point = *p;
    point_hw(j->base, p, &r->hw);
    r->peak_bytes = s->lt->peak_bytes;
    r->floor_bytes = s->lt->floor_bytes;
    r->fits_without_offload = r->peak_bytes <= p->capacity_bytes;
    r->zero_offload_host_bytes = s->offload_host_bytes;
    double ideal_s = NAN;
    for (int c = 0; c < TIO_ADVISE_N_STRATEGIES; c++) {
        tio_sim_report rep;
        memset(&rep, 0, sizeof rep);
        /* ZeRO-Offload moves nothing to the SSDs: its host traffic has the
         * whole PCIe link, not what GPUDirect SSD traffic would leave. */
        tio_hw no_ssd = r->hw;
        no_ssd.ssd_array_read_gbps = no_ssd.ssd_array_write_gbps = 1e-9;
        const tio_hw *hw = c == TIO_ADVISE_ZERO_OFFLOAD ? &no_ssd : &r->hw;
        if (c != TIO_ADVISE_IDEAL && p->capacity_bytes < r->floor_bytes)
            r->status[c] = TIO_EINFEASIBLE; /* no strategy goes below the floor */
        else if (c == TIO_ADVISE_ZERO_OFFLOAD && s->offload_host_bytes > p->host_cap_bytes)
            r->status[c] = -ENOSPC;
        else
            r->status[c] = tio_sim_run(s->trace, s->lt, hw, COLUMNS[c], &rep, NULL);
        double it = r->status[c] ? NAN : rep.iteration_ns / 1e9;
        if (c == TIO_ADVISE_IDEAL)
            ideal_s = it;
        r->ssds_used[c] = c == TIO_ADVISE_IDEAL || c == TIO_ADVISE_ZERO_OFFLOAD ? 0 : p->ssd_count;
        set_time(j, r, c, it, ideal_s);
        if (c == TIO_ADVISE_TERAIO && !r->status[c]) {
            r->fits = r->floor_bytes <= p->capacity_bytes && rep.plan_fits;
            r->bytes_to_ssd = rep.bytes[TIO_CH_SSD_WRITE];
            r->bytes_to_host = rep.bytes[TIO_CH_HOST_WRITE];
        }
        tio_sim_report_free(&rep);
    }
}

static void *worker(void *arg)
{
    advise_job *j = arg;
    for (;;) {
        pthread_mutex_lock(&j->mu);
        uint32_t i = j->next < j->n_points ? j->next++ : UINT32_MAX;
        pthread_mutex_unlock(&j->mu);
        if (i == UINT32_MAX)
            return NULL;
        run_point(j, i);
        pthread_mutex_lock(&j->mu);
        j->done++;
        if (j->progress)
            j->progress(j->ctx, j->done, j->n_points);
        pthread_mutex_unlock(&j->mu);
    }
}

static int check_input(const tio_trace *trace, const tio_hw *base, const tio_advise_point *points,
                       uint32_t n, const tio_advise_options *opt, const tio_advise_row *rows)
{
    if (!trace || !base || !points || !opt || !rows || !n)
        return tio_fail(-EINVAL, "tio_advise_run: %s", n ? "NULL argument" : "no points");
    if (!opt->tokens_per_iteration)
        return tio_fail(-EINVAL, "tio_advise_run: tokens_per_iteration must be > 0");
    const tio_advise_prices *pr = &opt->prices;
    if (!(pr->gpu_hour >= 0 && pr->ssd >= 0 && pr->host_gb >= 0 && pr->amortize_hours >= 0) ||
        !isfinite(pr->gpu_hour + pr->ssd + pr->host_gb + pr->amortize_hours))
        return tio_fail(-EINVAL, "tio_advise_run: prices must be finite and >= 0");
    if ((pr->ssd > 0 || pr->host_gb > 0) && !(pr->amortize_hours > 0))
        return tio_fail(-EINVAL, "tio_advise_run: an SSD or host-memory price needs "
                        "amortize_hours > 0");
    if (!base->ssd_count)
        return tio_fail(-EINVAL, "tio_advise_run: the base profile has no SSD");
    for (uint32_t i = 0; i < n; i++) {
        const tio_advise_point *p = &points[i];
        if (!p->gpus || !p->capacity_bytes || !p->ssd_count)
            return tio_fail(-EINVAL, "tio_advise_run: point %u: %s must be >= 1", i,
                            !p->gpus ? "gpus" : !p->capacity_bytes ? "capacity_bytes"
                                                                    : "ssd_count");
    }
    return 0;
}

static void free_sets(shard_set *sets, uint32_t n)
{
    for (uint32_t i = 0; sets && i < n; i++) {
        tio_lifetime_destroy(sets[i].lt);
        tio_trace_destroy(sets[i].trace);
    }
    free(sets);
}

static int make_sets(const tio_trace *trace, advise_job *j)
{
    j->sets = calloc(j->n_points, sizeof *j->sets);
    if (!j->sets)
        return -ENOMEM;
    for (uint32_t i = 0; i < j->n_points; i++) {
        if (set_for(j, j->points[i].gpus))
            continue;
        shard_set *s = &j->sets[j->n_sets++];
        s->gpus = j->points[i].gpus;
        int rc = tio_trace_shard(trace, s->gpus, &s->trace);
        if (!rc)
            rc = tio_lifetime_analyze(s->trace, &s->lt);
        if (!rc)
            s->offload_host_bytes = offload_host_bytes(s->trace);
        if (rc)
            return rc;
    }
    return 0;
}

int tio_advise_run(const tio_trace *trace, const tio_hw *base, const tio_advise_point *points,
                   uint32_t n_points, const tio_advise_options *opt,
                   tio_advise_progress_fn progress, void *ctx, tio_advise_row *rows)
{
    int rc = check_input(trace, base, points, n_points, opt, rows);
    if (rc)
        return rc;
    advise_job j = {.base = base, .points = points, .opt = opt, .rows = rows,
                    .n_points = n_points, .progress = progress, .ctx = ctx};
    rc = make_sets(trace, &j);
    if (rc) {
        free_sets(j.sets, j.n_sets);
        return rc;
    }
    pthread_mutex_init(&j.mu, NULL);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    uint32_t n_threads = opt->threads ? opt->threads : (uint32_t)(cpus > 0 ? cpus : 1);
    if (n_threads > n_points)
        n_threads = n_points;
    pthread_t *tids = calloc(n_threads, sizeof *tids);
    uint32_t started = 0;
    for (; tids && started + 1 < n_threads; started++)
        if (pthread_create(&tids[started], NULL, worker, &j))
            break;
    worker(&j); /* this thread works too, and finishes whatever the others leave */
    for (uint32_t t = 0; t < started; t++)
        pthread_join(tids[t], NULL);
    use_fewer_ssds(&j);
    free(tids);
    pthread_mutex_destroy(&j.mu);
    free_sets(j.sets, j.n_sets);
    return 0;
}

/* a before b in "smallest hardware" order. */
static bool smaller(const tio_advise_point *a, const tio_advise_point *b)
{
    if (a->gpus != b->gpus)
        return a->gpus < b->gpus;
    if (a->capacity_bytes != b->capacity_bytes)
        return a->capacity_bytes < b->capacity_bytes;
    if (a->ssd_count != b->ssd_count)
        return a->ssd_count < b->ssd_count;
    return a->host_cap_bytes < b->host_cap_bytes;
}

static bool reaches(const tio_advise_row *r, double target)
{
    return r->fits && !r->status[TIO_ADVISE_TERAIO] &&
           r->share_of_ideal[TIO_ADVISE_TERAIO] >= target;
}

int tio_advise_smallest(const tio_advise_row *rows, uint32_t n, double target)
{
    int best = -1;
    for (uint32_t i = 0; rows && i < n; i++)
        if (reaches(&rows[i], target) && (best < 0 || smaller(&rows[i].point, &rows[best].point)))
            best = (int)i;
    return best;
}

int tio_advise_cheapest(const tio_advise_row *rows, uint32_t n, double target)
{
    int best = -1;
    for (uint32_t i = 0; rows && i < n; i++) {
        double c = rows[i].usd_per_mtoken[TIO_ADVISE_TERAIO];
        if (reaches(&rows[i], target) && isfinite(c) &&
            (best < 0 || c < rows[best].usd_per_mtoken[TIO_ADVISE_TERAIO]))
            best = (int)i;
    }
    return best;
}
