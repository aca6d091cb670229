/*
 * fuzz/fuzz_tok_split.c — libFuzzer target comparing the built-in splitter
 * (src/tok/split_builtin.h) with PCRE2 on the same pattern.
 *
 * The first input byte picks the pattern (GPT-2, cl100k, o200k); the rest
 * is text of any validity.  tok_split_pieces must give the same piece ends
 * both ways, or the target aborts.  Seeds: fuzz/corpus/fuzz_tok_split/.
 */
#include <errno.h>
#include <stdint.h>

#include "fuzz_tok_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    const tio_tok *tok = fuzz_builtin_tok(data[0]);
    size_t len = size - 1, n_fast = 0, n_ref = 0;
    uint8_t *text = malloc(len ? len : 1); /* exact size for ASan */
    size_t *fast = malloc((len + 1) * sizeof *fast), *ref = malloc((len + 1) * sizeof *ref);
    if (!text || !fast || !ref)
        abort();
    memcpy(text, data + 1, len);
    if (tok_split_pieces(tok, false, text, len, fast, len + 1, &n_fast) != 0 ||
        tok_split_pieces(tok, true, text, len, ref, len + 1, &n_ref) != 0 || n_fast != n_ref ||
        (n_fast && memcmp(fast, ref, n_fast * sizeof *fast)))
        abort();
    free(text);
    free(fast);
    free(ref);
    return 0;
}
