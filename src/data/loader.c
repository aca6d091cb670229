/*
 * data/loader.c — the threaded loader around the generator (gen.c): the
 * prefetch queue, shared filling of queued samples, snapshots, and the state
 * after the last delivered sample.
 *
 * Why a generator value plus snapshots: the state to save is the one after
 * the last *delivered* sample, while the prefetch thread is ahead of it.
 * Because the stream is deterministic, the state after delivering sample k
 * is the state the producer had right after making sample k.  The producer
 * serializes its state every max(prefetch, 1024) samples; saving restores the newest
 * snapshot at or before the delivered count into a scratch generator and
 * replays the few samples in between.  Nothing in the queue is ever counted.
 */
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"
#include "data/gen.h"

void tio_loader_options_default(tio_loader_options *opts)
{
    memset(opts, 0, sizeof *opts);
    opts->seq_len = 2048;
    opts->world_size = 1;
    opts->logical_shards = 2048;
    opts->shuffle_buffer = 64;
    opts->prefetch = 8;
    /* on small machines more threads only compete with the producer and the
     * training loop for the same cores */
    opts->fill_threads = sysconf(_SC_NPROCESSORS_ONLN) >= 8 ? 2 : 0;
}

/* ---- the threaded loader --------------------------------------------------- */

enum { SNAP_MIN = 1024, SPIN_YIELDS = 64 };

typedef struct {
    uint64_t index;
    void *blob;
    size_t len;
} snapshot;

struct tio_loader {
    tio_dataset *ds;
    tio_loader_options opts;
    tio_gen gen;
    /* queue */
    pthread_t thread;
    bool running, stop;
    bool producer_waiting, consumer_waiting; /* under lock: who sleeps on cond */
    /* The generator is run by whoever holds gen_lock: the producer thread,
     * or the consumer when the queue is empty and no sample is in flight
     * (producer_holding: the producer made a sample it has not queued yet),
     * so a consumer faster than the producer makes samples itself instead
     * of waiting for a hand-off; either way samples come in order. */
    pthread_mutex_t gen_lock;
    bool producer_holding;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    tio_gen_sample *slots;
    uint32_t n_slots, head, count;
    /* Filling (reading a queued sample's tokens) is shared: slots [head,
     * head + n_claimed) are being or have been filled; filled[i] says slot
     * i's tokens are in.  The producer plans samples (spans only) and fills
     * queued ones while two or more wait or the queue is full; the
     * consumer, while the sample it wants is not ready, fills the next
     * unclaimed one; fill threads, when there are any, take the rest.  So
     * on two cores the consumer's idle time goes into reading tokens
     * instead of waiting.  Each filler has its own reader
     * (consumer_reader for the consumer). */
    bool shared_fill;
    pthread_t *fillers;
    uint32_t n_fillers, n_claimed, fillers_waiting;
    bool *filled;
    tio_data_reader *consumer_reader;
    int error;
    char error_msg[1024];
    snapshot *snaps;
    uint32_t n_snaps, cap_snaps;
    uint64_t snap_every;
    /* delivery */
    uint64_t delivered;
    tio_gen_sample cur;
    uint32_t *pos_ids, *cu;
    tio_data_sample sample;
    /* copies of the weight arrays (opts points at them) */
    char **weight_names;
    double *weights;
};

static int add_snapshot(tio_loader *ld)
{
    snapshot s = {ld->gen.produced, NULL, 0};
    int rc = tio_gen_serialize(&ld->gen, &s.blob, &s.len);
    if (rc)
        return rc;
    pthread_mutex_lock(&ld->lock);
    rc = tio_grow((void **)&ld->snaps, &ld->cap_snaps, ld->n_snaps + 1, sizeof *ld->snaps);
    if (!rc)
        ld->snaps[ld->n_snaps++] = s;
    pthread_mutex_unlock(&ld->lock);
    if (rc)
        free(s.blob);
    return rc;
}

static void loader_error(tio_loader *ld, int rc)
{
    if (!ld->error) {
        ld->error = rc;
        snprintf(ld->error_msg, sizeof ld->error_msg, "%s", tio_last_error());
    }
    pthread_cond_broadcast(&ld->cond);
}

/* Under ld->lock: claim the next slot that nobody fills yet; false when
 * every queued slot is claimed. */
static bool claim(tio_loader *ld, uint32_t *slot)
{
    if (!ld->shared_fill || ld->n_claimed >= ld->count)
        return false;
    *slot = (ld->head + ld->n_claimed) % ld->n_slots;
    __atomic_store_n(&ld->n_claimed, ld->n_claimed + 1, __ATOMIC_RELAXED);
    return true;
}

/* Under ld->lock, which it drops while reading: fill the claimed slot
 * through reader r and mark it filled.  Returns the error, also left in
 * ld->error. */
static int fill_claimed(tio_loader *ld, tio_data_reader *r, uint32_t slot)
{
    pthread_mutex_unlock(&ld->lock);
    int rc = tio_gen_sample_fill(r, ld->ds, &ld->opts, &ld->slots[slot]);
    pthread_mutex_lock(&ld->lock);
    if (rc) {
        loader_error(ld, rc);
        return rc;
    }
    __atomic_store_n(&ld->filled[slot], true, __ATOMIC_RELEASE);
    if (ld->consumer_waiting)
        pthread_cond_broadcast(&ld->cond);
    return 0;
}

/* A fill thread: read the tokens of the oldest planned sample, in its own
 * reader, while the producer plans the next ones. */
static void *filler(void *arg)
{
    tio_loader *ld = arg;
    tio_data_reader *r = NULL;
    int rc = tio_data_reader_create(ld->ds, &r);
    pthread_mutex_lock(&ld->lock);
    if (rc)
        loader_error(ld, rc);
    while (!rc) {
        if (ld->n_claimed == ld->count) { /* yield a while before sleeping */
            pthread_mutex_unlock(&ld->lock);
            for (int spin = 0; spin < SPIN_YIELDS; spin++) {
                sched_yield();
                pthread_mutex_lock(&ld->lock);
                bool work = ld->n_claimed < ld->count || ld->stop || ld->error;
                pthread_mutex_unlock(&ld->lock);
                if (work)
                    break;
            }
            pthread_mutex_lock(&ld->lock);
        }
        ld->fillers_waiting++;
        while (ld->n_claimed == ld->count && !ld->stop && !ld->error)
            pthread_cond_wait(&ld->cond, &ld->lock);
        ld->fillers_waiting--;
        if (ld->stop || ld->error)
            break;
        uint32_t i;
        if (claim(ld, &i) && (rc = fill_claimed(ld, r, i)) != 0)
            break;
    }
    pthread_mutex_unlock(&ld->lock);
    tio_data_reader_destroy(r);
    return NULL;
}

static void *producer(void *arg)
{
    tio_loader *ld = arg;
    tio_gen_sample local = {0};
    tio_data_reader *r = NULL;
    if (ld->shared_fill && !ld->n_fillers) {
        int rc = tio_data_reader_create(ld->ds, &r);
        if (rc) {
            pthread_mutex_lock(&ld->lock);
            loader_error(ld, rc);
            pthread_mutex_unlock(&ld->lock);
            return NULL;
        }
    }
    for (;;) {
        pthread_mutex_lock(&ld->gen_lock);
        pthread_mutex_lock(&ld->lock);
        bool quit = ld->stop || ld->error;
        pthread_mutex_unlock(&ld->lock);
        if (quit) {
            pthread_mutex_unlock(&ld->gen_lock);
            break;
        }
        int rc = tio_gen_next(&ld->gen, &local);
        if (!rc && ld->gen.produced % ld->snap_every == 0)
            rc = add_snapshot(ld);
        pthread_mutex_lock(&ld->lock);
        if (rc) {
            loader_error(ld, rc);
            pthread_mutex_unlock(&ld->lock);
            pthread_mutex_unlock(&ld->gen_lock);
            break;
        }
        ld->producer_holding = true;
        pthread_mutex_unlock(&ld->gen_lock);
        if (ld->count == ld->n_slots) {
            /* the queue is full: yield a while (a fast consumer takes a
             * sample within microseconds), then sleep until it has room */
            pthread_mutex_unlock(&ld->lock);
            for (int spin = 0; spin < SPIN_YIELDS &&
                 __atomic_load_n(&ld->count, __ATOMIC_ACQUIRE) == ld->n_slots; spin++)
                sched_yield();
            pthread_mutex_lock(&ld->lock);
            ld->producer_waiting = true;
            while (ld->count == ld->n_slots && !ld->stop)
                pthread_cond_wait(&ld->cond, &ld->lock);
            ld->producer_waiting = false;
        }
        if (ld->stop) {
            pthread_mutex_unlock(&ld->lock);
            break;
        }
        ld->producer_holding = false;
        uint32_t tail = (ld->head + ld->count) % ld->n_slots;
        if (ld->shared_fill) /* spans only: the slot's tokens are read by a filler */
            tio_gen_sample_swap_spans(&ld->slots[tail], &local);
        else
            tio_gen_sample_swap(&ld->slots[tail], &local);
        __atomic_store_n(&ld->filled[tail], !ld->shared_fill, __ATOMIC_RELEASE);
        __atomic_store_n(&ld->count, ld->count + 1, __ATOMIC_RELEASE);
        if (ld->consumer_waiting || ld->fillers_waiting)
            pthread_cond_broadcast(&ld->cond);
        /* Fill while two queued samples wait for it (the first is left to
         * a consumer that comes for it meanwhile) or the queue is full
         * (planning cannot go on). */
        uint32_t slot;
        bool failed = false;
        while (r && !failed && ld->count > ld->n_claimed &&
               (ld->count - ld->n_claimed >= 2 || ld->count == ld->n_slots) && !ld->stop &&
               claim(ld, &slot))
            failed = fill_claimed(ld, r, slot) != 0;
        pthread_mutex_unlock(&ld->lock);
        if (failed)
            break;
    }
    tio_gen_sample_free(&local);
    tio_data_reader_destroy(r);
    return NULL;
}

static int validate(const tio_dataset *ds, const tio_loader_options *o)
{
    if (o->seq_len == 0 || o->seq_len >= UINT32_MAX - 1)
        return tio_fail(-EINVAL, "seq_len must be in [1, 2^32 - 2)");
    if (o->world_size == 0 || o->rank >= o->world_size)
        return tio_fail(-EINVAL, "rank %u must be below world_size %u", o->rank, o->world_size);
    if (o->logical_shards < o->world_size || o->logical_shards > TIO_LOADER_MAX_LOGICAL_SHARDS)
        return tio_fail(-EINVAL, "logical_shards (%u) must be >= world_size (%u) and at most %u",
                        o->logical_shards, o->world_size, TIO_LOADER_MAX_LOGICAL_SHARDS);
    if (o->prefetch > TIO_LOADER_MAX_PREFETCH)
        return tio_fail(-EINVAL, "prefetch (%u samples) must be at most %u", o->prefetch,
                        TIO_LOADER_MAX_PREFETCH);
    if (o->shuffle_buffer > TIO_LOADER_MAX_SHUFFLE_BUFFER)
        return tio_fail(-EINVAL, "shuffle_buffer (%u samples) must be at most %u",
                        o->shuffle_buffer, TIO_LOADER_MAX_SHUFFLE_BUFFER);
    if (o->fill_threads > TIO_LOADER_MAX_FILL_THREADS)
        return tio_fail(-EINVAL, "fill_threads (%u) must be at most %u", o->fill_threads,
                        TIO_LOADER_MAX_FILL_THREADS);
    if (o->n_weights && (!o->weights || !o->weight_names))
        return tio_fail(-EINVAL, "n_weights is %u but weights or weight_names is NULL",
                        o->n_weights);
    double total = 0;
    for (uint32_t k = 0; k < o->n_weights; k++) {
        if (!o->weight_names[k])
            return tio_fail(-EINVAL, "weight name %u is NULL", k);
        if (!(o->weights[k] >= 0 && o->weights[k] <= TIO_LOADER_MAX_WEIGHT))
            return tio_fail(-EINVAL, "weight of '%s' is %g: it must be a number from 0 to %g",
                            o->weight_names[k], o->weights[k], TIO_LOADER_MAX_WEIGHT);
        bool found = false;
        for (uint32_t d = 0; d < ds->n_subs; d++)
            found |= !strcmp(ds->subs[d].name, o->weight_names[k]);
        if (!found)
            return tio_fail(-EINVAL, "weight for unknown sub-dataset '%s'", o->weight_names[k]);
    }
    for (uint32_t d = 0; d < ds->n_subs; d++) {
        double w = 1.0;
        for (uint32_t k = 0; k < o->n_weights; k++)
            if (!strcmp(o->weight_names[k], ds->subs[d].name))
                w = o->weights[k];
        total += w;
    }
    if (!(total > 0))
        return tio_fail(-EINVAL, "all sub-dataset weights are 0");
    return 0;
}

/* Whether a file is decoded by windows (JSONL, Parquet) into a reader's
 * cache rather than read in place. */
static bool has_windowed(const tio_dataset *ds)
{
    for (uint32_t d = 0; d < ds->n_subs; d++)
        for (uint32_t f = 0; f < ds->subs[d].n_files; f++)
            if (tio_data_format_of(ds->subs[d].files[f].format)->window_load)
                return true;
    return false;
}

void tio_loader_destroy(tio_loader *ld)
{
    if (!ld)
        return;
    if (ld->running) {
        pthread_mutex_lock(&ld->lock);
        ld->stop = true;
        pthread_cond_broadcast(&ld->cond);
        pthread_mutex_unlock(&ld->lock);
        pthread_join(ld->thread, NULL);
        for (uint32_t i = 0; i < ld->n_fillers; i++)
            pthread_join(ld->fillers[i], NULL);
    }
    free(ld->fillers);
    free(ld->filled);
    tio_data_reader_destroy(ld->consumer_reader);
    tio_gen_free(&ld->gen);
    for (uint32_t i = 0; i < ld->n_slots; i++)
        tio_gen_sample_free(&ld->slots[i]);
    free(ld->slots);
    for (uint32_t i = 0; i < ld->n_snaps; i++)
        free(ld->snaps[i].blob);
    free(ld->snaps);
    tio_gen_sample_free(&ld->cur);
    free(ld->pos_ids);
    free(ld->cu);
    for (uint32_t k = 0; ld->weight_names && k < ld->opts.n_weights; k++)
        free(ld->weight_names[k]);
    free(ld->weight_names);
    free(ld->weights);
    pthread_mutex_destroy(&ld->lock);
    pthread_mutex_destroy(&ld->gen_lock);
    pthread_cond_destroy(&ld->cond);
    free(ld);
}

static void log_position(tio_loader *ld, bool resumed)
{
    for (uint32_t d = 0; d < ld->ds->n_subs; d++) {
        tio_data_position p;
        tio_gen_position(&ld->gen.subs[d], &p);
        tio_log(TIO_LOG_INFO, "data loader rank %u/%u %s '%s': epoch %u, %llu of %llu documents "
                "consumed, %llu tokens packed, sample %llu", ld->opts.rank, ld->opts.world_size,
                resumed ? "resumed" : "starts", ld->ds->subs[d].name, p.epoch,
                (unsigned long long)p.docs_consumed, (unsigned long long)p.docs_total,
                (unsigned long long)p.tokens_packed, (unsigned long long)ld->gen.produced);
    }
}

int tio_loader_create(tio_dataset *ds, const tio_loader_options *opts,
                      const void *const *states, const size_t *lens, uint32_t n_states,
                      tio_loader **out)
{
    *out = NULL;
    if (!ds || !opts)
        return tio_fail(-EINVAL, "tio_loader_create: no dataset or no options");
    if (n_states && (!states || !lens))
        return tio_fail(-EINVAL, "tio_loader_create: %u states but no state array", n_states);
    int rc = validate(ds, opts);
    if (!rc && n_states)
        rc = tio_state_precheck(ds, opts, states, lens, n_states);
    if (rc)
        return rc;
    tio_loader *ld = calloc(1, sizeof *ld);
    if (!ld)
        return tio_fail(-ENOMEM, "out of memory");
    pthread_mutex_init(&ld->lock, NULL);
    pthread_mutex_init(&ld->gen_lock, NULL);
    pthread_cond_init(&ld->cond, NULL);
    ld->ds = ds;
    ld->opts = *opts;
    ld->weight_names = calloc(opts->n_weights + 1, sizeof *ld->weight_names);
    ld->weights = calloc(opts->n_weights + 1, sizeof *ld->weights);
    bool oom = !ld->weight_names || !ld->weights;
    for (uint32_t k = 0; !oom && k < opts->n_weights; k++) {
        ld->weights[k] = opts->weights[k];
        oom = !(ld->weight_names[k] = strdup(opts->weight_names[k]));
    }
    ld->opts.weight_names = (const char *const *)ld->weight_names;
    ld->opts.weights = ld->weights;
    if (oom) {
        tio_loader_destroy(ld);
        return tio_fail(-ENOMEM, "out of memory");
    }
    if ((rc = tio_gen_init(&ld->gen, ds, opts)) != 0 ||
        (n_states && (rc = tio_gen_load(&ld->gen, states, lens, n_states)) != 0)) {
        tio_loader_destroy(ld);
        return rc;
    }
    ld->delivered = ld->gen.produced;
    ld->pos_ids = malloc((size_t)opts->seq_len * sizeof *ld->pos_ids);
    ld->cu = malloc(((size_t)opts->seq_len + 1) * sizeof *ld->cu);
    if (!ld->pos_ids || !ld->cu) {
        tio_loader_destroy(ld);
        return tio_fail(-ENOMEM, "out of memory");
    }
    if (tio_gen_pick_sub(&ld->gen) < 0) {
        tio_loader_destroy(ld);
        return tio_fail(-ENODATA, "rank %u of %u owns no document (logical_shards %u): use fewer "
                        "ranks or smaller logical shards", opts->rank, opts->world_size,
                        opts->logical_shards);
    }
    log_position(ld, n_states > 0);
    if (opts->prefetch) {
        /* a snapshot costs a serialization of every owned shard's position:
         * take one per SNAP_MIN samples at least (a save replays fewer than
         * snap_every + prefetch samples) */
        ld->snap_every = opts->prefetch > SNAP_MIN ? opts->prefetch : SNAP_MIN;
        ld->slots = calloc(opts->prefetch, sizeof *ld->slots);
        ld->filled = calloc(opts->prefetch, sizeof *ld->filled);
        if (ld->slots)
            ld->n_slots = opts->prefetch; /* destroy frees what exists */
        /* decoded windows (JSONL, Parquet) exist only in the producer's
         * reader, which decoded them: the producer fills those samples */
        ld->shared_fill = !has_windowed(ds);
        uint32_t want = ld->shared_fill ? opts->fill_threads : 0;
        ld->fillers = calloc(want ? want : 1, sizeof *ld->fillers);
        if (!ld->slots || !ld->filled || !ld->fillers || (rc = add_snapshot(ld)) != 0 ||
            (ld->shared_fill && (rc = tio_data_reader_create(ds, &ld->consumer_reader)) != 0)) {
            tio_loader_destroy(ld);
            return rc ? rc : tio_fail(-ENOMEM, "out of memory");
        }
        /* with shared filling the producer only plans samples (spans) */
        ld->gen.skip_tokens = ld->shared_fill;
        ld->n_fillers = want;
        if ((rc = pthread_create(&ld->thread, NULL, producer, ld)) != 0) {
            ld->n_fillers = 0;
            tio_loader_destroy(ld);
            return tio_fail(-rc, "cannot start the loader thread: %s", strerror(rc));
        }
        ld->running = true;
        for (uint32_t i = 0; i < want; i++)
            if ((rc = pthread_create(&ld->fillers[i], NULL, filler, ld)) != 0) {
                ld->n_fillers = i;
                if (i == 0) /* the producer plans without fillers: nothing fills */
                    ld->error = -rc;
                tio_loader_destroy(ld);
                return tio_fail(-rc, "cannot start a loader fill thread: %s", strerror(rc));
            }
    }
    *out = ld;
    return 0;
}

/* Segments, position ids and the public view of the current sample. */
static void describe(tio_loader *ld)
{
    tio_gen_sample *s = &ld->cur;
    uint32_t L = ld->opts.seq_len, at = 0, nseg = 0;
    ld->cu[0] = 0;
    for (uint32_t i = 0; i < s->n_spans && at < L; i++) {
        uint32_t n = s->spans[i].length;
        if (n > L - at)
            n = L - at;
        uint32_t *restrict pos = ld->pos_ids + at;
        for (uint32_t k = 0; k < n; k++)
            pos[k] = k;
        at += n;
        ld->cu[++nseg] = at;
    }
    ld->sample = (tio_data_sample){.index = ld->delivered, .seq_len = L, .tokens = s->tokens,
                                   .position_ids = ld->pos_ids, .n_segments = nseg,
                                   .cu_seqlens = ld->cu, .n_spans = s->n_spans, .spans = s->spans};
}

/* Drop the snapshots that a save can no longer need (under lock). */
static void drop_snapshots(tio_loader *ld)
{
    uint32_t keep = 0;
    while (keep + 1 < ld->n_snaps && ld->snaps[keep + 1].index <= ld->delivered + 1)
        keep++;
    for (uint32_t i = 0; i < keep; i++)
        free(ld->snaps[i].blob);
    memmove(ld->snaps, ld->snaps + keep, (ld->n_snaps - keep) * sizeof *ld->snaps);
    ld->n_snaps -= keep;
}

/* When the queue is empty and nothing is in flight, make the next sample
 * in this thread (into ld->cur).  Returns whether it did; a failure is left
 * in ld->error. */
static bool steal(tio_loader *ld)
{
    if (__atomic_load_n(&ld->count, __ATOMIC_ACQUIRE) || pthread_mutex_trylock(&ld->gen_lock))
        return false;
    pthread_mutex_lock(&ld->lock);
    bool mine = ld->count == 0 && !ld->producer_holding && !ld->error && !ld->stop;
    pthread_mutex_unlock(&ld->lock);
    if (!mine) {
        pthread_mutex_unlock(&ld->gen_lock);
        return false;
    }
    int rc = tio_gen_next(&ld->gen, &ld->cur);
    if (!rc && ld->gen.skip_tokens)
        rc = tio_gen_sample_fill(ld->gen.reader, ld->ds, &ld->opts, &ld->cur);
    if (!rc && ld->gen.produced % ld->snap_every == 0)
        rc = add_snapshot(ld);
    pthread_mutex_lock(&ld->lock);
    if (rc)
        loader_error(ld, rc);
    else
        drop_snapshots(ld);
    pthread_mutex_unlock(&ld->lock);
    pthread_mutex_unlock(&ld->gen_lock);
    return true;
}

int tio_loader_next(tio_loader *ld, const tio_data_sample **out)
{
    *out = NULL;
    if (!ld->running) {
        int rc = tio_gen_next(&ld->gen, &ld->cur);
        if (rc)
            return rc;
    } else if (steal(ld)) {
        if (ld->error) {
            int rc = ld->error;
            tio_fail(rc, "%s", ld->error_msg);
            return rc;
        }
    } else {
        pthread_mutex_lock(&ld->lock);
        int spin = 0;
        uint32_t slot;
        while (!(ld->count && ld->filled[ld->head]) && !ld->error) {
            if (claim(ld, &slot)) { /* read a queued sample's tokens meanwhile */
                fill_claimed(ld, ld->consumer_reader, slot);
                continue;
            }
            if (spin < SPIN_YIELDS) {
                /* a sample is usually a few microseconds away: yield a
                 * while before sleeping on the condition variable */
                pthread_mutex_unlock(&ld->lock);
                for (; spin < SPIN_YIELDS &&
                       !__atomic_load_n(&ld->filled[__atomic_load_n(&ld->head, __ATOMIC_RELAXED)],
                                        __ATOMIC_ACQUIRE) &&
                       !(ld->shared_fill && __atomic_load_n(&ld->n_claimed, __ATOMIC_RELAXED) <
                                                __atomic_load_n(&ld->count, __ATOMIC_RELAXED));
                     spin++)
                    sched_yield();
                spin++;
                pthread_mutex_lock(&ld->lock);
                continue;
            }
            ld->consumer_waiting = true;
            pthread_cond_wait(&ld->cond, &ld->lock);
            ld->consumer_waiting = false;
        }
        if (!(ld->count && ld->filled[ld->head])) {
            int rc = ld->error;
            tio_fail(rc, "%s", ld->error_msg);
            pthread_mutex_unlock(&ld->lock);
            return rc;
        }
        tio_gen_sample_swap(&ld->cur, &ld->slots[ld->head]);
        __atomic_store_n(&ld->filled[ld->head], false, __ATOMIC_RELAXED);
        if (ld->shared_fill)
            __atomic_store_n(&ld->n_claimed, ld->n_claimed - 1, __ATOMIC_RELAXED);
        __atomic_store_n(&ld->head, (ld->head + 1) % ld->n_slots, __ATOMIC_RELAXED);
        __atomic_store_n(&ld->count, ld->count - 1, __ATOMIC_RELEASE);
        drop_snapshots(ld);
        if (ld->producer_waiting)
            pthread_cond_broadcast(&ld->cond);
        pthread_mutex_unlock(&ld->lock);
    }
    describe(ld);
    ld->delivered++;
    *out = &ld->sample;
    return 0;
}

uint32_t tio_loader_queued(tio_loader *ld)
{
    pthread_mutex_lock(&ld->lock);
    uint32_t n = ld->count;
    pthread_mutex_unlock(&ld->lock);
    return n;
}

/* A generator at the delivered position (caller frees with tio_gen_free). */
static int delivered_gen(tio_loader *ld, tio_gen *g)
{
    void *blob = NULL;
    size_t len = 0;
    uint64_t index = 0;
    int rc = 0;
    pthread_mutex_lock(&ld->lock);
    int best = -1;
    for (uint32_t i = 0; i < ld->n_snaps; i++)
        if (ld->snaps[i].index <= ld->delivered)
            best = (int)i;
    if (best < 0) {
        rc = tio_fail(TIO_ESTATE, "no snapshot at or before sample %llu",
                      (unsigned long long)ld->delivered);
    } else if (!(blob = malloc(ld->snaps[best].len))) {
        rc = tio_fail(-ENOMEM, "out of memory");
    } else {
        memcpy(blob, ld->snaps[best].blob, ld->snaps[best].len);
        len = ld->snaps[best].len;
        index = ld->snaps[best].index;
    }
    pthread_mutex_unlock(&ld->lock);
    if (rc)
        return rc;
    tio_loader_options o = ld->opts;
    o.prefetch = 0;
    const void *states[1] = {blob};
    if ((rc = tio_gen_init(g, ld->ds, &o)) == 0)
        rc = tio_gen_load(g, states, &len, 1);
    g->skip_tokens = true; /* replaying needs the positions, not the tokens */
    for (uint64_t k = index; !rc && k < ld->delivered; k++) {
        tio_gen_sample tmp = {0};
        rc = tio_gen_next(g, &tmp);
        tio_gen_sample_free(&tmp);
    }
    free(blob);
    if (rc)
        tio_gen_free(g);
    return rc;
}

int tio_loader_state(tio_loader *ld, void **buf, size_t *len)
{
    *buf = NULL;
    *len = 0;
    if (!ld->running)
        return tio_gen_serialize(&ld->gen, buf, len);
    tio_gen g;
    int rc = delivered_gen(ld, &g);
    if (rc)
        return rc;
    rc = tio_gen_serialize(&g, buf, len);
    tio_gen_free(&g);
    return rc;
}

int tio_loader_save(tio_loader *ld, const char *path)
{
    void *buf;
    size_t len;
    int rc = tio_loader_state(ld, &buf, &len);
    if (rc)
        return rc;
    tio_atomic_file af; /* it also removes temporaries of killed saves (unlocked) */
    if ((rc = tio_atomic_open(&af, path)) == 0) {
        if (fwrite(buf, 1, len, af.f) != len) {
            int e = errno ? errno : EIO;
            tio_atomic_abort(&af);
            rc = tio_fail(-e, "%s: write failed: %s", path, strerror(e));
        } else {
            rc = tio_atomic_commit(&af);
        }
    }
    free(buf);
    return rc;
}

int tio_loader_state_read(const char *path, void **buf, size_t *len)
{
    char *text;
    size_t n;
    int rc = tio_read_file(path, &text, &n);
    if (rc)
        return rc;
    if ((rc = tio_state_check(text, n, path)) != 0) {
        free(text);
        return rc;
    }
    *buf = text;
    *len = n;
    return 0;
}

int tio_loader_position(tio_loader *ld, uint32_t sub, tio_data_position *pos)
{
    if (sub >= ld->ds->n_subs)
        return tio_fail(-EINVAL, "sub-dataset %u out of range (%u)", sub, ld->ds->n_subs);
    tio_gen scratch, *g = &ld->gen;
    int rc = 0;
    if (ld->running) {
        if ((rc = delivered_gen(ld, &scratch)) != 0)
            return rc;
        g = &scratch;
    }
    tio_gen_position(&g->subs[sub], pos);
    if (g == &scratch)
        tio_gen_free(&scratch);
    return 0;
}
