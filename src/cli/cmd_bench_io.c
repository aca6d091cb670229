/*
 * cli/cmd_bench_io.c — `teraio bench io`: the storage engine against fio on
 * the same disks and files, in the same run.
 *
 * Passes (each a write or a read of the same files):
 *   seq      sequential write, then read, of SIZE bytes in BS requests;
 *   rand     random reads of 4 KiB, 32 KiB and 128 KiB over the first
 *            RAND_SIZE bytes (each block once, in a random order);
 *   stripe   seq over 2 and 4 directories (the engine striping in BS units,
 *            fio round robin over the same files), on subdirectories of the
 *            given directories: on one disk the aggregate should not drop.
 * Each pass runs on the engine and on fio twice: fio_default (ioengine=
 * io_uring, direct=1) and fio_best (plus registered buffers and files and
 * huge-page memory, bench_fio.c), at the same depth QD.  The engine runs
 * with checksums off, as fio does not verify either; the seq passes also run
 * on a second engine with CRC32C on (its default), which gives the cost of
 * checking (on files of its own).  The rounds interleave every side of every
 * pass, rotating which side goes first, so that drift of the disk or of the
 * machine's load hits all alike; the report holds each side's median.
 *
 * Same files: fio is pointed at the engine's backing files.  Two files
 * differ in where they lie on the disk and in what the layers below the
 * file system (a virtual disk's host file, an SSD's mapping) hold for them;
 * on a virtual disk that alone moved either side by 2x.  The sides are in
 * bench_engine.c and bench_fio.c.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#include "cli/bench_io.h"
#include "cli/cli.h"
#include "teraio/teraio.h"

#define CMD "bench"
#define MAX_DIRS BENCH_MAX_DIRS
#define MAX_RUNS 100
#define MAX_PASSES 16

static void usage(FILE *f)
{
    fprintf(f,
            "usage: teraio bench io [--dir DIR ...] [--size BYTES] [--bs BYTES] [--qd N]\n"
            "                       [--runs N] [--passes LIST] [--rand-size BYTES] [--json]\n"
            "\n"
            "The teraio engine against fio on the engine's own backing files, in rounds that\n"
            "interleave every side: fio_default (ioengine=io_uring, direct=1) and fio_best\n"
            "(also registered buffers and files, huge-page memory; vm.nr_hugepages is raised\n"
            "for the run and restored when this runs as root).  Prints each side's median\n"
            "bandwidth and CPU seconds per GiB and the ratios engine/fio_best.  Needs fio on\n"
            "PATH and about 4 x SIZE of free space.\n"
            "\n"
            "  --dir DIR        directory on the SSD to test (repeat for several SSDs);\n"
            "                   default build/bench-io (created)\n"
            "  --size BYTES     bytes per sequential pass, default 4GiB\n"
            "  --bs BYTES       sequential request size, multiple of 4096, default 1MiB\n"
            "  --qd N           requests in flight, default 32\n"
            "  --runs N         rounds (the median is reported), default 5\n"
            "  --passes LIST    comma-separated subset of seq,rand,stripe; default all\n"
            "  --rand-size BYTES  bytes per random-read pass, default min(SIZE, 256MiB)\n"
            "  --json           print one JSON object instead of the table\n"
            "  -h, --help       show this help\n");
}

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "teraio " CMD ": ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, " (try 'teraio bench io --help')\n");
    return 2;
}

enum { PASS_SEQ = 1, PASS_RAND = 2, PASS_STRIPE = 4 };

typedef struct {
    const char *dirs[MAX_DIRS];
    uint32_t n_dirs;
    uint64_t size, bs, rand_size;
    uint32_t qd, runs, passes;
    bool json;
} bench_args;

static bool progress_on;

static void progress(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void progress(const char *fmt, ...)
{
    if (!progress_on)
        return;
    va_list ap;
    fprintf(stderr, "\r\033[K");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fflush(stderr);
}

static int parse_passes(const char *v, uint32_t *out)
{
    *out = 0;
    for (const char *p = v; *p;) {
        size_t n = strcspn(p, ",");
        if (n == 3 && !strncmp(p, "seq", 3))
            *out |= PASS_SEQ;
        else if (n == 4 && !strncmp(p, "rand", 4))
            *out |= PASS_RAND;
        else if (n == 6 && !strncmp(p, "stripe", 6))
            *out |= PASS_STRIPE;
        else
            return -1;
        p += n + (p[n] == ',');
    }
    return *out ? 0 : -1;
}

static int parse_args(int argc, char **argv, bench_args *a)
{
    *a = (bench_args){.size = 4ull << 30, .bs = 1u << 20, .qd = 32, .runs = 5,
                      .passes = PASS_SEQ | PASS_RAND | PASS_STRIPE};
    for (int i = 2; i < argc; i++) {
        const char *o = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(o, "--json")) {
            a->json = true;
            continue;
        }
        if (strcmp(o, "--dir") && strcmp(o, "--size") && strcmp(o, "--bs") && strcmp(o, "--qd") &&
            strcmp(o, "--runs") && strcmp(o, "--passes") && strcmp(o, "--rand-size"))
            return usage_error("unknown option '%s'", o);
        if (!v)
            return usage_error("%s needs a value", o);
        i++;
        if (!strcmp(o, "--dir")) {
            if (a->n_dirs == MAX_DIRS)
                return usage_error("at most %d --dir options", MAX_DIRS);
            if (!v[0] || strchr(v, ':'))
                return usage_error("--dir '%s': expected a non-empty path without ':' (fio "
                                   "separates file names with it)", v);
            a->dirs[a->n_dirs++] = v;
        } else if (!strcmp(o, "--size") || !strcmp(o, "--rand-size")) {
            uint64_t *dst = !strcmp(o, "--size") ? &a->size : &a->rand_size;
            if (!cli_parse_bytes(v, dst) || *dst == 0)
                return usage_error("%s '%s': expected a positive byte count such as 4GiB", o, v);
        } else if (!strcmp(o, "--bs")) {
            if (!cli_parse_bytes(v, &a->bs) || a->bs == 0 || a->bs % 4096 || a->bs > (1u << 30))
                return usage_error("--bs '%s': expected a multiple of 4096 up to 1GiB", v);
        } else if (!strcmp(o, "--qd")) {
            if (!cli_parse_u32(v, 1, 4096, &a->qd))
                return usage_error("--qd '%s': expected an integer from 1 to 4096", v);
        } else if (!strcmp(o, "--passes")) {
            if (parse_passes(v, &a->passes))
                return usage_error("--passes '%s': expected a comma-separated subset of "
                                   "seq,rand,stripe", v);
        } else if (!cli_parse_u32(v, 1, MAX_RUNS, &a->runs)) {
            return usage_error("--runs '%s': expected an integer from 1 to %d", v, MAX_RUNS);
        }
    }
    uint64_t unit = a->bs * 4 * (a->n_dirs ? a->n_dirs : 1);
    if (a->size < unit)
        return usage_error("--size %llu is smaller than 4 x --bs x the number of directories "
                           "(%llu)", (unsigned long long)a->size, (unsigned long long)unit);
    a->size -= a->size % unit;
    if (!a->rand_size)
        a->rand_size = a->size < (256u << 20) ? a->size : (256u << 20);
    if (a->rand_size > a->size)
        return usage_error("--rand-size is larger than --size");
    a->rand_size -= a->rand_size % (128u << 10);
    if (!a->rand_size)
        return usage_error("--rand-size must be at least 128KiB");
    return 0;
}

/* ---- passes, rounds, report ------------------------------------------ */

enum { SIDE_ENGINE, SIDE_CRC, SIDE_FIO_DEFAULT, SIDE_FIO_BEST, N_SIDES };
static const char *const side_name[N_SIDES] = {"engine", "engine_crc", "fio_default", "fio_best"};
enum { ENG_BASE, ENG_CRC, ENG_STRIPE2, ENG_STRIPE4, N_ENGINES };

typedef struct {
    char name[32];
    bool write, random;
    uint64_t bs, bytes;
    int engine;            /* ENG_* the pass runs on (and fio on its files) */
    bool with_crc;         /* also SIDE_CRC, on ENG_CRC */
    bench_sample s[N_SIDES][MAX_RUNS];
    bench_sample median[N_SIDES];
} bench_pass;

static uint32_t make_passes(const bench_args *a, bench_pass *p)
{
    uint32_t n = 0;
    for (int w = 1; (a->passes & PASS_SEQ) && w >= 0; w--)
        p[n++] = (bench_pass){.write = w, .bs = a->bs, .bytes = a->size, .engine = ENG_BASE,
                              .with_crc = true};
    static const uint64_t rand_bs[] = {4096, 32768, 131072};
    for (int i = 0; (a->passes & PASS_RAND) && i < 3; i++)
        p[n++] = (bench_pass){.random = true, .bs = rand_bs[i], .bytes = a->rand_size,
                              .engine = ENG_BASE};
    for (int k = 0; (a->passes & PASS_STRIPE) && k < 2; k++)
        for (int w = 1; w >= 0; w--)
            p[n++] = (bench_pass){.write = w, .bs = a->bs, .bytes = a->size,
                                  .engine = k ? ENG_STRIPE4 : ENG_STRIPE2};
    for (uint32_t i = 0; i < n; i++) {
        const char *op = p[i].random ? "randread" : p[i].write ? "write" : "read";
        if (p[i].engine == ENG_BASE)
            snprintf(p[i].name, sizeof p[i].name, "%s_%lluk", op,
                     (unsigned long long)(p[i].bs >> 10));
        else
            snprintf(p[i].name, sizeof p[i].name, "stripe%d_%s", p[i].engine == ENG_STRIPE2 ? 2 : 4,
                     op);
    }
    return n;
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

static double median_of(const bench_sample *s, uint32_t n, bool cpu)
{
    double v[MAX_RUNS];
    for (uint32_t i = 0; i < n; i++)
        v[i] = cpu ? s[i].cpu_per_gib : s[i].gbps;
    qsort(v, n, sizeof v[0], cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

typedef struct {
    const bench_args *a;
    bench_buffers b;
    bench_engine eng[N_ENGINES];
    bench_hugemem h;
    char json_path[4200], log_path[4200];
    bench_pass passes[MAX_PASSES];
    uint32_t n_passes;
} bench_run;

static int run_side(bench_run *r, bench_pass *p, int side, uint32_t round)
{
    const bench_engine *e = &r->eng[side == SIDE_CRC ? ENG_CRC : p->engine];
    bench_sample *out = &p->s[side][round];
    if (side == SIDE_ENGINE || side == SIDE_CRC)
        return bench_engine_pass(e, &r->b, p->write, p->random, p->bs, p->bytes, out);
    bench_fio_job job = {.files = e->files, .json_path = r->json_path, .log_path = r->log_path,
                         .size = p->bytes, .bs = p->bs, .qd = r->a->qd, .write = p->write,
                         .random = p->random, .best = side == SIDE_FIO_BEST, .h = &r->h};
    return bench_fio_run(&job, out);
}

static int run_rounds(bench_run *r)
{
    for (uint32_t round = 0; round < r->a->runs; round++)
        for (uint32_t i = 0; i < r->n_passes; i++) {
            bench_pass *p = &r->passes[i];
            for (int k = 0; k < N_SIDES; k++) {
                int side = (k + (int)(round + i)) % N_SIDES;
                if (side == SIDE_CRC && !p->with_crc)
                    continue;
                progress("bench io: round %u/%u, %s, %s", round + 1, r->a->runs, p->name,
                         side_name[side]);
                int rc = run_side(r, p, side, round);
                if (rc)
                    return rc;
            }
        }
    progress("%s", "");
    for (uint32_t i = 0; i < r->n_passes; i++)
        for (int side = 0; side < N_SIDES; side++)
            r->passes[i].median[side] =
                (bench_sample){median_of(r->passes[i].s[side], r->a->runs, false),
                               median_of(r->passes[i].s[side], r->a->runs, true)};
    return 0;
}

/* A JSON number, or null where it is not finite (a ratio over a CPU time
 * too small to measure). */
static void json_number(const char *key, double v, int decimals)
{
    if (isfinite(v))
        printf(", \"%s\": %.*f", key, decimals, v);
    else
        printf(", \"%s\": null", key);
}

static void print_json(const bench_run *r)
{
    const bench_args *a = r->a;
    tio_engine *e = r->eng[ENG_BASE].engine;
    printf("{\"backend\": \"%s\", \"backend_reason\": ", tio_backend_name(tio_engine_backend(e)));
    cli_json_string(stdout, tio_engine_backend_reason(e));
    printf(", \"fixed_buffers\": %s, \"fixed_files\": %s, \"size_bytes\": %llu, "
           "\"rand_size_bytes\": %llu, \"qd\": %u, \"runs\": %u, \"dirs\": %u, "
           "\"fio_best_iomem\": ", tio_engine_fixed_buffers(e) ? "true" : "false",
           tio_engine_fixed_files(e) ? "true" : "false", (unsigned long long)a->size,
           (unsigned long long)a->rand_size, a->qd, a->runs, a->n_dirs);
    cli_json_string(stdout, r->h.iomem);
    printf(", \"fio_best_huge_pages\": %s, \"fio_best_memory\": ", r->h.huge ? "true" : "false");
    cli_json_string(stdout, r->h.how);
    printf(", \"passes\": [");
    for (uint32_t i = 0; i < r->n_passes; i++) {
        const bench_pass *p = &r->passes[i];
        const bench_sample *m = p->median;
        printf("%s{\"name\": \"%s\", \"op\": \"%s\", \"pattern\": \"%s\", \"bs_bytes\": %llu, "
               "\"bytes\": %llu, \"dirs\": %u", i ? ", " : "", p->name, p->write ? "write" : "read",
               p->random ? "random" : "sequential", (unsigned long long)p->bs,
               (unsigned long long)p->bytes, r->eng[p->engine].n_dirs);
        for (int side = 0; side < N_SIDES; side++)
            if (side != SIDE_CRC || p->with_crc)
                printf(", \"%s\": {\"gbps\": %.6f, \"cpu_s_per_gib\": %.6f}", side_name[side],
                       m[side].gbps, m[side].cpu_per_gib);
        json_number("ratio", m[SIDE_ENGINE].gbps / m[SIDE_FIO_BEST].gbps, 4);
        json_number("cpu_ratio", m[SIDE_ENGINE].cpu_per_gib / m[SIDE_FIO_BEST].cpu_per_gib, 4);
        json_number("ratio_default", m[SIDE_ENGINE].gbps / m[SIDE_FIO_DEFAULT].gbps, 4);
        if (p->with_crc) {
            json_number("crc_ratio", m[SIDE_CRC].gbps / m[SIDE_ENGINE].gbps, 4);
            json_number("crc_cpu_s_per_gib", m[SIDE_CRC].cpu_per_gib - m[SIDE_ENGINE].cpu_per_gib, 5);
        }
        printf("}");
    }
    printf("]}\n");
}

static void print_table(const bench_run *r)
{
    const bench_args *a = r->a;
    tio_engine *e = r->eng[ENG_BASE].engine;
    char size[32], rsize[32];
    printf("bench io: %u dir(s)", a->n_dirs);
    for (uint32_t i = 0; i < a->n_dirs; i++)
        printf("%s%s", i ? ", " : " (", a->dirs[i]);
    printf("), seq %s, random %s, qd %u, %u rounds (medians)\n", tio_format_bytes(a->size, size),
           tio_format_bytes(a->rand_size, rsize), a->qd, a->runs);
    const char *reason = tio_engine_backend_reason(e);
    printf("engine: %s, fixed buffers %s, fixed files %s, checksums off%s%s\n",
           tio_backend_name(tio_engine_backend(e)), tio_engine_fixed_buffers(e) ? "on" : "off",
           tio_engine_fixed_files(e) ? "on" : "off", reason[0] ? "; " : "", reason);
    printf("fio_best memory: %s\n", r->h.how);
    printf("%-16s %8s %9s %9s %7s %9s %9s %7s\n", "GB/s | CPU s/GiB", "engine", "fio_best",
           "fio_dflt", "ratio", "engine", "fio_best", "ratio");
    for (uint32_t i = 0; i < r->n_passes; i++) {
        const bench_sample *m = r->passes[i].median;
        printf("%-16s %8.3f %9.3f %9.3f %7.3f %9.4f %9.4f %7.3f\n", r->passes[i].name,
               m[SIDE_ENGINE].gbps, m[SIDE_FIO_BEST].gbps, m[SIDE_FIO_DEFAULT].gbps,
               m[SIDE_ENGINE].gbps / m[SIDE_FIO_BEST].gbps, m[SIDE_ENGINE].cpu_per_gib,
               m[SIDE_FIO_BEST].cpu_per_gib,
               m[SIDE_ENGINE].cpu_per_gib / m[SIDE_FIO_BEST].cpu_per_gib);
    }
    for (uint32_t i = 0; i < r->n_passes; i++) {
        const bench_pass *p = &r->passes[i];
        if (p->with_crc)
            printf("CRC32C on, %s: %.3f GB/s (%.3f of checksums off), %.4f CPU s/GiB (+%.4f)\n",
                   p->name, p->median[SIDE_CRC].gbps,
                   p->median[SIDE_CRC].gbps / p->median[SIDE_ENGINE].gbps,
                   p->median[SIDE_CRC].cpu_per_gib,
                   p->median[SIDE_CRC].cpu_per_gib - p->median[SIDE_ENGINE].cpu_per_gib);
    }
}

/* Buffers, the engines the passes need, fio's memory. */
static int run_setup(bench_run *r)
{
    const bench_args *a = r->a;
    uint64_t max_bs = a->bs > (128u << 10) ? a->bs : (128u << 10);
    int rc = bench_buffers_init(&r->b, 2 * a->qd, max_bs, a->rand_size / 4096);
    r->n_passes = make_passes(a, r->passes);
    bool need[N_ENGINES] = {true, (a->passes & PASS_SEQ) != 0, (a->passes & PASS_STRIPE) != 0,
                            (a->passes & PASS_STRIPE) != 0};
    static const char *const sub[N_ENGINES] = {NULL, "crc", "stripe2", "stripe4"};
    static const uint32_t n_dirs[N_ENGINES] = {0, 0, 2, 4};
    for (int k = 0; k < N_ENGINES && !rc; k++) {
        bench_engine_config c = {.dirs = a->dirs, .n_given = a->n_dirs,
                                 .n_dirs = n_dirs[k] ? n_dirs[k] : a->n_dirs, .sub = sub[k],
                                 .size = a->size, .bs = a->bs, .qd = a->qd, .crc = k == ENG_CRC};
        if (need[k])
            rc = bench_engine_open(&r->eng[k], &c, &r->b);
    }
    snprintf(r->json_path, sizeof r->json_path, "%s/teraio-bench-fio.%ld.json", a->dirs[0],
             (long)getpid());
    snprintf(r->log_path, sizeof r->log_path, "%s/teraio-bench-fio.%ld.log", a->dirs[0],
             (long)getpid());
    if (!rc)
        bench_hugemem_setup(&r->h, (uint64_t)a->qd * max_bs);
    return rc;
}

static int run_bench(const bench_args *a)
{
    bench_run *r = calloc(1, sizeof *r);
    if (!r)
        return cli_error(CMD, "out of memory");
    r->a = a;
    int rc = run_setup(r);
    /* The random passes read what the sequential write left: write first. */
    if (!rc && !(a->passes & PASS_SEQ) && (a->passes & PASS_RAND)) {
        bench_sample ignored;
        rc = bench_engine_pass(&r->eng[ENG_BASE], &r->b, true, false, a->bs, a->size, &ignored);
    }
    if (!rc)
        rc = run_rounds(r);
    if (!rc && a->json)
        print_json(r);
    else if (!rc)
        print_table(r);
    bench_hugemem_restore(&r->h);
    for (int k = 0; k < N_ENGINES; k++)
        bench_engine_close(&r->eng[k]);
    unlink(r->json_path);
    unlink(r->log_path);
    bench_buffers_fini(&r->b);
    free(r);
    return rc;
}

int cmd_bench(int argc, char **argv)
{
    if (argc >= 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        usage(stdout);
        return 0;
    }
    if (argc < 2 || strcmp(argv[1], "io"))
        return usage_error("expected 'io' (the only benchmark so far)");
    for (int i = 2; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        }
    bench_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc)
        return rc;
    if (a.n_dirs == 0) {
        a.dirs[a.n_dirs++] = "build/bench-io";
        mkdir("build", 0755);
        if (mkdir("build/bench-io", 0755) != 0 && errno != EEXIST)
            return cli_error(CMD, "cannot create build/bench-io: %s", strerror(errno));
    }
    progress_on = isatty(2);
    return run_bench(&a);
}
