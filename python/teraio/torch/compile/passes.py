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
  checking that the graph there is the one teraio profiled.

Both bypass Inductor's FX graph cache (the pass has no cache key): an
artifact with calls names this process's graph numbers, and must not serve
another.  A user's own custom post passes run first.
"""
from __future__ import annotations

import contextlib
import copy

import torch
from torch._inductor import config
from torch._inductor.compile_fx import compile_fx_inner
from torch._inductor.custom_graph_pass import CustomGraphPass, get_custom_graph_passes
from torch._inductor.virtualized import V
from torch.fx.passes.fake_tensor_prop import FakeTensorProp
from torch._inductor.pattern_matcher import stable_topological_sort


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
    gm = copy.deepcopy(info.source)
    p = _AtPostGrad(gm, lambda graph: info.insert_ops(graph, ops))
    ctx = torch._guards.tracing(tctx) if tctx is not None else contextlib.nullcontext()
    cc = torch._guards.compile_context(cctx) if cctx is not None else contextlib.nullcontext()
    try:
        with ctx, cc, config.patch(reorder_for_peak_memory=False), _with_pass(p):
            fn = compile_fx_inner(gm, example_inputs, **kwargs)
    except Exception as e:
        if p.error is not None:
            raise p.error from e
        raise
    if not p.done:
        raise RuntimeError(f"graph {info.key}: Inductor compiled it without handing it to its custom post pass")
    return fn
