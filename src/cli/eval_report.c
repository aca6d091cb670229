/*
 * cli/eval_report.c — one strategy's simulation report (tio_sim_report) as
 * the JSON object `teraio eval` prints, for both its halves: one trace
 * (cmd_eval.c) and the paper's suite (eval_paper.c).
 *
 * It lives apart from both so that the two print the same fields in the
 * same units, and so that neither half calls into the other for it.
 */
#include <stdio.h>

#include "cli/eval.h"

void eval_print_report_json(const char *name, const tio_sim_report *r, bool comma)
{
    printf("    {\"strategy\": \"%s\", \"iteration_s\": %.6f, \"ideal_s\": %.6f, "
           "\"fraction_of_ideal\": %.4f, \"stall_s\": %.6f, \"peak_bytes\": %llu, "
           "\"overflow_bytes\": %llu, \"plan_fits\": %s, \"plan_seconds\": %.4f, "
           "\"bytes\": {\"ssd_write\": %llu, \"ssd_read\": %llu, \"host_write\": %llu, "
           "\"host_read\": %llu}}%s\n",
           name, r->iteration_ns / 1e9, r->ideal_ns / 1e9, r->fraction_of_ideal,
           r->stall_ns / 1e9, (unsigned long long)r->peak_bytes,
           (unsigned long long)r->overflow_bytes, r->plan_fits ? "true" : "false",
           r->plan_seconds, (unsigned long long)r->bytes[TIO_CH_SSD_WRITE],
           (unsigned long long)r->bytes[TIO_CH_SSD_READ],
           (unsigned long long)r->bytes[TIO_CH_HOST_WRITE],
           (unsigned long long)r->bytes[TIO_CH_HOST_READ], comma ? "," : "");
}
