/*
 * data/parquet.c — the Parquet format: a text column tokenized on the fly,
 * or a column of token-id lists read as is, through libteraio_parquet (a
 * C++ shim over Apache Arrow's libparquet, parquet_shim.cc), loaded with
 * dlopen the first time a Parquet file is opened.
 *
 * Documents are rows; the document count comes from the footer (no scan).
 * A window is a row group, or a slice of rows of one whose column the
 * footer declares larger than TIO_PARQUET_WINDOW_BYTES: a reader decodes a
 * window a batch of rows at a time, and never more than the window's rows,
 * so a row group that decompresses to gigabytes (a compression bomb) costs
 * a window's memory.  What a window really decodes is bounded too (a footer
 * may lie): more than max(cache_bytes, max_line_bytes) is an error naming
 * the file, row group and rows.  A reader's cursor keeps its row group's
 * batch reader, so slices read in order decode the row group once.
 * Without the shim (not built, or its Arrow libraries not found) every
 * Parquet file fails to open with -ENOTSUP naming the reason, and the other
 * formats work as before.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"
#include "data/data_internal.h"
#include "data/parquet_shim.h"
#include "teraio_config.h"

struct tio_parquet_file {
    tio_pq *h;
    char column[128];
};

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static const tio_pq_api *api;
static char why[1024];

#if TIO_HAVE_PARQUET
/* Try one candidate path; true once the shim is loaded. */
static bool try_load(const char *path)
{
    if (access(path, F_OK) != 0)
        return false;
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(why, sizeof why, "%s", dlerror());
        return false;
    }
    const tio_pq_api *(*get)(void) = (const tio_pq_api *(*)(void))dlsym(h, "tio_parquet_shim");
    const tio_pq_api *a = get ? get() : NULL;
    if (!a || a->abi != TIO_PQ_ABI) {
        snprintf(why, sizeof why, "%s: not a teraio Parquet shim of ABI %d", path, TIO_PQ_ABI);
        dlclose(h);
        return false;
    }
    api = a;
    return true;
}
#endif

/* $TERAIO_PARQUET_LIBRARY, else libteraio_parquet.so beside the object this
 * code is in (libteraio.so, or a program linked with the static library
 * under <build>/bin: then <build>/lib). */
static void load(void)
{
#if !TIO_HAVE_PARQUET
    snprintf(why, sizeof why, "built without Parquet (pyarrow's headers and libraries were not "
             "found when libteraio was built: install pyarrow, then rebuild)");
#else
    const char *env = getenv("TERAIO_PARQUET_LIBRARY");
    if (env && *env) {
        if (!try_load(env) && !why[0])
            snprintf(why, sizeof why, "%s: no such file (TERAIO_PARQUET_LIBRARY)", env);
        return;
    }
    Dl_info info;
    char dir[4096] = ".", path[4200];
    if (dladdr((void *)tio_parquet_available, &info) && info.dli_fname) {
        snprintf(dir, sizeof dir, "%s", info.dli_fname);
        char *slash = strrchr(dir, '/');
        if (slash)
            *slash = '\0';
    }
    static const char *const rel[] = {"/libteraio_parquet.so", "/../lib/libteraio_parquet.so"};
    for (size_t i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s%s", dir, rel[i]);
        if (try_load(path))
            return;
    }
    if (!why[0])
        snprintf(why, sizeof why, "libteraio_parquet.so not found beside %s",
                 info.dli_fname ? info.dli_fname : "libteraio");
#endif
}

bool tio_parquet_available(const char **reason)
{
    pthread_once(&load_once, load);
    *reason = api ? "" : why;
    return api != NULL;
}

static int parquet_open(tio_dataset *ds, tio_data_file *f)
{
    const char *reason;
    if (!tio_parquet_available(&reason))
        return tio_fail(-ENOTSUP, "%s: Parquet is unavailable: %s", f->rel, reason);
    f->parquet = calloc(1, sizeof *f->parquet);
    if (!f->parquet)
        return tio_fail(-ENOMEM, "out of memory");
    char err[1024] = "";
    tio_pq_meta meta;
    int rc = api->open(f->path, NULL, 0, f->rel, ds->text_field, &f->parquet->h, &meta, err,
                       sizeof err);
    if (rc)
        return tio_fail(rc, "%s", err);
    snprintf(f->parquet->column, sizeof f->parquet->column, "%s", meta.column);
    f->text = meta.kind == TIO_PQ_TEXT;
    f->n_docs = (uint64_t)meta.n_rows;
    f->has_tokens = meta.n_rows > 0; /* known when read: the loader stops on all-empty */
    uint32_t cap = 0;
    uint64_t first = 0;
    for (int32_t g = 0; g < meta.n_row_groups; g++) {
        uint64_t rows = (uint64_t)api->row_group_rows(f->parquet->h, g);
        uint64_t bytes = (uint64_t)api->row_group_bytes(f->parquet->h, g);
        uint64_t slices = bytes > TIO_PARQUET_WINDOW_BYTES ? (bytes - 1) / TIO_PARQUET_WINDOW_BYTES + 1 : 1;
        uint64_t per = slices < rows ? (rows + slices - 1) / slices : 1;
        for (uint64_t at = 0; at < rows; at += per) {
            if ((rc = tio_grow((void **)&f->windows, &cap, f->n_windows + 1, sizeof *f->windows)))
                return rc;
            uint64_t n = rows - at < per ? rows - at : per;
            f->windows[f->n_windows++] = (tio_data_window){first + at, n, (uint64_t)g, at};
        }
        first += rows;
    }
    return 0;
}

static void parquet_close(tio_data_file *f)
{
    if (f->parquet && f->parquet->h)
        api->close(f->parquet->h);
    free(f->parquet);
    f->parquet = NULL;
    free(f->windows);
    f->windows = NULL;
    f->n_windows = 0;
}

typedef struct {
    const tio_data_file *f;
    uint32_t row_group;
    tio_pq_column col;
} pq_window;

static int null_row(const pq_window *w, uint64_t i)
{
    return tio_fail(TIO_EPARSE, "%s: row group %u, row %llu: column '%s' is null", w->f->rel,
                    w->row_group, (unsigned long long)i, w->f->parquet->column);
}

static int pq_text(void *ctx, uint64_t i, const char **text, size_t *len, char **owned)
{
    const pq_window *w = ctx;
    *owned = NULL;
    if (!w->col.valid[i])
        return null_row(w, i);
    *text = (const char *)w->col.data + w->col.offsets[i];
    *len = (size_t)(w->col.offsets[i + 1] - w->col.offsets[i]);
    return 0;
}

static int pq_ids(void *ctx, uint64_t i, const uint32_t **ids, uint64_t *n)
{
    const pq_window *w = ctx;
    if (!w->col.valid[i])
        return null_row(w, i);
    *ids = (const uint32_t *)w->col.data + w->col.offsets[i];
    *n = (uint64_t)(w->col.offsets[i + 1] - w->col.offsets[i]);
    return 0;
}

/* Where a reader stands in a file: row group `rg`'s rows from `next` on. */
typedef struct {
    tio_pq_rows *rows;
    uint32_t rg;
    uint64_t next;
} pq_cursor;

static void pq_cursor_free(void *p)
{
    pq_cursor *c = p;
    if (c && c->rows)
        api->rows_close(c->rows);
    free(c);
}

/* A cursor standing at window `win`'s first row: the reader's own if it is
 * in that row group at or before it, else a new one. */
static int cursor_at(const tio_data_file *f, const tio_data_window *win, pq_cursor **cursor)
{
    pq_cursor *c = *cursor;
    char err[1024] = "";
    int rc;
    if (!c || c->rg != win->offset || c->next > win->line) {
        pq_cursor_free(c);
        *cursor = NULL;
        if (!(c = calloc(1, sizeof *c)))
            return tio_fail(-ENOMEM, "%s: out of memory", f->rel);
        c->rg = (uint32_t)win->offset;
        /* batches of about a MiB of the footer's bytes, 1 to 4096 rows */
        uint64_t rows = (uint64_t)api->row_group_rows(f->parquet->h, (int32_t)c->rg);
        uint64_t bytes = (uint64_t)api->row_group_bytes(f->parquet->h, (int32_t)c->rg);
        uint64_t batch = bytes > (1u << 20) ? rows / (bytes >> 20) : rows;
        batch = batch < 1 ? 1 : batch > 4096 ? 4096 : batch;
        if ((rc = api->rows_open(f->parquet->h, (int32_t)c->rg, (int64_t)batch, &c->rows, err,
                                 sizeof err))) {
            free(c);
            return tio_fail(rc, "%s", err);
        }
    }
    *cursor = c;
    if (c->next < win->line) {
        if ((rc = api->rows_skip(c->rows, (int64_t)(win->line - c->next), err, sizeof err)))
            return tio_fail(rc, "%s", err);
        c->next = win->line;
    }
    return 0;
}

static int parquet_window_load(tio_dataset *ds, tio_data_file *f, uint32_t wi, tio_window_ids *out,
                               void **cursor)
{
    const tio_data_window *win = &f->windows[wi];
    pq_window w = {f, (uint32_t)win->offset, {0}};
    pq_cursor *c = *cursor;
    int rc = cursor_at(f, win, &c);
    *cursor = c;
    if (rc) {
        pq_cursor_free(c);
        *cursor = NULL;
        return rc;
    }
    char err[1024] = "";
    uint64_t max_value = ds->opts.max_line_bytes ? ds->opts.max_line_bytes : (64u << 20);
    uint64_t max = ds->opts.cache_bytes ? ds->opts.cache_bytes : (256u << 20);
    max = max > max_value ? max : max_value;
    rc = api->rows_read(c->rows, (int64_t)win->count, max_value, max, &w.col, err, sizeof err);
    if (rc) {
        pq_cursor_free(c);
        *cursor = NULL;
        return tio_fail(rc, "%s", err);
    }
    c->next += win->count;
    tio_window_source src = {&w, f->text ? pq_text : NULL, f->text ? NULL : pq_ids};
    rc = tio_window_fill(ds, f, &src, win->first, win->count, out);
    api->column_free(&w.col);
    return rc;
}

const tio_data_format tio_format_parquet = {"Parquet", parquet_open, parquet_close, NULL, NULL,
                                            NULL, parquet_window_load, pq_cursor_free};

int tio_parquet_check_buffer(const uint8_t *buf, size_t len, const char *text_column)
{
    const char *reason;
    if (!tio_parquet_available(&reason))
        return tio_fail(-ENOTSUP, "Parquet is unavailable: %s", reason);
    tio_pq *h;
    tio_pq_meta meta;
    char err[1024] = "";
    int rc = api->open(NULL, buf, len, "fuzz.parquet", text_column, &h, &meta, err, sizeof err);
    if (rc)
        return tio_fail(rc, "%s", err);
    for (int32_t g = 0; !rc && g < meta.n_row_groups; g++) {
        tio_pq_column col;
        tio_pq_rows *rows;
        if ((rc = api->rows_open(h, g, 64, &rows, err, sizeof err)) != 0) {
            rc = tio_fail(rc, "%s", err);
            break;
        }
        rc = api->rows_read(rows, api->row_group_rows(h, g), 1u << 20, 64u << 20, &col, err,
                            sizeof err);
        api->rows_close(rows);
        if (rc) {
            rc = tio_fail(rc, "%s", err);
            break;
        }
        /* what teraio relies on: offsets from 0, non-decreasing, rows as the footer says */
        if (col.n_rows != api->row_group_rows(h, g) || col.offsets[0] != 0)
            rc = tio_fail(TIO_EPARSE, "row group %d: inconsistent column", g);
        for (int64_t i = 0; !rc && i < col.n_rows; i++)
            if (col.offsets[i + 1] < col.offsets[i])
                rc = tio_fail(TIO_EPARSE, "row group %d: offsets decrease at row %lld", g,
                              (long long)i);
        api->column_free(&col);
    }
    api->close(h);
    return rc;
}
