/*
 * tests/c/test_engine.c — the storage engine, end to end on real files.
 *
 * Every test asserts a checkable value: byte equality after a write/read
 * round trip (aligned and unaligned buffers, lengths around the 4 KiB and
 * request boundaries), the exact placement of bytes in the backing files
 * given by the striping formula, exact extent offsets from the allocator,
 * exact error codes and messages.  Data-path tests run once per backend
 * (io_uring, psync).  Faults and probe refusals are injected through the
 * engine's test hooks (engine/engine_test.h), corruption by writing into a
 * backing file behind the engine's back.
 * Temporary directories live under $TIO_TEST_TMPDIR (default /tmp).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <dirent.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <time.h>

#include "common/util.h"
#include "engine/engine_internal.h"
#include "engine_create.h"
#include "teraio/engine.h"

#define KIB 1024u
#define MIB (1024u * 1024u)

static char g_root[PATH_MAX], g_d0[PATH_MAX + 8], g_d1[PATH_MAX + 8];
static tio_backend g_uring = TIO_BACKEND_IO_URING, g_psync = TIO_BACKEND_PSYNC;
/* Test hooks for the engines the helpers below create; zero: none. */
static tio_engine_test_options g_hooks;
/* make_engine turns checksums off (on by default) while this is set. */
static bool g_checksum_off;

/* Arm a fault ("eio:write:2", ...) for the next engines; NULL disarms it. */
static void set_fault(const char *spec)
{
    uint32_t probe_fail = g_hooks.probe_fail;
    if (spec)
        assert_int_equal(tio_engine_test_options_parse(spec, &g_hooks), 0);
    else
        memset(&g_hooks, 0, sizeof g_hooks);
    g_hooks.probe_fail = probe_fail;
}

static void mkdir_p(const char *path)
{
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p == '/') {
            *p = '\0';
            mkdir(tmp, 0755);
            *p = '/';
        }
    }
    mkdir(tmp, 0755);
}

static int group_setup(void **state)
{
    const char *base = tio_env("TEST_TMPDIR");
    if (!base || !base[0])
        base = "/tmp";
    mkdir_p(base);
    snprintf(g_root, sizeof g_root, "%s/engine.XXXXXX", base);
    if (!mkdtemp(g_root))
        return -1;
    snprintf(g_d0, sizeof g_d0, "%s/ssd0", g_root);
    snprintf(g_d1, sizeof g_d1, "%s/ssd1", g_root);
    return mkdir(g_d0, 0755) || mkdir(g_d1, 0755);
}

static int group_teardown(void **state)
{
    char file[PATH_MAX + 16];
    snprintf(file, sizeof file, "%s/file", g_root);
    unlink(file);
    /* rmdir fails if a backing file was left behind. */
    return rmdir(g_d0) || rmdir(g_d1) || rmdir(g_root);
}

/* Deterministic bytes (xorshift32). */
static void fill(unsigned char *p, size_t n, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 1u;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        p[i] = (unsigned char)x;
    }
}

static tio_engine *make_engine(tio_backend backend, uint32_t n_dirs, uint64_t capacity,
                               uint32_t stripe, uint32_t request, uint32_t queue_depth)
{
    const char *dirs[2] = {g_d0, g_d1};
    tio_engine_options opt;
    tio_engine_options_default(&opt);
    opt.dirs = dirs;
    opt.n_dirs = n_dirs;
    opt.space_bytes = capacity;
    if (stripe)
        opt.stripe_bytes = stripe;
    if (request)
        opt.request_bytes = request;
    if (queue_depth)
        opt.queue_depth = queue_depth;
    opt.backend = backend;
    opt.checksum = !g_checksum_off;
    tio_engine *e = engine_create_or_skip(&opt, &g_hooks);
    assert_int_equal(tio_engine_backend(e), backend);
    return e;
}

static int create_in(const char *dir, tio_backend backend, tio_engine **e)
{
    const char *dirs[1] = {dir};
    tio_engine_options opt;
    tio_engine_options_default(&opt);
    opt.dirs = dirs;
    opt.n_dirs = 1;
    opt.space_bytes = MIB;
    opt.backend = backend;
    return tio_engine_create_test(&opt, &g_hooks, e);
}

/* A buffer of n bytes with a guard byte before and after; offset 0 or 1
 * from a 4 KiB boundary. */
typedef struct {
    unsigned char *base;
    unsigned char *p;
} buf_t;

static buf_t buf_new(size_t n, int misalign)
{
    buf_t b;
    b.base = aligned_alloc(4096, (n + 2 * 4096 + 4095) / 4096 * 4096);
    assert_non_null(b.base);
    b.p = b.base + 4096 + misalign;
    memset(b.base, 0xAA, n + 2 * 4096);
    return b;
}

static void check_guards(buf_t b, size_t n)
{
    assert_int_equal(b.p[-1], 0xAA);
    assert_int_equal(b.p[n], 0xAA);
}

/* ---- data path -------------------------------------------------------- */

static void test_roundtrip_sizes(void **state)
{
    tio_backend backend = *(tio_backend *)*state;
    static const uint64_t sizes[] = {1, 4095, 4096, 4097, MIB + 123, 9 * MIB + 1};
    enum { N = sizeof sizes / sizeof sizes[0] };
    tio_engine *e = make_engine(backend, 2, 64 * MIB, 0, 0, 0);
    for (int misalign = 0; misalign <= 1; misalign++) {
        tio_extent x[N];
        buf_t src[N];
        for (int i = 0; i < N; i++) {
            assert_int_equal(tio_engine_alloc(e, sizes[i], &x[i]), 0);
            src[i] = buf_new(sizes[i], misalign);
            fill(src[i].p, sizes[i], (uint32_t)(i + 10 * misalign + 1));
            assert_int_equal(tio_engine_write(e, &x[i], src[i].p, sizes[i]), 0);
        }
        /* Read back after all writes: no request clobbered a neighbour. */
        for (int i = 0; i < N; i++) {
            buf_t dst = buf_new(sizes[i], misalign);
            assert_int_equal(tio_engine_read(e, &x[i], dst.p, sizes[i]), 0);
            assert_memory_equal(dst.p, src[i].p, sizes[i]);
            check_guards(dst, sizes[i]);
            free(dst.base);
            free(src[i].base);
            assert_int_equal(tio_engine_free(e, &x[i]), 0);
        }
    }
    assert_int_equal(tio_engine_in_flight(e), 0);
    tio_engine_destroy(e);
}

/* The partial-read case: read fewer bytes than were written. */
static void test_read_prefix(void **state)
{
    tio_backend backend = *(tio_backend *)*state;
    tio_engine *e = make_engine(backend, 1, 4 * MIB, 0, 0, 0);
    tio_extent x;
    assert_int_equal(tio_engine_alloc(e, 3 * 4096, &x), 0);
    buf_t src = buf_new(3 * 4096, 0), dst = buf_new(5000, 1);
    fill(src.p, 3 * 4096, 77);
    assert_int_equal(tio_engine_write(e, &x, src.p, 3 * 4096), 0);
    assert_int_equal(tio_engine_read(e, &x, dst.p, 5000), 0);
    assert_memory_equal(dst.p, src.p, 5000);
    check_guards(dst, 5000);
    free(src.base);
    free(dst.base);
    tio_engine_destroy(e);
}

/* Two directories, 64 KiB stripes, 32 KiB requests: every byte of the extent
 * must sit in directory (o / S) % 2 at file offset (o / 2S) * S + o % S. */
static void test_striping_layout(void **state)
{
    tio_backend backend = *(tio_backend *)*state;
    const uint64_t S = 64 * KIB, bytes = 300 * KIB + 5;
    tio_engine *e = make_engine(backend, 2, MIB, (uint32_t)S, 32 * KIB, 0);
    tio_extent pad, x;
    assert_int_equal(tio_engine_alloc(e, 12 * KIB, &pad), 0);
    assert_int_equal(tio_engine_alloc(e, bytes, &x), 0);
    assert_int_equal(x.offset, 12 * KIB);
    assert_int_equal(x.bytes, 304 * KIB);
    buf_t src = buf_new(bytes, 1);
    fill(src.p, bytes, 5);
    assert_int_equal(tio_engine_write(e, &x, src.p, bytes), 0);

    unsigned char *file[2];
    for (int d = 0; d < 2; d++) {
        int fd = open(tio_engine_backing_path(e, (uint32_t)d), O_RDONLY);
        assert_true(fd >= 0);
        struct stat st;
        assert_int_equal(fstat(fd, &st), 0);
        assert_int_equal(st.st_size, 512 * KIB); /* 16 units of 64 KiB, 8 per dir */
        file[d] = malloc(512 * KIB);
        assert_int_equal(pread(fd, file[d], 512 * KIB, 0), 512 * KIB);
        close(fd);
    }
    for (uint64_t i = 0; i < x.bytes; i++) {
        uint64_t o = x.offset + i;
        unsigned d = (unsigned)((o / S) % 2);
        uint64_t off = (o / (2 * S)) * S + o % S;
        unsigned char want = i < bytes ? src.p[i] : 0; /* tail zero-padded */
        if (file[d][off] != want)
            fail_msg("logical %llu: dir %u offset %llu holds %u, want %u",
                     (unsigned long long)o, d, (unsigned long long)off, file[d][off], want);
    }
    /* The same formula, spelled out for a few bytes. */
    assert_int_equal(file[0][12 * KIB], src.p[0]);             /* o = 12 KiB */
    assert_int_equal(file[1][0], src.p[64 * KIB - 12 * KIB]);   /* o = 64 KiB */
    assert_int_equal(file[0][64 * KIB], src.p[128 * KIB - 12 * KIB]); /* o = 128 KiB */
    assert_int_equal(file[1][64 * KIB + 5], src.p[192 * KIB + 5 - 12 * KIB]);
    free(file[0]);
    free(file[1]);
    free(src.base);
    tio_engine_destroy(e);
}

/* 64 requests of assorted sizes in flight at once with a queue depth of 4:
 * every tag comes back exactly once, and the data is right. */
static void test_many_in_flight(void **state)
{
    tio_backend backend = *(tio_backend *)*state;
    enum { N = 64 };
    tio_engine *e = make_engine(backend, 2, 64 * MIB, 128 * KIB, 64 * KIB, 4);
    tio_extent x[N];
    uint64_t len[N];
    buf_t src[N], dst[N];
    for (int i = 0; i < N; i++) {
        len[i] = (uint64_t)i * 12345u + 1u;
        assert_int_equal(tio_engine_alloc(e, len[i], &x[i]), 0);
        src[i] = buf_new(len[i], i % 2);
        dst[i] = buf_new(len[i], (i / 2) % 2);
        fill(src[i].p, len[i], (uint32_t)i + 100);
    }
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < N; i++) {
            uint64_t tag = 1000 + 3 * (uint64_t)i;
            bool urgent = i % 5 == 0;
            int rc = pass == 0 ? tio_engine_submit_write(e, &x[i], src[i].p, len[i], tag, urgent)
                               : tio_engine_submit_read(e, &x[i], dst[i].p, len[i], tag, urgent);
            assert_int_equal(rc, 0);
        }
        assert_int_equal(tio_engine_in_flight(e), N);
        int seen[N] = {0};
        uint32_t got = 0;
        while (got < N) {
            tio_completion c[16];
            int n = tio_engine_reap(e, c, 16, 1);
            assert_true(n >= 1);
            for (int k = 0; k < n; k++) {
                assert_int_equal(c[k].result, 0);
                assert_int_equal((c[k].tag - 1000) % 3, 0);
                uint64_t i = (c[k].tag - 1000) / 3;
                assert_true(i < N);
                seen[i]++;
            }
            got += (uint32_t)n;
        }
        for (int i = 0; i < N; i++)
            assert_int_equal(seen[i], 1);
        assert_int_equal(tio_engine_in_flight(e), 0);
    }
    for (int i = 0; i < N; i++) {
        assert_memory_equal(dst[i].p, src[i].p, len[i]);
        check_guards(dst[i], len[i]);
        free(src[i].base);
        free(dst[i].base);
    }
    tio_engine_destroy(e);
}

/* Queue depth 1, one directory: 64 queued 1 MiB writes, then an urgent one.
 * The urgent write overtakes the queue, so it completes long before the
 * last normal write (without priority it would be the 65th of 65). */
static void test_urgent_overtakes(void **state)
{
    tio_backend backend = *(tio_backend *)*state;
    enum { N = 64 };
    tio_engine *e = make_engine(backend, 1, (N + 1) * MIB, 0, 0, 1);
    buf_t src = buf_new(MIB, 0);
    fill(src.p, MIB, 9);
    tio_extent x[N + 1];
    for (int i = 0; i <= N; i++)
        assert_int_equal(tio_engine_alloc(e, MIB, &x[i]), 0);
    for (int i = 0; i < N; i++)
        assert_int_equal(tio_engine_submit_write(e, &x[i], src.p, MIB, (uint64_t)i, false), 0);
    assert_int_equal(tio_engine_submit_write(e, &x[N], src.p, MIB, 999, true), 0);
    int pos = -1;
    for (int k = 0; k <= N; k++) {
        tio_completion c;
        assert_int_equal(tio_engine_reap(e, &c, 1, 1), 1);
        assert_int_equal(c.result, 0);
        if (c.tag == 999)
            pos = k;
    }
    print_message("urgent write completed %d of %d\n", pos + 1, N + 1);
    assert_true(pos >= 0 && pos < N / 2);
    buf_t dst = buf_new(MIB, 0);
    assert_int_equal(tio_engine_read(e, &x[N], dst.p, MIB), 0);
    assert_memory_equal(dst.p, src.p, MIB);
    free(dst.base);
    free(src.base);
    tio_engine_destroy(e);
}

/* tio_engine_write/read wait for their own request only. */
static void test_sync_keeps_other_completions(void **state)
{
    tio_backend backend = *(tio_backend *)*state;
    tio_engine *e = make_engine(backend, 2, 8 * MIB, 0, 0, 0);
    tio_extent a, b;
    assert_int_equal(tio_engine_alloc(e, 2 * MIB, &a), 0);
    assert_int_equal(tio_engine_alloc(e, 4096, &b), 0);
    buf_t big = buf_new(2 * MIB, 0), small = buf_new(4096, 0), back = buf_new(4096, 0);
    fill(big.p, 2 * MIB, 1);
    fill(small.p, 4096, 2);
    assert_int_equal(tio_engine_submit_write(e, &a, big.p, 2 * MIB, 7, false), 0);
    assert_int_equal(tio_engine_submit_write(e, &b, small.p, 0, 8, false), 0); /* empty */
    assert_int_equal(tio_engine_write(e, &b, small.p, 4096), 0);
    assert_int_equal(tio_engine_read(e, &b, back.p, 4096), 0);
    assert_memory_equal(back.p, small.p, 4096);
    assert_int_equal(tio_engine_in_flight(e), 2);
    tio_completion c[4];
    int got = 0, seen7 = 0, seen8 = 0;
    while (got < 2) {
        int n = tio_engine_reap(e, c, 4, 1);
        assert_true(n >= 1);
        for (int k = 0; k < n; k++) {
            assert_int_equal(c[k].result, 0);
            seen7 += c[k].tag == 7;
            seen8 += c[k].tag == 8;
        }
        got += n;
    }
    assert_int_equal(got, 2);
    assert_int_equal(seen7, 1);
    assert_int_equal(seen8, 1);
    assert_int_equal(tio_engine_reap(e, c, 4, 0), 0);
    free(big.base);
    free(small.base);
    free(back.base);
    tio_engine_destroy(e);
}

/* Destroy waits for requests that were never reaped (ASan: nothing leaks). */
static void test_destroy_with_requests_in_flight(void **state)
{
    tio_backend backend = *(tio_backend *)*state;
    tio_engine *e = make_engine(backend, 2, 16 * MIB, 0, 0, 2);
    buf_t src = buf_new(4 * MIB, 1);
    fill(src.p, 4 * MIB, 3);
    tio_extent x[3];
    for (int i = 0; i < 3; i++) {
        assert_int_equal(tio_engine_alloc(e, 4 * MIB, &x[i]), 0);
        assert_int_equal(tio_engine_submit_write(e, &x[i], src.p, 4 * MIB, (uint64_t)i, i == 2), 0);
    }
    tio_engine_destroy(e);
    free(src.base);
}

/* ---- faults ----------------------------------------------------------- */

static tio_engine *make_faulty(tio_backend backend, const char *fault)
{
    set_fault(fault);
    tio_engine *e = make_engine(backend, 1, 8 * MIB, 0, 0, 0);
    set_fault(NULL);
    return e;
}

/* The 2nd write chunk fails with EIO: its request completes with -EIO and a
 * message naming the file and offset; earlier and later requests are fine. */
static void test_injected_eio_write(void **state)
{
    tio_backend backend = *(tio_backend *)*state;
    tio_engine *e = make_faulty(backend, "eio:write:2");
    tio_extent a, b, c;
    assert_int_equal(tio_engine_alloc(e, 64 * KIB, &a), 0);
    assert_int_equal(tio_engine_alloc(e, 64 * KIB, &b), 0);
    assert_int_equal(tio_engine_alloc(e, 64 * KIB, &c), 0);
    buf_t pa = buf_new(64 * KIB, 0), pb = buf_new(64 * KIB, 1), pc = buf_new(64 * KIB, 0);
    buf_t back = buf_new(64 * KIB, 0);
    fill(pa.p, 64 * KIB, 1);
    fill(pb.p, 64 * KIB, 2);
    fill(pc.p, 64 * KIB, 3);
    assert_int_equal(tio_engine_write(e, &a, pa.p, 64 * KIB), 0); /* chunk 1 */
    assert_int_equal(tio_engine_submit_write(e, &b, pb.p, 64 * KIB, 42, false), 0);
    tio_completion done;
    assert_int_equal(tio_engine_reap(e, &done, 1, 1), 1);
    assert_int_equal(done.tag, 42);
    assert_int_equal(done.result, -EIO);
    char want[PATH_MAX + 128];
    snprintf(want, sizeof want, "write to '%s' at offset 65536 (65536 bytes): %s",
             tio_engine_backing_path(e, 0), strerror(EIO));
    assert_string_equal(tio_engine_completion_error(e, 42), want);
    assert_string_equal(tio_last_error(), want);
    assert_string_equal(tio_engine_completion_error(e, 41), "");

    /* The engine keeps serving; the extent before is unchanged. */
    assert_int_equal(tio_engine_write(e, &c, pc.p, 64 * KIB), 0);
    assert_int_equal(tio_engine_read(e, &a, back.p, 64 * KIB), 0);
    assert_memory_equal(back.p, pa.p, 64 * KIB);
    assert_int_equal(tio_engine_read(e, &c, back.p, 64 * KIB), 0);
    assert_memory_equal(back.p, pc.p, 64 * KIB);
    assert_int_equal(tio_engine_write(e, &b, pb.p, 64 * KIB), 0);
    assert_int_equal(tio_engine_read(e, &b, back.p, 64 * KIB), 0);
    assert_memory_equal(back.p, pb.p, 64 * KIB);
    free(pa.base);
    free(pb.base);
    free(pc.base);
    free(back.base);
    tio_engine_destroy(e);
}

/* A failing read chunk fails the synchronous read; -ENOSPC from the disk is
 * passed through as is. */
static void test_injected_read_and_enospc(void **state)
{
    tio_backend backend = *(tio_backend *)*state;
    tio_engine *e = make_faulty(backend, "eio:read:2");
    tio_extent x;
    assert_int_equal(tio_engine_alloc(e, 2 * MIB, &x), 0);
    buf_t src = buf_new(2 * MIB, 0), dst = buf_new(2 * MIB, 0);
    fill(src.p, 2 * MIB, 4);
    assert_int_equal(tio_engine_write(e, &x, src.p, 2 * MIB), 0);
    assert_int_equal(tio_engine_read(e, &x, dst.p, 2 * MIB), -EIO); /* chunks 1, 2 */
    char want[PATH_MAX + 128];
    snprintf(want, sizeof want, "read from '%s' at offset %u (%u bytes): %s",
             tio_engine_backing_path(e, 0), MIB, MIB, strerror(EIO));
    assert_string_equal(tio_last_error(), want);
    assert_int_equal(tio_engine_read(e, &x, dst.p, 2 * MIB), 0);
    assert_memory_equal(dst.p, src.p, 2 * MIB);
    tio_engine_destroy(e);

    e = make_faulty(backend, "enospc:write:1");
    assert_int_equal(tio_engine_alloc(e, 4096, &x), 0);
    assert_int_equal(tio_engine_write(e, &x, src.p, 100), -ENOSPC);
    assert_int_equal(tio_engine_write(e, &x, src.p, 100), 0);
    assert_int_equal(tio_engine_read(e, &x, dst.p, 100), 0);
    assert_memory_equal(dst.p, src.p, 100);
    tio_engine_destroy(e);
    free(src.base);
    free(dst.base);
}

/* A chunk that reports half its bytes is completed by the retry logic. */
static void test_injected_short(void **state)
{
    tio_backend backend = *(tio_backend *)*state;
    static const char *faults[] = {"short:write:1", "short:write:2", "short:read:1",
                                   "short:read:2"};
    const uint64_t bytes = MIB + 123; /* chunk 1: 1 MiB, chunk 2: 123 bytes */
    for (int f = 0; f < 4; f++) {
        tio_engine *e = make_faulty(backend, faults[f]);
        tio_extent x;
        assert_int_equal(tio_engine_alloc(e, bytes, &x), 0);
        buf_t src = buf_new(bytes, 1), dst = buf_new(bytes, 0);
        fill(src.p, bytes, (uint32_t)f + 20);
        assert_int_equal(tio_engine_write(e, &x, src.p, bytes), 0);
        assert_int_equal(tio_engine_read(e, &x, dst.p, bytes), 0);
        assert_memory_equal(dst.p, src.p, bytes);
        check_guards(dst, bytes);
        free(src.base);
        free(dst.base);
        tio_engine_destroy(e);
    }
}

/* Test hooks out of range are refused, as spec strings and as values. */
static void test_bad_fault_spec(void **state)
{
    tio_engine_test_options t;
    static const char *const bad[] = {"eio:write:0", "melt:write:1", "delay:read:1:",
                                      "delay:read:1:x", "eio:read:1:5", "delay:read:1:60001",
                                      "short:read:2x", "eio:append:1", NULL};
    for (int i = 0; i < 9; i++) {
        assert_int_equal(tio_engine_test_options_parse(bad[i], &t), -EINVAL);
        assert_int_equal(t.fault, TIO_FAULT_NONE);
    }
    assert_string_equal(tio_last_error(), "fault '': expected <eio|enospc|short|delay>:"
                        "<read|write>:<N> with N >= 1 (delay: optionally :<MS> from 1 to 60000)");
    assert_int_equal(tio_engine_test_options_parse("delay:read:7:250", &t), 0);
    assert_int_equal(t.fault, TIO_FAULT_DELAY);
    assert_int_equal(t.fault_op, TIO_OP_READ);
    assert_int_equal(t.fault_nth, 7);
    assert_int_equal(t.fault_delay_ms, 250);

    tio_engine *e = NULL;
    const tio_engine_test_options wrong[] = {
        {.fault = TIO_FAULT_EIO, .fault_op = TIO_OP_WRITE, .fault_nth = 0},
        {.fault = TIO_FAULT_DELAY + 1, .fault_op = TIO_OP_WRITE, .fault_nth = 1},
        {.fault = TIO_FAULT_EIO, .fault_op = 2, .fault_nth = 1},
        {.fault = TIO_FAULT_EIO, .fault_op = TIO_OP_READ, .fault_nth = 1, .fault_delay_ms = 5},
        {.fault = TIO_FAULT_DELAY, .fault_op = TIO_OP_READ, .fault_nth = 1,
         .fault_delay_ms = 60001},
        {.probe_fail = 8},
    };
    for (int i = 0; i < 6; i++) {
        g_hooks = wrong[i];
        assert_int_equal(create_in(g_d0, TIO_BACKEND_PSYNC, &e), -EINVAL);
        assert_non_null(strstr(tio_last_error(), "engine test options: "));
        assert_null(e);
    }
    memset(&g_hooks, 0, sizeof g_hooks);
}

/* ---- allocator -------------------------------------------------------- */

static void test_alloc_first_fit_and_enospc(void **state)
{
    tio_engine *e = make_engine(TIO_BACKEND_PSYNC, 1, 64 * KIB, 0, 0, 0);
    tio_extent a, b, c, d, z;
    assert_int_equal(tio_engine_alloc(e, 30000, &a), 0);
    assert_int_equal(a.offset, 0);
    assert_int_equal(a.bytes, 32 * KIB);
    assert_int_equal(tio_engine_alloc(e, 32 * KIB, &b), 0);
    assert_int_equal(b.offset, 32 * KIB);
    assert_int_equal(tio_engine_alloc(e, 1, &z), -ENOSPC);
    assert_int_equal(tio_engine_free(e, &a), 0);
    assert_int_equal(tio_engine_alloc(e, 16 * KIB, &c), 0);
    assert_int_equal(c.offset, 0);
    assert_int_equal(tio_engine_alloc(e, 20 * KIB, &z), -ENOSPC);
    assert_int_equal(tio_engine_alloc(e, 16 * KIB, &d), 0);
    assert_int_equal(d.offset, 16 * KIB);
    assert_int_equal(tio_engine_alloc(e, 4096, &z), -ENOSPC);
    /* Holes [0, 16K) and [32K, 64K) around d: 20 KiB fits only the second. */
    assert_int_equal(tio_engine_free(e, &c), 0);
    assert_int_equal(tio_engine_free(e, &b), 0);
    assert_int_equal(tio_engine_alloc(e, 20 * KIB, &z), 0);
    assert_int_equal(z.offset, 32 * KIB);
    assert_int_equal(tio_engine_alloc(e, 8 * KIB, &a), 0);
    assert_int_equal(a.offset, 0); /* first fit: the lowest hole that fits */
    /* Free in any order: all ranges coalesce back into the whole space. */
    assert_int_equal(tio_engine_free(e, &z), 0);
    assert_int_equal(tio_engine_free(e, &a), 0);
    assert_int_equal(tio_engine_free(e, &d), 0);
    assert_int_equal(tio_engine_alloc(e, 64 * KIB, &z), 0);
    assert_int_equal(z.offset, 0);
    assert_int_equal(z.bytes, 64 * KIB);
    /* Errors. */
    assert_int_equal(tio_engine_free(e, &z), 0);
    assert_int_equal(tio_engine_free(e, &z), -EINVAL); /* double free */
    tio_extent bogus = {.offset = 4096, .bytes = 4096};
    assert_int_equal(tio_engine_free(e, &bogus), -EINVAL);
    assert_int_equal(tio_engine_alloc(e, 0, &z), -EINVAL);
    assert_int_equal(tio_engine_alloc(e, 64 * KIB + 1, &z), -ENOSPC);
    tio_engine_destroy(e);
}

static void test_request_checks(void **state)
{
    tio_engine *e = make_engine(TIO_BACKEND_PSYNC, 1, 64 * KIB, 0, 0, 0);
    tio_extent x;
    char buf[8192];
    assert_int_equal(tio_engine_alloc(e, 4096, &x), 0);
    assert_int_equal(tio_engine_submit_write(e, &x, buf, 4097, 1, false), -EINVAL);
    tio_extent outside = {.offset = 64 * KIB, .bytes = 4096};
    assert_int_equal(tio_engine_submit_read(e, &outside, buf, 10, 1, false), -EINVAL);
    tio_extent unaligned = {.offset = 100, .bytes = 4096};
    assert_int_equal(tio_engine_submit_read(e, &unaligned, buf, 10, 1, false), -EINVAL);
    tio_completion c;
    assert_int_equal(tio_engine_reap(e, &c, 1, 1), -EINVAL); /* nothing in flight */
    assert_int_equal(tio_engine_reap(e, &c, 1, 0), 0);
    assert_int_equal(tio_engine_in_flight(e), 0);
    tio_engine_destroy(e);
}

/* ---- creation, directories, backends ---------------------------------- */

static void test_dir_errors(void **state)
{
    tio_engine *e = NULL;
    char missing[PATH_MAX + 16], file[PATH_MAX + 16], under[PATH_MAX + 32], want[PATH_MAX + 96];
    snprintf(missing, sizeof missing, "%s/nope", g_root);
    assert_int_equal(create_in(missing, TIO_BACKEND_AUTO, &e), -ENOENT);
    snprintf(want, sizeof want, "ssd directory '%s' does not exist", missing);
    assert_string_equal(tio_last_error(), want);

    snprintf(file, sizeof file, "%s/file", g_root);
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fclose(f);
    assert_int_equal(create_in(file, TIO_BACKEND_AUTO, &e), -ENOTDIR);
    snprintf(want, sizeof want, "ssd directory '%s' is not a directory", file);
    assert_string_equal(tio_last_error(), want);

    snprintf(under, sizeof under, "%s/sub", file);
    assert_int_equal(create_in(under, TIO_BACKEND_AUTO, &e), -ENOTDIR);
    assert_non_null(strstr(tio_last_error(), under));

    /* A bad second directory: nothing is created in the first. */
    const char *dirs[2] = {g_d0, missing};
    tio_engine_options opt;
    tio_engine_options_default(&opt);
    opt.dirs = dirs;
    opt.n_dirs = 2;
    opt.space_bytes = MIB;
    assert_int_equal(tio_engine_create(&opt, &e), -ENOENT);
    assert_int_equal(rmdir(g_d0), 0);
    assert_int_equal(mkdir(g_d0, 0755), 0);
    assert_null(e);

    opt.n_dirs = 1;
    opt.stripe_bytes = 1000;
    assert_int_equal(tio_engine_create(&opt, &e), -EINVAL);
    opt.stripe_bytes = 0;
    opt.space_bytes = 0;
    assert_int_equal(tio_engine_create(&opt, &e), -EINVAL);
}

static void test_backing_files_lifecycle(void **state)
{
    tio_engine *a = make_engine(TIO_BACKEND_PSYNC, 2, 3 * MIB + 1, 0, 0, 0);
    tio_engine *b = make_engine(TIO_BACKEND_PSYNC, 2, MIB, 0, 0, 0);
    char pa[2][PATH_MAX], pb[PATH_MAX];
    struct stat st;
    for (uint32_t d = 0; d < 2; d++) {
        snprintf(pa[d], PATH_MAX, "%s", tio_engine_backing_path(a, d));
        assert_int_equal(stat(pa[d], &st), 0);
        assert_int_equal(st.st_size, 2 * MIB); /* 4 units of 1 MiB, 2 per dir */
    }
    assert_null(tio_engine_backing_path(a, 2));
    snprintf(pb, sizeof pb, "%s", tio_engine_backing_path(b, 0));
    assert_string_not_equal(pa[0], pb); /* unique per engine */
    tio_engine_destroy(a);
    for (uint32_t d = 0; d < 2; d++)
        assert_int_equal(stat(pa[d], &st), -1);
    assert_int_equal(stat(pb, &st), 0);
    tio_engine_destroy(b);
    assert_int_equal(stat(pb, &st), -1);
}

static void roundtrip_70000(tio_engine *e);

/* The number of teraio backing files in `dir`. */
static int count_backing_files(const char *dir)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    for (struct dirent *de; (de = readdir(d));)
        n += strncmp(de->d_name, "teraio.", 7) == 0;
    closedir(d);
    return n;
}

/* Issue 12, item 12: engine memory grew with the number of directories, not
 * with the space (a 32 MiB bounce slab each: 64 directories for a 1 MiB
 * engine took 2.1 GB; 1000 were OOM-killed and left 1000 files).  Bounce
 * buffers now follow each directory's share of the space and the queue
 * depth, under caps; more than TIO_ENGINE_MAX_DIRS directories are refused;
 * and a create that fails half-way leaves no file behind. */
static void test_engine_memory_grows_with_dirs(void **state)
{
    enum { N = TIO_ENGINE_MAX_DIRS + 1 };
    static char paths[N][PATH_MAX + 16];
    const char *dirs[N];
    for (int i = 0; i < N; i++) {
        snprintf(paths[i], sizeof paths[i], "%s/many%02d", g_root, i);
        assert_int_equal(mkdir(paths[i], 0755), 0);
        dirs[i] = paths[i];
    }
    tio_engine_options opt;
    tio_engine_options_default(&opt);
    opt.dirs = dirs;
    opt.n_dirs = N;
    opt.space_bytes = MIB;
    tio_engine *e = NULL;
    assert_int_equal(tio_engine_create(&opt, &e), -EINVAL);
    assert_string_equal(tio_last_error(), "engine: 65 ssd directories, at most 64");

    /* 64 directories, 1 MiB: one stripe unit, one bounce buffer in all. */
    opt.n_dirs = TIO_ENGINE_MAX_DIRS;
    assert_int_equal(tio_engine_create(&opt, &e), 0);
    uint64_t slab = 0;
    for (uint32_t i = 0; i < e->n_dirs; i++)
        slab += (uint64_t)e->dirs[i].n_bounce * e->bounce_bytes;
    assert_int_equal(slab, MIB);
    assert_int_equal(e->dirs[0].n_bounce, 1);
    assert_int_equal(e->dirs[1].n_bounce, 0);
    roundtrip_70000(e);
    tio_engine_destroy(e);

    /* 64 directories, 512 MiB (8 MiB each): 4 buffers each (256 MiB in all,
     * the cap);
     * 2 directories, 64 MiB: queue_depth (32) each, as before. */
    opt.space_bytes = 512 * MIB;
    assert_int_equal(tio_engine_create(&opt, &e), 0);
    assert_int_equal(e->dirs[63].n_bounce, 4);
    tio_engine_destroy(e);
    opt.n_dirs = 2;
    opt.space_bytes = 64 * MIB;
    assert_int_equal(tio_engine_create(&opt, &e), 0);
    assert_int_equal(e->dirs[0].n_bounce, 32);
    assert_int_equal(e->dirs[1].n_bounce, 32);
    tio_engine_destroy(e);

    /* Out of file descriptors half-way through 16 directories: -EMFILE, and
     * not one backing file stays. */
    struct rlimit old, low;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &old), 0);
    int probe = open("/dev/null", O_RDONLY);
    assert_true(probe >= 0);
    close(probe);
    low = old;
    low.rlim_cur = (rlim_t)probe + 12;
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
    opt.n_dirs = 16;
    opt.space_bytes = 16 * MIB;
    int rc = tio_engine_create(&opt, &e);
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &old), 0);
    assert_int_equal(rc, -EMFILE);
    assert_null(e);
    for (int i = 0; i < N; i++) {
        assert_int_equal(count_backing_files(paths[i]), 0);
        assert_int_equal(rmdir(paths[i]), 0);
    }
}

static int g_removed_logged;
static char g_removed_line[PATH_MAX + 200];

static void removed_log(void *ctx, int level, const char *msg)
{
    if (level == TIO_LOG_WARN && strstr(msg, "removed stale backing file")) {
        g_removed_logged++;
        snprintf(g_removed_line, sizeof g_removed_line, "%s", msg);
    }
}

/* Issue 12, item 13: a killed job's backing files were never removed, and
 * one with a predictable name (pid, counter) blocked a restart that got the
 * same pid ("File exists"; pid 1 in a container).  Each backing file is now
 * flock'ed while its engine lives; a new engine removes the ones whose lock
 * nobody holds and logs each; live engines' files and other users' files
 * stay. */
static void test_killed_job_backing_files_removed(void **state)
{
    /* A job killed with its engine open. */
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        tio_engine *e = NULL;
        _exit(create_in(g_d0, TIO_BACKEND_PSYNC, &e) == 0 ? 0 : 1);
    }
    int status;
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_int_equal(count_backing_files(g_d0), 1);
    /* Names the old scheme would give this process's engines, left unlocked. */
    char planted[PATH_MAX + 64], theirs[PATH_MAX + 64];
    for (int seq = 0; seq < 200; seq++) {
        snprintf(planted, sizeof planted, "%s/teraio.%ld.%d.0.data", g_d0, (long)getpid(), seq);
        int fd = open(planted, O_WRONLY | O_CREAT | O_EXCL, 0600);
        assert_true(fd >= 0);
        close(fd);
    }
    snprintf(theirs, sizeof theirs, "%s/teraio.1.ab.0.data", g_d0);
    int fd = open(theirs, O_WRONLY | O_CREAT | O_EXCL, 0600);
    assert_true(fd >= 0);
    close(fd);
    bool as_root = geteuid() == 0;
    if (as_root)
        assert_int_equal(chown(theirs, 65534, 65534), 0); /* another user's */
    tio_engine *live = NULL;
    tio_set_log(removed_log, NULL, TIO_LOG_DEBUG);
    assert_int_equal(create_in(g_d0, TIO_BACKEND_PSYNC, &live), 0);
    assert_int_equal(g_removed_logged, as_root ? 201 : 202);
    assert_non_null(strstr(g_removed_line, "no process holds its lock"));
    assert_int_equal(count_backing_files(g_d0), as_root ? 2 : 1);

    /* A second engine in the same directory leaves the live one alone. */
    g_removed_logged = 0;
    tio_engine *second = NULL;
    assert_int_equal(create_in(g_d0, TIO_BACKEND_PSYNC, &second), 0);
    tio_set_log(NULL, NULL, TIO_LOG_INFO);
    assert_int_equal(g_removed_logged, 0);
    struct stat st;
    assert_int_equal(stat(tio_engine_backing_path(live, 0), &st), 0);
    roundtrip_70000(live);
    tio_engine_destroy(second);
    tio_engine_destroy(live);
    assert_int_equal(count_backing_files(g_d0), as_root ? 1 : 0);
    unlink(theirs);
}

static bool has_prefix(const char *s, const char *prefix)
{
    size_t n = strlen(prefix);
    return strncmp(s, prefix, n) == 0 && (s[n] == '\0' || s[n] == ';');
}

static void test_backend_choice(void **state)
{
    tio_engine *e = NULL;
    assert_int_equal(create_in(g_d0, TIO_BACKEND_AUTO, &e), 0);
    tio_backend chosen = tio_engine_backend(e);
    print_message("auto backend here: %s (reason: \"%s\")\n", tio_backend_name(chosen),
                  tio_engine_backend_reason(e));
    assert_true(chosen == TIO_BACKEND_IO_URING || chosen == TIO_BACKEND_PSYNC);
    if (chosen == TIO_BACKEND_PSYNC)
        assert_true(strncmp(tio_engine_backend_reason(e), "psync: ", 7) == 0);
    tio_engine_destroy(e);

    assert_int_equal(create_in(g_d0, TIO_BACKEND_PSYNC, &e), 0);
    assert_int_equal(tio_engine_backend(e), TIO_BACKEND_PSYNC);
    /* Exact up to a "; buffered I/O: ..." note on file systems without O_DIRECT. */
    assert_true(has_prefix(tio_engine_backend_reason(e), "psync: requested in options"));
    tio_engine_destroy(e);

    assert_string_equal(tio_backend_name(TIO_BACKEND_AUTO), "auto");
    assert_string_equal(tio_backend_name(TIO_BACKEND_IO_URING), "io_uring");
    assert_string_equal(tio_backend_name(TIO_BACKEND_PSYNC), "psync");
}

/* TIO_ENGINE_BACKEND=psync forces the fallback over AUTO, and it works. */
static void test_forced_psync_fallback(void **state)
{
    tio_engine *e = NULL;
    setenv("TIO_ENGINE_BACKEND", "psync", 1);
    int rc = create_in(g_d0, TIO_BACKEND_AUTO, &e);
    unsetenv("TIO_ENGINE_BACKEND");
    assert_int_equal(rc, 0);
    assert_int_equal(tio_engine_backend(e), TIO_BACKEND_PSYNC);
    assert_true(has_prefix(tio_engine_backend_reason(e), "psync: forced by TIO_ENGINE_BACKEND"));
    tio_extent x;
    assert_int_equal(tio_engine_alloc(e, 70000, &x), 0);
    buf_t src = buf_new(70000, 1), dst = buf_new(70000, 1);
    fill(src.p, 70000, 8);
    assert_int_equal(tio_engine_write(e, &x, src.p, 70000), 0);
    assert_int_equal(tio_engine_read(e, &x, dst.p, 70000), 0);
    assert_memory_equal(dst.p, src.p, 70000);
    free(src.base);
    free(dst.base);
    tio_engine_destroy(e);

    setenv("TIO_ENGINE_BACKEND", "spdk", 1);
    assert_int_equal(create_in(g_d0, TIO_BACKEND_AUTO, &e), -EINVAL);
    unsetenv("TIO_ENGINE_BACKEND");
}


/* ---- every fault kind, with the rest of the space checked ------------- */

/* Six extents of assorted sizes laid out from offset 0 over two directories
 * with 64 KiB stripes and 64 KiB requests, so extent i's chunks are the
 * 64 KiB units it touches. */
enum { FM_N = 6, FM_VICTIM = 3 };
static const uint64_t fm_sizes[FM_N] = {100 * KIB + 3, 64 * KIB, 200 * KIB, 192 * KIB + 1,
                                        4 * KIB, 300 * KIB};

static uint64_t units_touched(const tio_extent *x, uint64_t bytes)
{
    uint64_t u = 64 * KIB;
    return (x->offset + bytes + u - 1) / u - x->offset / u;
}

static void fm_write_all(tio_engine *e, tio_extent *x, buf_t *src, int *result)
{
    for (int i = 0; i < FM_N; i++) {
        assert_int_equal(tio_engine_submit_write(e, &x[i], src[i].p, fm_sizes[i], (uint64_t)i,
                                                 false), 0);
        tio_completion c;
        assert_int_equal(tio_engine_reap(e, &c, 1, 1), 1);
        assert_int_equal(c.tag, (uint64_t)i);
        result[i] = c.result;
    }
}

static void fm_read_all(tio_engine *e, tio_extent *x, buf_t *dst, int *result)
{
    for (int i = 0; i < FM_N; i++) {
        memset(dst[i].p, 0x55, fm_sizes[i]);
        int rc = tio_engine_submit_read(e, &x[i], dst[i].p, fm_sizes[i], (uint64_t)i, false);
        if (rc == TIO_ECORRUPT) { /* its last write failed */
            result[i] = rc;
            continue;
        }
        assert_int_equal(rc, 0);
        tio_completion c;
        assert_int_equal(tio_engine_reap(e, &c, 1, 1), 1);
        assert_int_equal(c.tag, (uint64_t)i);
        result[i] = c.result;
    }
}

/* For each kind and direction: the fault hits the 3rd chunk of extent 3;
 * that request alone gets the expected result (and after a failed write,
 * reading it is TIO_ECORRUPT: it holds no valid data), every other extent
 * reads back exactly as written, and afterwards the engine serves extent 3
 * too. */
static void test_fault_matrix(void **state)
{
    tio_backend backend = *(tio_backend *)*state;
    static const char *const kinds[] = {"eio", "enospc", "short", "delay"};
    static const int expect[] = {-EIO, -ENOSPC, 0, 0};
    for (int k = 0; k < 4; k++) {
        for (int op = 0; op < 2; op++) {
            tio_extent probe[FM_N];
            uint64_t before = 0, off = 0;
            for (int i = 0; i < FM_N; i++) {
                probe[i] = (tio_extent){.offset = off, .bytes = (fm_sizes[i] + 4095) / 4096 * 4096};
                off += probe[i].bytes;
                if (i < FM_VICTIM)
                    before += units_touched(&probe[i], fm_sizes[i]);
            }
            assert_true(units_touched(&probe[FM_VICTIM], fm_sizes[FM_VICTIM]) >= 3);
            char spec[64];
            snprintf(spec, sizeof spec, "%s:%s:%llu%s", kinds[k], op ? "read" : "write",
                     (unsigned long long)before + 3, k == 3 ? ":30" : "");
            set_fault(spec);
            tio_engine *e = make_engine(backend, 2, 2 * MIB, 64 * KIB, 64 * KIB, 0);
            set_fault(NULL);
            tio_extent x[FM_N];
            buf_t src[FM_N], dst[FM_N];
            for (int i = 0; i < FM_N; i++) {
                assert_int_equal(tio_engine_alloc(e, fm_sizes[i], &x[i]), 0);
                assert_int_equal(x[i].offset, probe[i].offset);
                src[i] = buf_new(fm_sizes[i], i % 2);
                dst[i] = buf_new(fm_sizes[i], (i + 1) % 2);
                fill(src[i].p, fm_sizes[i], (uint32_t)(100 * k + 10 * op + i + 1));
            }
            int wres[FM_N], rres[FM_N];
            uint64_t t0 = tio_now_ns();
            fm_write_all(e, x, src, wres);
            fm_read_all(e, x, dst, rres);
            uint64_t elapsed_ms = (tio_now_ns() - t0) / 1000000u;
            for (int i = 0; i < FM_N; i++) {
                int want_w = op == 0 && i == FM_VICTIM ? expect[k] : 0;
                int want_r = i != FM_VICTIM || !expect[k] ? 0 : op == 1 ? expect[k] : TIO_ECORRUPT;
                if (wres[i] != want_w || rres[i] != want_r)
                    fail_msg("%s, extent %d: write %d (want %d), read %d (want %d)", spec, i,
                             wres[i], want_w, rres[i], want_r);
                bool undefined = i == FM_VICTIM && expect[k] != 0; /* failed write or read */
                if (!undefined)
                    assert_memory_equal(dst[i].p, src[i].p, fm_sizes[i]);
                check_guards(dst[i], fm_sizes[i]);
            }
            if (k == 3)
                assert_true(elapsed_ms >= 30);
            /* It keeps serving: the victim again, then everything once more. */
            assert_int_equal(tio_engine_write(e, &x[FM_VICTIM], src[FM_VICTIM].p,
                                              fm_sizes[FM_VICTIM]), 0);
            fm_read_all(e, x, dst, rres);
            for (int i = 0; i < FM_N; i++) {
                assert_int_equal(rres[i], 0);
                assert_memory_equal(dst[i].p, src[i].p, fm_sizes[i]);
                free(src[i].base);
                free(dst[i].base);
            }
            tio_engine_destroy(e);
        }
    }
}

/* An injected delay holds back one chunk only: a request submitted after
 * the delayed one completes first. */
static void test_delay_lets_others_pass(void **state)
{
    tio_backend backend = *(tio_backend *)*state;
    set_fault("delay:write:1:300");
    tio_engine *e = make_engine(backend, 1, 4 * MIB, 0, 0, 0);
    set_fault(NULL);
    tio_extent a, b;
    assert_int_equal(tio_engine_alloc(e, 8192, &a), 0);
    assert_int_equal(tio_engine_alloc(e, 8192, &b), 0);
    buf_t src = buf_new(8192, 0), dst = buf_new(8192, 0);
    fill(src.p, 8192, 31);
    uint64_t t0 = tio_now_ns();
    assert_int_equal(tio_engine_submit_write(e, &a, src.p, 8192, 1, false), 0);
    assert_int_equal(tio_engine_submit_write(e, &b, src.p, 8192, 2, false), 0);
    tio_completion c[2];
    assert_int_equal(tio_engine_reap(e, &c[0], 1, 1), 1);
    assert_int_equal(tio_engine_reap(e, &c[1], 1, 1), 1);
    assert_true(tio_now_ns() - t0 >= 300000000u);
    assert_int_equal(c[0].tag, 2);
    assert_int_equal(c[1].tag, 1);
    assert_int_equal(c[0].result, 0);
    assert_int_equal(c[1].result, 0);
    assert_int_equal(tio_engine_read(e, &a, dst.p, 8192), 0);
    assert_memory_equal(dst.p, src.p, 8192);
    free(src.base);
    free(dst.base);
    tio_engine_destroy(e);
}

/* Queue depth 1, four writes and four reads queued while a held-back write
 * (an injected delay) blocks the only slot: the backend alternates the
 * normal read and write queues, each in its own order.  Which kind goes
 * first depends on whether the worker took the first write before the rest
 * were queued; the alternation does not. */
static void test_read_write_queues_alternate(void **state)
{
    tio_backend backend = *(tio_backend *)*state;
    set_fault("delay:write:5:200");
    tio_engine *e = make_engine(backend, 1, 4 * MIB, 0, 0, 1);
    set_fault(NULL);
    tio_extent x[8];
    buf_t b = buf_new(8 * 4096, 0);
    fill(b.p, 8 * 4096, 3);
    for (int i = 0; i < 8; i++)
        assert_int_equal(tio_engine_alloc(e, 4096, &x[i]), 0);
    for (int i = 4; i < 8; i++)
        assert_int_equal(tio_engine_write(e, &x[i], b.p + i * 4096, 4096), 0);
    for (int i = 0; i < 4; i++)
        assert_int_equal(tio_engine_submit_write(e, &x[i], b.p + i * 4096, 4096,
                                                 (uint64_t)(10 + i), false), 0);
    buf_t r = buf_new(4 * 4096, 0);
    for (int i = 0; i < 4; i++)
        assert_int_equal(tio_engine_submit_read(e, &x[4 + i], r.p + i * 4096, 4096,
                                                (uint64_t)(20 + i), false), 0);
    uint64_t next[2] = {10, 20}, prev_kind = 2;
    for (int k = 0; k < 8; k++) {
        tio_completion c;
        assert_int_equal(tio_engine_reap(e, &c, 1, 1), 1);
        assert_int_equal(c.result, 0);
        uint64_t kind = c.tag >= 20;
        assert_int_equal(c.tag, next[kind]);
        assert_int_not_equal(kind, prev_kind);
        next[kind]++;
        prev_kind = kind;
    }
    assert_memory_equal(r.p, b.p + 4 * 4096, 4 * 4096);
    free(b.base);
    free(r.base);
    tio_engine_destroy(e);
}

/* ---- registered buffers ---------------------------------------------- */

static void test_registered_buffers(void **state)
{
    tio_backend backend = *(tio_backend *)*state;
    tio_engine *e = make_engine(backend, 2, 16 * MIB, 0, 0, 0);
    assert_int_equal(tio_engine_fixed_buffers(e), backend == TIO_BACKEND_IO_URING);
    assert_int_equal(tio_engine_fixed_files(e), backend == TIO_BACKEND_IO_URING);
    const uint64_t n = 5 * MIB;
    buf_t reg = buf_new(n, 0), plain = buf_new(n, 0);
    assert_int_equal(tio_engine_register_buffer(e, reg.p, n), 0);
    if (tio_engine_fixed_buffers(e)) {
        assert_int_equal(tio_engine_register_buffer(e, reg.p + 4096, 4096), -EINVAL);
        assert_int_equal(tio_engine_unregister_buffer(e, plain.p), -EINVAL);
    }
    assert_int_equal(tio_engine_register_buffer(e, NULL, 4096), -EINVAL);
    fill(reg.p, n, 41);
    tio_extent x, y;
    assert_int_equal(tio_engine_alloc(e, n, &x), 0);
    assert_int_equal(tio_engine_alloc(e, n, &y), 0);
    /* Whole buffer, a slice at an odd 4 KiB offset, an unaligned tail. */
    assert_int_equal(tio_engine_write(e, &x, reg.p, n), 0);
    assert_int_equal(tio_engine_write(e, &y, reg.p + 12288, n - 12288 - 7), 0);
    assert_int_equal(tio_engine_read(e, &x, plain.p, n), 0);
    assert_memory_equal(plain.p, reg.p, n);
    memcpy(plain.p, reg.p, n);
    assert_int_equal(tio_engine_read(e, &y, reg.p, n - 12288 - 7), 0);
    assert_memory_equal(reg.p, plain.p + 12288, n - 12288 - 7);
    assert_int_equal(tio_engine_unregister_buffer(e, reg.p), 0);
    assert_int_equal(tio_engine_read(e, &x, reg.p, n), 0);
    assert_memory_equal(reg.p, plain.p, n);
    free(reg.base);
    free(plain.base);
    tio_engine_destroy(e);
}

/* Registering asks for huge pages (MADV_HUGEPAGE, MADV_COLLAPSE), which
 * moves the region's bytes to other physical pages: not one may change, and
 * 1 MiB requests at every offset of a 2 MiB-aligned region (where the kernel
 * describes the fixed buffer by 2 MiB folios when it got them) must land and
 * come back exactly.  The bounce slab gets huge pages too: an unaligned
 * buffer goes through it.  Checksums off: requests cover parts of one
 * extent. */
static void test_registered_huge_pages(void **state)
{
    tio_backend backend = *(tio_backend *)*state;
    g_checksum_off = true;
    tio_engine *e = make_engine(backend, 1, 32 * MIB, 0, 0, 8);
    g_checksum_off = false;
    const uint64_t n = 8 * MIB;
    unsigned char *reg = aligned_alloc(2 * MIB, n);
    assert_non_null(reg);
    fill(reg, n, 77);
    buf_t want = buf_new(n, 0), got = buf_new(n, 1);
    memcpy(want.p, reg, n);
    assert_int_equal(tio_engine_register_buffer(e, reg, n), 0);
    assert_memory_equal(reg, want.p, n);
    tio_extent x;
    assert_int_equal(tio_engine_alloc(e, n, &x), 0);
    for (uint64_t off = 0; off < n; off += MIB) {
        tio_extent part = {.offset = x.offset + off, .bytes = MIB};
        assert_int_equal(tio_engine_submit_write(e, &part, reg + off, MIB, off, false), 0);
    }
    tio_completion c[8];
    assert_int_equal(tio_engine_reap(e, c, 8, 8), 8);
    for (int i = 0; i < 8; i++)
        assert_int_equal(c[i].result, 0);
    assert_int_equal(tio_engine_read(e, &x, got.p, n), 0);
    assert_memory_equal(got.p, want.p, n);
    check_guards(got, n);
    memset(reg, 0, n);
    for (uint64_t off = n; off > 0; off -= MIB) {
        tio_extent part = {.offset = x.offset + off - MIB, .bytes = MIB};
        assert_int_equal(tio_engine_submit_read(e, &part, reg + off - MIB, MIB, off, true), 0);
    }
    assert_int_equal(tio_engine_reap(e, c, 8, 8), 8);
    for (int i = 0; i < 8; i++)
        assert_int_equal(c[i].result, 0);
    assert_memory_equal(reg, want.p, n);
    assert_int_equal(tio_engine_unregister_buffer(e, reg), 0);
    free(reg);
    free(want.base);
    free(got.base);
    tio_engine_destroy(e);
}

/* ---- probe fallbacks, forced ------------------------------------------ */

static tio_engine *create_with_probe_fail(uint32_t what, tio_backend backend)
{
    g_hooks.probe_fail = what;
    tio_engine *e = NULL;
    int rc = create_in(g_d0, backend, &e);
    g_hooks.probe_fail = 0;
    if (rc)
        print_error("create: %s\n", tio_last_error());
    assert_int_equal(rc, 0);
    return e;
}

static void roundtrip_70000(tio_engine *e)
{
    tio_extent x;
    assert_int_equal(tio_engine_alloc(e, 70000, &x), 0);
    buf_t src = buf_new(70000, 1), dst = buf_new(70000, 0);
    fill(src.p, 70000, 12);
    assert_int_equal(tio_engine_write(e, &x, src.p, 70000), 0);
    assert_int_equal(tio_engine_read(e, &x, dst.p, 70000), 0);
    assert_memory_equal(dst.p, src.p, 70000);
    free(src.base);
    free(dst.base);
}

static void test_probe_refusals(void **state)
{
    char want[PATH_MAX + 64];
    /* O_DIRECT refused: buffered I/O, said so, and it works. */
    tio_engine *e = create_with_probe_fail(TIO_PROBE_FAIL_ODIRECT, TIO_BACKEND_AUTO);
    snprintf(want, sizeof want, "buffered I/O: O_DIRECT refused by %s", g_d0);
    assert_non_null(strstr(tio_engine_backend_reason(e), want));
    roundtrip_70000(e);
    tio_engine_destroy(e);

    /* io_uring refused: the thread pool, with the reason. */
    e = create_with_probe_fail(TIO_PROBE_FAIL_URING, TIO_BACKEND_AUTO);
    assert_int_equal(tio_engine_backend(e), TIO_BACKEND_PSYNC);
    assert_string_equal(tio_engine_backend_reason(e), "psync: io_uring_queue_init: Operation not "
                        "permitted (forced by a test hook)");
    roundtrip_70000(e);
    tio_engine_destroy(e);
    g_hooks.probe_fail = TIO_PROBE_FAIL_URING;
    assert_int_equal(create_in(g_d0, TIO_BACKEND_IO_URING, &e), -EPROTONOSUPPORT);
    g_hooks.probe_fail = 0;

    /* Registration over RLIMIT_MEMLOCK: io_uring without fixed buffers, a
     * message naming the limit and the fix. */
    e = NULL;
    if (create_in(g_d0, TIO_BACKEND_IO_URING, &e) == -EPROTONOSUPPORT) {
        print_message("io_uring refused here, memlock case skipped\n");
    } else {
        tio_engine_destroy(e);
        e = create_with_probe_fail(TIO_PROBE_FAIL_MEMLOCK, TIO_BACKEND_IO_URING);
        assert_false(tio_engine_fixed_buffers(e));
        assert_true(tio_engine_fixed_files(e));
        const char *why = tio_engine_backend_reason(e);
        assert_non_null(strstr(why, "fixed buffers off: io_uring could not pin"));
        assert_non_null(strstr(why, "RLIMIT_MEMLOCK is "));
        assert_non_null(strstr(why, "ulimit -l unlimited"));
        assert_non_null(strstr(why, "(forced by a test hook)"));
        buf_t b = buf_new(4096, 0);
        assert_int_equal(tio_engine_register_buffer(e, b.p, 4096), 0); /* records nothing */
        roundtrip_70000(e);
        free(b.base);
        tio_engine_destroy(e);
    }

    /* All three at once. */
    e = create_with_probe_fail(TIO_PROBE_FAIL_ODIRECT | TIO_PROBE_FAIL_URING |
                               TIO_PROBE_FAIL_MEMLOCK, TIO_BACKEND_AUTO);
    assert_int_equal(tio_engine_backend(e), TIO_BACKEND_PSYNC);
    roundtrip_70000(e);
    tio_engine_destroy(e);
}

/* ---- checksums -------------------------------------------------------- */

static void test_crc32c_values(void **state)
{
    assert_int_equal(tio_crc32c(0, "123456789", 9), 0xE3069283u);
    assert_int_equal(tio_crc32c_sw(0, "123456789", 9), 0xE3069283u);
    assert_int_equal(tio_crc32c(0, "", 0), 0);
    unsigned char zeros[32] = {0};
    assert_int_equal(tio_crc32c(0, zeros, 32), 0x8A9136AAu); /* RFC 3720 B.4 */
    buf_t b = buf_new(100000, 0);
    fill(b.p, 100000, 9);
    for (size_t off = 0; off < 9; off++) {
        size_t n = 100000 - 2 * off;
        uint32_t hw = tio_crc32c(0, b.p + off, n);
        assert_int_equal(hw, tio_crc32c_sw(0, b.p + off, n));
        /* Continuation: crc(a || b) from crc(a). */
        assert_int_equal(tio_crc32c(tio_crc32c(0, b.p + off, 777), b.p + off + 777, n - 777), hw);
    }
    /* Lengths around the three-stream blocks (3 x 256, 3 x 8192 bytes). */
    static const size_t lens[] = {767, 768, 769, 775, 776, 24575, 24576, 24577, 49921, 99999};
    for (int i = 0; i < 10; i++)
        assert_int_equal(tio_crc32c(0, b.p + 3, lens[i]), tio_crc32c_sw(0, b.p + 3, lens[i]));
    free(b.base);
}

static tio_engine *make_checked(tio_backend backend)
{
    const char *dirs[2] = {g_d0, g_d1};
    tio_engine_options opt;
    tio_engine_options_default(&opt);
    opt.dirs = dirs;
    opt.n_dirs = 2;
    opt.space_bytes = 8 * MIB;
    opt.stripe_bytes = 64 * KIB;
    opt.backend = backend;
    opt.checksum = true;
    tio_engine *e = NULL;
    int rc = tio_engine_create_test(&opt, &g_hooks, &e);
    if (rc == -EPROTONOSUPPORT)
        skip();
    assert_int_equal(rc, 0);
    return e;
}

/* A byte flipped in a backing file: the read fails with TIO_ECORRUPT naming
 * the file, the offset of the chunk that holds it, the tag and the extent;
 * the neighbour is unaffected; rewriting heals. */
static void test_checksum_detects_corruption(void **state)
{
    tio_backend backend = *(tio_backend *)*state;
    tio_engine *e = make_checked(backend);
    const uint64_t n = 200 * KIB + 11;
    tio_extent pad, x, y;
    assert_int_equal(tio_engine_alloc(e, 4096, &pad), 0);
    assert_int_equal(tio_engine_alloc(e, n, &x), 0);
    assert_int_equal(tio_engine_alloc(e, n, &y), 0);
    buf_t src = buf_new(n, 1), dst = buf_new(n, 0);
    fill(src.p, n, 77);
    assert_int_equal(tio_engine_write(e, &x, src.p, n), 0);
    assert_int_equal(tio_engine_write(e, &y, src.p, n), 0);
    assert_int_equal(tio_engine_read(e, &x, dst.p, n), 0);
    assert_memory_equal(dst.p, src.p, n);

    /* Logical byte x.offset + 70000 is in stripe unit 1 (dir 1), file offset
     * (70000 + 4096) - 65536. */
    uint64_t o = x.offset + 70000;
    assert_int_equal((o / (64 * KIB)) % 2, 1);
    int fd = open(tio_engine_backing_path(e, 1), O_RDWR);
    assert_true(fd >= 0);
    unsigned char flipped = (unsigned char)(src.p[70000] ^ 0x20);
    assert_int_equal(pwrite(fd, &flipped, 1, (off_t)(o - 64 * KIB)), 1);
    fsync(fd);
    close(fd);

    assert_int_equal(tio_engine_submit_read(e, &x, dst.p, n, 1234, false), 0);
    tio_completion c;
    assert_int_equal(tio_engine_reap(e, &c, 1, 1), 1);
    assert_int_equal(c.tag, 1234);
    assert_int_equal(c.result, TIO_ECORRUPT);
    assert_int_equal(dst.p[70000], flipped);
    /* The failing chunk is logical [64 KiB, 128 KiB): bytes [60 KiB, 124 KiB)
     * of x, at offset 0 of dir 1's file. */
    char want[PATH_MAX + 256];
    uint64_t in_x = 64 * KIB - x.offset;
    snprintf(want, sizeof want, "read from '%s' at offset 0 (65536 bytes): CRC32C mismatch "
             "(written 0x%08x, read 0x%08x); tag 1234, extent at offset %llu (%llu bytes)",
             tio_engine_backing_path(e, 1), tio_crc32c(0, src.p + in_x, 64 * KIB),
             tio_crc32c(0, dst.p + in_x, 64 * KIB), (unsigned long long)x.offset,
             (unsigned long long)x.bytes);
    assert_string_equal(tio_engine_completion_error(e, 1234), want);
    assert_string_equal(tio_last_error(), want);
    assert_int_equal(tio_engine_read(e, &x, dst.p, n), TIO_ECORRUPT);
    /* A shorter read is not checked; the neighbour is intact. */
    assert_int_equal(tio_engine_read(e, &x, dst.p, 4096), 0);
    assert_int_equal(tio_engine_read(e, &y, dst.p, n), 0);
    assert_memory_equal(dst.p, src.p, n);
    /* Rewriting the extent heals it. */
    assert_int_equal(tio_engine_write(e, &x, src.p, n), 0);
    assert_int_equal(tio_engine_read(e, &x, dst.p, n), 0);
    assert_memory_equal(dst.p, src.p, n);
    /* With checksums on, requests must name an allocated extent. */
    tio_extent part = {.offset = x.offset, .bytes = 4096};
    assert_int_equal(tio_engine_submit_read(e, &part, dst.p, 4096, 1, false), -EINVAL);
    free(src.base);
    free(dst.base);
    tio_engine_destroy(e);
}

/* Issue 12, item 2: a backing file truncated to 0 or overwritten with zeros
 * while the engine is live gave other bytes and no error, because checksums
 * were off by default.  With the default options, each read of a damaged
 * extent fails with TIO_ECORRUPT naming the file and the offset. */
static void test_backing_file_truncated_or_zeroed(void **state)
{
    tio_backend backend = *(tio_backend *)*state;
    tio_engine *e = NULL;
    int rc = create_in(g_d0, backend, &e); /* tio_engine_options_default */
    if (rc == -EPROTONOSUPPORT)
        skip();
    assert_int_equal(rc, 0);
    const uint64_t n = 256 * KIB;
    tio_extent a, b;
    assert_int_equal(tio_engine_alloc(e, n, &a), 0);
    assert_int_equal(tio_engine_alloc(e, n, &b), 0);
    assert_int_equal(b.offset, n);
    buf_t pa = buf_new(n, 0), pb = buf_new(n, 1), back = buf_new(n, 0);
    fill(pa.p, n, 61);
    fill(pb.p, n, 62);
    assert_int_equal(tio_engine_write(e, &a, pa.p, n), 0);
    assert_int_equal(tio_engine_write(e, &b, pb.p, n), 0);
    const char *file = tio_engine_backing_path(e, 0);
    char want[PATH_MAX + 64];

    /* Truncated to 0, then b written again: a now reads as a hole. */
    assert_int_equal(truncate(file, 0), 0);
    assert_int_equal(tio_engine_write(e, &b, pb.p, n), 0);
    memset(back.p, 0x33, n);
    assert_int_equal(tio_engine_read(e, &a, back.p, n), TIO_ECORRUPT);
    snprintf(want, sizeof want, "read from '%s' at offset 0 (%llu bytes): CRC32C mismatch", file,
             (unsigned long long)n);
    assert_int_equal(strncmp(tio_last_error(), want, strlen(want)), 0);
    assert_int_equal(tio_engine_read(e, &b, back.p, n), 0);
    assert_memory_equal(back.p, pb.p, n);

    /* Overwritten with zeros. */
    int fd = open(file, O_WRONLY);
    assert_true(fd >= 0);
    unsigned char *zeros = calloc(1, 2 * n);
    assert_non_null(zeros);
    assert_int_equal(pwrite(fd, zeros, 2 * n, 0), (ssize_t)(2 * n));
    fsync(fd);
    close(fd);
    free(zeros);
    assert_int_equal(tio_engine_read(e, &b, back.p, n), TIO_ECORRUPT);
    snprintf(want, sizeof want, "read from '%s' at offset %llu (%llu bytes): CRC32C mismatch",
             file, (unsigned long long)n, (unsigned long long)n);
    assert_int_equal(strncmp(tio_last_error(), want, strlen(want)), 0);
    free(pa.base);
    free(pb.base);
    free(back.base);
    tio_engine_destroy(e);
}

/* A write that failed leaves no data that passes for stored: reading the
 * extent is TIO_ECORRUPT until a write succeeds. */
static void test_checksum_failed_write(void **state)
{
    tio_backend backend = *(tio_backend *)*state;
    set_fault("eio:write:2");
    tio_engine *e = make_checked(backend);
    set_fault(NULL);
    const uint64_t n = 128 * KIB;
    tio_extent x;
    assert_int_equal(tio_engine_alloc(e, n, &x), 0);
    buf_t src = buf_new(n, 0), dst = buf_new(n, 0);
    fill(src.p, n, 5);
    assert_int_equal(tio_engine_write(e, &x, src.p, n), -EIO);
    assert_int_equal(tio_engine_submit_read(e, &x, dst.p, n, 9, false), TIO_ECORRUPT);
    char want[160];
    snprintf(want, sizeof want, "read of tag 9: extent at offset %llu (%llu bytes): its last "
             "write failed, it holds no valid data", (unsigned long long)x.offset,
             (unsigned long long)x.bytes);
    assert_string_equal(tio_last_error(), want);
    assert_int_equal(tio_engine_write(e, &x, src.p, n), 0);
    assert_int_equal(tio_engine_read(e, &x, dst.p, n), 0);
    assert_memory_equal(dst.p, src.p, n);
    free(src.base);
    free(dst.base);
    tio_engine_destroy(e);
}

/* ---- space accounting ------------------------------------------------- */

static void test_space_stats(void **state)
{
    tio_engine *e = make_engine(TIO_BACKEND_PSYNC, 2, MIB, 0, 0, 0);
    tio_engine_space sp;
    tio_engine_space_stats(e, &sp);
    assert_int_equal(sp.space_bytes, MIB);
    assert_int_equal(sp.free_bytes, MIB);
    assert_int_equal(sp.largest_free_bytes, MIB);
    assert_int_equal(sp.free_extents, 1);
    assert_int_equal(sp.used_extents, 0);
    tio_extent x[8];
    for (int i = 0; i < 8; i++)
        assert_int_equal(tio_engine_alloc(e, 100 * KIB, &x[i]), 0); /* 25 pages each */
    for (int i = 0; i < 8; i += 2)
        assert_int_equal(tio_engine_free(e, &x[i]), 0);
    tio_engine_space_stats(e, &sp);
    /* Free: four 100 KiB holes plus the 224 KiB tail. */
    assert_int_equal(sp.free_bytes, 4 * 100 * KIB + (MIB - 800 * KIB));
    assert_int_equal(sp.largest_free_bytes, MIB - 800 * KIB);
    assert_int_equal(sp.free_extents, 5);
    assert_int_equal(sp.used_extents, 4);
    tio_extent big;
    assert_int_equal(tio_engine_alloc(e, 300 * KIB, &big), -ENOSPC); /* fragmented */
    assert_int_equal(tio_engine_free(e, &x[7]), 0);
    tio_engine_space_stats(e, &sp);
    assert_int_equal(sp.largest_free_bytes, MIB - 600 * KIB); /* x[6], x[7], tail merged */
    assert_int_equal(sp.free_extents, 4);
    assert_int_equal(sp.used_extents, 3);
    assert_int_equal(tio_engine_alloc(e, 300 * KIB, &big), 0);
    assert_int_equal(big.offset, 600 * KIB);
    tio_engine_destroy(e);
}

#define BOTH(f) cmocka_unit_test_prestate(f, &g_uring), cmocka_unit_test_prestate(f, &g_psync)

int main(void)
{
    const struct CMUnitTest tests[] = {
        BOTH(test_roundtrip_sizes),
        BOTH(test_read_prefix),
        BOTH(test_striping_layout),
        BOTH(test_many_in_flight),
        BOTH(test_urgent_overtakes),
        BOTH(test_sync_keeps_other_completions),
        BOTH(test_destroy_with_requests_in_flight),
        BOTH(test_injected_eio_write),
        BOTH(test_injected_read_and_enospc),
        BOTH(test_injected_short),
        BOTH(test_fault_matrix),
        BOTH(test_delay_lets_others_pass),
        BOTH(test_read_write_queues_alternate),
        BOTH(test_registered_buffers),
        BOTH(test_registered_huge_pages),
        BOTH(test_checksum_detects_corruption),
        BOTH(test_checksum_failed_write),
        BOTH(test_backing_file_truncated_or_zeroed),
        cmocka_unit_test(test_probe_refusals),
        cmocka_unit_test(test_crc32c_values),
        cmocka_unit_test(test_space_stats),
        cmocka_unit_test(test_bad_fault_spec),
        cmocka_unit_test(test_alloc_first_fit_and_enospc),
        cmocka_unit_test(test_request_checks),
        cmocka_unit_test(test_dir_errors),
        cmocka_unit_test(test_backing_files_lifecycle),
        cmocka_unit_test(test_engine_memory_grows_with_dirs),
        cmocka_unit_test(test_killed_job_backing_files_removed),
        cmocka_unit_test(test_backend_choice),
        cmocka_unit_test(test_forced_psync_fallback),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
