/*
 * data/window.c — decoding one window of a text or Parquet file into token
 * ids: the documents are handed out in chunks of TIO_WINDOW_CHUNK to up to
 * `tokenizer_threads` threads (the calling thread among them), each chunk's
 * ids kept in one array.  A document whose source reports TIO_EPARSE (a
 * malformed JSONL line, a null Parquet row) keeps that error and its
 * message, reported when the document is read.  The ids do not depend on
 * the thread count.
 *
 * Why windows: a whole JSONL file decompressed and tokenized at once takes
 * memory in proportion to its decompressed size (a 44 KB .zst can hold
 * 500 MB); a window takes about TIO_JSONL_WINDOW_BYTES of text, or one
 * Parquet row group.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"
#include "data/data_internal.h"

void tio_window_ids_free(tio_window_ids *w)
{
    uint64_t chunks = (w->count + TIO_WINDOW_CHUNK - 1) / TIO_WINDOW_CHUNK;
    if (w->chunk_ids)
        for (uint64_t c = 0; c < chunks; c++)
            free(w->chunk_ids[c]);
    if (w->doc_msg)
        for (uint64_t i = 0; i < w->count; i++)
            free(w->doc_msg[i]);
    free(w->chunk_ids);
    free(w->id_off);
    free(w->id_len);
    free(w->doc_rc);
    free(w->doc_msg);
    memset(w, 0, sizeof *w);
}

/* Work shared by the threads decoding one window. */
typedef struct {
    tio_dataset *ds;
    tio_data_file *f;
    const tio_window_source *src;
    tio_window_ids *w;
    uint64_t next_chunk, n_chunks; /* atomic */
    int rc;                        /* first error (atomic: 0 until set) */
    char msg[1024];
    pthread_mutex_t lock;
} fill_job;

/* Room for `want` more ids after `used` in *ids of *cap. */
static int reserve(uint32_t **ids, size_t *cap, size_t used, size_t want, const char *rel)
{
    if (used + want <= *cap)
        return 0;
    size_t nc = *cap * 2 > used + want ? *cap * 2 : used + want;
    uint32_t *p = realloc(*ids, (nc ? nc : 1) * sizeof *p);
    if (!p)
        return tio_fail(-ENOMEM, "%s: out of memory", rel);
    *ids = p;
    *cap = nc;
    return 0;
}

/* A document the source called bad: its error and message are kept. */
static int mark_bad(fill_job *job, uint64_t i, int rc)
{
    tio_window_ids *w = job->w;
    pthread_mutex_lock(&job->lock);
    if (!w->doc_msg)
        w->doc_msg = calloc(w->count, sizeof *w->doc_msg);
    bool ok = w->doc_msg && (w->doc_msg[i] = strdup(tio_last_error())) != NULL;
    pthread_mutex_unlock(&job->lock);
    if (!ok)
        return tio_fail(-ENOMEM, "%s: out of memory", job->f->rel);
    w->doc_rc[i] = rc;
    tio_clear_error();
    return 0;
}

static int encode(fill_job *job, uint64_t i, const char *text, size_t len, uint32_t **ids,
                  size_t *cap, size_t *used)
{
    const tio_data_tokenizer *tok = job->ds->opts.tokenizer;
    for (size_t want = len;;) {
        int rc = reserve(ids, cap, *used, want, job->f->rel);
        if (rc)
            return rc;
        int64_t n = tok->encode(tok->ctx, text, len, *ids + *used, *cap - *used);
        if (n < 0)
            return tio_fail((int)n, "%s: document %llu: tokenizer '%s' failed: %s", job->f->rel,
                            (unsigned long long)(job->w->first + i), tok->name,
                            tio_strerror((int)n));
        if ((size_t)n <= *cap - *used) {
            job->w->id_len[i] = (uint64_t)n;
            *used += (size_t)n;
            return 0;
        }
        want = (size_t)n;
    }
}

static int fill_chunk(fill_job *job, uint64_t c)
{
    tio_window_ids *w = job->w;
    const tio_window_source *src = job->src;
    uint64_t a = c * TIO_WINDOW_CHUNK, b = a + TIO_WINDOW_CHUNK < w->count ? a + TIO_WINDOW_CHUNK
                                                                          : w->count;
    size_t cap = 0, used = 0;
    uint32_t *ids = NULL;
    int rc = 0;
    for (uint64_t i = a; i < b && !rc; i++) {
        w->id_off[i] = used;
        w->id_len[i] = 0;
        if (src->ids) {
            const uint32_t *v;
            uint64_t n;
            if ((rc = src->ids(src->ctx, i, &v, &n)) == 0 &&
                (rc = reserve(&ids, &cap, used, n, job->f->rel)) == 0) {
                memcpy(ids + used, v, n * sizeof *v);
                w->id_len[i] = n;
                used += n;
            }
        } else {
            const char *text;
            size_t len;
            char *owned = NULL;
            if ((rc = src->text(src->ctx, i, &text, &len, &owned)) == 0)
                rc = encode(job, i, text, len, &ids, &cap, &used);
            free(owned);
        }
        if (rc == TIO_EPARSE)
            rc = mark_bad(job, i, rc);
    }
    w->chunk_ids[c] = ids;
    __atomic_fetch_add(&w->bytes, cap * sizeof *ids, __ATOMIC_RELAXED);
    return rc;
}

static void *fill_worker(void *arg)
{
    fill_job *job = arg;
    for (;;) {
        uint64_t c = __atomic_fetch_add(&job->next_chunk, 1, __ATOMIC_RELAXED);
        if (c >= job->n_chunks || __atomic_load_n(&job->rc, __ATOMIC_RELAXED))
            break;
        int rc = fill_chunk(job, c);
        if (rc) {
            pthread_mutex_lock(&job->lock);
            if (!job->rc) {
                snprintf(job->msg, sizeof job->msg, "%s", tio_last_error());
                __atomic_store_n(&job->rc, rc, __ATOMIC_RELAXED);
            }
            pthread_mutex_unlock(&job->lock);
            break;
        }
    }
    return NULL;
}

static unsigned fill_threads(const tio_dataset *ds, uint64_t n_chunks)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    unsigned t = ds->opts.tokenizer_threads;
    if (t == 0)
        t = cpus < 1 ? 1 : cpus > 4 ? 4 : (unsigned)cpus;
    if (t > 64)
        t = 64;
    return n_chunks < t ? (unsigned)(n_chunks ? n_chunks : 1) : t;
}

int tio_window_fill(tio_dataset *ds, tio_data_file *f, const tio_window_source *src,
                    uint64_t first, uint64_t count, tio_window_ids *w)
{
    memset(w, 0, sizeof *w);
    w->first = first;
    w->count = count;
    uint64_t n = count ? count : 1, chunks = (count + TIO_WINDOW_CHUNK - 1) / TIO_WINDOW_CHUNK;
    w->chunk_ids = calloc(chunks ? chunks : 1, sizeof *w->chunk_ids);
    w->id_off = malloc(n * sizeof *w->id_off);
    w->id_len = malloc(n * sizeof *w->id_len);
    w->doc_rc = calloc(n, sizeof *w->doc_rc);
    w->bytes = n * (sizeof *w->id_off + sizeof *w->id_len + sizeof *w->doc_rc);
    if (!w->chunk_ids || !w->id_off || !w->id_len || !w->doc_rc) {
        tio_window_ids_free(w);
        return tio_fail(-ENOMEM, "%s: out of memory", f->rel);
    }
    fill_job job = {.ds = ds, .f = f, .src = src, .w = w, .n_chunks = chunks};
    pthread_mutex_init(&job.lock, NULL);
    pthread_t th[64];
    unsigned want = src->ids ? 1 : fill_threads(ds, chunks), started = 0;
    while (started + 1 < want && pthread_create(&th[started], NULL, fill_worker, &job) == 0)
        started++;
    fill_worker(&job);
    for (unsigned i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    pthread_mutex_destroy(&job.lock);
    if (job.rc) {
        tio_window_ids_free(w);
        return tio_fail(job.rc, "%s", job.msg);
    }
    return 0;
}
