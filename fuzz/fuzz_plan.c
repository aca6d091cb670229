/*
 * fuzz/fuzz_plan.c — libFuzzer target for the plan file reader.
 *
 * Feeds raw bytes (not NUL-terminated, any length) to tio_plan_parse; a
 * parse must either fail cleanly with a message or give a plan whose
 * kernel indices lie in range, and the plan must then free cleanly.
 * Seeds: fuzz/corpus/fuzz_plan/.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "teraio/plan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* Copy into an exact-size buffer so ASan catches any read past the end. */
    char *text = malloc(size ? size : 1);
    if (!text)
        return 0;
    if (size)
        memcpy(text, data, size);
    tio_plan *plan = NULL;
    int rc = tio_plan_parse(text, size, "fuzz", &plan);
    if (rc == 0) {
        for (uint32_t i = 0; i < plan->n_migrations; i++) {
            const tio_migration *m = &plan->migrations[i];
            if (m->trigger_kernel >= plan->n_kernels || m->deadline_kernel >= plan->n_kernels ||
                (i > 0 && plan->migrations[i - 1].trigger_kernel > m->trigger_kernel))
                abort();
        }
        tio_plan_destroy(plan);
    } else if (plan != NULL || tio_last_error()[0] == '\0') {
        abort();
    }
    free(text);
    return 0;
}
