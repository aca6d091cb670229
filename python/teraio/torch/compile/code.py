"""The memory Inductor's generated code holds, between teraio's calls.

A graph's trace frees each value at its last node, but the code Inductor
generates does not follow the node order exactly: it fuses reductions over
several nodes into one late kernel (a weight gradient's sum), so an input
stays alive until that kernel; and it keeps a dead buffer in its reuse pool
until a buffer of the same size needs it.  The resident bytes of a
compiled step are therefore measured on the code that runs.

The Python wrapper (``call(self, args)`` in ``OutputCode.source_code``) is a
straight-line list of statements.  :func:`code_memory` follows the bytes it
holds: inputs from the start until their ``del``, each
``empty_strided_*`` buffer from its allocation until its last name is
deleted (``x = y`` and ``reinterpret_tensor(y, ...)`` are further names of
the same buffer), returned buffers until the end; and reports the largest
amount between consecutive ``teraio::kernel_begin`` calls.  A statement it
does not understand makes it give up (None): the caller keeps the trace's
model then.
"""
from __future__ import annotations

import ast
import re

import torch

_ASSIGN = re.compile(r"^(\w+) = (.*)$")
_CALL = re.compile(r"^(?:torch\.)?empty_strided(?:_\w+)?\((.*)\)$")
_ALIAS = re.compile(r"^(?:reinterpret_tensor\()?(\w+)(?:,.*\))?$")
_OP = re.compile(r"torch\.ops\.teraio\.kernel_begin\.default\(.*, (\d+), (\d+)\)$")
_GETITEM = re.compile(r"^(\w+)\[\d+\]$")


def _storage_bytes(args: str) -> int | None:
    """Bytes of ``empty_strided(size, stride, dtype, ...)``."""
    try:
        tree = ast.parse(f"f({args})").body[0].value
        size, stride = (ast.literal_eval(a) for a in tree.args[:2])
        dtype = tree.args[2]
        name = dtype.attr if isinstance(dtype, ast.Attribute) else None
        itemsize = getattr(torch, name).itemsize if name else None
    except (SyntaxError, ValueError, AttributeError, IndexError, TypeError):
        return None
    if itemsize is None:
        return None
    if any(s == 0 for s in size):
        return 0
    return (1 + sum((s - 1) * st for s, st in zip(size, stride))) * itemsize


class CodeMemory:
    """ops: the local kernel index of each kernel_begin call, in code order;
    peaks[i]: the most bytes the code holds before call 0 (i = 0), between
    call i-1 and call i, and after the last call (i = len(ops))."""

    def __init__(self, ops: list[int], peaks: list[int]):
        self.ops, self.peaks = ops, peaks


def code_memory(source: str, input_bytes: list[int | None], keep: set[int] = frozenset()) -> CodeMemory | None:
    """Follow `source`'s ``call`` (module text); `input_bytes[i]` counts
    input i (None: not counted, e.g. a parameter, whose memory outlives the
    graph anyway); an input in `keep` stays counted after its ``del``
    (something after the graph still holds it)."""
    try:
        body = source[source.index("def call(self, args):"):]
    except ValueError:
        return None
    lines = body.splitlines()[1:]
    size: dict[int, int] = {}          # buffer -> bytes
    names: dict[str, int] = {}         # name -> buffer
    held = 0
    next_buf = 0
    kept: set[int] = set()
    ops: list[int] = []
    peaks = [0]

    def new(nbytes: int, name: str) -> None:
        nonlocal held, next_buf
        b = next_buf
        next_buf += 1
        size[b] = nbytes
        names[name] = b
        held += nbytes

    def drop(name: str) -> None:
        nonlocal held
        b = names.pop(name, None)
        if b is not None and b not in names.values() and b not in kept:
            held -= size.pop(b)

    for raw in lines:
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if not raw.startswith("        "):
            break  # past the end of call()
        for stmt in (s.strip() for s in line.split("#")[0].split(";")):
            if not stmt or stmt.startswith(("assert_", "args.clear()")):
                continue
            if stmt.startswith("return"):
                return CodeMemory(ops, peaks)
            if stmt.endswith("= args"):
                for i, n in enumerate(x.strip() for x in stmt[: -len("= args")].split(",")):
                    if n:
                        new(input_bytes[i] if i < len(input_bytes) and input_bytes[i] else 0, n)
                        if i in keep:
                            kept.add(names[n])
            elif stmt.startswith("del "):
                for n in stmt[4:].split(","):
                    drop(n.strip())
            elif (m := _ASSIGN.match(stmt)) is None:
                if not ("(" in stmt and "=" not in stmt.split("(")[0]):
                    return None
                # a kernel call: it writes buffers it is given
            elif op := _OP.search(m.group(2)):
                ops.append(int(op.group(2)))
                peaks.append(held)
                new(0, m.group(1))
            elif alloc := _CALL.match(m.group(2)):
                nbytes = _storage_bytes(alloc.group(1))
                if nbytes is None:
                    return None
                new(nbytes, m.group(1))
            elif (alias := _ALIAS.match(m.group(2)) or _GETITEM.match(m.group(2))) and alias.group(1) in names:
                names[m.group(1)] = names[alias.group(1)]
            else:
                return None  # an allocation of unknown size
            peaks[-1] = max(peaks[-1], held)
    return CodeMemory(ops, peaks)
