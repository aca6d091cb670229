/*
 * tests/c/test_staging.c — the pinned staging ring (src/gpu/staging.c)
 * on the CPU, with the stand-in libcudart (host memcpy on stream threads)
 * in place of CUDA.
 *
 * What is proven, each by a value a reader can check: device bytes survive
 * a round trip through the ring for lengths around 4 KiB, the engine chunk
 * and the slot, on both backends and over two directories; a tensor larger
 * than a slot moves in exactly ceil(bytes / chunk) copies per direction; the
 * ring is pinned and registered once (one cudaHostRegister, no pageable
 * copy, two copy streams); an offload copies the bytes a kernel queued
 * before it wrote, a prefetch lands after the kernels still using its
 * memory; an urgent prefetch overtakes queued ones; configurations that
 * cannot work are refused with the number they need; a failed or corrupted
 * disk transfer fails the request with the engine's message; the ring's
 * thread runs on the engine's device.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <sys/resource.h>

#include "gpu_test.h"

static tio_backend g_uring = TIO_BACKEND_IO_URING, g_psync = TIO_BACKEND_PSYNC;

/* ---- data path -------------------------------------------------------- */

static void test_staging_roundtrip_sizes(void **state)
{
    tio_backend backend = *(tio_backend *)*state;
    static const uint64_t sizes[] = {1, 4095, 4096, 4097, MIB, MIB + 123, 5 * MIB + 7};
    enum { N = sizeof sizes / sizeof sizes[0] };
    tio_engine *e = gpu_engine(backend, 2, 64 * MIB, 0, NULL);
    attach_staging(e, 3 * MIB, MIB); /* 3 slots of 1 MiB: 2 offload, 1 prefetch */
    tio_extent x[N];
    void *src[N], *dst[N];
    for (int i = 0; i < N; i++) {
        assert_int_equal(tio_engine_alloc(e, sizes[i], &x[i]), 0);
        src[i] = dev_new(sizes[i], (uint32_t)i + 1);
        dst[i] = dev_new(sizes[i], 0);
        assert_int_equal(tio_engine_submit_write(e, &x[i], src[i], sizes[i], i, false), 0);
    }
    reap_all(e, N, NULL);
    for (int i = 0; i < N; i++)
        assert_int_equal(tio_engine_submit_read(e, &x[i], dst[i], sizes[i], i, false), 0);
    reap_all(e, N, NULL);
    uint64_t total = 0;
    for (int i = 0; i < N; i++) {
        assert_dev_bytes(dst[i], sizes[i], (uint32_t)i + 1, 0);
        total += sizes[i];
        cuda.Free(src[i]);
        cuda.Free(dst[i]);
    }
    tio_engine_gpu_stats st;
    tio_engine_gpu_get_stats(e, &st);
    assert_int_equal(st.staged_offload_bytes, total);
    assert_int_equal(st.staged_prefetch_bytes, total);
    assert_int_equal(st.slots_offload, 2);
    assert_int_equal(st.slots_prefetch, 1);
    assert_int_equal(st.unchecked_bytes, 0);
    tio_engine_destroy(e);
}

/* The synchronous helpers take device pointers too. */
static void test_staging_sync_helpers(void **state)
{
    tio_engine *e = gpu_engine(TIO_BACKEND_PSYNC, 1, 8 * MIB, 0, NULL);
    attach_staging(e, 2 * MIB, MIB);
    tio_extent x;
    assert_int_equal(tio_engine_alloc(e, 3 * MIB + 5, &x), 0);
    void *src = dev_new(3 * MIB + 5, 7), *dst = dev_new(3 * MIB + 5, 0);
    assert_int_equal(tio_engine_write(e, &x, src, 3 * MIB + 5), 0);
    assert_int_equal(tio_engine_read(e, &x, dst, 3 * MIB + 5), 0);
    assert_dev_bytes(dst, 3 * MIB + 5, 7, 0);
    cuda.Free(src);
    cuda.Free(dst);
    tio_engine_destroy(e);
}

/* A 5 MiB + 7 tensor through 1 MiB slots: 6 copies each way, one pinning
 * of the ring, no pageable copy, two streams, one unpinning at the end. */
static void test_staging_chunks_larger_than_slot(void **state)
{
    standin_cuda_stats before, after;
    cuda.get_stats(&before);
    tio_engine *e = gpu_engine(TIO_BACKEND_IO_URING, 1, 16 * MIB, 0, NULL);
    attach_staging(e, 2 * MIB, MIB);
    uint64_t n = 5 * MIB + 7;
    tio_extent x;
    assert_int_equal(tio_engine_alloc(e, n, &x), 0);
    void *src = dev_new(n, 3), *dst = dev_new(n, 0);
    cuda.get_stats(&before); /* after dev_new's own copies */
    assert_int_equal(tio_engine_write(e, &x, src, n), 0);
    assert_int_equal(tio_engine_read(e, &x, dst, n), 0);
    cuda.get_stats(&after);
    assert_int_equal(after.copies - before.copies, 12);
    assert_int_equal(after.d2h_bytes - before.d2h_bytes, n);
    assert_int_equal(after.h2d_bytes - before.h2d_bytes, n);
    assert_int_equal(after.pageable_copies, 0);
    assert_int_equal(after.host_registers - before.host_registers, 0); /* pinned at attach */
    tio_engine_gpu_stats st;
    tio_engine_gpu_get_stats(e, &st);
    assert_int_equal(st.copies, 12);
    assert_int_equal(st.pinned_bytes, 2 * MIB);
    assert_int_equal(st.chunk_bytes, MIB);
    assert_true(st.slots_offload == 1 && st.slots_prefetch == 1 && !st.slots_shared);
    assert_int_equal(st.ring_fixed_buffer, tio_engine_fixed_buffers(e));
    assert_dev_bytes(dst, n, 3, 0);
    cuda.Free(src);
    cuda.Free(dst);
    standin_cuda_stats mid;
    cuda.get_stats(&mid);
    tio_engine_destroy(e);
    cuda.get_stats(&after);
    assert_int_equal(after.host_unregisters - mid.host_unregisters, 1);
    assert_int_equal(after.registered_ranges, 0);
}

/* Attach pins the ring once and creates two copy streams. */
static void test_staging_pinned_once(void **state)
{
    standin_cuda_stats a, b;
    cuda.get_stats(&a);
    tio_engine *e = gpu_engine(TIO_BACKEND_PSYNC, 1, 8 * MIB, 0, NULL);
    attach_staging(e, 0, 0); /* defaults: 256 MiB in 6 slots of 42 MiB */
    cuda.get_stats(&b);
    assert_int_equal(b.host_registers - a.host_registers, 1);
    assert_int_equal(b.streams - a.streams, 2);
    tio_engine_gpu_stats st;
    tio_engine_gpu_get_stats(e, &st);
    assert_int_equal(st.chunk_bytes, 42 * MIB);
    assert_int_equal(st.pinned_bytes, 6 * 42ull * MIB);
    assert_true(st.slots_offload == 3 && st.slots_prefetch == 3);
    assert_non_null(strstr(tio_engine_gpu_reason(e), "staging ring: 6 slot(s) of 42.00 MiB"));
    tio_engine_destroy(e);
}

/* One slot for both directions still moves everything. */
static void test_staging_one_shared_slot(void **state)
{
    tio_engine *e = gpu_engine(TIO_BACKEND_PSYNC, 2, 16 * MIB, 0, NULL);
    attach_staging(e, MIB, MIB);
    tio_engine_gpu_stats st;
    tio_engine_gpu_get_stats(e, &st);
    assert_true(st.slots_shared);
    tio_extent x[3];
    void *src[3], *dst[3];
    for (int i = 0; i < 3; i++) {
        assert_int_equal(tio_engine_alloc(e, 2 * MIB + 100, &x[i]), 0);
        src[i] = dev_new(2 * MIB + 100, 20 + i);
        dst[i] = dev_new(2 * MIB + 100, 0);
        assert_int_equal(tio_engine_submit_write(e, &x[i], src[i], 2 * MIB + 100, i, i == 1), 0);
    }
    reap_all(e, 3, NULL);
    for (int i = 0; i < 3; i++)
        assert_int_equal(tio_engine_submit_read(e, &x[i], dst[i], 2 * MIB + 100, i, i == 2), 0);
    reap_all(e, 3, NULL);
    for (int i = 0; i < 3; i++) {
        assert_dev_bytes(dst[i], 2 * MIB + 100, 20 + i, 0);
        cuda.Free(src[i]);
        cuda.Free(dst[i]);
    }
    tio_engine_destroy(e);
}

/* ---- ordering ----------------------------------------------------------- */

/* An offload copies what a kernel queued before it wrote (gpu_test.h). */
static void test_staging_offload_waits_for_compute_stream(void **state)
{
    tio_engine *e = gpu_engine(TIO_BACKEND_PSYNC, 1, 8 * MIB, 0, NULL);
    attach_staging(e, 2 * MIB, MIB);
    check_offload_waits_for_compute_stream(e, 2 * MIB + 4096);
}

/* The memory a prefetch lands in is still in use by a kernel queued before
 * it (its previous user, writing 0xEE once the gate opens): the prefetched
 * bytes must land after it, so the tensor ends up holding what was stored. */
static void test_staging_prefetch_waits_for_compute_stream(void **state)
{
    tio_engine *e = gpu_engine(TIO_BACKEND_PSYNC, 1, 8 * MIB, 0, NULL);
    attach_staging(e, 2 * MIB, MIB);
    void *compute;
    assert_int_equal(cuda.StreamCreateWithFlags(&compute, 1), 0);
    assert_int_equal(tio_engine_gpu_set_stream(e, compute), 0);
    uint64_t n = MIB + 12345;
    void *src = dev_new(n, 9), *t = dev_new(n, 0);
    tio_extent x;
    assert_int_equal(tio_engine_alloc(e, n, &x), 0);
    assert_int_equal(tio_engine_write(e, &x, src, n), 0);
    assert_int_equal(cuda.launch_gate(compute), 0);
    assert_int_equal(cuda.launch_fill(compute, t, 0xEE, n, 0), 0);
    assert_int_equal(tio_engine_submit_read(e, &x, t, n, 1, false), 0);
    expect_held(e, 200); /* its copy waits for the kernel behind the gate */
    cuda.open_gate();
    reap_all(e, 1, NULL);
    assert_int_equal(cuda.StreamSynchronize(compute), 0); /* the earlier kernel is done too */
    assert_dev_bytes(t, n, 9, 0);
    cuda.Free(src);
    cuda.Free(t);
    tio_engine_destroy(e);
    cuda.StreamDestroy(compute);
}

/* One prefetch slot.  With the streams held, prefetch A takes it (its copy
 * is queued) and B, C (normal) and U (urgent) queue behind it; once A's
 * copy is through, U must go before B and C. */
static void test_staging_urgent_first(void **state)
{
    tio_engine *e = gpu_engine(TIO_BACKEND_PSYNC, 1, 16 * MIB, 0, NULL);
    attach_staging(e, 2 * MIB, MIB);
    tio_extent x[4];
    void *src = dev_new(MIB, 5), *dst[4];
    for (int i = 0; i < 4; i++) {
        assert_int_equal(tio_engine_alloc(e, MIB, &x[i]), 0);
        assert_int_equal(tio_engine_write(e, &x[i], src, MIB), 0);
        dst[i] = dev_new(MIB, 0);
    }
    cuda.pause(1);
    standin_cuda_stats st0, st;
    cuda.get_stats(&st0);
    assert_int_equal(tio_engine_submit_read(e, &x[0], dst[0], MIB, 'A', false), 0);
    do { /* A has read its slot and queued its copy (held by the pause) */
        usleep(1000);
        cuda.get_stats(&st);
    } while (st.copies == st0.copies);
    assert_int_equal(tio_engine_submit_read(e, &x[1], dst[1], MIB, 'B', false), 0);
    assert_int_equal(tio_engine_submit_read(e, &x[2], dst[2], MIB, 'C', false), 0);
    assert_int_equal(tio_engine_submit_read(e, &x[3], dst[3], MIB, 'U', true), 0);
    cuda.pause(0);
    uint64_t order[4];
    reap_all(e, 4, order);
    assert_int_equal(order[0], 'A');
    assert_int_equal(order[1], 'U');
    assert_int_equal(order[2], 'B');
    assert_int_equal(order[3], 'C');
    for (int i = 0; i < 4; i++) {
        assert_dev_bytes(dst[i], MIB, 5, 0);
        cuda.Free(dst[i]);
    }
    cuda.Free(src);
    tio_engine_destroy(e);
}

/* Offloads and prefetches have their own slots: with the offload's copy
 * held behind a gate on the compute stream, a prefetch still completes. */
static void test_staging_prefetch_not_behind_offload(void **state)
{
    tio_engine *e = gpu_engine(TIO_BACKEND_PSYNC, 1, 16 * MIB, 0, NULL);
    attach_staging(e, 2 * MIB, MIB);
    tio_extent a, b;
    void *src = dev_new(MIB, 11), *dst = dev_new(MIB, 0), *other = dev_new(MIB, 12);
    assert_int_equal(tio_engine_alloc(e, MIB, &a), 0);
    assert_int_equal(tio_engine_alloc(e, MIB, &b), 0);
    assert_int_equal(tio_engine_write(e, &a, src, MIB), 0);
    void *compute;
    assert_int_equal(cuda.StreamCreateWithFlags(&compute, 1), 0);
    assert_int_equal(cuda.launch_gate(compute), 0);
    assert_int_equal(tio_engine_gpu_set_stream(e, compute), 0);
    assert_int_equal(tio_engine_submit_write(e, &b, other, MIB, 1, false), 0);
    assert_int_equal(tio_engine_gpu_set_stream(e, NULL), 0);
    assert_int_equal(tio_engine_read(e, &a, dst, MIB), 0);
    assert_dev_bytes(dst, MIB, 11, 0);
    expect_held(e, 20); /* the offload is still held */
    cuda.open_gate();
    reap_all(e, 1, NULL);
    cuda.Free(src);
    cuda.Free(dst);
    cuda.Free(other);
    tio_engine_destroy(e);
    cuda.StreamDestroy(compute);
}

/* ---- refusals ------------------------------------------------------------ */

static void test_staging_budget_below_one_chunk(void **state)
{
    tio_engine *e = gpu_engine(TIO_BACKEND_PSYNC, 1, 8 * MIB, 0, NULL);
    tio_engine_gpu_options go;
    tio_engine_gpu_options_default(&go);
    go.path = TIO_GPU_PATH_STAGING;
    go.pinned_bytes = 512 * KIB; /* the engine's chunk is 1 MiB */
    assert_int_equal(tio_engine_gpu_attach(e, &go), -EINVAL);
    assert_string_equal(tio_last_error(), "gpu: pinned budget of 524288 bytes is below one "
                        "chunk of 1048576 bytes: give at least 1048576");
    go.pinned_bytes = 4 * MIB;
    go.chunk_bytes = 8 * MIB;
    assert_int_equal(tio_engine_gpu_attach(e, &go), -EINVAL);
    assert_string_equal(tio_last_error(), "gpu: pinned budget of 4194304 bytes is below one "
                        "chunk of 8388608 bytes: give at least 8388608");
    go.chunk_bytes = MIB + 1;
    assert_int_equal(tio_engine_gpu_attach(e, &go), -EINVAL);
    assert_non_null(strstr(tio_last_error(), "chunk_bytes 1048577 must be a multiple of 4096"));
    go.chunk_bytes = 512 * KIB;
    assert_int_equal(tio_engine_gpu_attach(e, &go), -EINVAL);
    assert_non_null(strstr(tio_last_error(), "at least the engine's chunk of 1048576 bytes"));
    /* nothing was left attached: a good configuration still attaches */
    attach_staging(e, MIB, 0);
    assert_int_equal(tio_engine_gpu_attach(e, &go), -EINVAL);
    assert_string_equal(tio_last_error(), "gpu: a GPU is attached to this engine already");
    tio_engine_destroy(e);
}

static void test_staging_memlock_message(void **state)
{
    char msg[640];
    assert_int_equal(tio_staging_memlock_check(100, 100, 10, 2, 80, msg, sizeof msg), 0);
    assert_int_equal(tio_staging_memlock_check(1ull << 40, (uint64_t)RLIM_INFINITY, 1, 1, 0, msg,
                                               sizeof msg), 0);
    assert_int_equal(tio_staging_memlock_check(4 * MIB + 8 * MIB, 8 * MIB, 4 * MIB, 2, 4 * MIB,
                                               msg, sizeof msg), -ENOMEM);
    assert_string_equal(msg, "gpu: RLIMIT_MEMLOCK is 8388608 bytes (8.00 MiB), the staging ring "
                        "needs 12582912 bytes (12.00 MiB) locked: its 4.00 MiB registered with "
                        "each of 2 io_uring ring(s), beside 4.00 MiB of the engine's bounce "
                        "buffers; raise the limit ('ulimit -l unlimited', LimitMEMLOCK=infinity "
                        "in a systemd unit, '--ulimit memlock=-1' for docker) or lower "
                        "pinned_bytes");
}

/* With RLIMIT_MEMLOCK below what registering the ring needs, attach is
 * refused (the test hook makes the check run even with CAP_IPC_LOCK). */
static void test_staging_memlock_refused(void **state)
{
    tio_engine *e = gpu_engine(TIO_BACKEND_IO_URING, 2, 8 * MIB, 0, NULL);
    struct rlimit old, low;
    assert_int_equal(getrlimit(RLIMIT_MEMLOCK, &old), 0);
    low = old;
    low.rlim_cur = 4 * MIB;
    assert_int_equal(setrlimit(RLIMIT_MEMLOCK, &low), 0);
    tio_engine_gpu_options go;
    tio_engine_gpu_options_default(&go);
    go.path = TIO_GPU_PATH_STAGING;
    go.pinned_bytes = 4 * MIB;
    go.chunk_bytes = MIB;
    tio_engine_gpu_test_options hook = {.ignore_cap_ipc_lock = true};
    int rc = tio_engine_gpu_attach_test(e, &go, &hook);
    assert_int_equal(setrlimit(RLIMIT_MEMLOCK, &old), 0);
    assert_int_equal(rc, -ENOMEM);
    assert_non_null(strstr(tio_last_error(), "gpu: RLIMIT_MEMLOCK is 4194304 bytes (4.00 MiB), "
                           "the staging ring needs "));
    assert_non_null(strstr(tio_last_error(), "its 4.00 MiB registered with each of 2 io_uring "
                           "ring(s)"));
    /* the need is the engine's registered bounce buffers and the ring once
     * per ring; with a limit that covers it exactly, attach succeeds */
    uint64_t need = 2 * 4 * MIB;
    for (uint32_t i = 0; i < 2; i++)
        need += (uint64_t)e->dirs[i].n_bounce * e->bounce_bytes;
    if (old.rlim_max == RLIM_INFINITY || old.rlim_max >= need) {
        low.rlim_cur = need;
        assert_int_equal(setrlimit(RLIMIT_MEMLOCK, &low), 0);
        rc = tio_engine_gpu_attach_test(e, &go, &hook);
        assert_int_equal(setrlimit(RLIMIT_MEMLOCK, &old), 0);
        if (rc)
            print_error("attach: %s\n", tio_last_error());
        assert_int_equal(rc, 0);
    }
    tio_engine_destroy(e);
}

/* ---- failures --------------------------------------------------------- */

static void test_staging_disk_faults(void **state)
{
    tio_engine_test_options hooks;
    assert_int_equal(tio_engine_test_options_parse("eio:write:2", &hooks), 0);
    tio_engine *e = gpu_engine(TIO_BACKEND_PSYNC, 1, 16 * MIB, 0, &hooks);
    attach_staging(e, 2 * MIB, MIB);
    uint64_t n = 3 * MIB;
    tio_extent x;
    assert_int_equal(tio_engine_alloc(e, n, &x), 0);
    void *src = dev_new(n, 4), *dst = dev_new(n, 0);
    assert_int_equal(tio_engine_write(e, &x, src, n), -EIO);
    assert_non_null(strstr(tio_last_error(), "write to '"));
    assert_non_null(strstr(tio_last_error(), "at offset 1048576 (1048576 bytes): "));
    /* the extent holds no valid data now; a good write makes it readable */
    assert_int_equal(tio_engine_read(e, &x, dst, n), TIO_ECORRUPT);
    assert_int_equal(tio_engine_write(e, &x, src, n), 0);
    assert_int_equal(tio_engine_read(e, &x, dst, n), 0);
    assert_dev_bytes(dst, n, 4, 0);
    cuda.Free(src);
    cuda.Free(dst);
    tio_engine_destroy(e);
}

/* A backing file overwritten behind the engine's back: the read through
 * the ring fails its CRC32C and leaves the device memory as it was. */
static void test_staging_corruption_detected(void **state)
{
    tio_engine *e = gpu_engine(TIO_BACKEND_PSYNC, 1, 8 * MIB, 0, NULL);
    attach_staging(e, 2 * MIB, MIB);
    uint64_t n = 2 * MIB;
    tio_extent x;
    assert_int_equal(tio_engine_alloc(e, n, &x), 0);
    void *src = dev_new(n, 6), *dst = dev_new(n, 0);
    assert_int_equal(tio_engine_write(e, &x, src, n), 0);
    int fd = open(tio_engine_backing_path(e, 0), O_WRONLY);
    assert_true(fd >= 0);
    char junk[4096];
    memset(junk, 0x5A, sizeof junk);
    assert_int_equal(pwrite(fd, junk, sizeof junk, (off_t)x.offset + MIB + 8192), 4096);
    close(fd);
    assert_int_equal(tio_engine_read(e, &x, dst, n), TIO_ECORRUPT);
    assert_non_null(strstr(tio_last_error(), "CRC32C mismatch"));
    /* the first 1 MiB group was fine and copied in, the failed one not */
    assert_dev_bytes(dst, MIB, 6, 0);
    assert_dev_bytes((char *)dst + MIB, MIB, 0, 0);
    cuda.Free(src);
    cuda.Free(dst);
    tio_engine_destroy(e);
}

/* ---- devices ------------------------------------------------------------ */

/* Two devices, the caller on device 1: the ring's thread binds device 1,
 * and attaching for a device that is not current is refused. */
static void test_staging_second_device(void **state)
{
    setenv("TERAIO_STANDIN_CUDA_DEVICES", "2", 1);
    assert_int_equal(cuda.SetDevice(1), 0);
    tio_engine *e = gpu_engine(TIO_BACKEND_PSYNC, 1, 8 * MIB, 0, NULL);
    tio_engine_gpu_options go;
    tio_engine_gpu_options_default(&go);
    go.path = TIO_GPU_PATH_STAGING;
    go.pinned_bytes = MIB;
    go.device = 0;
    assert_int_equal(tio_engine_gpu_attach(e, &go), -ENODEV);
    assert_non_null(strstr(tio_last_error(), "device 0 is not the calling thread's current "
                           "device (1 of"));
    go.device = -1;
    assert_int_equal(tio_engine_gpu_attach(e, &go), 0);
    void *src = dev_new(4096, 8), *dst = dev_new(4096, 0);
    tio_extent x;
    assert_int_equal(tio_engine_alloc(e, 4096, &x), 0);
    assert_int_equal(tio_engine_write(e, &x, src, 4096), 0);
    assert_int_equal(tio_engine_read(e, &x, dst, 4096), 0);
    assert_dev_bytes(dst, 4096, 8, 0);
    assert_true(cuda.device_seen(1));
    cuda.Free(src);
    cuda.Free(dst);
    tio_engine_destroy(e);
    assert_int_equal(cuda.SetDevice(0), 0);
    unsetenv("TERAIO_STANDIN_CUDA_DEVICES");
}

/* Host memory keeps the host path when a GPU is attached; tio_engine_copy
 * moves bytes either way. */
static void test_staging_host_memory_unchanged(void **state)
{
    tio_engine *e = gpu_engine(TIO_BACKEND_PSYNC, 1, 8 * MIB, 0, NULL);
    attach_staging(e, MIB, 0);
    unsigned char *h = malloc(MIB), *back = malloc(MIB);
    pattern(h, MIB, 13);
    tio_extent x;
    assert_int_equal(tio_engine_alloc(e, MIB, &x), 0);
    assert_int_equal(tio_engine_write(e, &x, h, MIB), 0);
    assert_int_equal(tio_engine_read(e, &x, back, MIB), 0);
    assert_memory_equal(back, h, MIB);
    tio_engine_gpu_stats st;
    tio_engine_gpu_get_stats(e, &st);
    assert_int_equal(st.staged_offload_bytes + st.staged_prefetch_bytes, 0);
    void *d = dev_new(MIB, 0);
    assert_int_equal(tio_engine_copy(e, d, h, MIB), 0);
    memset(back, 0, MIB);
    assert_int_equal(tio_engine_copy(e, back, d, MIB), 0);
    assert_memory_equal(back, h, MIB);
    cuda.Free(d);
    free(h);
    free(back);
    tio_engine_destroy(e);
}

int main(void)
{
    use_standins(NULL);
    skip_without_cuda();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_prestate(test_staging_roundtrip_sizes, &g_uring),
        cmocka_unit_test_prestate(test_staging_roundtrip_sizes, &g_psync),
        cmocka_unit_test(test_staging_sync_helpers),
        cmocka_unit_test(test_staging_chunks_larger_than_slot),
        cmocka_unit_test(test_staging_pinned_once),
        cmocka_unit_test(test_staging_one_shared_slot),
        cmocka_unit_test(test_staging_offload_waits_for_compute_stream),
        cmocka_unit_test(test_staging_prefetch_waits_for_compute_stream),
        cmocka_unit_test(test_staging_urgent_first),
        cmocka_unit_test(test_staging_prefetch_not_behind_offload),
        cmocka_unit_test(test_staging_budget_below_one_chunk),
        cmocka_unit_test(test_staging_memlock_message),
        cmocka_unit_test(test_staging_memlock_refused),
        cmocka_unit_test(test_staging_disk_faults),
        cmocka_unit_test(test_staging_corruption_detected),
        cmocka_unit_test(test_staging_second_device),
        cmocka_unit_test(test_staging_host_memory_unchanged),
    };
    return cmocka_run_group_tests(tests, dirs_setup, dirs_teardown);
}
