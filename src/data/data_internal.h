/*
 * data/data_internal.h — the loader's internal pieces: the file table of a
 * dataset, format parsers (exposed for tests and fuzz targets), the keyed
 * bijection, the generator (one rank's deterministic sample stream) and the
 * state codec.
 */
#ifndef TERAIO_DATA_INTERNAL_H
#define TERAIO_DATA_INTERNAL_H

#include <pthread.h>
#include <string.h>
#include "teraio/data.h"

enum { FMT_MEGATRON = 1, FMT_LLMC = 2, FMT_ARROW = 3, FMT_JSONL = 4 };
enum { COMP_NONE = 0, COMP_GZ = 1, COMP_ZST = 2 };

/* Megatron MMIDIDX dtype codes (megatron/core/datasets/indexed_dataset.py). */
int tio_mmidx_dtype_size(uint8_t code); /* bytes, or 0 if unknown */

/* Parsed .idx: pointers into the mapped index (not copied). */
typedef struct {
    uint8_t dtype;
    uint64_t n_seqs;
    uint64_t n_docs;          /* documents (document_indices count - 1) */
    const uint8_t *lengths;   /* int32[n_seqs] (unaligned-safe reads) */
    const uint8_t *pointers;  /* int64[n_seqs] */
    const uint8_t *doc_index; /* int64[n_docs + 1] */
} tio_mmidx;

/* Parse an .idx of `len` bytes and check it against a .bin of `bin_bytes`
 * (UINT64_MAX: do not check).  `name` is used in messages. */
int tio_mmidx_parse(const uint8_t *buf, size_t len, uint64_t bin_bytes, const char *name,
                    tio_mmidx *out);
/* Element i of a little-endian int64 / int32 array at p (any alignment). */
static inline uint64_t tio_mmidx_u64(const uint8_t *p, uint64_t i)
{
    uint64_t v;
    memcpy(&v, p + 8 * i, 8);
    return v;
}
static inline uint32_t tio_mmidx_u32(const uint8_t *p, uint64_t i)
{
    uint32_t v;
    memcpy(&v, p + 4 * i, 4);
    return v;
}

/* llm.c shard: validate the header; *width 2 or 4, *n_tokens; delimiter
 * default from the magic. */
int tio_llmc_parse_header(const uint8_t *buf, size_t len, const char *name, int *width,
                          uint64_t *n_tokens, uint32_t *default_delim);

/* Arrow IPC: per record batch, where the tokens column's values are. */
typedef struct {
    uint64_t offset; /* byte offset of the first value in the file */
    uint64_t count;  /* values */
} tio_arrow_batch;
typedef struct {
    int width;          /* bytes per value: 1, 2, 4, 8 */
    bool is_signed;
    uint32_t n_batches;
    tio_arrow_batch *batches; /* malloc'ed */
} tio_arrow_index;
int tio_arrow_parse(const uint8_t *buf, size_t len, const char *column, const char *name,
                    tio_arrow_index *out);
void tio_arrow_index_free(tio_arrow_index *ix);

/* JSONL: find top-level string field `field` in one line (no newline) and
 * unescape it into *out (malloc'ed, NUL-terminated), *out_len bytes.
 * Returns 0, or TIO_EPARSE with a message (prefixed by `where`). */
int tio_jsonl_text(const char *line, size_t len, const char *field, const char *where,
                   char **out, size_t *out_len);
/* Decompress (by comp) a whole file into a malloc'ed buffer. */
int tio_decompress_file(const char *path, int comp, char **buf, size_t *len);

/* Keyed bijection of [0, n): 4-round Feistel with cycle walking. n >= 1. */
uint64_t tio_permute(uint64_t i, uint64_t n, uint64_t key);
uint64_t tio_mix64(uint64_t x);
uint32_t tio_crc32(const void *data, size_t len);

/* ---- dataset file table ---- */
typedef struct {
    char *path;       /* absolute or root-joined path */
    char *rel;        /* relative to the root, "sub/..." */
    int format, comp;
    uint64_t bytes;   /* for cutting shards */
    uint64_t n_docs;
    uint64_t n_tokens;
    /* opened on first read (under ds->lock) */
    bool opened;
    int open_rc;
    uint8_t *map; size_t map_len;          /* .bin / shard / arrow */
    uint8_t *idx_map; size_t idx_len;      /* .idx */
    tio_mmidx idx;
    int width;                             /* llm.c: 2 or 4 */
    uint64_t *doc_starts;                  /* llm.c: n_docs + 1 token offsets */
    tio_arrow_index arrow;
} tio_data_file;

typedef struct {
    char *name;
    uint32_t n_files;
    tio_data_file *files;
    uint64_t n_docs, bytes, n_tokens, lines_skipped;
    uint64_t fingerprint;
} tio_data_sub;

struct tio_dataset {
    char *root;
    tio_dataset_options opts;
    char *text_field;
    uint32_t n_subs;
    tio_data_sub *subs;
    pthread_mutex_t lock;
};

/* Open a file's mapping/index if not yet (thread-safe). */
int tio_data_file_open(tio_dataset *ds, tio_data_file *f);

/* Per-thread reader: tokenized JSONL cache and a scratch buffer. */
typedef struct tio_data_reader tio_data_reader;
int tio_data_reader_create(tio_dataset *ds, tio_data_reader **out);
void tio_data_reader_destroy(tio_data_reader *r);
/* Token count of a document. */
int tio_data_doc_len(tio_data_reader *r, uint32_t sub, uint32_t file, uint64_t doc, uint64_t *n);
/* Hint that token `off` of a document will be read soon (token files:
 * prefetches its first cache lines; JSONL and unopened files: nothing). */
void tio_data_doc_prefetch(tio_data_reader *r, uint32_t sub, uint32_t file, uint64_t doc,
                           uint64_t off);
/* Tokens [off, off + n) of a document into dst. */
int tio_data_doc_read(tio_data_reader *r, uint32_t sub, uint32_t file, uint64_t doc, uint64_t off,
                      uint64_t n, uint32_t *dst);

#endif
