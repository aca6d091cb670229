"""The demo's runs, each in its own process (teraio.demo.cli starts them):

* run A — no offloading.  Iteration 1 is profiled to get the memory curve
  M[k] and its peak (the bytes that must be resident without teraio).
* run B — the same job under teraio.torch.offload for a capacity of
  --capacity-fraction of run A's peak: two profiled iterations, a plan made
  with the SSD bandwidth the engine measures, the rest offloaded to files
  under build/demo/ssd (or --ssd DIR ...).  Then, in the same process and
  on B's trace (one profiling loop for both), run V: the simulator check,
  iterations under an empty plan, a calibration plan and B's plan in turn.
* run S (--sweep) — one profile, then for each of 0.9, 0.8, ... 0.1 of run
  A's peak, down to the working-set floor, iterations without teraio, under
  the simulator check's two calibration plans and under the share's plan,
  in turn.

Each returns a dict the parent writes into the report (teraio.demo.report).
"""
from __future__ import annotations

import os
import time

from .job import Job, loss_bits, peak_rss_bytes, progress, reset_peak_rss
from .limit import usage_bytes


def ssd_dirs(args) -> list[str]:
    dirs = args.ssd or [os.path.join(args.out, "ssd")]
    if not args.ssd:
        os.makedirs(dirs[0], exist_ok=True)
    return dirs


def engine_space(lt) -> int:
    return 2 * lt.peak_bytes + (64 << 20)


def run_a(args) -> dict:
    from ..core import Lifetime
    from ..torch import Profiler
    job = Job(args)
    prof = Profiler(job.model, job.opt, name="llama-demo")
    cgroup_before = usage_bytes()
    losses, times = [], []
    rss_reset = False
    for i in range(args.iterations):
        progress(f"run A (no offloading): iteration {i + 1}/{args.iterations}")
        t0 = time.perf_counter()
        if i == 1:
            with prof.iteration():
                loss = job.step(i)
        else:
            loss = job.step(i)
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
        if i == 1:
            trace = prof.save(os.path.join(args.out, "trace_a.tio"))
            lt = Lifetime(trace)
            curve = lt.memory_curve()
            peak, floor = lt.peak_bytes, lt.floor_bytes
            del loss
            rss_reset = reset_peak_rss()
    steady = times[2:]
    return {"losses": losses, "loss_bits": [loss_bits(x) for x in losses], "times": times,
            "iter_time_s": sum(steady) / len(steady), "peak_bytes": peak, "floor_bytes": floor,
            "memory_curve": curve, "rss_peak_bytes": peak_rss_bytes(), "rss_peak_reset": rss_reset,
            "n_params": job.n_params, "corpus_bytes": job.corpus_bytes, "n_kernels": len(curve),
            "cgroup_before_bytes": cgroup_before}


def run_b(args) -> dict:
    """Run B through teraio.torch.offload, then run V on its trace."""
    from ..torch import offload
    from ..torch.runtime import _rss_bytes
    rss_base = _rss_bytes()  # before the model: Python and PyTorch
    job = Job(args)
    dirs = ssd_dirs(args)
    off = offload(job.model, job.opt, capacity=int(args.capacity_bytes * (1 - args.plan_headroom)), ssd=dirs,
                  bandwidth_share=args.bandwidth_derate, name="llama-demo")
    losses, times, curve, rss_curve = [], [], [], []
    rss_reset = False
    for i in range(args.iterations):
        what = "profiling" if off.runtime is None else f"offloading to {', '.join(dirs)}"
        progress(f"run B ({what}): iteration {i + 1}/{args.iterations}")
        if i == args.iterations - 1 and off.runtime is not None:
            off.runtime.record_curve(curve, rss_curve)
        t0 = time.perf_counter()
        with off.step():
            loss = job.step(i)
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
        del loss
        if i == 1:
            rss_reset = reset_peak_rss()
    rss_peak = peak_rss_bytes()
    report = off.report()
    trace, lt, plan = off.trace, off.lifetime, off.plan
    read_gbps, write_gbps = off.ssd_gbps
    backend, reason = off.engine.backend, off.engine.backend_reason
    trace.save(os.path.join(args.out, "trace.tio"))
    plan.save(os.path.join(args.out, "plan.tio"))
    off.close()
    steady = times[3:]
    out = {"losses": losses, "loss_bits": [loss_bits(x) for x in losses],
           "iter_time_s": sum(steady) / len(steady), "rss_peak_bytes": rss_peak, "rss_peak_reset": rss_reset,
           "stats": report, "backend": backend, "backend_reason": reason,
           "ssd_read_gbps": read_gbps, "ssd_write_gbps": write_gbps, "capacity_bytes": args.capacity_bytes,
           "peak_bytes": lt.peak_bytes, "planned_curve": plan.planned_curve(), "measured_curve": curve,
           "rss_curve": [max(0, r - rss_base) for r in rss_curve], "rss_base_bytes": rss_base,
           "plan": {"migrations": plan.n_migrations, "planned_peak_bytes": plan.planned_peak_bytes,
                    "fits": bool(plan.fits), "bytes_to_ssd": plan.bytes_to_ssd,
                    "plan_seconds": plan.plan_seconds}, "ssd_dirs": dirs}
    if args.validate_iterations:
        out["validation"] = run_v(args, job, trace, lt, plan, dirs, (read_gbps, write_gbps))
    return out


def plans_for(trace, lt, args, gbps):
    """capacity -> plan with the demo's settings (runs V and S)."""
    from ..core import Plan
    read_gbps, write_gbps = gbps

    def plan_for(capacity: int):
        return Plan.build(trace, lt, int(capacity * (1 - args.plan_headroom)),
                          ssd_read_gbps=read_gbps * args.bandwidth_derate,
                          ssd_write_gbps=write_gbps * args.bandwidth_derate, host_cap_bytes=0)

    return plan_for


def timed_iteration(job, i: int, rt) -> tuple[float, float]:
    """Iteration i under runtime rt: (seconds, loss)."""
    t0 = time.perf_counter()
    with rt.iteration():
        loss = job.step(i)
    return time.perf_counter() - t0, loss.item()


def run_v(args, job, trace, lt, plan_r, dirs, gbps) -> dict:
    """The simulator check, on run B's trace and model: iterations under
    three plans in turn, each under a fresh OffloadRuntime: E (empty plan:
    nothing moves), C (a calibration plan for a capacity of
    --validate-capacity-fraction of the peak) and R (run B's plan).  Taking
    the three in turn, iteration by iteration, lets the slow and fast
    spells of a shared machine fall on all three alike.  E and C calibrate
    the host costs of this CPU (dispatch per kernel, host work per migrated
    byte); R's time is what the simulator must predict."""
    from ..core import Engine
    from ..torch import OffloadRuntime
    n = args.validate_iterations
    engine = Engine(dirs, engine_space(lt))
    plan_for = plans_for(trace, lt, args, gbps)
    cal_capacity = int(lt.peak_bytes * args.validate_capacity_fraction)
    plans = {"E": plan_for(4 * lt.peak_bytes), "C": plan_for(cal_capacity), "R": plan_r}
    if plans["E"].n_migrations:
        raise RuntimeError("simulator check: the plan for unlimited memory moves tensors")
    trace.save(os.path.join(args.out, "trace_v.tio"))
    plans["C"].save(os.path.join(args.out, "plan_v_cal.tio"))
    plans["R"].save(os.path.join(args.out, "plan_v.tio"))
    times = {k: [] for k in plans}
    moved = {k: [] for k in plans}
    for i in range(n):
        phase = "ECR"[i % 3]
        progress(f"simulator check: iteration {i + 1}/{n} (plan {phase})")
        rt = OffloadRuntime(job.model, job.opt, trace, plans[phase], engine)
        try:
            times[phase].append(timed_iteration(job, i % args.iterations, rt)[0])
            st = rt.stats()
            moved[phase].append(st["bytes_offloaded"] + st["bytes_prefetched"])
        finally:
            rt.close()
    engine.close()
    mean = lambda xs: sum(xs) / len(xs)
    check = simulate(trace, lt, plans["C"], plan_r, cal_capacity, args.capacity_bytes, times,
                     mean(times["R"]), gbps)
    return {"iterations_per_plan": n // 3, "capacity_cal_bytes": cal_capacity, "sim_check": check,
            "capacity_bytes": args.capacity_bytes,
            "iter_time_empty_s": mean(times["E"]), "iter_time_cal_s": mean(times["C"]),
            "iter_time_offload_s": mean(times["R"]), "times": times,
            "bytes_moved_cal": mean(moved["C"]), "bytes_moved_offload": mean(moved["R"]),
            "ssd_read_gbps": gbps[0], "ssd_write_gbps": gbps[1]}


SWEEP_SHARES = (0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1)
SWEEP_PHASES = "PECR"  # plain, empty plan, calibration plan, the share's plan


def sweep_iterations(args) -> int:
    """Iterations run S trains at most (run A trains as many; shares below
    the floor are skipped, and run S then trains fewer)."""
    return 2 + len(SWEEP_SHARES) * len(SWEEP_PHASES) * args.sweep_iterations


def plain_iteration(job, i: int) -> tuple[float, float]:
    """Iteration i without teraio: (seconds, loss)."""
    t0 = time.perf_counter()
    loss = job.step(i)
    return time.perf_counter() - t0, loss.item()


def run_s(args) -> dict:
    """The capacity sweep.  One profile (iterations 0 and 1), then for each
    share of run A's peak (--peak-bytes) from 0.9 down, skipping shares
    below the trace's working-set floor, --sweep-iterations rounds of four
    iterations: P (no teraio: the time to compare with), E and C (the empty
    and the calibration plan: this CPU's host costs, fitted as run V does)
    and R (the share's plan), each plan under a fresh OffloadRuntime, so
    every R iteration is a first iteration after the hand-over.  Taking them
    in turn lets the slow and fast spells of a shared machine fall on all
    four alike.  The model trains on throughout, so every iteration's loss
    has its twin in run A."""
    from ..core import Engine, Lifetime
    from ..torch import OffloadRuntime, Profiler
    job = Job(args)
    prof = Profiler(job.model, job.opt, name="llama-demo")
    losses = []
    for i in range(2):
        progress(f"sweep: profiling iteration {i + 1}/2")
        with prof.iteration():
            loss = job.step(i)
        losses.append(loss.item())
    del loss
    trace = prof.trace()
    lt = Lifetime(trace)
    dirs = ssd_dirs(args)
    engine = Engine(dirs, engine_space(lt))
    gbps = engine.measure_gbps(min(256 << 20, max(32 << 20, lt.peak_bytes // 4)))
    plan_for = plans_for(trace, lt, args, gbps)
    cal_capacity = int(lt.peak_bytes * args.validate_capacity_fraction)
    plans = {"E": plan_for(4 * lt.peak_bytes), "C": plan_for(cal_capacity)}
    rows = []
    for share in SWEEP_SHARES:
        capacity = int(args.peak_bytes * share)
        row = {"share": share, "capacity_bytes": capacity, "first_iteration": len(losses)}
        rows.append(row)
        if capacity < lt.floor_bytes:
            row["skipped"] = f"below the working-set floor of {lt.floor_bytes} bytes"
            continue
        plans["R"] = plan_for(capacity)
        times = {k: [] for k in SWEEP_PHASES}
        stats = []
        for j in range(args.sweep_iterations):
            for phase in SWEEP_PHASES:
                progress(f"sweep: {share:g} of the peak, round {j + 1}/{args.sweep_iterations} ({phase})")
                if phase == "P":
                    dt, loss = plain_iteration(job, len(losses))
                else:
                    rt = OffloadRuntime(job.model, job.opt, trace, plans[phase], engine)
                    dt, loss = timed_iteration(job, len(losses), rt)
                    if phase == "R":
                        stats.append(rt.stats())
                    rt.close()
                times[phase].append(dt)
                losses.append(loss)
        mean = lambda xs: sum(xs) / len(xs)
        total = lambda key: sum(st[key] for st in stats)
        plan = plans["R"]
        row.update({"planned_peak_bytes": plan.planned_peak_bytes, "fits": bool(plan.fits),
                    "migrations": plan.n_migrations,
                    "peak_resident_bytes": max(st["peak_resident_bytes"] for st in stats),
                    "over_capacity_kernels": total("over_capacity_kernels"),
                    "bytes_moved_per_iteration": (total("bytes_offloaded") + total("bytes_prefetched")
                                                  + total("bytes_fetched_urgent")) / len(stats),
                    "stalls": total("stalls"), "stall_s": total("stall_ns") / 1e9,
                    "diverged_iterations": total("diverged_iterations"),
                    "iter_time_s": mean(times["R"]), "iter_time_no_offload_s": mean(times["P"]),
                    "n_iterations": len(losses) - row["first_iteration"], "times": times})
        row["simulator"] = simulate(trace, lt, plans["C"], plan, cal_capacity, capacity, times,
                                    row["iter_time_s"], gbps)
    backend = engine.backend
    engine.close()
    return {"rows": rows, "losses": losses, "peak_bytes": lt.peak_bytes, "floor_bytes": lt.floor_bytes,
            "ssd_read_gbps": gbps[0], "ssd_write_gbps": gbps[1], "backend": backend}


def simulate(trace, lt, cal_plan, plan, cal_capacity, capacity, cal_times, measured_s, gbps) -> dict:
    """The simulator's iteration time for `plan`, with this CPU's host costs
    fitted to the calibration (teraio.core.fit_host_costs, in-process), or
    why there is none."""
    from .._lib import TeraioError
    from ..core import fit_host_costs
    mean = lambda xs: sum(xs) / len(xs)
    try:
        return fit_host_costs(trace, lt, cal_plan, plan, calibration_capacity_bytes=cal_capacity,
                              capacity_bytes=capacity, empty_s=mean(cal_times["E"]),
                              calibration_s=mean(cal_times["C"]), measured_s=measured_s,
                              ssd_read_gbps=gbps[0], ssd_write_gbps=gbps[1])
    except TeraioError as e:
        return {"error": str(e)}
