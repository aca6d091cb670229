/*
 * teraio/data.h — the streaming, stateful, rescalable data loader.
 *
 * The design follows IBM's fms-fsdp loader (StreamingDocDataset,
 * ScalableShardDataset, SamplingDataset; github.com/foundation-model-stack/
 * fms-fsdp, fms_fsdp/utils/dataset_utils.py), rebuilt in C:
 *
 *   dataset root/
 *     <sub-dataset>/ ... files        one folder per sub-dataset; nested
 *                                      folders allowed; files sorted by path
 *
 * Sources (by file name):
 *   NAME.idx + NAME.bin   Megatron MMIDIDX v1 (every dtype code 1..8); a
 *                         document is the concatenation of its sequences
 *   NAME.bin (no .idx)    llm.c token shard: 256 int32 header, magic
 *                         20240520 (uint16 tokens) or 20240801 (uint32);
 *                         documents are split at the delimiter token, which
 *                         is not part of any document
 *   NAME.arrow            Arrow IPC file or stream: a `tokens` column of
 *                         integers, one record batch per document
 *   NAME.jsonl[.gz|.zst]  one JSON object per line; the string field
 *                         `text` (configurable) is tokenized on the fly
 *   NAME.parquet          Parquet (read through Arrow's libparquet, see
 *                         tio_data_parquet_available): a string column
 *                         `text` (configurable) tokenized on the fly, else a
 *                         list-of-integers column `tokens` or `input_ids`;
 *                         a document is a row, a row group (or a slice of
 *                         rows of one the footer declares over 64 MiB) the
 *                         unit of reading, decoded a batch at a time, so a
 *                         compression bomb costs a window's memory; a window
 *                         decoding to more than max(cache_bytes,
 *                         max_line_bytes) is an error naming the rows.
 *                         Document counts come from the footer.
 *                         The Hugging Face hub's layout (<sub>/data/
 *                         train-*.parquet, README.md beside) is one
 *                         sub-dataset like any other folder
 *   counts.csv            optional, in the root: lines "sub/rel/path,docs,tokens"
 *                         (tokens may be 0 = unknown); listed files are not
 *                         opened until read
 *
 * Logical shards: each sub-dataset's files, concatenated in sorted order, are
 * cut into L logical shards of equal bytes (a document belongs to the shard
 * holding its estimated start byte: file start + doc * file bytes / docs).
 * Shard s of every sub-dataset belongs to rank s % world_size.  A shard's
 * position is four integers (epoch, file-range cursor, document cursor,
 * documents consumed).  Within an epoch a shard visits its file ranges in a
 * seeded order and the documents of each range through a keyed bijection of
 * [0, n) (a 4-round Feistel network with cycle walking), so nothing is
 * precomputed.  A rank draws its next document of a sub-dataset from its
 * shards of the lowest epoch, picking a shard with probability proportional
 * to its documents remaining.  When all of them are exhausted, they enter the
 * next epoch together.
 *
 * Mixing: the next document comes from the sub-dataset furthest below its
 * target share of the tokens this rank has packed (deterministic).
 *
 * Packing: each document is packed as [BOS] tokens EOS (its "packed length"
 * is len + 1, + 1 with BOS); samples hold seq_len + 1 consecutive packed
 * tokens (inputs = [0, seq_len), labels = [1, seq_len]); documents longer than
 * a sample continue in the next one.  Samples then pass a shuffle buffer.
 *
 * A span (tio_data_span) names a piece of one document: its offset and
 * length count packed tokens (offset 0 is the BOS when enabled, else the
 * document's first token; the last packed token is the EOS).  Within an
 * epoch the spans delivered by all ranks tile every document exactly once.
 *
 * State: tio_loader_state() serializes a rank's position after the last
 * sample returned by tio_loader_next (never counting samples still queued):
 * its shards' positions, the spans of its partial sample, of the rest of the
 * document being packed and of its shuffle buffer, and its mixing counters.
 * Rescaling from N to M ranks: pass all N states to tio_loader_create; shard
 * states are dealt to their new owners (s % M), old rank i's spans go to new
 * rank i % M, mixing counters are summed and split evenly.  The format is in
 * docs/loader.md.
 *
 * Threads: a loader with prefetch runs one thread that draws, packs and
 * shuffles into a queue, optionally fill threads that read the tokens of the
 * queued samples, and, when a window of a text file (JSONL, Parquet text)
 * is decoded, tokenizer threads for it; when the queue is empty the caller of tio_loader_next makes the
 * next sample itself.  The stream is the same whatever the thread counts.
 *
 * Thread-safety: a tio_dataset is immutable after tio_dataset_open (files
 * are mapped on first use, under its lock) and may be shared by loaders in
 * any threads.  A tio_loader is used by one thread at a time (the Python
 * StreamingDataset puts a lock around it).
 *
 * Memory: token files are mapped, not read; text files are decoded by
 * windows (about TIO_JSONL_WINDOW_BYTES of a JSONL file, one Parquet row
 * group) into a per-reader cache of cache_bytes, so a compressed file that
 * expands a thousand times costs a window, not its decompressed size.
 */
#ifndef TERAIO_DATA_H
#define TERAIO_DATA_H

#include "teraio/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- tokenizer interface --------------------------------------------------
 * JSONL text is turned into ids through this table.  `encode` writes the ids
 * of `text` (`len` bytes of UTF-8, not NUL-terminated) into `ids` (room for
 * `cap`) and returns their count; when `cap` is too small it returns instead
 * a number greater than `cap` that is enough (the caller grows its buffer
 * to it and calls again), or a negative error code.  It is called from
 * loader and tokenizer threads, several at once: it must be thread-safe.
 * `name` identifies the vocabulary and enters the loader's state
 * fingerprint, so a state saved under one tokenizer does not load under
 * another.  `vocab_size` is one past the highest id (0: unknown). */
typedef struct tio_data_tokenizer {
    const char *name;
    void *ctx;
    int64_t (*encode)(void *ctx, const char *text, size_t len, uint32_t *ids, size_t cap);
    uint32_t vocab_size;
} tio_data_tokenizer;

/* The byte-level tokenizer: each byte b becomes id b (0..255); name "bytes".
 * Static; never NULL. */
TIO_API const tio_data_tokenizer *tio_data_tokenizer_bytes(void);

/* Open a tokenizer by `spec`:
 *   "bytes"                    the byte-level tokenizer above;
 *   "r50k_base", "p50k_base", "cl100k_base", "o200k_base"
 *                              a built-in BPE encoding of teraio/tok.h (its
 *                              rank file found as tio_tok_encoding_path(spec,
 *                              dir) says); name = spec;
 *   a path ending in ".json"   a Hugging Face tokenizer.json (tio_tok_load_hf);
 *                              name = "hf:" + 16 hex digits of a hash of the
 *                              file's bytes, so an edited file is another
 *                              vocabulary.
 * Special-token strings in the text are encoded as ordinary text
 * (TIO_TOK_SPECIAL_TEXT: tiktoken's encode_ordinary).  `dir` may be NULL.
 * *out is closed with tio_data_tokenizer_close.  Errors: -ENOENT (unknown
 * spec or missing file, named), those of tio_tok_load_encoding /
 * tio_tok_load_hf (TIO_EPARSE, -ENOTSUP when built without PCRE2), -ENOMEM. */
TIO_API int tio_data_tokenizer_open(const char *spec, const char *dir, tio_data_tokenizer **out);
/* Free a tokenizer from tio_data_tokenizer_open (the bytes tokenizer and
 * NULL are no-ops).  No dataset may still use it. */
TIO_API void tio_data_tokenizer_close(tio_data_tokenizer *tok);

/* ---- dataset ------------------------------------------------------------- */
enum { TIO_DATA_JSONL_ERROR = 0, TIO_DATA_JSONL_SKIP = 1 };

typedef struct tio_dataset_options {
    const tio_data_tokenizer *tokenizer; /* JSONL tokenizer; NULL: bytes */
    const char *text_field;              /* JSONL field; NULL: "text" */
    int jsonl_errors;    /* TIO_DATA_JSONL_ERROR: a malformed line fails the read
                            naming file and line; TIO_DATA_JSONL_SKIP: it is read
                            as an empty document and counted (tio_dataset_info) */
    int64_t llmc_delimiter; /* llm.c document delimiter; -1: 50256 for magic
                               20240520, 128000 for 20240801 */
    uint32_t tokenizer_threads; /* threads that tokenize a window of a text
                                   file when a reader loads it (documents are
                                   handed out in chunks); 0: min(4, online
                                   CPUs); 1: none besides the reading thread */
    uint64_t max_line_bytes;    /* longest JSONL line (decompressed) or Parquet
                                   text value accepted; a longer one is an
                                   error naming file and line; 0: 64 MiB */
    uint64_t cache_bytes;       /* per reader: decoded windows kept (ids and
                                   their tables); at least one window is kept
                                   whatever its size; 0: 256 MiB */
} tio_dataset_options;

/* Defaults described above. */
TIO_API void tio_dataset_options_default(tio_dataset_options *opts);

typedef struct tio_dataset tio_dataset;

/* Scan `root`: one sub-dataset per folder directly under it (a folder with
 * no data file is skipped), data files found recursively and sorted by
 * relative path, counts.csv applied.  Token files (.idx, llm.c, Arrow) not in
 * the counts file are opened and validated now; JSONL files are read once to
 * count their lines.  `opts` may be NULL (defaults).  `*out` is owned by the
 * caller (tio_dataset_destroy).
 * Errors: -ENOENT/-ENOTDIR (root), -ENODATA (no sub-dataset; a sub-dataset
 * known to hold no token at all, named), TIO_EPARSE (malformed file: message
 * names file, offset and what was expected, e.g. "a/x.idx: bad magic",
 * "a/x.idx: sequence 3 ends at byte 812 past the end of a/x.bin (800
 * bytes)", "a/x.jsonl.zst: line 1 is longer than the limit of 67108864
 * bytes (max_line_bytes)", "a/x.parquet: column 'text' is int64, not a
 * string"), TIO_EVERSION (.idx version not 1), -ENOTSUP (a Parquet file
 * while Parquet is unavailable: the reason is in the message), -ENOMEM,
 * -EIO. */
TIO_API int tio_dataset_open(const char *root, const tio_dataset_options *opts,
                             tio_dataset **out);
TIO_API void tio_dataset_destroy(tio_dataset *ds);

typedef struct tio_data_subdataset_info {
    const char *name;      /* folder name; valid while the dataset lives */
    uint32_t n_files;
    uint64_t n_docs;
    uint64_t bytes;        /* bytes used for cutting logical shards */
    uint64_t n_tokens;     /* tokens of token files (0 for JSONL: unknown) */
    uint64_t lines_skipped;/* bad text documents (malformed JSONL lines, null
                              Parquet rows) read as empty with
                              TIO_DATA_JSONL_SKIP, as they are met */
    uint64_t n_empty_docs; /* documents without tokens, which the loader skips:
                              token files counted when opened, text files as
                              their windows are tokenized */
} tio_data_subdataset_info;

TIO_API uint32_t tio_dataset_n_subdatasets(const tio_dataset *ds);
/* Fill *info for sub-dataset `i` (< n_subdatasets, else -EINVAL). */
TIO_API int tio_dataset_info(const tio_dataset *ds, uint32_t i, tio_data_subdataset_info *info);
/* Path of file `file` of sub-dataset `sub`, relative to the root; NULL if
 * out of range.  Valid while the dataset lives. */
TIO_API const char *tio_dataset_file_path(const tio_dataset *ds, uint32_t sub, uint32_t file);
/* Name of the format of file `file` of sub-dataset `sub` ("Megatron",
 * "llm.c", "Arrow", "JSONL", "Parquet"; "Parquet text" or "Parquet tokens"
 * once opened); NULL if out of range.  Static. */
TIO_API const char *tio_dataset_file_format(const tio_dataset *ds, uint32_t sub, uint32_t file);
/* Where document `doc` of a file is in it: for Parquet, its row group and
 * the row within it (*unit = row group, *row = row); for JSONL the window
 * and the document within it; for token files *unit = doc, *row = 0.
 * Errors: -EINVAL (out of range), those of opening the file. */
TIO_API int tio_dataset_doc_location(tio_dataset *ds, uint32_t sub, uint32_t file, uint64_t doc,
                                     uint64_t *unit, uint64_t *row);

/* Whether Parquet files can be read (the shim libteraio_parquet.so, built
 * against pyarrow's libparquet, loads); if not, *reason says why (static). */
TIO_API bool tio_data_parquet_available(const char **reason);

/* Number of documents of one file, or a negative error. */
TIO_API int64_t tio_dataset_file_docs(const tio_dataset *ds, uint32_t sub, uint32_t file);

/* Call fn(arg, doc, ids, n) for each document of one file in order (ids
 * valid during the call only; n may be 0), through one reader, so a JSONL
 * file is decompressed and tokenized once.  Stops at the first non-zero
 * value of fn and returns it.  Errors: those of tio_dataset_read_doc.
 * Thread-safe (one file per thread at a time is the intended use). */
typedef int (*tio_data_doc_fn)(void *arg, uint64_t doc, const uint32_t *ids, uint64_t n);
TIO_API int tio_dataset_scan_file(tio_dataset *ds, uint32_t sub, uint32_t file, tio_data_doc_fn fn,
                                  void *arg);

/* Read document `doc` of file `file` of sub-dataset `sub` as token ids into
 * *ids (malloc'ed, caller frees; *ids may be NULL when *n is 0).
 * Errors: -EINVAL (index out of range), TIO_EPARSE (malformed content, e.g. a
 * Megatron float token that is not a non-negative integer, a bad JSONL line
 * with TIO_DATA_JSONL_ERROR), -ENOMEM, -EIO.  Thread-safe. */
TIO_API int tio_dataset_read_doc(tio_dataset *ds, uint32_t sub, uint32_t file, uint64_t doc,
                                 uint32_t **ids, uint64_t *n);

/* ---- writing token files --------------------------------------------------
 * Megatron MMIDIDX v1, as megatron-core's IndexedDatasetBuilder writes it
 * with one sequence per document, so Megatron reads the output too. */
typedef struct tio_mmidx_writer tio_mmidx_writer;

/* Start PREFIX.bin and PREFIX.idx with dtype code 8 (uint16 ids) or 4
 * (int32).  Both are written to temporary files beside them, renamed into
 * place by tio_mmidx_writer_finish.  Errors: -EINVAL (dtype), the file
 * system's -errno naming the file, -ENOMEM.  A writer is used by one thread. */
TIO_API int tio_mmidx_writer_create(const char *prefix, uint8_t dtype, tio_mmidx_writer **out);
/* Append one document of `n` ids.  Errors: -ERANGE (an id that does not fit
 * the dtype, named), -EOVERFLOW (more than 2^31 - 1 ids), -EIO, -ENOMEM. */
TIO_API int tio_mmidx_writer_add(tio_mmidx_writer *w, const uint32_t *ids, uint64_t n);
/* Documents and ids written so far. */
TIO_API void tio_mmidx_writer_counts(const tio_mmidx_writer *w, uint64_t *docs, uint64_t *tokens);
/* Write the .idx and put both files in place (fsync, rename).  Errors: the
 * file system's, naming the file; TIO_ESTATE if already finished. */
TIO_API int tio_mmidx_writer_finish(tio_mmidx_writer *w);
/* Free the writer; an unfinished one's temporary files are removed. */
TIO_API void tio_mmidx_writer_destroy(tio_mmidx_writer *w);

/* Progress of an ingest: files finished of all, documents and ids written.
 * Called after each file and at most every 0.25 s within one, from the
 * ingest's threads one at a time. */
typedef void (*tio_data_progress_fn)(void *ctx, uint32_t files_done, uint32_t n_files,
                                     uint64_t docs, uint64_t tokens);

typedef struct tio_data_ingest_options {
    const tio_data_tokenizer *tokenizer; /* NULL: bytes */
    const char *text_field;              /* NULL: "text" */
    int jsonl_errors;                    /* as tio_dataset_options */
    uint32_t threads;                    /* files at once; 0: online CPUs (at most 256) */
    tio_data_progress_fn progress;       /* NULL: none */
    void *progress_ctx;
} tio_data_ingest_options;

typedef struct tio_data_ingest_result {
    uint32_t n_files;
    uint64_t n_docs, n_tokens;
    uint8_t dtype;                       /* 8 (uint16) when the vocabulary fits, else 4 */
} tio_data_ingest_result;

TIO_API void tio_data_ingest_options_default(tio_data_ingest_options *opts);

/* Tokenize every text file (JSONL, Parquet with a text column) under the
 * dataset root `src` into OUT/<same relative path>.bin/.idx (the text
 * extension cut), then write OUT/counts.csv ("sub/rel.bin,documents,tokens"
 * per pair), every file atomically.  OUT is created if missing.
 * Errors: those of tio_dataset_open on `src`, -EINVAL (a file that is not
 * text, named), -ENOTDIR (OUT is not a folder), the writer's, the
 * tokenizer's, each naming the file. */
TIO_API int tio_data_ingest(const char *src, const char *out, const tio_data_ingest_options *opts,
                            tio_data_ingest_result *result);

/* ---- loader -------------------------------------------------------------- */
typedef struct tio_loader_options {
    uint32_t seq_len;        /* inputs per sample; a sample holds seq_len + 1 tokens */
    uint32_t rank;           /* data-parallel rank, < world_size */
    uint32_t world_size;     /* data-parallel ranks (GPU x loader worker) */
    uint64_t seed;
    uint32_t logical_shards; /* L, default 2048; >= world_size */
    uint32_t shuffle_buffer; /* samples held for the post-packing shuffle (0: off);
                                default 64 */
    uint32_t eos_id;         /* appended to every document; default 0 */
    bool bos;                /* prepend bos_id to every document; default false */
    uint32_t bos_id;
    uint32_t n_weights;      /* mixing weights by sub-dataset name; absent names */
    const char *const *weight_names; /* weigh 1.0 each, weight 0 excludes one;  */
    const double *weights;           /* n_weights 0: all 1.0                     */
    uint32_t prefetch;       /* samples produced ahead by the loader's thread
                                (0: no thread, samples made inside next); default 8 */
    uint32_t fill_threads;   /* with prefetch: extra threads that read the tokens
                                of the samples the loader's thread planned; the
                                loader's thread and the caller of tio_loader_next
                                (while it would wait) read them too; default 2 on
                                machines of 8 or more online CPUs, else 0.  Not
                                used for a dataset with JSONL files, whose tokens
                                only the loader's thread holds, tokenized. */
} tio_loader_options;

/* Limits of the options (tio_loader_create refuses more with -EINVAL). */
#define TIO_LOADER_MAX_PREFETCH 65536u
#define TIO_LOADER_MAX_SHUFFLE_BUFFER 1048576u
#define TIO_LOADER_MAX_LOGICAL_SHARDS 16777216u
#define TIO_LOADER_MAX_FILL_THREADS 64u
#define TIO_LOADER_MAX_WEIGHT 1e300

TIO_API void tio_loader_options_default(tio_loader_options *opts);

typedef struct tio_data_span {
    uint32_t subdataset;  /* index in the dataset */
    uint32_t file;        /* file index in the sub-dataset */
    uint64_t doc;         /* document index in the file */
    uint32_t offset;      /* first packed token of the document in this span */
    uint32_t length;      /* packed tokens */
    uint32_t epoch;       /* epoch of the logical shard the document came from */
} tio_data_span;

/* One sample; arrays owned by the loader, valid until the next
 * tio_loader_next or tio_loader_destroy. */
typedef struct tio_data_sample {
    uint64_t index;          /* samples delivered by this rank before this one */
    uint32_t seq_len;
    const uint32_t *tokens;  /* seq_len + 1 ids: input_ids = [0, seq_len), labels = [1, seq_len] */
    const uint32_t *position_ids; /* seq_len: restart at 0 at each document piece */
    uint32_t n_segments;     /* document pieces among the inputs */
    const uint32_t *cu_seqlens;   /* n_segments + 1 offsets: 0, ..., seq_len */
    uint32_t n_spans;        /* provenance: pieces of all seq_len + 1 tokens, in order */
    const tio_data_span *spans;
} tio_data_sample;

typedef struct tio_loader tio_loader;

/* Create rank opts->rank's loader over `ds` (which must outlive it).
 * n_states == 0: start fresh.  Otherwise states[i] (lens[i] bytes, as made by
 * tio_loader_state) are either this rank's own state (n_states 1, same world
 * size), or the states of every rank of a previous run of any world size N
 * (n_states == N, in any order): the position is re-dealt as described above.
 * Sub-datasets are matched by name: one no longer present is dropped (logged),
 * a new one starts at epoch 0; when the weights or the set of sub-datasets
 * changed, the mixing counters are re-based so that the new weights hold from
 * here on.  The resumed position is logged (TIO_LOG_INFO).
 * Errors: -EINVAL (bad options: seq_len 0, world_size 0, rank >= world_size,
 * logical_shards < world_size, an option above its TIO_LOADER_MAX_*, a
 * weight that is not a number in [0, TIO_LOADER_MAX_WEIGHT], an unknown
 * weight name, all weights 0; ds or opts NULL), -ENODATA (this rank owns no
 * document), TIO_ECORRUPT (state
 * checksum), TIO_EPARSE (malformed state: also a shard index given twice
 * or not this rank's), TIO_EVERSION (state version), TIO_ESTATE
 * (fingerprint mismatch: a state of another dataset or settings, checked
 * from the state's header before anything is allocated for it; states of
 * different runs; a rank missing or repeated), -ENOMEM, -EAGAIN (thread
 * creation).  On failure *out is NULL and nothing is left allocated. */
TIO_API int tio_loader_create(tio_dataset *ds, const tio_loader_options *opts,
                              const void *const *states, const size_t *lens, uint32_t n_states,
                              tio_loader **out);
/* Stops the prefetch thread and frees everything.  NULL is a no-op. */
TIO_API void tio_loader_destroy(tio_loader *ld);

/* Deliver the next sample into *out (see tio_data_sample for lifetimes).
 * Never ends: shards loop over epochs.  Empty documents are skipped.
 * Errors: those of reading a document (TIO_EPARSE naming file and document,
 * -EIO, -ENOMEM), -ENODATA when every document this rank owns of a
 * sub-dataset turns out empty (after two epochs' worth of empty draws);
 * after an error the loader keeps returning it. */
TIO_API int tio_loader_next(tio_loader *ld, const tio_data_sample **out);

/* Serialize this rank's state after the last delivered sample into *buf
 * (malloc'ed; the caller frees it with free() or tio_free()) of *len bytes.
 * Errors: -ENOMEM, a read error replaying queued samples. */
TIO_API int tio_loader_state(tio_loader *ld, void **buf, size_t *len);

/* Write the state atomically (temporary file, fsync, rename) to `path`;
 * after a crash `path` holds either the old or the new state.  The
 * temporary files that killed saves left beside it (whose flock nobody
 * holds) are removed first and logged (common/atomic_file.c).
 * Errors: those of tio_loader_state, -errno of the file system (naming the path). */
TIO_API int tio_loader_save(tio_loader *ld, const char *path);

/* Read a state file into *buf (malloc'ed; free() or tio_free()) and check its
 * header and checksum.
 * Errors: -ENOENT etc. naming the file, TIO_ECORRUPT, TIO_EPARSE, TIO_EVERSION. */
TIO_API int tio_loader_state_read(const char *path, void **buf, size_t *len);

/* What a state holds, from its bytes alone (header and checksum checked,
 * the whole state parsed): the settings it was saved with and the position
 * it names.  Errors: TIO_ECORRUPT, TIO_EPARSE, TIO_EVERSION (as
 * tio_loader_state_read), each naming what was wrong. */
typedef struct tio_data_state_info {
    uint32_t version;
    uint64_t fingerprint;    /* of the dataset-independent settings (seed, seq_len, ...) */
    uint32_t rank, world_size, logical_shards, seq_len, shuffle_buffer;
    uint64_t samples;        /* samples this rank had delivered */
    uint32_t n_subdatasets;
} tio_data_state_info;

TIO_API int tio_loader_state_info(const void *buf, size_t len, tio_data_state_info *info);

typedef struct tio_data_position {
    uint32_t epoch;          /* lowest epoch of this rank's shards of the sub-dataset */
    uint64_t docs_consumed;  /* documents drawn from them in that epoch */
    uint64_t docs_total;     /* documents in them */
    uint64_t tokens_packed;  /* mixing counter: packed tokens taken by this rank */
} tio_data_position;

/* Position of sub-dataset `sub` after the last delivered sample (-EINVAL if
 * out of range).  A sub-dataset with weight 0 reports its shards untouched. */
TIO_API int tio_loader_position(tio_loader *ld, uint32_t sub, tio_data_position *pos);

#ifdef __cplusplus
}
#endif
#endif
