/*
 * tests/c/test_engine_runtime.c — the engine as the runtime uses it: who
 * owns it, and what happens when its space is too small for a plan.
 *
 * One small job: tensor 0 (intermediate, 1 MiB + 123 bytes) and tensor 1
 * (global, 256 KiB), both used at kernels 0 and 3, both offloaded to SSD at
 * kernel 1 and prefetched at kernel 2 (due at 3).  The plan therefore holds
 * 256 KiB + (1 MiB + 4 KiB) = 1314816 bytes on SSD at once.  The fake
 * framework keeps each tensor in malloc'ed memory filled with a pattern, so
 * every test checks the bytes that came back.
 * Temporary directories live under $TIO_TEST_TMPDIR (default /tmp).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#include "common/util.h"
#include "teraio/runtime.h"

#define KIB 1024u
#define MIB (1024u * 1024u)
#define N_TENSORS 2
#define PLAN_SSD_PEAK_BYTES (256u * KIB + MIB + 4 * KIB)

static const uint64_t tensor_bytes[N_TENSORS] = {MIB + 123, 256 * KIB};
static const char *const kernel_names[4] = {"k0", "k1", "k2", "k3"};

typedef struct {
    void *mem[N_TENSORS];
} framework;

static int fw_allocate(void *ctx, uint32_t tensor, uint64_t bytes, void **addr)
{
    framework *fw = ctx;
    fw->mem[tensor] = malloc(bytes);
    *addr = fw->mem[tensor];
    return fw->mem[tensor] ? 0 : -ENOMEM;
}

static int fw_release(void *ctx, uint32_t tensor)
{
    framework *fw = ctx;
    free(fw->mem[tensor]);
    fw->mem[tensor] = NULL;
    return 0;
}

static void fill(unsigned char *p, uint64_t n, unsigned seed)
{
    for (uint64_t i = 0; i < n; i++)
        p[i] = (unsigned char)(i * 131u + seed * 17u + (i >> 12));
}

static bool has_fill(const unsigned char *p, uint64_t n, unsigned seed)
{
    for (uint64_t i = 0; i < n; i++)
        if (p[i] != (unsigned char)(i * 131u + seed * 17u + (i >> 12)))
            return false;
    return true;
}

typedef struct {
    char dir[PATH_MAX];
    tio_trace *trace;
    tio_migration migrations[4];
    tio_plan plan;
    framework fw;
    tio_runtime_callbacks cb;
} job;

static void job_init(job *j)
{
    memset(j, 0, sizeof *j);
    const char *base = tio_env("TEST_TMPDIR");
    snprintf(j->dir, sizeof j->dir, "%s/engine-runtime.XXXXXX", base && base[0] ? base : "/tmp");
    mkdir(base && base[0] ? base : "/tmp", 0755);
    assert_non_null(mkdtemp(j->dir));
    assert_int_equal(tio_trace_create("engine-runtime test", &j->trace), 0);
    for (uint32_t t = 0; t < N_TENSORS; t++) {
        uint32_t id;
        assert_int_equal(tio_trace_add_tensor(j->trace, tensor_bytes[t], TIO_KIND_ACTIVATION,
                                              t == 1, NULL, &id), 0);
    }
    for (uint32_t k = 0; k < 4; k++) {
        assert_int_equal(tio_trace_add_kernel(j->trace, kernel_names[k], 1000), 0);
        if (k == 0 || k == 3)
            for (uint32_t t = 0; t < N_TENSORS; t++)
                assert_int_equal(tio_trace_add_access(j->trace, t, TIO_ACCESS_READ), 0);
    }
    for (uint32_t t = 0; t < N_TENSORS; t++) {
        j->migrations[2 * t] = (tio_migration){.tensor = t, .kind = TIO_MIGRATION_OFFLOAD,
                                               .trigger_kernel = 1, .deadline_kernel = 1,
                                               .tier = TIO_TIER_SSD, .bytes = tensor_bytes[t]};
        j->migrations[2 * t + 1] = (tio_migration){.tensor = t, .kind = TIO_MIGRATION_PREFETCH,
                                                   .trigger_kernel = 2, .deadline_kernel = 3,
                                                   .tier = TIO_TIER_SSD,
                                                   .bytes = tensor_bytes[t]};
    }
    j->plan = (tio_plan){.n_kernels = 4, .n_tensors = N_TENSORS, .capacity_bytes = MIB,
                         .n_migrations = 4, .migrations = j->migrations};
    j->cb = (tio_runtime_callbacks){.ctx = &j->fw, .allocate = fw_allocate,
                                    .release = fw_release};
}

static void job_fini(job *j)
{
    for (uint32_t t = 0; t < N_TENSORS; t++)
        free(j->fw.mem[t]);
    tio_trace_destroy(j->trace);
    assert_int_equal(rmdir(j->dir), 0); /* fails if a backing file was left */
}

static tio_engine *engine_of(job *j, uint64_t space_bytes)
{
    const char *dirs[1] = {j->dir};
    tio_engine_options opt;
    tio_engine_options_default(&opt);
    opt.dirs = dirs;
    opt.n_dirs = 1;
    opt.space_bytes = space_bytes;
    tio_engine *e = NULL;
    assert_int_equal(tio_engine_create(&opt, &e), 0);
    return e;
}

/* One iteration: bind both tensors with their patterns, run kernels 0..3,
 * check that both came back exactly. */
static void run_iteration(job *j, tio_runtime *rt)
{
    assert_int_equal(tio_runtime_iteration_begin(rt), 0);
    for (uint32_t t = 0; t < N_TENSORS; t++) {
        if (!j->fw.mem[t]) {
            j->fw.mem[t] = malloc(tensor_bytes[t]);
            assert_non_null(j->fw.mem[t]);
            fill(j->fw.mem[t], tensor_bytes[t], t + 1);
        }
        assert_int_equal(tio_runtime_tensor_bind(rt, t, j->fw.mem[t], tensor_bytes[t]), 0);
    }
    for (uint32_t k = 0; k < 4; k++)
        assert_int_equal(tio_runtime_kernel_begin(rt, k, kernel_names[k]), 0);
    for (uint32_t t = 0; t < N_TENSORS; t++) {
        void *addr;
        assert_true(tio_runtime_ensure_resident(rt, t, &addr) >= 0);
        assert_true(has_fill(addr, tensor_bytes[t], t + 1));
    }
}

/* Issue 12, item 6: Engine.close() while an OffloadRuntime still used it
 * freed the engine under the runtime (ASan: heap use-after-free in
 * tio_engine_in_flight from the next iteration) and lost the offloaded
 * bytes.  The runtime now holds a reference: the engine, its backing file
 * and the offloaded bytes stay until the runtime is destroyed. */
static void test_engine_destroyed_while_runtime_bound(void **state)
{
    job j;
    job_init(&j);
    tio_engine *e = engine_of(&j, 2 * MIB);
    tio_runtime *rt;
    assert_int_equal(tio_runtime_create(&j.plan, j.trace, e, &j.cb, &rt), 0);
    char file[PATH_MAX];
    snprintf(file, sizeof file, "%s", tio_engine_backing_path(e, 0));
    run_iteration(&j, rt);
    tio_engine_destroy(e); /* the creator lets go */
    struct stat st;
    assert_int_equal(stat(file, &st), 0);
    run_iteration(&j, rt);
    run_iteration(&j, rt);
    tio_runtime_stats s;
    tio_runtime_get_stats(rt, &s);
    assert_int_equal(s.n_offloads, 6);
    assert_int_equal(s.bytes_prefetched, 3 * (tensor_bytes[0] + tensor_bytes[1]));
    assert_int_equal(s.offloads_refused, 0);
    tio_runtime_destroy(rt); /* the last reference: the file goes */
    assert_int_equal(stat(file, &st), -1);
    assert_int_equal(errno, ENOENT);
    job_fini(&j);
}

/* Issue 12, item 14: offloads refused for lack of engine space were silent
 * (303 refused, a resident peak twice the capacity, no log line).  A runtime
 * whose plan cannot fit in the engine is refused at creation, naming what
 * it needs; one whose plan fits the engine but not its free space, at the
 * first iteration_begin (stored copies handed over to it count as its own);
 * one that fits is accepted. */
static void test_runtime_refuses_plan_beyond_engine_space(void **state)
{
    job j;
    job_init(&j);
    tio_engine *e = engine_of(&j, MIB);
    tio_runtime *rt = (tio_runtime *)0x1;
    assert_int_equal(tio_runtime_create(&j.plan, j.trace, e, &j.cb, &rt), -ENOSPC);
    assert_null(rt);
    char want[256];
    snprintf(want, sizeof want, "runtime: the plan keeps up to %u bytes on SSD at once, the "
             "engine has %u of its %u bytes free (create it with space_bytes >= %u)",
             PLAN_SSD_PEAK_BYTES, MIB, MIB, PLAN_SSD_PEAK_BYTES);
    assert_string_equal(tio_last_error(), want);
    tio_engine_destroy(e);

    /* an engine large enough whose free space is not: refused at the first iteration_begin */
    e = engine_of(&j, PLAN_SSD_PEAK_BYTES);
    tio_extent other;
    assert_int_equal(tio_engine_alloc(e, MIB, &other), 0);
    assert_int_equal(tio_runtime_create(&j.plan, j.trace, e, &j.cb, &rt), 0);
    assert_int_equal(tio_runtime_iteration_begin(rt), -ENOSPC);
    snprintf(want, sizeof want, "runtime: the plan keeps up to %u bytes on SSD at once, the "
             "engine has %u of its %u bytes free (create it with space_bytes >= %u)",
             PLAN_SSD_PEAK_BYTES, PLAN_SSD_PEAK_BYTES - MIB, PLAN_SSD_PEAK_BYTES,
             PLAN_SSD_PEAK_BYTES + MIB);
    assert_string_equal(tio_last_error(), want);
    assert_int_equal(tio_engine_free(e, &other), 0);
    run_iteration(&j, rt);
    tio_runtime_stats s;
    tio_runtime_get_stats(rt, &s);
    assert_int_equal(s.offloads_refused, 0);
    assert_int_equal(s.bytes_offloaded_ssd, tensor_bytes[0] + tensor_bytes[1]);
    tio_runtime_destroy(rt);
    tio_engine_destroy(e);
    job_fini(&j);
}

typedef struct {
    int warn, debug;
    char first[512];
} log_lines;

static void collect_log(void *ctx, int level, const char *msg)
{
    log_lines *l = ctx;
    if (!strstr(msg, "refused"))
        return;
    if (level == TIO_LOG_WARN && l->warn++ == 0)
        snprintf(l->first, sizeof l->first, "%s", msg);
    if (level == TIO_LOG_DEBUG)
        l->debug++;
}

/* Issue 12, item 14, the other half: when no free extent is large enough at
 * run time (here: the free space fragmented by another user of the engine),
 * each refused offload is counted and logged, the first as a warning naming
 * the tensor. */
static void test_refused_offloads_are_logged(void **state)
{
    job j;
    job_init(&j);
    tio_engine *e = engine_of(&j, 2 * MIB);
    tio_runtime *rt;
    assert_int_equal(tio_runtime_create(&j.plan, j.trace, e, &j.cb, &rt), 0);
    /* enough free space in all (the first iteration_begin checks that), but
     * fragmented: no free extent holds tensor 0 */
    tio_extent low, mid, high;
    assert_int_equal(tio_engine_alloc(e, MIB, &low), 0);
    assert_int_equal(tio_engine_alloc(e, 4 * KIB, &mid), 0);
    tio_engine_space sp;
    tio_engine_space_stats(e, &sp);
    assert_int_equal(tio_engine_alloc(e, sp.free_bytes, &high), 0);
    assert_int_equal(tio_engine_free(e, &low), 0);
    assert_int_equal(tio_engine_free(e, &high), 0);
    log_lines l = {0};
    tio_set_log(collect_log, &l, TIO_LOG_DEBUG);
    run_iteration(&j, rt);
    run_iteration(&j, rt);
    tio_set_log(NULL, NULL, TIO_LOG_INFO);
    tio_runtime_stats s;
    tio_runtime_get_stats(rt, &s);
    assert_int_equal(s.offloads_refused, 2);                       /* tensor 0, twice */
    assert_int_equal(s.bytes_offloaded_ssd, 2 * tensor_bytes[1]); /* tensor 1 fits */
    assert_int_equal(l.warn, 1);
    assert_int_equal(l.debug, 1);
    char want[300];
    snprintf(want, sizeof want, "runtime: offload of tensor 0 (%u bytes) to SSD refused: engine: "
             "no free extent of %u bytes (space 2097152 bytes); it stays resident (1 refused "
             "so far, counted in offloads_refused)", MIB + 123, MIB + 4 * KIB);
    assert_string_equal(l.first, want);
    tio_runtime_destroy(rt);
    tio_engine_destroy(e);
    job_fini(&j);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_engine_destroyed_while_runtime_bound),
        cmocka_unit_test(test_runtime_refuses_plan_beyond_engine_space),
        cmocka_unit_test(test_refused_offloads_are_logged),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
