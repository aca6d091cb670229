/*
 * cli/bench_fio.h — the reference side of `teraio bench io`: fio, run as a
 * child process, at its default settings and at its best (registered
 * buffers and files, huge-page memory), and the huge pages that the best
 * settings need.
 */
#ifndef TERAIO_CLI_BENCH_FIO_H
#define TERAIO_CLI_BENCH_FIO_H

#include <stdbool.h>
#include <stdint.h>

/* One measured pass: bandwidth (1e9 bytes/s) and CPU seconds per GiB. */
typedef struct {
    double gbps, cpu_per_gib;
} bench_sample;

/* Huge-page memory for fio's buffers (fio --iomem): what was arranged and
 * how, to be said in the output. */
typedef struct {
    char iomem[4200];  /* fio's --iomem value ("shmhuge", "mmaphuge:<file>", "malloc") */
    char how[512];     /* one sentence for the report */
    bool huge;         /* fio gets huge pages */
    long saved_pages;  /* vm.nr_hugepages before the run; -1: not changed */
} bench_hugemem;

/* Arrange `bytes` of huge-page memory for fio: pages already free; else
 * raise vm.nr_hugepages for the run (restored by bench_hugemem_restore);
 * else a hugetlbfs mount with free pages (--iomem=mmaphuge); else none
 * (fio runs on 4 KiB pages, and `how` says why). */
void bench_hugemem_setup(bench_hugemem *h, uint64_t bytes);
void bench_hugemem_restore(bench_hugemem *h);

typedef struct {
    const char *files;      /* ':'-separated, as fio's --filename */
    const char *json_path;  /* fio's JSON output */
    const char *log_path;   /* its other output */
    uint64_t size, bs;
    uint32_t qd;
    bool write, random;
    bool best;              /* registered buffers and files, h's memory */
    const bench_hugemem *h;
} bench_fio_job;

/* Run fio once.  Returns 0 with *out filled, or an exit status after
 * printing one line (fio missing, failed, or its JSON unreadable). */
int bench_fio_run(const bench_fio_job *job, bench_sample *out);

#endif
