/*
 * fuzz/fuzz_tok_encode.c — libFuzzer target for encoding arbitrary bytes
 * (any UTF-8 validity, special-token strings, long runs).
 *
 * A toy byte-level vocabulary (the 256 bytes plus merges of common ASCII
 * pairs and triples) with the real GPT-2 and cl100k split patterns; the
 * first input byte picks the pattern and the special-token mode.  Every
 * successful encode must decode to the input; REJECT may fail only with
 * TIO_EPARSE.  Seeds: fuzz/corpus/fuzz_tok_encode/.
 */
#include <errno.h>
#include <stdint.h>

#include "fuzz_tok_common.h"

static tio_tok *toks[2];

static tio_tok *build(const char *pattern)
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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!toks[0]) {
        toks[0] = build(FUZZ_GPT2_PATTERN);
        toks[1] = build(FUZZ_CL100K_PATTERN);
    }
    if (size == 0)
        return 0;
    int special = data[0] % 3;
    const tio_tok *tok = toks[(data[0] >> 2) & 1];
    uint8_t *text = malloc(size - 1 ? size - 1 : 1); /* exact size for ASan */
    memcpy(text, data + 1, size - 1);
    fuzz_round_trip(tok, text, size - 1, special);
    free(text);
    return 0;
}
