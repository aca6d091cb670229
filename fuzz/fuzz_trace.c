/*
 * fuzz/fuzz_trace.c — libFuzzer target for the trace file reader and the
 * lifetime analysis behind it.
 *
 * Feeds raw bytes (not NUL-terminated, any length) to tio_trace_parse.  A
 * parse must either fail with a message and no trace, or give a trace that
 * passes tio_trace_validate (the reader promises that) and that lifetime
 * analysis accepts; the analysis must then satisfy invariants a reader can
 * check without the code: M[k] >= active_bytes[k] (what a kernel touches is
 * resident), periods sorted by (tensor, last_use) with a kernel in between,
 * and each period's idle_ns equal to tio_lifetime_span_ns over its gap.
 * Seeds: fuzz/corpus/fuzz_trace/.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "teraio/lifetime.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_lifetime(const tio_lifetime *lt)
{
    for (uint32_t k = 0; k < lt->n_kernels; k++)
        if (lt->memory_bytes[k] < lt->active_bytes[k] || lt->memory_bytes[k] > lt->peak_bytes)
            abort();
    for (uint32_t i = 0; i < lt->n_periods; i++) {
        const tio_inactive_period *p = &lt->periods[i];
        if (p->next_use - p->last_use < 2 || p->tensor >= lt->n_tensors ||
            p->idle_ns != tio_lifetime_span_ns(lt, (uint64_t)p->last_use + 1, p->next_use))
            abort();
        if (i > 0) {
            const tio_inactive_period *q = &lt->periods[i - 1];
            if (q->tensor > p->tensor || (q->tensor == p->tensor && q->last_use >= p->last_use))
                abort();
        }
    }
    tio_lifetime_stats st;
    if (tio_lifetime_stats_compute(lt, 2.0, 1.5, &st) != 0 || st.n_periods_long > st.n_periods)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* Copy into an exact-size buffer so ASan catches any read past the end. */
    char *text = malloc(size ? size : 1);
    if (!text)
        return 0;
    if (size)
        memcpy(text, data, size);
    tio_trace *trace = NULL;
    int rc = tio_trace_parse(text, size, "fuzz", &trace);
    if (rc == 0) {
        if (tio_trace_validate(trace) != 0)
            abort();
        tio_lifetime *lt = NULL;
        rc = tio_lifetime_analyze(trace, &lt);
        if (rc == 0)
            check_lifetime(lt);
        else if (rc != -ENOMEM)
            abort();
        tio_lifetime_destroy(lt);
        tio_trace_destroy(trace);
    } else if (trace != NULL || tio_last_error()[0] == '\0') {
        abort();
    }
    free(text);
    return 0;
}
