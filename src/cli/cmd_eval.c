/*
 * cli/cmd_eval.c — `teraio eval`: strategies compared in simulation.
 *
 *   teraio eval trace TRACE --hw PROFILE [--plan PLAN] [--strategy S] [--json]
 *       one trace: every strategy (or one) simulated on a profile; with
 *       --plan the given plan is replayed as well ("plan").
 *   teraio eval demo SUMMARY [--json]
 *       the CPU demo's simulator check (make demo, run V): a profile of this
 *       CPU (measured disk bandwidth; host time per kernel and per migrated
 *       byte fitted to an empty plan and a calibration plan), then the
 *       demo's plan simulated against its measured iteration time
 *       (sim-vs-measured error).
 *   teraio eval paper [--json] [--svg DIR] [--hw PROFILE]
 *       the TERAIO paper's 18 configurations (docs/eval.md): traces made on
 *       demand by the Python tracer (python -m teraio.paper, cached under
 *       build/paper-traces/), then planning and simulation here.  Each
 *       distinct trace (model, sequence length, micro-batch) is planned and
 *       simulated once.  The teraio-alg1 plans come from the fast planner
 *       under Algorithm 1's rules, which makes exactly Algorithm 1's plan
 *       (tests/c/test_sim.c checks this on random traces); the faithful
 *       O(rounds x candidates x kernels) planner is timed on Llama3-70B in a
 *       child process while the rest runs, stopped at a time limit.
 *
 * Output: a table on stdout (or one JSON document with --json); a progress
 * line on stderr while it runs when stderr is a terminal; errors are one
 * line on stderr.  Exit status 0, 1 on errors, 2 on usage errors.
 */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "teraio/teraio.h"

static const char *const CMD = "eval";

static void eval_usage(FILE *f)
{
    fprintf(f,
        "usage: teraio eval paper [--json] [--svg DIR] [--hw PROFILE]\n"
        "       teraio eval trace TRACE --hw PROFILE [--plan PLAN] [--strategy S] [--json]\n"
        "       teraio eval demo SUMMARY [--json]\n"
        "\n"
        "Simulate offloading strategies (ideal, teraio-alg1, teraio, zero-offload,\n"
        "zero-infinity, flashneuron, lru) on a hardware profile (hw/*.conf).\n"
        "\n"
        "  paper        the TERAIO paper's 18 configurations; traces are made on demand\n"
        "               with the Python tracer and cached under build/paper-traces/\n"
        "               (env TERAIO_PYTHON names the interpreter, TERAIO_ROOT the\n"
        "               source tree; both are found next to the binary otherwise)\n"
        "  trace        one trace file\n"
        "  demo         the CPU demo's summary.json (make demo): simulated vs measured\n"
        "  --json       one JSON document on stdout instead of the table\n"
        "  --svg DIR    paper: write fraction-of-ideal.svg and memory-timeline.svg\n"
        "  --hw FILE    hardware profile (paper default: hw/h100-nvl-paper.conf)\n"
        "  --plan FILE  trace: also replay this plan\n"
        "  --strategy S trace: only this strategy\n");
}

/* A usage mistake: one line on stderr, exit status 2. */
#define usage_error(...) cli_usage_error(CMD, __VA_ARGS__)

typedef struct {
    const char *mode, *target, *hw_path, *plan_path, *svg_dir, *strategy;
    bool json;
} eval_args;

static int parse_args(int argc, char **argv, eval_args *a)
{
    memset(a, 0, sizeof *a);
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "-h") || !strcmp(s, "--help")) {
            eval_usage(stdout);
            return -1;
        }
        const char **slot = !strcmp(s, "--hw") ? &a->hw_path
                            : !strcmp(s, "--plan") ? &a->plan_path
                            : !strcmp(s, "--svg") ? &a->svg_dir
                            : !strcmp(s, "--strategy") ? &a->strategy : NULL;
        if (slot) {
            if (i + 1 >= argc || !*argv[i + 1])
                return usage_error("%s: expected a value", s);
            *slot = argv[++i];
        } else if (!strcmp(s, "--json")) {
            a->json = true;
        } else if (s[0] == '-' && s[1]) {
            return usage_error("unknown option '%s'", s);
        } else if (!a->mode) {
            a->mode = s;
        } else if (!a->target) {
            a->target = s;
        } else {
            return usage_error("unexpected argument '%s'", s);
        }
    }
    if (!a->mode)
        return usage_error("missing what to evaluate: paper, trace or demo");
    if (strcmp(a->mode, "paper") && strcmp(a->mode, "trace") && strcmp(a->mode, "demo"))
        return usage_error("unknown evaluation '%s' (paper, trace or demo)", a->mode);
    if (!strcmp(a->mode, "paper") && a->target)
        return usage_error("paper takes no file argument");
    if (strcmp(a->mode, "paper") && !a->target)
        return usage_error("%s: missing %s", a->mode, !strcmp(a->mode, "demo") ? "SUMMARY"
                                                                               : "TRACE");
    if (!strcmp(a->mode, "trace") && !a->hw_path)
        return usage_error("trace: missing --hw PROFILE");
    if (!strcmp(a->mode, "demo") && (a->hw_path || a->plan_path || a->svg_dir || a->strategy))
        return usage_error("demo takes only SUMMARY and --json (its profile is measured)");
    if (!strcmp(a->mode, "paper") && (a->plan_path || a->strategy))
        return usage_error("paper takes no --plan or --strategy");
    if (!strcmp(a->mode, "trace") && a->svg_dir)
        return usage_error("trace takes no --svg");
    return 0;
}

/* ---- one trace ------------------------------------------------------------ */

typedef struct {
    tio_trace *trace;
    tio_lifetime *lt;
} loaded;

static int load_trace(const char *path, loaded *l)
{
    memset(l, 0, sizeof *l);
    int rc = tio_trace_load(path, &l->trace);
    if (!rc)
        rc = tio_lifetime_analyze(l->trace, &l->lt);
    return rc;
}

static void unload(loaded *l)
{
    tio_lifetime_destroy(l->lt);
    tio_trace_destroy(l->trace);
}

static void print_report_json(const char *name, const tio_sim_report *r, bool comma)
{
    printf("    {\"strategy\": \"%s\", \"iteration_s\": %.6f, \"ideal_s\": %.6f, "
           "\"fraction_of_ideal\": %.4f, \"stall_s\": %.6f, \"peak_bytes\": %llu, "
           "\"overflow_bytes\": %llu, \"plan_fits\": %s, \"plan_seconds\": %.4f, "
           "\"bytes\": {\"ssd_write\": %llu, \"ssd_read\": %llu, \"host_write\": %llu, "
           "\"host_read\": %llu}}%s\n",
           name, r->iteration_ns / 1e9, r->ideal_ns / 1e9, r->fraction_of_ideal,
           r->stall_ns / 1e9, (unsigned long long)r->peak_bytes,
           (unsigned long long)r->overflow_bytes, r->plan_fits ? "true" : "false",
           r->plan_seconds, (unsigned long long)r->bytes[TIO_CH_SSD_WRITE],
           (unsigned long long)r->bytes[TIO_CH_SSD_READ],
           (unsigned long long)r->bytes[TIO_CH_HOST_WRITE],
           (unsigned long long)r->bytes[TIO_CH_HOST_READ], comma ? "," : "");
}

static void print_report_row(const char *name, const tio_sim_report *r)
{
    char pk[32], sw[32], sr[32], hw[32], hr[32];
    printf("%-14s %9.3f %7.3f %8.3f %11s %11s %11s %11s %11s %8.3f\n", name,
           r->iteration_ns / 1e9, r->fraction_of_ideal, r->stall_ns / 1e9,
           tio_format_bytes(r->peak_bytes, pk), tio_format_bytes(r->bytes[TIO_CH_SSD_WRITE], sw),
           tio_format_bytes(r->bytes[TIO_CH_SSD_READ], sr),
           tio_format_bytes(r->bytes[TIO_CH_HOST_WRITE], hw),
           tio_format_bytes(r->bytes[TIO_CH_HOST_READ], hr), r->plan_seconds);
}

static void print_header(void)
{
    printf("%-14s %9s %7s %8s %11s %11s %11s %11s %11s %8s\n", "strategy", "iter s", "ideal",
           "stall s", "peak", "to ssd", "from ssd", "to host", "from host", "plan s");
}

static int eval_trace(const eval_args *a)
{
    tio_hw hw;
    loaded l;
    int rc = tio_hw_load(a->hw_path, &hw);
    if (rc)
        return cli_lib_error(CMD, rc);
    if ((rc = load_trace(a->target, &l))) {
        unload(&l);
        return cli_lib_error(CMD, rc);
    }
    int only = -1;
    if (a->strategy) {
        tio_sim_strategy s;
        if (tio_sim_strategy_parse(a->strategy, &s)) {
            unload(&l);
            return usage_error("--strategy: %s", tio_last_error());
        }
        only = (int)s;
    }
    tio_plan *given = NULL;
    if (a->plan_path && ((rc = tio_plan_load(a->plan_path, &given)) ||
                         (rc = tio_plan_check(given, l.trace, l.lt)))) {
        tio_plan_destroy(given);
        unload(&l);
        return cli_lib_error(CMD, rc);
    }
    tio_sim_report reps[TIO_SIM_N_STRATEGIES + 1];
    const char *names[TIO_SIM_N_STRATEGIES + 1];
    int nr = 0;
    for (int s = 0; s < TIO_SIM_N_STRATEGIES && !rc; s++) {
        if (only >= 0 && s != only)
            continue;
        rc = tio_sim_run(l.trace, l.lt, &hw, (tio_sim_strategy)s, &reps[nr], NULL);
        if (!rc)
            names[nr++] = tio_sim_strategy_name((tio_sim_strategy)s);
    }
    if (!rc && given) {
        rc = tio_sim_plan(l.trace, l.lt, &hw, given, &reps[nr]);
        if (!rc)
            names[nr++] = "plan";
    }
    int status = rc ? cli_lib_error(CMD, rc) : 0;
    if (!rc && a->json) {
        printf("{\n  \"trace\": \"%s\",\n  \"hw\": \"%s\",\n  \"results\": [\n", a->target,
               hw.name);
        for (int i = 0; i < nr; i++)
            print_report_json(names[i], &reps[i], i + 1 < nr);
        printf("  ]\n}\n");
    } else if (!rc) {
        printf("trace %s on %s\n", a->target, hw.name);
        print_header();
        for (int i = 0; i < nr; i++)
            print_report_row(names[i], &reps[i]);
    }
    for (int i = 0; i < nr; i++)
        tio_sim_report_free(&reps[i]);
    tio_plan_destroy(given);
    unload(&l);
    return status;
}

/* ---- the CPU demo: simulated vs measured ------------------------------------ */

/* The JSON number after "key" (blanks allowed around the colon) in a demo
 * summary; NAN if the key is absent or its value is not a finite JSON
 * number (Infinity, NaN, hex and the like are refused). */
static double json_number(const char *text, const char *key)
{
    char pat[96];
    snprintf(pat, sizeof pat, "\"%s\"", key);
    const char *p = strstr(text, pat);
    if (!p)
        return NAN;
    p += strlen(pat);
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
        p++;
    if (*p++ != ':')
        return NAN;
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
        p++;
    const char *q = p;
    if (*q == '-')
        q++;
    if (!isdigit((unsigned char)*q))
        return NAN;
    while (isdigit((unsigned char)*q) || *q == '.' || *q == 'e' || *q == 'E' || *q == '+' ||
           *q == '-')
        q++;
    char *end;
    double v = strtod(p, &end);
    return end == q && isfinite(v) ? v : NAN;
}

typedef struct {
    double sim_s, measured_s, err;    /* the check: plan R, simulated vs measured */
    double host_overhead_us;          /* fitted to the empty-plan iterations */
    double host_ns_per_byte;          /* fitted to the calibration plan's iterations */
    double empty_s, cal_s, kernels_s; /* measured E and C; the trace's kernel time */
    double kernel_scale;              /* < 1: E ran faster than the traced kernels */
    uint32_t n_kernels;
} demo_check;

/* Iteration time of `plan` simulated on hw at `capacity` with the given
 * host costs; ns, or < 0 on error (reported). */
static double demo_sim(const loaded *l, const tio_plan *plan, tio_hw hw, uint64_t capacity,
                       double host_us, double host_ns_per_byte)
{
    hw.capacity_bytes = capacity;
    hw.host_overhead_us = host_us;
    hw.migration_host_ns_per_byte = host_ns_per_byte;
    tio_sim_report r;
    int rc = tio_sim_plan(l->trace, l->lt, &hw, plan, &r);
    if (rc)
        return rc;
    double ns = (double)r.iteration_ns;
    tio_sim_report_free(&r);
    return ns;
}

/* The plan file's capacity must be the one the summary names, less the
 * demo's planning headroom (--plan-headroom, below 1/2). */
static int demo_plan_capacity(const char *path, const tio_plan *plan, uint64_t capacity)
{
    if (plan->capacity_bytes > capacity || plan->capacity_bytes < capacity / 2)
        return cli_error(CMD, "%s: planned for a capacity of %llu bytes, but the summary names "
                         "%llu: not the plan of this summary", path,
                         (unsigned long long)plan->capacity_bytes, (unsigned long long)capacity);
    return 0;
}

/* The demo's simulator check (run V of python -m teraio.demo, docs/eval.md):
 * this CPU's profile is the disk bandwidth measured through the engine, the
 * host time per kernel that makes the empty plan's simulated iteration
 * match its measured one, and the host time per migrated byte that does the
 * same for the calibration plan; with that profile the simulator predicts
 * the iteration time of the demo's own plan (R), measured in turn with the
 * other two.  Where the empty plan ran faster than the traced kernels (the
 * machine sped up since profiling), the kernel times are scaled down to it
 * instead, and no dispatch time is added. */
static int demo_error(const char *summary_path, demo_check *out)
{
    struct stat sb;
    if (stat(summary_path, &sb) != 0)
        return cli_error(CMD, "%s: cannot open: %s", summary_path, strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return cli_error(CMD, "%s: not a regular file", summary_path);
    FILE *f = fopen(summary_path, "rb");
    if (!f)
        return cli_error(CMD, "%s: cannot open: %s", summary_path, strerror(errno));
    static char text[1 << 18];
    size_t n = fread(text, 1, sizeof text - 1, f);
    bool failed = ferror(f) != 0;
    bool more = !failed && fgetc(f) != EOF;
    fclose(f);
    if (failed)
        return cli_error(CMD, "%s: read error", summary_path);
    if (more)
        return cli_error(CMD, "%s: larger than %zu bytes: not a demo summary", summary_path,
                         sizeof text - 1);
    text[n] = '\0';
    static const struct {
        const char *key;
        double max;
    } keys[] = {{"validation_iter_time_empty_s", 1e5}, {"validation_iter_time_cal_s", 1e5},
                {"validation_iter_time_offload_s", 1e5}, {"validation_capacity_cal_bytes", 1e18},
                {"validation_capacity_bytes", 1e18}, {"validation_ssd_read_gbps", 1e4},
                {"validation_ssd_write_gbps", 1e4}};
    double v[7];
    for (int i = 0; i < 7; i++) {
        v[i] = json_number(text, keys[i].key);
        if (!(v[i] > 0))
            return cli_error(CMD, "%s: no finite number > 0 for '%s': the summary of a demo "
                             "run with its simulator check (--validate-iterations > 0) is "
                             "needed", summary_path, keys[i].key);
        if (v[i] > keys[i].max || (i >= 3 && i <= 4 && (v[i] < 4096 || v[i] != floor(v[i]))) ||
            (i >= 5 && v[i] < 1e-3))
            return cli_error(CMD, "%s: '%s' is %g: out of range", summary_path, keys[i].key,
                             v[i]);
    }
    double empty_s = v[0], cal_s = v[1], meas_s = v[2];
    uint64_t cal_cap = (uint64_t)v[3], cap = (uint64_t)v[4];
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", summary_path);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = '\0';
    else
        snprintf(dir, sizeof dir, ".");
    char trace_path[PATH_MAX + 32], cal_path[PATH_MAX + 32], plan_path[PATH_MAX + 32];
    snprintf(trace_path, sizeof trace_path, "%s/trace_v.tio", dir);
    snprintf(cal_path, sizeof cal_path, "%s/plan_v_cal.tio", dir);
    snprintf(plan_path, sizeof plan_path, "%s/plan_v.tio", dir);
    /* The demo's machine: one disk at the measured bandwidths; no host tier;
     * the link is the memory bus (not the bound). */
    tio_hw hw = {.pcie_h2d_gbps = 1e4, .pcie_d2h_gbps = 1e4, .ssd_count = 1,
                 .ssd_read_gbps = v[5], .ssd_write_gbps = v[6], .ssd_latency_us = 100,
                 .host_latency_us = 0, .cpu_adam_params_per_s = 1e9};
    snprintf(hw.name, sizeof hw.name, "demo-measured");
    loaded l;
    tio_plan *cal = NULL, *plan = NULL;
    int rc = load_trace(trace_path, &l);
    if (rc)
        return cli_lib_error(CMD, rc);
    int status = 0;
    const char *where = cal_path;
    if (!(rc = tio_plan_load(cal_path, &cal)) && !(rc = tio_plan_check(cal, l.trace, l.lt))) {
        where = plan_path;
        if (!(rc = tio_plan_load(plan_path, &plan)))
            rc = tio_plan_check(plan, l.trace, l.lt);
    }
    if (rc) {
        /* name the plan file: the plan checker's message names tensors, not files */
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", tio_last_error());
        status = strstr(msg, where) ? cli_lib_error(CMD, rc)
                                    : cli_error(CMD, "%s: %s", where, msg);
    }
    if (!status)
        status = demo_plan_capacity(cal_path, cal, cal_cap);
    if (!status)
        status = demo_plan_capacity(plan_path, plan, cap);
    double kernels_ns = (double)tio_trace_iteration_ns(l.trace);
    uint32_t n_kernels = l.trace->n_kernels;
    /* dispatch per kernel: the empty plan moves nothing, so its simulated
     * time is the kernels plus n x host_overhead; or the kernels scaled */
    double host_us = (empty_s * 1e9 - kernels_ns) / n_kernels / 1e3, scale = 1;
    if (!status && host_us < 0) {
        scale = empty_s * 1e9 / kernels_ns;
        for (uint32_t k = 0; k < n_kernels; k++)
            l.trace->kernels[k].duration_ns =
                (uint64_t)((double)l.trace->kernels[k].duration_ns * scale + 0.5);
        host_us = 0;
    }
    /* host ns per migrated byte: bisection on the calibration plan
     * (simulated time grows with it) */
    double lo = 0, hi = 1, c = 0, t = 0;
    if (!status && (t = demo_sim(&l, cal, hw, cal_cap, host_us, 0)) < 0)
        status = cli_lib_error(CMD, (int)t);
    if (!status && t > cal_s * 1e9 * 1.001)
        status = cli_error(CMD, "%s: the calibration plan's measured iteration (%.3f s) is "
                           "shorter than its simulation without host costs (%.3f s): no host cost "
                           "per byte fits; the machine's speed changed during the check, run "
                           "the demo again", summary_path, cal_s, t / 1e9);
    if (!status && t < cal_s * 1e9) {
        while (!status && (t = demo_sim(&l, cal, hw, cal_cap, host_us, hi)) < cal_s * 1e9) {
            if (t < 0)
                status = cli_lib_error(CMD, (int)t);
            else if (hi >= 1e4)
                status = cli_error(CMD, "%s: no host cost per byte up to 10 us makes the "
                                   "calibration plan take its measured %.3f s", summary_path,
                                   cal_s);
            lo = hi;
            hi *= 2;
        }
        for (int it = 0; !status && it < 50; it++) {
            c = (lo + hi) / 2;
            if ((t = demo_sim(&l, cal, hw, cal_cap, host_us, c)) < 0)
                status = cli_lib_error(CMD, (int)t);
            else if (t < cal_s * 1e9)
                lo = c;
            else
                hi = c;
        }
        c = (lo + hi) / 2;
    }
    double sim_ns = 0;
    if (!status && (sim_ns = demo_sim(&l, plan, hw, cap, host_us, c)) < 0)
        status = cli_lib_error(CMD, (int)sim_ns);
    if (!status)
        *out = (demo_check){sim_ns / 1e9, meas_s, fabs(sim_ns / 1e9 - meas_s) / meas_s, host_us, c,
                            empty_s, cal_s, kernels_ns / 1e9, scale, n_kernels};
    tio_plan_destroy(cal);
    tio_plan_destroy(plan);
    unload(&l);
    return status;
}

static int eval_demo(const eval_args *a)
{
    demo_check d;
    int st = demo_error(a->target, &d);
    if (st)
        return st;
    if (a->json)
        printf("{\"simulated_s\": %.6f, \"measured_s\": %.6f, \"sim_vs_measured_error\": %.4f, "
               "\"host_overhead_us\": %.3f, \"migration_host_ns_per_byte\": %.4f, "
               "\"empty_plan_s\": %.6f, \"calibration_plan_s\": %.6f, \"kernels_s\": %.6f, "
               "\"kernel_scale\": %.4f, \"n_kernels\": %u}\n",
               d.sim_s, d.measured_s, d.err, d.host_overhead_us, d.host_ns_per_byte, d.empty_s,
               d.cal_s, d.kernels_s, d.kernel_scale, d.n_kernels);
    else
        printf("profile: kernels %.3f s per iteration (trace%s); host %.1f us per kernel (empty "
               "plan, measured %.3f s); %.3f ns per migrated byte (calibration plan, measured "
               "%.3f s)\ndemo iteration with offloading: simulated %.3f s, measured %.3f s, "
               "error %.1f%%\n", d.kernels_s * d.kernel_scale,
               d.kernel_scale < 1 ? ", scaled to the empty plan's time" : "", d.host_overhead_us,
               d.empty_s, d.host_ns_per_byte, d.cal_s, d.sim_s, d.measured_s, 100 * d.err);
    return 0;
}

/* ---- the paper's configurations ---------------------------------------------- */


enum { MAX_CONFIGS = 32 };

typedef struct {
    char model[32];
    int batch, seq, micro_batch, shards, tracer;
    double paper_m_pct, traced_m_pct;
    tio_sim_report rep[TIO_SIM_N_STRATEGIES];
    bool done;
    bool alias;  /* rep[] borrowed from an earlier configuration's same trace */
} paper_config;

/* Source tree root: $TERAIO_ROOT, else two levels above the binary
 * (build/bin/teraio). */
static void find_root(char *root, size_t n)
{
    const char *env = getenv("TERAIO_ROOT");
    if (env && *env) {
        snprintf(root, n, "%s", env);
        return;
    }
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0) {
        snprintf(root, n, ".");
        return;
    }
    exe[len] = '\0';
    for (int up = 0; up < 3; up++) {
        char *slash = strrchr(exe, '/');
        if (slash)
            *slash = '\0';
    }
    snprintf(root, n, "%s", exe);
}

/* Run the Python tracer with `args`; its stdout goes to `out` (may be NULL:
 * discarded).  Returns 0 or prints one error line and returns 1. */
static int run_tracer(const char *root, const char *args, char *out, size_t out_n)
{
    const char *py = getenv("TERAIO_PYTHON");
    char pybuf[PATH_MAX + 32], libbuf[PATH_MAX + 32], cmd[4 * PATH_MAX];
    if (!py || !*py) {
        snprintf(pybuf, sizeof pybuf, "%s/.venv/bin/python", root);
        py = pybuf;
    }
    const char *lib = getenv("TERAIO_LIBRARY");
    if (!lib || !*lib) {
        char exe[PATH_MAX];
        ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
        exe[len > 0 ? len : 0] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash)
            *slash = '\0';
        snprintf(libbuf, sizeof libbuf, "%s/../lib/libteraio.so", exe);
        lib = libbuf;
    }
    snprintf(cmd, sizeof cmd,
             "cd '%s' && PYTHONPATH='%s/python' TERAIO_LIBRARY='%s' '%s' -m teraio.paper %s "
             "2>'%s/build/paper-traces/tracer.log'",
             root, root, lib, py, args, root);
    FILE *p = popen(cmd, "r");
    if (!p)
        return cli_error(CMD, "cannot run the tracer %s: %s", py, strerror(errno));
    size_t used = 0;
    char buf[4096];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, p)) > 0)
        if (out && used + got < out_n) {
            memcpy(out + used, buf, got);
            used += got;
        }
    if (out)
        out[used] = '\0';
    int st = pclose(p);
    if (st != 0)
        return cli_error(CMD, "the tracer (%s -m teraio.paper %s) failed with status %d; see "
                         "%s/build/paper-traces/tracer.log", py, args, st, root);
    return 0;
}

static int list_configs(const char *root, paper_config *cfg, int *n)
{
    static char out[1 << 14];
    int st = run_tracer(root, "--list", out, sizeof out);
    if (st)
        return st;
    *n = 0;
    for (char *line = strtok(out, "\n"); line && *n < MAX_CONFIGS; line = strtok(NULL, "\n")) {
        paper_config *c = &cfg[*n];
        memset(c, 0, sizeof *c);
        if (sscanf(line, "{\"model\": \"%31[^\"]\", \"batch\": %d, \"seq\": %d, "
                   "\"paper_m_pct\": %lf, \"micro_batch\": %d, \"shards\": %d, "
                   "\"tracer\": %d}", c->model, &c->batch, &c->seq, &c->paper_m_pct,
                   &c->micro_batch, &c->shards, &c->tracer) == 7)
            (*n)++;
    }
    if (*n == 0)
        return cli_error(CMD, "the tracer listed no configurations");
    return 0;
}

static void progress(bool tty, int i, int n, const paper_config *c, const char *what)
{
    if (!tty)
        return;
    fprintf(stderr, "\r\033[K[%d/%d] %s batch %d seq %d: %s", i + 1, n, c->model, c->batch,
            c->seq, what);
    fflush(stderr);
}

static void trace_path(char *path, size_t n, const char *root, const tio_hw *hw,
                       const paper_config *c)
{
    snprintf(path, n, "%s/build/paper-traces/%.63s/%.31s-s%d-mb%d-x%d-t%d.tio", root,
             hw->name, c->model, c->seq, c->micro_batch, c->shards, c->tracer);
}

/* Algorithm 1's plan by the fast planner (same plan, see the file comment),
 * replayed. */
static int run_alg1(const loaded *l, const tio_hw *hw, tio_sim_report *out)
{
    tio_plan_options opt;
    tio_hw_plan_options(hw, &opt);
    tio_plan_fast_options fopt;
    tio_plan_fast_options_default(&fopt);
    fopt.best_tier = false;
    fopt.planned_stalls = false;
    tio_plan *plan = NULL;
    int rc = tio_plan_build_fast(l->trace, l->lt, &opt, &fopt, &plan);
    if (!rc)
        rc = tio_sim_plan(l->trace, l->lt, hw, plan, out);
    tio_plan_destroy(plan);
    return rc;
}

/* Trace (cached), analyse and simulate every strategy for one config. */
static int run_config(const char *root, const char *hw_path, const tio_hw *hw, paper_config *c,
                      bool tty, int i, int n)
{
    char path[PATH_MAX + 160], args[3 * PATH_MAX + 200];
    trace_path(path, sizeof path, root, hw, c);
    struct stat st;
    if (stat(path, &st) != 0) {
        progress(tty, i, n, c, "tracing");
        snprintf(args, sizeof args, "--model %.31s --batch %d --seq %d --hw '%s' -o '%s'", c->model,
                 c->batch, c->seq, hw_path, path);
        int s = run_tracer(root, args, NULL, 0);
        if (s)
            return s;
    }
    loaded l;
    int rc = load_trace(path, &l);
    for (int s = 0; s < TIO_SIM_N_STRATEGIES && !rc; s++) {
        progress(tty, i, n, c, tio_sim_strategy_name((tio_sim_strategy)s));
        if (s == TIO_SIM_TERAIO_ALG1)
            rc = run_alg1(&l, hw, &c->rep[s]);
        else
            rc = tio_sim_run(l.trace, l.lt, hw, (tio_sim_strategy)s, &c->rep[s], NULL);
    }
    if (!rc)
        c->traced_m_pct = 100.0 * (double)l.lt->peak_bytes / 94e9;
    unload(&l);
    if (rc)
        return cli_lib_error(CMD, rc);
    c->done = true;
    return 0;
}

static double speedup_zi(const paper_config *c, int s)
{
    return (double)c->rep[TIO_SIM_ZERO_INFINITY].iteration_ns / (double)c->rep[s].iteration_ns;
}

static void print_paper_table(const paper_config *cfg, int n)
{
    char pk[32], sw[32], sr[32], hw[32], hr[32];
    printf("%-11s %5s %5s %6s %6s  %-13s %6s %7s %10s %10s %10s %10s %10s %8s\n", "model",
           "batch", "seq", "M%pap", "M%tr", "strategy", "ideal", "vs ZI", "peak", "to ssd",
           "from ssd", "to host", "from host", "plan s");
    for (int i = 0; i < n; i++) {
        const paper_config *c = &cfg[i];
        for (int s = 0; s < TIO_SIM_N_STRATEGIES; s++) {
            const tio_sim_report *r = &c->rep[s];
            printf("%-11s %5d %5d %6.0f %6.0f  %-13s %6.3f %7.2f %10s %10s %10s %10s %10s %8.3f\n",
                   s ? "" : c->model, c->batch, c->seq, c->paper_m_pct, c->traced_m_pct,
                   tio_sim_strategy_name((tio_sim_strategy)s), r->fraction_of_ideal,
                   speedup_zi(c, s), tio_format_bytes(r->peak_bytes, pk),
                   tio_format_bytes(r->bytes[TIO_CH_SSD_WRITE], sw),
                   tio_format_bytes(r->bytes[TIO_CH_SSD_READ], sr),
                   tio_format_bytes(r->bytes[TIO_CH_HOST_WRITE], hw),
                   tio_format_bytes(r->bytes[TIO_CH_HOST_READ], hr), r->plan_seconds);
        }
    }
    printf("\naverage over %d configurations\n%-13s %8s %8s\n", n, "strategy", "ideal", "vs ZI");
    for (int s = 0; s < TIO_SIM_N_STRATEGIES; s++) {
        double f = 0, z = 0;
        for (int i = 0; i < n; i++) {
            f += cfg[i].rep[s].fraction_of_ideal;
            z += speedup_zi(&cfg[i], s);
        }
        printf("%-13s %8.3f %8.2f\n", tio_sim_strategy_name((tio_sim_strategy)s), f / n, z / n);
    }
}

typedef struct {
    double avg_fraction, avg_speedup_zi, plan_s_70b, alg1_plan_s_70b, demo_err;
    bool ge_alg1, m_ok, have_demo, alg1_timed_out;
} paper_summary;

static void summarize(const paper_config *cfg, int n, paper_summary *sm)
{
    memset(sm, 0, sizeof *sm);
    sm->ge_alg1 = sm->m_ok = true;
    for (int i = 0; i < n; i++) {
        const paper_config *c = &cfg[i];
        sm->avg_fraction += c->rep[TIO_SIM_TERAIO].fraction_of_ideal / n;
        sm->avg_speedup_zi += speedup_zi(c, TIO_SIM_TERAIO) / n;
        if (c->rep[TIO_SIM_TERAIO].fraction_of_ideal + 1e-9 <
            c->rep[TIO_SIM_TERAIO_ALG1].fraction_of_ideal)
            sm->ge_alg1 = false;
        if (fabs(c->traced_m_pct - c->paper_m_pct) > 0.10 * c->paper_m_pct)
            sm->m_ok = false;
        if (!strcmp(c->model, "llama3-70b")) {
            double p = c->rep[TIO_SIM_TERAIO].plan_seconds;
            sm->plan_s_70b = p > sm->plan_s_70b ? p : sm->plan_s_70b;
        }
    }
}

static void print_paper_json(const paper_config *cfg, int n, const char *hw_name,
                             const paper_summary *sm)
{
    printf("{\n  \"hw\": \"%s\",\n  \"configs\": [\n", hw_name);
    for (int i = 0; i < n; i++) {
        const paper_config *c = &cfg[i];
        printf("   {\"model\": \"%s\", \"batch\": %d, \"seq\": %d, \"micro_batch\": %d, "
               "\"shards\": %d, \"paper_m_pct\": %.1f, \"traced_m_pct\": %.1f, "
               "\"results\": [\n", c->model, c->batch, c->seq, c->micro_batch, c->shards,
               c->paper_m_pct, c->traced_m_pct);
        for (int s = 0; s < TIO_SIM_N_STRATEGIES; s++)
            print_report_json(tio_sim_strategy_name((tio_sim_strategy)s), &c->rep[s],
                              s + 1 < TIO_SIM_N_STRATEGIES);
        printf("   ]}%s\n", i + 1 < n ? "," : "");
    }
    printf("  ],\n  \"summary\": {\"configs\": %d, \"teraio_avg_fraction_of_ideal\": %.4f, "
           "\"teraio_avg_speedup_over_zero_infinity\": %.4f, \"teraio_ge_alg1_everywhere\": %s, "
           "\"m_within_10pct\": %s, \"plan_seconds_llama3_70b\": %.4f, "
           "\"alg1_plan_seconds_llama3_70b\": %.4f, \"alg1_plan_timed_out\": %s, "
           "\"sim_vs_measured_error\": ",
           n, sm->avg_fraction, sm->avg_speedup_zi, sm->ge_alg1 ? "true" : "false",
           sm->m_ok ? "true" : "false", sm->plan_s_70b, sm->alg1_plan_s_70b,
           sm->alg1_timed_out ? "true" : "false");
    if (sm->have_demo)
        printf("%.4f}\n}\n", sm->demo_err);
    else
        printf("null}\n}\n");
}

/* fraction-of-ideal.svg: one group of bars per configuration. */
static int write_bars_svg(const char *dir, const paper_config *cfg, int n)
{
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/fraction-of-ideal.svg", dir);
    FILE *f = fopen(path, "w");
    if (!f)
        return cli_error(CMD, "%s: cannot create: %s", path, strerror(errno));
    static const char *colors[] = {"#999999", "#f28e2b", "#4e79a7", "#59a14f", "#e15759",
                                   "#b07aa1", "#edc948"};
    int gw = 7 * 8 + 12, W = 80 + n * gw + 160, H = 340;
    fprintf(f, "<svg xmlns='http://www.w3.org/2000/svg' width='%d' height='%d' "
            "font-family='sans-serif' font-size='10'>\n", W, H);
    fprintf(f, "<text x='10' y='16' font-size='13'>fraction of ideal per strategy and "
            "configuration (simulated)</text>\n");
    for (int t = 0; t <= 4; t++) {
        double y = 280 - t * 62.5;
        fprintf(f, "<line x1='50' x2='%d' y1='%.1f' y2='%.1f' stroke='#ddd'/><text x='20' "
                "y='%.1f'>%.2f</text>\n", 60 + n * gw, y, y, y + 3, t * 0.25);
    }
    for (int i = 0; i < n; i++) {
        int x0 = 60 + i * gw;
        for (int s = 0; s < TIO_SIM_N_STRATEGIES; s++) {
            double v = cfg[i].rep[s].fraction_of_ideal, h = 250 * (v > 1 ? 1 : v);
            fprintf(f, "<rect x='%d' y='%.1f' width='7' height='%.1f' fill='%s'><title>%s "
                    "%d/%d %s: %.3f</title></rect>\n", x0 + s * 8, 280 - h, h, colors[s],
                    cfg[i].model, cfg[i].batch, cfg[i].seq,
                    tio_sim_strategy_name((tio_sim_strategy)s), v);
        }
        fprintf(f, "<text transform='translate(%d,292) rotate(40)'>%s b%d s%d</text>\n", x0,
                cfg[i].model, cfg[i].batch, cfg[i].seq);
    }
    for (int s = 0; s < TIO_SIM_N_STRATEGIES; s++)
        fprintf(f, "<rect x='%d' y='%d' width='10' height='10' fill='%s'/><text x='%d' "
                "y='%d'>%s</text>\n", W - 140, 40 + 16 * s, colors[s], W - 125, 49 + 16 * s,
                tio_sim_strategy_name((tio_sim_strategy)s));
    fprintf(f, "</svg>\n");
    return fclose(f) ? cli_error(CMD, "%s: write failed", path) : 0;
}

/* memory-timeline.svg: resident bytes per kernel under teraio vs ideal. */
static int write_timeline_svg(const char *dir, const paper_config *c)
{
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/memory-timeline.svg", dir);
    FILE *f = fopen(path, "w");
    if (!f)
        return cli_error(CMD, "%s: cannot create: %s", path, strerror(errno));
    const tio_sim_report *id = &c->rep[TIO_SIM_IDEAL], *te = &c->rep[TIO_SIM_TERAIO];
    uint32_t n = id->n_kernels;
    double top = (double)id->peak_bytes * 1.05, W = 900, H = 300;
    fprintf(f, "<svg xmlns='http://www.w3.org/2000/svg' width='%.0f' height='%.0f' "
            "font-family='sans-serif' font-size='11'>\n<text x='10' y='16' font-size='13'>"
            "%s batch %d seq %d: device memory per kernel (GB), no offloading vs teraio"
            "</text>\n", W + 60, H + 50, c->model, c->batch, c->seq);
    const tio_sim_report *rs[2] = {id, te};
    const char *col[2] = {"#999999", "#4e79a7"};
    for (int j = 0; j < 2; j++) {
        fprintf(f, "<polyline fill='none' stroke='%s' points='", col[j]);
        uint32_t step = n > 2000 ? n / 2000 : 1;
        for (uint32_t k = 0; k < n; k += step)
            fprintf(f, "%.1f,%.1f ", 50 + W * k / n,
                    30 + H - H * (double)rs[j]->memory_bytes[k] / top);
        fprintf(f, "'/>\n");
    }
    double cy = 30 + H - H * 94e9 / top;
    fprintf(f, "<line x1='50' x2='%.0f' y1='%.1f' y2='%.1f' stroke='#e15759' "
            "stroke-dasharray='4'/><text x='55' y='%.1f'>capacity 94 GB</text>\n", 50 + W, cy,
            cy, cy - 3);
    fprintf(f, "<text x='55' y='%.0f'>peak %.0f GB</text>\n</svg>\n", 42.0,
            (double)id->peak_bytes / 1e9);
    return fclose(f) ? cli_error(CMD, "%s: write failed", path) : 0;
}

/* The faithful Algorithm 1 (tio_plan_build) timed on one trace in a child
 * process, so the evaluation goes on meanwhile; the child writes its
 * planning seconds to a pipe. */
typedef struct {
    pid_t pid;
    int fd;
    double started_s;
} alg1_timer;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void alg1_timer_start(alg1_timer *t, const char *path, const tio_hw *hw)
{
    int p[2];
    t->pid = -1;
    t->fd = -1;
    t->started_s = now_s();
    if (pipe(p) != 0)
        return;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        loaded l;
        tio_plan_options opt;
        tio_hw_plan_options(hw, &opt);
        tio_plan *plan = NULL;
        double secs = -1;
        if (load_trace(path, &l) == 0 && tio_plan_build(l.trace, l.lt, &opt, &plan) == 0)
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

/* Wait for the child until `deadline_s` (monotonic); past it, stop the
 * child and report the time it ran as a lower bound. */
static void alg1_timer_finish(alg1_timer *t, double deadline_s, double *secs, bool *timed_out)
{
    *secs = 0;
    *timed_out = false;
    if (t->pid < 0)
        return;
    int status;
    pid_t got = 0;
    while ((got = waitpid(t->pid, &status, WNOHANG)) == 0 && now_s() < deadline_s)
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
    *secs = now_s() - t->started_s;
    *timed_out = true;
    close(t->fd);
}

/* How long the faithful Algorithm 1 may run, from the start of `eval
 * paper`: the whole evaluation has to end within 10 minutes. */
enum { ALG1_DEADLINE_S = 480 };

typedef int (*demo_fn)(const char *, demo_check *);

static int eval_paper(const char *hw_arg, const char *svg_dir, bool json, demo_fn demo)
{
    char root[PATH_MAX], hw_path[PATH_MAX + 32], dir[PATH_MAX + 160];
    find_root(root, sizeof root);
    char cwd[PATH_MAX / 2];
    if (!hw_arg)
        snprintf(hw_path, sizeof hw_path, "%s/hw/h100-nvl-paper.conf", root);
    else if (hw_arg[0] != '/' && getcwd(cwd, sizeof cwd))
        snprintf(hw_path, sizeof hw_path, "%s/%s", cwd, hw_arg);
    else
        snprintf(hw_path, sizeof hw_path, "%s", hw_arg);
    tio_hw hw;
    int rc = tio_hw_load(hw_path, &hw);
    if (rc)
        return cli_lib_error(CMD, rc);
    snprintf(dir, sizeof dir, "%s/build", root);
    mkdir(dir, 0755);
    snprintf(dir, sizeof dir, "%s/build/paper-traces", root);
    mkdir(dir, 0755);
    snprintf(dir, sizeof dir, "%s/build/paper-traces/%s", root, hw.name);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return cli_error(CMD, "%s: cannot create: %s", dir, strerror(errno));
    double t0 = now_s();
    static paper_config cfg[MAX_CONFIGS];
    int n = 0, st = list_configs(root, cfg, &n);
    bool tty = isatty(2);
    alg1_timer timer = {.pid = -1, .fd = -1};
    for (int i = 0; i < n && !st; i++) {
        paper_config *c = &cfg[i];
        int j = 0;
        while (j < i && !(cfg[j].done && !strcmp(cfg[j].model, c->model) &&
                          cfg[j].seq == c->seq && cfg[j].micro_batch == c->micro_batch &&
                          cfg[j].shards == c->shards))
            j++;
        if (j < i) {
            memcpy(c->rep, cfg[j].rep, sizeof c->rep);
            c->traced_m_pct = cfg[j].traced_m_pct;
            c->done = c->alias = true;
            continue;
        }
        st = run_config(root, hw_path, &hw, c, tty, i, n);
        if (!st && timer.pid < 0 && !strcmp(c->model, "llama3-70b") && c->batch == 16 &&
            c->seq == 2048) {
            char path[PATH_MAX + 160];
            trace_path(path, sizeof path, root, &hw, c);
            alg1_timer_start(&timer, path, &hw);
        }
    }
    if (tty)
        fprintf(stderr, "\r\033[K");
    if (!st && svg_dir) {
        mkdir(svg_dir, 0755);
        st = write_bars_svg(svg_dir, cfg, n);
        if (!st)
            st = write_timeline_svg(svg_dir, &cfg[0]);
    }
    paper_summary sm;
    summarize(cfg, n, &sm);
    if (tty && timer.pid >= 0)
        fprintf(stderr, "\r\033[Ktimer: the faithful Algorithm 1 on llama3-70b b16 s2048");
    alg1_timer_finish(&timer, t0 + ALG1_DEADLINE_S, &sm.alg1_plan_s_70b, &sm.alg1_timed_out);
    if (tty)
        fprintf(stderr, "\r\033[K");
    if (!st) {
        char demo_path[PATH_MAX + 32];
        snprintf(demo_path, sizeof demo_path, "%s/build/demo/summary.json", root);
        demo_check d;
        struct stat sb;
        if (stat(demo_path, &sb) == 0 && demo(demo_path, &d) == 0) {
            sm.have_demo = true;
            sm.demo_err = d.err;
        }
        if (json) {
            print_paper_json(cfg, n, hw.name, &sm);
        } else {
            print_paper_table(cfg, n);
            printf("\nteraio: %.3f of ideal on average, %.2fx over zero-infinity; "
                   "teraio >= teraio-alg1 everywhere: %s; M within 10%%: %s\n"
                   "planning Llama3-70B: teraio %.3f s, faithful teraio-alg1 %s%.1f s\n",
                   sm.avg_fraction, sm.avg_speedup_zi, sm.ge_alg1 ? "yes" : "no",
                   sm.m_ok ? "yes" : "no", sm.plan_s_70b,
                   sm.alg1_timed_out ? "more than " : "", sm.alg1_plan_s_70b);
            if (sm.have_demo)
                printf("simulated vs measured (CPU demo): %.1f%% error\n", 100 * sm.demo_err);
        }
    }
    for (int i = 0; i < n; i++)
        for (int s = 0; s < TIO_SIM_N_STRATEGIES && !cfg[i].alias; s++)
            tio_sim_report_free(&cfg[i].rep[s]);
    return st;
}

int cmd_eval(int argc, char **argv)
{
    eval_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc)
        return rc < 0 ? 0 : rc;
    if (!strcmp(a.mode, "trace"))
        return eval_trace(&a);
    if (!strcmp(a.mode, "demo"))
        return eval_demo(&a);
    return eval_paper(a.hw_path, a.svg_dir, a.json, demo_error);
}
