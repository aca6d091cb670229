"""teraio::kernel_begin — the custom operator teraio puts into compiled graphs.

    kernel_begin(Tensor(a!)[] moved, Tensor[] read, Tensor? after, int graph, int kernel) -> Tensor

One call stands before graph node `kernel` of graph `graph` wherever the plan
has a migration due or starting at that kernel; it tells libteraio's runtime
that the kernel is about to run (``tio_runtime_kernel_begin``), which waits
for the writes and reads due there, releases and re-allocates storage
(``untyped_storage().resize_()``) and starts the transfers that begin there.
``moved`` are the graph's values among the tensors whose storage is released,
allocated or completed there; ``read`` those whose write to SSD only starts
there (the write reads them; nothing changes).

Why this schema (torch/_functorch/_activation_offloading/offload_ops.py is
the peer; its notes list what breaks such ops):

* ``Tensor(a!)[] moved``: the call is declared to write every tensor whose
  storage it changes.  Inductor orders a write after every earlier reader of
  the buffer and before every later one (its mutation dependencies), so a
  release can never run before the last read of the period it starts, and
  no kernel can read a prefetched tensor before the wait that completes it.
  The values do not change: the bytes that come back are the bytes that
  went out.  A mutable schema also makes the call impure for FX's and
  Inductor's dead-code elimination (torch._library.utils.is_impure), and it
  is registered with ``torch.fx.has_side_effect`` as well.
* Inductor computes pointwise values lazily and makes a buffer of one only
  when something needs it; a mutation must make the pending readers of the
  old value real first.  Its fallback path does that only after the
  mutating call is registered, so such a reader would be scheduled after
  the call: after a release.  :func:`register_inductor_lowering` gives the
  operator a lowering that marks the moved buffers mutated first.
* ``Tensor[] read``: a write that only starts needs no order beyond its data
  dependence, and declaring it a mutation would make Inductor realize
  values it would otherwise fuse away.
* ``Tensor? after`` -> ``Tensor``: each call returns a new 0-element token
  that the next call of the same graph takes, so the calls stay in plan
  order whatever Inductor's scheduler does; nothing else reads a token.
* ``graph``, ``kernel``: plain integers naming the graph (an index into the
  adapter's table) and the node, so one compiled graph run several times in
  an iteration (a compiled block called per layer) maps each run to its own
  kernel indices at run time.

The schema is registered through ``torch.library.Library`` rather than
``custom_op``: the latter adds a version-counter bump for mutated inputs,
which would make autograd refuse saved activations and parameters the call
touches (their bytes do not change).  With no runtime attached (an
``opcheck``, a graph run outside a teraio step) the call only returns its
token.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch.fx.node import has_side_effect

_lib = torch.library.Library("teraio", "DEF")
_lib.define("kernel_begin(Tensor(a!)[] moved, Tensor[] read, Tensor? after, int graph, int kernel) -> Tensor")

# The adapter's entry point: handler(moved, read, graph, kernel).  One per
# process: the compiled driver (teraio.torch.compile.session) installs it.
_handler: Callable | None = None


def set_handler(fn: Callable | None) -> None:
    global _handler
    _handler = fn


# Told the buffer names of each call Inductor lowers, in graph order:
# listener(names).  compile.passes installs it (imports point from passes to
# here, never back).
_lowering_listener: Callable | None = None


def set_lowering_listener(fn: Callable | None) -> None:
    global _lowering_listener
    _lowering_listener = fn


def _token(moved, read) -> torch.Tensor:
    first = moved[0] if moved else read[0] if read else None
    return torch.empty(0, device=first.device if first is not None else "cpu")


def _kernel_begin(moved, read, after, graph, kernel):
    h = _handler
    if h is not None:
        h(moved, read, graph, kernel)
    return _token(moved, read)


_lib.impl("kernel_begin", _kernel_begin, "CompositeExplicitAutograd")
# Not differentiable: the token carries no gradient and the tensors keep
# their values, so autograd passes the call through.
_lib.impl("kernel_begin", torch.library.fallthrough_kernel, "Autograd")


@torch.library.register_fake("teraio::kernel_begin")
def _kernel_begin_fake(moved, read, after, graph, kernel):
    return _token(moved, read)


kernel_begin = torch.ops.teraio.kernel_begin.default
has_side_effect(kernel_begin)

_lowered = False


def register_inductor_lowering() -> None:
    """Inductor's lowering of kernel_begin: the moved buffers are marked
    mutated (which makes Inductor realize their pending readers, so they run
    before the call), then the call is Inductor's ordinary fallback kernel."""
    global _lowered
    if _lowered:
        return
    from torch._inductor.lowering import fallback_handler, register_lowering
    from torch._inductor.virtualized import V

    fallback = fallback_handler(kernel_begin, add_to_fallback_set=False)

    @register_lowering(kernel_begin, type_promotion_kind=None)
    def _lower(moved, read, after, graph, kernel):
        for t in moved:
            t.realize()
            V.graph.mark_buffer_mutated(t.get_name())
        if _lowering_listener is not None:
            _lowering_listener([t.get_name() for t in moved])
        return fallback(moved, read, after, graph, kernel)

    _lowered = True
