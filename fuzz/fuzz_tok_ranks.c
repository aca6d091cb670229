/*
 * fuzz/fuzz_tok_ranks.c — libFuzzer target for the tiktoken rank-file
 * parser (tio_tok_parse_tiktoken).
 *
 * The input is appended to the 256 single-byte lines, so mutations of the
 * merged tokens (and of everything else) reach a successful parse; the
 * input must then fail cleanly with a message, or give a tokenizer that
 * encodes the input itself losslessly.  Seeds: fuzz/corpus/fuzz_tok_ranks/.
 */
#include <errno.h>
#include <stdint.h>

#include "fuzz_tok_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(256 * 12 + size + 1);
    if (!text)
        return 0;
    size_t n = fuzz_byte_lines(text);
    if (size)
        memcpy(text + n, data, size);
    static const tio_tok_special specials[] = {{"<|endoftext|>", 100000}};
    tio_tok *tok = NULL;
    int rc = tio_tok_parse_tiktoken(&tok, text, n + size, TOK_PATTERN_GPT2, specials, 1);
    if (rc == 0) {
        fuzz_round_trip(tok, data, size, TIO_TOK_SPECIAL_TEXT);
        fuzz_round_trip(tok, data, size, TIO_TOK_SPECIAL_ALLOW);
        tio_tok_destroy(tok);
    } else if (tok != NULL || tio_last_error()[0] == '\0') {
        abort();
    }
    free(text);
    return 0;
}
