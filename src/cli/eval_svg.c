/*
 * cli/eval_svg.c — the charts of `teraio eval paper --svg DIR`: bars of
 * the fraction of ideal per strategy and configuration, and the device
 * memory per kernel of the first configuration with and without teraio.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "cli/eval.h"

static const char *const CMD = "eval";

static FILE *create(const char *dir, const char *name, char *path, size_t n)
{
    snprintf(path, n, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (!f)
        cli_error(CMD, "%s: cannot create: %s", path, strerror(errno));
    return f;
}

static int write_bars(const char *dir, const tio_sim_suite *suite, const tio_sim_suite_result *res)
{
    char path[PATH_MAX + 32];
    FILE *f = create(dir, "fraction-of-ideal.svg", path, sizeof path);
    if (!f)
        return 1;
    static const char *colors[] = {"#999999", "#f28e2b", "#4e79a7", "#59a14f", "#e15759",
                                   "#b07aa1", "#edc948"};
    int n = (int)suite->n_configs, gw = 7 * 8 + 12, W = 80 + n * gw + 160, H = 340;
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
        const tio_sim_suite_config *c = &suite->configs[i];
        int x0 = 60 + i * gw;
        for (int s = 0; s < TIO_SIM_N_STRATEGIES; s++) {
            double v = res[i].rep[s].fraction_of_ideal, h = 250 * (v > 1 ? 1 : v);
            fprintf(f, "<rect x='%d' y='%.1f' width='7' height='%.1f' fill='%s'><title>%s "
                    "%u/%u %s: %.3f</title></rect>\n", x0 + s * 8, 280 - h, h, colors[s],
                    c->model, c->batch, c->seq, tio_sim_strategy_name((tio_sim_strategy)s), v);
        }
        fprintf(f, "<text transform='translate(%d,292) rotate(40)'>%s b%u s%u</text>\n", x0,
                c->model, c->batch, c->seq);
    }
    for (int s = 0; s < TIO_SIM_N_STRATEGIES; s++)
        fprintf(f, "<rect x='%d' y='%d' width='10' height='10' fill='%s'/><text x='%d' "
                "y='%d'>%s</text>\n", W - 140, 40 + 16 * s, colors[s], W - 125, 49 + 16 * s,
                tio_sim_strategy_name((tio_sim_strategy)s));
    fprintf(f, "</svg>\n");
    return fclose(f) ? cli_error(CMD, "%s: write failed", path) : 0;
}

static int write_timeline(const char *dir, const tio_sim_suite_config *c,
                          const tio_sim_suite_result *r, const tio_hw *hw)
{
    char path[PATH_MAX + 32];
    FILE *f = create(dir, "memory-timeline.svg", path, sizeof path);
    if (!f)
        return 1;
    const tio_sim_report *id = &r->rep[TIO_SIM_IDEAL], *te = &r->rep[TIO_SIM_TERAIO];
    uint32_t n = id->n_kernels;
    double top = (double)id->peak_bytes * 1.05, W = 900, H = 300;
    fprintf(f, "<svg xmlns='http://www.w3.org/2000/svg' width='%.0f' height='%.0f' "
            "font-family='sans-serif' font-size='11'>\n<text x='10' y='16' font-size='13'>"
            "%s batch %u seq %u: device memory per kernel (GB), no offloading vs teraio"
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
    double cap = (double)hw->capacity_bytes, cy = 30 + H - H * cap / top;
    fprintf(f, "<line x1='50' x2='%.0f' y1='%.1f' y2='%.1f' stroke='#e15759' "
            "stroke-dasharray='4'/><text x='55' y='%.1f'>capacity %.0f GB</text>\n", 50 + W, cy,
            cy, cy - 3, cap / 1e9);
    fprintf(f, "<text x='55' y='%.0f'>peak %.0f GB</text>\n</svg>\n", 42.0,
            (double)id->peak_bytes / 1e9);
    return fclose(f) ? cli_error(CMD, "%s: write failed", path) : 0;
}

int eval_svg_write(const char *dir, const tio_sim_suite *suite, const tio_sim_suite_result *res,
                   const tio_hw *hw)
{
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return cli_error(CMD, "%s: cannot create: %s", dir, strerror(errno));
    int st = write_bars(dir, suite, res);
    return st ? st : write_timeline(dir, &suite->configs[0], &res[0], hw);
}
