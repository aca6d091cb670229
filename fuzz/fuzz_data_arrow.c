/*
 * fuzz/fuzz_data_arrow.c — libFuzzer target for the Arrow IPC reader
 * (encapsulated messages, flatbuffer Schema and RecordBatch metadata).
 *
 * A successful parse must give record batches whose token values lie inside
 * the input; a failure must leave a message.  Seeds: fuzz/corpus/fuzz_data_arrow/
 * (files written by pyarrow: ipc.new_file and ipc.new_stream).
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
    tio_arrow_index ix;
    int rc = tio_arrow_parse(buf, size, "tokens", "fuzz.arrow", &ix);
    if (rc == 0) {
        for (uint32_t i = 0; i < ix.n_batches; i++) {
            const tio_arrow_batch *b = &ix.batches[i];
            if (b->offset > size || b->count * (uint64_t)ix.width > size - b->offset)
                abort();
        }
        tio_arrow_index_free(&ix);
    } else if (tio_last_error()[0] == '\0') {
        abort();
    }
    free(buf);
    return 0;
}
