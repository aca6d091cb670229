"""`make demo`: a real model trains on real text with its tensors offloaded to SSD.

Runs of the same training job, each in its own process so that their
memory can be measured apart:

* run A — no offloading.  Iteration 1 is profiled to get the memory curve
  M[k] and its peak (the bytes that must be resident without teraio).
* run B — iterations 0 and 1 are profiled (teraio.torch.Profiler), libteraio
  analyses the trace and plans offloads (Algorithm 1) for a capacity of half
  of run A's peak, with the SSD bandwidth measured through the engine; the
  remaining iterations run under teraio.torch.OffloadRuntime, which moves
  tensors to files under build/demo/ssd (or --ssd DIR ...) and back.
* run V — the simulator check (skipped with --validate-iterations 0): the
  same job under an empty plan, a calibration plan and run B's plan in
  turn; teraio.core.fit_host_costs (tio_sim_fit_host_costs) fits this CPU's
  host costs to the first two and compares the simulated iteration time of
  the third with the measured one (docs/eval.md).

The model is a Llama-style decoder (teraio.models.llama) trained with AdamW
from a fixed random initialisation on byte-level tokens of the Python
standard library's sources (a fixed, sorted file list).  The parent process
compares the losses bit for bit, writes build/demo/summary.json and
build/demo/memory.svg, and prints a short report.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import struct
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

TTY = sys.stderr.isatty()


def progress(msg: str, final: bool = False) -> None:
    """A progress line on a terminal (rewritten in place; an empty message
    clears it); silent when piped."""
    if TTY:
        sys.stderr.write("\r\033[K" + msg + ("\n" if final and msg else ""))
        sys.stderr.flush()


def say(msg: str) -> None:
    if TTY:
        sys.stderr.write("\r\033[K")
    print(msg, flush=True)


# ---------------------------------------------------------------- the job ---

def stdlib_corpus(min_bytes: int) -> bytes:
    """Concatenated sources of the running Python's standard library, in
    sorted path order, at least `min_bytes` long (all of it if shorter)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py")
                   if "site-packages" not in p.parts and "dist-packages" not in p.parts)
    buf = bytearray()
    for p in files:
        try:
            buf += p.read_bytes()
        except OSError:
            continue
        if len(buf) >= min_bytes:
            break
    if len(buf) < 1 << 20:
        raise SystemExit(f"teraio demo: standard library at {root} has too little text ({len(buf)} bytes)")
    return bytes(buf)


def setup_process() -> None:
    """Make memory measurable and results reproducible: large allocations are
    mmap'ed (so freeing them returns memory to the OS at once, and RSS shows
    it), fixed thread count, deterministic kernels."""
    libc = ctypes.CDLL("libc.so.6")
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    libc.mallopt(M_MMAP_THRESHOLD, 64 * 1024)
    libc.mallopt(M_TRIM_THRESHOLD, 128 * 1024)
    import torch
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    torch.use_deterministic_algorithms(True)


def reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class Job:
    def __init__(self, args):
        import torch
        from .models.llama import Llama, LlamaConfig
        self.torch = torch
        self.cfg = LlamaConfig(dim=args.dim, n_layers=args.layers, n_heads=args.heads,
                               ffn_dim=args.ffn_dim, max_seq_len=args.seq_len)
        torch.manual_seed(args.seed)
        self.model = Llama(self.cfg)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=3e-4, weight_decay=0.1, foreach=False)
        need = args.iterations * args.batch * (args.seq_len + 1)
        data = torch.frombuffer(bytearray(stdlib_corpus(max(8 << 20, need))), dtype=torch.uint8).long()
        g = torch.Generator().manual_seed(args.seed + 1)
        starts = torch.randint(0, data.numel() - args.seq_len - 1, (args.iterations, args.batch), generator=g)
        offs = torch.arange(args.seq_len + 1)
        self.batches = [data[s[:, None] + offs] for s in starts]
        self.corpus_bytes = data.numel()
        self.n_params = sum(p.numel() for p in self.model.parameters())

    def step(self, i: int):
        """One iteration; returns the loss tensor (read it outside any mode)."""
        b = self.batches[i]
        self.opt.zero_grad(set_to_none=False)
        loss = self.model(b[:, :-1], b[:, 1:])
        loss.backward()
        self.opt.step()
        return loss


def loss_bits(x: float) -> str:
    return struct.pack("<d", x).hex()


def run_a(args) -> dict:
    from .core import Lifetime
    from .torch import Profiler
    job = Job(args)
    prof = Profiler(job.model, job.opt, name="llama-demo")
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
            peak = lt.peak_bytes
            del loss
            rss_reset = reset_peak_rss()
    steady = times[2:]
    return {"losses": losses, "loss_bits": [loss_bits(x) for x in losses],
            "iter_time_s": sum(steady) / len(steady), "peak_bytes": peak, "memory_curve": curve,
            "rss_peak_bytes": peak_rss_bytes(), "rss_peak_reset": rss_reset,
            "n_params": job.n_params, "corpus_bytes": job.corpus_bytes, "n_kernels": len(curve)}


def offload_setup(args, trace, lt, label: str):
    """The engine over the SSD directories, its measured bandwidths, and a
    function capacity -> plan with the demo's settings (runs B and V)."""
    from .core import Engine, Plan
    dirs = args.ssd or [os.path.join(args.out, "ssd")]
    if not args.ssd:
        os.makedirs(dirs[0], exist_ok=True)
    engine = Engine(dirs, space_bytes=2 * lt.peak_bytes + (64 << 20))
    progress(f"{label}: measuring SSD bandwidth through the engine")
    read_gbps, write_gbps = engine.measure_gbps(min(256 << 20, max(32 << 20, lt.peak_bytes // 4)))

    def plan_for(capacity: int) -> Plan:
        # The trace models an intermediate tensor as freed at its last use;
        # autograd releases saved tensors when a backward node finishes, a
        # few kernels later.  Plan slightly below the capacity to leave room.
        return Plan.build(trace, lt, int(capacity * (1 - args.plan_headroom)),
                          ssd_read_gbps=read_gbps * args.bandwidth_derate,
                          ssd_write_gbps=write_gbps * args.bandwidth_derate, host_cap_bytes=0)

    return engine, dirs, read_gbps, write_gbps, plan_for


def run_b(args) -> dict:
    from .core import Lifetime
    from .torch import OffloadRuntime, Profiler
    job = Job(args)
    prof = Profiler(job.model, job.opt, name="llama-demo")
    losses, times = [], []
    for i in range(2):
        progress(f"run B: profiling iteration {i + 1}/2")
        t0 = time.perf_counter()
        with prof.iteration():
            loss = job.step(i)
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    del loss
    trace = prof.save(os.path.join(args.out, "trace.tio"))
    lt = Lifetime(trace)
    engine, dirs, read_gbps, write_gbps, plan_for = offload_setup(args, trace, lt, "run B")
    capacity = args.capacity_bytes
    progress("run B: planning")
    plan = plan_for(capacity)
    plan.save(os.path.join(args.out, "plan.tio"))
    rt = OffloadRuntime(job.model, job.opt, trace, plan, engine)
    rss_reset = reset_peak_rss()
    curve = []
    for i in range(2, args.iterations):
        progress(f"run B (offloading to {', '.join(dirs)}): iteration {i + 1}/{args.iterations}")
        if i == args.iterations - 1:
            rt.record_curve(curve)
        t0 = time.perf_counter()
        with rt.iteration():
            loss = job.step(i)
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
        del loss
    rss_peak = peak_rss_bytes()
    stats = rt.stats()
    rt.close()
    steady = times[3:]
    return {"losses": losses, "loss_bits": [loss_bits(x) for x in losses],
            "iter_time_s": sum(steady) / len(steady), "rss_peak_bytes": rss_peak, "rss_peak_reset": rss_reset,
            "stats": stats, "backend": engine.backend, "backend_reason": engine.backend_reason,
            "ssd_read_gbps": read_gbps, "ssd_write_gbps": write_gbps, "capacity_bytes": capacity,
            "peak_bytes": lt.peak_bytes, "planned_curve": plan.planned_curve(), "measured_curve": curve,
            "plan": {"migrations": plan.n_migrations, "planned_peak_bytes": plan.planned_peak_bytes,
                     "fits": bool(plan.fits), "bytes_to_ssd": plan.bytes_to_ssd,
                     "plan_seconds": plan.plan_seconds}, "ssd_dirs": dirs}


def run_v(args) -> dict:
    """The simulator check: the same job, profiled, then
    iterations under three plans in turn, each under a fresh OffloadRuntime:
    E (empty plan: nothing moves), C (a calibration plan for a capacity of
    --validate-capacity-fraction of the peak) and R (the plan of run B's
    settings).  Taking the three in turn, iteration by iteration, lets the
    slow and fast spells of a shared machine fall on all three alike.  E and
    C calibrate the host costs of this CPU (dispatch per kernel, host work
    per migrated byte); R's time is what the simulator must predict
    (fit_host_costs, in-process)."""
    import copy
    from .core import Lifetime
    from .torch import OffloadRuntime, Profiler
    n = args.validate_iterations
    vargs = copy.copy(args)
    vargs.iterations = 2 + n
    job = Job(vargs)
    prof = Profiler(job.model, job.opt, name="llama-demo")
    for i in range(2):
        progress(f"simulator check: profiling iteration {i + 1}/2")
        with prof.iteration():
            loss = job.step(i)
        del loss
    trace = prof.save(os.path.join(args.out, "trace_v.tio"))
    lt = Lifetime(trace)
    engine, _, read_gbps, write_gbps, plan_for = offload_setup(args, trace, lt, "simulator check")
    cal_capacity = int(lt.peak_bytes * args.validate_capacity_fraction)
    plans = {"E": plan_for(4 * lt.peak_bytes), "C": plan_for(cal_capacity), "R": plan_for(args.capacity_bytes)}
    if plans["E"].n_migrations:
        raise RuntimeError("simulator check: the plan for unlimited memory moves tensors")
    plans["C"].save(os.path.join(args.out, "plan_v_cal.tio"))
    plans["R"].save(os.path.join(args.out, "plan_v.tio"))
    times = {k: [] for k in plans}
    moved = {k: [] for k in plans}
    for i in range(n):
        phase = "ECR"[i % 3]
        progress(f"simulator check: iteration {i + 1}/{n} (plan {phase})")
        rt = OffloadRuntime(job.model, job.opt, trace, plans[phase], engine)
        try:
            t0 = time.perf_counter()
            with rt.iteration():
                loss = job.step(2 + i)
            times[phase].append(time.perf_counter() - t0)
            del loss
            st = rt.stats()
            moved[phase].append(st["bytes_offloaded"] + st["bytes_prefetched"])
        finally:
            rt.close()
    mean = lambda xs: sum(xs) / len(xs)
    from ._lib import TeraioError
    from .core import fit_host_costs
    try:
        check = fit_host_costs(trace, lt, plans["C"], plans["R"], calibration_capacity_bytes=cal_capacity,
                               capacity_bytes=args.capacity_bytes, empty_s=mean(times["E"]),
                               calibration_s=mean(times["C"]), measured_s=mean(times["R"]),
                               ssd_read_gbps=read_gbps, ssd_write_gbps=write_gbps)
    except TeraioError as e:
        check = {"error": str(e)}
    return {"iterations_per_plan": n // 3, "capacity_cal_bytes": cal_capacity, "sim_check": check,
            "capacity_bytes": args.capacity_bytes,
            "iter_time_empty_s": mean(times["E"]), "iter_time_cal_s": mean(times["C"]),
            "iter_time_offload_s": mean(times["R"]), "times": times,
            "bytes_moved_cal": mean(moved["C"]), "bytes_moved_offload": mean(moved["R"]),
            "ssd_read_gbps": read_gbps, "ssd_write_gbps": write_gbps}


# ----------------------------------------------------------------- parent ---

def child(role: str, args, extra: list[str]) -> dict:
    """Run one side of the comparison in its own process, with the same
    settings as this one."""
    out = os.path.join(args.out, f"run_{role.lower()}.json")
    cmd = [sys.executable, "-m", "teraio.demo", *args.argv, "--out", args.out, "--child", role, *extra]
    if os.path.exists(out):
        os.unlink(out)
    rc = subprocess.call(cmd)
    if rc != 0 or not os.path.exists(out):
        raise SystemExit(rc or 1)
    with open(out) as f:
        return json.load(f)


def mib(x: float) -> str:
    return f"{x / 2**20:.1f} MiB"


def parent(args) -> int:
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as e:
        sys.stderr.write(f"teraio demo: output directory '{args.out}': {e.strerror}\n")
        return 1
    for d in args.ssd or []:
        if not os.path.isdir(d):
            sys.stderr.write(f"teraio demo: ssd directory '{d}' does not exist or is not a directory\n")
            return 1
        if not os.access(d, os.W_OK | os.X_OK):
            sys.stderr.write(f"teraio demo: ssd directory '{d}' is not writable\n")
            return 1
        # Create a file there now, so that a directory that takes none
        # (/proc, a read-only mount seen by root) fails before run A.
        try:
            tempfile.TemporaryFile(dir=d).close()
        except OSError as e:
            sys.stderr.write(f"teraio demo: ssd directory '{d}' cannot hold files: {e.strerror}\n")
            return 1
    t0 = time.time()
    a = child("A", args, [])
    capacity = int(a["peak_bytes"] * args.capacity_fraction)
    b = child("B", args, ["--capacity-bytes", str(capacity)])
    v = child("V", args, ["--capacity-bytes", str(capacity)]) if args.validate_iterations else None
    progress("", final=False)
    n = min(len(a["losses"]), len(b["losses"]))
    identical = a["loss_bits"][:n] == b["loss_bits"][:n] and n == args.iterations
    s = b["stats"]
    summary = {
        "model": "llama-demo", "n_params": a["n_params"], "corpus_bytes": a["corpus_bytes"],
        "n_kernels": a["n_kernels"],
        "peak_bytes_no_offload": a["peak_bytes"],
        "capacity_bytes": capacity,
        "planned_peak_bytes": b["plan"]["planned_peak_bytes"],
        "plan_fits": b["plan"]["fits"],
        "peak_resident_bytes": s["peak_resident_bytes"],
        "rss_peak_no_offload_bytes": a["rss_peak_bytes"],
        "rss_peak_offload_bytes": b["rss_peak_bytes"],
        "rss_peak_window": "offloaded iterations (peak reset after profiling)"
        if a["rss_peak_reset"] and b["rss_peak_reset"] else "whole process",
        "iterations_compared": n,
        "losses_identical": identical,
        "losses_no_offload": a["losses"], "losses_offload": b["losses"],
        "iter_time_no_offload_s": a["iter_time_s"],
        "iter_time_offload_s": b["iter_time_s"],
        "bytes_offloaded": s["bytes_offloaded"],
        "bytes_prefetched": s["bytes_prefetched"],
        "bytes_fetched_urgent": s["bytes_fetched_urgent"],
        "stalls": s["stalls"], "stall_time_s": s["stall_ns"] / 1e9,
        "deadline_wait_s": s["wait_ns"] / 1e9,
        "offloads_refused": s["offloads_refused"], "diverged": s["diverged"],
        "backend": b["backend"], "backend_reason": b["backend_reason"],
        "ssd_dirs": b["ssd_dirs"],
        "ssd_read_gbps_measured": b["ssd_read_gbps"], "ssd_write_gbps_measured": b["ssd_write_gbps"],
        "plan_migrations": b["plan"]["migrations"], "plan_seconds": b["plan"]["plan_seconds"],
        "wall_time_s": time.time() - t0,
    }
    if v:
        summary.update({f"validation_{k}": x for k, x in v.items() if k != "times"})
        summary["validation_times_s"] = v["times"]
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    from .svg import line_chart
    to_mib = lambda ys: [y / 2**20 for y in ys]
    line_chart(os.path.join(args.out, "memory.svg"),
               "llama-demo: bytes resident per kernel over one iteration", "kernel index", "MiB",
               [{"label": "no offloading (M)", "y": to_mib(a["memory_curve"])},
                {"label": "as planned (M')", "y": to_mib(b["planned_curve"])},
                {"label": "as measured (offloading)", "y": to_mib(b["measured_curve"])},
                {"label": "capacity", "y": [capacity / 2**20] * len(a["memory_curve"]), "dash": True}])
    say(f"teraio demo: {a['n_params'] / 1e6:.1f}M-parameter Llama-style model, {n} iterations on "
        f"{a['corpus_bytes'] / 1e6:.1f} MB of Python stdlib source")
    say(f"  peak memory without offloading  {mib(a['peak_bytes'])}")
    say(f"  {'capacity (x' + format(args.capacity_fraction, 'g') + ')':<32}{mib(capacity)}")
    say(f"  peak resident with offloading   {mib(s['peak_resident_bytes'])}"
        f" (planned {mib(b['plan']['planned_peak_bytes'])})")
    say(f"  process peak RSS                {mib(a['rss_peak_bytes'])} -> {mib(b['rss_peak_bytes'])}")
    say(f"  moved per run                   {mib(s['bytes_offloaded'])} offloaded, "
        f"{mib(s['bytes_prefetched'])} prefetched, {mib(s['bytes_fetched_urgent'])} fetched on demand")
    say(f"  stalls                          {s['stalls']} ({s['stall_ns'] / 1e9:.3f} s)")
    say(f"  iteration time                  {a['iter_time_s']:.3f} s -> {b['iter_time_s']:.3f} s "
        f"(backend {b['backend']}, SSD {b['ssd_write_gbps']:.2f} GB/s write, {b['ssd_read_gbps']:.2f} GB/s read)")
    say(f"  losses identical                {identical} over {n} iterations "
        f"(first {a['losses'][0]:.4f}, last {a['losses'][-1]:.4f})")
    check = v["sim_check"] if v else None
    if check and "error" in check:
        say(f"  simulator check                 {check['error']}")
    elif check:
        say(f"  simulator check                 simulated {check['simulated_s']:.3f} s, measured "
            f"{check['measured_s']:.3f} s per offloaded iteration ({100 * check['sim_vs_measured_error']:.1f}% "
            f"off; host costs fitted in-process)")
    say(f"  wrote {os.path.join(args.out, 'summary.json')} and {os.path.join(args.out, 'memory.svg')}")
    return 0 if identical else 1


class _Parser(argparse.ArgumentParser):
    """Usage mistakes as one line, like the other teraio commands."""

    def error(self, message):
        self.exit(2, f"teraio demo: {message} (try --help)\n")


def check_args(args) -> str | None:
    """What is wrong with the options, or None."""
    if args.iterations < 4:
        return "--iterations must be >= 4"
    if args.validate_iterations < 0 or args.validate_iterations % 3:
        return "--validate-iterations must be 0 or a positive multiple of 3"
    for name in ("dim", "layers", "heads", "ffn_dim", "seq_len", "batch"):
        if getattr(args, name) < 1:
            return f"--{name.replace('_', '-')} must be >= 1"
    if args.dim % args.heads or (args.dim // args.heads) % 2:
        return (f"--dim ({args.dim}) must be --heads ({args.heads}) times an even head size "
                f"(rotary embeddings rotate pairs)")
    shares = (("capacity_fraction", 0, 1, False), ("bandwidth_derate", 0, 1, False),
              ("validate_capacity_fraction", 0, 1, False),
              ("plan_headroom", 0, 1, True))
    for name, lo, hi, lo_ok in shares:
        v = getattr(args, name)
        if not (math.isfinite(v) and (v >= lo if lo_ok else v > lo) and (v <= hi if not lo_ok else v < hi)):
            interval = f"[{lo}, {hi})" if lo_ok else f"({lo}, {hi}]"
            return f"--{name.replace('_', '-')} must be in {interval}, got {v:g}"
    return None


def main(argv=None) -> int:
    ap = _Parser(prog="python -m teraio.demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="build/demo", help="output directory (default build/demo)")
    ap.add_argument("--ssd", action="append", metavar="DIR", help="SSD directory (repeat for striping)")
    ap.add_argument("--iterations", type=int, default=14, help="training iterations per run (>= 4)")
    ap.add_argument("--capacity-fraction", type=float, default=0.5, help="capacity as a share of run A's peak")
    ap.add_argument("--bandwidth-derate", type=float, default=0.7,
                    help="share of the measured SSD bandwidth the planner may book")
    ap.add_argument("--plan-headroom", type=float, default=0.03,
                    help="plan for this share below the capacity (default 0.03)")
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--ffn-dim", type=int, default=704)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--validate-iterations", type=int, default=18,
                    help="iterations of the simulator check, a third per plan (0: skip; default 18)")
    ap.add_argument("--validate-capacity-fraction", type=float, default=0.75,
                    help="capacity of the simulator check's calibration plan, as a share of the peak")
    ap.add_argument("--child", choices=["A", "B", "V"], help=argparse.SUPPRESS)
    ap.add_argument("--capacity-bytes", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    problem = check_args(args)
    if problem:
        ap.error(problem)
    if not args.child:
        return parent(args)
    setup_process()
    from ._lib import TeraioError
    try:
        result = {"A": run_a, "B": run_b, "V": run_v}[args.child](args)
    except (TeraioError, OSError, ValueError, RuntimeError, MemoryError) as e:
        progress("")
        sys.stderr.write(f"teraio demo: {e}\n")
        return 1
    with open(os.path.join(args.out, f"run_{args.child.lower()}.json"), "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
