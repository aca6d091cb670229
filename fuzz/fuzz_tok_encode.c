/*
 * fuzz/fuzz_tok_encode.c — libFuzzer target for encoding arbitrary bytes
 * (any UTF-8 validity, special-token strings, long runs).
 *
 * A toy byte-level vocabulary (fuzz_toy_tok) with the real GPT-2, cl100k and
 * o200k split patterns; the first input byte picks the pattern and the
 * special-token mode.  Every
 * successful encode must decode to the input; REJECT may fail only with
 * TIO_EPARSE.  Seeds: fuzz/corpus/fuzz_tok_encode/.
 */
#include <errno.h>
#include <stdint.h>

#include "fuzz_tok_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    int special = data[0] % 3;
    const tio_tok *tok = fuzz_builtin_tok(data[0] >> 2);
    uint8_t *text = malloc(size - 1 ? size - 1 : 1); /* exact size for ASan */
    memcpy(text, data + 1, size - 1);
    fuzz_round_trip(tok, text, size - 1, special);
    free(text);
    return 0;
}
