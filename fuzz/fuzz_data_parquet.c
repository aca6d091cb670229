/*
 * fuzz/fuzz_data_parquet.c — libFuzzer target for the Parquet path: the
 * input is a whole Parquet file, opened from memory through the shim
 * (footer, schema and column choice), every row group decoded (pages,
 * levels, values, the conversion to teraio's offsets and ids) and checked
 * for what the loader relies on.  Bad input must fail with a message, never
 * crash.  Without the shim (Parquet unavailable) the target only checks
 * that it says so.  Seeds: fuzz/corpus/fuzz_data_parquet/ (files written by
 * pyarrow: text in row groups, a null row, token lists).
 */
#include <stdint.h>
#include <stdlib.h>

#include "common/util.h"
#include "data/data_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tio_clear_error();
    int rc = tio_parquet_check_buffer(data, size, "text");
    if (rc != 0 && tio_last_error()[0] == '\0')
        abort(); /* every failure names what was wrong */
    return 0;
}
