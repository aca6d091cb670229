/*
 * tests/c/test_lifetime.c — lifetime analysis on a trace small enough to
 * work out by hand.  Every expected number below is derived in the comments
 * from the trace alone, so a reader can check the arithmetic without
 * trusting the code.
 *
 * The trace (the example of docs/formats.md), 6 kernels, 4 tensors:
 *
 *   tensor 0  2 MiB = 2097152  parameter        global
 *   tensor 1  4 MiB = 4194304  optimizer_state  global
 *   tensor 2  1 MiB = 1048576  activation       intermediate
 *   tensor 3  4096             temporary        intermediate
 *
 *   kernel  duration  accesses       start_ns (prefix sums)
 *   0       100       r:0 w:2        0
 *   1       200       r:2 w:3        100
 *   2       300       rw:3           300
 *   3       400       r:3 r:0        600
 *   4       500       r:2            1000
 *   5       600       rw:0 rw:1      1500   (iteration: 2100)
 *
 * Uses: t0 {0,3,5}  t1 {5}  t2 {0,1,4}  t3 {1,2,3}.
 */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include <string.h>

#include "teraio/common.h"
#include "teraio/lifetime.h"
#include "teraio/plan.h"

static tio_trace *example_trace(void)
{
    tio_trace *t;
    assert_int_equal(tio_trace_create("toy-mlp batch 1", &t), 0);
    assert_int_equal(tio_trace_add_tensor(t, 2097152, TIO_KIND_PARAMETER, true, NULL, NULL), 0);
    assert_int_equal(
        tio_trace_add_tensor(t, 4194304, TIO_KIND_OPTIMIZER_STATE, true, NULL, NULL), 0);
    assert_int_equal(tio_trace_add_tensor(t, 1048576, TIO_KIND_ACTIVATION, false, NULL, NULL),
                     0);
    assert_int_equal(tio_trace_add_tensor(t, 4096, TIO_KIND_TEMPORARY, false, NULL, NULL), 0);
    static const struct {
        uint64_t ns;
        uint32_t tensor[2];
        uint8_t mode[2];
    } k[6] = {
        {100, {0, 2}, {TIO_ACCESS_READ, TIO_ACCESS_WRITE}},
        {200, {2, 3}, {TIO_ACCESS_READ, TIO_ACCESS_WRITE}},
        {300, {3}, {TIO_ACCESS_READ | TIO_ACCESS_WRITE}},
        {400, {3, 0}, {TIO_ACCESS_READ, TIO_ACCESS_READ}},
        {500, {2}, {TIO_ACCESS_READ}},
        {600, {0, 1}, {TIO_ACCESS_READ | TIO_ACCESS_WRITE, TIO_ACCESS_READ | TIO_ACCESS_WRITE}},
    };
    for (int i = 0; i < 6; i++) {
        assert_int_equal(tio_trace_add_kernel(t, "op", k[i].ns), 0);
        for (int j = 0; j < 2 && k[i].mode[j]; j++)
            assert_int_equal(tio_trace_add_access(t, k[i].tensor[j], k[i].mode[j]), 0);
    }
    return t;
}

static void test_memory_curve(void **state)
{
    (void)state;
    tio_trace *t = example_trace();
    tio_lifetime *lt;
    assert_int_equal(tio_lifetime_analyze(t, &lt), 0);
    assert_int_equal(lt->n_kernels, 6);
    assert_int_equal(lt->n_tensors, 4);

    /* Globals always resident: 2097152 + 4194304 = 6291456.
     * t2 live over kernels 0..4, t3 over 1..3:
     *   M0 = 6291456 + 1048576        = 7340032
     *   M1 = M2 = M3 = 7340032 + 4096 = 7344128
     *   M4 = 7340032,  M5 = 6291456 */
    static const uint64_t memory[6] = {7340032, 7344128, 7344128, 7344128, 7340032, 6291456};
    /* Active bytes: k0 t0+t2 = 3145728; k1 t2+t3 = 1052672; k2 t3 = 4096;
     * k3 t3+t0 = 2101248; k4 t2 = 1048576; k5 t0+t1 = 6291456. */
    static const uint64_t active[6] = {3145728, 1052672, 4096, 2101248, 1048576, 6291456};
    static const uint64_t start[7] = {0, 100, 300, 600, 1000, 1500, 2100};
    for (int k = 0; k < 6; k++) {
        assert_true(lt->memory_bytes[k] == memory[k]);
        assert_true(lt->active_bytes[k] == active[k]);
    }
    for (int k = 0; k < 7; k++)
        assert_true(lt->start_ns[k] == start[k]);
    assert_true(lt->peak_bytes == 7344128);
    assert_int_equal(lt->peak_kernel, 1); /* first of the three equal maxima */
    assert_true(lt->max_active_bytes == 6291456);
    assert_int_equal(lt->max_active_kernel, 5);

    static const uint32_t first[4] = {0, 5, 0, 1}, last[4] = {5, 5, 4, 3};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(lt->first_use[i], first[i]);
        assert_int_equal(lt->last_use[i], last[i]);
    }
    static const uint64_t sizes[4] = {2097152, 4194304, 1048576, 4096};
    for (int i = 0; i < 4; i++)
        assert_true(lt->tensor_bytes[i] == sizes[i]);
    tio_lifetime_destroy(lt);
    tio_trace_destroy(t);
}

/* A free kernel past the last access keeps the tensor's bytes in M[k]
 * until the kernel before it: t3 (4096, last access 3) freed before kernel
 * 5 adds 4096 to M4; t2 (last access 4) still held at the end (free kernel
 * 6) adds 1048576 to M5.  Active bytes do not change; each of them gets a
 * tail period, from its last access to its free, which a plan may move it
 * out in (no prefetch), so the floor stays what the kernels access. */
static void test_free_kernel_extends_memory(void **state)
{
    (void)state;
    tio_trace *t = example_trace();
    assert_int_equal(tio_trace_set_free_kernel(t, 3, 5), 0);
    assert_int_equal(tio_trace_set_free_kernel(t, 2, 6), 0);
    tio_lifetime *lt, *plain;
    assert_int_equal(tio_lifetime_analyze(t, &lt), 0);
    static const uint64_t memory[6] = {7340032, 7344128, 7344128, 7344128, 7344128, 7340032};
    for (int k = 0; k < 6; k++)
        assert_true(lt->memory_bytes[k] == memory[k]);
    assert_true(lt->peak_bytes == 7344128);
    t->tensors[2].free_kernel = t->tensors[3].free_kernel = 0;
    assert_int_equal(tio_lifetime_analyze(t, &plain), 0);
    for (int k = 0; k < 6; k++)
        assert_true(lt->active_bytes[k] == plain->active_bytes[k]);
    assert_int_equal(lt->last_use[3], 3);
    /* Periods without free kernels: t0 (0,3) (3,5), t1 wraps (5,11), t2
     * (1,4); t3 none.  With them, t2's tail (4,6) comes after its (1,4),
     * and t3 has a tail (3,5): sorted by (tensor, last_use). */
    assert_int_equal(lt->n_periods, plain->n_periods + 2);
    static const tio_inactive_period tails[2] = {
        {.tensor = 2, .last_use = 4, .next_use = 6, .bytes = 1048576, .tail = true},
        {.tensor = 3, .last_use = 3, .next_use = 5, .bytes = 4096, .tail = true}};
    for (int i = 0; i < 2; i++) {
        const tio_inactive_period *p = &lt->periods[lt->n_periods - 2 + i];
        assert_int_equal(p->tensor, tails[i].tensor);
        assert_int_equal(p->last_use, tails[i].last_use);
        assert_int_equal(p->next_use, tails[i].next_use);
        assert_true(p->bytes == tails[i].bytes);
        assert_true(p->tail && !p->wraps);
        assert_true(p->idle_ns == lt->start_ns[p->next_use] - lt->start_ns[p->last_use + 1]);
    }
    for (uint32_t i = 0; i < lt->n_periods - 2; i++)
        assert_false(lt->periods[i].tail);
    assert_int_equal(lt->periods[lt->n_periods - 3].tensor, 2); /* t2's (1,4) before its tail */
    /* The working-set floor, M[k] less the periods that cover k: the tails
     * cover what is held, so every kernel's rest is its active bytes, the
     * largest at k5 (6291456), with or without free kernels. */
    assert_true(plain->floor_bytes == 6291456);
    assert_int_equal(plain->floor_kernel, 5);
    assert_true(lt->floor_bytes == 6291456);
    assert_int_equal(lt->floor_kernel, 5);
    assert_true(lt->floor_bytes - lt->active_bytes[lt->floor_kernel] == 0);
    assert_true(lt->max_active_bytes == 6291456);
    /* The tensors that make it, the largest first: t1 and t0 accessed by
     * k5; t2, held there, is covered by its tail.  (The trace lt analysed
     * had those free kernels.) */
    t->tensors[3].free_kernel = 5;
    t->tensors[2].free_kernel = 6;
    tio_floor_tensor ft[4];
    uint32_t nf = 0;
    assert_int_equal(tio_lifetime_floor_tensors(t, lt, ft, 4, &nf), 0);
    assert_int_equal(nf, 2);
    static const struct { uint32_t tensor; uint64_t bytes; } want[2] = {{1, 4194304}, {0, 2097152}};
    uint64_t sum = 0;
    for (int i = 0; i < 2; i++) {
        assert_int_equal(ft[i].tensor, want[i].tensor);
        assert_true(ft[i].bytes == want[i].bytes);
        assert_int_equal(ft[i].reason, TIO_FLOOR_ACCESSED);
        sum += ft[i].bytes;
    }
    assert_true(sum == lt->floor_bytes);
    assert_string_equal(tio_floor_reason_name(TIO_FLOOR_HELD_AFTER_LAST_USE), "held after its last use");
    /* fewer slots than tensors: the largest, and the count of all */
    assert_int_equal(tio_lifetime_floor_tensors(t, lt, ft, 1, &nf), 0);
    assert_int_equal(nf, 2);
    assert_int_equal(ft[0].tensor, 1);
    assert_int_equal(tio_lifetime_floor_tensors(t, lt, NULL, 0, &nf), 0);
    assert_int_equal(nf, 2);
    assert_int_equal(tio_lifetime_floor_tensors(t, lt, NULL, 2, &nf), -EINVAL);
    assert_int_equal(tio_lifetime_floor_tensors(t, NULL, ft, 4, &nf), -EINVAL);
    /* No plan goes below it: a capacity under the floor is refused, one at
     * it fits (both planners, synchronous moves). */
    for (int planner = 0; planner < 2; planner++) {
        tio_plan_options o;
        tio_plan_options_default(&o);
        o.planner = planner ? TIO_PLANNER_ALG1 : TIO_PLANNER_TERAIO;
        o.ssd_read_gbps = o.ssd_write_gbps = 1.0;
        o.capacity_bytes = lt->floor_bytes - 1;
        tio_plan *plan;
        assert_int_equal(tio_plan_build(t, lt, &o, &plan), TIO_EINFEASIBLE);
        assert_null(strstr(tio_last_error(), "held"));
        assert_non_null(strstr(tio_last_error(), "no plan fits below it; accessed: tensor 1 "
                                                 "(optimizer_state, 4.00 MiB, first used by kernel 5 (op)), "
                                                 "tensor 0 (parameter"));
        o.capacity_bytes = lt->floor_bytes;
        assert_int_equal(tio_plan_build(t, lt, &o, &plan), 0);
        assert_true(plan->fits);
        /* k5 fits only with t2 out in its tail: an offload and no prefetch,
         * due by k5, which the check accepts and gives the same M' */
        uint32_t n2 = 0;
        const tio_migration *m2 = NULL;
        for (uint32_t i = 0; i < plan->n_migrations; i++)
            if (plan->migrations[i].tensor == 2) {
                n2++;
                m2 = &plan->migrations[i];
            }
        assert_non_null(m2);
        assert_int_equal(m2->kind, TIO_MIGRATION_OFFLOAD);
        assert_int_equal(m2->trigger_kernel, 5);
        assert_int_equal(m2->deadline_kernel, 5);
        assert_true(n2 % 2 == 1);
        uint64_t planned[6];
        memcpy(planned, plan->planned_memory_bytes, sizeof planned);
        free(plan->planned_memory_bytes);
        plan->planned_memory_bytes = NULL;
        assert_int_equal(tio_plan_check(plan, t, lt), 0);
        assert_memory_equal(planned, plan->planned_memory_bytes, sizeof planned);
        /* a lone offload anywhere else is refused */
        tio_migration keep = *m2;
        ((tio_migration *)m2)->trigger_kernel = ((tio_migration *)m2)->deadline_kernel = 4;
        assert_int_equal(tio_plan_check(plan, t, lt), TIO_EPARSE);
        *(tio_migration *)m2 = keep;
        tio_plan_destroy(plan);
    }
    tio_lifetime_destroy(plain);
    tio_lifetime_destroy(lt);
    tio_trace_destroy(t);
}

static void test_inactive_periods(void **state)
{
    (void)state;
    tio_trace *t = example_trace();
    tio_lifetime *lt;
    assert_int_equal(tio_lifetime_analyze(t, &lt), 0);
    /* t0 {0,3,5}: (0,3) idle over kernels 1,2 = 200+300 = 500;
     *             (3,5) idle over kernel 4 = 500;
     *             wrap (5, 0+6): 6-5 = 1 < 2, no kernel in between: none.
     * t1 {5}:     used once, wrap (5, 5+6=11): kernels 6..10 = next
     *             iteration's 0..4 = 100+200+300+400+500 = 1500.
     * t2 {0,1,4}: (0,1) adjacent: none; (1,4) kernels 2,3 = 300+400 = 700.
     *             Intermediate: no wrap.
     * t3 {1,2,3}: all adjacent: none. */
    static const tio_inactive_period expected[4] = {
        {.tensor = 0, .last_use = 0, .next_use = 3, .wraps = false, .bytes = 2097152, .idle_ns = 500},
        {.tensor = 0, .last_use = 3, .next_use = 5, .wraps = false, .bytes = 2097152, .idle_ns = 500},
        {.tensor = 1, .last_use = 5, .next_use = 11, .wraps = true, .bytes = 4194304, .idle_ns = 1500},
        {.tensor = 2, .last_use = 1, .next_use = 4, .wraps = false, .bytes = 1048576, .idle_ns = 700},
    };
    assert_int_equal(lt->n_periods, 4);
    for (int i = 0; i < 4; i++) {
        const tio_inactive_period *p = &lt->periods[i];
        assert_int_equal(p->tensor, expected[i].tensor);
        assert_int_equal(p->last_use, expected[i].last_use);
        assert_int_equal(p->next_use, expected[i].next_use);
        assert_int_equal(p->wraps, expected[i].wraps);
        assert_true(p->bytes == expected[i].bytes);
        assert_true(p->idle_ns == expected[i].idle_ns);
    }

    /* span: [0,6) one iteration 2100; [5,7) kernel 5 + next kernel 0 = 700;
     * [0,12) two iterations 4200; [2,14) = 2100 - 300 + 2100 + 300 = 4200. */
    assert_true(tio_lifetime_span_ns(lt, 0, 6) == 2100);
    assert_true(tio_lifetime_span_ns(lt, 5, 7) == 700);
    assert_true(tio_lifetime_span_ns(lt, 0, 12) == 4200);
    assert_true(tio_lifetime_span_ns(lt, 2, 14) == 4200);
    assert_true(tio_lifetime_span_ns(lt, 3, 3) == 0);
    assert_true(tio_lifetime_span_ns(lt, 4, 2) == 0);
    tio_lifetime_destroy(lt);
    tio_trace_destroy(t);
}

static void assert_close(double got, double want)
{
    if (fabs(got - want) > 1e-12)
        print_error("got %.17g, want %.17g\n", got, want);
    assert_true(fabs(got - want) <= 1e-12);
}

static void test_stats(void **state)
{
    (void)state;
    tio_trace *t = example_trace();
    tio_lifetime *lt;
    tio_lifetime_stats st;
    assert_int_equal(tio_lifetime_analyze(t, &lt), 0);

    /* Round trip = bytes/write + bytes/read ns (GB/s = bytes/ns).  At 8000
     * read, 2000 write that is bytes * (1/2000 + 1/8000) = bytes / 1600:
     *   t0 2097152/1600 = 1310.72 > 500   (both t0 periods short)
     *   t1 4194304/1600 = 2621.44 > 1500  (short)
     *   t2 1048576/1600 =  655.36 <= 700  (long)
     * 1 long period of 4; bytes share 1048576 / (2*2097152 + 4194304 +
     * 1048576) = 1048576 / 9437184 = 1/9. */
    assert_int_equal(tio_lifetime_stats_compute(lt, 8000, 2000, &st), 0);
    assert_int_equal(st.n_periods, 4);
    assert_int_equal(st.n_periods_long, 1);
    assert_close(st.long_period_share, 0.25);
    assert_close(st.long_period_bytes_share, 1.0 / 9.0);
    /* Sum of active bytes 3145728+1052672+4096+2101248+1048576+6291456 =
     * 13643776; mean share = 13643776 / 6 / 7344128; max = 6291456 / 7344128. */
    assert_close(st.mean_active_share, 13643776.0 / 6.0 / 7344128.0);
    assert_close(st.max_active_share, 6291456.0 / 7344128.0);
    /* Sizes: 4096 < 1 MiB; 1 MiB and 2 MiB in [1, 4) MiB; 4 MiB in [4, 16). */
    static const uint32_t counts[TIO_SIZE_BUCKETS] = {1, 2, 1, 0, 0, 0, 0, 0};
    static const uint64_t limits[TIO_SIZE_BUCKETS] = {
        1ull << 20, 4ull << 20, 16ull << 20, 64ull << 20, 256ull << 20, 1ull << 30, 4ull << 30,
        UINT64_MAX};
    for (int b = 0; b < TIO_SIZE_BUCKETS; b++) {
        assert_int_equal(st.size_bucket_count[b], counts[b]);
        assert_true(st.size_bucket_limit[b] == limits[b]);
    }

    /* At the CLI defaults (2.0 read, 1.5 write) nothing here is long enough. */
    assert_int_equal(tio_lifetime_stats_compute(lt, 2.0, 1.5, &st), 0);
    assert_int_equal(st.n_periods_long, 0);
    assert_close(st.long_period_share, 0);
    /* At 1e6 GB/s every period is long. */
    assert_int_equal(tio_lifetime_stats_compute(lt, 1e6, 1e6, &st), 0);
    assert_int_equal(st.n_periods_long, 4);
    assert_close(st.long_period_bytes_share, 1);

    assert_int_equal(tio_lifetime_stats_compute(lt, 0, 1, &st), -EINVAL);
    assert_int_equal(tio_lifetime_stats_compute(lt, 1, -1, &st), -EINVAL);
    assert_int_equal(tio_lifetime_stats_compute(lt, NAN, 1, &st), -EINVAL);
    tio_lifetime_destroy(lt);
    tio_trace_destroy(t);
}

/* Edge cases: a global tensor used once in a one-kernel trace has no
 * kernel to be idle over, so no period; in a three-kernel trace it gets the
 * wrap period (k, k+3) over the other two kernels. */
static void test_single_use_global(void **state)
{
    (void)state;
    tio_trace *t;
    tio_lifetime *lt;
    assert_int_equal(tio_trace_create(NULL, &t), 0);
    assert_int_equal(tio_trace_add_tensor(t, 64, TIO_KIND_PARAMETER, true, NULL, NULL), 0);
    assert_int_equal(tio_trace_add_kernel(t, "only", 9), 0);
    assert_int_equal(tio_trace_add_access(t, 0, TIO_ACCESS_READ), 0);
    assert_int_equal(tio_lifetime_analyze(t, &lt), 0);
    assert_int_equal(lt->n_periods, 0);
    assert_true(lt->peak_bytes == 64);
    tio_lifetime_destroy(lt);

    assert_int_equal(tio_trace_add_kernel(t, "a", 10), 0);
    assert_int_equal(tio_trace_add_kernel(t, "b", 20), 0);
    assert_int_equal(tio_lifetime_analyze(t, &lt), 0);
    assert_int_equal(lt->n_periods, 1);
    assert_int_equal(lt->periods[0].last_use, 0);
    assert_int_equal(lt->periods[0].next_use, 3);
    assert_true(lt->periods[0].wraps);
    assert_true(lt->periods[0].idle_ns == 30);
    tio_lifetime_destroy(lt);

    /* An invalid trace (tensor 1 never used) is refused. */
    assert_int_equal(tio_trace_add_tensor(t, 8, TIO_KIND_TEMPORARY, false, NULL, NULL), 0);
    lt = (tio_lifetime *)0x1;
    assert_int_equal(tio_lifetime_analyze(t, &lt), TIO_EPARSE);
    assert_null(lt);
    tio_trace_destroy(t);

    /* The empty trace. */
    tio_lifetime_stats st;
    assert_int_equal(tio_trace_create(NULL, &t), 0);
    assert_int_equal(tio_lifetime_analyze(t, &lt), 0);
    assert_int_equal(lt->n_periods, 0);
    assert_true(lt->peak_bytes == 0);
    assert_true(tio_lifetime_span_ns(lt, 0, 5) == 0);
    assert_int_equal(tio_lifetime_stats_compute(lt, 1, 1, &st), 0);
    assert_close(st.mean_active_share, 0);
    tio_lifetime_destroy(lt);
    tio_trace_destroy(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_memory_curve),
        cmocka_unit_test(test_free_kernel_extends_memory),
        cmocka_unit_test(test_inactive_periods),
        cmocka_unit_test(test_stats),
        cmocka_unit_test(test_single_use_global),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
