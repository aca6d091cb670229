"""teraio.torch.eager: a session whose steps run eagerly, seen operator by operator.

What the eager driver adds to teraio.torch.session.Session:

1. **Profile**: the first ``profile_iterations`` steps (default 2) run under
   the :class:`~teraio.torch.Profiler` and, on the CPU, within the capacity:
   a pager (teraio.torch.pager, libteraio's pager.h) evicts the least
   recently used tensors to the SSD whenever the resident bytes would exceed
   it (a capacity given as a share is a share of the largest memory seen so
   far, so of the peak without ever holding it).  The last one is the trace
   (the first also creates the optimizer's state).  A
   step's key is the fingerprint of its operator sequence (kernel names,
   output sizes and shapes, teraio.torch.profiler.sequence_fingerprint).
2. **Plan**: the engine is made over the ``ssd`` directories, its read and
   write bandwidth measured, and libteraio's default planner plans for the
   capacity.
3. **Run**: later steps run under an :class:`~teraio.torch.OffloadRuntime`
   for the plan of the sequence the step is expected to run (the session's
   rule), whose dispatch mode reports every operator to the C runtime.
4. **Divergence**: a step whose sequence is not the expected one leaves the
   plan: the runtime fetches what it needs on demand for the rest of the
   step, so results stay the same; the session's re-profile rule decides
   when the new sequence is profiled.

Safe by default: between steps, operators and ``state_dict()`` see true
values (OffloadRuntime's safe mode); ``close()`` brings everything back.
"""
from __future__ import annotations

import logging

import torch

from .. import _lib as L
from ..core import Lifetime
from .pager import Pager
from .profiler import Profiler
from .runtime import OffloadRuntime
from .session import NoPlan, PlanEntry, Session

log = logging.getLogger("teraio")


class EagerSession(Session):
    """Offloading for eager steps (module text); the options are
    :func:`teraio.torch.offload`'s."""

    mode = "eager"

    def __init__(self, model, optimizer=None, capacity=0.5, ssd=None, **options):
        super().__init__(model, optimizer, capacity, ssd, **options)
        self._prof: Profiler | None = None
        self._cm = None
        self._profile_next()

    def _profile_next(self) -> None:
        """The next step is profiled: within the capacity, under a pager,
        where it can be; with everything resident (said once) where not.
        A re-profile after plans were made takes over the pager the last
        runtime handed its tensors to (_retire_runtime), so it keeps the
        capacity too."""
        pager = self._profiling_pager()
        if pager is None and not self._plans:
            log.info("teraio: the profiled steps hold all their memory (%s)", self._pager_off)
        self._prof = Profiler(self.model, self.optimizer, name=self.name, pager=pager)

    def _retire_runtime(self) -> None:
        """Hand the runtime's tensors to a pager where they are (an
        offloaded one keeps its stored copy): the next runtime, or the
        profiled steps of a new sequence, take them from there, so nothing
        is brought back between steps beyond the capacity."""
        rt = self._rt
        if rt is None or self._pager_off is not None or rt.engine is None or self._pager is not None:
            super()._retire_runtime()
            return
        stats = rt.stats()
        self._keep_stats(stats)
        pager = Pager(rt.engine, max(1, stats["capacity_bytes"]), 0.0, self.model, self.optimizer)
        try:
            rt.handover(pager)
        except BaseException:
            pager.close()
            raise
        finally:
            rt.close()  # binds nothing now (or, after a failed handover, brings the rest back)
            self._rt, self._entry = None, None
        self._pager = pager
        pager._guard_on()

    def _open(self, cm) -> None:
        """Enter the step's iteration context (the profiler's or the runtime's)."""
        cm.__enter__()
        self._cm = cm

    def _close(self, exc) -> None:
        cm, self._cm = self._cm, None
        cm.__exit__(*exc)

    def _profile_begin(self) -> None:
        self._open(self._prof.iteration())

    def _profile_end(self, exc):
        self._close(exc)
        return None if exc[0] is not None else (self._prof.fingerprint, self._prof)

    def _plan_profile(self, key, prof: Profiler, capacity_of) -> PlanEntry:
        trace = prof.trace()
        lt = Lifetime(trace)
        self._engine_for(lt, trace)
        cap = capacity_of(lt)
        try:
            plan = self._build_plan(trace, lt, cap)
        except L.TeraioError as e:
            raise NoPlan(cap, e) from e
        return PlanEntry(key, trace, lt, plan, cap)

    def _make_runtime(self, entry: PlanEntry) -> OffloadRuntime:
        """The plan's runtime, handed the profiled steps' global tensors."""
        return self._runtime_from_pager(lambda pager: OffloadRuntime(
            self.model, self.optimizer, entry.trace, entry.plan, self._engine, staging=self.staging,
            safe=self.safe, pager=pager))

    def _run_begin(self) -> None:
        self._open(self._rt.iteration())

    def _run_end(self, exc):
        self._close(exc)
        return self._rt.fingerprint, not self._rt.diverged
