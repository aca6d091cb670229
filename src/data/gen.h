/*
 * data/gen.h — the generator: one rank's deterministic sample
 * stream as a plain value (logical-shard plan, shard positions, mixing
 * counters, spans still to pack, partial sample, shuffle buffer).  The
 * threaded loader runs one generator in its prefetch thread and rebuilds
 * others from snapshots to serialize the delivered position.
 */
#ifndef TERAIO_DATA_GEN_H
#define TERAIO_DATA_GEN_H

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
    uint64_t empty_run;      /* empty documents drawn in a row */
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
/* Exchange two samples whole, or only what they hold (fill and spans),
 * each keeping its token array. */
void tio_gen_sample_swap(tio_gen_sample *a, tio_gen_sample *b);
void tio_gen_sample_swap_spans(tio_gen_sample *a, tio_gen_sample *b);
/* Read the tokens of a sample's spans through reader r. */
int tio_gen_sample_fill(tio_data_reader *r, const tio_dataset *ds, const tio_loader_options *o,
                        tio_gen_sample *s);
/* Mixing: the sub-dataset to draw from next (-1: none has documents). */
int tio_gen_pick_sub(const tio_gen *g);
/* Position of one sub-dataset (a finished epoch reads as the next one). */
void tio_gen_position(const tio_gen_sub *gs, tio_data_position *p);
/* The settings fingerprint a state must carry to load under these options. */
uint64_t tio_gen_fingerprint(const tio_dataset *ds, const tio_loader_options *o);
int tio_gen_pending_push(tio_gen *g, const tio_data_span *sp);

/* Samples produced by the prefetch thread and not yet delivered (tests). */
uint32_t tio_loader_queued(tio_loader *ld);

/* state.c */
int tio_gen_serialize(const tio_gen *g, void **buf, size_t *len);
int tio_gen_load(tio_gen *g, const void *const *states, const size_t *lens, uint32_t n);
int tio_state_check(const void *buf, size_t len, const char *name);
/* The states' settings (fingerprint, logical shards, seq_len, one world
 * size) against the options, from their fixed header as the state parser
 * reads it, before anything is allocated for them: TIO_ESTATE, TIO_EPARSE
 * (a header cut short, or an impossible rank, world size or logical-shard
 * count), or the errors of tio_state_check. */
int tio_state_precheck(const tio_dataset *ds, const tio_loader_options *o,
                       const void *const *states, const size_t *lens, uint32_t n);

#endif
