/*
 * cli/advise.h — the two halves of `teraio advise`: cmd_advise.c (arguments,
 * the trace, the run) and advise_out.c (table, JSON, SVG).  cmd_advise.c
 * calls advise_out.c, never the other way.
 */
#ifndef TERAIO_CLI_ADVISE_H
#define TERAIO_CLI_ADVISE_H

#include <stdbool.h>
#include <stdint.h>

#include "teraio/teraio.h"

/* What the output names: where the trace came from and the job's shape. */
typedef struct {
    const char *model;          /* --model, --config or the trace file */
    const char *trace_path;
    const char *hw_name;
    uint64_t tokens_per_iteration;
    double target;              /* share of ideal the smallest hardware must reach */
    const tio_advise_prices *prices;
} advise_job_info;

/* The table on stdout, then the smallest (and cheapest) hardware reaching
 * the target. */
void advise_print_table(const advise_job_info *job, const tio_advise_row *rows, uint32_t n);

/* One JSON document on stdout. */
void advise_print_json(const advise_job_info *job, const tio_advise_row *rows, uint32_t n);

/* Iteration time against SSD count, one panel per GPU count, device memory
 * and host cap; written atomically to `path`.  Returns the exit status (one
 * error line printed). */
int advise_write_svg(const char *path, const advise_job_info *job, const tio_advise_row *rows,
                     uint32_t n);

#endif
