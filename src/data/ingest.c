/*
 * data/ingest.c — writing token files: the Megatron MMIDIDX v1 writer and
 * tio_data_ingest, which tokenizes a root of text sub-datasets into one
 * .bin/.idx pair per input file plus counts.csv, several files at once.
 *
 * The writer produces exactly what megatron-core's IndexedDatasetBuilder
 * writes for documents of one sequence each (megatron/core/datasets/
 * indexed_dataset.py, _IndexWriter): the magic "MMIDIDX\0\0", u64 version 1,
 * u8 dtype, u64 sequence count, u64 document count + 1, int32 lengths,
 * int64 byte pointers, int64 document indices.  So Megatron reads the
 * output, and so does tio_mmidx_parse.  Both files and counts.csv are
 * written to temporaries and renamed into place when complete: an ingest
 * that fails or is killed never leaves a half-written pair under the final
 * names.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#include "common/util.h"
#include "data/data_internal.h"

/* ---- the .bin/.idx writer ------------------------------------------------- */

struct tio_mmidx_writer {
    char *prefix;
    tio_atomic_file bin;
    uint8_t dtype;
    int width;
    int32_t *lens;
    uint64_t n, cap, tokens;
};

int tio_mmidx_writer_create(const char *prefix, uint8_t dtype, tio_mmidx_writer **out)
{
    *out = NULL;
    if (dtype != 8 && dtype != 4)
        return tio_fail(-EINVAL, "%s: dtype code %u: the writer writes 8 (uint16) or 4 (int32)",
                        prefix, dtype);
    tio_mmidx_writer *w = calloc(1, sizeof *w);
    size_t n = strlen(prefix) + 8;
    char *bin = malloc(n);
    if (!w || !bin || !(w->prefix = strdup(prefix))) {
        free(w);
        free(bin);
        return tio_fail(-ENOMEM, "%s: out of memory", prefix);
    }
    snprintf(bin, n, "%s.bin", prefix);
    int rc = tio_atomic_open(&w->bin, bin);
    free(bin);
    if (rc) {
        free(w->prefix);
        free(w);
        return rc;
    }
    w->dtype = dtype;
    w->width = dtype == 8 ? 2 : 4;
    *out = w;
    return 0;
}

int tio_mmidx_writer_add(tio_mmidx_writer *w, const uint32_t *ids, uint64_t n)
{
    if (n > INT32_MAX)
        return tio_fail(-EOVERFLOW, "%s.bin: a document of %llu tokens (at most 2^31 - 1)",
                        w->prefix, (unsigned long long)n);
    if (w->n == w->cap) {
        uint64_t nc = w->cap ? w->cap * 2 : 1024;
        int32_t *p = realloc(w->lens, nc * sizeof *p);
        if (!p)
            return tio_fail(-ENOMEM, "%s.idx: out of memory", w->prefix);
        w->lens = p;
        w->cap = nc;
    }
    uint32_t max_id = w->width == 2 ? UINT16_MAX : INT32_MAX;
    for (uint64_t i = 0; i < n; i++)
        if (ids[i] > max_id)
            return tio_fail(-ERANGE, "%s.bin: token id %u does not fit its dtype (%s)", w->prefix,
                            ids[i], w->width == 2 ? "uint16" : "int32");
    if (w->width == 2) {
        uint16_t buf[4096];
        for (uint64_t i = 0; i < n;) {
            size_t k = 0;
            for (; k < 4096 && i < n; k++, i++)
                buf[k] = (uint16_t)ids[i];
            if (fwrite(buf, 2, k, w->bin.f) != k)
                return tio_fail(-EIO, "%s.bin: write failed", w->prefix);
        }
    } else if (n && fwrite(ids, 4, n, w->bin.f) != n) {
        return tio_fail(-EIO, "%s.bin: write failed", w->prefix);
    }
    w->lens[w->n++] = (int32_t)n;
    w->tokens += n;
    return 0;
}

void tio_mmidx_writer_counts(const tio_mmidx_writer *w, uint64_t *docs, uint64_t *tokens)
{
    *docs = w->n;
    *tokens = w->tokens;
}

static int write_idx(tio_mmidx_writer *w)
{
    size_t n = strlen(w->prefix) + 8;
    char *path = malloc(n);
    if (!path)
        return tio_fail(-ENOMEM, "%s.idx: out of memory", w->prefix);
    snprintf(path, n, "%s.idx", w->prefix);
    tio_atomic_file af;
    int rc = tio_atomic_open(&af, path);
    free(path);
    if (rc)
        return rc;
    uint64_t version = 1, seqs = w->n, docs = w->n + 1;
    fwrite("MMIDIDX\0\0", 1, 9, af.f);
    fwrite(&version, 8, 1, af.f);
    fwrite(&w->dtype, 1, 1, af.f);
    fwrite(&seqs, 8, 1, af.f);
    fwrite(&docs, 8, 1, af.f);
    if (seqs)
        fwrite(w->lens, 4, seqs, af.f);
    int64_t at = 0;
    for (uint64_t i = 0; i < seqs; i++) {
        fwrite(&at, 8, 1, af.f);
        at += (int64_t)w->lens[i] * w->width;
    }
    for (uint64_t i = 0; i <= seqs; i++) {
        int64_t d = (int64_t)i;
        fwrite(&d, 8, 1, af.f);
    }
    return tio_atomic_commit(&af); /* a short write shows in its fflush */
}

int tio_mmidx_writer_finish(tio_mmidx_writer *w)
{
    if (!w->bin.f)
        return tio_fail(TIO_ESTATE, "%s: writer already finished", w->prefix);
    int rc = tio_atomic_commit(&w->bin);
    return rc ? rc : write_idx(w);
}

void tio_mmidx_writer_destroy(tio_mmidx_writer *w)
{
    if (!w)
        return;
    if (w->bin.f)
        tio_atomic_abort(&w->bin);
    free(w->lens);
    free(w->prefix);
    free(w);
}

/* ---- ingest ----------------------------------------------------------------- */

void tio_data_ingest_options_default(tio_data_ingest_options *opts)
{
    memset(opts, 0, sizeof *opts);
    opts->jsonl_errors = TIO_DATA_JSONL_ERROR;
}

typedef struct {
    tio_dataset *ds;
    const char *out;
    const tio_data_ingest_options *opts;
    uint8_t dtype;
    uint32_t n_jobs, next, done; /* files; next to take; finished (under lock) */
    uint32_t (*jobs)[2];         /* sub, file */
    uint64_t *docs, *tokens;     /* per job, when done */
    uint64_t all_docs, all_tokens;
    uint64_t last_progress_ns;
    pthread_mutex_t lock;
    int rc;
    char msg[1024];
} ingest_job;

typedef struct {
    ingest_job *job;
    tio_mmidx_writer *w;
} file_writer;

static void report(ingest_job *j)
{
    if (j->opts->progress)
        j->opts->progress(j->opts->progress_ctx, j->done, j->n_jobs, j->all_docs, j->all_tokens);
}

static int write_doc(void *arg, uint64_t doc, const uint32_t *ids, uint64_t n)
{
    file_writer *fw = arg;
    ingest_job *j = fw->job;
    (void)doc;
    int rc = tio_mmidx_writer_add(fw->w, ids, n);
    if (rc)
        return rc;
    pthread_mutex_lock(&j->lock);
    j->all_tokens += n;
    j->all_docs++;
    if (j->opts->progress && (j->all_docs & 255) == 0) {
        uint64_t t = tio_now_ns();
        if (t - j->last_progress_ns >= 250000000ull) {
            j->last_progress_ns = t;
            report(j);
        }
    }
    pthread_mutex_unlock(&j->lock);
    return 0;
}

/* Create the folders above `path` (it is modified and restored). */
static int make_parents(char *path)
{
    for (char *p = path + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            int e = mkdir(path, 0755) != 0 && errno != EEXIST ? errno : 0;
            if (e) {
                int rc = tio_fail(-e, "%s: cannot create: %s", path, strerror(e));
                *p = '/';
                return rc;
            }
            *p = '/';
        }
    return 0;
}

/* The relative output prefix of an input: its text extension cut. */
static void out_prefix(const char *rel, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s", rel);
    static const char *const ext[] = {".jsonl.gz", ".jsonl.zst", ".jsonl", ".parquet"};
    size_t n = strlen(buf);
    for (size_t i = 0; i < sizeof ext / sizeof ext[0]; i++) {
        size_t e = strlen(ext[i]);
        if (n > e && !strcmp(buf + n - e, ext[i])) {
            buf[n - e] = '\0';
            return;
        }
    }
}

static int ingest_file(ingest_job *j, uint32_t k)
{
    uint32_t sub = j->jobs[k][0], file = j->jobs[k][1];
    char rel[4096], prefix[8192];
    out_prefix(tio_dataset_file_path(j->ds, sub, file), rel, sizeof rel);
    snprintf(prefix, sizeof prefix, "%s/%s", j->out, rel);
    int rc = make_parents(prefix);
    file_writer fw = {j, NULL};
    if (!rc)
        rc = tio_mmidx_writer_create(prefix, j->dtype, &fw.w);
    if (!rc)
        rc = tio_dataset_scan_file(j->ds, sub, file, write_doc, &fw);
    if (!rc)
        rc = tio_mmidx_writer_finish(fw.w);
    if (fw.w)
        tio_mmidx_writer_counts(fw.w, &j->docs[k], &j->tokens[k]);
    tio_mmidx_writer_destroy(fw.w);
    return rc;
}

static void *ingest_worker(void *arg)
{
    ingest_job *j = arg;
    for (;;) {
        pthread_mutex_lock(&j->lock);
        if (j->rc || j->next == j->n_jobs) {
            pthread_mutex_unlock(&j->lock);
            return NULL;
        }
        uint32_t k = j->next++;
        pthread_mutex_unlock(&j->lock);
        int rc = ingest_file(j, k);
        pthread_mutex_lock(&j->lock);
        if (rc && !j->rc) {
            j->rc = rc;
            snprintf(j->msg, sizeof j->msg, "%s", tio_last_error());
        }
        j->done++;
        if (!j->rc)
            report(j);
        pthread_mutex_unlock(&j->lock);
        if (rc)
            return NULL;
    }
}

/* OUT/counts.csv: "sub/rel.bin,documents,tokens" per output pair. */
static int write_counts(const ingest_job *j)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/counts.csv", j->out);
    tio_atomic_file af;
    int rc = tio_atomic_open(&af, path);
    if (rc)
        return rc;
    fprintf(af.f, "# path,documents,tokens (written by teraio data ingest)\n");
    for (uint32_t k = 0; k < j->n_jobs; k++) {
        char rel[4096];
        out_prefix(tio_dataset_file_path(j->ds, j->jobs[k][0], j->jobs[k][1]), rel, sizeof rel);
        fprintf(af.f, "%s.bin,%llu,%llu\n", rel, (unsigned long long)j->docs[k],
                (unsigned long long)j->tokens[k]);
    }
    return tio_atomic_commit(&af);
}

/* Two inputs that would write one output pair (web/a.jsonl and
 * web/a.parquet both to web/a.bin) are refused, naming both: the second
 * would replace the first's output while counts.csv listed both. */
static const ingest_job *cmp_job_ctx;

static int cmp_out_prefix(const void *a, const void *b)
{
    const ingest_job *j = cmp_job_ctx;
    const uint32_t *x = j->jobs[*(const uint32_t *)a], *y = j->jobs[*(const uint32_t *)b];
    char px[4096], py[4096];
    out_prefix(tio_dataset_file_path(j->ds, x[0], x[1]), px, sizeof px);
    out_prefix(tio_dataset_file_path(j->ds, y[0], y[1]), py, sizeof py);
    return strcmp(px, py);
}

static int check_collisions(const ingest_job *j, const char *src)
{
    if (j->n_jobs < 2)
        return 0;
    uint32_t *order = malloc((size_t)j->n_jobs * sizeof *order);
    if (!order)
        return tio_fail(-ENOMEM, "out of memory");
    for (uint32_t k = 0; k < j->n_jobs; k++)
        order[k] = k;
    cmp_job_ctx = j; /* list_jobs runs on one thread, before the workers */
    qsort(order, j->n_jobs, sizeof *order, cmp_out_prefix);
    int rc = 0;
    for (uint32_t k = 1; k < j->n_jobs && !rc; k++) {
        if (cmp_out_prefix(&order[k - 1], &order[k]) != 0)
            continue;
        const uint32_t *x = j->jobs[order[k - 1]], *y = j->jobs[order[k]];
        char p[4096];
        out_prefix(tio_dataset_file_path(j->ds, x[0], x[1]), p, sizeof p);
        rc = tio_fail(-EEXIST, "%s/%s and %s/%s would both be written to %s.bin: rename one of them",
                      src, tio_dataset_file_path(j->ds, x[0], x[1]), src,
                      tio_dataset_file_path(j->ds, y[0], y[1]), p);
    }
    free(order);
    return rc;
}

/* OUT may not be SRC or inside it: its token files would be read as input
 * the next time (and ingest refuses token files), or doubled. */
static int check_out_outside_src(const char *src, const char *out)
{
    char *rs = realpath(src, NULL), *ro = realpath(out, NULL);
    int rc = 0;
    if (rs && ro) {
        size_t n = strlen(rs);
        if (!strcmp(rs, ro) || (!strncmp(rs, ro, n) && (ro[n] == '/' || (n == 1 && rs[0] == '/'))))
            rc = tio_fail(-EINVAL, "%s: the output folder is the source folder %s or inside it; "
                          "give an OUT outside SRC", out, src);
    }
    free(rs);
    free(ro);
    return rc;
}

static int list_jobs(ingest_job *j, const char *src)
{
    uint32_t total = 0;
    for (uint32_t s = 0; s < j->ds->n_subs; s++)
        total += j->ds->subs[s].n_files;
    j->jobs = calloc(total ? total : 1, sizeof *j->jobs);
    j->docs = calloc(total ? total : 1, sizeof *j->docs);
    j->tokens = calloc(total ? total : 1, sizeof *j->tokens);
    if (!j->jobs || !j->docs || !j->tokens)
        return tio_fail(-ENOMEM, "out of memory");
    for (uint32_t s = 0; s < j->ds->n_subs; s++)
        for (uint32_t f = 0; f < j->ds->subs[s].n_files; f++) {
            tio_data_file *file = &j->ds->subs[s].files[f];
            int rc = tio_data_file_open(j->ds, file);
            if (rc)
                return rc;
            if (!file->text)
                return tio_fail(-EINVAL, "%s/%s: not text: ingest reads JSONL (.jsonl, .jsonl.gz, "
                                ".jsonl.zst) and Parquet text", src, file->rel);
            j->jobs[j->n_jobs][0] = s;
            j->jobs[j->n_jobs][1] = f;
            j->n_jobs++;
        }
    return check_collisions(j, src);
}

int tio_data_ingest(const char *src, const char *out, const tio_data_ingest_options *opts,
                    tio_data_ingest_result *result)
{
    memset(result, 0, sizeof *result);
    tio_data_ingest_options defaults;
    if (!opts) {
        tio_data_ingest_options_default(&defaults);
        opts = &defaults;
    }
    bool made = mkdir(out, 0755) == 0;
    if (!made && errno != EEXIST)
        return tio_fail(-errno, "%s: cannot create: %s", out, strerror(errno));
    struct stat st;
    if (stat(out, &st) != 0 || !S_ISDIR(st.st_mode))
        return tio_fail(-ENOTDIR, "%s: not a folder", out);
    int bad = check_out_outside_src(src, out);
    if (bad) {
        if (made)
            rmdir(out);
        return bad;
    }
    tio_dataset_options o;
    tio_dataset_options_default(&o);
    if (opts->tokenizer)
        o.tokenizer = opts->tokenizer;
    if (opts->text_field)
        o.text_field = opts->text_field;
    o.jsonl_errors = opts->jsonl_errors;
    o.tokenizer_threads = 1; /* files run in parallel instead */
    const tio_data_tokenizer *tok = o.tokenizer;
    ingest_job j = {.out = out, .opts = opts,
                    .dtype = tok->vocab_size && tok->vocab_size <= 65536 ? 8 : 4};
    int rc = tio_dataset_open(src, &o, &j.ds);
    if (rc) {
        if (made)
            rmdir(out);
        return rc;
    }
    pthread_mutex_init(&j.lock, NULL);
    uint32_t threads = opts->threads;
    if (threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n < 1 ? 1 : n > 256 ? 256 : (uint32_t)n;
    }
    if ((rc = list_jobs(&j, src)) == 0) {
        pthread_t th[256];
        uint32_t started = 0;
        if (threads > j.n_jobs)
            threads = j.n_jobs ? j.n_jobs : 1;
        if (threads > 256)
            threads = 256;
        while (started + 1 < threads && pthread_create(&th[started], NULL, ingest_worker, &j) == 0)
            started++;
        ingest_worker(&j);
        for (uint32_t i = 0; i < started; i++)
            pthread_join(th[i], NULL);
        rc = j.rc ? tio_fail(j.rc, "%s", j.msg) : write_counts(&j);
    }
    if (!rc)
        *result = (tio_data_ingest_result){j.n_jobs, j.all_docs, j.all_tokens, j.dtype};
    free(j.jobs);
    free(j.docs);
    free(j.tokens);
    pthread_mutex_destroy(&j.lock);
    tio_dataset_destroy(j.ds);
    if (rc && made)
        rmdir(out); /* the folder this call made, if nothing was written to it */
    return rc;
}
