/*
 * fuzz/fuzz_data_jsonl_stream.c — libFuzzer target for reading a JSONL file
 * as the loader does: the streaming decompressor (.gz, .zst or plain, chosen
 * by the input's first byte), the line reader with its length limit, the
 * counting pass and the windows, and tokenizing every document.
 *
 * The rest of the input is written as the file's bytes (so corrupt and
 * truncated compressed streams are fuzzed too).  Opening must fail with a
 * message or give documents that all read back, or fail with one.  Seeds:
 * fuzz/corpus/fuzz_data_jsonl_stream/.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#include "common/util.h"
#include "data/data_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char root[256];

static void remove_root(void)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    (void)!system(cmd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    static const char *const ext[3] = {".jsonl", ".jsonl.gz", ".jsonl.zst"};
    char path[400];
    if (!root[0]) {
        snprintf(root, sizeof root, "/tmp/fuzz_data_jsonl_stream.%d", (int)getpid());
        mkdir(root, 0755);
        snprintf(path, sizeof path, "%s/s", root);
        mkdir(path, 0755);
        atexit(remove_root);
    }
    for (int k = 0; k < 3; k++) {
        snprintf(path, sizeof path, "%s/s/x%s", root, ext[k]);
        unlink(path);
    }
    snprintf(path, sizeof path, "%s/s/x%s", root, ext[data[0] % 3]);
    FILE *f = fopen(path, "wb");
    if (!f)
        abort();
    if (size > 1 && fwrite(data + 1, 1, size - 1, f) != size - 1)
        abort();
    fclose(f);
    tio_dataset_options o;
    tio_dataset_options_default(&o);
    o.max_line_bytes = 4096;
    o.tokenizer_threads = 1;
    o.jsonl_errors = data[0] & 4 ? TIO_DATA_JSONL_SKIP : TIO_DATA_JSONL_ERROR;
    tio_dataset *ds;
    tio_clear_error();
    if (tio_dataset_open(root, &o, &ds) != 0) {
        if (!tio_last_error()[0])
            abort();
        return 0;
    }
    int64_t docs = tio_dataset_file_docs(ds, 0, 0);
    for (int64_t d = 0; d < docs; d++) {
        uint32_t *ids;
        uint64_t n;
        tio_clear_error();
        int rc = tio_dataset_read_doc(ds, 0, 0, (uint64_t)d, &ids, &n);
        if (rc && !tio_last_error()[0])
            abort();
        if (!rc && n > 4096)
            abort(); /* the byte tokenizer gives one id per byte of a line */
        if (!rc)
            free(ids);
    }
    tio_dataset_destroy(ds);
    return 0;
}
