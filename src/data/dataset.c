/*
 * data/dataset.c — a dataset root: the sub-dataset folders, their sorted file
 * lists, document counts (from counts.csv or by opening the files through
 * their format's operations, formats.c, jsonl.c, parquet.c), and whole-file
 * scans.  Reading documents is reader.c's.
 */
#include <dirent.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/util.h"
#include "data/data_internal.h"

void tio_dataset_options_default(tio_dataset_options *opts)
{
    memset(opts, 0, sizeof *opts);
    opts->tokenizer = tio_data_tokenizer_bytes();
    opts->text_field = "text";
    opts->jsonl_errors = TIO_DATA_JSONL_ERROR;
    opts->llmc_delimiter = -1;
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

static char *join(const char *a, const char *b)
{
    size_t n = strlen(a) + strlen(b) + 2;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s/%s", a, b);
    return p;
}

/* ---- scanning ------------------------------------------------------------ */

typedef struct {
    char **rels;
    uint32_t n, cap;
} name_list;

static int list_add(name_list *l, const char *rel)
{
    int rc = tio_grow((void **)&l->rels, &l->cap, l->n + 1, sizeof *l->rels);
    if (rc)
        return rc;
    if (!(l->rels[l->n] = strdup(rel)))
        return tio_fail(-ENOMEM, "out of memory");
    l->n++;
    return 0;
}

static int walk(const char *root, const char *rel, name_list *out, int depth)
{
    if (depth > 32)
        return tio_fail(-ELOOP, "%s/%s: folders nested deeper than 32", root, rel);
    char *dir = join(root, rel);
    if (!dir)
        return tio_fail(-ENOMEM, "out of memory");
    DIR *d = opendir(dir);
    if (!d) {
        int e = errno;
        free(dir);
        return tio_fail(-e, "%s/%s: cannot open folder: %s", root, rel, strerror(e));
    }
    int rc = 0;
    struct dirent *de;
    while (!rc && (de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.')
            continue;
        char *sub = join(rel, de->d_name);
        char *full = join(dir, de->d_name);
        struct stat st;
        if (!sub || !full)
            rc = tio_fail(-ENOMEM, "out of memory");
        else if (stat(full, &st) != 0)
            rc = tio_fail(-errno, "%s: cannot stat: %s", full, strerror(errno));
        else if (S_ISDIR(st.st_mode))
            rc = walk(root, sub, out, depth + 1);
        else if (S_ISREG(st.st_mode))
            rc = list_add(out, sub);
        free(sub);
        free(full);
    }
    closedir(d);
    free(dir);
    return rc;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static bool in_list(const name_list *l, const char *rel)
{
    return bsearch(&rel, l->rels, l->n, sizeof *l->rels, cmp_str) != NULL;
}

static uint64_t file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
}

/* Turn a sorted list of names into data files.  Megatron pairs are listed
 * under their .bin name; a .bin without .idx is an llm.c shard. */
static int classify(tio_dataset *ds, tio_data_sub *sub, const name_list *l)
{
    uint32_t cap = 0;
    for (uint32_t i = 0; i < l->n; i++) {
        const char *rel = l->rels[i];
        int format = 0, comp = COMP_NONE;
        if (ends_with(rel, ".bin")) {
            size_t n = strlen(rel);
            char *idx = strdup(rel);
            if (!idx)
                return tio_fail(-ENOMEM, "out of memory");
            memcpy(idx + n - 4, ".idx", 4);
            format = in_list(l, idx) ? FMT_MEGATRON : FMT_LLMC;
            free(idx);
        } else if (ends_with(rel, ".arrow")) {
            format = FMT_ARROW;
        } else if (ends_with(rel, ".jsonl")) {
            format = FMT_JSONL;
        } else if (ends_with(rel, ".jsonl.gz")) {
            format = FMT_JSONL, comp = COMP_GZ;
        } else if (ends_with(rel, ".jsonl.zst")) {
            format = FMT_JSONL, comp = COMP_ZST;
        } else if (ends_with(rel, ".parquet")) {
            format = FMT_PARQUET;
        } else if (ends_with(rel, ".idx")) {
            size_t n = strlen(rel);
            char *bin = strdup(rel);
            if (!bin)
                return tio_fail(-ENOMEM, "out of memory");
            memcpy(bin + n - 4, ".bin", 4);
            bool has = in_list(l, bin);
            free(bin);
            if (!has)
                return tio_fail(-ENOENT, "%s/%s: .idx without its .bin", ds->root, rel);
        }
        if (!format)
            continue;
        int rc = tio_grow((void **)&sub->files, &cap, sub->n_files + 1, sizeof *sub->files);
        if (rc)
            return rc;
        tio_data_file *f = &sub->files[sub->n_files];
        memset(f, 0, sizeof *f);
        f->format = format;
        f->comp = comp;
        f->text = format == FMT_JSONL;
        f->rel = strdup(rel);
        f->path = join(ds->root, rel);
        sub->n_files++;
        if (!f->rel || !f->path)
            return tio_fail(-ENOMEM, "out of memory");
        f->bytes = file_size(f->path);
        if (format == FMT_LLMC)
            f->bytes = f->bytes > 1024 ? f->bytes - 1024 : 0;
    }
    return 0;
}

/* counts.csv: "rel,docs,tokens" per line; sets n_docs/n_tokens and marks the
 * file as counted (open_rc = 1 until opened). */
static int apply_counts(tio_dataset *ds)
{
    char *path = join(ds->root, "counts.csv");
    if (!path)
        return tio_fail(-ENOMEM, "out of memory");
    char *text = NULL;
    size_t len = 0;
    int rc = tio_read_file(path, &text, &len);
    if (rc == -ENOENT) {
        tio_clear_error();
        free(path);
        return 0;
    }
    if (rc) {
        free(path);
        return rc;
    }
    char *line = text;
    uint32_t lineno = 0;
    while (!rc && line < text + len) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = '\0';
        lineno++;
        char *c1 = strchr(line, ','), *c2 = c1 ? strchr(c1 + 1, ',') : NULL;
        if (line[0] && line[0] != '#') {
            char *end1, *end2;
            unsigned long long docs = c2 ? strtoull(c1 + 1, &end1, 10) : 0;
            unsigned long long toks = c2 ? strtoull(c2 + 1, &end2, 10) : 0;
            if (!c2 || end1 != c2 || (*end2 && *end2 != '\r')) {
                rc = tio_fail(TIO_EPARSE, "%s:%u: expected 'path,documents,tokens'", path, lineno);
                break;
            }
            *c1 = '\0';
            for (uint32_t s = 0; s < ds->n_subs; s++)
                for (uint32_t i = 0; i < ds->subs[s].n_files; i++) {
                    tio_data_file *f = &ds->subs[s].files[i];
                    if (!strcmp(f->rel, line)) {
                        f->n_docs = docs;
                        f->n_tokens = toks;
                        f->open_rc = 1;
                    }
                }
        }
        line = nl ? nl + 1 : text + len;
    }
    free(text);
    free(path);
    return rc;
}

static int open_locked(tio_dataset *ds, tio_data_file *f)
{
    bool counted = f->open_rc == 1;
    uint64_t want_docs = f->n_docs;
    const tio_data_format *fmt = tio_data_format_of(f->format);
    int rc = fmt->open(ds, f);
    if (rc)
        return rc;
    if (f->n_windows && !(f->window_empty = calloc(f->n_windows, sizeof *f->window_empty)))
        return tio_fail(-ENOMEM, "out of memory");
    if (fmt->doc_len) /* read in place: the token count is known */
        f->has_tokens = f->n_tokens > 0;
    if (counted && f->n_docs != want_docs)
        return tio_fail(TIO_EPARSE, "%s: counts.csv says %llu documents, the file holds %llu",
                        f->rel, (unsigned long long)want_docs, (unsigned long long)f->n_docs);
    return 0;
}

/* A file is opened once; a failed open is remembered with its message, so
 * that every later reader, on any thread, reports the same error. */
int tio_data_file_open(tio_dataset *ds, tio_data_file *f)
{
    /* opened is set (release) after everything else: once seen, no lock */
    if (__atomic_load_n(&f->opened, __ATOMIC_ACQUIRE) && f->open_rc == 0)
        return 0;
    pthread_mutex_lock(&ds->lock);
    int rc = 0;
    if (!f->opened) {
        rc = open_locked(ds, f);
        f->open_rc = rc;
        if (rc && !(f->open_msg = strdup(tio_last_error())))
            rc = f->open_rc = tio_fail(-ENOMEM, "%s: out of memory", f->rel);
        __atomic_store_n(&f->opened, true, __ATOMIC_RELEASE);
    } else if ((rc = f->open_rc) != 0) {
        tio_fail(rc, "%s", f->open_msg);
    }
    pthread_mutex_unlock(&ds->lock);
    return rc;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001B3ull;
    return h;
}

/* A sub-dataset known to hold no token at all (every file opened and
 * without tokens, or listed in counts.csv with no document) would make the
 * loader draw empty documents forever: refuse it now. */
static int check_has_tokens(const tio_data_sub *sub)
{
    uint64_t empty = 0;
    for (uint32_t i = 0; i < sub->n_files; i++) {
        const tio_data_file *f = &sub->files[i];
        if (f->open_rc == 1 ? f->n_docs > 0 : f->has_tokens)
            return 0;
        empty += f->n_docs;
    }
    return tio_fail(-ENODATA, "sub-dataset '%s' has no tokens (%llu documents, all empty)",
                    sub->name, (unsigned long long)empty);
}

int tio_dataset_open(const char *root, const tio_dataset_options *opts, tio_dataset **out)
{
    *out = NULL;
    tio_dataset *ds = calloc(1, sizeof *ds);
    if (!ds)
        return tio_fail(-ENOMEM, "out of memory");
    pthread_mutex_init(&ds->lock, NULL);
    if (opts)
        ds->opts = *opts;
    else
        tio_dataset_options_default(&ds->opts);
    if (!ds->opts.tokenizer)
        ds->opts.tokenizer = tio_data_tokenizer_bytes();
    ds->text_field = strdup(ds->opts.text_field ? ds->opts.text_field : "text");
    ds->opts.text_field = ds->text_field;
    ds->root = strdup(root);
    int rc = 0;
    if (!ds->root || !ds->text_field) {
        tio_dataset_destroy(ds);
        return tio_fail(-ENOMEM, "out of memory");
    }
    name_list top = {0};
    DIR *d = opendir(root);
    if (!d) {
        rc = tio_fail(-errno, "%s: cannot open dataset root: %s", root, strerror(errno));
        tio_dataset_destroy(ds);
        return rc;
    }
    struct dirent *de;
    while (!rc && (de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.')
            continue;
        char *full = join(root, de->d_name);
        struct stat st;
        if (full && stat(full, &st) == 0 && S_ISDIR(st.st_mode))
            rc = list_add(&top, de->d_name);
        free(full);
    }
    closedir(d);
    if (top.n)
        qsort(top.rels, top.n, sizeof *top.rels, cmp_str);
    uint32_t cap = 0;
    for (uint32_t i = 0; !rc && i < top.n; i++) {
        name_list files = {0};
        rc = walk(root, top.rels[i], &files, 0);
        if (!rc && files.n) {
            qsort(files.rels, files.n, sizeof *files.rels, cmp_str);
            rc = tio_grow((void **)&ds->subs, &cap, ds->n_subs + 1, sizeof *ds->subs);
            if (!rc) {
                tio_data_sub *s = &ds->subs[ds->n_subs++];
                memset(s, 0, sizeof *s);
                s->name = strdup(top.rels[i]);
                rc = s->name ? classify(ds, s, &files) : tio_fail(-ENOMEM, "out of memory");
                if (!rc && s->n_files == 0) {
                    free(s->name);
                    free(s->files);
                    ds->n_subs--;
                }
            }
        }
        for (uint32_t k = 0; k < files.n; k++)
            free(files.rels[k]);
        free(files.rels);
    }
    for (uint32_t k = 0; k < top.n; k++)
        free(top.rels[k]);
    free(top.rels);
    if (!rc && ds->n_subs == 0)
        rc = tio_fail(-ENODATA, "%s: no sub-dataset folder with data files", root);
    if (!rc)
        rc = apply_counts(ds);
    for (uint32_t s = 0; !rc && s < ds->n_subs; s++) {
        tio_data_sub *sub = &ds->subs[s];
        uint64_t h = fnv(0xCBF29CE484222325ull, sub->name, strlen(sub->name) + 1);
        for (uint32_t i = 0; !rc && i < sub->n_files; i++) {
            tio_data_file *f = &sub->files[i];
            if (f->open_rc != 1)
                rc = tio_data_file_open(ds, f);
            sub->n_docs += f->n_docs;
            sub->bytes += f->bytes;
            sub->n_tokens += f->n_tokens;
            h = fnv(h, f->rel, strlen(f->rel) + 1);
            h = fnv(h, &f->n_docs, 8);
            h = fnv(h, &f->bytes, 8);
        }
        sub->fingerprint = h;
        if (!rc)
            rc = check_has_tokens(sub);
    }
    if (rc) {
        tio_dataset_destroy(ds);
        return rc;
    }
    *out = ds;
    return 0;
}

void tio_dataset_destroy(tio_dataset *ds)
{
    if (!ds)
        return;
    for (uint32_t s = 0; s < ds->n_subs; s++) {
        tio_data_sub *sub = &ds->subs[s];
        for (uint32_t i = 0; i < sub->n_files; i++) {
            tio_data_file *f = &sub->files[i];
            if (f->format)
                tio_data_format_of(f->format)->close(f);
            free(f->window_empty);
            free(f->open_msg);
            free(f->path);
            free(f->rel);
        }
        free(sub->files);
        free(sub->name);
    }
    free(ds->subs);
    free(ds->root);
    free(ds->text_field);
    pthread_mutex_destroy(&ds->lock);
    free(ds);
}

uint32_t tio_dataset_n_subdatasets(const tio_dataset *ds) { return ds->n_subs; }

int tio_dataset_info(const tio_dataset *ds, uint32_t i, tio_data_subdataset_info *info)
{
    if (i >= ds->n_subs)
        return tio_fail(-EINVAL, "sub-dataset %u out of range (%u)", i, ds->n_subs);
    const tio_data_sub *s = &ds->subs[i];
    info->name = s->name;
    info->n_files = s->n_files;
    info->n_docs = s->n_docs;
    info->bytes = s->bytes;
    info->n_tokens = s->n_tokens;
    info->lines_skipped = __atomic_load_n(&s->lines_skipped, __ATOMIC_RELAXED);
    info->n_empty_docs = 0;
    for (uint32_t k = 0; k < s->n_files; k++) {
        const tio_data_file *f = &s->files[k];
        if (!__atomic_load_n(&f->opened, __ATOMIC_ACQUIRE) || f->open_rc)
            continue;
        info->n_empty_docs += f->n_empty;
        for (uint32_t w = 0; f->window_empty && w < f->n_windows; w++) {
            uint64_t e = __atomic_load_n(&f->window_empty[w], __ATOMIC_RELAXED);
            info->n_empty_docs += e ? e - 1 : 0;
        }
    }
    return 0;
}

const char *tio_dataset_file_format(const tio_dataset *ds, uint32_t sub, uint32_t file)
{
    if (sub >= ds->n_subs || file >= ds->subs[sub].n_files)
        return NULL;
    const tio_data_file *f = &ds->subs[sub].files[file];
    if (f->format == FMT_PARQUET && __atomic_load_n(&f->opened, __ATOMIC_ACQUIRE) && !f->open_rc)
        return f->text ? "Parquet text" : "Parquet tokens";
    return tio_data_format_of(f->format)->name;
}

int tio_data_doc_file(tio_dataset *ds, uint32_t sub, uint32_t file, uint64_t doc,
                      tio_data_file **out)
{
    if (sub >= ds->n_subs || file >= ds->subs[sub].n_files)
        return tio_fail(-EINVAL, "file %u of sub-dataset %u out of range", file, sub);
    tio_data_file *f = &ds->subs[sub].files[file];
    int rc = tio_data_file_open(ds, f);
    if (rc)
        return rc;
    if (doc >= f->n_docs)
        return tio_fail(-EINVAL, "%s: document %llu out of range (%llu)", f->rel,
                        (unsigned long long)doc, (unsigned long long)f->n_docs);
    *out = f;
    return 0;
}

int tio_dataset_doc_location(tio_dataset *ds, uint32_t sub, uint32_t file, uint64_t doc,
                             uint64_t *unit, uint64_t *row)
{
    tio_data_file *f = NULL;
    int rc = tio_data_doc_file(ds, sub, file, doc, &f);
    if (rc)
        return rc;
    *unit = doc;
    *row = 0;
    if (f->n_windows) {
        const tio_data_window *w = &f->windows[tio_data_window_of(f, doc)];
        *unit = f->format == FMT_PARQUET ? w->offset : (uint64_t)(w - f->windows);
        *row = doc - w->first + (f->format == FMT_PARQUET ? w->line : 0);
    }
    return 0;
}

bool tio_data_parquet_available(const char **reason) { return tio_parquet_available(reason); }

const char *tio_dataset_file_path(const tio_dataset *ds, uint32_t sub, uint32_t file)
{
    if (sub >= ds->n_subs || file >= ds->subs[sub].n_files)
        return NULL;
    return ds->subs[sub].files[file].rel;
}

int64_t tio_dataset_file_docs(const tio_dataset *ds, uint32_t sub, uint32_t file)
{
    if (sub >= ds->n_subs || file >= ds->subs[sub].n_files)
        return tio_fail(-EINVAL, "file %u of sub-dataset %u out of range", file, sub);
    return (int64_t)ds->subs[sub].files[file].n_docs;
}

int tio_dataset_scan_file(tio_dataset *ds, uint32_t sub, uint32_t file, tio_data_doc_fn fn,
                          void *arg)
{
    int64_t docs = tio_dataset_file_docs(ds, sub, file);
    if (docs < 0)
        return (int)docs;
    tio_data_reader *r;
    int rc = tio_data_reader_create(ds, &r);
    if (rc)
        return rc;
    uint32_t *ids = NULL;
    uint64_t cap = 0;
    for (uint64_t d = 0; !rc && d < (uint64_t)docs; d++) {
        uint64_t len = 0;
        if ((rc = tio_data_doc_len(r, sub, file, d, &len)) != 0)
            break;
        if (len > cap) {
            uint32_t *p = realloc(ids, len * sizeof *p);
            if (!p) {
                rc = tio_fail(-ENOMEM, "out of memory");
                break;
            }
            ids = p;
            cap = len;
        }
        if (len && (rc = tio_data_doc_read(r, sub, file, d, 0, len, ids)) != 0)
            break;
        rc = fn(arg, d, ids, len);
    }
    free(ids);
    tio_data_reader_destroy(r);
    return rc;
}

int tio_dataset_read_doc(tio_dataset *ds, uint32_t sub, uint32_t file, uint64_t doc,
                         uint32_t **ids, uint64_t *n)
{
    *ids = NULL;
    *n = 0;
    tio_data_reader *r;
    int rc = tio_data_reader_create(ds, &r);
    if (rc)
        return rc;
    uint64_t len = 0;
    rc = tio_data_doc_len(r, sub, file, doc, &len);
    if (!rc && len) {
        *ids = malloc(len * sizeof **ids);
        if (!*ids)
            rc = tio_fail(-ENOMEM, "out of memory");
        else
            rc = tio_data_doc_read(r, sub, file, doc, 0, len, *ids);
    }
    if (rc) {
        free(*ids);
        *ids = NULL;
    } else {
        *n = len;
    }
    tio_data_reader_destroy(r);
    return rc;
}
