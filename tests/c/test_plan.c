/*
 * tests/c/test_plan.c — planner v1 (Algorithm 1) and the plan file, checked
 * against plans worked out by hand below.
 *
 * The trace: 8 kernels, 5 tensors.
 *
 *   kernel  name        ns    accesses
 *     0     fwd.embed   500   P(r)
 *     1     fwd.mm1     500   A(w)
 *     2     fwd.mm2    1000   B(w)
 *     3     fwd.gelu   1000   X(w)
 *     4     bwd.gelu   1000   X(r)
 *     5     bwd.mm2    1000   B(r)
 *     6     bwd.mm1     500   A(r) G(w)
 *     7     adamw       500   P(rw) G(r)
 *
 *   tensor  bytes  kind        uses   inactive periods (last_use, next_use)
 *   0 P     1000   parameter   0, 7   (0, 7)       wrap 7 -> 8 is one kernel: none
 *   1 A     2000   activation  1, 6   (1, 6)
 *   2 B     1000   activation  2, 5   (2, 5)
 *   3 X      500   temporary   3, 4   none
 *   4 G      500   gradient    6, 7   (7, 14) wraps: 14 = first use 6 + 8
 *
 * Memory curve M (P and G always, A over 1..6, B over 2..5, X over 3..4):
 *   M = [1500, 3500, 4500, 5000, 5000, 4500, 3500, 1500], peak 5000 at k3.
 * Active bytes: k6 needs A + G = 2500, the most of any kernel.
 *
 * With ssd write 1 GB/s and read 2 GB/s the budgets per kernel are
 *   W = tau = [500, 500, 1000, 1000, 1000, 1000, 500, 500] bytes,
 *   R = 2 tau = [1000, 1000, 2000, 2000, 2000, 2000, 1000, 1000] bytes.
 */
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include <cmocka.h>

#include "common/util.h"
#include "teraio/teraio.h"

enum { P = 0, A = 1, B = 2, X = 3, G = 4 };
enum { R = TIO_ACCESS_READ, W = TIO_ACCESS_WRITE };

typedef struct {
    tio_trace *trace;
    tio_lifetime *lt;
} fixture;

static void add_kernel(tio_trace *t, const char *name, uint64_t ns, int n, ...)
{
    assert_int_equal(tio_trace_add_kernel(t, name, ns), 0);
    va_list ap;
    va_start(ap, n);
    for (int i = 0; i < n; i++) {
        uint32_t tensor = va_arg(ap, uint32_t);
        int mode = va_arg(ap, int);
        assert_int_equal(tio_trace_add_access(t, tensor, (uint8_t)mode), 0);
    }
    va_end(ap);
}

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    assert_non_null(f);
    assert_int_equal(tio_trace_create("plan test", &f->trace), 0);
    tio_trace *t = f->trace;
    uint32_t id;
    assert_int_equal(tio_trace_add_tensor(t, 1000, TIO_KIND_PARAMETER, true, "P", &id), 0);
    assert_int_equal(tio_trace_add_tensor(t, 2000, TIO_KIND_ACTIVATION, false, "A", &id), 0);
    assert_int_equal(tio_trace_add_tensor(t, 1000, TIO_KIND_ACTIVATION, false, "B", &id), 0);
    assert_int_equal(tio_trace_add_tensor(t, 500, TIO_KIND_TEMPORARY, false, "X", &id), 0);
    assert_int_equal(tio_trace_add_tensor(t, 500, TIO_KIND_GRADIENT, true, "G", &id), 0);
    add_kernel(t, "fwd.embed", 500, 1, P, R);
    add_kernel(t, "fwd.mm1", 500, 1, A, W);
    add_kernel(t, "fwd.mm2", 1000, 1, B, W);
    add_kernel(t, "fwd.gelu", 1000, 1, X, W);
    add_kernel(t, "bwd.gelu", 1000, 1, X, R);
    add_kernel(t, "bwd.mm2", 1000, 1, B, R);
    add_kernel(t, "bwd.mm1", 500, 2, A, R, G, W);
    add_kernel(t, "adamw", 500, 2, P, R | W, G, R);
    assert_int_equal(tio_lifetime_analyze(t, &f->lt), 0);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    tio_lifetime_destroy(f->lt);
    tio_trace_destroy(f->trace);
    free(f);
    return 0;
}

/* Options of the hand-worked Algorithm 1 plans below: DESIGN.md's text,
 * without the synchronous finish (tested on its own further down). */
static tio_plan_options options(uint64_t capacity, double read_gbps, double write_gbps)
{
    tio_plan_options o;
    tio_plan_options_default(&o);
    o.planner = TIO_PLANNER_ALG1;
    o.synchronous_moves = false;
    o.capacity_bytes = capacity;
    o.ssd_read_gbps = read_gbps;
    o.ssd_write_gbps = write_gbps;
    return o;
}

static void assert_migration(const tio_migration *m, uint32_t tensor, tio_migration_kind kind,
                             uint32_t trigger, uint32_t deadline, tio_tier tier, uint64_t bytes)
{
    assert_int_equal(m->tensor, tensor);
    assert_int_equal(m->kind, kind);
    assert_int_equal(m->trigger_kernel, trigger);
    assert_int_equal(m->deadline_kernel, deadline);
    assert_int_equal(m->tier, tier);
    assert_int_equal(m->bytes, bytes);
}

static void assert_curve(const uint64_t *got, const uint64_t want[8])
{
    for (int k = 0; k < 8; k++) {
        if (got[k] != want[k])
            fail_msg("M'[%d] = %llu, want %llu", k, (unsigned long long)got[k],
                     (unsigned long long)want[k]);
    }
}

/* The lifetime analysis the hand-worked plans start from. */
static void test_fixture_lifetime(void **state)
{
    const tio_lifetime *lt = ((fixture *)*state)->lt;
    static const uint64_t m[8] = {1500, 3500, 4500, 5000, 5000, 4500, 3500, 1500};
    assert_curve(lt->memory_bytes, m);
    assert_int_equal(lt->max_active_bytes, 2500);
    assert_int_equal(lt->n_periods, 4);
    static const uint32_t per[4][3] = {{P, 0, 7}, {A, 1, 6}, {B, 2, 5}, {G, 7, 14}};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(lt->periods[i].tensor, per[i][0]);
        assert_int_equal(lt->periods[i].last_use, per[i][1]);
        assert_int_equal(lt->periods[i].next_use, per[i][2]);
    }
}

/*
 * Capacity 4000: kernels 2..5 are over (4500, 5000, 5000, 4500).
 *
 * Round 1 (every candidate scored):
 *   P (0,7) s=1000: write from k1: 500 (k1) + 500 of k2's 1000 -> covered at
 *       k2, k_off = 3; read back from k6: 1000 -> covered at k6, k_pre = 6.
 *       Window [3,6) = k3 k4 k5, all over: score 1000+1000+1000 = 3000.
 *   A (1,6) s=2000: write k2 + k3 = 2000 -> k_off = 4; read k5 = 2000 ->
 *       k_pre = 5.  Window [4,5) = k4: score 1000.
 *   B (2,5) s=1000: write k3 -> k_off = 4; read k4 -> k_pre = 4: not viable,
 *       no host tier: dropped.
 *   G (7,14) s=500: write from k8 = k0: 500 -> k_off = 9 (k1); read back from
 *       k13 = k5: 2000 -> k_pre = 13 (k5).  Window [9,13) = k1..k4: k2 k3 k4
 *       over: score 3000.
 *   P and G tie at 3000; P is larger (1000 > 500): P wins.
 *   offload P trigger 1 deadline 3, prefetch P trigger 6 deadline 7.
 *   M' -= 1000 over k3..k5: [1500, 3500, 4500, 4000, 4000, 3500, 3500, 1500].
 *   Booked: W[1] 500 -> 0, W[2] 1000 -> 500, R[6] 1000 -> 0.
 *
 * Round 2 (only k2 over, 4500):
 *   A (1,6): write 500 (k2) + 1000 (k3) + 500 of k4 -> k_off = 5; read k5 ->
 *       k_pre = 5: not viable, dropped.
 *   G (7,14): write k0 500 -> k_off = 9; read k5 -> k_pre = 13; window k1..k4,
 *       only k2 over: score 1000.  Taken.
 *   offload G trigger 8%8 = 0 deadline 9%8 = 1, prefetch G trigger 13%8 = 5
 *   deadline 14%8 = 6.  M' -= 500 over k1..k4:
 *   M' = [1500, 3000, 4000, 3500, 3500, 3500, 3500, 1500]; max 4000: stop.
 *
 * Sorted by trigger: G off @0, P off @1, G pre @5, P pre @6.
 */
static void test_plan_two_offloads(void **state)
{
    fixture *f = *state;
    tio_plan_options o = options(4000, 2.0, 1.0);
    tio_plan *plan;
    assert_int_equal(tio_plan_build(f->trace, f->lt, &o, &plan), 0);
    assert_int_equal(plan->n_kernels, 8);
    assert_int_equal(plan->n_tensors, 5);
    assert_int_equal(plan->capacity_bytes, 4000);
    assert_int_equal(plan->n_migrations, 4);
    assert_migration(&plan->migrations[0], G, TIO_MIGRATION_OFFLOAD, 0, 1, TIO_TIER_SSD, 500);
    assert_migration(&plan->migrations[1], P, TIO_MIGRATION_OFFLOAD, 1, 3, TIO_TIER_SSD, 1000);
    assert_migration(&plan->migrations[2], G, TIO_MIGRATION_PREFETCH, 5, 6, TIO_TIER_SSD, 500);
    assert_migration(&plan->migrations[3], P, TIO_MIGRATION_PREFETCH, 6, 7, TIO_TIER_SSD, 1000);
    static const uint64_t m[8] = {1500, 3000, 4000, 3500, 3500, 3500, 3500, 1500};
    assert_curve(plan->planned_memory_bytes, m);
    assert_int_equal(plan->planned_peak_bytes, 4000);
    assert_true(plan->fits);
    assert_int_equal(plan->bytes_to_ssd, 1500);
    assert_int_equal(plan->bytes_to_host, 0);
    assert_int_equal(plan->peak_host_bytes, 0);
    assert_true(plan->plan_seconds >= 0);
    assert_int_equal(tio_plan_check(plan, f->trace, f->lt), 0);
    tio_plan_destroy(plan);
}

/* Capacity at the peak: nothing to move. */
static void test_plan_nothing_to_move(void **state)
{
    fixture *f = *state;
    tio_plan_options o = options(5000, 2.0, 1.0);
    tio_plan *plan;
    assert_int_equal(tio_plan_build(f->trace, f->lt, &o, &plan), 0);
    assert_int_equal(plan->n_migrations, 0);
    assert_int_equal(plan->planned_peak_bytes, 5000);
    assert_true(plan->fits);
    tio_plan_destroy(plan);
}

/*
 * Host fallback.  Capacity 4500: only k3 and k4 (5000) are over.  SSD read
 * is slow, 0.25 GB/s: R_ssd = tau/4 = [125, 125, 250, 250, 250, 250, 125, 125];
 * SSD write 1 GB/s as before.  Host channels: device->host 1 GB/s,
 * host->device 2 GB/s (the budgets of the first test), host cap 1000.
 *
 * Round 1:
 *   P (0,7) s=1000: SSD write k_off = 3; SSD read back 125 (k6) + 250 (k5) +
 *       250 (k4) + 250 (k3) + 125 of k2 -> k_pre = 2: not viable.  Host: it
 *       fits the cap (1000 over k1..k6); write k_off = 3, read k6 1000 ->
 *       k_pre = 6; window k3 k4 k5, over k3 k4: score 2000, tier host.
 *   A (1,6) s=2000: SSD read k5..k2 give only 1000: not viable; 2000 is
 *       above the host cap: dropped.
 *   B (2,5) s=1000: SSD read k4 + k3 = 500 < 1000: not viable; host: write
 *       k_off = 4, read k4 -> k_pre = 4: not viable.  Dropped.
 *   G (7,14) s=500: SSD write k0 -> k_off = 9; SSD read 250 (k5) + 250 (k4)
 *       -> k_pre = 12 (k4); window k1 k2 k3, over k3: score 1000, tier ssd.
 *   P (host, 2000) beats G (ssd, 1000).
 *   offload P trigger 1 deadline 3 host, prefetch P trigger 6 deadline 7 host.
 *   M' = [1500, 3500, 4500, 4000, 4000, 3500, 3500, 1500]: max 4500, stop.
 *   Host holds P over k1..k6: peak host 1000.
 */
static void test_plan_host_fallback(void **state)
{
    fixture *f = *state;
    tio_plan_options o = options(4500, 0.25, 1.0);
    o.device_to_host_gbps = 1.0;
    o.host_to_device_gbps = 2.0;
    o.host_cap_bytes = 1000;
    tio_plan *plan;
    assert_int_equal(tio_plan_build(f->trace, f->lt, &o, &plan), 0);
    assert_int_equal(plan->n_migrations, 2);
    assert_migration(&plan->migrations[0], P, TIO_MIGRATION_OFFLOAD, 1, 3, TIO_TIER_HOST, 1000);
    assert_migration(&plan->migrations[1], P, TIO_MIGRATION_PREFETCH, 6, 7, TIO_TIER_HOST, 1000);
    static const uint64_t m[8] = {1500, 3500, 4500, 4000, 4000, 3500, 3500, 1500};
    assert_curve(plan->planned_memory_bytes, m);
    assert_true(plan->fits);
    assert_int_equal(plan->bytes_to_ssd, 0);
    assert_int_equal(plan->bytes_to_host, 1000);
    assert_int_equal(plan->peak_host_bytes, 1000);
    assert_int_equal(tio_plan_check(plan, f->trace, f->lt), 0);
    tio_plan_destroy(plan);
}

/*
 * Same as above with host cap 999: P can go nowhere and is dropped.
 * Round 1 takes G on SSD (score 1000): M' -= 500 over k1..k3:
 *   M' = [1500, 3000, 4000, 4500, 5000, 4500, 3500, 1500].
 * Round 2: k4 still over, nothing left: best effort, does not fit.
 */
static void test_plan_host_cap_blocks(void **state)
{
    fixture *f = *state;
    tio_plan_options o = options(4500, 0.25, 1.0);
    o.device_to_host_gbps = 1.0;
    o.host_to_device_gbps = 2.0;
    o.host_cap_bytes = 999;
    tio_plan *plan;
    assert_int_equal(tio_plan_build(f->trace, f->lt, &o, &plan), 0);
    assert_int_equal(plan->n_migrations, 2);
    assert_migration(&plan->migrations[0], G, TIO_MIGRATION_OFFLOAD, 0, 1, TIO_TIER_SSD, 500);
    assert_migration(&plan->migrations[1], G, TIO_MIGRATION_PREFETCH, 4, 6, TIO_TIER_SSD, 500);
    static const uint64_t m[8] = {1500, 3000, 4000, 4500, 5000, 4500, 3500, 1500};
    assert_curve(plan->planned_memory_bytes, m);
    assert_int_equal(plan->planned_peak_bytes, 5000);
    assert_false(plan->fits);
    assert_int_equal(plan->peak_host_bytes, 0);
    tio_plan_destroy(plan);
}

/*
 * Issue 13 item 2, a plan always fits when it can: the input on which
 * Algorithm 1 stops above capacity (test_plan_host_cap_blocks without a
 * host tier).  The teraio planner, planned stalls off so the arithmetic
 * stays by hand, runs Algorithm 1's round first (G on SSD over k1..k3) and
 * is left with k4 at 5000 > 4500, 500 over.  Synchronous moves there:
 *   G (window [9, 12) unwrapped) misses k4 = 12: widen its prefetch to
 *     trigger at k5 (13), synchronous on that side: stall 500 B / 0.25 GB/s
 *     = 2000 ns, 4 ns per byte of the excess;
 *   P (0,7), not chosen: write budget over k1..k3 is 2500 >= 1000, so its
 *     offload is hidden (k_off 3); read budget over k5..k6 is what G's
 *     prefetch left, 0 + 125 < 1000: stall 3500 ns, 7 ns per excess byte.
 * G wins: prefetch G trigger 5, deadline 6; M' at k4 = 4500; predicted
 * stall 2000 ns; and the plan fits.
 */
static void test_plan_fits_with_a_synchronous_move(void **state)
{
    fixture *f = *state;
    tio_plan_options o = options(4500, 0.25, 1.0);
    o.planner = TIO_PLANNER_TERAIO;
    o.planned_stalls = false;
    o.synchronous_moves = true;
    tio_plan *plan;
    assert_int_equal(tio_plan_build(f->trace, f->lt, &o, &plan), 0);
    assert_true(plan->fits);
    assert_int_equal(plan->n_migrations, 2);
    assert_migration(&plan->migrations[0], G, TIO_MIGRATION_OFFLOAD, 0, 1, TIO_TIER_SSD, 500);
    assert_migration(&plan->migrations[1], G, TIO_MIGRATION_PREFETCH, 5, 6, TIO_TIER_SSD, 500);
    static const uint64_t m[8] = {1500, 3000, 4000, 4500, 4500, 4500, 3500, 1500};
    assert_curve(plan->planned_memory_bytes, m);
    assert_int_equal(plan->predicted_stall_ns, 2000);
    assert_int_equal(tio_plan_check(plan, f->trace, f->lt), 0);
    tio_plan_destroy(plan);
    /* at the floor itself (kernel 6 needs 2500 B) it still fits, with every
     * default on; Algorithm 1 does not */
    o = options(2500, 0.25, 1.0);
    o.planner = TIO_PLANNER_TERAIO;
    o.synchronous_moves = true;
    assert_int_equal(tio_plan_build(f->trace, f->lt, &o, &plan), 0);
    assert_true(plan->fits && plan->planned_peak_bytes == 2500 && plan->predicted_stall_ns > 0);
    assert_int_equal(tio_plan_check(plan, f->trace, f->lt), 0);
    tio_plan_destroy(plan);
    o.planner = TIO_PLANNER_ALG1;
    o.synchronous_moves = false; /* DESIGN.md's Algorithm 1 stops above capacity */
    assert_int_equal(tio_plan_build(f->trace, f->lt, &o, &plan), 0);
    assert_false(plan->fits);
    tio_plan_destroy(plan);
    /* Algorithm 1 with the authors' rule (the default): the same finish as
     * the first case above, the same plan */
    o = options(4500, 0.25, 1.0);
    o.synchronous_moves = true;
    assert_int_equal(tio_plan_build(f->trace, f->lt, &o, &plan), 0);
    assert_true(plan->fits);
    assert_int_equal(plan->n_migrations, 2);
    assert_migration(&plan->migrations[1], G, TIO_MIGRATION_PREFETCH, 5, 6, TIO_TIER_SSD, 500);
    assert_int_equal(plan->predicted_stall_ns, 2000);
    tio_plan_destroy(plan);
}

/*
 * The case that failed before (issue 13 item 2): tests/data/llama-tiny.tio,
 * a profiled Llama-style model (2 layers, AdamW), with tight bandwidth.
 * The fast planner's old default answered "does not fit" at 0.5 of its
 * 3652212-byte peak with 0.1 GB/s (planned 1844256 against 1826106) and
 * 0.02 GB/s.  Now every capacity from the working-set floor (393216 B) to
 * the peak gets a fitting plan, with and without a host tier, that the
 * checker accepts, whose replay keeps memory within capacity with nothing
 * swapped on demand, and that predicts a stall wherever Algorithm 1 fails.
 */
static void test_plan_fits_tight_bandwidth_llama(void **state)
{
    (void)state;
    const char *src = tio_env("SOURCE_DIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/data/llama-tiny.tio", src ? src : ".");
    tio_trace *t;
    tio_lifetime *lt;
    assert_int_equal(tio_trace_load(path, &t), 0);
    assert_int_equal(tio_lifetime_analyze(t, &lt), 0);
    assert_int_equal(lt->max_active_bytes, 393216);
    static const double gbps[] = {1.0, 0.1, 0.02};
    static const double share[] = {0, 0.2, 0.5, 0.7, 0.9};
    uint32_t alg1_failed = 0;
    for (int g = 0; g < 3; g++) {
        for (int c = 0; c < 5; c++) {
            for (int host = 0; host < 2; host++) {
                tio_plan_options o = options(0, gbps[g], gbps[g]);
                o.capacity_bytes = lt->max_active_bytes +
                                   (uint64_t)(share[c] * (double)(lt->peak_bytes -
                                                                  lt->max_active_bytes));
                o.host_cap_bytes = host ? lt->peak_bytes / 4 : 0;
                o.host_to_device_gbps = o.device_to_host_gbps = host ? 10 * gbps[g] : 0;
                tio_plan *ref, *plan;
                assert_int_equal(tio_plan_build(t, lt, &o, &ref), 0);
                o.planner = TIO_PLANNER_TERAIO;
                o.synchronous_moves = true;
                assert_int_equal(tio_plan_build(t, lt, &o, &plan), 0);
                if (!plan->fits)
                    fail_msg("%g GB/s, capacity %llu, host %d: planned %llu", gbps[g],
                             (unsigned long long)o.capacity_bytes, host,
                             (unsigned long long)plan->planned_peak_bytes);
                assert_true(plan->peak_host_bytes <= o.host_cap_bytes);
                if (!ref->fits) {
                    alg1_failed++;
                    assert_true(plan->predicted_stall_ns > 0);
                }
                tio_hw hw = {.capacity_bytes = o.capacity_bytes, .pcie_h2d_gbps = 100,
                             .pcie_d2h_gbps = 100, .ssd_count = 1, .ssd_read_gbps = gbps[g],
                             .ssd_write_gbps = gbps[g], .host_cap_bytes = o.host_cap_bytes,
                             .cpu_adam_params_per_s = 1e9};
                assert_int_equal(tio_plan_check(plan, t, lt), 0);
                tio_sim_report r;
                assert_int_equal(tio_sim_plan(t, lt, &hw, plan, &r), 0);
                assert_true(r.plan_fits && r.overflow_bytes == 0);
                assert_true(r.peak_bytes <= o.capacity_bytes);
                tio_sim_report_free(&r);
                tio_plan_destroy(plan);
                tio_plan_destroy(ref);
            }
        }
    }
    assert_true(alg1_failed >= 10);
    tio_lifetime_destroy(lt);
    tio_trace_destroy(t);
}

/* 2000 B is below kernel 6's 2500 B (A + G). */
static void test_plan_infeasible(void **state)
{
    fixture *f = *state;
    tio_plan_options o = options(2000, 2.0, 1.0);
    tio_plan *plan = (tio_plan *)1;
    assert_int_equal(tio_plan_build(f->trace, f->lt, &o, &plan), TIO_EINFEASIBLE);
    assert_null(plan);
    assert_string_equal(tio_last_error(),
                        "capacity 1.95 KiB is below kernel 6 (bwd.mm1)'s need of 2.44 KiB, the "
                        "working-set floor: no plan fits below it; accessed: A (activation, 1.95 KiB), "
                        "G (gradient, 500 B) (teraio analyze lists them)");
}

static void test_plan_bad_options(void **state)
{
    fixture *f = *state;
    tio_plan *plan;
    tio_plan_options o = options(0, 2.0, 1.0);
    assert_int_equal(tio_plan_build(f->trace, f->lt, &o, &plan), -EINVAL);
    o = options(4000, 0.0, 1.0);
    assert_int_equal(tio_plan_build(f->trace, f->lt, &o, &plan), -EINVAL);
    o = options(4000, 2.0, 1.0);
    o.host_to_device_gbps = -1;
    assert_int_equal(tio_plan_build(f->trace, f->lt, &o, &plan), -EINVAL);
    o = options(4000, 2.0, 1.0);
    o.planner = (tio_planner)7;
    assert_int_equal(tio_plan_build(f->trace, f->lt, &o, &plan), -EINVAL);
    assert_non_null(strstr(tio_last_error(), "unknown planner 7"));
}

static void test_plan_options_default(void **state)
{
    (void)state;
    tio_plan_options o;
    memset(&o, 0xff, sizeof o);
    tio_plan_options_default(&o);
    assert_int_equal(o.planner, TIO_PLANNER_TERAIO);
    assert_int_equal(o.capacity_bytes, 0);
    assert_true(o.ssd_read_gbps == 2.0);
    assert_true(o.ssd_write_gbps == 1.5);
    assert_true(o.host_to_device_gbps == 0.0);
    assert_true(o.device_to_host_gbps == 0.0);
    assert_int_equal(o.host_cap_bytes, 0);
    assert_int_equal(o.kind_mask, 0);
    assert_true(o.best_tier && o.planned_stalls && o.synchronous_moves);
    assert_string_equal(tio_planner_name(TIO_PLANNER_TERAIO), "teraio");
    assert_string_equal(tio_planner_name(TIO_PLANNER_ALG1), "alg1");
    assert_null(tio_planner_name((tio_planner)2));
    tio_planner pl;
    assert_int_equal(tio_planner_parse("alg1", &pl), 0);
    assert_int_equal(pl, TIO_PLANNER_ALG1);
    assert_int_equal(tio_planner_parse("fast", &pl), -EINVAL);
    assert_string_equal(tio_last_error(), "unknown planner 'fast' (teraio, alg1)");
    assert_string_equal(tio_tier_name(TIO_TIER_SSD), "ssd");
    assert_string_equal(tio_tier_name(TIO_TIER_HOST), "host");
    assert_string_equal(tio_tier_name(TIO_TIER_DEVICE), "device");
}

static char *tmp_path(const char *name)
{
    const char *dir = tio_env("TEST_TMPDIR");
    if (!dir)
        dir = "/tmp";
    mkdir(dir, 0755);
    static char path[4096];
    snprintf(path, sizeof path, "%s/%s.%ld", dir, name, (long)getpid());
    return path;
}

static char *slurp(const char *path)
{
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    static char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, fp);
    buf[n] = '\0';
    fclose(fp);
    return buf;
}

static const char two_offloads_file[] =
    "teraio-plan 1\n"
    "kernels 8 tensors 5 capacity 4000\n"
    "offload 4 0 1 ssd 500\n"
    "offload 0 1 3 ssd 1000\n"
    "prefetch 4 5 6 ssd 500\n"
    "prefetch 0 6 7 ssd 1000\n";

/* Save writes exactly the documented text; load gives the same plan back,
 * and check re-derives the same M' from the migrations alone. */
static void test_plan_save_load_round_trip(void **state)
{
    fixture *f = *state;
    tio_plan_options o = options(4000, 2.0, 1.0);
    tio_plan *plan, *back;
    assert_int_equal(tio_plan_build(f->trace, f->lt, &o, &plan), 0);
    char path[4096];
    snprintf(path, sizeof path, "%s", tmp_path("round_trip.plan"));
    assert_int_equal(tio_plan_save(plan, path), 0);
    assert_string_equal(slurp(path), two_offloads_file);

    assert_int_equal(tio_plan_load(path, &back), 0);
    assert_int_equal(back->n_kernels, plan->n_kernels);
    assert_int_equal(back->n_tensors, plan->n_tensors);
    assert_int_equal(back->capacity_bytes, plan->capacity_bytes);
    assert_int_equal(back->n_migrations, plan->n_migrations);
    assert_memory_equal(back->migrations, plan->migrations,
                        plan->n_migrations * sizeof *plan->migrations);
    assert_null(back->planned_memory_bytes);
    assert_int_equal(back->bytes_to_ssd, 1500);
    assert_int_equal(tio_plan_check(back, f->trace, NULL), 0);
    assert_non_null(back->planned_memory_bytes);
    assert_memory_equal(back->planned_memory_bytes, plan->planned_memory_bytes,
                        8 * sizeof(uint64_t));
    assert_int_equal(back->planned_peak_bytes, 4000);
    assert_true(back->fits);

    char again[4200];
    snprintf(again, sizeof again, "%s.again", path);
    assert_int_equal(tio_plan_save(back, again), 0);
    assert_string_equal(slurp(again), two_offloads_file);
    unlink(path);
    unlink(again);
    tio_plan_destroy(back);
    tio_plan_destroy(plan);
}

/* A host plan round-trips too, and check recomputes its host high-water. */
static void test_plan_parse_host_and_comments(void **state)
{
    fixture *f = *state;
    static const char text[] =
        "teraio-plan 1\r\n"
        "# hand-written\n"
        "\n"
        "kernels 8 tensors 5 capacity 4500\n"
        "prefetch 0 6 7 host 1000\n"
        "  offload\t0 1 3 host 1000";
    tio_plan *plan;
    assert_int_equal(tio_plan_parse(text, sizeof text - 1, "mem", &plan), 0);
    assert_int_equal(plan->n_migrations, 2);
    assert_migration(&plan->migrations[0], P, TIO_MIGRATION_OFFLOAD, 1, 3, TIO_TIER_HOST, 1000);
    assert_migration(&plan->migrations[1], P, TIO_MIGRATION_PREFETCH, 6, 7, TIO_TIER_HOST, 1000);
    assert_int_equal(plan->bytes_to_host, 1000);
    assert_int_equal(tio_plan_check(plan, f->trace, f->lt), 0);
    assert_int_equal(plan->peak_host_bytes, 1000);
    assert_int_equal(plan->planned_peak_bytes, 4500);
    assert_true(plan->fits);
    tio_plan_destroy(plan);
}

static void expect_parse_error(const char *text, int code, const char *message)
{
    tio_plan *plan = (tio_plan *)1;
    assert_int_equal(tio_plan_parse(text, strlen(text), "mem", &plan), code);
    assert_null(plan);
    assert_string_equal(tio_last_error(), message);
}

#define HEAD "teraio-plan 1\nkernels 8 tensors 5 capacity 4000\n"

static void test_plan_parse_errors(void **state)
{
    (void)state;
    expect_parse_error("", TIO_EPARSE,
                       "mem:1: field 'magic': expected 'teraio-plan', found end of file");
    expect_parse_error("teraio-trace 1\n", TIO_EPARSE,
                       "mem:1: field 'magic': expected 'teraio-plan', found 'teraio-trace'");
    expect_parse_error("teraio-plan 2\n", TIO_EVERSION,
                       "mem:1: plan format version 2 is not supported (this build reads "
                       "version 1)");
    expect_parse_error("teraio-plan one\n", TIO_EPARSE,
                       "mem:1: field 'version': expected an unsigned integer, found 'one'");
    expect_parse_error("teraio-plan 1\n", TIO_EPARSE,
                       "mem:2: field 'kernels': expected 'kernels', found end of file");
    expect_parse_error("teraio-plan 1\nkernels 0 tensors 5 capacity 4000\n", TIO_EPARSE,
                       "mem:2: field 'kernels': expected a kernel count from 1 to 2147483647, "
                       "found '0'");
    expect_parse_error("teraio-plan 1\nkernels 8 tensor 5 capacity 4000\n", TIO_EPARSE,
                       "mem:2: field 'tensors': expected 'tensors', found 'tensor'");
    expect_parse_error("teraio-plan 1\nkernels 8 tensors 5 capacity 18446744073709551616\n",
                       TIO_EPARSE,
                       "mem:2: field 'capacity': expected a capacity in bytes, at least 1, "
                       "found '18446744073709551616'");
    expect_parse_error(HEAD "evict 0 1 3 ssd 1000\n", TIO_EPARSE,
                       "mem:3: field 'kind': expected 'offload' or 'prefetch', found 'evict'");
    expect_parse_error(HEAD "offload -1 1 3 ssd 1000\n", TIO_EPARSE,
                       "mem:3: field 'tensor': expected a tensor id below 2^32, found '-1'");
    expect_parse_error(HEAD "offload 0 x 3 ssd 1000\n", TIO_EPARSE,
                       "mem:3: field 'trigger': expected a kernel index below 8, found 'x'");
    expect_parse_error(HEAD "\n# c\noffload 0 1 8 ssd 1000\n", TIO_EPARSE,
                       "mem:5: field 'deadline': expected a kernel index below 8, found '8'");
    expect_parse_error(HEAD "offload 0 1 3 gpu 1000\n", TIO_EPARSE,
                       "mem:3: field 'tier': expected 'ssd' or 'host', found 'gpu'");
    expect_parse_error(HEAD "offload 0 1 3 ssd\n", TIO_EPARSE,
                       "mem:3: field 'bytes': expected a size in bytes, at least 1, found "
                       "end of line");
    expect_parse_error(HEAD "offload 0 1 3 ssd 1000 extra\n", TIO_EPARSE,
                       "mem:3: field 'bytes': expected end of line after it, found 'extra'");
    /* Raw bytes are shown as '?' and long tokens are cut. */
    expect_parse_error(HEAD "offload 0 1 3 ssd 1\x01\n", TIO_EPARSE,
                       "mem:3: field 'bytes': expected a size in bytes, at least 1, found '1?'");
    expect_parse_error(HEAD "offload 0 1 3 ssd 123456789012345678901234567890123456\n",
                       TIO_EPARSE,
                       "mem:3: field 'bytes': expected a size in bytes, at least 1, found "
                       "'12345678901234567890123456789012...'");
}

static void test_plan_load_missing_file(void **state)
{
    (void)state;
    tio_plan *plan;
    assert_int_equal(tio_plan_load("/nonexistent/teraio.plan", &plan), -ENOENT);
    assert_non_null(strstr(tio_last_error(), "/nonexistent/teraio.plan"));
}

static void expect_check_error(fixture *f, const char *body, int code, const char *message)
{
    char text[1024];
    snprintf(text, sizeof text, "%s", body);
    tio_plan *plan;
    assert_int_equal(tio_plan_parse(text, strlen(text), "mem", &plan), 0);
    assert_int_equal(tio_plan_check(plan, f->trace, f->lt), code);
    assert_string_equal(tio_last_error(), message);
    assert_null(plan->planned_memory_bytes);
    tio_plan_destroy(plan);
}

static void test_plan_check_errors(void **state)
{
    fixture *f = *state;
    expect_check_error(f, HEAD "offload 99 1 3 ssd 1000\nprefetch 99 6 7 ssd 1000\n",
                       TIO_EUNKNOWN, "plan names unknown tensor 99 (trace has 5 tensors)");
    expect_check_error(f, "teraio-plan 1\nkernels 9 tensors 5 capacity 4000\n", TIO_EPARSE,
                       "plan is for 9 kernels, trace has 8");
    expect_check_error(f, "teraio-plan 1\nkernels 8 tensors 6 capacity 4000\n", TIO_EPARSE,
                       "plan was built for a trace with 6 tensors, this trace has 5");
    expect_check_error(f, HEAD "offload 0 1 3 ssd 999\nprefetch 0 6 7 ssd 999\n", TIO_EPARSE,
                       "plan moves 999 bytes of tensor 0, trace says 1000");
    expect_check_error(f, HEAD "offload 0 1 3 ssd 1000\n", TIO_EPARSE,
                       "offload of tensor 0 (deadline kernel 3) has no matching prefetch");
    expect_check_error(f, HEAD "prefetch 0 6 7 ssd 1000\n", TIO_EPARSE,
                       "prefetch of tensor 0 (trigger kernel 6) has no matching offload");
    expect_check_error(f, HEAD "offload 0 1 3 ssd 1000\nprefetch 0 6 7 host 1000\n", TIO_EPARSE,
                       "offload and prefetch of tensor 0 (kernels 3 and 6) disagree on the tier");
    /* A is used at kernels 1 and 6: keeping it off the device over 5..7 is wrong. */
    expect_check_error(f, HEAD "offload 1 2 5 ssd 2000\nprefetch 1 7 7 ssd 2000\n", TIO_EPARSE,
                       "tensor 1 is not idle from kernel 2 (offload issued) to kernel 7 "
                       "(prefetch due)");
}

/* Two pairs of P inside its one period (0, 7) that overlap: the second
 * offload is issued at kernel 1, while the first pair has P away until its
 * prefetch is due at kernel 4.  The runtime would skip that offload, so the
 * M' the check used to derive (P away over [2, 3) and [4, 5)) never
 * happened.  Found by feeding random plans to the check and the runtime. */
static void test_plan_check_overlapping_pairs(void **state)
{
    fixture *f = *state;
    expect_check_error(f, HEAD "offload 0 1 2 ssd 1000\nprefetch 0 3 4 ssd 1000\n"
                              "offload 0 1 4 ssd 1000\nprefetch 0 5 7 ssd 1000\n",
                       TIO_EPARSE, "offload of tensor 0 issued at kernel 1 overlaps its earlier "
                       "prefetch due at kernel 4 (the tensor must be back first)");
    /* Back at kernel 3 and written out again from kernel 3: at one kernel
     * the runtime issues offloads before prefetches, so this is refused too. */
    expect_check_error(f, HEAD "offload 0 1 2 ssd 1000\nprefetch 0 3 3 ssd 1000\n"
                              "offload 0 3 4 ssd 1000\nprefetch 0 5 7 ssd 1000\n",
                       TIO_EPARSE, "offload of tensor 0 issued at kernel 3 overlaps its earlier "
                       "prefetch due at kernel 3 (the tensor must be back first)");
    /* One kernel later it is a valid plan: P away over [2, 3) and [5, 6). */
    const char *text = HEAD "offload 0 1 2 ssd 1000\nprefetch 0 3 3 ssd 1000\n"
                            "offload 0 4 5 ssd 1000\nprefetch 0 6 7 ssd 1000\n";
    tio_plan *plan;
    assert_int_equal(tio_plan_parse(text, strlen(text), "mem", &plan), 0);
    assert_int_equal(tio_plan_check(plan, f->trace, f->lt), 0);
    static const uint64_t want[8] = {1500, 3500, 3500, 5000, 5000, 3500, 3500, 1500};
    assert_memory_equal(plan->planned_memory_bytes, want, sizeof want);
    tio_plan_destroy(plan);
}

/* A tensor of 2^63 bytes: the check's difference arrays used int64_t and
 * overflowed (UBSan: "0 - -9223372036854775808").  T0 (2^63 B, global) is
 * used at kernels 0 and 3, T1 (4 KiB) over 1..2; T0 is away over [1, 2). */
static void test_plan_check_huge_tensor(void **state)
{
    (void)state;
    const char *trace_text = "teraio-trace 1\ncounts 2 4 4\n"
                             "tensor 0 9223372036854775808 parameter global\n"
                             "tensor 1 4096 activation intermediate\n"
                             "kernel 0 1000 a r:0\nkernel 1 1000 b w:1\n"
                             "kernel 2 1000 c r:1\nkernel 3 1000 d r:0\n";
    const char *plan_text = "teraio-plan 1\nkernels 4 tensors 2 capacity 9223372036854775808\n"
                            "offload 0 1 1 ssd 9223372036854775808\n"
                            "prefetch 0 2 3 ssd 9223372036854775808\n";
    tio_trace *t;
    tio_plan *plan;
    assert_int_equal(tio_trace_parse(trace_text, strlen(trace_text), "mem", &t), 0);
    assert_int_equal(tio_plan_parse(plan_text, strlen(plan_text), "mem", &plan), 0);
    assert_int_equal(tio_plan_check(plan, t, NULL), 0);
    const uint64_t e63 = 1ull << 63;
    const uint64_t want[4] = {e63, 4096, e63 + 4096, e63};
    assert_memory_equal(plan->planned_memory_bytes, want, sizeof want);
    assert_int_equal(plan->planned_peak_bytes, e63 + 4096);
    assert_false(plan->fits);
    assert_int_equal(plan->bytes_to_ssd, e63);
    tio_plan_destroy(plan);
    tio_trace_destroy(t);
}

/* A trace without kernels used to get a plan whose file ("kernels 0") the
 * reader refuses, so `teraio plan` wrote what `teraio check` could not load. */
static void test_plan_no_kernels(void **state)
{
    (void)state;
    tio_trace *t;
    tio_lifetime *lt;
    assert_int_equal(tio_trace_create(NULL, &t), 0);
    assert_int_equal(tio_lifetime_analyze(t, &lt), 0);
    tio_plan_options o = options(1, 2.0, 1.0);
    tio_plan *plan = (tio_plan *)1;
    assert_int_equal(tio_plan_build(t, lt, &o, &plan), -EINVAL);
    assert_null(plan);
    assert_string_equal(tio_last_error(), "the trace has no kernels: there is nothing to plan");
    tio_plan empty = {.n_kernels = 0, .capacity_bytes = 1};
    char *path = tmp_path("no-kernels.plan");
    assert_int_equal(tio_plan_save(&empty, path), -EINVAL);
    assert_int_equal(access(path, F_OK), -1);
    tio_lifetime_destroy(lt);
    tio_trace_destroy(t);
}

/* ---- property: the planner's M' is what its migrations imply ----------------
 * For random traces (fixed seed) each planner's own M' (range updates per
 * round, and for the teraio planner its synchronous moves) must equal the M' tio_plan_check derives independently from the
 * migrations alone (difference arrays over the offload/prefetch pairs), and
 * every plan must pass the check: pairs balanced, each tensor off the device
 * only inside one of its inactive periods, host cap respected. */

static uint64_t lcg(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

static tio_trace *random_trace(uint64_t *seed)
{
    tio_trace *t;
    assert_int_equal(tio_trace_create(NULL, &t), 0);
    uint32_t n_tensors = 2 + (uint32_t)(lcg(seed) % 12);
    uint32_t n_kernels = 4 + (uint32_t)(lcg(seed) % 20);
    uint8_t uses[16][32] = {{0}};
    for (uint32_t i = 0; i < n_tensors; i++) {
        uint32_t id;
        bool global = lcg(seed) % 3 == 0;
        assert_int_equal(tio_trace_add_tensor(t, 1 + lcg(seed) % 3000,
                                              global ? TIO_KIND_PARAMETER : TIO_KIND_ACTIVATION,
                                              global, NULL, &id), 0);
        uint32_t n_uses = 1 + (uint32_t)(lcg(seed) % 4);
        for (uint32_t u = 0; u < n_uses; u++)
            uses[i][lcg(seed) % n_kernels] = (uint8_t)(1 + lcg(seed) % 3);
    }
    for (uint32_t k = 0; k < n_kernels; k++) {
        uint64_t ns = lcg(seed) % 4 == 0 ? 0 : lcg(seed) % 2000; /* some kernels take 0 ns */
        assert_int_equal(tio_trace_add_kernel(t, "op", ns), 0);
        for (uint32_t i = 0; i < n_tensors; i++)
            if (uses[i][k])
                assert_int_equal(tio_trace_add_access(t, i, uses[i][k]), 0);
    }
    return t;
}

static void test_plan_random_traces_check(void **state)
{
    (void)state;
    static const double gbps[] = {0.05, 0.5, 1.0, 4.0};
    uint64_t seed = 12345;
    uint32_t fitted = 0, moved = 0;
    for (int iter = 0; iter < 400; iter++) {
        tio_trace *t = random_trace(&seed);
        tio_lifetime *lt;
        assert_int_equal(tio_lifetime_analyze(t, &lt), 0);
        tio_plan_options o = options(lt->max_active_bytes +
                                         lcg(&seed) % (lt->peak_bytes - lt->max_active_bytes + 1),
                                     gbps[lcg(&seed) % 4], gbps[lcg(&seed) % 4]);
        if (o.capacity_bytes == 0)
            o.capacity_bytes = 1;
        o.host_cap_bytes = lcg(&seed) % 2 ? lcg(&seed) % 6000 : 0;
        o.host_to_device_gbps = gbps[lcg(&seed) % 4];
        for (int planner = TIO_PLANNER_TERAIO; planner <= TIO_PLANNER_ALG1; planner++) {
            o.planner = (tio_planner)planner;
            o.synchronous_moves = planner == TIO_PLANNER_TERAIO; /* alg1: DESIGN.md's text */
            tio_plan *plan;
            assert_int_equal(tio_plan_build(t, lt, &o, &plan), 0);
            assert_true(plan->fits == (plan->planned_peak_bytes <= o.capacity_bytes));
            assert_true(plan->peak_host_bytes <= o.host_cap_bytes);
            if (planner == TIO_PLANNER_ALG1) {
                fitted += plan->fits;
                moved += plan->n_migrations > 0;
            } else if (!plan->fits) { /* issue 13 item 2: always, above the floor */
                fail_msg("iteration %d: the teraio plan does not fit", iter);
            }

            tio_plan *copy = calloc(1, sizeof *copy);
            assert_non_null(copy);
            *copy = *plan;
            copy->planned_memory_bytes = NULL;
            copy->peak_host_bytes = copy->bytes_to_ssd = copy->bytes_to_host = 0;
            copy->migrations = malloc((plan->n_migrations + 1) * sizeof *plan->migrations);
            assert_non_null(copy->migrations);
            if (plan->n_migrations)
                memcpy(copy->migrations, plan->migrations,
                       plan->n_migrations * sizeof *plan->migrations);
            if (tio_plan_check(copy, t, lt) != 0)
                fail_msg("iteration %d: %s", iter, tio_last_error());
            assert_memory_equal(copy->planned_memory_bytes, plan->planned_memory_bytes,
                                t->n_kernels * sizeof(uint64_t));
            assert_int_equal(copy->planned_peak_bytes, plan->planned_peak_bytes);
            assert_int_equal(copy->peak_host_bytes, plan->peak_host_bytes);
            assert_int_equal(copy->bytes_to_ssd, plan->bytes_to_ssd);
            assert_int_equal(copy->bytes_to_host, plan->bytes_to_host);
            tio_plan_destroy(copy);
            tio_plan_destroy(plan);
        }
        tio_lifetime_destroy(lt);
        tio_trace_destroy(t);
    }
    /* The sample covers both outcomes. */
    assert_true(fitted > 0 && fitted < 400);
    assert_true(moved > 100);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixture_lifetime),
        cmocka_unit_test(test_plan_two_offloads),
        cmocka_unit_test(test_plan_nothing_to_move),
        cmocka_unit_test(test_plan_host_fallback),
        cmocka_unit_test(test_plan_host_cap_blocks),
        cmocka_unit_test(test_plan_fits_with_a_synchronous_move),
        cmocka_unit_test(test_plan_fits_tight_bandwidth_llama),
        cmocka_unit_test(test_plan_infeasible),
        cmocka_unit_test(test_plan_bad_options),
        cmocka_unit_test(test_plan_options_default),
        cmocka_unit_test(test_plan_save_load_round_trip),
        cmocka_unit_test(test_plan_parse_host_and_comments),
        cmocka_unit_test(test_plan_parse_errors),
        cmocka_unit_test(test_plan_load_missing_file),
        cmocka_unit_test(test_plan_check_errors),
        cmocka_unit_test(test_plan_check_overlapping_pairs),
        cmocka_unit_test(test_plan_check_huge_tensor),
        cmocka_unit_test(test_plan_no_kernels),
        cmocka_unit_test(test_plan_random_traces_check),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
