/*
 * tests/c/gpu_test.h — what the GPU tests share: the stand-in libraries
 * (tests/c/standin_cudart.c, standin_cufile.c, built by CMake into the
 * folder TIO_STANDIN_DIR names, or $TERAIO_STANDIN_DIR / $TIO_STANDIN_DIR)
 * put in place of libcudart and libcufile (through $TERAIO_CUDART_LIBRARY
 * and $TERAIO_CUFILE_LIBRARY) before teraio looks for them, their
 * controls, "device" buffers, and engines over temporary directories.
 * Include it once, from a test's .c file.
 */
#ifndef TIO_GPU_TEST_H
#define TIO_GPU_TEST_H

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/util.h"
#include "engine/engine_internal.h"
#include "engine_create.h"
#include "gpu/gpu_internal.h"
#include "teraio/gpu.h"

#define KIB 1024u
#define MIB (1024u * 1024u)

typedef struct {
    unsigned long host_registers, host_unregisters, copies, pageable_copies, streams, events;
    unsigned long h2d_bytes, d2h_bytes;
    int registered_ranges;
} standin_cuda_stats;

typedef struct {
    int open_count, opens, closes_v2, closes_plain;
    unsigned max_nr_seen, batches, sync_ios, handles, bufs_registered, layout_errors, misuse;
    char last_misuse[160];
} standin_cufile_stats;

/* The stand-in runtime's entry points and controls, looked up in the very
 * library teraio loaded. */
static struct {
    int (*Malloc)(void **p, size_t n);
    int (*Free)(void *p);
    int (*Memcpy)(void *dst, const void *src, size_t n, int kind);
    int (*SetDevice)(int d);
    int (*StreamCreateWithFlags)(void **s, unsigned flags);
    int (*StreamDestroy)(void *s);
    int (*StreamSynchronize)(void *s);
    void (*set_copy_delay_us)(unsigned us);
    void (*pause)(int on);
    int (*launch_fill)(void *s, void *dst, int byte, size_t n, unsigned delay_us);
    int (*launch_gate)(void *s);
    void (*open_gate)(void);
    void (*get_stats)(standin_cuda_stats *out);
    int (*device_seen)(int d);
} cuda;

static struct {
    void (*set)(unsigned major, unsigned minor, unsigned flags, unsigned max_batch,
                unsigned delay_us);
    void (*fail_io)(long nth, int status, long long ret);
    void (*fail_open)(int err);
    void (*get_stats)(standin_cufile_stats *out);
} cufile;

static char g_root[PATH_MAX], g_dir[2][PATH_MAX + 16];

static inline void *standin_sym(void *h, const char *name)
{
    void *p = dlsym(h, name);
    if (!p) {
        fprintf(stderr, "stand-in has no %s\n", name);
        exit(1);
    }
    return p;
}

static inline void *open_standin(const char *path)
{
    void *h = dlopen(path, RTLD_NOW);
    if (!h) {
        fprintf(stderr, "%s\n", dlerror());
        exit(1);
    }
    return h;
}

#define SYM(table, field, name) *(void **)&table.field = standin_sym(h, name)

/* Point teraio at the stand-ins (cuFile: `cufile_variant`, "" for the full
 * one, "_nov2", "_nobatch"; NULL: none) and bind their controls.  Call
 * first thing in main(): teraio reads the variables once. */
static inline void use_standins(const char *cufile_variant)
{
    char path[PATH_MAX];
    const char *dir = tio_env("STANDIN_DIR"); /* a build carried to another machine */
    if (!dir || !dir[0])
        dir = TIO_STANDIN_DIR;
    snprintf(path, sizeof path, "%s/libtio_standin_cudart.so", dir);
    setenv("TERAIO_CUDART_LIBRARY", path, 1);
    void *h = open_standin(path);
    SYM(cuda, Malloc, "cudaMalloc");
    SYM(cuda, Free, "cudaFree");
    SYM(cuda, Memcpy, "cudaMemcpy");
    SYM(cuda, SetDevice, "cudaSetDevice");
    SYM(cuda, StreamCreateWithFlags, "cudaStreamCreateWithFlags");
    SYM(cuda, StreamDestroy, "cudaStreamDestroy");
    SYM(cuda, StreamSynchronize, "cudaStreamSynchronize");
    SYM(cuda, set_copy_delay_us, "standin_cuda_set_copy_delay_us");
    SYM(cuda, pause, "standin_cuda_pause");
    SYM(cuda, launch_fill, "standin_cuda_launch_fill");
    SYM(cuda, launch_gate, "standin_cuda_launch_gate");
    SYM(cuda, open_gate, "standin_cuda_open_gate");
    SYM(cuda, get_stats, "standin_cuda_get_stats");
    SYM(cuda, device_seen, "standin_cuda_device_seen");
    if (!cufile_variant) {
        setenv("TERAIO_CUFILE_LIBRARY", "/nonexistent/libcufile.so.0", 1);
        return;
    }
    snprintf(path, sizeof path, "%s/libtio_standin_cufile%s.so", dir, cufile_variant);
    setenv("TERAIO_CUFILE_LIBRARY", path, 1);
    h = open_standin(path);
    SYM(cufile, set, "standin_cufile_set");
    SYM(cufile, fail_io, "standin_cufile_fail_io");
    SYM(cufile, fail_open, "standin_cufile_fail_open");
    SYM(cufile, get_stats, "standin_cufile_get_stats");
}

/* Exit 77 (ctest: skipped) when this build has no CUDA support. */
static inline void skip_without_cuda(void)
{
    tio_cuda_info info;
    tio_cuda_info_get(&info);
    if (info.state == TIO_GPU_NOT_BUILT) {
        printf("needs a CUDA build: %s\n", info.reason);
        exit(77);
    }
}

static inline int dirs_setup(void **state)
{
    const char *base = tio_env("TEST_TMPDIR");
    if (!base || !base[0])
        base = "/tmp";
    mkdir(base, 0755);
    snprintf(g_root, sizeof g_root, "%s/gpu.XXXXXX", base);
    if (!mkdtemp(g_root))
        return -1;
    for (int i = 0; i < 2; i++) {
        snprintf(g_dir[i], sizeof g_dir[i], "%s/ssd%d", g_root, i);
        if (mkdir(g_dir[i], 0755))
            return -1;
    }
    return 0;
}

static inline int dirs_teardown(void **state)
{
    /* rmdir fails if a backing file was left behind */
    return rmdir(g_dir[0]) || rmdir(g_dir[1]) || rmdir(g_root);
}

/* An engine over n_dirs directories, 1 MiB stripes, requests of `request`
 * bytes (0: 1 MiB). */
static inline tio_engine *gpu_engine(tio_backend backend, uint32_t n_dirs, uint64_t space,
                                     uint32_t request, const tio_engine_test_options *hooks)
{
    const char *dirs[2] = {g_dir[0], g_dir[1]};
    tio_engine_options opt;
    tio_engine_options_default(&opt);
    opt.dirs = dirs;
    opt.n_dirs = n_dirs;
    opt.space_bytes = space;
    opt.backend = backend;
    if (request)
        opt.request_bytes = request;
    return engine_create_or_skip(&opt, hooks);
}

/* Attach with the given budget and chunk (0: defaults), staging only. */
static inline void attach_staging(tio_engine *e, uint64_t pinned, uint64_t chunk)
{
    tio_engine_gpu_options go;
    tio_engine_gpu_options_default(&go);
    go.path = TIO_GPU_PATH_STAGING;
    if (pinned)
        go.pinned_bytes = pinned;
    go.chunk_bytes = chunk;
    int rc = tio_engine_gpu_attach(e, &go);
    if (rc)
        print_error("attach: %s\n", tio_last_error());
    assert_int_equal(rc, 0);
}

/* Deterministic bytes (xorshift32). */
static inline void pattern(unsigned char *p, size_t n, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 1u;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        p[i] = (unsigned char)x;
    }
}

/* Device memory holding `n` pattern bytes (seed), or zeros (seed 0). */
static inline void *dev_new(size_t n, uint32_t seed)
{
    void *d = NULL;
    assert_int_equal(cuda.Malloc(&d, n), 0);
    unsigned char *h = malloc(n);
    assert_non_null(h);
    if (seed)
        pattern(h, n, seed);
    else
        memset(h, 0, n);
    assert_int_equal(cuda.Memcpy(d, h, n, 1), 0);
    free(h);
    return d;
}

/* Does device memory `d` hold the pattern of `seed` (or all `byte` when
 * seed is 0)? */
static inline void assert_dev_bytes(const void *d, size_t n, uint32_t seed, int byte)
{
    unsigned char *want = malloc(n), *got = malloc(n);
    assert_non_null(want);
    assert_non_null(got);
    if (seed)
        pattern(want, n, seed);
    else
        memset(want, byte, n);
    assert_int_equal(cuda.Memcpy(got, d, n, 2), 0);
    assert_memory_equal(got, want, n);
    free(want);
    free(got);
}

/* No request of `e` completes within `ms` (they wait for a gate).  A
 * correct engine passes whatever the timing; one that does not wait is
 * caught as long as it finishes within the time. */
static inline void expect_held(tio_engine *e, unsigned ms)
{
    for (unsigned i = 0; i < ms; i++) {
        tio_completion c;
        int n = tio_engine_reap(e, &c, 1, 0);
        if (n)
            print_error("tag %llu completed while it should wait\n", (unsigned long long)c.tag);
        assert_int_equal(n, 0);
        usleep(1000);
    }
}

/* Reap exactly n completions, all successful; their tags in order. */
static inline void reap_all(tio_engine *e, uint32_t n, uint64_t *tags)
{
    for (uint32_t got = 0; got < n;) {
        tio_completion c[16];
        int k = tio_engine_reap(e, c, 16, 1);
        assert_true(k > 0);
        for (int i = 0; i < k; i++) {
            if (c[i].result)
                print_error("tag %llu: %s\n", (unsigned long long)c[i].tag,
                            tio_engine_completion_error(e, c[i].tag));
            assert_int_equal(c[i].result, 0);
            if (tags)
                tags[got] = c[i].tag;
            got++;
        }
    }
}

/* A kernel on a compute stream, held behind a gate, writes 0xAB over a
 * tensor of n bytes; an offload of the tensor submitted after it was queued
 * must store 0xAB, not the zeros the memory held while the gate was closed.
 * `e` has a GPU attached; it is destroyed. */
static inline void check_offload_waits_for_compute_stream(tio_engine *e, uint64_t n)
{
    void *compute;
    assert_int_equal(cuda.StreamCreateWithFlags(&compute, 1), 0);
    assert_int_equal(tio_engine_gpu_set_stream(e, compute), 0);
    void *t = dev_new(n, 0), *back = dev_new(n, 0);
    tio_extent x;
    assert_int_equal(tio_engine_alloc(e, n, &x), 0);
    assert_int_equal(cuda.launch_gate(compute), 0);
    assert_int_equal(cuda.launch_fill(compute, t, 0xAB, n, 0), 0);
    assert_int_equal(tio_engine_submit_write(e, &x, t, n, 1, false), 0);
    expect_held(e, 200); /* the copy waits for the kernel behind the gate */
    cuda.open_gate();
    reap_all(e, 1, NULL);
    assert_int_equal(tio_engine_gpu_set_stream(e, NULL), 0);
    assert_int_equal(tio_engine_read(e, &x, back, n), 0);
    assert_dev_bytes(back, n, 0, 0xAB);
    cuda.Free(t);
    cuda.Free(back);
    tio_engine_destroy(e);
    cuda.StreamDestroy(compute);
}

#endif
