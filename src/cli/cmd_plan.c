/*
 * cli/cmd_plan.c — `teraio plan`: trace -> lifetime analysis -> plan file.
 *
 * Runs the planner --planner names (teraio, the default, or alg1, the
 * faithful Algorithm 1) and always writes the plan it got to, even when
 * that plan cannot bring the planned peak down to the capacity: the file
 * is still useful to inspect and simulate.  The exit
 * status says whether it fits, so scripts can rely on it:
 *   0  plan written and it fits the capacity;
 *   1  plan written but does not fit (one warning line on stderr), or the
 *      trace could not be read, or the capacity is below a kernel's need;
 *   2  usage error (missing option, malformed number).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "teraio/teraio.h"

static const char *const CMD = "plan";

static void plan_usage(FILE *f)
{
    fprintf(f,
        "usage: teraio plan TRACE --capacity BYTES [options] -o PLAN\n"
        "\n"
        "Plan which tensors to offload to SSD or host memory, and when, so that\n"
        "the memory every kernel needs stays within BYTES.\n"
        "\n"
        "  --capacity BYTES         device memory budget (required unless --hw), e.g. 80G\n"
        "  --hw PROFILE             take capacity, bandwidths and host cap from a hardware\n"
        "                           profile (hw/*.conf); options given override it\n"
        "  --planner teraio|alg1    teraio (default): the fast planner; alg1: TERAIO's\n"
        "                           Algorithm 1 as published, the reference, whose time\n"
        "                           grows about cubically with the kernel count\n"
        "                           (Llama3-8B, 6k kernels: ~13 s; Llama3-70B: minutes)\n"
        "  --ssd-read-gbps R        SSD read bandwidth in GB/s (default 2.0)\n"
        "  --ssd-write-gbps W       SSD write bandwidth in GB/s (default 1.5)\n"
        "  --host-to-device-gbps R  host tier read bandwidth (default: as SSD read)\n"
        "  --device-to-host-gbps W  host tier write bandwidth (default: as SSD write)\n"
        "  --host-cap BYTES         host memory the plan may use (default 0: none)\n"
        "  --no-synchronous-moves   leave memory above the capacity where no bandwidth can\n"
        "                           hide a move (Algorithm 1 as the TERAIO paper has it),\n"
        "                           instead of moving tensors synchronously (a predicted\n"
        "                           stall) so that the plan fits\n"
        "  -o, --output PLAN        plan file to write (required)\n"
        "  -h, --help               show this help\n"
        "\n"
        "BYTES takes K/M/G/T (powers of 1024) or KB/MB/GB/TB (powers of 1000).\n"
        "Exit status: 0 the plan fits the capacity; 1 the plan was written but its\n"
        "planned peak is above the capacity (a warning says so; only with\n"
        "--no-synchronous-moves), or an error (unreadable trace, capacity below a\n"
        "single kernel's need: the working-set floor); 2 bad usage.\n");
}

/* A usage mistake: one line on stderr, exit status 2. */
#define usage_error(...) cli_usage_error(CMD, __VA_ARGS__)

/* The options that set a field of tio_plan_options. */
enum { O_CAPACITY, O_HOST_CAP, O_SSD_READ, O_SSD_WRITE, O_H2D, O_D2H, N_VALUE_OPTIONS };

typedef struct {
    const char *trace_path;
    const char *out_path;
    const char *hw_path;
    bool given[N_VALUE_OPTIONS];
    tio_plan_options opt;
} plan_args;

static const struct {
    const char *name;
    bool bytes;     /* a byte count (cli_parse_bytes), else a positive number */
    size_t offset;  /* of the field in tio_plan_options */
} VALUE_OPTIONS[N_VALUE_OPTIONS] = {
    [O_CAPACITY] = {"--capacity", true, offsetof(tio_plan_options, capacity_bytes)},
    [O_HOST_CAP] = {"--host-cap", true, offsetof(tio_plan_options, host_cap_bytes)},
    [O_SSD_READ] = {"--ssd-read-gbps", false, offsetof(tio_plan_options, ssd_read_gbps)},
    [O_SSD_WRITE] = {"--ssd-write-gbps", false, offsetof(tio_plan_options, ssd_write_gbps)},
    [O_H2D] = {"--host-to-device-gbps", false, offsetof(tio_plan_options, host_to_device_gbps)},
    [O_D2H] = {"--device-to-host-gbps", false, offsetof(tio_plan_options, device_to_host_gbps)},
};

/* "--name VALUE" or "--name=VALUE": the value, advancing *i; NULL if absent. */
static const char *option_value(int argc, char **argv, int *i, const char *name, bool *matched)
{
    size_t n = strlen(name);
    *matched = false;
    if (strncmp(argv[*i], name, n) != 0)
        return NULL;
    if (argv[*i][n] == '=') {
        *matched = true;
        return argv[*i] + n + 1;
    }
    if (argv[*i][n] != '\0')
        return NULL;
    *matched = true;
    return *i + 1 < argc ? argv[++*i] : NULL;
}

/* Store value option o's value v into `opt`; false if malformed. */
static bool set_value(tio_plan_options *opt, int o, const char *v)
{
    char *field = (char *)opt + VALUE_OPTIONS[o].offset;
    if (VALUE_OPTIONS[o].bytes)
        return v && cli_parse_bytes(v, (uint64_t *)(void *)field) &&
               (o != O_CAPACITY || *(uint64_t *)(void *)field > 0);
    return v && cli_parse_positive(v, (double *)(void *)field);
}

/* One argument at *i; returns 0, or the exit status after printing. */
static int parse_arg(int argc, char **argv, int *i, plan_args *a)
{
    const char *arg = argv[*i], *v;
    bool m;
    for (int o = 0; o < N_VALUE_OPTIONS; o++)
        if ((v = option_value(argc, argv, i, VALUE_OPTIONS[o].name, &m)), m) {
            if (!set_value(&a->opt, o, v))
                return usage_error("%s: expected %s, got '%s'", VALUE_OPTIONS[o].name,
                                   o == O_CAPACITY ? "a positive byte count"
                                   : VALUE_OPTIONS[o].bytes ? "a byte count"
                                                            : "a positive number", v ? v : "");
            a->given[o] = true;
            return 0;
        }
    if ((v = option_value(argc, argv, i, "--hw", &m)), m) {
        if (!v || !*v)
            return usage_error("--hw: expected a profile file");
        a->hw_path = v;
    } else if (!strcmp(arg, "--no-synchronous-moves")) {
        a->opt.synchronous_moves = false;
    } else if ((v = option_value(argc, argv, i, "--planner", &m)), m) {
        if (!v || tio_planner_parse(v, &a->opt.planner))
            return usage_error("--planner: expected teraio or alg1, got '%s'", v ? v : "");
    } else if (((v = option_value(argc, argv, i, "--output", &m)), m) ||
               ((v = option_value(argc, argv, i, "-o", &m)), m)) {
        if (!v || !*v)
            return usage_error("%s: expected a file name", arg);
        a->out_path = v;
    } else if (arg[0] == '-' && arg[1] != '\0') {
        return usage_error("unknown option '%s'", arg);
    } else if (a->trace_path) {
        return usage_error("unexpected argument '%s': one TRACE only", arg);
    } else {
        a->trace_path = arg;
    }
    return 0;
}

/* Parse the arguments; returns 0, or the exit status after printing. */
static int parse_args(int argc, char **argv, plan_args *a)
{
    memset(a, 0, sizeof *a);
    tio_plan_options_default(&a->opt);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            plan_usage(stdout);
            return -1;
        }
        int rc = parse_arg(argc, argv, &i, a);
        if (rc)
            return rc;
    }
    if (!a->trace_path)
        return usage_error("missing TRACE");
    if (!a->given[O_CAPACITY] && !a->hw_path)
        return usage_error("missing --capacity BYTES (or --hw PROFILE)");
    if (!a->out_path)
        return usage_error("missing -o PLAN");
    struct stat in, out;
    if (stat(a->trace_path, &in) == 0 && stat(a->out_path, &out) == 0 && in.st_dev == out.st_dev &&
        in.st_ino == out.st_ino)
        return usage_error("-o %s is the trace itself: the plan would overwrite it", a->out_path);
    return 0;
}

/* The profile's options, under those given on the command line. */
static int apply_profile(plan_args *a)
{
    tio_hw hw;
    int rc = tio_hw_load(a->hw_path, &hw);
    if (rc)
        return rc;
    tio_plan_options given = a->opt;
    tio_hw_plan_options(&hw, &a->opt);
    a->opt.planner = given.planner;
    a->opt.synchronous_moves = given.synchronous_moves;
    for (int o = 0; o < N_VALUE_OPTIONS; o++)
        if (a->given[o]) {
            size_t at = VALUE_OPTIONS[o].offset;
            size_t len = VALUE_OPTIONS[o].bytes ? sizeof(uint64_t) : sizeof(double);
            memcpy((char *)&a->opt + at, (const char *)&given + at, len);
        }
    return 0;
}

static void print_summary(const plan_args *a, const tio_trace *trace, const tio_lifetime *lt,
                          const tio_plan *plan)
{
    char b1[32], b2[32];
    uint32_t offloads = 0;
    for (uint32_t i = 0; i < plan->n_migrations; i++)
        offloads += plan->migrations[i].kind == TIO_MIGRATION_OFFLOAD;
    printf("trace           %s (%u kernels, %u tensors, %u inactive periods)\n", a->trace_path,
           trace->n_kernels, trace->n_tensors, lt->n_periods);
    printf("peak before     %s (kernel %u)\n", tio_format_bytes(lt->peak_bytes, b1),
           lt->peak_kernel);
    printf("capacity        %s\n", tio_format_bytes(plan->capacity_bytes, b1));
    printf("planned peak    %s\n", tio_format_bytes(plan->planned_peak_bytes, b1));
    printf("migrations      %u (%u offload%s, %u prefetch%s)\n", plan->n_migrations, offloads,
           offloads == 1 ? "" : "s", plan->n_migrations - offloads,
           plan->n_migrations - offloads == 1 ? "" : "es");
    printf("per iteration   %s to ssd, %s to host\n", tio_format_bytes(plan->bytes_to_ssd, b1),
           tio_format_bytes(plan->bytes_to_host, b2));
    printf("peak host       %s\n", tio_format_bytes(plan->peak_host_bytes, b1));
    printf("planner         %s\n", tio_planner_name(a->opt.planner));
    printf("planning time   %.3f s\n", plan->plan_seconds);
    uint32_t sync = 0;
    for (uint32_t i = 0; i < plan->n_migrations; i++)
        sync += plan->migrations[i].trigger_kernel == plan->migrations[i].deadline_kernel;
    printf("predicted stall %.6f s per iteration (%u synchronous migration%s)\n",
           plan->predicted_stall_ns / 1e9, sync, sync == 1 ? "" : "s");
    printf("fits            %s\n", plan->fits ? "yes" : "no");
    printf("plan written    %s\n", a->out_path);
}

int cmd_plan(int argc, char **argv)
{
    plan_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc)
        return rc < 0 ? 0 : rc;
    tio_trace *trace = NULL;
    tio_lifetime *lt = NULL;
    tio_plan *plan = NULL;
    int status = 0;
    if ((a.hw_path && (rc = apply_profile(&a))) ||
        (rc = tio_trace_load(a.trace_path, &trace)) ||
        (rc = tio_lifetime_analyze(trace, &lt)) ||
        (rc = tio_plan_build(trace, lt, &a.opt, &plan)) ||
        (rc = tio_plan_save(plan, a.out_path))) {
        status = cli_lib_error(CMD, rc);
    } else {
        print_summary(&a, trace, lt, plan);
        fflush(stdout);
        if (!plan->fits) {
            char peak[32], cap[32];
            status = cli_error(CMD, "warning: plan written to %s does not fit: planned peak %s "
                               "is above the capacity %s (not enough idle time or bandwidth)",
                               a.out_path, tio_format_bytes(plan->planned_peak_bytes, peak),
                               tio_format_bytes(plan->capacity_bytes, cap));
        }
    }
    tio_plan_destroy(plan);
    tio_lifetime_destroy(lt);
    tio_trace_destroy(trace);
    return status;
}
