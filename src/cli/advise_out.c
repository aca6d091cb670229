/*
 * cli/advise_out.c — what `teraio advise` prints: the table with the
 * smallest and cheapest hardware that reach the target, the JSON document,
 * and the chart of iteration time against SSD count.
 *
 * Memory is printed in decimal GB (1e9 bytes), as GPU and SSD vendors
 * state it; a strategy whose simulation failed prints "-" (null in JSON).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/advise.h"
#include "cli/cli.h"

static const char *const CMD = "advise";
static const char *const LABEL[TIO_ADVISE_N_STRATEGIES] = {"ideal", "teraio", "zero-infinity",
                                                            "zero-offload"};

static double gb(uint64_t bytes) { return (double)bytes / 1e9; }

static bool priced(const tio_advise_prices *p)
{
    return p->gpu_hour > 0 || p->ssd > 0 || p->host_gb > 0;
}

/* A strategy's time; '*' where it used fewer of the point's SSDs. */
static void print_time(const tio_advise_row *r, int c)
{
    if (!isfinite(r->iteration_s[c]))
        printf(" %9s", "-");
    else if (r->ssds_used[c] && r->ssds_used[c] < r->point.ssd_count)
        printf(" %8.3f*", r->iteration_s[c]);
    else
        printf(" %9.3f", r->iteration_s[c]);
}

static void describe(const tio_advise_row *r, char *buf, size_t n)
{
    snprintf(buf, n, "%u GPU%s x %.0f GB, %u SSD%s per GPU, host %.0f GB per GPU", r->point.gpus,
             r->point.gpus > 1 ? "s" : "", gb(r->point.capacity_bytes), r->point.ssd_count,
             r->point.ssd_count > 1 ? "s" : "", gb(r->point.host_cap_bytes));
}

static void print_choice(const char *what, const advise_job_info *job, const tio_advise_row *r)
{
    char hw[160];
    describe(r, hw, sizeof hw);
    if (r->fits_without_offload)
        printf("%s: %u GPU%s x %.0f GB: fits without offloading (no SSD or host memory needed), "
               "%.0f tokens/s", what, r->point.gpus, r->point.gpus > 1 ? "s" : "",
               gb(r->point.capacity_bytes), r->tokens_per_s[TIO_ADVISE_IDEAL]);
    else
        printf("%s: %s: teraio at %.3f of ideal, %.0f tokens/s", what, hw,
               r->share_of_ideal[TIO_ADVISE_TERAIO], r->tokens_per_s[TIO_ADVISE_TERAIO]);
    if (priced(job->prices))
        printf(", %.4g per million tokens", r->usd_per_mtoken[TIO_ADVISE_TERAIO]);
    printf("\n");
}

static void print_none(const advise_job_info *job, const tio_advise_row *rows, uint32_t n)
{
    int best = -1;
    for (uint32_t i = 0; i < n; i++)
        if (rows[i].fits && (best < 0 || rows[i].share_of_ideal[TIO_ADVISE_TERAIO] >
                                             rows[best].share_of_ideal[TIO_ADVISE_TERAIO]))
            best = (int)i;
    printf("no hardware here reaches %.2f of ideal under teraio", job->target);
    if (best >= 0) {
        char hw[160];
        describe(&rows[best], hw, sizeof hw);
        printf(" (the closest: %s, at %.4f)", hw, rows[best].share_of_ideal[TIO_ADVISE_TERAIO]);
    } else {
        printf(" (none fits: the working-set floor is %.1f GB per GPU at %u GPU%s)",
               gb(rows[0].floor_bytes), rows[0].point.gpus, rows[0].point.gpus > 1 ? "s" : "");
    }
    printf("\n");
}

/* The smallest (and cheapest) hardware reaching the target, and where the
 * sweep has several host caps and the answer uses host memory, the
 * smallest for each host cap. */
static void print_best(const advise_job_info *job, const tio_advise_row *rows, uint32_t n)
{
    int s = tio_advise_smallest(rows, n, job->target);
    char what[128];
    if (s < 0) {
        print_none(job, rows, n);
        return;
    }
    snprintf(what, sizeof what, "smallest hardware reaching %.2f of ideal", job->target);
    print_choice(what, job, &rows[s]);
    int c = tio_advise_cheapest(rows, n, job->target);
    if (c >= 0 && c != s) {
        snprintf(what, sizeof what, "cheapest per token reaching %.2f of ideal", job->target);
        print_choice(what, job, &rows[c]);
    }
    if (rows[s].fits_without_offload)
        return;
    tio_advise_row *sub = malloc(n * sizeof *sub);
    uint32_t *at = malloc(n * sizeof *at);
    for (uint32_t i = 0; sub && at && i < n; i++) {
        bool first = true;
        for (uint32_t j = 0; j < i && first; j++)
            first = rows[j].point.host_cap_bytes != rows[i].point.host_cap_bytes;
        if (!first || rows[i].point.host_cap_bytes == rows[s].point.host_cap_bytes)
            continue;
        uint32_t m = 0;
        for (uint32_t j = 0; j < n; j++)
            if (rows[j].point.host_cap_bytes == rows[i].point.host_cap_bytes) {
                sub[m] = rows[j];
                at[m++] = j;
            }
        int b = tio_advise_smallest(sub, m, job->target);
        snprintf(what, sizeof what, "with host %.0f GB per GPU, smallest reaching %.2f",
                 gb(rows[i].point.host_cap_bytes), job->target);
        if (b >= 0)
            print_choice(what, job, &rows[at[b]]);
        else
            printf("%s: none here\n", what);
    }
    free(sub);
    free(at);
}

void advise_print_table(const advise_job_info *job, const tio_advise_row *rows, uint32_t n)
{
    bool costs = priced(job->prices);
    printf("teraio advise: %s on %s, %llu tokens per GPU per iteration (simulated)\n", job->model,
           job->hw_name, (unsigned long long)job->tokens_per_iteration);
    printf("%4s %8s %4s %7s %9s %9s %5s %6s %9s %9s %9s %9s %6s %10s%s\n", "gpus", "GPU mem",
           "SSDs", "host", "peak", "floor", "plain", "teraio", "ideal s", "teraio s", "ZeRO-Inf",
           "ZeRO-Off", "share", "tokens/s", costs ? "     $/Mtok" : "");
    for (uint32_t i = 0; i < n; i++) {
        const tio_advise_row *r = &rows[i];
        printf("%4u %5.0f GB %4u %4.0f GB %6.1f GB %6.1f GB %5s %6s", r->point.gpus,
               gb(r->point.capacity_bytes), r->point.ssd_count, gb(r->point.host_cap_bytes),
               gb(r->peak_bytes), gb(r->floor_bytes), r->fits_without_offload ? "fits" : "no",
               r->fits ? "fits" : "no");
        for (int c = 0; c < TIO_ADVISE_N_STRATEGIES; c++)
            print_time(r, c);
        char share[16] = "-", tps[24] = "-", cost[24] = "-";
        if (isfinite(r->share_of_ideal[TIO_ADVISE_TERAIO]))
            snprintf(share, sizeof share, "%.3f", r->share_of_ideal[TIO_ADVISE_TERAIO]);
        if (isfinite(r->tokens_per_s[TIO_ADVISE_TERAIO]))
            snprintf(tps, sizeof tps, "%.0f", r->tokens_per_s[TIO_ADVISE_TERAIO]);
        if (isfinite(r->usd_per_mtoken[TIO_ADVISE_TERAIO]))
            snprintf(cost, sizeof cost, "%.4g", r->usd_per_mtoken[TIO_ADVISE_TERAIO]);
        printf(" %6s %10s", share, tps);
        if (costs)
            printf(" %10s", cost);
        printf("\n");
    }
    printf("peak and floor per GPU; plain: fits without offloading; share: teraio's share of "
           "ideal; tokens/s: all GPUs under teraio;\n* faster with fewer of the point's SSDs "
           "(more would take PCIe from host transfers: docs/advise.md), the time with those\n");
    print_best(job, rows, n);
}

static void json_number(const char *key, double v, bool comma)
{
    if (isfinite(v))
        printf("\"%s\": %.9g%s", key, v, comma ? ", " : "");
    else
        printf("\"%s\": null%s", key, comma ? ", " : "");
}

static void json_row(const tio_advise_row *r, bool comma)
{
    printf("    {\"gpus\": %u, \"gpu_mem_bytes\": %llu, \"ssds_per_gpu\": %u, "
           "\"host_cap_bytes\": %llu, \"peak_bytes\": %llu, \"floor_bytes\": %llu, "
           "\"fits_without_offload\": %s, \"fits\": %s, \"teraio_bytes_to_ssd\": %llu, "
           "\"teraio_bytes_to_host\": %llu, \"zero_offload_host_bytes\": %llu,\n     \"strategies\": {", r->point.gpus,
           (unsigned long long)r->point.capacity_bytes, r->point.ssd_count,
           (unsigned long long)r->point.host_cap_bytes, (unsigned long long)r->peak_bytes,
           (unsigned long long)r->floor_bytes, r->fits_without_offload ? "true" : "false",
           r->fits ? "true" : "false", (unsigned long long)r->bytes_to_ssd,
           (unsigned long long)r->bytes_to_host, (unsigned long long)r->zero_offload_host_bytes);
    for (int c = 0; c < TIO_ADVISE_N_STRATEGIES; c++) {
        printf("\"%s\": {", LABEL[c]);
        json_number("iteration_s", r->iteration_s[c], true);
        json_number("share_of_ideal", r->share_of_ideal[c], true);
        json_number("tokens_per_s", r->tokens_per_s[c], true);
        json_number("usd_per_mtoken", r->usd_per_mtoken[c], true);
        printf("\"ssds_used\": %u, ", r->ssds_used[c]);
        printf("\"error\": ");
        char why[128];
        if (r->status[c] == -ENOSPC)
            snprintf(why, sizeof why, "needs %llu bytes of host memory",
                     (unsigned long long)r->zero_offload_host_bytes);
        else if (r->status[c] == TIO_EINFEASIBLE)
            snprintf(why, sizeof why, "device memory below the working-set floor (%llu bytes)",
                     (unsigned long long)r->floor_bytes);
        else if (r->status[c] == -ERANGE)
            snprintf(why, sizeof why, "the simulated time overflows: a bandwidth far too small");
        else
            snprintf(why, sizeof why, "%s", tio_strerror(r->status[c]));
        if (r->status[c])
            cli_json_string(stdout, why);
        else
            printf("null");
        printf("}%s", c + 1 < TIO_ADVISE_N_STRATEGIES ? ", " : "");
    }
    printf("}}%s\n", comma ? "," : "");
}

void advise_print_json(const advise_job_info *job, const tio_advise_row *rows, uint32_t n)
{
    printf("{\"model\": ");
    cli_json_string(stdout, job->model);
    printf(", \"trace\": ");
    cli_json_string(stdout, job->trace_path);
    printf(", \"hw\": ");
    cli_json_string(stdout, job->hw_name);
    printf(", \"tokens_per_gpu_iteration\": %llu, ",
           (unsigned long long)job->tokens_per_iteration);
    json_number("target", job->target, true);
    const tio_advise_prices *p = job->prices;
    printf("\"prices\": {");
    json_number("gpu_hour", p->gpu_hour, true);
    json_number("ssd", p->ssd, true);
    json_number("host_gb", p->host_gb, true);
    json_number("amortize_hours", p->amortize_hours, false);
    printf("},\n  \"rows\": [\n");
    for (uint32_t i = 0; i < n; i++)
        json_row(&rows[i], i + 1 < n);
    int s = tio_advise_smallest(rows, n, job->target), c = tio_advise_cheapest(rows, n, job->target);
    printf("  ],\n  \"smallest\": ");
    printf(s >= 0 ? "%d" : "null", s);
    printf(", \"cheapest\": ");
    printf(c >= 0 ? "%d" : "null", c);
    printf("}\n");
}

/* ---- the chart ---------------------------------------------------------------- */

static bool same_group(const tio_advise_point *a, const tio_advise_point *b)
{
    return a->gpus == b->gpus && a->capacity_bytes == b->capacity_bytes &&
           a->host_cap_bytes == b->host_cap_bytes;
}

/* A round step for about 4 ticks up to `top`: 1, 2 or 5 times a power of ten. */
static double tick_step(double top)
{
    double raw = top / 4, p = pow(10, floor(log10(raw))), m = raw / p;
    return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
}

/* One panel: the rows of one group, x = SSDs per GPU, y = iteration
 * seconds on the chart's one scale `top`. */
static void panel(FILE *f, const tio_advise_row *rows, uint32_t n, uint32_t first, double y0,
                  uint32_t max_ssd, double top)
{
    static const char *colors[TIO_ADVISE_N_STRATEGIES] = {"#999999", "#4e79a7", "#e15759",
                                                           "#59a14f"};
    const double W = 520, H = 180, X = 70;
    const tio_advise_point *g = &rows[first].point;
    fprintf(f, "<text x='%.0f' y='%.0f' font-size='12'>%u GPU%s x %.0f GB, host %.0f GB per GPU"
            "</text>\n", X, y0 - 8, g->gpus, g->gpus > 1 ? "s" : "", gb(g->capacity_bytes),
            gb(g->host_cap_bytes));
    fprintf(f, "<rect x='%.0f' y='%.0f' width='%.0f' height='%.0f' fill='none' stroke='#ccc'/>\n",
            X, y0, W, H);
    double step = tick_step(top);
    for (double v = 0; v <= top * 1.0001; v += step)
        fprintf(f, "<line x1='%.0f' x2='%.0f' y1='%.1f' y2='%.1f' stroke='#eee'/><text x='%.0f' "
                "y='%.1f' text-anchor='end'>%g</text>\n", X, X + W, y0 + H - H * v / top,
                y0 + H - H * v / top, X - 4, y0 + H - H * v / top + 3, v);
    fprintf(f, "<text transform='translate(%.0f,%.0f) rotate(-90)' text-anchor='middle'>"
            "iteration s</text>\n", X - 40, y0 + H / 2);
    for (uint32_t s = 1; s <= max_ssd; s++)
        fprintf(f, "<text x='%.1f' y='%.0f' text-anchor='middle'>%u</text>\n",
                X + W * s / (max_ssd + 1), y0 + H + 14, s);
    fprintf(f, "<text x='%.0f' y='%.0f' text-anchor='middle'>SSDs per GPU</text>\n", X + W / 2,
            y0 + H + 28);
    int shown = 0;
    for (int c = 0; c < TIO_ADVISE_N_STRATEGIES; c++) {
        int points = 0;
        for (uint32_t i = first; i < n; i++)
            points += same_group(&rows[i].point, g) && isfinite(rows[i].iteration_s[c]);
        if (!points)
            continue; /* the strategy cannot run in this group: no line, no legend */
        fprintf(f, "<polyline fill='none' stroke='%s' stroke-width='2'%s points='", colors[c],
                c == TIO_ADVISE_IDEAL ? " stroke-dasharray='5'" : "");
        for (uint32_t i = first; i < n; i++)
            if (same_group(&rows[i].point, g) && isfinite(rows[i].iteration_s[c]))
                fprintf(f, "%.1f,%.1f ", X + W * rows[i].point.ssd_count / (max_ssd + 1),
                        y0 + H - H * rows[i].iteration_s[c] / top);
        fprintf(f, "'/>\n");
        fprintf(f, "<rect x='%.0f' y='%.0f' width='10' height='10' fill='%s'/><text x='%.0f' "
                "y='%.0f'>%s</text>\n", X + W + 15, y0 + 10 + 16 * shown, colors[c], X + W + 30,
                y0 + 19 + 16 * shown, LABEL[c]);
        shown++;
    }
}

static void xml_text(FILE *f, const char *s)
{
    for (; *s; s++)
        if (*s == '<')
            fputs("&lt;", f);
        else if (*s == '>')
            fputs("&gt;", f);
        else if (*s == '&')
            fputs("&amp;", f);
        else if (*s == '\'')
            fputs("&#39;", f);
        else
            fputc(*s, f);
}

int advise_svg_open(const char *path, tio_atomic_file *af)
{
    int rc = tio_atomic_open(af, path);
    return rc ? cli_lib_error(CMD, rc) : 0;
}

int advise_svg_write(tio_atomic_file *af, const advise_job_info *job, const tio_advise_row *rows,
                     uint32_t n)
{
    uint32_t firsts[16], n_groups = 0, max_ssd = 1, groups = 0;
    double top = 0;
    for (uint32_t i = 0; i < n; i++) {
        bool seen = false, drawn = false;
        for (uint32_t j = 0; j < i && !seen; j++)
            seen = same_group(&rows[j].point, &rows[i].point);
        groups += !seen;
        if (!seen && n_groups < 16)
            firsts[n_groups++] = i;
        for (uint32_t j = 0; j < n_groups && !drawn; j++)
            drawn = same_group(&rows[firsts[j]].point, &rows[i].point);
        if (!drawn)
            continue;
        max_ssd = rows[i].point.ssd_count > max_ssd ? rows[i].point.ssd_count : max_ssd;
        for (int c = 0; c < TIO_ADVISE_N_STRATEGIES; c++)
            if (isfinite(rows[i].iteration_s[c]) && rows[i].iteration_s[c] > top)
                top = rows[i].iteration_s[c];
    }
    top = top > 0 ? top * 1.1 : 1;
    FILE *f = af->f;
    fprintf(f, "<svg xmlns='http://www.w3.org/2000/svg' width='720' height='%u' "
            "font-family='sans-serif' font-size='10'>\n<text x='10' y='18' font-size='13'>",
            40 + 245 * n_groups);
    fputs("iteration time against SSDs per GPU: ", f);
    xml_text(f, job->model);
    fputs(" on ", f);
    xml_text(f, job->hw_name);
    fprintf(f, " (simulated; one scale for every panel%s)</text>\n",
            groups > 16 ? "; the first 16 panels" : "");
    for (uint32_t g = 0; g < n_groups; g++)
        panel(f, rows, n, firsts[g], 50 + 245.0 * g, max_ssd, top);
    fprintf(f, "</svg>\n");
    if (ferror(f)) {
        int st = cli_error(CMD, "%s: write failed", af->path);
        tio_atomic_abort(af);
        return st;
    }
    int rc = tio_atomic_commit(af);
    return rc ? cli_lib_error(CMD, rc) : 0;
}
