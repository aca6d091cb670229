"""teraio.torch.compile: offloading inside the compiled program.

    off = teraio.torch.compile.CompiledOffload(model, optimizer, capacity=0.5, ssd=["/mnt/nvme0/x"])
    for batch in data:
        with off.step():
            loss = model(batch); loss.backward(); optimizer.step()

The model is compiled with :attr:`CompiledOffload.backend`, which is
Inductor (``compile_fx``) with teraio's hook on the graphs AOTAutograd hands
Inductor (forward, backward, inference); other functions compiled with the
same backend (``torch.compile(optimizer.step, backend=off.backend)``) take
part too.  Then:

1. **Profile** (``profile_iterations`` steps, default 2): the compiled code
   runs as Inductor made it; teraio.torch._compile_profile records the
   iteration as a trace (every graph node a kernel, timed; every stretch of
   eager code one kernel) and which graph ran where.
2. **Plan**: libteraio's planner for ``capacity`` (bytes, or a share of the
   profiled peak), moving only global tensors (parameters, gradients,
   optimizer state) and activations (saved by a forward graph for a
   backward graph): everything else is inside one graph or seen by eager
   code, which is not watched.  Each graph with a planned migration is
   compiled again with ``teraio::kernel_begin`` before the planned nodes
   (teraio.torch._compile_ops); the others keep their code.  The plan is
   then measured on the code that will run (_compile_plan, _compile_code)
   and made again where that code holds more than the trace said.
3. **Run**: every region call checks that it is the graph the plan expects
   at that place of the step; its ``kernel_begin`` calls drive the C
   runtime (``tio_runtime_kernel_begin`` at the plan's kernel indices,
   ``tio_runtime_ensure_resident`` for what the next node reads); at the
   end of a region the runtime is told that the eager kernel after it
   begins, and what that eager code reads is made resident first.  No
   Python runs per operator.
4. **Divergence**: a region the plan does not expect (a graph break taken
   another way, a recompile for new shapes, an eval pass) makes the step
   leave the plan: a warning, every tensor fetched back, the rest of the
   step runs as compiled without teraio.  After ``reprofile_after`` steps of
   the same new sequence of graphs it is profiled and planned; up to
   ``max_plans`` plans are kept by sequence and switched without profiling.

Kernel indices: the trace of a step is the concatenation, in run order, of
eager kernel, graph kernels, eager kernel, ...; a graph run at several
places of a step (a block compiled once, called per layer) has an instance
per place, each with its own offset and trace ids, and the ``kernel_begin``
calls carry the graph-local node index.

Resident bytes: the compiled program's own buffers are Inductor's; the
runtime holds only the tensors it moves.  The resident bytes at a point
(a ``kernel_begin`` call, an eager kernel) are the most the code of the
region holds until the next point (or the trace's memory, outside regions
and where the code cannot be read) less the bytes whose storage the runtime
has released: they change only where the runtime acts.
``peak_resident_bytes`` and ``over_capacity_kernels`` in :meth:`report` are
these.

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
import copy
import logging
import weakref

import torch
from torch._inductor.compile_fx import compile_fx, compile_fx_inner

from .. import _lib as L
from ..core import Engine, Lifetime, Plan, Trace
from . import _compile_ops
from ._compile_graph import GraphInfo
from ._compile_plan import StepPlan, with_extra
from ._compile_profile import EAGER, MOVABLE_KINDS, Instance, Profile, Recorder
from .offload import OffloadRuntime, _Guard
from .session import _PlanInUse

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


_compile_ops.set_handler(_dispatch_op)
_compile_ops.register_inductor_lowering()


class _RegionFn:
    """What teraio's inner compiler returns for a graph: the session decides
    at each call which compiled code runs (boxed calling convention)."""

    def __init__(self, session: "CompiledOffload", info: GraphInfo):
        self._boxed_call = True
        self._session = weakref.ref(session)
        self.info = info

    def __call__(self, args):
        s = self._session()
        if s is None:
            return self.info.plain(args)
        return s._run_region(self.info, args)


class _CompiledGuard(_Guard):
    """OffloadRuntime's guard between iterations (an operator that reads an
    offloaded tensor fetches it first), transparent to torch.compile:
    Dynamo compiles and runs compiled code under it."""

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True


class _GraphRuntime(OffloadRuntime):
    """The eager path's runtime: the C runtime, its callbacks, global tensors
    bound by name, iteration begin and end, the guard between iterations
    and state_dict safety; without the per-operator dispatch mode (the
    compiled step reports its kernels through kernel_begin calls), and with
    the bytes it has released counted (the resident bytes of a compiled
    step are what the code holds less these)."""

    def __init__(self, *args, **kwargs):
        self.released_bytes = 0
        super().__init__(*args, **kwargs)
        self._mode = contextlib.nullcontext()
        self._guard = _CompiledGuard(self)

    def _release(self, ctx, tensor):
        rc = super()._release(ctx, tensor)
        if rc == 0:
            self.released_bytes += self.trace.tensor_bytes(tensor)
        return rc

    def _allocate(self, ctx, tensor, nbytes, addr):
        rc = super()._allocate(ctx, tensor, nbytes, addr)
        if rc == 0:
            self.released_bytes -= self.trace.tensor_bytes(tensor)
        return rc

    def _drain_deaths(self) -> None:
        for i, key in self._deaths:
            b = self._bound.get(i)
            if b is not None and b[0] == key and i in self._released:
                self.released_bytes -= self.trace.tensor_bytes(i)
        super()._drain_deaths()

    def bind(self, i: int, st) -> bool:
        """Bind storage `st` to id `i` unless it is (a released storage is
        bound already); False if the runtime refused it (another size than
        the trace's: the step left the plan)."""
        b = self._bound.get(i)
        if (b is not None and b[0] == st._cdata) or not st.nbytes():
            return True
        self._ids.assign(st, i)
        return self._bind(i, st)


class CompiledOffload(_PlanInUse):
    """A compiled training job's offloading: profile, plan, run, re-plan
    (module text).  The options are teraio.torch.offload's:
    ``capacity`` bytes (int) or a share of the profiled peak (float in
    (0, 1]); ``ssd`` one or more directories; ``profile_iterations``,
    ``reprofile_after``, ``max_plans``, ``host_cap_bytes``,
    ``bandwidth_share``, ``space_bytes``, ``staging``, ``name``; ``safe``
    as OffloadRuntime's (between steps, operators that read an offloaded
    tensor and the model's and optimizer's ``state_dict()`` fetch it
    first).  Its own: ``compile_model`` (default True) calls
    ``model.compile(backend=self.backend, dynamic=False)``, else compile
    what you like with :attr:`backend`; ``ssd_gbps``: the (read, write)
    GB/s the planner assumes (default: measured through the engine; a plan
    assuming more than the SSD gives waits at its deadlines, never more
    memory).  After :meth:`close` the model stays compiled; its graphs run
    as Inductor compiled them."""

    def __init__(self, model: torch.nn.Module, optimizer=None, capacity=0.5, ssd=None, *,
                 profile_iterations: int = 2, reprofile_after: int = 2, max_plans: int = 4,
                 host_cap_bytes: int = 0, bandwidth_share: float = 0.7, space_bytes: int | None = None,
                 staging: bool | None = None, compile_model: bool = True, name: str | None = None,
                 ssd_gbps: tuple[float, float] | None = None, safe: bool = True):
        if isinstance(capacity, bool) or not isinstance(capacity, (int, float)):
            raise TypeError(f"capacity must be bytes (int) or a share of the peak (float), got {capacity!r}")
        if isinstance(capacity, float) and not 0 < capacity <= 1:
            raise ValueError(f"capacity as a share of the peak must be in (0, 1], got {capacity}")
        if isinstance(capacity, int) and capacity <= 0:
            raise ValueError(f"capacity must be > 0 bytes, got {capacity}")
        if isinstance(ssd, (str, bytes)) or not ssd:
            raise ValueError("ssd must be a list of one or more directories")
        for what, v in (("profile_iterations", profile_iterations), ("reprofile_after", reprofile_after),
                        ("max_plans", max_plans)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{what} must be an integer >= 1, got {v!r}")
        self.model, self.optimizer = model, optimizer
        self.capacity, self.ssd = capacity, [str(d) for d in ssd]
        self.profile_iterations, self.reprofile_after, self.max_plans = profile_iterations, reprofile_after, max_plans
        self.host_cap_bytes, self.bandwidth_share = host_cap_bytes, bandwidth_share
        self.space_bytes, self.staging = space_bytes, staging
        self.name = name or type(model).__name__
        self._plans: dict[tuple, StepPlan] = {}
        self._seen: dict[tuple, int] = {}   # sequences without a plan: steps that ran them
        self._unplannable: dict[tuple, str] = {}
        self._profile_left = profile_iterations
        self._rec: Recorder | None = None
        self._entry: StepPlan | None = None     # the plan the current/next step runs
        self._rt: _GraphRuntime | None = None
        self._engine: Engine | None = None
        self._gbps: tuple[float, float] | None = tuple(ssd_gbps) if ssd_gbps else None
        self._in_step = False
        self._active = False                  # the step follows self._entry
        self._pos = 0
        self._observed: list[str] = []
        self._current: dict[int, Instance] = {}
        self._peak = 0
        self._over = (0, 0)                   # kernels over the capacity, largest excess
        self._counts = {"profiled": 0, "planned": 0, "diverged": 0, "reprofiles": 0, "switches": 0}
        self._totals: dict[str, int] = {}
        self._warned: set = set()
        self._curve: list | None = None
        self._curve_points: list | None = None
        self._closed = False
        self.safe = safe
        self._iteration = None                # the runtime's iteration of the step running
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
        saved = copy.deepcopy(gm)
        plain = compile_fx_inner(gm, example_inputs, **kwargs)
        info = GraphInfo(len(_graphs), saved, kind)
        info.plain = plain
        info.variants = {}
        info.compile_args = (example_inputs, kwargs, torch._guards.TracingContext.try_get(),
                             torch._guards.CompileContext.try_get())
        _graphs.append((info, weakref.ref(self)))
        return _RegionFn(self, info)

    def _variant(self, info: GraphInfo, entry: StepPlan):
        """The compiled code of `info` under `entry`'s plan: Inductor's own
        where the plan has no call in it, else compiled with the
        ``kernel_begin`` calls (once per set of calls)."""
        ops = entry.ops.get(info.key)
        if not ops:
            return info.plain
        key = tuple((j, tuple(mv), tuple(rd)) for j, (mv, rd) in sorted(ops.items()))
        fn = info.variants.get(key)
        if fn is None:
            example_inputs, kwargs, tctx, cctx = info.compile_args
            gm = info.with_ops(ops)
            ctx = torch._guards.tracing(tctx) if tctx is not None else contextlib.nullcontext()
            cc = torch._guards.compile_context(cctx) if cctx is not None else contextlib.nullcontext()
            # Inductor's peak-memory reordering moves nodes it has no
            # dependency for: the calls must stay where the plan put them
            # (it orders the kernels, it does not change them).
            with ctx, cc, torch._inductor.config.patch(reorder_for_peak_memory=False):
                fn = compile_fx_inner(gm, example_inputs, **kwargs)
            info.variants[key] = fn
        return fn

    # -- regions ----------------------------------------------------------------
    def _run_region(self, info: GraphInfo, args):
        if not self._in_step:
            if self._rt is not None and self._rt.released_bytes:
                self._fetch_back()
            return info.plain(args)
        self._observed.append(info.key)
        if self._rec is not None:
            return self._rec.region(info, info.plain, args)
        if not self._active:
            return info.plain(args)
        entry, p = self._entry, self._pos
        if p == 0 and entry.sequence[0] != info.key:
            entry = self._switch_at_first_region(info) or entry
        self._pos += 1
        if p >= len(entry.sequence) or entry.sequence[p] != info.key:
            why = (f"region {p} is graph {info.key} ({info.kind}), the plan has "
                   + (f"graph {entry.sequence[p]}" if p < len(entry.sequence) else "no more regions"))
            self._diverge(why)
            return info.plain(args)
        inst = entry.instances[p]
        self._current[info.gid] = inst
        for pos, i in inst.bind_in:
            self._bind(i, args[pos])
        fn = self._variant(info, entry)
        out = fn(args)
        for pos, i in inst.bind_out:
            self._bind(i, out[pos])
        self._kernel(inst.eager_kernel, EAGER, inst.eager_ensure)
        return out

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

    def _bind(self, i: int, t: torch.Tensor) -> None:
        if not self._rt.bind(i, t.untyped_storage()) and self._active:
            self._diverge(f"tensor {i} has another size than in the trace")

    def _kernel(self, k: int, name: str, ensure) -> None:
        """The runtime's kernel_begin(k), then what kernel k reads made
        resident, then the resident bytes up to the next point accounted."""
        rt = self._rt
        if rt._deaths:
            rt._drain_deaths()  # tensors Inductor's code freed: unbound, not resident
        rc = L.check(L.tio_runtime_kernel_begin(rt._p, k, name.encode()))
        for i in ensure:
            if i in rt._bound:
                L.check(L.tio_runtime_ensure_resident(rt._p, i, None))
        if rc == 1:
            self._diverge(f"the runtime found kernel {k} is not '{name}'")
            return
        resident = self._entry.point_max[k] - rt.released_bytes
        if self._curve_points is not None:
            self._curve_points.append((k, rt.released_bytes))
        self._peak = max(self._peak, resident)
        over = resident - self._entry.capacity_bytes
        if over > 0:
            self._over = (self._over[0] + 1, max(self._over[1], over))

    def _diverge(self, why: str) -> None:
        self._warn(("diverged", self._entry.sequence, why),
                   f"teraio: the compiled step left its plan ({why}); offloaded tensors are fetched back "
                   f"and the rest of the step runs without teraio")
        self._active = False
        self._counts["diverged"] += 1
        self._fetch_back()

    def _fetch_back(self) -> None:
        self._rt.fetch_all()

    def _warn(self, key, msg: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning("%s", msg)

    # -- the runtime --------------------------------------------------------------
    def _use(self, entry: StepPlan) -> None:
        """Run `entry`'s plan from the next step on."""
        if self._entry is entry and self._rt is not None:
            return
        if self._rt is not None:
            self._counts["switches"] += 1
        self._close_runtime()
        self._entry = entry
        self._rt = _GraphRuntime(self.model, self.optimizer, entry.trace, entry.plan, self._engine,
                                 staging=self.staging, safe=self.safe)
        for info in {x.info.gid: x.info for x in entry.instances}.values():
            self._variant(info, entry)

    def _end_iteration(self) -> None:
        """The runtime's iteration ends (intermediate tensors come back and
        are unbound; the runtime checks the step ran all its kernels)."""
        it, self._iteration = self._iteration, None
        if it is not None:
            it.__exit__(None, None, None)

    def _close_runtime(self) -> None:
        self._end_iteration()
        if self._rt is not None:
            for k, v in self._rt.stats().items():
                if isinstance(v, bool):
                    continue
                self._totals[k] = self._totals.get(k, 0) + v
            self._rt.close()
            self._rt = None

    def _capacity_for(self, lt: Lifetime) -> int:
        if isinstance(self.capacity, float):
            return max(1, int(lt.peak_bytes * self.capacity))
        return self.capacity

    def _engine_for(self, lt: Lifetime, trace: Trace) -> Engine:
        need = self.space_bytes or 2 * lt.peak_bytes + 4096 * trace.n_tensors + (64 << 20)
        if self._engine is None or getattr(self, "_engine_space", 0) < need:
            self._close_runtime()
            if self._engine is not None:
                self._engine.close()
            self._engine = Engine(self.ssd, need)
            self._engine_space = need
            if self._gbps is None:
                self._gbps = self._engine.measure_gbps(min(256 << 20, max(16 << 20, lt.peak_bytes // 4)))
        return self._engine

    def _plan(self, prof: Profile) -> None:
        bad = next((x.info for x in prof.instances if x.info.unplannable), None)
        if bad is not None:
            self._unplannable[prof.sequence] = f"graph {bad.key} ({bad.kind}): {bad.unplannable}"
            self._warn(("unplannable", prof.sequence),
                       f"teraio: a compiled step cannot be planned ({self._unplannable[prof.sequence]}); "
                       f"it runs without teraio")
            return
        trace = Trace.build(self.name, prof.tensors, prof.kernels)
        lt = Lifetime(trace)
        cap = self._capacity_for(lt)
        self._engine_for(lt, trace)
        rg, wg = self._gbps
        # Plan, compile the calls in, measure the plan on the code that will
        # run (StepPlan.use_code).  Where the code holds more than the trace
        # said, the trace gets a tensor of the difference over those kernels
        # and the planner plans again (a few rounds at most).
        extra: dict[tuple[int, int], int] = {}
        for _ in range(5):
            try:
                plan = Plan.build(trace, lt, cap, ssd_read_gbps=rg * self.bandwidth_share,
                                  ssd_write_gbps=wg * self.bandwidth_share, host_cap_bytes=self.host_cap_bytes,
                                  kinds=MOVABLE_KINDS)
            except L.TeraioError as e:
                if not self._plans:
                    raise ValueError(f"teraio: no plan for the compiled step at capacity {cap} bytes: {e}") from e
                self._unplannable[prof.sequence] = str(e)
                self._warn(("unplannable", prof.sequence),
                           f"teraio: a compiled step cannot be planned ({e}); it runs without teraio")
                return
            entry = StepPlan(prof, trace, lt, plan, cap)
            entry.use_code(lambda info: getattr(self._variant(info, entry), "source_code", None))
            if entry.expected_peak() <= cap or not plan.fits or not entry.excess:
                break
            for a, b, nbytes in entry.excess:
                extra[(a, b)] = extra.get((a, b), 0) + nbytes
            trace = Trace.build(self.name, *with_extra(prof, extra))
            lt = Lifetime(trace)
        if not plan.fits or entry.expected_peak() > cap:
            log.warning("teraio: the compiled step's plan for capacity %d bytes does not fit: planned peak %d, "
                        "on Inductor's code %d", cap, plan.planned_peak_bytes, entry.expected_peak())
        self._plans[prof.sequence] = entry
        while len(self._plans) > self.max_plans:
            old = next(iter(self._plans))
            if self._plans[old] is self._entry:
                break
            del self._plans[old]
        self._seen.pop(prof.sequence, None)
        log.info("teraio: planned a compiled step of %d regions: %d kernels, peak %d bytes, capacity %d, "
                 "planned %d (%d on Inductor's code), %d migrations, %d kernel_begin calls",
                 len(prof.sequence), trace.n_kernels, lt.peak_bytes, cap, plan.planned_peak_bytes,
                 entry.expected_peak(), plan.n_migrations, entry.n_ops)
        self._use(entry)

    # -- steps ------------------------------------------------------------------
    def step(self):
        """Context manager around one training step (forward, backward,
        optimizer step)."""
        return _Step(self)

    def _enter(self) -> None:
        if self._closed:
            raise RuntimeError("teraio: CompiledOffload is closed")
        if self._in_step:
            raise RuntimeError("teraio: step() is already running")
        self._in_step = True
        self._observed = []
        self._pos = 0
        self._current.clear()
        if self._rt is not None:
            self._begin_plan()
        elif self._profile_left > 0:
            self._rec = Recorder(self.model, self.optimizer, self.name)
            self._rec.mode.__enter__()
        # else: no plan for what runs now (it could not be planned): the step
        # runs as compiled, and _exit looks for one again.

    def _exit(self, failed: bool) -> None:
        self._in_step = False
        rec, self._rec = self._rec, None
        if rec is not None:
            rec.mode.__exit__(None, None, None)
            if failed:
                return
            self._counts["profiled"] += 1
            self._profile_left -= 1
            if self._profile_left == 0:
                self._plan(rec.finish())
            return
        active, self._active = self._active, False
        if failed:
            self._end_iteration()
            return
        entry = self._entry
        if active and self._pos != len(entry.sequence):
            self._active = True
            self._diverge(f"the step ended after {self._pos} of the plan's {len(entry.sequence)} regions")
            self._active = False
        self._end_iteration()
        seq = tuple(self._observed)
        if active and entry is not None and seq == entry.sequence:
            self._counts["planned"] += 1
            entry.iterations += 1
            self._fill_curve()
        self._choose_next(seq)

    def _choose_next(self, seq: tuple) -> None:
        """After a step that ran the graphs `seq`: that sequence's plan for
        the next step, or a profile when it has none and was seen
        reprofile_after times.  (A step that starts with another plan's
        first graph switches to it there: _switch_at_first_region.)"""
        if seq in self._plans:
            self._use(self._plans[seq])
            return
        if seq in self._unplannable:
            return
        self._seen[seq] = self._seen.get(seq, 0) + 1
        if self._seen[seq] >= self.reprofile_after:
            self._close_runtime()
            self._entry = None
            self._profile_left = 1
            self._counts["reprofiles"] += 1

    def _fill_curve(self) -> None:
        """The resident bytes per kernel of the step just run, into the list
        record_curve gave."""
        points, self._curve_points = self._curve_points, None
        if points is None:
            return
        curve = self._entry.lifetime.memory_curve()
        released, x = 0, 0
        for k, m in enumerate(curve):
            while x < len(points) and points[x][0] <= k:
                released = points[x][1]
                x += 1
            self._curve.append(m - released)
        self._curve = None

    # -- public -----------------------------------------------------------------
    def record_curve(self, curve: list) -> None:
        """Append the resident bytes at each kernel of the next planned step
        to `curve` (left empty if that step does not follow its plan)."""
        self._curve = curve

    def _in_use(self):
        return self._entry

    @property
    def runtime(self) -> OffloadRuntime | None:
        """The runtime of the plan the steps run (None while profiling)."""
        return self._rt

    def fetch_all(self) -> None:
        """Bring every offloaded tensor back now."""
        if self._rt is not None:
            self._fetch_back()

    def report(self) -> dict:
        """What was profiled, planned and moved, and what it cost: the
        runtime's counters summed over the runtimes of the session, then
        the compiled path's own (resident peak, kernels over the capacity,
        step counts), which take precedence."""
        out = dict(self._totals)
        if self._rt is not None:
            for k, v in self._rt.stats().items():
                if not isinstance(v, bool):
                    out[k] = out.get(k, 0) + v
        for k in ("resident_bytes", "capacity_bytes", "diverged_kernel"):
            out.pop(k, None)
        out.update({"mode": "compiled", "steps": self._counts["profiled"] + self._counts["planned"]
                    + self._counts["diverged"],
                    "profiled_iterations": self._counts["profiled"],
                    "planned_iterations": self._counts["planned"],
                    "diverged_iterations": self._counts["diverged"],
                    "reprofiles": self._counts["reprofiles"], "plan_switches": self._counts["switches"],
                    "plans": [e.describe() for e in self._plans.values()],
                    "unplannable": list(self._unplannable.values()), "ssd_dirs": self.ssd,
                    "peak_resident_bytes": self._peak, "over_capacity_kernels": self._over[0],
                    "over_capacity_bytes_max": self._over[1], "stall_s": out.get("stall_ns", 0) / 1e9})
        return self._report_io(out)

    def close(self) -> None:
        """Bring everything back and release the engine and its files."""
        if self._closed:
            return
        self._close_runtime()
        if self._engine is not None:
            self._engine.close()
            self._engine = None
        self._closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _Step:
    def __init__(self, off: CompiledOffload):
        self.off = off

    def __enter__(self):
        self.off._enter()
        return self.off

    def __exit__(self, *exc):
        self.off._exit(exc[0] is not None)
        return False
