"""Where in Inductor's compilation teraio reads a graph and puts its calls.

Inductor rewrites a graph before it lowers it to kernels: its post-grad
passes remove no-op operators and run the pattern matcher (``mm`` + ``add``
into one ``addmm``, softmax into its online form, ...).  A call of
``teraio::kernel_begin`` is a mutation (it declares the tensors it moves
written), and the pattern matcher matches no pattern across a mutation.  So
calls put into the graph AOTAutograd hands Inductor would change Inductor's
rewrites, and with them its arithmetic: transformers' GPT-2 computes its
tied embedding's gradient as one ``addmm`` under plain Inductor, and with a
call between the ``mm`` and the ``add`` the two ran apart and rounded
otherwise.

teraio therefore reads each graph, and puts its calls in, at one point of
Inductor's compilation: its ``post_grad_custom_post_pass``, after the
rewrites and before what follows them (a topological sort, re-inplacing,
lowering, fusion, code generation).

* :func:`post_grad_graph` runs Inductor's compilation of a copy of a graph
  up to that point, takes the graph there (sorted, its fake values
  propagated again, since a rewrite may leave a node's stale) and stops.
* :func:`compile_with_ops` has Inductor compile the graph AOTAutograd gave
  with the calls put in at that point (GraphInfo.insert_ops), after
  checking that the graph there is the one teraio profiled, and with no
  kernel fused across a call that names what the kernel touches
  (:class:`_NoFusionAcrossCalls`).

Both bypass Inductor's FX graph cache (the pass has no cache key): an
artifact with calls names this process's graph numbers, and must not serve
another.  A user's own custom post passes run first.
"""
from __future__ import annotations

import contextlib
import copy

import torch
from torch._inductor import config
from torch._inductor.choices import InductorChoices
from torch._inductor.compile_fx import compile_fx_inner
from torch._inductor.custom_graph_pass import CustomGraphPass, get_custom_graph_passes
from torch._inductor.virtualized import V
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.fx.passes.fake_tensor_prop import FakeTensorProp
from torch._inductor.pattern_matcher import stable_topological_sort

from . import ops


class _Stop(Exception):
    """Raised by the capture once it has the graph: the rest of the
    compilation (lowering, code generation) is not needed."""


class _AtPostGrad(CustomGraphPass):
    """Inductor's custom post pass, acting on the top-level graph `gm` only
    (a higher-order operator's subgraph passes first)."""

    def __init__(self, gm: torch.fx.GraphModule, fn):
        self._gm, self._fn = gm, fn
        self.done = False
        self.error: ValueError | None = None  # what `fn` refused (Inductor wraps what a pass raises)

    def __call__(self, graph: torch.fx.Graph) -> None:
        if graph is not self._gm.graph and graph.owning_module is not self._gm:
            return
        self.done = True
        stable_topological_sort(graph)
        try:
            self._fn(graph)
        except ValueError as e:
            self.error = e
            raise

    def uuid(self):
        return None  # no cache key: Inductor's FX graph cache is bypassed


def check_post_grad_passes(who: str = "teraio.torch.offload(compile=True)") -> None:
    """Raises ValueError (naming `who`) if Inductor's post-grad passes are
    off: teraio reads and plans a graph where they leave it."""
    if not config.use_post_grad_passes:
        raise ValueError(f"{who}: torch._inductor.config.use_post_grad_passes is off; teraio reads and plans "
                         f"each graph as Inductor's post-grad passes leave it (docs/compile.md), so it cannot "
                         f"offload with them off")


@contextlib.contextmanager
def _with_pass(p: _AtPostGrad):
    check_post_grad_passes()
    theirs = get_custom_graph_passes(config.post_grad_custom_post_pass)
    with config.patch(post_grad_custom_post_pass=[*theirs, p]):
        yield


def post_grad_graph(gm: torch.fx.GraphModule, example_inputs, kwargs: dict) -> torch.fx.GraphModule:
    """The graph `gm` (which this consumes) as Inductor's post-grad passes
    leave it, compiled with compile_fx_inner's `kwargs`: a GraphModule whose
    every node has its fake value (it is `gm` itself, as the passes left it).
    Raises what Inductor raised before that point, and ValueError where the
    passes are off."""
    box: list[torch.fx.GraphModule] = []

    def capture(graph: torch.fx.Graph) -> None:
        m = graph.owning_module
        vals = [n.meta.get("val") for n in graph.nodes if n.op == "placeholder"]
        with torch.no_grad():
            FakeTensorProp(m, mode=V.fake_mode).propagate_dont_convert_inputs(*vals)
        m.recompile()  # its code (GraphInfo's fingerprint) as the passes left the graph
        box.append(m)  # Inductor stops here: nothing changes it after
        raise _Stop

    p = _AtPostGrad(gm, capture)
    try:
        with _with_pass(p):
            compile_fx_inner(gm, example_inputs, **kwargs)
    except Exception:
        if not box:
            raise
    if not box:
        raise RuntimeError("Inductor compiled the graph without handing it to its custom post pass")
    return box[0]


class _Calls:
    """The calls of the graph being compiled (compile_with_ops): which
    stretch between calls each node of the lowered graph is in (`seg`: the
    number of calls before it, by node name), and the buffers each call
    names (`names[c]`, for the c-th call, 1-based; filled as Inductor
    lowers them, in graph order)."""

    def __init__(self):
        self.seg: dict[str, int] = {}
        self.names: list[set[str]] = [set()]

    def read(self, graph: torch.fx.Graph) -> None:
        c = 0
        for n in graph.nodes:
            if n.op == "call_function" and n.target is ops.kernel_begin:
                c += 1
            self.seg[n.name] = c


_calls: _Calls | None = None   # the compilation running in compile_with_ops


def lowered_call(names) -> None:
    """Inductor lowered the next call, which names buffers `names`."""
    if _calls is not None:
        _calls.names.append(set(names))


ops.set_lowering_listener(lowered_call)


def _origins(node) -> list:
    return [o for s in node.get_nodes() if s.node is not None for o in s.node.origins]


class _NoFusionAcrossCalls(InductorChoices):
    """Inductor's choices, but no kernel fuses operators from both sides of
    a call that names a buffer the kernel reads or writes.

    Needed for the calls' ordering: Inductor orders a call after the
    earlier readers of what it names (its mutation dependencies), but its
    check that a fusion creates no cycle passes over those ordering-only
    dependencies, and a read of a graph input after the call is scheduled
    as if the input were always there.  Measured on transformers' Llama's
    backward (PyTorch 2.13): RMSNorm's gradient, a reduction with a
    pointwise tail, fused ``sum(x * add_14)`` (before a call naming
    ``add_14``) with ``add_14 * 2`` (after it) into one kernel that ran
    before the call, so it read ``add_14`` after the call had released it."""

    @staticmethod
    def can_fuse(scheduler, node1, node2, shared_data_score: int) -> bool:
        if not InductorChoices.can_fuse(scheduler, node1, node2, shared_data_score):
            return False
        calls = _calls
        if calls is None:
            return True
        segs = [calls.seg[o.name] for n in (node1, node2) for o in _origins(n) if o.name in calls.seg]
        if not segs or min(segs) == max(segs):
            return True
        real = scheduler.mutation_real_name
        touched = {real.get(d.name, d.name) for n in (node1, node2)
                   for d in (*n.read_writes.reads, *n.read_writes.writes)}
        return not any(calls.names[c] & touched for c in range(min(segs) + 1, min(max(segs) + 1, len(calls.names))))


def copy_graph(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A deep copy of `gm` made outside Inductor's fake mode: an inference
    graph keeps real constants (transformers' GPT-2 in eval: empty tensors
    as attributes), and copying them under the fake mode raised "Attempted
    to set the storage of a tensor on device meta to a storage on different
    device cpu"."""
    with unset_fake_temporarily():
        return copy.deepcopy(gm)


def compile_with_ops(info, ops: dict) -> object:
    """Inductor's compiled code of graph `info` (a GraphInfo with its
    ``source`` and ``compile_args``) with ``teraio::kernel_begin`` calls
    before the kernels of `ops` (GraphInfo.insert_ops).  Inductor's
    peak-memory reordering is off for it: it moves nodes it has no
    dependency for, and the calls must stay where the plan put them (it
    orders kernels, it does not change them).  Raises ValueError if the
    graph at the post-grad point is not the one profiled, or if the passes
    are off; otherwise what Inductor raises."""
    example_inputs, kwargs, tctx, cctx = info.compile_args
    gm = copy_graph(info.source)
    global _calls
    calls = _Calls()

    def put_in(graph: torch.fx.Graph) -> None:
        info.insert_ops(graph, ops)
        calls.read(graph)

    p = _AtPostGrad(gm, put_in)
    ctx = torch._guards.tracing(tctx) if tctx is not None else contextlib.nullcontext()
    cc = torch._guards.compile_context(cctx) if cctx is not None else contextlib.nullcontext()
    outer, _calls = _calls, calls
    try:
        with ctx, cc, config.patch(reorder_for_peak_memory=False), _with_pass(p), \
                V.set_choices_handler(_NoFusionAcrossCalls()):
            fn = compile_fx_inner(gm, example_inputs, **kwargs)
    except Exception as e:
        if p.error is not None:
            raise p.error from e
        raise
    finally:
        _calls = outer
    if not p.done:
        raise RuntimeError(f"graph {info.key}: Inductor compiled it without handing it to its custom post pass")
    return fn
