/*
 * tests/c/test_engine.c — the storage engine, end to end on real files.
 *
 * Every test asserts a checkable value: byte equality after a write/read
 * round trip (aligned and unaligned buffers, lengths around the 4 KiB and
 * request boundaries), the exact placement of bytes in the backing files
 * given by the striping formula, exact extent offsets from the allocator,
 * exact error codes and messages.  Data-path tests run once per backend
 * (io_uring, psync).  Faults are injected through TIO_ENGINE_FAULT.
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
#include <sys/stat.h>

#include "teraio/engine.h"

#define KIB 1024u
#define MIB (1024u * 1024u)

static char g_root[PATH_MAX], g_d0[PATH_MAX + 8], g_d1[PATH_MAX + 8];
static tio_backend g_uring = TIO_BACKEND_IO_URING, g_psync = TIO_BACKEND_PSYNC;

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
    const char *base = getenv("TIO_TEST_TMPDIR");
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
    opt.capacity_bytes = capacity;
    if (stripe)
        opt.stripe_bytes = stripe;
    if (request)
        opt.request_bytes = request;
    if (queue_depth)
        opt.queue_depth = queue_depth;
    opt.backend = backend;
    tio_engine *e = NULL;
    int rc = tio_engine_create(&opt, &e);
    if (rc == -EPROTONOSUPPORT && backend == TIO_BACKEND_IO_URING) {
        print_message("io_uring refused here, test skipped: %s\n", tio_last_error());
        skip();
    }
    if (rc)
        print_error("create: %s\n", tio_last_error());
    assert_int_equal(rc, 0);
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
    opt.capacity_bytes = MIB;
    opt.backend = backend;
    return tio_engine_create(&opt, e);
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
    setenv("TIO_ENGINE_FAULT", fault, 1);
    tio_engine *e = make_engine(backend, 1, 8 * MIB, 0, 0, 0);
    unsetenv("TIO_ENGINE_FAULT");
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

static void test_bad_fault_spec(void **state)
{
    tio_engine *e = NULL;
    setenv("TIO_ENGINE_FAULT", "eio:write:0", 1);
    assert_int_equal(create_in(g_d0, TIO_BACKEND_PSYNC, &e), -EINVAL);
    setenv("TIO_ENGINE_FAULT", "melt:write:1", 1);
    assert_int_equal(create_in(g_d0, TIO_BACKEND_PSYNC, &e), -EINVAL);
    assert_string_equal(tio_last_error(), "TIO_ENGINE_FAULT='melt:write:1': expected "
                        "<eio|enospc|short>:<read|write>:<N> with N >= 1");
    unsetenv("TIO_ENGINE_FAULT");
    assert_null(e);
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
    opt.capacity_bytes = MIB;
    assert_int_equal(tio_engine_create(&opt, &e), -ENOENT);
    assert_int_equal(rmdir(g_d0), 0);
    assert_int_equal(mkdir(g_d0, 0755), 0);
    assert_null(e);

    opt.n_dirs = 1;
    opt.stripe_bytes = 1000;
    assert_int_equal(tio_engine_create(&opt, &e), -EINVAL);
    opt.stripe_bytes = 0;
    opt.capacity_bytes = 0;
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
        cmocka_unit_test(test_bad_fault_spec),
        cmocka_unit_test(test_alloc_first_fit_and_enospc),
        cmocka_unit_test(test_request_checks),
        cmocka_unit_test(test_dir_errors),
        cmocka_unit_test(test_backing_files_lifecycle),
        cmocka_unit_test(test_backend_choice),
        cmocka_unit_test(test_forced_psync_fallback),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
