/*
 * data/loader_internal.h — the generator: one rank's deterministic sample
 * stream as a plain value (logical-shard plan, shard positions, mixing
 * counters, spans still to pack, partial sample, shuffle buffer).  The
 * threaded loader runs one generator in its prefetch thread and rebuilds
 * others from snapshots to serialize the delivered position.
 */
#ifndef TERAIO_LOADER_INTERNAL_H
#define TERAIO_LOADER_INTERNAL_H

#include "data/data_internal.h"

typedef struct {
    uint32_t file;
    uint64_t lo, hi; /* documents [lo, hi) of the file */
} tio_shard_range;

typedef struct {
    uint32_t first_range, n_ranges;
    uint64_t n_docs;
} tio_shard_def;

typedef struct {
    uint32_t epoch;
    uint64_t r;        /* file ranges finished (cursor into the seeded range order) */
    uint64_t j;        /* documents taken from the current range */
    uint64_t consumed; /* documents taken this epoch */
} tio_shard_pos;

typedef struct {
    uint64_t key;            /* hash of the name: keys the shuffles */
    double weight;           /* normalized target share (0: not drawn) */
    uint32_t n_ranges;
    tio_shard_range *ranges;
    tio_shard_def *shards;   /* L */
    uint32_t n_owned;
    uint32_t *owned;         /* shard indices s with s % world == rank */
    tio_shard_pos *pos;      /* per owned shard */
    uint64_t owned_docs;
    uint64_t tokens;         /* mixing counter: packed tokens drawn */
    /* Derived from pos (rebuilt when agg_valid is false, e.g. after a state
     * is loaded): the lowest epoch among owned non-empty shards, documents
     * left and consumed in it, and a Fenwick tree over owned shards of the
     * documents each has left in that epoch, so drawing a shard weighted by
     * documents left is O(log shards), not O(shards). */
    bool agg_valid;
    uint32_t agg_epoch;
    uint64_t agg_remaining, agg_consumed;
    uint64_t *fenwick;       /* n_owned + 1 */
} tio_gen_sub;

typedef struct {
    uint32_t *tokens; /* seq_len + 1 */
    uint32_t fill;
    tio_data_span *spans;
    uint32_t n_spans, cap_spans;
} tio_gen_sample;

typedef struct {
    tio_dataset *ds;
    tio_loader_options opts;
    uint32_t S; /* seq_len + 1 */
    uint64_t fingerprint;
    tio_gen_sub *subs;
    tio_data_reader *reader;
    tio_data_span *pending; /* FIFO of spans to pack before drawing documents */
    uint32_t pend_head, n_pending, cap_pending;
    tio_gen_sample partial;
    tio_gen_sample *buf;    /* shuffle buffer */
    uint32_t n_buf, cap_buf;
    uint64_t produced;      /* samples emitted */
    bool skip_tokens;       /* emit spans only (replaying to a position) */
} tio_gen;

int tio_gen_init(tio_gen *g, tio_dataset *ds, const tio_loader_options *opts);
void tio_gen_free(tio_gen *g);
/* Produce the next sample into *out (its spans swapped in, its token array
 * kept and filled).  out must be zeroed or a sample from an earlier call. */
int tio_gen_next(tio_gen *g, tio_gen_sample *out);
/* Read tokens [off, off + n) of a span's document as packed. */
int tio_gen_read_span(tio_gen *g, const tio_data_span *sp, uint32_t *dst);
int tio_gen_sample_push(tio_gen_sample *s, const tio_data_span *sp);
void tio_gen_sample_free(tio_gen_sample *s);
int tio_gen_pending_push(tio_gen *g, const tio_data_span *sp);

/* Samples produced by the prefetch thread and not yet delivered (tests). */
uint32_t tio_loader_queued(tio_loader *ld);

/* state.c */
int tio_gen_serialize(const tio_gen *g, void **buf, size_t *len);
int tio_gen_load(tio_gen *g, const void *const *states, const size_t *lens, uint32_t n);
int tio_state_check(const void *buf, size_t len, const char *name);

#endif
