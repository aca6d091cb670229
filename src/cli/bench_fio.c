/*
 * cli/bench_fio.c — fio as the reference of `teraio bench io`.
 *
 * fio_default is fio as most people run it: ioengine=io_uring, direct=1.
 * fio_best gives fio what the engine has: registered buffers and files
 * (--fixedbufs=1 --registerfiles=1) and buffers in huge pages, so that a
 * 1 MiB request is one physical segment (docs/engine.md explains why that
 * matters).  Huge pages for fio come, in order of preference, from pages
 * already free, from raising vm.nr_hugepages for the run (root; restored
 * afterwards), or from a hugetlbfs mount (--iomem=mmaphuge); where none of
 * that works fio_best runs on 4 KiB pages and the report says so.  fio's
 * JSON output is read with json-c.
 */
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/wait.h>

#include "cli/bench_io.h"
#include "cli/cli.h"

#if TIO_HAVE_JSONC
#include <json-c/json.h>
#endif

#define CMD "bench"
#define NR_HUGEPAGES "/proc/sys/vm/nr_hugepages"

extern char **environ;

/* ---- huge pages -------------------------------------------------------- */

/* A number from /proc/meminfo ("HugePages_Free:", "Hugepagesize:"), or -1. */
static long meminfo(const char *key)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return -1;
    char line[256];
    long v = -1;
    size_t n = strlen(key);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, n)) {
            v = strtol(line + n, NULL, 10);
            break;
        }
    fclose(f);
    return v;
}

static long read_nr_hugepages(void)
{
    FILE *f = fopen(NR_HUGEPAGES, "r");
    long v = -1;
    if (f) {
        if (fscanf(f, "%ld", &v) != 1)
            v = -1;
        fclose(f);
    }
    return v;
}

static bool write_nr_hugepages(long v)
{
    FILE *f = fopen(NR_HUGEPAGES, "w");
    if (!f)
        return false;
    bool ok = fprintf(f, "%ld\n", v) > 0;
    return fclose(f) == 0 && ok;
}

/* A writable hugetlbfs mount point into out[len], or false. */
static bool hugetlbfs_mount(char *out, size_t len)
{
    FILE *f = fopen("/proc/mounts", "r");
    if (!f)
        return false;
    char dev[256], dir[4096], type[64];
    bool found = false;
    while (!found && fscanf(f, "%255s %4095s %63s %*[^\n]", dev, dir, type) == 3)
        if (!strcmp(type, "hugetlbfs") && access(dir, W_OK) == 0) {
            snprintf(out, len, "%s", dir);
            found = true;
        }
    fclose(f);
    return found;
}

void bench_hugemem_setup(bench_hugemem *h, uint64_t bytes)
{
    memset(h, 0, sizeof *h);
    h->saved_pages = -1;
    snprintf(h->iomem, sizeof h->iomem, "malloc");
    long page_kib = meminfo("Hugepagesize:"), free_pages = meminfo("HugePages_Free:");
    if (page_kib <= 0 || free_pages < 0) {
        snprintf(h->how, sizeof h->how, "no huge pages on this kernel: fio_best uses 4 KiB pages");
        return;
    }
    uint64_t page = (uint64_t)page_kib * 1024;
    long need = (long)((bytes + page - 1) / page) + 2; /* fio's alignment slack */
    h->need_pages = need;
    long before = read_nr_hugepages();
    char mount[4096];
    bool root = geteuid() == 0, have_mount = hugetlbfs_mount(mount, sizeof mount);
    if (free_pages < need && root && before >= 0 && write_nr_hugepages(before + need - free_pages)) {
        h->saved_pages = before;
        free_pages = meminfo("HugePages_Free:");
    }
    if (free_pages >= need && (root || have_mount)) {
        h->huge = true;
        if (root)
            snprintf(h->iomem, sizeof h->iomem, "shmhuge");
        else
            snprintf(h->iomem, sizeof h->iomem, "mmaphuge:%s/teraio-bench-fio.%ld", mount,
                     (long)getpid());
        if (h->saved_pages >= 0)
            snprintf(h->how, sizeof h->how, "--iomem=shmhuge, vm.nr_hugepages raised from %ld to "
                     "%ld for the run (restored after)", before, read_nr_hugepages());
        else
            snprintf(h->how, sizeof h->how, "--iomem=%s, %ld huge pages of %ld KiB were free",
                     root ? "shmhuge" : "mmaphuge on the hugetlbfs mount", need, page_kib);
        return;
    }
    bench_hugemem_restore(h);
    snprintf(h->how, sizeof h->how, "no huge pages for fio (%ld of %ld needed free; %s): "
             "fio_best uses 4 KiB pages", free_pages, need,
             root ? "raising vm.nr_hugepages did not free enough"
                  : "not root, so vm.nr_hugepages cannot be raised, and no writable hugetlbfs "
                    "mount with free pages");
}

/* Another process took huge pages reserved for fio between set-up and the
 * run: raise vm.nr_hugepages again by what is missing (root only).  True if
 * enough are free now. */
static bool hugemem_top_up(bench_hugemem *h)
{
    long free_pages = meminfo("HugePages_Free:"), now = read_nr_hugepages();
    if (free_pages >= h->need_pages)
        return true;
    if (geteuid() != 0 || now < 0 || !write_nr_hugepages(now + h->need_pages - free_pages))
        return false;
    if (h->saved_pages < 0)
        h->saved_pages = now;
    return meminfo("HugePages_Free:") >= h->need_pages;
}

void bench_hugemem_restore(bench_hugemem *h)
{
    if (h->saved_pages >= 0)
        write_nr_hugepages(h->saved_pages);
    h->saved_pages = -1;
}

/* ---- running fio -------------------------------------------------------- */

#if TIO_HAVE_JSONC
static double member_number(json_object *o, const char *key, bool *ok)
{
    json_object *v;
    if (!o || !json_object_object_get_ex(o, key, &v)) {
        *ok = false;
        return 0;
    }
    return json_object_get_double(v);
}

/* Bandwidth and CPU of job 0 in fio's JSON output. */
static int parse_fio_json(const bench_fio_job *job, bench_sample *out)
{
    json_object *root = json_object_from_file(job->json_path), *jobs, *j0, *dir;
    bool ok = root && json_object_object_get_ex(root, "jobs", &jobs) &&
              json_object_is_type(jobs, json_type_array) && json_object_array_length(jobs) > 0;
    j0 = ok ? json_object_array_get_idx(jobs, 0) : NULL;
    ok = ok && json_object_object_get_ex(j0, job->write ? "write" : "read", &dir);
    double bw = ok ? member_number(dir, "bw_bytes", &ok) : 0;
    double usr = ok ? member_number(j0, "usr_cpu", &ok) : 0;
    double sys = ok ? member_number(j0, "sys_cpu", &ok) : 0;
    double runtime_ms = ok ? member_number(j0, "job_runtime", &ok) : 0;
    json_object_put(root);
    if (!ok || !(bw > 0) || !(runtime_ms >= 0))
        return cli_error(CMD, "cannot read bw_bytes/usr_cpu/sys_cpu/job_runtime from fio's JSON "
                         "output in '%s'", job->json_path);
    if (runtime_ms < 1) /* fio counts whole milliseconds: a tiny pass may show 0 */
        runtime_ms = (double)job->size / bw * 1e3;
    out->gbps = bw / 1e9;
    double cpu = (usr + sys) / 100.0 * runtime_ms / 1000.0;
    out->cpu_per_gib = cpu / ((double)job->size / (1024.0 * 1024.0 * 1024.0));
    return 0;
}
#else
static int parse_fio_json(const bench_fio_job *job, bench_sample *out)
{
    return cli_error(CMD, "cannot read fio's JSON output: teraio was built without json-c "
                     "(install libjson-c-dev: scripts/deps)");
}
#endif

/* The first line fio wrote to its log, for an error message. */
static void first_line(const char *path, char *line, size_t len)
{
    line[0] = '\0';
    FILE *f = fopen(path, "r");
    if (f) {
        if (!fgets(line, (int)len, f))
            line[0] = '\0';
        fclose(f);
    }
    line[strcspn(line, "\n")] = '\0';
}

int bench_fio_run(const bench_fio_job *job, bench_sample *out)
{
    char bs[32], qd[32], size[48], filename[70000], output[4300], iomem[4300];
    snprintf(bs, sizeof bs, "--bs=%llu", (unsigned long long)job->bs);
    snprintf(qd, sizeof qd, "--iodepth=%u", job->qd);
    snprintf(size, sizeof size, "--size=%llu", (unsigned long long)job->size);
    snprintf(filename, sizeof filename, "--filename=%s", job->files);
    snprintf(output, sizeof output, "--output=%s", job->json_path);
    snprintf(iomem, sizeof iomem, "--iomem=%s", job->h->iomem);
    const char *rw = job->write ? (job->random ? "--rw=randwrite" : "--rw=write")
                                : (job->random ? "--rw=randread" : "--rw=read");
    char *argv[20] = {"fio", "--name=teraio-bench", filename, "--ioengine=io_uring",
                      "--direct=1", (char *)rw, bs, qd, size, "--output-format=json", output};
    int n = 11;
    if (job->best) {
        argv[n++] = "--fixedbufs=1";
        argv[n++] = "--registerfiles=1";
        argv[n++] = iomem;
    }
    argv[n] = NULL;
    int status, tries = 0;
again:;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, job->log_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid;
    int rc = posix_spawnp(&pid, "fio", &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc)
        return cli_error(CMD, "cannot run fio: %s (install it: scripts/deps, or apt-get install "
                         "fio)", strerror(rc));
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        char line[300];
        first_line(job->log_path, line, sizeof line);
        /* huge pages taken by another process since set-up: reserve them
         * again rather than compare against fio without them */
        if (job->best && job->h->huge && strstr(line, "no huge pages") && ++tries < 4 &&
            hugemem_top_up(job->h))
            goto again;
        if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
            return cli_error(CMD, "cannot run fio: not found on PATH (install it: scripts/deps)");
        return cli_error(CMD, "fio %s%s failed (status %d)%s%s", job->best ? "(best) " : "",
                         rw + 5, WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status),
                         line[0] ? ": " : "", line);
    }
    return parse_fio_json(job, out);
}
