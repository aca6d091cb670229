/*
 * tests/c/test_data_bugs.c — one test per data-loader bug of issue 12, each
 * with the input that broke it, named after the bug; and the library's
 * ingest and state-decoding functions (issue 11) against what they write.
 */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <pthread.h>
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <cmocka.h>

#include "common/util.h"
#include "teraio/data.h"
#include "data/gen.h"
#include "teraio_config.h"
#if TIO_HAVE_ZSTD
#include <zstd.h>
#endif

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#else
#define SANITIZED 0
#endif

static char root[512];

static void sh(const char *fmt, ...)
{
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    assert_int_equal(system(cmd), 0);
}

static void write_file(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(p, 1, n, f), n);
    fclose(f);
}

/* A fresh folder "<root>-<name>" with sub-dataset folders `subs`. */
static void fresh(char *dir, size_t cap, const char *name, const char *subs)
{
    snprintf(dir, cap, "%s-%s", root, name);
    sh("rm -rf '%s' && mkdir -p '%s'", dir, dir);
    for (const char *p = subs; *p; p++)
        sh("mkdir -p '%s/%c'", dir, *p);
}

static int setup(void **state)
{
    const char *base = tio_env("TEST_TMPDIR");
    snprintf(root, sizeof root, "%s/data-bugs-%d", base ? base : "/tmp", (int)getpid());
    sh("mkdir -p '%s'", root);
    (void)state;
    return 0;
}

static int teardown(void **state)
{
    sh("rm -rf '%s' '%s'-*", root, root);
    (void)state;
    return 0;
}

static void write_text_docs(const char *path, int n, const char *fmt)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    for (int i = 0; i < n; i++) {
        fprintf(f, fmt, i);
        fputc('\n', f);
    }
    fclose(f);
}

static tio_loader *loader(tio_dataset *ds, uint32_t seq_len, uint32_t prefetch)
{
    tio_loader_options o;
    tio_loader_options_default(&o);
    o.seq_len = seq_len;
    o.logical_shards = 4;
    o.prefetch = prefetch;
    tio_loader *ld = NULL;
    int rc = tio_loader_create(ds, &o, NULL, NULL, 0, &ld);
    if (rc)
        fail_msg("create: %s", tio_last_error());
    return ld;
}

/* ---- 10: empty documents -------------------------------------------------- */

/* A JSONL sub-dataset whose texts are all "" beside one with data: refused
 * at open, naming it (it made the loader spin forever). */
static void test_all_empty_subdataset_refused_at_open(void **state)
{
    (void)state;
    char dir[700], p[800];
    fresh(dir, sizeof dir, "empty", "ae");
    snprintf(p, sizeof p, "%s/e/x.jsonl", dir);
    write_text_docs(p, 5, "{\"text\": \"\", \"n\": %d}");
    snprintf(p, sizeof p, "%s/a/x.jsonl", dir);
    write_text_docs(p, 5, "{\"text\": \"doc %d\"}");
    tio_dataset *ds = NULL;
    assert_int_equal(tio_dataset_open(dir, NULL, &ds), -ENODATA);
    assert_non_null(strstr(tio_last_error(), "sub-dataset 'e' has no tokens"));
    /* a Megatron file of zero-length documents likewise */
    sh("rm -f '%s/e/x.jsonl'", dir);
    snprintf(p, sizeof p, "%s/e/z.idx", dir);
    uint8_t idx[34 + 3 * 4 + 3 * 8 + 4 * 8] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0, 1};
    idx[17] = 4;
    idx[18] = 3; /* sequences */
    idx[26] = 4; /* document indices */
    for (int d = 0; d <= 3; d++)
        idx[34 + 12 + 24 + 8 * d] = (uint8_t)d;
    write_file(p, idx, sizeof idx);
    snprintf(p, sizeof p, "%s/e/z.bin", dir);
    write_file(p, "", 0);
    assert_int_equal(tio_dataset_open(dir, NULL, &ds), -ENODATA);
    assert_non_null(strstr(tio_last_error(), "'e' has no tokens (3 documents"));
}

/* Empty documents among others are skipped (never packed) and counted. */
static void test_empty_documents_skipped_and_counted(void **state)
{
    (void)state;
    char dir[700], p[800];
    fresh(dir, sizeof dir, "someempty", "a");
    snprintf(p, sizeof p, "%s/a/x.jsonl", dir);
    static const char docs[] = "{\"text\": \"\"}\n{\"text\": \"ab\"}\n{\"text\": \"\"}\n"
                               "{\"text\": \"cd\"}\n";
    write_file(p, docs, strlen(docs));
    tio_dataset *ds;
    assert_int_equal(tio_dataset_open(dir, NULL, &ds), 0);
    tio_loader *ld = loader(ds, 5, 0);
    for (int k = 0; k < 6; k++) {
        const tio_data_sample *s;
        assert_int_equal(tio_loader_next(ld, &s), 0);
        for (uint32_t i = 0; i < s->n_spans; i++)
            assert_true(s->spans[i].doc == 1 || s->spans[i].doc == 3);
    }
    tio_data_subdataset_info info;
    assert_int_equal(tio_dataset_info(ds, 0, &info), 0);
    assert_int_equal(info.n_empty_docs, 2);
    tio_loader_destroy(ld);
    tio_dataset_destroy(ds);
}

static void on_alarm(int sig)
{
    (void)sig;
    static const char msg[] = "the loader looped on empty documents\n";
    (void)!write(2, msg, sizeof msg - 1);
    _exit(3);
}

/* counts.csv lists an all-empty JSONL file (so open cannot know): the
 * loader fails with -ENODATA instead of drawing empty documents forever
 * (alarm: the loop was the bug). */
static void test_all_empty_documents_loader_stops(void **state)
{
    (void)state;
    char dir[700], p[800];
    fresh(dir, sizeof dir, "emptycounted", "e");
    snprintf(p, sizeof p, "%s/e/x.jsonl", dir);
    write_text_docs(p, 3, "{\"text\": \"\", \"n\": %d}");
    snprintf(p, sizeof p, "%s/counts.csv", dir);
    write_file(p, "e/x.jsonl,3,0\n", 14);
    tio_dataset *ds;
    assert_int_equal(tio_dataset_open(dir, NULL, &ds), 0);
    tio_loader *ld = loader(ds, 8, 0);
    signal(SIGALRM, on_alarm);
    alarm(60);
    const tio_data_sample *s;
    assert_int_equal(tio_loader_next(ld, &s), -ENODATA);
    alarm(0);
    assert_non_null(strstr(tio_last_error(), "'e'"));
    assert_non_null(strstr(tio_last_error(), "all empty"));
    tio_loader_destroy(ld);
    tio_dataset_destroy(ds);
}

/* ---- 11: compression bombs --------------------------------------------------- */

#if TIO_HAVE_ZSTD
/* `n` bytes of JSONL (lines of `line` bytes of text) compressed with zstd. */
static void write_zst_lines(const char *path, size_t n, size_t line)
{
    char *text = malloc(n);
    assert_non_null(text);
    size_t at = 0;
    for (size_t k = 0; at < n; k++) {
        int h = snprintf(text + at, n - at, "{\"text\": \"%zu ", k);
        at += (size_t)h < n - at ? (size_t)h : n - at;
        for (size_t i = 0; i + 4 < line && at + 3 < n; i++)
            text[at++] = (char)('a' + (k + i) % 26);
        if (at + 3 <= n) {
            memcpy(text + at, "\"}\n", 3);
            at += 3;
        } else {
            break;
        }
    }
    size_t cap = ZSTD_compressBound(at);
    void *z = malloc(cap);
    assert_non_null(z);
    size_t zn = ZSTD_compress(z, cap, text, at, 1);
    assert_false(ZSTD_isError(zn));
    write_file(path, z, zn);
    free(z);
    free(text);
}
#endif

/* A .zst holding one 80 MiB line: an error naming file and line (the
 * default limit is 64 MiB), not an 80 MiB (and more) allocation; a smaller
 * limit names the first line over it. */
static void test_compression_bomb_long_line_refused(void **state)
{
    (void)state;
#if !TIO_HAVE_ZSTD
    skip();
#else
    char dir[700], p[800];
    fresh(dir, sizeof dir, "bomb", "z");
    snprintf(p, sizeof p, "%s/z/x.jsonl.zst", dir);
    write_zst_lines(p, 80u << 20, 80u << 20);
    tio_dataset *ds;
    assert_int_equal(tio_dataset_open(dir, NULL, &ds), TIO_EPARSE);
    assert_non_null(strstr(tio_last_error(), "z/x.jsonl.zst: line 1 is longer than the limit"));
    tio_dataset_options o;
    tio_dataset_options_default(&o);
    o.max_line_bytes = 500;
    write_zst_lines(p, 10000, 400 + 0 * 1);
    assert_int_equal(tio_dataset_open(dir, &o, &ds), 0);
    tio_dataset_destroy(ds);
    sh("printf '{\"text\": \"a\"}\\n\\n{\"text\": \"%%0600d\"}\\n' 0 > '%s/z/y.jsonl'", dir);
    assert_int_equal(tio_dataset_open(dir, &o, &ds), TIO_EPARSE);
    assert_non_null(strstr(tio_last_error(), "z/y.jsonl: line 3 is longer than the limit of 500"));
#endif
}

/* 48 MiB of text in a small .zst, read whole through the loader with the
 * byte tokenizer: the reader's memory stays bounded by its window cache,
 * where it held the whole text plus 4 bytes of ids per byte (240 MiB+). */
static void test_compression_bomb_memory_bounded(void **state)
{
    (void)state;
#if !TIO_HAVE_ZSTD
    skip();
#else
    char dir[700], p[800];
    fresh(dir, sizeof dir, "bomb2", "z");
    snprintf(p, sizeof p, "%s/z/x.jsonl.zst", dir);
    write_zst_lines(p, 48u << 20, 1000);
    pid_t pid = fork();
    if (pid == 0) {
        tio_dataset_options o;
        tio_dataset_options_default(&o);
        o.cache_bytes = 8u << 20;
        tio_dataset *ds;
        if (tio_dataset_open(dir, &o, &ds))
            _exit(10);
        int64_t docs = tio_dataset_file_docs(ds, 0, 0);
        tio_data_reader *r;
        if (docs < 40000 || tio_data_reader_create(ds, &r))
            _exit(11);
        uint32_t ids[1100];
        for (int64_t d = 0; d < docs; d += 7) {
            uint64_t n;
            if (tio_data_doc_len(r, 0, 0, (uint64_t)d, &n) || n > 1100 ||
                tio_data_doc_read(r, 0, 0, (uint64_t)d, 0, n, ids))
                _exit(12);
        }
        tio_data_reader_destroy(r);
        tio_dataset_destroy(ds);
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        /* sanitizers keep freed memory in quarantine: their RSS says nothing */
        _exit(!SANITIZED && ru.ru_maxrss > 120 * 1024 ? 13 : 0);
    }
    int status;
    waitpid(pid, &status, 0);
    assert_true(WIFEXITED(status));
    if (WEXITSTATUS(status) == 13)
        fail_msg("peak RSS above 120 MiB reading 48 MiB of compressed JSONL");
    assert_int_equal(WEXITSTATUS(status), 0);
#endif
}

static int count_doc(void *arg, uint64_t doc, const uint32_t *ids, uint64_t n)
{
    uint64_t *seen = arg;
    if (doc != seen[0] || n != 241 || ids[0] != 'w')
        return -EBADMSG;
    seen[0]++;
    return 0;
}

/* A 20 MiB JSONL file (three windows), blank lines every 1000: a bad line
 * past the first window is named by its true line number, and a scan in
 * order reads every document once (windows in order continue the stream:
 * the .zst is decompressed once, not once per window). */
static void test_jsonl_windows_line_numbers_and_scan(void **state)
{
    (void)state;
    char dir[700], p[800];
    fresh(dir, sizeof dir, "windows", "w");
    snprintf(p, sizeof p, "%s/w/x.jsonl", dir);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    uint64_t lines = 0, docs = 0, bad_line = 0, bad_doc = 0;
    for (uint64_t k = 0; k < 80000; k++) {
        if (k % 1000 == 999) {
            fputs("   \n", f);
            lines++;
            continue;
        }
        lines++;
        if (k == 70001) {
            fputs("{\"text\": \"broken\\q\"}\n", f);
            bad_line = lines;
            bad_doc = docs;
        } else {
            fprintf(f, "{\"text\": \"w%0240llu\"}\n", (unsigned long long)k);
        }
        docs++;
    }
    fclose(f);
    tio_dataset *ds;
    assert_int_equal(tio_dataset_open(dir, NULL, &ds), 0);
    assert_int_equal(tio_dataset_file_docs(ds, 0, 0), (int64_t)docs);
    uint32_t *ids;
    uint64_t n;
    assert_int_equal(tio_dataset_read_doc(ds, 0, 0, bad_doc, &ids, &n), TIO_EPARSE);
    char want[128];
    snprintf(want, sizeof want, "w/x.jsonl: line %llu (document %llu)",
             (unsigned long long)bad_line, (unsigned long long)bad_doc);
    if (!strstr(tio_last_error(), want))
        fail_msg("wanted '%s' in: %s", want, tio_last_error());
    uint64_t unit, row;
    assert_int_equal(tio_dataset_doc_location(ds, 0, 0, bad_doc, &unit, &row), 0);
    assert_true(unit >= 2);
    tio_dataset_destroy(ds);
    sh("rm -f '%s/w/x.jsonl.zst' && sed -i '%llud' '%s/w/x.jsonl' && zstd -q --rm '%s/w/x.jsonl'",
       dir, (unsigned long long)bad_line, dir, dir);
    assert_int_equal(tio_dataset_open(dir, NULL, &ds), 0);
    uint64_t seen[1] = {0};
    assert_int_equal(tio_dataset_scan_file(ds, 0, 0, count_doc, seen), 0);
    assert_int_equal(seen[0], docs - 1);
    /* one reader jumping forward, back and forward again across the windows
     * reads what a fresh reader reads */
    tio_data_reader *r;
    assert_int_equal(tio_data_reader_create(ds, &r), 0);
    static const uint64_t order[] = {10, 70000, 40000, 5, 79000, 39999, 79001};
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
        uint32_t got[241];
        assert_int_equal(tio_data_doc_len(r, 0, 0, order[i], &n), 0);
        assert_int_equal(n, 241);
        assert_int_equal(tio_data_doc_read(r, 0, 0, order[i], 0, n, got), 0);
        assert_int_equal(tio_dataset_read_doc(ds, 0, 0, order[i], &ids, &n), 0);
        assert_memory_equal(got, ids, sizeof got);
        free(ids);
    }
    tio_data_reader_destroy(r);
    tio_dataset_destroy(ds);
}

/* ---- 15: crafted states --------------------------------------------------------- */

static void recrc(uint8_t *st, size_t len)
{
    uint32_t crc = tio_crc32(st, len - 4);
    memcpy(st + len - 4, &crc, 4);
}

static void one_doc_dataset(char *dir, size_t cap, const char *name)
{
    char p[800];
    fresh(dir, cap, name, "a");
    snprintf(p, sizeof p, "%s/a/x.jsonl", dir);
    write_text_docs(p, 40, "{\"text\": \"document number %d\"}");
}

/* logical_shards = 2^28 in a state with its CRC recomputed, used as a CLI's
 * inspect does (settings from the state): refused before anything is sized
 * by it (it allocated 2 GiB per sub-dataset).  Run under a 1 GiB address
 * space limit where no sanitizer reserves its shadow memory. */
static void test_crafted_state_huge_logical_shards(void **state)
{
    (void)state;
    char dir[700];
    one_doc_dataset(dir, sizeof dir, "crafted");
    tio_dataset *ds;
    assert_int_equal(tio_dataset_open(dir, NULL, &ds), 0);
    tio_loader *ld = loader(ds, 8, 0);
    void *st;
    size_t len;
    assert_int_equal(tio_loader_state(ld, &st, &len), 0);
    tio_loader_destroy(ld);
    uint32_t L = 1u << 28;
    memcpy((uint8_t *)st + 28, &L, 4);
    recrc(st, len);
    pid_t pid = fork();
    if (pid == 0) {
        if (!SANITIZED) {
            struct rlimit rl = {1u << 30, 1u << 30};
            setrlimit(RLIMIT_AS, &rl);
        }
        tio_loader_options o;
        tio_loader_options_default(&o);
        o.seq_len = 8;
        o.prefetch = 0;
        o.logical_shards = L;
        tio_loader *l2;
        int rc = tio_loader_create(ds, &o, (const void *const *)&st, &len, 1, &l2);
        _exit(rc == -EINVAL || rc == TIO_ESTATE ? 0 : 1);
    }
    int status;
    waitpid(pid, &status, 0);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    /* with the caller's own settings it is refused as a state of others */
    tio_loader_options o;
    tio_loader_options_default(&o);
    o.seq_len = 8;
    o.logical_shards = 4;
    assert_int_equal(tio_loader_create(ds, &o, (const void *const *)&st, &len, 1, &ld),
                     TIO_ESTATE);
    free(st);
    tio_dataset_destroy(ds);
}

/* A shard index listed twice (CRC recomputed): refused, where one shard's
 * position was silently lost. */
static void test_crafted_state_duplicate_shard(void **state)
{
    (void)state;
    char dir[700];
    one_doc_dataset(dir, sizeof dir, "dupshard");
    tio_dataset *ds;
    assert_int_equal(tio_dataset_open(dir, NULL, &ds), 0);
    tio_loader *ld = loader(ds, 8, 0);
    const tio_data_sample *s;
    assert_int_equal(tio_loader_next(ld, &s), 0);
    void *st;
    size_t len;
    assert_int_equal(tio_loader_state(ld, &st, &len), 0);
    tio_loader_destroy(ld);
    /* header 52 bytes, sub-dataset: name length 4, "a", fingerprint 8,
     * weight 8, tokens 8, shard count 4, then 32-byte shard entries */
    size_t first = 52 + 4 + 1 + 8 + 8 + 8 + 4;
    memcpy((uint8_t *)st + first + 32, (uint8_t *)st + first, 4);
    recrc(st, len);
    tio_loader_options o;
    tio_loader_options_default(&o);
    o.seq_len = 8;
    o.logical_shards = 4;
    o.prefetch = 0;
    assert_int_equal(tio_loader_create(ds, &o, (const void *const *)&st, &len, 1, &ld),
                     TIO_EPARSE);
    assert_non_null(strstr(tio_last_error(), "shard 0 given twice"));
    free(st);
    tio_dataset_destroy(ds);
}

/* ---- 18: the first-open error message ----------------------------------------- */

typedef struct {
    tio_dataset *ds;
    char msg[1024];
} reader_arg;

static void *read_first(void *arg)
{
    reader_arg *a = arg;
    uint32_t *ids;
    uint64_t n;
    int rc = tio_dataset_read_doc(a->ds, 0, 0, 0, &ids, &n);
    snprintf(a->msg, sizeof a->msg, "%d %s", rc, tio_last_error());
    return NULL;
}

/* counts.csv says 9 documents of a file of 5: every reader, on every
 * thread, first or later, gets the mismatch message, where later ones got
 * "malformed input (when first opened)". */
static void test_counts_mismatch_message_on_every_thread(void **state)
{
    (void)state;
    char dir[700], p[800];
    fresh(dir, sizeof dir, "countsmsg", "a");
    snprintf(p, sizeof p, "%s/a/x.jsonl", dir);
    write_text_docs(p, 5, "{\"text\": \"doc %d\"}");
    snprintf(p, sizeof p, "%s/counts.csv", dir);
    write_file(p, "a/x.jsonl,9,0\n", 14);
    tio_dataset *ds;
    assert_int_equal(tio_dataset_open(dir, NULL, &ds), 0);
    reader_arg args[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        args[i].ds = ds;
        assert_int_equal(pthread_create(&th[i], NULL, read_first, &args[i]), 0);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    read_first(&args[0]); /* a later read on this thread */
    for (int i = 0; i < 4; i++)
        if (!strstr(args[i].msg, "a/x.jsonl: counts.csv says 9 documents, the file holds 5"))
            fail_msg("reader %d: %s", i, args[i].msg);
    tio_dataset_destroy(ds);
}

/* ---- 7: prefetch out of range ------------------------------------------------------ */

/* prefetch = 2^31 (Python passed it): -EINVAL naming the limit, where the
 * allocation failed and destroy walked a NULL slot array. */
static void test_prefetch_2pow31_refused(void **state)
{
    (void)state;
    char dir[700];
    one_doc_dataset(dir, sizeof dir, "prefetch");
    tio_dataset *ds;
    assert_int_equal(tio_dataset_open(dir, NULL, &ds), 0);
    tio_loader_options o;
    tio_loader_options_default(&o);
    o.seq_len = 8;
    o.logical_shards = 4;
    o.prefetch = 1u << 31;
    tio_loader *ld = (tio_loader *)&o;
    assert_int_equal(tio_loader_create(ds, &o, NULL, NULL, 0, &ld), -EINVAL);
    assert_null(ld);
    assert_non_null(strstr(tio_last_error(), "prefetch (2147483648 samples) must be at most 65536"));
    o.prefetch = 8;
    o.shuffle_buffer = 1u << 31;
    assert_int_equal(tio_loader_create(ds, &o, NULL, NULL, 0, &ld), -EINVAL);
    o.shuffle_buffer = 4;
    o.weights = NULL;
    o.n_weights = 1;
    assert_int_equal(tio_loader_create(ds, &o, NULL, NULL, 0, &ld), -EINVAL);
    static const char *names[] = {"a"};
    static const double huge[] = {1e308};
    o.weight_names = names;
    o.weights = huge;
    assert_int_equal(tio_loader_create(ds, &o, NULL, NULL, 0, &ld), -EINVAL);
    assert_non_null(strstr(tio_last_error(), "weight of 'a' is 1e+308: it must be a number from 0 to"));
    tio_dataset_destroy(ds);
}

/* ---- 13: stale temporary files of state saves ---------------------------------------- */

static int count_temps(const char *dir, const char *base)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *de;
    size_t b = strlen(base);
    while ((de = readdir(d)) != NULL)
        n += !strncmp(de->d_name, base, b) && !strncmp(de->d_name + b, ".tmp.", 5);
    closedir(d);
    return n;
}

/* A save removes the temporaries of saves by processes that are gone (no
 * one holds their lock), keeps a live saver's (locked) and unrelated files;
 * kill -9 during saves leaves none once the next save ran (500 such saves
 * left 369 behind). */
static void test_stale_state_temps_cleaned_at_save(void **state)
{
    (void)state;
    char dir[700], path[800], p[900];
    one_doc_dataset(dir, sizeof dir, "stale");
    snprintf(path, sizeof path, "%s/s.state", dir);
    static const char *const names[] = {"%s.tmp.1f2e.00000000deadbeef", "%s.tmp.4d2",
                                        "%s.tmp.77.0123456789abcdef", "%s.tmpx.1f2e"};
    for (int k = 0; k < 4; k++) {
        snprintf(p, sizeof p, names[k], path);
        write_file(p, "junk", 4);
    }
    snprintf(p, sizeof p, names[2], path);
    int lk[2];
    assert_int_equal(pipe(lk), 0);
    pid_t live = fork();
    if (live == 0) { /* a saver that is still writing: it holds the lock */
        int fd = open(p, O_RDWR);
        if (fd < 0 || flock(fd, LOCK_EX) != 0)
            _exit(1);
        (void)!write(lk[1], "x", 1);
        pause();
        _exit(0);
    }
    char c;
    assert_int_equal(read(lk[0], &c, 1), 1);
    tio_dataset *ds;
    assert_int_equal(tio_dataset_open(dir, NULL, &ds), 0);
    tio_loader *ld = loader(ds, 8, 0);
    assert_int_equal(tio_loader_save(ld, path), 0);
    assert_int_equal(count_temps(dir, "s.state"), 1); /* the live one */
    assert_int_equal(access(p, F_OK), 0);
    snprintf(p, sizeof p, names[3], path);
    assert_int_equal(access(p, F_OK), 0);
    kill(live, SIGKILL);
    waitpid(live, NULL, 0);
    close(lk[0]);
    close(lk[1]);
    /* kill -9 in the middle of saves, then one more save */
    for (int round = 0; round < 5; round++) {
        pid_t pid = fork();
        if (pid == 0)
            for (;;)
                if (tio_loader_save(ld, path))
                    _exit(1);
        usleep(20000 + 3000 * round);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    assert_int_equal(tio_loader_save(ld, path), 0);
    assert_int_equal(count_temps(dir, "s.state"), 0);
    tio_loader_destroy(ld);
    tio_dataset_destroy(ds);
}

/* ---- issue 11: ingest and state decoding in the library ---------------------------------- */

/* tio_data_ingest writes a pair per text file that reads back as the same
 * ids, and a counts.csv the dataset applies; tio_loader_state_info decodes
 * what tio_loader_state wrote. */
static void test_ingest_and_state_info(void **state)
{
    (void)state;
    char dir[700], out[800], p[900];
    fresh(dir, sizeof dir, "ingest", "ab");
    snprintf(p, sizeof p, "%s/a/x.jsonl", dir);
    write_text_docs(p, 7, "{\"text\": \"alpha %d\"}");
    snprintf(p, sizeof p, "%s/b/deep", dir);
    sh("mkdir -p '%s'", p);
    snprintf(p, sizeof p, "%s/b/deep/y.jsonl", dir);
    write_text_docs(p, 3, "{\"text\": \"beta beta %d\"}");
    snprintf(out, sizeof out, "%s-out", dir);
    sh("rm -rf '%s'", out);
    tio_data_ingest_result res;
    assert_int_equal(tio_data_ingest(dir, out, NULL, &res), 0);
    assert_int_equal(res.n_files, 2);
    assert_int_equal(res.n_docs, 10);
    assert_int_equal(res.n_tokens, 7 * 7 + 3 * 11);
    assert_int_equal(res.dtype, 8);
    size_t len;
    snprintf(p, sizeof p, "%s/counts.csv", out);
    FILE *f = fopen(p, "r");
    assert_non_null(f);
    char buf[512] = "";
    len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    assert_non_null(strstr(buf, "\na/x.bin,7,49\nb/deep/y.bin,3,33\n"));
    tio_dataset *ds;
    assert_int_equal(tio_dataset_open(out, NULL, &ds), 0);
    assert_string_equal(tio_dataset_file_format(ds, 1, 0), "Megatron");
    uint32_t *ids;
    uint64_t n;
    assert_int_equal(tio_dataset_read_doc(ds, 1, 0, 2, &ids, &n), 0);
    assert_int_equal(n, 11);
    static const uint32_t beta2[11] = {'b', 'e', 't', 'a', ' ', 'b', 'e', 't', 'a', ' ', '2'};
    assert_memory_equal(ids, beta2, sizeof beta2);
    free(ids);
    tio_loader_options o;
    tio_loader_options_default(&o);
    o.seq_len = 6;
    o.logical_shards = 5;
    o.shuffle_buffer = 3;
    o.prefetch = 2;
    tio_loader *ld;
    assert_int_equal(tio_loader_create(ds, &o, NULL, NULL, 0, &ld), 0);
    const tio_data_sample *s;
    for (int k = 0; k < 4; k++)
        assert_int_equal(tio_loader_next(ld, &s), 0);
    void *st;
    assert_int_equal(tio_loader_state(ld, &st, &len), 0);
    tio_data_state_info info;
    assert_int_equal(tio_loader_state_info(st, len, &info), 0);
    assert_int_equal(info.rank, 0);
    assert_int_equal(info.world_size, 1);
    assert_int_equal(info.logical_shards, 5);
    assert_int_equal(info.seq_len, 6);
    assert_int_equal(info.shuffle_buffer, 3);
    assert_int_equal(info.samples, 4);
    assert_int_equal(info.n_subdatasets, 2);
    ((uint8_t *)st)[20] ^= 1;
    assert_int_equal(tio_loader_state_info(st, len, &info), TIO_ECORRUPT);
    free(st);
    tio_loader_destroy(ld);
    tio_dataset_destroy(ds);
    /* a writer given up leaves no file under the final names */
    tio_mmidx_writer *w;
    snprintf(p, sizeof p, "%s/gone", out);
    assert_int_equal(tio_mmidx_writer_create(p, 8, &w), 0);
    static const uint32_t too_big[2] = {1, 70000};
    assert_int_equal(tio_mmidx_writer_add(w, too_big, 2), -ERANGE);
    tio_mmidx_writer_destroy(w);
    snprintf(p, sizeof p, "%s/gone.bin", out);
    assert_int_equal(access(p, F_OK), -1);
    assert_int_equal(count_temps(out, "gone.bin"), 0);
}

/* ---- Parquet through the shim (issue 18), on files pyarrow wrote (the fuzz
 * seeds): text rows in three row groups with a null and an empty row,
 * token lists; under ThreadSanitizer the shim is not built and Parquet is
 * refused with the reason. */
static void test_parquet_rows_read_through_the_shim(void **state)
{
    (void)state;
    char dir[700];
    const char *src = tio_env("SOURCE_DIR");
    fresh(dir, sizeof dir, "parquet", "tp");
    sh("cp '%s/fuzz/corpus/fuzz_data_parquet/text_null.parquet' '%s/t/x.parquet' && "
       "cp '%s/fuzz/corpus/fuzz_data_parquet/tokens_uint16.parquet' '%s/p/y.parquet'",
       src ? src : ".", dir, src ? src : ".", dir);
    const char *why;
    tio_dataset_options o;
    tio_dataset_options_default(&o);
    o.jsonl_errors = TIO_DATA_JSONL_SKIP;
    tio_dataset *ds;
    if (!tio_data_parquet_available(&why)) {
        assert_int_equal(tio_dataset_open(dir, &o, &ds), -ENOTSUP);
        assert_non_null(strstr(tio_last_error(), "Parquet is unavailable: "));
        assert_non_null(strstr(tio_last_error(), why));
        return;
    }
    assert_int_equal(tio_dataset_open(dir, &o, &ds), 0);
    assert_int_equal(tio_dataset_file_docs(ds, 0, 0), 3);
    assert_int_equal(tio_dataset_file_docs(ds, 1, 0), 5);
    assert_string_equal(tio_dataset_file_format(ds, 1, 0), "Parquet text");
    static const char *const texts[5] = {"alpha beta", "", "gamma", "", "delta epsilon"};
    for (uint64_t d = 0; d < 5; d++) {
        uint32_t *ids;
        uint64_t n;
        assert_int_equal(tio_dataset_read_doc(ds, 1, 0, d, &ids, &n), 0);
        assert_int_equal(n, strlen(texts[d]));
        for (uint64_t i = 0; i < n; i++)
            assert_int_equal(ids[i], (unsigned char)texts[d][i]);
        free(ids);
    }
    uint64_t unit, row;
    assert_int_equal(tio_dataset_doc_location(ds, 1, 0, 4, &unit, &row), 0);
    assert_int_equal(unit, 2);
    assert_int_equal(row, 0);
    tio_data_subdataset_info info;
    assert_int_equal(tio_dataset_info(ds, 1, &info), 0);
    assert_int_equal(info.lines_skipped, 1);
    assert_int_equal(info.n_empty_docs, 1);
    /* the loader over both, with its threads */
    tio_loader *ld = loader(ds, 6, 4);
    for (int k = 0; k < 20; k++) {
        const tio_data_sample *smp;
        assert_int_equal(tio_loader_next(ld, &smp), 0);
        for (uint32_t i = 0; i < smp->n_spans; i++)
            assert_false(smp->spans[i].subdataset == 1 && smp->spans[i].doc == 1);
    }
    tio_loader_destroy(ld);
    tio_dataset_destroy(ds);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_all_empty_subdataset_refused_at_open),
        cmocka_unit_test(test_empty_documents_skipped_and_counted),
        cmocka_unit_test(test_all_empty_documents_loader_stops),
        cmocka_unit_test(test_compression_bomb_long_line_refused),
        cmocka_unit_test(test_compression_bomb_memory_bounded),
        cmocka_unit_test(test_jsonl_windows_line_numbers_and_scan),
        cmocka_unit_test(test_crafted_state_huge_logical_shards),
        cmocka_unit_test(test_crafted_state_duplicate_shard),
        cmocka_unit_test(test_counts_mismatch_message_on_every_thread),
        cmocka_unit_test(test_prefetch_2pow31_refused),
        cmocka_unit_test(test_stale_state_temps_cleaned_at_save),
        cmocka_unit_test(test_ingest_and_state_info),
        cmocka_unit_test(test_parquet_rows_read_through_the_shim),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
