/*
 * data/parquet_shim.h — the C interface of libteraio_parquet, a small C++
 * shim over Apache Arrow's libparquet (the one pyarrow's wheel ships, with
 * its headers).  libteraio loads it with dlopen when a Parquet file is first
 * met (parquet.c), so the C core neither links nor needs Arrow; without the
 * shim, Parquet is reported unavailable with the reason.
 *
 * Every function returns 0 or a negative code (TIO_EPARSE for bad input,
 * -errno, -ENOMEM) and, on failure, writes a one-line message into err
 * (err_cap bytes), naming the file, row group and column where they apply.
 * Nothing here holds any Python lock or calls Python: readers run in the
 * loader's own threads.  A tio_pq handle may be read by several threads at
 * once (each read opens its own reader over the shared footer).
 */
#ifndef TERAIO_PARQUET_SHIM_H
#define TERAIO_PARQUET_SHIM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TIO_PQ_ABI 2

enum { TIO_PQ_TEXT = 1, TIO_PQ_TOKENS = 2 };

typedef struct tio_pq tio_pq;

/* What the footer says. */
typedef struct {
    int64_t n_rows;
    int32_t n_row_groups;
    int32_t kind;          /* TIO_PQ_TEXT (a string column) or TIO_PQ_TOKENS */
    char column[128];      /* the column read */
} tio_pq_meta;

/* One row group's column: row i is data[offsets[i], offsets[i + 1]) (text:
 * bytes; tokens: uint32 ids, offsets counting ids), valid[i] 0 for a null
 * row.  Buffers malloc'ed, freed by tio_pq_column_free. */
typedef struct {
    int64_t n_rows;
    int64_t *offsets;      /* n_rows + 1 */
    void *data;
    uint8_t *valid;        /* n_rows */
} tio_pq_column;

/* Open `path` (or, with buf non-NULL, `len` bytes in memory, which must
 * outlive the handle) and read its footer; the column read is `text_column`
 * if present (it must be a string column), else "tokens" or "input_ids"
 * (a list of integers).  `name` is used in messages. */
typedef int (*tio_pq_open_fn)(const char *path, const void *buf, size_t len, const char *name,
                              const char *text_column, tio_pq **out, tio_pq_meta *meta,
                              char *err, size_t err_cap);
/* Rows of row group `rg` in the footer. */
typedef int64_t (*tio_pq_row_group_rows_fn)(const tio_pq *f, int32_t rg);
/* The bytes the footer declares for the column in row group `rg` (its
 * chunks' total_uncompressed_size); -1 if rg is out of range.  A claim, not
 * a bound: the reads below check what the pages really hold. */
typedef int64_t (*tio_pq_row_group_bytes_fn)(const tio_pq *f, int32_t rg);

/* A reader of row group `rg`'s column from row 0 on, decoding at most
 * `batch_rows` rows at a time (so memory is one batch, never the whole
 * row group).  Owned by the caller (rows_close). */
typedef struct tio_pq_rows tio_pq_rows;
typedef int (*tio_pq_rows_open_fn)(tio_pq *f, int32_t rg, int64_t batch_rows, tio_pq_rows **out,
                                   char *err, size_t err_cap);
/* Skip the next `n` rows (decoded a batch at a time, then dropped). */
typedef int (*tio_pq_rows_skip_fn)(tio_pq_rows *r, int64_t n, char *err, size_t err_cap);
/* Decode the next `n` rows into *out (its row 0 is the reader's position
 * before the call).  A text value longer than max_value_bytes, rows that
 * together hold more than max_bytes (text bytes or ids' bytes), a token
 * below 0 or above 2^32 - 1, fewer rows than asked or, on the row group's
 * last row, more rows than the footer says are TIO_EPARSE naming file,
 * row group, row and column. */
typedef int (*tio_pq_rows_read_fn)(tio_pq_rows *r, int64_t n, uint64_t max_value_bytes,
                                   uint64_t max_bytes, tio_pq_column *out, char *err,
                                   size_t err_cap);
typedef void (*tio_pq_rows_close_fn)(tio_pq_rows *r);
typedef void (*tio_pq_column_free_fn)(tio_pq_column *c);
typedef void (*tio_pq_close_fn)(tio_pq *f);

/* The one symbol libteraio looks up: the shim's functions. */
typedef struct {
    int abi;               /* TIO_PQ_ABI */
    const char *version;   /* the Arrow version the shim was built against */
    tio_pq_open_fn open;
    tio_pq_row_group_rows_fn row_group_rows;
    tio_pq_row_group_bytes_fn row_group_bytes;
    tio_pq_rows_open_fn rows_open;
    tio_pq_rows_skip_fn rows_skip;
    tio_pq_rows_read_fn rows_read;
    tio_pq_rows_close_fn rows_close;
    tio_pq_column_free_fn column_free;
    tio_pq_close_fn close;
} tio_pq_api;

const tio_pq_api *tio_parquet_shim(void);

#ifdef __cplusplus
}
#endif
#endif
