/*
 * tests/c/test_data.c — the data loader on datasets written by the test:
 * each format reader returns the exact tokens written; the bijection is a
 * permutation; resuming is bit-identical; rescaling N -> M ranks delivers
 * every document chunk of an epoch exactly once; mixing meets its weights;
 * bad files and bad states fail with a message naming them.
 *
 * Document d of file f of sub-dataset s has doc_len(s, f, d) tokens, token i
 * being tok(s, f, d, i), so any span can be checked against its provenance.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <cmocka.h>

#include "common/util.h"
#include "teraio/data.h"
#include "data/gen.h"

static char root[512];

static uint32_t doc_len(int s, int f, int d)
{
    return d % 13 == 5 ? 150 + (uint32_t)f : 1 + (uint32_t)((d * 37 + f * 11 + s * 5) % 60);
}

static uint32_t tok(int s, int f, int d, uint32_t i)
{
    return 1 + (uint32_t)((s * 1000003u + f * 7919u + d * 31u + i * 17u) % 250u);
}

static void mkdirs(const char *path)
{
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            mkdir(tmp, 0755);
            *p = '/';
        }
    mkdir(tmp, 0755);
}

static void write_bytes(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(p, 1, n, f), n);
    fclose(f);
}

/* Megatron pair with `ndocs` documents, each split into two sequences
 * when longer than 3 tokens; dtype int32 (code 4) or uint16 (code 8). */
static void write_megatron(const char *prefix, int s, int f, int ndocs, int code)
{
    char path[1100];
    int w = code == 4 ? 4 : 2;
    FILE *bin, *idx;
    snprintf(path, sizeof path, "%s.bin", prefix);
    assert_non_null(bin = fopen(path, "wb"));
    int32_t lens[256];
    int64_t ptrs[256], docidx[129];
    int nseq = 0;
    int64_t at = 0;
    docidx[0] = 0;
    for (int d = 0; d < ndocs; d++) {
        uint32_t n = doc_len(s, f, d), cut = n > 3 ? n / 2 : n;
        for (uint32_t part = 0; part < (cut < n ? 2u : 1u); part++) {
            uint32_t a = part ? cut : 0, b = part ? n : cut;
            for (uint32_t i = a; i < b; i++) {
                uint32_t v = tok(s, f, d, i);
                if (w == 4) {
                    int32_t x = (int32_t)v;
                    fwrite(&x, 4, 1, bin);
                } else {
                    uint16_t x = (uint16_t)v;
                    fwrite(&x, 2, 1, bin);
                }
            }
            lens[nseq] = (int32_t)(b - a);
            ptrs[nseq] = at;
            at += (b - a) * w;
            nseq++;
        }
        docidx[d + 1] = nseq;
    }
    fclose(bin);
    snprintf(path, sizeof path, "%s.idx", prefix);
    assert_non_null(idx = fopen(path, "wb"));
    uint64_t version = 1, ns = (uint64_t)nseq, nd = (uint64_t)ndocs + 1;
    uint8_t dt = (uint8_t)code;
    fwrite("MMIDIDX\0\0", 1, 9, idx);
    fwrite(&version, 8, 1, idx);
    fwrite(&dt, 1, 1, idx);
    fwrite(&ns, 8, 1, idx);
    fwrite(&nd, 8, 1, idx);
    fwrite(lens, 4, ns, idx);
    fwrite(ptrs, 8, ns, idx);
    fwrite(docidx, 8, nd, idx);
    fclose(idx);
}

/* llm.c GPT-2 shard: each document preceded by the delimiter 50256. */
static void write_llmc(const char *path, int s, int f, int ndocs)
{
    int32_t header[256] = {20240520, 1, 0};
    uint16_t *toks = malloc(20000 * 2);
    uint32_t n = 0;
    for (int d = 0; d < ndocs; d++) {
        toks[n++] = 50256;
        for (uint32_t i = 0; i < doc_len(s, f, d); i++)
            toks[n++] = (uint16_t)tok(s, f, d, i);
    }
    header[2] = (int32_t)n;
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    fwrite(header, 4, 256, fp);
    fwrite(toks, 2, n, fp);
    fclose(fp);
    free(toks);
}

/* JSONL token values stay ASCII (1..126) so that the byte tokenizer gives
 * them back; control characters, '"' and '\\' are written as \u escapes. */
static uint32_t jtok(int s, int f, int d, uint32_t i) { return 1 + tok(s, f, d, i) % 126; }

static void write_jsonl(const char *path, int s, int f, int ndocs)
{
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    for (int d = 0; d < ndocs; d++) {
        fprintf(fp, "{\"id\": %d, \"meta\": {\"a\": [1, 2.5e3, null, true]}, \"text\": \"", d);
        for (uint32_t i = 0; i < doc_len(s, f, d); i++) {
            uint32_t c = jtok(s, f, d, i);
            if (c < 0x20 || c == '"' || c == '\\')
                fprintf(fp, "\\u%04x", c);
            else
                fputc((int)c, fp);
        }
        fprintf(fp, "\"}\n");
        if (d == 2)
            fprintf(fp, "   \n"); /* blank lines are not documents */
    }
    fclose(fp);
}

static uint32_t expect_tok(const char *sub, int f, int d, uint32_t i)
{
    int s = sub[0] - 'a';
    return !strcmp(sub, "c") ? jtok(s, f, d, i) : tok(s, f, d, i);
}

/* root/a: 2 Megatron files (int32, uint16), root/b/x/y: 1 llm.c shard,
 * root/c: 2 JSONL files. */
static void make_dataset(const char *dir)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/a", dir);
    mkdirs(p);
    snprintf(p, sizeof p, "%s/a/part0", dir);
    write_megatron(p, 0, 0, 40, 4);
    snprintf(p, sizeof p, "%s/a/part1", dir);
    write_megatron(p, 0, 1, 25, 8);
    snprintf(p, sizeof p, "%s/b/x/y", dir);
    mkdirs(p);
    snprintf(p, sizeof p, "%s/b/x/y/shard.bin", dir);
    write_llmc(p, 1, 0, 50);
    snprintf(p, sizeof p, "%s/c", dir);
    mkdirs(p);
    snprintf(p, sizeof p, "%s/c/0.jsonl", dir);
    write_jsonl(p, 2, 0, 30);
    snprintf(p, sizeof p, "%s/c/1.jsonl", dir);
    write_jsonl(p, 2, 1, 12);
}

static int setup(void **state)
{
    const char *base = tio_env("TEST_TMPDIR");
    snprintf(root, sizeof root, "%s/data-%d", base ? base : "/tmp", (int)getpid());
    mkdirs(root);
    make_dataset(root);
    (void)state;
    return 0;
}

static int teardown(void **state)
{
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'-*", root, root); /* and the tests' siblings */
    (void)!system(cmd);
    (void)state;
    return 0;
}

static tio_dataset *open_ds(void)
{
    tio_dataset *ds = NULL;
    int rc = tio_dataset_open(root, NULL, &ds);
    if (rc)
        fprintf(stderr, "%s\n", tio_last_error());
    assert_int_equal(rc, 0);
    return ds;
}

static void test_readers_exact(void **state)
{
    (void)state;
    tio_dataset *ds = open_ds();
    assert_int_equal(tio_dataset_n_subdatasets(ds), 3);
    static const char *names[] = {"a", "b", "c"};
    static const uint64_t docs[] = {65, 50, 42};
    for (uint32_t s = 0; s < 3; s++) {
        tio_data_subdataset_info info;
        assert_int_equal(tio_dataset_info(ds, s, &info), 0);
        assert_string_equal(info.name, names[s]);
        assert_int_equal(info.n_docs, docs[s]);
        for (uint32_t f = 0; f < info.n_files; f++) {
            int64_t nd = tio_dataset_file_docs(ds, s, f);
            for (int64_t d = 0; d < nd; d++) {
                uint32_t *ids;
                uint64_t n;
                assert_int_equal(tio_dataset_read_doc(ds, s, f, (uint64_t)d, &ids, &n), 0);
                assert_int_equal(n, doc_len((int)s, (int)f, (int)d));
                for (uint64_t i = 0; i < n; i++)
                    assert_int_equal(ids[i], expect_tok(names[s], (int)f, (int)d, (uint32_t)i));
                free(ids);
            }
        }
    }
    assert_string_equal(tio_dataset_file_path(ds, 1, 0), "b/x/y/shard.bin");
    assert_string_equal(tio_dataset_file_path(ds, 0, 1), "a/part1.bin");
    tio_dataset_destroy(ds);
}

static void test_permutation(void **state)
{
    (void)state;
    uint8_t *seen = malloc(5000);
    for (uint64_t n = 1; n < 5000; n = n < 70 ? n + 1 : n * 3 / 2) {
        for (uint64_t key = 0; key < 3; key++) {
            memset(seen, 0, n);
            for (uint64_t i = 0; i < n; i++) {
                uint64_t p = tio_permute(i, n, key * 0x9E37 + n);
                assert_true(p < n);
                assert_int_equal(seen[p], 0);
                seen[p] = 1;
            }
        }
    }
    /* different keys give different orders */
    int same = 0;
    for (uint64_t i = 0; i < 100; i++)
        same += tio_permute(i, 100, 1) == tio_permute(i, 100, 2);
    assert_true(same < 20);
    free(seen);
}

/* ---- loader runs --------------------------------------------------------- */

typedef struct {
    uint64_t seq_len, shuffle, L, prefetch, seed;
    const double *weights; /* of a, b, c; NULL: 1 each */
} cfg;

static tio_loader *make_loader(tio_dataset *ds, cfg c, uint32_t rank, uint32_t world,
                               void **states, size_t *lens, uint32_t n)
{
    tio_loader_options o;
    tio_loader_options_default(&o);
    o.seq_len = (uint32_t)c.seq_len;
    o.shuffle_buffer = (uint32_t)c.shuffle;
    o.logical_shards = (uint32_t)c.L;
    o.prefetch = (uint32_t)c.prefetch;
    o.seed = c.seed;
    o.rank = rank;
    o.world_size = world;
    o.eos_id = 9999;
    static const char *names[] = {"a", "b", "c"};
    if (c.weights) {
        o.n_weights = 3;
        o.weight_names = names;
        o.weights = c.weights;
    }
    tio_loader *ld = NULL;
    int rc = tio_loader_create(ds, &o, (const void *const *)states, lens, n, &ld);
    if (rc)
        fprintf(stderr, "create: %s\n", tio_last_error());
    assert_int_equal(rc, 0);
    return ld;
}

/* Check a sample's tokens against its spans; append epoch-`epoch` spans. */
typedef struct {
    tio_data_span *v;
    size_t n, cap;
    uint64_t tokens;
} span_list;

static void check_sample(const tio_data_sample *s, span_list *out, uint32_t epoch)
{
    uint32_t at = 0;
    for (uint32_t k = 0; k < s->n_spans; k++) {
        const tio_data_span *sp = &s->spans[k];
        int sub = (int)sp->subdataset, f = (int)sp->file, d = (int)sp->doc;
        uint32_t len = doc_len(sub, f, d);
        for (uint32_t i = 0; i < sp->length; i++) {
            uint32_t p = sp->offset + i;
            uint32_t want = p == len ? 9999 : sub == 2 ? jtok(sub, f, d, p) : tok(sub, f, d, p);
            assert_int_equal(s->tokens[at + i], want);
        }
        at += sp->length;
        if (sp->epoch == epoch && out) {
            if (out->n == out->cap) {
                out->cap = out->cap ? out->cap * 2 : 1024;
                out->v = realloc(out->v, out->cap * sizeof *out->v);
            }
            out->v[out->n++] = *sp;
            out->tokens += sp->length;
        }
    }
    assert_int_equal(at, s->seq_len + 1);
    assert_int_equal(s->cu_seqlens[0], 0);
    assert_int_equal(s->cu_seqlens[s->n_segments], s->seq_len);
    for (uint32_t g = 0; g < s->n_segments; g++)
        assert_int_equal(s->position_ids[s->cu_seqlens[g]], 0);
}

static int cmp_span(const void *a, const void *b)
{
    const tio_data_span *x = a, *y = b;
    if (x->subdataset != y->subdataset)
        return x->subdataset < y->subdataset ? -1 : 1;
    if (x->file != y->file)
        return x->file < y->file ? -1 : 1;
    if (x->doc != y->doc)
        return x->doc < y->doc ? -1 : 1;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static uint64_t sub_tokens(tio_dataset *ds, unsigned mask)
{
    uint64_t t = 0;
    for (uint32_t s = 0; s < 3; s++) {
        if (!(mask >> s & 1))
            continue;
        tio_data_subdataset_info info;
        tio_dataset_info(ds, s, &info);
        for (uint32_t f = 0; f < info.n_files; f++)
            for (int64_t d = 0; d < tio_dataset_file_docs(ds, s, f); d++)
                t += doc_len((int)s, (int)f, (int)d) + 1;
    }
    return t;
}

static uint64_t epoch_tokens(tio_dataset *ds) { return sub_tokens(ds, 7); }

/* Every document of the sub-datasets in `mask` tiled exactly once by the
 * spans, and no other span. */
static void assert_subs_exactly_once(tio_dataset *ds, span_list *l, unsigned mask)
{
    qsort(l->v, l->n, sizeof *l->v, cmp_span);
    size_t k = 0;
    for (uint32_t s = 0; s < 3; s++) {
        if (!(mask >> s & 1))
            continue;
        tio_data_subdataset_info info;
        tio_dataset_info(ds, s, &info);
        for (uint32_t f = 0; f < info.n_files; f++)
            for (int64_t d = 0; d < tio_dataset_file_docs(ds, s, f); d++) {
                uint32_t want = doc_len((int)s, (int)f, (int)d) + 1, at = 0;
                while (k < l->n && l->v[k].subdataset == s && l->v[k].file == f &&
                       l->v[k].doc == (uint64_t)d) {
                    assert_int_equal(l->v[k].offset, at);
                    at += l->v[k].length;
                    k++;
                }
                if (at != want)
                    fail_msg("sub %u file %u doc %lld: covered %u of %u", s, f, (long long)d, at, want);
            }
    }
    assert_int_equal(k, l->n);
}

static void assert_exactly_once(tio_dataset *ds, span_list *l) { assert_subs_exactly_once(ds, l, 7); }

/* Run `world` ranks (from `states` if given) round-robin until `steps`
 * samples each, or (steps == 0) until epoch 0 is complete. */
static void run_ranks(tio_dataset *ds, cfg c, uint32_t world, void **in_states, size_t *in_lens,
                      uint32_t n_in, uint32_t steps, span_list *spans, void **out_states,
                      size_t *out_lens)
{
    tio_loader **ld = calloc(world, sizeof *ld);
    for (uint32_t r = 0; r < world; r++)
        ld[r] = make_loader(ds, c, r, world, in_states, in_lens, n_in);
    uint64_t total = epoch_tokens(ds);
    for (uint32_t step = 0; steps ? step < steps : spans->tokens < total; step++) {
        assert_true(step < 100000);
        for (uint32_t r = 0; r < world; r++) {
            const tio_data_sample *s;
            int rc = tio_loader_next(ld[r], &s);
            if (rc)
                fail_msg("next: %s", tio_last_error());
            check_sample(s, spans, 0);
        }
    }
    for (uint32_t r = 0; r < world; r++) {
        if (out_states)
            assert_int_equal(tio_loader_state(ld[r], &out_states[r], &out_lens[r]), 0);
        tio_loader_destroy(ld[r]);
    }
    free(ld);
}

static void test_rescale_exactly_once(void **state)
{
    (void)state;
    tio_dataset *ds = open_ds();
    static const uint32_t pairs[][2] = {{1, 1}, {2, 3}, {3, 2}, {4, 1}, {1, 4}, {5, 3}, {2, 7}, {4, 4}};
    for (size_t k = 0; k < sizeof pairs / sizeof pairs[0]; k++) {
        uint32_t N = pairs[k][0], M = pairs[k][1];
        cfg c = {.seq_len = 16 + 7 * k, .shuffle = k % 3 ? 4 : 0, .L = 8 + 3 * k,
                 .prefetch = k % 2 ? 3 : 0, .seed = 1000 + k};
        span_list spans = {0};
        void *st[8];
        size_t lens[8];
        run_ranks(ds, c, N, NULL, NULL, 0, 5 + (uint32_t)k * 3, &spans, st, lens);
        run_ranks(ds, c, M, st, lens, N, 0, &spans, NULL, NULL);
        assert_int_equal(spans.tokens, epoch_tokens(ds));
        assert_exactly_once(ds, &spans);
        for (uint32_t r = 0; r < N; r++)
            free(st[r]);
        free(spans.v);
    }
    tio_dataset_destroy(ds);
}

/* Save after K samples (while the prefetch queue is full), resume, and
 * compare with the uninterrupted stream, twice in a row. */
static void test_resume_bit_identical(void **state)
{
    (void)state;
    tio_dataset *ds = open_ds();
    cfg c = {.seq_len = 40, .shuffle = 5, .L = 16, .prefetch = 4, .seed = 7};
    enum { TOTAL = 120 };
    uint32_t *ref = malloc((size_t)TOTAL * 41 * sizeof *ref);
    tio_loader *ld = make_loader(ds, c, 1, 2, NULL, NULL, 0);
    for (int i = 0; i < TOTAL; i++) {
        const tio_data_sample *s;
        assert_int_equal(tio_loader_next(ld, &s), 0);
        assert_int_equal(s->index, (uint64_t)i);
        memcpy(ref + (size_t)i * 41, s->tokens, 41 * sizeof *ref);
    }
    tio_loader_destroy(ld);
    ld = make_loader(ds, c, 1, 2, NULL, NULL, 0);
    int at = 0;
    for (int round = 0; round < 2; round++) {
        int k = round ? 31 : 17;
        for (int i = 0; i < k; i++, at++) {
            const tio_data_sample *s;
            assert_int_equal(tio_loader_next(ld, &s), 0);
            assert_memory_equal(s->tokens, ref + (size_t)at * 41, 41 * sizeof *ref);
        }
        usleep(20000); /* the prefetch thread fills its queue ahead of `at` */
        char path[700];
        snprintf(path, sizeof path, "%s/state.bin", root);
        assert_int_equal(tio_loader_save(ld, path), 0);
        tio_loader_destroy(ld);
        void *st;
        size_t len;
        assert_int_equal(tio_loader_state_read(path, &st, &len), 0);
        ld = make_loader(ds, c, 1, 2, &st, &len, 1);
        free(st);
    }
    for (; at < TOTAL; at++) {
        const tio_data_sample *s;
        assert_int_equal(tio_loader_next(ld, &s), 0);
        assert_int_equal(s->index, (uint64_t)at);
        assert_memory_equal(s->tokens, ref + (size_t)at * 41, 41 * sizeof *ref);
    }
    tio_loader_destroy(ld);
    free(ref);
    tio_dataset_destroy(ds);
}

/* Save, resume, save, resume (2 -> 3 -> 2 and 2 -> 2 -> 2 ranks): the
 * epoch is still covered exactly once. */
static void test_resume_twice(void **state)
{
    (void)state;
    tio_dataset *ds = open_ds();
    static const uint32_t chains[][3] = {{2, 3, 2}, {2, 2, 2}, {1, 4, 3}};
    for (size_t k = 0; k < sizeof chains / sizeof chains[0]; k++) {
        cfg c = {.seq_len = 20 + 9 * k, .shuffle = 3, .L = 12, .prefetch = 3, .seed = 77 + k};
        span_list spans = {0};
        void *st1[4], *st2[4];
        size_t len1[4], len2[4];
        run_ranks(ds, c, chains[k][0], NULL, NULL, 0, 6, &spans, st1, len1);
        run_ranks(ds, c, chains[k][1], st1, len1, chains[k][0], 5, &spans, st2, len2);
        run_ranks(ds, c, chains[k][2], st2, len2, chains[k][1], 0, &spans, NULL, NULL);
        assert_int_equal(spans.tokens, epoch_tokens(ds));
        assert_exactly_once(ds, &spans);
        for (uint32_t r = 0; r < chains[k][0]; r++)
            free(st1[r]);
        for (uint32_t r = 0; r < chains[k][1]; r++)
            free(st2[r]);
        free(spans.v);
    }
    tio_dataset_destroy(ds);
}

/* Samples made by the prefetch thread but not delivered are not in the
 * state: with samples queued, the state is byte-identical to that of a
 * loader without a thread that delivered as many samples, and differs from
 * the state after the queued samples too. */
static void test_prefetch_not_counted(void **state)
{
    (void)state;
    tio_dataset *ds = open_ds();
    cfg c = {.seq_len = 20, .shuffle = 4, .L = 8, .prefetch = 8, .seed = 5};
    tio_loader *ld = make_loader(ds, c, 0, 1, NULL, NULL, 0);
    c.prefetch = 0;
    tio_loader *ref = make_loader(ds, c, 0, 1, NULL, NULL, 0);
    const tio_data_sample *s;
    for (int i = 0; i < 13; i++) {
        assert_int_equal(tio_loader_next(ld, &s), 0);
        assert_int_equal(tio_loader_next(ref, &s), 0);
    }
    /* the producer refills its queue once it is half empty */
    for (int i = 0; i < 10000 && tio_loader_queued(ld) < 4; i++)
        usleep(1000);
    assert_true(tio_loader_queued(ld) >= 4);
    void *a, *b;
    size_t la, lb;
    assert_int_equal(tio_loader_state(ld, &a, &la), 0);
    assert_int_equal(tio_loader_state(ref, &b, &lb), 0);
    assert_int_equal(la, lb);
    assert_memory_equal(a, b, la);
    uint64_t delivered;
    memcpy(&delivered, (uint8_t *)a + 40, 8);
    assert_int_equal(delivered, 13);
    free(b);
    for (int i = 0; i < 8; i++)
        assert_int_equal(tio_loader_next(ref, &s), 0);
    assert_int_equal(tio_loader_state(ref, &b, &lb), 0);
    assert_false(la == lb && !memcmp(a, b, la));
    /* resuming from it gives sample 13 next */
    tio_loader_destroy(ref);
    c.prefetch = 8;
    ref = make_loader(ds, c, 0, 1, &a, &la, 1);
    const tio_data_sample *t;
    assert_int_equal(tio_loader_next(ld, &s), 0);
    assert_int_equal(tio_loader_next(ref, &t), 0);
    assert_int_equal(s->index, 13);
    assert_int_equal(t->index, 13);
    assert_memory_equal(s->tokens, t->tokens, 21 * sizeof *s->tokens);
    free(a);
    free(b);
    tio_loader_destroy(ref);
    tio_loader_destroy(ld);
    tio_dataset_destroy(ds);
}

/* Only sub-dataset b is drawn.  Stop at the very sample that completes
 * epoch 0, save, resume on 1 or 3 ranks: epoch 1 is delivered in full,
 * exactly once, and no epoch-0 piece comes again. */
static void test_epoch_boundary(void **state)
{
    (void)state;
    tio_dataset *ds = open_ds();
    static const double w[3] = {0, 1, 0};
    uint64_t total = sub_tokens(ds, 2);
    for (uint32_t M = 1; M <= 3; M += 2) {
        cfg c = {.seq_len = 24, .shuffle = 3, .L = 6, .prefetch = 4, .seed = 11 + M, .weights = w};
        span_list e0 = {0}, e1 = {0};
        tio_loader *ld = make_loader(ds, c, 0, 1, NULL, NULL, 0);
        const tio_data_sample *s;
        while (e0.tokens < total) {
            assert_int_equal(tio_loader_next(ld, &s), 0);
            check_sample(s, &e0, 0);
            check_sample(s, &e1, 1);
        }
        assert_int_equal(e0.tokens, total);
        assert_subs_exactly_once(ds, &e0, 2);
        tio_data_position pos;
        assert_int_equal(tio_loader_position(ld, 1, &pos), 0);
        assert_int_equal(pos.epoch, 1);
        void *st;
        size_t len;
        assert_int_equal(tio_loader_state(ld, &st, &len), 0);
        tio_loader_destroy(ld);
        tio_loader *r[3];
        for (uint32_t k = 0; k < M; k++)
            r[k] = make_loader(ds, c, k, M, &st, &len, 1);
        free(st);
        for (uint32_t step = 0; e1.tokens < total; step++) {
            assert_true(step < 10000);
            for (uint32_t k = 0; k < M; k++) {
                assert_int_equal(tio_loader_next(r[k], &s), 0);
                for (uint32_t i = 0; i < s->n_spans; i++)
                    assert_int_not_equal(s->spans[i].epoch, 0);
                check_sample(s, &e1, 1);
            }
        }
        assert_int_equal(e1.tokens, total);
        assert_subs_exactly_once(ds, &e1, 2);
        for (uint32_t k = 0; k < M; k++)
            tio_loader_destroy(r[k]);
        free(e0.v);
        free(e1.v);
    }
    tio_dataset_destroy(ds);
}

static void test_mixing_weights(void **state)
{
    (void)state;
    tio_dataset *ds = open_ds();
    const char *names[] = {"a", "b", "c"};
    double w[] = {0.6, 0.3, 0.1};
    tio_loader_options o;
    tio_loader_options_default(&o);
    o.seq_len = 1023;
    o.logical_shards = 4;
    o.shuffle_buffer = 8; /* its samples at a restart keep the old mixture */
    o.n_weights = 3;
    o.weight_names = names;
    o.weights = w;
    tio_loader *ld;
    assert_int_equal(tio_loader_create(ds, &o, NULL, NULL, 0, &ld), 0);
    uint64_t per[3] = {0}, total = 0;
    while (total < 1000000) {
        const tio_data_sample *s;
        assert_int_equal(tio_loader_next(ld, &s), 0);
        for (uint32_t k = 0; k < s->n_spans; k++)
            per[s->spans[k].subdataset] += s->spans[k].length;
        total += s->seq_len + 1;
    }
    for (int d = 0; d < 3; d++)
        assert_true(fabs((double)per[d] / (double)total - w[d]) < 0.01);
    /* change the weights on restart: the tokens after it follow the new ones */
    void *st;
    size_t len;
    assert_int_equal(tio_loader_state(ld, &st, &len), 0);
    tio_loader_destroy(ld);
    double w2[] = {0.2, 0.2, 0.6};
    o.weights = w2;
    assert_int_equal(tio_loader_create(ds, &o, (const void *const *)&st, &len, 1, &ld), 0);
    free(st);
    /* Samples of the shuffle buffer were drawn under the old weights: count
     * from the first sample packed after the restart.  The share of each
     * sub-dataset moves toward its new weight without passing it. */
    memset(per, 0, sizeof per);
    total = 0;
    for (uint32_t i = 0; total < 1000000; i++) {
        const tio_data_sample *s;
        assert_int_equal(tio_loader_next(ld, &s), 0);
        if (i <= o.shuffle_buffer)
            continue;
        for (uint32_t k = 0; k < s->n_spans; k++)
            per[s->spans[k].subdataset] += s->spans[k].length;
        total += s->seq_len + 1;
        if (total > 100000) {
            assert_true((double)per[0] / (double)total > w2[0] - 0.01);
            assert_true((double)per[2] / (double)total < w2[2] + 0.01);
        }
    }
    for (int d = 0; d < 3; d++)
        if (fabs((double)per[d] / (double)total - w2[d]) >= 0.01)
            fail_msg("sub-dataset %d: share %.4f, weight %.2f", d, (double)per[d] / (double)total, w2[d]);
    tio_loader_destroy(ld);
    tio_dataset_destroy(ds);
}

static void test_state_errors(void **state)
{
    (void)state;
    tio_dataset *ds = open_ds();
    cfg c = {.seq_len = 32, .shuffle = 2, .L = 8, .prefetch = 2, .seed = 3};
    tio_loader *ld = make_loader(ds, c, 0, 1, NULL, NULL, 0);
    const tio_data_sample *s;
    assert_int_equal(tio_loader_next(ld, &s), 0);
    void *st;
    size_t len;
    assert_int_equal(tio_loader_state(ld, &st, &len), 0);
    tio_loader_destroy(ld);
    tio_loader_options o;
    tio_loader_options_default(&o);
    o.seq_len = 32;
    o.shuffle_buffer = 2;
    o.logical_shards = 8;
    o.seed = 4; /* other settings */
    o.eos_id = 9999;
    assert_int_equal(tio_loader_create(ds, &o, (const void *const *)&st, &len, 1, &ld), TIO_ESTATE);
    assert_non_null(strstr(tio_last_error(), "fingerprint mismatch"));
    o.seed = 3;
    ((uint8_t *)st)[40] ^= 1;
    assert_int_equal(tio_loader_create(ds, &o, (const void *const *)&st, &len, 1, &ld), TIO_ECORRUPT);
    ((uint8_t *)st)[40] ^= 1;
    size_t short_len = len - 9;
    assert_int_equal(tio_loader_create(ds, &o, (const void *const *)&st, &short_len, 1, &ld),
                     TIO_ECORRUPT);
    ((uint8_t *)st)[8] = 2;
    assert_int_equal(tio_loader_create(ds, &o, (const void *const *)&st, &len, 1, &ld), TIO_EVERSION);
    free(st);
    /* one state of a 2-rank run given to the other rank */
    ld = make_loader(ds, c, 0, 2, NULL, NULL, 0);
    assert_int_equal(tio_loader_state(ld, &st, &len), 0);
    tio_loader_destroy(ld);
    o.rank = 1;
    o.world_size = 2;
    assert_int_equal(tio_loader_create(ds, &o, (const void *const *)&st, &len, 1, &ld), TIO_ESTATE);
    assert_non_null(strstr(tio_last_error(), "states of all 2 old ranks"));
    free(st);
    char path[700];
    snprintf(path, sizeof path, "%s/nostate", root);
    void *b;
    assert_int_equal(tio_loader_state_read(path, &b, &len), -ENOENT);
    assert_non_null(strstr(tio_last_error(), "nostate"));
    tio_dataset_destroy(ds);
}

/* kill -9 while writing states in a loop: the file is always loadable. */
static void test_atomic_save_kill(void **state)
{
    (void)state;
    tio_dataset *ds = open_ds();
    cfg c = {.seq_len = 32, .shuffle = 2, .L = 8, .prefetch = 0, .seed = 3};
    char path[700];
    snprintf(path, sizeof path, "%s/kill.state", root);
    tio_loader *ld = make_loader(ds, c, 0, 1, NULL, NULL, 0);
    assert_int_equal(tio_loader_save(ld, path), 0);
    for (int round = 0; round < 5; round++) {
        pid_t pid = fork();
        if (pid == 0) {
            for (;;) {
                const tio_data_sample *s;
                if (tio_loader_next(ld, &s) || tio_loader_save(ld, path))
                    _exit(1);
            }
        }
        usleep(30000 + 7000 * round);
        kill(pid, SIGKILL);
        int status;
        waitpid(pid, &status, 0);
        assert_true(WIFSIGNALED(status));
        void *st;
        size_t len;
        assert_int_equal(tio_loader_state_read(path, &st, &len), 0);
        tio_loader *l2 = make_loader(ds, c, 0, 1, &st, &len, 1);
        tio_loader_destroy(l2);
        free(st);
    }
    tio_loader_destroy(ld);
    tio_dataset_destroy(ds);
}

/* Under ASan the sanitizer's own SIGBUS handler would report the fault of
 * test_file_shrinks_while_mapped before the loader's handler turns it into
 * an error: let the program's handler have SIGBUS. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "handle_sigbus=0"; }

/* A token file truncated after the loader mapped it (another job rewrote
 * it in place): reading past its new end fails with -EIO naming the file,
 * with and without the prefetch thread, instead of killing the process
 * with SIGBUS; so does a truncated .idx. */
static void test_file_shrinks_while_mapped(void **state)
{
    (void)state;
#if defined(__SANITIZE_THREAD__)
    /* TSan's interception of synchronous signals does not hand this SIGBUS
     * to the program's handler (the process dies with the default action):
     * the guard is checked in the plain and ASan builds. */
    skip();
#endif
    for (int which = 0; which < 3; which++) {
        char dir[700], p[800];
        snprintf(dir, sizeof dir, "%s-shrink%d", root, which);
        snprintf(p, sizeof p, "%s/m", dir);
        mkdirs(p);
        snprintf(p, sizeof p, "%s/m/x", dir);
        write_megatron(p, 0, 0, 5, 4);
        tio_dataset *ds;
        assert_int_equal(tio_dataset_open(dir, NULL, &ds), 0);
        tio_loader_options o;
        tio_loader_options_default(&o);
        o.seq_len = 4;
        o.shuffle_buffer = 0;
        o.prefetch = which == 1 ? 4 : 0;
        tio_loader *ld;
        assert_int_equal(tio_loader_create(ds, &o, NULL, NULL, 0, &ld), 0);
        const tio_data_sample *smp;
        assert_int_equal(tio_loader_next(ld, &smp), 0); /* the files are mapped now */
        snprintf(p, sizeof p, "%s/m/x.%s", dir, which == 2 ? "idx" : "bin");
        assert_int_equal(truncate(p, 0), 0);
        int rc = 0;
        for (int k = 0; k < 200 && rc == 0; k++)
            rc = tio_loader_next(ld, &smp);
        assert_int_equal(rc, -EIO);
        if (!strstr(tio_last_error(), "m/x") || !strstr(tio_last_error(), "shrank"))
            fail_msg("message: %s", tio_last_error());
        tio_loader_destroy(ld);
        tio_dataset_destroy(ds);
    }
}

static void test_bad_files(void **state)
{
    (void)state;
    char dir[700], p[800];
    snprintf(dir, sizeof dir, "%s-bad", root);
    snprintf(p, sizeof p, "%s/m", dir);
    mkdirs(p);
    snprintf(p, sizeof p, "%s/m/x", dir);
    write_megatron(p, 0, 0, 5, 4);
    tio_dataset *ds;
    /* pointer past the end of .bin: truncate the .bin */
    snprintf(p, sizeof p, "%s/m/x.bin", dir);
    assert_int_equal(truncate(p, 20), 0);
    assert_int_equal(tio_dataset_open(dir, NULL, &ds), TIO_EPARSE);
    assert_non_null(strstr(tio_last_error(), "m/x.idx"));
    assert_non_null(strstr(tio_last_error(), "past the end"));
    snprintf(p, sizeof p, "%s/m/x", dir);
    write_megatron(p, 0, 0, 5, 4);
    snprintf(p, sizeof p, "%s/m/x.idx", dir);
    FILE *f = fopen(p, "r+b");
    fputc('X', f);
    fclose(f);
    assert_int_equal(tio_dataset_open(dir, NULL, &ds), TIO_EPARSE);
    assert_non_null(strstr(tio_last_error(), "m/x.idx: bad magic"));
    assert_int_equal(truncate(p, 20), 0);
    assert_int_equal(tio_dataset_open(dir, NULL, &ds), TIO_EPARSE);
    assert_non_null(strstr(tio_last_error(), "truncated"));
    /* malformed JSONL line: error names file and line, or skip and count */
    snprintf(p, sizeof p, "%s/m/x.idx", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/m/x.bin", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/m/t.jsonl", dir);
    write_bytes(p, "{\"text\": \"ok\"}\n{\"text\": \"bad\\q\"}\n{\"text\": \"fine\"}\n", 50);
    assert_int_equal(tio_dataset_open(dir, NULL, &ds), 0);
    uint32_t *ids;
    uint64_t n;
    assert_int_equal(tio_dataset_read_doc(ds, 0, 0, 1, &ids, &n), TIO_EPARSE);
    assert_non_null(strstr(tio_last_error(), "m/t.jsonl: line 2"));
    tio_dataset_destroy(ds);
    tio_dataset_options opts;
    tio_dataset_options_default(&opts);
    opts.jsonl_errors = TIO_DATA_JSONL_SKIP;
    assert_int_equal(tio_dataset_open(dir, &opts, &ds), 0);
    assert_int_equal(tio_dataset_read_doc(ds, 0, 0, 1, &ids, &n), 0);
    assert_int_equal(n, 0);
    assert_int_equal(tio_dataset_read_doc(ds, 0, 0, 2, &ids, &n), 0);
    assert_int_equal(n, 4);
    static const uint32_t fine[4] = {'f', 'i', 'n', 'e'};
    assert_memory_equal(fine, ids, sizeof fine);
    free(ids);
    tio_data_subdataset_info info;
    tio_dataset_info(ds, 0, &info);
    assert_int_equal(info.lines_skipped, 1);
    tio_dataset_destroy(ds);
    char cmd[800];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    (void)!system(cmd);
}

static void test_json_unescape(void **state)
{
    (void)state;
    const char *line = "{\"a\":{\"text\":1},\"text\":\"x\\u00e9\\ud83d\\ude00\\n\\\"\"}";
    char *out;
    size_t n;
    assert_int_equal(tio_jsonl_text(line, strlen(line), "text", "t", &out, &n), 0);
    assert_int_equal(n, 1 + 2 + 4 + 2);
    assert_memory_equal(out, "x\xc3\xa9\xf0\x9f\x98\x80\n\"", n);
    free(out);
    assert_int_equal(tio_jsonl_text("{\"text\": 3}", 11, "text", "t", &out, &n), TIO_EPARSE);
    assert_int_equal(tio_jsonl_text("{\"text\": \"a\"} x", 15, "text", "t", &out, &n), TIO_EPARSE);
    assert_int_equal(tio_jsonl_text("{\"other\": \"a\"}", 14, "text", "t", &out, &n), TIO_EPARSE);
    assert_non_null(strstr(tio_last_error(), "no string field 'text'"));
}

/* Token files only (no JSONL), so fill threads read the tokens: the stream
 * is bit-identical with 0, 1 and 3 fill threads and without a prefetch
 * thread, and a state saved with samples queued and being filled resumes it
 * exactly. */
static void test_fill_threads(void **state)
{
    (void)state;
    char dir[700], p[800];
    snprintf(dir, sizeof dir, "%s-fill", root);
    snprintf(p, sizeof p, "%s/a", dir);
    mkdirs(p);
    snprintf(p, sizeof p, "%s/a/part0", dir);
    write_megatron(p, 0, 0, 40, 4);
    snprintf(p, sizeof p, "%s/a/part1", dir);
    write_megatron(p, 0, 1, 25, 8);
    snprintf(p, sizeof p, "%s/b", dir);
    mkdirs(p);
    snprintf(p, sizeof p, "%s/b/shard.bin", dir);
    write_llmc(p, 1, 0, 50);
    tio_dataset *ds;
    assert_int_equal(tio_dataset_open(dir, NULL, &ds), 0);
    enum { TOTAL = 150, S = 30 };
    uint32_t *ref = malloc((size_t)TOTAL * S * sizeof *ref);
    tio_loader_options o;
    tio_loader_options_default(&o);
    o.seq_len = S - 1;
    o.logical_shards = 8;
    o.shuffle_buffer = 6;
    o.seed = 21;
    o.prefetch = 0;
    tio_loader *ld;
    const tio_data_sample *s;
    assert_int_equal(tio_loader_create(ds, &o, NULL, NULL, 0, &ld), 0);
    for (int i = 0; i < TOTAL; i++) {
        assert_int_equal(tio_loader_next(ld, &s), 0);
        memcpy(ref + (size_t)i * S, s->tokens, S * sizeof *ref);
    }
    tio_loader_destroy(ld);
    static const uint32_t fills[] = {0, 1, 3};
    for (size_t k = 0; k < 3; k++) {
        o.prefetch = 5;
        o.fill_threads = fills[k];
        assert_int_equal(tio_loader_create(ds, &o, NULL, NULL, 0, &ld), 0);
        int at = 0;
        for (; at < 77; at++) {
            assert_int_equal(tio_loader_next(ld, &s), 0);
            assert_memory_equal(s->tokens, ref + (size_t)at * S, S * sizeof *ref);
        }
        void *st;
        size_t len;
        assert_int_equal(tio_loader_state(ld, &st, &len), 0);
        tio_loader_destroy(ld);
        assert_int_equal(tio_loader_create(ds, &o, (const void *const *)&st, &len, 1, &ld), 0);
        free(st);
        for (; at < TOTAL; at++) {
            assert_int_equal(tio_loader_next(ld, &s), 0);
            assert_int_equal(s->index, (uint64_t)at);
            assert_memory_equal(s->tokens, ref + (size_t)at * S, S * sizeof *ref);
        }
        tio_loader_destroy(ld);
    }
    free(ref);
    tio_dataset_destroy(ds);
    char cmd[800];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    (void)!system(cmd);
}

/* A byte tokenizer that notes which threads called it. */
static pthread_mutex_t seen_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_t seen_threads[16];
static int n_seen_threads;

static int64_t noting_encode(void *ctx, const char *text, size_t len, uint32_t *ids, size_t cap)
{
    (void)ctx;
    pthread_mutex_lock(&seen_lock);
    bool known = false;
    for (int i = 0; i < n_seen_threads; i++)
        known |= pthread_equal(seen_threads[i], pthread_self()) != 0;
    if (!known && n_seen_threads < 16)
        seen_threads[n_seen_threads++] = pthread_self();
    pthread_mutex_unlock(&seen_lock);
    for (size_t i = 0; i < len && i < cap; i++)
        ids[i] = (unsigned char)text[i];
    usleep(50); /* long enough that the threads overlap */
    return (int64_t)len;
}

/* A JSONL file of 700 lines tokenized on 1 and on 3 threads: the same ids
 * (checked against the text written), and 3 threads did take part. */
static void test_parallel_tokenizing(void **state)
{
    (void)state;
    char dir[700], p[800];
    snprintf(dir, sizeof dir, "%s-tok", root);
    snprintf(p, sizeof p, "%s/t", dir);
    mkdirs(p);
    snprintf(p, sizeof p, "%s/t/big.jsonl", dir);
    write_jsonl(p, 2, 3, 700);
    tio_data_tokenizer noting = {"noting", NULL, noting_encode, 256};
    for (uint32_t threads = 1; threads <= 3; threads += 2) {
        tio_dataset_options o;
        tio_dataset_options_default(&o);
        o.tokenizer = &noting;
        o.tokenizer_threads = threads;
        n_seen_threads = 0;
        tio_dataset *ds;
        assert_int_equal(tio_dataset_open(dir, &o, &ds), 0);
        tio_data_reader *r;
        assert_int_equal(tio_data_reader_create(ds, &r), 0);
        for (uint64_t d = 0; d < 700; d++) {
            uint64_t n;
            uint32_t ids[256];
            assert_int_equal(tio_data_doc_len(r, 0, 0, d, &n), 0);
            assert_int_equal(n, doc_len(2, 3, (int)d));
            assert_int_equal(tio_data_doc_read(r, 0, 0, d, 0, n, ids), 0);
            for (uint64_t i = 0; i < n; i++)
                assert_int_equal(ids[i], jtok(2, 3, (int)d, (uint32_t)i));
        }
        assert_int_equal(n_seen_threads, (int)threads);
        tio_data_reader_destroy(r);
        tio_dataset_destroy(ds);
    }
    char cmd[800];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    (void)!system(cmd);
}

/* BPE tokenizer specs: unknown names fail naming the spec; "bytes" is the
 * static byte tokenizer. */
static void test_tokenizer_open(void **state)
{
    (void)state;
    tio_data_tokenizer *t;
    assert_int_equal(tio_data_tokenizer_open("bytes", NULL, &t), 0);
    assert_ptr_equal(t, tio_data_tokenizer_bytes());
    assert_int_equal(t->vocab_size, 256);
    tio_data_tokenizer_close(t);
    assert_int_equal(tio_data_tokenizer_open("gpt9", NULL, &t), -ENOENT);
    assert_non_null(strstr(tio_last_error(), "unknown tokenizer 'gpt9'"));
    assert_int_equal(tio_data_tokenizer_open("/nonexistent/tokenizer.json", NULL, &t), -ENOENT);
    assert_non_null(strstr(tio_last_error(), "/nonexistent/tokenizer.json"));
}

static void test_options_errors(void **state)
{
    (void)state;
    tio_dataset *ds = open_ds();
    tio_loader_options o;
    tio_loader_options_default(&o);
    tio_loader *ld;
    o.rank = 1;
    assert_int_equal(tio_loader_create(ds, &o, NULL, NULL, 0, &ld), -EINVAL);
    o.rank = 0;
    o.world_size = 4;
    o.logical_shards = 3;
    assert_int_equal(tio_loader_create(ds, &o, NULL, NULL, 0, &ld), -EINVAL);
    const char *nm[] = {"zzz"};
    double w[] = {1};
    o.logical_shards = 8;
    o.n_weights = 1;
    o.weight_names = nm;
    o.weights = w;
    assert_int_equal(tio_loader_create(ds, &o, NULL, NULL, 0, &ld), -EINVAL);
    assert_non_null(strstr(tio_last_error(), "zzz"));
    tio_dataset_destroy(ds);
    assert_int_equal(tio_dataset_open("/nonexistent-teraio", NULL, &ds), -ENOENT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_readers_exact),
        cmocka_unit_test(test_permutation),
        cmocka_unit_test(test_json_unescape),
        cmocka_unit_test(test_rescale_exactly_once),
        cmocka_unit_test(test_resume_bit_identical),
        cmocka_unit_test(test_resume_twice),
        cmocka_unit_test(test_prefetch_not_counted),
        cmocka_unit_test(test_epoch_boundary),
        cmocka_unit_test(test_mixing_weights),
        cmocka_unit_test(test_state_errors),
        cmocka_unit_test(test_atomic_save_kill),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_file_shrinks_while_mapped),
        cmocka_unit_test(test_options_errors),
        cmocka_unit_test(test_parallel_tokenizing),
        cmocka_unit_test(test_fill_threads),
        cmocka_unit_test(test_tokenizer_open),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
