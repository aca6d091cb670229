"""One graph AOTAutograd produced, as teraio's kernels and tensors.

A compiled region (one Dynamo graph) gives AOTAutograd's forward and
backward graphs, or one inference graph.  teraio reads each of them as
Inductor's post-grad passes leave it (teraio.torch.compile.passes: the
pattern matcher's rewrites done, before Inductor lowers the graph to its
kernels) as a piece of a trace:

* kernel j is the graph's j-th ``call_function`` node (views and ``getitem``
  included, so node positions and kernel indices agree); its name is the
  operator's (``aten.mm.default``);
* a *local storage* is what a tensor of the graph lives in: each placeholder
  has one (the run-time tensor decides which trace tensor it is), each node
  that makes a new tensor has one, and a view, an in-place result or a
  tuple element shares the storage of what it aliases (from the operator
  schema's alias annotations);
* kernel j accesses the storages of its tensor arguments (read) and results
  (written); a pure view reads nothing (its readers access the storage).

The same node sequence is what the plan's kernel indices refer to, and
:meth:`GraphInfo.insert_ops` puts the ``teraio::kernel_begin`` calls in
front of the planned nodes at that same point of Inductor's compilation, so
the calls stand between the operators Inductor lowers and change none of
its rewrites (a call before the rewrites would be a mutation the pattern
matcher does not match across).
"""
from __future__ import annotations

import hashlib
import operator

import torch
import torch.fx as fx

from .ops import kernel_begin
from ...core import READ, WRITE


def _name(target) -> str:
    """The kernel name of a node target, one token."""
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    name = getattr(target, "__name__", None) or str(target)
    return "".join(c if c.isprintable() and not c.isspace() else "_" for c in name)


def _schema_effects(target) -> tuple[list, set]:
    """For an operator: which argument each result aliases (None: a new
    tensor) and which arguments it writes."""
    schema = target._schema
    first_arg_of: dict[str, int] = {}
    written: set[int] = set()
    for i, a in enumerate(schema.arguments):
        ai = a.alias_info
        if ai is None:
            continue
        for s in ai.before_set:
            first_arg_of.setdefault(s, i)
        if ai.is_write:
            written.add(i)
    outs = []
    for r in schema.returns:
        ai = r.alias_info
        outs.append(next((first_arg_of[s] for s in ai.before_set if s in first_arg_of), None) if ai else None)
    return outs, written


def _schema_args(node: fx.Node, schema) -> list:
    """The node's argument values in schema order."""
    out = []
    for i, a in enumerate(schema.arguments):
        if i < len(node.args) and not a.kwarg_only:
            out.append(node.args[i])
        else:
            out.append(node.kwargs.get(a.name, a.default_value if a.has_default_value() else None))
    return out


def _nodes_in(value) -> list:
    if isinstance(value, fx.Node):
        return [value]
    if isinstance(value, (list, tuple)):
        return [n for v in value for n in _nodes_in(v)]
    return []


class GraphInfo:
    """A graph AOTAutograd produced, read as kernels and local storages.

    ``kind``: "forward", "backward" or "inference".  ``gm`` is the graph as
    Inductor's post-grad passes hand it to their custom post pass (a copy,
    its metadata propagated again); ``source``, if given, the graph as
    AOTAutograd handed it to Inductor, which Inductor compiles again with
    the calls (compile.passes.compile_with_ops).  The analysis fields:

      names[j]        kernel j's name
      accesses[j]     [(local storage, READ/WRITE bits)] of kernel j
      storage_bytes[s]  bytes of local storage s as the graph's metadata says
                      (placeholders: the example input's; the run-time tensor
                      decides)
      n_inputs        placeholders; local storage i < n_inputs is placeholder
                      i's (None entries in input_is_tensor mark non-tensors)
      outputs[i]      local storage of graph output i (None: not a tensor)
      written_inputs  placeholders the graph writes (in-place updates)
      unplannable     why teraio cannot plan this graph (None: it can)
    """

    def __init__(self, gid: int, gm: fx.GraphModule, kind: str, source: fx.GraphModule | None = None):
        self.gid, self.gm, self.kind, self.source = gid, gm, kind, source
        self.unplannable: str | None = None
        g = gm.graph
        self.placeholders = [n for n in g.nodes if n.op == "placeholder"]
        self.kernel_nodes = [n for n in g.nodes if n.op == "call_function"]
        self.n_inputs = len(self.placeholders)
        self.names = [_name(n.target) for n in self.kernel_nodes]
        self.storage_bytes: list[int] = []
        self._sid: dict = {}            # fx.Node or (fx.Node, i) -> local storage
        self._rep: dict[int, str] = {}  # local storage -> name of a node holding it
        self._item: dict[int, tuple[str, int]] = {}  # storage of a tuple element -> (its node, i)
        self.input_is_tensor = []
        for ph in self.placeholders:
            val = ph.meta.get("val")
            is_tensor = isinstance(val, torch.Tensor)
            self.input_is_tensor.append(is_tensor)
            if not is_tensor and val is not None and not isinstance(val, (int, float, bool)):
                self.unplannable = f"input {ph.name} is {type(val).__name__}"
            if isinstance(val, torch.SymInt) or (is_tensor and self._symbolic(val)):
                self.unplannable = f"input {ph.name} has a symbolic shape (dynamic shapes)"
            self._new(ph, val if is_tensor else None)
        self.accesses = [self._analyse(n) for n in self.kernel_nodes]
        out = next(n for n in g.nodes if n.op == "output")
        outs = out.args[0] if isinstance(out.args[0], (list, tuple)) else [out.args[0]]
        self.outputs = [self._sid.get(v) if isinstance(v, fx.Node) else None for v in outs]
        self.written_inputs = sorted({s for acc in self.accesses for s, m in acc
                                      if m & WRITE and s < self.n_inputs})
        self.key = self._fingerprint()
        self._vals = {n.name: n.meta.get("val") for n in g.nodes}
        try:
            self._fake_mode = torch._guards.detect_fake_mode(
                [v for v in self._vals.values() if isinstance(v, torch.Tensor)])
        except AssertionError:  # values of several fake modes
            self._fake_mode = None

    @staticmethod
    def _symbolic(val: torch.Tensor) -> bool:
        return any(not isinstance(x, int) for x in (*val.shape, *val.stride(), val.storage_offset()))

    def _new(self, value, val) -> int | None:
        """A new local storage for `value` (a node or (node, i)) holding
        tensor `val`; None for a non-tensor."""
        if not isinstance(val, torch.Tensor):
            return None
        s = len(self.storage_bytes)
        nbytes = 0
        if not self._symbolic(val):
            try:
                nbytes = int(val.untyped_storage().nbytes())
            except (RuntimeError, TypeError, NotImplementedError):
                nbytes = val.numel() * val.element_size()
        elif self.unplannable is None:
            self.unplannable = "a tensor has a symbolic shape (dynamic shapes)"
        self.storage_bytes.append(nbytes)
        self._sid[value] = s
        if isinstance(value, fx.Node):
            self._rep[s] = value.name
        else:
            self._item[s] = (value[0].name, value[1])
        return s

    def _alias(self, value, s: int | None) -> None:
        if s is not None:
            self._sid[value] = s
            if isinstance(value, fx.Node):
                self._rep.setdefault(s, value.name)

    def _analyse(self, node: fx.Node) -> list[tuple[int, int]]:
        """Define node's result storages; return its accesses."""
        val = node.meta.get("val")
        target = node.target
        if target is operator.getitem:
            src, idx = node.args
            self._alias(node, self._sid.get((src, idx)))
            return []
        results = list(val) if isinstance(val, (list, tuple)) else [val]
        if isinstance(target, torch._ops.OpOverload):
            schema = target._schema
            out_alias, written = _schema_effects(target)
            args = _schema_args(node, schema)
        else:  # higher-order operators, Python functions on sizes
            out_alias, written, args = [None] * len(results), set(), list(node.args) + list(node.kwargs.values())
        acc: dict[int, int] = {}
        for i, a in enumerate(args):
            for n in _nodes_in(a):
                s = self._sid.get(n)
                if s is not None:
                    acc[s] = acc.get(s, 0) | (READ | WRITE if i in written else READ)
        if len(out_alias) == 1 and isinstance(val, (list, tuple)):  # Tensor(a)[] -> one alias set
            out_alias = out_alias * len(results)
        new_results = False
        for i, r in enumerate(results):
            a = out_alias[i] if i < len(out_alias) else None
            value = node if not isinstance(val, (list, tuple)) else (node, i)
            if a is not None:
                base = _nodes_in(args[a])
                self._alias(value, self._sid.get(base[0]) if base else None)
            else:
                s = self._new(value, r)
                if s is not None:
                    acc[s] = acc.get(s, 0) | WRITE
                    new_results = True
        if not new_results and not written:
            return []  # a view: its readers access the storage
        return list(acc.items())

    def _fingerprint(self) -> str:
        """The graph's identity across compilations: its code and the
        layouts of its inputs."""
        h = hashlib.sha256(self.kind.encode())
        h.update(self.gm.code.encode())
        for ph in self.placeholders:
            v = ph.meta.get("val")
            if isinstance(v, torch.Tensor):
                h.update(repr((tuple(v.shape), tuple(v.stride()), v.dtype, v.device.type)).encode())
            else:
                h.update(repr(v).encode())
        return h.hexdigest()[:16]

    @property
    def n_kernels(self) -> int:
        return len(self.kernel_nodes)

    def with_ops(self, ops: dict[int, tuple[list[int], list[int]]]) -> fx.GraphModule:
        """A copy of the graph with ``teraio::kernel_begin`` before each
        kernel j of `ops` (kernel -> the local storages its call moves and
        those it only reads), chained by their tokens in kernel order."""
        g = fx.Graph()
        g.output(g.graph_copy(self.gm.graph, {}))  # nodes' metadata copied shallowly
        self.insert_ops(g, ops)
        return fx.GraphModule(self.gm, g)

    def insert_ops(self, g: fx.Graph, ops: dict[int, tuple[list[int], list[int]]]) -> None:
        """Put the calls of `ops` into `g`, a graph whose nodes are this
        graph's by name: a copy of it, or the graph Inductor is compiling,
        at the point its post-grad passes hand it to their custom post pass
        (``compile_with_ops``).  Raises ValueError if `g`'s kernels are not
        this graph's."""
        for n in g.nodes:
            # Regions between mutations that the pattern matcher recorded
            # before the calls existed: stale once they do.
            n.meta.pop("mutation_region_id", None)
        by_name = {n.name: n for n in g.nodes}
        kernels = [by_name.get(n.name) for n in self.kernel_nodes]
        live = [n for n in g.nodes if n.op == "call_function"]
        if len(live) != len(kernels) or any(k is not n or k.target is not m.target
                                            for k, n, m in zip(kernels, live, self.kernel_nodes)):
            raise ValueError(f"graph {self.key} ({self.kind}): the graph Inductor compiles is not the "
                             f"one teraio profiled ({len(live)} kernels, {len(kernels)} profiled)")
        items: dict[int, fx.Node] = {}

        def holder(s: int) -> fx.Node:
            """A node holding local storage s, defined before any call that
            names it: a tuple element (sdpa's logsumexp, ...) gets a getitem
            of its own right after the operator that makes it, since the
            graph's own getitem may come after the call (a move that starts
            right after a multi-output operator, or between its getitems)."""
            if s not in self._item:
                return by_name[self._rep[s]]
            if s not in items:
                src, i = self._item[s]
                with g.inserting_after(by_name[src]):
                    items[s] = g.call_function(operator.getitem, (by_name[src], i))
                items[s].meta["val"] = self._vals[src][i]
            return items[s]

        token = None
        for j in sorted(ops):
            moved, read = ([holder(s) for s in ss] for ss in ops[j])
            with g.inserting_before(kernels[j]):
                token = g.call_function(kernel_begin, (moved, read, token, self.gid, j))
            first = (moved + read)[:1]
            # the profiled graph's value: a rewritten node's own may be stale
            dev = self._vals.get(first[0].name, first[0].meta.get("val")).device if first else torch.device("cpu")
            with self._fake_mode or torch._subclasses.FakeTensorMode():
                token.meta["val"] = torch.empty(0, device=dev)
        g.lint()
