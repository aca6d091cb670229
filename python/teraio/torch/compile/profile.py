"""Profiling a compiled training step: the trace of one iteration.

An iteration of a compiled program is compiled regions (each run of an
AOTAutograd forward, backward or inference graph) with eager code between
them (the optimizer step, ``zero_grad``, autograd's gradient accumulation,
a graph break's Python).  The trace has, in the order they ran:

* one **eager kernel** per stretch of eager code between two regions (and
  before the first and after the last), named ``teraio.eager``.  A dispatch
  mode that lets compiled code through (``ignore_compile_internals``) sees
  its operators during profiling only; the kernel accesses every tensor
  they touch and lasts as long as they ran.  Tensors born and dead inside
  one stretch (the optimizer's temporaries) become one tensor of the
  stretch's peak of such bytes, so the kernel does not hold them all at
  once;
* the **graph's kernels** for each region run (compile.graph.GraphInfo),
  timed node by node by an interpreter over the graph on the same inputs
  (before the compiled code runs, on copies of what the graph writes, with
  the random state put back), the times scaled so that they add up to the
  compiled run's measured time.

**Within the capacity** (a pager given, teraio.torch.pager: CPU tensors):
the profiled steps keep the capacity as the eager path's do.  Eager code's
operators go through the pager (a storage used is brought back, room is
made for what an operator makes, what it makes is tracked).  A compiled
region runs Inductor's own code with its Python wrapper paged statement by
statement (compile.paging): the same kernels, so the same numbers as plain
``torch.compile``, and node times from the code's statements without the
pager's moves; no second run of the graph is made.

Tensors: global tensors first (parameters, buffers, gradients, optimizer
state, by name: teraio.torch._ids), then every other storage in order of
first appearance; a region's new storages get ids when the region runs,
and the real output tensors are matched to them.  A storage a forward graph
makes and a backward graph reads is an activation.  Only global tensors and
activations may move in the compiled path: every other tensor is either
inside one graph (Inductor's business) or visible to eager code that the
runtime does not watch.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.fx as fx
from torch.utils._python_dispatch import TorchDispatchMode

from ...core import KINDS, READ, WRITE
from .graph import GraphInfo
from .._ids import StorageIds, global_tensors, iter_tensors
from ..pager import new_output_bytes
from ..profiler import kernel_name

EAGER = "teraio.eager"
MOVABLE_KINDS = ("parameter", "gradient", "optimizer_state", "activation")

_view_ops: dict = {}


def _is_view(func) -> bool:
    """An operator whose results all alias its arguments and that writes
    nothing: it touches no bytes."""
    try:
        return _view_ops[func]
    except KeyError:
        schema = getattr(func, "_schema", None)
        v = bool(schema and schema.returns
                 and all(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)
                 and not any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments))
        _view_ops[func] = v
        return v


class _EagerMode(TorchDispatchMode):
    """Records the operators of eager code; compiled code passes through.
    With a pager, each operator goes through it first (what it reads is
    brought back, room is made for what it makes, what it makes is
    tracked), as on the eager path (teraio.torch.profiler)."""

    def __init__(self, rec: "Recorder"):
        super().__init__()
        self.rec = rec

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        rec = self.rec
        name = kernel_name(func)
        if rec.in_region or name is None:
            return func(*args, **kwargs)
        pager = rec.pager
        collective = name.startswith("c10d.")
        if pager is not None:
            pager.operator_begin(args, kwargs, collective, lambda: new_output_bytes(func, args, kwargs))
        if _is_view(func):
            return func(*args, **kwargs)
        for t in iter_tensors((args, kwargs)):
            rec.eager_use(t.untyped_storage(), READ)
        t0 = time.perf_counter_ns()
        out = func(*args, **kwargs)
        rec.eager_ns += time.perf_counter_ns() - t0
        for t in iter_tensors(out):
            st = t.untyped_storage()
            if pager is not None:
                (pager.pin if collective else pager.track)(st)
            rec.eager_use(st, WRITE)  # its bytes, tracked before the next output can evict it
        return out


@dataclass
class Instance:
    """One run of a graph in the iteration: its first kernel's index and
    the trace id of each of its local storages (None: not a tensor, or no
    bytes)."""
    info: GraphInfo
    offset: int
    ids: list


@dataclass
class Profile:
    """A profiled iteration as plain data for Trace.build, plus where each
    region ran."""
    tensors: list            # (bytes, kind, global, name)
    kernels: list            # (name, duration_ns, [(id, mode)])
    instances: list          # Instance, in run order
    eager_kernels: list      # index of every eager kernel
    sequence: tuple = field(default=())  # graph keys in run order


class _Interpreter(fx.Interpreter):
    """Runs a graph node by node, timing each call_function node."""

    def __init__(self, gm, cuda: bool):
        super().__init__(gm, garbage_collect_values=True)
        self.times: list[int] = []
        self.cuda = cuda

    def run_node(self, n):
        if n.op != "call_function":
            return super().run_node(n)
        if self.cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        out = super().run_node(n)
        if self.cuda:
            torch.cuda.synchronize()
        self.times.append(time.perf_counter_ns() - t0)
        return out


def time_graph(info: GraphInfo, args: list) -> list[int]:
    """Each kernel's time (ns) in an eager run of the graph on `args`; the
    inputs the graph writes are copied first and the random state is put
    back after, so the training step sees nothing of this run."""
    args = list(args)
    for i in info.written_inputs:
        if isinstance(args[i], torch.Tensor):
            args[i] = args[i].clone()
    cuda = any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
    rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if cuda else None
    try:
        with torch.no_grad():
            interp = _Interpreter(info.gm, cuda)
            interp.run(*args)
    finally:
        torch.set_rng_state(rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
    return interp.times



class Recorder:
    """Records one iteration of a compiled program (module text)."""

    def __init__(self, model: torch.nn.Module, optimizer, name: str, pager=None):
        self.name = name
        self.pager = pager
        self.in_region = False
        self.ids = StorageIds(on_death=self._died)
        self.tensors: list[list] = []     # [bytes, kind, global, name]
        self.kernels: list[list] = []     # [name, ns, {id: mode}]
        self.phase: list[str] = []        # per kernel: "eager" or the graph's kind
        self.instances: list[Instance] = []
        self.eager_kernels: list[int] = []
        self._scratch: list[tuple[int, int]] = []  # (eager kernel, bytes)
        self._folded: set[int] = set()
        self._stretch = 0                 # eager stretches opened so far
        self._open_stretch()
        if pager is not None:
            pager.begin_step()
        for t, kind, tname in global_tensors(model, optimizer):
            st = t.untyped_storage()
            if pager is not None:
                pager.track(st, is_global=True)
            nbytes = self._nbytes(st)
            if nbytes == 0 or self.ids.lookup(st) is not None:
                continue
            self.ids.assign(st)
            self.tensors.append([nbytes, kind, True, tname])
        self.ids.n_global = self.ids.next_id
        self.mode = _EagerMode(self)

    # -- eager code -------------------------------------------------------------
    def _open_stretch(self) -> None:
        self.eager_acc: dict[int, int] = {}
        self.eager_ns = 0
        self._born: dict[int, int] = {}   # id -> bytes, born in this stretch
        self._events: list[tuple[int, int]] = []  # (id, +bytes / -bytes)

    def _nbytes(self, st) -> int:
        """`st`'s bytes, evicted or not."""
        return self.pager.nbytes(st) if self.pager is not None else st.nbytes()

    def _new_id(self, st, kind: str = "temporary", nbytes: int | None = None) -> int:
        i = self.ids.assign(st) if st is not None else self._next_free()
        self.tensors.append([nbytes if nbytes is not None else self._nbytes(st), kind, False, None])
        return i

    def _next_free(self) -> int:
        i = self.ids.next_id
        self.ids.next_id += 1
        return i

    def eager_use(self, st, mode: int) -> None:
        nbytes = self._nbytes(st)
        if nbytes == 0:
            return
        i = self.ids.lookup(st)
        if i is None:
            i = self._new_id(st)
            self._born[i] = nbytes
            self._events.append((i, nbytes))
        self.eager_acc[i] = self.eager_acc.get(i, 0) | mode

    def _died(self, i: int, key: int) -> None:
        nbytes = self._born.pop(i, None)
        if nbytes is not None and not self.in_region:
            self._events.append((i, -nbytes))
            self._folded.add(i)

    def _close_stretch(self) -> None:
        """The eager kernel of the stretch that ends here."""
        k = len(self.kernels)
        live = peak = 0
        for i, d in self._events:
            if i in self._folded:
                live += d
                peak = max(peak, live)
        acc = {i: m for i, m in self.eager_acc.items() if i not in self._folded}
        self.kernels.append([EAGER, self.eager_ns, acc])
        self.phase.append("eager")
        self.eager_kernels.append(k)
        if peak:
            self._scratch.append((k, peak))
        self._born.clear()
        self._stretch += 1

    # -- compiled regions -------------------------------------------------------
    def region(self, info: GraphInfo, fn, args: list, paged=None):
        """Run compiled graph `info` (callable `fn`, boxed `args`) and record
        it; with a pager, `paged` (compile.paging.PagedCode) runs instead
        where it can (else `fn`, with every input brought back first)."""
        self._close_stretch()
        self.in_region = True
        try:
            return self._region(info, fn, args, paged)
        finally:
            self.in_region = False
            self._open_stretch()

    def _region(self, info: GraphInfo, fn, args: list, paged):
        offset = len(self.kernels)
        ids: list = [None] * len(info.storage_bytes)
        inputs = list(args)
        slots: dict[int, int] = {}
        for i, a in enumerate(inputs):
            if isinstance(a, torch.Tensor) and a.layout == torch.strided:
                st = a.untyped_storage()
                if self.pager is not None:
                    slot = self.pager.slot(st)
                    slot = self.pager.track(st) if slot is None else slot
                    if slot is not None:
                        slots[i] = slot
                nbytes = self._nbytes(st)
                if nbytes:
                    ids[i] = self.ids.lookup(st)
                    if ids[i] is None:
                        ids[i] = self._new_id(st, nbytes=nbytes)
        if self.pager is None:
            times = time_graph(info, inputs)
            del inputs
            t0 = time.perf_counter_ns()
            out = fn(args)
            wall = time.perf_counter_ns() - t0
        else:
            pager = self.pager
            pager.drain()
            run = paged.call if paged is not None else None
            if run is None:
                # code that is not paged: everything it receives resident
                pager.kernel_begin()
                for i in slots:
                    pager.use(inputs[i].untyped_storage())
            del inputs
            if run is not None:
                paged.start(pager)
            t0 = time.perf_counter_ns()
            out = (run or fn)(args)
            wall = time.perf_counter_ns() - t0
            times = paged.finish() if run is not None else [wall // max(1, info.n_kernels)] * info.n_kernels
            pager.drain()
            for o in out:
                if isinstance(o, torch.Tensor) and o.layout == torch.strided and pager.slot(o.untyped_storage()) is None:
                    pager.track(o.untyped_storage())
        for s in range(info.n_inputs, len(info.storage_bytes)):
            if info.storage_bytes[s]:
                ids[s] = self._new_id(None, nbytes=info.storage_bytes[s])
        for pos, s in enumerate(info.outputs):
            o = out[pos] if pos < len(out) else None
            if s is None or s < info.n_inputs or not isinstance(o, torch.Tensor):
                continue
            st = o.untyped_storage()
            known = self.ids.lookup(st)
            nbytes = self._nbytes(st)
            if known is None and nbytes:
                if ids[s] is None:
                    ids[s] = self._new_id(None, nbytes=nbytes)
                self.ids.assign(st, ids[s])
                self.tensors[ids[s]][0] = nbytes
            elif known != ids[s] and info.unplannable is None:
                info.unplannable = f"output {pos} is not the tensor the graph says it makes"
        scale = wall / max(1, sum(times)) if self.pager is None else 1.0
        for j in range(info.n_kernels):
            acc = {}
            for s, m in info.accesses[j]:
                if ids[s] is not None:
                    acc[ids[s]] = acc.get(ids[s], 0) | m
            self.kernels.append([info.names[j], int(times[j] * scale), acc])
        self.phase += [info.kind] * info.n_kernels
        self.instances.append(Instance(info, offset, ids))
        return out

    # -- the trace --------------------------------------------------------------
    def finish(self) -> Profile:
        """Close the last stretch and return the iteration as a Profile:
        kinds settled (activations), folded temporaries replaced by one
        scratch tensor per stretch, tensors no kernel touches dropped and the
        rest numbered densely in the same order."""
        self._close_stretch()
        phases: dict[int, set] = {}
        for k, (_, _, acc) in enumerate(self.kernels):
            for i in acc:
                phases.setdefault(i, set()).add(self.phase[k])
        for i, ph in phases.items():
            t = self.tensors[i]
            if not t[2] and {"forward", "backward"} <= ph:
                t[1] = "activation"
        new_id: dict[int, int] = {}
        tensors = []
        for i, t in enumerate(self.tensors):
            if i in phases and i not in self._folded:
                new_id[i] = len(tensors)
                tensors.append(tuple(t))
        kernels = [(n, d, [(new_id[i], m) for i, m in acc.items()]) for n, d, acc in self.kernels]
        for k, nbytes in self._scratch:
            kernels[k][2].append((len(tensors), WRITE))
            tensors.append((nbytes, "temporary", False, None))
        instances = [Instance(x.info, x.offset, [new_id.get(i) if i is not None else None for i in x.ids])
                     for x in self.instances]
        assert all(t[1] in KINDS for t in tensors)
        return Profile(tensors, kernels, instances, list(self.eager_kernels),
                       tuple(x.info.key for x in instances))
