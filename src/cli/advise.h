/*
 * cli/advise.h — the two halves of `teraio advise`: cmd_advise.c (arguments,
 * the trace, the run) and advise_out.c (table, JSON, SVG).  cmd_advise.c
 * calls advise_out.c, never the other way.
 */
#ifndef TERAIO_CLI_ADVISE_H
#define TERAIO_CLI_ADVISE_H

#include <stdbool.h>
#include <stdint.h>

#include "common/util.h"
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

/* The chart's file, opened (atomically: written aside, renamed when done)
 * before the sweep so that a path that cannot be written is refused first;
 * returns the exit status (one error line printed). */
int advise_svg_open(const char *path, tio_atomic_file *af);

/* Iteration time against SSDs per GPU, one panel per GPU count, device
 * memory and host cap (16 at most), one scale; written to `af` and
 * committed, or dropped on error.  Returns the exit status. */
int advise_svg_write(tio_atomic_file *af, const advise_job_info *job, const tio_advise_row *rows,
                     uint32_t n);

#endif
