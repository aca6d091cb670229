/*
 * data/state.c — the loader state file: serialize a generator, check and
 * parse state files, and load one rank's state or re-deal the states of all
 * ranks of a run with another world size.
 *
 * Layout (little-endian; docs/loader.md "Loader state"):
 *   "TIODATA\0"  u32 version (1)  u64 settings fingerprint
 *   u32 rank  u32 world_size  u32 logical_shards  u32 seq_len  u32 shuffle_buffer
 *   u64 samples delivered  u32 sub-dataset count, each:
 *     u32 name bytes, name, u64 fingerprint, f64 weight, u64 tokens packed,
 *     u32 shards, each: u32 shard, u32 epoch, u64 range cursor, u64 document
 *     cursor, u64 documents consumed
 *   u32 pending spans, spans; u32 partial-sample spans, spans;
 *   u32 buffered samples, each: u32 spans, spans
 *   u32 CRC-32 of all bytes before it
 * A span is u32 sub-dataset (index in this file's list), u32 file, u64
 * document, u32 offset, u32 length, u32 epoch (28 bytes).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "data/gen.h"

#define STATE_MAGIC "TIODATA"
#define STATE_VERSION 1u
#define SPAN_BYTES 28u
#define SHARD_BYTES 32u

/* ---- writing --------------------------------------------------------------- */

typedef struct {
    uint8_t *b;
    size_t n, cap;
    int rc;
} wbuf;

static void put(wbuf *w, const void *p, size_t n)
{
    if (w->rc)
        return;
    if (w->n + n > w->cap) {
        size_t c = w->cap ? w->cap * 2 : 4096;
        while (c < w->n + n)
            c *= 2;
        uint8_t *q = realloc(w->b, c);
        if (!q) {
            w->rc = tio_fail(-ENOMEM, "out of memory serializing the loader state");
            return;
        }
        w->b = q;
        w->cap = c;
    }
    memcpy(w->b + w->n, p, n);
    w->n += n;
}
static void put32(wbuf *w, uint32_t v) { put(w, &v, 4); }
static void put64(wbuf *w, uint64_t v) { put(w, &v, 8); }

static void put_span(wbuf *w, const tio_data_span *s)
{
    put32(w, s->subdataset);
    put32(w, s->file);
    put64(w, s->doc);
    put32(w, s->offset);
    put32(w, s->length);
    put32(w, s->epoch);
}

int tio_gen_serialize(const tio_gen *g, void **buf, size_t *len)
{
    wbuf w = {0};
    put(&w, STATE_MAGIC, 8);
    put32(&w, STATE_VERSION);
    put64(&w, g->fingerprint);
    put32(&w, g->opts.rank);
    put32(&w, g->opts.world_size);
    put32(&w, g->opts.logical_shards);
    put32(&w, g->opts.seq_len);
    put32(&w, g->opts.shuffle_buffer);
    put64(&w, g->produced);
    put32(&w, g->ds->n_subs);
    for (uint32_t d = 0; d < g->ds->n_subs; d++) {
        const tio_gen_sub *gs = &g->subs[d];
        const tio_data_sub *sub = &g->ds->subs[d];
        uint32_t nl = (uint32_t)strlen(sub->name);
        put32(&w, nl);
        put(&w, sub->name, nl);
        put64(&w, sub->fingerprint);
        put(&w, &gs->weight, 8);
        put64(&w, gs->tokens);
        put32(&w, gs->n_owned);
        for (uint32_t i = 0; i < gs->n_owned; i++) {
            put32(&w, gs->owned[i]);
            put32(&w, gs->pos[i].epoch);
            put64(&w, gs->pos[i].r);
            put64(&w, gs->pos[i].j);
            put64(&w, gs->pos[i].consumed);
        }
    }
    put32(&w, g->n_pending);
    for (uint32_t i = 0; i < g->n_pending; i++)
        put_span(&w, &g->pending[g->pend_head + i]);
    put32(&w, g->partial.n_spans);
    for (uint32_t i = 0; i < g->partial.n_spans; i++)
        put_span(&w, &g->partial.spans[i]);
    put32(&w, g->n_buf);
    for (uint32_t b = 0; b < g->n_buf; b++) {
        put32(&w, g->buf[b].n_spans);
        for (uint32_t i = 0; i < g->buf[b].n_spans; i++)
            put_span(&w, &g->buf[b].spans[i]);
    }
    if (!w.rc)
        put32(&w, tio_crc32(w.b, w.n));
    if (w.rc) {
        free(w.b);
        return w.rc;
    }
    *buf = w.b;
    *len = w.n;
    return 0;
}

/* ---- parsing --------------------------------------------------------------- */

typedef struct {
    const char *name;
    uint32_t name_len;
    uint64_t fingerprint;
    double weight;
    uint64_t tokens;
    uint32_t n_shards;
    const uint8_t *shards; /* SHARD_BYTES each */
    int match;             /* index in the dataset, -1 if gone */
} st_sub;

typedef struct {
    const uint8_t *spans;
    uint32_t n;
} st_spans;

typedef struct {
    uint64_t fingerprint;
    uint32_t rank, world, L, seq_len, shuffle;
    uint64_t produced;
    uint32_t n_subs;
    st_sub *subs;
    st_spans pending, partial;
    uint32_t n_buf;
    st_spans *buf;
} st_parsed;

typedef struct {
    const uint8_t *b;
    size_t n, i;
    const char *name;
    int rc;
} rcur;

static bool need(rcur *c, size_t k, const char *what)
{
    if (c->rc)
        return false;
    if (c->n - c->i < k) {
        c->rc = tio_fail(TIO_EPARSE, "%s: offset %zu: truncated state (reading %s)", c->name,
                         c->i, what);
        return false;
    }
    return true;
}
static uint32_t get32(rcur *c, const char *what)
{
    uint32_t v = 0;
    if (need(c, 4, what))
        memcpy(&v, c->b + c->i, 4), c->i += 4;
    return v;
}
static uint64_t get64(rcur *c, const char *what)
{
    uint64_t v = 0;
    if (need(c, 8, what))
        memcpy(&v, c->b + c->i, 8), c->i += 8;
    return v;
}
static const uint8_t *get_bytes(rcur *c, uint64_t count, uint64_t size, const char *what)
{
    if (c->rc)
        return NULL;
    if (size && count > (c->n - c->i) / size) {
        c->rc = tio_fail(TIO_EPARSE, "%s: offset %zu: %llu %s do not fit in the state", c->name,
                         c->i, (unsigned long long)count, what);
        return NULL;
    }
    const uint8_t *p = c->b + c->i;
    c->i += (size_t)(count * size);
    return p;
}

static void span_at(const uint8_t *p, tio_data_span *s)
{
    memcpy(&s->subdataset, p, 4);
    memcpy(&s->file, p + 4, 4);
    memcpy(&s->doc, p + 8, 8);
    memcpy(&s->offset, p + 16, 4);
    memcpy(&s->length, p + 20, 4);
    memcpy(&s->epoch, p + 24, 4);
}

static void get_spans(rcur *c, st_spans *s, uint32_t n_subs)
{
    s->n = get32(c, "span count");
    s->spans = get_bytes(c, s->n, SPAN_BYTES, "spans");
    for (uint32_t i = 0; !c->rc && i < s->n; i++) {
        tio_data_span sp;
        span_at(s->spans + (size_t)i * SPAN_BYTES, &sp);
        if (sp.subdataset >= n_subs || sp.length == 0)
            c->rc = tio_fail(TIO_EPARSE, "%s: span %u: sub-dataset %u of %u, length %u", c->name,
                             i, sp.subdataset, n_subs, sp.length);
    }
}

int tio_state_check(const void *buf, size_t len, const char *name)
{
    if (len < 12 || memcmp(buf, STATE_MAGIC, 8) != 0)
        return tio_fail(TIO_EPARSE, "%s: not a teraio loader state (bad magic)", name);
    uint32_t version;
    memcpy(&version, (const uint8_t *)buf + 8, 4);
    if (version != STATE_VERSION)
        return tio_fail(TIO_EVERSION, "%s: loader state version %u (this build reads %u)", name,
                        version, STATE_VERSION);
    if (len < 16)
        return tio_fail(TIO_EPARSE, "%s: truncated state", name);
    uint32_t crc;
    memcpy(&crc, (const uint8_t *)buf + len - 4, 4);
    if (crc != tio_crc32(buf, len - 4))
        return tio_fail(TIO_ECORRUPT, "%s: loader state checksum mismatch (damaged or truncated "
                        "file)", name);
    return 0;
}

static void parsed_free(st_parsed *p)
{
    free(p->subs);
    free(p->buf);
    memset(p, 0, sizeof *p);
}

/* The checked file (tio_state_check) and its fixed header, from the
 * fingerprint to the sub-dataset count, into p (zeroed first); *c is left
 * after it, over the bytes before the CRC.  Allocates nothing, so that
 * tio_state_precheck can read the settings before anything is sized by
 * them.  0, TIO_EPARSE, or the errors of tio_state_check. */
static int parse_header(const void *buf, size_t len, const char *name, st_parsed *p, rcur *c)
{
    memset(p, 0, sizeof *p);
    int rc = tio_state_check(buf, len, name);
    if (rc)
        return rc;
    *c = (rcur){buf, len - 4, 12, name, 0};
    p->fingerprint = get64(c, "fingerprint");
    p->rank = get32(c, "rank");
    p->world = get32(c, "world size");
    p->L = get32(c, "logical shards");
    p->seq_len = get32(c, "seq_len");
    p->shuffle = get32(c, "shuffle buffer");
    p->produced = get64(c, "samples");
    p->n_subs = get32(c, "sub-dataset count");
    if (!c->rc && (p->world == 0 || p->rank >= p->world || p->L < p->world))
        c->rc = tio_fail(TIO_EPARSE, "%s: rank %u, world size %u, %u logical shards", name,
                         p->rank, p->world, p->L);
    return c->rc;
}

static int parse(const void *buf, size_t len, const char *name, st_parsed *p)
{
    rcur c;
    int rc = parse_header(buf, len, name, p, &c);
    if (rc)
        return rc;
    if (p->n_subs > (c.n - c.i) / 32)
        c.rc = tio_fail(TIO_EPARSE, "%s: %u sub-datasets do not fit", name, p->n_subs);
    if (!c.rc && !(p->subs = calloc(p->n_subs ? p->n_subs : 1, sizeof *p->subs)))
        c.rc = tio_fail(-ENOMEM, "out of memory");
    for (uint32_t d = 0; !c.rc && d < p->n_subs; d++) {
        st_sub *s = &p->subs[d];
        s->name_len = get32(&c, "name length");
        s->name = (const char *)get_bytes(&c, s->name_len, 1, "name bytes");
        s->fingerprint = get64(&c, "sub-dataset fingerprint");
        uint64_t wbits = get64(&c, "weight");
        memcpy(&s->weight, &wbits, 8);
        s->tokens = get64(&c, "tokens");
        s->n_shards = get32(&c, "shard count");
        s->shards = get_bytes(&c, s->n_shards, SHARD_BYTES, "shards");
        uint32_t owned = (p->L - p->rank + p->world - 1) / p->world;
        if (!c.rc && s->n_shards != owned)
            c.rc = tio_fail(TIO_EPARSE, "%s: %u shard positions for rank %u, which owns %u of %u",
                            name, s->n_shards, p->rank, owned, p->L);
        for (uint32_t i = 0, prev = 0; !c.rc && i < s->n_shards; i++) {
            uint32_t shard;
            memcpy(&shard, s->shards + (size_t)i * SHARD_BYTES, 4);
            if (shard >= p->L || shard % p->world != p->rank)
                c.rc = tio_fail(TIO_EPARSE, "%s: shard %u is not rank %u's (of %u, L %u)", name,
                                shard, p->rank, p->world, p->L);
            else if (i > 0 && shard <= prev) /* written in increasing order */
                c.rc = tio_fail(TIO_EPARSE, "%s: shard %u %s", name, shard,
                                shard == prev ? "given twice" : "out of order");
            prev = shard;
        }
        if (!c.rc && (!isfinite(s->weight) || s->weight < 0))
            c.rc = tio_fail(TIO_EPARSE, "%s: bad weight", name);
        for (uint32_t k = 0; !c.rc && k < d; k++)
            if (p->subs[k].name_len == s->name_len && !memcmp(p->subs[k].name, s->name, s->name_len))
                c.rc = tio_fail(TIO_EPARSE, "%s: sub-dataset '%.*s' twice", name,
                                (int)s->name_len, s->name);
    }
    get_spans(&c, &p->pending, p->n_subs);
    get_spans(&c, &p->partial, p->n_subs);
    p->n_buf = get32(&c, "buffered samples");
    if (!c.rc && p->n_buf > (c.n - c.i) / 4)
        c.rc = tio_fail(TIO_EPARSE, "%s: %u buffered samples do not fit", name, p->n_buf);
    if (!c.rc && !(p->buf = calloc(p->n_buf ? p->n_buf : 1, sizeof *p->buf)))
        c.rc = tio_fail(-ENOMEM, "out of memory");
    for (uint32_t b = 0; !c.rc && b < p->n_buf; b++)
        get_spans(&c, &p->buf[b], p->n_subs);
    if (!c.rc && c.i != c.n)
        c.rc = tio_fail(TIO_EPARSE, "%s: %zu bytes after the state", name, c.n - c.i);
    if (c.rc)
        parsed_free(p);
    return c.rc;
}

/* ---- loading ---------------------------------------------------------------- */

/* Translate a span of a state into the dataset's numbering; false if its
 * sub-dataset is gone. */
static int map_span(const tio_gen *g, const st_parsed *p, const uint8_t *raw, tio_data_span *out,
                    bool *keep)
{
    span_at(raw, out);
    int d = p->subs[out->subdataset].match;
    *keep = d >= 0;
    if (!*keep)
        return 0;
    out->subdataset = (uint32_t)d;
    const tio_data_sub *sub = &g->ds->subs[d];
    if (out->file >= sub->n_files || out->doc >= sub->files[out->file].n_docs)
        return tio_fail(TIO_EPARSE, "state span names document %llu of file %u of '%s', which "
                        "does not exist", (unsigned long long)out->doc, out->file, sub->name);
    return 0;
}

static int fill_sample(tio_gen *g, tio_gen_sample *s)
{
    s->fill = 0;
    for (uint32_t i = 0; i < s->n_spans; i++) {
        if (s->spans[i].length > g->S - s->fill)
            return tio_fail(TIO_EPARSE, "state sample spans exceed seq_len + 1 tokens");
        int rc = tio_gen_read_span(g, &s->spans[i], s->tokens + s->fill);
        if (rc)
            return rc;
        s->fill += s->spans[i].length;
    }
    return 0;
}

/* Spans of one old sample: a complete sample into the shuffle buffer, a
 * partial one into the partial slot if free, anything else into pending. */
static int take_sample(tio_gen *g, const st_parsed *p, const st_spans *ss, bool complete,
                       bool *partial_taken)
{
    tio_gen_sample s = {0};
    bool all = true;
    int rc = 0;
    for (uint32_t i = 0; !rc && i < ss->n; i++) {
        tio_data_span sp;
        bool keep;
        if ((rc = map_span(g, p, ss->spans + (size_t)i * SPAN_BYTES, &sp, &keep)) == 0) {
            if (keep)
                rc = tio_gen_sample_push(&s, &sp);
            else
                all = false;
        }
    }
    if (!rc && !(s.tokens = malloc((size_t)g->S * sizeof *s.tokens)))
        rc = tio_fail(-ENOMEM, "out of memory");
    if (rc) {
        tio_gen_sample_free(&s);
        return rc;
    }
    if (!all && s.n_spans)
        tio_log(TIO_LOG_WARN, "loader state: a sample lost the spans of a removed sub-dataset");
    if (all && complete && s.n_spans) {
        if ((rc = fill_sample(g, &s)) == 0 && s.fill != g->S)
            rc = tio_fail(TIO_EPARSE, "state buffered sample holds %u tokens, expected %u",
                          s.fill, g->S);
        if (!rc) {
            uint32_t old = g->cap_buf;
            rc = tio_grow((void **)&g->buf, &g->cap_buf, g->n_buf + 1, sizeof *g->buf);
            if (!rc) {
                memset(g->buf + old, 0, (g->cap_buf - old) * sizeof *g->buf);
                tio_gen_sample_free(&g->buf[g->n_buf]);
                g->buf[g->n_buf++] = s;
                return 0;
            }
        }
    } else if (all && !complete && !*partial_taken) {
        *partial_taken = true;
        if ((rc = fill_sample(g, &s)) == 0) {
            tio_gen_sample_free(&g->partial);
            g->partial = s;
            return 0;
        }
    } else {
        for (uint32_t i = 0; !rc && i < s.n_spans; i++)
            rc = tio_gen_pending_push(g, &s.spans[i]);
    }
    tio_gen_sample_free(&s);
    return rc;
}

static int load_parsed(tio_gen *g, st_parsed *ps, uint32_t n)
{
    const tio_loader_options *o = &g->opts;
    uint32_t N = ps[0].world;
    bool own = n == 1 && N == o->world_size && ps[0].rank == o->rank;
    if (!own) {
        if (n != N)
            return tio_fail(TIO_ESTATE, "%u state(s) given (rank %u of a run of %u ranks) for "
                            "loader rank %u of %u: pass this rank's own state, or the states of "
                            "all %u old ranks", n, ps[0].rank, N, o->rank, o->world_size, N);
        for (uint32_t i = 0; i < n; i++)
            for (uint32_t k = 0; k < i; k++)
                if (ps[i].rank == ps[k].rank)
                    return tio_fail(TIO_ESTATE, "the state of rank %u is given twice", ps[i].rank);
    }
    /* match sub-datasets by name */
    uint32_t matched = 0, saved_subs = 0;
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t s = 0; s < ps[i].n_subs; s++) {
            st_sub *ss = &ps[i].subs[s];
            ss->match = -1;
            for (uint32_t d = 0; d < g->ds->n_subs; d++) {
                const tio_data_sub *sub = &g->ds->subs[d];
                if (strlen(sub->name) == ss->name_len && !memcmp(sub->name, ss->name, ss->name_len)) {
                    if (sub->fingerprint != ss->fingerprint)
                        return tio_fail(TIO_ESTATE, "sub-dataset '%s' changed since the state was "
                                        "saved (files or document counts differ: fingerprint "
                                        "mismatch)", sub->name);
                    ss->match = (int)d;
                    matched += i == 0;
                }
            }
            if (ss->match < 0 && i == 0)
                tio_log(TIO_LOG_WARN, "loader state: sub-dataset '%.*s' is gone; dropped",
                        (int)ss->name_len, ss->name);
            saved_subs += i == 0;
        }
    if (saved_subs && !matched)
        return tio_fail(TIO_ESTATE, "the loader state belongs to another dataset (none of its "
                        "%u sub-datasets is here)", saved_subs);
    /* shard positions */
    for (uint32_t d = 0; d < g->ds->n_subs; d++) {
        tio_gen_sub *gs = &g->subs[d];
        bool present = false;
        uint64_t tokens = 0, own_tokens = 0, found = 0;
        for (uint32_t i = 0; i < n; i++)
            for (uint32_t s = 0; s < ps[i].n_subs; s++) {
                const st_sub *ss = &ps[i].subs[s];
                if (ss->match != (int)d)
                    continue;
                present = true;
                tokens += ss->tokens;
                if (ps[i].rank == o->rank)
                    own_tokens = ss->tokens;
                for (uint32_t k = 0; k < ss->n_shards; k++) {
                    const uint8_t *e = ss->shards + (size_t)k * SHARD_BYTES;
                    uint32_t shard;
                    memcpy(&shard, e, 4);
                    if (shard % o->world_size != o->rank)
                        continue;
                    tio_shard_pos *pos = &gs->pos[shard / o->world_size];
                    memcpy(&pos->epoch, e + 4, 4);
                    memcpy(&pos->r, e + 8, 8);
                    memcpy(&pos->j, e + 16, 8);
                    memcpy(&pos->consumed, e + 24, 8);
                    const tio_shard_def *def = &gs->shards[shard];
                    if (pos->consumed > def->n_docs || pos->r > def->n_ranges)
                        return tio_fail(TIO_EPARSE, "loader state: shard %u of '%s' is past its "
                                        "end", shard, g->ds->subs[d].name);
                    found++;
                }
            }
        if (present && found != gs->n_owned)
            return tio_fail(TIO_ESTATE, "the states hold %llu of this rank's %u shards of '%s': "
                            "pass the states of all old ranks", (unsigned long long)found,
                            gs->n_owned, g->ds->subs[d].name);
        /* same world size: each rank keeps its own counter; else split the sum */
        gs->tokens = N == o->world_size ? own_tokens
                   : tokens / o->world_size + (o->rank < tokens % o->world_size ? 1 : 0);
    }
    /* mixing: re-base the counters when the weights or the set changed */
    bool changed = false;
    for (uint32_t d = 0; d < g->ds->n_subs; d++) {
        bool seen = false;
        for (uint32_t s = 0; s < ps[0].n_subs; s++)
            if (ps[0].subs[s].match == (int)d) {
                seen = true;
                changed |= fabs(ps[0].subs[s].weight - g->subs[d].weight) > 1e-12;
            }
        changed |= !seen;
    }
    changed |= matched != saved_subs;
    if (changed) {
        uint64_t total = 0;
        for (uint32_t d = 0; d < g->ds->n_subs; d++)
            total += g->subs[d].tokens;
        for (uint32_t d = 0; d < g->ds->n_subs; d++)
            g->subs[d].tokens = (uint64_t)llround(g->subs[d].weight * (double)total);
        tio_log(TIO_LOG_INFO, "loader state: weights or sub-datasets changed; mixing follows the "
                "new weights from here");
    }
    /* spans: old rank i's go to new rank i % M, in rank order */
    bool partial_taken = false;
    for (uint32_t r = 0; r < N; r++) {
        if (r % o->world_size != o->rank)
            continue;
        for (uint32_t i = 0; i < n; i++) {
            st_parsed *p = &ps[i];
            if (p->rank != r)
                continue;
            int rc = take_sample(g, p, &p->partial, false, &partial_taken);
            for (uint32_t k = 0; !rc && k < p->pending.n; k++) {
                tio_data_span sp;
                bool keep;
                rc = map_span(g, p, p->pending.spans + (size_t)k * SPAN_BYTES, &sp, &keep);
                if (!rc && keep)
                    rc = tio_gen_pending_push(g, &sp);
            }
            for (uint32_t b = 0; !rc && b < p->n_buf; b++)
                rc = take_sample(g, p, &p->buf[b], true, &partial_taken);
            if (rc)
                return rc;
            if (r == o->rank)
                g->produced = p->produced;
        }
    }
    return 0;
}

int tio_loader_state_info(const void *buf, size_t len, tio_data_state_info *info)
{
    memset(info, 0, sizeof *info);
    st_parsed p;
    int rc = parse(buf, len, "loader state", &p);
    if (rc)
        return rc;
    *info = (tio_data_state_info){STATE_VERSION, p.fingerprint, p.rank, p.world, p.L, p.seq_len,
                                    p.shuffle, p.produced, p.n_subs};
    parsed_free(&p);
    return 0;
}

/* Settings first, before anything is allocated for them: a state of other
 * settings, or one claiming a huge logical-shard count, goes no further.
 * Only the header is read, by the parser's own parse_header. */
int tio_state_precheck(const tio_dataset *ds, const tio_loader_options *o,
                       const void *const *states, const size_t *lens, uint32_t n)
{
    uint64_t fp = tio_gen_fingerprint(ds, o);
    uint32_t N = 0;
    for (uint32_t i = 0; i < n; i++) {
        st_parsed h;
        rcur c;
        char name[32];
        snprintf(name, sizeof name, "loader state %u", i);
        int rc = parse_header(states[i], lens[i], name, &h, &c);
        if (rc)
            return rc;
        if (h.fingerprint != fp || h.L != o->logical_shards || h.seq_len != o->seq_len)
            return tio_fail(TIO_ESTATE, "loader state %u was saved with other settings (seed, "
                            "logical_shards, seq_len, EOS/BOS, tokenizer or text field differ: "
                            "fingerprint mismatch)", i);
        if (i && h.world != N)
            return tio_fail(TIO_ESTATE, "loader states of different runs (world sizes %u and %u)",
                            N, h.world);
        N = h.world;
    }
    return 0;
}

int tio_gen_load(tio_gen *g, const void *const *states, const size_t *lens, uint32_t n)
{
    st_parsed *ps = calloc(n, sizeof *ps);
    if (!ps)
        return tio_fail(-ENOMEM, "out of memory");
    int rc = 0;
    for (uint32_t i = 0; !rc && i < n; i++) {
        char name[32];
        snprintf(name, sizeof name, "loader state %u", i);
        rc = parse(states[i], lens[i], name, &ps[i]);
    }
    if (!rc)
        rc = load_parsed(g, ps, n);
    for (uint32_t d = 0; d < g->ds->n_subs; d++)
        g->subs[d].agg_valid = false; /* shard positions changed */
    for (uint32_t i = 0; i < n; i++)
        parsed_free(&ps[i]);
    free(ps);
    return rc;
}
