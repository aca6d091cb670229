/*
 * fuzz/fuzz_tok_json.c — libFuzzer target for the Hugging Face
 * tokenizer.json reader (tio_tok_parse_hf).
 *
 * Raw bytes, not NUL-terminated; a parse must fail cleanly with a message
 * or give a tokenizer that encodes a fixed text and the input itself
 * losslessly (the seeds are small valid byte-level BPE files, so the
 * fuzzer mutates from there).  Seeds: fuzz/corpus/fuzz_tok_json/.
 */
#include <errno.h>
#include <stdint.h>

#include "fuzz_tok_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *json = malloc(size ? size : 1);
    if (!json)
        return 0;
    if (size)
        memcpy(json, data, size);
    tio_tok *tok = NULL;
    int rc = tio_tok_parse_hf(&tok, json, size);
    if (rc == 0) {
        static const char fixed[] = "Hello, world! don't 123 <|endoftext|> \xff\xfe \xe4\xb8\x96";
        fuzz_round_trip(tok, (const uint8_t *)fixed, sizeof fixed - 1, TIO_TOK_SPECIAL_TEXT);
        fuzz_round_trip(tok, data, size, TIO_TOK_SPECIAL_ALLOW);
        tio_tok_destroy(tok);
    } else if (tok != NULL || tio_last_error()[0] == '\0') {
        abort();
    }
    free(json);
    return 0;
}
