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

#define FUZZ_GPT2_PATTERN \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define FUZZ_CL100K_PATTERN                                                                    \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+" \
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

/* "<base64 of byte b> b\n" for b = 0..255 into out (>= 256 * 12 bytes). */
static inline size_t fuzz_byte_lines(char *out)
{
    static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t n = 0;
    for (int b = 0; b < 256; b++)
        n += (size_t)sprintf(out + n, "%c%c== %d\n", b64[b >> 2], b64[(b & 3) << 4], b);
    return n;
}

/* Encode data in `special` mode; valid results must decode back to data
 * (or, for a tokenizer.json with add_prefix_space, to " " + data).  Any
 * failure other than the documented ones aborts. */
static inline void fuzz_round_trip(const tio_tok *tok, const uint8_t *data, size_t size, int special)
{
    uint32_t *ids = malloc((size + 1) * sizeof *ids);
    char *back = malloc(size + 1);
    size_t n = 0, nb = 0;
    int rc = tio_tok_encode(tok, data, size, special, ids, size + 1, &n);
    if (rc == 0) {
        if (n > size + 1 || tio_tok_decode(tok, ids, n, back, size + 1, &nb) != 0)
            abort();
        bool same = nb == size && (!size || !memcmp(back, data, size));
        bool prefixed = nb == size + 1 && back[0] == ' ' && (!size || !memcmp(back + 1, data, size));
        if (!same && !prefixed)
            abort();
    } else if (!(rc == TIO_EPARSE && special == TIO_TOK_SPECIAL_REJECT) && rc != -ENOSPC) {
        abort();
    }
    free(ids);
    free(back);
}

#endif
