/*
 * data/tokenizer.c — the tokenizers JSONL text goes through: the byte-level
 * one, and the BPE encodings of teraio/tok.h behind the same
 * tio_data_tokenizer table, named so that the loader's state fingerprint
 * tells vocabularies apart.
 */
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "data/data_internal.h"
#include "teraio/tok.h"

static int64_t bytes_encode(void *ctx, const char *text, size_t len, uint32_t *ids, size_t cap)
{
    (void)ctx;
    size_t n = len < cap ? len : cap;
    for (size_t i = 0; i < n; i++)
        ids[i] = (unsigned char)text[i];
    return (int64_t)len;
}

static const tio_data_tokenizer bytes_tokenizer = {"bytes", NULL, bytes_encode, 256};

const tio_data_tokenizer *tio_data_tokenizer_bytes(void) { return &bytes_tokenizer; }

typedef struct {
    tio_data_tokenizer table; /* first: the public pointer is this struct's */
    tio_tok *tok;
    char name[64];
} bpe_tokenizer;

/* tio_tok_max_ids(len) ids always suffice (len, but more for a
 * tokenizer.json that adds prefix spaces): when cap is smaller, ask for it. */
static int64_t bpe_encode(void *ctx, const char *text, size_t len, uint32_t *ids, size_t cap)
{
    size_t n = 0;
    int rc = tio_tok_encode(ctx, text, len, TIO_TOK_SPECIAL_TEXT, ids, cap, &n);
    if (rc == -ENOSPC) {
        size_t need = tio_tok_max_ids(ctx, len);
        return (int64_t)(need > cap ? need : cap + 1);
    }
    return rc ? rc : (int64_t)n;
}

static bool has_suffix(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

int tio_data_tokenizer_open(const char *spec, const char *dir, tio_data_tokenizer **out)
{
    *out = NULL;
    if (!spec || !strcmp(spec, "bytes")) {
        *out = (tio_data_tokenizer *)&bytes_tokenizer;
        return 0;
    }
    bool builtin = false;
    for (size_t i = 0; tio_tok_encoding_name(i); i++)
        builtin |= !strcmp(spec, tio_tok_encoding_name(i));
    if (!builtin && !has_suffix(spec, ".json"))
        return tio_fail(-ENOENT, "unknown tokenizer '%s': expected bytes, r50k_base, p50k_base, "
                        "cl100k_base, o200k_base or a tokenizer.json path", spec);
    bpe_tokenizer *t = calloc(1, sizeof *t);
    if (!t)
        return tio_fail(-ENOMEM, "out of memory");
    int rc;
    if (builtin) {
        rc = tio_tok_load_encoding(&t->tok, spec, dir);
        snprintf(t->name, sizeof t->name, "%s", spec);
    } else {
        char *text = NULL;
        size_t len = 0;
        rc = tio_read_file(spec, &text, &len);
        if (!rc)
            rc = tio_tok_parse_hf_named(&t->tok, text, len, spec);
        uint64_t h = 0xCBF29CE484222325ull;
        for (size_t i = 0; i < len; i++)
            h = (h ^ (uint8_t)text[i]) * 0x100000001B3ull;
        free(text);
        snprintf(t->name, sizeof t->name, "hf:%016llx", (unsigned long long)h);
    }
    if (rc) {
        free(t);
        return rc;
    }
    t->table = (tio_data_tokenizer){t->name, t->tok, bpe_encode, tio_tok_vocab_size(t->tok)};
    *out = &t->table;
    return 0;
}

void tio_data_tokenizer_close(tio_data_tokenizer *tok)
{
    if (!tok || tok == &bytes_tokenizer)
        return;
    bpe_tokenizer *t = (bpe_tokenizer *)tok;
    tio_tok_destroy(t->tok);
    free(t);
}
