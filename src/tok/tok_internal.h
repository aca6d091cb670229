/*
 * tok/tok_internal.h — the tokenizer's data structures, shared by the
 * loaders (tiktoken.c, hf_json.c), the builder (vocab.c), the split regex
 * (split.c) and the encoder (encode.c).
 *
 * A tio_tok is built once and then only read:
 *   - every token's bytes live in one arena, found by id through tok_off /
 *     tok_len (UINT32_MAX offset: no token with that id);
 *   - `pieces`: open-addressing hash table bytes -> id for whole-piece
 *     lookup (only tokens that BPE would produce from their own bytes);
 *   - `pairs`: open-addressing hash table (left id, right id) -> (merge rank,
 *     merged id), so the merge loop never hashes bytes; `byte_pairs` the
 *     same for the 65,536 pairs of single-byte tokens, by index, since
 *     every merge starts from bytes;
 *   - special tokens sorted by first byte, then longest first;
 *   - up to TOK_MAX_STAGES compiled split regexes, applied in turn.
 * Per-thread scratch (tok_ctx) hangs off a pthread key of the tio_tok.
 */
#ifndef TERAIO_TOK_INTERNAL_H
#define TERAIO_TOK_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "teraio/tok.h"
#include "teraio_config.h"

#if TIO_HAVE_PCRE2
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#endif

#define TOK_NONE UINT32_MAX
#define TOK_MAX_STAGES 4

/* One slot of the whole-piece table: the token's first bytes inline
 * (tok_head), so most lookups touch one cache line and no arena. */
typedef struct {
    uint64_t head; /* tok_head() of the token's bytes */
    uint32_t id;   /* TOK_NONE: empty slot */
    uint16_t len;  /* bytes (tokens are <= 65535) */
    uint16_t tag;  /* bits 32..47 of the hash */
} tok_piece_slot;

typedef struct {
    uint64_t key; /* (left << 32) | right; UINT64_MAX: empty slot */
    uint32_t rank;
    uint32_t id;
} tok_pair_slot;

typedef struct {
    uint32_t rank, id; /* UINT32_MAX, TOK_NONE: the pair does not merge */
} tok_merge;

typedef struct {
    uint32_t off, len, id; /* text in the arena */
} tok_special;

/* The split patterns that split_builtin.h implements without a regex
 * engine: GPT-2's (r50k_base, p50k_base, HF ByteLevel), cl100k_base's
 * (also Llama 3's tokenizer.json) and o200k_base's, as tiktoken <= 0.7
 * spelled them. */
#define TOK_PATTERN_GPT2 \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define TOK_PATTERN_CL100K                                                                     \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+" \
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define TOK_PATTERN_O200K                                                                          \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"           \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"                                                                \
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*"          \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"                                                                \
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

enum { TOK_SPLIT_REGEX, TOK_SPLIT_GPT2, TOK_SPLIT_CL100K, TOK_SPLIT_O200K };

typedef struct {
#if TIO_HAVE_PCRE2
    pcre2_code *code; /* also for built-in patterns: the tests' reference */
    bool jit;
#endif
    int builtin;    /* TOK_SPLIT_*: split_builtin.h implements the pattern */
    bool keep_gaps; /* text between matches is a piece too (HF "Isolated") */
} tok_stage;

typedef struct tok_ctx tok_ctx;

struct tio_tok {
    uint32_t n_ids;
    uint8_t *arena;
    size_t arena_len, arena_cap;
    uint32_t *tok_off, *tok_len; /* [n_ids] */

    tok_piece_slot *pieces;
    uint32_t piece_mask;
    uint32_t max_piece_len;

    tok_pair_slot *pairs;
    uint32_t pair_mask;
    tok_merge *byte_pairs; /* [256 * 256]: (byte a, byte b) at a * 256 + b */

    uint32_t byte_id[256];

    tok_special *specials;
    uint32_t n_specials;
    uint16_t special_first[256], special_count[256]; /* index range per first byte */
    int n_special_first;                             /* distinct first bytes */
    uint8_t special_byte;                            /* the one, when there is one */
    bool one_byte_special;                           /* a special token of one byte */

    int n_stages;
    tok_stage stages[TOK_MAX_STAGES];
    bool add_prefix_space; /* HF ByteLevel: prepend ' ' to each stretch of text */
    bool always_special;   /* HF: added tokens are always recognised */

    pthread_key_t key;
    bool key_created;
    pthread_mutex_t ctx_lock;
    tok_ctx *ctxs;
};

/* Prefix the last error message with "<where><at>: "; returns rc. */
int tok_fail_at(int rc, const char *where, const char *at);

/* ---- vocab.c: building ------------------------------------------------- */

/* A fresh, empty tio_tok (arena, specials and tables unset). */
int tok_new(tio_tok **out);
/* Size the id tables for ids [0, n_ids); all start as "no token". */
int tok_set_ids(tio_tok *tok, uint32_t n_ids);
/* Append bytes to the arena; *off receives where they went. */
int tok_arena_add(tio_tok *tok, const void *bytes, size_t len, uint32_t *off);
/* Build `pieces` over every token that is not special (ids in is_special
 * are skipped when it is not NULL).  Duplicate token bytes: TIO_EPARSE. */
int tok_build_pieces(tio_tok *tok, const uint8_t *is_special);
/* Look a byte string up in `pieces`; TOK_NONE when absent. */
uint32_t tok_piece_find(const tio_tok *tok, const uint8_t *p, size_t n);
/* Size `pairs` for n entries; then insert (overwriting an equal key). */
int tok_pairs_init(tio_tok *tok, size_t n);
void tok_pair_put(tio_tok *tok, uint32_t left, uint32_t right, uint32_t rank, uint32_t id);
/* tiktoken: pairs from every split of every token into two tokens. */
int tok_pairs_from_ranks(tio_tok *tok);
/* Fill byte_id; TIO_EPARSE naming the first byte without a token. */
int tok_find_byte_ids(tio_tok *tok, const char *where);
/* Fill byte_pairs from `pairs` and byte_id (both complete by then). */
int tok_index_byte_pairs(tio_tok *tok);
/* Register the special tokens (texts already in the arena) and index them
 * by first byte.  Empty or repeated texts: TIO_EPARSE. */
int tok_set_specials(tio_tok *tok, const tok_special *list, uint32_t n);
/* HF without ignore_merges: keep in `pieces` only tokens whose own bytes
 * BPE-merge to themselves. */
int tok_prune_unreachable(tio_tok *tok);

/* ---- split.c: the split regex ------------------------------------------ */

/* Compile `pattern` as stage tok->n_stages (PCRE2, UTF, \s rewritten;
 * a TOK_PATTERN_* also gets its built-in splitter, and needs no PCRE2). */
int tok_add_stage(tio_tok *tok, const char *pattern, size_t len, bool keep_gaps);
void tok_free_stages(tio_tok *tok);

/* ---- encode.c ---------------------------------------------------------- */

/* BPE-merge bytes p[0..n) into ids (at most n written); returns the count.
 * Used by tok_prune_unreachable with the caller's scratch. */
size_t tok_merge_bytes(const tio_tok *tok, const uint8_t *p, size_t n, uint32_t *ids);
/* The pieces the split yields for text[0..len) (special tokens are text),
 * as their end offsets in ends[cap], *n their count; with `regex`, the
 * PCRE2 path even for built-in patterns.  For the tests and fuzz_tok_split:
 * returns 0, -ENOSPC (more than cap pieces) or the errors of encode;
 * -ENOTSUP for `regex` without PCRE2 or a tokenizer with add_prefix_space. */
int tok_split_pieces(const tio_tok *tok, bool regex, const void *text, size_t len, size_t *ends,
                     size_t cap, size_t *n);
/* Create the pthread key of the per-thread state; free all of it. */
int tok_init_ctxs(tio_tok *tok);
void tok_free_ctxs(tio_tok *tok);

/* The first min(n, 8) bytes of p[0..n) (n >= 1), zero-padded, as a
 * little-endian word (equal words and lengths: equal bytes, for n <= 8).
 * Reads only p[0..n). */
static inline uint64_t tok_head(const uint8_t *p, size_t n)
{
    uint64_t v;
    if (n >= 8) {
        memcpy(&v, p, 8);
        return v;
    }
    if (n >= 4) { /* bytes 0-3, then bytes 4..n-1 from the last four */
        uint32_t a, b;
        memcpy(&a, p, 4);
        memcpy(&b, p + n - 4, 4);
        return a | ((uint64_t)b >> (8 * (8 - n))) << 32;
    }
    return p[0] | (uint64_t)p[n / 2] << (8 * (n / 2)) | (uint64_t)p[n - 1] << (8 * (n - 1));
}

/* A byte string of 1 to TOK_KEY_BYTES bytes as three words, its bytes
 * zero-padded: for a given length, equal keys mean equal bytes.  Pieces are
 * compared and hashed by key, without a byte loop. */
#define TOK_KEY_BYTES 24
typedef struct {
    uint64_t w[3];
} tok_key;

/* The key of p[0..n), reading only those bytes. */
static inline tok_key tok_key_of(const uint8_t *p, size_t n)
{
    tok_key k = {{tok_head(p, n), 0, 0}};
    if (n > 8)
        k.w[1] = tok_head(p + 8, n - 8);
    if (n > 16)
        k.w[2] = tok_head(p + 16, n - 16);
    return k;
}

static inline bool tok_key_equal(const tok_key *a, const tok_key *b)
{
    return ((a->w[0] ^ b->w[0]) | (a->w[1] ^ b->w[1]) | (a->w[2] ^ b->w[2])) == 0;
}

static inline uint64_t tok_key_hash(const tok_key *k, size_t n)
{
    uint64_t h = (k->w[0] ^ (n << 56)) * 0x9e3779b97f4a7c15ull;
    if (n > 8) /* most pieces have at most 8 bytes: one multiply */
        h = h ^ k->w[1] * 0xc4ceb9fe1a85ec53ull ^ k->w[2] * 0xff51afd7ed558ccdull;
    return h ^ (h >> 32);
}

/* Hash of a byte string (n >= 1): picks its slot in the whole-piece table
 * and, for pieces of up to TOK_KEY_BYTES, in the per-thread cache. */
static inline uint64_t tok_hash(const uint8_t *p, size_t n)
{
    if (n <= TOK_KEY_BYTES) {
        tok_key k = tok_key_of(p, n);
        return tok_key_hash(&k, n);
    }
    uint64_t h = 0x9e3779b97f4a7c15ull ^ (n * 0xff51afd7ed558ccdull);
    for (; n >= 8; p += 8, n -= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        h = (h ^ v) * 0xc4ceb9fe1a85ec53ull;
        h ^= h >> 31;
    }
    h = (h ^ (n ? tok_head(p, n) : 0)) * 0xff51afd7ed558ccdull;
    h ^= h >> 29;
    h *= 0x9e3779b97f4a7c15ull;
    return h ^ (h >> 32);
}

/* Id of the token whose bytes are p[0..n) (n >= 1), or TOK_NONE; h is
 * tok_hash(p, n), head tok_head(p, n). */
static inline uint32_t tok_piece_lookup(const tio_tok *tok, const uint8_t *p, size_t n, uint64_t h,
                                        uint64_t head)
{
    if (n > tok->max_piece_len)
        return TOK_NONE;
    uint16_t tag = (uint16_t)(h >> 32);
    for (uint32_t i = (uint32_t)h & tok->piece_mask;; i = (i + 1) & tok->piece_mask) {
        const tok_piece_slot *s = &tok->pieces[i];
        if (s->id == TOK_NONE)
            return TOK_NONE;
        if (s->head == head && s->len == n && s->tag == tag &&
            (n <= 8 || !memcmp(tok->arena + tok->tok_off[s->id] + 8, p + 8, n - 8)))
            return s->id;
    }
}

static inline uint64_t tok_pair_hash(uint64_t key)
{
    key *= 0x9e3779b97f4a7c15ull;
    return key ^ (key >> 29);
}

/* (rank, id) of the pair, rank UINT32_MAX when it does not merge. */
static inline const tok_pair_slot *tok_pair_find(const tio_tok *tok, uint32_t left, uint32_t right)
{
    uint64_t key = ((uint64_t)left << 32) | right;
    uint32_t i = (uint32_t)(tok_pair_hash(key) >> 32) & tok->pair_mask;
    for (;;) {
        const tok_pair_slot *s = &tok->pairs[i];
        if (s->key == key || s->key == UINT64_MAX)
            return s;
        i = (i + 1) & tok->pair_mask;
    }
}

/* tio_tok_parse_hf with `name` (a file's path) in its messages (data/tokenizer.c). */
int tio_tok_parse_hf_named(tio_tok **out, const void *json, size_t len, const char *name);

#endif
