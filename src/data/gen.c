/*
 * data/gen.c — the generator: one rank's deterministic sample stream, as a
 * plain value (logical-shard plan, shard positions, mixing counters, spans
 * still to pack, partial sample, shuffle buffer).  Logical shards, shuffling
 * without a build step, mixing by token share, packing, and the shuffle
 * buffer after packing; the loader (loader.c) runs it in its threads.
 */
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "data/gen.h"

/* ---- logical shards ------------------------------------------------------- */

typedef unsigned __int128 u128;

/* Shard of document j of a file of n docs, size B, starting at F, in a
 * sub-dataset of size T cut into L shards. */
static uint32_t shard_of(uint64_t F, uint64_t B, uint64_t n, uint64_t j, uint64_t T, uint32_t L)
{
    u128 num = ((u128)F * n + (u128)j * B) * L;
    return (uint32_t)(num / ((u128)T * n));
}

static int plan_shards(tio_gen_sub *gs, const tio_data_sub *sub, uint32_t L)
{
    bool by_bytes = sub->bytes > 0;
    uint64_t T = by_bytes ? sub->bytes : sub->n_docs, F = 0;
    uint32_t cap = 0;
    gs->shards = calloc(L, sizeof *gs->shards);
    if (!gs->shards)
        return tio_fail(-ENOMEM, "out of memory");
    for (uint32_t f = 0; f < sub->n_files; f++) {
        const tio_data_file *file = &sub->files[f];
        uint64_t n = file->n_docs, B = by_bytes ? file->bytes : n;
        if (n == 0) {
            F += B;
            continue;
        }
        uint64_t j = 0;
        while (j < n) {
            uint32_t s = shard_of(F, B, n, j, T, L);
            /* last document of shard s: binary search on the monotone shard_of */
            uint64_t lo = j, hi = n - 1;
            while (lo < hi) {
                uint64_t mid = lo + (hi - lo + 1) / 2;
                if (shard_of(F, B, n, mid, T, L) == s)
                    lo = mid;
                else
                    hi = mid - 1;
            }
            int rc = tio_grow((void **)&gs->ranges, &cap, gs->n_ranges + 1, sizeof *gs->ranges);
            if (rc)
                return rc;
            gs->ranges[gs->n_ranges] = (tio_shard_range){f, j, lo + 1};
            tio_shard_def *d = &gs->shards[s];
            if (d->n_ranges == 0)
                d->first_range = gs->n_ranges;
            d->n_ranges++;
            d->n_docs += lo + 1 - j;
            gs->n_ranges++;
            j = lo + 1;
        }
        F += B;
    }
    return 0;
}

static uint64_t name_key(const char *name)
{
    uint64_t h = 0xCBF29CE484222325ull;
    for (const char *p = name; *p; p++)
        h = (h ^ (uint8_t)*p) * 0x100000001B3ull;
    return tio_mix64(h);
}

uint64_t tio_gen_fingerprint(const tio_dataset *ds, const tio_loader_options *o)
{
    uint64_t h = tio_mix64(0x7465726169ull);
    uint64_t vals[] = {o->logical_shards, o->seed, o->seq_len, o->eos_id, o->bos, o->bos_id,
                       (uint64_t)ds->opts.llmc_delimiter, (uint64_t)ds->opts.jsonl_errors};
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++)
        h = tio_mix64(h ^ vals[i]);
    h = tio_mix64(h ^ name_key(ds->opts.tokenizer->name ? ds->opts.tokenizer->name : ""));
    return tio_mix64(h ^ name_key(ds->text_field));
}

void tio_gen_sample_free(tio_gen_sample *s)
{
    free(s->tokens);
    free(s->spans);
    memset(s, 0, sizeof *s);
}

int tio_gen_sample_push(tio_gen_sample *s, const tio_data_span *sp)
{
    int rc = tio_grow((void **)&s->spans, &s->cap_spans, s->n_spans + 1, sizeof *s->spans);
    if (rc)
        return rc;
    s->spans[s->n_spans++] = *sp;
    return 0;
}

static int sample_alloc(tio_gen_sample *s, uint32_t S)
{
    if (!s->tokens && !(s->tokens = malloc((size_t)S * sizeof *s->tokens)))
        return tio_fail(-ENOMEM, "out of memory");
    return 0;
}

int tio_gen_pending_push(tio_gen *g, const tio_data_span *sp)
{
    if (g->pend_head > 0 && g->pend_head + g->n_pending == g->cap_pending) {
        memmove(g->pending, g->pending + g->pend_head, g->n_pending * sizeof *g->pending);
        g->pend_head = 0;
    }
    int rc = tio_grow((void **)&g->pending, &g->cap_pending, g->pend_head + g->n_pending + 1,
                      sizeof *g->pending);
    if (rc)
        return rc;
    g->pending[g->pend_head + g->n_pending++] = *sp;
    return 0;
}

int tio_gen_init(tio_gen *g, tio_dataset *ds, const tio_loader_options *opts)
{
    memset(g, 0, sizeof *g);
    g->ds = ds;
    g->opts = *opts;
    g->opts.weight_names = NULL;
    g->opts.weights = NULL;
    g->opts.n_weights = 0;
    g->S = opts->seq_len + 1;
    g->fingerprint = tio_gen_fingerprint(ds, opts);
    int rc = tio_data_reader_create(ds, &g->reader);
    if (rc)
        return rc;
    g->subs = calloc(ds->n_subs, sizeof *g->subs);
    if (!g->subs)
        return tio_fail(-ENOMEM, "out of memory");
    double total = 0;
    for (uint32_t d = 0; d < ds->n_subs; d++) {
        double w = 1.0;
        for (uint32_t k = 0; k < opts->n_weights; k++)
            if (!strcmp(opts->weight_names[k], ds->subs[d].name))
                w = opts->weights[k];
        g->subs[d].weight = w;
        total += w;
    }
    for (uint32_t d = 0; d < ds->n_subs; d++) {
        tio_gen_sub *gs = &g->subs[d];
        gs->weight /= total;
        gs->key = name_key(ds->subs[d].name);
        if ((rc = plan_shards(gs, &ds->subs[d], opts->logical_shards)) != 0)
            return rc;
        uint32_t L = opts->logical_shards;
        gs->n_owned = (L - opts->rank + opts->world_size - 1) / opts->world_size;
        gs->owned = calloc(gs->n_owned ? gs->n_owned : 1, sizeof *gs->owned);
        gs->pos = calloc(gs->n_owned ? gs->n_owned : 1, sizeof *gs->pos);
        gs->fenwick = calloc((size_t)gs->n_owned + 1, sizeof *gs->fenwick);
        if (!gs->owned || !gs->pos || !gs->fenwick)
            return tio_fail(-ENOMEM, "out of memory");
        for (uint32_t i = 0; i < gs->n_owned; i++) {
            gs->owned[i] = opts->rank + i * opts->world_size;
            gs->owned_docs += gs->shards[gs->owned[i]].n_docs;
        }
    }
    if (opts->shuffle_buffer) {
        g->buf = calloc(opts->shuffle_buffer, sizeof *g->buf);
        if (!g->buf)
            return tio_fail(-ENOMEM, "out of memory");
        g->cap_buf = opts->shuffle_buffer;
    }
    return 0;
}

void tio_gen_free(tio_gen *g)
{
    if (g->subs)
        for (uint32_t d = 0; d < g->ds->n_subs; d++) {
            free(g->subs[d].ranges);
            free(g->subs[d].shards);
            free(g->subs[d].owned);
            free(g->subs[d].pos);
            free(g->subs[d].fenwick);
        }
    free(g->subs);
    tio_data_reader_destroy(g->reader);
    free(g->pending);
    tio_gen_sample_free(&g->partial);
    for (uint32_t i = 0; i < g->cap_buf; i++)
        tio_gen_sample_free(&g->buf[i]);
    free(g->buf);
    memset(g, 0, sizeof *g);
}

/* ---- drawing documents ----------------------------------------------------- */

/* The next document of an owned shard, in its shuffled order. */
static void shard_next(const tio_gen *g, const tio_gen_sub *gs, uint32_t s, tio_shard_pos *p,
                       uint32_t *file, uint64_t *doc)
{
    const tio_shard_def *def = &gs->shards[s];
    uint64_t key = tio_mix64(g->opts.seed ^ gs->key ^ tio_mix64(((uint64_t)s << 32) | p->epoch));
    for (;;) {
        uint64_t ri = tio_permute(p->r, def->n_ranges, key);
        const tio_shard_range *rg = &gs->ranges[def->first_range + ri];
        uint64_t len = rg->hi - rg->lo;
        if (p->j >= len) {
            p->r++;
            p->j = 0;
            continue;
        }
        *file = rg->file;
        *doc = rg->lo + tio_permute(p->j, len, tio_mix64(key ^ (ri + 1)));
        p->j++;
        p->consumed++;
        if (p->j == len) {
            p->r++;
            p->j = 0;
        }
        return;
    }
}

/* Lowest epoch among owned non-empty shards (UINT32_MAX: none), with the
 * documents left in it and those consumed. */
static uint32_t sub_peek(const tio_gen_sub *gs, uint64_t *remaining, uint64_t *consumed)
{
    uint32_t e = UINT32_MAX;
    for (uint32_t i = 0; i < gs->n_owned; i++)
        if (gs->shards[gs->owned[i]].n_docs && gs->pos[i].epoch < e)
            e = gs->pos[i].epoch;
    uint64_t rem = 0, con = 0;
    for (uint32_t i = 0; i < gs->n_owned; i++)
        if (gs->shards[gs->owned[i]].n_docs && gs->pos[i].epoch == e) {
            rem += gs->shards[gs->owned[i]].n_docs - gs->pos[i].consumed;
            con += gs->pos[i].consumed;
        }
    *remaining = rem;
    *consumed = con;
    return e;
}

static uint64_t shard_left(const tio_gen_sub *gs, uint32_t i, uint32_t e)
{
    const tio_shard_def *def = &gs->shards[gs->owned[i]];
    return def->n_docs && gs->pos[i].epoch == e ? def->n_docs - gs->pos[i].consumed : 0;
}

/* Rebuild the aggregates from the shard positions (O(shards)). */
static void agg_build(tio_gen_sub *gs)
{
    gs->agg_epoch = sub_peek(gs, &gs->agg_remaining, &gs->agg_consumed);
    uint32_t n = gs->n_owned;
    for (uint32_t i = 1; i <= n; i++)
        gs->fenwick[i] = shard_left(gs, i - 1, gs->agg_epoch);
    for (uint32_t i = 1; i <= n; i++) {
        uint32_t up = i + (i & -i);
        if (up <= n)
            gs->fenwick[up] += gs->fenwick[i];
    }
    gs->agg_valid = true;
}

/* The owned shard holding draw u of the documents left (the first shard
 * whose running total of documents left exceeds u). */
static uint32_t agg_find(const tio_gen_sub *gs, uint64_t u)
{
    uint32_t at = 0, step = 1;
    while (step * 2 <= gs->n_owned)
        step *= 2;
    for (; step; step /= 2)
        if (at + step <= gs->n_owned && gs->fenwick[at + step] <= u) {
            at += step;
            u -= gs->fenwick[at];
        }
    return at;
}

static void agg_take(tio_gen_sub *gs, uint32_t i)
{
    for (uint32_t k = i + 1; k <= gs->n_owned; k += k & -k)
        gs->fenwick[k]--;
    gs->agg_remaining--;
    gs->agg_consumed++;
}

/* The lowest epoch with documents left, first moving the shards of a
 * finished epoch into the next one (UINT32_MAX: no document at all). */
static uint32_t sub_epoch(tio_gen_sub *gs, uint64_t *remaining, uint64_t *consumed)
{
    for (;;) {
        if (!gs->agg_valid)
            agg_build(gs);
        uint32_t e = gs->agg_epoch;
        *remaining = gs->agg_remaining;
        *consumed = gs->agg_consumed;
        if (*remaining || e == UINT32_MAX)
            return e;
        for (uint32_t i = 0; i < gs->n_owned; i++)
            if (gs->shards[gs->owned[i]].n_docs && gs->pos[i].epoch == e)
                gs->pos[i] = (tio_shard_pos){.epoch = e + 1};
        gs->agg_valid = false;
    }
}

/* The position a reader sees: a finished epoch reads as the next one. */
void tio_gen_position(const tio_gen_sub *gs, tio_data_position *p)
{
    uint64_t rem, con;
    uint32_t e = sub_peek(gs, &rem, &con);
    if (e == UINT32_MAX)
        e = 0;
    else if (rem == 0)
        e++, con = 0;
    p->epoch = e;
    p->docs_consumed = con;
    p->docs_total = gs->owned_docs;
    p->tokens_packed = gs->tokens;
}

/* Mixing: the sub-dataset furthest below its share of the tokens drawn. */
int tio_gen_pick_sub(const tio_gen *g)
{
    uint64_t total = 0;
    for (uint32_t d = 0; d < g->ds->n_subs; d++)
        if (g->subs[d].weight > 0 && g->subs[d].owned_docs)
            total += g->subs[d].tokens;
    int best = -1;
    double best_deficit = 0;
    for (uint32_t d = 0; d < g->ds->n_subs; d++) {
        const tio_gen_sub *gs = &g->subs[d];
        if (gs->weight <= 0 || !gs->owned_docs)
            continue;
        double deficit = gs->weight * (double)total - (double)gs->tokens;
        if (best < 0 || deficit > best_deficit) {
            best = (int)d;
            best_deficit = deficit;
        }
    }
    return best;
}

static int draw_doc(tio_gen *g)
{
    for (;;) {
        int d = tio_gen_pick_sub(g);
        if (d < 0)
            return tio_fail(-ENODATA, "rank %u owns no document of a sub-dataset with weight > 0",
                            g->opts.rank);
        tio_gen_sub *gs = &g->subs[d];
        uint64_t rem, con;
        uint32_t e = sub_epoch(gs, &rem, &con);
        uint64_t u = tio_mix64(g->opts.seed ^ gs->key ^ tio_mix64(((uint64_t)e << 40) ^ con)) % rem;
        uint32_t i = agg_find(gs, u);
        uint32_t file;
        uint64_t doc, len;
        shard_next(g, gs, gs->owned[i], &gs->pos[i], &file, &doc);
        agg_take(gs, i);
        int rc = tio_data_doc_len(g->reader, (uint32_t)d, file, doc, &len);
        if (rc)
            return rc;
        if (len == 0) { /* empty documents (or skipped bad lines) pack nothing */
            /* two epochs' worth in a row: every document this rank owns is
             * empty, and drawing would go on forever */
            if (++gs->empty_run > 2 * gs->owned_docs)
                return tio_fail(-ENODATA, "sub-dataset '%s': the %llu documents rank %u owns are "
                                "all empty", g->ds->subs[d].name,
                                (unsigned long long)gs->owned_docs, g->opts.rank);
            continue;
        }
        gs->empty_run = 0;
        uint64_t vlen = len + 1 + (g->opts.bos ? 1 : 0);
        if (vlen > UINT32_MAX)
            return tio_fail(-EOVERFLOW, "%s: document %llu has more than 2^32 tokens",
                            g->ds->subs[d].files[file].rel, (unsigned long long)doc);
        gs->tokens += vlen;
        tio_data_span sp = {(uint32_t)d, file, doc, 0, (uint32_t)vlen, e};
        return tio_gen_pending_push(g, &sp);
    }
}

/* Read a span's packed tokens through reader r. */
static int read_span(tio_data_reader *r, const tio_dataset *ds, const tio_loader_options *o,
                     const tio_data_span *sp, uint32_t *dst)
{
    uint64_t len;
    int rc = tio_data_doc_len(r, sp->subdataset, sp->file, sp->doc, &len);
    if (rc)
        return rc;
    uint32_t bos = o->bos ? 1 : 0;
    uint64_t vlen = len + 1 + bos, a = sp->offset, b = (uint64_t)sp->offset + sp->length;
    if (b > vlen)
        return tio_fail(TIO_ESTATE, "%s: document %llu has %llu packed tokens, the state names "
                        "[%llu, %llu)", ds->subs[sp->subdataset].files[sp->file].rel,
                        (unsigned long long)sp->doc, (unsigned long long)vlen,
                        (unsigned long long)a, (unsigned long long)b);
    if (bos && a == 0) {
        *dst++ = o->bos_id;
        a = 1;
    }
    uint64_t tb = b < vlen ? b : vlen - 1; /* end of the document's own tokens */
    if (tb > a) {
        if ((rc = tio_data_doc_read(r, sp->subdataset, sp->file, sp->doc, a - bos, tb - a, dst)) != 0)
            return rc;
        dst += tb - a;
    }
    if (b == vlen)
        *dst = o->eos_id;
    return 0;
}

int tio_gen_read_span(tio_gen *g, const tio_data_span *sp, uint32_t *dst)
{
    return read_span(g->reader, g->ds, &g->opts, sp, dst);
}

/* Fill the partial sample up to S tokens (its spans: the tokens are read
 * when the sample leaves the shuffle buffer). */
static int pack(tio_gen *g)
{
    tio_gen_sample *s = &g->partial;
    while (s->fill < g->S) {
        if (!g->n_pending) {
            int rc = draw_doc(g);
            if (rc)
                return rc;
        }
        tio_data_span *sp = &g->pending[g->pend_head];
        uint32_t n = g->S - s->fill < sp->length ? g->S - s->fill : sp->length;
        tio_data_span piece = *sp;
        piece.length = n;
        int rc = tio_gen_sample_push(s, &piece);
        if (rc)
            return rc;
        s->fill += n;
        sp->offset += n;
        sp->length -= n;
        if (!sp->length) {
            g->pend_head++;
            if (--g->n_pending == 0)
                g->pend_head = 0;
        }
    }
    return 0;
}

void tio_gen_sample_swap(tio_gen_sample *a, tio_gen_sample *b)
{
    tio_gen_sample t = *a;
    *a = *b;
    *b = t;
}

/* Swap what two samples hold (fill and spans), each keeping its token
 * array: only the samples that leave the generator carry tokens, so the
 * shuffle buffer is a few spans per sample and the token arrays written
 * stay few (and in cache). */
void tio_gen_sample_swap_spans(tio_gen_sample *a, tio_gen_sample *b)
{
    uint32_t *ta = a->tokens, *tb = b->tokens;
    tio_gen_sample_swap(a, b);
    a->tokens = ta;
    b->tokens = tb;
}

/* Read the tokens of a sample's spans through reader r. */
int tio_gen_sample_fill(tio_data_reader *r, const tio_dataset *ds, const tio_loader_options *o,
                       tio_gen_sample *s)
{
    int rc = sample_alloc(s, o->seq_len + 1);
    if (rc)
        return rc;
    uint32_t at = 0, bos = o->bos ? 1 : 0;
    /* the pieces' first cache lines load together while the copying starts */
    for (uint32_t i = 0; i < s->n_spans; i++) {
        const tio_data_span *sp = &s->spans[i];
        tio_data_doc_prefetch(r, sp->subdataset, sp->file, sp->doc,
                              sp->offset > bos ? sp->offset - bos : 0);
    }
    for (uint32_t i = 0; i < s->n_spans; i++) {
        if ((rc = read_span(r, ds, o, &s->spans[i], s->tokens + at)) != 0)
            return rc;
        at += s->spans[i].length;
    }
    return 0;
}

static void sample_reset(tio_gen_sample *s)
{
    s->fill = 0;
    s->n_spans = 0;
}

int tio_gen_next(tio_gen *g, tio_gen_sample *out)
{
    int rc;
    uint64_t pick = tio_mix64(g->opts.seed ^ 0x5348554646ull ^ tio_mix64(g->produced));
    for (;;) {
        if (g->n_buf > g->opts.shuffle_buffer) { /* after a rescale or a smaller buffer */
            uint32_t i = (uint32_t)(pick % g->n_buf);
            tio_gen_sample_swap_spans(out, &g->buf[i]);
            tio_gen_sample_swap_spans(&g->buf[i], &g->buf[g->n_buf - 1]);
            g->n_buf--;
            break;
        }
        if ((rc = pack(g)) != 0)
            return rc;
        if (g->opts.shuffle_buffer == 0) {
            tio_gen_sample_swap_spans(out, &g->partial);
            break;
        }
        if (g->n_buf < g->opts.shuffle_buffer) {
            if ((rc = tio_grow((void **)&g->buf, &g->cap_buf, g->n_buf + 1, sizeof *g->buf)) != 0)
                return rc;
            tio_gen_sample_swap_spans(&g->buf[g->n_buf++], &g->partial);
            sample_reset(&g->partial);
            continue;
        }
        uint32_t i = (uint32_t)(pick % g->n_buf);
        tio_gen_sample_swap_spans(out, &g->buf[i]);
        tio_gen_sample_swap_spans(&g->buf[i], &g->partial);
        break;
    }
    sample_reset(&g->partial);
    g->produced++;
    return g->skip_tokens ? 0 : tio_gen_sample_fill(g->reader, g->ds, &g->opts, out);
}

