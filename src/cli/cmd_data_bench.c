/*
 * cli/cmd_data_bench.c — `teraio data bench DIR`: packed tokens per second
 * of the loader (seq_len 4096, shuffling and mixing on, from the page cache)
 * beside memcpy of the same token bytes into a sample-sized buffer, measured
 * in the same run: the two alternate RUNS times and the best of each counts.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "teraio/data.h"

#define CMD "data"
#define RUNS 3
#define usage_error(...) cli_usage_error(CMD, __VA_ARGS__)

/* ---- bench -------------------------------------------------------------- */

typedef struct {
    uint8_t *map;
    size_t len;
} mapped;

/* Map every token file of the dataset (the .bin of a Megatron pair, llm.c
 * shards, Arrow files) for the memcpy side. */
static int map_all(const char *root, tio_dataset *ds, mapped **out, uint32_t *n_out)
{
    uint32_t n = 0, cap = 0;
    mapped *m = NULL;
    for (uint32_t s = 0; s < tio_dataset_n_subdatasets(ds); s++) {
        tio_data_subdataset_info in;
        tio_dataset_info(ds, s, &in);
        for (uint32_t f = 0; f < in.n_files; f++) {
            char path[4200];
            snprintf(path, sizeof path, "%s/%s", root, tio_dataset_file_path(ds, s, f));
            int fd = open(path, O_RDONLY | O_CLOEXEC);
            struct stat st;
            if (fd < 0 || fstat(fd, &st) != 0) {
                int e = errno;
                if (fd >= 0)
                    close(fd);
                free(m);
                return cli_error(CMD, "%s: %s", path, strerror(e));
            }
            if (n == cap) {
                cap = cap ? cap * 2 : 16;
                mapped *p = realloc(m, cap * sizeof *p);
                if (!p) {
                    close(fd);
                    free(m);
                    return cli_error(CMD, "out of memory");
                }
                m = p;
            }
            m[n].len = (size_t)st.st_size;
            m[n].map = m[n].len ? mmap(NULL, m[n].len, PROT_READ, MAP_SHARED, fd, 0) : NULL;
            close(fd);
            if (m[n].map == MAP_FAILED) {
                free(m);
                return cli_error(CMD, "%s: cannot map: %s", path, strerror(errno));
            }
            n++;
        }
    }
    *out = m;
    *n_out = n;
    return 0;
}

/* Touch every page once, so both sides read from the page cache. */
static void warm_up(const mapped *m, uint32_t n)
{
    volatile uint8_t sink = 0;
    long page = sysconf(_SC_PAGESIZE);
    for (uint32_t i = 0; i < n; i++)
        for (size_t at = 0; at < m[i].len; at += (size_t)page)
            sink ^= m[i].map[at];
    (void)sink;
}

/* Copy the mapped bytes into a sample-sized buffer, file after file, for
 * `seconds`; returns bytes per second. */
static double memcpy_rate(const mapped *m, uint32_t n, size_t chunk, double seconds, uint8_t *dst)
{
    uint64_t bytes = 0;
    double t0 = (double)tio_now_ns() * 1e-9, t = t0;
    volatile uint8_t sink = 0;
    while (t - t0 < seconds) {
        for (uint32_t i = 0; i < n && t - t0 < seconds; i++)
            for (size_t at = 0; at < m[i].len; at += chunk) {
                size_t k = m[i].len - at < chunk ? m[i].len - at : chunk;
                memcpy(dst, m[i].map + at, k);
                sink ^= dst[k / 2];
                bytes += k;
                if ((bytes & ((1u << 26) - 1)) < k)
                    t = (double)tio_now_ns() * 1e-9;
            }
        t = (double)tio_now_ns() * 1e-9;
    }
    (void)sink;
    return (double)bytes / (t - t0);
}

int cmd_data_bench(int argc, char **argv)
{
    const char *root = NULL;
    uint32_t seq_len = 4096, prefetch = 8, fill = UINT32_MAX;
    double seconds = 2;
    bool json = false;
    for (int i = 2; i < argc; i++) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(o, "--json")) {
            json = true;
        } else if (!strcmp(o, "--seq-len") || !strcmp(o, "--seconds") || !strcmp(o, "--prefetch") ||
                   !strcmp(o, "--fill-threads")) {
            if (!v)
                return usage_error("%s needs a value", o);
            i++;
            if (!strcmp(o, "--seq-len") && !cli_parse_u32(v, 1, 1u << 24, &seq_len))
                return usage_error("--seq-len '%s': expected an integer from 1 to 16777216", v);
            if (!strcmp(o, "--seconds") && (!cli_parse_positive(v, &seconds) || seconds > 3600))
                return usage_error("--seconds '%s': expected a positive number up to 3600", v);
            if (!strcmp(o, "--prefetch") && !cli_parse_u32(v, 0, 4096, &prefetch))
                return usage_error("--prefetch '%s': expected an integer from 0 to 4096", v);
            if (!strcmp(o, "--fill-threads") && !cli_parse_u32(v, 0, 64, &fill))
                return usage_error("--fill-threads '%s': expected an integer from 0 to 64", v);
        } else if (o[0] == '-') {
            return usage_error("unknown option '%s'", o);
        } else if (root) {
            return usage_error("bench takes one DIR");
        } else {
            root = o;
        }
    }
    if (!root)
        return usage_error("bench needs a dataset root DIR");
    tio_dataset *ds;
    int rc = tio_dataset_open(root, NULL, &ds);
    if (rc)
        return cli_lib_error(CMD, rc);
    uint64_t file_bytes = 0, tokens = 0;
    for (uint32_t s = 0; s < tio_dataset_n_subdatasets(ds); s++) {
        tio_data_subdataset_info in;
        tio_dataset_info(ds, s, &in);
        if (in.n_tokens == 0) {
            cli_error(CMD, "%s/%s: no token count (JSONL?): bench needs token files; run "
                      "'teraio data ingest' first", root, in.name);
            tio_dataset_destroy(ds);
            return 1;
        }
        tokens += in.n_tokens;
        file_bytes += in.bytes;
    }
    mapped *m = NULL;
    uint32_t n_maps = 0;
    if ((rc = map_all(root, ds, &m, &n_maps)) != 0) {
        tio_dataset_destroy(ds);
        return rc;
    }
    double bytes_per_token = (double)file_bytes / (double)tokens;
    size_t chunk = (size_t)((double)(seq_len + 1) * bytes_per_token);
    uint8_t *dst = malloc(chunk + 64);
    tio_loader_options o;
    tio_loader_options_default(&o);
    o.seq_len = seq_len;
    o.prefetch = prefetch;
    if (fill != UINT32_MAX)
        o.fill_threads = fill;
    tio_loader *ld = NULL;
    int status = 0;
    if (!dst) {
        status = cli_error(CMD, "out of memory");
        goto done;
    }
    warm_up(m, n_maps);
    if ((rc = tio_loader_create(ds, &o, NULL, NULL, 0, &ld)) != 0) {
        status = cli_lib_error(CMD, rc);
        goto done;
    }
    /* loader and memcpy alternate, RUNS times each; the best run of each
     * side stands (drift and other load on the machine hit both alike) */
    double best = 0, mem = 0;
    uint64_t samples_total = 0;
    uint64_t check = 0;
    for (int run = 0; run < RUNS; run++) {
        uint64_t samples = 0;
        double t0 = (double)tio_now_ns() * 1e-9, t = t0;
        while (t - t0 < seconds) {
            const tio_data_sample *s;
            if ((rc = tio_loader_next(ld, &s)) != 0) {
                status = cli_lib_error(CMD, rc);
                goto done;
            }
            check += s->tokens[samples % (seq_len + 1)] + s->position_ids[seq_len - 1];
            samples++;
            if ((samples & 15) == 0)
                t = (double)tio_now_ns() * 1e-9;
        }
        t = (double)tio_now_ns() * 1e-9;
        double rate = (double)samples * (seq_len + 1) / (t - t0);
        best = rate > best ? rate : best;
        samples_total += samples;
        double m_rate = memcpy_rate(m, n_maps, chunk, seconds, dst) / bytes_per_token;
        mem = m_rate > mem ? m_rate : mem;
    }
    if (json) {
        printf("{\"dataset\": ");
        cli_json_string(stdout, root);
        printf(", \"seq_len\": %u, \"subdatasets\": %u, \"samples\": %llu, "
               "\"seconds_per_run\": %g, \"runs\": %d, \"prefetch\": %u, \"fill_threads\": %u, \"bytes_per_token\": %.3f, \"tokens_per_s\": %.0f, "
               "\"samples_per_s\": %.1f, \"memcpy_tokens_per_s\": %.0f, \"ratio\": %.4f, "
               "\"checksum\": %llu}\n", seq_len, tio_dataset_n_subdatasets(ds),
               (unsigned long long)samples_total, seconds, RUNS, prefetch, o.fill_threads,
               bytes_per_token, best,
               best / (seq_len + 1), mem, best / mem, (unsigned long long)check);
    } else {
        printf("loader  %12.1f M tokens/s  (%.1f samples/s of %u + 1 tokens, shuffle 64, %u "
               "sub-datasets mixed)\nmemcpy  %12.1f M tokens/s  (%.2f bytes per token)\n"
               "ratio   %12.3f  (loader / memcpy)\n", best / 1e6, best / (seq_len + 1), seq_len,
               tio_dataset_n_subdatasets(ds), mem / 1e6, bytes_per_token, best / mem);
    }
done:
    tio_loader_destroy(ld);
    free(dst);
    for (uint32_t i = 0; i < n_maps; i++)
        if (m[i].map)
            munmap(m[i].map, m[i].len);
    free(m);
    tio_dataset_destroy(ds);
    return status;
}

