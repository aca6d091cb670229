/*
 * data/parquet.c — the Parquet format (placeholder until the shim lands).
 */
#include "common/util.h"
#include "data/data_internal.h"

bool tio_parquet_available(const char **why)
{
    *why = "not built";
    return false;
}

static int parquet_open(tio_dataset *ds, tio_data_file *f)
{
    (void)ds;
    return tio_fail(-ENOTSUP, "%s: Parquet is unavailable: not built", f->rel);
}

static void parquet_close(tio_data_file *f) { (void)f; }

const tio_data_format tio_format_parquet = {"Parquet", parquet_open, parquet_close, NULL, NULL,
                                            NULL, NULL};
