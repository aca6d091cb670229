/*
 * cli/bench_engine.c — the engine side of `teraio bench io`: the public API
 * driven the way an application would.
 *
 * One 2 MiB-aligned allocation of 2 x QD buffers registered with
 * tio_engine_register_buffer; each request is one buffer; a new request is
 * submitted as soon as one is reaped, 2 x QD kept submitted so that the
 * engine's pending queue refills the ring from its completion thread without
 * waiting for this thread.  CPU is getrusage of this process over the pass,
 * every thread included.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "cli/bench_io.h"
#include "cli/cli.h"

#define CMD "bench"
#define GIB (1024.0 * 1024.0 * 1024.0)
#define HUGE_ALIGN (2u << 20)

int bench_buffers_init(bench_buffers *b, uint32_t n_bufs, uint64_t max_bs, uint64_t max_blocks)
{
    memset(b, 0, sizeof *b);
    b->n_bufs = n_bufs;
    b->max_bs = max_bs;
    size_t total = (size_t)n_bufs * max_bs;
    void *p;
    if (posix_memalign(&p, HUGE_ALIGN, (total + HUGE_ALIGN - 1) / HUGE_ALIGN * HUGE_ALIGN) != 0)
        return cli_error(CMD, "out of memory for %u buffers of %llu bytes", n_bufs,
                         (unsigned long long)max_bs);
    b->bufs = p;
    for (size_t i = 0; i < total; i++)
        b->bufs[i] = (char)(i * 131u + (i >> 12));
    if (!(b->order = malloc(max_blocks * sizeof *b->order)))
        return cli_error(CMD, "out of memory");
    return 0;
}

void bench_buffers_fini(bench_buffers *b)
{
    free(b->bufs);
    free(b->order);
    memset(b, 0, sizeof *b);
}

void bench_engine_close(bench_engine *s)
{
    tio_engine_destroy(s->engine);
    free(s->extents);
    for (uint32_t i = 0; i < s->n_dirs; i++) {
        if (s->made_dirs && s->dirs[i])
            rmdir(s->dirs[i]);
        free(s->dirs[i]);
    }
    memset(s, 0, sizeof *s);
}

static int make_dirs(bench_engine *s, const bench_engine_config *c)
{
    s->n_dirs = c->n_dirs;
    s->made_dirs = c->sub != NULL;
    for (uint32_t i = 0; i < c->n_dirs; i++) {
        const char *base = c->dirs[i % c->n_given];
        size_t len = strlen(base) + 64;
        if (!(s->dirs[i] = malloc(len)))
            return cli_error(CMD, "out of memory");
        if (!c->sub) {
            snprintf(s->dirs[i], len, "%s", base);
            continue;
        }
        snprintf(s->dirs[i], len, "%s/teraio-bench-%s-%u", base, c->sub, i);
        if (mkdir(s->dirs[i], 0700) != 0 && errno != EEXIST)
            return cli_error(CMD, "cannot create '%s': %s", s->dirs[i], strerror(errno));
    }
    return 0;
}

int bench_engine_open(bench_engine *s, const bench_engine_config *c, const bench_buffers *b)
{
    memset(s, 0, sizeof *s);
    s->crc = c->crc;
    int rc = make_dirs(s, c);
    if (rc)
        return rc;
    tio_engine_options opt;
    tio_engine_options_default(&opt);
    opt.dirs = (const char *const *)s->dirs;
    opt.n_dirs = c->n_dirs;
    opt.space_bytes = c->size;
    opt.stripe_bytes = (uint32_t)c->bs;
    opt.request_bytes = (uint32_t)c->bs;
    opt.queue_depth = c->qd;
    opt.checksum = c->crc;
    if ((rc = tio_engine_create(&opt, &s->engine)) != 0)
        return cli_lib_error(CMD, rc);
    uint64_t n = c->size / c->bs;
    if (c->crc) {
        if (!(s->extents = malloc(n * sizeof *s->extents)))
            return cli_error(CMD, "out of memory");
        for (uint64_t i = 0; i < n && !rc; i++)
            rc = tio_engine_alloc(s->engine, c->bs, &s->extents[i]);
    } else {
        rc = tio_engine_alloc(s->engine, c->size, &s->whole);
    }
    if (rc || (rc = tio_engine_register_buffer(s->engine, b->bufs,
                                               (uint64_t)b->n_bufs * b->max_bs)) != 0)
        return cli_lib_error(CMD, rc);
    size_t used = 0;
    for (uint32_t i = 0; i < c->n_dirs; i++)
        used += (size_t)snprintf(s->files + used, sizeof s->files - used, "%s%s", i ? ":" : "",
                                 tio_engine_backing_path(s->engine, i));
    return 0;
}

/* Random reads: a permutation of the bytes / bs blocks, the same for every
 * round (fio draws its own, also each block once). */
static void shuffle_blocks(bench_buffers *b, uint64_t bs, uint64_t bytes)
{
    uint32_t n = (uint32_t)(bytes / bs);
    uint64_t x = 0x9E3779B97F4A7C15ull ^ bs;
    for (uint32_t i = 0; i < n; i++)
        b->order[i] = i;
    for (uint32_t i = n; i > 1; i--) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        uint32_t j = (uint32_t)(x % i), t = b->order[i - 1];
        b->order[i - 1] = b->order[j];
        b->order[j] = t;
    }
}

/* Request i of a pass: sequential, or the i-th block of the random order. */
static tio_extent request_extent(const bench_engine *s, const bench_buffers *b, bool random,
                                 uint64_t bs, uint64_t i)
{
    if (s->crc)
        return s->extents[i];
    uint64_t off = (random ? (uint64_t)b->order[i] : i) * bs;
    return (tio_extent){.offset = s->whole.offset + off, .bytes = bs};
}

static double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

int bench_engine_pass(const bench_engine *s, bench_buffers *b, bool write, bool random,
                      uint64_t bs, uint64_t bytes, bench_sample *out)
{
    if (random)
        shuffle_blocks(b, bs, bytes);
    uint64_t n_req = bytes / bs, next = 0, done = 0;
    uint32_t free_slots[2 * 4096], n_free = b->n_bufs;
    for (uint32_t i = 0; i < b->n_bufs; i++)
        free_slots[i] = i;
    tio_completion comp[128];
    uint64_t t0 = tio_now_ns();
    double c0 = cpu_s();
    while (done < n_req) {
        while (next < n_req && n_free > 0) {
            uint32_t slot = free_slots[--n_free];
            tio_extent x = request_extent(s, b, random, bs, next);
            char *buf = b->bufs + (size_t)slot * b->max_bs;
            int rc = write ? tio_engine_submit_write(s->engine, &x, buf, bs, slot, false)
                           : tio_engine_submit_read(s->engine, &x, buf, bs, slot, false);
            if (rc)
                return cli_lib_error(CMD, rc);
            next++;
        }
        int n = tio_engine_reap(s->engine, comp, 128, 1);
        if (n < 0)
            return cli_lib_error(CMD, n);
        for (int i = 0; i < n; i++) {
            if (comp[i].result)
                return cli_error(CMD, "engine %s: %s", write ? "write" : "read",
                                 tio_engine_completion_error(s->engine, comp[i].tag));
            free_slots[n_free++] = (uint32_t)comp[i].tag;
        }
        done += (uint64_t)n;
    }
    double dt = (double)(tio_now_ns() - t0) * 1e-9, cpu = cpu_s() - c0;
    out->gbps = (double)bytes / dt / 1e9;
    out->cpu_per_gib = cpu / ((double)bytes / GIB);
    return 0;
}
