/*
 * cli/cmd_analyze.c — `teraio analyze TRACE`: the lifetime analysis of one
 * traced iteration, as a short report or (with --json) one JSON object.
 *
 * It prints what a person sizing a run needs first: the peak of the memory
 * curve M[k] (what the GPU would need without offloading), the largest
 * per-kernel working set (no capacity below it can work), how small the
 * active share is (the TERAIO paper's 1.7% observation), the tensor size
 * histogram and how many inactive periods are long enough to hide an SSD
 * round trip at the given bandwidths, and the tensors that make the
 * working-set floor (what its kernel accesses), and the tail periods (what
 * the program holds after its last use, which a plan moves out).  All
 * numbers come from
 * tio_lifetime_analyze / tio_lifetime_stats_compute; this file only parses
 * options and formats.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "teraio/teraio.h"

#define CMD "analyze"
#define FLOOR_SHOWN 12 /* floor tensors the report lists */

static const char *const bucket_labels[TIO_SIZE_BUCKETS] = {
    "<1MiB", "<4MiB", "<16MiB", "<64MiB", "<256MiB", "<1GiB", "<4GiB", ">=4GiB",
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: teraio analyze TRACE [--ssd-read-gbps R] [--ssd-write-gbps W] [--json]\n"
            "\n"
            "Lifetime analysis of a trace file (docs/formats.md, teraio-trace 1 to 3):\n"
            "peak of the memory curve, largest per-kernel working set, active share of\n"
            "the peak, tensor size histogram, and the inactive periods long enough to\n"
            "write a tensor to SSD and read it back.\n"
            "\n"
            "  --ssd-read-gbps R   SSD read bandwidth in GB/s (1e9 B/s), default 2.0\n"
            "  --ssd-write-gbps W  SSD write bandwidth in GB/s, default 1.5\n"
            "  --json              print one JSON object instead of the report\n"
            "  -h, --help          show this help\n");
}

/* A usage mistake: one line on stderr, exit status 2. */
#define usage_error(...) cli_usage_error(CMD, __VA_ARGS__)

static uint32_t count_global(const tio_trace *trace)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < trace->n_tensors; i++)
        n += trace->tensors[i].global;
    return n;
}

typedef struct {
    const char *path;
    double read_gbps, write_gbps;
    bool json;
} analyze_options;

/* The tail periods (lifetime.h): how many, and the most bytes they hold at
 * one kernel (what the floor would carry if they could not move). */
static void tails(const tio_lifetime *lt, uint32_t *n, uint64_t *peak_bytes)
{
    *n = 0;
    *peak_bytes = 0;
    uint32_t nk = lt->n_kernels;
    uint64_t *delta = calloc((size_t)nk + 1, sizeof *delta);
    for (uint32_t i = 0; i < lt->n_periods; i++) {
        const tio_inactive_period *p = &lt->periods[i];
        if (!p->tail)
            continue;
        (*n)++;
        if (delta) {
            delta[p->last_use + 1] += p->bytes;
            delta[p->next_use] -= p->bytes;
        }
    }
    uint64_t now = 0;
    for (uint32_t k = 0; delta && k < nk; k++) {
        now += delta[k];
        *peak_bytes = now > *peak_bytes ? now : *peak_bytes;
    }
    free(delta);
}

static void print_json(const analyze_options *o, const tio_trace *trace, const tio_lifetime *lt,
                       const tio_lifetime_stats *st, const tio_floor_tensor *floor, uint32_t n_floor)
{
    printf("{\"trace\": ");
    cli_json_string(stdout, o->path);
    printf(", \"model\": ");
    if (trace->model)
        cli_json_string(stdout, trace->model);
    else
        printf("null");
    printf(", \"kernels\": %u, \"tensors\": %u, \"global_tensors\": %u, \"accesses\": %u",
           trace->n_kernels, trace->n_tensors, count_global(trace), trace->n_accesses);
    printf(", \"iteration_ns\": %llu", (unsigned long long)tio_trace_iteration_ns(trace));
    printf(", \"peak_bytes\": %llu, \"peak_kernel\": %u", (unsigned long long)lt->peak_bytes,
           lt->peak_kernel);
    printf(", \"max_active_bytes\": %llu", (unsigned long long)lt->max_active_bytes);
    uint32_t n_tails;
    uint64_t tail_bytes;
    tails(lt, &n_tails, &tail_bytes);
    printf(", \"tail_periods\": %u, \"tail_peak_bytes\": %llu", n_tails, (unsigned long long)tail_bytes);
    if (lt->n_kernels > 0)
        printf(", \"max_active_kernel\": %u", lt->max_active_kernel);
    printf(", \"floor_bytes\": %llu, \"floor_kernel\": %u", (unsigned long long)lt->floor_bytes,
           lt->floor_kernel);
    printf(", \"floor_tensors\": [");
    for (uint32_t i = 0; i < n_floor; i++) {
        const tio_trace_tensor *t = &trace->tensors[floor[i].tensor];
        printf("%s{\"tensor\": %u, \"name\": ", i ? ", " : "", floor[i].tensor);
        if (t->name)
            cli_json_string(stdout, t->name);
        else
            printf("null");
        printf(", \"kind\": \"%s\", \"bytes\": %llu, \"reason\": \"%s\"}", tio_tensor_kind_name(t->kind),
               (unsigned long long)floor[i].bytes, tio_floor_reason_name(floor[i].reason));
    }
    printf("]");
    printf(", \"mean_active_share\": %.6g, \"max_active_share\": %.6g", st->mean_active_share,
           st->max_active_share);
    printf(", \"size_histogram\": [");
    for (int b = 0; b < TIO_SIZE_BUCKETS; b++) {
        printf("%s{\"below_bytes\": ", b ? ", " : "");
        if (b == TIO_SIZE_BUCKETS - 1)
            printf("null");
        else
            printf("%llu", (unsigned long long)st->size_bucket_limit[b]);
        printf(", \"tensors\": %u}", st->size_bucket_count[b]);
    }
    printf("], \"ssd_read_gbps\": %.6g, \"ssd_write_gbps\": %.6g", o->read_gbps, o->write_gbps);
    printf(", \"inactive_periods\": %u, \"long_periods\": %u", st->n_periods, st->n_periods_long);
    printf(", \"long_period_share\": %.6g, \"long_period_bytes_share\": %.6g}\n",
           st->long_period_share, st->long_period_bytes_share);
}

static void print_report(const analyze_options *o, const tio_trace *trace,
                         const tio_lifetime *lt, const tio_lifetime_stats *st,
                         const tio_floor_tensor *floor, uint32_t n_floor)
{
    char b1[32], b2[32];
    uint32_t globals = count_global(trace);
    printf("trace             %s\n", o->path);
    if (trace->model)
        printf("model             %s\n", trace->model);
    printf("kernels           %u (iteration %.3f ms)\n", trace->n_kernels,
           (double)tio_trace_iteration_ns(trace) / 1e6);
    printf("tensors           %u (%u global, %u intermediate), %u accesses\n", trace->n_tensors,
           globals, trace->n_tensors - globals, trace->n_accesses);
    if (trace->n_kernels > 0)
        printf("peak memory M     %s at kernel %u (%s)\n", tio_format_bytes(lt->peak_bytes, b1),
               lt->peak_kernel, trace->kernels[lt->peak_kernel].name);
    if (trace->n_kernels > 0)
        printf("max active        %s at kernel %u (%s): what one kernel accesses\n",
               tio_format_bytes(lt->max_active_bytes, b2), lt->max_active_kernel,
               trace->kernels[lt->max_active_kernel].name);
    if (trace->n_kernels > 0)
        printf("working-set floor %s at kernel %u (%s): no plan goes below it\n",
               tio_format_bytes(lt->floor_bytes, b1), lt->floor_kernel,
               trace->kernels[lt->floor_kernel].name);
    for (uint32_t i = 0; i < n_floor && i < FLOOR_SHOWN; i++) {
        const tio_trace_tensor *t = &trace->tensors[floor[i].tensor];
        char b[32], id[24];
        snprintf(id, sizeof id, "tensor %u", floor[i].tensor);
        printf("  %-10s %-15s %-24s %s\n", tio_format_bytes(floor[i].bytes, b), tio_tensor_kind_name(t->kind),
               tio_floor_reason_name(floor[i].reason), t->name ? t->name : id);
    }
    if (n_floor > FLOOR_SHOWN)
        printf("  ... and %u more tensors (--json lists them all)\n", n_floor - FLOOR_SHOWN);
    uint32_t n_tails;
    uint64_t tail_bytes;
    tails(lt, &n_tails, &tail_bytes);
    if (n_tails > 0)
        printf("held after use    %u tensors in tail periods, up to %s at once: they move out "
               "after their last use\n", n_tails, tio_format_bytes(tail_bytes, b1));
    printf("active share      mean %.2f%%, max %.2f%% of peak\n", 100 * st->mean_active_share,
           100 * st->max_active_share);
    printf("tensor sizes     ");
    for (int b = 0; b < TIO_SIZE_BUCKETS; b++)
        printf(" %s: %u", bucket_labels[b], st->size_bucket_count[b]);
    printf("\n");
    printf("inactive periods  %u, %u (%.1f%%; %.1f%% of bytes) longer than an SSD round trip "
           "at %.3g GB/s read, %.3g GB/s write\n",
           st->n_periods, st->n_periods_long, 100 * st->long_period_share,
           100 * st->long_period_bytes_share, o->read_gbps, o->write_gbps);
}

/* Returns 0 when options are complete, 2 after a usage error, -1 for --help. */
static int parse_options(int argc, char **argv, analyze_options *o)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help"))
            return -1;
        if (!strcmp(a, "--json")) {
            o->json = true;
        } else if (!strncmp(a, "--ssd-read-gbps", 15) || !strncmp(a, "--ssd-write-gbps", 16)) {
            /* "--name VALUE" or "--name=VALUE", as `teraio plan` takes them */
            size_t n = a[6] == 'r' ? 15 : 16;
            double *dst = a[6] == 'r' ? &o->read_gbps : &o->write_gbps;
            const char *v;
            if (a[n] == '=')
                v = a + n + 1;
            else if (a[n] != '\0')
                return usage_error("unknown option '%s'", a);
            else if (i + 1 >= argc)
                return usage_error("option %s needs a value in GB/s", a);
            else
                v = argv[++i];
            if (!cli_parse_positive(v, dst))
                return usage_error("expected a positive number of GB/s, got '%s'", v);
        } else if (a[0] == '-' && a[1] != '\0') {
            return usage_error("unknown option '%s'", a);
        } else if (o->path) {
            return usage_error("unexpected argument '%s' (one TRACE only)", a);
        } else {
            o->path = a;
        }
    }
    if (!o->path)
        return usage_error("missing TRACE argument");
    return 0;
}

int cmd_analyze(int argc, char **argv)
{
    analyze_options o = {.read_gbps = 2.0, .write_gbps = 1.5};
    int rc = parse_options(argc, argv, &o);
    if (rc == -1) {
        usage(stdout);
        return 0;
    }
    if (rc)
        return rc;

    tio_trace *trace = NULL;
    tio_lifetime *lt = NULL;
    tio_lifetime_stats st;
    if ((rc = tio_trace_load(o.path, &trace)) || (rc = tio_lifetime_analyze(trace, &lt)) ||
        (rc = tio_lifetime_stats_compute(lt, o.read_gbps, o.write_gbps, &st))) {
        tio_lifetime_destroy(lt);
        tio_trace_destroy(trace);
        return cli_lib_error(CMD, rc);
    }
    uint32_t n_floor = 0;
    tio_floor_tensor *floor = NULL;
    if ((rc = tio_lifetime_floor_tensors(trace, lt, NULL, 0, &n_floor)) == 0 && n_floor > 0) {
        floor = malloc(n_floor * sizeof *floor);
        rc = floor ? tio_lifetime_floor_tensors(trace, lt, floor, n_floor, &n_floor) : -ENOMEM;
    }
    if (rc) {
        free(floor);
        tio_lifetime_destroy(lt);
        tio_trace_destroy(trace);
        return rc == -ENOMEM && !floor ? cli_error(CMD, "out of memory for %u floor tensors", n_floor)
                                       : cli_lib_error(CMD, rc);
    }
    if (o.json)
        print_json(&o, trace, lt, &st, floor, n_floor);
    else
        print_report(&o, trace, lt, &st, floor, n_floor);
    free(floor);
    tio_lifetime_destroy(lt);
    tio_trace_destroy(trace);
    return 0;
}
