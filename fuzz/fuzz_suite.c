/*
 * fuzz/fuzz_suite.c — libFuzzer target for the evaluation suite index
 * reader (tio_sim_suite_parse, include/teraio/sim.h).
 *
 * Feeds raw bytes (not NUL-terminated, any length).  A parse either fails
 * with a message or gives a suite with a named profile, at least one
 * configuration, every name NUL-terminated within its field and free of
 * '/', every count >= 1 and every reference fraction in [0, 1].  Seeds:
 * fuzz/corpus/fuzz_suite/ (the paper's index and a minimal one).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "teraio/sim.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static bool name_ok(const char *s, size_t max)
{
    const char *end = memchr(s, '\0', max);
    return end && end != s && !memchr(s, '/', (size_t)(end - s));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* libFuzzer's buffer is exactly `size` bytes: ASan catches a read past it. */
    tio_sim_suite *s = NULL;
    int rc = tio_sim_suite_parse((const char *)data, size, "fuzz", &s);
    if (rc != 0) {
        if (s || tio_last_error()[0] == '\0')
            abort();
        return 0;
    }
    if (!s || s->n_configs == 0 || !name_ok(s->hw_name, sizeof s->hw_name))
        abort();
    for (uint32_t i = 0; i < s->n_configs; i++) {
        const tio_sim_suite_config *c = &s->configs[i];
        if (!name_ok(c->model, sizeof c->model) || !name_ok(c->trace, sizeof c->trace) ||
            !c->batch || !c->seq || !c->micro_batch || !c->shards ||
            !isfinite(c->reference_m_pct) || c->reference_m_pct < 0)
            abort();
    }
    for (uint32_t i = 0; i < s->n_references; i++) {
        const tio_sim_suite_reference *r = &s->references[i];
        if (!name_ok(r->model, sizeof r->model) || !tio_sim_strategy_name(r->strategy) ||
            !(r->fraction_of_ideal >= 0 && r->fraction_of_ideal <= 1))
            abort();
    }
    tio_sim_suite_destroy(s);
    return 0;
}
