/*
 * plan/plan_internal.h — helpers shared by the planner (planner.c) and the
 * plan file reader/writer (plan_io.c).
 *
 * Both must leave tio_plan.migrations in the one order the header promises
 * (by trigger kernel, offloads before prefetches at the same kernel, then in
 * the order they were emitted or read), so that a saved plan loads back
 * byte-for-byte identical; the ordering and the byte formatting used in
 * messages live here once.
 */
#ifndef TERAIO_PLAN_INTERNAL_H
#define TERAIO_PLAN_INTERNAL_H

#include "teraio/plan.h"

/* Sort `n` migrations by (trigger_kernel, offload before prefetch), keeping
 * the current order among equal keys.  Returns 0 or -ENOMEM. */
int tio_plan_sort_migrations(tio_migration *m, uint32_t n);

/* Format a byte count for a message: "812 B", "1.50 MiB" (powers of 1024,
 * two decimals), the same style as the CLI.  `buf` holds >= 32 bytes. */
char *tio_plan_format_bytes(uint64_t bytes, char *buf);

/* Validate planner inputs (shared by tio_plan_build and
 * tio_plan_build_fast): returns 0, -EINVAL or TIO_EINFEASIBLE with a
 * message, exactly as tio_plan_build documents. */
int tio_plan_check_inputs(const tio_trace *trace, const tio_lifetime *lt,
                          const tio_plan_options *opt);

#endif
