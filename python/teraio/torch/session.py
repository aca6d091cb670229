"""teraio.torch.offload: offloading in one call.

    off = teraio.torch.offload(model, optimizer, capacity=0.5, ssd=["/mnt/nvme0/x"])
    for batch in data:
        with off.step():
            loss = model(batch); loss.backward(); optimizer.step()
    print(off.report())
    off.close()

What it does, step by step:

1. The first ``profile_iterations`` steps (default 2) run under the
   :class:`~teraio.torch.Profiler`, with everything resident.  The last one is
   the trace (the first also creates the optimizer's state).
2. The engine is created over the ``ssd`` directories, its read and write
   bandwidth measured, and the planner (libteraio's default) plans for
   ``capacity``: bytes, or a share of the profiled peak.  The plan is kept
   under the fingerprint of the step's operator sequence (kernel names,
   output sizes and shapes, teraio.torch.profiler.sequence_fingerprint).
3. Later steps run under an :class:`~teraio.torch.OffloadRuntime` for the plan
   of the sequence the step is expected to run: the one that followed the
   previous step's sequence last time (so training steps alternating with
   eval steps, or two sequence lengths in turn, each run their own plan).
4. A step whose sequence is not the expected one diverges: the runtime
   fetches what it needs on demand for the rest of the step, so results stay
   the same.  Once a new sequence has been seen ``reprofile_after`` times
   (default 2) and is expected next, that step is profiled (the runtime is
   closed first: everything comes back) and planned; up to ``max_plans``
   plans (default 4) are kept, the least recently used dropped first, and
   switching between kept plans needs no profiling.

Safe by default: between steps, operators and ``state_dict()`` see true
values (OffloadRuntime's safe mode); ``close()`` brings everything back.

Limits: a profiled step holds all of its memory (profiling moves nothing);
switching plans brings the tensors of the old plan back before the new plan
places them again.  The object is driven from the thread that created it.
"""
from __future__ import annotations

import collections
import logging
import os
import threading

import torch

from .. import _lib as L
from ..core import Engine, Lifetime, Plan
from .offload import OffloadRuntime
from .profiler import Profiler

log = logging.getLogger("teraio")

# Counters of tio_runtime_stats that add up over the runtimes of a session;
# the others are maxima.
_SUMS = ("bytes_offloaded", "bytes_offloaded_ssd", "bytes_offloaded_host", "bytes_prefetched",
         "bytes_fetched_urgent", "n_offloads", "n_prefetches", "stalls", "stall_ns", "wait_ns",
         "offloads_refused", "iterations", "diverged_iterations", "fetches_outside",
         "bytes_fetched_outside", "over_capacity_kernels", "frees_waited")
_MAXES = ("peak_resident_bytes", "over_capacity_bytes_max")


def _env_rank(name: str) -> int:
    """torchrun's RANK or LOCAL_RANK (0 when unset), a non-negative integer."""
    v = os.environ.get(name, "0")
    try:
        r = int(v)
    except ValueError:
        r = -1
    if r < 0:
        raise ValueError(f"environment variable {name}={v!r} is not a rank (an integer >= 0)")
    return r


def ssd_dirs(ssd) -> list[str]:
    """This process's SSD directories from ``ssd``: a list of directories, one directory,
    or one list per local rank (torchrun's LOCAL_RANK picks one); ``{rank}`` and
    ``{local_rank}`` in a directory become this process's RANK and LOCAL_RANK (0 without
    torchrun), so ``"/mnt/nvme{local_rank}/teraio"`` gives each GPU of a node its own SSD."""
    rank, local_rank = _env_rank("RANK"), _env_rank("LOCAL_RANK")
    if isinstance(ssd, (str, bytes, os.PathLike)):
        ssd = [ssd]
    if ssd is not None and not isinstance(ssd, (list, tuple)):
        raise TypeError(f"ssd must be a directory, a list of them or one list per local rank, "
                        f"got {type(ssd).__name__}")
    ssd = list(ssd or [])
    if ssd and all(isinstance(d, (list, tuple)) for d in ssd):
        if local_rank >= len(ssd):
            raise ValueError(f"ssd has one list of directories per local rank ({len(ssd)}), "
                             f"none for local rank {local_rank}")
        ssd = list(ssd[local_rank])
    if not ssd or any(isinstance(d, (list, tuple)) for d in ssd):
        raise ValueError("ssd must be one or more directories, or one list of them per local rank")
    return [os.fsdecode(d).replace("{local_rank}", str(local_rank)).replace("{rank}", str(rank))
            for d in ssd]


class _Entry:
    """One sequence's trace, lifetime and plan."""

    def __init__(self, fingerprint: int, trace, lifetime: Lifetime, plan: Plan, capacity: int):
        self.fingerprint, self.trace, self.lifetime, self.plan = fingerprint, trace, lifetime, plan
        self.capacity_bytes = capacity
        self.iterations = 0

    def describe(self) -> dict:
        p = self.plan
        return {"fingerprint": f"{self.fingerprint & (2**64 - 1):016x}",
                "kernels": self.trace.n_kernels, "peak_bytes": self.lifetime.peak_bytes,
                "working_set_floor_bytes": self.lifetime.floor_bytes,
                "capacity_bytes": self.capacity_bytes, "planned_peak_bytes": p.planned_peak_bytes,
                "fits": bool(p.fits), "migrations": p.n_migrations, "bytes_to_ssd": p.bytes_to_ssd,
                "bytes_to_host": p.bytes_to_host, "plan_seconds": p.plan_seconds,
                "iterations": self.iterations}


class _PlanInUse:
    """What both sessions (Offload here, teraio.torch.compile.CompiledOffload)
    show of the plan their steps run.  A subclass sets ``_engine`` and
    ``_gbps`` and gives ``_in_use()``: the entry (trace, lifetime, plan) of
    the plan in use, None while profiling."""

    _engine: Engine | None = None
    _gbps: tuple[float, float] | None = None

    def _in_use(self):
        raise NotImplementedError

    @property
    def trace(self):
        """The trace of the plan in use (None while profiling)."""
        e = self._in_use()
        return e.trace if e else None

    @property
    def lifetime(self) -> Lifetime | None:
        e = self._in_use()
        return e.lifetime if e else None

    @property
    def plan(self) -> Plan | None:
        e = self._in_use()
        return e.plan if e else None

    @property
    def engine(self) -> Engine | None:
        return self._engine

    @property
    def ssd_gbps(self) -> tuple[float, float] | None:
        """(read, write) GB/s the planner was given: the engine's measurement
        unless ssd_gbps was given (None before the first plan)."""
        return self._gbps

    def _report_io(self, out: dict) -> dict:
        """`out` with the SSD bandwidths, the engine's backend and the
        capacity of the plan in use (the last made), beside the measured peak."""
        if self._gbps:
            out["ssd_read_gbps"], out["ssd_write_gbps"] = self._gbps
        if self._engine is not None:
            out["backend"] = self._engine.backend
        out["capacity_bytes"] = out["plans"][-1]["capacity_bytes"] if out["plans"] else None
        return out


class Offload(_PlanInUse):
    """A training job's offloading: profile, plan, run, re-plan.  Made by
    :func:`offload`; see the module text."""

    def __init__(self, model: torch.nn.Module, optimizer, capacity, ssd, *, profile_iterations: int = 2,
                 reprofile_after: int = 2, max_plans: int = 4, host_cap_bytes: int = 0,
                 bandwidth_share: float = 0.7, space_bytes: int | None = None, safe: bool = True,
                 staging: bool | None = None, name: str | None = None):
        if isinstance(capacity, bool) or not isinstance(capacity, (int, float)):
            raise TypeError(f"capacity must be bytes (int) or a share of the peak (float), got {capacity!r}")
        if isinstance(capacity, float) and not 0 < capacity <= 1:
            raise ValueError(f"capacity as a share of the peak must be in (0, 1], got {capacity}")
        if isinstance(capacity, int) and not 0 < capacity < 2**64:
            raise ValueError(f"capacity must be > 0 bytes and < 2^64, got {capacity}")
        ssd = ssd_dirs(ssd)
        for what, v, lo in (("profile_iterations", profile_iterations, 1), ("reprofile_after", reprofile_after, 1),
                            ("max_plans", max_plans, 1)):
            if not isinstance(v, int) or v < lo:
                raise ValueError(f"{what} must be an integer >= {lo}, got {v!r}")
        if not 0 < bandwidth_share <= 1:
            raise ValueError(f"bandwidth_share must be in (0, 1], got {bandwidth_share}")
        self.model, self.optimizer = model, optimizer
        self.capacity, self.ssd = capacity, [str(d) for d in ssd]
        self.profile_iterations, self.reprofile_after, self.max_plans = profile_iterations, reprofile_after, max_plans
        self.host_cap_bytes, self.bandwidth_share = host_cap_bytes, bandwidth_share
        self.space_bytes, self.safe, self.staging = space_bytes, safe, staging
        self.name = name or type(model).__name__
        self._thread = threading.get_ident()
        self._closed = False
        self._plans: collections.OrderedDict[int, _Entry] = collections.OrderedDict()
        self._unplannable: dict[int, str] = {}
        self._seen: collections.Counter = collections.Counter()  # sequences without a plan
        self._next: dict[int, int] = {}                            # sequence -> the one after it
        self._last_fp: int | None = None
        self._rt: OffloadRuntime | None = None
        self._rt_entry: _Entry | None = None
        self._prof: Profiler | None = Profiler(model, optimizer, name=self.name)
        self._profile_left = profile_iterations
        self._engine: Engine | None = None
        self._engine_space = 0
        self._gbps: tuple[float, float] | None = None
        self._totals = {k: 0 for k in _SUMS + _MAXES}
        self._counts = collections.Counter()
        self._step_cm = None

    # -- public ---------------------------------------------------------------
    def step(self):
        """Context manager around one training step (forward, backward,
        optimizer step)."""
        return _Step(self)

    @property
    def runtime(self) -> OffloadRuntime | None:
        """The OffloadRuntime of the plan the next step runs (None while
        profiling)."""
        return self._rt

    def _in_use(self):
        return self._rt_entry

    def fetch_all(self) -> None:
        """Bring every offloaded tensor back now."""
        self._check()
        if self._rt is not None:
            self._rt.fetch_all()

    def report(self) -> dict:
        """What was profiled, planned and moved, and what it cost."""
        self._check_thread()
        s = dict(self._totals)
        if self._rt is not None and self._rt._p:
            self._add(s, self._rt.stats())
        out = {"steps": self._counts["profiled"] + self._counts["planned"],
               "profiled_iterations": self._counts["profiled"],
               "planned_iterations": self._counts["planned"],
               "reprofiles": self._counts["reprofiles"], "plan_switches": self._counts["switches"],
               "plans": [e.describe() for e in self._plans.values()],
               "unplannable": {f"{fp & (2**64 - 1):016x}": why for fp, why in self._unplannable.items()},
               "ssd_dirs": self.ssd}
        out.update(s)
        out["stall_s"] = s["stall_ns"] / 1e9
        return self._report_io(out)

    def close(self) -> None:
        """Bring everything back and release the engine and its files."""
        if self._closed:
            return
        self._check_thread()
        self._close_runtime()
        if self._engine is not None:
            self._engine.close()
            self._engine = None
        self._prof = None
        self._closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- internals ------------------------------------------------------------
    def _check_thread(self) -> None:
        if threading.get_ident() != self._thread:
            raise RuntimeError("teraio.torch.offload: used from another thread; it is driven only from "
                               "the thread that created it")

    def _check(self) -> None:
        self._check_thread()
        if self._closed:
            raise RuntimeError("teraio.torch.offload: closed; make a new one to offload again")

    @staticmethod
    def _add(totals: dict, stats: dict) -> None:
        for k in _SUMS:
            totals[k] += stats[k]
        for k in _MAXES:
            totals[k] = max(totals[k], stats[k])

    def _close_runtime(self) -> None:
        if self._rt is not None:
            self._add(self._totals, self._rt.stats())
            self._rt.close()
            self._rt, self._rt_entry = None, None

    def _capacity_for(self, lt: Lifetime) -> int:
        if isinstance(self.capacity, float):
            return max(1, int(lt.peak_bytes * self.capacity))
        return self.capacity

    def _engine_for(self, lt: Lifetime, trace) -> Engine:
        """The engine, made (or made again, larger, while no runtime uses
        it) so that it can hold every tensor of this trace."""
        need = self.space_bytes or 2 * lt.peak_bytes + 4096 * trace.n_tensors + (64 << 20)
        if self._engine is None or self._engine_space < need:
            if self._engine is not None:
                self._engine.close()
            self._engine = Engine(self.ssd, need)
            self._engine_space = need
            if self._gbps is None:
                self._gbps = self._engine.measure_gbps(min(256 << 20, max(16 << 20, lt.peak_bytes // 4)))
        return self._engine

    def _plan(self) -> None:
        """Plan the iteration the profiler just recorded, keep it, and run it
        next.  A capacity below the sequence's working-set floor is an error
        for the first plan; for later ones the sequence is marked as not
        plannable and runs on demand."""
        prof, fp = self._prof, self._prof.fingerprint
        trace = prof.trace()
        lt = Lifetime(trace)
        engine = self._engine_for(lt, trace)
        cap = self._capacity_for(lt)
        rg, wg = self._gbps
        try:
            plan = Plan.build(trace, lt, cap, ssd_read_gbps=rg * self.bandwidth_share,
                              ssd_write_gbps=wg * self.bandwidth_share, host_cap_bytes=self.host_cap_bytes)
        except L.TeraioError as e:
            if not self._plans:
                self._profile_left = 1  # the next step is profiled again
                raise ValueError(f"teraio.torch.offload: no plan for capacity {cap} bytes: {e}") from e
            self._unplannable[fp] = str(e)
            log.warning("teraio: the sequence %016x cannot be planned (%s); it runs on demand",
                        fp & (2**64 - 1), e)
            return
        if not plan.fits:
            log.warning("teraio: the plan for capacity %d bytes does not fit: planned peak %d bytes",
                        cap, plan.planned_peak_bytes)
        entry = _Entry(fp, trace, lt, plan, cap)
        self._plans[fp] = entry
        while len(self._plans) > self.max_plans:
            self._plans.popitem(last=False)
        self._seen.pop(fp, None)
        log.info("teraio: planned sequence %016x: %d kernels, peak %d bytes, capacity %d, planned %d, "
                 "%d migrations", fp & (2**64 - 1), trace.n_kernels, lt.peak_bytes, cap,
                 plan.planned_peak_bytes, plan.n_migrations)

    def _use(self, entry: _Entry) -> None:
        """Run `entry`'s plan from the next step on."""
        if self._rt_entry is entry:
            return
        if self._rt is not None:
            self._counts["switches"] += 1
        self._close_runtime()
        self._rt = OffloadRuntime(self.model, self.optimizer, entry.trace, entry.plan, self._engine,
                                  staging=self.staging, safe=self.safe)
        self._rt_entry = entry

    def _after(self, fp: int) -> None:
        """Bookkeeping after a step that ran sequence `fp`; choose what the
        next step runs."""
        if self._last_fp is not None:
            self._next[self._last_fp] = fp
        self._last_fp = fp
        if fp not in self._plans and fp not in self._unplannable:
            self._seen[fp] += 1
        expected = self._next.get(fp, fp)
        if expected in self._plans:
            self._plans.move_to_end(expected)
            self._use(self._plans[expected])
        elif expected not in self._unplannable and self._seen[expected] >= self.reprofile_after:
            self._close_runtime()
            self._prof = Profiler(self.model, self.optimizer, name=self.name)
            self._profile_left = 1
            self._counts["reprofiles"] += 1
        elif self._rt is None:  # after a profiled step: the most recent plan
            self._use(next(reversed(self._plans.values())))

    def _enter(self):
        self._check()
        if self._step_cm is not None:
            raise RuntimeError("teraio.torch.offload: step() is already running")
        if self._rt is None:
            self._step_cm = self._prof.iteration()
        else:
            self._step_cm = self._rt.iteration()
        self._step_cm.__enter__()

    def _exit(self, exc) -> bool:
        cm, self._step_cm = self._step_cm, None
        suppressed = cm.__exit__(*exc)
        if exc[0] is not None:
            return suppressed
        if self._rt is None:
            self._counts["profiled"] += 1
            self._profile_left -= 1
            if self._profile_left == 0:
                fp = self._prof.fingerprint
                self._plan()
                self._after(fp)
        else:
            self._counts["planned"] += 1
            self._rt_entry.iterations += 1
            self._after(self._rt.fingerprint)
        return False


class _Step:
    def __init__(self, off: Offload):
        self.off = off

    def __enter__(self):
        self.off._enter()
        return self.off

    def __exit__(self, *exc):
        return self.off._exit(exc)


def offload(model: torch.nn.Module, optimizer=None, capacity=0.5, ssd=None, *, compile: bool = False,
            **options):
    """Offload `model`'s and `optimizer`'s tensors to SSD (and host memory,
    with ``host_cap_bytes``) so that at most ``capacity`` bytes stay
    resident at every kernel of every planned step.

    ``capacity``: bytes (int), or a share of the profiled peak (float in
    (0, 1]).  ``ssd``: one or more directories (one per SSD; tensors are
    striped over them); under torchrun ``{rank}`` and ``{local_rank}`` in a
    directory are this process's ("/mnt/nvme{local_rank}/teraio"), or ``ssd``
    is one list of directories per local rank (see :func:`ssd_dirs`).  Options: ``profile_iterations`` (2),
    ``reprofile_after`` (2), ``max_plans`` (4), ``host_cap_bytes`` (0),
    ``bandwidth_share`` (0.7: the share of the engine's measured bandwidth
    the planner may book), ``space_bytes`` (SSD space; default twice the
    peak), ``safe`` (True), ``staging`` (default: on for device memory),
    ``name``.  See :class:`Offload`.

    ``compile=True``: the model is compiled (``torch.compile`` with
    teraio's backend) and the migrations are calls in the compiled program
    instead of a dispatch mode: a
    :class:`teraio.torch.compile.CompiledOffload` (docs/compile.md), with
    the same options and methods.  The directories must exist (checked
    here, not when the first plan is made)."""
    for name in ("host_cap_bytes", "space_bytes"):
        v = options.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2**64):
            raise ValueError(f"teraio.torch.offload: {name} must be bytes, an integer in [0, 2^64), "
                             f"got {v!r}")
    for d in ssd_dirs(ssd):
        if not os.path.isdir(d):
            raise ValueError(f"teraio.torch.offload: ssd directory '{d}' does not exist or is not a "
                             f"directory")
    if compile:
        from .compile import CompiledOffload
        return CompiledOffload(model, optimizer, capacity, ssd, **options)
    return Offload(model, optimizer, capacity, ssd, **options)
