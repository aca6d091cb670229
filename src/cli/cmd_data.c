/*
 * cli/cmd_data.c — `teraio data`: the data loader from the command line.
 *
 *   data inspect DIR     what the loader sees in a dataset root: per
 *                        sub-dataset its files (and their formats),
 *                        documents and tokens; with --state, the position a
 *                        state file holds
 *   data ingest SRC OUT  tokenize a root of text sub-datasets into Megatron
 *                        .bin/.idx files plus OUT/counts.csv (tio_data_ingest)
 *   data sample DIR      the first samples of a rank and where they come
 *                        from; resumes from and saves loader state files
 *   data bench DIR       the loader's tokens/s beside memcpy (cmd_data_bench.c)
 *
 * Each subcommand parses its arguments, calls the library and prints.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "teraio/data.h"

#define CMD "data"

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
            "inspect  sub-datasets of a dataset root (one folder each), their files and\n"
            "         formats, documents and tokens (documents of Parquet files come from\n"
            "         their footers; text tokens are counted only by ingest).\n"
            "         --state: the position a loader state file holds (checked against\n"
            "         the dataset and the loader's seed and EOS id, default 0).\n"
            "ingest   tokenize every text file (.jsonl, .jsonl.gz, .jsonl.zst, Parquet with\n"
            "         a text column) under the root SRC into Megatron .bin/.idx files under\n"
            "         OUT (same sub-dataset and relative path) and write OUT/counts.csv.\n"
            "         SPEC: bytes (default), r50k_base, p50k_base, cl100k_base, o200k_base\n"
            "         or a tokenizer.json.  --threads: files tokenized at once (default:\n"
            "         online CPUs).  A progress line is shown when stderr is a terminal.\n"
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

/* The position a state file holds, checked against the dataset: loading it
 * fails on a state of another dataset or other settings. */
static int inspect_state(tio_dataset *ds, const char *path, uint64_t seed, uint32_t eos, bool json)
{
    void *buf;
    size_t len;
    tio_data_state_info info;
    int rc = tio_loader_state_read(path, &buf, &len);
    if (rc)
        return cli_lib_error(CMD, rc);
    if ((rc = tio_loader_state_info(buf, len, &info)) != 0) {
        free(buf);
        return cli_error(CMD, "%s: %s", path, tio_last_error());
    }
    tio_loader_options o;
    tio_loader_options_default(&o);
    o.rank = info.rank;
    o.world_size = info.world_size;
    o.logical_shards = info.logical_shards;
    o.seq_len = info.seq_len;
    o.shuffle_buffer = info.shuffle_buffer;
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
        printf(", \"state\": {\"rank\": %u, \"world_size\": %u, \"samples\": %llu, "
               "\"positions\": [", o.rank, o.world_size, (unsigned long long)info.samples);
    else
        printf("state %s: rank %u of %u, logical shards %u, seq_len %u, %llu samples delivered\n",
               path, o.rank, o.world_size, o.logical_shards, o.seq_len,
               (unsigned long long)info.samples);
    for (uint32_t s = 0; s < tio_dataset_n_subdatasets(ds); s++) {
        tio_data_subdataset_info in;
        tio_data_position p;
        tio_dataset_info(ds, s, &in);
        tio_loader_position(ld, s, &p);
        if (json) {
            printf("%s{\"name\": ", s ? ", " : "");
            cli_json_string(stdout, in.name);
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

static void print_subdataset(tio_dataset *ds, uint32_t s, const tio_data_subdataset_info *in,
                             bool json)
{
    if (!json) {
        printf("%-24s %8u %14llu %16llu %14llu\n", in->name, in->n_files,
               (unsigned long long)in->n_docs, (unsigned long long)in->n_tokens,
               (unsigned long long)in->bytes);
        for (uint32_t f = 0; f < in->n_files; f++)
            printf("  %-40s %-14s %8lld documents\n", tio_dataset_file_path(ds, s, f),
                   tio_dataset_file_format(ds, s, f), (long long)tio_dataset_file_docs(ds, s, f));
        return;
    }
    printf("%s{\"name\": ", s ? ", " : "");
    cli_json_string(stdout, in->name);
    printf(", \"files\": %u, \"documents\": %llu, \"tokens\": %llu, \"bytes\": %llu, "
           "\"empty_documents\": %llu, \"file_list\": [", in->n_files,
           (unsigned long long)in->n_docs, (unsigned long long)in->n_tokens,
           (unsigned long long)in->bytes, (unsigned long long)in->n_empty_docs);
    for (uint32_t f = 0; f < in->n_files; f++) {
        printf("%s{\"path\": ", f ? ", " : "");
        cli_json_string(stdout, tio_dataset_file_path(ds, s, f));
        printf(", \"format\": \"%s\", \"documents\": %lld}", tio_dataset_file_format(ds, s, f),
               (long long)tio_dataset_file_docs(ds, s, f));
    }
    printf("]}");
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
            else if (!cli_parse_u32(v, 0, UINT32_MAX, !strcmp(argv[i], "--seed") ? &seed : &eos))
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
    bool uncounted = false; /* text: tokens are counted when ingested */
    if (json)
        printf("{\"root\": "), cli_json_string(stdout, root), printf(", \"subdatasets\": [");
    else
        printf("%-24s %8s %14s %16s %14s\n", "sub-dataset", "files", "documents", "tokens", "bytes");
    for (uint32_t s = 0; s < n; s++) {
        tio_data_subdataset_info in;
        tio_dataset_info(ds, s, &in);
        files += in.n_files;
        docs += in.n_docs;
        toks += in.n_tokens;
        uncounted |= in.n_docs > 0 && in.n_tokens == 0;
        print_subdataset(ds, s, &in, json);
    }
    if (json)
        printf("], \"files\": %llu, \"documents\": %llu, \"tokens\": %llu",
               (unsigned long long)files, (unsigned long long)docs, (unsigned long long)toks);
    else
        printf("%-24s %8llu %14llu %16llu\n%s", "total", (unsigned long long)files,
               (unsigned long long)docs, (unsigned long long)toks,
               uncounted ? "(tokens are 0 for text: counted when ingested)\n" : "");
    int status = state ? inspect_state(ds, state, seed, eos, json) : 0;
    if (json && !status)
        printf("}\n");
    tio_dataset_destroy(ds);
    return status;
}

/* ---- ingest ------------------------------------------------------------- */

typedef struct {
    uint64_t t0_ns;
} progress_line;

static void show_progress(void *ctx, uint32_t done, uint32_t n_files, uint64_t docs,
                          uint64_t tokens)
{
    const progress_line *p = ctx;
    double dt = (double)(tio_now_ns() - p->t0_ns) * 1e-9;
    fprintf(stderr, "\r\033[Kingest: %u/%u files, %llu documents, %llu tokens, %.2f M tokens/s",
            done, n_files, (unsigned long long)docs, (unsigned long long)tokens,
            dt > 0 ? (double)tokens / dt / 1e6 : 0.0);
    fflush(stderr);
}

static int cmd_ingest(int argc, char **argv)
{
    const char *src = NULL, *out = NULL, *spec = "bytes", *tokdir = NULL, *field = "text";
    tio_data_ingest_options o;
    tio_data_ingest_options_default(&o);
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--skip-bad-lines")) {
            o.jsonl_errors = TIO_DATA_JSONL_SKIP;
        } else if (!strcmp(a, "--tokenizer") || !strcmp(a, "--tokenizers-dir") ||
                   !strcmp(a, "--threads") || !strcmp(a, "--text-field")) {
            if (!v)
                return usage_error("%s needs a value", a);
            i++;
            if (!strcmp(a, "--tokenizer"))
                spec = v;
            else if (!strcmp(a, "--tokenizers-dir"))
                tokdir = v;
            else if (!strcmp(a, "--text-field"))
                field = v;
            else if (!cli_parse_u32(v, 1, 256, &o.threads))
                return usage_error("--threads '%s': expected an integer from 1 to 256", v);
        } else if (a[0] == '-') {
            return usage_error("unknown option '%s'", a);
        } else if (!src) {
            src = a;
        } else if (!out) {
            out = a;
        } else {
            return usage_error("ingest takes SRC and OUT");
        }
    }
    if (!src || !out)
        return usage_error("ingest needs SRC (a root of text sub-datasets) and OUT");
    tio_data_tokenizer *tok;
    int rc = tio_data_tokenizer_open(spec, tokdir, &tok);
    if (rc)
        return cli_lib_error(CMD, rc);
    progress_line line = {tio_now_ns()};
    o.tokenizer = tok;
    o.text_field = field;
    if (isatty(STDERR_FILENO)) {
        o.progress = show_progress;
        o.progress_ctx = &line;
    }
    tio_data_ingest_result res;
    rc = tio_data_ingest(src, out, &o, &res);
    if (o.progress)
        fprintf(stderr, "\r\033[K");
    int status = 0;
    if (rc)
        status = cli_lib_error(CMD, rc);
    else
        printf("ingested %u files: %llu documents, %llu tokens (%s, %s) in %.2f s into %s\n",
               res.n_files, (unsigned long long)res.n_docs, (unsigned long long)res.n_tokens,
               tok->name, res.dtype == 8 ? "uint16" : "int32",
               (double)(tio_now_ns() - line.t0_ns) * 1e-9, out);
    tio_data_tokenizer_close(tok);
    return status;
}

/* ---- sample -------------------------------------------------------------- */

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
            else if (!cli_parse_u32(v, 0, UINT32_MAX - 2, num))
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
    if (resume && (rc = tio_loader_state_read(resume, &st, &st_len)) != 0) {
        tio_dataset_destroy(ds);
        return cli_lib_error(CMD, rc);
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

int cmd_data(int argc, char **argv)
{
    if (argc < 2)
        return usage_error("needs a subcommand: inspect, ingest, sample or bench");
    for (int i = 1; i < argc; i++)
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
        return cmd_data_bench(argc, argv);
    return usage_error("unknown subcommand '%s': expected inspect, ingest, sample or bench",
                       argv[1]);
}
