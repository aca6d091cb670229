/*
 * cli/cmd_eval.c — `teraio eval`: strategies compared in simulation.
 *
 *   teraio eval trace TRACE --hw PROFILE [--plan PLAN] [--strategy S] [--json]
 *       one trace: every strategy (or one) simulated on a profile; with
 *       --plan the given plan is replayed as well ("plan").
 *   teraio eval paper --traces DIR [--hw PROFILE] [--json] [--svg DIR]
 *                     [--alg1-seconds S]
 *       the TERAIO paper's configurations from a suite directory that
 *       `python -m teraio.paper trace DIR` (make paper-traces) writes
 *       (eval_paper.c).
 *
 * The simulator's calibration for the CPU demo (tio_sim_fit_host_costs) is
 * called by the demo itself, in-process.
 *
 * Output: a table on stdout (or one JSON document with --json); a progress
 * line on stderr while it runs when stderr is a terminal; errors are one
 * line on stderr.  Exit status 0, 1 on errors, 2 on usage errors.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/eval.h"

static const char *const CMD = "eval";

static void eval_usage(FILE *f)
{
    fprintf(f,
        "usage: teraio eval paper --traces DIR [--hw PROFILE] [--json] [--svg DIR]\n"
        "                         [--alg1-seconds S]\n"
        "       teraio eval trace TRACE --hw PROFILE [--plan PLAN] [--strategy S] [--json]\n"
        "\n"
        "Simulate offloading strategies (ideal, teraio-alg1, teraio, zero-offload,\n"
        "zero-infinity, flashneuron, lru) on a hardware profile (hw/*.conf).\n"
        "\n"
        "  paper        the TERAIO paper's configurations, from the traces in DIR\n"
        "               (written by 'python -m teraio.paper trace DIR', or\n"
        "               'make paper-traces' for build/paper-traces)\n"
        "  trace        one trace file\n"
        "  --json       one JSON document on stdout instead of the table\n"
        "  --traces DIR paper: the suite directory (DIR/suite.txt, traces, hw.conf)\n"
        "  --hw FILE    hardware profile (paper default: DIR/hw.conf, the traces' own)\n"
        "  --svg DIR    paper: write fraction-of-ideal.svg and memory-timeline.svg\n"
        "  --alg1-seconds S  paper: time the faithful Algorithm 1's greedy rounds\n"
        "               (teraio plan --planner alg1 --no-synchronous-moves) on\n"
        "               Llama3-70B for at most S seconds while the rest runs\n"
        "               (default 480; 0 skips it)\n"
        "  --plan FILE  trace: also replay this plan\n"
        "  --strategy S trace: only this strategy\n");
}

/* A usage mistake: one line on stderr, exit status 2. */
#define usage_error(...) cli_usage_error(CMD, __VA_ARGS__)

static int check_modes(const eval_args *a)
{
    if (!a->mode)
        return usage_error("missing what to evaluate: paper or trace");
    bool paper = !strcmp(a->mode, "paper"), trace = !strcmp(a->mode, "trace");
    if (!paper && !trace)
        return usage_error("unknown evaluation '%s' (paper or trace)", a->mode);
    if (paper && a->target)
        return usage_error("paper takes no file argument (the traces come from --traces DIR)");
    if (paper && !a->traces_dir)
        return usage_error("paper: missing --traces DIR (write it with 'python -m teraio.paper "
                           "trace DIR' or 'make paper-traces')");
    if (paper && (a->plan_path || a->strategy))
        return usage_error("paper takes no --plan or --strategy");
    if (trace && !a->target)
        return usage_error("trace: missing TRACE");
    if (trace && !a->hw_path)
        return usage_error("trace: missing --hw PROFILE");
    if (trace && (a->svg_dir || a->traces_dir || a->alg1_seconds >= 0))
        return usage_error("trace takes no --svg, --traces or --alg1-seconds");
    return 0;
}

static int parse_args(int argc, char **argv, eval_args *a)
{
    memset(a, 0, sizeof *a);
    a->alg1_seconds = -1;
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "-h") || !strcmp(s, "--help")) {
            eval_usage(stdout);
            return -1;
        }
        const char *alg1 = NULL;
        const char **slot = !strcmp(s, "--hw") ? &a->hw_path
                            : !strcmp(s, "--plan") ? &a->plan_path
                            : !strcmp(s, "--svg") ? &a->svg_dir
                            : !strcmp(s, "--traces") ? &a->traces_dir
                            : !strcmp(s, "--alg1-seconds") ? &alg1
                            : !strcmp(s, "--strategy") ? &a->strategy : NULL;
        if (slot) {
            if (i + 1 >= argc || !*argv[i + 1])
                return usage_error("%s: expected a value", s);
            *slot = argv[++i];
            if (alg1 && strcmp(alg1, "0") && !cli_parse_positive(alg1, &a->alg1_seconds))
                return usage_error("--alg1-seconds: expected a number of seconds >= 0, got '%s'",
                                   alg1);
            if (alg1 && !strcmp(alg1, "0"))
                a->alg1_seconds = 0;
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
    return check_modes(a);
}

/* ---- one trace ------------------------------------------------------------ */

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

static void print_trace_results(const eval_args *a, const tio_hw *hw, const char **names,
                                const tio_sim_report *reps, int nr)
{
    if (a->json) {
        printf("{\n  \"trace\": \"%s\",\n  \"hw\": \"%s\",\n  \"results\": [\n", a->target,
               hw->name);
        for (int i = 0; i < nr; i++)
            eval_print_report_json(names[i], &reps[i], i + 1 < nr);
        printf("  ]\n}\n");
        return;
    }
    printf("trace %s on %s\n", a->target, hw->name);
    printf("%-14s %9s %7s %8s %11s %11s %11s %11s %11s %8s\n", "strategy", "iter s", "ideal",
           "stall s", "peak", "to ssd", "from ssd", "to host", "from host", "plan s");
    for (int i = 0; i < nr; i++)
        print_report_row(names[i], &reps[i]);
}

static int eval_trace(const eval_args *a)
{
    tio_hw hw;
    tio_trace *trace = NULL;
    tio_lifetime *lt = NULL;
    tio_plan *given = NULL;
    int only = -1, rc = tio_hw_load(a->hw_path, &hw);
    if (!rc && a->strategy) {
        tio_sim_strategy s;
        if (tio_sim_strategy_parse(a->strategy, &s))
            return usage_error("--strategy: %s", tio_last_error());
        only = (int)s;
    }
    if (!rc && !(rc = tio_trace_load(a->target, &trace)))
        rc = tio_lifetime_analyze(trace, &lt);
    if (!rc && a->plan_path && !(rc = tio_plan_load(a->plan_path, &given)))
        rc = tio_plan_check(given, trace, lt);
    tio_sim_report reps[TIO_SIM_N_STRATEGIES + 1];
    const char *names[TIO_SIM_N_STRATEGIES + 1];
    int nr = 0;
    for (int s = 0; s < TIO_SIM_N_STRATEGIES && !rc; s++) {
        if (only >= 0 && s != only)
            continue;
        rc = tio_sim_run(trace, lt, &hw, (tio_sim_strategy)s, &reps[nr], NULL);
        if (!rc)
            names[nr++] = tio_sim_strategy_name((tio_sim_strategy)s);
    }
    if (!rc && given && !(rc = tio_sim_plan(trace, lt, &hw, given, &reps[nr])))
        names[nr++] = "plan";
    int status = rc ? cli_lib_error(CMD, rc) : 0;
    if (!rc)
        print_trace_results(a, &hw, names, reps, nr);
    for (int i = 0; i < nr; i++)
        tio_sim_report_free(&reps[i]);
    tio_plan_destroy(given);
    tio_lifetime_destroy(lt);
    tio_trace_destroy(trace);
    return status;
}

int cmd_eval(int argc, char **argv)
{
    eval_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc)
        return rc < 0 ? 0 : rc;
    return !strcmp(a.mode, "trace") ? eval_trace(&a) : eval_paper(&a);
}
