/*
 * tests/c/test_engine_soak.c — random reads and writes against the engine,
 * every byte verified.
 *
 * A model of 24 slots, each an extent with a known content: a write gives a
 * slot a new size (4 KiB to 64 MiB, most small, unaligned sizes included;
 * the extent is reallocated when it no longer fits or is more than twice
 * too big) and new content, a read
 * reads the slot (all of it, or a prefix) into a buffer at a random
 * misalignment and compares it with the content regenerated from the slot's
 * seed.  Up to 8 requests are in flight, never two on the same slot; some
 * are urgent.  Two directories, 256 KiB stripes, checksums on (a full-length
 * read is also CRC-checked by the engine).
 *
 * Operations: TERAIO_SOAK_COUNT (default 5000, about 10 s here);
 * TERAIO_SOAK_SCALE=small (the TSan run) caps it at 300 and sizes at 4 MiB;
 * the seed is TERAIO_SOAK_SEED.  The full soak of the issue is
 *     TERAIO_SOAK_COUNT=100000 build/bin/test_engine_soak
 * Backend: the auto choice (io_uring here), or TERAIO_ENGINE_BACKEND=psync.
 * Each is read through tio_env, so the older TIO_ names still work.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#include "common/util.h"
#include "teraio/engine.h"

#define KIB 1024ull
#define MIB (1024ull * 1024ull)
enum { SLOTS = 24, WINDOW = 8 };

typedef struct {
    tio_extent x;
    bool allocated;
    uint64_t size;      /* bytes of valid content (0: never written) */
    uint64_t seed;
    bool busy;
} slot_t;

typedef struct {
    int slot;
    bool write;
    uint64_t bytes;
    char *base, *p;
} op_t;

static uint64_t rng_state;

static uint64_t next_rand(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Content of a slot: splitmix64 words from its seed. */
static void gen(char *p, uint64_t n, uint64_t seed)
{
    uint64_t s = seed;
    for (uint64_t i = 0; i < n; i += 8) {
        uint64_t z = (s += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 31)) * 0xBF58476D1CE4E5B9ull;
        memcpy(p + i, &z, n - i < 8 ? n - i : 8);
    }
}

/* 90% 4 KiB..256 KiB, 9% up to 4 MiB, 1% up to max; a third unaligned. */
static uint64_t pick_size(uint64_t max)
{
    uint64_t r = next_rand() % 100, hi = r < 90 ? 256 * KIB : r < 99 ? 4 * MIB : max;
    if (hi > max)
        hi = max;
    uint64_t n = 4 * KIB + next_rand() % (hi - 4 * KIB + 1);
    if (next_rand() % 3)
        n = n / 4096 * 4096;
    return n;
}

static uint64_t env_u64(const char *name, uint64_t dflt)
{
    const char *v = tio_env(name);
    return v && *v ? strtoull(v, NULL, 10) : dflt;
}

static void finish(tio_engine *e, op_t *ops, slot_t *slots, const tio_completion *c,
                   char *expect)
{
    op_t *o = &ops[c->tag];
    slot_t *s = &slots[o->slot];
    if (c->result != 0)
        fail_msg("%s of slot %d (%llu bytes): %s", o->write ? "write" : "read", o->slot,
                 (unsigned long long)o->bytes, tio_engine_completion_error(e, c->tag));
    if (!o->write) {
        gen(expect, o->bytes, s->seed);
        if (memcmp(o->p, expect, o->bytes) != 0) {
            uint64_t i = 0;
            while (o->p[i] == expect[i])
                i++;
            fail_msg("read of slot %d (%llu bytes at offset %llu): byte %llu differs",
                     o->slot, (unsigned long long)o->bytes, (unsigned long long)s->x.offset,
                     (unsigned long long)i);
        }
    }
    s->busy = false;
    free(o->base);
    o->base = NULL;
}

static void test_soak(void **state)
{
    bool small = tio_env("SOAK_SCALE") && !strcmp(tio_env("SOAK_SCALE"), "small");
    uint64_t count = env_u64("SOAK_COUNT", 5000);
    uint64_t max_size = small ? 4 * MIB : 64 * MIB;
    if (small && count > 300)
        count = 300;
    rng_state = env_u64("SOAK_SEED", 20240611);

    const char *base = tio_env("TEST_TMPDIR");
    char root[PATH_MAX], d0[PATH_MAX + 8], d1[PATH_MAX + 8];
    snprintf(root, sizeof root, "%s/soak.XXXXXX", base && *base ? base : "/tmp");
    mkdir(base && *base ? base : "/tmp", 0755);
    assert_non_null(mkdtemp(root));
    snprintf(d0, sizeof d0, "%s/ssd0", root);
    snprintf(d1, sizeof d1, "%s/ssd1", root);
    assert_int_equal(mkdir(d0, 0755), 0);
    assert_int_equal(mkdir(d1, 0755), 0);

    const char *dirs[2] = {d0, d1};
    tio_engine_options opt;
    tio_engine_options_default(&opt);
    opt.dirs = dirs;
    opt.n_dirs = 2;
    opt.space_bytes = SLOTS * max_size / 2 + 2 * max_size;
    opt.stripe_bytes = 256 * KIB;
    opt.checksum = true;
    tio_engine *e = NULL;
    int rc = tio_engine_create(&opt, &e);
    if (rc)
        fail_msg("create: %s", tio_last_error());
    print_message("soak: %llu operations, sizes up to %llu bytes, backend %s\n",
                  (unsigned long long)count, (unsigned long long)max_size,
                  tio_backend_name(tio_engine_backend(e)));

    slot_t slots[SLOTS] = {0};
    op_t ops[WINDOW] = {0};
    char *expect = malloc(max_size);
    assert_non_null(expect);
    uint64_t done = 0, issued = 0, bytes_moved = 0;
    while (done < count) {
        while (issued < count && tio_engine_in_flight(e) < WINDOW) {
            int k = 0;
            while (ops[k].base)
                k++;
            int si = (int)(next_rand() % SLOTS);
            while (slots[si].busy)
                si = (si + 1) % SLOTS;
            slot_t *s = &slots[si];
            op_t *o = &ops[k];
            o->slot = si;
            o->write = s->size == 0 || next_rand() % 2;
            if (o->write) {
                o->bytes = pick_size(max_size);
                if (s->allocated && (s->x.bytes < o->bytes || s->x.bytes > 2 * o->bytes + 64 * KIB)) {
                    assert_int_equal(tio_engine_free(e, &s->x), 0);
                    s->allocated = false;
                }
                if (!s->allocated) {
                    rc = tio_engine_alloc(e, o->bytes, &s->x);
                    if (rc)
                        fail_msg("alloc %llu: %s", (unsigned long long)o->bytes,
                                 tio_last_error());
                    s->allocated = true;
                }
                s->size = o->bytes;
                s->seed = next_rand();
            } else {
                o->bytes = next_rand() % 4 ? s->size : 1 + next_rand() % s->size;
            }
            uint64_t misalign = next_rand() % 2 ? 0 : 1 + next_rand() % 4095;
            o->base = aligned_alloc(4096, (o->bytes + misalign + 4095) / 4096 * 4096);
            assert_non_null(o->base);
            o->p = o->base + misalign;
            bool urgent = next_rand() % 8 == 0;
            if (o->write) {
                gen(o->p, o->bytes, s->seed);
                rc = tio_engine_submit_write(e, &s->x, o->p, o->bytes, (uint64_t)k, urgent);
            } else {
                rc = tio_engine_submit_read(e, &s->x, o->p, o->bytes, (uint64_t)k, urgent);
            }
            if (rc)
                fail_msg("submit: %s", tio_last_error());
            s->busy = true;
            issued++;
            bytes_moved += o->bytes;
        }
        tio_completion c[WINDOW];
        int n = tio_engine_reap(e, c, WINDOW, 1);
        assert_true(n >= 1);
        for (int i = 0; i < n; i++)
            finish(e, ops, slots, &c[i], expect);
        done += (uint64_t)n;
    }
    /* Finally every slot, read in full. */
    for (int si = 0; si < SLOTS; si++) {
        if (!slots[si].size)
            continue;
        char *buf = malloc(slots[si].size);
        assert_non_null(buf);
        assert_int_equal(tio_engine_read(e, &slots[si].x, buf, slots[si].size), 0);
        gen(expect, slots[si].size, slots[si].seed);
        assert_memory_equal(buf, expect, slots[si].size);
        free(buf);
    }
    print_message("soak: %llu operations, %llu MiB moved, all bytes verified\n",
                  (unsigned long long)done, (unsigned long long)(bytes_moved / MIB));
    free(expect);
    tio_engine_destroy(e);
    assert_int_equal(rmdir(d0), 0);
    assert_int_equal(rmdir(d1), 0);
    assert_int_equal(rmdir(root), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_soak)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
