"""The demo's command line: options, then the runs in child processes and
the report (see teraio/demo/__init__.py)."""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time

from .job import progress, setup_process
from .runs import run_a, run_b, run_s, sweep_iterations


# ----------------------------------------------------------------- parent ---

def child(role: str, args, extra: list[str], cgroup=None, may_be_killed: bool = False) -> dict | None:
    """Run one side of the comparison in its own process (a fresh interpreter,
    multiprocessing's spawn, so each run's memory is measured apart), with the
    same settings as this one; in `cgroup` (a teraio.demo.limit.MemoryCgroup)
    if given.  A run the kernel killed (SIGKILL: over the cgroup's limit)
    gives None where `may_be_killed`."""
    import multiprocessing
    import signal
    out = os.path.join(args.out, f"run_{role.lower()}.json")
    if os.path.exists(out):
        os.unlink(out)
    where = ["--cgroup", str(cgroup.path)] if cgroup is not None else []
    p = multiprocessing.get_context("spawn").Process(
        target=_child_main, args=([*args.argv, "--out", args.out, "--child", role, *where, *extra],))
    p.start()
    p.join()
    rc = p.exitcode
    if rc == -signal.SIGKILL and may_be_killed:
        return None
    if rc is not None and rc < 0:
        sys.stderr.write(f"teraio demo: run {role} died of {signal.Signals(-rc).name}\n")
    if rc != 0 or not os.path.exists(out):
        raise SystemExit(1 if not rc or rc < 0 else rc)
    with open(out) as f:
        return json.load(f)


# The overhead above the capacity that a run under teraio may need in a
# memory limit (docs/runtime.md, "The profiled steps keep the capacity").
LIMIT_OVERHEAD_BYTES = 32 << 20

# The capacity of the run inside the memory limit, as a share of run A's
# peak (or --capacity-fraction where that is lower).  At half the peak
# the limit that run B needs lay within 10-40 MiB of the one run A lives
# through by giving up library pages (measured 2026-12-04: A killed at 520
# MiB, lived at 552; B at 0.5 needed 542), so A's fate was a coin toss; at
# a quarter B needs about 100 MiB less (peak 436 MiB in that cgroup).
LIMIT_CAPACITY_SHARE = 0.25


def limited_runs(args, a: dict, capacity: int, cg) -> dict:
    """Runs A and B again inside a memory limit that run A does not fit in,
    run B (as run L) at `capacity` (LIMIT_CAPACITY_SHARE of the peak): the
    limit is first halfway between run A's peak (the cgroup's count) and
    what run L needs (run A's memory before its first step, plus the
    capacity, plus the stated overhead).  The cgroup's count includes page cache and the pages
    of mapped libraries, which the kernel reclaims at the limit before it
    kills: where run A lives through the halfway limit that way, the limit is
    lowered to what run B needs and run A runs again.  Run A is expected to
    be killed there, run B (as run L, without the simulator check) to train
    with run A's losses."""
    peak_a = cg.peak_bytes()
    need_b = a["cgroup_before_bytes"] + capacity + LIMIT_OVERHEAD_BYTES
    limit = (peak_a + need_b) // 2
    out = {"cgroup_version": cg.version, "limit_bytes": limit, "peak_a_bytes": peak_a, "need_b_bytes": need_b,
           "capacity_bytes": capacity, "capacity_share": capacity / a["peak_bytes"]}
    if peak_a - need_b < 2 * LIMIT_OVERHEAD_BYTES:
        # At the limit the kernel first reclaims page cache, so run A needs a margin to be killed.
        out["skipped"] = (f"run A's peak ({peak_a / 2**20:.1f} MiB in the cgroup) is less than "
                          f"{2 * LIMIT_OVERHEAD_BYTES >> 20} MiB above what run B needs ({need_b / 2**20:.1f} MiB): "
                          f"the model is too small for a memory limit to tell them apart")
        return out
    for attempt, lim in enumerate((limit, need_b)):
        cg.set_limit(lim)
        cg.reset_peak()
        killed = child("AL", args, [], cgroup=cg, may_be_killed=True)
        out["limit_bytes"] = lim
        out["a_killed"] = killed is None
        if killed is None:
            break
        if attempt == 0:
            out["a_survived_halfway_bytes"] = lim  # it gave up cache and library pages instead of dying
    out["peak_a_limited_bytes"] = cg.peak_bytes()
    cg.reset_peak()
    lb = child("L", args, ["--capacity-bytes", str(capacity), "--validate-iterations", "0"], cgroup=cg,
               may_be_killed=True)
    out["b_trained"] = lb is not None
    out["peak_b_limited_bytes"] = cg.peak_bytes()
    if lb is not None:
        out["b_losses_identical"] = lb["loss_bits"] == a["loss_bits"]
        out["b_peak_resident_bytes"] = lb["stats"]["peak_resident_bytes"]
        out["b_over_capacity_kernels"] = lb["stats"]["over_capacity_kernels"]
    return out


def _child_main(argv: list[str]) -> None:
    sys.exit(main(argv))


def check_dirs(args) -> str | None:
    """What is wrong with the SSD and output directories, or None.  The
    output directory is made last, so a refused SSD directory leaves none."""
    for d in args.ssd or []:
        if not os.path.isdir(d):
            return f"ssd directory '{d}' does not exist or is not a directory"
        if not os.access(d, os.W_OK | os.X_OK):
            return f"ssd directory '{d}' is not writable"
        # Create a file there now, so that a directory that takes none
        # (/proc, a read-only mount seen by root) fails before run A.
        try:
            tempfile.TemporaryFile(dir=d).close()
        except OSError as e:
            return f"ssd directory '{d}' cannot hold files: {e.strerror}"
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as e:
        return f"output directory '{args.out}': {e.strerror}"
    return None


def parent(args) -> int:
    from .report import report_demo, report_sweep
    problem = check_dirs(args)
    if problem:
        sys.stderr.write(f"teraio demo: {problem}\n")
        return 1
    t0 = time.time()
    if args.compile:
        from .compiled import as_run_a
        ca = child("CA", args, [])
        cb = child("CB", args, [])
        progress("", final=False)
        return report_demo(args, as_run_a(ca, cb), cb, t0)
    if args.sweep:
        a = child("A", args, ["--iterations", str(sweep_iterations(args))])
        s = child("S", args, ["--iterations", str(sweep_iterations(args)), "--peak-bytes", str(a["peak_bytes"])])
        progress("", final=False)
        return report_sweep(args, a, s, t0)
    from .limit import MemoryCgroup
    try:
        cg = MemoryCgroup("teraio-demo")
        cg.set_limit(None)
        no_limit = None
    except OSError as e:
        cg, no_limit = None, f"no memory limit was made ({e}; it needs root or a delegated cgroup)"
    try:
        a = child("A", args, [], cgroup=cg)
        capacity = int(a["peak_bytes"] * args.capacity_fraction)
        limit_capacity = int(a["peak_bytes"] * min(args.capacity_fraction, LIMIT_CAPACITY_SHARE))
        limited = limited_runs(args, a, limit_capacity, cg) if cg is not None else {"skipped": no_limit}
        b = child("B", args, ["--capacity-bytes", str(capacity)])
    finally:
        if cg is not None:
            cg.remove()
    progress("", final=False)
    return report_demo(args, a, b, t0, limited)


def run_ca(args) -> dict:
    """The compiled mode's run without teraio (teraio.demo.compiled)."""
    from .compiled import run_compiled_plain
    from . import job
    return run_compiled_plain(args, job.Job(args), job)


def run_cb(args) -> dict:
    """The compiled mode's run with teraio's compiled path."""
    from .compiled import run_compiled_teraio
    from . import job
    from .runs import ssd_dirs
    return run_compiled_teraio(args, job.Job(args), job, ssd_dirs(args))


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
    if args.sweep_iterations < 1:
        return "--sweep-iterations must be >= 1"
    if args.compile and args.sweep:
        return "--compile and --sweep cannot be combined"
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
    from . import __doc__ as doc
    ap = _Parser(prog="python -m teraio.demo", description=doc.split("\n\n")[0])
    ap.add_argument("--out", default="build/demo", help="output directory (default build/demo)")
    ap.add_argument("--ssd", action="append", metavar="DIR", help="SSD directory (repeat for striping)")
    ap.add_argument("--iterations", type=int, default=14, help="training iterations per run (>= 4)")
    ap.add_argument("--capacity-fraction", type=float, default=0.5, help="capacity as a share of run A's peak")
    ap.add_argument("--bandwidth-derate", type=float, default=0.7,
                    help="share of the measured SSD bandwidth the planner may book")
    ap.add_argument("--plan-headroom", type=float, default=0.0,
                    help="plan for this share below the capacity: room for memory that operators "
                         "allocate inside themselves, which no trace sees (default 0)")
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
    ap.add_argument("--sweep", action="store_true",
                    help="instead of run B: the capacity sweep, 0.9 .. 0.1 of the peak (make demo-sweep)")
    ap.add_argument("--sweep-iterations", type=int, default=2,
                    help="rounds per capacity of the sweep, four iterations each (default 2)")
    ap.add_argument("--compile", action="store_true",
                    help="train with torch.compile: Inductor alone, then with teraio's compiled path, at "
                         "--capacity-fraction of the compiled step's peak (make demo-compiled)")
    ap.add_argument("--child", choices=["A", "AL", "B", "L", "S", "CA", "CB"], help=argparse.SUPPRESS)
    ap.add_argument("--cgroup", help=argparse.SUPPRESS)
    ap.add_argument("--capacity-bytes", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--peak-bytes", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    problem = check_args(args)
    if problem:
        ap.error(problem)
    if not args.child:
        return parent(args)
    if args.cgroup:  # before the job allocates anything: its memory is the cgroup's
        with open(os.path.join(args.cgroup, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    setup_process()
    from .._lib import TeraioError
    try:
        result = {"A": run_a, "AL": run_a, "B": run_b, "L": run_b, "S": run_s, "CA": run_ca,
                  "CB": run_cb}[args.child](args)
    except (TeraioError, OSError, ValueError, RuntimeError, MemoryError) as e:
        progress("")
        sys.stderr.write(f"teraio demo: {e}\n")
        return 1
    with open(os.path.join(args.out, f"run_{args.child.lower()}.json"), "w") as f:
        json.dump(result, f)
    return 0
