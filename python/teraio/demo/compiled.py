"""The demo's compiled mode (``python -m teraio.demo --compile``, ``make
demo-compiled``): the same model, corpus and batches, trained with
``torch.compile``, once with Inductor alone and once with teraio's compiled
path, each in its own process so that their memory is measured apart.

* run CA — ``model.compile()`` (Inductor), no teraio;
* run CB — teraio.torch.compile.CompiledSession for a capacity of
  ``--capacity-fraction`` of the compiled step's profiled peak: two profiled
  steps, a plan made with the SSD bandwidth the engine measures, the rest
  with the planned tensors moved by the calls compiled into the program.

Both return what the demo's report takes for its runs A and B (the same
fields as the eager demo), so the summary reads the same with ``"mode":
"compiled"``: the compiled trace's peak and memory curve stand where the
eager trace's do.  The optimizer step stays eager (one kernel of the trace).
"""
from __future__ import annotations

import os
import time


def compute_threads() -> int:
    """Both runs compute on one core fewer than the machine has (at least
    one): Inductor's parallel kernels wait at their barriers whenever a
    thread loses its core, and run CB's I/O needs one (the engine's
    completion thread, the kernel's workers).  On a 2-core machine with 2
    compute threads the demo's offloaded step took 3.4 s instead of 1.5."""
    import torch
    n = max(1, (os.cpu_count() or 2) - 1)
    torch.set_num_threads(n)
    return n


def _loop(job, args, step, label: str, progress, reset_peak_rss):
    losses, times = [], []
    rss_reset = False
    for i in range(args.iterations):
        progress(f"{label}: iteration {i + 1}/{args.iterations}")
        t0 = time.perf_counter()
        loss = step(i)
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
        del loss
        if i == 1:
            rss_reset = reset_peak_rss()
    return losses, times, rss_reset


def run_compiled_plain(args, job, helpers) -> dict:
    """Run CA.  `job` is the demo's Job; `helpers` gives its progress,
    loss_bits, reset_peak_rss and peak_rss_bytes."""
    threads = compute_threads()
    job.model.compile(dynamic=False)
    losses, times, rss_reset = _loop(job, args, job.step, "run CA (compiled, no offloading)",
                                     helpers.progress, helpers.reset_peak_rss)
    steady = times[3:]
    return {"mode": "compiled", "losses": losses, "loss_bits": [helpers.loss_bits(x) for x in losses],
            "times": times, "iter_time_s": sum(steady) / len(steady), "rss_peak_bytes": helpers.peak_rss_bytes(),
            "rss_peak_reset": rss_reset, "n_params": job.n_params, "corpus_bytes": job.corpus_bytes,
            "threads": threads}


def run_compiled_teraio(args, job, helpers, ssd_dirs: list[str]) -> dict:
    """Run CB, with the compiled trace's peak, floor and memory curve for
    the report's no-offloading side."""
    from ..torch.compile import CompiledSession
    threads = compute_threads()
    off = CompiledSession(job.model, job.opt, capacity=args.capacity_fraction * (1 - args.plan_headroom),
                          ssd=ssd_dirs, bandwidth_share=args.bandwidth_derate, name="llama-demo")
    curve: list[int] = []

    def step(i):
        if i == args.iterations - 1:
            off.record_curve(curve)
        with off.step():
            return job.step(i)

    losses, times, rss_reset = _loop(job, args, step, f"run CB (compiled, offloading to {', '.join(ssd_dirs)})",
                                     helpers.progress, helpers.reset_peak_rss)
    rss_peak = helpers.peak_rss_bytes()
    report = off.report()
    trace, lt, plan = off.trace, off.lifetime, off.plan
    read_gbps, write_gbps = off.ssd_gbps
    backend, reason = off.engine.backend, off.engine.backend_reason
    trace.save(os.path.join(args.out, "trace_compiled.tio"))
    plan.save(os.path.join(args.out, "plan_compiled.tio"))
    entry = report["plans"][0]
    off.close()
    steady = times[3:]
    return {"mode": "compiled", "losses": losses, "loss_bits": [helpers.loss_bits(x) for x in losses],
            "times": times, "iter_time_s": sum(steady) / len(steady), "rss_peak_bytes": rss_peak,
            "rss_peak_reset": rss_reset, "stats": report, "backend": backend, "backend_reason": reason,
            "ssd_read_gbps": read_gbps, "ssd_write_gbps": write_gbps, "capacity_bytes": plan.capacity_bytes,
            "peak_bytes": lt.peak_bytes, "floor_bytes": lt.floor_bytes, "memory_curve": lt.memory_curve(),
            "n_kernels": trace.n_kernels, "planned_curve": plan.planned_curve(), "measured_curve": curve,
            "plan": {"migrations": plan.n_migrations, "planned_peak_bytes": plan.planned_peak_bytes,
                     "fits": bool(plan.fits), "bytes_to_ssd": plan.bytes_to_ssd,
                     "plan_seconds": plan.plan_seconds, "kernel_begin_calls": entry["kernel_begin_calls"]},
            "ssd_dirs": ssd_dirs, "threads": threads}


def as_run_a(ca: dict, cb: dict) -> dict:
    """Run CA in the shape of the eager demo's run A: the compiled trace's
    peak, floor, kernels and curve come from run CB's profile (the same
    compiled code: CB profiles Inductor's own graphs)."""
    return {**ca, "peak_bytes": cb["peak_bytes"], "floor_bytes": cb["floor_bytes"],
            "memory_curve": cb["memory_curve"], "n_kernels": cb["n_kernels"]}
