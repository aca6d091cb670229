/*
 * cli/bench_io.h — the two sides of `teraio bench io` (cmd_bench_io.c runs
 * the rounds and reports): the engine, driven through its public API
 * (bench_engine.c), and the reference, fio, run as a child process at its
 * default settings and at its best, with the huge pages the best settings
 * need (bench_fio.c).
 */
#ifndef TERAIO_CLI_BENCH_IO_H
#define TERAIO_CLI_BENCH_IO_H

#include <stdbool.h>
#include <stdint.h>

#include "teraio/engine.h"

#define BENCH_MAX_DIRS 16

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
    long need_pages;   /* huge pages fio's buffers take */
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
    bench_hugemem *h;       /* topped up when another process took its pages */
} bench_fio_job;

/* Run fio once.  Returns 0 with *out filled, or an exit status after
 * printing one line (fio missing, failed, or its JSON unreadable). */
int bench_fio_run(const bench_fio_job *job, bench_sample *out);

/* The engine side's memory: n_bufs buffers of max_bs bytes, one 2 MiB-aligned
 * allocation (so that the engine can have it backed by huge pages), and the
 * block order of the random reads. */
typedef struct {
    char *bufs;
    uint32_t n_bufs;
    uint64_t max_bs;
    uint32_t *order;    /* [max_blocks] */
} bench_buffers;

int bench_buffers_init(bench_buffers *b, uint32_t n_bufs, uint64_t max_bs, uint64_t max_blocks);
void bench_buffers_fini(bench_buffers *b);

/* One engine over n_dirs directories: the given ones (sub NULL) or
 * subdirectories "teraio-bench-<sub>-<i>" spread over them (created, and
 * removed again by close).  With crc, checksums are on and every request is
 * one whole extent of bs bytes; without, requests are slices of one extent
 * of all the space. */
typedef struct {
    tio_engine *engine;
    bool crc, made_dirs;
    uint32_t n_dirs;
    char *dirs[BENCH_MAX_DIRS];
    tio_extent *extents;
    tio_extent whole;
    char files[BENCH_MAX_DIRS * 4200]; /* its backing files, ':'-separated (fio) */
} bench_engine;

typedef struct {
    const char *const *dirs; /* the given directories */
    uint32_t n_given;
    uint32_t n_dirs;         /* directories of this engine */
    const char *sub;         /* NULL: the given directories themselves */
    uint64_t size, bs;
    uint32_t qd;
    bool crc;
} bench_engine_config;

/* Create the engine, its extents, register b's buffers.  Returns 0 or an
 * exit status after printing one line. */
int bench_engine_open(bench_engine *s, const bench_engine_config *c, const bench_buffers *b);
void bench_engine_close(bench_engine *s);

/* One pass of bytes / bs requests (random: each block of the first `bytes`
 * once, in a random order), 2 x qd kept submitted.  Returns 0 with *out
 * filled (bandwidth; CPU of this whole process over the pass), or an exit
 * status after printing one line. */
int bench_engine_pass(const bench_engine *s, bench_buffers *b, bool write, bool random,
                      uint64_t bs, uint64_t bytes, bench_sample *out);

#endif
