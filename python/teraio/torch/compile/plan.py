"""A compiled step's plan, read as what the runtime does where.

The planner's migrations are kernel indices of the step's trace; a compiled
step reaches the runtime only at ``teraio::kernel_begin`` calls (in the
graphs) and at the eager kernels between regions (compile.profile).
:class:`StepPlan` turns a plan into the calls each graph gets, the trace
ids each call binds and makes resident, and the resident bytes to account
at each point: the trace's, or, for a region whose compiled code can be
read, the bytes that code holds (compile.code) plus the trace's for the
rest of the process.
"""
from __future__ import annotations

import logging

from ...core import READ, Lifetime, Plan, Trace
from ..session import PlanEntry
from .code import code_memory
from .profile import Profile

log = logging.getLogger("teraio")


def with_extra(prof: Profile, extra: dict[tuple[int, int], int]) -> tuple[list, list]:
    """The profile's tensors and kernels plus, for each (first, end)
    kernel range of `extra`, a temporary tensor of its bytes live over the
    range: memory the compiled code holds that the trace did not see."""
    tensors = list(prof.tensors)
    kernels = [(n, d, list(acc)) for n, d, acc in prof.kernels]
    for (a, b), nbytes in sorted(extra.items()):
        i = len(tensors)
        tensors.append((nbytes, "temporary", False, None))
        kernels[a][2].append((i, READ))
        if b - 1 != a:
            kernels[b - 1][2].append((i, READ))
    return tensors, kernels


class StepPlan(PlanEntry):
    """One sequence of graphs: its trace, plan, and where the plan acts.

    `ops[key][j]`: the local storages of graph `key` that the
    ``kernel_begin`` call before its kernel j moves (storage released,
    allocated or completed there) and those it only reads (a write that
    starts there), over all instances of the graph.  For each instance
    (graph run) of the sequence: `op_ids[j]` are the trace ids of those
    tensors (aligned with the call's arguments, moved then read; None where
    this instance moves nothing of that storage), `op_ensure[j]` the ids it
    must leave resident (their next use is kernel j), `bind_in`/`bind_out`
    the (input/output position, id) of moved intermediate tensors to bind
    at the region's start and end, `eager_ensure` the moved ids the eager
    kernel after it reads.  `point_max[k]`: for each kernel k where the
    runtime is called, the largest trace memory from k to the next one.
    """

    def __init__(self, prof: Profile, trace: Trace, lt: Lifetime, plan: Plan, capacity: int):
        super().__init__(prof.sequence, trace, lt, plan, capacity)
        self.sequence = prof.sequence
        self.instances = prof.instances
        self.n_profiled = len(prof.tensors)
        n = trace.n_kernels
        migs = plan.migrations()
        moved = {m["tensor"] for m in migs}
        changes: dict[int, set] = {}   # kernel -> tensors whose storage changes or completes there
        writes: dict[int, set] = {}    # kernel -> tensors whose write starts there
        due: dict[int, set] = {}
        for m in migs:
            if m["kind"] == "offload":
                writes.setdefault(m["trigger"], set()).add(m["tensor"])
            else:
                changes.setdefault(m["trigger"], set()).add(m["tensor"])
                due.setdefault(m["deadline"], set()).add(m["tensor"])
            changes.setdefault(m["deadline"], set()).add(m["tensor"])
        glob = {i for i in range(trace.n_tensors) if trace.tensor_is_global(i)}
        accesses = [acc for _, _, acc in prof.kernels]
        self.eager_ensure0 = sorted(moved & {i for i, _ in accesses[0]})
        self.ops: dict[str, dict[int, tuple[list[int], list[int]]]] = {}
        for inst in self.instances:
            ops = self.ops.setdefault(inst.info.key, {})
            # every local storage of a moved tensor: inputs that are views of one
            # storage (tokens[:, :-1] and tokens[:, 1:]) are separate placeholders,
            # and Inductor orders the call only after the readers of those it names
            sids_of: dict[int, list[int]] = {}
            for s, i in enumerate(inst.ids):
                if i in moved:
                    sids_of.setdefault(i, []).append(s)
            for j in range(inst.info.n_kernels):
                k = inst.offset + j
                ch, wr = changes.get(k, set()), writes.get(k, set())
                if not ch and not wr:
                    continue
                mv, rd = ops.setdefault(j, ([], []))
                mv += [s for i in sorted(ch) for s in sids_of.get(i, []) if s not in mv]
                rd += [s for i in sorted(wr - ch) for s in sids_of.get(i, []) if s not in rd]
        for ops in self.ops.values():
            for mv, rd in ops.values():
                rd[:] = [x for x in rd if x not in mv]
        for inst in self.instances:
            info, ops = inst.info, self.ops[inst.info.key]
            inst.op_ids = {j: [inst.ids[s] if inst.ids[s] in moved else None for s in mv + rd]
                           for j, (mv, rd) in ops.items()}
            inst.op_ensure = {j: sorted({inst.ids[s] for s in mv} & due.get(inst.offset + j, set()))
                              for j, (mv, rd) in ops.items()}
            inter = moved - glob
            inst.bind_in = [(p, inst.ids[p]) for p in range(info.n_inputs) if inst.ids[p] in inter]
            inst.bind_out = [(p, inst.ids[s]) for p, s in enumerate(info.outputs)
                             if s is not None and s >= info.n_inputs and inst.ids[s] in inter]
            k_eager = inst.offset + info.n_kernels
            inst.eager_kernel = k_eager
            inst.eager_ensure = sorted(moved & {i for i, _ in accesses[k_eager]})
        pts = sorted({0} | {inst.eager_kernel for inst in self.instances}
                     | {inst.offset + j for inst in self.instances for j in self.ops[inst.info.key]})
        curve = lt.memory_curve()
        self.point_max = {k: max(curve[k:(pts[x + 1] if x + 1 < len(pts) else n)])
                          for x, k in enumerate(pts)}
        self.n_ops = sum(len(v) for v in self.ops.values())
        self.code_measured = 0  # instances whose memory comes from Inductor's code
        self.excess: list[tuple[int, int, int]] = []  # (first, end kernel, bytes the code holds over the trace)
        self._away = self._planned_away(migs, n)

    def _planned_away(self, migs: list[dict], n: int) -> dict[int, int]:
        """Bytes the plan has released (off the device) right after
        kernel_begin(k), for every point k: a tensor is away over
        [offload deadline, prefetch trigger), cyclically."""
        offs = {}
        for m in migs:
            if m["kind"] == "offload":
                offs.setdefault(m["tensor"], []).append(m)
        out = {k: 0 for k in self.point_max}
        for m in migs:
            if m["kind"] != "prefetch":
                continue
            o = min(offs.get(m["tensor"], []), key=lambda o: (m["trigger"] - o["deadline"]) % n, default=None)
            if o is None:
                continue
            a, b = o["deadline"], m["trigger"]
            for k in out:
                if (k - a) % n < (b - a) % n:
                    out[k] += m["bytes"]
        return out

    def expected_peak(self) -> int:
        """The resident peak the plan gives if every migration runs as
        planned, on the point_max accounting (trace, or Inductor's code)."""
        return max(self.point_max[k] - self._away[k] for k in self.point_max)

    def use_code(self, source_of) -> None:
        """Account each region's kernels by the memory its compiled code
        holds (compile.code) instead of the trace's model; `source_of(info)`
        is the generated source of the code that runs for a graph.  A region
        whose code cannot be read keeps the trace's model."""
        lt = self.lifetime._p.contents
        curve = self.lifetime.memory_curve()
        trace = self.trace
        for inst in self.instances:
            info = inst.info
            start, end = inst.offset, inst.offset + info.n_kernels   # kernels [start, end)
            input_bytes, keep = [], set()
            for p in range(info.n_inputs):
                i = inst.ids[p]
                if i is None or trace.tensor_is_global(i):
                    input_bytes.append(None)
                    continue
                input_bytes.append(trace.tensor_bytes(i))
                if lt.last_use[i] >= end:
                    keep.add(p)  # used after the graph: its del frees nothing
            src = source_of(info)
            cm = code_memory(src, input_bytes, keep) if src else None
            if cm is None or cm.ops != sorted(self.ops.get(info.key, {})):
                log.debug("teraio: the code of graph %s is accounted by the trace", info.key)
                continue
            # The trace's memory of everything this instance does not hold
            # (tensors past the profile's are _with_extra's, the code's own).
            local = {i for i in inst.ids if i is not None and not trace.tensor_is_global(i)}
            local |= {i for i in range(self.n_profiled, trace.n_tensors) if start <= lt.first_use[i] < end}
            inside = [0] * (end - start + 1)
            for i in local:
                a, b = max(lt.first_use[i], start), min(lt.last_use[i], end - 1)
                if a <= b:
                    inside[a - start] += trace.tensor_bytes(i)
                    inside[b - start + 1] -= trace.tensor_bytes(i)
            outside, acc = [], 0
            for k in range(start, end):
                acc += inside[k - start]
                outside.append(curve[k] - acc)
            bounds = [start] + [start + j for j in cm.ops] + [end]
            for x, peak in enumerate(cm.peaks):
                a, b = bounds[x], bounds[x + 1]
                b = max(b, a + 1) if a < end else a  # a call before kernel j covers kernel j
                around = max(outside[a - start:b - start], default=0)
                held = peak + around
                if b > a and held > max(curve[a:b]):
                    self.excess.append((a, b, held - max(curve[a:b])))
                if x == 0:
                    self.point_max[start - 1] = max(curve[start - 1], held)
                else:
                    self.point_max[a] = held
            self.code_measured += 1

    def fits(self) -> bool:
        return bool(self.plan.fits) and self.expected_peak() <= self.capacity_bytes

    def describe(self) -> dict:
        out = super().describe()
        out.update({"graphs": len(set(self.sequence)), "regions": len(self.sequence),
                    "expected_peak_bytes": self.expected_peak(), "regions_measured_on_code": self.code_measured,
                    "kernel_begin_calls": self.n_ops})
        return out
