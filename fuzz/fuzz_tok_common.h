/*
 * fuzz/fuzz_tok_common.h — shared by the tokenizer fuzz targets: the 256
 * single-byte lines every byte-level rank file needs (so that mutations of
 * the rest can parse), and the round-trip check every encode must pass.
 */
#ifndef FUZZ_TOK_COMMON_H
#define FUZZ_TOK_COMMON_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "teraio/tok.h"
#include "tok/tok_internal.h" /* TOK_PATTERN_* */

/* "<base64 of byte b> b\n" for b = 0..255 into out (>= 256 * 12 bytes). */
static inline size_t fuzz_byte_lines(char *out)
{
    static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t n = 0;
    for (int b = 0; b < 256; b++)
        n += (size_t)sprintf(out + n, "%c%c== %d\n", b64[b >> 2], b64[(b & 3) << 4], b);
    return n;
}

/* Encode data in `special` mode into tio_tok_max_ids ids (which must
 * suffice); valid results must decode back to data or, for a tokenizer.json
 * with add_prefix_space (tio_tok_max_ids above len), to data with a space
 * added before some stretches: nothing but spaces added, nothing lost.  Any
 * failure other than the documented ones aborts. */
static inline void fuzz_round_trip(const tio_tok *tok, const uint8_t *data, size_t size, int special)
{
    size_t cap = tio_tok_max_ids(tok, size);
    bool prefix = tio_tok_max_ids(tok, 2) > 2;
    uint32_t *ids = malloc((cap + 1) * sizeof *ids);
    uint8_t *back = malloc(2 * size + 1);
    size_t n = 0, nb = 0;
    int rc = tio_tok_encode(tok, data, size, special, ids, cap, &n);
    if (rc == 0) {
        if (n > cap || tio_tok_decode(tok, ids, n, back, 2 * size + 1, &nb) != 0)
            abort();
        if (!prefix && (nb != size || (size && memcmp(back, data, size))))
            abort();
        size_t i = 0, j = 0;
        for (; j < nb; j++)
            if (i < size && back[j] == data[i])
                i++;
            else if (back[j] != ' ')
                abort();
        if (i != size)
            abort();
    } else if (!(rc == TIO_EPARSE && special == TIO_TOK_SPECIAL_REJECT)) {
        abort();
    }
    free(ids);
    free(back);
}

/* A toy byte-level vocabulary (the 256 bytes plus merges of common ASCII
 * pairs and triples) with split regex `pattern` and two special tokens. */
static inline tio_tok *fuzz_toy_tok(const char *pattern)
{
    static const char *merged[] = {"th", "he", "the", " t", " th", " the", "in", "ing", "  ", "    ",
                                   "\n\n", "12", "123", "er", "re", "'s", "<|", "|>"};
    static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *text = malloc(256 * 12 + 64 * 32);
    size_t n = fuzz_byte_lines(text);
    int rank = 256;
    for (size_t i = 0; i < sizeof merged / sizeof merged[0]; i++) {
        const uint8_t *s = (const uint8_t *)merged[i];
        size_t len = strlen(merged[i]);
        for (size_t k = 0; k < len; k += 3) {
            uint32_t w = (uint32_t)s[k] << 16 | (k + 1 < len ? (uint32_t)s[k + 1] << 8 : 0) |
                         (k + 2 < len ? s[k + 2] : 0);
            text[n++] = b64[w >> 18];
            text[n++] = b64[(w >> 12) & 63];
            text[n++] = k + 1 < len ? b64[(w >> 6) & 63] : '=';
            text[n++] = k + 2 < len ? b64[w & 63] : '=';
        }
        n += (size_t)sprintf(text + n, " %d\n", rank++);
    }
    static const tio_tok_special specials[] = {{"<|endoftext|>", 1000}, {"<|end|>", 1001}};
    tio_tok *tok = NULL;
    if (tio_tok_parse_tiktoken(&tok, text, n, pattern, specials, 2) != 0)
        abort();
    free(text);
    return tok;
}

/* fuzz_toy_tok with the i-th built-in pattern (GPT-2, cl100k, o200k; i % 3),
 * made once per process. */
static inline const tio_tok *fuzz_builtin_tok(unsigned i)
{
    static tio_tok *toks[3];
    static const char *patterns[3] = {TOK_PATTERN_GPT2, TOK_PATTERN_CL100K, TOK_PATTERN_O200K};
    if (!toks[i % 3])
        toks[i % 3] = fuzz_toy_tok(patterns[i % 3]);
    return toks[i % 3];
}

#endif
