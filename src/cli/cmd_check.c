/*
 * cli/cmd_check.c — `teraio check TRACE PLAN`: does this plan apply to this
 * trace?  Loads both, runs tio_plan_check (tensor ids, kernel range, sizes,
 * offload/prefetch pairing inside inactive periods) and prints the planned
 * peak against the capacity.  The runtime does the same checks at start-up;
 * this lets a user find a stale or foreign plan before a training job does.
 */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "teraio/teraio.h"

static const char *const CMD = "check";

int cmd_check(int argc, char **argv)
{
    if (argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        printf("usage: teraio check TRACE PLAN\n\n"
               "Check that PLAN (from 'teraio plan') applies to TRACE and print its\n"
               "planned peak memory.  Exit status 0 if it applies, 1 if not.\n");
        return 0;
    }
    if (argc != 3) {
        fprintf(stderr, "teraio check: expected TRACE and PLAN (try 'teraio check --help')\n");
        return 2;
    }
    tio_trace *trace = NULL;
    tio_lifetime *lt = NULL;
    tio_plan *plan = NULL;
    int status = 1;
    int rc = tio_trace_load(argv[1], &trace);
    if (rc == 0)
        rc = tio_lifetime_analyze(trace, &lt);
    if (rc == 0)
        rc = tio_plan_load(argv[2], &plan);
    if (rc == 0) {
        rc = tio_plan_check(plan, trace, lt);
        if (rc < 0)
            cli_error(CMD, "%s: %s", argv[2], tio_last_error());
    } else {
        cli_lib_error(CMD, rc);
    }
    if (rc == 0) {
        char a[32], b[32], c[32];
        printf("plan %s applies to trace %s\n", argv[2], argv[1]);
        printf("  kernels %u, tensors %u, migrations %u\n", trace->n_kernels, trace->n_tensors,
               plan->n_migrations);
        printf("  peak without offloading %s, planned peak %s, capacity %s: %s\n",
               tio_format_bytes(lt->peak_bytes, a), tio_format_bytes(plan->planned_peak_bytes, b),
               tio_format_bytes(plan->capacity_bytes, c), plan->fits ? "fits" : "does NOT fit");
        status = 0;
    }
    tio_plan_destroy(plan);
    tio_lifetime_destroy(lt);
    tio_trace_destroy(trace);
    return status;
}
