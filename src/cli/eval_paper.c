/*
 * cli/eval_paper.c — `teraio eval paper --traces DIR`: the TERAIO paper's
 * configurations simulated, printed as a table (or JSON) beside the
 * paper's own figures, with optional SVG charts.
 *
 * The suite directory comes from the Python tracer (python -m teraio.paper
 * trace DIR; make paper-traces), which runs the models on PyTorch's meta
 * device and caches its traces there; the library loads the suite and
 * simulates every strategy on each distinct trace (tio_sim_suite_run).
 * While that runs, the faithful Algorithm 1's greedy rounds
 * (TIO_PLANNER_ALG1 without the synchronous finish: the part the paper
 * timed) are timed on Llama3-70B (batch 16, sequence 2048) in a child
 * process, stopped at --alg1-seconds: the teraio-alg1 strategy's plan
 * comes from the teraio planner under Algorithm 1's rules (the same plan
 * far faster), so only planning time is measured here.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/eval.h"

static const char *const CMD = "eval";

enum { ALG1_DEFAULT_SECONDS = 480 };

typedef struct {
    const tio_sim_suite *suite;
    tio_sim_suite_result *res;
    const tio_hw *hw;
} paper;

typedef struct {
    const tio_sim_suite *suite;
    bool tty;
} progress_ctx;

static void progress(void *ctx, uint32_t i, const char *strategy)
{
    const progress_ctx *p = ctx;
    if (!p->tty)
        return;
    const tio_sim_suite_config *c = &p->suite->configs[i];
    fprintf(stderr, "\r\033[K[%u/%u] %s batch %u seq %u: %s", i + 1, p->suite->n_configs,
            c->model, c->batch, c->seq, strategy);
    fflush(stderr);
}

/* ---- the faithful Algorithm 1, timed in a child process --------------------- */

typedef struct {
    pid_t pid;
    int fd;
    uint64_t started_ns;
} alg1_timer;

static void alg1_timer_start(alg1_timer *t, const char *path, const tio_hw *hw)
{
    int p[2];
    t->pid = -1;
    t->fd = -1;
    t->started_ns = tio_now_ns();
    if (pipe(p) != 0)
        return;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        tio_trace *trace = NULL;
        tio_lifetime *lt = NULL;
        tio_plan *plan = NULL;
        tio_plan_options opt;
        tio_hw_plan_options(hw, &opt);
        opt.planner = TIO_PLANNER_ALG1;
        opt.synchronous_moves = false; /* the greedy rounds: what the paper timed */
        double secs = -1;
        if (!tio_trace_load(path, &trace) && !tio_lifetime_analyze(trace, &lt) &&
            !tio_plan_build(trace, lt, &opt, &plan))
            secs = plan->plan_seconds;
        ssize_t w = write(p[1], &secs, sizeof secs);
        _exit(w == (ssize_t)sizeof secs ? 0 : 1);
    }
    close(p[1]);
    if (pid < 0) {
        close(p[0]);
        return;
    }
    t->pid = pid;
    t->fd = p[0];
}

/* Wait for the child until `limit_s` after it started; past it, stop the
 * child and report the time it ran as a lower bound (*timed_out). */
static void alg1_timer_finish(alg1_timer *t, double limit_s, double *secs, bool *timed_out)
{
    *secs = 0;
    *timed_out = false;
    if (t->pid < 0)
        return;
    int status;
    pid_t got = 0;
    uint64_t deadline = t->started_ns + (uint64_t)(limit_s * 1e9);
    while ((got = waitpid(t->pid, &status, WNOHANG)) == 0 && tio_now_ns() < deadline)
        usleep(100000);
    if (got == t->pid && WIFEXITED(status) && WEXITSTATUS(status) == 0 &&
        read(t->fd, secs, sizeof *secs) == (ssize_t)sizeof *secs && *secs >= 0) {
        close(t->fd);
        return;
    }
    if (got == 0) {
        kill(t->pid, SIGKILL);
        waitpid(t->pid, &status, 0);
    }
    *secs = (double)(tio_now_ns() - t->started_ns) / 1e9;
    *timed_out = true;
    close(t->fd);
}

/* ---- summaries ------------------------------------------------------------- */

typedef struct {
    double avg_fraction, avg_speedup_zi, plan_s_70b, alg1_plan_s_70b;
    bool ge_alg1, m_ok, alg1_timed_out;
} paper_summary;

static double speedup_zi(const tio_sim_suite_result *r, int s)
{
    return (double)r->rep[TIO_SIM_ZERO_INFINITY].iteration_ns / (double)r->rep[s].iteration_ns;
}

static void summarize(const paper *p, paper_summary *sm)
{
    uint32_t n = p->suite->n_configs;
    sm->ge_alg1 = sm->m_ok = true;
    for (uint32_t i = 0; i < n; i++) {
        const tio_sim_suite_config *c = &p->suite->configs[i];
        const tio_sim_suite_result *r = &p->res[i];
        sm->avg_fraction += r->rep[TIO_SIM_TERAIO].fraction_of_ideal / n;
        sm->avg_speedup_zi += speedup_zi(r, TIO_SIM_TERAIO) / n;
        if (r->rep[TIO_SIM_TERAIO].fraction_of_ideal + 1e-9 <
            r->rep[TIO_SIM_TERAIO_ALG1].fraction_of_ideal)
            sm->ge_alg1 = false;
        if (fabs(r->traced_m_pct - c->reference_m_pct) > 0.10 * c->reference_m_pct)
            sm->m_ok = false;
        if (!strcmp(c->model, "llama3-70b") && r->rep[TIO_SIM_TERAIO].plan_seconds > sm->plan_s_70b)
            sm->plan_s_70b = r->rep[TIO_SIM_TERAIO].plan_seconds;
    }
}

/* Mean fraction of ideal of strategy s over the configurations of `model`
 * ("all": every configuration); NAN if there are none. */
static double model_mean(const paper *p, const char *model, int s)
{
    double sum = 0;
    uint32_t n = 0;
    for (uint32_t i = 0; i < p->suite->n_configs; i++)
        if (!strcmp(model, "all") || !strcmp(p->suite->configs[i].model, model)) {
            sum += p->res[i].rep[s].fraction_of_ideal;
            n++;
        }
    return n ? sum / n : NAN;
}

/* ---- output ----------------------------------------------------------------- */

static void print_table(const paper *p)
{
    char pk[32], sw[32], sr[32], hw[32], hr[32];
    printf("%-11s %5s %5s %6s %6s  %-13s %6s %7s %10s %10s %10s %10s %10s %8s\n", "model",
           "batch", "seq", "M%pap", "M%tr", "strategy", "ideal", "vs ZI", "peak", "to ssd",
           "from ssd", "to host", "from host", "plan s");
    uint32_t n = p->suite->n_configs;
    for (uint32_t i = 0; i < n; i++) {
        const tio_sim_suite_config *c = &p->suite->configs[i];
        for (int s = 0; s < TIO_SIM_N_STRATEGIES; s++) {
            const tio_sim_report *r = &p->res[i].rep[s];
            printf("%-11s %5u %5u %6.0f %6.0f  %-13s %6.3f %7.2f %10s %10s %10s %10s %10s %8.3f\n",
                   s ? "" : c->model, c->batch, c->seq, c->reference_m_pct,
                   p->res[i].traced_m_pct, tio_sim_strategy_name((tio_sim_strategy)s),
                   r->fraction_of_ideal, speedup_zi(&p->res[i], s),
                   tio_format_bytes(r->peak_bytes, pk),
                   tio_format_bytes(r->bytes[TIO_CH_SSD_WRITE], sw),
                   tio_format_bytes(r->bytes[TIO_CH_SSD_READ], sr),
                   tio_format_bytes(r->bytes[TIO_CH_HOST_WRITE], hw),
                   tio_format_bytes(r->bytes[TIO_CH_HOST_READ], hr), r->plan_seconds);
        }
    }
    printf("\naverage over %u configurations\n%-13s %8s %8s\n", n, "strategy", "ideal", "vs ZI");
    for (int s = 0; s < TIO_SIM_N_STRATEGIES; s++) {
        double f = 0, z = 0;
        for (uint32_t i = 0; i < n; i++) {
            f += p->res[i].rep[s].fraction_of_ideal;
            z += speedup_zi(&p->res[i], s);
        }
        printf("%-13s %8.3f %8.2f\n", tio_sim_strategy_name((tio_sim_strategy)s), f / n, z / n);
    }
}

static void print_fidelity(const paper *p)
{
    if (!p->suite->n_references)
        return;
    printf("\nfidelity: published fraction of ideal vs simulated (mean over the model's "
           "configurations)\n%-11s %-13s %9s %9s %9s %9s %9s\n", "model", "strategy", "paper",
           "simulated", "diff", "relative", "teraio");
    for (uint32_t i = 0; i < p->suite->n_references; i++) {
        const tio_sim_suite_reference *ref = &p->suite->references[i];
        double sim = model_mean(p, ref->model, (int)ref->strategy);
        printf("%-11s %-13s %9.3f %9.3f %+9.3f %+8.1f%% %9.3f\n", ref->model,
               tio_sim_strategy_name(ref->strategy), ref->fraction_of_ideal, sim,
               sim - ref->fraction_of_ideal, 100 * (sim / ref->fraction_of_ideal - 1),
               model_mean(p, ref->model, TIO_SIM_TERAIO));
    }
}

static void print_json(const paper *p, const paper_summary *sm)
{
    printf("{\n  \"hw\": \"%s\",\n  \"configs\": [\n", p->hw->name);
    uint32_t n = p->suite->n_configs;
    for (uint32_t i = 0; i < n; i++) {
        const tio_sim_suite_config *c = &p->suite->configs[i];
        printf("   {\"model\": \"%s\", \"batch\": %u, \"seq\": %u, \"micro_batch\": %u, "
               "\"shards\": %u, \"paper_m_pct\": %.1f, \"traced_m_pct\": %.1f, "
               "\"trace\": \"%s\", \"results\": [\n", c->model, c->batch, c->seq,
               c->micro_batch, c->shards, c->reference_m_pct, p->res[i].traced_m_pct, c->trace);
        for (int s = 0; s < TIO_SIM_N_STRATEGIES; s++)
            eval_print_report_json(tio_sim_strategy_name((tio_sim_strategy)s), &p->res[i].rep[s],
                                   s + 1 < TIO_SIM_N_STRATEGIES);
        printf("   ]}%s\n", i + 1 < n ? "," : "");
    }
    printf("  ],\n  \"fidelity\": [\n");
    for (uint32_t i = 0; i < p->suite->n_references; i++) {
        const tio_sim_suite_reference *ref = &p->suite->references[i];
        double sim = model_mean(p, ref->model, (int)ref->strategy);
        printf("   {\"model\": \"%s\", \"strategy\": \"%s\", \"paper\": %.4f, \"simulated\": %.4f, "
               "\"difference\": %.4f, \"relative_difference\": %.4f, \"teraio\": %.4f}%s\n",
               ref->model, tio_sim_strategy_name(ref->strategy), ref->fraction_of_ideal, sim,
               sim - ref->fraction_of_ideal, sim / ref->fraction_of_ideal - 1,
               model_mean(p, ref->model, TIO_SIM_TERAIO),
               i + 1 < p->suite->n_references ? "," : "");
    }
    printf("  ],\n  \"summary\": {\"configs\": %u, \"teraio_avg_fraction_of_ideal\": %.4f, "
           "\"teraio_avg_speedup_over_zero_infinity\": %.4f, \"teraio_ge_alg1_everywhere\": %s, "
           "\"m_within_10pct\": %s, \"plan_seconds_llama3_70b\": %.4f, "
           "\"alg1_plan_seconds_llama3_70b\": %.4f, \"alg1_plan_timed_out\": %s}\n}\n",
           n, sm->avg_fraction, sm->avg_speedup_zi, sm->ge_alg1 ? "true" : "false",
           sm->m_ok ? "true" : "false", sm->plan_s_70b, sm->alg1_plan_s_70b,
           sm->alg1_timed_out ? "true" : "false");
}

static void print_summary(const paper_summary *sm, bool timed)
{
    printf("\nteraio: %.3f of ideal on average, %.2fx over zero-infinity; "
           "teraio >= teraio-alg1 everywhere: %s; M within 10%%: %s\n",
           sm->avg_fraction, sm->avg_speedup_zi, sm->ge_alg1 ? "yes" : "no",
           sm->m_ok ? "yes" : "no");
    if (timed)
        printf("planning Llama3-70B: teraio %.3f s, faithful teraio-alg1 %s%.1f s\n",
               sm->plan_s_70b, sm->alg1_timed_out ? "more than " : "", sm->alg1_plan_s_70b);
    else
        printf("planning Llama3-70B: teraio %.3f s (faithful teraio-alg1 not timed)\n",
               sm->plan_s_70b);
}

/* The configuration whose trace the faithful planner is timed on. */
static int timed_config(const tio_sim_suite *s)
{
    for (uint32_t i = 0; i < s->n_configs; i++)
        if (!strcmp(s->configs[i].model, "llama3-70b") && s->configs[i].batch == 16 &&
            s->configs[i].seq == 2048)
            return (int)i;
    return -1;
}

int eval_paper(const eval_args *a)
{
    char hw_path[PATH_MAX], trace_path[PATH_MAX];
    if (a->hw_path)
        snprintf(hw_path, sizeof hw_path, "%s", a->hw_path);
    else if (snprintf(hw_path, sizeof hw_path, "%s/hw.conf", a->traces_dir) >= (int)sizeof hw_path)
        return cli_error(CMD, "%s: path too long", a->traces_dir);
    tio_hw hw;
    tio_sim_suite *suite = NULL;
    int rc = tio_sim_suite_load(a->traces_dir, &suite);
    if (rc == -ENOENT)
        return cli_error(CMD, "%s (write the suite with 'python -m teraio.paper trace %s')",
                         tio_last_error(), a->traces_dir);
    if (!rc)
        rc = tio_hw_load(hw_path, &hw);
    if (rc) {
        tio_sim_suite_destroy(suite);
        return cli_lib_error(CMD, rc);
    }
    double limit = a->alg1_seconds < 0 ? ALG1_DEFAULT_SECONDS : a->alg1_seconds;
    int timed = limit > 0 ? timed_config(suite) : -1;
    alg1_timer timer = {.pid = -1, .fd = -1};
    if (timed >= 0 && snprintf(trace_path, sizeof trace_path, "%s/%s", a->traces_dir,
                               suite->configs[timed].trace) < (int)sizeof trace_path)
        alg1_timer_start(&timer, trace_path, &hw);
    progress_ctx pc = {suite, isatty(2) != 0};
    paper p = {suite, NULL, &hw};
    rc = tio_sim_suite_run(suite, a->traces_dir, &hw, progress, &pc, &p.res);
    paper_summary sm = {0};
    if (!rc) {
        summarize(&p, &sm);
        if (pc.tty && timer.pid >= 0)
            fprintf(stderr, "\r\033[Ktimer: the faithful Algorithm 1 on llama3-70b b16 s2048");
    }
    alg1_timer_finish(&timer, limit, &sm.alg1_plan_s_70b, &sm.alg1_timed_out);
    if (pc.tty)
        fprintf(stderr, "\r\033[K");
    int status = rc ? cli_lib_error(CMD, rc) : 0;
    if (!status && a->svg_dir)
        status = eval_svg_write(a->svg_dir, suite, p.res, &hw);
    if (!status && a->json) {
        print_json(&p, &sm);
    } else if (!status) {
        print_table(&p);
        print_fidelity(&p);
        print_summary(&sm, timed >= 0);
    }
    tio_sim_suite_results_free(p.res, suite->n_configs);
    tio_sim_suite_destroy(suite);
    return status;
}
