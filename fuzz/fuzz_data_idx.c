/*
 * fuzz/fuzz_data_idx.c — libFuzzer target for the Megatron .idx parser.
 *
 * The first 8 bytes give the size of the companion .bin; the rest is the
 * index.  A successful parse must describe sequences that lie inside the
 * .bin and document indices that are in range; a failure must leave a
 * message.  Seeds: fuzz/corpus/fuzz_data_idx/.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "data/data_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 8)
        return 0;
    uint64_t bin;
    memcpy(&bin, data, 8);
    bin &= 0xFFFFFFFFull;
    uint8_t *buf = malloc(size - 8 ? size - 8 : 1);
    if (!buf)
        return 0;
    memcpy(buf, data + 8, size - 8);
    tio_mmidx ix;
    int rc = tio_mmidx_parse(buf, size - 8, bin, "fuzz.idx", &ix);
    if (rc == 0) {
        int w = tio_mmidx_dtype_size(ix.dtype);
        for (uint64_t i = 0; i < ix.n_seqs; i++)
            if (tio_mmidx_u64(ix.pointers, i) + (uint64_t)tio_mmidx_u32(ix.lengths, i) * (uint64_t)w > bin)
                abort();
        for (uint64_t d = 0; d < ix.n_docs; d++)
            if (tio_mmidx_u64(ix.doc_index, d + 1) > ix.n_seqs)
                abort();
    } else if (tio_last_error()[0] == '\0') {
        abort();
    }
    free(buf);
    return 0;
}
