/*
 * tests/c/test_pager.c — the pager keeps its capacity by evicting the least
 * recently used tensors the current kernel does not use, brings them back
 * byte for byte, and hands evicted tensors over to a runtime.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "common/util.h"
#include "teraio/pager.h"
#include "teraio/runtime.h"

#define N 6
#define KB 4096u

typedef struct {
    void *mem[N];
    uint64_t bytes[N];
    int n_allocate[N], n_release[N];
    bool pinned[N]; /* the framework cannot release it */
} memory;

typedef struct {
    char dir[4096];
    tio_engine *engine;
    memory m;
    tio_pager *p;
    uint32_t slot[N]; /* slot of tensor i */
    int tensor_of[64]; /* tensor of a slot */
} fixture;

static int pg_allocate(void *ctx, uint32_t slot, uint64_t bytes, void **addr)
{
    fixture *f = ctx;
    int i = f->tensor_of[slot];
    assert_null(f->m.mem[i]);
    assert_int_equal(bytes, f->m.bytes[i]);
    f->m.mem[i] = malloc(bytes);
    memset(f->m.mem[i], 0xEE, bytes);
    f->m.n_allocate[i]++;
    *addr = f->m.mem[i];
    return 0;
}

static int pg_release(void *ctx, uint32_t slot)
{
    fixture *f = ctx;
    int i = f->tensor_of[slot];
    assert_non_null(f->m.mem[i]);
    if (f->m.pinned[i])
        return -EPERM;
    free(f->m.mem[i]);
    f->m.mem[i] = NULL;
    f->m.n_release[i]++;
    return 0;
}

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    const char *base = tio_env("TEST_TMPDIR");
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", base && base[0] ? base : "/tmp");
    assert_int_equal(system(cmd), 0);
    snprintf(f->dir, sizeof f->dir, "%s/pager.XXXXXX", base && base[0] ? base : "/tmp");
    assert_non_null(mkdtemp(f->dir));
    tio_engine_options eo;
    tio_engine_options_default(&eo);
    const char *dirs[1] = {f->dir};
    eo.dirs = dirs;
    eo.n_dirs = 1;
    eo.space_bytes = 1u << 20;
    eo.backend = TIO_BACKEND_PSYNC;
    assert_int_equal(tio_engine_create(&eo, &f->engine), 0);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    tio_pager_destroy(f->p);
    for (int i = 0; i < N; i++)
        free(f->m.mem[i]);
    tio_engine_destroy(f->engine);
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->dir);
    assert_int_equal(system(cmd), 0);
    free(f);
    return 0;
}

static void make_pager(fixture *f, uint64_t capacity, double share)
{
    tio_pager_callbacks cb = {.ctx = f, .allocate = pg_allocate, .release = pg_release};
    assert_int_equal(tio_pager_create(f->engine, capacity, share, &cb, &f->p), 0);
}

/* Tensor i: `kb` KiB filled with pattern i, tracked in the current kernel. */
static void track(fixture *f, int i, uint32_t kb)
{
    f->m.bytes[i] = (uint64_t)kb * KB;
    f->m.mem[i] = malloc(f->m.bytes[i]);
    for (uint64_t b = 0; b < f->m.bytes[i]; b++)
        ((unsigned char *)f->m.mem[i])[b] = (unsigned char)(b * 7 + i);
    uint32_t s;
    assert_int_equal(tio_pager_track(f->p, f->m.mem[i], f->m.bytes[i], true, &s), 0);
    f->slot[i] = s;
    f->tensor_of[s] = i;
}

static bool intact(const fixture *f, int i)
{
    const unsigned char *m = f->m.mem[i];
    for (uint64_t b = 0; b < f->m.bytes[i]; b++)
        if (m[b] != (unsigned char)(b * 7 + i))
            return false;
    return true;
}

static tio_pager_stats stats_of(const fixture *f)
{
    tio_pager_stats s;
    tio_pager_get_stats(f->p, &s);
    return s;
}

/* Capacity 3 tensors of 1 page: a fourth evicts the least recently used
 * one the kernel does not use; using it again evicts the next. */
static void test_lru_eviction_keeps_the_capacity(void **state)
{
    fixture *f = *state;
    make_pager(f, 3 * KB, 0);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(tio_pager_kernel_begin(f->p), 0);
        track(f, i, 1);
    }
    assert_int_equal(tio_pager_kernel_begin(f->p), 0);
    assert_int_equal(tio_pager_use(f->p, f->slot[0], NULL), 0); /* 0 most recent: 1 is least */
    track(f, 3, 1);
    assert_false(tio_pager_is_resident(f->p, f->slot[1]));
    assert_true(tio_pager_is_resident(f->p, f->slot[0]) && tio_pager_is_resident(f->p, f->slot[2]));
    assert_int_equal(f->m.n_release[1], 1);
    tio_pager_stats s = stats_of(f);
    assert_int_equal(s.resident_bytes, 3 * KB);
    assert_int_equal(s.tracked_bytes, 4 * KB);
    assert_int_equal(s.peak_resident_bytes, 4 * KB); /* tensor 3 before room was made */
    assert_int_equal(s.evictions, 1);
    assert_int_equal(s.over_capacity_kernels, 0);
    /* the next kernel uses 1: it comes back byte for byte, 2 (least recent) goes */
    assert_int_equal(tio_pager_kernel_begin(f->p), 0);
    void *addr = NULL;
    assert_int_equal(tio_pager_use(f->p, f->slot[1], &addr), 1);
    assert_ptr_equal(addr, f->m.mem[1]);
    assert_true(intact(f, 1));
    assert_false(tio_pager_is_resident(f->p, f->slot[2]));
    s = stats_of(f);
    assert_int_equal(s.resident_bytes, 3 * KB);
    assert_int_equal(s.fetches, 1);
    assert_int_equal(s.bytes_fetched, KB);
    assert_int_equal(s.bytes_evicted, 2 * KB);
}

/* What one kernel uses is never evicted for it: a kernel whose own tensors
 * exceed the capacity is counted, once, with its excess. */
static void test_a_kernel_over_the_capacity_is_counted(void **state)
{
    fixture *f = *state;
    make_pager(f, 2 * KB, 0);
    assert_int_equal(tio_pager_kernel_begin(f->p), 0);
    track(f, 0, 1);
    track(f, 1, 1);
    track(f, 2, 1);
    tio_pager_stats s = stats_of(f);
    assert_int_equal(s.evictions, 0);
    assert_int_equal(s.over_capacity_kernels, 1);
    assert_int_equal(s.over_capacity_bytes_max, KB);
    assert_int_equal(tio_pager_kernel_begin(f->p), 0);
    assert_int_equal(tio_pager_use(f->p, f->slot[2], NULL), 0);
    assert_int_equal(tio_pager_reserve(f->p, KB), 0); /* room for what the kernel makes */
    s = stats_of(f);
    assert_int_equal(s.resident_bytes, KB);
    assert_int_equal(s.evictions, 2);
    assert_int_equal(s.over_capacity_kernels, 1);
    /* forgetting frees the stored copy; fetch_all brings the rest back */
    assert_int_equal(tio_pager_forget(f->p, f->slot[0]), 0);
    assert_int_equal(tio_pager_forget(f->p, f->slot[0]), -EINVAL);
    free(f->m.mem[0]);
    f->m.mem[0] = NULL;
    assert_int_equal(tio_pager_fetch_all(f->p), 0);
    assert_true(intact(f, 1) && intact(f, 2));
    s = stats_of(f);
    assert_int_equal(s.tracked_bytes, 2 * KB);
    assert_int_equal(s.resident_bytes, 2 * KB);
}

/* A share of the peak nobody measured yet: the capacity follows the largest
 * tracked bytes seen, so it never exceeds the share of the final peak. */
static void test_capacity_as_a_share_of_the_peak_seen(void **state)
{
    fixture *f = *state;
    make_pager(f, 0, 0.5);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(tio_pager_kernel_begin(f->p), 0);
        track(f, i, 2);
    }
    tio_pager_stats s = stats_of(f);
    assert_int_equal(s.peak_tracked_bytes, 8 * KB);
    assert_int_equal(s.capacity_bytes, 4 * KB);
    assert_int_equal(s.resident_bytes, 4 * KB);
    assert_int_equal(tio_pager_set_capacity(f->p, 0, 0), -EINVAL);
    assert_int_equal(tio_pager_set_capacity(f->p, 0, 1.5), -EINVAL);
    assert_int_equal(tio_pager_set_capacity(f->p, 2 * KB, 0), 0);
    assert_int_equal(tio_pager_kernel_begin(f->p), 0);
    assert_int_equal(tio_pager_reserve(f->p, 0), 0);
    assert_int_equal(stats_of(f).resident_bytes, 2 * KB);
}

/* An evicted tensor handed over to a runtime keeps its bytes: the runtime
 * owns the stored copy and fetches it where its plan has it resident. */
static int rt_allocate(void *ctx, uint32_t tensor, uint64_t bytes, void **addr)
{
    fixture *f = ctx;
    assert_null(f->m.mem[tensor]);
    f->m.mem[tensor] = malloc(bytes);
    *addr = f->m.mem[tensor];
    return 0;
}

static int rt_release(void *ctx, uint32_t tensor)
{
    fixture *f = ctx;
    free(f->m.mem[tensor]);
    f->m.mem[tensor] = NULL;
    return 0;
}

static void test_evicted_tensor_is_handed_over_to_a_runtime(void **state)
{
    fixture *f = *state;
    make_pager(f, 2 * KB, 0);
    assert_int_equal(tio_pager_kernel_begin(f->p), 0);
    track(f, 0, 2);
    assert_int_equal(tio_pager_kernel_begin(f->p), 0);
    track(f, 1, 2);
    assert_false(tio_pager_is_resident(f->p, f->slot[0]));
    bool resident = true;
    tio_extent ext;
    assert_int_equal(tio_pager_detach(f->p, f->slot[0], &resident, &ext), 0);
    assert_false(resident);
    assert_true(ext.bytes >= 2 * KB);
    assert_int_equal(stats_of(f).tracked_bytes, 2 * KB);

    tio_trace *tr;
    uint32_t id;
    assert_int_equal(tio_trace_create("handover", &tr), 0);
    assert_int_equal(tio_trace_add_tensor(tr, 2 * KB, TIO_KIND_PARAMETER, true, "w", &id), 0);
    assert_int_equal(tio_trace_add_kernel(tr, "k", 1000), 0);
    assert_int_equal(tio_trace_add_access(tr, 0, TIO_ACCESS_READ), 0);
    tio_plan plan = {.n_kernels = 1, .n_tensors = 1, .capacity_bytes = 4 * KB};
    tio_runtime_callbacks cb = {.ctx = f, .allocate = rt_allocate, .release = rt_release};
    tio_runtime *rt;
    assert_int_equal(tio_runtime_create(&plan, tr, f->engine, &cb, &rt), 0);
    assert_int_equal(tio_runtime_tensor_bind_stored(rt, 0, KB, &ext), -EINVAL); /* another size */
    assert_int_equal(tio_runtime_tensor_bind_stored(rt, 0, 2 * KB, &ext), 0);
    assert_false(tio_runtime_is_resident(rt, 0));
    /* the plan has it resident at kernel 0: iteration_begin starts its read */
    assert_int_equal(tio_runtime_iteration_begin(rt), 0);
    assert_int_equal(tio_runtime_kernel_begin(rt, 0, "k"), 0);
    assert_true(tio_runtime_ensure_resident(rt, 0, NULL) >= 0);
    assert_true(tio_runtime_is_resident(rt, 0));
    assert_true(intact(f, 0));
    assert_int_equal(tio_runtime_iteration_end(rt), 0);
    tio_runtime_destroy(rt);
    tio_trace_destroy(tr);
}

/* An iteration that leaves its plan hands the runtime's tensors to a pager
 * (tio_runtime_tensor_detach, tio_pager_track_stored): an offloaded one
 * with its stored copy, nothing read; a resident one as it is.  The pager
 * brings the stored one back byte for byte on its next use. */
static void test_a_runtime_hands_its_tensors_to_a_pager(void **state)
{
    fixture *f = *state;
    make_pager(f, 2 * KB, 0);
    assert_int_equal(tio_pager_kernel_begin(f->p), 0);
    track(f, 0, 2);
    assert_int_equal(tio_pager_kernel_begin(f->p), 0);
    track(f, 1, 2); /* evicts tensor 0 */
    bool resident = true;
    tio_extent ext;
    assert_int_equal(tio_pager_detach(f->p, f->slot[0], &resident, &ext), 0);
    assert_false(resident);

    tio_trace *tr;
    uint32_t id;
    assert_int_equal(tio_trace_create("handback", &tr), 0);
    assert_int_equal(tio_trace_add_tensor(tr, 2 * KB, TIO_KIND_PARAMETER, true, "w", &id), 0);
    assert_int_equal(tio_trace_add_tensor(tr, 2 * KB, TIO_KIND_PARAMETER, true, "v", &id), 0);
    assert_int_equal(tio_trace_add_kernel(tr, "k", 1000), 0);
    assert_int_equal(tio_trace_add_access(tr, 0, TIO_ACCESS_READ), 0);
    assert_int_equal(tio_trace_add_access(tr, 1, TIO_ACCESS_READ), 0);
    tio_plan plan = {.n_kernels = 1, .n_tensors = 2, .capacity_bytes = 8 * KB};
    tio_runtime_callbacks cb = {.ctx = f, .allocate = rt_allocate, .release = rt_release};
    tio_runtime *rt;
    assert_int_equal(tio_runtime_create(&plan, tr, f->engine, &cb, &rt), 0);
    assert_int_equal(tio_runtime_tensor_bind_stored(rt, 0, 2 * KB, &ext), 0);
    uint32_t s1 = f->slot[1];
    assert_int_equal(tio_pager_detach(f->p, s1, &resident, &ext), 0);
    assert_true(resident);
    assert_int_equal(tio_runtime_tensor_bind(rt, 1, f->m.mem[1], 2 * KB), 0);

    /* bad calls: not bound, NULL out pointers */
    assert_int_equal(tio_runtime_tensor_detach(rt, 0, NULL, &ext), -EINVAL);
    assert_int_equal(tio_runtime_tensor_detach(rt, 7, &resident, &ext), TIO_EUNKNOWN);

    tio_extent got;
    assert_int_equal(tio_runtime_tensor_detach(rt, 0, &resident, &got), 0);
    assert_false(resident);
    assert_true(got.bytes >= 2 * KB);
    assert_int_equal(tio_runtime_tensor_detach(rt, 0, &resident, &got), TIO_EUNKNOWN); /* unbound now */
    uint32_t s;
    assert_int_equal(tio_pager_track_stored(f->p, 2 * KB, NULL, &s), -EINVAL);
    assert_int_equal(tio_pager_track_stored(f->p, 4 * KB, &got, &s), -EINVAL); /* extent too small */
    assert_int_equal(tio_pager_track_stored(f->p, 2 * KB, &got, &s), 0);
    f->slot[0] = s;
    f->tensor_of[s] = 0;
    assert_false(tio_pager_is_resident(f->p, s));
    assert_int_equal(tio_runtime_tensor_detach(rt, 1, &resident, &got), 0);
    assert_true(resident);
    assert_int_equal(got.bytes, 0);
    assert_int_equal(tio_pager_track(f->p, f->m.mem[1], 2 * KB, true, &s), 0);
    f->slot[1] = s;
    f->tensor_of[s] = 1;
    tio_runtime_destroy(rt);
    tio_trace_destroy(tr);

    assert_int_equal(tio_pager_kernel_begin(f->p), 0);
    assert_int_equal(tio_pager_use(f->p, f->slot[0], NULL), 1); /* fetched: tensor 1 goes */
    assert_true(intact(f, 0));
    assert_false(tio_pager_is_resident(f->p, f->slot[1]));
    assert_int_equal(tio_pager_kernel_begin(f->p), 0);
    assert_int_equal(tio_pager_use(f->p, f->slot[1], NULL), 1);
    assert_true(intact(f, 1));
    tio_pager_stats st = stats_of(f);
    assert_int_equal(st.tracked_bytes, 4 * KB);
    assert_int_equal(st.resident_bytes, 2 * KB);
}

/* A tensor the framework cannot release (a PyTorch storage shared with
 * numpy) stays resident and is never a candidate again; the next least
 * recently used one goes instead. */
static void test_a_tensor_that_cannot_be_released_stays(void **state)
{
    fixture *f = *state;
    make_pager(f, 2 * KB, 0);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(tio_pager_kernel_begin(f->p), 0);
        track(f, i, 1);
    }
    f->m.pinned[0] = true;
    assert_int_equal(tio_pager_kernel_begin(f->p), 0);
    track(f, 2, 1); /* 0 is least recently used, but cannot go: 1 goes */
    assert_true(tio_pager_is_resident(f->p, f->slot[0]));
    assert_false(tio_pager_is_resident(f->p, f->slot[1]));
    assert_true(intact(f, 0));
    assert_int_equal(tio_pager_kernel_begin(f->p), 0);
    track(f, 3, 1); /* 2 goes; 0 is not tried again */
    assert_false(tio_pager_is_resident(f->p, f->slot[2]));
    tio_pager_stats s = stats_of(f);
    assert_int_equal(s.evictions, 2);
    assert_int_equal(s.resident_bytes, 2 * KB);
    f->m.pinned[0] = false;
}

typedef struct {
    tio_pager *p;
    int rc[4];
} other_thread;

/* Between steps the program's reads bring tensors back without a capacity:
 * neither tio_pager_fetch nor tio_pager_fetch_all counts toward the peak or
 * the kernels over the capacity, which describe kernels. */
static void test_fetches_between_steps_are_not_counted_as_kernels(void **state)
{
    fixture *f = *state;
    make_pager(f, 2 * KB, 0);
    assert_int_equal(tio_pager_kernel_begin(f->p), 0);
    track(f, 0, 1);
    track(f, 1, 1);
    assert_int_equal(tio_pager_kernel_begin(f->p), 0);
    track(f, 2, 1);
    assert_int_equal(tio_pager_kernel_begin(f->p), 0);
    track(f, 3, 1);
    tio_pager_stats s = stats_of(f);
    assert_int_equal(s.resident_bytes, 2 * KB);
    uint64_t peak = s.peak_resident_bytes;
    assert_false(tio_pager_is_resident(f->p, f->slot[0]));
    assert_int_equal(tio_pager_fetch(f->p, f->slot[0]), 1);
    assert_int_equal(tio_pager_fetch(f->p, f->slot[0]), 0);     /* resident: nothing to do */
    assert_true(intact(f, 0));
    assert_int_equal(tio_pager_fetch(f->p, 99), -EINVAL);
    s = stats_of(f);
    assert_int_equal(s.resident_bytes, 3 * KB);                 /* nothing evicted for it */
    assert_int_equal(tio_pager_fetch_all(f->p), 0);
    assert_true(intact(f, 1));
    s = stats_of(f);
    assert_int_equal(s.resident_bytes, 4 * KB);
    assert_int_equal(s.peak_resident_bytes, peak);
    assert_int_equal(s.over_capacity_kernels, 0);
    /* the next kernel makes room again, and counts */
    assert_int_equal(tio_pager_kernel_begin(f->p), 0);
    assert_int_equal(tio_pager_reserve(f->p, 0), 0);
    assert_int_equal(stats_of(f).resident_bytes, 2 * KB);
}

static void *from_other_thread(void *arg)
{
    other_thread *o = arg;
    uint32_t s;
    int x = 0;
    o->rc[0] = tio_pager_kernel_begin(o->p);
    o->rc[1] = tio_pager_track(o->p, &x, sizeof x, true, &s);
    o->rc[2] = tio_pager_use(o->p, 0, NULL);
    o->rc[3] = tio_pager_fetch_all(o->p);
    return NULL;
}

static void test_bad_calls_are_refused(void **state)
{
    fixture *f = *state;
    tio_pager_callbacks cb = {.ctx = f, .allocate = pg_allocate, .release = pg_release};
    tio_pager *p = NULL;
    assert_int_equal(tio_pager_create(NULL, KB, 0, &cb, &p), -EINVAL);
    assert_int_equal(tio_pager_create(f->engine, 0, 0, &cb, &p), -EINVAL);
    assert_int_equal(tio_pager_create(f->engine, KB, -0.5, &cb, &p), -EINVAL);
    make_pager(f, 4 * KB, 0);
    uint32_t s;
    int x = 0;
    assert_int_equal(tio_pager_track(f->p, NULL, 4, true, &s), -EINVAL);
    assert_int_equal(tio_pager_track(f->p, &x, 0, true, &s), -EINVAL);
    assert_int_equal(tio_pager_use(f->p, 7, NULL), -EINVAL);
    assert_int_equal(tio_pager_kernel_begin(NULL), -EINVAL);
    track(f, 0, 1);
    other_thread o = {.p = f->p};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, from_other_thread, &o), 0);
    assert_int_equal(pthread_join(th, NULL), 0);
    for (int i = 0; i < 4; i++)
        assert_int_equal(o.rc[i], -EPERM);
    assert_int_equal(stats_of(f).tracked_bytes, KB);
    /* a tensor that cannot move is counted and never evicted */
    assert_int_equal(tio_pager_kernel_begin(f->p), 0);
    static char fixed[5 * KB];
    assert_int_equal(tio_pager_track(f->p, fixed, sizeof fixed, false, &s), 0);
    tio_pager_stats st = stats_of(f);
    assert_int_equal(st.evictions, 1);             /* tensor 0 went */
    assert_int_equal(st.resident_bytes, 5 * KB);   /* the fixed one stays, over */
    assert_int_equal(st.over_capacity_kernels, 1);
    assert_int_equal(tio_pager_forget(f->p, s), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_lru_eviction_keeps_the_capacity, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_kernel_over_the_capacity_is_counted, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fetches_between_steps_are_not_counted_as_kernels, setup, teardown),
        cmocka_unit_test_setup_teardown(test_capacity_as_a_share_of_the_peak_seen, setup, teardown),
        cmocka_unit_test_setup_teardown(test_evicted_tensor_is_handed_over_to_a_runtime, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_runtime_hands_its_tensors_to_a_pager, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_calls_are_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_tensor_that_cannot_be_released_stays, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
