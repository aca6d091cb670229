/*
 * cli/cmd_advise.c — `teraio advise`: what fits, how fast it trains and what
 * a token costs, over a sweep of hardware, before a run (teraio/advise.h).
 *
 *   teraio advise (--model NAME | --config config.json | --trace TRACE)
 *                 --hw PROFILE [job, hardware, price and output options]
 *
 * A model is traced by teraio's Python tracer (`python -m teraio.advise
 * trace`: the model's real Hugging Face code on PyTorch's meta device,
 * roofline kernel times from the profile), run as a child process and
 * cached; everything after the trace — sharding, lifetimes, plans, the
 * simulations, the search for the smallest hardware — is the library's.
 * The Python interpreter is $TERAIO_PYTHON (the `teraio` console script
 * sets it), else a source checkout's .venv beside build/bin, else python3.
 *
 * Output: a table on stdout (or one JSON document with --json), --svg FILE
 * for the chart; a progress line on stderr when it is a terminal; errors
 * are one line on stderr.  Exit status 0, 1 on errors, 2 on usage errors.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/advise.h"
#include "cli/cli.h"

extern char **environ;

static const char *const CMD = "advise";

#define MAX_LIST 64
#define MAX_POINTS 4096

typedef struct {
    uint32_t n;
    uint64_t v[MAX_LIST];
} value_list;

typedef struct {
    const char *model, *config, *trace, *hw_path, *svg, *cache, *dtype, *optimizer;
    uint32_t batch, seq, threads;
    uint64_t tokens;
    value_list gpus, gpu_mem, ssds, host_cap;
    double pcie_gbps, ssd_read_gbps, ssd_write_gbps, target;
    tio_advise_prices prices;
    bool json, checkpointing;
} advise_args;

static void advise_usage(FILE *f)
{
    fprintf(f,
        "usage: teraio advise (--model NAME | --config FILE | --trace TRACE) [--hw PROFILE]\n"
        "                     [--batch N] [--seq N] [--dtype fp32|bf16] [--optimizer adamw|adam|sgd]\n"
        "                     [--checkpointing] [--gpus LIST] [--gpu-mem LIST] [--ssds LIST]\n"
        "                     [--host-cap LIST] [--ssd-gbps R[,W]] [--pcie-gbps G]\n"
        "                     [--price-gpu-hour P] [--price-ssd P] [--price-host-gb P]\n"
        "                     [--amortize-years Y] [--target SHARE] [--json] [--svg FILE]\n"
        "                     [--cache DIR] [--tokens N] [--threads N]\n"
        "\n"
        "Before a run: does the model train on this hardware, how fast under teraio,\n"
        "ZeRO-Infinity and ZeRO-Offload against unlimited memory, what a million tokens\n"
        "cost, and the smallest hardware that reaches a share of ideal (docs/advise.md).\n"
        "\n"
        "  --model NAME     a built-in model ('python -m teraio.advise models' lists them)\n"
        "  --config FILE    a Hugging Face config.json (its model class is traced)\n"
        "  --trace TRACE    a one-GPU trace already made (tokens from --tokens or the trace)\n"
        "  --hw PROFILE     hardware profile (a file, or the name of one shipped in hw/:\n"
        "                   h100-nvl-paper, h200-sxm; default h100-nvl-paper): the GPU's\n"
        "                   roofline, PCIe, SSDs, CPU Adam; the flags below replace parts\n"
        "  --batch N        sequences per GPU per iteration (default 1)\n"
        "  --seq N          tokens per sequence (default 2048)\n"
        "  --dtype D        fp32 (default) or bf16 parameters, activations and states\n"
        "  --optimizer O    adamw (default), adam or sgd (momentum)\n"
        "  --checkpointing  activation checkpointing of every layer\n"
        "  --gpus LIST      GPU counts, FSDP-sharded (default 1); LIST: 1,2,4 or 1-8\n"
        "  --gpu-mem LIST   device memory per GPU, bytes (80GB,141GB; default the profile's)\n"
        "  --ssds LIST      SSDs per GPU (default 1-8)\n"
        "  --host-cap LIST  host memory per GPU for offloading (default 0 and the profile's)\n"
        "  --ssd-gbps R[,W] per-SSD read (and write) GB/s (default the profile's)\n"
        "  --pcie-gbps G    PCIe GB/s each way (default the profile's)\n"
        "  --price-gpu-hour P, --price-ssd P, --price-host-gb P   prices (SSD and host\n"
        "                   memory bought, spread over --amortize-years, default 3)\n"
        "  --target SHARE   share of ideal the smallest hardware must reach (default 0.9)\n"
        "  --json           one JSON document on stdout instead of the table\n"
        "  --svg FILE       iteration time against SSD count\n"
        "  --cache DIR      where traces are kept (default ~/.cache/teraio/advise)\n"
        "  --tokens N       --trace: tokens one GPU trains per traced iteration\n"
        "  --threads N      simulation threads (default one per CPU)\n");
}

#define usage_error(...) cli_usage_error(CMD, __VA_ARGS__)

/* "1,2,4", "1-8", "80GB,141GB": integers (ranges allowed) or byte counts. */
static bool parse_list(const char *s, bool bytes, uint64_t lo, uint64_t hi, value_list *out)
{
    out->n = 0;
    char buf[512];
    if (strlen(s) >= sizeof buf)
        return false;
    strcpy(buf, s);
    char *save = NULL;
    for (char *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        uint64_t a = 0, b;
        uint32_t first = 0, last = 0;
        char *dash = bytes ? NULL : strchr(item, '-');
        if (dash)
            *dash = '\0';
        bool ok = bytes ? cli_parse_bytes(item, &a) : cli_parse_u32(item, 0, UINT32_MAX, &first);
        if (!bytes)
            a = first;
        b = a;
        if (ok && dash) {
            ok = cli_parse_u32(dash + 1, 0, UINT32_MAX, &last);
            b = last;
        }
        if (!ok || a < lo || b > hi || b < a || b - a >= MAX_LIST)
            return false;
        for (uint64_t i = 0; i <= b - a; i++) {
            if (out->n == MAX_LIST)
                return false;
            out->v[out->n++] = a + i;
        }
    }
    return out->n > 0 && s[0] != ',' && s[strlen(s) - 1] != ',' && !strstr(s, ",,");
}

/* Item i of a comma-separated list is a bare number (no unit). */
static bool unitless(const char *list, uint32_t i)
{
    while (i-- && list)
        list = strchr(list, ',') ? strchr(list, ',') + 1 : NULL;
    if (!list)
        return false;
    size_t len = strcspn(list, ",");
    return strspn(list, "0123456789.eE+") == len;
}

static int parse_price(const char *opt, const char *v, double *out)
{
    /* 0, 0.0, 0e5: no price; otherwise a positive number */
    if (v[0] == '0' || v[0] == '.') {
        char *end;
        double z = strtod(v, &end);
        if (!*end && z == 0 && strspn(v, "0.eE+") == strlen(v)) {
            *out = 0;
            return 0;
        }
    }
    if (!cli_parse_positive(v, out))
        return usage_error("%s: expected a price >= 0, got '%s'", opt, v);
    return 0;
}

static int parse_value(const char *opt, const char *v, advise_args *a)
{
    double years;
    if (!strcmp(opt, "--gpus"))
        return parse_list(v, false, 1, 65536, &a->gpus) ? 0 :
               usage_error("--gpus: expected counts 1..65536 like 1,2,4 or 1-8 (at most %d values), "
                           "got '%s'", MAX_LIST, v);
    if (!strcmp(opt, "--ssds"))
        return parse_list(v, false, 1, 1024, &a->ssds) ? 0 :
               usage_error("--ssds: expected counts 1..1024 like 1,2,4 or 1-8 (at most %d values), "
                           "got '%s'", MAX_LIST, v);
    if (!strcmp(opt, "--gpu-mem") || !strcmp(opt, "--host-cap")) {
        bool gpu = opt[2] == 'g';
        value_list *l = gpu ? &a->gpu_mem : &a->host_cap;
        if (!parse_list(v, true, gpu ? 1 : 0, UINT64_MAX, l))
            return usage_error("%s: expected byte counts like %s, got '%s'", opt,
                               gpu ? "80GB,141GB (each > 0)" : "0,256GB", v);
        for (uint32_t i = 0; i < l->n; i++)
            if (l->v[i] && l->v[i] < (1u << 20) && unitless(v, i))
                return usage_error("%s: %llu bytes is less than 1 MiB: give a unit (%lluGB, or "
                                   "%lluB if you mean bytes)", opt, (unsigned long long)l->v[i],
                                   (unsigned long long)l->v[i], (unsigned long long)l->v[i]);
        return 0;
    }
    if (!strcmp(opt, "--batch") || !strcmp(opt, "--seq") || !strcmp(opt, "--threads")) {
        uint32_t *slot = opt[2] == 'b' ? &a->batch : opt[2] == 's' ? &a->seq : &a->threads;
        uint32_t hi = opt[2] == 't' ? 1024 : 1u << 24;
        return cli_parse_u32(v, 1, hi, slot) ? 0 :
               usage_error("%s: expected a whole number in 1..%u, got '%s'", opt, hi, v);
    }
    if (!strcmp(opt, "--tokens")) {
        uint32_t t;
        if (!cli_parse_u32(v, 1, UINT32_MAX, &t))
            return usage_error("--tokens: expected a whole number >= 1, got '%s'", v);
        a->tokens = t;
        return 0;
    }
    if (!strcmp(opt, "--ssd-gbps")) {
        char buf[64];
        if (strlen(v) >= sizeof buf)
            return usage_error("--ssd-gbps: expected READ or READ,WRITE in GB/s > 0, got '%.40s...'",
                               v);
        snprintf(buf, sizeof buf, "%s", v);
        char *comma = strchr(buf, ',');
        if (comma)
            *comma = '\0';
        if (!cli_parse_positive(buf, &a->ssd_read_gbps) ||
            !cli_parse_positive(comma ? comma + 1 : buf, &a->ssd_write_gbps))
            return usage_error("--ssd-gbps: expected READ or READ,WRITE in GB/s > 0, got '%s'", v);
        return 0;
    }
    if (!strcmp(opt, "--pcie-gbps"))
        return cli_parse_positive(v, &a->pcie_gbps) ? 0 :
               usage_error("--pcie-gbps: expected GB/s > 0, got '%s'", v);
    if (!strcmp(opt, "--target"))
        return cli_parse_positive(v, &a->target) && a->target <= 1 ? 0 :
               usage_error("--target: expected a share of ideal in (0, 1], got '%s'", v);
    if (!strcmp(opt, "--amortize-years")) {
        if (!cli_parse_positive(v, &years) || years > 100)
            return usage_error("--amortize-years: expected years in (0, 100], got '%s'", v);
        a->prices.amortize_hours = years * 365 * 24;
        return 0;
    }
    if (!strcmp(opt, "--price-gpu-hour"))
        return parse_price(opt, v, &a->prices.gpu_hour);
    if (!strcmp(opt, "--price-ssd"))
        return parse_price(opt, v, &a->prices.ssd);
    if (!strcmp(opt, "--price-host-gb"))
        return parse_price(opt, v, &a->prices.host_gb);
    if (!strcmp(opt, "--dtype")) {
        a->dtype = v;
        return !strcmp(v, "fp32") || !strcmp(v, "bf16") ? 0 :
               usage_error("--dtype: expected fp32 or bf16, got '%s'", v);
    }
    if (!strcmp(opt, "--optimizer")) {
        a->optimizer = v;
        return !strcmp(v, "adamw") || !strcmp(v, "adam") || !strcmp(v, "sgd") ? 0 :
               usage_error("--optimizer: expected adamw, adam or sgd, got '%s'", v);
    }
    const char **slot = !strcmp(opt, "--model") ? &a->model : !strcmp(opt, "--config") ? &a->config
                        : !strcmp(opt, "--trace") ? &a->trace : !strcmp(opt, "--hw") ? &a->hw_path
                        : !strcmp(opt, "--svg") ? &a->svg : !strcmp(opt, "--cache") ? &a->cache
                        : NULL;
    if (!slot)
        return usage_error("unknown option '%s'", opt);
    *slot = v;
    return 0;
}

static const char *const VALUE_OPTIONS[] = {
    "--model", "--config", "--trace", "--hw", "--svg", "--cache", "--batch", "--seq", "--dtype",
    "--optimizer", "--gpus", "--gpu-mem", "--ssds", "--host-cap", "--ssd-gbps", "--pcie-gbps",
    "--price-gpu-hour", "--price-ssd", "--price-host-gb", "--amortize-years", "--target",
    "--tokens", "--threads"};

static bool takes_value(const char *opt)
{
    for (size_t i = 0; i < sizeof VALUE_OPTIONS / sizeof VALUE_OPTIONS[0]; i++)
        if (!strcmp(opt, VALUE_OPTIONS[i]))
            return true;
    return false;
}

/* Options that shape the job the tracer makes: a trace given fixes them. */
static bool shapes_job(const char *opt)
{
    return !strcmp(opt, "--batch") || !strcmp(opt, "--seq") || !strcmp(opt, "--dtype") ||
           !strcmp(opt, "--optimizer") || !strcmp(opt, "--checkpointing");
}

static int parse_args(int argc, char **argv, advise_args *a)
{
    memset(a, 0, sizeof *a);
    a->batch = 1;
    a->seq = 2048;
    a->target = 0.9;
    a->dtype = "fp32";
    a->optimizer = "adamw";
    a->prices.amortize_hours = 3 * 365 * 24;
    const char *job_option = NULL;
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "-h") || !strcmp(s, "--help")) {
            advise_usage(stdout);
            return -1;
        }
        if (s[0] != '-' || !s[1])
            return usage_error("unexpected argument '%s'", s);
        if (!strcmp(s, "--json")) {
            a->json = true;
        } else if (!strcmp(s, "--checkpointing")) {
            a->checkpointing = true;
        } else if (takes_value(s)) {
            if (i + 1 >= argc || !*argv[i + 1])
                return usage_error("%s: expected a value", s);
            int st = parse_value(s, argv[++i], a);
            if (st)
                return st;
        } else {
            return usage_error("unknown option '%s'", s);
        }
        if (shapes_job(s) && !job_option)
            job_option = s;
    }
    int sources = !!a->model + !!a->config + !!a->trace;
    if (sources != 1)
        return usage_error(sources ? "give one of --model, --config and --trace"
                                   : "missing the model: --model NAME, --config FILE or --trace TRACE");
    if (!a->hw_path)
        a->hw_path = "h100-nvl-paper"; /* the GPU's roofline; the flags replace the rest */
    if (!a->trace && a->tokens)
        return usage_error("--tokens is for --trace (a traced model's tokens are batch x seq)");
    if (a->trace && job_option)
        return usage_error("%s is for --model and --config: a trace fixes its job (batch, "
                           "sequence, dtype, optimizer, checkpointing)", job_option);
    return 0;
}

/* ---- the trace: a child process runs the Python tracer ---------------------- */

/* The folder this program is in; false if /proc does not say. */
static bool exe_dir(char *out, size_t n)
{
    ssize_t len = readlink("/proc/self/exe", out, n - 1);
    char *slash = len > 0 ? (out[len] = '\0', strrchr(out, '/')) : NULL;
    if (slash)
        *slash = '\0';
    return slash != NULL;
}

static void python_path(char *out, size_t n)
{
    const char *env = getenv("TERAIO_PYTHON");
    char dir[PATH_MAX];
    if (env && *env) {
        snprintf(out, n, "%s", env);
        return;
    }
    if (exe_dir(dir, sizeof dir)) {
        snprintf(out, n, "%s/../../.venv/bin/python", dir);
        if (access(out, X_OK) == 0)
            return;
    }
    snprintf(out, n, "python3");
}

/* --hw NAME with no '/' that is not a file here: NAME.conf among the
 * profiles shipped beside the binary (a source checkout's hw/ from
 * build/bin, an installed wheel's teraio/hw from teraio/_bin). */
static const char *resolve_profile(const char *arg, char *buf, size_t n)
{
    if (strchr(arg, '/') || access(arg, F_OK) == 0)
        return arg;
    char exe[PATH_MAX];
    if (!exe_dir(exe, sizeof exe))
        return arg;
    static const char *const where[] = {"%s/../hw/%s%s", "%s/../../hw/%s%s"};
    const char *ext = strstr(arg, ".conf") ? "" : ".conf";
    for (size_t i = 0; i < sizeof where / sizeof where[0]; i++) {
        snprintf(buf, n, where[i], exe, arg, ext);
        if (access(buf, R_OK) == 0)
            return buf;
    }
    return arg;
}

/* Read a child's stdout (the first out_len - 1 bytes kept) and stderr (its
 * last non-empty line kept) until both close. */
static void read_child(int out_fd, int err_fd, char *out, size_t out_len, char *last,
                       size_t last_len)
{
    struct pollfd p[2] = {{out_fd, POLLIN, 0}, {err_fd, POLLIN, 0}};
    char line[512];
    size_t got = 0, ln = 0;
    last[0] = '\0';
    for (int open_fds = 2; open_fds > 0;) {
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        for (int i = 0; i < 2; i++) {
            if (p[i].fd < 0 || !p[i].revents)
                continue;
            char buf[4096];
            ssize_t r = read(p[i].fd, buf, sizeof buf);
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0) {
                close(p[i].fd);
                p[i].fd = -1;
                open_fds--;
                continue;
            }
            for (ssize_t b = 0; b < r; b++) {
                if (i == 0) {
                    if (got + 1 < out_len)
                        out[got++] = buf[b];
                } else if (buf[b] == '\n' || buf[b] == '\r') {
                    if (ln) {
                        line[ln] = '\0';
                        snprintf(last, last_len, "%s", line);
                        ln = 0;
                    }
                } else if (ln + 1 < sizeof line) {
                    line[ln++] = buf[b];
                }
            }
        }
    }
    for (int i = 0; i < 2; i++)
        if (p[i].fd >= 0)
            close(p[i].fd);
    if (ln) {
        line[ln] = '\0';
        snprintf(last, last_len, "%s", line);
    }
    out[got] = '\0';
}

/* Run the tracer; its one line of output is "TOKENS PATH". */
static int trace_model(const advise_args *a, char *path, size_t path_len, uint64_t *tokens)
{
    char py[PATH_MAX + 32], batch[16], seq[16];
    python_path(py, sizeof py);
    snprintf(batch, sizeof batch, "%u", a->batch);
    snprintf(seq, sizeof seq, "%u", a->seq);
    const char *argv[24];
    int n = 0;
    argv[n++] = py, argv[n++] = "-m", argv[n++] = "teraio.advise", argv[n++] = "trace";
    argv[n++] = a->model ? "--model" : "--config", argv[n++] = a->model ? a->model : a->config;
    argv[n++] = "--batch", argv[n++] = batch, argv[n++] = "--seq", argv[n++] = seq;
    argv[n++] = "--dtype", argv[n++] = a->dtype, argv[n++] = "--optimizer";
    argv[n++] = a->optimizer, argv[n++] = "--hw", argv[n++] = a->hw_path;
    if (a->cache)
        argv[n++] = "--cache", argv[n++] = a->cache;
    if (a->checkpointing)
        argv[n++] = "--checkpointing";
    argv[n] = NULL;
    int out_fd[2], err_fd[2];
    if (pipe(out_fd))
        return cli_error(CMD, "pipe: %s", strerror(errno));
    if (pipe(err_fd)) {
        close(out_fd[0]);
        close(out_fd[1]);
        return cli_error(CMD, "pipe: %s", strerror(errno));
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out_fd[1], 1);
    posix_spawn_file_actions_adddup2(&fa, err_fd[1], 2);
    posix_spawn_file_actions_addclose(&fa, out_fd[0]);
    posix_spawn_file_actions_addclose(&fa, err_fd[0]);
    pid_t pid;
    int rc = posix_spawnp(&pid, py, &fa, NULL, (char *const *)argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(out_fd[1]);
    close(err_fd[1]);
    if (rc) {
        close(out_fd[0]);
        close(err_fd[0]);
        return cli_error(CMD, "cannot run the tracer with '%s': %s (set TERAIO_PYTHON to a Python "
                         "with teraio, torch and transformers)", py, strerror(rc));
    }
    bool tty = isatty(2);
    if (tty)
        fprintf(stderr, "\r\033[Ktracing %s on the meta device (cached after the first time)...",
                a->model ? a->model : a->config);
    char out[PATH_MAX + 64], last[512];
    read_child(out_fd[0], err_fd[0], out, sizeof out, last, sizeof last);
    if (tty)
        fprintf(stderr, "\r\033[K");
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (!WIFEXITED(status))
        return cli_error(CMD, "the tracer ('%s -m teraio.advise') was killed by signal %d", py,
                         WTERMSIG(status));
    if (WEXITSTATUS(status)) {
        if (!strncmp(last, "teraio advise: ", 15)) {
            fprintf(stderr, "%s\n", last); /* the tracer's own one line */
            return 1;
        }
        return cli_error(CMD, "the tracer ('%s -m teraio.advise') failed: %s (TERAIO_PYTHON picks "
                         "a Python with teraio, torch and transformers)", py,
                         *last ? last : "no message");
    }
    unsigned long long t;
    int off = 0;
    if (sscanf(out, "%llu %n", &t, &off) != 1 || !t || off <= 0 || !out[off])
        return cli_error(CMD, "the tracer's output is not 'TOKENS PATH': '%.80s'", out);
    char *nl = strchr(out + off, '\n');
    if (nl)
        *nl = '\0';
    snprintf(path, path_len, "%s", out + off);
    *tokens = t;
    return 0;
}

/* The word tokens=N (N: 1 to 2^32 - 1 in digits, then a blank or the end)
 * in a trace's model text, as the advise tracer writes it; 0 if none. */
static uint64_t tokens_in_model_text(const tio_trace *t)
{
    for (const char *p = t->model; p && (p = strstr(p, "tokens=")); p += 7) {
        if (p != t->model && p[-1] != ' ' && p[-1] != '\t')
            continue;
        char digits[16];
        size_t n = strspn(p + 7, "0123456789");
        if (!n || n >= sizeof digits || (p[7 + n] && p[7 + n] != ' ' && p[7 + n] != '\t'))
            continue;
        memcpy(digits, p + 7, n);
        digits[n] = '\0';
        uint32_t v;
        if (cli_parse_u32(digits, 1, UINT32_MAX, &v))
            return v;
    }
    return 0;
}

/* ---- the sweep ----------------------------------------------------------------- */

static void apply_hw_flags(const advise_args *a, tio_hw *hw)
{
    if (a->pcie_gbps > 0)
        hw->pcie_h2d_gbps = hw->pcie_d2h_gbps = a->pcie_gbps;
    if (a->ssd_read_gbps > 0) {
        /* New disks: the profile's array cap described its own. */
        hw->ssd_read_gbps = a->ssd_read_gbps;
        hw->ssd_write_gbps = a->ssd_write_gbps;
        hw->ssd_array_read_gbps = hw->ssd_array_write_gbps = 0;
    }
}

static uint32_t make_points(const advise_args *a, const tio_hw *hw, tio_advise_point *pts)
{
    value_list gpus = a->gpus, mem = a->gpu_mem, ssds = a->ssds, host = a->host_cap;
    if (!gpus.n)
        gpus = (value_list){1, {1}};
    if (!mem.n)
        mem = (value_list){1, {hw->capacity_bytes}};
    if (!ssds.n) {
        ssds.n = 8;
        for (uint32_t i = 0; i < 8; i++)
            ssds.v[i] = i + 1;
    }
    if (!host.n)
        host = hw->host_cap_bytes ? (value_list){2, {0, hw->host_cap_bytes}} : (value_list){1, {0}};
    uint32_t n = 0;
    for (uint32_t g = 0; g < gpus.n; g++)
        for (uint32_t m = 0; m < mem.n; m++)
            for (uint32_t h = 0; h < host.n; h++)
                for (uint32_t s = 0; s < ssds.n; s++) {
                    if (n == MAX_POINTS)
                        return UINT32_MAX;
                    pts[n++] = (tio_advise_point){(uint32_t)gpus.v[g], mem.v[m],
                                                  (uint32_t)ssds.v[s], host.v[h]};
                }
    return n;
}

static void progress(void *ctx, uint32_t done, uint32_t total)
{
    if (!*(bool *)ctx)
        return;
    fprintf(stderr, "\r\033[K[%u/%u] hardware points simulated", done, total);
    if (done == total)
        fprintf(stderr, "\r\033[K");
    fflush(stderr);
}

/* The trace: loaded from --trace, or made by the tracer; its tokens per iteration. */
static int load_trace(const advise_args *a, tio_trace **trace, char *path, size_t path_len,
                      uint64_t *tokens)
{
    *tokens = a->tokens;
    if (a->trace) {
        snprintf(path, path_len, "%s", a->trace);
    } else {
        int st = trace_model(a, path, path_len, tokens);
        if (st)
            return st;
    }
    int rc = tio_trace_load(path, trace);
    if (rc)
        return cli_lib_error(CMD, rc);
    if (!*tokens)
        *tokens = tokens_in_model_text(*trace);
    if (!*tokens) {
        tio_trace_destroy(*trace);
        *trace = NULL;
        return usage_error("%s: the trace does not say its tokens per iteration: give --tokens N",
                           path);
    }
    return 0;
}

static int run_and_print(const advise_args *a, const tio_hw *hw, const tio_advise_point *pts,
                         uint32_t n, tio_atomic_file *svg)
{
    char path[PATH_MAX + 64];
    tio_trace *trace = NULL;
    uint64_t tokens;
    int st = load_trace(a, &trace, path, sizeof path, &tokens);
    tio_advise_row *rows = st ? NULL : calloc(n, sizeof *rows);
    if (!st && !rows)
        st = cli_error(CMD, "out of memory for %u rows", n);
    if (st) {
        tio_trace_destroy(trace);
        return st;
    }
    tio_advise_options opt = {.tokens_per_iteration = tokens, .prices = a->prices,
                              .threads = a->threads};
    bool tty = isatty(2);
    int rc = tio_advise_run(trace, hw, pts, n, &opt, progress, &tty, rows);
    advise_job_info job = {a->model ? a->model : a->config ? a->config : a->trace, path,
                           hw->name, tokens, a->target, &a->prices};
    if (rc) {
        st = cli_lib_error(CMD, rc);
    } else {
        st = a->svg ? advise_svg_write(svg, &job, rows, n) : 0; /* failed: nothing printed */
        if (!st && a->json)
            advise_print_json(&job, rows, n);
        else if (!st)
            advise_print_table(&job, rows, n);
    }
    free(rows);
    tio_trace_destroy(trace);
    return st;
}

int cmd_advise(int argc, char **argv)
{
    advise_args a;
    int st = parse_args(argc, argv, &a);
    if (st)
        return st < 0 ? 0 : st;
    if (fcntl(1, F_GETFD) < 0)
        return cli_error(CMD, "standard output is closed: nowhere to print the answer");
    char profile[PATH_MAX + 64];
    a.hw_path = resolve_profile(a.hw_path, profile, sizeof profile);
    tio_hw hw;
    int rc = tio_hw_load(a.hw_path, &hw);
    if (rc)
        return cli_lib_error(CMD, rc);
    apply_hw_flags(&a, &hw);
    tio_advise_point *pts = calloc(MAX_POINTS, sizeof *pts);
    if (!pts)
        return cli_error(CMD, "out of memory");
    uint32_t n = make_points(&a, &hw, pts);
    tio_atomic_file svg;
    st = n == UINT32_MAX ? usage_error("more than %d hardware points: shorten the lists", MAX_POINTS)
         : a.svg ? advise_svg_open(a.svg, &svg) : 0;
    if (!st) {
        st = run_and_print(&a, &hw, pts, n, a.svg ? &svg : NULL);
        if (st && a.svg && svg.f)
            tio_atomic_abort(&svg);
    }
    free(pts);
    if (!st && (fflush(stdout) || ferror(stdout)))
        return cli_error(CMD, "standard output: write failed: %s", strerror(errno));
    return st;
}
