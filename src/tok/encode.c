/*
 * tok/encode.c — encoding, batch encoding and decoding.
 *
 * The pieces come from the built-in splitter (split_builtin.h) for the
 * patterns of the built-in encodings, PCRE2 for any other.  The hot path,
 * per piece, inlined into the split loop:
 *   1. one byte: its byte token;
 *   2. pieces of up to TIO_TOK_CACHE_PIECE_BYTES: the per-thread cache of
 *      recent pieces (direct-mapped, so it is bounded and never evicts by
 *      scanning; whole-token pieces included, so frequent pieces are found
 *      in the core's own cache, not the shared token table), compared by
 *      key (three words, tok_key): the cached ids;
 *   3. the whole piece is a token (one hash lookup; most pieces of real text
 *      are): that token;
 *   4. BPE merge, starting from the table of byte pairs.  Pieces of up to
 *      SMALL_PIECE bytes: arrays of tokens, the rank of the pair each
 *      starts, links to the live neighbours, and a scan for the lowest
 *      rank; no rescans of bytes, each rank is a pair-table lookup by ids.
 *      Longer pieces: a doubly linked list of tokens and a binary min-heap of
 *      (rank, position), stale entries skipped on pop, O(n log n) — so a
 *      megabyte-long run of letters costs no more than its size suggests.
 * Ties between equal ranks go to the leftmost pair, as in tiktoken's
 * byte_pair_merge and Hugging Face's BPE Word::merge_all.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "common/util.h"
#include "tok/split_builtin.h"
#include "tok/tok_internal.h"

#define SMALL_PIECE 64
#define CACHE_IDS 8

_Static_assert(TIO_TOK_CACHE_PIECE_BYTES == TOK_KEY_BYTES, "cached pieces are compared by key");

typedef struct {
    tok_key key;
    uint32_t len; /* 0: empty */
    uint32_t n_ids;
    uint32_t ids[CACHE_IDS];
} cache_slot; /* one cache line */

struct tok_ctx {
    tok_ctx *next;
    tio_tok *tok;
#if TIO_HAVE_PCRE2
    pcre2_match_data *md;
    pcre2_match_context *mc;
    pcre2_jit_stack *js;
#endif
    cache_slot *cache;
    uint32_t *work; /* linked-list merge: 5 arrays of n */
    size_t work_cap;
    uint64_t *heap;
    size_t heap_cap;
    uint8_t *prefixed; /* HF add_prefix_space copy of a stretch */
    size_t prefixed_cap;
};

typedef struct {
    const tio_tok *tok;
    tok_ctx *ctx;
    uint32_t *ids;
    size_t n, cap;
    /* tok_split_pieces: piece ends (offsets from base) go to ends[cap]
     * instead of ids; `regex` forces PCRE2 for built-in patterns. */
    size_t *ends;
    const uint8_t *base;
    bool regex;
} encoder;

/* ---- per-thread state -------------------------------------------------- */

static void ctx_free(tok_ctx *c)
{
#if TIO_HAVE_PCRE2
    pcre2_match_data_free(c->md);
    pcre2_match_context_free(c->mc);
    pcre2_jit_stack_free(c->js);
#endif
    free(c->cache);
    free(c->work);
    free(c->heap);
    free(c->prefixed);
    free(c);
}

static int ctx_get(const tio_tok *ctok, tok_ctx **out)
{
    tio_tok *tok = (tio_tok *)ctok; /* only the ctx list and key change */
    tok_ctx *c = pthread_getspecific(tok->key);
    if (c) {
        *out = c;
        return 0;
    }
    c = calloc(1, sizeof *c);
    if (!c)
        return tio_fail(-ENOMEM, "out of memory for tokenizer thread state");
    c->cache = calloc(TIO_TOK_CACHE_ENTRIES, sizeof *c->cache);
#if TIO_HAVE_PCRE2
    c->md = pcre2_match_data_create(1, NULL);
    c->mc = pcre2_match_context_create(NULL);
    c->js = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
    if (c->mc && c->js)
        pcre2_jit_stack_assign(c->mc, NULL, c->js);
    if (!c->md || !c->mc || !c->js)
        c->cache = (free(c->cache), NULL);
#endif
    if (!c->cache) {
        ctx_free(c);
        return tio_fail(-ENOMEM, "out of memory for tokenizer thread state");
    }
    c->tok = tok;
    if (pthread_setspecific(tok->key, c) != 0) {
        ctx_free(c);
        return tio_fail(-ENOMEM, "cannot set tokenizer thread state");
    }
    pthread_mutex_lock(&tok->ctx_lock);
    c->next = tok->ctxs;
    tok->ctxs = c;
    pthread_mutex_unlock(&tok->ctx_lock);
    *out = c;
    return 0;
}

/* Thread exit: unlink and free the thread's state. */
static void ctx_destructor(void *arg)
{
    tok_ctx *c = arg;
    tio_tok *tok = c->tok;
    pthread_mutex_lock(&tok->ctx_lock);
    for (tok_ctx **p = &tok->ctxs; *p; p = &(*p)->next)
        if (*p == c) {
            *p = c->next;
            break;
        }
    pthread_mutex_unlock(&tok->ctx_lock);
    ctx_free(c);
}

int tok_init_ctxs(tio_tok *tok)
{
    if (pthread_key_create(&tok->key, ctx_destructor) != 0)
        return tio_fail(-EAGAIN, "no pthread key left for a tokenizer");
    tok->key_created = true;
    return 0;
}

void tok_free_ctxs(tio_tok *tok)
{
    for (tok_ctx *c = tok->ctxs, *next; c; c = next) {
        next = c->next;
        ctx_free(c);
    }
    tok->ctxs = NULL;
}

/* ---- BPE merge --------------------------------------------------------- */

/* Pieces of up to SMALL_PIECE bytes: token i starts at byte i; rank[i] is
 * the merge rank of the pair (token i, the next live token), UINT32_MAX
 * when it does not merge or i is gone.  Each round scans all n ranks for the
 * lowest (the first of equal ones, so the leftmost pair), merges it and
 * unlinks the right token: no shifting of arrays, no heap. */
static size_t merge_small(const tio_tok *tok, const uint8_t *p, size_t n, uint32_t *out)
{
    uint32_t id[SMALL_PIECE], rank[SMALL_PIECE], merged[SMALL_PIECE];
    uint8_t next[SMALL_PIECE], prev[SMALL_PIECE];
    enum { END = SMALL_PIECE };
    for (size_t i = 0; i < n; i++) {
        id[i] = tok->byte_id[p[i]];
        next[i] = (uint8_t)(i + 1);
        prev[i] = (uint8_t)(i - 1);
    }
    next[n - 1] = END;
    prev[0] = END;
    rank[n - 1] = UINT32_MAX;
    for (size_t i = 0; i + 1 < n; i++) {
        tok_merge m = tok->byte_pairs[p[i] * 256 + p[i + 1]];
        rank[i] = m.rank;
        merged[i] = m.id;
    }
    for (;;) {
        uint32_t best = UINT32_MAX;
        size_t at = 0;
        for (size_t i = 0; i + 1 < n; i++)
            if (rank[i] < best) {
                best = rank[i];
                at = i;
            }
        if (best == UINT32_MAX)
            break;
        size_t gone = next[at];
        id[at] = merged[at];
        rank[gone] = UINT32_MAX;
        next[at] = next[gone];
        if (next[gone] != END)
            prev[next[gone]] = (uint8_t)at;
        rank[at] = UINT32_MAX;
        if (next[at] != END) {
            const tok_pair_slot *s = tok_pair_find(tok, id[at], id[next[at]]);
            rank[at] = s->rank;
            merged[at] = s->id;
        }
        if (prev[at] != END) {
            const tok_pair_slot *s = tok_pair_find(tok, id[prev[at]], id[at]);
            rank[prev[at]] = s->rank;
            merged[prev[at]] = s->id;
        }
    }
    size_t m = 0;
    for (size_t i = 0; i != END; i = next[i])
        out[m++] = id[i];
    return m;
}

/* Min-heap of (rank << 32 | position). */
static void heap_push(uint64_t *h, size_t *n, uint64_t v)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (h[parent] <= v)
            break;
        h[i] = h[parent];
        i = parent;
    }
    h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *n)
{
    uint64_t top = h[0], v = h[--*n];
    size_t i = 0, len = *n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= len)
            break;
        if (c + 1 < len && h[c + 1] < h[c])
            c++;
        if (v <= h[c])
            break;
        h[i] = h[c];
        i = c;
    }
    if (len)
        h[i] = v;
    return top;
}

/* The linked-list + heap merge.  work holds 5n uint32 and heap 3n entries
 * (n initial pairs plus at most two pushes per merge). */
static size_t merge_large(const tio_tok *tok, const uint8_t *p, size_t n, uint32_t *out,
                          uint32_t *work, uint64_t *heap)
{
    uint32_t *id = work, *next = work + n, *prev = work + 2 * n, *rank = work + 3 * n,
             *merged = work + 4 * n;
    size_t hn = 0;
    for (size_t i = 0; i < n; i++) {
        id[i] = tok->byte_id[p[i]];
        next[i] = i + 1 < n ? (uint32_t)(i + 1) : TOK_NONE;
        prev[i] = i ? (uint32_t)(i - 1) : TOK_NONE;
    }
    for (size_t i = 0; i + 1 < n; i++) {
        tok_merge m = tok->byte_pairs[p[i] * 256 + p[i + 1]];
        rank[i] = m.rank;
        merged[i] = m.id;
        if (m.rank != UINT32_MAX)
            heap_push(heap, &hn, ((uint64_t)m.rank << 32) | i);
    }
    rank[n - 1] = UINT32_MAX;
    while (hn) {
        uint64_t top = heap_pop(heap, &hn);
        uint32_t i = (uint32_t)top, r = (uint32_t)(top >> 32);
        if (id[i] == TOK_NONE || rank[i] != r)
            continue; /* stale: i was merged away or its pair changed */
        uint32_t j = next[i];
        id[i] = merged[i];
        id[j] = TOK_NONE;
        next[i] = next[j];
        if (next[j] != TOK_NONE)
            prev[next[j]] = i;
        rank[i] = UINT32_MAX;
        if (next[i] != TOK_NONE) {
            const tok_pair_slot *s = tok_pair_find(tok, id[i], id[next[i]]);
            rank[i] = s->rank;
            merged[i] = s->id;
            if (s->rank != UINT32_MAX)
                heap_push(heap, &hn, ((uint64_t)s->rank << 32) | i);
        }
        uint32_t h = prev[i];
        if (h != TOK_NONE) {
            const tok_pair_slot *s = tok_pair_find(tok, id[h], id[i]);
            rank[h] = s->rank;
            merged[h] = s->id;
            if (s->rank != UINT32_MAX)
                heap_push(heap, &hn, ((uint64_t)s->rank << 32) | h);
        }
    }
    size_t m = 0;
    for (uint32_t i = 0; i != TOK_NONE; i = next[i])
        out[m++] = id[i];
    return m;
}

size_t tok_merge_bytes(const tio_tok *tok, const uint8_t *p, size_t n, uint32_t *ids)
{
    if (n <= SMALL_PIECE)
        return merge_small(tok, p, n, ids);
    uint32_t *work = malloc(5 * n * sizeof *work);
    uint64_t *heap = malloc(3 * n * sizeof *heap);
    size_t m = 0;
    if (work && heap)
        m = merge_large(tok, p, n, ids, work, heap);
    free(work);
    free(heap);
    return m;
}

/* ---- pieces ------------------------------------------------------------ */

static inline int emit(encoder *e, uint32_t id)
{
    if (e->n >= e->cap)
        return -ENOSPC;
    e->ids[e->n++] = id;
    return 0;
}

static int emit_merged(encoder *e, const uint8_t *p, size_t n)
{
    if (n <= SMALL_PIECE) {
        uint32_t ids[SMALL_PIECE];
        size_t m = merge_small(e->tok, p, n, ids);
        if (e->n + m > e->cap)
            return -ENOSPC;
        memcpy(e->ids + e->n, ids, m * sizeof *ids);
        e->n += m;
        return 0;
    }
    tok_ctx *c = e->ctx;
    if (c->work_cap < n) {
        uint32_t *w = realloc(c->work, 5 * n * sizeof *w);
        if (!w)
            return tio_fail(-ENOMEM, "out of memory merging a piece of %zu bytes", n);
        c->work = w;
        uint64_t *h = realloc(c->heap, 3 * n * sizeof *h);
        if (!h)
            return tio_fail(-ENOMEM, "out of memory merging a piece of %zu bytes", n);
        c->heap = h;
        c->work_cap = n;
    }
    if (e->n + n > e->cap) {
        /* The result may still fit: merge into scratch first. */
        uint32_t *tmp = malloc(n * sizeof *tmp);
        if (!tmp)
            return tio_fail(-ENOMEM, "out of memory merging a piece of %zu bytes", n);
        size_t m = merge_large(e->tok, p, n, tmp, c->work, c->heap);
        int rc = e->n + m > e->cap ? -ENOSPC : 0;
        if (rc == 0) {
            memcpy(e->ids + e->n, tmp, m * sizeof *tmp);
            e->n += m;
        }
        free(tmp);
        return rc;
    }
    e->n += merge_large(e->tok, p, n, e->ids + e->n, c->work, c->heap);
    return 0;
}

static __attribute__((noinline)) int record_piece(encoder *e, const uint8_t *p, size_t n)
{
    if (e->n >= e->cap)
        return -ENOSPC;
    e->ends[e->n++] = (size_t)(p + n - e->base);
    return 0;
}

/* A piece longer than the cache holds: a whole token or merged. */
static __attribute__((noinline)) int encode_long_piece(encoder *e, const uint8_t *p, size_t n)
{
    uint32_t id = tok_piece_lookup(e->tok, p, n, tok_hash(p, n), tok_head(p, n));
    return id != TOK_NONE ? emit(e, id) : emit_merged(e, p, n);
}

/* A short piece not in `slot`: a whole token or merged, then cached. */
static __attribute__((noinline)) int encode_new_piece(encoder *e, const uint8_t *p, size_t n,
                                                      const tok_key *key, uint64_t h, cache_slot *slot)
{
    size_t start = e->n;
    uint32_t id = tok_piece_lookup(e->tok, p, n, h, key->w[0]);
    int rc = id != TOK_NONE ? emit(e, id) : emit_merged(e, p, n);
    size_t m = e->n - start;
    if (rc == 0 && m <= CACHE_IDS) {
        slot->key = *key;
        slot->len = (uint32_t)n;
        slot->n_ids = (uint32_t)m;
        memcpy(slot->ids, e->ids + start, m * sizeof *slot->ids);
    }
    return rc;
}

/* The ids of one piece.  Inlined into the split loops: most pieces are
 * found in the cache, and this path stays a few dozen instructions. */
static inline __attribute__((always_inline)) int encode_piece(encoder *e, const uint8_t *p, size_t n)
{
    if (__builtin_expect(e->ends != NULL, 0))
        return record_piece(e, p, n);
    if (n == 1)
        return emit(e, e->tok->byte_id[p[0]]);
    if (n > TIO_TOK_CACHE_PIECE_BYTES)
        return encode_long_piece(e, p, n);
    /* Short pieces look in this thread's cache first: it holds the recent
     * ones, whole tokens included, in a quarter of a megabyte that stays in
     * the core's own cache, while the token table is shared and larger. */
    tok_key key = tok_key_of(p, n);
    uint64_t h = tok_key_hash(&key, n);
    cache_slot *slot = &e->ctx->cache[(h >> 20) & (TIO_TOK_CACHE_ENTRIES - 1)];
    if (slot->len != n || !tok_key_equal(&slot->key, &key))
        return encode_new_piece(e, p, n, &key, h, slot);
    size_t m = slot->n_ids, room = e->cap - e->n;
    if (room >= CACHE_IDS) /* all of them where they fit: a fixed-size copy */
        memcpy(e->ids + e->n, slot->ids, sizeof slot->ids);
    else if (room >= m)
        memcpy(e->ids + e->n, slot->ids, m * sizeof *slot->ids);
    else
        return -ENOSPC;
    e->n += m;
    return 0;
}

/* ---- UTF-8 ------------------------------------------------------------- */

/* Length of the valid UTF-8 sequence at p (1..4), or 0 if none starts
 * there (Unicode Table 3-7: no overlongs, surrogates or > U+10FFFF). */
static inline size_t utf8_seq(const uint8_t *p, size_t n)
{
    uint8_t c = p[0];
    if (c < 0x80)
        return 1;
    if (c < 0xc2)
        return 0;
    if (c < 0xe0)
        return n >= 2 && (p[1] & 0xc0) == 0x80 ? 2 : 0;
    if (c < 0xf0) {
        if (n < 3 || (p[1] & 0xc0) != 0x80 || (p[2] & 0xc0) != 0x80)
            return 0;
        if ((c == 0xe0 && p[1] < 0xa0) || (c == 0xed && p[1] >= 0xa0))
            return 0;
        return 3;
    }
    if (c < 0xf5) {
        if (n < 4 || (p[1] & 0xc0) != 0x80 || (p[2] & 0xc0) != 0x80 || (p[3] & 0xc0) != 0x80)
            return 0;
        if ((c == 0xf0 && p[1] < 0x90) || (c == 0xf4 && p[1] >= 0x90))
            return 0;
        return 4;
    }
    return 0;
}

/* Length of the longest valid UTF-8 prefix of p[0..n). */
static size_t utf8_valid_prefix(const uint8_t *p, size_t n)
{
    size_t i = 0;
    while (i < n) {
        if (i + 8 <= n) {
            uint64_t v;
            memcpy(&v, p + i, 8);
            if (!(v & 0x8080808080808080ull)) {
                i += 8;
                continue;
            }
        }
        size_t k = utf8_seq(p + i, n - i);
        if (!k)
            break;
        i += k;
    }
    return i;
}

/* ---- pre-tokenization -------------------------------------------------- */

static int split_stage(encoder *e, int stage, const uint8_t *s, size_t n);

#if TIO_HAVE_PCRE2
static int split_regex(encoder *e, int stage, const uint8_t *s, size_t n)
{
    const tok_stage *st = &e->tok->stages[stage];
    pcre2_match_data *md = e->ctx->md;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    size_t off = 0, gap = 0; /* next search start; start of unmatched text */
    while (off < n) {
        int rc = st->jit ? pcre2_jit_match(st->code, s, n, off, PCRE2_NO_UTF_CHECK, md, e->ctx->mc)
                         : pcre2_match(st->code, s, n, off, PCRE2_NO_UTF_CHECK, md, e->ctx->mc);
        if (rc == PCRE2_ERROR_NOMATCH)
            break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return tio_fail(-EIO, "split regex failed at byte %zu: %s", off, (char *)msg);
        }
        size_t start = ov[0], end = ov[1];
        if (end == start) { /* empty match: step over one character */
            size_t k = utf8_seq(s + start, n - start);
            off = start + (k ? k : 1);
            continue;
        }
        int err = 0;
        if (st->keep_gaps && start > gap)
            err = split_stage(e, stage + 1, s + gap, start - gap);
        if (!err)
            err = split_stage(e, stage + 1, s + start, end - start);
        if (err)
            return err;
        off = gap = end;
    }
    if (st->keep_gaps && n > gap)
        return split_stage(e, stage + 1, s + gap, n - gap);
    return 0;
}
#endif

/* The pieces of a built-in pattern (split_builtin.h), each to the next
 * stage or, after the last, to BPE. */
static inline __attribute__((always_inline)) int
split_with(encoder *e, int stage, const uint8_t *s, size_t n,
           size_t (*piece_end)(const uint8_t *, size_t, size_t))
{
    bool last = stage + 1 == e->tok->n_stages;
    for (size_t i = 0, end; i < n; i = end) {
        end = piece_end(s, n, i);
        int rc = last ? encode_piece(e, s + i, end - i) : split_stage(e, stage + 1, s + i, end - i);
        if (rc)
            return rc;
    }
    return 0;
}

static int split_builtin(encoder *e, int stage, int kind, const uint8_t *s, size_t n)
{
    switch (kind) {
    case TOK_SPLIT_GPT2:
        return split_with(e, stage, s, n, piece_gpt2);
    case TOK_SPLIT_CL100K:
        return split_with(e, stage, s, n, piece_cl100k);
    default:
        return split_with(e, stage, s, n, piece_o200k);
    }
}

static int split_stage(encoder *e, int stage, const uint8_t *s, size_t n)
{
    if (stage == e->tok->n_stages)
        return encode_piece(e, s, n);
    int builtin = e->tok->stages[stage].builtin;
    if (builtin != TOK_SPLIT_REGEX && !e->regex)
        return split_builtin(e, stage, builtin, s, n);
#if TIO_HAVE_PCRE2
    return split_regex(e, stage, s, n);
#else
    return -ENOTSUP;
#endif
}

/* A stretch of text without special tokens: valid UTF-8 runs go through
 * the regex, invalid runs are pieces of their own. */
/* Valid UTF-8 runs of s[0..n) through the split, invalid runs as pieces. */
static int encode_runs(encoder *e, const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        size_t valid = utf8_valid_prefix(s + i, n - i);
        if (valid) {
            int rc = split_stage(e, 0, s + i, valid);
            if (rc)
                return rc;
            i += valid;
        }
        size_t bad = 0;
        while (i + bad < n && !utf8_seq(s + i + bad, n - i - bad))
            bad++;
        if (bad) {
            int rc = encode_piece(e, s + i, bad);
            if (rc)
                return rc;
            i += bad;
        }
    }
    return 0;
}

/* A stretch of text without special tokens (HF add_prefix_space: with a
 * space in front, in the thread's copy). */
static int encode_ordinary(encoder *e, const uint8_t *s, size_t n)
{
    if (!n)
        return 0;
    if (!e->tok->add_prefix_space || s[0] == ' ')
        return encode_runs(e, s, n);
    tok_ctx *c = e->ctx;
    if (c->prefixed_cap < n + 1) {
        uint8_t *b = realloc(c->prefixed, n + 1);
        if (!b)
            return tio_fail(-ENOMEM, "out of memory for %zu bytes of text", n + 1);
        c->prefixed = b;
        c->prefixed_cap = n + 1;
    }
    c->prefixed[0] = ' ';
    memcpy(c->prefixed + 1, s, n);
    return encode_runs(e, c->prefixed, n + 1);
}

/* Leftmost special token at or after `from`, longest at that position. */
static bool find_special(const tio_tok *tok, const uint8_t *s, size_t n, size_t from,
                         size_t *at, const tok_special **which)
{
    for (size_t i = from; i < n; i++) {
        if (tok->n_special_first == 1) {
            const uint8_t *q = memchr(s + i, tok->special_byte, n - i);
            if (!q)
                return false;
            i = (size_t)(q - s);
        }
        uint32_t cnt = tok->special_count[s[i]];
        const tok_special *sp = tok->specials + tok->special_first[s[i]];
        for (uint32_t k = 0; k < cnt; k++)
            if (sp[k].len <= n - i && !memcmp(tok->arena + sp[k].off, s + i, sp[k].len)) {
                *at = i;
                *which = &sp[k];
                return true;
            }
    }
    return false;
}

static int encode_text(encoder *e, const uint8_t *s, size_t n, int special)
{
    const tio_tok *tok = e->tok;
    if (!tok->n_specials || (special == TIO_TOK_SPECIAL_TEXT && !tok->always_special))
        return encode_ordinary(e, s, n);
    size_t pos = 0, at;
    const tok_special *sp;
    while (find_special(tok, s, n, pos, &at, &sp)) {
        if (special == TIO_TOK_SPECIAL_REJECT)
            return tio_fail(TIO_EPARSE, "special token '%.*s' at byte %zu is not allowed",
                            (int)sp->len, (const char *)tok->arena + sp->off, at);
        int rc = encode_ordinary(e, s + pos, at - pos);
        if (!rc)
            rc = emit(e, sp->id);
        if (rc)
            return rc;
        pos = at + sp->len;
    }
    return encode_ordinary(e, s + pos, n - pos);
}

size_t tio_tok_max_ids(const tio_tok *tok, size_t len)
{
    if (!tok || !tok->add_prefix_space || !len)
        return tok ? len : 0;
    /* Each stretch between special tokens gains at most one id (its
     * space); each special token is one id for at least as many bytes. */
    return tok->one_byte_special ? 2 * len : len + 1;
}

int tio_tok_encode(const tio_tok *tok, const void *text, size_t len, int special, uint32_t *ids,
                   size_t cap, size_t *n_ids)
{
    if (n_ids)
        *n_ids = 0;
    if (!tok || (!text && len) || (!ids && cap) || !n_ids)
        return tio_fail(-EINVAL, "tio_tok_encode: NULL argument");
    if (special < TIO_TOK_SPECIAL_TEXT || special > TIO_TOK_SPECIAL_REJECT)
        return tio_fail(-EINVAL, "tio_tok_encode: special mode %d is not one of TIO_TOK_SPECIAL_*",
                        special);
    encoder e = {.tok = tok, .ids = ids, .cap = cap};
    int rc = ctx_get(tok, &e.ctx);
    if (rc)
        return rc;
    rc = encode_text(&e, text, len, special);
    *n_ids = e.n;
    if (rc == -ENOSPC)
        return tio_fail(-ENOSPC, "%zu ids do not fit: the output holds %zu", len, cap);
    return rc;
}

int tok_split_pieces(const tio_tok *tok, bool regex, const void *text, size_t len, size_t *ends,
                     size_t cap, size_t *n)
{
    *n = 0;
    if (regex && !TIO_HAVE_PCRE2)
        return tio_fail(-ENOTSUP, "teraio was built without PCRE2");
    if (tok->add_prefix_space)
        return tio_fail(-ENOTSUP, "tok_split_pieces: add_prefix_space moves the text");
    encoder e = {.tok = tok, .cap = cap, .ends = ends, .base = text, .regex = regex};
    int rc = ctx_get(tok, &e.ctx);
    if (rc == 0)
        rc = encode_ordinary(&e, text, len);
    *n = e.n;
    return rc;
}

/* ---- batch ------------------------------------------------------------- */

typedef struct {
    size_t len, index;
} text_ref;

typedef struct {
    const tio_tok *tok;
    const void *const *texts;
    const size_t *lens;
    size_t n_texts;
    int special;
    uint32_t *ids;
    size_t *starts; /* where text i's ids begin before packing */
    size_t *counts;
    int *rcs;
    text_ref *order; /* texts longest first (index order on one thread) */
    size_t next;   /* atomic: next entry of order to take */
    pthread_mutex_t err_lock;
    size_t err_text; /* the failing text of lowest index so far, and its message */
    char err_msg[512];
} batch;

/* Longest first (LPT): the last texts handed out are the short ones, so the
 * threads finish together.  Ties by index, so the order is deterministic. */
static int by_len_desc(const void *a, const void *b)
{
    const text_ref *x = a, *y = b;
    if (x->len != y->len)
        return x->len > y->len ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

static void *batch_worker(void *arg)
{
    batch *b = arg;
    for (;;) {
        size_t k = __atomic_fetch_add(&b->next, 1, __ATOMIC_RELAXED);
        if (k >= b->n_texts)
            break;
        size_t i = b->order[k].index;
        b->rcs[i] = tio_tok_encode(b->tok, b->texts[i], b->lens[i], b->special, b->ids + b->starts[i],
                                   b->starts[i + 1] - b->starts[i], &b->counts[i]);
        if (b->rcs[i]) { /* the message is this thread's: keep the first text's */
            pthread_mutex_lock(&b->err_lock);
            if (i < b->err_text) {
                b->err_text = i;
                snprintf(b->err_msg, sizeof b->err_msg, "%s", tio_last_error());
            }
            pthread_mutex_unlock(&b->err_lock);
        }
    }
    return NULL;
}

int tio_tok_encode_batch(const tio_tok *tok, const void *const *texts, const size_t *lens,
                         size_t n_texts, int special, unsigned n_threads, uint32_t *ids,
                         size_t cap, size_t *offsets)
{
    if (!tok || (!texts && n_texts) || (!lens && n_texts) || !offsets || (!ids && cap))
        return tio_fail(-EINVAL, "tio_tok_encode_batch: NULL argument");
    /* Each text first writes at the sum of the bounds (tio_tok_max_ids)
     * before it, then the results are packed.  That needs cap >= their sum. */
    size_t total = 0, bytes = 0;
    for (size_t i = 0; i < n_texts; i++) {
        total += tio_tok_max_ids(tok, lens[i]);
        bytes += lens[i];
    }
    offsets[0] = 0;
    if (total > cap)
        return tio_fail(-ENOSPC, "batch of %zu bytes needs room for %zu ids, the output holds %zu",
                        bytes, total, cap);
    batch b = {tok, texts, lens, n_texts, special, ids, NULL, NULL, NULL, NULL, 0,
               PTHREAD_MUTEX_INITIALIZER, SIZE_MAX, ""};
    b.starts = malloc((n_texts + 1) * sizeof *b.starts);
    b.counts = calloc(n_texts + 1, sizeof *b.counts);
    b.rcs = calloc(n_texts + 1, sizeof *b.rcs);
    b.order = malloc((n_texts + 1) * sizeof *b.order);
    int rc = 0;
    if (!b.starts || !b.counts || !b.rcs || !b.order) {
        rc = tio_fail(-ENOMEM, "out of memory for a batch of %zu texts", n_texts);
        goto out;
    }
    b.starts[0] = 0;
    for (size_t i = 0; i < n_texts; i++) {
        b.starts[i + 1] = b.starts[i] + tio_tok_max_ids(tok, lens[i]);
        b.order[i] = (text_ref){lens[i], i};
    }
    if (n_threads == 0) {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = cpus > 0 ? (unsigned)cpus : 1;
    }
    if (n_threads > n_texts)
        n_threads = n_texts ? (unsigned)n_texts : 1;
    if (n_threads > 1)
        qsort(b.order, n_texts, sizeof *b.order, by_len_desc);
    pthread_t *th = calloc(n_threads, sizeof *th);
    if (!th) {
        rc = tio_fail(-ENOMEM, "out of memory for %u threads", n_threads);
        goto out;
    }
    unsigned started = 0;
    for (; started + 1 < n_threads; started++)
        if (pthread_create(&th[started], NULL, batch_worker, &b) != 0)
            break;
    batch_worker(&b); /* the calling thread works too */
    for (unsigned t = 0; t < started; t++)
        pthread_join(th[t], NULL);
    free(th);
    if (started + 1 < n_threads && n_texts > 1)
        tio_log(TIO_LOG_WARN, "tokenizer: started %u of %u batch threads", started + 1, n_threads);
    for (size_t i = 0; i < n_texts && !rc; i++)
        if (b.rcs[i])
            rc = tio_fail(b.rcs[i], "text %zu of the batch: %s", i,
                          i == b.err_text && b.err_msg[0] ? b.err_msg : tio_strerror(b.rcs[i]));
    if (!rc) {
        for (size_t i = 0; i < n_texts; i++) {
            memmove(ids + offsets[i], ids + b.starts[i], b.counts[i] * sizeof *ids);
            offsets[i + 1] = offsets[i] + b.counts[i];
        }
    }
out:
    free(b.starts);
    free(b.counts);
    free(b.rcs);
    free(b.order);
    pthread_mutex_destroy(&b.err_lock);
    return rc;
}

/* ---- decoding ---------------------------------------------------------- */

int tio_tok_decode(const tio_tok *tok, const uint32_t *ids, size_t n, void *out, size_t cap,
                   size_t *n_bytes)
{
    if (!tok || (!ids && n) || (!out && cap) || !n_bytes)
        return tio_fail(-EINVAL, "tio_tok_decode: NULL argument");
    size_t need = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] >= tok->n_ids || tok->tok_off[ids[i]] == TOK_NONE) {
            *n_bytes = 0;
            return tio_fail(-ENOENT, "id %u (at index %zu) is not a token", ids[i], i);
        }
        need += tok->tok_len[ids[i]];
    }
    *n_bytes = need;
    if (need > cap)
        return tio_fail(-ENOSPC, "decoding needs %zu bytes, the output holds %zu", need, cap);
    uint8_t *o = out;
    for (size_t i = 0; i < n; i++) {
        memcpy(o, tok->arena + tok->tok_off[ids[i]], tok->tok_len[ids[i]]);
        o += tok->tok_len[ids[i]];
    }
    return 0;
}
