/*
 * fuzz/fuzz_hw.c — libFuzzer target for the hardware profile reader.
 *
 * Feeds raw bytes (not NUL-terminated, any length) to tio_hw_parse.  A parse
 * either fails with a message or gives a profile whose required values are
 * in range (capacity > 0, at least one SSD, positive finite bandwidths and
 * CPU Adam rate), and whose derived channel bandwidths are then positive and
 * finite.  Seeds: fuzz/corpus/fuzz_hw/ (the shipped profiles and edge cases).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "teraio/sim.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static bool positive(double v) { return v > 0 && isfinite(v); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* Copy into an exact-size buffer so ASan catches any read past the end. */
    char *text = malloc(size ? size : 1);
    if (!text)
        return 0;
    if (size)
        memcpy(text, data, size);
    tio_hw hw;
    int rc = tio_hw_parse(text, size, "fuzz", &hw);
    if (rc == 0) {
        if (hw.capacity_bytes == 0 || hw.ssd_count == 0 || !positive(hw.pcie_h2d_gbps) ||
            !positive(hw.pcie_d2h_gbps) || !positive(hw.ssd_read_gbps) ||
            !positive(hw.ssd_write_gbps) || !positive(hw.cpu_adam_params_per_s) ||
            memchr(hw.name, '\0', sizeof hw.name) == NULL || hw.name[0] == '\0')
            abort();
        tio_hw_bandwidth bw = tio_hw_channels(&hw);
        if (!positive(bw.ssd_read) || !positive(bw.ssd_write) || !positive(bw.host_read) ||
            !positive(bw.host_write))
            abort();
        tio_plan_options opt;
        tio_hw_plan_options(&hw, &opt);
        if (opt.capacity_bytes != hw.capacity_bytes)
            abort();
    } else if (tio_last_error()[0] == '\0') {
        abort();
    }
    free(text);
    return 0;
}
