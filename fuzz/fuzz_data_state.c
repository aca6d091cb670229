/*
 * fuzz/fuzz_data_state.c — libFuzzer target for the loader state parser and
 * loader creation from a state.
 *
 * A fixed tiny dataset (one llm.c shard of 6 documents, written once to a
 * temporary folder) and fixed settings; the input is a state file.  Loading
 * must fail with a message or give a loader that then delivers samples.
 * The CRC check is bypassed by recomputing it, so the fuzzer reaches the
 * parser.  Seeds: fuzz/corpus/fuzz_data_state/ (states of this dataset).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#include "data/data_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static tio_dataset *ds;
static char root[256];

/* The fuzzer exits through exit(): remove the scratch dataset then. */
static void remove_root(void)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    (void)!system(cmd);
}

static tio_dataset *dataset(void)
{
    if (ds)
        return ds;
    char path[300];
    snprintf(root, sizeof root, "/tmp/fuzz_data_state.%d", (int)getpid());
    atexit(remove_root);
    snprintf(path, sizeof path, "%s/s", root);
    mkdir(root, 0755);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/s/x.bin", root);
    int32_t header[256] = {20240520, 1, 24};
    uint16_t toks[24];
    for (int i = 0; i < 24; i++)
        toks[i] = i % 4 == 0 ? 50256 : (uint16_t)i;
    FILE *f = fopen(path, "wb");
    if (!f)
        abort();
    fwrite(header, 4, 256, f);
    fwrite(toks, 2, 24, f);
    fclose(f);
    if (tio_dataset_open(root, NULL, &ds) != 0)
        abort();
    return ds;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tio_dataset *d = dataset();
    uint8_t *buf = malloc(size + 4);
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    uint32_t crc = tio_crc32(buf, size);
    memcpy(buf + size, &crc, 4);
    tio_loader_options o;
    tio_loader_options_default(&o);
    o.seq_len = 7;
    o.logical_shards = 4;
    o.shuffle_buffer = 2;
    o.prefetch = 0;
    size_t len = size + 4;
    const void *states[1] = {buf};
    tio_loader *ld = NULL;
    int rc = tio_loader_create(d, &o, states, &len, 1, &ld);
    if (rc == 0) {
        for (int i = 0; i < 4; i++) {
            const tio_data_sample *s;
            if (tio_loader_next(ld, &s) != 0)
                break;
        }
        tio_loader_destroy(ld);
    } else if (ld != NULL || tio_last_error()[0] == '\0') {
        abort();
    }
    free(buf);
    return 0;
}
