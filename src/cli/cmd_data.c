/*
 * cli/cmd_data.c — `teraio data`: the data loader from the command line.
 *
 *   data inspect DIR     what the loader sees in a dataset root: per
 *                        sub-dataset its files, documents and tokens
 *   data ingest SRC OUT  tokenize a root of JSONL sub-datasets into Megatron
 *                        .bin/.idx shards (one per input file, same relative
 *                        path) plus OUT/counts.csv, several files at once
 *   data sample DIR      the first samples of a rank and where they come
 *                        from; resumes from and saves loader state files
 *   data bench DIR       packed tokens per second of the loader (seq_len
 *                        4096, shuffling and mixing on, from the page cache)
 *                        beside memcpy of the same token bytes in the same run
 *
 * Ingest writes MMIDIDX v1 exactly as Megatron's IndexedDatasetBuilder does
 * (one sequence per document, uint16 ids when the vocabulary fits, else
 * int32), so Megatron itself can read its output.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "teraio/data.h"

#define CMD "data"
#define RUNS 3

static void usage(FILE *f)
{
    fprintf(f,
            "usage: teraio data inspect DIR [--state FILE [--seed N] [--eos-id N]] [--json]\n"
            "       teraio data ingest SRC OUT [--tokenizer SPEC] [--tokenizers-dir DIR]\n"
            "                          [--threads N] [--text-field NAME] [--skip-bad-lines]\n"
            "       teraio data sample DIR [--seq-len N] [--count N] [--seed N] [--rank R]\n"
            "                          [--world-size W] [--logical-shards L] [--eos-id N]\n"
            "                          [--resume STATE] [--save STATE] [--ids]\n"
            "       teraio data bench DIR [--seq-len N] [--seconds S] [--prefetch N]\n"
            "                         [--fill-threads N] [--json]\n"
            "\n"
            "inspect  sub-datasets of a dataset root (one folder each), their files,\n"
            "         documents and tokens (JSONL tokens are counted only by ingest).\n"
            "         --state: the position a loader state file holds (checked against\n"
            "         the dataset and the loader's seed and EOS id, default 0).\n"
            "ingest   tokenize every JSONL file (.jsonl, .jsonl.gz, .jsonl.zst) under the\n"
            "         root SRC into Megatron .bin/.idx files under OUT (same sub-dataset\n"
            "         and relative path) and write OUT/counts.csv.  SPEC: bytes (default),\n"
            "         r50k_base, p50k_base, cl100k_base, o200k_base or a tokenizer.json.\n"
            "         --threads: files tokenized at once (default: online CPUs).  A\n"
            "         progress line is shown when stderr is a terminal.\n"
            "sample   the first samples of one rank: the pieces of documents in each\n"
            "         (file#document[offset+length]e<epoch>), with --ids their token ids;\n"
            "         --resume starts from a state file, --save writes one after them.\n"
            "bench    the loader's packed tokens/s (default seq_len 4096, shuffle buffer\n"
            "         64, every sub-dataset mixed at weight 1, prefetch thread on) beside\n"
            "         memcpy of the dataset's token bytes into a sample-sized buffer, both\n"
            "         after one pass over the files (page cache); the two alternate 3\n"
            "         times for S seconds each (default 2) and the best run of each counts.\n"
            "         --prefetch: the loader's queue (0: no thread), default 8;\n"
            "         --fill-threads: threads reading tokens (default: the loader's).\n");
}

/* A usage mistake: one line on stderr, exit status 2. */
#define usage_error(...) cli_usage_error(CMD, __VA_ARGS__)

static int parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *out)
{
    char *end;
    if (!s || *s < '0' || *s > '9')
        return -1;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v < lo || v > hi)
        return -1;
    *out = (uint32_t)v;
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

static int open_dataset(const char *root, const tio_dataset_options *o, tio_dataset **ds)
{
    struct stat st;
    if (stat(root, &st) != 0)
        return cli_error(CMD, "%s: %s", root, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return cli_error(CMD, "%s: not a folder", root);
    int rc = tio_dataset_open(root, o, ds);
    return rc ? cli_lib_error(CMD, rc) : 0;
}

/* ---- inspect ------------------------------------------------------------ */

static uint32_t state_u32(const void *buf, size_t at)
{
    uint32_t v;
    memcpy(&v, (const uint8_t *)buf + at, 4);
    return v;
}

/* The position a state file holds, checked against the dataset: loading it
 * fails on a state of another dataset or other settings. */
static int inspect_state(tio_dataset *ds, const char *path, uint64_t seed, uint32_t eos, bool json)
{
    void *buf;
    size_t len;
    int rc = tio_loader_state_read(path, &buf, &len);
    if (rc)
        return cli_lib_error(CMD, rc);
    tio_loader_options o;
    tio_loader_options_default(&o);
    o.rank = state_u32(buf, 20);
    o.world_size = state_u32(buf, 24);
    o.logical_shards = state_u32(buf, 28);
    o.seq_len = state_u32(buf, 32);
    o.shuffle_buffer = state_u32(buf, 36);
    o.seed = seed;
    o.eos_id = eos;
    o.prefetch = 0;
    tio_loader *ld;
    const void *states[1] = {buf};
    rc = tio_loader_create(ds, &o, states, &len, 1, &ld);
    free(buf);
    if (rc)
        return cli_error(CMD, "%s: %s", path, tio_last_error());
    if (json)
        printf(", \"state\": {\"rank\": %u, \"world_size\": %u, \"positions\": [", o.rank,
               o.world_size);
    else
        printf("state %s: rank %u of %u, logical shards %u, seq_len %u\n", path, o.rank,
               o.world_size, o.logical_shards, o.seq_len);
    for (uint32_t s = 0; s < tio_dataset_n_subdatasets(ds); s++) {
        tio_data_subdataset_info in;
        tio_data_position p;
        tio_dataset_info(ds, s, &in);
        tio_loader_position(ld, s, &p);
        if (json) {
            printf("%s{\"name\": ", s ? ", " : "");
            json_string(stdout, in.name);
            printf(", \"epoch\": %u, \"documents_consumed\": %llu, \"documents\": %llu, "
                   "\"tokens_packed\": %llu}", p.epoch, (unsigned long long)p.docs_consumed,
                   (unsigned long long)p.docs_total, (unsigned long long)p.tokens_packed);
        } else {
            printf("  %-22s epoch %u, %llu of %llu documents of this rank consumed, %llu tokens "
                   "packed\n", in.name, p.epoch, (unsigned long long)p.docs_consumed,
                   (unsigned long long)p.docs_total, (unsigned long long)p.tokens_packed);
        }
    }
    if (json)
        printf("]}");
    tio_loader_destroy(ld);
    return 0;
}

static int cmd_inspect(int argc, char **argv)
{
    const char *root = NULL, *state = NULL;
    bool json = false;
    uint32_t eos = 0, seed = 0;
    for (int i = 2; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--json")) {
            json = true;
        } else if (!strcmp(argv[i], "--state") || !strcmp(argv[i], "--seed") ||
                   !strcmp(argv[i], "--eos-id")) {
            if (!v)
                return usage_error("%s needs a value", argv[i]);
            if (!strcmp(argv[i], "--state"))
                state = v;
            else if (parse_u32(v, 0, UINT32_MAX, !strcmp(argv[i], "--seed") ? &seed : &eos))
                return usage_error("%s '%s': expected an integer", argv[i], v);
            i++;
        } else if (argv[i][0] == '-')
            return usage_error("unknown option '%s'", argv[i]);
        else if (root)
            return usage_error("inspect takes one DIR");
        else
            root = argv[i];
    }
    if (!root)
        return usage_error("inspect needs a dataset root DIR");
    tio_dataset *ds;
    int rc = open_dataset(root, NULL, &ds);
    if (rc)
        return rc;
    uint32_t n = tio_dataset_n_subdatasets(ds);
    uint64_t files = 0, docs = 0, toks = 0;
    bool uncounted = false; /* JSONL: tokens are counted when ingested */
    if (json)
        printf("{\"root\": "), json_string(stdout, root), printf(", \"subdatasets\": [");
    else
        printf("%-24s %8s %14s %16s %14s\n", "sub-dataset", "files", "documents", "tokens", "bytes");
    for (uint32_t s = 0; s < n; s++) {
        tio_data_subdataset_info in;
        tio_dataset_info(ds, s, &in);
        files += in.n_files;
        docs += in.n_docs;
        toks += in.n_tokens;
        uncounted |= in.n_docs > 0 && in.n_tokens == 0;
        if (json) {
            printf("%s{\"name\": ", s ? ", " : "");
            json_string(stdout, in.name);
            printf(", \"files\": %u, \"documents\": %llu, \"tokens\": %llu, \"bytes\": %llu, "
                   "\"file_list\": [", in.n_files, (unsigned long long)in.n_docs,
                   (unsigned long long)in.n_tokens, (unsigned long long)in.bytes);
            for (uint32_t f = 0; f < in.n_files; f++) {
                printf("%s{\"path\": ", f ? ", " : "");
                json_string(stdout, tio_dataset_file_path(ds, s, f));
                printf(", \"documents\": %lld}", (long long)tio_dataset_file_docs(ds, s, f));
            }
            printf("]}");
        } else {
            printf("%-24s %8u %14llu %16llu %14llu\n", in.name, in.n_files,
                   (unsigned long long)in.n_docs, (unsigned long long)in.n_tokens,
                   (unsigned long long)in.bytes);
            for (uint32_t f = 0; f < in.n_files; f++)
                printf("  %-40s %14lld documents\n", tio_dataset_file_path(ds, s, f),
                       (long long)tio_dataset_file_docs(ds, s, f));
        }
    }
    if (json)
        printf("], \"files\": %llu, \"documents\": %llu, \"tokens\": %llu",
               (unsigned long long)files, (unsigned long long)docs, (unsigned long long)toks);
    else
        printf("%-24s %8llu %14llu %16llu\n%s", "total", (unsigned long long)files,
               (unsigned long long)docs, (unsigned long long)toks,
               uncounted ? "(tokens are 0 for JSONL: counted when ingested)\n" : "");
    int status = state ? inspect_state(ds, state, seed, eos, json) : 0;
    if (json && !status)
        printf("}\n");
    tio_dataset_destroy(ds);
    return status;
}

/* ---- ingest ------------------------------------------------------------- */

typedef struct {
    tio_dataset *ds;
    const char *out;
    int dtype;             /* Megatron code: 8 uint16, 4 int32 */
    uint32_t n_jobs, next; /* files, next to take (under lock) */
    uint32_t (*jobs)[2];   /* sub, file */
    uint64_t *docs, *tokens; /* per job, when done */
    pthread_mutex_t lock;
    int rc;
    char msg[8192];
    uint32_t done;
    uint64_t all_tokens, all_docs;
    bool progress;    /* stderr is a terminal: a progress line, redrawn */
    double t0, last_progress;
} ingest_ctx;

static void ingest_progress(ingest_ctx *c);

typedef struct {
    FILE *bin;
    const char *path;
    int width;
    int32_t *lens;
    uint64_t n, cap, tokens;
    uint32_t max_id;
    ingest_ctx *ctx;
} shard_writer;

static int write_doc(void *arg, uint64_t doc, const uint32_t *ids, uint64_t n)
{
    shard_writer *w = arg;
    (void)doc;
    if (n > INT32_MAX)
        return -EOVERFLOW;
    if (w->n == w->cap) {
        uint64_t nc = w->cap ? w->cap * 2 : 1024;
        int32_t *p = realloc(w->lens, nc * sizeof *p);
        if (!p)
            return -ENOMEM;
        w->lens = p;
        w->cap = nc;
    }
    w->lens[w->n++] = (int32_t)n;
    w->tokens += n;
    if (w->width == 2) {
        uint16_t buf[4096];
        for (uint64_t i = 0; i < n;) {
            uint64_t k = 0;
            for (; k < 4096 && i < n; k++, i++) {
                if (ids[i] > UINT16_MAX)
                    return -ERANGE;
                buf[k] = (uint16_t)ids[i];
            }
            if (fwrite(buf, 2, k, w->bin) != k)
                return -EIO;
        }
    } else {
        for (uint64_t i = 0; i < n; i++)
            if (ids[i] > INT32_MAX)
                return -ERANGE;
        if (n && fwrite(ids, 4, n, w->bin) != n)
            return -EIO;
    }
    ingest_ctx *c = w->ctx;
    pthread_mutex_lock(&c->lock);
    c->all_tokens += n;
    c->all_docs++;
    if (c->progress && (c->all_docs & 255) == 0) {
        double t = now_s();
        if (t - c->last_progress >= 0.25) {
            c->last_progress = t;
            ingest_progress(c);
        }
    }
    pthread_mutex_unlock(&c->lock);
    return 0;
}

static int make_parents(char *path)
{
    for (char *p = path + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            int bad = mkdir(path, 0755) != 0 && errno != EEXIST;
            *p = '/';
            if (bad)
                return -errno;
        }
    return 0;
}

/* The output prefix of an input's relative path: its .jsonl[.gz|.zst] cut. */
static void out_prefix(const char *out, const char *rel, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s/%s", out, rel);
    static const char *const ext[] = {".jsonl.gz", ".jsonl.zst", ".jsonl"};
    size_t n = strlen(buf);
    for (size_t i = 0; i < 3; i++) {
        size_t e = strlen(ext[i]);
        if (n > e && !strcmp(buf + n - e, ext[i])) {
            buf[n - e] = '\0';
            return;
        }
    }
}

static int write_idx(const char *path, const shard_writer *w, int dtype)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -errno;
    uint64_t version = 1, n = w->n, ndoc = w->n + 1;
    uint8_t code = (uint8_t)dtype;
    fwrite("MMIDIDX\0\0", 1, 9, f);
    fwrite(&version, 8, 1, f);
    fwrite(&code, 1, 1, f);
    fwrite(&n, 8, 1, f);
    fwrite(&ndoc, 8, 1, f);
    if (n)
        fwrite(w->lens, 4, n, f);
    int64_t at = 0;
    for (uint64_t i = 0; i < n; i++) {
        fwrite(&at, 8, 1, f);
        at += (int64_t)w->lens[i] * w->width;
    }
    for (uint64_t i = 0; i <= n; i++) {
        int64_t d = (int64_t)i;
        fwrite(&d, 8, 1, f);
    }
    int bad = ferror(f);
    if (fclose(f) != 0 || bad)
        return -EIO;
    return 0;
}

static int ingest_file(ingest_ctx *c, uint32_t job, char *msg, size_t msg_cap)
{
    uint32_t sub = c->jobs[job][0], file = c->jobs[job][1];
    const char *rel = tio_dataset_file_path(c->ds, sub, file);
    char prefix[4096], bin[4200], idx[4200];
    out_prefix(c->out, rel, prefix, sizeof prefix);
    snprintf(bin, sizeof bin, "%s.bin", prefix);
    snprintf(idx, sizeof idx, "%s.idx", prefix);
    int e = make_parents(bin);
    if (e) {
        snprintf(msg, msg_cap, "%s: cannot create its folder: %s", bin, strerror(-e));
        return e;
    }
    shard_writer w = {.path = bin, .width = c->dtype == 8 ? 2 : 4, .ctx = c};
    if (!(w.bin = fopen(bin, "wb"))) {
        e = errno;
        snprintf(msg, msg_cap, "%s: %s", bin, strerror(e));
        return -e;
    }
    int rc = tio_dataset_scan_file(c->ds, sub, file, write_doc, &w);
    int bad = ferror(w.bin);
    if (fclose(w.bin) != 0 || bad)
        rc = rc ? rc : -EIO;
    if (!rc)
        rc = write_idx(idx, &w, c->dtype);
    if (rc) {
        if (rc == -ERANGE)
            snprintf(msg, msg_cap, "%s: a token id does not fit the .bin dtype", rel);
        else if (rc == -EIO || rc == -ENOSPC)
            snprintf(msg, msg_cap, "%s: write failed: %s", bin, strerror(-rc));
        else
            snprintf(msg, msg_cap, "%s", tio_last_error());
    }
    c->docs[job] = w.n;
    c->tokens[job] = w.tokens;
    free(w.lens);
    return rc;
}

static void ingest_progress(ingest_ctx *c)
{
    double dt = now_s() - c->t0;
    fprintf(stderr, "\r\033[Kingest: %u/%u files, %llu documents, %llu tokens, %.2f M tokens/s",
            c->done, c->n_jobs, (unsigned long long)c->all_docs,
            (unsigned long long)c->all_tokens, dt > 0 ? (double)c->all_tokens / dt / 1e6 : 0.0);
    fflush(stderr);
}

static void *ingest_worker(void *arg)
{
    ingest_ctx *c = arg;
    for (;;) {
        pthread_mutex_lock(&c->lock);
        if (c->rc || c->next == c->n_jobs) {
            pthread_mutex_unlock(&c->lock);
            return NULL;
        }
        uint32_t job = c->next++;
        pthread_mutex_unlock(&c->lock);
        char msg[8192] = "";
        int rc = ingest_file(c, job, msg, sizeof msg);
        pthread_mutex_lock(&c->lock);
        if (rc && !c->rc) {
            c->rc = rc;
            snprintf(c->msg, sizeof c->msg, "%s", msg);
        }
        c->done++;
        if (c->progress && !c->rc)
            ingest_progress(c);
        pthread_mutex_unlock(&c->lock);
        if (rc)
            return NULL;
    }
}

static int write_counts(const ingest_ctx *c)
{
    char path[4200], tmp[4300];
    snprintf(path, sizeof path, "%s/counts.csv", c->out);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return cli_error(CMD, "%s: %s", tmp, strerror(errno));
    fprintf(f, "# path,documents,tokens (written by teraio data ingest)\n");
    for (uint32_t j = 0; j < c->n_jobs; j++) {
        char prefix[4096];
        out_prefix("", tio_dataset_file_path(c->ds, c->jobs[j][0], c->jobs[j][1]), prefix,
                   sizeof prefix);
        fprintf(f, "%s.bin,%llu,%llu\n", prefix + 1, (unsigned long long)c->docs[j],
                (unsigned long long)c->tokens[j]);
    }
    int bad = ferror(f);
    if (fclose(f) != 0 || bad || rename(tmp, path) != 0)
        return cli_error(CMD, "%s: write failed: %s", path, strerror(errno ? errno : EIO));
    return 0;
}

static int cmd_ingest(int argc, char **argv)
{
    const char *src = NULL, *out = NULL, *spec = "bytes", *tokdir = NULL, *field = "text";
    uint32_t threads = 0;
    bool skip = false;
    for (int i = 2; i < argc; i++) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(o, "--skip-bad-lines")) {
            skip = true;
        } else if (!strcmp(o, "--tokenizer") || !strcmp(o, "--tokenizers-dir") ||
                   !strcmp(o, "--threads") || !strcmp(o, "--text-field")) {
            if (!v)
                return usage_error("%s needs a value", o);
            i++;
            if (!strcmp(o, "--tokenizer"))
                spec = v;
            else if (!strcmp(o, "--tokenizers-dir"))
                tokdir = v;
            else if (!strcmp(o, "--text-field"))
                field = v;
            else if (parse_u32(v, 1, 256, &threads))
                return usage_error("--threads '%s': expected an integer from 1 to 256", v);
        } else if (o[0] == '-') {
            return usage_error("unknown option '%s'", o);
        } else if (!src) {
            src = o;
        } else if (!out) {
            out = o;
        } else {
            return usage_error("ingest takes SRC and OUT");
        }
    }
    if (!src || !out)
        return usage_error("ingest needs SRC (a root of JSONL sub-datasets) and OUT");
    if (mkdir(out, 0755) != 0 && errno != EEXIST)
        return cli_error(CMD, "%s: cannot create: %s", out, strerror(errno));
    struct stat st;
    if (stat(out, &st) != 0 || !S_ISDIR(st.st_mode))
        return cli_error(CMD, "%s: not a folder", out);
    tio_data_tokenizer *tok;
    int rc = tio_data_tokenizer_open(spec, tokdir, &tok);
    if (rc)
        return cli_lib_error(CMD, rc);
    if (threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n < 1 ? 1 : n > 256 ? 256 : (uint32_t)n;
    }
    tio_dataset_options o;
    tio_dataset_options_default(&o);
    o.tokenizer = tok;
    o.text_field = field;
    o.jsonl_errors = skip ? TIO_DATA_JSONL_SKIP : TIO_DATA_JSONL_ERROR;
    o.tokenizer_threads = 1; /* files run in parallel instead */
    tio_dataset *ds;
    if ((rc = open_dataset(src, &o, &ds)) != 0) {
        tio_data_tokenizer_close(tok);
        return rc;
    }
    ingest_ctx c = {.ds = ds, .out = out, .dtype = tok->vocab_size && tok->vocab_size <= 65536 ? 8 : 4,
                    .progress = isatty(STDERR_FILENO), .t0 = now_s()};
    pthread_mutex_init(&c.lock, NULL);
    uint32_t total = 0;
    for (uint32_t s = 0; s < tio_dataset_n_subdatasets(ds); s++) {
        tio_data_subdataset_info in;
        tio_dataset_info(ds, s, &in);
        total += in.n_files;
    }
    c.jobs = calloc(total ? total : 1, sizeof *c.jobs);
    c.docs = calloc(total ? total : 1, sizeof *c.docs);
    c.tokens = calloc(total ? total : 1, sizeof *c.tokens);
    int status = 0;
    if (!c.jobs || !c.docs || !c.tokens) {
        status = cli_error(CMD, "out of memory");
        goto done;
    }
    for (uint32_t s = 0; s < tio_dataset_n_subdatasets(ds); s++) {
        tio_data_subdataset_info in;
        tio_dataset_info(ds, s, &in);
        for (uint32_t f = 0; f < in.n_files; f++) {
            const char *rel = tio_dataset_file_path(ds, s, f);
            if (!strstr(rel, ".jsonl")) {
                status = cli_error(CMD, "%s/%s: not JSONL: ingest reads text (.jsonl, .jsonl.gz, "
                                   ".jsonl.zst)", src, rel);
                goto done;
            }
            c.jobs[c.n_jobs][0] = s;
            c.jobs[c.n_jobs][1] = f;
            c.n_jobs++;
        }
    }
    pthread_t th[256];
    uint32_t started = 0;
    if (threads > c.n_jobs)
        threads = c.n_jobs ? c.n_jobs : 1;
    while (started + 1 < threads && pthread_create(&th[started], NULL, ingest_worker, &c) == 0)
        started++;
    ingest_worker(&c);
    for (uint32_t i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    if (c.progress)
        fprintf(stderr, "\r\033[K");
    if (c.rc) {
        status = cli_error(CMD, "%s", c.msg);
        goto done;
    }
    if ((status = write_counts(&c)) != 0)
        goto done;
    double dt = now_s() - c.t0;
    printf("ingested %u files: %llu documents, %llu tokens (%s, %s) in %.2f s into %s\n", c.n_jobs,
           (unsigned long long)c.all_docs, (unsigned long long)c.all_tokens, tok->name,
           c.dtype == 8 ? "uint16" : "int32", dt, out);
done:
    free(c.jobs);
    free(c.docs);
    free(c.tokens);
    pthread_mutex_destroy(&c.lock);
    tio_dataset_destroy(ds);
    tio_data_tokenizer_close(tok);
    return status;
}

/* ---- sample -------------------------------------------------------------- */

static int read_state(const char *path, void **buf, size_t *len)
{
    int rc = tio_loader_state_read(path, buf, len);
    return rc ? cli_lib_error(CMD, rc) : 0;
}

/* The first samples of one rank (provenance, optionally ids), optionally
 * resumed from a state file and saving the state after them. */
static int cmd_sample(int argc, char **argv)
{
    const char *root = NULL, *resume = NULL, *save = NULL;
    tio_loader_options o;
    tio_loader_options_default(&o);
    o.seq_len = 64;
    uint32_t count = 4, seed = 0;
    bool ids = false;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint32_t *num = !strcmp(a, "--seq-len") ? &o.seq_len : !strcmp(a, "--count") ? &count
                      : !strcmp(a, "--seed") ? &seed : !strcmp(a, "--rank") ? &o.rank
                      : !strcmp(a, "--world-size") ? &o.world_size
                      : !strcmp(a, "--logical-shards") ? &o.logical_shards
                      : !strcmp(a, "--eos-id") ? &o.eos_id : NULL;
        if (!strcmp(a, "--ids")) {
            ids = true;
        } else if (num || !strcmp(a, "--resume") || !strcmp(a, "--save")) {
            if (!v)
                return usage_error("%s needs a value", a);
            i++;
            if (!strcmp(a, "--resume"))
                resume = v;
            else if (!strcmp(a, "--save"))
                save = v;
            else if (parse_u32(v, 0, UINT32_MAX - 2, num))
                return usage_error("%s '%s': expected an integer", a, v);
        } else if (a[0] == '-') {
            return usage_error("unknown option '%s'", a);
        } else if (root) {
            return usage_error("sample takes one DIR");
        } else {
            root = a;
        }
    }
    if (!root)
        return usage_error("sample needs a dataset root DIR");
    o.seed = seed;
    tio_dataset *ds;
    int rc = open_dataset(root, NULL, &ds);
    if (rc)
        return rc;
    void *st = NULL;
    size_t st_len = 0;
    if (resume && (rc = read_state(resume, &st, &st_len)) != 0) {
        tio_dataset_destroy(ds);
        return rc;
    }
    tio_loader *ld;
    const void *states[1] = {st};
    rc = tio_loader_create(ds, &o, states, &st_len, resume ? 1 : 0, &ld);
    free(st);
    if (rc) {
        tio_dataset_destroy(ds);
        return resume ? cli_error(CMD, "%s: %s", resume, tio_last_error()) : cli_lib_error(CMD, rc);
    }
    int status = 0;
    for (uint32_t k = 0; k < count && !status; k++) {
        const tio_data_sample *s;
        if ((rc = tio_loader_next(ld, &s)) != 0) {
            status = cli_lib_error(CMD, rc);
            break;
        }
        printf("sample %llu:", (unsigned long long)s->index);
        for (uint32_t i = 0; i < s->n_spans; i++) {
            const tio_data_span *p = &s->spans[i];
            printf(" %s#%llu[%u+%u]e%u", tio_dataset_file_path(ds, p->subdataset, p->file),
                   (unsigned long long)p->doc, p->offset, p->length, p->epoch);
        }
        putchar('\n');
        for (uint32_t i = 0; ids && i <= s->seq_len; i++)
            printf("%u%c", s->tokens[i], i == s->seq_len ? '\n' : ' ');
    }
    if (!status && save && (rc = tio_loader_save(ld, save)) != 0)
        status = cli_lib_error(CMD, rc);
    tio_loader_destroy(ld);
    tio_dataset_destroy(ds);
    return status;
}

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
    double t0 = now_s(), t = t0;
    volatile uint8_t sink = 0;
    while (t - t0 < seconds) {
        for (uint32_t i = 0; i < n && t - t0 < seconds; i++)
            for (size_t at = 0; at < m[i].len; at += chunk) {
                size_t k = m[i].len - at < chunk ? m[i].len - at : chunk;
                memcpy(dst, m[i].map + at, k);
                sink ^= dst[k / 2];
                bytes += k;
                if ((bytes & ((1u << 26) - 1)) < k)
                    t = now_s();
            }
        t = now_s();
    }
    (void)sink;
    return (double)bytes / (t - t0);
}

static int cmd_bench_loader(int argc, char **argv)
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
            if (!strcmp(o, "--seq-len") && parse_u32(v, 1, 1u << 24, &seq_len))
                return usage_error("--seq-len '%s': expected an integer from 1 to 16777216", v);
            if (!strcmp(o, "--seconds") && (!cli_parse_positive(v, &seconds) || seconds > 3600))
                return usage_error("--seconds '%s': expected a positive number up to 3600", v);
            if (!strcmp(o, "--prefetch") && parse_u32(v, 0, 4096, &prefetch))
                return usage_error("--prefetch '%s': expected an integer from 0 to 4096", v);
            if (!strcmp(o, "--fill-threads") && parse_u32(v, 0, 64, &fill))
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
    int rc = open_dataset(root, NULL, &ds);
    if (rc)
        return rc;
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
        double t0 = now_s(), t = t0;
        while (t - t0 < seconds) {
            const tio_data_sample *s;
            if ((rc = tio_loader_next(ld, &s)) != 0) {
                status = cli_lib_error(CMD, rc);
                goto done;
            }
            check += s->tokens[samples % (seq_len + 1)] + s->position_ids[seq_len - 1];
            samples++;
            if ((samples & 15) == 0)
                t = now_s();
        }
        t = now_s();
        double rate = (double)samples * (seq_len + 1) / (t - t0);
        best = rate > best ? rate : best;
        samples_total += samples;
        double m_rate = memcpy_rate(m, n_maps, chunk, seconds, dst) / bytes_per_token;
        mem = m_rate > mem ? m_rate : mem;
    }
    if (json) {
        printf("{\"dataset\": ");
        json_string(stdout, root);
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
               "ratio   %12.3f  (target >= 0.25)\n", best / 1e6, best / (seq_len + 1), seq_len,
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

int cmd_data(int argc, char **argv)
{
    if (argc < 2)
        return usage_error("needs a subcommand: inspect, ingest, sample or bench");
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(stdout);
        return 0;
    }
    for (int i = 2; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        }
    if (!strcmp(argv[1], "inspect"))
        return cmd_inspect(argc, argv);
    if (!strcmp(argv[1], "ingest"))
        return cmd_ingest(argc, argv);
    if (!strcmp(argv[1], "sample"))
        return cmd_sample(argc, argv);
    if (!strcmp(argv[1], "bench"))
        return cmd_bench_loader(argc, argv);
    return usage_error("unknown subcommand '%s': expected inspect, ingest, sample or bench",
                       argv[1]);
}
