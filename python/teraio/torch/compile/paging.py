"""A compiled region's profiled run within the capacity: Inductor's own code, paged statement by statement.

A compiled region of a profiled step must keep the capacity too, and a
whole-model forward region makes every activation before it returns.  So
the profiled steps run each region's code as Inductor generated it (the
same kernels, so the same numbers as plain ``torch.compile``), with one
change to its Python wrapper: before each statement that touches tensor
memory, a call of :meth:`PagedCode.point` with the tensors the statement
names.  The wrapper (``call(self, args)``) is straight-line Python, so the
calls are exactly where the memory is touched and nothing moves around
them: the pager (teraio.torch.pager) brings back what the statement names,
makes room for what it allocates (``empty_strided`` sizes, read from the
code), and may evict any other tensor, the region's own buffers included,
since whatever later reads it has a call of its own first.  This is the
eager pager's rule (an operator's tensors resident, least recently used
out) at the granularity of Inductor's kernels.

Times: the time between two calls is the statement's, without the pager's
moves.  A statement's graph nodes come from Inductor's comments
(``# Topologically Sorted Source Nodes: [...]``, written before extern
kernels and fallbacks); a fused C++ kernel has none, so its time goes to
the graph's nodes between the commented statements around it (graph order
and code order agree up to fusion).  Code this module does not understand
(control flow, a multi-line statement, a wrapper it cannot find) is not
paged: the region then runs Inductor's code with every tensor it receives
brought back first (:attr:`PagedCode.call` is None).
"""
from __future__ import annotations

import ast
import re
import time
import types

import torch

from .._ids import iter_tensors
from .code import _storage_bytes

_NAME = re.compile(r"(?<![\w.])[A-Za-z_]\w*\b")   # not an attribute (extern_kernels.bmm)
_SOURCES = re.compile(r"# Topologically Sorted Source Nodes: \[([^\]]*)\]")
_ALLOC = re.compile(r"^(\w+) = (?:torch\.)?empty_strided(?:_\w+)?\((.*)\)$")
_ALIAS = re.compile(r"^\w+ = (?:reinterpret_tensor\()?\w+(?:\[\d+\])?(?:,.*\))?(?:; del \w+)?$")
_INDENT = " " * 8


class PagedCode:
    """The paged copy of a graph's compiled code (`plain`, Inductor's
    OutputCode) for `info` (compile.graph.GraphInfo).  `call(args)` runs it;
    None where the code could not be paged.  The pager and timing state of
    the run in progress is set by :meth:`start`."""

    def __init__(self, info, plain):
        self.info = info
        self.call = None
        self.why: str | None = None
        self.nodes: list[list[int]] = []     # per point: the graph kernels its statement computes
        self.alloc: list[int] = []           # per point: bytes its statement allocates
        self.source: str | None = None       # the paged code
        self._run = None
        src = getattr(plain, "source_code", None)
        current = getattr(plain, "current_callable", None)
        if not src or current is None or getattr(current, "__name__", None) != "call":
            self.why = "its compiled code cannot be read"
            return
        try:
            text = self.source = self._instrument(src)
        except ValueError as e:
            self.why = str(e)
            return
        mod = types.ModuleType(f"teraio_paged_{info.gid}")
        mod.__dict__["_teraio_point"] = self.point
        try:
            exec(compile(text, f"<teraio paged graph {info.key}>", "exec"), mod.__dict__)
        except Exception as e:  # noqa: BLE001 - the region then runs Inductor's own code
            self.why = f"its paged code does not load ({type(e).__name__}: {e})"
            return
        self.call = mod.call
        self._kernel_of = {n.name: j for j, n in enumerate(info.kernel_nodes)}
        self._spread()

    # -- the code -------------------------------------------------------------------
    def _instrument(self, src: str) -> str:
        """`src` with a call before each statement of ``call`` that touches
        tensor memory; raises ValueError for code it does not follow."""
        lines = src.splitlines()
        try:
            start = next(i for i, l in enumerate(lines) if l.strip() == "def call(self, args):")
        except StopIteration:
            raise ValueError("its compiled code has no call(self, args)") from None
        out = lines[: start + 1]
        local: set[str] = set()
        sources: list[str] = []
        i = start + 1
        while i < len(lines):
            raw = lines[i]
            line = raw.strip()
            if line and not raw.startswith(_INDENT):
                break  # past the end of call()
            if not line:
                out.append(raw)
                i += 1
                continue
            if raw.startswith(_INDENT + " ") or line.split("  #")[0].rstrip().endswith(":"):
                raise ValueError("its compiled code has nested blocks")
            if line.startswith("#"):
                m = _SOURCES.match(line)
                if m:
                    sources = [s.strip() for s in m.group(1).split(",") if s.strip()]
                out.append(raw)
                i += 1
                continue
            stmt = line.split("  #")[0].strip()
            if stmt.endswith(("(", ",", "\\")) or stmt.count("(") != stmt.count(")"):
                raise ValueError("its compiled code has a statement over several lines")
            point = self._point_of(stmt, local)
            if point is not None:
                names, nbytes = point
                k = len(self.alloc)
                self.alloc.append(nbytes)
                self.nodes.append(sources)
                sources = []
                out.append(f"{_INDENT}_teraio_point({k}, ({''.join(n + ', ' for n in names)}))")
            out.append(raw)
            if stmt.startswith("return"):
                i += 1
                break
            for part in stmt.split(";"):
                self._define(part.strip(), local)
            i += 1
        out += lines[i:]
        return "\n".join(out) + "\n"

    @staticmethod
    def _define(stmt: str, local: set[str]) -> None:
        """The names `stmt` binds in call()."""
        if stmt.startswith("del "):
            local.difference_update(n.strip() for n in stmt[4:].split(","))
            return
        head = stmt.split("=")[0] if "=" in stmt and "==" not in stmt.split("(")[0] else ""
        if head and "(" not in head:
            local.update(n.strip() for n in head.split(",") if n.strip().isidentifier())

    @staticmethod
    def _point_of(stmt: str, local: set[str]):
        """(tensor names, bytes allocated) of the call before `stmt`, None
        for a statement that touches no tensor memory (del, an alias, an
        unpacking of args, a metadata check, the return)."""
        if stmt.startswith(("del ", "assert_", "return", "args.clear()")) or stmt.endswith("= args"):
            return None
        if _ALIAS.match(stmt):
            return None
        alloc = _ALLOC.match(stmt)
        if alloc:
            nbytes = _storage_bytes(alloc.group(2))
            if nbytes is None:
                raise ValueError(f"its compiled code allocates what it cannot size ({stmt[:60]})")
            return (), nbytes
        try:
            ast.parse(stmt)
        except SyntaxError:
            raise ValueError(f"its compiled code has a statement it cannot read ({stmt[:60]})") from None
        names = [n for n in dict.fromkeys(_NAME.findall(stmt)) if n in local]
        return (names, 0) if names else None

    def _spread(self) -> None:
        """Each point's graph kernels: from its comment, else the kernels
        between the commented points around it."""
        n = self.info.n_kernels
        known = [sorted({self._kernel_of[s] for s in ns if s in self._kernel_of}) for ns in self.nodes]
        self.nodes = []
        last = -1
        x = 0
        while x < len(known):
            if known[x]:
                self.nodes.append(known[x])
                last = max(last, known[x][-1])
                x += 1
                continue
            y = x
            while y < len(known) and not known[y]:
                y += 1
            nxt = known[y][0] if y < len(known) else n
            between = list(range(last + 1, nxt)) or ([nxt] if nxt < n else [])
            run = y - x
            for z in range(run):
                # the kernels between the anchors, shared out in order
                a, b = len(between) * z // run, len(between) * (z + 1) // run
                self.nodes.append(between[a:b] if b > a else [])
            x = y

    # -- a run ------------------------------------------------------------------------
    def start(self, pager) -> None:
        """A run begins under `pager`: times per point from here."""
        self._run = [pager, [0] * len(self.alloc), None, time.perf_counter_ns()]

    def point(self, k: int, tensors: tuple) -> None:
        """Before statement k: what it names is brought back and used by
        it, room is made for what it allocates."""
        run = self._run
        if run is None:
            return
        pager, times, prev, t_out = run
        t_in = time.perf_counter_ns()
        if prev is not None:
            times[prev] += t_in - t_out
        pager.kernel_begin()
        for t in iter_tensors(tensors):
            st = t.untyped_storage()
            if pager.slot(st) is None:
                pager.track(st)
            else:
                pager.use(st)
        if self.alloc[k]:
            pager.reserve(self.alloc[k])
        run[2] = k
        run[3] = time.perf_counter_ns()

    def finish(self) -> list[int]:
        """The run ended: each graph kernel's time (ns), its points' times
        shared among the kernels they compute."""
        pager, times, prev, t_out = self._run
        self._run = None
        if prev is not None:
            times[prev] += time.perf_counter_ns() - t_out
        out = [0] * self.info.n_kernels
        for k, t in enumerate(times):
            ks = self.nodes[k]
            for j in ks:
                out[j] += t // len(ks)
        return out
