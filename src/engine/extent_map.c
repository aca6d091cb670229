/*
 * engine/extent_map.c — the extent allocator over the engine's logical
 * (striped) address space.
 *
 * First fit over a free list kept sorted by offset; freeing coalesces with
 * both neighbours, so the list never holds two touching ranges.  Allocated
 * extents are kept in a second sorted array so that tio_engine_free can tell
 * a real extent from a wrong one (-EINVAL) instead of corrupting the list.
 * Everything is in TIO_EXTENT_ALIGN (4 KiB) units.  Both arrays are searched
 * by binary search and updated with memmove: the engine holds at most a few
 * thousand extents (one per offloaded tensor), where this is cheaper and
 * simpler than a tree.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"

int tio_extent_map_init(tio_extent_map *map, uint64_t space_bytes)
{
    memset(map, 0, sizeof *map);
    map->space_bytes = space_bytes;
    if (space_bytes == 0)
        return 0;
    int rc = tio_grow((void **)&map->free, &map->cap_free, 1, sizeof *map->free);
    if (rc)
        return rc;
    map->free[0] = (tio_extent){.offset = 0, .bytes = space_bytes};
    map->n_free = 1;
    return 0;
}

void tio_extent_map_fini(tio_extent_map *map)
{
    for (uint32_t i = 0; i < map->n_used; i++)
        free(map->used[i].crcs);
    free(map->free);
    free(map->used);
    memset(map, 0, sizeof *map);
}

/* Index of the first element of the sorted array with offset >= `offset`. */
static uint32_t lower_bound(const tio_extent *a, uint32_t n, uint64_t offset)
{
    uint32_t lo = 0, hi = n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (a[mid].offset < offset)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static uint32_t lower_bound_used(const tio_used_extent *a, uint32_t n, uint64_t offset)
{
    uint32_t lo = 0, hi = n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (a[mid].x.offset < offset)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Insert element `e` (of `elem` bytes) at index i of a growable array. */
static int insert_at(void **a, uint32_t *n, uint32_t *cap, uint32_t i, const void *e, size_t elem)
{
    int rc = tio_grow(a, cap, *n + 1, elem);
    if (rc)
        return rc;
    char *base = *a;
    memmove(base + (i + 1) * elem, base + i * elem, (size_t)(*n - i) * elem);
    memcpy(base + i * elem, e, elem);
    (*n)++;
    return 0;
}

static void remove_at(void *a, uint32_t *n, uint32_t i, size_t elem)
{
    char *base = a;
    memmove(base + i * elem, base + (i + 1) * elem, (size_t)(*n - i - 1) * elem);
    (*n)--;
}

int tio_extent_map_alloc(tio_extent_map *map, uint64_t bytes, tio_extent *out)
{
    if (bytes == 0)
        return tio_fail(-EINVAL, "engine: cannot allocate an extent of 0 bytes");
    if (bytes > UINT64_MAX - (TIO_EXTENT_ALIGN - 1))
        return tio_fail(-ENOSPC, "engine: no free extent of %llu bytes", (unsigned long long)bytes);
    uint64_t need = (bytes + TIO_EXTENT_ALIGN - 1) & ~(uint64_t)(TIO_EXTENT_ALIGN - 1);
    for (uint32_t i = 0; i < map->n_free; i++) {
        tio_extent *f = &map->free[i];
        if (f->bytes < need)
            continue;
        tio_used_extent u = {.x = {.offset = f->offset, .bytes = need}};
        uint32_t at = lower_bound_used(map->used, map->n_used, u.x.offset);
        int rc = insert_at((void **)&map->used, &map->n_used, &map->cap_used, at, &u, sizeof u);
        if (rc)
            return rc;
        if (f->bytes == need) {
            remove_at(map->free, &map->n_free, i, sizeof *map->free);
        } else {
            f->offset += need;
            f->bytes -= need;
        }
        *out = u.x;
        return 0;
    }
    return tio_fail(-ENOSPC, "engine: no free extent of %llu bytes (space %llu bytes)",
                    (unsigned long long)need, (unsigned long long)map->space_bytes);
}

int tio_extent_map_free(tio_extent_map *map, const tio_extent *extent)
{
    tio_used_extent *ue = tio_extent_map_find(map, extent);
    if (!ue)
        return tio_fail(-EINVAL, "engine: extent at offset %llu (%llu bytes) is not allocated",
                        (unsigned long long)extent->offset, (unsigned long long)extent->bytes);
    uint32_t u = (uint32_t)(ue - map->used);
    tio_extent e = ue->x;
    uint32_t i = lower_bound(map->free, map->n_free, e.offset);
    bool join_prev = i > 0 && map->free[i - 1].offset + map->free[i - 1].bytes == e.offset;
    bool join_next = i < map->n_free && e.offset + e.bytes == map->free[i].offset;
    if (join_prev && join_next) {
        map->free[i - 1].bytes += e.bytes + map->free[i].bytes;
        remove_at(map->free, &map->n_free, i, sizeof *map->free);
    } else if (join_prev) {
        map->free[i - 1].bytes += e.bytes;
    } else if (join_next) {
        map->free[i].offset = e.offset;
        map->free[i].bytes += e.bytes;
    } else {
        int rc = insert_at((void **)&map->free, &map->n_free, &map->cap_free, i, &e, sizeof e);
        if (rc)
            return rc;
    }
    free(ue->crcs);
    remove_at(map->used, &map->n_used, u, sizeof *map->used);
    return 0;
}

tio_used_extent *tio_extent_map_find(tio_extent_map *map, const tio_extent *extent)
{
    uint32_t u = lower_bound_used(map->used, map->n_used, extent->offset);
    if (u == map->n_used || map->used[u].x.offset != extent->offset ||
        map->used[u].x.bytes != extent->bytes)
        return NULL;
    return &map->used[u];
}

void tio_extent_map_stats(const tio_extent_map *map, tio_engine_space *out)
{
    memset(out, 0, sizeof *out);
    out->space_bytes = map->space_bytes;
    out->free_extents = map->n_free;
    out->used_extents = map->n_used;
    for (uint32_t i = 0; i < map->n_free; i++) {
        out->free_bytes += map->free[i].bytes;
        if (map->free[i].bytes > out->largest_free_bytes)
            out->largest_free_bytes = map->free[i].bytes;
    }
}
