/*
 * tests/c/test_advise.c — tio_trace_shard and tio_advise_* on a hand-worked
 * trace.
 *
 *   tensors: P parameter (global, 1000 B), G gradient (400 B, born in the
 *            backward pass), S optimizer state (global, 2000 B), A activation
 *            (300 B)
 *   kernel  ns     accesses
 *     0     100    P(r) A(w)            forward
 *     1     200    A(r) P(r) G(w)       backward
 *     2     1000   P(rw) G(r) S(rw)     optimizer step (first touch of S)
 *     3     500    S(r)
 *
 * M[k] = P + S (3000) + A over kernels 0-1 + G over kernels 1-2: 3300,
 * 3700, 3400, 3000; peak 3700.  Sharded over 2 GPUs: P 500, G 200, S 1000,
 * A 300; kernels 2 and 3 take 500 and 250 ns; peak 2000 (kernel 1).
 */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "teraio/teraio.h"

static const char HW[] =
    "name = test\n"
    "capacity_bytes = 100000\n"
    "pcie_h2d_gbps = 100\n"
    "pcie_d2h_gbps = 100\n"
    "ssd_count = 1\n"
    "ssd_read_gbps = 1\n"
    "ssd_write_gbps = 1\n"
    "ssd_latency_us = 0\n"
    "host_latency_us = 0\n"
    "host_cap_bytes = 0\n"
    "cpu_adam_params_per_s = 1e9\n";

static tio_trace *hand_trace(void)
{
    tio_trace *t;
    uint32_t id;
    assert_int_equal(tio_trace_create("hand tokens=1000", &t), 0);
    assert_int_equal(tio_trace_add_tensor(t, 1000, TIO_KIND_PARAMETER, true, "P", &id), 0);
    assert_int_equal(tio_trace_add_tensor(t, 400, TIO_KIND_GRADIENT, false, "G", &id), 0);
    assert_int_equal(tio_trace_add_tensor(t, 2000, TIO_KIND_OPTIMIZER_STATE, true, "S", &id), 0);
    assert_int_equal(tio_trace_add_tensor(t, 300, TIO_KIND_ACTIVATION, false, "A", &id), 0);
    static const struct { const char *name; uint64_t ns; uint32_t acc[3][2]; int n; } K[] = {
        {"fwd", 100, {{0, 1}, {3, 2}}, 2},
        {"bwd", 200, {{3, 1}, {0, 1}, {1, 2}}, 3},
        {"adam", 1000, {{0, 3}, {1, 1}, {2, 3}}, 3},
        {"tail", 500, {{2, 1}}, 1},
    };
    for (int k = 0; k < 4; k++) {
        assert_int_equal(tio_trace_add_kernel(t, K[k].name, K[k].ns), 0);
        for (int a = 0; a < K[k].n; a++)
            assert_int_equal(tio_trace_add_access(t, K[k].acc[a][0], (uint8_t)K[k].acc[a][1]), 0);
    }
    assert_int_equal(tio_trace_set_free_kernel(t, 1, 3), 0);
    assert_int_equal(tio_trace_validate(t), 0);
    return t;
}

static void test_shard_splits_global_tensors_gradients_and_the_optimizer_step(void **state)
{
    (void)state;
    tio_trace *t = hand_trace(), *s2, *s3, *s1;
    assert_int_equal(tio_trace_shard(t, 2, &s2), 0);
    assert_int_equal(s2->tensors[0].bytes, 500);
    assert_int_equal(s2->tensors[1].bytes, 200);
    assert_int_equal(s2->tensors[2].bytes, 1000);
    assert_int_equal(s2->tensors[3].bytes, 300);       /* activations stay whole */
    assert_int_equal(s2->kernels[0].duration_ns, 100);  /* forward and backward too */
    assert_int_equal(s2->kernels[1].duration_ns, 200);
    assert_int_equal(s2->kernels[2].duration_ns, 500);
    assert_int_equal(s2->kernels[3].duration_ns, 250);
    assert_int_equal(s2->tensors[1].free_kernel, 3);
    assert_int_equal(s2->n_accesses, t->n_accesses);
    assert_int_equal(tio_trace_shard(t, 3, &s3), 0);    /* bytes round up, time down */
    assert_int_equal(s3->tensors[0].bytes, 334);
    assert_int_equal(s3->tensors[1].bytes, 134);
    assert_int_equal(s3->tensors[2].bytes, 667);
    assert_int_equal(s3->kernels[2].duration_ns, 333);
    assert_int_equal(s3->kernels[3].duration_ns, 166);
    assert_int_equal(tio_trace_shard(t, 1, &s1), 0);
    assert_int_equal(tio_trace_iteration_ns(s1), 1800);
    assert_int_equal(tio_trace_shard(t, 0, &s1), -EINVAL);
    tio_trace_destroy(s1);
    tio_trace_destroy(s2);
    tio_trace_destroy(s3);
    tio_trace_destroy(t);
}

static void test_rows_say_what_fits_how_fast_and_what_it_costs(void **state)
{
    (void)state;
    tio_trace *t = hand_trace();
    tio_hw hw;
    assert_int_equal(tio_hw_parse(HW, strlen(HW), "t", &hw), 0);
    tio_advise_point pts[] = {
        {1, 100000, 1, 0},      /* fits as it is */
        {2, 100000, 1, 0},      /* two GPUs: half the states, the step twice as fast */
        {1, 100, 1, 0},         /* below what one kernel touches */
        {1, 100000, 2, 10000},  /* room for ZeRO-Offload's states and gradients */
    };
    tio_advise_options opt = {.tokens_per_iteration = 1000,
                              .prices = {.gpu_hour = 2, .ssd = 100, .amortize_hours = 1000},
                              .threads = 2};
    tio_advise_row rows[4];
    assert_int_equal(tio_advise_run(t, &hw, pts, 4, &opt, NULL, NULL, rows), 0);

    assert_int_equal(rows[0].peak_bytes, 3700);
    assert_true(rows[0].fits_without_offload && rows[0].fits);
    assert_true(rows[0].floor_bytes <= 3700);
    assert_int_equal(rows[0].status[TIO_ADVISE_TERAIO], 0);
    assert_true(rows[0].iteration_s[TIO_ADVISE_IDEAL] == 1800e-9);
    assert_true(rows[0].iteration_s[TIO_ADVISE_TERAIO] == 1800e-9);
    assert_true(rows[0].share_of_ideal[TIO_ADVISE_TERAIO] == 1.0);
    assert_true(rows[0].tokens_per_s[TIO_ADVISE_TERAIO] == 1000 / 1800e-9);
    double hourly = 1 * (2 + 100.0 / 1000);
    assert_true(fabs(rows[0].usd_per_mtoken[TIO_ADVISE_TERAIO] -
                     hourly / (1000 / 1800e-9 * 3600) * 1e6) < 1e-12);
    /* ZeRO-Offload needs S + G = 2400 bytes of host memory: none here. */
    assert_int_equal(rows[0].zero_offload_host_bytes, 2400);
    assert_int_equal(rows[0].status[TIO_ADVISE_ZERO_OFFLOAD], -ENOSPC);
    assert_true(isnan(rows[0].iteration_s[TIO_ADVISE_ZERO_OFFLOAD]));

    assert_int_equal(rows[1].peak_bytes, 2000);
    assert_true(rows[1].iteration_s[TIO_ADVISE_IDEAL] == 1050e-9);
    assert_true(rows[1].tokens_per_s[TIO_ADVISE_IDEAL] == 2 * 1000 / 1050e-9);
    assert_int_equal(rows[1].zero_offload_host_bytes, 1200);

    assert_false(rows[2].fits_without_offload || rows[2].fits);
    assert_int_equal(rows[2].status[TIO_ADVISE_TERAIO], TIO_EINFEASIBLE);
    assert_int_equal(rows[2].status[TIO_ADVISE_ZERO_INFINITY], TIO_EINFEASIBLE); /* below the floor */
    assert_int_equal(rows[2].status[TIO_ADVISE_IDEAL], 0);
    assert_true(isnan(rows[2].iteration_s[TIO_ADVISE_TERAIO]));
    assert_true(isnan(rows[2].tokens_per_s[TIO_ADVISE_TERAIO]));

    assert_int_equal(rows[3].status[TIO_ADVISE_ZERO_OFFLOAD], 0);
    assert_true(rows[3].iteration_s[TIO_ADVISE_ZERO_OFFLOAD] > 0);
    assert_int_equal(rows[3].hw.ssd_count, 2);
    assert_int_equal(rows[3].hw.host_cap_bytes, 10000);

    /* Smallest: row 0 (1 GPU, 1 SSD) before row 3 (2 SSDs) and row 1 (2 GPUs);
     * cheapest per token: two GPUs at the same price per GPU-hour train
     * more than twice as fast (the step halves). */
    assert_int_equal(tio_advise_smallest(rows, 4, 0.99), 0);
    assert_int_equal(tio_advise_cheapest(rows, 4, 0.99), 1);
    tio_trace_destroy(t);
}

/* PCIe 2.5 GB/s, 1 GB/s per SSD: with a third SSD the host channels keep
 * 10% of the link (tio_hw_channels), and ZeRO-Infinity, which stages in
 * host memory, is slower on 3 SSDs than on 2: the 3-SSD row uses 2. */
static void test_a_row_uses_fewer_of_its_ssds_where_that_is_faster(void **state)
{
    (void)state;
    tio_trace *t = hand_trace();
    char text[sizeof HW + 64];
    snprintf(text, sizeof text, "%s", HW);
    memcpy(strstr(text, "pcie_h2d_gbps = 100"), "pcie_h2d_gbps = 2.5", 19);
    memcpy(strstr(text, "pcie_d2h_gbps = 100"), "pcie_d2h_gbps = 2.5", 19);
    tio_hw hw;
    assert_int_equal(tio_hw_parse(text, strlen(text), "t", &hw), 0);
    tio_advise_point pts[] = {{1, 3500, 1, 10000}, {1, 3500, 2, 10000}, {1, 3500, 3, 10000}};
    tio_advise_options opt = {.tokens_per_iteration = 10,
                              .prices = {.ssd = 100, .amortize_hours = 1000}};
    tio_advise_row rows[3];
    assert_int_equal(tio_advise_run(t, &hw, pts, 3, &opt, NULL, NULL, rows), 0);
    int zi = TIO_ADVISE_ZERO_INFINITY;
    assert_int_equal(rows[1].ssds_used[zi], 2);
    assert_int_equal(rows[2].ssds_used[zi], 2);
    assert_true(rows[2].iteration_s[zi] == rows[1].iteration_s[zi]);
    assert_true(rows[2].usd_per_mtoken[zi] > rows[1].usd_per_mtoken[zi]); /* 3 SSDs bought */
    for (int c = TIO_ADVISE_TERAIO; c < TIO_ADVISE_N_STRATEGIES; c++)
        for (int i = 1; i < 3; i++)
            if (!rows[i].status[c])
                assert_true(rows[i].iteration_s[c] <= rows[i - 1].iteration_s[c]);
    tio_trace_destroy(t);
}

static void test_smallest_orders_gpus_memory_ssds_host(void **state)
{
    (void)state;
    tio_advise_row rows[5];
    memset(rows, 0, sizeof rows);
    const tio_advise_point p[5] = {{2, 10, 1, 0}, {1, 20, 1, 0}, {1, 10, 3, 0}, {1, 10, 2, 5},
                                   {1, 10, 2, 1}};
    const double share[5] = {1, 1, 0.95, 0.95, 0.91};
    for (int i = 0; i < 5; i++) {
        rows[i].point = p[i];
        rows[i].fits = true;
        rows[i].share_of_ideal[TIO_ADVISE_TERAIO] = share[i];
        rows[i].usd_per_mtoken[TIO_ADVISE_TERAIO] = NAN;
    }
    assert_int_equal(tio_advise_smallest(rows, 5, 0.9), 4);
    assert_int_equal(tio_advise_smallest(rows, 5, 0.92), 3);
    assert_int_equal(tio_advise_smallest(rows, 5, 0.99), 1);
    rows[1].fits = false;
    assert_int_equal(tio_advise_smallest(rows, 5, 0.99), 0);
    assert_int_equal(tio_advise_smallest(rows, 5, 1.01), -1);
    assert_int_equal(tio_advise_cheapest(rows, 5, 0.9), -1); /* no prices */
}

static void test_bad_arguments_are_refused_with_a_message(void **state)
{
    (void)state;
    tio_trace *t = hand_trace();
    tio_hw hw;
    assert_int_equal(tio_hw_parse(HW, strlen(HW), "t", &hw), 0);
    tio_advise_point pts[2] = {{1, 100000, 1, 0}, {0, 100000, 1, 0}};
    tio_advise_options opt = {.tokens_per_iteration = 1000};
    tio_advise_row rows[2];
    assert_int_equal(tio_advise_run(t, &hw, pts, 2, &opt, NULL, NULL, rows), -EINVAL);
    assert_non_null(strstr(tio_last_error(), "point 1: gpus must be >= 1"));
    assert_int_equal(tio_advise_run(t, &hw, pts, 0, &opt, NULL, NULL, rows), -EINVAL);
    opt.tokens_per_iteration = 0;
    assert_int_equal(tio_advise_run(t, &hw, pts, 1, &opt, NULL, NULL, rows), -EINVAL);
    opt.tokens_per_iteration = 1;
    opt.prices.ssd = 100;
    assert_int_equal(tio_advise_run(t, &hw, pts, 1, &opt, NULL, NULL, rows), -EINVAL);
    assert_non_null(strstr(tio_last_error(), "amortize_hours"));
    opt.prices.ssd = -1;
    opt.prices.amortize_hours = 10;
    assert_int_equal(tio_advise_run(t, &hw, pts, 1, &opt, NULL, NULL, rows), -EINVAL);
    tio_trace_destroy(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shard_splits_global_tensors_gradients_and_the_optimizer_step),
        cmocka_unit_test(test_rows_say_what_fits_how_fast_and_what_it_costs),
        cmocka_unit_test(test_a_row_uses_fewer_of_its_ssds_where_that_is_faster),
        cmocka_unit_test(test_smallest_orders_gpus_memory_ssds_host),
        cmocka_unit_test(test_bad_arguments_are_refused_with_a_message),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
