"""teraio.torch.session: what an offloading session is, whichever way its steps run.

    off = teraio.torch.offload(model, optimizer, capacity=0.5, ssd=["/mnt/nvme0/x"])
    for batch in data:
        with off.step():
            loss = model(batch); loss.backward(); optimizer.step()
    print(off.report())
    off.close()

:class:`Session` holds everything the eager path (teraio.torch.eager) and
the compiled path (teraio.torch.compile) share, so that both keep one rule:

* the options, checked once when the session is made (:func:`ssd_dirs`
  resolves the SSD directories and torchrun's rank templates);
* the capacity (bytes, or a share of the profiled peak) and the engine,
  sized from the trace and made again, larger, for a larger one;
* the plan cache: up to ``max_plans`` plans keyed by the step's sequence
  (eager: its operators' fingerprint; compiled: its graphs), the least
  recently used dropped first (never the one in use);
* which plan the next step runs: the plan of the sequence it is expected to
  run (the one that followed the last step's sequence the last two times,
  so that training steps alternating with eval steps, or two sequence
  lengths in turn, each run their own plan; where those two differ, the
  last step's sequence again);
* the re-profile rule: a sequence without a plan that has been seen
  ``reprofile_after`` times and is expected next is profiled and planned; a
  sequence that cannot be planned runs on demand and is not profiled again;
* the step context, the thread that owns the session, :meth:`report`
  (the C runtime's counters, summed over the runtimes of the session: it is
  the one accountant of the resident bytes) and :meth:`close`.

A driver (a subclass) supplies only how a step is profiled, planned and run:
``_profile_begin``/``_profile_end``, ``_plan_profile``, ``_make_runtime``,
``_run_begin``/``_run_end`` and, for a step that runs with neither,
``_plain_begin``/``_plain_end``.

Limits: the eager driver's profiled steps keep the capacity on the CPU (a
pager); the compiled driver's, and the eager driver's on a GPU, hold all of
their memory.  Switching plans: the eager driver hands the old plan's
tensors on where they are; the compiled driver brings them back before the
new plan places them again.  The session is driven from the thread that
created it.
"""
from __future__ import annotations

import collections
import contextlib
import logging
import os
import threading
import weakref

import torch

from .. import _lib as L
from .._args import U64, env_rank, integer
from ..core import Engine, Lifetime, Plan
from . import _ids
from ._ids import global_tensors
from .pager import Pager, add_stats, why_no_pager

log = logging.getLogger("teraio")

# Counters of tio_runtime_stats that add up over the runtimes of a session;
# the others listed are maxima.  (resident_bytes, capacity_bytes and
# diverged_kernel describe one runtime's present and are not reported.)
_SUMS = ("bytes_offloaded", "bytes_offloaded_ssd", "bytes_offloaded_host", "bytes_prefetched",
         "bytes_fetched_urgent", "n_offloads", "n_prefetches", "stalls", "stall_ns", "wait_ns",
         "offloads_refused", "iterations", "fetches_outside", "bytes_fetched_outside",
         "over_capacity_kernels", "frees_waited", "paged_kernels", "paged_evictions", "paged_bytes_evicted",
         "paged_fetches", "paged_bytes_fetched", "paged_io_ns", "paged_over_capacity_kernels")
_MAXES = ("peak_resident_bytes", "over_capacity_bytes_max", "peak_process_rss_bytes",
          "paged_peak_resident_bytes", "paged_over_capacity_bytes_max", "paged_peak_process_rss_bytes")


# Which live session drives each parameter (and optimizer): a tensor moved
# by two sessions would be released by one while the other reads it (AdamW's
# step counter turned to garbage, nested steps crashed).
_owners: dict[int, tuple[weakref.ref, weakref.ref]] = {}  # id(tensor or optimizer) -> (it, session)


def _claim(session, model, optimizer) -> None:
    """Refuse a model or optimizer a live session drives; else claim them.
    (Keyed by id with weak references both ways: tensors compare by value.)"""
    objs = [optimizer] if optimizer is not None else []
    objs += list(model.parameters()) + list(model.buffers())
    for obj in objs:
        entry = _owners.get(id(obj))
        if entry is None or entry[0]() is not obj:
            continue
        other = entry[1]()
        if other is not None and not other._closed and other is not session:
            what = "optimizer" if obj is optimizer else "model"
            raise RuntimeError(f"teraio.torch.offload: the {what} is driven by a live session "
                               f"('{other.name}'); close() it before offloading again")
    for obj in objs:
        _owners[id(obj)] = (weakref.ref(obj), weakref.ref(session))


def _release(session) -> None:
    for key, (obj, owner) in list(_owners.items()):
        if owner() is session or owner() is None or obj() is None:
            del _owners[key]


def ssd_dirs(ssd) -> list[str]:
    """This process's SSD directories from ``ssd``: a list of directories, one directory,
    or one list per local rank (torchrun's LOCAL_RANK picks one); ``{rank}`` and
    ``{local_rank}`` in a directory become this process's RANK and LOCAL_RANK (0 without
    torchrun), so ``"/mnt/nvme{local_rank}/teraio"`` gives each GPU of a node its own SSD."""
    rank, local_rank = env_rank("RANK"), env_rank("LOCAL_RANK")
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
    bad = next((d for d in ssd if not isinstance(d, (str, bytes, os.PathLike))), None)
    if bad is not None:
        raise TypeError(f"ssd must hold directories (str or path), got {type(bad).__name__} {bad!r}")
    return [os.fsdecode(d).replace("{local_rank}", str(local_rank)).replace("{rank}", str(rank))
            for d in ssd]


def missing_dir(dirs) -> str | None:
    """The first of `dirs` (paths) that is not an existing directory, or None."""
    return next((d for d in dirs if not os.path.isdir(d)), None)


def check_capacity(capacity) -> None:
    """``capacity``: bytes (an int in (0, 2^64)) or a share of the peak (a
    float in (0, 1])."""
    if isinstance(capacity, bool) or not isinstance(capacity, (int, float)):
        raise TypeError(f"capacity must be bytes (int) or a share of the peak (float), got {capacity!r}")
    if isinstance(capacity, float) and not 0 < capacity <= 1:
        raise ValueError(f"capacity as a share of the peak must be in (0, 1], got {capacity}")
    if isinstance(capacity, int) and not 0 < capacity < 2**64:
        raise ValueError(f"capacity must be > 0 bytes and < 2^64, got {capacity}")


def key_text(key) -> str:
    """A plan key as the report shows it: a fingerprint in hex, or the
    compiled path's tuple of graph keys joined."""
    if isinstance(key, int):
        return f"{key & (2**64 - 1):016x}"
    return "+".join(str(k) for k in key) or "(no compiled region)"


class PlanEntry:
    """One sequence's trace, lifetime and plan, and the steps that ran it
    (``iterations``: followed it to the end; ``diverged``: left it)."""

    def __init__(self, key, trace, lifetime: Lifetime, plan: Plan, capacity: int):
        self.key, self.trace, self.lifetime, self.plan = key, trace, lifetime, plan
        self.capacity_bytes = capacity
        self.iterations = 0
        self.diverged = 0
        self.totals = {k: 0 for k in _SUMS + _MAXES}   # the runtimes that ran this plan, gone

    def fits(self) -> bool:
        return bool(self.plan.fits)

    def measured(self, live: dict | None = None) -> dict:
        """What the steps under this plan measured: its runtimes' counters
        (`live`: the stats of the one running now), against its capacity."""
        t = dict(self.totals)
        if live is not None:
            Session._add(t, live)
        peak = t["peak_resident_bytes"]
        return {"peak_resident_bytes": peak, "over_capacity_kernels": t["over_capacity_kernels"],
                "over_capacity_bytes_max": t["over_capacity_bytes_max"],
                "peak_to_capacity": peak / self.capacity_bytes if self.capacity_bytes else None,
                "planned_iterations": self.iterations, "diverged_iterations": self.diverged}

    def describe(self) -> dict:
        p = self.plan
        return {"key": key_text(self.key), "kernels": self.trace.n_kernels, "peak_bytes": self.lifetime.peak_bytes,
                "working_set_floor_bytes": self.lifetime.floor_bytes,
                "capacity_bytes": self.capacity_bytes, "planned_peak_bytes": p.planned_peak_bytes,
                "fits": self.fits(), "migrations": p.n_migrations, "bytes_to_ssd": p.bytes_to_ssd,
                "bytes_to_host": p.bytes_to_host, "plan_seconds": p.plan_seconds,
                "iterations": self.iterations, "diverged_iterations": self.diverged, **self.measured()}


class Session:
    """A training job's offloading: profile, plan, run, re-plan (module
    text).  Made by :func:`teraio.torch.offload`; the options are its."""

    mode = "?"

    def __init__(self, model: torch.nn.Module, optimizer, capacity=0.5, ssd=None, *,
                 profile_iterations: int = 2, reprofile_after: int = 2, max_plans: int = 4,
                 host_cap_bytes: int = 0, bandwidth_share: float = 0.7, space_bytes: int | None = None,
                 safe: bool = True, staging: bool | None = None, name: str | None = None,
                 ssd_gbps: tuple[float, float] | None = None):
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"teraio.torch.offload: model must be a torch.nn.Module, got {type(model).__name__}")
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"teraio.torch.offload: optimizer must be a torch.optim.Optimizer or None, "
                            f"got {type(optimizer).__name__}")
        check_capacity(capacity)
        dirs = ssd_dirs(ssd)
        for what, v in (("profile_iterations", profile_iterations), ("reprofile_after", reprofile_after),
                        ("max_plans", max_plans)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{what} must be an integer >= 1, got {v!r}")
        for what, v, lo, hi, says in (("host_cap_bytes", host_cap_bytes, 0, U64, "[0, 2^64)"),
                                      ("space_bytes", space_bytes, 1 << 20, 1 << 62, "[1 MiB, 2^62]")):
            if v is not None:
                try:
                    integer(what, v, lo, hi)
                except ValueError as e:
                    raise ValueError(f"teraio.torch.offload: {what} must be bytes, an integer in {says}, "
                                     f"got {v!r}") from e
        for what, v in (("safe", safe), ("staging", staging)):
            if v is not None and not isinstance(v, bool):
                raise TypeError(f"teraio.torch.offload: {what} must be True or False, got {v!r}")
        if name is not None and (not isinstance(name, str) or not name.isprintable()):
            raise ValueError(f"teraio.torch.offload: name must be a printable str, got {name!r}")
        if isinstance(bandwidth_share, bool) or not isinstance(bandwidth_share, (int, float)) \
                or not 0 < bandwidth_share <= 1:
            raise ValueError(f"bandwidth_share must be a number in (0, 1], got {bandwidth_share!r}")
        if ssd_gbps is not None:
            if (not isinstance(ssd_gbps, (tuple, list)) or len(ssd_gbps) != 2
                    or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x < float("inf")
                               for x in ssd_gbps)):
                raise ValueError(f"ssd_gbps must be (read, write) GB/s, two finite numbers > 0, got {ssd_gbps!r}")
        d = missing_dir(dirs)
        if d is not None:
            raise ValueError(f"teraio.torch.offload: ssd directory '{d}' does not exist or is not a directory")
        _claim(self, model, optimizer)
        self.model, self.optimizer = model, optimizer
        self.capacity, self.ssd = capacity, dirs
        self._cpu_nondeterminism = None
        if any(t.device.type == "cpu" for t, _, _ in global_tensors(model, optimizer)):
            return_freed_memory()
            self._cpu_nondeterminism = cpu_nondeterminism()
        self.profile_iterations, self.reprofile_after, self.max_plans = profile_iterations, reprofile_after, max_plans
        self.host_cap_bytes, self.bandwidth_share = host_cap_bytes or 0, bandwidth_share
        self.space_bytes, self.safe, self.staging = space_bytes, safe, staging
        self.name = name or type(model).__name__
        self._thread = threading.get_ident()
        self._closed = False
        self._plans: collections.OrderedDict = collections.OrderedDict()  # key -> PlanEntry, LRU last
        # plans made again for their key or dropped from the cache: their steps stay in report()
        self._retired: list[PlanEntry] = []
        self._unplannable: dict = {}
        self._seen: collections.Counter = collections.Counter()  # sequences without a plan: steps
        self._next: dict = {}          # sequence -> the (last two) sequences that followed it
        self._last_key = None
        self._rt = None
        self._entry: PlanEntry | None = None   # the plan the runtime runs
        self._profile_left = profile_iterations
        self._engine: Engine | None = None
        self._engine_space = 0
        self._gbps: tuple[float, float] | None = tuple(ssd_gbps) if ssd_gbps else None
        self._totals = {k: 0 for k in _SUMS + _MAXES}
        self._counts = collections.Counter()
        self._step_kind: str | None = None     # "profile", "run" or "plain" while a step runs
        # reading() from other threads: they wait here for a step boundary
        self._readers = threading.Condition()
        self._readers_waiting = 0
        self._readers_in = 0
        self._readers_open = False             # the driving thread has fetched all and waits
        self._readers_error: str | None = None
        self._boundaries = 0                   # boundaries that let readers in
        self._admit_left = 0                   # readers the open boundary still waits for
        # The profiled steps' pager (teraio.torch.pager), both drivers': why there can be none
        # (None: there can), the one in use, and the counters of those that are gone.
        self._pager_off = why_no_pager(self.model, self.optimizer)
        self._pager: Pager | None = None
        self._profiling: dict | None = None

    # -- public ---------------------------------------------------------------
    def step(self):
        """Context manager around one training step (forward, backward,
        optimizer step)."""
        return _Step(self)

    @property
    def profiling(self) -> bool:
        """True if the next step is profiled (it becomes the trace a plan is
        made from, so it should be a training step)."""
        return self._profile_left > 0

    @property
    def runtime(self):
        """The runtime of the plan the next step runs (None while profiling)."""
        return self._rt

    @property
    def trace(self):
        """The trace of the plan in use (None while profiling)."""
        return self._entry.trace if self._entry else None

    @property
    def lifetime(self) -> Lifetime | None:
        return self._entry.lifetime if self._entry else None

    @property
    def plan(self) -> Plan | None:
        return self._entry.plan if self._entry else None

    @property
    def engine(self) -> Engine | None:
        return self._engine

    @property
    def ssd_gbps(self) -> tuple[float, float] | None:
        """(read, write) GB/s the planner was given: the engine's measurement
        unless ssd_gbps was given (None before the first plan)."""
        return self._gbps

    def fetch_all(self) -> None:
        """Bring every offloaded tensor back now (between steps: inside one
        it would hold what the plan keeps away, and is refused)."""
        self._check()
        if self._step_kind is not None:
            raise RuntimeError("teraio.torch.offload: fetch_all() inside a step; call it between steps")
        if self._rt is not None:
            self._rt.fetch_all()
        self._fetch_driver()

    @contextlib.contextmanager
    def reading(self, timeout: float | None = None):
        """Context manager for reading the model's or the optimizer's tensors
        from another thread (a monitor, an asynchronous checkpointer).
        Offloading releases a tensor's memory under the thread that drives
        the session, so an unguarded read from another thread may touch freed
        memory (a segfault).  Inside ``with off.reading():`` every tensor is
        resident and none moves: the caller waits for the driving thread's
        next step boundary (the entry or the exit of a step, or close()),
        where that thread brings every tensor back and waits until the
        readers waiting then have left (one that comes while they read waits
        for the next boundary, so readers cannot stall training); the next
        step then puts them back where its plan has them.  From the driving
        thread itself (between steps) it is fetch_all().  Raises TimeoutError if no boundary comes within
        `timeout` seconds (None: wait), RuntimeError if the tensors could not
        be brought back (the reason is in the message)."""
        if threading.get_ident() == self._thread:
            if not self._closed:
                self.fetch_all()
            yield self
            return
        with self._readers:
            self._readers_waiting += 1
            arrived = self._boundaries         # a boundary opened after this lets it in
            self._readers.notify_all()
            try:
                if not self._readers.wait_for(
                        lambda: self._closed or (self._readers_open and self._boundaries > arrived), timeout):
                    raise TimeoutError(f"teraio.torch.offload: reading(): no step boundary within {timeout} s")
                if self._readers_open and self._boundaries > arrived:
                    self._admit_left -= 1
                    self._readers.notify_all()
                    if self._readers_error:
                        raise RuntimeError(f"teraio.torch.offload: reading(): {self._readers_error}")
                self._readers_in += 1
            finally:
                self._readers_waiting -= 1
        _ids._reading.on = True
        try:
            yield self
        finally:
            _ids._reading.on = False
            with self._readers:
                self._readers_in -= 1
                self._readers.notify_all()

    def _serve_readers(self) -> None:
        """At a step boundary on the driving thread: if other threads wait in
        reading(), bring every tensor back, let them in, and wait until they
        have left."""
        with self._readers:
            if not self._readers_waiting:
                return
        try:
            self.fetch_all()
            self._readers_error = None
        except Exception as e:  # noqa: BLE001 (the readers are told; the step goes on)
            self._readers_error = f"the tensors could not be brought back: {e}"
        with self._readers:
            # the readers waiting now come in; one that comes later waits for the next boundary
            self._boundaries += 1
            self._admit_left = self._readers_waiting
            self._readers_open = True
            self._readers.notify_all()
            self._readers.wait_for(lambda: self._admit_left == 0 and self._readers_in == 0)
            self._readers_open = False

    def report(self) -> dict:
        """What was profiled, planned and moved, and what it cost: the C
        runtime's counters summed (the peaks: the largest) over the runtimes
        of the session, and the step counts.  Each of ``plans`` also says
        what its own steps measured against its own capacity (its peak
        resident bytes, its kernels over it, counted per kernel in diverged
        steps too, its planned and diverged steps); ``retired_plans`` the
        same of the plans made again for their sequence or dropped from the
        cache, so that the plans' counts add up to the top level's;
        ``peak_to_capacity_max`` is the worst of them all."""
        self._check_thread()
        s = dict(self._totals)
        live = self._rt.stats() if self._rt is not None and self._rt._p else None
        if live is not None:
            self._add(s, live)
        c = self._counts
        plans, retired = [], []
        for e in (*self._retired, *self._plans.values()):
            d = e.describe()
            if e is self._entry and live is not None:
                d.update(e.measured(live))
            (plans if self._plans.get(e.key) is e else retired).append(d)
        out = {"mode": self.mode, "steps": c["profiled"] + c["planned"] + c["diverged"] + c["plain"],
               "profiled_iterations": c["profiled"], "planned_iterations": c["planned"],
               "diverged_iterations": c["diverged"], "unplanned_iterations": c["plain"],
               "reprofiles": c["reprofiles"], "plan_switches": c["switches"],
               "plans": plans, "retired_plans": retired,
               "unplannable": {key_text(k): why for k, why in self._unplannable.items()},
               "ssd_dirs": self.ssd}
        out.update(s)
        out["stall_s"] = s["stall_ns"] / 1e9
        if self._gbps:
            out["ssd_read_gbps"], out["ssd_write_gbps"] = self._gbps
        if self._engine is not None:
            out["backend"] = self._engine.backend
        out["capacity_bytes"] = self._entry.capacity_bytes if self._entry else (
            out["plans"][-1]["capacity_bytes"] if out["plans"] else None)
        # each plan against its own capacity: the worst of them
        ratios = [p["peak_to_capacity"] for p in (*plans, *retired) if p["peak_to_capacity"] is not None]
        out["peak_to_capacity_max"] = max(ratios) if ratios else None
        out.update(self._profile_report())
        out["process_peak_rss_bytes"] = _peak_rss_bytes()
        # why this CPU run's results may differ from an identical run in their last bits (None: they
        # should not); README, "Bit for bit on the CPU"
        out["cpu_nondeterminism"] = self._cpu_nondeterminism
        return out

    def _profile_report(self) -> dict:
        """The pagers' counters of the profiled steps: counts summed, peaks
        the largest."""
        if self._pager is None:
            return {"profiling": self._profiling}
        return {"profiling": add_stats(self._profiling, self._pager.stats())}

    # -- the profiled steps' pager ----------------------------------------------
    pager_guard_class = None  # the pager's guard between steps (None: teraio.torch._ids.FetchGuard)

    def _profiling_pager(self) -> Pager | None:
        """The pager the next profiled step keeps the capacity with (made
        over the profiling engine, or set to the capacity); None where
        there can be none (_pager_off says why)."""
        if self._pager_off is not None:
            return None
        if isinstance(self.capacity, float):
            cap_bytes, share = 0, self.capacity
        else:
            cap_bytes, share = self.capacity, 0.0
        if self._pager is None:
            self._pager = Pager(self._engine_for_profiling(), cap_bytes, share, self.model, self.optimizer)
            if self.pager_guard_class is not None:
                self._pager._guard = self.pager_guard_class(self._pager._guard_fetch)
        else:
            self._pager.set_capacity(cap_bytes, share)
        return self._pager

    def _add_profiling(self, pager: Pager) -> None:
        """Keep the counters of a pager that goes."""
        self._profiling = add_stats(self._profiling, pager.stats())

    def _runtime_from_pager(self, make):
        """`make(pager)`: the plan's runtime, to which the pager of the
        profiled steps (None if there is none) hands the global tensors
        (evicted ones with their stored copies); the pager then goes."""
        pager, self._pager = self._pager, None
        if pager is not None:
            pager.begin_step()  # its guard off the mode stack before the runtime's goes on
        try:
            return make(pager)
        finally:
            if pager is not None:
                self._add_profiling(pager)
                pager.close()

    def close(self) -> None:
        """Bring everything back and release the engine and its files."""
        if self._closed:
            return
        self._check_thread()
        if self._step_kind is not None:
            raise RuntimeError("teraio.torch.offload: close() inside a step; leave the step first")
        self._close_runtime()
        self._close_driver()
        if self._engine is not None:
            self._engine.close()
            self._engine = None
        with self._readers:
            self._closed = True                # readers waiting go on: everything is back
            self._readers.notify_all()
        _release(self)

    def _close_driver(self) -> None:
        """Close what the session holds besides the runtime (the pager)."""
        if self._pager is not None:
            self._add_profiling(self._pager)
            self._pager.close()
            self._pager = None

    def _fetch_driver(self) -> None:
        """fetch_all() of what the session holds besides the runtime (the pager)."""
        if self._pager is not None:
            self._pager.fetch_all()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- what a driver supplies -------------------------------------------------
    def _profile_begin(self) -> None:
        raise NotImplementedError

    def _profile_end(self, exc):
        """End a profiled step (`exc`: the exception triple the step's body
        raised, or three Nones); (key, profile) of what it recorded, or None
        (failed, or nothing to plan from)."""
        raise NotImplementedError

    def _plan_profile(self, key, profile, capacity_of) -> PlanEntry:
        """The plan of a profiled sequence, for the capacity
        ``capacity_of(lifetime)``; raises NoPlan where the planner refuses,
        Unplannable where the driver cannot plan the sequence."""
        raise NotImplementedError

    def _make_runtime(self, entry: PlanEntry):
        raise NotImplementedError

    def _run_begin(self) -> None:
        raise NotImplementedError

    def _run_end(self, exc):
        """End a step run under the runtime; (key of what ran, followed the
        plan to the end)."""
        raise NotImplementedError

    def _plain_begin(self) -> None:
        """A step with no plan and no profile (a sequence that cannot be
        planned is running): runs as the program is."""

    def _plain_end(self, exc):
        return None

    def _profile_next(self) -> None:
        """The next step is profiled (a new sequence to plan)."""

    # -- shared ---------------------------------------------------------------
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
            totals[k] += stats.get(k, 0)
        for k in _MAXES:
            totals[k] = max(totals[k], stats.get(k, 0))

    def _retire_runtime(self) -> None:
        """The runtime's plan is not the next one to run (another plan takes
        over, or a new sequence is profiled).  Here: closed, its tensors
        brought back; a driver that can hands them on where they are."""
        self._close_runtime()

    def _keep_stats(self, stats: dict) -> None:
        """The counters of the runtime that goes, into the session's and its plan's."""
        self._add(self._totals, stats)
        if self._entry is not None:
            self._add(self._entry.totals, stats)

    def _close_runtime(self) -> None:
        if self._rt is not None:
            self._keep_stats(self._rt.stats())
            self._rt.close()
            self._rt = None
        self._entry = None

    def _capacity_for(self, lt: Lifetime) -> int:
        if isinstance(self.capacity, float):
            return max(1, int(lt.peak_bytes * self.capacity))
        return self.capacity

    def _engine_busy(self) -> bool:
        """Does something other than a runtime keep bytes in the engine (the
        pager of the profiled steps)?  Then it is not made again."""
        return self._pager is not None

    def _engine_for_profiling(self) -> Engine:
        """The engine the profiled steps evict to, before any trace says how
        much space a plan needs: ``space_bytes``, else 32 times the bytes of
        the model's and optimizer's tensors now, at least 256 MiB, at most a
        quarter of the free space of the SSD directories.  A job whose
        activations are more than that (a long sequence) gives space_bytes:
        the pager keeps what it cannot evict resident and says so."""
        if self._engine is None:
            import shutil
            now = sum(t.untyped_storage().nbytes() for t, _, _ in global_tensors(self.model, self.optimizer))
            free = min(shutil.disk_usage(d).free for d in self.ssd) * len(self.ssd)
            need = self.space_bytes or max(256 << 20, min(32 * now, free // 4))
            self._engine, self._engine_space = Engine(self.ssd, need), need
        return self._engine

    def _engine_for(self, lt: Lifetime, trace) -> Engine:
        """The engine, made (or made again, larger, once no runtime uses it)
        so that it can hold every tensor of this trace.  A larger engine is
        made before the old one is closed: if it cannot be made, the old one
        stays and the error is raised.  An engine that holds the profiled
        steps' evicted tensors stays (the runtime refuses a plan that needs
        more SSD space than it has)."""
        need = self.space_bytes or 2 * lt.peak_bytes + 4096 * trace.n_tensors + (64 << 20)
        if self._engine is not None and self._engine_space < need and self._engine_busy():
            log.info("teraio: the engine of the profiled steps has %d bytes of SSD space, the plan may want "
                     "%d (space_bytes sets it)", self._engine_space, need)
        elif self._engine is None or self._engine_space < need:
            engine = Engine(self.ssd, need)
            self._close_runtime()
            if self._engine is not None:
                self._engine.close()
            self._engine, self._engine_space = engine, need
        if self._gbps is None:
            self._gbps = self._engine.measure_gbps(min(256 << 20, max(16 << 20, lt.peak_bytes // 4)))
        return self._engine

    def _build_plan(self, trace, lt: Lifetime, cap: int, **kw) -> Plan:
        rg, wg = self._gbps
        return Plan.build(trace, lt, cap, ssd_read_gbps=rg * self.bandwidth_share,
                          ssd_write_gbps=wg * self.bandwidth_share, host_cap_bytes=self.host_cap_bytes, **kw)

    def _plan(self, key, profile) -> None:
        """Plan the sequence just profiled and keep it.  The first plan's
        failure is an error (and the next step is profiled again); a later
        one marks the sequence as not plannable (it runs on demand), said
        once."""
        try:
            entry = self._plan_profile(key, profile, self._capacity_for)
        except (NoPlan, Unplannable, L.TeraioError) as e:
            if not self._plans and not isinstance(e, Unplannable):
                self._profile_left = 1  # the next step is profiled again
                raise ValueError(f"teraio.torch.offload: {e}") from e
            self._unplannable[key] = str(e)
            log.warning("teraio: the sequence %s cannot be planned (%s); it runs %s", key_text(key), e,
                        "without teraio" if self.mode == "compiled" else "on demand")
            return
        if not entry.fits():
            log.warning("teraio: the plan for capacity %d bytes does not fit: planned peak %d bytes",
                        entry.capacity_bytes, entry.plan.planned_peak_bytes)
        if key in self._plans:
            self._retired.append(self._plans[key])
        self._plans[key] = entry
        self._plans.move_to_end(key)
        self._set_paging_capacity()
        while len(self._plans) > self.max_plans:
            old = next(k for k, e in self._plans.items() if e is not self._entry)
            self._retired.append(self._plans.pop(old))
        self._seen.pop(key, None)
        log.info("teraio: planned sequence %s: %d kernels, peak %d bytes, capacity %d, planned %d, "
                 "%d migrations", key_text(key), entry.trace.n_kernels, entry.lifetime.peak_bytes,
                 entry.capacity_bytes, entry.plan.planned_peak_bytes, entry.plan.n_migrations)

    def _use(self, entry: PlanEntry) -> None:
        """Run `entry`'s plan from the next step on."""
        if self._entry is entry and self._rt is not None:
            return
        if self._rt is not None:
            self._counts["switches"] += 1
        self._retire_runtime()
        self._rt = self._make_runtime(entry)
        self._entry = entry
        self._set_paging_capacity()

    def _set_paging_capacity(self) -> None:
        """What a step that leaves its plan keeps: the capacity in bytes, or,
        for a share, the share of the largest peak of the sequences planned
        (the largest of the plans' capacities)."""
        if self._rt is not None:
            self._rt.paging_capacity = max((e.capacity_bytes for e in self._plans.values()), default=0)

    def _expected_after(self, key):
        """The sequence the step after one of `key` is expected to run: the
        one that followed `key` the last two times (or the one time) it ran;
        where those two differ (a change, not an alternation), `key` again."""
        followed = self._next.get(key)
        if not followed or (len(followed) == 2 and followed[0] != followed[1]):
            return key
        return followed[-1]

    def _after(self, key) -> None:
        """Bookkeeping after a step that ran sequence `key`; choose what the
        next step runs."""
        if key is None:
            return
        if self._last_key is not None:
            self._next.setdefault(self._last_key, collections.deque(maxlen=2)).append(key)
        self._last_key = key
        if key not in self._plans and key not in self._unplannable:
            self._seen[key] += 1
        expected = self._expected_after(key)
        if expected in self._plans:
            self._plans.move_to_end(expected)
            self._use(self._plans[expected])
        elif expected not in self._unplannable and self._seen[expected] >= self.reprofile_after:
            self._retire_runtime()
            self._profile_left = 1
            self._counts["reprofiles"] += 1
            self._profile_next()
        elif self._rt is None and self._plans and self._profile_left == 0:
            self._use(next(reversed(self._plans.values())))

    def _enter(self) -> None:
        self._check()
        if self._step_kind is not None:
            raise RuntimeError("teraio.torch.offload: step() is already running")
        self._serve_readers()
        if self._rt is not None:
            kind, begin = "run", self._run_begin
        elif self._profile_left > 0:
            kind, begin = "profile", self._profile_begin
        else:
            kind, begin = "plain", self._plain_begin
        self._step_kind = kind
        try:
            begin()
        except BaseException:
            self._step_kind = None
            raise

    def _exit(self, exc) -> None:
        try:
            self._end_step(exc)
        finally:
            self._serve_readers()

    def _end_step(self, exc) -> None:
        kind, self._step_kind = self._step_kind, None
        failed = exc[0] is not None
        if kind == "profile":
            got = self._profile_end(exc)
            if failed or got is None:
                return
            self._counts["profiled"] += 1
            self._profile_left -= 1
            if self._profile_left == 0:
                key, profile = got
                self._plan(key, profile)
                self._after(key)
        elif kind == "run":
            entry = self._entry
            key, followed = self._run_end(exc)
            if failed:
                return
            if followed:
                self._counts["planned"] += 1
                entry.iterations += 1
            else:
                self._counts["diverged"] += 1
                entry.diverged += 1
            self._after(key)
        else:
            key = self._plain_end(exc)
            if failed:
                return
            self._counts["plain"] += 1
            self._after(key)


_malloc_tuned = False
_said_nondeterminism = False


def cpu_nondeterminism() -> str | None:
    """Why two identical CPU runs (with or without teraio) may give other last
    bits, or None: MKL's kernels on several threads vary from run to run
    unless its thread count is fixed and its reproducibility mode is on.
    Said once per process in the log."""
    global _said_nondeterminism
    threads = torch.get_num_threads()
    env = os.environ
    if threads == 1:
        return None
    strict = env.get("MKL_CBWR", "").upper().startswith(("AUTO,STRICT", "COMPATIBLE", "SSE", "AVX"))
    fixed = env.get("MKL_DYNAMIC", "").upper() == "FALSE" and env.get("OMP_DYNAMIC", "").upper() == "FALSE"
    if strict and fixed:
        return None
    why = (f"{threads} compute threads without MKL_CBWR=AUTO,STRICT, MKL_DYNAMIC=FALSE and OMP_DYNAMIC=FALSE: "
           f"MKL's results can differ from run to run in their last bits, in plain PyTorch too; for runs to "
           f"compare bit for bit use torch.set_num_threads(1) or those settings (README, 'Bit for bit on the CPU')")
    if not _said_nondeterminism:
        _said_nondeterminism = True
        log.info("teraio: %s", why)
    return why


def return_freed_memory() -> bool:
    """Make the memory of released CPU tensors go back to the OS (glibc):
    allocations of 64 KiB and more are mmap'ed, so freeing one unmaps it at
    once, and the heap is trimmed above 128 KiB.  glibc's default raises its
    mmap threshold to the largest block freed (up to 32 MiB), after which
    tensors come from the heap and a freed one stays in the process: the
    resident bytes teraio keeps within the capacity would then not be the
    memory the OS (a cgroup limit, the OOM killer) counts.  Process-wide and
    done once; False where the C library is not glibc."""
    global _malloc_tuned
    if _malloc_tuned:
        return True
    import ctypes
    try:
        libc = ctypes.CDLL("libc.so.6")
        M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
        ok = libc.mallopt(M_MMAP_THRESHOLD, 64 * 1024) == 1 and libc.mallopt(M_TRIM_THRESHOLD, 128 * 1024) == 1
    except (OSError, AttributeError):
        ok = False
    _malloc_tuned = ok
    if ok:
        log.info("teraio: CPU allocations of 64 KiB and more are mmap'ed, so released tensors' memory goes "
                 "back to the OS")
    return ok


def _peak_rss_bytes() -> int:
    """The process's peak resident set (VmHWM) as the OS counts it."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class Unplannable(Exception):
    """A driver cannot plan this sequence (a graph with dynamic shapes, ...)."""


class NoPlan(Exception):
    """The planner refused the capacity (below the working-set floor)."""

    def __init__(self, capacity: int, why):
        super().__init__(f"no plan for capacity {capacity} bytes: {why}")
        self.capacity = capacity


class _Step:
    def __init__(self, session: Session):
        self.session = session

    def __enter__(self):
        self.session._enter()
        return self.session

    def __exit__(self, *exc):
        self.session._exit(exc)
        return False
