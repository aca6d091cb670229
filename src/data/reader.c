/*
 * data/reader.c — per-thread readers: any document's length and tokens,
 * through the format's operations.  Token files are read in place; windowed
 * files (JSONL, Parquet) through a cache of decoded windows, least recently
 * used first out, holding at most `cache_bytes` (at least the window in use).
 *
 * A document that failed to decode (a malformed JSONL line, a null Parquet
 * row) reports its error, or, with TIO_DATA_JSONL_SKIP, reads as an empty
 * document and is counted once in the sub-dataset's lines_skipped.
 */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "data/data_internal.h"

enum { CACHE_MAX = 64 };

typedef struct {
    bool used;
    uint32_t sub, file, window;
    uint64_t tick;
    tio_window_ids ids;
} cache_entry;

struct tio_data_reader {
    tio_dataset *ds;
    cache_entry cache[CACHE_MAX];
    uint64_t tick, cache_bytes;
    /* where the last window load stopped, for one file (the format's) */
    void *cursor;
    uint32_t cursor_sub, cursor_file;
    void (*cursor_free)(void *cursor);
    /* the last document whose length was asked (asked again to read it) */
    bool len_valid;
    uint32_t len_sub, len_file;
    uint64_t len_doc, len_n;
    /* the bad document last counted as skipped (not counted twice in a row) */
    bool skip_valid;
    uint32_t skip_sub, skip_file;
    uint64_t skip_doc;
};

static void bus_guard_init(void);

int tio_data_reader_create(tio_dataset *ds, tio_data_reader **out)
{
    bus_guard_init();
    *out = calloc(1, sizeof **out);
    if (!*out)
        return tio_fail(-ENOMEM, "out of memory");
    (*out)->ds = ds;
    return 0;
}

void tio_data_reader_destroy(tio_data_reader *r)
{
    if (!r)
        return;
    for (int i = 0; i < CACHE_MAX; i++)
        tio_window_ids_free(&r->cache[i].ids);
    if (r->cursor)
        r->cursor_free(r->cursor);
    free(r);
}

uint32_t tio_data_window_of(const tio_data_file *f, uint64_t doc)
{
    uint32_t lo = 0, hi = f->n_windows - 1;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo + 1) / 2;
        if (f->windows[mid].first <= doc)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* Count a window's empty documents into its file once (any reader). */
static void count_empty(tio_data_file *f, uint32_t wi, const tio_window_ids *w)
{
    if (!f->window_empty || __atomic_load_n(&f->window_empty[wi], __ATOMIC_RELAXED))
        return;
    uint64_t empty = 0;
    for (uint64_t i = 0; i < w->count; i++)
        empty += w->id_len[i] == 0 && w->doc_rc[i] == 0;
    uint64_t zero = 0;
    __atomic_compare_exchange_n(&f->window_empty[wi], &zero, empty + 1, false, __ATOMIC_RELAXED,
                                __ATOMIC_RELAXED);
}

/* The cached window holding a document, loaded (evicting others) if need be. */
static int window_get(tio_data_reader *r, uint32_t sub, uint32_t file, tio_data_file *f,
                      uint64_t doc, const tio_window_ids **out)
{
    uint32_t wi = tio_data_window_of(f, doc);
    for (int i = 0; i < CACHE_MAX; i++) {
        cache_entry *e = &r->cache[i];
        if (e->used && e->sub == sub && e->file == file && e->window == wi) {
            e->tick = ++r->tick;
            *out = &e->ids;
            return 0;
        }
    }
    const tio_data_format *fmt = tio_data_format_of(f->format);
    if (r->cursor && (r->cursor_sub != sub || r->cursor_file != file)) {
        r->cursor_free(r->cursor);
        r->cursor = NULL;
    }
    r->cursor_sub = sub;
    r->cursor_file = file;
    r->cursor_free = fmt->cursor_free;
    tio_window_ids w;
    int rc = fmt->window_load(r->ds, f, wi, &w, &r->cursor);
    if (rc)
        return rc;
    count_empty(f, wi, &w);
    uint64_t budget = r->ds->opts.cache_bytes ? r->ds->opts.cache_bytes : (256u << 20);
    /* evict least recently used windows until the new one fits (or none is
     * left) and a slot is free */
    for (;;) {
        cache_entry *old = NULL, *free_slot = NULL;
        for (int i = 0; i < CACHE_MAX; i++) {
            cache_entry *e = &r->cache[i];
            if (!e->used)
                free_slot = free_slot ? free_slot : e;
            else if (!old || e->tick < old->tick)
                old = e;
        }
        if (free_slot && (!old || r->cache_bytes + w.bytes <= budget)) {
            *free_slot = (cache_entry){true, sub, file, wi, ++r->tick, w};
            r->cache_bytes += w.bytes;
            *out = &free_slot->ids;
            return 0;
        }
        r->cache_bytes -= old->ids.bytes;
        tio_window_ids_free(&old->ids);
        old->used = false;
    }
}

/* A windowed document's ids (*ids NULL when it has none). */
static int window_doc(tio_data_reader *r, uint32_t sub, uint32_t file, tio_data_file *f,
                      uint64_t doc, const uint32_t **ids, uint64_t *n)
{
    const tio_window_ids *w;
    int rc = window_get(r, sub, file, f, doc, &w);
    if (rc)
        return rc;
    tio_dataset *ds = r->ds;
    uint64_t i = doc - w->first;
    if (w->doc_rc[i]) {
        if (ds->opts.jsonl_errors != TIO_DATA_JSONL_SKIP)
            return tio_fail(w->doc_rc[i], "%s", w->doc_msg[i]);
        if (!(r->skip_valid && r->skip_sub == sub && r->skip_file == file && r->skip_doc == doc)) {
            __atomic_fetch_add(&ds->subs[sub].lines_skipped, 1, __ATOMIC_RELAXED);
            tio_log(TIO_LOG_WARN, "skipped: %s", w->doc_msg[i]);
            r->skip_valid = true;
            r->skip_sub = sub;
            r->skip_file = file;
            r->skip_doc = doc;
        }
        *ids = NULL;
        *n = 0;
        return 0;
    }
    uint64_t c = i / TIO_WINDOW_CHUNK;
    *ids = w->chunk_ids[c] ? w->chunk_ids[c] + w->id_off[i] : NULL;
    *n = w->id_len[i];
    return 0;
}

/* ---- files that shrink while mapped ---------------------------------------
 *
 * Token files are mapped.  A file truncated after it was opened (rewritten
 * in place by another job) makes a read of a page past its new end raise
 * SIGBUS, which would kill the process.  The readers below run under a
 * per-thread guard: the SIGBUS handler, installed once, jumps back to the
 * guarded read, which fails with -EIO naming the file.  A SIGBUS outside a
 * guard goes to the handler installed before ours (or takes the default
 * action), as if ours were not there.  The handler is (re)installed when a
 * reader is created. */
static _Thread_local sigjmp_buf *bus_jmp;
static struct sigaction bus_previous;

static void bus_handler(int sig, siginfo_t *info, void *ctx)
{
    if (bus_jmp)
        siglongjmp(*bus_jmp, 1);
    if (bus_previous.sa_flags & SA_SIGINFO) {
        bus_previous.sa_sigaction(sig, info, ctx);
    } else if (bus_previous.sa_handler != SIG_DFL && bus_previous.sa_handler != SIG_IGN) {
        bus_previous.sa_handler(sig);
    } else {
        /* the faulting access runs again and takes the default action */
        sigaction(SIGBUS, &bus_previous, NULL);
    }
}

/* Install the handler unless it is the current one (a library or a test
 * harness may have put its own in since: ours then hands on to that one). */
static void bus_guard_init(void)
{
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&lock);
    struct sigaction cur;
    if (sigaction(SIGBUS, NULL, &cur) == 0 &&
        !((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == bus_handler)) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = bus_handler;
        /* SA_NODEFER: leaving the handler by siglongjmp (no mask saved)
         * must not leave SIGBUS blocked in the thread */
        sa.sa_flags = SA_SIGINFO | SA_NODEFER;
        sigemptyset(&sa.sa_mask);
        if (sigaction(SIGBUS, &sa, &bus_previous) != 0)
            tio_log(TIO_LOG_WARN, "cannot install the SIGBUS handler: a token file that shrinks "
                    "while mapped will stop the process");
    }
    pthread_mutex_unlock(&lock);
}

static int shrunk(const tio_dataset *ds, uint32_t sub, uint32_t file)
{
    return tio_fail(-EIO, "%s: the file shrank while mapped (truncated or rewritten after the "
                    "dataset was opened)", ds->subs[sub].files[file].rel);
}

static int check_doc(tio_data_reader *r, uint32_t sub, uint32_t file, uint64_t doc,
                     tio_data_file **out)
{
    return tio_data_doc_file(r->ds, sub, file, doc, out);
}

static int doc_len(tio_data_reader *r, uint32_t sub, uint32_t file, uint64_t doc, uint64_t *n)
{
    tio_data_file *f = NULL;
    int rc = check_doc(r, sub, file, doc, &f);
    if (rc)
        return rc;
    const tio_data_format *fmt = tio_data_format_of(f->format);
    if (fmt->doc_len) {
        *n = fmt->doc_len(f, doc);
        return 0;
    }
    const uint32_t *ids;
    return window_doc(r, sub, file, f, doc, &ids, n);
}

int tio_data_doc_len(tio_data_reader *r, uint32_t sub, uint32_t file, uint64_t doc, uint64_t *n)
{
    if (r->len_valid && r->len_doc == doc && r->len_file == file && r->len_sub == sub) {
        *n = r->len_n;
        return 0;
    }
    sigjmp_buf jb, *outer = bus_jmp;
    if (sigsetjmp(jb, 0)) {
        bus_jmp = outer;
        r->len_valid = false;
        return shrunk(r->ds, sub, file);
    }
    bus_jmp = &jb;
    int rc = doc_len(r, sub, file, doc, n);
    bus_jmp = outer;
    r->len_valid = rc == 0;
    r->len_sub = sub;
    r->len_file = file;
    r->len_doc = doc;
    r->len_n = *n;
    return rc;
}

static void doc_prefetch(tio_data_reader *r, uint32_t sub, uint32_t file, uint64_t doc,
                         uint64_t off)
{
    tio_dataset *ds = r->ds;
    if (sub >= ds->n_subs || file >= ds->subs[sub].n_files)
        return;
    tio_data_file *f = &ds->subs[sub].files[file];
    if (!__atomic_load_n(&f->opened, __ATOMIC_ACQUIRE) || f->open_rc || doc >= f->n_docs)
        return;
    const tio_data_format *fmt = tio_data_format_of(f->format);
    const uint8_t *p = fmt->doc_addr ? fmt->doc_addr(f, doc, off) : NULL;
    if (!p)
        return;
    for (int k = 0; k < 8; k++)
        if (p + 64 * k < f->map + f->map_len)
            __builtin_prefetch(p + 64 * k);
}

void tio_data_doc_prefetch(tio_data_reader *r, uint32_t sub, uint32_t file, uint64_t doc,
                           uint64_t off)
{
    sigjmp_buf jb, *outer = bus_jmp;
    if (sigsetjmp(jb, 0) == 0) { /* a shrunk file: the read that follows says so */
        bus_jmp = &jb;
        doc_prefetch(r, sub, file, doc, off);
    }
    bus_jmp = outer;
}

static int doc_read(tio_data_reader *r, uint32_t sub, uint32_t file, uint64_t doc, uint64_t off,
                    uint64_t n, uint32_t *dst)
{
    tio_data_file *f = NULL;
    int rc = check_doc(r, sub, file, doc, &f);
    if (rc || n == 0)
        return rc;
    const tio_data_format *fmt = tio_data_format_of(f->format);
    if (fmt->doc_read)
        return fmt->doc_read(f, doc, off, n, dst);
    const uint32_t *ids;
    uint64_t len;
    if ((rc = window_doc(r, sub, file, f, doc, &ids, &len)) != 0)
        return rc;
    if (off + n > len)
        return tio_fail(-EINVAL, "%s: document %llu has %llu tokens, asked for [%llu, %llu)",
                        f->rel, (unsigned long long)doc, (unsigned long long)len,
                        (unsigned long long)off, (unsigned long long)(off + n));
    memcpy(dst, ids + off, n * sizeof *dst);
    return 0;
}

int tio_data_doc_read(tio_data_reader *r, uint32_t sub, uint32_t file, uint64_t doc, uint64_t off,
                      uint64_t n, uint32_t *dst)
{
    sigjmp_buf jb, *outer = bus_jmp;
    if (sigsetjmp(jb, 0)) {
        bus_jmp = outer;
        return shrunk(r->ds, sub, file);
    }
    bus_jmp = &jb;
    int rc = doc_read(r, sub, file, doc, off, n, dst);
    bus_jmp = outer;
    return rc;
}
