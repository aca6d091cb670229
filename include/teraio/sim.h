/*
 * teraio/sim.h — hardware profiles and the discrete-event simulator.
 *
 * A hardware profile (a small "key = value" file under hw/, format below)
 * describes one GPU's share of a machine: its memory budget, the PCIe link
 * each way, its SSDs, the host-memory cap, and the CPU's Adam throughput.
 * The simulator replays a trace under a strategy on a profile: a compute
 * stream runs the kernels in order; migration channels (SSD write, SSD
 * read, device->host, host->device) each serve their queued transfers
 * earliest deadline first, preemptively (chunk by chunk), at their
 * bandwidth plus a fixed latency per transfer; a kernel starts only when
 * every transfer it waits for is done.  It reports the
 * steady-state iteration time, stall time, bytes moved per channel, peak
 * resident memory and the ratio to the ideal (unlimited memory, same
 * kernels).  The baselines' models are documented in docs/baselines.md.
 *
 * Profile file: one "key = value" per line, '#' starts a comment, blank
 * lines ignored, every key below required once unless it says "optional":
 *   name                 one token
 *   capacity_bytes       device memory budget (integer, > 0)
 *   pcie_h2d_gbps        host->device link, GB/s (1e9 B/s), > 0
 *   pcie_d2h_gbps        device->host link, GB/s, > 0
 *   ssd_count            SSDs serving this GPU (integer, >= 1)
 *   ssd_read_gbps        per SSD, GB/s, > 0
 *   ssd_write_gbps       per SSD, GB/s, > 0
 *   ssd_array_read_gbps  optional cap on the array (RAID-0) read, GB/s
 *   ssd_array_write_gbps optional cap on the array write, GB/s
 *   ssd_latency_us       per transfer, >= 0
 *   host_latency_us      per transfer, >= 0
 *   host_cap_bytes       host memory this GPU may use (integer, >= 0)
 *   cpu_adam_params_per_s  CPU Adam updates per second for this GPU, > 0
 *   gpu_matmul_tflops, gpu_vector_tflops, gpu_mem_gbps, matmul_efficiency,
 *   mem_efficiency, kernel_overhead_us   optional: the roofline constants
 *                        (the efficiencies are shares of the peak, in (0, 1])
 *                        the paper tracer (python/teraio/paper.py) reads
 *   gpu_matmul_16bit_tflops  optional: dense bf16/fp16 tensor-core rate, for
 *                        traces of 16-bit models (teraio advise --dtype bf16)
 *   host_overhead_us     optional, >= 0 (default 0): compute-stream time per
 *                        kernel that the trace's kernel times leave out —
 *                        the framework's and the offload adapter's dispatch
 *                        on the host.  0 where the host runs ahead of the
 *                        device (a GPU); > 0 when the device is the host CPU
 *                        (the CPU demo, docs/eval.md)
 *   migration_host_ns_per_byte  optional, >= 0 (default 0): compute-stream
 *                        time per byte a plan migrates (offload or
 *                        prefetch), charged at the kernel that issues it:
 *                        the host work of moving bytes (re-allocating and
 *                        faulting in memory, unmapping, submitting I/O) when
 *                        it runs on the cores that compute.  0 on a GPU,
 *                        whose copy engines and SSDs move the bytes
 * The two host fields apply to plan replay (tio_sim_plan and the planning
 * strategies); the ZeRO and LRU models ignore them.
 *
 * Thread-safety: every function here is reentrant; objects are not shared.
 */
#ifndef TERAIO_SIM_H
#define TERAIO_SIM_H

#include "teraio/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    char name[64];
    uint64_t capacity_bytes;
    double pcie_h2d_gbps, pcie_d2h_gbps;
    uint32_t ssd_count;
    double ssd_read_gbps, ssd_write_gbps;             /* per SSD */
    double ssd_array_read_gbps, ssd_array_write_gbps; /* 0: no cap */
    double ssd_latency_us, host_latency_us;
    uint64_t host_cap_bytes;
    double cpu_adam_params_per_s;
    double gpu_matmul_tflops, gpu_vector_tflops, gpu_mem_gbps;
    double matmul_efficiency, mem_efficiency, kernel_overhead_us;
    double host_overhead_us, migration_host_ns_per_byte;
    double gpu_matmul_16bit_tflops;
} tio_hw;

/* Parse a profile from memory (`len` bytes, need not be NUL-terminated);
 * `origin` names it in messages.  Returns 0; TIO_EPARSE with
 * "origin:line: field 'key': expected ..." (unknown key, duplicate, bad or
 * out-of-range value, missing required key: the message names it);
 * -EINVAL (NULL arguments). */
TIO_API int tio_hw_parse(const char *text, size_t len, const char *origin, tio_hw *out);

/* Read and parse a profile file.  Returns as tio_hw_parse, or -errno of the
 * failing read (message names the file). */
TIO_API int tio_hw_load(const char *path, tio_hw *out);

/* Effective channel bandwidths, GB/s.  SSD read = min(count x per-SSD,
 * array cap, PCIe h2d) and likewise for writes; the host channels get the
 * PCIe bandwidth the SSD array leaves (PCIe - SSD, at least 10% of PCIe),
 * because GPUDirect SSD traffic crosses the same link. */
typedef struct {
    double ssd_read, ssd_write, host_read, host_write;
} tio_hw_bandwidth;
TIO_API tio_hw_bandwidth tio_hw_channels(const tio_hw *hw);

/* Planner options for this profile (capacity, the four bandwidths above,
 * host cap). */
TIO_API void tio_hw_plan_options(const tio_hw *hw, tio_plan_options *opt);

typedef enum {
    TIO_SIM_IDEAL = 0,
    TIO_SIM_TERAIO_ALG1 = 1,
    TIO_SIM_TERAIO = 2,
    TIO_SIM_ZERO_OFFLOAD = 3,
    TIO_SIM_ZERO_INFINITY = 4,
    TIO_SIM_FLASHNEURON = 5,
    TIO_SIM_LRU = 6,
    TIO_SIM_N_STRATEGIES = 7,
} tio_sim_strategy;

/* "ideal", "teraio-alg1", "teraio", "zero-offload", "zero-infinity",
 * "flashneuron", "lru"; NULL if out of range. */
TIO_API const char *tio_sim_strategy_name(tio_sim_strategy s);

/* Strategy by name; returns 0 or -EINVAL (message lists the names). */
TIO_API int tio_sim_strategy_parse(const char *name, tio_sim_strategy *out);

/* Reports index their channels by TIO_CH_* (plan.h). */
typedef struct {
    uint64_t iteration_ns;   /* steady-state iteration (the last simulated one) */
    uint64_t ideal_ns;       /* sum of kernel durations (host costs excluded) */
    uint64_t stall_ns;       /* compute stream waiting on transfers or on the CPU */
    uint32_t n_stalls;       /* kernels that waited */
    uint64_t peak_bytes;     /* peak resident device bytes (<= capacity) */
    uint64_t overflow_bytes; /* most bytes above capacity a plan left, swapped on
                                demand (each costs a stall) */
    uint64_t bytes[TIO_CH_N];/* per iteration, per channel */
    double busy_ns[TIO_CH_N];/* per iteration, time each channel moved data */
    double fraction_of_ideal;/* ideal_ns / iteration_ns */
    double plan_seconds;     /* wall time of the planner (0 when none ran) */
    bool plan_fits;          /* planned peak <= capacity (true without a plan) */
    uint32_t n_kernels;
    uint64_t *memory_bytes;  /* [n_kernels] resident bytes at each kernel of the
                                last iteration; owned, free with tio_sim_report_free */
} tio_sim_report;

/* Replay `plan` (made for this trace: tio_plan_check must accept it) on
 * `hw`.  Three iterations are simulated from a state where every tensor a
 * wrap-around migration keeps off the device starts off it; the third is
 * reported.  A plan whose M' exceeds the capacity at some kernel is still
 * replayed: the excess is swapped out and back on demand through the SSD
 * channels and counted as stall (overflow_bytes says how much).  Returns 0,
 * -EINVAL (mismatched plan, unpaired offload/prefetch: message says which),
 * -ERANGE (the simulated time is not below 2^64 ns, 584 years: a bandwidth
 * far too small for the trace; never a wrapped value), -ENOMEM. */
TIO_API int tio_sim_plan(const tio_trace *trace, const tio_lifetime *lt, const tio_hw *hw,
                         const tio_plan *plan, tio_sim_report *out);

/* Run one strategy: plan it if it plans, with tio_plan_build on the
 * profile's options (tio_hw_plan_options) — teraio: the default options;
 * teraio-alg1: Algorithm 1's rules (best_tier and planned_stalls off,
 * synchronous_moves on as for TIO_PLANNER_ALG1) on
 * the teraio planner, which makes exactly TIO_PLANNER_ALG1's plan in far
 * less time, so its plan_seconds is not the faithful planner's;
 * flashneuron: activations only (kind_mask), SSD only, no synchronous
 * moves — and replay it, or
 * simulate the baseline's own
 * model (zero-offload, zero-infinity, lru: docs/baselines.md).  If
 * `plan_out` is not NULL and the strategy planned, the plan is handed over
 * (caller destroys it), else *plan_out is NULL.  Returns 0, -EINVAL,
 * TIO_EINFEASIBLE (a kernel alone needs more than the capacity), -ERANGE
 * (as tio_sim_plan, for every strategy), -ENOMEM. */
TIO_API int tio_sim_run(const tio_trace *trace, const tio_lifetime *lt, const tio_hw *hw,
                        tio_sim_strategy strategy, tio_sim_report *out, tio_plan **plan_out);

/* Free the report's arrays (not the struct).  NULL is a no-op. */
TIO_API void tio_sim_report_free(tio_sim_report *r);

/* ---- fitting a CPU's host costs (sim/calibrate.c) -------------------------
 *
 * The CPU demo's simulator check (docs/eval.md): the same job measured
 * iteration by iteration under three plans in turn — E, an empty plan
 * (nothing moves); C, a calibration plan; R, the plan whose time the
 * simulator must predict — plus the disk bandwidth measured through the
 * engine.  The fit takes this CPU's dispatch time per kernel from E and its
 * host time per migrated byte from C (sim/calibrate.c has the method), and
 * simulates R on the fitted profile. */
typedef struct {
    const tio_plan *calibration;         /* C, made for the trace */
    const tio_plan *plan;                /* R, made for the trace */
    uint64_t calibration_capacity_bytes; /* device budget C ran under */
    uint64_t capacity_bytes;             /* device budget R ran under */
    double empty_s, calibration_s;       /* measured mean iteration of E and C, s */
    double measured_s;                   /* measured mean iteration of R, s */
    double ssd_read_gbps, ssd_write_gbps;/* measured through the engine, GB/s */
} tio_sim_calibration;

typedef struct {
    tio_hw hw;            /* the fitted profile: one disk at the measured
                             bandwidths, host_overhead_us and
                             migration_host_ns_per_byte fitted */
    double kernel_scale;  /* 1, or < 1 where E ran faster than the traced kernels:
                             kernel times scaled to E (and no dispatch time) */
    double kernels_s;     /* the trace's kernel time per iteration (unscaled) */
    double simulated_s;   /* R simulated on hw */
    double measured_s;    /* R measured (in->measured_s) */
    double error;         /* |simulated_s - measured_s| / measured_s */
} tio_sim_fit;

/* Fit and predict as above.  The trace is not modified.  Returns 0;
 * -EINVAL (missing or mismatched plans, times outside (0, 1e5] s,
 * bandwidths outside (0, 1e4] GB/s, capacity 0); -ERANGE when no host cost
 * fits (C measured faster than its simulation without host costs — the
 * machine's speed changed during the check — or slower than 10 us per
 * migrated byte explains); the errors of tio_sim_plan; -ENOMEM. */
TIO_API int tio_sim_fit_host_costs(const tio_trace *trace, const tio_lifetime *lt,
                                   const tio_sim_calibration *in, tio_sim_fit *out);

/* ---- evaluation suites (sim/suite.c) --------------------------------------
 *
 * A suite is a directory holding traces, the hardware profile they were
 * timed for (hw.conf), and an index, suite.txt, that lists the
 * configurations to evaluate and published figures to compare with.  The
 * paper's suite is written by `python -m teraio.paper trace DIR`.  Index
 * format, one record per line, fields separated by blanks, '#' lines and
 * blank lines ignored after the first line:
 *   teraio-suite 1                     the first line (TIO_EVERSION otherwise)
 *   hw NAME                            the profile's name (required, once)
 *   config MODEL BATCH SEQ MICRO_BATCH SHARDS REFERENCE_M_PCT TRACE
 *                                      one configuration: the model, its
 *                                      global batch and sequence length,
 *                                      the sequences per micro-batch and the
 *                                      GPUs the global tensors are sharded
 *                                      over, as traced; the published peak
 *                                      memory per GPU in % of its memory; the
 *                                      trace file inside DIR (no '/')
 *   reference MODEL STRATEGY FRACTION  a published fraction of ideal, in
 *                                      [0, 1], of one strategy on one model
 * Names are 1-31 (TRACE: 1-255) characters of letters, digits and . _ + -;
 * integers are in [1, 2^32); at most 4096 config and 4096 reference lines;
 * at least one config. */
typedef struct {
    char model[32];
    uint32_t batch, seq, micro_batch, shards;
    double reference_m_pct;
    char trace[256];
} tio_sim_suite_config;

typedef struct {
    char model[32];
    tio_sim_strategy strategy;
    double fraction_of_ideal;
} tio_sim_suite_reference;

typedef struct {
    char hw_name[64];
    uint32_t n_configs, cap_configs;
    tio_sim_suite_config *configs;       /* [n_configs] in file order */
    uint32_t n_references, cap_references;
    tio_sim_suite_reference *references; /* [n_references] in file order */
} tio_sim_suite;

/* Parse an index from memory (`len` bytes, need not be NUL-terminated);
 * `origin` names it in messages.  Returns 0, TIO_EPARSE ("origin:line:
 * field 'name': expected ..."), TIO_EVERSION, -EINVAL, -ENOMEM. */
TIO_API int tio_sim_suite_parse(const char *text, size_t len, const char *origin,
                                tio_sim_suite **out);

/* Read DIR/suite.txt.  Returns as tio_sim_suite_parse, or -errno of the
 * failed read (the message names the file). */
TIO_API int tio_sim_suite_load(const char *dir, tio_sim_suite **out);

TIO_API void tio_sim_suite_destroy(tio_sim_suite *suite);

/* One configuration's results: every strategy, indexed by tio_sim_strategy. */
typedef struct {
    tio_sim_report rep[TIO_SIM_N_STRATEGIES];
    double traced_m_pct;   /* the trace's peak memory / hw capacity, % */
    uint32_t same_as;      /* the first configuration with the same trace file
                              (its own index if none before it): its results
                              are copies of that one's */
} tio_sim_suite_result;

/* Called before each strategy of each simulated configuration. */
typedef void (*tio_sim_progress_fn)(void *ctx, uint32_t config, const char *strategy);

/* Load each configuration's trace from `dir`, analyse it and run every
 * strategy (tio_sim_run) on `hw`; a trace named twice is simulated once.
 * `progress` may be NULL.  *out gets [suite->n_configs] results, freed with
 * tio_sim_suite_results_free.  Returns 0 or the first error of loading a
 * trace (the message names the file) or of tio_sim_run. */
TIO_API int tio_sim_suite_run(const tio_sim_suite *suite, const char *dir, const tio_hw *hw,
                              tio_sim_progress_fn progress, void *ctx,
                              tio_sim_suite_result **out);

TIO_API void tio_sim_suite_results_free(tio_sim_suite_result *results, uint32_t n);

#ifdef __cplusplus
}
#endif
#endif
