#!/usr/bin/env python3
"""bench/run_profiling.py — what keeping the capacity in the profiled steps costs.

Three copies of the demo's model (teraio.demo's Llama-style decoder, same
initialisation, same batches) train in this one process, taking turns step
by step (ABC, then CBA) so that a slow spell of the shared machine falls on
all alike:

  plain        the step as written (the reference of the profiled steps' time)
  unconstrained  teraio's profiler with every tensor resident (the long form
               of teraio.torch.offload before profiling kept the capacity),
               then the plan made from that profile
  paged        teraio.torch.offload(capacity=FRACTION): the profiled steps
               under the pager, within the capacity, then its plan

Printed, as ratios measured in this run: the profiled steps' time (paged
over unconstrained, and each over plain), the planned steps' median time
(paged's plan over unconstrained's plan), the two plans' planned peaks, the profiled steps' peak resident bytes against
the capacity, and whether the losses equal plain's bit for bit.

Environment: BENCH_PROFILING_DIR (default build/bench-profiling: the SSD files).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO / "bench"))
DEMO = dict(dim=256, layers=6, heads=4, ffn_dim=704, seq_len=256, batch=6)  # python -m teraio.demo's
SMALL = dict(dim=128, layers=2, heads=4, ffn_dim=352, seq_len=128, batch=4)
PROFILED = 2


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=7, help="planned steps measured per path (>= 3)")
    ap.add_argument("--fraction", type=float, default=0.25, help="the capacity, share of the peak")
    ap.add_argument("--small", action="store_true", help="a smaller model than the demo's, for a quick look")
    a = ap.parse_args()
    if a.steps < 3 or not 0 < a.fraction <= 1:
        ap.error("--steps must be >= 3 and --fraction in (0, 1]")
    from run_compile import eager_teraio  # the long form of offload(), profiling unconstrained
    from teraio.demo.job import Job, setup_process
    import teraio.torch
    setup_process()
    import torch
    torch.set_num_threads(1)
    model = SMALL if a.small else DEMO
    args = SimpleNamespace(**model, seed=0, iterations=PROFILED + a.steps)
    ssd = os.environ.get("BENCH_PROFILING_DIR", str(REPO / "build" / "bench-profiling"))
    os.makedirs(ssd, exist_ok=True)

    plain, unc, paged = Job(args), Job(args), Job(args)
    unc_run, unc_state = eager_teraio(unc, lambda peak: int(a.fraction * peak), ssd)
    off = teraio.torch.offload(paged.model, paged.opt, capacity=a.fraction, ssd=[ssd])

    def paged_run(i):
        with off.step():
            return paged.step(i)

    paths = {"plain": plain.step, "unconstrained": unc_run, "paged": paged_run}
    times = {k: [] for k in paths}
    losses = {k: [] for k in paths}
    for i in range(PROFILED + a.steps):
        for name in (list(paths) if i % 2 == 0 else list(paths)[::-1]):
            t0 = time.perf_counter()
            loss = paths[name](i)
            times[name].append(time.perf_counter() - t0)
            losses[name].append(loss.item())
        print(f"\rbench profiling: step {i + 1}/{PROFILED + a.steps}", end="", file=sys.stderr,
              flush=True) if sys.stderr.isatty() else None
    if sys.stderr.isatty():
        print(file=sys.stderr)

    def prof(k):
        return sum(times[k][:PROFILED])

    def planned(k):
        return statistics.median(times[k][PROFILED:])

    rep = off.report()
    plan_p, plan_u = off.plan, unc_state["plan"]
    pr = rep["profiling"]
    out = {
        "profiled_paged_over_unconstrained": prof("paged") / prof("unconstrained"),
        "profiled_unconstrained_over_plain": prof("unconstrained") / prof("plain"),
        "profiled_paged_over_plain": prof("paged") / prof("plain"),
        "planned_paged_over_unconstrained": planned("paged") / planned("unconstrained"),
        "planned_peak_paged_bytes": plan_p.planned_peak_bytes,
        "planned_peak_unconstrained_bytes": plan_u.planned_peak_bytes,
        "profiling_peak_resident_bytes": pr["peak_resident_bytes"],
        "profiling_capacity_bytes": pr["capacity_bytes"],
        "profiling_evictions": pr["evictions"],
        "losses_identical": losses["paged"] == losses["plain"] and losses["unconstrained"] == losses["plain"],
    }
    print(f"bench profiling: {'a small' if a.small else 'the demo'}'s model (dim {args.dim}, {args.layers} "
          f"layers, batch {args.batch} x {args.seq_len}), capacity {a.fraction:g} of the peak, "
          f"{PROFILED} profiled steps, median of {a.steps} planned steps")
    print(f"  profiled steps: paged {prof('paged'):.3f} s, unconstrained {prof('unconstrained'):.3f} s, "
          f"plain {prof('plain'):.3f} s -> paged/unconstrained {out['profiled_paged_over_unconstrained']:.2f}x, "
          f"unconstrained/plain {out['profiled_unconstrained_over_plain']:.2f}x")
    print(f"  profiled steps' resident peak {pr['peak_resident_bytes'] / 2**20:.1f} MiB, capacity "
          f"{pr['capacity_bytes'] / 2**20:.1f} MiB, {pr['evictions']} evictions")
    print(f"  planned steps: paged's plan {planned('paged'):.4f} s, unconstrained's plan "
          f"{planned('unconstrained'):.4f} s -> {out['planned_paged_over_unconstrained']:.2f}x")
    print(f"  planned peaks: paged's plan {plan_p.planned_peak_bytes / 2**20:.1f} MiB, unconstrained's "
          f"{plan_u.planned_peak_bytes / 2**20:.1f} MiB; losses identical to plain: {out['losses_identical']}")
    off.close()
    unc_state["rt"].close()
    d = os.environ.get("TERAIO_BENCH_DIR")
    if d:
        Path(d, "profiling.json").write_text(json.dumps({
            "bench": "profiling", "title": "profiled steps within the capacity (pager) vs holding everything",
            "reference": "teraio's profiler with every tensor resident, and its plan, in the same run",
            "ratios": [{"name": "profiled steps, paged / unconstrained",
                        "value": out["profiled_paged_over_unconstrained"], "higher_is_better": False},
                       {"name": "planned steps, paged's plan / unconstrained's plan",
                        "value": out["planned_paged_over_unconstrained"], "higher_is_better": False}],
            "details": out}, indent=1))
    return 0 if out["losses_identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
