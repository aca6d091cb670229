"""teraio.torch.compile.session: a session whose steps run compiled code.

    off = teraio.torch.offload(model, optimizer, capacity=0.5, ssd=["/mnt/nvme0/x"], compile=True)
    for batch in data:
        with off.step():
            loss = model(batch); loss.backward(); optimizer.step()

What the compiled driver adds to teraio.torch.session.Session (which keeps
the options, the capacity, the engine, the plan cache, the re-profile rule
and the report).  The model is compiled with :attr:`CompiledSession.backend`,
which is Inductor (``compile_fx``) with teraio's hook on the graphs
AOTAutograd hands Inductor (forward, backward, inference); other functions
compiled with the same backend (``torch.compile(optimizer.step,
backend=off.backend)``) take part too.  Then:

1. **Profile** (``profile_iterations`` steps, default 2): the compiled code
   runs as Inductor made it; teraio.torch.compile.profile records the
   iteration as a trace (every graph node a kernel, timed; every stretch of
   eager code one kernel) and which graph ran where.  A step's key is its
   sequence of graphs.  On the CPU these steps keep the capacity: a pager
   (teraio.torch.pager) moves tensors on demand, for eager code operator by
   operator and for Inductor's code statement by statement of its wrapper
   (compile.paging); when the first plan is made the pager hands the global
   tensors to the plan's runtime where they are.
2. **Plan**: libteraio's planner for the capacity, moving only global
   tensors (parameters, gradients, optimizer state) and activations (saved
   by a forward graph for a backward graph): everything else is inside one
   graph or seen by eager code, which is not watched.  Each graph with a
   planned migration is compiled again with ``teraio::kernel_begin`` before
   the planned nodes (compile.ops), put in where Inductor's post-grad
   passes leave the graph, the graph profiled (compile.passes); the others
   keep their code.  The plan is
   then measured on the code that will run (compile.plan, compile.code) and
   made again where that code holds more than the trace said.
3. **Run**: every region call checks that it is the graph the plan expects
   at that place of the step; its ``kernel_begin`` calls drive the C
   runtime (``tio_runtime_kernel_begin`` at the plan's kernel indices,
   ``tio_runtime_ensure_resident`` for what the next node reads); at the
   end of a region the runtime is told that the eager kernel after it
   begins, and what that eager code reads is made resident first.  No
   Python runs per operator.
4. **Divergence**: a region the plan does not expect (a graph break taken
   another way, a recompile for new shapes, an eval pass) makes the step
   leave the plan: a warning, and the rest of the step keeps the capacity
   as a profiled step does (the runtime hands its tensors to a pager; eager
   code and each region's code are paged; the global tensors go back to
   the runtime where they are at the step's end).  Only inside a region's
   code (a call that finds another kernel than the trace's) is every
   tensor fetched back, the rest of the step running without teraio.  A
   step whose first region starts another kept plan switches to it there,
   without profiling.

Kernel indices: the trace of a step is the concatenation, in run order, of
eager kernel, graph kernels, eager kernel, ...; a graph run at several
places of a step (a block compiled once, called per layer) has an instance
per place, each with its own offset and trace ids, and the ``kernel_begin``
calls carry the graph-local node index.

Resident bytes: the compiled program's own buffers are Inductor's; the
runtime binds only the global tensors and what it moves.  Before each
point (a ``kernel_begin`` call, an eager kernel) the session tells the C
runtime the most the code of the region holds until the next point
(StepPlan.point_max: the bytes Inductor's code holds, or the trace's memory
outside regions and where the code cannot be read) with
``tio_runtime_account_program``; the runtime subtracts what it has
released and counts the result against the capacity, as it does for eager
steps, so ``peak_resident_bytes`` and ``over_capacity_*`` in
:meth:`~teraio.torch.session.Session.report` come from the runtime in both
modes.

Limits: dynamic shapes (symbolic sizes) are not planned (said once; such a
region runs as compiled); CUDA graphs (``mode="reduce-overhead"``) need
fixed addresses and are not supported; eager code between regions must
read the same tensors in every step (it was profiled, it is not watched),
and tensors are not all resident between steps: call :meth:`fetch_all`
before reading parameters or optimizer state outside a step (a compiled
region called outside a step does so itself).
"""
from __future__ import annotations

import contextlib
import logging
import weakref

import torch
from torch._inductor.compile_fx import compile_fx, compile_fx_inner
from torch.utils._python_dispatch import (TorchDispatchMode, _get_current_dispatch_mode_stack, _pop_mode,
                                          _push_mode)

from ... import _lib as L
from ...core import Lifetime, Trace
from .._ids import FetchGuard, global_tensors
from ..pager import Pager
from ..runtime import OffloadRuntime
from ..session import NoPlan, Session, Unplannable
from . import ops, passes
from .graph import GraphInfo
from .plan import StepPlan, with_extra
from .paging import PagedCode
from .profile import EAGER, MOVABLE_KINDS, Instance, Profile, Recorder

log = logging.getLogger("teraio")

# Every graph teraio's backend saw, by GraphInfo.gid (the `graph` argument of
# teraio::kernel_begin), with the session that owns it.
_graphs: list[tuple[GraphInfo, weakref.ref]] = []


def _dispatch_op(moved, read, graph: int, kernel: int) -> None:
    """teraio::kernel_begin's implementation; a graph no session of this
    process compiled (an opcheck, a graph from elsewhere) moves nothing."""
    if 0 <= graph < len(_graphs):
        info, ref = _graphs[graph]
        session = ref()
        if session is not None:
            session._kernel_op(info, moved, read, kernel)


ops.set_handler(_dispatch_op)
ops.register_inductor_lowering()


class _RegionFn:
    """What teraio's inner compiler returns for a graph: the session decides
    at each call which compiled code runs (boxed calling convention)."""

    def __init__(self, session: "CompiledSession", info: GraphInfo):
        self._boxed_call = True
        self._session = weakref.ref(session)
        self.info = info

    def __call__(self, args):
        s = self._session()
        if s is None:
            return self.info.plain(args)
        return s._run_region(self.info, args)


class _CompiledGuard(FetchGuard):
    """OffloadRuntime's guard between iterations (an operator that reads an
    offloaded tensor fetches it first), transparent to torch.compile:
    Dynamo compiles and runs compiled code under it."""

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True


class _OffPlanMode(TorchDispatchMode):
    """On the mode stack through a planned step, passing every operator
    through until the step leaves its plan between regions; from then on
    the eager code goes through the pager (the Recorder's mode), as in a
    profiled step.  It is pushed when the step begins because a mode pushed
    from inside a region call does not last: AOTAutograd's wrappers put the
    mode stack they found back when the region returns."""

    def __init__(self, session: "CompiledSession"):
        super().__init__()
        self.session = session

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        rec = self.session._rec
        if rec is None:
            return func(*args, **(kwargs or {}))
        return rec.mode.__torch_dispatch__(func, types, args, kwargs)


def _remove_mode(mode) -> None:
    """Take `mode` off the dispatch mode stack, with the modes above it put back."""
    stack = _get_current_dispatch_mode_stack()
    if mode not in stack:
        return
    above = []
    while True:
        m = _pop_mode()
        if m is mode:
            break
        above.append(m)
    for m in reversed(above):
        _push_mode(m)


class _GraphRuntime(OffloadRuntime):
    """The eager path's runtime: the C runtime, its callbacks, global tensors
    bound by name, iteration begin and end, the guard between iterations
    and state_dict safety; without the per-operator dispatch mode (the
    compiled step reports its kernels through kernel_begin calls, and the
    bytes its code holds through tio_runtime_account_program)."""

    guard_class = _CompiledGuard  # made in OffloadRuntime.__init__, which may push it already

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._mode = contextlib.nullcontext()

    def bind(self, i: int, st) -> bool:
        """Bind storage `st` to id `i` unless it is (a released storage is
        bound already); False if the runtime refused it (another size than
        the trace's: the step left the plan)."""
        b = self._bound.get(i)
        if (b is not None and b[0] == st._cdata) or not st.nbytes():
            return True
        self._ids.assign(st, i)
        return self._bind(i, st)


class CompiledSession(Session):
    """A compiled training job's offloading: profile, plan, run, re-plan
    (module text).  The options are teraio.torch.offload's; its own:
    ``compile_model`` (default True) calls
    ``model.compile(backend=self.backend, dynamic=False)``, else compile
    what you like with :attr:`backend`.  ``ssd_gbps`` (the (read, write)
    GB/s the planner assumes, default measured through the engine): a plan
    assuming more than the SSD gives waits at its deadlines, never more
    memory.  After :meth:`close` the model stays compiled; its graphs run
    as Inductor compiled them."""

    mode = "compiled"
    pager_guard_class = _CompiledGuard   # Dynamo compiles and runs compiled code under it

    def __init__(self, model: torch.nn.Module, optimizer=None, capacity=0.5, ssd=None, *,
                 compile_model: bool = True, **options):
        passes.check_post_grad_passes()
        super().__init__(model, optimizer, capacity, ssd, **options)
        self._rec: Recorder | None = None
        self._active = False                  # the step follows self._entry
        self._pos = 0
        self._observed: list[str] = []
        self._current: dict[int, Instance] = {}
        self._warned: set = set()
        self._curve: list | None = None
        self._curve_points: list | None = None
        self._iteration = None                # the runtime's iteration of the step running
        self._off_plan: _OffPlanMode | None = None  # on the mode stack through a planned step
        if compile_model:
            model.compile(backend=self.backend, dynamic=False)

    # -- the backend ------------------------------------------------------------
    def backend(self, gm: torch.fx.GraphModule, example_inputs):
        """A torch.compile backend: Inductor, with teraio on every graph
        AOTAutograd produces.  AOTAutograd's cache is off for these
        compilations: an entry made here must not serve plain Inductor, and
        a plain entry would skip teraio's hook."""
        with torch._functorch.config.patch(enable_autograd_cache=False):
            return compile_fx(gm, example_inputs, inner_compile=self._inner_compile)

    def _inner_compile(self, gm, example_inputs, **kwargs):
        kind = "backward" if kwargs.get("is_backward") else "inference" if kwargs.get("is_inference") else "forward"
        source = passes.copy_graph(gm)
        try:
            post, why = passes.post_grad_graph(passes.copy_graph(gm), example_inputs, kwargs), None
        except Exception as e:  # the graph runs as Inductor compiles it, unplanned
            post, why = source, f"Inductor's post-grad passes could not be read: {type(e).__name__}: {e}"
        plain = compile_fx_inner(gm, example_inputs, **kwargs)
        info = GraphInfo(len(_graphs), post, kind, source=source)
        if why is not None and info.unplannable is None:
            info.unplannable = why
        info.plain = plain
        info.variants = {}
        info.compile_args = (example_inputs, kwargs, torch._guards.TracingContext.try_get(),
                             torch._guards.CompileContext.try_get())
        _graphs.append((info, weakref.ref(self)))
        return _RegionFn(self, info)

    def _variant(self, info: GraphInfo, entry: StepPlan):
        """The compiled code of `info` under `entry`'s plan: Inductor's own
        where the plan has no call in it, else compiled with the
        ``kernel_begin`` calls (once per set of calls; compile.passes)."""
        ops = entry.ops.get(info.key)
        if not ops:
            return info.plain
        key = tuple((j, tuple(mv), tuple(rd)) for j, (mv, rd) in sorted(ops.items()))
        fn = info.variants.get(key)
        if fn is None:
            fn = info.variants[key] = passes.compile_with_ops(info, ops)
        return fn

    # -- regions ----------------------------------------------------------------
    def _paged(self, info: GraphInfo) -> PagedCode:
        """`info`'s compiled code paged for the profiled steps
        (compile.paging), made once; code that cannot be paged runs with
        every tensor it receives resident (said once per graph)."""
        paged = getattr(info, "paged", None)
        if paged is None:
            paged = info.paged = PagedCode(info, info.plain)
            if paged.call is None:
                self._warn(("paged", info.key), f"teraio: graph {info.key} ({info.kind}) runs its profiled steps "
                           f"with every tensor it receives resident ({paged.why})")
        return paged

    def _run_region(self, info: GraphInfo, args):
        if self._step_kind is None:
            if self._rt is not None and self._rt._released:
                self._rt.fetch_all()
            if self._pager is not None:
                self._pager.fetch_all()
            return info.plain(args)
        self._observed.append(info.key)
        if self._rec is not None:
            if self._rec.pager is None:
                return self._rec.region(info, info.plain, args)
            return self._rec.region(info, info.plain, args, self._paged(info))
        if not self._active:
            return info.plain(args)
        entry, p = self._entry, self._pos
        if p == 0 and entry.sequence[0] != info.key:
            entry = self._switch_at_first_region(info) or entry
        self._pos += 1
        if p >= len(entry.sequence) or entry.sequence[p] != info.key:
            why = (f"region {p} is graph {info.key} ({info.kind}), the plan has "
                   + (f"graph {entry.sequence[p]}" if p < len(entry.sequence) else "no more regions"))
            self._diverge(why, between_regions=True)
            return self._run_off_plan(info, args)
        inst = entry.instances[p]
        self._current[info.gid] = inst
        for pos, i in inst.bind_in:
            self._bind(i, args[pos], between_regions=True)
        if not self._active:
            return self._run_off_plan(info, args)
        fn = self._variant(info, entry)
        out = fn(args)
        for pos, i in inst.bind_out:
            self._bind(i, out[pos])
        self._kernel(inst.eager_kernel, EAGER, inst.eager_ensure)
        return out

    def _run_off_plan(self, info: GraphInfo, args):
        """A region of a step that left its plan: paged as in a profiled step
        where the step goes on under a pager (_diverge), else as compiled."""
        if self._rec is not None:
            return self._rec.region(info, info.plain, args, self._paged(info))
        return info.plain(args)

    def _switch_at_first_region(self, info: GraphInfo) -> StepPlan | None:
        """The step's first region is not the plan's: if a kept plan starts
        with this graph, run the step under it (the old runtime brings its
        tensors back, the new one places them)."""
        entry = next((e for e in reversed(self._plans.values()) if e.sequence[0] == info.key), None)
        if entry is None:
            return None
        self._use(entry)
        self._begin_plan()
        return entry

    def _begin_plan(self) -> None:
        """The runtime's iteration begins, then kernel 0 (the eager code
        before the first region)."""
        self._iteration = self._rt.iteration()
        self._iteration.__enter__()
        self._active = True
        self._curve_points = [] if self._curve is not None else None
        self._kernel(0, EAGER, self._entry.eager_ensure0)

    def _kernel_op(self, info: GraphInfo, moved, read, j: int) -> None:
        """teraio::kernel_begin(moved, read, graph=info, kernel=j)."""
        inst = self._current.get(info.gid)
        if not self._active or inst is None:
            return
        for t, i in zip([*moved, *read], inst.op_ids[j]):
            if i is not None:
                self._bind(i, t)
        self._kernel(inst.offset + j, info.names[j], inst.op_ensure[j])

    def _bind(self, i: int, t: torch.Tensor, between_regions: bool = False) -> None:
        if not self._rt.bind(i, t.untyped_storage()) and self._active:
            self._diverge(f"tensor {i} has another size than in the trace", between_regions)

    def _kernel(self, k: int, name: str, ensure) -> None:
        """The runtime is told what the code holds up to the next point
        (StepPlan.point_max, every bound tensor counted), then
        kernel_begin(k), then what kernel k reads is made resident.  The
        runtime counts the resident bytes against the capacity."""
        rt = self._rt
        if rt._writing:
            rt._settle_writes()  # a storage freed while its write is in flight is let go once written
        if rt._deaths:
            rt._drain_deaths()  # tensors Inductor's code freed: unbound, not resident
        L.check(L.tio_runtime_account_program(rt._p, self._entry.point_max[k]))
        if k in rt._offload_at:
            rt._check_offloads(k)
        rc = L.check(L.tio_runtime_kernel_begin(rt._p, k, name.encode()))
        if rt._writing:
            rt._settle_writes(done_by=k)
        for i in ensure:
            if i in rt._bound:
                L.check(L.tio_runtime_ensure_resident(rt._p, i, None))
        if rc == 1:
            self._diverge(f"the runtime found kernel {k} is not '{name}'")
            return
        if self._curve_points is not None:
            self._curve_points.append((k, rt.stats()["resident_bytes"]))

    def _diverge(self, why: str, between_regions: bool = False) -> None:
        """The step leaves its plan.  Between regions (a region the plan
        does not expect, an input of another size, the step ending early)
        the rest of the step goes on under a pager that keeps the capacity,
        as a profiled step does: the runtime hands it every tensor where it
        is (an offloaded one with its stored copy), eager code goes through
        it operator by operator and each region's code statement by
        statement (compile.paging), and at the step's end the runtime takes
        the global tensors back where the pager left them.  Inside a
        region's code (a call that finds another kernel than the trace's),
        or where no pager can be made, the runtime's iteration ends there,
        every tensor is fetched back and the rest of the step runs without
        teraio."""
        rt = self._rt
        self._active = False
        self._curve_points = None
        if between_regions and self._off_plan is not None and self._pager_off is None and rt._start_paging():
            self._warn(("diverged", self._entry.sequence, why),
                       f"teraio: the compiled step left its plan ({why}); the rest of the step keeps the "
                       f"capacity on demand")
            self._rec = Recorder(self.model, self.optimizer, self.name, pager=rt._paging)
            return
        self._warn(("diverged", self._entry.sequence, why),
                   f"teraio: the compiled step left its plan ({why}); offloaded tensors are fetched back "
                   f"and the rest of the step runs without teraio")
        self._end_iteration()
        rt.fetch_all()
        rt._guard_off()

    def _warn(self, key, msg: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning("%s", msg)

    # -- the driver's part of the session -----------------------------------------
    def _make_runtime(self, entry: StepPlan) -> _GraphRuntime:
        """The plan's runtime, handed the profiled steps' global tensors;
        the graphs' variants with the plan's calls compiled."""
        rt = self._runtime_from_pager(lambda pager: _GraphRuntime(
            self.model, self.optimizer, entry.trace, entry.plan, self._engine, staging=self.staging,
            safe=self.safe, pager=pager))
        for info in {x.info.gid: x.info for x in entry.instances}.values():
            self._variant(info, entry)
        return rt

    def _profiling_pager(self) -> Pager | None:
        """The session's pager (Session._profiling_pager); where there can be
        none, said once: the profiled steps hold all their memory."""
        if self._pager_off is not None:
            self._warn(("no pager",), f"teraio: the profiled steps hold all their memory ({self._pager_off})")
        return super()._profiling_pager()

    def _end_iteration(self) -> None:
        """The runtime's iteration ends (intermediate tensors come back and
        are unbound; the runtime checks the step ran all its kernels)."""
        it, self._iteration = self._iteration, None
        if it is not None:
            it.__exit__(None, None, None)

    def _close_runtime(self) -> None:
        self._end_iteration()
        super()._close_runtime()

    def _plan_profile(self, key, prof: Profile, capacity_of) -> StepPlan:
        if not prof.sequence:
            raise Unplannable("no compiled region ran in the profiled step (Module.compile() compiles nothing "
                              "for some built-in modules, such as nn.Linear alone: compile a module of "
                              "your own, or call torch.compile with session.backend; and Dynamo runs the "
                              "model eagerly inside a dispatch mode of the program's whose "
                              "ignore_compile_internals() is not True)")
        bad = next((x.info for x in prof.instances if x.info.unplannable), None)
        if bad is not None:
            raise Unplannable(f"graph {bad.key} ({bad.kind}): {bad.unplannable}")
        trace = Trace.build(self.name, prof.tensors, prof.kernels)
        lt = Lifetime(trace)
        cap = capacity_of(lt)
        self._engine_for(lt, trace)
        # Plan, compile the calls in, measure the plan on the code that will
        # run (StepPlan.use_code).  Where the code holds more than the trace
        # said, the trace gets a tensor of the difference over those kernels
        # and the planner plans again (a few rounds at most).
        extra: dict[tuple[int, int], int] = {}
        for _ in range(5):
            try:
                plan = self._build_plan(trace, lt, cap, kinds=MOVABLE_KINDS)
            except L.TeraioError as e:
                raise NoPlan(cap, e) from e
            entry = StepPlan(prof, trace, lt, plan, cap)
            entry.use_code(lambda info: getattr(self._variant(info, entry), "source_code", None))
            if entry.expected_peak() <= cap or not plan.fits or not entry.excess:
                break
            for a, b, nbytes in entry.excess:
                extra[(a, b)] = extra.get((a, b), 0) + nbytes
            trace = Trace.build(self.name, *with_extra(prof, extra))
            lt = Lifetime(trace)
        if not plan.fits:
            # The eager path's planner refuses a capacity below its floor; here what Inductor's
            # code holds inside a graph cannot move, so a capacity above the trace's floor can
            # still be out of reach.  Running over it would break the promise (a memory limit
            # kills the job): refused.
            raise NoPlan(cap, f"the compiled step's plan for it reaches {plan.planned_peak_bytes} bytes "
                              f"({plan.planned_peak_bytes / 2**20:.2f} MiB): tensors inside a compiled graph "
                              f"cannot move (only parameters, gradients, optimizer states and the activations "
                              f"a forward graph saves for its backward do), and the SSD's bandwidth bounds "
                              f"what moves in time; give a larger capacity, or compile=False, whose floor is "
                              f"the most one operator touches (docs/compile.md, 'Limits')")
        if entry.expected_peak() > cap:
            log.warning("teraio: the compiled step's plan for capacity %d bytes does not fit on Inductor's "
                        "code: planned peak %d, on the code %d", cap, plan.planned_peak_bytes,
                        entry.expected_peak())
        log.info("teraio: a compiled step of %d regions: %d kernel_begin calls, %d on Inductor's code",
                 len(prof.sequence), entry.n_ops, entry.expected_peak())
        return entry

    def _start_step(self) -> None:
        self._observed = []
        self._pos = 0
        self._current.clear()

    def _profile_begin(self) -> None:
        self._start_step()
        rec = Recorder(self.model, self.optimizer, self.name, pager=self._profiling_pager())
        rec.mode.__enter__()
        self._rec = rec

    def _profile_end(self, exc):
        rec, self._rec = self._rec, None
        rec.mode.__exit__(None, None, None)
        if rec.pager is not None:
            # global tensors stay where they are (the guard fetches them between
            # steps); everything else still alive comes back: the program owns it
            rec.pager.end_step([t.untyped_storage() for t, _, _ in global_tensors(self.model, self.optimizer)])
        if exc[0] is not None:
            return None
        prof = rec.finish()
        return prof.sequence, prof

    def _run_begin(self) -> None:
        self._start_step()
        self._begin_plan()
        if self._pager_off is None:
            self._off_plan = _OffPlanMode(self)
            _push_mode(self._off_plan)

    def _run_end(self, exc):
        active, self._active = self._active, False
        entry = self._entry
        if exc[0] is None and active and self._pos != len(entry.sequence):
            # ended early: the runtime's iteration ends keeping the global tensors where
            # they are (a pager takes them and gives them back), not all fetched back
            self._active = True
            self._diverge(f"the step ended after {self._pos} of the plan's {len(entry.sequence)} regions",
                          between_regions=True)
            self._active = active = False
        self._rec = None  # the paged rest of a step that left its plan ends
        mode, self._off_plan = self._off_plan, None
        if mode is not None:
            _remove_mode(mode)
        self._end_iteration()
        if exc[0] is not None:
            return None, False
        seq = tuple(self._observed)
        followed = active and seq == entry.sequence
        if followed:
            self._fill_curve()
        return seq, followed

    def _plain_begin(self) -> None:
        self._start_step()

    def _plain_end(self, exc):
        return tuple(self._observed)

    def _fill_curve(self) -> None:
        """The resident bytes per kernel of the step just run (the runtime's,
        at the point each kernel falls in), into the list record_curve gave."""
        points, self._curve_points = self._curve_points, None
        if points is None or self._curve is None:
            return
        resident, x = 0, 0
        for k in range(self._entry.trace.n_kernels):
            while x < len(points) and points[x][0] <= k:
                resident = points[x][1]
                x += 1
            self._curve.append(resident)
        self._curve = None

    # -- public -----------------------------------------------------------------
    def record_curve(self, curve: list) -> None:
        """Append the resident bytes at each kernel of the next planned step
        to `curve` (left empty if that step does not follow its plan)."""
        self._curve = curve


CompiledOffload = CompiledSession  # the name before teraio.torch.session
