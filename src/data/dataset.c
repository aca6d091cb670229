/*
 * data/dataset.c — a dataset root: the sub-dataset folders, their sorted file
 * lists, document counts (from counts.csv or by opening the files), lazily
 * memory-mapped token files, and per-thread readers that return any
 * document's tokens (tokenizing JSONL through the dataset's tokenizer, with a
 * small cache of decompressed files).
 */
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>
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

static int map_file(const char *path, uint8_t **map, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return tio_fail(-errno, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return tio_fail(-e, "%s: cannot stat: %s", path, strerror(e));
    }
    *len = (size_t)st.st_size;
    *map = NULL;
    if (*len) {
        void *p = mmap(NULL, *len, PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return tio_fail(-e, "%s: cannot map: %s", path, strerror(e));
        }
        *map = p;
    }
    close(fd);
    return 0;
}

/* Document boundaries of an llm.c shard: runs between delimiter tokens. */
static int llmc_index(tio_dataset *ds, tio_data_file *f, uint64_t n_tok, uint32_t delim)
{
    const uint8_t *t = f->map + 1024;
    uint32_t cap = 0, n = 0;
    uint64_t start = 0;
    for (uint64_t i = 0; i <= n_tok; i++) {
        uint32_t v = 0;
        if (i < n_tok) {
            if (f->width == 2) {
                uint16_t x;
                memcpy(&x, t + 2 * i, 2);
                v = x;
            } else {
                memcpy(&v, t + 4 * i, 4);
            }
        }
        if (i == n_tok || v == delim) {
            if (i > start) {
                if ((uint64_t)n + 2 > UINT32_MAX)
                    return tio_fail(-EOVERFLOW, "%s: too many documents", f->rel);
                int rc = tio_grow((void **)&f->doc_starts, &cap, n + 2, sizeof *f->doc_starts);
                if (rc)
                    return rc;
                f->doc_starts[n++] = start;
                f->doc_starts[n++] = i;
            }
            start = i + 1;
        }
    }
    (void)ds;
    f->n_docs = n / 2;
    f->n_tokens = n_tok;
    return 0;
}

static uint64_t count_lines(const char *buf, size_t len)
{
    uint64_t n = 0;
    size_t i = 0;
    while (i < len) {
        const char *nl = memchr(buf + i, '\n', len - i);
        size_t end = nl ? (size_t)(nl - buf) : len;
        for (size_t k = i; k < end; k++)
            if (buf[k] != ' ' && buf[k] != '\t' && buf[k] != '\r') {
                n++;
                break;
            }
        i = end + 1;
    }
    return n;
}

static int open_locked(tio_dataset *ds, tio_data_file *f)
{
    bool counted = f->open_rc == 1;
    uint64_t want_docs = f->n_docs;
    int rc = 0;
    if (f->format == FMT_JSONL) {
        if (!counted) {
            char *buf = NULL;
            size_t len = 0;
            if ((rc = tio_decompress_file(f->path, f->comp, &buf, &len)) != 0)
                return rc;
            f->n_docs = count_lines(buf, len);
            free(buf);
        }
        return 0;
    }
    if ((rc = map_file(f->path, &f->map, &f->map_len)) != 0)
        return rc;
    if (f->format == FMT_MEGATRON) {
        char *idx = strdup(f->path);
        if (!idx)
            return tio_fail(-ENOMEM, "out of memory");
        memcpy(idx + strlen(idx) - 4, ".idx", 4);
        rc = map_file(idx, &f->idx_map, &f->idx_len);
        free(idx);
        if (rc)
            return rc;
        char name[4096];
        snprintf(name, sizeof name, "%.*s.idx", (int)(strlen(f->rel) - 4), f->rel);
        if ((rc = tio_mmidx_parse(f->idx_map, f->idx_len, f->map_len, name, &f->idx)) != 0)
            return rc;
        f->n_docs = f->idx.n_docs;
        uint64_t tok = 0;
        for (uint64_t i = 0; i < f->idx.n_seqs; i++)
            tok += tio_mmidx_u32(f->idx.lengths, i);
        f->n_tokens = tok;
    } else if (f->format == FMT_LLMC) {
        uint64_t n_tok;
        uint32_t delim;
        if ((rc = tio_llmc_parse_header(f->map, f->map_len, f->rel, &f->width, &n_tok, &delim)) != 0)
            return rc;
        if (ds->opts.llmc_delimiter >= 0)
            delim = (uint32_t)ds->opts.llmc_delimiter;
        if ((rc = llmc_index(ds, f, n_tok, delim)) != 0)
            return rc;
    } else {
        if ((rc = tio_arrow_parse(f->map, f->map_len, "tokens", f->rel, &f->arrow)) != 0)
            return rc;
        f->n_docs = f->arrow.n_batches;
        uint64_t tok = 0;
        for (uint32_t i = 0; i < f->arrow.n_batches; i++)
            tok += f->arrow.batches[i].count;
        f->n_tokens = tok;
    }
    if (counted && f->n_docs != want_docs)
        return tio_fail(TIO_EPARSE, "%s: counts.csv says %llu documents, the file holds %llu",
                        f->rel, (unsigned long long)want_docs, (unsigned long long)f->n_docs);
    return 0;
}

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
        __atomic_store_n(&f->opened, true, __ATOMIC_RELEASE);
    } else {
        rc = f->open_rc;
        if (rc)
            tio_fail(rc, "%s: %s (when first opened)", f->rel, tio_strerror(rc));
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
            if (f->map)
                munmap(f->map, f->map_len);
            if (f->idx_map)
                munmap(f->idx_map, f->idx_len);
            free(f->doc_starts);
            tio_arrow_index_free(&f->arrow);
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
    return 0;
}

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

/* ---- readers -------------------------------------------------------------
 * A reader keeps the last JSONL_CACHE JSONL files it touched, each
 * decompressed and tokenized whole when loaded: its non-blank lines are
 * handed out in chunks of JSONL_CHUNK to up to `tokenizer_threads` threads
 * (the reading thread among them), each chunk's ids kept in one array.  A
 * line whose JSON is malformed is marked; reading it reports the error (or,
 * with TIO_DATA_JSONL_SKIP, reads as an empty document and is counted).  The
 * result does not depend on the thread count. */

enum { JSONL_CACHE = 4, JSONL_CHUNK = 64 };

typedef struct {
    uint32_t sub, file;
    bool used;
    uint64_t tick;
    char *buf;
    size_t len;
    uint64_t *lines;    /* start, end byte per document */
    uint64_t n_lines;
    uint32_t **chunk_ids; /* per chunk of JSONL_CHUNK lines */
    uint64_t *id_off;   /* per line: first id in its chunk's array */
    uint64_t *id_len;   /* per line: ids */
    int *line_rc;       /* per line: 0 or TIO_EPARSE */
} jsonl_entry;

struct tio_data_reader {
    tio_dataset *ds;
    jsonl_entry cache[JSONL_CACHE];
    uint64_t tick;
    /* the last document whose length was asked (asked again to read it) */
    bool len_valid;
    uint32_t len_sub, len_file;
    uint64_t len_doc, len_n;
    /* the malformed line last counted as skipped (not counted twice in a row) */
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

static void entry_free(jsonl_entry *e)
{
    if (e->chunk_ids)
        for (uint64_t c = 0; c < (e->n_lines + JSONL_CHUNK - 1) / JSONL_CHUNK; c++)
            free(e->chunk_ids[c]);
    free(e->chunk_ids);
    free(e->id_off);
    free(e->id_len);
    free(e->line_rc);
    free(e->buf);
    free(e->lines);
    memset(e, 0, sizeof *e);
}

void tio_data_reader_destroy(tio_data_reader *r)
{
    if (!r)
        return;
    for (int i = 0; i < JSONL_CACHE; i++)
        entry_free(&r->cache[i]);
    free(r);
}

/* Work shared by the threads tokenizing one file. */
typedef struct {
    tio_dataset *ds;
    tio_data_file *f;
    jsonl_entry *e;
    uint64_t next_chunk, n_chunks; /* atomic */
    int rc;                        /* first error (atomic: 0 until set) */
    char msg[1024];
    pthread_mutex_t lock;
} tok_job;

static int tokenize_chunk(tok_job *job, uint64_t c)
{
    jsonl_entry *e = job->e;
    const tio_data_tokenizer *tok = job->ds->opts.tokenizer;
    uint64_t a = c * JSONL_CHUNK, b = a + JSONL_CHUNK < e->n_lines ? a + JSONL_CHUNK : e->n_lines;
    size_t cap = 0, used = 0;
    uint32_t *ids = NULL;
    int rc = 0;
    for (uint64_t l = a; l < b && !rc; l++) {
        char *text = NULL;
        size_t tlen = 0;
        e->id_off[l] = used;
        e->id_len[l] = 0;
        rc = tio_jsonl_text(e->buf + e->lines[2 * l], e->lines[2 * l + 1] - e->lines[2 * l],
                            job->ds->text_field, job->f->rel, &text, &tlen);
        if (rc == TIO_EPARSE) {
            e->line_rc[l] = rc;
            rc = 0;
            tio_clear_error();
            continue;
        }
        for (size_t want = tlen; !rc;) {
            if (used + want > cap) {
                size_t nc = cap * 2 > used + want ? cap * 2 : used + want;
                uint32_t *p = realloc(ids, (nc ? nc : 1) * sizeof *p);
                if (!p) {
                    rc = tio_fail(-ENOMEM, "%s: out of memory", job->f->rel);
                    break;
                }
                ids = p;
                cap = nc;
            }
            int64_t n = tok->encode(tok->ctx, text, tlen, ids + used, cap - used);
            if (n < 0) {
                rc = tio_fail((int)n, "%s: line %llu: tokenizer '%s' failed: %s", job->f->rel,
                              (unsigned long long)l + 1, tok->name, tio_strerror((int)n));
            } else if ((size_t)n <= cap - used) {
                e->id_len[l] = (uint64_t)n;
                used += (size_t)n;
                break;
            } else {
                want = (size_t)n;
            }
        }
        free(text);
    }
    e->chunk_ids[c] = ids;
    return rc;
}

static void *tokenize_worker(void *arg)
{
    tok_job *job = arg;
    for (;;) {
        uint64_t c = __atomic_fetch_add(&job->next_chunk, 1, __ATOMIC_RELAXED);
        if (c >= job->n_chunks || __atomic_load_n(&job->rc, __ATOMIC_RELAXED))
            break;
        int rc = tokenize_chunk(job, c);
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

static unsigned tokenizer_threads(const tio_dataset *ds, uint64_t n_chunks)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    unsigned t = ds->opts.tokenizer_threads;
    if (t == 0)
        t = cpus < 1 ? 1 : cpus > 4 ? 4 : (unsigned)cpus;
    if (t > 64)
        t = 64;
    return n_chunks < t ? (unsigned)(n_chunks ? n_chunks : 1) : t;
}

static int jsonl_tokenize(tio_dataset *ds, tio_data_file *f, jsonl_entry *e)
{
    uint64_t n = e->n_lines, chunks = (n + JSONL_CHUNK - 1) / JSONL_CHUNK;
    e->chunk_ids = calloc(chunks ? chunks : 1, sizeof *e->chunk_ids);
    e->id_off = malloc((n ? n : 1) * sizeof *e->id_off);
    e->id_len = malloc((n ? n : 1) * sizeof *e->id_len);
    e->line_rc = calloc(n ? n : 1, sizeof *e->line_rc);
    if (!e->chunk_ids || !e->id_off || !e->id_len || !e->line_rc)
        return tio_fail(-ENOMEM, "%s: out of memory", f->rel);
    tok_job job = {.ds = ds, .f = f, .e = e, .n_chunks = chunks};
    pthread_mutex_init(&job.lock, NULL);
    pthread_t th[64];
    unsigned want = tokenizer_threads(ds, chunks), started = 0;
    while (started + 1 < want && pthread_create(&th[started], NULL, tokenize_worker, &job) == 0)
        started++;
    tokenize_worker(&job);
    for (unsigned i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    pthread_mutex_destroy(&job.lock);
    if (job.rc)
        return tio_fail(job.rc, "%s", job.msg);
    return 0;
}

static int jsonl_load(tio_data_reader *r, uint32_t sub, uint32_t file, jsonl_entry **out)
{
    jsonl_entry *victim = &r->cache[0];
    for (int i = 0; i < JSONL_CACHE; i++) {
        jsonl_entry *e = &r->cache[i];
        if (e->used && e->sub == sub && e->file == file) {
            e->tick = ++r->tick;
            *out = e;
            return 0;
        }
        if (!e->used || (victim->used && e->tick < victim->tick))
            victim = e;
    }
    entry_free(victim);
    tio_data_file *f = &r->ds->subs[sub].files[file];
    int rc = tio_decompress_file(f->path, f->comp, &victim->buf, &victim->len);
    if (rc)
        return rc;
    uint64_t n = 0, cap = f->n_docs;
    victim->lines = malloc((cap ? cap : 1) * 2 * sizeof *victim->lines);
    if (!victim->lines) {
        entry_free(victim);
        return tio_fail(-ENOMEM, "%s: out of memory", f->rel);
    }
    size_t i = 0;
    while (i < victim->len) {
        const char *nl = memchr(victim->buf + i, '\n', victim->len - i);
        size_t end = nl ? (size_t)(nl - victim->buf) : victim->len;
        bool blank = true;
        for (size_t k = i; k < end && blank; k++)
            blank = victim->buf[k] == ' ' || victim->buf[k] == '\t' || victim->buf[k] == '\r';
        if (!blank) {
            if (n == cap) {
                entry_free(victim);
                return tio_fail(TIO_EPARSE, "%s: the file changed: more than %llu lines", f->rel,
                                (unsigned long long)cap);
            }
            victim->lines[2 * n] = i;
            victim->lines[2 * n + 1] = end;
            n++;
        }
        i = end + 1;
    }
    if (n != cap) {
        entry_free(victim);
        return tio_fail(TIO_EPARSE, "%s: the file changed: %llu lines, counted %llu", f->rel,
                        (unsigned long long)n, (unsigned long long)cap);
    }
    victim->n_lines = n;
    if ((rc = jsonl_tokenize(r->ds, f, victim)) != 0) {
        entry_free(victim);
        return rc;
    }
    victim->used = true;
    victim->sub = sub;
    victim->file = file;
    victim->tick = ++r->tick;
    *out = victim;
    return 0;
}

/* A JSONL document's ids (*ids NULL when it has none). */
static int jsonl_doc(tio_data_reader *r, uint32_t sub, uint32_t file, uint64_t doc,
                     const uint32_t **ids, uint64_t *n)
{
    jsonl_entry *e = NULL;
    int rc = jsonl_load(r, sub, file, &e);
    if (rc)
        return rc;
    tio_dataset *ds = r->ds;
    if (e->line_rc[doc]) {
        /* parse again for the message naming the column */
        tio_data_file *f = &ds->subs[sub].files[file];
        char where[4200], *text = NULL;
        size_t tlen;
        snprintf(where, sizeof where, "%s: line %llu (document %llu)", f->rel,
                 (unsigned long long)doc + 1, (unsigned long long)doc);
        rc = tio_jsonl_text(e->buf + e->lines[2 * doc], e->lines[2 * doc + 1] - e->lines[2 * doc],
                            ds->text_field, where, &text, &tlen);
        free(text);
        if (ds->opts.jsonl_errors != TIO_DATA_JSONL_SKIP)
            return rc;
        if (!(r->skip_valid && r->skip_sub == sub && r->skip_file == file && r->skip_doc == doc)) {
            __atomic_fetch_add(&ds->subs[sub].lines_skipped, 1, __ATOMIC_RELAXED);
            tio_log(TIO_LOG_WARN, "skipped: %s", tio_last_error());
            r->skip_valid = true;
            r->skip_sub = sub;
            r->skip_file = file;
            r->skip_doc = doc;
        }
        tio_clear_error();
        *ids = NULL;
        *n = 0;
        return 0;
    }
    *ids = e->chunk_ids[doc / JSONL_CHUNK] ? e->chunk_ids[doc / JSONL_CHUNK] + e->id_off[doc] : NULL;
    *n = e->id_len[doc];
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
    tio_dataset *ds = r->ds;
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

static int doc_len(tio_data_reader *r, uint32_t sub, uint32_t file, uint64_t doc, uint64_t *n);

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

static int doc_len(tio_data_reader *r, uint32_t sub, uint32_t file, uint64_t doc, uint64_t *n)
{
    tio_data_file *f = NULL;
    int rc = check_doc(r, sub, file, doc, &f);
    if (rc)
        return rc;
    switch (f->format) {
    case FMT_MEGATRON: {
        uint64_t a = tio_mmidx_u64(f->idx.doc_index, doc), b = tio_mmidx_u64(f->idx.doc_index, doc + 1);
        uint64_t t = 0;
        for (uint64_t s = a; s < b; s++)
            t += tio_mmidx_u32(f->idx.lengths, s);
        *n = t;
        return 0;
    }
    case FMT_LLMC:
        *n = f->doc_starts[2 * doc + 1] - f->doc_starts[2 * doc];
        return 0;
    case FMT_ARROW:
        *n = f->arrow.batches[doc].count;
        return 0;
    default: {
        const uint32_t *ids;
        return jsonl_doc(r, sub, file, doc, &ids, n);
    }
    }
}

/* Convert `n` values of Megatron dtype `code` at `p` to ids. */
static int convert(const uint8_t *p, int code, uint64_t n, uint32_t *dst, const char *rel, uint64_t doc)
{
    if (code == 8) { /* unsigned: every value is an id */
        for (uint64_t i = 0; i < n; i++) {
            uint16_t x;
            memcpy(&x, p + 2 * i, 2);
            dst[i] = x;
        }
        return 0;
    }
    if (code == 1) {
        for (uint64_t i = 0; i < n; i++)
            dst[i] = p[i];
        return 0;
    }
    if (code == 4) { /* copy and check the sign bits in one pass */
        uint32_t neg = 0;
        for (uint64_t i = 0; i < n; i++) {
            uint32_t x;
            memcpy(&x, p + 4 * i, 4);
            neg |= x;
            dst[i] = x;
        }
        if (!(neg >> 31))
            return 0;
    }
    for (uint64_t i = 0; i < n; i++) {
        int64_t v;
        double d = 0;
        bool is_float = false;
        switch (code) {
        case 1: v = p[i]; break;
        case 2: v = (int8_t)p[i]; break;
        case 3: { int16_t x; memcpy(&x, p + 2 * i, 2); v = x; break; }
        case 4: { int32_t x; memcpy(&x, p + 4 * i, 4); v = x; break; }
        case 5: { int64_t x; memcpy(&x, p + 8 * i, 8); v = x; break; }
        case 6: { memcpy(&d, p + 8 * i, 8); is_float = true; v = 0; break; }
        case 7: { float x; memcpy(&x, p + 4 * i, 4); d = x; is_float = true; v = 0; break; }
        default: { uint16_t x; memcpy(&x, p + 2 * i, 2); v = x; break; }
        }
        if (is_float) {
            if (!(d >= 0 && d <= 4294967295.0) || d != (double)(int64_t)d)
                return tio_fail(TIO_EPARSE, "%s: document %llu: token %g is not an id", rel,
                                (unsigned long long)doc, d);
            v = (int64_t)d;
        }
        if (v < 0 || v > (int64_t)UINT32_MAX)
            return tio_fail(TIO_EPARSE, "%s: document %llu: token %lld is not an id", rel,
                            (unsigned long long)doc, (long long)v);
        dst[i] = (uint32_t)v;
    }
    return 0;
}

static void doc_prefetch(tio_data_reader *r, uint32_t sub, uint32_t file, uint64_t doc,
                         uint64_t off);

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

static void doc_prefetch(tio_data_reader *r, uint32_t sub, uint32_t file, uint64_t doc,
                         uint64_t off)
{
    tio_dataset *ds = r->ds;
    if (sub >= ds->n_subs || file >= ds->subs[sub].n_files)
        return;
    tio_data_file *f = &ds->subs[sub].files[file];
    if (!__atomic_load_n(&f->opened, __ATOMIC_ACQUIRE) || f->open_rc || doc >= f->n_docs)
        return;
    const uint8_t *p = NULL;
    if (f->format == FMT_MEGATRON) {
        uint64_t s = tio_mmidx_u64(f->idx.doc_index, doc);
        if (s < f->idx.n_seqs)
            p = f->map + tio_mmidx_u64(f->idx.pointers, s) +
                off * (uint64_t)tio_mmidx_dtype_size(f->idx.dtype);
    } else if (f->format == FMT_LLMC) {
        p = f->map + 1024 + (f->doc_starts[2 * doc] + off) * (uint64_t)f->width;
    } else if (f->format == FMT_ARROW) {
        p = f->map + f->arrow.batches[doc].offset + off * (uint64_t)f->arrow.width;
    }
    if (!p)
        return;
    for (int k = 0; k < 8; k++)
        if (p + 64 * k < f->map + f->map_len)
            __builtin_prefetch(p + 64 * k);
}

static int doc_read(tio_data_reader *r, uint32_t sub, uint32_t file, uint64_t doc, uint64_t off,
                    uint64_t n, uint32_t *dst);

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

static int doc_read(tio_data_reader *r, uint32_t sub, uint32_t file, uint64_t doc, uint64_t off,
                    uint64_t n, uint32_t *dst)
{
    tio_data_file *f = NULL;
    int rc = check_doc(r, sub, file, doc, &f);
    if (rc || n == 0)
        return rc;
    switch (f->format) {
    case FMT_MEGATRON: {
        int w = tio_mmidx_dtype_size(f->idx.dtype);
        uint64_t a = tio_mmidx_u64(f->idx.doc_index, doc), b = tio_mmidx_u64(f->idx.doc_index, doc + 1);
        for (uint64_t s = a; s < b && n; s++) {
            uint64_t l = tio_mmidx_u32(f->idx.lengths, s);
            if (off >= l) {
                off -= l;
                continue;
            }
            uint64_t take = l - off < n ? l - off : n;
            const uint8_t *p = f->map + tio_mmidx_u64(f->idx.pointers, s) + off * (uint64_t)w;
            if ((rc = convert(p, f->idx.dtype, take, dst, f->rel, doc)) != 0)
                return rc;
            dst += take;
            n -= take;
            off = 0;
        }
        break;
    }
    case FMT_LLMC: {
        uint64_t start = f->doc_starts[2 * doc] + off;
        const uint8_t *p = f->map + 1024 + start * (uint64_t)f->width;
        if (f->width == 4) {
            memcpy(dst, p, n * 4);
        } else {
            for (uint64_t i = 0; i < n; i++) {
                uint16_t x;
                memcpy(&x, p + 2 * i, 2);
                dst[i] = x;
            }
        }
        break;
    }
    case FMT_ARROW: {
        const tio_arrow_batch *b = &f->arrow.batches[doc];
        int w = f->arrow.width;
        const uint8_t *p = f->map + b->offset + off * (uint64_t)w;
        if (w == 4 && !f->arrow.is_signed) {
            memcpy(dst, p, n * 4);
            break;
        }
        /* Megatron codes of the same layout: 1 u8, 2 i8, 3 i16, 8 u16, 4 i32, 5 i64 */
        int code = w == 1 ? (f->arrow.is_signed ? 2 : 1) : w == 2 ? (f->arrow.is_signed ? 3 : 8)
                 : w == 4 ? 4 : 5;
        if (w == 8 && !f->arrow.is_signed) {
            for (uint64_t i = 0; i < n; i++) {
                uint64_t x;
                memcpy(&x, p + 8 * i, 8);
                if (x > UINT32_MAX)
                    return tio_fail(TIO_EPARSE, "%s: document %llu: token %llu is not an id",
                                    f->rel, (unsigned long long)doc, (unsigned long long)x);
                dst[i] = (uint32_t)x;
            }
            break;
        }
        rc = convert(p, code, n, dst, f->rel, doc);
        break;
    }
    default: {
        const uint32_t *ids;
        uint64_t len;
        if ((rc = jsonl_doc(r, sub, file, doc, &ids, &len)) != 0)
            return rc;
        if (off + n > len)
            return tio_fail(-EINVAL, "%s: document %llu has %llu tokens, asked for [%llu, %llu)",
                            f->rel, (unsigned long long)doc, (unsigned long long)len,
                            (unsigned long long)off, (unsigned long long)(off + n));
        memcpy(dst, ids + off, n * sizeof *dst);
        break;
    }
    }
    return rc;
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
