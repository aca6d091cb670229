#!/usr/bin/env python3
"""bench/run_compile.py — what teraio costs on the eager and the compiled path.

Four paths train the demo's model (teraio.demo's Llama-style decoder, same
initialisation, same batches), each in its own copy in this one process:

  eager              the step as written (reference of the next)
  eager + teraio     teraio.torch.OffloadRuntime, the dispatch mode: every
                     operator reported to the runtime
  compiled           model.compile() (Inductor; reference of the next)
  compiled + teraio  teraio.torch.compile.CompiledSession: Inductor with
                     teraio's calls at the planned nodes only

First at a capacity of four times each path's profiled peak, where the plan
moves nothing, so the difference to the reference is what the integration
itself costs; then at --fraction (default 0.5) of the peak, where tensors
move to the SSD directory.  The paths take turns step by step (one step of
each, then the next round), so a slow spell of the shared machine falls on
all alike; after the profiling and compiling steps, --steps (default 9)
measured steps each.  Printed: each path's median step time and its
overhead over its own reference (the median over rounds of the ratio of the
two paths' times in the same round), and whether the losses of a
teraio path are those of its reference, bit for bit.

Environment: BENCH_COMPILE_DIR (default build/bench-compile: the SSD files).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "python"))
DEMO = dict(dim=256, layers=6, heads=4, ffn_dim=704, seq_len=256, batch=6)  # python -m teraio.demo's
SMALL = dict(dim=128, layers=2, heads=4, ffn_dim=352, seq_len=128, batch=4)


class Path_:
    """One path: a copy of the job and how it runs a step."""

    def __init__(self, label, job, run, ref=None):
        self.label, self.job, self.run, self.ref = label, job, run, ref
        self.times, self.losses = [], []
        self.session = None

    def step(self, i: int, measured: bool) -> None:
        t0 = time.perf_counter()
        loss = self.run(i)
        dt = time.perf_counter() - t0
        self.losses.append(loss.item())
        if measured:
            self.times.append(dt)


def eager(job):
    return job.step


def eager_teraio(job, capacity, ssd):
    """The dispatch-mode path: profile two steps, plan, run (the long form
    of teraio.torch.offload)."""
    from teraio.core import Engine, Lifetime, Plan
    from teraio.torch import OffloadRuntime, Profiler
    state = {"prof": Profiler(job.model, job.opt), "rt": None, "n": 0}

    def run(i):
        if state["rt"] is None:
            with state["prof"].iteration():
                loss = job.step(i)
            state["n"] += 1
            if state["n"] == 2:
                trace = state["prof"].trace()
                lt = Lifetime(trace)
                cap = capacity(lt.peak_bytes)
                engine = Engine([ssd], 2 * lt.peak_bytes + (64 << 20))
                rg, wg = engine.measure_gbps(min(256 << 20, max(16 << 20, lt.peak_bytes // 4)))
                plan = Plan.build(trace, lt, cap, ssd_read_gbps=0.7 * rg, ssd_write_gbps=0.7 * wg)
                state.update(rt=OffloadRuntime(job.model, job.opt, trace, plan, engine), engine=engine,
                             plan=plan, peak=lt.peak_bytes, capacity=cap)
            return loss
        with state["rt"].iteration():
            return job.step(i)
    return run, state


def compiled(job):
    job.model.compile(dynamic=False)
    return job.step


def compiled_teraio(job, capacity, ssd):
    from teraio.torch.compile import CompiledSession
    off = CompiledSession(job.model, job.opt, capacity=capacity, ssd=[ssd])

    def run(i):
        with off.step():
            return job.step(i)
    return run, off


def overhead(p: Path_) -> str:
    """The median over rounds of the step time over the reference's step
    time in the same round: a slow spell of the machine cancels out."""
    if p.ref is None:
        return "(reference)"
    r = statistics.median(a / b for a, b in zip(p.times, p.ref.times))
    return f"{100 * (r - 1):+6.1f}% over {p.ref.label}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=9, help="measured steps per path (>= 5)")
    ap.add_argument("--fraction", type=float, default=0.5, help="capacity of the second part, share of the peak")
    ap.add_argument("--small", action="store_true", help="a smaller model than the demo's, for a quick look")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (default 1: on a shared machine spinning OpenMP threads "
                         "make step times unstable)")
    ap.add_argument("--only-above", action="store_true", help="skip the second part")
    a = ap.parse_args()
    if a.steps < 5:
        ap.error("--steps must be >= 5")
    from teraio.demo.job import Job, setup_process
    setup_process()
    import torch
    torch.set_num_threads(a.threads)
    warm = 3  # two profiled steps and the first planned one (compiling the calls)
    model = SMALL if a.small else DEMO
    args = SimpleNamespace(**model, seed=0, iterations=warm + a.steps)
    ssd = os.environ.get("BENCH_COMPILE_DIR", str(REPO / "build" / "bench-compile"))
    os.makedirs(ssd, exist_ok=True)
    parts = [("capacity 4x the peak: nothing moves", lambda peak: 4 * peak, 4.0)]
    if not a.only_above:
        parts.append((f"capacity {a.fraction:g} of the peak", lambda peak: int(a.fraction * peak), a.fraction))
    print(f"bench compile: {'a small' if a.small else 'the demo'}'s model (dim {args.dim}, {args.layers} layers, "
          f"batch {args.batch} x {args.seq_len}), "
          f"median of {a.steps} interleaved steps per path, {a.threads} thread(s), "
          f"{os.cpu_count()} CPUs")
    for title, cap_bytes, share in parts:
        ea = Path_("eager", Job(args), None)
        ea.run = eager(ea.job)
        et = Path_("eager + teraio (dispatch mode)", Job(args), None, ref=ea)
        et.run, et.session = eager_teraio(et.job, cap_bytes, ssd)
        ca = Path_("compiled", Job(args), None)
        ca.run = compiled(ca.job)
        ct = Path_("compiled + teraio", Job(args), None, ref=ca)
        ct.run, ct.session = compiled_teraio(ct.job, share if share <= 1 else 4 * 2**40, ssd)
        paths = [ea, et, ca, ct]
        for i in range(warm + a.steps):
            for p in (paths if i % 2 == 0 else paths[::-1]):  # ABBA: no path always runs first
                p.step(i, i >= warm)
        print(f"\n{title}")
        print(f"  {'path':<32}{'step (median)':>14}   overhead (median of per-round ratios)")
        for p in paths:
            print(f"  {p.label:<32}{statistics.median(p.times):>12.4f} s   {overhead(p)}")
        e_state, off = et.session, ct.session
        rep = off.report()
        est = e_state["rt"].stats()
        print(f"  eager + teraio:    peak {e_state['peak'] / 2**20:.1f} MiB, capacity "
              f"{e_state['capacity'] / 2**20:.1f} MiB, {e_state['plan'].n_migrations} migrations, "
              f"{est['wait_ns'] / 1e9 / max(1, est['iterations']):.3f} s waiting at deadlines per step, "
              f"{est['stalls']} stalls, losses identical to eager: {et.losses == ea.losses}")
        plan = rep["plans"][0]
        cap = plan['capacity_bytes']  # 4 TiB in the first part: the peak is not known ahead
        cap = f"{cap / 2**40:.0f} TiB" if cap >= 2**40 else f"{cap / 2**20:.1f} MiB"
        print(f"  compiled + teraio: peak {plan['peak_bytes'] / 2**20:.1f} MiB, capacity "
              f"{cap}, {plan['migrations']} migrations, "
              f"{plan['kernel_begin_calls']} kernel_begin calls, resident peak "
              f"{rep['peak_resident_bytes'] / 2**20:.1f} MiB, "
              f"{rep.get('wait_ns', 0) / 1e9 / max(1, rep['planned_iterations']):.3f} s waiting at deadlines "
              f"per step, {rep.get('stalls', 0)} stalls, losses identical to compiled: {ct.losses == ca.losses}")
        e_state["rt"].close()
        off.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
