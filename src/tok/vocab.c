/*
 * tok/vocab.c — building a tio_tok's tables: the token arena, the
 * whole-piece hash table, the pair (merge) table, the byte tokens and the
 * special-token index.  Both loaders (tiktoken.c, hf_json.c) fill the arena
 * and ids, then call these in turn.
 *
 * Both tables are open addressing with linear probing at a load factor of at
 * most 1/2: lookups are one multiply and, almost always, one cache line.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/util.h"
#include "tok/tok_internal.h"

int tok_fail_at(int rc, const char *where, const char *at)
{
    char msg[512];
    snprintf(msg, sizeof msg, "%s", tio_last_error());
    return tio_fail(rc, "%s%s: %s", where, at, msg);
}

int tok_new(tio_tok **out)
{
    tio_tok *tok = calloc(1, sizeof *tok);
    if (!tok)
        return tio_fail(-ENOMEM, "out of memory allocating a tokenizer");
    pthread_mutex_init(&tok->ctx_lock, NULL);
    *out = tok;
    return 0;
}

int tok_set_ids(tio_tok *tok, uint32_t n_ids)
{
    if (n_ids > TIO_TOK_MAX_IDS)
        return tio_fail(-E2BIG, "%u ids: more than the limit of %u", n_ids, TIO_TOK_MAX_IDS);
    tok->tok_off = malloc((size_t)(n_ids ? n_ids : 1) * sizeof *tok->tok_off);
    tok->tok_len = calloc(n_ids ? n_ids : 1, sizeof *tok->tok_len);
    if (!tok->tok_off || !tok->tok_len)
        return tio_fail(-ENOMEM, "out of memory for %u ids", n_ids);
    for (uint32_t i = 0; i < n_ids; i++)
        tok->tok_off[i] = TOK_NONE;
    tok->n_ids = n_ids;
    return 0;
}

int tok_arena_add(tio_tok *tok, const void *bytes, size_t len, uint32_t *off)
{
    if (len > TIO_TOK_MAX_TOKEN_BYTES)
        return tio_fail(-E2BIG, "token of %zu bytes: longer than the limit of %u", len,
                        TIO_TOK_MAX_TOKEN_BYTES);
    if (tok->arena_len + len > UINT32_MAX - 1)
        return tio_fail(-E2BIG, "token bytes exceed 4 GiB");
    if (tok->arena_len + len > tok->arena_cap) {
        size_t cap = tok->arena_cap ? tok->arena_cap : 1 << 16;
        while (cap < tok->arena_len + len)
            cap *= 2;
        uint8_t *a = realloc(tok->arena, cap);
        if (!a)
            return tio_fail(-ENOMEM, "out of memory for token bytes");
        tok->arena = a;
        tok->arena_cap = cap;
    }
    if (len)
        memcpy(tok->arena + tok->arena_len, bytes, len);
    *off = (uint32_t)tok->arena_len;
    tok->arena_len += len;
    return 0;
}

static uint32_t table_size(size_t n)
{
    uint32_t size = 16;
    while (size < 2 * n)
        size *= 2;
    return size;
}

uint32_t tok_piece_find(const tio_tok *tok, const uint8_t *p, size_t n)
{
    return n ? tok_piece_lookup(tok, p, n, tok_hash(p, n), tok_head(p, n)) : TOK_NONE;
}

int tok_build_pieces(tio_tok *tok, const uint8_t *is_special)
{
    size_t n = 0;
    for (uint32_t id = 0; id < tok->n_ids; id++)
        n += tok->tok_off[id] != TOK_NONE && !(is_special && is_special[id]);
    free(tok->pieces);
    uint32_t size = table_size(n);
    tok->pieces = malloc(size * sizeof *tok->pieces);
    if (!tok->pieces)
        return tio_fail(-ENOMEM, "out of memory for the token table");
    for (uint32_t i = 0; i < size; i++)
        tok->pieces[i] = (tok_piece_slot){0, TOK_NONE, 0, 0};
    tok->piece_mask = size - 1;
    tok->max_piece_len = 0;
    for (uint32_t id = 0; id < tok->n_ids; id++) {
        if (tok->tok_off[id] == TOK_NONE || (is_special && is_special[id]))
            continue;
        const uint8_t *p = tok->arena + tok->tok_off[id];
        uint32_t len = tok->tok_len[id];
        if (len > tok->max_piece_len)
            tok->max_piece_len = len;
        uint32_t dup = tok_piece_find(tok, p, len);
        if (dup != TOK_NONE)
            return tio_fail(TIO_EPARSE, "tokens %u and %u have the same bytes", dup, id);
        uint64_t h = tok_hash(p, len);
        uint32_t i = (uint32_t)h & tok->piece_mask;
        while (tok->pieces[i].id != TOK_NONE)
            i = (i + 1) & tok->piece_mask;
        tok->pieces[i] = (tok_piece_slot){tok_head(p, len), id, (uint16_t)len, (uint16_t)(h >> 32)};
    }
    return 0;
}

int tok_pairs_init(tio_tok *tok, size_t n)
{
    free(tok->pairs);
    if (n > (1u << 30))
        return tio_fail(-E2BIG, "%zu merges: too many", n);
    uint32_t size = table_size(n);
    tok->pairs = malloc((size_t)size * sizeof *tok->pairs);
    if (!tok->pairs)
        return tio_fail(-ENOMEM, "out of memory for the merge table");
    for (uint32_t i = 0; i < size; i++)
        tok->pairs[i] = (tok_pair_slot){UINT64_MAX, UINT32_MAX, TOK_NONE};
    tok->pair_mask = size - 1;
    return 0;
}

void tok_pair_put(tio_tok *tok, uint32_t left, uint32_t right, uint32_t rank, uint32_t id)
{
    tok_pair_slot *s = (tok_pair_slot *)tok_pair_find(tok, left, right);
    *s = (tok_pair_slot){((uint64_t)left << 32) | right, rank, id};
}

int tok_pairs_from_ranks(tio_tok *tok)
{
    /* Every token of length L has at most L-1 splits into two tokens; the
     * table is sized for those found, so that it stays as small (and as
     * much in cache) as it can: a third of the upper bound in cl100k_base. */
    size_t bound = 0, n = 0;
    for (uint32_t id = 0; id < tok->n_ids; id++)
        if (tok->tok_off[id] != TOK_NONE && tok->tok_len[id] > 1)
            bound += tok->tok_len[id] - 1;
    uint32_t(*found)[3] = malloc((bound ? bound : 1) * sizeof *found);
    if (!found)
        return tio_fail(-ENOMEM, "out of memory for the merge table");
    for (uint32_t id = 0; id < tok->n_ids; id++) {
        uint32_t len = tok->tok_len[id];
        if (tok->tok_off[id] == TOK_NONE || len < 2 || tok_piece_find(tok, tok->arena + tok->tok_off[id], len) != id)
            continue;
        const uint8_t *p = tok->arena + tok->tok_off[id];
        for (uint32_t k = 1; k < len; k++) {
            uint32_t a = tok_piece_find(tok, p, k);
            uint32_t b = a == TOK_NONE ? TOK_NONE : tok_piece_find(tok, p + k, len - k);
            if (b != TOK_NONE) {
                found[n][0] = a;
                found[n][1] = b;
                found[n++][2] = id;
            }
        }
    }
    int rc = tok_pairs_init(tok, n);
    for (size_t i = 0; i < n && rc == 0; i++)
        tok_pair_put(tok, found[i][0], found[i][1], found[i][2], found[i][2]);
    free(found);
    return rc;
}

int tok_find_byte_ids(tio_tok *tok, const char *where)
{
    for (int b = 0; b < 256; b++) {
        uint8_t byte = (uint8_t)b;
        tok->byte_id[b] = tok_piece_find(tok, &byte, 1);
        if (tok->byte_id[b] == TOK_NONE)
            return tio_fail(TIO_EPARSE, "%s: byte 0x%02x has no token (byte-level BPE needs all 256)",
                            where, b);
    }
    return 0;
}

int tok_index_byte_pairs(tio_tok *tok)
{
    tok->byte_pairs = malloc(256 * 256 * sizeof *tok->byte_pairs);
    if (!tok->byte_pairs)
        return tio_fail(-ENOMEM, "out of memory for the byte-pair table");
    for (int a = 0; a < 256; a++)
        for (int b = 0; b < 256; b++) {
            const tok_pair_slot *s = tok_pair_find(tok, tok->byte_id[a], tok->byte_id[b]);
            tok->byte_pairs[a * 256 + b] = (tok_merge){s->rank, s->id};
        }
    return 0;
}

static const tio_tok *sort_tok;

static int special_cmp(const void *a, const void *b)
{
    const tok_special *x = a, *y = b;
    uint8_t fx = sort_tok->arena[x->off], fy = sort_tok->arena[y->off];
    if (fx != fy)
        return fx < fy ? -1 : 1;
    if (x->len != y->len)
        return x->len > y->len ? -1 : 1; /* longest first */
    int c = memcmp(sort_tok->arena + x->off, sort_tok->arena + y->off, x->len);
    if (c)
        return c;
    return x->id < y->id ? -1 : x->id > y->id;
}

int tok_set_specials(tio_tok *tok, const tok_special *list, uint32_t n)
{
    free(tok->specials);
    tok->specials = calloc(n ? n : 1, sizeof *tok->specials);
    if (!tok->specials)
        return tio_fail(-ENOMEM, "out of memory for special tokens");
    if (n > UINT16_MAX)
        return tio_fail(-E2BIG, "%u special tokens: more than %u", n, UINT16_MAX);
    for (uint32_t i = 0; i < n; i++) {
        if (!list[i].len)
            return tio_fail(TIO_EPARSE, "special token %u has empty text", list[i].id);
        tok->specials[i] = list[i];
    }
    tok->n_specials = n;
    /* qsort has no context argument in C17; loading is not performance
     * critical, but it may run on several threads: serialise the sort. */
    static pthread_mutex_t sort_lock = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&sort_lock);
    sort_tok = tok;
    qsort(tok->specials, n, sizeof *tok->specials, special_cmp);
    pthread_mutex_unlock(&sort_lock);
    memset(tok->special_count, 0, sizeof tok->special_count);
    tok->n_special_first = 0;
    tok->one_byte_special = false;
    for (uint32_t i = 0; i < n; i++) {
        tok->one_byte_special |= tok->specials[i].len == 1;
        if (i > 0 && tok->specials[i].len == tok->specials[i - 1].len &&
            !memcmp(tok->arena + tok->specials[i].off, tok->arena + tok->specials[i - 1].off,
                    tok->specials[i].len))
            return tio_fail(TIO_EPARSE, "special tokens %u and %u have the same text",
                            tok->specials[i - 1].id, tok->specials[i].id);
        uint8_t f = tok->arena[tok->specials[i].off];
        if (tok->special_count[f]++ == 0) {
            tok->special_first[f] = (uint16_t)i;
            tok->special_byte = f;
            tok->n_special_first++;
        }
    }
    return 0;
}

int tok_prune_unreachable(tio_tok *tok)
{
    uint32_t *ids = malloc((tok->max_piece_len + 1) * sizeof *ids);
    uint8_t *drop = calloc(tok->n_ids ? tok->n_ids : 1, 1);
    if (!ids || !drop) {
        free(ids);
        free(drop);
        return tio_fail(-ENOMEM, "out of memory checking merges");
    }
    for (uint32_t i = 0; i <= tok->piece_mask; i++) {
        uint32_t id = tok->pieces[i].id;
        if (id == TOK_NONE || tok->tok_len[id] < 2)
            continue;
        size_t n = tok_merge_bytes(tok, tok->arena + tok->tok_off[id], tok->tok_len[id], ids);
        drop[id] = !(n == 1 && ids[0] == id);
    }
    free(ids);
    int rc = tok_build_pieces(tok, drop);
    free(drop);
    return rc;
}
