/*
 * test_runtime.c — the runtime executing a small plan against a real engine.
 *
 * The trace has six kernels and three tensors; the plan offloads T0
 * (1 MiB + 123 bytes, not a multiple of 4 KiB) to SSD over kernels 1..2 and
 * prefetches it over 3..5, and offloads T2 to the host tier over 1..2 and
 * prefetches it over 3..4.  The "framework" is a set of callbacks that
 * really malloc and free tensor memory and count the calls, so every test
 * can assert exact call counts, exact byte counters and byte-for-byte
 * contents after the round trip.  The engine runs on a temporary directory
 * under $TIO_TEST_TMPDIR, once with the psync backend and once with the
 * backend the probe picks.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <pthread.h>
#include <cmocka.h>

#include "common/util.h"
#include "engine/engine_test.h"
#include "teraio/runtime.h"

#define N_TENSORS 3
#define T0_BYTES (1024u * 1024u + 123u)
#define T1_BYTES 8192u
#define T2_BYTES 10000u
#define ALL_BYTES ((uint64_t)T0_BYTES + T1_BYTES + T2_BYTES)

static const uint64_t tensor_bytes[N_TENSORS] = {T0_BYTES, T1_BYTES, T2_BYTES};
static const char *const kernel_names[] = {"embed", "mm1", "mm2", "mm3", "mm4", "loss"};

/* The framework's allocator, as the runtime sees it through callbacks. */
typedef struct {
    uint64_t bytes[N_TENSORS]; /* size each allocation must have */
    void *mem[N_TENSORS];
    int n_allocate[N_TENSORS];
    int n_release[N_TENSORS];
    /* staging: host buffers standing in for pinned memory */
    void *stage[N_TENSORS];
    int n_stage_out[N_TENSORS], n_stage_in[N_TENSORS], n_unstage[N_TENSORS], n_copy_in[N_TENSORS];
} fake_framework;

static int fw_allocate(void *ctx, uint32_t tensor, uint64_t bytes, void **addr)
{
    fake_framework *fw = ctx;
    assert_true(tensor < N_TENSORS);
    assert_null(fw->mem[tensor]);
    assert_int_equal(bytes, fw->bytes[tensor]);
    fw->mem[tensor] = malloc(bytes);
    if (!fw->mem[tensor])
        return -ENOMEM;
    memset(fw->mem[tensor], 0xEE, bytes); /* garbage a prefetch must overwrite */
    fw->n_allocate[tensor]++;
    *addr = fw->mem[tensor];
    return 0;
}

static int fw_release(void *ctx, uint32_t tensor)
{
    fake_framework *fw = ctx;
    assert_true(tensor < N_TENSORS);
    assert_non_null(fw->mem[tensor]);
    free(fw->mem[tensor]);
    fw->mem[tensor] = NULL;
    fw->n_release[tensor]++;
    return 0;
}

static int fw_stage_out(void *ctx, uint32_t tensor, uint64_t bytes, void **host_addr)
{
    fake_framework *fw = ctx;
    assert_null(fw->stage[tensor]);
    assert_non_null(fw->mem[tensor]);
    fw->stage[tensor] = malloc(bytes);
    assert_non_null(fw->stage[tensor]);
    memcpy(fw->stage[tensor], fw->mem[tensor], bytes);
    fw->n_stage_out[tensor]++;
    *host_addr = fw->stage[tensor];
    return 0;
}

static int fw_stage_in(void *ctx, uint32_t tensor, uint64_t bytes, void **host_addr)
{
    fake_framework *fw = ctx;
    assert_null(fw->stage[tensor]);
    fw->stage[tensor] = malloc(bytes);
    assert_non_null(fw->stage[tensor]);
    memset(fw->stage[tensor], 0xDD, bytes);
    fw->n_stage_in[tensor]++;
    *host_addr = fw->stage[tensor];
    return 0;
}

static int fw_unstage(void *ctx, uint32_t tensor, bool copy_in)
{
    fake_framework *fw = ctx;
    assert_non_null(fw->stage[tensor]);
    if (copy_in) {
        assert_non_null(fw->mem[tensor]);
        memcpy(fw->mem[tensor], fw->stage[tensor], fw->bytes[tensor]);
        fw->n_copy_in[tensor]++;
    }
    free(fw->stage[tensor]);
    fw->stage[tensor] = NULL;
    fw->n_unstage[tensor]++;
    return 0;
}

static void fill_pattern(void *buf, uint64_t bytes, unsigned seed)
{
    unsigned char *p = buf;
    for (uint64_t i = 0; i < bytes; i++)
        p[i] = (unsigned char)((i * 131u + seed * 17u + (i >> 12)) & 0xffu);
}

static bool has_pattern(const void *buf, uint64_t bytes, unsigned seed)
{
    const unsigned char *p = buf;
    for (uint64_t i = 0; i < bytes; i++)
        if (p[i] != (unsigned char)((i * 131u + seed * 17u + (i >> 12)) & 0xffu))
            return false;
    return true;
}

typedef struct {
    tio_backend backend;
    uint64_t engine_bytes; /* 0: no engine */
    const char *fault;     /* engine test hook: a fault spec (engine_test.h) */
    bool host_only;        /* plan only the host-tier migrations of T2 */
    bool staged;           /* transfers go through staging callbacks */
} fixture_options;

typedef struct {
    tio_trace *trace;
    tio_migration migrations[8];
    tio_plan plan;
    tio_engine *engine;
    char dir[4096];
    fake_framework fw;
    tio_runtime_callbacks cb;
    tio_runtime *rt;
} fixture;

static tio_trace *make_trace(void)
{
    tio_trace *tr;
    assert_int_equal(tio_trace_create("runtime test", &tr), 0);
    static const tio_tensor_kind kinds[N_TENSORS] = {TIO_KIND_ACTIVATION, TIO_KIND_TEMPORARY,
                                                     TIO_KIND_ACTIVATION};
    for (uint32_t i = 0; i < N_TENSORS; i++) {
        uint32_t id;
        assert_int_equal(tio_trace_add_tensor(tr, tensor_bytes[i], kinds[i], false, NULL, &id), 0);
        assert_int_equal(id, i);
    }
    /* Uses: T0 at 0 and 5, T1 at every kernel, T2 at 0 and 4. */
    static const uint8_t uses[6][N_TENSORS] = {
        {TIO_ACCESS_WRITE, TIO_ACCESS_WRITE, TIO_ACCESS_WRITE},
        {0, TIO_ACCESS_READ, 0},
        {0, TIO_ACCESS_READ | TIO_ACCESS_WRITE, 0},
        {0, TIO_ACCESS_READ, 0},
        {0, TIO_ACCESS_READ, TIO_ACCESS_READ},
        {TIO_ACCESS_READ, TIO_ACCESS_READ, 0},
    };
    for (uint32_t k = 0; k < 6; k++) {
        assert_int_equal(tio_trace_add_kernel(tr, kernel_names[k], 1000), 0);
        for (uint32_t t = 0; t < N_TENSORS; t++)
            if (uses[k][t])
                assert_int_equal(tio_trace_add_access(tr, t, uses[k][t]), 0);
    }
    return tr;
}

static void plan_init(tio_plan *plan, tio_migration *m, uint32_t n)
{
    memset(plan, 0, sizeof *plan);
    plan->n_kernels = 6;
    plan->n_tensors = N_TENSORS;
    plan->capacity_bytes = ALL_BYTES;
    plan->n_migrations = n;
    plan->migrations = m;
}

static tio_migration migration(uint32_t tensor, tio_migration_kind kind, uint32_t trigger,
                               uint32_t deadline, tio_tier tier)
{
    return (tio_migration){.tensor = tensor, .kind = kind, .trigger_kernel = trigger,
                           .deadline_kernel = deadline, .tier = tier,
                           .bytes = tensor_bytes[tensor]};
}

static void make_dir(char *out, size_t cap)
{
    const char *base = tio_env("TEST_TMPDIR");
    if (!base || !base[0])
        base = "/tmp";
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", base);
    assert_int_equal(system(cmd), 0);
    snprintf(out, cap, "%s/runtime.XXXXXX", base);
    assert_non_null(mkdtemp(out));
}

static int fixture_setup(void **state, const fixture_options *opt)
{
    fixture *f = calloc(1, sizeof *f);
    assert_non_null(f);
    f->trace = make_trace();
    uint32_t n = 0;
    if (!opt->host_only) {
        f->migrations[n++] = migration(0, TIO_MIGRATION_OFFLOAD, 1, 2, TIO_TIER_SSD);
    }
    f->migrations[n++] = migration(2, TIO_MIGRATION_OFFLOAD, 1, 2, TIO_TIER_HOST);
    if (!opt->host_only)
        f->migrations[n++] = migration(0, TIO_MIGRATION_PREFETCH, 3, 5, TIO_TIER_SSD);
    f->migrations[n++] = migration(2, TIO_MIGRATION_PREFETCH, 3, 4, TIO_TIER_HOST);
    plan_init(&f->plan, f->migrations, n);

    if (opt->engine_bytes) {
        make_dir(f->dir, sizeof f->dir);
        tio_engine_options eo;
        tio_engine_options_default(&eo);
        const char *dirs[1] = {f->dir};
        eo.dirs = dirs;
        eo.n_dirs = 1;
        eo.space_bytes = opt->engine_bytes;
        eo.backend = opt->backend;
        tio_engine_test_options hooks = {0};
        if (opt->fault)
            assert_int_equal(tio_engine_test_options_parse(opt->fault, &hooks), 0);
        assert_int_equal(tio_engine_create_test(&eo, &hooks, &f->engine), 0);
    }

    f->cb = (tio_runtime_callbacks){.ctx = &f->fw, .allocate = fw_allocate, .release = fw_release};
    if (opt->staged) {
        f->cb.stage_out = fw_stage_out;
        f->cb.stage_in = fw_stage_in;
        f->cb.unstage = fw_unstage;
    }
    assert_int_equal(tio_runtime_create(&f->plan, f->trace, f->engine, &f->cb, &f->rt), 0);
    for (uint32_t t = 0; t < N_TENSORS; t++) {
        f->fw.bytes[t] = tensor_bytes[t];
        f->fw.mem[t] = malloc(tensor_bytes[t]);
        assert_non_null(f->fw.mem[t]);
        fill_pattern(f->fw.mem[t], tensor_bytes[t], t + 1);
        assert_int_equal(tio_runtime_tensor_bind(f->rt, t, f->fw.mem[t], tensor_bytes[t]), 0);
    }
    *state = f;
    return 0;
}

static int fixture_teardown(void **state)
{
    fixture *f = *state;
    tio_runtime_destroy(f->rt);
    tio_engine_destroy(f->engine);
    if (f->dir[0])
        rmdir(f->dir);
    for (uint32_t t = 0; t < N_TENSORS; t++)
        free(f->fw.mem[t]);
    tio_trace_destroy(f->trace);
    free(f);
    return 0;
}

static int setup_psync(void **state)
{
    return fixture_setup(state, &(fixture_options){.backend = TIO_BACKEND_PSYNC,
                                                   .engine_bytes = 8u << 20});
}

static int setup_auto(void **state)
{
    return fixture_setup(state, &(fixture_options){.backend = TIO_BACKEND_AUTO,
                                                   .engine_bytes = 8u << 20});
}

static int setup_staged(void **state)
{
    return fixture_setup(state, &(fixture_options){.backend = TIO_BACKEND_AUTO,
                                                   .engine_bytes = 8u << 20, .staged = true});
}

static int setup_host_only(void **state)
{
    return fixture_setup(state, &(fixture_options){.host_only = true});
}

static int setup_small_engine(void **state)
{
    return fixture_setup(state, &(fixture_options){.backend = TIO_BACKEND_PSYNC,
                                                   .engine_bytes = 4u << 20});
}

static int setup_write_fault(void **state)
{
    return fixture_setup(state, &(fixture_options){.backend = TIO_BACKEND_PSYNC,
                                                   .engine_bytes = 8u << 20,
                                                   .fault = "eio:write:1"});
}

static int setup_read_fault(void **state)
{
    return fixture_setup(state, &(fixture_options){.backend = TIO_BACKEND_PSYNC,
                                                   .engine_bytes = 8u << 20,
                                                   .fault = "eio:read:1"});
}

static void run_kernels(fixture *f, uint32_t from, uint32_t to)
{
    for (uint32_t k = from; k < to; k++)
        assert_int_equal(tio_runtime_kernel_begin(f->rt, k, kernel_names[k]), 0);
}

static tio_runtime_stats stats_of(const fixture *f)
{
    tio_runtime_stats s;
    tio_runtime_get_stats(f->rt, &s);
    return s;
}

/* Bind the fixture's tensors at the framework's addresses. */
static void bind_all(fixture *f)
{
    for (uint32_t t = 0; t < N_TENSORS; t++)
        assert_int_equal(tio_runtime_tensor_bind(f->rt, t, f->fw.mem[t], tensor_bytes[t]), 0);
}

/* A whole iteration: release at the offload deadline, exact bytes back at
 * the prefetch deadline, exact counters. */
static void test_round_trip(void **state)
{
    fixture *f = *state;
    assert_int_equal(stats_of(f).resident_bytes, ALL_BYTES);
    assert_int_equal(tio_runtime_iteration_begin(f->rt), 0);
    run_kernels(f, 0, 2);
    /* Kernel 1 started both offloads; nothing is released yet. */
    assert_int_equal(f->fw.n_release[0] + f->fw.n_release[2], 0);
    assert_false(tio_runtime_is_resident(f->rt, 0));
    assert_int_equal(stats_of(f).resident_bytes, ALL_BYTES);

    run_kernels(f, 2, 3);
    assert_int_equal(f->fw.n_release[0], 1);
    assert_int_equal(f->fw.n_release[2], 1);
    assert_int_equal(f->fw.n_release[1], 0);
    tio_runtime_stats s = stats_of(f);
    assert_int_equal(s.resident_bytes, T1_BYTES);
    assert_int_equal(s.bytes_offloaded, (uint64_t)T0_BYTES + T2_BYTES);
    assert_int_equal(s.bytes_offloaded_ssd, T0_BYTES);
    assert_int_equal(s.bytes_offloaded_host, T2_BYTES);
    assert_int_equal(s.n_offloads, 2);

    run_kernels(f, 3, 4);
    assert_int_equal(f->fw.n_allocate[0], 1);
    assert_int_equal(f->fw.n_allocate[2], 1);
    assert_true(tio_runtime_is_resident(f->rt, 2)); /* host tier: copied at once */
    assert_true(has_pattern(f->fw.mem[2], T2_BYTES, 3));
    assert_int_equal(stats_of(f).resident_bytes, ALL_BYTES);

    run_kernels(f, 4, 6);
    assert_true(tio_runtime_is_resident(f->rt, 0));
    assert_true(has_pattern(f->fw.mem[0], T0_BYTES, 1));
    void *addr = NULL;
    assert_int_equal(tio_runtime_ensure_resident(f->rt, 0, &addr), 0);
    assert_ptr_equal(addr, f->fw.mem[0]);

    s = stats_of(f);
    assert_int_equal(s.bytes_prefetched, (uint64_t)T0_BYTES + T2_BYTES);
    assert_int_equal(s.n_prefetches, 2);
    assert_int_equal(s.bytes_fetched_urgent, 0);
    assert_int_equal(s.stalls, 0);
    assert_int_equal(s.stall_ns, 0);
    assert_int_equal(s.offloads_refused, 0);
    assert_int_equal(s.resident_bytes, ALL_BYTES);
    assert_int_equal(s.peak_resident_bytes, ALL_BYTES);
    assert_int_equal(s.iterations, 1);
    assert_false(s.diverged);
}

/* The second iteration reuses the extent and stores the new contents. */
static void test_second_iteration_stores_new_bytes(void **state)
{
    fixture *f = *state;
    run_kernels(f, 0, 6);
    fill_pattern(f->fw.mem[0], T0_BYTES, 9);
    fill_pattern(f->fw.mem[2], T2_BYTES, 10);
    assert_int_equal(tio_runtime_iteration_begin(f->rt), 0);
    run_kernels(f, 0, 6);
    assert_true(has_pattern(f->fw.mem[0], T0_BYTES, 9));
    assert_true(has_pattern(f->fw.mem[2], T2_BYTES, 10));
    tio_runtime_stats s = stats_of(f);
    assert_int_equal(s.n_offloads, 4);
    assert_int_equal(s.n_prefetches, 4);
    assert_int_equal(s.bytes_offloaded_ssd, 2ull * T0_BYTES);
    assert_int_equal(s.bytes_prefetched, 2ull * (T0_BYTES + T2_BYTES));
    assert_int_equal(s.iterations, 1);
    assert_int_equal(f->fw.n_release[0], 2);
    assert_int_equal(f->fw.n_allocate[0], 2);
}

/* A tensor needed while offloaded is fetched at once and counted as a stall;
 * the planned prefetch then finds it resident and does nothing. */
static void test_ensure_resident_fetches_offloaded(void **state)
{
    fixture *f = *state;
    run_kernels(f, 0, 3);
    void *addr = NULL;
    assert_int_equal(tio_runtime_ensure_resident(f->rt, 0, &addr), 1);
    assert_ptr_equal(addr, f->fw.mem[0]);
    assert_true(has_pattern(addr, T0_BYTES, 1));
    tio_runtime_stats s = stats_of(f);
    assert_int_equal(s.stalls, 1);
    assert_int_equal(s.bytes_fetched_urgent, T0_BYTES);
    assert_int_equal(s.resident_bytes, (uint64_t)T0_BYTES + T1_BYTES);

    run_kernels(f, 3, 6);
    assert_int_equal(f->fw.n_allocate[0], 1);
    assert_true(has_pattern(f->fw.mem[0], T0_BYTES, 1));
    s = stats_of(f);
    assert_int_equal(s.stalls, 1);
    assert_int_equal(s.bytes_prefetched, T2_BYTES);
    assert_int_equal(s.n_prefetches, 1);
    assert_int_equal(s.peak_resident_bytes, ALL_BYTES);
}

/* A tensor needed while its prefetch is in flight: ensure_resident waits
 * (a stall) or finds the read already done (no stall); either way the bytes
 * are there when it returns.  Which one happens depends on the disk. */
static void test_ensure_resident_during_prefetch(void **state)
{
    fixture *f = *state;
    run_kernels(f, 0, 4);
    void *addr = NULL;
    int rc = tio_runtime_ensure_resident(f->rt, 0, &addr);
    assert_true(rc == 0 || rc == 1);
    assert_ptr_equal(addr, f->fw.mem[0]);
    assert_true(has_pattern(addr, T0_BYTES, 1));
    assert_true(tio_runtime_is_resident(f->rt, 0));
    tio_runtime_stats s = stats_of(f);
    assert_int_equal(s.stalls, (uint64_t)rc);
    assert_int_equal(s.bytes_prefetched, (uint64_t)T0_BYTES + T2_BYTES);
    assert_int_equal(s.bytes_fetched_urgent, 0);
    run_kernels(f, 4, 6);
    assert_int_equal(f->fw.n_allocate[0], 1);
}

/* A tensor used during its offload is never released at the deadline. */
static void test_use_during_offload_cancels_release(void **state)
{
    fixture *f = *state;
    run_kernels(f, 0, 2);
    assert_int_equal(tio_runtime_ensure_resident(f->rt, 0, NULL), 0);
    assert_true(tio_runtime_is_resident(f->rt, 0));
    run_kernels(f, 2, 6);
    assert_int_equal(f->fw.n_release[0], 0);
    assert_int_equal(f->fw.n_allocate[0], 0);
    assert_int_equal(f->fw.n_release[2], 1);
    assert_true(has_pattern(f->fw.mem[0], T0_BYTES, 1));
    tio_runtime_stats s = stats_of(f);
    assert_int_equal(s.stalls, 0);
    assert_int_equal(s.resident_bytes, ALL_BYTES);
}

/* Wrong kernel name: one divergence, no planned migration after it, and
 * offloaded tensors come back on demand with their bytes. */
static void test_divergence_falls_back_to_on_demand(void **state)
{
    fixture *f = *state;
    run_kernels(f, 0, 3);
    assert_int_equal(tio_runtime_kernel_begin(f->rt, 3, "aten::unexpected"), 1);
    tio_runtime_stats s = stats_of(f);
    assert_true(s.diverged);
    assert_int_equal(s.diverged_kernel, 3);
    assert_int_equal(f->fw.n_allocate[0] + f->fw.n_allocate[2], 0);
    assert_int_equal(tio_runtime_kernel_begin(f->rt, 4, "mm4"), 0);
    assert_int_equal(tio_runtime_kernel_begin(f->rt, 5, "something else"), 0);
    assert_int_equal(f->fw.n_allocate[0] + f->fw.n_allocate[2], 0);

    void *addr = NULL;
    assert_int_equal(tio_runtime_ensure_resident(f->rt, 0, &addr), 1);
    assert_true(has_pattern(addr, T0_BYTES, 1));
    assert_int_equal(tio_runtime_ensure_resident(f->rt, 2, &addr), 1);
    assert_true(has_pattern(addr, T2_BYTES, 3));
    s = stats_of(f);
    assert_int_equal(s.stalls, 2);
    assert_int_equal(s.bytes_fetched_urgent, (uint64_t)T0_BYTES + T2_BYTES);
    assert_int_equal(s.bytes_prefetched, 0);
    assert_int_equal(s.resident_bytes, ALL_BYTES);
}

/* Divergence while writes are in flight: they finish and are released. */
static void test_divergence_finishes_in_flight_offloads(void **state)
{
    fixture *f = *state;
    run_kernels(f, 0, 2);
    assert_int_equal(tio_runtime_kernel_begin(f->rt, 2, "not mm2"), 1);
    assert_int_equal(f->fw.n_release[0], 1);
    assert_int_equal(f->fw.n_release[2], 1);
    tio_runtime_stats s = stats_of(f);
    assert_int_equal(s.resident_bytes, T1_BYTES);
    assert_int_equal(s.n_offloads, 2);
    assert_int_equal(s.diverged_kernel, 2);
    void *addr = NULL;
    assert_int_equal(tio_runtime_ensure_resident(f->rt, 0, &addr), 1);
    assert_true(has_pattern(addr, T0_BYTES, 1));
}

/* A kernel index past the trace is a divergence too. */
static void test_divergence_on_kernel_out_of_range(void **state)
{
    fixture *f = *state;
    assert_int_equal(tio_runtime_kernel_begin(f->rt, 6, "extra"), 1);
    tio_runtime_stats s = stats_of(f);
    assert_true(s.diverged);
    assert_int_equal(s.diverged_kernel, 6);
}

/* Host tier only, no engine at all. */
static void test_host_tier_without_engine(void **state)
{
    fixture *f = *state;
    run_kernels(f, 0, 3);
    assert_int_equal(f->fw.n_release[2], 1);
    assert_int_equal(stats_of(f).resident_bytes, (uint64_t)T0_BYTES + T1_BYTES);
    run_kernels(f, 3, 6);
    assert_true(has_pattern(f->fw.mem[2], T2_BYTES, 3));
    tio_runtime_stats s = stats_of(f);
    assert_int_equal(s.bytes_offloaded_host, T2_BYTES);
    assert_int_equal(s.bytes_offloaded_ssd, 0);
    assert_int_equal(s.bytes_prefetched, T2_BYTES);
    assert_int_equal(s.resident_bytes, ALL_BYTES);
}

/* No SSD space left (someone else took it after the runtime was created):
 * the offload is refused and the tensor stays resident. */
static void test_no_space_keeps_resident(void **state)
{
    fixture *f = *state;
    tio_engine_space sp;
    tio_engine_space_stats(f->engine, &sp);
    tio_extent taken;
    assert_int_equal(tio_engine_alloc(f->engine, sp.free_bytes, &taken), 0);
    run_kernels(f, 0, 6);
    tio_runtime_stats s = stats_of(f);
    assert_int_equal(s.offloads_refused, 1);
    assert_int_equal(s.bytes_offloaded_ssd, 0);
    assert_int_equal(f->fw.n_release[0], 0);
    assert_int_equal(f->fw.n_allocate[0], 0);
    assert_true(has_pattern(f->fw.mem[0], T0_BYTES, 1));
    assert_int_equal(f->fw.n_release[2], 1);
}

/* An SSD write error surfaces at the offload deadline; the tensor is
 * neither released nor changed. */
static void test_write_error_keeps_tensor(void **state)
{
    fixture *f = *state;
    run_kernels(f, 0, 2);
    int rc = tio_runtime_kernel_begin(f->rt, 2, "mm2");
    assert_int_equal(rc, -EIO);
    assert_non_null(strstr(tio_last_error(), "tensor 0: SSD write"));
    assert_non_null(strstr(tio_last_error(), "Input/output error"));
    assert_true(tio_runtime_is_resident(f->rt, 0));
    assert_int_equal(f->fw.n_release[0], 0);
    assert_int_equal(f->fw.n_release[2], 1);
    assert_true(has_pattern(f->fw.mem[0], T0_BYTES, 1));
    run_kernels(f, 3, 6);
    assert_int_equal(f->fw.n_allocate[0], 0);
    tio_runtime_stats s = stats_of(f);
    assert_int_equal(s.bytes_offloaded_ssd, 0);
    assert_int_equal(s.resident_bytes, ALL_BYTES);
}

/* An SSD read error surfaces at the prefetch deadline; the tensor stays
 * offloaded (its fresh memory given back) and a later fetch succeeds. */
static void test_read_error_then_fetch_on_demand(void **state)
{
    fixture *f = *state;
    run_kernels(f, 0, 4);
    assert_int_equal(tio_runtime_kernel_begin(f->rt, 4, "mm4"), 0);
    int rc = tio_runtime_kernel_begin(f->rt, 5, "loss");
    assert_int_equal(rc, -EIO);
    assert_non_null(strstr(tio_last_error(), "tensor 0: SSD read"));
    assert_non_null(strstr(tio_last_error(), "Input/output error"));
    assert_false(tio_runtime_is_resident(f->rt, 0));
    assert_int_equal(f->fw.n_allocate[0], 1);
    assert_int_equal(f->fw.n_release[0], 2);
    assert_int_equal(stats_of(f).resident_bytes, (uint64_t)T1_BYTES + T2_BYTES);
    void *addr = NULL;
    assert_int_equal(tio_runtime_ensure_resident(f->rt, 0, &addr), 1);
    assert_true(has_pattern(addr, T0_BYTES, 1));
    assert_int_equal(stats_of(f).bytes_fetched_urgent, T0_BYTES);
}

/* fetch_all brings everything back, without counting stalls. */
static void test_fetch_all(void **state)
{
    fixture *f = *state;
    run_kernels(f, 0, 3);
    assert_int_equal(tio_runtime_fetch_all(f->rt), 0);
    for (uint32_t t = 0; t < N_TENSORS; t++) {
        assert_true(tio_runtime_is_resident(f->rt, t));
        assert_true(has_pattern(f->fw.mem[t], tensor_bytes[t], t + 1));
    }
    tio_runtime_stats s = stats_of(f);
    assert_int_equal(s.stalls, 0);
    assert_int_equal(s.bytes_fetched_urgent, (uint64_t)T0_BYTES + T2_BYTES);
    assert_int_equal(s.resident_bytes, ALL_BYTES);
}

/* Unbinding an offloaded tensor drops its copy; its prefetch is skipped;
 * binding it again counts it resident. */
static void test_unbind_and_rebind(void **state)
{
    fixture *f = *state;
    run_kernels(f, 0, 3);
    assert_int_equal(tio_runtime_tensor_unbind(f->rt, 0), 0);
    assert_int_equal(stats_of(f).resident_bytes, T1_BYTES);
    run_kernels(f, 3, 6);
    assert_int_equal(f->fw.n_allocate[0], 0);
    assert_int_equal(tio_runtime_ensure_resident(f->rt, 0, NULL), TIO_EUNKNOWN);
    assert_int_equal(tio_runtime_tensor_unbind(f->rt, 0), TIO_EUNKNOWN);

    f->fw.mem[0] = malloc(T0_BYTES);
    assert_non_null(f->fw.mem[0]);
    fill_pattern(f->fw.mem[0], T0_BYTES, 5);
    assert_int_equal(tio_runtime_tensor_bind(f->rt, 0, f->fw.mem[0], T0_BYTES), 0);
    assert_int_equal(stats_of(f).resident_bytes, ALL_BYTES);
    assert_int_equal(tio_runtime_iteration_begin(f->rt), 0);
    run_kernels(f, 0, 6);
    assert_true(has_pattern(f->fw.mem[0], T0_BYTES, 5));
    assert_int_equal(f->fw.n_allocate[0], 1);
}

/* Unbinding a tensor whose write is in flight waits for it. */
static void test_unbind_during_write(void **state)
{
    fixture *f = *state;
    run_kernels(f, 0, 2);
    assert_int_equal(tio_runtime_tensor_unbind(f->rt, 0), 0);
    assert_int_equal(stats_of(f).resident_bytes, (uint64_t)T1_BYTES + T2_BYTES);
    run_kernels(f, 2, 6);
    assert_int_equal(f->fw.n_release[0], 0);
    assert_int_equal(f->fw.n_allocate[0], 0);
}

/* Destroying the runtime with a write in flight waits for it (ASan would
 * see the buffer freed under the engine otherwise). */
static void test_destroy_with_io_in_flight(void **state)
{
    fixture *f = *state;
    run_kernels(f, 0, 2);
    tio_runtime_destroy(f->rt);
    f->rt = NULL;
}

static void test_bind_errors(void **state)
{
    fixture *f = *state;
    assert_int_equal(tio_runtime_tensor_bind(f->rt, 0, NULL, T0_BYTES), -EINVAL);
    assert_int_equal(tio_runtime_ensure_resident(f->rt, 7, NULL), TIO_EUNKNOWN);
    assert_non_null(strstr(tio_last_error(), "tensor 7"));
    assert_false(tio_runtime_is_resident(f->rt, 7));
    assert_int_equal(stats_of(f).resident_bytes, ALL_BYTES);
    /* No kernel ran: the binds before it are not a kernel's memory. */
    assert_int_equal(stats_of(f).peak_resident_bytes, 0);
    assert_false(stats_of(f).diverged);
}

/* Issue 12 item 1 (batch sizes 4,4,4,4,3,...: a 3-row input bound as the
 * trace's 4-row tensor was resized and overwritten).  A tensor of another
 * size than the trace's, or one the trace lacks, is never bound: the
 * iteration diverges, its planned migrations stop (T0 and T2 are not
 * offloaded at kernel 1), and the next iteration runs the plan again. */
static void test_bind_of_another_size_diverges(void **state)
{
    fixture *f = *state;
    assert_int_equal(tio_runtime_iteration_begin(f->rt), 0);
    run_kernels(f, 0, 1);
    void *other = malloc(T1_BYTES - 8);
    assert_non_null(other);
    assert_int_equal(tio_runtime_tensor_bind(f->rt, 1, other, T1_BYTES - 8), 1);
    tio_runtime_stats s = stats_of(f);
    assert_true(s.diverged);
    assert_int_equal(s.diverged_iterations, 1);
    assert_int_equal(s.diverged_kernel, 0);
    assert_int_equal(s.resident_bytes, ALL_BYTES); /* T1 keeps its binding */
    assert_int_equal(tio_runtime_tensor_bind(f->rt, 3, other, 64), 1); /* no tensor 3 */
    run_kernels(f, 1, 6);
    assert_int_equal(f->fw.n_release[0] + f->fw.n_release[2], 0);
    assert_int_equal(stats_of(f).n_offloads, 0);
    assert_int_equal(tio_runtime_iteration_end(f->rt), 0);
    assert_int_equal(stats_of(f).diverged_iterations, 1);
    free(other);

    /* The iteration_end unbound the intermediates; bound again, the plan runs. */
    bind_all(f);
    assert_int_equal(tio_runtime_iteration_begin(f->rt), 0);
    run_kernels(f, 0, 6);
    assert_int_equal(tio_runtime_iteration_end(f->rt), 0);
    s = stats_of(f);
    assert_int_equal(s.n_offloads, 2);
    assert_int_equal(s.diverged_iterations, 1);
    assert_true(has_pattern(f->fw.mem[0], T0_BYTES, 1));
}

/* Intermediate tensors still bound at iteration_end (the program keeps
 * them: an input batch, the loss) are made resident and unbound, so the
 * plan never moves them again.  An iteration that ends early diverged. */
static void test_iteration_end_unbinds_intermediates(void **state)
{
    fixture *f = *state;
    assert_int_equal(tio_runtime_iteration_begin(f->rt), 0);
    run_kernels(f, 0, 3); /* T0 (SSD) and T2 (host) are away now */
    assert_int_equal(stats_of(f).resident_bytes, T1_BYTES);
    assert_int_equal(tio_runtime_iteration_end(f->rt), 0);
    tio_runtime_stats s = stats_of(f);
    assert_int_equal(s.diverged_iterations, 1);
    assert_int_equal(s.diverged_kernel, 3);
    assert_int_equal(s.resident_bytes, 0);
    for (uint32_t t = 0; t < N_TENSORS; t++) {
        assert_false(tio_runtime_is_resident(f->rt, t));
        assert_non_null(f->fw.mem[t]);
        assert_true(has_pattern(f->fw.mem[t], tensor_bytes[t], t + 1));
    }
    assert_int_equal(tio_runtime_tensor_unbind(f->rt, 0), TIO_EUNKNOWN);
    assert_int_equal(tio_runtime_iteration_end(f->rt), -EINVAL);
}

/* T2's last use is kernel 4 and the trace records no free, so it is freed
 * before kernel 5: still bound when kernel 5 begins, it is held past its
 * free until it is unbound, in every iteration.  A diverged iteration
 * reports nothing; a free_kernel at the iteration's end is never past. */
static void test_held_past_free(void **state)
{
    fixture *f = *state;
    uint32_t ids[2] = {99, 99};
    assert_int_equal(tio_runtime_held_past_free(f->rt, 5, ids, 2), 0); /* no iteration yet */
    assert_int_equal(tio_runtime_held_past_free(f->rt, 5, NULL, 1), -EINVAL);
    assert_int_equal(tio_runtime_held_past_free(NULL, 5, NULL, 0), -EINVAL);
    for (int it = 0; it < 2; it++) {
        assert_int_equal(tio_runtime_iteration_begin(f->rt), 0);
        for (uint32_t k = 0; k < 5; k++) {
            assert_int_equal(tio_runtime_held_past_free(f->rt, k, ids, 2), 0);
            assert_int_equal(tio_runtime_kernel_begin(f->rt, k, kernel_names[k]), 0);
        }
        assert_int_equal(tio_runtime_held_past_free(f->rt, 5, ids, 2), 1);
        assert_int_equal(ids[0], 2);
        assert_int_equal(tio_runtime_held_past_free(f->rt, 5, NULL, 0), 1);
        assert_int_equal(tio_runtime_tensor_unbind(f->rt, 2), 0);
        assert_int_equal(tio_runtime_held_past_free(f->rt, 5, ids, 2), 0);
        /* bound again after its end was passed: held again */
        assert_int_equal(tio_runtime_tensor_bind(f->rt, 2, f->fw.mem[2], T2_BYTES), 0);
        assert_int_equal(tio_runtime_held_past_free(f->rt, 5, ids, 2), 1);
        assert_int_equal(tio_runtime_tensor_unbind(f->rt, 2), 0);
        run_kernels(f, 5, 6);
        assert_int_equal(tio_runtime_iteration_end(f->rt), 0);
        bind_all(f);
    }
    assert_int_equal(tio_runtime_iteration_begin(f->rt), 0);
    run_kernels(f, 0, 5);
    assert_int_equal(tio_runtime_kernel_begin(f->rt, 5, "another"), 1);
    assert_int_equal(tio_runtime_held_past_free(f->rt, 5, ids, 2), 0);
    assert_int_equal(tio_runtime_iteration_end(f->rt), 0);

    assert_int_equal(tio_trace_set_free_kernel(f->trace, 2, 6), 0);
    tio_runtime_destroy(f->rt);
    assert_int_equal(tio_runtime_create(&f->plan, f->trace, f->engine, &f->cb, &f->rt), 0);
    bind_all(f);
    assert_int_equal(tio_runtime_iteration_begin(f->rt), 0);
    run_kernels(f, 0, 6);
    assert_int_equal(tio_runtime_held_past_free(f->rt, 5, ids, 2), 0);
    assert_int_equal(tio_runtime_iteration_end(f->rt), 0);
}

/* A tensor past its end whose memory the plan released (T2 offloaded to
 * the host at kernel 2, never prefetched: nothing in this C test uses it at
 * kernel 4) holds no memory, so it is not counted. */
static void test_held_past_free_counts_memory(void **state)
{
    fixture *f = *state;
    f->migrations[0] = migration(2, TIO_MIGRATION_OFFLOAD, 1, 2, TIO_TIER_HOST);
    plan_init(&f->plan, f->migrations, 1);
    tio_runtime_destroy(f->rt);
    assert_int_equal(tio_runtime_create(&f->plan, f->trace, f->engine, &f->cb, &f->rt), 0);
    bind_all(f);
    assert_int_equal(tio_runtime_iteration_begin(f->rt), 0);
    run_kernels(f, 0, 5);
    assert_false(tio_runtime_is_resident(f->rt, 2));
    uint32_t id = 99;
    assert_int_equal(tio_runtime_held_past_free(f->rt, 5, &id, 1), 0);
    assert_int_equal(id, 99);
    /* fetched back, it holds memory again */
    assert_int_equal(tio_runtime_ensure_resident(f->rt, 2, NULL), 1);
    assert_int_equal(tio_runtime_held_past_free(f->rt, 5, &id, 1), 1);
    assert_int_equal(id, 2);
    run_kernels(f, 5, 6);
    assert_int_equal(tio_runtime_iteration_end(f->rt), 0);
}

/* Kernels over the plan's capacity are counted once each, with the largest
 * excess; resident bytes per kernel are ALL, ALL, T1, ALL, ALL, ALL. */
static void test_over_capacity_kernels_are_counted(void **state)
{
    fixture *f = *state;
    f->plan.capacity_bytes = ALL_BYTES - 1;
    tio_runtime_destroy(f->rt);
    assert_int_equal(tio_runtime_create(&f->plan, f->trace, f->engine, &f->cb, &f->rt), 0);
    bind_all(f);
    assert_int_equal(tio_runtime_iteration_begin(f->rt), 0);
    run_kernels(f, 0, 6);
    tio_runtime_stats s = stats_of(f);
    assert_int_equal(s.over_capacity_kernels, 5);
    assert_int_equal(s.over_capacity_bytes_max, 1);
    assert_int_equal(s.capacity_bytes, ALL_BYTES - 1);
    assert_int_equal(s.peak_resident_bytes, ALL_BYTES);
    /* Untracked memory counts against the capacity at the kernel it is
     * allocated in, and iteration_end forgets it. */
    assert_int_equal(tio_runtime_account_untracked(f->rt, 100), 0);
    s = stats_of(f);
    assert_int_equal(s.over_capacity_kernels, 5); /* kernel 5 was counted already */
    assert_int_equal(s.over_capacity_bytes_max, 101);
    assert_int_equal(s.peak_resident_bytes, ALL_BYTES + 100);
    assert_int_equal(tio_runtime_account_untracked(f->rt, -200), -EINVAL);
    assert_int_equal(tio_runtime_account_untracked(f->rt, -40), 0);
    assert_int_equal(stats_of(f).resident_bytes, ALL_BYTES + 60);
    assert_int_equal(tio_runtime_iteration_end(f->rt), 0);
    assert_int_equal(stats_of(f).resident_bytes, 0);
}

/* A program's own bytes (the compiled path: what Inductor's code holds)
 * set the untracked total at the next kernel_begin, less the bound
 * tensors' full size, so resident is the program's bytes less what the
 * runtime released (T2, offloaded to the host at kernel 2). */
static void test_account_program(void **state)
{
    fixture *f = *state;
    f->migrations[0] = migration(2, TIO_MIGRATION_OFFLOAD, 1, 2, TIO_TIER_HOST);
    plan_init(&f->plan, f->migrations, 1);
    tio_runtime_destroy(f->rt);
    assert_int_equal(tio_runtime_create(&f->plan, f->trace, f->engine, &f->cb, &f->rt), 0);
    assert_int_equal(tio_runtime_account_program(f->rt, 1), -EINVAL); /* no iteration */
    assert_int_equal(tio_runtime_account_program(NULL, 1), -EINVAL);
    bind_all(f);
    assert_int_equal(tio_runtime_iteration_begin(f->rt), 0);
    assert_int_equal(tio_runtime_account_program(f->rt, ALL_BYTES + 500), 0);
    assert_int_equal(stats_of(f).resident_bytes, ALL_BYTES); /* not before kernel_begin */
    run_kernels(f, 0, 1);
    assert_int_equal(stats_of(f).resident_bytes, ALL_BYTES + 500);
    /* the program's bytes count a tensor whether it is bound or not */
    assert_int_equal(tio_runtime_tensor_unbind(f->rt, 1), 0);
    assert_int_equal(stats_of(f).resident_bytes, ALL_BYTES + 500);
    assert_int_equal(tio_runtime_tensor_bind(f->rt, 1, f->fw.mem[1], T1_BYTES), 0);
    assert_int_equal(stats_of(f).resident_bytes, ALL_BYTES + 500);
    assert_int_equal(tio_runtime_account_program(f->rt, ALL_BYTES + 100), 0);
    run_kernels(f, 1, 2);
    assert_int_equal(stats_of(f).resident_bytes, ALL_BYTES + 100);
    assert_int_equal(tio_runtime_account_program(f->rt, ALL_BYTES), 0);
    run_kernels(f, 2, 3);
    assert_int_equal(stats_of(f).resident_bytes, ALL_BYTES - T2_BYTES);
    /* less than the bound tensors: they count, nothing else */
    assert_int_equal(tio_runtime_account_program(f->rt, 10), 0);
    run_kernels(f, 3, 4);
    assert_int_equal(stats_of(f).resident_bytes, ALL_BYTES - T2_BYTES);
    assert_int_equal(tio_runtime_ensure_resident(f->rt, 2, NULL), 1);
    run_kernels(f, 4, 6);
    tio_runtime_stats s = stats_of(f);
    assert_int_equal(s.resident_bytes, ALL_BYTES);
    assert_int_equal(s.peak_resident_bytes, ALL_BYTES + 500);
    assert_int_equal(s.over_capacity_kernels, 2);
    assert_int_equal(s.over_capacity_bytes_max, 500);
    assert_int_equal(tio_runtime_iteration_end(f->rt), 0);
    assert_int_equal(stats_of(f).resident_bytes, 0);
}

/* A kernel that diverges resumes the plan in the next iteration. */
static void test_next_iteration_after_divergence_runs_the_plan(void **state)
{
    fixture *f = *state;
    assert_int_equal(tio_runtime_iteration_begin(f->rt), 0);
    run_kernels(f, 0, 1);
    assert_int_equal(tio_runtime_kernel_begin(f->rt, 1, "not mm1"), 1);
    run_kernels(f, 2, 6);
    assert_int_equal(tio_runtime_iteration_end(f->rt), 0);
    assert_int_equal(stats_of(f).n_offloads, 0);
    bind_all(f);
    assert_int_equal(tio_runtime_iteration_begin(f->rt), 0);
    run_kernels(f, 0, 6);
    assert_int_equal(tio_runtime_iteration_end(f->rt), 0);
    tio_runtime_stats s = stats_of(f);
    assert_int_equal(s.n_offloads, 2);
    assert_int_equal(s.n_prefetches, 2);
    assert_int_equal(s.diverged_iterations, 1);
    assert_int_equal(s.stalls, 0);
}

typedef struct {
    tio_runtime *rt;
    int rc[8];
    char msg[256];
} other_thread_calls;

static void *call_from_other_thread(void *arg)
{
    other_thread_calls *c = arg;
    void *mem = &c->rc;
    c->rc[0] = tio_runtime_iteration_begin(c->rt);
    c->rc[1] = tio_runtime_kernel_begin(c->rt, 0, "embed");
    c->rc[2] = tio_runtime_ensure_resident(c->rt, 0, NULL);
    c->rc[3] = tio_runtime_tensor_bind(c->rt, 1, mem, T1_BYTES);
    c->rc[4] = tio_runtime_tensor_unbind(c->rt, 1);
    c->rc[5] = tio_runtime_fetch_all(c->rt);
    c->rc[6] = tio_runtime_iteration_end(c->rt);
    c->rc[7] = tio_runtime_account_program(c->rt, 1);
    snprintf(c->msg, sizeof c->msg, "%s", tio_last_error());
    return NULL;
}

/* Issue 12 item 9: the runtime used from a second thread (fetch_all
 * deadlocked; a release freed memory under a reader).  Every call from a
 * thread other than the creator's is refused with -EPERM and changes
 * nothing. */
static void test_calls_from_another_thread_are_refused(void **state)
{
    fixture *f = *state;
    assert_int_equal(tio_runtime_iteration_begin(f->rt), 0);
    run_kernels(f, 0, 3);
    other_thread_calls c = {.rt = f->rt};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, call_from_other_thread, &c), 0);
    assert_int_equal(pthread_join(th, NULL), 0);
    for (int i = 0; i < 8; i++)
        assert_int_equal(c.rc[i], -EPERM);
    assert_non_null(strstr(c.msg, "another thread"));
    tio_runtime_stats s = stats_of(f);
    assert_int_equal(s.iterations, 1);
    assert_int_equal(s.resident_bytes, T1_BYTES);
    assert_int_equal(f->fw.n_allocate[0], 0);
    run_kernels(f, 3, 6);
    assert_int_equal(tio_runtime_iteration_end(f->rt), 0);
    assert_true(has_pattern(f->fw.mem[0], T0_BYTES, 1));
}

static int create_with(tio_migration m, tio_engine *engine)
{
    tio_trace *tr = make_trace();
    tio_plan plan;
    plan_init(&plan, &m, 1);
    fake_framework fw = {0};
    tio_runtime_callbacks cb = {.ctx = &fw, .allocate = fw_allocate, .release = fw_release};
    tio_runtime *rt = NULL;
    int rc = tio_runtime_create(&plan, tr, engine, &cb, &rt);
    tio_runtime_destroy(rt);
    tio_trace_destroy(tr);
    return rc;
}

static void test_create_rejects_bad_plans(void **state)
{
    (void)state;
    tio_migration m = migration(2, TIO_MIGRATION_OFFLOAD, 1, 2, TIO_TIER_HOST);
    assert_int_equal(create_with(m, NULL), 0);

    m.tensor = 7;
    assert_int_equal(create_with(m, NULL), TIO_EUNKNOWN);
    assert_non_null(strstr(tio_last_error(), "tensor 7"));

    m = migration(2, TIO_MIGRATION_OFFLOAD, 1, 6, TIO_TIER_HOST);
    assert_int_equal(create_with(m, NULL), -EINVAL);
    m = migration(2, TIO_MIGRATION_OFFLOAD, 1, 2, TIO_TIER_HOST);
    m.bytes = 4096;
    assert_int_equal(create_with(m, NULL), -EINVAL);
    m = migration(0, TIO_MIGRATION_OFFLOAD, 1, 2, TIO_TIER_SSD);
    assert_int_equal(create_with(m, NULL), -EINVAL);
    m = migration(0, TIO_MIGRATION_OFFLOAD, 1, 2, TIO_TIER_DEVICE);
    assert_int_equal(create_with(m, NULL), -EINVAL);
}

/* The scaffold of the global-tensor tests below: one global tensor G of
 * G_BYTES (64 KiB + 1) used only by kernel `use` of `n` kernels, a plan of
 * one prefetch and one offload of G to SSD, an engine, and a runtime with G
 * bound to a buffer holding a pattern. */
#define G_BYTES 65537u

typedef struct {
    tio_trace *tr;
    tio_migration m[2];
    tio_plan plan;
    char dir[4096];
    tio_engine *engine;
    fake_framework fw;
    tio_runtime_callbacks cb;
    tio_runtime *rt;
} one_global;

static tio_migration g_migration(tio_migration_kind kind, uint32_t trigger, uint32_t deadline)
{
    return (tio_migration){.tensor = 0, .kind = kind, .trigger_kernel = trigger,
                           .deadline_kernel = deadline, .tier = TIO_TIER_SSD, .bytes = G_BYTES};
}

/* Trace and plan only (a test may check the plan before the runtime); G is
 * used by the kernels whose bits are set in `uses`. */
static void one_global_plan(one_global *o, const char *const *names, uint32_t n, uint32_t uses,
                            tio_migration prefetch, tio_migration offload)
{
    memset(o, 0, sizeof *o);
    assert_int_equal(tio_trace_create("one global", &o->tr), 0);
    uint32_t g;
    assert_int_equal(tio_trace_add_tensor(o->tr, G_BYTES, TIO_KIND_PARAMETER, true, "g", &g), 0);
    assert_int_equal(g, 0);
    for (uint32_t k = 0; k < n; k++) {
        assert_int_equal(tio_trace_add_kernel(o->tr, names[k], 1000), 0);
        if (uses >> k & 1)
            assert_int_equal(tio_trace_add_access(o->tr, g, TIO_ACCESS_READ), 0);
    }
    o->m[0] = prefetch;
    o->m[1] = offload;
    plan_init(&o->plan, o->m, 2);
    o->plan.n_kernels = n;
    o->plan.n_tensors = 1;
}

/* Engine, runtime, G bound with pattern `seed`. */
static void one_global_start(one_global *o, unsigned seed)
{
    make_dir(o->dir, sizeof o->dir);
    tio_engine_options eo;
    tio_engine_options_default(&eo);
    const char *dirs[1] = {o->dir};
    eo.dirs = dirs;
    eo.n_dirs = 1;
    eo.space_bytes = 1u << 20;
    assert_int_equal(tio_engine_create(&eo, &o->engine), 0);
    o->fw.bytes[0] = G_BYTES;
    o->cb = (tio_runtime_callbacks){.ctx = &o->fw, .allocate = fw_allocate, .release = fw_release};
    assert_int_equal(tio_runtime_create(&o->plan, o->tr, o->engine, &o->cb, &o->rt), 0);
    o->fw.mem[0] = malloc(G_BYTES);
    assert_non_null(o->fw.mem[0]);
    fill_pattern(o->fw.mem[0], G_BYTES, seed);
    assert_int_equal(tio_runtime_tensor_bind(o->rt, 0, o->fw.mem[0], G_BYTES), 0);
}

static void one_global_finish(one_global *o)
{
    tio_runtime_destroy(o->rt);
    tio_engine_destroy(o->engine);
    rmdir(o->dir);
    free(o->fw.mem[0]);
    free(o->plan.planned_memory_bytes);
    tio_trace_destroy(o->tr);
}

/* A global tensor G (64 KiB + 1) used only by kernel 2 of 4 has one
 * wrap-around inactive period: offload triggered at 3, done by kernel 0 of
 * the next iteration; prefetch triggered at 1, done by 2.  The first
 * iteration_begin starts the write the (absent) previous iteration would
 * have started at its kernel 3, so G leaves at kernel 0 and comes back at 1
 * in every iteration, the first included. */
static void test_wrap_around_period(void **state)
{
    (void)state;
    static const char *const names[4] = {"a", "b", "use_g", "d"};
    one_global o;
    one_global_plan(&o, names, 4, 1u << 2, g_migration(TIO_MIGRATION_PREFETCH, 1, 2),
                    g_migration(TIO_MIGRATION_OFFLOAD, 3, 0));
    one_global_start(&o, 42);
    for (int it = 0; it < 3; it++) {
        assert_int_equal(tio_runtime_iteration_begin(o.rt), 0);
        for (uint32_t k = 0; k < 4; k++) {
            assert_int_equal(tio_runtime_kernel_begin(o.rt, k, names[k]), 0);
            if (k == 0)
                assert_false(tio_runtime_is_resident(o.rt, 0));
            if (k == 2) {
                void *addr = NULL;
                assert_int_equal(tio_runtime_ensure_resident(o.rt, 0, &addr), 0);
                assert_true(has_pattern(addr, G_BYTES, 42));
            }
        }
    }
    /* Offloads before iteration 0 and at the end of iterations 0, 1, 2
     * (fetch_all waits for the last write and keeps G resident); releases
     * and prefetches in iterations 0, 1 and 2. */
    assert_int_equal(tio_runtime_fetch_all(o.rt), 0);
    assert_true(tio_runtime_is_resident(o.rt, 0));
    tio_runtime_stats s;
    tio_runtime_get_stats(o.rt, &s);
    assert_int_equal(s.n_offloads, 4);
    assert_int_equal(s.n_prefetches, 3);
    assert_int_equal(o.fw.n_release[0], 3);
    assert_int_equal(o.fw.n_allocate[0], 3);
    assert_int_equal(s.stalls, 0);
    assert_int_equal(s.iterations, 3);
    assert_int_equal(s.peak_resident_bytes, G_BYTES);
    one_global_finish(&o);
}

/* A global tensor G (64 KiB + 1) used only by kernel 1 of 6, whose plan
 * keeps it on SSD across the iteration boundary: offload triggered at 2,
 * done by 4; prefetch triggered at 0 of the next iteration, done by 1.  In
 * the steady state G is away at kernel 0, so the first iteration_begin
 * writes it out and releases it at once: resident bytes are 0 before kernel
 * 0, and the prefetch at 0 brings the same bytes back for kernel 1. */
static void test_first_iteration_starts_from_steady_state(void **state)
{
    (void)state;
    static const char *const names[6] = {"a", "use_g", "c", "d", "e", "f"};
    one_global o;
    one_global_plan(&o, names, 6, 1u << 1, g_migration(TIO_MIGRATION_PREFETCH, 0, 1),
                    g_migration(TIO_MIGRATION_OFFLOAD, 2, 4));
    one_global_start(&o, 7);
    tio_runtime_stats s;
    for (int it = 0; it < 2; it++) {
        assert_int_equal(tio_runtime_iteration_begin(o.rt), 0);
        tio_runtime_get_stats(o.rt, &s);
        assert_int_equal(s.resident_bytes, 0);
        assert_false(tio_runtime_is_resident(o.rt, 0));
        for (uint32_t k = 0; k < 6; k++) {
            assert_int_equal(tio_runtime_kernel_begin(o.rt, k, names[k]), 0);
            if (k == 1) {
                void *addr = NULL;
                assert_int_equal(tio_runtime_ensure_resident(o.rt, 0, &addr), 0);
                assert_true(has_pattern(addr, G_BYTES, 7));
            }
        }
    }
    tio_runtime_get_stats(o.rt, &s);
    assert_int_equal(s.n_offloads, 3);   /* before iteration 0, at kernel 2 of both */
    assert_int_equal(s.n_prefetches, 2); /* at kernel 0 of iterations 0 and 1 */
    assert_int_equal(o.fw.n_release[0], 3);
    assert_int_equal(o.fw.n_allocate[0], 2);
    assert_int_equal(s.stalls, 0);
    assert_int_equal(s.peak_resident_bytes, G_BYTES);
    assert_int_equal(tio_runtime_fetch_all(o.rt), 0);
    one_global_finish(&o);
}

/* Migrations triggered and due at the same kernel are synchronous, as
 * tio_plan_check and the simulator treat them.  G (64 KiB + 1, global) is
 * used only by kernel 1 of 6; the plan offloads it to SSD at kernel 3 with
 * deadline 3, and prefetches it at kernel 1 of the next iteration with
 * deadline 1.  The runtime used to run deadlines before triggers, so the
 * offload was never released (G stayed resident for good) and the prefetch
 * was only waited for by the use (a stall); the first iteration_begin also
 * missed that G is away at kernel 0 (it tested deadline > trigger).  Now the
 * resident bytes after every kernel_begin are exactly tio_plan_check's M'. */
static void test_same_kernel_trigger_and_deadline(void **state)
{
    (void)state;
    static const char *const names[6] = {"a", "use_g", "c", "d", "e", "f"};
    one_global o;
    one_global_plan(&o, names, 6, 1u << 1, g_migration(TIO_MIGRATION_PREFETCH, 1, 1),
                    g_migration(TIO_MIGRATION_OFFLOAD, 3, 3));
    assert_int_equal(tio_plan_check(&o.plan, o.tr, NULL), 0);
    static const uint64_t want[6] = {0, G_BYTES, G_BYTES, 0, 0, 0}; /* G away over [3, 7) */
    assert_memory_equal(o.plan.planned_memory_bytes, want, sizeof want);
    one_global_start(&o, 9);

    tio_runtime_stats s;
    for (int it = 0; it < 2; it++) {
        assert_int_equal(tio_runtime_iteration_begin(o.rt), 0);
        for (uint32_t k = 0; k < 6; k++) {
            assert_int_equal(tio_runtime_kernel_begin(o.rt, k, names[k]), 0);
            if (k == 1) {
                void *addr = NULL;
                assert_int_equal(tio_runtime_ensure_resident(o.rt, 0, &addr), 0);
                assert_true(has_pattern(addr, G_BYTES, 9));
            }
            tio_runtime_get_stats(o.rt, &s);
            assert_int_equal(s.resident_bytes, want[k]);
        }
    }
    tio_runtime_get_stats(o.rt, &s);
    assert_int_equal(s.n_offloads, 3);   /* before iteration 0, at kernel 3 of both */
    assert_int_equal(s.n_prefetches, 2); /* at kernel 1 of both */
    assert_int_equal(o.fw.n_release[0], 3);
    assert_int_equal(o.fw.n_allocate[0], 2);
    assert_int_equal(s.stalls, 0);
    assert_int_equal(tio_runtime_fetch_all(o.rt), 0);
    one_global_finish(&o);
}

/* Issue 12 item 3 (a plain step between two iterations read optimizer
 * state released across the boundary).  G is away at kernel 0 of the plan
 * of test_first_iteration_starts_from_steady_state; a use between
 * iterations fetches it (counted in fetches_outside, not as a stall), and
 * the next iteration_begin writes it out again, so kernel 0 starts where
 * the plan does. */
static void test_use_between_iterations_is_fetched_then_placed_again(void **state)
{
    (void)state;
    static const char *const names[6] = {"a", "use_g", "c", "d", "e", "f"};
    one_global o;
    one_global_plan(&o, names, 6, 1u << 1, g_migration(TIO_MIGRATION_PREFETCH, 0, 1),
                    g_migration(TIO_MIGRATION_OFFLOAD, 2, 4));
    one_global_start(&o, 11);
    tio_runtime_stats s;
    for (int it = 0; it < 2; it++) {
        assert_int_equal(tio_runtime_iteration_begin(o.rt), 0);
        tio_runtime_get_stats(o.rt, &s);
        assert_int_equal(s.resident_bytes, 0);
        for (uint32_t k = 0; k < 6; k++)
            assert_int_equal(tio_runtime_kernel_begin(o.rt, k, names[k]), 0);
        assert_int_equal(tio_runtime_iteration_end(o.rt), 0);
        assert_false(tio_runtime_is_resident(o.rt, 0));
        void *addr = NULL;
        assert_int_equal(tio_runtime_ensure_resident(o.rt, 0, &addr), 1);
        assert_true(has_pattern(addr, G_BYTES, it ? 12 : 11));
        fill_pattern(addr, G_BYTES, 12 + it); /* a plain step changes it */
    }
    tio_runtime_get_stats(o.rt, &s);
    assert_int_equal(s.fetches_outside, 2);
    assert_int_equal(s.bytes_fetched_outside, 2ull * G_BYTES);
    assert_int_equal(s.stalls, 0);
    assert_int_equal(s.bytes_fetched_urgent, 0);
    assert_int_equal(s.n_offloads, 4); /* before each iteration, at kernel 2 of each */
    assert_int_equal(s.peak_resident_bytes, G_BYTES);
    assert_int_equal(tio_runtime_iteration_begin(o.rt), 0);
    assert_int_equal(tio_runtime_kernel_begin(o.rt, 0, names[0]), 0);
    assert_int_equal(tio_runtime_kernel_begin(o.rt, 1, names[1]), 0);
    void *addr = NULL;
    assert_int_equal(tio_runtime_ensure_resident(o.rt, 0, &addr), 0);
    assert_true(has_pattern(addr, G_BYTES, 13)); /* the change made between iterations */
    assert_int_equal(tio_runtime_fetch_all(o.rt), 0);
    one_global_finish(&o);
}

/* G is used at kernels 0 and 4 of 6 and away over 2..3 (offload 1->2,
 * prefetch 3->4), resident at kernel 0.  An iteration that diverges at
 * kernel 3 leaves it offloaded (nothing used it after); the next
 * iteration_begin starts reading it back, so kernel 0 finds it resident. */
static void test_begin_reads_back_what_a_diverged_iteration_left_away(void **state)
{
    (void)state;
    static const char *const names[6] = {"use_g", "b", "c", "d", "use_g2", "f"};
    one_global o;
    one_global_plan(&o, names, 6, 1u << 0 | 1u << 4, g_migration(TIO_MIGRATION_PREFETCH, 3, 4),
                    g_migration(TIO_MIGRATION_OFFLOAD, 1, 2));
    one_global_start(&o, 21);
    assert_int_equal(tio_runtime_iteration_begin(o.rt), 0);
    for (uint32_t k = 0; k < 3; k++)
        assert_int_equal(tio_runtime_kernel_begin(o.rt, k, names[k]), 0);
    assert_int_equal(tio_runtime_kernel_begin(o.rt, 3, "eval"), 1);
    assert_int_equal(tio_runtime_iteration_end(o.rt), 0);
    assert_false(tio_runtime_is_resident(o.rt, 0));
    assert_int_equal(tio_runtime_iteration_begin(o.rt), 0);
    assert_int_equal(tio_runtime_kernel_begin(o.rt, 0, names[0]), 0);
    void *addr = NULL;
    int rc = tio_runtime_ensure_resident(o.rt, 0, &addr);
    assert_true(rc == 0 || rc == 1); /* the read may still be in flight */
    assert_true(has_pattern(addr, G_BYTES, 21));
    for (uint32_t k = 1; k < 6; k++)
        assert_int_equal(tio_runtime_kernel_begin(o.rt, k, names[k]), 0);
    assert_int_equal(tio_runtime_iteration_end(o.rt), 0);
    tio_runtime_stats s;
    tio_runtime_get_stats(o.rt, &s);
    assert_int_equal(s.bytes_fetched_urgent, G_BYTES);
    assert_int_equal(s.n_offloads, 2);
    assert_int_equal(s.n_prefetches, 1);
    assert_int_equal(s.diverged_iterations, 1);
    assert_true(tio_runtime_is_resident(o.rt, 0));
    one_global_finish(&o);
}

/* With staging callbacks (device memory the engine cannot address), every
 * transfer goes through a staging buffer: one stage_out per offload (SSD
 * T0, host T2), one stage_in per prefetch, an unstage after each, a copy
 * into the tensor only after reads; the bytes come back exact. */
static void test_staged_round_trip(void **state)
{
    fixture *f = *state;
    assert_int_equal(tio_runtime_iteration_begin(f->rt), 0);
    run_kernels(f, 0, 6);
    assert_true(has_pattern(f->fw.mem[0], T0_BYTES, 1));
    assert_true(has_pattern(f->fw.mem[2], T2_BYTES, 3));
    for (uint32_t t = 0; t < N_TENSORS; t += 2) {
        assert_int_equal(f->fw.n_stage_out[t], 1);
        assert_int_equal(f->fw.n_stage_in[t], 1);
        assert_int_equal(f->fw.n_unstage[t], 2);
        assert_int_equal(f->fw.n_copy_in[t], 1);
        assert_null(f->fw.stage[t]);
    }
    assert_int_equal(f->fw.n_stage_out[1] + f->fw.n_stage_in[1], 0);
    /* An urgent fetch goes through staging too. */
    assert_int_equal(tio_runtime_iteration_begin(f->rt), 0);
    run_kernels(f, 0, 3);
    void *addr = NULL;
    assert_int_equal(tio_runtime_ensure_resident(f->rt, 0, &addr), 1);
    assert_true(has_pattern(addr, T0_BYTES, 1));
    assert_int_equal(f->fw.n_copy_in[0], 2);
    assert_null(f->fw.stage[0]);
}

/* Staging callbacks come all together or not at all. */
static void test_partial_staging_rejected(void **state)
{
    (void)state;
    tio_trace *tr = make_trace();
    tio_migration m[1] = {migration(1, TIO_MIGRATION_OFFLOAD, 1, 2, TIO_TIER_HOST)};
    tio_plan plan;
    plan_init(&plan, m, 0);
    fake_framework fw = {0};
    tio_runtime_callbacks cb = {.ctx = &fw, .allocate = fw_allocate, .release = fw_release,
                                .stage_out = fw_stage_out};
    tio_runtime *rt = NULL;
    assert_int_equal(tio_runtime_create(&plan, tr, NULL, &cb, &rt), -EINVAL);
    assert_null(rt);
    tio_trace_destroy(tr);
}

#define BOTH_BACKENDS(fn)                                                  \
    {#fn "/psync", fn, setup_psync, fixture_teardown, NULL},               \
        {#fn "/auto", fn, setup_auto, fixture_teardown, NULL}

int main(void)
{
    const struct CMUnitTest tests[] = {
        BOTH_BACKENDS(test_round_trip),
        BOTH_BACKENDS(test_second_iteration_stores_new_bytes),
        BOTH_BACKENDS(test_ensure_resident_fetches_offloaded),
        BOTH_BACKENDS(test_ensure_resident_during_prefetch),
        BOTH_BACKENDS(test_use_during_offload_cancels_release),
        BOTH_BACKENDS(test_divergence_falls_back_to_on_demand),
        BOTH_BACKENDS(test_divergence_finishes_in_flight_offloads),
        BOTH_BACKENDS(test_fetch_all),
        BOTH_BACKENDS(test_unbind_and_rebind),
        BOTH_BACKENDS(test_unbind_during_write),
        BOTH_BACKENDS(test_destroy_with_io_in_flight),
        cmocka_unit_test_setup_teardown(test_divergence_on_kernel_out_of_range, setup_psync,
                                        fixture_teardown),
        cmocka_unit_test_setup_teardown(test_bind_errors, setup_psync, fixture_teardown),
        BOTH_BACKENDS(test_bind_of_another_size_diverges),
        BOTH_BACKENDS(test_iteration_end_unbinds_intermediates),
        cmocka_unit_test_setup_teardown(test_held_past_free, setup_psync, fixture_teardown),
        cmocka_unit_test_setup_teardown(test_held_past_free_counts_memory, setup_host_only,
                                        fixture_teardown),
        cmocka_unit_test_setup_teardown(test_over_capacity_kernels_are_counted, setup_psync,
                                        fixture_teardown),
        cmocka_unit_test_setup_teardown(test_account_program, setup_host_only, fixture_teardown),
        cmocka_unit_test_setup_teardown(test_next_iteration_after_divergence_runs_the_plan,
                                        setup_psync, fixture_teardown),
        cmocka_unit_test_setup_teardown(test_calls_from_another_thread_are_refused, setup_psync,
                                        fixture_teardown),
        cmocka_unit_test_setup_teardown(test_host_tier_without_engine, setup_host_only,
                                        fixture_teardown),
        cmocka_unit_test_setup_teardown(test_no_space_keeps_resident, setup_small_engine,
                                        fixture_teardown),
        cmocka_unit_test_setup_teardown(test_write_error_keeps_tensor, setup_write_fault,
                                        fixture_teardown),
        cmocka_unit_test_setup_teardown(test_read_error_then_fetch_on_demand, setup_read_fault,
                                        fixture_teardown),
        cmocka_unit_test(test_create_rejects_bad_plans),
        cmocka_unit_test(test_wrap_around_period),
        cmocka_unit_test_setup_teardown(test_staged_round_trip, setup_staged, fixture_teardown),
        cmocka_unit_test(test_partial_staging_rejected),
        cmocka_unit_test(test_first_iteration_starts_from_steady_state),
        cmocka_unit_test(test_same_kernel_trigger_and_deadline),
        cmocka_unit_test(test_use_between_iterations_is_fetched_then_placed_again),
        cmocka_unit_test(test_begin_reads_back_what_a_diverged_iteration_left_away),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
