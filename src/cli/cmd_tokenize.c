/*
 * cli/cmd_tokenize.c — `teraio tokenize`: byte-level BPE tokens of a file
 * with a built-in tiktoken encoding or a Hugging Face tokenizer.json.
 *
 * Output: by default one summary line (tokens, bytes, bytes per token);
 * --ids prints the ids separated by spaces; --decode reads ids (whitespace
 * separated) from FILE and writes the bytes they stand for; --bench encodes
 * the file repeatedly for about a second and prints single-thread MB/s
 * (1e6 bytes per second).  FILE "-" is standard input.
 *
 * The rank files of --encoding are found by the library
 * (tio_tok_encoding_path): --dir DIR, $TERAIO_TOKENIZERS_DIR, tiktoken's
 * cache, then the copy shipped with teraio.
 */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "teraio/teraio.h"
#include "teraio/tok.h"

#define CMD "tokenize"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: teraio tokenize (--encoding NAME | --file TOKENIZER.JSON) [--dir DIR]\n"
            "                       [--ids | --decode | --bench] [--allow-special] FILE\n"
            "\n"
            "Byte-level BPE tokens of FILE ('-': standard input), identical to tiktoken\n"
            "(built-in encodings r50k_base, p50k_base, cl100k_base, o200k_base) or to\n"
            "Hugging Face tokenizers (a byte-level BPE tokenizer.json).\n"
            "\n"
            "  --encoding NAME   built-in encoding; its NAME.tiktoken rank file is looked\n"
            "                    for in --dir, then $TERAIO_TOKENIZERS_DIR, then tiktoken's\n"
            "                    cache, then the copy shipped with teraio (SHA-256 checked)\n"
            "  --file PATH       a Hugging Face tokenizer.json instead\n"
            "  --dir DIR         directory holding the .tiktoken rank files\n"
            "  --ids             print the ids, separated by spaces\n"
            "  --decode          FILE holds ids; print the text they decode to\n"
            "  --bench           print single-thread encoding speed in MB/s\n"
            "  --allow-special   special-token strings become their ids (default: text)\n"
            "  -h, --help        show this help\n");
}

/* A usage mistake: one line on stderr, exit status 2. */
#define usage_error(...) cli_usage_error(CMD, __VA_ARGS__)

/* Read FILE ("-": standard input).  Returns 0 or prints and returns 1. */
static int read_input(const char *path, char **data, size_t *len)
{
    if (strcmp(path, "-")) {
        FILE *f = fopen(path, "rb");
        if (!f)
            return cli_error(CMD, "%s: %s", path, strerror(errno));
        fclose(f);
    }
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap)
            break;
        char *bigger = realloc(buf, cap * 2);
        if (!bigger)
            free(buf);
        buf = bigger;
        cap *= 2;
    }
    bool failed = !f || ferror(f);
    if (f && f != stdin)
        fclose(f);
    if (!buf)
        return cli_error(CMD, "%s: out of memory reading it", path);
    if (failed) {
        free(buf);
        return cli_error(CMD, "%s: read error", path);
    }
    *data = buf;
    *len = n;
    return 0;
}

/* Load the tokenizer; on failure prints one line and returns 1. */
static int open_tokenizer(const char *encoding, const char *file, const char *dir, tio_tok **tok)
{
    int rc = file ? tio_tok_load_hf(tok, file) : tio_tok_load_encoding(tok, encoding, dir);
    return rc ? cli_lib_error(CMD, rc) : 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int decode_ids(tio_tok *tok, const char *text, size_t len)
{
    size_t n = 0, cap = 1024;
    uint32_t *ids = malloc(cap * sizeof *ids);
    const char *p = text, *end = text + len;
    while (ids) {
        while (p < end && (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r' || *p == ','))
            p++;
        if (p == end)
            break;
        uint64_t v = 0;
        const char *start = p;
        while (p < end && *p >= '0' && *p <= '9' && v <= UINT32_MAX)
            v = v * 10 + (uint64_t)(*p++ - '0');
        if (p == start || v > UINT32_MAX || (p < end && !strchr(" \n\t\r,", *p))) {
            free(ids);
            return cli_error(CMD, "byte %zu: expected a token id", (size_t)(start - text));
        }
        if (n == cap) {
            uint32_t *bigger = realloc(ids, 2 * cap * sizeof *ids);
            if (!bigger)
                free(ids);
            ids = bigger;
            cap *= 2;
        }
        if (ids)
            ids[n++] = (uint32_t)v;
    }
    if (!ids)
        return cli_error(CMD, "out of memory reading ids");
    size_t need = 0;
    int rc = tio_tok_decode(tok, ids, n, NULL, 0, &need);
    char *out = NULL;
    if (rc == 0 || rc == -ENOSPC) {
        out = malloc(need ? need : 1);
        rc = out ? tio_tok_decode(tok, ids, n, out, need, &need) : -ENOMEM;
    }
    free(ids);
    if (rc) {
        free(out);
        return cli_lib_error(CMD, rc);
    }
    fwrite(out, 1, need, stdout);
    free(out);
    return 0;
}

int cmd_tokenize(int argc, char **argv)
{
    const char *encoding = NULL, *file = NULL, *dir = NULL, *input = NULL;
    bool ids_out = false, decode = false, bench = false;
    int special = TIO_TOK_SPECIAL_TEXT;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--encoding") || !strcmp(a, "--file") || !strcmp(a, "--dir")) {
            if (i + 1 >= argc)
                return usage_error("%s needs a value", a);
            const char **slot = a[2] == 'e' ? &encoding : a[2] == 'f' ? &file : &dir;
            *slot = argv[++i];
        } else if (!strcmp(a, "--ids")) {
            ids_out = true;
        } else if (!strcmp(a, "--decode")) {
            decode = true;
        } else if (!strcmp(a, "--bench")) {
            bench = true;
        } else if (!strcmp(a, "--allow-special")) {
            special = TIO_TOK_SPECIAL_ALLOW;
        } else if (a[0] == '-' && a[1]) {
            return usage_error("unknown option '%s'", a);
        } else if (input) {
            return usage_error("more than one FILE ('%s' and '%s')", input, a);
        } else {
            input = a;
        }
    }
    if (!encoding == !file)
        return usage_error("give exactly one of --encoding NAME and --file PATH");
    if (ids_out + decode + bench > 1)
        return usage_error("--ids, --decode and --bench exclude each other");
    if (!input)
        return usage_error("missing FILE");

    tio_tok *tok = NULL;
    char *text = NULL;
    size_t len = 0;
    int status = open_tokenizer(encoding, file, dir, &tok);
    if (status == 0)
        status = read_input(input, &text, &len);
    if (status) {
        tio_tok_destroy(tok);
        return status;
    }
    if (decode) {
        status = decode_ids(tok, text, len);
        goto out;
    }
    size_t cap = tio_tok_max_ids(tok, len);
    uint32_t *ids = malloc((cap ? cap : 1) * sizeof *ids);
    size_t n = 0;
    if (!ids) {
        status = cli_error(CMD, "out of memory for %zu ids", cap);
        goto out;
    }
    double t0 = now_s(), t = t0;
    int rounds = 0, rc;
    do {
        rc = tio_tok_encode(tok, text, len, special, ids, cap, &n);
        rounds++;
        t = now_s();
    } while (rc == 0 && bench && t - t0 < 1.0);
    if (rc) {
        status = cli_lib_error(CMD, rc);
    } else if (bench) {
        printf("%s: %zu bytes, %zu tokens, %.2f MB/s single-thread (%d rounds)\n",
               encoding ? encoding : file, len, n, (double)len * rounds / (t - t0) / 1e6, rounds);
    } else if (ids_out) {
        for (size_t i = 0; i < n; i++)
            printf(i ? " %u" : "%u", ids[i]);
        printf("\n");
    } else {
        printf("%zu tokens, %zu bytes, %.3f bytes/token\n", n, len, n ? (double)len / n : 0.0);
    }
    free(ids);
out:
    if (status == 0 && (fflush(stdout) != 0 || ferror(stdout)))
        status = cli_error(CMD, "writing standard output: %s", strerror(errno));
    free(text);
    tio_tok_destroy(tok);
    return status;
}
