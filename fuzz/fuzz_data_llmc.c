/*
 * fuzz/fuzz_data_llmc.c — libFuzzer target for the llm.c shard header check.
 *
 * A header accepted must promise no more tokens than the input holds after
 * its 1024 header bytes; a failure must leave a message.
 * Seeds: fuzz/corpus/fuzz_data_llmc/.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "data/data_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    int width = 0;
    uint64_t n = 0;
    uint32_t delim = 0;
    int rc = tio_llmc_parse_header(buf, size, "fuzz.bin", &width, &n, &delim);
    if (rc == 0) {
        if ((width != 2 && width != 4) || 1024 + n * (uint64_t)width > size)
            abort();
    } else if (tio_last_error()[0] == '\0') {
        abort();
    }
    free(buf);
    return 0;
}
