/*
 * runtime/pager.c — the capacity kept by demand paging, before there is a
 * plan (pager.h).
 *
 * A slot table (grown by doubling, freed slots reused through a free list)
 * and one doubly linked list of the resident movable slots, most recently
 * used at the head.  A slot used or tracked in the current kernel (its
 * `epoch` is the pager's) is moved to the head, so walking from the tail
 * meets every slot the current kernel may lose before the first one it
 * uses: making room is O(evictions), and using or tracking a tensor O(1).
 *
 * Moves are synchronous (tio_engine_write / tio_engine_read): an eviction's
 * write completes before the release callback frees the memory, so the
 * bytes are on the SSD whenever the memory is gone; a failed write leaves
 * the tensor resident and is returned.  A failed read leaves the tensor
 * evicted with its copy intact, and the memory the allocate callback gave
 * is released again.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "teraio/pager.h"

#define NONE UINT32_MAX

typedef struct {
    void *addr;        /* valid while resident */
    uint64_t bytes;
    uint64_t epoch;    /* the kernel that last used it */
    tio_extent extent; /* the stored copy's space, once evicted */
    uint32_t prev, next; /* LRU list (resident movable slots), or the free list (next) */
    bool used;         /* tracked */
    bool resident;
    bool movable;
    bool has_extent;
    bool listed;       /* in the LRU list */
} pg_slot;

struct tio_pager {
    tio_engine *engine;
    tio_pager_callbacks cb;
    pthread_t owner;
    pg_slot *slots;
    uint32_t n_slots, cap_slots;
    uint32_t free_head;   /* free slots, chained by next */
    uint32_t head, tail;  /* LRU: head most recently used */
    uint64_t epoch;
    uint64_t capacity_bytes;
    double capacity_share;
    bool kernel_over;     /* this kernel was counted over the capacity */
    bool space_warned;    /* the engine's space ran out once (logged) */
    tio_pager_stats stats;
};

static int check_thread(const tio_pager *p, const char *fn)
{
    if (!p)
        return tio_fail(-EINVAL, "%s: pager is NULL", fn);
    if (pthread_equal(p->owner, pthread_self()))
        return 0;
    return tio_fail(-EPERM, "%s: called from another thread; a pager is driven only from the thread "
                    "that created it", fn);
}

static int check_slot(const tio_pager *p, uint32_t slot, const char *fn)
{
    if (slot >= p->n_slots || !p->slots[slot].used)
        return tio_fail(-EINVAL, "%s: slot %u is not tracked", fn, slot);
    return 0;
}

static int check_capacity(uint64_t bytes, double share, const char *fn)
{
    if (!(share == 0 || (share > 0 && share <= 1)))
        return tio_fail(-EINVAL, "%s: capacity_share %g is not in (0, 1]", fn, share);
    if (bytes == 0 && share == 0)
        return tio_fail(-EINVAL, "%s: a capacity of 0 bytes and no share", fn);
    return 0;
}

/* The capacity in force: bytes, or the share of the largest tracked bytes
 * seen (a lower bound of the peak), whichever is larger. */
static uint64_t capacity(const tio_pager *p)
{
    uint64_t c = p->capacity_bytes;
    if (p->capacity_share > 0) {
        uint64_t s = (uint64_t)(p->capacity_share * (double)p->stats.peak_tracked_bytes);
        if (s > c)
            c = s;
    }
    return c;
}

static void note_peak(tio_pager *p)
{
    if (p->stats.resident_bytes > p->stats.peak_resident_bytes)
        p->stats.peak_resident_bytes = p->stats.resident_bytes;
}

static void unlink_slot(tio_pager *p, uint32_t s)
{
    pg_slot *x = &p->slots[s];
    if (!x->listed)
        return;
    if (x->prev != NONE)
        p->slots[x->prev].next = x->next;
    else
        p->head = x->next;
    if (x->next != NONE)
        p->slots[x->next].prev = x->prev;
    else
        p->tail = x->prev;
    x->listed = false;
}

static void push_head(tio_pager *p, uint32_t s)
{
    pg_slot *x = &p->slots[s];
    unlink_slot(p, s);
    if (!x->movable)
        return;
    x->prev = NONE;
    x->next = p->head;
    if (p->head != NONE)
        p->slots[p->head].prev = s;
    p->head = s;
    if (p->tail == NONE)
        p->tail = s;
    x->listed = true;
}

static void forget_slot(tio_pager *p, uint32_t s);

/* Evict slot s: write its bytes, then release its memory.  Returns 0, 1
 * (the memory cannot be released: the slot is now unmovable, resident), 2
 * (the adapter's check says the memory is no longer the slot's: forgotten),
 * or a negative error. */
static int evict(tio_pager *p, uint32_t s)
{
    pg_slot *x = &p->slots[s];
    if (p->cb.check) {
        int rc = p->cb.check(p->cb.ctx, s, x->addr, x->bytes);
        if (rc < 0)
            return tio_fail(rc, "pager: checking slot %u before evicting it failed: %s", s,
                            tio_strerror(rc));
        if (rc == 1) {
            forget_slot(p, s);
            return 2;
        }
    }
    if (!x->has_extent) {
        int rc = tio_engine_alloc(p->engine, x->bytes, &x->extent);
        if (rc < 0)
            return tio_fail(rc, "pager: no SSD space to evict a tensor of %llu bytes (%s)",
                            (unsigned long long)x->bytes, tio_strerror(rc));
        x->has_extent = true;
    }
    uint64_t t0 = tio_now_ns();
    int rc = tio_engine_write(p->engine, &x->extent, x->addr, x->bytes);
    p->stats.io_ns += tio_now_ns() - t0;
    if (rc < 0)
        return rc;
    rc = p->cb.release(p->cb.ctx, s);
    if (rc < 0) {
        /* The framework cannot free this memory (PyTorch: a storage shared
         * with numpy after .numpy()): it stays resident, no longer a
         * candidate, counted like any other. */
        unlink_slot(p, s);
        x->movable = false;
        tio_log(TIO_LOG_DEBUG, "pager: slot %u (%llu bytes) cannot be released (%d): kept resident",
                s, (unsigned long long)x->bytes, rc);
        return 1;
    }
    unlink_slot(p, s);
    x->resident = false;
    x->addr = NULL;
    p->stats.resident_bytes -= x->bytes;
    p->stats.evictions++;
    p->stats.bytes_evicted += x->bytes;
    return 0;
}

/* Evict least recently used tensors the current kernel does not use until
 * `need` more bytes fit; what cannot be made to fit counts the kernel over
 * the capacity. */
static int make_room(tio_pager *p, uint64_t need)
{
    uint64_t cap = capacity(p);
    while (p->stats.resident_bytes + need > cap && p->tail != NONE &&
           p->slots[p->tail].epoch != p->epoch) {
        int rc = evict(p, p->tail);
        if (rc == -ENOSPC) {
            /* The SSD space is full: what does not fit stays resident, over the capacity. */
            if (!p->space_warned) {
                p->space_warned = true;
                tio_log(TIO_LOG_WARN, "%s; what does not fit stays resident (give the engine more space)",
                        tio_last_error());
            }
            break;
        }
        if (rc < 0)
            return rc;
    }
    uint64_t want = p->stats.resident_bytes + need;
    if (want > cap) {
        if (want - cap > p->stats.over_capacity_bytes_max)
            p->stats.over_capacity_bytes_max = want - cap;
        if (!p->kernel_over) {
            p->kernel_over = true;
            p->stats.over_capacity_kernels++;
        }
    }
    return 0;
}

int tio_pager_create(tio_engine *engine, uint64_t capacity_bytes, double capacity_share,
                     const tio_pager_callbacks *cb, tio_pager **out)
{
    if (!engine || !cb || !cb->allocate || !cb->release || !out)
        return tio_fail(-EINVAL, "pager_create: engine, callbacks (allocate, release) and out are required");
    int rc = check_capacity(capacity_bytes, capacity_share, "pager_create");
    if (rc < 0)
        return rc;
    tio_pager *p = calloc(1, sizeof *p);
    if (!p)
        return tio_fail(-ENOMEM, "pager_create: out of memory");
    p->engine = tio_engine_retain(engine);
    p->cb = *cb;
    p->owner = pthread_self();
    p->free_head = p->head = p->tail = NONE;
    p->capacity_bytes = capacity_bytes;
    p->capacity_share = capacity_share;
    *out = p;
    return 0;
}

void tio_pager_destroy(tio_pager *p)
{
    if (!p)
        return;
    for (uint32_t s = 0; s < p->n_slots; s++)
        if (p->slots[s].used && p->slots[s].has_extent)
            tio_engine_free(p->engine, &p->slots[s].extent);
    free(p->slots);
    tio_engine_destroy(p->engine);
    free(p);
}

int tio_pager_set_capacity(tio_pager *p, uint64_t capacity_bytes, double capacity_share)
{
    int rc = check_thread(p, "tio_pager_set_capacity");
    if (rc == 0)
        rc = check_capacity(capacity_bytes, capacity_share, "tio_pager_set_capacity");
    if (rc < 0)
        return rc;
    p->capacity_bytes = capacity_bytes;
    p->capacity_share = capacity_share;
    return 0;
}

int tio_pager_kernel_begin(tio_pager *p)
{
    int rc = check_thread(p, "tio_pager_kernel_begin");
    if (rc < 0)
        return rc;
    p->epoch++;
    p->kernel_over = false;
    p->stats.kernels++;
    uint64_t rss = tio_process_rss_bytes();
    if (rss > p->stats.peak_process_rss_bytes)
        p->stats.peak_process_rss_bytes = rss;
    return 0;
}

static int new_slot(tio_pager *p, uint32_t *out)
{
    if (p->free_head != NONE) {
        *out = p->free_head;
        p->free_head = p->slots[*out].next;
        return 0;
    }
    if (p->n_slots == p->cap_slots) {
        uint32_t cap = p->cap_slots ? p->cap_slots * 2 : 256;
        if (cap <= p->cap_slots)
            return tio_fail(-ENOMEM, "pager: too many tensors");
        pg_slot *s = realloc(p->slots, (size_t)cap * sizeof *s);
        if (!s)
            return tio_fail(-ENOMEM, "pager: out of memory for %u slots", cap);
        p->slots = s;
        p->cap_slots = cap;
    }
    *out = p->n_slots++;
    return 0;
}

int tio_pager_track(tio_pager *p, void *addr, uint64_t bytes, bool movable, uint32_t *slot)
{
    int rc = check_thread(p, "tio_pager_track");
    if (rc < 0)
        return rc;
    if (!addr || !slot || bytes == 0)
        return tio_fail(-EINVAL, "pager_track: a tensor needs an address, bytes > 0 and a slot pointer");
    uint32_t s = NONE;
    if ((rc = new_slot(p, &s)) < 0)
        return rc;
    pg_slot *x = &p->slots[s];
    *x = (pg_slot){.addr = addr, .bytes = bytes, .epoch = p->epoch, .prev = NONE, .next = NONE,
                   .used = true, .resident = true, .movable = movable};
    push_head(p, s);
    p->stats.resident_bytes += bytes;
    p->stats.tracked_bytes += bytes;
    if (p->stats.tracked_bytes > p->stats.peak_tracked_bytes)
        p->stats.peak_tracked_bytes = p->stats.tracked_bytes;
    note_peak(p);
    *slot = s;
    return make_room(p, 0);
}

int tio_pager_track_stored(tio_pager *p, uint64_t bytes, const tio_extent *extent, uint32_t *slot)
{
    int rc = check_thread(p, "tio_pager_track_stored");
    if (rc < 0)
        return rc;
    if (!extent || !slot || bytes == 0 || extent->bytes < bytes)
        return tio_fail(-EINVAL, "pager_track_stored: a stored tensor needs bytes > 0, an extent of at "
                        "least that many bytes and a slot pointer");
    uint32_t s = NONE;
    if ((rc = new_slot(p, &s)) < 0)
        return rc;
    p->slots[s] = (pg_slot){.bytes = bytes, .epoch = 0, .extent = *extent, .prev = NONE, .next = NONE,
                            .used = true, .resident = false, .movable = true, .has_extent = true};
    p->stats.tracked_bytes += bytes;
    if (p->stats.tracked_bytes > p->stats.peak_tracked_bytes)
        p->stats.peak_tracked_bytes = p->stats.tracked_bytes;
    *slot = s;
    return 0;
}

static void forget_slot(tio_pager *p, uint32_t s)
{
    pg_slot *x = &p->slots[s];
    unlink_slot(p, s);
    if (x->resident)
        p->stats.resident_bytes -= x->bytes;
    if (x->has_extent)
        tio_engine_free(p->engine, &x->extent);
    x->has_extent = false;
    p->stats.tracked_bytes -= x->bytes;
    x->used = false;
    x->next = p->free_head;
    p->free_head = s;
}

int tio_pager_forget(tio_pager *p, uint32_t slot)
{
    int rc = check_thread(p, "tio_pager_forget");
    if (rc == 0)
        rc = check_slot(p, slot, "tio_pager_forget");
    if (rc < 0)
        return rc;
    forget_slot(p, slot);
    return 0;
}

/* Fetch evicted slot s back (the caller made room, or does not care).
 * `counted`: at a kernel, where the resident bytes count toward the peak;
 * between steps (tio_pager_fetch, tio_pager_fetch_all) they do not. */
static int fetch(tio_pager *p, uint32_t s, bool counted)
{
    pg_slot *x = &p->slots[s];
    void *addr = NULL;
    int rc = p->cb.allocate(p->cb.ctx, s, x->bytes, &addr);
    if (rc < 0 || !addr)
        return tio_fail(rc < 0 ? rc : -ENOMEM, "pager: the allocate callback failed for slot %u (%llu bytes)",
                        s, (unsigned long long)x->bytes);
    uint64_t t0 = tio_now_ns();
    rc = tio_engine_read(p->engine, &x->extent, addr, x->bytes);
    p->stats.io_ns += tio_now_ns() - t0;
    if (rc < 0) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", tio_last_error());
        p->cb.release(p->cb.ctx, s);
        return tio_fail(rc, "%s", msg);
    }
    x->addr = addr;
    x->resident = true;
    p->stats.resident_bytes += x->bytes;
    p->stats.fetches++;
    p->stats.bytes_fetched += x->bytes;
    if (counted)
        note_peak(p);
    return 1;
}

int tio_pager_use(tio_pager *p, uint32_t slot, void **addr)
{
    int rc = check_thread(p, "tio_pager_use");
    if (rc == 0)
        rc = check_slot(p, slot, "tio_pager_use");
    if (rc < 0)
        return rc;
    pg_slot *x = &p->slots[slot];
    x->epoch = p->epoch;
    rc = 0;
    if (!x->resident) {
        if ((rc = make_room(p, x->bytes)) < 0 || (rc = fetch(p, slot, true)) < 0)
            return rc;
    }
    push_head(p, slot);
    if (addr)
        *addr = x->addr;
    return rc;
}

int tio_pager_reserve(tio_pager *p, uint64_t bytes)
{
    int rc = check_thread(p, "tio_pager_reserve");
    if (rc < 0)
        return rc;
    return make_room(p, bytes);
}

int tio_pager_fetch(tio_pager *p, uint32_t slot)
{
    int rc = check_thread(p, "tio_pager_fetch");
    if (rc == 0)
        rc = check_slot(p, slot, "tio_pager_fetch");
    if (rc < 0)
        return rc;
    if (p->slots[slot].resident)
        return 0;
    rc = fetch(p, slot, false);
    if (rc > 0)
        push_head(p, slot);
    return rc;
}

int tio_pager_fetch_all(tio_pager *p)
{
    int rc = check_thread(p, "tio_pager_fetch_all");
    if (rc < 0)
        return rc;
    int first = 0;
    for (uint32_t s = 0; s < p->n_slots; s++) {
        pg_slot *x = &p->slots[s];
        if (!x->used || x->resident)
            continue;
        rc = fetch(p, s, false);
        if (rc < 0 && first == 0)
            first = rc;
        if (rc > 0)
            push_head(p, s);
    }
    return first;
}

bool tio_pager_is_resident(const tio_pager *p, uint32_t slot)
{
    return p && slot < p->n_slots && p->slots[slot].used && p->slots[slot].resident;
}

int tio_pager_detach(tio_pager *p, uint32_t slot, bool *resident, tio_extent *extent)
{
    int rc = check_thread(p, "tio_pager_detach");
    if (rc == 0)
        rc = check_slot(p, slot, "tio_pager_detach");
    if (rc < 0)
        return rc;
    if (!resident || !extent)
        return tio_fail(-EINVAL, "pager_detach: resident and extent are required");
    pg_slot *x = &p->slots[slot];
    *resident = x->resident;
    memset(extent, 0, sizeof *extent);
    if (!x->resident) {
        *extent = x->extent;
        x->has_extent = false; /* the caller owns it now */
    }
    return tio_pager_forget(p, slot);
}

void tio_pager_get_stats(const tio_pager *p, tio_pager_stats *out)
{
    if (!p || !out)
        return;
    *out = p->stats;
    out->capacity_bytes = capacity(p);
}
