/*
 * cli/eval.h — the two halves of `teraio eval`: cmd_eval.c (arguments, one
 * trace) and eval_paper.c (the paper's suite: table, JSON, charts), and
 * what both print through: eval_report.c (a report as JSON) and eval_svg.c
 * (charts).  cmd_eval.c calls eval_paper.c, never the other way.
 */
#ifndef TERAIO_CLI_EVAL_H
#define TERAIO_CLI_EVAL_H

#include <stdbool.h>
#include <stdio.h>

#include "teraio/teraio.h"

typedef struct {
    const char *mode, *target, *hw_path, *plan_path, *svg_dir, *strategy, *traces_dir;
    double alg1_seconds;   /* paper: how long the faithful Algorithm 1 may run; 0: skip */
    bool json;
} eval_args;

/* One strategy's report `r` under `name` as a JSON object on stdout,
 * indented four spaces, followed by "," when `comma` and a newline
 * (eval_report.c). */
void eval_print_report_json(const char *name, const tio_sim_report *r, bool comma);

/* fraction-of-ideal.svg and memory-timeline.svg (the first configuration)
 * under `dir`; returns the exit status (one error line printed). */
int eval_svg_write(const char *dir, const tio_sim_suite *suite, const tio_sim_suite_result *res,
                   const tio_hw *hw);

/* `teraio eval paper`; returns the exit status. */
int eval_paper(const eval_args *a);

#endif
