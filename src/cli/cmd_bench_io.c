/*
 * cli/cmd_bench_io.c — `teraio bench io`: the storage engine against fio on
 * the same disks, in the same run.
 *
 * Each run writes SIZE bytes sequentially and reads them back, once through
 * the engine and once through fio (ioengine=io_uring, direct=1, the same
 * block size and queue depth), alternating which side goes first so that
 * drift of the disk or of other load on the machine hits both alike.  Both
 * sides bypass the page cache (the engine opens its backing files with
 * O_DIRECT; fio gets --direct=1) and both work on the same files: fio is
 * pointed at the engine's backing files.  Two files would differ in where
 * they lie on the disk and in what the layers below the file system (a
 * virtual disk's host file, an SSD's mapping) hold for them; on a virtual
 * disk that alone moved either side by 2x.  The engine side drives the
 * public API the way an application would: buffers of BS bytes registered
 * with tio_engine_register_buffer (one 2 MiB-aligned allocation, so that
 * the engine can have it backed by huge pages), each request one BS-sized
 * slice of one big extent, a new request submitted as soon as one is
 * reaped.  The engine's ring depth is QD, the same depth fio gives the
 * kernel; the bench keeps 2 x QD requests submitted so that the engine's
 * pending queue can refill the ring from its completion thread without
 * waiting for this thread.  With several directories the engine stripes in
 * BS units and fio gets the engine's backing files, one per directory (it
 * spreads the I/O round robin over them, SIZE / n each, as the stripes do).
 *
 * Reported per direction: the median bandwidth of each side, the median CPU
 * seconds per GiB (the engine: getrusage of this process over the phase,
 * every thread included; fio: the usr+sys it reports for its job), and the
 * ratios engine/fio.  The target is bandwidth ratio >= 0.95 and
 * CPU ratio <= 1.2.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "cli/cli.h"
#include "teraio/teraio.h"

#define CMD "bench"
#define MAX_DIRS 16
#define MAX_RUNS 100
#define GIB (1024.0 * 1024.0 * 1024.0)

extern char **environ;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: teraio bench io [--dir DIR ...] [--size BYTES] [--bs BYTES] [--qd N]\n"
            "                       [--runs N] [--json]\n"
            "\n"
            "Sequential write, then read, of SIZE bytes through the teraio engine and\n"
            "through fio (ioengine=io_uring, direct=1, same block size and depth, on the\n"
            "engine's own backing files), alternating the two; prints each side's median\n"
            "bandwidth and CPU seconds per GiB and the ratios engine/fio.  Needs fio on\n"
            "PATH and SIZE of free space in the directories.\n"
            "\n"
            "  --dir DIR    directory on the SSD to test (repeat for several SSDs);\n"
            "               default build/bench-io (created)\n"
            "  --size BYTES bytes per run and side, default 4GiB\n"
            "  --bs BYTES   request size, multiple of 4096, default 1MiB\n"
            "  --qd N       requests in flight, default 32\n"
            "  --runs N     runs per side (the median is reported), default 5\n"
            "  --json       print one JSON object instead of the table\n"
            "  -h, --help   show this help\n");
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

typedef struct {
    const char *dirs[MAX_DIRS];
    uint32_t n_dirs;
    uint64_t size, bs;
    uint32_t qd, runs;
    bool json;
} bench_args;

/* One measured phase: bandwidth and CPU seconds per GiB. */
typedef struct {
    double gbps, cpu_per_gib;
} sample;

enum { WRITE = 0, READ = 1 };
static const char *const op_name[2] = {"write", "read"};

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

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

static int parse_args(int argc, char **argv, bench_args *a)
{
    *a = (bench_args){.size = 4ull << 30, .bs = 1u << 20, .qd = 32, .runs = 5};
    for (int i = 2; i < argc; i++) {
        const char *o = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(o, "--json")) {
            a->json = true;
            continue;
        }
        if (strcmp(o, "--dir") && strcmp(o, "--size") && strcmp(o, "--bs") && strcmp(o, "--qd") &&
            strcmp(o, "--runs"))
            return usage_error("unknown option '%s'", o);
        if (!v)
            return usage_error("%s needs a value", o);
        i++;
        if (!strcmp(o, "--dir")) {
            if (a->n_dirs == MAX_DIRS)
                return usage_error("at most %d --dir options", MAX_DIRS);
            if (!v[0])
                return usage_error("--dir needs a non-empty path");
            a->dirs[a->n_dirs++] = v;
        } else if (!strcmp(o, "--size")) {
            if (!cli_parse_bytes(v, &a->size) || a->size == 0)
                return usage_error("--size '%s': expected a positive byte count such as 4GiB", v);
        } else if (!strcmp(o, "--bs")) {
            if (!cli_parse_bytes(v, &a->bs) || a->bs == 0 || a->bs % 4096 || a->bs > (1u << 30))
                return usage_error("--bs '%s': expected a multiple of 4096 up to 1GiB", v);
        } else if (!strcmp(o, "--qd")) {
            if (!cli_parse_u32(v, 1, 4096, &a->qd))
                return usage_error("--qd '%s': expected an integer from 1 to 4096", v);
        } else if (!cli_parse_u32(v, 1, MAX_RUNS, &a->runs)) {
            return usage_error("--runs '%s': expected an integer from 1 to %d", v, MAX_RUNS);
        }
    }
    uint64_t unit = a->bs * (a->n_dirs ? a->n_dirs : 1);
    if (a->size < unit)
        return usage_error("--size %llu is smaller than --bs times the number of directories "
                           "(%llu)", (unsigned long long)a->size, (unsigned long long)unit);
    a->size -= a->size % unit;
    return 0;
}

/* ---- the engine side ------------------------------------------------- */

typedef struct {
    tio_engine *engine;
    tio_extent extent;
    char *bufs;          /* n_bufs buffers of bs bytes */
    uint32_t n_bufs;     /* requests kept submitted: 2 x qd */
    bool registered;
    const bench_args *a;
} engine_side;

static int engine_open(engine_side *s, const bench_args *a)
{
    tio_engine_options opt;
    tio_engine_options_default(&opt);
    opt.dirs = a->dirs;
    opt.n_dirs = a->n_dirs;
    opt.capacity_bytes = a->size;
    opt.stripe_bytes = (uint32_t)a->bs;
    opt.request_bytes = (uint32_t)a->bs;
    opt.queue_depth = a->qd;
    s->a = a;
    int rc = tio_engine_create(&opt, &s->engine);
    if (rc)
        return cli_lib_error(CMD, rc);
    if ((rc = tio_engine_alloc(s->engine, a->size, &s->extent)) != 0)
        return cli_lib_error(CMD, rc);
    void *p;
    s->n_bufs = 2 * a->qd;
    size_t total = (size_t)s->n_bufs * a->bs;
    size_t huge = 2u << 20;
    if (posix_memalign(&p, huge, (total + huge - 1) / huge * huge) != 0)
        return cli_error(CMD, "out of memory for %u buffers of %llu bytes", s->n_bufs,
                         (unsigned long long)a->bs);
    s->bufs = p;
    for (size_t i = 0; i < total; i++)
        s->bufs[i] = (char)(i * 131u + (i >> 12));
    s->registered = tio_engine_register_buffer(s->engine, s->bufs, total) == 0 &&
                    tio_engine_fixed_buffers(s->engine);
    return 0;
}

static void engine_close(engine_side *s)
{
    tio_engine_destroy(s->engine);
    free(s->bufs);
}

/* One sequential pass over the extent with qd requests in flight. */
static int engine_pass(engine_side *s, int op, sample *out)
{
    const bench_args *a = s->a;
    uint64_t n_req = a->size / a->bs, next = 0, done = 0;
    uint32_t free_slots[2 * 4096], n_free = s->n_bufs;
    for (uint32_t i = 0; i < s->n_bufs; i++)
        free_slots[i] = i;
    tio_completion comp[128];
    double t0 = now_s(), c0 = cpu_s();
    while (done < n_req) {
        while (next < n_req && n_free > 0) {
            uint32_t slot = free_slots[--n_free];
            tio_extent x = {.offset = s->extent.offset + next * a->bs, .bytes = a->bs};
            char *buf = s->bufs + (size_t)slot * a->bs;
            int rc = op == WRITE ? tio_engine_submit_write(s->engine, &x, buf, a->bs, slot, false)
                                 : tio_engine_submit_read(s->engine, &x, buf, a->bs, slot, false);
            if (rc)
                return cli_lib_error(CMD, rc);
            next++;
        }
        int n = tio_engine_reap(s->engine, comp, 128, 1);
        if (n < 0)
            return cli_lib_error(CMD, n);
        for (int i = 0; i < n; i++) {
            if (comp[i].result)
                return cli_error(CMD, "engine %s: %s", op_name[op],
                                 tio_engine_completion_error(s->engine, comp[i].tag));
            free_slots[n_free++] = (uint32_t)comp[i].tag;
        }
        done += (uint64_t)n;
    }
    double dt = now_s() - t0, cpu = cpu_s() - c0;
    out->gbps = (double)a->size / dt / 1e9;
    out->cpu_per_gib = cpu / ((double)a->size / GIB);
    return 0;
}

/* ---- the fio side ---------------------------------------------------- */

/* The number after "key" : in `text` from `from` on; NAN if absent. */
static double json_number(const char *from, const char *key)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\"", key);
    const char *p = strstr(from, pat);
    if (!p)
        return NAN;
    p += strlen(pat);
    while (*p == ' ' || *p == ':' || *p == '\t')
        p++;
    char *end;
    double v = strtod(p, &end);
    return end == p ? NAN : v;
}

/* Run fio for one pass; its JSON goes to json_path, its other output to
 * log_path.  Returns 0 or an exit status after printing the error. */
static int fio_pass(const bench_args *a, const char *files, const char *json_path,
                    const char *log_path, int op, sample *out)
{
    char bs[32], qd[32], size[48], filename[MAX_DIRS * 4200 + 16], output[4300];
    snprintf(bs, sizeof bs, "--bs=%llu", (unsigned long long)a->bs);
    snprintf(qd, sizeof qd, "--iodepth=%u", a->qd);
    snprintf(size, sizeof size, "--size=%llu", (unsigned long long)a->size);
    snprintf(filename, sizeof filename, "--filename=%s", files);
    snprintf(output, sizeof output, "--output=%s", json_path);
    char *argv[] = {"fio", "--name=teraio-bench", filename, "--ioengine=io_uring", "--direct=1",
                    op == WRITE ? "--rw=write" : "--rw=read", bs, qd, size,
                    "--output-format=json", output, NULL};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid;
    int rc = posix_spawnp(&pid, "fio", &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc)
        return cli_error(CMD, "cannot run fio: %s (install it: scripts/deps, or apt-get install "
                         "fio)", strerror(rc));
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        char line[300] = "";
        FILE *f = fopen(log_path, "r");
        if (f) {
            if (!fgets(line, sizeof line, f))
                line[0] = '\0';
            fclose(f);
        }
        line[strcspn(line, "\n")] = '\0';
        if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
            return cli_error(CMD, "cannot run fio: not found on PATH (install it: scripts/deps)");
        return cli_error(CMD, "fio %s failed (status %d)%s%s", op_name[op],
                         WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status),
                         line[0] ? ": " : "", line);
    }
    char *text = NULL;
    size_t len = 0;
    FILE *f = fopen(json_path, "r");
    if (f) {
        text = malloc(1 << 20);
        if (text) {
            len = fread(text, 1, (1 << 20) - 1, f);
            text[len] = '\0';
        }
        fclose(f);
    }
    const char *job = text ? strstr(text, "\"jobs\"") : NULL;
    const char *dir = job ? strstr(job, op == WRITE ? "\"write\" : {" : "\"read\" : {") : NULL;
    double bw = dir ? json_number(dir, "bw_bytes") : NAN;
    double usr = job ? json_number(job, "usr_cpu") : NAN;
    double sys = job ? json_number(job, "sys_cpu") : NAN;
    double runtime_ms = job ? json_number(job, "job_runtime") : NAN;
    free(text);
    if (!(bw > 0) || isnan(usr) || isnan(sys) || !(runtime_ms > 0))
        return cli_error(CMD, "cannot read bw_bytes/usr_cpu/sys_cpu/job_runtime from fio's JSON "
                         "output in '%s'", json_path);
    out->gbps = bw / 1e9;
    double cpu = (usr + sys) / 100.0 * runtime_ms / 1000.0;
    out->cpu_per_gib = cpu / ((double)a->size / GIB);
    return 0;
}

/* ---- driver ---------------------------------------------------------- */

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

static double median(const sample *s, uint32_t n, bool cpu)
{
    double v[MAX_RUNS];
    for (uint32_t i = 0; i < n; i++)
        v[i] = cpu ? s[i].cpu_per_gib : s[i].gbps;
    qsort(v, n, sizeof v[0], cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

typedef struct {
    double engine_gbps, fio_gbps, engine_cpu, fio_cpu;
} summary;

static void print_json(const bench_args *a, const engine_side *s, const summary sum[2])
{
    const char *reason = tio_engine_backend_reason(s->engine);
    printf("{\"backend\": \"%s\", \"backend_reason\": \"", tio_backend_name(tio_engine_backend(s->engine)));
    for (const char *p = reason; *p; p++) {
        if (*p == '"' || *p == '\\')
            putchar('\\');
        if ((unsigned char)*p >= 0x20)
            putchar(*p);
    }
    printf("\", \"fixed_buffers\": %s, \"fixed_files\": %s, \"size_bytes\": %llu, "
           "\"bs_bytes\": %llu, \"qd\": %u, \"runs\": %u, \"dirs\": %u",
           s->registered ? "true" : "false", tio_engine_fixed_files(s->engine) ? "true" : "false",
           (unsigned long long)a->size, (unsigned long long)a->bs, a->qd, a->runs, a->n_dirs);
    for (int op = 0; op < 2; op++) {
        const summary *m = &sum[op];
        printf(", \"%s\": {\"engine_gbps\": %.4f, \"fio_gbps\": %.4f, \"ratio\": %.4f, "
               "\"engine_cpu_s_per_gib\": %.5f, \"fio_cpu_s_per_gib\": %.5f, "
               "\"cpu_ratio\": %.4f}",
               op_name[op], m->engine_gbps, m->fio_gbps, m->engine_gbps / m->fio_gbps,
               m->engine_cpu, m->fio_cpu, m->engine_cpu / m->fio_cpu);
    }
    printf("}\n");
}

static void print_table(const bench_args *a, const engine_side *s, const summary sum[2])
{
    char size[32], bs[32];
    printf("bench io: %u dir(s)", a->n_dirs);
    for (uint32_t i = 0; i < a->n_dirs; i++)
        printf("%s%s", i ? ", " : " (", a->dirs[i]);
    printf("), %s per run, bs %s, qd %u, %u runs (medians)\n", tio_format_bytes(a->size, size),
           tio_format_bytes(a->bs, bs), a->qd, a->runs);
    const char *reason = tio_engine_backend_reason(s->engine);
    printf("engine backend: %s, fixed buffers %s, fixed files %s%s%s\n",
           tio_backend_name(tio_engine_backend(s->engine)), s->registered ? "on" : "off",
           tio_engine_fixed_files(s->engine) ? "on" : "off", reason[0] ? "; " : "", reason);
    printf("%-6s %12s %10s %7s %14s %11s %10s\n", "", "engine GB/s", "fio GB/s", "ratio",
           "engine CPU s/GiB", "fio CPU s/GiB", "CPU ratio");
    for (int op = 0; op < 2; op++) {
        const summary *m = &sum[op];
        printf("%-6s %12.3f %10.3f %7.3f %16.4f %13.4f %10.3f\n", op_name[op], m->engine_gbps,
               m->fio_gbps, m->engine_gbps / m->fio_gbps, m->engine_cpu, m->fio_cpu,
               m->engine_cpu / m->fio_cpu);
    }
}

/* fio's files (the engine's backing files, ':'-separated) and scratch paths. */
static int fio_paths(const bench_args *a, const engine_side *s, char *files, size_t files_len,
                     char *json_path, char *log_path, size_t path_len)
{
    size_t used = 0;
    files[0] = '\0';
    for (uint32_t i = 0; i < a->n_dirs; i++) {
        const char *file = tio_engine_backing_path(s->engine, i);
        if (strchr(file, ':'))
            return cli_error(CMD, "directory '%s': fio cannot take a path with ':'", a->dirs[i]);
        int n = snprintf(files + used, files_len - used, "%s%s", i ? ":" : "", file);
        if (n < 0 || (size_t)n >= files_len - used)
            return cli_error(CMD, "directory paths too long");
        used += (size_t)n;
    }
    snprintf(json_path, path_len, "%s/teraio-bench-fio.%ld.json", a->dirs[0], (long)getpid());
    snprintf(log_path, path_len, "%s/teraio-bench-fio.%ld.log", a->dirs[0], (long)getpid());
    return 0;
}

static int run_bench(const bench_args *a)
{
    static char files[MAX_DIRS * 4200];
    char json_path[4200], log_path[4200];
    engine_side s = {0};
    int rc = engine_open(&s, a);
    if (!rc)
        rc = fio_paths(a, &s, files, sizeof files, json_path, log_path, sizeof json_path);
    if (rc) {
        engine_close(&s);
        return rc;
    }
    static sample eng[2][MAX_RUNS], fio[2][MAX_RUNS];
    for (uint32_t r = 0; r < a->runs && !rc; r++) {
        for (int op = 0; op < 2 && !rc; op++) {
            bool engine_first = (r + (uint32_t)op) % 2 == 0;
            for (int side = 0; side < 2 && !rc; side++) {
                bool engine_now = (side == 0) == engine_first;
                progress("bench io: run %u/%u, %s %s", r + 1, a->runs,
                         engine_now ? "engine" : "fio", op_name[op]);
                rc = engine_now ? engine_pass(&s, op, &eng[op][r])
                                : fio_pass(a, files, json_path, log_path, op, &fio[op][r]);
            }
        }
    }
    progress("%s", "");
    if (!rc) {
        summary sum[2];
        for (int op = 0; op < 2; op++)
            sum[op] = (summary){median(eng[op], a->runs, false), median(fio[op], a->runs, false),
                                median(eng[op], a->runs, true), median(fio[op], a->runs, true)};
        if (a->json)
            print_json(a, &s, sum);
        else
            print_table(a, &s, sum);
    }
    engine_close(&s);
    unlink(json_path);
    unlink(log_path);
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
