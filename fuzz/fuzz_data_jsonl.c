/*
 * fuzz/fuzz_data_jsonl.c — libFuzzer target for the JSONL line reader
 * (object walk, value skipping, string unescaping to UTF-8).
 *
 * The input is one line.  A successful read must give a NUL-terminated text
 * no longer than the line (no escape grows); a failure must leave a message.
 * Seeds: fuzz/corpus/fuzz_data_jsonl/.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "data/data_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *line = malloc(size ? size : 1);
    if (!line)
        return 0;
    memcpy(line, data, size);
    char *text = NULL;
    size_t n = 0;
    int rc = tio_jsonl_text(line, size, "text", "fuzz.jsonl: line 1", &text, &n);
    if (rc == 0) {
        if (!text || n > size || text[n] != '\0')
            abort();
        free(text);
    } else if (text != NULL || tio_last_error()[0] == '\0') {
        abort();
    }
    free(line);
    return 0;
}
