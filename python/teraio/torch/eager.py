"""teraio.torch.eager: a session whose steps run eagerly, seen operator by operator.

What the eager driver adds to teraio.torch.session.Session:

1. **Profile**: the first ``profile_iterations`` steps (default 2) run under
   the :class:`~teraio.torch.Profiler`, with everything resident.  The last
   one is the trace (the first also creates the optimizer's state).  A
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

from .. import _lib as L
from ..core import Lifetime
from .profiler import Profiler
from .runtime import OffloadRuntime
from .session import NoPlan, PlanEntry, Session


class EagerSession(Session):
    """Offloading for eager steps (module text); the options are
    :func:`teraio.torch.offload`'s."""

    mode = "eager"

    def __init__(self, model, optimizer=None, capacity=0.5, ssd=None, **options):
        super().__init__(model, optimizer, capacity, ssd, **options)
        self._prof: Profiler | None = Profiler(model, optimizer, name=self.name)
        self._cm = None

    def _profile_next(self) -> None:
        self._prof = Profiler(self.model, self.optimizer, name=self.name)

    def _profile_begin(self) -> None:
        cm = self._prof.iteration()
        cm.__enter__()
        self._cm = cm

    def _profile_end(self, exc):
        cm, self._cm = self._cm, None
        cm.__exit__(*exc)
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
        return OffloadRuntime(self.model, self.optimizer, entry.trace, entry.plan, self._engine,
                              staging=self.staging, safe=self.safe)

    def _run_begin(self) -> None:
        cm = self._rt.iteration()
        cm.__enter__()
        self._cm = cm

    def _run_end(self, exc):
        cm, self._cm = self._cm, None
        cm.__exit__(*exc)
        return self._rt.fingerprint, not self._rt.diverged
