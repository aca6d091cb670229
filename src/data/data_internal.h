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

enum { FMT_MEGATRON = 1, FMT_LLMC = 2, FMT_ARROW = 3, FMT_JSONL = 4, FMT_PARQUET = 5, FMT_COUNT };
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

/* A file's bytes as a stream, decompressed by `comp` through a fixed-size
 * buffer (never the whole file): read returns up to `cap` bytes, 0 at the
 * end, or a negative error naming the file (a corrupt or truncated .gz or
 * .zst).  skip discards `n` bytes (a seek for an uncompressed file). */
typedef struct tio_text_stream tio_text_stream;
int tio_text_stream_open(const char *path, int comp, tio_text_stream **out);
int64_t tio_text_stream_read(tio_text_stream *s, char *buf, size_t cap);
int tio_text_stream_skip(tio_text_stream *s, uint64_t n);
uint64_t tio_text_stream_pos(const tio_text_stream *s); /* decompressed bytes consumed */
void tio_text_stream_close(tio_text_stream *s);

/* tok/hf_json.c: tio_tok_parse_hf with `name` (a file's path) in its messages. */
struct tio_tok;
int tio_tok_parse_hf_named(struct tio_tok **out, const void *json, size_t len, const char *name);

/* Keyed bijection of [0, n): 4-round Feistel with cycle walking. n >= 1. */
uint64_t tio_permute(uint64_t i, uint64_t n, uint64_t key);
uint64_t tio_mix64(uint64_t x);
uint32_t tio_crc32(const void *data, size_t len);

/* ---- dataset file table ---- */

/* A window: documents [first, first + count) of a text or Parquet file,
 * decoded together into a reader's cache (JSONL: consecutive lines of about
 * TIO_JSONL_WINDOW_BYTES, starting at decompressed byte `offset`; Parquet:
 * a row group, or rows of one whose column the footer declares larger than
 * TIO_PARQUET_WINDOW_BYTES, cut into slices of about that size). */
typedef struct {
    uint64_t first, count;
    uint64_t offset; /* JSONL: decompressed byte offset of the first line;
                        Parquet: the row group */
    uint64_t line;   /* JSONL: lines (blank ones too) before it; Parquet:
                        its first row in the row group */
} tio_data_window;

enum { TIO_JSONL_WINDOW_BYTES = 8 << 20, TIO_PARQUET_WINDOW_BYTES = 64 << 20 };

typedef struct tio_parquet_file tio_parquet_file; /* parquet.c */

typedef struct {
    char *path;       /* absolute or root-joined path */
    char *rel;        /* relative to the root, "sub/..." */
    int format, comp;
    bool text;        /* tokenized on the fly (JSONL, Parquet text column) */
    uint64_t bytes;   /* for cutting shards */
    uint64_t n_docs;
    uint64_t n_tokens;
    /* opened on first read (under ds->lock) */
    bool opened;
    int open_rc;
    char *open_msg;                        /* the message of a failed open */
    uint64_t n_empty;                      /* documents without tokens (when known) */
    bool has_tokens;                       /* a document with tokens is known */
    uint8_t *map; size_t map_len;          /* .bin / shard / arrow */
    uint8_t *idx_map; size_t idx_len;      /* .idx */
    tio_mmidx idx;
    int width;                             /* llm.c: 2 or 4 */
    uint64_t *doc_starts;                  /* llm.c: n_docs + 1 token offsets */
    tio_arrow_index arrow;
    uint32_t n_windows;                    /* JSONL, Parquet */
    tio_data_window *windows;
    tio_parquet_file *parquet;
    uint64_t *window_empty;                /* per window: empty documents + 1 once counted */
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

typedef struct tio_data_reader tio_data_reader;

/* The decoded documents of one window in a reader's cache. */
typedef struct {
    uint64_t first, count;
    uint32_t **chunk_ids; /* per chunk of TIO_WINDOW_CHUNK documents */
    uint64_t *id_off;     /* per document: first id in its chunk's array */
    uint64_t *id_len;     /* per document: ids */
    int *doc_rc;          /* per document: 0, or the error reading it reports */
    char **doc_msg;       /* per document with an error: its message */
    uint64_t bytes;       /* memory held */
} tio_window_ids;

enum { TIO_WINDOW_CHUNK = 64 };

/* Where window documents come from: document i's text (`*len` bytes at
 * `*text`, valid until the next call for this document's chunk) or ids
 * (*ids, *n).  Returns 0, TIO_EPARSE for a bad document (message set: it
 * is reported when the document is read), or another error that fails the
 * whole window.  Called from several tokenizer threads at once, for
 * different documents. */
typedef struct {
    void *ctx;
    int (*text)(void *ctx, uint64_t i, const char **text, size_t *len, char **owned);
    int (*ids)(void *ctx, uint64_t i, const uint32_t **ids, uint64_t *n);
} tio_window_source;

/* Decode `count` documents from `src` into *w (tokenizing text through the
 * dataset's tokenizer on its tokenizer threads).  window.c. */
int tio_window_fill(tio_dataset *ds, tio_data_file *f, const tio_window_source *src,
                    uint64_t first, uint64_t count, tio_window_ids *w);
void tio_window_ids_free(tio_window_ids *w);

/* Per-format operations.  Token formats are read in place through doc_len,
 * doc_addr and doc_read; windowed formats (JSONL, Parquet) decode whole
 * windows (window_load) into a reader's cache, which serves doc_len and
 * doc_read.  open runs under ds->lock, once per file: it maps or parses the
 * file and sets n_docs, n_tokens (token formats), has_tokens, n_empty and
 * the windows. */
typedef struct {
    const char *name;
    int (*open)(tio_dataset *ds, tio_data_file *f);
    void (*close)(tio_data_file *f);
    uint64_t (*doc_len)(const tio_data_file *f, uint64_t doc);
    const uint8_t *(*doc_addr)(const tio_data_file *f, uint64_t doc, uint64_t off);
    int (*doc_read)(const tio_data_file *f, uint64_t doc, uint64_t off, uint64_t n, uint32_t *dst);
    int (*window_load)(tio_dataset *ds, tio_data_file *f, uint32_t window, tio_window_ids *w,
                       void **cursor);
    void (*cursor_free)(void *cursor);
} tio_data_format;

/* Map a whole file read-only (*map NULL for an empty file). */
int tio_data_map(const char *path, uint8_t **map, size_t *len);

/* The operations of format code FMT_*. */
const tio_data_format *tio_data_format_of(int format);
extern const tio_data_format tio_format_megatron, tio_format_llmc, tio_format_arrow,
    tio_format_jsonl, tio_format_parquet;

/* The window holding document `doc` of a windowed file (binary search). */
uint32_t tio_data_window_of(const tio_data_file *f, uint64_t doc);

/* Parquet through the optional shim (parquet.c): whether it can be used,
 * and if not, why (static string). */
bool tio_parquet_available(const char **why);
/* Open a Parquet file held in memory and decode every row group through the
 * shim, checking what the loader relies on (fuzz target). */
int tio_parquet_check_buffer(const uint8_t *buf, size_t len, const char *text_column);

/* The file holding document `doc` of file `file` of sub-dataset `sub`,
 * opened (-EINVAL naming what is out of range, or the open's error). */
int tio_data_doc_file(tio_dataset *ds, uint32_t sub, uint32_t file, uint64_t doc,
                      tio_data_file **out);

/* Open a file's mapping/index if not yet (thread-safe). */
int tio_data_file_open(tio_dataset *ds, tio_data_file *f);

/* Per-thread reader: a cache of decoded windows. */
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
